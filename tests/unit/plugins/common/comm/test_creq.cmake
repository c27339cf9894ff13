# The communicators' request base (plugins/common/comm), linked statically,
# as the communicators link it.
target_link_libraries(test_creq PRIVATE dtrain_common_comm)
