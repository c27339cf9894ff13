/*
 * tests/unit/plugins/cuda/test_cuda_device.c - the cuda device plugin's runtime table.
 *
 * Without an argument: what holds on any machine.  The plugin loads and
 * declares its keys; a bad key value is refused before CUDA is touched;
 * and, on a machine without a GPU, init fails with DT_ERR_SYSTEM and the
 * exact message "init: no CUDA device: cudaGetDeviceCount: <CUDA's error
 * string> (<its name>)", compared with what libcudart itself says.
 *
 * With the argument "gpu": the runtime on a GPU (tagged memory and its
 * peaks, the caching allocator's steady state through mem_stats, pinned
 * memory and asynchronous copies, streams and events, the one-GPU-per-
 * local-rank rule).  Exits with DT_TEST_SKIP_CODE, which ctest reports as
 * skipped, printing "no CUDA device: ..." when there is none.  The GPU
 * cases passed on an H200 (scripts/gpu-check.sh).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "cuda_probe.h"
#include "dtrain/dtrain.h"
#include "test_host.h"
#include "test_plugin.h"
#include "util/error.h"

#define PLUGIN DT_TEST_PLUGIN_DIR "/dtrain_cuda.so"

static const dt_device_ops_v1_t *ops(void)
{
    static const dt_device_ops_v1_t *o;
    if (!o && !(o = dt_test_plugin_entry(PLUGIN, DT_ENTRY_STRING(device, 1), NULL)))
        fail_msg("%s", dt_last_error());
    return o;
}

static int open_dev(dt_test_host_t *th, const dt_test_kv_t *kv, int local_rank,
                    int local_size, dt_device_t **dev)
{
    dt_test_host_init(th, "device/cuda", kv);
    const dt_device_init_v1_t a = {.struct_size = sizeof a, .local_rank = local_rank,
                                   .local_size = local_size, .device_index = -1};
    return ops()->init(&th->host, &a, dev);
}

#define OK(expr)                                                               \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != DT_OK)                                                      \
            fail_msg("%s: %s: %s", #expr, dt_status_name(rc_), dt_last_error()); \
    } while (0)

/* ------------------------------------------------------- any machine */

static void test_keys(void **state)
{
    (void)state;
    static const char *const want[] = {"device_index", "memory_limit", "caching",
                                       "tf32", "deterministic"};
    const dt_plugin_info_t *info = &ops()->info;
    assert_string_equal(info->name, "cuda");
    assert_int_equal(info->kind, DT_KIND_DEVICE);
    assert_int_equal(info->n_config_keys, 5);
    for (size_t i = 0; i < 5; i++) {
        assert_string_equal(info->config_keys[i].name, want[i]);
        assert_true(info->config_keys[i].doc && strlen(info->config_keys[i].doc) > 20);
    }
    assert_non_null(ops()->native_stream);
    const dt_kernels_v1_t *k = ops()->kernels();
    assert_int_equal(k->info.struct_size, sizeof(dt_kernels_v1_t));
    assert_non_null(k->attention_forward);
    assert_non_null(k->adamw_update);
    /* the saved attention state is the log-sum-exp, (B, NH, T) f32 */
    uint64_t bytes = 0;
    assert_int_equal(k->attention_state_bytes(2, 64, 48, 3, DT_BF16, &bytes), DT_OK);
    assert_int_equal(bytes, 2 * 3 * 64 * 4);
    assert_int_equal(k->attention_state_bytes(2, 64, 48, 5, DT_F32, &bytes),
                     DT_ERR_INVALID); /* 48 % 5 */
    assert_int_equal(k->attention_state_bytes(2, 64, 48, 3, DT_F16, &bytes),
                     DT_ERR_UNSUPPORTED);
}

static void test_bad_key_before_cuda(void **state)
{
    (void)state;
    /* memory_limit's declared range: the core refuses -5 before init */
    static const dt_test_kv_t kv[] = {{"memory_limit", "-5"}, {NULL, NULL}};
    assert_int_equal(dt_test_schema_check(&ops()->info, kv), DT_ERR_CONFIG);
    assert_non_null(
        strstr(dt_last_error(), "[cuda] memory_limit = -5 is out of range (allowed 0 .. "));
}

static void test_init_without_gpu(void **state)
{
    (void)state;
    char why[512];
    if (dt_test_cuda_devices(why, sizeof why) > 0)
        skip(); /* a GPU: the gpu cases cover init */
    dt_test_host_t th;
    dt_device_t *dev = NULL;
    assert_int_equal(open_dev(&th, NULL, 0, 1, &dev), DT_ERR_SYSTEM);
    assert_null(dev);
    char want[600];
    snprintf(want, sizeof want, "device/cuda: init: %s", why);
    assert_string_equal(dt_last_error(), want);
    assert_non_null(strstr(dt_last_error(), "no CUDA device: cudaGetDeviceCount: "));
}

/* ------------------------------------------------------------- a GPU */

static dt_test_host_t g_th;
static dt_device_t *g_dev;

static int gpu_setup(void **state)
{
    (void)state;
    static const dt_test_kv_t kv[] = {{"memory_limit", "268435456"}, {NULL, NULL}};
    if (open_dev(&g_th, kv, 0, 1, &g_dev) != DT_OK) {
        fprintf(stderr, "init: %s\n", dt_last_error());
        return -1;
    }
    return 0;
}

static int gpu_teardown(void **state)
{
    (void)state;
    ops()->finalize(g_dev);
    return 0;
}

static dt_mem_stats_t stats(void)
{
    dt_mem_stats_t st = {.struct_size = sizeof st};
    OK(ops()->mem_stats(g_dev, &st));
    return st;
}

static void test_gpu_props(void **state)
{
    (void)state;
    dt_device_props_t p = {.struct_size = sizeof p};
    OK(ops()->props(g_dev, &p));
    assert_non_null(strstr(p.name, "(cuda:0, sm_"));
    assert_int_equal(p.host_visible, 0);
    assert_true(p.total_memory > 0 && p.total_memory <= 268435456);
    assert_true(p.peak_flops_bf16 > p.peak_flops_f32 && p.peak_flops_f32 > 1e12);
}

/* Tags, peaks, the budget, and a steady state reached through the cache. */
static void test_gpu_memory(void **state)
{
    (void)state;
    dt_mem_stats_t st0 = stats();
    void *a = NULL, *b = NULL;
    OK(ops()->alloc(g_dev, 3 << 20, DT_TAG_PARAMS, &a));
    OK(ops()->alloc(g_dev, 1000, DT_TAG_GRADS, &b));
    dt_mem_stats_t st = stats();
    assert_int_equal(st.current[DT_TAG_PARAMS] - st0.current[DT_TAG_PARAMS], 3 << 20);
    assert_int_equal(st.current[DT_TAG_GRADS] - st0.current[DT_TAG_GRADS], 1000);
    assert_int_equal(st.limit, 268435456);
    OK(ops()->free(g_dev, b));
    for (int i = 0; i < 10; i++) { /* freed and re-allocated: same block */
        void *c = NULL;
        OK(ops()->alloc(g_dev, 1000, DT_TAG_GRADS, &c));
        assert_ptr_equal(c, b);
        OK(ops()->free(g_dev, c));
    }
    void *big = (void *)1;
    assert_int_equal(ops()->alloc(g_dev, (uint64_t)1 << 30, DT_TAG_ACTIVATIONS, &big),
                     DT_ERR_NOMEM);
    assert_null(big);
    assert_non_null(strstr(dt_last_error(), "device/cuda: alloc: out of memory budget: "
                                            "allocating 1.0 GiB (1073741824 bytes) for "
                                            "activations"));
    OK(ops()->free(g_dev, a));
    int x;
    assert_int_equal(ops()->free(g_dev, &x), DT_ERR_INVALID);
    st = stats();
    assert_int_equal(st.total_current, st0.total_current);
    assert_true(st.peak[DT_TAG_PARAMS] >= 3u << 20);
}

/* H2D and D2H through pinned memory on a stream of our own, ordered by an
 * event against the default stream. */
static void test_gpu_copies_streams_events(void **state)
{
    (void)state;
    const uint64_t n = 1 << 20;
    uint8_t *h = NULL, *back = NULL;
    void *dv = NULL, *dv2 = NULL;
    OK(ops()->host_alloc(g_dev, n, DT_TAG_STAGING, (void **)&h));
    OK(ops()->host_alloc(g_dev, n, DT_TAG_STAGING, (void **)&back));
    assert_int_equal(stats().pinned_current[DT_TAG_STAGING], 2 * n);
    for (uint64_t i = 0; i < n; i++)
        h[i] = (uint8_t)(i * 131 + 7);
    OK(ops()->alloc(g_dev, n, DT_TAG_STAGING, &dv));
    OK(ops()->alloc(g_dev, n, DT_TAG_STAGING, &dv2));
    dt_stream_t *s = NULL;
    dt_event_t *e = NULL;
    OK(ops()->stream_create(g_dev, &s));
    OK(ops()->event_create(g_dev, &e));
    OK(ops()->memcpy_async(g_dev, dv, h, n, DT_COPY_H2D, s));
    OK(ops()->event_record(g_dev, e, s));
    OK(ops()->stream_wait_event(g_dev, NULL, e));
    OK(ops()->memcpy_async(g_dev, dv2, dv, n, DT_COPY_D2D, NULL));
    OK(ops()->memcpy_async(g_dev, back, dv2, n, DT_COPY_D2H, NULL));
    OK(ops()->stream_sync(g_dev, NULL));
    assert_memory_equal(back, h, n);
    OK(ops()->memset_async(g_dev, dv2, 0xAB, n, s));
    OK(ops()->memcpy_async(g_dev, back, dv2, n, DT_COPY_D2H, s));
    OK(ops()->event_record(g_dev, e, s));
    OK(ops()->event_sync(g_dev, e));
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(back[i], 0xAB);
    void *cs = NULL;
    OK(ops()->native_stream(g_dev, s, &cs));
    assert_non_null(cs);
    assert_int_equal(ops()->host_free(g_dev, dv), DT_ERR_INVALID); /* device memory */
    OK(ops()->event_destroy(g_dev, e));
    OK(ops()->stream_destroy(g_dev, s));
    OK(ops()->free(g_dev, dv));
    OK(ops()->free(g_dev, dv2));
    OK(ops()->host_free(g_dev, h));
    OK(ops()->host_free(g_dev, back));
    OK(ops()->synchronize(g_dev));
}

/* One GPU per local rank: more local ranks than GPUs is refused (the
 * rule itself: test_cuda_placement, on any machine). */
static void test_gpu_local_ranks(void **state)
{
    (void)state;
    int n = dt_test_cuda_devices(NULL, 0);
    dt_test_host_t th;
    dt_device_t *dev = NULL;
    assert_int_equal(open_dev(&th, NULL, 0, n + 1, &dev), DT_ERR_CONFIG);
    char want[400];
    snprintf(want, sizeof want,
             "device/cuda: init: %d local ranks on this machine but %d CUDA device%s: "
             "the cuda device runs one GPU per local rank (start at most %d rank%s per "
             "machine, or set device_index to place ranks yourself)",
             n + 1, n, n == 1 ? "" : "s", n, n == 1 ? "" : "s");
    assert_string_equal(dt_last_error(), want);
    char idx[16];
    snprintf(idx, sizeof idx, "%d", n);
    const dt_test_kv_t kv[] = {{"device_index", idx}, {NULL, NULL}};
    assert_int_equal(open_dev(&th, kv, 0, 1, &dev), DT_ERR_CONFIG);
    assert_null(dev);
    if (n > 1) { /* local rank 1 runs on device 1 */
        OK(open_dev(&th, NULL, 1, 2, &dev));
        dt_device_props_t p = {.struct_size = sizeof p};
        OK(ops()->props(dev, &p));
        assert_non_null(strstr(p.name, "(cuda:1, "));
        ops()->finalize(dev);
    }
}

int main(int argc, char **argv)
{
    struct stat sb;
    if (stat(PLUGIN, &sb) != 0) {
        printf("SKIPPED: this build has no cuda plugin (%s)\n", PLUGIN);
        return DT_TEST_SKIP_CODE;
    }
    if (argc > 1 && strcmp(argv[1], "gpu") == 0) {
        char why[512];
        if (dt_test_cuda_devices(why, sizeof why) == 0) {
            printf("SKIPPED: %s\n", why);
            return DT_TEST_SKIP_CODE;
        }
        const struct CMUnitTest gpu[] = {
            cmocka_unit_test(test_gpu_props),
            cmocka_unit_test(test_gpu_memory),
            cmocka_unit_test(test_gpu_copies_streams_events),
            cmocka_unit_test(test_gpu_local_ranks),
        };
        return cmocka_run_group_tests(gpu, gpu_setup, gpu_teardown);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_bad_key_before_cuda),
        cmocka_unit_test(test_init_without_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
