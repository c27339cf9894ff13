/*
 * plugins/offload_nvme/offload_nvme_internal.h - what the offload_nvme
 * plugin's files share: the instance, its buffers (one file each), and
 * the functions each file gives the others.
 *
 *   offload_nvme.c        keys, init/finalize, alloc/free/capacity, the ops
 *   offload_nvme_files.c  the folder (missing ones made, loose ones
 *                         refused), file names with the job id, the
 *                         free-space check, O_DIRECT probing, the core's
 *                         signal cleanup, cleanup_job
 *   offload_nvme_io.c     the transfers: the queue's worker loop, one
 *                         io_uring ring kept full across requests,
 *                         registered bounce buffers, the read-modify-write
 *                         of partial 4 KiB blocks, overlap ordering, each
 *                         block's checksum kept as written, checked as read
 *   offload_nvme_sum.c    the checksum (CRC-32C, in hardware on x86-64)
 *
 * Locking: the queue's mutex (o->q.mu) guards the buffer list (the tiers' shared one,
 * plugins/common/offload/offload_bufs.h), the byte counts and every buffer's count of
 * transfers in flight.  The ring, the bounce buffers, the slots, the jobs
 * and the buffers' checksums belong to the queue's worker thread alone
 * (after init, before finalize; a buffer's between its alloc and free).
 */
#ifndef DT_OFFLOAD_NVME_INTERNAL_H
#define DT_OFFLOAD_NVME_INTERNAL_H

#include <limits.h>
#include <liburing.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain/dtrain.h"
#include "common/offload/offload_bufs.h"
#include "common/offload/offload_queue.h"

#define NVME_BUF_MAGIC 0x4f4e4246u /* "ONBF" */
#define NVME_ALIGN 4096u           /* O_DIRECT: offsets, sizes, memory */
#define NVME_MAX_BOUNCE 64u

typedef struct nvme_job nvme_job_t;

/* A bounce buffer and the I/O it carries (the worker's).  A whole block
 * of the caller's host memory at a 4 KiB-aligned address is read or
 * written in place: the slot then only counts the I/O in flight. */
typedef struct nvme_slot {
    nvme_job_t *job;              /* NULL: free */
    uint64_t c0, c1;            /* the block's bytes in the job's file */
    char *mem;                  /* the I/O's memory: the bounce buffer or
                                 * the caller's */
    int32_t write;              /* a write, or a store's read before one:
                                 * nothing may overlap it meanwhile */
    int32_t rmw;                /* a store's read of a partial block */
} nvme_slot_t;

/* A request the worker has taken: its aligned blocks [next, end) still to
 * start, `ios` of them holding a slot. */
struct nvme_job {
    offload_req_t *r;
    dt_offload_buf_t *b;
    uint64_t lo, hi;            /* the request's bytes in the file */
    uint64_t next, end;         /* NVME_ALIGN-aligned */
    uint32_t ios;
    int32_t status;             /* the first failure */
    nvme_job_t *next_job;         /* the running jobs, oldest first / free */
};

struct dt_offload_buf {
    offload_buf_t ob;             /* base first: id, bytes, held (the file's
                                 * size, rounded up to NVME_ALIGN and
                                 * reserved), tag, pending */
    int fd;
    int32_t blocks_counted;     /* fstat counted the reserved bytes at creation */
    uint32_t *sums;             /* (held / NVME_ALIGN) the checksum of each
                                 * 4 KiB block as last written (the worker's;
                                 * a zero block's until then); host memory */
    char path[PATH_MAX];
};

struct dt_offload {
    const dt_offload_ops_v1_t *ops; /* first: the table that made it (dtrain/offload.h) */
    offload_queue_t q;                  /* host, rank, device, the worker */
    char dir[PATH_MAX];         /* the folder the files live in */
    char job[128];              /* job id, in every file's name */
    int32_t local_rank;         /* 0 says what is said once per machine */
    size_t made_from;           /* dir's folders past its first made_from
                                 * bytes did not exist at init: finalize
                                 * removes them (when empty) */
    int32_t cleanup_warned;     /* said once that the core's signal cleanup
                                 * list is full */
    int32_t direct;             /* files opened O_DIRECT */
    offload_bufs_t bufs;          /* live buffers; capacity 0 = the file
                                 * system's free space */
    /* the worker's I/O */
    struct io_uring ring;
    int32_t ring_ok;
    int32_t registered;         /* bounce buffers registered (read/write_fixed) */
    int32_t broken;             /* an I/O did not complete in time: the
                                 * kernel may still use the bounce buffers */
    uint32_t queue_depth;
    uint32_t n_bounce;          /* bounce buffers: I/Os in flight at most */
    uint64_t block;             /* bytes per I/O, a multiple of NVME_ALIGN */
    void *bounce;               /* n_bounce * block, NVME_ALIGN-aligned */
    nvme_slot_t slot[NVME_MAX_BOUNCE];
    uint32_t inflight;          /* I/Os in the ring */
    nvme_job_t jobs[NVME_MAX_BOUNCE + 1]; /* running at most: one per busy
                                       * slot and one still starting I/Os */
    nvme_job_t *running, *free_jobs;
    uint64_t n_ios, n_reqs;     /* counted for the finalize line (debug) */
    uint64_t n_bounced;         /* I/Os through a bounce buffer, not in place */
    uint64_t io_bytes[2];       /* bytes the I/Os read [0] and wrote [1] */
    uint32_t max_inflight;
};

static inline const char *nvme_buf_name(const dt_offload_buf_t *b, char *out, size_t n)
{
    snprintf(out, n, "file '%s' (%llu bytes of %s)", b->path, (unsigned long long)b->ob.bytes,
             dt_mem_tag_name(b->ob.tag));
    return out;
}

/* ------------------------------------------------ offload_nvme_files.c */

/* The folder for `path` ("" = the default), made 0700 if missing, with
 * any missing folders above it; refused where another user could change
 * it (see offload_nvme_files.c). */
int nvme_files_dir(dt_offload_t *o, const char *path);
/* Remove the folders nvme_files_dir made, deepest first, while empty. */
void nvme_files_remove_dirs(dt_offload_t *o);
/* Whether the folder takes O_DIRECT (a probe file, removed again). */
int nvme_files_probe_direct(dt_offload_t *o, int *direct);
/* Bytes free for an unprivileged writer in the folder (statvfs). */
int nvme_files_free(dt_offload_t *o, uint64_t *free_bytes);
/* Create buffer b's file (0600, the job id in its name) and reserve its
 * bytes, checking the free space first. */
int nvme_files_create(dt_offload_t *o, dt_offload_buf_t *b);
/* Close and remove b's file. */
void nvme_files_remove(dt_offload_t *o, dt_offload_buf_t *b);
/* The ABI's cleanup_job. */
int nvme_cleanup_job(const dt_host_v1_t *host, const char *job_id);
/* The default folder, and whether a job id may name files. */
const char *nvme_default_dir(char *out, size_t n);
int nvme_valid_job(const char *job);

/* ------------------------------------------------ offload_nvme_sum.c */

/* The checksums (CRC-32C) of `n` NVME_ALIGN-byte blocks at `mem` into
 * out[0..n); any thread. */
void nvme_sum_blocks(const void *mem, uint64_t n, uint32_t *out);
/* A zero block's: what a reserved block never written reads as. */
uint32_t nvme_sum_zero(void);

/* ------------------------------------------------ offload_nvme_io.c */

/* The ring and the registered bounce buffers (init), and their end. */
int nvme_io_init(dt_offload_t *o);
void nvme_io_free(dt_offload_t *o);
/* The queue's worker loop (offload_queue_start_loop). */
void nvme_io_loop(void *ctx, offload_queue_t *q);

#endif /* DT_OFFLOAD_NVME_INTERNAL_H */
