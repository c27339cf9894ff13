# test_model_stages dlopens the cpu plugin (three GPT-2 instances: the
# whole model and two stages).
add_dependencies(test_model_stages plugin_cpu)
set_tests_properties(unit.test_model_stages PROPERTIES TIMEOUT 60)
