/*
 * dtrain/sdk/optim.h - the optimizer driven over a range of a unit's flat
 * space: AdamW or SGD, tensor by tensor, so weight decay follows each
 * tensor's flags even where a shard cuts a tensor in two, on the device
 * (its kernels) or on host memory (an offload tier's); the host loops
 * that are both optimizers' arithmetic; and the gradient-clipping
 * coefficient.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Part of the SDK helper library (dtrain/sdk_helpers.h says how to link
 * it and the conventions every helper follows).
 */
#ifndef DTRAIN_SDK_OPTIM_H
#define DTRAIN_SDK_OPTIM_H

#include <stdint.h>

#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/strategy.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif


/* PyTorch's clip_grad_norm_ coefficient: min(1, clip / (norm + 1e-6)) when
 * clip > 0, else 1.  Computed in double, returned as the optimizer kernels'
 * grad_scale. */
float dt_clip_scale(double norm, float clip);

typedef struct dt_optim_step {
    const dt_optim_desc_v1_t *desc; /* kind and hyper-parameters */
    float lr;
    float grad_scale;   /* multiplies every gradient (clip coefficient) */
    int64_t t;          /* 1-based step (AdamW bias correction), >= 1 */
} dt_optim_step_t;

/* Update elements `r` of `unit`'s flat space, enqueued on stream `s`.
 * Buffers hold ONLY the range: param[0] is element r.offset (for a replica
 * pass unit pointer + r.offset).  param, grad, m: (r.count) f32; v:
 * (r.count) f32 for AdamW, ignored (may be NULL) for SGD, whose momentum is
 * `m`.  Each tensor piece gets weight decay desc->weight_decay, or 0 when
 * the tensor has DT_PARAM_NO_DECAY; neighbouring pieces with the same decay
 * go to the device in one call.  DT_ERR_INVALID when r is outside the
 * unit, the kind is unknown, or a needed buffer is NULL. */
int dt_optim_range(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s,
                   const dt_unit_desc_v1_t *unit, dt_range_t r, float *param,
                   const float *grad, float *m, float *v,
                   const dt_optim_step_t *st);

/* The same update on HOST memory, at once (no device, no stream): param,
 * grad, m, v as above, f32, readable and writable by this thread (an
 * offload tier's host_ptr, pinned staging).  Each element gets exactly the
 * device path's arithmetic on the cpu device (dt_adamw_f32 / dt_sgd_f32
 * are its kernels' loops). */
int dt_optim_range_host(const dt_host_v1_t *host, const dt_unit_desc_v1_t *unit, dt_range_t r,
                        float *param, const float *grad, float *m, float *v,
                        const dt_optim_step_t *st);

/* AdamW's per-call constants: learning rate, betas, eps, the decay of this
 * run of tensors, the gradient scale, and the bias corrections
 * 1 - beta^t, each computed in double and rounded once. */
typedef struct dt_adamw_hyper {
    float lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2;
} dt_adamw_hyper_t;
dt_adamw_hyper_t dt_adamw_hyper(const dt_optim_desc_v1_t *o, float lr, float wd,
                                float grad_scale, int64_t t);

/* The per-call scalars the loop multiplies by, so that an element costs
 * one division and one square root (PyTorch's fused AdamW does the same):
 * step = lr / bc1, rsqrt_bc2 = 1 / sqrt(bc2), lr_wd = lr * wd, each
 * computed in double and rounded once.  A device computing AdamW itself
 * (cuda) takes these to give the loop's formula. */
typedef struct dt_adamw_scalars {
    float step, rsqrt_bc2, lr_wd;
} dt_adamw_scalars_t;
dt_adamw_scalars_t dt_adamw_scalars(const dt_adamw_hyper_t *h);

/* The loops (device.h's adamw_update / sgd_update formulas), n f32
 * elements, arrays not overlapping; the widest vector code the machine
 * runs is chosen when the plugin is loaded.  mom may be NULL for SGD
 * without momentum. */
void dt_adamw_f32(float *p, const float *grad, float *m, float *v, int64_t n,
                  const dt_adamw_hyper_t *h);
void dt_sgd_f32(float *p, const float *grad, float *mom, int64_t n, float lr, float momentum,
                float wd, int nesterov, float grad_scale);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_OPTIM_H */
