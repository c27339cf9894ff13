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
 *   shard     flat-shard plans (groups of units, padded equal shards),
 *             gather / reduce-scatter of a group, and the sharded engine
 *             behind the zero and fsdp plugins
 *   cfg       reading a plugin's config values with defaults
 *   dp        what every data-parallel strategy checks alike (init args,
 *             hooks, the step's start and norm, state by range, estimate)
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

/* ------------------------------------------------------------------------
 * Flat shards: the mechanism ZeRO (stages 1-3) and FSDP share.
 *
 * Units are cut into GROUPS, runs of consecutive units [unit_lo, unit_hi]
 * gathered, reduced and updated as one flat parameter (FSDP's
 * FlatParameter, a ZeRO bucket).  A group's flat space holds its units
 * one after another, each start rounded up to `align` elements; it is
 * padded to ranks * shard elements and rank r holds elements
 * [r * shard, (r + 1) * shard).  Padding and alignment gaps belong to no
 * unit and stay zero, so collectives and norms may run over whole shards.
 *
 *   group 0 (units 0-1)                    group 1 (unit 2)
 *   | u0 ..... |gap| u1 ...... |pad|       | u2 .... |pad  |
 *   |<- rank 0 ->|<- rank 1 ->|<- rank 2 ->|< r0 >|< r1 >|< r2 >|
 *
 * A rank's SHARD BUFFER holds its shard of every group back to back
 * (group.shard_off); a FULL LAYOUT holds every padded group back to back
 * (group.full_off), as a replica or a gathered copy does.
 * --------------------------------------------------------------------- */
typedef struct dt_shard_group {
    uint32_t unit_lo, unit_hi; /* the group holds units [unit_lo, unit_hi] */
    uint64_t numel;     /* flat length, alignment gaps included, no padding */
    uint64_t shard;     /* elements per rank: a multiple of align, >= 1 */
    uint64_t padded;    /* shard * ranks: a gathered copy */
    uint64_t full_off;  /* start in a full layout (sum of earlier padded) */
    uint64_t shard_off; /* start in a rank's shard buffer (sum of earlier shards) */
} dt_shard_group_t;

typedef struct dt_shard_plan {
    uint32_t n_units, n_groups;
    uint32_t ranks;             /* ranks sharing one copy */
    uint32_t align;             /* elements */
    dt_shard_group_t *groups;   /* (n_groups) in unit order */
    uint32_t *group_of_unit;    /* (n_units) */
    uint64_t *unit_off;         /* (n_units) a unit's first element in its group */
    uint64_t *unit_numel;       /* (n_units) its elements */
    uint64_t full_total;        /* sum of padded */
    uint64_t shard_total;       /* sum of shard: one rank's shard buffer */
    uint64_t max_padded;        /* the largest gathered group */
} dt_shard_plan_t;

/* FSDP's size-based wrap policy over units in model order: a unit of at
 * least `min_numel` elements is a group of its own; runs of smaller units
 * are merged until their group reaches min_numel (a run that ends at a
 * large unit or at the model's end may stay below it).  min_numel <= 1:
 * every unit alone.  `out` has room for
 * n_units spans; `group_of_unit` (may be NULL) receives each unit's group.
 * Returns the number of groups. */
uint32_t dt_shard_wrap_plan(const uint64_t *unit_numel, uint32_t n_units,
                            uint64_t min_numel, dt_bucket_span_t *out,
                            uint32_t *group_of_unit);

/* Build the plan of `model` cut into `n_spans` groups (`spans` in any
 * order, e.g. from dt_bucket_plan or dt_shard_wrap_plan; NULL: one group
 * per unit) over `ranks` ranks.  The spans must cover every unit exactly
 * once: DT_ERR_INVALID naming the unit otherwise.  Tables come from
 * host->alloc; free with dt_shard_plan_free. */
int dt_shard_plan_init(dt_shard_plan_t *p, const dt_host_v1_t *host,
                       const dt_model_desc_v1_t *model,
                       const dt_bucket_span_t *spans, uint32_t n_spans,
                       uint32_t ranks, uint32_t align);
void dt_shard_plan_free(dt_shard_plan_t *p, const dt_host_v1_t *host);

/* The part of `unit`'s flat space that `rank` holds (count 0: none), and
 * in *buf_off (may be NULL) where it starts in that rank's shard buffer.
 * Over rank = 0..ranks-1 the results partition [0, unit.numel). */
dt_range_t dt_shard_held(const dt_shard_plan_t *p, uint32_t unit,
                         uint32_t rank, uint64_t *buf_off);

/* Start the all_gather of group `group`: every rank's `shard` (shard
 * elements of `dtype`; may alias full + rank * shard, in place) into
 * `full` (padded elements), on `stream`.  `req` as in comm.h (NULL:
 * blocking).  A failure is logged naming the group's units. */
int dt_shard_gather(const dt_host_v1_t *host, const dt_comm_ops_v1_t *cops,
                    dt_comm_t *comm, const dt_shard_plan_t *p, uint32_t group,
                    const void *shard, void *full, int dtype,
                    dt_stream_t *stream, dt_comm_req_t **req);

/* Start the reduce_scatter of group `group`'s gradients: `full` (padded
 * f32, every rank's own) reduced with `op` (DT_OP_AVG: the data-parallel
 * mean), this rank's block into `shard` (shard f32; may alias
 * full + rank * shard, in place). */
int dt_shard_reduce(const dt_host_v1_t *host, const dt_comm_ops_v1_t *cops,
                    dt_comm_t *comm, const dt_shard_plan_t *p, uint32_t group,
                    const float *full, float *shard, int op,
                    dt_stream_t *stream, dt_comm_req_t **req);

/* ------------------------------------------------------------------------
 * The sharded data-parallel engine: one implementation of ZeRO-1/2/3 and
 * FSDP's FULL_SHARD / SHARD_GRAD_OP / NO_SHARD / HYBRID_SHARD; a plugin
 * is a configuration over it (a dt_shard_configure_fn filling a
 * dt_shard_cfg_t) and an ops table whose slots are the engine's own
 * functions (DT_SHARD_STRATEGY_OPS, at the end of this header).
 *
 * What it keeps, per rank, with S = one shard buffer (plan.shard_total)
 * and F = a full layout (plan.full_total):
 *   params   replicated: compute copy F (param dtype), all-gathered after
 *            every step;  sharded: compute shard S, groups all-gathered
 *            into transient buffers (tag comm) around their hooks, or kept
 *            gathered (persistent: below persist_numel, tag params)
 *            + the f32 master shard S when the compute dtype is bf16
 *   grads    full: f32 F, reduce-scattered once per step (final
 *            micro-step);  sharded: f32 shard S; during backward a group
 *            accumulates into a transient full f32 buffer (tag comm) that
 *            is reduce-scattered and added to the shard when the group's
 *            gradient for the micro-step is complete (last_use)
 *   optim    the optimizer moments of S (f32)
 * HYBRID: the group is cut into shard groups of `shard_ranks` (comm
 * split), shards replicated across them; a shard's gradient is
 * all-reduced across its replicas after the final micro-step.
 * --------------------------------------------------------------------- */
/* Opaque.  The engine IS a strategy instance (dt_strategy_t), so its
 * functions fit dt_strategy_ops_v1_t's slots as they are; a plugin built
 * on it keeps no instance struct of its own. */
typedef struct dt_strategy dt_shard_t;

typedef struct dt_shard_cfg {
    const char *what;            /* "zero stage 3", for messages and notes */
    int32_t params_replicated;   /* 1: compute params replicated (ZeRO-1/2) */
    int32_t grads_full;          /* 1: full gradient buffer (ZeRO-1) */
    int32_t reshard_after_forward; /* sharded params: free a group's
                                  * gathered copy after forward (else keep
                                  * it until its gradient is reduced) */
    int32_t overlap;             /* start reductions during backward */
    uint32_t shard_ranks;        /* ranks per shard group; 0: the whole
                                  * group (must divide the group size) */
    const dt_bucket_span_t *spans; /* the groups; NULL: one per unit */
    uint32_t n_spans;
    uint32_t prefetch_fwd;       /* groups gathered ahead in forward */
    uint32_t prefetch_bwd;       /* groups gathered ahead in backward */
    int32_t prefetch_bwd_post;   /* 1: backward prefetch after a group's
                                  * backward (FSDP BACKWARD_POST) */
    uint64_t prefetch_numel;     /* at most this many elements ahead; 0: no cap */
    uint32_t max_gathers;        /* all-gathers in flight; 0: no cap */
    uint32_t max_reduces;        /* reductions in flight (each holds its
                                  * group's gradient buffer); 0: no cap */
    uint64_t persist_numel;      /* sharded params: groups of fewer elements
                                  * stay gathered (refreshed once per step) */
    uint64_t max_reduce_numel;   /* gradient elements in flight; 0: no cap
                                  * (one reduction is always allowed) */
    uint64_t gather_numel;       /* replicated params: elements all-gathered
                                  * at a time after the step; 0: no cap */
} dt_shard_cfg_t;

/* Create an engine for `args` (the strategy's init arguments) and `cfg`;
 * collective over args->comm when hybrid (comm split).  DT_ERR_CONFIG when
 * shard_ranks does not divide the group, naming both numbers. */
int dt_shard_create(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                    const dt_shard_cfg_t *cfg, dt_shard_t **out);
void dt_shard_destroy(dt_shard_t *e);

/* The strategy hooks (strategy.h), same contracts. */
int dt_shard_begin_step(dt_shard_t *e, int64_t step);
int dt_shard_pre_forward(dt_shard_t *e, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out);
int dt_shard_post_forward(dt_shard_t *e, const dt_hook_v1_t *h);
int dt_shard_pre_backward(dt_shard_t *e, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out);
int dt_shard_post_backward(dt_shard_t *e, const dt_hook_v1_t *h);
int dt_shard_step(dt_shard_t *e, const dt_step_args_v1_t *args, dt_step_result_v1_t *out);
/* HELD: this rank's shard of the unit (one range, or none).  SAVE: the
 * held shard split evenly across its replicas, so over the whole group
 * SAVE ranges partition [0, numel) exactly once. */
int dt_shard_state_ranges(dt_shard_t *e, uint32_t unit, int kind, int purpose,
                          dt_range_t *out, uint32_t cap, uint32_t *n);
int dt_shard_get_state(dt_shard_t *e, uint32_t unit, int kind, dt_range_t r, float *buf);
int dt_shard_set_state(dt_shard_t *e, uint32_t unit, int kind, dt_range_t r,
                       const float *buf);
int dt_shard_state_loaded(dt_shard_t *e);

/* The engine's plan (read-only) and its group geometry. */
const dt_shard_plan_t *dt_shard_get_plan(const dt_shard_t *e);
/* This rank's index in its shard group and the shard group's size, its
 * replica index and the number of replicas. */
void dt_shard_topology(const dt_shard_t *e, uint32_t *shard_rank, uint32_t *shard_ranks,
                       uint32_t *replica, uint32_t *replicas);

/* Predict per-rank memory for `args` under `cfg`:
 *   params, grads, optimizer: what dt_shard_create allocates, counted with
 *     args' element sizes (param_bytes for the compute copy, 4 for the
 *     master when param_bytes == 2, grad_bytes per gradient element the
 *     engine keeps, optim_bytes per owned element minus the master);
 *     the engine itself keeps f32 gradients, so grad_bytes = 4 predicts it
 *   comm: the peak of transient gather and gradient buffers, and
 *     comm_bytes_per_step (ring algorithms: what this rank sends), both
 *     found by replaying one step of the core's hook order (every unit
 *     forward, the first unit re-entered inside the last: GPT-2's tied
 *     embedding; backward in reverse, n_micro micro-steps) against a
 *     counting device and communicator: the engine's own schedule
 *   activations: args->act_bytes;  other: the norm slot. */
int dt_shard_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *args,
                      const dt_shard_cfg_t *cfg, dt_estimate_v1_t *out);

/* ------------------------------------------------------------------------
 * Configuration values a plugin reads through host->cfg_* (its declared
 * keys).  A key the host does not know (DT_ERR_NOT_FOUND) takes `def`;
 * any other failure is DT_ERR_CONFIG "<key>: cannot read (<status>)".
 * --------------------------------------------------------------------- */

/* *out = the integer; DT_ERR_CONFIG "<key> = <v>: must be >= <min>" below. */
int dt_cfg_int(const dt_host_v1_t *host, const char *key, int64_t def, int64_t min,
               int64_t *out);
/* *out = 0 or 1. */
int dt_cfg_bool(const dt_host_v1_t *host, const char *key, int def, int *out);
int dt_cfg_float(const dt_host_v1_t *host, const char *key, double def, double *out);
/* *out: the core's string (valid until finalize), or `def`. */
int dt_cfg_string(const dt_host_v1_t *host, const char *key, const char *def,
                  const char **out);
/* *out = the string's index in `choices` ("A|B|C"); another value is
 * DT_ERR_CONFIG "<key> = \"<v>\" is not one of the valid choices: A, B, C". */
int dt_cfg_enum(const dt_host_v1_t *host, const char *key, const char *def,
                const char *choices, int *out);

/* ------------------------------------------------------------------------
 * Data-parallel basics: what every data-parallel strategy (ddp, the
 * sharded engine) checks and keeps alike, so the checks and their messages
 * are written once.  A strategy puts a dt_dp_t first in its instance.
 * --------------------------------------------------------------------- */
/* A strategy's init arguments read under the growth rule (abi.h), with
 * the model and optimizer descriptions they point to: init.model and
 * init.optim point at the copies here, so nothing reads the caller's
 * structs past their struct_size. */
typedef struct dt_strategy_args {
    dt_strategy_init_v1_t init;
    dt_model_desc_v1_t model;
    dt_optim_desc_v1_t optim;
} dt_strategy_args_t;
/* DT_ERR_ABI / DT_ERR_UNSUPPORTED from the rule; DT_ERR_INVALID for a NULL
 * model or optim.  Checks nothing else. */
int dt_strategy_args_read(const dt_host_v1_t *host, const dt_strategy_init_v1_t *in,
                          dt_strategy_args_t *out);

typedef struct dt_dp {
    const dt_host_v1_t *host;
    const dt_device_ops_v1_t *dev_ops;
    dt_device_t *dev;
    dt_stream_t *cs;                 /* the core's compute stream */
    const dt_comm_ops_v1_t *comm_ops;
    dt_comm_t *comm;                 /* the data-parallel group */
    int32_t rank, size;              /* in comm */
    const dt_model_desc_v1_t *model; /* == &args.model */
    dt_optim_desc_v1_t optim;        /* == args.optim */
    dt_strategy_args_t args;         /* the init args as read */
    uint32_t *fwd_depth, *bwd_depth; /* (n_units) open pre_* hooks per unit */
} dt_dp_t;

/* Check `args` (struct_size, the NULL pointers, n_micro >= 1, param_dtype
 * f32 or bf16 (DT_ERR_UNSUPPORTED "<what> keeps f32 or bf16 compute
 * parameters"), the optimizer kind, every unit valid and at its index),
 * then fill `b`: rank and size from the group, zeroed hook depths (host
 * memory).  On failure `b` holds what was set; dt_dp_free it either way. */
int dt_dp_init(dt_dp_t *b, const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
               const char *what);
void dt_dp_free(dt_dp_t *b);

/* Hook bookkeeping: every hook and the buffers `out` enter fills are
 * checked under the growth rule (abi.h; out's params and grads cleared);
 * enter (pre_forward / pre_backward) checks the hook
 * (unit in range; backward: micro < n_micro, not a no-grad pass) and
 * counts the unit open; leave (post_*) checks and closes it, refusing a
 * post without its pre.  DT_ERR_INVALID naming the unit. */
int dt_dp_hook_enter(dt_dp_t *b, const dt_hook_v1_t *h, int backward,
                     dt_unit_buffers_v1_t *out);
int dt_dp_hook_leave(dt_dp_t *b, const dt_hook_v1_t *h, int backward);
/* Close every hook (begin_step: an abandoned step may leave some open). */
void dt_dp_hooks_reset(dt_dp_t *b);

/* Start of step(): args and *out checked under the growth rule, out's
 * fields zeroed; DT_ERR_INVALID for an AdamW step count
 * < 1 or a unit still inside a pre_* hook. */
int dt_dp_step_check(const dt_dp_t *b, const dt_step_args_v1_t *args, dt_step_result_v1_t *out);
/* The gradient norm sqrt(sumsq) into *out and the optimizer step it
 * implies (lr and t from args, grad_scale the clip coefficient).  A
 * non-finite norm sets out->nonfinite and logs that the update is skipped:
 * the caller then returns DT_OK without updating. */
dt_optim_step_t dt_dp_step_norm(const dt_dp_t *b, const dt_step_args_v1_t *args, double sumsq,
                                dt_step_result_v1_t *out);

/* "params", "exp_avg", "exp_avg_sq" ("unknown" otherwise). */
const char *dt_state_kind_name(int kind);
/* state_ranges' argument check (*n = 0 first): purpose HELD or SAVE,
 * unit in range, kind known.  DT_ERR_NOT_FOUND (message set) for
 * exp_avg_sq when the optimizer keeps none (has_v 0): nothing held, the
 * caller answers DT_OK and no range. */
int dt_dp_ranges_check(const dt_dp_t *b, uint32_t unit, int kind, int purpose, int has_v,
                       uint32_t *n);
/* state_ranges' answer of at most one range: *n = 0 when r is empty. */
int dt_dp_ranges_one(dt_range_t r, dt_range_t *out, uint32_t cap, uint32_t *n);
/* get/set_state's argument check: unit and kind as dt_dp_ranges_check
 * (DT_ERR_NOT_FOUND for a missing exp_avg_sq), r inside the unit, `buf`
 * not NULL when r is not empty.  `what`: "get_state" or "set_state". */
int dt_dp_state_check(const dt_dp_t *b, uint32_t unit, int kind, int has_v, dt_range_t r,
                      const void *buf, const char *what);
/* Copy r.count f32 of state between host and device (`dir` DT_COPY_D2H
 * or H2D) on the compute stream and wait; a failure is logged naming the
 * unit, kind and range.  Blocking. */
int dt_dp_state_copy(const dt_dp_t *b, uint32_t unit, int kind, dt_range_t r, void *dst,
                     const void *src, int dir, const char *what);

/* Read estimate arguments under the growth rule into *args, and the model
 * they point to into *model (args->model = model), then check them: a
 * model, group_size >= 1, param_bytes 2 or 4 (DT_ERR_INVALID). */
int dt_dp_estimate_read(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,
                        dt_estimate_args_v1_t *args, dt_model_desc_v1_t *model);
/* A zeroed estimate with struct_size and n_tags of this build: a strategy
 * fills it, then hands it to the caller with dt_result_write (host.h). */
void dt_estimate_begin(dt_estimate_v1_t *e);
/* The persistent state of a rank, in elements: `compute` parameters at
 * param_bytes (+ `owned` f32 masters when param_bytes is 2), `grads` at
 * grad_bytes, `owned` optimizer elements at optim_bytes less the master
 * already counted; activations = act_bytes.  Sets those four tags only. */
void dt_dp_estimate_state(const dt_estimate_args_v1_t *args, uint64_t compute, uint64_t owned,
                          uint64_t grads, dt_estimate_v1_t *out);

/* ------------------------------------------------------------------------
 * A strategy plugin over the sharded engine: its config keys, a
 * configure function, and
 *
 *     static int zero_init(const dt_host_v1_t *host,
 *                          const dt_strategy_init_v1_t *args,
 *                          dt_strategy_t **out)
 *     {
 *         return dt_shard_init(host, args, zero_configure, out);
 *     }
 *     (likewise zero_estimate with dt_shard_estimate_with)
 *     static const dt_strategy_ops_v1_t zero_ops = {
 *         .info = DT_PLUGIN_INFO(...), .init = zero_init,
 *         .estimate = zero_estimate, DT_SHARD_STRATEGY_OPS};
 * --------------------------------------------------------------------- */

/* Read the plugin's keys through `host`, check them against a
 * data-parallel group of `world` ranks (0: not known, init without a
 * communicator) and fill `cfg` (zeroed) for `model`.
 * `unit_numel` holds every unit's numel; `spans` (n_units entries) is
 * scratch for cfg->spans, valid until the engine is created. */
typedef int (*dt_shard_configure_fn)(const dt_host_v1_t *host,
                                     const dt_model_desc_v1_t *model, int32_t world,
                                     const uint64_t *unit_numel, dt_bucket_span_t *spans,
                                     dt_shard_cfg_t *cfg);

/* The plugin's init: check `args`, configure for the group's size, create
 * the engine (*out is the instance). */
int dt_shard_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                  dt_shard_configure_fn configure, dt_shard_t **out);
/* The plugin's estimate: configure for args->group_size, dt_shard_estimate. */
int dt_shard_estimate_with(const dt_host_v1_t *host, const dt_estimate_args_v1_t *args,
                           dt_shard_configure_fn configure, dt_estimate_v1_t *out);

/* The ops slots that are the engine's functions (designated initializers). */
#define DT_SHARD_STRATEGY_OPS                         \
    .finalize = dt_shard_destroy,                     \
    .begin_step = dt_shard_begin_step,                \
    .pre_forward = dt_shard_pre_forward,              \
    .post_forward = dt_shard_post_forward,            \
    .pre_backward = dt_shard_pre_backward,            \
    .post_backward = dt_shard_post_backward,          \
    .step = dt_shard_step,                            \
    .state_ranges = dt_shard_state_ranges,            \
    .get_state = dt_shard_get_state,                  \
    .set_state = dt_shard_set_state,                  \
    .state_loaded = dt_shard_state_loaded

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_HELPERS_H */
