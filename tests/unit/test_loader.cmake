# test_loader loads the fake plugins (tests/fake_plugins): build them first
# and tell the test where they are.  test_host_services drives the same
# fakes; it sorts before test_loader, so its target exists here and this
# file wires it too (one place for the fakes' wiring).
foreach(t test_loader test_host_services)
  if(TARGET ${t})
    add_dependencies(${t} fake_plugins)
    target_compile_definitions(${t} PRIVATE
      DT_FAKE_PLUGIN_DIR="${DT_FAKE_PLUGIN_DIR}")
  endif()
endforeach()
