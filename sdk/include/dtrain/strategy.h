/*
 * dtrain/strategy.h - the parallel strategy ABI (plugin kind "strategy").
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * A data strategy owns how parameters, gradients and optimizer state are
 * held along the data-parallel dimension (ddp, zero, fsdp); a pipeline's
 * schedule (schedule.h) and a tensor-parallel scheme (tensor_parallel.h)
 * are kinds of their own.  The core describes the model as an ordered
 * list of UNITS (the embedding, each transformer block, the head): the
 * granularity that is gathered, sharded and reduced.  Each unit's
 * parameters form one flat f32 index space [0, unit.numel); a shard is a
 * range of it.
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
 * Pipeline parallelism.  World = tp x pp x dp (core/train/
 * grid.h: tp fastest, then dp, then pp).  The pipeline's schedule is a
 * plugin of its own kind (schedule.h), which owns the order of a step and
 * the boundary transfers; the DATA strategy (ddp, zero, fsdp) is
 * initialised over the data group as ever, but told which units its stage
 * holds (init.unit_flags): it allocates, hooks, reduces, updates and saves
 * only those.  The gradient norm it reports counts every element once
 * across the whole model: its own sum of squares is summed over
 * init.norm_comm (the model's other ranks) too, and so is the non-finite
 * flag.
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
 * Interleaved stages: a stage may run several chunks (virtual
 * stages chunk x pp + stage, schedule.h), so the units it
 * holds need not be contiguous.  Its units' backwards then interleave
 * across micro-batches chunk by chunk: a data strategy that groups units
 * for a reduction and counts their last uses per micro-batch must not
 * group units of two chunks (the shard engine keeps them apart).
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
#define DT_STRATEGY_ABI_MINOR 0

/* A strategy instance (dt_strategy_t): opaque to the core, the plugin's own struct, which
 * must start with a pointer to the table that made it (libfabric's rule):
 *     struct dt_strategy { const dt_strategy_ops_v1_t *ops; ... };  // ops = &my_ops
 * so a handle alone is enough to call it: dt_strategy_ops(s)->slot(s, ...).
 * The core refuses a handle whose first member is not the table it
 * loaded from the plugin. */
typedef struct dt_strategy dt_strategy_t; /* plugin instance, opaque */

/* ------------------------------------------------------------------------
 * The model as strategies see it.
 * --------------------------------------------------------------------- */

/* Flags of a parameter tensor. */
#define DT_PARAM_NO_DECAY 0x1u /* exempt from weight decay (biases, norms) */

/* Tensor parallelism: what part of a global tensor this rank
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
    const void *ext;    /* NULL, or (tensor parallelism) a
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
    /* Instances, each starting with its table (dt_device_ops(dev) etc.) */
    dt_device_t *dev;
    dt_stream_t *compute_stream; /* where the core runs kernels */
    dt_comm_t *comm;           /* this strategy's group (dp, tp or pp) */
    dt_offload_t *offload;     /* NULL: no offload tier */
    const dt_model_desc_v1_t *model; /* valid until finalize */
    const dt_optim_desc_v1_t *optim; /* valid until finalize (a pointer, so
                                      * either struct grows on its own) */
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
    /* ---- minor 0 ends here; append only ---- */
} dt_strategy_init_v1_t;
#define DT_STRATEGY_INIT_V1_SIZE0 DT_FIELD_END(dt_strategy_init_v1_t, tied_comm)

/* dt_strategy_init_v1_t.unit_flags. */
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
    float loss_scale;    /* the factor every gradient carries: the core
                          * multiplied the loss by it before backward (fp16
                          * loss scaling); 0 = absent = 1.  The strategy
                          * divides it out before everything else: the norm
                          * it reports and clips by, and the update are
                          * those of the unscaled gradient.  A non-finite
                          * (overflowed) gradient anywhere in the group
                          * skips the update with nonfinite = 1, as ever. */
    uint32_t reserved1;
    /* ---- minor 0 ends here; append only ---- */
} dt_step_args_v1_t;
#define DT_STEP_ARGS_V1_SIZE0 DT_FIELD_END(dt_step_args_v1_t, reserved1)

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
    uint32_t offload;            /* 1: [parallel] offload names a tier; the
                                  * strategy's own config says what goes
                                  * there, and the bytes the tier would hold
                                  * are planned under DT_TAG_OFFLOAD (the
                                  * other tags stay device memory) */
    uint32_t reserved1;
    /* ---- minor 0 ends here; append only ---- */
} dt_estimate_args_v1_t;
#define DT_ESTIMATE_ARGS_V1_SIZE0 DT_FIELD_END(dt_estimate_args_v1_t, reserved1)

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
    uint64_t offload_bytes_per_step; /* with args->offload: bytes this rank
                                   * reads from and writes to the tier per
                                   * step (`dtrain plan` prefers the least
                                   * of it among offload choices that fit);
                                   * 0: the planner assumes every byte held
                                   * is read and written once */
    /* ---- minor 0 ends here; append only ---- */
} dt_estimate_v1_t;
#define DT_ESTIMATE_V1_SIZE0 DT_FIELD_END(dt_estimate_v1_t, offload_bytes_per_step)

/* A row `dtrain plan` prints for a strategy: its label and the settings of
 * the plugin's own table that select it.  Frozen for the major (an array
 * element). */
typedef struct dt_plan_preset_v1 {
    const char *label;   /* "zero-2", "fsdp FULL_SHARD" */
    const char *set;     /* "key=value" assignments in the plugin's table,
                          * separated by spaces ("stage=2"); NULL or "": the
                          * defaults */
} dt_plan_preset_v1_t;

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
} dt_strategy_ops_v1_t;

/* Current-version names. */
typedef dt_strategy_ops_v1_t dt_strategy_ops_t;

/* The table instance `s` was made by: its first member (the rule at
 * dt_strategy_t above); NULL for a NULL handle. */
static inline const dt_strategy_ops_v1_t *dt_strategy_ops(const dt_strategy_t *s)
{
    return s ? *(const dt_strategy_ops_v1_t *const *)(const void *)s : NULL;
}
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

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_STRATEGY_H */
