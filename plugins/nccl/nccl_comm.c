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
#include "dtrain/sdk/comm_split.h"
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
    char text[640];
    snprintf(text, sizeof text, "%s: %s (%s)", what, ncclGetErrorString(r),
             c->nc ? ncclGetLastError(c->nc) : "no communicator");
    nccl_break(c, DT_ERR_SYSTEM, text);
    return c->host->set_error(c->host, DT_ERR_SYSTEM, "%s", text);
}

void nccl_break(dt_comm_t *c, int status, const char *msg)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&c->broken, &expected, status)) {
        snprintf(c->broken_msg, sizeof c->broken_msg, "%s", msg);
        if (c->nc)
            ncclCommAbort(c->nc);
        c->nc = NULL;
    }
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int nccl_settle(dt_comm_t *c, ncclComm_t nc, const char *what)
{
    int64_t t0 = now_ms();
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(nc, &st);
        if (q == ncclSuccess && st == ncclSuccess)
            return DT_OK;
        if (q != ncclSuccess || st != ncclInProgress) {
            char text[640];
            ncclResult_t why = q != ncclSuccess ? q : st;
            snprintf(text, sizeof text, "rank %d: %s: %s (%s)", (int)c->world_rank, what,
                     ncclGetErrorString(why), ncclGetLastError(nc));
            if (nc != c->nc)
                ncclCommAbort(nc);
            nccl_break(c, DT_ERR_SYSTEM, text);
            return c->host->set_error(c->host, DT_ERR_SYSTEM, "%s", text);
        }
        if (now_ms() - t0 > c->timeout_ms) {
            char text[640];
            snprintf(text, sizeof text, "rank %d: %s: NCCL still in progress after %.1f s; "
                     "the communicator was aborted", (int)c->world_rank, what,
                     (double)c->timeout_ms / 1000.0);
            if (nc != c->nc)
                ncclCommAbort(nc);
            nccl_break(c, DT_ERR_TIMEOUT, text);
            return c->host->set_error(c->host, DT_ERR_TIMEOUT, "%s", text);
        }
        struct timespec ts = {0, 100 * 1000};
        nanosleep(&ts, NULL);
    }
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
        c->dev_ops->free(c->dev, c->barrier_buf);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

/* A group struct sharing `parent`'s host, device and settings. */
static dt_comm_t *comm_new(const dt_host_v1_t *host, const dt_device_ops_v1_t *dev_ops,
                           dt_device_t *dev, int64_t timeout_ms, int64_t poll_us,
                           int32_t world_rank)
{
    dt_comm_t *c = calloc(1, sizeof *c);
    if (!c) {
        host->set_error(host, DT_ERR_NOMEM, "out of memory");
        return NULL;
    }
    c->host = host;
    c->dev_ops = dev_ops;
    c->dev = dev;
    c->timeout_ms = timeout_ms;
    c->poll_us = poll_us;
    c->world_rank = world_rank;
    pthread_mutex_init(&c->mu, NULL);
    if (dev_ops->alloc(dev, sizeof(float), DT_TAG_COMM, &c->barrier_buf) != DT_OK) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return NULL;
    }
    return c;
}

static void nccl_finalize(dt_comm_t *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    if (c->nc && !atomic_load(&c->broken)) {
        /* flush what was issued, bounded; a failure or the timeout aborts
         * (nccl_settle), which leaves c->nc NULL */
        ncclResult_t r = ncclCommFinalize(c->nc);
        if (r == ncclSuccess || r == ncclInProgress)
            (void)nccl_settle(c, c->nc, "finalize");
        else
            nccl_break(c, DT_ERR_SYSTEM, "finalize: ncclCommFinalize failed");
    }
    if (c->nc)
        ncclCommDestroy(c->nc);
    c->nc = NULL;
    pthread_mutex_unlock(&c->mu);
    comm_free(c);
}

static int nccl_init(const dt_host_v1_t *host, const dt_comm_init_v1_t *args,
                     dt_comm_t **out)
{
    dt_comm_init_v1_t a;
    int rc = dt_comm_check_init(host, args, out, &a);
    if (rc != DT_OK)
        return rc;
    int64_t poll_us = 50;
    if ((rc = dt_cfg_int(host, "poll_us", 50, 1, &poll_us)) != DT_OK)
        return rc;
    if (!a.dev_ops || !a.dev || !DT_HAS_OP(dt_device_ops_v1_t, a.dev_ops, native_stream) ||
        !a.dev_ops->native_stream)
        return host->set_error(host, DT_ERR_CONFIG,
                               "init: the nccl communicator runs on a CUDA device's streams "
                               "(run.device = \"cuda\"); device \"%s\" has no native stream",
                               a.dev_ops ? a.dev_ops->info.name : "(none)");
    ncclUniqueId id;
    if ((rc = nccl_bootstrap_id(host, &a, &id)) != DT_OK)
        return rc;
    dt_comm_t *c = comm_new(host, a.dev_ops, a.dev, a.timeout_ms, poll_us, a.rank);
    if (!c)
        return DT_ERR_NOMEM;
    c->rank = a.rank;
    c->size = a.size;
    snprintf(c->gname, sizeof c->gname, "world");
    ncclConfig_t cfg = nonblocking();
    ncclComm_t nc = NULL;
    pthread_mutex_lock(&c->mu);
    ncclResult_t r = ncclCommInitRankConfig(&nc, a.size, id, a.rank, &cfg);
    c->nc = nc;
    if (r != ncclSuccess && r != ncclInProgress)
        rc = nccl_fail(c, "init: ncclCommInitRankConfig", r);
    else
        rc = nccl_settle(c, c->nc, "init: joining the world");
    pthread_mutex_unlock(&c->mu);
    if (rc != DT_OK) {
        nccl_finalize(c);
        return rc;
    }
    nccl_bootstrap_done(&a);
    int ver = 0;
    ncclGetVersion(&ver);
    host->log(host, DT_LOG_INFO, "NCCL %d.%d.%d, rank %d of %d", ver / 10000,
              (ver / 100) % 100, ver % 100, (int)a.rank, (int)a.size);
    *out = c;
    return DT_OK;
}

static int nccl_rank_size(dt_comm_t *c, int32_t *rank, int32_t *size)
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
    st = atomic_load(&c->broken);
    if (st)
        return c->host->set_error(c->host, st, "rank %d: split on group %s: the group "
                                  "failed earlier: %s", (int)c->world_rank, c->gname,
                                  c->broken_msg);
    pthread_mutex_lock(&c->mu);
    int rc = nccl_split_locked(c, color, key, out);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* split's body, with c->mu held. */
static int nccl_split_locked(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    uint32_t n = ++c->nsplits;
    ncclConfig_t cfg = nonblocking();
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommSplit(c->nc, color == DT_COMM_NO_COLOR ? NCCL_SPLIT_NOCOLOR
                                                                    : (int)color,
                                   (int)key, &nc, &cfg);
    char what[160];
    snprintf(what, sizeof what, "split %u (color %d) of group %s", n, (int)color, c->gname);
    if (r != ncclSuccess && r != ncclInProgress) {
        char w2[200];
        snprintf(w2, sizeof w2, "rank %d: %s", (int)c->world_rank, what);
        return nccl_fail(c, w2, r);
    }
    int rc = nccl_settle(c, c->nc, what);
    if (rc != DT_OK)
        return rc;
    if (color == DT_COMM_NO_COLOR || !nc)
        return DT_OK;
    dt_comm_t *g = comm_new(c->host, c->dev_ops, c->dev, c->timeout_ms, c->poll_us,
                            c->world_rank);
    if (!g) {
        ncclCommAbort(nc);
        return DT_ERR_NOMEM;
    }
    g->nc = nc;
    if ((rc = nccl_settle(g, nc, what)) != DT_OK) {
        comm_free(g);
        return rc;
    }
    int cnt = 0, rk = 0;
    ncclCommCount(nc, &cnt);
    ncclCommUserRank(nc, &rk);
    g->size = cnt;
    g->rank = rk;
    snprintf(g->gname, sizeof g->gname, "%.40s/split %u color %d", c->gname, n, (int)color);
    *out = g;
    return DT_OK;
}

/* Other ranks learn of it through NCCL (their waits see the aborted
 * peer as an NCCL error and fail with DT_ERR_REMOTE); the reason itself
 * reaches only this rank's messages. */
static int nccl_abort(dt_comm_t *c, const char *reason)
{
    if (!c)
        return DT_ERR_INVALID;
    char text[600];
    snprintf(text, sizeof text, "rank %d aborted the job: %s", (int)c->world_rank,
             reason ? reason : "(no reason given)");
    pthread_mutex_lock(&c->mu);
    nccl_break(c, DT_ERR_REMOTE, text);
    pthread_mutex_unlock(&c->mu);
    return DT_OK;
}

static const dt_comm_ops_v1_t nccl_ops_table = {
    .info = DT_PLUGIN_INFO(COMM, dt_comm_ops_v1_t, "nccl", "0.1.0",
                           "NVIDIA NCCL on the cuda device's streams, id through the "
                           "rendezvous (compiled, not yet run on a GPU)",
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
};

DT_PLUGIN_ENTRY(comm, 1, dt_comm_ops_v1_t, &nccl_ops_table)
