# test_shard links the shard engine's library (as zero and fsdp do) and dlopens the
# cpu device and the shm communicator for its forked multi-rank cases.
target_link_libraries(test_shard PRIVATE dtrain_shard)
add_dependencies(test_shard plugin_cpu plugin_shm)
set_tests_properties(unit.test_shard PROPERTIES TIMEOUT 120)
