/*
 * tests/support/ref_kernels.h - slow, obviously-correct reference kernels
 * in double precision, for checking every device backend's kernels.
 *
 * Each mirrors a kernel of dtrain/device.h with the same argument order
 * and shapes, but on double arrays, with the most direct formula rather
 * than the fastest (layernorm and softmax backward use the full Jacobian).
 * Backward functions ACCUMULATE (+=) into gradients like the real ones.
 * The test suite checks these against central finite differences of the
 * forward functions, so a test may trust them.
 *
 * Also here: bit-exact reference conversions for bf16/f16 (computed with
 * frexp/nearbyint, not bit tricks), a seeded RNG, and a tolerance check
 * that prints the worst mismatches.
 */
#ifndef DT_REF_KERNELS_H
#define DT_REF_KERNELS_H

#include <stdint.h>

/* ---- helpers ---- */
typedef struct dt_ref_rng {
    uint64_t s;
} dt_ref_rng_t;

void dt_ref_rng_seed(dt_ref_rng_t *r, uint64_t seed);
uint64_t dt_ref_rng_u64(dt_ref_rng_t *r);
/* Uniform in [lo, hi). */
double dt_ref_rng_uniform(dt_ref_rng_t *r, double lo, double hi);
void dt_ref_fill_uniform(dt_ref_rng_t *r, float *x, int64_t n, double lo,
                         double hi);
/* Uniform integers in [0, hi). */
void dt_ref_fill_int(dt_ref_rng_t *r, int32_t *x, int64_t n, int32_t hi);

void dt_ref_f2d(double *dst, const float *src, int64_t n);
void dt_ref_d2f(float *dst, const double *src, int64_t n);

/* Number of i with !(|got[i] - want[i]| <= atol + rtol * |want[i]|) (NaN in
 * either fails); prints `what`, the count and the worst element to stderr
 * when non-zero. */
int64_t dt_ref_check(const char *what, const float *got, const double *want,
                     int64_t n, double rtol, double atol);
/* The same for two double arrays (finite differences vs. analytic). */
int64_t dt_ref_check_d(const char *what, const double *got,
                       const double *want, int64_t n, double rtol,
                       double atol);

/* ---- kernels (shapes as in dtrain/device.h) ---- */

/* out (N, OC) = inp (N, C) @ w (OC, C)^T + bias (OC, may be NULL). */
void dt_ref_matmul_forward(double *out, const double *inp, const double *w,
                           const double *bias, int64_t N, int64_t C,
                           int64_t OC);
/* dinp += dout @ w; dw += dout^T @ inp; dbias += sum_n dout.  Any output
 * may be NULL. */
void dt_ref_matmul_backward(double *dinp, double *dw, double *dbias,
                            const double *dout, const double *inp,
                            const double *w, int64_t N, int64_t C, int64_t OC);

void dt_ref_embedding_forward(double *out, const int32_t *tokens,
                              const double *wte, const double *wpe, int64_t B,
                              int64_t T, int64_t C);
void dt_ref_embedding_backward(double *dwte, double *dwpe, const double *dout,
                               const int32_t *tokens, int64_t B, int64_t T,
                               int64_t C);

/* eps 1e-5, biased variance. mean, rstd (N) written. */
void dt_ref_layernorm_forward(double *out, double *mean, double *rstd,
                              const double *inp, const double *w,
                              const double *b, int64_t N, int64_t C);
void dt_ref_layernorm_backward(double *dinp, double *dw, double *db,
                               const double *dout, const double *inp,
                               const double *w, const double *mean,
                               const double *rstd, int64_t N, int64_t C);

/* GELU, tanh approximation. */
void dt_ref_gelu_forward(double *out, const double *inp, int64_t n);
void dt_ref_gelu_backward(double *dinp, const double *inp, const double *dout,
                          int64_t n);

/* qkv (B, T, 3C); out (B, T, C); att (B, NH, T, T), zero above the
 * diagonal. */
void dt_ref_attention_forward(double *out, double *att, const double *qkv,
                              int64_t B, int64_t T, int64_t C, int64_t NH);
void dt_ref_attention_backward(double *dqkv, const double *dout,
                               const double *qkv, const double *att,
                               int64_t B, int64_t T, int64_t C, int64_t NH);

/* losses (N), probs (N, V). */
void dt_ref_softmax_xent_forward(double *losses, double *probs,
                                 const double *logits, const int32_t *targets,
                                 int64_t N, int64_t V);
void dt_ref_softmax_xent_backward(double *dlogits, const double *probs,
                                  const int32_t *targets, double dloss,
                                  int64_t N, int64_t V);

/* One optimizer step, formulas of dtrain/device.h. */
void dt_ref_adamw_update(double *param, const double *grad, double *m,
                         double *v, int64_t n, double lr, double beta1,
                         double beta2, double eps, double wd,
                         double grad_scale, int64_t t);
void dt_ref_sgd_update(double *param, const double *grad, double *mom,
                       int64_t n, double lr, double momentum, double wd,
                       int nesterov, double grad_scale);

/* ---- 16-bit floats ---- */
/* Round to nearest even; NaN gives some NaN of the same sign. */
uint16_t dt_ref_f32_to_bf16(float x);
uint16_t dt_ref_f32_to_f16(float x);
/* Exact. */
double dt_ref_bf16_to_double(uint16_t h);
double dt_ref_f16_to_double(uint16_t h);

#endif /* DT_REF_KERNELS_H */
