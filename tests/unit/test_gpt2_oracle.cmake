# test_gpt2_oracle dlopens the cpu plugin and runs tests/reference/gpt2_ref.py
# with /usr/bin/python3 (numpy).
add_dependencies(test_gpt2_oracle plugin_cpu)
set_tests_properties(unit.test_gpt2_oracle PROPERTIES TIMEOUT 120)
