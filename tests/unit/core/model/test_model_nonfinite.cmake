# test_model_nonfinite dlopens the cpu plugin.
add_dependencies(test_model_nonfinite plugin_cpu)
set_tests_properties(unit.test_model_nonfinite PROPERTIES TIMEOUT 60)
