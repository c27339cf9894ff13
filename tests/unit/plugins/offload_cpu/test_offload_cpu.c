/*
 * tests/unit/plugins/offload_cpu/test_offload_cpu.c - the offload_cpu tier through its ops
 * table: info and keys, alignment of what host_ptr hands out, pieces
 * stored and loaded at any offset (host and device memory), many requests
 * in flight waited on in any order, pinned memory counted under the
 * offload tag outside the device's budget, the capacity error, argument
 * errors, and - with a fake device whose copies block or fail - bounded
 * waits, a free that waits for its transfers, and a copy's failure
 * reported by wait.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "fake_device.h"
#include "test_assert.h"
#include "test_host.h"
#include "test_plugin.h"

static const dt_offload_ops_v1_t *oc_ops(void)
{
    static const dt_offload_ops_v1_t *ops;
    if (!ops && !(ops = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_offload_cpu.so",
                                             DT_ENTRY_STRING(offload, 1), NULL)))
        fail_msg("%s", dt_last_error());
    return ops;
}

static const dt_device_ops_v1_t *cpu_ops(void)
{
    static const dt_device_ops_v1_t *ops;
    if (!ops && !(ops = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_cpu.so",
                                             DT_ENTRY_STRING(device, 1), NULL)))
        fail_msg("%s", dt_last_error());
    return ops;
}

/* A tier over the cpu device (device memory_limit `limit`). */
typedef struct {
    dt_test_host_t dh, oh;
    const dt_device_ops_v1_t *dops;
    dt_device_t *dev;
    const dt_offload_ops_v1_t *ops;
    dt_offload_t *o;
} tier_t;

static void tier_open(tier_t *t, const dt_test_kv_t *kv, const char *limit)
{
    static dt_test_kv_t dkv[2];
    dkv[0] = (dt_test_kv_t){"memory_limit", limit ? limit : "0"};
    dkv[1] = (dt_test_kv_t){NULL, NULL};
    t->dops = cpu_ops();
    t->ops = oc_ops();
    dt_test_host_init(&t->dh, "device/cpu", dkv);
    dt_test_host_init(&t->oh, "offload/offload_cpu", kv);
    dt_device_init_v1_t da = {.struct_size = sizeof da, .local_size = 1, .device_index = -1};
    assert_ok(t->dops->init(&t->dh.host, &da, &t->dev));
    dt_offload_init_v1_t oa = {.struct_size = sizeof oa, .rank = 3, .job_id = "unit",
                               .timeout_ms = 10000, .dev = t->dev};
    assert_ok(t->ops->init(&t->oh.host, &oa, &t->o));
}

static void tier_close(tier_t *t)
{
    t->ops->finalize(t->o);
    t->dops->finalize(t->dev);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 8));
}

static void test_info(void **state)
{
    (void)state;
    const dt_offload_ops_v1_t *ops = oc_ops();
    assert_int_equal(ops->info.kind, DT_KIND_OFFLOAD);
    assert_string_equal(ops->info.name, "offload_cpu");
    assert_int_equal(ops->info.struct_size, sizeof(dt_offload_ops_v1_t));
    assert_true(DT_HAS_OP(dt_offload_ops_t, ops, host_ptr));
    assert_true(DT_HAS_OP(dt_offload_ops_t, ops, cleanup_job));
    assert_int_equal(ops->info.n_config_keys, 1);
    assert_string_equal(ops->info.config_keys[0].name, "capacity");
    assert_non_null(ops->info.config_keys[0].doc);
    dt_test_host_t th;
    dt_test_host_init(&th, "offload/offload_cpu", NULL);
    assert_ok(ops->cleanup_job(&th.host, "job-1"));
}

/* host_ptr is 64-byte aligned whatever the size, and the bytes are the
 * buffer's: written through the pointer, read back by load. */
static void test_alignment_and_host_ptr(void **state)
{
    (void)state;
    tier_t t;
    tier_open(&t, NULL, NULL);
    static const uint64_t sizes[] = {0, 1, 3, 63, 4097, 1 << 20};
    dt_offload_buf_t *b[6];
    for (int i = 0; i < 6; i++) {
        void *p = NULL;
        assert_ok(t.ops->alloc(t.o, sizes[i], DT_TAG_OPTIMIZER, &b[i]));
        assert_ok(t.ops->host_ptr(t.o, b[i], &p));
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        memset(p, 0x5a, sizes[i]);
    }
    uint8_t back[4097];
    dt_offload_req_t *r;
    assert_ok(t.ops->load(t.o, b[4], 0, back, sizeof back, DT_MEM_HOST, NULL, &r));
    assert_ok(t.ops->wait(t.o, r, -1));
    for (size_t i = 0; i < sizeof back; i++)
        assert_int_equal(back[i], 0x5a);
    for (int i = 0; i < 6; i++)
        assert_ok(t.ops->free(t.o, b[i]));
    assert_ok(t.ops->free(t.o, NULL));
    tier_close(&t);
}

/* Pieces of odd sizes at odd offsets, from host and from device memory,
 * read back in other pieces: every byte lands where it was sent. */
static void test_partial_pieces(void **state)
{
    (void)state;
    tier_t t;
    tier_open(&t, NULL, NULL);
    enum { N = 10007 };
    uint8_t *src = malloc(N), *back = malloc(N);
    uint8_t *dsrc = NULL, *dback = NULL;
    fill(src, N, 1);
    assert_ok(t.dops->alloc(t.dev, N, DT_TAG_PARAMS, (void **)&dsrc));
    assert_ok(t.dops->alloc(t.dev, N, DT_TAG_PARAMS, (void **)&dback));
    memcpy(dsrc, src, N); /* cpu device memory is host memory */
    dt_offload_buf_t *b;
    assert_ok(t.ops->alloc(t.o, N, DT_TAG_PARAMS, &b));
    /* odd pieces, alternately from host and device memory */
    uint64_t cuts[] = {0, 1, 17, 1000, 4096, 4099, 9999, N};
    dt_offload_req_t *r;
    for (int i = 0; i + 1 < (int)(sizeof cuts / sizeof cuts[0]); i++) {
        uint64_t off = cuts[i], n = cuts[i + 1] - cuts[i];
        int dev = i % 2;
        assert_ok(t.ops->store(t.o, b, off, (dev ? dsrc : src) + off, n,
                               dev ? DT_MEM_DEVICE : DT_MEM_HOST, NULL, &r));
        assert_ok(t.ops->wait(t.o, r, -1));
    }
    /* read back in other pieces, into device memory, then host memory */
    for (uint64_t off = 0; off < N; off += 3001) {
        uint64_t n = off + 3001 <= N ? 3001 : N - off;
        assert_ok(t.ops->load(t.o, b, off, dback + off, n, DT_MEM_DEVICE, NULL, &r));
        assert_ok(t.ops->wait(t.o, r, -1));
    }
    assert_memory_equal(dback, src, N);
    memset(back, 0, N);
    assert_ok(t.ops->load(t.o, b, 4095, back + 4095, 3, DT_MEM_HOST, NULL, &r));
    assert_ok(t.ops->wait(t.o, r, 0 + 1000));
    assert_memory_equal(back + 4095, src + 4095, 3);
    assert_int_equal(back[4094], 0);
    assert_int_equal(back[4098], 0);
    /* a zero-byte piece at the very end is fine; one byte past it is not */
    assert_ok(t.ops->store(t.o, b, N, src, 0, DT_MEM_HOST, NULL, &r));
    assert_ok(t.ops->wait(t.o, r, -1));
    assert_status(t.ops->store(t.o, b, N - 4, src, 5, DT_MEM_HOST, NULL, &r), DT_ERR_INVALID);
    assert_msg("offload/offload_cpu: store: bytes [10003, +5) are outside buffer #1 (10007 "
               "bytes of params)");
    assert_status(t.ops->load(t.o, b, 0, back, 4, 7, NULL, &r), DT_ERR_INVALID);
    assert_msg("offload/offload_cpu: load: space 7 is neither host (0) nor device (1) memory");
    assert_status(t.ops->load(t.o, b, 0, NULL, 4, DT_MEM_HOST, NULL, &r), DT_ERR_INVALID);
    assert_msg_has("load: destination pointer is NULL");
    assert_ok(t.ops->free(t.o, b));
    assert_ok(t.dops->free(t.dev, dsrc));
    assert_ok(t.dops->free(t.dev, dback));
    free(src);
    free(back);
    tier_close(&t);
}

/* 256 stores in flight over 4 buffers, waited on newest first, then 256
 * loads waited on oldest first: the bytes are all there. */
static void test_many_in_flight(void **state)
{
    (void)state;
    tier_t t;
    tier_open(&t, NULL, NULL);
    enum { NB = 4, NP = 64, P = 1000 };
    uint8_t *src = malloc(NB * NP * P), *back = calloc(NB * NP * P, 1);
    fill(src, NB * NP * P, 9);
    dt_offload_buf_t *b[NB];
    dt_offload_req_t *r[NB * NP];
    for (int i = 0; i < NB; i++)
        assert_ok(t.ops->alloc(t.o, NP * P, DT_TAG_OPTIMIZER, &b[i]));
    for (int i = 0; i < NB * NP; i++)
        assert_ok(t.ops->store(t.o, b[i % NB], (uint64_t)(i / NB) * P, src + (size_t)i * P, P,
                               DT_MEM_HOST, NULL, &r[i]));
    for (int i = NB * NP - 1; i >= 0; i--)
        assert_ok(t.ops->wait(t.o, r[i], -1));
    for (int i = 0; i < NB * NP; i++)
        assert_ok(t.ops->load(t.o, b[i % NB], (uint64_t)(i / NB) * P, back + (size_t)i * P, P,
                              DT_MEM_HOST, NULL, &r[i]));
    for (int i = 0; i < NB * NP; i++)
        assert_ok(t.ops->wait(t.o, r[i], -1));
    assert_memory_equal(back, src, NB * NP * P);
    uint64_t total = 1, used = 0;
    assert_ok(t.ops->capacity(t.o, &total, &used));
    assert_int_equal(total, 0);
    assert_int_equal(used, NB * NP * P);
    /* finalize frees what is still allocated */
    free(src);
    free(back);
    tier_close(&t);
}

/* Stores and loads of overlapping bytes queued together, waited on only
 * at the end: each load sees exactly the stores queued before it; a
 * pointer that is not one of the tier's buffers is refused by name. */
static void test_order_and_foreign(void **state)
{
    (void)state;
    tier_t t;
    tier_open(&t, NULL, NULL);
    enum { N = 3000 };
    uint8_t x[N], y[N], want[N], back1[N] = {0}, back2[N] = {0};
    fill(x, N, 1);
    fill(y, N, 2);
    dt_offload_buf_t *b;
    dt_offload_req_t *r[4];
    assert_ok(t.ops->alloc(t.o, N, DT_TAG_OPTIMIZER, &b));
    assert_ok(t.ops->store(t.o, b, 0, x, N, DT_MEM_HOST, NULL, &r[0]));
    assert_ok(t.ops->load(t.o, b, 0, back1, N, DT_MEM_HOST, NULL, &r[1]));
    assert_ok(t.ops->store(t.o, b, 1000, y + 1000, 700, DT_MEM_HOST, NULL, &r[2]));
    assert_ok(t.ops->load(t.o, b, 0, back2, N, DT_MEM_HOST, NULL, &r[3]));
    for (int i = 3; i >= 0; i--)
        assert_ok(t.ops->wait(t.o, r[i], -1));
    assert_memory_equal(back1, x, N);
    memcpy(want, x, N);
    memcpy(want + 1000, y + 1000, 700);
    assert_memory_equal(back2, want, N);
    uint32_t other[16] = {0};
    char msg[200];
    assert_status(t.ops->load(t.o, (dt_offload_buf_t *)other, 0, back1, 8, DT_MEM_HOST, NULL,
                              &r[0]), DT_ERR_INVALID);
    snprintf(msg, sizeof msg, "offload/offload_cpu: load: %p is not a buffer of this tier (or "
             "was freed)", (void *)other);
    assert_msg(msg);
    void *p;
    assert_status(t.ops->host_ptr(t.o, (dt_offload_buf_t *)other, &p), DT_ERR_INVALID);
    assert_msg_has("host_ptr: ");
    tier_close(&t);
}

/* The tier's bytes are pinned host memory tagged offload: the device's
 * budget (64 KiB here) does not count them. */
static void test_outside_device_budget(void **state)
{
    (void)state;
    tier_t t;
    tier_open(&t, NULL, "65536");
    dt_offload_buf_t *b;
    assert_ok(t.ops->alloc(t.o, 4 << 20, DT_TAG_OPTIMIZER, &b));
    dt_mem_stats_t st = {.struct_size = sizeof st};
    assert_ok(t.dops->mem_stats(t.dev, &st));
    assert_int_equal(st.pinned_current[DT_TAG_OFFLOAD], 4 << 20);
    assert_int_equal(st.total_current, 0);
    assert_ok(t.ops->free(t.o, b));
    assert_ok(t.dops->mem_stats(t.dev, &st));
    assert_int_equal(st.pinned_current[DT_TAG_OFFLOAD], 0);
    assert_int_equal(st.pinned_peak[DT_TAG_OFFLOAD], 4 << 20);
    tier_close(&t);
}

static void test_capacity(void **state)
{
    (void)state;
    static const dt_test_kv_t kv[] = {{"capacity", "1000"}, {NULL, NULL}};
    tier_t t;
    tier_open(&t, kv, NULL);
    dt_offload_buf_t *a, *b;
    assert_ok(t.ops->alloc(t.o, 600, DT_TAG_OPTIMIZER, &a));
    assert_status(t.ops->alloc(t.o, 401, DT_TAG_PARAMS, &b), DT_ERR_NOMEM);
    assert_null(b);
    assert_msg("offload/offload_cpu: rank 3: alloc: 401 bytes for params would bring the tier "
               "to 1001 bytes, over [offload_cpu] capacity = 1000 (in use: 600 bytes in 1 "
               "buffers)");
    uint64_t total, used;
    assert_ok(t.ops->capacity(t.o, &total, &used));
    assert_int_equal(total, 1000);
    assert_int_equal(used, 600);
    assert_ok(t.ops->alloc(t.o, 400, DT_TAG_PARAMS, &b));
    assert_ok(t.ops->free(t.o, a));
    assert_ok(t.ops->free(t.o, b));
    assert_ok(t.ops->capacity(t.o, &total, &used));
    assert_int_equal(used, 0);
    assert_status(t.ops->alloc(t.o, UINT64_MAX, DT_TAG_PARAMS, &b), DT_ERR_NOMEM);
    assert_status(t.ops->alloc(t.o, 8, 99, &b), DT_ERR_INVALID);
    assert_msg("offload/offload_cpu: alloc: tag 99 is not a dt_mem_tag_t (0..7)");
    tier_close(&t);
}

static void test_init_errors(void **state)
{
    (void)state;
    dt_test_host_t th;
    dt_test_host_init(&th, "offload/offload_cpu", NULL);
    dt_offload_t *o = (dt_offload_t *)1;
    dt_offload_init_v1_t oa = {.struct_size = sizeof oa, .job_id = "j"};
    assert_status(oc_ops()->init(&th.host, &oa, &o), DT_ERR_INVALID);
    assert_null(o);
    assert_msg("offload/offload_cpu: init: no device (dev NULL): the tier's "
               "pinned host memory comes from the device's host_alloc");
    oa.struct_size = 8;
    assert_status(oc_ops()->init(&th.host, &oa, &o), DT_ERR_ABI);
}

/* ---- the fake device (tests/support/fake_device.h): copies block until
 * released, or fail ---- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static dt_offload_t *fake_tier(dt_test_host_t *th, int64_t timeout_ms)
{
    dt_test_host_init(th, "offload/offload_cpu", NULL);
    dt_offload_init_v1_t oa = {.struct_size = sizeof oa, .rank = 1, .job_id = "j",
                               .timeout_ms = timeout_ms,
                               .dev = dt_fake_device_instance()};
    dt_offload_t *o = NULL;
    assert_ok(oc_ops()->init(&th->host, &oa, &o));
    return o;
}

/* A copy that does not end: wait returns DT_ERR_TIMEOUT after its bound
 * (not before, not much after), free refuses to free under it, and once
 * the copy ends the buffer is freed and its bytes were written. */
static void test_wait_timeout(void **state)
{
    (void)state;
    dt_test_deadline(60, "offload wait timeouts");
    const dt_offload_ops_v1_t *ops = oc_ops();
    dt_test_host_t th;
    dt_fake_device_reset(0);
    dt_offload_t *o = fake_tier(&th, 150);
    dt_offload_buf_t *b;
    assert_ok(ops->alloc(o, 64, DT_TAG_OPTIMIZER, &b));
    uint8_t src[64];
    fill(src, sizeof src, 3);
    dt_offload_req_t *r, *r2;
    assert_ok(ops->store(o, b, 0, src, 64, DT_MEM_DEVICE, NULL, &r));
    assert_ok(ops->store(o, b, 0, src, 32, DT_MEM_HOST, NULL, &r2)); /* queued behind */
    double t0 = now_ms();
    assert_status(ops->wait(o, r, 100), DT_ERR_TIMEOUT);
    double waited = now_ms() - t0;
    assert_true(waited >= 99.0);
    assert_true(waited < 5000.0);
    assert_msg("offload/offload_cpu: rank 1: wait: store of 64 bytes at offset 0 of buffer #1 "
               "(64 bytes of optimizer) not done after 100 ms");
    /* the default bound (init's 150 ms) applies to free */
    assert_status(ops->free(o, b), DT_ERR_TIMEOUT);
    assert_msg("offload/offload_cpu: rank 1: free: buffer #1 (64 bytes of optimizer) still has "
               "transfers running after 150 ms; not freed");
    dt_fake_device_release(1);
    assert_ok(ops->wait(o, r2, 5000));
    void *p;
    assert_ok(ops->host_ptr(o, b, &p));
    assert_memory_equal(p, src, 64);
    assert_ok(ops->free(o, b));
    ops->finalize(o);
    dt_test_deadline(0, NULL);
}

/* A failing device copy: wait returns its status, naming the transfer. */
static void test_copy_failure(void **state)
{
    (void)state;
    dt_test_deadline(60, "offload copy failure");
    const dt_offload_ops_v1_t *ops = oc_ops();
    dt_test_host_t th;
    dt_fake_device_reset(1);
    dt_fake_device_release(1);
    dt_offload_t *o = fake_tier(&th, 5000);
    dt_offload_buf_t *b;
    assert_ok(ops->alloc(o, 4096, DT_TAG_PARAMS, &b));
    uint8_t dst[100];
    dt_offload_req_t *r;
    assert_ok(ops->load(o, b, 96, dst, 100, DT_MEM_DEVICE, NULL, &r));
    assert_status(ops->wait(o, r, -1), DT_ERR_IO);
    assert_msg("offload/offload_cpu: rank 1: load of 100 bytes at offset 96 of buffer #1 (4096 "
               "bytes of params): the device's memcpy_async failed (DT_ERR_IO)");
    ops->finalize(o);
    dt_test_deadline(0, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_info),
        cmocka_unit_test(test_alignment_and_host_ptr),
        cmocka_unit_test(test_partial_pieces),
        cmocka_unit_test(test_many_in_flight),
        cmocka_unit_test(test_order_and_foreign),
        cmocka_unit_test(test_outside_device_budget),
        cmocka_unit_test(test_capacity),
        cmocka_unit_test(test_init_errors),
        cmocka_unit_test(test_wait_timeout),
        cmocka_unit_test(test_copy_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
