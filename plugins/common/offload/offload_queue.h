/*
 * plugins/common/offload/offload_queue.h - the asynchronous half every
 * offload tier shares (offload.h's store / load / wait): requests queued by
 * the thread that drives the instance, run oldest first by one worker
 * thread through the tier's own `run` function (a memcpy, a device copy,
 * file I/O), and waited on with a deadline.
 *
 * A tier that keeps several requests running at once (offload_nvme: one
 * io_uring ring kept full across request boundaries) starts the queue with
 * its own worker loop instead (offload_queue_start_loop): it takes requests
 * with offload_queue_take as it has room for them and ends each with
 * offload_queue_finish when its last piece completes, in whatever order
 * they complete.
 *
 * A request has two references, the caller's (dropped by wait, whatever
 * the outcome, as the ABI says) and the worker's (dropped when `run`
 * returns, or by offload_queue_finish): a wait that times out frees nothing the
 * worker still uses.
 * Each buffer of the tier keeps a count of its transfers queued or
 * running (`pending`, guarded by the queue's mutex), so freeing it can
 * wait for them.  A device-side transfer is ordered after the caller's
 * stream by an event recorded at submit time, which `run` makes the
 * queue's own stream wait for (offload_queue_device_copy).
 *
 * In-tree only, not installed: part of dtrain_common_offload, the static,
 * hidden-visibility library the in-tree offload tiers link
 * (plugins/common/CMakeLists.txt); it changes with them and follows the SDK
 * helpers' conventions (dtrain/sdk_helpers.h).
 */
#ifndef DT_COMMON_OFFLOAD_QUEUE_H
#define DT_COMMON_OFFLOAD_QUEUE_H

#include <pthread.h>
#include <stdint.h>

#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/offload.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { OFFLOAD_QUEUE_STORE = 0, OFFLOAD_QUEUE_LOAD = 1 };

/* Room for a request's description and its failure: a whole path (Linux's
 * PATH_MAX, 4096, spelled out so the header needs no feature macros) and
 * the words around it. */
#define OFFLOAD_QUEUE_WHAT_MAX (4096 + 128)
#define OFFLOAD_QUEUE_MSG_MAX (4096 + 512)

/* Default bound of a wait when neither the call nor init gives one. */
#define OFFLOAD_QUEUE_DEFAULT_TIMEOUT_MS 300000

typedef struct offload_queue offload_queue_t;

/* A transfer.  The tier's dt_offload_req_t is this struct (the plugin
 * defines `struct dt_offload_req { offload_req_t r; }` or casts). */
typedef struct offload_req {
    uint32_t magic;
    int32_t op;                /* OFFLOAD_QUEUE_STORE / OFFLOAD_QUEUE_LOAD */
    void *buf;                 /* the tier's buffer */
    uint32_t *pending;         /* its count of transfers in flight */
    uint64_t offset, bytes;    /* in the buffer */
    void *ext;                 /* the caller's memory (src or dst) */
    int32_t space;             /* dt_mem_space_t of ext */
    int32_t done;              /* run finished (status set) */
    int32_t status;
    int32_t refs;              /* the caller's and the worker's */
    dt_event_t *ev;            /* device side: the caller's stream at submit */
    struct offload_req *next;    /* the queue */
    /* Sized for a whole path: a tier names its file here, and a message
     * that cuts the name off tells the user nothing. */
    char what[OFFLOAD_QUEUE_WHAT_MAX]; /* "file '/p/x.bin' (4096 bytes of optimizer)" */
    char msg[OFFLOAD_QUEUE_MSG_MAX];   /* why it failed (the worker's thread has its
                                * own error buffer; wait sets it) */
} offload_req_t;

/* The tier's transfer: DT_OK, or a status with the reason in r->msg. */
typedef int (*offload_queue_run_fn)(void *ctx, offload_queue_t *q, offload_req_t *r);
/* A tier's own worker loop (offload_queue_start_loop): takes every request with
 * offload_queue_take, ends each with offload_queue_finish, and returns once a blocking
 * offload_queue_take says the queue stopped (with nothing of its own running). */
typedef void (*offload_queue_loop_fn)(void *ctx, offload_queue_t *q);

struct offload_queue {
    const dt_host_v1_t *host;
    int32_t rank;
    int64_t timeout_ms;        /* default bound of every wait */
    dt_device_t *dev;
    dt_stream_t *stream;       /* the worker's, for device-side copies */
    offload_queue_run_fn run;          /* one request at a time, or */
    offload_queue_loop_fn loop;        /* the tier's own loop */
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t work;       /* queue not empty, or stop */
    pthread_cond_t done;       /* a request finished */
    pthread_t worker;
    int32_t started, stop;
    offload_req_t *head, *tail;
};

/* A tier's init checks, the same words in every tier: host and out
 * non-NULL (DT_ERR_INVALID without a message: nowhere to put one), *out
 * set to NULL, args read into *a under the growth rule (dt_args_read,
 * "init args ..."), and a device given ("init: no device (dev NULL)"
 * followed by `why_device`, "" or the tier's reason). */
int offload_queue_check_init(const dt_host_v1_t *host, const dt_offload_init_v1_t *args,
                             dt_offload_t **out, const char *why_device, dt_offload_init_v1_t *a);

/* Set up `q` and start its worker (a stream of the device for device-side
 * copies).  timeout_ms <= 0: OFFLOAD_QUEUE_DEFAULT_TIMEOUT_MS. */
int offload_queue_start(offload_queue_t *q, const dt_host_v1_t *host, int32_t rank,
                        int64_t timeout_ms, dt_device_t *dev,
                        offload_queue_run_fn run, void *ctx);
/* The same with the tier's own worker loop instead of `run`. */
int offload_queue_start_loop(offload_queue_t *q, const dt_host_v1_t *host, int32_t rank,
                             int64_t timeout_ms, dt_device_t *dev, offload_queue_loop_fn loop,
                             void *ctx);
/* For a loop: the oldest queued request, taken off the queue.  block = 0:
 * NULL when none is queued; block = 1: waits for one, NULL once the queue
 * is stopping and empty (the loop then returns).  The worker idles here;
 * callers' waits are bounded on their side. */
offload_req_t *offload_queue_take(offload_queue_t *q, int block);
/* For a loop: `r` ran to its end with `status` (the reason in r->msg):
 * its waiter wakes, its buffer's pending count drops, the worker's
 * reference goes.  r must not be touched afterwards. */
void offload_queue_finish(offload_queue_t *q, offload_req_t *r, int status);
/* Let the worker drain the queue, then stop it and free what start made. */
void offload_queue_stop(offload_queue_t *q);
/* Queue a transfer of `bytes` between the caller's `ext` (in `space`) and
 * [offset, offset + bytes) of the tier's buffer `buf` of `buf_bytes`, whose
 * pending count is `pending`; `what` names the buffer in messages.  The
 * checks and their messages are the ABI's: bounds, NULL pointer, space. */
int offload_queue_submit(offload_queue_t *q, int op, void *buf, uint32_t *pending,
                         uint64_t buf_bytes, const char *what, uint64_t offset, void *ext,
                         uint64_t bytes, int space, dt_stream_t *stream, dt_offload_req_t **req);
/* Bounded wait for `req` (timeout_ms < 0: the default); drops the caller's
 * reference whatever the outcome. */
int offload_queue_wait(offload_queue_t *q, dt_offload_req_t *req, int64_t timeout_ms);
/* With q->mu held: wait until *count is zero or timeout_ms (< 0: the
 * default) passes.  DT_OK or DT_ERR_TIMEOUT. */
int offload_queue_wait_zero_locked(offload_queue_t *q, const uint32_t *count, int64_t timeout_ms);
/* For `run`: copy `bytes` between device memory r->ext + ext_off and host
 * memory `host`, on the queue's stream after the caller's (store: D2H
 * into host; load: H2D from host); blocking.  DT_OK, or the status with
 * r->msg set. */
int offload_queue_device_copy(offload_queue_t *q, offload_req_t *r, uint64_t ext_off, void *host,
                              uint64_t bytes);

#ifdef __cplusplus
}
#endif
#endif /* DT_COMMON_OFFLOAD_QUEUE_H */
