# test_offload_cpu dlopens the offload_cpu plugin and the cpu device.
add_dependencies(test_offload_cpu plugin_offload_cpu plugin_cpu)
