# The device plugins' in-tree helper (plugins/common/device), linked
# statically, as the cpu and cuda devices link it.
target_link_libraries(test_mem_tally PRIVATE dtrain_common_device)
