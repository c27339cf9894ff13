/*
 * dtrain/sdk/dp.h - the data-parallel core: what every data-parallel
 * strategy (the replica machinery under ddp, the sharded engine behind
 * zero and fsdp) checks and keeps alike, so the checks and their messages
 * are written once: its init arguments read under the growth rule, the
 * hook protocol, the start and the norm of a step, state requests by
 * global range, and the planner's persistent-state bytes.  A strategy
 * puts a dt_dp_t first in its instance, or the base it builds on does
 * (dt_replica_t, the shard engine).
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Part of the SDK helper library (dtrain/sdk_helpers.h says how to link
 * it and the conventions every helper follows).
 */
#ifndef DTRAIN_SDK_DP_H
#define DTRAIN_SDK_DP_H

#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/sdk/norm.h"
#include "dtrain/sdk/optim.h"
#include "dtrain/strategy.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    /* First, so a strategy instance that starts with its dt_dp_t (or a
     * dt_replica_t, a shard engine) starts with its table (strategy.h). */
    const dt_strategy_ops_v1_t *ops;
    const dt_host_v1_t *host;
    dt_device_t *dev;
    const dt_kernels_t *kernels;     /* dt_device_ops(dev)->kernels(), once */
    dt_stream_t *cs;                 /* the core's compute stream */
    dt_comm_t *comm;                 /* the data-parallel group */
    int32_t rank, size;              /* in comm */
    const dt_model_desc_v1_t *model; /* == &args.model */
    dt_optim_desc_v1_t optim;        /* == args.optim */
    dt_strategy_args_t args;         /* the init args as read */
    uint32_t *fwd_depth, *bwd_depth; /* (n_units) open pre_* hooks per unit */
    /* A pipeline stage (strategy ABI 1.3; NULL without one): each unit's
     * DT_UNIT_* flags, and the model's units with those not held emptied
     * (no tensors, numel 0; model->units points here), so flat layouts,
     * buckets and state ranges over `model` hold only the stage's units
     * and need no other change. */
    uint8_t *unit_flags;
    dt_unit_desc_v1_t *stage_units;
    dt_comm_t *norm_comm;            /* init.norm_comm: NULL, or the
                                      * pipeline group */
    dt_comm_t *tied_comm;            /* init.tied_comm: NULL, or the
                                      * embedding group */
} dt_dp_t;

/* Tensor parallelism (strategy ABI 1.5): 1 when some tensor of the model
 * is a copy another rank counts in the global norm
 * (DT_SPLIT_DUPLICATE); dt_dp_norm_copies then says how much of a
 * sum of squares was such copies. */
int dt_dp_has_norm_copies(const dt_dp_t *b);
/* The sum of squares of the elements of `x` the global norm counts on
 * another rank (DT_SPLIT_DUPLICATE tensors), for a caller that
 * summed all of x and takes this off.  x (device, f32) holds elements
 * [first, first + n) of a flat space in which unit u of [unit_lo,
 * unit_hi] starts at unit_start[u - unit_lo] (a replica's layout, a
 * shard group's).  *out = 0 at once when there are none.  `slot`: one
 * device double (dt_norm_sumsq's).  Blocking. */
int dt_dp_norm_copies(const dt_dp_t *b, double *slot, const float *x, uint64_t first,
                      uint64_t n, uint32_t unit_lo, uint32_t unit_hi,
                      const uint64_t *unit_start, double *out);
/* Add to norm plan `p` (dtrain/sdk/norm.h) the span of a gradient buffer
 * at [base, base + n) holding elements [first, first + n) of the flat
 * space laid out as for dt_dp_norm_copies, as the global norm counts it
 * here: nothing when every unit of [unit_lo, unit_hi] is a pipeline
 * stage's DT_UNIT_COPY (the owning stage counts it), else one part less
 * the runs of DT_SPLIT_DUPLICATE tensors in it as skip ranges, each
 * moved to start at base + (its offset - first).  Run once at init; the
 * norm is then dt_norm_plan_sumsq (or, for a gradient in an offload tier,
 * dt_offload_grads_sumsq_skip over the plan's skip ranges). */
int dt_dp_norm_plan_add(const dt_dp_t *b, dt_norm_plan_t *p, uint64_t first, uint64_t n,
                        uint32_t unit_lo, uint32_t unit_hi, const uint64_t *unit_start,
                        uint64_t base);

/* Unit u's DT_UNIT_* flags: DT_UNIT_HELD for every unit without a stage. */
static inline uint32_t dt_dp_unit_flags(const dt_dp_t *b, uint32_t u)
{
    return b->unit_flags ? b->unit_flags[u] : DT_UNIT_HELD;
}
/* 1 when init asked for a pipeline stage (any minor-3 field set). */
static inline int dt_dp_is_stage(const dt_dp_t *b)
{
    return b->unit_flags || b->norm_comm || b->tied_comm;
}

/* Check `args` (struct_size, the NULL pointers, n_micro >= 1, param_dtype
 * f32, bf16 or f16 (DT_ERR_UNSUPPORTED "<what> keeps f32, bf16 or f16 compute
 * parameters"), the optimizer kind, every unit valid and at its index),
 * then fill `b`: rank and size from the group, zeroed hook depths (host
 * memory), and for a pipeline stage (init.unit_flags) the flags, checked
 * (COPY needs TIED, TIED needs HELD, some unit held, tied_comm exactly
 * when a unit is TIED), with model->units the stage's (dt_dp_t).  A hook
 * naming a unit not held is DT_ERR_INVALID.  b->ops = `ops`, the
 * strategy's own table (NULL for a dt_dp_t no handle starts with).  On failure `b` holds what
 * was set; dt_dp_free it either way. */
int dt_dp_init(dt_dp_t *b, const dt_strategy_ops_v1_t *ops, const dt_host_v1_t *host,
               const dt_strategy_init_v1_t *args, const char *what);
void dt_dp_free(dt_dp_t *b);

/* `bytes`, zeroed, for a buffer the group `comm` reduces or gathers
 * (`what` and `tag` for the log and the accounting): in comm's symmetric
 * memory (comm.h, sym_alloc) when the communicator offers it, `comm` has
 * ranks to talk to (NULL: none) and the device computes in host memory
 * (its collectives on such buffers skip staging copies); else device
 * memory.  *sym says which; free it with dt_dp_free_shared.  A refusal of
 * symmetric memory falls back alike on every rank (sym_alloc is all or
 * nothing), with a warning unless the communicator has none; a lost or
 * stalled peer during the allocation is an error.  Collective over comm
 * when it is not NULL: every rank calls it with the same bytes. */
int dt_dp_alloc_shared(const dt_dp_t *b, dt_comm_t *comm, uint64_t bytes, int tag,
                       const char *what, void **out, uint8_t *sym);
void dt_dp_free_shared(const dt_dp_t *b, dt_comm_t *comm, void *p, uint8_t sym);

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
/* The gradient norm sqrt(sumsq) / args->loss_scale (the unscaled
 * gradient's; loss_scale 0 reads as 1) into *out and the optimizer step it
 * implies (lr and t from args, grad_scale the clip coefficient divided by
 * the loss scale, so the update sees the unscaled gradient).  A
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

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_DP_H */
