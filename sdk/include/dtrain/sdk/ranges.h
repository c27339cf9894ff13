/*
 * dtrain/sdk/ranges.h - ranges of a unit's flat index space (even
 * partitions, padded equal shards, intersections) and the tensor pieces a
 * range touches (per-tensor weight decay on a shard).  Pure arithmetic.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Part of the SDK helper library (dtrain/sdk_helpers.h says how to link
 * it and the conventions every helper follows).
 */
#ifndef DTRAIN_SDK_RANGES_H
#define DTRAIN_SDK_RANGES_H

#include <stdint.h>

#include "dtrain/host.h"
#include "dtrain/strategy.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Part `index` of `n` elements cut into `parts` contiguous parts whose
 * counts differ by at most one (the first n % parts parts get one more).
 * Across index = 0..parts-1 the results partition [0, n) exactly.
 * parts == 0 or index >= parts gives {0, 0}. */
dt_range_t dt_range_split(uint64_t n, uint32_t parts, uint32_t index);

/* Equal shard length for `n` elements over `parts` ranks, rounded up to a
 * multiple of `align` elements (0 or 1: no rounding): what reduce_scatter /
 * all_gather need, the flat space being padded to parts * shard. */
uint64_t dt_shard_size(uint64_t n, uint32_t parts, uint64_t align);

/* Intersection of two ranges; count 0 (offset = max start) when disjoint. */
dt_range_t dt_range_intersect(dt_range_t a, dt_range_t b);

/* ------------------------------------------------------------------------
 * Pieces: the parts of a unit's tensors inside a range.
 *
 *     dt_piece_iter_t it;
 *     dt_piece_t p;
 *     dt_piece_iter_init(&it, unit, shard);
 *     while (dt_piece_iter_next(&it, &p))
 *         decay = (p.desc->flags & DT_PARAM_NO_DECAY) ? 0 : wd;
 *
 * Elements of the range no tensor covers (there should be none in a
 * well-formed unit) are skipped.
 * --------------------------------------------------------------------- */
typedef struct dt_piece {
    uint32_t param;                  /* index into unit->params */
    uint32_t reserved0;
    const dt_param_desc_v1_t *desc;  /* &unit->params[param] */
    uint64_t offset;       /* first element, in the unit's flat space */
    uint64_t count;        /* elements */
    uint64_t range_offset; /* offset - range.offset: index into a buffer
                            * that holds only the range (a shard) */
    uint64_t tensor_offset;/* offset - desc->offset: index in the tensor */
} dt_piece_t;

typedef struct dt_piece_iter {
    const dt_unit_desc_v1_t *unit;
    dt_range_t range;
    uint32_t next;         /* next tensor to look at */
    uint32_t reserved0;
} dt_piece_iter_t;

void dt_piece_iter_init(dt_piece_iter_t *it, const dt_unit_desc_v1_t *unit,
                        dt_range_t range);
/* 1 and *out filled while pieces remain, then 0.  Pieces come in offset
 * order (tensors are ordered by offset). */
int dt_piece_iter_next(dt_piece_iter_t *it, dt_piece_t *out);

/* Check a unit description once at init: tensors ordered by offset, inside
 * [0, unit.numel), not overlapping, ndim in 1..4, numel == product of the
 * shape (unsplit tensors only).  DT_ERR_INVALID naming unit and tensor. */
int dt_unit_validate(const dt_host_v1_t *host, const dt_unit_desc_v1_t *unit);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_RANGES_H */
