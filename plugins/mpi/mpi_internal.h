/*
 * plugins/mpi/mpi_internal.h - the MPI communicator's private types: the
 * process-wide MPI state (who initialised MPI, the thread level, the abort
 * channel), a group (an MPI communicator with its name and timeout) and a
 * request (one MPI request plus what to do when it completes), and the
 * functions the plugin's three files share.
 *
 *   mpi_comm.c    plugin table, config keys, init / split / abort /
 *                 finalize, MPI_Init_thread and MPI_Finalize
 *   mpi_ops.c     the operations on MPI's nonblocking calls, wait / test
 *                 with the timeout, messages
 *   mpi_reduce.c  dtypes -> MPI datatypes, reductions (user-defined ops
 *                 for bf16 / f16 that add in f32), avg's division
 */
#ifndef DT_MPI_INTERNAL_H
#define DT_MPI_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"
#include "common/comm/creq.h"

/* Limits of the config keys (their key table, mpi_comm.c, declares the
 * defaults). */
#define MPI_SPIN_MAX 1000000
#define MPI_PROGRESS_MAX 1000000
/* [mpi] ring_bytes: all-reduces of at least this many bytes run libnbc's
 * ring (mpi_tune.c); 0 leaves every one to libnbc's own choice. */
#define MPI_RING_MAX (1ll << 40)
/* Tag nobody sends: the progress thread's probe only runs MPI's engine. */
#define MPI_TAG_PROGRESS 8
/* A wait polls MPI_Test back to back for [mpi] spin_us, then with a
 * sched_yield between polls until it has waited MPI_YIELD_NS, then with
 * naps from 20 us doubling up to MPI_POLL_SLEEP_MAX_NS (short: MPI's
 * nonblocking collectives progress only inside MPI calls). */
#define MPI_YIELD_NS 10000000ull
#define MPI_POLL_SLEEP_MAX_NS 200000ull
/* How often a wait also looks at the abort channel. */
#define MPI_ABORT_CHECK_NS 2000000ull
/* Longest timeout honoured (~115 days): keeps ms -> ns products in range. */
#define MPI_TIMEOUT_MAX_MS 10000000000ll
/* Bytes of an abort notice (reason included). */
#define MPI_ABORT_MSG 400
/* With [mpi] abort_job, how long abort lets the peers report the reason
 * before MPI_Abort ends them. */
#define MPI_ABORT_GRACE_NS 1000000000ull
/* Tag of abort notices on the job's control communicator. */
#define MPI_TAG_ABORT 7

/* Shared by every group of the job in this process (world and splits):
 * the job's failure, the abort channel. */
typedef struct mpic_job {
    _Atomic int refs;
    int32_t world_rank, world_size;
    MPI_Comm ctrl;          /* dup of the world: abort notices only */
    MPI_Request abort_req;  /* the posted receive of a peer's notice */
    /* held while one thread tests abort_req (MPI forbids two threads
     * completing one request; groups may run on different threads) */
    pthread_mutex_t poll_lock;
    char abort_buf[MPI_ABORT_MSG];
    /* the job's first failure (a peer's abort notice or our own abort):
     * 0 none, 1 being written, 2 published */
    _Atomic int failed;
    int32_t fail_rank;
    char fail_reason[MPI_ABORT_MSG];
    /* an operation was left with MPI (timed out, failed): MPI_Finalize
     * would wait for it, so the last finalize skips it */
    _Atomic int abandoned;
    int mpi_abort;          /* [mpi] abort_job: abort also calls MPI_Abort */
    int64_t ring_bytes;     /* [mpi] ring_bytes (mpi_tune.c) */
    int64_t spin_ns;
    /* The progress thread ([mpi] progress_us > 0): while operations are
     * in flight it calls into MPI every progress_ns, so they move while
     * the caller computes (Open MPI progresses nonblocking collectives
     * only inside MPI calls).  It touches no request of the callers':
     * an MPI_Iprobe on `ctrl` runs MPI's progress engine. */
    int64_t progress_ns;
    pthread_t prog;
    int prog_started;
    _Atomic int prog_stop;
    _Atomic int inflight;   /* requests started and not yet ended */
    /* callers polling back to back (a wait's spin): the thread leaves
     * MPI to them meanwhile rather than contend for its locks */
    _Atomic int spinning;
    pthread_mutex_t prog_mu;
    pthread_cond_t prog_cv;
} mpic_job_t;

struct dt_comm {
    const dt_comm_ops_v1_t *ops; /* first: the table that made it (dtrain/comm.h) */
    const dt_host_v1_t *host;
    mpic_job_t *job;
    MPI_Comm comm;
    int32_t rank, size;
    int is_world;
    int32_t *wranks;        /* world rank of each group rank */
    char gname[160];        /* "world", "world/g1c0", ... */
    int64_t timeout_ms;     /* default bound of a wait */
    uint32_t split_no;
    uint64_t coll_seq, p2p_seq;
    dt_device_t *dev;
    dt_creq_t *live;        /* started and not yet waited for */
    /* set once an operation timed out or MPI failed: MPI cannot cancel a
     * collective, so the group is out of step for good */
    int broken;
    int broken_status;
    char broken_msg[640];
};

struct dt_comm_req {
    dt_creq_t b;            /* the op, its number, the group's `live` list */
    MPI_Request mreq;
    int counted;            /* still in job->inflight */
    /* set once test or wait saw it end: 1 done, -status failed (msg) */
    int ended;
    char msg[768];
    /* After completion: divide `avg_count` elements at avg_buf by the
     * group size (op avg, which MPI does not have). */
    void *avg_buf;
    uint64_t avg_count;
    /* After completion: copy `tmp_bytes` from tmp to tmp_dst (a
     * reduce_scatter whose recv aliases its send), then free tmp. */
    void *tmp, *tmp_dst;
    size_t tmp_bytes;
};

/* ---- process-wide MPI calls (mpi_comm.c) ---------------------------------
 * When MPI gave less than MPI_THREAD_MULTIPLE (an application initialised
 * it with MPI_THREAD_SERIALIZED), every MPI call of the plugin holds one
 * process-wide lock; otherwise these do nothing. */
void mpic_lock(void);
void mpic_unlock(void);

/* A request started / ended: the progress thread runs while any is in
 * flight (mpi_comm.c). */
void mpic_inflight_add(mpic_job_t *job);
void mpic_inflight_sub(mpic_job_t *job);

/* The job's failure (mpi_comm.c): DT_OK while none, else DT_ERR_REMOTE
 * with "rank R aborted: <reason>" in buf.  Polls the abort channel. */
int mpic_job_failure(mpic_job_t *job, int is_world, char *buf, size_t cap);

/* ---- operations (mpi_ops.c; contracts in comm.h) ----------------------- */
DT_CREQ_OPS(mpic_);
/* At finalize: free the requests nobody waited for; returns how many, and
 * sets *unfinished when one of them had not completed (MPI keeps it). */
int mpic_drop_live(dt_comm_t *c, int *unfinished);
/* "all_reduce #17 (f32, 4194304 bytes) on group world": the shared text
 * (plugins/common/comm/comm_text.h), as every communicator says it. */
void mpic_req_desc(dt_comm_t *c, const struct dt_comm_req *r, char *buf, size_t cap);
/* Text of an MPI error code. */
void mpic_err_text(int code, char *buf, size_t cap);

/* ---- arithmetic (mpi_reduce.c) ------------------------------------------ */
/* Create / free the user-defined ops and datatypes (MPI initialised; once
 * per process, under mpic_lock). */
int mpic_reduce_setup(void);
void mpic_reduce_teardown(void);
/* The MPI datatype for dtype (MPI_DATATYPE_NULL for an unknown one). */
MPI_Datatype mpic_datatype(int dtype);
/* The MPI op reducing dtype with op (avg: the sum's op; the division
 * follows with mpic_avg_divide).  DT_ERR_UNSUPPORTED: avg of an integer
 * dtype; DT_ERR_INVALID: no such op. */
int mpic_reduce_op(int dtype, int op, MPI_Op *out);
/* buf[i] /= group, in f32 for f32 / bf16 / f16 (rounded once), f64 for
 * f64, as the shm communicator divides; (count) elements of dtype. */
void mpic_avg_divide(void *buf, uint64_t count, int dtype, int group);

/* mpi_tune.c: after MPI is up, take the all-reduce algorithm's control
 * variable unless the user set it; before MPI_Finalize, let it go. */
void mpic_tune_up(const dt_host_v1_t *h);
void mpic_tune_down(void);
/* MPI_Iallreduce, libnbc's ring from ring_bytes (0: never) up when the
 * variable is ours. */
int mpic_iallreduce(const void *send, void *recv, int n, MPI_Datatype dt, MPI_Op op,
                    MPI_Comm comm, uint64_t bytes, uint64_t ring_bytes, MPI_Request *req);

#endif /* DT_MPI_INTERNAL_H */
