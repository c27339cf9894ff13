/*
 * plugins/nccl/nccl_ops.c - the nccl communicator's operations: each is
 * enqueued on the device stream the caller names (the cuda device's native
 * cudaStream_t), an event is recorded behind it, and wait polls that event
 * and ncclCommGetAsyncError until it completes, NCCL reports an error, the
 * group fails (abort from any thread) or the timeout passes; on the last
 * three the communicator is aborted (ncclCommAbort), so nothing hangs, and
 * the message names this rank, the operation, its sequence number and
 * bytes, shaped like shm's.
 *
 * Memory (comm.h): device memory of the group's GPU goes to NCCL as it is.
 * Host memory, which the core passes for its control messages (a config
 * hash, a flag, the loss), is staged whole through the group's bounce
 * buffers (nccl_buffers.c decides where): host -> pinned -> device before
 * the NCCL call, device -> pinned -> host after, all on the caller's
 * stream, and the operation completes, within the group's timeout, before
 * it returns; the request it hands out is already complete.  Point to
 * point refuses host memory (a staged send would wait for its receiver).
 * Every entry that calls CUDA makes the group's GPU current first.
 *
 * Point to point: NCCL matches sends and receives between two ranks in the
 * order they are issued and has no tags; the tag is carried into messages
 * only, so a pair of ranks must issue them in the same order (a reordering
 * by tag is not detected).  bf16 and f16 are reduced by NCCL in their own
 * type's arithmetic as NCCL implements it, each step of its ring or tree
 * rounding its partial result to the type (comm.h: not accumulated in
 * f32).  Compiled; not yet run on two or more GPUs.
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

/* "all_reduce #12 (f32, 4096 bytes) on group world": the shared text
 * (plugins/common/comm/comm_text.h), as every communicator says it. */
static void req_desc(const dt_comm_t *c, const struct dt_comm_req *r, char *buf,
                     size_t cap)
{
    dt_comm_names_t g = names(c);
    dt_creq_text(&g, &r->b, buf, cap);
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

/* One operation as the caller asked for it. */
typedef struct op_args {
    int kind, dtype, op;
    uint64_t count;
    int32_t root, tag; /* root, or the peer of send / recv; -1 */
    const void *send;  /* broadcast: its one buffer */
    void *recv;        /* broadcast: the same buffer */
} op_args_t;

/* What NCCL is given: the types and the buffers after staging. */
typedef struct op_wire {
    ncclDataType_t nt;
    uint64_t n;        /* NCCL's count */
    ncclRedOp_t nr;
    cudaStream_t cs;
    const void *send;
    void *recv;
    int staged;        /* host memory went through the bounce buffers */
    nccl_stage_plan_t plan;
} op_wire_t;

static const char *mem_name(nccl_mem_t m)
{
    switch (m) {
    case NCCL_MEM_HOST: return "host memory";
    case NCCL_MEM_OTHER_GPU: return "device memory of another GPU";
    default: return "memory the CUDA runtime cannot place";
    }
}

/* What memory `p` is (nccl_mem_of with the runtime's query); a refusal
 * fails the operation naming the buffer. */
static int classify(dt_comm_t *c, const struct dt_comm_req *r, const char *which,
                    const void *p, nccl_mem_t *m)
{
    int where = -1;
    cudaError_t err = cudaSuccess;
    *m = nccl_mem_of(cudaPointerGetAttributes, p, c->gpu, &where, &err);
    if (*m == NCCL_MEM_UNKNOWN)
        (void)cudaGetLastError(); /* leave no error behind for a launch */
    int st = nccl_mem_allowed(r->b.kind, *m);
    if (st == DT_OK)
        return DT_OK;
    dt_comm_names_t g = names(c);
    dt_comm_op_desc_t d = dt_creq_desc(&r->b);
    if (st == DT_ERR_UNSUPPORTED)
        return dt_comm_op_fail(c->host, &g, &d, st, "%s buffer %p is host memory: the nccl "
                               "communicator's sends and receives take device memory of "
                               "GPU %d (a staged transfer would wait for its peer)",
                               which, p, c->gpu);
    if (*m == NCCL_MEM_OTHER_GPU)
        return dt_comm_op_fail(c->host, &g, &d, st, "%s buffer %p is %s (GPU %d); this "
                               "group runs on GPU %d", which, p, mem_name(*m), where, c->gpu);
    return dt_comm_op_fail(c->host, &g, &d, st, "%s buffer %p is %s: "
                           "cudaPointerGetAttributes: %s", which, p, mem_name(*m),
                           cudaGetErrorString(err));
}

/* Grow the bounce buffers to the plan's needs (c->guard.mu held).  A
 * failed allocation keeps the device's message (it names the tag and the
 * size); the operation is logged beside it. */
static int bounce_reserve(dt_comm_t *c, const struct dt_comm_req *r, const nccl_stage_plan_t *p)
{
    nccl_bounce_t *b = &c->bounce;
    int rc = DT_OK;
    const char *what = "device";
    uint64_t cap = 0;
    if (p->dev_bytes > b->dev_cap || !b->dev) {
        if (b->dev)
            dt_device_ops(c->dev)->free(c->dev, b->dev);
        b->dev = NULL;
        b->dev_cap = 0;
        cap = p->dev_bytes > 4096 ? p->dev_bytes : 4096;
        if ((rc = dt_device_ops(c->dev)->alloc(c->dev, cap, DT_TAG_COMM, &b->dev)) == DT_OK)
            b->dev_cap = cap;
    }
    if (rc == DT_OK && (p->host_bytes > b->host_cap || !b->host)) {
        if (b->host)
            dt_device_ops(c->dev)->host_free(c->dev, b->host);
        b->host = NULL;
        b->host_cap = 0;
        what = "pinned host";
        cap = p->host_bytes > 4096 ? p->host_bytes : 4096;
        if ((rc = dt_device_ops(c->dev)->host_alloc(c->dev, cap, DT_TAG_STAGING, &b->host)) ==
            DT_OK)
            b->host_cap = cap;
    }
    if (rc != DT_OK) {
        char desc[256];
        req_desc(c, r, desc, sizeof desc);
        c->host->log(c->host, DT_LOG_ERROR, "rank %d: %s: staging its host memory: a %s "
                     "buffer of %llu bytes could not be allocated", (int)c->world_rank, desc,
                     what, (unsigned long long)cap);
    }
    return rc;
}

/* After a staged operation (its copies done): give back bounce buffers
 * above NCCL_BOUNCE_KEEP; the next one grows them again. */
static void bounce_trim(dt_comm_t *c)
{
    nccl_bounce_t *b = &c->bounce;
    if (b->dev && b->dev_cap > NCCL_BOUNCE_KEEP) {
        dt_device_ops(c->dev)->free(c->dev, b->dev);
        b->dev = NULL;
        b->dev_cap = 0;
    }
    if (b->host && b->host_cap > NCCL_BOUNCE_KEEP) {
        dt_device_ops(c->dev)->host_free(c->dev, b->host);
        b->host = NULL;
        b->host_cap = 0;
    }
}

/* Everything an operation checks before NCCL sees it (the shared checks,
 * NCCL's dtypes between them, the memory of each buffer), then the GPU
 * made current, the stream, and the host buffers staged in (their H2D
 * copies enqueued on the stream).  Fills r and w.  c->guard.mu held. */
static int begin(dt_comm_t *c, struct dt_comm_req *r, const op_args_t *a, dt_stream_t *stream,
                 op_wire_t *w)
{
    memset(r, 0, sizeof *r);
    size_t esize = dt_dtype_size(a->dtype);
    r->b = (dt_creq_t){.kind = a->kind, .seq = ++c->seq, .dtype = a->dtype, .op = a->op,
                       .root = a->root, .tag = a->tag, .count = a->count,
                       .esize = esize ? esize : 1};
    const dt_host_v1_t *h = c->host;
    dt_comm_names_t g = names(c);
    dt_comm_op_desc_t d = dt_creq_desc(&r->b);
    int st = nccl_broken(c);
    if (st) {
        char desc[256];
        dt_comm_op_text(&g, &d, desc, sizeof desc);
        return h->set_error(h, st, "rank %d: %s: the group failed earlier: %s",
                            (int)c->world_rank, desc, nccl_broken_msg(c));
    }
    if ((st = dt_creq_check_op(h, &g, &r->b)) != DT_OK)
        return st;
    if (!nccl_wire(a->kind, a->dtype, a->count, &w->nt, &w->n))
        return dt_comm_op_fail(h, &g, &d, DT_ERR_UNSUPPORTED, "dtype %s: NCCL has no such "
                               "type: the nccl communicator reduces f32, bf16, f16, f64, i32, "
                               "i64 and u8, and moves u16 as bytes",
                               dt_dtype_name(a->dtype));
    if ((st = dt_comm_check_args(h, &g, &d, c->rank, a->count, a->send, a->recv)) != DT_OK)
        return st;
    if (a->op >= 0)
        nccl_red(a->op, &w->nr); /* a dt_reduce_op_t: checked above */
    if ((st = nccl_gpu_guard(c, dt_comm_op_name(a->kind))) != DT_OK)
        return st;
    void *native = NULL;
    if ((st = dt_device_ops(c->dev)->native_stream(c->dev, stream, &native)) != DT_OK)
        return st;
    w->cs = (cudaStream_t)native;
    w->send = a->send;
    w->recv = a->recv;
    w->staged = 0;
    if (a->kind == DT_COMM_OP_BARRIER || a->count == 0)
        return DT_OK;
    /* reduce's recv matters on its root only (NCCL ignores it elsewhere) */
    const int recv_used = a->kind != DT_COMM_OP_REDUCE || c->rank == a->root;
    nccl_mem_t ms = NCCL_MEM_NONE, mr = NCCL_MEM_NONE;
    if ((st = classify(c, r, a->kind == DT_COMM_OP_BROADCAST ? "data" : "send", a->send,
                       &ms)) != DT_OK ||
        (a->kind != DT_COMM_OP_BROADCAST && recv_used &&
         (st = classify(c, r, "recv", a->recv, &mr)) != DT_OK))
        return st;
    if (a->kind == DT_COMM_OP_BROADCAST)
        mr = ms;
    if (!recv_used && a->recv && nccl_mem_of(cudaPointerGetAttributes, a->recv, c->gpu, NULL,
                                             NULL) != NCCL_MEM_DEVICE) {
        (void)cudaGetLastError();
        w->recv = NULL; /* never a host pointer to NCCL, even one it ignores */
    }
    if (!nccl_stage_plan(a->kind, a->count, esize, c->size, c->rank, a->root, a->send,
                         a->recv, ms, mr, &w->plan))
        return DT_OK;
    /* host memory: through the bounce buffers (nccl_buffers.c) */
    const nccl_stage_plan_t *p = &w->plan;
    if ((st = bounce_reserve(c, r, p)) != DT_OK)
        return st;
    char *dev = c->bounce.dev;
    if (p->stage_send)
        w->send = dev + p->send_off;
    if (p->stage_recv)
        w->recv = dev + p->recv_off;
    if (a->kind == DT_COMM_OP_BROADCAST)
        w->recv = (void *)w->send;
    if (p->copy_in) {
        memcpy(c->bounce.host, a->send, p->send_bytes);
        cudaError_t e = cudaMemcpyAsync((void *)w->send, c->bounce.host, p->send_bytes,
                                        cudaMemcpyHostToDevice, w->cs);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return dt_comm_op_fail(h, &g, &d, DT_ERR_SYSTEM, "staging the host send buffer "
                                   "in: cudaMemcpyAsync: %s (%s)", cudaGetErrorString(e),
                                   cudaGetErrorName(e));
        }
    }
    w->staged = 1;
    return DT_OK;
}

/* The NCCL call of the operation, on the wire buffers. */
static ncclResult_t issue(dt_comm_t *c, const op_args_t *a, const op_wire_t *w)
{
    switch (a->kind) {
    case DT_COMM_OP_ALL_REDUCE:
        return ncclAllReduce(w->send, w->recv, (size_t)w->n, w->nt, w->nr, c->nc, w->cs);
    case DT_COMM_OP_REDUCE_SCATTER:
        return ncclReduceScatter(w->send, w->recv, (size_t)w->n, w->nt, w->nr, c->nc, w->cs);
    case DT_COMM_OP_ALL_GATHER:
        return ncclAllGather(w->send, w->recv, (size_t)w->n, w->nt, c->nc, w->cs);
    case DT_COMM_OP_BROADCAST:
        return ncclBroadcast(w->send, w->recv, (size_t)w->n, w->nt, (int)a->root, c->nc,
                             w->cs);
    case DT_COMM_OP_REDUCE:
        return ncclReduce(w->send, w->recv, (size_t)w->n, w->nt, w->nr, (int)a->root, c->nc,
                          w->cs);
    case DT_COMM_OP_SEND:
        return ncclSend(w->send, (size_t)w->n, w->nt, (int)a->root, c->nc, w->cs);
    case DT_COMM_OP_RECV:
        return ncclRecv(w->recv, (size_t)w->n, w->nt, (int)a->root, c->nc, w->cs);
    case DT_COMM_OP_BARRIER:
        return ncclAllReduce(c->barrier_buf, c->barrier_buf, 1, ncclFloat32, ncclSum, c->nc,
                             w->cs);
    default: return ncclInvalidUsage;
    }
}

/* After the NCCL call (c->guard.mu held): settle it, enqueue a staged
 * operation's copy out (device -> pinned), record the event behind it on
 * the stream; *out is the request. */
static int finish(dt_comm_t *c, struct dt_comm_req *r, ncclResult_t nr, const op_wire_t *w,
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
    if (w->staged && w->plan.copy_out) {
        cudaError_t e = cudaMemcpyAsync(c->bounce.host, w->recv, w->plan.recv_bytes,
                                        cudaMemcpyDeviceToHost, w->cs);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return c->host->set_error(c->host, DT_ERR_SYSTEM, "rank %d: %s: staging the "
                                      "result out: cudaMemcpyAsync: %s (%s)",
                                      (int)c->world_rank, desc, cudaGetErrorString(e),
                                      cudaGetErrorName(e));
        }
    }
    struct dt_comm_req *q = malloc(sizeof *q);
    if (!q)
        return c->host->set_error(c->host, DT_ERR_NOMEM, "%s: out of memory", desc);
    *q = *r;
    cudaError_t e = cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming);
    if (e == cudaSuccess && (e = cudaEventRecord(q->ev, w->cs)) != cudaSuccess)
        cudaEventDestroy(q->ev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(q);
        return c->host->set_error(c->host, DT_ERR_SYSTEM, "%s: recording its event: %s",
                                  desc, cudaGetErrorString(e));
    }
    *out = q;
    return DT_OK;
}

static int wait_req(dt_comm_t *c, struct dt_comm_req *r, int64_t timeout_ms);

static void req_free(struct dt_comm_req *r)
{
    cudaEventDestroy(r->ev);
    free(r);
}

/* Check, stage, enqueue under the lock; then hand the request out or
 * (req == NULL) wait for it with the group's timeout.  A staged operation
 * is waited for here either way, and its result copied to the caller's
 * host memory; the request handed out is then complete. */
static int run_op(dt_comm_t *c, const op_args_t *a, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    if (req)
        *req = NULL;
    struct dt_comm_req r, *q = NULL;
    op_wire_t w;
    memset(&w, 0, sizeof w);
    w.nr = ncclSum;
    nccl_guard_lock(&c->guard);
    int rc = begin(c, &r, a, stream, &w);
    if (rc == DT_OK)
        rc = finish(c, &r, issue(c, a, &w), &w, &q);
    nccl_guard_unlock(&c->guard);
    if (rc != DT_OK)
        return rc;
    if (w.staged) {
        rc = wait_req(c, q, -1);
        if (rc == DT_OK && w.plan.copy_out)
            memcpy(a->kind == DT_COMM_OP_BROADCAST ? (void *)a->send : a->recv,
                   c->bounce.host, w.plan.recv_bytes);
        if (rc == DT_OK)
            bounce_trim(c);
        if (rc != DT_OK || !req) {
            req_free(q);
            return rc;
        }
    }
    if (req) {
        *req = q;
        return DT_OK;
    }
    rc = wait_req(c, q, -1);
    req_free(q);
    return rc;
}

int nccl_all_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count,
                    int dtype, int op, dt_stream_t *stream, dt_comm_req_t **req)
{
    op_args_t a = {DT_COMM_OP_ALL_REDUCE, dtype, op, count, -1, 0, send, recv};
    return run_op(c, &a, stream, req);
}

int nccl_reduce_scatter(dt_comm_t *c, const void *send, void *recv,
                        uint64_t recv_count, int dtype, int op,
                        dt_stream_t *stream, dt_comm_req_t **req)
{
    op_args_t a = {DT_COMM_OP_REDUCE_SCATTER, dtype, op, recv_count, -1, 0, send, recv};
    return run_op(c, &a, stream, req);
}

int nccl_all_gather(dt_comm_t *c, const void *send, void *recv,
                    uint64_t send_count, int dtype, dt_stream_t *stream,
                    dt_comm_req_t **req)
{
    op_args_t a = {DT_COMM_OP_ALL_GATHER, dtype, -1, send_count, -1, 0, send, recv};
    return run_op(c, &a, stream, req);
}

int nccl_broadcast(dt_comm_t *c, void *buf, uint64_t count, int dtype,
                   int32_t root, dt_stream_t *stream, dt_comm_req_t **req)
{
    op_args_t a = {DT_COMM_OP_BROADCAST, dtype, -1, count, root, 0, buf, buf};
    return run_op(c, &a, stream, req);
}

int nccl_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count,
                int dtype, int op, int32_t root, dt_stream_t *stream,
                dt_comm_req_t **req)
{
    op_args_t a = {DT_COMM_OP_REDUCE, dtype, op, count, root, 0, send, recv};
    return run_op(c, &a, stream, req);
}

int nccl_send(dt_comm_t *c, const void *buf, uint64_t count, int dtype,
              int32_t peer, int32_t tag, dt_stream_t *stream, dt_comm_req_t **req)
{
    op_args_t a = {DT_COMM_OP_SEND, dtype, -1, count, peer, tag, buf, NULL};
    return run_op(c, &a, stream, req);
}

int nccl_recv(dt_comm_t *c, void *buf, uint64_t count, int dtype, int32_t peer,
              int32_t tag, dt_stream_t *stream, dt_comm_req_t **req)
{
    op_args_t a = {DT_COMM_OP_RECV, dtype, -1, count, peer, tag, NULL, buf};
    return run_op(c, &a, stream, req);
}

/* A send and a recv as one NCCL group (ncclGroupStart/End), so neither
 * waits for the other to be matched: two ranks that each send first then
 * receive would otherwise block in their sends on the GPU (review B8;
 * Megatron's batch_isend_irecv).  Both halves are checked (and host
 * memory refused, as send and recv refuse it) before either starts; each
 * gets its request, or both are waited for (NULL, NULL). */
int nccl_sendrecv(dt_comm_t *c, const void *sendbuf, uint64_t send_count, void *recvbuf,
                  uint64_t recv_count, int dtype, int32_t send_peer, int32_t recv_peer,
                  int32_t send_tag, int32_t recv_tag, dt_stream_t *stream,
                  dt_comm_req_t **send_req, dt_comm_req_t **recv_req)
{
    if (!c)
        return DT_ERR_INVALID;
    int rq = dt_comm_sendrecv_reqs(c->host, send_req, recv_req);
    if (rq != DT_OK)
        return rq;
    op_args_t as = {DT_COMM_OP_SEND, dtype, -1, send_count, send_peer, send_tag, sendbuf, NULL};
    op_args_t ar = {DT_COMM_OP_RECV, dtype, -1, recv_count, recv_peer, recv_tag, NULL, recvbuf};
    struct dt_comm_req rs, rr, *qs = NULL, *qr = NULL;
    op_wire_t ws, wr;
    memset(&ws, 0, sizeof ws);
    memset(&wr, 0, sizeof wr);
    ws.nr = wr.nr = ncclSum;
    nccl_guard_lock(&c->guard);
    int rc = begin(c, &rs, &as, stream, &ws);
    if (rc == DT_OK)
        rc = begin(c, &rr, &ar, stream, &wr);
    if (rc == DT_OK && (ws.staged || wr.staged)) /* begin refuses host memory in p2p */
        rc = c->host->set_error(c->host, DT_ERR_INVALID, "rank %d: sendrecv: a host buffer "
                                "was staged", (int)c->world_rank);
    if (rc == DT_OK) {
        ncclResult_t g = ncclGroupStart();
        ncclResult_t n1 = g == ncclSuccess ? issue(c, &as, &ws) : g;
        ncclResult_t n2 = g == ncclSuccess ? issue(c, &ar, &wr) : g;
        ncclResult_t e = g == ncclSuccess ? ncclGroupEnd() : g;
        ncclResult_t first = n1 != ncclSuccess && n1 != ncclInProgress ? n1
                             : n2 != ncclSuccess && n2 != ncclInProgress ? n2
                                                                          : e;
        rc = finish(c, &rs, first, &ws, &qs);
        if (rc == DT_OK)
            rc = finish(c, &rr, ncclSuccess, &wr, &qr);
    }
    nccl_guard_unlock(&c->guard);
    if (rc != DT_OK) {
        if (qs)
            req_free(qs);
        return rc;
    }
    if (send_req) {
        *send_req = qs;
        *recv_req = qr;
        return DT_OK;
    }
    rc = wait_req(c, qr, -1);
    int rc2 = wait_req(c, qs, -1);
    req_free(qr);
    req_free(qs);
    return rc != DT_OK ? rc : rc2;
}

/* An all-reduce of the group's one zeroed f32 on the default stream: every
 * rank arrives (the sum of zeros stays zero). */
int nccl_barrier(dt_comm_t *c, dt_comm_req_t **req)
{
    op_args_t a = {DT_COMM_OP_BARRIER, DT_F32, DT_OP_SUM, 1, -1, 0, NULL, NULL};
    return run_op(c, &a, NULL, req);
}

/* One look at a request, taking c->guard.mu for it: 1 done, 0 not yet,
 * -1 failed (message set, group broken). */
typedef struct req_look {
    dt_comm_t *c;
    struct dt_comm_req *r;
    const char *desc;
    int status; /* the failure's, for -1 */
} req_look_t;

static int look_locked(req_look_t *l)
{
    dt_comm_t *c = l->c;
    int b = nccl_broken(c);
    if (b || !c->nc) { /* abort() from another thread, or an earlier failure */
        l->status = b ? b : DT_ERR_REMOTE;
        c->host->set_error(c->host, l->status, "rank %d: %s: %s", (int)c->world_rank,
                           l->desc, nccl_broken_msg(c));
        return -1;
    }
    cudaError_t e = cudaEventQuery(l->r->ev);
    if (e == cudaSuccess)
        return 1;
    if (e != cudaErrorNotReady) {
        (void)cudaGetLastError();
        char text[NCCL_FAIL_MSG_MAX];
        snprintf(text, sizeof text, "rank %d: %s: %s (%s)", (int)c->world_rank, l->desc,
                 cudaGetErrorString(e), cudaGetErrorName(e));
        nccl_break(c, DT_ERR_SYSTEM, text);
        l->status = DT_ERR_SYSTEM;
        c->host->set_error(c->host, DT_ERR_SYSTEM, "%s", text);
        return -1;
    }
    ncclResult_t st = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(c->nc, &st);
    if (q != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
        char text[NCCL_FAIL_MSG_MAX];
        ncclResult_t why = q != ncclSuccess ? q : st;
        snprintf(text, sizeof text, "rank %d: %s: NCCL reports a failure (a peer died or "
                 "the network broke): %s (%s); the communicator was aborted",
                 (int)c->world_rank, l->desc, ncclGetErrorString(why), ncclGetLastError(c->nc));
        nccl_break(c, DT_ERR_REMOTE, text);
        l->status = DT_ERR_REMOTE;
        c->host->set_error(c->host, DT_ERR_REMOTE, "%s", text);
        return -1;
    }
    return 0;
}

static int look_req(void *ctx)
{
    req_look_t *l = ctx;
    nccl_guard_lock(&l->c->guard);
    int got = look_locked(l);
    nccl_guard_unlock(&l->c->guard);
    return got;
}

/* Poll r until it completes, fails, the group fails, or timeout_ms (< 0:
 * the group's) passes; the request stays the caller's. */
static int wait_req(dt_comm_t *c, struct dt_comm_req *r, int64_t timeout_ms)
{
    char desc[256];
    req_desc(c, r, desc, sizeof desc);
    int rc = nccl_gpu_guard(c, "wait");
    if (rc != DT_OK)
        return rc;
    int64_t limit_us = (timeout_ms < 0 ? c->timeout_ms : timeout_ms) * 1000;
    req_look_t l = {c, r, desc, DT_OK};
    /* the group's failure is seen by the look itself, with its message */
    switch (nccl_poll(look_req, &l, NULL, limit_us, c->poll_us)) {
    case NCCL_POLL_DONE: return DT_OK;
    case NCCL_POLL_TIMEOUT: {
        char text[NCCL_FAIL_MSG_MAX];
        snprintf(text, sizeof text, "rank %d: %s: timed out after %.1f s (NCCL does not "
                 "say which peer; the communicator was aborted)", (int)c->world_rank, desc,
                 (double)limit_us / 1e6);
        nccl_guard_lock(&c->guard);
        nccl_break(c, DT_ERR_TIMEOUT, text);
        nccl_guard_unlock(&c->guard);
        return c->host->set_error(c->host, DT_ERR_TIMEOUT, "%s", text);
    }
    default: return l.status ? l.status : DT_ERR_SYSTEM;
    }
}

int nccl_wait(dt_comm_t *c, dt_comm_req_t *req, int64_t timeout_ms)
{
    int chk = dt_comm_check_wait(c ? c->host : NULL, req);
    if (chk != DT_OK)
        return chk;
    int rc = wait_req(c, req, timeout_ms);
    req_free(req);
    return rc;
}

int nccl_test(dt_comm_t *c, dt_comm_req_t *req, int *done)
{
    int chk = dt_comm_check_test(c ? c->host : NULL, req, done);
    if (chk != DT_OK)
        return chk;
    int rc = nccl_gpu_guard(c, "test");
    if (rc != DT_OK)
        return rc;
    char desc[256];
    req_desc(c, req, desc, sizeof desc);
    req_look_t l = {c, req, desc, DT_OK};
    int got = look_req(&l);
    if (got < 0)
        return l.status;
    *done = got;
    return DT_OK;
}
