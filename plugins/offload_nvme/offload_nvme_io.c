/*
 * plugins/offload_nvme/offload_nvme_io.c - the tier's transfers, run by
 * the offload queue's worker thread in a loop of its own
 * (offload_queue_start_loop): io_uring with `queue_depth` entries, `buffers`
 * bounce buffers of `block_size` bytes registered with the ring
 * (read_fixed / write_fixed; plain reads and writes where registering is
 * refused), one I/O in flight per bounce buffer.
 *
 * The ring stays full across request boundaries: the loop takes the next
 * queued request as soon as every request it runs has started all its
 * I/Os and a bounce buffer is free, so a request of one block, or the
 * tail of a long one, never leaves the device with less than `buffers`
 * I/Os while more is queued.  Completions are reaped as they come, and a
 * request is finished (its waiter woken) when its last I/O completes;
 * requests may finish out of order.
 *
 * Order: I/Os start in request order, and an I/O does not start while an
 * earlier one in flight overlaps it and either writes (a load after a
 * store of the same bytes reads what was stored; a store after a load
 * does not overwrite bytes before they are read; two stores into one
 * block do not lose either's bytes).  A request held back that way holds
 * back every later one.
 *
 * O_DIRECT wants 4 KiB-aligned offsets, sizes and memory: every I/O covers
 * whole aligned blocks of the file (its size is rounded up when it is
 * made).  A block the request covers whole, whose bytes in the caller's
 * host memory start 4 KiB-aligned, is read or written there in place, as
 * fio does (no copy on the worker's path); any other block goes through
 * an aligned bounce buffer, and a store that covers part of a block reads
 * the block first (read-modify-write, its bounce buffer kept for the
 * write that follows).  Where the caller's memory and the file agree
 * modulo 4 KiB (the strategies' staging places each piece so), a partial
 * block at either end of a request is an I/O of its own, so only that
 * 4 KiB goes through a bounce buffer, not the whole I/O around it.
 *
 * Faults are named with the file, the operation and the rank (wait adds
 * the rank): an I/O error (errno), a short read or write, a file deleted
 * or truncated under the job, and an I/O that does not complete within
 * the timeout (the ring is then marked broken: the kernel may still use
 * its buffers, so nothing more is submitted, every request running fails
 * and finalize leaves the buffers allocated).  The file is checked with
 * fstat before and after each request: deleted (no link left), shorter
 * than made, or - where the file system counted the reserved blocks when
 * it was made - with fewer bytes on disk than reserved, which is what a
 * truncation during a store leaves once later writes have grown the file
 * back over the holes.
 *
 * Checksums: every 4 KiB block written gets its CRC-32C
 * (offload_nvme_sum.c) kept in host memory, computed from the very bytes
 * the I/O writes (the bounce buffer after the copy or the merge, or the
 * caller's memory written in place), and every block read - a load's,
 * and a partial store's read before its merge - is checked against it
 * before any byte reaches the caller; a block never written must read as
 * zeros (its reserved state).  A mismatch fails the request with
 * DT_ERR_DATA naming the file, the block's bytes and both checksums, so
 * bytes changed under the running job are caught where they are read
 * instead of training on them.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "offload_nvme_internal.h"

int nvme_io_init(dt_offload_t *o)
{
    const dt_host_v1_t *host = o->q.host;
    int e = io_uring_queue_init(o->queue_depth, &o->ring, 0);
    if (e < 0)
        return host->set_error(host, DT_ERR_SYSTEM, "rank %d: io_uring_queue_init(%u): %s",
                               o->q.rank, o->queue_depth, strerror(-e));
    o->ring_ok = 1;
    if (posix_memalign(&o->bounce, NVME_ALIGN, (size_t)o->n_bounce * o->block) != 0) {
        o->bounce = NULL;
        return host->set_error(host, DT_ERR_NOMEM, "rank %d: %u bounce buffers of %llu bytes",
                               o->q.rank, o->n_bounce, (unsigned long long)o->block);
    }
    struct iovec iov[NVME_MAX_BOUNCE];
    for (uint32_t i = 0; i < o->n_bounce; i++)
        iov[i] = (struct iovec){(char *)o->bounce + (size_t)i * o->block, (size_t)o->block};
    e = io_uring_register_buffers(&o->ring, iov, o->n_bounce);
    o->registered = e == 0;
    if (e < 0) /* e.g. RLIMIT_MEMLOCK: the same I/O, unregistered */
        host->log(host, DT_LOG_INFO, "rank %d: registering %u bounce buffers with io_uring: %s; "
                  "plain reads and writes", o->q.rank, o->n_bounce, strerror(-e));
    o->free_jobs = NULL;
    for (uint32_t i = 0; i <= o->n_bounce; i++) {
        o->jobs[i].next_job = o->free_jobs;
        o->free_jobs = &o->jobs[i];
    }
    return DT_OK;
}

void nvme_io_free(dt_offload_t *o)
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

/* Job j's first failure, named with its operation, bytes and file (a
 * later one keeps the first).  Returns j's status. */
static int fail(nvme_job_t *j, int status, const char *fmt, ...) DT_PRINTF(3, 4);
static int fail(nvme_job_t *j, int status, const char *fmt, ...)
{
    if (j->status != DT_OK)
        return j->status;
    char why[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(j->r->msg, sizeof j->r->msg, "%s of %llu bytes at offset %llu of '%s': %s",
             j->r->op == OFFLOAD_QUEUE_STORE ? "store" : "load", (unsigned long long)j->r->bytes,
             (unsigned long long)j->r->offset, j->b->path, why);
    j->status = status;
    return status;
}

static char *slot_mem(const dt_offload_t *o, uint32_t i)
{
    return (char *)o->bounce + (size_t)i * o->block;
}

/* The file is still ours and whole (see the top of this file). */
static int check_file(nvme_job_t *j)
{
    struct stat st;
    if (fstat(j->b->fd, &st) != 0)
        return fail(j, DT_ERR_IO, "fstat: %s", strerror(errno));
    if (st.st_nlink == 0)
        return fail(j, DT_ERR_IO, "the file was deleted under the running job");
    if ((uint64_t)st.st_size < j->b->ob.held)
        return fail(j, DT_ERR_IO, "the file was truncated to %llu bytes (%llu expected)",
                    (unsigned long long)st.st_size, (unsigned long long)j->b->ob.held);
    if (j->b->blocks_counted && (uint64_t)st.st_blocks * 512u < j->b->ob.held)
        return fail(j, DT_ERR_IO, "the file was truncated (only %llu of its %llu bytes are on "
                    "disk)", (unsigned long long)st.st_blocks * 512u,
                    (unsigned long long)j->b->ob.held);
    return DT_OK;
}

/* The caller's bytes of slot i's block: into the slot (store) or out of
 * it (load). */
static int copy_part(dt_offload_t *o, offload_queue_t *q, uint32_t i)
{
    const nvme_slot_t *s = &o->slot[i];
    nvme_job_t *j = s->job;
    uint64_t s0 = s->c0 > j->lo ? s->c0 : j->lo, s1 = s->c1 < j->hi ? s->c1 : j->hi;
    char *mem = slot_mem(o, i) + (s0 - s->c0);
    uint64_t at = s0 - j->lo, n = s1 - s0;
    if (j->r->space == DT_MEM_DEVICE) {
        int rc = offload_queue_device_copy(q, j->r, at, mem, n);
        if (rc != DT_OK) /* its message names the buffer; add the file */
            return fail(j, rc, "the device's copy failed (%s)", dt_status_name(rc));
        return DT_OK;
    }
    if (j->r->op == OFFLOAD_QUEUE_STORE)
        memcpy(mem, (const char *)j->r->ext + at, n);
    else
        memcpy((char *)j->r->ext + at, mem, n);
    return DT_OK;
}

/* Slot i's I/O into the ring's submission queue (submitted in a batch by
 * the loop).  There is always room: at most `buffers` I/Os are in flight
 * and queue_depth >= buffers (init checks). */
static int prep(dt_offload_t *o, uint32_t i, int write)
{
    const nvme_slot_t *s = &o->slot[i];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&o->ring);
    if (!sqe)
        return fail(s->job, DT_ERR_SYSTEM, "the io_uring submission queue is full");
    unsigned n = (unsigned)(s->c1 - s->c0);
    int fd = s->job->b->fd;
    int fixed = o->registered && s->mem == slot_mem(o, i);
    if (fixed && write)
        io_uring_prep_write_fixed(sqe, fd, s->mem, n, s->c0, (int)i);
    else if (fixed)
        io_uring_prep_read_fixed(sqe, fd, s->mem, n, s->c0, (int)i);
    else if (write)
        io_uring_prep_write(sqe, fd, s->mem, n, s->c0);
    else
        io_uring_prep_read(sqe, fd, s->mem, n, s->c0);
    io_uring_sqe_set_data64(sqe, i);
    o->n_ios++;
    o->io_bytes[write ? 1 : 0] += n;
    o->n_bounced += s->mem == slot_mem(o, i);
    if (++o->inflight > o->max_inflight)
        o->max_inflight = o->inflight;
    return DT_OK;
}

/* The caller's memory for block [c0, c1) of job j, when the I/O can use
 * it in place: host memory, the whole block inside the request, at a
 * 4 KiB-aligned address (c1 - c0 is a multiple of 4 KiB); else NULL. */
static char *in_place(const nvme_job_t *j, uint64_t c0, uint64_t c1)
{
    if (j->r->space != DT_MEM_HOST || c0 < j->lo || c1 > j->hi)
        return NULL;
    char *p = (char *)j->r->ext + (c0 - j->lo);
    return (uintptr_t)p % NVME_ALIGN == 0 ? p : NULL;
}

/* Whether job j's whole blocks lie 4 KiB-aligned in the caller's memory
 * (host memory whose address and file offset agree modulo 4 KiB): then
 * a partial block at either end of the request goes alone, so that the
 * I/Os between use the caller's memory in place instead of going
 * through a bounce buffer beside it. */
static int ends_alone(const nvme_job_t *j)
{
    return j->r->space == DT_MEM_HOST &&
           (uintptr_t)j->r->ext % NVME_ALIGN == j->lo % NVME_ALIGN;
}

static void release(dt_offload_t *o, uint32_t i)
{
    o->slot[i].job->ios--;
    o->slot[i].job = NULL;
}

/* Whether bytes [c0, c1) of b must wait for an I/O in flight: one that
 * overlaps them where either writes. */
static int held_back(const dt_offload_t *o, const dt_offload_buf_t *b, uint64_t c0, uint64_t c1,
                     int write)
{
    for (uint32_t i = 0; i < o->n_bounce; i++) {
        const nvme_slot_t *s = &o->slot[i];
        if (s->job && s->job->b == b && (write || s->write) && c0 < s->c1 && s->c0 < c1)
            return 1;
    }
    return 0;
}

/* Slot i's blocks, about to be written: their checksums become the ones
 * a read must find. */
static void sum_written(dt_offload_t *o, uint32_t i)
{
    const nvme_slot_t *s = &o->slot[i];
    nvme_sum_blocks(s->mem, (s->c1 - s->c0) / NVME_ALIGN, s->job->b->sums + s->c0 / NVME_ALIGN);
}

/* Slot i's blocks, just read: each must have the checksum it was written
 * with (or a zero block's, never written), else the file was changed
 * under the tier (DT_ERR_DATA, naming the block and both checksums). */
static int sum_check(dt_offload_t *o, uint32_t i)
{
    const nvme_slot_t *s = &o->slot[i];
    const uint32_t *want = s->job->b->sums + s->c0 / NVME_ALIGN;
    uint32_t got[64];
    uint64_t n = (s->c1 - s->c0) / NVME_ALIGN;
    for (uint64_t k0 = 0; k0 < n; k0 += 64) {
        uint64_t m = n - k0 < 64 ? n - k0 : 64;
        nvme_sum_blocks(s->mem + k0 * NVME_ALIGN, m, got);
        for (uint64_t k = 0; k < m; k++)
            if (got[k] != want[k0 + k]) {
                uint64_t at = s->c0 + (k0 + k) * NVME_ALIGN;
                return fail(s->job, DT_ERR_DATA, "checksum mismatch in bytes [%llu, %llu) of "
                            "the file: CRC-32C 0x%08x as written, 0x%08x as read (changed "
                            "outside the tier)", (unsigned long long)at,
                            (unsigned long long)(at + NVME_ALIGN), (unsigned)want[k0 + k],
                            (unsigned)got[k]);
            }
    }
    return DT_OK;
}

/* Start job j's next blocks while bounce buffers are free and nothing
 * earlier holds them back: 1 once every block has started (or j failed),
 * 0 when j must wait for a completion. */
static int start_ios(dt_offload_t *o, offload_queue_t *q, nvme_job_t *j)
{
    const int store = j->r->op == OFFLOAD_QUEUE_STORE;
    uint32_t i = 0;
    while (j->status == DT_OK && j->next < j->end) {
        uint64_t c0 = j->next, c1 = c0 + o->block < j->end ? c0 + o->block : j->end;
        if (c1 - c0 > NVME_ALIGN && (c0 < j->lo || c1 > j->hi) && ends_alone(j))
            c1 = c0 < j->lo ? c0 + NVME_ALIGN : c1 - NVME_ALIGN; /* the partial end alone */
        while (i < o->n_bounce && o->slot[i].job)
            i++;
        if (i == o->n_bounce || held_back(o, j->b, c0, c1, store))
            return 0;
        nvme_slot_t *s = &o->slot[i];
        char *mem = in_place(j, c0, c1);
        *s = (nvme_slot_t){.job = j, .c0 = c0, .c1 = c1, .mem = mem ? mem : slot_mem(o, i),
                         .write = store, .rmw = store && (c0 < j->lo || c1 > j->hi)};
        j->next = c1;
        j->ios++;
        int rc = store && !s->rmw && !mem ? copy_part(o, q, i) : DT_OK;
        if (rc == DT_OK && store && !s->rmw)
            sum_written(o, i);
        if (rc == DT_OK)
            rc = prep(o, i, store && !s->rmw);
        if (rc != DT_OK)
            release(o, i);
    }
    return 1;
}

/* Slot i's I/O completed with `res` (bytes, or -errno). */
static void complete(dt_offload_t *o, offload_queue_t *q, uint32_t i, int res)
{
    nvme_slot_t *s = &o->slot[i];
    nvme_job_t *j = s->job;
    const int write = s->write && !s->rmw;
    o->inflight--;
    if (res < 0) {
        fail(j, DT_ERR_IO, "%s at byte %llu: %s", write ? "write" : "read",
             (unsigned long long)s->c0, strerror(-res));
    } else if ((uint64_t)res != s->c1 - s->c0) {
        fail(j, DT_ERR_IO, "short %s at byte %llu: %d of %llu bytes (the file was truncated?)",
             write ? "write" : "read", (unsigned long long)s->c0, res,
             (unsigned long long)(s->c1 - s->c0));
    } else if (s->rmw) {
        /* the block as it was (checked: a store must not launder bytes
         * changed under it), the store's bytes over it, written back from
         * the same buffer (which stays held) */
        s->rmw = 0;
        if (j->status == DT_OK && sum_check(o, i) == DT_OK && copy_part(o, q, i) == DT_OK) {
            sum_written(o, i);
            if (prep(o, i, 1) == DT_OK)
                return;
        }
    } else if (!write && j->status == DT_OK && sum_check(o, i) == DT_OK &&
               s->mem == slot_mem(o, i)) {
        copy_part(o, q, i);
    }
    release(o, i);
}

/* Finish every running job with nothing left to start or in flight. */
static void finish_done(dt_offload_t *o, offload_queue_t *q)
{
    nvme_job_t **pp = &o->running;
    while (*pp) {
        nvme_job_t *j = *pp;
        if (j->ios > 0 || (j->status == DT_OK && j->next < j->end)) {
            pp = &j->next_job;
            continue;
        }
        if (j->status == DT_OK && j->r->bytes > 0)
            check_file(j);
        *pp = j->next_job;
        offload_queue_finish(q, j->r, j->status);
        j->r = NULL;
        j->next_job = o->free_jobs;
        o->free_jobs = j;
    }
}

/* The ring failed or an I/O never completed: every running request fails
 * with `why`, and the tier stops submitting (o->broken). */
static void break_all(dt_offload_t *o, offload_queue_t *q, int status, const char *why)
{
    o->broken = 1;
    for (nvme_job_t *j = o->running; j; j = j->next_job) {
        fail(j, status, "%s", why);
        j->ios = 0;
    }
    for (uint32_t i = 0; i < o->n_bounce; i++)
        o->slot[i].job = NULL;
    o->inflight = 0;
    finish_done(o, q);
}

/* Submit what is prepared and wait (one system call, bounded by the
 * queue's timeout) for a completion, then take every one that is ready. */
static void reap(dt_offload_t *o, offload_queue_t *q)
{
    char why[160];
    struct io_uring_cqe *cqe = NULL;
    struct __kernel_timespec ts = {.tv_sec = q->timeout_ms / 1000,
                                   .tv_nsec = (q->timeout_ms % 1000) * 1000000};
    int e = io_uring_submit_and_wait_timeout(&o->ring, &cqe, 1, &ts, NULL);
    if (e == -EINTR || (e >= 0 && !cqe))
        return;
    if (e == -ETIME) {
        snprintf(why, sizeof why, "an I/O did not complete within %lld ms; the tier stops here",
                 (long long)q->timeout_ms);
        break_all(o, q, DT_ERR_TIMEOUT, why);
        return;
    }
    if (e < 0) {
        snprintf(why, sizeof why, "submitting to or waiting for io_uring: %s; the tier stops here",
                 strerror(-e));
        break_all(o, q, DT_ERR_IO, why);
        return;
    }
    do {
        uint32_t i = (uint32_t)io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&o->ring, cqe);
        complete(o, q, i, res);
    } while (io_uring_peek_cqe(&o->ring, &cqe) == 0);
}

/* A request taken off the queue becomes the newest running job; one that
 * cannot run (a broken tier, its file gone) is failed at once. */
static nvme_job_t *admit(dt_offload_t *o, offload_req_t *r)
{
    nvme_job_t *j = o->free_jobs;
    o->free_jobs = j->next_job;
    o->n_reqs++;
    *j = (nvme_job_t){.r = r, .b = r->buf, .lo = r->offset, .hi = r->offset + r->bytes};
    j->next = j->lo / NVME_ALIGN * NVME_ALIGN;
    j->end = r->bytes ? (j->hi + NVME_ALIGN - 1) / NVME_ALIGN * NVME_ALIGN : j->next;
    if (o->broken)
        fail(j, DT_ERR_IO, "an earlier I/O of this tier never completed");
    else if (r->bytes)
        check_file(j);
    nvme_job_t **pp = &o->running;
    while (*pp)
        pp = &(*pp)->next_job;
    *pp = j;
    return j;
}

void nvme_io_loop(void *ctx, offload_queue_t *q)
{
    dt_offload_t *o = ctx;
    for (;;) {
        /* oldest first; a job held back holds back the later ones */
        int waiting = 0;
        for (nvme_job_t *j = o->running; j && !waiting; j = j->next_job)
            waiting = !start_ios(o, q, j);
        /* more requests while the running ones have started everything
         * and a bounce buffer is free; idle, block for the next */
        while (!waiting && o->free_jobs && o->inflight < o->n_bounce) {
            int idle = !o->running && !o->inflight;
            offload_req_t *r = offload_queue_take(q, idle);
            if (!r) {
                if (idle)
                    return; /* the queue stopped */
                break;
            }
            waiting = !start_ios(o, q, admit(o, r));
        }
        finish_done(o, q);
        if (o->inflight)
            reap(o, q);
        finish_done(o, q);
    }
}
