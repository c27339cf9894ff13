/*
 * plugins/pipeline/pipeline.c - the `pipeline` strategy's glue: its
 * [pipeline] keys, init and finalize, assign_stages, run_schedule, the
 * planner's estimate and the ops table.  It holds no parameters: the data
 * strategy of each stage does (strategy.h, "Pipeline parallelism"), so
 * its unit hooks and state calls say so if anyone calls them.
 */
#include <stdio.h>
#include <string.h>

#include "dtrain/sdk/cfg.h"
#include "dtrain/sdk/no_params.h"
#include "pipeline.h"

static const dt_config_key_t pp_keys[] = {
    {.name = "schedule",
     .type = DT_CFG_ENUM,
     .def = "\"1f1b\"",
     .choices = PP_SCHEDULES,
     .doc = "micro-batch order per stage: gpipe (all forwards, then all backwards; stashes "
            "every micro-batch's input) or 1f1b (one forward one backward; stashes at most "
            "the stage count)"},
    {.name = "keep_activations",
     .type = DT_CFG_BOOL,
     .def = "true",
     .doc = "keep the activations of every micro-batch in flight (1f1b: at most the stage "
            "count, gpipe: all of them) so each backward runs on its forward's; false keeps one "
            "micro-batch's and recomputes the others' forwards (less memory, about 1/3 more "
            "compute on every stage but the last)"},
    {.name = "virtual_stages",
     .type = DT_CFG_INT,
     .def = "1",
     DT_CFG_RANGE(1, PP_MAX_CHUNKS),
     .doc = "chunks per stage (Megatron's interleaved schedule): the model is cut into "
            "pipeline x virtual_stages pieces, stage k running pieces k, k + pipeline, ...; the "
            "bubble shrinks by this factor for as many more boundary transfers; needs "
            "grad_accum a multiple of the stages and keep_activations"},
    {.name = "balance",
     .type = DT_CFG_ENUM,
     .def = "\"uniform\"",
     .choices = PP_BALANCES,
     .doc = "units per stage: uniform (equal counts), params (contiguous stages with the "
            "smallest largest parameter count) or flops (the same by FLOPs per token: GPT-2's "
            "embedding runs no matmul, its head runs the LM head)"},
};

static int read_config(const dt_host_v1_t *host, pp_config_t *c)
{
    int64_t v = 1;
    int rc = dt_cfg_enum(host, "schedule", "1f1b", PP_SCHEDULES, &c->schedule);
    if (rc == DT_OK)
        rc = dt_cfg_bool(host, "keep_activations", 1, &c->keep);
    if (rc == DT_OK)
        rc = dt_cfg_int(host, "virtual_stages", 1, 1, &v);
    if (rc == DT_OK && v > PP_MAX_CHUNKS)
        rc = host->set_error(host, DT_ERR_CONFIG, "virtual_stages = %lld: at most %d chunks a "
                             "stage", (long long)v, PP_MAX_CHUNKS);
    c->V = (uint32_t)v;
    return rc == DT_OK ? dt_cfg_enum(host, "balance", "uniform", PP_BALANCES, &c->balance) : rc;
}

/* What an interleaved layout needs of the step: every chunk's activations
 * kept (its inputs are not stashed), and whole groups of p micro-batches
 * (Megatron's order). */
static int check_chunks(const dt_host_v1_t *host, const pp_config_t *c, int32_t p, uint32_t m)
{
    if (c->V == 1)
        return DT_OK;
    if (!c->keep)
        return host->set_error(host, DT_ERR_CONFIG,
                               "virtual_stages = %u needs keep_activations = true: an "
                               "interleaved stage keeps every chunk's activations rather than "
                               "stash each chunk's inputs to recompute them",
                               c->V);
    if (m % (uint32_t)p != 0)
        return host->set_error(host, DT_ERR_CONFIG,
                               "virtual_stages = %u needs the micro-batches of a step ([train] "
                               "grad_accum = %u) to be a multiple of the %d stages",
                               c->V, m, p);
    return DT_OK;
}

static void pp_finalize(dt_strategy_t *s)
{
    if (!s)
        return;
    pp_free_buffers(s);
    if (s->act_comm)
        s->comm_ops->finalize(s->act_comm);
    if (s->grad_comm)
        s->comm_ops->finalize(s->grad_comm);
    s->host->free(s->host, s);
}

static int pp_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *in,
                   dt_strategy_t **out)
{
    *out = NULL;
    dt_strategy_init_v1_t a;
    pp_config_t cfg;
    int rc = dt_args_read(host, "init args", &a, sizeof a, in, DT_STRATEGY_INIT_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a.dev_ops || !a.dev)
        return host->set_error(host, DT_ERR_INVALID, "init: NULL %s",
                               !a.dev_ops ? "dev_ops" : "dev");
    if ((rc = dt_no_params_init_check(host, &a, "the pipeline strategy")) != DT_OK)
        return rc;
    dt_strategy_t *s = host->alloc(host, sizeof *s, DT_TAG_OTHER);
    if (!s)
        return host->set_error(host, DT_ERR_NOMEM, "init: instance");
    memset(s, 0, sizeof *s);
    s->host = host;
    s->dev_ops = a.dev_ops;
    s->dev = a.dev;
    s->cs = a.compute_stream;
    s->comm_ops = a.comm_ops;
    s->comm = a.comm;
    s->n_micro = a.n_micro;
    if ((rc = read_config(host, &cfg)) == DT_OK &&
        (rc = a.comm_ops->rank_size(a.comm, &s->stage, &s->n_stages)) == DT_OK &&
        s->n_stages < 2)
        rc = host->set_error(host, DT_ERR_INVALID, "init: a pipeline group of %d rank(s)",
                             s->n_stages);
    s->schedule = cfg.schedule;
    s->keep = cfg.keep;
    s->V = cfg.V;
    if (rc == DT_OK)
        rc = check_chunks(host, &cfg, s->n_stages, s->n_micro);
    /* interleaved: activations and gradients on a group each (pipeline.h) */
    if (rc == DT_OK && s->V > 1 &&
        ((rc = a.comm_ops->split(a.comm, 0, s->stage, &s->act_comm)) != DT_OK ||
         (rc = a.comm_ops->split(a.comm, 0, s->stage, &s->grad_comm)) != DT_OK))
        s->host->log(host, DT_LOG_ERROR, "init: splitting the pipeline group failed");
    if (rc != DT_OK) {
        pp_finalize(s);
        return rc;
    }
    host->log(host, DT_LOG_DEBUG, "stage %d of %d, schedule %s, %u chunk(s)", s->stage,
              s->n_stages, s->schedule == PP_SCHED_GPIPE ? "gpipe" : "1f1b", s->V);
    *out = s;
    return DT_OK;
}

static int pp_assign_stages(const dt_host_v1_t *host, const dt_stage_args_v1_t *in,
                            uint32_t *out)
{
    dt_stage_args_v1_t a;
    pp_config_t c;
    int rc = dt_args_read(host, "assign_stages args", &a, sizeof a, in, DT_STAGE_ARGS_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a.model || !out)
        return host->set_error(host, DT_ERR_INVALID, "assign_stages: NULL %s",
                               !a.model ? "model" : "out");
    if ((rc = read_config(host, &c)) != DT_OK)
        return rc;
    /* a core before strategy ABI 1.4 has no in_flight: it keeps one
     * micro-batch's activations, and the stash must hold every input; nor
     * does it run chunks */
    if (!a.in_flight)
        c.keep = 0;
    if (c.V > 1 && !a.chunks)
        return host->set_error(host, DT_ERR_CONFIG, "virtual_stages = %u: the core runs one "
                               "chunk a stage (strategy ABI before 1.4)", c.V);
    if ((rc = check_chunks(host, &c, a.n_stages, a.n_micro)) != DT_OK)
        return rc;
    if (c.V > 1 && (uint64_t)a.n_stages * c.V > a.model->n_units)
        return host->set_error(host, DT_ERR_CONFIG,
                               "parallel.pipeline = %d stages x virtual_stages = %u chunks, but "
                               "model %s has %u units (each chunk needs at least one)",
                               a.n_stages, c.V, a.model->arch ? a.model->arch : "?",
                               a.model->n_units);
    for (int32_t k = 0; k < a.n_stages; k++) {
        const uint32_t most = pp_order_in_flight(host, c.schedule, c.V, k, a.n_stages, a.n_micro);
        if (most == 0)
            return host->set_error(host, DT_ERR_NOMEM, "assign_stages: the order of stage %d",
                                   k);
        if (a.stash) /* a receive buffer (or the stash) per chunk that receives */
            a.stash[k] = (c.V - (k == 0 ? 1 : 0)) * pp_stash(c.keep, most);
        if (a.buffers)
            a.buffers[k] = pp_buffers(c.V, k, a.n_stages, a.n_micro, pp_stash(c.keep, most));
        if (a.in_flight)
            a.in_flight[k] = c.keep ? most : 1;
    }
    if (a.chunks)
        *a.chunks = c.V;
    /* (a core before strategy ABI 1.6 gives no unit FLOPs: NULL) */
    return pp_assign(host, a.model, a.n_stages * (int32_t)c.V, c.balance, a.unit_flops, out);
}

static int pp_run_schedule(dt_strategy_t *s, const dt_schedule_args_v1_t *args,
                           dt_schedule_result_v1_t *out)
{
    return pp_run(s, args, out);
}

/* ---- what a data strategy does: not this one's ---- */

DT_NO_PARAMS_SLOTS(pp, "the pipeline strategy", s->host)

/* The planner's rows for pipelines are the core's (issue 14, step 4):
 * this strategy allocates only its boundary buffers. */
DT_NO_PARAMS_ESTIMATE(pp, "stages hold their units; boundary tensors by send/recv")

static const dt_strategy_ops_v1_t pp_ops = {
    .info = DT_PLUGIN_INFO(STRATEGY, dt_strategy_ops_v1_t, "pipeline", "0.1.0",
                           "pipeline parallel: units in stages, gpipe or 1f1b over send/recv",
                           pp_keys),
    .init = pp_init,
    .finalize = pp_finalize,
    .begin_step = pp_begin_step,
    .pre_forward = pp_pre_forward,
    .post_forward = pp_post_forward,
    .pre_backward = pp_pre_backward,
    .post_backward = pp_post_backward,
    .step = pp_step,
    .state_ranges = pp_state_ranges,
    .get_state = pp_get_state,
    .set_state = pp_set_state,
    .state_loaded = pp_state_loaded,
    .estimate = pp_estimate,
    .assign_stages = pp_assign_stages,
    .run_schedule = pp_run_schedule,
};

DT_PLUGIN_ENTRY(strategy, 1, dt_strategy_ops_v1_t, &pp_ops)
