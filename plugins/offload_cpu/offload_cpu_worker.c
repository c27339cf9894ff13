/*
 * plugins/offload_cpu/offload_cpu_worker.c - transfers in the background:
 * store and load queue a request, one worker thread per instance runs the
 * queue oldest first (memcpy for host memory, the device's memcpy_async on
 * the worker's own stream for device memory), and wait blocks on the
 * request with a deadline.
 *
 * A request has two references, the caller's (dropped by wait, whatever
 * the outcome, as the ABI says) and the worker's (dropped when the copy is
 * done): a wait that times out frees nothing the worker still uses.
 * A device-side copy is ordered after the caller's stream by an event
 * recorded there at submit time, so the caller may keep queueing work.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "offload_cpu_internal.h"

static void req_unref_locked(dt_offload_t *o, dt_offload_req_t *r)
{
    if (--r->refs > 0)
        return;
    if (r->ev)
        o->dev_ops->event_destroy(o->dev, r->ev);
    r->magic = 0;
    free(r);
}

/* The copy itself, with the mutex released.  DT_OK, or a status with the
 * reason in r->msg. */
static int run_copy(dt_offload_t *o, dt_offload_req_t *r)
{
    char *tier = (char *)r->buf->mem + r->offset;
    const char *dir = r->op == OC_STORE ? "store" : "load";
    if (r->space == DT_MEM_HOST) {
        if (r->op == OC_STORE)
            memcpy(tier, r->ext, r->bytes);
        else
            memcpy(r->ext, tier, r->bytes);
        return DT_OK;
    }
    const dt_device_ops_v1_t *d = o->dev_ops;
    const char *step = "stream_wait_event";
    int rc = d->stream_wait_event(o->dev, o->stream, r->ev);
    if (rc == DT_OK) {
        step = "memcpy_async";
        rc = r->op == OC_STORE
                 ? d->memcpy_async(o->dev, tier, r->ext, r->bytes, DT_COPY_D2H, o->stream)
                 : d->memcpy_async(o->dev, r->ext, tier, r->bytes, DT_COPY_H2D, o->stream);
    }
    if (rc == DT_OK) {
        step = "stream_sync";
        rc = d->stream_sync(o->dev, o->stream);
    }
    if (rc != DT_OK) {
        char bn[96];
        snprintf(r->msg, sizeof r->msg,
                 "%s of %llu bytes at offset %llu of %s: the device's %s failed (%s)", dir,
                 (unsigned long long)r->bytes, (unsigned long long)r->offset,
                 oc_buf_name(r->buf, bn, sizeof bn), step, dt_status_name(rc));
    }
    return rc;
}

static void *worker_main(void *arg)
{
    dt_offload_t *o = arg;
    pthread_mutex_lock(&o->mu);
    for (;;) {
        while (!o->head && !o->stop)
            pthread_cond_wait(&o->work, &o->mu);
        dt_offload_req_t *r = o->head;
        if (!r)
            break; /* stop, and nothing left */
        o->head = r->next;
        if (!o->head)
            o->tail = NULL;
        pthread_mutex_unlock(&o->mu);
        int rc = run_copy(o, r);
        pthread_mutex_lock(&o->mu);
        r->status = rc;
        r->done = 1;
        r->buf->pending--;
        req_unref_locked(o, r);
        pthread_cond_broadcast(&o->done);
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

int oc_worker_start(dt_offload_t *o)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&o->mu, NULL);
    pthread_cond_init(&o->work, NULL);
    pthread_cond_init(&o->done, &ca);
    pthread_condattr_destroy(&ca);
    int e = pthread_create(&o->worker, NULL, worker_main, o);
    if (e != 0)
        return o->host->set_error(o->host, DT_ERR_SYSTEM, "init: starting the transfer thread: %s",
                                  strerror(e));
    o->worker_started = 1;
    return DT_OK;
}

void oc_worker_stop(dt_offload_t *o)
{
    if (!o->worker_started)
        return;
    pthread_mutex_lock(&o->mu);
    o->stop = 1;
    pthread_cond_signal(&o->work);
    pthread_mutex_unlock(&o->mu);
    pthread_join(o->worker, NULL);
    o->worker_started = 0;
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

static int64_t effective_timeout(const dt_offload_t *o, int64_t timeout_ms)
{
    return timeout_ms >= 0 ? timeout_ms : o->timeout_ms;
}

int oc_wait_zero_locked(dt_offload_t *o, const uint32_t *count, int64_t timeout_ms)
{
    struct timespec ts;
    deadline_after(&ts, effective_timeout(o, timeout_ms));
    while (*count > 0)
        if (pthread_cond_timedwait(&o->done, &o->mu, &ts) == ETIMEDOUT && *count > 0)
            return DT_ERR_TIMEOUT;
    return DT_OK;
}

int oc_submit(dt_offload_t *o, int op, dt_offload_buf_t *buf, uint64_t offset, void *ext,
              uint64_t bytes, int space, dt_stream_t *stream, dt_offload_req_t **req)
{
    const dt_host_v1_t *host = o->host;
    const char *dir = op == OC_STORE ? "store" : "load";
    char bn[96];
    *req = NULL;
    if (!buf || buf->magic != OC_BUF_MAGIC)
        return host->set_error(host, DT_ERR_INVALID, "%s: not a buffer of this tier (%p)", dir,
                               (void *)buf);
    if (offset > buf->bytes || bytes > buf->bytes - offset)
        return host->set_error(host, DT_ERR_INVALID,
                               "%s: bytes [%llu, +%llu) are outside %s", dir,
                               (unsigned long long)offset, (unsigned long long)bytes,
                               oc_buf_name(buf, bn, sizeof bn));
    if (!ext && bytes > 0)
        return host->set_error(host, DT_ERR_INVALID, "%s: %s pointer is NULL (%s)", dir,
                               op == OC_STORE ? "source" : "destination",
                               oc_buf_name(buf, bn, sizeof bn));
    if (space != DT_MEM_HOST && space != DT_MEM_DEVICE)
        return host->set_error(host, DT_ERR_INVALID,
                               "%s: space %d is neither host (%d) nor device (%d) memory", dir,
                               space, DT_MEM_HOST, DT_MEM_DEVICE);
    dt_offload_req_t *r = calloc(1, sizeof *r);
    if (!r)
        return host->set_error(host, DT_ERR_NOMEM, "%s: out of memory for a request", dir);
    *r = (dt_offload_req_t){.magic = OC_REQ_MAGIC, .op = op, .buf = buf, .offset = offset,
                            .bytes = bytes, .ext = ext, .space = space, .refs = 2};
    if (space == DT_MEM_DEVICE) {
        /* the copy follows what the caller queued on `stream` so far */
        int rc = o->dev_ops->event_create(o->dev, &r->ev);
        if (rc == DT_OK)
            rc = o->dev_ops->event_record(o->dev, r->ev, stream);
        if (rc != DT_OK) {
            if (r->ev)
                o->dev_ops->event_destroy(o->dev, r->ev);
            free(r);
            host->log(host, DT_LOG_ERROR, "%s of %llu bytes to %s: ordering after the caller's "
                      "stream failed", dir, (unsigned long long)bytes,
                      oc_buf_name(buf, bn, sizeof bn));
            return rc;
        }
    }
    pthread_mutex_lock(&o->mu);
    buf->pending++;
    if (o->tail)
        o->tail->next = r;
    else
        o->head = r;
    o->tail = r;
    pthread_cond_signal(&o->work);
    pthread_mutex_unlock(&o->mu);
    *req = r;
    return DT_OK;
}

int oc_wait(dt_offload_t *o, dt_offload_req_t *r, int64_t timeout_ms)
{
    const dt_host_v1_t *host = o->host;
    if (!r || r->magic != OC_REQ_MAGIC)
        return host->set_error(host, DT_ERR_INVALID,
                               "wait: not a request of this tier, or already waited on (%p)",
                               (void *)r);
    int64_t ms = effective_timeout(o, timeout_ms);
    struct timespec ts;
    deadline_after(&ts, ms);
    pthread_mutex_lock(&o->mu);
    while (!r->done)
        if (pthread_cond_timedwait(&o->done, &o->mu, &ts) == ETIMEDOUT && !r->done)
            break;
    int done = r->done, status = r->status;
    char msg[sizeof r->msg], bn[96];
    snprintf(msg, sizeof msg, "%s", r->msg);
    const char *dir = r->op == OC_STORE ? "store" : "load";
    uint64_t bytes = r->bytes, offset = r->offset;
    oc_buf_name(r->buf, bn, sizeof bn);
    r->magic = 0; /* the caller's handle is gone either way */
    req_unref_locked(o, r);
    pthread_mutex_unlock(&o->mu);
    if (!done)
        return host->set_error(host, DT_ERR_TIMEOUT,
                               "rank %d: wait: %s of %llu bytes at offset %llu of %s not done "
                               "after %lld ms", o->rank, dir, (unsigned long long)bytes,
                               (unsigned long long)offset, bn, (long long)ms);
    if (status != DT_OK)
        return host->set_error(host, status, "rank %d: %s", o->rank, msg);
    return DT_OK;
}
