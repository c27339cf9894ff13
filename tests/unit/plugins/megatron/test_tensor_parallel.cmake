# test_tensor_parallel dlopens the megatron scheme and, for the forked
# 2-rank case, the cpu device and the shm communicator (and the self
# communicator for a group of one) from the build's plugin folder.
add_dependencies(test_tensor_parallel plugin_megatron plugin_cpu plugin_shm plugin_self)
set_tests_properties(unit.test_tensor_parallel PROPERTIES TIMEOUT 120)
