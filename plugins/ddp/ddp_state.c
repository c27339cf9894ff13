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

static const char *kind_name(int kind)
{
    switch (kind) {
    case DT_STATE_PARAMS: return "params";
    case DT_STATE_EXP_AVG: return "exp_avg";
    case DT_STATE_EXP_AVG_SQ: return "exp_avg_sq";
    default: return "unknown";
    }
}

/* The flat buffer holding state `kind`, or NULL (with the error set). */
static float *state_buffer(dt_strategy_t *s, uint32_t unit, int kind, const char *what,
                           int *rc)
{
    const dt_host_v1_t *host = s->host;
    *rc = DT_OK;
    if (unit >= s->model->n_units) {
        *rc = host->set_error(host, DT_ERR_INVALID, "%s: unit %u out of range (model has %u "
                              "units)", what, unit, s->model->n_units);
        return NULL;
    }
    switch (kind) {
    case DT_STATE_PARAMS: return s->master;
    case DT_STATE_EXP_AVG: return s->m;
    case DT_STATE_EXP_AVG_SQ:
        if (s->v)
            return s->v;
        *rc = host->set_error(host, DT_ERR_NOT_FOUND,
                              "%s: unit '%s': the sgd optimizer keeps no exp_avg_sq (second "
                              "moment); its momentum is state exp_avg",
                              what, s->model->units[unit].name);
        return NULL;
    default:
        *rc = host->set_error(host, DT_ERR_INVALID, "%s: unit '%s': unknown state kind %d",
                              what, s->model->units[unit].name, kind);
        return NULL;
    }
}

int ddp_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                     dt_range_t *out, uint32_t cap, uint32_t *n)
{
    *n = 0;
    if (purpose != DT_RANGES_HELD && purpose != DT_RANGES_SAVE)
        return s->host->set_error(s->host, DT_ERR_INVALID, "state_ranges: unknown purpose %d",
                                  purpose);
    int rc;
    if (!state_buffer(s, unit, kind, "state_ranges", &rc)) {
        /* SGD has no second moment: nothing held, nothing to save */
        if (rc == DT_ERR_NOT_FOUND)
            return DT_OK;
        return rc;
    }
    uint64_t numel = s->model->units[unit].numel;
    dt_range_t r = purpose == DT_RANGES_HELD
                       ? (dt_range_t){0, numel}
                       : dt_range_split(numel, (uint32_t)s->size, (uint32_t)s->rank);
    if (r.count == 0)
        return DT_OK;
    if (cap > 0 && out)
        out[0] = r;
    *n = 1;
    return DT_OK;
}

/* Resolve unit/kind/range to a device pointer, checking the range. */
static float *state_ptr(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                        const void *buf, const char *what, int *rc)
{
    float *base = state_buffer(s, unit, kind, what, rc);
    if (!base)
        return NULL;
    const dt_unit_desc_v1_t *u = &s->model->units[unit];
    if (r.count > u->numel || r.offset > u->numel - r.count) {
        *rc = s->host->set_error(s->host, DT_ERR_INVALID,
                                 "%s: unit '%s' state %s: range [%llu, +%llu) outside the "
                                 "unit's %llu elements", what, u->name, kind_name(kind),
                                 (unsigned long long)r.offset, (unsigned long long)r.count,
                                 (unsigned long long)u->numel);
        return NULL;
    }
    if (r.count > 0 && !buf) {
        *rc = s->host->set_error(s->host, DT_ERR_INVALID, "%s: unit '%s' state %s: NULL buffer",
                                 what, u->name, kind_name(kind));
        return NULL;
    }
    return base + s->layout.offset[unit] + r.offset;
}

static int copy_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, void *dst,
                      const void *src, int dir, const char *what)
{
    const dt_device_ops_v1_t *d = s->dev_ops;
    int rc = DT_OK;
    if (r.count > 0) {
        rc = d->memcpy_async(s->dev, dst, src, r.count * sizeof(float), dir, s->cs);
        if (rc == DT_OK)
            rc = d->stream_sync(s->dev, s->cs);
    }
    if (rc != DT_OK)
        s->host->log(s->host, DT_LOG_ERROR, "%s: unit '%s' state %s [%llu, +%llu): copy failed",
                     what, s->model->units[unit].name, kind_name(kind),
                     (unsigned long long)r.offset, (unsigned long long)r.count);
    return rc;
}

int ddp_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, float *buf)
{
    int rc;
    float *p = state_ptr(s, unit, kind, r, buf, "get_state", &rc);
    if (!p)
        return rc;
    return copy_state(s, unit, kind, r, buf, p, DT_COPY_D2H, "get_state");
}

int ddp_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, const float *buf)
{
    int rc;
    float *p = state_ptr(s, unit, kind, r, buf, "set_state", &rc);
    if (!p)
        return rc;
    return copy_state(s, unit, kind, r, p, buf, DT_COPY_H2D, "set_state");
}

/* init_check = checksum: hash each unit's master parameters and compare
 * across the group; every rank fails alike, naming the first unit that
 * differs. */
static int check_replicas(dt_strategy_t *s)
{
    const dt_host_v1_t *host = s->host;
    uint32_t nu = s->model->n_units;
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
        rc = dt_hash_device(host, s->dev_ops, s->dev, s->cs, s->master + s->layout.offset[u],
                            s->model->units[u].numel * sizeof(float), staging, staging_bytes,
                            &hashes[u]);
    }
    uint32_t first = nu;
    if (rc == DT_OK)
        rc = dt_replica_check(host, s->comm_ops, s->comm, s->dev_ops, s->dev, s->cs, hashes,
                              nu, &first);
    if (rc == DT_OK && first < nu)
        rc = host->set_error(host, DT_ERR_DATA,
                             "init_check: the parameters of unit '%s' (unit %u) differ across "
                             "the %d ranks of the data-parallel group (rank %d's hash "
                             "%016llx); initialise every rank alike (same seed) or set "
                             "init_check = \"broadcast\" to copy rank 0's",
                             s->model->units[first].name, first, s->size, s->rank,
                             (unsigned long long)hashes[first]);
    host->free(host, staging);
    host->free(host, hashes);
    return rc;
}

int ddp_state_loaded(dt_strategy_t *s)
{
    const dt_host_v1_t *host = s->host;
    const dt_device_ops_v1_t *d = s->dev_ops;
    int rc = DT_OK;
    if (s->size > 1 && s->init_broadcast) {
        rc = s->comm_ops->broadcast(s->comm, s->master, s->layout.total, DT_F32, 0, s->cs, NULL);
        if (rc != DT_OK) {
            host->log(host, DT_LOG_ERROR, "state_loaded: rank %d/%d: broadcasting rank 0's "
                      "%llu parameters failed", s->rank, s->size,
                      (unsigned long long)s->layout.total);
            return rc;
        }
    }
    if (s->compute != (void *)s->master) {
        rc = d->cast(s->dev, s->cs, s->compute, DT_BF16, s->master, DT_F32,
                     (int64_t)s->layout.total);
        if (rc != DT_OK) {
            host->log(host, DT_LOG_ERROR, "state_loaded: building the bf16 parameters failed");
            return rc;
        }
    }
    if (s->size > 1 && !s->init_broadcast)
        rc = check_replicas(s);
    if (rc == DT_OK)
        rc = d->stream_sync(s->dev, s->cs);
    return rc;
}
