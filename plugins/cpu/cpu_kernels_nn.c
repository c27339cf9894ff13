/*
 * plugins/cpu/cpu_kernels_nn.c - the non-matmul layers of a GPT: token and
 * position embedding, layernorm, GELU, residual add, axpy, and fused
 * softmax + cross-entropy.
 *
 * Parallel work is split so that every output element is produced by
 * exactly one thread in a fixed order: over rows where rows are
 * independent, over columns where the backward pass sums over rows
 * (layernorm's dweight, embedding's dwte).  Results are therefore the same
 * bits at any thread count, and nothing needs atomics or per-thread copies
 * of a gradient.
 *
 * bf16 activations (cpu_bf16.h) have tasks of their own beside the f32
 * ones, sharing the f32 arithmetic through the inline row and element
 * functions below: element-wise kernels widen and round in the loop, row
 * kernels (layernorm, the softmaxes) widen a row into a per-thread slice
 * of the device scratch, run the f32 row code on it and round what they
 * store.  The f32 tasks are unchanged by them.
 */
#include <math.h>
#include <string.h>

#include "cpu_bf16.h"
#include "cpu_internal.h"
#include "cpu_math.h"

/* Rows per chunk so one chunk holds at least CPU_GRAIN elements. */
static int64_t row_grain(int64_t cols)
{
    return cols > 0 ? CPU_GRAIN / cols + 1 : CPU_GRAIN;
}

/* ------------------------------------------------------------- embedding */

typedef struct {
    float *out;
    float *dwte, *dwpe;
    const float *dout;
    const int32_t *tokens;
    const float *wte, *wpe; /* wpe may be NULL */
    int64_t B, T, C;
    int64_t v0, nv;         /* wte holds vocabulary rows [v0, v0 + nv) */
} emb_t;

static void emb_fwd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const emb_t *a = ctx;
    int64_t C = a->C;
    for (int64_t bt = b; bt < e; bt++) {
        int64_t t = bt % a->T, row = (int64_t)a->tokens[bt] - a->v0;
        float *restrict o = a->out + bt * C;
        if (row >= 0 && row < a->nv) {
            const float *restrict we = a->wte + row * C;
            for (int64_t c = 0; c < C; c++)
                o[c] = we[c];
        } else {
            for (int64_t c = 0; c < C; c++)
                o[c] = 0.0f;
        }
        if (a->wpe) {
            const float *restrict wp = a->wpe + t * C;
            for (int64_t c = 0; c < C; c++)
                o[c] += wp[c];
        }
    }
}

/* bf16: out = wte row + wpe row in f32, rounded (a row outside the range
 * adds to 0; without wpe the row is copied, exact). */
CPU_CLONES static void emb_fwd_bf16_task(void *ctx, int64_t b, int64_t e,
                                         int tid)
{
    const emb_t *a = ctx;
    int64_t C = a->C;
    for (int64_t bt = b; bt < e; bt++) {
        int64_t t = bt % a->T, row = (int64_t)a->tokens[bt] - a->v0;
        int in = row >= 0 && row < a->nv;
        uint16_t *restrict o = CPU_BF16(a->out) + bt * C;
        const uint16_t *restrict we = CPU_CBF16(a->wte) + (in ? row : 0) * C;
        if (!a->wpe) {
            for (int64_t c = 0; c < C; c++)
                o[c] = in ? we[c] : 0;
            continue;
        }
        const uint16_t *restrict wp = CPU_CBF16(a->wpe) + t * C;
        if (in)
            for (int64_t c = 0; c < C; c++)
                o[c] = dt_f32_to_bf16(dt_bf16_to_f32(we[c]) +
                                      dt_bf16_to_f32(wp[c]));
        else
            for (int64_t c = 0; c < C; c++)
                o[c] = dt_f32_to_bf16(0.0f + dt_bf16_to_f32(wp[c]));
    }
}

/* Channels [b, e) of every position: a token repeated in the batch adds
 * into the same dwte row, so threads split channels, not positions. */
static void emb_bwd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const emb_t *a = ctx;
    int64_t C = a->C;
    for (int64_t bt = 0; bt < a->B * a->T; bt++) {
        const float *restrict g = a->dout + bt * C;
        int64_t row = (int64_t)a->tokens[bt] - a->v0;
        if (a->dwte && row >= 0 && row < a->nv) {
            float *restrict dw = a->dwte + row * C;
            for (int64_t c = b; c < e; c++)
                dw[c] += g[c];
        }
        if (a->dwpe) {
            float *restrict dp = a->dwpe + (bt % a->T) * C;
            for (int64_t c = b; c < e; c++)
                dp[c] += g[c];
        }
    }
}

/* bf16 dout into the f32 gradients (exact loads, f32 sums). */
CPU_CLONES static void emb_bwd_bf16_task(void *ctx, int64_t b, int64_t e,
                                         int tid)
{
    const emb_t *a = ctx;
    int64_t C = a->C;
    for (int64_t bt = 0; bt < a->B * a->T; bt++) {
        const uint16_t *restrict g = CPU_CBF16(a->dout) + bt * C;
        int64_t row = (int64_t)a->tokens[bt] - a->v0;
        if (a->dwte && row >= 0 && row < a->nv) {
            float *restrict dw = a->dwte + row * C;
            for (int64_t c = b; c < e; c++)
                dw[c] += dt_bf16_to_f32(g[c]);
        }
        if (a->dwpe) {
            float *restrict dp = a->dwpe + (bt % a->T) * C;
            for (int64_t c = b; c < e; c++)
                dp[c] += dt_bf16_to_f32(g[c]);
        }
    }
}

static int check_tokens(dt_device_t *d, const char *op, const int32_t *tokens,
                        int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0)
            return CPU_INVALID(d, "%s: tokens[%lld] = %d is negative", op,
                               (long long)i, (int)tokens[i]);
    return DT_OK;
}

static int check_vocab_range(dt_device_t *d, const char *op, int64_t v0,
                             int64_t nv)
{
    if (v0 < 0 || nv < 1)
        return CPU_INVALID(d, "%s: vocabulary ids [%lld, %lld + %lld)", op,
                           (long long)v0, (long long)v0, (long long)nv);
    return DT_OK;
}

/* Both embedding forwards: the whole table (v0 0, nv: every token id) or
 * a vocabulary range of it; wpe may be NULL only for the range. */
static int embedding_forward(dt_device_t *d, dt_stream_t *s, const char *op,
                             void *out, const int32_t *tokens, const void *wte,
                             const void *wpe, int need_wpe, int dtype,
                             int64_t B, int64_t T, int64_t C, int64_t v0,
                             int64_t nv)
{
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, B);
    CPU_DIM(d, op, T);
    CPU_DIM(d, op, C);
    int64_t BT, BTC, TC;
    int rc = cpu_check_product(d, op, B, T, &BT);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, BT, C, &BTC);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, T, C, &TC);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, out, BTC);
    CPU_PTR(d, op, tokens, BT);
    CPU_PTR(d, op, wte, BTC);
    if (need_wpe)
        CPU_PTR(d, op, wpe, TC);
    if (BTC == 0)
        return DT_OK;
    rc = check_tokens(d, op, tokens, BT);
    if (rc != DT_OK)
        return rc;
    emb_t a = {.out = out, .tokens = tokens, .wte = wte, .wpe = wpe,
               .B = B, .T = T, .C = C, .v0 = v0, .nv = nv};
    cpu_lock(d);
    cpu_pool_run(d->pool, BT, row_grain(C),
                 dtype == DT_BF16 ? emb_fwd_bf16_task : emb_fwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

static int embedding_backward(dt_device_t *d, dt_stream_t *s, const char *op,
                              float *dwte, float *dwpe, const void *dout,
                              const int32_t *tokens, int dtype, int64_t B,
                              int64_t T, int64_t C, int64_t v0, int64_t nv)
{
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, B);
    CPU_DIM(d, op, T);
    CPU_DIM(d, op, C);
    int64_t BT, BTC;
    int rc = cpu_check_product(d, op, B, T, &BT);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, BT, C, &BTC);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, dout, BTC);
    CPU_PTR(d, op, tokens, BT);
    if (BTC == 0 || (!dwte && !dwpe))
        return DT_OK;
    rc = check_tokens(d, op, tokens, BT);
    if (rc != DT_OK)
        return rc;
    emb_t a = {.dwte = dwte, .dwpe = dwpe, .dout = dout, .tokens = tokens,
               .B = B, .T = T, .C = C, .v0 = v0, .nv = nv};
    cpu_lock(d);
    /* Each chunk walks all B*T rows: ask for enough channels to pay. */
    cpu_pool_run(d->pool, C, BT >= CPU_GRAIN ? 16 : CPU_GRAIN / BT + 16,
                 dtype == DT_BF16 ? emb_bwd_bf16_task : emb_bwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

int cpu_embedding_forward(dt_device_t *d, dt_stream_t *s, void *out,
                          const int32_t *tokens, const void *wte,
                          const void *wpe, int dtype, int64_t B, int64_t T,
                          int64_t C)
{
    return embedding_forward(d, s, "embedding_forward", out, tokens, wte, wpe,
                             1, dtype, B, T, C, 0, INT64_MAX);
}

int cpu_embedding_backward(dt_device_t *d, dt_stream_t *s, float *dwte,
                           float *dwpe, const void *dout,
                           const int32_t *tokens, int dtype, int64_t B,
                           int64_t T, int64_t C)
{
    return embedding_backward(d, s, "embedding_backward", dwte, dwpe, dout,
                              tokens, dtype, B, T, C, 0, INT64_MAX);
}

int cpu_vocab_embedding_forward(dt_device_t *d, dt_stream_t *s, void *out,
                                const int32_t *tokens, const void *wte,
                                const void *wpe, int dtype, int64_t B,
                                int64_t T, int64_t C, int64_t v0, int64_t nv)
{
    static const char op[] = "vocab_embedding_forward";
    int rc = check_vocab_range(d, op, v0, nv);
    if (rc != DT_OK)
        return rc;
    return embedding_forward(d, s, op, out, tokens, wte, wpe, 0, dtype, B, T,
                             C, v0, nv);
}

int cpu_vocab_embedding_backward(dt_device_t *d, dt_stream_t *s, float *dwte,
                                 float *dwpe, const void *dout,
                                 const int32_t *tokens, int dtype, int64_t B,
                                 int64_t T, int64_t C, int64_t v0, int64_t nv)
{
    static const char op[] = "vocab_embedding_backward";
    int rc = check_vocab_range(d, op, v0, nv);
    if (rc != DT_OK)
        return rc;
    return embedding_backward(d, s, op, dwte, dwpe, dout, tokens, dtype, B, T,
                              C, v0, nv);
}

/* ------------------------------------------------------------- layernorm */

#define CPU_LN_EPS 1e-5

typedef struct {
    float *out, *mean, *rstd;
    float *dinp, *dweight, *dbias;
    const float *dout, *inp, *weight, *bias;
    const float *cmean, *crstd;
    int64_t N, C;
    /* bf16: weight and bias widened (shared), and `stride` floats of rows
     * per thread */
    const float *wf, *bf;
    float *scratch;
    int64_t stride;
} ln_t;

/* One row: o = (x - mean) rstd w + b. */
static inline void ln_fwd_row(float *restrict o, float *mean, float *rstd,
                              const float *restrict x, const float *restrict w,
                              const float *restrict bs, int64_t C)
{
    /* Two passes in double: the mean first, then the variance around
     * it, so large offsets do not cancel. */
    double mu = cpu_sum_f32(x, C) / (double)C;
    double var = cpu_sumsqdev_f32(x, mu, C) / (double)C;
    float m = (float)mu;
    float rs = (float)(1.0 / sqrt(var + CPU_LN_EPS));
    for (int64_t c = 0; c < C; c++)
        o[c] = (x[c] - m) * rs * w[c] + bs[c];
    *mean = m;
    *rstd = rs;
}

CPU_CLONES static void ln_fwd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const ln_t *a = ctx;
    int64_t C = a->C;
    for (int64_t n = b; n < e; n++)
        ln_fwd_row(a->out + n * C, a->mean + n, a->rstd + n, a->inp + n * C,
                   a->weight, a->bias, C);
}

/* bf16: the row widened, normalised in f32, rounded. */
CPU_CLONES static void ln_fwd_bf16_task(void *ctx, int64_t b, int64_t e,
                                        int tid)
{
    const ln_t *a = ctx;
    int64_t C = a->C;
    float *x = a->scratch + (int64_t)tid * a->stride, *o = x + cpu_pad16(C);
    for (int64_t n = b; n < e; n++) {
        cpu_bf16_widen(x, CPU_CBF16(a->inp) + n * C, C);
        ln_fwd_row(o, a->mean + n, a->rstd + n, x, a->wf, a->bf, C);
        cpu_bf16_round(CPU_BF16(a->out) + n * C, o, C);
    }
}

/* The bf16 runs' scratch, with kmu held: `shared` rows of C floats (the
 * widened weight, bias), then `per` rows for each thread; the widened
 * weight (and bias) filled in. */
static int ln_bf16_scratch(dt_device_t *d, const char *op, ln_t *a,
                           const void *weight, const void *bias, int per)
{
    const int64_t pc = cpu_pad16(a->C), shared = bias ? 2 : 1;
    a->stride = per * pc;
    void *p = NULL;
    int rc = cpu_scratch(d, (uint64_t)(shared + d->threads * (int64_t)per) *
                                (uint64_t)pc * sizeof(float), &p, op);
    if (rc != DT_OK)
        return rc;
    float *f = p;
    cpu_bf16_widen(f, weight, a->C);
    a->wf = f;
    if (bias) {
        cpu_bf16_widen(f + pc, bias, a->C);
        a->bf = f + pc;
    }
    a->scratch = f + shared * pc;
    return DT_OK;
}

int cpu_layernorm_forward(dt_device_t *d, dt_stream_t *s, void *out,
                          float *mean, float *rstd, const void *inp,
                          const void *weight, const void *bias, int dtype,
                          int64_t N, int64_t C)
{
    static const char op[] = "layernorm_forward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, N);
    CPU_DIM(d, op, C);
    int64_t NC;
    int rc = cpu_check_product(d, op, N, C, &NC);
    if (rc != DT_OK)
        return rc;
    if (C == 0 && N > 0)
        return CPU_INVALID(d, "%s: C = 0: nothing to normalise over", op);
    CPU_PTR(d, op, out, NC);
    CPU_PTR(d, op, inp, NC);
    CPU_PTR(d, op, mean, N);
    CPU_PTR(d, op, rstd, N);
    CPU_PTR(d, op, weight, C);
    CPU_PTR(d, op, bias, C);
    ln_t a = {.out = out, .mean = mean, .rstd = rstd, .inp = inp,
              .weight = weight, .bias = bias, .N = N, .C = C};
    if (N == 0)
        return DT_OK;
    cpu_lock(d);
    if (dtype == DT_BF16 &&
        (rc = ln_bf16_scratch(d, op, &a, weight, bias, 2)) != DT_OK) {
        cpu_unlock(d);
        return rc;
    }
    cpu_pool_run(d->pool, N, row_grain(C),
                 dtype == DT_BF16 ? ln_fwd_bf16_task : ln_fwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

/* dinp, row by row:
 *   g = w * dout;  dinp += (g - mean(g) - norm * mean(g * norm)) * rstd */
static inline void ln_bwd_row(float *restrict dx, const float *restrict x,
                              const float *restrict g, const float *restrict w,
                              float m, float rs, int64_t C)
{
    /* sums of w g and w g norm, eight double lanes each */
    double sg[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    double sgn[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t c = 0;
    for (; c + 8 <= C; c += 8)
        for (int j = 0; j < 8; j++) {
            float wg = w[c + j] * g[c + j];
            sg[j] += wg;
            sgn[j] += (double)wg * ((x[c + j] - m) * rs);
        }
    for (int j = 0; c < C; c++, j++) {
        float wg = w[c] * g[c];
        sg[j] += wg;
        sgn[j] += (double)wg * ((x[c] - m) * rs);
    }
    for (int j = 1; j < 8; j++) {
        sg[0] += sg[j];
        sgn[0] += sgn[j];
    }
    float mg = (float)(sg[0] / (double)C);
    float mgn = (float)(sgn[0] / (double)C);
    for (int64_t c = 0; c < C; c++) {
        float norm = (x[c] - m) * rs;
        dx[c] += (w[c] * g[c] - mg - norm * mgn) * rs;
    }
}

CPU_CLONES static void ln_bwd_rows_task(void *ctx, int64_t b, int64_t e,
                                        int tid)
{
    const ln_t *a = ctx;
    int64_t C = a->C;
    for (int64_t n = b; n < e; n++)
        ln_bwd_row(a->dinp + n * C, a->inp + n * C, a->dout + n * C,
                   a->weight, a->cmean[n], a->crstd[n], C);
}

/* bf16: x, dout and dinp widened, dinp added to in f32 and rounded once. */
CPU_CLONES static void ln_bwd_rows_bf16_task(void *ctx, int64_t b, int64_t e,
                                             int tid)
{
    const ln_t *a = ctx;
    int64_t C = a->C, pc = cpu_pad16(C);
    float *x = a->scratch + (int64_t)tid * a->stride, *g = x + pc, *dx = g + pc;
    for (int64_t n = b; n < e; n++) {
        uint16_t *dxh = CPU_BF16(a->dinp) + n * C;
        cpu_bf16_widen(x, CPU_CBF16(a->inp) + n * C, C);
        cpu_bf16_widen(g, CPU_CBF16(a->dout) + n * C, C);
        cpu_bf16_widen(dx, dxh, C);
        ln_bwd_row(dx, x, g, a->wf, a->cmean[n], a->crstd[n], C);
        cpu_bf16_round(dxh, dx, C);
    }
}

/* dweight/dbias for channels [b, e), summing rows in order. */
CPU_CLONES static void ln_bwd_cols_task(void *ctx, int64_t b, int64_t e,
                                        int tid)
{
    const ln_t *a = ctx;
    int64_t C = a->C;
    float *restrict dw = a->dweight;
    float *restrict db = a->dbias;
    for (int64_t n = 0; n < a->N; n++) {
        const float *restrict x = a->inp + n * C;
        const float *restrict g = a->dout + n * C;
        float m = a->cmean[n], rs = a->crstd[n];
        if (db)
            for (int64_t c = b; c < e; c++)
                db[c] += g[c];
        if (dw)
            for (int64_t c = b; c < e; c++)
                dw[c] += (x[c] - m) * rs * g[c];
    }
}

CPU_CLONES static void ln_bwd_cols_bf16_task(void *ctx, int64_t b, int64_t e,
                                             int tid)
{
    const ln_t *a = ctx;
    int64_t C = a->C;
    float *restrict dw = a->dweight;
    float *restrict db = a->dbias;
    for (int64_t n = 0; n < a->N; n++) {
        const uint16_t *restrict x = CPU_CBF16(a->inp) + n * C;
        const uint16_t *restrict g = CPU_CBF16(a->dout) + n * C;
        float m = a->cmean[n], rs = a->crstd[n];
        if (db)
            for (int64_t c = b; c < e; c++)
                db[c] += dt_bf16_to_f32(g[c]);
        if (dw)
            for (int64_t c = b; c < e; c++)
                dw[c] += (dt_bf16_to_f32(x[c]) - m) * rs * dt_bf16_to_f32(g[c]);
    }
}

int cpu_layernorm_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                           float *dweight, float *dbias, const void *dout,
                           const void *inp, const void *weight,
                           const float *mean, const float *rstd, int dtype,
                           int64_t N, int64_t C)
{
    static const char op[] = "layernorm_backward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, N);
    CPU_DIM(d, op, C);
    int64_t NC;
    int rc = cpu_check_product(d, op, N, C, &NC);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, dout, NC);
    CPU_PTR(d, op, inp, NC);
    CPU_PTR(d, op, mean, N);
    CPU_PTR(d, op, rstd, N);
    if (dinp)
        CPU_PTR(d, op, weight, C);
    if (NC == 0)
        return DT_OK;
    ln_t a = {.dinp = dinp, .dweight = dweight, .dbias = dbias, .dout = dout,
              .inp = inp, .weight = weight, .cmean = mean, .crstd = rstd,
              .N = N, .C = C};
    const int bf = dtype == DT_BF16;
    cpu_lock(d);
    /* scratch first: a budget failure must leave every gradient as it was */
    if (bf && dinp && (rc = ln_bf16_scratch(d, op, &a, weight, NULL, 3)) != DT_OK) {
        cpu_unlock(d);
        return rc;
    }
    if (dinp)
        cpu_pool_run(d->pool, N, row_grain(C),
                     bf ? ln_bwd_rows_bf16_task : ln_bwd_rows_task, &a);
    if (dweight || dbias)
        cpu_pool_run(d->pool, C, N >= CPU_GRAIN ? 16 : CPU_GRAIN / N + 16,
                     bf ? ln_bwd_cols_bf16_task : ln_bwd_cols_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

/* ------------------------------------------------------------------ GELU */

#define CPU_GELU_S 0.7978845608028654f /* sqrt(2 / pi) */
#define CPU_GELU_K 0.044715f

typedef struct {
    float *out;
    const float *inp, *dout;
    int64_t n;
} ew_t;

/* GPT-2's x/2 (1 + tanh u), u = S (x + K x^3), computed as the identical
 * x sigmoid(2u) = x / (1 + exp(-2u)): one vectorisable exp, and no
 * cancellation in 1 + tanh u for negative x. */
static inline float gelu_f32(float xi)
{
    float u = CPU_GELU_S * (xi + CPU_GELU_K * xi * xi * xi);
    return xi / (1.0f + cpu_expf(-2.0f * u));
}

/* With s = sigmoid(2u) and du = S (1 + 3K x^2):
 *   d/dx [x s] = s + 2 x s (1 - s) du,
 * where 1 - s = exp(-2u) s without cancellation (1 when exp overflows and
 * s is 0). */
static inline float gelu_grad_f32(float xi)
{
    float u = CPU_GELU_S * (xi + CPU_GELU_K * xi * xi * xi);
    float en = cpu_expf(-2.0f * u);
    float sg = 1.0f / (1.0f + en);
    float om = en < INFINITY ? en * sg : 1.0f;
    float du = CPU_GELU_S * (1.0f + 3.0f * CPU_GELU_K * xi * xi);
    return sg + 2.0f * xi * sg * om * du;
}

CPU_CLONES static void gelu_fwd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const ew_t *a = ctx;
    float *restrict o = a->out;
    const float *restrict x = a->inp;
    for (int64_t i = b; i < e; i++)
        o[i] = gelu_f32(x[i]);
}

CPU_CLONES static void gelu_bwd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const ew_t *a = ctx;
    float *restrict dx = a->out;
    const float *restrict x = a->inp;
    const float *restrict g = a->dout;
    for (int64_t i = b; i < e; i++)
        dx[i] += gelu_grad_f32(x[i]) * g[i];
}

CPU_CLONES static void gelu_fwd_bf16_task(void *ctx, int64_t b, int64_t e,
                                          int tid)
{
    const ew_t *a = ctx;
    uint16_t *restrict o = CPU_BF16(a->out);
    const uint16_t *restrict x = CPU_CBF16(a->inp);
    for (int64_t i = b; i < e; i++)
        o[i] = dt_f32_to_bf16(gelu_f32(dt_bf16_to_f32(x[i])));
}

CPU_CLONES static void gelu_bwd_bf16_task(void *ctx, int64_t b, int64_t e,
                                          int tid)
{
    const ew_t *a = ctx;
    uint16_t *restrict dx = CPU_BF16(a->out);
    const uint16_t *restrict x = CPU_CBF16(a->inp);
    const uint16_t *restrict g = CPU_CBF16(a->dout);
    for (int64_t i = b; i < e; i++)
        dx[i] = dt_f32_to_bf16(dt_bf16_to_f32(dx[i]) +
                               gelu_grad_f32(dt_bf16_to_f32(x[i])) *
                                   dt_bf16_to_f32(g[i]));
}

int cpu_gelu_forward(dt_device_t *d, dt_stream_t *s, void *out,
                     const void *inp, int dtype, int64_t n)
{
    static const char op[] = "gelu_forward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, n);
    CPU_PTR(d, op, out, n);
    CPU_PTR(d, op, inp, n);
    ew_t a = {.out = out, .inp = inp, .n = n};
    cpu_lock(d);
    cpu_pool_run(d->pool, n, CPU_GRAIN,
                 dtype == DT_BF16 ? gelu_fwd_bf16_task : gelu_fwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

int cpu_gelu_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                      const void *inp, const void *dout, int dtype, int64_t n)
{
    static const char op[] = "gelu_backward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, n);
    CPU_PTR(d, op, dinp, n);
    CPU_PTR(d, op, inp, n);
    CPU_PTR(d, op, dout, n);
    ew_t a = {.out = dinp, .inp = inp, .dout = dout, .n = n};
    cpu_lock(d);
    cpu_pool_run(d->pool, n, CPU_GRAIN,
                 dtype == DT_BF16 ? gelu_bwd_bf16_task : gelu_bwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

/* ------------------------------------------------------- residual, axpy */

typedef struct {
    float *y;
    const float *a, *b;
    float alpha;
} add_t;

/* No restrict: out may alias a or b (the contract allows it). */
static void residual_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const add_t *a = ctx;
    float *o = a->y;
    const float *x = a->a, *y = a->b;
    for (int64_t i = b; i < e; i++)
        o[i] = x[i] + y[i];
}

static void axpy_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const add_t *a = ctx;
    float *restrict y = a->y;
    const float *restrict x = a->a;
    float alpha = a->alpha;
    for (int64_t i = b; i < e; i++)
        y[i] += alpha * x[i];
}

/* bf16: the same f32 add or multiply-add, rounded once. */
CPU_CLONES static void residual_bf16_task(void *ctx, int64_t b, int64_t e,
                                          int tid)
{
    const add_t *a = ctx;
    uint16_t *o = CPU_BF16(a->y);
    const uint16_t *x = CPU_CBF16(a->a), *y = CPU_CBF16(a->b);
    for (int64_t i = b; i < e; i++)
        o[i] = dt_f32_to_bf16(dt_bf16_to_f32(x[i]) + dt_bf16_to_f32(y[i]));
}

CPU_CLONES static void axpy_bf16_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const add_t *a = ctx;
    uint16_t *restrict y = CPU_BF16(a->y);
    const uint16_t *restrict x = CPU_CBF16(a->a);
    float alpha = a->alpha;
    for (int64_t i = b; i < e; i++)
        y[i] = dt_f32_to_bf16(dt_bf16_to_f32(y[i]) + alpha * dt_bf16_to_f32(x[i]));
}

int cpu_residual_forward(dt_device_t *d, dt_stream_t *s, void *out,
                         const void *a, const void *b, int dtype, int64_t n)
{
    static const char op[] = "residual_forward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, n);
    CPU_PTR(d, op, out, n);
    CPU_PTR(d, op, a, n);
    CPU_PTR(d, op, b, n);
    add_t t = {.y = out, .a = a, .b = b};
    cpu_lock(d);
    cpu_pool_run(d->pool, n, CPU_GRAIN,
                 dtype == DT_BF16 ? residual_bf16_task : residual_task, &t);
    cpu_unlock(d);
    return DT_OK;
}

int cpu_axpy(dt_device_t *d, dt_stream_t *s, void *y, const void *x,
             int dtype, float alpha, int64_t n)
{
    static const char op[] = "axpy";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_elems(d, op, dtype));
    CPU_DIM(d, op, n);
    CPU_PTR(d, op, y, n);
    CPU_PTR(d, op, x, n);
    if (x == y && n > 0)
        return CPU_INVALID(d, "%s: x and y are the same buffer", op);
    add_t t = {.y = y, .a = x, .alpha = alpha};
    cpu_lock(d);
    cpu_pool_run(d->pool, n, CPU_GRAIN,
                 dtype == DT_BF16 ? axpy_bf16_task : axpy_task, &t);
    cpu_unlock(d);
    return DT_OK;
}

/* ------------------------------------------------- softmax cross-entropy */

typedef struct {
    float *losses, *probs, *dlogits;
    const float *logits, *cprobs;
    const int32_t *targets;
    float dloss;
    int64_t N, V;
    int64_t v0;   /* the columns are vocabulary ids [v0, v0 + V) */
    int phase;    /* vocab_xent_forward's */
    float *stats; /* vocab_xent_forward's (3N) */
    float *scratch; /* bf16 forwards: a row of `stride` floats per thread */
    int64_t stride;
} xent_t;

CPU_CLONES static void xent_fwd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const xent_t *a = ctx;
    int64_t V = a->V;
    for (int64_t n = b; n < e; n++) {
        const float *restrict x = a->logits + n * V;
        float *restrict p = a->probs + n * V;
        float mx = cpu_max_f32(x, V);
        for (int64_t v = 0; v < V; v++) /* vectorised */
            p[v] = cpu_expf(x[v] - mx);
        double sum = cpu_sum_f32(p, V);
        float inv = (float)(1.0 / sum);
        for (int64_t v = 0; v < V; v++)
            p[v] *= inv;
        /* log-sum-exp form: stays finite when probs[target] underflows. */
        a->losses[n] = (float)(log(sum) - ((double)x[a->targets[n]] - mx));
    }
}

CPU_CLONES static void xent_bwd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const xent_t *a = ctx;
    int64_t V = a->V;
    float dl = a->dloss;
    for (int64_t n = b; n < e; n++) {
        const float *restrict p = a->cprobs + n * V;
        float *restrict g = a->dlogits + n * V;
        for (int64_t v = 0; v < V; v++)
            g[v] += dl * p[v];
        int64_t t = (int64_t)a->targets[n] - a->v0;
        if (t >= 0 && t < V)
            g[t] -= dl;
    }
}

/* bf16: the logits row widened into the thread's scratch, the f32 row
 * code on it, probabilities rounded as they are stored. */
CPU_CLONES static void xent_fwd_bf16_task(void *ctx, int64_t b, int64_t e,
                                          int tid)
{
    const xent_t *a = ctx;
    int64_t V = a->V;
    float *restrict p = a->scratch + (int64_t)tid * a->stride;
    for (int64_t n = b; n < e; n++) {
        cpu_bf16_widen(p, CPU_CBF16(a->logits) + n * V, V);
        float xt = p[a->targets[n]];
        float mx = cpu_max_f32(p, V);
        for (int64_t v = 0; v < V; v++)
            p[v] = cpu_expf(p[v] - mx);
        double sum = cpu_sum_f32(p, V);
        float inv = (float)(1.0 / sum);
        uint16_t *restrict ph = CPU_BF16(a->probs) + n * V;
        for (int64_t v = 0; v < V; v++)
            ph[v] = dt_f32_to_bf16(p[v] * inv);
        a->losses[n] = (float)(log(sum) - ((double)xt - mx));
    }
}

/* bf16: dlogits + dloss (p - y) in f32, rounded once (the target's
 * p - 1 before the product, as cuda computes it). */
CPU_CLONES static void xent_bwd_bf16_task(void *ctx, int64_t b, int64_t e,
                                          int tid)
{
    const xent_t *a = ctx;
    int64_t V = a->V;
    float dl = a->dloss;
    for (int64_t n = b; n < e; n++) {
        const uint16_t *restrict p = CPU_CBF16(a->cprobs) + n * V;
        uint16_t *restrict g = CPU_BF16(a->dlogits) + n * V;
        int64_t t = (int64_t)a->targets[n] - a->v0;
        int in = t >= 0 && t < V;
        float gt = in ? dt_bf16_to_f32(g[t]) : 0.0f;
        for (int64_t v = 0; v < V; v++)
            g[v] = dt_f32_to_bf16(dt_bf16_to_f32(g[v]) + dl * dt_bf16_to_f32(p[v]));
        if (in)
            g[t] = dt_f32_to_bf16(gt + dl * (dt_bf16_to_f32(p[t]) - 1.0f));
    }
}

/* One phase of the vocabulary-parallel cross-entropy (device.h). */
CPU_CLONES static void vxent_fwd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const xent_t *a = ctx;
    int64_t V = a->V, N = a->N;
    float *mx = a->stats, *sum = a->stats + N, *tl = a->stats + 2 * N;
    for (int64_t n = b; n < e; n++) {
        const float *restrict x = a->logits + n * V;
        int64_t t = (int64_t)a->targets[n] - a->v0;
        if (a->phase == 0) {
            mx[n] = cpu_max_f32(x, V);
        } else if (a->phase == 1) {
            double acc = 0;
            for (int64_t v = 0; v < V; v++)
                acc += (double)cpu_expf(x[v] - mx[n]);
            sum[n] = (float)acc;
            tl[n] = t >= 0 && t < V ? x[t] : 0.0f;
        } else {
            float *restrict p = a->probs + n * V;
            float inv = (float)(1.0 / (double)sum[n]);
            for (int64_t v = 0; v < V; v++)
                p[v] = cpu_expf(x[v] - mx[n]) * inv;
            a->losses[n] = (float)(log((double)sum[n]) - ((double)tl[n] - mx[n]));
        }
    }
}

/* bf16: the phase's f32 code on the widened row. */
CPU_CLONES static void vxent_fwd_bf16_task(void *ctx, int64_t b, int64_t e,
                                           int tid)
{
    const xent_t *a = ctx;
    int64_t V = a->V, N = a->N;
    float *mx = a->stats, *sum = a->stats + N, *tl = a->stats + 2 * N;
    float *restrict x = a->scratch + (int64_t)tid * a->stride;
    for (int64_t n = b; n < e; n++) {
        int64_t t = (int64_t)a->targets[n] - a->v0;
        cpu_bf16_widen(x, CPU_CBF16(a->logits) + n * V, V);
        if (a->phase == 0) {
            mx[n] = cpu_max_f32(x, V);
        } else if (a->phase == 1) {
            double acc = 0;
            for (int64_t v = 0; v < V; v++)
                acc += (double)cpu_expf(x[v] - mx[n]);
            sum[n] = (float)acc;
            tl[n] = t >= 0 && t < V ? x[t] : 0.0f;
        } else {
            uint16_t *restrict p = CPU_BF16(a->probs) + n * V;
            float inv = (float)(1.0 / (double)sum[n]);
            for (int64_t v = 0; v < V; v++)
                p[v] = dt_f32_to_bf16(cpu_expf(x[v] - mx[n]) * inv);
            a->losses[n] = (float)(log((double)sum[n]) - ((double)tl[n] - mx[n]));
        }
    }
}

/* The bf16 forwards' scratch (a row of V floats per thread), kmu held. */
static int xent_bf16_scratch(dt_device_t *d, const char *op, xent_t *a)
{
    a->stride = cpu_pad16(a->V);
    void *p = NULL;
    int rc = cpu_scratch(d, (uint64_t)d->threads * (uint64_t)a->stride *
                                sizeof(float), &p, op);
    a->scratch = p;
    return rc;
}

static int check_targets(dt_device_t *d, const char *op,
                         const int32_t *targets, int64_t N, int64_t V)
{
    for (int64_t i = 0; i < N; i++)
        if (targets[i] < 0 || targets[i] >= V)
            return CPU_INVALID(d, "%s: targets[%lld] = %d is outside [0, %lld)",
                               op, (long long)i, (int)targets[i], (long long)V);
    return DT_OK;
}

int cpu_softmax_xent_forward(dt_device_t *d, dt_stream_t *s, float *losses,
                             void *probs, const void *logits,
                             const int32_t *targets, int dtype, int64_t N,
                             int64_t V)
{
    static const char op[] = "softmax_xent_forward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, N);
    CPU_DIM(d, op, V);
    int64_t NV;
    int rc = cpu_check_product(d, op, N, V, &NV);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, losses, N);
    CPU_PTR(d, op, probs, NV);
    CPU_PTR(d, op, logits, NV);
    CPU_PTR(d, op, targets, N);
    rc = check_targets(d, op, targets, N, V);
    if (rc != DT_OK)
        return rc;
    xent_t a = {.losses = losses, .probs = probs, .logits = logits,
                .targets = targets, .N = N, .V = V};
    if (N == 0)
        return DT_OK;
    cpu_lock(d);
    if (dtype == DT_BF16 && (rc = xent_bf16_scratch(d, op, &a)) != DT_OK) {
        cpu_unlock(d);
        return rc;
    }
    cpu_pool_run(d->pool, N, row_grain(V),
                 dtype == DT_BF16 ? xent_fwd_bf16_task : xent_fwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

/* Both cross-entropy backwards: the whole vocabulary (v0 0, targets
 * checked inside it) or a rank's columns [v0, v0 + nv). */
static int xent_backward(dt_device_t *d, dt_stream_t *s, const char *op,
                         void *dlogits, const void *probs,
                         const int32_t *targets, int dtype, float dloss,
                         int64_t N, int64_t v0, int64_t nv, int whole)
{
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, N);
    int rc = whole ? DT_OK : check_vocab_range(d, op, v0, nv);
    if (rc != DT_OK)
        return rc;
    if (whole)
        CPU_DIM(d, op, nv);
    int64_t NV;
    if ((rc = cpu_check_product(d, op, N, nv, &NV)) != DT_OK)
        return rc;
    CPU_PTR(d, op, dlogits, NV);
    CPU_PTR(d, op, probs, NV);
    CPU_PTR(d, op, targets, N);
    rc = whole ? check_targets(d, op, targets, N, nv) : check_tokens(d, op, targets, N);
    if (rc != DT_OK)
        return rc;
    xent_t a = {.dlogits = dlogits, .cprobs = probs, .targets = targets,
                .dloss = dloss, .N = N, .V = nv, .v0 = v0};
    cpu_lock(d);
    cpu_pool_run(d->pool, N, row_grain(nv),
                 dtype == DT_BF16 ? xent_bwd_bf16_task : xent_bwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

int cpu_softmax_xent_backward(dt_device_t *d, dt_stream_t *s, void *dlogits,
                              const void *probs, const int32_t *targets,
                              int dtype, float dloss, int64_t N, int64_t V)
{
    return xent_backward(d, s, "softmax_xent_backward", dlogits, probs, targets,
                         dtype, dloss, N, 0, V, 1);
}

int cpu_vocab_xent_forward(dt_device_t *d, dt_stream_t *s, int phase,
                           float *stats, float *losses, void *probs,
                           const void *logits, const int32_t *targets,
                           int dtype, int64_t N, int64_t v0, int64_t nv)
{
    static const char op[] = "vocab_xent_forward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, N);
    int rc = check_vocab_range(d, op, v0, nv);
    if (rc != DT_OK)
        return rc;
    if (phase < 0 || phase > 2)
        return CPU_INVALID(d, "%s: phase %d (0, 1 or 2)", op, phase);
    int64_t NV;
    if ((rc = cpu_check_product(d, op, N, nv, &NV)) != DT_OK)
        return rc;
    CPU_PTR(d, op, stats, 3 * N);
    CPU_PTR(d, op, logits, NV);
    CPU_PTR(d, op, targets, N);
    if (phase == 2) {
        CPU_PTR(d, op, losses, N);
        CPU_PTR(d, op, probs, NV);
    }
    if ((rc = check_tokens(d, op, targets, N)) != DT_OK)
        return rc;
    xent_t a = {.losses = losses, .probs = probs, .logits = logits,
                .targets = targets, .N = N, .V = nv, .v0 = v0, .phase = phase,
                .stats = stats};
    if (N == 0)
        return DT_OK;
    cpu_lock(d);
    if (dtype == DT_BF16 && (rc = xent_bf16_scratch(d, op, &a)) != DT_OK) {
        cpu_unlock(d);
        return rc;
    }
    cpu_pool_run(d->pool, N, row_grain(nv),
                 dtype == DT_BF16 ? vxent_fwd_bf16_task : vxent_fwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

int cpu_vocab_xent_backward(dt_device_t *d, dt_stream_t *s, void *dlogits,
                            const void *probs, const int32_t *targets,
                            int dtype, float dloss, int64_t N, int64_t v0,
                            int64_t nv)
{
    return xent_backward(d, s, "vocab_xent_backward", dlogits, probs, targets,
                         dtype, dloss, N, v0, nv, 0);
}
