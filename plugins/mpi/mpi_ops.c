/*
 * plugins/mpi/mpi_ops.c - the MPI communicator's operations, each started
 * with one MPI nonblocking call (MPI_Iallreduce, MPI_Ireduce_scatter_block,
 * MPI_Iallgather, MPI_Ibcast, MPI_Ireduce, MPI_Ibarrier, MPI_Isend,
 * MPI_Irecv) and waited on by polling MPI_Test, never by MPI_Wait, so
 * that every wait is bounded: by the group's timeout, by the wait's own
 * limit, and by the job's abort channel (a peer's abort fails the wait at
 * once).
 *
 * Messages have the shm communicator's shape, so a user reads the same
 * thing whichever communicator the config names:
 *     all_reduce #17 (f32, 4194304 bytes) on group world: timed out after
 *     1.0 s waiting for rank 1
 * MPI does not say which ranks of a collective have not arrived: in a
 * group of two that is the other rank; in a larger one the message lists
 * every other rank as "one or more of ranks ...".
 *
 * MPI cannot cancel a collective in flight: an operation that timed out or
 * failed stays with MPI (its buffers too), the group is marked broken and
 * later operations on it fail at once, and MPI is not finalized at the end
 * (finalize would wait for the abandoned operation).
 */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_internal.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static dt_comm_names_t names(dt_comm_t *c)
{
    return (dt_comm_names_t){.gname = c->gname, .is_world = c->is_world,
                             .size = c->size, .wranks = c->wranks};
}

void mpic_err_text(int code, char *buf, size_t cap)
{
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(code, s, &n) != MPI_SUCCESS || n <= 0)
        snprintf(buf, cap, "MPI error %d", code);
    else
        snprintf(buf, cap, "%.*s", n, s);
}

void mpic_req_desc(dt_comm_t *c, const struct dt_comm_req *r, char *buf, size_t cap)
{
    dt_comm_names_t g = names(c);
    dt_creq_text(&g, &r->b, buf, cap);
}

/* Whom a request waits for: its peer, the other rank of a pair, or every
 * other rank of the group ("one or more of"). */
static void fmt_waited(dt_comm_t *c, const struct dt_comm_req *r, char *buf, size_t cap)
{
    dt_comm_names_t g = names(c);
    if (dt_creq_is_p2p(&r->b)) {
        dt_comm_fmt_rank(&g, r->b.root, buf, cap);
        return;
    }
    if (c->size == 2) {
        dt_comm_fmt_rank(&g, 1 - c->rank, buf, cap);
        return;
    }
    int *others = malloc(sizeof(int) * (size_t)c->size);
    if (!others) {
        snprintf(buf, cap, "one or more of the other ranks");
        return;
    }
    int n = 0;
    for (int p = 0; p < c->size; p++)
        if (p != c->rank)
            others[n++] = p;
    size_t len = (size_t)snprintf(buf, cap, "one or more of ");
    if (len < cap)
        dt_comm_fmt_ranks(&g, others, n, buf + len, cap - len);
    free(others);
}

/* The group is out of step for good: keep the first cause. */
static void mark_broken(dt_comm_t *c, int status, const char *text)
{
    if (c->broken)
        return;
    c->broken = 1;
    c->broken_status = status;
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s", text);
    atomic_store(&c->job->abandoned, 1);
}

/* r no longer needs the progress thread. */
static void uncount(dt_comm_t *c, struct dt_comm_req *r)
{
    if (r->counted) {
        r->counted = 0;
        mpic_inflight_sub(c->job);
    }
}

/* What a completed request still owes its caller. */
static void finish(dt_comm_t *c, struct dt_comm_req *r)
{
    if (r->avg_buf)
        mpic_avg_divide(r->avg_buf, r->avg_count, r->b.dtype, c->size);
    r->avg_buf = NULL;
    if (r->tmp) {
        memcpy(r->tmp_dst, r->tmp, r->tmp_bytes);
        c->host->free(c->host, r->tmp);
        r->tmp = NULL;
    }
}

/* MPI_Test r once (or recall how it ended).  1: done (and finished),
 * 0: not yet, < 0: -status with the message in r->msg. */
static int test_once(dt_comm_t *c, struct dt_comm_req *r)
{
    if (r->ended)
        return r->ended;
    int flag = 0;
    mpic_lock();
    int rc = MPI_Test(&r->mreq, &flag, MPI_STATUS_IGNORE);
    mpic_unlock();
    if (rc != MPI_SUCCESS) {
        char desc[256], text[MPI_MAX_ERROR_STRING + 16];
        mpic_req_desc(c, r, desc, sizeof desc);
        mpic_err_text(rc, text, sizeof text);
        snprintf(r->msg, sizeof r->msg, "%s: MPI_Test failed: %s", desc, text);
        r->ended = -DT_ERR_REMOTE;
        uncount(c, r);
        return r->ended;
    }
    if (!flag)
        return 0;
    finish(c, r);
    r->ended = 1;
    uncount(c, r);
    return 1;
}

/* Give up on r: a receive is cancelled (MPI can), anything else stays with
 * MPI and the group is broken. */
static void abandon(dt_comm_t *c, struct dt_comm_req *r, int status, const char *text)
{
    int cancelled = 0;
    if (r->b.kind == DT_COMM_OP_RECV && r->mreq != MPI_REQUEST_NULL) {
        mpic_lock();
        if (MPI_Cancel(&r->mreq) == MPI_SUCCESS) {
            /* A cancelled receive completes locally, but bound it anyway. */
            uint64_t t0 = now_ns();
            int flag = 0;
            while (!flag && now_ns() - t0 < 1000000000ull)
                if (MPI_Test(&r->mreq, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                    break;
            cancelled = flag;
        }
        mpic_unlock();
    }
    if (!cancelled)
        mark_broken(c, status, text);
    if (r->tmp)
        r->tmp = NULL; /* MPI may still write it: leaked on purpose */
}

typedef struct drop_ctx {
    dt_comm_t *c;
    int unfinished;
} drop_ctx_t;

/* A request nobody waited for, at finalize: freed; one MPI still holds
 * stays with MPI (its buffers too) and the job is marked abandoned. */
static void drop_one(void *ctx, dt_creq_t *b)
{
    drop_ctx_t *d = ctx;
    dt_comm_t *c = d->c;
    struct dt_comm_req *r = (struct dt_comm_req *)b;
    if (test_once(c, r) == 0) {
        d->unfinished = 1;     /* still with MPI, its buffers too */
        uncount(c, r);
        r->tmp = NULL;         /* MPI may still write it: leaked */
        atomic_store(&c->job->abandoned, 1);
    }
    if (r->tmp)
        c->host->free(c->host, r->tmp);
    free(r);
}

int mpic_drop_live(dt_comm_t *c, int *unfinished)
{
    drop_ctx_t d = {.c = c, .unfinished = 0};
    int n = dt_creq_drop_live(&c->live, drop_one, &d);
    *unfinished = d.unfinished;
    return n;
}

int mpic_wait(dt_comm_t *c, dt_comm_req_t *r, int64_t timeout_ms)
{
    int chk = dt_comm_check_wait(c ? c->host : NULL, r);
    if (chk != DT_OK)
        return chk;
    const dt_host_v1_t *h = c->host;
    char msg[1024], desc[256], who[768], text[MPI_ABORT_MSG + 64];
    int own_limit;
    int64_t ms = dt_creq_limit_ms(timeout_ms, c->timeout_ms, MPI_TIMEOUT_MAX_MS, &own_limit);
    uint64_t t0 = now_ns(), limit = (uint64_t)ms * 1000000ull;
    uint64_t spin_end = t0 + (uint64_t)c->job->spin_ns, next_abort_check = t0;
    uint64_t nap = 20000;
    int st = DT_OK, spinning = spin_end > t0;
    if (spinning)
        atomic_fetch_add(&c->job->spinning, 1);
    for (;;) {
        int done = test_once(c, r);
        if (done > 0)
            break;
        if (done < 0) {
            st = -done;
            snprintf(msg, sizeof msg, "%s", r->msg);
            abandon(c, r, st, msg);
            break;
        }
        uint64_t now = now_ns();
        if (now >= next_abort_check) {
            next_abort_check = now + MPI_ABORT_CHECK_NS;
            int fst = mpic_job_failure(c->job, c->is_world, text, sizeof text);
            if (fst != DT_OK) {
                mpic_req_desc(c, r, desc, sizeof desc);
                snprintf(msg, sizeof msg, "%s: %s", desc, text);
                st = fst;
                abandon(c, r, st, msg);
                break;
            }
        }
        if (now - t0 >= limit) {
            mpic_req_desc(c, r, desc, sizeof desc);
            fmt_waited(c, r, who, sizeof who);
            dt_creq_timeout_text(desc, ms, own_limit, who, msg, sizeof msg);
            st = DT_ERR_TIMEOUT;
            abandon(c, r, st, msg);
            break;
        }
        if (now < spin_end)
            continue;
        if (spinning) {
            atomic_fetch_sub(&c->job->spinning, 1);
            spinning = 0;
        }
        /* MPI progresses only inside its calls, and tells nobody when a
         * request completes: poll on, giving the CPU to whoever needs it
         * (a peer on the same core), as MPI_Wait does when oversubscribed;
         * only a long wait (a peer still computing) naps between polls. */
        if (now - t0 < MPI_YIELD_NS) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, (long)nap};
        nanosleep(&ts, NULL);
        if (nap < MPI_POLL_SLEEP_MAX_NS)
            nap *= 2;
    }
    if (spinning)
        atomic_fetch_sub(&c->job->spinning, 1);
    uncount(c, r); /* abandoned: MPI keeps it, nobody waits for it */
    dt_creq_live_remove(&c->live, &r->b);
    free(r);
    if (st != DT_OK)
        return h->set_error(h, st, "%s", msg);
    return DT_OK;
}

int mpic_test(dt_comm_t *c, dt_comm_req_t *r, int *done)
{
    int chk = dt_comm_check_test(c ? c->host : NULL, r, done);
    if (chk != DT_OK)
        return chk;
    /* a failure is reported by the wait, which test makes immediate */
    *done = test_once(c, r) != 0;
    return DT_OK;
}

/* ---- starting ------------------------------------------------------------ */

typedef struct start {
    struct dt_comm_req t;   /* the request as described so far */
    const void *send;
    void *recv;
} start_t;

/* Every argument check of the operation t describes (sets t->b.esize): the
 * shared ones, with MPI's count limit between them. */
static int check_args(dt_comm_t *c, struct dt_comm_req *t, const void *send,
                      const void *recv)
{
    const dt_host_v1_t *h = c->host;
    dt_comm_names_t g = names(c);
    int st = dt_creq_check_op(h, &g, &t->b);
    dt_comm_op_desc_t d = dt_creq_desc(&t->b);
    if (st == DT_OK && t->b.count > (uint64_t)INT_MAX)
        st = dt_comm_op_fail(h, &g, &d, DT_ERR_UNSUPPORTED, "count %llu is above MPI's "
                             "count limit (%d elements per call); split the buffer",
                             (unsigned long long)t->b.count, INT_MAX);
    if (st == DT_OK)
        st = dt_comm_check_args(h, &g, &d, c->rank, t->b.count, send, recv);
    return st;
}

/* send / recv: MPI's tags are >= 0 (MPI_ANY_TAG only receives). */
static int check_tag(dt_comm_t *c, struct dt_comm_req *t)
{
    if (t->b.tag >= 0 && !(t->b.kind == DT_COMM_OP_SEND && t->b.tag == MPI_ANY_TAG))
        return DT_OK;
    dt_comm_names_t g = names(c);
    dt_comm_op_desc_t d = dt_creq_desc(&t->b);
    return dt_comm_op_fail(c->host, &g, &d, DT_ERR_INVALID, "tag %d must be >= 0",
                           (int)t->b.tag);
}

/* Start r's MPI call; MPI_SUCCESS or MPI's error code. */
static int start_mpi(dt_comm_t *c, struct dt_comm_req *r, const void *send, void *recv)
{
    MPI_Datatype dt = mpic_datatype(r->b.dtype);
    MPI_Op op = MPI_OP_NULL;
    if (r->b.kind == DT_COMM_OP_ALL_REDUCE || r->b.kind == DT_COMM_OP_REDUCE_SCATTER ||
        r->b.kind == DT_COMM_OP_REDUCE)
        mpic_reduce_op(r->b.dtype, r->b.op, &op);
    int n = (int)r->b.count;
    int rc;
    mpic_lock();
    switch (r->b.kind) {
    case DT_COMM_OP_ALL_REDUCE:
        rc = mpic_iallreduce(send == recv ? MPI_IN_PLACE : send, recv, n, dt, op, c->comm,
                             r->b.count * r->b.esize, (uint64_t)c->job->ring_bytes, &r->mreq);
        break;
    case DT_COMM_OP_REDUCE_SCATTER:
        rc = MPI_Ireduce_scatter_block(send, recv, n, dt, op, c->comm, &r->mreq);
        break;
    case DT_COMM_OP_ALL_GATHER: {
        const char *mine = (const char *)recv + (size_t)c->rank * (size_t)n * r->b.esize;
        rc = MPI_Iallgather(send == mine ? MPI_IN_PLACE : send, n, dt, recv, n, dt, c->comm,
                            &r->mreq);
        break;
    }
    case DT_COMM_OP_BROADCAST:
        rc = MPI_Ibcast(recv, n, dt, r->b.root, c->comm, &r->mreq);
        break;
    case DT_COMM_OP_REDUCE:
        rc = MPI_Ireduce(c->rank == r->b.root && send == recv ? MPI_IN_PLACE : send, recv, n, dt,
                         op, r->b.root, c->comm, &r->mreq);
        break;
    case DT_COMM_OP_BARRIER:
        rc = MPI_Ibarrier(c->comm, &r->mreq);
        break;
    case DT_COMM_OP_SEND:
        rc = MPI_Isend(send, n, dt, r->b.root, r->b.tag, c->comm, &r->mreq);
        break;
    case DT_COMM_OP_RECV:
        rc = MPI_Irecv(recv, n, dt, r->b.root, r->b.tag, c->comm, &r->mreq);
        break;
    default:
        rc = MPI_ERR_OTHER;
        break;
    }
    mpic_unlock();
    return rc;
}

static const char *mpi_call_name(int kind)
{
    switch (kind) {
    case DT_COMM_OP_ALL_REDUCE: return "MPI_Iallreduce";
    case DT_COMM_OP_REDUCE_SCATTER: return "MPI_Ireduce_scatter_block";
    case DT_COMM_OP_ALL_GATHER: return "MPI_Iallgather";
    case DT_COMM_OP_BROADCAST: return "MPI_Ibcast";
    case DT_COMM_OP_REDUCE: return "MPI_Ireduce";
    case DT_COMM_OP_BARRIER: return "MPI_Ibarrier";
    case DT_COMM_OP_SEND: return "MPI_Isend";
    case DT_COMM_OP_RECV: return "MPI_Irecv";
    default: return "?";
    }
}

/* Before starting: what is queued on the stream done (host-memory
 * transport), t numbered, the group and the job not failed. */
static int start_check(dt_comm_t *c, struct dt_comm_req *t, dt_stream_t *stream)
{
    char text[MPI_ABORT_MSG + 64];
    int st = dt_creq_stream_sync(c->dev, stream);
    if (st != DT_OK)
        return st;
    dt_creq_number(&t->b, &c->coll_seq, &c->p2p_seq);
    dt_comm_names_t g = names(c);
    if (c->broken)
        return dt_creq_refuse_broken(c->host, &g, &t->b, c->broken_status, c->broken_msg);
    int fst = mpic_job_failure(c->job, c->is_world, text, sizeof text);
    if (fst != DT_OK)
        return dt_creq_refuse_failed(c->host, &g, &t->b, fst, text);
    return DT_OK;
}

/* Start t's MPI call: its request, in flight and on the live list; NULL
 * with the message set when it could not be started. */
static struct dt_comm_req *start_req(dt_comm_t *c, const struct dt_comm_req *t,
                                     const void *send, void *recv, int *status)
{
    const dt_host_v1_t *h = c->host;
    char desc[256];
    dt_comm_names_t g = names(c);
    struct dt_comm_req *r = dt_creq_new(h, &g, t, sizeof *r);
    if (!r) {
        *status = DT_ERR_NOMEM;
        return NULL;
    }
    r->mreq = MPI_REQUEST_NULL;
    /* reduce_scatter into a block of its own input: MPI forbids the
     * overlap (its in-place form leaves the result at block 0), so the
     * block is received beside and copied in at completion */
    if (r->b.kind == DT_COMM_OP_REDUCE_SCATTER && r->b.count) {
        const char *s = send, *d = recv;
        size_t in_bytes = (size_t)r->b.count * r->b.esize * (size_t)c->size;
        size_t out_bytes = (size_t)r->b.count * r->b.esize;
        if (d < s + in_bytes && s < d + out_bytes) {
            r->tmp = h->alloc(h, out_bytes, DT_TAG_COMM);
            if (!r->tmp) {
                free(r);
                mpic_req_desc(c, t, desc, sizeof desc);
                *status = h->set_error(h, DT_ERR_NOMEM, "%s: out of memory for a %zu-byte "
                                       "receive buffer", desc, out_bytes);
                return NULL;
            }
            r->tmp_dst = recv;
            r->tmp_bytes = out_bytes;
            recv = r->tmp;
        }
    }
    if (r->b.op == DT_OP_AVG &&
        (r->b.kind == DT_COMM_OP_ALL_REDUCE || r->b.kind == DT_COMM_OP_REDUCE_SCATTER ||
         (r->b.kind == DT_COMM_OP_REDUCE && c->rank == r->b.root))) {
        r->avg_buf = recv;
        r->avg_count = r->b.count;
    }
    int rc = start_mpi(c, r, send, recv);
    if (rc == MPI_SUCCESS) {
        r->counted = 1;
        mpic_inflight_add(c->job);
    } else {
        char etext[MPI_MAX_ERROR_STRING + 16];
        mpic_err_text(rc, etext, sizeof etext);
        mpic_req_desc(c, r, desc, sizeof desc);
        if (r->tmp)
            h->free(h, r->tmp);
        free(r);
        *status = h->set_error(h, DT_ERR_SYSTEM, "%s: %s failed: %s", desc,
                               mpi_call_name(t->b.kind), etext);
        return NULL;
    }
    dt_creq_live_add(&c->live, &r->b);
    *status = DT_OK;
    return r;
}

/* Number, start, and either hand out the request or wait for it. */
static int submit(dt_comm_t *c, struct dt_comm_req *t, const void *send, void *recv,
                  dt_stream_t *stream, dt_comm_req_t **req)
{
    if (req)
        *req = NULL;
    int st = start_check(c, t, stream);
    if (st != DT_OK)
        return st;
    struct dt_comm_req *r = start_req(c, t, send, recv, &st);
    if (!r)
        return st;
    if (!req)
        return mpic_wait(c, r, -1);
    *req = r;
    return DT_OK;
}

#define CHECK(x)                                                               \
    do {                                                                       \
        int st_ = (x);                                                         \
        if (st_ != DT_OK)                                                      \
            return st_;                                                        \
    } while (0)

int mpic_all_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count, int dtype,
                    int op, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_ALL_REDUCE, .count = count, .dtype = dtype,
                                  .op = op, .root = -1}};
    CHECK(check_args(c, &t, send, recv));
    return submit(c, &t, send, recv, stream, req);
}

int mpic_reduce_scatter(dt_comm_t *c, const void *send, void *recv, uint64_t recv_count,
                        int dtype, int op, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_REDUCE_SCATTER, .count = recv_count,
                                  .dtype = dtype, .op = op, .root = -1}};
    CHECK(check_args(c, &t, send, recv));
    return submit(c, &t, send, recv, stream, req);
}

int mpic_all_gather(dt_comm_t *c, const void *send, void *recv, uint64_t send_count,
                    int dtype, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_ALL_GATHER, .count = send_count,
                                  .dtype = dtype, .root = -1}};
    CHECK(check_args(c, &t, send, recv));
    return submit(c, &t, send, recv, stream, req);
}

int mpic_broadcast(dt_comm_t *c, void *buf, uint64_t count, int dtype, int32_t root,
                   dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_BROADCAST, .count = count, .dtype = dtype,
                                  .root = root}};
    CHECK(check_args(c, &t, buf, NULL));
    return submit(c, &t, buf, buf, stream, req);
}

int mpic_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count, int dtype,
                int op, int32_t root, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_REDUCE, .count = count, .dtype = dtype,
                                  .op = op, .root = root}};
    CHECK(check_args(c, &t, send, recv));
    return submit(c, &t, send, recv, stream, req);
}

int mpic_send(dt_comm_t *c, const void *buf, uint64_t count, int dtype, int32_t peer,
              int32_t tag, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_SEND, .count = count, .dtype = dtype,
                                  .root = peer, .tag = tag}};
    CHECK(check_args(c, &t, buf, NULL));
    CHECK(check_tag(c, &t));
    return submit(c, &t, buf, NULL, stream, req);
}

int mpic_recv(dt_comm_t *c, void *buf, uint64_t count, int dtype, int32_t peer, int32_t tag,
              dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_RECV, .count = count, .dtype = dtype,
                                  .root = peer, .tag = tag}};
    CHECK(check_args(c, &t, NULL, buf));
    CHECK(check_tag(c, &t));
    return submit(c, &t, NULL, buf, stream, req);
}

/* MPI_Isend and MPI_Irecv never wait for their match: started one after
 * the other, neither holds up the other.  Both halves are checked first;
 * if MPI refuses to start the recv once the send is started, the send
 * stays with MPI and the group is failed (MPI cannot take a send back). */
int mpic_sendrecv(dt_comm_t *c, const void *sendbuf, uint64_t send_count, void *recvbuf,
                  uint64_t recv_count, int dtype, int32_t send_peer, int32_t recv_peer,
                  int32_t send_tag, int32_t recv_tag, dt_stream_t *stream,
                  dt_comm_req_t **send_req, dt_comm_req_t **recv_req)
{
    if (!c)
        return DT_ERR_INVALID;
    int rq = dt_comm_sendrecv_reqs(c->host, send_req, recv_req);
    if (rq != DT_OK)
        return rq;
    struct dt_comm_req ts = {.b = {.kind = DT_COMM_OP_SEND, .count = send_count, .dtype = dtype,
                                   .root = send_peer, .tag = send_tag}};
    struct dt_comm_req tr = {.b = {.kind = DT_COMM_OP_RECV, .count = recv_count, .dtype = dtype,
                                   .root = recv_peer, .tag = recv_tag}};
    CHECK(check_args(c, &ts, sendbuf, NULL));
    CHECK(check_tag(c, &ts));
    CHECK(check_args(c, &tr, NULL, recvbuf));
    CHECK(check_tag(c, &tr));
    CHECK(start_check(c, &ts, stream));
    tr.b.seq = ++c->p2p_seq;
    int st;
    struct dt_comm_req *rs = start_req(c, &ts, sendbuf, NULL, &st);
    if (!rs)
        return st;
    struct dt_comm_req *rr = start_req(c, &tr, NULL, recvbuf, &st);
    if (!rr) {
        mark_broken(c, st, "a sendrecv's recv could not be started after its send");
        uncount(c, rs); /* MPI keeps the send */
        dt_creq_live_remove(&c->live, &rs->b);
        free(rs);
        return st;
    }
    if (send_req) {
        *send_req = rs;
        *recv_req = rr;
        return DT_OK;
    }
    st = mpic_wait(c, rs, -1);
    int st2 = mpic_wait(c, rr, -1);
    return st != DT_OK ? st : st2;
}

int mpic_barrier(dt_comm_t *c, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_BARRIER, .dtype = DT_U8, .esize = 1,
                                  .root = -1}};
    return submit(c, &t, NULL, NULL, NULL, req);
}

int mpic_rank_size(dt_comm_t *c, int32_t *rank, int32_t *size)
{
    if (!c)
        return DT_ERR_INVALID;
    if (rank)
        *rank = c->rank;
    if (size)
        *size = c->size;
    return DT_OK;
}
