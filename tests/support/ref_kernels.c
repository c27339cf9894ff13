/*
 * tests/support/ref_kernels.c - double-precision reference kernels (see
 * ref_kernels.h).  Written for reading, not speed: direct loops, the
 * Jacobian spelled out where the fast kernels use a simplified form.
 */
#include "ref_kernels.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------- helpers */

void dt_ref_rng_seed(dt_ref_rng_t *r, uint64_t seed) { r->s = seed; }

uint64_t dt_ref_rng_u64(dt_ref_rng_t *r) /* splitmix64 */
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double dt_ref_rng_uniform(dt_ref_rng_t *r, double lo, double hi)
{
    double u = (double)(dt_ref_rng_u64(r) >> 11) * 0x1.0p-53;
    return lo + (hi - lo) * u;
}

void dt_ref_fill_uniform(dt_ref_rng_t *r, float *x, int64_t n, double lo,
                         double hi)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)dt_ref_rng_uniform(r, lo, hi);
}

void dt_ref_fill_int(dt_ref_rng_t *r, int32_t *x, int64_t n, int32_t hi)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (int32_t)(dt_ref_rng_u64(r) % (uint64_t)hi);
}

void dt_ref_f2d(double *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = src[i];
}

void dt_ref_d2f(float *dst, const double *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)src[i];
}

static int64_t check_impl(const char *what, const float *gotf,
                          const double *gotd, const double *want, int64_t n,
                          double rtol, double atol)
{
    int64_t bad = 0, worst = -1;
    double worst_ratio = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double g = gotf ? (double)gotf[i] : gotd[i];
        double err = fabs(g - want[i]);
        double tol = atol + rtol * fabs(want[i]);
        if (!(err <= tol)) { /* also catches NaN */
            bad++;
            double ratio = isnan(err) ? INFINITY : err / tol;
            if (worst < 0 || ratio > worst_ratio) {
                worst = i;
                worst_ratio = ratio;
            }
        }
    }
    if (bad)
        fprintf(stderr,
                "%s: %lld of %lld elements out of tolerance (rtol %g, atol %g);"
                " worst [%lld]: got %.9g, want %.9g (%.3gx the tolerance)\n",
                what, (long long)bad, (long long)n, rtol, atol,
                (long long)worst, gotf ? (double)gotf[worst] : gotd[worst],
                want[worst], worst_ratio);
    return bad;
}

int64_t dt_ref_check(const char *what, const float *got, const double *want,
                     int64_t n, double rtol, double atol)
{
    return check_impl(what, got, NULL, want, n, rtol, atol);
}

int64_t dt_ref_check_d(const char *what, const double *got,
                       const double *want, int64_t n, double rtol, double atol)
{
    return check_impl(what, NULL, got, want, n, rtol, atol);
}

/* -------------------------------------------------------------- matmul */

void dt_ref_matmul_forward(double *out, const double *inp, const double *w,
                           const double *bias, int64_t N, int64_t C,
                           int64_t OC)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int64_t c = 0; c < C; c++)
                s += inp[n * C + c] * w[o * C + c];
            out[n * OC + o] = s;
        }
}

void dt_ref_matmul_backward(double *dinp, double *dw, double *dbias,
                            const double *dout, const double *inp,
                            const double *w, int64_t N, int64_t C, int64_t OC)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++) {
            double g = dout[n * OC + o];
            if (dbias)
                dbias[o] += g;
            for (int64_t c = 0; c < C; c++) {
                if (dinp)
                    dinp[n * C + c] += g * w[o * C + c];
                if (dw)
                    dw[o * C + c] += g * inp[n * C + c];
            }
        }
}

/* ----------------------------------------------------------- embedding */

void dt_ref_embedding_forward(double *out, const int32_t *tokens,
                              const double *wte, const double *wpe, int64_t B,
                              int64_t T, int64_t C)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++)
                out[(b * T + t) * C + c] =
                    wte[(int64_t)tokens[b * T + t] * C + c] + wpe[t * C + c];
}

void dt_ref_embedding_backward(double *dwte, double *dwpe, const double *dout,
                               const int32_t *tokens, int64_t B, int64_t T,
                               int64_t C)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t c = 0; c < C; c++) {
                double g = dout[(b * T + t) * C + c];
                if (dwte)
                    dwte[(int64_t)tokens[b * T + t] * C + c] += g;
                if (dwpe)
                    dwpe[t * C + c] += g;
            }
}

/* ----------------------------------------------------------- layernorm */

void dt_ref_layernorm_forward(double *out, double *mean, double *rstd,
                              const double *inp, const double *w,
                              const double *b, int64_t N, int64_t C)
{
    for (int64_t n = 0; n < N; n++) {
        const double *x = inp + n * C;
        double mu = 0.0, var = 0.0;
        for (int64_t c = 0; c < C; c++)
            mu += x[c];
        mu /= (double)C;
        for (int64_t c = 0; c < C; c++)
            var += (x[c] - mu) * (x[c] - mu);
        var /= (double)C;
        double rs = 1.0 / sqrt(var + 1e-5);
        for (int64_t c = 0; c < C; c++)
            out[n * C + c] = (x[c] - mu) * rs * w[c] + b[c];
        mean[n] = mu;
        rstd[n] = rs;
    }
}

/* With norm_j = (x_j - mean) * rstd:
 *   d norm_j / d x_i = rstd (delta_ij - 1/C) - norm_j norm_i rstd / C
 * (d rstd / d x_i = -rstd^2 norm_i / C), applied as a full C x C matrix. */
void dt_ref_layernorm_backward(double *dinp, double *dw, double *db,
                               const double *dout, const double *inp,
                               const double *w, const double *mean,
                               const double *rstd, int64_t N, int64_t C)
{
    for (int64_t n = 0; n < N; n++) {
        const double *x = inp + n * C;
        const double *g = dout + n * C;
        double rs = rstd[n];
        for (int64_t j = 0; j < C; j++) {
            double nj = (x[j] - mean[n]) * rs;
            if (db)
                db[j] += g[j];
            if (dw)
                dw[j] += g[j] * nj;
        }
        if (!dinp)
            continue;
        for (int64_t i = 0; i < C; i++) {
            double ni = (x[i] - mean[n]) * rs;
            double s = 0.0;
            for (int64_t j = 0; j < C; j++) {
                double nj = (x[j] - mean[n]) * rs;
                double jac = rs * ((i == j ? 1.0 : 0.0) - 1.0 / (double)C) -
                             nj * ni * rs / (double)C;
                s += g[j] * w[j] * jac;
            }
            dinp[n * C + i] += s;
        }
    }
}

/* ---------------------------------------------------------------- GELU */

#define REF_GELU_S 0.79788456080286535588 /* sqrt(2/pi) */
#define REF_GELU_K 0.044715

void dt_ref_gelu_forward(double *out, const double *inp, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double x = inp[i];
        out[i] = 0.5 * x * (1.0 + tanh(REF_GELU_S * (x + REF_GELU_K * x * x * x)));
    }
}

void dt_ref_gelu_backward(double *dinp, const double *inp, const double *dout,
                          int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        double x = inp[i];
        double u = REF_GELU_S * (x + REF_GELU_K * x * x * x);
        double sech = 1.0 / cosh(u);
        double d = 0.5 * (1.0 + tanh(u)) +
                   0.5 * x * sech * sech * REF_GELU_S * (1.0 + 3.0 * REF_GELU_K * x * x);
        dinp[i] += d * dout[i];
    }
}

/* ----------------------------------------------------------- attention */

void dt_ref_attention_forward(double *out, double *att, const double *qkv,
                              int64_t B, int64_t T, int64_t C, int64_t NH)
{
    int64_t hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t t = 0; t < T; t++) {
                const double *q = qkv + (b * T + t) * 3 * C + h * hs;
                double *row = att + ((b * NH + h) * T + t) * T;
                double mx = -INFINITY;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const double *k = qkv + (b * T + t2) * 3 * C + C + h * hs;
                    double s = 0.0;
                    for (int64_t i = 0; i < hs; i++)
                        s += q[i] * k[i];
                    row[t2] = s * scale;
                    if (row[t2] > mx)
                        mx = row[t2];
                }
                double sum = 0.0;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    row[t2] = exp(row[t2] - mx);
                    sum += row[t2];
                }
                for (int64_t t2 = 0; t2 < T; t2++)
                    row[t2] = t2 <= t ? row[t2] / sum : 0.0;
                double *o = out + (b * T + t) * C + h * hs;
                for (int64_t i = 0; i < hs; i++) {
                    double s = 0.0;
                    for (int64_t t2 = 0; t2 <= t; t2++)
                        s += row[t2] * qkv[(b * T + t2) * 3 * C + 2 * C + h * hs + i];
                    o[i] = s;
                }
            }
}

/* Softmax Jacobian spelled out: d att[t2] / d pre[t3] = att[t2] (delta -
 * att[t3]). */
void dt_ref_attention_backward(double *dqkv, const double *dout,
                               const double *qkv, const double *att,
                               int64_t B, int64_t T, int64_t C, int64_t NH)
{
    int64_t hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t t = 0; t < T; t++) {
                const double *row = att + ((b * NH + h) * T + t) * T;
                const double *g = dout + (b * T + t) * C + h * hs;
                const double *q = qkv + (b * T + t) * 3 * C + h * hs;
                double *dq = dqkv + (b * T + t) * 3 * C + h * hs;
                for (int64_t t3 = 0; t3 <= t; t3++) {
                    double dpre = 0.0;
                    for (int64_t t2 = 0; t2 <= t; t2++) {
                        const double *v = qkv + (b * T + t2) * 3 * C + 2 * C + h * hs;
                        double datt = 0.0;
                        for (int64_t i = 0; i < hs; i++)
                            datt += g[i] * v[i];
                        dpre += datt * row[t2] * ((t2 == t3 ? 1.0 : 0.0) - row[t3]);
                    }
                    const double *k = qkv + (b * T + t3) * 3 * C + C + h * hs;
                    double *dk = dqkv + (b * T + t3) * 3 * C + C + h * hs;
                    double *dv = dqkv + (b * T + t3) * 3 * C + 2 * C + h * hs;
                    for (int64_t i = 0; i < hs; i++) {
                        dq[i] += dpre * scale * k[i];
                        dk[i] += dpre * scale * q[i];
                        dv[i] += row[t3] * g[i];
                    }
                }
            }
}

/* ------------------------------------------------ softmax cross-entropy */

void dt_ref_softmax_xent_forward(double *losses, double *probs,
                                 const double *logits, const int32_t *targets,
                                 int64_t N, int64_t V)
{
    for (int64_t n = 0; n < N; n++) {
        const double *x = logits + n * V;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t v = 0; v < V; v++)
            if (x[v] > mx)
                mx = x[v];
        for (int64_t v = 0; v < V; v++)
            sum += exp(x[v] - mx);
        for (int64_t v = 0; v < V; v++)
            probs[n * V + v] = exp(x[v] - mx) / sum;
        losses[n] = -log(probs[n * V + targets[n]]);
    }
}

void dt_ref_softmax_xent_backward(double *dlogits, const double *probs,
                                  const int32_t *targets, double dloss,
                                  int64_t N, int64_t V)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t v = 0; v < V; v++)
            dlogits[n * V + v] +=
                dloss * (probs[n * V + v] - (v == targets[n] ? 1.0 : 0.0));
}

/* ----------------------------------------------------------- optimizers */

void dt_ref_adamw_update(double *param, const double *grad, double *m,
                         double *v, int64_t n, double lr, double beta1,
                         double beta2, double eps, double wd,
                         double grad_scale, int64_t t)
{
    for (int64_t i = 0; i < n; i++) {
        double g = grad[i] * grad_scale;
        m[i] = beta1 * m[i] + (1.0 - beta1) * g;
        v[i] = beta2 * v[i] + (1.0 - beta2) * g * g;
        double mhat = m[i] / (1.0 - pow(beta1, (double)t));
        double vhat = v[i] / (1.0 - pow(beta2, (double)t));
        param[i] -= lr * (mhat / (sqrt(vhat) + eps) + wd * param[i]);
    }
}

void dt_ref_sgd_update(double *param, const double *grad, double *mom,
                       int64_t n, double lr, double momentum, double wd,
                       int nesterov, double grad_scale)
{
    for (int64_t i = 0; i < n; i++) {
        double g = grad[i] * grad_scale + wd * param[i];
        double mo = momentum * (mom ? mom[i] : 0.0) + g;
        if (mom)
            mom[i] = mo;
        param[i] -= lr * (nesterov ? g + momentum * mo : mo);
    }
}

/* ------------------------------------------------------- 16-bit floats */

/* x rounded to a float format with `bits` significant bits and smallest
 * normal exponent `emin` (value 2^emin), ties to even (the default
 * rounding mode of nearbyint).  Overflow is the caller's check. */
static double round_to_format(double x, int bits, int emin)
{
    if (x == 0.0 || !isfinite(x))
        return x;
    int k;
    frexp(x, &k); /* |x| = f 2^k, f in [0.5, 1): leading bit is 2^(k-1) */
    int lead = k - 1 < emin ? emin : k - 1;
    double q = ldexp(1.0, lead - (bits - 1)); /* one unit in the last place */
    return nearbyint(x / q) * q;
}

uint16_t dt_ref_f32_to_bf16(float x)
{
    uint32_t u;
    if (isnan(x)) {
        memcpy(&u, &x, sizeof u);
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7FC0u);
    }
    double r = round_to_format((double)x, 8, -126);
    if (fabs(r) > 0x1.FEp127) /* past the largest finite bf16 */
        r = copysign(INFINITY, r);
    float f = (float)r; /* exact: every bf16 value is a float */
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

uint16_t dt_ref_f32_to_f16(float x)
{
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    if (isnan(x))
        return (uint16_t)(sign | 0x7E00u);
    double r = fabs(round_to_format((double)x, 11, -14));
    if (r > 65504.0 || isinf(r))
        return (uint16_t)(sign | 0x7C00u);
    if (r == 0.0)
        return sign;
    if (r < 0x1.0p-14) /* subnormal: r / 2^-24 is the mantissa */
        return (uint16_t)(sign | (uint16_t)(r * 0x1.0p24));
    int k;
    double f = frexp(r, &k); /* r = (2f) 2^(k-1), 2f in [1, 2) */
    uint16_t e = (uint16_t)(k - 1 + 15);
    uint16_t m = (uint16_t)((2.0 * f - 1.0) * 1024.0);
    return (uint16_t)(sign | (e << 10) | m);
}

static double decode16(uint16_t h, int ebits, int mbits)
{
    int bias = (1 << (ebits - 1)) - 1;
    int e = (h >> mbits) & ((1 << ebits) - 1);
    int m = h & ((1 << mbits) - 1);
    double s = (h & 0x8000u) ? -1.0 : 1.0;
    if (e == (1 << ebits) - 1)
        return m ? NAN : s * INFINITY;
    if (e == 0)
        return s * ldexp((double)m, 1 - bias - mbits);
    return s * ldexp(1.0 + ldexp((double)m, -mbits), e - bias);
}

double dt_ref_bf16_to_double(uint16_t h) { return decode16(h, 8, 7); }
double dt_ref_f16_to_double(uint16_t h) { return decode16(h, 5, 10); }
