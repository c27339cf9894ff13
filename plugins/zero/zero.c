/*
 * plugins/zero/zero.c - the `zero` strategy: ZeRO (Rajbhandari et al.,
 * "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models")
 * stages 1-3, configured as DeepSpeed users know them.  The algorithm is
 * the SDK's sharded engine (sdk/lib/dt_shard_*.c, shared with fsdp); this
 * file turns the [zero] table into its configuration.
 *
 *   stage 1  optimizer state and the f32 master sharded.  Full f32
 *            gradients accumulate over micro-steps; in the final one each
 *            bucket (units grouped in backward order up to
 *            reduce_bucket_size elements) is reduce-scattered as backward
 *            completes it (overlap_comm; else all in step).  Each rank
 *            updates its shard, then all-gathers the parameters in place,
 *            allgather_bucket_size elements at a time.
 *   stage 2  + gradients sharded: a bucket accumulates into a transient
 *            full-size buffer only while it is in backward, and is
 *            reduce-scattered into the persistent gradient shard every
 *            micro-step as soon as backward completes it (at most
 *            reduce_bucket_size elements in flight, one buffer per bucket).
 *   stage 3  + parameters sharded: every unit is all-gathered before its
 *            forward and its backward and freed after (units smaller than
 *            param_persistence_threshold stay gathered, refreshed once per
 *            step); the next units, up to prefetch_bucket_size elements,
 *            are gathered ahead; a unit's gradient is reduce-scattered when
 *            backward completes it, at most reduce_bucket_size elements in
 *            flight.  This is FSDP's FULL_SHARD with other knobs.
 * A stage is never lowered silently: anything but 1, 2 or 3 is an error.
 */
#include <stdio.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "dtrain/sdk_helpers.h"

struct dt_strategy {
    dt_shard_t *e;
    const dt_host_v1_t *host;
};

static const dt_config_key_t zero_keys[] = {
    {.name = "stage", .type = DT_CFG_INT, .def = NULL, .min = 1, .max = 3,
     .doc = "1: optimizer state sharded; 2: + gradients; 3: + parameters"},
    {.name = "reduce_bucket_size", .type = DT_CFG_INT, .def = "500000000", .min = 1,
     .max = 1e15,
     .doc = "gradient elements per reduction bucket (stages 1-2) and in flight at once"},
    {.name = "allgather_bucket_size", .type = DT_CFG_INT, .def = "500000000", .min = 1,
     .max = 1e15, .doc = "stages 1-2: parameter elements all-gathered at a time after a step"},
    {.name = "overlap_comm", .type = DT_CFG_BOOL, .def = "true", .min = 1, .max = 0,
     .doc = "reduce gradients during backward (false: stage 1 in step; stages 2-3 "
            "blocking)"},
    {.name = "prefetch_bucket_size", .type = DT_CFG_INT, .def = "50000000", .min = 0,
     .max = 1e15, .doc = "stage 3: parameter elements gathered ahead of use (0: no prefetch)"},
    {.name = "param_persistence_threshold", .type = DT_CFG_INT, .def = "100000", .min = 0,
     .max = 1e15, .doc = "stage 3: units with fewer elements stay gathered"},
};

typedef struct zero_conf {
    int64_t stage;
    int64_t reduce_bucket, allgather_bucket, prefetch_bucket, persistence;
    int overlap;
} zero_conf_t;

/* An integer key >= `min`; a host that did not declare it gives `def`. */
static int read_int(const dt_host_v1_t *host, const char *key, int64_t def, int64_t min,
                    int64_t *out)
{
    int64_t v = def;
    int rc = host->cfg_int(host, key, &v);
    if (rc != DT_OK && rc != DT_ERR_NOT_FOUND)
        return host->set_error(host, DT_ERR_CONFIG, "%s: cannot read (%s)", key,
                               dt_status_name(rc));
    if (v < min)
        return host->set_error(host, DT_ERR_CONFIG, "%s = %lld: must be >= %lld", key,
                               (long long)v, (long long)min);
    *out = v;
    return DT_OK;
}

static int zero_read_config(const dt_host_v1_t *host, zero_conf_t *c)
{
    int rc = host->cfg_int(host, "stage", &c->stage);
    if (rc == DT_ERR_NOT_FOUND)
        return host->set_error(host, DT_ERR_CONFIG,
                               "stage is not set: choose 1 (optimizer state sharded), 2 (+ "
                               "gradients) or 3 (+ parameters)");
    if (rc != DT_OK)
        return host->set_error(host, DT_ERR_CONFIG, "stage: cannot read (%s)",
                               dt_status_name(rc));
    if (c->stage < 1 || c->stage > 3)
        return host->set_error(host, DT_ERR_CONFIG,
                               "stage = %lld is not a ZeRO stage: valid stages are 1 (optimizer "
                               "state sharded), 2 (+ gradients), 3 (+ parameters)",
                               (long long)c->stage);
    if ((rc = read_int(host, "reduce_bucket_size", 500000000, 1, &c->reduce_bucket)) ||
        (rc = read_int(host, "allgather_bucket_size", 500000000, 1, &c->allgather_bucket)) ||
        (rc = read_int(host, "prefetch_bucket_size", 50000000, 0, &c->prefetch_bucket)) ||
        (rc = read_int(host, "param_persistence_threshold", 100000, 0, &c->persistence)))
        return rc;
    c->overlap = 1;
    rc = host->cfg_bool(host, "overlap_comm", &c->overlap);
    if (rc != DT_OK && rc != DT_ERR_NOT_FOUND)
        return host->set_error(host, DT_ERR_CONFIG, "overlap_comm: cannot read (%s)",
                               dt_status_name(rc));
    c->overlap = c->overlap ? 1 : 0;
    return DT_OK;
}

static const char *stage_names[] = {"", "zero stage 1", "zero stage 2", "zero stage 3"};

/* The engine's configuration for `c` over `model`.  Stages 1-2 group
 * units into buckets (`spans`, n_units entries, the caller's). */
static void zero_make_cfg(const zero_conf_t *c, const dt_model_desc_v1_t *model,
                          dt_bucket_span_t *spans, uint64_t *numel, dt_shard_cfg_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->what = stage_names[c->stage];
    cfg->overlap = c->overlap;
    cfg->params_replicated = c->stage < 3;
    cfg->grads_full = c->stage == 1;
    cfg->reshard_after_forward = 1;
    cfg->max_reduce_numel = (uint64_t)c->reduce_bucket;
    if (c->stage < 3) {
        for (uint32_t u = 0; u < model->n_units; u++)
            numel[u] = model->units[u].numel;
        cfg->spans = spans;
        cfg->n_spans = dt_bucket_plan(numel, model->n_units, (uint64_t)c->reduce_bucket, spans,
                                      NULL);
        cfg->gather_numel = (uint64_t)c->allgather_bucket;
    } else {
        uint32_t ahead = c->prefetch_bucket > 0 ? UINT32_MAX : 0;
        cfg->prefetch_fwd = ahead;
        cfg->prefetch_bwd = ahead;
        cfg->prefetch_numel = (uint64_t)c->prefetch_bucket;
        cfg->persist_numel = (uint64_t)c->persistence;
    }
}

/* zero_make_cfg with its tables from host memory; free with plan_free. */
static int zero_plan(const dt_host_v1_t *host, const dt_model_desc_v1_t *model,
                     dt_shard_cfg_t *cfg, dt_bucket_span_t **spans, uint64_t **numel)
{
    zero_conf_t c;
    int rc = zero_read_config(host, &c);
    if (rc != DT_OK)
        return rc;
    uint64_t nu1 = (uint64_t)model->n_units + 1;
    *spans = host->alloc(host, nu1 * sizeof **spans, DT_TAG_OTHER);
    *numel = host->alloc(host, nu1 * sizeof **numel, DT_TAG_OTHER);
    if (!*spans || !*numel)
        return host->set_error(host, DT_ERR_NOMEM, "bucket plan for %u units", model->n_units);
    zero_make_cfg(&c, model, *spans, *numel, cfg);
    return DT_OK;
}

static void plan_free(const dt_host_v1_t *host, dt_bucket_span_t *spans, uint64_t *numel)
{
    host->free(host, spans);
    host->free(host, numel);
}

static int zero_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                     dt_strategy_t **out)
{
    *out = NULL;
    if (!args || !args->model)
        return host->set_error(host, DT_ERR_INVALID, "init: NULL %s", args ? "model" : "args");
    dt_shard_cfg_t cfg;
    dt_bucket_span_t *spans = NULL;
    uint64_t *numel = NULL;
    int rc = zero_plan(host, args->model, &cfg, &spans, &numel);
    dt_strategy_t *s = NULL;
    if (rc == DT_OK && !(s = host->alloc(host, sizeof *s, DT_TAG_OTHER)))
        rc = host->set_error(host, DT_ERR_NOMEM, "init: instance");
    if (rc == DT_OK) {
        s->host = host;
        rc = dt_shard_create(host, args, &cfg, &s->e);
    }
    plan_free(host, spans, numel);
    if (rc != DT_OK) {
        host->free(host, s);
        return rc;
    }
    *out = s;
    return DT_OK;
}

static void zero_finalize(dt_strategy_t *s)
{
    if (!s)
        return;
    dt_shard_destroy(s->e);
    s->host->free(s->host, s);
}

static int zero_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *args,
                         dt_estimate_v1_t *out)
{
    memset(out, 0, sizeof *out);
    if (!args || args->struct_size < sizeof(dt_estimate_args_v1_t) || !args->model)
        return host->set_error(host, DT_ERR_INVALID, "estimate: bad args (struct_size %u)",
                               args ? args->struct_size : 0);
    dt_shard_cfg_t cfg;
    dt_bucket_span_t *spans = NULL;
    uint64_t *numel = NULL;
    int rc = zero_plan(host, args->model, &cfg, &spans, &numel);
    if (rc == DT_OK)
        rc = dt_shard_estimate(host, args, &cfg, out);
    plan_free(host, spans, numel);
    return rc;
}

/* ---- the ops table: the engine's functions ---- */

static int zero_begin_step(dt_strategy_t *s, int64_t step)
{
    return dt_shard_begin_step(s->e, step);
}
static int zero_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *o)
{
    return dt_shard_pre_forward(s->e, h, o);
}
static int zero_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    return dt_shard_post_forward(s->e, h);
}
static int zero_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *o)
{
    return dt_shard_pre_backward(s->e, h, o);
}
static int zero_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    return dt_shard_post_backward(s->e, h);
}
static int zero_step(dt_strategy_t *s, const dt_step_args_v1_t *a, dt_step_result_v1_t *o)
{
    return dt_shard_step(s->e, a, o);
}
static int zero_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                             dt_range_t *out, uint32_t cap, uint32_t *n)
{
    return dt_shard_state_ranges(s->e, unit, kind, purpose, out, cap, n);
}
static int zero_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, float *buf)
{
    return dt_shard_get_state(s->e, unit, kind, r, buf);
}
static int zero_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                          const float *buf)
{
    return dt_shard_set_state(s->e, unit, kind, r, buf);
}
static int zero_state_loaded(dt_strategy_t *s)
{
    return dt_shard_state_loaded(s->e);
}

static const dt_strategy_ops_v1_t zero_ops = {
    .info = DT_PLUGIN_INFO(STRATEGY, dt_strategy_ops_v1_t, "zero", "0.1.0",
                           "ZeRO stages 1-3: optimizer state, gradients, parameters sharded",
                           zero_keys),
    .init = zero_init,
    .finalize = zero_finalize,
    .begin_step = zero_begin_step,
    .pre_forward = zero_pre_forward,
    .post_forward = zero_post_forward,
    .pre_backward = zero_pre_backward,
    .post_backward = zero_post_backward,
    .step = zero_step,
    .state_ranges = zero_state_ranges,
    .get_state = zero_get_state,
    .set_state = zero_set_state,
    .state_loaded = zero_state_loaded,
    .estimate = zero_estimate,
};

DT_PLUGIN_ENTRY(strategy, 1, dt_strategy_ops_v1_t, &zero_ops)
