/*
 * plugins/nccl/nccl_ops.c - the nccl communicator's operations: each is
 * enqueued on the device stream the caller names (the cuda device's native
 * cudaStream_t), an event is recorded behind it, and wait polls that event
 * and ncclCommGetAsyncError until it completes, NCCL reports an error, or
 * the timeout passes; on the last two the communicator is aborted
 * (ncclCommAbort), so nothing hangs, and the message names this rank, the
 * operation, its sequence number and bytes, shaped like shm's.
 *
 * Point to point: NCCL matches sends and receives between two ranks in the
 * order they are issued and has no tags; the tag is carried into messages
 * only, so a pair of ranks must issue them in the same order (a reordering
 * by tag is not detected).  bf16 and f16 are reduced by NCCL in their own
 * type's arithmetic as NCCL implements it (not promised f32 accumulation).
 * Compiled; not yet run on a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_internal.h"

/* NCCL keeps no map to world ranks: a group's ranks are named plainly. */
static dt_comm_names_t names(const dt_comm_t *c)
{
    return (dt_comm_names_t){.gname = c->gname, .size = c->size};
}

static dt_comm_op_desc_t op_desc(const struct dt_comm_req *r)
{
    return (dt_comm_op_desc_t){.kind = r->kind, .seq = r->seq, .dtype = r->dtype,
                               .op = r->op, .root = r->root, .tag = r->tag,
                               .bytes = r->bytes};
}

/* "all_reduce #12 (f32, 4096 bytes) on group world": the SDK's text
 * (dtrain/sdk/comm_text.h), as every communicator says it. */
static void req_desc(const dt_comm_t *c, const struct dt_comm_req *r, char *buf,
                     size_t cap)
{
    dt_comm_names_t g = names(c);
    dt_comm_op_desc_t d = op_desc(r);
    dt_comm_op_text(&g, &d, buf, cap);
}

static int nccl_type(int dtype, ncclDataType_t *out)
{
    switch (dtype) {
    case DT_F32: *out = ncclFloat32; return 1;
    case DT_BF16: *out = ncclBfloat16; return 1;
    case DT_F16: *out = ncclFloat16; return 1;
    case DT_I32: *out = ncclInt32; return 1;
    default: return 0;
    }
}

static int nccl_red(int op, ncclRedOp_t *out)
{
    switch (op) {
    case DT_OP_SUM: *out = ncclSum; return 1;
    case DT_OP_AVG: *out = ncclAvg; return 1;
    case DT_OP_MAX: *out = ncclMax; return 1;
    case DT_OP_MIN: *out = ncclMin; return 1;
    default: return 0;
    }
}

/* Everything an operation checks before NCCL sees it (the SDK's checks,
 * NCCL's dtypes between them); fills r and *cs. */
static int begin(dt_comm_t *c, struct dt_comm_req *r, int kind, int dtype, int op,
                 uint64_t count, int32_t root, int32_t tag, const void *send,
                 const void *recv, dt_stream_t *stream, cudaStream_t *cs,
                 ncclDataType_t *nt, ncclRedOp_t *nr)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->seq = ++c->seq;
    r->dtype = dtype;
    r->op = op;
    r->root = root;
    r->tag = tag;
    size_t esize = dt_dtype_size(dtype);
    r->bytes = count * (esize ? esize : 1);
    const dt_host_v1_t *h = c->host;
    dt_comm_names_t g = names(c);
    dt_comm_op_desc_t d = op_desc(r);
    int st = atomic_load(&c->broken);
    if (st) {
        char desc[256];
        dt_comm_op_text(&g, &d, desc, sizeof desc);
        return h->set_error(h, st, "rank %d: %s: the group failed earlier: %s",
                            (int)c->world_rank, desc, c->broken_msg);
    }
    if ((st = dt_comm_check_dtype(h, &g, &d)) != DT_OK ||
        (st = dt_comm_check_reduce(h, &g, &d)) != DT_OK)
        return st;
    if (!nccl_type(dtype, nt))
        return dt_comm_op_fail(h, &g, &d, DT_ERR_UNSUPPORTED, "dtype %s: the nccl "
                               "communicator moves f32, bf16, f16 and i32",
                               dt_dtype_name(dtype));
    if ((st = dt_comm_check_args(h, &g, &d, c->rank, count, send, recv)) != DT_OK)
        return st;
    if (op >= 0)
        nccl_red(op, nr); /* a dt_reduce_op_t: checked above */
    void *native = NULL;
    int rc = c->dev_ops->native_stream(c->dev, stream, &native);
    if (rc != DT_OK)
        return rc;
    *cs = (cudaStream_t)native;
    return DT_OK;
}

/* After the NCCL call (c->mu held): settle it, record the event behind it
 * on `cs`; *out is the request. */
static int finish(dt_comm_t *c, struct dt_comm_req *r, ncclResult_t nr, cudaStream_t cs,
                  struct dt_comm_req **out)
{
    char desc[256];
    req_desc(c, r, desc, sizeof desc);
    if (nr != ncclSuccess && nr != ncclInProgress) {
        char what[300];
        snprintf(what, sizeof what, "rank %d: %s", (int)c->world_rank, desc);
        return nccl_fail(c, what, nr);
    }
    int rc = nccl_settle(c, c->nc, desc);
    if (rc != DT_OK)
        return rc;
    struct dt_comm_req *q = malloc(sizeof *q);
    if (!q)
        return c->host->set_error(c->host, DT_ERR_NOMEM, "%s: out of memory", desc);
    *q = *r;
    cudaError_t e = cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming);
    if (e == cudaSuccess && (e = cudaEventRecord(q->ev, cs)) != cudaSuccess)
        cudaEventDestroy(q->ev);
    if (e != cudaSuccess) {
        free(q);
        return c->host->set_error(c->host, DT_ERR_SYSTEM, "%s: recording its event: %s",
                                  desc, cudaGetErrorString(e));
    }
    *out = q;
    return DT_OK;
}

/* Check, enqueue `call` under c->mu, then hand the request out or (req ==
 * NULL) wait for it with the group's timeout. */
#define START(kind, dtype, op, count, root, tag, send, recv, call)             \
    do {                                                                       \
        if (!c)                                                                \
            return DT_ERR_INVALID;                                             \
        if (req)                                                               \
            *req = NULL;                                                       \
        struct dt_comm_req r_, *q_ = NULL;                                     \
        cudaStream_t cs = NULL;        /* set by begin; the initial values */ \
        ncclDataType_t nt = ncclFloat32; /* quiet gcc -O3's maybe-uninit */  \
        ncclRedOp_t nr = ncclSum;                                              \
        pthread_mutex_lock(&c->mu);                                            \
        int rc_ = begin(c, &r_, (kind), (dtype), (op), (count), (root), (tag), \
                        (send), (recv), stream, &cs, &nt, &nr);                \
        if (rc_ == DT_OK)                                                      \
            rc_ = finish(c, &r_, (call), cs, &q_);                             \
        pthread_mutex_unlock(&c->mu);                                          \
        if (rc_ != DT_OK)                                                      \
            return rc_;                                                        \
        if (req) {                                                             \
            *req = q_;                                                         \
            return DT_OK;                                                      \
        }                                                                      \
        return nccl_wait(c, q_, -1);                                           \
    } while (0)

int nccl_all_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count,
                    int dtype, int op, dt_stream_t *stream, dt_comm_req_t **req)
{
    START(DT_COMM_OP_ALL_REDUCE, dtype, op, count, -1, 0, send, recv,
          ncclAllReduce(send, recv, (size_t)count, nt, nr, c->nc, cs));
}

int nccl_reduce_scatter(dt_comm_t *c, const void *send, void *recv,
                        uint64_t recv_count, int dtype, int op,
                        dt_stream_t *stream, dt_comm_req_t **req)
{
    START(DT_COMM_OP_REDUCE_SCATTER, dtype, op, recv_count, -1, 0, send, recv,
          ncclReduceScatter(send, recv, (size_t)recv_count, nt, nr, c->nc, cs));
}

int nccl_all_gather(dt_comm_t *c, const void *send, void *recv,
                    uint64_t send_count, int dtype, dt_stream_t *stream,
                    dt_comm_req_t **req)
{
    START(DT_COMM_OP_ALL_GATHER, dtype, -1, send_count, -1, 0, send, recv,
          ncclAllGather(send, recv, (size_t)send_count, nt, c->nc, cs));
}

int nccl_broadcast(dt_comm_t *c, void *buf, uint64_t count, int dtype,
                   int32_t root, dt_stream_t *stream, dt_comm_req_t **req)
{
    START(DT_COMM_OP_BROADCAST, dtype, -1, count, root, 0, buf, NULL,
          ncclBroadcast(buf, buf, (size_t)count, nt, (int)root, c->nc, cs));
}

int nccl_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count,
                int dtype, int op, int32_t root, dt_stream_t *stream,
                dt_comm_req_t **req)
{
    START(DT_COMM_OP_REDUCE, dtype, op, count, root, 0, send, recv,
          ncclReduce(send, recv, (size_t)count, nt, nr, (int)root, c->nc, cs));
}

int nccl_send(dt_comm_t *c, const void *buf, uint64_t count, int dtype,
              int32_t peer, int32_t tag, dt_stream_t *stream, dt_comm_req_t **req)
{
    START(DT_COMM_OP_SEND, dtype, -1, count, peer, tag, buf, NULL,
          ncclSend(buf, (size_t)count, nt, (int)peer, c->nc, cs));
}

int nccl_recv(dt_comm_t *c, void *buf, uint64_t count, int dtype, int32_t peer,
              int32_t tag, dt_stream_t *stream, dt_comm_req_t **req)
{
    START(DT_COMM_OP_RECV, dtype, -1, count, peer, tag, NULL, buf,
          ncclRecv(buf, (size_t)count, nt, (int)peer, c->nc, cs));
}

/* An all-reduce of one f32 on the default stream: every rank arrives. */
int nccl_barrier(dt_comm_t *c, dt_comm_req_t **req)
{
    dt_stream_t *stream = NULL;
    START(DT_COMM_OP_BARRIER, DT_F32, DT_OP_SUM, 1, -1, 0, NULL, NULL,
          ncclAllReduce(c->barrier_buf, c->barrier_buf, 1, nt, nr, c->nc, cs));
}

static void sleep_us(int64_t us)
{
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* 1 done, 0 not yet, or a negative status (message set, group broken).
 * Takes c->mu for the one look. */
static int poll_locked(dt_comm_t *c, struct dt_comm_req *r, const char *desc)
{
    int b = atomic_load(&c->broken);
    if (b) /* abort() from another thread, or an earlier failure */
        return -c->host->set_error(c->host, b, "rank %d: %s: %s", (int)c->world_rank, desc,
                                   c->broken_msg);
    cudaError_t e = cudaEventQuery(r->ev);
    if (e == cudaSuccess)
        return 1;
    if (e != cudaErrorNotReady) {
        char text[600];
        snprintf(text, sizeof text, "rank %d: %s: %s (%s)", (int)c->world_rank, desc,
                 cudaGetErrorString(e), cudaGetErrorName(e));
        nccl_break(c, DT_ERR_SYSTEM, text);
        return -c->host->set_error(c->host, DT_ERR_SYSTEM, "%s", text);
    }
    ncclResult_t st = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(c->nc, &st);
    if (q != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
        char text[600];
        ncclResult_t why = q != ncclSuccess ? q : st;
        snprintf(text, sizeof text, "rank %d: %s: NCCL reports a failure (a peer died or "
                 "the network broke): %s (%s); the communicator was aborted",
                 (int)c->world_rank, desc, ncclGetErrorString(why), ncclGetLastError(c->nc));
        nccl_break(c, DT_ERR_REMOTE, text);
        return -c->host->set_error(c->host, DT_ERR_REMOTE, "%s", text);
    }
    return 0;
}

static int poll_once(dt_comm_t *c, struct dt_comm_req *r, const char *desc)
{
    pthread_mutex_lock(&c->mu);
    int got = poll_locked(c, r, desc);
    pthread_mutex_unlock(&c->mu);
    return got;
}

int nccl_wait(dt_comm_t *c, dt_comm_req_t *req, int64_t timeout_ms)
{
    int chk = dt_comm_check_wait(c ? c->host : NULL, req);
    if (chk != DT_OK)
        return chk;
    struct dt_comm_req *r = req;
    char desc[256];
    req_desc(c, r, desc, sizeof desc);
    int64_t limit = (timeout_ms < 0 ? c->timeout_ms : timeout_ms) * 1000;
    int64_t t0 = now_us();
    int rc = DT_OK;
    for (;;) {
        int got = poll_once(c, r, desc);
        if (got != 0) {
            rc = got > 0 ? DT_OK : -got;
            break;
        }
        if (now_us() - t0 >= limit) {
            char text[400];
            snprintf(text, sizeof text, "rank %d: %s: timed out after %.1f s (NCCL does not "
                     "say which peer; the communicator was aborted)", (int)c->world_rank,
                     desc, (double)limit / 1e6);
            pthread_mutex_lock(&c->mu);
            nccl_break(c, DT_ERR_TIMEOUT, text);
            pthread_mutex_unlock(&c->mu);
            rc = c->host->set_error(c->host, DT_ERR_TIMEOUT, "%s", text);
            break;
        }
        sleep_us(c->poll_us);
    }
    cudaEventDestroy(r->ev);
    free(r);
    return rc;
}

int nccl_test(dt_comm_t *c, dt_comm_req_t *req, int *done)
{
    int chk = dt_comm_check_test(c ? c->host : NULL, req, done);
    if (chk != DT_OK)
        return chk;
    char desc[256];
    req_desc(c, req, desc, sizeof desc);
    int got = poll_once(c, req, desc);
    if (got < 0)
        return -got;
    *done = got;
    return DT_OK;
}
