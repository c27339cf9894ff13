/*
 * core/model/model_arch.h - what an architecture (gpt2.c, mlp.c) plugs
 * into the arch-independent model code (model.c), and the helpers it may
 * use: describing units and tensors, device allocations the model frees,
 * strategy hooks with context in messages, and parameter views.
 *
 * model.c owns the common step: token checks and copies, the loss mean
 * from per-position losses, and freeing.  An arch describes its units in
 * `create`, counts its activation bytes in `act_bytes`, allocates them in
 * `alloc_acts` (model.c checks the two agree, unit by unit), and runs
 * `forward` (ending with m->losses filled) and `backward` through the
 * hooks.  `forward` passes each kernel's output to dt_model_probe, which
 * does nothing except inside dt_model_find_nonfinite.
 */
#ifndef DT_MODEL_ARCH_H
#define DT_MODEL_ARCH_H

#include "model/model.h"
#include "util/error.h" /* DT_TRY_UNIT */


/* How a tensor is initialised and which kernels read it. */
typedef enum dt_tensor_kind {
    DT_TENSOR_MATRIX = 0, /* normal(0, std), decays; read only by matmuls,
                           * straight from the strategy's buffer */
    DT_TENSOR_EMBED = 1,  /* normal(0, std), decays; an embedding lookup
                           * reads it in the activation dtype (and a tied
                           * head may matmul it) */
    DT_TENSOR_BIAS = 2,   /* zeros, NO_DECAY; read in the activation dtype */
    DT_TENSOR_NORM = 3    /* ones, NO_DECAY; read in the activation dtype
                           * (norm weights) */
} dt_tensor_kind_t;

/* Per tensor, beside its dt_param_desc_t. */
typedef struct dt_tensor_extra {
    int kind;          /* dt_tensor_kind_t */
    double std;        /* MATRIX, EMBED */
    uint64_t view_off; /* non-MATRIX: offset (elements) in the unit's view */
    /* Tensor parallelism (m->tp > 1): the part of the global tensor this
     * rank holds (dt_model_part); the description's ext points here. */
    dt_param_split_t split;
} dt_tensor_extra_t;

/* A unit's parameters as kernels read them.  `w[k]` is tensor k in the
 * strategy's buffer (desc.param_dtype: pass m->wdtype to matmuls); `a[k]`
 * is tensor k in the activation dtype (m->adtype), as every kernel but a
 * matmul's weight reads it: the same memory when the two dtypes agree,
 * else a copy in the model's view scratch (NULL for matrices and when not
 * asked for). */
typedef struct dt_unit_view {
    const void *w[DT_MODEL_MAX_PARAMS];
    const void *a[DT_MODEL_MAX_PARAMS];
} dt_unit_view_t;

/* Which units backward recomputes instead of keeping their activations
 * ("activation checkpointing", [model] activation_checkpointing: none,
 * all, every checkpoint_every-th).  Named recompute, not checkpoint: model
 * checkpoints are core/ckpt/'s. */
enum { DT_RECOMPUTE_NONE = 0, DT_RECOMPUTE_ALL = 1, DT_RECOMPUTE_EVERY = 2 };

/* dt_model_dalloc's bytes count for m->act_owner: a unit index, or this
 * for the workspace (memory no unit keeps from forward to backward). */
#define DT_ACT_WORKSPACE UINT32_MAX

typedef struct dt_model_probe dt_model_probe_t; /* model.c */

/* Hook phases, in the order a unit sees them. */
enum { DT_PRE_FORWARD = 0, DT_POST_FORWARD = 1, DT_PRE_BACKWARD = 2, DT_POST_BACKWARD = 3 };

typedef struct dt_model_arch {
    const char *name; /* [model] arch */
    /* Describe the units (dt_model_alloc_units, dt_model_add_param) and
     * fill m->info's shape keys; the config's [model] table is applied. */
    int (*create)(dt_model_t *m, dt_config_t *cfg);
    /* The bytes alloc_acts allocates for B x T under m's recompute mode,
     * without allocating: adds to unit[u] what unit u keeps from forward to
     * backward and to *workspace the rest (gradient scratch, logits, the
     * recompute buffers of recomputed units).  Sizes the device decides
     * (attention's saved state) come from the same kernel-table queries
     * alloc_acts uses, so plan and allocation agree to the byte.  Doubles:
     * every count is an integer, exact below 2^53 bytes (model.c refuses
     * larger totals).  DT_OK, or a failing query's status with the
     * message set. */
    int (*act_bytes)(const dt_model_t *m, int64_t B, int64_t T, double *unit,
                     double *workspace);
    /* Activations for m->B x m->T through dt_model_dalloc, with
     * m->act_owner set to the unit (or DT_ACT_WORKSPACE) each allocation
     * counts for, as act_bytes counts it; must set m->logits (BT, V),
     * m->probs (BT, V) and m->losses (BT). */
    int (*alloc_acts)(dt_model_t *m, const dt_model_ctx_t *ctx);
    /* Forward of the micro-batch in m->tokens / m->targets (device). */
    int (*forward)(dt_model_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h);
    /* Backward; the loss gradient is dloss = loss_scale / (B T) per
     * position (mean loss). */
    int (*backward)(dt_model_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h,
                    float loss_scale);
    /* Optional (NULL: the arch runs whole only): forward and backward of
     * the units [first, end) of a pipeline stage, `in` / `din` the
     * boundary tensor before unit `first` (unused when first == 0), `out`
     * / `dout` the one after unit end - 1 (unused when the stage ends with
     * the model's last unit, which computes the loss); dt_model_stage_*
     * checks the range.  An arch that has them runs its whole model as
     * the one stage [0, n_units), so there is one implementation. */
    int (*stage_forward)(dt_model_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h,
                         uint32_t first, uint32_t end, const void *in, void *out);
    int (*stage_backward)(dt_model_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h,
                          uint32_t first, uint32_t end, const void *dout, void *din,
                          float loss_scale);
    /* Optional (NULL: one slot only): make slot i (< m->n_slots) the one
     * forward writes and backward reads.  A slot is what one micro-batch
     * keeps from forward to backward, what act_bytes adds to unit[]:
     * alloc_acts allocates m->n_slots of those (and one workspace), so a
     * pipeline stage holds several micro-batches' activations at once
     * (dt_model_set_slots). */
    void (*use_slot)(dt_model_t *m, uint32_t i);
    double (*flops_per_token)(const dt_model_t *m, int64_t T);
    /* Optional (NULL: each unit's share of flops_per_token by its
     * parameters): flops_per_token unit by unit (dt_model_unit_flops). */
    void (*unit_flops)(const dt_model_t *m, int64_t T, double *out);
    /* Optional (NULL: none): the tensor group's all-reduces one
     * micro-batch of B x T runs through this rank's units (m->tp > 1),
     * as forward and backward issue them (dt_model_tp_comm). */
    void (*tp_comm)(const dt_model_t *m, int64_t B, int64_t T, dt_model_tp_comm_t *out);
    void (*free)(dt_model_t *m); /* host state in m->arch_state; NULL ok */
    /* The optional kernels (beyond the kernel table's core set) the arch
     * calls, checked once by dt_model_create with DT_MODEL_NEED; NULL when
     * the core set is enough. */
    int (*need_kernels)(const dt_model_t *m);
} dt_model_arch_t;

extern const dt_model_arch_t dt_model_arch_gpt2;
extern const dt_model_arch_t dt_model_arch_mlp;

struct dt_model {
    dt_model_desc_t desc;
    dt_model_info_t info;
    const dt_model_arch_t *arch;
    void *arch_state;
    dt_tensor_extra_t **extra; /* [unit][param] */
    const dt_kernels_t *kern;  /* the device's kernel table */
    const char *dev_name;      /* its plugin's name, for messages */
    int wdtype;                /* desc.param_dtype: DT_F32, DT_BF16, DT_F16 */
    /* Activations, their gradients and the non-matrix parameters as the
     * kernels read them: DT_F32 (the dtype every call states; a [model]
     * key chooses it once a device runs bf16 activations). */
    int adtype;
    /* Tensor parallelism ([parallel] tensor, dt_model_create_part): this
     * rank's place in the tensor group and the scheme whose collectives
     * join the parts (dt_model_set_tensor); tp 1: none. */
    int32_t tp, tp_rank;
    const dt_tensor_ops_t *tp_ops;
    dt_tensor_group_t *tp_group;
    /* The vocabulary columns this rank's logits hold: [vocab_first,
     * vocab_first + vocab_local), the whole vocabulary unless tp > 1. */
    int64_t vocab_first, vocab_local;
    float *xent_stats;         /* tp > 1: (3, B*T) f32, the parallel
                                * cross-entropy's row state */
    int recompute_mode;        /* DT_RECOMPUTE_* */
    int64_t recompute_every;   /* [model] checkpoint_every */
    /* The units this rank runs (dt_model_set_stages): n_chunks ranges
     * [chunk_first[i], chunk_end[i]) in model order; one, the whole model,
     * unless a pipeline stage was set (an interleaved pipeline's rank runs
     * several).  Activations are planned and allocated for those only. */
    uint32_t n_chunks;
    uint32_t chunk_first[DT_MODEL_MAX_CHUNKS], chunk_end[DT_MODEL_MAX_CHUNKS];
    /* Activation slots (dt_model_set_slots): n_slots micro-batches'
     * activations kept at once; each slot's device tokens and targets
     * (m->tokens / m->targets are the slot in use's). */
    uint32_t n_slots;
    int32_t **slot_tokens, **slot_targets;
    /* activations, common to every arch (B, T of dt_model_alloc_acts) */
    int64_t B, T;
    int32_t *tokens, *targets; /* (B, T) device */
    void *logits, *probs;      /* (B, T, V) adtype */
    float *losses;             /* (B, T) */
    float *host_losses;        /* (B, T) host */
    void *view;                /* wdtype != adtype: view scratch, view_numel
                                * elements of adtype */
    uint64_t view_numel;       /* largest unit's non-matrix tensors */
    void **allocs;             /* device memory to free */
    size_t n_allocs, cap_allocs;
    uint32_t act_owner;        /* who dt_model_dalloc's bytes count for */
    uint64_t *act_got;         /* [n_units + 1] bytes allocated per owner,
                                * the workspace last (alloc_acts only) */
    dt_model_probe_t *probe;   /* set only inside dt_model_find_nonfinite */
    dt_model_probe_t *grad_probe; /* set only inside dt_model_find_nonfinite_grad:
                                   * dt_model_hook probes each unit's gradient */
};

/* ---- describing (create) ---- */

/* The config's file for messages ("config" when it came from a string). */
const char *dt_model_cfg_name(const dt_config_t *cfg);

/* n units, each with room for DT_MODEL_MAX_PARAMS tensors; names later. */
int dt_model_alloc_units(dt_model_t *m, uint32_t n);
int dt_model_name_unit(dt_model_t *m, uint32_t unit, const char *name);
/* Append a tensor to unit `unit`: (d0) when ndim == 1, (d0, d1) when 2.
 * Flags and init follow `kind`; `std` is for MATRIX and EMBED. */
int dt_model_add_param(dt_model_t *m, uint32_t unit, const char *name, int ndim, int64_t d0,
                       int64_t d1, int kind, double std);
/* Tensor parallelism: the tensor just added to unit `unit` is part of a
 * global (g0) or (g0, g1) tensor: n_blocks blocks of it (dtrain/strategy.h,
 * dt_param_split_v1_t), or with n_blocks 0 the whole of it, replicated on
 * every rank of the tensor group.  Sets the description's ext; a no-op
 * when m->tp is 1. */
int dt_model_part(dt_model_t *m, uint32_t unit, int64_t g0, int64_t g1, uint32_t n_blocks,
                  const dt_param_block_t *blocks);
/* The tensor group's collectives around a split layer, through the
 * scheme (dtrain/tensor_parallel.h), `n` elements of the activation dtype
 * at device memory `buf`, in place; each is DT_OK at once when m->tp is 1.
 * A failure names the tensor `what` and the unit.
 *   row_forward:   a row-parallel layer's partial outputs summed;
 *   column_start:  a column-parallel layer's partial input gradient,
 *                  its sum left in flight in *req (NULL at tp 1 or when
 *                  already done) for column_wait, which fails naming
 *                  `what` and the unit as the start would;
 *   embedding:     the vocabulary-parallel embedding's lookups summed;
 *   xent:          the parallel cross-entropy's f32 row statistics,
 *                  DT_OP_MAX or DT_OP_SUM. */
int dt_model_tp_row_forward(const dt_model_t *m, const dt_model_ctx_t *ctx, void *buf,
                            int64_t n, const char *what, uint32_t unit);
int dt_model_tp_column_start(const dt_model_t *m, const dt_model_ctx_t *ctx, void *buf,
                             int64_t n, const char *what, uint32_t unit, dt_comm_req_t **req);
int dt_model_tp_column_wait(const dt_model_t *m, dt_comm_req_t *req, const char *what,
                            uint32_t unit);
int dt_model_tp_embedding(const dt_model_t *m, const dt_model_ctx_t *ctx, void *buf, int64_t n,
                          const char *what, uint32_t unit);
int dt_model_tp_xent(const dt_model_t *m, const dt_model_ctx_t *ctx, float *buf, int64_t n,
                     int op, const char *what, uint32_t unit);
/* Set the shape key `key` of m->info (in the order they are added). */
void dt_model_add_key(dt_model_t *m, const char *key, int64_t value);

/* Refuse a device lacking optional kernel `kernel` the arch needs:
 * DT_ERR_UNSUPPORTED, "device 'X' has no kernel 'attention_forward' (f32
 * activations, bf16 weights); arch gpt2 needs it". */
int dt_model_missing_kernel(const dt_model_t *m, const char *kernel);
/* In an arch's need_kernels: return that refusal unless m's kernel table
 * has `field`. */
#define DT_MODEL_NEED(m, field)                                                                \
    do {                                                                                       \
        if (!DT_HAS_OP(dt_kernels_t, (m)->kern, field))                                        \
            return dt_model_missing_kernel((m), #field);                                       \
    } while (0)

/* ---- running ---- */

/* Bytes of one activation element (of m->adtype). */
static inline size_t dt_model_act_size(const dt_model_t *m) { return dt_dtype_size(m->adtype); }

/* Zero `bytes` of device memory at p on the model's stream. */
static inline int dt_model_zero(const dt_model_ctx_t *ctx, void *p, uint64_t bytes)
{
    return ctx->dev_ops->memset_async(ctx->dev, p, 0, bytes, ctx->stream);
}

/* Device memory of n * es bytes tagged activations, freed with the model,
 * counted for m->act_owner. */
int dt_model_dalloc(dt_model_t *m, const dt_model_ctx_t *ctx, int64_t n, size_t es, void *out);
/* Whether backward recomputes the l-th of an arch's recomputable units
 * (GPT-2 blocks, MLP hidden layers) instead of keeping its activations. */
int dt_model_recomputes(const dt_model_t *m, int64_t l);
/* What of unit u's activations this rank keeps under its stage
 * (dt_model_set_stage): DT_KEEP_ALL for a unit of the stage,
 * DT_KEEP_OUTPUT for the unit just before it (its output is the stage's
 * input boundary), DT_KEEP_NONE otherwise. */
enum { DT_KEEP_NONE = 0, DT_KEEP_OUTPUT = 1, DT_KEEP_ALL = 2 };
int dt_model_keeps(const dt_model_t *m, uint32_t u);
/* Call the strategy's `phase` hook for unit `unit`, with the micro-batch
 * and flags of `h`; `buf` receives the buffers for pre_* phases. */
int dt_model_hook(const dt_model_t *m, const dt_model_ctx_t *ctx, int phase,
                  const dt_hook_t *h, uint32_t unit, int last_use, dt_unit_buffers_t *buf);
/* The view of unit `unit`'s parameters `params` (from a pre_* hook).  With
 * `need_act` when the parameter and activation dtypes differ (a bf16
 * model), casts the non-matrix tensors into m->view, which holds one
 * unit's view at a time: the previous one is gone. */
int dt_model_view(dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t unit, const void *params,
                  int need_act, dt_unit_view_t *v);

/* ---- finding the first non-finite tensor (dt_model_find_nonfinite) ---- */

/* 1 inside dt_model_find_nonfinite's forward: archs format probe names
 * only then. */
static inline int dt_model_probing(const dt_model_t *m) { return m->probe != NULL; }
/* After a kernel wrote `x` (n elements of `dtype`, device memory): when
 * probing and nothing non-finite was found yet, copy it to the host and
 * check it; the first NaN/Inf is recorded as "<what> (unit <name>),
 * after <after>: element i of n is v".  `after` may be NULL.  Never
 * changes control flow: a strategy's collectives stay matched across
 * ranks whatever each rank finds.  DT_OK at once when not probing. */
int dt_model_probe(dt_model_t *m, const dt_model_ctx_t *ctx, const char *what, uint32_t unit,
                   const char *after, const void *x, int dtype, uint64_t n);

/* ---- what both archs' create, forward and backward share ---- */

/* Return a failing status as it is (hooks and probes set their own
 * message). */
#define DT_TRY(call)                                                                           \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_)                                                                               \
            return rc_;                                                                        \
    } while (0)
/* Return a failing kernel's status naming the pass and the unit it
 * happened in ("forward of unit block.3"); needs the model `m` in scope. */
#define DT_TRY_UNIT(call, pass, unit)                                                          \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_)                                                                               \
            return dt_err_context(rc_, "%s of unit %s", pass, m->desc.units[unit].name);      \
    } while (0)

/* The loss of the head's m->logits (B*T, vocab): softmax cross-entropy
 * into m->probs and m->losses, both probed; a kernel failure names the
 * forward of unit `head`. */
int dt_model_loss_forward(dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t head);
/* Its backward: dlogits (B*T, vocab, adtype; overwritten) = the gradient
 * of loss_scale x the mean loss over the B*T positions. */
int dt_model_loss_backward(dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t head,
                           void *dlogits, float loss_scale);

#endif /* DT_MODEL_ARCH_H */
