# test_cpu_device dlopens the cpu plugin from the build's plugin folder.
add_dependencies(test_cpu_device plugin_cpu)
