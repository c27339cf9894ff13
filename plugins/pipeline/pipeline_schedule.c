/*
 * plugins/pipeline/pipeline_schedule.c - one step of a stage: GPipe or
 * 1F1B over the core's stage runner, boundary tensors moved with the
 * pipeline group's send / recv (pipeline.h says how).
 */
#include <stdio.h>
#include <string.h>

#include "pipeline.h"

/* What one run_schedule call carries through its operations. */
typedef struct pp_step {
    dt_strategy_t *s;
    const dt_schedule_args_v1_t *a;
    int keep;        /* the core keeps every in-flight micro-batch's
                      * activations this step: no stash of inputs */
    double loss;     /* the last stage's sum of micro-batch losses */
    uint64_t wait_ns; /* time in receives */
} pp_step_t;

static const char *what_of(int grad) { return grad ? "activation gradient" : "activation"; }

static void pp_buf_free(dt_strategy_t *s, pp_buf_t *b)
{
    if (b->send)
        s->comm_ops->wait(s->comm, b->send, 0); /* drops it: the step failed */
    if (b->p)
        s->dev_ops->free(s->dev, b->p);
    memset(b, 0, sizeof *b);
}

void pp_free_buffers(dt_strategy_t *s)
{
    for (uint32_t i = 0; i < s->n_stash; i++)
        pp_buf_free(s, &s->stash[i]);
    s->host->free(s->host, s->stash);
    s->stash = NULL;
    s->n_stash = 0;
    for (int i = 0; i < 2; i++) {
        pp_buf_free(s, &s->out[i]);
        pp_buf_free(s, &s->din[i]);
    }
    pp_buf_free(s, &s->dout);
    s->act_bytes = 0;
}

static int pp_buf_alloc(dt_strategy_t *s, pp_buf_t *b, uint64_t bytes)
{
    int rc = s->dev_ops->alloc(s->dev, bytes, DT_TAG_ACTIVATIONS, &b->p);
    if (rc != DT_OK)
        s->host->log(s->host, DT_LOG_ERROR, "stage %d: allocating a boundary tensor of %llu "
                     "bytes failed", s->stage, (unsigned long long)bytes);
    return rc;
}

/* The buffers this stage needs for `n_micro` micro-batches of `bytes`:
 * stashed inputs (not on the first stage: it reads tokens), outputs and
 * the received output gradient (not on the last), input gradients (not on
 * the first). */
static int ensure_buffers(dt_strategy_t *s, uint64_t bytes, uint32_t n_micro, int no_grad,
                          int keep)
{
    const int first = s->stage == 0, last = s->stage == s->n_stages - 1;
    /* forwards only: each input is used as it arrives, one slot will do,
     * and the training step's stash is kept rather than made again */
    if (no_grad && bytes == s->act_bytes && (first || s->n_stash >= 1))
        return DT_OK;
    if (no_grad)
        n_micro = 1;
    uint32_t n_stash = pp_stash(s->schedule, keep, s->stage, s->n_stages, n_micro);
    if (bytes == s->act_bytes && n_stash == s->n_stash)
        return DT_OK;
    pp_free_buffers(s);
    int rc = DT_OK;
    if (n_stash) {
        s->stash = s->host->alloc(s->host, n_stash * sizeof *s->stash, DT_TAG_OTHER);
        if (!s->stash)
            return s->host->set_error(s->host, DT_ERR_NOMEM, "stash of %u inputs", n_stash);
        memset(s->stash, 0, n_stash * sizeof *s->stash);
        s->n_stash = n_stash;
    }
    for (uint32_t i = 0; i < n_stash && rc == DT_OK; i++)
        rc = pp_buf_alloc(s, &s->stash[i], bytes);
    for (int i = 0; i < 2 && rc == DT_OK; i++) {
        if (!last)
            rc = pp_buf_alloc(s, &s->out[i], bytes);
        if (!first && rc == DT_OK)
            rc = pp_buf_alloc(s, &s->din[i], bytes);
    }
    if (!last && rc == DT_OK)
        rc = pp_buf_alloc(s, &s->dout, bytes);
    if (rc != DT_OK) {
        pp_free_buffers(s);
        return rc;
    }
    s->act_bytes = bytes;
    return DT_OK;
}

/* The send still reading b has finished (b may be reused). */
static int finish_send(pp_step_t *t, pp_buf_t *b)
{
    dt_strategy_t *s = t->s;
    if (!b->send)
        return DT_OK;
    int rc = s->comm_ops->wait(s->comm, b->send, -1); /* frees the request */
    b->send = NULL;
    if (rc != DT_OK)
        s->host->log(s->host, DT_LOG_ERROR,
                     "step %lld: stage %d: send of the %s of micro-batch %u to stage %d "
                     "failed", (long long)t->a->step, s->stage, what_of(b->grad), b->micro,
                     b->peer);
    return rc;
}

static int start_send(pp_step_t *t, pp_buf_t *b, int32_t peer, uint32_t micro, int grad)
{
    dt_strategy_t *s = t->s;
    b->peer = peer;
    b->micro = micro;
    b->grad = grad;
    int rc = s->comm_ops->send(s->comm, b->p, t->a->act_count, t->a->act_dtype, peer,
                               (int32_t)(2 * micro + (uint32_t)grad), s->cs, &b->send);
    if (rc != DT_OK) {
        b->send = NULL;
        s->host->log(s->host, DT_LOG_ERROR,
                     "step %lld: stage %d: starting the send of the %s of micro-batch %u to "
                     "stage %d failed", (long long)t->a->step, s->stage, what_of(grad), micro,
                     peer);
    }
    return rc;
}

static int recv_from(pp_step_t *t, void *buf, int32_t peer, uint32_t micro, int grad)
{
    dt_strategy_t *s = t->s;
    const uint64_t t0 = s->host->now_ns(s->host);
    dt_comm_req_t *req = NULL;
    int rc = s->comm_ops->recv(s->comm, buf, t->a->act_count, t->a->act_dtype, peer,
                               (int32_t)(2 * micro + (uint32_t)grad), s->cs, &req);
    if (rc == DT_OK)
        rc = s->comm_ops->wait(s->comm, req, -1);
    t->wait_ns += s->host->now_ns(s->host) - t0;
    if (rc != DT_OK)
        s->host->log(s->host, DT_LOG_ERROR,
                     "step %lld: stage %d: recv of the %s of micro-batch %u from stage %d "
                     "failed", (long long)t->a->step, s->stage, what_of(grad), micro, peer);
    return rc;
}

/* F(m): receive the input, run the stage, send the output on. */
static int forward(pp_step_t *t, uint32_t m)
{
    dt_strategy_t *s = t->s;
    const dt_stage_runner_v1_t *r = t->a->runner;
    void *in = NULL, *out = NULL;
    pp_buf_t *ob = NULL;
    int rc;
    if (s->stage > 0) {
        in = s->stash[m % s->n_stash].p;
        if ((rc = recv_from(t, in, s->stage - 1, m, 0)) != DT_OK)
            return rc;
    }
    if (s->stage < s->n_stages - 1) {
        ob = &s->out[m % 2];
        if ((rc = finish_send(t, ob)) != DT_OK)
            return rc;
        out = ob->p;
    }
    if ((rc = r->forward(r->ctx, m, in, out, &t->loss)) != DT_OK)
        return rc;
    return ob ? start_send(t, ob, s->stage + 1, m, 0) : DT_OK;
}

/* B(m): receive the output's gradient, run the stage's backward, send the
 * input's gradient back. */
static int backward(pp_step_t *t, uint32_t m)
{
    dt_strategy_t *s = t->s;
    const dt_stage_runner_v1_t *r = t->a->runner;
    /* with kept activations the input is in them (and the one stash
     * buffer already holds a later micro-batch's) */
    const void *in = s->stage > 0 && !t->keep ? s->stash[m % s->n_stash].p : NULL;
    void *dout = NULL, *din = NULL;
    pp_buf_t *db = NULL;
    int rc;
    if (s->stage < s->n_stages - 1) {
        dout = s->dout.p;
        if ((rc = recv_from(t, dout, s->stage + 1, m, 1)) != DT_OK)
            return rc;
    }
    if (s->stage > 0) {
        db = &s->din[m % 2];
        if ((rc = finish_send(t, db)) != DT_OK)
            return rc;
        din = db->p;
    }
    if ((rc = r->backward(r->ctx, m, in, dout, din)) != DT_OK)
        return rc;
    return db ? start_send(t, db, s->stage - 1, m, 1) : DT_OK;
}

/* The order of this stage's operations. */
static int run_ops(pp_step_t *t)
{
    dt_strategy_t *s = t->s;
    const uint32_t M = t->a->n_micro;
    int rc = DT_OK;
    if (t->a->flags & DT_SCHEDULE_NO_GRAD) {
        for (uint32_t m = 0; m < M && rc == DT_OK; m++)
            rc = forward(t, m);
        return rc;
    }
    if (s->schedule == PP_SCHED_GPIPE) {
        for (uint32_t m = 0; m < M && rc == DT_OK; m++)
            rc = forward(t, m);
        for (uint32_t m = 0; m < M && rc == DT_OK; m++)
            rc = backward(t, m);
        return rc;
    }
    /* 1F1B: warm-up forwards, one forward one backward, cool-down */
    uint32_t warm = (uint32_t)(s->n_stages - s->stage - 1);
    if (warm > M)
        warm = M;
    uint32_t f = 0, b = 0;
    while (f < warm && rc == DT_OK)
        rc = forward(t, f++);
    while (f < M && rc == DT_OK) {
        rc = forward(t, f++);
        if (rc == DT_OK)
            rc = backward(t, b++);
    }
    while (b < M && rc == DT_OK)
        rc = backward(t, b++);
    return rc;
}

int pp_run(dt_strategy_t *s, const dt_schedule_args_v1_t *in, dt_schedule_result_v1_t *res)
{
    const dt_host_v1_t *host = s->host;
    dt_schedule_args_v1_t a;
    int rc = dt_args_read(host, "run_schedule args", &a, sizeof a, in,
                          DT_SCHEDULE_ARGS_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a.runner || a.n_micro < 1 || a.act_count == 0)
        return host->set_error(host, DT_ERR_INVALID, "run_schedule: %s",
                               !a.runner ? "NULL runner" : a.n_micro < 1 ? "n_micro = 0"
                                                                         : "act_count = 0");
    if ((rc = dt_args_check(host, "stage runner", a.runner, sizeof *a.runner,
                            DT_STAGE_RUNNER_V1_SIZE0)) != DT_OK)
        return rc;
    /* [pipeline] keep_activations holds when the core kept as many slots
     * as this stage has micro-batches in flight (an older core keeps 1) */
    const uint32_t slots = a.runner->struct_size >= DT_FIELD_END(dt_stage_runner_v1_t, act_slots)
                               ? a.runner->act_slots
                               : 1;
    const int keep = s->keep && slots >= pp_in_flight(s->schedule, 1, s->stage, s->n_stages,
                                                      a.n_micro);
    if ((rc = ensure_buffers(s, a.act_count * dt_dtype_size(a.act_dtype), a.n_micro,
                             (a.flags & DT_SCHEDULE_NO_GRAD) != 0, keep)) != DT_OK)
        return rc;
    pp_step_t t = {.s = s, .a = &a, .keep = keep};
    rc = run_ops(&t);
    /* the last sends: their buffers are reused next step */
    for (int i = 0; i < 2 && rc == DT_OK; i++) {
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
    return dt_result_write(host, "run_schedule", res, &r, sizeof r, DT_SCHEDULE_RESULT_V1_SIZE0);
}
