# test_model_bigram loads the example model plugin (sdk/examples/model_bigram),
# built here as it is against an installed SDK but into its own folder
# (never installed, never on dtrain's plugin path), beside the cpu plugin,
# and runs tests/reference/mlp_ref.py (numpy, float64) as its oracle.
add_library(example_model_bigram MODULE
  "${PROJECT_SOURCE_DIR}/sdk/examples/model_bigram/bigram.c")
set_target_properties(example_model_bigram PROPERTIES
  OUTPUT_NAME "dtrain_bigram" PREFIX ""
  C_VISIBILITY_PRESET hidden
  LIBRARY_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/example-plugins")
target_link_libraries(example_model_bigram PRIVATE dtrain::sdk)
target_link_options(example_model_bigram PRIVATE -Wl,--no-undefined)
add_dependencies(test_model_bigram plugin_cpu plugin_mlp example_model_bigram)
set_tests_properties(unit.test_model_bigram PROPERTIES TIMEOUT 120)
