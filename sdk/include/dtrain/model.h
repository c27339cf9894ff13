/*
 * dtrain/model.h - the model architecture ABI (plugin kind "model").
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * A MODEL plugin ([model] arch names it; the shipped ones are `gpt2`, `llama`,
 * `mlp`) is an architecture: it describes the model as an ordered list of
 * units, each a list of parameter tensors, and runs forward and backward
 * from the device's kernel table (device.h dt_kernels_v1_t).  The core owns
 * everything that does not depend on the architecture: the token checks
 * and copies, the mean loss, device allocations and their accounting,
 * initialisation, the strategy's unit hooks (the model never owns its
 * parameters: a strategy hands each unit's buffers around each use),
 * pipeline stages and activation slots, tensor-parallel collectives (the
 * scheme of tensor_parallel.h) and the non-finite probes.
 *
 * Three structs join the two sides:
 *   dt_model_ops_v1_t       the plugin's table (its entry symbol
 *                           dtrain_model_v1 returns it);
 *   dt_model_state_v1_t     the model's public state: what the plugin
 *                           reads (the micro-batch's shape and tokens,
 *                           dtypes, the kernel table, its tensor-parallel
 *                           place) and writes (logits, probs, losses, its
 *                           own state);
 *   dt_model_services_v1_t  what the core does for the plugin (add units
 *                           and tensors, allocate activations, call the
 *                           strategy's hooks, run the tensor group's
 *                           collectives, probe, read [model] keys), reached
 *                           as m->svc: a plugin is a shared object and
 *                           calls no core function directly.  The
 *                           static-inline dt_model_* wrappers below are
 *                           the names plugin code spells.
 *
 * A model's life: `create` describes the units (add_units, add_param,
 * part) and fills the info's shape keys (add_key) from the config's
 * [model] table; `act_bytes` counts the activation bytes for B x T without
 * allocating; `alloc_acts` allocates them through dalloc (the core checks
 * the two agree, unit by unit); `forward` ends with m->losses filled and
 * `backward` follows; both call the strategy's hooks around each unit
 * (dt_model_hook) and pass each kernel's output to dt_model_probe.
 *
 * Nothing in this ABI is specific to one architecture: the shape keys are
 * the plugin's, named as its [model] keys; tied embeddings, a pipeline
 * boundary width and tensor-parallel splits are declared, not assumed.
 *
 * Thread safety: the core drives a model from one thread.
 */
#ifndef DTRAIN_MODEL_H
#define DTRAIN_MODEL_H

#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/device.h"
#include "dtrain/host.h" /* DT_PRINTF */
#include "dtrain/plugin.h"
#include "dtrain/status.h"
#include "dtrain/strategy.h" /* dt_model_desc_v1_t, dt_hook_v1_t, dt_param_split_v1_t */
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_MODEL_ABI_MAJOR 1
#define DT_MODEL_ABI_MINOR 0

/* Most tensors one unit may have (GPT-2's block has 12). */
#define DT_MODEL_MAX_PARAMS 16
/* Most shape keys (dt_model_info_v1_t.keys). */
#define DT_MODEL_MAX_KEYS 24

/* The compute context a model runs in (in; the core's): an instance of
 * the device the model was created for, a stream of it, the strategy. */
typedef struct dt_model_ctx_v1 {
    dt_device_t *dev;       /* its table: dt_device_ops(dev) */
    dt_stream_t *stream;
    dt_strategy_t *strat;   /* dt_strategy_ops(strat); NULL: none */
    const char *strat_name; /* for messages */
} dt_model_ctx_v1_t;

/* dt_model_key_v1_t.kind: which field holds the key's value. */
enum {
    DT_MODEL_KEY_INT = 0,   /* value */
    DT_MODEL_KEY_BOOL = 1,  /* value, 0 or 1 */
    DT_MODEL_KEY_FLOAT = 2, /* f */
    DT_MODEL_KEY_CHOICE = 3 /* s: a choice of a string key */
};

/* One [model] key a checkpoint records: an integer or a boolean that
 * fixes parameter shapes (a resume refuses another value), or a float or
 * choice setting that changes what the model computes but no shape
 * (llama's rope_theta, rope_scaling: a resume notes another value; eval
 * and sample rebuild the model with the recorded one).  {key, value}
 * first: `{"n_layer", 12}` is an INT key. */
typedef struct dt_model_key_v1 {
    const char *key; /* the [model] key's name: "n_layer", "mlp_hidden" */
    int64_t value;   /* INT, BOOL */
    int32_t kind;    /* DT_MODEL_KEY_* */
    uint32_t reserved0;
    double f;        /* FLOAT */
    const char *s;   /* CHOICE: static storage (the plugin's) */
} dt_model_key_v1_t;

/* What the rest of the core needs to know about any model (the core owns
 * it; `create` fills the fields marked "plugin"). */
typedef struct dt_model_info_v1 {
    uint32_t struct_size;    /* sizeof(dt_model_info_v1_t), core's build */
    uint32_t reserved0;
    const char *arch;        /* [model] arch: the plugin's name */
    const char *dtype;       /* "fp32", "bf16", "fp16": [model] dtype */
    const char *activations; /* "fp32", "bf16": [model] activations */
    int64_t vocab_size;      /* plugin: tokens are in [0, vocab_size) */
    int64_t context;         /* plugin: longest sequence; 0 = any length */
    /* plugin, through add_key: the keys that, with arch, determine every
     * parameter's shape, in the order added: what a checkpoint manifest
     * records ("model" object) and a loader compares. */
    uint32_t n_keys;
    dt_model_key_v1_t keys[DT_MODEL_MAX_KEYS];
    /* plugin: pipeline stages: elements per token of the tensor between
     * two units (a transformer's residual width); 0 when the arch cannot
     * be split into stages. */
    int64_t boundary_width;
    /* plugin: 1 when the last unit also reads unit 0's parameters (an LM
     * head tied to the token embedding): a stage holding the last unit
     * but not unit 0 holds a copy of unit 0. */
    int tied_embedding;
    /* [parallel] tensor and this rank's place in the tensor group. */
    int32_t tensor_parallel, tensor_rank;
    /* The whole model's parameter count (desc.numel is this rank's part
     * under tensor parallelism). */
    uint64_t global_numel;
} dt_model_info_v1_t;

/* The all-reduces over the tensor group one micro-batch of B x T runs on
 * this rank: how many and their bytes, forward and backward. */
typedef struct dt_model_tp_comm_v1 {
    uint32_t fwd, bwd;
    uint64_t fwd_bytes, bwd_bytes;
} dt_model_tp_comm_v1_t;

/* How a tensor is initialised and which kernels read it (add_param). */
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

/* A unit's parameters as kernels read them (view).  `w[k]` is tensor k in
 * the strategy's buffer (desc->param_dtype: pass m->wdtype to matmuls);
 * `a[k]` is tensor k in the activation dtype (m->adtype), as every kernel
 * but a matmul's weight reads it: the same memory when the two dtypes
 * agree, else a copy in the core's view scratch (NULL for matrices and
 * when not asked for). */
typedef struct dt_unit_view {
    const void *w[DT_MODEL_MAX_PARAMS];
    const void *a[DT_MODEL_MAX_PARAMS];
} dt_unit_view_t;

/* m->act_owner: a unit index, or this for the workspace (memory no unit
 * keeps from forward to backward). */
#define DT_ACT_WORKSPACE UINT32_MAX

/* keeps(): what of unit u's activations this rank keeps under its stage. */
enum { DT_KEEP_NONE = 0, DT_KEEP_OUTPUT = 1, DT_KEEP_ALL = 2 };

/* hook() phases, in the order a unit sees them. */
enum { DT_PRE_FORWARD = 0, DT_POST_FORWARD = 1, DT_PRE_BACKWARD = 2, DT_POST_BACKWARD = 3 };

/* config_origin(): where a [model] key's value came from. */
enum {
    DT_MODEL_ORIGIN_DEFAULT = 0,
    DT_MODEL_ORIGIN_FILE = 1,
    DT_MODEL_ORIGIN_CLI = 2,
    DT_MODEL_ORIGIN_DERIVED = 3,
    DT_MODEL_ORIGIN_PRESET = 4
};

struct dt_model_services_v1;

/* The model's public state (the core's; valid while the model lives).
 * The plugin writes only the fields marked "plugin". */
typedef struct dt_model_state_v1 {
    uint32_t struct_size; /* sizeof(dt_model_state_v1_t), core's build */
    uint32_t reserved0;
    const struct dt_model_services_v1 *svc;
    dt_model_desc_v1_t *desc;  /* units and tensors (add_units, add_param) */
    dt_model_info_v1_t *info;  /* arch, shape keys (see its fields) */
    void *arch_state;          /* plugin: its own state, freed by `free` */
    const dt_kernels_v1_t *kern; /* the device's kernel table */
    const char *dev_name;      /* the device plugin's name, for messages */
    int32_t wdtype;            /* desc->param_dtype: DT_F32, DT_BF16, DT_F16 */
    int32_t adtype;            /* activations and their gradients, and the
                                * non-matrix tensors as kernels read them */
    /* Tensor parallelism: this rank's place in the tensor group (tp 1:
     * none), and the vocabulary columns its logits hold:
     * [vocab_first, vocab_first + vocab_local) (plugin; the whole
     * vocabulary unless tp > 1). */
    int32_t tp, tp_rank;
    int64_t vocab_first, vocab_local;
    /* plugin (alloc_acts, tp > 1): (3, B*T) f32, the vocabulary-parallel
     * cross-entropy's row state the core's loss_forward / loss_backward
     * use; counted in the plugin's workspace. */
    float *xent_stats;
    /* Activation slots: n_slots micro-batches' activations kept at once
     * (use_slot switches). */
    uint32_t n_slots;
    /* The micro-batch (alloc_acts' B x T). */
    int64_t B, T;
    int32_t *tokens, *targets; /* (B, T) device: the slot in use's */
    void *logits, *probs;      /* plugin (alloc_acts): (B, T, V) adtype */
    float *losses;             /* plugin (alloc_acts): (B, T) f32 */
    /* Who dalloc's bytes count for: a unit, or DT_ACT_WORKSPACE (plugin:
     * set before each dalloc in alloc_acts). */
    uint32_t act_owner;
    uint32_t reserved2;
    /* ---- minor 0 ends here; append only ---- */
} dt_model_state_v1_t;
#define DT_MODEL_STATE_V1_SIZE0 DT_FIELD_END(dt_model_state_v1_t, reserved2)

/* What the core does for a model plugin (the core's; valid while the
 * model lives).  Every function but set_error and err_context takes the
 * model first.  Thread safety: the model's thread only.  Errors: the
 * functions that fail set the message and return the status; set_error
 * and err_context are the plugin's own way to say what failed (no
 * "kind/name:" prefix: model messages name the config file and key). */
typedef struct dt_model_services_v1 {
    uint32_t struct_size; /* sizeof(dt_model_services_v1_t), core's build */
    uint32_t reserved0;

    /* ---- messages ---- */
    /* Set this thread's error message; returns `status`. */
    int (*set_error)(int status, const char *fmt, ...) DT_PRINTF(2, 3);
    /* Prefix the message with "<formatted>: "; returns `status`. */
    int (*err_context)(int status, const char *fmt, ...) DT_PRINTF(2, 3);

    /* ---- the config (create only) ---- */
    /* The config's file for messages ("config" when it came from text). */
    const char *(*config_name)(const dt_model_state_v1_t *m);
    /* Read a key by its full name: "model.<key>", the core's [model]
     * table ("model.vocab_size"), or "<arch>.<key>", the plugin's own
     * table, its info.config_keys ("bigram.width").  DT_OK, or the status
     * with the message set (an undeclared key, another type). */
    int (*config_int)(const dt_model_state_v1_t *m, const char *key, int64_t *out);
    int (*config_float)(const dt_model_state_v1_t *m, const char *key, double *out);
    int (*config_string)(const dt_model_state_v1_t *m, const char *key, const char **out);
    int (*config_bool)(const dt_model_state_v1_t *m, const char *key, int *out);
    /* DT_MODEL_ORIGIN_* of the key's value. */
    int (*config_origin)(const dt_model_state_v1_t *m, const char *key);
    /* Set key `key` (full name, as config_int reads it) to `v`'s value of
     * v->kind (an int, a boolean, a float, a choice; v->key unused) as a
     * preset's (DT_MODEL_ORIGIN_PRESET), so `dtrain check` shows it as
     * the preset's; range and choices checked as a file's value. */
    int (*config_set_preset)(dt_model_state_v1_t *m, const char *key,
                             const dt_model_key_v1_t *v);

    /* ---- describing (create) ---- */
    /* n units, each with room for DT_MODEL_MAX_PARAMS tensors. */
    int (*alloc_units)(dt_model_state_v1_t *m, uint32_t n);
    int (*name_unit)(dt_model_state_v1_t *m, uint32_t unit, const char *name);
    /* Append a tensor to unit `unit`: (d0) when ndim == 1, (d0, d1) when
     * 2; flags and init follow `kind` (dt_tensor_kind_t), `std` for
     * MATRIX and EMBED. */
    int (*add_param)(dt_model_state_v1_t *m, uint32_t unit, const char *name, int ndim,
                     int64_t d0, int64_t d1, int kind, double std);
    /* Tensor parallelism: the tensor just added is part of a global (g0)
     * or (g0, g1) tensor: n_blocks blocks of it, or with n_blocks 0 the
     * whole of it, replicated.  A no-op at tp 1. */
    int (*part)(dt_model_state_v1_t *m, uint32_t unit, int64_t g0, int64_t g1,
                uint32_t n_blocks, const dt_param_block_v1_t *blocks);
    /* Append key *k (k->key a [model] key's name, or one of the
     * plugin's own table; k->s static) to m->info. */
    void (*add_key)(dt_model_state_v1_t *m, const dt_model_key_v1_t *k);
    /* The refusal of a device lacking optional kernel `kernel`:
     * DT_ERR_UNSUPPORTED naming the device, the kernel, the dtypes. */
    int (*missing_kernel)(const dt_model_state_v1_t *m, const char *kernel);

    /* ---- running ---- */
    /* Device memory of n * es bytes tagged activations, freed with the
     * model, counted for m->act_owner; *(void **)out receives it. */
    int (*dalloc)(dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx, int64_t n, size_t es,
                  void *out);
    /* Whether backward recomputes the l-th of the arch's recomputable
     * units (0-based) instead of keeping its activations. */
    int (*recomputes)(const dt_model_state_v1_t *m, int64_t l);
    /* DT_KEEP_* for unit u under this rank's stage. */
    int (*keeps)(const dt_model_state_v1_t *m, uint32_t u);
    /* Call the strategy's `phase` hook for unit `unit`; `buf` receives the
     * buffers for the pre_* phases. */
    int (*hook)(const dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx, int phase,
                const dt_hook_v1_t *h, uint32_t unit, int last_use,
                dt_unit_buffers_v1_t *buf);
    /* The view of unit `unit`'s parameters `params` (from a pre_* hook);
     * `need_act`: cast the non-matrix tensors to the activation dtype
     * when it differs (one unit's view at a time). */
    int (*view)(dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx, uint32_t unit,
                const void *params, int need_act, dt_unit_view_t *v);
    /* 1 inside a non-finite search (format probe names only then). */
    int (*probing)(const dt_model_state_v1_t *m);
    /* After a kernel wrote `x` (n elements of `dtype`): record it when
     * probing; DT_OK at once otherwise.  Never changes control flow. */
    int (*probe)(dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx, const char *what,
                 uint32_t unit, const char *after, const void *x, int dtype, uint64_t n);
    /* The softmax cross-entropy of m->logits (B*T rows of this rank's
     * vocab_local columns) into m->probs and m->losses (tp > 1: the
     * vocabulary-parallel one); a failure names the forward of `head`. */
    int (*loss_forward)(dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx, uint32_t head);
    /* Its backward: dlogits = the gradient of loss_scale x the mean loss. */
    int (*loss_backward)(dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx, uint32_t head,
                         void *dlogits, float loss_scale);

    /* ---- the tensor group (tensor_parallel.h), each DT_OK at once at tp 1;
     * `n` elements of the activation dtype at `buf`, in place; a failure
     * names the tensor `what` and the unit ---- */
    int (*tp_row_forward)(const dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx,
                          void *buf, int64_t n, const char *what, uint32_t unit);
    int (*tp_column_start)(const dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx,
                           void *buf, int64_t n, const char *what, uint32_t unit,
                           dt_comm_req_t **req);
    int (*tp_column_wait)(const dt_model_state_v1_t *m, dt_comm_req_t *req, const char *what,
                          uint32_t unit);
    int (*tp_embedding)(const dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx, void *buf,
                        int64_t n, const char *what, uint32_t unit);
    /* ---- minor 0 ends here; append only ---- */
} dt_model_services_v1_t;
#define DT_MODEL_SERVICES_V1_SIZE0 DT_FIELD_END(dt_model_services_v1_t, tp_embedding)

/* An optional decoder (generation with a cache), the plugin's. */
typedef struct dt_model_decoder dt_model_decoder_t;

typedef struct dt_model_ops_v1 {
    dt_plugin_info_t info; /* base first; info.kind == DT_KIND_MODEL */

    /* ---- mandatory ---- */
    /* Describe the units and fill m->info's plugin fields from the
     * [model] keys (config_*); refuse impossible shapes with
     * DT_ERR_CONFIG naming the config file and key. */
    int (*create)(dt_model_state_v1_t *m);
    /* The bytes alloc_acts allocates for B x T under m's recompute mode,
     * without allocating: adds to unit[u] what unit u keeps from forward
     * to backward and to *workspace the rest.  Sizes the device decides
     * come from the same kernel-table queries alloc_acts uses. */
    int (*act_bytes)(const dt_model_state_v1_t *m, int64_t B, int64_t T, double *unit,
                     double *workspace);
    /* Activations for m->B x m->T through dalloc, with m->act_owner set
     * as act_bytes counts; sets m->logits, m->probs, m->losses. */
    int (*alloc_acts)(dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx);
    /* Forward of the micro-batch in m->tokens / m->targets. */
    int (*forward)(dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx, const dt_hook_v1_t *h);
    /* Backward; dloss = loss_scale / (B T) per position. */
    int (*backward)(dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx, const dt_hook_v1_t *h,
                    float loss_scale);
    /* FLOPs of one forward+backward token at sequence length T. */
    double (*flops_per_token)(const dt_model_state_v1_t *m, int64_t T);

    /* ---- optional (NULL: see each) ---- */
    /* Pipeline stages (NULL: the arch runs whole only): forward and
     * backward of units [first, end), `in` / `din` the boundary tensor
     * before unit `first`, `out` / `dout` the one after unit end - 1. */
    int (*stage_forward)(dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx,
                         const dt_hook_v1_t *h, uint32_t first, uint32_t end, const void *in,
                         void *out);
    int (*stage_backward)(dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx,
                          const dt_hook_v1_t *h, uint32_t first, uint32_t end, const void *dout,
                          void *din, float loss_scale);
    /* Make slot i (< m->n_slots) the one forward writes and backward
     * reads (NULL: one slot only). */
    void (*use_slot)(dt_model_state_v1_t *m, uint32_t i);
    /* flops_per_token unit by unit into out[n_units] (NULL: by parameter
     * share). */
    void (*unit_flops)(const dt_model_state_v1_t *m, int64_t T, double *out);
    /* The tensor group's all-reduces for B x T (NULL: none; tensor
     * parallelism then refused at tp > 1 unless create splits nothing). */
    void (*tp_comm)(const dt_model_state_v1_t *m, int64_t B, int64_t T,
                    dt_model_tp_comm_v1_t *out);
    /* Free m->arch_state (NULL: nothing to free). */
    void (*free)(dt_model_state_v1_t *m);
    /* Refuse a kernel table lacking an optional kernel the arch calls
     * (DT_MODEL_NEED); NULL when the core set is enough. */
    int (*need_kernels)(const dt_model_state_v1_t *m);
    /* Named shapes ([model] preset): the shape keys preset `name` sets,
     * into out[cap] (each a key of [model] or of the plugin's own table,
     * by its name there, of any kind): their count, or 0 for an unknown
     * name.
     * No model needed (the planner). */
    uint32_t (*preset)(const char *name, dt_model_key_v1_t *out, uint32_t cap);
    /* Generation one position at a time with a cache: create a decoder
     * over unit parameter buffers `params` (device, f32) holding up to
     * max_len positions; step runs `token` and writes vocab_size f32
     * logits (host) of the next one; len, reset, free as named.  All five
     * or none. */
    int (*decoder_create)(dt_model_state_v1_t *m, const dt_model_ctx_v1_t *ctx,
                          void *const *params, int64_t max_len, dt_model_decoder_t **out);
    int (*decoder_step)(dt_model_decoder_t *d, int32_t token, float *logits);
    int64_t (*decoder_len)(const dt_model_decoder_t *d);
    void (*decoder_reset)(dt_model_decoder_t *d);
    void (*decoder_free)(dt_model_decoder_t *d);
    /* Hugging Face transformers' files (`dtrain import`, `dtrain export
     * --layout hf`): all five or none; no model instance needed.  Keys
     * are [model] keys as the preset slot gives them (names and CHOICE
     * strings static where the plugin fills them), "context" among them
     * (the longest sequence; max_position_embeddings).  Messages go to
     * err[err_cap]: "'<path>': \"<key>\" is <value>; <what the model
     * computes>" for a config.json setting the model cannot compute.
     *
     * hf_architectures: the config.json `architectures` this plugin
     * reads ("LlamaForCausalLM"): a static NULL-terminated list.
     * hf_config_read: config.json's text[len] (`path` for messages) as
     * keys into out[cap], their count in *n; DT_OK or DT_ERR_CONFIG.
     * hf_config_write: config.json's text (ending in a newline) of a model
     * with keys[n] (a checkpoint manifest's: a number carries its value
     * in f and, truncated, in value) into buf[cap] (NUL-terminated when
     * it fits): its length, or 0 with err set.
     * hf_export_name: parameter `name`'s HF tensor name into hf[cap];
     * *transpose 1 when HF stores that 2-D weight transposed.
     * hf_import_name: what HF tensor `hf` is to a model with keys[n]:
     * DT_HF_PARAM (parameter name[cap]), DT_HF_TIED (a tied copy that
     * must equal parameter name[cap]), DT_HF_BUFFER (not a parameter:
     * ignored) or DT_HF_UNKNOWN. */
    const char *const *(*hf_architectures)(void);
    int (*hf_config_read)(const char *path, const char *text, size_t len, dt_model_key_v1_t *out,
                          uint32_t cap, uint32_t *n, char *err, size_t err_cap);
    size_t (*hf_config_write)(const dt_model_key_v1_t *keys, uint32_t n, char *buf, size_t cap,
                              char *err, size_t err_cap);
    void (*hf_export_name)(const char *name, char *hf, size_t cap, int *transpose);
    int (*hf_import_name)(const dt_model_key_v1_t *keys, uint32_t n, const char *hf, char *name,
                          size_t cap);
    /* ---- minor 0 ends here; append only ---- */
} dt_model_ops_v1_t;

/* hf_import_name's answers. */
enum { DT_HF_UNKNOWN = 0, DT_HF_PARAM = 1, DT_HF_TIED = 2, DT_HF_BUFFER = 3 };

/* Current-version names. */
typedef dt_model_ops_v1_t dt_model_ops_t;
typedef dt_model_state_v1_t dt_model_state_t;
typedef dt_model_services_v1_t dt_model_services_t;
typedef dt_model_ctx_v1_t dt_model_ctx_t;
typedef dt_model_key_v1_t dt_model_key_t;
typedef dt_model_info_v1_t dt_model_info_t;
typedef dt_model_tp_comm_v1_t dt_model_tp_comm_t;

/* ---- plugin-side helpers: the services under the names model code
 * spells (the core implements these itself and does not define
 * DT_MODEL_PLUGIN_HELPERS) ---- */
#ifdef DT_MODEL_PLUGIN_HELPERS

/* Return a failing status as it is. */
#define DT_TRY(call)                                                                           \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_)                                                                               \
            return rc_;                                                                        \
    } while (0)
/* Return a failing kernel's status naming the pass and the unit ("forward
 * of unit block.3"); needs the model `m` in scope. */
#define DT_TRY_UNIT(call, pass, unit)                                                          \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_)                                                                               \
            return m->svc->err_context(rc_, "%s of unit %s", pass,                             \
                                       m->desc->units[unit].name);                            \
    } while (0)
/* In need_kernels: refuse unless m's kernel table has `field`. */
#define DT_MODEL_NEED(m, field)                                                                \
    do {                                                                                       \
        if (!DT_HAS_OP(dt_kernels_v1_t, (m)->kern, field))                                     \
            return (m)->svc->missing_kernel((m), #field);                                      \
    } while (0)

static inline size_t dt_model_act_size(const dt_model_state_t *m)
{
    return dt_dtype_size(m->adtype);
}
static inline int dt_model_zero(const dt_model_ctx_t *ctx, void *p, uint64_t bytes)
{
    return dt_device_ops(ctx->dev)->memset_async(ctx->dev, p, 0, bytes, ctx->stream);
}
static inline const char *dt_model_cfg_name(const dt_model_state_t *m)
{
    return m->svc->config_name(m);
}
static inline int dt_model_alloc_units(dt_model_state_t *m, uint32_t n)
{
    return m->svc->alloc_units(m, n);
}
static inline int dt_model_name_unit(dt_model_state_t *m, uint32_t unit, const char *name)
{
    return m->svc->name_unit(m, unit, name);
}
static inline int dt_model_add_param(dt_model_state_t *m, uint32_t unit, const char *name,
                                     int ndim, int64_t d0, int64_t d1, int kind, double std)
{
    return m->svc->add_param(m, unit, name, ndim, d0, d1, kind, std);
}
static inline int dt_model_part(dt_model_state_t *m, uint32_t unit, int64_t g0, int64_t g1,
                                uint32_t n_blocks, const dt_param_block_v1_t *blocks)
{
    return m->svc->part(m, unit, g0, g1, n_blocks, blocks);
}
static inline void dt_model_add_key(dt_model_state_t *m, const char *key, int64_t value)
{
    dt_model_key_t k = {0};
    k.key = key;
    k.value = value;
    k.kind = DT_MODEL_KEY_INT;
    m->svc->add_key(m, &k);
}
static inline void dt_model_add_bool_key(dt_model_state_t *m, const char *key, int value)
{
    dt_model_key_t k = {0};
    k.key = key;
    k.value = value != 0;
    k.kind = DT_MODEL_KEY_BOOL;
    m->svc->add_key(m, &k);
}
static inline void dt_model_add_float_key(dt_model_state_t *m, const char *key, double value)
{
    dt_model_key_t k = {0};
    k.key = key;
    k.f = value;
    k.kind = DT_MODEL_KEY_FLOAT;
    m->svc->add_key(m, &k);
}
/* `s` must be static: the info keeps the pointer. */
static inline void dt_model_add_choice_key(dt_model_state_t *m, const char *key, const char *s)
{
    dt_model_key_t k = {0};
    k.key = key;
    k.s = s;
    k.kind = DT_MODEL_KEY_CHOICE;
    m->svc->add_key(m, &k);
}
static inline int dt_model_dalloc(dt_model_state_t *m, const dt_model_ctx_t *ctx, int64_t n,
                                  size_t es, void *out)
{
    return m->svc->dalloc(m, ctx, n, es, out);
}
static inline int dt_model_recomputes(const dt_model_state_t *m, int64_t l)
{
    return m->svc->recomputes(m, l);
}
static inline int dt_model_keeps(const dt_model_state_t *m, uint32_t u)
{
    return m->svc->keeps(m, u);
}
static inline int dt_model_hook(const dt_model_state_t *m, const dt_model_ctx_t *ctx, int phase,
                                const dt_hook_v1_t *h, uint32_t unit, int last_use,
                                dt_unit_buffers_v1_t *buf)
{
    return m->svc->hook(m, ctx, phase, h, unit, last_use, buf);
}
static inline int dt_model_view(dt_model_state_t *m, const dt_model_ctx_t *ctx, uint32_t unit,
                                const void *params, int need_act, dt_unit_view_t *v)
{
    return m->svc->view(m, ctx, unit, params, need_act, v);
}
static inline int dt_model_probing(const dt_model_state_t *m) { return m->svc->probing(m); }
static inline int dt_model_probe(dt_model_state_t *m, const dt_model_ctx_t *ctx,
                                 const char *what, uint32_t unit, const char *after,
                                 const void *x, int dtype, uint64_t n)
{
    return m->svc->probe(m, ctx, what, unit, after, x, dtype, n);
}
static inline int dt_model_loss_forward(dt_model_state_t *m, const dt_model_ctx_t *ctx,
                                        uint32_t head)
{
    return m->svc->loss_forward(m, ctx, head);
}
static inline int dt_model_loss_backward(dt_model_state_t *m, const dt_model_ctx_t *ctx,
                                         uint32_t head, void *dlogits, float loss_scale)
{
    return m->svc->loss_backward(m, ctx, head, dlogits, loss_scale);
}
static inline int dt_model_tp_row_forward(const dt_model_state_t *m, const dt_model_ctx_t *ctx,
                                          void *buf, int64_t n, const char *what,
                                          uint32_t unit)
{
    return m->svc->tp_row_forward(m, ctx, buf, n, what, unit);
}
static inline int dt_model_tp_column_start(const dt_model_state_t *m,
                                           const dt_model_ctx_t *ctx, void *buf, int64_t n,
                                           const char *what, uint32_t unit,
                                           dt_comm_req_t **req)
{
    return m->svc->tp_column_start(m, ctx, buf, n, what, unit, req);
}
static inline int dt_model_tp_column_wait(const dt_model_state_t *m, dt_comm_req_t *req,
                                          const char *what, uint32_t unit)
{
    return m->svc->tp_column_wait(m, req, what, unit);
}
/* A column-parallel layer's backward (out = inp W^T + b, W's rows this
 * rank's; what matmul_backward takes, in m's dtypes): dinp (zeroed here)
 * is a partial sum over the tensor group.  At tp 1 one matmul_backward;
 * under tensor parallelism dinp first, its all-reduce started, the weight
 * and bias gradients computed while it is in flight, then the wait
 * (Megatron-LM's overlap).  `what` and `unit` name the layer in a
 * failure. */
static inline int dt_model_column_backward(const dt_model_state_t *m, const dt_model_ctx_t *ctx,
                                           void *dinp, float *dw, float *db, const void *dout,
                                           const void *inp, const void *w, int64_t N, int64_t C,
                                           int64_t OC, const char *what, uint32_t unit)
{
    const dt_kernels_v1_t *k = m->kern;
    const int ad = m->adtype, wd = m->wdtype;
    int rc = dt_model_zero(ctx, dinp, (uint64_t)(N * C) * dt_model_act_size(m));
    if (rc != DT_OK || m->tp == 1)
        return rc != DT_OK ? rc
                           : k->matmul_backward(ctx->dev, ctx->stream, dinp, dw, db, dout, inp,
                                                w, ad, wd, N, C, OC);
    dt_comm_req_t *req = NULL;
    if ((rc = k->matmul_backward(ctx->dev, ctx->stream, dinp, NULL, NULL, dout, inp, w, ad, wd,
                                 N, C, OC)) != DT_OK ||
        (rc = dt_model_tp_column_start(m, ctx, dinp, N * C, what, unit, &req)) != DT_OK)
        return rc;
    rc = k->matmul_backward(ctx->dev, ctx->stream, NULL, dw, db, dout, inp, w, ad, wd, N, C, OC);
    int wrc = dt_model_tp_column_wait(m, req, what, unit); /* always: the request is freed */
    return rc != DT_OK ? rc : wrc;
}
static inline int dt_model_tp_embedding(const dt_model_state_t *m, const dt_model_ctx_t *ctx,
                                        void *buf, int64_t n, const char *what, uint32_t unit)
{
    return m->svc->tp_embedding(m, ctx, buf, n, what, unit);
}
#endif /* DT_MODEL_PLUGIN_HELPERS */

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_MODEL_H */
