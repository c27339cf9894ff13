/*
 * plugins/cuda/cuda_kernels.c - the cuda device's kernel entry points (the
 * ABI's signatures): each checks the stream, the shapes, the pointers and
 * the dtypes, then enqueues the device code of cuda_*.cu through
 * cuda_launch.h.  The matmuls are in cuda_matmul.c, attention in
 * cuda_attention.c.  dtypes: activations f32 or bf16 (with weights of the
 * same type), gradients f32 or bf16, casts and sumsq also f16.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain/sdk/optim.h"
#include "cuda_internal.h"
#include "cuda_launch.h"

#define CHECK(expr)                                                            \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != DT_OK)                                                      \
            return rc_;                                                        \
    } while (0)

/* The launch shape of a row kernel (layernorm, softmax_xent: one block per
 * row, cuda_nn.cu): N rows must fit one launch's grid; with `wname` ("C",
 * "V") a row must also have a column when there are rows. */
static int rows_check(dt_device_t *d, const char *op, int64_t N, int64_t width,
                      const char *wname)
{
    if (wname && N > 0 && width == 0)
        return CUDA_INVALID(d, "%s: %s = 0 with N = %lld rows", op, wname, (long long)N);
    if (N > CUDA_LAUNCH_MAX_ROWS)
        return CUDA_INVALID(d, "%s: N = %lld rows is more than one launch takes (2^31 - 1)",
                            op, (long long)N);
    return DT_OK;
}

/* A vocabulary range's ids: [v0, v0 + nv), nv >= 1 (the cpu's message). */
static int vocab_range_check(dt_device_t *d, const char *op, int64_t v0, int64_t nv)
{
    if (v0 < 0 || nv < 1)
        return CUDA_INVALID(d, "%s: vocabulary ids [%lld, %lld + %lld)", op, (long long)v0,
                            (long long)v0, (long long)nv);
    return DT_OK;
}

/* The embeddings over the vocabulary range [v0, v0 + nv) of wte (the
 * whole vocabulary: 0, INT64_MAX, and wpe required). */
static int embedding_forward(dt_device_t *d, dt_stream_t *s, const char *op, void *out,
                             const int32_t *tokens, const void *wte, const void *wpe,
                             int need_wpe, int dtype, int64_t B, int64_t T, int64_t C,
                             int64_t v0, int64_t nv)
{
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, B);
    CUDA_DIM(d, op, T);
    CUDA_DIM(d, op, C);
    CUDA_PTR(d, op, out, B * T * C);
    CUDA_PTR(d, op, tokens, B * T);
    CUDA_PTR(d, op, wte, C);
    if (need_wpe)
        CUDA_PTR(d, op, wpe, T * C);
    if (B * T * C == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_embedding_forward(st->cs, out, tokens, wte, wpe, dtype,
                                                       B, T, C, v0, nv));
    return DT_OK;
}

static int embedding_backward(dt_device_t *d, dt_stream_t *s, const char *op, float *dwte,
                              float *dwpe, const void *dout, const int32_t *tokens,
                              int dtype, int64_t B, int64_t T, int64_t C, int64_t v0,
                              int64_t nv)
{
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, B);
    CUDA_DIM(d, op, T);
    CUDA_DIM(d, op, C);
    CUDA_PTR(d, op, dout, B * T * C);
    if (dwte)
        CUDA_PTR(d, op, tokens, B * T);
    if (B * T * C == 0 || (!dwte && !dwpe))
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_embedding_backward(st->cs, dwte, dwpe, dout, tokens,
                                                        dtype, B, T, C, v0, nv,
                                                        d->deterministic));
    return DT_OK;
}

int cuda_embedding_forward(dt_device_t *d, dt_stream_t *s, void *out,
                           const int32_t *tokens, const void *wte,
                           const void *wpe, int dtype, int64_t B, int64_t T,
                           int64_t C)
{
    return embedding_forward(d, s, "embedding_forward", out, tokens, wte, wpe, 1, dtype, B,
                             T, C, 0, INT64_MAX);
}

int cuda_embedding_backward(dt_device_t *d, dt_stream_t *s, float *dwte,
                            float *dwpe, const void *dout,
                            const int32_t *tokens, int dtype, int64_t B,
                            int64_t T, int64_t C)
{
    return embedding_backward(d, s, "embedding_backward", dwte, dwpe, dout, tokens, dtype, B,
                              T, C, 0, INT64_MAX);
}

int cuda_vocab_embedding_forward(dt_device_t *d, dt_stream_t *s, void *out,
                                 const int32_t *tokens, const void *wte, const void *wpe,
                                 int dtype, int64_t B, int64_t T, int64_t C, int64_t v0,
                                 int64_t nv)
{
    static const char op[] = "vocab_embedding_forward";
    if (!d)
        return DT_ERR_INVALID;
    CHECK(vocab_range_check(d, op, v0, nv));
    return embedding_forward(d, s, op, out, tokens, wte, wpe, 0, dtype, B, T, C, v0, nv);
}

int cuda_vocab_embedding_backward(dt_device_t *d, dt_stream_t *s, float *dwte, float *dwpe,
                                  const void *dout, const int32_t *tokens, int dtype,
                                  int64_t B, int64_t T, int64_t C, int64_t v0, int64_t nv)
{
    static const char op[] = "vocab_embedding_backward";
    if (!d)
        return DT_ERR_INVALID;
    CHECK(vocab_range_check(d, op, v0, nv));
    return embedding_backward(d, s, op, dwte, dwpe, dout, tokens, dtype, B, T, C, v0, nv);
}

int cuda_gelu_forward(dt_device_t *d, dt_stream_t *s, void *out,
                      const void *inp, int dtype, int64_t n)
{
    static const char op[] = "gelu_forward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, n);
    CUDA_PTR(d, op, out, n);
    CUDA_PTR(d, op, inp, n);
    if (n == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_gelu_forward(st->cs, out, inp, dtype, n));
    return DT_OK;
}

int cuda_gelu_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                       const void *inp, const void *dout, int dtype, int64_t n)
{
    static const char op[] = "gelu_backward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, n);
    CUDA_PTR(d, op, dinp, n);
    CUDA_PTR(d, op, inp, n);
    CUDA_PTR(d, op, dout, n);
    if (n == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_gelu_backward(st->cs, dinp, inp, dout, dtype, n));
    return DT_OK;
}

int cuda_softmax_xent_forward(dt_device_t *d, dt_stream_t *s, float *losses,
                              void *probs, const void *logits,
                              const int32_t *targets, int dtype, int64_t N,
                              int64_t V)
{
    static const char op[] = "softmax_xent_forward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, N);
    CUDA_DIM(d, op, V);
    CHECK(rows_check(d, op, N, V, "V"));
    CUDA_PTR(d, op, losses, N);
    CUDA_PTR(d, op, probs, N * V);
    CUDA_PTR(d, op, logits, N * V);
    CUDA_PTR(d, op, targets, N);
    if (N == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_softmax_xent_forward(st->cs, losses, probs,
                                                          logits, targets, dtype,
                                                          N, V));
    return DT_OK;
}

static int xent_backward(dt_device_t *d, dt_stream_t *s, const char *op, void *dlogits,
                         const void *probs, const int32_t *targets, int dtype, float dloss,
                         int64_t N, int64_t V, int64_t v0)
{
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, N);
    CUDA_DIM(d, op, V);
    CUDA_PTR(d, op, dlogits, N * V);
    CUDA_PTR(d, op, probs, N * V);
    CUDA_PTR(d, op, targets, N);
    if (N * V == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_softmax_xent_backward(st->cs, dlogits, probs, targets,
                                                           dtype, dloss, N, V, v0));
    return DT_OK;
}

int cuda_softmax_xent_backward(dt_device_t *d, dt_stream_t *s, void *dlogits,
                               const void *probs, const int32_t *targets,
                               int dtype, float dloss, int64_t N, int64_t V)
{
    return xent_backward(d, s, "softmax_xent_backward", dlogits, probs, targets, dtype, dloss,
                         N, V, 0);
}

int cuda_vocab_xent_backward(dt_device_t *d, dt_stream_t *s, void *dlogits, const void *probs,
                             const int32_t *targets, int dtype, float dloss, int64_t N,
                             int64_t v0, int64_t nv)
{
    static const char op[] = "vocab_xent_backward";
    if (!d)
        return DT_ERR_INVALID;
    CHECK(vocab_range_check(d, op, v0, nv));
    return xent_backward(d, s, op, dlogits, probs, targets, dtype, dloss, N, nv, v0);
}

int cuda_vocab_xent_forward(dt_device_t *d, dt_stream_t *s, int phase, float *stats,
                            float *losses, void *probs, const void *logits,
                            const int32_t *targets, int dtype, int64_t N, int64_t v0,
                            int64_t nv)
{
    static const char op[] = "vocab_xent_forward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, N);
    CHECK(vocab_range_check(d, op, v0, nv));
    if (phase < 0 || phase > 2)
        return CUDA_INVALID(d, "%s: phase %d (0, 1 or 2)", op, phase);
    CHECK(rows_check(d, op, N, nv, NULL));
    CUDA_PTR(d, op, stats, 3 * N);
    CUDA_PTR(d, op, logits, N * nv);
    CUDA_PTR(d, op, targets, N);
    if (phase == 2) {
        CUDA_PTR(d, op, losses, N);
        CUDA_PTR(d, op, probs, N * nv);
    }
    if (N == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_vocab_xent_forward(st->cs, phase, stats, losses, probs,
                                                        logits, targets, dtype, N, nv, v0));
    return DT_OK;
}

int cuda_axpy(dt_device_t *d, dt_stream_t *s, void *y, const void *x,
              int dtype, float alpha, int64_t n)
{
    static const char op[] = "axpy";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_elems(d, op, dtype, 0));
    CUDA_DIM(d, op, n);
    CUDA_PTR(d, op, y, n);
    CUDA_PTR(d, op, x, n);
    if (x == y && n > 0) /* as the cpu refuses it: y += a y is scale's job */
        return CUDA_INVALID(d, "%s: x and y are the same buffer", op);
    if (n == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_axpy(st->cs, y, x, dtype, alpha, n));
    return DT_OK;
}

int cuda_sumsq(dt_device_t *d, dt_stream_t *s, double *out, const void *x,
               int dtype, int64_t n)
{
    static const char op[] = "sumsq";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_elems(d, op, dtype, 1));
    CUDA_DIM(d, op, n);
    CUDA_PTR(d, op, out, 1);
    CUDA_PTR(d, op, x, n);
    CUDA_LAUNCHED(d, op, cuda_launch_sumsq(st->cs, out, x, dtype, n, st->partials,
                                           CUDA_PARTIALS));
    return DT_OK;
}

int cuda_cast(dt_device_t *d, dt_stream_t *s, void *dst, int dst_dtype,
              const void *src, int src_dtype, int64_t n)
{
    static const char op[] = "cast";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_elems(d, op, dst_dtype, 1));
    CHECK(cuda_check_elems(d, op, src_dtype, 1));
    CUDA_DIM(d, op, n);
    CUDA_PTR(d, op, dst, n);
    CUDA_PTR(d, op, src, n);
    if (n == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_cast(st->cs, dst, dst_dtype, src, src_dtype, n));
    return DT_OK;
}

int cuda_layernorm_forward(dt_device_t *d, dt_stream_t *s, void *out,
                           float *mean, float *rstd, const void *inp,
                           const void *weight, const void *bias, int dtype,
                           int64_t N, int64_t C)
{
    static const char op[] = "layernorm_forward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, N);
    CUDA_DIM(d, op, C);
    CHECK(rows_check(d, op, N, C, "C"));
    CUDA_PTR(d, op, out, N * C);
    CUDA_PTR(d, op, mean, N);
    CUDA_PTR(d, op, rstd, N);
    CUDA_PTR(d, op, inp, N * C);
    CUDA_PTR(d, op, weight, C);
    CUDA_PTR(d, op, bias, C);
    CUDA_LAUNCHED(d, op, cuda_launch_layernorm_forward(st->cs, out, mean, rstd, inp,
                                                       weight, bias, dtype, N, C));
    return DT_OK;
}

int cuda_layernorm_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                            float *dweight, float *dbias, const void *dout,
                            const void *inp, const void *weight,
                            const float *mean, const float *rstd, int dtype,
                            int64_t N, int64_t C)
{
    static const char op[] = "layernorm_backward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, N);
    CUDA_DIM(d, op, C);
    CHECK(rows_check(d, op, N, C, NULL));
    CUDA_PTR(d, op, dout, N * C);
    CUDA_PTR(d, op, inp, N * C);
    CUDA_PTR(d, op, mean, N);
    CUDA_PTR(d, op, rstd, N);
    if (dinp)
        CUDA_PTR(d, op, weight, C);
    if (N * C == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_layernorm_backward(st->cs, dinp, dweight, dbias,
                                                        dout, inp, weight, mean,
                                                        rstd, dtype, N, C));
    return DT_OK;
}

int cuda_residual_forward(dt_device_t *d, dt_stream_t *s, void *out,
                          const void *a, const void *b, int dtype, int64_t n)
{
    static const char op[] = "residual_forward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, n);
    CUDA_PTR(d, op, out, n);
    CUDA_PTR(d, op, a, n);
    CUDA_PTR(d, op, b, n);
    if (n == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_residual(st->cs, out, a, b, dtype, n));
    return DT_OK;
}

int cuda_scale(dt_device_t *d, dt_stream_t *s, void *x, int dtype, float alpha,
               int64_t n)
{
    static const char op[] = "scale";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_elems(d, op, dtype, 0));
    CUDA_DIM(d, op, n);
    CUDA_PTR(d, op, x, n);
    if (n == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_scale(st->cs, x, dtype, alpha, n));
    return DT_OK;
}

int cuda_adamw_update(dt_device_t *d, dt_stream_t *s, float *param,
                      const void *grad, float *m, float *v, int grad_dtype,
                      int64_t n, float lr, float beta1, float beta2, float eps,
                      float weight_decay, float grad_scale, int64_t t)
{
    static const char op[] = "adamw_update";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_elems(d, op, grad_dtype, 0));
    CUDA_DIM(d, op, n);
    /* the cpu's refusals word for word: a bias correction 1 - beta^t of 0
     * would write inf/NaN into every parameter */
    if (t < 1)
        return CUDA_INVALID(d, "%s: step t = %lld; it is 1-based", op, (long long)t);
    if (!(beta1 >= 0.0f && beta1 < 1.0f) || !(beta2 >= 0.0f && beta2 < 1.0f))
        return CUDA_INVALID(d, "%s: beta1 = %g, beta2 = %g must be in [0, 1)", op,
                            (double)beta1, (double)beta2);
    CUDA_PTR(d, op, param, n);
    CUDA_PTR(d, op, grad, n);
    CUDA_PTR(d, op, m, n);
    CUDA_PTR(d, op, v, n);
    if (n == 0)
        return DT_OK;
    /* the bias corrections folded into the cpu's scalars, on the host,
     * once per call (sdk/optim.h dt_adamw_scalars) */
    const dt_optim_desc_v1_t o = {.struct_size = sizeof o, .kind = DT_OPTIM_ADAMW,
                                  .beta1 = beta1, .beta2 = beta2, .eps = eps};
    const dt_adamw_hyper_t h = dt_adamw_hyper(&o, lr, weight_decay, grad_scale, t);
    const dt_adamw_scalars_t k = dt_adamw_scalars(&h);
    CUDA_LAUNCHED(d, op, cuda_launch_adamw(st->cs, param, grad, m, v, grad_dtype, n,
                                           beta1, beta2, eps, grad_scale, k.step,
                                           k.rsqrt_bc2, k.lr_wd));
    return DT_OK;
}

int cuda_sgd_update(dt_device_t *d, dt_stream_t *s, float *param,
                    const void *grad, float *mom, int grad_dtype, int64_t n,
                    float lr, float momentum, float weight_decay, int nesterov,
                    float grad_scale)
{
    static const char op[] = "sgd_update";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_elems(d, op, grad_dtype, 0));
    CUDA_DIM(d, op, n);
    CUDA_PTR(d, op, param, n);
    CUDA_PTR(d, op, grad, n);
    if (momentum != 0.0f)
        CUDA_PTR(d, op, mom, n);
    if (n == 0)
        return DT_OK;
    CUDA_LAUNCHED(d, op, cuda_launch_sgd(st->cs, param, grad,
                                         momentum != 0.0f ? mom : NULL, grad_dtype,
                                         n, lr, momentum, weight_decay, nesterov,
                                         grad_scale));
    return DT_OK;
}
