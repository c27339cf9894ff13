/*
 * dtrain/sdk/flat.h - flat buffers: every unit's slice in one device
 * allocation (llm.c's malloc_and_point_parameters), with a pointer per
 * unit and per tensor.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * A layout places slice u (counts[u] elements: a unit's numel for a
 * replica, a shard length for ZeRO/FSDP) at element offset[u], each start
 * rounded up to `align` elements, so per-unit pointers keep the device's
 * allocation alignment.  Several buffers (params, grads, moments) share one
 * layout.  Gaps between slices belong to no unit: buffers are allocated
 * zeroed and kept zero (gradients are zeroed as a whole each step), so a
 * whole-buffer reduction or norm may run straight over them.
 *
 * Part of the SDK helper library (dtrain/sdk_helpers.h says how to link
 * it and the conventions every helper follows).
 */
#ifndef DTRAIN_SDK_FLAT_H
#define DTRAIN_SDK_FLAT_H

#include <stdint.h>

#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/strategy.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_flat_layout {
    uint32_t n_units;
    uint32_t align;     /* elements */
    uint64_t *offset;   /* (n_units + 1): slice starts; offset[n_units] is
                         * the total, padding included */
    uint64_t *count;    /* (n_units): slice lengths */
    uint64_t total;     /* == offset[n_units] */
} dt_flat_layout_t;

/* Build a layout of `n_units` slices of `counts[u]` elements.  Tables come
 * from host->alloc (DT_TAG_OTHER); free with dt_flat_layout_free. */
int dt_flat_layout_init(dt_flat_layout_t *l, const dt_host_v1_t *host,
                        const uint64_t *counts, uint32_t n_units,
                        uint32_t align);
/* The same with counts = every unit's numel. */
int dt_flat_layout_model(dt_flat_layout_t *l, const dt_host_v1_t *host,
                         const dt_model_desc_v1_t *model, uint32_t align);
void dt_flat_layout_free(dt_flat_layout_t *l, const dt_host_v1_t *host);

/* Allocate `elems` elements of `dtype` on the device, tagged `tag`, and
 * zero them on stream `s` (ordered; not waited for).  On failure *out is
 * NULL and the error is logged naming `what` ("grads"), the bytes and the
 * tag.  Free with dt_device_ops(dev)->free. */
int dt_alloc_zeroed(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s, uint64_t elems,
                    int dtype, int tag, const char *what, void **out);

/* dt_alloc_zeroed of a whole layout: l->total elements. */
int dt_flat_alloc(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s,
                  const dt_flat_layout_t *l, int dtype, int tag, const char *what, void **out);

/* Pointer to slice `unit` of a flat buffer of `dtype` elements. */
static inline void *dt_flat_unit_ptr(void *base, const dt_flat_layout_t *l,
                                     int dtype, uint32_t unit)
{
    return (char *)base + l->offset[unit] * dt_dtype_size(dtype);
}

/* Pointer to tensor `param` of `unit` in a buffer holding whole units (a
 * replica; a sharded buffer uses dt_piece_t.range_offset instead). */
static inline void *dt_flat_param_ptr(void *base, const dt_flat_layout_t *l,
                                      int dtype, const dt_unit_desc_v1_t *unit,
                                      uint32_t param)
{
    return (char *)dt_flat_unit_ptr(base, l, dtype, unit->index) +
           unit->params[param].offset * dt_dtype_size(dtype);
}

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_FLAT_H */
