/*
 * sdk/lib/dt_ranges.c - ranges of a flat index space (even partitions,
 * padded equal shards, intersections), the tensor pieces a range touches,
 * and the check of a unit's tensor table.  Pure arithmetic.
 */
#include "dtrain/sdk/ranges.h"

dt_range_t dt_range_split(uint64_t n, uint32_t parts, uint32_t index)
{
    if (parts == 0 || index >= parts)
        return (dt_range_t){0, 0};
    uint64_t base = n / parts, rem = n % parts;
    uint64_t off = (uint64_t)index * base + (index < rem ? index : rem);
    return (dt_range_t){off, base + (index < rem ? 1 : 0)};
}

uint64_t dt_shard_size(uint64_t n, uint32_t parts, uint64_t align)
{
    if (parts == 0)
        return 0;
    uint64_t s = n / parts + (n % parts ? 1 : 0);
    if (align > 1)
        s = (s + align - 1) / align * align;
    return s;
}

dt_range_t dt_range_intersect(dt_range_t a, dt_range_t b)
{
    uint64_t lo = a.offset > b.offset ? a.offset : b.offset;
    uint64_t ea = a.offset + a.count, eb = b.offset + b.count;
    uint64_t hi = ea < eb ? ea : eb;
    return (dt_range_t){lo, hi > lo ? hi - lo : 0};
}

/* ------------------------------------------------------------ pieces */

void dt_piece_iter_init(dt_piece_iter_t *it, const dt_unit_desc_v1_t *unit,
                        dt_range_t range)
{
    it->unit = unit;
    it->range = range;
    it->next = 0;
    it->reserved0 = 0;
}

int dt_piece_iter_next(dt_piece_iter_t *it, dt_piece_t *out)
{
    const dt_unit_desc_v1_t *u = it->unit;
    uint64_t r_end = it->range.offset + it->range.count;
    while (it->next < u->n_params) {
        uint32_t i = it->next++;
        const dt_param_desc_v1_t *p = &u->params[i];
        if (p->offset >= r_end)
            break; /* ordered by offset: nothing later can intersect */
        dt_range_t x = dt_range_intersect(it->range, (dt_range_t){p->offset, p->numel});
        if (x.count == 0)
            continue;
        *out = (dt_piece_t){
            .param = i,
            .desc = p,
            .offset = x.offset,
            .count = x.count,
            .range_offset = x.offset - it->range.offset,
            .tensor_offset = x.offset - p->offset,
        };
        return 1;
    }
    it->next = u->n_params;
    return 0;
}

int dt_unit_validate(const dt_host_v1_t *host, const dt_unit_desc_v1_t *u)
{
    if (u->n_params > 0 && !u->params)
        return host->set_error(host, DT_ERR_INVALID,
                               "unit '%s' (%u): %u tensors but params is NULL",
                               u->name, u->index, u->n_params);
    uint64_t end = 0;
    for (uint32_t i = 0; i < u->n_params; i++) {
        const dt_param_desc_v1_t *p = &u->params[i];
        const char *nm = p->name ? p->name : "?";
        if (p->offset < end)
            return host->set_error(host, DT_ERR_INVALID,
                                   "unit '%s' (%u): tensor '%s' at offset %llu overlaps or "
                                   "precedes the previous tensor (ends at %llu)",
                                   u->name, u->index, nm, (unsigned long long)p->offset,
                                   (unsigned long long)end);
        if (p->numel > u->numel || p->offset > u->numel - p->numel)
            return host->set_error(host, DT_ERR_INVALID,
                                   "unit '%s' (%u): tensor '%s' [%llu, +%llu) runs past the "
                                   "unit's %llu elements",
                                   u->name, u->index, nm, (unsigned long long)p->offset,
                                   (unsigned long long)p->numel, (unsigned long long)u->numel);
        if (p->ndim < 1 || p->ndim > 4)
            return host->set_error(host, DT_ERR_INVALID,
                                   "unit '%s' (%u): tensor '%s' has ndim %d (want 1..4)",
                                   u->name, u->index, nm, p->ndim);
        uint64_t prod = 1;
        for (int32_t d = 0; d < p->ndim; d++)
            prod *= (uint64_t)(p->shape[d] > 0 ? p->shape[d] : 0);
        if (prod != p->numel)
            return host->set_error(host, DT_ERR_INVALID,
                                   "unit '%s' (%u): tensor '%s' has numel %llu but its "
                                   "shape holds %llu",
                                   u->name, u->index, nm, (unsigned long long)p->numel,
                                   (unsigned long long)prod);
        end = p->offset + p->numel;
    }
    return DT_OK;
}
