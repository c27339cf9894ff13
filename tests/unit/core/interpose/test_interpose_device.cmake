# test_interpose_device wraps the cpu plugin from the build's plugin folder.
add_dependencies(test_interpose_device plugin_cpu)
