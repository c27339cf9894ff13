/*
 * plugins/shard/shard.h - the sharded data-parallel engine: one
 * implementation of ZeRO-1/2/3 and FSDP's FULL_SHARD / SHARD_GRAD_OP /
 * NO_SHARD / HYBRID_SHARD.  The zero and fsdp plugins are configurations
 * of it: each turns its config table into a dt_shard_cfg_t (a
 * dt_shard_configure_fn) and embeds the engine, base first, in its own
 * instance (struct dt_strategy); its ops are the thin wrappers at the end
 * of this header.  Built as the static library dtrain_shard, linked into
 * both plugins; not part of the SDK.
 *
 * Where to look:
 *   shard_plan.c      groups of units, padded equal shards, what a rank holds,
 *                     the two collectives that move a group
 *   shard_gather.c    parameters: a group's all-gather before its use (FSDP's
 *                     unit all-gather, ZeRO-3), prefetching, resharding, and
 *                     the all-gather of replicated parameters after a step
 *   shard_reduce.c    gradients: a group's reduce-scatter when backward
 *                     completes it (ZeRO-2/3, FSDP), across replicas (HYBRID)
 *   shard_hooks.c     the unit hooks and the start of a step
 *   shard_step.c      the sharded optimizer step: norm, clip, update
 *   shard_home.c      where the shard lives (dt_shard_home_t, chosen at
 *                     init): the device's buffers - what a gather sends,
 *                     where a reduced block goes, the norm, the update
 *   shard_offload.c   the same slots over an offload tier (ZeRO-Offload:
 *                     optimizer state and gradients; ZeRO-Infinity:
 *                     parameters), for what offload_what names
 *   shard_state.c     checkpoint state by global ranges, state_loaded
 *   shard_engine.c    creating and freeing an engine: groups, buffers,
 *                     the home, the norm plan; waiting for all (drain)
 *   shard_estimate.c  the planner's estimate (a replay of one step)
 *   shard_strategy.c  a strategy plugin over the engine: init, estimate, ops
 */
#ifndef DT_SHARD_H
#define DT_SHARD_H

#include <stdint.h>

#include "dtrain/dtrain.h"
#include "dtrain/sdk/buckets.h"
#include "dtrain/sdk/dp.h"
#include "dtrain/sdk/flat.h"
#include "dtrain/sdk/norm.h"
#include "dtrain/sdk/offload.h"
#include "dtrain/sdk/optim.h"
#include "dtrain/sdk/ranges.h"

/* ------------------------------------------------------------------------
 * The plan (shard_plan.c): flat shards.
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
 * once: DT_ERR_INVALID naming the unit otherwise.  `alone` (NULL, or
 * one entry per unit): a unit with alone[u] set gets a group of its own
 * whatever its span says, so its shards depend on nothing else (a
 * pipeline's tied embedding: both stages must cut it alike, whatever
 * units they hold beside it).  Tables come from host->alloc; free with
 * dt_shard_plan_free. */
int dt_shard_plan_init(dt_shard_plan_t *p, const dt_host_v1_t *host,
                       const dt_model_desc_v1_t *model,
                       const dt_bucket_span_t *spans, uint32_t n_spans,
                       uint32_t ranks, uint32_t align, const uint8_t *alone);
void dt_shard_plan_free(dt_shard_plan_t *p, const dt_host_v1_t *host);

/* The part of `unit`'s flat space that `rank` holds (count 0: none), and
 * in *buf_off (may be NULL) where it starts in that rank's shard buffer.
 * Over rank = 0..ranks-1 the results partition [0, unit.numel). */
dt_range_t dt_shard_held(const dt_shard_plan_t *p, uint32_t unit,
                         uint32_t rank, uint64_t *buf_off);

/* The two collectives that move a group between its sharded and its full
 * form. */

/* Start the all_gather of group `group`: every rank's `shard` (shard
 * elements of `dtype`; may alias full + rank * shard, in place) into
 * `full` (padded elements), on `stream`.  `req` as in comm.h (NULL:
 * blocking).  A failure is logged naming the group's units. */
int dt_shard_gather(const dt_host_v1_t *host, dt_comm_t *comm, const dt_shard_plan_t *p,
                    uint32_t group, const void *shard, void *full, int dtype, dt_stream_t *stream,
                    dt_comm_req_t **req);

/* Start the reduce_scatter of group `group`'s gradients: `full` (padded
 * elements of `dtype`, every rank's own) reduced with `op` (DT_OP_AVG:
 * the data-parallel mean), this rank's block into `shard` (shard elements
 * of `dtype`; may alias full + rank * shard, in place). */
int dt_shard_reduce(const dt_host_v1_t *host, dt_comm_t *comm, const dt_shard_plan_t *p,
                    uint32_t group, const void *full, void *shard, int dtype, int op,
                    dt_stream_t *stream, dt_comm_req_t **req);

/* ------------------------------------------------------------------------
 * The engine.
 *
 * What it keeps, per rank, with S = one shard buffer (plan.shard_total)
 * and F = a full layout (plan.full_total):
 *   params   replicated: compute copy F (param dtype), all-gathered after
 *            every step;  sharded: compute shard S, groups all-gathered
 *            into transient buffers (tag comm) around their hooks, or kept
 *            gathered (persistent: below persist_numel, tag params)
 *            + the f32 master shard S when the compute dtype is bf16/f16
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
    int32_t reduce_dtype;        /* what gradients travel in: DT_F32 (0),
                                  * DT_BF16 or DT_F16 (cast into a wire
                                  * buffer per reduction in flight, tagged
                                  * comm, and back to f32 after) */
    int32_t params_offload_ok;   /* 1: offload_what may name params (zero
                                  * stage 3, fsdp FULL_SHARD) */
    uint32_t plan_offload_what;  /* the planner's replay only (no tier):
                                  * the schedule offload_what would give */
} dt_shard_cfg_t;

/* Per-group and per-reduction bookkeeping (shard_internal.h). */
struct dt_shard_group_state;
struct dt_shard_reduction;
struct dt_shard_engine;

/* Where a rank's shard lives: the slots gather, reduce, step and state
 * call, filled once at init (shard_engine.c) from the device buffers
 * (shard_home.c) and, for what offload_what names, an offload tier
 * (shard_offload.c).  Contracts in shard_internal.h. */
typedef struct dt_shard_home {
    /* parameters: this rank's compute shard of a group for its gather */
    int (*load_ahead)(struct dt_shard_engine *e, uint32_t gi);
    int (*load)(struct dt_shard_engine *e, uint32_t gi, const void **send);
    int (*load_wait)(struct dt_shard_engine *e, uint32_t gi);
    /* gradients: a group's buffer, its reduced block, the step's end, norm */
    int (*grads_buffer)(struct dt_shard_engine *e, uint32_t gi, float **out);
    int (*grads_add)(struct dt_shard_engine *e, uint32_t gi, const float *block,
                     dt_stream_t *stream, int whole);
    int (*grads_end)(struct dt_shard_engine *e);
    int (*grads_sumsq)(struct dt_shard_engine *e, double *out);
    /* the update, the compute copy from the master, checkpoint state */
    int (*update)(struct dt_shard_engine *e, const dt_optim_step_t *st);
    int (*publish)(struct dt_shard_engine *e, const char *when);
    int (*state_get)(struct dt_shard_engine *e, uint32_t unit, int kind, dt_range_t r,
                     uint64_t at, float *buf);
    int (*state_set)(struct dt_shard_engine *e, uint32_t unit, int kind, dt_range_t r,
                     uint64_t at, const float *buf);
} dt_shard_home_t;

/* One engine.  A strategy built on it embeds it FIRST in its instance
 * (the ops wrappers below cast the instance to it).  Read-only outside
 * the engine's files. */
typedef struct dt_shard_engine {
    dt_dp_t dp;                   /* host, device, the whole data-parallel
                                   * group, model, optimizer, hook depths */
    dt_comm_t *scomm;             /* shard group (== dp.comm, a split, or NULL
                                   * when shards are whole: ssize 1) */
    dt_comm_t *rcomm;             /* replicas of a shard (NULL when rsize 1) */
    int32_t own_scomm, own_rcomm; /* split here: finalize them */
    uint32_t srank, ssize;        /* in the shard group */
    uint32_t rrank, rsize;        /* among the replicas */
    dt_shard_cfg_t cfg;           /* spans pointer cleared after planning */
    int32_t pdtype;               /* model->param_dtype */
    uint32_t pes;                 /* its element size */

    dt_shard_plan_t plan;
    struct dt_shard_group_state *g; /* (n_groups) */

    /* persistent state */
    void *replica;                /* params_replicated: full layout, pdtype */
    void *cshard;                 /* sharded params: compute shard, pdtype */
    float *master;                /* f32 master shard, or NULL when it lives
                                   * in cshard / replica (f32 params) */
    float *gshard;                /* grads sharded: f32 shard */
    float *gfull;                 /* grads_full: f32 full layout */
    /* replica and gfull in the shard group's symmetric memory (comm.h
     * sym_alloc; dt_dp_alloc_shared): its gathers into the replica and
     * reduce-scatters out of gfull then skip the staging copies */
    uint8_t sym_replica, sym_gfull;
    float *m, *v;                 /* optimizer moments of the shard (NULL
                                   * when offloaded) */
    double *norm_slot;
    dt_norm_plan_t norm;          /* what this rank's norm sums, in the
                                   * gradient buffer (gfull, else the shard
                                   * buffer): less a pipeline stage's COPY
                                   * units and tensor-parallel duplicates */
    dt_shard_home_t home;         /* where the shard lives */
    /* offload (shard_offload.c, behind `home`): what the tier holds (DT_OFFLOAD_WHAT_*)
     * and, with the optimizer there, the master shard and moments; with
     * the parameters there, the compute shard (in place of cshard) and
     * pinned staging to fill it from a device master */
    uint32_t offload_what;
    dt_offload_state_t off;
    dt_offload_params_t par;      /* params offloaded: the compute shard */
    float *pstage;                /* params without optimizer: pinned f32 */
    uint64_t replay_loaded;       /* the planner's replay: bytes of the
                                   * compute shard its schedule loads from
                                   * the tier (a group still gathered is
                                   * not loaded again) */
    int32_t grads_offloaded;      /* the reduced gradient shard lives in the
                                   * tier too (shard_grads_offloaded), gshard
                                   * is NULL */

    /* hooks */
    uint32_t *final_at;           /* (n_units) micro-step + 1 of the last
                                   * last_use seen this step, 0: none */
    uint32_t n_active;            /* groups with open hooks */
    uint32_t n_gathers;           /* all_gathers in flight */
    uint64_t gather_inflight;     /* their elements */
    int32_t failed;               /* a collective failed: drop, never wait */
    uint64_t gseq;

    /* reductions in flight, oldest first (a ring of cap entries) */
    struct dt_shard_reduction *red;
    uint32_t red_cap, red_head, red_n;
    uint64_t red_numel;           /* elements in flight */

    dt_stream_t *comm_stream;     /* NULL when nothing is communicated */
    dt_event_t *ev_compute;       /* compute -> comm */
    dt_event_t *ev_comm;          /* comm -> compute */
} dt_shard_engine_t;

/* Set up `e` (its memory the caller's, e.g. inside a strategy instance)
 * for `args` (the strategy's init arguments; `ops`: the table the
 * instance starts with, in e->dp, NULL for an engine no handle starts with) and `cfg`; collective over
 * args->comm when hybrid (comm split).  DT_ERR_CONFIG when shard_ranks
 * does not divide the group, naming both numbers.  On failure everything
 * it made is freed again. */
int dt_shard_engine_init(dt_shard_engine_t *e, const dt_strategy_ops_v1_t *ops,
                         const dt_host_v1_t *host,
                         const dt_strategy_init_v1_t *args, const dt_shard_cfg_t *cfg);
/* Free what init made (not `e` itself); safe on a zeroed or freed engine. */
void dt_shard_engine_free(dt_shard_engine_t *e);

/* The strategy hooks (strategy.h), same contracts: shard_hooks.c. */
int dt_shard_begin_step(dt_shard_engine_t *e, int64_t step);
int dt_shard_pre_forward(dt_shard_engine_t *e, const dt_hook_v1_t *h,
                         dt_unit_buffers_v1_t *out);
int dt_shard_post_forward(dt_shard_engine_t *e, const dt_hook_v1_t *h);
int dt_shard_pre_backward(dt_shard_engine_t *e, const dt_hook_v1_t *h,
                          dt_unit_buffers_v1_t *out);
int dt_shard_post_backward(dt_shard_engine_t *e, const dt_hook_v1_t *h);
/* shard_step.c */
int dt_shard_step(dt_shard_engine_t *e, const dt_step_args_v1_t *args,
                  dt_step_result_v1_t *out);
/* shard_state.c.  HELD: this rank's shard of the unit (one range, or
 * none).  SAVE: the held shard split evenly across its replicas, so over
 * the whole group SAVE ranges partition [0, numel) exactly once. */
int dt_shard_state_ranges(dt_shard_engine_t *e, uint32_t unit, int kind, int purpose,
                          dt_range_t *out, uint32_t cap, uint32_t *n);
int dt_shard_get_state(dt_shard_engine_t *e, uint32_t unit, int kind, dt_range_t r,
                       float *buf);
int dt_shard_set_state(dt_shard_engine_t *e, uint32_t unit, int kind, dt_range_t r,
                       const float *buf);
int dt_shard_state_loaded(dt_shard_engine_t *e);

/* Predict per-rank memory for `args` under `cfg`:
 *   params, grads, optimizer: what dt_shard_engine_init allocates, counted
 *     with args' element sizes (param_bytes for the compute copy, 4 for the
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
 * A strategy plugin over the engine (shard_strategy.c): its config keys, a
 * configure function, an instance with the engine first, and
 *
 *     struct dt_strategy {
 *         dt_shard_engine_t engine; // first: the wrappers cast to it
 *     };
 *     static int zero_init(const dt_host_v1_t *host,
 *                          const dt_strategy_init_v1_t *args,
 *                          dt_strategy_t **out)
 *     {
 *         return dt_shard_strategy_init(host, args, &zero_ops, zero_configure,
 *                                       sizeof(dt_strategy_t), out);
 *     }
 *     (likewise zero_estimate with dt_shard_strategy_estimate)
 *     static const dt_strategy_ops_v1_t zero_ops = {
 *         .info = DT_PLUGIN_INFO(...), .init = zero_init,
 *         .estimate = zero_estimate, DT_SHARD_STRATEGY_OPS};
 * --------------------------------------------------------------------- */

/* Read the plugin's keys through `host`, check them against a
 * data-parallel group of `world` ranks (0: not known, init without a
 * communicator) and fill `cfg` (zeroed) for `model`.
 * `unit_numel` holds every unit's numel; `spans` (n_units entries) is
 * scratch for cfg->spans, valid until the engine is set up. */
typedef int (*dt_shard_configure_fn)(const dt_host_v1_t *host,
                                     const dt_model_desc_v1_t *model, int32_t world,
                                     const uint64_t *unit_numel, dt_bucket_span_t *spans,
                                     dt_shard_cfg_t *cfg);

/* The plugin's init: check `args`, configure for the group's size, and
 * allocate the instance (`instance_size` bytes, zeroed, at least a
 * dt_shard_engine_t, which it starts with) with the engine set up in it.
 * `ops`: the plugin's table, the instance's first member (strategy.h).
 * The instance is freed by the finalize wrapper. */
int dt_shard_strategy_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                           const dt_strategy_ops_v1_t *ops,
                           dt_shard_configure_fn configure, size_t instance_size,
                           dt_strategy_t **out);
/* The plugin's estimate: configure for args->group_size, dt_shard_estimate. */
int dt_shard_strategy_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *args,
                               dt_shard_configure_fn configure, dt_estimate_v1_t *out);

/* The ops slots: each the engine's function on the instance's first
 * member.  finalize frees the engine, then the instance. */
void dt_shard_op_finalize(dt_strategy_t *s);
int dt_shard_op_begin_step(dt_strategy_t *s, int64_t step);
int dt_shard_op_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out);
int dt_shard_op_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h);
int dt_shard_op_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out);
int dt_shard_op_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h);
int dt_shard_op_step(dt_strategy_t *s, const dt_step_args_v1_t *args, dt_step_result_v1_t *out);
int dt_shard_op_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                             dt_range_t *out, uint32_t cap, uint32_t *n);
int dt_shard_op_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, float *buf);
int dt_shard_op_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                          const float *buf);
int dt_shard_op_state_loaded(dt_strategy_t *s);

/* Those slots, for an ops table's designated initializers. */
#define DT_SHARD_STRATEGY_OPS                         \
    .finalize = dt_shard_op_finalize,                 \
    .begin_step = dt_shard_op_begin_step,             \
    .pre_forward = dt_shard_op_pre_forward,           \
    .post_forward = dt_shard_op_post_forward,         \
    .pre_backward = dt_shard_op_pre_backward,         \
    .post_backward = dt_shard_op_post_backward,       \
    .step = dt_shard_op_step,                         \
    .state_ranges = dt_shard_op_state_ranges,         \
    .get_state = dt_shard_op_get_state,               \
    .set_state = dt_shard_op_set_state,               \
    .state_loaded = dt_shard_op_state_loaded

#endif /* DT_SHARD_H */
