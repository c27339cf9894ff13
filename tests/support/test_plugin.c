/*
 * tests/support/test_plugin.c - load a plugin module and fetch its entry
 * (its declared defaults then reach the test hosts named after it).
 */
#include "test_plugin.h"

#include <dlfcn.h>

#include "dtrain/plugin.h"
#include "dtrain/status.h"
#include "test_host.h"
#include "util/error.h"

const void *dt_test_plugin_entry(const char *path, const char *entry, void **handle)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle)
        *handle = h;
    if (!h) {
        dt_err_set(DT_ERR_NOT_FOUND, "dlopen %s: %s", path, dlerror());
        return NULL;
    }
    const void *(*fn)(void) = (const void *(*)(void))dlsym(h, entry);
    if (!fn) {
        dt_err_set(DT_ERR_ABI, "dlsym %s in %s: %s", entry, path, dlerror());
        return NULL;
    }
    const void *ops = fn();
    if (ops) /* base first: every ops table starts with its info block */
        dt_test_host_declare((const dt_plugin_info_t *)ops);
    return ops;
}
