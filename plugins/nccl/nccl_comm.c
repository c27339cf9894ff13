/*
 * plugins/nccl/nccl_comm.c - the `nccl` communicator plugin: lifecycle
 * (the world from the bootstrapped unique id, a nonblocking NCCL
 * communicator so that no call can hang past its timeout), groups by
 * ncclCommSplit, abort, cleanup_job, and the ops table.  Operations:
 * nccl_ops.c; the unique id: nccl_bootstrap.c.  It needs a device with
 * native CUDA streams (the cuda device).
 *
 * Status: compiled and loaded (describe, the refusal of a non-CUDA
 * device); none of it has run on a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtrain/sdk/cfg.h"
#include "common/comm/comm_split.h"
#include "nccl_internal.h"

static const dt_config_key_t nccl_keys[] = {
    {.name = "poll_us", .type = DT_CFG_INT, .def = "50", .min = 1, .max = 100000,
     .choices = NULL,
     .doc = "microseconds between two looks at an operation's completion event "
            "and ncclCommGetAsyncError while a wait (bounded by the comm timeout) "
            "waits"},
};

int nccl_fail(dt_comm_t *c, const char *what, ncclResult_t r)
{
    char text[NCCL_FAIL_MSG_MAX];
    snprintf(text, sizeof text, "%s: %s (%s)", what, ncclGetErrorString(r),
             c->nc ? ncclGetLastError(c->nc) : "no communicator");
    nccl_break(c, DT_ERR_SYSTEM, text);
    return c->host->set_error(c->host, DT_ERR_SYSTEM, "%s", text);
}

void nccl_break(dt_comm_t *c, int status, const char *msg)
{
    nccl_guard_fail_locked(&c->guard, status, msg);
}

/* The guard's apply (guard.mu held, once per group): abort nc.  NCCL makes
 * the communicator's own device current for its teardown. */
static void abort_nc(void *ctx)
{
    dt_comm_t *c = ctx;
    if (c->nc)
        ncclCommAbort(c->nc);
    c->nc = NULL;
}

int nccl_gpu_guard(dt_comm_t *c, const char *op)
{
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur == c->gpu)
        return DT_OK;
    if (e != cudaSuccess)
        (void)cudaGetLastError(); /* leave no error behind for a launch */
    if ((e = cudaSetDevice(c->gpu)) != cudaSuccess) {
        (void)cudaGetLastError();
        return c->host->set_error(c->host, DT_ERR_SYSTEM, "%s: cudaSetDevice(%d): %s (%s)",
                                  op, c->gpu, cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return DT_OK;
}

/* One look at a nonblocking communicator's async state (nccl_poll). */
typedef struct settle_look {
    ncclComm_t nc;
    ncclResult_t why;
} settle_look_t;

static int look_async(void *ctx)
{
    settle_look_t *l = ctx;
    ncclResult_t st = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(l->nc, &st);
    if (q == ncclSuccess && st == ncclSuccess)
        return 1;
    if (q != ncclSuccess || st != ncclInProgress) {
        l->why = q != ncclSuccess ? q : st;
        return -1;
    }
    return 0;
}

int nccl_settle(dt_comm_t *c, ncclComm_t nc, const char *what)
{
    settle_look_t l = {nc, ncclSuccess};
    nccl_poll_end_t end = nccl_poll(look_async, &l, &c->guard.fail, c->timeout_ms * 1000,
                                    c->poll_us);
    if (end == NCCL_POLL_DONE)
        return DT_OK;
    char text[NCCL_FAIL_MSG_MAX + 256];
    int status;
    if (end == NCCL_POLL_FAILED) {
        status = DT_ERR_SYSTEM;
        snprintf(text, sizeof text, "rank %d: %s: %s (%s)", (int)c->world_rank, what,
                 ncclGetErrorString(l.why), ncclGetLastError(nc));
    } else if (end == NCCL_POLL_TIMEOUT) {
        status = DT_ERR_TIMEOUT;
        snprintf(text, sizeof text, "rank %d: %s: NCCL still in progress after %.1f s; "
                 "the communicator was aborted", (int)c->world_rank, what,
                 (double)c->timeout_ms / 1000.0);
    } else { /* stopped: abort() from another thread, recorded meanwhile */
        status = nccl_broken(c);
        snprintf(text, sizeof text, "rank %d: %s: %s", (int)c->world_rank, what,
                 nccl_broken_msg(c));
    }
    if (nc != c->nc)
        ncclCommAbort(nc); /* split's child: its failure is the split's */
    if (end == NCCL_POLL_STOPPED)
        nccl_guard_apply_locked(&c->guard);
    else if (nc == c->nc)
        nccl_break(c, status, text);
    return c->host->set_error(c->host, status, "%s", text);
}

static ncclConfig_t nonblocking(void)
{
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    return cfg;
}

static void comm_free(dt_comm_t *c)
{
    if (!c)
        return;
    if (c->barrier_buf)
        dt_device_ops(c->dev)->free(c->dev, c->barrier_buf);
    if (c->bounce.dev)
        dt_device_ops(c->dev)->free(c->dev, c->bounce.dev);
    if (c->bounce.host)
        dt_device_ops(c->dev)->host_free(c->dev, c->bounce.host);
    nccl_guard_destroy(&c->guard);
    free(c);
}

/* A group struct on `gpu` with the device and settings given, its barrier
 * word allocated and zeroed (on the default stream, where the barrier
 * runs). */
/* Defined below; every handle this plugin makes starts with it. */
static const dt_comm_ops_v1_t nccl_ops_table;

static dt_comm_t *comm_new(const dt_host_v1_t *host, dt_device_t *dev, int gpu, int64_t timeout_ms,
                           int64_t poll_us, int32_t world_rank)
{
    dt_comm_t *c = calloc(1, sizeof *c);
    if (!c) {
        host->set_error(host, DT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    c->host = host;
    c->ops = &nccl_ops_table;
    c->dev = dev;
    c->gpu = gpu;
    c->timeout_ms = timeout_ms;
    c->poll_us = poll_us;
    c->world_rank = world_rank;
    nccl_guard_init(&c->guard, abort_nc, c);
    if (dt_device_ops(dev)->alloc(dev, sizeof(float), DT_TAG_COMM, &c->barrier_buf) != DT_OK ||
        dt_device_ops(dev)->memset_async(dev, c->barrier_buf, 0, sizeof(float), NULL) != DT_OK) {
        comm_free(c);
        return NULL;
    }
    return c;
}

static void nccl_finalize(dt_comm_t *c)
{
    if (!c)
        return;
    (void)nccl_gpu_guard(c, "finalize"); /* finalize never fails */
    nccl_guard_lock(&c->guard);
    if (c->nc && !nccl_broken(c)) {
        /* flush what was issued, bounded; a failure, the timeout or an
         * abort meanwhile aborts it instead (nccl_settle) */
        ncclResult_t r = ncclCommFinalize(c->nc);
        if (r == ncclSuccess || r == ncclInProgress)
            (void)nccl_settle(c, c->nc, "finalize");
        else
            nccl_break(c, DT_ERR_SYSTEM, "finalize: ncclCommFinalize failed");
    }
    if (c->nc && !nccl_broken(c)) {
        ncclCommDestroy(c->nc);
        c->nc = NULL;
    }
    nccl_guard_unlock(&c->guard); /* a failure recorded meanwhile: aborted here */
    comm_free(c);
}

/* The CUDA device of `dev`: the device of its default stream, so that the
 * group runs on the instance's GPU whatever another instance made current
 * since (the runtime of CUDA 12.8 and later says; before, the current
 * device, which the cuda device's init made its own). */
static int device_gpu(const dt_host_v1_t *host, dt_device_t *dev, int *gpu)
{
    void *native = NULL;
    int rc = dt_device_ops(dev)->native_stream(dev, NULL, &native);
    if (rc != DT_OK)
        return rc;
    cudaError_t e = cudaErrorNotSupported;
#if CUDART_VERSION >= 12080
    e = cudaStreamGetDevice((cudaStream_t)native, gpu);
#endif
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if ((e = cudaGetDevice(gpu)) != cudaSuccess) {
            (void)cudaGetLastError();
            return host->set_error(host, DT_ERR_SYSTEM, "init: which GPU: cudaGetDevice: %s "
                                   "(%s)", cudaGetErrorString(e), cudaGetErrorName(e));
        }
    }
    return DT_OK;
}

static int nccl_init(const dt_host_v1_t *host, const dt_comm_init_v1_t *args,
                     dt_comm_t **out)
{
    dt_comm_init_v1_t a;
    int rc = dt_comm_check_init(host, args, out, &a);
    if (rc != DT_OK)
        return rc;
    int64_t poll_us = 0;
    if ((rc = dt_cfg_int(host, "poll_us", &poll_us)) != DT_OK)
        return rc;
    if (!a.dev || !DT_HAS_OP(dt_device_ops_v1_t, dt_device_ops(a.dev), native_stream) ||
        !dt_device_ops(a.dev)->native_stream)
        return host->set_error(host, DT_ERR_CONFIG,
                               "init: the nccl communicator runs on a CUDA device's streams "
                               "(run.device = \"cuda\"; dtrain bench comm --device cuda); "
                               "device \"%s\" has no native stream",
                               a.dev ? dt_device_ops(a.dev)->info.name : "(none)");
    int gpu = -1;
    if ((rc = device_gpu(host, a.dev, &gpu)) != DT_OK)
        return rc;
    ncclUniqueId id;
    if ((rc = nccl_bootstrap_id(host, &a, &id)) != DT_OK)
        return rc;
    dt_comm_t *c = comm_new(host, a.dev, gpu, a.timeout_ms, poll_us, a.rank);
    if (!c)
        return DT_ERR_NOMEM;
    c->rank = a.rank;
    c->size = a.size;
    snprintf(c->gname, sizeof c->gname, "world");
    /* NCCL binds the communicator to the current device */
    if ((rc = nccl_gpu_guard(c, "init")) != DT_OK) {
        comm_free(c);
        return rc;
    }
    ncclConfig_t cfg = nonblocking();
    ncclComm_t nc = NULL;
    nccl_guard_lock(&c->guard);
    ncclResult_t r = ncclCommInitRankConfig(&nc, a.size, id, a.rank, &cfg);
    c->nc = nc;
    if (r != ncclSuccess && r != ncclInProgress)
        rc = nccl_fail(c, "init: ncclCommInitRankConfig", r);
    else
        rc = nccl_settle(c, c->nc, "init: joining the world");
    nccl_guard_unlock(&c->guard);
    if (rc != DT_OK) {
        nccl_finalize(c);
        return rc;
    }
    nccl_bootstrap_done(&a);
    int ver = 0;
    ncclGetVersion(&ver);
    host->log(host, DT_LOG_INFO, "NCCL %d.%d.%d, rank %d of %d, GPU %d", ver / 10000,
              (ver / 100) % 100, ver % 100, (int)a.rank, (int)a.size, gpu);
    *out = c;
    return DT_OK;
}

int nccl_rank_size(dt_comm_t *c, int32_t *rank, int32_t *size)
{
    if (!c)
        return DT_ERR_INVALID;
    if (rank)
        *rank = c->rank;
    if (size)
        *size = c->size;
    return DT_OK;
}

static int nccl_split_locked(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out);

static int nccl_split(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    if (!c)
        return DT_ERR_INVALID;
    int st = dt_comm_split_check(c->host, c->gname, color, out);
    if (st != DT_OK)
        return st;
    if ((st = nccl_broken(c)))
        return c->host->set_error(c->host, st, "rank %d: split on group %s: the group "
                                  "failed earlier: %s", (int)c->world_rank, c->gname,
                                  nccl_broken_msg(c));
    if ((st = nccl_gpu_guard(c, "split")) != DT_OK)
        return st;
    nccl_guard_lock(&c->guard);
    int rc = nccl_split_locked(c, color, key, out);
    nccl_guard_unlock(&c->guard);
    return rc;
}

/* split's body, with c->guard.mu held. */
static int nccl_split_locked(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    uint32_t n = ++c->nsplits;
    char what[160];
    snprintf(what, sizeof what, "split %u (color %d) of group %s", n, (int)color, c->gname);
    if (!c->nc) /* aborted since the check above */
        return c->host->set_error(c->host, nccl_broken(c) ? nccl_broken(c) : DT_ERR_REMOTE,
                                  "rank %d: %s: %s", (int)c->world_rank, what,
                                  nccl_broken_msg(c));
    ncclConfig_t cfg = nonblocking();
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommSplit(c->nc, color == DT_COMM_NO_COLOR ? NCCL_SPLIT_NOCOLOR
                                                                    : (int)color,
                                   (int)key, &nc, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        char w2[200];
        snprintf(w2, sizeof w2, "rank %d: %s", (int)c->world_rank, what);
        return nccl_fail(c, w2, r);
    }
    int rc = nccl_settle(c, c->nc, what);
    if (rc != DT_OK) {
        if (nc)
            ncclCommAbort(nc);
        return rc;
    }
    if (color == DT_COMM_NO_COLOR || !nc)
        return DT_OK;
    /* the child settles under the parent's lock, so an abort of the
     * parent stops it too (nccl_settle) */
    if ((rc = nccl_settle(c, nc, what)) != DT_OK)
        return rc;
    dt_comm_t *g = comm_new(c->host, c->dev, c->gpu, c->timeout_ms, c->poll_us,
                            c->world_rank);
    if (!g) {
        ncclCommAbort(nc);
        return DT_ERR_NOMEM;
    }
    g->nc = nc;
    int cnt = 0, rk = 0;
    ncclCommCount(nc, &cnt);
    ncclCommUserRank(nc, &rk);
    g->size = cnt;
    g->rank = rk;
    snprintf(g->gname, sizeof g->gname, "%.40s/split %u color %d", c->gname, n, (int)color);
    *out = g;
    return DT_OK;
}

/* Never blocks (comm.h): the failure is recorded at once, and the NCCL
 * communicator is aborted here when no other thread is inside a call on
 * it, else by that thread before it lets go of the lock or within one nap
 * of its bounded poll (nccl_logic.h).  Other ranks learn of it through
 * NCCL (their waits see the aborted peer as an NCCL error and fail with
 * DT_ERR_REMOTE); the reason itself reaches only this rank's messages. */
static int nccl_abort(dt_comm_t *c, const char *reason)
{
    if (!c)
        return DT_ERR_INVALID;
    char text[600];
    snprintf(text, sizeof text, "rank %d aborted the job: %s", (int)c->world_rank,
             reason ? reason : "(no reason given)");
    nccl_guard_abort(&c->guard, DT_ERR_REMOTE, text);
    return DT_OK;
}

static const dt_comm_ops_v1_t nccl_ops_table = {
    .info = DT_PLUGIN_INFO(COMM, dt_comm_ops_v1_t, "nccl", "1.0.0",
                           "NVIDIA NCCL on the cuda device's streams, id through the "
                           "rendezvous; host-memory control messages staged through a "
                           "device buffer; bf16/f16 reduced in their own type, rounded at "
                           "every step (not accumulated in f32); not yet run on 2+ GPUs",
                           nccl_keys),
    .init = nccl_init,
    .finalize = nccl_finalize,
    .rank_size = nccl_rank_size,
    .all_reduce = nccl_all_reduce,
    .reduce_scatter = nccl_reduce_scatter,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .reduce = nccl_reduce,
    .send = nccl_send,
    .recv = nccl_recv,
    .barrier = nccl_barrier,
    .wait = nccl_wait,
    .split = nccl_split,
    .abort = nccl_abort,
    .test = nccl_test,
    .cleanup_job = nccl_cleanup_job,
    .sendrecv = nccl_sendrecv,
};

DT_PLUGIN_ENTRY(comm, 1, dt_comm_ops_v1_t, &nccl_ops_table)
