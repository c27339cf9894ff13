# test_kernels dlopens the cpu plugin from the build's plugin folder.
add_dependencies(test_kernels plugin_cpu)
