/*
 * tests/support/test_host.h - a dt_host_v1_t for unit tests that drive a
 * plugin directly (no loader, no TOML): config values come from a small
 * key/value list, errors go to the core's buffer prefixed "kind/name: ".
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
 * by a {NULL, NULL} entry; NULL for none).  No allocation; nothing to free. */
void dt_test_host_init(dt_test_host_t *th, const char *prefix,
                       const dt_test_kv_t *kv);

#endif /* DT_TEST_HOST_H */
