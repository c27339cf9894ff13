/*
 * plugins/cuda/cuda_launch.h - the launchers of the cuda device's device
 * code (cuda_*.cu), callable from C.  Each enqueues its kernels on `cs` and
 * returns the launch's cudaError_t; arguments were checked by the caller
 * (cuda_kernels.c): shapes >= 0, pointers non-NULL where they cover
 * elements, dtypes among those the launcher runs (DT_F32, DT_BF16; f16
 * where said).  Shapes as in dtrain/device.h.
 */
#ifndef DT_CUDA_LAUNCH_H
#define DT_CUDA_LAUNCH_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Row kernels (layernorm, softmax_xent) launch one block per row: at most
 * this many rows (gridDim.x) per launch. */
#define CUDA_LAUNCH_MAX_ROWS 2147483647

/* ---- cuda_elementwise.cu ---- */
cudaError_t cuda_launch_gelu_forward(cudaStream_t cs, void *out,
                                     const void *inp, int dtype, int64_t n);
cudaError_t cuda_launch_gelu_backward(cudaStream_t cs, void *dinp,
                                      const void *inp, const void *dout,
                                      int dtype, int64_t n);
/* out = a + b */
cudaError_t cuda_launch_residual(cudaStream_t cs, void *out, const void *a,
                                 const void *b, int dtype, int64_t n);
/* y += alpha x */
cudaError_t cuda_launch_axpy(cudaStream_t cs, void *y, const void *x,
                             int dtype, float alpha, int64_t n);
/* x *= alpha */
cudaError_t cuda_launch_scale(cudaStream_t cs, void *x, int dtype,
                              float alpha, int64_t n);
/* dst = (dst_dtype) src: f32, bf16, f16 each way, round to nearest even */
cudaError_t cuda_launch_cast(cudaStream_t cs, void *dst, int dst_dtype,
                             const void *src, int src_dtype, int64_t n);
/* *out = sum x^2 in double: per-block partial sums into `partials`
 * (`npartials` doubles), then one block sums those in a fixed order:
 * deterministic, no atomics.  f32, bf16, f16. */
cudaError_t cuda_launch_sumsq(cudaStream_t cs, double *out, const void *x,
                              int dtype, int64_t n, double *partials,
                              int npartials);

/* ---- cuda_nn.cu ---- */
/* The embeddings take the vocabulary range [v0, v0 + nv) wte holds (the
 * whole vocabulary: 0, INT64_MAX); tokens outside it read and add
 * nothing; wpe may be NULL in forward. */
cudaError_t cuda_launch_embedding_forward(cudaStream_t cs, void *out,
                                          const int32_t *tokens,
                                          const void *wte, const void *wpe,
                                          int dtype, int64_t B, int64_t T,
                                          int64_t C, int64_t v0, int64_t nv);
/* deterministic: each thread owns one channel and walks the tokens in
 * order (no atomics); otherwise atomicAdd on dwte.  dwpe sums over B per
 * (t, c) in order either way. */
cudaError_t cuda_launch_embedding_backward(cudaStream_t cs, float *dwte,
                                           float *dwpe, const void *dout,
                                           const int32_t *tokens, int dtype,
                                           int64_t B, int64_t T, int64_t C,
                                           int64_t v0, int64_t nv,
                                           int deterministic);
cudaError_t cuda_launch_layernorm_forward(cudaStream_t cs, void *out,
                                          float *mean, float *rstd,
                                          const void *inp, const void *weight,
                                          const void *bias, int dtype,
                                          int64_t N, int64_t C);
/* dinp per row; dweight, dbias per column over the rows in a fixed order
 * (no atomics). */
cudaError_t cuda_launch_layernorm_backward(cudaStream_t cs, void *dinp,
                                           float *dweight, float *dbias,
                                           const void *dout, const void *inp,
                                           const void *weight,
                                           const float *mean,
                                           const float *rstd, int dtype,
                                           int64_t N, int64_t C);
cudaError_t cuda_launch_softmax_xent_forward(cudaStream_t cs, float *losses,
                                             void *probs, const void *logits,
                                             const int32_t *targets,
                                             int dtype, int64_t N, int64_t V);
cudaError_t cuda_launch_softmax_xent_backward(cudaStream_t cs, void *dlogits,
                                              const void *probs,
                                              const int32_t *targets,
                                              int dtype, float dloss,
                                              int64_t N, int64_t V, int64_t v0);
/* One phase of the vocabulary-parallel cross-entropy (device.h's
 * vocab_xent_forward): one block per row. */
cudaError_t cuda_launch_vocab_xent_forward(cudaStream_t cs, int phase, float *stats,
                                           float *losses, void *probs, const void *logits,
                                           const int32_t *targets, int dtype, int64_t N,
                                           int64_t V, int64_t v0);
/* dbias[o] += sum_n dout[n, o], per column in a fixed order (no atomics). */
cudaError_t cuda_launch_bias_backward(cudaStream_t cs, float *dbias,
                                      const void *dout, int dtype, int64_t N,
                                      int64_t OC);

/* ---- cuda_attention.cu ---- */
/* Largest T the attention kernels take (a row of scores in shared
 * memory, in the fallback). */
#define CUDA_ATTENTION_MAX_T 4096
/* The main path's row kernels, for one sequence: S, P (NH, T, T) row-major;
 * lse (NH, T); dout, out (T, C).  P may be S (f32), dS may be dP. */
cudaError_t cuda_launch_attention_softmax(cudaStream_t cs, void *P, float *lse,
                                          const float *S, int dtype, int64_t T,
                                          int64_t NH);
cudaError_t cuda_launch_attention_grad_rows(cudaStream_t cs, void *P, void *dS,
                                            const float *S, const float *dP,
                                            const float *lse, const void *dout,
                                            const void *out, int dtype, int64_t T,
                                            int64_t C, int64_t NH);
/* The fallback's fused row kernels, for the whole batch. */
cudaError_t cuda_launch_attention_forward(cudaStream_t cs, void *out,
                                          float *lse, const void *qkv,
                                          int dtype, int64_t B, int64_t T,
                                          int64_t C, int64_t NH);
cudaError_t cuda_launch_attention_backward(cudaStream_t cs, void *dqkv,
                                           const void *dout, const void *qkv,
                                           const void *out, const float *lse,
                                           int dtype, int64_t B, int64_t T,
                                           int64_t C, int64_t NH);

/* ---- cuda_llama.cu (not yet run on a GPU) ---- */
cudaError_t cuda_launch_rmsnorm_forward(cudaStream_t cs, void *out, float *rstd,
                                        const void *inp, const void *weight,
                                        int dtype, int64_t N, int64_t C,
                                        float eps);
/* dinp per row (NULL: skipped); dweight one thread per column over the
 * rows in order (NULL: skipped). */
cudaError_t cuda_launch_rmsnorm_backward(cudaStream_t cs, void *dinp,
                                         float *dweight, const void *dout,
                                         const void *inp, const void *weight,
                                         const float *rstd, int dtype,
                                         int64_t N, int64_t C);
/* mode 0: out = R inp; 1: out += R^T inp; 2: out = R^T out in place */
cudaError_t cuda_launch_rope(cudaStream_t cs, void *out, const void *inp,
                             const float *cos_t, const float *sin_t, int dtype,
                             int64_t B, int64_t T, int64_t NH, int64_t HD,
                             int64_t ldr, int mode);
cudaError_t cuda_launch_swiglu_forward(cudaStream_t cs, void *out,
                                       const void *inp, int dtype, int64_t N,
                                       int64_t H);
cudaError_t cuda_launch_swiglu_backward(cudaStream_t cs, void *dinp,
                                        const void *inp, const void *dout,
                                        int dtype, int64_t N, int64_t H);
/* Fused row kernels as attention's fallback; lse (B, NH, T). */
cudaError_t cuda_launch_gqa_attention_forward(cudaStream_t cs, void *out,
                                              float *lse, const void *qkv,
                                              int dtype, int64_t B, int64_t T,
                                              int64_t NH, int64_t NKV,
                                              int64_t HD);
cudaError_t cuda_launch_gqa_attention_backward(cudaStream_t cs, void *dqkv,
                                               const void *dout,
                                               const void *qkv, const void *out,
                                               const float *lse, int dtype,
                                               int64_t B, int64_t T, int64_t NH,
                                               int64_t NKV, int64_t HD);

/* ---- cuda_optim.cu ---- */
cudaError_t cuda_launch_adamw(cudaStream_t cs, float *param, const void *grad,
                              float *m, float *v, int grad_dtype, int64_t n,
                              float beta1, float beta2, float eps,
                              float grad_scale, float step, float rsqrt_bc2,
                              float lr_wd);
cudaError_t cuda_launch_sgd(cudaStream_t cs, float *param, const void *grad,
                            float *mom, int grad_dtype, int64_t n, float lr,
                            float momentum, float weight_decay, int nesterov,
                            float grad_scale);

#ifdef __cplusplus
}
#endif
#endif /* DT_CUDA_LAUNCH_H */
