/*
 * plugins/llama/llama_decode.c - LLaMA-family inference one position at a
 * time with a KV cache (the model table's decoder slots, which
 * core/model/generate.h drives), on the device kernel table training
 * uses; plugins/gpt2/gpt2_decode.c's structure.
 *
 * The kernel table has no single-query attention reading a cache
 * (gqa_attention_forward recomputes every position), so the incremental
 * grouped-query attention is built here from core kernels.  Query heads
 * share kv heads in groups of G = n_head / n_kv_head, the G query heads of
 * kv head j lying next to each other (heads jG .. jG + G - 1, as the
 * kernel reads them), so one group is a (G, HD) matrix.  At position t,
 * with q and k already rotated (rope_forward on the one row, the tables
 * from row t):
 *   K[j][t] = k_j, V[j][t] = v_j     (the cache, (NKV, max_len, HD))
 *   s       = Q_j @ K[j][0..t]^T     matmul_forward, N = G, OC = t + 1
 *   s      *= 1 / sqrt(HD)           axpy into zeroed memory
 *   p       = softmax(s)             softmax_xent_forward per row (its
 *                                    loss, of a dummy target 0, ignored)
 *   Y_j    += p @ V[j][0..t]         matmul_backward's dinp, N = G
 * the causal attention restricted to the last row (the cache holds only
 * the past).  The rest of a layer is training's forward with N = 1
 * (RMSNorm, the q|k|v projection with its biases, o_proj, the gate|up
 * projection, SwiGLU, down_proj, the residual adds); the head is the
 * final RMSNorm and lm_head, or embed_tokens for a tied head.  The rotary
 * tables are computed on the host in double for the decoder's positions,
 * with the frequencies (rope_scaling included) of the training forward.
 *
 * Checked in tests/unit/plugins/llama/test_llama_generate.c: the logits of every
 * position equal a full forward's (dt_model_step_micro) within a stated
 * tolerance, with grouped-query attention, tied and untied heads, q/k/v
 * biases and llama3 rope scaling.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama_internal.h"

/* A layer's tensors, by their names in llama.c (looked up by name, so a
 * change of layout there fails here loudly instead of reading the wrong
 * memory).  q, k, v are adjacent, as are gate and up, and the biases:
 * the decoder reads q_proj as the stacked q|k|v weight, gate_proj as the
 * stacked gate|up one, and q_proj.bias as the stacked biases. */
static const char *const block_names[] = {
    "input_layernorm.weight", "self_attn.q_proj.weight",         "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.q_proj.bias",          "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",  "self_attn.o_proj.weight",         "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",   "mlp.up_proj.weight",              "mlp.down_proj.weight",
};
enum { LN1, QW, KW, VW, QB, KB, VB, OW, LN2, GW, UW, DW, NBLOCK };

struct dt_model_decoder {
    const dt_model_state_t *m;
    dt_model_ctx_t ctx;
    int64_t L, NH, NKV, G, C, HD, QD, KD, I, V, max_len, len;
    float eps;
    int bias;
    const float *emb, *normw, *lmw;       /* (V,C) (C) (V,C) */
    const float *(*blk)[NBLOCK];          /* [L][NBLOCK]; the biases NULL without */
    float **kc, **vc;                     /* [L]: (NKV, max_len, HD) */
    float *cos, *sin;                     /* (max_len, HD/2) */
    /* scratch, device */
    float *x, *n, *qkv, *atty, *proj, *res2, *gu, *hmid; /* (C) (C) (QKV) (QD) (C) (C) (2I) (I) */
    float *rstd, *loss;                                  /* (1) (G) */
    float *raw, *sc, *probs;                             /* (G, max_len) */
    float *logits;                                       /* (V) */
    int32_t *tok, *tgt;                                  /* (1) (G) */
    int32_t host_tok; /* the H2D source: valid until the step's sync */
    void **allocs;
    size_t n_allocs;
};

static int dalloc(dt_model_decoder_t *d, int64_t n, size_t es, void *out)
{
    void *p = NULL;
    int rc = dt_device_ops(d->ctx.dev)->alloc(d->ctx.dev, (uint64_t)n * es, DT_TAG_ACTIVATIONS, &p);
    if (rc)
        return d->m->svc->err_context(rc, "decoder: allocating %lld bytes",
                                      (long long)((uint64_t)n * es));
    d->allocs[d->n_allocs++] = p;
    *(void **)out = p;
    return DT_OK;
}

/* Tensor `name` of unit u in its flat buffer, checked to have n elements. */
static int find(const dt_model_state_t *m, void *const *params, uint32_t u, const char *name,
                uint64_t n, const float **out)
{
    const dt_unit_desc_t *ud = &m->desc->units[u];
    for (uint32_t k = 0; k < ud->n_params; k++)
        if (strcmp(ud->params[k].name, name) == 0) {
            if (ud->params[k].numel != n)
                return m->svc->set_error(DT_ERR_INVALID,
                                         "decoder: tensor %s has %llu elements, expected %llu",
                                         name,
                                         (unsigned long long)ud->params[k].numel,
                                         (unsigned long long)n);
            *out = (const float *)params[u] + ud->params[k].offset;
            return DT_OK;
        }
    return m->svc->set_error(DT_ERR_INVALID, "decoder: unit %s has no tensor %s", ud->name, name);
}

static int point(dt_model_decoder_t *d, void *const *params)
{
    const dt_model_state_t *m = d->m;
    const uint64_t C = (uint64_t)d->C, V = (uint64_t)d->V, QD = (uint64_t)d->QD,
                   KD = (uint64_t)d->KD, I = (uint64_t)d->I;
    const uint32_t head = (uint32_t)d->L + 1;
    int rc;
    if ((rc = find(m, params, 0, "embed_tokens.weight", V * C, &d->emb)) ||
        (rc = find(m, params, head, "norm.weight", C, &d->normw)))
        return rc;
    if (llama_shape(m)->tie)
        d->lmw = d->emb;
    else if ((rc = find(m, params, head, "lm_head.weight", V * C, &d->lmw)))
        return rc;
    const uint64_t numel[NBLOCK] = {C, QD * C, KD * C, KD * C, QD, KD, KD,
                                    C * QD, C, I * C, I * C, C * I};
    for (int64_t l = 0; l < d->L; l++)
        for (int k = 0; k < NBLOCK; k++) {
            if (!d->bias && (k == QB || k == KB || k == VB))
                continue;
            char nm[96];
            snprintf(nm, sizeof nm, "layers.%lld.%s", (long long)l, block_names[k]);
            if ((rc = find(m, params, (uint32_t)l + 1, nm, numel[k], &d->blk[l][k])))
                return rc;
        }
    /* the stacked reads need the tensors adjacent */
    for (int64_t l = 0; l < d->L; l++) {
        const float *const *w = d->blk[l];
        if (w[KW] != w[QW] + QD * C || w[VW] != w[KW] + KD * C || w[UW] != w[GW] + I * C ||
            (d->bias && (w[KB] != w[QB] + QD || w[VB] != w[KB] + KD)))
            return m->svc->set_error(DT_ERR_INVALID,
                                     "decoder: layer %lld's q/k/v or gate/up tensors are not "
                                     "adjacent in its unit",
                                     (long long)l);
    }
    return DT_OK;
}

/* The rotary tables of positions [0, max_len), as llama.c's upload_rope. */
static int upload_rope(dt_model_decoder_t *d)
{
    const int64_t T = d->max_len, h = d->HD / 2;
    const llama_shape_t *s = llama_shape(d->m);
    float *host = malloc((size_t)(2 * T * h) * sizeof *host);
    if (!host)
        return d->m->svc->set_error(DT_ERR_NOMEM, "decoder: out of memory");
    for (int64_t i = 0; i < h; i++) {
        const double f = llama_inv_freq(s, i);
        for (int64_t t = 0; t < T; t++) {
            host[t * h + i] = (float)cos((double)t * f);
            host[T * h + t * h + i] = (float)sin((double)t * f);
        }
    }
    const dt_device_ops_t *o = dt_device_ops(d->ctx.dev);
    const uint64_t bytes = (uint64_t)(T * h) * sizeof *host;
    int rc;
    if ((rc = o->memcpy_async(d->ctx.dev, d->cos, host, bytes, DT_COPY_H2D, d->ctx.stream)) ||
        (rc = o->memcpy_async(d->ctx.dev, d->sin, host + T * h, bytes, DT_COPY_H2D,
                              d->ctx.stream)) ||
        (rc = o->stream_sync(d->ctx.dev, d->ctx.stream)))
        rc = d->m->svc->err_context(rc, "decoder: uploading the rotary tables");
    free(host);
    return rc;
}

int llama_decoder_create(dt_model_state_t *m, const dt_model_ctx_t *ctx, void *const *params,
                         int64_t max_len, dt_model_decoder_t **out)
{
    *out = NULL;
    const llama_shape_t *s = llama_shape(m);
    if (m->wdtype != DT_F32)
        return m->svc->set_error(DT_ERR_UNSUPPORTED,
                                 "decoder: [model] dtype %s: generation runs fp32 parameters",
                                 m->info->dtype);
    if (m->adtype != DT_F32)
        return m->svc->set_error(DT_ERR_UNSUPPORTED,
                                 "decoder: [model] activations = \"%s\": generation runs fp32 "
                                 "activations (the weights of a run with bf16 activations sample "
                                 "in fp32)",
                                 dt_dtype_name(m->adtype));
    if (max_len < 1 || max_len > s->context)
        return m->svc->set_error(DT_ERR_INVALID,
                                 "decoder: %lld positions: 1 to the model's context of %lld",
                                 (long long)max_len, (long long)s->context);
    dt_model_decoder_t *d = calloc(1, sizeof *d);
    if (!d)
        return m->svc->set_error(DT_ERR_NOMEM, "decoder: out of memory");
    d->m = m;
    d->ctx = *ctx;
    d->L = s->n_layer;
    d->NH = s->n_head;
    d->NKV = s->n_kv_head;
    d->G = s->n_head / s->n_kv_head;
    d->C = s->n_embd;
    d->HD = s->head_dim;
    d->QD = d->NH * d->HD;
    d->KD = d->NKV * d->HD;
    d->I = s->intermediate;
    d->V = s->vocab_size;
    d->eps = (float)s->rms_eps;
    d->bias = s->qkv_bias;
    d->max_len = max_len;
    const int64_t C = d->C, L = d->L, QKV = d->QD + 2 * d->KD, G = d->G;
    d->blk = calloc((size_t)L, sizeof *d->blk);
    d->kc = calloc((size_t)L, sizeof *d->kc);
    d->vc = calloc((size_t)L, sizeof *d->vc);
    d->allocs = calloc((size_t)(2 * L + 32), sizeof *d->allocs);
    int rc = (!d->blk || !d->kc || !d->vc || !d->allocs)
                 ? m->svc->set_error(DT_ERR_NOMEM, "decoder: out of memory")
                 : point(d, params);
    for (int64_t l = 0; l < L && !rc; l++)
        if (!(rc = dalloc(d, max_len * d->KD, 4, &d->kc[l])))
            rc = dalloc(d, max_len * d->KD, 4, &d->vc[l]);
    if (rc || (rc = dalloc(d, max_len * (d->HD / 2), 4, &d->cos)) ||
        (rc = dalloc(d, max_len * (d->HD / 2), 4, &d->sin)) || (rc = dalloc(d, C, 4, &d->x)) ||
        (rc = dalloc(d, C, 4, &d->n)) || (rc = dalloc(d, QKV, 4, &d->qkv)) ||
        (rc = dalloc(d, d->QD, 4, &d->atty)) || (rc = dalloc(d, C, 4, &d->proj)) ||
        (rc = dalloc(d, C, 4, &d->res2)) || (rc = dalloc(d, 2 * d->I, 4, &d->gu)) ||
        (rc = dalloc(d, d->I, 4, &d->hmid)) || (rc = dalloc(d, 1, 4, &d->rstd)) ||
        (rc = dalloc(d, G, 4, &d->loss)) || (rc = dalloc(d, G * max_len, 4, &d->raw)) ||
        (rc = dalloc(d, G * max_len, 4, &d->sc)) || (rc = dalloc(d, G * max_len, 4, &d->probs)) ||
        (rc = dalloc(d, d->V, 4, &d->logits)) || (rc = dalloc(d, 1, 4, &d->tok)) ||
        (rc = dalloc(d, G, 4, &d->tgt)) ||
        (rc = dt_device_ops(ctx->dev)->memset_async(ctx->dev, d->tgt, 0, (uint64_t)G * 4,
                                                    ctx->stream)) ||
        (rc = upload_rope(d))) {
        llama_decoder_free(d);
        return rc;
    }
    *out = d;
    return DT_OK;
}

void llama_decoder_free(dt_model_decoder_t *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n_allocs; i++)
        dt_device_ops(d->ctx.dev)->free(d->ctx.dev, d->allocs[i]);
    free(d->allocs);
    free(d->blk);
    free(d->kc);
    free(d->vc);
    free(d);
}

int64_t llama_decoder_len(const dt_model_decoder_t *d) { return d->len; }

void llama_decoder_reset(dt_model_decoder_t *d) { d->len = 0; }

#define K (d->m->kern)
#define D d->ctx.dev, d->ctx.stream

/* Attention of the newest position t = d->len of layer l, qkv holding its
 * rotated q and k and its v: cache k and v, then for each kv head's group
 * of query heads atty = softmax(Q K^T / sqrt(HD)) V. */
static int attend(dt_model_decoder_t *d, int64_t l)
{
    const dt_device_ops_t *o = dt_device_ops(d->ctx.dev);
    const int64_t HD = d->HD, G = d->G, t = d->len, n = t + 1, cap = d->max_len;
    const uint64_t row = (uint64_t)HD * 4;
    const float scale = (float)(1.0 / sqrt((double)HD));
    const float *k = d->qkv + d->QD, *v = d->qkv + d->QD + d->KD;
    for (int64_t j = 0; j < d->NKV; j++) {
        float *kj = d->kc[l] + j * cap * HD, *vj = d->vc[l] + j * cap * HD;
        DT_TRY(o->memcpy_async(d->ctx.dev, kj + t * HD, k + j * HD, row, DT_COPY_D2D,
                               d->ctx.stream));
        DT_TRY(o->memcpy_async(d->ctx.dev, vj + t * HD, v + j * HD, row, DT_COPY_D2D,
                               d->ctx.stream));
    }
    DT_TRY(o->memset_async(d->ctx.dev, d->atty, 0, (uint64_t)d->QD * 4, d->ctx.stream));
    for (int64_t j = 0; j < d->NKV; j++) {
        const float *kj = d->kc[l] + j * cap * HD, *vj = d->vc[l] + j * cap * HD;
        const float *q = d->qkv + j * G * HD;
        DT_TRY(K->matmul_forward(D, d->raw, q, kj, NULL, DT_F32, DT_F32, G, HD, n));
        DT_TRY(o->memset_async(d->ctx.dev, d->sc, 0, (uint64_t)(G * n) * 4, d->ctx.stream));
        DT_TRY(K->axpy(D, d->sc, d->raw, DT_F32, scale, G * n));
        DT_TRY(K->softmax_xent_forward(D, d->loss, d->probs, d->sc, d->tgt, DT_F32, G, n));
        DT_TRY(K->matmul_backward(D, d->atty + j * G * HD, NULL, NULL, d->probs, NULL, vj, DT_F32,
                                  DT_F32, G, HD, n));
    }
    return DT_OK;
}

/* Layer l on d->x (1, C), in place. */
static int block(dt_model_decoder_t *d, int64_t l)
{
    const float *const *w = d->blk[l];
    const int64_t C = d->C, HD = d->HD, I = d->I, QKV = d->QD + 2 * d->KD, h = HD / 2;
    const int f = DT_F32;
    DT_TRY(K->rmsnorm_forward(D, d->n, d->rstd, d->x, w[LN1], f, 1, C, d->eps));
    DT_TRY(K->matmul_forward(D, d->qkv, d->n, w[QW], d->bias ? w[QB] : NULL, f, f, 1, C, QKV));
    /* q then k, NH + NKV heads from the row start, at position t */
    DT_TRY(K->rope_forward(D, d->qkv, d->qkv, d->cos + d->len * h, d->sin + d->len * h, f, 1, 1,
                           d->NH + d->NKV, HD, QKV));
    DT_TRY(attend(d, l));
    DT_TRY(K->matmul_forward(D, d->proj, d->atty, w[OW], NULL, f, f, 1, d->QD, C));
    DT_TRY(K->residual_forward(D, d->res2, d->x, d->proj, f, C));
    DT_TRY(K->rmsnorm_forward(D, d->n, d->rstd, d->res2, w[LN2], f, 1, C, d->eps));
    DT_TRY(K->matmul_forward(D, d->gu, d->n, w[GW], NULL, f, f, 1, C, 2 * I));
    DT_TRY(K->swiglu_forward(D, d->hmid, d->gu, f, 1, I));
    DT_TRY(K->matmul_forward(D, d->proj, d->hmid, w[DW], NULL, f, f, 1, I, C));
    DT_TRY(K->residual_forward(D, d->x, d->res2, d->proj, f, C));
    return DT_OK;
}

int llama_decoder_step(dt_model_decoder_t *d, int32_t token, float *logits)
{
    const dt_model_state_t *m = d->m;
    if (d->len >= d->max_len)
        return m->svc->set_error(DT_ERR_INVALID, "decoder: all %lld positions are used",
                                 (long long)d->max_len);
    if (token < 0 || token >= d->V)
        return m->svc->set_error(DT_ERR_INVALID,
                                 "decoder: token %d is outside the vocabulary (%lld)",
                                 (int)token, (long long)d->V);
    const dt_device_ops_t *o = dt_device_ops(d->ctx.dev);
    const int64_t C = d->C;
    int rc;
    d->host_tok = token;
    if ((rc = o->memcpy_async(d->ctx.dev, d->tok, &d->host_tok, 4, DT_COPY_H2D, d->ctx.stream)))
        return m->svc->err_context(rc, "decoder: position %lld", (long long)d->len);
    if ((rc = K->vocab_embedding_forward(D, d->x, d->tok, d->emb, NULL, DT_F32, 1, 1, C, 0,
                                         d->V)))
        return m->svc->err_context(rc, "decoder: embedding at position %lld", (long long)d->len);
    for (int64_t l = 0; l < d->L; l++)
        if ((rc = block(d, l)))
            return m->svc->err_context(rc, "decoder: layer %lld at position %lld", (long long)l,
                                       (long long)d->len);
    if ((rc = K->rmsnorm_forward(D, d->n, d->rstd, d->x, d->normw, DT_F32, 1, C, d->eps)) ||
        (rc = K->matmul_forward(D, d->logits, d->n, d->lmw, NULL, DT_F32, DT_F32, 1, C, d->V)) ||
        (rc = o->memcpy_async(d->ctx.dev, logits, d->logits, (uint64_t)d->V * 4, DT_COPY_D2H,
                              d->ctx.stream)) ||
        (rc = o->stream_sync(d->ctx.dev, d->ctx.stream)))
        return m->svc->err_context(rc, "decoder: head at position %lld", (long long)d->len);
    d->len++;
    return DT_OK;
}
