/*
 * plugins/cuda/cuda_dtype.cuh - what the cuda device's .cu files share:
 * element loads and stores as float for the dtypes the kernels run (f32,
 * bf16, f16; stores round to nearest even), the dtype dispatch, and the
 * launch geometry of element-wise kernels.
 */
#ifndef DT_CUDA_DTYPE_CUH
#define DT_CUDA_DTYPE_CUH

#include <math.h>
#include <stdint.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "dtrain/tensor.h"

/* The element type a dispatch lambda was called with. */
#define DT_ELEM(t) typename std::remove_pointer<decltype(t)>::type

__device__ __forceinline__ float ld(const float *p, int64_t i) { return p[i]; }
/* Widening is exact; a NaN keeps its sign and payload (dtrain/half.h's
 * rule).  bf16 is the top half of an f32.  f16's hardware conversion
 * (cvt.f32.f16) returns one canonical positive NaN, as the H200 showed
 * (test_kernels' exhaustive cast), so NaNs take the bit path. */
__device__ __forceinline__ float ld(const __nv_bfloat16 *p, int64_t i)
{
    return __uint_as_float((uint32_t)__bfloat16_as_ushort(p[i]) << 16);
}
__device__ __forceinline__ float ld(const __half *p, int64_t i)
{
    unsigned short h = __half_as_ushort(p[i]);
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0)
        return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7F800000u |
                               ((uint32_t)(h & 0x03FFu) << 13));
    return __half2float(p[i]);
}
__device__ __forceinline__ void st(float *p, int64_t i, float v) { p[i] = v; }
/* NaN keeps its sign and becomes the quiet NaN (as the cpu device and
 * tests/support/ref_kernels.c do; the intrinsics return one positive
 * canonical NaN); everything else rounds to nearest even, overflowing to
 * infinity. */
__device__ __forceinline__ void st(__nv_bfloat16 *p, int64_t i, float v)
{
    if (isnan(v))
        p[i] = __ushort_as_bfloat16(
            (unsigned short)(((__float_as_uint(v) >> 16) & 0x8000u) | 0x7FC0u));
    else
        p[i] = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void st(__half *p, int64_t i, float v)
{
    if (isnan(v))
        p[i] = __ushort_as_half(
            (unsigned short)(((__float_as_uint(v) >> 16) & 0x8000u) | 0x7E00u));
    else
        p[i] = __float2half_rn(v);
}

/* Call F.template operator()<T>() with T the element type of `dtype`
 * (f32 or bf16; f16 too when F16 is true); cudaErrorInvalidValue for
 * another (the caller checked, so never in practice). */
template <bool F16 = false, typename F>
static cudaError_t dt_dispatch(int dtype, F f)
{
    switch (dtype) {
    case DT_F32: return f((float *)0);
    case DT_BF16: return f((__nv_bfloat16 *)0);
    case DT_F16:
        if (F16)
            return f((__half *)0);
        return cudaErrorInvalidValue;
    default: return cudaErrorInvalidValue;
    }
}

/* Grid-stride loops: at most this many blocks of DT_BLOCK threads. */
#define DT_BLOCK 256
static inline unsigned dt_grid(int64_t n)
{
    int64_t b = (n + DT_BLOCK - 1) / DT_BLOCK;
    if (b > 65535 * 8)
        b = 65535 * 8;
    return (unsigned)(b > 0 ? b : 1);
}

/* Sum of v over the block (blockDim.x a multiple of 32, <= 1024), in a
 * fixed order; every thread gets the result.  `sh` holds 32 T. */
template <typename T>
__device__ __forceinline__ T block_sum(T v, T *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? sh[lane] : (T)0;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T>
__device__ __forceinline__ T block_max(T v, T *sh)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    int nw = (blockDim.x + 31) >> 5;
    v = lane < nw ? sh[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif /* DT_CUDA_DTYPE_CUH */
