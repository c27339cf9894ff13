/*
 * plugins/cuda/cuda_nn.cu - the cuda device's row and gather kernels:
 * embedding forward/backward, LayerNorm forward/backward, softmax
 * cross-entropy forward/backward, and the bias gradient of a matmul.
 * Reductions over rows (LayerNorm's dweight/dbias, the bias gradient)
 * give each block 16 columns and 32 or 64 row lanes: a half-warp reads 16
 * consecutive columns of one row, each lane adds its rows (lane, lane +
 * lanes, ...) in order in a register, and a fixed tree in shared memory
 * adds the lanes.  No atomics and no scratch in global memory; the order
 * depends only on N and C, so the same bits every run.  dwpe sums over B
 * in order per (t, c), one thread each (T * C threads fill the GPU).
 * Only dwte has an atomic path (the default), since a per-column walk over
 * every token is slow; `deterministic` turns it off.  Compiled for sm_80
 * and sm_90; ran on an H200 (test_kernels, the GPT-2 oracle).
 */
#include "cuda_dtype.cuh"
#include "cuda_launch.h"

#define LN_EPS 1e-5f
#define ROW_BLOCK 256

/* The row of token id `tok` in a table holding ids [v0, v0 + nv), or -1
 * when another rank holds it (the whole vocabulary: v0 0, nv INT64_MAX). */
__device__ __forceinline__ int64_t vocab_row(int32_t tok, int64_t v0, int64_t nv)
{
    int64_t r = (int64_t)tok - v0;
    return r >= 0 && r < nv ? r : -1;
}

/* wpe may be NULL (a vocabulary range without the positions). */
template <typename T>
__global__ void embedding_fwd(T *out, const int32_t *tokens, const T *wte,
                              const T *wpe, int64_t BT, int64_t T_, int64_t C,
                              int64_t v0, int64_t nv)
{
    int64_t n = BT * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t bt = i / C, c = i % C, t = bt % T_, r = vocab_row(tokens[bt], v0, nv);
        float x = r >= 0 ? ld(wte, r * C + c) : 0.0f;
        if (wpe)
            x += ld(wpe, t * C + c);
        st(out, i, x);
    }
}

template <typename T>
__global__ void embedding_bwd_wte_atomic(float *dwte, const T *dout,
                                         const int32_t *tokens, int64_t BT,
                                         int64_t C, int64_t v0, int64_t nv)
{
    int64_t n = BT * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t bt = i / C, c = i % C, r = vocab_row(tokens[bt], v0, nv);
        if (r >= 0)
            atomicAdd(&dwte[r * C + c], ld(dout, i));
    }
}

/* One thread per channel, tokens in order. */
template <typename T>
__global__ void embedding_bwd_wte_ordered(float *dwte, const T *dout,
                                          const int32_t *tokens, int64_t BT,
                                          int64_t C, int64_t v0, int64_t nv)
{
    int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int64_t bt = 0; bt < BT; bt++) {
        int64_t r = vocab_row(tokens[bt], v0, nv);
        if (r >= 0)
            dwte[r * C + c] += ld(dout, bt * C + c);
    }
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

/* Column reductions over the N rows of a row-major (N, C) array.  A block
 * of (COL_TILE, RL) threads owns COL_TILE consecutive columns; thread
 * (tx, ty) adds column blockIdx.x * COL_TILE + tx over rows ty, ty + RL,
 * ty + 2 RL, ... in that order, then col_tree_sum adds the RL partials.
 * A half-warp is COL_TILE consecutive elements of one row, so loads are
 * whole 32-byte sectors even for bf16.  COL_UNROLL rows are loaded before
 * they are added (still in row order): with C = 768 only 48 blocks run,
 * and each of their SMs needs many loads in flight to draw bandwidth. */
#define COL_TILE 16
#define COL_UNROLL 8

/* sh[l][tx] += sh[l + s][tx] for s = RL / 2, ..., 1, l < s: a fixed tree,
 * so sh[0][tx] ends as the column's total, in thread (tx, 0), which did
 * the last add itself.  Every thread calls it after writing sh[ty][tx]. */
template <int RL>
__device__ __forceinline__ void col_tree_sum(float (*sh)[COL_TILE])
{
    static_assert(RL > 0 && (RL & (RL - 1)) == 0, "row lanes: a power of two");
    int tx = threadIdx.x, ty = threadIdx.y;
    for (int s = RL / 2; s > 0; s >>= 1) {
        __syncthreads();
        if (ty < s)
            sh[ty][tx] += sh[ty + s][tx];
    }
}

/* The launch bounds keep 1024 threads of either block size resident on an
 * SM (at most 64 registers a thread), so two 512-thread blocks can share
 * one. */
template <typename T, int RL>
__global__ void __launch_bounds__(COL_TILE * RL, 1024 / (COL_TILE * RL))
layernorm_bwd_params(float *dweight, float *dbias, const T *dout,
                     const T *inp, const float *mean, const float *rstd,
                     int64_t N, int64_t C)
{
    __shared__ float shw[RL][COL_TILE], shb[RL][COL_TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t c = (int64_t)blockIdx.x * COL_TILE + tx;
    float dw = 0.0f, db = 0.0f;
    if (c < C) {
        int64_t n = ty;
        for (; n + (COL_UNROLL - 1) * RL < N; n += COL_UNROLL * RL) {
            float dy[COL_UNROLL], x[COL_UNROLL], m[COL_UNROLL], r[COL_UNROLL];
#pragma unroll
            for (int u = 0; u < COL_UNROLL; u++) {
                int64_t row = n + u * RL;
                dy[u] = ld(dout, row * C + c);
                x[u] = ld(inp, row * C + c);
                m[u] = mean[row];
                r[u] = rstd[row];
            }
#pragma unroll
            for (int u = 0; u < COL_UNROLL; u++) {
                dw += dy[u] * (x[u] - m[u]) * r[u];
                db += dy[u];
            }
        }
        for (; n < N; n += RL) {
            float g = ld(dout, n * C + c);
            dw += g * (ld(inp, n * C + c) - mean[n]) * rstd[n];
            db += g;
        }
    }
    /* Columns past C add zeros and still reach every barrier. */
    shw[ty][tx] = dw;
    shb[ty][tx] = db;
    col_tree_sum<RL>(shw);
    col_tree_sum<RL>(shb);
    if (ty == 0 && c < C) {
        if (dweight)
            dweight[c] += shw[0][tx];
        if (dbias)
            dbias[c] += shb[0][tx];
    }
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

/* One phase of the vocabulary-parallel cross-entropy over the columns
 * [v0, v0 + V) of row blockIdx.x (device.h): 0 the row's maximum, 1 its
 * sum of exponentials and its target's logit (0 when another rank holds
 * it), 2 the probabilities and the loss from the reduced statistics. */
template <typename T>
__global__ void vocab_xent_fwd(int phase, float *stats, float *losses, T *probs,
                               const T *logits, const int32_t *targets, int64_t N,
                               int64_t V, int64_t v0)
{
    __shared__ float sh[32];
    int64_t row = blockIdx.x;
    const T *x = logits + row * V;
    if (phase == 0) {
        float mx = -INFINITY;
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
            mx = fmaxf(mx, ld(x, i));
        mx = block_max(mx, sh);
        if (threadIdx.x == 0)
            stats[row] = mx;
        return;
    }
    const float mx = stats[row];
    if (phase == 1) {
        float s = 0.0f;
        for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
            s += expf(ld(x, i) - mx);
        s = block_sum(s, sh);
        if (threadIdx.x == 0) {
            int64_t r = (int64_t)targets[row] - v0;
            stats[N + row] = s;
            stats[2 * N + row] = r >= 0 && r < V ? ld(x, r) : 0.0f;
        }
        return;
    }
    const float s = stats[N + row], inv = 1.0f / s;
    T *p = probs + row * V;
    for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
        st(p, i, expf(ld(x, i) - mx) * inv);
    if (threadIdx.x == 0)
        losses[row] = logf(s) - (stats[2 * N + row] - mx);
}

/* dlogits += dloss (probs - onehot(target)): the columns are vocabulary
 * ids [v0, v0 + V) (the whole vocabulary: v0 0). */
template <typename T>
__global__ void softmax_xent_bwd(T *dlogits, const T *probs,
                                 const int32_t *targets, float dloss,
                                 int64_t N, int64_t V, int64_t v0)
{
    int64_t n = N * V;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / V, v = i % V;
        float y = v + v0 == (int64_t)targets[row] ? 1.0f : 0.0f;
        st(dlogits, i, ld(dlogits, i) + dloss * (ld(probs, i) - y));
    }
}

template <typename T, int RL>
__global__ void __launch_bounds__(COL_TILE * RL, 1024 / (COL_TILE * RL))
bias_bwd(float *dbias, const T *dout, int64_t N, int64_t OC)
{
    __shared__ float sh[RL][COL_TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t o = (int64_t)blockIdx.x * COL_TILE + tx;
    float acc = 0.0f;
    if (o < OC) {
        int64_t n = ty;
        for (; n + (COL_UNROLL - 1) * RL < N; n += COL_UNROLL * RL) {
            float v[COL_UNROLL];
#pragma unroll
            for (int u = 0; u < COL_UNROLL; u++)
                v[u] = ld(dout, (n + u * RL) * OC + o);
#pragma unroll
            for (int u = 0; u < COL_UNROLL; u++)
                acc += v[u];
        }
        for (; n < N; n += RL)
            acc += ld(dout, n * OC + o);
    }
    sh[ty][tx] = acc;
    col_tree_sum<RL>(sh);
    if (ty == 0 && o < OC)
        dbias[o] += sh[0][tx];
}

static unsigned cols_grid(int64_t C) { return (unsigned)((C + DT_BLOCK - 1) / DT_BLOCK); }

/* Row lanes of a column-reduction block, from the number of column tiles
 * alone (so a shape's summation order, hence its bits, is the same on any
 * GPU): 64 (1024 threads) while there are few enough tiles for each block
 * to have an SM to itself on current GPUs (108 to 132 SMs), as the few busy
 * SMs need many loads in flight; 32 beyond, so two blocks share an SM and
 * C = 2304 or 3072 (144 or 192 tiles) runs in one wave on 132 SMs. */
#define COL_WIDE_MAX_TILES 96
static int64_t col_tiles(int64_t C) { return (C + COL_TILE - 1) / COL_TILE; }

extern "C" {

cudaError_t cuda_launch_embedding_forward(cudaStream_t cs, void *out,
                                          const int32_t *tokens,
                                          const void *wte, const void *wpe,
                                          int dtype, int64_t B, int64_t T,
                                          int64_t C, int64_t v0, int64_t nv)
{
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        embedding_fwd<E><<<dt_grid(B * T * C), DT_BLOCK, 0, cs>>>(
            (E *)out, tokens, (const E *)wte, (const E *)wpe, B * T, T, C, v0, nv);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_embedding_backward(cudaStream_t cs, float *dwte,
                                           float *dwpe, const void *dout,
                                           const int32_t *tokens, int dtype,
                                           int64_t B, int64_t T, int64_t C,
                                           int64_t v0, int64_t nv,
                                           int deterministic)
{
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        if (dwte && deterministic)
            embedding_bwd_wte_ordered<E><<<cols_grid(C), DT_BLOCK, 0, cs>>>(
                dwte, (const E *)dout, tokens, B * T, C, v0, nv);
        else if (dwte)
            embedding_bwd_wte_atomic<E><<<dt_grid(B * T * C), DT_BLOCK, 0, cs>>>(
                dwte, (const E *)dout, tokens, B * T, C, v0, nv);
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
        int64_t tiles = col_tiles(C);
        if (tiles == 0)
            return e;
        if (tiles > INT32_MAX)
            return cudaErrorInvalidValue;
        if (tiles <= COL_WIDE_MAX_TILES)
            layernorm_bwd_params<E, 64><<<(unsigned)tiles, dim3(COL_TILE, 64), 0, cs>>>(
                dweight, dbias, (const E *)dout, (const E *)inp, mean, rstd, N, C);
        else
            layernorm_bwd_params<E, 32><<<(unsigned)tiles, dim3(COL_TILE, 32), 0, cs>>>(
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
                                              int64_t N, int64_t V, int64_t v0)
{
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        softmax_xent_bwd<E><<<dt_grid(N * V), DT_BLOCK, 0, cs>>>(
            (E *)dlogits, (const E *)probs, targets, dloss, N, V, v0);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_vocab_xent_forward(cudaStream_t cs, int phase, float *stats,
                                           float *losses, void *probs, const void *logits,
                                           const int32_t *targets, int dtype, int64_t N,
                                           int64_t V, int64_t v0)
{
    if (N == 0)
        return cudaSuccess;
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        vocab_xent_fwd<E><<<(unsigned)N, ROW_BLOCK, 0, cs>>>(
            phase, stats, losses, (E *)probs, (const E *)logits, targets, N, V, v0);
        return cudaGetLastError();
    });
}

cudaError_t cuda_launch_bias_backward(cudaStream_t cs, float *dbias,
                                      const void *dout, int dtype, int64_t N,
                                      int64_t OC)
{
    int64_t tiles = col_tiles(OC);
    if (tiles == 0)
        return cudaSuccess;
    if (tiles > INT32_MAX)
        return cudaErrorInvalidValue;
    return dt_dispatch(dtype, [&](auto *t) {
        using E = DT_ELEM(t);
        if (tiles <= COL_WIDE_MAX_TILES)
            bias_bwd<E, 64><<<(unsigned)tiles, dim3(COL_TILE, 64), 0, cs>>>(
                dbias, (const E *)dout, N, OC);
        else
            bias_bwd<E, 32><<<(unsigned)tiles, dim3(COL_TILE, 32), 0, cs>>>(
                dbias, (const E *)dout, N, OC);
        return cudaGetLastError();
    });
}

} /* extern "C" */
