# test_offload_bufs tests an SDK helper: linked statically, as plugins link it.
target_link_libraries(test_offload_bufs PRIVATE dtrain_sdk)
