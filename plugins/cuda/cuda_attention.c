/*
 * plugins/cuda/cuda_attention.c - causal multi-head self-attention on the
 * cuda device: the kernel table's entry points, and the way each pass is
 * computed.
 *
 * The saved state is the log-sum-exp of every score row, (B, NH, T) f32,
 * as flash attention keeps: the probabilities are recomputed in backward.
 *
 * Main path: the products go to cuBLASLt, batched over the heads of one
 * sequence at a time (the (T, 3C) qkv rows give each head a (T, hs) matrix
 * with leading dimension 3C at offset h hs: no permutes), and the row-wise
 * parts are two kernels of cuda_attention.cu.  Per sequence b, with S and
 * dP (NH, T, T) f32 score matrices in the stream's scratch:
 *   forward   S = Q K^T / sqrt(hs); each row's softmax over s <= t (0
 *             above the diagonal) and its log-sum-exp; out = P V
 *   backward  S = Q K^T / sqrt(hs) and dP = dO V^T; then per row
 *             P = exp(S - lse), D = dO . out, dS = P (dP - D); then
 *             dV += P^T dO, dQ += dS K / sqrt(hs), dK += dS^T Q / sqrt(hs)
 * Tensor cores do the products (bf16 activations, or TF32 with the tf32
 * key); the T x T matrices are computed whole, so half the products'
 * work is above the diagonal and thrown away: the price of using the
 * library's GEMMs instead of a hand-tiled flash kernel.  Deterministic:
 * cuBLASLt without split-K under `deterministic`, and one thread per
 * output in the row kernels.  The scratch is 8 bytes a score (12 with
 * bf16: the products read P and dS in the activations' type): NH T^2 x 8
 * bytes, 100 MiB for GPT-2 124M's 12 heads at T = 1024.
 *
 * Fallback: where the scratch cannot be had (the device is full), the
 * fused row kernels of cuda_attention.cu (one block per query row, plain
 * FMAs: slow, no scratch, T <= CUDA_ATTENTION_MAX_T).
 */
#include <math.h>

#include "cuda_internal.h"
#include "cuda_launch.h"

#define CHECK(expr)                                                            \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != DT_OK)                                                      \
            return rc_;                                                        \
    } while (0)

/* The log-sum-exp per (b, h, t) row: (B, NH, T) f32. */
int cuda_attention_state_bytes(int64_t B, int64_t T, int64_t C, int64_t NH,
                               int dtype, uint64_t *out)
{
    if (!out || B < 0 || T < 0 || C < 0 || NH <= 0 || C % NH != 0)
        return DT_ERR_INVALID;
    if (dtype != DT_F32 && dtype != DT_BF16)
        return DT_ERR_UNSUPPORTED;
    uint64_t n = (uint64_t)B;
    if ((NH && n > UINT64_MAX / (uint64_t)NH) ||
        (T && n * (uint64_t)NH > UINT64_MAX / 4 / (uint64_t)T))
        return DT_ERR_INVALID;
    *out = n * (uint64_t)NH * (uint64_t)T * sizeof(float);
    return DT_OK;
}

static int attention_check(dt_device_t *d, const char *op, int dtype, int64_t B,
                           int64_t T, int64_t C, int64_t NH)
{
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, B);
    CUDA_DIM(d, op, T);
    CUDA_DIM(d, op, C);
    if (NH <= 0 || C % NH != 0)
        return CUDA_INVALID(d, "%s: C = %lld is not a multiple of NH = %lld", op,
                            (long long)C, (long long)NH);
    if (T > CUDA_ATTENTION_MAX_T)
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: T = %lld: the cuda device's attention "
                                  "runs T <= %d", op, (long long)T,
                                  CUDA_ATTENTION_MAX_T);
    if (B > 65535 || NH > 65535)
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: B = %lld, NH = %lld: at most 65535 each",
                                  op, (long long)B, (long long)NH);
    return DT_OK;
}

/* The scratch of one sequence: S and dP f32, and with bf16 activations P
 * and dS in bf16 for the products that read them.  NULL when the device
 * cannot give it (the caller falls back; the message is dropped). */
typedef struct {
    float *S, *dP;
    void *P, *dS; /* the activations' type: S and dP themselves for f32 */
} att_scratch_t;

static int scratch(dt_device_t *d, dt_stream_t *st, int dtype, int64_t T, int64_t NH,
                   int backward, att_scratch_t *sc)
{
    uint64_t n = (uint64_t)NH * (uint64_t)T * (uint64_t)T;
    const uint64_t mats = backward ? 2 : 1; /* S (and dP) */
    uint64_t per = mats * (sizeof(float) + (dtype == DT_BF16 ? 2 : 0));
    uint64_t bytes = n * per;
    if (bytes > st->att_bytes) {
        if (st->att)
            cuda_mem_free(d, st->att);
        st->att = NULL;
        st->att_bytes = 0;
        if (cuda_mem_alloc(d, bytes, DT_TAG_STAGING, &st->att, "attention scores") != DT_OK)
            return 0;
        st->att_bytes = bytes;
    }
    char *p = st->att;
    sc->S = (float *)p;
    p += n * sizeof(float);
    sc->dP = backward ? (float *)p : NULL;
    if (backward)
        p += n * sizeof(float);
    if (dtype == DT_BF16) {
        sc->P = p;
        sc->dS = backward ? p + n * 2 : NULL;
    } else {
        sc->P = sc->S;
        sc->dS = sc->dP;
    }
    return 1;
}

/* Element size of the activations. */
static int64_t esz(int dtype) { return dtype == DT_BF16 ? 2 : 4; }

/* S_h = scale X_h Y_h^T for the NH heads of one sequence: X, Y the (T, hs)
 * row-major head matrices at x + h hs (leading dimension ldx), S (NH, T, T)
 * row-major f32.  In cuBLAS's column-major terms S_h^T = Y_h X_h^T. */
static int scores(dt_device_t *d, dt_stream_t *st, const char *op, float *S,
                  const void *x, const void *y, int64_t ldx, int dtype, int64_t T,
                  int64_t hs, int64_t NH, float scale)
{
    cuda_lt_call_t c = {.ta = CUBLAS_OP_T, .tb = CUBLAS_OP_N,
                        .m = (uint64_t)T, .n = (uint64_t)T, .k = (uint64_t)hs,
                        .A = y, .B = x, .D = S, .atype = dtype, .dtype = DT_F32,
                        .lda = ldx, .ldb = ldx, .ldd = T, .alpha = scale, .beta = 0.0f,
                        .batch = (int)NH, .sa = hs, .sb = hs, .sd = T * T};
    return cuda_lt_matmul(d, st, op, &c);
}

int cuda_attention_forward(dt_device_t *d, dt_stream_t *s, void *out,
                           void *state, const void *qkv, int dtype, int64_t B,
                           int64_t T, int64_t C, int64_t NH)
{
    static const char op[] = "attention_forward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(attention_check(d, op, dtype, B, T, C, NH));
    CUDA_PTR(d, op, out, B * T * C);
    CUDA_PTR(d, op, state, B * NH * T);
    CUDA_PTR(d, op, qkv, B * T * 3 * C);
    if (B * T * C == 0)
        return DT_OK;
    att_scratch_t sc;
    if (!scratch(d, st, dtype, T, NH, 0, &sc)) {
        CUDA_LAUNCHED(d, op, cuda_launch_attention_forward(st->cs, out, (float *)state,
                                                           qkv, dtype, B, T, C, NH));
        return DT_OK;
    }
    const int64_t hs = C / NH, e = esz(dtype);
    const float scale = 1.0f / sqrtf((float)hs);
    for (int64_t b = 0; b < B; b++) {
        const char *q = (const char *)qkv + b * T * 3 * C * e;
        char *o = (char *)out + b * T * C * e;
        CHECK(scores(d, st, op, sc.S, q, q + C * e, 3 * C, dtype, T, hs, NH, scale));
        float *lse = (float *)state + b * NH * T;
        CUDA_LAUNCHED(d, op, cuda_launch_attention_softmax(st->cs, sc.P, lse, sc.S, dtype, T, NH));
        /* out_h (T, hs) = P_h V_h: out_h^T = V_h^T P_h^T, column-major */
        cuda_lt_call_t c = {.ta = CUBLAS_OP_N, .tb = CUBLAS_OP_N,
                            .m = (uint64_t)hs, .n = (uint64_t)T, .k = (uint64_t)T,
                            .A = q + 2 * C * e, .B = sc.P, .D = o, .atype = dtype,
                            .dtype = dtype, .lda = 3 * C, .ldb = T, .ldd = C,
                            .beta = 0.0f, .batch = (int)NH, .sa = hs, .sb = T * T, .sd = hs};
        CHECK(cuda_lt_matmul(d, st, op, &c));
    }
    return DT_OK;
}

int cuda_attention_backward(dt_device_t *d, dt_stream_t *s, void *dqkv,
                            const void *dout, const void *qkv, const void *out,
                            const void *state, int dtype, int64_t B, int64_t T,
                            int64_t C, int64_t NH)
{
    static const char op[] = "attention_backward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(attention_check(d, op, dtype, B, T, C, NH));
    CUDA_PTR(d, op, dqkv, B * T * 3 * C);
    CUDA_PTR(d, op, dout, B * T * C);
    CUDA_PTR(d, op, qkv, B * T * 3 * C);
    CUDA_PTR(d, op, out, B * T * C);
    CUDA_PTR(d, op, state, B * NH * T);
    if (B * T * C == 0)
        return DT_OK;
    att_scratch_t sc;
    if (!scratch(d, st, dtype, T, NH, 1, &sc)) {
        CUDA_LAUNCHED(d, op, cuda_launch_attention_backward(st->cs, dqkv, dout, qkv, out,
                                                            (const float *)state, dtype,
                                                            B, T, C, NH));
        return DT_OK;
    }
    const int64_t hs = C / NH, e = esz(dtype);
    const float scale = 1.0f / sqrtf((float)hs);
    for (int64_t b = 0; b < B; b++) {
        const char *q = (const char *)qkv + b * T * 3 * C * e, *k = q + C * e, *v = q + 2 * C * e;
        const char *dy = (const char *)dout + b * T * C * e, *y = (const char *)out + b * T * C * e;
        char *dq = (char *)dqkv + b * T * 3 * C * e, *dk = dq + C * e, *dv = dq + 2 * C * e;
        CHECK(scores(d, st, op, sc.S, q, k, 3 * C, dtype, T, hs, NH, scale));
        /* dP_h = dO_h V_h^T: dO's rows have leading dimension C, V's 3C */
        cuda_lt_call_t p = {.ta = CUBLAS_OP_T, .tb = CUBLAS_OP_N,
                            .m = (uint64_t)T, .n = (uint64_t)T, .k = (uint64_t)hs,
                            .A = v, .B = dy, .D = sc.dP, .atype = dtype, .dtype = DT_F32,
                            .lda = 3 * C, .ldb = C, .ldd = T, .beta = 0.0f,
                            .batch = (int)NH, .sa = hs, .sb = hs, .sd = T * T};
        CHECK(cuda_lt_matmul(d, st, op, &p));
        CUDA_LAUNCHED(d, op, cuda_launch_attention_grad_rows(
                                 st->cs, sc.P, sc.dS, sc.S, sc.dP,
                                 (const float *)state + b * NH * T, dy, y, dtype, T, C, NH));
        /* dV_h += P_h^T dO_h: dV_h^T = dO_h^T P_h, column-major */
        cuda_lt_call_t g = {.ta = CUBLAS_OP_N, .tb = CUBLAS_OP_T,
                            .m = (uint64_t)hs, .n = (uint64_t)T, .k = (uint64_t)T,
                            .A = dy, .B = sc.P, .D = dv, .atype = dtype, .dtype = dtype,
                            .lda = C, .ldb = T, .ldd = 3 * C, .beta = 1.0f,
                            .batch = (int)NH, .sa = hs, .sb = T * T, .sd = hs};
        CHECK(cuda_lt_matmul(d, st, op, &g));
        /* dQ_h += scale dS_h K_h: dQ_h^T = K_h^T dS_h^T */
        g.tb = CUBLAS_OP_N, g.A = k, g.B = sc.dS, g.D = dq, g.lda = 3 * C, g.alpha = scale;
        CHECK(cuda_lt_matmul(d, st, op, &g));
        /* dK_h += scale dS_h^T Q_h: dK_h^T = Q_h^T dS_h */
        g.tb = CUBLAS_OP_T, g.A = q, g.D = dk;
        CHECK(cuda_lt_matmul(d, st, op, &g));
    }
    return DT_OK;
}
