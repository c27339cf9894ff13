# test_kernels dlopens a device plugin from the build's plugin folder:
# unit.test_kernels runs it on cpu; unit.test_kernels.cuda on cuda, where
# it exits 77 (ctest: skipped) printing "no CUDA device: ..." when
# cudaGetDeviceCount finds none, or when this build has no cuda plugin.
add_dependencies(test_kernels plugin_cpu)
dt_cuda_variant(test_kernels PLUGINS plugin_cuda)
