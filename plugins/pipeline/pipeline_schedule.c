/*
 * plugins/pipeline/pipeline_schedule.c - one step of a stage: the order
 * pipeline_order.c gives, run over the core's stage runner, boundary
 * tensors moved with the pipeline group's send / recv (pipeline.h says
 * how).
 *
 * An operation's output is not sent when it is computed but when the
 * next operation starts: if that one begins by receiving from the same
 * neighbour on the same group (1F1B's steady state: a forward's
 * activation goes to stage k + 1 as the next backward's gradient comes
 * back from it; GPipe's turn from forwards to backwards), the two go as
 * one sendrecv, so that on a communicator whose sends block until their
 * receiver runs (nccl) two neighbours that each send first cannot wait
 * for each other forever (B8).  Nothing is computed in between, so the
 * send starts no later than before.  A communicator without sendrecv
 * gets the send, then the recv.
 */
#include <stdio.h>
#include <string.h>

#include "pipeline.h"

/* What one run call carries through its operations. */
typedef struct pp_step {
    dt_schedule_t *s;
    const dt_schedule_args_v1_t *a;
    int keep;        /* the core keeps every in-flight micro-batch's
                      * activations this step: no stash of inputs */
    double loss;     /* the last stage's sum of micro-batch losses */
    uint64_t wait_ns; /* time in receives */
    pp_buf_t *pending; /* the last operation's output, not sent yet
                        * (its from, peer, micro, grad and comm set) */
} pp_step_t;

static const char *what_of(int grad) { return grad ? "activation gradient" : "activation"; }

/* Virtual stage j's name in messages: "stage 1", or with chunks "virtual
 * stage 3 (stage 1, chunk 1)". */
static const char *vname(const dt_schedule_t *s, uint32_t j, char *out, size_t cap)
{
    const uint32_t p = (uint32_t)s->n_stages;
    if (s->V == 1)
        snprintf(out, cap, "stage %u", j);
    else
        snprintf(out, cap, "virtual stage %u (stage %u, chunk %u)", j, j % p, j / p);
    return out;
}

static uint32_t vstage(const dt_schedule_t *s, uint32_t chunk)
{
    return chunk * (uint32_t)s->n_stages + (uint32_t)s->stage;
}

static uint32_t n_vstages(const dt_schedule_t *s) { return s->V * (uint32_t)s->n_stages; }

static void pp_buf_free(dt_schedule_t *s, pp_buf_t *b)
{
    if (b->send)
        dt_comm_ops(b->comm)->wait(b->comm, b->send, 0); /* drops it: the step failed */
    if (b->p)
        dt_device_ops(s->dev)->free(s->dev, b->p);
    memset(b, 0, sizeof *b);
}

static void bufs_free(dt_schedule_t *s, pp_buf_t **b, uint32_t n)
{
    for (uint32_t i = 0; *b && i < n; i++)
        pp_buf_free(s, &(*b)[i]);
    s->host->free(s->host, *b);
    *b = NULL;
}

void pp_free_buffers(dt_schedule_t *s)
{
    bufs_free(s, &s->stash, s->V * s->n_stash);
    bufs_free(s, &s->out, s->V * s->n_ring);
    bufs_free(s, &s->din, s->V * s->n_ring);
    bufs_free(s, &s->dout, s->V);
    s->host->free(s->host, s->order);
    s->order = NULL;
    s->order_cap = 0;
    s->n_stash = s->n_ring = 0;
    s->act_bytes = 0;
}

static int pp_buf_alloc(dt_schedule_t *s, pp_buf_t *b, uint64_t bytes)
{
    int rc = dt_device_ops(s->dev)->alloc(s->dev, bytes, DT_TAG_ACTIVATIONS, &b->p);
    if (rc != DT_OK)
        s->host->log(s->host, DT_LOG_ERROR, "stage %d: allocating a boundary tensor of %llu "
                     "bytes failed", s->stage, (unsigned long long)bytes);
    return rc;
}

static int bufs_alloc(dt_schedule_t *s, pp_buf_t **b, uint32_t n)
{
    if (n == 0)
        return DT_OK;
    *b = s->host->alloc(s->host, n * sizeof **b, DT_TAG_OTHER);
    if (!*b)
        return s->host->set_error(s->host, DT_ERR_NOMEM, "%u boundary tensor slots", n);
    memset(*b, 0, n * sizeof **b);
    return DT_OK;
}

/* Virtual stage j receives (its input: all but the first) and sends (its
 * output: all but the last). */
static int receives(uint32_t j) { return j > 0; }
static int sends(uint32_t j, uint32_t nv) { return j + 1 < nv; }

uint32_t pp_buffers(uint32_t V, int32_t k, int32_t p, uint32_t m, uint32_t n_stash)
{
    const uint32_t nv = V * (uint32_t)p, ring = pp_ring(V, m);
    uint32_t n = 0;
    for (uint32_t c = 0; c < V; c++) {
        const uint32_t j = c * (uint32_t)p + (uint32_t)k;
        n += receives(j) ? n_stash + ring : 0;
        n += sends(j, nv) ? ring + 1 : 0;
    }
    return n;
}

/* The buffers this stage needs for `n_micro` micro-batches of `bytes`,
 * per chunk (pp_buffers counts them): stashed inputs (not on virtual
 * stage 0: it reads tokens), outputs and the received output gradient
 * (not on the last), input gradients (not on virtual stage 0), sends in
 * flight as pp_ring says. */
static int ensure_buffers(dt_schedule_t *s, uint64_t bytes, uint32_t n_micro, int no_grad,
                          int keep, uint32_t most)
{
    /* forwards only: each input is used as it arrives; the training
     * step's buffers serve */
    if (no_grad && s->act_bytes == bytes)
        return DT_OK;
    if (bytes == s->act_bytes && n_micro == s->buf_micro && keep == s->buf_keep)
        return DT_OK;
    pp_free_buffers(s);
    const uint32_t V = s->V, nv = n_vstages(s);
    s->n_stash = pp_stash(keep, most);
    s->n_ring = pp_ring(V, n_micro);
    int rc;
    if ((rc = bufs_alloc(s, &s->stash, V * s->n_stash)) == DT_OK &&
        (rc = bufs_alloc(s, &s->out, V * s->n_ring)) == DT_OK &&
        (rc = bufs_alloc(s, &s->din, V * s->n_ring)) == DT_OK)
        rc = bufs_alloc(s, &s->dout, V);
    for (uint32_t c = 0; c < V && rc == DT_OK; c++) {
        const uint32_t j = vstage(s, c);
        for (uint32_t i = 0; receives(j) && i < s->n_stash && rc == DT_OK; i++)
            rc = pp_buf_alloc(s, &s->stash[c * s->n_stash + i], bytes);
        for (uint32_t i = 0; i < s->n_ring && rc == DT_OK; i++) {
            if (sends(j, nv))
                rc = pp_buf_alloc(s, &s->out[c * s->n_ring + i], bytes);
            if (receives(j) && rc == DT_OK)
                rc = pp_buf_alloc(s, &s->din[c * s->n_ring + i], bytes);
        }
        if (sends(j, nv) && rc == DT_OK)
            rc = pp_buf_alloc(s, &s->dout[c], bytes);
    }
    if (rc != DT_OK) {
        pp_free_buffers(s);
        return rc;
    }
    s->act_bytes = bytes;
    s->buf_micro = n_micro;
    s->buf_keep = keep;
    return DT_OK;
}

/* The send still reading b has finished (b may be reused). */
static int finish_send(pp_step_t *t, pp_buf_t *b)
{
    dt_schedule_t *s = t->s;
    if (!b->send)
        return DT_OK;
    int rc = dt_comm_ops(b->comm)->wait(b->comm, b->send, -1); /* frees the request */
    b->send = NULL;
    if (rc != DT_OK) {
        char me[64], to[64];
        s->host->log(s->host, DT_LOG_ERROR, "step %lld: %s: send of the %s of micro-batch %u "
                     "to %s failed", (long long)t->a->step, vname(s, b->from, me, sizeof me),
                     what_of(b->grad), b->micro, vname(s, b->peer, to, sizeof to));
    }
    return rc;
}

/* The group a tensor travels on, the rank of virtual stage j in it, and
 * its tag: micro-batch `micro` into virtual stage j (an activation from
 * j - 1, or with `grad` a gradient from j + 1). */
static dt_comm_t *route(const dt_schedule_t *s, int grad)
{
    if (s->V == 1)
        return s->comm;
    return grad ? s->grad_comm : s->act_comm;
}

static int32_t tag_of(const pp_step_t *t, uint32_t j, uint32_t micro, int grad)
{
    const uint32_t chunk = j / (uint32_t)t->s->n_stages;
    return (int32_t)(2 * (chunk * t->a->n_micro + micro) + (uint32_t)grad);
}

/* b (from virtual stage `from`) is to go to virtual stage `to`: sent when
 * the next operation starts (send_pending, recv_into). */
static void defer_send(pp_step_t *t, pp_buf_t *b, uint32_t from, uint32_t to, uint32_t micro,
                       int grad)
{
    b->from = from;
    b->peer = to;
    b->micro = micro;
    b->grad = grad;
    b->comm = route(t->s, grad);
    t->pending = b;
}

static int32_t rank_of(const dt_schedule_t *s, uint32_t j)
{
    return (int32_t)(j % (uint32_t)s->n_stages);
}

/* Start sending the pending output on its own. */
static int send_pending(pp_step_t *t)
{
    dt_schedule_t *s = t->s;
    pp_buf_t *b = t->pending;
    if (!b)
        return DT_OK;
    t->pending = NULL;
    int rc = dt_comm_ops(b->comm)->send(b->comm, b->p, t->a->act_count, t->a->act_dtype,
                               rank_of(s, b->peer), tag_of(t, b->peer, b->micro, b->grad), s->cs,
                               &b->send);
    if (rc != DT_OK) {
        char me[64], pe[64];
        b->send = NULL;
        s->host->log(s->host, DT_LOG_ERROR,
                     "step %lld: %s: starting the send of the %s of micro-batch %u to %s "
                     "failed", (long long)t->a->step, vname(s, b->from, me, sizeof me),
                     what_of(b->grad), b->micro, vname(s, b->peer, pe, sizeof pe));
    }
    return rc;
}

/* The pending output goes with a recv from virtual stage `from` on group
 * c: the same rank, the same group, and a communicator with sendrecv. */
static int pairs_with(const pp_step_t *t, dt_comm_t *c, uint32_t from)
{
    const dt_schedule_t *s = t->s;
    const pp_buf_t *b = t->pending;
    return b && b->comm == c && rank_of(s, b->peer) == rank_of(s, from) &&
           DT_HAS_OP(dt_comm_ops_t, dt_comm_ops(s->comm), sendrecv);
}

/* Receive into buf virtual stage j's input (from j - 1) or, with `grad`,
 * the gradient of its output (from j + 1); the pending output goes
 * first, or with it when they share the neighbour (pairs_with). */
static int recv_into(pp_step_t *t, void *buf, uint32_t j, uint32_t micro, int grad)
{
    dt_schedule_t *s = t->s;
    const uint32_t from = grad ? j + 1 : j - 1;
    const uint64_t t0 = s->host->now_ns(s->host);
    dt_comm_t *c = route(s, grad);
    dt_comm_req_t *req = NULL;
    pp_buf_t *b = pairs_with(t, c, from) ? t->pending : NULL;
    int rc;
    if (b) {
        t->pending = NULL;
        rc = dt_comm_ops(c)->sendrecv(c, b->p, t->a->act_count, buf, t->a->act_count,
                                   t->a->act_dtype, rank_of(s, b->peer), rank_of(s, from),
                                   tag_of(t, b->peer, b->micro, b->grad),
                                   tag_of(t, j, micro, grad), s->cs, &b->send, &req);
    } else if ((rc = send_pending(t)) == DT_OK) {
        rc = dt_comm_ops(c)->recv(c, buf, t->a->act_count, t->a->act_dtype, rank_of(s, from),
                               tag_of(t, j, micro, grad), s->cs, &req);
    } else {
        return rc;
    }
    if (rc == DT_OK)
        rc = dt_comm_ops(c)->wait(c, req, -1);
    t->wait_ns += s->host->now_ns(s->host) - t0;
    if (rc != DT_OK) {
        char me[64], pe[64], to[64];
        if (b)
            s->host->log(s->host, DT_LOG_ERROR,
                         "step %lld: %s: sendrecv of the %s of micro-batch %u to %s and the "
                         "%s of micro-batch %u from %s failed", (long long)t->a->step,
                         vname(s, j, me, sizeof me), what_of(b->grad), b->micro,
                         vname(s, b->peer, to, sizeof to), what_of(grad), micro,
                         vname(s, from, pe, sizeof pe));
        else
            s->host->log(s->host, DT_LOG_ERROR,
                         "step %lld: %s: recv of the %s of micro-batch %u from %s failed",
                         (long long)t->a->step, vname(s, j, me, sizeof me), what_of(grad),
                         micro, vname(s, from, pe, sizeof pe));
    }
    return rc;
}

/* F(chunk, m): receive the input, run the chunk, send the output on. */
static int forward(pp_step_t *t, uint32_t chunk, uint32_t m)
{
    dt_schedule_t *s = t->s;
    const dt_stage_runner_v1_t *r = t->a->runner;
    const uint32_t j = vstage(s, chunk);
    void *in = NULL, *out = NULL;
    pp_buf_t *ob = NULL;
    int rc;
    if (j > 0) {
        in = s->stash[chunk * s->n_stash + m % s->n_stash].p;
        if ((rc = recv_into(t, in, j, m, 0)) != DT_OK)
            return rc;
    } else if ((rc = send_pending(t)) != DT_OK) {
        return rc;
    }
    if (j + 1 < n_vstages(s)) {
        ob = &s->out[chunk * s->n_ring + m % s->n_ring];
        if ((rc = finish_send(t, ob)) != DT_OK)
            return rc;
        out = ob->p;
    }
    rc = r->forward(r->ctx, chunk, m, in, out, &t->loss);
    if (rc != DT_OK)
        return rc;
    if (ob)
        defer_send(t, ob, j, j + 1, m, 0);
    return DT_OK;
}

/* B(chunk, m): receive the output's gradient, run the chunk's backward,
 * send the input's gradient back. */
static int backward(pp_step_t *t, uint32_t chunk, uint32_t m)
{
    dt_schedule_t *s = t->s;
    const dt_stage_runner_v1_t *r = t->a->runner;
    const uint32_t j = vstage(s, chunk);
    /* with kept activations the input is in them (and the one stash
     * buffer already holds a later micro-batch's) */
    const void *in = j > 0 && !t->keep ? s->stash[chunk * s->n_stash + m % s->n_stash].p : NULL;
    void *dout = NULL, *din = NULL;
    pp_buf_t *db = NULL;
    int rc;
    if (j + 1 < n_vstages(s)) {
        dout = s->dout[chunk].p;
        if ((rc = recv_into(t, dout, j, m, 1)) != DT_OK)
            return rc;
    } else if ((rc = send_pending(t)) != DT_OK) {
        return rc;
    }
    if (j > 0) {
        db = &s->din[chunk * s->n_ring + m % s->n_ring];
        if ((rc = finish_send(t, db)) != DT_OK)
            return rc;
        din = db->p;
    }
    rc = r->backward(r->ctx, chunk, m, in, dout, din);
    if (rc != DT_OK)
        return rc;
    if (db)
        defer_send(t, db, j, j - 1, m, 1);
    return DT_OK;
}

/* The most micro-batches a chunk of this stage has in flight for m
 * micro-batches a step, walked once per m (every step asks). */
static int in_flight_of(dt_schedule_t *s, uint32_t m, uint32_t *most)
{
    if (s->most_micro != m) {
        s->most = pp_order_in_flight(s->host, s->schedule, s->V, s->stage, s->n_stages, m);
        s->most_micro = s->most ? m : 0;
    }
    *most = s->most;
    return s->most ? DT_OK
                   : s->host->set_error(s->host, DT_ERR_NOMEM, "the order of stage %d",
                                        s->stage);
}

int pp_run(dt_schedule_t *s, const dt_schedule_args_v1_t *in, dt_schedule_result_v1_t *res)
{
    const dt_host_v1_t *host = s->host;
    dt_schedule_args_v1_t a;
    int rc = dt_args_read(host, "run args", &a, sizeof a, in,
                          DT_SCHEDULE_ARGS_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a.runner || a.n_micro < 1 || a.act_count == 0)
        return host->set_error(host, DT_ERR_INVALID, "run: %s",
                               !a.runner ? "NULL runner" : a.n_micro < 1 ? "n_micro = 0"
                                                                         : "act_count = 0");
    if ((rc = dt_args_check(host, "stage runner", a.runner, sizeof *a.runner,
                            DT_STAGE_RUNNER_V1_SIZE0)) != DT_OK)
        return rc;
    if (!a.runner->forward || !a.runner->backward)
        return host->set_error(host, DT_ERR_INVALID, "run: the runner has no %s",
                               !a.runner->forward ? "forward" : "backward");
    const int no_grad = (a.flags & DT_SCHEDULE_NO_GRAD) != 0;
    if (!no_grad && s->V > 1 && a.n_micro % (uint32_t)s->n_stages != 0)
        return host->set_error(host, DT_ERR_INVALID, "run: %u micro-batches, not a "
                               "multiple of the %d stages (virtual_stages = %u)",
                               a.n_micro, s->n_stages, s->V);
    /* [pipeline] keep_activations holds when the core kept as many slots
     * as this stage has micro-batches in flight */
    const uint32_t slots = a.runner->act_slots ? a.runner->act_slots : 1;
    uint32_t most;
    if ((rc = in_flight_of(s, a.n_micro, &most)) != DT_OK)
        return rc;
    const int keep = s->keep && slots >= most;
    if (s->V > 1 && !keep && !no_grad)
        return host->set_error(host, DT_ERR_INVALID, "run: the core keeps %u "
                               "micro-batches' activations, and %u chunks a stage need %u",
                               slots, s->V, most);
    if ((rc = ensure_buffers(s, a.act_count * dt_dtype_size(a.act_dtype), a.n_micro, no_grad,
                             keep, most)) != DT_OK)
        return rc;
    /* the order: 2 m V operations at most (forwards only: m V) */
    const uint32_t cap = 2 * a.n_micro * s->V;
    if (cap > s->order_cap) {
        s->host->free(s->host, s->order);
        s->order_cap = 0;
        if (!(s->order = s->host->alloc(s->host, cap * sizeof *s->order, DT_TAG_OTHER)))
            return host->set_error(host, DT_ERR_NOMEM, "run: the order of %u "
                                   "operations", cap);
        s->order_cap = cap;
    }
    pp_step_t t = {.s = s, .a = &a, .keep = keep};
    const uint32_t n = pp_order(s->schedule, s->V, s->stage, s->n_stages, a.n_micro, no_grad,
                                s->order);
    for (uint32_t i = 0; i < n && rc == DT_OK; i++)
        rc = s->order[i].kind == PP_FWD ? forward(&t, s->order[i].chunk, s->order[i].micro)
                                      : backward(&t, s->order[i].chunk, s->order[i].micro);
    if (rc == DT_OK)
        rc = send_pending(&t);
    /* the last sends: their buffers are reused next step */
    for (uint32_t i = 0; i < s->V * s->n_ring && rc == DT_OK; i++) {
        rc = finish_send(&t, &s->out[i]);
        if (rc == DT_OK)
            rc = finish_send(&t, &s->din[i]);
    }
    if (rc != DT_OK)
        return rc;
    dt_schedule_result_v1_t r = {.struct_size = sizeof r};
    r.n_loss = s->stage == s->n_stages - 1 ? a.n_micro : 0;
    r.loss_sum = r.n_loss ? t.loss : 0.0;
    r.recv_wait_s = (double)t.wait_ns * 1e-9;
    return dt_result_write(host, "run", res, &r, sizeof r, DT_SCHEDULE_RESULT_V1_SIZE0);
}
