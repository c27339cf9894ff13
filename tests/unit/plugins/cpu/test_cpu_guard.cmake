# test_cpu_guard dlopens the cpu plugin from the build's plugin folder.
add_dependencies(test_cpu_guard plugin_cpu)
