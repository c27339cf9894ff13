/*
 * plugins/cpu/cpu_kernels_matmul.c - matmul forward/backward on OpenBLAS.
 *
 * Row-major throughout: out (N, OC) = inp (N, C) @ weight (OC, C)^T.
 *
 * Threading: OpenBLAS runs single-threaded (set at init) and the plugin's
 * pool splits each product into column slices, one single-threaded sgemm
 * per worker.  Letting the pthread OpenBLAS thread itself was measured to
 * be worse: its workers busy-wait for ~2^28 cycles after every call, so
 * the next non-BLAS kernel's workers queue behind spinning threads for a
 * scheduler slice (2-thread sgemm fell from ~200 to mostly 70-110 GFLOP/s
 * at the GPT-2 shapes of bench/bench_kernels.c, see
 * bench/results/kernels.md).  With one pool every thread spins briefly
 * and sleeps.
 *
 * bf16 and f16 weights: OpenBLAS 0.3.21 (Debian's) declares cblas_sbgemm
 * but does not export it, has no f16 gemm, and both would want both
 * operands in 16 bits anyway, so each worker widens a block of weight rows
 * to f32 in its own slice of the device scratch (tagged staging, a few MiB
 * per thread whatever the matrix) and feeds sgemm from there.  Widening is
 * exact, so the product is the f32 product of the rounded weights.
 */
#include <limits.h>
#include <string.h>

#include <cblas.h>

#include "dtrain/half.h"
#include "cpu_internal.h"

/* f32 elements of widened 16-bit weight per thread (4 MiB). */
#define CPU_HALF_BLOCK_FLOATS (1 << 20)
/* Columns are handed out in units of this many (keeps sgemm's panels
 * whole) and a slice is worth a thread from this many flops. */
#define CPU_MM_UNIT 16
#define CPU_MM_MIN_FLOPS (4 << 20)

typedef struct {
    float *out, *dinp, *dweight;
    const float *inp, *bias, *dout;
    const void *weight;
    int wdtype;         /* DT_F32, DT_BF16 or DT_F16 */
    float beta;
    int64_t N, C, OC;
    float *scratch;     /* 16-bit weights: `stride` floats per thread */
    int64_t stride;     /* 16-bit weights: min(CPU_HALF_BLOCK_FLOATS, OC * C) */
} mm_t;

/* Columns [u0 * UNIT, u1 * UNIT) clipped to n. */
static void unit_range(int64_t u0, int64_t u1, int64_t n, int64_t *c0,
                       int64_t *c1)
{
    *c0 = u0 * CPU_MM_UNIT;
    *c1 = u1 * CPU_MM_UNIT < n ? u1 * CPU_MM_UNIT : n;
}

static int64_t units(int64_t n) { return (n + CPU_MM_UNIT - 1) / CPU_MM_UNIT; }

/* Units per slice so a slice does at least CPU_MM_MIN_FLOPS (in double:
 * the flop count of a legal but huge product overflows int64). */
static int64_t unit_grain(double flops_per_column)
{
    double per_unit = flops_per_column * CPU_MM_UNIT;
    if (per_unit >= CPU_MM_MIN_FLOPS)
        return 1;
    return (int64_t)(CPU_MM_MIN_FLOPS / per_unit) + 1;
}

CPU_CLONES static void widen(float *restrict dst,
                             const uint16_t *restrict src, int wdtype,
                             int64_t rows, int64_t cols, int64_t src_ld)
{
    if (wdtype == DT_BF16) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                dst[r * cols + c] = dt_bf16_to_f32(src[r * src_ld + c]);
    } else {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                dst[r * cols + c] = dt_f16_to_f32(src[r * src_ld + c]);
    }
}

/* out[:, o0:o1] (= or +=) inp @ weight[o0:o1, :]^T */
static void fwd_task(void *ctx, int64_t u0, int64_t u1, int tid)
{
    const mm_t *a = ctx;
    int64_t o0, o1;
    unit_range(u0, u1, a->OC, &o0, &o1);
    int64_t N = a->N, C = a->C, OC = a->OC;
    if (a->bias) /* bias rows first, then sgemm adds (beta = 1) */
        for (int64_t n = 0; n < N; n++)
            memcpy(a->out + n * OC + o0, a->bias + o0,
                   (size_t)(o1 - o0) * sizeof(float));
    if (a->wdtype == DT_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N,
                    (int)(o1 - o0), (int)C, 1.0f, a->inp, (int)C,
                    (const float *)a->weight + o0 * C, (int)C, a->beta,
                    a->out + o0, (int)OC);
        return;
    }
    float *wf = a->scratch + (int64_t)tid * a->stride;
    int64_t rows = a->stride / C; /* >= 1: stride >= C */
    for (int64_t b = o0; b < o1; b += rows) {
        int64_t r = o1 - b < rows ? o1 - b : rows;
        widen(wf, (const uint16_t *)a->weight + b * C, a->wdtype, r, C, C);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)r,
                    (int)C, 1.0f, a->inp, (int)C, wf, (int)C, a->beta,
                    a->out + b, (int)OC);
    }
}

/* dweight[o0:o1, :] += dout[:, o0:o1]^T @ inp */
static void dw_task(void *ctx, int64_t u0, int64_t u1, int tid)
{
    const mm_t *a = ctx;
    int64_t o0, o1;
    unit_range(u0, u1, a->OC, &o0, &o1);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)(o1 - o0),
                (int)a->C, (int)a->N, 1.0f, a->dout + o0, (int)a->OC, a->inp,
                (int)a->C, 1.0f, a->dweight + o0 * a->C, (int)a->C);
}

/* dinp[:, c0:c1] += dout @ weight[:, c0:c1] */
static void dinp_task(void *ctx, int64_t u0, int64_t u1, int tid)
{
    const mm_t *a = ctx;
    int64_t c0, c1;
    unit_range(u0, u1, a->C, &c0, &c1);
    int64_t N = a->N, C = a->C, OC = a->OC, cw = c1 - c0;
    if (a->wdtype == DT_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)cw,
                    (int)OC, 1.0f, a->dout, (int)OC,
                    (const float *)a->weight + c0, (int)C, 1.0f, a->dinp + c0,
                    (int)C);
        return;
    }
    float *wf = a->scratch + (int64_t)tid * a->stride;
    int64_t rows = a->stride / cw; /* >= 1: cw <= C <= stride */
    for (int64_t b = 0; b < OC; b += rows) {
        int64_t r = OC - b < rows ? OC - b : rows;
        widen(wf, (const uint16_t *)a->weight + b * C + c0, a->wdtype, r, cw, C);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)cw,
                    (int)r, 1.0f, a->dout + b, (int)OC, wf, (int)cw, 1.0f,
                    a->dinp + c0, (int)C);
    }
}

typedef struct {
    float *dbias;      /* (OC) */
    const float *dout; /* (N, OC) */
    int64_t N, OC;
} colsum_t;

/* dbias[c] += sum_n dout[n, c] for a block of columns: each thread owns
 * its columns, so the sum order (n ascending) is the same at any thread
 * count. */
static void colsum_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const colsum_t *a = ctx;
    float *restrict db = a->dbias;
    for (int64_t n = 0; n < a->N; n++) {
        const float *restrict row = a->dout + n * a->OC;
        for (int64_t c = b; c < e; c++)
            db[c] += row[c];
    }
}

static int check_dims(dt_device_t *d, const char *op, int wdtype, int64_t N,
                      int64_t C, int64_t OC)
{
    CPU_DIM(d, op, N);
    CPU_DIM(d, op, C);
    CPU_DIM(d, op, OC);
    if (N > INT_MAX || C > INT_MAX || OC > INT_MAX)
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: N=%lld C=%lld OC=%lld: each must fit "
                                  "OpenBLAS's 32-bit int", op, (long long)N,
                                  (long long)C, (long long)OC);
    if (wdtype != DT_F32 && C > CPU_HALF_BLOCK_FLOATS)
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: %s weights with C = %lld > %d "
                                  "columns", op, dt_dtype_name(wdtype), (long long)C,
                                  CPU_HALF_BLOCK_FLOATS);
    int64_t p;
    int rc = cpu_check_product(d, op, N, C > OC ? C : OC, &p);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, OC, C, &p);
    return rc;
}

/* Per-thread widening space for 16-bit weights, with kmu held: at most a
 * block, no more than the whole weight. */
static int half_scratch(dt_device_t *d, const char *op, mm_t *a)
{
    a->stride = a->OC * a->C < CPU_HALF_BLOCK_FLOATS ? a->OC * a->C
                                                     : CPU_HALF_BLOCK_FLOATS;
    void *p = NULL;
    int rc = cpu_scratch(d, (uint64_t)d->threads * (uint64_t)a->stride *
                                sizeof(float), &p, op);
    a->scratch = p;
    return rc;
}

int cpu_matmul_forward(dt_device_t *d, dt_stream_t *s, void *out_,
                       const void *inp, const void *weight, const void *bias_,
                       int dtype, int wdtype, int64_t N, int64_t C, int64_t OC)
{
    static const char op[] = "matmul_forward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act_weight(d, op, dtype, wdtype));
    float *out = out_;
    const float *bias = bias_;
    int rc = check_dims(d, op, wdtype, N, C, OC);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, out, N * OC);
    CPU_PTR(d, op, inp, N * C);
    CPU_PTR(d, op, weight, OC * C);
    if (N == 0 || OC == 0)
        return DT_OK;
    if (C == 0) { /* no products: out = bias (or 0) */
        for (int64_t n = 0; n < N; n++) {
            if (bias)
                memcpy(out + n * OC, bias, (size_t)OC * sizeof(float));
            else
                memset(out + n * OC, 0, (size_t)OC * sizeof(float));
        }
        return DT_OK;
    }
    mm_t a = {.out = out, .inp = inp, .bias = bias, .weight = weight,
              .wdtype = wdtype, .beta = bias ? 1.0f : 0.0f, .N = N,
              .C = C, .OC = OC};
    cpu_lock(d);
    if (a.wdtype != DT_F32) {
        rc = half_scratch(d, op, &a);
        if (rc != DT_OK) {
            cpu_unlock(d);
            return rc;
        }
    }
    cpu_pool_run(d->pool, units(OC), unit_grain(2.0 * (double)N * (double)C),
                 fwd_task, &a);
    cpu_unlock(d);
    return DT_OK;
}

int cpu_matmul_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                        float *dweight, float *dbias, const void *dout_,
                        const void *inp, const void *weight, int dtype,
                        int wdtype, int64_t N, int64_t C, int64_t OC)
{
    static const char op[] = "matmul_backward";
    CPU_BEGIN(d, s, op);
    CPU_DTYPES(cpu_check_act_weight(d, op, dtype, wdtype));
    const float *dout = dout_;
    int rc = check_dims(d, op, wdtype, N, C, OC);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, dout, N * OC);
    if (dinp)
        CPU_PTR(d, op, weight, OC * C);
    if (dweight)
        CPU_PTR(d, op, inp, N * C);
    if (N == 0 || OC == 0)
        return DT_OK; /* every gradient gets += 0 */

    mm_t a = {.dinp = dinp, .dweight = dweight, .inp = inp, .dout = dout,
              .weight = weight, .wdtype = wdtype, .N = N, .C = C,
              .OC = OC};
    cpu_lock(d);
    /* Scratch first: a budget failure must leave every gradient as it was. */
    if (C > 0 && dinp && a.wdtype != DT_F32) {
        rc = half_scratch(d, op, &a);
        if (rc != DT_OK) {
            cpu_unlock(d);
            return rc;
        }
    }
    if (dbias) {
        colsum_t cs = {.dbias = dbias, .dout = dout, .N = N, .OC = OC};
        cpu_pool_run(d->pool, OC, CPU_GRAIN / N + 16, colsum_task, &cs);
    }
    if (C > 0 && dweight) /* (OC, C) += dout^T (OC, N) @ inp (N, C) */
        cpu_pool_run(d->pool, units(OC),
                     unit_grain(2.0 * (double)N * (double)C), dw_task, &a);
    if (C > 0 && dinp) /* (N, C) += dout (N, OC) @ weight (OC, C) */
        cpu_pool_run(d->pool, units(C),
                     unit_grain(2.0 * (double)N * (double)OC), dinp_task, &a);
    cpu_unlock(d);
    return DT_OK;
}
