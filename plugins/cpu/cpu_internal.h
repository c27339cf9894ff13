/*
 * plugins/cpu/cpu_internal.h - what the cpu device's source files share:
 * the instance struct, the memory accounting used for scratch, argument
 * checks, and the kernel entry points that cpu_device.c puts in the ops
 * table.  Nothing here is exported from the module.
 */
#ifndef DT_CPU_INTERNAL_H
#define DT_CPU_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "dtrain/device.h"
#include "common/device/mem_tally.h"
#include "cpu_pool.h"

#define CPU_STREAM_MAGIC 0x43505553u /* "CPUS" */
#define CPU_EVENT_MAGIC 0x43505545u  /* "CPUE" */

/* Kernels and copies run to completion before they return, so a stream
 * has no queue: the handle exists so callers keep the asynchronous
 * contract's shape and so misuse (another device's stream, a destroyed
 * handle) is caught.  An event is complete as soon as it is recorded. */
struct dt_stream {
    uint32_t magic;
    dt_device_t *dev;
};

struct dt_event {
    uint32_t magic;
    dt_device_t *dev;
    int recorded; /* informational: every recorded point is reached */
};

/* One live allocation (open-addressing table keyed by pointer, so freeing
 * a pointer we never handed out is detected without reading before it). */
typedef struct cpu_block {
    void *ptr; /* NULL: empty slot; CPU_TOMBSTONE: deleted */
    uint64_t bytes;
    int32_t tag;
    int32_t pinned; /* 1: host_alloc's (pinned host memory), 0: alloc's */
} cpu_block_t;

/* Freed large blocks kept for reuse (see cpu_device.c mem_alloc). */
#define CPU_CACHE_SLOTS 64
#define CPU_CACHE_MIN_BYTES (1u << 20)
#define CPU_CACHE_MAX_BYTES ((uint64_t)1 << 30)

typedef struct cpu_cached {
    void *ptr;
    uint64_t bytes;
} cpu_cached_t;

/* guard_memory's arena (cpu_guard.c): a free run of it, bytes. */
typedef struct cpu_run {
    uint64_t off, len;
} cpu_run_t;

typedef struct cpu_arena {
    char *base;        /* the reserved range [base, base + reserved) */
    uint64_t reserved;
    uint64_t used;     /* the front [base, base + used) holds every block */
    uint64_t opened;   /* kernels and copies running: the front is open */
    cpu_run_t *runs;   /* free runs inside the front, by offset */
    uint64_t nruns, cap;
} cpu_arena_t;

struct dt_device {
    const dt_device_ops_v1_t *ops; /* first: the table that made it (dtrain/device.h) */
    const dt_host_v1_t *host;
    int threads;
    uint64_t limit; /* memory_limit, bytes; 0 = no budget */
    cpu_pool_t *pool;

    /* Memory accounting; guarded by mem_mu (alloc/free may come from any
     * thread).  Device memory in mem, pinned host memory (host_alloc:
     * plain host memory here, as device memory is) in pinned_mem; only
     * the first counts against `limit`. */
    pthread_mutex_t mem_mu;
    dt_mem_tally_t mem;
    dt_mem_tally_t pinned_mem;
    cpu_block_t *blocks;
    uint64_t nblocks_cap; /* power of two */
    uint64_t nblocks_used; /* live + tombstones */
    /* Freed blocks of at least CPU_CACHE_MIN_BYTES, reused by an
     * allocation of exactly their size: sharded strategies free and
     * re-allocate the same gather and gradient buffers every unit, and a
     * fresh block costs a page fault per 4 KiB on first touch.  Not
     * counted as in use; at most CPU_CACHE_MAX_BYTES, and never more than
     * memory_limit leaves free. */
    cpu_cached_t cache[CPU_CACHE_SLOTS];
    uint64_t cached_bytes;
    /* guard_memory: device memory comes from `arena` and is closed to the
     * host outside this device's kernels and copies (cpu_guard.c); the
     * arena is guarded by mem_mu, and the cache is not used. */
    int guard;
    cpu_arena_t arena;

    /* Kernels take kmu: the pool, the scratch buffer and OpenBLAS are used
     * by one kernel at a time. */
    pthread_mutex_t kmu;
    void *scratch; /* tagged DT_TAG_STAGING, grown on demand */
    uint64_t scratch_bytes;

    char name[128];
    uint64_t total_memory;
    double peak_flops;
};

/* Accounted allocation (also used for the plugin's own scratch). */
int cpu_mem_alloc(dt_device_t *d, uint64_t bytes, int tag, void **out);
int cpu_mem_free(dt_device_t *d, void *ptr);

/* A scratch buffer of at least `bytes`, valid until the next call; call
 * with kmu held.  Counted under DT_TAG_STAGING (and the budget). */
int cpu_scratch(dt_device_t *d, uint64_t bytes, void **out, const char *op);

/* guard_memory (cpu_guard.c).  init reserves the arena (with total_memory
 * set) and fini gives it back; take and give, with mem_mu held, hand out
 * and take back a block (errno on failure); open and close bracket a
 * kernel or copy (DT_ERR_SYSTEM with the message when mprotect fails);
 * owns says whether `p` lies in the arena. */
int cpu_guard_init(dt_device_t *d);
void cpu_guard_fini(dt_device_t *d);
int cpu_guard_take(dt_device_t *d, uint64_t bytes, void **out);
void cpu_guard_give(dt_device_t *d, void *p, uint64_t bytes);
int cpu_guard_open(dt_device_t *d, const char *op);
int cpu_guard_close(dt_device_t *d, const char *op);
int cpu_guard_owns(const dt_device_t *d, const void *p);
/* A copy's (memset's: src NULL, kind D2D) buffers are where `kind` says
 * (DT_ERR_INVALID naming the buffer otherwise). */
int cpu_guard_check_copy(dt_device_t *d, const char *op, const void *dst,
                         const void *src, uint64_t bytes, int kind);
/* The kernel table (the same for every instance; its entries open the
 * arena of an instance with guard_memory around the kernel). */
const dt_kernels_v1_t *cpu_kernel_table(void);

/* Checks every kernel does before it runs: a live device and a stream of
 * that device (NULL: default).  Sets the message and returns the status. */
int cpu_check_stream(dt_device_t *d, dt_stream_t *s, const char *op);

static inline void cpu_lock(dt_device_t *d) { pthread_mutex_lock(&d->kmu); }
static inline void cpu_unlock(dt_device_t *d) { pthread_mutex_unlock(&d->kmu); }

#define CPU_INVALID(d, ...)                                                    \
    (d)->host->set_error((d)->host, DT_ERR_INVALID, __VA_ARGS__)

/* Start of every kernel: device, stream. */
#define CPU_BEGIN(d, s, op)                                                    \
    do {                                                                       \
        if (!(d))                                                              \
            return DT_ERR_INVALID;                                             \
        int rc_ = cpu_check_stream((d), (s), (op));                            \
        if (rc_ != DT_OK)                                                      \
            return rc_;                                                        \
    } while (0)

/* A size argument must be >= 0. */
#define CPU_DIM(d, op, x)                                                      \
    do {                                                                       \
        if ((x) < 0)                                                           \
            return CPU_INVALID((d), "%s: %s = %lld must be >= 0", (op), #x,    \
                               (long long)(x));                                \
    } while (0)

/* A pointer must be non-NULL whenever it covers any element. */
#define CPU_PTR(d, op, p, count)                                               \
    do {                                                                       \
        if (!(p) && (count) > 0)                                               \
            return CPU_INVALID((d), "%s: %s is NULL (%lld elements)", (op),    \
                               #p, (long long)(count));                        \
    } while (0)

/* Products of dimensions that must stay in int64 (and in BLAS's int). */
int cpu_check_product(dt_device_t *d, const char *op, int64_t a, int64_t b,
                      int64_t *out);

/* ---- dtypes: the cpu runs f32 or bf16 activations (bf16: stored in bf16,
 * computed in f32, each stored result rounded once to nearest even, as the
 * cuda device does), f32, bf16 or f16 matmul weights with f32 activations
 * and bf16 or f32 ones (rounded to bf16) with bf16 activations, f32 or
 * bf16 gradients.  Each check returns DT_OK or DT_ERR_UNSUPPORTED with
 * "<op>: <what it got>: unsupported (the cpu device runs <what it runs>)". */
int cpu_dtype_refused(dt_device_t *d, const char *op, const char *got,
                      const char *runs);
/* Activations (and a layer's non-matrix parameters, which come in the
 * activations' dtype) must be f32 or bf16. */
static inline int cpu_check_act(dt_device_t *d, const char *op, int dtype)
{
    if (dtype == DT_F32 || dtype == DT_BF16)
        return DT_OK;
    char got[64];
    snprintf(got, sizeof got, "%s activations", dt_dtype_name(dtype));
    return cpu_dtype_refused(d, op, got, "f32 or bf16 activations");
}
/* A matmul: f32 activations with f32, bf16 or f16 weights; bf16
 * activations with bf16 or f32 weights (cuda's pairs). */
static inline int cpu_check_act_weight(dt_device_t *d, const char *op,
                                       int dtype, int wdtype)
{
    if ((dtype == DT_F32 &&
         (wdtype == DT_F32 || wdtype == DT_BF16 || wdtype == DT_F16)) ||
        (dtype == DT_BF16 && (wdtype == DT_BF16 || wdtype == DT_F32)))
        return DT_OK;
    char got[96];
    snprintf(got, sizeof got, "%s activations with %s weights",
             dt_dtype_name(dtype), dt_dtype_name(wdtype));
    return cpu_dtype_refused(d, op, got,
                             "f32 activations with f32, bf16 or f16 "
                             "weights, or bf16 activations with bf16 or f32 "
                             "weights");
}
/* Element-wise arithmetic (axpy, scale): f32 or bf16. */
static inline int cpu_check_elems(dt_device_t *d, const char *op, int dtype)
{
    if (dtype == DT_F32 || dtype == DT_BF16)
        return DT_OK;
    char got[64];
    snprintf(got, sizeof got, "%s elements", dt_dtype_name(dtype));
    return cpu_dtype_refused(d, op, got, "f32 or bf16 elements");
}
/* Optimizer updates: f32 or bf16 gradients (parameters and state f32). */
static inline int cpu_check_grad(dt_device_t *d, const char *op, int dtype)
{
    if (dtype == DT_F32 || dtype == DT_BF16)
        return DT_OK;
    char got[64];
    snprintf(got, sizeof got, "%s gradients", dt_dtype_name(dtype));
    return cpu_dtype_refused(d, op, got, "f32 or bf16 gradients");
}
/* Return the check's refusal. */
#define CPU_DTYPES(check)                                                      \
    do {                                                                       \
        int rc_ = (check);                                                     \
        if (rc_ != DT_OK)                                                      \
            return rc_;                                                        \
    } while (0)

/* ---- kernels (signatures are the ABI's; see dtrain/device.h) ---- */
int cpu_matmul_forward(dt_device_t *d, dt_stream_t *s, void *out,
                       const void *inp, const void *weight, const void *bias,
                       int dtype, int wdtype, int64_t N, int64_t C,
                       int64_t OC);
int cpu_matmul_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                        float *dweight, float *dbias, const void *dout,
                        const void *inp, const void *weight, int dtype,
                        int wdtype, int64_t N, int64_t C, int64_t OC);
int cpu_embedding_forward(dt_device_t *d, dt_stream_t *s, void *out,
                          const int32_t *tokens, const void *wte,
                          const void *wpe, int dtype, int64_t B, int64_t T,
                          int64_t C);
int cpu_embedding_backward(dt_device_t *d, dt_stream_t *s, float *dwte,
                           float *dwpe, const void *dout,
                           const int32_t *tokens, int dtype, int64_t B,
                           int64_t T, int64_t C);
int cpu_gelu_forward(dt_device_t *d, dt_stream_t *s, void *out,
                     const void *inp, int dtype, int64_t n);
int cpu_gelu_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                      const void *inp, const void *dout, int dtype,
                      int64_t n);
int cpu_softmax_xent_forward(dt_device_t *d, dt_stream_t *s, float *losses,
                             void *probs, const void *logits,
                             const int32_t *targets, int dtype, int64_t N,
                             int64_t V);
int cpu_softmax_xent_backward(dt_device_t *d, dt_stream_t *s, void *dlogits,
                              const void *probs, const int32_t *targets,
                              int dtype, float dloss, int64_t N, int64_t V);
int cpu_vocab_embedding_forward(dt_device_t *d, dt_stream_t *s, void *out,
                                const int32_t *tokens, const void *wte,
                                const void *wpe, int dtype, int64_t B,
                                int64_t T, int64_t C, int64_t v0, int64_t nv);
int cpu_vocab_embedding_backward(dt_device_t *d, dt_stream_t *s, float *dwte,
                                 float *dwpe, const void *dout,
                                 const int32_t *tokens, int dtype, int64_t B,
                                 int64_t T, int64_t C, int64_t v0, int64_t nv);
int cpu_vocab_xent_forward(dt_device_t *d, dt_stream_t *s, int phase,
                           float *stats, float *losses, void *probs,
                           const void *logits, const int32_t *targets,
                           int dtype, int64_t N, int64_t v0, int64_t nv);
int cpu_vocab_xent_backward(dt_device_t *d, dt_stream_t *s, void *dlogits,
                            const void *probs, const int32_t *targets,
                            int dtype, float dloss, int64_t N, int64_t v0,
                            int64_t nv);
int cpu_axpy(dt_device_t *d, dt_stream_t *s, void *y, const void *x,
             int dtype, float alpha, int64_t n);
int cpu_sumsq(dt_device_t *d, dt_stream_t *s, double *out, const void *x,
              int dtype, int64_t n);
int cpu_cast(dt_device_t *d, dt_stream_t *s, void *dst, int dst_dtype,
             const void *src, int src_dtype, int64_t n);
int cpu_layernorm_forward(dt_device_t *d, dt_stream_t *s, void *out,
                          float *mean, float *rstd, const void *inp,
                          const void *weight, const void *bias, int dtype,
                          int64_t N, int64_t C);
int cpu_layernorm_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                           float *dweight, float *dbias, const void *dout,
                           const void *inp, const void *weight,
                           const float *mean, const float *rstd, int dtype,
                           int64_t N, int64_t C);
int cpu_attention_state_bytes(int64_t B, int64_t T, int64_t C, int64_t NH,
                              int dtype, uint64_t *out);
int cpu_attention_forward(dt_device_t *d, dt_stream_t *s, void *out,
                          void *state, const void *qkv, int dtype, int64_t B,
                          int64_t T, int64_t C, int64_t NH);
int cpu_attention_backward(dt_device_t *d, dt_stream_t *s, void *dqkv,
                           const void *dout, const void *qkv, const void *out,
                           const void *state, int dtype, int64_t B, int64_t T,
                           int64_t C, int64_t NH);
int cpu_residual_forward(dt_device_t *d, dt_stream_t *s, void *out,
                         const void *a, const void *b, int dtype, int64_t n);
int cpu_scale(dt_device_t *d, dt_stream_t *s, void *x, int dtype, float alpha,
              int64_t n);
int cpu_adamw_update(dt_device_t *d, dt_stream_t *s, float *param,
                     const void *grad, float *m, float *v, int grad_dtype,
                     int64_t n, float lr, float beta1, float beta2, float eps,
                     float weight_decay, float grad_scale, int64_t t);
int cpu_sgd_update(dt_device_t *d, dt_stream_t *s, float *param,
                   const void *grad, float *mom, int grad_dtype, int64_t n,
                   float lr, float momentum, float weight_decay, int nesterov,
                   float grad_scale);
int cpu_rmsnorm_forward(dt_device_t *d, dt_stream_t *s, void *out, float *rstd,
                        const void *inp, const void *weight, int dtype,
                        int64_t N, int64_t C, float eps);
int cpu_rmsnorm_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                         float *dweight, const void *dout, const void *inp,
                         const void *weight, const float *rstd, int dtype,
                         int64_t N, int64_t C);
int cpu_rope_forward(dt_device_t *d, dt_stream_t *s, void *out,
                     const void *inp, const float *cos, const float *sin,
                     int dtype, int64_t B, int64_t T, int64_t NH, int64_t HD,
                     int64_t ld);
int cpu_rope_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                      const void *dout, const float *cos, const float *sin,
                      int dtype, int64_t B, int64_t T, int64_t NH, int64_t HD,
                      int64_t ld);
int cpu_swiglu_forward(dt_device_t *d, dt_stream_t *s, void *out,
                       const void *inp, int dtype, int64_t N, int64_t H);
int cpu_swiglu_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                        const void *inp, const void *dout, int dtype,
                        int64_t N, int64_t H);
int cpu_gqa_attention_forward(dt_device_t *d, dt_stream_t *s, void *out,
                              void *state, const void *qkv, int dtype,
                              int64_t B, int64_t T, int64_t NH, int64_t NKV,
                              int64_t HD);
int cpu_gqa_attention_backward(dt_device_t *d, dt_stream_t *s, void *dqkv,
                               const void *dout, const void *qkv,
                               const void *out, const void *state, int dtype,
                               int64_t B, int64_t T, int64_t NH, int64_t NKV,
                               int64_t HD);
int cpu_memcpy_async(dt_device_t *d, void *dst, const void *src,
                     uint64_t bytes, int kind, dt_stream_t *s);
int cpu_memset_async(dt_device_t *d, void *dst, int value, uint64_t bytes,
                     dt_stream_t *s);

/* Peak f32 FLOP/s of one thread, for MFU: measured once per process with
 * an FMA loop (cpu_peak.c); *how (may be NULL) says how it was found. */
double cpu_peak_flops_per_thread(const char **how);

/* Hot loops get an AVX2 clone, chosen once at load time (ifunc), beside
 * the baseline x86-64 one, so the module still runs on any x86-64 CPU.
 * "avx2" does not enable FMA and ISO C mode does not contract a * b + c,
 * so both clones perform the same IEEE operations: the same bits on every
 * machine. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(DT_CPU_NO_CLONES)
#define CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPU_CLONES
#endif

/* Elements per parallel chunk below which waking a worker costs more than
 * it saves (element-wise kernels). */
#define CPU_GRAIN 16384

#endif /* DT_CPU_INTERNAL_H */
