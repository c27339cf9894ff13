/*
 * plugins/cuda/cuda_alloc.h - the cuda device's caching allocator: tagged
 * accounting (bytes and peaks per dt_mem_tag_t), an optional budget, and a
 * cache of freed blocks by size class, so that a training step that frees
 * and re-allocates the same buffers every unit (sharded strategies'
 * gathers, activations) calls cudaMalloc/cudaFree only in its first step.
 *
 * Host-only C with no CUDA header: the memory itself comes from a backend
 * (two function pointers), cudaMalloc/cudaFree in the plugin,
 * cudaHostAlloc/cudaFreeHost for pinned host memory, malloc/free in the
 * unit test (tests/unit/test_cuda_alloc.c), which checks the bookkeeping
 * on any machine.
 *
 * Size classes: a request is rounded up to a multiple of 512 bytes below
 * 1 MiB and of 2 MiB from there (PyTorch's small and large rounding), and a
 * freed block is reused only by a request of the same class, so the cache
 * never hands out a block much larger than asked for and never splits one.
 * Pressure: when the backend fails, or the budget would be exceeded by
 * live + cached + new bytes, every cached block is returned to the backend
 * and the request retried once.
 *
 * Not thread safe: the caller holds a lock around every call.
 */
#ifndef DT_CUDA_ALLOC_H
#define DT_CUDA_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/sdk/mem_tally.h"
#include "dtrain/tensor.h"

/* Where memory comes from.  raw_alloc returns 0 and *out, or non-zero with
 * a reason (the backend's own error string) in err. */
typedef struct cuda_alloc_backend {
    void *ctx;
    int (*raw_alloc)(void *ctx, uint64_t bytes, void **out, char *err,
                     size_t errlen);
    void (*raw_free)(void *ctx, void *ptr);
} cuda_alloc_backend_t;

/* A snapshot of the counters. */
typedef struct cuda_alloc_stats {
    dt_mem_tally_t tally;           /* bytes asked for, live, per tag and
                                     * in total, with their peaks */
    uint64_t reserved;              /* held from the backend: live blocks'
                                     * class sizes + cached blocks */
    uint64_t cached;                /* bytes in freed blocks kept for reuse */
    uint64_t raw_allocs;            /* backend allocations made */
    uint64_t raw_frees;             /* backend frees made */
    uint64_t cache_hits;            /* requests served from the cache */
    uint64_t releases;              /* times the cache was emptied */
} cuda_alloc_stats_t;

typedef struct cuda_alloc_block cuda_alloc_block_t;

typedef struct cuda_alloc {
    cuda_alloc_backend_t be;
    uint64_t limit;  /* budget on st.tally.total_current (bytes asked for); 0: none */
    int caching;     /* 0: every free goes straight back to the backend */
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
/* Return every block, live or cached, to the backend; *nleaked and
 * *leaked_bytes (either may be NULL) receive the live ones. */
void cuda_alloc_destroy(cuda_alloc_t *a, uint64_t *nleaked,
                        uint64_t *leaked_bytes);

/* `bytes` (0 gives the smallest class: a unique pointer) tagged `tag`.
 * DT_OK; DT_ERR_INVALID for a tag outside dt_mem_tag_t; DT_ERR_NOMEM over
 * the budget ("out of memory budget: allocating 3.0 MiB (3145728 bytes)
 * for grads would bring the total to ..., over memory_limit ... (in use:
 * params 1.0 MiB)") or when the backend fails even after the cache was
 * released ("allocating 3.0 MiB for grads failed: <backend's reason>").
 * The message goes to err. */
int cuda_alloc_get(cuda_alloc_t *a, uint64_t bytes, int tag, void **out,
                   char *err, size_t errlen);
/* Free a pointer cuda_alloc_get handed out: DT_OK, or DT_ERR_NOT_FOUND
 * when it did not (or it was freed already); NULL is DT_OK. */
int cuda_alloc_put(cuda_alloc_t *a, void *ptr);
/* 1 when ptr is live in `a`. */
int cuda_alloc_owns(const cuda_alloc_t *a, const void *ptr);
/* Give every cached block back to the backend. */
void cuda_alloc_release_cached(cuda_alloc_t *a);
/* Peaks := current. */
void cuda_alloc_reset_peaks(cuda_alloc_t *a);

#endif /* DT_CUDA_ALLOC_H */
