/*
 * plugins/cpu/cpu_kernels_cast.c - element type conversion between f32,
 * bf16 and f16, round to nearest even (bit rules in dtrain/half.h).
 *
 * bf16 <-> f16 goes through f32, which is exact on the way in (both embed
 * in f32), so the one rounding step is still round-to-nearest-even.
 */
#include <string.h>

#include "dtrain/half.h"
#include "cpu_internal.h"

typedef struct {
    void *dst;
    const void *src;
    int dt, st;
} cast_t;

CPU_CLONES static void cast_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const cast_t *a = ctx;
    if (a->st == DT_F32 && a->dt == DT_BF16) {
        const float *restrict s = a->src;
        uint16_t *restrict o = a->dst;
        for (int64_t i = b; i < e; i++)
            o[i] = dt_f32_to_bf16(s[i]);
    } else if (a->st == DT_F32 && a->dt == DT_F16) {
        const float *restrict s = a->src;
        uint16_t *restrict o = a->dst;
        for (int64_t i = b; i < e; i++)
            o[i] = dt_f32_to_f16(s[i]);
    } else if (a->st == DT_BF16 && a->dt == DT_F32) {
        const uint16_t *restrict s = a->src;
        float *restrict o = a->dst;
        for (int64_t i = b; i < e; i++)
            o[i] = dt_bf16_to_f32(s[i]);
    } else if (a->st == DT_F16 && a->dt == DT_F32) {
        const uint16_t *restrict s = a->src;
        float *restrict o = a->dst;
        for (int64_t i = b; i < e; i++)
            o[i] = dt_f16_to_f32(s[i]);
    } else if (a->st == DT_BF16 && a->dt == DT_F16) {
        const uint16_t *restrict s = a->src;
        uint16_t *restrict o = a->dst;
        for (int64_t i = b; i < e; i++)
            o[i] = dt_f32_to_f16(dt_bf16_to_f32(s[i]));
    } else { /* f16 -> bf16 */
        const uint16_t *restrict s = a->src;
        uint16_t *restrict o = a->dst;
        for (int64_t i = b; i < e; i++)
            o[i] = dt_f32_to_bf16(dt_f16_to_f32(s[i]));
    }
}

static int cast_supported(int dt)
{
    return dt == DT_F32 || dt == DT_BF16 || dt == DT_F16;
}

int cpu_cast(dt_device_t *d, dt_stream_t *s, void *dst, int dst_dtype,
             const void *src, int src_dtype, int64_t n)
{
    static const char op[] = "cast";
    CPU_BEGIN(d, s, op);
    CPU_DIM(d, op, n);
    if (!cast_supported(dst_dtype) || !cast_supported(src_dtype))
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: %s -> %s; only f32, bf16, f16", op,
                                  dt_dtype_name(src_dtype),
                                  dt_dtype_name(dst_dtype));
    CPU_PTR(d, op, dst, n);
    CPU_PTR(d, op, src, n);
    if (n == 0)
        return DT_OK;
    size_t ds = dt_dtype_size(dst_dtype), ss = dt_dtype_size(src_dtype);
    if (src_dtype == dst_dtype) {
        memmove(dst, src, (size_t)n * ds);
        return DT_OK;
    }
    /* Element i reads and writes at different byte offsets, so an
     * overlapping in-place cast would read bytes already overwritten. */
    uintptr_t d0 = (uintptr_t)dst, d1 = d0 + (uintptr_t)n * ds;
    uintptr_t s0 = (uintptr_t)src, s1 = s0 + (uintptr_t)n * ss;
    if (d0 < s1 && s0 < d1)
        return CPU_INVALID(d, "%s: %s -> %s: dst and src overlap", op,
                           dt_dtype_name(src_dtype), dt_dtype_name(dst_dtype));
    cast_t a = {.dst = dst, .src = src, .dt = dst_dtype, .st = src_dtype};
    cpu_lock(d);
    cpu_pool_run(d->pool, n, CPU_GRAIN, cast_task, &a);
    cpu_unlock(d);
    return DT_OK;
}
