/*
 * core/loader/loader.h - finds, loads and checks plugins (libltdl).
 *
 * A plugin named NAME is the module file `dtrain_NAME.so`, looked for in
 * the folders of an explicit search path, built once (dt_search_path_new)
 * from, in order: each entry of $DTRAIN_PLUGIN_PATH (':'-separated), the
 * config's run.plugin_path (the caller passes it), then dtrain's own
 * plugin folder: the build tree's for a program run from the build tree,
 * else the install layout's found from the running file (the dtrain
 * program: <bindir>/../lib/dtrain/plugins; libdtrain:
 * <libdir>/dtrain/plugins), so an installed copy never searches the build
 * tree it came from.  Never the current directory unless one of those
 * names it.
 *
 * Loading is two steps, so that a plugin's host table only ever reads
 * checked values: dt_plugin_open probes the kind's entry symbols newest
 * supported major first (DT_ENTRY_NAME(kind, major)), checks the info
 * block (kind, major, minor, struct_size, name == NAME) and every mandatory
 * method of that kind (and of the tables it hands out: a device's kernel
 * table); then, once the plugin's config table was checked
 * against the keys it declares, dt_plugin_bind builds the plugin's own host
 * services table (host.h) whose set_error prefixes "kind/name: " and whose
 * cfg_* read that table.  Each failure has one message a user can act on:
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

/* The folders plugins are looked for in (opaque; see the top). */
typedef struct dt_search_path dt_search_path_t;

/* Build the search path: $DTRAIN_PLUGIN_PATH, `config_dirs` (run.plugin_path,
 * ':'-separated; may be NULL), dtrain's own plugin folder.  Empty
 * entries and repeats are dropped, trailing '/' removed. */
int dt_search_path_new(const char *config_dirs, dt_search_path_t **out);
void dt_search_path_free(dt_search_path_t *sp);
/* The number of folders, and the i-th (NULL past the end). */
size_t dt_search_path_count(const dt_search_path_t *sp);
const char *dt_search_path_dir(const dt_search_path_t *sp, size_t i);

/* Whether `name` can name a plugin: 1 to 63 letters, digits, '_' or '-'
 * (names become file names and config table names; dt_plugin_open refuses
 * others with DT_ERR_INVALID). */
int dt_plugin_name_ok(const char *name);

/* Find plugin `name` of `kind` on `sp`, load it and check its ABI.  The
 * plugin has no host table yet (p->host is NULL): bind it before calling
 * into it.  Free with dt_plugin_unload. */
int dt_plugin_open(const dt_search_path_t *sp, int kind, const char *name,
                   dt_plugin_t **out);
/* Build p's host table.  Its cfg_* read table p->name of `cfg`, which must
 * already be claimed with the plugin's keys (dt_config_apply_schema with
 * p->info->config_keys: DT_ERR_INVALID otherwise); the caller keeps cfg
 * alive until dt_plugin_unload.  cfg == NULL: the keys' declared defaults.
 * Once per plugin. */
int dt_plugin_bind(dt_plugin_t *p, const dt_config_t *cfg);
/* dt_plugin_open + dt_plugin_bind(NULL): for tools and tests that use a
 * plugin with its defaults. */
int dt_plugin_load(const dt_search_path_t *sp, int kind, const char *name,
                   dt_plugin_t **out);
void dt_plugin_unload(dt_plugin_t *p);

/* Call the plugin's optional cleanup_job(host, job_id) (comm.h, offload.h):
 * remove what ranks of job `job_id` left behind.  DT_OK without calling
 * anything when the plugin has no such slot (its kind has none, or its
 * table ends before it, or it is NULL); otherwise the slot's status, with
 * the message prefixed "kind/name: ".  p must be bound. */
int dt_plugin_cleanup_job(const dt_plugin_t *p, const char *job_id);

/* After a plugin method returned `rc` != DT_OK: make sure the message is
 * prefixed "kind/name: " and says what failed, even if the plugin set no
 * message ("kind/name: init failed (DT_ERR_SYSTEM) and gave no reason").
 * Returns rc. */
int dt_plugin_failed(const dt_plugin_t *p, int rc, const char *what);

/* After plugin `p` handed out instance `handle` (init, or a comm's split):
 * through table `ops` (p->ops, or an interposer's over it): DT_OK when the
 * handle starts with `ops` (the SDK's rule, e.g. dtrain/comm.h at
 * dt_comm_t) or is NULL.  Otherwise the instance is finalized through
 * `ops` and the call
 * fails with DT_ERR_INVALID, "plugin 'X': its dt_comm handle does not
 * start with its ops table (dtrain/comm.h)"; the caller drops its pointer.
 * Models hand out no instances (a no-op for them). */
int dt_plugin_check_instance(const dt_plugin_t *p, const void *ops, void *handle);

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
    int loadable;        /* 1: dt_plugin_open succeeds */
    char why[1024];      /* when not loadable */
} dt_plugin_listing_t;

/* Scan the search path for dtrain_*.so (first hit of a name wins, as in
 * loading) and probe each.  Returns a malloc'd array in *out (free()) and
 * its length in *n. */
int dt_plugin_discover(const dt_search_path_t *sp, dt_plugin_listing_t **out,
                       size_t *n);

#endif /* DT_CORE_LOADER_H */
