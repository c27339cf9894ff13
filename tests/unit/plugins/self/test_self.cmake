# test_self drives the self plugin from the build's plugin folder.
add_dependencies(test_self plugin_self)
