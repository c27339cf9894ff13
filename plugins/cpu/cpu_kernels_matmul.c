/*
 * plugins/cpu/cpu_kernels_matmul.c - matmul forward/backward on OpenBLAS.
 *
 * Row-major throughout: out (N, OC) = inp (N, C) @ weight (OC, C)^T.
 * OpenBLAS 0.3.21 (Debian's) declares cblas_sbgemm but does not export it,
 * and it would want both operands in bf16 anyway, so bf16 weights are
 * widened to f32 a block of rows at a time into the device's scratch
 * (tagged staging, a few MiB whatever the matrix) and fed to sgemm.
 */
#include <limits.h>
#include <string.h>

#include <cblas.h>

#include "cpu_half.h"
#include "cpu_internal.h"

/* Rows of a bf16 weight widened per sgemm: ~8 MiB of f32. */
#define CPU_BF16_CHUNK_FLOATS (2u << 20)

typedef struct {
    float *out;        /* (N, OC) */
    const float *bias; /* (OC) */
    int64_t OC;
} bias_fill_t;

static void bias_fill_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const bias_fill_t *a = ctx;
    for (int64_t n = b; n < e; n++)
        memcpy(a->out + n * a->OC, a->bias, (size_t)a->OC * sizeof(float));
}

typedef struct {
    float *restrict dst;
    const uint16_t *restrict src;
} widen_t;

static void widen_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const widen_t *a = ctx;
    float *restrict dst = a->dst;
    const uint16_t *restrict src = a->src;
    for (int64_t i = b; i < e; i++)
        dst[i] = cpu_bf16_to_f32(src[i]);
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
    if (wdtype != DT_F32 && wdtype != DT_BF16)
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: weight dtype %s; only f32 and bf16",
                                  op, dt_dtype_name(wdtype));
    if (N > INT_MAX || C > INT_MAX || OC > INT_MAX)
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: N=%lld C=%lld OC=%lld: each must fit "
                                  "OpenBLAS's 32-bit int", op, (long long)N,
                                  (long long)C, (long long)OC);
    int64_t p;
    int rc = cpu_check_product(d, op, N, C > OC ? C : OC, &p);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, OC, C, &p);
    return rc;
}

/* Rows per widened block and the scratch holding it. */
static int bf16_block(dt_device_t *d, const char *op, int64_t C, int64_t OC,
                      int64_t *rows, float **buf)
{
    int64_t r = (int64_t)CPU_BF16_CHUNK_FLOATS / C;
    if (r < 1)
        r = 1;
    if (r > OC)
        r = OC;
    void *p = NULL;
    int rc = cpu_scratch(d, (uint64_t)(r * C) * sizeof(float), &p, op);
    *rows = r;
    *buf = p;
    return rc;
}

static void widen_rows(dt_device_t *d, float *dst, const uint16_t *w,
                       int64_t oc0, int64_t r, int64_t C)
{
    widen_t a = {.dst = dst, .src = w + oc0 * C};
    cpu_pool_run(d->pool, r * C, CPU_GRAIN, widen_task, &a);
}

int cpu_matmul_forward(dt_device_t *d, dt_stream_t *s, float *out,
                       const float *inp, const void *weight, const float *bias,
                       int wdtype, int64_t N, int64_t C, int64_t OC)
{
    static const char op[] = "matmul_forward";
    CPU_BEGIN(d, s, op);
    int rc = check_dims(d, op, wdtype, N, C, OC);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, out, N * OC);
    CPU_PTR(d, op, inp, N * C);
    CPU_PTR(d, op, weight, OC * C);
    if (N == 0 || OC == 0)
        return DT_OK;

    cpu_lock(d);
    float beta = 0.0f;
    if (bias) {
        bias_fill_t a = {.out = out, .bias = bias, .OC = OC};
        cpu_pool_run(d->pool, N, CPU_GRAIN / OC + 1, bias_fill_task, &a);
        beta = 1.0f;
    } else if (C == 0) {
        memset(out, 0, (size_t)(N * OC) * sizeof(float));
    }
    if (C == 0) {
        cpu_unlock(d);
        return DT_OK;
    }
    if (wdtype == DT_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC,
                    (int)C, 1.0f, inp, (int)C, weight, (int)C, beta, out,
                    (int)OC);
    } else {
        int64_t rows;
        float *wf;
        rc = bf16_block(d, op, C, OC, &rows, &wf);
        if (rc != DT_OK) {
            cpu_unlock(d);
            return rc;
        }
        for (int64_t oc0 = 0; oc0 < OC; oc0 += rows) {
            int64_t r = OC - oc0 < rows ? OC - oc0 : rows;
            widen_rows(d, wf, weight, oc0, r, C);
            /* out[:, oc0:oc0+r] (N, r) with row stride OC */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)r,
                        (int)C, 1.0f, inp, (int)C, wf, (int)C, beta,
                        out + oc0, (int)OC);
        }
    }
    cpu_unlock(d);
    return DT_OK;
}

int cpu_matmul_backward(dt_device_t *d, dt_stream_t *s, float *dinp,
                        float *dweight, float *dbias, const float *dout,
                        const float *inp, const void *weight, int wdtype,
                        int64_t N, int64_t C, int64_t OC)
{
    static const char op[] = "matmul_backward";
    CPU_BEGIN(d, s, op);
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

    cpu_lock(d);
    if (dbias) {
        colsum_t a = {.dbias = dbias, .dout = dout, .N = N, .OC = OC};
        cpu_pool_run(d->pool, OC, 64, colsum_task, &a);
    }
    if (C > 0 && dweight) /* (OC, C) += dout^T (OC, N) @ inp (N, C) */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C,
                    (int)N, 1.0f, dout, (int)OC, inp, (int)C, 1.0f, dweight,
                    (int)C);
    if (C > 0 && dinp) { /* (N, C) += dout (N, OC) @ weight (OC, C) */
        if (wdtype == DT_F32) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N,
                        (int)C, (int)OC, 1.0f, dout, (int)OC, weight, (int)C,
                        1.0f, dinp, (int)C);
        } else {
            int64_t rows;
            float *wf;
            rc = bf16_block(d, op, C, OC, &rows, &wf);
            if (rc != DT_OK) {
                cpu_unlock(d);
                return rc;
            }
            for (int64_t oc0 = 0; oc0 < OC; oc0 += rows) {
                int64_t r = OC - oc0 < rows ? OC - oc0 : rows;
                widen_rows(d, wf, weight, oc0, r, C);
                /* dinp += dout[:, oc0:oc0+r] (N, r) @ wf (r, C) */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N,
                            (int)C, (int)r, 1.0f, dout + oc0, (int)OC, wf,
                            (int)C, 1.0f, dinp, (int)C);
            }
        }
    }
    cpu_unlock(d);
    return DT_OK;
}
