/*
 * plugins/cuda/cuda_nn.cu - the cuda device's row and gather kernels:
 * embedding forward/backward, LayerNorm forward/backward, softmax
 * cross-entropy forward/backward, and the bias gradient of a matmul.
 * Reductions over rows (LayerNorm's dweight/dbias, the bias gradient,
 * dwpe) walk the rows in order in one thread per column: no atomics, the
 * same bits every run.  Only dwte has an atomic path (the default), since
 * a per-column walk over every token is slow; `deterministic` turns it
 * off.  Compiled for sm_80 and sm_90; not yet run on a GPU.
 */
#include "cuda_dtype.cuh"
#include "cuda_launch.h"

#define LN_EPS 1e-5f
#define ROW_BLOCK 256

template <typename T>
__global__ void embedding_fwd(T *out, const int32_t *tokens, const T *wte,
                              const T *wpe, int64_t BT, int64_t T_, int64_t C)
{
    int64_t n = BT * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t bt = i / C, c = i % C, t = bt % T_;
        st(out, i, ld(wte, (int64_t)tokens[bt] * C + c) + ld(wpe, t * C + c));
    }
}

template <typename T>
__global__ void embedding_bwd_wte_atomic(float *dwte, const T *dout,
                                         const int32_t *tokens, int64_t BT,
                                         int64_t C)
{
    int64_t n = BT * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t bt = i / C, c = i % C;
        atomicAdd(&dwte[(int64_t)tokens[bt] * C + c], ld(dout, i));
    }
}

/* One thread per channel, tokens in order. */
template <typename T>
__global__ void embedding_bwd_wte_ordered(float *dwte, const T *dout,
                                          const int32_t *tokens, int64_t BT,
                                          int64_t C)
{
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int64_t bt = 0; bt < BT; bt++)
        dwte[(int64_t)tokens[bt] * C + c] += ld(dout, bt * C + c);
}

/* One thread per (t, c), over b in order. */
template <typename T>
__global__ void embedding_bwd_wpe(float *dwpe, const T *dout, int64_t B,
                                  int64_t T_, int64_t C)
{
    int64_t n = T_ * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int64_t b = 0; b < B; b++)
            acc += ld(dout, b * n + i);
        dwpe[i] += acc;
    }
}

/* One block per row; two passes over the row (mean, then variance) so a
 * large mean does not cancel the variance. */
template <typename T>
__global__ void layernorm_fwd(T *out, float *mean, float *rstd, const T *inp,
                              const T *w, const T *b, int64_t C)
{
    __shared__ float sh[32];
    int64_t row = blockIdx.x;
    const T *x = inp + row * C;
    T *o = out + row * C;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
        s += ld(x, i);
    float m = block_sum(s, sh) / (float)C;
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
        float d = ld(x, i) - m;
        v += d * d;
    }
    float r = rsqrtf(block_sum(v, sh) / (float)C + LN_EPS);
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x)
        st(o, i, (ld(x, i) - m) * r * ld(w, i) + ld(b, i));
    if (threadIdx.x == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

template <typename T>
__global__ void layernorm_bwd_inp(T *dinp, const T *dout, const T *inp,
                                  const T *w, const float *mean,
                                  const float *rstd, int64_t C)
{
    __shared__ float sh[32];
    int64_t row = blockIdx.x;
    const T *x = inp + row * C, *dy = dout + row * C;
    T *dx = dinp + row * C;
    float m = mean[row], r = rstd[row];
    float a = 0.0f, bsum = 0.0f;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
        float dn = ld(w, i) * ld(dy, i);
        a += dn;
        bsum += dn * (ld(x, i) - m) * r;
    }
    float dn_mean = block_sum(a, sh) / (float)C;
    float dnn_mean = block_sum(bsum, sh) / (float)C;
    for (int64_t i = threadIdx.x; i < C; i += blockDim.x) {
        float dn = ld(w, i) * ld(dy, i);
        float nrm = (ld(x, i) - m) * r;
        st(dx, i, ld(dx, i) + r * (dn - dn_mean - nrm * dnn_mean));
    }
}

template <typename T>
__global__ void layernorm_bwd_params(float *dweight, float *dbias,
                                     const T *dout, const T *inp,
                                     const float *mean, const float *rstd,
                                     int64_t N, int64_t C)
{
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float dw = 0.0f, db = 0.0f;
    for (int64_t n = 0; n < N; n++) {
        float dy = ld(dout, n * C + c);
        dw += dy * (ld(inp, n * C + c) - mean[n]) * rstd[n];
        db += dy;
    }
    if (dweight)
        dweight[c] += dw;
    if (dbias)
        dbias[c] += db;
}

template <typename T>
__global__ void softmax_xent_fwd(float *losses, T *probs, const T *logits,
                                 const int32_t *targets, int64_t V)
{
    __shared__ float sh[32];
    int64_t row = blockIdx.x;
    const T *x = logits + row * V;
    T *p = probs + row * V;
    float mx = -INFINITY;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, ld(x, i));
    mx = block_max(mx, sh);
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        s += expf(ld(x, i) - mx);
    s = block_sum(s, sh);
    float inv = 1.0f / s;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        st(p, i, expf(ld(x, i) - mx) * inv);
    if (threadIdx.x == 0)
        losses[row] = -(ld(x, targets[row]) - mx - logf(s));
}

template <typename T>
__global__ void softmax_xent_bwd(T *dlogits, const T *probs,
                                 const int32_t *targets, float dloss,
                                 int64_t N, int64_t V)
{
    int64_t n = N * V;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / V, v = i % V;
        float y = v == targets[row] ? 1.0f : 0.0f;
        st(dlogits, i, ld(dlogits, i) + dloss * (ld(probs, i) - y));
    }
}

template <typename T>
__global__ void bias_bwd(float *dbias, const T *dout, int64_t N, int64_t OC)
{
    int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (o >= OC)
        return;
    float acc = 0.0f;
    for (int64_t n = 0; n < N; n++)
        acc += ld(dout, n * OC + o);
    dbias[o] += acc;
}

static unsigned cols_grid(int64_t C) { return (unsigned)((C + DT_BLOCK - 1) / DT_BLOCK); }

extern "C" {

cudaError_t cuda_launch_embedding_forward(cudaStream_t cs, void *out,
                                          const int32_t *tokens,
                                          const void *wte, const void *wpe,
                                          int dtype, int64_t B, int64_t T,
                                          int64_t C)
{
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        embedding_fwd<E><<<dt_grid(B * T * C), DT_BLOCK, 0, cs>>>(
            (E *)out, tokens, (const E *)wte, (const E *)wpe, B * T, T, C);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_embedding_backward(cudaStream_t cs, float *dwte,
                                           float *dwpe, const void *dout,
                                           const int32_t *tokens, int dtype,
                                           int64_t B, int64_t T, int64_t C,
                                           int deterministic)
{
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        if (dwte && deterministic)
            embedding_bwd_wte_ordered<E><<<cols_grid(C), DT_BLOCK, 0, cs>>>(
                dwte, (const E *)dout, tokens, B * T, C);
        else if (dwte)
            embedding_bwd_wte_atomic<E><<<dt_grid(B * T * C), DT_BLOCK, 0, cs>>>(
                dwte, (const E *)dout, tokens, B * T, C);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess || !dwpe)
            return e;
        embedding_bwd_wpe<E><<<dt_grid(T * C), DT_BLOCK, 0, cs>>>(
            dwpe, (const E *)dout, B, T, C);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_layernorm_forward(cudaStream_t cs, void *out,
                                          float *mean, float *rstd,
                                          const void *inp, const void *weight,
                                          const void *bias, int dtype,
                                          int64_t N, int64_t C)
{
    if (N == 0)
        return cudaSuccess;
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        layernorm_fwd<E><<<(unsigned)N, ROW_BLOCK, 0, cs>>>(
            (E *)out, mean, rstd, (const E *)inp, (const E *)weight,
            (const E *)bias, C);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_layernorm_backward(cudaStream_t cs, void *dinp,
                                           float *dweight, float *dbias,
                                           const void *dout, const void *inp,
                                           const void *weight,
                                           const float *mean,
                                           const float *rstd, int dtype,
                                           int64_t N, int64_t C)
{
    if (N == 0)
        return cudaSuccess;
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        if (dinp)
            layernorm_bwd_inp<E><<<(unsigned)N, ROW_BLOCK, 0, cs>>>(
                (E *)dinp, (const E *)dout, (const E *)inp, (const E *)weight,
                mean, rstd, C);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess || (!dweight && !dbias))
            return e;
        layernorm_bwd_params<E><<<cols_grid(C), DT_BLOCK, 0, cs>>>(
            dweight, dbias, (const E *)dout, (const E *)inp, mean, rstd, N, C);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_softmax_xent_forward(cudaStream_t cs, float *losses,
                                             void *probs, const void *logits,
                                             const int32_t *targets,
                                             int dtype, int64_t N, int64_t V)
{
    if (N == 0)
        return cudaSuccess;
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        softmax_xent_fwd<E><<<(unsigned)N, ROW_BLOCK, 0, cs>>>(
            losses, (E *)probs, (const E *)logits, targets, V);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_softmax_xent_backward(cudaStream_t cs, void *dlogits,
                                              const void *probs,
                                              const int32_t *targets,
                                              int dtype, float dloss,
                                              int64_t N, int64_t V)
{
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        softmax_xent_bwd<E><<<dt_grid(N * V), DT_BLOCK, 0, cs>>>(
            (E *)dlogits, (const E *)probs, targets, dloss, N, V);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_bias_backward(cudaStream_t cs, float *dbias,
                                      const void *dout, int dtype, int64_t N,
                                      int64_t OC)
{
    if (OC == 0)
        return cudaSuccess;
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        bias_bwd<E><<<cols_grid(OC), DT_BLOCK, 0, cs>>>(dbias, (const E *)dout, N, OC);
        return cudaGetLastError();
    });
}

} /* extern "C" */
