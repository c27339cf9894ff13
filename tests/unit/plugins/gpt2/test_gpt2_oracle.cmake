# test_gpt2_oracle dlopens a device plugin and runs tests/reference/gpt2_ref.py
# with /usr/bin/python3 (numpy): unit.test_gpt2_oracle on cpu,
# unit.test_gpt2_oracle.cuda on cuda, which exits 77 (ctest: skipped) with
# "no CUDA device: ..." where cudaGetDeviceCount finds none, or when this
# build has no cuda plugin.
add_dependencies(test_gpt2_oracle plugin_cpu)
set_tests_properties(unit.test_gpt2_oracle PROPERTIES TIMEOUT 120)
dt_cuda_variant(test_gpt2_oracle PLUGINS plugin_cuda)
