/*
 * core/train/preflight.c - the checks of a run that need no plugin
 * instance (preflight.h), shared by the training loop, `dtrain check` and
 * the launcher's parent.
 */
#include "train/preflight.h"

#include <stdio.h>
#include <stdlib.h>

#include "data/data.h"
#include "loader/loader.h"
#include "model/model.h"
#include "train/grid.h"
#include "train/stage_runner.h"
#include "train/batch_lr.h"
#include "util/error.h"

int dt_preflight_dp(const dt_resolved_t *r, int64_t world, int64_t *dp)
{
    dt_grid_t g;
    int rc = dt_grid_init(&g, (int32_t)world, 0, r->set.parallel.tensor,
                          r->set.parallel.pipeline);
    if (rc)
        return dt_err_context(rc, "%s", r->set.config_path);
    *dp = g.dp;
    return DT_OK;
}

int dt_preflight_stages(const dt_resolved_t *r, dt_model_t *m)
{
    const int64_t pp = r->set.parallel.pipeline;
    const uint32_t n = dt_model_desc(m)->n_units;
    if (pp <= 1)
        return DT_OK;
    int rc = dt_model_stage_check(m, 0, n);
    if (rc) {
        char msg[DT_ERR_MAX]; /* (the message buffer is the one set below) */
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        return dt_err_set(DT_ERR_CONFIG, "%s: parallel.pipeline = %lld: %s", r->set.config_path,
                          (long long)pp, msg);
    }
    if ((int64_t)n < pp)
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: parallel.pipeline = %lld stages, but the model has %u units "
                          "(each stage needs at least one)",
                          r->set.config_path, (long long)pp, n);
    return DT_OK;
}

int dt_preflight_pipeline(const dt_resolved_t *r, dt_model_t *m)
{
    const dt_plugin_t *pp = r->plugin[DT_ROLE_PIPELINE];
    const int64_t p = r->set.parallel.pipeline;
    if (p <= 1 || !pp)
        return DT_OK;
    const dt_schedule_ops_t *ops = pp->ops;
    dt_model_desc_t *d = dt_model_desc(m);
    const uint32_t nu = d->n_units;
    /* what the training loop gives assign_stages (train.c, assign_stage) */
    uint32_t *stage_of = calloc(nu ? nu : 1, sizeof *stage_of);
    uint32_t *per_stage = calloc(3 * (size_t)p, sizeof *per_stage);
    double *flops = calloc(nu ? nu : 1, sizeof *flops);
    int rc = DT_OK;
    if (!stage_of || !per_stage || !flops) {
        rc = dt_err_set(DT_ERR_NOMEM, "out of memory");
    } else {
        dt_model_unit_flops(m, r->set.train.seq_len, flops);
        dt_stage_args_t sa;
        dt_stage_args_init(&sa, &r->set, (int32_t)p, d, (uint32_t)r->set.train.grad_accum);
        sa.in_flight = per_stage;
        sa.stash = per_stage + p;
        sa.buffers = per_stage + 2 * p;
        sa.unit_flops = flops;
        dt_err_clear();
        rc = dt_plugin_failed(pp, ops->assign_stages(pp->host, &sa, stage_of), "assign_stages");
    }
    free(stage_of);
    free(per_stage);
    free(flops);
    return rc;
}

int dt_preflight_batch(dt_resolved_t *r, int64_t dp, int64_t context)
{
    dt_train_settings_t *t = &r->set.train;
    int64_t accum = t->grad_accum, global = t->global_batch;
    int rc = dt_batch_resolve(r->set.config_path, t->micro_batch, &accum, &global, dp);
    /* derived values are part of the resolved config (its printout, its
     * hash, the checkpoint's record of the data order); a value the user
     * gave keeps its origin */
    if (rc == DT_OK && accum != t->grad_accum)
        rc = dt_config_set_int(r->cfg, "train.grad_accum", accum, DT_ORIGIN_DERIVED);
    if (rc == DT_OK && global != t->global_batch)
        rc = dt_config_set_int(r->cfg, "train.global_batch", global, DT_ORIGIN_DERIVED);
    if (rc)
        return rc;
    t->grad_accum = accum;
    t->global_batch = global;
    if (context > 0 && t->seq_len > context)
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: [train] seq_len = %lld is longer than the model's context "
                          "(model.context = %lld)",
                          r->set.config_path, (long long)t->seq_len, (long long)context);
    return DT_OK;
}

int dt_preflight_data_named(const dt_settings_t *set)
{
    if (!set->data.train[0])
        return dt_err_set(DT_ERR_CONFIG, "%s: [data] train is empty: name a token file "
                                         "(make one with 'dtrain data prepare TEXT OUT')",
                          set->config_path);
    return DT_OK;
}

int dt_preflight_data(const dt_settings_t *set, int64_t vocab_size, int require_train)
{
    int rc = require_train ? dt_preflight_data_named(set) : DT_OK;
    const char *files[] = {set->data.train, set->data.val};
    for (int i = 0; i < 2 && rc == DT_OK; i++) {
        dt_dataset_t *ds = NULL;
        if (files[i][0] && (rc = dt_data_open(files[i], &ds)) == DT_OK)
            rc = dt_data_check_vocab(ds, (uint32_t)vocab_size);
        dt_data_close(ds);
    }
    return rc;
}

int dt_preflight(dt_resolved_t *r, int64_t world, int require_data)
{
    int64_t dp = 0;
    int rc = dt_preflight_dp(r, world, &dp);
    if (rc)
        return rc;
    if (!r->plugin[DT_ROLE_DEVICE])
        return dt_err_set(DT_ERR_INVALID, "dt_preflight: the device plugin is not resolved");
    dt_model_t *m = NULL;
    /* tensor rank 0's part: an impossible tensor-parallel layout fails here */
    if ((rc = dt_model_create_part(r->cfg, r->plugin[DT_ROLE_DEVICE]->ops,
                                   dt_resolved_model(r), (int32_t)r->set.parallel.tensor, 0,
                                   &m)) == DT_OK &&
        (rc = dt_model_set_sequence(m, dt_resolved_tensor(r), dt_resolved_tensor_name(r))) ==
            DT_OK &&
        (rc = dt_model_check_seq_len(m, r->set.train.seq_len)) == DT_OK &&
        (rc = dt_preflight_stages(r, m)) == DT_OK &&
        (rc = dt_preflight_batch(r, dp, dt_model_info(m)->context)) == DT_OK &&
        (rc = dt_preflight_pipeline(r, m)) == DT_OK)
        rc = dt_preflight_data(&r->set, dt_model_info(m)->vocab_size, require_data);
    if (m)
        dt_model_free(m, NULL);
    return rc;
}
