/*
 * plugins/shard/shard_state.c - the sharded engine's persistent state by
 * global ranges: what a rank holds (its shard of each unit), what it
 * saves, copying state in and out, and rebuilding the derived copies once
 * loading is done.
 *
 * A rank HOLDS its shard of every unit (dt_shard_held) for every state
 * kind, master parameters included: a checkpoint is then topology free,
 * each rank reading the global ranges it holds whatever wrote them.  Its
 * replicas (hybrid sharding) hold the same shard; to SAVE, they split it
 * evenly, so over the whole group each element is written exactly once
 * and the writes spread over every rank.  The copies go where the shard
 * lives (e->home: the device's buffers, or the tier's host memory where
 * the optimizer state is offloaded, shard_offload.c), and state_loaded
 * publishes the master to the compute copy.
 */
#include <string.h>

#include "shard_internal.h"

int dt_shard_state_ranges(dt_shard_engine_t *e, uint32_t unit, int kind, int purpose,
                          dt_range_t *out, uint32_t cap, uint32_t *n)
{
    int rc = dt_dp_ranges_check(&e->dp, unit, kind, purpose, shard_has_v(e), n);
    if (rc == DT_ERR_NOT_FOUND)
        return DT_OK; /* SGD has no second moment: nothing held or saved */
    if (rc != DT_OK)
        return rc;
    dt_range_t r = dt_shard_held(&e->plan, unit, e->srank, NULL);
    if (purpose == DT_RANGES_SAVE && (dt_dp_unit_flags(&e->dp, unit) & DT_UNIT_COPY))
        r.count = 0; /* the other stage's to save */
    else if (purpose == DT_RANGES_SAVE) {
        dt_range_t part = dt_range_split(r.count, e->rsize, e->rrank);
        r = (dt_range_t){r.offset + part.offset, part.count};
    }
    return dt_dp_ranges_one(r, out, cap, n);
}

/* Check a get/set of state `kind` at global range r of `unit`, which
 * must lie inside this rank's shard; *at: its place in the shard buffer
 * (where every home keeps it). */
static int state_at(dt_shard_engine_t *e, uint32_t unit, int kind, dt_range_t r,
                    const void *buf, const char *what, uint64_t *at)
{
    int rc = dt_dp_state_check(&e->dp, unit, kind, shard_has_v(e), r, buf, what);
    if (rc != DT_OK)
        return rc;
    uint64_t off;
    dt_range_t h = dt_shard_held(&e->plan, unit, e->srank, &off);
    if (r.count > 0 && (r.offset < h.offset || r.offset + r.count > h.offset + h.count))
        return e->dp.host->set_error(e->dp.host, DT_ERR_INVALID,
                                     "%s: unit '%s' state %s: range [%llu, +%llu) is not inside "
                                     "this rank's shard [%llu, +%llu) (shard rank %u of %u)",
                                     what, e->dp.model->units[unit].name,
                                     dt_state_kind_name(kind), (unsigned long long)r.offset,
                                     (unsigned long long)r.count, (unsigned long long)h.offset,
                                     (unsigned long long)h.count, e->srank, e->ssize);
    *at = off + (r.offset - h.offset);
    return DT_OK;
}

int dt_shard_get_state(dt_shard_engine_t *e, uint32_t unit, int kind, dt_range_t r, float *buf)
{
    uint64_t at = 0;
    int rc = state_at(e, unit, kind, r, buf, "get_state", &at);
    return rc == DT_OK ? e->home.state_get(e, unit, kind, r, at, buf) : rc;
}

int dt_shard_set_state(dt_shard_engine_t *e, uint32_t unit, int kind, dt_range_t r, const float *buf)
{
    uint64_t at = 0;
    int rc = state_at(e, unit, kind, r, buf, "set_state", &at);
    return rc == DT_OK ? e->home.state_set(e, unit, kind, r, at, buf) : rc;
}

int dt_shard_state_loaded(dt_shard_engine_t *e)
{
    /* hooks may have gathered the old parameters (an evaluation before a
     * load): drop those copies with everything else in flight */
    int rc = shard_drain(e, -1);
    for (uint32_t i = 0; rc == DT_OK && i < e->plan.n_groups; i++) {
        sh_group_t *g = &e->g[i];
        if (g->transient && g->active == 0 && g->full) {
            dt_device_ops(e->dp.dev)->free(e->dp.dev, g->full);
            g->full = NULL;
            g->pstate = SH_P_FREE;
        }
    }
    /* the loaded master reaches the compute copy first */
    if (rc == DT_OK)
        rc = e->home.publish(e, "state_loaded");
    if (rc == DT_OK)
        rc = shard_refresh_params(e, "state_loaded");
    if (rc == DT_OK)
        rc = dt_device_ops(e->dp.dev)->stream_sync(e->dp.dev, e->dp.cs);
    return rc;
}
