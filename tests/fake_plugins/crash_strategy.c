/*
 * tests/fake_plugins/crash_strategy.c - a strategy that trains (the SDK's
 * replica machinery, as ddp) until its method `method` is called at step
 * `step` for unit `unit` (-1: any unit), micro-batch `micro` (-1: any) on
 * rank `rank` (-1: every rank), and there stores to address 0x10: a real
 * SIGSEGV inside a plugin, for the crash handler's test
 * (tests/integration/test_watch.sh).  The state methods the checkpoint
 * paths call (state_ranges, get_state, set_state) crash for `unit` at
 * `step`: the step a save follows, or 0 for the state's initialisation or
 * a checkpoint's load, before any step.  Not NULL itself: the sanitizer
 * build's UBSan would stop at a null store before the fault.
 *
 *   [parallel] data = "crashy"
 *   [crashy] method = "post_backward", step = 2, unit = 1
 */
#include <string.h>

#include "dtrain/dtrain.h"
#include "dtrain/sdk/cfg.h"
#include "dtrain/sdk/replica.h"

#ifndef FAKE_NAME
#define FAKE_NAME "crashy"
#endif

#define CRASHY_METHODS                                                                         \
    "begin_step|pre_forward|post_forward|pre_backward|post_backward|step|state_ranges|"       \
    "get_state|set_state"

static const dt_config_key_t crashy_keys[] = {
    {.name = "method", .type = DT_CFG_ENUM, .def = "\"post_backward\"",
     .choices = CRASHY_METHODS,
     .doc = "the method that crashes"},
    {.name = "step", .type = DT_CFG_INT, .def = "2", DT_CFG_RANGE(0, 1e9),
     .doc = "the step it crashes at (0: before the first, loading the state)"},
    {.name = "unit", .type = DT_CFG_INT, .def = "-1", DT_CFG_RANGE(-1, 1e6),
     .doc = "the unit it crashes for (hooks); -1 any"},
    {.name = "micro", .type = DT_CFG_INT, .def = "-1", DT_CFG_RANGE(-1, 1e6),
     .doc = "the micro-batch it crashes in (hooks); -1 any"},
    {.name = "rank", .type = DT_CFG_INT, .def = "-1", DT_CFG_RANGE(-1, 1e6),
     .doc = "the rank that crashes; -1 every rank"},
};

enum {
    M_BEGIN_STEP,
    M_PRE_FORWARD,
    M_POST_FORWARD,
    M_PRE_BACKWARD,
    M_POST_BACKWARD,
    M_STEP,
    M_STATE_RANGES,
    M_GET_STATE,
    M_SET_STATE
};

struct dt_strategy {
    dt_replica_t rep; /* first: the replica machinery */
    int method;
    int64_t step, unit, micro, rank;
    int64_t now;      /* the step begin_step announced */
    int *volatile nowhere; /* 0x10, read at run time: the compiler cannot
                            * turn the store into a trap of its own */
};

/* Crash when `method` is the one configured, at its step, unit and micro
 * (unit, micro < 0: the call has none, and matches any). */
static void maybe_crash(dt_strategy_t *s, int method, int64_t unit, int64_t micro)
{
    if (method != s->method || s->now != s->step ||
        (s->rank >= 0 && s->rep.dp.rank != s->rank))
        return;
    if ((unit >= 0 && s->unit >= 0 && unit != s->unit) ||
        (micro >= 0 && s->micro >= 0 && micro != s->micro))
        return;
    *s->nowhere = 1; /* SIGSEGV */
}

static void crashy_finalize(dt_strategy_t *s)
{
    if (!s)
        return;
    const dt_host_v1_t *host = s->rep.dp.host;
    dt_replica_free(&s->rep);
    host->free(host, s);
}

/* Defined below; every handle this plugin makes starts with it. */
static const dt_strategy_ops_v1_t crashy_ops;

static int crashy_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                       dt_strategy_t **out)
{
    *out = NULL;
    dt_strategy_t *s = host->alloc(host, sizeof *s, DT_TAG_OTHER);
    if (!s)
        return host->set_error(host, DT_ERR_NOMEM, "init: instance");
    memset(s, 0, sizeof *s);
    s->nowhere = (int *)(uintptr_t)0x10; /* unmapped: the first page never is */
    dt_replica_cfg_t cfg;
    int rc = dt_replica_read_config(host, &cfg);
    if (rc == DT_OK)
        rc = dt_cfg_enum(host, "method", CRASHY_METHODS, &s->method);
    if (rc == DT_OK)
        rc = dt_cfg_int(host, "step", &s->step);
    if (rc == DT_OK)
        rc = dt_cfg_int(host, "unit", &s->unit);
    if (rc == DT_OK)
        rc = dt_cfg_int(host, "micro", &s->micro);
    if (rc == DT_OK)
        rc = dt_cfg_int(host, "rank", &s->rank);
    if (rc == DT_OK)
        rc = dt_replica_init(&s->rep, &crashy_ops, host, args, &cfg, FAKE_NAME);
    if (rc != DT_OK) {
        crashy_finalize(s);
        return rc;
    }
    *out = s;
    return DT_OK;
}

static int crashy_begin_step(dt_strategy_t *s, int64_t step)
{
    s->now = step;
    maybe_crash(s, M_BEGIN_STEP, -1, -1);
    return dt_replica_begin_step(&s->rep, step, NULL);
}

static int crashy_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h,
                              dt_unit_buffers_v1_t *out)
{
    maybe_crash(s, M_PRE_FORWARD, h->unit, h->micro);
    return dt_replica_pre_forward(&s->rep, h, out);
}

static int crashy_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    maybe_crash(s, M_POST_FORWARD, h->unit, h->micro);
    return dt_replica_post_forward(&s->rep, h);
}

static int crashy_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h,
                               dt_unit_buffers_v1_t *out)
{
    maybe_crash(s, M_PRE_BACKWARD, h->unit, h->micro);
    return dt_replica_pre_backward(&s->rep, h, out);
}

static int crashy_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    maybe_crash(s, M_POST_BACKWARD, h->unit, h->micro);
    return dt_replica_post_backward(&s->rep, h);
}

static int crashy_step(dt_strategy_t *s, const dt_step_args_v1_t *args,
                       dt_step_result_v1_t *out)
{
    maybe_crash(s, M_STEP, -1, -1);
    return dt_replica_step(&s->rep, args, out);
}

static int crashy_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                               dt_range_t *out, uint32_t cap, uint32_t *n)
{
    maybe_crash(s, M_STATE_RANGES, unit, -1);
    return dt_replica_state_ranges(&s->rep, unit, kind, purpose, out, cap, n);
}

static int crashy_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                            float *buf)
{
    maybe_crash(s, M_GET_STATE, unit, -1);
    return dt_replica_get_state(&s->rep, unit, kind, r, buf);
}

static int crashy_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                            const float *buf)
{
    maybe_crash(s, M_SET_STATE, unit, -1);
    return dt_replica_set_state(&s->rep, unit, kind, r, buf);
}

static int crashy_state_loaded(dt_strategy_t *s) { return dt_replica_state_loaded(&s->rep); }

static int crashy_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,
                           dt_estimate_v1_t *res)
{
    dt_estimate_args_v1_t args;
    dt_model_desc_v1_t model = {.struct_size = sizeof(dt_model_desc_v1_t)};
    dt_replica_cfg_t cfg;
    dt_estimate_v1_t est;
    dt_estimate_begin(&est);
    int rc = dt_dp_estimate_read(host, in, &args, &model);
    if (rc == DT_OK)
        rc = dt_replica_read_config(host, &cfg);
    if (rc == DT_OK)
        rc = dt_replica_estimate(host, &args, &cfg, &est, NULL);
    if (rc != DT_OK)
        return rc;
    return dt_result_write(host, "estimate", res, &est, sizeof est, DT_ESTIMATE_V1_SIZE0);
}

static const dt_strategy_ops_v1_t crashy_ops = {
    .info = DT_PLUGIN_INFO(STRATEGY, dt_strategy_ops_v1_t, FAKE_NAME, "0.1.0",
                           "test double: ddp's replica that crashes in a chosen method",
                           crashy_keys),
    .init = crashy_init,
    .finalize = crashy_finalize,
    .begin_step = crashy_begin_step,
    .pre_forward = crashy_pre_forward,
    .post_forward = crashy_post_forward,
    .pre_backward = crashy_pre_backward,
    .post_backward = crashy_post_backward,
    .step = crashy_step,
    .state_ranges = crashy_state_ranges,
    .get_state = crashy_get_state,
    .set_state = crashy_set_state,
    .state_loaded = crashy_state_loaded,
    .estimate = crashy_estimate,
};

DT_PLUGIN_ENTRY(strategy, 1, dt_strategy_ops_v1_t, &crashy_ops)
