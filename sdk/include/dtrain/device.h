/*
 * dtrain/device.h - the compute backend ABI (plugin kind "device"): a
 * runtime table and, separately sized and versioned, a kernel table.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * The runtime (dt_device_ops_v1_t, the plugin's entry) owns memory (every
 * allocation tagged, peaks kept per tag, an optional budget), pinned host
 * memory for asynchronous copies (offload tiers), ordered streams and
 * events, and copies.  Its mandatory `kernels` slot hands out the kernel
 * table (dt_kernels_v1_t) the models and strategies are built from, with
 * its own head (major, minor, struct_size): kernels are added without
 * touching the runtime (NCCL's net vs collNet).  A core set of kernels is
 * mandatory, checked by the loader with the runtime's mandatory slots; the
 * rest are optional (DT_HAS_OP(dt_kernels_t, k, field)).  Every kernel call
 * states the dtypes of its buffers, and attention keeps its saved state in
 * a buffer whose size and layout the backend decides.  Kernels are
 * enqueued on a stream and may return before they finish (CUDA); a
 * host-synchronous backend (cpu) runs them at once, which satisfies the
 * same contract.
 *
 * Conventions (llm.c's): `<op>_forward` / `<op>_backward` pairs; gradient
 * arguments are prefixed `d`; backward kernels ACCUMULATE (+=) into every
 * gradient output, so callers zero gradients once per step.  Shapes are in
 * comments: (N, C) means N rows of C contiguous elements (row-major).
 * All pointers passed to kernels are device memory unless stated.  A NULL
 * stream means the device's default stream.  Every function returns a
 * dt_status_t; on failure the message is set through the host table.
 *
 * Thread safety (a contract for callers; a backend may serialise inside):
 *  - init and finalize: one thread, nothing else in flight on the instance.
 *  - memory (alloc, free, host_alloc, host_free, mem_stats,
 *    mem_reset_peaks, props) and waiting (stream_sync, event_sync,
 *    synchronize): from any thread at any time; a comm's progress thread
 *    waits on the compute stream this way.
 *  - `kernels` and attention_state_bytes: from any thread at any time (the
 *    table is immutable, the query a pure function).
 *  - everything that ENQUEUES (kernels, copies, memset, event_record,
 *    stream_wait_event, stream create/destroy): one thread at a time per
 *    stream; different streams may be fed from different threads at once.
 *    Work on one stream runs in the order it was enqueued; nothing orders
 *    two streams but events.
 */
#ifndef DTRAIN_DEVICE_H
#define DTRAIN_DEVICE_H

#include <stdint.h>

#include "dtrain/host.h"
#include "dtrain/plugin.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_DEVICE_ABI_MAJOR 1
#define DT_DEVICE_ABI_MINOR 0
/* The kernel table versions on its own (NCCL's net vs collNet): a kernel
 * added is a kernel minor, not a device one. */
#define DT_KERNELS_ABI_MAJOR 1
#define DT_KERNELS_ABI_MINOR 0

/* A device instance (dt_device_t): opaque to the core, the plugin's own struct, which
 * must start with a pointer to the table that made it (libfabric's rule):
 *     struct dt_device { const dt_device_ops_v1_t *ops; ... };  // ops = &my_ops
 * so a handle alone is enough to call it: dt_device_ops(d)->slot(d, ...).
 * The core refuses a handle whose first member is not the table it
 * loaded from the plugin. */
typedef struct dt_device dt_device_t; /* plugin instance, opaque */
typedef struct dt_stream dt_stream_t; /* ordered queue of work, opaque */
typedef struct dt_event dt_event_t;   /* a point in a stream, opaque */

/* Arguments to device init (in; the core owns them, valid during init;
 * read with dt_args_read). */
typedef struct dt_device_init_v1 {
    uint32_t struct_size; /* sizeof(dt_device_init_v1_t) at the core's build */
    int32_t rank;         /* global rank of this process */
    int32_t local_rank;   /* rank among processes on this machine */
    int32_t local_size;   /* processes on this machine */
    int32_t device_index; /* which accelerator (-1: choose by local_rank) */
    int32_t reserved0;
    /* ---- minor 0 ends here; append only ---- */
} dt_device_init_v1_t;
#define DT_DEVICE_INIT_V1_SIZE0 DT_FIELD_END(dt_device_init_v1_t, reserved0)

/* What a device reports about itself (out: the caller zero-fills it and
 * sets struct_size; the plugin fills it with dt_result_write). */
typedef struct dt_device_props_v1 {
    uint32_t struct_size;     /* sizeof(dt_device_props_v1_t), caller's build */
    uint32_t reserved0;
    char name[128];           /* "cpu (2 threads, OpenBLAS 0.3.21)", "NVIDIA H100" */
    uint64_t total_memory;    /* bytes usable; 0 = unknown */
    double peak_flops_f32;    /* FLOP/s for MFU estimates; 0 = unknown */
    double peak_flops_bf16;   /* FLOP/s; 0 = unknown */
    int32_t host_visible;     /* 1: device memory is host memory (cpu), so
                               * the core may read/write it directly */
    int32_t threads;          /* compute threads used (cpu); 0 = n/a */
    /* ---- minor 0 ends here; append only ---- */
} dt_device_props_v1_t;
#define DT_DEVICE_PROPS_V1_SIZE0 DT_FIELD_END(dt_device_props_v1_t, threads)

/* Direction of a copy. */
typedef enum dt_copy_kind {
    DT_COPY_H2D = 0,
    DT_COPY_D2H = 1,
    DT_COPY_D2D = 2,
    DT_COPY_H2H = 3
} dt_copy_kind_t;

/* The head of the kernel table.  Its first three fields are those of
 * dt_plugin_info_t, in the same places: the loader reads both alike. */
typedef struct dt_kernels_info {
    uint32_t abi_major;   /* DT_KERNELS_ABI_MAJOR the plugin was built with */
    uint32_t abi_minor;   /* DT_KERNELS_ABI_MINOR the plugin was built with */
    uint32_t struct_size; /* sizeof(dt_kernels_v1_t) at the plugin's build:
                           * kernels past it are absent */
    uint32_t reserved0;
} dt_kernels_info_t;
DT_ABI_CHECK_(dt_kernels_info_major_at_, offsetof(dt_kernels_info_t, abi_major) ==
                                             offsetof(dt_plugin_info_t, abi_major));
DT_ABI_CHECK_(dt_kernels_info_minor_at_, offsetof(dt_kernels_info_t, abi_minor) ==
                                             offsetof(dt_plugin_info_t, abi_minor));
DT_ABI_CHECK_(dt_kernels_info_size_at_, offsetof(dt_kernels_info_t, struct_size) ==
                                            offsetof(dt_plugin_info_t, struct_size));

/* Fill a kernel table's head: .info = DT_KERNELS_INFO(dt_kernels_v1_t). */
#define DT_KERNELS_INFO(type)                                                  \
    {                                                                          \
        .abi_major = DT_KERNELS_ABI_MAJOR,                                     \
        .abi_minor = DT_KERNELS_ABI_MINOR,                                     \
        .struct_size = (uint32_t)sizeof(type),                                 \
        .reserved0 = 0,                                                        \
    }

/* The kernels models and strategies are built from.  Every kernel is
 * enqueued on stream `s` of instance `d` and may return before it runs
 * (thread safety: as everything that enqueues, see the top of this file).
 *
 * Element types.  Every call states the types of its buffers:
 *  - `float *` is f32, always: parameter gradients (strategies hold them in
 *    f32, strategy.h), norm statistics, losses, optimizer state;
 *  - `void *` holds elements of the dtype the call names: `dtype`, the
 *    activation dtype, covers activations, their gradients, and the
 *    parameters a layer reads other than matmul weights (biases, norm
 *    weights, embedding tables); `wdtype` covers matmul weights;
 *    grad_dtype, dst_dtype, src_dtype say what their names say.
 * A kernel refuses a combination it does not run with DT_ERR_UNSUPPORTED,
 * naming itself and the dtypes ("matmul_forward: bf16 activations with
 * f16 weights: unsupported (...)"), before touching any buffer.  The cpu
 * and cuda devices run f32 activations with f32, bf16 or f16 weights, and
 * bf16 activations (stored in bf16, computed in f32, every stored result
 * rounded once to nearest even) with bf16 weights or f32 weights rounded
 * to bf16; both take f32 or bf16 gradients in the optimizer updates. */
typedef struct dt_kernels_v1 {
    dt_kernels_info_t info; /* first: DT_HAS_OP(dt_kernels_t, k, field) works */

    /* ---- the core set (mandatory): what every model and strategy of
     * dtrain needs, whatever the config ---- */

    /* out = inp @ weight^T + bias.  out (N, OC), inp (N, C), bias (OC) or
     * NULL: dtype; weight (OC, C): wdtype. */
    int (*matmul_forward)(dt_device_t *d, dt_stream_t *s, void *out,
                          const void *inp, const void *weight,
                          const void *bias, int dtype, int wdtype, int64_t N,
                          int64_t C, int64_t OC);
    /* dinp += dout @ weight; dweight += dout^T @ inp; dbias += sum_n dout.
     * dinp (N, C), dout (N, OC), inp (N, C): dtype; dweight (OC, C), dbias
     * (OC): f32; weight (OC, C): wdtype.  dinp, dweight, dbias may each be
     * NULL to skip it. */
    int (*matmul_backward)(dt_device_t *d, dt_stream_t *s, void *dinp,
                           float *dweight, float *dbias, const void *dout,
                           const void *inp, const void *weight, int dtype,
                           int wdtype, int64_t N, int64_t C, int64_t OC);
    /* out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].  out (B, T, C), wte (V,
     * C), wpe (>= T, C): dtype; tokens (B, T) i32 in [0, V) (the range is
     * the caller's check). */
    int (*embedding_forward)(dt_device_t *d, dt_stream_t *s, void *out,
                             const int32_t *tokens, const void *wte,
                             const void *wpe, int dtype, int64_t B,
                             int64_t T, int64_t C);
    /* dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:].  dout
     * (B, T, C): dtype; dwte (V, C), dwpe (>= T, C): f32, either may be
     * NULL to skip it. */
    int (*embedding_backward)(dt_device_t *d, dt_stream_t *s, float *dwte,
                              float *dwpe, const void *dout,
                              const int32_t *tokens, int dtype, int64_t B,
                              int64_t T, int64_t C);
    /* GELU, tanh approximation (GPT-2's).  out, inp (n): dtype. */
    int (*gelu_forward)(dt_device_t *d, dt_stream_t *s, void *out,
                        const void *inp, int dtype, int64_t n);
    /* dinp += gelu'(inp) * dout.  dinp, inp, dout (n): dtype. */
    int (*gelu_backward)(dt_device_t *d, dt_stream_t *s, void *dinp,
                         const void *inp, const void *dout, int dtype,
                         int64_t n);
    /* losses[i] = -log softmax(logits[i,:])[targets[i]]; probs = softmax
     * (kept for backward).  logits, probs (N, V): dtype; targets (N) i32 in
     * [0, V); losses (N): f32. */
    int (*softmax_xent_forward)(dt_device_t *d, dt_stream_t *s,
                                float *losses, void *probs,
                                const void *logits, const int32_t *targets,
                                int dtype, int64_t N, int64_t V);
    /* dlogits[i,:] += dloss * (probs[i,:] - onehot(targets[i])).  dlogits,
     * probs (N, V): dtype. */
    int (*softmax_xent_backward)(dt_device_t *d, dt_stream_t *s,
                                 void *dlogits, const void *probs,
                                 const int32_t *targets, int dtype,
                                 float dloss, int64_t N, int64_t V);
    /* y += alpha * x, (n) elements of dtype (gradient accumulation); x and
     * y must not overlap. */
    int (*axpy)(dt_device_t *d, dt_stream_t *s, void *y, const void *x,
                int dtype, float alpha, int64_t n);
    /* *out = sum of x[i]^2 over (n) elements of `dtype` (f32, bf16, f16),
     * accumulated in double.  `out` is device memory (one double), written
     * (not accumulated); NaN/Inf propagate. */
    int (*sumsq)(dt_device_t *d, dt_stream_t *s, double *out, const void *x,
                 int dtype, int64_t n);
    /* dst = (dst_dtype) src, (n) elements; f32, bf16, f16 each way
     * (round to nearest even). */
    int (*cast)(dt_device_t *d, dt_stream_t *s, void *dst, int dst_dtype,
                const void *src, int src_dtype, int64_t n);

    /* ---- optional (DT_HAS_OP before use): what one architecture or one
     * optimizer needs.  A caller without a fallback fails with
     * DT_ERR_UNSUPPORTED naming the kernel and the dtypes it wanted. ---- */

    /* out = (inp - mean) * rstd * weight + bias over the last dim, eps
     * 1e-5.  out, inp (N, C), weight, bias (C): dtype; mean, rstd (N): f32,
     * written for backward. */
    int (*layernorm_forward)(dt_device_t *d, dt_stream_t *s, void *out,
                             float *mean, float *rstd, const void *inp,
                             const void *weight, const void *bias, int dtype,
                             int64_t N, int64_t C);
    /* dinp += d(out)/d(inp) . dout; dweight, dbias += their gradients.
     * dinp, dout, inp (N, C), weight (C): dtype; dweight, dbias (C): f32,
     * each may be NULL to skip it; mean, rstd (N): f32 from forward. */
    int (*layernorm_backward)(dt_device_t *d, dt_stream_t *s, void *dinp,
                              float *dweight, float *dbias, const void *dout,
                              const void *inp, const void *weight,
                              const float *mean, const float *rstd, int dtype,
                              int64_t N, int64_t C);
    /* Attention keeps what its backward needs in a state buffer whose
     * layout is the backend's own: the cpu keeps the (B, NH, T, T) f32
     * softmax probabilities (also with bf16 activations), a flash-attention
     * backend (cuda) the (B, NH, T) f32 log-sum-exp.  *out receives its
     * size in bytes for (B, T, C, NH) and activations of `dtype`; the
     * caller allocates that much device memory (alloc's alignment) and
     * passes it to attention_forward, which writes it, and to
     * attention_backward, which reads it.  A pure function of
     * its arguments, asked with no instance (a planner sizes activations
     * before any device exists), so it sets no message: DT_ERR_INVALID for
     * a bad or overflowing shape or a NULL out, DT_ERR_UNSUPPORTED for a
     * dtype attention_forward refuses; the caller names the kernel.  A
     * backend with attention_forward has this too. */
    int (*attention_state_bytes)(int64_t B, int64_t T, int64_t C, int64_t NH,
                                 int dtype, uint64_t *out);
    /* Causal multi-head self-attention.  qkv (B, T, 3C) holding q, k, v
     * each (B, T, NH, C/NH), out (B, T, C): dtype; state: the
     * attention_state_bytes(B, T, C, NH, dtype) bytes of device memory the
     * caller allocated, written with what backward needs. */
    int (*attention_forward)(dt_device_t *d, dt_stream_t *s, void *out,
                             void *state, const void *qkv, int dtype,
                             int64_t B, int64_t T, int64_t C, int64_t NH);
    /* dqkv += d(out)/d(qkv) applied to dout.  dqkv (B, T, 3C), dout (B, T,
     * C), qkv and out (the forward's input and output): dtype; state: what
     * that forward wrote, unchanged since. */
    int (*attention_backward)(dt_device_t *d, dt_stream_t *s, void *dqkv,
                              const void *dout, const void *qkv,
                              const void *out, const void *state, int dtype,
                              int64_t B, int64_t T, int64_t C, int64_t NH);
    /* out = a + b, (n) elements of dtype; out may alias a or b. */
    int (*residual_forward)(dt_device_t *d, dt_stream_t *s, void *out,
                            const void *a, const void *b, int dtype,
                            int64_t n);
    /* x *= alpha, (n) elements of dtype. */
    int (*scale)(dt_device_t *d, dt_stream_t *s, void *x, int dtype,
                 float alpha, int64_t n);
    /* AdamW on (n) elements, decoupled weight decay (PyTorch's):
     *   g = grad * grad_scale
     *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
     *   param -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd * param)
     * computed as PyTorch's fused AdamW does, the bias corrections folded
     * into per-call scalars (sdk/optim.h dt_adamw_scalars): with
     * step = lr/(1-b1^t), r = 1/sqrt(1-b2^t),
     *   param -= step * m / (sqrt(v) * r + eps) + lr*wd * param
     * param (the f32 master), m, v: f32; grad: grad_dtype.  t >= 1 is the
     * 1-based step count. */
    int (*adamw_update)(dt_device_t *d, dt_stream_t *s, float *param,
                        const void *grad, float *m, float *v, int grad_dtype,
                        int64_t n, float lr, float beta1, float beta2,
                        float eps, float weight_decay, float grad_scale,
                        int64_t t);
    /* SGD with momentum (PyTorch's, no dampening):
     *   g = grad * grad_scale + wd * param;  mom = mu mom + g;
     *   param -= lr * (nesterov ? g + mu mom : mom)
     * param, mom: f32 (mom may be NULL when momentum is 0); grad:
     * grad_dtype. */
    int (*sgd_update)(dt_device_t *d, dt_stream_t *s, float *param,
                      const void *grad, float *mom, int grad_dtype,
                      int64_t n, float lr, float momentum,
                      float weight_decay, int nesterov, float grad_scale);

    /* ---- optional: a vocabulary split across ranks (tensor
     * parallelism, Megatron's vocab-parallel embedding and parallel
     * cross-entropy).  The rank holds vocabulary rows [v0, v0 + nv);
     * tokens and targets are global ids, and an id outside the range
     * reads (or adds to) nothing here: another rank of the group holds
     * it, and the caller sums the ranks' results. ---- */

    /* out[b,t,:] = (tokens[b,t] in range ? wte[tokens[b,t] - v0,:] : 0)
     *              + (wpe ? wpe[t,:] : 0).
     * out (B, T, C), wte (nv, C), wpe (>= T, C) or NULL: dtype; tokens
     * (B, T) i32, >= 0. */
    int (*vocab_embedding_forward)(dt_device_t *d, dt_stream_t *s, void *out,
                                   const int32_t *tokens, const void *wte,
                                   const void *wpe, int dtype, int64_t B,
                                   int64_t T, int64_t C, int64_t v0,
                                   int64_t nv);
    /* dwte[tokens[b,t] - v0,:] += dout[b,t,:] for tokens in range;
     * dwpe[t,:] += dout[b,t,:].  dwte (nv, C), dwpe (>= T, C): f32, either
     * may be NULL to skip it; dout (B, T, C): dtype. */
    int (*vocab_embedding_backward)(dt_device_t *d, dt_stream_t *s,
                                    float *dwte, float *dwpe,
                                    const void *dout, const int32_t *tokens,
                                    int dtype, int64_t B, int64_t T,
                                    int64_t C, int64_t v0, int64_t nv);
    /* Softmax cross-entropy over logits (N, nv) that hold vocabulary
     * columns [v0, v0 + nv) of each row, in three phases with a reduction
     * over the ranks between them; stats (3N) f32 carry the row state:
     *  phase 0: stats[n] = max_v logits[n,v]; the caller then takes the
     *           maximum over the ranks (the global row maximum);
     *  phase 1: stats[N + n] = sum_v exp(logits[n,v] - stats[n]) and
     *           stats[2N + n] = logits[n, targets[n] - v0] when the target
     *           is in range, else 0; the caller then sums stats[N, 3N) over
     *           the ranks;
     *  phase 2: probs[n,v] = exp(logits[n,v] - stats[n]) / stats[N + n]
     *           and losses[n] = log(stats[N + n]) - (stats[2N + n] -
     *           stats[n]), the row's loss, the same on every rank.
     * logits, probs (N, nv): dtype; targets (N) i32 >= 0; losses (N) f32
     * (phase 2 only; probs and losses may be NULL in phases 0 and 1). */
    int (*vocab_xent_forward)(dt_device_t *d, dt_stream_t *s, int phase,
                              float *stats, float *losses, void *probs,
                              const void *logits, const int32_t *targets,
                              int dtype, int64_t N, int64_t v0, int64_t nv);
    /* dlogits[n,:] += dloss * probs[n,:], and dlogits[n, targets[n] - v0]
     * -= dloss when the target is in range.  dlogits, probs (N, nv):
     * dtype. */
    int (*vocab_xent_backward)(dt_device_t *d, dt_stream_t *s, void *dlogits,
                               const void *probs, const int32_t *targets,
                               int dtype, float dloss, int64_t N, int64_t v0,
                               int64_t nv);

    /* ---- optional: the LLaMA family's layers (Hugging Face
     * LlamaForCausalLM's arithmetic): RMSNorm, rotary position embedding,
     * SwiGLU and grouped-query attention. ---- */

    /* out = inp * rstd * weight over the last dim, with rstd =
     * 1 / sqrt(mean(inp^2) + eps) (the mean taken in double, rstd stored
     * in f32).  out, inp (N, C), weight (C): dtype; rstd (N): f32, written
     * for backward. */
    int (*rmsnorm_forward)(dt_device_t *d, dt_stream_t *s, void *out,
                           float *rstd, const void *inp, const void *weight,
                           int dtype, int64_t N, int64_t C, float eps);
    /* dinp += d(out)/d(inp) . dout; dweight += sum_n inp * rstd * dout.
     * dinp, dout, inp (N, C), weight (C): dtype; dweight (C): f32; dinp and
     * dweight may each be NULL to skip it; rstd (N): f32 from forward. */
    int (*rmsnorm_backward)(dt_device_t *d, dt_stream_t *s, void *dinp,
                            float *dweight, const void *dout, const void *inp,
                            const void *weight, const float *rstd, int dtype,
                            int64_t N, int64_t C);
    /* Rotary position embedding, the "rotate_half" convention: head
     * dimension i pairs with i + HD/2 (i < HD/2), and with c = cos[t, i],
     * s = sin[t, i] for position t,
     *   out[i] = x[i] c - x[i + HD/2] s,  out[i + HD/2] = x[i + HD/2] c + x[i] s.
     * Rows: position (b, t) of inp and out starts at (b T + t) ld elements
     * and holds NH heads of HD (NH HD <= ld), so q and k can be rotated
     * where they lie in a packed qkv buffer (ld its row length).  cos, sin
     * (T, HD/2): f32, row t for position t (the caller computes them, with
     * rope_theta and any frequency scaling; for positions from t0, pass
     * the tables from row t0).  inp, out: dtype; out may be inp (in
     * place).  HD even. */
    int (*rope_forward)(dt_device_t *d, dt_stream_t *s, void *out,
                        const void *inp, const float *cos, const float *sin,
                        int dtype, int64_t B, int64_t T, int64_t NH,
                        int64_t HD, int64_t ld);
    /* dinp += R^T dout (the inverse rotation), layout as rope_forward's;
     * with dinp == dout (the same buffer) the rotation runs in place,
     * dout = R^T dout, instead of accumulating: the gradient of the
     * rotated q or k becomes that of the unrotated one where it lies. */
    int (*rope_backward)(dt_device_t *d, dt_stream_t *s, void *dinp,
                         const void *dout, const float *cos, const float *sin,
                         int dtype, int64_t B, int64_t T, int64_t NH,
                         int64_t HD, int64_t ld);
    /* SwiGLU on the fused gate and up projections (one matmul with the
     * stacked weight [W_gate; W_up]): out[n,j] = silu(inp[n,j]) *
     * inp[n,H+j], silu(x) = x / (1 + exp(-x)).  inp (N, 2H): each row
     * gate (H) then up (H); out (N, H): dtype. */
    int (*swiglu_forward)(dt_device_t *d, dt_stream_t *s, void *out,
                          const void *inp, int dtype, int64_t N, int64_t H);
    /* dinp += d(out)/d(inp) applied to dout: the gate half silu'(gate) up
     * dout, the up half silu(gate) dout.  dinp, inp (N, 2H), dout (N, H):
     * dtype. */
    int (*swiglu_backward)(dt_device_t *d, dt_stream_t *s, void *dinp,
                           const void *inp, const void *dout, int dtype,
                           int64_t N, int64_t H);
    /* Causal grouped-query self-attention: NH query heads share NKV key and
     * value heads (NKV divides NH; query head h reads kv head
     * h / (NH / NKV)), head size HD, scores scaled by 1/sqrt(HD).  qkv
     * (B, T, (NH + 2 NKV) HD): each position's q (NH, HD), then k (NKV,
     * HD), then v (NKV, HD); out (B, T, NH HD): dtype.  state: the
     * attention_state_bytes(B, T, NH HD, NH, dtype) bytes (the state of
     * multi-head attention with NH heads of HD), written with what
     * backward needs.  With NKV == NH this is attention_forward. */
    int (*gqa_attention_forward)(dt_device_t *d, dt_stream_t *s, void *out,
                                 void *state, const void *qkv, int dtype,
                                 int64_t B, int64_t T, int64_t NH,
                                 int64_t NKV, int64_t HD);
    /* dqkv += d(out)/d(qkv) applied to dout.  dqkv (B, T, (NH + 2 NKV)
     * HD), dout (B, T, NH HD), qkv and out (the forward's input and
     * output): dtype; state: what that forward wrote, unchanged since. */
    int (*gqa_attention_backward)(dt_device_t *d, dt_stream_t *s, void *dqkv,
                                  const void *dout, const void *qkv,
                                  const void *out, const void *state,
                                  int dtype, int64_t B, int64_t T, int64_t NH,
                                  int64_t NKV, int64_t HD);

    /* ---- minor 0 ends here; append only ---- */
} dt_kernels_v1_t;

typedef struct dt_device_ops_v1 {
    dt_plugin_info_t info; /* base first; info.kind == DT_KIND_DEVICE */

    /* ---- lifecycle (mandatory) ---- */
    /* Create an instance.  `host` (per plugin, valid until finalize) gives
     * logging, errors and this plugin's config.  *out owned by the plugin
     * until finalize. */
    int (*init)(const dt_host_v1_t *host, const dt_device_init_v1_t *args,
                dt_device_t **out);
    /* Free everything the instance owns, after finishing queued work.
     * finalize(NULL) is a no-op.  Never fails. */
    void (*finalize)(dt_device_t *d);
    int (*props)(dt_device_t *d, dt_device_props_v1_t *out);
    /* The plugin's kernel table (above): a `static const` table, the same
     * pointer on every call, valid and unchanged while the plugin is
     * loaded.  Needs no instance (the planner sizes activations before any
     * device exists).  The loader checks its mandatory kernels when it
     * loads the plugin, so a caller uses them without checking.  A later
     * kernel ABI major is handed out by a slot appended for it; this one
     * keeps handing out v1. */
    const dt_kernels_v1_t *(*kernels)(void);

    /* ---- memory (mandatory) ---- */
    /* Allocate `bytes` of device memory tagged `tag` (dt_mem_tag_t),
     * aligned to at least 64 bytes, uninitialised.  bytes == 0 returns a
     * unique non-NULL pointer.  Fails with DT_ERR_NOMEM, naming the tag,
     * the request and the budget, when the budget would be exceeded. */
    int (*alloc)(dt_device_t *d, uint64_t bytes, int tag, void **out);
    /* Free memory from alloc (waits for queued work using it).  NULL ok. */
    int (*free)(dt_device_t *d, void *ptr);
    /* Per-tag bytes of device memory and of pinned host memory (out:
     * caller-set struct_size; see dt_mem_stats_v1_t). */
    int (*mem_stats)(dt_device_t *d, dt_mem_stats_v1_t *out);
    /* Set every peak, device and pinned, to its current value (start of a
     * measured phase). */
    int (*mem_reset_peaks)(dt_device_t *d);

    /* ---- pinned host memory (mandatory) ---- */
    /* Allocate `bytes` of HOST memory tagged `tag` (dt_mem_tag_t; offload
     * tiers and staging use DT_TAG_OFFLOAD / DT_TAG_STAGING) that this
     * device copies to and from asynchronously: memcpy_async H2D / D2H with
     * it may overlap compute (CUDA: cudaHostAlloc; the cpu: plain host
     * memory).  The host reads and writes it directly, at least 64-byte
     * aligned, uninitialised; bytes == 0 gives a unique non-NULL pointer.
     * Accounted per tag in mem_stats' pinned_* fields, never in the
     * device-memory fields nor against the device's budget.  DT_ERR_NOMEM
     * naming the tag and the size when the host has none.  *out is the
     * caller's until host_free. */
    int (*host_alloc)(dt_device_t *d, uint64_t bytes, int tag, void **out);
    /* Free memory from host_alloc, after the copies queued on it finish.
     * NULL is a no-op; a pointer host_alloc did not hand out (device memory
     * included) fails with DT_ERR_INVALID. */
    int (*host_free)(dt_device_t *d, void *ptr);

    /* ---- streams and events (mandatory) ---- */
    int (*stream_create)(dt_device_t *d, dt_stream_t **out);
    int (*stream_destroy)(dt_device_t *d, dt_stream_t *s);
    /* Block until all work queued on `s` is done. */
    int (*stream_sync)(dt_device_t *d, dt_stream_t *s);
    int (*event_create)(dt_device_t *d, dt_event_t **out);
    int (*event_destroy)(dt_device_t *d, dt_event_t *e);
    /* Mark the current end of `s`; the event completes when work queued
     * before it completes. */
    int (*event_record)(dt_device_t *d, dt_event_t *e, dt_stream_t *s);
    /* Work queued on `s` after this call waits for `e` (no host block). */
    int (*stream_wait_event)(dt_device_t *d, dt_stream_t *s, dt_event_t *e);
    /* Block the host until `e` completes. */
    int (*event_sync)(dt_device_t *d, dt_event_t *e);
    /* Block until all queued work on all streams is done. */
    int (*synchronize)(dt_device_t *d);

    /* ---- copies (mandatory) ---- */
    /* Copy `bytes` from src to dst, ordered on `s`.  Host memory passed to
     * H2D/D2H must stay valid until the stream reaches this point; with
     * host_alloc memory the copy overlaps other work, with any other host
     * memory a backend may stage it or block. */
    int (*memcpy_async)(dt_device_t *d, void *dst, const void *src,
                        uint64_t bytes, int kind, dt_stream_t *s);
    /* Set `bytes` of device memory to the byte `value`. */
    int (*memset_async)(dt_device_t *d, void *dst, int value, uint64_t bytes,
                        dt_stream_t *s);

    /* Optional.  The backend's native handle of a stream (cudaStream_t for
     * cuda) so a communicator can enqueue on it.  NULL stream: default. */
    int (*native_stream)(dt_device_t *d, dt_stream_t *s, void **out);

    /* ---- minor 0 ends here; append only ---- */
} dt_device_ops_v1_t;

/* Current-version names (NCCL's habit): core and plugins spell these, so a
 * new minor or major changes one line here, not every user. */
typedef dt_device_ops_v1_t dt_device_ops_t;

/* The table instance `d` was made by: its first member (the rule at
 * dt_device_t above); NULL for a NULL handle. */
static inline const dt_device_ops_v1_t *dt_device_ops(const dt_device_t *d)
{
    return d ? *(const dt_device_ops_v1_t *const *)(const void *)d : NULL;
}
typedef dt_kernels_v1_t dt_kernels_t;
typedef dt_device_init_v1_t dt_device_init_t;
typedef dt_device_props_v1_t dt_device_props_t;

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_DEVICE_H */
