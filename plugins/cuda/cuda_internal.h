/*
 * plugins/cuda/cuda_internal.h - what the cuda device's host C files
 * share: the instance, stream and event structs, the CUDA error helper,
 * argument checks, and the kernel entry points cuda_device.c puts in the
 * kernel table.  The device code lives in cuda_*.cu behind cuda_launch.h.
 * Nothing here is exported from the module.
 */
#ifndef DT_CUDA_INTERNAL_H
#define DT_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "dtrain/device.h"
#include "cuda_alloc.h"

#define CUDA_STREAM_MAGIC 0x43554453u /* "CUDS" */
#define CUDA_EVENT_MAGIC 0x43554445u  /* "CUDE" */

/* Per-stream scratch: cuBLASLt's workspace and the partial sums of the
 * two-pass reductions (sumsq), so kernels on different streams never share
 * a scratch buffer. */
#define CUDA_LT_WORKSPACE ((uint64_t)32 << 20)
#define CUDA_PARTIALS 1024 /* doubles */

struct dt_stream {
    uint32_t magic;
    dt_device_t *dev;
    cudaStream_t cs;
    void *workspace;   /* CUDA_LT_WORKSPACE bytes, DT_TAG_STAGING */
    double *partials;  /* CUDA_PARTIALS doubles, DT_TAG_STAGING */
    void *wide;        /* weights converted to the activations' type for a
                        * matmul (cuda_matmul.c), grown on demand,
                        * DT_TAG_STAGING */
    uint64_t wide_bytes;
    void *att;         /* attention's score matrices (cuda_attention.cu),
                        * grown on demand, DT_TAG_STAGING */
    uint64_t att_bytes;
};

struct dt_event {
    uint32_t magic;
    dt_device_t *dev;
    cudaEvent_t ev;
};

struct dt_device {
    const dt_device_ops_v1_t *ops; /* first: the table that made it (dtrain/device.h) */
    const dt_host_v1_t *host;
    int index;          /* the CUDA device this instance runs on */
    int tf32;           /* f32 matmuls may use TF32 tensor cores */
    int deterministic;  /* no atomics in reductions: bit-identical reruns */
    uint64_t limit;     /* memory_limit, bytes; 0 = none */

    /* dmem: device memory (cudaMalloc, cached); pmem: pinned host memory
     * (cudaHostAlloc, not cached).  Both under mem_mu. */
    pthread_mutex_t mem_mu;
    cuda_alloc_t dmem, pmem;
    struct cuda_fences *fences; /* live streams, fence stream, event pool
                                 * (cuda_device.c; under mem_mu) */

    dt_stream_t def; /* what a NULL stream means: a stream of our own */
    cublasLtHandle_t lt;

    char name[128];
    uint64_t total_memory;
    double peak_f32, peak_bf16;
    int sm_count;
};

/* Set the message for a failed CUDA call: "<op>: <call>: <string>
 * (<name>)"; returns DT_ERR_SYSTEM. */
int cuda_fail(dt_device_t *d, const char *op, const char *call, cudaError_t e);
/* The same for cuBLASLt. */
int cuda_lt_fail(dt_device_t *d, const char *op, const char *call,
                 cublasStatus_t st);

/* Make d->index the calling thread's current CUDA device (cudaSetDevice
 * only when cudaGetDevice says otherwise: well under a microsecond).  The
 * first thing of every entry point that makes CUDA calls, since the
 * current device is per host thread.  DT_OK, or DT_ERR_SYSTEM with
 * "<op>: cudaSetDevice(<index>): <string> (<name>)". */
int cuda_guard(dt_device_t *d, const char *op);

/* The stream `s` stands for (NULL: the device's default), checked to be a
 * live stream of `d`; NULL with the message set otherwise. */
dt_stream_t *cuda_stream(dt_device_t *d, dt_stream_t *s, const char *op);

/* Device memory through the caching allocator (also the plugin's own
 * scratch).  `who` prefixes the message ("stream_create: workspace"). */
int cuda_mem_alloc(dt_device_t *d, uint64_t bytes, int tag, void **out,
                   const char *who);
int cuda_mem_free(dt_device_t *d, void *ptr);

#define CUDA_INVALID(d, ...)                                                   \
    (d)->host->set_error((d)->host, DT_ERR_INVALID, __VA_ARGS__)

/* Start of every kernel: a device, a live stream of it (into `st`), and
 * the instance's GPU current in this thread (cuda_guard). */
#define CUDA_BEGIN(d, s, op, st)                                               \
    dt_stream_t *st;                                                           \
    do {                                                                       \
        if (!(d))                                                              \
            return DT_ERR_INVALID;                                             \
        if (!(st = cuda_stream((d), (s), (op))))                               \
            return DT_ERR_INVALID;                                             \
        int grc_ = cuda_guard((d), (op));                                      \
        if (grc_ != DT_OK)                                                     \
            return grc_;                                                       \
    } while (0)

#define CUDA_DIM(d, op, x)                                                     \
    do {                                                                       \
        if ((x) < 0)                                                           \
            return CUDA_INVALID((d), "%s: %s = %lld must be >= 0", (op), #x,   \
                                (long long)(x));                               \
    } while (0)

#define CUDA_PTR(d, op, p, count)                                              \
    do {                                                                       \
        if (!(p) && (count) > 0)                                               \
            return CUDA_INVALID((d), "%s: %s is NULL (%lld elements)", (op),   \
                                #p, (long long)(count));                       \
    } while (0)

/* After a launcher: its cudaError_t as a status. */
#define CUDA_LAUNCHED(d, op, call)                                             \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess)                                                 \
            return cuda_fail((d), (op), "kernel launch", e_);                  \
    } while (0)

/* "<op>: <got>: unsupported (the cuda device runs <runs>)". */
int cuda_dtype_refused(dt_device_t *d, const char *op, const char *got,
                       const char *runs);
/* Activations (and non-matrix parameters): f32 or bf16. */
int cuda_check_act(dt_device_t *d, const char *op, int dtype);
/* Element-wise arithmetic and gradients: f32 or bf16 (and f16 for sumsq). */
int cuda_check_elems(dt_device_t *d, const char *op, int dtype, int f16_ok);

/* One cuBLASLt product (cuda_matmul.c): column-major D (m, n) = alpha
 * op(A) op(B) + beta D, A and B of `atype` (their stored shapes have lda,
 * ldb rows), D of `dtype`, `bias` (m, D's type) added in the epilogue when
 * non-NULL; alpha 0 means 1.  With batch > 1, `batch` such products, the
 * i-th at A + i sa, B + i sb, D + i sd (elements).  Compute in f32 (TF32
 * with the tf32 key for f32 inputs); no split-K reductions with
 * `deterministic`; the algorithm cached per problem description. */
typedef struct cuda_lt_call {
    cublasOperation_t ta, tb;
    uint64_t m, n, k;
    const void *A, *B;
    void *D;
    int atype, dtype;
    int64_t lda, ldb, ldd;
    float alpha, beta;
    const void *bias;
    int batch;
    int64_t sa, sb, sd;
} cuda_lt_call_t;
int cuda_lt_matmul(dt_device_t *d, dt_stream_t *st, const char *op,
                   const cuda_lt_call_t *c);

/* ---- kernels (signatures are the ABI's; see dtrain/device.h) ---- */
int cuda_matmul_forward(dt_device_t *d, dt_stream_t *s, void *out,
                        const void *inp, const void *weight, const void *bias,
                        int dtype, int wdtype, int64_t N, int64_t C,
                        int64_t OC);
int cuda_matmul_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                         float *dweight, float *dbias, const void *dout,
                         const void *inp, const void *weight, int dtype,
                         int wdtype, int64_t N, int64_t C, int64_t OC);
int cuda_embedding_forward(dt_device_t *d, dt_stream_t *s, void *out,
                           const int32_t *tokens, const void *wte,
                           const void *wpe, int dtype, int64_t B, int64_t T,
                           int64_t C);
int cuda_embedding_backward(dt_device_t *d, dt_stream_t *s, float *dwte,
                            float *dwpe, const void *dout,
                            const int32_t *tokens, int dtype, int64_t B,
                            int64_t T, int64_t C);
int cuda_vocab_embedding_forward(dt_device_t *d, dt_stream_t *s, void *out,
                                 const int32_t *tokens, const void *wte, const void *wpe,
                                 int dtype, int64_t B, int64_t T, int64_t C, int64_t v0,
                                 int64_t nv);
int cuda_vocab_embedding_backward(dt_device_t *d, dt_stream_t *s, float *dwte, float *dwpe,
                                  const void *dout, const int32_t *tokens, int dtype,
                                  int64_t B, int64_t T, int64_t C, int64_t v0, int64_t nv);
int cuda_vocab_xent_forward(dt_device_t *d, dt_stream_t *s, int phase, float *stats,
                            float *losses, void *probs, const void *logits,
                            const int32_t *targets, int dtype, int64_t N, int64_t v0,
                            int64_t nv);
int cuda_vocab_xent_backward(dt_device_t *d, dt_stream_t *s, void *dlogits, const void *probs,
                             const int32_t *targets, int dtype, float dloss, int64_t N,
                             int64_t v0, int64_t nv);
int cuda_gelu_forward(dt_device_t *d, dt_stream_t *s, void *out,
                      const void *inp, int dtype, int64_t n);
int cuda_gelu_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                       const void *inp, const void *dout, int dtype,
                       int64_t n);
int cuda_softmax_xent_forward(dt_device_t *d, dt_stream_t *s, float *losses,
                              void *probs, const void *logits,
                              const int32_t *targets, int dtype, int64_t N,
                              int64_t V);
int cuda_softmax_xent_backward(dt_device_t *d, dt_stream_t *s, void *dlogits,
                               const void *probs, const int32_t *targets,
                               int dtype, float dloss, int64_t N, int64_t V);
int cuda_axpy(dt_device_t *d, dt_stream_t *s, void *y, const void *x,
              int dtype, float alpha, int64_t n);
int cuda_sumsq(dt_device_t *d, dt_stream_t *s, double *out, const void *x,
               int dtype, int64_t n);
int cuda_cast(dt_device_t *d, dt_stream_t *s, void *dst, int dst_dtype,
              const void *src, int src_dtype, int64_t n);
int cuda_rmsnorm_forward(dt_device_t *d, dt_stream_t *s, void *out, float *rstd,
                         const void *inp, const void *weight, int dtype, int64_t N,
                         int64_t C, float eps);
int cuda_rmsnorm_backward(dt_device_t *d, dt_stream_t *s, void *dinp, float *dweight,
                          const void *dout, const void *inp, const void *weight,
                          const float *rstd, int dtype, int64_t N, int64_t C);
int cuda_rope_forward(dt_device_t *d, dt_stream_t *s, void *out, const void *inp,
                      const float *cos_t, const float *sin_t, int dtype, int64_t B, int64_t T,
                      int64_t NH, int64_t HD, int64_t ld);
int cuda_rope_backward(dt_device_t *d, dt_stream_t *s, void *dinp, const void *dout,
                       const float *cos_t, const float *sin_t, int dtype, int64_t B,
                       int64_t T, int64_t NH, int64_t HD, int64_t ld);
int cuda_swiglu_forward(dt_device_t *d, dt_stream_t *s, void *out, const void *inp,
                        int dtype, int64_t N, int64_t H);
int cuda_swiglu_backward(dt_device_t *d, dt_stream_t *s, void *dinp, const void *inp,
                         const void *dout, int dtype, int64_t N, int64_t H);
int cuda_gqa_attention_forward(dt_device_t *d, dt_stream_t *s, void *out, void *state,
                               const void *qkv, int dtype, int64_t B, int64_t T, int64_t NH,
                               int64_t NKV, int64_t HD);
int cuda_gqa_attention_backward(dt_device_t *d, dt_stream_t *s, void *dqkv, const void *dout,
                                const void *qkv, const void *out, const void *state,
                                int dtype, int64_t B, int64_t T, int64_t NH, int64_t NKV,
                                int64_t HD);
int cuda_layernorm_forward(dt_device_t *d, dt_stream_t *s, void *out,
                           float *mean, float *rstd, const void *inp,
                           const void *weight, const void *bias, int dtype,
                           int64_t N, int64_t C);
int cuda_layernorm_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                            float *dweight, float *dbias, const void *dout,
                            const void *inp, const void *weight,
                            const float *mean, const float *rstd, int dtype,
                            int64_t N, int64_t C);
int cuda_attention_state_bytes(int64_t B, int64_t T, int64_t C, int64_t NH,
                               int dtype, uint64_t *out);
int cuda_attention_forward(dt_device_t *d, dt_stream_t *s, void *out,
                           void *state, const void *qkv, int dtype, int64_t B,
                           int64_t T, int64_t C, int64_t NH);
int cuda_attention_backward(dt_device_t *d, dt_stream_t *s, void *dqkv,
                            const void *dout, const void *qkv, const void *out,
                            const void *state, int dtype, int64_t B, int64_t T,
                            int64_t C, int64_t NH);
int cuda_residual_forward(dt_device_t *d, dt_stream_t *s, void *out,
                          const void *a, const void *b, int dtype, int64_t n);
int cuda_scale(dt_device_t *d, dt_stream_t *s, void *x, int dtype,
               float alpha, int64_t n);
int cuda_adamw_update(dt_device_t *d, dt_stream_t *s, float *param,
                      const void *grad, float *m, float *v, int grad_dtype,
                      int64_t n, float lr, float beta1, float beta2, float eps,
                      float weight_decay, float grad_scale, int64_t t);
int cuda_sgd_update(dt_device_t *d, dt_stream_t *s, float *param,
                    const void *grad, float *mom, int grad_dtype, int64_t n,
                    float lr, float momentum, float weight_decay, int nesterov,
                    float grad_scale);

#endif /* DT_CUDA_INTERNAL_H */
