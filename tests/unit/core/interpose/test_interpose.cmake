# test_interpose wraps a recording fake comm (in the test) and, in forked
# ranks, the shm plugin from the build's plugin folder.
add_dependencies(test_interpose plugin_shm)
set_tests_properties(unit.test_interpose PROPERTIES TIMEOUT 120)
