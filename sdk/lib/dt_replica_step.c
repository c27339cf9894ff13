/*
 * sdk/lib/dt_replica_step.c - a replica's update: the optimizer over each
 * unit, the compute copy refreshed from the masters, the plain step of a
 * replica strategy, and averaging replicated state across the group (what
 * local SGD does every K steps).
 */
#include <stdio.h>

#include "dtrain/sdk/replica.h"

#include "dtrain/sdk/ranges.h"

int dt_replica_update_unit(dt_replica_t *r, uint32_t u, const dt_optim_step_t *st)
{
    const dt_unit_desc_v1_t *unit = &r->dp.model->units[u];
    uint64_t off = r->layout.offset[u];
    if (dt_replica_offloaded(r))
        return dt_offload_state_update(&r->off, unit, (dt_range_t){0, unit->numel}, off,
                                       r->grads + off,
                                       (char *)r->compute +
                                           off * dt_dtype_size(r->dp.model->param_dtype),
                                       st);
    return dt_optim_range(r->dp.host, r->dp.dev, r->dp.cs, unit,
                          (dt_range_t){0, unit->numel}, r->master + off, r->grads + off,
                          r->m + off, r->v ? r->v + off : NULL, st);
}

int dt_replica_refresh(dt_replica_t *r, uint32_t lo, uint32_t hi)
{
    /* f32 compute is the master; an offloaded update wrote compute itself */
    if (r->compute == (void *)r->master || dt_replica_offloaded(r) || lo >= hi)
        return DT_OK;
    uint64_t off = r->layout.offset[lo];
    const int pd = r->dp.model->param_dtype;
    return r->dp.kernels->cast(r->dp.dev, r->dp.cs, (char *)r->compute + off * dt_dtype_size(pd),
                               pd, r->master + off, DT_F32,
                               (int64_t)(r->layout.offset[hi] - off));
}

int dt_replica_zero_grads(dt_replica_t *r, uint32_t lo, uint32_t hi)
{
    if (lo >= hi)
        return DT_OK;
    uint64_t off = r->layout.offset[lo];
    return dt_device_ops(r->dp.dev)->memset_async(r->dp.dev, r->grads + off, 0,
                                       (r->layout.offset[hi] - off) * sizeof(float), r->dp.cs);
}

int dt_replica_update(dt_replica_t *r, const dt_optim_step_t *st, int last_first)
{
    uint32_t nu = r->dp.model->n_units;
    for (uint32_t k = 0; k < nu; k++) {
        int rc = dt_replica_update_unit(r, last_first ? nu - 1 - k : k, st);
        if (rc != DT_OK)
            return rc;
    }
    int rc = dt_replica_offloaded(r) ? dt_offload_state_flush(&r->off) : DT_OK;
    if (rc == DT_OK)
        rc = dt_replica_refresh(r, 0, nu);
    if (dt_replica_offloaded(r)) {
        char when[48];
        snprintf(when, sizeof when, "step %lld", (long long)st->t);
        dt_offload_state_report(&r->off, when);
    }
    if (rc != DT_OK)
        r->dp.host->log(r->dp.host, DT_LOG_ERROR, "step %lld: refreshing the %s parameters "
                        "failed", (long long)st->t, dt_dtype_name(r->dp.model->param_dtype));
    return rc;
}

int dt_replica_step_grads(dt_replica_t *r, const dt_step_args_v1_t *args,
                          dt_step_result_v1_t *out, dt_optim_step_t *st)
{
    int rc = dt_replica_reduce(r);
    double sumsq = 0.0;
    if (rc == DT_OK)
        rc = dt_replica_tied_sum(r);
    if (rc == DT_OK)
        rc = dt_replica_grad_sumsq(r, &sumsq);
    if (rc != DT_OK)
        return rc;
    *st = dt_dp_step_norm(&r->dp, args, sumsq, out);
    return DT_OK;
}

int dt_replica_step(dt_replica_t *r, const dt_step_args_v1_t *args, dt_step_result_v1_t *out)
{
    dt_optim_step_t st;
    int rc = dt_dp_step_check(&r->dp, args, out);
    if (rc == DT_OK)
        rc = dt_replica_step_grads(r, args, out, &st);
    if (rc != DT_OK || out->nonfinite)
        return rc;
    return dt_replica_update(r, &st, 0);
}

int dt_replica_average(dt_replica_t *r, int kind)
{
    float *buf = kind == DT_STATE_PARAMS    ? r->master
                 : kind == DT_STATE_EXP_AVG ? r->m
                 : kind == DT_STATE_EXP_AVG_SQ ? r->v
                                               : NULL;
    if (kind < 0 || kind >= DT_STATE_COUNT)
        return r->dp.host->set_error(r->dp.host, DT_ERR_INVALID, "average: unknown state kind %d",
                                     kind);
    if (r->dp.size == 1 || (!buf && !dt_replica_offloaded(r)))
        return DT_OK;
    int rc;
    if (dt_replica_offloaded(r)) {
        rc = dt_offload_state_collective(&r->off, kind, r->dp.comm, -1,
                                         DT_OP_AVG);
        if (rc == DT_OK && kind == DT_STATE_PARAMS)
            rc = dt_offload_state_push(&r->off, 0, r->layout.total, r->compute);
    } else {
        rc = dt_comm_ops(r->dp.comm)->all_reduce(r->dp.comm, buf, buf, r->layout.total, DT_F32,
                                        DT_OP_AVG, r->dp.cs, NULL);
    }
    if (rc == DT_OK && kind == DT_STATE_PARAMS)
        rc = dt_replica_refresh(r, 0, r->dp.model->n_units);
    if (rc != DT_OK)
        r->dp.host->log(r->dp.host, DT_LOG_ERROR, "rank %d/%d: averaging the %s (%llu elements) "
                        "across the group failed", r->dp.rank, r->dp.size,
                        dt_state_kind_name(kind), (unsigned long long)r->layout.total);
    return rc;
}
