/*
 * sdk/lib/dt_shard_plugin.c - a strategy plugin over the sharded engine:
 * its init and estimate, given the plugin's configure function (the rest
 * of its ops table is the engine's own functions, DT_SHARD_STRATEGY_OPS).
 * zero and fsdp differ only in the keys they read and the dt_shard_cfg_t
 * they make of them.
 */
#include <string.h>

#include "shard_internal.h"

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

int dt_shard_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *in,
                  dt_shard_configure_fn configure, dt_shard_t **out)
{
    *out = NULL;
    dt_strategy_args_t read;
    int rc = dt_strategy_args_read(host, in, &read);
    if (rc != DT_OK)
        return rc;
    const dt_strategy_init_v1_t *args = &read.init;
    /* the config is checked (and its errors reported) before the rest of
     * args; without a communicator it is checked for no group (world 0)
     * and dt_shard_create refuses the missing one */
    int32_t rank = 0, world = 0;
    if (args->comm_ops && args->comm) {
        rc = args->comm_ops->rank_size(args->comm, &rank, &world);
        if (rc != DT_OK) {
            host->log(host, DT_LOG_ERROR, "init: comm rank_size failed");
            return rc;
        }
    }
    dt_shard_cfg_t cfg;
    dt_bucket_span_t *spans = NULL;
    rc = configure_model(host, args->model, world, configure, &cfg, &spans);
    if (rc == DT_OK)
        rc = dt_shard_create(host, args, &cfg, out);
    host->free(host, spans);
    return rc;
}

int dt_shard_estimate_with(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,
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
