/*
 * plugins/cuda/cuda_alloc.c - the caching allocator of cuda_alloc.h: a
 * pointer-keyed table of live blocks (tag, bytes asked for, class size),
 * a list of freed blocks by class, each with its fence while the device
 * may still use it, and the counters mem_stats reports.
 * Host-only C: no CUDA call here, the backend does those.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    void *fence; /* cached: the fence still pending, NULL once done (or
                  * without fences) */
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
    a->wait_ms = CUDA_WAIT_LIMIT_MS;
}

/* ---------------------------------------------------------------- fences */

static int has_fences(const cuda_alloc_t *a)
{
    return a->be.fence_new && a->be.fence_done && a->be.fence_wait &&
           a->be.fence_free;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* "300 s", "50 ms". */
static const char *fmt_ms(char buf[32], uint64_t ms)
{
    if (ms >= 1000 && ms % 1000 == 0)
        snprintf(buf, 32, "%" PRIu64 " s", ms / 1000);
    else
        snprintf(buf, 32, "%" PRIu64 " ms", ms);
    return buf;
}

/* printf onto the end of err (NULL or full: nothing). */
static void append(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    size_t n = strlen(err);
    if (n + 1 >= errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + n, errlen - n, fmt, ap);
    va_end(ap);
}

/* A cached block's fence done (dropped then) or absent: 1; pending, or
 * its query failed (a wait reports that): 0.  Never blocks. */
static int block_ready(cuda_alloc_t *a, cuda_alloc_block_t *b)
{
    if (!b->fence)
        return 1;
    char why[160];
    if (a->be.fence_done(a->be.ctx, b->fence, why, sizeof why) != 1)
        return 0;
    a->be.fence_free(a->be.ctx, b->fence);
    b->fence = NULL;
    return 1;
}

/* Cached blocks whose fences are pending, and their bytes. */
static uint64_t pending(const cuda_alloc_t *a, uint64_t *bytes)
{
    uint64_t n = 0, b = 0;
    for (uint64_t i = 0; i < a->ncache; i++)
        if (a->cache[i].fence) {
            n++;
            b += a->cache[i].cbytes;
        }
    *bytes = b;
    return n;
}

/* "; 2 blocks (4.0 MiB)<what>" after err: the pending blocks. */
static void append_pending(const cuda_alloc_t *a, char *err, size_t errlen,
                           const char *what)
{
    uint64_t bytes = 0, n = pending(a, &bytes);
    char sz[32];
    append(err, errlen, "; %" PRIu64 " block%s (%s)%s", n, n == 1 ? "" : "s",
           dt_mem_fmt_bytes(sz, bytes), what);
}

/* Wait for every cached block's fence, up to a->wait_ms in all; the fences
 * that complete are dropped.  DT_OK when none is pending any more; else
 * DT_ERR_TIMEOUT ("waiting for device work that used freed blocks: not
 * done after 300 s") or DT_ERR_SYSTEM ("...: <backend's reason>") into
 * err, those blocks still cached with their fences. */
static int cache_settle(cuda_alloc_t *a, char *err, size_t errlen)
{
    static const char head[] = "waiting for device work that used freed blocks";
    uint64_t t0 = now_ms();
    int rc = DT_OK, counted = 0;
    char why[160];
    for (uint64_t i = 0; i < a->ncache; i++) {
        cuda_alloc_block_t *b = &a->cache[i];
        if (!b->fence)
            continue;
        if (!counted) {
            a->st.fence_waits++;
            counted = 1;
        }
        /* after the bound, each remaining fence is looked at once */
        uint64_t spent = now_ms() - t0;
        uint64_t left = spent >= a->wait_ms ? 0 : a->wait_ms - spent;
        why[0] = '\0';
        int r = a->be.fence_wait(a->be.ctx, b->fence, left, why, sizeof why);
        if (r == 1) {
            a->be.fence_free(a->be.ctx, b->fence);
            b->fence = NULL;
        } else if (r == 0) {
            rc = DT_ERR_TIMEOUT;
        } else {
            snprintf(err, errlen, "%s: %s", head, why[0] ? why : "no reason given");
            return DT_ERR_SYSTEM;
        }
    }
    if (rc == DT_ERR_TIMEOUT) {
        char t[32];
        snprintf(err, errlen, "%s: not done after %s", head, fmt_ms(t, a->wait_ms));
    }
    return rc;
}

/* Give back every cached block whose fence is done (or absent), without
 * waiting; the number given back. */
static uint64_t release_ready(cuda_alloc_t *a)
{
    uint64_t n = 0;
    for (uint64_t i = a->ncache; i-- > 0;) {
        cuda_alloc_block_t *b = &a->cache[i];
        if (!block_ready(a, b))
            continue;
        a->be.raw_free(a->be.ctx, b->ptr);
        a->st.raw_frees++;
        a->st.reserved -= b->cbytes;
        a->st.cached -= b->cbytes;
        *b = a->cache[--a->ncache]; /* one already looked at, or b itself */
        n++;
    }
    if (n)
        a->st.releases++;
    return n;
}

/* cuda_alloc_release_cached, the blocks not given back said to be `what`. */
static int release_cached(cuda_alloc_t *a, char *err, size_t errlen,
                          const char *what)
{
    if (a->ncache == 0)
        return DT_OK;
    int rc = cache_settle(a, err, errlen);
    release_ready(a);
    if (rc != DT_OK)
        append_pending(a, err, errlen, what);
    return rc;
}

int cuda_alloc_release_cached(cuda_alloc_t *a, char *err, size_t errlen)
{
    return release_cached(a, err, errlen, " kept in the cache");
}

int cuda_alloc_destroy(cuda_alloc_t *a, uint64_t *nleaked,
                       uint64_t *leaked_bytes, char *err, size_t errlen)
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
    int rc = release_cached(a, err, errlen, " not freed");
    /* what is left the device may still use: not freed, the fences given up */
    for (uint64_t i = 0; i < a->ncache; i++)
        if (a->cache[i].fence)
            a->be.fence_free(a->be.ctx, a->cache[i].fence);
    free(a->live);
    free(a->cache);
    if (nleaked)
        *nleaked = n;
    if (leaked_bytes)
        *leaked_bytes = bytes;
    memset(a, 0, sizeof *a);
    return rc;
}

/* ----------------------------------------------------------------- cache */

/* A cached block of class `cbytes` whose fence is done (removed from the
 * cache), or NULL. */
static void *cache_take(cuda_alloc_t *a, uint64_t cbytes)
{
    /* newest first: its memory is the likeliest still in L2 */
    for (uint64_t i = a->ncache; i-- > 0;)
        if (a->cache[i].cbytes == cbytes && block_ready(a, &a->cache[i])) {
            void *p = a->cache[i].ptr;
            a->cache[i] = a->cache[--a->ncache];
            a->st.cached -= cbytes;
            a->st.cache_hits++;
            return p;
        }
    return NULL;
}

/* Whether a freed block of class `cbytes` may be kept, live bytes being
 * `live_after` once it is freed (room made in the list); 0: it goes back
 * to the backend instead. */
static int cache_room(cuda_alloc_t *a, uint64_t cbytes, uint64_t live_after)
{
    if (!a->caching)
        return 0;
    /* with a budget, live + cached stays within it */
    if (a->limit && live_after + a->st.cached + cbytes > a->limit)
        return 0;
    if (a->ncache == a->cache_cap) {
        uint64_t cap = a->cache_cap ? a->cache_cap * 2 : 64;
        cuda_alloc_block_t *c = realloc(a->cache, cap * sizeof *c);
        if (!c)
            return 0;
        a->cache = c;
        a->cache_cap = cap;
    }
    return 1;
}

/* Under pressure with only pending blocks cached: wait for them (bounded),
 * then take a block of the class if there is one now, else give them all
 * back.  DT_OK (*p set or not), or cache_settle's failure with "(2 blocks,
 * 4.0 MiB, still pending)" after it. */
static int cache_reclaim(cuda_alloc_t *a, uint64_t cbytes, void **p,
                         char *err, size_t errlen)
{
    int rc = cache_settle(a, err, errlen);
    if (rc != DT_OK) {
        uint64_t bytes = 0, n = pending(a, &bytes);
        char sz[32];
        append(err, errlen, " (%" PRIu64 " block%s, %s, still pending)", n,
               n == 1 ? "" : "s", dt_mem_fmt_bytes(sz, bytes));
        return rc;
    }
    if (!(*p = cache_take(a, cbytes)))
        release_ready(a);
    return DT_OK;
}

static int budget_error(const cuda_alloc_t *a, uint64_t bytes, int tag,
                        char *err, size_t errlen)
{
    dt_mem_tally_budget_text(&a->st.tally, bytes, tag, a->limit, err, errlen);
    return DT_ERR_NOMEM;
}

/* live + cached + a new block of `cbytes` over the budget */
static int over_budget(const cuda_alloc_t *a, uint64_t cbytes)
{
    return a->limit && a->st.tally.total_current + a->st.cached + cbytes > a->limit;
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
        char waited[400] = "";
        /* the budget stands for the device's memory: cached blocks give
         * way, the pending ones after their fences */
        if (over_budget(a, cbytes) && a->ncache) {
            release_ready(a);
            if (over_budget(a, cbytes) && a->ncache) {
                int rc = cache_reclaim(a, cbytes, &p, waited, sizeof waited);
                if (rc != DT_OK) {
                    snprintf(err, errlen, "allocating %s (%" PRIu64 " bytes) "
                             "for %s: %s", dt_mem_fmt_bytes(req, bytes), bytes,
                             dt_mem_tag_name(tag), waited);
                    return rc;
                }
            }
        }
    }
    if (!p) {
        char why[160] = "";
        int e = a->be.raw_alloc(a->be.ctx, cbytes, &p, why, sizeof why);
        /* the device is short: give back the cache, done blocks first */
        if (e != 0 && a->ncache && release_ready(a)) {
            why[0] = '\0';
            e = a->be.raw_alloc(a->be.ctx, cbytes, &p, why, sizeof why);
        }
        int fresh = 1;
        if (e != 0 && a->ncache) {
            char waited[400] = "";
            int rc = cache_reclaim(a, cbytes, &p, waited, sizeof waited);
            if (rc != DT_OK) {
                snprintf(err, errlen, "allocating %s (%" PRIu64 " bytes) for "
                         "%s failed: %s; %s", dt_mem_fmt_bytes(req, bytes),
                         bytes, dt_mem_tag_name(tag),
                         why[0] ? why : "no reason given", waited);
                return rc;
            }
            if (p) {
                e = 0;
                fresh = 0;
            } else {
                why[0] = '\0';
                e = a->be.raw_alloc(a->be.ctx, cbytes, &p, why, sizeof why);
            }
        }
        if (e != 0 || !p) {
            /* in the planner's terms: what each tag holds, and what the
             * allocator itself keeps (class rounding, cached blocks) */
            char tags[400], res[32], cached[32];
            snprintf(err, errlen, "allocating %s (%" PRIu64 " bytes) for %s "
                     "failed: %s (in use: %s; reserved %s, %s of it cached)",
                     dt_mem_fmt_bytes(req, bytes), bytes, dt_mem_tag_name(tag),
                     why[0] ? why : "no reason given",
                     dt_mem_tally_in_use_text(&a->st.tally, tags, sizeof tags),
                     dt_mem_fmt_bytes(res, a->st.reserved),
                     dt_mem_fmt_bytes(cached, a->st.cached));
            return DT_ERR_NOMEM;
        }
        if (fresh) {
            a->st.raw_allocs++;
            a->st.reserved += cbytes;
        }
    }
    cuda_alloc_block_t blk = {.ptr = p, .bytes = bytes, .cbytes = cbytes,
                              .tag = tag};
    live_put(a->live, a->live_cap, &blk);
    a->live_used++;
    dt_mem_tally_add(&a->st.tally, tag, bytes);
    *out = p;
    return DT_OK;
}

int cuda_alloc_put(cuda_alloc_t *a, void *ptr, char *err, size_t errlen)
{
    static const char head[] = "waiting for device work that used the block";
    if (!ptr)
        return DT_OK;
    cuda_alloc_block_t *b = live_find(a, ptr);
    if (!b)
        return DT_ERR_NOT_FOUND;
    char why[160] = "";
    void *f = NULL;
    if (has_fences(a) && a->be.fence_new(a->be.ctx, &f, why, sizeof why) != 0) {
        snprintf(err, errlen, "cannot fence the freed block: %s; it stays "
                 "allocated", why[0] ? why : "no reason given");
        return DT_ERR_SYSTEM;
    }
    uint64_t cbytes = b->cbytes, bytes = b->bytes;
    int keep = cache_room(a, cbytes, a->st.tally.total_current - bytes);
    if (!keep && f) {
        /* back to the backend: only once the device is done with it */
        a->st.fence_waits++;
        int r = a->be.fence_wait(a->be.ctx, f, a->wait_ms, why, sizeof why);
        a->be.fence_free(a->be.ctx, f);
        f = NULL;
        if (r != 1) {
            char t[32];
            if (r == 0)
                snprintf(err, errlen, "%s: not done after %s; it stays "
                         "allocated", head, fmt_ms(t, a->wait_ms));
            else
                snprintf(err, errlen, "%s: %s; it stays allocated", head,
                         why[0] ? why : "no reason given");
            return r == 0 ? DT_ERR_TIMEOUT : DT_ERR_SYSTEM;
        }
    }
    dt_mem_tally_sub(&a->st.tally, b->tag, bytes);
    b->ptr = TOMBSTONE;
    if (keep) {
        a->cache[a->ncache++] = (cuda_alloc_block_t){.ptr = ptr, .cbytes = cbytes,
                                                     .fence = f};
        a->st.cached += cbytes;
    } else {
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
