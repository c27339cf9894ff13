# test_ddp dlopens the ddp strategy, the cpu device and (for the forked
# multi-rank cases) the shm communicator from the build's plugin folder.
add_dependencies(test_ddp plugin_ddp plugin_cpu)
if(TARGET plugin_shm)
  add_dependencies(test_ddp plugin_shm)
endif()
set_tests_properties(unit.test_ddp PROPERTIES TIMEOUT 120)
# the forked ranks also check an SDK helper (dt_norm_allreduce) over shm
target_link_libraries(test_ddp PRIVATE dtrain_sdk)
# unit.test_ddp.cuda: the multi-rank cases on the cuda device and the nccl
# communicator, one GPU per forked rank (skipped without 3 GPUs).
dt_cuda_variant(test_ddp PLUGINS plugin_cuda plugin_nccl)
