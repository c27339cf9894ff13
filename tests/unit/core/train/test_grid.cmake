# test_grid forks 8 ranks that join the shm communicator (dlopened from the
# build's plugin folder) and split it into the process grid's groups.
add_dependencies(test_grid plugin_shm)
set_tests_properties(unit.test_grid PROPERTIES TIMEOUT 120)
