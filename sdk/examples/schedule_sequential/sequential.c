/*
 * sequential.c - an example dtrain pipeline schedule to copy: the naive
 * one.  Each micro-batch goes through every stage and back before the next
 * one starts (forward on stage 0, 1, ..., p - 1, then backward on p - 1,
 * ..., 0), so only one stage computes at any time: the bubble is
 * (p - 1) / p, against GPipe's (p - 1) / (m + p - 1).  It is the schedule
 * to measure the others against, and the smallest one to read: every
 * micro-batch's activations are gone once its backward ran, so a stage
 * keeps one micro-batch's activations and one boundary tensor each way.
 * Its losses are GPipe's (the same forwards and backwards, the gradients
 * summed in the same micro-batch order).
 *
 * The table has only the mandatory slots (schedule.h): init and finalize
 * over the pipeline group, assign_stages (uniform, one chunk a stage;
 * [pipeline] balance = "params" / "flops" and virtual_stages > 1 are
 * refused, naming the key) and run, which drives the core's stage runner
 * and moves boundary tensors with the group's blocking send and recv (the
 * micro-batch in the tag: 2m for the activation, 2m + 1 for its gradient).
 *
 * To start a new schedule: copy this folder, rename every "sequential"
 * (the file, the plugin name string, the CMake target), and change the
 * order in run().  Build it against the INSTALLED SDK:
 *     cmake -S . -B build -DCMAKE_PREFIX_PATH=<dtrain prefix> && cmake --build build
 * and run it: DTRAIN_PLUGIN_PATH=$PWD/build dtrain run config.toml with
 *     [parallel]
 *     pipeline = 2
 *     [pipeline]
 *     schedule = "sequential"
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <dtrain/dtrain.h>

struct dt_schedule {
    const dt_schedule_ops_v1_t *ops; /* first: the table that made it (dtrain/schedule.h) */
    const dt_host_v1_t *host;
    dt_device_t *dev;
    dt_stream_t *cs;           /* the core's compute stream */
    dt_comm_t *comm;           /* the pipeline group: rank = stage */
    int32_t stage, n_stages;
    uint64_t bytes;            /* of one boundary tensor, as allocated */
    void *in, *out;            /* the received input and this stage's output;
                                * in backward, the output's gradient (`out`)
                                * and the input's (`in`) */
};

static int refuse_layout(const dt_host_v1_t *host, uint32_t chunks, int32_t balance)
{
    if (chunks > 1)
        return host->set_error(host, DT_ERR_CONFIG, "pipeline.virtual_stages = %u: the "
                               "sequential schedule runs one chunk a stage", chunks);
    if (balance != DT_BALANCE_UNIFORM)
        return host->set_error(host, DT_ERR_CONFIG, "pipeline.balance: the sequential "
                               "schedule balances uniformly (\"uniform\")");
    return DT_OK;
}

static void seq_finalize(dt_schedule_t *s)
{
    if (!s)
        return;
    dt_device_ops(s->dev)->free(s->dev, s->in);
    dt_device_ops(s->dev)->free(s->dev, s->out);
    s->host->free(s->host, s);
}

/* Defined below; every handle this plugin makes starts with it. */
static const dt_schedule_ops_v1_t sequential_ops;

static int seq_init(const dt_host_v1_t *host, const dt_schedule_init_v1_t *in,
                    dt_schedule_t **out)
{
    dt_schedule_init_v1_t a;
    *out = NULL;
    int rc = dt_args_read(host, "init args", &a, sizeof a, in, DT_SCHEDULE_INIT_V1_SIZE0);
    if (rc != DT_OK || (rc = refuse_layout(host, a.chunks, DT_BALANCE_UNIFORM)) != DT_OK)
        return rc;
    dt_schedule_t *s = host->alloc(host, sizeof *s, DT_TAG_OTHER);
    if (!s)
        return host->set_error(host, DT_ERR_NOMEM, "init: instance");
    memset(s, 0, sizeof *s);
    s->host = host;
    s->ops = &sequential_ops;
    s->dev = a.dev;
    s->cs = a.compute_stream;
    s->comm = a.comm;
    if ((rc = dt_comm_ops(a.comm)->rank_size(a.comm, &s->stage, &s->n_stages)) != DT_OK) {
        seq_finalize(s);
        return rc;
    }
    *out = s;
    return DT_OK;
}

/* Units in equal counts, the first n % p stages one more; what a stage
 * keeps: one micro-batch's activations, a receive buffer (not the first
 * stage) and an output buffer (not the last). */
static int seq_assign_stages(const dt_host_v1_t *host, const dt_stage_args_v1_t *in,
                             uint32_t *out)
{
    dt_stage_args_v1_t a;
    int rc = dt_args_read(host, "assign_stages args", &a, sizeof a, in, DT_STAGE_ARGS_V1_SIZE0);
    if (rc != DT_OK || (rc = refuse_layout(host, a.chunks, a.balance)) != DT_OK)
        return rc;
    const uint32_t n = a.model->n_units, p = (uint32_t)a.n_stages;
    if (a.n_stages < 2 || p > n)
        return host->set_error(host, DT_ERR_CONFIG, "parallel.pipeline = %d stages, but model "
                               "%s has %u units (each stage needs at least one)",
                               a.n_stages, a.model->arch, n);
    for (uint32_t k = 0, u = 0; k < p; k++) {
        const uint32_t take = n / p + (k < n % p ? 1 : 0);
        for (uint32_t i = 0; i < take; i++)
            out[u++] = k;
        if (a.in_flight)
            a.in_flight[k] = 1;
        if (a.stash)
            a.stash[k] = k > 0 ? 1 : 0;
        if (a.buffers)
            a.buffers[k] = (k > 0 ? 1u : 0u) + (k + 1 < p ? 1u : 0u);
    }
    return DT_OK;
}

/* Send or receive one boundary tensor of micro-batch m (`grad`: its
 * gradient), blocking, bounded by the group's timeout. */
static int move(dt_schedule_t *s, const dt_schedule_args_v1_t *a, int send, void *buf,
                int32_t peer, uint32_t m, int grad)
{
    const int32_t tag = (int32_t)(2 * m + (grad ? 1u : 0u));
    int rc = send ? dt_comm_ops(s->comm)->send(s->comm, buf, a->act_count, a->act_dtype, peer, tag,
                                      s->cs, NULL)
                  : dt_comm_ops(s->comm)->recv(s->comm, buf, a->act_count, a->act_dtype, peer, tag,
                                      s->cs, NULL);
    if (rc != DT_OK)
        s->host->log(s->host, DT_LOG_ERROR, "step %lld: stage %d: %s of the %s of micro-batch "
                     "%u %s stage %d failed", (long long)a->step, s->stage,
                     send ? "send" : "recv", grad ? "activation gradient" : "activation", m,
                     send ? "to" : "from", peer);
    return rc;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int seq_run(dt_schedule_t *s, const dt_schedule_args_v1_t *in, dt_schedule_result_v1_t *res)
{
    const dt_host_v1_t *host = s->host;
    dt_schedule_args_v1_t a;
    int rc = dt_args_read(host, "run args", &a, sizeof a, in, DT_SCHEDULE_ARGS_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a.runner || !a.runner->forward || !a.runner->backward)
        return host->set_error(host, DT_ERR_INVALID, "run: no stage runner");
    const uint64_t bytes = a.act_count * dt_dtype_size(a.act_dtype);
    if (bytes != s->bytes) {
        dt_device_ops(s->dev)->free(s->dev, s->in);
        dt_device_ops(s->dev)->free(s->dev, s->out);
        s->in = s->out = NULL;
        s->bytes = 0;
        if ((rc = dt_device_ops(s->dev)->alloc(s->dev, bytes, DT_TAG_ACTIVATIONS, &s->in)) !=
                DT_OK ||
            (rc = dt_device_ops(s->dev)->alloc(s->dev, bytes, DT_TAG_ACTIVATIONS, &s->out)) !=
                DT_OK)
            return rc;
        s->bytes = bytes;
    }
    const dt_stage_runner_v1_t *r = a.runner;
    const int first = s->stage == 0, last = s->stage == s->n_stages - 1;
    const int no_grad = (a.flags & DT_SCHEDULE_NO_GRAD) != 0;
    double loss = 0, wait = 0, t0;
    for (uint32_t m = 0; m < a.n_micro && rc == DT_OK; m++) {
        /* forward: in from the stage before, out to the stage after */
        t0 = now_s();
        if (!first && (rc = move(s, &a, 0, s->in, s->stage - 1, m, 0)) != DT_OK)
            break;
        wait += now_s() - t0;
        if ((rc = r->forward(r->ctx, 0, m, first ? NULL : s->in, last ? NULL : s->out,
                             &loss)) != DT_OK ||
            (!last && (rc = move(s, &a, 1, s->out, s->stage + 1, m, 0)) != DT_OK) || no_grad)
            continue;
        /* backward: the output's gradient from the stage after (into
         * `out`), the input's to the stage before (from `in`, which the
         * runner no longer needs: its slot still holds micro-batch m) */
        t0 = now_s();
        if (!last && (rc = move(s, &a, 0, s->out, s->stage + 1, m, 1)) != DT_OK)
            break;
        wait += now_s() - t0;
        if ((rc = r->backward(r->ctx, 0, m, NULL, last ? NULL : s->out,
                              first ? NULL : s->in)) != DT_OK)
            break;
        if (!first)
            rc = move(s, &a, 1, s->in, s->stage - 1, m, 1);
    }
    if (rc != DT_OK)
        return rc;
    dt_schedule_result_v1_t out = {.struct_size = sizeof out,
                                   .n_loss = last ? a.n_micro : 0,
                                   .loss_sum = last ? loss : 0,
                                   .recv_wait_s = wait};
    return dt_result_write(host, "run", res, &out, sizeof out, DT_SCHEDULE_RESULT_V1_SIZE0);
}

static const dt_schedule_ops_v1_t sequential_ops = {
    .info = DT_PLUGIN_INFO_NOKEYS(SCHEDULE, dt_schedule_ops_v1_t, "sequential", "0.1.0",
                                  "pipeline schedule: one micro-batch at a time through every "
                                  "stage (an SDK example)"),
    .init = seq_init,
    .finalize = seq_finalize,
    .assign_stages = seq_assign_stages,
    .run = seq_run,
};

DT_PLUGIN_ENTRY(schedule, 1, dt_schedule_ops_v1_t, &sequential_ops)
