/*
 * tests/unit/core/loader/test_host_services.c - the per-plugin host table the loader
 * builds (core/loader/host_services.c), through a loaded fake plugin:
 * set_error prefixing, tagged allocation with per-tag peaks,
 * config reads of the plugin's own table, log format and filtering, clock,
 * paths removed on SIGINT/SIGTERM (cleanup_add).
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/config.h"
#include "dtrain/dtrain.h"
#include "loader/host_services.h"
#include "loader/loader.h"
#include "util/error.h"
#include "util/log.h"
#include "test_assert.h"

#ifndef DT_FAKE_PLUGIN_DIR
#define DT_FAKE_PLUGIN_DIR DT_TEST_BINARY_DIR "/fake-plugins"
#endif


/* dt_plugin_load on the environment's search path. */
static int load_plugin(int kind, const char *name, dt_plugin_t **out)
{
    dt_search_path_t *sp = NULL;
    int rc = dt_search_path_new(NULL, &sp);
    if (rc == DT_OK)
        rc = dt_plugin_load(sp, kind, name, out);
    dt_search_path_free(sp);
    return rc;
}

/* The fake plugin bound to `cfg` (its table already checked), or to its
 * declared defaults when cfg is NULL. */
static dt_plugin_t *load_fake(const dt_config_t *cfg)
{
    dt_plugin_t *p = NULL;
    dt_search_path_t *sp = NULL;
    if (dt_search_path_new(NULL, &sp) != DT_OK ||
        dt_plugin_open(sp, DT_KIND_COMM, "fake", &p) != DT_OK ||
        dt_plugin_bind(p, cfg) != DT_OK)
        fail_msg("loading fake: %s", dt_last_error());
    dt_search_path_free(sp);
    return p;
}

static int setup(void **state)
{
    setenv("DTRAIN_PLUGIN_PATH", DT_FAKE_PLUGIN_DIR, 1);
    dt_log_set_level(DT_LOG_WARN);
    dt_log_set_rank(-1);
    dt_err_clear();
    *state = load_fake(NULL);
    return 0;
}

static int teardown(void **state)
{
    dt_plugin_unload(*state);
    return 0;
}

static void test_table_fields(void **state)
{
    dt_plugin_t *p = *state;
    const dt_host_v1_t *h = p->host;
    assert_int_equal(h->abi_major, DT_HOST_ABI_MAJOR);
    assert_int_equal(h->abi_minor, DT_HOST_ABI_MINOR);
    assert_int_equal(h->struct_size, sizeof(dt_host_v1_t));
    assert_string_equal(h->name, "dtrain");
    assert_string_equal(h->version, DTRAIN_VERSION_STRING);
    assert_ptr_equal(h->ctx, p);
    assert_non_null(h->log);
    assert_non_null(h->set_error);
    assert_non_null(h->alloc);
    assert_non_null(h->free);
    assert_non_null(h->cfg_bool);
    assert_non_null(h->cfg_int);
    assert_non_null(h->cfg_float);
    assert_non_null(h->cfg_string);
    assert_non_null(h->now_ns);
    assert_true(DT_HOST_HAS(h, bootstrap_all_gather));
}

/* The bootstrap all-gather outside `dtrain run`'s rendezvous session is
 * refused, and an oversized blob before anything else (the session and the
 * join are test_rendezvous's). */
static void test_bootstrap_outside_a_run(void **state)
{
    const dt_host_v1_t *h = ((dt_plugin_t *)*state)->host;
    char mine[8] = "abcdefg", all[16];
    assert_int_equal(h->bootstrap_all_gather(h, mine, sizeof mine, all, 100),
                     DT_ERR_UNSUPPORTED);
    assert_msg("comm/fake: bootstrap all-gather: no rendezvous here (it is offered while "
               "`dtrain run` initialises the communicator)");
    assert_int_equal(h->bootstrap_all_gather(h, mine, DT_HOST_BOOTSTRAP_MAX + 1, all, 100),
                     DT_ERR_INVALID);
    assert_msg("comm/fake: bootstrap all-gather of 4097 bytes: at most 4096 per rank");
}

static void test_set_error_prefixes(void **state)
{
    const dt_host_v1_t *h = ((dt_plugin_t *)*state)->host;
    assert_int_equal(h->set_error(h, DT_ERR_TIMEOUT,
                                  "allreduce #%d (%s, %llu bytes) timed out",
                                  7, "f32", 4096ULL), DT_ERR_TIMEOUT);
    assert_msg("comm/fake: allreduce #7 (f32, 4096 bytes) timed out");
    /* an argument pointing into the error buffer itself is safe */
    assert_int_equal(h->set_error(h, DT_ERR_REMOTE, "again: %s",
                                  dt_last_error()), DT_ERR_REMOTE);
    assert_msg("comm/fake: again: comm/fake: allreduce #7 (f32, 4096 bytes) "
               "timed out");
    /* status passes through unchanged, even one it does not know */
    assert_int_equal(h->set_error(h, 99, "x"), 99);
    assert_msg("comm/fake: x");

    /* two plugins, two prefixes */
    dt_plugin_t *q = NULL;
    assert_int_equal(load_plugin(DT_KIND_COMM, "fakesmall", &q),
                     DT_OK);
    q->host->set_error(q->host, DT_ERR_IO, "short read");
    assert_msg("comm/fakesmall: short read");
    dt_plugin_unload(q);
}

static void check_stats(const dt_plugin_t *p, int tag, uint64_t cur,
                        uint64_t peak, uint64_t total, uint64_t total_peak)
{
    dt_mem_stats_t st = {.struct_size = sizeof(dt_mem_stats_t)};
    assert_int_equal(dt_plugin_host_mem_stats(p, &st), DT_OK);
    assert_int_equal(st.struct_size, sizeof st);
    assert_int_equal(st.n_tags, DT_TAG_COUNT);
    if (st.current[tag] != cur || st.peak[tag] != peak ||
        st.total_current != total || st.total_peak != total_peak)
        fail_msg("tag %s: current %llu peak %llu total %llu total_peak %llu; "
                 "expected %llu %llu %llu %llu", dt_mem_tag_name(tag),
                 (unsigned long long)st.current[tag],
                 (unsigned long long)st.peak[tag],
                 (unsigned long long)st.total_current,
                 (unsigned long long)st.total_peak, (unsigned long long)cur,
                 (unsigned long long)peak, (unsigned long long)total,
                 (unsigned long long)total_peak);
}

static void test_alloc_accounting(void **state)
{
    dt_plugin_t *p = *state;
    const dt_host_v1_t *h = p->host;
    check_stats(p, DT_TAG_PARAMS, 0, 0, 0, 0);

    unsigned char *a = h->alloc(h, 1000, DT_TAG_PARAMS);
    unsigned char *b = h->alloc(h, 3000, DT_TAG_PARAMS);
    float *g = h->alloc(h, 512 * sizeof(float), DT_TAG_GRADS);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(g);
    assert_int_equal((uintptr_t)a % 64, 0);
    assert_int_equal((uintptr_t)b % 64, 0);
    assert_int_equal((uintptr_t)g % 64, 0);
    memset(a, 0xab, 1000); /* usable to the last byte (ASan checks) */
    memset(b, 0xcd, 3000);
    for (int i = 0; i < 512; i++)
        g[i] = (float)i;
    assert_int_equal(a[999], 0xab);
    check_stats(p, DT_TAG_PARAMS, 4000, 4000, 6048, 6048);
    check_stats(p, DT_TAG_GRADS, 2048, 2048, 6048, 6048);

    h->free(h, b);
    check_stats(p, DT_TAG_PARAMS, 1000, 4000, 3048, 6048);
    h->free(h, g);
    check_stats(p, DT_TAG_GRADS, 0, 2048, 1000, 6048);
    /* total_peak is the highest total, not the sum of per-tag peaks */
    unsigned char *o = h->alloc(h, 4000, DT_TAG_OPTIMIZER);
    assert_non_null(o);
    check_stats(p, DT_TAG_OPTIMIZER, 4000, 4000, 5000, 6048);

    /* a caller's struct below minor 0 is refused, not overrun */
    dt_mem_stats_t small = {.struct_size = DT_MEM_STATS_V1_SIZE0 - 8};
    assert_status(dt_plugin_host_mem_stats(p, &small), DT_ERR_ABI);
    assert_int_equal(small.total_current, 0);

    /* zero bytes: a unique non-NULL pointer, accounted as 0 */
    void *z1 = h->alloc(h, 0, DT_TAG_OTHER), *z2 = h->alloc(h, 0, DT_TAG_OTHER);
    assert_non_null(z1);
    assert_non_null(z2);
    assert_ptr_not_equal(z1, z2);
    check_stats(p, DT_TAG_OTHER, 0, 0, 5000, 6048);
    h->free(h, z1);
    h->free(h, z2);
    h->free(h, NULL);

    h->free(h, a);
    h->free(h, o);
    check_stats(p, DT_TAG_PARAMS, 0, 4000, 0, 6048);
    check_stats(p, DT_TAG_OPTIMIZER, 0, 4000, 0, 6048);
}

static void test_alloc_failures(void **state)
{
    dt_plugin_t *p = *state;
    const dt_host_v1_t *h = p->host;
    assert_null(h->alloc(h, 8, 99));
    assert_msg("comm/fake: host alloc of 8 bytes: unknown memory tag 99 "
               "(dt_mem_tag_t is 0..7)");
    assert_null(h->alloc(h, 8, -1));
    assert_msg_starts("comm/fake: host alloc of 8 bytes: unknown memory tag -1");

    void *a = h->alloc(h, 1000, DT_TAG_ACTIVATIONS);
    assert_non_null(a);
    /* larger than the address space */
    assert_null(h->alloc(h, UINT64_MAX - 10, DT_TAG_STAGING));
    assert_msg_starts("comm/fake: host alloc of 18446744073709551605 bytes "
                      "tagged 'staging' failed: ");
    /* a failed request changes no statistics */
    check_stats(p, DT_TAG_STAGING, 0, 0, 1000, 1000);
    h->free(h, a);
}

/* Accounting is exact under concurrent alloc/free from many threads. */
static void *churn(void *arg)
{
    const dt_host_v1_t *h = arg;
    for (int i = 0; i < 2000; i++) {
        int tag = i % DT_TAG_COUNT;
        void *x = h->alloc(h, (uint64_t)(64 + i % 200), tag);
        if (!x)
            return (void *)1;
        h->free(h, x);
    }
    return NULL;
}

static void test_alloc_threads(void **state)
{
    dt_plugin_t *p = *state;
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn,
                                        (void *)(uintptr_t)p->host), 0);
    for (int i = 0; i < 4; i++) {
        void *ret = (void *)2;
        assert_int_equal(pthread_join(t[i], &ret), 0);
        assert_null(ret);
    }
    dt_mem_stats_t st = {.struct_size = sizeof(dt_mem_stats_t)};
    assert_int_equal(dt_plugin_host_mem_stats(p, &st), DT_OK);
    assert_int_equal(st.total_current, 0);
    for (int tag = 0; tag < DT_TAG_COUNT; tag++) {
        assert_int_equal(st.current[tag], 0);
        assert_true(st.peak[tag] >= 64 && st.peak[tag] <= 4 * 263);
    }
}

static void test_alloc_is_per_plugin(void **state)
{
    dt_plugin_t *p = *state, *q = NULL;
    assert_int_equal(load_plugin(DT_KIND_COMM, "fakesmall", &q),
                     DT_OK);
    void *x = q->host->alloc(q->host, 777, DT_TAG_COMM);
    assert_non_null(x);
    check_stats(q, DT_TAG_COMM, 777, 777, 777, 777);
    check_stats(p, DT_TAG_COMM, 0, 0, 0, 0);
    /* freeing through the wrong table is refused, not mis-accounted */
    fflush(stderr);
    FILE *cap = tmpfile();
    int saved = dup(2);
    dup2(fileno(cap), 2);
    p->host->free(p->host, x);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char log[1024] = "";
    rewind(cap);
    log[fread(log, 1, sizeof log - 1, cap)] = '\0';
    fclose(cap);
    assert_non_null(strstr(log, "[rank ?] comm/fake: host free of "));
    assert_non_null(strstr(log, "not a live block from this plugin's host "
                                "alloc"));
    check_stats(q, DT_TAG_COMM, 777, 777, 777, 777);
    q->host->free(q->host, x);
    check_stats(q, DT_TAG_COMM, 0, 777, 0, 777);
    dt_plugin_unload(q);
}

/* ------------------------------------------------------------- config -- */

static dt_config_t *config_for(dt_plugin_t *p, const char *text, int want_rc)
{
    dt_config_t *cfg = NULL;
    if (dt_config_load_string("run.toml", text, &cfg) != DT_OK)
        fail_msg("config: %s", dt_last_error());
    int rc = dt_config_apply_schema(cfg, "fake", p->info->config_keys,
                                    p->info->n_config_keys);
    if (rc != want_rc)
        fail_msg("apply_schema: %s, expected %s (%s)", dt_status_name(rc),
                 dt_status_name(want_rc), dt_last_error());
    return cfg;
}

static void test_cfg_reads_plugin_table(void **state)
{
    dt_plugin_t *p0 = *state;
    dt_config_t *cfg = config_for(p0,
                                  "[fake]\ngreeting = \"hi there\"\n"
                                  "count = 7\nratio = 1\nverbose = true\n"
                                  "[other]\ncount = 9\n", DT_OK);
    dt_plugin_t *p = load_fake(cfg);
    const dt_host_v1_t *h = p->host;
    const char *s = NULL;
    int64_t i = 0;
    double f = 0;
    int b = 0;
    dt_err_set(DT_ERR_IO, "earlier");
    assert_int_equal(h->cfg_string(h, "greeting", &s), DT_OK);
    assert_string_equal(s, "hi there");
    assert_int_equal(h->cfg_int(h, "count", &i), DT_OK);
    assert_int_equal(i, 7); /* fake.count, not other.count */
    assert_int_equal(h->cfg_float(h, "ratio", &f), DT_OK);
    assert_true(f == 1.0); /* an integer literal for a FLOAT key */
    assert_int_equal(h->cfg_bool(h, "verbose", &b), DT_OK);
    assert_int_equal(b, 1);
    assert_int_equal(h->cfg_string(h, "init_fail", &s), DT_OK);
    assert_string_equal(s, "none"); /* default filled by the schema */
    assert_msg("earlier"); /* successful reads leave the buffer alone */

    assert_int_equal(h->cfg_int(h, "nokey", &i), DT_ERR_NOT_FOUND);
    assert_msg_starts("comm/fake: reading config 'fake.nokey': ");
    assert_int_equal(h->cfg_int(h, "greeting", &i), DT_ERR_INVALID);
    assert_msg_starts("comm/fake: reading config 'fake.greeting': ");
    assert_int_equal(h->cfg_bool(h, "count", &b), DT_ERR_INVALID);
    assert_int_equal(h->cfg_string(h, "", &s), DT_ERR_INVALID);
    assert_msg("comm/fake: config read with an empty key");
    dt_plugin_unload(p);
    dt_config_free(cfg);
}

static void test_cfg_validated_against_declared_keys(void **state)
{
    dt_plugin_t *p = *state;
    /* the plugin's key list catches typos and ranges before init */
    dt_config_t *cfg = config_for(p, "[fake]\ncounnt = 2\n", DT_ERR_CONFIG);
    if (!strstr(dt_last_error(), "counnt") ||
        !strstr(dt_last_error(), "count"))
        fail_msg("unexpected message: %s", dt_last_error());
    dt_config_free(cfg);
    cfg = config_for(p, "[fake]\ncount = 11\n", DT_ERR_CONFIG);
    if (!strstr(dt_last_error(), "count"))
        fail_msg("unexpected message: %s", dt_last_error());
    dt_config_free(cfg);
    cfg = config_for(p, "[fake]\ninit_fail = \"loud\"\n", DT_ERR_CONFIG);
    if (!strstr(dt_last_error(), "init_fail"))
        fail_msg("unexpected message: %s", dt_last_error());
    dt_config_free(cfg);
}

static void test_cfg_defaults_without_config(void **state)
{
    /* loaded with cfg == NULL: reads give the declared defaults */
    const dt_host_v1_t *h = ((dt_plugin_t *)*state)->host;
    int64_t i = 0;
    const char *s = NULL;
    double f = 0;
    int b = -1;
    assert_int_equal(h->cfg_int(h, "count", &i), DT_OK);
    assert_int_equal(i, 3);
    assert_int_equal(h->cfg_string(h, "greeting", &s), DT_OK);
    assert_string_equal(s, "hello");
    assert_int_equal(h->cfg_float(h, "ratio", &f), DT_OK);
    assert_true(f == 0.5);
    assert_int_equal(h->cfg_bool(h, "verbose", &b), DT_OK);
    assert_int_equal(b, 0);

    /* the same plugin bound to a resolved config reads that instead */
    dt_plugin_t *p = *state;
    dt_config_t *cfg = config_for(p, "[fake]\ncount = 9\n", DT_OK);
    dt_plugin_t *q = load_fake(cfg);
    assert_int_equal(q->host->cfg_int(q->host, "count", &i), DT_OK);
    assert_int_equal(i, 9);
    assert_int_equal(h->cfg_int(h, "count", &i), DT_OK);
    assert_int_equal(i, 3);
    dt_plugin_unload(q);
    dt_config_free(cfg);
}

/* ---------------------------------------------------------------- log -- */

/* Run `fn` with stderr captured into `out`. */
static void capture_stderr(void (*fn)(void *), void *arg, char *out,
                           size_t cap)
{
    fflush(stderr);
    FILE *f = tmpfile();
    assert_non_null(f);
    int saved = dup(2);
    dup2(fileno(f), 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

static void log_some(void *arg)
{
    const dt_host_v1_t *h = arg;
    h->log(h, DT_LOG_ERROR, "e%d", 1);
    h->log(h, DT_LOG_WARN, "w%d", 2);
    h->log(h, DT_LOG_INFO, "i%d\n", 3); /* trailing newline not doubled */
    h->log(h, DT_LOG_DEBUG, "d%d", 4);
}

static void test_log_format_and_levels(void **state)
{
    const dt_host_v1_t *h = ((dt_plugin_t *)*state)->host;
    char out[4096];

    dt_log_set_rank(3);
    dt_log_set_level(DT_LOG_INFO);
    capture_stderr(log_some, (void *)(uintptr_t)h, out, sizeof out);
    assert_string_equal(out, "[rank 3] comm/fake: e1\n"
                             "[rank 3] comm/fake: w2\n"
                             "[rank 3] comm/fake: i3\n");

    dt_log_set_level(DT_LOG_DEBUG);
    capture_stderr(log_some, (void *)(uintptr_t)h, out, sizeof out);
    assert_non_null(strstr(out, "[rank 3] comm/fake: d4\n"));

    /* DTRAIN_LOG decides when nothing overrides it */
    setenv("DTRAIN_LOG", "error", 1);
    dt_log_set_level(-1);
    assert_int_equal(dt_log_level(), DT_LOG_ERROR);
    dt_log_set_rank(-1);
    capture_stderr(log_some, (void *)(uintptr_t)h, out, sizeof out);
    assert_string_equal(out, "[rank ?] comm/fake: e1\n");

    setenv("DTRAIN_LOG", "DEBUG", 1);
    dt_log_set_level(-1);
    assert_int_equal(dt_log_level(), DT_LOG_DEBUG);

    unsetenv("DTRAIN_LOG");
    dt_log_set_level(-1);
    assert_int_equal(dt_log_level(), DT_LOG_INFO);

    setenv("DTRAIN_LOG", "loud", 1);
    dt_log_set_level(-1);
    capture_stderr(log_some, (void *)(uintptr_t)h, out, sizeof out);
    assert_string_equal(out,
                        "[rank ?] dtrain: DTRAIN_LOG='loud' is not one of "
                        "error|warn|info|debug; using info\n"
                        "[rank ?] comm/fake: e1\n"
                        "[rank ?] comm/fake: w2\n"
                        "[rank ?] comm/fake: i3\n");
    unsetenv("DTRAIN_LOG");
    assert_int_equal(dt_log_level_from_name("warn"), DT_LOG_WARN);
    assert_int_equal(dt_log_level_from_name("warning"), -1);
    dt_log_set_level(DT_LOG_WARN);
}

static void test_now_ns_monotonic(void **state)
{
    const dt_host_v1_t *h = ((dt_plugin_t *)*state)->host;
    uint64_t t0 = h->now_ns(h);
    struct timespec ts = {0, 2000000}; /* 2 ms */
    nanosleep(&ts, NULL);
    uint64_t t1 = h->now_ns(h);
    assert_true(t1 >= t0 + 2000000u);
    assert_true(t1 - t0 < UINT64_C(2000000000)); /* well under 2 s */
    struct timespec mono;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    uint64_t ref = (uint64_t)mono.tv_sec * 1000000000u + (uint64_t)mono.tv_nsec;
    assert_true(ref >= t1 && ref - t1 < UINT64_C(1000000000));
}

static void unload_it(void *p) { dt_plugin_unload(p); }

static void test_unload_warns_about_leaks(void **state)
{
    dt_plugin_t *q = load_fake(NULL);
    void *x = q->host->alloc(q->host, 100, DT_TAG_PARAMS);
    void *y = q->host->alloc(q->host, 28, DT_TAG_COMM);
    assert_non_null(x);
    assert_non_null(y);
    char out[2048];
    capture_stderr(unload_it, q, out, sizeof out);
    assert_string_equal(out, "[rank ?] comm/fake: unloaded while holding 128 "
                             "bytes of host memory (params 100, comm 28)\n");
    /* The "plugin" leaked them on purpose; unload does not free blocks it
     * cannot prove unused.  Give them back (host blocks carry a 64-byte
     * header in front of the pointer) so the leak checker stays quiet. */
    free((char *)x - 64);
    free((char *)y - 64);
}

/* mem_account (a shared mapping) counts in the plugin's stats beside its
 * allocs, and alone in the accounted stats: what a run counts as device
 * memory of a communicator on a host-visible device (its symmetric
 * memory, under the strategy's tag), never its own working buffers. */
static void test_accounted_apart(void **state)
{
    dt_plugin_t *p = *state;
    assert_true(DT_HOST_HAS(p->host, mem_account));
    void *x = p->host->alloc(p->host, 1000, DT_TAG_COMM);
    assert_non_null(x);
    p->host->mem_account(p->host, DT_TAG_GRADS, 4096);
    p->host->mem_account(p->host, DT_TAG_COMM, 300);
    check_stats(p, DT_TAG_COMM, 1300, 1300, 5396, 5396);
    dt_mem_stats_t st = {.struct_size = sizeof(dt_mem_stats_t)};
    assert_int_equal(dt_plugin_host_accounted_stats(p, &st), DT_OK);
    assert_int_equal(st.n_tags, DT_TAG_COUNT);
    assert_int_equal(st.current[DT_TAG_GRADS], 4096);
    assert_int_equal(st.current[DT_TAG_COMM], 300);
    assert_int_equal(st.peak[DT_TAG_COMM], 300);
    assert_int_equal(st.total_peak, 4396);
    p->host->mem_account(p->host, DT_TAG_GRADS, -4096);
    p->host->mem_account(p->host, DT_TAG_COMM, -300);
    p->host->free(p->host, x);
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    assert_int_equal(dt_plugin_host_accounted_stats(p, &st), DT_OK);
    assert_int_equal(st.total_current, 0);
    assert_int_equal(st.total_peak, 4396);
    check_stats(p, DT_TAG_COMM, 0, 1300, 0, 5396);
}

/* cleanup_add: what a plugin registers is removed when the
 * process is stopped by SIGTERM or SIGINT, files first, then the empty
 * folders deepest first whatever the order they were registered in; a
 * forgotten path stays (and the folder holding it); the process still
 * dies of the signal.  Bad flags and paths are refused, and a full list
 * says so. */
static void signal_child(const dt_host_v1_t *h, const char *top, int sig, int forget)
{
    char d[600], e[700], f[800], g[800];
    snprintf(d, sizeof d, "%s/d", top);
    snprintf(e, sizeof e, "%s/e", d);
    snprintf(f, sizeof f, "%s/f.bin", e);
    snprintf(g, sizeof g, "%s/g.bin", d);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *x;
        if (mkdir(d, 0700) || mkdir(e, 0700) || !(x = fopen(f, "w")) || fclose(x) ||
            !(x = fopen(g, "w")) || fclose(x))
            _exit(3);
        /* the outer folder first: removed last all the same */
        if (h->cleanup_add(h, d, DT_HOST_CLEANUP_EMPTY_DIR) ||
            h->cleanup_add(h, e, DT_HOST_CLEANUP_EMPTY_DIR) ||
            h->cleanup_add(h, f, DT_HOST_CLEANUP_FILE) || h->cleanup_add(h, g, DT_HOST_CLEANUP_FILE))
            _exit(4);
        if (forget)
            h->cleanup_remove(h, g);
        raise(sig);
        _exit(5); /* not reached: the handler dies of the signal */
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), sig);
    assert_int_equal(access(f, F_OK), -1);
    assert_int_equal(access(e, F_OK), -1);
    assert_int_equal(access(g, F_OK), forget ? 0 : -1);
    assert_int_equal(access(d, F_OK), forget ? 0 : -1);
}

static void test_cleanup_on_signal(void **state)
{
    const dt_host_v1_t *h = ((dt_plugin_t *)*state)->host;
    assert_true(DT_HOST_HAS(h, cleanup_add));
    assert_true(DT_HOST_HAS(h, cleanup_remove));
    char top[] = DT_TEST_BINARY_DIR "/host-cleanup-XXXXXX";
    assert_non_null(mkdtemp(top));
    signal_child(h, top, SIGTERM, 0);
    signal_child(h, top, SIGINT, 1);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    assert_int_equal(system(cmd), 0);

    assert_int_equal(h->cleanup_add(h, top, 2), DT_ERR_INVALID);
    assert_int_equal(h->cleanup_add(h, "", DT_HOST_CLEANUP_FILE), DT_ERR_INVALID);
    assert_int_equal(h->cleanup_add(h, NULL, DT_HOST_CLEANUP_FILE), DT_ERR_INVALID);
    /* the list is full at 64 paths; forgetting one makes room */
    static char names[65][600];
    int n = 0;
    for (; n < 65; n++) {
        snprintf(names[n], sizeof names[n], "%s/never-made-%d", top, n);
        if (h->cleanup_add(h, names[n], DT_HOST_CLEANUP_FILE) != DT_OK)
            break;
    }
    assert_int_equal(n, 64);
    assert_int_equal(h->cleanup_add(h, names[64], DT_HOST_CLEANUP_FILE), DT_ERR_NOMEM);
    h->cleanup_remove(h, names[3]);
    assert_int_equal(h->cleanup_add(h, names[64], DT_HOST_CLEANUP_FILE), DT_OK);
    h->cleanup_remove(h, names[64]);
    for (int i = 0; i < 64; i++)
        h->cleanup_remove(h, names[i]);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_table_fields),
        T(test_bootstrap_outside_a_run),
        T(test_set_error_prefixes),
        T(test_alloc_accounting),
        T(test_alloc_failures),
        T(test_alloc_threads),
        T(test_alloc_is_per_plugin),
        T(test_accounted_apart),
        T(test_cfg_reads_plugin_table),
        T(test_cfg_validated_against_declared_keys),
        T(test_cfg_defaults_without_config),
        T(test_log_format_and_levels),
        T(test_now_ns_monotonic),
        T(test_unload_warns_about_leaks),
        T(test_cleanup_on_signal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
