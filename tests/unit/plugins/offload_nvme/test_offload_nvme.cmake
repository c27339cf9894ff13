# test_offload_nvme dlopens the offload_nvme plugin and the cpu device.
add_dependencies(test_offload_nvme plugin_offload_nvme plugin_cpu)
