# test_mlp dlopens the cpu plugin and runs tests/reference/mlp_ref.py (and
# its self-check) with /usr/bin/python3 (numpy).
add_dependencies(test_mlp plugin_cpu)
set_tests_properties(unit.test_mlp PROPERTIES TIMEOUT 120)
