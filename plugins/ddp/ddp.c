/*
 * plugins/ddp/ddp.c - the `ddp` strategy: data parallelism with a full
 * replica of parameters, gradients and optimizer state on every rank, and
 * gradients averaged by bucketed all-reduces that overlap backward.
 *
 * The replica and its buckets are the SDK's replica machinery
 * (dtrain/sdk/replica.h, sdk/lib/dt_replica*.c), first in the instance;
 * ddp adds the staggered update (ddp_stagger.c).  This file: config keys,
 * init/finalize, the planner estimate and the ops table.
 */
#include <stdio.h>
#include <string.h>

#include "ddp_internal.h"
#include "dtrain/sdk/cfg.h"

static const dt_config_key_t ddp_keys[] = {
    DT_REPLICA_KEY_BUCKET_CAP_MB,
    DT_REPLICA_KEY_REDUCE_DTYPE,
    DT_REPLICA_KEY_OVERLAP,
    DT_REPLICA_KEY_INIT_CHECK,
    DT_OFFLOAD_KEY_WHAT,
    {.name = "stagger_update",
     .type = DT_CFG_BOOL,
     .def = "true",
     .doc = "odd ranks apply each unit's optimizer update at its next forward, so ranks "
            "sharing memory bandwidth do not all update at once (same results)"},
};

/* The [ddp] table (the host filled the declared keys' defaults). */
static int ddp_read_config(const dt_host_v1_t *host, dt_replica_cfg_t *cfg, int32_t *stagger)
{
    int st;
    int rc = dt_replica_read_config(host, cfg);
    if (rc == DT_OK)
        rc = dt_cfg_bool(host, "stagger_update", &st);
    if (rc == DT_OK)
        *stagger = st;
    return rc;
}

static void ddp_finalize(dt_strategy_t *s)
{
    if (!s)
        return;
    const dt_host_v1_t *host = s->rep.dp.host;
    dt_replica_free(&s->rep);
    host->free(host, s->pending);
    host->free(host, s);
}

/* Defined below; every handle this plugin makes starts with it. */
static const dt_strategy_ops_v1_t ddp_ops;

static int ddp_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                    dt_strategy_t **out)
{
    *out = NULL;
    dt_strategy_t *s = host->alloc(host, sizeof *s, DT_TAG_OTHER);
    if (!s)
        return host->set_error(host, DT_ERR_NOMEM, "init: instance");
    memset(s, 0, sizeof *s);
    dt_replica_cfg_t cfg;
    int rc = ddp_read_config(host, &cfg, &s->stagger);
    if (rc == DT_OK)
        rc = dt_replica_init(&s->rep, &ddp_ops, host, args, &cfg, "ddp");
    if (rc == DT_OK) {
        uint64_t nu1 = (uint64_t)s->rep.dp.model->n_units + 1;
        if (!(s->pending = host->alloc(host, nu1, DT_TAG_OTHER)))
            rc = host->set_error(host, DT_ERR_NOMEM, "pending updates of %u units",
                                 s->rep.dp.model->n_units);
        else
            memset(s->pending, 0, nu1);
    }
    if (rc != DT_OK) {
        dt_replica_free(&s->rep);
        host->free(host, s->pending);
        host->free(host, s);
        return rc;
    }
    const dt_dp_t *dp = &s->rep.dp;
    s->defer = s->stagger && dp->size > 1 && dp->rank % 2 == 1;
    host->log(host, DT_LOG_DEBUG,
              "rank %d/%d: %llu parameters in %u units, %u bucket(s) of <= %g MiB, reduce %s%s%s",
              dp->rank, dp->size, (unsigned long long)dp->model->numel, dp->model->n_units,
              s->rep.n_buckets, cfg.bucket_cap_mb, dt_dtype_name(cfg.reduce_dtype),
              cfg.overlap ? ", overlapped" : "", s->defer ? ", update deferred to next use" : "");
    *out = s;
    return DT_OK;
}

/* Memory per rank, by tag, as init allocates it (dt_replica_estimate), so
 * the planner's numbers match the device's peaks. */
static int ddp_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,
                        dt_estimate_v1_t *res)
{
    dt_estimate_args_v1_t args;
    dt_model_desc_v1_t model = {.struct_size = sizeof(dt_model_desc_v1_t)};
    dt_replica_cfg_t cfg;
    int32_t stagger;
    uint32_t nb;
    dt_estimate_v1_t est;
    dt_estimate_begin(&est);
    int rc = dt_dp_estimate_read(host, in, &args, &model);
    if (rc == DT_OK)
        rc = ddp_read_config(host, &cfg, &stagger);
    if (rc == DT_OK)
        rc = dt_replica_estimate(host, &args, &cfg, &est, &nb);
    if (rc != DT_OK)
        return rc;
    int32_t n = args.group_size;
    snprintf(est.note, sizeof est.note,
             "full replica per rank; grads all-reduced in %u bucket(s) <= %g MiB, %s%s%s", nb,
             cfg.bucket_cap_mb, dt_cfg_reduce_dtype_name(cfg.reduce_dtype),
             n > 1 ? (cfg.overlap ? ", overlapped with backward" : ", in step") : ", 1 rank: none",
             n > 1 && stagger ? "; odd ranks update at next use" : "");
    return dt_result_write(host, "estimate", res, &est, sizeof est, DT_ESTIMATE_V1_SIZE0);
}

static int ddp_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    return dt_replica_post_forward(&s->rep, h);
}

static int ddp_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    return dt_replica_post_backward(&s->rep, h);
}

static int ddp_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                            dt_range_t *out, uint32_t cap, uint32_t *n)
{
    return dt_replica_state_ranges(&s->rep, unit, kind, purpose, out, cap, n);
}

static int ddp_state_loaded(dt_strategy_t *s)
{
    return dt_replica_state_loaded(&s->rep);
}

static const dt_strategy_ops_v1_t ddp_ops = {
    .info = DT_PLUGIN_INFO(STRATEGY, dt_strategy_ops_v1_t, "ddp", "1.0.0",
                           "data parallel: full replica, bucketed gradient all-reduce",
                           ddp_keys),
    .init = ddp_init,
    .finalize = ddp_finalize,
    .begin_step = ddp_begin_step,
    .pre_forward = ddp_pre_forward,
    .post_forward = ddp_post_forward,
    .pre_backward = ddp_pre_backward,
    .post_backward = ddp_post_backward,
    .step = ddp_step,
    .state_ranges = ddp_state_ranges,
    .get_state = ddp_get_state,
    .set_state = ddp_set_state,
    .state_loaded = ddp_state_loaded,
    .estimate = ddp_estimate,
};

DT_PLUGIN_ENTRY(strategy, 1, dt_strategy_ops_v1_t, &ddp_ops)
