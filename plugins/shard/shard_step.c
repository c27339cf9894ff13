/*
 * plugins/shard/shard_step.c - the sharded optimizer step: wait for every
 * gradient reduction (shard_reduce.c), the global gradient norm from each
 * rank's shard, the clip coefficient, AdamW or SGD over exactly the part
 * of every unit this rank holds (dt_shard_held) where the shard lives
 * (e->home: shard_home.c on the device, shard_offload.c in a tier), and
 * the updated parameters made visible to the next forward
 * (shard_gather.c).
 */
#include "shard_internal.h"

/* The sum of squares of the whole gradient: this rank's part (the norm
 * plan of its gradient buffer, shard_engine.c, wherever the shard lives),
 * summed over the shard group, and on a pipeline stage or under tensor
 * parallelism over the model's ranks (norm_comm). */
static int grad_sumsq(dt_shard_engine_t *e, double *out)
{
    double ss = 0.0;
    int rc = e->home.grads_sumsq(e, &ss);
    /* each element is owned by one rank of the shard group; replicas of a
     * shard hold the same numbers and are not summed again */
    if (rc == DT_OK && e->ssize > 1)
        rc = dt_norm_allreduce(e->dp.host, e->scomm, e->dp.dev,
                               e->dp.cs, e->norm_slot, &ss);
    if (rc == DT_OK && e->dp.norm_comm)
        rc = dt_norm_allreduce(e->dp.host, e->dp.norm_comm, e->dp.dev, e->dp.cs, e->norm_slot, &ss);
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
        int rc =
            dt_comm_ops(e->dp.tied_comm)
                ->all_reduce(e->dp.tied_comm, x, x, gr->shard, DT_F32, DT_OP_SUM, e->dp.cs, NULL);
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
    /* the update where the shard lives, the compute shard current after */
    if ((rc = e->home.update(e, &st)) != DT_OK)
        return rc;
    return shard_refresh_params(e, "step");
}
