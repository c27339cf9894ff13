/*
 * sdk/lib/dt_flat.c - flat buffers: the layout of every unit's slice in
 * one allocation, and zeroed device allocations.
 */
#include "dtrain/sdk/flat.h"

#include <string.h>

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

int dt_alloc_zeroed(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s, uint64_t elems,
                    int dtype, int tag, const char *what, void **out)
{
    *out = NULL;
    size_t es = dt_dtype_size(dtype);
    if (es == 0)
        return host->set_error(host, DT_ERR_INVALID, "allocating '%s': unknown dtype %d", what,
                               dtype);
    uint64_t bytes = elems * es;
    void *p = NULL;
    int rc = dt_device_ops(dev)->alloc(dev, bytes, tag, &p);
    if (rc != DT_OK) {
        host->log(host, DT_LOG_ERROR, "allocating %s (%llu bytes, tag %s) failed", what,
                  (unsigned long long)bytes, dt_mem_tag_name(tag));
        return rc;
    }
    rc = dt_device_ops(dev)->memset_async(dev, p, 0, bytes, s);
    if (rc != DT_OK) {
        host->log(host, DT_LOG_ERROR, "zeroing %s failed", what);
        dt_device_ops(dev)->free(dev, p);
        return rc;
    }
    *out = p;
    return DT_OK;
}

int dt_flat_alloc(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s,
                  const dt_flat_layout_t *l, int dtype, int tag, const char *what, void **out)
{
    return dt_alloc_zeroed(host, dev, s, l->total, dtype, tag, what, out);
}
