# test_nccl_bootstrap compiles the nccl communicator's bootstrap in and
# links NCCL (ncclGetUniqueId needs no GPU); without NCCL it exits 77,
# which ctest reports as skipped.
if(TARGET plugin_nccl)
  target_sources(test_nccl_bootstrap PRIVATE
    "${PROJECT_SOURCE_DIR}/plugins/nccl/nccl_bootstrap.c")
  target_compile_definitions(test_nccl_bootstrap PRIVATE DT_TEST_HAVE_NCCL=1)
  target_include_directories(test_nccl_bootstrap PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(test_nccl_bootstrap PRIVATE ${NCCL_LIBRARY} CUDA::cudart)
endif()
set_tests_properties(unit.test_nccl_bootstrap PROPERTIES SKIP_RETURN_CODE 77)
