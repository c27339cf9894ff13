/*
 * plugins/cuda/cuda_alloc.h - the cuda device's caching allocator: tagged
 * accounting (bytes and peaks per dt_mem_tag_t), an optional budget, and a
 * cache of freed blocks by size class, so that a training step that frees
 * and re-allocates the same buffers every unit (sharded strategies'
 * gathers, activations) calls cudaMalloc/cudaFree only in its first steps
 * (the first, and those where the host runs further ahead of the device
 * than before: see the fences below).
 *
 * Host-only C with no CUDA header: the memory itself comes from a backend
 * (function pointers), cudaMalloc/cudaFree in the plugin,
 * cudaHostAlloc/cudaFreeHost for pinned host memory, malloc/free in the
 * unit test (tests/unit/plugins/cuda/test_cuda_alloc.c), which checks the bookkeeping
 * on any machine.
 *
 * Size classes: a request is rounded up to a multiple of 512 bytes below
 * 1 MiB and of 2 MiB from there (PyTorch's small and large rounding), and a
 * freed block is reused only by a request of the same class, so the cache
 * never hands out a block much larger than asked for and never splits one.
 *
 * Stream-ordered reuse (fences, optional): a free does not wait for the
 * device.  With the backend's fence functions, a freed block goes into
 * the cache with a fence, which completes once all the device work queued
 * (on any stream) before the free has finished (no fence when none is
 * queued: the block is reusable at once); a block is handed out
 * again only once its fence has completed (a request whose class has only
 * pending blocks gets a fresh one from the backend), and a block goes back
 * to the backend only after its fence.  The host waits for fences only
 * under pressure, and never longer than `wait_ms` in all:
 *  - the budget would be exceeded by live + cached + new bytes, or the
 *    backend fails: first every cached block whose fence is done goes back
 *    to the backend (and a failed request is retried); if that is not
 *    enough, the allocator waits for the pending fences, reuses a block of
 *    the class if one is now free, else gives them all back and retries;
 *  - a freed block the cache cannot keep (caching off, or over the budget)
 *    is given back after waiting for its fence;
 *  - cuda_alloc_release_cached and cuda_alloc_destroy wait for the cached
 *    blocks' fences.
 * A fence not done within the bound fails the call with DT_ERR_TIMEOUT
 * ("waiting for device work that used freed blocks: not done after
 * 300 s ...") and its block is not given back (nor reused).  Without fence
 * functions (pinned memory, the unit test's plain backend), a freed block
 * is reusable at once and nothing waits: the backend orders the work
 * itself.  None of this has run on a GPU yet.
 *
 * Not thread safe: the caller holds a lock around every call (the fence
 * functions run under it too).
 */
#ifndef DT_CUDA_ALLOC_H
#define DT_CUDA_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "common/device/mem_tally.h"
#include "dtrain/tensor.h"

/* How long any wait for the device may take, in milliseconds (the
 * allocator's waits for fences, and the cuda device's synchronize,
 * stream_sync, event_sync and stream_destroy).  A bound, so that device
 * work stuck on a dead peer (an NCCL collective) fails a free, alloc or
 * sync with a message instead of hanging it forever.  300 s: the comm's
 * default timeout (launch.timeout, "seconds any collective may wait").
 * The device cannot tell a dead peer from a slow one (rank 0 writing a
 * checkpoint while the others already wait in the next collective), so a
 * shorter bound would fail runs that the comm still lets through. */
#define CUDA_WAIT_LIMIT_MS 300000u

/* Where memory comes from.  raw_alloc returns 0 and *out, or non-zero with
 * a reason (the backend's own error string) in err.
 *
 * Fences (optional: all four, or all NULL).  fence_new: 0 and in *out a
 * fence for the work queued so far, or NULL when none is pending (nothing
 * to wait for); non-zero with the reason in err when it cannot make one.
 * fence_done: 1 done, 0 pending, < 0 error (reason in err); never blocks.
 * fence_wait: 1 done, 0 still pending after timeout_ms (0: look once),
 * < 0 error.  fence_free: give the fence up, done or not. */
typedef struct cuda_alloc_backend {
    void *ctx;
    int (*raw_alloc)(void *ctx, uint64_t bytes, void **out, char *err,
                     size_t errlen);
    void (*raw_free)(void *ctx, void *ptr);
    int (*fence_new)(void *ctx, void **out, char *err, size_t errlen);
    int (*fence_done)(void *ctx, void *fence, char *err, size_t errlen);
    int (*fence_wait)(void *ctx, void *fence, uint64_t timeout_ms, char *err,
                      size_t errlen);
    void (*fence_free)(void *ctx, void *fence);
} cuda_alloc_backend_t;

/* A snapshot of the counters. */
typedef struct cuda_alloc_stats {
    dt_mem_tally_t tally;           /* bytes asked for, live, per tag and
                                     * in total, with their peaks */
    uint64_t reserved;              /* held from the backend: live blocks'
                                     * class sizes + cached blocks */
    uint64_t cached;                /* bytes in freed blocks kept for reuse
                                     * (fences pending or not) */
    uint64_t raw_allocs;            /* backend allocations made */
    uint64_t raw_frees;             /* backend frees made */
    uint64_t cache_hits;            /* requests served from the cache */
    uint64_t releases;              /* times cached blocks were given back */
    uint64_t fence_waits;           /* times the host waited for fences */
} cuda_alloc_stats_t;

typedef struct cuda_alloc_block cuda_alloc_block_t;

typedef struct cuda_alloc {
    cuda_alloc_backend_t be;
    uint64_t limit;  /* budget on st.tally.total_current (bytes asked for); 0: none */
    int caching;     /* 0: every free goes straight back to the backend */
    uint64_t wait_ms; /* bound on each call's waits for fences; init sets
                       * CUDA_WAIT_LIMIT_MS, the unit test less */
    cuda_alloc_stats_t st;
    cuda_alloc_block_t *live;  /* open-addressing table keyed by pointer */
    uint64_t live_cap;         /* power of two, or 0 */
    uint64_t live_used;        /* live + tombstones */
    cuda_alloc_block_t *cache; /* freed blocks, unordered */
    uint64_t ncache, cache_cap;
} cuda_alloc_t;

/* The size class of a request: what the backend is asked for. */
uint64_t cuda_alloc_class(uint64_t bytes);

/* Set up `a` (no backend call).  `limit`: budget in bytes, 0 for none. */
void cuda_alloc_init(cuda_alloc_t *a, const cuda_alloc_backend_t *be,
                     uint64_t limit, int caching);
/* Return every block, live or cached, to the backend, and free `a`'s own
 * memory.  Live blocks go back at once (the caller has finished the work
 * queued on them); cached ones after their fences (waiting up to wait_ms).
 * *nleaked and *leaked_bytes (either may be NULL) receive the live ones.
 * DT_OK; or DT_ERR_TIMEOUT / DT_ERR_SYSTEM when some cached blocks'
 * fences did not complete ("waiting for device work that used freed
 * blocks: not done after 300 s; 2 blocks (4.0 MiB) not freed"): those
 * blocks are left to the backend's owner (they are not freed), everything
 * else is torn down all the same. */
int cuda_alloc_destroy(cuda_alloc_t *a, uint64_t *nleaked,
                       uint64_t *leaked_bytes, char *err, size_t errlen);

/* `bytes` (0 gives the smallest class: a unique pointer) tagged `tag`.
 * DT_OK; DT_ERR_INVALID for a tag outside dt_mem_tag_t; DT_ERR_NOMEM over
 * the budget ("out of memory budget: allocating 3.0 MiB (3145728 bytes)
 * for grads would bring the total to ..., over memory_limit ... (in use:
 * params 1.0 MiB)") or when the backend fails even after the cache was
 * released ("allocating 3.0 MiB (3145728 bytes) for grads failed:
 * <backend's reason>"); DT_ERR_TIMEOUT when the cache had to be given
 * back and fences did not complete ("allocating ... for grads failed:
 * <backend's reason>; waiting for device work that used freed blocks: not
 * done after 300 s (1 block, 2.0 MiB, still pending)"; under the budget
 * "allocating ... for grads: waiting for ..."), DT_ERR_SYSTEM when a fence
 * failed.  The message goes to err. */
int cuda_alloc_get(cuda_alloc_t *a, uint64_t bytes, int tag, void **out,
                   char *err, size_t errlen);
/* Free a pointer cuda_alloc_get handed out: DT_OK, or DT_ERR_NOT_FOUND
 * when it did not (or it was freed already; err untouched); NULL is DT_OK.
 * With fences: DT_ERR_SYSTEM when no fence could be made ("cannot fence
 * the freed block: <reason>; it stays allocated"), and, for a block the
 * cache cannot keep, DT_ERR_TIMEOUT ("waiting for device work that used
 * the block: not done after 300 s; it stays allocated") or DT_ERR_SYSTEM
 * when its fence fails.  On any failure the block stays live (owned,
 * counted), so a later free or destroy can still give it back. */
int cuda_alloc_put(cuda_alloc_t *a, void *ptr, char *err, size_t errlen);
/* 1 when ptr is live in `a`. */
int cuda_alloc_owns(const cuda_alloc_t *a, const void *ptr);
/* Give every cached block back to the backend, after its fence (waiting
 * up to wait_ms in all).  DT_OK; DT_ERR_TIMEOUT ("waiting for device work
 * that used freed blocks: not done after 300 s; 2 blocks (4.0 MiB) kept in
 * the cache") or DT_ERR_SYSTEM: the blocks whose fences did not complete
 * stay cached, the others went back. */
int cuda_alloc_release_cached(cuda_alloc_t *a, char *err, size_t errlen);
/* Peaks := current. */
void cuda_alloc_reset_peaks(cuda_alloc_t *a);

#endif /* DT_CUDA_ALLOC_H */
