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

typedef struct dt_strategy dt_strategy_t; /* plugin instance, opaque */

/* ------------------------------------------------------------------------
 * The model as strategies see it.
 * --------------------------------------------------------------------- */

/* Flags of a parameter tensor. */
#define DT_PARAM_NO_DECAY 0x1u /* exempt from weight decay (biases, norms) */

/* One parameter tensor inside a unit's flat buffer. */
typedef struct dt_param_desc_v1 {
    const char *name;   /* global name, GPT-2's ("h.3.attn.c_attn.weight") */
    uint64_t offset;    /* first element in the unit's flat buffer */
    uint64_t numel;     /* elements */
    int32_t ndim;       /* 1..4 */
    uint32_t flags;     /* DT_PARAM_* */
    int64_t shape[4];   /* global shape, row-major */
    /* Tensor parallelism (set by a strategy's transform_model; 0 / -1 when
     * unsplit): this rank holds part `split_index` of `split_parts` along
     * dimension `split_dim` of `shape`. */
    int32_t split_dim;
    int32_t split_parts;
    int32_t split_index;
    int32_t reserved0;
} dt_param_desc_v1_t;

typedef struct dt_unit_desc_v1 {
    const char *name;        /* "embedding", "block.3", "head" */
    uint32_t index;          /* position in the model, 0-based */
    uint32_t n_params;
    dt_param_desc_v1_t *params; /* n_params entries, ordered by offset */
    uint64_t numel;          /* flat length: sum of params' numel */
    uint64_t act_bytes;      /* activation bytes one micro-batch keeps for
                              * backward (planner estimate) */
    int32_t stage;           /* pipeline stage owning this unit (0 if none) */
    int32_t reserved0;
} dt_unit_desc_v1_t;

typedef struct dt_model_desc_v1 {
    const char *arch;        /* "gpt2", "mlp" */
    uint32_t n_units;
    uint32_t reserved0;
    dt_unit_desc_v1_t *units;
    uint64_t numel;          /* all units */
    int32_t param_dtype;     /* dtype of parameters kernels read (f32/bf16) */
    int32_t reserved1;
} dt_model_desc_v1_t;

/* Optimizer selection and hyper-parameters (learning rate comes per step). */
typedef enum dt_optim_kind { DT_OPTIM_ADAMW = 0, DT_OPTIM_SGD = 1 } dt_optim_kind_t;

typedef struct dt_optim_desc_v1 {
    int32_t kind;         /* dt_optim_kind_t */
    int32_t nesterov;     /* SGD */
    float beta1, beta2, eps; /* AdamW */
    float momentum;       /* SGD */
    float weight_decay;   /* applied to params without DT_PARAM_NO_DECAY */
    float reserved0;
} dt_optim_desc_v1_t;

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
    dt_model_desc_v1_t *model; /* valid until finalize; read-only after
                                * transform_model */
    dt_optim_desc_v1_t optim;
} dt_strategy_init_v1_t;

/* Passed to every unit hook. */
#define DT_HOOK_NO_GRAD 0x1u /* evaluation pass: no backward follows */

typedef struct dt_hook_v1 {
    uint32_t unit;       /* unit index */
    uint32_t micro;      /* micro-batch in [0, n_micro) */
    uint32_t n_micro;
    uint32_t flags;      /* DT_HOOK_* */
    int32_t last_use;    /* post_backward: 1 when the unit's gradient for
                          * this micro-batch is complete */
    int32_t reserved0;
} dt_hook_v1_t;

/* What pre_forward / pre_backward hand the core: the unit's full flat
 * parameters (in model->param_dtype) and, in backward, its full flat f32
 * gradient buffer that kernels accumulate into. */
typedef struct dt_unit_buffers_v1 {
    const void *params;  /* (unit.numel) device memory */
    float *grads;        /* (unit.numel) device memory; NULL in forward */
} dt_unit_buffers_v1_t;

typedef struct dt_step_args_v1 {
    int64_t step;        /* 1-based optimizer step (AdamW bias correction) */
    float lr;
    float clip;          /* max global grad norm; <= 0: no clipping */
} dt_step_args_v1_t;

typedef struct dt_step_result_v1 {
    double grad_norm;    /* global L2 norm before clipping, over the whole
                          * model and all ranks (each element once) */
    int32_t nonfinite;   /* 1: the norm was NaN/Inf and no update was made */
    int32_t reserved0;
} dt_step_result_v1_t;

/* Planner input: what a strategy needs to predict per-rank memory. */
typedef struct dt_estimate_args_v1 {
    uint32_t struct_size;
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
} dt_estimate_args_v1_t;

typedef struct dt_estimate_v1 {
    uint64_t bytes[DT_TAG_COUNT]; /* predicted peak per rank, per tag */
    uint64_t comm_bytes_per_step; /* bytes this rank sends per step */
    char note[160];               /* e.g. "params gathered per unit (3x 1 unit)" */
} dt_estimate_v1_t;

/* Pipeline schedules (optional run_schedule slot).  The core supplies
 * these callbacks; the strategy decides their order (GPipe, 1F1B) and moves
 * boundary activations between stages with its comm's send/recv. */
typedef struct dt_schedule_v1 {
    void *ctx;
    uint32_t n_micro;
    uint32_t reserved0;
    uint64_t act_numel;  /* f32 elements of one boundary activation */
    /* Run this stage's units forward on micro-batch m.  `in` is the
     * previous stage's output (NULL on the first stage); `out` receives this
     * stage's output (NULL on the last stage, which computes the loss). */
    int (*forward)(void *ctx, uint32_t m, const float *in, float *out);
    /* Backward on micro-batch m: `dout` is the gradient of this stage's
     * output (NULL on the last stage); `din` receives the gradient of its
     * input (NULL on the first stage). */
    int (*backward)(void *ctx, uint32_t m, const float *dout, float *din);
} dt_schedule_v1_t;

typedef struct dt_strategy_ops_v1 {
    dt_plugin_info_t info; /* base first; info.kind == DT_KIND_STRATEGY */

    /* ---- lifecycle (mandatory) ---- */
    /* Create the instance and allocate its state for `args->model` (after
     * transform_model, if the strategy has one).  Parameters are undefined
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
    /* Model-parallel strategies: rewrite `model` before init (tensor: set
     * split fields and shrink numel; pipeline: assign units to stages).
     * Called once with the world's comm for this dimension. */
    int (*transform_model)(const dt_host_v1_t *host, dt_comm_t *comm,
                           const dt_comm_ops_v1_t *comm_ops,
                           dt_model_desc_v1_t *model);
    /* Tensor parallelism: all-reduce a partial activation (forward, after a
     * row-parallel matmul) or activation gradient (backward, before a
     * column-parallel one) across the group.  (n) f32 in place. */
    int (*reduce_activation)(dt_strategy_t *s, float *buf, uint64_t n);
    /* Pipelines: drive the micro-batches of one step through `sched`
     * instead of the core's plain loop. */
    int (*run_schedule)(dt_strategy_t *s, const dt_schedule_v1_t *sched);

    /* ---- minor 0 ends here; append only ---- */
} dt_strategy_ops_v1_t;

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_STRATEGY_H */
