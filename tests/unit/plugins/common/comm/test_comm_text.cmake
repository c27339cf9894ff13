# The communicators' in-tree helpers (plugins/common/comm), linked
# statically, as the communicators link them.
target_link_libraries(test_comm_text PRIVATE dtrain_common_comm)
