/*
 * tests/support/test_plugin.h - open a built plugin directly (dlopen of
 * DT_TEST_PLUGIN_DIR/<file>) and call its entry, for tests that drive one
 * plugin's ops table without the loader.
 */
#ifndef DT_TEST_PLUGIN_H
#define DT_TEST_PLUGIN_H

/* The ops table `entry` (e.g. DT_ENTRY_STRING(device, 1)) of plugin module
 * `path` (its declared defaults recorded for test hosts:
 * dt_test_host_declare), or NULL with the reason in dt_last_error().  *handle receives the
 * dlopen handle (may be NULL when not wanted; the module then stays loaded
 * for the life of the process). */
const void *dt_test_plugin_entry(const char *path, const char *entry, void **handle);

#endif /* DT_TEST_PLUGIN_H */
