/*
 * plugins/cuda/cuda_attention.cu - the device code of causal attention
 * (cuda_attention.c drives it):
 *   - the row kernels of the main path, between cuBLASLt's batched
 *     products: a score row's causal softmax and log-sum-exp (forward),
 *     and a row's P = exp(S - lse), D = dO . out and dS = P (dP - D)
 *     (backward); one block per (query row, head), one thread per output;
 *   - the fallback for when the scratch of the main path cannot be had:
 *     fused row kernels, one block per (batch, head, query row) computing
 *     that row's scores into shared memory, its softmax and its output;
 *     backward one block per query row for dq and one per key row for dk
 *     and dv, every gradient element written by one thread (no atomics,
 *     deterministic).  Plain FMAs, no tensor cores, O(T^2 hs) per head:
 *     slow, but no T x T buffer.  T <= CUDA_ATTENTION_MAX_T (a row in
 *     shared memory).
 * The saved state is the log-sum-exp per row, (B, NH, T) f32.
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
    float scale = 1.0f / sqrtf((float)hs); /* as cuda_attention.c's */
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
    float scale = 1.0f / sqrtf((float)hs); /* as cuda_attention.c's */
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
    float scale = 1.0f / sqrtf((float)hs); /* as cuda_attention.c's */
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

/* Row (t, h) of the (NH, T, T) scores S: P = softmax over s <= t, 0 above
 * the diagonal, written in the activations' type (in place when that is
 * f32: every element is read and written by the same thread, the writes
 * after the block's reductions); lse[h T + t] = max + log(sum). */
template <typename E>
__global__ void att_softmax_rows(E *P, float *lse, const float *S, int64_t T)
{
    __shared__ float red[32];
    int64_t t = blockIdx.x, h = blockIdx.y, row = (h * T + t) * T;
    float mx = -INFINITY;
    for (int64_t s = threadIdx.x; s <= t; s += blockDim.x)
        mx = fmaxf(mx, S[row + s]);
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int64_t s = threadIdx.x; s <= t; s += blockDim.x)
        sum += expf(S[row + s] - mx);
    sum = block_sum(sum, red);
    float inv = 1.0f / sum;
    for (int64_t s = threadIdx.x; s < T; s += blockDim.x)
        st(P, row + s, s <= t ? expf(S[row + s] - mx) * inv : 0.0f);
    if (threadIdx.x == 0)
        lse[h * T + t] = mx + logf(sum);
}

/* Row (t, h) in backward: P = exp(S - lse) (0 above the diagonal), D =
 * dO_t . out_t over the head's hs columns, dS = P (dP - D); P and dS in the
 * activations' type (in place of S and dP when that is f32, as above).
 * dout and out are one sequence's (T, C) rows. */
template <typename E>
__global__ void att_grad_rows(E *P, E *dS, const float *S, const float *dP,
                              const float *lse, const E *dout, const E *out,
                              int64_t T, int64_t C, int64_t NH)
{
    __shared__ float red[32];
    int64_t t = blockIdx.x, h = blockIdx.y, hs = C / NH, row = (h * T + t) * T;
    float part = 0.0f;
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x)
        part += ld(dout, t * C + h * hs + d) * ld(out, t * C + h * hs + d);
    float D = block_sum(part, red);
    float l = lse[h * T + t];
    for (int64_t s = threadIdx.x; s < T; s += blockDim.x) {
        float p = s <= t ? expf(S[row + s] - l) : 0.0f;
        float g = p * (dP[row + s] - D);
        st(P, row + s, p);
        st(dS, row + s, g);
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

cudaError_t cuda_launch_attention_softmax(cudaStream_t cs, void *P, float *lse,
                                          const float *S, int dtype, int64_t T,
                                          int64_t NH)
{
    if (T == 0 || NH == 0)
        return cudaSuccess;
    dim3 grid((unsigned)T, (unsigned)NH);
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        att_softmax_rows<E><<<grid, ATT_BLOCK, 0, cs>>>((E *)P, lse, S, T);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_attention_grad_rows(cudaStream_t cs, void *P, void *dS,
                                            const float *S, const float *dP,
                                            const float *lse, const void *dout,
                                            const void *out, int dtype, int64_t T,
                                            int64_t C, int64_t NH)
{
    if (T == 0 || NH == 0)
        return cudaSuccess;
    dim3 grid((unsigned)T, (unsigned)NH);
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        att_grad_rows<E><<<grid, ATT_BLOCK, 0, cs>>>((E *)P, (E *)dS, S, dP, lse,
                                                     (const E *)dout, (const E *)out,
                                                     T, C, NH);
        return cudaGetLastError();
    });
}

} /* extern "C" */
