/*
 * plugins/cuda/cuda_elementwise.cu - the cuda device's element-wise
 * kernels: GELU forward/backward, residual, axpy, scale, casts, and the
 * sum of squares (two passes, no atomics, so the same bits every run).
 * Compiled for sm_80 and sm_90; ran on an H200 (test_kernels).
 */
#include <math.h>

#include "cuda_dtype.cuh"
#include "cuda_launch.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

template <typename T>
__global__ void gelu_fwd(T *out, const T *inp, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float x = ld(inp, i);
        float u = GELU_K * (x + 0.044715f * x * x * x);
        st(out, i, 0.5f * x * (1.0f + tanhf(u)));
    }
}

template <typename T>
__global__ void gelu_bwd(T *dinp, const T *inp, const T *dout, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float x = ld(inp, i);
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) +
                  0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        st(dinp, i, ld(dinp, i) + g * ld(dout, i));
    }
}

template <typename T>
__global__ void residual_k(T *out, const T *a, const T *b, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        st(out, i, ld(a, i) + ld(b, i));
}

template <typename T>
__global__ void axpy_k(T *y, const T *x, float alpha, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        st(y, i, ld(y, i) + alpha * ld(x, i));
}

template <typename T>
__global__ void scale_k(T *x, float alpha, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        st(x, i, alpha * ld(x, i));
}

/* Through float: exact for every f16/bf16 value, and one rounding to the
 * narrower type (f32 -> bf16/f16; bf16 <-> f16 rounds once too, since
 * both widen exactly to f32). */
template <typename D, typename S>
__global__ void cast_k(D *dst, const S *src, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        st(dst, i, ld(src, i));
}

template <typename T>
__global__ void sumsq_partial(double *partials, const T *x, int64_t n)
{
    __shared__ double sh[32];
    double acc = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        double v = (double)ld(x, i);
        acc += v * v;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = acc;
}

__global__ void sumsq_final(double *out, const double *partials, int np)
{
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < np; i += blockDim.x)
        acc += partials[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0)
        *out = acc;
}

extern "C" {

cudaError_t cuda_launch_gelu_forward(cudaStream_t cs, void *out,
                                     const void *inp, int dtype, int64_t n)
{
    return dt_dispatch(dtype, [&](auto *t) {
        using T = DT_ELEM(t);
        gelu_fwd<T><<<dt_grid(n), DT_BLOCK, 0, cs>>>((T *)out, (const T *)inp, n);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_gelu_backward(cudaStream_t cs, void *dinp,
                                      const void *inp, const void *dout,
                                      int dtype, int64_t n)
{
    return dt_dispatch(dtype, [&](auto *t) {
        using T = DT_ELEM(t);
        gelu_bwd<T><<<dt_grid(n), DT_BLOCK, 0, cs>>>((T *)dinp, (const T *)inp,
                                                      (const T *)dout, n);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_residual(cudaStream_t cs, void *out, const void *a,
                                 const void *b, int dtype, int64_t n)
{
    return dt_dispatch(dtype, [&](auto *t) {
        using T = DT_ELEM(t);
        residual_k<T><<<dt_grid(n), DT_BLOCK, 0, cs>>>((T *)out, (const T *)a,
                                                        (const T *)b, n);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_axpy(cudaStream_t cs, void *y, const void *x,
                             int dtype, float alpha, int64_t n)
{
    return dt_dispatch(dtype, [&](auto *t) {
        using T = DT_ELEM(t);
        axpy_k<T><<<dt_grid(n), DT_BLOCK, 0, cs>>>((T *)y, (const T *)x, alpha, n);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_scale(cudaStream_t cs, void *x, int dtype,
                              float alpha, int64_t n)
{
    return dt_dispatch(dtype, [&](auto *t) {
        using T = DT_ELEM(t);
        scale_k<T><<<dt_grid(n), DT_BLOCK, 0, cs>>>((T *)x, alpha, n);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_cast(cudaStream_t cs, void *dst, int dst_dtype,
                             const void *src, int src_dtype, int64_t n)
{
    return dt_dispatch<true>(dst_dtype, [&](auto *d) {
        using D = DT_ELEM(d);
        return dt_dispatch<true>(src_dtype, [&](auto *s) {
            using S = DT_ELEM(s);
            cast_k<D, S><<<dt_grid(n), DT_BLOCK, 0, cs>>>((D *)dst, (const S *)src, n);
            return cudaGetLastError();
        });
    });
}

cudaError_t cuda_launch_sumsq(cudaStream_t cs, double *out, const void *x,
                              int dtype, int64_t n, double *partials,
                              int npartials)
{
    unsigned g = dt_grid(n);
    if (g > (unsigned)npartials)
        g = (unsigned)npartials;
    return dt_dispatch<true>(dtype, [&](auto *t) {
        using T = DT_ELEM(t);
        sumsq_partial<T><<<g, DT_BLOCK, 0, cs>>>(partials, (const T *)x, n);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            return e;
        sumsq_final<<<1, 1024, 0, cs>>>(out, partials, (int)g);
        return cudaGetLastError();
    });
}

} /* extern "C" */
