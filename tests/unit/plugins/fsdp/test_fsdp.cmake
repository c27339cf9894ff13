# test_fsdp dlopens the fsdp and zero strategies (FULL_SHARD is checked to
# be ZeRO stage 3), the cpu device and the shm communicator (forked
# multi-rank training) from the build's plugin folder.
add_dependencies(test_fsdp plugin_fsdp plugin_zero plugin_cpu plugin_shm)
set_tests_properties(unit.test_fsdp PROPERTIES TIMEOUT 120)
# unit.test_fsdp.cuda: the same cases on the cuda device and the nccl
# communicator, one GPU per forked rank (skipped without enough GPUs).
dt_cuda_variant(test_fsdp PLUGINS plugin_cuda plugin_nccl)
