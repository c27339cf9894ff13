/*
 * plugins/zero/zero.c - the `zero` strategy: ZeRO (Rajbhandari et al.,
 * "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models")
 * stages 1-3, configured as DeepSpeed users know them.  The algorithm is
 * the sharded engine in plugins/shard (shared with fsdp: the parameter
 * all-gather in shard_gather.c, the gradient reduce-scatter in
 * shard_reduce.c, the optimizer step on each rank's shard in
 * shard_step.c, the shard itself in device buffers, shard_home.c, or with
 * offload_what in an offload tier, shard_offload.c); this file turns the
 * [zero] table into its configuration, and its ops are the engine's,
 * through the wrappers of shard.h.
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
#include <stddef.h>

#include "dtrain/dtrain.h"
#include "dtrain/sdk/cfg.h"
#include "shard.h"

static const dt_config_key_t zero_keys[] = {
    {.name = "stage",
     .type = DT_CFG_INT,
     .def = NULL,
     .min = 1,
     .max = 3,
     .doc = "1: optimizer state sharded; 2: + gradients; 3: + parameters"},
    {.name = "reduce_bucket_size",
     .type = DT_CFG_INT,
     .def = "500000000",
     .min = 1,
     .max = 1e15,
     .doc = "gradient elements per reduction bucket (stages 1-2) and in flight at once"},
    {.name = "allgather_bucket_size",
     .type = DT_CFG_INT,
     .def = "500000000",
     .min = 1,
     .max = 1e15,
     .doc = "stages 1-2: parameter elements all-gathered at a time after a step"},
    {.name = "overlap_comm",
     .type = DT_CFG_BOOL,
     .def = "true",
     .doc = "reduce gradients during backward (false: stage 1 in step; stages 2-3 "
            "blocking)"},
    {.name = "prefetch_bucket_size",
     .type = DT_CFG_INT,
     .def = "50000000",
     .min = 0,
     .max = 1e15,
     .doc = "stage 3: parameter elements gathered ahead of use (0: no prefetch)"},
    {.name = "param_persistence_threshold",
     .type = DT_CFG_INT,
     .def = "100000",
     .min = 0,
     .max = 1e15,
     .doc = "stage 3: units with fewer elements stay gathered"},
    DT_CFG_KEY_REDUCE_DTYPE,
    DT_OFFLOAD_KEY_WHAT,
};

typedef struct zero_conf {
    int64_t stage;
    int64_t reduce_bucket, allgather_bucket, prefetch_bucket, persistence;
    int overlap;
} zero_conf_t;

static int zero_read_config(const dt_host_v1_t *host, zero_conf_t *c)
{
    int rc;
    /* stage is required and in 1..3 (the core checks the declared keys) */
    if ((rc = dt_cfg_int(host, "stage", &c->stage)) ||
        (rc = dt_cfg_int(host, "reduce_bucket_size", &c->reduce_bucket)) ||
        (rc = dt_cfg_int(host, "allgather_bucket_size", &c->allgather_bucket)) ||
        (rc = dt_cfg_int(host, "prefetch_bucket_size", &c->prefetch_bucket)) ||
        (rc = dt_cfg_int(host, "param_persistence_threshold", &c->persistence)))
        return rc;
    return dt_cfg_bool(host, "overlap_comm", &c->overlap);
}

static const char *stage_names[] = {"", "zero stage 1", "zero stage 2", "zero stage 3"};

/* The engine's configuration for the [zero] table over `model`.  Stages
 * 1-2 group units into buckets (`spans`). */
static int zero_configure(const dt_host_v1_t *host, const dt_model_desc_v1_t *model,
                          int32_t world, const uint64_t *unit_numel, dt_bucket_span_t *spans,
                          dt_shard_cfg_t *cfg)
{
    zero_conf_t c;
    int rc = zero_read_config(host, &c);
    if (rc != DT_OK)
        return rc;
    cfg->what = stage_names[c.stage];
    cfg->overlap = c.overlap;
    cfg->params_replicated = c.stage < 3;
    cfg->grads_full = c.stage == 1;
    cfg->reshard_after_forward = 1;
    cfg->max_reduce_numel = (uint64_t)c.reduce_bucket;
    if ((rc = dt_cfg_reduce_dtype(host, &cfg->reduce_dtype)) != DT_OK)
        return rc;
    cfg->params_offload_ok = c.stage == 3;
    if (c.stage < 3) {
        cfg->spans = spans;
        cfg->n_spans = dt_bucket_plan(unit_numel, model->n_units, (uint64_t)c.reduce_bucket,
                                      spans, NULL);
        cfg->gather_numel = (uint64_t)c.allgather_bucket;
    } else {
        uint32_t ahead = c.prefetch_bucket > 0 ? UINT32_MAX : 0;
        cfg->prefetch_fwd = ahead;
        cfg->prefetch_bwd = ahead;
        cfg->prefetch_numel = (uint64_t)c.prefetch_bucket;
        cfg->persist_numel = (uint64_t)c.persistence;
    }
    return DT_OK;
}

/* A zero instance: the engine, first (DT_SHARD_STRATEGY_OPS's slots
 * cast the instance to it). */
struct dt_strategy {
    dt_shard_engine_t engine;
};
_Static_assert(offsetof(struct dt_strategy, engine) == 0, "the engine comes first");

/* Defined below; every handle this plugin makes starts with it. */
static const dt_strategy_ops_v1_t zero_ops;

static int zero_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                     dt_strategy_t **out)
{
    return dt_shard_strategy_init(host, args, &zero_ops, zero_configure, sizeof(dt_strategy_t),
                                  out);
}

static int zero_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *args,
                         dt_estimate_v1_t *out)
{
    return dt_shard_strategy_estimate(host, args, zero_configure, out);
}

/* `dtrain plan` shows every stage. */
static const dt_plan_preset_v1_t zero_presets[] = {
    {.label = "zero-1", .set = "stage=1"},
    {.label = "zero-2", .set = "stage=2"},
    {.label = "zero-3", .set = "stage=3"},
};

static int zero_plan_presets(const dt_plan_preset_v1_t **out, uint32_t *n)
{
    if (!out || !n)
        return DT_ERR_INVALID;
    *out = zero_presets;
    *n = (uint32_t)DT_ARRAY_LEN(zero_presets);
    return DT_OK;
}

static const dt_strategy_ops_v1_t zero_ops = {
    .info = DT_PLUGIN_INFO(STRATEGY, dt_strategy_ops_v1_t, "zero", "1.0.0",
                           "ZeRO stages 1-3: optimizer state, gradients, parameters sharded",
                           zero_keys),
    .init = zero_init,
    .estimate = zero_estimate,
    .plan_presets = zero_plan_presets,
    DT_SHARD_STRATEGY_OPS,
};

DT_PLUGIN_ENTRY(strategy, 1, dt_strategy_ops_v1_t, &zero_ops)
