# test_kernels_llama dlopens a device plugin from the build's plugin folder:
# unit.test_kernels_llama runs it on cpu; unit.test_kernels_llama.cuda on
# cuda, skipped (exit 77) where there is no CUDA device or no cuda plugin.
add_dependencies(test_kernels_llama plugin_cpu)
dt_cuda_variant(test_kernels_llama PLUGINS plugin_cuda)
