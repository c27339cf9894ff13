/*
 * plugins/gpt2/gpt2_decode.c - GPT-2 inference one position at a time with
 * a KV cache (the model table's decoder slots, which core/model/generate.h
 * drives), on the device kernel table training uses.
 *
 * The kernel table has no single-query attention reading a cache:
 * attention_forward takes the whole (B, T, 3C) qkv and recomputes every
 * position's attention, so calling it per token would cost O(T^2) per
 * token.  The incremental attention is therefore built here from core
 * kernels, per head h of hs = C / NH channels, at position t:
 *   K[h][t] = k_h, V[h][t] = v_h       (copied into the cache, (NH, T, hs))
 *   s       = q_h @ K[h][0..t]^T        matmul_forward, N = 1, OC = t + 1
 *   s      *= 1 / sqrt(hs)              axpy into zeroed memory
 *   p       = softmax(s)                softmax_xent_forward (its loss, of
 *                                       a dummy target 0, is ignored)
 *   y_h    += p @ V[h][0..t]            matmul_backward's dinp, N = 1
 * which is the causal attention of attention_forward restricted to the
 * last row (causality is automatic: the cache holds only the past).  The
 * rest of a block is training's forward with N = 1 (layernorm, the four
 * matmuls, GELU, residual adds), the embedding reads wpe's row t.  The
 * cache is stored head-major so each K[h], V[h] is a contiguous (t+1, hs)
 * matrix the matmuls read as it is.
 *
 * Checked in tests/unit/core/model/test_generate.c: the logits of every position
 * equal a full forward's (dt_model_step_micro) within a stated tolerance.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt2_internal.h"

/* A block's tensors, in gpt2.c's order (looked up by name, so a change of
 * layout there fails here loudly instead of reading the wrong memory). */
static const char *const block_names[] = {
    "ln_1.weight",       "ln_1.bias",       "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",   "mlp.c_fc.bias",   "mlp.c_proj.weight",  "mlp.c_proj.bias",
};
enum { LN1W, LN1B, ATTW, ATTB, PROJW, PROJB, LN2W, LN2B, FCW, FCB, FCPW, FCPB, NBLOCK };

struct dt_model_decoder {
    const dt_model_state_t *m;
    dt_model_ctx_t ctx;
    int64_t L, NH, C, V, hs, max_len, len;
    const float *wte, *wpe, *lnfw, *lnfb; /* (V,C) (maxT,C) (C) (C) */
    const float *(*blk)[NBLOCK];          /* [L][NBLOCK] */
    float **kc, **vc;                     /* [L]: (NH, max_len, hs) */
    /* scratch, device */
    float *x, *ln, *qkv, *atty, *proj, *res2, *fch, *fchg; /* (C) (C) (3C) (C) (C) (C) (4C) (4C) */
    float *mean, *rstd, *loss;                             /* (1) */
    float *raw, *sc, *probs;                               /* (max_len) */
    float *logits;                                         /* (V) */
    int32_t *tok, *tgt;                                    /* (1) */
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
    const uint64_t C = (uint64_t)d->C, V = (uint64_t)d->V, maxT = (uint64_t)m->info->context;
    const uint32_t head = (uint32_t)d->L + 1;
    int rc;
    if ((rc = find(m, params, 0, "wte.weight", V * C, &d->wte)) ||
        (rc = find(m, params, 0, "wpe.weight", maxT * C, &d->wpe)) ||
        (rc = find(m, params, head, "ln_f.weight", C, &d->lnfw)) ||
        (rc = find(m, params, head, "ln_f.bias", C, &d->lnfb)))
        return rc;
    static const uint64_t rows[NBLOCK] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1};
    static const uint64_t cols[NBLOCK] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1};
    static const int matrix[NBLOCK] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 1, 0};
    for (int64_t l = 0; l < d->L; l++)
        for (int k = 0; k < NBLOCK; k++) {
            char nm[96];
            snprintf(nm, sizeof nm, "h.%lld.%s", (long long)l, block_names[k]);
            uint64_t n = rows[k] * C * (matrix[k] ? cols[k] * C : 1);
            if ((rc = find(m, params, (uint32_t)l + 1, nm, n, &d->blk[l][k])))
                return rc;
        }
    return DT_OK;
}

int gpt2_decoder_create(dt_model_state_t *m, const dt_model_ctx_t *ctx, void *const *params,
                      int64_t max_len, dt_model_decoder_t **out)
{
    *out = NULL;
    const gpt2_shape_t *s = gpt2_shape(m);
    if (m->wdtype != DT_F32)
        return m->svc->set_error(DT_ERR_UNSUPPORTED,
                                 "decoder: [model] dtype %s: generation runs fp32 parameters",
                                 m->info->dtype);
    /* a checkpoint trained with bf16 activations holds f32 weights like
     * any other: dtrain sample builds its model with the default fp32
     * activations, so only a caller asking for bf16 lands here */
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
    d->C = s->n_embd;
    d->V = s->vocab_size;
    d->hs = d->C / d->NH;
    d->max_len = max_len;
    const int64_t C = d->C, L = d->L;
    d->blk = calloc((size_t)L, sizeof *d->blk);
    d->kc = calloc((size_t)L, sizeof *d->kc);
    d->vc = calloc((size_t)L, sizeof *d->vc);
    d->allocs = calloc((size_t)(2 * L + 32), sizeof *d->allocs);
    int rc = (!d->blk || !d->kc || !d->vc || !d->allocs)
                 ? m->svc->set_error(DT_ERR_NOMEM, "decoder: out of memory")
                 : point(d, params);
    for (int64_t l = 0; l < L && !rc; l++)
        if (!(rc = dalloc(d, max_len * C, 4, &d->kc[l])))
            rc = dalloc(d, max_len * C, 4, &d->vc[l]);
    if (rc || (rc = dalloc(d, C, 4, &d->x)) || (rc = dalloc(d, C, 4, &d->ln)) ||
        (rc = dalloc(d, 3 * C, 4, &d->qkv)) || (rc = dalloc(d, C, 4, &d->atty)) ||
        (rc = dalloc(d, C, 4, &d->proj)) || (rc = dalloc(d, C, 4, &d->res2)) ||
        (rc = dalloc(d, 4 * C, 4, &d->fch)) || (rc = dalloc(d, 4 * C, 4, &d->fchg)) ||
        (rc = dalloc(d, 1, 4, &d->mean)) || (rc = dalloc(d, 1, 4, &d->rstd)) ||
        (rc = dalloc(d, 1, 4, &d->loss)) || (rc = dalloc(d, max_len, 4, &d->raw)) ||
        (rc = dalloc(d, max_len, 4, &d->sc)) || (rc = dalloc(d, max_len, 4, &d->probs)) ||
        (rc = dalloc(d, d->V, 4, &d->logits)) || (rc = dalloc(d, 1, 4, &d->tok)) ||
        (rc = dalloc(d, 1, 4, &d->tgt)) ||
        (rc = dt_device_ops(ctx->dev)->memset_async(ctx->dev, d->tgt, 0, 4, ctx->stream))) {
        gpt2_decoder_free(d);
        return rc;
    }
    *out = d;
    return DT_OK;
}

void gpt2_decoder_free(dt_model_decoder_t *d)
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

int64_t gpt2_decoder_len(const dt_model_decoder_t *d) { return d->len; }

void gpt2_decoder_reset(dt_model_decoder_t *d) { d->len = 0; }

#define K (d->m->kern)
#define D d->ctx.dev, d->ctx.stream

/* Attention of the newest position t = d->len of layer l, qkv holding its
 * q, k, v: cache k and v, then atty = softmax(q K^T / sqrt(hs)) V. */
static int attend(dt_model_decoder_t *d, int64_t l)
{
    const dt_device_ops_t *o = dt_device_ops(d->ctx.dev);
    const int64_t C = d->C, hs = d->hs, t = d->len, n = t + 1, cap = d->max_len;
    const uint64_t row = (uint64_t)hs * 4;
    const float scale = (float)(1.0 / sqrt((double)hs));
    for (int64_t h = 0; h < d->NH; h++) {
        float *kh = d->kc[l] + h * cap * hs, *vh = d->vc[l] + h * cap * hs;
        DT_TRY(o->memcpy_async(d->ctx.dev, kh + t * hs, d->qkv + C + h * hs, row, DT_COPY_D2D,
                               d->ctx.stream));
        DT_TRY(o->memcpy_async(d->ctx.dev, vh + t * hs, d->qkv + 2 * C + h * hs, row,
                               DT_COPY_D2D, d->ctx.stream));
    }
    DT_TRY(o->memset_async(d->ctx.dev, d->atty, 0, (uint64_t)C * 4, d->ctx.stream));
    for (int64_t h = 0; h < d->NH; h++) {
        const float *kh = d->kc[l] + h * cap * hs, *vh = d->vc[l] + h * cap * hs;
        DT_TRY(K->matmul_forward(D, d->raw, d->qkv + h * hs, kh, NULL, DT_F32, DT_F32, 1, hs,
                                 n));
        DT_TRY(o->memset_async(d->ctx.dev, d->sc, 0, (uint64_t)n * 4, d->ctx.stream));
        DT_TRY(K->axpy(D, d->sc, d->raw, DT_F32, scale, n));
        DT_TRY(K->softmax_xent_forward(D, d->loss, d->probs, d->sc, d->tgt, DT_F32, 1, n));
        DT_TRY(K->matmul_backward(D, d->atty + h * hs, NULL, NULL, d->probs, NULL, vh, DT_F32,
                                  DT_F32, 1, hs, n));
    }
    return DT_OK;
}

/* Block l on d->x (1, C), in place. */
static int block(dt_model_decoder_t *d, int64_t l)
{
    const float *const *w = d->blk[l];
    const int64_t C = d->C;
    const int f = DT_F32;
    DT_TRY(K->layernorm_forward(D, d->ln, d->mean, d->rstd, d->x, w[LN1W], w[LN1B], f, 1, C));
    DT_TRY(K->matmul_forward(D, d->qkv, d->ln, w[ATTW], w[ATTB], f, f, 1, C, 3 * C));
    DT_TRY(attend(d, l));
    DT_TRY(K->matmul_forward(D, d->proj, d->atty, w[PROJW], w[PROJB], f, f, 1, C, C));
    DT_TRY(K->residual_forward(D, d->res2, d->x, d->proj, f, C));
    DT_TRY(K->layernorm_forward(D, d->ln, d->mean, d->rstd, d->res2, w[LN2W], w[LN2B], f, 1,
                                C));
    DT_TRY(K->matmul_forward(D, d->fch, d->ln, w[FCW], w[FCB], f, f, 1, C, 4 * C));
    DT_TRY(K->gelu_forward(D, d->fchg, d->fch, f, 4 * C));
    DT_TRY(K->matmul_forward(D, d->proj, d->fchg, w[FCPW], w[FCPB], f, f, 1, 4 * C, C));
    DT_TRY(K->residual_forward(D, d->x, d->res2, d->proj, f, C));
    return DT_OK;
}

int gpt2_decoder_step(dt_model_decoder_t *d, int32_t token, float *logits)
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
    /* wpe's row t as a one-row table: the kernel adds row 0 of what it gets */
    if ((rc = K->embedding_forward(D, d->x, d->tok, d->wte, d->wpe + d->len * C, DT_F32, 1, 1,
                                   C)))
        return m->svc->err_context(rc, "decoder: embedding at position %lld", (long long)d->len);
    for (int64_t l = 0; l < d->L; l++)
        if ((rc = block(d, l)))
            return m->svc->err_context(rc, "decoder: block %lld at position %lld", (long long)l,
                                       (long long)d->len);
    if ((rc = K->layernorm_forward(D, d->ln, d->mean, d->rstd, d->x, d->lnfw, d->lnfb, DT_F32,
                                   1, C)) ||
        (rc = K->matmul_forward(D, d->logits, d->ln, d->wte, NULL, DT_F32, DT_F32, 1, C, d->V)) ||
        (rc = o->memcpy_async(d->ctx.dev, logits, d->logits, (uint64_t)d->V * 4, DT_COPY_D2H,
                              d->ctx.stream)) ||
        (rc = o->stream_sync(d->ctx.dev, d->ctx.stream)))
        return m->svc->err_context(rc, "decoder: head at position %lld", (long long)d->len);
    d->len++;
    return DT_OK;
}
