# test_resolve selects the fake comm plugins (tests/fake_plugins).
dt_use_fake_plugins(test_resolve)
# Every stage at once also loads the cpu device and the ddp strategy from
# the build tree.
add_dependencies(test_resolve plugin_cpu plugin_ddp)
