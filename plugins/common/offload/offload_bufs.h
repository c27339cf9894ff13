/*
 * plugins/common/offload/offload_bufs.h - the buffers an offload tier
 * holds, kept the same way by every tier (offload.h's alloc / free /
 * capacity and the checks store and load make): a live list with a count of
 * bytes held against the tier's `capacity`, each buffer marked with the
 * tier's magic while it lives (a pointer from elsewhere, or one freed, is
 * refused by name), numbered in allocation order, and freed only once its
 * transfers (offload_queue.h's `pending` count) are done, within the
 * queue's bound.
 *
 * A tier puts offload_buf_t first in its `struct dt_offload_buf` and adds
 * what is its own (memory, a file); the list calls the tier's `release` to
 * give that back when a buffer goes.  The list lives beside the tier's
 * offload queue (plugins/common/offload/offload_queue.h), whose mutex
 * guards it, whose host and rank name errors and whose timeout bounds the
 * waits.
 *
 * Thread safety: as offload.h's, one thread drives the list (alloc, free,
 * finalize); the queue's worker only counts transfers down.
 *
 * In-tree only, not installed: part of dtrain_common_offload, the static,
 * hidden-visibility library the in-tree offload tiers link
 * (plugins/common/CMakeLists.txt); it changes with them and follows the SDK
 * helpers' conventions (dtrain/sdk_helpers.h).
 */
#ifndef DT_COMMON_OFFLOAD_BUFS_H
#define DT_COMMON_OFFLOAD_BUFS_H

#include <stdint.h>

#include "common/offload/offload_queue.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The part of a buffer every tier keeps (first in the tier's struct). */
typedef struct offload_buf {
    uint32_t magic;            /* the list's while live, 0 once freed */
    uint32_t id;               /* 1, 2, ... in allocation order (messages) */
    uint64_t bytes;            /* what the caller asked for */
    uint64_t held;             /* bytes counted against the capacity:
                                * `bytes` rounded up to the tier's unit */
    int32_t tag;               /* dt_mem_tag_t: what the caller said it holds */
    uint32_t pending;          /* transfers queued or running (q->mu) */
    struct offload_buf *prev, *next;
} offload_buf_t;

/* The tier's part of releasing `b` (its memory, its file) and b itself;
 * called with b already off the list and unmarked. */
typedef void (*offload_bufs_release_fn)(void *ctx, offload_buf_t *b);

typedef struct offload_bufs {
    offload_queue_t *q;                /* the tier's queue: mutex, host, rank, bound */
    uint32_t magic;            /* the tier's mark of a live buffer */
    const char *section;       /* config table, "offload_cpu" (messages) */
    const char *unit;          /* what a buffer is, plural: "buffers", "files" */
    uint64_t capacity;         /* bytes; 0 = unbounded */
    uint64_t used;             /* bytes held by live buffers */
    uint32_t n, next_id;
    offload_buf_t *head;         /* newest first */
    offload_bufs_release_fn release;
    void *ctx;
} offload_bufs_t;

/* An empty list of a tier whose queue is `q` (started or not: only its
 * host and rank are used until buffers exist). */
void offload_bufs_init(offload_bufs_t *l, offload_queue_t *q, uint32_t magic, const char *section,
                       const char *unit, uint64_t capacity, offload_bufs_release_fn release,
                       void *ctx);
/* alloc's checks, in order: `tag` is a dt_mem_tag_t (DT_ERR_INVALID);
 * `bytes` rounded up to a multiple of `align` (>= 1) does not overflow;
 * and fits the capacity with what is held (DT_ERR_NOMEM, naming the
 * bytes, the tag, the capacity and what is in use).  *held: the rounded
 * bytes. */
int offload_bufs_check(offload_bufs_t *l, uint64_t bytes, uint64_t align, int tag, uint64_t *held);
/* Fill b's common part (b zeroed by the tier) and number it; not yet
 * live: the tier sets up its own part, then links it. */
void offload_bufs_prepare(offload_bufs_t *l, offload_buf_t *b, uint64_t bytes, uint64_t held,
                          int tag);
/* b joins the live buffers (marked, its bytes counted). */
void offload_bufs_link(offload_bufs_t *l, offload_buf_t *b);
/* Whether `buf` is a live buffer of this list; if not, DT_ERR_INVALID
 * with "<op>: <pointer> is not a buffer of this tier (or was freed)". */
int offload_bufs_live(offload_bufs_t *l, const void *buf, const char *op);
/* offload.h's free: NULL is fine; refuses what is not live; waits (the
 * queue's bound) for b's transfers, then releases it.  `name` names b in
 * the timeout's error ("rank 1: free: <name> still has transfers running
 * after 150 ms; not freed"), and b stays held. */
int offload_bufs_free(offload_bufs_t *l, offload_buf_t *b, const char *name);
/* finalize's first half: wait (the queue's bound, the queue running) for
 * every live buffer's transfers.  DT_OK, or DT_ERR_TIMEOUT: the caller
 * then leaves everything allocated rather than free it under a transfer. */
int offload_bufs_drain(offload_bufs_t *l);
/* finalize's second half: release every live buffer (none may have a
 * transfer left: after offload_bufs_drain, or with the worker stopped). */
void offload_bufs_release_all(offload_bufs_t *l);
/* Bytes held and buffers live now. */
void offload_bufs_usage(offload_bufs_t *l, uint64_t *used, uint32_t *n);

#ifdef __cplusplus
}
#endif
#endif /* DT_COMMON_OFFLOAD_BUFS_H */
