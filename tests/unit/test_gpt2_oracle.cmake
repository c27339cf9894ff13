# test_gpt2_oracle dlopens a device plugin and runs tests/reference/gpt2_ref.py
# with /usr/bin/python3 (numpy): unit.test_gpt2_oracle on cpu,
# unit.test_gpt2_oracle.cuda on cuda, which exits 77 (ctest: skipped) with
# "no CUDA device: ..." where cudaGetDeviceCount finds none, or when this
# build has no cuda plugin.
add_dependencies(test_gpt2_oracle plugin_cpu)
set_tests_properties(unit.test_gpt2_oracle PROPERTIES TIMEOUT 120)
if(DTRAIN_HAVE_CUDA)
  add_dependencies(test_gpt2_oracle plugin_cuda)
  add_test(NAME unit.test_gpt2_oracle.cuda COMMAND test_gpt2_oracle cuda)
else()
  add_test(NAME unit.test_gpt2_oracle.cuda
    COMMAND sh -c "echo 'SKIPPED: this build has no cuda plugin (DTRAIN_CUDA off or no toolkit)'; exit 77")
endif()
set_tests_properties(unit.test_gpt2_oracle.cuda PROPERTIES LABELS "unit;gpu" TIMEOUT 300
  SKIP_RETURN_CODE 77 ENVIRONMENT "CMOCKA_MESSAGE_OUTPUT=STDOUT")
