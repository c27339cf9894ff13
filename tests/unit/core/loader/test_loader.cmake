# test_loader loads the fake plugins (tests/fake_plugins).
dt_use_fake_plugins(test_loader)
