/*
 * plugins/cuda/cuda_matmul.c - the cuda device's matmuls through cuBLASLt:
 * f32 (TF32 tensor cores when the `tf32` key allows; bf16 and f16 weights
 * with f32 activations are widened to f32 first) and bf16 with f32
 * accumulation (an f32 weight with bf16 activations is rounded to bf16
 * first); the forward's bias goes in cuBLASLt's BIAS epilogue, the
 * weight gradient accumulates (beta = 1) into the f32 dweight straight
 * from bf16 inputs, and the bias gradient is a column-sum kernel
 * (cuda_nn.cu: a fixed order, no atomics).  With `deterministic` cuBLASLt is
 * asked for algorithms without split-K reductions.
 *
 * A row-major (N, C) matrix is a column-major (C, N) one, so each product
 * is computed on the transposes in cuBLAS's column-major terms (llm.c's
 * arrangement; the shapes are at each call).  Compiled for sm_80 and
 * sm_90; ran on an H200 (test_kernels, the GPT-2 oracle).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"
#include "cuda_launch.h"

static cudaDataType_t lt_type(int dtype)
{
    return dtype == DT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static int lt_layout(dt_device_t *d, const char *op, cublasLtMatrixLayout_t *l,
                     int dtype, uint64_t rows, uint64_t cols, int64_t ld,
                     int batch, int64_t stride)
{
    cublasStatus_t s = cublasLtMatrixLayoutCreate(l, lt_type(dtype), rows, cols, ld);
    if (s == CUBLAS_STATUS_SUCCESS && batch > 1) {
        int32_t n = batch;
        s = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n,
                                             sizeof n);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasLtMatrixLayoutSetAttribute(
                *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    }
    return s == CUBLAS_STATUS_SUCCESS
               ? DT_OK
               : cuda_lt_fail(d, op, "cublasLtMatrixLayout", s);
}

/* The largest power of two up to 256 that divides the address (and, for a
 * batch, every matrix's address): cuBLASLt's heuristic assumes 256-byte
 * aligned operands unless told otherwise, and a slice of a flat parameter
 * buffer, or one head of a (T, 3C) qkv matrix, is often only 16- or 64-byte
 * aligned. */
static uint32_t ptr_align(const void *p, int batch, int64_t stride, int dtype)
{
    uintptr_t bits = (uintptr_t)p;
    if (batch > 1)
        bits |= (uintptr_t)stride * (dtype == DT_BF16 ? 2u : 4u);
    uint32_t a = 256;
    while (a > 1 && (bits & (a - 1)) != 0)
        a >>= 1;
    return a;
}

/* cuBLASLt's heuristic query costs tens of microseconds a call, more than
 * most of the products it picks for; its answer depends only on the
 * problem's description, so it is kept per description (process-wide: the
 * key holds the device index).  A full table stops caching, never evicts. */
typedef struct lt_key {
    int32_t dev, ta, tb, atype, dtype, batch, compute, bias, det;
    uint32_t align[3];
    uint64_t m, n, k;
    int64_t lda, ldb, ldd, sa, sb, sd;
} lt_key_t;
#define LT_CACHE 512
static struct {
    pthread_mutex_t mu;
    int used[LT_CACHE];
    lt_key_t key[LT_CACHE];
    cublasLtMatmulAlgo_t algo[LT_CACHE];
} lt_cache = {.mu = PTHREAD_MUTEX_INITIALIZER};

static uint64_t lt_hash(const lt_key_t *k)
{
    const unsigned char *b = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* 1 and *algo when cached; else 0 and *slot (or -1: table full). */
static int lt_cache_find(const lt_key_t *k, cublasLtMatmulAlgo_t *algo, int *slot)
{
    int found = 0;
    *slot = -1;
    pthread_mutex_lock(&lt_cache.mu);
    for (uint64_t i = lt_hash(k) % LT_CACHE, n = 0; n < LT_CACHE; i = (i + 1) % LT_CACHE, n++) {
        if (!lt_cache.used[i]) {
            *slot = (int)i;
            break;
        }
        if (memcmp(&lt_cache.key[i], k, sizeof *k) == 0) {
            *algo = lt_cache.algo[i];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&lt_cache.mu);
    return found;
}

static void lt_cache_put(const lt_key_t *k, const cublasLtMatmulAlgo_t *algo, int slot)
{
    pthread_mutex_lock(&lt_cache.mu);
    if (!lt_cache.used[slot]) { /* another thread may have taken it */
        lt_cache.key[slot] = *k;
        lt_cache.algo[slot] = *algo;
        lt_cache.used[slot] = 1;
    }
    pthread_mutex_unlock(&lt_cache.mu);
}

int cuda_lt_matmul(dt_device_t *d, dt_stream_t *st, const char *op,
                   const cuda_lt_call_t *c)
{
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t s;
    int rc = DT_OK;
    int batch = c->batch > 1 ? c->batch : 1;
    cublasComputeType_t ct = c->atype == DT_F32 && d->tf32
                                 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                 : CUBLAS_COMPUTE_32F;
#define LT(call)                                                               \
    do {                                                                       \
        if ((s = (call)) != CUBLAS_STATUS_SUCCESS) {                           \
            rc = cuda_lt_fail(d, op, #call, s);                                \
            goto out;                                                          \
        }                                                                      \
    } while (0)
    LT(cublasLtMatmulDescCreate(&desc, ct, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &c->ta,
                                      sizeof c->ta));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &c->tb,
                                      sizeof c->tb));
    if (c->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = lt_type(c->dtype);
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                          &epi, sizeof epi));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                          &c->bias, sizeof c->bias));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                          &bt, sizeof bt));
    }
    uint64_t ar = c->ta == CUBLAS_OP_N ? c->m : c->k;
    uint64_t ac = c->ta == CUBLAS_OP_N ? c->k : c->m;
    uint64_t br = c->tb == CUBLAS_OP_N ? c->k : c->n;
    uint64_t bc = c->tb == CUBLAS_OP_N ? c->n : c->k;
    if ((rc = lt_layout(d, op, &la, c->atype, ar, ac, c->lda, batch, c->sa)) != DT_OK ||
        (rc = lt_layout(d, op, &lb, c->atype, br, bc, c->ldb, batch, c->sb)) != DT_OK ||
        (rc = lt_layout(d, op, &ld, c->dtype, c->m, c->n, c->ldd, batch, c->sd)) != DT_OK)
        goto out;

    lt_key_t key;
    memset(&key, 0, sizeof key); /* the padding too: the key is compared bytewise */
    key.dev = d->index;
    key.ta = c->ta, key.tb = c->tb, key.atype = c->atype, key.dtype = c->dtype;
    key.batch = batch, key.compute = ct, key.bias = c->bias != NULL;
    key.det = d->deterministic;
    key.align[0] = ptr_align(c->A, batch, c->sa, c->atype);
    key.align[1] = ptr_align(c->B, batch, c->sb, c->atype);
    key.align[2] = ptr_align(c->D, batch, c->sd, c->dtype);
    if (c->bias) /* the epilogue reads the bias vector: its alignment too */
        key.align[2] = key.align[2] < ptr_align(c->bias, 1, 0, c->dtype)
                           ? key.align[2]
                           : ptr_align(c->bias, 1, 0, c->dtype);
    key.m = c->m, key.n = c->n, key.k = c->k;
    key.lda = c->lda, key.ldb = c->ldb, key.ldd = c->ldd;
    if (batch > 1)
        key.sa = c->sa, key.sb = c->sb, key.sd = c->sd;
    cublasLtMatmulAlgo_t algo;
    int slot;
    if (!lt_cache_find(&key, &algo, &slot)) {
        LT(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t ws = CUDA_LT_WORKSPACE;
        LT(cublasLtMatmulPreferenceSetAttribute(
            pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
        const cublasLtMatmulPreferenceAttributes_t al[] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; i++)
            LT(cublasLtMatmulPreferenceSetAttribute(pref, al[i], &key.align[i < 3 ? i : 2],
                                                    sizeof key.align[0]));
        /* deterministic: no split-K.  A bf16 output: split-K only with its
         * partial sums in the compute type (f32), never in the output's
         * 8-bit mantissa (the OUTPUT_TYPE and INPLACE schemes). */
        if (d->deterministic || c->dtype == DT_BF16) {
            uint32_t mask = d->deterministic ? CUBLASLT_REDUCTION_SCHEME_NONE
                                             : CUBLASLT_REDUCTION_SCHEME_NONE |
                                                   CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
            LT(cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask));
        }
        cublasLtMatmulHeuristicResult_t heur;
        int found = 0;
        LT(cublasLtMatmulAlgoGetHeuristic(d->lt, desc, la, lb, ld, ld, pref, 1,
                                          &heur, &found));
        if (found == 0) {
            rc = d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                    "%s: cuBLASLt has no algorithm for %s x %s "
                                    "(%llu x %llu x %llu%s)%s", op,
                                    dt_dtype_name(c->atype), dt_dtype_name(c->atype),
                                    (unsigned long long)c->m, (unsigned long long)c->n,
                                    (unsigned long long)c->k, batch > 1 ? ", batched" : "",
                                    c->bias ? " with a bias epilogue" : "");
            goto out;
        }
        algo = heur.algo;
        if (slot >= 0)
            lt_cache_put(&key, &algo, slot);
    }
    float alpha = c->alpha != 0.0f ? c->alpha : 1.0f;
    LT(cublasLtMatmul(d->lt, desc, &alpha, c->A, la, c->B, lb, &c->beta, c->D,
                      ld, c->D, ld, &algo, st->workspace, CUDA_LT_WORKSPACE,
                      st->cs));
#undef LT
out:
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    if (ld)
        cublasLtMatrixLayoutDestroy(ld);
    if (lb)
        cublasLtMatrixLayoutDestroy(lb);
    if (la)
        cublasLtMatrixLayoutDestroy(la);
    if (desc)
        cublasLtMatmulDescDestroy(desc);
    return rc;
}

/* f32 activations with f32, bf16 or f16 weights; bf16 activations with
 * bf16 or f32 weights. */
static int check_types(dt_device_t *d, const char *op, int dtype, int wdtype)
{
    if ((dtype == DT_F32 && (wdtype == DT_F32 || wdtype == DT_BF16 || wdtype == DT_F16)) ||
        (dtype == DT_BF16 && (wdtype == DT_BF16 || wdtype == DT_F32)))
        return DT_OK;
    char got[96];
    snprintf(got, sizeof got, "%s activations with %s weights",
             dt_dtype_name(dtype), dt_dtype_name(wdtype));
    return cuda_dtype_refused(d, op, got,
                              "f32 activations with f32, bf16 or f16 weights, or "
                              "bf16 activations with bf16 or f32 weights");
}

/* cuBLASLt multiplies A and B of one type: a weight of another type than
 * the activations is converted into the stream's scratch, ordered on the
 * stream, and the product runs in the activations' type.  bf16 and f16
 * weights with f32 activations are widened (exactly); an f32 weight with
 * bf16 activations is rounded to bf16 (nearest even), as mixed precision
 * computes with an f32 master copy.  *w points at the converted copy. */
static int convert_weight(dt_device_t *d, dt_stream_t *st, const char *op,
                          const void **w, int dtype, int wdtype, int64_t OC, int64_t C)
{
    if (wdtype == dtype)
        return DT_OK;
    uint64_t bytes = (uint64_t)OC * (uint64_t)C * dt_dtype_size(dtype);
    if (bytes > st->wide_bytes) {
        if (st->wide)
            cuda_mem_free(d, st->wide);
        st->wide = NULL;
        st->wide_bytes = 0;
        char who[64];
        snprintf(who, sizeof who, "%s: converted weight", op);
        int rc = cuda_mem_alloc(d, bytes, DT_TAG_STAGING, (void **)&st->wide, who);
        if (rc != DT_OK)
            return rc;
        st->wide_bytes = bytes;
    }
    CUDA_LAUNCHED(d, op, cuda_launch_cast(st->cs, st->wide, dtype, *w, wdtype, OC * C));
    *w = st->wide;
    return DT_OK;
}

int cuda_matmul_forward(dt_device_t *d, dt_stream_t *s, void *out,
                        const void *inp, const void *weight, const void *bias,
                        int dtype, int wdtype, int64_t N, int64_t C, int64_t OC)
{
    static const char op[] = "matmul_forward";
    CUDA_BEGIN(d, s, op, st);
    int rc = check_types(d, op, dtype, wdtype);
    if (rc != DT_OK)
        return rc;
    CUDA_DIM(d, op, N);
    CUDA_DIM(d, op, C);
    CUDA_DIM(d, op, OC);
    CUDA_PTR(d, op, out, N * OC);
    CUDA_PTR(d, op, inp, N * C);
    CUDA_PTR(d, op, weight, OC * C);
    if (N == 0 || OC == 0)
        return DT_OK;
    if (C == 0) /* an empty sum: out = bias (or 0) */
        return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                                  "%s: C = 0 is not run by the cuda device", op);
    if ((rc = convert_weight(d, st, op, &weight, dtype, wdtype, OC, C)) != DT_OK)
        return rc;
    /* out^T (OC, N) = W (OC, C) inp^T (C, N); W is col-major (C, OC): op T */
    cuda_lt_call_t c = {.ta = CUBLAS_OP_T, .tb = CUBLAS_OP_N,
                   .m = (uint64_t)OC, .n = (uint64_t)N, .k = (uint64_t)C,
                   .A = weight, .B = inp, .D = out, .atype = dtype, .dtype = dtype,
                   .lda = C, .ldb = C, .ldd = OC, .beta = 0.0f, .bias = bias};
    return cuda_lt_matmul(d, st, op, &c);
}

int cuda_matmul_backward(dt_device_t *d, dt_stream_t *s, void *dinp,
                         float *dweight, float *dbias, const void *dout,
                         const void *inp, const void *weight, int dtype,
                         int wdtype, int64_t N, int64_t C, int64_t OC)
{
    static const char op[] = "matmul_backward";
    CUDA_BEGIN(d, s, op, st);
    int rc = check_types(d, op, dtype, wdtype);
    if (rc != DT_OK)
        return rc;
    CUDA_DIM(d, op, N);
    CUDA_DIM(d, op, C);
    CUDA_DIM(d, op, OC);
    CUDA_PTR(d, op, dout, N * OC);
    if (dinp)
        CUDA_PTR(d, op, weight, OC * C);
    if (dweight)
        CUDA_PTR(d, op, inp, N * C);
    if (N == 0 || OC == 0 || C == 0)
        return DT_OK;
    if (dinp && (rc = convert_weight(d, st, op, &weight, dtype, wdtype, OC, C)) != DT_OK)
        return rc;
    if (dinp) { /* dinp^T (C, N) += W^T (C, OC) dout^T (OC, N) */
        cuda_lt_call_t c = {.ta = CUBLAS_OP_N, .tb = CUBLAS_OP_N,
                       .m = (uint64_t)C, .n = (uint64_t)N, .k = (uint64_t)OC,
                       .A = weight, .B = dout, .D = dinp, .atype = dtype,
                       .dtype = dtype, .lda = C, .ldb = OC, .ldd = C, .beta = 1.0f};
        if ((rc = cuda_lt_matmul(d, st, op, &c)) != DT_OK)
            return rc;
    }
    if (dweight) { /* dW^T (C, OC) += inp^T (C, N) dout (N, OC), in f32 */
        cuda_lt_call_t c = {.ta = CUBLAS_OP_N, .tb = CUBLAS_OP_T,
                       .m = (uint64_t)C, .n = (uint64_t)OC, .k = (uint64_t)N,
                       .A = inp, .B = dout, .D = dweight, .atype = dtype,
                       .dtype = DT_F32, .lda = C, .ldb = OC, .ldd = C, .beta = 1.0f};
        if ((rc = cuda_lt_matmul(d, st, op, &c)) != DT_OK)
            return rc;
    }
    if (dbias)
        CUDA_LAUNCHED(d, op, cuda_launch_bias_backward(st->cs, dbias, dout, dtype, N, OC));
    return DT_OK;
}
