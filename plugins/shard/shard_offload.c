/*
 * plugins/shard/shard_offload.c - ZeRO-Offload in the sharded engine: with
 * [parallel] offload set and offload_what naming the optimizer, a rank's
 * f32 master shard and its moments live in the offload tier instead of
 * the device (dtrain/sdk/offload.h).  The step then updates each held
 * range on the host and writes the new parameters into the compute copy
 * (the replica's or the shard's place), and the all-gather after it runs
 * as without offload: only where the state lives changes, never the
 * arithmetic.
 */
#include "shard_internal.h"

int shard_offload_configure(dt_shard_engine_t *e)
{
    const char *what = e->cfg.what ? e->cfg.what : "sharding";
    int rc = dt_offload_what(e->dp.host, &e->dp.args.init, e->cfg.params_offload_ok, what,
                             &e->offload_what);
    if (rc == DT_OK && (e->offload_what & DT_OFFLOAD_WHAT_PARAMS))
        return e->dp.host->set_error(e->dp.host, DT_ERR_UNSUPPORTED,
                                     "offload_what: offloading the parameters of %s is not in "
                                     "this build yet; offload_what = \"optimizer\" offloads the "
                                     "optimizer state", what);
    return rc;
}

int shard_offload_alloc(dt_shard_engine_t *e)
{
    return dt_offload_state_init(&e->off, e->dp.host, &e->dp.args.init, e->dp.rank,
                                 e->plan.shard_total, shard_has_v(e));
}

/* Where group gi's compute copy of shard element `local` (group-relative)
 * is: the replica's slot of this rank, or the compute shard. */
static void *compute_at(dt_shard_engine_t *e, uint32_t gi, uint64_t local)
{
    return (char *)shard_cshard(e, gi) + local * e->pes;
}

int shard_offload_step(dt_shard_engine_t *e, const dt_optim_step_t *st)
{
    for (uint32_t u = 0; u < e->dp.model->n_units; u++) {
        uint64_t off;
        dt_range_t r = dt_shard_held(&e->plan, u, e->srank, &off);
        if (r.count == 0)
            continue;
        uint32_t gi = e->plan.group_of_unit[u];
        uint64_t local = off - e->plan.groups[gi].shard_off;
        int rc = dt_offload_state_update(&e->off, &e->dp.model->units[u], r, off,
                                         shard_gshard(e, gi) + local, compute_at(e, gi, local),
                                         st);
        if (rc != DT_OK)
            return rc;
    }
    return DT_OK;
}

int shard_offload_push(dt_shard_engine_t *e)
{
    int rc = DT_OK;
    for (uint32_t i = 0; rc == DT_OK && i < e->plan.n_groups; i++)
        rc = dt_offload_state_push(&e->off, e->plan.groups[i].shard_off,
                                   e->plan.groups[i].shard, compute_at(e, i, 0));
    return rc;
}
