# test_offload_bufs tests the offload tiers' in-tree helpers
# (plugins/common/offload): linked statically, as the tiers link them.
target_link_libraries(test_offload_bufs PRIVATE dtrain_common_offload)
