/*
 * plugins/fsdp/fsdp.c - the `fsdp` strategy: PyTorch FSDP's sharding
 * strategies, configured as its users know them.  The algorithm is the
 * SDK's sharded engine (sdk/lib/dt_shard_*.c): FULL_SHARD is ZeRO stage 3
 * with other knobs; this file turns the [fsdp] table into its
 * configuration.
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
#include <stdio.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "dtrain/sdk_helpers.h"

struct dt_strategy {
    dt_shard_t *e;
    const dt_host_v1_t *host;
};

#define FSDP_STRATEGIES "FULL_SHARD|SHARD_GRAD_OP|NO_SHARD|HYBRID_SHARD"
#define FSDP_PREFETCHES "BACKWARD_PRE|BACKWARD_POST|NONE"
#define FSDP_MAX_REDUCES 2u

static const dt_config_key_t fsdp_keys[] = {
    {.name = "sharding_strategy", .type = DT_CFG_ENUM, .def = "\"FULL_SHARD\"", .min = 1,
     .max = 0, .choices = FSDP_STRATEGIES,
     .doc = "what is sharded: everything, gradients+optimizer, nothing, or full sharding "
            "inside groups replicated across them"},
    {.name = "hybrid_group_size", .type = DT_CFG_INT, .def = "0", .min = 0, .max = 1e9,
     .doc = "HYBRID_SHARD: ranks per shard group; must divide the data-parallel world"},
    {.name = "min_num_params", .type = DT_CFG_INT, .def = "0", .min = 0, .max = 1e15,
     .doc = "wrap policy: merge consecutive units smaller than this into one flat parameter "
            "(0: one per unit)"},
    {.name = "forward_prefetch", .type = DT_CFG_BOOL, .def = "false", .min = 1, .max = 0,
     .doc = "gather the next flat parameter during forward"},
    {.name = "backward_prefetch", .type = DT_CFG_ENUM, .def = "\"BACKWARD_PRE\"", .min = 1,
     .max = 0, .choices = FSDP_PREFETCHES,
     .doc = "gather the previous flat parameter in backward before / after the current "
            "one's gradient, or not"},
    {.name = "limit_all_gathers", .type = DT_CFG_INT, .def = "2", .min = 0, .max = 1e9,
     .doc = "all-gathers in flight at once (0: no limit)"},
    {.name = "reshard_after_forward", .type = DT_CFG_BOOL, .def = "true", .min = 1, .max = 0,
     .doc = "FULL_SHARD / HYBRID_SHARD: free gathered parameters after forward"},
};

enum { FULL_SHARD = 0, SHARD_GRAD_OP = 1, NO_SHARD = 2, HYBRID_SHARD = 3 };
enum { PREFETCH_PRE = 0, PREFETCH_POST = 1, PREFETCH_NONE = 2 };

typedef struct fsdp_conf {
    int strategy, prefetch_bwd;
    int forward_prefetch, reshard;
    int64_t hybrid, min_params, limit;
} fsdp_conf_t;

/* Index of `v` in the '|'-separated `choices`, or -1. */
static int choice_index(const char *choices, const char *v)
{
    size_t n = strlen(v);
    int i = 0;
    for (const char *p = choices; *p; i++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0)
            return i;
        if (!bar)
            break;
        p = bar + 1;
    }
    return -1;
}

static int read_enum(const dt_host_v1_t *host, const char *key, const char *def,
                     const char *choices, int *out)
{
    const char *v = def;
    int rc = host->cfg_string(host, key, &v);
    if (rc != DT_OK && rc != DT_ERR_NOT_FOUND)
        return host->set_error(host, DT_ERR_CONFIG, "%s: cannot read (%s)", key,
                               dt_status_name(rc));
    int i = choice_index(choices, v);
    if (i < 0) {
        char list[160];
        size_t n = 0;
        for (const char *c = choices; *c && n + 3 < sizeof list; c++) {
            if (*c == '|') {
                list[n++] = ',';
                list[n++] = ' ';
            } else {
                list[n++] = *c;
            }
        }
        list[n] = 0;
        return host->set_error(host, DT_ERR_CONFIG,
                               "%s = \"%s\" is not one of the valid choices: %s", key, v,
                               list);
    }
    *out = i;
    return DT_OK;
}

static int read_int(const dt_host_v1_t *host, const char *key, int64_t def, int64_t *out)
{
    int64_t v = def;
    int rc = host->cfg_int(host, key, &v);
    if (rc != DT_OK && rc != DT_ERR_NOT_FOUND)
        return host->set_error(host, DT_ERR_CONFIG, "%s: cannot read (%s)", key,
                               dt_status_name(rc));
    if (v < 0)
        return host->set_error(host, DT_ERR_CONFIG, "%s = %lld: must be >= 0", key,
                               (long long)v);
    *out = v;
    return DT_OK;
}

static int read_bool(const dt_host_v1_t *host, const char *key, int def, int *out)
{
    int v = def;
    int rc = host->cfg_bool(host, key, &v);
    if (rc != DT_OK && rc != DT_ERR_NOT_FOUND)
        return host->set_error(host, DT_ERR_CONFIG, "%s: cannot read (%s)", key,
                               dt_status_name(rc));
    *out = v ? 1 : 0;
    return DT_OK;
}

/* The [fsdp] table, checked against a data-parallel group of `world`
 * ranks. */
static int fsdp_read_config(const dt_host_v1_t *host, int32_t world, fsdp_conf_t *c)
{
    int rc;
    if ((rc = read_enum(host, "sharding_strategy", "FULL_SHARD", FSDP_STRATEGIES,
                        &c->strategy)) ||
        (rc = read_enum(host, "backward_prefetch", "BACKWARD_PRE", FSDP_PREFETCHES,
                        &c->prefetch_bwd)) ||
        (rc = read_int(host, "hybrid_group_size", 0, &c->hybrid)) ||
        (rc = read_int(host, "min_num_params", 0, &c->min_params)) ||
        (rc = read_int(host, "limit_all_gathers", 2, &c->limit)) ||
        (rc = read_bool(host, "forward_prefetch", 0, &c->forward_prefetch)) ||
        (rc = read_bool(host, "reshard_after_forward", 1, &c->reshard)))
        return rc;
    if (c->strategy == HYBRID_SHARD) {
        if (c->hybrid < 1)
            return host->set_error(host, DT_ERR_CONFIG,
                                   "sharding_strategy = \"HYBRID_SHARD\" needs "
                                   "hybrid_group_size (ranks per shard group, dividing the "
                                   "data-parallel world of %d ranks)", world);
        if (c->hybrid > world || world % c->hybrid != 0)
            return host->set_error(host, DT_ERR_CONFIG,
                                   "hybrid_group_size = %lld does not divide the data-parallel "
                                   "world of %d ranks", (long long)c->hybrid, world);
    }
    return DT_OK;
}

static void fsdp_make_cfg(const fsdp_conf_t *c, const dt_model_desc_v1_t *model,
                          dt_bucket_span_t *spans, uint64_t *numel, dt_shard_cfg_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->what = c->strategy == FULL_SHARD      ? "fsdp FULL_SHARD"
                : c->strategy == SHARD_GRAD_OP ? "fsdp SHARD_GRAD_OP"
                : c->strategy == NO_SHARD      ? "fsdp NO_SHARD"
                                               : "fsdp HYBRID_SHARD";
    cfg->overlap = 1;
    cfg->reshard_after_forward = c->strategy == SHARD_GRAD_OP ? 0 : c->reshard;
    cfg->shard_ranks = c->strategy == NO_SHARD       ? 1
                       : c->strategy == HYBRID_SHARD ? (uint32_t)c->hybrid
                                                     : 0;
    for (uint32_t u = 0; u < model->n_units; u++)
        numel[u] = model->units[u].numel;
    cfg->spans = spans;
    cfg->n_spans = dt_shard_wrap_plan(numel, model->n_units, (uint64_t)c->min_params, spans,
                                      NULL);
    cfg->prefetch_fwd = c->forward_prefetch ? 1 : 0;
    cfg->prefetch_bwd = c->prefetch_bwd == PREFETCH_NONE ? 0 : 1;
    cfg->prefetch_bwd_post = c->prefetch_bwd == PREFETCH_POST;
    cfg->max_gathers = (uint32_t)c->limit;
    cfg->max_reduces = FSDP_MAX_REDUCES;
}

static int fsdp_plan(const dt_host_v1_t *host, const dt_model_desc_v1_t *model, int32_t world,
                     dt_shard_cfg_t *cfg, dt_bucket_span_t **spans, uint64_t **numel)
{
    fsdp_conf_t c;
    int rc = fsdp_read_config(host, world, &c);
    if (rc != DT_OK)
        return rc;
    uint64_t nu1 = (uint64_t)model->n_units + 1;
    *spans = host->alloc(host, nu1 * sizeof **spans, DT_TAG_OTHER);
    *numel = host->alloc(host, nu1 * sizeof **numel, DT_TAG_OTHER);
    if (!*spans || !*numel)
        return host->set_error(host, DT_ERR_NOMEM, "wrap plan for %u units", model->n_units);
    fsdp_make_cfg(&c, model, *spans, *numel, cfg);
    return DT_OK;
}

static void plan_free(const dt_host_v1_t *host, dt_bucket_span_t *spans, uint64_t *numel)
{
    host->free(host, spans);
    host->free(host, numel);
}

static int fsdp_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                     dt_strategy_t **out)
{
    *out = NULL;
    if (!args || !args->model || !args->comm_ops || !args->comm)
        return host->set_error(host, DT_ERR_INVALID, "init: NULL %s",
                               !args ? "args" : !args->model ? "model" : "comm");
    int32_t rank = 0, world = 0;
    int rc = args->comm_ops->rank_size(args->comm, &rank, &world);
    if (rc != DT_OK) {
        host->log(host, DT_LOG_ERROR, "init: comm rank_size failed");
        return rc;
    }
    dt_shard_cfg_t cfg;
    dt_bucket_span_t *spans = NULL;
    uint64_t *numel = NULL;
    rc = fsdp_plan(host, args->model, world, &cfg, &spans, &numel);
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

static void fsdp_finalize(dt_strategy_t *s)
{
    if (!s)
        return;
    dt_shard_destroy(s->e);
    s->host->free(s->host, s);
}

static int fsdp_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *args,
                         dt_estimate_v1_t *out)
{
    memset(out, 0, sizeof *out);
    if (!args || args->struct_size < sizeof(dt_estimate_args_v1_t) || !args->model)
        return host->set_error(host, DT_ERR_INVALID, "estimate: bad args (struct_size %u)",
                               args ? args->struct_size : 0);
    dt_shard_cfg_t cfg;
    dt_bucket_span_t *spans = NULL;
    uint64_t *numel = NULL;
    int rc = fsdp_plan(host, args->model, args->group_size, &cfg, &spans, &numel);
    if (rc == DT_OK)
        rc = dt_shard_estimate(host, args, &cfg, out);
    plan_free(host, spans, numel);
    return rc;
}

/* ---- the ops table: the engine's functions ---- */

static int fsdp_begin_step(dt_strategy_t *s, int64_t step)
{
    return dt_shard_begin_step(s->e, step);
}
static int fsdp_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *o)
{
    return dt_shard_pre_forward(s->e, h, o);
}
static int fsdp_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    return dt_shard_post_forward(s->e, h);
}
static int fsdp_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *o)
{
    return dt_shard_pre_backward(s->e, h, o);
}
static int fsdp_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    return dt_shard_post_backward(s->e, h);
}
static int fsdp_step(dt_strategy_t *s, const dt_step_args_v1_t *a, dt_step_result_v1_t *o)
{
    return dt_shard_step(s->e, a, o);
}
static int fsdp_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                             dt_range_t *out, uint32_t cap, uint32_t *n)
{
    return dt_shard_state_ranges(s->e, unit, kind, purpose, out, cap, n);
}
static int fsdp_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, float *buf)
{
    return dt_shard_get_state(s->e, unit, kind, r, buf);
}
static int fsdp_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                          const float *buf)
{
    return dt_shard_set_state(s->e, unit, kind, r, buf);
}
static int fsdp_state_loaded(dt_strategy_t *s)
{
    return dt_shard_state_loaded(s->e);
}

static const dt_strategy_ops_v1_t fsdp_ops = {
    .info = DT_PLUGIN_INFO(STRATEGY, dt_strategy_ops_v1_t, "fsdp", "0.1.0",
                           "fully sharded data parallel: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
                           "HYBRID_SHARD",
                           fsdp_keys),
    .init = fsdp_init,
    .finalize = fsdp_finalize,
    .begin_step = fsdp_begin_step,
    .pre_forward = fsdp_pre_forward,
    .post_forward = fsdp_post_forward,
    .pre_backward = fsdp_pre_backward,
    .post_backward = fsdp_post_backward,
    .step = fsdp_step,
    .state_ranges = fsdp_state_ranges,
    .get_state = fsdp_get_state,
    .set_state = fsdp_set_state,
    .state_loaded = fsdp_state_loaded,
    .estimate = fsdp_estimate,
};

DT_PLUGIN_ENTRY(strategy, 1, dt_strategy_ops_v1_t, &fsdp_ops)
