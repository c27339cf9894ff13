/*
 * dtrain/sdk/replica.h - the replica machinery: everything a data-parallel
 * strategy needs that keeps a full copy of the model on every rank of its
 * group, so ddp, local SGD, DiLoCo or an EMA strategy is a page of glue
 * over it.  ddp is built on it (plugins/ddp); sdk/examples/strategy_local_sgd
 * is an out-of-tree strategy built on it.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * What a dt_replica_t keeps, each ONE flat device buffer laid out unit
 * after unit (flat.h, DT_REPLICA_ALIGN elements between units):
 *   master   f32 parameters (the optimizer's)
 *   compute  what kernels read: == master for f32 models, else a bf16 or
 *            f16 copy (model->param_dtype) refreshed from it
 *   grads    f32 gradients, zeroed by begin_step
 *   m, v     the optimizer state (AdamW moments; SGD: m the momentum)
 * and, when it averages gradients (cfg.reduce_grads, groups of more than
 * one rank), buckets: units grouped in backward order (buckets.h), each a
 * contiguous span of the gradient buffer, all-reduced (DT_OP_AVG) on a
 * reduction stream as soon as backward has completed every unit of it in
 * the final micro-step (cfg.overlap), strictly in bucket order on every
 * rank; f32 in place, or cast to bf16 or f16 (cfg.reduce_dtype) into one
 * of DT_REPLICA_MAX_SLOTS buffers and back.
 *
 * The glue of a strategy: put a dt_replica_t FIRST in its struct
 * dt_strategy; dt_replica_read_config + dt_replica_init in init; the hooks
 * below in its hooks; dt_replica_step (or the pieces it is made of) in
 * step; dt_replica_state_* for checkpoints; dt_replica_estimate for the
 * planner; dt_replica_free in finalize.  What makes the strategy its own
 * goes between (local SGD: dt_replica_average every K steps).
 *
 * Part of the SDK helper library (dtrain/sdk_helpers.h says how to link
 * it and the conventions every helper follows).  Thread safety: as the
 * strategy's (one thread drives an instance).
 */
#ifndef DTRAIN_SDK_REPLICA_H
#define DTRAIN_SDK_REPLICA_H

#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/sdk/cfg.h"
#include "dtrain/sdk/dp.h"
#include "dtrain/sdk/flat.h"
#include "dtrain/sdk/offload.h"
#include "dtrain/sdk/optim.h"
#include "dtrain/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Unit slices start on 16-element (64-byte f32) boundaries. */
#define DT_REPLICA_ALIGN 16u
/* 16-bit reduction buffers: two, so one bucket can be cast while the
 * previous one is on the wire. */
#define DT_REPLICA_MAX_SLOTS 2u
/* Host staging for hashing parameters (the init check). */
#define DT_REPLICA_HASH_STAGING (4u << 20)

/* ------------------------------------------------------------------------
 * Configuration.  The keys a replica strategy declares for the machinery,
 * in its own config table, as designated initializers of dt_config_key_t
 * (a strategy lists the ones it uses; dt_replica_read_config gives a key
 * the strategy did not declare its default):
 *     static const dt_config_key_t keys[] = {
 *         DT_REPLICA_KEY_BUCKET_CAP_MB, DT_REPLICA_KEY_REDUCE_DTYPE,
 *         DT_REPLICA_KEY_OVERLAP, DT_REPLICA_KEY_INIT_CHECK,
 *         {.name = "my_own_key", ...}};
 * --------------------------------------------------------------------- */
#define DT_REPLICA_KEY_BUCKET_CAP_MB                                           \
    {.name = "bucket_cap_mb", .type = DT_CFG_FLOAT, .def = "25", .min = 0.0,  \
     .max = 1e6,                                                               \
     .doc = "gradient bucket size in MiB of f32 gradients (> 0); units are "  \
            "never split"}
#define DT_REPLICA_KEY_REDUCE_DTYPE DT_CFG_KEY_REDUCE_DTYPE /* dtrain/sdk/cfg.h */
#define DT_REPLICA_KEY_OVERLAP                                                 \
    {.name = "overlap", .type = DT_CFG_BOOL, .def = "true",                   \
     .doc = "start a bucket's all-reduce during backward (false: all in "     \
            "step)"}
#define DT_REPLICA_KEY_INIT_CHECK                                              \
    {.name = "init_check", .type = DT_CFG_ENUM, .def = "\"checksum\"",        \
     .choices = "checksum|broadcast",                                          \
     .doc = "initial replicas: verify identical by hash, or copy rank 0's"}

typedef struct dt_replica_cfg {
    double bucket_cap_mb;   /* bucket size, MiB of f32 gradients, > 0 */
    int32_t reduce_grads;   /* 1: average gradients across the group in
                             * buckets (ddp); 0: every rank keeps its own
                             * (local SGD): no buckets, no reduction
                             * stream, a local gradient norm */
    int32_t reduce_dtype;   /* DT_F32, DT_BF16 or DT_F16: what gradients
                             * travel in */
    int32_t overlap;        /* 1: start buckets during backward */
    int32_t init_broadcast; /* state_loaded: 1 copies rank 0's parameters
                             * to every rank; 0 checks that every rank
                             * holds the same (content hashes) */
} dt_replica_cfg_t;

/* Read the four keys above through `host` into `cfg` (reduce_grads = 1);
 * a key the strategy did not declare takes its default.  DT_ERR_CONFIG
 * naming the key: "bucket_cap_mb = 0: must be in (0, 1e6] MiB",
 * "reduce_dtype = \"f8\" is not one of the valid choices: fp32, bf16,
 * fp16" (dt_cfg_reduce_dtype). */
int dt_replica_read_config(const dt_host_v1_t *host, dt_replica_cfg_t *cfg);

/* ------------------------------------------------------------------------
 * The replica.
 * --------------------------------------------------------------------- */

/* A bucket's progress through a step. */
typedef enum dt_replica_bucket_state {
    DT_REPLICA_BUCKET_IDLE = 0,     /* waiting for its units' final
                                     * post_backward */
    DT_REPLICA_BUCKET_READY = 1,    /* gradients complete, not started (an
                                     * earlier bucket has not started yet,
                                     * or overlap off) */
    DT_REPLICA_BUCKET_INFLIGHT = 2, /* all_reduce started */
    DT_REPLICA_BUCKET_DONE = 3      /* reduced (and cast back) */
} dt_replica_bucket_state_t;

typedef struct dt_replica_bucket {
    uint32_t unit_lo, unit_hi; /* units [unit_lo, unit_hi] */
    uint64_t off, count;       /* span of the flat layout, elements */
    uint32_t n_units, n_ready; /* units in it / units whose gradient is final */
    int32_t state;             /* dt_replica_bucket_state_t */
    uint32_t slot;             /* 16-bit reduce_dtype: which reduction buffer */
    dt_comm_req_t *req;
} dt_replica_bucket_t;

/* Read-only outside sdk/lib/dt_replica*.c, except the device buffers,
 * which a strategy may read and write on the compute stream (dp.cs)
 * between hooks. */
typedef struct dt_replica {
    dt_dp_t dp;                 /* host, device, group, model, optimizer,
                                 * hook depths (dp.h) */
    dt_replica_cfg_t cfg;

    /* replicated state, one flat buffer each (layout.total elements) */
    dt_flat_layout_t layout;
    float *master;              /* f32 master parameters */
    void *compute;              /* bf16/f16 compute copy, or == master */
    float *grads;               /* in the group's symmetric memory when
                                 * sym_grads (dt_replica_alloc_reduced) */
    float *m, *v;               /* AdamW moments; SGD: m = momentum, v NULL */
    double *norm_slot;          /* one device double for sums of squares */
    int norm_copies;            /* dt_dp_has_norm_copies: tensor-parallel
                                 * copies the norm leaves to another rank */

    /* per unit: final post_backward seen this step */
    uint8_t *final_done;

    /* buckets (cfg.reduce_grads) */
    dt_replica_bucket_t *buckets;
    uint32_t n_buckets;
    uint32_t *bucket_of_unit;
    uint32_t next_launch;       /* buckets start strictly in index order */
    void *comm_buf;             /* 16-bit reduce_dtype: n_slots * slot_elems
                                 * (symmetric memory when sym_comm_buf) */
    uint8_t sym_grads, sym_comm_buf;
    uint32_t n_slots;
    uint64_t slot_elems;
    int32_t slot_bucket[DT_REPLICA_MAX_SLOTS]; /* bucket using the slot, -1 none */
    dt_stream_t *comm_stream;   /* NULL unless gradients are reduced */
    dt_event_t *ev_grads;       /* compute -> comm: gradients written */
    dt_event_t *ev_reduced;     /* comm -> compute: reductions done */

    /* offload ([parallel] offload, offload_what = "optimizer"): master, m
     * and v live in the tier (master, m, v NULL here; compute a device
     * copy of its own), updated on the host (dtrain/sdk/offload.h) */
    uint32_t offload_what;
    dt_offload_state_t off;
} dt_replica_t;

/* The optimizer state lives in the offload tier. */
static inline int dt_replica_offloaded(const dt_replica_t *r)
{
    return (r->offload_what & DT_OFFLOAD_WHAT_OPTIMIZER) != 0;
}
/* The optimizer keeps a second moment (AdamW), wherever it lives. */
static inline int dt_replica_has_v(const dt_replica_t *r)
{
    return r->dp.optim.kind == DT_OPTIM_ADAMW;
}

/* Set up `r` (its memory the caller's, e.g. first in a strategy instance)
 * for `args` and `cfg`: dt_dp_init (`ops`: the strategy's table, which
 * the instance then starts with; `what` names the strategy in its
 * messages), the flat buffers (zeroed; parameters undefined until
 * set_state), the buckets and, when gradients are reduced over more than
 * one rank, the reduction stream.  On failure everything it made is
 * freed again. */
int dt_replica_init(dt_replica_t *r, const dt_strategy_ops_v1_t *ops, const dt_host_v1_t *host,
                    const dt_strategy_init_v1_t *args, const dt_replica_cfg_t *cfg,
                    const char *what);
/* Free what init made (not `r` itself), dropping reductions a failed step
 * left; safe on a zeroed or freed replica. */
void dt_replica_free(dt_replica_t *r);

/* Unit u's compute parameters (model->param_dtype) and f32 gradients. */
static inline const void *dt_replica_unit_params(const dt_replica_t *r, uint32_t u)
{
    return dt_flat_unit_ptr(r->compute, &r->layout, r->dp.model->param_dtype, u);
}
static inline float *dt_replica_unit_grads(const dt_replica_t *r, uint32_t u)
{
    return (float *)dt_flat_unit_ptr(r->grads, &r->layout, DT_F32, u);
}

/* ---- gradients (sdk/lib/dt_replica_reduce.c) ---- */

/* begin_step: wait for reductions an abandoned step left, reset the
 * buckets and hooks, zero the gradients of every unit except those with
 * keep[u] != 0 (`keep` n_units entries, may be NULL: none kept). */
int dt_replica_begin_step(dt_replica_t *r, int64_t step, const uint8_t *keep);
/* The hooks, strategy.h's contracts: the unit's buffers (backward: its
 * gradient slice, which kernels accumulate into), and in post_backward
 * the bookkeeping that starts a bucket's all-reduce once its units'
 * gradients are final (last_use in the final micro-step). */
int dt_replica_pre_forward(dt_replica_t *r, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out);
int dt_replica_post_forward(dt_replica_t *r, const dt_hook_v1_t *h);
int dt_replica_pre_backward(dt_replica_t *r, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out);
int dt_replica_post_backward(dt_replica_t *r, const dt_hook_v1_t *h);
/* Start every bucket not started yet, in order, wait for all of them, and
 * order the compute stream after them: the gradients are then the group's
 * average.  A no-op when gradients are not reduced.  Blocking. */
int dt_replica_reduce(dt_replica_t *r);
/* Wait for every started reduction, stopping at the first failure (the
 * rest stay in flight, the message stays the failure's); timeout_ms 0
 * drops them all (finalize). */
int dt_replica_drain(dt_replica_t *r, int64_t timeout_ms);
/* *sumsq = the squared L2 norm of the gradient.  Averaged gradients are
 * the same on every rank: each sums 1/size of the buffer and one f64
 * all_reduce adds the parts (collective; every rank gets the same bits).
 * Local gradients: this rank's own, whole buffer.  A pipeline stage
 * (dp.h) leaves its COPY units out and sums the result over norm_comm:
 * the whole model's norm, each element once.  Blocking. */
int dt_replica_grad_sumsq(dt_replica_t *r, double *sumsq);
/* A pipeline stage's TIED units: each one's gradient summed (all_reduce
 * SUM, f32, in place) over dp.tied_comm, after dt_replica_reduce; a no-op
 * without tied_comm.  Blocking. */
int dt_replica_tied_sum(dt_replica_t *r);

/* ---- the update (sdk/lib/dt_replica_step.c) ---- */

/* The optimizer update of unit u, enqueued on the compute stream. */
int dt_replica_update_unit(dt_replica_t *r, uint32_t u, const dt_optim_step_t *st);
/* The compute copy of units [lo, hi) from the masters (a no-op for f32). */
int dt_replica_refresh(dt_replica_t *r, uint32_t lo, uint32_t hi);
/* Zero the gradients of units [lo, hi) on the compute stream. */
int dt_replica_zero_grads(dt_replica_t *r, uint32_t lo, uint32_t hi);
/* Every unit's update (the last unit first when `last_first`), then the
 * compute copy refreshed. */
int dt_replica_update(dt_replica_t *r, const dt_optim_step_t *st, int last_first);
/* After dt_dp_step_check: reduce the gradients (and sum the tied ones
 * between pipeline stages), their norm into out
 * (grad_norm, nonfinite) and the optimizer step it implies into *st.
 * out->nonfinite: the caller returns DT_OK without updating. */
int dt_replica_step_grads(dt_replica_t *r, const dt_step_args_v1_t *args,
                          dt_step_result_v1_t *out, dt_optim_step_t *st);
/* strategy.h's step, the plain way: check, dt_replica_step_grads,
 * dt_replica_update. */
int dt_replica_step(dt_replica_t *r, const dt_step_args_v1_t *args, dt_step_result_v1_t *out);
/* Average state `kind` (DT_STATE_*) across the group in place: one
 * all_reduce AVG of the whole flat buffer on the compute stream; for the
 * parameters the compute copy is refreshed.  Collective, blocking.  With
 * one rank, or for exp_avg_sq of SGD (none kept), nothing to do. */
int dt_replica_average(dt_replica_t *r, int kind);

/* ---- state by global ranges (sdk/lib/dt_replica_state.c) ---- */

/* HELD: the whole unit on every rank (each must load all of it).  SAVE:
 * the unit split evenly across the group (dt_range_split), so checkpoint
 * writes run in parallel and each element is written exactly once -
 * which presumes the replicas agree; a strategy whose ranks may differ
 * when a checkpoint is taken says what a checkpoint then holds. */
int dt_replica_state_ranges(dt_replica_t *r, uint32_t unit, int kind, int purpose,
                            dt_range_t *out, uint32_t cap, uint32_t *n);
int dt_replica_get_state(dt_replica_t *r, uint32_t unit, int kind, dt_range_t range,
                         float *buf);
int dt_replica_set_state(dt_replica_t *r, uint32_t unit, int kind, dt_range_t range,
                         const float *buf);
/* All state is set: cfg.init_broadcast copies rank 0's parameters to
 * every rank, else (groups of more than one rank) the init check hashes
 * each unit's parameters and compares them across the group, failing
 * alike on every rank with DT_ERR_DATA naming the first unit that
 * differs; then the compute copy is rebuilt.  Collective, blocking. */
int dt_replica_state_loaded(dt_replica_t *r);

/* ---- planning (sdk/lib/dt_replica.c) ---- */

/* Memory per rank by tag, as dt_replica_init allocates it for `cfg` (same
 * layout, same buckets), for estimate arguments already read (dt_dp_
 * estimate_read; *out begun with dt_estimate_begin):
 *   params     = T * param_bytes, + T * 4 f32 master when param_bytes == 2
 *   grads      = T * grad_bytes;  optimizer = T * optim_bytes - the master
 *   comm       = 16-bit reduction: slots * largest bucket * 2
 *   activations= act_bytes;  other = the norm slot + the init check's scratch
 * and comm_bytes_per_step for the gradient all-reduce (ring: each rank
 * sends 2 (n-1)/n of the buffer), 0 when gradients are not reduced.
 * T = the model's numel plus the alignment between unit slices.
 * *n_buckets (may be NULL): the buckets a reducing replica would use. */
int dt_replica_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *args,
                        const dt_replica_cfg_t *cfg, dt_estimate_v1_t *out,
                        uint32_t *n_buckets);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_REPLICA_H */
