/*
 * core/interpose/interpose_comm.c - the interposer over a comm plugin's
 * table (interpose.h): every slot runs the user's before hook, the
 * plugin's slot on the plugin's handle, and the after hook.
 *
 * The group handle the wrapper hands out (struct dt_comm below) carries
 * the plugin's handle, the init host (for messages), the world rank and
 * the requests this group started and nobody waited for yet, so a wait is
 * reported with the operation it completes.  Requests themselves are the
 * plugin's and pass through, as does abort, so the plugin's bounded waits
 * and its abort behave exactly as without the wrapper.
 *
 * Each slot's signature is written once, in IC_PLAIN_SLOTS (slots that
 * only forward) or as a function (init, finalize, wait, split,
 * cleanup_job, sendrecv: they create or destroy handles or requests, or
 * hand out two).  The
 * compile-time checks after the includes prove the slot enum of
 * interpose.h follows dt_comm_ops_t field by field.
 */
#include "interpose/interpose.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

typedef void (*ic_fn_t)(void);

/* DT_INTERPOSE_COMM_SLOTS names the table's slots in field order: */
#define IC_CHECK_ORDER(up, field, flags)                                       \
    _Static_assert(offsetof(dt_comm_ops_t, field) ==                           \
                       offsetof(dt_comm_ops_t, init) + DT_ICOMM_##up * sizeof(ic_fn_t), \
                   "DT_INTERPOSE_COMM_SLOTS: " #field " is not at its position in "    \
                   "dt_comm_ops_t");
DT_INTERPOSE_COMM_SLOTS(IC_CHECK_ORDER)
_Static_assert(sizeof(dt_comm_ops_t) ==
                   offsetof(dt_comm_ops_t, init) + DT_ICOMM_SLOT_COUNT * sizeof(ic_fn_t),
               "dt_comm_ops_t has a slot DT_INTERPOSE_COMM_SLOTS does not list");

#define IC_NAME(up, field, flags) #field,
#define IC_FLAGS(up, field, flags) (flags),
static const char *const ic_names[DT_ICOMM_SLOT_COUNT] = {DT_INTERPOSE_COMM_SLOTS(IC_NAME)};
static const uint32_t ic_flags[DT_ICOMM_SLOT_COUNT] = {DT_INTERPOSE_COMM_SLOTS(IC_FLAGS)};

struct dt_interpose_comm {
    dt_comm_ops_t ops;              /* the table handed out */
    const dt_comm_ops_t *inner;     /* the plugin's */
    dt_interpose_hooks_t hooks;
    int pool;                       /* its trampolines (init, cleanup_job) */
    _Atomic uint64_t seq[DT_ICOMM_SLOT_COUNT];
};

/* A request this group started, until its wait. */
typedef struct ic_req {
    dt_comm_req_t *req;
    int32_t slot;
} ic_req_t;

/* The group handle the wrapper hands out. */
struct dt_comm {
    const dt_comm_ops_v1_t *ops; /* first: the table that made it (dtrain/comm.h) */
    dt_interpose_comm_t *ic;
    dt_comm_t *inner;               /* the plugin's handle */
    const dt_host_t *host;          /* the host init was given */
    int32_t world_rank, rank, size;
    ic_req_t *reqs;                 /* started, not waited for */
    uint32_t n_reqs, cap_reqs;
};

/* One call in progress: what the hooks see and what the wrapper needs. */
typedef struct ic_call {
    dt_interpose_comm_call_t k;
    dt_interpose_comm_t *ic;
    dt_comm_t *g;                   /* NULL for init and cleanup_job */
    dt_comm_req_t **reqp;           /* start slots: the caller's out */
    int called;                     /* the plugin's slot ran */
    uint64_t t0;
} ic_call_t;

/* ---- requests ----------------------------------------------------------- */

static int req_find(const dt_comm_t *g, const dt_comm_req_t *req)
{
    for (uint32_t i = g->n_reqs; i-- > 0;)
        if (g->reqs[i].req == req)
            return (int)i;
    return -1;
}

/* Out of memory only costs the wait its operation's name. */
static void req_track(dt_comm_t *g, dt_comm_req_t *req, int32_t slot)
{
    if (g->n_reqs == g->cap_reqs) {
        uint32_t cap = g->cap_reqs ? 2 * g->cap_reqs : 16;
        ic_req_t *r = realloc(g->reqs, cap * sizeof *r);
        if (!r)
            return;
        g->reqs = r;
        g->cap_reqs = cap;
    }
    g->reqs[g->n_reqs++] = (ic_req_t){.req = req, .slot = slot};
}

static void req_forget(dt_comm_t *g, const dt_comm_req_t *req)
{
    int i = req_find(g, req);
    if (i >= 0)
        g->reqs[i] = g->reqs[--g->n_reqs];
}

/* ---- one call ----------------------------------------------------------- */

static void call_begin(ic_call_t *x, dt_interpose_comm_t *ic, dt_comm_t *g, int slot)
{
    memset(x, 0, sizeof *x);
    x->ic = ic;
    x->g = g;
    dt_interpose_comm_call_t *k = &x->k;
    k->base.kind = DT_KIND_COMM;
    k->base.slot = (uint32_t)slot;
    k->base.name = ic_names[slot];
    k->base.op = ic_names[slot];
    k->base.flags = ic_flags[slot];
    k->base.seq = atomic_fetch_add(&ic->seq[slot], 1) + 1;
    k->base.rank = g ? g->world_rank : -1;
    k->ops = ic->inner;
    k->comm = g ? g->inner : NULL;
    k->host = g ? g->host : NULL;
    k->group_rank = g ? g->rank : -1;
    k->group_size = g ? g->size : -1;
    k->dtype = k->reduce_op = k->peer = k->tag = k->recv_peer = k->recv_tag = -1;
    k->req_slot = -1;
}

/* The data a start slot moves (the buffers it reads and writes), and
 * where its request goes. */
static void call_data(ic_call_t *x, const void *send, void *recv, uint64_t count, int dtype,
                      int op, int32_t peer, int32_t tag, dt_comm_req_t **req)
{
    x->k.send = send;
    x->k.recv = recv;
    x->k.count = count;
    x->k.dtype = dtype;
    x->k.reduce_op = op;
    x->k.peer = peer;
    x->k.tag = tag;
    x->k.base.bytes = count * (uint64_t)dt_dtype_size(dtype);
    x->reqp = req;
}

/* A wait or test: which operation its request belongs to. */
static void call_request(ic_call_t *x, dt_comm_req_t *req)
{
    x->k.req = req;
    int i = x->g ? req_find(x->g, req) : -1;
    if (i >= 0) {
        x->k.req_slot = x->g->reqs[i].slot;
        x->k.base.op = ic_names[x->k.req_slot];
    }
}

/* The before hook; a failure it injects hands out no request. */
static int call_enter(ic_call_t *x)
{
    const dt_interpose_hooks_t *h = &x->ic->hooks;
    int rc = h->before ? h->before(h->ctx, &x->k.base) : DT_OK;
    if (rc != DT_OK && x->reqp)
        *x->reqp = NULL;
    x->called = rc == DT_OK;
    x->t0 = x->ic->hooks.untimed ? 0 : dt_interpose_now_ns();
    return rc;
}

/* The after hook, with the status the caller gets. */
static int call_leave(ic_call_t *x, int rc)
{
    uint64_t elapsed = x->called && !x->ic->hooks.untimed ? dt_interpose_now_ns() - x->t0 : 0;
    if (rc == DT_OK && x->reqp && *x->reqp) {
        x->k.req = *x->reqp;
        if (x->g)
            req_track(x->g, *x->reqp, (int32_t)x->k.base.slot);
    }
    const dt_interpose_hooks_t *h = &x->ic->hooks;
    if (h->after)
        h->after(h->ctx, &x->k.base, rc, elapsed);
    return rc;
}

static int null_group(const char *slot)
{
    return dt_err_set(DT_ERR_INVALID, "comm interposer: %s: NULL group", slot);
}

/* ---- slots that forward ------------------------------------------------- */

/* X(ENUM, field, (parameters), (the plugin's arguments), describe the call) */
#define IC_PLAIN_SLOTS(X)                                                                      \
    X(RANK_SIZE, rank_size, (dt_comm_t * c, int32_t *rank, int32_t *size),                    \
      (c->inner, rank, size), (void)0)                                                         \
    X(ALL_REDUCE, all_reduce,                                                                  \
      (dt_comm_t * c, const void *send, void *recv, uint64_t count, int dtype, int op,         \
       dt_stream_t *stream, dt_comm_req_t **req),                                              \
      (c->inner, send, recv, count, dtype, op, stream, req),                                   \
      call_data(&x, send, recv, count, dtype, op, -1, -1, req))                                \
    X(REDUCE_SCATTER, reduce_scatter,                                                          \
      (dt_comm_t * c, const void *send, void *recv, uint64_t recv_count, int dtype, int op,    \
       dt_stream_t *stream, dt_comm_req_t **req),                                              \
      (c->inner, send, recv, recv_count, dtype, op, stream, req),                              \
      call_data(&x, send, recv, recv_count, dtype, op, -1, -1, req))                           \
    X(ALL_GATHER, all_gather,                                                                  \
      (dt_comm_t * c, const void *send, void *recv, uint64_t send_count, int dtype,            \
       dt_stream_t *stream, dt_comm_req_t **req),                                              \
      (c->inner, send, recv, send_count, dtype, stream, req),                                  \
      call_data(&x, send, recv, send_count, dtype, -1, -1, -1, req))                           \
    X(BROADCAST, broadcast,                                                                    \
      (dt_comm_t * c, void *buf, uint64_t count, int dtype, int32_t root, dt_stream_t *stream, \
       dt_comm_req_t **req),                                                                   \
      (c->inner, buf, count, dtype, root, stream, req),                                        \
      call_data(&x, buf, buf, count, dtype, -1, root, -1, req))                                \
    X(REDUCE, reduce,                                                                          \
      (dt_comm_t * c, const void *send, void *recv, uint64_t count, int dtype, int op,         \
       int32_t root, dt_stream_t *stream, dt_comm_req_t **req),                                \
      (c->inner, send, recv, count, dtype, op, root, stream, req),                             \
      call_data(&x, send, recv, count, dtype, op, root, -1, req))                              \
    X(SEND, send,                                                                              \
      (dt_comm_t * c, const void *buf, uint64_t count, int dtype, int32_t peer, int32_t tag,   \
       dt_stream_t *stream, dt_comm_req_t **req),                                              \
      (c->inner, buf, count, dtype, peer, tag, stream, req),                                   \
      call_data(&x, buf, NULL, count, dtype, -1, peer, tag, req))                              \
    X(RECV, recv,                                                                              \
      (dt_comm_t * c, void *buf, uint64_t count, int dtype, int32_t peer, int32_t tag,         \
       dt_stream_t *stream, dt_comm_req_t **req),                                              \
      (c->inner, buf, count, dtype, peer, tag, stream, req),                                   \
      call_data(&x, NULL, buf, count, dtype, -1, peer, tag, req))                              \
    X(BARRIER, barrier, (dt_comm_t * c, dt_comm_req_t **req), (c->inner, req),                 \
      call_data(&x, NULL, NULL, 0, -1, -1, -1, -1, req))                                       \
    X(ABORT, abort, (dt_comm_t * c, const char *reason), (c->inner, reason),                   \
      x.k.text = reason)                                                                       \
    X(TEST, test, (dt_comm_t * c, dt_comm_req_t *req, int *done), (c->inner, req, done),       \
      call_request(&x, req))                                                                   \
    X(SYM_ALLOC, sym_alloc, (dt_comm_t * c, uint64_t bytes, int tag, void **out),              \
      (c->inner, bytes, tag, out), x.k.count = bytes)                                          \
    X(SYM_FREE, sym_free, (dt_comm_t * c, void *ptr), (c->inner, ptr), (void)0)

#define IC_PLAIN_FN(up, field, params, args, describe)                         \
    static int ic_##field params                                               \
    {                                                                          \
        ic_call_t x;                                                           \
        if (!c)                                                                \
            return null_group(#field);                                         \
        call_begin(&x, c->ic, c, DT_ICOMM_##up);                               \
        describe;                                                              \
        int rc = call_enter(&x);                                               \
        if (rc == DT_OK)                                                       \
            rc = c->ic->inner->field args;                                     \
        return call_leave(&x, rc);                                             \
    }
IC_PLAIN_SLOTS(IC_PLAIN_FN)

/* ---- slots that create or destroy handles and requests ------------------ */

/* Our handle over the plugin's `inner`; on failure `inner` is finalized. */
static int wrap(dt_interpose_comm_t *ic, const dt_host_t *host, int32_t world_rank,
                dt_comm_t *inner, dt_comm_t **out)
{
    dt_comm_t *g = calloc(1, sizeof *g);
    if (!g) {
        ic->inner->finalize(inner);
        return dt_err_set(DT_ERR_NOMEM, "comm interposer over '%s': out of memory for a "
                          "group handle", ic->inner->info.name);
    }
    g->ops = &ic->ops; /* the interposer's table: calls through the handle see the hooks */
    g->ic = ic;
    g->inner = inner;
    g->host = host;
    g->world_rank = world_rank;
    g->rank = g->size = -1;
    if (ic->inner->rank_size(inner, &g->rank, &g->size) != DT_OK)
        g->rank = g->size = -1; /* the hooks are told "unknown" */
    *out = g;
    return DT_OK;
}

static int ic_init(dt_interpose_comm_t *ic, const dt_host_t *host, const dt_comm_init_t *args,
                   dt_comm_t **out)
{
    ic_call_t x;
    call_begin(&x, ic, NULL, DT_ICOMM_INIT);
    x.k.host = host;
    if (args && args->struct_size >= DT_COMM_INIT_V1_SIZE0) {
        x.k.base.rank = args->rank;
        x.k.text = args->job_id;
    }
    if (out)
        *out = NULL;
    dt_comm_t *inner = NULL;
    int rc = call_enter(&x);
    if (rc == DT_OK)
        rc = ic->inner->init(host, args, out ? &inner : NULL);
    if (rc == DT_OK && inner) {
        rc = wrap(ic, host, x.k.base.rank, inner, out);
        if (rc == DT_OK) {
            x.k.comm = x.k.new_comm = inner;
            x.k.group_rank = (*out)->rank;
            x.k.group_size = (*out)->size;
        }
    }
    return call_leave(&x, rc);
}

static void ic_finalize(dt_comm_t *c)
{
    if (!c)
        return;
    ic_call_t x;
    call_begin(&x, c->ic, c, DT_ICOMM_FINALIZE);
    (void)call_enter(&x); /* nothing to inject: finalize always runs */
    c->ic->inner->finalize(c->inner);
    free(c->reqs);
    c->reqs = NULL;
    x.g = NULL;
    (void)call_leave(&x, DT_OK);
    free(c);
}

static int ic_wait(dt_comm_t *c, dt_comm_req_t *req, int64_t timeout_ms)
{
    if (!c)
        return null_group("wait");
    ic_call_t x;
    call_begin(&x, c->ic, c, DT_ICOMM_WAIT);
    call_request(&x, req);
    x.k.timeout_ms = timeout_ms;
    int injected = call_enter(&x);
    x.called = 1; /* wait frees the request whatever the outcome: always run */
    int rc = c->ic->inner->wait(c->inner, req, timeout_ms);
    req_forget(c, req);
    return call_leave(&x, injected != DT_OK ? injected : rc);
}

/* Two requests: the send's goes where call_data says, the recv's is
 * tracked here. */
static int ic_sendrecv(dt_comm_t *c, const void *sendbuf, uint64_t send_count, void *recvbuf,
                       uint64_t recv_count, int dtype, int32_t send_peer, int32_t recv_peer,
                       int32_t send_tag, int32_t recv_tag, dt_stream_t *stream,
                       dt_comm_req_t **send_req, dt_comm_req_t **recv_req)
{
    if (!c)
        return null_group("sendrecv");
    ic_call_t x;
    call_begin(&x, c->ic, c, DT_ICOMM_SENDRECV);
    call_data(&x, sendbuf, recvbuf, send_count, dtype, -1, send_peer, send_tag, send_req);
    x.k.recv_count = recv_count;
    x.k.recv_peer = recv_peer;
    x.k.recv_tag = recv_tag;
    x.k.base.bytes += recv_count * (uint64_t)dt_dtype_size(dtype);
    int rc = call_enter(&x);
    if (rc == DT_OK)
        rc = c->ic->inner->sendrecv(c->inner, sendbuf, send_count, recvbuf, recv_count, dtype,
                                    send_peer, recv_peer, send_tag, recv_tag, stream, send_req,
                                    recv_req);
    else if (recv_req)
        *recv_req = NULL;
    if (rc == DT_OK && recv_req && *recv_req) {
        x.k.recv_req = *recv_req;
        req_track(c, *recv_req, DT_ICOMM_SENDRECV);
    }
    return call_leave(&x, rc);
}

static int ic_split(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    if (!c)
        return null_group("split");
    ic_call_t x;
    call_begin(&x, c->ic, c, DT_ICOMM_SPLIT);
    x.k.color = color;
    x.k.key = key;
    if (out)
        *out = NULL;
    dt_comm_t *inner = NULL;
    int rc = call_enter(&x);
    if (rc == DT_OK)
        rc = c->ic->inner->split(c->inner, color, key, out ? &inner : NULL);
    if (rc == DT_OK && inner) {
        rc = wrap(c->ic, c->host, c->world_rank, inner, out);
        if (rc == DT_OK)
            x.k.new_comm = inner;
    }
    return call_leave(&x, rc);
}

static int ic_cleanup_job(dt_interpose_comm_t *ic, const dt_host_t *host, const char *job_id)
{
    ic_call_t x;
    call_begin(&x, ic, NULL, DT_ICOMM_CLEANUP_JOB);
    x.k.host = host;
    x.k.text = job_id;
    int rc = call_enter(&x);
    if (rc == DT_OK)
        rc = ic->inner->cleanup_job(host, job_id);
    return call_leave(&x, rc);
}

/* ---- trampolines: init and cleanup_job have no handle to find their
 * interposer by, so each live interposer owns one pair ------------------- */

static dt_interpose_comm_t *ic_pool[DT_INTERPOSE_COMM_MAX];
static pthread_mutex_t ic_pool_lock = PTHREAD_MUTEX_INITIALIZER;

#define IC_TRAMPOLINE(n)                                                       \
    static int ic_init_##n(const dt_host_t *h, const dt_comm_init_t *a, dt_comm_t **o) \
    {                                                                          \
        return ic_init(ic_pool[n], h, a, o);                                   \
    }                                                                          \
    static int ic_cleanup_job_##n(const dt_host_t *h, const char *job)         \
    {                                                                          \
        return ic_cleanup_job(ic_pool[n], h, job);                             \
    }
IC_TRAMPOLINE(0)
IC_TRAMPOLINE(1)
IC_TRAMPOLINE(2)
IC_TRAMPOLINE(3)
IC_TRAMPOLINE(4)
IC_TRAMPOLINE(5)
IC_TRAMPOLINE(6)
IC_TRAMPOLINE(7)
_Static_assert(DT_INTERPOSE_COMM_MAX == 8, "one IC_TRAMPOLINE per pool entry");

static const struct {
    int (*init)(const dt_host_t *, const dt_comm_init_t *, dt_comm_t **);
    int (*cleanup_job)(const dt_host_t *, const char *);
} ic_tramps[DT_INTERPOSE_COMM_MAX] = {
    {ic_init_0, ic_cleanup_job_0}, {ic_init_1, ic_cleanup_job_1},
    {ic_init_2, ic_cleanup_job_2}, {ic_init_3, ic_cleanup_job_3},
    {ic_init_4, ic_cleanup_job_4}, {ic_init_5, ic_cleanup_job_5},
    {ic_init_6, ic_cleanup_job_6}, {ic_init_7, ic_cleanup_job_7},
};

/* ---- the interposer ----------------------------------------------------- */

int dt_interpose_comm_create(const dt_comm_ops_t *inner, const dt_interpose_hooks_t *hooks,
                             dt_interpose_comm_t **out)
{
    *out = NULL;
    if (!inner || inner->info.kind != DT_KIND_COMM || inner->info.abi_major != DT_COMM_ABI_MAJOR)
        return dt_err_set(DT_ERR_INVALID, "comm interposer: %s is not a comm table of ABI "
                          "major %d", inner ? "the table" : "NULL", DT_COMM_ABI_MAJOR);
    dt_interpose_comm_t *ic = calloc(1, sizeof *ic);
    if (!ic)
        return dt_err_set(DT_ERR_NOMEM, "comm interposer over '%s': out of memory",
                          inner->info.name);
    pthread_mutex_lock(&ic_pool_lock);
    int pool = -1;
    for (int i = 0; i < DT_INTERPOSE_COMM_MAX && pool < 0; i++)
        if (!ic_pool[i])
            pool = i;
    if (pool >= 0)
        ic_pool[pool] = ic;
    pthread_mutex_unlock(&ic_pool_lock);
    if (pool < 0) {
        free(ic);
        return dt_err_set(DT_ERR_UNSUPPORTED, "comm interposer over '%s': %d interposers are "
                          "alive already, the most there can be", inner->info.name,
                          DT_INTERPOSE_COMM_MAX);
    }
    ic->pool = pool;
    ic->inner = inner;
    if (hooks)
        ic->hooks = *hooks;
    for (int s = 0; s < DT_ICOMM_SLOT_COUNT; s++)
        atomic_init(&ic->seq[s], 0);

    /* the plugin's info; slots this build does not know are left out */
    ic->ops.info = inner->info;
    if (ic->ops.info.struct_size > sizeof(dt_comm_ops_t)) {
        ic->ops.info.struct_size = (uint32_t)sizeof(dt_comm_ops_t);
        ic->ops.info.abi_minor = DT_COMM_ABI_MINOR;
    }
#define IC_HAS(field) DT_HAS_OP(dt_comm_ops_t, inner, field)
#define IC_SET(up, field, params, args, describe)                              \
    ic->ops.field = IC_HAS(field) ? ic_##field : NULL;
    IC_PLAIN_SLOTS(IC_SET)
    ic->ops.init = IC_HAS(init) ? ic_tramps[pool].init : NULL;
    ic->ops.finalize = IC_HAS(finalize) ? ic_finalize : NULL;
    ic->ops.wait = IC_HAS(wait) ? ic_wait : NULL;
    ic->ops.split = IC_HAS(split) ? ic_split : NULL;
    ic->ops.cleanup_job = IC_HAS(cleanup_job) ? ic_tramps[pool].cleanup_job : NULL;
    ic->ops.sendrecv = IC_HAS(sendrecv) ? ic_sendrecv : NULL;
#undef IC_SET
#undef IC_HAS
    *out = ic;
    return DT_OK;
}

/* Every slot is set above: the plain ones and the six written out. */
#define IC_COUNT(up, field, params, args, describe) +1
_Static_assert(0 IC_PLAIN_SLOTS(IC_COUNT) + 6 == DT_ICOMM_SLOT_COUNT,
               "a comm slot has no wrapper in interpose_comm.c");

const dt_comm_ops_t *dt_interpose_comm_ops(const dt_interpose_comm_t *ic)
{
    return &ic->ops;
}

void dt_interpose_comm_destroy(dt_interpose_comm_t *ic)
{
    if (!ic)
        return;
    pthread_mutex_lock(&ic_pool_lock);
    ic_pool[ic->pool] = NULL;
    pthread_mutex_unlock(&ic_pool_lock);
    free(ic);
}
