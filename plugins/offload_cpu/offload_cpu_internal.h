/*
 * plugins/offload_cpu/offload_cpu_internal.h - what the offload_cpu
 * plugin's two files share: the instance, its buffers and requests, and
 * the worker that runs transfers in the background.
 *
 * Locking: one mutex (o->mu) guards the queue, every request's state and
 * every buffer's count of transfers in flight.  The worker copies with the
 * mutex released; the buffer it copies to or from cannot go away under it
 * because free() waits until the buffer's `pending` count is zero.
 */
#ifndef DT_OFFLOAD_CPU_INTERNAL_H
#define DT_OFFLOAD_CPU_INTERNAL_H

#include <pthread.h>
#include <stdio.h>
#include <stdint.h>

#include "dtrain/dtrain.h"

#define OC_BUF_MAGIC 0x4f434246u /* "OCBF" */
#define OC_REQ_MAGIC 0x4f435251u /* "OCRQ" */

/* Default bound of a wait when neither the call nor init gives one. */
#define OC_DEFAULT_TIMEOUT_MS 300000

enum { OC_STORE = 0, OC_LOAD = 1 };

struct dt_offload_buf {
    uint32_t magic;
    uint32_t id;               /* 1, 2, ... in allocation order (messages) */
    void *mem;                 /* pinned host memory from host_alloc */
    uint64_t bytes;
    int32_t tag;               /* what the caller said it holds */
    uint32_t pending;          /* transfers queued or running on it */
    struct dt_offload_buf *prev, *next; /* the instance's live buffers */
};

struct dt_offload_req {
    uint32_t magic;
    int32_t op;                /* OC_STORE / OC_LOAD */
    dt_offload_buf_t *buf;
    uint64_t offset, bytes;    /* in the buffer */
    void *ext;                 /* the caller's memory (src or dst) */
    int32_t space;             /* dt_mem_space_t of ext */
    int32_t done;              /* the worker finished it (status set) */
    int32_t status;
    int32_t refs;              /* the caller's and the worker's */
    dt_event_t *ev;            /* device side: the caller's stream at store/load */
    struct dt_offload_req *next; /* the queue */
    char msg[256];             /* why it failed (the worker's thread has
                                * its own error buffer; wait() sets it) */
};

struct dt_offload {
    const dt_host_v1_t *host;
    int32_t rank;
    int64_t timeout_ms;        /* default bound of every wait */
    uint64_t capacity;         /* bytes; 0 = unbounded */
    uint64_t used;             /* bytes in live buffers */
    uint32_t n_bufs, next_id;
    const dt_device_ops_v1_t *dev_ops;
    dt_device_t *dev;
    dt_stream_t *stream;       /* the worker's, for device-side copies */

    pthread_mutex_t mu;
    pthread_cond_t work;       /* queue not empty, or stop */
    pthread_cond_t done;       /* a request finished */
    pthread_t worker;
    int32_t worker_started, stop;
    dt_offload_req_t *head, *tail; /* queued, oldest first */
    dt_offload_buf_t *bufs;    /* live buffers */
};

/* ------------------------------------------------ offload_cpu_worker.c */

/* Start / stop (after draining the queue) the worker thread. */
int oc_worker_start(dt_offload_t *o);
void oc_worker_stop(dt_offload_t *o);
/* Queue a transfer; the request is the caller's until it waits on it. */
int oc_submit(dt_offload_t *o, int op, dt_offload_buf_t *buf, uint64_t offset, void *ext,
              uint64_t bytes, int space, dt_stream_t *stream, dt_offload_req_t **req);
/* Bounded wait for `req` (timeout_ms < 0: the default); drops the caller's
 * reference whatever the outcome. */
int oc_wait(dt_offload_t *o, dt_offload_req_t *req, int64_t timeout_ms);
/* Wait, with o->mu held, until `*count` is zero or `timeout_ms` passes:
 * DT_OK or DT_ERR_TIMEOUT. */
int oc_wait_zero_locked(dt_offload_t *o, const uint32_t *count, int64_t timeout_ms);

/* "optimizer state (buffer #3, 4096 bytes)" into out. */
static inline const char *oc_buf_name(const dt_offload_buf_t *b, char *out, size_t n)
{
    snprintf(out, n, "buffer #%u (%llu bytes of %s)", b->id, (unsigned long long)b->bytes,
             dt_mem_tag_name(b->tag));
    return out;
}

#endif /* DT_OFFLOAD_CPU_INTERNAL_H */
