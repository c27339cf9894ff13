/*
 * plugins/offload_nvme/offload_nvme_io.c - the tier's transfers, run by
 * the offload queue's worker thread: io_uring with `queue_depth` entries,
 * `buffers` bounce buffers of `block_size` bytes registered with the ring
 * (read_fixed / write_fixed; plain reads and writes where registering is
 * refused), one I/O in flight per bounce buffer, so a store fills the next
 * buffer while earlier writes run and a load copies one block out while
 * the next reads run (double-buffering and more).
 *
 * O_DIRECT wants 4 KiB-aligned offsets, sizes and memory: every I/O covers
 * whole aligned blocks of the file (its size is rounded up when it is
 * made) from the aligned bounce buffers, and a store that covers part of
 * a block reads the block first (read-modify-write).  The queue runs one
 * request at a time, so two requests never touch a block at once.
 *
 * Faults are named with the file, the operation and the rank (wait adds
 * the rank): an I/O error (errno), a short read or write, a file deleted
 * or truncated under the job, and an I/O that does not complete within
 * the timeout (the ring is then marked broken: the kernel may still use
 * its buffers, so nothing more is submitted and finalize leaves them
 * allocated).  The file is checked with fstat before and after each
 * request: deleted (no link left), shorter than made, or - where the file
 * system counted the reserved blocks when it was made - with fewer bytes
 * on disk than reserved, which is what a truncation during a store leaves
 * once later writes have grown the file back over the holes.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "offload_nvme_internal.h"

int on_io_init(dt_offload_t *o)
{
    const dt_host_v1_t *host = o->q.host;
    int e = io_uring_queue_init(o->queue_depth, &o->ring, 0);
    if (e < 0)
        return host->set_error(host, DT_ERR_SYSTEM, "rank %d: io_uring_queue_init(%u): %s",
                               o->q.rank, o->queue_depth, strerror(-e));
    o->ring_ok = 1;
    if (posix_memalign(&o->bounce, ON_ALIGN, (size_t)o->n_bounce * o->block) != 0) {
        o->bounce = NULL;
        return host->set_error(host, DT_ERR_NOMEM, "rank %d: %u bounce buffers of %llu bytes",
                               o->q.rank, o->n_bounce, (unsigned long long)o->block);
    }
    struct iovec iov[ON_MAX_BOUNCE];
    for (uint32_t i = 0; i < o->n_bounce; i++)
        iov[i] = (struct iovec){(char *)o->bounce + (size_t)i * o->block, (size_t)o->block};
    e = io_uring_register_buffers(&o->ring, iov, o->n_bounce);
    o->registered = e == 0;
    if (e < 0) /* e.g. RLIMIT_MEMLOCK: the same I/O, unregistered */
        host->log(host, DT_LOG_INFO, "rank %d: registering %u bounce buffers with io_uring: %s; "
                  "plain reads and writes", o->q.rank, o->n_bounce, strerror(-e));
    return DT_OK;
}

void on_io_free(dt_offload_t *o)
{
    if (o->broken) /* the kernel may still write into them */
        return;
    if (o->ring_ok) {
        if (o->registered)
            io_uring_unregister_buffers(&o->ring);
        io_uring_queue_exit(&o->ring);
        o->ring_ok = 0;
    }
    free(o->bounce);
    o->bounce = NULL;
}

/* One request's I/O state. */
typedef struct io_job {
    dt_offload_t *o;
    dt_oq_t *q;
    dt_oq_req_t *r;
    dt_offload_buf_t *b;
    uint64_t lo, hi;                  /* the request's bytes in the file */
    uint64_t c0[ON_MAX_BOUNCE], c1[ON_MAX_BOUNCE]; /* each buffer's block */
    int32_t busy[ON_MAX_BOUNCE];
    uint32_t inflight;
} io_job_t;

static int fail(io_job_t *j, int status, const char *fmt, ...) DT_PRINTF(3, 4);
static int fail(io_job_t *j, int status, const char *fmt, ...)
{
    char why[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(j->r->msg, sizeof j->r->msg, "%s of %llu bytes at offset %llu of '%s': %s",
             j->r->op == DT_OQ_STORE ? "store" : "load", (unsigned long long)j->r->bytes,
             (unsigned long long)j->r->offset, j->b->path, why);
    return status;
}

static char *slot_mem(const io_job_t *j, uint32_t i)
{
    return (char *)j->o->bounce + (size_t)i * j->o->block;
}

static int submit(io_job_t *j, uint32_t i, int write, uint64_t c0, uint64_t c1)
{
    dt_offload_t *o = j->o;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&o->ring);
    if (!sqe) {
        io_uring_submit(&o->ring);
        if (!(sqe = io_uring_get_sqe(&o->ring)))
            return fail(j, DT_ERR_SYSTEM, "the io_uring submission queue is full");
    }
    unsigned n = (unsigned)(c1 - c0);
    if (o->registered && write)
        io_uring_prep_write_fixed(sqe, j->b->fd, slot_mem(j, i), n, c0, (int)i);
    else if (o->registered)
        io_uring_prep_read_fixed(sqe, j->b->fd, slot_mem(j, i), n, c0, (int)i);
    else if (write)
        io_uring_prep_write(sqe, j->b->fd, slot_mem(j, i), n, c0);
    else
        io_uring_prep_read(sqe, j->b->fd, slot_mem(j, i), n, c0);
    io_uring_sqe_set_data64(sqe, (uint64_t)i | (write ? 0x100u : 0u));
    int e = io_uring_submit(&o->ring);
    if (e < 0)
        return fail(j, DT_ERR_IO, "io_uring_submit: %s", strerror(-e));
    j->c0[i] = c0;
    j->c1[i] = c1;
    j->busy[i] = 1;
    j->inflight++;
    return DT_OK;
}

/* Reap one completion within the queue's timeout: *slot is its buffer. */
static int reap(io_job_t *j, uint32_t *slot)
{
    dt_offload_t *o = j->o;
    struct io_uring_cqe *cqe = NULL;
    struct __kernel_timespec ts = {.tv_sec = j->q->timeout_ms / 1000,
                                   .tv_nsec = (j->q->timeout_ms % 1000) * 1000000};
    int e = io_uring_wait_cqe_timeout(&o->ring, &cqe, &ts);
    if (e == -ETIME) {
        o->broken = 1;
        return fail(j, DT_ERR_TIMEOUT, "an I/O did not complete within %lld ms; the tier "
                    "stops here", (long long)j->q->timeout_ms);
    }
    if (e < 0)
        return fail(j, DT_ERR_IO, "waiting for io_uring: %s", strerror(-e));
    uint64_t data = io_uring_cqe_get_data64(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&o->ring, cqe);
    uint32_t i = (uint32_t)(data & 0xffu);
    int write = (data & 0x100u) != 0;
    j->busy[i] = 0;
    j->inflight--;
    *slot = i;
    uint64_t want = j->c1[i] - j->c0[i];
    if (res < 0)
        return fail(j, DT_ERR_IO, "%s at byte %llu: %s", write ? "write" : "read",
                    (unsigned long long)j->c0[i], strerror(-res));
    if ((uint64_t)res != want)
        return fail(j, DT_ERR_IO, "short %s at byte %llu: %d of %llu bytes (the file was "
                    "truncated?)", write ? "write" : "read", (unsigned long long)j->c0[i], res,
                    (unsigned long long)want);
    return DT_OK;
}

/* The file is still ours and whole (see the top of this file). */
static int check_file(io_job_t *j)
{
    struct stat st;
    if (fstat(j->b->fd, &st) != 0)
        return fail(j, DT_ERR_IO, "fstat: %s", strerror(errno));
    if (st.st_nlink == 0)
        return fail(j, DT_ERR_IO, "the file was deleted under the running job");
    if ((uint64_t)st.st_size < j->b->file_bytes)
        return fail(j, DT_ERR_IO, "the file was truncated to %llu bytes (%llu expected)",
                    (unsigned long long)st.st_size, (unsigned long long)j->b->file_bytes);
    if (j->b->blocks_counted && (uint64_t)st.st_blocks * 512u < j->b->file_bytes)
        return fail(j, DT_ERR_IO, "the file was truncated (only %llu of its %llu bytes are on "
                    "disk)", (unsigned long long)st.st_blocks * 512u,
                    (unsigned long long)j->b->file_bytes);
    return DT_OK;
}

/* After a failure: wait for what is still in flight (unless broken), so
 * no I/O lands in a buffer the next request uses. */
static int drain(io_job_t *j, int rc)
{
    while (j->inflight && !j->o->broken) {
        uint32_t s;
        int e = reap(j, &s);
        if (rc == DT_OK)
            rc = e;
    }
    return rc;
}

static int free_slot(io_job_t *j, uint32_t *slot)
{
    for (uint32_t i = 0; i < j->o->n_bounce; i++)
        if (!j->busy[i]) {
            *slot = i;
            return DT_OK;
        }
    return reap(j, slot);
}

/* The caller's bytes of block [c0, c1) held in slot i: to it (store) or
 * from it (load). */
static int copy_part(io_job_t *j, uint32_t i, uint64_t c0, uint64_t c1)
{
    uint64_t s0 = c0 > j->lo ? c0 : j->lo, s1 = c1 < j->hi ? c1 : j->hi;
    char *mem = slot_mem(j, i) + (s0 - c0);
    uint64_t at = s0 - j->lo, n = s1 - s0;
    if (j->r->space == DT_MEM_DEVICE) {
        int rc = dt_oq_device_copy(j->q, j->r, at, mem, n);
        if (rc != DT_OK) /* its message names the buffer; add the file */
            return fail(j, rc, "the device's copy failed (%s)", dt_status_name(rc));
        return DT_OK;
    }
    if (j->r->op == DT_OQ_STORE)
        memcpy(mem, (const char *)j->r->ext + at, n);
    else
        memcpy((char *)j->r->ext + at, mem, n);
    return DT_OK;
}

static int run_store(io_job_t *j, uint64_t a0, uint64_t a1)
{
    uint64_t block = j->o->block;
    int rc = DT_OK;
    for (uint64_t c0 = a0; rc == DT_OK && c0 < a1; c0 += block) {
        uint64_t c1 = c0 + block < a1 ? c0 + block : a1;
        uint32_t i;
        if ((rc = free_slot(j, &i)) != DT_OK)
            break;
        if (c0 < j->lo || c1 > j->hi) {
            /* part of a block: read it first, with nothing else in flight
             * (only the first and the last block can be partial) */
            if ((rc = drain(j, DT_OK)) != DT_OK || (rc = submit(j, i, 0, c0, c1)) != DT_OK ||
                (rc = reap(j, &i)) != DT_OK)
                break;
        }
        if ((rc = copy_part(j, i, c0, c1)) == DT_OK)
            rc = submit(j, i, 1, c0, c1);
    }
    return drain(j, rc);
}

static int run_load(io_job_t *j, uint64_t a0, uint64_t a1)
{
    uint64_t block = j->o->block, next = a0;
    int rc = DT_OK;
    while (rc == DT_OK && (next < a1 || j->inflight)) {
        /* every free buffer reads ahead */
        for (uint32_t i = 0; rc == DT_OK && next < a1 && i < j->o->n_bounce; i++) {
            if (j->busy[i])
                continue;
            uint64_t c1 = next + block < a1 ? next + block : a1;
            rc = submit(j, i, 0, next, c1);
            next = c1;
        }
        uint32_t s;
        if (rc == DT_OK && (rc = reap(j, &s)) == DT_OK)
            rc = copy_part(j, s, j->c0[s], j->c1[s]);
    }
    return drain(j, rc);
}

int on_io_run(void *ctx, dt_oq_t *q, dt_oq_req_t *r)
{
    dt_offload_t *o = ctx;
    io_job_t j = {.o = o, .q = q, .r = r, .b = r->buf, .lo = r->offset,
                  .hi = r->offset + r->bytes};
    if (o->broken)
        return fail(&j, DT_ERR_IO, "an earlier I/O of this tier never completed");
    if (r->bytes == 0)
        return DT_OK;
    /* the file must still be ours, whole: deleted or truncated under the
     * job, it would hand back zeros or lose what is written */
    int rc = check_file(&j);
    if (rc != DT_OK)
        return rc;
    uint64_t a0 = j.lo / ON_ALIGN * ON_ALIGN;
    uint64_t a1 = (j.hi + ON_ALIGN - 1) / ON_ALIGN * ON_ALIGN;
    rc = r->op == DT_OQ_STORE ? run_store(&j, a0, a1) : run_load(&j, a0, a1);
    return rc == DT_OK ? check_file(&j) : rc;
}
