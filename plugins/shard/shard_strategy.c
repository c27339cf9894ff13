/*
 * plugins/shard/shard_strategy.c - a strategy plugin over the sharded
 * engine: its init and estimate, given the plugin's configure function,
 * and its ops slots.  zero and fsdp differ only in the keys they read and
 * the dt_shard_cfg_t they make of them; each instance (the plugin's own
 * struct dt_strategy) starts with its engine, and every slot here is the
 * engine's function on that first member.
 */
#include <string.h>

#include "shard.h"

/* The engine an instance starts with (the plugin's contract, shard.h). */
static dt_shard_engine_t *engine_of(dt_strategy_t *s)
{
    return (dt_shard_engine_t *)(void *)s;
}

/* Configure for `model` over `world` ranks, with the scratch tables the
 * configure function may point cfg->spans at; free them with
 * host->free(*spans). */
static int configure_model(const dt_host_v1_t *host, const dt_model_desc_v1_t *model,
                           int32_t world, dt_shard_configure_fn configure, dt_shard_cfg_t *cfg,
                           dt_bucket_span_t **spans)
{
    uint64_t nu1 = (uint64_t)model->n_units + 1;
    *spans = host->alloc(host, nu1 * sizeof **spans, DT_TAG_OTHER);
    uint64_t *numel = host->alloc(host, nu1 * sizeof *numel, DT_TAG_OTHER);
    int rc;
    if (!*spans || !numel) {
        rc = host->set_error(host, DT_ERR_NOMEM, "shard plan for %u units", model->n_units);
    } else {
        for (uint32_t u = 0; u < model->n_units; u++)
            numel[u] = model->units[u].numel;
        memset(cfg, 0, sizeof *cfg);
        rc = configure(host, model, world, numel, *spans, cfg);
    }
    host->free(host, numel);
    return rc;
}

int dt_shard_strategy_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *in,
                           const dt_strategy_ops_v1_t *ops,
                           dt_shard_configure_fn configure, size_t instance_size,
                           dt_strategy_t **out)
{
    *out = NULL;
    if (instance_size < sizeof(dt_shard_engine_t))
        return host->set_error(host, DT_ERR_INVALID,
                               "init: an instance of %zu bytes cannot start with the sharded "
                               "engine (%zu bytes)", instance_size, sizeof(dt_shard_engine_t));
    dt_strategy_args_t read;
    int rc = dt_strategy_args_read(host, in, &read);
    if (rc != DT_OK)
        return rc;
    const dt_strategy_init_v1_t *args = &read.init;
    /* the config is checked (and its errors reported) before the rest of
     * args; without a communicator it is checked for no group (world 0)
     * and dt_shard_engine_init refuses the missing one */
    int32_t rank = 0, world = 0;
    if (args->comm) {
        rc = dt_comm_ops(args->comm)->rank_size(args->comm, &rank, &world);
        if (rc != DT_OK) {
            host->log(host, DT_LOG_ERROR, "init: comm rank_size failed");
            return rc;
        }
    }
    dt_shard_cfg_t cfg;
    dt_bucket_span_t *spans = NULL;
    rc = configure_model(host, args->model, world, configure, &cfg, &spans);
    void *s = NULL;
    if (rc == DT_OK && !(s = host->alloc(host, instance_size, DT_TAG_OTHER)))
        rc = host->set_error(host, DT_ERR_NOMEM, "init: instance");
    if (rc == DT_OK) {
        memset(s, 0, instance_size);
        rc = dt_shard_engine_init(s, ops, host, args, &cfg);
    }
    host->free(host, spans);
    if (rc != DT_OK) {
        host->free(host, s);
        return rc;
    }
    *out = s;
    return DT_OK;
}

int dt_shard_strategy_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,
                               dt_shard_configure_fn configure, dt_estimate_v1_t *out)
{
    dt_estimate_args_v1_t a;
    dt_model_desc_v1_t model_desc = {.struct_size = sizeof(dt_model_desc_v1_t)};
    int rc = dt_dp_estimate_read(host, in, &a, &model_desc);
    if (rc != DT_OK)
        return rc;
    const dt_estimate_args_v1_t *args = &a;
    dt_shard_cfg_t cfg;
    dt_bucket_span_t *spans = NULL;
    rc = configure_model(host, args->model, args->group_size, configure, &cfg, &spans);
    if (rc == DT_OK)
        rc = dt_shard_estimate(host, args, &cfg, out);
    host->free(host, spans);
    return rc;
}

/* ------------------------------------------------------------ the ops */

void dt_shard_op_finalize(dt_strategy_t *s)
{
    if (!s)
        return;
    const dt_host_v1_t *host = engine_of(s)->dp.host;
    dt_shard_engine_free(engine_of(s));
    host->free(host, s);
}

int dt_shard_op_begin_step(dt_strategy_t *s, int64_t step)
{
    return dt_shard_begin_step(engine_of(s), step);
}

int dt_shard_op_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    return dt_shard_pre_forward(engine_of(s), h, out);
}

int dt_shard_op_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    return dt_shard_post_forward(engine_of(s), h);
}

int dt_shard_op_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    return dt_shard_pre_backward(engine_of(s), h, out);
}

int dt_shard_op_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    return dt_shard_post_backward(engine_of(s), h);
}

int dt_shard_op_step(dt_strategy_t *s, const dt_step_args_v1_t *args, dt_step_result_v1_t *out)
{
    return dt_shard_step(engine_of(s), args, out);
}

int dt_shard_op_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                             dt_range_t *out, uint32_t cap, uint32_t *n)
{
    return dt_shard_state_ranges(engine_of(s), unit, kind, purpose, out, cap, n);
}

int dt_shard_op_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, float *buf)
{
    return dt_shard_get_state(engine_of(s), unit, kind, r, buf);
}

int dt_shard_op_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                          const float *buf)
{
    return dt_shard_set_state(engine_of(s), unit, kind, r, buf);
}

int dt_shard_op_state_loaded(dt_strategy_t *s)
{
    return dt_shard_state_loaded(engine_of(s));
}
