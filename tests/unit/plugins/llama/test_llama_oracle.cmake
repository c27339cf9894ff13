# test_llama_oracle dlopens a device plugin and runs tests/reference/llama_ref.py
# (and its self-check) with /usr/bin/python3 (numpy): unit.test_llama_oracle
# on cpu, unit.test_llama_oracle.cuda on cuda, which exits 77 (ctest:
# skipped) where there is no CUDA device or no cuda plugin.
add_dependencies(test_llama_oracle plugin_cpu)
set_tests_properties(unit.test_llama_oracle PROPERTIES TIMEOUT 180)
dt_cuda_variant(test_llama_oracle PLUGINS plugin_cuda)
