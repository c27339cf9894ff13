# Tests that load the fake plugins (tests/fake_plugins) build them first and
# are told where they are: test_loader, test_host_services (it sorts before
# test_loader, so its target exists here) and, through dt_use_fake_plugins,
# any test that sorts after (test_resolve).  One place for the wiring.
function(dt_use_fake_plugins t)
  add_dependencies(${t} fake_plugins)
  target_compile_definitions(${t} PRIVATE DT_FAKE_PLUGIN_DIR="${DT_FAKE_PLUGIN_DIR}")
endfunction()
foreach(t test_loader test_host_services)
  if(TARGET ${t})
    dt_use_fake_plugins(${t})
  endif()
endforeach()
