# test_shard links the shard engine's library (as zero and fsdp do) and dlopens the
# cpu device and the shm communicator for its forked multi-rank cases.
target_link_libraries(test_shard PRIVATE dtrain_shard)
add_dependencies(test_shard plugin_cpu plugin_shm)
set_tests_properties(unit.test_shard PROPERTIES TIMEOUT 120)
# The layer diagram of plugins/shard/shard_internal.h, checked on what the
# engine's object files link to.
if(CMAKE_NM)
  add_test(NAME unit.shard_layers COMMAND sh "${CMAKE_CURRENT_LIST_DIR}/shard_layers.sh"
    "${CMAKE_NM}" "$<TARGET_FILE:dtrain_shard>")
  set_tests_properties(unit.shard_layers PROPERTIES LABELS unit TIMEOUT 60)
endif()
