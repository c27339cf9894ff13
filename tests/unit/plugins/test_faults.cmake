# test_faults dlopens the ddp, zero and fsdp strategies, the cpu device and
# the shm communicator (forked multi-rank training with injected faults).
add_dependencies(test_faults plugin_ddp plugin_zero plugin_fsdp plugin_cpu plugin_shm)
set_tests_properties(unit.test_faults PROPERTIES TIMEOUT 300 LABELS "unit;faults")
# unit.test_faults.cuda: the same cases on the cuda device and the nccl
# communicator, one GPU per forked rank (skipped without enough GPUs).
dt_cuda_variant(test_faults PLUGINS plugin_cuda plugin_nccl LABELS faults)
