/*
 * plugins/cpu/cpu_bf16.h - bf16 activations on the cpu: stored in bf16,
 * computed in f32.  A load widens exactly (the bf16 is the top half of an
 * f32), a store rounds to nearest even (dtrain/half.h's bit rules, the
 * cuda device's and the cast kernel's), so a kernel run on bf16 storage
 * computes what its f32 twin computes on the widened inputs, rounded once
 * per stored result.  An accumulating output (a gradient += ...) is widened,
 * added to in f32 and rounded once per call, never once per term.
 *
 * The loops below are straight-line integer and float code (a shift to
 * widen; an add, a shift and a NaN select to round), so the vectoriser
 * turns each into a few vector instructions per eight elements; they are
 * static inline so every CPU_CLONES caller gets them in its own clone.
 */
#ifndef DT_CPU_BF16_H
#define DT_CPU_BF16_H

#include <stdint.h>

#include "dtrain/half.h"

/* bf16 elements of a buffer the kernel's signature types as float or
 * void (bf16 runs reuse the f32 runs' argument structs). */
#define CPU_BF16(p) ((uint16_t *)(void *)(p))
#define CPU_CBF16(p) ((const uint16_t *)(const void *)(p))

/* dst[i] = src[i], widened (exact). */
static inline void cpu_bf16_widen(float *restrict dst,
                                  const uint16_t *restrict src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt_bf16_to_f32(src[i]);
}

/* dst[i] = src[i], rounded to nearest even. */
static inline void cpu_bf16_round(uint16_t *restrict dst,
                                  const float *restrict src, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt_f32_to_bf16(src[i]);
}

/* The same for `rows` rows of `cols` elements, the source and destination
 * `sld` and `dld` elements apart (a column slice of a row-major matrix). */
static inline void cpu_bf16_widen_rows(float *restrict dst, int64_t dld,
                                       const uint16_t *restrict src,
                                       int64_t sld, int64_t rows,
                                       int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        cpu_bf16_widen(dst + r * dld, src + r * sld, cols);
}

static inline void cpu_bf16_round_rows(uint16_t *restrict dst, int64_t dld,
                                       const float *restrict src, int64_t sld,
                                       int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++)
        cpu_bf16_round(dst + r * dld, src + r * sld, cols);
}

/* Per-thread slices of the device scratch start on 64-byte boundaries:
 * n floats rounded up to a multiple of 16. */
static inline int64_t cpu_pad16(int64_t n) { return (n + 15) & ~(int64_t)15; }

#endif /* DT_CPU_BF16_H */
