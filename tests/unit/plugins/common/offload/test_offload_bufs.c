/*
 * tests/unit/plugins/common/offload/test_offload_bufs.c - the SDK's live-buffer list of an
 * offload tier (plugins/common/offload/offload_bufs.h), on a queue over a fake device
 * whose worker is never given work: alloc's checks (tag, rounding,
 * overflow, capacity) and their messages, numbering and byte counts, a
 * foreign or freed pointer refused by name, a free that waits for the
 * buffer's transfers (and one that times out, keeping the buffer), and
 * finalize's drain and release.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "common/offload/offload_bufs.h"
#include "test_assert.h"
#include "test_host.h"

#define MAGIC 0x54455354u /* "TEST" */

static int fk_stream_create(dt_device_t *d, dt_stream_t **s)
{ (void)d; *s = (dt_stream_t *)d; return DT_OK; }
static int fk_stream_destroy(dt_device_t *d, dt_stream_t *s) { (void)d; (void)s; return DT_OK; }
static const dt_device_ops_v1_t fake_dev = {
    .info = DT_PLUGIN_INFO_NOKEYS(DEVICE, dt_device_ops_v1_t, "fake", "0", "streams only"),
    .stream_create = fk_stream_create, .stream_destroy = fk_stream_destroy,
};

static int never_run(void *ctx, offload_queue_t *q, offload_req_t *r)
{
    (void)ctx; (void)q; (void)r;
    return DT_ERR_SYSTEM;
}

/* A tier's buffer: the common part first. */
typedef struct tbuf {
    offload_buf_t ob;
    int released;
} tbuf_t;

typedef struct fixture {
    const dt_device_ops_v1_t *ops; /* first: the fixture is the fake device */
    dt_test_host_t th;
    offload_queue_t q;
    offload_bufs_t l;
    int n_released;
    tbuf_t *last_released;
} fixture_t;

static void rel(void *ctx, offload_buf_t *ob)
{
    fixture_t *f = ctx;
    tbuf_t *b = (tbuf_t *)ob;
    b->released++;
    f->n_released++;
    f->last_released = b;
}

static void open_list(fixture_t *f, uint64_t capacity, int64_t timeout_ms)
{
    memset(f, 0, sizeof *f);
    f->ops = &fake_dev;
    dt_test_host_init(&f->th, "offload/test", NULL);
    assert_ok(offload_queue_start(&f->q, &f->th.host, 4, timeout_ms, (dt_device_t *)f,
                                  never_run, NULL));
    offload_bufs_init(&f->l, &f->q, MAGIC, "offload_test", "buffers", capacity, rel, f);
}

/* alloc's path as a tier takes it: check, prepare, link. */
static void add(fixture_t *f, tbuf_t *b, uint64_t bytes, uint64_t align, int tag)
{
    uint64_t held;
    assert_ok(offload_bufs_check(&f->l, bytes, align, tag, &held));
    memset(b, 0, sizeof *b);
    offload_bufs_prepare(&f->l, &b->ob, bytes, held, tag);
    offload_bufs_link(&f->l, &b->ob);
}

static void test_checks_and_counts(void **state)
{
    (void)state;
    fixture_t f;
    open_list(&f, 20000, 1000);
    tbuf_t a, b;
    add(&f, &a, 5000, 4096, DT_TAG_OPTIMIZER);
    assert_int_equal(a.ob.held, 8192);
    assert_int_equal(a.ob.bytes, 5000);
    assert_int_equal(a.ob.id, 1);
    assert_int_equal(a.ob.magic, MAGIC);
    add(&f, &b, 4096, 4096, DT_TAG_PARAMS);
    assert_int_equal(b.ob.held, 4096);
    assert_int_equal(b.ob.id, 2);
    uint64_t used, held = 0;
    uint32_t n;
    offload_bufs_usage(&f.l, &used, &n);
    assert_int_equal(used, 8192 + 4096);
    assert_int_equal(n, 2);
    /* 8192 more would make 20480 > 20000; exactly the rest fits */
    assert_status(offload_bufs_check(&f.l, 4097, 4096, DT_TAG_PARAMS, &held), DT_ERR_NOMEM);
    assert_msg("offload/test: rank 4: alloc: 8192 bytes for params would bring the tier to "
               "20480 bytes, over [offload_test] capacity = 20000 (in use: 12288 bytes in 2 "
               "buffers)");
    assert_ok(offload_bufs_check(&f.l, 7712, 1, DT_TAG_PARAMS, &held));
    assert_int_equal(held, 7712);
    assert_status(offload_bufs_check(&f.l, 8, 1, DT_TAG_COUNT, &held), DT_ERR_INVALID);
    assert_msg("offload/test: alloc: tag 8 is not a dt_mem_tag_t (0..7)");
    assert_status(offload_bufs_check(&f.l, 8, 1, -1, &held), DT_ERR_INVALID);
    assert_status(offload_bufs_check(&f.l, UINT64_MAX - 100, 4096, DT_TAG_PARAMS, &held),
                  DT_ERR_NOMEM);
    assert_msg("offload/test: rank 4: alloc: 18446744073709551515 bytes for params cannot be "
               "held (rounded up to a multiple of 4096 they overflow)");
    /* unbounded: anything that does not overflow */
    f.l.capacity = 0;
    assert_ok(offload_bufs_check(&f.l, UINT64_MAX - 4095, 4096, DT_TAG_PARAMS, &held));
    assert_int_equal(held, UINT64_MAX - 4095);
    assert_ok(offload_bufs_drain(&f.l));
    offload_bufs_release_all(&f.l);
    assert_int_equal(f.n_released, 2);
    offload_bufs_usage(&f.l, &used, &n);
    assert_int_equal(used, 0);
    assert_int_equal(n, 0);
    offload_queue_stop(&f.q);
}

static void test_live_and_free(void **state)
{
    (void)state;
    fixture_t f;
    open_list(&f, 0, 1000);
    tbuf_t a, b, c;
    add(&f, &a, 100, 1, DT_TAG_OPTIMIZER);
    add(&f, &b, 200, 1, DT_TAG_OPTIMIZER);
    add(&f, &c, 300, 1, DT_TAG_OPTIMIZER);
    assert_ok(offload_bufs_live(&f.l, &b, "store"));
    /* a pointer that is not one of the list's, and NULL */
    uint32_t other[16] = {0x4f434246u};
    char want[200];
    assert_status(offload_bufs_live(&f.l, other, "load"), DT_ERR_INVALID);
    snprintf(want, sizeof want, "offload/test: load: %p is not a buffer of this tier (or was "
             "freed)", (void *)other);
    assert_msg(want);
    assert_status(offload_bufs_live(&f.l, NULL, "host_ptr"), DT_ERR_INVALID);
    assert_msg_has("host_ptr: ");
    assert_ok(offload_bufs_free(&f.l, NULL, "nothing"));
    /* the middle one: released once, unmarked, the others still listed */
    assert_ok(offload_bufs_free(&f.l, &b.ob, "b"));
    assert_int_equal(b.released, 1);
    assert_int_equal(b.ob.magic, 0);
    uint64_t used;
    uint32_t n;
    offload_bufs_usage(&f.l, &used, &n);
    assert_int_equal(used, 400);
    assert_int_equal(n, 2);
    assert_status(offload_bufs_free(&f.l, &b.ob, "b"), DT_ERR_INVALID);
    snprintf(want, sizeof want, "offload/test: free: %p is not a buffer of this tier (or was "
             "freed)", (void *)&b);
    assert_msg(want);
    assert_int_equal(b.released, 1);
    assert_ok(offload_bufs_free(&f.l, &c.ob, "c")); /* the newest, the list's head */
    assert_ok(offload_bufs_free(&f.l, &a.ob, "a")); /* the last */
    assert_null(f.l.head);
    assert_int_equal(f.n_released, 3);
    offload_queue_stop(&f.q);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

typedef struct {
    offload_queue_t *q;
    uint32_t *pending;
} ender_t;

/* A transfer ending 100 ms from now, as the queue's worker ends one. */
static void *end_later(void *arg)
{
    ender_t *e = arg;
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&e->q->mu);
    (*e->pending)--;
    pthread_cond_broadcast(&e->q->done);
    pthread_mutex_unlock(&e->q->mu);
    return NULL;
}

static void set_pending(fixture_t *f, tbuf_t *b, uint32_t n)
{
    pthread_mutex_lock(&f->q.mu);
    b->ob.pending = n;
    pthread_mutex_unlock(&f->q.mu);
}

/* free and drain wait for a buffer's transfers: past the queue's bound
 * they give up (naming the buffer, keeping it); within it they go on. */
static void test_waits_for_transfers(void **state)
{
    (void)state;
    dt_test_deadline(60, "offload_bufs waits");
    fixture_t f;
    open_list(&f, 0, 150);
    tbuf_t a, b;
    add(&f, &a, 64, 1, DT_TAG_PARAMS);
    add(&f, &b, 64, 1, DT_TAG_PARAMS);
    set_pending(&f, &a, 1);
    double t0 = now_ms();
    assert_status(offload_bufs_free(&f.l, &a.ob, "buffer #1 (64 bytes of params)"), DT_ERR_TIMEOUT);
    assert_true(now_ms() - t0 >= 149.0);
    assert_msg("offload/test: rank 4: free: buffer #1 (64 bytes of params) still has transfers "
               "running after 150 ms; not freed");
    assert_int_equal(a.released, 0);
    assert_int_equal(a.ob.magic, MAGIC);
    assert_status(offload_bufs_drain(&f.l), DT_ERR_TIMEOUT);
    /* the transfer ends 100 ms later: free waits for it, then releases */
    pthread_t th;
    ender_t e = {&f.q, &a.ob.pending};
    assert_int_equal(pthread_create(&th, NULL, end_later, &e), 0);
    t0 = now_ms();
    assert_ok(offload_bufs_free(&f.l, &a.ob, "a"));
    assert_true(now_ms() - t0 >= 90.0);
    pthread_join(th, NULL);
    assert_int_equal(a.released, 1);
    /* and drain the same way */
    set_pending(&f, &b, 1);
    e.pending = &b.ob.pending;
    assert_int_equal(pthread_create(&th, NULL, end_later, &e), 0);
    assert_ok(offload_bufs_drain(&f.l));
    pthread_join(th, NULL);
    assert_int_equal(b.ob.pending, 0);
    offload_bufs_release_all(&f.l);
    assert_int_equal(b.released, 1);
    offload_queue_stop(&f.q);
    dt_test_deadline(0, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checks_and_counts),
        cmocka_unit_test(test_live_and_free),
        cmocka_unit_test(test_waits_for_transfers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
