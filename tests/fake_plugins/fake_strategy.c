/*
 * tests/fake_plugins/fake_strategy.c - a third party's strategy as the
 * planner sees it: a valid strategy plugin without the optional
 * plan_presets slot, whose estimate is arithmetic on its arguments and
 * whose other methods refuse to run.  `dtrain plan` must give it one row
 * with its defaults (tests/integration/test_plan.sh).
 *
 * Built with -DFAKE_PLAN_PRESETS it lists plan presets, as a third party's
 * strategy with several configurations would: two that set its `note`
 * (each row must show its own note) and one malformed ("note", no value),
 * whose row must say why it was not planned.
 *
 * Its estimate per rank: parameters and gradients replicated (numel x
 * param_bytes, numel x grad_bytes), optimizer state divided by the group
 * size rounded up (numel x optim_bytes / group_size), activations as
 * given, one all-reduce of the gradients sent (numel x grad_bytes); the
 * note is the table's `note` key.
 */
#include <stdio.h>

#include "dtrain/dtrain.h"

#ifndef FAKE_NAME
#define FAKE_NAME "fakestrat"
#endif

static const dt_config_key_t fake_keys[] = {
    {.name = "note", .type = DT_CFG_STRING, .def = "\"hand-written estimate\"",
     .doc = "the text of the estimate's note"},
};

static int refuse(const dt_host_v1_t *host, const char *what)
{
    return host->set_error(host, DT_ERR_UNSUPPORTED, "%s: this test double only plans",
                           what);
}

struct dt_strategy {
    const dt_strategy_ops_v1_t *ops; /* first: the table that made it (dtrain/strategy.h) */
    const dt_host_v1_t *host;
};

static int fake_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                     dt_strategy_t **out)
{
    (void)args;
    *out = NULL;
    return refuse(host, "init");
}

static void fake_finalize(dt_strategy_t *s) { (void)s; }

static int fake_begin_step(dt_strategy_t *s, int64_t step)
{
    (void)step;
    return refuse(s->host, "begin_step");
}

static int fake_hook_buffers(dt_strategy_t *s, const dt_hook_v1_t *h,
                             dt_unit_buffers_v1_t *out)
{
    (void)h;
    (void)out;
    return refuse(s->host, "hook");
}

static int fake_hook(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    (void)h;
    return refuse(s->host, "hook");
}

static int fake_step(dt_strategy_t *s, const dt_step_args_v1_t *a, dt_step_result_v1_t *out)
{
    (void)a;
    (void)out;
    return refuse(s->host, "step");
}

static int fake_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                             dt_range_t *out, uint32_t cap, uint32_t *n)
{
    (void)unit, (void)kind, (void)purpose, (void)out, (void)cap, (void)n;
    return refuse(s->host, "state_ranges");
}

static int fake_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                          float *buf)
{
    (void)unit, (void)kind, (void)r, (void)buf;
    return refuse(s->host, "get_state");
}

static int fake_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                          const float *buf)
{
    (void)unit, (void)kind, (void)r, (void)buf;
    return refuse(s->host, "set_state");
}

static int fake_state_loaded(dt_strategy_t *s) { return refuse(s->host, "state_loaded"); }

static int fake_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,
                         dt_estimate_v1_t *out)
{
    dt_estimate_args_v1_t a;
    int rc = dt_args_read(host, "estimate args", &a, sizeof a, in, DT_ESTIMATE_ARGS_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a.model || a.group_size < 1)
        return host->set_error(host, DT_ERR_INVALID, "estimate: no model or group");
    const char *note = "";
    if ((rc = host->cfg_string(host, "note", &note)) != DT_OK)
        return rc;
    uint64_t n = a.model->numel, g = (uint64_t)a.group_size;
    dt_estimate_v1_t e = {.struct_size = sizeof e, .n_tags = DT_TAG_COUNT};
    e.bytes[DT_TAG_PARAMS] = n * a.param_bytes;
    e.bytes[DT_TAG_GRADS] = n * a.grad_bytes;
    e.bytes[DT_TAG_OPTIMIZER] = (n * a.optim_bytes + g - 1) / g;
    e.bytes[DT_TAG_ACTIVATIONS] = a.act_bytes;
    e.comm_bytes_per_step = n * a.grad_bytes;
    snprintf(e.note, sizeof e.note, "%s", note);
    return dt_result_write(host, "estimate", out, &e, sizeof e, DT_ESTIMATE_V1_SIZE0);
}

#ifdef FAKE_PLAN_PRESETS
static const dt_plan_preset_v1_t fake_presets[] = {
    {.label = FAKE_NAME " first", .set = "note=first-preset"},
    {.label = FAKE_NAME " second", .set = "note=second-preset"},
    {.label = FAKE_NAME " broken", .set = "note"},
};

static int fake_plan_presets(const dt_plan_preset_v1_t **out, uint32_t *n)
{
    *out = fake_presets;
    *n = (uint32_t)(sizeof fake_presets / sizeof fake_presets[0]);
    return DT_OK;
}
#endif

static const dt_strategy_ops_v1_t fake_ops = {
    .info = DT_PLUGIN_INFO(STRATEGY, dt_strategy_ops_v1_t, FAKE_NAME, "0.1.0",
                           "planner test double: a strategy with its estimate only",
                           fake_keys),
    .init = fake_init,
    .finalize = fake_finalize,
    .begin_step = fake_begin_step,
    .pre_forward = fake_hook_buffers,
    .post_forward = fake_hook,
    .pre_backward = fake_hook_buffers,
    .post_backward = fake_hook,
    .step = fake_step,
    .state_ranges = fake_state_ranges,
    .get_state = fake_get_state,
    .set_state = fake_set_state,
    .state_loaded = fake_state_loaded,
    .estimate = fake_estimate,
#ifdef FAKE_PLAN_PRESETS
    .plan_presets = fake_plan_presets,
#endif
};

DT_PLUGIN_ENTRY(strategy, 1, dt_strategy_ops_v1_t, &fake_ops)
