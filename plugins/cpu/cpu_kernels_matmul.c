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
 *
 * bf16 activations (cuda's semantics: bf16 weights, or f32 weights rounded
 * to bf16, products summed in f32): the f32 code above runs on blocks of
 * rows.  For each block of at most CPU_BF16_MM_FLOATS / (C + OC) rows (a
 * count that depends on the shape alone, so results do not depend on the
 * thread count) the bf16 inputs are widened into the device scratch, the
 * f32 tasks run on the block with the weight widened a block of rows per
 * thread as for 16-bit weights (an f32 weight rounded to bf16 on the way),
 * and the outputs are rounded once: out = bf16(inp W^T + bias), dinp =
 * bf16(dinp + dout W) once per call; dweight and dbias are f32 and
 * accumulate block by block.  The scratch stays bounded whatever N is, at
 * the price of widening the weight once per block of rows.  The f32 path
 * is untouched by it.
 */
#include <limits.h>
#include <string.h>

#include <cblas.h>

#include "dtrain/half.h"
#include "cpu_bf16.h"
#include "cpu_internal.h"

/* f32 elements of widened 16-bit weight per thread (4 MiB). */
#define CPU_HALF_BLOCK_FLOATS (1 << 20)
/* Columns are handed out in units of this many (keeps sgemm's panels
 * whole) and a slice is worth a thread from this many flops. */
#define CPU_MM_UNIT 16
#define CPU_MM_MIN_FLOPS (4 << 20)
/* bf16 activations: f32 elements of a block of widened rows (inp and out,
 * or dout, inp and dinp): 32 MiB. */
#define CPU_BF16_MM_FLOATS (8 << 20)

/* How the weight reaches sgemm: as it is (f32 with f32 activations), or
 * widened a block at a time from bf16 or f16, or from f32 rounded to bf16
 * first (f32 weights with bf16 activations). */
enum { MM_W_DIRECT, MM_W_BF16, MM_W_F16, MM_W_F32_TO_BF16 };

typedef struct {
    float *out, *dinp, *dweight;
    const float *inp, *bias, *dout;
    const void *weight;
    int wmode;          /* MM_W_* */
    float beta;
    int64_t N, C, OC;
    float *scratch;     /* widened weights: `stride` floats per thread */
    int64_t stride;     /* widened weights: min(CPU_HALF_BLOCK_FLOATS, OC * C) */
} mm_t;

static int mm_wmode(int dtype, int wdtype)
{
    if (wdtype == DT_BF16)
        return MM_W_BF16;
    if (wdtype == DT_F16)
        return MM_W_F16;
    return dtype == DT_BF16 ? MM_W_F32_TO_BF16 : MM_W_DIRECT;
}

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

/* rows x cols of the weight from element (row, col) (src_ld apart) into
 * dst (rows, cols) as f32. */
CPU_CLONES static void widen(float *restrict dst, const mm_t *a, int64_t row,
                             int64_t col, int64_t rows, int64_t cols,
                             int64_t src_ld)
{
    int64_t off = row * src_ld + col;
    if (a->wmode == MM_W_BF16) {
        const uint16_t *restrict src = (const uint16_t *)a->weight + off;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                dst[r * cols + c] = dt_bf16_to_f32(src[r * src_ld + c]);
    } else if (a->wmode == MM_W_F16) {
        const uint16_t *restrict src = (const uint16_t *)a->weight + off;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                dst[r * cols + c] = dt_f16_to_f32(src[r * src_ld + c]);
    } else {
        const float *restrict src = (const float *)a->weight + off;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                dst[r * cols + c] =
                    dt_bf16_to_f32(dt_f32_to_bf16(src[r * src_ld + c]));
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
    if (a->wmode == MM_W_DIRECT) {
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
        widen(wf, a, b, 0, r, C, C);
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
    if (a->wmode == MM_W_DIRECT) {
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
        widen(wf, a, b, c0, r, cw, C);
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

static int check_dims(dt_device_t *d, const char *op, int dtype, int wdtype,
                      int64_t N, int64_t C, int64_t OC)
{
    CPU_DIM(d, op, N);
    CPU_DIM(d, op, C);
    CPU_DIM(d, op, OC);
    if (N > INT_MAX || C > INT_MAX || OC > INT_MAX)
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: N=%lld C=%lld OC=%lld: each must fit "
                                  "OpenBLAS's 32-bit int", op, (long long)N,
                                  (long long)C, (long long)OC);
    if (mm_wmode(dtype, wdtype) != MM_W_DIRECT && C > CPU_HALF_BLOCK_FLOATS)
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: %s weights with %s activations and C = "
                                  "%lld > %d columns", op, dt_dtype_name(wdtype),
                                  dt_dtype_name(dtype), (long long)C,
                                  CPU_HALF_BLOCK_FLOATS);
    int64_t p;
    int rc = cpu_check_product(d, op, N, C > OC ? C : OC, &p);
    if (rc == DT_OK)
        rc = cpu_check_product(d, op, OC, C, &p);
    return rc;
}

/* The device scratch, with kmu held: `lead` floats for the caller (*lead;
 * bf16 activations' row blocks), then per-thread widening space for a
 * weight that is not used as it is: at most a block, no more than the
 * whole weight. */
static int mm_scratch(dt_device_t *d, const char *op, mm_t *a, int64_t lead,
                      float **leadp)
{
    a->stride = 0;
    if (a->wmode != MM_W_DIRECT)
        a->stride = a->OC * a->C < CPU_HALF_BLOCK_FLOATS ? a->OC * a->C
                                                         : CPU_HALF_BLOCK_FLOATS;
    lead = cpu_pad16(lead);
    void *p = NULL;
    int rc = cpu_scratch(d, ((uint64_t)lead + (uint64_t)d->threads *
                                                  (uint64_t)a->stride) *
                                sizeof(float), &p, op);
    if (rc != DT_OK)
        return rc;
    if (leadp)
        *leadp = p;
    a->scratch = (float *)p + lead;
    return DT_OK;
}

/* ---- bf16 activations: blocks of rows through the f32 tasks ---- */

typedef struct {
    void *dst;
    const void *src;
    int64_t cols;
    int widen; /* 1: bf16 src to f32 dst; 0: f32 src rounded to bf16 dst */
} rows_t;

CPU_CLONES static void rows_task(void *ctx, int64_t b, int64_t e, int tid)
{
    const rows_t *a = ctx;
    int64_t n = (e - b) * a->cols, o = b * a->cols;
    if (a->widen)
        cpu_bf16_widen((float *)a->dst + o, (const uint16_t *)a->src + o, n);
    else
        cpu_bf16_round((uint16_t *)a->dst + o, (const float *)a->src + o, n);
}

/* rows x cols contiguous elements widened (or rounded), in parallel. */
static void mm_convert(dt_device_t *d, void *dst, const void *src, int64_t rows,
                       int64_t cols, int widen)
{
    rows_t r = {.dst = dst, .src = src, .cols = cols, .widen = widen};
    cpu_pool_run(d->pool, rows, CPU_GRAIN / cols + 1, rows_task, &r);
}

/* Rows of a block: as many as CPU_BF16_MM_FLOATS holds at `per_row` floats
 * a row, at least 1, at most N. */
static int64_t block_rows(int64_t N, int64_t per_row)
{
    int64_t nb = CPU_BF16_MM_FLOATS / (per_row > 0 ? per_row : 1);
    return nb < 1 ? 1 : nb > N ? N : nb;
}

/* out (N, OC) bf16 = inp (N, C) bf16 @ W^T + bias (bf16), C > 0. */
static int matmul_forward_bf16(dt_device_t *d, const char *op, mm_t *a,
                               void *out, const void *inp, const void *bias)
{
    const int64_t N = a->N, C = a->C, OC = a->OC;
    const int64_t nb = block_rows(N, C + OC), pc = cpu_pad16(nb * C),
                  po = cpu_pad16(nb * OC);
    float *lead = NULL;
    int rc = mm_scratch(d, op, a, pc + po + (bias ? OC : 0), &lead);
    if (rc != DT_OK)
        return rc;
    float *inpf = lead, *outf = lead + pc;
    if (bias) {
        cpu_bf16_widen(lead + pc + po, bias, OC);
        a->bias = lead + pc + po;
    }
    a->inp = inpf;
    a->out = outf;
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        const int64_t r = N - n0 < nb ? N - n0 : nb;
        mm_convert(d, inpf, (const uint16_t *)inp + n0 * C, r, C, 1);
        a->N = r;
        cpu_pool_run(d->pool, units(OC), unit_grain(2.0 * (double)r * (double)C),
                     fwd_task, a);
        mm_convert(d, (uint16_t *)out + n0 * OC, outf, r, OC, 0);
    }
    return DT_OK;
}

/* dinp (bf16) += dout @ W; dweight += dout^T inp; dbias += colsum(dout). */
static int matmul_backward_bf16(dt_device_t *d, const char *op, mm_t *a,
                                void *dinp, float *dbias, const void *dout,
                                const void *inp)
{
    const int64_t N = a->N, C = a->C, OC = a->OC;
    const int use_inp = C > 0 && a->dweight, use_dinp = C > 0 && dinp;
    const int64_t nb = block_rows(N, OC + (use_inp + use_dinp) * C);
    const int64_t po = cpu_pad16(nb * OC), pc = cpu_pad16(nb * C);
    float *lead = NULL;
    int rc = mm_scratch(d, op, a, po + (use_inp + use_dinp) * pc, &lead);
    if (rc != DT_OK)
        return rc;
    float *doutf = lead, *inpf = lead + po, *dinpf = lead + po + use_inp * pc;
    a->dout = doutf;
    a->inp = inpf;
    a->dinp = dinpf;
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
        const int64_t r = N - n0 < nb ? N - n0 : nb;
        a->N = r;
        mm_convert(d, doutf, (const uint16_t *)dout + n0 * OC, r, OC, 1);
        if (dbias) { /* rows in order, block after block */
            colsum_t cs = {.dbias = dbias, .dout = doutf, .N = r, .OC = OC};
            cpu_pool_run(d->pool, OC, CPU_GRAIN / r + 16, colsum_task, &cs);
        }
        if (use_inp) {
            mm_convert(d, inpf, (const uint16_t *)inp + n0 * C, r, C, 1);
            cpu_pool_run(d->pool, units(OC),
                         unit_grain(2.0 * (double)r * (double)C), dw_task, a);
        }
        if (use_dinp) {
            uint16_t *dh = (uint16_t *)dinp + n0 * C;
            mm_convert(d, dinpf, dh, r, C, 1);
            cpu_pool_run(d->pool, units(C),
                         unit_grain(2.0 * (double)r * (double)OC), dinp_task, a);
            mm_convert(d, dh, dinpf, r, C, 0);
        }
    }
    return DT_OK;
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
    int rc = check_dims(d, op, dtype, wdtype, N, C, OC);
    if (rc != DT_OK)
        return rc;
    CPU_PTR(d, op, out, N * OC);
    CPU_PTR(d, op, inp, N * C);
    CPU_PTR(d, op, weight, OC * C);
    if (N == 0 || OC == 0)
        return DT_OK;
    if (C == 0) { /* no products: out = bias (or 0) */
        const size_t es = dt_dtype_size(dtype), row = (size_t)OC * es;
        for (int64_t n = 0; n < N; n++) {
            if (bias)
                memcpy((char *)out_ + (size_t)n * row, bias_, row);
            else
                memset((char *)out_ + (size_t)n * row, 0, row);
        }
        return DT_OK;
    }
    mm_t a = {.out = out, .inp = inp, .bias = bias, .weight = weight,
              .wmode = mm_wmode(dtype, wdtype), .beta = bias ? 1.0f : 0.0f,
              .N = N, .C = C, .OC = OC};
    cpu_lock(d);
    if (dtype == DT_BF16) {
        rc = matmul_forward_bf16(d, op, &a, out_, inp, bias_);
        cpu_unlock(d);
        return rc;
    }
    if (a.wmode != MM_W_DIRECT) {
        rc = mm_scratch(d, op, &a, 0, NULL);
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
    int rc = check_dims(d, op, dtype, wdtype, N, C, OC);
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
              .weight = weight, .wmode = mm_wmode(dtype, wdtype), .N = N,
              .C = C, .OC = OC};
    cpu_lock(d);
    if (dtype == DT_BF16) {
        /* all scratch is taken before the first gradient is touched */
        if (!(C > 0 && dinp))
            a.wmode = MM_W_DIRECT; /* no weight to widen */
        rc = matmul_backward_bf16(d, op, &a, dinp, dbias, dout_, inp);
        cpu_unlock(d);
        return rc;
    }
    /* Scratch first: a budget failure must leave every gradient as it was. */
    if (C > 0 && dinp && a.wmode != MM_W_DIRECT) {
        rc = mm_scratch(d, op, &a, 0, NULL);
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
