/*
 * plugins/fsdp/fsdp.c - the `fsdp` strategy: PyTorch FSDP's sharding
 * strategies, configured as its users know them.  The algorithm is the
 * sharded engine in plugins/shard (shared with zero: a flat parameter's
 * all-gather in shard_gather.c, its gradient's reduce-scatter in
 * shard_reduce.c); FULL_SHARD is ZeRO stage 3 with other knobs.  This file
 * turns the [fsdp] table into the engine's configuration, and its ops are
 * the engine's, through the wrappers of shard.h.
 *
 *   FULL_SHARD     parameters, gradients and optimizer state sharded over
 *                  the data-parallel group; a flat parameter is all-gathered
 *                  before its forward and backward, freed after forward
 *                  (reshard_after_forward) and after backward; its gradient
 *                  is reduce-scattered as soon as backward completes it
 *   SHARD_GRAD_OP  the same, but parameters stay gathered from forward
 *                  until their gradient is reduced (ZeRO-2-like memory
 *                  during the pass, no second gather in backward)
 *   NO_SHARD       every rank holds everything; gradients all-reduced
 *                  (DDP through the same engine: shard groups of one)
 *   HYBRID_SHARD   FULL_SHARD inside groups of hybrid_group_size ranks
 *                  (comm split), replicated across the groups: each shard's
 *                  gradient is also all-reduced across its replicas
 *
 * Wrap policy: every unit (the embedding, each transformer block, the
 * head) is a flat parameter by default; min_num_params merges consecutive
 * small units until a group holds that many elements.  Prefetching:
 * forward_prefetch gathers the next flat parameter during forward,
 * backward_prefetch the previous one in backward (before the current
 * one's gradient is computed, BACKWARD_PRE, or after, BACKWARD_POST);
 * limit_all_gathers caps the gathers in flight.  At most two
 * reduce-scatters are in flight (each holds its group's unsharded
 * gradient until it completes).
 */
#include <stddef.h>

#include "dtrain/dtrain.h"
#include "dtrain/sdk/cfg.h"
#include "shard.h"

#define FSDP_STRATEGIES "FULL_SHARD|SHARD_GRAD_OP|NO_SHARD|HYBRID_SHARD"
#define FSDP_PREFETCHES "BACKWARD_PRE|BACKWARD_POST|NONE"
#define FSDP_MAX_REDUCES 2u

static const dt_config_key_t fsdp_keys[] = {
    {.name = "sharding_strategy",
     .type = DT_CFG_ENUM,
     .def = "\"FULL_SHARD\"",
     .choices = FSDP_STRATEGIES,
     .doc = "what is sharded: everything, gradients+optimizer, nothing, or full sharding "
            "inside groups replicated across them"},
    {.name = "hybrid_group_size",
     .type = DT_CFG_INT,
     .def = "0",
     .min = 0,
     .max = 1e9,
     .doc = "HYBRID_SHARD: ranks per shard group; must divide the data-parallel world"},
    {.name = "min_num_params",
     .type = DT_CFG_INT,
     .def = "0",
     .min = 0,
     .max = 1e15,
     .doc = "wrap policy: merge consecutive units smaller than this into one flat parameter "
            "(0: one per unit)"},
    {.name = "forward_prefetch",
     .type = DT_CFG_BOOL,
     .def = "false",
     .doc = "gather the next flat parameter during forward"},
    {.name = "backward_prefetch",
     .type = DT_CFG_ENUM,
     .def = "\"BACKWARD_PRE\"",
     .choices = FSDP_PREFETCHES,
     .doc = "gather the previous flat parameter in backward before / after the current "
            "one's gradient, or not"},
    {.name = "limit_all_gathers",
     .type = DT_CFG_INT,
     .def = "2",
     .min = 0,
     .max = 1e9,
     .doc = "all-gathers in flight at once (0: no limit)"},
    {.name = "reshard_after_forward",
     .type = DT_CFG_BOOL,
     .def = "true",
     .doc = "FULL_SHARD / HYBRID_SHARD: free gathered parameters after forward"},
    DT_CFG_KEY_REDUCE_DTYPE,
    DT_OFFLOAD_KEY_WHAT,
};

enum { FULL_SHARD = 0, SHARD_GRAD_OP = 1, NO_SHARD = 2, HYBRID_SHARD = 3 };
enum { PREFETCH_PRE = 0, PREFETCH_POST = 1, PREFETCH_NONE = 2 };

typedef struct fsdp_conf {
    int strategy, prefetch_bwd;
    int forward_prefetch, reshard;
    int64_t hybrid, min_params, limit;
} fsdp_conf_t;

/* The [fsdp] table, checked against a data-parallel group of `world`
 * ranks (0: not known). */
static int fsdp_read_config(const dt_host_v1_t *host, int32_t world, fsdp_conf_t *c)
{
    int rc;
    if ((rc = dt_cfg_enum(host, "sharding_strategy", FSDP_STRATEGIES,
                          &c->strategy)) ||
        (rc = dt_cfg_enum(host, "backward_prefetch", FSDP_PREFETCHES,
                          &c->prefetch_bwd)) ||
        (rc = dt_cfg_int(host, "hybrid_group_size", &c->hybrid)) ||
        (rc = dt_cfg_int(host, "min_num_params", &c->min_params)) ||
        (rc = dt_cfg_int(host, "limit_all_gathers", &c->limit)) ||
        (rc = dt_cfg_bool(host, "forward_prefetch", &c->forward_prefetch)) ||
        (rc = dt_cfg_bool(host, "reshard_after_forward", &c->reshard)))
        return rc;
    if (c->strategy == HYBRID_SHARD) {
        if (c->hybrid < 1)
            return host->set_error(host, DT_ERR_CONFIG,
                                   "sharding_strategy = \"HYBRID_SHARD\" needs "
                                   "hybrid_group_size (ranks per shard group, dividing the "
                                   "data-parallel world of %d rank%s)", world,
                                   world == 1 ? "" : "s");
        if (world > 0 && (c->hybrid > world || world % c->hybrid != 0))
            return host->set_error(host, DT_ERR_CONFIG,
                                   "hybrid_group_size = %lld does not divide the data-parallel "
                                   "world of %d rank%s", (long long)c->hybrid, world,
                                   world == 1 ? "" : "s");
    }
    return DT_OK;
}

/* The engine's configuration for the [fsdp] table over `model`: the wrap
 * policy's groups in `spans`. */
static int fsdp_configure(const dt_host_v1_t *host, const dt_model_desc_v1_t *model,
                          int32_t world, const uint64_t *unit_numel, dt_bucket_span_t *spans,
                          dt_shard_cfg_t *cfg)
{
    fsdp_conf_t c;
    int rc = fsdp_read_config(host, world, &c);
    if (rc != DT_OK)
        return rc;
    cfg->what = c.strategy == FULL_SHARD      ? "fsdp FULL_SHARD"
                : c.strategy == SHARD_GRAD_OP ? "fsdp SHARD_GRAD_OP"
                : c.strategy == NO_SHARD      ? "fsdp NO_SHARD"
                                              : "fsdp HYBRID_SHARD";
    cfg->overlap = 1;
    cfg->reshard_after_forward = c.strategy == SHARD_GRAD_OP ? 0 : c.reshard;
    cfg->shard_ranks = c.strategy == NO_SHARD       ? 1
                       : c.strategy == HYBRID_SHARD ? (uint32_t)c.hybrid
                                                    : 0;
    cfg->spans = spans;
    cfg->n_spans = dt_shard_wrap_plan(unit_numel, model->n_units, (uint64_t)c.min_params, spans,
                                      NULL);
    cfg->prefetch_fwd = c.forward_prefetch ? 1 : 0;
    cfg->prefetch_bwd = c.prefetch_bwd == PREFETCH_NONE ? 0 : 1;
    cfg->prefetch_bwd_post = c.prefetch_bwd == PREFETCH_POST;
    cfg->max_gathers = (uint32_t)c.limit;
    cfg->max_reduces = FSDP_MAX_REDUCES;
    if ((rc = dt_cfg_reduce_dtype(host, &cfg->reduce_dtype)) != DT_OK)
        return rc;
    cfg->params_offload_ok = c.strategy == FULL_SHARD;
    return DT_OK;
}

/* A fsdp instance: the engine, first (DT_SHARD_STRATEGY_OPS's slots
 * cast the instance to it). */
struct dt_strategy {
    dt_shard_engine_t engine;
};
_Static_assert(offsetof(struct dt_strategy, engine) == 0, "the engine comes first");

/* Defined below; every handle this plugin makes starts with it. */
static const dt_strategy_ops_v1_t fsdp_ops;

static int fsdp_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                     dt_strategy_t **out)
{
    return dt_shard_strategy_init(host, args, &fsdp_ops, fsdp_configure, sizeof(dt_strategy_t),
                                  out);
}

static int fsdp_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *args,
                         dt_estimate_v1_t *out)
{
    return dt_shard_strategy_estimate(host, args, fsdp_configure, out);
}

/* `dtrain plan` shows every sharding strategy. */
static const dt_plan_preset_v1_t fsdp_presets[] = {
    {.label = "fsdp NO_SHARD", .set = "sharding_strategy=NO_SHARD"},
    {.label = "fsdp SHARD_GRAD_OP", .set = "sharding_strategy=SHARD_GRAD_OP"},
    {.label = "fsdp FULL_SHARD", .set = "sharding_strategy=FULL_SHARD"},
    {.label = "fsdp HYBRID_SHARD", .set = "sharding_strategy=HYBRID_SHARD"},
};

static int fsdp_plan_presets(const dt_plan_preset_v1_t **out, uint32_t *n)
{
    if (!out || !n)
        return DT_ERR_INVALID;
    *out = fsdp_presets;
    *n = (uint32_t)DT_ARRAY_LEN(fsdp_presets);
    return DT_OK;
}

static const dt_strategy_ops_v1_t fsdp_ops = {
    .info = DT_PLUGIN_INFO(STRATEGY, dt_strategy_ops_v1_t, "fsdp", "1.0.0",
                           "fully sharded data parallel: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
                           "HYBRID_SHARD",
                           fsdp_keys),
    .init = fsdp_init,
    .estimate = fsdp_estimate,
    .plan_presets = fsdp_plan_presets,
    DT_SHARD_STRATEGY_OPS,
};

DT_PLUGIN_ENTRY(strategy, 1, dt_strategy_ops_v1_t, &fsdp_ops)
