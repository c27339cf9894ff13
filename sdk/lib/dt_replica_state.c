/*
 * sdk/lib/dt_replica_state.c - a replica's persistent state by global
 * ranges (checkpoints, initial parameters) and the check that every
 * replica starts from the same parameters.
 *
 * Every rank HOLDS every unit whole, so each must load all of it; for
 * saving, the ranks split each unit evenly (dt_range_split) so checkpoint
 * writes run in parallel and every element is written exactly once.
 */
#include <string.h>

#include "dtrain/sdk/replica.h"

#include "dtrain/sdk/hash.h"
#include "dtrain/sdk/ranges.h"

/* The flat buffer holding state `kind` (checked). */
static float *state_buffer(dt_replica_t *r, int kind)
{
    return kind == DT_STATE_PARAMS ? r->master : kind == DT_STATE_EXP_AVG ? r->m : r->v;
}

int dt_replica_state_ranges(dt_replica_t *r, uint32_t unit, int kind, int purpose,
                            dt_range_t *out, uint32_t cap, uint32_t *n)
{
    int rc = dt_dp_ranges_check(&r->dp, unit, kind, purpose, dt_replica_has_v(r), n);
    if (rc == DT_ERR_NOT_FOUND)
        return DT_OK; /* SGD has no second moment: nothing held, nothing to save */
    if (rc != DT_OK)
        return rc;
    uint64_t numel = r->dp.model->units[unit].numel;
    if (purpose == DT_RANGES_SAVE && (dt_dp_unit_flags(&r->dp, unit) & DT_UNIT_COPY))
        return DT_OK; /* the other pipeline stage saves its original */
    dt_range_t range = purpose == DT_RANGES_HELD
                           ? (dt_range_t){0, numel}
                           : dt_range_split(numel, (uint32_t)r->dp.size, (uint32_t)r->dp.rank);
    return dt_dp_ranges_one(range, out, cap, n);
}

int dt_replica_get_state(dt_replica_t *r, uint32_t unit, int kind, dt_range_t range, float *buf)
{
    int rc = dt_dp_state_check(&r->dp, unit, kind, dt_replica_has_v(r), range, buf, "get_state");
    if (rc != DT_OK)
        return rc;
    if (dt_replica_offloaded(r)) /* the tier's */
        return dt_offload_state_read(&r->off, kind, r->layout.offset[unit] + range.offset,
                                     range.count, buf);
    const float *p = state_buffer(r, kind) + r->layout.offset[unit] + range.offset;
    return dt_dp_state_copy(&r->dp, unit, kind, range, buf, p, DT_COPY_D2H, "get_state");
}

int dt_replica_set_state(dt_replica_t *r, uint32_t unit, int kind, dt_range_t range,
                         const float *buf)
{
    int rc = dt_dp_state_check(&r->dp, unit, kind, dt_replica_has_v(r), range, buf, "set_state");
    if (rc != DT_OK)
        return rc;
    if (dt_replica_offloaded(r)) /* the tier's */
        return dt_offload_state_write(&r->off, kind, r->layout.offset[unit] + range.offset,
                                      range.count, buf);
    float *p = state_buffer(r, kind) + r->layout.offset[unit] + range.offset;
    return dt_dp_state_copy(&r->dp, unit, kind, range, p, buf, DT_COPY_H2D, "set_state");
}

/* The init check: hash each unit's master parameters and compare across
 * the group; every rank fails alike, naming the first unit that differs. */
static int check_replicas(dt_replica_t *r)
{
    const dt_host_v1_t *host = r->dp.host;
    uint32_t nu = r->dp.model->n_units;
    uint64_t staging_bytes = r->layout.total * sizeof(float);
    if (staging_bytes > DT_REPLICA_HASH_STAGING)
        staging_bytes = DT_REPLICA_HASH_STAGING;
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
        if (dt_replica_offloaded(r)) { /* the master is the tier's */
            rc = dt_offload_state_hash(&r->off, DT_STATE_PARAMS, r->layout.offset[u],
                                       r->dp.model->units[u].numel, &hashes[u]);
            continue;
        }
        rc = dt_hash_device(host, r->dp.dev, r->dp.cs,
                            r->master + r->layout.offset[u],
                            r->dp.model->units[u].numel * sizeof(float), staging, staging_bytes,
                            &hashes[u]);
    }
    uint32_t first = nu;
    if (rc == DT_OK)
        rc = dt_replica_check(host, r->dp.comm, r->dp.dev,
                              r->dp.cs, hashes, nu, &first);
    if (rc == DT_OK && first < nu)
        rc = host->set_error(host, DT_ERR_DATA,
                             "init_check: the parameters of unit '%s' (unit %u) differ across "
                             "the %d ranks of the data-parallel group (rank %d's hash "
                             "%016llx); initialise every rank alike (same seed) or set "
                             "init_check = \"broadcast\" to copy rank 0's",
                             r->dp.model->units[first].name, first, r->dp.size, r->dp.rank,
                             (unsigned long long)hashes[first]);
    host->free(host, staging);
    host->free(host, hashes);
    return rc;
}

int dt_replica_state_loaded(dt_replica_t *r)
{
    const dt_host_v1_t *host = r->dp.host;
    const dt_device_ops_v1_t *d = dt_device_ops(r->dp.dev);
    int rc = DT_OK;
    if (r->dp.size > 1 && r->cfg.init_broadcast) {
        rc = dt_replica_offloaded(r)
                 ? dt_offload_state_collective(&r->off, DT_STATE_PARAMS, r->dp.comm, 0, DT_OP_SUM)
                 : dt_comm_ops(r->dp.comm)
                       ->broadcast(r->dp.comm, r->master, r->layout.total, DT_F32, 0, r->dp.cs,
                                   NULL);
        if (rc != DT_OK) {
            host->log(host, DT_LOG_ERROR, "state_loaded: rank %d/%d: broadcasting rank 0's "
                      "%llu parameters failed", r->dp.rank, r->dp.size,
                      (unsigned long long)r->layout.total);
            return rc;
        }
    }
    if (dt_replica_offloaded(r)) {
        /* the loaded master (host memory) to the device's compute copy */
        if ((rc = dt_offload_state_push(&r->off, 0, r->layout.total, r->compute)) != DT_OK)
            return rc;
    } else if (r->compute != (void *)r->master) {
        rc = r->dp.kernels->cast(r->dp.dev, r->dp.cs, r->compute, r->dp.model->param_dtype,
                                 r->master, DT_F32, (int64_t)r->layout.total);
        if (rc != DT_OK) {
            host->log(host, DT_LOG_ERROR, "state_loaded: building the %s parameters failed",
                      dt_dtype_name(r->dp.model->param_dtype));
            return rc;
        }
    }
    if (r->dp.size > 1 && !r->cfg.init_broadcast)
        rc = check_replicas(r);
    if (rc == DT_OK)
        rc = d->stream_sync(r->dp.dev, r->dp.cs);
    return rc;
}
