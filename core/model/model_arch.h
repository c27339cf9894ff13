/*
 * core/model/model_arch.h - the model as model.c holds it (struct
 * dt_model: the public state a model plugin reads, dtrain/model.h, and
 * the core's own fields) and the functions behind the services table a
 * model plugin calls (dt_model_services): describing units and tensors,
 * device allocations the model frees, strategy hooks with context in
 * messages, and parameter views.
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


/* Per tensor, beside its dt_param_desc_t. */
typedef struct dt_tensor_extra {
    int kind;          /* dt_tensor_kind_t (dtrain/model.h) */
    double std;        /* MATRIX, EMBED */
    uint64_t view_off; /* non-MATRIX: offset (elements) in the unit's view */
    /* Tensor parallelism (tp > 1): the part of the global tensor this
     * rank holds (dt_model_part); the description's ext points here. */
    dt_param_split_t split;
} dt_tensor_extra_t;

typedef struct dt_model_probe dt_model_probe_t; /* model.c */

/* Which units backward recomputes instead of keeping their activations
 * ("activation checkpointing", [model] activation_checkpointing: none,
 * all, every checkpoint_every-th; dt_model_recomputes).  Named recompute,
 * not checkpoint: model checkpoints are core/ckpt/'s. */
enum { DT_RECOMPUTE_NONE = 0, DT_RECOMPUTE_ALL = 1, DT_RECOMPUTE_EVERY = 2 };

struct dt_model {
    /* What the plugin reads and writes (dtrain/model.h); first, so a
     * plugin's dt_model_state_t * is the model's address. */
    dt_model_state_t s;
    dt_model_desc_t desc;      /* s.desc points here */
    dt_model_info_t info;      /* s.info points here */
    const dt_model_ops_t *arch; /* the model plugin's table */
    dt_config_t *cfg;          /* during create only: the plugin's config */
    /* The [model] keys the plugin read during create (config_*), the
     * ones a config may set for it besides the common ones. */
    const char *read_keys[32];
    uint32_t n_read_keys;
    dt_tensor_extra_t **extra; /* [unit][param] */
    int recompute_mode;        /* DT_RECOMPUTE_*: which units backward
                                * recomputes ([model] activation_checkpointing) */
    int64_t recompute_every;   /* [model] checkpoint_every */
    /* The units this rank runs (dt_model_set_stages): n_chunks ranges
     * [chunk_first[i], chunk_end[i]) in model order; one, the whole model,
     * unless a pipeline stage was set (an interleaved pipeline's rank runs
     * several).  Activations are planned and allocated for those only. */
    uint32_t n_chunks;
    uint32_t chunk_first[DT_MODEL_MAX_CHUNKS], chunk_end[DT_MODEL_MAX_CHUNKS];
    /* The tensor-parallel scheme whose collectives join the parts
     * (dt_model_set_tensor); tp 1: none. */
    dt_tensor_group_t *tp_group;
    /* Activation slots: each slot's device tokens and targets (s.tokens
     * / s.targets are the slot in use's). */
    int32_t **slot_tokens, **slot_targets;
    float *host_losses;        /* (B, T) host */
    void *view;                /* wdtype != adtype: view scratch, view_numel
                                * elements of adtype */
    uint64_t view_numel;       /* largest unit's non-matrix tensors */
    void **allocs;             /* device memory to free */
    size_t n_allocs, cap_allocs;
    uint64_t *act_got;         /* [n_units + 1] bytes allocated per owner,
                                * the workspace last (alloc_acts only) */
    dt_model_probe_t *probe;   /* set only inside dt_model_find_nonfinite */
    dt_model_probe_t *grad_probe; /* set only inside dt_model_find_nonfinite_grad:
                                   * dt_model_hook probes each unit's gradient */
};

/* The services table model.c hands every model plugin (m->s.svc). */
extern const dt_model_services_t dt_model_services;

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
/* Append key *k (dtrain/model.h dt_model_key_t: an int or boolean shape
 * key, a float or choice setting) to m->info, in the order added. */
void dt_model_add_key(dt_model_t *m, const dt_model_key_t *k);

/* Refuse a device lacking optional kernel `kernel` the arch needs:
 * DT_ERR_UNSUPPORTED, "device 'X' has no kernel 'attention_forward' (f32
 * activations, bf16 weights); arch gpt2 needs it". */
int dt_model_missing_kernel(const dt_model_t *m, const char *kernel);

/* ---- running ---- */

/* Bytes of one activation element (of m->adtype). */
static inline size_t dt_model_act_size(const dt_model_t *m) { return dt_dtype_size(m->s.adtype); }

/* Zero `bytes` of device memory at p on the model's stream. */
static inline int dt_model_zero(const dt_model_ctx_t *ctx, void *p, uint64_t bytes)
{
    return dt_device_ops(ctx->dev)->memset_async(ctx->dev, p, 0, bytes, ctx->stream);
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
