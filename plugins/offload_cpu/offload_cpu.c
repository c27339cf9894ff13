/*
 * plugins/offload_cpu/offload_cpu.c - the `offload_cpu` tier: optimizer
 * state and parameters held in pinned host memory (the device's
 * host_alloc, tag offload), outside the compute device's budget and
 * counted in the device's pinned-memory report.  Its `host_ptr` lets a
 * strategy update the state in place with a CPU optimizer; store and load
 * run on the tiers' shared offload queue (a background thread, bounded waits).
 *
 * A tier may be bounded (`capacity`): an allocation past it fails naming
 * the bytes asked, held and allowed.  Nothing outlives the process, so
 * cleanup_job has nothing to remove.
 */
#include <stdlib.h>
#include <string.h>

#include "dtrain/sdk/cfg.h"
#include "offload_cpu_internal.h"

static const dt_config_key_t oc_keys[] = {
    {.name = "capacity", .type = DT_CFG_INT, .def = "0", DT_CFG_RANGE(0, 4.0e18),
     .doc = "most bytes the tier holds, all buffers together; 0 = as much as the host "
            "gives (an allocation past it fails naming the bytes)"},
};

/* A transfer (the queue's worker): host memory by memcpy, device memory
 * by the device's copy on the queue's stream. */
static int oc_run(void *ctx, offload_queue_t *q, offload_req_t *r)
{
    (void)ctx;
    dt_offload_buf_t *b = r->buf;
    char *tier = (char *)b->mem + r->offset;
    if (r->space == DT_MEM_DEVICE)
        return offload_queue_device_copy(q, r, 0, tier, r->bytes);
    if (r->op == OFFLOAD_QUEUE_STORE)
        memcpy(tier, r->ext, r->bytes);
    else
        memcpy(r->ext, tier, r->bytes);
    return DT_OK;
}

/* The list's release: the pinned memory back to the device, then b. */
static void oc_release(void *ctx, offload_buf_t *ob)
{
    dt_offload_t *o = ctx;
    dt_offload_buf_t *b = (dt_offload_buf_t *)ob;
    dt_device_ops(o->q.dev)->host_free(o->q.dev, b->mem);
    free(b);
}

/* Defined below; every handle this plugin makes starts with it. */
static const dt_offload_ops_v1_t oc_ops;

static int oc_init(const dt_host_v1_t *host, const dt_offload_init_v1_t *args,
                   dt_offload_t **out)
{
    dt_offload_init_v1_t a;
    int rc = offload_queue_check_init(host, args, out,
                                      ": the tier's pinned host memory comes from the "
                                      "device's host_alloc", &a);
    if (rc != DT_OK)
        return rc;
    int64_t capacity = 0;
    if ((rc = dt_cfg_int(host, "capacity", &capacity)) != DT_OK)
        return rc;
    dt_offload_t *o = calloc(1, sizeof *o);
    if (!o)
        return host->set_error(host, DT_ERR_NOMEM, "init: out of memory");
    o->ops = &oc_ops;
    rc = offload_queue_start(&o->q, host, a.rank, a.timeout_ms, a.dev, oc_run, o);
    if (rc != DT_OK) {
        free(o);
        return rc;
    }
    offload_bufs_init(&o->bufs, &o->q, OC_BUF_MAGIC, "offload_cpu", "buffers", (uint64_t)capacity,
                      oc_release, o);
    host->log(host, DT_LOG_DEBUG, "rank %d: host-memory tier, capacity %llu bytes%s", a.rank,
              (unsigned long long)capacity, capacity ? "" : " (unbounded)");
    *out = o;
    return DT_OK;
}

static void oc_finalize(dt_offload_t *o)
{
    if (!o)
        return;
    /* the worker drains the queue before it stops; a copy that never ends
     * (a hung device) leaves everything allocated rather than freed under it */
    if (offload_bufs_drain(&o->bufs) != DT_OK) {
        o->q.host->log(o->q.host, DT_LOG_ERROR, "rank %d: finalize: transfers still running "
                       "after %lld ms; the tier's memory is left allocated", o->q.rank,
                       (long long)o->q.timeout_ms);
        return;
    }
    offload_bufs_release_all(&o->bufs); /* (before stop: release uses the device) */
    offload_queue_stop(&o->q);
    free(o);
}

static int oc_capacity(dt_offload_t *o, uint64_t *total, uint64_t *used)
{
    if (!o)
        return DT_ERR_INVALID;
    if (!total || !used)
        return o->q.host->set_error(o->q.host, DT_ERR_INVALID, "capacity: %s is NULL",
                                  !total ? "total" : "used");
    *total = o->bufs.capacity;
    offload_bufs_usage(&o->bufs, used, NULL);
    return DT_OK;
}

static int oc_alloc(dt_offload_t *o, uint64_t bytes, int tag, dt_offload_buf_t **out)
{
    if (!o)
        return DT_ERR_INVALID;
    const dt_host_v1_t *host = o->q.host;
    if (!out)
        return host->set_error(host, DT_ERR_INVALID, "alloc: out is NULL");
    *out = NULL;
    uint64_t held;
    int rc = offload_bufs_check(&o->bufs, bytes, 1, tag, &held);
    if (rc != DT_OK)
        return rc;
    dt_offload_buf_t *b = calloc(1, sizeof *b);
    if (!b)
        return host->set_error(host, DT_ERR_NOMEM, "alloc: out of memory for a buffer");
    rc = dt_device_ops(o->q.dev)->host_alloc(o->q.dev, bytes, DT_TAG_OFFLOAD, &b->mem);
    if (rc != DT_OK) {
        free(b);
        host->log(host, DT_LOG_ERROR, "rank %d: alloc: %llu bytes of pinned host memory for %s "
                  "failed", o->q.rank, (unsigned long long)bytes, dt_mem_tag_name(tag));
        return rc;
    }
    offload_bufs_prepare(&o->bufs, &b->ob, bytes, held, tag);
    offload_bufs_link(&o->bufs, &b->ob);
    *out = b;
    return DT_OK;
}

static int oc_free(dt_offload_t *o, dt_offload_buf_t *b)
{
    if (!o)
        return DT_ERR_INVALID;
    char bn[96] = ""; /* its name, for a free that times out */
    if (b && offload_bufs_live(&o->bufs, b, "free") == DT_OK)
        oc_buf_name(b, bn, sizeof bn);
    return offload_bufs_free(&o->bufs, b ? &b->ob : NULL, bn);
}

static int submit(dt_offload_t *o, int op, dt_offload_buf_t *buf, uint64_t offset, void *ext,
                  uint64_t bytes, int space, dt_stream_t *stream, dt_offload_req_t **req)
{
    char bn[96];
    *req = NULL;
    int rc = offload_bufs_live(&o->bufs, buf, op == OFFLOAD_QUEUE_STORE ? "store" : "load");
    if (rc != DT_OK)
        return rc;
    return offload_queue_submit(&o->q, op, buf, &buf->ob.pending, buf->ob.bytes,
                                oc_buf_name(buf, bn, sizeof bn), offset, ext, bytes, space,
                                stream, req);
}

static int oc_store(dt_offload_t *o, dt_offload_buf_t *buf, uint64_t offset, const void *src,
                    uint64_t bytes, int space, dt_stream_t *stream, dt_offload_req_t **req)
{
    if (!o)
        return DT_ERR_INVALID;
    if (!req)
        return o->q.host->set_error(o->q.host, DT_ERR_INVALID, "store: req is NULL");
    return submit(o, OFFLOAD_QUEUE_STORE, buf, offset, (void *)src, bytes, space, stream, req);
}

static int oc_load(dt_offload_t *o, dt_offload_buf_t *buf, uint64_t offset, void *dst,
                   uint64_t bytes, int space, dt_stream_t *stream, dt_offload_req_t **req)
{
    if (!o)
        return DT_ERR_INVALID;
    if (!req)
        return o->q.host->set_error(o->q.host, DT_ERR_INVALID, "load: req is NULL");
    return submit(o, OFFLOAD_QUEUE_LOAD, buf, offset, dst, bytes, space, stream, req);
}

static int oc_wait_op(dt_offload_t *o, dt_offload_req_t *req, int64_t timeout_ms)
{
    if (!o)
        return DT_ERR_INVALID;
    return offload_queue_wait(&o->q, req, timeout_ms);
}

static int oc_host_ptr(dt_offload_t *o, dt_offload_buf_t *b, void **out)
{
    if (!o)
        return DT_ERR_INVALID;
    if (!out)
        return o->q.host->set_error(o->q.host, DT_ERR_INVALID, "host_ptr: out is NULL");
    int rc = offload_bufs_live(&o->bufs, b, "host_ptr");
    if (rc != DT_OK)
        return rc;
    *out = b->mem;
    return DT_OK;
}

/* Host memory dies with the process: a crashed job leaves nothing here. */
static int oc_cleanup_job(const dt_host_v1_t *host, const char *job_id)
{
    if (!host)
        return DT_ERR_INVALID;
    if (!job_id || !job_id[0])
        return host->set_error(host, DT_ERR_INVALID, "cleanup_job: no job id");
    return DT_OK;
}

static const dt_offload_ops_v1_t oc_ops = {
    .info = DT_PLUGIN_INFO(OFFLOAD, dt_offload_ops_v1_t, "offload_cpu", "1.0.0",
                           "offload tier in pinned host memory, outside the device's budget",
                           oc_keys),
    .init = oc_init,
    .finalize = oc_finalize,
    .capacity = oc_capacity,
    .alloc = oc_alloc,
    .free = oc_free,
    .store = oc_store,
    .load = oc_load,
    .wait = oc_wait_op,
    .host_ptr = oc_host_ptr,
    .cleanup_job = oc_cleanup_job,
};

DT_PLUGIN_ENTRY(offload, 1, dt_offload_ops_v1_t, &oc_ops)
