# test_cuda_device dlopens the cuda plugin when this build has one (it exits
# with 77, reported as skipped, when not).  Run without arguments it checks
# what holds on any machine; `gpu` runs the GPU cases, skipped with "no CUDA
# device" where cudaGetDeviceCount finds none.
if(DTRAIN_HAVE_CUDA)
  add_dependencies(test_cuda_device plugin_cuda)
endif()
set_tests_properties(unit.test_cuda_device PROPERTIES SKIP_RETURN_CODE 77)
add_test(NAME unit.test_cuda_device.gpu COMMAND test_cuda_device gpu)
set_tests_properties(unit.test_cuda_device.gpu PROPERTIES LABELS "unit;gpu" TIMEOUT 300
  SKIP_RETURN_CODE 77 ENVIRONMENT "CMOCKA_MESSAGE_OUTPUT=STDOUT")
