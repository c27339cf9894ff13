# test_host_services loads a fake plugin (tests/fake_plugins).
dt_use_fake_plugins(test_host_services)
