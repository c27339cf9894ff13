/*
 * plugins/ddp/ddp_state.c - ddp's persistent state by global ranges
 * (checkpoints, initial parameters) and the check that every replica
 * starts from the same parameters.
 *
 * Every rank HOLDS every unit whole, so each must load all of it; for
 * saving, the ranks split each unit evenly (dt_range_split) so checkpoint
 * writes run in parallel and every element is written exactly once.
 */
#include <string.h>

#include "ddp_internal.h"

/* The flat buffer holding state `kind` (checked). */
static float *state_buffer(dt_strategy_t *s, int kind)
{
    return kind == DT_STATE_PARAMS ? s->master : kind == DT_STATE_EXP_AVG ? s->m : s->v;
}

int ddp_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                     dt_range_t *out, uint32_t cap, uint32_t *n)
{
    int rc = dt_dp_ranges_check(&s->dp, unit, kind, purpose, s->v != NULL, n);
    if (rc == DT_ERR_NOT_FOUND)
        return DT_OK; /* SGD has no second moment: nothing held, nothing to save */
    if (rc != DT_OK)
        return rc;
    uint64_t numel = s->dp.model->units[unit].numel;
    dt_range_t r = purpose == DT_RANGES_HELD
                       ? (dt_range_t){0, numel}
                       : dt_range_split(numel, (uint32_t)s->dp.size, (uint32_t)s->dp.rank);
    return dt_dp_ranges_one(r, out, cap, n);
}

int ddp_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, float *buf)
{
    int rc = dt_dp_state_check(&s->dp, unit, kind, s->v != NULL, r, buf, "get_state");
    if (rc == DT_OK)
        rc = ddp_apply_pending(s, unit);
    if (rc != DT_OK)
        return rc;
    const float *p = state_buffer(s, kind) + s->layout.offset[unit] + r.offset;
    return dt_dp_state_copy(&s->dp, unit, kind, r, buf, p, DT_COPY_D2H, "get_state");
}

int ddp_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, const float *buf)
{
    int rc = dt_dp_state_check(&s->dp, unit, kind, s->v != NULL, r, buf, "set_state");
    if (rc == DT_OK)
        rc = ddp_apply_pending(s, unit); /* the state set replaces the updated one */
    if (rc != DT_OK)
        return rc;
    float *p = state_buffer(s, kind) + s->layout.offset[unit] + r.offset;
    return dt_dp_state_copy(&s->dp, unit, kind, r, p, buf, DT_COPY_H2D, "set_state");
}

/* init_check = checksum: hash each unit's master parameters and compare
 * across the group; every rank fails alike, naming the first unit that
 * differs. */
static int check_replicas(dt_strategy_t *s)
{
    const dt_host_v1_t *host = s->dp.host;
    uint32_t nu = s->dp.model->n_units;
    uint64_t staging_bytes = s->layout.total * sizeof(float);
    if (staging_bytes > DDP_HASH_STAGING)
        staging_bytes = DDP_HASH_STAGING;
    if (staging_bytes < 8)
        staging_bytes = 8;
    uint64_t *hashes = host->alloc(host, ((uint64_t)nu + 1) * sizeof(uint64_t), DT_TAG_OTHER);
    void *staging = host->alloc(host, staging_bytes, DT_TAG_STAGING);
    int rc = DT_OK;
    if (!hashes || !staging)
        rc = host->set_error(host, DT_ERR_NOMEM, "init_check: %llu bytes of host staging",
                             (unsigned long long)staging_bytes);
    for (uint32_t u = 0; rc == DT_OK && u < nu; u++) {
        hashes[u] = DT_HASH64_INIT;
        rc = dt_hash_device(host, s->dp.dev_ops, s->dp.dev, s->dp.cs,
                            s->master + s->layout.offset[u],
                            s->dp.model->units[u].numel * sizeof(float), staging, staging_bytes,
                            &hashes[u]);
    }
    uint32_t first = nu;
    if (rc == DT_OK)
        rc = dt_replica_check(host, s->dp.comm_ops, s->dp.comm, s->dp.dev_ops, s->dp.dev, s->dp.cs,
                              hashes, nu, &first);
    if (rc == DT_OK && first < nu)
        rc = host->set_error(host, DT_ERR_DATA,
                             "init_check: the parameters of unit '%s' (unit %u) differ across "
                             "the %d ranks of the data-parallel group (rank %d's hash "
                             "%016llx); initialise every rank alike (same seed) or set "
                             "init_check = \"broadcast\" to copy rank 0's",
                             s->dp.model->units[first].name, first, s->dp.size, s->dp.rank,
                             (unsigned long long)hashes[first]);
    host->free(host, staging);
    host->free(host, hashes);
    return rc;
}

int ddp_state_loaded(dt_strategy_t *s)
{
    const dt_host_v1_t *host = s->dp.host;
    const dt_device_ops_v1_t *d = s->dp.dev_ops;
    int rc = DT_OK;
    if (s->dp.size > 1 && s->init_broadcast) {
        rc = s->dp.comm_ops->broadcast(s->dp.comm, s->master, s->layout.total, DT_F32, 0, s->dp.cs,
                                       NULL);
        if (rc != DT_OK) {
            host->log(host, DT_LOG_ERROR, "state_loaded: rank %d/%d: broadcasting rank 0's "
                      "%llu parameters failed", s->dp.rank, s->dp.size,
                      (unsigned long long)s->layout.total);
            return rc;
        }
    }
    if (s->compute != (void *)s->master) {
        rc = d->kernels()->cast(s->dp.dev, s->dp.cs, s->compute, DT_BF16, s->master, DT_F32,
                                (int64_t)s->layout.total);
        if (rc != DT_OK) {
            host->log(host, DT_LOG_ERROR, "state_loaded: building the bf16 parameters failed");
            return rc;
        }
    }
    if (s->dp.size > 1 && !s->init_broadcast)
        rc = check_replicas(s);
    if (rc == DT_OK)
        rc = d->stream_sync(s->dp.dev, s->dp.cs);
    return rc;
}
