/*
 * plugins/cpu/cpu_kernels_llama.c - the LLaMA family's element and row
 * layers: RMSNorm, rotary position embedding (RoPE, the rotate_half
 * convention) and SwiGLU, forward and backward (dtrain/device.h).
 * Grouped-query attention lives with attention
 * (cpu_kernels_attention.c).
 *
 * The conventions of cpu_kernels_nn.c: every output element is produced
 * by one thread in a fixed order (rows split over threads; RMSNorm's
 * dweight split over columns, each summing rows in order), so results are
 * the same bits at any thread count.  bf16 activations are widened and
 * rounded in the element loops (RoPE, SwiGLU: each stored result rounded
 * once), or, for RMSNorm's rows, widened into a per-thread slice of the
 * device scratch and run through the f32 row code.
 */
#include <math.h>
#include <string.h>

#include "cpu_bf16.h"
#include "cpu_internal.h"
#include "cpu_math.h"

/* Rows per chunk so one chunk holds at least CPU_GRAIN elements. */
static int64_t row_grain(int64_t cols)
{
    return cols > 0 ? CPU_GRAIN / cols + 1 : CPU_GRAIN;
}

/* --------------------------------------------------------------- RMSNorm */

typedef struct {
    float *out, *rstd, *dinp, *dweight;
    const float *inp, *weight, *dout, *crstd;
    int64_t N, C;
    float eps;
    /* bf16: the weight widened (shared), `stride` floats per thread */
    const float *wf;
    float *scratch;
    int64_t stride;
} rms_t;

/* One row: rstd = 1 / sqrt(mean(x^2) + eps), the mean in double (eight
 * lanes); o = (x rstd) w, as Hugging Face's LlamaRMSNorm rounds it. */
static inline void rms_fwd_row(float *restrict o, float *rstd,
                               const float *restrict x,
                               const float *restrict w, int64_t C, float eps)
{
    double ms = cpu_sumsqdev_f32(x, 0.0, C) / (double)C;
    float rs = (float)(1.0 / sqrt(ms + (double)eps));
    for (int64_t c = 0; c < C; c++)
        o[c] = (x[c] * rs) * w[c];
    *rstd = rs;
}

CPU_CLONES static void rms_fwd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const rms_t *a = ctx;
    int64_t C = a->C;
    for (int64_t n = b; n < e; n++)
        rms_fwd_row(a->out + n * C, a->rstd + n, a->inp + n * C, a->weight, C,
                    a->eps);
}

CPU_CLONES static void rms_fwd_bf16_task(void *ctx, int64_t b, int64_t e,
                                         int tid)
{
    const rms_t *a = ctx;
    int64_t C = a->C;
    float *x = a->scratch + (int64_t)tid * a->stride, *o = x + cpu_pad16(C);
    for (int64_t n = b; n < e; n++) {
        cpu_bf16_widen(x, CPU_CBF16(a->inp) + n * C, C);
        rms_fwd_row(o, a->rstd + n, x, a->wf, C, a->eps);
        cpu_bf16_round(CPU_BF16(a->out) + n * C, o, C);
    }
}

/* dinp, row by row, with norm = x rstd and g = w dout:
 *   dinp += (g - norm * mean(g * norm)) * rstd */
static inline void rms_bwd_row(float *restrict dx, const float *restrict x,
                               const float *restrict dy,
                               const float *restrict w, float rs, int64_t C)
{
    double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t c = 0;
    for (; c + 8 <= C; c += 8)
        for (int j = 0; j < 8; j++)
            s[j] += (double)(w[c + j] * dy[c + j]) * (x[c + j] * rs);
    for (int j = 0; c < C; c++, j++)
        s[j] += (double)(w[c] * dy[c]) * (x[c] * rs);
    double t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    float mgn = (float)(t / (double)C);
    for (int64_t c2 = 0; c2 < C; c2++)
        dx[c2] += (w[c2] * dy[c2] - (x[c2] * rs) * mgn) * rs;
}

CPU_CLONES static void rms_bwd_rows_task(void *ctx, int64_t b, int64_t e,
                                         int tid)
{
    const rms_t *a = ctx;
    int64_t C = a->C;
    for (int64_t n = b; n < e; n++)
        rms_bwd_row(a->dinp + n * C, a->inp + n * C, a->dout + n * C,
                    a->weight, a->crstd[n], C);
}

CPU_CLONES static void rms_bwd_rows_bf16_task(void *ctx, int64_t b, int64_t e,
                                              int tid)
{
    const rms_t *a = ctx;
    int64_t C = a->C, pc = cpu_pad16(C);
    float *x = a->scratch + (int64_t)tid * a->stride, *g = x + pc, *dx = g + pc;
    for (int64_t n = b; n < e; n++) {
        uint16_t *dxh = CPU_BF16(a->dinp) + n * C;
        cpu_bf16_widen(x, CPU_CBF16(a->inp) + n * C, C);
        cpu_bf16_widen(g, CPU_CBF16(a->dout) + n * C, C);
        cpu_bf16_widen(dx, dxh, C);
        rms_bwd_row(dx, x, g, a->wf, a->crstd[n], C);
        cpu_bf16_round(dxh, dx, C);
    }
}

/* dweight for channels [b, e), summing rows in order. */
CPU_CLONES static void rms_bwd_cols_task(void *ctx, int64_t b, int64_t e,
                                         int tid)
{
    const rms_t *a = ctx;
    int64_t C = a->C;
    float *restrict dw = a->dweight;
    for (int64_t n = 0; n < a->N; n++) {
        const float *restrict x = a->inp + n * C;
        const float *restrict g = a->dout + n * C;
        float rs = a->crstd[n];
        for (int64_t c = b; c < e; c++)
            dw[c] += (x[c] * rs) * g[c];
    }
}

CPU_CLONES static void rms_bwd_cols_bf16_task(void *ctx, int64_t b, int64_t e,
                                              int tid)
{
    const rms_t *a = ctx;
    int64_t C = a->C;
    float *restrict dw = a->dweight;
    for (int64_t n = 0; n < a->N; n++) {
        const uint16_t *restrict x = CPU_CBF16(a->inp) + n * C;
        const uint16_t *restrict g = CPU_CBF16(a->dout) + n * C;
        float rs = a->crstd[n];
        for (int64_t c = b; c < e; c++)
            dw[c] += (dt_bf16_to_f32(x[c]) * rs) * dt_bf16_to_f32(g[c]);
    }
}

/* The bf16 runs' scratch, with kmu held: the widened weight, then `per`
 * rows of C floats for each thread. */
static int rms_bf16_scratch(dt_device_t *d, const char *op, rms_t *a,
                            const void *weight, int per)
{
    const int64_t pc = cpu_pad16(a->C);
    a->stride = per * pc;
    void *p = NULL;
    int rc = cpu_scratch(d, (uint64_t)(1 + d->threads * (int64_t)per) *
                                (uint64_t)pc * sizeof(float), &p, op);
    if (rc != DT_OK)
        return rc;
    float *f = p;
    cpu_bf16_widen(f, weight, a->C);
    a->wf = f;
    a->scratch = f + pc;
    return DT_OK;
}

int cpu_rmsnorm_forward(dt_device_t *d, dt_stream_t *s, void *out, float *rstd,
                        const void *inp, const void *weight, int dtype,
                        int64_t N, int64_t C, float eps)
{
    static const char op[] = "rmsnorm_forward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, N);
    CPU_DIM(d, op, C);
    int64_t NC;
    int rc = cpu_check_product(d, op, N, C, &NC);
    if (rc != DT_OK)
        return rc;
    if (C == 0 && N > 0)
        return CPU_INVALID(d, "%s: C = 0: nothing to normalise over", op);
    if (!(eps >= 0.0f) || isinf(eps))
        return CPU_INVALID(d, "%s: eps = %g must be finite and >= 0", op,
                           (double)eps);
    CPU_PTR(d, op, out, NC);
    CPU_PTR(d, op, inp, NC);
    CPU_PTR(d, op, rstd, N);
    CPU_PTR(d, op, weight, C);
    if (N == 0)
        return DT_OK;
    rms_t a = {.out = out, .rstd = rstd, .inp = inp, .weight = weight, .N = N,
               .C = C, .eps = eps};
    cpu_lock(d);
    if (dtype == DT_BF16 && (rc = rms_bf16_scratch(d, op, &a, weight, 2)) != DT_OK) {
        cpu_unlock(d);
        return rc;
    }
    cpu_pool_run(d->pool, N, row_grain(C),
                 dtype == DT_BF16 ? rms_fwd_bf16_task : rms_fwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

int cpu_rmsnorm_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                         float *dweight, const void *dout, const void *inp,
                         const void *weight, const float *rstd, int dtype,
                         int64_t N, int64_t C)
{
    static const char op[] = "rmsnorm_backward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, N);
    CPU_DIM(d, op, C);
    int64_t NC;
    int rc = cpu_check_product(d, op, N, C, &NC);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, dout, NC);
    CPU_PTR(d, op, inp, NC);
    CPU_PTR(d, op, rstd, N);
    if (dinp)
        CPU_PTR(d, op, weight, C);
    if (NC == 0)
        return DT_OK;
    rms_t a = {.dinp = dinp, .dweight = dweight, .dout = dout, .inp = inp,
               .weight = weight, .crstd = rstd, .N = N, .C = C};
    const int bf = dtype == DT_BF16;
    cpu_lock(d);
    /* scratch first: a budget failure must leave every gradient as it was */
    if (bf && dinp && (rc = rms_bf16_scratch(d, op, &a, weight, 3)) != DT_OK) {
        cpu_unlock(d);
        return rc;
    }
    if (dinp)
        cpu_pool_run(d->pool, N, row_grain(C),
                     bf ? rms_bwd_rows_bf16_task : rms_bwd_rows_task, &a);
    if (dweight)
        cpu_pool_run(d->pool, C, N >= CPU_GRAIN ? 16 : CPU_GRAIN / N + 16,
                     bf ? rms_bwd_cols_bf16_task : rms_bwd_cols_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

/* ------------------------------------------------------------------ RoPE */

typedef struct {
    float *out;
    const float *inp, *cos, *sin;
    int64_t T, NH, HD, ld;
    int backward, inplace;
} rope_t;

/* Rows (b, t) of [b0, e0): every head's pairs (i, i + HD/2) rotated by
 * the angle of position t, forward (R) or backward (R^T, accumulated,
 * or in place). */
CPU_CLONES static void rope_task(void *ctx, int64_t b0, int64_t e0, int tid)
{
    const rope_t *a = ctx;
    const int64_t half = a->HD / 2;
    for (int64_t r = b0; r < e0; r++) {
        const float *restrict cs = a->cos + (r % a->T) * half;
        const float *restrict sn = a->sin + (r % a->T) * half;
        for (int64_t h = 0; h < a->NH; h++) {
            int64_t off = r * a->ld + h * a->HD;
            const float *x = a->inp + off; /* may alias o: read before write */
            float *o = a->out + off;
            if (!a->backward)
                for (int64_t i = 0; i < half; i++) {
                    float x0 = x[i], x1 = x[i + half];
                    o[i] = x0 * cs[i] - x1 * sn[i];
                    o[i + half] = x1 * cs[i] + x0 * sn[i];
                }
            else if (a->inplace)
                for (int64_t i = 0; i < half; i++) {
                    float g0 = x[i], g1 = x[i + half];
                    o[i] = g0 * cs[i] + g1 * sn[i];
                    o[i + half] = g1 * cs[i] - g0 * sn[i];
                }
            else
                for (int64_t i = 0; i < half; i++) {
                    float g0 = x[i], g1 = x[i + half];
                    o[i] += g0 * cs[i] + g1 * sn[i];
                    o[i + half] += g1 * cs[i] - g0 * sn[i];
                }
        }
    }
}

/* bf16: the same f32 arithmetic on widened elements, each result rounded
 * once (an accumulated gradient: widened, added to, rounded). */
CPU_CLONES static void rope_bf16_task(void *ctx, int64_t b0, int64_t e0,
                                      int tid)
{
    const rope_t *a = ctx;
    const int64_t half = a->HD / 2;
    for (int64_t r = b0; r < e0; r++) {
        const float *restrict cs = a->cos + (r % a->T) * half;
        const float *restrict sn = a->sin + (r % a->T) * half;
        for (int64_t h = 0; h < a->NH; h++) {
            int64_t off = r * a->ld + h * a->HD;
            const uint16_t *x = CPU_CBF16(a->inp) + off;
            uint16_t *o = CPU_BF16(a->out) + off;
            for (int64_t i = 0; i < half; i++) {
                float x0 = dt_bf16_to_f32(x[i]), x1 = dt_bf16_to_f32(x[i + half]);
                float y0, y1;
                if (!a->backward) {
                    y0 = x0 * cs[i] - x1 * sn[i];
                    y1 = x1 * cs[i] + x0 * sn[i];
                } else {
                    y0 = x0 * cs[i] + x1 * sn[i];
                    y1 = x1 * cs[i] - x0 * sn[i];
                    if (!a->inplace) {
                        y0 = dt_bf16_to_f32(o[i]) + y0;
                        y1 = dt_bf16_to_f32(o[i + half]) + y1;
                    }
                }
                o[i] = dt_f32_to_bf16(y0);
                o[i + half] = dt_f32_to_bf16(y1);
            }
        }
    }
}

static int rope_run(dt_device_t *d, dt_stream_t *s, const char *op, void *out,
                    const void *inp, const float *cos, const float *sin,
                    int dtype, int64_t B, int64_t T, int64_t NH, int64_t HD,
                    int64_t ld, int backward)
{
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, B);
    CPU_DIM(d, op, T);
    CPU_DIM(d, op, NH);
    CPU_DIM(d, op, HD);
    CPU_DIM(d, op, ld);
    if (HD % 2 != 0)
        return CPU_INVALID(d, "%s: HD = %lld must be even (pairs i, i + HD/2)",
                           op, (long long)HD);
    int64_t bt = 0, nh = 0, n = 0, tab = 0;
    int rc = cpu_check_product(d, op, B, T, &bt);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, NH, HD, &nh);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, bt, ld, &n);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, T, HD / 2, &tab);
    if (rc != DT_OK)
        return rc;
    if (nh > ld)
        return CPU_INVALID(d, "%s: NH * HD = %lld is more than the row length "
                           "ld = %lld", op, (long long)nh, (long long)ld);
    if (bt == 0 || nh == 0)
        return DT_OK;
    CPU_PTR(d, op, out, n);
    CPU_PTR(d, op, inp, n);
    CPU_PTR(d, op, cos, tab);
    CPU_PTR(d, op, sin, tab);
    rope_t a = {.out = out, .inp = inp, .cos = cos, .sin = sin, .T = T,
                .NH = NH, .HD = HD, .ld = ld, .backward = backward,
                .inplace = out == inp};
    cpu_lock(d);
    cpu_pool_run(d->pool, bt, row_grain(nh),
                 dtype == DT_BF16 ? rope_bf16_task : rope_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

int cpu_rope_forward(dt_device_t *d, dt_stream_t *s, void *out,
                     const void *inp, const float *cos, const float *sin,
                     int dtype, int64_t B, int64_t T, int64_t NH, int64_t HD,
                     int64_t ld)
{
    return rope_run(d, s, "rope_forward", out, inp, cos, sin, dtype, B, T, NH,
                    HD, ld, 0);
}

int cpu_rope_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                      const void *dout, const float *cos, const float *sin,
                      int dtype, int64_t B, int64_t T, int64_t NH, int64_t HD,
                      int64_t ld)
{
    return rope_run(d, s, "rope_backward", dinp, dout, cos, sin, dtype, B, T,
                    NH, HD, ld, 1);
}

/* ---------------------------------------------------------------- SwiGLU */

typedef struct {
    float *out;
    const float *inp, *dout;
    int64_t H;
} swi_t;

/* silu(x) = x sigmoid(x) = x / (1 + exp(-x)) */
static inline float silu_f32(float x) { return x / (1.0f + cpu_expf(-x)); }

/* With s = sigmoid(x): silu'(x) = s (1 + x (1 - s)), 1 - s = exp(-x) s
 * without cancellation (1 when exp overflows and s is 0). */
static inline void silu_and_grad(float x, float *y, float *dy)
{
    float en = cpu_expf(-x);
    float sg = 1.0f / (1.0f + en);
    float om = en < INFINITY ? en * sg : 1.0f;
    *y = x * sg;
    *dy = sg * (1.0f + x * om);
}

/* Rows [b, e): out (H) = silu(gate) up. */
CPU_CLONES static void swi_fwd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const swi_t *a = ctx;
    const int64_t H = a->H;
    for (int64_t n = b; n < e; n++) {
        const float *restrict g = a->inp + n * 2 * H, *restrict u = g + H;
        float *restrict o = a->out + n * H;
        for (int64_t j = 0; j < H; j++)
            o[j] = silu_f32(g[j]) * u[j];
    }
}

CPU_CLONES static void swi_bwd_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const swi_t *a = ctx;
    const int64_t H = a->H;
    for (int64_t n = b; n < e; n++) {
        const float *restrict g = a->inp + n * 2 * H, *restrict u = g + H;
        const float *restrict dy = a->dout + n * H;
        float *restrict dg = a->out + n * 2 * H, *restrict du = dg + H;
        for (int64_t j = 0; j < H; j++) {
            float y, dsl;
            silu_and_grad(g[j], &y, &dsl);
            dg[j] += dsl * u[j] * dy[j];
            du[j] += y * dy[j];
        }
    }
}

CPU_CLONES static void swi_fwd_bf16_task(void *ctx, int64_t b, int64_t e,
                                         int tid)
{
    const swi_t *a = ctx;
    const int64_t H = a->H;
    for (int64_t n = b; n < e; n++) {
        const uint16_t *restrict g = CPU_CBF16(a->inp) + n * 2 * H;
        const uint16_t *restrict u = g + H;
        uint16_t *restrict o = CPU_BF16(a->out) + n * H;
        for (int64_t j = 0; j < H; j++)
            o[j] = dt_f32_to_bf16(silu_f32(dt_bf16_to_f32(g[j])) *
                                  dt_bf16_to_f32(u[j]));
    }
}

CPU_CLONES static void swi_bwd_bf16_task(void *ctx, int64_t b, int64_t e,
                                         int tid)
{
    const swi_t *a = ctx;
    const int64_t H = a->H;
    for (int64_t n = b; n < e; n++) {
        const uint16_t *restrict g = CPU_CBF16(a->inp) + n * 2 * H;
        const uint16_t *restrict u = g + H;
        const uint16_t *restrict dy = CPU_CBF16(a->dout) + n * H;
        uint16_t *restrict dg = CPU_BF16(a->out) + n * 2 * H;
        uint16_t *restrict du = dg + H;
        for (int64_t j = 0; j < H; j++) {
            float y, dsl, gy = dt_bf16_to_f32(dy[j]);
            silu_and_grad(dt_bf16_to_f32(g[j]), &y, &dsl);
            dg[j] = dt_f32_to_bf16(dt_bf16_to_f32(dg[j]) +
                                   dsl * dt_bf16_to_f32(u[j]) * gy);
            du[j] = dt_f32_to_bf16(dt_bf16_to_f32(du[j]) + y * gy);
        }
    }
}

static int swi_check(dt_device_t *d, const char *op, int dtype, int64_t N,
                     int64_t H, int64_t *NH)
{
    CPU_DTYPES(cpu_check_act(d, op, dtype));
    CPU_DIM(d, op, N);
    CPU_DIM(d, op, H);
    int64_t n2 = 0;
    int rc = cpu_check_product(d, op, N, H, NH);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, *NH, 2, &n2);
    return rc;
}

int cpu_swiglu_forward(dt_device_t *d, dt_stream_t *s, void *out,
                       const void *inp, int dtype, int64_t N, int64_t H)
{
    static const char op[] = "swiglu_forward";
    CPU_BEGIN(d, s, op);
    int64_t nh = 0;
    int rc = swi_check(d, op, dtype, N, H, &nh);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, out, nh);
    CPU_PTR(d, op, inp, 2 * nh);
    if (nh == 0)
        return DT_OK;
    swi_t a = {.out = out, .inp = inp, .H = H};
    cpu_lock(d);
    cpu_pool_run(d->pool, N, row_grain(H),
                 dtype == DT_BF16 ? swi_fwd_bf16_task : swi_fwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

int cpu_swiglu_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                        const void *inp, const void *dout, int dtype,
                        int64_t N, int64_t H)
{
    static const char op[] = "swiglu_backward";
    CPU_BEGIN(d, s, op);
    int64_t nh = 0;
    int rc = swi_check(d, op, dtype, N, H, &nh);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, dinp, 2 * nh);
    CPU_PTR(d, op, inp, 2 * nh);
    CPU_PTR(d, op, dout, nh);
    if (nh == 0)
        return DT_OK;
    swi_t a = {.out = dinp, .inp = inp, .dout = dout, .H = H};
    cpu_lock(d);
    cpu_pool_run(d->pool, N, row_grain(3 * H),
                 dtype == DT_BF16 ? swi_bwd_bf16_task : swi_bwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}
