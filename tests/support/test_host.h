/*
 * tests/support/test_host.h - a dt_host_v1_t for unit tests that drive a
 * plugin directly (no loader, no TOML): config values come from a small
 * key/value list, then from the defaults the plugin named by the host's
 * prefix declares in its config_keys (as the core fills them before
 * init); errors go to the core's buffer prefixed "kind/name: ".  Values
 * are not checked against the declared ranges and choices (the core's
 * dt_config_apply_schema does that; a test of a rejected value checks it
 * there, see dt_test_schema_check).
 */
#ifndef DT_TEST_HOST_H
#define DT_TEST_HOST_H

#include "dtrain/dtrain.h"

/* One config value; `value` is parsed by the type the getter asks for
 * ("true"/"false", decimal integers, floats, raw strings). */
typedef struct dt_test_kv {
    const char *key;
    const char *value;
} dt_test_kv_t;

#define DT_TEST_HOST_CLEANUP_MAX 16

typedef struct dt_test_host {
    dt_host_v1_t host;       /* base first: pass &th->host to plugins */
    char prefix[96];         /* "comm/shm" */
    const dt_test_kv_t *kv;  /* NULL-key terminated, may be NULL */
    dt_mem_stats_t mem;
    /* cleanup_add / cleanup_remove only record: the paths registered now
     * (a removed one's slot is emptied), their flags, and how many
     * cleanup_add calls were made in all */
    char cleanup[DT_TEST_HOST_CLEANUP_MAX][1280];
    uint32_t cleanup_flags[DT_TEST_HOST_CLEANUP_MAX];
    int cleanup_calls;
} dt_test_host_t;

/* Whether `path` is registered with th's cleanup_add now (its flags in
 * *flags, which may be NULL); how many paths are, with path NULL. */
int dt_test_host_cleanup_has(const dt_test_host_t *th, const char *path, uint32_t *flags);

/* Fill `th` for plugin `prefix` ("comm/shm") with values `kv` (terminated
 * by a {NULL, NULL} entry; NULL for none); a key not in kv reads as the
 * default the plugin `prefix` names declares, once dt_test_host_declare
 * has seen that plugin (dt_test_plugin_entry does for every plugin it
 * opens; before or after this call), else is DT_ERR_NOT_FOUND, as is a
 * required key (no default).
 * No allocation; nothing to free. */
void dt_test_host_init(dt_test_host_t *th, const char *prefix,
                       const dt_test_kv_t *kv);

/* Record the defaults plugin `info` declares for test hosts of prefix
 * "<kind>/<name>" ("strategy/zero"): copies, so they outlive a dlclose;
 * a second call for a name replaces the first.  Thread-safe. */
void dt_test_host_declare(const dt_plugin_info_t *info);

/* The core's check of [<info->name>] holding the values `kv` (as --set
 * table.key=value would give them) against info's declared keys:
 * dt_config_apply_schema's status, its message in dt_last_error(). */
int dt_test_schema_check(const dt_plugin_info_t *info, const dt_test_kv_t *kv);

#endif /* DT_TEST_HOST_H */
