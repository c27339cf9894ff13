# test_zero dlopens the zero strategy, the cpu device and the shm
# communicator (forked multi-rank training) from the build's plugin folder.
add_dependencies(test_zero plugin_zero plugin_cpu plugin_shm)
set_tests_properties(unit.test_zero PROPERTIES TIMEOUT 120)
# unit.test_zero.cuda: the same cases on the cuda device and the nccl
# communicator, one GPU per forked rank (skipped without enough GPUs).
dt_cuda_variant(test_zero PLUGINS plugin_cuda plugin_nccl)
