/*
 * plugins/cuda/cuda_llama.cu - the device code of the LLaMA family's
 * kernels (cuda_kernels.c checks their arguments):
 *   - RMSNorm: one block per row (forward, and backward's dinp), dweight
 *     one thread per column summing the rows in order (no atomics);
 *   - RoPE: one thread per (row, head, pair), forward, backward
 *     accumulating, or backward in place;
 *   - SwiGLU: one thread per (row, j) of the fused (N, 2H) gate|up input;
 *   - grouped-query attention: the fused row kernels of
 *     cuda_attention.cu's fallback with the kv head of each query head
 *     (h / (NH / NKV)) and the packed (NH + 2 NKV) HD rows: one block per
 *     (query row, head) forward and for dq, one per (key row, kv head)
 *     for dk and dv, walking the group's query heads in order, so every
 *     gradient element is written by one thread (deterministic).  The
 *     state is the log-sum-exp per row, (B, NH, T) f32, as attention's.
 * Compiled for sm_80 and sm_90 with warnings as errors; NOT YET RUN on a
 * GPU (written where there was none): tests/unit/plugins/cpu/test_kernels_llama.c's
 * cuda variant is what checks it.
 */
#include "cuda_dtype.cuh"
#include "cuda_launch.h"

#define LL_ROW_BLOCK 256
#define LL_ATT_BLOCK 128

/* ------------------------------------------------------------- RMSNorm */

template <typename T>
__global__ void rms_fwd(T *out, float *rstd, const T *inp, const T *w, int64_t C, float eps)
{
    __shared__ float sh[32];
    int64_t row = blockIdx.x;
    const T *x = inp + row * C;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
        float v = ld(x, i);
        s += v * v;
    }
    float r = rsqrtf(block_sum(s, sh) / (float)C + eps);
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
        st(out + row * C, i, (ld(x, i) * r) * ld(w, i));
    if (threadIdx.x == 0)
        rstd[row] = r;
}

template <typename T>
__global__ void rms_bwd_inp(T *dinp, const T *dout, const T *inp, const T *w,
                            const float *rstd, int64_t C)
{
    __shared__ float sh[32];
    int64_t row = blockIdx.x;
    const T *x = inp + row * C, *dy = dout + row * C;
    T *dx = dinp + row * C;
    float r = rstd[row], a = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
        a += ld(w, i) * ld(dy, i) * (ld(x, i) * r);
    float m = block_sum(a, sh) / (float)C;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
        st(dx, i, ld(dx, i) + (ld(w, i) * ld(dy, i) - (ld(x, i) * r) * m) * r);
}

template <typename T>
__global__ void rms_bwd_weight(float *dweight, const T *dout, const T *inp, const float *rstd,
                               int64_t N, int64_t C)
{
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C;
         c += (int64_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int64_t n = 0; n < N; n++)
            acc += (ld(inp, n * C + c) * rstd[n]) * ld(dout, n * C + c);
        dweight[c] += acc;
    }
}

/* ---------------------------------------------------------------- RoPE */

/* mode 0 forward, 1 backward accumulating, 2 backward in place */
template <typename T>
__global__ void rope_k(T *out, const T *inp, const float *cs, const float *sn, int64_t BT,
                       int64_t T_, int64_t NH, int64_t HD, int64_t ldr, int mode)
{
    int64_t half = HD / 2, n = BT * NH * half;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = i % half, h = (i / half) % NH, r = i / (half * NH);
        int64_t o = r * ldr + h * HD + j, tj = (r % T_) * half + j;
        float c = cs[tj], s = sn[tj];
        float x0 = ld(inp, o), x1 = ld(inp, o + half);
        if (mode == 0) {
            st(out, o, x0 * c - x1 * s);
            st(out, o + half, x1 * c + x0 * s);
        } else {
            float y0 = x0 * c + x1 * s, y1 = x1 * c - x0 * s;
            if (mode == 1) {
                y0 += ld(out, o);
                y1 += ld(out, o + half);
            }
            st(out, o, y0);
            st(out, o + half, y1);
        }
    }
}

/* -------------------------------------------------------------- SwiGLU */

template <typename T>
__global__ void swiglu_fwd(T *out, const T *inp, int64_t N, int64_t H)
{
    int64_t n = N * H;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / H, j = i % H;
        float g = ld(inp, r * 2 * H + j), u = ld(inp, r * 2 * H + H + j);
        st(out, i, g / (1.0f + expf(-g)) * u);
    }
}

template <typename T>
__global__ void swiglu_bwd(T *dinp, const T *inp, const T *dout, int64_t N, int64_t H)
{
    int64_t n = N * H;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / H, j = i % H, ig = r * 2 * H + j, iu = ig + H;
        float g = ld(inp, ig), u = ld(inp, iu), dy = ld(dout, i);
        float en = expf(-g), sg = 1.0f / (1.0f + en);
        float om = isinf(en) ? 1.0f : en * sg;
        st(dinp, ig, ld(dinp, ig) + sg * (1.0f + g * om) * u * dy);
        st(dinp, iu, ld(dinp, iu) + g * sg * dy);
    }
}

/* ----------------------------------------------- grouped-query attention */

struct gqa_shape {
    int64_t T, NH, NKV, HD;
    __device__ int64_t ldq() const { return (NH + 2 * NKV) * HD; }
    /* row t of sequence b: q of head h, k and v of kv head g */
    __device__ int64_t q(int64_t b, int64_t t, int64_t h) const
    {
        return (b * T + t) * ldq() + h * HD;
    }
    __device__ int64_t k(int64_t b, int64_t t, int64_t g) const
    {
        return (b * T + t) * ldq() + (NH + g) * HD;
    }
    __device__ int64_t v(int64_t b, int64_t t, int64_t g) const
    {
        return k(b, t, g) + NKV * HD;
    }
    __device__ int64_t o(int64_t b, int64_t t, int64_t h) const
    {
        return (b * T + t) * NH * HD + h * HD;
    }
};

template <typename E>
__global__ void gqa_fwd(E *out, float *lse, const E *qkv, gqa_shape sp)
{
    extern __shared__ float sm[];
    __shared__ float red[32];
    int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = sp.HD;
    int64_t g = h / (sp.NH / sp.NKV);
    float *sc = sm, *q = sm + sp.T;
    float scale = 1.0f / sqrtf((float)hs);
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x)
        q[d] = ld(qkv, sp.q(b, t, h) + d);
    __syncthreads();
    float mx = -INFINITY;
    for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
        float acc = 0.0f;
        for (int64_t d = 0; d < hs; d++)
            acc += q[d] * ld(qkv, sp.k(b, s, g) + d);
        sc[s] = acc * scale;
        mx = fmaxf(mx, sc[s]);
    }
    mx = block_max(mx, red);
    float sum = 0.0f;
    for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
        sc[s] = expf(sc[s] - mx);
        sum += sc[s];
    }
    sum = block_sum(sum, red);
    float inv = 1.0f / sum;
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x) {
        float acc = 0.0f;
        for (int64_t s = 0; s <= t; s++)
            acc += sc[s] * ld(qkv, sp.v(b, s, g) + d);
        st(out, sp.o(b, t, h) + d, acc * inv);
    }
    if (threadIdx.x == 0)
        lse[(b * sp.NH + h) * sp.T + t] = mx + logf(sum);
}

template <typename E>
__global__ void gqa_bwd_q(E *dqkv, const E *dout, const E *qkv, const E *out,
                          const float *lse, gqa_shape sp)
{
    extern __shared__ float sm[];
    __shared__ float red[32];
    int64_t t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hs = sp.HD;
    int64_t g = h / (sp.NH / sp.NKV);
    float *ds = sm, *q = sm + sp.T, *dy = sm + sp.T + hs;
    float scale = 1.0f / sqrtf((float)hs);
    float l = lse[(b * sp.NH + h) * sp.T + t], dpart = 0.0f;
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x) {
        q[d] = ld(qkv, sp.q(b, t, h) + d);
        dy[d] = ld(dout, sp.o(b, t, h) + d);
        dpart += dy[d] * ld(out, sp.o(b, t, h) + d);
    }
    float D = block_sum(dpart, red);
    for (int64_t s = threadIdx.x; s <= t; s += blockDim.x) {
        float qk = 0.0f, dp = 0.0f;
        for (int64_t d = 0; d < hs; d++) {
            qk += q[d] * ld(qkv, sp.k(b, s, g) + d);
            dp += dy[d] * ld(qkv, sp.v(b, s, g) + d);
        }
        ds[s] = expf(qk * scale - l) * (dp - D);
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x) {
        float acc = 0.0f;
        for (int64_t s = 0; s <= t; s++)
            acc += ds[s] * ld(qkv, sp.k(b, s, g) + d);
        int64_t i = sp.q(b, t, h) + d;
        st(dqkv, i, ld(dqkv, i) + scale * acc);
    }
}

/* dk, dv of key row s of kv head g: the group's query heads in order, each
 * over the query rows t >= s; the sums kept in shared memory, each
 * element by the one thread that owns channel d. */
template <typename E>
__global__ void gqa_bwd_kv(E *dqkv, const E *dout, const E *qkv, const E *out,
                           const float *lse, gqa_shape sp)
{
    extern __shared__ float sm[];
    int64_t s = blockIdx.x, g = blockIdx.y, b = blockIdx.z, hs = sp.HD, T = sp.T;
    int64_t grp = sp.NH / sp.NKV;
    float *P = sm, *ds = sm + T, *k = sm + 2 * T, *v = k + hs, *ak = v + hs, *av = ak + hs;
    float scale = 1.0f / sqrtf((float)hs);
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x) {
        k[d] = ld(qkv, sp.k(b, s, g) + d);
        v[d] = ld(qkv, sp.v(b, s, g) + d);
        ak[d] = 0.0f;
        av[d] = 0.0f;
    }
    __syncthreads();
    for (int64_t h = g * grp; h < (g + 1) * grp; h++) {
        for (int64_t t = s + threadIdx.x; t < T; t += blockDim.x) {
            float qk = 0.0f, dp = 0.0f, D = 0.0f;
            for (int64_t d = 0; d < hs; d++) {
                float dy = ld(dout, sp.o(b, t, h) + d);
                qk += ld(qkv, sp.q(b, t, h) + d) * k[d];
                dp += dy * v[d];
                D += dy * ld(out, sp.o(b, t, h) + d);
            }
            float p = expf(qk * scale - lse[(b * sp.NH + h) * T + t]);
            P[t] = p;
            ds[t] = p * (dp - D);
        }
        __syncthreads();
        for (int64_t d = threadIdx.x; d < hs; d += blockDim.x) {
            float dk = 0.0f, dv = 0.0f;
            for (int64_t t = s; t < T; t++) {
                dk += ds[t] * ld(qkv, sp.q(b, t, h) + d);
                dv += P[t] * ld(dout, sp.o(b, t, h) + d);
            }
            ak[d] += scale * dk;
            av[d] += dv;
        }
        __syncthreads(); /* P, ds are rewritten by the next head */
    }
    for (int64_t d = threadIdx.x; d < hs; d += blockDim.x) {
        int64_t ik = sp.k(b, s, g) + d, iv = sp.v(b, s, g) + d;
        st(dqkv, ik, ld(dqkv, ik) + ak[d]);
        st(dqkv, iv, ld(dqkv, iv) + av[d]);
    }
}

template <typename K>
static cudaError_t ll_smem_opt_in(K kernel, size_t bytes)
{
    if (bytes <= 48 * 1024)
        return cudaSuccess;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)bytes);
}

extern "C" {

cudaError_t cuda_launch_rmsnorm_forward(cudaStream_t cs, void *out, float *rstd,
                                        const void *inp, const void *weight, int dtype,
                                        int64_t N, int64_t C, float eps)
{
    if (N == 0)
        return cudaSuccess;
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        rms_fwd<E><<<(unsigned)N, LL_ROW_BLOCK, 0, cs>>>((E *)out, rstd, (const E *)inp,
                                                         (const E *)weight, C, eps);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_rmsnorm_backward(cudaStream_t cs, void *dinp, float *dweight,
                                         const void *dout, const void *inp,
                                         const void *weight, const float *rstd, int dtype,
                                         int64_t N, int64_t C)
{
    if (N == 0 || C == 0)
        return cudaSuccess;
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        if (dinp) {
            rms_bwd_inp<E><<<(unsigned)N, LL_ROW_BLOCK, 0, cs>>>(
                (E *)dinp, (const E *)dout, (const E *)inp, (const E *)weight, rstd, C);
            cudaError_t e = cudaGetLastError();
            if (e != cudaSuccess)
                return e;
        }
        if (dweight)
            rms_bwd_weight<E><<<dt_grid(C), DT_BLOCK, 0, cs>>>(dweight, (const E *)dout,
                                                                (const E *)inp, rstd, N, C);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_rope(cudaStream_t cs, void *out, const void *inp, const float *cos_t,
                             const float *sin_t, int dtype, int64_t B, int64_t T, int64_t NH,
                             int64_t HD, int64_t ldr, int mode)
{
    int64_t n = B * T * NH * (HD / 2);
    if (n == 0)
        return cudaSuccess;
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        rope_k<E><<<dt_grid(n), DT_BLOCK, 0, cs>>>((E *)out, (const E *)inp, cos_t, sin_t,
                                                   B * T, T, NH, HD, ldr, mode);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_swiglu_forward(cudaStream_t cs, void *out, const void *inp, int dtype,
                                       int64_t N, int64_t H)
{
    if (N * H == 0)
        return cudaSuccess;
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        swiglu_fwd<E><<<dt_grid(N * H), DT_BLOCK, 0, cs>>>((E *)out, (const E *)inp, N, H);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_swiglu_backward(cudaStream_t cs, void *dinp, const void *inp,
                                        const void *dout, int dtype, int64_t N, int64_t H)
{
    if (N * H == 0)
        return cudaSuccess;
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        swiglu_bwd<E><<<dt_grid(N * H), DT_BLOCK, 0, cs>>>((E *)dinp, (const E *)inp,
                                                           (const E *)dout, N, H);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_gqa_attention_forward(cudaStream_t cs, void *out, float *lse,
                                              const void *qkv, int dtype, int64_t B,
                                              int64_t T, int64_t NH, int64_t NKV, int64_t HD)
{
    if (B == 0 || T == 0 || NH == 0)
        return cudaSuccess;
    gqa_shape sp = {T, NH, NKV, HD};
    dim3 grid((unsigned)T, (unsigned)NH, (unsigned)B);
    size_t smem = (size_t)(T + HD) * sizeof(float);
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        cudaError_t e = ll_smem_opt_in(gqa_fwd<E>, smem);
        if (e != cudaSuccess)
            return e;
        gqa_fwd<E><<<grid, LL_ATT_BLOCK, smem, cs>>>((E *)out, lse, (const E *)qkv, sp);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_gqa_attention_backward(cudaStream_t cs, void *dqkv, const void *dout,
                                               const void *qkv, const void *out,
                                               const float *lse, int dtype, int64_t B,
                                               int64_t T, int64_t NH, int64_t NKV, int64_t HD)
{
    if (B == 0 || T == 0 || NH == 0)
        return cudaSuccess;
    gqa_shape sp = {T, NH, NKV, HD};
    dim3 grid_q((unsigned)T, (unsigned)NH, (unsigned)B);
    dim3 grid_kv((unsigned)T, (unsigned)NKV, (unsigned)B);
    size_t smem_q = (size_t)(T + 2 * HD) * sizeof(float);
    size_t smem_kv = (size_t)(2 * T + 4 * HD) * sizeof(float);
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        cudaError_t e = ll_smem_opt_in(gqa_bwd_q<E>, smem_q);
        if (e == cudaSuccess)
            e = ll_smem_opt_in(gqa_bwd_kv<E>, smem_kv);
        if (e != cudaSuccess)
            return e;
        gqa_bwd_q<E><<<grid_q, LL_ATT_BLOCK, smem_q, cs>>>(
            (E *)dqkv, (const E *)dout, (const E *)qkv, (const E *)out, lse, sp);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
        gqa_bwd_kv<E><<<grid_kv, LL_ATT_BLOCK, smem_kv, cs>>>(
            (E *)dqkv, (const E *)dout, (const E *)qkv, (const E *)out, lse, sp);
        return cudaGetLastError();
    });
}

} /* extern "C" */
