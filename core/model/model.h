/*
 * core/model/model.h - models as ordered lists of units, built from the
 * device's kernel table and driven through a strategy's unit hooks.
 *
 * The model never owns parameters or their gradients: a strategy does.
 * Around each use of a unit the model asks the strategy for that unit's
 * buffers (pre_forward / pre_backward) and hands them back (post_*), so the
 * same model code runs replicated (ddp), sharded (zero-3, fsdp) or
 * offloaded.  The model owns activations, tagged DT_TAG_ACTIVATIONS.
 *
 * Architectures are model plugins ([model] arch names one; dtrain/model.h):
 * plugins/gpt2 (embedding, one unit per transformer block, head; the LM
 * head tied to wte) and plugins/mlp (a bigram Linear+GELU stack on the same
 * token data, a non-transformer shape for testing strategies).  The common
 * machinery (config dispatch, init, activations, the bf16 parameter views,
 * the services a plugin calls) is core/model/model.c.
 *
 * [model] dtype = "bf16" (or "fp16"): the strategy holds compute parameters
 * in bf16 (f16) (desc.param_dtype); matmuls read the weights so (the device's
 * wdtype), and the model casts the tensors other kernels read (norms,
 * biases, embedding tables) to the activation dtype in a scratch with the
 * device's cast kernel at each use.  The scratch holds one unit's such
 * tensors (tagged activations; for GPT-2 the largest is the embedding's
 * wte + wpe).  Every kernel call states its dtypes: activations (f32),
 * weights (desc.param_dtype), f32 gradients.  Gradients and the
 * optimizer's master copy are f32.
 */
#ifndef DT_MODEL_H
#define DT_MODEL_H

#include <stdint.h>

#include "config/config.h"
#include "dtrain/dtrain.h"

typedef struct dt_model dt_model_t;

/* dt_model_ctx_t, dt_model_info_t (arch, vocabulary, context, shape
 * keys), dt_model_key_t, dt_model_tp_comm_t and DT_MODEL_MAX_PARAMS /
 * _KEYS are the SDK's (dtrain/model.h): a model plugin reads them too. */

/* Tensor parallelism ([parallel] tensor = P > 1, Megatron-LM's layout):
 * each rank of a tensor group holds part of every large tensor and the
 * ranks' forward and backward are joined by all-reduces over the group.
 * GPT-2: attention heads and the MLP's hidden width split P ways (the QKV
 * projection and c_fc column-parallel, both c_proj row-parallel: one
 * all-reduce of activations after each row-parallel layer in forward, one
 * of activation gradients after each column-parallel layer in backward);
 * the vocabulary split into P near-equal ranges (the first V % P ranks
 * one row more: nothing is padded) for the embedding and the tied LM head,
 * whose loss is the parallel cross-entropy (the row maximum and the sums
 * of exponentials all-reduced; the full logits never exist on one rank).
 * n_head must divide by P (so n_embd and the MLP width do); the
 * vocabulary must have at least P tokens.  LayerNorms, the position
 * embedding and the row-parallel layers' biases stay whole on every rank:
 * their inputs and output gradients are the same on every rank of the
 * group (each is read after an all-reduce), so their gradients are too,
 * and a row-parallel bias is added by tensor rank 0 only, before the
 * all-reduce.  The description's tensors are this rank's parts, each with
 * a dt_param_split_t (ext) saying where it sits in the global tensor.
 * The collectives that join the parts are the tensor-parallel scheme's
 * (dtrain/tensor_parallel.h, [tensor] scheme): the model calls the
 * scheme's slot named after what it does for the layer (row_forward,
 * column_backward_start / _wait, embedding_forward, xent_reduce), and the
 * scheme calls the tensor group's communicator.  Backward overlaps a
 * column-parallel layer's weight gradient with the reduction of its input
 * gradient. */

/* Build the description (units, tensors) from the resolved config's
 * [model] table; presets fill the shape and are shown as "derived".  The
 * model runs on the kernel table of device plugin `dev` (its runtime
 * table; no instance is needed, so a planner describes models without
 * one): one lacking an optional kernel the arch needs is refused here
 * with DT_ERR_UNSUPPORTED naming the device, the kernel and the dtypes. */
int dt_model_create(dt_config_t *cfg, const dt_device_ops_t *dev, const dt_model_ops_t *arch,
                    dt_model_t **out);
/* The part of it rank `tp_rank` of a tensor group of `tp` ranks holds
 * ([parallel] tensor = tp; dt_model_create is the whole model, tp 1):
 * DT_ERR_CONFIG naming the dimension when the layout is impossible
 * ("[parallel] tensor = 4 does not divide [model] n_head = 6: attention
 * heads are split across the tensor group") or the arch has none (mlp);
 * DT_ERR_INVALID for a rank outside the group. */
int dt_model_create_part(dt_config_t *cfg, const dt_device_ops_t *dev,
                         const dt_model_ops_t *arch, int32_t tp, int32_t tp_rank,
                         dt_model_t **out);
/* The tensor-parallel scheme over the tensor group (needed before any
 * pass when P > 1): the plugin's table and instance, kept (the caller's,
 * living as long as the model). */
void dt_model_set_tensor(dt_model_t *m, dt_tensor_group_t *group);
/* Tensor p's global shape into shape[p->ndim] (its own unless it is a
 * tensor-parallel part: dt_param_split_t's) and its element count. */
uint64_t dt_model_param_global(const dt_param_desc_t *p, int64_t *shape);
/* The blocks of a part (sp: a split tensor's, copies 1) out of the global
 * tensor `global` (sp->global_shape, row-major) into `part`, one after
 * another: what the rank holds of it. */
void dt_model_gather_blocks(const dt_param_split_t *sp, int ndim, const float *global,
                            float *part);
/* Frees the description and, with `ctx` (may be NULL when no activations
 * were allocated), the device memory the model allocated. */
void dt_model_free(dt_model_t *m, const dt_model_ctx_t *ctx);

/* The description strategies see (valid while the model lives). */
dt_model_desc_t *dt_model_desc(dt_model_t *m);
/* Arch, vocabulary, context and shape keys, for any arch. */
const dt_model_info_t *dt_model_info(const dt_model_t *m);
/* The table of shape key `key` of a model of plugin `arch`: "model" for
 * a key of the core's [model] table, else `arch` (the plugin's own). */
const char *dt_model_key_table(const char *arch, const char *key);
/* The model plugin's table (the one dt_model_create was given) and the
 * state its slots take. */
const dt_model_ops_t *dt_model_ops(const dt_model_t *m);
dt_model_state_t *dt_model_state(dt_model_t *m);

/* Deterministic initial values of unit `unit` (host memory, unit.numel
 * floats), a function of (seed, tensor name) only: identical for any world
 * size or strategy.  Matrices and embeddings normal(0, 0.02) (GPT-2's
 * residual projections 0.02 / sqrt(2 n_layer)), biases 0, norm weights 1. */
int dt_model_init_unit(const dt_model_t *m, uint32_t unit, uint64_t seed, float *out);

/* Activation memory of one micro-batch of B sequences of T tokens: what
 * dt_model_alloc_acts allocates, tagged DT_TAG_ACTIVATIONS, under the
 * model's activation_checkpointing and dtype, counted without allocating
 * anything (the planner sizes 1.5B-parameter models with it).  Activations
 * are in the activation dtype (f32) whatever the parameter dtype; norm
 * statistics and losses are f32; a bf16 model adds the workspace that
 * casts one unit's norm/bias/embedding tensors to the activation dtype. */
typedef struct dt_model_act {
    uint64_t kept;      /* bytes the units keep from forward to backward:
                         * the sum of the units' act_bytes */
    uint64_t workspace; /* bytes reused across units and passes: gradient
                         * scratch, logits and their gradient, the
                         * recompute buffers of recomputed units, the
                         * bf16 view */
    uint64_t total;     /* kept + workspace */
} dt_model_act_t;

/* The activation bytes for B x T.  `unit_bytes` (NULL, or desc.n_units
 * entries) receives each unit's kept bytes: its output (the next unit's
 * input), and unless backward recomputes the unit, the intermediate tensors
 * its backward reads; the embedding also counts the input tokens, the
 * head the targets.  DT_ERR_INVALID naming the bad B or T. */
int dt_model_act_bytes(const dt_model_t *m, int64_t B, int64_t T, uint64_t *unit_bytes,
                       dt_model_act_t *out);
/* dt_model_act_bytes, and set every unit's desc.units[u].act_bytes to
 * its kept bytes (the planner's dt_estimate_args_t.act_bytes is
 * out->total).  dt_model_alloc_acts does this itself. */
int dt_model_plan_acts(dt_model_t *m, int64_t B, int64_t T, dt_model_act_t *out);

/* Allocate activations for micro-batches of B sequences of T tokens and
 * set the units' act_bytes (dt_model_plan_acts): the bytes allocated are
 * exactly the plan's total (checked, per unit). */
int dt_model_alloc_acts(dt_model_t *m, const dt_model_ctx_t *ctx, int64_t B, int64_t T);

/* One micro-batch: forward (and, unless `no_grad`, backward) of
 * inputs/targets (B, T) i32 host arrays, every token in [0, vocab_size).
 * *loss receives the mean loss of this micro-batch.  Backward scales the
 * loss gradient by `loss_scale` (1 / n_micro for gradient accumulation). */
int dt_model_step_micro(dt_model_t *m, const dt_model_ctx_t *ctx, const int32_t *inputs,
                        const int32_t *targets, uint32_t micro, uint32_t n_micro,
                        int no_grad, float loss_scale, double *loss);

/* ---- pipeline stages (the schedule plugin, sdk schedule.h) ----
 *
 * A stage runs the contiguous units [first, end).  Between stage k and
 * stage k + 1 flows one boundary tensor per micro-batch: the activation
 * unit end - 1 outputs, (B, T, boundary_width) in dt_model_act_dtype
 * (dt_model_boundary_count elements), and its gradient flows back.  The
 * first stage reads the tokens, the last computes the loss; the hooks of
 * the stage's units (and of the units dt_model_stage_tied lists) are
 * called exactly as a whole-model step calls them, so a data strategy
 * holding only those units sees an ordinary step.  A backward reads the
 * activations the last forward into the same slot left (dt_model_use_slot):
 * the caller runs a micro-batch's forward into a slot and its backward on
 * that slot, recomputing the forward when another micro-batch's took the
 * slot in between.
 * Running [0, n_units) is dt_model_step_micro's own path. */

/* Before dt_model_alloc_acts: this rank runs units [first, end) only (a
 * pipeline stage), so activations are planned (dt_model_act_bytes) and
 * allocated for those: a unit of the stage keeps everything, the unit
 * before it only its output (the stage's input boundary), the others
 * nothing; the workspace drops the logits and their gradient unless the
 * stage ends with the head.  Stage passes must then name this stage, and
 * whole-model passes are refused.  DT_ERR_INVALID for another stage
 * after allocation (the same one is a no-op); the range is
 * dt_model_stage_check's. */
int dt_model_set_stage(dt_model_t *m, uint32_t first, uint32_t end);
/* Before dt_model_alloc_acts: keep the activations of `n` micro-batches at
 * once (n "slots"; 1 by default), so a pipeline stage runs a micro-batch's
 * backward on the activations its forward left, with others' forwards in
 * between, rather than recomputing that forward (1F1B keeps at most the
 * stage count in flight).  What each unit keeps (dt_model_act_bytes's
 * per-unit bytes) is allocated n times, the workspace once.
 * DT_ERR_CONFIG for n > 1 on an arch without slots (mlp), DT_ERR_INVALID
 * after allocation or for n = 0. */
int dt_model_set_slots(dt_model_t *m, uint32_t n);
uint32_t dt_model_slots(const dt_model_t *m);
/* Forward writes, and backward reads, slot i from now on (slot 0 after
 * allocation); the slot's tokens and targets go with it.  DT_ERR_INVALID
 * for i >= the slot count or before allocation. */
int dt_model_use_slot(dt_model_t *m, uint32_t i);
/* An interleaved pipeline's rank runs several unit ranges ("chunks",
 * virtual stages): dt_model_set_stage for n of them at once, in model
 * order without overlap, each a stage of its own for the passes (the unit
 * before each keeps its output).  At most DT_MODEL_MAX_CHUNKS. */
#define DT_MODEL_MAX_CHUNKS 16
int dt_model_set_stages(dt_model_t *m, uint32_t n, const uint32_t *first, const uint32_t *end);
/* The ranges set (the whole model's one by default) into first[] / end[]
 * (DT_MODEL_MAX_CHUNKS entries): their count. */
uint32_t dt_model_stages(const dt_model_t *m, uint32_t *first, uint32_t *end);
/* DT_OK when units [first, end) can be a stage of this model; else
 * DT_ERR_CONFIG naming the arch (one that cannot be split) or
 * DT_ERR_INVALID naming the range. */
int dt_model_stage_check(const dt_model_t *m, uint32_t first, uint32_t end);
/* Elements of one boundary tensor at the B x T of dt_model_alloc_acts. */
uint64_t dt_model_boundary_count(const dt_model_t *m);
/* The units outside [first, end) whose parameters the stage also reads
 * (GPT-2's last stage: unit 0, for the tied LM head), into out[cap]:
 * their count. */
uint32_t dt_model_stage_tied(const dt_model_t *m, uint32_t first, uint32_t end, uint32_t *out,
                             uint32_t cap);
/* Forward of micro-batch `micro` (of n_micro) through the stage: the
 * first stage copies `inputs`, others read `in` (device, boundary before
 * unit `first`); the last stage copies `targets` and sets *loss to the
 * micro-batch's mean loss, others write `out` (device, boundary after unit
 * end - 1; NULL: not wanted, a recompute) and leave *loss alone.  inputs /
 * targets are (B, T) host i32, checked against the vocabulary where read.
 * `no_grad`: an evaluation pass (hooks flagged DT_HOOK_NO_GRAD). */
int dt_model_stage_forward(dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t first, uint32_t end,
                           const int32_t *inputs, const int32_t *targets, const void *in,
                           void *out, uint32_t micro, uint32_t n_micro, int no_grad,
                           double *loss);
/* Backward of the micro-batch the stage's last forward ran: from the loss
 * (scaled by loss_scale, as dt_model_step_micro) on the last stage, else
 * from `dout` (the gradient of `out`); writes the gradient of `in` to
 * `din` unless the stage is the first. */
int dt_model_stage_backward(dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t first,
                            uint32_t end, const void *dout, void *din, uint32_t micro,
                            uint32_t n_micro, float loss_scale);

/* After a non-finite loss or gradient: re-run the forward of the
 * micro-batch inputs/targets (B, T of dt_model_alloc_acts) like an
 * evaluation pass (hooks flagged DT_HOOK_NO_GRAD, micro-batch 0 of 1, no
 * backward, no gradient touched), copying each parameter tensor as the
 * kernels read it and each kernel's output to the host, and write to
 * `out` a phrase naming the first that holds a NaN or Inf, e.g.
 *   "activation h.1.mlp.c_fc output (unit block.1), after the forward of
 *    h.1.mlp.c_fc: element 37 of 4096 is inf"
 *   "parameter h.0.attn.c_attn.weight as the forward reads it (unit
 *    block.0): element 5 of 768 is nan" (the strategy's compute copy)
 * or, when all of it is finite, DT_MODEL_FORWARD_FINITE.  Overwrites the
 * activations (and dt_model_logits) as an evaluation pass does; with a
 * sharding strategy the hooks are collective, so every rank of the group
 * must call it.  Slow (a host copy of every tensor): for diagnosis only.
 * On failure returns the status and `out` says the search failed. */
int dt_model_find_nonfinite(dt_model_t *m, const dt_model_ctx_t *ctx, const int32_t *inputs,
                            const int32_t *targets, char *out, size_t cap);
#define DT_MODEL_FORWARD_FINITE                                                                \
    "none in the forward of this rank's last micro-batch (every parameter and activation "     \
    "is finite): the gradient went non-finite in backward, or another micro-batch or rank "    \
    "went non-finite"

/* The same search around stage passes (a pipeline rank's: the forward of
 * a step's micro-batches through the schedule, flagged DT_HOOK_NO_GRAD,
 * each stage probing its own units): between dt_model_probe_begin and
 * dt_model_probe_end every forward copies each parameter tensor as the
 * kernels read it and each kernel's output to the host, and the first
 * that holds a NaN or Inf is written to `out` (cap bytes, kept by the
 * caller) as dt_model_find_nonfinite words it.  probe_end returns 1 when
 * one was found, else 0 with DT_MODEL_FORWARD_FINITE in `out`.
 * DT_ERR_INVALID when a search is already running. */
int dt_model_probe_begin(dt_model_t *m, char *out, size_t cap);
int dt_model_probe_end(dt_model_t *m);

/* After a step whose gradient overflowed: re-run forward and backward of
 * the micro-batch inputs/targets as micro-batch 0 of 1 with the loss
 * scaled by `loss_scale`, copying each unit's parameter gradient to the
 * host as backward leaves it (after the unit's kernels, before the
 * strategy's post_backward reduces it), and write to `out` a phrase naming
 * the first parameter whose gradient holds a NaN or Inf, in backward
 * order, e.g. "gradient of parameter h.1.mlp.c_proj.weight (unit block.1),
 * after the backward of unit block.1: element 37 of 4096 is inf", or when
 * every one is finite DT_MODEL_GRADS_FINITE followed by the largest
 * gradient element and its tensor ("; the largest: gradient of parameter
 * wte (unit embedding): element 5 of 8192 is 1.2e+05 (above 65504, the
 * largest f16: ...)"), which is where a 16-bit reduction overflows.  The caller begins a step
 * first (the gradient buffers zeroed) and abandons it after: the
 * gradients are accumulated as in a real step and the hooks are those of
 * one (collective under every data-parallel strategy: every rank of the
 * group calls it).  Slow: for diagnosis only.  On failure returns the
 * status and `out` says the search failed. */
int dt_model_find_nonfinite_grad(dt_model_t *m, const dt_model_ctx_t *ctx,
                                 const int32_t *inputs, const int32_t *targets,
                                 float loss_scale, char *out, size_t cap);
/* The same search around stage passes (a pipeline rank's: the forward
 * and backward of a step's micro-batches through the schedule, each stage
 * probing its own units' gradients): between dt_model_grad_probe_begin
 * and dt_model_grad_probe_end each unit's gradient is copied to the host
 * as backward leaves it, and the first holding a NaN or Inf is written to
 * `out` (cap bytes, kept by the caller).  grad_probe_end returns 1 when
 * one was found; else 0, with DT_MODEL_GRADS_FINITE and the largest
 * gradient element in `out` and its magnitude in *max_abs (may be NULL).
 * DT_ERR_INVALID when a search is already running. */
int dt_model_grad_probe_begin(dt_model_t *m, char *out, size_t cap);
int dt_model_grad_probe_end(dt_model_t *m, double *max_abs);
#define DT_MODEL_GRADS_FINITE                                                                  \
    "none in this rank's backward of its last micro-batch (every parameter gradient is "       \
    "finite before the reduction): another micro-batch or rank overflowed, or the reduction "  \
    "did (a 16-bit reduce_dtype)"

/* The logits of the last forward, (B, T, vocab_size) device memory in the
 * activation dtype (dt_model_act_dtype), valid until the next step_micro
 * (evaluation tools, tests). */
const void *dt_model_logits(const dt_model_t *m);
/* The dtype activations (and logits) are held and computed in: DT_F32. */
int dt_model_act_dtype(const dt_model_t *m);

/* Tensor parallelism: the all-reduces over the tensor group one
 * micro-batch of B x T runs on this rank (its pipeline stage's units
 * only): how many, and their bytes, in forward and in backward (a
 * recomputed block's forward runs again in backward).  All zero at
 * tensor degree 1.  GPT-2: forward 2 per block (the attention and MLP
 * outputs, B x T x n_embd activations each) + 1 (the embedding's) + 2
 * (the cross-entropy's row maxima and sums, B x T and 2 B x T f32);
 * backward 2 per block (the LayerNorm inputs' gradients) + 1 (the LM
 * head's input gradient): Megatron's 2 + 2 per transformer block. */
void dt_model_tp_comm(const dt_model_t *m, int64_t B, int64_t T, dt_model_tp_comm_t *out);

/* The FLOPs of one forward+backward token unit by unit, into out[n_units]
 * (a pipeline's balance by compute): their sum is
 * dt_model_flops_per_token's, each unit's share where it runs (GPT-2: a
 * block's 6 per parameter and its attention, the LM head's 6 V n_embd in
 * the head unit, the embedding's lookups 0).  The whole model's counts,
 * whatever part of it this rank holds. */
void dt_model_unit_flops(const dt_model_t *m, int64_t T, double *out);

/* FLOPs of one forward+backward token (for MFU): 6 per matmul parameter,
 * plus attention's for GPT-2. */
double dt_model_flops_per_token(const dt_model_t *m, int64_t T);

#endif /* DT_MODEL_H */
