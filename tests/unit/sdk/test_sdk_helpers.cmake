# The SDK helper library is linked statically, as plugins link it.
target_link_libraries(test_sdk_helpers PRIVATE dtrain_sdk)
