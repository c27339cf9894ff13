# test_tcp dlopens the tcp plugin from the build's plugin folder and forks
# up to 4 rank processes per case, talking over loopback.
add_dependencies(test_tcp plugin_tcp)
set_tests_properties(unit.test_tcp PROPERTIES TIMEOUT 240 LABELS "unit;comm")
