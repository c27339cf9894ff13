/*
 * plugins/cuda/cuda_llama.c - the cuda device's entry points for the LLaMA
 * family's kernels (rmsnorm, rope, swiglu, gqa_attention;
 * dtrain/device.h): each checks the stream, the shapes, the pointers and
 * the dtypes (f32 or bf16 activations), then enqueues cuda_llama.cu's
 * device code.  Compiled with warnings as errors; NOT YET RUN on a GPU
 * (tests/unit/plugins/cpu/test_kernels_llama.c's cuda variant checks it where one is).
 */
#include <math.h>
#include <stdint.h>

#include "cuda_internal.h"
#include "cuda_launch.h"

#define CHECK(expr)                                                            \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != DT_OK)                                                      \
            return rc_;                                                        \
    } while (0)

/* One block per row: N rows in one launch's grid. */
static int ll_rows(dt_device_t *d, const char *op, int64_t N)
{
    if (N > CUDA_LAUNCH_MAX_ROWS)
        return CUDA_INVALID(d, "%s: N = %lld rows is more than one launch takes (2^31 - 1)",
                            op, (long long)N);
    return DT_OK;
}

int cuda_rmsnorm_forward(dt_device_t *d, dt_stream_t *s, void *out, float *rstd,
                         const void *inp, const void *weight, int dtype, int64_t N,
                         int64_t C, float eps)
{
    static const char op[] = "rmsnorm_forward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, N);
    CUDA_DIM(d, op, C);
    CHECK(ll_rows(d, op, N));
    if (C == 0 && N > 0)
        return CUDA_INVALID(d, "%s: C = 0: nothing to normalise over", op);
    if (!(eps >= 0.0f) || isinf(eps))
        return CUDA_INVALID(d, "%s: eps = %g must be finite and >= 0", op, (double)eps);
    CUDA_PTR(d, op, out, N * C);
    CUDA_PTR(d, op, rstd, N);
    CUDA_PTR(d, op, inp, N * C);
    CUDA_PTR(d, op, weight, C);
    CUDA_LAUNCHED(d, op, cuda_launch_rmsnorm_forward(st->cs, out, rstd, inp, weight, dtype,
                                                     N, C, eps));
    return DT_OK;
}

int cuda_rmsnorm_backward(dt_device_t *d, dt_stream_t *s, void *dinp, float *dweight,
                          const void *dout, const void *inp, const void *weight,
                          const float *rstd, int dtype, int64_t N, int64_t C)
{
    static const char op[] = "rmsnorm_backward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, N);
    CUDA_DIM(d, op, C);
    CHECK(ll_rows(d, op, N));
    CUDA_PTR(d, op, dout, N * C);
    CUDA_PTR(d, op, inp, N * C);
    CUDA_PTR(d, op, rstd, N);
    if (dinp)
        CUDA_PTR(d, op, weight, C);
    CUDA_LAUNCHED(d, op, cuda_launch_rmsnorm_backward(st->cs, dinp, dweight, dout, inp,
                                                      weight, rstd, dtype, N, C));
    return DT_OK;
}

static int rope(dt_device_t *d, dt_stream_t *s, const char *op, void *out, const void *inp,
                const float *cos_t, const float *sin_t, int dtype, int64_t B, int64_t T,
                int64_t NH, int64_t HD, int64_t ld, int backward)
{
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, B);
    CUDA_DIM(d, op, T);
    CUDA_DIM(d, op, NH);
    CUDA_DIM(d, op, HD);
    CUDA_DIM(d, op, ld);
    if (HD % 2 != 0)
        return CUDA_INVALID(d, "%s: HD = %lld must be even (pairs i, i + HD/2)", op,
                            (long long)HD);
    if (NH * HD > ld)
        return CUDA_INVALID(d, "%s: NH * HD = %lld is more than the row length ld = %lld",
                            op, (long long)(NH * HD), (long long)ld);
    if (B * T == 0 || NH * HD == 0)
        return DT_OK;
    CUDA_PTR(d, op, out, B * T * ld);
    CUDA_PTR(d, op, inp, B * T * ld);
    CUDA_PTR(d, op, cos_t, T * HD / 2);
    CUDA_PTR(d, op, sin_t, T * HD / 2);
    int mode = !backward ? 0 : out == inp ? 2 : 1;
    CUDA_LAUNCHED(d, op, cuda_launch_rope(st->cs, out, inp, cos_t, sin_t, dtype, B, T, NH,
                                          HD, ld, mode));
    return DT_OK;
}

int cuda_rope_forward(dt_device_t *d, dt_stream_t *s, void *out, const void *inp,
                      const float *cos_t, const float *sin_t, int dtype, int64_t B, int64_t T,
                      int64_t NH, int64_t HD, int64_t ld)
{
    return rope(d, s, "rope_forward", out, inp, cos_t, sin_t, dtype, B, T, NH, HD, ld, 0);
}

int cuda_rope_backward(dt_device_t *d, dt_stream_t *s, void *dinp, const void *dout,
                       const float *cos_t, const float *sin_t, int dtype, int64_t B,
                       int64_t T, int64_t NH, int64_t HD, int64_t ld)
{
    return rope(d, s, "rope_backward", dinp, dout, cos_t, sin_t, dtype, B, T, NH, HD, ld, 1);
}

int cuda_swiglu_forward(dt_device_t *d, dt_stream_t *s, void *out, const void *inp,
                        int dtype, int64_t N, int64_t H)
{
    static const char op[] = "swiglu_forward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, N);
    CUDA_DIM(d, op, H);
    CUDA_PTR(d, op, out, N * H);
    CUDA_PTR(d, op, inp, 2 * N * H);
    CUDA_LAUNCHED(d, op, cuda_launch_swiglu_forward(st->cs, out, inp, dtype, N, H));
    return DT_OK;
}

int cuda_swiglu_backward(dt_device_t *d, dt_stream_t *s, void *dinp, const void *inp,
                         const void *dout, int dtype, int64_t N, int64_t H)
{
    static const char op[] = "swiglu_backward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, N);
    CUDA_DIM(d, op, H);
    CUDA_PTR(d, op, dinp, 2 * N * H);
    CUDA_PTR(d, op, inp, 2 * N * H);
    CUDA_PTR(d, op, dout, N * H);
    CUDA_LAUNCHED(d, op, cuda_launch_swiglu_backward(st->cs, dinp, inp, dout, dtype, N, H));
    return DT_OK;
}

/* Grouped-query shapes: NKV >= 1 divides NH; the fused row kernels' limits
 * (a score row in shared memory; B, NH in a grid dimension). */
static int gqa_check(dt_device_t *d, const char *op, int dtype, int64_t B, int64_t T,
                     int64_t NH, int64_t NKV, int64_t HD)
{
    CHECK(cuda_check_act(d, op, dtype));
    CUDA_DIM(d, op, B);
    CUDA_DIM(d, op, T);
    CUDA_DIM(d, op, NH);
    CUDA_DIM(d, op, NKV);
    CUDA_DIM(d, op, HD);
    if (NKV == 0 || NH % NKV != 0)
        return CUDA_INVALID(d, "%s: NH = %lld is not a multiple of NKV = %lld", op,
                            (long long)NH, (long long)NKV);
    if (T > CUDA_ATTENTION_MAX_T)
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: T = %lld: the cuda device's attention runs T <= %d",
                                  op, (long long)T, CUDA_ATTENTION_MAX_T);
    if (B > 65535 || NH > 65535)
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: B = %lld, NH = %lld: at most 65535 each", op,
                                  (long long)B, (long long)NH);
    return DT_OK;
}

int cuda_gqa_attention_forward(dt_device_t *d, dt_stream_t *s, void *out, void *state,
                               const void *qkv, int dtype, int64_t B, int64_t T, int64_t NH,
                               int64_t NKV, int64_t HD)
{
    static const char op[] = "gqa_attention_forward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(gqa_check(d, op, dtype, B, T, NH, NKV, HD));
    CUDA_PTR(d, op, out, B * T * NH * HD);
    CUDA_PTR(d, op, state, B * NH * T);
    CUDA_PTR(d, op, qkv, B * T * (NH + 2 * NKV) * HD);
    CUDA_LAUNCHED(d, op, cuda_launch_gqa_attention_forward(st->cs, out, state, qkv, dtype, B,
                                                           T, NH, NKV, HD));
    return DT_OK;
}

int cuda_gqa_attention_backward(dt_device_t *d, dt_stream_t *s, void *dqkv, const void *dout,
                                const void *qkv, const void *out, const void *state,
                                int dtype, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                int64_t HD)
{
    static const char op[] = "gqa_attention_backward";
    CUDA_BEGIN(d, s, op, st);
    CHECK(gqa_check(d, op, dtype, B, T, NH, NKV, HD));
    CUDA_PTR(d, op, dqkv, B * T * (NH + 2 * NKV) * HD);
    CUDA_PTR(d, op, dout, B * T * NH * HD);
    CUDA_PTR(d, op, qkv, B * T * (NH + 2 * NKV) * HD);
    CUDA_PTR(d, op, out, B * T * NH * HD);
    CUDA_PTR(d, op, state, B * NH * T);
    CUDA_LAUNCHED(d, op, cuda_launch_gqa_attention_backward(st->cs, dqkv, dout, qkv, out,
                                                            state, dtype, B, T, NH, NKV, HD));
    return DT_OK;
}
