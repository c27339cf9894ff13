/*
 * plugins/offload_nvme/offload_nvme.c - the `offload_nvme` tier: buffers
 * are files on a (fast) disk, read and written with io_uring
 * (offload_nvme_io.c) in whole 4 KiB blocks, O_DIRECT where the file
 * system takes it, buffered I/O with one log line where it does not
 * (tmpfs before Linux 6.6).  Each file is created 0600 with the job id in
 * its name, its bytes reserved when it is allocated after a free-space
 * check, and removed at free and finalize; cleanup_job removes what a
 * crashed job left (offload_nvme_files.c).
 *
 * No host_ptr: state held here is moved through store and load.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtrain/sdk/cfg.h"
#include "offload_nvme_internal.h"

static const dt_config_key_t nvme_keys[] = {
    {.name = "path", .type = DT_CFG_STRING, .def = "\"\"",
     .doc = "folder for the tier's files (made 0700 if missing, with missing folders above it; "
            "refused where another user may write); \"\" = $TMPDIR or /var/tmp, under "
            "dtrain-offload"},
    {.name = "capacity", .type = DT_CFG_INT, .def = "0", DT_CFG_RANGE(0, 4.0e18),
     .doc = "most bytes the tier holds; 0 = what the file system has free"},
    {.name = "queue_depth", .type = DT_CFG_INT, .def = "32", DT_CFG_RANGE(1, 4096),
     .doc = "io_uring submission queue entries"},
    {.name = "buffers", .type = DT_CFG_INT, .def = "4", DT_CFG_RANGE(1, NVME_MAX_BOUNCE),
     .doc = "registered bounce buffers: I/Os in flight at once (2 = double-buffering)"},
    {.name = "block_size", .type = DT_CFG_INT, .def = "1048576", DT_CFG_RANGE(4096, 1 << 30),
     .doc = "bytes per I/O, a multiple of 4096"},
    {.name = "direct", .type = DT_CFG_ENUM, .def = "\"auto\"", .choices = "auto|on|off",
     .doc = "O_DIRECT: auto = where the file system takes it (else buffered, said once per "
            "machine), on = required, off = buffered I/O"},
};

static void nvme_finalize(dt_offload_t *o);

/* The list's release: b's file closed and removed, then b. */
static void nvme_release(void *ctx, offload_buf_t *ob)
{
    dt_offload_buf_t *b = (dt_offload_buf_t *)ob;
    dt_offload_t *o = ctx;
    nvme_files_remove(o, b);
    o->q.host->free(o->q.host, b->sums);
    free(b);
}

/* Defined below; every handle this plugin makes starts with it. */
static const dt_offload_ops_v1_t nvme_ops;

static int nvme_init(const dt_host_v1_t *host, const dt_offload_init_v1_t *args,
                     dt_offload_t **out)
{
    dt_offload_init_v1_t a;
    int rc = offload_queue_check_init(host, args, out, "", &a);
    if (rc != DT_OK)
        return rc;
    if (!nvme_valid_job(a.job_id))
        return host->set_error(host, DT_ERR_INVALID, "init: job id '%s' cannot name files "
                               "(letters, digits, '-', '_', '.')", a.job_id ? a.job_id : "(null)");
    const char *path = NULL;
    int64_t capacity = 0, qd = 0, nbuf = 0, block = 0;
    int direct = 0;
    if ((rc = dt_cfg_string(host, "path", &path)) ||
        (rc = dt_cfg_int(host, "capacity", &capacity)) ||
        (rc = dt_cfg_int(host, "queue_depth", &qd)) ||
        (rc = dt_cfg_int(host, "buffers", &nbuf)) ||
        (rc = dt_cfg_int(host, "block_size", &block)) ||
        (rc = dt_cfg_enum(host, "direct", "auto|on|off", &direct)))
        return rc;
    if (block % NVME_ALIGN != 0)
        return host->set_error(host, DT_ERR_CONFIG, "block_size = %lld is not a multiple of %u "
                               "(O_DIRECT's alignment)", (long long)block, NVME_ALIGN);
    if (nbuf > NVME_MAX_BOUNCE || nbuf > qd)
        return host->set_error(host, DT_ERR_CONFIG, "buffers = %lld: at most %u and at most "
                               "queue_depth (%lld)", (long long)nbuf, NVME_MAX_BOUNCE,
                               (long long)qd);
    dt_offload_t *o = calloc(1, sizeof *o);
    if (!o)
        return host->set_error(host, DT_ERR_NOMEM, "init: out of memory");
    o->q.host = host; /* for messages until the queue starts */
    o->ops = &nvme_ops;
    o->q.rank = a.rank;
    o->local_rank = a.local_rank;
    snprintf(o->job, sizeof o->job, "%s", a.job_id);
    offload_bufs_init(&o->bufs, &o->q, NVME_BUF_MAGIC, "offload_nvme", "files", (uint64_t)capacity,
                      nvme_release, o);
    o->queue_depth = (uint32_t)qd;
    o->n_bounce = (uint32_t)nbuf;
    o->block = (uint64_t)block;
    int can = 0;
    rc = nvme_files_dir(o, path);
    if (rc == DT_OK)
        rc = nvme_files_probe_direct(o, &can);
    if (rc == DT_OK) {
        if (direct == 1 && !can)
            rc = host->set_error(host, DT_ERR_CONFIG, "rank %d: direct = \"on\", but '%s' "
                                 "refuses O_DIRECT (tmpfs?); use direct = \"auto\" or another "
                                 "path", a.rank, o->dir);
        o->direct = direct != 2 && can;
        /* once per machine (its local rank 0), where the folder is */
        if (rc == DT_OK && direct == 0 && !can && a.local_rank == 0)
            host->log(host, DT_LOG_INFO, "'%s' refuses O_DIRECT (tmpfs?): buffered I/O", o->dir);
    }
    if (rc == DT_OK)
        rc = nvme_io_init(o); /* the ring, before the worker that uses it */
    if (rc == DT_OK) {
        offload_queue_t q0 = o->q;
        if ((rc = offload_queue_start_loop(&o->q, host, a.rank, a.timeout_ms, a.dev,
                                           nvme_io_loop, o)) != DT_OK)
            o->q = q0;
    }
    if (rc != DT_OK) {
        nvme_finalize(o);
        return rc;
    }
    host->log(host, DT_LOG_DEBUG, "rank %d: files in '%s', %s I/O, queue depth %u, %u x %llu "
              "byte buffers%s", a.rank, o->dir, o->direct ? "direct" : "buffered",
              o->queue_depth, o->n_bounce, (unsigned long long)o->block,
              o->registered ? " (registered)" : "");
    *out = o;
    return DT_OK;
}

static void nvme_finalize(dt_offload_t *o)
{
    if (!o)
        return;
    const dt_host_v1_t *host = o->q.host;
    if (o->q.started && offload_bufs_drain(&o->bufs) != DT_OK) {
        host->log(host, DT_LOG_ERROR, "rank %d: finalize: transfers still running after %lld "
                  "ms; the tier's files and buffers are left as they are", o->q.rank,
                  (long long)o->q.timeout_ms);
        return;
    }
    int started = o->q.started;
    int32_t rank = o->q.rank;
    offload_queue_stop(&o->q); /* (a no-op when it never started) */
    o->q.host = host;  /* stop cleared the queue: for removal messages */
    o->q.rank = rank;
    if (started) /* the worker's counts, read after it stopped */
        host->log(host, DT_LOG_DEBUG, "rank %d: %llu requests in %llu I/Os (%llu through the "
                  "bounce buffers), %llu bytes read and %llu written, at most %u in flight at "
                  "once", rank, (unsigned long long)o->n_reqs, (unsigned long long)o->n_ios,
                  (unsigned long long)o->n_bounced, (unsigned long long)o->io_bytes[0],
                  (unsigned long long)o->io_bytes[1], o->max_inflight);
    offload_bufs_release_all(&o->bufs);
    nvme_io_free(o);
    nvme_files_remove_dirs(o);
    free(o);
}

static int nvme_capacity(dt_offload_t *o, uint64_t *total, uint64_t *used)
{
    if (!o)
        return DT_ERR_INVALID;
    if (!total || !used)
        return o->q.host->set_error(o->q.host, DT_ERR_INVALID, "capacity: %s is NULL",
                                    !total ? "total" : "used");
    uint64_t free_bytes = 0;
    int rc = o->bufs.capacity ? DT_OK : nvme_files_free(o, &free_bytes);
    offload_bufs_usage(&o->bufs, used, NULL);
    *total = o->bufs.capacity ? o->bufs.capacity : *used + free_bytes;
    return rc;
}

static int nvme_alloc(dt_offload_t *o, uint64_t bytes, int tag, dt_offload_buf_t **out)
{
    if (!o)
        return DT_ERR_INVALID;
    const dt_host_v1_t *host = o->q.host;
    if (!out)
        return host->set_error(host, DT_ERR_INVALID, "alloc: out is NULL");
    *out = NULL;
    uint64_t file_bytes; /* whole blocks: O_DIRECT's */
    int rc = offload_bufs_check(&o->bufs, bytes, NVME_ALIGN, tag, &file_bytes);
    if (rc != DT_OK)
        return rc;
    dt_offload_buf_t *b = calloc(1, sizeof *b);
    if (!b)
        return host->set_error(host, DT_ERR_NOMEM, "alloc: out of memory for a buffer");
    b->fd = -1;
    offload_bufs_prepare(&o->bufs, &b->ob, bytes, file_bytes, tag); /* its id names the file */
    if ((rc = nvme_files_create(o, b)) != DT_OK) {
        free(b);
        return rc;
    }
    /* a checksum per 4 KiB block: 1/1024 of the file's bytes, in host memory */
    uint64_t n_sums = b->ob.held / NVME_ALIGN;
    if (n_sums && !(b->sums = host->alloc(host, n_sums * sizeof *b->sums, DT_TAG_OTHER))) {
        nvme_files_remove(o, b);
        free(b);
        return host->set_error(host, DT_ERR_NOMEM, "rank %d: alloc: out of host memory for the "
                               "checksums of %llu blocks of 4096 bytes", o->q.rank,
                               (unsigned long long)n_sums);
    }
    for (uint64_t i = 0; i < n_sums; i++)
        b->sums[i] = nvme_sum_zero(); /* reserved, never written: zeros */
    offload_bufs_link(&o->bufs, &b->ob);
    *out = b;
    return DT_OK;
}

static int nvme_free(dt_offload_t *o, dt_offload_buf_t *b)
{
    if (!o)
        return DT_ERR_INVALID;
    char bn[OFFLOAD_QUEUE_WHAT_MAX] = ""; /* its name, for a free that times out */
    if (b && offload_bufs_live(&o->bufs, b, "free") == DT_OK)
        nvme_buf_name(b, bn, sizeof bn);
    return offload_bufs_free(&o->bufs, b ? &b->ob : NULL, bn);
}

static int submit(dt_offload_t *o, int op, dt_offload_buf_t *buf, uint64_t offset, void *ext,
                  uint64_t bytes, int space, dt_stream_t *stream, dt_offload_req_t **req)
{
    if (!o)
        return DT_ERR_INVALID;
    const char *dir = op == OFFLOAD_QUEUE_STORE ? "store" : "load";
    if (!req)
        return o->q.host->set_error(o->q.host, DT_ERR_INVALID, "%s: req is NULL", dir);
    *req = NULL;
    int rc = offload_bufs_live(&o->bufs, buf, dir);
    if (rc != DT_OK)
        return rc;
    char bn[OFFLOAD_QUEUE_WHAT_MAX];
    return offload_queue_submit(&o->q, op, buf, &buf->ob.pending, buf->ob.bytes,
                                nvme_buf_name(buf, bn, sizeof bn), offset, ext, bytes, space,
                                stream, req);
}

static int nvme_store(dt_offload_t *o, dt_offload_buf_t *buf, uint64_t offset, const void *src,
                      uint64_t bytes, int space, dt_stream_t *stream, dt_offload_req_t **req)
{
    return submit(o, OFFLOAD_QUEUE_STORE, buf, offset, (void *)src, bytes, space, stream, req);
}

static int nvme_load(dt_offload_t *o, dt_offload_buf_t *buf, uint64_t offset, void *dst,
                     uint64_t bytes, int space, dt_stream_t *stream, dt_offload_req_t **req)
{
    return submit(o, OFFLOAD_QUEUE_LOAD, buf, offset, dst, bytes, space, stream, req);
}

static int nvme_wait(dt_offload_t *o, dt_offload_req_t *req, int64_t timeout_ms)
{
    if (!o)
        return DT_ERR_INVALID;
    return offload_queue_wait(&o->q, req, timeout_ms);
}

static const dt_offload_ops_v1_t nvme_ops = {
    .info = DT_PLUGIN_INFO(OFFLOAD, dt_offload_ops_v1_t, "offload_nvme", "1.0.0",
                           "offload tier in files on NVMe: O_DIRECT, io_uring, queued",
                           nvme_keys),
    .init = nvme_init,
    .finalize = nvme_finalize,
    .capacity = nvme_capacity,
    .alloc = nvme_alloc,
    .free = nvme_free,
    .store = nvme_store,
    .load = nvme_load,
    .wait = nvme_wait,
    .cleanup_job = nvme_cleanup_job,
};

DT_PLUGIN_ENTRY(offload, 1, dt_offload_ops_v1_t, &nvme_ops)
