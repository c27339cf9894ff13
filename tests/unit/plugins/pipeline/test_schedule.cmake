# test_schedule dlopens the gpipe and 1f1b schedules and, for the forked
# multi-rank cases, the cpu device and the shm communicator from the
# build's plugin folder.
add_dependencies(test_schedule plugin_gpipe plugin_1f1b plugin_cpu plugin_shm)
set_tests_properties(unit.test_schedule PROPERTIES TIMEOUT 120)
