# test_replica links the SDK helper library (as plugins do) and dlopens the
# cpu device and the shm communicator for its forked ranks.
target_link_libraries(test_replica PRIVATE dtrain_sdk)
add_dependencies(test_replica plugin_cpu plugin_shm)
set_tests_properties(unit.test_replica PROPERTIES TIMEOUT 120)
