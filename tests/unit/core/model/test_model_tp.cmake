# test_model_tp dlopens the cpu plugin and runs the ranks of a tensor group
# as threads (the whole model and up to 4 parts of it).
add_dependencies(test_model_tp plugin_cpu)
target_link_libraries(test_model_tp PRIVATE Threads::Threads)
set_tests_properties(unit.test_model_tp PROPERTIES TIMEOUT 120)
