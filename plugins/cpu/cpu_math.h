/*
 * plugins/cpu/cpu_math.h - an expf the compiler can vectorise, and lane-
 * split max/sum reductions.
 *
 * libm's expf and tanhf are calls the auto-vectoriser cannot inline, and
 * they dominated GELU (about 18 ns per element) and the softmaxes.  This
 * expf is straight-line float code (SSE2 is enough), so the loops around
 * it vectorise.
 *
 *   exp(x) = 2^n exp(r),  n = round(x / ln 2),  r = x - n ln 2, |r| <= 0.35
 *
 * ln 2 is split in two (Cody and Waite) so n * LN2_HI is exact, and
 * exp(r) is the Taylor series to r^7 (truncation 0.35^8 / 8! ~ 0.1 ulp).
 * x is clamped to [-104, 89], where exp is already 0 or inf in f32, and
 * 2^n is applied as two exact power-of-two factors (n in [-150, 128] does
 * not fit one float exponent), so underflow (gradual, through the
 * subnormals) and overflow to inf come out of the last multiply and NaN
 * passes through the arithmetic: the only selects are the two clamps.
 * Measured against double exp over every 7th float: at most 1.2 ulp.
 */
#ifndef DT_CPU_MATH_H
#define DT_CPU_MATH_H

#include <math.h>
#include <stdint.h>

#include "dtrain/half.h"

static inline float cpu_expf(float x)
{
    float xc = x < -104.0f ? -104.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    /* Adding 1.5 * 2^23 rounds to an integer (the float's ulp is 1 there)
     * and leaves that integer in the low mantissa bits. */
    float t = xc * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    /* n as an integer, in unsigned arithmetic (for NaN x it is garbage,
     * wraps harmlessly, and only scales a NaN) */
    uint32_t nu = dt_f32_bits(t) - 0x4B400000u;
    float r = xc - n * 0.693359375f;      /* LN2_HI: 9 bits, n * it is exact */
    r = r - n * -2.12194440054690583e-4f; /* LN2_LO = ln 2 - LN2_HI */
    /* Taylor to r^7 by Estrin's scheme: a shallow dependency tree instead
     * of Horner's chain of eight, so independent elements overlap. */
    float r2 = r * r;
    float r4 = r2 * r2;
    float p01 = 1.0f + r;
    float p23 = 0.5f + r * (1.0f / 6.0f);
    float p45 = 1.0f / 24.0f + r * (1.0f / 120.0f);
    float p67 = 1.0f / 720.0f + r * (1.0f / 5040.0f);
    float p = (p01 + r2 * p23) + r4 * (p45 + r2 * p67);
    /* 2^n = 2^h 2^(n-h) with h = (n + 128) / 2 - 64, both in [-75, 64];
     * hu = h + 64, and a float 2^k has bits (k + 127) << 23. */
    uint32_t hu = (nu + 128u) >> 1;
    float s1 = dt_bits_f32((hu + 63u) << 23);
    float s2 = dt_bits_f32((nu - hu + 191u) << 23);
    return (p * s1) * s2;
}

/* max of x[0..n) (-inf for n == 0) and sum of x[0..n) in double, each in
 * eight interleaved lanes: a single running max or sum is a chain of
 * dependent operations (a few cycles each) that the vectoriser may not
 * reorder; eight lanes are a fixed order, so results stay reproducible. */
static inline float cpu_max_f32(const float *restrict x, int64_t n)
{
    float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                  -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (int j = 0; i < n; i++, j++)
        m[j] = x[i] > m[j] ? x[i] : m[j];
    for (int j = 1; j < 8; j++)
        m[0] = m[j] > m[0] ? m[j] : m[0];
    return m[0];
}

static inline double cpu_sum_f32(const float *restrict x, int64_t n)
{
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += (double)x[i + j];
    for (int j = 0; i < n; i++, j++)
        s[j] += (double)x[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* sum of a[i] b[i] in f32, eight lanes (see above). */
static inline float cpu_dot_f32(const float *restrict a,
                                const float *restrict b, int64_t n)
{
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++)
        s[j] += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* sum of (x[i] - mu)^2 in double, eight lanes. */
static inline double cpu_sumsqdev_f32(const float *restrict x, double mu,
                                      int64_t n)
{
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            double d = (double)x[i + j] - mu;
            s[j] += d * d;
        }
    for (int j = 0; i < n; i++, j++) {
        double d = (double)x[i] - mu;
        s[j] += d * d;
    }
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

#endif /* DT_CPU_MATH_H */
