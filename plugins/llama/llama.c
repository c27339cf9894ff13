/*
 * plugins/llama/llama.c - the llama model plugin (dtrain/model.h): the
 * LLaMA family (Llama 2/3, TinyLlama, SmolLM, Qwen2 with its q/k/v
 * biases, Mistral without a sliding window) as units:
 * embedding (embed_tokens), one unit per decoder layer, head (the final
 * RMSNorm and lm_head, or the LM head tied to embed_tokens, which re-uses
 * unit 0 as GPT-2's does).  A layer is RMSNorm, the fused q|k|v
 * projection, rotary position embedding (rotate_half, rope_theta, Llama
 * 3.1's frequency scaling as an option; the cos/sin tables computed on the
 * host in double once per allocation), grouped-query causal attention,
 * o_proj, RMSNorm, the fused gate|up projection, SwiGLU and down_proj, each
 * half with its residual add.  Built from the device kernel table, with
 * per-layer activation checkpointing, tensor parallelism (kv-head groups),
 * pipeline stages and activation slots, as plugins/gpt2/gpt2.c (whose
 * structure this file follows).  Presets ([model] preset) behind the
 * model table's preset slot; generation with a KV cache (the decoder
 * slots) is llama_decode.c's, Hugging Face's files behind its hf_* slots
 * llama_hf.c's.
 *
 * Parameters carry Hugging Face's names without "model.", weights (out,
 * in).  A layer's q, k and v weights are three tensors laid one after the
 * other in the unit's flat buffer, so one matmul reads them as the stacked
 * (q|k|v) weight; so are gate and up, and the q/k/v biases.
 *
 * Tensor parallelism is Megatron-LM's 1D layout by kv-head groups: each
 * rank holds whole key/value heads with the query heads that read them
 * (q_proj, k_proj, v_proj and their biases split by rows, so n_kv_head
 * must divide by the tensor degree), gate_proj and up_proj column-parallel
 * (intermediate_size divides by it), o_proj and down_proj row-parallel,
 * embed_tokens and the LM head (tied or lm_head) vocabulary-parallel; the
 * RMSNorm weights stay whole on every rank.
 *
 * Checked against tests/reference/llama_ref.py (float64 numpy) by
 * tests/unit/plugins/llama/test_llama_oracle.c: loss, logits and every gradient.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama_internal.h" /* first: the model helpers (DT_MODEL_PLUGIN_HELPERS) */
#include "llama_hf.h"


/* Tensors of each unit, in their order in the unit's flat buffer.  A
 * block's q/k/v biases (qkv_bias) sit between v and o; without them the
 * later indices shift down by three (block_index). */
enum { EMB };
enum { LN1, QW, KW, VW, QB, KB, VB, OW, LN2, GW, UW, DW, NBLOCK };
enum { NORMW, LMW };

/* Activations of one block: what its backward reads (kept per block, or
 * recomputed into shared scratch when the block is recomputed), and the
 * two projections that only feed a residual add, which every block shares.
 * void * tensors are in the activation dtype (m->adtype), float * are f32. */
typedef struct block_acts {
    void *n1;               /* (B,T,C) input_layernorm output */
    float *rstd1;           /* (B,T) */
    void *qkv;              /* (B,T,QKV) q|k|v, q and k rotated */
    void *atty;             /* (B,T,QD) attention output */
    void *att_state;        /* attention's saved state, the device's own */
    void *res2;             /* (B,T,C) after the attention residual */
    void *n2;               /* (B,T,C) post_attention_layernorm output */
    float *rstd2;           /* (B,T) */
    void *gu;               /* (B,T,2I) gate|up */
    void *hmid;             /* (B,T,I) silu(gate) * up */
    void *attproj, *mlpout; /* (B,T,C) shared, forward only */
} block_acts_t;

/* What one micro-batch keeps from forward to backward (one slot). */
typedef struct llama_slot {
    void **x;
    block_acts_t *acts;
    void *nf;
    float *rstdf;
    void *probs;
} llama_slot_t;

typedef struct llama {
    llama_shape_t s;
    /* This rank's part (m->tp ranks; the whole model at tp 1): query and
     * kv heads, their widths, the packed q|k|v width, the MLP width. */
    int64_t nha, nkva, qd, kd, qkvd, hid;
    llama_slot_t *slots;
    /* the slot in use */
    void **x;            /* L+1 residual streams (B,T,C): x[0] embeddings */
    block_acts_t *acts;
    void *nf;            /* (B,T,C) final norm output */
    float *rstdf;        /* (B,T) */
    /* shared by the slots */
    block_acts_t scratch;
    void *attproj, *mlpout;
    float *rope_cos, *rope_sin; /* (T, HD/2) f32 */
    /* gradient scratch, in the activation dtype */
    void *dx, *dbuf_c;   /* (B,T,C) */
    void *dq;            /* (B,T,QD) */
    void *dqkv;          /* (B,T,QKV) */
    void *dgu;           /* (B,T,2I) */
    void *dhmid;         /* (B,T,I) */
    void *dlogits;       /* (B,T,V) */
} llama_t;

static llama_t *G(const dt_model_state_t *m) { return m->arch_state; }

const llama_shape_t *llama_shape(const dt_model_state_t *m) { return &G(m)->s; }

/* Index of tensor `k` (the enum above) in a block of this model. */
static int bidx(const llama_t *g, int k)
{
    return g->s.qkv_bias || k < QB ? k : k - 3;
}

/* Parameters of one decoder layer (whole model). */
static uint64_t block_params(const llama_shape_t *s)
{
    const uint64_t C = (uint64_t)s->n_embd, QD = (uint64_t)(s->n_head * s->head_dim),
                   KD = (uint64_t)(s->n_kv_head * s->head_dim),
                   I = (uint64_t)s->intermediate;
    return 2 * C + (QD + 2 * KD) * C + (s->qkv_bias ? QD + 2 * KD : 0) + C * QD + 3 * I * C;
}

static uint64_t param_count(const llama_shape_t *s)
{
    const uint64_t C = (uint64_t)s->n_embd, V = (uint64_t)s->vocab_size;
    return V * C + (uint64_t)s->n_layer * block_params(s) + C + (s->tie ? 0 : V * C);
}

/* ---- description ---- */

/* Public configs' shapes (config.json of each Hugging Face repository):
 *   smollm-135m     HuggingFaceTB/SmolLM-135M
 *   smollm-360m     HuggingFaceTB/SmolLM-360M
 *   tinyllama-1.1b  TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T
 *   llama-3.2-1b    meta-llama/Llama-3.2-1B (rope_scaling llama3, factor 32)
 *   llama-3.2-3b    meta-llama/Llama-3.2-3B
 *   llama-2-7b      meta-llama/Llama-2-7b-hf
 *   llama-tiny      a test-sized model */
static const struct {
    const char *name;
    llama_shape_t s;
} presets[] = {
    {"llama-tiny", {2, 4, 2, 128, 256, 64, 256, 32, 0, 0, 10000.0, 1e-5, 0, 0, 0, 0, 0}},
    {"smollm-135m",
     {30, 9, 3, 576, 49152, 2048, 1536, 64, 1, 0, 10000.0, 1e-5, 0, 0, 0, 0, 0}},
    {"smollm-360m",
     {32, 15, 5, 960, 49152, 2048, 2560, 64, 1, 0, 10000.0, 1e-5, 0, 0, 0, 0, 0}},
    {"tinyllama-1.1b",
     {22, 32, 4, 2048, 32000, 2048, 5632, 64, 0, 0, 10000.0, 1e-5, 0, 0, 0, 0, 0}},
    {"llama-3.2-1b",
     {16, 32, 8, 2048, 128256, 131072, 8192, 64, 1, 0, 500000.0, 1e-5, 1, 32.0, 1.0, 4.0,
      8192}},
    {"llama-3.2-3b",
     {28, 24, 8, 3072, 128256, 131072, 8192, 128, 1, 0, 500000.0, 1e-5, 1, 32.0, 1.0, 4.0,
      8192}},
    {"llama-2-7b",
     {32, 32, 32, 4096, 32000, 4096, 11008, 128, 0, 0, 10000.0, 1e-5, 0, 0, 0, 0, 0}},
};

/* The keys preset `p` sets, as [model] names and kinds, into out (room
 * for N_PRESET_KEYS): the shape, the rotary and norm settings, and with
 * rope_scaling llama3 its four keys.  Their count. */
enum { N_PRESET_KEYS = 17 };
static uint32_t preset_keys(const llama_shape_t *p, dt_model_key_t *out)
{
    uint32_t n = 0;
    const struct {
        const char *key;
        int64_t v;
    } ints[] = {{"n_layer", p->n_layer},       {"n_head", p->n_head},
                {"n_kv_head", p->n_kv_head},   {"n_embd", p->n_embd},
                {"vocab_size", p->vocab_size}, {"context", p->context},
                {"intermediate_size", p->intermediate}, {"head_dim", p->head_dim}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        out[n++] = (dt_model_key_t){.key = ints[i].key, .value = ints[i].v,
                                    .kind = DT_MODEL_KEY_INT};
    out[n++] = (dt_model_key_t){.key = "tie_embeddings", .value = p->tie,
                                .kind = DT_MODEL_KEY_BOOL};
    out[n++] = (dt_model_key_t){.key = "qkv_bias", .value = p->qkv_bias,
                                .kind = DT_MODEL_KEY_BOOL};
    out[n++] = (dt_model_key_t){.key = "rope_theta", .f = p->rope_theta,
                                .kind = DT_MODEL_KEY_FLOAT};
    out[n++] = (dt_model_key_t){.key = "rms_norm_eps", .f = p->rms_eps,
                                .kind = DT_MODEL_KEY_FLOAT};
    out[n++] = (dt_model_key_t){.key = "rope_scaling", .s = p->scaling ? "llama3" : "none",
                                .kind = DT_MODEL_KEY_CHOICE};
    if (p->scaling) {
        out[n++] = (dt_model_key_t){.key = "rope_scaling_factor", .f = p->rs_factor,
                                    .kind = DT_MODEL_KEY_FLOAT};
        out[n++] = (dt_model_key_t){.key = "rope_scaling_low_freq_factor", .f = p->rs_low,
                                    .kind = DT_MODEL_KEY_FLOAT};
        out[n++] = (dt_model_key_t){.key = "rope_scaling_high_freq_factor", .f = p->rs_high,
                                    .kind = DT_MODEL_KEY_FLOAT};
        out[n++] = (dt_model_key_t){.key = "rope_scaling_original_max_position_embeddings",
                                    .value = p->rs_orig, .kind = DT_MODEL_KEY_INT};
    }
    return n;
}

static const llama_shape_t *find_preset(const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(name, presets[i].name) == 0)
            return &presets[i].s;
    return NULL;
}

/* The preset slot: every key preset `name` sets (`dtrain plan --model`). */
static uint32_t llama_preset(const char *name, dt_model_key_t *out, uint32_t cap)
{
    const llama_shape_t *p = find_preset(name);
    dt_model_key_t k[N_PRESET_KEYS];
    const uint32_t n = p ? preset_keys(p, k) : 0;
    uint32_t i = 0;
    for (; i < n && i < cap; i++)
        out[i] = k[i];
    return i;
}

/* The integer [model] keys and where they land in the shape. */
static int64_t *int_key(llama_shape_t *s, int i)
{
    int64_t *const dst[] = {&s->n_layer,    &s->n_head,       &s->n_kv_head,
                            &s->n_embd,     &s->vocab_size,   &s->context,
                            &s->intermediate, &s->head_dim,   &s->rs_orig};
    return dst[i];
}
static const char *const int_keys[] = {
    "model.n_layer",    "model.n_head",            "model.n_kv_head",
    "model.n_embd",     "model.vocab_size",        "model.context",
    "model.intermediate_size", "model.head_dim",
    "model.rope_scaling_original_max_position_embeddings"};
enum { N_INT_KEYS = 9 };

/* A preset supplies every key the user did not write (origin "preset"
 * in the printed config). */
static int apply_preset(dt_model_state_t *m, const llama_shape_t *p)
{
    dt_model_key_t k[N_PRESET_KEYS];
    const uint32_t n = preset_keys(p, k);
    int rc = DT_OK;
    for (uint32_t i = 0; i < n && !rc; i++) {
        char path[96];
        snprintf(path, sizeof path, "model.%s", k[i].key);
        if (m->svc->config_origin(m, path) == DT_MODEL_ORIGIN_DEFAULT)
            rc = m->svc->config_set_preset(m, path, &k[i]);
    }
    return rc;
}

static int read_shape(dt_model_state_t *m, llama_shape_t *s)
{
    const char *preset, *scaling;
    const char *file = dt_model_cfg_name(m);
    const dt_model_services_t *sv = m->svc;
    int rc;
    if ((rc = sv->config_string(m, "model.preset", &preset)))
        return rc;
    const llama_shape_t *p = find_preset(preset);
    if (!p && strcmp(preset, "custom") != 0)
        return sv->set_error(DT_ERR_CONFIG,
                             "%s: [model] preset = \"%s\" is not a llama preset (arch = "
                             "\"llama\" takes custom, llama-tiny, smollm-135m, smollm-360m, "
                             "tinyllama-1.1b, llama-3.2-1b, llama-3.2-3b, llama-2-7b)",
                             file, preset);
    if (p && (rc = apply_preset(m, p)))
        return rc;
    for (int i = 0; i < N_INT_KEYS; i++)
        if ((rc = sv->config_int(m, int_keys[i], int_key(s, i))))
            return rc;
    if ((rc = sv->config_string(m, "model.rope_scaling", &scaling)) ||
        (rc = sv->config_bool(m, "model.tie_embeddings", &s->tie)) ||
        (rc = sv->config_bool(m, "model.qkv_bias", &s->qkv_bias)) ||
        (rc = sv->config_float(m, "model.rope_theta", &s->rope_theta)) ||
        (rc = sv->config_float(m, "model.rms_norm_eps", &s->rms_eps)) ||
        (rc = sv->config_float(m, "model.rope_scaling_factor", &s->rs_factor)) ||
        (rc = sv->config_float(m, "model.rope_scaling_low_freq_factor", &s->rs_low)) ||
        (rc = sv->config_float(m, "model.rope_scaling_high_freq_factor", &s->rs_high)))
        return rc;
    s->scaling = strcmp(scaling, "llama3") == 0;
    if (s->n_kv_head == 0)
        s->n_kv_head = s->n_head;
    if (s->intermediate == 0)
        s->intermediate = 4 * s->n_embd;
    if (s->head_dim == 0) {
        if (s->n_embd % s->n_head != 0)
            return m->svc->set_error(DT_ERR_CONFIG,
                              "%s: [model] n_embd = %lld is not divisible by n_head = %lld "
                              "(set head_dim to give the head size)",
                              file, (long long)s->n_embd, (long long)s->n_head);
        s->head_dim = s->n_embd / s->n_head;
    }
    if (s->n_head % s->n_kv_head != 0)
        return m->svc->set_error(DT_ERR_CONFIG,
                          "%s: [model] n_kv_head = %lld does not divide n_head = %lld: query "
                          "heads share key/value heads in equal groups",
                          file, (long long)s->n_kv_head, (long long)s->n_head);
    if (s->head_dim % 2 != 0)
        return m->svc->set_error(DT_ERR_CONFIG,
                          "%s: [model] head_dim = %lld is odd: the rotary embedding pairs a "
                          "head's channels",
                          file, (long long)s->head_dim);
    if (!(s->rope_theta > 1.0))
        return m->svc->set_error(DT_ERR_CONFIG, "%s: [model] rope_theta = %g: must be above 1", file,
                          s->rope_theta);
    if (!(s->rms_eps > 0.0))
        return m->svc->set_error(DT_ERR_CONFIG, "%s: [model] rms_norm_eps = %g: must be above 0",
                          file, s->rms_eps);
    if (s->scaling && !(s->rs_factor >= 1.0 && s->rs_high > s->rs_low && s->rs_low > 0.0))
        return m->svc->set_error(DT_ERR_CONFIG,
                          "%s: [model] rope_scaling = \"llama3\" needs rope_scaling_factor >= 1 "
                          "and rope_scaling_high_freq_factor > rope_scaling_low_freq_factor > 0 "
                          "(got %g, %g, %g)",
                          file, s->rs_factor, s->rs_high, s->rs_low);
    return DT_OK;
}

/* How a block tensor is laid across the tensor group: whole on every rank,
 * split by rows (this rank's heads or MLP columns: one contiguous block),
 * or split by columns (the input of a row-parallel layer). */
enum { TP_WHOLE = 0, TP_ROWS = 1, TP_COLS = 2 };

/* Add tensor `name` of global shape (r) or (r, c), laid as `how`. */
static int add_part(dt_model_state_t *m, uint32_t u, const char *name, int ndim, int64_t r, int64_t c,
                    int kind, int how)
{
    const int64_t P = m->tp, k = m->tp_rank;
    int64_t d0 = r, d1 = c;
    dt_param_block_t b;
    memset(&b, 0, sizeof b);
    uint32_t nb = 0;
    if (how == TP_ROWS) {
        b.start[0] = k * (r / P);
        b.size[0] = r / P;
        b.size[1] = ndim > 1 ? c : 0;
        nb = 1;
        d0 = r / P;
    } else if (how == TP_COLS) {
        b.start[1] = k * (c / P);
        b.size[0] = r;
        b.size[1] = c / P;
        nb = 1;
        d1 = c / P;
    }
    int rc = dt_model_add_param(m, u, name, ndim, d0, d1, kind, 0.02);
    return rc ? rc : dt_model_part(m, u, r, c, nb, &b);
}

static int llama_create(dt_model_state_t *m)
{
    llama_t *g = calloc(1, sizeof *g);
    if (!g)
        return m->svc->set_error(DT_ERR_NOMEM, "model: out of memory");
    m->arch_state = g;
    int rc = read_shape(m, &g->s);
    if (rc)
        return rc;
    const llama_shape_t *s = &g->s;
    const int64_t L = s->n_layer, C = s->n_embd, V = s->vocab_size, HD = s->head_dim,
                  I = s->intermediate;
    const int64_t P = m->tp, k = m->tp_rank;
    /* tensor parallelism: whole kv heads (and their query heads) and the
     * MLP width split P ways; the vocabulary in P near-equal ranges */
    if (s->n_kv_head % P != 0)
        return m->svc->set_error(DT_ERR_CONFIG,
                          "%s: [parallel] tensor = %lld does not divide [model] n_kv_head = "
                          "%lld: key/value heads (with their query heads) are split across the "
                          "tensor group",
                          dt_model_cfg_name(m), (long long)P, (long long)s->n_kv_head);
    if (I % P != 0)
        return m->svc->set_error(DT_ERR_CONFIG,
                          "%s: [parallel] tensor = %lld does not divide [model] "
                          "intermediate_size = %lld: the MLP is split across the tensor group",
                          dt_model_cfg_name(m), (long long)P, (long long)I);
    if (V < P)
        return m->svc->set_error(DT_ERR_CONFIG,
                          "%s: [parallel] tensor = %lld exceeds [model] vocab_size = %lld: "
                          "the vocabulary is split across the tensor group",
                          dt_model_cfg_name(m), (long long)P, (long long)V);
    g->nha = s->n_head / P;
    g->nkva = s->n_kv_head / P;
    g->qd = g->nha * HD;
    g->kd = g->nkva * HD;
    g->qkvd = g->qd + 2 * g->kd;
    g->hid = I / P;
    m->vocab_local = V / P + (k < V % P);
    m->vocab_first = k * (V / P) + (k < V % P ? k : V % P);
    dt_model_add_key(m, "n_layer", L);
    dt_model_add_key(m, "n_head", s->n_head);
    dt_model_add_key(m, "n_kv_head", s->n_kv_head);
    dt_model_add_key(m, "n_embd", C);
    dt_model_add_key(m, "vocab_size", V);
    dt_model_add_key(m, "context", s->context);
    dt_model_add_key(m, "intermediate_size", I);
    dt_model_add_key(m, "head_dim", HD);
    dt_model_add_bool_key(m, "tie_embeddings", s->tie);
    dt_model_add_bool_key(m, "qkv_bias", s->qkv_bias);
    dt_model_add_float_key(m, "rope_theta", s->rope_theta);
    dt_model_add_float_key(m, "rms_norm_eps", s->rms_eps);
    dt_model_add_choice_key(m, "rope_scaling", s->scaling ? "llama3" : "none");
    if (s->scaling) {
        dt_model_add_float_key(m, "rope_scaling_factor", s->rs_factor);
        dt_model_add_float_key(m, "rope_scaling_low_freq_factor", s->rs_low);
        dt_model_add_float_key(m, "rope_scaling_high_freq_factor", s->rs_high);
        dt_model_add_key(m, "rope_scaling_original_max_position_embeddings", s->rs_orig);
    }
    m->info->vocab_size = V;
    m->info->context = s->context;
    m->info->boundary_width = C;
    m->info->tied_embedding = s->tie;

    const dt_param_block_t vocab_part = {.start = {m->vocab_first, 0},
                                         .size = {m->vocab_local, C}};
    if ((rc = dt_model_alloc_units(m, (uint32_t)L + 2)) ||
        (rc = dt_model_name_unit(m, 0, "embedding")) ||
        (rc = dt_model_add_param(m, 0, "embed_tokens.weight", 2, m->vocab_local, C,
                                 DT_TENSOR_EMBED, 0.02)) ||
        (rc = dt_model_part(m, 0, V, C, 1, &vocab_part)))
        return rc;
    const int64_t QD = s->n_head * HD, KD = s->n_kv_head * HD;
    const struct {
        const char *suffix;
        int ndim;
        int64_t r, c;
        int kind, how;
    } t[NBLOCK] = {
        [LN1] = {"input_layernorm.weight", 1, C, 0, DT_TENSOR_NORM, TP_WHOLE},
        [QW] = {"self_attn.q_proj.weight", 2, QD, C, DT_TENSOR_MATRIX, TP_ROWS},
        [KW] = {"self_attn.k_proj.weight", 2, KD, C, DT_TENSOR_MATRIX, TP_ROWS},
        [VW] = {"self_attn.v_proj.weight", 2, KD, C, DT_TENSOR_MATRIX, TP_ROWS},
        [QB] = {"self_attn.q_proj.bias", 1, QD, 0, DT_TENSOR_BIAS, TP_ROWS},
        [KB] = {"self_attn.k_proj.bias", 1, KD, 0, DT_TENSOR_BIAS, TP_ROWS},
        [VB] = {"self_attn.v_proj.bias", 1, KD, 0, DT_TENSOR_BIAS, TP_ROWS},
        [OW] = {"self_attn.o_proj.weight", 2, C, QD, DT_TENSOR_MATRIX, TP_COLS},
        [LN2] = {"post_attention_layernorm.weight", 1, C, 0, DT_TENSOR_NORM, TP_WHOLE},
        [GW] = {"mlp.gate_proj.weight", 2, I, C, DT_TENSOR_MATRIX, TP_ROWS},
        [UW] = {"mlp.up_proj.weight", 2, I, C, DT_TENSOR_MATRIX, TP_ROWS},
        [DW] = {"mlp.down_proj.weight", 2, C, I, DT_TENSOR_MATRIX, TP_COLS},
    };
    for (int64_t l = 0; l < L; l++) {
        const uint32_t u = (uint32_t)l + 1;
        char nm[128];
        snprintf(nm, sizeof nm, "block.%lld", (long long)l);
        if ((rc = dt_model_name_unit(m, u, nm)))
            return rc;
        for (int j = 0; j < NBLOCK; j++) {
            if (!s->qkv_bias && (j == QB || j == KB || j == VB))
                continue;
            snprintf(nm, sizeof nm, "layers.%lld.%s", (long long)l, t[j].suffix);
            if ((rc = add_part(m, u, nm, t[j].ndim, t[j].r, t[j].c, t[j].kind, t[j].how)))
                return rc;
        }
    }
    const uint32_t head = (uint32_t)L + 1;
    if ((rc = dt_model_name_unit(m, head, "head")) ||
        (rc = dt_model_add_param(m, head, "norm.weight", 1, C, 0, DT_TENSOR_NORM, 0)) ||
        (rc = dt_model_part(m, head, C, 0, 0, NULL)))
        return rc;
    if (!s->tie &&
        ((rc = dt_model_add_param(m, head, "lm_head.weight", 2, m->vocab_local, C,
                                  DT_TENSOR_MATRIX, 0.02)) ||
         (rc = dt_model_part(m, head, V, C, 1, &vocab_part))))
        return rc;
    return DT_OK;
}

static void llama_free(dt_model_state_t *m)
{
    llama_t *g = G(m);
    if (!g)
        return;
    for (uint32_t i = 0; g->slots && i < m->n_slots; i++) {
        free(g->slots[i].x);
        free(g->slots[i].acts);
    }
    free(g->slots);
    free(g);
    m->arch_state = NULL;
}

/* ---- rotary tables ---- */

/* inv_freq[i] = theta^(-2i/d) (i < d/2), rescaled as Llama 3.1 does under
 * rope_scaling "llama3" (transformers' _compute_llama3_parameters). */
double llama_inv_freq(const llama_shape_t *s, int64_t i)
{
    const double d = (double)s->head_dim;
    double inv = 1.0 / pow(s->rope_theta, (double)(2 * i) / d);
    if (!s->scaling)
        return inv;
    const double pi = 3.14159265358979323846;
    const double old = (double)s->rs_orig, lo = s->rs_low, hi = s->rs_high,
                 factor = s->rs_factor;
    const double wavelen = 2.0 * pi / inv, lo_wavelen = old / lo, hi_wavelen = old / hi;
    if (wavelen < hi_wavelen)
        return inv;
    if (wavelen > lo_wavelen)
        return inv / factor;
    const double smooth = (old / wavelen - lo) / (hi - lo);
    return (1.0 - smooth) * inv / factor + smooth * inv;
}

/* Bytes of the cos and sin tables for T positions. */
static double rope_bytes(const dt_model_state_t *m, int64_t T)
{
    return 2.0 * (double)T * (double)(G(m)->s.head_dim / 2) * 4.0;
}

/* Compute the tables for positions [0, T) in double and upload them. */
static int upload_rope(dt_model_state_t *m, const dt_model_ctx_t *ctx)
{
    llama_t *g = G(m);
    const int64_t T = m->T, h = g->s.head_dim / 2;
    float *host = malloc((size_t)(2 * T * h) * sizeof *host);
    if (!host)
        return m->svc->set_error(DT_ERR_NOMEM, "model: out of memory");
    for (int64_t i = 0; i < h; i++) {
        const double f = llama_inv_freq(&g->s, i);
        for (int64_t t = 0; t < T; t++) {
            host[t * h + i] = (float)cos((double)t * f);
            host[T * h + t * h + i] = (float)sin((double)t * f);
        }
    }
    const uint64_t bytes = (uint64_t)(T * h) * sizeof *host;
    int rc;
    if ((rc = dt_device_ops(ctx->dev)->memcpy_async(ctx->dev, g->rope_cos, host, bytes, DT_COPY_H2D,
                                         ctx->stream)) ||
        (rc = dt_device_ops(ctx->dev)->memcpy_async(ctx->dev, g->rope_sin, host + T * h, bytes,
                                         DT_COPY_H2D, ctx->stream)) ||
        (rc = dt_device_ops(ctx->dev)->stream_sync(ctx->dev, ctx->stream)))
        rc = m->svc->err_context(rc, "model: uploading the rotary tables");
    free(host);
    return rc;
}

/* ---- activations ---- */

static int attn_state_bytes(const dt_model_state_t *m, int64_t B, int64_t T, uint64_t *out)
{
    const llama_t *g = G(m);
    int rc = m->kern->attention_state_bytes(B, T, g->qd, g->nha, m->adtype, out);
    if (rc)
        return m->svc->set_error(rc,
                          "model: device '%s' refused attention_state_bytes for B %lld, T %lld, "
                          "C %lld, NH %lld, %s activations (%s)",
                          m->dev_name, (long long)B, (long long)T, (long long)g->qd,
                          (long long)g->nha, dt_dtype_name(m->adtype), dt_status_name(rc));
    return DT_OK;
}

/* Bytes of a block's kept activations (alloc_block's sizes): n1, res2, n2
 * (B,T,C), qkv (B,T,QKV), atty (B,T,QD), gu (B,T,2I), hmid (B,T,I) of `es`
 * bytes, rstd1 and rstd2 (B,T) f32, and attention's saved state. */
static double block_bytes(const llama_t *g, double B, double T, double es, uint64_t att_state)
{
    const double C = (double)g->s.n_embd;
    return es * B * T * (3.0 * C + (double)g->qkvd + (double)g->qd + 3.0 * (double)g->hid) +
           2.0 * 4.0 * B * T + (double)att_state;
}

static int alloc_block(dt_model_state_t *m, const dt_model_ctx_t *ctx, block_acts_t *a)
{
    const llama_t *g = G(m);
    const int64_t BT = m->B * m->T, C = g->s.n_embd, H = g->hid;
    const size_t es = dt_model_act_size(m);
    uint64_t att_state;
    int rc;
    if ((rc = attn_state_bytes(m, m->B, m->T, &att_state)) ||
        (rc = dt_model_dalloc(m, ctx, BT * C, es, &a->n1)) ||
        (rc = dt_model_dalloc(m, ctx, BT, 4, &a->rstd1)) ||
        (rc = dt_model_dalloc(m, ctx, BT * g->qkvd, es, &a->qkv)) ||
        (rc = dt_model_dalloc(m, ctx, BT * g->qd, es, &a->atty)) ||
        (rc = dt_model_dalloc(m, ctx, (int64_t)att_state, 1, &a->att_state)) ||
        (rc = dt_model_dalloc(m, ctx, BT * C, es, &a->res2)) ||
        (rc = dt_model_dalloc(m, ctx, BT * C, es, &a->n2)) ||
        (rc = dt_model_dalloc(m, ctx, BT, 4, &a->rstd2)) ||
        (rc = dt_model_dalloc(m, ctx, BT * 2 * H, es, &a->gu)) ||
        (rc = dt_model_dalloc(m, ctx, BT * H, es, &a->hmid)))
        return rc;
    a->attproj = g->attproj;
    a->mlpout = g->mlpout;
    return DT_OK;
}

/* As gpt2_act_bytes: each unit keeps its output; a block not recomputed
 * its intermediates; the head the final norm's output and statistics and
 * the probabilities.  All else is workspace, the rotary tables included. */
static int llama_act_bytes(const dt_model_state_t *m, int64_t B_, int64_t T_, double *unit,
                           double *ws)
{
    const llama_t *g = G(m);
    const double B = (double)B_, T = (double)T_, BT = B * T, C = (double)g->s.n_embd,
                 V = (double)m->vocab_local, es = (double)dt_model_act_size(m);
    const int64_t L = g->s.n_layer;
    uint64_t att_state;
    int rc = attn_state_bytes(m, B_, T_, &att_state);
    if (rc)
        return rc;
    const double block = block_bytes(g, B, T, es, att_state);
    int any_recompute = 0;
    if (dt_model_keeps(m, 0) != DT_KEEP_NONE)
        unit[0] += es * BT * C;
    for (int64_t l = 0; l < L; l++) {
        const int keep = dt_model_keeps(m, (uint32_t)l + 1);
        if (keep != DT_KEEP_NONE)
            unit[l + 1] += es * BT * C;
        if (keep != DT_KEEP_ALL)
            continue;
        if (dt_model_recomputes(m, l))
            any_recompute = 1;
        else
            unit[l + 1] += block;
    }
    const int head = dt_model_keeps(m, (uint32_t)L + 1) == DT_KEEP_ALL;
    if (head)
        unit[L + 1] += es * (BT * C + BT * V) + 4.0 * BT;
    /* recompute scratch, the shared projections (2C), the gradient
     * scratch dx dbuf_c (2C), dq (QD), dqkv (QKV), dgu (2I), dhmid (I),
     * the rotary tables, and where the head runs the logits, losses,
     * dlogits and under tensor parallelism the cross-entropy's row state */
    *ws += (any_recompute ? block : 0.0) + es * 4.0 * BT * C +
           es * BT * ((double)g->qd + (double)g->qkvd + 3.0 * (double)g->hid) +
           rope_bytes(m, T_) +
           (head ? es * 2.0 * BT * V + 4.0 * BT + (m->tp > 1 ? 12.0 * BT : 0.0) : 0.0);
    return DT_OK;
}

static int alloc_slot(dt_model_state_t *m, const dt_model_ctx_t *ctx, llama_slot_t *s)
{
    const llama_t *g = G(m);
    const int64_t L = g->s.n_layer, C = g->s.n_embd, V = m->vocab_local, BT = m->B * m->T;
    const uint32_t head = (uint32_t)L + 1;
    const size_t es = dt_model_act_size(m);
    s->x = calloc((size_t)L + 1, sizeof *s->x);
    s->acts = calloc((size_t)L, sizeof *s->acts);
    if (!s->x || !s->acts)
        return m->svc->set_error(DT_ERR_NOMEM, "model: out of memory");
    int rc;
    for (int64_t l = 0; l <= L; l++) {
        m->act_owner = (uint32_t)l;
        if (dt_model_keeps(m, (uint32_t)l) != DT_KEEP_NONE &&
            (rc = dt_model_dalloc(m, ctx, BT * C, es, &s->x[l])))
            return rc;
    }
    for (int64_t l = 0; l < L; l++) {
        if (dt_model_keeps(m, (uint32_t)l + 1) != DT_KEEP_ALL || dt_model_recomputes(m, l))
            continue;
        m->act_owner = (uint32_t)l + 1;
        if ((rc = alloc_block(m, ctx, &s->acts[l])))
            return rc;
    }
    m->act_owner = head;
    if (dt_model_keeps(m, head) == DT_KEEP_ALL &&
        ((rc = dt_model_dalloc(m, ctx, BT * C, es, &s->nf)) ||
         (rc = dt_model_dalloc(m, ctx, BT, 4, &s->rstdf)) ||
         (rc = dt_model_dalloc(m, ctx, BT * V, es, &s->probs))))
        return rc;
    return DT_OK;
}

static void llama_use_slot(dt_model_state_t *m, uint32_t i)
{
    llama_t *g = G(m);
    const llama_slot_t *s = &g->slots[i];
    g->x = s->x;
    g->acts = s->acts;
    g->nf = s->nf;
    g->rstdf = s->rstdf;
    m->probs = s->probs;
}

static int llama_alloc_acts(dt_model_state_t *m, const dt_model_ctx_t *ctx)
{
    llama_t *g = G(m);
    const int64_t L = g->s.n_layer, C = g->s.n_embd, V = m->vocab_local, BT = m->B * m->T,
                  H = g->hid, half = g->s.head_dim / 2;
    const uint32_t head = (uint32_t)L + 1;
    const size_t es = dt_model_act_size(m);
    g->slots = calloc(m->n_slots, sizeof *g->slots);
    if (!g->slots)
        return m->svc->set_error(DT_ERR_NOMEM, "model: out of memory");
    int rc;
    m->act_owner = DT_ACT_WORKSPACE;
    if ((rc = dt_model_dalloc(m, ctx, BT * C, es, &g->attproj)) ||
        (rc = dt_model_dalloc(m, ctx, BT * C, es, &g->mlpout)) ||
        (rc = dt_model_dalloc(m, ctx, m->T * half, 4, &g->rope_cos)) ||
        (rc = dt_model_dalloc(m, ctx, m->T * half, 4, &g->rope_sin)))
        return rc;
    for (uint32_t i = 0; i < m->n_slots; i++)
        if ((rc = alloc_slot(m, ctx, &g->slots[i])))
            return rc;
    int need_scratch = 0;
    for (int64_t l = 0; l < L; l++)
        need_scratch |= dt_model_keeps(m, (uint32_t)l + 1) == DT_KEEP_ALL &&
                        dt_model_recomputes(m, l);
    m->act_owner = DT_ACT_WORKSPACE;
    if (need_scratch && (rc = alloc_block(m, ctx, &g->scratch)))
        return rc;
    for (uint32_t i = 0; i < m->n_slots; i++)
        for (int64_t l = 0; l < L; l++)
            if (dt_model_keeps(m, (uint32_t)l + 1) == DT_KEEP_ALL && dt_model_recomputes(m, l))
                g->slots[i].acts[l] = g->scratch;
    if (dt_model_keeps(m, head) == DT_KEEP_ALL &&
        ((rc = dt_model_dalloc(m, ctx, BT * V, es, &m->logits)) ||
         (rc = dt_model_dalloc(m, ctx, BT, 4, &m->losses)) ||
         (rc = dt_model_dalloc(m, ctx, BT * V, es, &g->dlogits)) ||
         (m->tp > 1 && (rc = dt_model_dalloc(m, ctx, 3 * BT, 4, &m->xent_stats)))))
        return rc;
    if ((rc = dt_model_dalloc(m, ctx, BT * C, es, &g->dx)) ||
        (rc = dt_model_dalloc(m, ctx, BT * C, es, &g->dbuf_c)) ||
        (rc = dt_model_dalloc(m, ctx, BT * g->qd, es, &g->dq)) ||
        (rc = dt_model_dalloc(m, ctx, BT * g->qkvd, es, &g->dqkv)) ||
        (rc = dt_model_dalloc(m, ctx, BT * 2 * H, es, &g->dgu)) ||
        (rc = dt_model_dalloc(m, ctx, BT * H, es, &g->dhmid)))
        return rc;
    return upload_rope(m, ctx);
}

/* 6 FLOPs per matmul parameter per token (the embedding's lookup is
 * none; the LM head counted once, tied or not) plus attention's
 * 6 L T (n_head head_dim), as gpt2_flops_per_token. */
static double llama_flops_per_token(const dt_model_state_t *m, int64_t T)
{
    const llama_shape_t *s = &G(m)->s;
    const double V = (double)s->vocab_size, C = (double)s->n_embd;
    const double N = (double)param_count(s) - (s->tie ? 0.0 : V * C);
    return 6.0 * N + 6.0 * (double)s->n_layer * (double)T * (double)(s->n_head * s->head_dim);
}

/* The all-reduces of one micro-batch (as gpt2_tp_comm: the embedding's,
 * two per block forward and backward, the cross-entropy's and the LM
 * head's input gradient). */
static void llama_tp_comm(const dt_model_state_t *m, int64_t B, int64_t T, dt_model_tp_comm_t *out)
{
    const llama_t *g = G(m);
    const uint64_t BT = (uint64_t)(B * T),
                   act = BT * (uint64_t)g->s.n_embd * dt_model_act_size(m);
    const uint32_t L = (uint32_t)g->s.n_layer;
    if (dt_model_keeps(m, 0) == DT_KEEP_ALL) {
        out->fwd++;
        out->fwd_bytes += act;
    }
    for (uint32_t l = 0; l < L; l++) {
        if (dt_model_keeps(m, l + 1) != DT_KEEP_ALL)
            continue;
        const uint32_t again = dt_model_recomputes(m, l) ? 2 : 0;
        out->fwd += 2;
        out->fwd_bytes += 2 * act;
        out->bwd += 2 + again;
        out->bwd_bytes += (2 + again) * act;
    }
    if (dt_model_keeps(m, L + 1) == DT_KEEP_ALL) {
        out->fwd += 2;
        out->fwd_bytes += 3 * BT * sizeof(float);
        out->bwd++;
        out->bwd_bytes += act;
    }
}

/* llama_flops_per_token unit by unit: the embedding 0, a block 6 per
 * parameter and its attention's, the head 6 per norm and LM head
 * parameter. */
static void llama_unit_flops(const dt_model_state_t *m, int64_t T, double *out)
{
    const llama_shape_t *s = &G(m)->s;
    const double C = (double)s->n_embd, V = (double)s->vocab_size;
    const double block = (double)block_params(s);
    const uint32_t L = (uint32_t)s->n_layer;
    out[0] = 0.0;
    for (uint32_t l = 0; l < L; l++)
        out[l + 1] = 6.0 * block + 6.0 * (double)T * (double)(s->n_head * s->head_dim);
    out[L + 1] = 6.0 * (C + V * C);
}

/* ---- forward / backward ---- */

#define K (m->kern)
#define D ctx->dev, ctx->stream

/* What dt_model_find_nonfinite calls each kernel output of block l. */
enum { P_N1, P_QKV, P_ROPE, P_ATTY, P_ATTPROJ, P_RES2, P_N2, P_GU, P_SWIGLU, P_MLP, P_OUT };
static const struct {
    const char *tensor, *verb, *op;
} block_probe[] = {
    [P_N1] = {".input_layernorm output", "the forward of", ".input_layernorm"},
    [P_QKV] = {".self_attn q|k|v", "the forward of", ".self_attn.q_proj|k_proj|v_proj"},
    [P_ROPE] = {".self_attn rotated q|k", "the rotary embedding of", ".self_attn"},
    [P_ATTY] = {".self_attn weighted values", "the forward of",
                ".self_attn (causal grouped-query attention)"},
    [P_ATTPROJ] = {".self_attn output", "the forward of", ".self_attn.o_proj"},
    [P_RES2] = {" residual stream after self_attn", "the residual add of", ".self_attn"},
    [P_N2] = {".post_attention_layernorm output", "the forward of",
              ".post_attention_layernorm"},
    [P_GU] = {".mlp gate|up", "the forward of", ".mlp.gate_proj|up_proj"},
    [P_SWIGLU] = {".mlp silu(gate) * up", "the forward of", ".mlp (SwiGLU)"},
    [P_MLP] = {".mlp output", "the forward of", ".mlp.down_proj"},
    [P_OUT] = {" output (residual stream after the layer)", "the residual add of", ".mlp"},
};

static int probe_block(dt_model_state_t *m, const dt_model_ctx_t *ctx, int64_t l, int which,
                       const void *x, int64_t n)
{
    if (!dt_model_probing(m))
        return DT_OK;
    char what[160], after[160];
    snprintf(what, sizeof what, "activation layers.%lld%s", (long long)l,
             block_probe[which].tensor);
    snprintf(after, sizeof after, "%s layers.%lld%s", block_probe[which].verb, (long long)l,
             block_probe[which].op);
    return dt_model_probe(m, ctx, what, (uint32_t)l + 1, after, x, m->adtype, (uint64_t)n);
}

/* Forward of block l with parameters `v`, input x, output `out`.  Under
 * tensor parallelism this rank runs its kv heads with their query heads
 * and its share of the MLP; o_proj and down_proj give partial sums,
 * all-reduced over the tensor group, so the residual stream is whole on
 * every rank. */
static int block_forward(dt_model_state_t *m, const dt_model_ctx_t *ctx, int64_t l,
                         const dt_unit_view_t *v, const void *x, block_acts_t *a, void *out)
{
    const llama_t *g = G(m);
    const int64_t B = m->B, T = m->T, C = g->s.n_embd, HD = g->s.head_dim, H = g->hid,
                  BT = B * T;
    const int ad = m->adtype, wd = m->wdtype;
    const float eps = (float)g->s.rms_eps;
    const uint32_t u = (uint32_t)l + 1;
    const void *qkv_bias = g->s.qkv_bias ? v->a[QB] : NULL;
    DT_TRY(K->rmsnorm_forward(D, a->n1, a->rstd1, x, v->a[LN1], ad, BT, C, eps));
    DT_TRY(probe_block(m, ctx, l, P_N1, a->n1, BT * C));
    DT_TRY(K->matmul_forward(D, a->qkv, a->n1, v->w[QW], qkv_bias, ad, wd, BT, C, g->qkvd));
    DT_TRY(probe_block(m, ctx, l, P_QKV, a->qkv, BT * g->qkvd));
    /* q then k: nha + nkva heads from the row start, in place */
    DT_TRY(K->rope_forward(D, a->qkv, a->qkv, g->rope_cos, g->rope_sin, ad, B, T,
                           g->nha + g->nkva, HD, g->qkvd));
    DT_TRY(probe_block(m, ctx, l, P_ROPE, a->qkv, BT * g->qkvd));
    DT_TRY(K->gqa_attention_forward(D, a->atty, a->att_state, a->qkv, ad, B, T, g->nha, g->nkva,
                                    HD));
    DT_TRY(probe_block(m, ctx, l, P_ATTY, a->atty, BT * g->qd));
    DT_TRY(K->matmul_forward(D, a->attproj, a->atty, v->w[bidx(g, OW)], NULL, ad, wd, BT, g->qd,
                             C));
    DT_TRY(dt_model_tp_row_forward(m, ctx, a->attproj, BT * C, "the self_attn output", u));
    DT_TRY(probe_block(m, ctx, l, P_ATTPROJ, a->attproj, BT * C));
    DT_TRY(K->residual_forward(D, a->res2, x, a->attproj, ad, BT * C));
    DT_TRY(probe_block(m, ctx, l, P_RES2, a->res2, BT * C));
    DT_TRY(K->rmsnorm_forward(D, a->n2, a->rstd2, a->res2, v->a[bidx(g, LN2)], ad, BT, C, eps));
    DT_TRY(probe_block(m, ctx, l, P_N2, a->n2, BT * C));
    DT_TRY(K->matmul_forward(D, a->gu, a->n2, v->w[bidx(g, GW)], NULL, ad, wd, BT, C, 2 * H));
    DT_TRY(probe_block(m, ctx, l, P_GU, a->gu, BT * 2 * H));
    DT_TRY(K->swiglu_forward(D, a->hmid, a->gu, ad, BT, H));
    DT_TRY(probe_block(m, ctx, l, P_SWIGLU, a->hmid, BT * H));
    DT_TRY(K->matmul_forward(D, a->mlpout, a->hmid, v->w[bidx(g, DW)], NULL, ad, wd, BT, H, C));
    DT_TRY(dt_model_tp_row_forward(m, ctx, a->mlpout, BT * C, "the mlp output", u));
    DT_TRY(probe_block(m, ctx, l, P_MLP, a->mlpout, BT * C));
    DT_TRY(K->residual_forward(D, out, a->res2, a->mlpout, ad, BT * C));
    DT_TRY(probe_block(m, ctx, l, P_OUT, out, BT * C));
    return DT_OK;
}

/* Backward of block l: g->dx holds d(out) on entry and d(x) on return;
 * `gr` is the unit's flat gradient, `o` its tensors' offsets. */
static int block_backward(dt_model_state_t *m, const dt_model_ctx_t *ctx, int64_t l,
                          const dt_unit_view_t *v, float *gr, const uint64_t *o, const void *x,
                          const block_acts_t *a)
{
    llama_t *g = G(m);
    const int64_t B = m->B, T = m->T, C = g->s.n_embd, HD = g->s.head_dim, H = g->hid,
                  BT = B * T;
    const int ad = m->adtype, wd = m->wdtype;
    const uint64_t es = dt_model_act_size(m);
    const uint32_t u = (uint32_t)l + 1;
    void *dx = g->dx;
    /* down_proj: out = res2 + mlpout, so d(mlpout) = dx */
    DT_TRY(dt_model_zero(ctx, g->dhmid, (uint64_t)(BT * H) * es));
    DT_TRY(K->matmul_backward(D, g->dhmid, gr + o[bidx(g, DW)], NULL, dx, a->hmid,
                              v->w[bidx(g, DW)], ad, wd, BT, H, C));
    DT_TRY(dt_model_zero(ctx, g->dgu, (uint64_t)(BT * 2 * H) * es));
    DT_TRY(K->swiglu_backward(D, g->dgu, a->gu, g->dhmid, ad, BT, H));
    /* gate|up: one weight gradient of 2H rows (the two tensors adjacent) */
    DT_TRY(dt_model_column_backward(m, ctx, g->dbuf_c, gr + o[bidx(g, GW)], NULL, g->dgu, a->n2,
                                    v->w[bidx(g, GW)], BT, C, 2 * H,
                                    "the gradient of the post_attention_layernorm output", u));
    DT_TRY(K->rmsnorm_backward(D, dx, gr + o[bidx(g, LN2)], g->dbuf_c, a->res2,
                               v->a[bidx(g, LN2)], a->rstd2, ad, BT, C));
    /* o_proj */
    DT_TRY(dt_model_zero(ctx, g->dq, (uint64_t)(BT * g->qd) * es));
    DT_TRY(K->matmul_backward(D, g->dq, gr + o[bidx(g, OW)], NULL, dx, a->atty,
                              v->w[bidx(g, OW)], ad, wd, BT, g->qd, C));
    DT_TRY(dt_model_zero(ctx, g->dqkv, (uint64_t)(BT * g->qkvd) * es));
    DT_TRY(K->gqa_attention_backward(D, g->dqkv, g->dq, a->qkv, a->atty, a->att_state, ad, B, T,
                                     g->nha, g->nkva, HD));
    /* the gradient of the rotated q and k becomes the unrotated ones' */
    DT_TRY(K->rope_backward(D, g->dqkv, g->dqkv, g->rope_cos, g->rope_sin, ad, B, T,
                            g->nha + g->nkva, HD, g->qkvd));
    DT_TRY(dt_model_column_backward(m, ctx, g->dbuf_c, gr + o[QW],
                                    g->s.qkv_bias ? gr + o[QB] : NULL, g->dqkv, a->n1, v->w[QW], BT,
                                    C, g->qkvd, "the gradient of the input_layernorm output", u));
    DT_TRY(K->rmsnorm_backward(D, dx, gr + o[LN1], g->dbuf_c, x, v->a[LN1], a->rstd1, ad, BT,
                               C));
    return DT_OK;
}

/* Forward of units [first, end) (a pipeline stage; [0, L + 2) is the whole
 * model), boundaries as gpt2_stage_forward's: the residual stream. */
static int llama_stage_forward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h,
                               uint32_t first, uint32_t end, const void *in, void *out)
{
    llama_t *g = G(m);
    const int64_t B = m->B, T = m->T, C = g->s.n_embd, V = m->vocab_local, BT = B * T;
    const uint32_t L = (uint32_t)g->s.n_layer, head = L + 1;
    const int ad = m->adtype, tie = g->s.tie;
    const uint64_t xbytes = (uint64_t)(BT * C) * dt_model_act_size(m);
    dt_unit_buffers_t b0 = {.struct_size = sizeof b0}, bl = {.struct_size = sizeof bl},
                      bh = {.struct_size = sizeof bh};
    dt_unit_view_t v0, vl, vh;

    if (first == 0) {
        DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, 0, 0, &b0));
        DT_TRY_UNIT(dt_model_view(m, ctx, 0, b0.params, 1, &v0), "forward", 0);
        /* this rank's vocabulary rows (all of them at tp 1), summed over
         * the tensor group */
        DT_TRY_UNIT(K->vocab_embedding_forward(D, g->x[0], m->tokens, v0.a[EMB], NULL, ad, B, T,
                                               C, m->vocab_first, m->vocab_local),
                    "forward", 0);
        DT_TRY(dt_model_tp_embedding(m, ctx, g->x[0], BT * C, "the embedding output", 0));
        DT_TRY(dt_model_probe(m, ctx, "activation embedding output", 0,
                              "the forward of embed_tokens.weight", g->x[0], ad,
                              (uint64_t)(BT * C)));
        DT_TRY(dt_model_hook(m, ctx, DT_POST_FORWARD, h, 0, 0, NULL));
    } else {
        DT_TRY_UNIT(dt_device_ops(ctx->dev)->memcpy_async(ctx->dev, g->x[first - 1], in, xbytes,
                                               DT_COPY_D2D, ctx->stream),
                    "forward (the stage's input)", first);
    }
    for (uint32_t l = first > 0 ? first - 1 : 0; l < L && l + 1 < end; l++) {
        DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, l + 1, 0, &bl));
        DT_TRY_UNIT(dt_model_view(m, ctx, l + 1, bl.params, 1, &vl), "forward", l + 1);
        DT_TRY_UNIT(block_forward(m, ctx, l, &vl, g->x[l], &g->acts[l], g->x[l + 1]), "forward",
                    l + 1);
        DT_TRY(dt_model_hook(m, ctx, DT_POST_FORWARD, h, l + 1, 0, NULL));
    }
    if (end <= head) {
        if (out)
            DT_TRY_UNIT(dt_device_ops(ctx->dev)->memcpy_async(ctx->dev, out, g->x[end - 1], xbytes,
                                                   DT_COPY_D2D, ctx->stream),
                        "forward (the stage's output)", end - 1);
        return DT_OK;
    }
    /* the head, and unit 0 again for a tied LM head (matmul only) */
    DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, head, 0, &bh));
    if (tie)
        DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, 0, 0, &b0));
    DT_TRY_UNIT(dt_model_view(m, ctx, head, bh.params, 1, &vh), "forward", head);
    if (tie)
        DT_TRY_UNIT(dt_model_view(m, ctx, 0, b0.params, 0, &v0), "forward", head);
    const void *wlm = tie ? v0.w[EMB] : vh.w[LMW];
    DT_TRY_UNIT(K->rmsnorm_forward(D, g->nf, g->rstdf, g->x[L], vh.a[NORMW], ad, BT, C,
                                   (float)g->s.rms_eps),
                "forward", head);
    DT_TRY(dt_model_probe(m, ctx, "activation norm output", head, "the forward of norm", g->nf,
                          ad, (uint64_t)(BT * C)));
    DT_TRY_UNIT(K->matmul_forward(D, m->logits, g->nf, wlm, NULL, ad, m->wdtype, BT, C, V),
                "forward", head);
    DT_TRY(dt_model_probe(m, ctx, "logits", head,
                          tie ? "the forward of the LM head (norm output @ "
                                "embed_tokens.weight^T)"
                              : "the forward of lm_head",
                          m->logits, ad, (uint64_t)(BT * V)));
    DT_TRY(dt_model_loss_forward(m, ctx, head));
    if (tie)
        DT_TRY(dt_model_hook(m, ctx, DT_POST_FORWARD, h, 0, 0, NULL));
    DT_TRY(dt_model_hook(m, ctx, DT_POST_FORWARD, h, head, 0, NULL));
    return DT_OK;
}

/* Backward of units [first, end), as gpt2_stage_backward. */
static int llama_stage_backward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h,
                                uint32_t first, uint32_t end, const void *dout, void *din,
                                float loss_scale)
{
    llama_t *g = G(m);
    const int64_t B = m->B, T = m->T, C = g->s.n_embd, V = m->vocab_local, BT = B * T;
    const uint32_t L = (uint32_t)g->s.n_layer, head = L + 1;
    const int ad = m->adtype, tie = g->s.tie;
    const uint64_t es = dt_model_act_size(m), xbytes = (uint64_t)(BT * C) * es;
    dt_unit_buffers_t b0 = {.struct_size = sizeof b0}, bl = {.struct_size = sizeof bl},
                      bh = {.struct_size = sizeof bh};
    dt_unit_view_t v0, vl, vh;

    if (end > head) {
        DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, head, 0, &bh));
        if (tie)
            DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, 0, 0, &b0));
        DT_TRY_UNIT(dt_model_view(m, ctx, head, bh.params, 1, &vh), "backward", head);
        if (tie)
            DT_TRY_UNIT(dt_model_view(m, ctx, 0, b0.params, 0, &v0), "backward", head);
        DT_TRY(dt_model_loss_backward(m, ctx, head, g->dlogits, loss_scale));
        /* the LM head is column-parallel over the vocabulary */
        float *dwlm = tie ? b0.grads : bh.grads + m->desc->units[head].params[LMW].offset;
        const void *wlm = tie ? v0.w[EMB] : vh.w[LMW];
        DT_TRY_UNIT(dt_model_column_backward(m, ctx, g->dbuf_c, dwlm, NULL, g->dlogits, g->nf, wlm,
                                             BT, C, V, "the gradient of the norm output",
                                             head), "backward", head);
        if (tie) /* on a stage without the embedding this is unit 0's last use */
            DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, 0, first > 0, NULL));
        DT_TRY_UNIT(dt_model_zero(ctx, g->dx, (uint64_t)BT * C * es), "backward", head);
        DT_TRY_UNIT(K->rmsnorm_backward(D, g->dx, bh.grads, g->dbuf_c, g->x[L], vh.a[NORMW],
                                        g->rstdf, ad, BT, C),
                    "backward", head);
        DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, head, 1, NULL));
    } else {
        DT_TRY_UNIT(dt_device_ops(ctx->dev)->memcpy_async(ctx->dev, g->dx, dout, xbytes,
                                                          DT_COPY_D2D, ctx->stream),
                    "backward (the stage's output gradient)", end - 1);
    }
    uint64_t o[NBLOCK];
    const uint32_t lo = first > 0 ? first - 1 : 0;
    for (uint32_t l = end - 1 < L ? end - 1 : L; l-- > lo;) {
        const dt_unit_desc_t *ud = &m->desc->units[l + 1];
        for (uint32_t k = 0; k < ud->n_params && k < NBLOCK; k++)
            o[k] = ud->params[k].offset;
        DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, l + 1, 0, &bl));
        DT_TRY_UNIT(dt_model_view(m, ctx, l + 1, bl.params, 1, &vl), "backward", l + 1);
        if (dt_model_recomputes(m, l)) /* recompute into scratch; dbuf_c is free here */
            DT_TRY_UNIT(block_forward(m, ctx, l, &vl, g->x[l], &g->scratch, g->dbuf_c),
                        "recompute", l + 1);
        DT_TRY_UNIT(block_backward(m, ctx, l, &vl, bl.grads, o, g->x[l], &g->acts[l]),
                    "backward", l + 1);
        DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, l + 1, 1, NULL));
    }
    if (first > 0) {
        DT_TRY_UNIT(dt_device_ops(ctx->dev)->memcpy_async(ctx->dev, din, g->dx, xbytes, DT_COPY_D2D,
                                               ctx->stream),
                    "backward (the stage's input gradient)", first);
        return DT_OK;
    }
    DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, 0, 0, &b0));
    DT_TRY_UNIT(K->vocab_embedding_backward(D, b0.grads, NULL, g->dx, m->tokens, ad, B, T, C,
                                            m->vocab_first, m->vocab_local),
                "backward", 0);
    DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, 0, 1, NULL));
    return DT_OK;
}

static int llama_forward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h)
{
    return llama_stage_forward(m, ctx, h, 0, m->desc->n_units, NULL, NULL);
}

static int llama_backward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h,
                          float loss_scale)
{
    return llama_stage_backward(m, ctx, h, 0, m->desc->n_units, NULL, NULL, loss_scale);
}

/* Beyond the core set: RMSNorm, RoPE, SwiGLU, grouped-query attention,
 * residual adds, the vocabulary-range embedding (at every tp: one path). */
static int llama_need_kernels(const dt_model_state_t *m)
{
    DT_MODEL_NEED(m, rmsnorm_forward);
    DT_MODEL_NEED(m, rmsnorm_backward);
    DT_MODEL_NEED(m, rope_forward);
    DT_MODEL_NEED(m, rope_backward);
    DT_MODEL_NEED(m, swiglu_forward);
    DT_MODEL_NEED(m, swiglu_backward);
    DT_MODEL_NEED(m, attention_state_bytes);
    DT_MODEL_NEED(m, gqa_attention_forward);
    DT_MODEL_NEED(m, gqa_attention_backward);
    DT_MODEL_NEED(m, residual_forward);
    DT_MODEL_NEED(m, vocab_embedding_forward);
    DT_MODEL_NEED(m, vocab_embedding_backward);
    if (m->tp > 1) {
        DT_MODEL_NEED(m, vocab_xent_forward);
        DT_MODEL_NEED(m, vocab_xent_backward);
    }
    return DT_OK;
}

static const dt_model_ops_v1_t llama_ops = {
    .info = DT_PLUGIN_INFO_NOKEYS(MODEL, dt_model_ops_v1_t, "llama", "1.0.0",
                                  "the LLaMA family ([model] preset, n_layer, n_head, n_kv_head, "
                                  "n_embd, intermediate_size, rope_theta ...): RMSNorm, rotary "
                                  "embeddings, grouped-query attention, SwiGLU, tied or untied "
                                  "head; tensor and pipeline parallel"),
    .create = llama_create,
    .act_bytes = llama_act_bytes,
    .alloc_acts = llama_alloc_acts,
    .forward = llama_forward,
    .backward = llama_backward,
    .stage_forward = llama_stage_forward,
    .stage_backward = llama_stage_backward,
    .use_slot = llama_use_slot,
    .flops_per_token = llama_flops_per_token,
    .tp_comm = llama_tp_comm,
    .unit_flops = llama_unit_flops,
    .free = llama_free,
    .need_kernels = llama_need_kernels,
    .preset = llama_preset,
    .decoder_create = llama_decoder_create,
    .decoder_step = llama_decoder_step,
    .decoder_len = llama_decoder_len,
    .decoder_reset = llama_decoder_reset,
    .decoder_free = llama_decoder_free,
    .hf_architectures = llama_hf_architectures,
    .hf_config_read = llama_hf_config_read,
    .hf_config_write = llama_hf_config_write,
    .hf_export_name = llama_hf_export_name,
    .hf_import_name = llama_hf_import_name,
};

DT_PLUGIN_ENTRY(model, 1, dt_model_ops_v1_t, &llama_ops)
