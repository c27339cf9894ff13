# test_llama_generate dlopens the cpu and llama plugins.
add_dependencies(test_llama_generate plugin_cpu plugin_llama)
set_tests_properties(unit.test_llama_generate PROPERTIES TIMEOUT 120)
