/*
 * core/loader/loader.h - finds, loads and checks plugins (libltdl).
 *
 * A plugin named NAME is the module file `dtrain_NAME.so`.  The search path,
 * in order: each entry of $DTRAIN_PLUGIN_PATH (':'-separated), each entry of
 * the config's run.plugin_path, the build tree's plugin folder, the install
 * folder.  Never the current directory unless one of those names it.
 *
 * Loading probes the kind's entry symbols newest supported major first
 * (DT_ENTRY_NAME(kind, major)), checks the info block (kind, major, minor,
 * struct_size, name == NAME) and every mandatory method of that kind (and
 * of the tables it hands out: a device's kernel table), and builds the
 * plugin's own host services table (host.h) whose set_error prefixes
 * "kind/name: ".  Each failure has one message a user can act on:
 *
 *   not found:      "comm plugin 'shmm' not found in: /a, /b, /c (files are
 *                    named dtrain_<name>.so)"
 *   fails to load:  "comm plugin 'shm' at /a/dtrain_shm.so exists but failed
 *                    to load: <libltdl/dlerror text> (missing symbols usually
 *                    mean it was built against another dtrain or a library
 *                    is missing)"
 *   no entry:       "... exports no dtrain_comm_v<N> entry (looked for
 *                    dtrain_comm_v1); is it a comm plugin?"
 *   wrong major:    "... was built against comm ABI 2.x, this dtrain speaks
 *                    comm ABI 1.x"
 *   NULL method:    "... mandatory method 'all_reduce' is NULL"
 *   NULL kernel:    "device plugin 'x' at ...: mandatory kernel 'gelu_backward'
 *                    is NULL" (a device's kernel table, from its `kernels`
 *                    slot, is checked as its ops table is)
 *   name mismatch:  "... file dtrain_shm.so declares name 'mpi'"
 */
#ifndef DT_CORE_LOADER_H
#define DT_CORE_LOADER_H

#include <stdint.h>

#include "config/config.h"
#include "dtrain/dtrain.h"
#include "loader/plugin_handle.h"

/* The directories searched, in order, given the config's plugin_path
 * (may be NULL).  Writes up to `cap` entries (owned by the loader until the
 * next call) and returns the count. */
size_t dt_plugin_search_path(const char *config_path, const char **out,
                             size_t cap);

/* Load plugin `name` of `kind`.  `cfg` (may be NULL) is the resolved config
 * that the plugin's host cfg_* functions read from table `name`; the
 * caller keeps it alive until dt_plugin_unload. */
int dt_plugin_load(int kind, const char *name, const dt_config_t *cfg,
                   dt_plugin_t **out);
void dt_plugin_unload(dt_plugin_t *p);

/* After a plugin method returned `rc` != DT_OK: make sure the message is
 * prefixed "kind/name: " and says what failed, even if the plugin set no
 * message ("kind/name: init failed (DT_ERR_SYSTEM) and gave no reason").
 * Returns rc. */
int dt_plugin_failed(const dt_plugin_t *p, int rc, const char *what);

/* Whether method `method` (a field name of the plugin's ops struct, e.g.
 * "test") is present: inside the table's struct_size and non-NULL.  The
 * by-name twin of DT_HAS_OP, for code that does not know the kind's type
 * (`dtrain plugins --describe`).  0 for unknown names. */
int dt_plugin_has_op(const dt_plugin_t *p, const char *method);
/* DT_OK when present, else DT_ERR_UNSUPPORTED with "kind/name: optional
 * method 'test' is not provided (...)" for a caller without a fallback. */
int dt_plugin_require_op(const dt_plugin_t *p, const char *method);

/* One discovered module, for `dtrain plugins` and `dtrain env`. */
typedef struct dt_plugin_listing {
    char name[64];
    char path[4096];
    int kind;            /* -1 when it could not be determined */
    uint32_t abi_major, abi_minor;
    char version[32];
    int loadable;        /* 1: dt_plugin_load succeeds */
    char why[1024];      /* when not loadable */
} dt_plugin_listing_t;

/* Scan the search path for dtrain_*.so (first hit of a name wins, as in
 * loading) and probe each.  Returns a malloc'd array in *out (free()) and
 * its length in *n. */
int dt_plugin_discover(const char *config_path, dt_plugin_listing_t **out,
                       size_t *n);

#endif /* DT_CORE_LOADER_H */
