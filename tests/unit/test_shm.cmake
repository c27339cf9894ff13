# test_shm dlopens the shm plugin from the build's plugin folder and forks
# up to 8 rank processes per case.
add_dependencies(test_shm plugin_shm)
set_tests_properties(unit.test_shm PROPERTIES TIMEOUT 240 LABELS "unit;comm")
