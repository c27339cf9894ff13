/*
 * core/engine/gpt2.c - the GPT-2 family as units: embedding, one unit per
 * transformer block, head (final layernorm; the LM head is tied to the
 * embedding's wte and re-uses unit 0).  Forward and backward follow llm.c's
 * train_gpt2.c, built from the device kernel table, with per-block
 * activation checkpointing (recompute the block in backward).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model.h"
#include "util/error.h"

enum { CKPT_NONE = 0, CKPT_ALL = 1, CKPT_EVERY = 2 };

/* Offsets (elements) of a block's tensors in its flat buffer. */
enum { LN1W, LN1B, ATTW, ATTB, PROJW, PROJB, LN2W, LN2B, FCW, FCB, FCPW, FCPB, NBLOCK };

/* Activations one block keeps for backward (or recomputes). */
typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C) (B,T) (B,T) */
    float *qkv;                       /* (B,T,3C) */
    float *atty;                      /* (B,T,C) */
    float *att;                       /* (B,NH,T,T) */
    float *attproj;                   /* (B,T,C) */
    float *res2;                      /* (B,T,C) */
    float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C) (B,T) (B,T) */
    float *fch, *fch_gelu;            /* (B,T,4C) */
    float *fcproj;                    /* (B,T,C) */
} block_acts_t;

struct dt_model {
    dt_model_desc_v1_t desc;
    dt_gpt2_shape_t s;
    int ckpt_mode;
    int64_t ckpt_every;
    uint64_t boff[NBLOCK]; /* offsets inside a block unit */
    /* activations */
    int64_t B, T;
    float **x;              /* L+1 residual streams (B,T,C): x[0] embeddings */
    block_acts_t *acts;     /* per block; checkpointed blocks share `scratch` */
    block_acts_t scratch;   /* for checkpointed blocks and recompute */
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *probs, *losses;
    /* gradient scratch */
    float *dx, *dbuf_c, *dbuf_c2, *dqkv, *dfch, *dfch_gelu, *dlogits;
    int32_t *tokens, *targets; /* device copies (B,T) */
    float *host_losses;        /* (B,T) host */
    void **allocs;
    size_t n_allocs, cap_allocs;
};

static int is_ckpt(const dt_model_t *m, int64_t l)
{
    if (m->ckpt_mode == CKPT_ALL)
        return 1;
    if (m->ckpt_mode == CKPT_EVERY)
        return (l % m->ckpt_every) == 0;
    return 0;
}

uint64_t dt_gpt2_param_count(const dt_gpt2_shape_t *s)
{
    uint64_t C = (uint64_t)s->n_embd;
    uint64_t block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C +
                     4 * C * C + C;
    return (uint64_t)s->vocab_size * C + (uint64_t)s->context * C +
           (uint64_t)s->n_layer * block + 2 * C;
}

/* ---- description ---- */

static const struct {
    const char *name;
    dt_gpt2_shape_t s;
} presets[] = {
    {"gpt2-tiny", {2, 4, 128, 256, 64}},
    {"gpt2-small", {4, 4, 256, 256, 128}},
    {"gpt2-124m", {12, 12, 768, 50257, 1024}},
    {"gpt2-350m", {24, 16, 1024, 50257, 1024}},
    {"gpt2-774m", {36, 20, 1280, 50257, 1024}},
    {"gpt2-1558m", {48, 25, 1600, 50257, 1024}},
};

static int read_shape(dt_config_t *cfg, dt_gpt2_shape_t *s)
{
    const char *preset;
    int rc = dt_config_get_string(cfg, "model.preset", &preset);
    if (rc)
        return rc;
    static const char *keys[] = {"model.n_layer", "model.n_head", "model.n_embd",
                                 "model.vocab_size", "model.context"};
    int64_t *dst[] = {&s->n_layer, &s->n_head, &s->n_embd, &s->vocab_size, &s->context};
    const dt_gpt2_shape_t *p = NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(preset, presets[i].name) == 0)
            p = &presets[i].s;
    const int64_t pv[] = {p ? p->n_layer : 0, p ? p->n_head : 0, p ? p->n_embd : 0,
                          p ? p->vocab_size : 0, p ? p->context : 0};
    for (int i = 0; i < 5; i++) {
        if ((rc = dt_config_get_int(cfg, keys[i], dst[i])))
            return rc;
        /* A preset supplies every shape key the user did not write. */
        if (p && dt_config_origin(cfg, keys[i]) == DT_ORIGIN_DEFAULT) {
            *dst[i] = pv[i];
            dt_config_set_int(cfg, keys[i], pv[i], DT_ORIGIN_DERIVED);
        }
    }
    if (s->n_embd % s->n_head != 0)
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: [model] n_embd = %lld is not divisible by n_head = %lld",
                          dt_config_path(cfg), (long long)s->n_embd, (long long)s->n_head);
    if (s->vocab_size > 65536)
        /* token files hold uint16 tokens */
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: [model] vocab_size = %lld exceeds 65536, the largest "
                          "vocabulary uint16 token files can address",
                          dt_config_path(cfg), (long long)s->vocab_size);
    return DT_OK;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static int add_param(dt_unit_desc_v1_t *u, const char *name, int ndim, int64_t d0, int64_t d1,
                     uint32_t flags)
{
    dt_param_desc_v1_t *p = &u->params[u->n_params++];
    memset(p, 0, sizeof *p);
    if (!(p->name = xstrdup(name)))
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    p->offset = u->numel;
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 0;
    p->numel = (uint64_t)d0 * (uint64_t)(ndim > 1 ? d1 : 1);
    p->flags = flags;
    p->split_dim = -1;
    u->numel += p->numel;
    return DT_OK;
}

int dt_model_create(dt_config_t *cfg, dt_model_t **out)
{
    const char *arch, *dtype, *ckpt;
    int rc;
    if ((rc = dt_config_get_string(cfg, "model.arch", &arch)) ||
        (rc = dt_config_get_string(cfg, "model.dtype", &dtype)) ||
        (rc = dt_config_get_string(cfg, "model.activation_checkpointing", &ckpt)))
        return rc;
    if (strcmp(arch, "gpt2") != 0)
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: [model] arch = \"%s\" is not built yet; this dtrain trains "
                          "arch = \"gpt2\"",
                          dt_config_path(cfg), arch);
    if (strcmp(dtype, "fp32") != 0)
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: [model] dtype = \"%s\" is not supported by the training "
                          "engine yet (fp32 only)",
                          dt_config_path(cfg), dtype);
    dt_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    if ((rc = read_shape(cfg, &m->s)))
        goto fail;
    m->ckpt_mode = strcmp(ckpt, "all") == 0 ? CKPT_ALL : strcmp(ckpt, "every") == 0 ? CKPT_EVERY
                                                                                   : CKPT_NONE;
    if ((rc = dt_config_get_int(cfg, "model.checkpoint_every", &m->ckpt_every)))
        goto fail;

    const int64_t L = m->s.n_layer, C = m->s.n_embd, V = m->s.vocab_size, maxT = m->s.context;
    m->desc.arch = "gpt2";
    m->desc.n_units = (uint32_t)L + 2;
    m->desc.param_dtype = DT_F32;
    m->desc.units = calloc(m->desc.n_units, sizeof *m->desc.units);
    if (!m->desc.units) {
        rc = dt_err_set(DT_ERR_NOMEM, "model: out of memory");
        goto fail;
    }
    for (uint32_t i = 0; i < m->desc.n_units; i++) {
        dt_unit_desc_v1_t *u = &m->desc.units[i];
        u->index = i;
        u->params = calloc(NBLOCK, sizeof *u->params);
        if (!u->params) {
            rc = dt_err_set(DT_ERR_NOMEM, "model: out of memory");
            goto fail;
        }
    }
    dt_unit_desc_v1_t *u = &m->desc.units[0];
    u->name = xstrdup("embedding");
    if ((rc = add_param(u, "wte.weight", 2, V, C, 0)) ||
        (rc = add_param(u, "wpe.weight", 2, maxT, C, 0)))
        goto fail;
    for (int64_t l = 0; l < L; l++) {
        char nm[96];
        u = &m->desc.units[l + 1];
        snprintf(nm, sizeof nm, "block.%lld", (long long)l);
        u->name = xstrdup(nm);
        static const struct {
            const char *suffix;
            int ndim;
            int64_t r, c; /* multiples of C (c == 0: 1-D) */
            uint32_t flags;
        } t[NBLOCK] = {
            {"ln_1.weight", 1, 1, 0, DT_PARAM_NO_DECAY},
            {"ln_1.bias", 1, 1, 0, DT_PARAM_NO_DECAY},
            {"attn.c_attn.weight", 2, 3, 1, 0},
            {"attn.c_attn.bias", 1, 3, 0, DT_PARAM_NO_DECAY},
            {"attn.c_proj.weight", 2, 1, 1, 0},
            {"attn.c_proj.bias", 1, 1, 0, DT_PARAM_NO_DECAY},
            {"ln_2.weight", 1, 1, 0, DT_PARAM_NO_DECAY},
            {"ln_2.bias", 1, 1, 0, DT_PARAM_NO_DECAY},
            {"mlp.c_fc.weight", 2, 4, 1, 0},
            {"mlp.c_fc.bias", 1, 4, 0, DT_PARAM_NO_DECAY},
            {"mlp.c_proj.weight", 2, 1, 4, 0},
            {"mlp.c_proj.bias", 1, 1, 0, DT_PARAM_NO_DECAY},
        };
        for (int k = 0; k < NBLOCK; k++) {
            snprintf(nm, sizeof nm, "h.%lld.%s", (long long)l, t[k].suffix);
            if ((rc = add_param(u, nm, t[k].ndim, t[k].r * C, t[k].c * C, t[k].flags)))
                goto fail;
        }
    }
    u = &m->desc.units[L + 1];
    u->name = xstrdup("head");
    if ((rc = add_param(u, "ln_f.weight", 1, C, 0, DT_PARAM_NO_DECAY)) ||
        (rc = add_param(u, "ln_f.bias", 1, C, 0, DT_PARAM_NO_DECAY)))
        goto fail;
    for (uint32_t i = 0; i < m->desc.n_units; i++) {
        if (!m->desc.units[i].name) {
            rc = dt_err_set(DT_ERR_NOMEM, "model: out of memory");
            goto fail;
        }
        m->desc.numel += m->desc.units[i].numel;
    }
    if (L > 0)
        for (int k = 0; k < NBLOCK; k++)
            m->boff[k] = m->desc.units[1].params[k].offset;
    *out = m;
    return DT_OK;
fail:
    dt_model_free(m, NULL);
    return rc;
}

dt_model_desc_v1_t *dt_model_desc(dt_model_t *m) { return &m->desc; }
const dt_gpt2_shape_t *dt_model_gpt2_shape(const dt_model_t *m) { return &m->s; }

void dt_model_free(dt_model_t *m, const dt_model_ctx_t *ctx)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_allocs; i++)
        if (ctx)
            ctx->dev_ops->free(ctx->dev, m->allocs[i]);
    free(m->allocs);
    free(m->host_losses);
    free(m->x);
    free(m->acts);
    for (uint32_t i = 0; m->desc.units && i < m->desc.n_units; i++) {
        dt_unit_desc_v1_t *u = &m->desc.units[i];
        for (uint32_t k = 0; k < u->n_params; k++)
            free((char *)u->params[k].name);
        free(u->params);
        free((char *)u->name);
    }
    free(m->desc.units);
    free(m);
}

/* ---- deterministic initialisation ---- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(uint64_t seed, const char *s)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

int dt_model_init_unit(const dt_model_t *m, uint32_t unit, uint64_t seed, float *out)
{
    const dt_unit_desc_v1_t *u = &m->desc.units[unit];
    const double resid_std = 0.02 / sqrt(2.0 * (double)m->s.n_layer);
    for (uint32_t k = 0; k < u->n_params; k++) {
        const dt_param_desc_v1_t *p = &u->params[k];
        float *w = out + p->offset;
        const char *nm = p->name;
        size_t n = strlen(nm);
        int is_bias = n > 5 && strcmp(nm + n - 5, ".bias") == 0;
        int is_ln = strstr(nm, "ln_") != NULL;
        if (is_bias) {
            memset(w, 0, p->numel * sizeof *w);
            continue;
        }
        if (is_ln) {
            for (uint64_t i = 0; i < p->numel; i++)
                w[i] = 1.0f;
            continue;
        }
        double std = strstr(nm, "c_proj.weight") ? resid_std : 0.02;
        uint64_t st = hash_name(seed, nm);
        for (uint64_t i = 0; i < p->numel; i += 2) {
            /* Box-Muller on 53-bit uniforms in (0, 1] */
            double u1 = ((double)(splitmix64(&st) >> 11) + 1.0) * 0x1.0p-53;
            double u2 = (double)(splitmix64(&st) >> 11) * 0x1.0p-53;
            double r = sqrt(-2.0 * log(u1));
            w[i] = (float)(std * r * cos(2.0 * M_PI * u2));
            if (i + 1 < p->numel)
                w[i + 1] = (float)(std * r * sin(2.0 * M_PI * u2));
        }
    }
    return DT_OK;
}

/* ---- activations ---- */

static int dalloc(dt_model_t *m, const dt_model_ctx_t *ctx, int64_t n, size_t es, void *out)
{
    if (m->n_allocs == m->cap_allocs) {
        size_t cap = m->cap_allocs ? 2 * m->cap_allocs : 64;
        void **a = realloc(m->allocs, cap * sizeof *a);
        if (!a)
            return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
        m->allocs = a;
        m->cap_allocs = cap;
    }
    void *p = NULL;
    int rc = ctx->dev_ops->alloc(ctx->dev, (uint64_t)n * es, DT_TAG_ACTIVATIONS, &p);
    if (rc)
        return dt_err_context(rc, "allocating activations (%lld x %zu bytes)", (long long)n, es);
    m->allocs[m->n_allocs++] = p;
    *(void **)out = p;
    return DT_OK;
}

static int alloc_block(dt_model_t *m, const dt_model_ctx_t *ctx, block_acts_t *a)
{
    const int64_t BT = m->B * m->T, C = m->s.n_embd, NH = m->s.n_head, T = m->T;
    int rc;
    if ((rc = dalloc(m, ctx, BT * C, 4, &a->ln1)) || (rc = dalloc(m, ctx, BT, 4, &a->ln1_mean)) ||
        (rc = dalloc(m, ctx, BT, 4, &a->ln1_rstd)) ||
        (rc = dalloc(m, ctx, BT * 3 * C, 4, &a->qkv)) ||
        (rc = dalloc(m, ctx, BT * C, 4, &a->atty)) ||
        (rc = dalloc(m, ctx, m->B * NH * T * T, 4, &a->att)) ||
        (rc = dalloc(m, ctx, BT * C, 4, &a->attproj)) ||
        (rc = dalloc(m, ctx, BT * C, 4, &a->res2)) || (rc = dalloc(m, ctx, BT * C, 4, &a->ln2)) ||
        (rc = dalloc(m, ctx, BT, 4, &a->ln2_mean)) || (rc = dalloc(m, ctx, BT, 4, &a->ln2_rstd)) ||
        (rc = dalloc(m, ctx, BT * 4 * C, 4, &a->fch)) ||
        (rc = dalloc(m, ctx, BT * 4 * C, 4, &a->fch_gelu)) ||
        (rc = dalloc(m, ctx, BT * C, 4, &a->fcproj)))
        return rc;
    return DT_OK;
}

int dt_model_alloc_acts(dt_model_t *m, const dt_model_ctx_t *ctx, int64_t B, int64_t T)
{
    const int64_t L = m->s.n_layer, C = m->s.n_embd, V = m->s.vocab_size, BT = B * T;
    m->B = B;
    m->T = T;
    m->x = calloc((size_t)L + 1, sizeof *m->x);
    m->acts = calloc((size_t)L, sizeof *m->acts);
    m->host_losses = malloc((size_t)BT * sizeof(float));
    if (!m->x || !m->acts || !m->host_losses)
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    int rc;
    for (int64_t l = 0; l <= L; l++)
        if ((rc = dalloc(m, ctx, BT * C, 4, &m->x[l])))
            return rc;
    int need_scratch = 0;
    for (int64_t l = 0; l < L; l++) {
        if (is_ckpt(m, l)) {
            need_scratch = 1;
            continue;
        }
        if ((rc = alloc_block(m, ctx, &m->acts[l])))
            return rc;
    }
    if (need_scratch && (rc = alloc_block(m, ctx, &m->scratch)))
        return rc;
    for (int64_t l = 0; l < L; l++)
        if (is_ckpt(m, l))
            m->acts[l] = m->scratch;
    if ((rc = dalloc(m, ctx, BT * C, 4, &m->lnf)) || (rc = dalloc(m, ctx, BT, 4, &m->lnf_mean)) ||
        (rc = dalloc(m, ctx, BT, 4, &m->lnf_rstd)) ||
        (rc = dalloc(m, ctx, BT * V, 4, &m->logits)) ||
        (rc = dalloc(m, ctx, BT * V, 4, &m->probs)) || (rc = dalloc(m, ctx, BT, 4, &m->losses)) ||
        (rc = dalloc(m, ctx, BT * C, 4, &m->dx)) || (rc = dalloc(m, ctx, BT * C, 4, &m->dbuf_c)) ||
        (rc = dalloc(m, ctx, BT * C, 4, &m->dbuf_c2)) ||
        (rc = dalloc(m, ctx, BT * 3 * C, 4, &m->dqkv)) ||
        (rc = dalloc(m, ctx, BT * 4 * C, 4, &m->dfch)) ||
        (rc = dalloc(m, ctx, BT * 4 * C, 4, &m->dfch_gelu)) ||
        (rc = dalloc(m, ctx, BT * V, 4, &m->dlogits)) ||
        (rc = dalloc(m, ctx, BT, 4, &m->tokens)) || (rc = dalloc(m, ctx, BT, 4, &m->targets)))
        return rc;
    return DT_OK;
}

double dt_model_flops_per_token(const dt_model_t *m, int64_t T)
{
    /* 6 FLOPs per parameter per token (fwd 2 + bwd 4, the tied head counted
     * once through wte) plus attention's 6 * L * T * C (PaLM appendix B). */
    double N = (double)dt_gpt2_param_count(&m->s) - (double)m->s.context * (double)m->s.n_embd;
    return 6.0 * N + 6.0 * (double)m->s.n_layer * (double)T * (double)m->s.n_embd;
}

/* ---- forward / backward ---- */

#define K (ctx->dev_ops)
#define D ctx->dev, ctx->stream
#define CHECK(call)                                                                            \
    do {                                                                                       \
        int rc_ = (call);                                                                      \
        if (rc_)                                                                               \
            return rc_;                                                                        \
    } while (0)

static int hook(const dt_model_ctx_t *ctx, int phase, uint32_t unit, uint32_t micro,
                uint32_t n_micro, int no_grad, int last_use, dt_unit_buffers_v1_t *buf)
{
    dt_hook_v1_t h = {.unit = unit, .micro = micro, .n_micro = n_micro,
                      .flags = no_grad ? DT_HOOK_NO_GRAD : 0u, .last_use = last_use};
    const dt_strategy_ops_v1_t *s = ctx->strat_ops;
    static const char *names[] = {"pre_forward", "post_forward", "pre_backward", "post_backward"};
    int rc;
    switch (phase) {
    case 0: rc = s->pre_forward(ctx->strat, &h, buf); break;
    case 1: rc = s->post_forward(ctx->strat, &h); break;
    case 2: rc = s->pre_backward(ctx->strat, &h, buf); break;
    default: rc = s->post_backward(ctx->strat, &h); break;
    }
    if (rc)
        return dt_err_context(rc, "%s of unit %u", names[phase], unit);
    return DT_OK;
}

/* Forward of block l with parameters `p`, input x, output `out`. */
static int block_forward(dt_model_t *m, const dt_model_ctx_t *ctx, const float *p,
                         const float *x, block_acts_t *a, float *out)
{
    const int64_t B = m->B, T = m->T, C = m->s.n_embd, NH = m->s.n_head, BT = B * T;
    const uint64_t *o = m->boff;
    CHECK(K->layernorm_forward(D, a->ln1, a->ln1_mean, a->ln1_rstd, x, p + o[LN1W], p + o[LN1B],
                               BT, C));
    CHECK(K->matmul_forward(D, a->qkv, a->ln1, p + o[ATTW], p + o[ATTB], DT_F32, BT, C, 3 * C));
    CHECK(K->attention_forward(D, a->atty, a->att, a->qkv, B, T, C, NH));
    CHECK(K->matmul_forward(D, a->attproj, a->atty, p + o[PROJW], p + o[PROJB], DT_F32, BT, C, C));
    CHECK(K->residual_forward(D, a->res2, x, a->attproj, BT * C));
    CHECK(K->layernorm_forward(D, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, p + o[LN2W],
                               p + o[LN2B], BT, C));
    CHECK(K->matmul_forward(D, a->fch, a->ln2, p + o[FCW], p + o[FCB], DT_F32, BT, C, 4 * C));
    CHECK(K->gelu_forward(D, a->fch_gelu, a->fch, BT * 4 * C));
    CHECK(K->matmul_forward(D, a->fcproj, a->fch_gelu, p + o[FCPW], p + o[FCPB], DT_F32, BT,
                            4 * C, C));
    CHECK(K->residual_forward(D, out, a->res2, a->fcproj, BT * C));
    return DT_OK;
}

/* Backward of block l: m->dx holds d(out) on entry and d(x) on return. */
static int block_backward(dt_model_t *m, const dt_model_ctx_t *ctx, const float *p, float *g,
                          const float *x, const block_acts_t *a)
{
    const int64_t B = m->B, T = m->T, C = m->s.n_embd, NH = m->s.n_head, BT = B * T;
    const uint64_t *o = m->boff;
    float *dx = m->dx;
    /* fcproj: out = res2 + fcproj, so d(fcproj) = d(res2) partial = dx */
    CHECK(K->memset_async(ctx->dev, m->dfch_gelu, 0, (uint64_t)BT * 4 * C * 4, ctx->stream));
    CHECK(K->matmul_backward(D, m->dfch_gelu, g + o[FCPW], g + o[FCPB], dx, a->fch_gelu,
                             p + o[FCPW], DT_F32, BT, 4 * C, C));
    CHECK(K->memset_async(ctx->dev, m->dfch, 0, (uint64_t)BT * 4 * C * 4, ctx->stream));
    CHECK(K->gelu_backward(D, m->dfch, a->fch, m->dfch_gelu, BT * 4 * C));
    CHECK(K->memset_async(ctx->dev, m->dbuf_c, 0, (uint64_t)BT * C * 4, ctx->stream));
    CHECK(K->matmul_backward(D, m->dbuf_c, g + o[FCW], g + o[FCB], m->dfch, a->ln2, p + o[FCW],
                             DT_F32, BT, C, 4 * C));
    /* dx becomes d(res2): the residual path plus the ln_2 path */
    CHECK(K->layernorm_backward(D, dx, g + o[LN2W], g + o[LN2B], m->dbuf_c, a->res2, p + o[LN2W],
                                a->ln2_mean, a->ln2_rstd, BT, C));
    CHECK(K->memset_async(ctx->dev, m->dbuf_c2, 0, (uint64_t)BT * C * 4, ctx->stream));
    CHECK(K->matmul_backward(D, m->dbuf_c2, g + o[PROJW], g + o[PROJB], dx, a->atty,
                             p + o[PROJW], DT_F32, BT, C, C));
    CHECK(K->memset_async(ctx->dev, m->dqkv, 0, (uint64_t)BT * 3 * C * 4, ctx->stream));
    CHECK(K->attention_backward(D, m->dqkv, m->dbuf_c2, a->qkv, a->att, B, T, C, NH));
    CHECK(K->memset_async(ctx->dev, m->dbuf_c, 0, (uint64_t)BT * C * 4, ctx->stream));
    CHECK(K->matmul_backward(D, m->dbuf_c, g + o[ATTW], g + o[ATTB], m->dqkv, a->ln1,
                             p + o[ATTW], DT_F32, BT, C, 3 * C));
    /* dx becomes d(x): the residual path plus the ln_1 path */
    CHECK(K->layernorm_backward(D, dx, g + o[LN1W], g + o[LN1B], m->dbuf_c, x, p + o[LN1W],
                                a->ln1_mean, a->ln1_rstd, BT, C));
    return DT_OK;
}

int dt_model_step_micro(dt_model_t *m, const dt_model_ctx_t *ctx, const int32_t *inputs,
                        const int32_t *targets, uint32_t micro, uint32_t n_micro, int no_grad,
                        float loss_scale, double *loss)
{
    const int64_t B = m->B, T = m->T, C = m->s.n_embd, V = m->s.vocab_size, BT = B * T;
    const uint32_t L = (uint32_t)m->s.n_layer, head = L + 1;
    dt_unit_buffers_v1_t b0, bl, bh;

    CHECK(K->memcpy_async(ctx->dev, m->tokens, inputs, (uint64_t)BT * 4, DT_COPY_H2D, ctx->stream));
    CHECK(K->memcpy_async(ctx->dev, m->targets, targets, (uint64_t)BT * 4, DT_COPY_H2D, ctx->stream));

    /* forward */
    CHECK(hook(ctx, 0, 0, micro, n_micro, no_grad, 0, &b0));
    const float *wte = b0.params, *wpe = (const float *)b0.params + V * C;
    CHECK(K->embedding_forward(D, m->x[0], m->tokens, wte, wpe, B, T, C));
    CHECK(hook(ctx, 1, 0, micro, n_micro, no_grad, 0, NULL));
    for (uint32_t l = 0; l < L; l++) {
        CHECK(hook(ctx, 0, l + 1, micro, n_micro, no_grad, 0, &bl));
        CHECK(block_forward(m, ctx, bl.params, m->x[l], &m->acts[l], m->x[l + 1]));
        CHECK(hook(ctx, 1, l + 1, micro, n_micro, no_grad, 0, NULL));
    }
    CHECK(hook(ctx, 0, head, micro, n_micro, no_grad, 0, &bh));
    CHECK(hook(ctx, 0, 0, micro, n_micro, no_grad, 0, &b0));
    const float *pf = bh.params;
    CHECK(K->layernorm_forward(D, m->lnf, m->lnf_mean, m->lnf_rstd, m->x[L], pf, pf + C, BT, C));
    CHECK(K->matmul_forward(D, m->logits, m->lnf, b0.params, NULL, DT_F32, BT, C, V));
    CHECK(K->softmax_xent_forward(D, m->losses, m->probs, m->logits, m->targets, BT, V));
    CHECK(hook(ctx, 1, 0, micro, n_micro, no_grad, 0, NULL));
    CHECK(hook(ctx, 1, head, micro, n_micro, no_grad, 0, NULL));

    CHECK(K->memcpy_async(ctx->dev, m->host_losses, m->losses, (uint64_t)BT * 4, DT_COPY_D2H, ctx->stream));
    CHECK(K->stream_sync(ctx->dev, ctx->stream));
    double sum = 0;
    for (int64_t i = 0; i < BT; i++)
        sum += m->host_losses[i];
    *loss = sum / (double)BT;
    if (no_grad)
        return DT_OK;

    /* backward: head first (it also feeds wte's gradient), then the blocks,
     * then the embedding, whose post_backward ends unit 0's gradient */
    CHECK(hook(ctx, 2, head, micro, n_micro, 0, 0, &bh));
    CHECK(hook(ctx, 2, 0, micro, n_micro, 0, 0, &b0));
    CHECK(K->memset_async(ctx->dev, m->dlogits, 0, (uint64_t)BT * V * 4, ctx->stream));
    CHECK(K->softmax_xent_backward(D, m->dlogits, m->probs, m->targets,
                                   loss_scale / (float)BT, BT, V));
    CHECK(K->memset_async(ctx->dev, m->dbuf_c, 0, (uint64_t)BT * C * 4, ctx->stream));
    CHECK(K->matmul_backward(D, m->dbuf_c, b0.grads, NULL, m->dlogits, m->lnf, b0.params, DT_F32,
                             BT, C, V));
    CHECK(hook(ctx, 3, 0, micro, n_micro, 0, 0, NULL));
    CHECK(K->memset_async(ctx->dev, m->dx, 0, (uint64_t)BT * C * 4, ctx->stream));
    CHECK(K->layernorm_backward(D, m->dx, bh.grads, bh.grads + C, m->dbuf_c, m->x[L], bh.params,
                                m->lnf_mean, m->lnf_rstd, BT, C));
    CHECK(hook(ctx, 3, head, micro, n_micro, 0, 1, NULL));
    for (uint32_t l = L; l-- > 0;) {
        CHECK(hook(ctx, 2, l + 1, micro, n_micro, 0, 0, &bl));
        if (is_ckpt(m, l)) /* recompute this block's activations into scratch */
            CHECK(block_forward(m, ctx, bl.params, m->x[l], &m->scratch, m->dbuf_c2));
        CHECK(block_backward(m, ctx, bl.params, bl.grads, m->x[l], &m->acts[l]));
        CHECK(hook(ctx, 3, l + 1, micro, n_micro, 0, 1, NULL));
    }
    CHECK(hook(ctx, 2, 0, micro, n_micro, 0, 0, &b0));
    CHECK(K->embedding_backward(D, b0.grads, b0.grads + V * C, m->dx, m->tokens, B, T, C));
    CHECK(hook(ctx, 3, 0, micro, n_micro, 0, 1, NULL));
    return DT_OK;
}
