/*
 * plugins/nccl/nccl_internal.h - what the nccl communicator's files share:
 * the group and request structs, the NCCL error helper, the device guard,
 * and the bootstrap seam (nccl_bootstrap.c); the decisions that need no
 * GPU are declared in nccl_logic.h.  Nothing here is exported from the
 * module.
 */
#ifndef DT_NCCL_INTERNAL_H
#define DT_NCCL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "dtrain/comm.h"
#include "common/comm/creq.h"
#include "nccl_logic.h"

/* What a started operation is, for messages, and the event that marks its
 * end on the stream it was enqueued on. */
struct dt_comm_req {
    dt_creq_t b;     /* the op and its number (one count for every op of the
                      * group; no live list: NCCL's stream holds the op) */
    cudaEvent_t ev;
};

/* The group's bounce buffers for host memory (comm.h: control messages),
 * grown on first use, kept up to NCCL_BOUNCE_KEEP bytes each. */
typedef struct nccl_bounce {
    void *dev;          /* device memory (DT_TAG_COMM) */
    void *host;         /* pinned host memory (host_alloc, DT_TAG_STAGING) */
    uint64_t dev_cap, host_cap;
} nccl_bounce_t;

struct dt_comm {
    const dt_comm_ops_v1_t *ops; /* first: the table that made it (dtrain/comm.h) */
    const dt_host_v1_t *host;
    /* The lock of nc and the failure record (nccl_logic.h): every NCCL
     * call on nc is made with guard.mu held, ncclCommAbort included, and
     * abort() never waits for it.  Held for one call, or one bounded
     * settle, never across an operation's wait: a wait takes it for each
     * look. */
    nccl_guard_t guard;
    ncclComm_t nc;      /* NULL once aborted or destroyed (guarded by mu) */
    int32_t rank, size; /* in this group */
    int32_t world_rank;
    int gpu;            /* the CUDA device of dev, made current at every
                         * entry that calls CUDA (nccl_gpu_guard) */
    int64_t timeout_ms;
    int64_t poll_us;
    dt_device_t *dev;
    void *barrier_buf;  /* one f32 of device memory (DT_TAG_COMM), zeroed */
    nccl_bounce_t bounce; /* driven by the group's one thread (comm.h) */
    char gname[96];     /* "world", "world/split 1 color 0" */
    uint64_t seq;
    uint32_t nsplits;
};

/* "<what>: <ncclGetErrorString> (<ncclGetLastError>)"; DT_ERR_SYSTEM.
 * With guard.mu held. */
int nccl_fail(dt_comm_t *c, const char *what, ncclResult_t r);

/* With c->guard.mu held: wait until nonblocking communicator nc's last
 * call finished (its async state leaves ncclInProgress), at most
 * timeout_ms, stopping early when c's failure is recorded (abort from
 * another thread).  nc is c->nc, or a communicator being made from it
 * (split's child; not c's own, so its failure fails only the split).
 * DT_OK, or the error (message set, prefixed `what`), with nc aborted. */
int nccl_settle(dt_comm_t *c, ncclComm_t nc, const char *what);

/* With c->guard.mu held: mark the group failed (first reason wins) and
 * abort the NCCL communicator, so no collective of it can hang. */
void nccl_break(dt_comm_t *c, int status, const char *msg);

/* The group's failure status (0: healthy) and its message. */
static inline int nccl_broken(const dt_comm_t *c)
{
    return nccl_fail_status(&c->guard.fail);
}
static inline const char *nccl_broken_msg(const dt_comm_t *c)
{
    return c->guard.fail.msg;
}

/* Make c->gpu the calling thread's current CUDA device (cudaSetDevice
 * only when cudaGetDevice says otherwise, as the cuda device's guard
 * does): DT_OK, or DT_ERR_SYSTEM "<op>: cudaSetDevice(<gpu>): ...". */
int nccl_gpu_guard(dt_comm_t *c, const char *op);

/* ---- bootstrap (nccl_bootstrap.c) ----
 * The world's ncclUniqueId, agreed by every rank of the job, bounded by
 * timeout_ms.  Rank 0 makes it; the others learn it through the host's
 * rendezvous (bootstrap_all_gather: one node or several, the only way
 * across machines), or, where the host offers none (an older core, or a
 * program outside `dtrain run`), through a file in /dev/shm named by the
 * job id (one machine only; a world spanning machines is then refused
 * with DT_ERR_UNSUPPORTED saying why). */
int nccl_bootstrap_id(const dt_host_v1_t *host, const dt_comm_init_v1_t *a,
                      ncclUniqueId *id);
/* Remove the published id file, if any, once every rank has joined
 * (rank 0; nothing to do after the rendezvous). */
void nccl_bootstrap_done(const dt_comm_init_v1_t *a);
/* cleanup_job: the id files a job left behind. */
int nccl_cleanup_job(const dt_host_v1_t *host, const char *job_id);

/* ---- operations (nccl_ops.c, rank_size in nccl_comm.c), the ABI's
 * signatures ---- */
DT_CREQ_OPS(nccl_);

#endif /* DT_NCCL_INTERNAL_H */
