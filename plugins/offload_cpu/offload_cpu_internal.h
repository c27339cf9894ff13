/*
 * plugins/offload_cpu/offload_cpu_internal.h - the offload_cpu instance
 * and its buffers.  Transfers run on the tiers' shared offload queue
 * (plugins/common/offload/offload_queue.h): one worker thread, bounded waits; the
 * buffers are kept on the tiers' shared list (plugins/common/offload/offload_bufs.h).
 *
 * Locking: the queue's mutex (o->q.mu) guards the live-buffer list, the
 * byte counts and every buffer's count of transfers in flight.  The worker
 * copies with the mutex released; the buffer it copies to or from cannot
 * go away under it because free() waits until the buffer's `pending`
 * count is zero.
 */
#ifndef DT_OFFLOAD_CPU_INTERNAL_H
#define DT_OFFLOAD_CPU_INTERNAL_H

#include <stdint.h>
#include <stdio.h>

#include "dtrain/dtrain.h"
#include "common/offload/offload_bufs.h"
#include "common/offload/offload_queue.h"

#define OC_BUF_MAGIC 0x4f434246u /* "OCBF" */

struct dt_offload_buf {
    offload_buf_t ob;            /* base first: id, bytes, tag, pending */
    void *mem;                 /* pinned host memory from host_alloc */
};

struct dt_offload {
    const dt_offload_ops_v1_t *ops; /* first: the table that made it (dtrain/offload.h) */
    offload_queue_t q;                 /* host, rank, device, the worker */
    offload_bufs_t bufs;         /* live buffers, capacity (0 = unbounded) */
};

/* "buffer #3 (4096 bytes of optimizer)" into out. */
static inline const char *oc_buf_name(const dt_offload_buf_t *b, char *out, size_t n)
{
    snprintf(out, n, "buffer #%u (%llu bytes of %s)", b->ob.id,
             (unsigned long long)b->ob.bytes, dt_mem_tag_name(b->ob.tag));
    return out;
}

#endif /* DT_OFFLOAD_CPU_INTERNAL_H */
