/*
 * plugins/gpt2/gpt2.c - the gpt2 model plugin (dtrain/model.h): the GPT-2
 * family as units: embedding, one unit per transformer block, head (final
 * layernorm; the LM head is tied to the embedding's wte and re-uses unit
 * 0).  Forward and backward follow llm.c's
 * train_gpt2.c, built from the device kernel table, with per-block
 * activation checkpointing (recompute the block in backward).
 *
 * Checked against tests/reference/gpt2_ref.py (float64 numpy) by
 * tests/unit/plugins/gpt2/test_gpt2_oracle.c: loss, logits and every gradient.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_internal.h"

/* Tensors of each unit, in their order in the unit's flat buffer. */
enum { WTE, WPE };
enum { LN1W, LN1B, ATTW, ATTB, PROJW, PROJB, LN2W, LN2B, FCW, FCB, FCPW, FCPB, NBLOCK };
enum { LNFW, LNFB };

/* Activations of one block: what its backward reads (kept per block, or
 * recomputed into shared scratch when the block is recomputed), and the two
 * projections that only feed a residual add, which every block shares.
 * void * tensors are in the activation dtype (m->adtype), float * are f32. */
typedef struct block_acts {
    void *ln1;                        /* (B,T,C) */
    float *ln1_mean, *ln1_rstd;       /* (B,T) (B,T) */
    void *qkv;                        /* (B,T,3C) */
    void *atty;                       /* (B,T,C) */
    void *att_state;                  /* attention's saved state, the
                                       * device's own layout (cpu: the
                                       * (B,NH,T,T) f32 probabilities) */
    void *res2;                       /* (B,T,C) */
    void *ln2;                        /* (B,T,C) */
    float *ln2_mean, *ln2_rstd;       /* (B,T) (B,T) */
    void *fch, *fch_gelu;             /* (B,T,4C) */
    void *attproj, *fcproj;           /* (B,T,C) shared, forward only */
} block_acts_t;

/* What one micro-batch keeps from forward to backward: one slot (a
 * pipeline stage may keep several, dt_model_set_slots).  The fields of
 * the same names in gpt2_t are the slot in use (gpt2_use_slot). */
typedef struct gpt2_slot {
    void **x;
    block_acts_t *acts;
    void *lnf;
    float *lnf_mean, *lnf_rstd;
    void *probs;
} gpt2_slot_t;

typedef struct gpt2 {
    gpt2_shape_t s;
    /* This rank's part under tensor parallelism (m->tp ranks; the whole
     * model at tp 1): attention width and heads, MLP width. */
    int64_t ca, nha, hid;
    gpt2_slot_t *slots;   /* m->n_slots */
    /* the slot in use */
    void **x;             /* L+1 residual streams (B,T,C): x[0] embeddings */
    block_acts_t *acts;   /* per block; recomputed blocks share `scratch` */
    void *lnf;                        /* (B,T,C) */
    float *lnf_mean, *lnf_rstd;       /* (B,T) (B,T) */
    /* shared by the slots */
    block_acts_t scratch; /* for recomputed blocks */
    void *attproj, *fcproj;           /* (B,T,C) every block's */
    /* gradient scratch, in the activation dtype */
    void *dx, *dbuf_c, *dbuf_c2;      /* (B,T,C) */
    void *dqkv;                       /* (B,T,3C) */
    void *dfch, *dfch_gelu;           /* (B,T,4C) */
    void *dlogits;                    /* (B,T,V) */
} gpt2_t;

static gpt2_t *G(const dt_model_state_t *m) { return m->arch_state; }

/* The parameters of one transformer block of width C: ln_1, c_attn,
 * attn.c_proj, ln_2, c_fc, mlp.c_proj, each with its bias. */
static uint64_t block_params(uint64_t C)
{
    return 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
}

static uint64_t param_count(const gpt2_shape_t *s)
{
    uint64_t C = (uint64_t)s->n_embd;
    return (uint64_t)s->vocab_size * C + (uint64_t)s->context * C +
           (uint64_t)s->n_layer * block_params(C) + 2 * C;
}

const gpt2_shape_t *gpt2_shape(const dt_model_state_t *m) { return &G(m)->s; }

/* ---- description ---- */

static const struct {
    const char *name;
    gpt2_shape_t s;
} presets[] = {
    {"gpt2-tiny", {2, 4, 128, 256, 64}},
    {"gpt2-small", {4, 4, 256, 256, 128}},
    {"gpt2-124m", {12, 12, 768, 50257, 1024}},
    {"gpt2-350m", {24, 16, 1024, 50257, 1024}},
    {"gpt2-774m", {36, 20, 1280, 50257, 1024}},
    {"gpt2-1558m", {48, 25, 1600, 50257, 1024}},
};

/* The preset slot: the shape keys of preset `name`, in the order
 * read_shape reads them. */
static uint32_t gpt2_preset(const char *name, dt_model_key_t *out, uint32_t cap)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(name, presets[i].name) == 0) {
            const gpt2_shape_t *s = &presets[i].s;
            const dt_model_key_t k[] = {{.key = "n_layer", .value = s->n_layer},
                                        {.key = "n_head", .value = s->n_head},
                                        {.key = "n_embd", .value = s->n_embd},
                                        {.key = "vocab_size", .value = s->vocab_size},
                                        {.key = "context", .value = s->context}};
            uint32_t n = 0;
            for (; n < 5 && n < cap; n++)
                out[n] = k[n];
            return n;
        }
    return 0;
}

static int read_shape(dt_model_state_t *m, gpt2_shape_t *s)
{
    const char *preset;
    int rc = m->svc->config_string(m, "model.preset", &preset);
    if (rc)
        return rc;
    static const char *keys[] = {"model.n_layer", "model.n_head", "model.n_embd",
                                 "model.vocab_size", "model.context"};
    int64_t *dst[] = {&s->n_layer, &s->n_head, &s->n_embd, &s->vocab_size, &s->context};
    const gpt2_shape_t *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(preset, presets[i].name) == 0)
            p = &presets[i].s;
    if (!p && strcmp(preset, "custom") != 0) {
        char names[256] = "custom";
        for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
            strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, presets[i].name, sizeof names - strlen(names) - 1);
        }
        return m->svc->set_error(DT_ERR_CONFIG, "%s: [model] preset = \"%s\": gpt2's presets "
                                 "are %s", dt_model_cfg_name(m), preset, names);
    }
    const int64_t pv[] = {p ? p->n_layer : 0, p ? p->n_head : 0, p ? p->n_embd : 0,
                          p ? p->vocab_size : 0, p ? p->context : 0};
    for (int i = 0; i < 5; i++) {
        if ((rc = m->svc->config_int(m, keys[i], dst[i])))
            return rc;
        /* A preset supplies every shape key the user did not write. */
        if (p && m->svc->config_origin(m, keys[i]) == DT_MODEL_ORIGIN_DEFAULT) {
            *dst[i] = pv[i];
            const dt_model_key_t v = {.value = pv[i], .kind = DT_MODEL_KEY_INT};
            if ((rc = m->svc->config_set_preset(m, keys[i], &v)))
                return rc;
        }
    }
    if (s->n_embd % s->n_head != 0)
        return m->svc->set_error(DT_ERR_CONFIG,
                                 "%s: [model] n_embd = %lld is not divisible by n_head = %lld",
                                 dt_model_cfg_name(m), (long long)s->n_embd, (long long)s->n_head);
    return DT_OK;
}

/* How a block tensor is laid across the tensor group (see model.h):
 * whole on every rank, split by rows in `groups` equal groups (the fused
 * QKV's q, k and v: each rank takes its share of every group, so of every
 * one of q, k and v its own heads), or split by columns (the input of a
 * row-parallel layer). */
enum { TP_WHOLE = 0, TP_ROWS = 1, TP_COLS = 2 };

/* Add tensor `name` of global shape (r x C) or (r x C, c x C) laid as
 * `how` (groups: TP_ROWS's group count). */
static int add_block_param(dt_model_state_t *m, uint32_t u, const char *name, int ndim, int64_t r,
                           int64_t c, int kind, double std, int how, int groups)
{
    const int64_t P = m->tp, k = m->tp_rank;
    int64_t d0 = r, d1 = c;
    dt_param_block_t b[DT_PARAM_MAX_BLOCKS];
    memset(b, 0, sizeof b);
    uint32_t nb = 0;
    if (how == TP_ROWS) { /* share k of each of `groups` groups of rows */
        const int64_t gsz = r / groups, part = gsz / P;
        for (int j = 0; j < groups; j++) {
            b[j].start[0] = j * gsz + k * part;
            b[j].size[0] = part;
            b[j].size[1] = ndim > 1 ? c : 0;
        }
        nb = (uint32_t)groups;
        d0 = r / P;
    } else if (how == TP_COLS) { /* share k of the columns */
        b[0].start[1] = k * (c / P);
        b[0].size[0] = r;
        b[0].size[1] = c / P;
        nb = 1;
        d1 = c / P;
    }
    int rc = dt_model_add_param(m, u, name, ndim, d0, d1, kind, std);
    return rc ? rc : dt_model_part(m, u, r, c, nb, b);
}

static int gpt2_create(dt_model_state_t *m)
{
    gpt2_t *g = calloc(1, sizeof *g);
    if (!g)
        return m->svc->set_error(DT_ERR_NOMEM, "model: out of memory");
    m->arch_state = g;
    int rc = read_shape(m, &g->s);
    if (rc)
        return rc;
    const int64_t L = g->s.n_layer, C = g->s.n_embd, V = g->s.vocab_size, maxT = g->s.context;
    const int64_t P = m->tp, k = m->tp_rank;
    /* tensor parallelism: heads (so n_embd and the MLP width) split P
     * ways; the vocabulary in P near-equal ranges, nothing padded */
    if (g->s.n_head % P != 0)
        return m->svc->set_error(DT_ERR_CONFIG,
                                 "%s: [parallel] tensor = %lld does not divide [model] "
                                 "n_head = %lld: attention heads are split across the "
                                 "tensor group",
                                 dt_model_cfg_name(m), (long long)P, (long long)g->s.n_head);
    if (V < P)
        return m->svc->set_error(DT_ERR_CONFIG,
                                 "%s: [parallel] tensor = %lld exceeds [model] vocab_size = %lld: "
                                 "the vocabulary is split across the tensor group",
                                 dt_model_cfg_name(m), (long long)P, (long long)V);
    g->ca = C / P;
    g->nha = g->s.n_head / P;
    g->hid = 4 * C / P;
    m->vocab_local = V / P + (k < V % P);
    m->vocab_first = k * (V / P) + (k < V % P ? k : V % P);
    dt_model_add_key(m, "n_layer", L);
    dt_model_add_key(m, "n_head", g->s.n_head);
    dt_model_add_key(m, "n_embd", C);
    dt_model_add_key(m, "vocab_size", V);
    dt_model_add_key(m, "context", maxT);
    m->info->vocab_size = V;
    m->info->context = maxT;
    m->info->boundary_width = C;
    m->info->tied_embedding = 1;

    const dt_param_block_t wte_part = {.start = {m->vocab_first, 0},
                                       .size = {m->vocab_local, C}};
    if ((rc = dt_model_alloc_units(m, (uint32_t)L + 2)) ||
        (rc = dt_model_name_unit(m, 0, "embedding")) ||
        (rc = dt_model_add_param(m, 0, "wte.weight", 2, m->vocab_local, C, DT_TENSOR_EMBED,
                                 0.02)) ||
        (rc = dt_model_part(m, 0, V, C, 1, &wte_part)) ||
        (rc = dt_model_add_param(m, 0, "wpe.weight", 2, maxT, C, DT_TENSOR_EMBED, 0.02)) ||
        (rc = dt_model_part(m, 0, maxT, C, 0, NULL)))
        return rc;
    /* GPT-2's scaled init of the projections into the residual stream */
    const double resid_std = 0.02 / sqrt(2.0 * (double)L);
    static const struct {
        const char *suffix;
        int ndim;
        int64_t r, c; /* multiples of C (c == 0: 1-D) */
        int kind;
        int resid;
        int how, groups; /* the tensor-parallel layout */
    } t[NBLOCK] = {
        {"ln_1.weight", 1, 1, 0, DT_TENSOR_NORM, 0, TP_WHOLE, 0},
        {"ln_1.bias", 1, 1, 0, DT_TENSOR_BIAS, 0, TP_WHOLE, 0},
        {"attn.c_attn.weight", 2, 3, 1, DT_TENSOR_MATRIX, 0, TP_ROWS, 3},
        {"attn.c_attn.bias", 1, 3, 0, DT_TENSOR_BIAS, 0, TP_ROWS, 3},
        {"attn.c_proj.weight", 2, 1, 1, DT_TENSOR_MATRIX, 1, TP_COLS, 0},
        {"attn.c_proj.bias", 1, 1, 0, DT_TENSOR_BIAS, 0, TP_WHOLE, 0},
        {"ln_2.weight", 1, 1, 0, DT_TENSOR_NORM, 0, TP_WHOLE, 0},
        {"ln_2.bias", 1, 1, 0, DT_TENSOR_BIAS, 0, TP_WHOLE, 0},
        {"mlp.c_fc.weight", 2, 4, 1, DT_TENSOR_MATRIX, 0, TP_ROWS, 1},
        {"mlp.c_fc.bias", 1, 4, 0, DT_TENSOR_BIAS, 0, TP_ROWS, 1},
        {"mlp.c_proj.weight", 2, 1, 4, DT_TENSOR_MATRIX, 1, TP_COLS, 0},
        {"mlp.c_proj.bias", 1, 1, 0, DT_TENSOR_BIAS, 0, TP_WHOLE, 0},
    };
    for (int64_t l = 0; l < L; l++) {
        const uint32_t u = (uint32_t)l + 1;
        char nm[96];
        snprintf(nm, sizeof nm, "block.%lld", (long long)l);
        if ((rc = dt_model_name_unit(m, u, nm)))
            return rc;
        for (int j = 0; j < NBLOCK; j++) {
            snprintf(nm, sizeof nm, "h.%lld.%s", (long long)l, t[j].suffix);
            if ((rc = add_block_param(m, u, nm, t[j].ndim, t[j].r * C, t[j].c * C, t[j].kind,
                                      t[j].resid ? resid_std : 0.02, t[j].how, t[j].groups)))
                return rc;
        }
    }
    const uint32_t head = (uint32_t)L + 1;
    if ((rc = dt_model_name_unit(m, head, "head")) ||
        (rc = dt_model_add_param(m, head, "ln_f.weight", 1, C, 0, DT_TENSOR_NORM, 0)) ||
        (rc = dt_model_part(m, head, C, 0, 0, NULL)) ||
        (rc = dt_model_add_param(m, head, "ln_f.bias", 1, C, 0, DT_TENSOR_BIAS, 0)) ||
        (rc = dt_model_part(m, head, C, 0, 0, NULL)))
        return rc;
    return DT_OK;
}

static void gpt2_free(dt_model_state_t *m)
{
    gpt2_t *g = G(m);
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

/* ---- activations ---- */

/* The bytes of attention's saved state for B x T, as the device sizes it
 * (the one query both the plan and the allocation use). */
static int attn_state_bytes(const dt_model_state_t *m, int64_t B, int64_t T, uint64_t *out)
{
    const gpt2_t *g = G(m);
    int rc = m->kern->attention_state_bytes(B, T, g->ca, g->nha, m->adtype, out);
    if (rc)
        return m->svc->set_error(rc,
                                 "model: device '%s' refused attention_state_bytes for B "
                                 "%lld, T %lld, C %lld, NH %lld, %s activations (%s)",
                                 m->dev_name, (long long)B, (long long)T, (long long)g->ca,
                                 (long long)g->nha, dt_dtype_name(m->adtype), dt_status_name(rc));
    return DT_OK;
}

/* Bytes of a block's kept activations (alloc_block's sizes), with this
 * rank's attention width CA and MLP width H (C and 4C but under tensor
 * parallelism): ln1, res2, ln2 (B,T,C), qkv (B,T,3CA), atty (B,T,CA),
 * fch, fch_gelu (B,T,H) of `es` bytes (15 (B,T,C) at tp 1), the norms'
 * mean and rstd 4 (B,T) f32, and attention's saved state. */
static double block_bytes(double B, double T, double C, double CA, double H, double es,
                          uint64_t att_state)
{
    return es * B * T * (3.0 * C + 4.0 * CA + 2.0 * H) + 4.0 * 4.0 * B * T + (double)att_state;
}

static int alloc_block(dt_model_state_t *m, const dt_model_ctx_t *ctx, block_acts_t *a)
{
    const int64_t BT = m->B * m->T, C = G(m)->s.n_embd, CA = G(m)->ca, H = G(m)->hid;
    const size_t es = dt_model_act_size(m);
    uint64_t att_state;
    int rc;
    if ((rc = attn_state_bytes(m, m->B, m->T, &att_state)) ||
        (rc = dt_model_dalloc(m, ctx, BT * C, es, &a->ln1)) ||
        (rc = dt_model_dalloc(m, ctx, BT, 4, &a->ln1_mean)) ||
        (rc = dt_model_dalloc(m, ctx, BT, 4, &a->ln1_rstd)) ||
        (rc = dt_model_dalloc(m, ctx, BT * 3 * CA, es, &a->qkv)) ||
        (rc = dt_model_dalloc(m, ctx, BT * CA, es, &a->atty)) ||
        (rc = dt_model_dalloc(m, ctx, (int64_t)att_state, 1, &a->att_state)) ||
        (rc = dt_model_dalloc(m, ctx, BT * C, es, &a->res2)) ||
        (rc = dt_model_dalloc(m, ctx, BT * C, es, &a->ln2)) ||
        (rc = dt_model_dalloc(m, ctx, BT, 4, &a->ln2_mean)) ||
        (rc = dt_model_dalloc(m, ctx, BT, 4, &a->ln2_rstd)) ||
        (rc = dt_model_dalloc(m, ctx, BT * H, es, &a->fch)) ||
        (rc = dt_model_dalloc(m, ctx, BT * H, es, &a->fch_gelu)))
        return rc;
    a->attproj = G(m)->attproj;
    a->fcproj = G(m)->fcproj;
    return DT_OK;
}

/* Unit u keeps its output: x[0] for the embedding, x[l+1] for block l
 * (the next unit's input, read by its backward); a block not recomputed
 * also keeps its intermediates; the head keeps ln_f's output and
 * statistics and the probabilities (the loss backward reads them).  All
 * else is workspace. */
static int gpt2_act_bytes(const dt_model_state_t *m, int64_t B_, int64_t T_, double *unit,
                          double *ws)
{
    const gpt2_t *g = G(m);
    const double B = (double)B_, T = (double)T_, BT = B * T, C = (double)g->s.n_embd,
                 CA = (double)g->ca, H = (double)g->hid, V = (double)m->vocab_local,
                 es = (double)dt_model_act_size(m);
    const int64_t L = g->s.n_layer;
    uint64_t att_state;
    int rc = attn_state_bytes(m, B_, T_, &att_state);
    if (rc)
        return rc;
    const double block = block_bytes(B, T, C, CA, H, es, att_state);
    int any_recompute = 0;
    /* under a pipeline stage (dt_model_keeps) a unit outside it keeps
     * nothing, but the one before it its output x, the stage's input */
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
        unit[L + 1] += es * (BT * C + BT * V) + 4.0 * 2.0 * BT;
    /* recompute scratch, the shared projections, logits and (f32) losses,
     * and the gradient scratch: dx dbuf_c dbuf_c2 (C), dqkv (3CA), dfch
     * dfch_gelu (H), dlogits (V: this rank's vocabulary); the logits,
     * losses and dlogits only where the head runs, and there under tensor
     * parallelism the cross-entropy's (3, B*T) f32 row state */
    *ws += (any_recompute ? block : 0.0) + es * 2.0 * BT * C +
           es * BT * (3.0 * C + 3.0 * CA + 2.0 * H) +
           (head ? es * 2.0 * BT * V + 4.0 * BT + (m->tp > 1 ? 12.0 * BT : 0.0) : 0.0);
    return DT_OK;
}

/* Slot s's kept activations: x[l] for every unit that keeps its output,
 * the blocks not recomputed, the head's ln_f and probabilities. */
static int alloc_slot(dt_model_state_t *m, const dt_model_ctx_t *ctx, gpt2_slot_t *s)
{
    const gpt2_t *g = G(m);
    const int64_t L = g->s.n_layer, C = g->s.n_embd, V = m->vocab_local, BT = m->B * m->T;
    const uint32_t head = (uint32_t)L + 1;
    const size_t es = dt_model_act_size(m);
    s->x = calloc((size_t)L + 1, sizeof *s->x);
    s->acts = calloc((size_t)L, sizeof *s->acts);
    if (!s->x || !s->acts)
        return m->svc->set_error(DT_ERR_NOMEM, "model: out of memory");
    int rc;
    for (int64_t l = 0; l <= L; l++) {
        m->act_owner = (uint32_t)l; /* x[l] is unit l's output */
        if (dt_model_keeps(m, (uint32_t)l) != DT_KEEP_NONE &&
            (rc = dt_model_dalloc(m, ctx, BT * C, es, &s->x[l])))
            return rc;
    }
    for (int64_t l = 0; l < L; l++) {
        if (dt_model_keeps(m, (uint32_t)l + 1) != DT_KEEP_ALL || dt_model_recomputes(m, l))
            continue; /* another stage's block, or one recomputed into scratch */
        m->act_owner = (uint32_t)l + 1;
        if ((rc = alloc_block(m, ctx, &s->acts[l])))
            return rc;
    }
    m->act_owner = head;
    if (dt_model_keeps(m, head) == DT_KEEP_ALL &&
        ((rc = dt_model_dalloc(m, ctx, BT * C, es, &s->lnf)) ||
         (rc = dt_model_dalloc(m, ctx, BT, 4, &s->lnf_mean)) ||
         (rc = dt_model_dalloc(m, ctx, BT, 4, &s->lnf_rstd)) ||
         (rc = dt_model_dalloc(m, ctx, BT * V, es, &s->probs))))
        return rc;
    return DT_OK;
}

static void gpt2_use_slot(dt_model_state_t *m, uint32_t i)
{
    gpt2_t *g = G(m);
    const gpt2_slot_t *s = &g->slots[i];
    g->x = s->x;
    g->acts = s->acts;
    g->lnf = s->lnf;
    g->lnf_mean = s->lnf_mean;
    g->lnf_rstd = s->lnf_rstd;
    m->probs = s->probs;
}

static int gpt2_alloc_acts(dt_model_state_t *m, const dt_model_ctx_t *ctx)
{
    gpt2_t *g = G(m);
    const int64_t L = g->s.n_layer, C = g->s.n_embd, V = m->vocab_local, BT = m->B * m->T,
                  CA = g->ca, H = g->hid;
    const uint32_t head = (uint32_t)L + 1;
    const size_t es = dt_model_act_size(m);
    g->slots = calloc(m->n_slots, sizeof *g->slots);
    if (!g->slots)
        return m->svc->set_error(DT_ERR_NOMEM, "model: out of memory");
    int rc;
    m->act_owner = DT_ACT_WORKSPACE;
    if ((rc = dt_model_dalloc(m, ctx, BT * C, es, &g->attproj)) ||
        (rc = dt_model_dalloc(m, ctx, BT * C, es, &g->fcproj)))
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
        (rc = dt_model_dalloc(m, ctx, BT * C, es, &g->dbuf_c2)) ||
        (rc = dt_model_dalloc(m, ctx, BT * 3 * CA, es, &g->dqkv)) ||
        (rc = dt_model_dalloc(m, ctx, BT * H, es, &g->dfch)) ||
        (rc = dt_model_dalloc(m, ctx, BT * H, es, &g->dfch_gelu)))
        return rc;
    return DT_OK;
}

static double gpt2_flops_per_token(const dt_model_state_t *m, int64_t T)
{
    /* 6 FLOPs per parameter per token (fwd 2 + bwd 4, the tied head counted
     * once through wte) plus attention's 6 * L * T * C (PaLM appendix B). */
    const gpt2_shape_t *s = &G(m)->s;
    double N = (double)param_count(s) - (double)s->context * (double)s->n_embd;
    return 6.0 * N + 6.0 * (double)s->n_layer * (double)T * (double)s->n_embd;
}

/* The all-reduces of one micro-batch through the units this rank keeps
 * (block_forward, block_backward, the embedding and the head below). */
static void gpt2_tp_comm(const dt_model_state_t *m, int64_t B, int64_t T, dt_model_tp_comm_t *out)
{
    const gpt2_t *g = G(m);
    const uint64_t BT = (uint64_t)(B * T), act = BT * (uint64_t)g->s.n_embd *
                                                  dt_model_act_size(m);
    const uint32_t L = (uint32_t)g->s.n_layer;
    if (dt_model_keeps(m, 0) == DT_KEEP_ALL) { /* the embedding's output */
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
    if (dt_model_keeps(m, L + 1) == DT_KEEP_ALL) { /* cross-entropy; ln_f's input gradient */
        out->fwd += 2;
        out->fwd_bytes += 3 * BT * sizeof(float);
        out->bwd++;
        out->bwd_bytes += act;
    }
}

/* gpt2_flops_per_token unit by unit: the embedding's lookups count 0 (and
 * wpe, as there, nothing), a block 6 per parameter and its attention's
 * 6 T C, the head 6 per ln_f parameter and the tied LM head's 6 V C. */
static void gpt2_unit_flops(const dt_model_state_t *m, int64_t T, double *out)
{
    const gpt2_shape_t *s = &G(m)->s;
    const double C = (double)s->n_embd, V = (double)s->vocab_size;
    const double block = (double)block_params((uint64_t)s->n_embd);
    const uint32_t L = (uint32_t)s->n_layer;
    out[0] = 0.0;
    for (uint32_t l = 0; l < L; l++)
        out[l + 1] = 6.0 * block + 6.0 * (double)T * C;
    out[L + 1] = 6.0 * (2.0 * C + V * C);
}

/* ---- forward / backward ---- */

#define K (m->kern)
#define D ctx->dev, ctx->stream

/* What dt_model_find_nonfinite calls each kernel output of block l:
 * "activation h.<l><tensor>", "<verb> h.<l><op>".  Attention's saved state
 * is not probed: its layout is the device's own, and a NaN in it reaches
 * the weighted values, which are. */
enum { P_LN1, P_QKV, P_ATTY, P_ATTPROJ, P_RES2, P_LN2, P_FCH, P_GELU, P_FCPROJ, P_OUT };
static const struct {
    const char *tensor, *verb, *op;
} block_probe[] = {
    [P_LN1] = {".ln_1 output", "the forward of", ".ln_1"},
    [P_QKV] = {".attn.c_attn output", "the forward of", ".attn.c_attn"},
    [P_ATTY] = {".attn weighted values", "the forward of", ".attn (causal softmax attention)"},
    [P_ATTPROJ] = {".attn output", "the forward of", ".attn.c_proj"},
    [P_RES2] = {" residual stream after attn", "the residual add of", ".attn"},
    [P_LN2] = {".ln_2 output", "the forward of", ".ln_2"},
    [P_FCH] = {".mlp.c_fc output", "the forward of", ".mlp.c_fc"},
    [P_GELU] = {".mlp.gelu output", "the forward of", ".mlp.gelu"},
    [P_FCPROJ] = {".mlp output", "the forward of", ".mlp.c_proj"},
    [P_OUT] = {" output (residual stream after the block)", "the residual add of", ".mlp"},
};

static int probe_block(dt_model_state_t *m, const dt_model_ctx_t *ctx, int64_t l, int which,
                       const void *x, int64_t n)
{
    if (!dt_model_probing(m))
        return DT_OK;
    char what[128], after[128];
    snprintf(what, sizeof what, "activation h.%lld%s", (long long)l, block_probe[which].tensor);
    snprintf(after, sizeof after, "%s h.%lld%s", block_probe[which].verb, (long long)l,
             block_probe[which].op);
    return dt_model_probe(m, ctx, what, (uint32_t)l + 1, after, x, m->adtype, (uint64_t)n);
}

/* Forward of block l with parameters `v`, input x, output `out`.  Under
 * tensor parallelism this rank runs its heads (qkv, atty: CA wide) and its
 * share of the MLP (H wide); each row-parallel projection gives a partial
 * sum, all-reduced over the tensor group (its bias added by rank 0 only),
 * so the residual stream is whole on every rank. */
static int block_forward(dt_model_state_t *m, const dt_model_ctx_t *ctx, int64_t l,
                         const dt_unit_view_t *v, const void *x, block_acts_t *a, void *out)
{
    const gpt2_t *g = G(m);
    const int64_t B = m->B, T = m->T, C = g->s.n_embd, CA = g->ca, NH = g->nha, H = g->hid,
                  BT = B * T;
    const int ad = m->adtype, wd = m->wdtype;
    const uint32_t u = (uint32_t)l + 1;
    const int bias = m->tp_rank == 0; /* the row-parallel biases' one rank */
    DT_TRY(K->layernorm_forward(D, a->ln1, a->ln1_mean, a->ln1_rstd, x, v->a[LN1W], v->a[LN1B],
                                ad, BT, C));
    DT_TRY(probe_block(m, ctx, l, P_LN1, a->ln1, BT * C));
    DT_TRY(K->matmul_forward(D, a->qkv, a->ln1, v->w[ATTW], v->a[ATTB], ad, wd, BT, C, 3 * CA));
    DT_TRY(probe_block(m, ctx, l, P_QKV, a->qkv, BT * 3 * CA));
    DT_TRY(K->attention_forward(D, a->atty, a->att_state, a->qkv, ad, B, T, CA, NH));
    DT_TRY(probe_block(m, ctx, l, P_ATTY, a->atty, BT * CA));
    DT_TRY(K->matmul_forward(D, a->attproj, a->atty, v->w[PROJW], bias ? v->a[PROJB] : NULL, ad,
                             wd, BT, CA, C));
    DT_TRY(dt_model_tp_row_forward(m, ctx, a->attproj, BT * C, "the attn output", u));
    DT_TRY(probe_block(m, ctx, l, P_ATTPROJ, a->attproj, BT * C));
    DT_TRY(K->residual_forward(D, a->res2, x, a->attproj, ad, BT * C));
    DT_TRY(probe_block(m, ctx, l, P_RES2, a->res2, BT * C));
    DT_TRY(K->layernorm_forward(D, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, v->a[LN2W],
                                v->a[LN2B], ad, BT, C));
    DT_TRY(probe_block(m, ctx, l, P_LN2, a->ln2, BT * C));
    DT_TRY(K->matmul_forward(D, a->fch, a->ln2, v->w[FCW], v->a[FCB], ad, wd, BT, C, H));
    DT_TRY(probe_block(m, ctx, l, P_FCH, a->fch, BT * H));
    DT_TRY(K->gelu_forward(D, a->fch_gelu, a->fch, ad, BT * H));
    DT_TRY(probe_block(m, ctx, l, P_GELU, a->fch_gelu, BT * H));
    DT_TRY(K->matmul_forward(D, a->fcproj, a->fch_gelu, v->w[FCPW], bias ? v->a[FCPB] : NULL, ad,
                             wd, BT, H, C));
    DT_TRY(dt_model_tp_row_forward(m, ctx, a->fcproj, BT * C, "the mlp output", u));
    DT_TRY(probe_block(m, ctx, l, P_FCPROJ, a->fcproj, BT * C));
    DT_TRY(K->residual_forward(D, out, a->res2, a->fcproj, ad, BT * C));
    DT_TRY(probe_block(m, ctx, l, P_OUT, out, BT * C));
    return DT_OK;
}

/* Backward of block l: g->dx holds d(out) on entry and d(x) on return;
 * `gr` is the unit's flat gradient (offsets as in the description).  Under
 * tensor parallelism each column-parallel layer's input gradient is a
 * partial sum, all-reduced before its LayerNorm's backward; the
 * replicated tensors' gradients (norms, row-parallel biases) come from
 * whole, identical inputs, so they are the same on every rank. */
static int block_backward(dt_model_state_t *m, const dt_model_ctx_t *ctx, int64_t l,
                          const dt_unit_view_t *v, float *gr, const uint64_t *o, const void *x,
                          const block_acts_t *a)
{
    gpt2_t *g = G(m);
    const int64_t B = m->B, T = m->T, C = g->s.n_embd, CA = g->ca, NH = g->nha, H = g->hid,
                  BT = B * T;
    const int ad = m->adtype, wd = m->wdtype;
    const uint64_t es = dt_model_act_size(m);
    const uint32_t u = (uint32_t)l + 1;
    void *dx = g->dx;
    /* fcproj: out = res2 + fcproj, so d(fcproj) = d(res2) partial = dx */
    DT_TRY(dt_model_zero(ctx, g->dfch_gelu, (uint64_t)BT * H * es));
    DT_TRY(K->matmul_backward(D, g->dfch_gelu, gr + o[FCPW], gr + o[FCPB], dx, a->fch_gelu,
                              v->w[FCPW], ad, wd, BT, H, C));
    DT_TRY(dt_model_zero(ctx, g->dfch, (uint64_t)BT * H * es));
    DT_TRY(K->gelu_backward(D, g->dfch, a->fch, g->dfch_gelu, ad, BT * H));
    DT_TRY(dt_model_column_backward(m, ctx, g->dbuf_c, gr + o[FCW], gr + o[FCB], g->dfch, a->ln2,
                                    v->w[FCW], BT, C, H, "the gradient of the ln_2 output", u));
    /* dx becomes d(res2): the residual path plus the ln_2 path */
    DT_TRY(K->layernorm_backward(D, dx, gr + o[LN2W], gr + o[LN2B], g->dbuf_c, a->res2,
                                 v->a[LN2W], a->ln2_mean, a->ln2_rstd, ad, BT, C));
    DT_TRY(dt_model_zero(ctx, g->dbuf_c2, (uint64_t)BT * CA * es));
    DT_TRY(K->matmul_backward(D, g->dbuf_c2, gr + o[PROJW], gr + o[PROJB], dx, a->atty,
                              v->w[PROJW], ad, wd, BT, CA, C));
    DT_TRY(dt_model_zero(ctx, g->dqkv, (uint64_t)BT * 3 * CA * es));
    DT_TRY(K->attention_backward(D, g->dqkv, g->dbuf_c2, a->qkv, a->atty, a->att_state, ad, B, T,
                                 CA, NH));
    DT_TRY(dt_model_column_backward(m, ctx, g->dbuf_c, gr + o[ATTW], gr + o[ATTB], g->dqkv, a->ln1,
                                    v->w[ATTW], BT, C, 3 * CA, "the gradient of the ln_1 output",
                                    u));
    /* dx becomes d(x): the residual path plus the ln_1 path */
    DT_TRY(K->layernorm_backward(D, dx, gr + o[LN1W], gr + o[LN1B], g->dbuf_c, x, v->a[LN1W],
                                 a->ln1_mean, a->ln1_rstd, ad, BT, C));
    return DT_OK;
}

/* Forward of units [first, end) (a pipeline stage; [0, L + 2) is the whole
 * model).  Boundary u (between unit u - 1 and unit u) is the residual
 * stream x[u - 1]: a stage not starting at the embedding copies `in` there,
 * one not ending at the head copies its last x to `out`. */
static int gpt2_stage_forward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h,
                              uint32_t first, uint32_t end, const void *in, void *out)
{
    gpt2_t *g = G(m);
    const int64_t B = m->B, T = m->T, C = g->s.n_embd, V = m->vocab_local, BT = B * T;
    const uint32_t L = (uint32_t)g->s.n_layer, head = L + 1;
    const int ad = m->adtype;
    const uint64_t xbytes = (uint64_t)(BT * C) * dt_model_act_size(m);
    dt_unit_buffers_t b0 = {.struct_size = sizeof b0}, bl = {.struct_size = sizeof bl},
                         bh = {.struct_size = sizeof bh};
    dt_unit_view_t v0, vl, vh;

    if (first == 0) {
        DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, 0, 0, &b0));
        DT_TRY_UNIT(dt_model_view(m, ctx, 0, b0.params, 1, &v0), "forward", 0);
        if (m->tp == 1)
            DT_TRY_UNIT(K->embedding_forward(D, g->x[0], m->tokens, v0.a[WTE], v0.a[WPE], ad, B,
                                             T, C),
                        "forward", 0);
        else /* this rank's vocabulary rows (and wpe once), summed over the group */
            DT_TRY_UNIT(K->vocab_embedding_forward(D, g->x[0], m->tokens, v0.a[WTE],
                                                   m->tp_rank == 0 ? v0.a[WPE] : NULL, ad, B, T,
                                                   C, m->vocab_first, m->vocab_local),
                        "forward", 0);
        DT_TRY(dt_model_tp_embedding(m, ctx, g->x[0], BT * C, "the embedding output", 0));
        DT_TRY(dt_model_probe(m, ctx, "activation embedding output", 0,
                              "the forward of wte.weight + wpe.weight", g->x[0], ad,
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
    if (end <= head) { /* the stage's output: boundary `end` (unless a recompute) */
        if (out)
            DT_TRY_UNIT(dt_device_ops(ctx->dev)->memcpy_async(ctx->dev, out, g->x[end - 1], xbytes,
                                                   DT_COPY_D2D, ctx->stream),
                        "forward (the stage's output)", end - 1);
        return DT_OK;
    }
    /* the head, and unit 0 again for the tied LM head (matmul only) */
    DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, head, 0, &bh));
    DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, 0, 0, &b0));
    DT_TRY_UNIT(dt_model_view(m, ctx, head, bh.params, 1, &vh), "forward", head);
    DT_TRY_UNIT(dt_model_view(m, ctx, 0, b0.params, 0, &v0), "forward", head);
    DT_TRY_UNIT(K->layernorm_forward(D, g->lnf, g->lnf_mean, g->lnf_rstd, g->x[L], vh.a[LNFW],
                                     vh.a[LNFB], ad, BT, C),
                "forward", head);
    DT_TRY(dt_model_probe(m, ctx, "activation ln_f output", head, "the forward of ln_f", g->lnf,
                          ad, (uint64_t)(BT * C)));
    DT_TRY_UNIT(K->matmul_forward(D, m->logits, g->lnf, v0.w[WTE], NULL, ad, m->wdtype, BT, C,
                                  V),
                "forward", head);
    DT_TRY(dt_model_probe(m, ctx, "logits", head,
                          "the forward of the LM head (ln_f output @ wte.weight^T)", m->logits,
                          ad, (uint64_t)(BT * V)));
    DT_TRY(dt_model_loss_forward(m, ctx, head));
    DT_TRY(dt_model_hook(m, ctx, DT_POST_FORWARD, h, 0, 0, NULL));
    DT_TRY(dt_model_hook(m, ctx, DT_POST_FORWARD, h, head, 0, NULL));
    return DT_OK;
}

/* Backward of units [first, end), after their forward: from the loss when
 * the stage ends at the head, else from `dout` (the gradient of boundary
 * `end`); a stage not starting at the embedding leaves the gradient of its
 * input (boundary `first`) in `din`. */
static int gpt2_stage_backward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h,
                               uint32_t first, uint32_t end, const void *dout, void *din,
                               float loss_scale)
{
    gpt2_t *g = G(m);
    const int64_t B = m->B, T = m->T, C = g->s.n_embd, V = m->vocab_local, BT = B * T;
    const uint32_t L = (uint32_t)g->s.n_layer, head = L + 1;
    const int ad = m->adtype;
    const uint64_t es = dt_model_act_size(m), xbytes = (uint64_t)(BT * C) * es;
    dt_unit_buffers_t b0 = {.struct_size = sizeof b0}, bl = {.struct_size = sizeof bl},
                         bh = {.struct_size = sizeof bh};
    dt_unit_view_t v0, vl, vh;

    if (end > head) {
        /* head first (it also feeds wte's gradient), then the blocks, then
         * the embedding, whose post_backward ends unit 0's gradient */
        DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, head, 0, &bh));
        DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, 0, 0, &b0));
        DT_TRY_UNIT(dt_model_view(m, ctx, head, bh.params, 1, &vh), "backward", head);
        DT_TRY_UNIT(dt_model_view(m, ctx, 0, b0.params, 0, &v0), "backward", head);
        DT_TRY(dt_model_loss_backward(m, ctx, head, g->dlogits, loss_scale));
        /* the LM head is column-parallel over the vocabulary */
        DT_TRY_UNIT(dt_model_column_backward(m, ctx, g->dbuf_c, b0.grads, NULL, g->dlogits, g->lnf,
                                             v0.w[WTE], BT, C, V, "the gradient of the ln_f output",
                                             head), "backward", head);
        /* on a stage without the embedding this is unit 0's last use */
        DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, 0, first > 0, NULL));
        DT_TRY_UNIT(dt_model_zero(ctx, g->dx, (uint64_t)BT * C * es), "backward", head);
        DT_TRY_UNIT(K->layernorm_backward(D, g->dx, bh.grads, bh.grads + C, g->dbuf_c, g->x[L],
                                          vh.a[LNFW], g->lnf_mean, g->lnf_rstd, ad, BT, C),
                    "backward", head);
        DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, head, 1, NULL));
    } else {
        DT_TRY_UNIT(dt_device_ops(ctx->dev)->memcpy_async(ctx->dev, g->dx, dout, xbytes,
                                                          DT_COPY_D2D, ctx->stream),
                    "backward (the stage's output gradient)", end - 1);
    }
    uint64_t o[NBLOCK];
    const uint32_t lo = first > 0 ? first - 1 : 0; /* first block of the stage */
    for (uint32_t l = end - 1 < L ? end - 1 : L; l-- > lo;) {
        const dt_unit_desc_t *ud = &m->desc->units[l + 1];
        for (int k = 0; k < NBLOCK; k++)
            o[k] = ud->params[k].offset;
        DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, l + 1, 0, &bl));
        DT_TRY_UNIT(dt_model_view(m, ctx, l + 1, bl.params, 1, &vl), "backward", l + 1);
        if (dt_model_recomputes(m, l)) /* recompute this block's activations into scratch */
            DT_TRY_UNIT(block_forward(m, ctx, l, &vl, g->x[l], &g->scratch, g->dbuf_c2),
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
    float *dwpe = b0.grads + m->desc->units[0].params[WPE].offset;
    if (m->tp == 1)
        DT_TRY_UNIT(K->embedding_backward(D, b0.grads, dwpe, g->dx, m->tokens, ad, B, T, C),
                    "backward", 0);
    else /* wpe whole on every rank, from the same (whole) gradient */
        DT_TRY_UNIT(K->vocab_embedding_backward(D, b0.grads, dwpe, g->dx, m->tokens, ad, B, T, C,
                                                m->vocab_first, m->vocab_local),
                    "backward", 0);
    DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, 0, 1, NULL));
    return DT_OK;
}

/* The whole model: the one stage [0, L + 2). */
static int gpt2_forward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h)
{
    return gpt2_stage_forward(m, ctx, h, 0, m->desc->n_units, NULL, NULL);
}

static int gpt2_backward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h,
                         float loss_scale)
{
    return gpt2_stage_backward(m, ctx, h, 0, m->desc->n_units, NULL, NULL, loss_scale);
}

/* Beyond the core set: norms, attention, residual adds. */
static int gpt2_need_kernels(const dt_model_state_t *m)
{
    DT_MODEL_NEED(m, layernorm_forward);
    DT_MODEL_NEED(m, layernorm_backward);
    DT_MODEL_NEED(m, attention_state_bytes);
    DT_MODEL_NEED(m, attention_forward);
    DT_MODEL_NEED(m, attention_backward);
    DT_MODEL_NEED(m, residual_forward);
    if (m->tp > 1) {
        DT_MODEL_NEED(m, vocab_embedding_forward);
        DT_MODEL_NEED(m, vocab_embedding_backward);
        DT_MODEL_NEED(m, vocab_xent_forward);
        DT_MODEL_NEED(m, vocab_xent_backward);
    }
    return DT_OK;
}

static const dt_model_ops_v1_t gpt2_ops = {
    .info = DT_PLUGIN_INFO_NOKEYS(MODEL, dt_model_ops_v1_t, "gpt2", "1.0.0",
                                  "the GPT-2 family ([model] preset, n_layer, n_head, n_embd, "
                                  "context): transformer blocks, LM head tied to wte, tensor "
                                  "and pipeline parallel, KV-cache generation"),
    .create = gpt2_create,
    .act_bytes = gpt2_act_bytes,
    .alloc_acts = gpt2_alloc_acts,
    .forward = gpt2_forward,
    .backward = gpt2_backward,
    .flops_per_token = gpt2_flops_per_token,
    .stage_forward = gpt2_stage_forward,
    .stage_backward = gpt2_stage_backward,
    .use_slot = gpt2_use_slot,
    .unit_flops = gpt2_unit_flops,
    .tp_comm = gpt2_tp_comm,
    .free = gpt2_free,
    .need_kernels = gpt2_need_kernels,
    .preset = gpt2_preset,
    .decoder_create = gpt2_decoder_create,
    .decoder_step = gpt2_decoder_step,
    .decoder_len = gpt2_decoder_len,
    .decoder_reset = gpt2_decoder_reset,
    .decoder_free = gpt2_decoder_free,
    .hf_architectures = gpt2_hf_architectures,
    .hf_config_read = gpt2_hf_config_read,
    .hf_config_write = gpt2_hf_config_write,
    .hf_export_name = gpt2_hf_export_name,
    .hf_import_name = gpt2_hf_import_name,
};

DT_PLUGIN_ENTRY(model, 1, dt_model_ops_v1_t, &gpt2_ops)
