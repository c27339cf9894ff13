/*
 * plugins/cpu/cpu_profile.c - the opt-in kernel profiler (cpu_profile.h):
 * the kernel table's entries and the copies, which time the real kernels
 * when a profile exists, and the table finalize logs.
 *
 * Each entry checks d->prof first and, when it is NULL (profiling off),
 * tail-calls the kernel: no clock read, no atomic, so the default path
 * costs a load and a branch per kernel call (kernels run for micro- to
 * milliseconds).  On, each call past the skipped passes reads the
 * monotonic clock twice (vDSO, tens of ns) and adds to two or three
 * relaxed atomics.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "cpu_internal.h"

static const char *const kind_names[CPU_PK_COUNT] = {
    [CPU_PK_MATMUL_FWD] = "matmul_fwd",
    [CPU_PK_MATMUL_BWD] = "matmul_bwd",
    [CPU_PK_ATTENTION_FWD] = "attention_fwd",
    [CPU_PK_ATTENTION_BWD] = "attention_bwd",
    [CPU_PK_LAYERNORM_FWD] = "layernorm_fwd",
    [CPU_PK_LAYERNORM_BWD] = "layernorm_bwd",
    [CPU_PK_GELU_FWD] = "gelu_fwd",
    [CPU_PK_GELU_BWD] = "gelu_bwd",
    [CPU_PK_EMBEDDING_FWD] = "embedding_fwd",
    [CPU_PK_EMBEDDING_BWD] = "embedding_bwd",
    [CPU_PK_RESIDUAL] = "residual",
    [CPU_PK_AXPY] = "axpy",
    [CPU_PK_SOFTMAX_XENT_FWD] = "softmax_xent_fwd",
    [CPU_PK_SOFTMAX_XENT_BWD] = "softmax_xent_bwd",
    [CPU_PK_ADAMW] = "adamw",
    [CPU_PK_SGD] = "sgd",
    [CPU_PK_SUMSQ] = "sumsq",
    [CPU_PK_SCALE] = "scale",
    [CPU_PK_CAST] = "cast",
    [CPU_PK_MEMCPY] = "memcpy",
    [CPU_PK_MEMSET] = "memset",
};

static uint64_t prof_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

cpu_prof_t *cpu_prof_create(void)
{
    const char *env = getenv("DTRAIN_CPU_PROFILE");
    if (!env || !(strcmp(env, "1") == 0 || strcasecmp(env, "true") == 0 ||
                  strcasecmp(env, "yes") == 0 || strcasecmp(env, "on") == 0))
        return NULL;
    cpu_prof_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    const char *skip = getenv("DTRAIN_CPU_PROFILE_SKIP");
    if (skip && *skip >= '0' && *skip <= '9') {
        char *end = NULL;
        unsigned long long v = strtoull(skip, &end, 10);
        if (end && *end == '\0')
            p->skip = v;
    }
    p->t_start_ns = prof_now();
    atomic_init(&p->passes, 0);
    atomic_init(&p->active, p->skip == 0);
    return p;
}

static void counts_copy(cpu_prof_counts_t *dst, cpu_prof_counts_t *src)
{
    for (int k = 0; k < CPU_PK_COUNT; k++) {
        atomic_store_explicit(&dst->ns[k], atomic_load(&src->ns[k]), memory_order_relaxed);
        atomic_store_explicit(&dst->calls[k], atomic_load(&src->calls[k]),
                              memory_order_relaxed);
        atomic_store_explicit(&dst->flops[k], atomic_load(&src->flops[k]),
                              memory_order_relaxed);
        atomic_store_explicit(&dst->bytes[k], atomic_load(&src->bytes[k]),
                              memory_order_relaxed);
    }
}

/* A forward pass begins (embedding_forward): start counting at pass
 * skip + 1; at every later pass, close the whole passes so far. */
static void prof_pass(cpu_prof_t *p)
{
    uint64_t n = atomic_fetch_add(&p->passes, 1) + 1;
    if (n <= p->skip)
        return;
    uint64_t t = prof_now();
    if (n == p->skip + 1) {
        if (p->skip > 0) {
            p->t_start_ns = t;
            atomic_store(&p->active, 1);
        }
        return;
    }
    counts_copy(&p->at_pass, &p->live);
    p->at_pass_ns = t;
    p->whole_passes = n - 1 - p->skip;
}

/* Add one call of `kind` that began at t0 (flops and bytes may be 0). */
static void prof_add(cpu_prof_t *p, int kind, uint64_t t0, uint64_t flops,
                     uint64_t bytes)
{
    uint64_t dt = prof_now() - t0;
    cpu_prof_counts_t *c = &p->live;
    atomic_fetch_add_explicit(&c->ns[kind], dt, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->calls[kind], 1, memory_order_relaxed);
    if (flops)
        atomic_fetch_add_explicit(&c->flops[kind], flops, memory_order_relaxed);
    if (bytes)
        atomic_fetch_add_explicit(&c->bytes[kind], bytes, memory_order_relaxed);
}

void cpu_prof_report(const dt_host_v1_t *host, cpu_prof_t *p,
                     const char *device_name)
{
    if (!p)
        return;
    uint64_t passes = atomic_load(&p->passes);
    if (!atomic_load(&p->active)) {
        host->log(host, DT_LOG_INFO,
                  "profile (%s): nothing measured: %llu forward pass(es), all "
                  "left out by DTRAIN_CPU_PROFILE_SKIP=%llu", device_name,
                  (unsigned long long)passes, (unsigned long long)p->skip);
        free(p);
        return;
    }
    /* whole passes when there are any, else everything up to now */
    cpu_prof_counts_t *c = p->whole_passes ? &p->at_pass : &p->live;
    uint64_t t_end = p->whole_passes ? p->at_pass_ns : prof_now();
    double wall = (double)(t_end - p->t_start_ns) * 1e-9;
    double per = p->whole_passes ? (double)p->whole_passes : 1.0;
    char span[160];
    if (p->whole_passes)
        snprintf(span, sizeof span, "forward passes %llu..%llu of %llu (%llu whole)",
                 (unsigned long long)p->skip + 1,
                 (unsigned long long)(p->skip + p->whole_passes),
                 (unsigned long long)passes, (unsigned long long)p->whole_passes);
    else if (p->skip)
        snprintf(span, sizeof span, "forward pass %llu to finalize (%llu passes)",
                 (unsigned long long)p->skip + 1, (unsigned long long)passes);
    else
        snprintf(span, sizeof span, "init to finalize (%llu forward passes)",
                 (unsigned long long)passes);
    const char *unit = p->whole_passes ? "per pass" : "in total";

    double tot = 0, mm = 0;
    int order[CPU_PK_COUNT], n = 0;
    for (int k = 0; k < CPU_PK_COUNT; k++) {
        double s = (double)atomic_load(&c->ns[k]) * 1e-9;
        tot += s;
        if (k == CPU_PK_MATMUL_FWD || k == CPU_PK_MATMUL_BWD)
            mm += s;
        if (atomic_load(&c->calls[k]))
            order[n++] = k;
    }
    /* most expensive first (insertion sort: at most CPU_PK_COUNT rows) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && atomic_load(&c->ns[order[j]]) >
                                     atomic_load(&c->ns[order[j - 1]]); j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    const double pct_w = wall > 0 ? 100.0 / wall : 0;
    host->log(host, DT_LOG_INFO,
              "profile (%s): %s: %.2f ms %s, kernels and copies %.2f ms "
              "(%.1f%%), matmul %.2f ms (%.1f%%), outside matmul %.1f%%",
              device_name, span, wall * 1e3 / per, unit, tot * 1e3 / per, tot * pct_w,
              mm * 1e3 / per, mm * pct_w, 100.0 - mm * pct_w);
    host->log(host, DT_LOG_INFO, "profile: %-17s %9s %11s %10s %7s %10s  %s",
              "kind", "calls", "total ms", "ms/pass", "% wall", "us/call", "rate");
    for (int i = 0; i < n; i++) {
        int k = order[i];
        uint64_t calls = atomic_load(&c->calls[k]);
        double s = (double)atomic_load(&c->ns[k]) * 1e-9;
        double fl = (double)atomic_load(&c->flops[k]);
        double by = (double)atomic_load(&c->bytes[k]);
        char rate[48] = "";
        if (fl > 0 && s > 0)
            snprintf(rate, sizeof rate, "%.1f GFLOP/s", fl / s * 1e-9);
        else if (by > 0 && s > 0)
            snprintf(rate, sizeof rate, "%.2f GB/s", by / s * 1e-9);
        host->log(host, DT_LOG_INFO,
                  "profile: %-17s %9" PRIu64 " %11.2f %10.2f %7.1f %10.1f  %s",
                  kind_names[k], calls, s * 1e3, s * 1e3 / per, s * pct_w,
                  s * 1e6 / (double)calls, rate);
    }
    free(p);
}

/* The entry body: kernel straight through when off, timed when on. */
#define PROF_CALL(kind, flops, bytes, call)                                    \
    do {                                                                       \
        if (!d || !d->prof ||                                                  \
            !atomic_load_explicit(&d->prof->active, memory_order_relaxed))     \
            return call;                                                       \
        uint64_t t0_ = prof_now();                                             \
        int rc_ = call;                                                        \
        prof_add(d->prof, (kind), t0_, rc_ == DT_OK ? (flops) : 0,             \
                 rc_ == DT_OK ? (bytes) : 0);                                  \
        return rc_;                                                            \
    } while (0)

/* FLOPs of a matmul of (N, C) by (C, OC), counted in double then clamped
 * (the kernel refuses shapes whose products overflow, but counts come
 * before its checks). */
static uint64_t mm_flops(double mult, int64_t N, int64_t C, int64_t OC)
{
    if (N <= 0 || C <= 0 || OC <= 0)
        return 0;
    double f = mult * (double)N * (double)C * (double)OC;
    return f < 1.8e19 ? (uint64_t)f : 0;
}

int cpu_prof_matmul_forward(dt_device_t *d, dt_stream_t *s, void *out,
                            const void *inp, const void *weight,
                            const void *bias, int dtype, int wdtype, int64_t N,
                            int64_t C, int64_t OC)
{
    PROF_CALL(CPU_PK_MATMUL_FWD, mm_flops(2.0, N, C, OC), 0,
              cpu_matmul_forward(d, s, out, inp, weight, bias, dtype, wdtype, N, C,
                                 OC));
}

int cpu_prof_matmul_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                             float *dweight, float *dbias, const void *dout,
                             const void *inp, const void *weight, int dtype,
                             int wdtype, int64_t N, int64_t C, int64_t OC)
{
    PROF_CALL(CPU_PK_MATMUL_BWD,
              mm_flops(2.0 * ((dinp != NULL) + (dweight != NULL)), N, C, OC), 0,
              cpu_matmul_backward(d, s, dinp, dweight, dbias, dout, inp, weight,
                                  dtype, wdtype, N, C, OC));
}

int cpu_prof_embedding_forward(dt_device_t *d, dt_stream_t *s, void *out,
                               const int32_t *tokens, const void *wte,
                               const void *wpe, int dtype, int64_t B,
                               int64_t T, int64_t C)
{
    if (d && d->prof)
        prof_pass(d->prof);
    PROF_CALL(CPU_PK_EMBEDDING_FWD, 0, 0,
              cpu_embedding_forward(d, s, out, tokens, wte, wpe, dtype, B, T, C));
}

int cpu_prof_embedding_backward(dt_device_t *d, dt_stream_t *s, float *dwte,
                                float *dwpe, const void *dout,
                                const int32_t *tokens, int dtype, int64_t B,
                                int64_t T, int64_t C)
{
    PROF_CALL(CPU_PK_EMBEDDING_BWD, 0, 0,
              cpu_embedding_backward(d, s, dwte, dwpe, dout, tokens, dtype, B, T, C));
}

int cpu_prof_gelu_forward(dt_device_t *d, dt_stream_t *s, void *out,
                          const void *inp, int dtype, int64_t n)
{
    PROF_CALL(CPU_PK_GELU_FWD, 0, 0, cpu_gelu_forward(d, s, out, inp, dtype, n));
}

int cpu_prof_gelu_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                           const void *inp, const void *dout, int dtype,
                           int64_t n)
{
    PROF_CALL(CPU_PK_GELU_BWD, 0, 0,
              cpu_gelu_backward(d, s, dinp, inp, dout, dtype, n));
}

int cpu_prof_softmax_xent_forward(dt_device_t *d, dt_stream_t *s,
                                  float *losses, void *probs,
                                  const void *logits, const int32_t *targets,
                                  int dtype, int64_t N, int64_t V)
{
    PROF_CALL(CPU_PK_SOFTMAX_XENT_FWD, 0, 0,
              cpu_softmax_xent_forward(d, s, losses, probs, logits, targets, dtype,
                                       N, V));
}

int cpu_prof_softmax_xent_backward(dt_device_t *d, dt_stream_t *s,
                                   void *dlogits, const void *probs,
                                   const int32_t *targets, int dtype,
                                   float dloss, int64_t N, int64_t V)
{
    PROF_CALL(CPU_PK_SOFTMAX_XENT_BWD, 0, 0,
              cpu_softmax_xent_backward(d, s, dlogits, probs, targets, dtype, dloss,
                                        N, V));
}

int cpu_prof_axpy(dt_device_t *d, dt_stream_t *s, void *y, const void *x,
                  int dtype, float alpha, int64_t n)
{
    PROF_CALL(CPU_PK_AXPY, 0, 0, cpu_axpy(d, s, y, x, dtype, alpha, n));
}

int cpu_prof_sumsq(dt_device_t *d, dt_stream_t *s, double *out, const void *x,
                   int dtype, int64_t n)
{
    PROF_CALL(CPU_PK_SUMSQ, 0, 0, cpu_sumsq(d, s, out, x, dtype, n));
}

int cpu_prof_cast(dt_device_t *d, dt_stream_t *s, void *dst, int dst_dtype,
                  const void *src, int src_dtype, int64_t n)
{
    PROF_CALL(CPU_PK_CAST, 0, 0, cpu_cast(d, s, dst, dst_dtype, src, src_dtype, n));
}

int cpu_prof_layernorm_forward(dt_device_t *d, dt_stream_t *s, void *out,
                               float *mean, float *rstd, const void *inp,
                               const void *weight, const void *bias, int dtype,
                               int64_t N, int64_t C)
{
    PROF_CALL(CPU_PK_LAYERNORM_FWD, 0, 0,
              cpu_layernorm_forward(d, s, out, mean, rstd, inp, weight, bias, dtype,
                                    N, C));
}

int cpu_prof_layernorm_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                                float *dweight, float *dbias,
                                const void *dout, const void *inp,
                                const void *weight, const float *mean,
                                const float *rstd, int dtype, int64_t N,
                                int64_t C)
{
    PROF_CALL(CPU_PK_LAYERNORM_BWD, 0, 0,
              cpu_layernorm_backward(d, s, dinp, dweight, dbias, dout, inp, weight,
                                     mean, rstd, dtype, N, C));
}

int cpu_prof_attention_forward(dt_device_t *d, dt_stream_t *s, void *out,
                               void *state, const void *qkv, int dtype,
                               int64_t B, int64_t T, int64_t C, int64_t NH)
{
    PROF_CALL(CPU_PK_ATTENTION_FWD, 0, 0,
              cpu_attention_forward(d, s, out, state, qkv, dtype, B, T, C, NH));
}

int cpu_prof_attention_backward(dt_device_t *d, dt_stream_t *s, void *dqkv,
                                const void *dout, const void *qkv,
                                const void *out, const void *state, int dtype,
                                int64_t B, int64_t T, int64_t C, int64_t NH)
{
    PROF_CALL(CPU_PK_ATTENTION_BWD, 0, 0,
              cpu_attention_backward(d, s, dqkv, dout, qkv, out, state, dtype, B, T, C,
                                     NH));
}

int cpu_prof_residual_forward(dt_device_t *d, dt_stream_t *s, void *out,
                              const void *a, const void *b, int dtype,
                              int64_t n)
{
    PROF_CALL(CPU_PK_RESIDUAL, 0, 0, cpu_residual_forward(d, s, out, a, b, dtype, n));
}

int cpu_prof_scale(dt_device_t *d, dt_stream_t *s, void *x, int dtype,
                   float alpha, int64_t n)
{
    PROF_CALL(CPU_PK_SCALE, 0, 0, cpu_scale(d, s, x, dtype, alpha, n));
}

int cpu_prof_adamw_update(dt_device_t *d, dt_stream_t *s, float *param,
                          const void *grad, float *m, float *v, int grad_dtype,
                          int64_t n, float lr, float beta1, float beta2,
                          float eps, float weight_decay, float grad_scale,
                          int64_t t)
{
    PROF_CALL(CPU_PK_ADAMW, 0, 0,
              cpu_adamw_update(d, s, param, grad, m, v, grad_dtype, n, lr, beta1,
                               beta2, eps, weight_decay, grad_scale, t));
}

int cpu_prof_sgd_update(dt_device_t *d, dt_stream_t *s, float *param,
                        const void *grad, float *mom, int grad_dtype,
                        int64_t n, float lr, float momentum,
                        float weight_decay, int nesterov, float grad_scale)
{
    PROF_CALL(CPU_PK_SGD, 0, 0,
              cpu_sgd_update(d, s, param, grad, mom, grad_dtype, n, lr, momentum,
                             weight_decay, nesterov, grad_scale));
}

int cpu_prof_memcpy_async(dt_device_t *d, void *dst, const void *src,
                          uint64_t bytes, int kind, dt_stream_t *s)
{
    PROF_CALL(CPU_PK_MEMCPY, 0, bytes, cpu_memcpy_async(d, dst, src, bytes, kind, s));
}

int cpu_prof_memset_async(dt_device_t *d, void *dst, int value,
                          uint64_t bytes, dt_stream_t *s)
{
    PROF_CALL(CPU_PK_MEMSET, 0, bytes, cpu_memset_async(d, dst, value, bytes, s));
}
