# test_kernels dlopens a device plugin from the build's plugin folder:
# unit.test_kernels runs it on cpu; unit.test_kernels.cuda on cuda, where
# it exits 77 (ctest: skipped) printing "no CUDA device: ..." when
# cudaGetDeviceCount finds none, or when this build has no cuda plugin.
add_dependencies(test_kernels plugin_cpu)
if(DTRAIN_HAVE_CUDA)
  add_dependencies(test_kernels plugin_cuda)
  add_test(NAME unit.test_kernels.cuda COMMAND test_kernels cuda)
else()
  add_test(NAME unit.test_kernels.cuda
    COMMAND sh -c "echo 'SKIPPED: this build has no cuda plugin (DTRAIN_CUDA off or no toolkit)'; exit 77")
endif()
set_tests_properties(unit.test_kernels.cuda PROPERTIES LABELS "unit;gpu" TIMEOUT 300
  SKIP_RETURN_CODE 77 ENVIRONMENT "CMOCKA_MESSAGE_OUTPUT=STDOUT")
