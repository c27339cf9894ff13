/*
 * plugins/shard/shard_plan.c - flat-shard bookkeeping: units grouped into
 * flat parameters (FSDP's wrap policy; ZeRO's buckets come from
 * dt_bucket_plan), each group padded to an equal shard per rank, and the
 * part of a unit each rank holds.  Pure arithmetic, and the two group
 * collectives over a plan (a group's all-gather and reduce-scatter, which
 * know no engine: shard_gather.c and shard_reduce.c schedule them).
 */
#include "shard_internal.h"

#include <string.h>

uint32_t dt_shard_wrap_plan(const uint64_t *unit_numel, uint32_t n_units,
                            uint64_t min_numel, dt_bucket_span_t *out,
                            uint32_t *group_of_unit)
{
    uint32_t ng = 0;
    int open = 0; /* the last group still takes small units */
    for (uint32_t u = 0; u < n_units; u++) {
        uint64_t n = unit_numel[u];
        if (min_numel <= 1 || n >= min_numel || !open) {
            out[ng] = (dt_bucket_span_t){.unit_lo = u, .unit_hi = u, .bytes = n};
            ng++;
            open = min_numel > 1 && n < min_numel;
        } else {
            out[ng - 1].unit_hi = u;
            out[ng - 1].bytes += n;
            open = out[ng - 1].bytes < min_numel;
        }
        if (group_of_unit)
            group_of_unit[u] = ng - 1;
    }
    return ng;
}

void dt_shard_plan_free(dt_shard_plan_t *p, const dt_host_v1_t *host)
{
    if (!p)
        return;
    host->free(host, p->groups);
    host->free(host, p->group_of_unit);
    host->free(host, p->unit_off);
    host->free(host, p->unit_numel);
    memset(p, 0, sizeof *p);
}

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

int dt_shard_plan_init(dt_shard_plan_t *p, const dt_host_v1_t *host,
                       const dt_model_desc_v1_t *model,
                       const dt_bucket_span_t *spans, uint32_t n_spans,
                       uint32_t ranks, uint32_t align, const uint8_t *alone)
{
    memset(p, 0, sizeof *p);
    uint32_t nu = model->n_units;
    if (ranks == 0)
        return host->set_error(host, DT_ERR_INVALID, "shard plan: 0 ranks");
    if (align == 0)
        align = 1;
    if (!spans)
        n_spans = nu;
    if (n_spans > nu)
        return host->set_error(host, DT_ERR_INVALID,
                               "shard plan: %u groups for %u units", n_spans, nu);
    uint64_t nu1 = (uint64_t)nu + 1;
    p->groups = host->alloc(host, nu1 * sizeof *p->groups, DT_TAG_OTHER);
    p->group_of_unit = host->alloc(host, nu1 * sizeof *p->group_of_unit, DT_TAG_OTHER);
    p->unit_off = host->alloc(host, nu1 * sizeof *p->unit_off, DT_TAG_OTHER);
    p->unit_numel = host->alloc(host, nu1 * sizeof *p->unit_numel, DT_TAG_OTHER);
    if (!p->groups || !p->group_of_unit || !p->unit_off || !p->unit_numel) {
        dt_shard_plan_free(p, host);
        return host->set_error(host, DT_ERR_NOMEM, "shard plan: tables for %u units", nu);
    }
    p->n_units = nu;
    p->ranks = ranks;
    p->align = align;

    /* Which span starts at each unit: spans may come in any order (a
     * bucket plan lists them backwards); they must tile [0, nu). */
    for (uint32_t u = 0; u < nu; u++)
        p->group_of_unit[u] = UINT32_MAX;
    for (uint32_t k = 0; k < n_spans; k++) {
        uint32_t lo = spans ? spans[k].unit_lo : k, hi = spans ? spans[k].unit_hi : k;
        if (lo > hi || hi >= nu) {
            dt_shard_plan_free(p, host);
            return host->set_error(host, DT_ERR_INVALID,
                                   "shard plan: group %u spans units %u..%u of a %u-unit "
                                   "model", k, lo, hi, nu);
        }
        for (uint32_t u = lo; u <= hi; u++) {
            if (p->group_of_unit[u] != UINT32_MAX) {
                uint32_t other = p->group_of_unit[u];
                dt_shard_plan_free(p, host);
                return host->set_error(host, DT_ERR_INVALID,
                                       "shard plan: unit '%s' (%u) is in groups %u and %u",
                                       model->units[u].name, u, other, k);
            }
            p->group_of_unit[u] = k; /* span index for now */
        }
    }
    for (uint32_t u = 0; u < nu; u++)
        if (p->group_of_unit[u] == UINT32_MAX) {
            dt_shard_plan_free(p, host);
            return host->set_error(host, DT_ERR_INVALID,
                                   "shard plan: unit '%s' (%u) is in no group",
                                   model->units[u].name, u);
        }

    /* Groups in unit order; offsets inside each group and across the
     * full and shard layouts. */
    uint32_t g = 0;
    uint64_t full_off = 0, shard_off = 0;
    for (uint32_t u = 0; u < nu;) {
        uint32_t span = p->group_of_unit[u];
        dt_shard_group_t *gr = &p->groups[g];
        memset(gr, 0, sizeof *gr);
        gr->unit_lo = u;
        uint64_t off = 0;
        do {
            off = round_up(off, align);
            p->unit_off[u] = off;
            p->unit_numel[u] = model->units[u].numel;
            off += model->units[u].numel;
            p->group_of_unit[u] = g;
            gr->unit_hi = u;
            u++;
        } while (u < nu && p->group_of_unit[u] == span && !(alone && (alone[u] || alone[u - 1])));
        gr->numel = off;
        gr->shard = dt_shard_size(off, ranks, align);
        if (gr->shard == 0)
            gr->shard = align; /* an empty group still has a (zero) shard */
        gr->padded = gr->shard * ranks;
        gr->full_off = full_off;
        gr->shard_off = shard_off;
        full_off += gr->padded;
        shard_off += gr->shard;
        if (gr->padded > p->max_padded)
            p->max_padded = gr->padded;
        g++;
    }
    p->n_groups = g;
    p->full_total = full_off;
    p->shard_total = shard_off;
    return DT_OK;
}

dt_range_t dt_shard_held(const dt_shard_plan_t *p, uint32_t unit, uint32_t rank,
                         uint64_t *buf_off)
{
    if (buf_off)
        *buf_off = 0;
    if (unit >= p->n_units || rank >= p->ranks)
        return (dt_range_t){0, 0};
    const dt_shard_group_t *g = &p->groups[p->group_of_unit[unit]];
    uint64_t lo = p->unit_off[unit];
    dt_range_t own = {(uint64_t)rank * g->shard, g->shard};
    dt_range_t x = dt_range_intersect(own, (dt_range_t){lo, p->unit_numel[unit]});
    if (x.count == 0)
        return (dt_range_t){0, 0};
    if (buf_off)
        *buf_off = g->shard_off + (x.offset - own.offset);
    return (dt_range_t){x.offset - lo, x.count};
}

static void plan_log(const dt_host_v1_t *host, const dt_shard_plan_t *p, uint32_t group,
                    const char *what, int rc)
{
    const dt_shard_group_t *g = &p->groups[group];
    host->log(host, DT_LOG_ERROR,
              "%s of shard group %u (units %u..%u, %llu elements per rank of %u) failed: %s",
              what, group, g->unit_lo, g->unit_hi, (unsigned long long)g->shard, p->ranks,
              dt_status_name(rc));
}

/* ------------------------------------------------ the group collectives */

int dt_shard_gather(const dt_host_v1_t *host, dt_comm_t *comm, const dt_shard_plan_t *p,
                    uint32_t group, const void *shard, void *full, int dtype, dt_stream_t *stream,
                    dt_comm_req_t **req)
{
    if (group >= p->n_groups)
        return host->set_error(host, DT_ERR_INVALID, "gather: group %u of %u", group,
                               p->n_groups);
    int rc = dt_comm_ops(comm)->all_gather(comm, shard, full, p->groups[group].shard, dtype, stream,
                                           req);
    if (rc != DT_OK)
        plan_log(host, p, group, "all_gather", rc);
    return rc;
}

int dt_shard_reduce(const dt_host_v1_t *host, dt_comm_t *comm, const dt_shard_plan_t *p,
                    uint32_t group, const void *full, void *shard, int dtype, int op,
                    dt_stream_t *stream, dt_comm_req_t **req)
{
    if (group >= p->n_groups)
        return host->set_error(host, DT_ERR_INVALID, "reduce: group %u of %u", group,
                               p->n_groups);
    int rc = dt_comm_ops(comm)->reduce_scatter(comm, full, shard, p->groups[group].shard, dtype, op,
                                  stream, req);
    if (rc != DT_OK)
        plan_log(host, p, group, "reduce_scatter", rc);
    return rc;
}
