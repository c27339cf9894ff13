/*
 * plugins/cpu/cpu_half.h - bit-exact conversions between f32 and the two
 * 16-bit float formats (bf16, f16), round to nearest even.
 *
 * Done with integer bit manipulation rather than F16C/AVX-512-BF16
 * instructions so the plugin runs on any x86-64 (and any other) CPU and
 * gives the same bits everywhere.  NaNs stay NaN (quiet, sign and top
 * payload bits kept); overflow rounds to infinity as IEEE says.
 */
#ifndef DT_CPU_HALF_H
#define DT_CPU_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t cpu_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float cpu_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float cpu_bf16_to_f32(uint16_t h)
{
    return cpu_bits_f32((uint32_t)h << 16);
}

static inline uint16_t cpu_f32_to_bf16(float f)
{
    uint32_t u = cpu_f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: truncating could give inf */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Adding 0x7FFF plus the kept LSB rounds ties to even; a carry out of
     * the mantissa bumps the exponent, which is the right answer (and gives
     * inf above the largest finite bf16). */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float cpu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu;
    uint32_t m = h & 0x3FFu;
    if (e == 0x1F) /* inf / NaN, payload kept */
        return cpu_bits_f32(sign | 0x7F800000u | (m << 13));
    if (e == 0) {
        if (m == 0)
            return cpu_bits_f32(sign);
        /* Subnormal f16 is a normal f32: shift the leading 1 into place. */
        uint32_t fe = 113; /* f32 biased exponent of 2^-14 */
        while (!(m & 0x400u)) {
            m <<= 1;
            fe--;
        }
        return cpu_bits_f32(sign | (fe << 23) | ((m & 0x3FFu) << 13));
    }
    return cpu_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

static inline uint16_t cpu_f32_to_f16(float f)
{
    uint32_t u = cpu_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t ax = u & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) { /* inf or NaN */
        if (ax > 0x7F800000u)
            return (uint16_t)(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
        return (uint16_t)(sign | 0x7C00u);
    }
    if (ax >= 0x477FF000u) /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7C00u);
    if (ax < 0x38800000u) { /* below 2^-14: f16 subnormal or zero */
        if (ax < 0x33000000u) /* below 2^-25 (2^-25 itself ties to 0) */
            return (uint16_t)sign;
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126 - e; /* value / 2^-24 = m * 2^(e-126) */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t h = (ax - 0x38000000u) >> 13; /* rebias 127 -> 15 */
    uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

#endif /* DT_CPU_HALF_H */
