/*
 * dtrain/half.h - bit-exact conversions between f32 and the two 16-bit
 * float formats (bf16, f16), round to nearest even, for any plugin that
 * stores, reduces or casts them (the cpu device, the shm communicator).
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Done with integer bit manipulation rather than F16C/AVX-512-BF16
 * instructions so plugins run on any x86-64 (and any other) CPU and give
 * the same bits everywhere; branch-free so conversion loops vectorise.  NaNs stay NaN (quiet, sign and top
 * payload bits kept); overflow rounds to infinity as IEEE says.
 */
#ifndef DTRAIN_HALF_H
#define DTRAIN_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t dt_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float dt_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float dt_bf16_to_f32(uint16_t h)
{
    return dt_bits_f32((uint32_t)h << 16);
}

static inline uint16_t dt_f32_to_bf16(float f)
{
    uint32_t u = dt_f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: truncating could give inf */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Adding 0x7FFF plus the kept LSB rounds ties to even; a carry out of
     * the mantissa bumps the exponent, which is the right answer (and gives
     * inf above the largest finite bf16). */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Branch-free (selects only) so cast and sumsq loops vectorise. */
static inline float dt_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu;
    uint32_t m = h & 0x3FFu;
    uint32_t normal = sign | ((e + 112) << 23) | (m << 13); /* rebias 15->127 */
    uint32_t infnan = sign | 0x7F800000u | (m << 13);       /* payload kept */
    /* subnormal (and zero): m * 2^-24, exact in f32 */
    uint32_t sub = dt_f32_bits((float)m * 0x1p-24f) | sign;
    uint32_t u = e == 0x1Fu ? infnan : normal;
    return dt_bits_f32(e == 0 ? sub : u);
}

static inline uint16_t dt_f32_to_f16(float f)
{
    uint32_t u = dt_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t ax = u & 0x7FFFFFFFu;
    /* normal range: rebias 127 -> 15, round the 13 dropped bits to nearest
     * even (a carry into the exponent is the right answer) */
    uint32_t hn = (ax - 0x38000000u) >> 13;
    uint32_t rem = ax & 0x1FFFu;
    hn += (uint32_t)(rem > 0x1000u) | ((uint32_t)(rem == 0x1000u) & hn & 1u);
    /* below 2^-14: the f16 is a multiple of 2^-24, and |f| + 0.5 rounds |f|
     * to a multiple of 2^-24 (the ulp of [0.5, 1)) to nearest even; the
     * count of those units is the f16's bits (0x400 if it rounds up to the
     * smallest normal) */
    uint32_t hs = dt_f32_bits(dt_bits_f32(ax) + 0.5f) - 0x3F000000u;
    uint32_t hh = ax < 0x38800000u ? hs : hn;
    hh = ax >= 0x477FF000u ? 0x7C00u : hh; /* >= 65520 rounds to inf */
    uint32_t nan = 0x7E00u | ((ax >> 13) & 0x3FFu); /* quiet, payload top */
    hh = ax > 0x7F800000u ? nan : hh;
    return (uint16_t)(sign | hh);
}

#endif /* DTRAIN_HALF_H */
