/*
 * tests/unit/plugins/cpu/test_cpu_guard.c - `[cpu] guard_memory = true`: device memory
 * the host cannot touch outside the device's kernels and copies, as on a
 * GPU (plugins/cpu/cpu_guard.c).
 *  - the device says its memory is not host memory (props.host_visible 0);
 *  - a host read or write of device memory is a SIGSEGV (in a child);
 *  - copies and memsets move the bytes, and refuse buffers that are not
 *    where the copy's kind says, with the message;
 *  - a kernel runs on device memory and refuses a host pointer, naming the
 *    argument;
 *  - freed memory is reused, the budget and the tallies still hold, and
 *    copies from several threads at once never close memory under a
 *    running one.
 * The whole training paths (every data strategy at one rank, offload,
 * checkpoints, bf16) run under it in tests/integration/test_guard_memory.sh.
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
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "test_assert.h"
#include "test_host.h"
#include "test_plugin.h"
#include "util/error.h"

static const dt_device_ops_v1_t *g_ops;

static const dt_device_ops_v1_t *cpu_ops(void)
{
    /* Never dlclosed: OpenBLAS threads live as long as the process. */
    if (!g_ops && !(g_ops = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_cpu.so",
                                                 DT_ENTRY_STRING(device, 1), NULL)))
        fail_msg("%s", dt_last_error());
    return g_ops;
}

typedef struct {
    dt_test_host_t th;
    const dt_device_ops_v1_t *ops;
    const dt_kernels_v1_t *K;
    dt_device_t *dev;
} guard_t;

static void guard_open(guard_t *g, const char *limit)
{
    const dt_test_kv_t kv[] = {{"threads", "2"},
                               {"guard_memory", "true"},
                               {limit ? "memory_limit" : NULL, limit},
                               {NULL, NULL}};
    g->ops = cpu_ops();
    g->K = g->ops->kernels();
    dt_test_host_init(&g->th, "device/cpu", kv);
    const dt_device_init_v1_t args = {.struct_size = sizeof args, .local_size = 1,
                                      .device_index = -1};
    g->dev = NULL;
    int rc = g->ops->init(&g->th.host, &args, &g->dev);
    if (rc != DT_OK)
        fail_msg("init: %s: %s", dt_status_name(rc), dt_last_error());
}

static void guard_close(guard_t *g)
{
    g->ops->finalize(g->dev);
    g->dev = NULL;
}

static float *dev_floats(guard_t *g, const float *host, int64_t n)
{
    void *p = NULL;
    assert_ok(g->ops->alloc(g->dev, (uint64_t)n * sizeof(float), DT_TAG_PARAMS, &p));
    if (host)
        assert_ok(g->ops->memcpy_async(g->dev, p, host, (uint64_t)n * sizeof(float),
                                       DT_COPY_H2D, NULL));
    return p;
}

static void to_host(guard_t *g, float *host, const float *dev, int64_t n)
{
    assert_ok(g->ops->memcpy_async(g->dev, host, dev, (uint64_t)n * sizeof(float),
                                   DT_COPY_D2H, NULL));
    assert_ok(g->ops->stream_sync(g->dev, NULL));
}

/* The key is declared, off by default, and the device says its memory is
 * not the host's once it is on. */
static void test_key_and_props(void **state)
{
    (void)state;
    const dt_device_ops_v1_t *ops = cpu_ops();
    const dt_config_key_t *k = NULL;
    for (uint32_t i = 0; i < ops->info.n_config_keys; i++)
        if (strcmp(ops->info.config_keys[i].name, "guard_memory") == 0)
            k = &ops->info.config_keys[i];
    assert_non_null(k);
    assert_int_equal(k->type, DT_CFG_BOOL);
    assert_string_equal(k->def, "false");
    guard_t g;
    guard_open(&g, NULL);
    dt_device_props_v1_t p = {.struct_size = sizeof p};
    assert_ok(g.ops->props(g.dev, &p));
    assert_int_equal(p.host_visible, 0);
    guard_close(&g);
}

/* What a child does to device memory: 0 reads, 1 writes, 2 writes pinned
 * host memory (allowed), 3 reads freed-then-retaken memory. */
static void child_touch(int what)
{
    guard_t g;
    guard_open(&g, NULL);
    void *p = NULL;
    if (what == 2)
        g.ops->host_alloc(g.dev, 4096, DT_TAG_STAGING, &p);
    else
        g.ops->alloc(g.dev, 4096, DT_TAG_PARAMS, &p);
    if (what == 3) {
        g.ops->free(g.dev, p);
        g.ops->alloc(g.dev, 64, DT_TAG_GRADS, &p);
    }
    if (what == 0)
        _exit(((volatile unsigned char *)p)[0] == 0x5a ? 3 : 4);
    ((volatile unsigned char *)p)[100] = 1;
    _exit(0);
}

static int touch_in_child(int what)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        child_touch(what);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFSIGNALED(st) ? -WTERMSIG(st) : WEXITSTATUS(st);
}

/* The host cannot read or write device memory (SIGSEGV), even memory freed
 * and handed out again; pinned host memory stays the host's. */
static void test_host_access_faults(void **state)
{
    (void)state;
    assert_int_equal(touch_in_child(0), -SIGSEGV);
    assert_int_equal(touch_in_child(1), -SIGSEGV);
    assert_int_equal(touch_in_child(2), 0);
    assert_int_equal(touch_in_child(3), -SIGSEGV);
}

/* Copies and memsets move the bytes while memory is closed to the host. */
static void test_copies(void **state)
{
    (void)state;
    guard_t g;
    guard_open(&g, NULL);
    float in[1000], out[1000];
    for (int i = 0; i < 1000; i++)
        in[i] = (float)i * 0.5f;
    float *a = dev_floats(&g, in, 1000), *b = dev_floats(&g, NULL, 1000);
    assert_ok(g.ops->memcpy_async(g.dev, b, a, sizeof in, DT_COPY_D2D, NULL));
    assert_ok(g.ops->memset_async(g.dev, b + 10, 0, 5 * sizeof(float), NULL));
    to_host(&g, out, b, 1000);
    for (int i = 0; i < 1000; i++)
        assert_true(out[i] == (i >= 10 && i < 15 ? 0.0f : in[i]));
    /* pinned host memory is host memory on both sides of a copy */
    void *pin = NULL;
    assert_ok(g.ops->host_alloc(g.dev, sizeof in, DT_TAG_STAGING, &pin));
    assert_ok(g.ops->memcpy_async(g.dev, pin, a, sizeof in, DT_COPY_D2H, NULL));
    assert_memory_equal(pin, in, sizeof in);
    assert_ok(g.ops->host_free(g.dev, pin));
    assert_ok(g.ops->free(g.dev, a));
    assert_ok(g.ops->free(g.dev, b));
    guard_close(&g);
}

/* A copy whose buffers are not where its kind says is refused, as
 * cudaMemcpyAsync refuses it, naming the buffer; so is a memset of host
 * memory, and a copy running off the end of device memory into host
 * memory is named too. */
static void test_copy_kind_refused(void **state)
{
    (void)state;
    guard_t g;
    guard_open(&g, NULL);
    float host[16] = {0};
    float *dev = dev_floats(&g, NULL, 16);
    char want[320];
    assert_status(g.ops->memcpy_async(g.dev, host, dev, sizeof host, DT_COPY_H2D, NULL),
                  DT_ERR_INVALID);
    snprintf(want, sizeof want,
             "device/cpu: memcpy_async: dst = %p (64 bytes) is host memory, but the copy's kind H2D says "
             "device memory: a GPU refuses it ([cpu] guard_memory)", (void *)host);
    assert_msg(want);
    assert_status(g.ops->memcpy_async(g.dev, dev, host, sizeof host, DT_COPY_D2H, NULL),
                  DT_ERR_INVALID);
    snprintf(want, sizeof want,
             "device/cpu: memcpy_async: dst = %p (64 bytes) is this device's memory, but the copy's kind "
             "D2H says host memory: a GPU refuses it ([cpu] guard_memory)", (void *)dev);
    assert_msg(want);
    assert_status(g.ops->memcpy_async(g.dev, dev, host, sizeof host, DT_COPY_D2D, NULL),
                  DT_ERR_INVALID);
    snprintf(want, sizeof want,
             "device/cpu: memcpy_async: src = %p (64 bytes) is host memory, but the copy's kind D2D says "
             "device memory: a GPU refuses it ([cpu] guard_memory)", (void *)host);
    assert_msg(want);
    assert_status(g.ops->memcpy_async(g.dev, host, host + 8, 32, DT_COPY_H2H, NULL), DT_OK);
    assert_status(g.ops->memset_async(g.dev, host, 0, sizeof host, NULL), DT_ERR_INVALID);
    snprintf(want, sizeof want,
             "device/cpu: memset_async: dst = %p (64 bytes) is host memory, but a memset takes device "
             "memory: a GPU refuses it ([cpu] guard_memory)", (void *)host);
    assert_msg(want);
    guard_close(&g);
}

/* A kernel computes on device memory; handed host memory it refuses
 * before touching anything, naming the argument. */
static void test_kernels(void **state)
{
    (void)state;
    guard_t g;
    guard_open(&g, NULL);
    float x[256], y[256], out[256];
    for (int i = 0; i < 256; i++) {
        x[i] = (float)i;
        y[i] = 1.0f;
    }
    float *dx = dev_floats(&g, x, 256), *dy = dev_floats(&g, y, 256);
    assert_ok(g.K->axpy(g.dev, NULL, dy, dx, DT_F32, 2.0f, 256));
    to_host(&g, out, dy, 256);
    for (int i = 0; i < 256; i++)
        assert_true(out[i] == 1.0f + 2.0f * (float)i);
    double *dsum = NULL;
    assert_ok(g.ops->alloc(g.dev, sizeof *dsum, DT_TAG_OTHER, (void **)&dsum));
    assert_ok(g.K->sumsq(g.dev, NULL, dsum, dx, DT_F32, 4));
    double sum = 0;
    assert_ok(g.ops->memcpy_async(g.dev, &sum, dsum, sizeof sum, DT_COPY_D2H, NULL));
    assert_true(sum == 0.0 + 1.0 + 4.0 + 9.0);
    char want[256];
    assert_status(g.K->axpy(g.dev, NULL, dy, x, DT_F32, 1.0f, 256), DT_ERR_INVALID);
    snprintf(want, sizeof want,
             "device/cpu: axpy: x = %p is not this device's memory: a GPU's kernel faults on host "
             "memory ([cpu] guard_memory)", (void *)x);
    assert_msg(want);
    /* the host's double for sumsq's result, as a GPU kernel would fault on */
    assert_status(g.K->sumsq(g.dev, NULL, &sum, dx, DT_F32, 4), DT_ERR_INVALID);
    snprintf(want, sizeof want,
             "device/cpu: sumsq: out = %p is not this device's memory: a GPU's kernel faults on host "
             "memory ([cpu] guard_memory)", (void *)&sum);
    assert_msg(want);
    /* nothing was written to y by the refused call */
    to_host(&g, out, dy, 256);
    assert_true(out[255] == 1.0f + 2.0f * 255.0f);
    assert_ok(g.ops->free(g.dev, dsum));
    guard_close(&g);
}

/* Freed memory is handed out again (the arena does not grow without end),
 * the budget still refuses what does not fit, and the tallies hold. */
static void test_reuse_and_budget(void **state)
{
    (void)state;
    guard_t g;
    guard_open(&g, "1048576"); /* 1 MiB */
    void *p[8];
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 8; i++)
            assert_ok(g.ops->alloc(g.dev, 100000 + (uint64_t)i * 1000, DT_TAG_ACTIVATIONS,
                                   &p[i]));
        for (int i = 7; i >= 0; i -= 2)
            assert_ok(g.ops->free(g.dev, p[i]));
        for (int i = 6; i >= 0; i -= 2)
            assert_ok(g.ops->free(g.dev, p[i]));
    }
    dt_mem_stats_t st = {.struct_size = sizeof st};
    assert_ok(g.ops->mem_stats(g.dev, &st));
    assert_int_equal(st.total_current, 0);
    void *big = NULL;
    assert_status(g.ops->alloc(g.dev, 2 << 20, DT_TAG_PARAMS, &big), DT_ERR_NOMEM);
    assert_null(big);
    guard_close(&g);
}

typedef struct {
    guard_t *g;
    float *dev;
    int fails;
} copier_t;

static void *copier(void *arg)
{
    copier_t *c = arg;
    float buf[4096];
    for (int r = 0; r < 300; r++) {
        for (int i = 0; i < 4096; i++)
            buf[i] = (float)(r + i);
        if (c->g->ops->memcpy_async(c->g->dev, c->dev, buf, sizeof buf, DT_COPY_H2D, NULL) ||
            c->g->ops->memcpy_async(c->g->dev, buf, c->dev, sizeof buf, DT_COPY_D2H, NULL) ||
            buf[4095] != (float)(r + 4095))
            c->fails++;
    }
    return NULL;
}

/* Copies from several threads at once (an offload tier's copy thread
 * beside the loop's kernels): the memory stays open until the last one
 * leaves, so none faults. */
static void test_concurrent_copies(void **state)
{
    (void)state;
    guard_t g;
    guard_open(&g, NULL);
    copier_t c[4];
    pthread_t t[4];
    for (int i = 0; i < 4; i++) {
        c[i] = (copier_t){&g, dev_floats(&g, NULL, 4096), 0};
        assert_int_equal(pthread_create(&t[i], NULL, copier, &c[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(c[i].fails, 0);
        assert_ok(g.ops->free(g.dev, c[i].dev));
    }
    guard_close(&g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_and_props),
        cmocka_unit_test(test_host_access_faults),
        cmocka_unit_test(test_copies),
        cmocka_unit_test(test_copy_kind_refused),
        cmocka_unit_test(test_kernels),
        cmocka_unit_test(test_reuse_and_budget),
        cmocka_unit_test(test_concurrent_copies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
