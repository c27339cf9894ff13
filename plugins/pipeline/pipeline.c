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
    {.name = "balance",
     .type = DT_CFG_ENUM,
     .def = "\"uniform\"",
     .choices = PP_BALANCES,
     .doc = "units per stage: uniform (equal counts) or params (contiguous stages with the "
            "smallest largest parameter count)"},
};

static int read_config(const dt_host_v1_t *host, int *schedule, int *keep, int *balance)
{
    int rc = dt_cfg_enum(host, "schedule", "1f1b", PP_SCHEDULES, schedule);
    if (rc == DT_OK)
        rc = dt_cfg_bool(host, "keep_activations", 1, keep);
    return rc == DT_OK ? dt_cfg_enum(host, "balance", "uniform", PP_BALANCES, balance) : rc;
}

static void pp_finalize(dt_strategy_t *s)
{
    if (!s)
        return;
    pp_free_buffers(s);
    s->host->free(s->host, s);
}

static int pp_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *in,
                   dt_strategy_t **out)
{
    *out = NULL;
    dt_strategy_init_v1_t a;
    int balance, rc = dt_args_read(host, "init args", &a, sizeof a, in, DT_STRATEGY_INIT_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a.dev_ops || !a.dev || !a.comm_ops || !a.comm)
        return host->set_error(host, DT_ERR_INVALID, "init: NULL %s",
                               !a.dev_ops ? "dev_ops" : !a.dev ? "dev"
                               : !a.comm_ops ? "comm_ops" : "comm");
    if (a.unit_flags || a.norm_comm || a.tied_comm)
        return host->set_error(host, DT_ERR_INVALID,
                               "init: the pipeline strategy holds no units (unit_flags, "
                               "norm_comm and tied_comm are the data strategy's)");
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
    if ((rc = read_config(host, &s->schedule, &s->keep, &balance)) == DT_OK &&
        (rc = a.comm_ops->rank_size(a.comm, &s->stage, &s->n_stages)) == DT_OK &&
        s->n_stages < 2)
        rc = host->set_error(host, DT_ERR_INVALID, "init: a pipeline group of %d rank(s)",
                             s->n_stages);
    if (rc != DT_OK) {
        pp_finalize(s);
        return rc;
    }
    host->log(host, DT_LOG_DEBUG, "stage %d of %d, schedule %s, keeps the activations of %u "
              "micro-batch(es)", s->stage, s->n_stages,
              s->schedule == PP_SCHED_GPIPE ? "gpipe" : "1f1b",
              pp_in_flight(s->schedule, s->keep, s->stage, s->n_stages, s->n_micro));
    *out = s;
    return DT_OK;
}

static int pp_assign_stages(const dt_host_v1_t *host, const dt_stage_args_v1_t *in,
                            uint32_t *out)
{
    dt_stage_args_v1_t a;
    int schedule, keep, balance;
    int rc = dt_args_read(host, "assign_stages args", &a, sizeof a, in, DT_STAGE_ARGS_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a.model || !out)
        return host->set_error(host, DT_ERR_INVALID, "assign_stages: NULL %s",
                               !a.model ? "model" : "out");
    if ((rc = read_config(host, &schedule, &keep, &balance)) != DT_OK)
        return rc;
    /* a core before strategy ABI 1.4 has no in_flight: it keeps one
     * micro-batch's activations, and the stash must hold every input */
    if (!a.in_flight)
        keep = 0;
    for (int32_t k = 0; k < a.n_stages; k++) {
        if (a.stash)
            a.stash[k] = pp_stash(schedule, keep, k, a.n_stages, a.n_micro);
        if (a.in_flight)
            a.in_flight[k] = pp_in_flight(schedule, keep, k, a.n_stages, a.n_micro);
    }
    return pp_assign(host, a.model, a.n_stages, balance, out);
}

static int pp_run_schedule(dt_strategy_t *s, const dt_schedule_args_v1_t *args,
                           dt_schedule_result_v1_t *out)
{
    return pp_run(s, args, out);
}

/* ---- what a data strategy does: not this one's ---- */

static int holds_none(dt_strategy_t *s, const char *what)
{
    return s->host->set_error(s->host, DT_ERR_INVALID,
                              "%s: the pipeline strategy holds no parameters (the stage's data "
                              "strategy does)", what);
}

static int pp_begin_step(dt_strategy_t *s, int64_t step)
{
    (void)s;
    (void)step;
    return DT_OK;
}

static int pp_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *o)
{
    (void)h;
    (void)o;
    return holds_none(s, "pre_forward");
}

static int pp_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    (void)h;
    return holds_none(s, "post_forward");
}

static int pp_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *o)
{
    (void)h;
    (void)o;
    return holds_none(s, "pre_backward");
}

static int pp_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    (void)h;
    return holds_none(s, "post_backward");
}

static int pp_step(dt_strategy_t *s, const dt_step_args_v1_t *a, dt_step_result_v1_t *o)
{
    (void)a;
    (void)o;
    return holds_none(s, "step");
}

static int pp_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                           dt_range_t *out, uint32_t cap, uint32_t *n)
{
    (void)s;
    (void)unit;
    (void)kind;
    (void)purpose;
    (void)out;
    (void)cap;
    *n = 0; /* nothing held, nothing saved */
    return DT_OK;
}

static int pp_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, float *buf)
{
    (void)unit;
    (void)kind;
    (void)r;
    (void)buf;
    return holds_none(s, "get_state");
}

static int pp_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                        const float *buf)
{
    (void)unit;
    (void)kind;
    (void)r;
    (void)buf;
    return holds_none(s, "set_state");
}

static int pp_state_loaded(dt_strategy_t *s)
{
    (void)s;
    return DT_OK;
}

/* The planner's rows for pipelines are the core's (issue 14, step 4):
 * this strategy allocates only its boundary buffers. */
static int pp_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,
                       dt_estimate_v1_t *res)
{
    dt_estimate_args_v1_t a;
    int rc = dt_args_read(host, "estimate args", &a, sizeof a, in, DT_ESTIMATE_ARGS_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    dt_estimate_v1_t e;
    memset(&e, 0, sizeof e);
    e.struct_size = sizeof e;
    e.n_tags = DT_TAG_COUNT;
    snprintf(e.note, sizeof e.note, "stages hold their units; boundary tensors by send/recv");
    return dt_result_write(host, "estimate", res, &e, sizeof e, DT_ESTIMATE_V1_SIZE0);
}

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
