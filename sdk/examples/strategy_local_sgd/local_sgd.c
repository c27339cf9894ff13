/*
 * local_sgd.c - an example dtrain strategy to copy: local SGD (Stich,
 * "Local SGD Converges Fast and Communicates Little"; Lin et al., "Don't
 * Use Large Mini-Batches, Use Local SGD").  Every rank of the data-parallel
 * group steps on its OWN gradient, with no gradient communication at all,
 * and every K steps (`sync_every`) the ranks average their parameters.
 * The optimizer state (SGD momentum, AdamW moments) stays each rank's own
 * unless `average_optimizer` is set, then it is averaged at the same steps.
 *
 * With K = 1, plain SGD (no momentum) and no gradient clipping this is
 * data parallelism exactly: the mean of the ranks' p - lr * g_r is
 * p - lr * mean(g_r), which is what ddp computes (up to rounding).  With
 * K > 1 the ranks drift apart between averaging steps and communicate K
 * times less.
 *
 * The strategy is glue over the SDK's replica machinery (dtrain/sdk/
 * replica.h): a full replica of parameters, gradients and optimizer state
 * on every rank, state by global ranges for checkpoints, the check that
 * every rank starts from the same parameters.  The instance puts the
 * replica first; each op calls the replica's function; what is local SGD's
 * own is step() (average every K steps) and state_ranges(SAVE).
 *
 * Checkpoints hold rank 0's replica (SAVE ranges: rank 0 writes every
 * element), so a checkpoint is one coherent model, the group's average
 * when taken at a multiple of K (set checkpoint.every to a multiple of
 * sync_every), and every rank resumes from it.  The gradient norm a step
 * reports (and clips with) is the rank's own.
 *
 * To start a new strategy: copy this folder, rename every "local_sgd"
 * (the file, the plugin name string, the CMake target), and replace what
 * step() does.  Build it against the INSTALLED SDK:
 *     cmake -S . -B build -DCMAKE_PREFIX_PATH=<dtrain prefix> && cmake --build build
 * and run it: DTRAIN_PLUGIN_PATH=$PWD/build dtrain run config.toml with
 *     [parallel]
 *     data = "local_sgd"
 *     [local_sgd]
 *     sync_every = 4
 */
#include <stdio.h>
#include <string.h>

#include <dtrain/dtrain.h>
#include <dtrain/sdk/cfg.h>
#include <dtrain/sdk/hash.h>
#include <dtrain/sdk/replica.h>

static const dt_config_key_t local_sgd_keys[] = {
    {.name = "sync_every",
     .type = DT_CFG_INT,
     .def = "4",
     DT_CFG_RANGE(1, 1e9),
     .doc = "K: average the parameters across the group after every K-th optimizer step"},
    {.name = "average_optimizer",
     .type = DT_CFG_BOOL,
     .def = "false",
     .doc = "also average the optimizer state (momentum, AdamW moments) at those steps"},
    DT_REPLICA_KEY_INIT_CHECK,
    {.name = "log_params_hash",
     .type = DT_CFG_BOOL,
     .def = "false",
     .doc = "diagnostic: log a hash of this rank's parameters after every step (equal on "
            "every rank right after an averaging step)"},
};

struct dt_strategy {
    dt_replica_t rep;      /* first: the replica machinery */
    int64_t sync_every;    /* K */
    int average_optimizer;
    int log_params_hash;
    void *staging;         /* log_params_hash: host memory the hash reads */
};

static int read_config(const dt_host_v1_t *host, dt_replica_cfg_t *cfg, int64_t *k,
                       int *avg_optim, int *log_hash)
{
    int rc = dt_replica_read_config(host, cfg); /* init_check; the rest defaults */
    if (rc == DT_OK)
        rc = dt_cfg_int(host, "sync_every", k);
    if (rc == DT_OK)
        rc = dt_cfg_bool(host, "average_optimizer", avg_optim);
    if (rc == DT_OK)
        rc = dt_cfg_bool(host, "log_params_hash", log_hash);
    cfg->reduce_grads = 0; /* every rank keeps its own gradient */
    return rc;
}

static void local_sgd_finalize(dt_strategy_t *s)
{
    if (!s)
        return;
    const dt_host_v1_t *host = s->rep.dp.host;
    dt_replica_free(&s->rep);
    host->free(host, s->staging);
    host->free(host, s);
}

/* Defined below; every handle this plugin makes starts with it. */
static const dt_strategy_ops_v1_t local_sgd_ops;

static int local_sgd_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                          dt_strategy_t **out)
{
    *out = NULL;
    dt_strategy_t *s = host->alloc(host, sizeof *s, DT_TAG_OTHER);
    if (!s)
        return host->set_error(host, DT_ERR_NOMEM, "init: instance");
    memset(s, 0, sizeof *s);
    dt_replica_cfg_t cfg;
    int rc = read_config(host, &cfg, &s->sync_every, &s->average_optimizer,
                         &s->log_params_hash);
    if (rc == DT_OK)
        rc = dt_replica_init(&s->rep, &local_sgd_ops, host, args, &cfg, "local_sgd");
    if (rc == DT_OK && s->log_params_hash &&
        !(s->staging = host->alloc(host, DT_REPLICA_HASH_STAGING, DT_TAG_STAGING)))
        rc = host->set_error(host, DT_ERR_NOMEM, "log_params_hash: %u bytes of staging",
                             DT_REPLICA_HASH_STAGING);
    if (rc != DT_OK) {
        local_sgd_finalize(s);
        return rc;
    }
    *out = s;
    return DT_OK;
}

/* ---- the step: what makes this strategy local SGD ---- */

/* The diagnostic line: "step N: parameters hash H" (f32 masters). */
static int log_hash(dt_strategy_t *s, int64_t step)
{
    const dt_replica_t *r = &s->rep;
    uint64_t h = DT_HASH64_INIT;
    int rc = dt_hash_device(r->dp.host, r->dp.dev, r->dp.cs, r->master,
                            r->layout.total * sizeof(float), s->staging,
                            DT_REPLICA_HASH_STAGING, &h);
    if (rc == DT_OK)
        r->dp.host->log(r->dp.host, DT_LOG_INFO, "step %lld: parameters hash %016llx",
                        (long long)step, (unsigned long long)h);
    return rc;
}

static int local_sgd_step(dt_strategy_t *s, const dt_step_args_v1_t *args,
                          dt_step_result_v1_t *out)
{
    /* this rank's own gradient, norm and update: no communication */
    int rc = dt_replica_step(&s->rep, args, out);
    /* every K-th step the group averages (on every rank, even one whose
     * update was skipped, so the collectives stay matched) */
    if (rc == DT_OK && args->step % s->sync_every == 0) {
        rc = dt_replica_average(&s->rep, DT_STATE_PARAMS);
        if (rc == DT_OK && s->average_optimizer)
            rc = dt_replica_average(&s->rep, DT_STATE_EXP_AVG);
        if (rc == DT_OK && s->average_optimizer)
            rc = dt_replica_average(&s->rep, DT_STATE_EXP_AVG_SQ);
    }
    if (rc == DT_OK && s->log_params_hash)
        rc = log_hash(s, args->step);
    return rc;
}

/* ---- checkpoints: rank 0's replica is the one saved ---- */

static int local_sgd_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                                  dt_range_t *out, uint32_t cap, uint32_t *n)
{
    if (purpose != DT_RANGES_SAVE)
        return dt_replica_state_ranges(&s->rep, unit, kind, purpose, out, cap, n);
    int rc = dt_dp_ranges_check(&s->rep.dp, unit, kind, purpose, s->rep.v != NULL, n);
    if (rc == DT_ERR_NOT_FOUND)
        return DT_OK; /* SGD keeps no exp_avg_sq */
    if (rc != DT_OK)
        return rc;
    uint64_t numel = s->rep.dp.model->units[unit].numel;
    return dt_dp_ranges_one((dt_range_t){0, s->rep.dp.rank == 0 ? numel : 0}, out, cap, n);
}

/* ---- the rest is the replica's ---- */

static int local_sgd_begin_step(dt_strategy_t *s, int64_t step)
{
    return dt_replica_begin_step(&s->rep, step, NULL);
}

static int local_sgd_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h,
                                 dt_unit_buffers_v1_t *out)
{
    return dt_replica_pre_forward(&s->rep, h, out);
}

static int local_sgd_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    return dt_replica_post_forward(&s->rep, h);
}

static int local_sgd_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h,
                                  dt_unit_buffers_v1_t *out)
{
    return dt_replica_pre_backward(&s->rep, h, out);
}

static int local_sgd_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    return dt_replica_post_backward(&s->rep, h);
}

static int local_sgd_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                               float *buf)
{
    return dt_replica_get_state(&s->rep, unit, kind, r, buf);
}

static int local_sgd_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                               const float *buf)
{
    return dt_replica_set_state(&s->rep, unit, kind, r, buf);
}

static int local_sgd_state_loaded(dt_strategy_t *s)
{
    return dt_replica_state_loaded(&s->rep);
}

/* ---- planning ---- */

/* The replica's memory; traffic: the parameters (and the optimizer
 * state) all-reduced once every K steps, spread over those K steps. */
static int local_sgd_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,
                              dt_estimate_v1_t *res)
{
    dt_estimate_args_v1_t args;
    dt_model_desc_v1_t model = {.struct_size = sizeof(dt_model_desc_v1_t)};
    dt_replica_cfg_t cfg;
    int64_t k;
    int avg_optim, log_params;
    dt_flat_layout_t layout;
    dt_estimate_v1_t est;
    dt_estimate_begin(&est);
    int rc = dt_dp_estimate_read(host, in, &args, &model);
    if (rc == DT_OK)
        rc = read_config(host, &cfg, &k, &avg_optim, &log_params);
    if (rc == DT_OK)
        rc = dt_replica_estimate(host, &args, &cfg, &est, NULL);
    if (rc == DT_OK)
        rc = dt_flat_layout_model(&layout, host, &model, DT_REPLICA_ALIGN);
    if (rc != DT_OK)
        return rc;
    int32_t n = args.group_size;
    /* optimizer state buffers: AdamW 2, SGD 1 (the planner assumes AdamW) */
    double buffers = 1.0 + (avg_optim ? 2.0 : 0.0);
    double ring = n > 1 ? 2.0 * (double)(n - 1) / (double)n : 0.0;
    est.comm_bytes_per_step =
        (uint64_t)(ring * buffers * (double)layout.total * sizeof(float) / (double)k);
    dt_flat_layout_free(&layout, host);
    snprintf(est.note, sizeof est.note,
             "full replica per rank; own gradients, parameters%s averaged every %lld step(s)",
             avg_optim ? " and optimizer state" : "", (long long)k);
    return dt_result_write(host, "estimate", res, &est, sizeof est, DT_ESTIMATE_V1_SIZE0);
}

static const dt_strategy_ops_v1_t local_sgd_ops = {
    .info = DT_PLUGIN_INFO(STRATEGY, dt_strategy_ops_v1_t, "local_sgd", "0.1.0",
                           "example: local SGD, parameters averaged every K steps",
                           local_sgd_keys),
    .init = local_sgd_init,
    .finalize = local_sgd_finalize,
    .begin_step = local_sgd_begin_step,
    .pre_forward = local_sgd_pre_forward,
    .post_forward = local_sgd_post_forward,
    .pre_backward = local_sgd_pre_backward,
    .post_backward = local_sgd_post_backward,
    .step = local_sgd_step,
    .state_ranges = local_sgd_state_ranges,
    .get_state = local_sgd_get_state,
    .set_state = local_sgd_set_state,
    .state_loaded = local_sgd_state_loaded,
    .estimate = local_sgd_estimate,
};

DT_PLUGIN_ENTRY(strategy, 1, dt_strategy_ops_v1_t, &local_sgd_ops)
