# test_generate dlopens the cpu plugin and runs tests/reference/gpt2_ref.py
# with /usr/bin/python3 (numpy).
add_dependencies(test_generate plugin_cpu)
set_tests_properties(unit.test_generate PROPERTIES TIMEOUT 120)
