/*
 * plugins/mlp/mlp.c - the mlp model plugin (arch = "mlp", dtrain/model.h):
 * a bigram language model as units, so every strategy can be exercised on
 * a shape that is not a transformer (no tied unit, no attention, units of
 * very different sizes) while training on the same token files.
 *
 *   unit 0        "embedding"  embed.weight (V, mlp_in): x = embed[token]
 *   unit 1+l      "layer.l"    fc.l.weight (mlp_hidden, in), fc.l.bias:
 *                              x = gelu(x @ W^T + b), l < mlp_layers
 *   unit last     "head"       head.weight (V, width), head.bias (V):
 *                              logits = x @ W^T + b
 *   loss: mean softmax cross-entropy of the target token at every position
 * Each position sees only its own token (a bigram model), so any sequence
 * length works.  Activation checkpointing applies to the hidden layers:
 * a recomputed layer keeps its output and recomputes its pre-activation.
 *
 * Checked against tests/reference/mlp_ref.py (float64 numpy) by
 * tests/unit/plugins/mlp/test_mlp.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DT_MODEL_PLUGIN_HELPERS
#include "dtrain/model.h"

enum { EMB = 0 };    /* unit 0 */
enum { W = 0, BIAS }; /* layers and head */

/* Activations and their gradients, in the activation dtype (m->adtype). */
typedef struct mlp {
    int64_t D, H, NL, V; /* mlp_in, mlp_hidden, mlp_layers, vocab_size */
    void *zeros;         /* (T, D): the embedding kernel's position table */
    void *x0;            /* (B,T,D) embeddings */
    void **pre, **out;   /* per layer (B,T,H): before and after GELU */
    void *pre_scratch;   /* (B,T,H) for recomputed layers */
    void *da, *db;       /* (B,T,max(D,H)) gradients of layer inputs/outputs */
    void *dpre;          /* (B,T,H) */
    void *dlogits;       /* (B,T,V) */
} mlp_t;

static mlp_t *P(const dt_model_state_t *m) { return m->arch_state; }

static int mlp_create(dt_model_state_t *m)
{
    mlp_t *p = calloc(1, sizeof *p);
    if (!p)
        return m->svc->set_error(DT_ERR_NOMEM, "model: out of memory");
    m->arch_state = p;
    if (m->tp > 1)
        return m->svc->set_error(DT_ERR_CONFIG,
                                 "%s: [parallel] tensor = %d: arch \"mlp\" has no tensor-parallel "
                                 "layout (gpt2 has)",
                                 dt_model_cfg_name(m), (int)m->tp);
    int rc;
    if ((rc = m->svc->config_int(m, "model.vocab_size", &p->V)) ||
        (rc = m->svc->config_int(m, "model.mlp_in", &p->D)) ||
        (rc = m->svc->config_int(m, "model.mlp_hidden", &p->H)) ||
        (rc = m->svc->config_int(m, "model.mlp_layers", &p->NL)))
        return rc;
    dt_model_add_key(m, "vocab_size", p->V);
    dt_model_add_key(m, "mlp_in", p->D);
    dt_model_add_key(m, "mlp_hidden", p->H);
    dt_model_add_key(m, "mlp_layers", p->NL);
    m->info->vocab_size = p->V;
    m->info->context = 0;

    const uint32_t head = (uint32_t)p->NL + 1;
    if ((rc = dt_model_alloc_units(m, head + 1)) ||
        (rc = dt_model_name_unit(m, 0, "embedding")) ||
        (rc = dt_model_add_param(m, 0, "embed.weight", 2, p->V, p->D, DT_TENSOR_EMBED, 0.02)))
        return rc;
    char nm[64];
    for (int64_t l = 0; l < p->NL; l++) {
        const uint32_t u = (uint32_t)l + 1;
        snprintf(nm, sizeof nm, "layer.%lld", (long long)l);
        if ((rc = dt_model_name_unit(m, u, nm)))
            return rc;
        snprintf(nm, sizeof nm, "fc.%lld.weight", (long long)l);
        if ((rc = dt_model_add_param(m, u, nm, 2, p->H, l ? p->H : p->D, DT_TENSOR_MATRIX,
                                     0.02)))
            return rc;
        snprintf(nm, sizeof nm, "fc.%lld.bias", (long long)l);
        if ((rc = dt_model_add_param(m, u, nm, 1, p->H, 0, DT_TENSOR_BIAS, 0)))
            return rc;
    }
    if ((rc = dt_model_name_unit(m, head, "head")) ||
        (rc = dt_model_add_param(m, head, "head.weight", 2, p->V, p->NL ? p->H : p->D,
                                 DT_TENSOR_MATRIX, 0.02)) ||
        (rc = dt_model_add_param(m, head, "head.bias", 1, p->V, 0, DT_TENSOR_BIAS, 0)))
        return rc;
    return DT_OK;
}

static void mlp_free(dt_model_state_t *m)
{
    mlp_t *p = P(m);
    if (!p)
        return;
    free(p->pre);
    free(p->out);
    free(p);
    m->arch_state = NULL;
}

static int mlp_alloc_acts(dt_model_state_t *m, const dt_model_ctx_t *ctx)
{
    mlp_t *p = P(m);
    const int64_t BT = m->B * m->T, H = p->H, V = p->V, D = p->D, wide = D > H ? D : H;
    const size_t es = dt_model_act_size(m);
    p->pre = calloc((size_t)p->NL + 1, sizeof *p->pre);
    p->out = calloc((size_t)p->NL + 1, sizeof *p->out);
    if (!p->pre || !p->out)
        return m->svc->set_error(DT_ERR_NOMEM, "model: out of memory");
    int rc, need_scratch = 0;
    m->act_owner = 0;
    if ((rc = dt_model_dalloc(m, ctx, BT * D, es, &p->x0)))
        return rc;
    for (int64_t l = 0; l < p->NL; l++) {
        m->act_owner = (uint32_t)l + 1;
        if (dt_model_recomputes(m, l))
            need_scratch = 1;
        else if ((rc = dt_model_dalloc(m, ctx, BT * H, es, &p->pre[l])))
            return rc;
        if ((rc = dt_model_dalloc(m, ctx, BT * H, es, &p->out[l])))
            return rc;
    }
    m->act_owner = (uint32_t)p->NL + 1;
    if ((rc = dt_model_dalloc(m, ctx, BT * V, es, &m->probs)))
        return rc;
    m->act_owner = DT_ACT_WORKSPACE;
    if (need_scratch && (rc = dt_model_dalloc(m, ctx, BT * H, es, &p->pre_scratch)))
        return rc;
    for (int64_t l = 0; l < p->NL; l++)
        if (dt_model_recomputes(m, l))
            p->pre[l] = p->pre_scratch;
    if ((rc = dt_model_dalloc(m, ctx, m->T * D, es, &p->zeros)) ||
        (rc = dt_model_zero(ctx, p->zeros, (uint64_t)(m->T * D) * es)) ||
        (rc = dt_model_dalloc(m, ctx, BT * wide, es, &p->da)) ||
        (rc = dt_model_dalloc(m, ctx, BT * wide, es, &p->db)) ||
        (rc = dt_model_dalloc(m, ctx, BT * H, es, &p->dpre)) ||
        (rc = dt_model_dalloc(m, ctx, BT * V, es, &p->dlogits)) ||
        (rc = dt_model_dalloc(m, ctx, BT * V, es, &m->logits)) ||
        (rc = dt_model_dalloc(m, ctx, BT, 4, &m->losses)))
        return rc;
    return DT_OK;
}

/* Unit u keeps its output (the next unit's input): the embeddings, each
 * layer's GELU output, and unless the layer is recomputed its
 * pre-activation (GELU's backward reads it); the head keeps the
 * probabilities.  The rest is workspace. */
static int mlp_act_bytes(const dt_model_state_t *m, int64_t B_, int64_t T_, double *unit,
                         double *ws)
{
    const mlp_t *p = P(m);
    const double BT = (double)B_ * (double)T_, D = (double)p->D, H = (double)p->H,
                 V = (double)p->V, wide = D > H ? D : H, es = (double)dt_model_act_size(m);
    int any_recompute = 0;
    unit[0] += es * BT * D;
    for (int64_t l = 0; l < p->NL; l++) {
        unit[l + 1] += es * BT * H;
        if (dt_model_recomputes(m, l))
            any_recompute = 1;
        else
            unit[l + 1] += es * BT * H;
    }
    unit[p->NL + 1] += es * BT * V;
    /* the recompute buffer, the zero position table (T, D), da db (wide),
     * dpre (H), dlogits and logits (V), and the f32 losses */
    *ws += es * ((any_recompute ? BT * H : 0.0) + (double)T_ * D + 2.0 * BT * wide + BT * H +
                 2.0 * BT * V) +
           4.0 * BT;
    return DT_OK;
}

static double mlp_flops_per_token(const dt_model_state_t *m, int64_t T)
{
    (void)T;
    /* 6 per matmul parameter (fwd 2 + bwd 4); the lookup is no matmul */
    return 6.0 * (double)(m->desc->numel - m->desc->units[0].numel);
}

#define K (m->kern)
#define D_ ctx->dev, ctx->stream
/* Input of hidden layer l (l == NL: of the head) and its width. */
static const void *layer_in(const mlp_t *p, int64_t l, int64_t *width)
{
    *width = l ? p->H : p->D;
    return l ? p->out[l - 1] : p->x0;
}

static int mlp_forward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h)
{
    mlp_t *p = P(m);
    const int64_t B = m->B, T = m->T, BT = B * T, H = p->H, V = p->V;
    const uint32_t head = (uint32_t)p->NL + 1;
    const int ad = m->adtype, wd = m->wdtype;
    dt_unit_buffers_t b = {.struct_size = sizeof(dt_unit_buffers_t)};
    dt_unit_view_t v;
    int64_t in_w;

    DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, 0, 0, &b));
    DT_TRY_UNIT(dt_model_view(m, ctx, 0, b.params, 1, &v), "forward", 0);
    DT_TRY_UNIT(K->embedding_forward(D_, p->x0, m->tokens, v.a[EMB], p->zeros, ad, B, T, p->D),
                "forward", 0);
    DT_TRY(dt_model_probe(m, ctx, "activation embedding output", 0,
                          "the forward of embed.weight", p->x0, ad, (uint64_t)(BT * p->D)));
    DT_TRY(dt_model_hook(m, ctx, DT_POST_FORWARD, h, 0, 0, NULL));
    for (int64_t l = 0; l < p->NL; l++) {
        const uint32_t u = (uint32_t)l + 1;
        const void *in = layer_in(p, l, &in_w);
        DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, u, 0, &b));
        DT_TRY_UNIT(dt_model_view(m, ctx, u, b.params, 1, &v), "forward", u);
        DT_TRY_UNIT(K->matmul_forward(D_, p->pre[l], in, v.w[W], v.a[BIAS], ad, wd, BT, in_w, H),
                    "forward", u);
        char what[64] = "", after[64] = "";
        if (dt_model_probing(m)) {
            snprintf(what, sizeof what, "activation fc.%lld output", (long long)l);
            snprintf(after, sizeof after, "the forward of fc.%lld", (long long)l);
        }
        DT_TRY(dt_model_probe(m, ctx, what, u, after, p->pre[l], ad, (uint64_t)(BT * H)));
        DT_TRY_UNIT(K->gelu_forward(D_, p->out[l], p->pre[l], ad, BT * H), "forward", u);
        if (dt_model_probing(m)) {
            snprintf(what, sizeof what, "activation fc.%lld.gelu output", (long long)l);
            snprintf(after, sizeof after, "the forward of fc.%lld's GELU", (long long)l);
        }
        DT_TRY(dt_model_probe(m, ctx, what, u, after, p->out[l], ad, (uint64_t)(BT * H)));
        DT_TRY(dt_model_hook(m, ctx, DT_POST_FORWARD, h, u, 0, NULL));
    }
    const void *in = layer_in(p, p->NL, &in_w);
    DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, head, 0, &b));
    DT_TRY_UNIT(dt_model_view(m, ctx, head, b.params, 1, &v), "forward", head);
    DT_TRY_UNIT(K->matmul_forward(D_, m->logits, in, v.w[W], v.a[BIAS], ad, wd, BT, in_w, V),
                "forward", head);
    DT_TRY(dt_model_probe(m, ctx, "logits", head, "the forward of head.weight, head.bias",
                          m->logits, ad, (uint64_t)(BT * V)));
    DT_TRY(dt_model_loss_forward(m, ctx, head));
    DT_TRY(dt_model_hook(m, ctx, DT_POST_FORWARD, h, head, 0, NULL));
    return DT_OK;
}

static int mlp_backward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h,
                        float loss_scale)
{
    mlp_t *p = P(m);
    const int64_t B = m->B, T = m->T, BT = B * T, H = p->H, V = p->V;
    const uint32_t head = (uint32_t)p->NL + 1;
    const int ad = m->adtype, wd = m->wdtype;
    const uint64_t es = dt_model_act_size(m);
    dt_unit_buffers_t b = {.struct_size = sizeof(dt_unit_buffers_t)};
    dt_unit_view_t v;
    int64_t in_w;
    /* d(layer output) arrives in `dout`; d(layer input) goes to `din` */
    void *dout = p->da, *din = p->db;

    const void *in = layer_in(p, p->NL, &in_w);
    DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, head, 0, &b));
    DT_TRY_UNIT(dt_model_view(m, ctx, head, b.params, 0, &v), "backward", head);
    DT_TRY(dt_model_loss_backward(m, ctx, head, p->dlogits, loss_scale));
    DT_TRY_UNIT(dt_model_zero(ctx, dout, (uint64_t)(BT * in_w) * es), "backward", head);
    DT_TRY_UNIT(K->matmul_backward(D_, dout, b.grads + m->desc->units[head].params[W].offset,
                                   b.grads + m->desc->units[head].params[BIAS].offset,
                                   p->dlogits, in, v.w[W], ad, wd, BT, in_w, V),
                "backward", head);
    DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, head, 1, NULL));
    for (int64_t l = p->NL; l-- > 0;) {
        const uint32_t u = (uint32_t)l + 1;
        const dt_unit_desc_t *ud = &m->desc->units[u];
        in = layer_in(p, l, &in_w);
        DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, u, 0, &b));
        DT_TRY_UNIT(dt_model_view(m, ctx, u, b.params, dt_model_recomputes(m, l), &v), "backward",
                    u);
        if (dt_model_recomputes(m, l)) /* the pre-activation GELU's backward needs */
            DT_TRY_UNIT(K->matmul_forward(D_, p->pre[l], in, v.w[W], v.a[BIAS], ad, wd, BT, in_w,
                                          H),
                        "recompute", u);
        DT_TRY_UNIT(dt_model_zero(ctx, p->dpre, (uint64_t)(BT * H) * es), "backward", u);
        DT_TRY_UNIT(K->gelu_backward(D_, p->dpre, p->pre[l], dout, ad, BT * H), "backward", u);
        DT_TRY_UNIT(dt_model_zero(ctx, din, (uint64_t)(BT * in_w) * es), "backward", u);
        DT_TRY_UNIT(K->matmul_backward(D_, din, b.grads + ud->params[W].offset,
                                       b.grads + ud->params[BIAS].offset, p->dpre, in, v.w[W],
                                       ad, wd, BT, in_w, H),
                    "backward", u);
        DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, u, 1, NULL));
        void *t = dout;
        dout = din;
        din = t;
    }
    DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, 0, 0, &b));
    DT_TRY_UNIT(K->embedding_backward(D_, b.grads, NULL, dout, m->tokens, ad, B, T, p->D),
                "backward", 0);
    DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, 0, 1, NULL));
    return DT_OK;
}

static const dt_model_ops_v1_t mlp_ops = {
    .info = DT_PLUGIN_INFO_NOKEYS(MODEL, dt_model_ops_v1_t, "mlp", "1.0.0",
                                  "a bigram Linear+GELU stack ([model] mlp_in, mlp_hidden, "
                                  "mlp_layers): a non-transformer shape for testing strategies"),
    .create = mlp_create,
    .act_bytes = mlp_act_bytes,
    .alloc_acts = mlp_alloc_acts,
    .forward = mlp_forward,
    .backward = mlp_backward,
    .flops_per_token = mlp_flops_per_token,
    .free = mlp_free,
    .need_kernels = NULL, /* the core set: embedding, matmul, GELU, loss */
};

DT_PLUGIN_ENTRY(model, 1, dt_model_ops_v1_t, &mlp_ops)
