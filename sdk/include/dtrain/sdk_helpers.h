/*
 * dtrain/sdk_helpers.h - mechanisms every data-parallel strategy needs,
 * independent of how it replicates or shards (ddp, zero, fsdp share them).
 *
 * Link the static library `dtrain_sdk` (libdtrain_sdk.a, position
 * independent, hidden visibility so a plugin linking it still exports only
 * its entry symbol).  Nothing here is part of the frozen plugin ABI: these
 * are ordinary C functions compiled into the plugin.
 *
 *   ranges    even partitions, padded equal shards, intersections
 *   pieces    walking the tensors a range of a unit's flat space touches
 *             (per-tensor weight decay on a shard)
 *   flat      one device allocation holding every unit's slice (llm.c's
 *             malloc_and_point_parameters), with a pointer per unit/tensor
 *   buckets   grouping units in backward order up to a byte cap
 *   optim     AdamW / SGD over a range, tensor by tensor, with the right
 *             weight decay; the clip coefficient
 *   norm      sum of squares to the host; summed across a group
 *   replica   a 64-bit content hash of device memory and a collective check
 *             that every rank holds the same bytes
 *
 * Conventions: functions that can fail return a dt_status_t and set the
 * message through `host->set_error`, naming the unit/tensor/range.  When a
 * device or comm call fails, its own message (set by that plugin) is kept
 * and the status returned unchanged; the helper logs its context at
 * DT_LOG_ERROR through `host->log` (the host table cannot prepend context
 * to another plugin's message).  Blocking helpers say so.
 */
#ifndef DTRAIN_SDK_HELPERS_H
#define DTRAIN_SDK_HELPERS_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/strategy.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Ranges of a flat index space.
 * --------------------------------------------------------------------- */

/* Part `index` of `n` elements cut into `parts` contiguous parts whose
 * counts differ by at most one (the first n % parts parts get one more).
 * Across index = 0..parts-1 the results partition [0, n) exactly.
 * parts == 0 or index >= parts gives {0, 0}. */
dt_range_t dt_range_split(uint64_t n, uint32_t parts, uint32_t index);

/* Equal shard length for `n` elements over `parts` ranks, rounded up to a
 * multiple of `align` elements (0 or 1: no rounding): what reduce_scatter /
 * all_gather need, the flat space being padded to parts * shard. */
uint64_t dt_shard_size(uint64_t n, uint32_t parts, uint64_t align);

/* The real (unpadded) elements of shard `index` of length `shard`:
 * [index * shard, (index + 1) * shard) clipped to [0, n); count may be 0. */
dt_range_t dt_range_shard(uint64_t n, uint64_t shard, uint32_t index);

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

/* ------------------------------------------------------------------------
 * Flat buffers: every unit's slice in one allocation.
 *
 * A layout places slice u (counts[u] elements: a unit's numel for a
 * replica, a shard length for ZeRO/FSDP) at element offset[u], each start
 * rounded up to `align` elements, so per-unit pointers keep the device's
 * allocation alignment.  Several buffers (params, grads, moments) share one
 * layout.  Gaps between slices belong to no unit: buffers are allocated
 * zeroed and kept zero (gradients are zeroed as a whole each step), so a
 * whole-buffer reduction or norm may run straight over them.
 * --------------------------------------------------------------------- */
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

/* Allocate (l->total) elements of `dtype` on the device, tagged `tag`, and
 * zero them on stream `s` (ordered; not waited for).  Error names `what`
 * ("grads") and the size.  Free with dev_ops->free. */
int dt_flat_alloc(const dt_host_v1_t *host, const dt_device_ops_v1_t *ops,
                  dt_device_t *dev, dt_stream_t *s, const dt_flat_layout_t *l,
                  int dtype, int tag, const char *what, void **out);

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

/* ------------------------------------------------------------------------
 * Buckets: units grouped for one collective each.
 * --------------------------------------------------------------------- */
typedef struct dt_bucket_span {
    uint32_t unit_lo;  /* the bucket holds units [unit_lo, unit_hi] */
    uint32_t unit_hi;
    uint64_t bytes;    /* sum of unit_bytes over its units */
} dt_bucket_span_t;

/* Assign units to buckets in BACKWARD order (the last unit first, the order
 * gradients complete): walking u = n_units-1 .. 0, a unit joins the current
 * bucket unless that would take a non-empty bucket past `cap_bytes`, then a
 * new bucket starts.  A unit larger than the cap gets a bucket of its own;
 * units are never split.  So bucket 0 holds the last units, and every bucket
 * is a contiguous run of units (a contiguous span of a flat layout).
 * `out` has room for n_units spans; `bucket_of_unit` (n_units, may be NULL)
 * receives each unit's bucket.  Returns the number of buckets (0 when
 * n_units == 0). */
uint32_t dt_bucket_plan(const uint64_t *unit_bytes, uint32_t n_units,
                        uint64_t cap_bytes, dt_bucket_span_t *out,
                        uint32_t *bucket_of_unit);

/* ------------------------------------------------------------------------
 * Optimizer over a range.
 * --------------------------------------------------------------------- */

/* f32 state buffers per parameter: AdamW 2 (m, v), SGD 1 (momentum),
 * unknown kind 0. */
uint32_t dt_optim_state_count(int kind);

/* PyTorch's clip_grad_norm_ coefficient: min(1, clip / (norm + 1e-6)) when
 * clip > 0, else 1.  Computed in double, returned as the optimizer kernels'
 * grad_scale. */
float dt_clip_scale(double norm, float clip);

typedef struct dt_optim_step {
    const dt_optim_desc_v1_t *desc; /* kind and hyper-parameters */
    float lr;
    float grad_scale;   /* multiplies every gradient (clip coefficient) */
    int64_t t;          /* 1-based step (AdamW bias correction), >= 1 */
} dt_optim_step_t;

/* Update elements `r` of `unit`'s flat space, enqueued on stream `s`.
 * Buffers hold ONLY the range: param[0] is element r.offset (for a replica
 * pass unit pointer + r.offset).  param, grad, m: (r.count) f32; v:
 * (r.count) f32 for AdamW, ignored (may be NULL) for SGD, whose momentum is
 * `m`.  Each tensor piece gets weight decay desc->weight_decay, or 0 when
 * the tensor has DT_PARAM_NO_DECAY; neighbouring pieces with the same decay
 * go to the device in one call.  DT_ERR_INVALID when r is outside the
 * unit, the kind is unknown, or a needed buffer is NULL. */
int dt_optim_range(const dt_host_v1_t *host, const dt_device_ops_v1_t *ops,
                   dt_device_t *dev, dt_stream_t *s,
                   const dt_unit_desc_v1_t *unit, dt_range_t r, float *param,
                   const float *grad, float *m, float *v,
                   const dt_optim_step_t *st);

/* ------------------------------------------------------------------------
 * Norms.
 * --------------------------------------------------------------------- */

/* *out = sum of x[i]^2 over (n) elements of `dtype`, in double, on the
 * host.  `slot` is device memory for one double (the caller's, reused each
 * step).  Blocking: synchronises stream `s`. */
int dt_norm_sumsq(const dt_host_v1_t *host, const dt_device_ops_v1_t *ops,
                  dt_device_t *dev, dt_stream_t *s, double *slot,
                  const void *x, int dtype, int64_t n, double *out);

/* *sumsq (in: this rank's part; out: the sum over the group), through an
 * all_reduce SUM of one f64 in device memory `slot`.  For strategies whose
 * ranks each own part of the gradient (ZeRO, FSDP); a replica must NOT sum
 * (each element would count `size` times).  Blocking. */
int dt_norm_allreduce(const dt_host_v1_t *host, const dt_comm_ops_v1_t *cops,
                      dt_comm_t *comm, const dt_device_ops_v1_t *ops,
                      dt_device_t *dev, dt_stream_t *s, double *slot,
                      double *sumsq);

/* ------------------------------------------------------------------------
 * Replicas: are the bytes the same on every rank?
 * --------------------------------------------------------------------- */

/* FNV-1a, 64-bit, over 32-bit little-endian words (bytes % 4 trailing bytes
 * one at a time).  Every step is a bijection of the state for a fixed word,
 * so two inputs of the same length differing in ONE word always hash
 * differently.  Incremental: chunks must be multiples of 4 bytes except the
 * last.  Not cryptographic. */
#define DT_HASH64_INIT 0xcbf29ce484222325ull
uint64_t dt_hash64_update(uint64_t h, const void *p, size_t bytes);

/* Hash `bytes` of device memory `x` (continuing from *h), copying through
 * host memory `staging` (`staging_bytes`, >= 8) chunk by chunk on stream
 * `s`.  Blocking. */
int dt_hash_device(const dt_host_v1_t *host, const dt_device_ops_v1_t *ops,
                   dt_device_t *dev, dt_stream_t *s, const void *x,
                   uint64_t bytes, void *staging, uint64_t staging_bytes,
                   uint64_t *h);

/* Collective over `comm`: do all ranks hold the same `hashes` (n)?  Each
 * hash travels as four 16-bit fields, exact in f32, through one all_reduce
 * MAX and one MIN; a field whose MAX != MIN differs somewhere.  *first_diff
 * = the first index that differs on some rank, or n when all agree (the
 * same answer on every rank).  Scratch comes from dev alloc / host alloc
 * (DT_TAG_OTHER) and is freed before return.  Blocking. */
int dt_replica_check(const dt_host_v1_t *host, const dt_comm_ops_v1_t *cops,
                     dt_comm_t *comm, const dt_device_ops_v1_t *ops,
                     dt_device_t *dev, dt_stream_t *s, const uint64_t *hashes,
                     uint32_t n, uint32_t *first_diff);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_HELPERS_H */
