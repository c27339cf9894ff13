/*
 * plugins/cuda/cuda_attention.cu - causal multi-head self-attention for the
 * cuda device.
 *
 * Approach: a fused row kernel, not batched cuBLAS plus a softmax.  One
 * block per (batch, head, query row) computes that row's scores into
 * shared memory, its softmax and its output; the saved state is the
 * log-sum-exp per row, (B, NH, T) f32, as flash attention keeps, not the
 * (B, NH, T, T) probabilities: the probabilities are recomputed in the
 * backward pass.  Backward is two kernels: one block per query row for dq,
 * one block per key row for dk and dv (D_t = dout_t . out_t, the flash
 * attention identity, stands in for the softmax's row sums), so every
 * gradient element is written by one thread: no atomics, deterministic.
 * Why: it is short, exact in its arithmetic order, needs no T x T buffer,
 * and compiles to a handful of instantiations.  It does not use tensor
 * cores and does O(T^2 hs) work per head in plain FMAs, so it is far
 * slower than a tiled flash-attention kernel (the next step when a GPU is
 * there to measure on).  T <= CUDA_ATTENTION_MAX_T (shared memory per
 * row).  Compiled for sm_80 and sm_90; not yet run on a GPU.
 */
#include "cuda_dtype.cuh"
#include "cuda_launch.h"

#define ATT_BLOCK 128

/* qkv element (b, t, which in {0: q, 1: k, 2: v}, head h, d) */
__device__ __forceinline__ int64_t qkv_at(int64_t b, int64_t t, int which,
                                          int64_t h, int64_t d, int64_t T,
                                          int64_t C, int64_t hs)
{
    return (b * T + t) * 3 * C + which * C + h * hs + d;
}

template <typename E>
__global__ void att_fwd(E *out, float *lse, const E *qkv, int64_t T,
                        int64_t C, int64_t NH)
{
    extern __shared__ float sm[];
    __shared__ float red[32];
    int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = C / NH;
    float *sc = sm;          /* (t + 1) scores */
    float *q = sm + T;       /* (hs) */
    float scale = rsqrtf((float)hs);
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x)
        q[d] = ld(qkv, qkv_at(b, t, 0, h, d, T, C, hs));
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
        float acc = 0.0f;
        for (int64_t d = 0; d < hs; d++)
            acc += q[d] * ld(qkv, qkv_at(b, s, 1, h, d, T, C, hs));
        sc[s] = acc * scale;
        mx = fmaxf(mx, sc[s]);
    }
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
        sc[s] = expf(sc[s] - mx);
        sum += sc[s];
    }
    sum = block_sum(sum, red); /* syncs: every sc[s] is written */
    float inv = 1.0f / sum;
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x) {
        float acc = 0.0f;
        for (int64_t s = 0; s <= t; s++)
            acc += sc[s] * ld(qkv, qkv_at(b, s, 2, h, d, T, C, hs));
        st(out, (b * T + t) * C + h * hs + d, acc * inv);
    }
    if (threadIdx.x == 0)
        lse[(b * NH + h) * T + t] = mx + logf(sum);
}

/* dq for query row t: dq += scale sum_s dS[t,s] k_s with dS = P (dP - D). */
template <typename E>
__global__ void att_bwd_q(E *dqkv, const E *dout, const E *qkv, const E *out,
                          const float *lse, int64_t T, int64_t C, int64_t NH)
{
    extern __shared__ float sm[];
    __shared__ float red[32];
    int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = C / NH;
    float *ds = sm;              /* (t + 1) */
    float *q = sm + T, *dy = sm + T + hs;
    float scale = rsqrtf((float)hs);
    float l = lse[(b * NH + h) * T + t];
    float dpart = 0.0f;
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x) {
        q[d] = ld(qkv, qkv_at(b, t, 0, h, d, T, C, hs));
        dy[d] = ld(dout, (b * T + t) * C + h * hs + d);
        dpart += dy[d] * ld(out, (b * T + t) * C + h * hs + d);
    }
    float D = block_sum(dpart, red); /* syncs q, dy */
    for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
        float qk = 0.0f, dp = 0.0f;
        for (int64_t d = 0; d < hs; d++) {
            qk += q[d] * ld(qkv, qkv_at(b, s, 1, h, d, T, C, hs));
            dp += dy[d] * ld(qkv, qkv_at(b, s, 2, h, d, T, C, hs));
        }
        float p = expf(qk * scale - l);
        ds[s] = p * (dp - D);
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x) {
        float acc = 0.0f;
        for (int64_t s = 0; s <= t; s++)
            acc += ds[s] * ld(qkv, qkv_at(b, s, 1, h, d, T, C, hs));
        int64_t i = qkv_at(b, t, 0, h, d, T, C, hs);
        st(dqkv, i, ld(dqkv, i) + scale * acc);
    }
}

/* dk, dv for key row s: over the query rows t >= s. */
template <typename E>
__global__ void att_bwd_kv(E *dqkv, const E *dout, const E *qkv, const E *out,
                           const float *lse, int64_t T, int64_t C, int64_t NH)
{
    extern __shared__ float sm[];
    int64_t s = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = C / NH;
    float *P = sm, *ds = sm + T;        /* indexed by t */
    float *k = sm + 2 * T, *v = sm + 2 * T + hs;
    float scale = rsqrtf((float)hs);
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x) {
        k[d] = ld(qkv, qkv_at(b, s, 1, h, d, T, C, hs));
        v[d] = ld(qkv, qkv_at(b, s, 2, h, d, T, C, hs));
    }
    __syncthreads();
    for (int64_t t = s + threadIdx.x; t < T; t += blockDim.x) {
        float qk = 0.0f, dp = 0.0f, D = 0.0f;
        for (int64_t d = 0; d < hs; d++) {
            float dy = ld(dout, (b * T + t) * C + h * hs + d);
            qk += ld(qkv, qkv_at(b, t, 0, h, d, T, C, hs)) * k[d];
            dp += dy * v[d];
            D += dy * ld(out, (b * T + t) * C + h * hs + d);
        }
        float p = expf(qk * scale - lse[(b * NH + h) * T + t]);
        P[t] = p;
        ds[t] = p * (dp - D);
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x) {
        float dk = 0.0f, dv = 0.0f;
        for (int64_t t = s; t < T; t++) {
            dk += ds[t] * ld(qkv, qkv_at(b, t, 0, h, d, T, C, hs));
            dv += P[t] * ld(dout, (b * T + t) * C + h * hs + d);
        }
        int64_t ik = qkv_at(b, s, 1, h, d, T, C, hs);
        int64_t iv = qkv_at(b, s, 2, h, d, T, C, hs);
        st(dqkv, ik, ld(dqkv, ik) + scale * dk);
        st(dqkv, iv, ld(dqkv, iv) + dv);
    }
}

/* Dynamic shared memory beyond 48 KiB needs an opt-in per kernel. */
template <typename K>
static cudaError_t smem_opt_in(K kernel, size_t bytes)
{
    if (bytes <= 48 * 1024)
        return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)bytes);
}

extern "C" {

cudaError_t cuda_launch_attention_forward(cudaStream_t cs, void *out,
                                          float *lse, const void *qkv,
                                          int dtype, int64_t B, int64_t T,
                                          int64_t C, int64_t NH)
{
    if (B == 0 || T == 0 || NH == 0)
        return cudaSuccess;
    dim3 grid((unsigned)T, (unsigned)NH, (unsigned)B);
    size_t smem = (size_t)(T + C / NH) * sizeof(float);
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        cudaError_t e = smem_opt_in(att_fwd<E>, smem);
        if (e != cudaSuccess)
            return e;
        att_fwd<E><<<grid, ATT_BLOCK, smem, cs>>>((E *)out, lse, (const E *)qkv,
                                                  T, C, NH);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_attention_backward(cudaStream_t cs, void *dqkv,
                                           const void *dout, const void *qkv,
                                           const void *out, const float *lse,
                                           int dtype, int64_t B, int64_t T,
                                           int64_t C, int64_t NH)
{
    if (B == 0 || T == 0 || NH == 0)
        return cudaSuccess;
    dim3 grid((unsigned)T, (unsigned)NH, (unsigned)B);
    int64_t hs = C / NH;
    size_t smem_q = (size_t)(T + 2 * hs) * sizeof(float);
    size_t smem_kv = (size_t)(2 * T + 2 * hs) * sizeof(float);
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        cudaError_t e = smem_opt_in(att_bwd_q<E>, smem_q);
        if (e == cudaSuccess)
            e = smem_opt_in(att_bwd_kv<E>, smem_kv);
        if (e != cudaSuccess)
            return e;
        att_bwd_q<E><<<grid, ATT_BLOCK, smem_q, cs>>>(
            (E *)dqkv, (const E *)dout, (const E *)qkv, (const E *)out, lse, T, C, NH);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
        att_bwd_kv<E><<<grid, ATT_BLOCK, smem_kv, cs>>>(
            (E *)dqkv, (const E *)dout, (const E *)qkv, (const E *)out, lse, T, C, NH);
        return cudaGetLastError();
    });
}

} /* extern "C" */
