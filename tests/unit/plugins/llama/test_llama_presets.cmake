# test_llama_presets dlopens the cpu and llama plugins (describing only).
add_dependencies(test_llama_presets plugin_cpu plugin_llama)
