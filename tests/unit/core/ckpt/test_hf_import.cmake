# test_hf_import dlopens the cpu plugin and runs tests/reference/gpt2_ref.py
# with /usr/bin/python3 (numpy).
add_dependencies(test_hf_import plugin_cpu)
set_tests_properties(unit.test_hf_import PROPERTIES TIMEOUT 120)
