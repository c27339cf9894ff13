/*
 * plugins/shard/shard_hooks.c - the unit hooks of the sharded engine and
 * the start of a step.  Before a unit's forward or backward its group is
 * gathered (and the next ones prefetched: shard_gather.c); backward gets a
 * gradient buffer for the group; after the hooks the gathered copy may be
 * freed again (reshard) and a group whose gradient is complete for the
 * micro-step starts its reduction (shard_reduce.c).
 *
 * A unit may be used more than once per pass (GPT-2's tied embedding is
 * read again inside the head's hooks): groups count their open hooks, and
 * only the outermost hook of a pass prefetches.
 */
#include <string.h>

#include "shard_internal.h"

static void enter(dt_shard_engine_t *e, uint32_t gi)
{
    if (e->g[gi].active++ == 0)
        e->n_active++;
}

static void leave(dt_shard_engine_t *e, uint32_t gi)
{
    if (--e->g[gi].active == 0)
        e->n_active--;
}

static const void *unit_params(dt_shard_engine_t *e, uint32_t u)
{
    return (const char *)e->g[e->plan.group_of_unit[u]].full + e->plan.unit_off[u] * e->pes;
}

int dt_shard_pre_forward(dt_shard_engine_t *e, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = dt_dp_hook_enter(&e->dp, h, 0, out);
    if (rc != DT_OK)
        return rc;
    uint32_t u = h->unit, gi = e->plan.group_of_unit[u];
    /* prefetch only from the outer unit: a nested one (the tied embedding
     * inside the head) is a detour, not the direction of the pass */
    uint32_t ahead = e->n_active == 0 ? e->cfg.prefetch_fwd : 0;
    enter(e, gi);
    if ((rc = shard_use_params(e, gi, +1, ahead)) != DT_OK) {
        e->dp.fwd_depth[u]--;
        leave(e, gi);
        return rc;
    }
    out->params = unit_params(e, u);
    out->grads = NULL;
    return DT_OK;
}

int dt_shard_post_forward(dt_shard_engine_t *e, const dt_hook_v1_t *h)
{
    int rc = dt_dp_hook_leave(&e->dp, h, 0);
    if (rc != DT_OK)
        return rc;
    uint32_t gi = e->plan.group_of_unit[h->unit];
    leave(e, gi);
    if (e->g[gi].active == 0 && e->cfg.reshard_after_forward)
        return shard_release_params(e, gi);
    return DT_OK;
}

int dt_shard_pre_backward(dt_shard_engine_t *e, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = dt_dp_hook_enter(&e->dp, h, 1, out);
    if (rc != DT_OK)
        return rc;
    uint32_t u = h->unit, gi = e->plan.group_of_unit[u];
    sh_group_t *g = &e->g[gi];
    uint32_t ahead = (e->n_active == 0 && !e->cfg.prefetch_bwd_post) ? e->cfg.prefetch_bwd : 0;
    if (g->active == 0)
        g->bwd_done = 0;
    enter(e, gi);
    rc = shard_use_params(e, gi, -1, ahead);
    if (rc == DT_OK)
        rc = shard_grad_buffer(e, gi);
    if (rc != DT_OK) {
        e->dp.bwd_depth[u]--;
        leave(e, gi);
        return rc;
    }
    out->params = unit_params(e, u);
    out->grads = g->gbuf + e->plan.unit_off[u];
    return DT_OK;
}

int dt_shard_post_backward(dt_shard_engine_t *e, const dt_hook_v1_t *h)
{
    int rc = dt_dp_hook_leave(&e->dp, h, 1);
    if (rc != DT_OK)
        return rc;
    uint32_t u = h->unit, gi = e->plan.group_of_unit[u];
    sh_group_t *g = &e->g[gi];
    leave(e, gi);
    if (h->last_use) {
        if (e->final_at[u] == h->micro + 1)
            return e->dp.host->set_error(e->dp.host, DT_ERR_INVALID,
                                         "post_backward: unit '%s' (%u) reported last_use twice "
                                         "in micro-step %u", shard_unit_name(e, u), u, h->micro);
        e->final_at[u] = h->micro + 1;
        if (++g->n_final == g->n_units &&
            (rc = shard_group_complete(e, gi, h->micro + 1 == h->n_micro)) != DT_OK)
            return rc;
    }
    if (g->active == 0 && (e->cfg.reshard_after_forward || g->bwd_done) &&
        (rc = shard_release_params(e, gi)) != DT_OK)
        return rc;
    if (g->active == 0 && e->n_active == 0 && e->cfg.prefetch_bwd_post &&
        (rc = shard_prefetch(e, gi, -1, e->cfg.prefetch_bwd)) != DT_OK)
        e->failed = 1;
    return rc;
}

int dt_shard_begin_step(dt_shard_engine_t *e, int64_t step)
{
    /* A step abandoned mid-way leaves reductions running into the
     * gradient shards: finish them before zeroing. */
    int rc = shard_drain(e, -1);
    if (rc != DT_OK)
        return rc;
    for (uint32_t i = 0; i < e->plan.n_groups; i++) {
        sh_group_t *g = &e->g[i];
        if (g->gbuf_transient) {
            dt_device_ops(e->dp.dev)->free(e->dp.dev, g->gbuf);
            g->gbuf = NULL;
            g->gbuf_transient = 0;
        }
        g->n_final = 0;
        g->gadds = 0;
        g->final_sent = 0;
        g->bwd_done = 0;
        g->active = 0;
    }
    e->n_active = 0;
    dt_dp_hooks_reset(&e->dp);
    memset(e->final_at, 0, e->dp.model->n_units * sizeof(uint32_t));
    float *grads = e->gfull ? e->gfull : e->gshard; /* NULL: in the tier */
    uint64_t n = e->gfull ? e->plan.full_total : e->plan.shard_total;
    if (grads)
        rc = dt_device_ops(e->dp.dev)->memset_async(e->dp.dev, grads, 0, n * sizeof(float),
                                                    e->dp.cs);
    if (rc != DT_OK)
        e->dp.host->log(e->dp.host, DT_LOG_ERROR, "begin_step %lld: zeroing gradients failed",
                        (long long)step);
    return rc;
}
