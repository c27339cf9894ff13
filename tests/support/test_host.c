/*
 * tests/support/test_host.c - the unit tests' host services table, the
 * defaults of the plugins' declared keys it falls back to, and the core's
 * schema check for a test's values.
 */
#include "test_host.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config/config.h"
#include "loader/plugin_handle.h"
#include "util/error.h"

static dt_test_host_t *th_of(const dt_host_v1_t *h) { return (dt_test_host_t *)h->ctx; }

/* ------------------------------------------------- declared defaults -- */

#define DEFAULTS_PLUGINS_MAX 32
#define DEFAULTS_KEYS_MAX 32

/* One plugin's declared keys: names and defaults as kv holds values (a
 * string unquoted, a number without '_'); has_def 0 for a required key. */
typedef struct dt_test_defaults {
    char prefix[96];
    uint32_t n;
    char name[DEFAULTS_KEYS_MAX][64];
    char def[DEFAULTS_KEYS_MAX][128];
    int has_def[DEFAULTS_KEYS_MAX];
} dt_test_defaults_t;

static dt_test_defaults_t g_defaults[DEFAULTS_PLUGINS_MAX];
static uint32_t g_n_defaults;
static pthread_mutex_t g_defaults_mu = PTHREAD_MUTEX_INITIALIZER;

/* Default `def` (TOML literal) as kv would hold it. */
static void decode_default(const char *def, char *out, size_t cap)
{
    size_t n = 0, len = strlen(def);
    int quoted = len >= 2 && def[0] == '"' && def[len - 1] == '"';
    if (quoted) {
        def++;
        len -= 2;
    }
    for (size_t i = 0; i < len && n + 1 < cap; i++)
        if (quoted || def[i] != '_')
            out[n++] = def[i];
    out[n] = '\0';
}

static const dt_test_defaults_t *defaults_find(const char *prefix)
{
    const dt_test_defaults_t *d = NULL;
    pthread_mutex_lock(&g_defaults_mu);
    for (uint32_t i = 0; i < g_n_defaults && !d; i++)
        if (strcmp(g_defaults[i].prefix, prefix) == 0)
            d = &g_defaults[i];
    pthread_mutex_unlock(&g_defaults_mu);
    return d;
}

void dt_test_host_declare(const dt_plugin_info_t *info)
{
    if (!info || !info->name || info->n_config_keys == 0 || !info->config_keys)
        return;
    char prefix[96];
    const char *kind = dt_kind_name((int)info->kind);
    snprintf(prefix, sizeof prefix, "%s/%s", kind ? kind : "plugin", info->name);
    if (info->n_config_keys > DEFAULTS_KEYS_MAX) {
        fprintf(stderr, "dt_test_host_declare: %s declares %u keys, more than %d\n", prefix,
                (unsigned)info->n_config_keys, DEFAULTS_KEYS_MAX);
        abort();
    }
    pthread_mutex_lock(&g_defaults_mu);
    dt_test_defaults_t *d = NULL;
    for (uint32_t i = 0; i < g_n_defaults && !d; i++)
        if (strcmp(g_defaults[i].prefix, prefix) == 0)
            d = &g_defaults[i];
    if (!d && g_n_defaults == DEFAULTS_PLUGINS_MAX) {
        fprintf(stderr, "dt_test_host_declare: more than %d plugins\n", DEFAULTS_PLUGINS_MAX);
        abort();
    }
    if (!d)
        d = &g_defaults[g_n_defaults++];
    memset(d, 0, sizeof *d);
    snprintf(d->prefix, sizeof d->prefix, "%s", prefix);
    d->n = info->n_config_keys;
    for (uint32_t i = 0; i < d->n; i++) {
        const dt_config_key_t *k = &info->config_keys[i];
        snprintf(d->name[i], sizeof d->name[i], "%s", k->name);
        d->has_def[i] = k->def != NULL;
        if (k->def)
            decode_default(k->def, d->def[i], sizeof d->def[i]);
    }
    pthread_mutex_unlock(&g_defaults_mu);
}

int dt_test_schema_check(const dt_plugin_info_t *info, const dt_test_kv_t *kv)
{
    dt_config_t *c = NULL;
    int rc = dt_config_new(&c);
    for (; rc == DT_OK && kv && kv->key; kv++) {
        char a[512];
        snprintf(a, sizeof a, "%s.%s=%s", info->name, kv->key, kv->value);
        rc = dt_config_override(c, a);
    }
    if (rc == DT_OK)
        rc = dt_config_apply_schema(c, info->name, info->config_keys, info->n_config_keys);
    dt_config_free(c);
    return rc;
}

/* ------------------------------------------------------- host table -- */

static void th_log(const dt_host_v1_t *h, int level, const char *fmt, ...)
{
    if (level > DT_LOG_WARN && !getenv("DTRAIN_TEST_VERBOSE"))
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", th_of(h)->prefix);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static int th_set_error(const dt_host_v1_t *h, int status, const char *fmt, ...)
{
    char msg[DT_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_err_set(status, "%s: %.3900s", th_of(h)->prefix, msg);
}

/* Header in front of each block so free() knows size and tag. */
typedef struct { uint64_t bytes; int32_t tag; int32_t pad; char align[48]; } th_hdr_t;

static void tally(dt_test_host_t *th, int tag, int64_t delta)
{
    th->mem.current[tag] += (uint64_t)delta;
    th->mem.total_current += (uint64_t)delta;
    if (th->mem.current[tag] > th->mem.peak[tag])
        th->mem.peak[tag] = th->mem.current[tag];
    if (th->mem.total_current > th->mem.total_peak)
        th->mem.total_peak = th->mem.total_current;
}

static void *th_alloc(const dt_host_v1_t *h, uint64_t bytes, int tag)
{
    dt_test_host_t *th = th_of(h);
    if (tag < 0 || tag >= DT_TAG_COUNT) {
        th_set_error(h, DT_ERR_INVALID, "alloc: bad tag %d", tag);
        return NULL;
    }
    th_hdr_t *p = NULL;
    if (posix_memalign((void **)&p, 64, sizeof *p + bytes) != 0) {
        th_set_error(h, DT_ERR_NOMEM, "alloc: %llu bytes (%s) failed",
                     (unsigned long long)bytes, dt_mem_tag_name(tag));
        return NULL;
    }
    p->bytes = bytes;
    p->tag = tag;
    tally(th, tag, (int64_t)bytes);
    return p + 1;
}

static void th_mem_account(const dt_host_v1_t *h, int tag, int64_t delta)
{
    if (tag >= 0 && tag < DT_TAG_COUNT)
        tally(th_of(h), tag, delta);
}

static void th_free(const dt_host_v1_t *h, void *ptr)
{
    if (!ptr)
        return;
    dt_test_host_t *th = th_of(h);
    th_hdr_t *p = (th_hdr_t *)ptr - 1;
    tally(th, p->tag, -(int64_t)p->bytes);
    free(p);
}

static const char *th_find(const dt_host_v1_t *h, const char *key)
{
    const dt_test_host_t *th = th_of(h);
    for (const dt_test_kv_t *kv = th->kv; kv && kv->key; kv++)
        if (strcmp(kv->key, key) == 0)
            return kv->value;
    const dt_test_defaults_t *d = defaults_find(th->prefix);
    for (uint32_t i = 0; d && i < d->n; i++)
        if (strcmp(d->name[i], key) == 0)
            return d->has_def[i] ? d->def[i] : NULL;
    return NULL;
}

static int th_cfg_bool(const dt_host_v1_t *h, const char *key, int *out)
{
    const char *v = th_find(h, key);
    if (!v)
        return DT_ERR_NOT_FOUND;
    *out = strcmp(v, "true") == 0;
    return DT_OK;
}

static int th_cfg_int(const dt_host_v1_t *h, const char *key, int64_t *out)
{
    const char *v = th_find(h, key);
    if (!v)
        return DT_ERR_NOT_FOUND;
    *out = strtoll(v, NULL, 10);
    return DT_OK;
}

static int th_cfg_float(const dt_host_v1_t *h, const char *key, double *out)
{
    const char *v = th_find(h, key);
    if (!v)
        return DT_ERR_NOT_FOUND;
    *out = strtod(v, NULL);
    return DT_OK;
}

static int th_cfg_string(const dt_host_v1_t *h, const char *key, const char **out)
{
    const char *v = th_find(h, key);
    if (!v)
        return DT_ERR_NOT_FOUND;
    *out = v;
    return DT_OK;
}

static uint64_t th_now_ns(const dt_host_v1_t *h)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int th_cleanup_add(const dt_host_v1_t *h, const char *path, uint32_t flags)
{
    dt_test_host_t *th = th_of(h);
    th->cleanup_calls++;
    if (!path || !path[0] || strlen(path) >= sizeof th->cleanup[0] ||
        (flags != DT_HOST_CLEANUP_FILE && flags != DT_HOST_CLEANUP_EMPTY_DIR))
        return DT_ERR_INVALID;
    for (int i = 0; i < DT_TEST_HOST_CLEANUP_MAX; i++)
        if (!th->cleanup[i][0]) {
            snprintf(th->cleanup[i], sizeof th->cleanup[i], "%s", path);
            th->cleanup_flags[i] = flags;
            return DT_OK;
        }
    return DT_ERR_NOMEM;
}

static void th_cleanup_remove(const dt_host_v1_t *h, const char *path)
{
    dt_test_host_t *th = th_of(h);
    for (int i = 0; path && i < DT_TEST_HOST_CLEANUP_MAX; i++)
        if (strcmp(th->cleanup[i], path) == 0) {
            th->cleanup[i][0] = '\0';
            return;
        }
}

int dt_test_host_cleanup_has(const dt_test_host_t *th, const char *path, uint32_t *flags)
{
    int n = 0;
    for (int i = 0; i < DT_TEST_HOST_CLEANUP_MAX; i++) {
        if (!th->cleanup[i][0])
            continue;
        n++;
        if (path && strcmp(th->cleanup[i], path) == 0) {
            if (flags)
                *flags = th->cleanup_flags[i];
            return 1;
        }
    }
    return path ? 0 : n;
}

void dt_test_host_init(dt_test_host_t *th, const char *prefix, const dt_test_kv_t *kv)
{
    memset(th, 0, sizeof *th);
    snprintf(th->prefix, sizeof th->prefix, "%s", prefix);
    th->kv = kv;
    th->host = (dt_host_v1_t){
        .abi_major = DT_HOST_ABI_MAJOR,
        .abi_minor = DT_HOST_ABI_MINOR,
        .struct_size = sizeof(dt_host_v1_t),
        .name = "dtrain-test",
        .version = DTRAIN_VERSION_STRING,
        .ctx = th,
        .log = th_log,
        .set_error = th_set_error,
        .alloc = th_alloc,
        .free = th_free,
        .cfg_bool = th_cfg_bool,
        .cfg_int = th_cfg_int,
        .cfg_float = th_cfg_float,
        .cfg_string = th_cfg_string,
        .now_ns = th_now_ns,
        .mem_account = th_mem_account,
        .cleanup_add = th_cleanup_add,
        .cleanup_remove = th_cleanup_remove,
    };
}

