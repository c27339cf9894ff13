/*
 * plugins/shard/shard_step.c - the sharded optimizer step: wait for every
 * gradient reduction (shard_reduce.c), the global gradient norm from each
 * rank's shard, the clip coefficient, AdamW or SGD over exactly the part
 * of every unit this rank holds (dt_shard_held) - on the device, or on the
 * host where the state is offloaded (shard_offload.c) - and the updated
 * parameters made visible to the next forward (shard_gather.c).
 */
#include "shard_internal.h"

/* 1 when group g holds a pipeline stage's COPY unit (alone in its group,
 * shard_engine.c): the other stage counts it in the norm. */
static int group_is_copy(const dt_shard_engine_t *e, uint32_t g)
{
    const dt_shard_group_t *gr = &e->plan.groups[g];
    return gr->unit_lo == gr->unit_hi && (dt_dp_unit_flags(&e->dp, gr->unit_lo) & DT_UNIT_COPY);
}

/* The sum of squares of the whole gradient: each rank's shard, summed
 * over the shard group, and on a pipeline stage over the other stages
 * (norm_comm), its COPY unit left to the stage that owns it; under tensor
 * parallelism the model's ranks (norm_comm) with each replicated tensor
 * counted by the tensor group's rank 0 only. */
static int grad_sumsq(dt_shard_engine_t *e, double *out)
{
    const dt_host_v1_t *host = e->dp.host;
    int rc;
    double ss = 0.0;
    if (shard_grads_offloaded(e)) {
        rc = shard_offload_grads_sumsq(e, &ss); /* never on a stage with a COPY */
    } else if (e->gshard && !e->dp.tied_comm && !e->norm_copies) {
        rc = dt_norm_sumsq(host, e->dp.dev_ops, e->dp.dev, e->dp.cs, e->norm_slot, e->gshard,
                           DT_F32, (int64_t)e->plan.shard_total, &ss);
    } else {
        rc = DT_OK;
        for (uint32_t i = 0; rc == DT_OK && i < e->plan.n_groups; i++) {
            if (group_is_copy(e, i))
                continue;
            const dt_shard_group_t *gr = &e->plan.groups[i];
            double part = 0.0, copies = 0.0;
            rc = dt_norm_sumsq(host, e->dp.dev_ops, e->dp.dev, e->dp.cs, e->norm_slot,
                               shard_gshard(e, i), DT_F32, (int64_t)gr->shard, &part);
            /* tensor parallelism: the copies the tensor group's rank 0
             * counts (the shard's place in the group's flat space) */
            if (rc == DT_OK && e->norm_copies)
                rc = dt_dp_norm_copies(&e->dp, e->norm_slot, shard_gshard(e, i),
                                       (uint64_t)e->srank * gr->shard, gr->shard, gr->unit_lo,
                                       gr->unit_hi, e->plan.unit_off + gr->unit_lo, &copies);
            ss += part - copies < 0.0 ? 0.0 : part - copies; /* NaN and Inf pass */
        }
    }
    /* each element is owned by one rank of the shard group; replicas of a
     * shard hold the same numbers and are not summed again */
    if (rc == DT_OK && e->ssize > 1)
        rc = dt_norm_allreduce(host, e->dp.comm_ops, e->scomm, e->dp.dev_ops, e->dp.dev, e->dp.cs,
                               e->norm_slot, &ss);
    if (rc == DT_OK && e->dp.norm_comm)
        rc = dt_norm_allreduce(host, e->dp.comm_ops, e->dp.norm_comm, e->dp.dev_ops, e->dp.dev,
                               e->dp.cs, e->norm_slot, &ss);
    *out = ss;
    return rc;
}

/* A pipeline stage's TIED units: each one's reduced gradient shard summed
 * with the other stage's (all_reduce SUM over tied_comm, in place, on the
 * compute stream), so both stages apply the same update, as Megatron-LM
 * sums the input embedding's and the LM head's.  The unit is alone in its
 * group and both stages have the same shard group, so this rank's shard
 * is the same elements there. */
static int tied_sum(dt_shard_engine_t *e)
{
    if (!e->dp.tied_comm)
        return DT_OK;
    for (uint32_t g = 0; g < e->plan.n_groups; g++) {
        const dt_shard_group_t *gr = &e->plan.groups[g];
        if (!(dt_dp_unit_flags(&e->dp, gr->unit_lo) & DT_UNIT_TIED))
            continue;
        float *x = shard_gshard(e, g);
        int rc = e->dp.comm_ops->all_reduce(e->dp.tied_comm, x, x, gr->shard, DT_F32, DT_OP_SUM,
                                            e->dp.cs, NULL);
        if (rc != DT_OK) {
            e->dp.host->log(e->dp.host, DT_LOG_ERROR,
                            "summing the gradient shard of tied unit '%s' (%llu elements) "
                            "between the first and the last pipeline stage failed",
                            e->dp.model->units[gr->unit_lo].name,
                            (unsigned long long)gr->shard);
            return rc;
        }
    }
    return DT_OK;
}

/* The update of every unit's held part, tensor by tensor (dt_optim_range
 * applies each tensor's weight decay even where the shard cuts it). */
static int optimizer(dt_shard_engine_t *e, const dt_optim_step_t *st)
{
    for (uint32_t u = 0; u < e->dp.model->n_units; u++) {
        uint64_t off;
        dt_range_t r = dt_shard_held(&e->plan, u, e->srank, &off);
        if (r.count == 0)
            continue;
        uint32_t gi = e->plan.group_of_unit[u];
        uint64_t local = off - e->plan.groups[gi].shard_off;
        int rc = dt_optim_range(e->dp.host, e->dp.dev_ops, e->dp.dev, e->dp.cs,
                                &e->dp.model->units[u], r, shard_master(e, gi) + local,
                                shard_gshard(e, gi) + local, e->m + off,
                                e->v ? e->v + off : NULL, st);
        if (rc != DT_OK)
            return rc;
    }
    return DT_OK;
}

int dt_shard_step(dt_shard_engine_t *e, const dt_step_args_v1_t *args, dt_step_result_v1_t *out)
{
    int rc = dt_dp_step_check(&e->dp, args, out);
    if (rc != DT_OK)
        return rc;
    rc = shard_reduce_all(e);
    /* gathered copies go stale with the update (and were only a cache);
     * after a failure destroy frees them, after their gathers */
    for (uint32_t i = 0; rc == DT_OK && i < e->plan.n_groups; i++)
        rc = shard_release_params(e, i);
    if (rc == DT_OK)
        rc = shard_compute_after_comm(e);
    if (rc == DT_OK)
        rc = tied_sum(e);
    if (rc != DT_OK) {
        e->failed = 1;
        return rc;
    }

    double sumsq = 0.0;
    if ((rc = grad_sumsq(e, &sumsq)) != DT_OK)
        return rc;
    dt_optim_step_t st = dt_dp_step_norm(&e->dp, args, sumsq, out);
    if (out->nonfinite)
        return DT_OK;
    /* gradients offloaded with the optimizer on the device: only the
     * planner's replay (shard_grads_offloaded), whose update is the tier's */
    if ((rc = shard_optim_offloaded(e)   ? shard_offload_step(e, &st)
              : shard_grads_offloaded(e) ? DT_OK
                                         : optimizer(e, &st)) != DT_OK)
        return rc;
    /* offloaded parameters, device optimizer: the new master to the tier */
    if (shard_params_offloaded(e) && !shard_optim_offloaded(e) &&
        (rc = shard_offload_push(e)) != DT_OK)
        return rc;
    return shard_refresh_params(e, "step");
}
