# test_nccl_comm dlopens the nccl communicator and the cuda device (and the
# cpu device, for the refusal) from the build's plugin folder; without them
# it exits 77 (skipped).  Run without arguments it checks what holds on any
# machine; unit.test_nccl_comm.gpu (`gpu`) forks ranks with one GPU each:
# skipped with "no CUDA device" where there is none, and its 2-GPU cases
# are skipped (cmocka) where there is one.
if(TARGET plugin_nccl)
  add_dependencies(test_nccl_comm plugin_nccl plugin_cuda plugin_cpu)
endif()
target_link_libraries(test_nccl_comm PRIVATE Threads::Threads)
set_tests_properties(unit.test_nccl_comm PROPERTIES SKIP_RETURN_CODE 77)
add_test(NAME unit.test_nccl_comm.gpu COMMAND test_nccl_comm gpu)
set_tests_properties(unit.test_nccl_comm.gpu PROPERTIES LABELS "unit;gpu" TIMEOUT 600
  SKIP_RETURN_CODE 77 ENVIRONMENT "CMOCKA_MESSAGE_OUTPUT=STDOUT")
