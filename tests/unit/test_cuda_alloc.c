/*
 * tests/unit/test_cuda_alloc.c - the cuda device's caching allocator
 * (plugins/cuda/cuda_alloc.c) on the CPU, through a fake malloc backend
 * with a capacity, so its bookkeeping is checked on every machine: size
 * classes, reuse by class, no backend call in a steady-state step, tags and
 * peaks, the budget and its message, release of the cache when the backend
 * runs out, refusal of foreign pointers, and leaks reported at destroy.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../plugins/cuda/cuda_alloc.h"
#include "dtrain/status.h"

#define MiB ((uint64_t)1 << 20)

/* A "device" of `capacity` bytes made of malloc'd blocks. */
typedef struct fake {
    uint64_t capacity; /* 0: unlimited */
    uint64_t used;
    int outstanding; /* blocks not yet freed */
    int allocs, frees;
    struct { void *p; uint64_t n; } blk[256];
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

static void open_alloc(cuda_alloc_t *a, fake_t *f, uint64_t limit, int caching)
{
    memset(f, 0, sizeof *f);
    cuda_alloc_backend_t be = {.ctx = f, .raw_alloc = fake_alloc,
                               .raw_free = fake_free};
    cuda_alloc_init(a, &be, limit, caching);
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
            assert_int_equal(cuda_alloc_put(&a, p[i]), DT_OK);
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
    assert_int_equal(cuda_alloc_put(&a, params), DT_OK);
    uint64_t n = 99, bytes = 99;
    cuda_alloc_destroy(&a, &n, &bytes);
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
    assert_int_equal(cuda_alloc_put(&a, p), DT_OK);
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
    cuda_alloc_destroy(&a, &n, &bytes); /* q, r, z1, z2 still live */
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
        assert_int_equal(cuda_alloc_put(&a, p[i]), DT_OK);
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
    assert_string_equal(err, "allocating 5.0 MiB (5242880 bytes) for grads "
                             "failed: fake: out of memory");
    assert_int_equal(a.st.releases, 1);
    assert_int_equal(a.st.tally.current[DT_TAG_GRADS], 0);
    assert_int_equal(cuda_alloc_put(&a, big), DT_OK);
    cuda_alloc_destroy(&a, NULL, NULL);
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
    assert_int_equal(cuda_alloc_put(&a, g), DT_OK);
    assert_int_equal(a.st.cached, 0);
    assert_int_equal(a.st.raw_frees, 1);
    assert_int_equal(cuda_alloc_put(&a, p), DT_OK); /* class 2 MiB: 0 + 2 <= 5: kept */
    assert_int_equal(a.st.cached, 2 * MiB);
    cuda_alloc_destroy(&a, NULL, NULL);
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
    assert_int_equal(cuda_alloc_put(&a, &x), DT_ERR_NOT_FOUND);
    assert_false(cuda_alloc_owns(&a, &x));
    assert_int_equal(cuda_alloc_put(&a, p), DT_OK);
    assert_int_equal(cuda_alloc_put(&a, p), DT_ERR_NOT_FOUND); /* twice */
    assert_int_equal(cuda_alloc_put(&a, NULL), DT_OK);
    cuda_alloc_destroy(&a, NULL, NULL);
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
        assert_int_equal(cuda_alloc_put(&a, get(&a, 4096, DT_TAG_OFFLOAD)), DT_OK);
    assert_int_equal(f.allocs, 3);
    assert_int_equal(f.frees, 3);
    assert_int_equal(a.st.cached, 0);
    assert_int_equal(a.st.tally.peak[DT_TAG_OFFLOAD], 4096);
    cuda_alloc_destroy(&a, NULL, NULL);
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
        assert_int_equal(cuda_alloc_put(&a, p[i]), DT_OK);
    for (int i = 0; i < 200; i++)
        assert_int_equal(cuda_alloc_owns(&a, p[i]), i % 2);
    uint64_t want = 0;
    for (int i = 1; i < 200; i += 2)
        want += (uint64_t)(i + 1) * 8;
    assert_int_equal(a.st.tally.current[DT_TAG_ACTIVATIONS], want);
    uint64_t n = 0;
    cuda_alloc_destroy(&a, &n, NULL);
    assert_int_equal(n, 100);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
