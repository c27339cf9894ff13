/*
 * sdk/lib/dt_optim_host.c - the optimizer updates as host loops over f32
 * arrays: AdamW and SGD with momentum, element by element, vectorised by
 * the compiler and chosen at run time for the machine (AVX-512, AVX2, or
 * the portable baseline: GCC's target_clones).
 *
 * These loops are THE arithmetic of both optimizers: the cpu device's
 * adamw_update / sgd_update kernels run them over their threads' chunks,
 * and a strategy whose state lives in an offload tier runs them on the
 * tier's memory (dt_optim_range_host).  AdamW's bias corrections are
 * folded into per-call scalars (dt_adamw_scalars), so an element costs
 * one division and one square root.  Each element is computed by the
 * same IEEE operations in the same order on every path (no reassociation,
 * no contraction into FMA: -ffp-contract=off on this file; sqrtf and the
 * divisions are correctly rounded in every vector width), so a run with
 * its state offloaded gives the bits of the same run without.
 */
#include <math.h>

#include "dtrain/sdk/optim.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                     \
    !defined(DT_OPTIM_NO_CLONES)
#define DT_OPTIM_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DT_OPTIM_CLONES
#endif

dt_adamw_hyper_t dt_adamw_hyper(const dt_optim_desc_v1_t *o, float lr, float wd,
                                float grad_scale, int64_t t)
{
    /* bias corrections once, in double: beta^t for large t underflows
     * gracefully to 0 and the correction to 1 */
    return (dt_adamw_hyper_t){.lr = lr, .beta1 = o->beta1, .beta2 = o->beta2, .eps = o->eps,
                              .wd = wd, .grad_scale = grad_scale,
                              .bc1 = (float)(1.0 - pow((double)o->beta1, (double)t)),
                              .bc2 = (float)(1.0 - pow((double)o->beta2, (double)t))};
}

dt_adamw_scalars_t dt_adamw_scalars(const dt_adamw_hyper_t *h)
{
    return (dt_adamw_scalars_t){.step = (float)((double)h->lr / (double)h->bc1),
                                .rsqrt_bc2 = (float)(1.0 / sqrt((double)h->bc2)),
                                .lr_wd = (float)((double)h->lr * (double)h->wd)};
}

/* The clones and their dispatcher are static: a target_clones function
 * with external linkage gets a dispatcher symbol that ignores the hidden
 * visibility, and would be exported from every plugin that links it. */
static DT_OPTIM_CLONES void adamw_loop(float *restrict p, const float *restrict grad,
                                       float *restrict m, float *restrict v, int64_t n,
                                       const dt_adamw_hyper_t *h)
{
    const float b1 = h->beta1, b2 = h->beta2, eps = h->eps, gs = h->grad_scale;
    dt_adamw_scalars_t k = dt_adamw_scalars(h);
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i] * gs;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) * k.rsqrt_bc2 + eps;
        p[i] -= k.step * mi / denom + k.lr_wd * p[i];
    }
}

static DT_OPTIM_CLONES void sgd_loop(float *restrict p, const float *restrict grad,
                                     float *restrict mom, int64_t n, float lr, float momentum,
                                     float wd, int nesterov, float gs)
{
    const float mu = momentum;
    if (!mom) { /* momentum 0 without a buffer: plain SGD */
        for (int64_t i = 0; i < n; i++)
            p[i] -= lr * (grad[i] * gs + wd * p[i]);
        return;
    }
    if (nesterov) {
        for (int64_t i = 0; i < n; i++) {
            float g = grad[i] * gs + wd * p[i];
            float mi = mu * mom[i] + g;
            mom[i] = mi;
            p[i] -= lr * (g + mu * mi);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            float g = grad[i] * gs + wd * p[i];
            float mi = mu * mom[i] + g;
            mom[i] = mi;
            p[i] -= lr * mi;
        }
    }
}

void dt_adamw_f32(float *p, const float *grad, float *m, float *v, int64_t n,
                  const dt_adamw_hyper_t *h)
{
    adamw_loop(p, grad, m, v, n, h);
}

void dt_sgd_f32(float *p, const float *grad, float *mom, int64_t n, float lr, float momentum,
                float wd, int nesterov, float grad_scale)
{
    sgd_loop(p, grad, mom, n, lr, momentum, wd, nesterov, grad_scale);
}
