/*
 * plugins/cpu/cpu_profile.h - the cpu device's opt-in kernel profiler.
 *
 * With DTRAIN_CPU_PROFILE=1 in the environment, every kernel of the kernel
 * table and every copy of the runtime table adds its wall time (and, for
 * matmuls, its FLOPs) to a per-kind total, and finalize logs the table
 * through host->log, e.g. to see how much of a training step is spent
 * outside matmul.  Off (the default) these entries cost one predictable
 * branch on a NULL pointer before the kernel itself: nothing is timed or
 * counted.
 *
 * Forward passes are counted at each embedding_forward, the first kernel
 * of every forward pass of the built-in models (with one micro-batch per
 * step, passes are steps).  When the run had at least two passes the
 * table covers whole passes only, from the start of the first counted one
 * to the start of the last one: the last pass and whatever follows it
 * (a final checkpoint's copies, teardown) are left out, and so are the
 * first DTRAIN_CPU_PROFILE_SKIP=N passes (a run's first steps are slow:
 * page faults on fresh activations, gradients and optimizer state).
 * Otherwise it covers everything from init (or pass N+1) to finalize.
 *
 * An environment variable rather than a [cpu] key so that it can be turned
 * on for any run (also ranks started by a launcher, which inherit it)
 * without touching the config.
 */
#ifndef DT_CPU_PROFILE_H
#define DT_CPU_PROFILE_H

#include <stdatomic.h>
#include <stdint.h>

#include "dtrain/device.h"

/* Kernel kinds, one row each in the table. */
enum {
    CPU_PK_MATMUL_FWD, CPU_PK_MATMUL_BWD, CPU_PK_ATTENTION_FWD,
    CPU_PK_ATTENTION_BWD, CPU_PK_LAYERNORM_FWD, CPU_PK_LAYERNORM_BWD,
    CPU_PK_GELU_FWD, CPU_PK_GELU_BWD, CPU_PK_EMBEDDING_FWD,
    CPU_PK_EMBEDDING_BWD, CPU_PK_RESIDUAL, CPU_PK_AXPY,
    CPU_PK_SOFTMAX_XENT_FWD, CPU_PK_SOFTMAX_XENT_BWD, CPU_PK_ADAMW,
    CPU_PK_SGD, CPU_PK_SUMSQ, CPU_PK_SCALE, CPU_PK_CAST, CPU_PK_MEMCPY,
    CPU_PK_MEMSET, CPU_PK_COUNT
};

/* Per-kind totals. */
typedef struct cpu_prof_counts {
    _Atomic uint64_t ns[CPU_PK_COUNT];
    _Atomic uint64_t calls[CPU_PK_COUNT];
    _Atomic uint64_t flops[CPU_PK_COUNT]; /* matmuls only */
    _Atomic uint64_t bytes[CPU_PK_COUNT]; /* memcpy, memset */
} cpu_prof_counts_t;

/* Atomic: kernels may come from several threads (a strategy's reduction
 * stream casts on the comm thread). */
typedef struct cpu_prof {
    uint64_t skip;                /* passes left out */
    _Atomic uint64_t passes;      /* embedding_forward calls so far */
    _Atomic int active;           /* counting (pass skip+1 has begun) */
    uint64_t t_start_ns;          /* when counting began (init or pass skip+1) */
    cpu_prof_counts_t live;       /* since t_start_ns */
    /* `live` as it was when the latest pass after skip+1 began (written by
     * the thread running embedding_forward; read at finalize) */
    cpu_prof_counts_t at_pass;
    uint64_t at_pass_ns;
    uint64_t whole_passes;        /* passes between t_start_ns and at_pass_ns */
} cpu_prof_t;

/* A profile when DTRAIN_CPU_PROFILE asks for one ("1", "true", "yes",
 * "on"), else NULL (also when out of memory: profiling is best effort). */
cpu_prof_t *cpu_prof_create(void);
/* Log the table at INFO through host->log and free p (NULL: no-op). */
void cpu_prof_report(const dt_host_v1_t *host, cpu_prof_t *p,
                     const char *device_name);

/* ---- the kernel table's entries and the copies (profiling wrappers;
 * signatures are the ABI's, dtrain/device.h) ---- */
int cpu_prof_matmul_forward(dt_device_t *d, dt_stream_t *s, void *out,
                            const void *inp, const void *weight,
                            const void *bias, int dtype, int wdtype, int64_t N,
                            int64_t C, int64_t OC);
int cpu_prof_matmul_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                             float *dweight, float *dbias, const void *dout,
                             const void *inp, const void *weight, int dtype,
                             int wdtype, int64_t N, int64_t C, int64_t OC);
int cpu_prof_embedding_forward(dt_device_t *d, dt_stream_t *s, void *out,
                               const int32_t *tokens, const void *wte,
                               const void *wpe, int dtype, int64_t B,
                               int64_t T, int64_t C);
int cpu_prof_embedding_backward(dt_device_t *d, dt_stream_t *s, float *dwte,
                                float *dwpe, const void *dout,
                                const int32_t *tokens, int dtype, int64_t B,
                                int64_t T, int64_t C);
int cpu_prof_gelu_forward(dt_device_t *d, dt_stream_t *s, void *out,
                          const void *inp, int dtype, int64_t n);
int cpu_prof_gelu_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                           const void *inp, const void *dout, int dtype,
                           int64_t n);
int cpu_prof_softmax_xent_forward(dt_device_t *d, dt_stream_t *s,
                                  float *losses, void *probs,
                                  const void *logits, const int32_t *targets,
                                  int dtype, int64_t N, int64_t V);
int cpu_prof_softmax_xent_backward(dt_device_t *d, dt_stream_t *s,
                                   void *dlogits, const void *probs,
                                   const int32_t *targets, int dtype,
                                   float dloss, int64_t N, int64_t V);
int cpu_prof_axpy(dt_device_t *d, dt_stream_t *s, void *y, const void *x,
                  int dtype, float alpha, int64_t n);
int cpu_prof_sumsq(dt_device_t *d, dt_stream_t *s, double *out, const void *x,
                   int dtype, int64_t n);
int cpu_prof_cast(dt_device_t *d, dt_stream_t *s, void *dst, int dst_dtype,
                  const void *src, int src_dtype, int64_t n);
int cpu_prof_layernorm_forward(dt_device_t *d, dt_stream_t *s, void *out,
                               float *mean, float *rstd, const void *inp,
                               const void *weight, const void *bias, int dtype,
                               int64_t N, int64_t C);
int cpu_prof_layernorm_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                                float *dweight, float *dbias,
                                const void *dout, const void *inp,
                                const void *weight, const float *mean,
                                const float *rstd, int dtype, int64_t N,
                                int64_t C);
int cpu_prof_attention_forward(dt_device_t *d, dt_stream_t *s, void *out,
                               void *state, const void *qkv, int dtype,
                               int64_t B, int64_t T, int64_t C, int64_t NH);
int cpu_prof_attention_backward(dt_device_t *d, dt_stream_t *s, void *dqkv,
                                const void *dout, const void *qkv,
                                const void *out, const void *state, int dtype,
                                int64_t B, int64_t T, int64_t C, int64_t NH);
int cpu_prof_residual_forward(dt_device_t *d, dt_stream_t *s, void *out,
                              const void *a, const void *b, int dtype,
                              int64_t n);
int cpu_prof_scale(dt_device_t *d, dt_stream_t *s, void *x, int dtype,
                   float alpha, int64_t n);
int cpu_prof_adamw_update(dt_device_t *d, dt_stream_t *s, float *param,
                          const void *grad, float *m, float *v, int grad_dtype,
                          int64_t n, float lr, float beta1, float beta2,
                          float eps, float weight_decay, float grad_scale,
                          int64_t t);
int cpu_prof_sgd_update(dt_device_t *d, dt_stream_t *s, float *param,
                        const void *grad, float *mom, int grad_dtype,
                        int64_t n, float lr, float momentum,
                        float weight_decay, int nesterov, float grad_scale);
int cpu_prof_memcpy_async(dt_device_t *d, void *dst, const void *src,
                          uint64_t bytes, int kind, dt_stream_t *s);
int cpu_prof_memset_async(dt_device_t *d, void *dst, int value,
                          uint64_t bytes, dt_stream_t *s);

#endif /* DT_CPU_PROFILE_H */
