/*
 * sdk/lib/dt_flat.c - the bookkeeping of flat index spaces: ranges and
 * shards, the tensor pieces a range touches, flat multi-unit buffers and
 * gradient buckets.  Pure arithmetic except dt_flat_alloc.
 */
#include "dtrain/sdk_helpers.h"

#include <string.h>

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

/* ---- pieces ---- */

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

/* ---- flat layouts ---- */

int dt_flat_layout_init(dt_flat_layout_t *l, const dt_host_v1_t *host,
                        const uint64_t *counts, uint32_t n_units, uint32_t align)
{
    memset(l, 0, sizeof *l);
    if (align == 0)
        align = 1;
    l->offset = host->alloc(host, ((uint64_t)n_units + 1) * sizeof(uint64_t), DT_TAG_OTHER);
    l->count = host->alloc(host, ((uint64_t)n_units + 1) * sizeof(uint64_t), DT_TAG_OTHER);
    if (!l->offset || !l->count) {
        host->free(host, l->offset);
        host->free(host, l->count);
        l->offset = l->count = NULL;
        return host->set_error(host, DT_ERR_NOMEM, "flat layout: tables for %u units",
                               n_units);
    }
    l->n_units = n_units;
    l->align = align;
    uint64_t off = 0;
    for (uint32_t u = 0; u < n_units; u++) {
        off = (off + align - 1) / align * align;
        l->offset[u] = off;
        l->count[u] = counts[u];
        off += counts[u];
    }
    /* the total is rounded too, so a buffer's end keeps the alignment and
     * back-to-back layouts could share an allocation */
    off = (off + align - 1) / align * align;
    l->offset[n_units] = off;
    l->total = off;
    return DT_OK;
}

int dt_flat_layout_model(dt_flat_layout_t *l, const dt_host_v1_t *host,
                         const dt_model_desc_v1_t *model, uint32_t align)
{
    uint64_t *counts = host->alloc(host, ((uint64_t)model->n_units + 1) * sizeof(uint64_t),
                                   DT_TAG_OTHER);
    if (!counts)
        return host->set_error(host, DT_ERR_NOMEM, "flat layout: counts for %u units",
                               model->n_units);
    for (uint32_t u = 0; u < model->n_units; u++)
        counts[u] = model->units[u].numel;
    int rc = dt_flat_layout_init(l, host, counts, model->n_units, align);
    host->free(host, counts);
    return rc;
}

void dt_flat_layout_free(dt_flat_layout_t *l, const dt_host_v1_t *host)
{
    if (!l)
        return;
    host->free(host, l->offset);
    host->free(host, l->count);
    memset(l, 0, sizeof *l);
}

int dt_flat_alloc(const dt_host_v1_t *host, const dt_device_ops_v1_t *ops,
                  dt_device_t *dev, dt_stream_t *s, const dt_flat_layout_t *l,
                  int dtype, int tag, const char *what, void **out)
{
    *out = NULL;
    size_t es = dt_dtype_size(dtype);
    if (es == 0)
        return host->set_error(host, DT_ERR_INVALID, "flat buffer '%s': unknown dtype %d",
                               what, dtype);
    uint64_t bytes = l->total * es;
    void *p = NULL;
    int rc = ops->alloc(dev, bytes, tag, &p);
    if (rc != DT_OK) {
        host->log(host, DT_LOG_ERROR, "allocating flat buffer '%s' (%llu bytes, tag %s) failed",
                  what, (unsigned long long)bytes, dt_mem_tag_name(tag));
        return rc;
    }
    rc = ops->memset_async(dev, p, 0, bytes, s);
    if (rc != DT_OK) {
        host->log(host, DT_LOG_ERROR, "zeroing flat buffer '%s' failed", what);
        ops->free(dev, p);
        return rc;
    }
    *out = p;
    return DT_OK;
}

/* ---- buckets ---- */

uint32_t dt_bucket_plan(const uint64_t *unit_bytes, uint32_t n_units,
                        uint64_t cap_bytes, dt_bucket_span_t *out,
                        uint32_t *bucket_of_unit)
{
    uint32_t nb = 0;
    for (uint32_t k = n_units; k-- > 0;) {
        if (nb == 0 || (out[nb - 1].bytes > 0 && out[nb - 1].bytes + unit_bytes[k] > cap_bytes)) {
            out[nb] = (dt_bucket_span_t){.unit_lo = k, .unit_hi = k, .bytes = 0};
            nb++;
        }
        out[nb - 1].unit_lo = k;
        out[nb - 1].bytes += unit_bytes[k];
        if (bucket_of_unit)
            bucket_of_unit[k] = nb - 1;
    }
    return nb;
}
