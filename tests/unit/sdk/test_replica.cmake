# test_replica links the SDK helper library (as plugins do) and dlopens the
# cpu device and the shm communicator for its forked ranks.
target_link_libraries(test_replica PRIVATE dtrain_sdk)
add_dependencies(test_replica plugin_cpu plugin_shm)
set_tests_properties(unit.test_replica PROPERTIES TIMEOUT 120)
# unit.test_replica.cuda: the same cases on the cuda device and the nccl
# communicator, one GPU per forked rank (skipped without enough GPUs).
dt_cuda_variant(test_replica PLUGINS plugin_cuda plugin_nccl)
