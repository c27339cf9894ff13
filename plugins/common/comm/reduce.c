/*
 * plugins/common/comm/reduce.c - elementwise reduction kernels the host-memory
 * communicators share (shm reduces shared-memory slots with them, tcp the
 * blocks its ring receives).
 *
 * Every output element is op(src[0][i], src[1][i], ..., src[n-1][i]) taken
 * in that (rank) order, so any rank computing it gets the same bits.
 * bf16 and f16 are widened to f32, reduced in f32 and rounded once to
 * nearest-even at the end (not after every addition: rounding n-1 times
 * would lose precision with the group size).  Work goes in blocks of BLK
 * elements through an f32 (f64) accumulator on the stack, which keeps the
 * block in L1 and lets dst alias any source.
 *
 * Speed: the module targets baseline x86-64 (SSE2), where the reduction,
 * not memory, was the slowest part of an in-cache all_reduce (a 2 MiB half
 * of a 4 MiB f32 sum took ~200 us, twice a memcpy of the same bytes).  So
 * the kernels get an AVX2 clone picked at load time, and the common case -
 * f32, two sources (every two-rank all_reduce) - has a one-pass AVX2 kernel
 * that also writes the result's second copy (the caller's buffer) from
 * registers.  Every path performs the same IEEE operations on each element
 * in the same order, so results are bitwise identical whichever runs.
 */
#include "common/comm/reduce.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/comm.h"
#include "dtrain/half.h"

#define BLK 1024

/* AVX2 clone beside the baseline one, chosen once by ifunc (no FMA is
 * enabled and only adds, compares and divides appear, so both clones give
 * the same bits). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(DT_REDUCE_NO_CLONES)
#define DT_REDUCE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DT_REDUCE_CLONES
#endif

/* Conversions: dtrain/half.h (shared with the cpu device, same bits). */

/* ---- kernels ------------------------------------------------------------ */

/* Float kernels: T storage type, A accumulator, LD widen, ST narrow.  Max
 * and min propagate NaN (a NaN anywhere gives NaN, as a sum would). */
#define DEF_FLOAT_RED(fname, T, A, LD, ST)                                      \
    DT_REDUCE_CLONES static void fname(void *dst_, const void *const *src, int n, size_t cnt, \
                      int op, int group)                                      \
    {                                                                          \
        T *dst = (T *)dst_;                                                    \
        A acc[BLK];                                                            \
        for (size_t b = 0; b < cnt; b += BLK) {                                \
            size_t m = cnt - b < BLK ? cnt - b : BLK;                          \
            const T *s0 = (const T *)src[0] + b;                               \
            for (size_t j = 0; j < m; j++)                                     \
                acc[j] = LD(s0[j]);                                            \
            for (int k = 1; k < n; k++) {                                      \
                const T *s = (const T *)src[k] + b;                            \
                switch (op) {                                                  \
                case DT_OP_MAX:                                                \
                    for (size_t j = 0; j < m; j++) {                           \
                        A x = LD(s[j]);                                        \
                        acc[j] = (x > acc[j] || x != x) ? x : acc[j];          \
                    }                                                          \
                    break;                                                     \
                case DT_OP_MIN:                                                \
                    for (size_t j = 0; j < m; j++) {                           \
                        A x = LD(s[j]);                                        \
                        acc[j] = (x < acc[j] || x != x) ? x : acc[j];          \
                    }                                                          \
                    break;                                                     \
                default: /* SUM, AVG */                                        \
                    for (size_t j = 0; j < m; j++)                             \
                        acc[j] += LD(s[j]);                                    \
                    break;                                                     \
                }                                                              \
            }                                                                  \
            if (op == DT_OP_AVG) {                                             \
                A g = (A)group;                                                \
                for (size_t j = 0; j < m; j++)                                 \
                    acc[j] /= g;                                               \
            }                                                                  \
            for (size_t j = 0; j < m; j++)                                     \
                dst[b + j] = ST(acc[j]);                                       \
        }                                                                      \
    }

#define ID(x) (x)
DEF_FLOAT_RED(red_f32, float, float, ID, ID)
DEF_FLOAT_RED(red_f64, double, double, ID, ID)
DEF_FLOAT_RED(red_bf16, uint16_t, float, dt_bf16_to_f32, dt_f32_to_bf16)
DEF_FLOAT_RED(red_f16, uint16_t, float, dt_f16_to_f32, dt_f32_to_f16)

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define DT_REDUCE_HAVE_F16C 1

/* f16 with the F16C conversions (8 at a time; the same IEEE round to
 * nearest even as dt_f32_to_f16, so results match the portable kernel bit for
 * bit).  Chosen at run time: the module itself targets baseline x86-64. */
__attribute__((target("avx,f16c"))) static void red_f16_f16c(void *dst_, const void *const *src,
                                                             int n, size_t cnt, int op, int group)
{
    uint16_t *dst = (uint16_t *)dst_;
    float acc[BLK] __attribute__((aligned(32)));
    for (size_t b = 0; b < cnt; b += BLK) {
        size_t m = cnt - b < BLK ? cnt - b : BLK, m8 = m & ~(size_t)7;
        const uint16_t *s0 = (const uint16_t *)src[0] + b;
        for (size_t j = 0; j < m8; j += 8)
            _mm256_store_ps(acc + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s0 + j))));
        for (size_t j = m8; j < m; j++)
            acc[j] = dt_f16_to_f32(s0[j]);
        for (int k = 1; k < n; k++) {
            const uint16_t *s = (const uint16_t *)src[k] + b;
            for (size_t j = 0; j < m8; j += 8) {
                __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + j)));
                __m256 a = _mm256_load_ps(acc + j);
                if (op == DT_OP_MAX || op == DT_OP_MIN) {
                    __m256 better = op == DT_OP_MAX ? _mm256_cmp_ps(x, a, _CMP_GT_OQ)
                                                    : _mm256_cmp_ps(x, a, _CMP_LT_OQ);
                    __m256 take = _mm256_or_ps(better, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
                    a = _mm256_blendv_ps(a, x, take);
                } else {
                    a = _mm256_add_ps(a, x);
                }
                _mm256_store_ps(acc + j, a);
            }
            for (size_t j = m8; j < m; j++) {
                float x = dt_f16_to_f32(s[j]);
                if (op == DT_OP_MAX)
                    acc[j] = (x > acc[j] || x != x) ? x : acc[j];
                else if (op == DT_OP_MIN)
                    acc[j] = (x < acc[j] || x != x) ? x : acc[j];
                else
                    acc[j] += x;
            }
        }
        if (op == DT_OP_AVG) {
            __m256 g = _mm256_set1_ps((float)group);
            for (size_t j = 0; j < m8; j += 8)
                _mm256_store_ps(acc + j, _mm256_div_ps(_mm256_load_ps(acc + j), g));
            for (size_t j = m8; j < m; j++)
                acc[j] /= (float)group;
        }
        for (size_t j = 0; j < m8; j += 8)
            _mm_storeu_si128((__m128i *)(dst + b + j),
                             _mm256_cvtps_ph(_mm256_load_ps(acc + j), _MM_FROUND_TO_NEAREST_INT));
        for (size_t j = m8; j < m; j++)
            dst[b + j] = dt_f32_to_f16(acc[j]);
    }
}

/* f32, two sources, AVX2: dst[i] (and dst2[i] when not NULL) = a[i] op
 * b[i] in one pass, the same operations as red_f32 with n = 2: the sum
 * (divided by `group` for AVG), or b where b > a or b is NaN (MAX; MIN
 * likewise with <), else a.  dst and dst2 may alias a or b element for
 * element (every vector is loaded before it is stored). */
#define RED2_LOOP(EXPR, SCALAR)                                                \
    do {                                                                       \
        for (; i + 16 <= n; i += 16) {                                         \
            __m256 x = _mm256_loadu_ps(a + i), y = _mm256_loadu_ps(b + i);     \
            __m256 x2 = _mm256_loadu_ps(a + i + 8);                            \
            __m256 y2 = _mm256_loadu_ps(b + i + 8);                            \
            __m256 r = EXPR(x, y), r2 = EXPR(x2, y2);                          \
            _mm256_storeu_ps(dst + i, r);                                      \
            _mm256_storeu_ps(dst + i + 8, r2);                                 \
            if (dst2) {                                                        \
                _mm256_storeu_ps(dst2 + i, r);                                 \
                _mm256_storeu_ps(dst2 + i + 8, r2);                            \
            }                                                                  \
        }                                                                      \
        for (; i < n; i++) {                                                   \
            float x = a[i], y = b[i], r = SCALAR;                              \
            dst[i] = r;                                                        \
            if (dst2)                                                          \
                dst2[i] = r;                                                   \
        }                                                                      \
    } while (0)

#define V_SUM(x, y) _mm256_add_ps(x, y)
#define V_AVG(x, y) _mm256_div_ps(_mm256_add_ps(x, y), g)
#define V_MAX(x, y)                                                            \
    _mm256_blendv_ps(x, y, _mm256_or_ps(_mm256_cmp_ps(y, x, _CMP_GT_OQ),      \
                                        _mm256_cmp_ps(y, y, _CMP_UNORD_Q)))
#define V_MIN(x, y)                                                            \
    _mm256_blendv_ps(x, y, _mm256_or_ps(_mm256_cmp_ps(y, x, _CMP_LT_OQ),      \
                                        _mm256_cmp_ps(y, y, _CMP_UNORD_Q)))

__attribute__((target("avx2"))) static void red2_f32_avx2(float *dst, float *dst2,
                                                          const float *a, const float *b,
                                                          size_t n, int op, int group)
{
    size_t i = 0;
    const float fg = (float)group;
    const __m256 g = _mm256_set1_ps(fg);
    switch (op) {
    case DT_OP_MAX: RED2_LOOP(V_MAX, (y > x || y != y) ? y : x); break;
    case DT_OP_MIN: RED2_LOOP(V_MIN, (y < x || y != y) ? y : x); break;
    case DT_OP_AVG: RED2_LOOP(V_AVG, (x + y) / fg); break;
    default: RED2_LOOP(V_SUM, x + y); break;
    }
}

/* F16C from CPUID leaf 1 (clang 14's __builtin_cpu_supports knows no
 * "f16c"); "avx" below also proves the OS saves the YMM registers. */
static int cpuid_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* DTRAIN_SHM_PORTABLE_KERNELS=1 (the name it had in shm, where README and
 * test_shm set it) forces the portable kernels (tests compare
 * the two paths on machines that have F16C and AVX2). */
static int portable_forced(void)
{
    const char *env = getenv("DTRAIN_SHM_PORTABLE_KERNELS");
    return env && env[0] == '1';
}

static int have_f16c(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        v = !portable_forced() && __builtin_cpu_supports("avx") && cpuid_f16c();
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

/* The two-source f32 kernel's CPU check, with the same override. */
static int have_avx2(void)
{
    static _Atomic int cached = -1;
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        v = !portable_forced() && __builtin_cpu_supports("avx2");
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    return v;
}

/* One pass for f32 with two sources where the CPU can (1: done). */
static int try_red2_f32(void *dst, void *dst2, const void *const *srcs, int nsrc,
                        size_t count, int dtype, int op, int group)
{
    if (dtype != DT_F32 || nsrc != 2 || !have_avx2())
        return 0;
    red2_f32_avx2(dst, dst2, srcs[0], srcs[1], count, op, group);
    return 1;
}
#else
static int try_red2_f32(void *dst, void *dst2, const void *const *srcs, int nsrc,
                        size_t count, int dtype, int op, int group)
{
    (void)dst, (void)dst2, (void)srcs, (void)nsrc, (void)count, (void)dtype, (void)op,
        (void)group;
    return 0;
}
#endif

/* Integer kernels: sums wrap (done in the unsigned type U: no UB). */
#define DEF_INT_RED(fname, T, U)                                               \
    DT_REDUCE_CLONES static void fname(void *dst_, const void *const *src, int n, size_t cnt, \
                      int op, int group)                                      \
    {                                                                          \
        (void)group;                                                           \
        T *dst = (T *)dst_;                                                    \
        T acc[BLK];                                                            \
        for (size_t b = 0; b < cnt; b += BLK) {                                \
            size_t m = cnt - b < BLK ? cnt - b : BLK;                          \
            memcpy(acc, (const T *)src[0] + b, m * sizeof(T));                 \
            for (int k = 1; k < n; k++) {                                      \
                const T *s = (const T *)src[k] + b;                            \
                switch (op) {                                                  \
                case DT_OP_MAX:                                                \
                    for (size_t j = 0; j < m; j++)                             \
                        acc[j] = s[j] > acc[j] ? s[j] : acc[j];                \
                    break;                                                     \
                case DT_OP_MIN:                                                \
                    for (size_t j = 0; j < m; j++)                             \
                        acc[j] = s[j] < acc[j] ? s[j] : acc[j];                \
                    break;                                                     \
                default:                                                       \
                    for (size_t j = 0; j < m; j++)                             \
                        acc[j] = (T)((U)acc[j] + (U)s[j]);                     \
                    break;                                                     \
                }                                                              \
            }                                                                  \
            memcpy(dst + b, acc, m * sizeof(T));                               \
        }                                                                      \
    }

DEF_INT_RED(red_i32, int32_t, uint32_t)
DEF_INT_RED(red_i64, int64_t, uint64_t)
DEF_INT_RED(red_u16, uint16_t, uint32_t)
DEF_INT_RED(red_u8, uint8_t, uint32_t)

void dt_reduce(void *dst, const void *const *srcs, int nsrc, size_t count,
                int dtype, int op, int group)
{
    if (count == 0 || try_red2_f32(dst, NULL, srcs, nsrc, count, dtype, op, group))
        return;
    switch (dtype) {
    case DT_F32: red_f32(dst, srcs, nsrc, count, op, group); break;
    case DT_F64: red_f64(dst, srcs, nsrc, count, op, group); break;
    case DT_BF16: red_bf16(dst, srcs, nsrc, count, op, group); break;
    case DT_F16:
#ifdef DT_REDUCE_HAVE_F16C
        if (have_f16c()) {
            red_f16_f16c(dst, srcs, nsrc, count, op, group);
            break;
        }
#endif
        red_f16(dst, srcs, nsrc, count, op, group);
        break;
    case DT_I32: red_i32(dst, srcs, nsrc, count, op, group); break;
    case DT_I64: red_i64(dst, srcs, nsrc, count, op, group); break;
    case DT_U16: red_u16(dst, srcs, nsrc, count, op, group); break;
    case DT_U8: red_u8(dst, srcs, nsrc, count, op, group); break;
    default: break;
    }
}

/* ---- reduce into shared memory and a user buffer at once ------------------ */

void dt_reduce2(void *dst, void *dst2, const void *const *srcs, int nsrc, size_t count,
                 int dtype, int op, int group, int streaming)
{
    const size_t es = dt_dtype_size(dtype);
    enum { PIECE = 16384, MAXSRC = 64 };
    /* one pass writing both copies (streaming copies go piece by piece
     * below: non-temporal stores want whole lines from L1) */
    if (count && !streaming && try_red2_f32(dst, dst2, srcs, nsrc, count, dtype, op, group))
        return;
    if (!dst2 || nsrc > MAXSRC || es == 0) {
        dt_reduce(dst, srcs, nsrc, count, dtype, op, group);
        if (dst2)
            dt_reduce_copy_out(dst2, dst, count * es, streaming);
        return;
    }
    /* Piece by piece, so the result is copied to dst2 while it is still in
     * L1 instead of being read back from L2/L3 afterwards. */
    const size_t step = PIECE / es;
    const void *sub[MAXSRC];
    for (size_t b = 0; b < count; b += step) {
        size_t m = count - b < step ? count - b : step;
        for (int k = 0; k < nsrc; k++)
            sub[k] = (const unsigned char *)srcs[k] + b * es;
        unsigned char *d = (unsigned char *)dst + b * es;
        dt_reduce(d, sub, nsrc, m, dtype, op, group);
        dt_reduce_copy_out((unsigned char *)dst2 + b * es, d, m * es, streaming);
    }
}

/* ---- copies into user buffers -------------------------------------------- */

void dt_reduce_copy2(void *dst, void *dst2, const void *src, size_t n, int streaming)
{
    enum { PIECE = 16384 };
    for (size_t b = 0; b < n; b += PIECE) {
        size_t m = n - b < PIECE ? n - b : PIECE;
        memcpy((unsigned char *)dst + b, (const unsigned char *)src + b, m);
        if (dst2) /* from L1, not from src again */
            dt_reduce_copy_out((unsigned char *)dst2 + b, (unsigned char *)dst + b, m, streaming);
    }
}

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

void dt_reduce_copy_out(void *dst, const void *src, size_t n, int streaming)
{
#if defined(__SSE2__)
    if (streaming && n >= 4096) {
        /* Non-temporal stores: the destination is written once and not read
         * back soon, so skip reading its lines into the cache first (the
         * read-for-ownership is a third of the DRAM traffic of a large
         * all_reduce). */
        unsigned char *d = dst;
        const unsigned char *s = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, s, head);
        d += head;
        s += head;
        n -= head;
        size_t i = 0;
        for (; i + 64 <= n; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
            _mm_stream_si128((__m128i *)(d + i), a);
            _mm_stream_si128((__m128i *)(d + i + 16), b);
            _mm_stream_si128((__m128i *)(d + i + 32), c);
            _mm_stream_si128((__m128i *)(d + i + 48), e);
        }
        memcpy(d + i, s + i, n - i);
        /* streaming stores are weakly ordered: make them visible before
         * anything that says the data is there */
        _mm_sfence();
        return;
    }
#endif
    (void)streaming;
    memcpy(dst, src, n);
}
