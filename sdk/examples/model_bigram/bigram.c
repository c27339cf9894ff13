/*
 * bigram.c - an example model plugin (dtrain/model.h): a factored bigram
 * language model, the smallest architecture with a matmul.
 *
 *   unit 0  "embedding"  embed.weight (V, width):   x = embed[token]
 *   unit 1  "head"       head.weight (V, width), head.bias (V):
 *                        logits = x @ head.weight^T + head.bias
 *   loss: the mean softmax cross-entropy of the target token at every
 *         position (the core's loss_forward / loss_backward)
 *
 * [model] arch = "bigram" selects it; [model] vocab_size is the core's
 * key, its width is its own table's: [bigram] width.  Each position sees
 * only its own token, so any sequence length works.  It runs whole (no
 * pipeline stages) at tensor degree 1; every data-parallel strategy runs
 * it.  Its tensors and their names are those of arch = "mlp" with
 * mlp_layers = 0 and mlp_in = width, so both start from the same
 * parameters and compute the same losses (tests/integration's
 * sdk_model checks that, tests/unit/sdk/test_model_bigram checks it against a
 * float64 reference).
 *
 * Everything core-side goes through m->svc (the static-inline dt_model_*
 * helpers the header defines under DT_MODEL_PLUGIN_HELPERS).
 */
#include <stdlib.h>

#define DT_MODEL_PLUGIN_HELPERS
#include "dtrain/dtrain.h"

typedef struct bigram {
    int64_t V, D;
    void *x;       /* (B,T,D) embeddings: the head's input */
    void *zeros;   /* (T,D): the embedding kernel's position table */
    void *dx;      /* (B,T,D) */
    void *dlogits; /* (B,T,V) */
} bigram_t;

static bigram_t *S(const dt_model_state_t *m) { return m->arch_state; }

static int bg_create(dt_model_state_t *m)
{
    bigram_t *b = calloc(1, sizeof *b);
    if (!b)
        return m->svc->set_error(DT_ERR_NOMEM, "bigram: out of memory");
    m->arch_state = b;
    int rc;
    if ((rc = m->svc->config_int(m, "model.vocab_size", &b->V)) ||
        (rc = m->svc->config_int(m, "bigram.width", &b->D)))
        return rc;
    if (m->tp > 1)
        return m->svc->set_error(DT_ERR_CONFIG,
                                 "%s: [parallel] tensor = %d: arch \"bigram\" has no "
                                 "tensor-parallel layout",
                                 dt_model_cfg_name(m), (int)m->tp);
    dt_model_add_key(m, "vocab_size", b->V);
    dt_model_add_key(m, "width", b->D);
    m->info->vocab_size = b->V;
    m->info->context = 0;
    if ((rc = dt_model_alloc_units(m, 2)) || (rc = dt_model_name_unit(m, 0, "embedding")) ||
        (rc = dt_model_add_param(m, 0, "embed.weight", 2, b->V, b->D, DT_TENSOR_EMBED, 0.02)) ||
        (rc = dt_model_name_unit(m, 1, "head")) ||
        (rc = dt_model_add_param(m, 1, "head.weight", 2, b->V, b->D, DT_TENSOR_MATRIX, 0.02)) ||
        (rc = dt_model_add_param(m, 1, "head.bias", 1, b->V, 0, DT_TENSOR_BIAS, 0)))
        return rc;
    return DT_OK;
}

static void bg_free(dt_model_state_t *m)
{
    free(m->arch_state);
    m->arch_state = NULL;
}

/* Unit 0 keeps the embeddings, unit 1 the probabilities; the rest is
 * workspace: the position table, dx, dlogits, logits and the f32 losses. */
static int bg_act_bytes(const dt_model_state_t *m, int64_t B, int64_t T, double *unit,
                        double *ws)
{
    const bigram_t *b = S(m);
    const double BT = (double)B * (double)T, es = (double)dt_model_act_size(m);
    unit[0] += es * BT * (double)b->D;
    unit[1] += es * BT * (double)b->V;
    *ws += es * ((double)T * (double)b->D + BT * (double)b->D + 2.0 * BT * (double)b->V) +
           4.0 * BT;
    return DT_OK;
}

static int bg_alloc_acts(dt_model_state_t *m, const dt_model_ctx_t *ctx)
{
    bigram_t *b = S(m);
    const int64_t BT = m->B * m->T;
    const size_t es = dt_model_act_size(m);
    int rc;
    m->act_owner = 0;
    if ((rc = dt_model_dalloc(m, ctx, BT * b->D, es, &b->x)))
        return rc;
    m->act_owner = 1;
    if ((rc = dt_model_dalloc(m, ctx, BT * b->V, es, &m->probs)))
        return rc;
    m->act_owner = DT_ACT_WORKSPACE;
    if ((rc = dt_model_dalloc(m, ctx, m->T * b->D, es, &b->zeros)) ||
        (rc = dt_model_zero(ctx, b->zeros, (uint64_t)(m->T * b->D) * es)) ||
        (rc = dt_model_dalloc(m, ctx, BT * b->D, es, &b->dx)) ||
        (rc = dt_model_dalloc(m, ctx, BT * b->V, es, &b->dlogits)) ||
        (rc = dt_model_dalloc(m, ctx, BT * b->V, es, &m->logits)) ||
        (rc = dt_model_dalloc(m, ctx, BT, 4, &m->losses)))
        return rc;
    return DT_OK;
}

static double bg_flops_per_token(const dt_model_state_t *m, int64_t T)
{
    (void)T;
    /* 6 per matmul parameter (forward 2, backward 4); the lookup is none */
    return 6.0 * (double)m->desc->units[1].numel;
}

#define K (m->kern)
#define DS ctx->dev, ctx->stream

static int bg_forward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h)
{
    bigram_t *b = S(m);
    const int64_t BT = m->B * m->T;
    const int ad = m->adtype, wd = m->wdtype;
    dt_unit_buffers_t ub = {.struct_size = sizeof ub};
    dt_unit_view_t v;
    DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, 0, 0, &ub));
    DT_TRY_UNIT(dt_model_view(m, ctx, 0, ub.params, 1, &v), "forward", 0);
    DT_TRY_UNIT(K->embedding_forward(DS, b->x, m->tokens, v.a[0], b->zeros, ad, m->B, m->T,
                                     b->D),
                "forward", 0);
    DT_TRY(dt_model_probe(m, ctx, "activation embedding output", 0,
                          "the forward of embed.weight", b->x, ad, (uint64_t)(BT * b->D)));
    DT_TRY(dt_model_hook(m, ctx, DT_POST_FORWARD, h, 0, 0, NULL));
    DT_TRY(dt_model_hook(m, ctx, DT_PRE_FORWARD, h, 1, 0, &ub));
    DT_TRY_UNIT(dt_model_view(m, ctx, 1, ub.params, 1, &v), "forward", 1);
    DT_TRY_UNIT(K->matmul_forward(DS, m->logits, b->x, v.w[0], v.a[1], ad, wd, BT, b->D, b->V),
                "forward", 1);
    DT_TRY(dt_model_probe(m, ctx, "logits", 1, "the forward of head.weight, head.bias",
                          m->logits, ad, (uint64_t)(BT * b->V)));
    DT_TRY(dt_model_loss_forward(m, ctx, 1));
    DT_TRY(dt_model_hook(m, ctx, DT_POST_FORWARD, h, 1, 0, NULL));
    return DT_OK;
}

static int bg_backward(dt_model_state_t *m, const dt_model_ctx_t *ctx, const dt_hook_t *h,
                       float loss_scale)
{
    bigram_t *b = S(m);
    const int64_t BT = m->B * m->T;
    const int ad = m->adtype, wd = m->wdtype;
    const dt_unit_desc_t *head = &m->desc->units[1];
    dt_unit_buffers_t ub = {.struct_size = sizeof ub};
    dt_unit_view_t v;
    DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, 1, 0, &ub));
    DT_TRY_UNIT(dt_model_view(m, ctx, 1, ub.params, 0, &v), "backward", 1);
    DT_TRY(dt_model_loss_backward(m, ctx, 1, b->dlogits, loss_scale));
    DT_TRY_UNIT(dt_model_zero(ctx, b->dx, (uint64_t)(BT * b->D) * dt_model_act_size(m)),
                "backward", 1);
    DT_TRY_UNIT(K->matmul_backward(DS, b->dx, ub.grads + head->params[0].offset,
                                   ub.grads + head->params[1].offset, b->dlogits, b->x, v.w[0],
                                   ad, wd, BT, b->D, b->V),
                "backward", 1);
    DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, 1, 1, NULL));
    DT_TRY(dt_model_hook(m, ctx, DT_PRE_BACKWARD, h, 0, 0, &ub));
    DT_TRY_UNIT(K->embedding_backward(DS, ub.grads, NULL, b->dx, m->tokens, ad, m->B, m->T,
                                      b->D),
                "backward", 0);
    DT_TRY(dt_model_hook(m, ctx, DT_POST_BACKWARD, h, 0, 1, NULL));
    return DT_OK;
}

static const dt_config_key_t bigram_keys[] = {
    {.name = "width", .type = DT_CFG_INT, .def = "16", DT_CFG_RANGE(1, 65536),
     .doc = "embedding width of each token"},
};

static const dt_model_ops_v1_t bigram_ops = {
    .info = DT_PLUGIN_INFO(MODEL, dt_model_ops_v1_t, "bigram", "0.1.0",
                           "example: a factored bigram model, embedding then a Linear head",
                           bigram_keys),
    .create = bg_create,
    .act_bytes = bg_act_bytes,
    .alloc_acts = bg_alloc_acts,
    .forward = bg_forward,
    .backward = bg_backward,
    .flops_per_token = bg_flops_per_token,
    .free = bg_free,
};

DT_PLUGIN_ENTRY(model, 1, dt_model_ops_v1_t, &bigram_ops)
