# test_shard links the SDK helper library (as plugins do) and dlopens the
# cpu device and the shm communicator for its forked multi-rank cases.
target_link_libraries(test_shard PRIVATE dtrain_sdk)
add_dependencies(test_shard plugin_cpu plugin_shm)
set_tests_properties(unit.test_shard PROPERTIES TIMEOUT 120)
