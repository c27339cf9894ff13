/*
 * tests/unit/plugins/cuda/test_cuda_alloc.c - the cuda device's caching allocator
 * (plugins/cuda/cuda_alloc.c) on the CPU, through a fake malloc backend
 * with a capacity, so its bookkeeping is checked on every machine: size
 * classes, reuse by class, no backend call in a steady-state step, tags and
 * peaks, the budget and its message, release of the cache when the backend
 * runs out, refusal of foreign pointers, and leaks reported at destroy.
 *
 * Fences (stream-ordered reuse): the fake backend's fences complete when
 * the test says so (or, with complete_on_wait, when the allocator waits
 * for them, like a device finishing its work meanwhile); a fence that
 * never completes makes each bounded wait sleep out its bound, which the
 * tests set to 50 ms.  Checked: a block whose fence is pending is not
 * reused and a completed one is; out of memory (and over the budget) the
 * allocator waits for pending fences, reuses or gives back, and retries;
 * a wait that runs out fails within its bound with the exact message;
 * release_cached and destroy wait and keep what is still pending; a free
 * the cache cannot keep waits for its fence; a failed fence is reported.
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

#include "cuda/cuda_alloc.h"
#include "dtrain/status.h"

#define MiB ((uint64_t)1 << 20)

/* A fence of the fake backend: the test completes it (done = 1), makes it
 * fail, or lets complete_on_wait complete it when it is waited for. */
typedef struct fake_fence {
    int used, done, fail;
} fake_fence_t;

/* A "device" of `capacity` bytes made of malloc'd blocks. */
typedef struct fake {
    uint64_t capacity; /* 0: unlimited */
    uint64_t used;
    int outstanding; /* blocks not yet freed */
    int allocs, frees;
    struct { void *p; uint64_t n; } blk[256];
    fake_fence_t fence[256];
    int fences_live;      /* made and not yet given up */
    int fence_fail_new;   /* fence_new fails */
    int idle;             /* nothing queued: fence_new gives no fence */
    int complete_on_wait; /* a waited-for fence completes */
    int waits;            /* fence_wait calls */
    uint64_t waited_ms;   /* slept in them */
} fake_t;

static int fake_alloc(void *ctx, uint64_t bytes, void **out, char *err,
                      size_t errlen)
{
    fake_t *f = ctx;
    if (f->capacity && f->used + bytes > f->capacity) {
        snprintf(err, errlen, "fake: out of memory");
        return 1;
    }
    for (int i = 0; i < 256; i++)
        if (!f->blk[i].p) {
            f->blk[i].p = malloc((size_t)bytes);
            f->blk[i].n = bytes;
            assert_non_null(f->blk[i].p);
            f->used += bytes;
            f->outstanding++;
            f->allocs++;
            *out = f->blk[i].p;
            return 0;
        }
    fail_msg("fake backend: more than 256 blocks");
    return 1;
}

static void fake_free(void *ctx, void *p)
{
    fake_t *f = ctx;
    for (int i = 0; i < 256; i++)
        if (f->blk[i].p == p) {
            free(p);
            f->used -= f->blk[i].n;
            f->blk[i].p = NULL;
            f->outstanding--;
            f->frees++;
            return;
        }
    fail_msg("fake backend: free of %p it never gave out", p);
}

static int fake_fence_new(void *ctx, void **out, char *err, size_t errlen)
{
    fake_t *f = ctx;
    *out = NULL;
    if (f->fence_fail_new) {
        snprintf(err, errlen, "fake: no fence");
        return 1;
    }
    if (f->idle)
        return 0; /* no work queued: nothing to wait for */
    for (int i = 0; i < 256; i++)
        if (!f->fence[i].used) {
            f->fence[i] = (fake_fence_t){.used = 1};
            f->fences_live++;
            *out = &f->fence[i];
            return 0;
        }
    fail_msg("fake backend: more than 256 fences");
    return 1;
}

static int fake_fence_done(void *ctx, void *fence, char *err, size_t errlen)
{
    (void)ctx;
    fake_fence_t *ff = fence;
    assert_true(ff->used);
    if (ff->fail) {
        snprintf(err, errlen, "fake: fence failed");
        return -1;
    }
    return ff->done;
}

static int fake_fence_wait(void *ctx, void *fence, uint64_t timeout_ms,
                           char *err, size_t errlen)
{
    fake_t *f = ctx;
    fake_fence_t *ff = fence;
    f->waits++;
    int r = fake_fence_done(ctx, fence, err, errlen);
    if (r != 0)
        return r;
    if (f->complete_on_wait) {
        ff->done = 1;
        return 1;
    }
    struct timespec ts = {(time_t)(timeout_ms / 1000),
                          (long)(timeout_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    f->waited_ms += timeout_ms;
    return 0;
}

static void fake_fence_free(void *ctx, void *fence)
{
    fake_t *f = ctx;
    fake_fence_t *ff = fence;
    assert_true(ff->used);
    ff->used = 0;
    f->fences_live--;
}

/* Complete every fence made so far. */
static void complete_fences(fake_t *f)
{
    for (int i = 0; i < 256; i++)
        if (f->fence[i].used)
            f->fence[i].done = 1;
}

static void open_alloc(cuda_alloc_t *a, fake_t *f, uint64_t limit, int caching)
{
    memset(f, 0, sizeof *f);
    cuda_alloc_backend_t be = {.ctx = f, .raw_alloc = fake_alloc,
                               .raw_free = fake_free};
    cuda_alloc_init(a, &be, limit, caching);
}

/* With fences, each wait bounded by 50 ms. */
static void open_fenced(cuda_alloc_t *a, fake_t *f, uint64_t limit, int caching)
{
    memset(f, 0, sizeof *f);
    cuda_alloc_backend_t be = {.ctx = f, .raw_alloc = fake_alloc,
                               .raw_free = fake_free,
                               .fence_new = fake_fence_new,
                               .fence_done = fake_fence_done,
                               .fence_wait = fake_fence_wait,
                               .fence_free = fake_fence_free};
    cuda_alloc_init(a, &be, limit, caching);
    assert_int_equal(a->wait_ms, CUDA_WAIT_LIMIT_MS);
    a->wait_ms = 50;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A bounded wait that ran out took its bound (50 ms), not much more. */
static void assert_bounded(double t0)
{
    double dt = now_s() - t0;
    if (dt < 0.045 || dt > 2.0)
        fail_msg("the wait took %.3f s; its bound is 0.050 s", dt);
}

static int put(cuda_alloc_t *a, void *p)
{
    char err[512] = "";
    int rc = cuda_alloc_put(a, p, err, sizeof err);
    if (rc != DT_OK && rc != DT_ERR_NOT_FOUND)
        fail_msg("cuda_alloc_put: %s: %s", dt_status_name(rc), err);
    return rc;
}

static void destroy(cuda_alloc_t *a, uint64_t *n, uint64_t *bytes)
{
    char err[512] = "";
    int rc = cuda_alloc_destroy(a, n, bytes, err, sizeof err);
    if (rc != DT_OK)
        fail_msg("cuda_alloc_destroy: %s: %s", dt_status_name(rc), err);
}

static void *get(cuda_alloc_t *a, uint64_t bytes, int tag)
{
    char err[512] = "";
    void *p = NULL;
    int rc = cuda_alloc_get(a, bytes, tag, &p, err, sizeof err);
    if (rc != DT_OK)
        fail_msg("cuda_alloc_get(%llu): %s: %s", (unsigned long long)bytes,
                 dt_status_name(rc), err);
    return p;
}

static void test_size_classes(void **state)
{
    (void)state;
    assert_int_equal(cuda_alloc_class(0), 512);
    assert_int_equal(cuda_alloc_class(1), 512);
    assert_int_equal(cuda_alloc_class(512), 512);
    assert_int_equal(cuda_alloc_class(513), 1024);
    assert_int_equal(cuda_alloc_class(MiB - 1), MiB);
    assert_int_equal(cuda_alloc_class(MiB), 2 * MiB);
    assert_int_equal(cuda_alloc_class(2 * MiB + 1), 4 * MiB);
    assert_int_equal(cuda_alloc_class(UINT64_MAX - 5), 0); /* refused */
}

/* A "step" that allocates and frees the same buffers reaches the backend
 * only in the first step; tags and peaks are exact. */
static void test_steady_state(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_alloc(&a, &f, 0, 1);
    void *params = get(&a, 3 * MiB + 7, DT_TAG_PARAMS);
    static const uint64_t sizes[] = {100, 4096, 5 * MiB, 777, 5 * MiB};
    for (int step = 0; step < 4; step++) {
        void *p[5];
        for (int i = 0; i < 5; i++)
            p[i] = get(&a, sizes[i], i % 2 ? DT_TAG_COMM : DT_TAG_ACTIVATIONS);
        assert_int_equal(a.st.tally.current[DT_TAG_ACTIVATIONS], 100 + 5 * MiB + 5 * MiB);
        assert_int_equal(a.st.tally.current[DT_TAG_COMM], 4096 + 777);
        for (int i = 0; i < 5; i++)
            assert_int_equal(put(&a, p[i]), DT_OK);
        assert_int_equal(a.st.tally.current[DT_TAG_ACTIVATIONS], 0);
        /* 1 params block + 5 in the first step, none after */
        assert_int_equal(a.st.raw_allocs, 6);
        assert_int_equal(f.allocs, 6);
        assert_int_equal(a.st.cache_hits, (uint64_t)step * 5);
    }
    assert_int_equal(a.st.raw_frees, 0);
    assert_int_equal(a.st.tally.peak[DT_TAG_ACTIVATIONS], 100 + 10 * MiB);
    assert_int_equal(a.st.tally.peak[DT_TAG_COMM], 4096 + 777);
    assert_int_equal(a.st.tally.total_peak, 3 * MiB + 7 + 100 + 10 * MiB + 4096 + 777);
    assert_int_equal(a.st.tally.total_current, 3 * MiB + 7);
    /* cached: the class sizes 512 + 4096 + 6 MiB + 1024 + 6 MiB */
    assert_int_equal(a.st.cached, 512 + 4096 + 1024 + 12 * MiB);
    assert_int_equal(a.st.reserved, a.st.cached + 4 * MiB);
    cuda_alloc_reset_peaks(&a);
    assert_int_equal(a.st.tally.peak[DT_TAG_ACTIVATIONS], 0);
    assert_int_equal(a.st.tally.total_peak, 3 * MiB + 7);
    assert_int_equal(put(&a, params), DT_OK);
    uint64_t n = 99, bytes = 99;
    destroy(&a, &n, &bytes);
    assert_int_equal(n, 0);
    assert_int_equal(bytes, 0);
    assert_int_equal(f.outstanding, 0);
}

/* A freed block serves only a request of its own class. */
static void test_reuse_by_class(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_alloc(&a, &f, 0, 1);
    void *p = get(&a, 1000, DT_TAG_GRADS); /* class 1024 */
    assert_int_equal(put(&a, p), DT_OK);
    void *q = get(&a, 2000, DT_TAG_GRADS); /* class 2048: a new block */
    assert_ptr_not_equal(q, p);
    assert_int_equal(a.st.cache_hits, 0);
    void *r = get(&a, 600, DT_TAG_OTHER); /* class 1024: the cached one */
    assert_ptr_equal(r, p);
    assert_int_equal(a.st.cache_hits, 1);
    assert_int_equal(a.st.tally.current[DT_TAG_OTHER], 600);
    assert_int_equal(a.st.tally.current[DT_TAG_GRADS], 2000);
    assert_true(cuda_alloc_owns(&a, r));
    void *z1 = get(&a, 0, DT_TAG_OTHER), *z2 = get(&a, 0, DT_TAG_OTHER);
    assert_non_null(z1);
    assert_ptr_not_equal(z1, z2); /* bytes == 0: unique pointers */
    uint64_t n = 0, bytes = 0;
    destroy(&a, &n, &bytes); /* q, r, z1, z2 still live */
    assert_int_equal(n, 4);
    assert_int_equal(bytes, 2600);
    assert_int_equal(f.outstanding, 0);
}

/* When the backend runs out, the cache goes back and the request is
 * retried once; if that fails too the message names the tag and the
 * backend's reason. */
static void test_release_on_pressure(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_alloc(&a, &f, 0, 1);
    f.capacity = 8 * MiB;
    void *p[3];
    for (int i = 0; i < 3; i++)
        p[i] = get(&a, 2 * MiB - 100, DT_TAG_ACTIVATIONS); /* class 2 MiB */
    for (int i = 0; i < 3; i++)
        assert_int_equal(put(&a, p[i]), DT_OK);
    assert_int_equal(a.st.cached, 6 * MiB);
    void *big = get(&a, 4 * MiB, DT_TAG_PARAMS); /* class 4 MiB: 6 + 4 > 8 */
    assert_non_null(big);
    assert_int_equal(a.st.releases, 1);
    assert_int_equal(a.st.cached, 0);
    assert_int_equal(a.st.raw_frees, 3);
    assert_int_equal(f.used, 4 * MiB);
    char err[512];
    void *q = (void *)&err;
    /* class 6 MiB: 4 + 6 > 8 with nothing cached to give back */
    assert_int_equal(cuda_alloc_get(&a, 5 * MiB, DT_TAG_GRADS, &q, err, sizeof err),
                     DT_ERR_NOMEM);
    assert_null(q);
    /* with what is in use in the planner's terms, and what the cache holds */
    assert_string_equal(err, "allocating 5.0 MiB (5242880 bytes) for grads "
                             "failed: fake: out of memory (in use: params 4.0 MiB; "
                             "reserved 4.0 MiB, 0 B of it cached)");
    assert_int_equal(a.st.releases, 1);
    assert_int_equal(a.st.tally.current[DT_TAG_GRADS], 0);
    assert_int_equal(put(&a, big), DT_OK);
    destroy(&a, NULL, NULL);
    assert_int_equal(f.outstanding, 0);
}

/* memory_limit counts bytes asked for; live + cached stays within it. */
static void test_budget(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_alloc(&a, &f, 5 * MiB, 1);
    void *p = get(&a, 2 * MiB, DT_TAG_PARAMS);
    char err[512];
    void *q = NULL;
    assert_int_equal(cuda_alloc_get(&a, 3 * MiB + 1, DT_TAG_GRADS, &q, err, sizeof err),
                     DT_ERR_NOMEM);
    assert_string_equal(err, "out of memory budget: allocating 3.0 MiB (3145729 "
                             "bytes) for grads would bring the total to 5.0 MiB, "
                             "over memory_limit 5.0 MiB (in use: params 2.0 MiB)");
    void *g = get(&a, 3 * MiB, DT_TAG_GRADS); /* exactly at the budget */
    assert_int_equal(a.st.tally.total_current, 5 * MiB);
    /* freeing g (class 4 MiB) would leave live 2 + cached 4 > 5: not kept */
    assert_int_equal(put(&a, g), DT_OK);
    assert_int_equal(a.st.cached, 0);
    assert_int_equal(a.st.raw_frees, 1);
    assert_int_equal(put(&a, p), DT_OK); /* class 2 MiB: 0 + 2 <= 5: kept */
    assert_int_equal(a.st.cached, 2 * MiB);
    destroy(&a, NULL, NULL);
    assert_int_equal(f.outstanding, 0);
}

static void test_refusals(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_alloc(&a, &f, 0, 1);
    char err[512];
    void *q = NULL;
    assert_int_equal(cuda_alloc_get(&a, 64, DT_TAG_COUNT, &q, err, sizeof err),
                     DT_ERR_INVALID);
    char want[64];
    snprintf(want, sizeof want, "tag %d is not a dt_mem_tag_t (0..%d)",
             DT_TAG_COUNT, DT_TAG_COUNT - 1);
    assert_string_equal(err, want);
    assert_int_equal(cuda_alloc_get(&a, UINT64_MAX, DT_TAG_OTHER, &q, err, sizeof err),
                     DT_ERR_NOMEM);
    assert_int_equal(f.allocs, 0);
    void *p = get(&a, 64, DT_TAG_OTHER);
    int x;
    assert_int_equal(put(&a, &x), DT_ERR_NOT_FOUND);
    assert_false(cuda_alloc_owns(&a, &x));
    assert_int_equal(put(&a, p), DT_OK);
    assert_int_equal(put(&a, p), DT_ERR_NOT_FOUND); /* twice */
    assert_int_equal(put(&a, NULL), DT_OK);
    destroy(&a, NULL, NULL);
    assert_int_equal(f.outstanding, 0);
}

/* caching off (pinned host memory): every free reaches the backend. */
static void test_no_caching(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_alloc(&a, &f, 0, 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(put(&a, get(&a, 4096, DT_TAG_OFFLOAD)), DT_OK);
    assert_int_equal(f.allocs, 3);
    assert_int_equal(f.frees, 3);
    assert_int_equal(a.st.cached, 0);
    assert_int_equal(a.st.tally.peak[DT_TAG_OFFLOAD], 4096);
    destroy(&a, NULL, NULL);
}

/* Many live blocks: the table grows and every pointer is still found. */
static void test_many_blocks(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_alloc(&a, &f, 0, 1);
    void *p[200];
    for (int i = 0; i < 200; i++)
        p[i] = get(&a, (uint64_t)(i + 1) * 8, DT_TAG_ACTIVATIONS);
    for (int i = 0; i < 200; i += 2)
        assert_int_equal(put(&a, p[i]), DT_OK);
    for (int i = 0; i < 200; i++)
        assert_int_equal(cuda_alloc_owns(&a, p[i]), i % 2);
    uint64_t want = 0;
    for (int i = 1; i < 200; i += 2)
        want += (uint64_t)(i + 1) * 8;
    assert_int_equal(a.st.tally.current[DT_TAG_ACTIVATIONS], want);
    uint64_t n = 0;
    destroy(&a, &n, NULL);
    assert_int_equal(n, 100);
    assert_int_equal(f.outstanding, 0);
}

/* ---------------------------------------------------------------- fences */

/* A freed block whose fence is pending is not handed out again (a fresh
 * block is); once its fence completes it is, before a newer pending one. */
static void test_fence_pending_not_reused(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_fenced(&a, &f, 0, 1);
    void *p = get(&a, 1000, DT_TAG_ACTIVATIONS); /* class 1024 */
    assert_int_equal(put(&a, p), DT_OK);
    assert_int_equal(f.fences_live, 1);
    assert_int_equal(a.st.cached, 1024);
    void *q = get(&a, 1000, DT_TAG_ACTIVATIONS);
    assert_ptr_not_equal(q, p);
    assert_int_equal(a.st.cache_hits, 0);
    assert_int_equal(a.st.raw_allocs, 2);
    assert_int_equal(f.waits, 0); /* nothing waited for */
    complete_fences(&f);          /* p's work is done */
    assert_int_equal(put(&a, q), DT_OK); /* q: newer, pending */
    void *r = get(&a, 600, DT_TAG_OTHER);
    assert_ptr_equal(r, p);
    assert_int_equal(a.st.cache_hits, 1);
    assert_int_equal(f.fences_live, 1); /* p's dropped, q's pending */
    assert_int_equal(a.st.raw_allocs, 2);
    assert_int_equal(f.waits, 0);
    assert_int_equal(put(&a, r), DT_OK);
    /* destroy waits for the pending fences; here they complete */
    f.complete_on_wait = 1;
    destroy(&a, NULL, NULL);
    assert_int_equal(f.outstanding, 0);
    assert_int_equal(f.fences_live, 0);
}

/* The backend out of memory with only pending blocks cached: the
 * allocator waits for them, reuses one of the class, and keeps the rest;
 * a class it has none of gets the done blocks given back and a retry. */
static void test_fence_oom_waits(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_fenced(&a, &f, 0, 1);
    f.capacity = 4 * MiB;
    void *p1 = get(&a, 2 * MiB - 100, DT_TAG_ACTIVATIONS); /* class 2 MiB */
    void *p2 = get(&a, 2 * MiB - 100, DT_TAG_ACTIVATIONS);
    assert_int_equal(put(&a, p1), DT_OK);
    assert_int_equal(put(&a, p2), DT_OK);
    f.complete_on_wait = 1;
    void *q = get(&a, 2 * MiB, DT_TAG_PARAMS); /* 4 + 2 > 4: waits */
    assert_ptr_equal(q, p2);                   /* newest first */
    assert_int_equal(f.waits, 2);
    assert_int_equal(a.st.fence_waits, 1);
    assert_int_equal(a.st.cache_hits, 1);
    assert_int_equal(a.st.raw_allocs, 2);
    assert_int_equal(a.st.cached, 2 * MiB); /* p1, its fence done */
    assert_int_equal(f.fences_live, 0);
    /* class 4 MiB: p1 goes back (done: no wait), then 2 + 4 > 4 still */
    char err[512];
    void *r = NULL;
    assert_int_equal(cuda_alloc_get(&a, 3 * MiB, DT_TAG_GRADS, &r, err, sizeof err),
                     DT_ERR_NOMEM);
    assert_string_equal(err, "allocating 3.0 MiB (3145728 bytes) for grads "
                             "failed: fake: out of memory (in use: params 2.0 MiB; "
                             "reserved 2.0 MiB, 0 B of it cached)");
    assert_int_equal(a.st.cached, 0);
    assert_int_equal(a.st.releases, 1);
    assert_int_equal(f.waits, 2);
    assert_int_equal(put(&a, q), DT_OK);
    destroy(&a, NULL, NULL);
    assert_int_equal(f.outstanding, 0);
    assert_int_equal(f.fences_live, 0);
}

/* Fences that never complete: the out-of-memory wait gives up after its
 * bound, with the backend's reason and the wait's; nothing changed, and
 * once the fences complete the same request succeeds. */
static void test_fence_oom_timeout(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_fenced(&a, &f, 0, 1);
    f.capacity = 4 * MiB;
    void *p1 = get(&a, 2 * MiB - 100, DT_TAG_ACTIVATIONS);
    void *p2 = get(&a, 2 * MiB - 100, DT_TAG_ACTIVATIONS);
    assert_int_equal(put(&a, p1), DT_OK);
    assert_int_equal(put(&a, p2), DT_OK);
    char err[512];
    void *q = (void *)&err;
    double t0 = now_s();
    assert_int_equal(cuda_alloc_get(&a, 3 * MiB, DT_TAG_PARAMS, &q, err, sizeof err),
                     DT_ERR_TIMEOUT);
    assert_bounded(t0);
    assert_null(q);
    assert_string_equal(err, "allocating 3.0 MiB (3145728 bytes) for params "
                             "failed: fake: out of memory; waiting for device "
                             "work that used freed blocks: not done after 50 ms "
                             "(2 blocks, 4.0 MiB, still pending)");
    assert_int_equal(f.waited_ms, 50); /* the bound is for the whole call */
    assert_int_equal(a.st.cached, 4 * MiB);
    assert_int_equal(a.st.raw_frees, 0);
    assert_int_equal(a.st.tally.total_current, 0);
    assert_int_equal(f.fences_live, 2);
    complete_fences(&f);
    q = get(&a, 3 * MiB, DT_TAG_PARAMS); /* both given back, then fresh */
    assert_int_equal(a.st.raw_frees, 2);
    assert_int_equal(a.st.raw_allocs, 3);
    assert_int_equal(f.fences_live, 0);
    assert_int_equal(put(&a, q), DT_OK);
    complete_fences(&f);
    destroy(&a, NULL, NULL);
    assert_int_equal(f.outstanding, 0);
}

/* Over the budget with pending blocks cached: wait (bounded), then give
 * them back; the message says which request waited. */
static void test_fence_budget(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_fenced(&a, &f, 5 * MiB, 1);
    void *p = get(&a, 2 * MiB, DT_TAG_ACTIVATIONS); /* class 2 MiB */
    assert_int_equal(put(&a, p), DT_OK);            /* kept, pending */
    char err[512];
    void *q = NULL;
    double t0 = now_s();
    /* class 4 MiB: 0 + 2 cached + 4 > 5 */
    assert_int_equal(cuda_alloc_get(&a, 4 * MiB, DT_TAG_GRADS, &q, err, sizeof err),
                     DT_ERR_TIMEOUT);
    assert_bounded(t0);
    assert_string_equal(err, "allocating 4.0 MiB (4194304 bytes) for grads: "
                             "waiting for device work that used freed blocks: "
                             "not done after 50 ms (1 block, 2.0 MiB, still "
                             "pending)");
    assert_int_equal(a.st.cached, 2 * MiB);
    f.complete_on_wait = 1;
    q = get(&a, 4 * MiB, DT_TAG_GRADS);
    assert_int_equal(a.st.cached, 0);
    assert_int_equal(a.st.raw_frees, 1);
    assert_int_equal(f.used, 4 * MiB);
    assert_int_equal(put(&a, q), DT_OK);
    destroy(&a, NULL, NULL);
    assert_int_equal(f.outstanding, 0);
    assert_int_equal(f.fences_live, 0);
}

/* release_cached waits for the fences: what completes goes back, what
 * does not within the bound stays cached, and the message says so; a
 * failing fence is reported with the backend's reason. */
static void test_fence_release(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_fenced(&a, &f, 0, 1);
    void *p[3];
    for (int i = 0; i < 3; i++)
        p[i] = get(&a, 2 * MiB, DT_TAG_ACTIVATIONS);
    for (int i = 0; i < 3; i++)
        assert_int_equal(put(&a, p[i]), DT_OK);
    char err[512] = "";
    f.complete_on_wait = 1;
    assert_int_equal(cuda_alloc_release_cached(&a, err, sizeof err), DT_OK);
    assert_int_equal(a.st.raw_frees, 3);
    assert_int_equal(a.st.cached, 0);
    assert_int_equal(f.fences_live, 0);
    f.complete_on_wait = 0;
    for (int i = 0; i < 3; i++)
        p[i] = get(&a, 2 * MiB, DT_TAG_ACTIVATIONS);
    assert_int_equal(put(&a, p[0]), DT_OK);
    complete_fences(&f); /* p[0]'s done */
    assert_int_equal(put(&a, p[1]), DT_OK);
    assert_int_equal(put(&a, p[2]), DT_OK);
    double t0 = now_s();
    assert_int_equal(cuda_alloc_release_cached(&a, err, sizeof err), DT_ERR_TIMEOUT);
    assert_bounded(t0);
    assert_string_equal(err, "waiting for device work that used freed blocks: "
                             "not done after 50 ms; 2 blocks (4.0 MiB) kept in "
                             "the cache");
    assert_int_equal(a.st.raw_frees, 4); /* p[0] went back */
    assert_int_equal(a.st.cached, 4 * MiB);
    assert_int_equal(f.fences_live, 2);
    /* one of them fails */
    for (int i = 0; i < 256; i++)
        if (f.fence[i].used) {
            f.fence[i].fail = 1;
            break;
        }
    assert_int_equal(cuda_alloc_release_cached(&a, err, sizeof err), DT_ERR_SYSTEM);
    assert_string_equal(err, "waiting for device work that used freed blocks: "
                             "fake: fence failed; 2 blocks (4.0 MiB) kept in the "
                             "cache");
    for (int i = 0; i < 256; i++)
        f.fence[i].fail = 0;
    complete_fences(&f);
    destroy(&a, NULL, NULL);
    assert_int_equal(f.outstanding, 0);
    assert_int_equal(f.fences_live, 0);
}

/* destroy with fences that never complete: those blocks are not freed
 * (the device may still use them), the rest is, and the message says so. */
static void test_fence_destroy_pending(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_fenced(&a, &f, 0, 1);
    void *p = get(&a, 2 * MiB, DT_TAG_ACTIVATIONS);
    void *q = get(&a, 100, DT_TAG_ACTIVATIONS);
    void *live = get(&a, 100, DT_TAG_PARAMS);
    assert_int_equal(put(&a, q), DT_OK);
    complete_fences(&f);
    assert_int_equal(put(&a, p), DT_OK); /* pending for good */
    char err[512] = "";
    uint64_t n = 0, bytes = 0;
    double t0 = now_s();
    assert_int_equal(cuda_alloc_destroy(&a, &n, &bytes, err, sizeof err),
                     DT_ERR_TIMEOUT);
    assert_bounded(t0);
    assert_string_equal(err, "waiting for device work that used freed blocks: "
                             "not done after 50 ms; 1 block (2.0 MiB) not freed");
    assert_int_equal(n, 1); /* `live` */
    assert_int_equal(bytes, 100);
    assert_int_equal(f.outstanding, 1); /* p's memory, left alone */
    assert_int_equal(f.fences_live, 0);
    (void)live;
    fake_free(&f, p); /* the test's own clean-up */
    assert_int_equal(f.outstanding, 0);
}

/* A free the cache cannot keep (caching off) goes back only after its
 * fence; a fence that does not complete leaves the block allocated. */
static void test_fence_uncached_free(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_fenced(&a, &f, 0, 0);
    void *p = get(&a, 4096, DT_TAG_OFFLOAD);
    char err[512] = "";
    double t0 = now_s();
    assert_int_equal(cuda_alloc_put(&a, p, err, sizeof err), DT_ERR_TIMEOUT);
    assert_bounded(t0);
    assert_string_equal(err, "waiting for device work that used the block: not "
                             "done after 50 ms; it stays allocated");
    assert_true(cuda_alloc_owns(&a, p));
    assert_int_equal(a.st.tally.current[DT_TAG_OFFLOAD], 4096);
    assert_int_equal(f.frees, 0);
    assert_int_equal(f.fences_live, 0);
    f.complete_on_wait = 1;
    assert_int_equal(put(&a, p), DT_OK);
    assert_int_equal(f.frees, 1);
    assert_false(cuda_alloc_owns(&a, p));
    assert_int_equal(a.st.tally.current[DT_TAG_OFFLOAD], 0);
    assert_int_equal(a.st.fence_waits, 2);
    /* no fence at all: refused, still allocated */
    p = get(&a, 4096, DT_TAG_OFFLOAD);
    f.fence_fail_new = 1;
    assert_int_equal(cuda_alloc_put(&a, p, err, sizeof err), DT_ERR_SYSTEM);
    assert_string_equal(err, "cannot fence the freed block: fake: no fence; it "
                             "stays allocated");
    assert_true(cuda_alloc_owns(&a, p));
    f.fence_fail_new = 0;
    assert_int_equal(put(&a, p), DT_OK);
    destroy(&a, NULL, NULL);
    assert_int_equal(f.outstanding, 0);
    assert_int_equal(f.fences_live, 0);
}

/* A free while no device work is queued needs no fence: the block is
 * reused at once, and given back without a wait. */
static void test_fence_idle(void **state)
{
    (void)state;
    fake_t f;
    cuda_alloc_t a;
    open_fenced(&a, &f, 0, 1);
    f.idle = 1;
    void *p = get(&a, 1000, DT_TAG_GRADS);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(put(&a, p), DT_OK);
        void *q = get(&a, 1000, DT_TAG_GRADS);
        assert_ptr_equal(q, p);
    }
    assert_int_equal(a.st.cache_hits, 3);
    assert_int_equal(put(&a, p), DT_OK);
    char err[512] = "";
    assert_int_equal(cuda_alloc_release_cached(&a, err, sizeof err), DT_OK);
    assert_int_equal(f.frees, 1);
    assert_int_equal(f.waits, 0);
    assert_int_equal(a.st.fence_waits, 0);
    assert_int_equal(f.fences_live, 0);
    destroy(&a, NULL, NULL);
    assert_int_equal(f.outstanding, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_classes),
        cmocka_unit_test(test_steady_state),
        cmocka_unit_test(test_reuse_by_class),
        cmocka_unit_test(test_release_on_pressure),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_no_caching),
        cmocka_unit_test(test_many_blocks),
        cmocka_unit_test(test_fence_pending_not_reused),
        cmocka_unit_test(test_fence_oom_waits),
        cmocka_unit_test(test_fence_oom_timeout),
        cmocka_unit_test(test_fence_budget),
        cmocka_unit_test(test_fence_release),
        cmocka_unit_test(test_fence_destroy_pending),
        cmocka_unit_test(test_fence_uncached_free),
        cmocka_unit_test(test_fence_idle),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
