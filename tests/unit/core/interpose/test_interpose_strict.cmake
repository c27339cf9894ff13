# test_interpose_strict wraps the cpu plugin from the build's plugin
# folder (its allocations are what the checks track) and a fake comm.
add_dependencies(test_interpose_strict plugin_cpu)
