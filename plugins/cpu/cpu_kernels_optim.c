/*
 * plugins/cpu/cpu_kernels_optim.c - optimizer updates (AdamW, SGD with
 * momentum), the sum of squares behind global-norm clipping, and scale.
 *
 * All element-wise except sumsq; sumsq cuts the input into blocks whose
 * size depends on n alone and adds the per-block double sums in block
 * order, so the result has the same bits at any thread count.
 */
#include <math.h>

#include "dtrain/half.h"
#include "dtrain/sdk/norm.h"
#include "dtrain/sdk/optim.h"
#include "cpu_bf16.h"
#include "cpu_internal.h"

/* bf16 gradients reach the f32 loops widened (exactly), this many at a
 * time on the worker's stack: the loops are element-wise, so the blocks
 * change no result. */
#define CPU_GRAD_BLOCK 1024

/* ------------------------------------------------------------------ AdamW */

/* The element loops are the SDK's (dtrain/sdk/optim.h: dt_adamw_f32,
 * dt_sgd_f32), the same code a strategy runs on offloaded state: a run
 * with its optimizer on an offload tier gives this kernel's bits. */

typedef struct {
    float *param, *m, *v;
    const float *grad;
    dt_adamw_hyper_t h;
} adamw_t;

static void adamw_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const adamw_t *a = ctx;
    (void)tid;
    dt_adamw_f32(a->param + b, a->grad + b, a->m + b, a->v + b, e - b, &a->h);
}

CPU_CLONES static void adamw_bf16_task(void *ctx, int64_t b, int64_t e,
                                       int tid)
{
    const adamw_t *a = ctx;
    float g[CPU_GRAD_BLOCK];
    for (int64_t i = b; i < e; i += CPU_GRAD_BLOCK) {
        int64_t n = e - i < CPU_GRAD_BLOCK ? e - i : CPU_GRAD_BLOCK;
        cpu_bf16_widen(g, CPU_CBF16(a->grad) + i, n);
        dt_adamw_f32(a->param + i, g, a->m + i, a->v + i, n, &a->h);
    }
}

int cpu_adamw_update(dt_device_t *d, dt_stream_t *s, float *param,
                     const void *grad, float *m, float *v, int grad_dtype,
                     int64_t n, float lr, float beta1, float beta2, float eps,
                     float weight_decay, float grad_scale, int64_t t)
{
    static const char op[] = "adamw_update";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_grad(d, op, grad_dtype));
    CPU_DIM(d, op, n);
    if (t < 1)
        return CPU_INVALID(d, "%s: step t = %lld; it is 1-based", op,
                           (long long)t);
    if (!(beta1 >= 0.0f && beta1 < 1.0f) || !(beta2 >= 0.0f && beta2 < 1.0f))
        return CPU_INVALID(d, "%s: beta1 = %g, beta2 = %g must be in [0, 1)",
                           op, (double)beta1, (double)beta2);
    CPU_PTR(d, op, param, n);
    CPU_PTR(d, op, grad, n);
    CPU_PTR(d, op, m, n);
    CPU_PTR(d, op, v, n);
    const dt_optim_desc_v1_t o = {.struct_size = sizeof o, .kind = DT_OPTIM_ADAMW,
                                  .beta1 = beta1, .beta2 = beta2, .eps = eps};
    adamw_t a = {.param = param, .m = m, .v = v, .grad = grad,
                 .h = dt_adamw_hyper(&o, lr, weight_decay, grad_scale, t)};
    cpu_lock(d);
    cpu_pool_run(d->pool, n, CPU_GRAIN,
                 grad_dtype == DT_BF16 ? adamw_bf16_task : adamw_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

/* -------------------------------------------------------------------- SGD */

typedef struct {
    float *param, *mom;
    const float *grad;
    float lr, mu, wd, gs;
    int nesterov;
} sgd_t;

static void sgd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const sgd_t *a = ctx;
    (void)tid;
    dt_sgd_f32(a->param + b, a->grad + b, a->mom ? a->mom + b : NULL, e - b, a->lr, a->mu,
               a->wd, a->nesterov, a->gs);
}

CPU_CLONES static void sgd_bf16_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const sgd_t *a = ctx;
    float g[CPU_GRAD_BLOCK];
    for (int64_t i = b; i < e; i += CPU_GRAD_BLOCK) {
        int64_t n = e - i < CPU_GRAD_BLOCK ? e - i : CPU_GRAD_BLOCK;
        cpu_bf16_widen(g, CPU_CBF16(a->grad) + i, n);
        dt_sgd_f32(a->param + i, g, a->mom ? a->mom + i : NULL, n, a->lr, a->mu,
                   a->wd, a->nesterov, a->gs);
    }
}

int cpu_sgd_update(dt_device_t *d, dt_stream_t *s, float *param,
                   const void *grad, float *mom, int grad_dtype, int64_t n,
                   float lr, float momentum, float weight_decay, int nesterov,
                   float grad_scale)
{
    static const char op[] = "sgd_update";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_grad(d, op, grad_dtype));
    CPU_DIM(d, op, n);
    CPU_PTR(d, op, param, n);
    CPU_PTR(d, op, grad, n);
    if (momentum != 0.0f)
        CPU_PTR(d, op, mom, n);
    sgd_t a = {.param = param, .mom = mom, .grad = grad, .lr = lr,
               .mu = momentum, .wd = weight_decay, .gs = grad_scale,
               .nesterov = nesterov};
    cpu_lock(d);
    cpu_pool_run(d->pool, n, CPU_GRAIN,
                 grad_dtype == DT_BF16 ? sgd_bf16_task : sgd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

/* ------------------------------------------------------------------ sumsq */

/* Blocks of dt_sumsq_block(n) (dtrain/sdk/norm.h), whose host sum over a
 * gradient in an offload tier (dt_sumsq_run_*) gives this kernel's bits. */

typedef struct {
    const void *x;
    int dtype;
    int64_t n, block;
    double partial[DT_SUMSQ_MAX_BLOCKS];
} sumsq_t;

/* Eight running sums so the loop can be vectorised without reassociating
 * (the order is fixed by the code, not by the compiler). */
#define SUMSQ_LOOP(load)                                                       \
    do {                                                                       \
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                             \
        int64_t i = lo;                                                        \
        for (; i + 8 <= hi; i += 8)                                            \
            for (int j = 0; j < 8; j++) {                                      \
                double xv = (double)(load(i + j));                             \
                acc[j] += xv * xv;                                             \
            }                                                                  \
        for (int j = 0; i < hi; i++, j++) {                                    \
            double xv = (double)(load(i));                                     \
            acc[j] += xv * xv;                                                 \
        }                                                                      \
        sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +                        \
              ((acc[4] + acc[5]) + (acc[6] + acc[7]));                         \
    } while (0)

CPU_CLONES static void sumsq_task(void *ctx, int64_t b, int64_t e, int tid)
{
    sumsq_t *a = ctx;
    for (int64_t blk = b; blk < e; blk++) {
        int64_t lo = blk * a->block;
        int64_t hi = lo + a->block < a->n ? lo + a->block : a->n;
        double sum = 0.0;
        if (a->dtype == DT_F32) {
            const float *restrict x = a->x;
#define LOAD_F32(i) x[i]
            SUMSQ_LOOP(LOAD_F32);
        } else if (a->dtype == DT_BF16) {
            const uint16_t *restrict x = a->x;
#define LOAD_BF16(i) dt_bf16_to_f32(x[i])
            SUMSQ_LOOP(LOAD_BF16);
        } else {
            const uint16_t *restrict x = a->x;
#define LOAD_F16(i) dt_f16_to_f32(x[i])
            SUMSQ_LOOP(LOAD_F16);
        }
        a->partial[blk] = sum;
    }
}

int cpu_sumsq(dt_device_t *d, dt_stream_t *s, double *out, const void *x,
              int dtype, int64_t n)
{
    static const char op[] = "sumsq";
    CPU_BEGIN(d, s, op);
    CPU_DIM(d, op, n);
    if (!out)
        return CPU_INVALID(d, "%s: out is NULL", op);
    CPU_PTR(d, op, x, n);
    if (dtype != DT_F32 && dtype != DT_BF16 && dtype != DT_F16)
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: dtype %s; only f32, bf16, f16", op,
                                  dt_dtype_name(dtype));
    int64_t block = dt_sumsq_block(n);
    int64_t nblocks = (n + block - 1) / block;
    sumsq_t a = {.x = x, .dtype = dtype, .n = n, .block = block};
    cpu_lock(d);
    cpu_pool_run(d->pool, nblocks, 1, sumsq_task, &a);
    cpu_unlock(d);
    double total = 0.0;
    for (int64_t i = 0; i < nblocks; i++)
        total += a.partial[i];
    *out = total;
    return DT_OK;
}

/* ------------------------------------------------------------------ scale */

typedef struct {
    float *x;
    float alpha;
} scale_t;

static void scale_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const scale_t *a = ctx;
    float *restrict x = a->x;
    float alpha = a->alpha;
    for (int64_t i = b; i < e; i++)
        x[i] *= alpha;
}

/* bf16: the f32 product, rounded. */
CPU_CLONES static void scale_bf16_task(void *ctx, int64_t b, int64_t e,
                                       int tid)
{
    const scale_t *a = ctx;
    uint16_t *restrict x = CPU_BF16(a->x);
    float alpha = a->alpha;
    for (int64_t i = b; i < e; i++)
        x[i] = dt_f32_to_bf16(dt_bf16_to_f32(x[i]) * alpha);
}

int cpu_scale(dt_device_t *d, dt_stream_t *s, void *x, int dtype, float alpha,
              int64_t n)
{
    static const char op[] = "scale";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_elems(d, op, dtype));
    CPU_DIM(d, op, n);
    CPU_PTR(d, op, x, n);
    scale_t a = {.x = x, .alpha = alpha};
    cpu_lock(d);
    cpu_pool_run(d->pool, n, CPU_GRAIN,
                 dtype == DT_BF16 ? scale_bf16_task : scale_task, &a);
    cpu_unlock(d);
    return DT_OK;
}
