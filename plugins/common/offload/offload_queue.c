/*
 * plugins/common/offload/offload_queue.c - transfers in the background for
 * offload tiers: store and load queue a request, one worker thread per
 * instance runs the queue oldest first through the tier's `run` (or the
 * tier's own loop takes requests and finishes them as they complete), and
 * wait blocks on the request with a deadline.  See
 * plugins/common/offload/offload_queue.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/offload/offload_queue.h"

#define OQ_REQ_MAGIC 0x4f515251u /* "OQRQ" */

static void req_unref_locked(offload_queue_t *q, offload_req_t *r)
{
    if (--r->refs > 0)
        return;
    if (r->ev)
        dt_device_ops(q->dev)->event_destroy(q->dev, r->ev);
    r->magic = 0;
    free(r);
}

int offload_queue_device_copy(offload_queue_t *q, offload_req_t *r, uint64_t ext_off, void *host,
                              uint64_t bytes)
{
    const dt_device_ops_v1_t *d = dt_device_ops(q->dev);
    char *dev = (char *)r->ext + ext_off;
    const char *step = "stream_wait_event";
    int rc = d->stream_wait_event(q->dev, q->stream, r->ev);
    if (rc == DT_OK) {
        step = "memcpy_async";
        rc = r->op == OFFLOAD_QUEUE_STORE
                 ? d->memcpy_async(q->dev, host, dev, bytes, DT_COPY_D2H, q->stream)
                 : d->memcpy_async(q->dev, dev, host, bytes, DT_COPY_H2D, q->stream);
    }
    if (rc == DT_OK) {
        step = "stream_sync";
        rc = d->stream_sync(q->dev, q->stream);
    }
    if (rc != DT_OK)
        snprintf(r->msg, sizeof r->msg,
                 "%s of %llu bytes at offset %llu of %s: the device's %s failed (%s)",
                 r->op == OFFLOAD_QUEUE_STORE ? "store" : "load", (unsigned long long)r->bytes,
                 (unsigned long long)r->offset, r->what, step, dt_status_name(rc));
    return rc;
}

offload_req_t *offload_queue_take(offload_queue_t *q, int block)
{
    pthread_mutex_lock(&q->mu);
    while (block && !q->head && !q->stop)
        pthread_cond_wait(&q->work, &q->mu);
    offload_req_t *r = q->head;
    if (r) {
        q->head = r->next;
        if (!q->head)
            q->tail = NULL;
        r->next = NULL;
    }
    pthread_mutex_unlock(&q->mu);
    return r;
}

void offload_queue_finish(offload_queue_t *q, offload_req_t *r, int status)
{
    pthread_mutex_lock(&q->mu);
    r->status = status;
    r->done = 1;
    (*r->pending)--;
    req_unref_locked(q, r);
    pthread_cond_broadcast(&q->done);
    pthread_mutex_unlock(&q->mu);
}

static void *worker_main(void *arg)
{
    offload_queue_t *q = arg;
    if (q->loop) {
        q->loop(q->ctx, q);
        return NULL;
    }
    offload_req_t *r;
    while ((r = offload_queue_take(q, 1)) != NULL)
        offload_queue_finish(q, r, q->run(q->ctx, q, r));
    return NULL;
}

static int start(offload_queue_t *q, const dt_host_v1_t *host, int32_t rank, int64_t timeout_ms,
                 dt_device_t *dev, offload_queue_run_fn run,
                 offload_queue_loop_fn loop, void *ctx)
{
    memset(q, 0, sizeof *q);
    *q = (offload_queue_t){.host = host,
                           .rank = rank,
                           .timeout_ms =
                               timeout_ms > 0 ? timeout_ms : OFFLOAD_QUEUE_DEFAULT_TIMEOUT_MS,
                           .dev = dev,
                           .run = run,
                           .loop = loop,
                           .ctx = ctx};
    int rc = dt_device_ops(dev)->stream_create(dev, &q->stream);
    if (rc != DT_OK) {
        host->log(host, DT_LOG_ERROR, "creating the transfer stream failed");
        return rc;
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->work, NULL);
    pthread_cond_init(&q->done, &ca);
    pthread_condattr_destroy(&ca);
    int e = pthread_create(&q->worker, NULL, worker_main, q);
    if (e != 0) {
        offload_queue_stop(q);
        return host->set_error(host, DT_ERR_SYSTEM, "starting the transfer thread: %s",
                               strerror(e));
    }
    q->started = 1;
    return DT_OK;
}

int offload_queue_start(offload_queue_t *q, const dt_host_v1_t *host, int32_t rank,
                        int64_t timeout_ms, dt_device_t *dev,
                        offload_queue_run_fn run, void *ctx)
{
    return start(q, host, rank, timeout_ms, dev, run, NULL, ctx);
}

int offload_queue_start_loop(offload_queue_t *q, const dt_host_v1_t *host, int32_t rank,
                             int64_t timeout_ms, dt_device_t *dev, offload_queue_loop_fn loop,
                             void *ctx)
{
    return start(q, host, rank, timeout_ms, dev, NULL, loop, ctx);
}

void offload_queue_stop(offload_queue_t *q)
{
    if (!q->host)
        return;
    if (q->started) {
        pthread_mutex_lock(&q->mu);
        q->stop = 1;
        pthread_cond_signal(&q->work);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->worker, NULL);
        q->started = 0;
    }
    if (q->stream) {
        dt_device_ops(q->dev)->stream_destroy(q->dev, q->stream);
        pthread_cond_destroy(&q->work);
        pthread_cond_destroy(&q->done);
        pthread_mutex_destroy(&q->mu);
    }
    memset(q, 0, sizeof *q);
}

static void deadline_after(struct timespec *ts, int64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(ms / 1000);
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static int64_t effective_timeout(const offload_queue_t *q, int64_t timeout_ms)
{
    return timeout_ms >= 0 ? timeout_ms : q->timeout_ms;
}

int offload_queue_wait_zero_locked(offload_queue_t *q, const uint32_t *count, int64_t timeout_ms)
{
    struct timespec ts;
    deadline_after(&ts, effective_timeout(q, timeout_ms));
    while (*count > 0)
        if (pthread_cond_timedwait(&q->done, &q->mu, &ts) == ETIMEDOUT && *count > 0)
            return DT_ERR_TIMEOUT;
    return DT_OK;
}

int offload_queue_submit(offload_queue_t *q, int op, void *buf, uint32_t *pending,
                         uint64_t buf_bytes, const char *what, uint64_t offset, void *ext,
                         uint64_t bytes, int space, dt_stream_t *stream, dt_offload_req_t **req)
{
    const dt_host_v1_t *host = q->host;
    const char *dir = op == OFFLOAD_QUEUE_STORE ? "store" : "load";
    *req = NULL;
    if (offset > buf_bytes || bytes > buf_bytes - offset)
        return host->set_error(host, DT_ERR_INVALID, "%s: bytes [%llu, +%llu) are outside %s",
                               dir, (unsigned long long)offset, (unsigned long long)bytes,
                               what);
    if (!ext && bytes > 0)
        return host->set_error(host, DT_ERR_INVALID, "%s: %s pointer is NULL (%s)", dir,
                               op == OFFLOAD_QUEUE_STORE ? "source" : "destination", what);
    if (space != DT_MEM_HOST && space != DT_MEM_DEVICE)
        return host->set_error(host, DT_ERR_INVALID,
                               "%s: space %d is neither host (%d) nor device (%d) memory", dir,
                               space, DT_MEM_HOST, DT_MEM_DEVICE);
    offload_req_t *r = calloc(1, sizeof *r);
    if (!r)
        return host->set_error(host, DT_ERR_NOMEM, "%s: out of memory for a request", dir);
    *r = (offload_req_t){.magic = OQ_REQ_MAGIC, .op = op, .buf = buf, .pending = pending,
                       .offset = offset, .bytes = bytes, .ext = ext, .space = space,
                       .refs = 2};
    snprintf(r->what, sizeof r->what, "%s", what);
    if (space == DT_MEM_DEVICE) {
        /* the copy follows what the caller queued on `stream` so far */
        int rc = dt_device_ops(q->dev)->event_create(q->dev, &r->ev);
        if (rc == DT_OK)
            rc = dt_device_ops(q->dev)->event_record(q->dev, r->ev, stream);
        if (rc != DT_OK) {
            if (r->ev)
                dt_device_ops(q->dev)->event_destroy(q->dev, r->ev);
            free(r);
            host->log(host, DT_LOG_ERROR, "%s of %llu bytes to %s: ordering after the caller's "
                      "stream failed", dir, (unsigned long long)bytes, what);
            return rc;
        }
    }
    pthread_mutex_lock(&q->mu);
    (*pending)++;
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    pthread_cond_signal(&q->work);
    pthread_mutex_unlock(&q->mu);
    *req = (dt_offload_req_t *)r;
    return DT_OK;
}

int offload_queue_wait(offload_queue_t *q, dt_offload_req_t *req, int64_t timeout_ms)
{
    const dt_host_v1_t *host = q->host;
    offload_req_t *r = (offload_req_t *)req;
    if (!r || r->magic != OQ_REQ_MAGIC)
        return host->set_error(host, DT_ERR_INVALID,
                               "wait: not a request of this tier, or already waited on (%p)",
                               (void *)r);
    int64_t ms = effective_timeout(q, timeout_ms);
    struct timespec ts;
    deadline_after(&ts, ms);
    pthread_mutex_lock(&q->mu);
    while (!r->done)
        if (pthread_cond_timedwait(&q->done, &q->mu, &ts) == ETIMEDOUT && !r->done)
            break;
    int done = r->done, status = r->status;
    char msg[sizeof r->msg], what[sizeof r->what];
    snprintf(msg, sizeof msg, "%s", r->msg);
    snprintf(what, sizeof what, "%s", r->what);
    const char *dir = r->op == OFFLOAD_QUEUE_STORE ? "store" : "load";
    uint64_t bytes = r->bytes, offset = r->offset;
    r->magic = 0; /* the caller's handle is gone either way */
    req_unref_locked(q, r);
    pthread_mutex_unlock(&q->mu);
    if (!done)
        return host->set_error(host, DT_ERR_TIMEOUT,
                               "rank %d: wait: %s of %llu bytes at offset %llu of %s not done "
                               "after %lld ms", q->rank, dir, (unsigned long long)bytes,
                               (unsigned long long)offset, what, (long long)ms);
    if (status != DT_OK)
        return host->set_error(host, status, "rank %d: %s", q->rank, msg);
    return DT_OK;
}

int offload_queue_check_init(const dt_host_v1_t *host, const dt_offload_init_v1_t *args,
                             dt_offload_t **out, const char *why_device, dt_offload_init_v1_t *a)
{
    if (!host || !out)
        return DT_ERR_INVALID;
    *out = NULL;
    int rc = dt_args_read(host, "init args", a, sizeof *a, args, DT_OFFLOAD_INIT_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a->dev)
        return host->set_error(host, DT_ERR_INVALID, "init: no device (dev NULL)%s",
                               why_device ? why_device : "");
    return DT_OK;
}
