# test_nccl_logic compiles the nccl communicator's GPU-free decisions in
# (nccl_guard.c, nccl_buffers.c): only nccl.h's and the CUDA runtime's
# types are needed, nothing is called from either library.  Without NCCL
# it exits 77, which ctest reports as skipped.
if(TARGET plugin_nccl)
  target_sources(test_nccl_logic PRIVATE
    "${PROJECT_SOURCE_DIR}/plugins/nccl/nccl_guard.c"
    "${PROJECT_SOURCE_DIR}/plugins/nccl/nccl_buffers.c")
  target_compile_definitions(test_nccl_logic PRIVATE DT_TEST_HAVE_NCCL=1)
  target_include_directories(test_nccl_logic PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(test_nccl_logic PRIVATE dtrain_common_comm CUDA::cudart Threads::Threads)
endif()
set_tests_properties(unit.test_nccl_logic PROPERTIES SKIP_RETURN_CODE 77)
