/*
 * tests/support/toy_model.h - a three-unit model with a known loss, for
 * testing data-parallel strategies through their hooks exactly as the
 * core drives them, and its single-process float64 reference.
 *
 * Units (GPT-2-like, odd sizes, the head tied to unit 0):
 *   0 "embedding"  wte (7,5) + wpe (3,5)                        = 50
 *   1 "block.0"    ln_1.w (5) ln_1.b (5) attn.w (9,5) attn.b (9)
 *                  proj.w (5,3)                                 = 79
 *   2 "head"       ln_f.w (5) ln_f.b (5)                        = 10
 * Biases and norms are NO_DECAY.  139 parameters: no world size in 2..4
 * divides a unit or the whole.
 *
 * The loss of rank r on micro-batch m, over parameters p:
 *   L = sum_{u,i} (a(r,m,u,i) p_ui + C/2 p_ui^2)
 *     + sum_{i<35} (t(r,m,i) p_0i + C/2 p_0i^2)     (the head reads wte)
 * so each gradient element is a(..) + C p (+ t + C p for the tied part),
 * computed from the parameters the strategy hands out: a stale or wrong
 * gather changes the gradient and the loss, not only the update.  |a| and
 * |t| >= 0.02 with one sign per element across ranks and micro-steps, so
 * averages never cancel towards 0 (AdamW would turn a rounding residue
 * there into a full lr-sized step).
 */
#ifndef DT_TOY_MODEL_H
#define DT_TOY_MODEL_H

#include <stdint.h>

#include "dtrain/device.h"
#include "dtrain/strategy.h"

#define DT_TOY_NU 3
#define DT_TOY_NUMEL 139
#define DT_TOY_MAXN 80      /* largest unit, rounded up */
#define DT_TOY_TIED 35      /* wte: the head's tied part of unit 0 */
#define DT_TOY_C 0.01       /* the quadratic term */
#define DT_TOY_MAX_MICRO 4

/* Optimizer hyper-parameters the reference assumes (pass as init optim). */
dt_optim_desc_v1_t dt_toy_optim(int kind);

/* The model (units point at static tables; `param_dtype` f32 or bf16). */
dt_model_desc_v1_t dt_toy_model(int param_dtype);
const dt_unit_desc_v1_t *dt_toy_unit(uint32_t u);
int dt_toy_no_decay(uint32_t u, uint64_t i);

/* Initial parameter value of element i of unit u. */
float dt_toy_pval(uint32_t u, uint64_t i);
/* The sign every coefficient of unit u's element i has (+1 or -1). */
double dt_toy_sign(uint32_t u, uint64_t i);
/* The loss's coefficients: a for unit u's own term, t for the tie. */
double dt_toy_a(int rank, uint32_t micro, uint32_t u, uint64_t i);
double dt_toy_t(int rank, uint32_t micro, uint64_t i);

/* Where the buffers a strategy hands out live: its device and the
 * stream the core's kernels run on (the strategy's compute_stream).  The
 * host never dereferences them: it reads and writes them through the
 * device's copies on that stream (on the cpu device a memmove, on cuda a
 * cudaMemcpyAsync), so the same test body is right on every device. */
typedef struct dt_toy_dev {
    const dt_device_ops_v1_t *ops;
    dt_device_t *dev;
    dt_stream_t *stream;
} dt_toy_dev_t;

/* `bytes` of device memory `src` into host `dst` (D2H on the stream, then
 * stream_sync), and host `src` into device `dst` (H2D, stream_sync). */
int dt_toy_read(const dt_toy_dev_t *dd, void *dst, const void *src, uint64_t bytes);
int dt_toy_write(const dt_toy_dev_t *dd, void *dst, const void *src, uint64_t bytes);

/* One forward pass in the core's hook order (unit 0, the block, the head
 * with unit 0 re-entered inside it), computing this rank's loss from the
 * parameters handed out (param_dtype f32 or bf16), read through `dd`.
 * flags: DT_HOOK_*. */
int dt_toy_forward(dt_strategy_t *s, const dt_toy_dev_t *dd,
                   int param_dtype, int rank, uint32_t micro, uint32_t n_micro, uint32_t flags,
                   double *loss);
/* One backward pass in the core's order (head with unit 0 nested,
 * last_use 0; the block; unit 0, last_use 1), adding the loss's gradient
 * at the handed-out parameters into the handed-out gradient buffers
 * (read, added to and written back through `dd`). */
int dt_toy_backward(dt_strategy_t *s, const dt_toy_dev_t *dd,
                    int param_dtype, int rank, uint32_t micro, uint32_t n_micro);

/* The float64 reference: parameters and moments of every unit. */
typedef struct dt_toy_ref {
    double p[DT_TOY_NU][DT_TOY_MAXN];
    double m[DT_TOY_NU][DT_TOY_MAXN]; /* AdamW exp_avg, or SGD momentum */
    double v[DT_TOY_NU][DT_TOY_MAXN];
} dt_toy_ref_t;

void dt_toy_ref_init(dt_toy_ref_t *r);
/* One optimizer step of `size` ranks with n_micro micro-steps each: the
 * gradient is the mean over ranks of the sum over micro-steps, clipped to
 * global norm `clip` (<= 0: none), then AdamW or SGD (dt_toy_optim) at
 * step t.  loss[rank][micro] receives the losses before the update (may
 * be NULL).  Returns the gradient norm before clipping. */
double dt_toy_ref_step(dt_toy_ref_t *r, int optim_kind, int size, uint32_t n_micro, int t,
                       double lr, double clip, double (*loss)[DT_TOY_MAX_MICRO]);
/* The update half of dt_toy_ref_step for a given gradient `g`: clipped
 * to global norm `clip` (<= 0: none), then AdamW or SGD (dt_toy_optim,
 * per-element NO_DECAY) at step t.  Returns the norm before clipping. */
double dt_toy_ref_update(dt_toy_ref_t *r, int optim_kind, double g[DT_TOY_NU][DT_TOY_MAXN],
                         int t, double lr, double clip);

/* The ZeRO paper's model for planner checks (never allocated): 7.5e9
 * parameters as 32 units of one 234,375,000-element tensor, arch "paper"
 * (no tied unit), compute dtype `param_dtype`. */
dt_model_desc_v1_t dt_toy_paper_model(int param_dtype);
/* Planner arguments for model `m` on the paper's 64 ranks with its
 * mixed-precision Adam: 2 + 2 + 12 bytes per parameter. */
dt_estimate_args_v1_t dt_toy_paper_args(const dt_model_desc_v1_t *m);
/* Model state per rank of an estimate: params + grads + optimizer bytes. */
double dt_toy_model_state(const dt_estimate_v1_t *e);

#endif /* DT_TOY_MODEL_H */
