/*
 * core/loader/host_services.c - the host services table each loaded plugin
 * gets (dtrain/host.h).  Its log writes the core's log line (util/log.c).
 *
 * One dt_host_state_t per plugin holds the table as its first member, so
 * every host function finds its plugin from the table pointer it is given;
 * the table's ctx points at the dt_plugin_t as host.h promises the core.
 */
#include "loader/host_services.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "launch/rendezvous.h"
#include "util/error.h"
#include "util/fileutil.h"
#include "util/log.h"

_Static_assert(DT_HOST_BOOTSTRAP_MAX == DT_RDZV_BLOB_MAX, "the host slot's blob bound is the "
               "rendezvous's");

/* ------------------------------------------------------- host state -- */

typedef struct dt_host_state {
    dt_host_t table;          /* first: (dt_host_state_t *)table */
    dt_plugin_t *plugin;
    char who[96];                /* "comm/shm" */
    const dt_config_t *cfg;      /* what cfg_* read; may be own_cfg */
    dt_config_t *own_cfg;        /* the plugin's declared defaults */
    pthread_mutex_t lock;        /* guards mem and accounted */
    dt_mem_stats_t mem;          /* alloc and mem_account together */
    dt_mem_stats_t accounted;    /* mem_account only: shared mappings */
} dt_host_state_t;

static dt_host_state_t *state_of(const dt_host_t *h)
{
    return (dt_host_state_t *)(uintptr_t)h;
}

static void host_log(const dt_host_t *h, int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dt_logv(level, state_of(h)->who, fmt, ap);
    va_end(ap);
}

static int host_set_error(const dt_host_t *h, int status, const char *fmt,
                          ...)
{
    /* Format first: the arguments may point into the error buffer itself. */
    char msg[DT_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dt_err_set(status, "%s: %s", state_of(h)->who, msg);
}

/* ---- tagged host memory ----
 * Each block carries a 64-byte header in front of the pointer handed out,
 * so free knows its size and tag and the user pointer keeps 64-byte
 * alignment. */

#define HOST_HDR 64u
#define HOST_MAGIC UINT64_C(0x64747261696e4d31) /* "dtrainM1" */

typedef struct host_block {
    uint64_t magic;
    uint64_t bytes;
    const dt_host_state_t *owner;
    int32_t tag;
} host_block_t;
_Static_assert(sizeof(host_block_t) <= HOST_HDR, "host block header");

static void count(dt_mem_stats_t *m, int tag, int64_t delta)
{
    m->current[tag] += (uint64_t)delta;
    m->total_current += (uint64_t)delta;
    if (m->current[tag] > m->peak[tag])
        m->peak[tag] = m->current[tag];
    if (m->total_current > m->total_peak)
        m->total_peak = m->total_current;
}

/* Add `delta` bytes (may be negative) to the plugin's count under `tag`,
 * with the peaks; `accounted`: held by other means than alloc (counted
 * apart too). */
static void tally(dt_host_state_t *hs, int tag, int64_t delta, int accounted)
{
    pthread_mutex_lock(&hs->lock);
    count(&hs->mem, tag, delta);
    if (accounted)
        count(&hs->accounted, tag, delta);
    pthread_mutex_unlock(&hs->lock);
}

static void host_mem_account(const dt_host_t *h, int tag, int64_t delta)
{
    if (tag >= 0 && tag < DT_TAG_COUNT)
        tally(state_of(h), tag, delta, 1);
}

static void *host_alloc(const dt_host_t *h, uint64_t bytes, int tag)
{
    dt_host_state_t *hs = state_of(h);
    if (tag < 0 || tag >= DT_TAG_COUNT) {
        dt_err_set(DT_ERR_INVALID,
                   "%s: host alloc of %" PRIu64 " bytes: unknown memory tag %d "
                   "(dt_mem_tag_t is 0..%d)", hs->who, bytes, tag,
                   DT_TAG_COUNT - 1);
        return NULL;
    }
    if (bytes > SIZE_MAX - HOST_HDR) {
        dt_err_set(DT_ERR_NOMEM,
                   "%s: host alloc of %" PRIu64 " bytes tagged '%s' failed: "
                   "larger than the address space", hs->who, bytes,
                   dt_mem_tag_name(tag));
        return NULL;
    }

    /* Counted before allocating, undone below if the allocation fails. */
    tally(hs, tag, (int64_t)bytes, 0);

    void *raw = NULL;
    if (posix_memalign(&raw, HOST_HDR, HOST_HDR + (size_t)bytes) != 0) {
        tally(hs, tag, -(int64_t)bytes, 0);
        dt_err_set(DT_ERR_NOMEM,
                   "%s: host alloc of %" PRIu64 " bytes tagged '%s' failed: "
                   "out of memory", hs->who, bytes, dt_mem_tag_name(tag));
        return NULL;
    }
    host_block_t *b = raw;
    b->magic = HOST_MAGIC;
    b->bytes = bytes;
    b->owner = hs;
    b->tag = tag;
    return (char *)raw + HOST_HDR;
}

static void host_free(const dt_host_t *h, void *ptr)
{
    if (!ptr)
        return;
    dt_host_state_t *hs = state_of(h);
    host_block_t *b = (host_block_t *)(void *)((char *)ptr - HOST_HDR);
    /* free cannot fail by contract; a foreign pointer is a plugin bug, so
     * say so and leak it rather than corrupt the heap. */
    if (b->magic != HOST_MAGIC || b->owner != hs) {
        dt_log(DT_LOG_ERROR, hs->who,
               "host free of %p: not a live block from this plugin's host "
               "alloc (freed twice, or from another table); ignored", ptr);
        return;
    }
    tally(hs, b->tag, -(int64_t)b->bytes, 0);
    b->magic = 0;
    free(b);
}

/* ---- config ---- */

/* "name.key" into buf; DT_ERR_INVALID when it does not fit. */
static int cfg_path(const dt_host_state_t *hs, const char *key, char *buf,
                    size_t cap)
{
    if (!key || !*key)
        return dt_err_set(DT_ERR_INVALID, "%s: config read with an empty key",
                          hs->who);
    int n = snprintf(buf, cap, "%s.%s", hs->plugin->name, key);
    if (n < 0 || (size_t)n >= cap)
        return dt_err_set(DT_ERR_INVALID, "%s: config key '%.64s...' is too "
                          "long", hs->who, key);
    return DT_OK;
}

static int cfg_fail(const dt_host_state_t *hs, int rc, const char *path)
{
    return dt_err_context(rc, "%s: reading config '%s'", hs->who, path);
}

#define HOST_CFG_GETTER(fn, type, getter)                                      \
    static int fn(const dt_host_t *h, const char *key, type *out)           \
    {                                                                          \
        const dt_host_state_t *hs = state_of(h);                               \
        char path[256];                                                        \
        int rc = cfg_path(hs, key, path, sizeof path);                         \
        if (rc != DT_OK)                                                       \
            return rc;                                                         \
        if (!out)                                                              \
            return dt_err_set(DT_ERR_INVALID, "%s: reading config '%s': "      \
                              "NULL out pointer", hs->who, path);              \
        if (!hs->cfg)                                                          \
            return dt_err_set(DT_ERR_NOT_FOUND, "%s: reading config '%s': "    \
                              "no configuration is bound to this plugin",      \
                              hs->who, path);                                  \
        char saved[DT_ERR_MAX];                                                \
        snprintf(saved, sizeof saved, "%s", dt_last_error());                  \
        dt_err_clear();                                                        \
        rc = getter(hs->cfg, path, out);                                       \
        if (rc != DT_OK)                                                       \
            return cfg_fail(hs, rc, path);                                     \
        dt_err_set(DT_OK, "%s", saved); /* a read leaves no trace */           \
        return DT_OK;                                                          \
    }

HOST_CFG_GETTER(host_cfg_bool, int, dt_config_get_bool)
HOST_CFG_GETTER(host_cfg_int, int64_t, dt_config_get_int)
HOST_CFG_GETTER(host_cfg_float, double, dt_config_get_float)
HOST_CFG_GETTER(host_cfg_string, const char *, dt_config_get_string)

static uint64_t host_now_ns(const dt_host_t *h)
{
    (void)h;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

/* The job's rendezvous (core/launch/rendezvous.h), while a run starts. */
static int host_bootstrap_all_gather(const dt_host_t *h, const void *mine, uint64_t bytes,
                                     void *all, int64_t timeout_ms)
{
    const dt_host_state_t *hs = state_of(h);
    if (bytes > DT_HOST_BOOTSTRAP_MAX)
        return dt_err_set(DT_ERR_INVALID,
                          "%s: bootstrap all-gather of %llu bytes: at most %d per rank",
                          hs->who, (unsigned long long)bytes, DT_HOST_BOOTSTRAP_MAX);
    int rc = dt_rdzv_session_all_gather(mine, (size_t)bytes, all,
                                        timeout_ms > 0 ? (double)timeout_ms / 1000.0 : 0);
    return rc ? dt_err_context(rc, "%s", hs->who) : DT_OK;
}

/* The core's list of paths removed on SIGINT/SIGTERM (util/fileutil.h). */
static int host_cleanup_add(const dt_host_t *h, const char *path, uint32_t flags)
{
    (void)h;
    if (flags != DT_HOST_CLEANUP_FILE && flags != DT_HOST_CLEANUP_EMPTY_DIR)
        return DT_ERR_INVALID;
    return dt_cleanup_add(path, flags == DT_HOST_CLEANUP_FILE ? DT_CLEANUP_FILE
                                                               : DT_CLEANUP_EMPTY_DIR);
}

static void host_cleanup_remove(const dt_host_t *h, const char *path)
{
    (void)h;
    dt_cleanup_remove(path);
}

/* -------------------------------------------------------- lifecycle -- */

/* A config holding only the plugin's table, filled from its declared
 * defaults, for plugins loaded without a resolved config.  NULL when the
 * plugin declares no keys or a key has no default (then reads fail with
 * "no configuration is bound"). */
static dt_config_t *defaults_config(const dt_plugin_t *p)
{
    const dt_plugin_info_t *info = p->info;
    if (!info || info->n_config_keys == 0 || !info->config_keys)
        return NULL;
    char saved[DT_ERR_MAX];
    snprintf(saved, sizeof saved, "%s", dt_last_error());
    dt_config_t *c = NULL;
    if (dt_config_new(&c) != DT_OK ||
        dt_config_apply_schema(c, p->name, info->config_keys,
                               info->n_config_keys) != DT_OK) {
        dt_log(DT_LOG_DEBUG, "loader", "%s/%s: no defaults config: %s",
               dt_kind_name(p->kind), p->name, dt_last_error());
        dt_config_free(c);
        c = NULL;
    }
    /* Whatever happened here is not the caller's error. */
    dt_err_set(DT_OK, "%s", saved);
    return c;
}

int dt_host_create(dt_plugin_t *p, const dt_config_t *cfg)
{
    dt_host_state_t *hs = calloc(1, sizeof *hs);
    if (!hs)
        return dt_err_set(DT_ERR_NOMEM, "%s plugin '%s': out of memory for "
                          "its host table", dt_kind_name(p->kind), p->name);
    if (pthread_mutex_init(&hs->lock, NULL) != 0) {
        free(hs);
        return dt_err_set(DT_ERR_SYSTEM, "%s plugin '%s': cannot create a "
                          "mutex", dt_kind_name(p->kind), p->name);
    }
    hs->plugin = p;
    const char *kind = dt_kind_name(p->kind);
    snprintf(hs->who, sizeof hs->who, "%s/%s", kind ? kind : "plugin",
             p->name);
    if (cfg) {
        hs->cfg = cfg;
    } else {
        hs->own_cfg = defaults_config(p);
        hs->cfg = hs->own_cfg;
    }

    dt_host_t *t = &hs->table;
    t->abi_major = DT_HOST_ABI_MAJOR;
    t->abi_minor = DT_HOST_ABI_MINOR;
    t->struct_size = (uint32_t)sizeof(dt_host_t);
    t->name = "dtrain";
    t->version = DTRAIN_VERSION_STRING;
    t->ctx = p;
    t->log = host_log;
    t->set_error = host_set_error;
    t->alloc = host_alloc;
    t->free = host_free;
    t->cfg_bool = host_cfg_bool;
    t->cfg_int = host_cfg_int;
    t->cfg_float = host_cfg_float;
    t->cfg_string = host_cfg_string;
    t->now_ns = host_now_ns;
    t->bootstrap_all_gather = host_bootstrap_all_gather;
    t->mem_account = host_mem_account;
    t->cleanup_add = host_cleanup_add;
    t->cleanup_remove = host_cleanup_remove;
    p->host = t;
    return DT_OK;
}

void dt_host_destroy(dt_plugin_t *p)
{
    if (!p || !p->host)
        return;
    dt_host_state_t *hs = state_of(p->host);
    if (hs->mem.total_current) {
        char detail[512] = "";
        size_t off = 0;
        for (int t = 0; t < DT_TAG_COUNT; t++) {
            if (!hs->mem.current[t] || off >= sizeof detail)
                continue;
            int n = snprintf(detail + off, sizeof detail - off, "%s%s %" PRIu64,
                             off ? ", " : "", dt_mem_tag_name(t),
                             hs->mem.current[t]);
            if (n > 0)
                off += (size_t)n;
        }
        dt_log(DT_LOG_WARN, hs->who,
               "unloaded while holding %" PRIu64 " bytes of host memory (%s)",
               hs->mem.total_current, detail);
    }
    dt_config_free(hs->own_cfg);
    pthread_mutex_destroy(&hs->lock);
    free(hs);
    p->host = NULL;
}

static int mem_stats(const dt_plugin_t *p, int accounted, dt_mem_stats_t *out)
{
    if (!p || !p->host || !out)
        return dt_err_set(DT_ERR_INVALID, "host mem stats: NULL argument");
    dt_host_state_t *hs = state_of(p->host);
    pthread_mutex_lock(&hs->lock);
    dt_mem_stats_t m = accounted ? hs->accounted : hs->mem;
    pthread_mutex_unlock(&hs->lock);
    m.struct_size = (uint32_t)sizeof m;
    m.n_tags = DT_TAG_COUNT;
    int rc = dt_struct_write(out, &m, sizeof m, DT_MEM_STATS_V1_SIZE0);
    if (rc != DT_OK)
        return dt_err_set(rc, "host mem stats of %s: struct_size %u is below the "
                          "%u bytes of its minor 0", hs->who,
                          (unsigned)out->struct_size,
                          (unsigned)DT_MEM_STATS_V1_SIZE0);
    return DT_OK;
}

int dt_plugin_host_mem_stats(const dt_plugin_t *p, dt_mem_stats_t *out)
{
    return mem_stats(p, 0, out);
}

int dt_plugin_host_accounted_stats(const dt_plugin_t *p, dt_mem_stats_t *out)
{
    return mem_stats(p, 1, out);
}

