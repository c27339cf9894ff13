/*
 * core/model/generate.c - choosing the next token (greedy, temperature,
 * top-k), the generation loop over a decoder (generate.h), and the decoder
 * itself as the model plugin's decoder slots (dtrain/model.h).
 */
#include "model/generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

struct dt_decoder {
    const dt_model_ops_t *ops;  /* the model plugin's */
    dt_model_decoder_t *d;      /* its decoder */
};

int dt_decoder_create(dt_model_t *m, const dt_model_ctx_t *ctx, void *const *params,
                      int64_t max_len, dt_decoder_t **out)
{
    *out = NULL;
    const dt_model_ops_t *ops = dt_model_ops(m);
    if (!DT_HAS_OP(dt_model_ops_v1_t, ops, decoder_create) ||
        !DT_HAS_OP(dt_model_ops_v1_t, ops, decoder_free))
        return dt_err_set(DT_ERR_UNSUPPORTED,
                          "decoder: arch %s: generation needs a model plugin with a decoder "
                          "(gpt2 and llama have one)",
                          dt_model_info(m)->arch);
    if (dt_model_info(m)->tensor_parallel > 1)
        return dt_err_set(DT_ERR_UNSUPPORTED,
                          "decoder: generation runs the whole model, not a tensor-parallel part");
    dt_decoder_t *d = calloc(1, sizeof *d);
    if (!d)
        return dt_err_set(DT_ERR_NOMEM, "decoder: out of memory");
    d->ops = ops;
    int rc = ops->decoder_create(dt_model_state(m), ctx, params, max_len, &d->d);
    if (rc) {
        free(d);
        return rc;
    }
    *out = d;
    return DT_OK;
}

int dt_decoder_step(dt_decoder_t *d, int32_t token, float *logits)
{
    return d->ops->decoder_step(d->d, token, logits);
}

int64_t dt_decoder_len(const dt_decoder_t *d) { return d->ops->decoder_len(d->d); }

void dt_decoder_reset(dt_decoder_t *d) { d->ops->decoder_reset(d->d); }

void dt_decoder_free(dt_decoder_t *d)
{
    if (!d)
        return;
    d->ops->decoder_free(d->d);
    free(d);
}

/* splitmix64: small, seedable, and the same on every platform. */
static uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static double next_unit(uint64_t *s) { return (double)(next_u64(s) >> 11) * 0x1p-53; }

int dt_pick_init(dt_pick_t *p, const dt_pick_opts_t *opts, int64_t vocab)
{
    memset(p, 0, sizeof *p);
    if (vocab < 1 || opts->temperature < 0 || !isfinite(opts->temperature) || opts->top_k < 0)
        return dt_err_set(DT_ERR_INVALID,
                          "sampling: vocab %lld, temperature %g, top-k %lld: need vocab >= 1, "
                          "a finite temperature >= 0 and top-k >= 0",
                          (long long)vocab, opts->temperature, (long long)opts->top_k);
    p->opts = *opts;
    p->rng = opts->seed;
    p->vocab = vocab;
    p->cand = malloc((size_t)vocab * sizeof *p->cand);
    p->prob = malloc((size_t)vocab * sizeof *p->prob);
    if (!p->cand || !p->prob) {
        dt_pick_free(p);
        return dt_err_set(DT_ERR_NOMEM, "sampling: out of memory");
    }
    return DT_OK;
}

void dt_pick_free(dt_pick_t *p)
{
    free(p->cand);
    free(p->prob);
    p->cand = NULL;
    p->prob = NULL;
}

/* Candidates by descending logit, the lower id first on ties, so the
 * order (and with it every draw) is fully determined by the logits. */
static int by_logit(const void *a, const void *b)
{
    const struct dt_pick_cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

int dt_pick_next(dt_pick_t *p, const float *logits, int32_t *token)
{
    const int64_t V = p->vocab;
    int64_t best = 0;
    for (int64_t i = 0; i < V; i++) {
        if (!isfinite(logits[i]))
            return dt_err_set(DT_ERR_DATA, "sampling: logit of token %lld is %g",
                              (long long)i, (double)logits[i]);
        if (logits[i] > logits[best])
            best = i;
    }
    int64_t k = p->opts.top_k == 0 || p->opts.top_k > V ? V : p->opts.top_k;
    if (p->opts.temperature == 0 || k == 1) {
        *token = (int32_t)best;
        return DT_OK;
    }
    for (int64_t i = 0; i < V; i++)
        p->cand[i] = (struct dt_pick_cand){logits[i], (int32_t)i};
    if (k < V) /* only the top k need an order: sorting all is simplest and
                * costs little next to a forward */
        qsort(p->cand, (size_t)V, sizeof *p->cand, by_logit);
    const double mx = logits[best], T = p->opts.temperature;
    double sum = 0;
    for (int64_t i = 0; i < k; i++)
        sum += p->prob[i] = exp(((double)p->cand[i].logit - mx) / T);
    const double u = next_unit(&p->rng) * sum;
    double c = 0;
    for (int64_t i = 0; i < k; i++) {
        c += p->prob[i];
        if (u < c) {
            *token = p->cand[i].id;
            return DT_OK;
        }
    }
    *token = p->cand[k - 1].id; /* u rounded up to the sum */
    return DT_OK;
}

int dt_generate(dt_decoder_t *d, dt_pick_t *p, const int32_t *prompt, int64_t n_prompt,
                int64_t n_new, int32_t *out, void (*emit)(void *arg, int32_t token), void *arg)
{
    if (n_prompt < 1)
        return dt_err_set(DT_ERR_INVALID, "generation needs a prompt of at least one token");
    float *logits = malloc((size_t)p->vocab * sizeof *logits);
    if (!logits)
        return dt_err_set(DT_ERR_NOMEM, "generation: out of memory");
    int rc = DT_OK;
    for (int64_t i = 0; i < n_prompt && !rc; i++)
        rc = dt_decoder_step(d, prompt[i], logits);
    for (int64_t i = 0; i < n_new && !rc; i++) {
        int32_t t;
        if ((rc = dt_pick_next(p, logits, &t)))
            break;
        if (out)
            out[i] = t;
        if (emit)
            emit(arg, t);
        if (i + 1 < n_new)
            rc = dt_decoder_step(d, t, logits);
    }
    free(logits);
    return rc;
}
