/*
 * plugins/cuda/cuda_alloc.c - the caching allocator of cuda_alloc.h: a
 * pointer-keyed table of live blocks (tag, bytes asked for, class size),
 * a list of freed blocks by class, and the counters mem_stats reports.
 * Host-only C: no CUDA call here, the backend does those.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/status.h"
#include "cuda_alloc.h"

#define SMALL_ROUND 512u
#define LARGE_FROM ((uint64_t)1 << 20)
#define LARGE_ROUND ((uint64_t)2 << 20)
#define TOMBSTONE ((void *)(uintptr_t)1)

struct cuda_alloc_block {
    void *ptr; /* NULL: empty slot; TOMBSTONE: deleted (live table) */
    uint64_t bytes;  /* asked for */
    uint64_t cbytes; /* class size: what the backend gave */
    int32_t tag;
};

uint64_t cuda_alloc_class(uint64_t bytes)
{
    if (bytes == 0)
        return SMALL_ROUND;
    uint64_t r = bytes < LARGE_FROM ? SMALL_ROUND : LARGE_ROUND;
    if (bytes > UINT64_MAX - (r - 1))
        return 0; /* unroundable: the caller refuses it */
    return (bytes + r - 1) / r * r;
}

static uint64_t ptr_hash(const void *p)
{
    return ((uint64_t)(uintptr_t)p >> 6) * 0x9E3779B97F4A7C15ull;
}

static cuda_alloc_block_t *live_find(const cuda_alloc_t *a, const void *p)
{
    if (!a->live || !p || p == TOMBSTONE)
        return NULL;
    uint64_t mask = a->live_cap - 1;
    for (uint64_t i = ptr_hash(p) & mask;; i = (i + 1) & mask) {
        cuda_alloc_block_t *b = &a->live[i];
        if (b->ptr == NULL)
            return NULL;
        if (b->ptr == p)
            return b;
    }
}

static void live_put(cuda_alloc_block_t *tab, uint64_t cap,
                     const cuda_alloc_block_t *blk)
{
    uint64_t mask = cap - 1;
    uint64_t i = ptr_hash(blk->ptr) & mask;
    while (tab[i].ptr != NULL && tab[i].ptr != TOMBSTONE)
        i = (i + 1) & mask;
    tab[i] = *blk;
}

/* Room for one more live entry (load factor under 1/2); 0 or -1. */
static int live_reserve(cuda_alloc_t *a)
{
    if ((a->live_used + 1) * 2 <= a->live_cap)
        return 0;
    uint64_t live = 0;
    for (uint64_t i = 0; i < a->live_cap; i++)
        if (a->live[i].ptr && a->live[i].ptr != TOMBSTONE)
            live++;
    uint64_t cap = a->live_cap ? a->live_cap : 64;
    while ((live + 1) * 4 > cap)
        cap *= 2;
    cuda_alloc_block_t *tab = calloc(cap, sizeof *tab);
    if (!tab)
        return -1;
    for (uint64_t i = 0; i < a->live_cap; i++)
        if (a->live[i].ptr && a->live[i].ptr != TOMBSTONE)
            live_put(tab, cap, &a->live[i]);
    free(a->live);
    a->live = tab;
    a->live_cap = cap;
    a->live_used = live;
    return 0;
}

void cuda_alloc_init(cuda_alloc_t *a, const cuda_alloc_backend_t *be,
                     uint64_t limit, int caching)
{
    memset(a, 0, sizeof *a);
    a->be = *be;
    a->limit = limit;
    a->caching = caching;
}

void cuda_alloc_release_cached(cuda_alloc_t *a)
{
    if (a->ncache == 0)
        return;
    for (uint64_t i = 0; i < a->ncache; i++) {
        a->be.raw_free(a->be.ctx, a->cache[i].ptr);
        a->st.raw_frees++;
        a->st.reserved -= a->cache[i].cbytes;
    }
    a->ncache = 0;
    a->st.cached = 0;
    a->st.releases++;
}

void cuda_alloc_destroy(cuda_alloc_t *a, uint64_t *nleaked,
                        uint64_t *leaked_bytes)
{
    uint64_t n = 0, bytes = 0;
    for (uint64_t i = 0; i < a->live_cap; i++) {
        cuda_alloc_block_t *b = &a->live[i];
        if (b->ptr && b->ptr != TOMBSTONE) {
            n++;
            bytes += b->bytes;
            a->be.raw_free(a->be.ctx, b->ptr);
        }
    }
    cuda_alloc_release_cached(a);
    free(a->live);
    free(a->cache);
    if (nleaked)
        *nleaked = n;
    if (leaked_bytes)
        *leaked_bytes = bytes;
    memset(a, 0, sizeof *a);
}

/* A cached block of class `cbytes` (removed from the cache), or NULL. */
static void *cache_take(cuda_alloc_t *a, uint64_t cbytes)
{
    /* newest first: its memory is the likeliest still in L2 */
    for (uint64_t i = a->ncache; i-- > 0;)
        if (a->cache[i].cbytes == cbytes) {
            void *p = a->cache[i].ptr;
            a->cache[i] = a->cache[--a->ncache];
            a->st.cached -= cbytes;
            a->st.cache_hits++;
            return p;
        }
    return NULL;
}

/* Keep a freed block; 0 when it must go back to the backend instead. */
static int cache_put(cuda_alloc_t *a, void *p, uint64_t cbytes)
{
    if (!a->caching)
        return 0;
    /* with a budget, live + cached stays within it */
    if (a->limit && a->st.tally.total_current + a->st.cached + cbytes > a->limit)
        return 0;
    if (a->ncache == a->cache_cap) {
        uint64_t cap = a->cache_cap ? a->cache_cap * 2 : 64;
        cuda_alloc_block_t *c = realloc(a->cache, cap * sizeof *c);
        if (!c)
            return 0;
        a->cache = c;
        a->cache_cap = cap;
    }
    a->cache[a->ncache++] = (cuda_alloc_block_t){.ptr = p, .cbytes = cbytes};
    a->st.cached += cbytes;
    return 1;
}

static int budget_error(const cuda_alloc_t *a, uint64_t bytes, int tag,
                        char *err, size_t errlen)
{
    dt_mem_tally_budget_text(&a->st.tally, bytes, tag, a->limit, err, errlen);
    return DT_ERR_NOMEM;
}

int cuda_alloc_get(cuda_alloc_t *a, uint64_t bytes, int tag, void **out,
                   char *err, size_t errlen)
{
    char req[32];
    *out = NULL;
    if (tag < 0 || tag >= DT_TAG_COUNT) {
        snprintf(err, errlen, "tag %d is not a dt_mem_tag_t (0..%d)", tag,
                 DT_TAG_COUNT - 1);
        return DT_ERR_INVALID;
    }
    uint64_t cbytes = cuda_alloc_class(bytes);
    if (cbytes == 0) {
        snprintf(err, errlen, "%" PRIu64 " bytes for %s is more than can be "
                 "addressed", bytes, dt_mem_tag_name(tag));
        return DT_ERR_NOMEM;
    }
    /* total_current never exceeds the limit, so this cannot wrap */
    if (a->limit && bytes > a->limit - a->st.tally.total_current)
        return budget_error(a, bytes, tag, err, errlen);
    if (live_reserve(a) != 0) {
        snprintf(err, errlen, "no host memory for the allocation table");
        return DT_ERR_NOMEM;
    }
    void *p = cache_take(a, cbytes);
    if (!p) {
        /* the budget stands for the device's memory: cached blocks give way */
        if (a->limit && a->st.tally.total_current + a->st.cached + cbytes > a->limit)
            cuda_alloc_release_cached(a);
        char why[160] = "";
        int e = a->be.raw_alloc(a->be.ctx, cbytes, &p, why, sizeof why);
        if (e != 0 && a->ncache) { /* the device is short: give the cache back */
            cuda_alloc_release_cached(a);
            why[0] = '\0';
            e = a->be.raw_alloc(a->be.ctx, cbytes, &p, why, sizeof why);
        }
        if (e != 0 || !p) {
            snprintf(err, errlen, "allocating %s (%" PRIu64 " bytes) for %s "
                     "failed: %s", dt_mem_fmt_bytes(req, bytes), bytes,
                     dt_mem_tag_name(tag), why[0] ? why : "no reason given");
            return DT_ERR_NOMEM;
        }
        a->st.raw_allocs++;
        a->st.reserved += cbytes;
    }
    cuda_alloc_block_t blk = {.ptr = p, .bytes = bytes, .cbytes = cbytes,
                              .tag = tag};
    live_put(a->live, a->live_cap, &blk);
    a->live_used++;
    dt_mem_tally_add(&a->st.tally, tag, bytes);
    *out = p;
    return DT_OK;
}

int cuda_alloc_put(cuda_alloc_t *a, void *ptr)
{
    if (!ptr)
        return DT_OK;
    cuda_alloc_block_t *b = live_find(a, ptr);
    if (!b)
        return DT_ERR_NOT_FOUND;
    uint64_t cbytes = b->cbytes;
    dt_mem_tally_sub(&a->st.tally, b->tag, b->bytes);
    b->ptr = TOMBSTONE;
    if (!cache_put(a, ptr, cbytes)) {
        a->be.raw_free(a->be.ctx, ptr);
        a->st.raw_frees++;
        a->st.reserved -= cbytes;
    }
    return DT_OK;
}

int cuda_alloc_owns(const cuda_alloc_t *a, const void *ptr)
{
    return live_find(a, ptr) != NULL;
}

void cuda_alloc_reset_peaks(cuda_alloc_t *a)
{
    dt_mem_tally_reset_peaks(&a->st.tally);
}
