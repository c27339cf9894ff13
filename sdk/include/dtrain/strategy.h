/*
 * dtrain/strategy.h - the parallel strategy ABI (plugin kind "strategy").
 *
 * A strategy owns how parameters, gradients and optimizer state are held
 * along its parallel dimension (data: ddp, zero, fsdp; model: tensor,
 * pipeline).  The core describes the model as an ordered list of UNITS (the
 * embedding, each transformer block, the head): the granularity that is
 * gathered, sharded and reduced.  Each unit's parameters form one flat f32
 * index space [0, unit.numel); a shard is a range of it.
 *
 * One training step, as the core drives it:
 *
 *   begin_step(step)
 *   for each micro-batch m in [0, n_micro):
 *     for each unit u:            pre_forward(u) -> params;  kernels;  post_forward(u)
 *     for each unit u, reversed:  pre_backward(u) -> params, grads;  kernels;  post_backward(u)
 *   step(lr, clip) -> grad norm        (wait for reductions, clip, optimizer)
 *
 * A unit may be used more than once per pass (GPT-2's tied embedding is
 * read again by the head): hooks nest, every pre_* has its post_*, and
 * post_backward's `last_use` says when this unit's gradient for the
 * micro-batch is complete, so a strategy can start reducing it.  Buffers
 * returned by pre_* stay valid until the matching post_* returns.
 *
 * Kernels run on the core's compute stream (init args); a strategy that
 * communicates on its own orders itself after that stream with events.
 *
 * Thread safety: the core drives an instance from one thread; the hooks,
 * step and state calls never overlap.  A strategy may run its own threads
 * against the device and comm tables it was given, under their contracts
 * (device.h, comm.h).  estimate and plan_presets need no instance and may
 * be called from any thread.
 *
 * Pipeline parallelism (minor 3).  World = tp x pp x dp (core/train/
 * grid.h: tp fastest, then dp, then pp).  Two strategies run on a rank:
 *
 *   - the PIPELINE strategy (the "pipeline" plugin, [parallel] pipeline >
 *     1), initialised over the pipeline group (init.comm: one rank per
 *     stage, group rank = stage).  It holds no parameters (its state_ranges
 *     are empty, its unit hooks are never called) and owns the step's
 *     schedule: `assign_stages` (no instance) maps units to stages, and
 *     `run_schedule` runs this stage's forward and backward passes of every
 *     micro-batch in the schedule's order, moving the boundary activations
 *     and their gradients to the neighbouring stages with the comm table's
 *     send / recv (started on the compute stream, asynchronous requests,
 *     bounded waits), through the core's dt_stage_runner_v1_t;
 *   - the DATA strategy (ddp, zero, fsdp), initialised over the data group
 *     as ever, but told which units its stage holds (init.unit_flags): it
 *     allocates, hooks, reduces, updates and saves only those.  The
 *     gradient norm it reports counts every element once across the whole
 *     model: its own sum of squares is summed over init.norm_comm (the
 *     pipeline group) too, and so is the non-finite flag.
 *
 * A unit read by two stages (GPT-2's wte: the first stage's embedding, the
 * last stage's tied LM head) is held by both: the owner with
 * DT_UNIT_HELD | DT_UNIT_TIED, the other with DT_UNIT_HELD | DT_UNIT_TIED
 * | DT_UNIT_COPY.  Both start from the same values (the core loads the
 * same checkpoint entries, or the same deterministic init, into each),
 * each sums its gradient of the unit over init.tied_comm (the grid's
 * embedding group) after its own data-parallel reduction and before the
 * norm, as Megatron-LM does, so both apply the same update and stay equal;
 * the COPY is never saved (its SAVE ranges are empty) and left out of the
 * norm.  A sharding strategy sums its shard: both stages shard the unit
 * alike (same description, same dp size), so the shards line up.
 *
 * Interleaved stages (minor 4): a stage may run several chunks (virtual
 * stages chunk x pp + stage, assign_stages' `chunks`), so the units it
 * holds need not be contiguous.  Its units' backwards then interleave
 * across micro-batches chunk by chunk: a data strategy that groups units
 * for a reduction and counts their last uses per micro-batch must not
 * group units of two chunks (the shard engine keeps them apart).
 *
 * Growth: minor 3 appends unit_flags, norm_comm and tied_comm to the init
 * arguments and the optional slots assign_stages and run_schedule.  A data
 * strategy built before minor 3 refuses non-zero minor-3 init fields with
 * DT_ERR_UNSUPPORTED (rule 3 of abi.h), which the core reports as "this
 * strategy cannot run a pipeline stage"; the core calls the two slots only
 * after DT_HAS_OP.
 */
#ifndef DTRAIN_STRATEGY_H
#define DTRAIN_STRATEGY_H

#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/offload.h"
#include "dtrain/plugin.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_STRATEGY_ABI_MAJOR 1
#define DT_STRATEGY_ABI_MINOR 6 /* 1: dt_step_args_v1_t.loss_scale, dt_estimate_args_v1_t.offload;
                                 * 2: dt_estimate_v1_t.offload_bytes_per_step;
                                 * 3: pipeline stages: dt_strategy_init_v1_t.unit_flags,
                                 *    norm_comm, tied_comm; the slots assign_stages and
                                 *    run_schedule and their structs;
                                 * 4: dt_stage_args_v1_t.in_flight (activations kept per
                                 *    micro-batch in flight), .chunks (interleaved
                                 *    virtual stages) and .buffers (the schedule's
                                 *    boundary tensors); dt_stage_runner_v1_t.act_slots,
                                 *    forward_chunk, backward_chunk;
                                 * 5: dt_param_desc_v1_t.ext may point at a
                                 *    dt_param_split_v1_t (tensor parallelism);
                                 * 6: the slots reduce_activation and
                                 *    wait_activation (a tensor strategy's);
                                 *    dt_stage_args_v1_t.unit_flops */

typedef struct dt_strategy dt_strategy_t; /* plugin instance, opaque */

/* ------------------------------------------------------------------------
 * The model as strategies see it.
 * --------------------------------------------------------------------- */

/* Flags of a parameter tensor. */
#define DT_PARAM_NO_DECAY 0x1u /* exempt from weight decay (biases, norms) */

/* Tensor parallelism (minor 5): what part of a global tensor this rank
 * holds.  The rank's tensor is n_blocks blocks of the global one, laid one
 * after another in the unit's flat buffer, each row-major over its own
 * sizes; block b covers global indices [start[d], start[d] + size[d]) along
 * every dimension d < ndim.  GPT-2's fused QKV weight (3C, C) split over
 * 2 ranks by heads is 3 blocks on each rank (its q, k and v rows:
 * start (0, 0), (C, 0), (2C, 0) on rank 0, each of size (C/2, C)); a
 * row-parallel projection (C, C) is one block of size (C, C/2) at column
 * C/2 on rank 1, which is not contiguous in the global tensor.
 * A tensor every rank of the tensor group holds whole (LayerNorm weights,
 * the row-parallel layers' biases, the position embedding) is one block
 * covering it with copies = group_size: its gradient is the same on every
 * rank of the group (the model computes it from the same, replicated
 * inputs), and a global norm counts it once, not group_size times. */
#define DT_PARAM_MAX_BLOCKS 3
typedef struct dt_param_block_v1 {
    int64_t start[4]; /* first global index along each dimension */
    int64_t size[4];  /* extent along each dimension (0 beyond ndim) */
} dt_param_block_v1_t;

typedef struct dt_param_split_v1 {
    uint32_t struct_size;   /* sizeof(dt_param_split_v1_t), core's build */
    uint32_t n_blocks;      /* 1..DT_PARAM_MAX_BLOCKS */
    int64_t global_shape[4];
    int32_t group_size;     /* ranks of the tensor group (parallel.tensor) */
    int32_t copies;         /* ranks of it holding these same elements:
                             * group_size when replicated, 1 when split */
    uint32_t flags;         /* DT_SPLIT_* */
    uint32_t reserved0;
    dt_param_block_v1_t blocks[DT_PARAM_MAX_BLOCKS];
} dt_param_split_v1_t;
/* dt_param_split_v1_t.flags: this rank's copy of a replicated tensor
 * duplicates the one the tensor group's rank 0 holds, which is the one
 * counted: a strategy's gradient norm leaves it out (so the sum over the
 * model's ranks counts each element once) and a checkpoint saves rank 0's
 * copy only. */
#define DT_SPLIT_DUPLICATE 0x1u

/* One parameter tensor inside a unit's flat buffer.  Frozen for the major
 * (an array element): growth goes through `ext`.  `shape` is the tensor
 * this rank holds: the global one unless `ext` says it is a part. */
typedef struct dt_param_desc_v1 {
    const char *name;   /* global name, GPT-2's ("h.3.attn.c_attn.weight") */
    uint64_t offset;    /* first element in the unit's flat buffer */
    uint64_t numel;     /* elements */
    int32_t ndim;       /* 1..4 */
    uint32_t flags;     /* DT_PARAM_* */
    int64_t shape[4];   /* shape of what this rank holds, row-major */
    const void *ext;    /* NULL, or (minor 5, tensor parallelism) a
                         * dt_param_split_v1_t: the part of the global
                         * tensor this rank holds */
} dt_param_desc_v1_t;

/* One unit.  Frozen for the major (an array element): growth through ext. */
typedef struct dt_unit_desc_v1 {
    const char *name;        /* "embedding", "block.3", "head" */
    uint32_t index;          /* position in the model, 0-based */
    uint32_t n_params;
    dt_param_desc_v1_t *params; /* n_params entries, ordered by offset */
    uint64_t numel;          /* flat length: sum of params' numel */
    uint64_t act_bytes;      /* activation bytes one micro-batch keeps for
                              * backward (planner estimate) */
    const void *ext;         /* NULL in v1.0 (see dt_param_desc_v1_t) */
} dt_unit_desc_v1_t;

/* The model (in; owned by the core, read-only for strategies). */
typedef struct dt_model_desc_v1 {
    uint32_t struct_size;    /* sizeof(dt_model_desc_v1_t), core's build */
    uint32_t n_units;
    const char *arch;        /* "gpt2", "mlp" */
    dt_unit_desc_v1_t *units;
    uint64_t numel;          /* all units */
    int32_t param_dtype;     /* dtype of parameters kernels read (f32/bf16) */
    int32_t reserved0;
    /* ---- minor 0 ends here; append only ---- */
} dt_model_desc_v1_t;
#define DT_MODEL_DESC_V1_SIZE0 DT_FIELD_END(dt_model_desc_v1_t, reserved0)

/* Optimizer selection and hyper-parameters (learning rate comes per step). */
typedef enum dt_optim_kind { DT_OPTIM_ADAMW = 0, DT_OPTIM_SGD = 1 } dt_optim_kind_t;

/* (in; owned by the core) */
typedef struct dt_optim_desc_v1 {
    uint32_t struct_size; /* sizeof(dt_optim_desc_v1_t), core's build */
    int32_t kind;         /* dt_optim_kind_t */
    int32_t nesterov;     /* SGD */
    float beta1, beta2, eps; /* AdamW */
    float momentum;       /* SGD */
    float weight_decay;   /* applied to params without DT_PARAM_NO_DECAY */
    /* ---- minor 0 ends here; append only ---- */
} dt_optim_desc_v1_t;
#define DT_OPTIM_DESC_V1_SIZE0 DT_FIELD_END(dt_optim_desc_v1_t, weight_decay)

/* The kinds of persistent per-parameter state, each in the unit's flat
 * index space, all f32. */
typedef enum dt_state_kind {
    DT_STATE_PARAMS = 0,   /* master parameters */
    DT_STATE_EXP_AVG = 1,  /* AdamW first moment, or SGD momentum */
    DT_STATE_EXP_AVG_SQ = 2, /* AdamW second moment */
    DT_STATE_COUNT
} dt_state_kind_t;

/* Purpose of a range query. */
typedef enum dt_range_purpose {
    DT_RANGES_HELD = 0,  /* everything this rank holds (what it must load) */
    DT_RANGES_SAVE = 1   /* what this rank writes: across the group the SAVE
                          * ranges partition [0, numel) exactly once */
} dt_range_purpose_t;

/* ------------------------------------------------------------------------
 * Arguments.
 * --------------------------------------------------------------------- */
/* (in; valid during init, except `model` and `optim`: until finalize) */
typedef struct dt_strategy_init_v1 {
    uint32_t struct_size;      /* sizeof(dt_strategy_init_v1_t), core's build */
    uint32_t n_micro;          /* accumulation micro-steps per step */
    const dt_device_ops_v1_t *dev_ops;
    dt_device_t *dev;
    dt_stream_t *compute_stream; /* where the core runs kernels */
    const dt_comm_ops_v1_t *comm_ops;
    dt_comm_t *comm;           /* this strategy's group (dp, tp or pp) */
    const dt_offload_ops_v1_t *offload_ops; /* NULL: no offload tier */
    dt_offload_t *offload;
    const dt_model_desc_v1_t *model; /* valid until finalize */
    const dt_optim_desc_v1_t *optim; /* valid until finalize (a pointer, so
                                      * either struct grows on its own) */
    /* ---- minor 0 ends here; append only ---- */
    /* Pipeline stages (see the top of this file).  NULL: this instance
     * holds every unit (no pipeline).  Else model->n_units entries of
     * DT_UNIT_* flags, valid during init only (copy what you keep): a
     * unit without DT_UNIT_HELD is another stage's, and no hook, state
     * call or checkpoint entry of this instance ever names it. */
    const uint8_t *unit_flags;
    /* NULL, or the group (the pipeline group) over which the squared
     * gradient norm and the non-finite flag are summed after this
     * strategy's own group: the other stages hold the rest of the model.
     * Collective over it in step(): every stage calls step once a step. */
    dt_comm_t *norm_comm;
    /* NULL, or the group over which the gradients of DT_UNIT_TIED units
     * are summed in step(), after the strategy's own reduction and before
     * the norm (the grid's embedding group: first and last stage).  Set
     * exactly when some unit is DT_UNIT_TIED. */
    dt_comm_t *tied_comm;
    /* ---- minor 3 ends here; append only ---- */
} dt_strategy_init_v1_t;
#define DT_STRATEGY_INIT_V1_SIZE0 DT_FIELD_END(dt_strategy_init_v1_t, optim)

/* dt_strategy_init_v1_t.unit_flags (minor 3). */
#define DT_UNIT_HELD 0x1u /* this stage runs the unit: held, hooked, saved */
#define DT_UNIT_TIED 0x2u /* also held by another stage: its gradient is
                           * summed over init.tied_comm before the norm */
#define DT_UNIT_COPY 0x4u /* the other stage's copy of a TIED unit: loaded
                           * (HELD ranges as usual) but never saved (SAVE
                           * ranges empty) and not counted in the norm */

/* Passed to every unit hook. */
#define DT_HOOK_NO_GRAD 0x1u /* evaluation pass: no backward follows */

/* (in, per call; the core's) */
typedef struct dt_hook_v1 {
    uint32_t struct_size; /* sizeof(dt_hook_v1_t), core's build */
    uint32_t unit;       /* unit index */
    uint32_t micro;      /* micro-batch in [0, n_micro) */
    uint32_t n_micro;
    uint32_t flags;      /* DT_HOOK_* */
    int32_t last_use;    /* post_backward: 1 when the unit's gradient for
                          * this micro-batch is complete */
    /* ---- minor 0 ends here; append only ---- */
} dt_hook_v1_t;
#define DT_HOOK_V1_SIZE0 DT_FIELD_END(dt_hook_v1_t, last_use)

/* What pre_forward / pre_backward hand the core: the unit's full flat
 * parameters (in model->param_dtype) and, in backward, its full flat f32
 * gradient buffer that kernels accumulate into.  (out: the core zero-fills
 * it and sets struct_size; the strategy fills it with dt_result_write.) */
typedef struct dt_unit_buffers_v1 {
    uint32_t struct_size; /* sizeof(dt_unit_buffers_v1_t), core's build */
    uint32_t reserved0;
    const void *params;  /* (unit.numel) device memory */
    float *grads;        /* (unit.numel) device memory; NULL in forward */
    /* ---- minor 0 ends here; append only ---- */
} dt_unit_buffers_v1_t;
#define DT_UNIT_BUFFERS_V1_SIZE0 DT_FIELD_END(dt_unit_buffers_v1_t, grads)

/* (in, per step; the core's) */
typedef struct dt_step_args_v1 {
    uint32_t struct_size; /* sizeof(dt_step_args_v1_t), core's build */
    uint32_t reserved0;
    int64_t step;        /* 1-based optimizer step (AdamW bias correction) */
    float lr;
    float clip;          /* max global grad norm; <= 0: no clipping */
    /* ---- minor 0 ends here; append only ---- */
    float loss_scale;    /* the factor every gradient carries: the core
                          * multiplied the loss by it before backward (fp16
                          * loss scaling); 0 = absent = 1.  The strategy
                          * divides it out before everything else: the norm
                          * it reports and clips by, and the update are
                          * those of the unscaled gradient.  A non-finite
                          * (overflowed) gradient anywhere in the group
                          * skips the update with nonfinite = 1, as ever.
                          * A plugin built before minor 1 refuses a
                          * non-zero value (dt_args_check). */
    uint32_t reserved1;
    /* ---- minor 1 ends here; append only ---- */
} dt_step_args_v1_t;
#define DT_STEP_ARGS_V1_SIZE0 DT_FIELD_END(dt_step_args_v1_t, clip)

/* (out: core zero-fills and sets struct_size; dt_result_write) */
typedef struct dt_step_result_v1 {
    uint32_t struct_size; /* sizeof(dt_step_result_v1_t), core's build */
    int32_t nonfinite;   /* 1: the norm was NaN/Inf and no update was made */
    double grad_norm;    /* global L2 norm before clipping, over the whole
                          * model and all ranks (each element once) */
    /* ---- minor 0 ends here; append only ---- */
} dt_step_result_v1_t;
#define DT_STEP_RESULT_V1_SIZE0 DT_FIELD_END(dt_step_result_v1_t, grad_norm)

/* Planner input: what a strategy needs to predict per-rank memory (in). */
typedef struct dt_estimate_args_v1 {
    uint32_t struct_size;        /* sizeof(dt_estimate_args_v1_t), core's build */
    int32_t group_size;          /* ranks along this strategy's dimension */
    const dt_model_desc_v1_t *model;
    uint32_t param_bytes;        /* bytes per compute parameter (2 or 4) */
    uint32_t grad_bytes;         /* bytes per gradient element as kept:
                                  * 4 where kernels accumulate in f32 (the
                                  * core passes this), 2 for the ZeRO
                                  * paper's mixed-precision accounting */
    uint32_t optim_bytes;        /* bytes per parameter of optimizer state,
                                  * master copy included (12 for mixed-
                                  * precision Adam, 8 for fp32 Adam) */
    uint32_t n_micro;
    uint64_t act_bytes;          /* activations of one micro-batch, whole model */
    /* ---- minor 0 ends here; append only ---- */
    uint32_t offload;            /* 1: [parallel] offload names a tier; the
                                  * strategy's own config says what goes
                                  * there, and the bytes the tier would hold
                                  * are planned under DT_TAG_OFFLOAD (the
                                  * other tags stay device memory) */
    uint32_t reserved1;
    /* ---- minor 1 ends here; append only ---- */
} dt_estimate_args_v1_t;
#define DT_ESTIMATE_ARGS_V1_SIZE0 DT_FIELD_END(dt_estimate_args_v1_t, act_bytes)

/* Planner output (out: core zero-fills and sets struct_size). */
typedef struct dt_estimate_v1 {
    uint32_t struct_size;         /* sizeof(dt_estimate_v1_t), core's build */
    uint32_t n_tags;              /* entries of bytes[] the strategy filled */
    uint64_t bytes[DT_TAG_CAPACITY]; /* predicted peak per rank, per tag */
    uint64_t comm_bytes_per_step; /* bytes this rank sends per step, as ring
                                   * algorithms send them (an all-reduce
                                   * 2(n-1)/n of its buffer, a reduce-scatter
                                   * or all-gather (n-1)/n): `dtrain plan
                                   * --link-gbps` divides it by the link */
    char note[160];               /* words, e.g. "params gathered per unit";
                                   * sizes belong in the planner's columns */
    /* ---- minor 0 ends here; append only ---- */
    uint64_t offload_bytes_per_step; /* with args->offload: bytes this rank
                                   * reads from and writes to the tier per
                                   * step (`dtrain plan` prefers the least
                                   * of it among offload choices that fit);
                                   * 0 from a plugin before minor 2, where
                                   * the planner assumes every byte held is
                                   * read and written once */
    /* ---- minor 2 ends here; append only ---- */
} dt_estimate_v1_t;
#define DT_ESTIMATE_V1_SIZE0 DT_FIELD_END(dt_estimate_v1_t, note)

/* A row `dtrain plan` prints for a strategy: its label and the settings of
 * the plugin's own table that select it.  Frozen for the major (an array
 * element). */
typedef struct dt_plan_preset_v1 {
    const char *label;   /* "zero-2", "fsdp FULL_SHARD" */
    const char *set;     /* "key=value" assignments in the plugin's table,
                          * separated by spaces ("stage=2"); NULL or "": the
                          * defaults */
} dt_plan_preset_v1_t;

/* ------------------------------------------------------------------------
 * Pipeline schedule (minor 3).
 * --------------------------------------------------------------------- */

/* assign_stages' question (in; the core's).  Introduced in minor 3: its
 * minor-0 size is its size then. */
typedef struct dt_stage_args_v1 {
    uint32_t struct_size;            /* sizeof(dt_stage_args_v1_t), core's build */
    int32_t n_stages;                /* [parallel] pipeline, >= 2 */
    const dt_model_desc_v1_t *model; /* units in model order */
    uint32_t n_micro;                /* micro-batches a step (with `stash`) */
    uint32_t reserved0;
    /* out, optional (NULL: not asked; the planner asks): n_stages
     * entries, the most stage inputs (boundary tensors) stage k keeps at
     * once under the plugin's schedule for n_micro micro-batches (GPipe
     * n_micro, 1F1B min(n_micro, n_stages - k); 0 for the first stage,
     * which reads tokens; 1 where the core keeps the activations of every
     * micro-batch in flight, `in_flight`, and the stash is the receive
     * buffer only). */
    uint32_t *stash;
    /* ---- minor 0 ends here; append only ---- */
    /* out, optional (NULL: not asked), n_stages entries, filled with 1 by
     * the caller: the micro-batches whose activations stage k keeps at
     * once, so that each backward runs on the activations its forward
     * left (the core allocates that many activation slots): the most in
     * flight under the schedule (GPipe n_micro, 1F1B min(n_micro,
     * n_stages - k)), or 1 when the plugin's config trades compute for
     * memory and has the core recompute a micro-batch's forward before
     * its backward.  A plugin that leaves it at 1 gets the latter.  With
     * chunks, per chunk: slot i of each of the rank's chunks. */
    uint32_t *in_flight;
    /* out, optional (NULL: not asked; the caller sets it to 1 first): the
     * chunks ("virtual stages") each rank runs, V.  With V > 1 assign_stages
     * maps units to n_stages x V virtual stages (out[u] in [0, n_stages x
     * V), never decreasing, none empty); virtual stage j runs on rank
     * j % n_stages as its chunk j / n_stages (Megatron's interleaved
     * layout), and run_schedule drives the runner's *_chunk calls.  A
     * caller that does not ask gets V = 1 (the plugin refuses to
     * interleave then). */
    uint32_t *chunks;
    /* out, optional (NULL: not asked), n_stages entries: the boundary
     * tensors (B x T x boundary width in the activation dtype) the
     * schedule allocates on stage k: stashed inputs, outputs and input
     * gradients in flight, received gradients.  The planner adds them to
     * the stage's activations. */
    uint32_t *buffers;
    /* ---- minor 6 ---- */
    /* in, optional (NULL: the core does not say): model->n_units entries,
     * the FLOPs each unit spends on one token, forward and backward (the
     * model's estimate: 6 per matmul parameter plus attention's; GPT-2's
     * tied LM head counted in the head unit that runs it, not in the
     * embedding that holds it), for a balance by compute. */
    const double *unit_flops;
} dt_stage_args_v1_t;
#define DT_STAGE_ARGS_V1_SIZE0 DT_FIELD_END(dt_stage_args_v1_t, stash)

/* The core's side of a stage, handed to run_schedule (in; the core's,
 * valid during the call).  Boundary tensors are device memory of
 * dt_schedule_args_v1_t.act_count elements of act_dtype, (B, T, C) for
 * GPT-2: the residual stream between two units.  Both calls queue their
 * kernels on the compute stream and return when the output is ready to be
 * sent (the core synchronises the stream; a later minor may return
 * earlier with an event).  Any failure is returned with the message set;
 * the schedule stops and returns it. */
typedef struct dt_stage_runner_v1 {
    uint32_t struct_size;  /* sizeof(dt_stage_runner_v1_t), core's build */
    uint32_t reserved0;
    void *ctx;             /* the core's, passed back */
    /* Forward of micro-batch `micro` through this stage's units.  `in`:
     * the previous stage's output (NULL on the first stage, which reads
     * the micro-batch's tokens itself); `out`: this stage's output (NULL
     * on the last stage, which computes the loss instead and adds the
     * micro-batch's mean loss to *loss; untouched elsewhere). */
    int (*forward)(void *ctx, uint32_t micro, const void *in, void *out, double *loss);
    /* Backward of micro-batch `micro`: `in` is the same input its forward
     * had (NULL on the first stage); `dout` the gradient of this stage's
     * output (NULL on the last stage: the loss starts it), `din` receives
     * the gradient of `in` (NULL on the first stage).  The core keeps the
     * activations of assign_stages' in_flight micro-batches (slot micro %
     * in_flight): when those of `micro` are still there it runs backward
     * on them and `in` may be NULL; otherwise (in_flight 1: any micro-batch
     * but the last forward) it recomputes the stage's forward from `in`
     * first (GPipe's re-materialisation), so such a schedule stashes the
     * stage inputs, one boundary tensor per micro-batch in flight.  A
     * backward that would need `in` and has NULL fails DT_ERR_INVALID. */
    int (*backward)(void *ctx, uint32_t micro, const void *in, const void *dout,
                    void *din);
    /* ---- minor 0 ends here; append only ---- */
    /* The activation slots the core keeps for this stage (minor 4; a
     * runner without the field keeps 1): a schedule passes `in` NULL to
     * backward only when this covers its micro-batches in flight. */
    uint32_t act_slots;
    uint32_t reserved1;
    /* Minor 4, with chunks (assign_stages' V > 1): forward and backward
     * as above, of micro-batch `micro` through this rank's chunk `chunk`
     * (its virtual stage chunk x n_stages + rank).  `in` is NULL only for
     * virtual stage 0 and `out` / `dout` only for the last, which computes
     * the loss; `din` is NULL only for virtual stage 0.  Chunk 0 of a
     * one-chunk stage is forward / backward. */
    int (*forward_chunk)(void *ctx, uint32_t chunk, uint32_t micro, const void *in, void *out,
                         double *loss);
    int (*backward_chunk)(void *ctx, uint32_t chunk, uint32_t micro, const void *in,
                          const void *dout, void *din);
} dt_stage_runner_v1_t;
#define DT_STAGE_RUNNER_V1_SIZE0 DT_FIELD_END(dt_stage_runner_v1_t, backward)

/* dt_schedule_args_v1_t.flags */
#define DT_SCHEDULE_NO_GRAD 0x1u /* forwards only (evaluation): the runner's
                                  * backward is never called, and the
                                  * runner's forward flags its hooks
                                  * DT_HOOK_NO_GRAD */

/* run_schedule's arguments (in; the core's). */
typedef struct dt_schedule_args_v1 {
    uint32_t struct_size;     /* sizeof(dt_schedule_args_v1_t), core's build */
    uint32_t n_micro;         /* micro-batches this step (train accumulation) */
    int64_t step;             /* 1-based, for messages */
    uint64_t act_count;       /* elements of one boundary tensor */
    int32_t act_dtype;        /* their dtype (dt_dtype_t) */
    uint32_t flags;           /* DT_SCHEDULE_* */
    const dt_stage_runner_v1_t *runner;
    /* ---- minor 0 ends here; append only ---- */
} dt_schedule_args_v1_t;
#define DT_SCHEDULE_ARGS_V1_SIZE0 DT_FIELD_END(dt_schedule_args_v1_t, runner)

/* run_schedule's result (out: core zero-fills and sets struct_size;
 * dt_result_write). */
typedef struct dt_schedule_result_v1 {
    uint32_t struct_size;     /* sizeof(dt_schedule_result_v1_t), core's build */
    uint32_t n_loss;          /* micro-batches whose loss this stage computed:
                               * n_micro on the last stage, else 0 */
    double loss_sum;          /* the sum of their mean losses */
    double recv_wait_s;       /* seconds waiting on receives: the bubble as
                               * measured on this stage */
    /* ---- minor 0 ends here; append only ---- */
} dt_schedule_result_v1_t;
#define DT_SCHEDULE_RESULT_V1_SIZE0 DT_FIELD_END(dt_schedule_result_v1_t, recv_wait_s)

typedef struct dt_strategy_ops_v1 {
    dt_plugin_info_t info; /* base first; info.kind == DT_KIND_STRATEGY */

    /* ---- lifecycle (mandatory) ---- */
    /* Create the instance and allocate its state for `args->model`
     * (dt_args_read the args).  Parameters are undefined
     * until the core calls set_state(DT_STATE_PARAMS) and state_loaded. */
    int (*init)(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                dt_strategy_t **out);
    void (*finalize)(dt_strategy_t *s);

    /* ---- the step (mandatory) ---- */
    /* Start a step: zero gradients, reset per-step bookkeeping. */
    int (*begin_step)(dt_strategy_t *s, int64_t step);
    int (*pre_forward)(dt_strategy_t *s, const dt_hook_v1_t *h,
                       dt_unit_buffers_v1_t *out);
    int (*post_forward)(dt_strategy_t *s, const dt_hook_v1_t *h);
    int (*pre_backward)(dt_strategy_t *s, const dt_hook_v1_t *h,
                        dt_unit_buffers_v1_t *out);
    int (*post_backward)(dt_strategy_t *s, const dt_hook_v1_t *h);
    /* Finish the step: wait for gradient reductions, compute the global
     * norm, clip, run the optimizer on what this rank owns, and make the
     * next forward see updated parameters.  Blocking, bounded by comm
     * timeouts.  A non-finite norm skips the update and sets nonfinite.
     * A strategy may defer a unit's update to the unit's next pre_forward
     * or pre_backward (ddp's stagger_update), provided get_state and
     * set_state apply it first: nothing outside sees the difference. */
    int (*step)(dt_strategy_t *s, const dt_step_args_v1_t *args,
                dt_step_result_v1_t *out);

    /* ---- state by global ranges (mandatory): checkpoints and init ---- */
    /* Ranges of unit `unit`'s flat index space this rank holds or saves for
     * state `kind`.  Writes up to `cap` ranges to `out` (may be NULL when
     * cap == 0) and the total count to *n. */
    int (*state_ranges)(dt_strategy_t *s, uint32_t unit, int kind,
                        int purpose, dt_range_t *out, uint32_t cap,
                        uint32_t *n);
    /* Copy state `kind` of global range `r` (inside a HELD range) to or from
     * host memory `buf` (r.count f32).  Blocking. */
    int (*get_state)(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                     float *buf);
    int (*set_state)(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                     const float *buf);
    /* All set_state calls are done: rebuild derived copies (compute-dtype
     * parameters, gathered replicas).  Collective over the group. */
    int (*state_loaded)(dt_strategy_t *s);

    /* ---- planning (mandatory; no instance needed) ---- */
    /* Predict per-rank memory and communication for `args`.  `host` carries
     * this plugin's resolved config (stage, sharding strategy). */
    int (*estimate)(const dt_host_v1_t *host, const dt_estimate_args_v1_t *args,
                    dt_estimate_v1_t *out);

    /* ---- optional slots ---- */
    /* The rows `dtrain plan` prints for this strategy (ZeRO's stages, FSDP's
     * sharding strategies): *out a static array of *n presets, valid while
     * the plugin is loaded.  Absent: one row, the plugin's defaults. */
    int (*plan_presets)(const dt_plan_preset_v1_t **out, uint32_t *n);

    /* ---- minor 0 ends here; append only ---- */

    /* ---- pipeline (minor 3, optional: a pipeline strategy has both) ---- */
    /* Map every unit to a stage (no instance: the planner calls it too):
     * out[u] in [0, n_stages) for each of model->n_units units, never
     * decreasing, every stage given at least one unit, by the plugin's
     * balance policy (its config).  DT_ERR_CONFIG naming the model and
     * the stage count when there are fewer units than stages. */
    int (*assign_stages)(const dt_host_v1_t *host, const dt_stage_args_v1_t *args,
                         uint32_t *out);
    /* One step of this stage: every micro-batch's forward and backward in
     * the schedule's order, boundary tensors received from stage - 1 and
     * sent to stage + 1 (their gradients the other way) on the pipeline
     * group, with the micro-batch as tag.  Collective over the pipeline
     * group; blocking, every wait bounded by the group's timeout: a dead
     * peer fails it with DT_ERR_REMOTE / DT_ERR_TIMEOUT and a message
     * naming the peer stage, the operation (send / recv of activation or
     * gradient), the micro-batch and the step.  The data strategy's
     * begin_step before and step after are the core's. */
    int (*run_schedule)(dt_strategy_t *s, const dt_schedule_args_v1_t *args,
                        dt_schedule_result_v1_t *out);
    /* ---- minor 3 ends here; append only ---- */

    /* ---- tensor parallelism (minor 6, optional: a tensor strategy has
     * it) ----
     * The model's layers know their math (which projection is column- or
     * row-parallel, the parallel cross-entropy: core/model/model.h); the
     * tensor strategy owns the tensor group and what crosses it.  Like
     * the pipeline strategy it holds no parameters: every rank's data
     * strategy holds that rank's parts (dt_param_split_v1_t), its group
     * the ranks holding the same parts.
     *
     * All-reduce `count` elements of `dtype` at device memory `buf`, in
     * place, with `op` (DT_OP_SUM, DT_OP_MAX) over the tensor group
     * (init.comm), ordered after the work enqueued on `stream`: the
     * partial sums of a row-parallel layer's output in forward, of a
     * column-parallel layer's input gradient in backward, the parallel
     * cross-entropy's row statistics.  With `req` NULL it returns when
     * `buf` holds the result; else it may return at once with the
     * operation in flight in *req, which the caller hands to
     * wait_activation before it reads `buf` (the model overlaps a
     * column-parallel layer's weight gradient with the reduction of its
     * input gradient, as Megatron-LM does).  Every wait is bounded by the
     * group's timeout: a dead peer fails it with DT_ERR_REMOTE /
     * DT_ERR_TIMEOUT and a message naming the operation, its size and the
     * group. */
    int (*reduce_activation)(dt_strategy_t *s, void *buf, uint64_t count, int dtype, int op,
                             dt_stream_t *stream, dt_comm_req_t **req);
    /* Wait for a reduce_activation that returned a request: DT_OK when
     * its buffer holds the result.  Frees the request either way. */
    int (*wait_activation)(dt_strategy_t *s, dt_comm_req_t *req);
    /* ---- minor 6 ends here; append only ---- */
} dt_strategy_ops_v1_t;

/* Current-version names. */
typedef dt_strategy_ops_v1_t dt_strategy_ops_t;
typedef dt_strategy_init_v1_t dt_strategy_init_t;
typedef dt_param_desc_v1_t dt_param_desc_t;
typedef dt_param_split_v1_t dt_param_split_t;
typedef dt_param_block_v1_t dt_param_block_t;
typedef dt_unit_desc_v1_t dt_unit_desc_t;
typedef dt_model_desc_v1_t dt_model_desc_t;
typedef dt_optim_desc_v1_t dt_optim_desc_t;
typedef dt_hook_v1_t dt_hook_t;
typedef dt_unit_buffers_v1_t dt_unit_buffers_t;
typedef dt_step_args_v1_t dt_step_args_t;
typedef dt_step_result_v1_t dt_step_result_t;
typedef dt_estimate_args_v1_t dt_estimate_args_t;
typedef dt_estimate_v1_t dt_estimate_t;
typedef dt_plan_preset_v1_t dt_plan_preset_t;
typedef dt_stage_args_v1_t dt_stage_args_t;
typedef dt_stage_runner_v1_t dt_stage_runner_t;
typedef dt_schedule_args_v1_t dt_schedule_args_t;
typedef dt_schedule_result_v1_t dt_schedule_result_t;

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_STRATEGY_H */
