# test_model_acts dlopens the cpu plugin (the device that counts the
# activation bytes dt_model_alloc_acts allocates).
add_dependencies(test_model_acts plugin_cpu)
set_tests_properties(unit.test_model_acts PROPERTIES TIMEOUT 60)
