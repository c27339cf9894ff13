/*
 * tests/unit/core/interpose/test_interpose.c - the comm interposer (core/interpose):
 * every slot passes its arguments and results through unchanged, the
 * hooks see each call with the right slot, name and data, an injected
 * failure is returned without calling the plugin, split groups are
 * wrapped, and an older plugin's smaller table gives a wrapper without
 * the slots it lacks; the profiler hooks count calls, bytes, waits and
 * errors per operation.
 *
 * Most cases wrap a recording fake (below): each of its slots records its
 * arguments and answers with values the test chose, so "unchanged" is
 * checked argument by argument.  The last cases wrap the real shm plugin
 * in forked ranks: numbers through the wrapper, split groups, abort.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "interpose/interpose.h"
#include "mp_check.h"
#include "mp_harness.h"
#include "test_assert.h"
#include "test_host.h"
#include "test_plugin.h"

/* ---- the fake plugin ------------------------------------------------------ */

/* Handles and requests are addresses of these; nothing is allocated. */
/* Handles start with their table (dtrain/comm.h): the fake's, below. */
static const dt_comm_ops_t fake_ops;
static struct dt_comm {
    const dt_comm_ops_t *ops;
} fake_world = {&fake_ops}, fake_sub = {&fake_ops};
static char fake_stream, fake_reqs[2];
#define W ((dt_comm_t *)&fake_world)
#define SUB ((dt_comm_t *)&fake_sub)
#define STREAM ((dt_stream_t *)&fake_stream)
#define REQ ((dt_comm_req_t *)&fake_reqs[0])
#define REQ2 ((dt_comm_req_t *)&fake_reqs[1])

/* The last call the fake saw. */
static struct {
    int n[DT_ICOMM_SLOT_COUNT]; /* calls per slot */
    int slot;                   /* the last one */
    dt_comm_t *c;               /* its handle */
    dt_comm_t *cs[DT_ICOMM_SLOT_COUNT]; /* the handle, per slot */
    const dt_host_t *host;
    const dt_comm_init_t *args;
    const void *send;
    void *recv;
    uint64_t count;
    int dtype, op;
    int32_t a, b;               /* root / peer, tag / color, key */
    dt_stream_t *stream;
    dt_comm_req_t **reqp;
    uint64_t count2;            /* sendrecv's recv: count, peer, tag, req */
    int32_t a2, b2;
    dt_comm_req_t **reqp2;
    dt_comm_req_t *req;
    int64_t timeout_ms;
    const char *text;
    int *done;
} F;
static int fake_rc;             /* what every fake slot returns */

static void rec(int slot, dt_comm_t *c)
{
    F.n[slot]++;
    F.slot = slot;
    F.c = c;
    F.cs[slot] = c;
}

/* A start slot: record, hand out REQ when asked and succeeding. */
static int rec_start(int slot, dt_comm_t *c, const void *send, void *recv, uint64_t count,
                     int dtype, int op, int32_t a, int32_t b, dt_stream_t *st,
                     dt_comm_req_t **req)
{
    rec(slot, c);
    F.send = send;
    F.recv = recv;
    F.count = count;
    F.dtype = dtype;
    F.op = op;
    F.a = a;
    F.b = b;
    F.stream = st;
    F.reqp = req;
    if (req)
        *req = fake_rc == DT_OK ? REQ : NULL;
    return fake_rc;
}

static int f_init(const dt_host_t *h, const dt_comm_init_t *a, dt_comm_t **out)
{
    rec(DT_ICOMM_INIT, NULL);
    F.host = h;
    F.args = a;
    *out = fake_rc == DT_OK ? W : NULL;
    return fake_rc;
}
static void f_finalize(dt_comm_t *c) { rec(DT_ICOMM_FINALIZE, c); }
/* the world is rank 3 of 5, a split group rank 1 of 2 */
static int f_rank_size(dt_comm_t *c, int32_t *r, int32_t *n)
{
    rec(DT_ICOMM_RANK_SIZE, c);
    *r = c == W ? 3 : 1;
    *n = c == W ? 5 : 2;
    return fake_rc;
}
static int f_all_reduce(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt, int op,
                        dt_stream_t *st, dt_comm_req_t **req)
{
    return rec_start(DT_ICOMM_ALL_REDUCE, c, s, r, n, dt, op, -1, -1, st, req);
}
static int f_reduce_scatter(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt, int op,
                            dt_stream_t *st, dt_comm_req_t **req)
{
    return rec_start(DT_ICOMM_REDUCE_SCATTER, c, s, r, n, dt, op, -1, -1, st, req);
}
static int f_all_gather(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt,
                        dt_stream_t *st, dt_comm_req_t **req)
{
    return rec_start(DT_ICOMM_ALL_GATHER, c, s, r, n, dt, -1, -1, -1, st, req);
}
static int f_broadcast(dt_comm_t *c, void *b, uint64_t n, int dt, int32_t root,
                       dt_stream_t *st, dt_comm_req_t **req)
{
    return rec_start(DT_ICOMM_BROADCAST, c, NULL, b, n, dt, -1, root, -1, st, req);
}
static int f_reduce(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt, int op,
                    int32_t root, dt_stream_t *st, dt_comm_req_t **req)
{
    return rec_start(DT_ICOMM_REDUCE, c, s, r, n, dt, op, root, -1, st, req);
}
static int f_send(dt_comm_t *c, const void *b, uint64_t n, int dt, int32_t peer, int32_t tag,
                  dt_stream_t *st, dt_comm_req_t **req)
{
    return rec_start(DT_ICOMM_SEND, c, b, NULL, n, dt, -1, peer, tag, st, req);
}
static int f_recv(dt_comm_t *c, void *b, uint64_t n, int dt, int32_t peer, int32_t tag,
                  dt_stream_t *st, dt_comm_req_t **req)
{
    return rec_start(DT_ICOMM_RECV, c, NULL, b, n, dt, -1, peer, tag, st, req);
}
static int f_sendrecv(dt_comm_t *c, const void *sb, uint64_t sn, void *rb, uint64_t rn, int dt,
                      int32_t sp, int32_t rp, int32_t stag, int32_t rtag, dt_stream_t *st,
                      dt_comm_req_t **sreq, dt_comm_req_t **rreq)
{
    int rc = rec_start(DT_ICOMM_SENDRECV, c, sb, rb, sn, dt, -1, sp, stag, st, sreq);
    F.count2 = rn;
    F.a2 = rp;
    F.b2 = rtag;
    F.reqp2 = rreq;
    if (rreq)
        *rreq = fake_rc == DT_OK ? REQ2 : NULL;
    return rc;
}
static int f_barrier(dt_comm_t *c, dt_comm_req_t **req)
{
    return rec_start(DT_ICOMM_BARRIER, c, NULL, NULL, 0, -1, -1, -1, -1, NULL, req);
}
static int f_wait(dt_comm_t *c, dt_comm_req_t *req, int64_t timeout_ms)
{
    rec(DT_ICOMM_WAIT, c);
    F.req = req;
    F.timeout_ms = timeout_ms;
    return fake_rc;
}
static int f_split(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    rec(DT_ICOMM_SPLIT, c);
    F.a = color;
    F.b = key;
    *out = fake_rc == DT_OK && color != DT_COMM_NO_COLOR ? SUB : NULL;
    return fake_rc;
}
static int f_abort(dt_comm_t *c, const char *reason)
{
    rec(DT_ICOMM_ABORT, c);
    F.text = reason;
    return fake_rc;
}
static int f_test(dt_comm_t *c, dt_comm_req_t *req, int *done)
{
    rec(DT_ICOMM_TEST, c);
    F.req = req;
    F.done = done;
    *done = 1;
    return fake_rc;
}
static int f_cleanup_job(const dt_host_t *h, const char *job)
{
    rec(DT_ICOMM_CLEANUP_JOB, NULL);
    F.host = h;
    F.text = job;
    return fake_rc;
}

static const dt_comm_ops_t fake_ops = {
    .info = DT_PLUGIN_INFO_NOKEYS(COMM, dt_comm_ops_t, "fake", "1.0", "records calls"),
    .init = f_init,
    .finalize = f_finalize,
    .rank_size = f_rank_size,
    .all_reduce = f_all_reduce,
    .reduce_scatter = f_reduce_scatter,
    .all_gather = f_all_gather,
    .broadcast = f_broadcast,
    .reduce = f_reduce,
    .send = f_send,
    .recv = f_recv,
    .barrier = f_barrier,
    .wait = f_wait,
    .split = f_split,
    .abort = f_abort,
    .test = f_test,
    .cleanup_job = f_cleanup_job,
    .sendrecv = f_sendrecv,
};

/* ---- recording hooks --------------------------------------------------- */

static struct {
    int n_before, n_after;
    dt_interpose_comm_call_t before, after; /* the last calls, copied */
    int status;
    uint64_t elapsed_ns;
    int inject;           /* status before returns for inject_slot */
    int inject_slot;
    const char *order;    /* stacked interposers: who ran first */
} H;

static int h_before(void *ctx, const dt_interpose_call_t *call)
{
    (void)ctx;
    H.n_before++;
    H.before = *(const dt_interpose_comm_call_t *)call;
    if (H.inject != DT_OK && (int)call->slot == H.inject_slot) {
        const dt_interpose_comm_call_t *k = (const dt_interpose_comm_call_t *)call;
        return k->host ? k->host->set_error(k->host, H.inject, "%s: injected", call->name)
                       : dt_err_set(H.inject, "%s: injected", call->name);
    }
    return DT_OK;
}

static void h_after(void *ctx, const dt_interpose_call_t *call, int status, uint64_t elapsed_ns)
{
    (void)ctx;
    H.n_after++;
    H.after = *(const dt_interpose_comm_call_t *)call;
    H.status = status;
    H.elapsed_ns = elapsed_ns;
}

static const dt_interpose_hooks_t rec_hooks = {.before = h_before, .after = h_after};

static dt_test_host_t th;
static dt_interpose_comm_t *ic;
static const dt_comm_ops_t *C; /* the wrapper */

static int setup(void **state)
{
    (void)state;
    memset(&F, 0, sizeof F);
    memset(&H, 0, sizeof H);
    fake_rc = DT_OK;
    dt_test_host_init(&th, "comm/fake", NULL);
    if (dt_interpose_comm_create(&fake_ops, &rec_hooks, &ic) != DT_OK)
        return -1;
    C = dt_interpose_comm_ops(ic);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    dt_interpose_comm_destroy(ic);
    ic = NULL;
    return 0;
}

/* Both hooks saw exactly one call of `slot` named `name`, on world rank
 * `rank`, and `after` got status `st`. */
static void saw(int slot, const char *name, int rank, int st)
{
    assert_int_equal(H.n_before, 1);
    assert_int_equal(H.n_after, 1);
    for (int i = 0; i < 2; i++) {
        const dt_interpose_comm_call_t *k = i ? &H.after : &H.before;
        assert_int_equal(k->base.kind, DT_KIND_COMM);
        assert_int_equal(k->base.slot, slot);
        assert_string_equal(k->base.name, name);
        assert_int_equal(k->base.rank, rank);
        assert_ptr_equal(k->ops, &fake_ops);
    }
    assert_int_equal(H.status, st);
    H.n_before = H.n_after = 0;
}

/* A wrapped world (init through the wrapper) on world rank 3. */
static dt_comm_t *open_world(void)
{
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = 3, .size = 5, .job_id = "job7",
                        .timeout_ms = 1000};
    dt_comm_t *c = NULL;
    assert_ok(C->init(&th.host, &a, &c));
    assert_non_null(c);
    H.n_before = H.n_after = 0;
    return c;
}

/* ---- cases ---------------------------------------------------------------- */

/* Every slot: the fake gets the caller's arguments with its own handle,
 * the caller gets the fake's results, the hooks see the call. */
static void test_every_slot_passes_through(void **state)
{
    (void)state;
    /* init: the fake gets host and args as given; the caller gets the
     * interposer's handle, not the fake's */
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = 3, .size = 5, .job_id = "job7",
                        .timeout_ms = 1000};
    dt_comm_t *c = NULL;
    assert_ok(C->init(&th.host, &a, &c));
    assert_ptr_equal(F.host, &th.host);
    assert_ptr_equal(F.args, &a);
    assert_non_null(c);
    assert_ptr_not_equal(c, W);
    saw(DT_ICOMM_INIT, "init", 3, DT_OK);
    assert_string_equal(H.before.text, "job7");
    assert_null(H.before.comm);             /* before: no handle yet */
    assert_ptr_equal(H.after.comm, W);      /* after: the plugin's */
    assert_int_equal(H.after.group_rank, 3);
    assert_int_equal(H.after.group_size, 5);

    int32_t r = -1, n = -1;
    assert_ok(C->rank_size(c, &r, &n));
    assert_ptr_equal(F.c, W);
    assert_int_equal(r, 3);
    assert_int_equal(n, 5);
    saw(DT_ICOMM_RANK_SIZE, "rank_size", 3, DT_OK);

    float send[4], recv[12];
    dt_comm_req_t *req = NULL;
    assert_ok(C->all_reduce(c, send, recv, 4, DT_BF16, DT_OP_MAX, STREAM, &req));
    assert_int_equal(F.slot, DT_ICOMM_ALL_REDUCE);
    assert_ptr_equal(F.c, W);
    assert_ptr_equal(F.send, send);
    assert_ptr_equal(F.recv, recv);
    assert_int_equal(F.count, 4);
    assert_int_equal(F.dtype, DT_BF16);
    assert_int_equal(F.op, DT_OP_MAX);
    assert_ptr_equal(F.stream, STREAM);
    assert_ptr_equal(F.reqp, &req);
    assert_ptr_equal(req, REQ);             /* the plugin's request, as is */
    saw(DT_ICOMM_ALL_REDUCE, "all_reduce", 3, DT_OK);
    assert_int_equal(H.before.count, 4);
    assert_int_equal(H.before.dtype, DT_BF16);
    assert_int_equal(H.before.reduce_op, DT_OP_MAX);
    assert_int_equal(H.before.base.bytes, 8);
    assert_int_equal(H.before.base.flags, DT_ICALL_COLLECTIVE | DT_ICALL_START);
    assert_int_equal(H.before.group_rank, 3);
    assert_int_equal(H.before.group_size, 5);
    assert_null(H.before.req);
    assert_ptr_equal(H.after.req, REQ);

    /* wait: the plugin's request reaches the plugin; the hooks name the
     * operation it completes */
    assert_ok(C->wait(c, req, 250));
    assert_int_equal(F.slot, DT_ICOMM_WAIT);
    assert_ptr_equal(F.c, W);
    assert_ptr_equal(F.req, REQ);
    assert_int_equal(F.timeout_ms, 250);
    saw(DT_ICOMM_WAIT, "wait", 3, DT_OK);
    assert_string_equal(H.after.base.op, "all_reduce");
    assert_int_equal(H.after.req_slot, DT_ICOMM_ALL_REDUCE);
    assert_int_equal(H.after.timeout_ms, 250);

    assert_ok(C->reduce_scatter(c, send, recv, 3, DT_F32, DT_OP_AVG, NULL, NULL));
    assert_int_equal(F.slot, DT_ICOMM_REDUCE_SCATTER);
    assert_ptr_equal(F.c, W);
    assert_ptr_equal(F.send, send);
    assert_ptr_equal(F.recv, recv);
    assert_int_equal(F.count, 3);
    assert_int_equal(F.dtype, DT_F32);
    assert_int_equal(F.op, DT_OP_AVG);
    assert_null(F.stream);
    assert_null(F.reqp);                    /* blocking stays blocking */
    saw(DT_ICOMM_REDUCE_SCATTER, "reduce_scatter", 3, DT_OK);
    assert_int_equal(H.after.base.bytes, 12);
    assert_null(H.after.req);

    assert_ok(C->all_gather(c, send, recv, 2, DT_F16, STREAM, &req));
    assert_int_equal(F.slot, DT_ICOMM_ALL_GATHER);
    assert_ptr_equal(F.c, W);
    assert_ptr_equal(F.send, send);
    assert_ptr_equal(F.recv, recv);
    assert_int_equal(F.count, 2);
    assert_int_equal(F.dtype, DT_F16);
    assert_ptr_equal(F.stream, STREAM);
    assert_ptr_equal(F.reqp, &req);
    saw(DT_ICOMM_ALL_GATHER, "all_gather", 3, DT_OK);
    assert_int_equal(H.after.base.bytes, 4);

    /* test: polls without forgetting which operation the request is */
    int done = 0;
    assert_ok(C->test(c, req, &done));
    assert_int_equal(F.slot, DT_ICOMM_TEST);
    assert_ptr_equal(F.c, W);
    assert_ptr_equal(F.req, REQ);
    assert_ptr_equal(F.done, &done);
    assert_int_equal(done, 1);
    saw(DT_ICOMM_TEST, "test", 3, DT_OK);
    assert_string_equal(H.after.base.op, "all_gather");
    assert_ok(C->wait(c, req, -1));
    saw(DT_ICOMM_WAIT, "wait", 3, DT_OK);
    assert_string_equal(H.after.base.op, "all_gather");
    /* a request the wrapper did not hand out: the wait's own name */
    assert_ok(C->wait(c, REQ2, -1));
    assert_ptr_equal(F.req, REQ2);
    saw(DT_ICOMM_WAIT, "wait", 3, DT_OK);
    assert_string_equal(H.after.base.op, "wait");
    assert_int_equal(H.after.req_slot, -1);

    assert_ok(C->broadcast(c, recv, 5, DT_I32, 2, STREAM, &req));
    assert_int_equal(F.slot, DT_ICOMM_BROADCAST);
    assert_ptr_equal(F.c, W);
    assert_ptr_equal(F.recv, recv);
    assert_int_equal(F.count, 5);
    assert_int_equal(F.dtype, DT_I32);
    assert_int_equal(F.a, 2);
    assert_ptr_equal(F.stream, STREAM);
    assert_ptr_equal(F.reqp, &req);
    saw(DT_ICOMM_BROADCAST, "broadcast", 3, DT_OK);
    assert_int_equal(H.before.peer, 2);
    assert_ok(C->wait(c, req, -1));
    H.n_before = H.n_after = 0;

    assert_ok(C->reduce(c, send, recv, 6, DT_F64, DT_OP_MIN, 4, STREAM, NULL));
    assert_int_equal(F.slot, DT_ICOMM_REDUCE);
    assert_ptr_equal(F.c, W);
    assert_ptr_equal(F.send, send);
    assert_ptr_equal(F.recv, recv);
    assert_int_equal(F.count, 6);
    assert_int_equal(F.dtype, DT_F64);
    assert_int_equal(F.op, DT_OP_MIN);
    assert_int_equal(F.a, 4);
    assert_ptr_equal(F.stream, STREAM);
    saw(DT_ICOMM_REDUCE, "reduce", 3, DT_OK);
    assert_int_equal(H.before.base.bytes, 48);

    assert_ok(C->send(c, send, 7, DT_U8, 1, 42, STREAM, &req));
    assert_int_equal(F.slot, DT_ICOMM_SEND);
    assert_ptr_equal(F.c, W);
    assert_ptr_equal(F.send, send);
    assert_int_equal(F.count, 7);
    assert_int_equal(F.dtype, DT_U8);
    assert_int_equal(F.a, 1);
    assert_int_equal(F.b, 42);
    assert_ptr_equal(F.stream, STREAM);
    assert_ptr_equal(F.reqp, &req);
    saw(DT_ICOMM_SEND, "send", 3, DT_OK);
    assert_int_equal(H.before.peer, 1);
    assert_int_equal(H.before.tag, 42);
    assert_int_equal(H.before.base.flags, DT_ICALL_P2P | DT_ICALL_START);
    assert_ok(C->wait(c, req, -1));
    saw(DT_ICOMM_WAIT, "wait", 3, DT_OK);
    assert_string_equal(H.after.base.op, "send");

    assert_ok(C->recv(c, recv, 8, DT_F32, 0, 43, NULL, &req));
    assert_int_equal(F.slot, DT_ICOMM_RECV);
    assert_ptr_equal(F.c, W);
    assert_ptr_equal(F.recv, recv);
    assert_int_equal(F.count, 8);
    assert_int_equal(F.a, 0);
    assert_int_equal(F.b, 43);
    assert_null(F.stream);
    saw(DT_ICOMM_RECV, "recv", 3, DT_OK);
    assert_ok(C->wait(c, req, -1));
    H.n_before = H.n_after = 0;

    /* sendrecv: both halves' arguments, two requests, each wait named
     * after it */
    dt_comm_req_t *req2 = NULL;
    assert_ok(C->sendrecv(c, send, 3, recv, 5, DT_BF16, 1, 2, 44, 45, STREAM, &req, &req2));
    assert_int_equal(F.slot, DT_ICOMM_SENDRECV);
    assert_ptr_equal(F.c, W);
    assert_ptr_equal(F.send, send);
    assert_ptr_equal(F.recv, recv);
    assert_int_equal(F.count, 3);
    assert_int_equal(F.count2, 5);
    assert_int_equal(F.dtype, DT_BF16);
    assert_int_equal(F.a, 1);
    assert_int_equal(F.a2, 2);
    assert_int_equal(F.b, 44);
    assert_int_equal(F.b2, 45);
    assert_ptr_equal(F.stream, STREAM);
    assert_ptr_equal(F.reqp, &req);
    assert_ptr_equal(F.reqp2, &req2);
    assert_ptr_equal(req, REQ);
    assert_ptr_equal(req2, REQ2);
    saw(DT_ICOMM_SENDRECV, "sendrecv", 3, DT_OK);
    assert_int_equal(H.before.base.flags, DT_ICALL_P2P | DT_ICALL_START);
    assert_int_equal(H.before.base.bytes, 16); /* (3 + 5) x 2 */
    assert_ptr_equal(H.before.send, send);
    assert_ptr_equal(H.before.recv, recv);
    assert_int_equal(H.before.count, 3);
    assert_int_equal(H.before.peer, 1);
    assert_int_equal(H.before.tag, 44);
    assert_int_equal(H.before.recv_count, 5);
    assert_int_equal(H.before.recv_peer, 2);
    assert_int_equal(H.before.recv_tag, 45);
    assert_ptr_equal(H.after.req, REQ);
    assert_ptr_equal(H.after.recv_req, REQ2);
    assert_ok(C->wait(c, req2, -1));
    saw(DT_ICOMM_WAIT, "wait", 3, DT_OK);
    assert_string_equal(H.after.base.op, "sendrecv");
    assert_ok(C->wait(c, req, -1));
    saw(DT_ICOMM_WAIT, "wait", 3, DT_OK);
    assert_string_equal(H.after.base.op, "sendrecv");

    assert_ok(C->barrier(c, &req));
    assert_int_equal(F.slot, DT_ICOMM_BARRIER);
    assert_ptr_equal(F.c, W);
    assert_ptr_equal(F.reqp, &req);
    saw(DT_ICOMM_BARRIER, "barrier", 3, DT_OK);
    assert_int_equal(H.before.base.bytes, 0);
    assert_ok(C->wait(c, req, -1));
    saw(DT_ICOMM_WAIT, "wait", 3, DT_OK);
    assert_string_equal(H.after.base.op, "barrier");

    assert_ok(C->abort(c, "why not"));
    assert_int_equal(F.slot, DT_ICOMM_ABORT);
    assert_ptr_equal(F.c, W);
    assert_string_equal(F.text, "why not");
    saw(DT_ICOMM_ABORT, "abort", 3, DT_OK);
    assert_string_equal(H.before.text, "why not");

    assert_ok(C->cleanup_job(&th.host, "job9"));
    assert_int_equal(F.slot, DT_ICOMM_CLEANUP_JOB);
    assert_ptr_equal(F.host, &th.host);
    assert_string_equal(F.text, "job9");
    saw(DT_ICOMM_CLEANUP_JOB, "cleanup_job", -1, DT_OK);
    assert_null(H.before.comm);

    C->finalize(c);
    assert_int_equal(F.slot, DT_ICOMM_FINALIZE);
    assert_ptr_equal(F.c, W);
    saw(DT_ICOMM_FINALIZE, "finalize", 3, DT_OK);

    /* each slot reached the fake once per call made (rank_size once more:
     * the wrapper asks once for the handle it made at init) */
    const int want[DT_ICOMM_SLOT_COUNT] = {
        [DT_ICOMM_INIT] = 1, [DT_ICOMM_FINALIZE] = 1, [DT_ICOMM_RANK_SIZE] = 2,
        [DT_ICOMM_ALL_REDUCE] = 1, [DT_ICOMM_REDUCE_SCATTER] = 1, [DT_ICOMM_ALL_GATHER] = 1,
        [DT_ICOMM_BROADCAST] = 1, [DT_ICOMM_REDUCE] = 1, [DT_ICOMM_SEND] = 1,
        [DT_ICOMM_RECV] = 1, [DT_ICOMM_BARRIER] = 1, [DT_ICOMM_WAIT] = 9,
        [DT_ICOMM_SPLIT] = 0, [DT_ICOMM_ABORT] = 1, [DT_ICOMM_TEST] = 1,
        [DT_ICOMM_CLEANUP_JOB] = 1, [DT_ICOMM_SENDRECV] = 1};
    for (int s = 0; s < DT_ICOMM_SLOT_COUNT; s++)
        if (F.n[s] != want[s])
            fail_msg("slot %d: the plugin was called %d times, expected %d", s, F.n[s],
                     want[s]);
}

/* A failing plugin's status and message reach the caller unchanged, and
 * a failed start hands out no request. */
static void test_failures_pass_through(void **state)
{
    (void)state;
    dt_comm_t *c = open_world();
    fake_rc = DT_ERR_TIMEOUT;
    float buf[2];
    dt_comm_req_t *req = REQ2;
    assert_status(C->all_reduce(c, buf, buf, 2, DT_F32, DT_OP_SUM, NULL, &req), DT_ERR_TIMEOUT);
    assert_null(req);
    saw(DT_ICOMM_ALL_REDUCE, "all_reduce", 3, DT_ERR_TIMEOUT);
    assert_null(H.after.req);
    assert_status(C->wait(c, REQ, 5), DT_ERR_TIMEOUT);
    saw(DT_ICOMM_WAIT, "wait", 3, DT_ERR_TIMEOUT);
    dt_comm_req_t *req2 = REQ;
    req = REQ2;
    assert_status(C->sendrecv(c, buf, 2, buf, 2, DT_F32, 0, 0, 1, 2, NULL, &req, &req2),
                  DT_ERR_TIMEOUT);
    assert_null(req);
    assert_null(req2);
    saw(DT_ICOMM_SENDRECV, "sendrecv", 3, DT_ERR_TIMEOUT);
    assert_null(H.after.req);
    assert_null(H.after.recv_req);
    dt_comm_t *sub = c;
    assert_status(C->split(c, 1, 0, &sub), DT_ERR_TIMEOUT);
    assert_null(sub);
    H.n_before = H.n_after = 0;
    fake_rc = DT_OK;
    C->finalize(c);
    /* init failing: no handle */
    fake_rc = DT_ERR_REMOTE;
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = 1, .size = 2, .timeout_ms = 1};
    dt_comm_t *w = W;
    assert_status(C->init(&th.host, &a, &w), DT_ERR_REMOTE);
    assert_null(w);
}

/* before returning a status: the caller gets it and its message, the
 * plugin is not called, after sees it with no time spent. */
static void test_injected_failure(void **state)
{
    (void)state;
    dt_comm_t *c = open_world();
    H.inject = DT_ERR_REMOTE;
    H.inject_slot = DT_ICOMM_REDUCE_SCATTER;
    float buf[4];
    dt_comm_req_t *req = REQ2;
    int before = F.n[DT_ICOMM_REDUCE_SCATTER];
    assert_status(C->reduce_scatter(c, buf, buf, 2, DT_F32, DT_OP_AVG, NULL, &req),
                  DT_ERR_REMOTE);
    assert_msg("comm/fake: reduce_scatter: injected");
    assert_int_equal(F.n[DT_ICOMM_REDUCE_SCATTER], before);
    assert_null(req);
    saw(DT_ICOMM_REDUCE_SCATTER, "reduce_scatter", 3, DT_ERR_REMOTE);
    assert_int_equal(H.elapsed_ns, 0);
    assert_int_equal(H.before.base.seq, 1);
    /* a sendrecv refused hands out neither request */
    H.inject_slot = DT_ICOMM_SENDRECV;
    dt_comm_req_t *req2 = REQ;
    req = REQ2;
    assert_status(C->sendrecv(c, buf, 2, buf, 2, DT_F32, 0, 0, 1, 2, NULL, &req, &req2),
                  DT_ERR_REMOTE);
    assert_msg("comm/fake: sendrecv: injected");
    assert_int_equal(F.n[DT_ICOMM_SENDRECV], 0);
    assert_null(req);
    assert_null(req2);
    saw(DT_ICOMM_SENDRECV, "sendrecv", 3, DT_ERR_REMOTE);
    H.inject_slot = DT_ICOMM_REDUCE_SCATTER;
    /* other slots are untouched */
    assert_ok(C->all_reduce(c, buf, buf, 2, DT_F32, DT_OP_SUM, NULL, &req));
    assert_ptr_equal(req, REQ);
    H.n_before = H.n_after = 0;
    /* the second reduce_scatter is seq 2 */
    assert_status(C->reduce_scatter(c, buf, buf, 2, DT_F32, DT_OP_AVG, NULL, NULL),
                  DT_ERR_REMOTE);
    assert_int_equal(H.before.base.seq, 2);
    H.n_before = H.n_after = 0;

    /* wait: the plugin's wait still runs (it frees the request); the
     * injected status replaces its result */
    H.inject_slot = DT_ICOMM_WAIT;
    H.inject = DT_ERR_TIMEOUT;
    int waits = F.n[DT_ICOMM_WAIT];
    assert_status(C->wait(c, req, -1), DT_ERR_TIMEOUT);
    assert_int_equal(F.n[DT_ICOMM_WAIT], waits + 1);
    assert_ptr_equal(F.req, REQ);
    saw(DT_ICOMM_WAIT, "wait", 3, DT_ERR_TIMEOUT);
    assert_string_equal(H.after.base.op, "all_reduce");

    /* split and init inject too: no handle */
    H.inject_slot = DT_ICOMM_SPLIT;
    dt_comm_t *sub = c;
    int splits = F.n[DT_ICOMM_SPLIT];
    assert_status(C->split(c, 0, 0, &sub), DT_ERR_TIMEOUT);
    assert_null(sub);
    assert_int_equal(F.n[DT_ICOMM_SPLIT], splits);
    H.n_before = H.n_after = 0;
    H.inject_slot = DT_ICOMM_INIT;
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = 1, .size = 2, .timeout_ms = 1};
    dt_comm_t *w = W;
    int inits = F.n[DT_ICOMM_INIT];
    assert_status(C->init(&th.host, &a, &w), DT_ERR_TIMEOUT);
    assert_msg("comm/fake: init: injected");
    assert_null(w);
    assert_int_equal(F.n[DT_ICOMM_INIT], inits);

    /* finalize cannot be refused */
    H.inject_slot = DT_ICOMM_FINALIZE;
    int fins = F.n[DT_ICOMM_FINALIZE];
    C->finalize(c);
    assert_int_equal(F.n[DT_ICOMM_FINALIZE], fins + 1);
}

/* split hands out the interposer's handle over the plugin's new group:
 * calls on it reach the plugin's group and the hooks see its rank, size
 * and the world rank it came from. */
static void test_split_groups_are_wrapped(void **state)
{
    (void)state;
    dt_comm_t *c = open_world();
    dt_comm_t *sub = NULL;
    assert_ok(C->split(c, 7, 9, &sub));
    assert_ptr_equal(F.cs[DT_ICOMM_SPLIT], W);
    assert_int_equal(F.a, 7);
    assert_int_equal(F.b, 9);
    saw(DT_ICOMM_SPLIT, "split", 3, DT_OK);
    assert_int_equal(H.before.color, 7);
    assert_int_equal(H.before.key, 9);
    assert_non_null(sub);
    assert_ptr_not_equal(sub, SUB);
    assert_ptr_not_equal(sub, c);

    float buf[2];
    dt_comm_req_t *req = NULL;
    assert_ok(C->all_gather(sub, buf, buf, 1, DT_F32, NULL, &req));
    assert_ptr_equal(F.c, SUB);
    saw(DT_ICOMM_ALL_GATHER, "all_gather", 3, DT_OK);
    assert_int_equal(H.before.group_rank, 1);
    assert_int_equal(H.before.group_size, 2);
    assert_ptr_equal(H.before.comm, SUB);
    /* requests are per group: the world does not know this one */
    assert_ok(C->wait(sub, req, -1));
    saw(DT_ICOMM_WAIT, "wait", 3, DT_OK);
    assert_string_equal(H.after.base.op, "all_gather");

    /* a group split from a split group is wrapped too */
    dt_comm_t *subsub = NULL;
    assert_ok(C->split(sub, 0, 0, &subsub));
    assert_ptr_equal(F.cs[DT_ICOMM_SPLIT], SUB);
    assert_non_null(subsub);
    H.n_before = H.n_after = 0;

    /* no color: no group, as the plugin says */
    dt_comm_t *none = c;
    assert_ok(C->split(c, DT_COMM_NO_COLOR, 0, &none));
    assert_null(none);
    H.n_before = H.n_after = 0;

    C->finalize(subsub);
    assert_ptr_equal(F.c, SUB);
    C->finalize(sub);
    assert_ptr_equal(F.c, SUB);
    C->finalize(c);
    assert_ptr_equal(F.c, W);
}

/* An older plugin (built before `test` and `cleanup_job` existed): the
 * wrapper lacks them too, and has every other slot.  A newer plugin's
 * table is clamped to the slots this build knows. */
static void test_older_and_newer_tables(void **state)
{
    (void)state;
    dt_comm_ops_t old = fake_ops;
    old.info.struct_size = (uint32_t)offsetof(dt_comm_ops_t, test);
    dt_interpose_comm_t *io = NULL;
    assert_ok(dt_interpose_comm_create(&old, &rec_hooks, &io));
    const dt_comm_ops_t *w = dt_interpose_comm_ops(io);
    assert_int_equal(w->info.struct_size, offsetof(dt_comm_ops_t, test));
    assert_string_equal(w->info.name, "fake");
    assert_false(DT_HAS_OP(dt_comm_ops_t, w, test));
    assert_false(DT_HAS_OP(dt_comm_ops_t, w, cleanup_job));
    assert_true(DT_HAS_OP(dt_comm_ops_t, w, abort));
    assert_true(DT_HAS_OP(dt_comm_ops_t, w, split));
    assert_true(DT_HAS_OP(dt_comm_ops_t, w, all_reduce));
    /* and it works */
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = 0, .size = 5, .timeout_ms = 1};
    dt_comm_t *c = NULL;
    assert_ok(w->init(&th.host, &a, &c));
    int32_t r, n;
    assert_ok(w->rank_size(c, &r, &n));
    assert_int_equal(n, 5);
    w->finalize(c);
    dt_interpose_comm_destroy(io);

    /* a plugin whose table ends before sendrecv: the wrapper has none either */
    dt_comm_ops_t minor1 = fake_ops;
    minor1.info.struct_size = (uint32_t)offsetof(dt_comm_ops_t, sendrecv);
    assert_ok(dt_interpose_comm_create(&minor1, NULL, &io));
    assert_false(DT_HAS_OP(dt_comm_ops_t, dt_interpose_comm_ops(io), sendrecv));
    assert_true(DT_HAS_OP(dt_comm_ops_t, dt_interpose_comm_ops(io), cleanup_job));
    dt_interpose_comm_destroy(io);

    /* a slot the plugin leaves NULL stays absent */
    dt_comm_ops_t no_test = fake_ops;
    no_test.test = NULL;
    assert_ok(dt_interpose_comm_create(&no_test, NULL, &io));
    assert_false(DT_HAS_OP(dt_comm_ops_t, dt_interpose_comm_ops(io), test));
    assert_true(DT_HAS_OP(dt_comm_ops_t, dt_interpose_comm_ops(io), cleanup_job));
    dt_interpose_comm_destroy(io);

    /* a newer plugin's larger table: this build's slots only */
    struct {
        dt_comm_ops_t ops;
        void (*later)(void);
    } newer = {fake_ops, NULL};
    newer.ops.info.struct_size = (uint32_t)sizeof newer;
    newer.ops.info.abi_minor = DT_COMM_ABI_MINOR + 1;
    assert_ok(dt_interpose_comm_create(&newer.ops, NULL, &io));
    assert_int_equal(dt_interpose_comm_ops(io)->info.struct_size, sizeof(dt_comm_ops_t));
    assert_int_equal(dt_interpose_comm_ops(io)->info.abi_minor, DT_COMM_ABI_MINOR);
    assert_true(DT_HAS_OP(dt_comm_ops_t, dt_interpose_comm_ops(io), cleanup_job));
    dt_interpose_comm_destroy(io);
}

/* What cannot be wrapped, and the limit on live interposers. */
static void test_create_errors(void **state)
{
    (void)state;
    dt_interpose_comm_t *io = (dt_interpose_comm_t *)&fake_world;
    dt_comm_ops_t wrong = fake_ops;
    wrong.info.kind = DT_KIND_DEVICE;
    assert_status(dt_interpose_comm_create(&wrong, NULL, &io), DT_ERR_INVALID);
    assert_msg("comm interposer: the table is not a comm table of ABI major 1");
    assert_null(io);
    wrong = fake_ops;
    wrong.info.abi_major = 2;
    assert_status(dt_interpose_comm_create(&wrong, NULL, &io), DT_ERR_INVALID);
    assert_status(dt_interpose_comm_create(NULL, NULL, &io), DT_ERR_INVALID);
    assert_msg("comm interposer: NULL is not a comm table of ABI major 1");

    /* setup made one; fill the pool */
    dt_interpose_comm_t *more[DT_INTERPOSE_COMM_MAX];
    for (int i = 0; i < DT_INTERPOSE_COMM_MAX - 1; i++)
        assert_ok(dt_interpose_comm_create(&fake_ops, NULL, &more[i]));
    assert_status(dt_interpose_comm_create(&fake_ops, NULL, &io), DT_ERR_UNSUPPORTED);
    assert_msg("comm interposer over 'fake': 8 interposers are alive already, the most "
               "there can be");
    /* each one's init reaches its own hooks: the last is hook-free */
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = 0, .size = 5, .timeout_ms = 1};
    dt_comm_t *c = NULL;
    assert_ok(dt_interpose_comm_ops(more[DT_INTERPOSE_COMM_MAX - 2])->init(&th.host, &a, &c));
    assert_int_equal(H.n_before, 0);
    dt_interpose_comm_ops(more[DT_INTERPOSE_COMM_MAX - 2])->finalize(c);
    /* a destroyed one's place is free again */
    dt_interpose_comm_destroy(more[0]);
    assert_ok(dt_interpose_comm_create(&fake_ops, NULL, &more[0]));
    for (int i = 0; i < DT_INTERPOSE_COMM_MAX - 1; i++)
        dt_interpose_comm_destroy(more[i]);
    dt_interpose_comm_destroy(NULL);
}

/* Interposers stack: the outer one's hooks run first, both see the call. */
static int outer_before(void *ctx, const dt_interpose_call_t *call)
{
    (void)call;
    *(int *)ctx = H.n_before; /* how many inner befores ran before us */
    return DT_OK;
}

static void test_stacked(void **state)
{
    (void)state;
    int inner_seen = -1;
    dt_interpose_hooks_t oh = {.ctx = &inner_seen, .before = outer_before};
    dt_interpose_comm_t *outer = NULL;
    assert_ok(dt_interpose_comm_create(C, &oh, &outer));
    const dt_comm_ops_t *O = dt_interpose_comm_ops(outer);
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = 2, .size = 5, .timeout_ms = 1};
    dt_comm_t *c = NULL;
    assert_ok(O->init(&th.host, &a, &c));
    assert_int_equal(inner_seen, 0);
    /* the inner one saw init, then the outer one asking its new group's
     * rank and size */
    assert_int_equal(H.n_before, 2);
    assert_int_equal(H.before.base.slot, DT_ICOMM_RANK_SIZE);
    assert_int_equal(H.before.base.rank, 2);
    H.n_before = H.n_after = 0;
    float buf[1];
    assert_ok(O->all_reduce(c, buf, buf, 1, DT_F32, DT_OP_SUM, NULL, NULL));
    assert_ptr_equal(F.c, W);
    assert_int_equal(inner_seen, 0);
    saw(DT_ICOMM_ALL_REDUCE, "all_reduce", 2, DT_OK);
    O->finalize(c);
    assert_ptr_equal(F.c, W);
    dt_interpose_comm_destroy(outer);
}

/* The profiler's table: per operation, calls of its slot, bytes, waits
 * charged to it and errors, in order of first use. */
static void test_profile(void **state)
{
    dt_interpose_profile_t *prof = dt_interpose_profile_create();
    assert_non_null(prof);
    dt_interpose_hooks_t hooks = dt_interpose_profile_hooks(prof);
    assert_null(hooks.before);
    dt_interpose_comm_t *ip = NULL;
    assert_ok(dt_interpose_comm_create(&fake_ops, &hooks, &ip));
    const dt_comm_ops_t *P = dt_interpose_comm_ops(ip);
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = 0, .size = 5, .timeout_ms = 1};
    dt_comm_t *c = NULL;
    assert_ok(P->init(&th.host, &a, &c));
    float buf[8];
    dt_comm_req_t *req;
    for (int i = 0; i < 3; i++) {
        assert_ok(P->all_reduce(c, buf, buf, 8, DT_F32, DT_OP_SUM, NULL, &req));
        assert_ok(P->wait(c, req, -1));
    }
    assert_ok(P->all_gather(c, buf, buf, 2, DT_BF16, NULL, NULL));
    fake_rc = DT_ERR_TIMEOUT;
    assert_status(P->all_gather(c, buf, buf, 2, DT_BF16, NULL, NULL), DT_ERR_TIMEOUT);
    fake_rc = DT_OK;
    P->finalize(c);
    dt_interpose_comm_destroy(ip);

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    dt_interpose_profile_print(prof, f, "comm profile (test):");
    fclose(f);
    dt_interpose_profile_free(prof);
    /* the time column varies: compare the rest */
    const char *want[] = {"init 1 0 0 0", "all_reduce 3 96 3 0", "all_gather 2 8 0 1",
                          "finalize 1 0 0 0"};
    char *line = strtok(text, "\n");
    assert_string_equal(line, "comm profile (test):");
    line = strtok(NULL, "\n");
    assert_non_null(strstr(line, "op"));
    assert_non_null(strstr(line, "errors"));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        line = strtok(NULL, "\n");
        assert_non_null(line);
        char op[32], got[96];
        unsigned long long calls, bytes, waits, errors;
        double ms;
        assert_int_equal(sscanf(line, "%31s %llu %llu %lf %llu %llu", op, &calls, &bytes, &ms,
                                &waits, &errors), 6);
        assert_true(ms >= 0.0);
        snprintf(got, sizeof got, "%s %llu %llu %llu %llu", op, calls, bytes, waits, errors);
        assert_string_equal(got, want[i]);
    }
    assert_null(strtok(NULL, "\n"));
    free(text);
}

/* ---- the real shm plugin in forked ranks --------------------------------- */

static const dt_comm_ops_t *SHM;

typedef struct shm_counts {
    int starts[DT_ICOMM_SLOT_COUNT];
    int waits_for[DT_ICOMM_SLOT_COUNT]; /* waits, by the op they complete */
    int sizes[4];                       /* group sizes seen by all_reduce */
} shm_counts_t;

static int count_before(void *ctx, const dt_interpose_call_t *call)
{
    shm_counts_t *n = ctx;
    const dt_interpose_comm_call_t *k = (const dt_interpose_comm_call_t *)call;
    if (call->flags & DT_ICALL_START)
        n->starts[call->slot]++;
    if (call->slot == DT_ICOMM_WAIT && k->req_slot >= 0)
        n->waits_for[k->req_slot]++;
    if (call->slot == DT_ICOMM_ALL_REDUCE && k->group_size > 0 && k->group_size < 4)
        n->sizes[k->group_size]++;
    return DT_OK;
}

/* 4 ranks through the wrapper: an all_reduce on the world and on halves
 * split from it give the right sums, and the hooks counted each. */
static int shm_rank(int rank, int nproc, const char *job, void *arg)
{
    (void)arg;
    shm_counts_t n = {0};
    dt_interpose_hooks_t hk = {.ctx = &n, .before = count_before};
    dt_interpose_comm_t *is = NULL;
    DT_MP_OK(dt_interpose_comm_create(SHM, &hk, &is));
    const dt_comm_ops_t *S = dt_interpose_comm_ops(is);
    dt_test_host_t h;
    dt_test_host_init(&h, "comm/shm", NULL);
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = rank, .size = nproc,
                        .local_rank = rank, .local_size = nproc, .job_id = job,
                        .timeout_ms = 10000};
    dt_comm_t *c = NULL, *half = NULL;
    DT_MP_OK(S->init(&h.host, &a, &c));
    float x[3] = {(float)rank, 1.0f, (float)(rank * rank)};
    dt_comm_req_t *req = NULL;
    DT_MP_OK(S->all_reduce(c, x, x, 3, DT_F32, DT_OP_SUM, NULL, &req));
    DT_MP_OK(S->wait(c, req, -1));
    DT_MP_CHECK(x[0] == 6.0f && x[1] == 4.0f && x[2] == 14.0f);
    DT_MP_OK(S->split(c, rank % 2, rank, &half));
    int32_t hr = -1, hs = -1;
    DT_MP_OK(S->rank_size(half, &hr, &hs));
    DT_MP_CHECK(hr == rank / 2 && hs == 2);
    float y = (float)rank;
    DT_MP_OK(S->all_reduce(half, &y, &y, 1, DT_F32, DT_OP_SUM, NULL, NULL));
    DT_MP_CHECK(y == (rank % 2 ? 4.0f : 2.0f)); /* 1 + 3, 0 + 2 */
    float g[4];
    float mine = (float)(10 * rank);
    DT_MP_OK(S->all_gather(c, &mine, g, 1, DT_F32, NULL, NULL));
    DT_MP_CHECK(g[0] == 0.0f && g[1] == 10.0f && g[2] == 20.0f && g[3] == 30.0f);
    S->finalize(half);
    S->finalize(c);
    dt_interpose_comm_destroy(is);
    DT_MP_CHECK(n.starts[DT_ICOMM_ALL_REDUCE] == 2 && n.starts[DT_ICOMM_ALL_GATHER] == 1);
    DT_MP_CHECK(n.waits_for[DT_ICOMM_ALL_REDUCE] == 1);
    DT_MP_CHECK(n.sizes[2] == 1 && n.sizes[0] == 0);
    return 0;
}

static void test_shm_through_the_wrapper(void **state)
{
    (void)state;
    dt_mp_run_ranks(4, shm_rank, NULL, 60.0, "ipshm");
}

/* abort through the wrapper reaches the plugin: the peer's wait fails
 * promptly with the plugin's DT_ERR_REMOTE naming the rank and reason. */
static int abort_rank(int rank, int nproc, const char *job, void *arg)
{
    (void)arg;
    dt_interpose_comm_t *is = NULL;
    DT_MP_OK(dt_interpose_comm_create(SHM, NULL, &is));
    const dt_comm_ops_t *S = dt_interpose_comm_ops(is);
    dt_test_host_t h;
    dt_test_host_init(&h, "comm/shm", NULL);
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = rank, .size = nproc,
                        .local_rank = rank, .local_size = nproc, .job_id = job,
                        .timeout_ms = 20000};
    dt_comm_t *c = NULL;
    DT_MP_OK(S->init(&h.host, &a, &c));
    if (rank == 1) {
        DT_MP_OK(S->abort(c, "the test says so"));
    } else {
        float x = 1.0f;
        int rc = S->all_reduce(c, &x, &x, 1, DT_F32, DT_OP_SUM, NULL, NULL);
        DT_MP_CHECK(rc == DT_ERR_REMOTE);
        DT_MP_CHECK(strstr(dt_last_error(), "rank 1 aborted: the test says so") != NULL);
    }
    S->finalize(c);
    dt_interpose_comm_destroy(is);
    return 0;
}

static void test_shm_abort_passes_through(void **state)
{
    (void)state;
    dt_mp_run_ranks(2, abort_rank, NULL, 15.0, "ipabort");
}

int main(void)
{
    dt_mp_set_leak_check(1);
    SHM = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_shm.so", DT_ENTRY_STRING(comm, 1),
                               NULL);
    if (!SHM) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_slot_passes_through, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failures_pass_through, setup, teardown),
        cmocka_unit_test_setup_teardown(test_injected_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_groups_are_wrapped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_older_and_newer_tables, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stacked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_profile, setup, teardown),
        cmocka_unit_test(test_shm_through_the_wrapper),
        cmocka_unit_test(test_shm_abort_passes_through),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
