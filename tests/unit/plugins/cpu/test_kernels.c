/*
 * tests/unit/plugins/cpu/test_kernels.c - every kernel of a device plugin, forward and
 * backward, against the double-precision references of
 * tests/support/ref_kernels.c on fresh seeded random inputs with odd
 * shapes; the references' backward passes against central finite
 * differences of their forward passes; accumulation (+=) of every gradient;
 * optimizers over several steps; sumsq; casts bit-exact; and, on the cpu,
 * attention's saved state size, the refusal of every dtype combination it
 * does not run and the same bits from 1 and 2 threads.
 *
 * Device-parametrized: `test_kernels [cpu|cuda]` (default cpu).  On cuda
 * the buffers are CUDA managed memory, so the same test bodies fill inputs
 * and read results in place, and every kernel call is followed by a
 * synchronize (OK below); the two instances are deterministic = true and
 * false.  ctest runs unit.test_kernels (cpu) and unit.test_kernels.cuda,
 * which exits 77 (skipped) with "no CUDA device" where there is none.  The
 * cuda variant passed on an H200, also under compute-sanitizer memcheck and
 * racecheck (scripts/gpu-check.sh).
 *
 * A second group, "bf16 activations on <device>", runs every kernel with
 * bf16 activations (matmul with bf16 weights and with f32 master weights
 * rounded to bf16, embedding, layernorm, GELU, residual/axpy/scale,
 * softmax cross-entropy, attention, and the optimizers on bf16 gradients)
 * against the same references fed exactly the bf16 inputs, each element
 * within a bound built from its terms' magnitudes: f32 arithmetic, then
 * bf16's unit roundoff 2^-8 ~ 3.9e-3 per stored rounding.  The bounds are
 * cuda's (the looser: its attention rounds P and dS to bf16 for the tensor
 * cores); the cpu's attention state differs and is checked as such.
 *
 * Tolerances are |got - want| <= atol + rtol |want| (in the bf16 group,
 * mostly a bound per element), stated at each check with the reason.
 * u = 2^-24 ~ 6e-8 is the f32 unit roundoff.
 */
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu/cpu_math.h" /* header-only: test it directly */
#include "dtrain/dtrain.h"
#include "dtrain/sdk/norm.h"
#include "cuda_probe.h"
#include "ref_kernels.h"
#include "test_host.h"
#include "util/error.h"
#include "test_assert.h"
#include "test_plugin.h"

/* ------------------------------------------------------------ harness */

/* One instance of the device plugin under test (the name is from when
 * this test ran the cpu only). */
typedef struct {
    dt_test_host_t th;
    const dt_device_ops_v1_t *ops;
    const dt_kernels_v1_t *K;
    dt_device_t *dev;
} cpu_t;

static cpu_t g_t1, g_t2; /* cpu: threads = 1 and 2; cuda: deterministic on, off */

static const char *g_device = "cpu"; /* the plugin under test (argv[1]) */
static int g_cuda;                   /* managed buffers, synchronize after calls */
static char g_prefix[32];            /* "device/cpu" */

static const dt_device_ops_v1_t *cpu_ops(void)
{
    static const dt_device_ops_v1_t *ops;
    char path[512];
    snprintf(path, sizeof path, DT_TEST_PLUGIN_DIR "/dtrain_%s.so", g_device);
    /* Never dlclosed: OpenBLAS threads live as long as the process. */
    if (!ops && !(ops = dt_test_plugin_entry(path, DT_ENTRY_STRING(device, 1), NULL)))
        fail_msg("%s", dt_last_error());
    return ops;
}

static const dt_test_kv_t kv_t1[] = {{"threads", "1"}, {NULL, NULL}};
static const dt_test_kv_t kv_t2[] = {{"threads", "2"}, {NULL, NULL}};
static const dt_test_kv_t kv_cuda1[] = {{"deterministic", "true"}, {NULL, NULL}};
static const dt_test_kv_t kv_cuda2[] = {{"deterministic", "false"}, {NULL, NULL}};

static int open_cpu(cpu_t *c, const dt_test_kv_t *kv)
{
    c->ops = cpu_ops();
    c->K = c->ops->kernels();
    dt_test_host_init(&c->th, g_prefix, kv);
    const dt_device_init_v1_t a = {.struct_size = sizeof a, .local_size = 1, .device_index = -1};
    return c->ops->init(&c->th.host, &a, &c->dev);
}

static int group_setup(void **state)
{
    if (open_cpu(&g_t1, g_cuda ? kv_cuda1 : kv_t1) != DT_OK ||
        open_cpu(&g_t2, g_cuda ? kv_cuda2 : kv_t2) != DT_OK) {
        fprintf(stderr, "init: %s\n", dt_last_error());
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    g_t1.ops->finalize(g_t1.dev);
    g_t2.ops->finalize(g_t2.dev);
    return 0;
}

/* On cuda every call is waited for, so the host may read its results: on
 * both instances (synchronize covers one instance's streams; the call may
 * have run on either). */
#define OK(expr)                                                               \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ == DT_OK && g_cuda)                                            \
            rc_ = g_t1.ops->synchronize(g_t1.dev);                             \
        if (rc_ == DT_OK && g_cuda)                                            \
            rc_ = g_t2.ops->synchronize(g_t2.dev);                             \
        if (rc_ != DT_OK)                                                      \
            fail_msg("%s: %s: %s", #expr, dt_status_name(rc_),                 \
                     dt_last_error());                                         \
    } while (0)
/* The device's message, its "device/<name>: " prefix added. */
#define assert_dev_msg(expected)                                               \
    do {                                                                       \
        char want_[512];                                                       \
        snprintf(want_, sizeof want_, "%s: %s", g_prefix, (expected));         \
        assert_string_equal(dt_last_error(), want_);                           \
    } while (0)
/* Float results vs a double reference. */
#define CHECK(what, got, want, n, rtol, atol)                                  \
    assert_int_equal(dt_ref_check((what), (got), (want), (n), (rtol), (atol)), 0)
#define CHECK_D(what, got, want, n, rtol, atol)                                \
    assert_int_equal(dt_ref_check_d((what), (got), (want), (n), (rtol), (atol)), 0)

/* Device memory; on cuda managed memory, which the host reads in place. */
static void *dalloc(cpu_t *c, int64_t bytes)
{
    void *p = NULL;
    if (g_cuda) {
        if (!(p = dt_test_cuda_managed_alloc((size_t)bytes)))
            fail_msg("cudaMallocManaged(%lld) failed", (long long)bytes);
        return p;
    }
    OK(c->ops->alloc(c->dev, (uint64_t)bytes, DT_TAG_ACTIVATIONS, &p));
    return p;
}
static void dfree(cpu_t *c, void *p)
{
    if (g_cuda)
        dt_test_cuda_managed_free(p);
    else
        OK(c->ops->free(c->dev, p));
}

/* Device floats, uniform in [lo, hi). */
static float *drand(cpu_t *c, dt_ref_rng_t *r, int64_t n, double lo, double hi)
{
    float *p = dalloc(c, n * (int64_t)sizeof(float));
    dt_ref_fill_uniform(r, p, n, lo, hi);
    return p;
}

/* Exact double copy of floats (host memory, free()). */
static double *hd(const float *x, int64_t n)
{
    double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
    dt_ref_f2d(d, x, n);
    return d;
}
static double *hzero(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }

/* want[i] = g0[i] + k * grad[i]: the expected value of an accumulating
 * gradient after k calls starting from g0. */
static double *accum(const double *g0, const double *grad, double k, int64_t n)
{
    double *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++)
        w[i] = g0[i] + k * grad[i];
    return w;
}

static double tol_sqrt(int64_t k) { return sqrt((double)k); }

/* ------------------------------------------- finite-difference harness */

typedef double (*loss_fn)(void *ctx);

/* Central differences of L with respect to each x[i], against `analytic`.
 * eps 1e-6: truncation ~eps^2 |L'''| ~ 1e-12; rounding ~ 1e-16 |L| / eps
 * ~ 1e-9 for the |L| < 10 used here.  So rtol 1e-6 with atol 1e-8. */
static void fd_check(const char *what, double *x, int64_t n,
                     const double *analytic, loss_fn L, void *ctx)
{
    const double eps = 1e-6;
    double *fd = malloc((size_t)n * sizeof *fd);
    for (int64_t i = 0; i < n; i++) {
        double xi = x[i];
        x[i] = xi + eps;
        double lp = L(ctx);
        x[i] = xi - eps;
        double lm = L(ctx);
        x[i] = xi;
        fd[i] = (lp - lm) / (2.0 * eps);
    }
    CHECK_D(what, analytic, fd, n, 1e-6, 1e-8);
    free(fd);
}

static double dotd(const double *a, const double *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* ============================================================== cpu_expf */

/* The plugin's own expf (GELU, softmaxes) within 2 ulp of exp (measured
 * 1.78 over every 7th float), over a sweep of the whole range where exp is
 * a normal or subnormal float, and exactly right at the specials. */
static void test_expf_accuracy(void **state)
{
    double worst = 0.0;
    float worst_x = 0.0f;
    for (int64_t i = 0; i <= 4000000; i++) {
        float x = (float)(-104.0 + 193.0 * (double)i / 4000000.0);
        double want = exp((double)x);
        float got = cpu_expf(x), wf = (float)want;
        if (wf == 0.0f || isinf(wf)) {
            if (got != wf)
                fail_msg("expf(%a) = %a, want %a", (double)x, (double)got, (double)wf);
            continue;
        }
        double ulp = (double)nextafterf(wf, INFINITY) - (double)wf;
        double e = fabs((double)got - want) / ulp;
        if (e > worst) {
            worst = e;
            worst_x = x;
        }
    }
    if (worst > 2.0)
        fail_msg("cpu_expf: %.2f ulp at %a", worst, (double)worst_x);
    assert_true(isnan(cpu_expf(NAN)));
    assert_true(cpu_expf(INFINITY) == INFINITY);
    assert_true(cpu_expf(-INFINITY) == 0.0f);
    assert_true(cpu_expf(0.0f) == 1.0f);
    assert_true(cpu_expf(89.0f) == INFINITY);  /* > ln(FLT_MAX) */
    assert_true(cpu_expf(-104.0f) == 0.0f);    /* < half the least subnormal */
    assert_true(cpu_expf(-1000.0f) == 0.0f);
    assert_true(cpu_expf(-100.0f) > 0.0f);     /* gradual underflow */
}

/* ================================================================ matmul */

typedef struct {
    double *inp, *w, *bias, *dout, *out;
    int64_t N, C, OC;
} mm_ctx_t;

static double mm_loss(void *p)
{
    mm_ctx_t *c = p;
    dt_ref_matmul_forward(c->out, c->inp, c->w, c->bias, c->N, c->C, c->OC);
    return dotd(c->out, c->dout, c->N * c->OC);
}

static void test_ref_matmul_fd(void **state)
{
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 101);
    const int64_t N = 7, C = 13, OC = 9;
    mm_ctx_t m = {.N = N, .C = C, .OC = OC};
    double *bufs[5];
    int64_t sz[5] = {N * C, OC * C, OC, N * OC, N * OC};
    for (int i = 0; i < 5; i++) {
        bufs[i] = hzero(sz[i]);
        for (int64_t j = 0; j < sz[i]; j++)
            bufs[i][j] = dt_ref_rng_uniform(&r, -1, 1);
    }
    m.inp = bufs[0], m.w = bufs[1], m.bias = bufs[2], m.dout = bufs[3];
    m.out = bufs[4];
    double *dinp = hzero(N * C), *dw = hzero(OC * C), *db = hzero(OC);
    dt_ref_matmul_backward(dinp, dw, db, m.dout, m.inp, m.w, N, C, OC);
    fd_check("ref matmul dinp", m.inp, N * C, dinp, mm_loss, &m);
    fd_check("ref matmul dweight", m.w, OC * C, dw, mm_loss, &m);
    fd_check("ref matmul dbias", m.bias, OC, db, mm_loss, &m);
    for (int i = 0; i < 5; i++)
        free(bufs[i]);
    free(dinp), free(dw), free(db);
}

/* One forward + two backward calls at (N, C, OC) with weights in `wdtype`,
 * against the reference. */
static void matmul_case(cpu_t *c, uint64_t seed, int wdtype, int with_bias,
                        int64_t N, int64_t C, int64_t OC)
{
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, seed);
    float *inp = drand(c, &r, N * C, -1, 1);
    float *bias = with_bias ? drand(c, &r, OC, -1, 1) : NULL;
    float *wf = drand(c, &r, OC * C, -1, 1);
    double *wref = hzero(OC * C);
    void *w = wf;
    if (wdtype != DT_F32) { /* the reference sees exactly the 16-bit values */
        uint16_t *wb = dalloc(c, OC * C * 2);
        for (int64_t i = 0; i < OC * C; i++) {
            wb[i] = wdtype == DT_BF16 ? dt_ref_f32_to_bf16(wf[i]) : dt_ref_f32_to_f16(wf[i]);
            wref[i] = wdtype == DT_BF16 ? dt_ref_bf16_to_double(wb[i])
                                        : dt_ref_f16_to_double(wb[i]);
        }
        w = wb;
    } else {
        dt_ref_f2d(wref, wf, OC * C);
    }
    double *inpd = hd(inp, N * C), *biasd = bias ? hd(bias, OC) : NULL;

    float *out = dalloc(c, N * OC * 4);
    OK(c->K->matmul_forward(c->dev, NULL, out, inp, w, bias, DT_F32, wdtype, N, C, OC));
    double *outd = hzero(N * OC);
    dt_ref_matmul_forward(outd, inpd, wref, biasd, N, C, OC);
    /* A C-term dot product of |terms| < 1: f32 error grows ~ sqrt(C) u per
     * unit of magnitude; atol 1e-6 sqrt(C) leaves > 10x margin. */
    CHECK("matmul_forward out", out, outd, N * OC, 1e-5, 1e-6 * tol_sqrt(C));

    float *dout = drand(c, &r, N * OC, -1, 1);
    float *dinp = drand(c, &r, N * C, -1, 1); /* g0: backward must add */
    float *dw = drand(c, &r, OC * C, -1, 1);
    float *db = drand(c, &r, OC, -1, 1);
    double *dinp0 = hd(dinp, N * C), *dw0 = hd(dw, OC * C), *db0 = hd(db, OC);
    double *doutd = hd(dout, N * OC);
    double *gi = hzero(N * C), *gw = hzero(OC * C), *gb = hzero(OC);
    dt_ref_matmul_backward(gi, gw, gb, doutd, inpd, wref, N, C, OC);
    for (int call = 1; call <= 2; call++) {
        OK(c->K->matmul_backward(c->dev, NULL, dinp, dw, with_bias ? db : NULL,
                                   dout, inp, w, DT_F32, wdtype, N, C, OC));
        double *wi = accum(dinp0, gi, call, N * C);
        double *ww = accum(dw0, gw, call, OC * C);
        double *wb = accum(db0, gb, call, OC);
        /* dinp sums OC terms, dweight and dbias sum N terms (see forward). */
        CHECK("matmul_backward dinp", dinp, wi, N * C, 1e-5, 1e-6 * tol_sqrt(OC) * call);
        CHECK("matmul_backward dweight", dw, ww, OC * C, 1e-5, 1e-6 * tol_sqrt(N) * call);
        if (with_bias)
            CHECK("matmul_backward dbias", db, wb, OC, 1e-5, 1e-6 * tol_sqrt(N) * call);
        else /* NULL dbias: untouched */
            CHECK("matmul_backward dbias untouched", db, db0, OC, 0, 0);
        free(wi), free(ww), free(wb);
    }
    if (w != wf)
        dfree(c, w);
    dfree(c, wf), dfree(c, inp), dfree(c, out), dfree(c, dout);
    dfree(c, dinp), dfree(c, dw), dfree(c, db);
    if (bias)
        dfree(c, bias);
    free(wref), free(inpd), free(biasd), free(outd), free(dinp0), free(dw0);
    free(db0), free(doutd), free(gi), free(gw), free(gb);
}

static void test_matmul(void **state)
{
    matmul_case(&g_t1, 1, DT_F32, 1, 7, 13, 9);
    matmul_case(&g_t2, 2, DT_F32, 0, 7, 13, 9);
    matmul_case(&g_t1, 3, DT_BF16, 1, 7, 13, 9);
    matmul_case(&g_t2, 4, DT_BF16, 0, 5, 17, 11);
    matmul_case(&g_t1, 7, DT_F16, 1, 7, 13, 9);
    matmul_case(&g_t2, 8, DT_F16, 0, 5, 17, 11);
    /* Degenerate K: out = bias, gradients of inp/weight untouched. */
    matmul_case(&g_t1, 5, DT_F32, 1, 3, 1, 4);
}

/* A bf16 and an f16 weight larger than one widened block (2^21 floats):
 * the block loop's boundary and its last partial block. */
static void test_matmul_bf16_blocks(void **state)
{
    const int64_t C = 8, OC = (2 << 20) / 8 + 37;
    matmul_case(&g_t2, 6, DT_BF16, 1, 3, C, OC);
    matmul_case(&g_t2, 9, DT_F16, 0, 3, C, OC);
}

static void test_matmul_errors(void **state)
{
    cpu_t *c = &g_t1;
    float x[4] = {0};
    assert_status(c->K->matmul_forward(c->dev, NULL, x, x, x, NULL, DT_F32, DT_F32,
                                       -1, 2, 2),
                  DT_ERR_INVALID);
    assert_dev_msg("matmul_forward: N = -1 must be >= 0");
    assert_status(c->K->matmul_backward(c->dev, NULL, x, NULL, NULL, NULL, x,
                                        x, DT_F32, DT_F32, 1, 2, 2),
                  DT_ERR_INVALID);
    assert_dev_msg("matmul_backward: dout is NULL (2 elements)");
    /* No rows: a no-op, only the weight (15 elements) must exist. */
    OK(c->K->matmul_forward(c->dev, NULL, NULL, NULL, x, NULL, DT_F32, DT_F32, 0, 5, 3));
}

/* ============================================================ embedding */

typedef struct {
    double *out, *wte, *wpe, *dout;
    const int32_t *tok;
    int64_t B, T, C;
} emb_ctx_t;

static double emb_loss(void *p)
{
    emb_ctx_t *e = p;
    dt_ref_embedding_forward(e->out, e->tok, e->wte, e->wpe, e->B, e->T, e->C);
    return dotd(e->out, e->dout, e->B * e->T * e->C);
}

static void test_embedding(void **state)
{
    const int64_t B = 2, T = 5, C = 12, V = 17;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 11);
    for (int pass = 0; pass < 2; pass++) {
        cpu_t *c = pass ? &g_t2 : &g_t1;
        int32_t *tok = dalloc(c, B * T * 4);
        dt_ref_fill_int(&r, tok, B * T, (int32_t)V);
        tok[7] = tok[2]; /* a repeated token: its dwte row sums two rows */
        float *wte = drand(c, &r, V * C, -1, 1), *wpe = drand(c, &r, T * C, -1, 1);
        float *out = dalloc(c, B * T * C * 4);
        OK(c->K->embedding_forward(c->dev, NULL, out, tok, wte, wpe, DT_F32, B, T, C));
        double *wted = hd(wte, V * C), *wped = hd(wpe, T * C);
        double *outd = hzero(B * T * C);
        dt_ref_embedding_forward(outd, tok, wted, wped, B, T, C);
        /* one rounded f32 add: exact to u */
        CHECK("embedding_forward", out, outd, B * T * C, 1e-7, 0);

        float *dout = drand(c, &r, B * T * C, -1, 1);
        float *dwte = drand(c, &r, V * C, -1, 1), *dwpe = drand(c, &r, T * C, -1, 1);
        double *dwte0 = hd(dwte, V * C), *dwpe0 = hd(dwpe, T * C);
        double *doutd = hd(dout, B * T * C);
        double *gte = hzero(V * C), *gpe = hzero(T * C);
        dt_ref_embedding_backward(gte, gpe, doutd, tok, B, T, C);
        for (int call = 1; call <= 2; call++) {
            OK(c->K->embedding_backward(c->dev, NULL, dwte, dwpe, dout, tok, DT_F32, B, T, C));
            double *w1 = accum(dwte0, gte, call, V * C), *w2 = accum(dwpe0, gpe, call, T * C);
            /* at most 2B + 1 rounded adds per element */
            CHECK("embedding_backward dwte", dwte, w1, V * C, 1e-6, 1e-7);
            CHECK("embedding_backward dwpe", dwpe, w2, T * C, 1e-6, 1e-7);
            free(w1), free(w2);
        }
        if (pass == 0) {
            emb_ctx_t e = {.out = outd, .wte = wted, .wpe = wped, .dout = doutd,
                           .tok = tok, .B = B, .T = T, .C = C};
            fd_check("ref embedding dwte", wted, V * C, gte, emb_loss, &e);
            fd_check("ref embedding dwpe", wped, T * C, gpe, emb_loss, &e);
        }
        dfree(c, tok), dfree(c, wte), dfree(c, wpe), dfree(c, out), dfree(c, dout);
        dfree(c, dwte), dfree(c, dwpe);
        free(wted), free(wped), free(outd), free(dwte0), free(dwpe0), free(doutd);
        free(gte), free(gpe);
    }
}

/* ============================================================ layernorm */

typedef struct {
    double *out, *mean, *rstd, *inp, *w, *b, *dout;
    int64_t N, C;
} ln_ctx_t;

static double ln_loss(void *p)
{
    ln_ctx_t *l = p;
    dt_ref_layernorm_forward(l->out, l->mean, l->rstd, l->inp, l->w, l->b, l->N, l->C);
    return dotd(l->out, l->dout, l->N * l->C);
}

static void test_layernorm(void **state)
{
    const int64_t N = 7, C = 13;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 21);
    for (int pass = 0; pass < 2; pass++) {
        cpu_t *c = pass ? &g_t2 : &g_t1;
        /* offset 3: the mean must really be subtracted */
        float *inp = drand(c, &r, N * C, 1, 5);
        float *w = drand(c, &r, C, 0.5, 1.5), *b = drand(c, &r, C, -1, 1);
        float *out = dalloc(c, N * C * 4), *mean = dalloc(c, N * 4), *rstd = dalloc(c, N * 4);
        OK(c->K->layernorm_forward(c->dev, NULL, out, mean, rstd, inp, w, b, DT_F32, N, C));
        double *inpd = hd(inp, N * C), *wd = hd(w, C), *bd = hd(b, C);
        double *outd = hzero(N * C), *meand = hzero(N), *rstdd = hzero(N);
        dt_ref_layernorm_forward(outd, meand, rstdd, inpd, wd, bd, N, C);
        /* mean, rstd: the cpu computes them in double and rounds once
         * (rtol u); cuda sums in f32 block reductions and takes rsqrtf
         * (<= 2 ulp), so a few u: rtol 4e-7 */
        const double lnr = g_cuda ? 4e-7 : 1e-7;
        CHECK("layernorm_forward mean", mean, meand, N, lnr, 0);
        CHECK("layernorm_forward rstd", rstd, rstdd, N, lnr, 0);
        /* out: x - mean loses u |mean| ~ 3e-7 before scaling by rstd w
         * (< 2.5), then a few roundings of |out| < 4 */
        CHECK("layernorm_forward out", out, outd, N * C, 1e-5, 2e-6);

        float *dout = drand(c, &r, N * C, -1, 1);
        float *dinp = drand(c, &r, N * C, -1, 1), *dw = drand(c, &r, C, -1, 1);
        float *db = drand(c, &r, C, -1, 1);
        double *dinp0 = hd(dinp, N * C), *dw0 = hd(dw, C), *db0 = hd(db, C);
        double *doutd = hd(dout, N * C);
        double *gi = hzero(N * C), *gw = hzero(C), *gb = hzero(C);
        dt_ref_layernorm_backward(gi, gw, gb, doutd, inpd, wd, meand, rstdd, N, C);
        for (int call = 1; call <= 2; call++) {
            OK(c->K->layernorm_backward(c->dev, NULL, dinp, dw, db, dout, inp, w,
                                          mean, rstd, DT_F32, N, C));
            double *w1 = accum(dinp0, gi, call, N * C), *w2 = accum(dw0, gw, call, C);
            double *w3 = accum(db0, gb, call, C);
            /* dinp: two C-term means of |terms| < 1.5 times rstd (~0.9) plus
             * the f32 mean/rstd from forward (rel u): atol 1e-6 sqrt(C) */
            CHECK("layernorm_backward dinp", dinp, w1, N * C, 1e-5, 1e-6 * tol_sqrt(C) * call);
            /* dweight, dbias: N-term sums */
            CHECK("layernorm_backward dweight", dw, w2, C, 1e-5, 1e-6 * tol_sqrt(N) * call);
            CHECK("layernorm_backward dbias", db, w3, C, 1e-5, 1e-6 * tol_sqrt(N) * call);
            free(w1), free(w2), free(w3);
        }
        if (pass == 0) {
            ln_ctx_t l = {.out = outd, .mean = meand, .rstd = rstdd, .inp = inpd,
                          .w = wd, .b = bd, .dout = doutd, .N = N, .C = C};
            /* fd_check re-runs the forward, overwriting mean/rstd: the
             * analytic gradients above were taken first. */
            double *mean_keep = hzero(N), *rstd_keep = hzero(N);
            memcpy(mean_keep, meand, N * sizeof(double));
            memcpy(rstd_keep, rstdd, N * sizeof(double));
            l.mean = mean_keep;
            l.rstd = rstd_keep;
            fd_check("ref layernorm dinp", inpd, N * C, gi, ln_loss, &l);
            fd_check("ref layernorm dweight", wd, C, gw, ln_loss, &l);
            fd_check("ref layernorm dbias", bd, C, gb, ln_loss, &l);
            free(mean_keep), free(rstd_keep);
        }
        dfree(c, inp), dfree(c, w), dfree(c, b), dfree(c, out), dfree(c, mean);
        dfree(c, rstd), dfree(c, dout), dfree(c, dinp), dfree(c, dw), dfree(c, db);
        free(inpd), free(wd), free(bd), free(outd), free(meand), free(rstdd);
        free(dinp0), free(dw0), free(db0), free(doutd), free(gi), free(gw), free(gb);
    }
}

/* ================================================================= GELU */

typedef struct {
    double *inp, *out, *dout;
    int64_t n;
} gelu_ctx_t;

static double gelu_loss(void *p)
{
    gelu_ctx_t *g = p;
    dt_ref_gelu_forward(g->out, g->inp, g->n);
    return dotd(g->out, g->dout, g->n);
}

static void test_gelu(void **state)
{
    const int64_t n = 1001;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 31);
    cpu_t *c = &g_t2;
    float *inp = drand(c, &r, n, -4, 4), *out = dalloc(c, n * 4);
    /* the tails, where exp(-2u) over- and underflows */
    static const float tails[] = {-100.0f, -30.0f, -10.0f, -5.5f, 0.0f,
                                  -0.0f, 5.5f, 10.0f, 30.0f, 100.0f};
    memcpy(inp + 500, tails, sizeof tails);
    OK(c->K->gelu_forward(c->dev, NULL, out, inp, DT_F32, n));
    double *inpd = hd(inp, n), *outd = hzero(n);
    dt_ref_gelu_forward(outd, inpd, n);
    /* tanhf is within 2 ulp; for x < 0, 1 + tanh cancels, so the error
     * is absolute: |x| 2 u < 1e-6 */
    CHECK("gelu_forward", out, outd, n, 1e-5, 1e-6);

    float *dout = drand(c, &r, n, -1, 1), *dinp = drand(c, &r, n, -1, 1);
    double *dinp0 = hd(dinp, n), *doutd = hd(dout, n), *g = hzero(n);
    dt_ref_gelu_backward(g, inpd, doutd, n);
    for (int call = 1; call <= 2; call++) {
        OK(c->K->gelu_backward(c->dev, NULL, dinp, inp, dout, DT_F32, n));
        double *w = accum(dinp0, g, call, n);
        /* as forward; 1 - tanh^2 near |tanh| = 1 is absolute error too */
        CHECK("gelu_backward", dinp, w, n, 1e-5, 1e-6 * call);
        free(w);
    }
    /* the first 500 (before the tails, whose |gelu| ~ 100 would raise the
     * rounding floor of L beyond fd_check's atol) */
    gelu_ctx_t gc = {.inp = inpd, .out = outd, .dout = doutd, .n = 500};
    fd_check("ref gelu dinp", inpd, 500, g, gelu_loss, &gc);
    dfree(c, inp), dfree(c, out), dfree(c, dout), dfree(c, dinp);
    free(inpd), free(outd), free(dinp0), free(doutd), free(g);
}

/* ============================================================ attention */

typedef struct {
    double *out, *att, *qkv, *dout;
    int64_t B, T, C, NH;
} attn_ctx_t;

static double attn_loss(void *p)
{
    attn_ctx_t *a = p;
    dt_ref_attention_forward(a->out, a->att, a->qkv, a->B, a->T, a->C, a->NH);
    return dotd(a->out, a->dout, a->B * a->T * a->C);
}

/* The causal part of att (the rest is unspecified by the contract). */
static int64_t lower_tri(double *dst_d, float *dst_f, const double *src_d,
                         const float *src_f, int64_t rows, int64_t T)
{
    int64_t k = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t t2 = 0; t2 <= r % T; t2++, k++) {
            if (dst_d)
                dst_d[k] = src_d[r * T + t2];
            if (dst_f)
                dst_f[k] = src_f[r * T + t2];
        }
    return k;
}

/* The cpu's attention state is the (B, NH, T, T) f32 probabilities: the
 * test reads them as such (the layout is the cpu's own, device.h).  cuda's
 * is the (B, NH, T) f32 log-sum-exp of each row, checked here against
 * the reference's probabilities (lse = s_t - log p_t for any causal key
 * t, taken at the diagonal).  The buffer is sized by
 * attention_state_bytes, with guard bytes after it that forward must
 * leave alone. */
static void attention_case(int64_t B, int64_t T, int64_t C, int64_t NH, uint64_t seed,
                           int fd)
{
    const int64_t n3 = B * T * 3 * C, natt = B * NH * T * T, no = B * T * C;
    enum { GUARD = 64 };
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, seed);
    for (int pass = 0; pass < 2; pass++) {
        cpu_t *c = pass ? &g_t2 : &g_t1;
        uint64_t sb = 0;
        OK(c->K->attention_state_bytes(B, T, C, NH, DT_F32, &sb));
        assert_int_equal(sb, (g_cuda ? B * NH * T : natt) * 4);
        float *qkv = drand(c, &r, n3, -1.5, 1.5);
        float *out = dalloc(c, no * 4), *att = dalloc(c, (int64_t)sb + GUARD);
        unsigned char *guard = (unsigned char *)att + sb;
        memset(guard, 0xA5, GUARD);
        OK(c->K->attention_forward(c->dev, NULL, out, att, qkv, DT_F32, B, T, C, NH));
        for (int i = 0; i < GUARD; i++)
            assert_int_equal(guard[i], 0xA5);
        double *qkvd = hd(qkv, n3), *outd = hzero(no), *attd = hzero(natt);
        dt_ref_attention_forward(outd, attd, qkvd, B, T, C, NH);
        double *ld = hzero(natt);
        float *lf = malloc(natt * sizeof(float));
        if (g_cuda) {
            /* lse of row (b, h, t) = s_tt - log p_tt, s_tt = q_t.k_t / sqrt(hs) */
            const int64_t hs = C / NH;
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < NH; h++)
                    for (int64_t t = 0; t < T; t++) {
                        const double *q = qkvd + (b * T + t) * 3 * C + h * hs;
                        double dot = 0.0;
                        for (int64_t i = 0; i < hs; i++)
                            dot += q[i] * q[C + i];
                        int64_t row = (b * NH + h) * T + t;
                        ld[row] = dot / sqrt((double)hs) - log(attd[row * T + t]);
                    }
            /* a T-term sum of exponentials, a log: a few u of |lse| < 4 */
            CHECK("attention_forward lse", att, ld, B * NH * T, 1e-6, 1e-6);
        } else {
            int64_t nl = lower_tri(ld, lf, attd, att, B * NH * T, T);
            /* softmax of hs=4-term dots: a few u relative per probability */
            CHECK("attention_forward att", lf, ld, nl, 1e-5, 1e-7);
        }
        /* out: T-term weighted sums of |v| < 1.5 */
        CHECK("attention_forward out", out, outd, no, 1e-5, 1e-6 * tol_sqrt(T));

        float *dout = drand(c, &r, no, -1, 1), *dqkv = drand(c, &r, n3, -1, 1);
        double *dqkv0 = hd(dqkv, n3), *doutd = hd(dout, no), *g = hzero(n3);
        dt_ref_attention_backward(g, doutd, qkvd, attd, B, T, C, NH);
        for (int call = 1; call <= 2; call++) {
            OK(c->K->attention_backward(c->dev, NULL, dqkv, dout, qkv, out, att, DT_F32, B, T, C,
                                        NH));
            double *w = accum(dqkv0, g, call, n3);
            /* sums over T keys of hs-term dots, using the f32 att: sqrt(T hs) */
            CHECK("attention_backward dqkv", dqkv, w, n3, 1e-5,
                  1e-6 * tol_sqrt(T * (C / NH)) * call);
            free(w);
        }
        if (pass == 0 && fd) {
            attn_ctx_t a = {.out = outd, .att = hzero(natt), .qkv = qkvd,
                            .dout = doutd, .B = B, .T = T, .C = C, .NH = NH};
            fd_check("ref attention dqkv", qkvd, n3, g, attn_loss, &a);
            free(a.att);
        }
        dfree(c, qkv), dfree(c, out), dfree(c, att), dfree(c, dout), dfree(c, dqkv);
        free(qkvd), free(outd), free(attd), free(ld), free(lf), free(dqkv0);
        free(doutd), free(g);
    }
}

/* The small case with finite differences of the reference; a longer one
 * (T = 67, hs = 16: rows longer than a warp, scores matrices of odd size,
 * heads at 64-byte offsets) against the reference alone. */
static void test_attention(void **state)
{
    attention_case(2, 5, 12, 3, 41, 1);
    attention_case(2, 67, 48, 3, 43, 0);
}

static void test_attention_errors(void **state)
{
    cpu_t *c = &g_t1;
    float x[64] = {0};
    assert_status(c->K->attention_forward(c->dev, NULL, x, x, x, DT_F32, 1, 2, 10, 3),
                  DT_ERR_INVALID);
    assert_dev_msg("attention_forward: C = 10 is not a multiple of NH = 3");
    assert_status(c->K->attention_backward(c->dev, NULL, x, x, x, NULL, x, DT_F32, 1, 2, 6, 3),
                  DT_ERR_INVALID);
    assert_dev_msg("attention_backward: out is NULL (36 elements)");
}

/* What the cpu's attention keeps, asked without an instance: B NH T^2
 * floats for any C, f32 or bf16 activations alike (the probabilities stay
 * f32); refusals without a message (nothing to set it on). */
static void test_attention_state_bytes(void **state)
{
    const dt_kernels_v1_t *K = cpu_ops()->kernels();
    static const int64_t shapes[][4] = {
        {1, 1, 1, 1}, {2, 5, 12, 3}, {8, 1024, 768, 12}, {3, 7, 0, 1}, {0, 9, 4, 2}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int bf = 0; bf < 2; bf++) {
            const int64_t *s = shapes[i];
            uint64_t sb = 1;
            OK(K->attention_state_bytes(s[0], s[1], s[2], s[3], bf ? DT_BF16 : DT_F32, &sb));
            assert_int_equal(sb, (uint64_t)(s[0] * s[3] * s[1] * s[1]) * 4);
        }
    uint64_t sb = 123;
    assert_int_equal(K->attention_state_bytes(2, 5, 12, 3, DT_F16, &sb), DT_ERR_UNSUPPORTED);
    assert_int_equal(K->attention_state_bytes(2, 5, 10, 3, DT_F32, &sb), DT_ERR_INVALID);
    assert_int_equal(K->attention_state_bytes(2, 5, 12, 0, DT_F32, &sb), DT_ERR_INVALID);
    assert_int_equal(K->attention_state_bytes(-1, 5, 12, 3, DT_F32, &sb), DT_ERR_INVALID);
    assert_int_equal(K->attention_state_bytes((int64_t)1 << 40, (int64_t)1 << 20, 12, 3, DT_F32,
                                              &sb),
                     DT_ERR_INVALID);
    assert_int_equal(sb, 123); /* untouched on refusal */
    assert_int_equal(K->attention_state_bytes(2, 5, 12, 3, DT_F32, NULL), DT_ERR_INVALID);
}

/* ============================================== softmax + cross-entropy */

typedef struct {
    double *losses, *probs, *logits;
    const int32_t *targets;
    double dloss;
    int64_t N, V;
} xent_ctx_t;

static double xent_loss(void *p)
{
    xent_ctx_t *x = p;
    dt_ref_softmax_xent_forward(x->losses, x->probs, x->logits, x->targets, x->N, x->V);
    double s = 0.0;
    for (int64_t i = 0; i < x->N; i++)
        s += x->losses[i];
    return x->dloss * s;
}

static void test_softmax_xent(void **state)
{
    const int64_t N = 7, V = 17;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 51);
    for (int pass = 0; pass < 2; pass++) {
        cpu_t *c = pass ? &g_t2 : &g_t1;
        float *logits = drand(c, &r, N * V, -4, 4);
        int32_t *tg = dalloc(c, N * 4);
        dt_ref_fill_int(&r, tg, N, (int32_t)V);
        float *losses = dalloc(c, N * 4), *probs = dalloc(c, N * V * 4);
        OK(c->K->softmax_xent_forward(c->dev, NULL, losses, probs, logits, tg, DT_F32, N, V));
        double *ld = hd(logits, N * V), *lossd = hzero(N), *probd = hzero(N * V);
        dt_ref_softmax_xent_forward(lossd, probd, ld, tg, N, V);
        /* expf within 1 ulp, the sum in double: probs a few u relative */
        CHECK("softmax_xent_forward probs", probs, probd, N * V, 1e-5, 1e-8);
        /* log-sum-exp in double minus one f32 logit: absolute u |logit| */
        CHECK("softmax_xent_forward losses", losses, lossd, N, 1e-5, 1e-6);

        const float dloss = 1.0f / (float)N;
        float *dl = drand(c, &r, N * V, -1, 1);
        double *dl0 = hd(dl, N * V), *g = hzero(N * V);
        double *probf = hd(probs, N * V);
        dt_ref_softmax_xent_backward(g, probd, tg, dloss, N, V);
        for (int call = 1; call <= 2; call++) {
            OK(c->K->softmax_xent_backward(c->dev, NULL, dl, probs, tg, DT_F32, dloss, N, V));
            double *w = accum(dl0, g, call, N * V);
            /* element-wise from the f32 probs: rel 1e-5 of |g| < 1/N, plus
             * the final add into |g0| < 1 (u) */
            CHECK("softmax_xent_backward", dl, w, N * V, 1e-5, 1e-7 * call);
            free(w);
        }
        if (pass == 0) {
            xent_ctx_t x = {.losses = hzero(N), .probs = hzero(N * V), .logits = ld,
                            .targets = tg, .dloss = dloss, .N = N, .V = V};
            fd_check("ref softmax_xent dlogits", ld, N * V, g, xent_loss, &x);
            free(x.losses), free(x.probs);
        }
        dfree(c, logits), dfree(c, tg), dfree(c, losses), dfree(c, probs), dfree(c, dl);
        free(ld), free(lossd), free(probd), free(dl0), free(g), free(probf);
    }
}

static void test_softmax_xent_extremes(void **state)
{
    /* A logit 200 below the max: probs[target] underflows in f32, but the
     * loss stays finite (log-sum-exp form): loss = 200 + log(1 + e^-200). */
    cpu_t *c = &g_t1;
    float *logits = dalloc(c, 3 * 4), *losses = dalloc(c, 4), *probs = dalloc(c, 3 * 4);
    int32_t *tg = dalloc(c, 4);
    logits[0] = 100.0f, logits[1] = -100.0f, logits[2] = 100.0f;
    tg[0] = 1;
    OK(c->K->softmax_xent_forward(c->dev, NULL, losses, probs, logits, tg, DT_F32, 1, 3));
    assert_true(fabsf(losses[0] - (200.0f + logf(2.0f))) < 1e-4f);
    assert_true(probs[1] == 0.0f && fabsf(probs[0] - 0.5f) < 1e-7f);
    tg[0] = 3;
    assert_status(c->K->softmax_xent_forward(c->dev, NULL, losses, probs, logits,
                                               tg, DT_F32, 1, 3),
                  DT_ERR_INVALID);
    assert_dev_msg("softmax_xent_forward: targets[0] = 3 is outside [0, 3)");
    dfree(c, logits), dfree(c, losses), dfree(c, probs), dfree(c, tg);
}

/* ======================================= vocabulary-parallel (tp) kernels */

/* The vocabulary of 17 split over 3 "ranks" as tensor parallelism splits
 * it (6, 6, 5 rows), each rank's kernels run on its columns and the
 * reductions between the cross-entropy's phases done here on the host:
 * the embedding summed over the ranks is the whole one to the bit (one
 * nonzero row each, wpe added by rank 0), its gradients are the whole
 * one's rows; the loss is the same bits on every rank and the whole
 * softmax's within 1e-6 (its sums of exponentials in another order), the
 * probabilities and their gradient the whole one's columns. */
static void test_vocab_parallel(void **state)
{
    enum { P = 3 };
    const int64_t B = 2, T = 5, C = 12, V = 17, N = B * T;
    const int64_t v0[P] = {0, 6, 12}, nv[P] = {6, 6, 5};
    cpu_t *c = &g_t1;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 71);
    int32_t *tok = dalloc(c, N * 4), *tg = dalloc(c, N * 4);
    dt_ref_fill_int(&r, tok, N, (int32_t)V);
    dt_ref_fill_int(&r, tg, N, (int32_t)V);
    float *wte = drand(c, &r, V * C, -1, 1), *wpe = drand(c, &r, T * C, -1, 1);
    float *whole = dalloc(c, N * C * 4), *sum = dalloc(c, N * C * 4), *out = dalloc(c, N * C * 4);
    OK(c->K->embedding_forward(c->dev, NULL, whole, tok, wte, wpe, DT_F32, B, T, C));
    memset(sum, 0, (size_t)(N * C) * 4);
    for (int k = 0; k < P; k++) {
        OK(c->K->vocab_embedding_forward(c->dev, NULL, out, tok, wte + v0[k] * C,
                                         k == 0 ? wpe : NULL, DT_F32, B, T, C, v0[k], nv[k]));
        for (int64_t i = 0; i < N * C; i++)
            sum[i] += out[i];
    }
    assert_memory_equal(sum, whole, (size_t)(N * C) * 4);
    float *dout = drand(c, &r, N * C, -1, 1);
    float *dwte = dalloc(c, V * C * 4), *dwpe = dalloc(c, T * C * 4);
    float *dwte_k = dalloc(c, V * C * 4), *dwpe_k = dalloc(c, T * C * 4);
    memset(dwte, 0, (size_t)(V * C) * 4), memset(dwpe, 0, (size_t)(T * C) * 4);
    OK(c->K->embedding_backward(c->dev, NULL, dwte, dwpe, dout, tok, DT_F32, B, T, C));
    for (int k = 0; k < P; k++) {
        memset(dwte_k, 0, (size_t)(V * C) * 4), memset(dwpe_k, 0, (size_t)(T * C) * 4);
        OK(c->K->vocab_embedding_backward(c->dev, NULL, dwte_k, dwpe_k, dout, tok, DT_F32, B,
                                          T, C, v0[k], nv[k]));
        assert_memory_equal(dwte_k, dwte + v0[k] * C, (size_t)(nv[k] * C) * 4);
        assert_memory_equal(dwpe_k, dwpe, (size_t)(T * C) * 4);
    }

    float *logits = drand(c, &r, N * V, -4, 4);
    float *losses = dalloc(c, N * 4), *probs = dalloc(c, N * V * 4);
    OK(c->K->softmax_xent_forward(c->dev, NULL, losses, probs, logits, tg, DT_F32, N, V));
    float *part[P], *st[P], *lk[P], *pk[P];
    for (int k = 0; k < P; k++) {
        part[k] = dalloc(c, N * nv[k] * 4), pk[k] = dalloc(c, N * nv[k] * 4);
        st[k] = dalloc(c, 3 * N * 4), lk[k] = dalloc(c, N * 4);
        for (int64_t i = 0; i < N; i++)
            memcpy(part[k] + i * nv[k], logits + i * V + v0[k], (size_t)nv[k] * 4);
    }
    for (int phase = 0; phase < 3; phase++) {
        for (int k = 0; k < P; k++)
            OK(c->K->vocab_xent_forward(c->dev, NULL, phase, st[k], lk[k], pk[k], part[k], tg,
                                        DT_F32, N, v0[k], nv[k]));
        /* the reductions: the row maxima, then the sums (rank order) */
        for (int64_t i = phase == 0 ? 0 : N; phase < 2 && i < (phase == 0 ? N : 3 * N); i++) {
            float a = st[0][i];
            for (int k = 1; k < P; k++)
                a = phase == 0 ? fmaxf(a, st[k][i]) : a + st[k][i];
            for (int k = 0; k < P; k++)
                st[k][i] = a;
        }
    }
    for (int k = 0; k < P; k++) {
        assert_memory_equal(lk[k], lk[0], (size_t)N * 4);
        for (int64_t i = 0; i < N; i++)
            for (int64_t v = 0; v < nv[k]; v++)
                assert_true(fabsf(pk[k][i * nv[k] + v] - probs[i * V + v0[k] + v]) <= 1e-6f);
    }
    for (int64_t i = 0; i < N; i++)
        assert_true(fabsf(lk[0][i] - losses[i]) <= 1e-6f * fmaxf(1.0f, fabsf(losses[i])));
    float *dl = dalloc(c, N * V * 4);
    memset(dl, 0, (size_t)(N * V) * 4);
    OK(c->K->softmax_xent_backward(c->dev, NULL, dl, probs, tg, DT_F32, 0.25f, N, V));
    for (int k = 0; k < P; k++) {
        float *dk = dalloc(c, N * nv[k] * 4);
        memset(dk, 0, (size_t)(N * nv[k]) * 4);
        OK(c->K->vocab_xent_backward(c->dev, NULL, dk, pk[k], tg, DT_F32, 0.25f, N, v0[k],
                                     nv[k]));
        for (int64_t i = 0; i < N; i++)
            for (int64_t v = 0; v < nv[k]; v++)
                assert_true(fabsf(dk[i * nv[k] + v] - dl[i * V + v0[k] + v]) <= 1e-6f);
        dfree(c, dk);
    }
    /* refusals, named */
    assert_status(c->K->vocab_xent_forward(c->dev, NULL, 3, st[0], lk[0], pk[0], part[0], tg,
                                           DT_F32, N, 0, 6),
                  DT_ERR_INVALID);
    assert_dev_msg("vocab_xent_forward: phase 3 (0, 1 or 2)");
    assert_status(c->K->vocab_embedding_forward(c->dev, NULL, out, tok, wte, NULL, DT_F32, B, T,
                                                C, 4, 0),
                  DT_ERR_INVALID);
    assert_dev_msg("vocab_embedding_forward: vocabulary ids [4, 4 + 0)");
    for (int k = 0; k < P; k++)
        dfree(c, part[k]), dfree(c, st[k]), dfree(c, lk[k]), dfree(c, pk[k]);
    dfree(c, tok), dfree(c, tg), dfree(c, wte), dfree(c, wpe), dfree(c, whole), dfree(c, sum);
    dfree(c, out), dfree(c, dout), dfree(c, dwte), dfree(c, dwpe), dfree(c, dwte_k);
    dfree(c, dwpe_k), dfree(c, logits), dfree(c, losses), dfree(c, probs), dfree(c, dl);
}

/* ==================================================== residual and axpy */

static void test_residual_axpy_scale(void **state)
{
    const int64_t n = 1003;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 61);
    cpu_t *c = &g_t2;
    float *a = drand(c, &r, n, -2, 2), *b = drand(c, &r, n, -2, 2), *o = dalloc(c, n * 4);
    OK(c->K->residual_forward(c->dev, NULL, o, a, b, DT_F32, n));
    /* one f32 add is correctly rounded, and so is the rounded double sum:
     * bit-exact */
    for (int64_t i = 0; i < n; i++)
        assert_true(o[i] == (float)((double)a[i] + (double)b[i]));
    /* in place (out aliases a) */
    float *a2 = dalloc(c, n * 4);
    memcpy(a2, a, n * 4);
    OK(c->K->residual_forward(c->dev, NULL, a2, a2, b, DT_F32, n));
    assert_memory_equal(a2, o, n * 4);

    double *yd = hd(a, n);
    OK(c->K->axpy(c->dev, NULL, a, b, DT_F32, -0.75f, n));
    for (int64_t i = 0; i < n; i++)
        yd[i] += -0.75 * (double)b[i];
    /* a multiply and an add: two roundings of |y| < 4 */
    CHECK("axpy", a, yd, n, 1e-6, 1e-6);
    assert_status(c->K->axpy(c->dev, NULL, a, a, DT_F32, 1.0f, n), DT_ERR_INVALID);
    assert_dev_msg("axpy: x and y are the same buffer");

    memcpy(a2, b, n * 4);
    OK(c->K->scale(c->dev, NULL, a2, DT_F32, 0.3f, n));
    for (int64_t i = 0; i < n; i++) /* one rounding: bit-exact */
        assert_true(a2[i] == (float)((double)b[i] * (double)0.3f));
    dfree(c, a), dfree(c, b), dfree(c, o), dfree(c, a2);
    free(yd);
}

/* =========================================================== optimizers */

static void test_adamw(void **state)
{
    const int64_t n = 1003;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 71);
    cpu_t *c = &g_t2;
    float *p = drand(c, &r, n, -1, 1), *m = dalloc(c, n * 4), *v = dalloc(c, n * 4);
    memset(m, 0, n * 4);
    memset(v, 0, n * 4);
    double *pd = hd(p, n), *md = hzero(n), *vd = hzero(n);
    float *g = dalloc(c, n * 4);
    for (int64_t t = 1; t <= 5; t++) {
        dt_ref_fill_uniform(&r, g, n, -1, 1); /* fresh gradient each step */
        double *gd = hd(g, n);
        OK(c->K->adamw_update(c->dev, NULL, p, g, m, v, DT_F32, n, lr, b1, b2, eps, wd, gs, t));
        dt_ref_adamw_update(pd, gd, md, vd, n, lr, b1, b2, eps, wd, gs, t);
        /* m: b1 m and (1-b1) g may cancel, so its error is absolute, u
         * times the terms (< 0.5): atol 1e-7.  v: no cancellation, a few
         * roundings a step, rel ~ 2 t u.  param: each step's
         * update (~lr = 1e-2) is good to ~1e-5 relative, the stored param
         * (|p| < 1.1) is rounded each step: 5 steps * u ~ 3e-7 absolute.
         * A wrong bias correction or decay moves p by > 1e-4. */
        CHECK("adamw m", m, md, n, 1e-5, 1e-7);
        CHECK("adamw v", v, vd, n, 1e-5, 1e-12);
        CHECK("adamw param", p, pd, n, 1e-6, 1e-6);
        free(gd);
    }
    /* late step: bias corrections -> 1, still finite */
    OK(c->K->adamw_update(c->dev, NULL, p, g, m, v, DT_F32, n, lr, b1, b2, eps, wd, gs, 100000));
    for (int64_t i = 0; i < n; i++)
        assert_true(isfinite(p[i]));
    assert_status(c->K->adamw_update(c->dev, NULL, p, g, m, v, DT_F32, n, lr, b1, b2, eps,
                                       wd, gs, 0),
                  DT_ERR_INVALID);
    assert_dev_msg("adamw_update: step t = 0; it is 1-based");
    assert_status(c->K->adamw_update(c->dev, NULL, p, g, m, v, DT_F32, n, lr, 1.0f, b2, eps,
                                       wd, gs, 1),
                  DT_ERR_INVALID);
    assert_dev_msg("adamw_update: beta1 = 1, beta2 = 0.999 must be in [0, 1)");
    dfree(c, p), dfree(c, m), dfree(c, v), dfree(c, g);
    free(pd), free(md), free(vd);
}

static void sgd_case(int nesterov, float momentum, int with_buf)
{
    const int64_t n = 1003;
    const float lr = 0.05f, wd = 0.01f, gs = 0.5f;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 81 + (uint64_t)nesterov);
    cpu_t *c = &g_t1;
    float *p = drand(c, &r, n, -1, 1), *g = dalloc(c, n * 4);
    float *mom = with_buf ? dalloc(c, n * 4) : NULL;
    if (mom)
        memset(mom, 0, n * 4);
    double *pd = hd(p, n), *momd = with_buf ? hzero(n) : NULL;
    for (int step = 0; step < 4; step++) {
        dt_ref_fill_uniform(&r, g, n, -1, 1);
        double *gd = hd(g, n);
        OK(c->K->sgd_update(c->dev, NULL, p, g, mom, DT_F32, n, lr, momentum, wd, nesterov, gs));
        dt_ref_sgd_update(pd, gd, momd, n, lr, momentum, wd, nesterov, gs);
        /* a few roundings per step of |p| < 1.5, |mom| < 2.5 */
        CHECK("sgd param", p, pd, n, 1e-6, 1e-6);
        if (mom)
            CHECK("sgd momentum", mom, momd, n, 1e-5, 1e-6);
        free(gd);
    }
    dfree(c, p), dfree(c, g);
    if (mom)
        dfree(c, mom);
    free(pd), free(momd);
}

static void test_sgd(void **state)
{
    sgd_case(0, 0.9f, 1);
    sgd_case(1, 0.9f, 1);
    sgd_case(0, 0.0f, 0); /* no momentum buffer needed */
    cpu_t *c = &g_t1;
    float x[4] = {0};
    assert_status(c->K->sgd_update(c->dev, NULL, x, x, NULL, DT_F32, 4, 0.1f, 0.9f, 0, 0, 1),
                  DT_ERR_INVALID);
    assert_dev_msg("sgd_update: mom is NULL (4 elements)");
}

/* ================================================================ sumsq */

static void test_sumsq(void **state)
{
    const int64_t n = 100003;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 91);
    cpu_t *c = &g_t2;
    float *x = drand(c, &r, n, -2, 2);
    uint16_t *xb = dalloc(c, n * 2), *xh = dalloc(c, n * 2);
    double want = 0.0, wantb = 0.0, wanth = 0.0;
    for (int64_t i = 0; i < n; i++) {
        xb[i] = dt_ref_f32_to_bf16(x[i]);
        xh[i] = dt_ref_f32_to_f16(x[i]);
        want += (double)x[i] * x[i];
        wantb += dt_ref_bf16_to_double(xb[i]) * dt_ref_bf16_to_double(xb[i]);
        wanth += dt_ref_f16_to_double(xh[i]) * dt_ref_f16_to_double(xh[i]);
    }
    double *out = dalloc(c, sizeof(double));
    /* squares of floats are exact in double; the two sums differ only in
     * double rounding: n 2^-53 ~ 1e-11 relative at worst */
    OK(c->K->sumsq(c->dev, NULL, out, x, DT_F32, n));
    CHECK_D("sumsq f32", out, &want, 1, 1e-11, 0);
    OK(c->K->sumsq(c->dev, NULL, out, xb, DT_BF16, n));
    CHECK_D("sumsq bf16", out, &wantb, 1, 1e-11, 0);
    OK(c->K->sumsq(c->dev, NULL, out, xh, DT_F16, n));
    CHECK_D("sumsq f16", out, &wanth, 1, 1e-11, 0);
    /* written, not accumulated */
    *out = 12345.0;
    OK(c->K->sumsq(c->dev, NULL, out, x, DT_F32, 0));
    assert_true(*out == 0.0);
    /* NaN and Inf propagate */
    float keep = x[777];
    x[777] = NAN;
    OK(c->K->sumsq(c->dev, NULL, out, x, DT_F32, n));
    assert_true(isnan(*out));
    x[777] = INFINITY;
    OK(c->K->sumsq(c->dev, NULL, out, x, DT_F32, n));
    assert_true(isinf(*out));
    x[777] = keep;
    xh[5] = 0x7C00; /* f16 +inf */
    OK(c->K->sumsq(c->dev, NULL, out, xh, DT_F16, n));
    assert_true(isinf(*out));
    xb[5] = 0x7FC1; /* bf16 NaN */
    OK(c->K->sumsq(c->dev, NULL, out, xb, DT_BF16, n));
    assert_true(isnan(*out));
    assert_status(c->K->sumsq(c->dev, NULL, out, x, DT_F64, n), DT_ERR_UNSUPPORTED);
    if (g_cuda)
        assert_dev_msg("sumsq: f64 elements: unsupported (the cuda device runs f32, bf16 "
                       "or f16 elements)");
    else
        assert_dev_msg("sumsq: dtype f64; only f32, bf16, f16");
    dfree(c, x), dfree(c, xb), dfree(c, xh), dfree(c, out);
}

/* The host's sum of squares (dtrain/sdk/norm.h: a gradient read from an
 * offload tier piece by piece) gives the cpu kernel's bits exactly, fed in
 * uneven pieces that cut its 64 Ki blocks anywhere, at 1 and 2 threads. */
static void test_sumsq_host_run(void **state)
{
    const int64_t n = 300007; /* 4 whole blocks and a partial one */
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 93);
    cpu_t *cs[] = {&g_t1, &g_t2};
    for (int t = 0; t < 2; t++) {
        cpu_t *c = cs[t];
        float *x = drand(c, &r, n, -3, 3);
        double *out = dalloc(c, sizeof(double));
        OK(c->K->sumsq(c->dev, NULL, out, x, DT_F32, n));
        const uint64_t pieces[] = {1, 7, 65535, 65537, 1000, 99999};
        dt_sumsq_run_t run;
        dt_sumsq_run_init(&run, n);
        uint64_t at = 0;
        for (int i = 0; at < (uint64_t)n; i = (i + 1) % 6) {
            uint64_t k = (uint64_t)n - at < pieces[i] ? (uint64_t)n - at : pieces[i];
            dt_sumsq_run_add(&run, x + at, k);
            at += k;
        }
        double host = dt_sumsq_run_end(&run);
        assert_memory_equal(&host, out, sizeof host);
        /* and it is the sum: within double rounding of the plain one */
        double plain = 0.0;
        for (int64_t i = 0; i < n; i++)
            plain += (double)x[i] * x[i];
        assert_true(fabs(plain - host) <= 1e-11 * host);
        dfree(c, x), dfree(c, out);
    }
}

/* ================================================================ casts */

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Cast one f32 through the device (device memory: a GPU kernel cannot
 * read the host's stack). */
static uint16_t dev_to16(int dt, float x)
{
    cpu_t *c = &g_t1;
    float *in = dalloc(c, 4);
    uint16_t *o = dalloc(c, 2);
    *in = x;
    *o = 0xDEAD;
    OK(c->K->cast(c->dev, NULL, o, dt, in, DT_F32, 1));
    uint16_t got = *o;
    dfree(c, in), dfree(c, o);
    return got;
}

static void test_cast_known_patterns(void **state)
{
    struct {
        float x;
        uint16_t bf, h;
    } k[] = {
        {1.0f, 0x3F80, 0x3C00},
        {-2.0f, 0xC000, 0xC000},
        {0.0f, 0x0000, 0x0000},
        {-0.0f, 0x8000, 0x8000},
        {65504.0f, 0x4780, 0x7BFF},    /* largest f16; bf16 rounds up */
        {65519.9921875f, 0x4780, 0x7BFF}, /* just below the f16 tie */
        {65520.0f, 0x4780, 0x7C00},    /* f16 tie -> even = inf */
        {0x1.0p-24f, 0x3380, 0x0001},  /* smallest f16 subnormal */
        {0x1.0p-25f, 0x3300, 0x0000},  /* f16 tie 0 / 1 -> 0 */
        {0x1.8p-25f, 0x3340, 0x0001},  /* above the tie */
        {0x1.8p-24f, 0x33C0, 0x0002},  /* f16 tie 1 / 2 -> 2 */
        {0x1.0p-14f, 0x3880, 0x0400},  /* smallest f16 normal */
        {0x1.FFCp-15f, 0x3880, 0x0400}, /* largest subnormal rounds up */
        {1.0f + 0x1.0p-8f, 0x3F80, 0x3C04}, /* bf16 tie 0x3F80/81 -> 80 */
        {1.0f + 0x1.8p-7f, 0x3F82, 0x3C0C}, /* bf16 tie 0x3F81/82 -> 82 */
        {1.0f + 0x1.0p-11f, 0x3F80, 0x3C00}, /* f16 tie -> 0x3C00 */
        {1.0f + 0x1.8p-10f, 0x3F80, 0x3C02}, /* f16 tie 01/02 -> 02 */
        {INFINITY, 0x7F80, 0x7C00},
        {-INFINITY, 0xFF80, 0xFC00},
        {0x1.FFFFFEp127f, 0x7F80, 0x7C00}, /* FLT_MAX: bf16 rounds to inf */
        {0x1.FEp127f, 0x7F7F, 0x7C00},     /* largest finite bf16 */
        {0x1.0p-133f, 0x0001, 0x0000},     /* smallest bf16 subnormal */
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        uint16_t bf = dev_to16(DT_BF16, k[i].x), h = dev_to16(DT_F16, k[i].x);
        if (bf != k[i].bf || h != k[i].h)
            fail_msg("%a: bf16 0x%04X (want 0x%04X), f16 0x%04X (want 0x%04X)",
                     (double)k[i].x, bf, k[i].bf, h, k[i].h);
        /* the reference agrees on every pattern */
        assert_int_equal(dt_ref_f32_to_bf16(k[i].x), k[i].bf);
        assert_int_equal(dt_ref_f32_to_f16(k[i].x), k[i].h);
    }
    /* NaNs stay NaN with their sign, even with payload only in low bits
     * (plain truncation would give bf16 inf). */
    uint32_t nans[] = {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FBFFFFFu};
    for (size_t i = 0; i < 4; i++) {
        uint16_t bf = dev_to16(DT_BF16, bits_f(nans[i]));
        uint16_t h = dev_to16(DT_F16, bits_f(nans[i]));
        assert_true((bf & 0x7F80) == 0x7F80 && (bf & 0x007F) != 0);
        assert_true((h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0);
        assert_int_equal(bf >> 15, nans[i] >> 31);
        assert_int_equal(h >> 15, nans[i] >> 31);
    }
}

/* Every 16-bit pattern widens exactly; and every non-NaN pattern survives
 * 16 -> f32 -> 16. */
static void test_cast_exhaustive_16bit(void **state)
{
    cpu_t *c = &g_t2;
    const int64_t n = 65536;
    uint16_t *h = dalloc(c, n * 2), *back = dalloc(c, n * 2);
    float *f = dalloc(c, n * 4);
    for (int64_t i = 0; i < n; i++)
        h[i] = (uint16_t)i;
    for (int pass = 0; pass < 2; pass++) {
        int dt = pass ? DT_F16 : DT_BF16;
        OK(c->K->cast(c->dev, NULL, f, DT_F32, h, dt, n));
        OK(c->K->cast(c->dev, NULL, back, dt, f, DT_F32, n));
        for (int64_t i = 0; i < n; i++) {
            double want = pass ? dt_ref_f16_to_double((uint16_t)i)
                               : dt_ref_bf16_to_double((uint16_t)i);
            if (isnan(want)) {
                assert_true(isnan(f[i]));
                assert_int_equal(f_bits(f[i]) >> 31, (uint32_t)i >> 15);
                continue;
            }
            if (!((double)f[i] == want && !!signbit(f[i]) == !!signbit(want)))
                fail_msg("%s 0x%04X: got %a, want %a", dt_dtype_name(dt),
                         (unsigned)i, (double)f[i], want);
            if (back[i] != (uint16_t)i)
                fail_msg("%s 0x%04X round trip gave 0x%04X", dt_dtype_name(dt),
                         (unsigned)i, back[i]);
        }
    }
    dfree(c, h), dfree(c, back), dfree(c, f);
}

/* f32 -> 16 bit against the frexp/nearbyint reference on: every f16 value
 * and every midpoint between neighbours (the ties), the same for bf16's
 * upper half-words, and random bit patterns. */
static void test_cast_from_f32_vs_reference(void **state)
{
    cpu_t *c = &g_t2;
    const int64_t nrand = 200000, n = 4 * 65536 + nrand;
    float *x = dalloc(c, n * 4);
    int64_t k = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        double v = dt_ref_f16_to_double((uint16_t)i);
        double vn = dt_ref_f16_to_double((uint16_t)(i + 1));
        x[k++] = (float)v;
        /* midpoint to the next pattern (exact in f32: f16 has 11 bits) */
        x[k++] = isfinite(v) && isfinite(vn) && (i & 0x7FFF) != 0x7BFF && i != 0x7FFF
                     ? (float)((v + vn) / 2)
                     : 1.0f;
        uint32_t b = i << 16;
        x[k++] = bits_f(b);
        x[k++] = bits_f(b | 0x8000u); /* bf16 tie */
    }
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 99);
    for (int64_t i = 0; i < nrand; i++)
        x[k++] = bits_f((uint32_t)dt_ref_rng_u64(&r));
    uint16_t *ob = dalloc(c, n * 2), *oh = dalloc(c, n * 2);
    OK(c->K->cast(c->dev, NULL, ob, DT_BF16, x, DT_F32, n));
    OK(c->K->cast(c->dev, NULL, oh, DT_F16, x, DT_F32, n));
    for (int64_t i = 0; i < n; i++) {
        if (isnan(x[i])) {
            assert_true(isnan(dt_ref_bf16_to_double(ob[i])));
            assert_true(isnan(dt_ref_f16_to_double(oh[i])));
            continue;
        }
        uint16_t wb = dt_ref_f32_to_bf16(x[i]), wh = dt_ref_f32_to_f16(x[i]);
        if (ob[i] != wb || oh[i] != wh)
            fail_msg("%a (0x%08X): bf16 0x%04X want 0x%04X, f16 0x%04X want 0x%04X",
                     (double)x[i], f_bits(x[i]), ob[i], wb, oh[i], wh);
    }
    /* bf16 <-> f16 is one rounding of the exact value */
    uint16_t *hb = dalloc(c, n * 2), *bh = dalloc(c, n * 2);
    OK(c->K->cast(c->dev, NULL, hb, DT_F16, ob, DT_BF16, n));
    OK(c->K->cast(c->dev, NULL, bh, DT_BF16, oh, DT_F16, n));
    for (int64_t i = 0; i < n; i++) {
        double vb = dt_ref_bf16_to_double(ob[i]), vh = dt_ref_f16_to_double(oh[i]);
        if (isnan(vb))
            continue;
        assert_int_equal(hb[i], dt_ref_f32_to_f16((float)vb));
        assert_int_equal(bh[i], dt_ref_f32_to_bf16((float)vh));
    }
    /* same type: a copy */
    OK(c->K->cast(c->dev, NULL, hb, DT_BF16, ob, DT_BF16, n));
    assert_memory_equal(hb, ob, n * 2);
    dfree(c, x), dfree(c, ob), dfree(c, oh), dfree(c, hb), dfree(c, bh);
}

static void test_cast_errors(void **state)
{
    cpu_t *c = &g_t1;
    float *x = dalloc(c, 64);
    assert_status(c->K->cast(c->dev, NULL, x, DT_I32, x, DT_F32, 4), DT_ERR_UNSUPPORTED);
    assert_dev_msg("cast: f32 -> i32; only f32, bf16, f16");
    assert_status(c->K->cast(c->dev, NULL, x, DT_BF16, x, DT_F32, 4), DT_ERR_INVALID);
    assert_dev_msg("cast: f32 -> bf16: dst and src overlap");
    dfree(c, x);
}

/* ============================================ 1 thread vs 2 threads */

/* Run the same inputs through both devices; every non-BLAS kernel must
 * give identical bits (work is split so no sum changes order), and the
 * sizes make every kernel split into at least two chunks. */
/* ============================================================== dtypes */

/* Every kernel states its dtypes; the cpu runs f32 or bf16 activations
 * (f32 ones with f32, bf16 or f16 matmul weights, bf16 ones with bf16 or
 * f32 weights) and f32 or bf16 gradients, and refuses anything else with
 * DT_ERR_UNSUPPORTED naming the kernel and the dtypes, before it touches a
 * buffer (checked: every output still holds its sentinel). */
static void test_dtype_refusals(void **state)
{
    cpu_t *c = &g_t1;
    enum { NB = 64 };
    float *y = dalloc(c, NB * 4), *x = dalloc(c, NB * 4), *z = dalloc(c, NB * 4);
    float *st = dalloc(c, NB * 4);
    int32_t *tok = dalloc(c, 4 * 4);
    double *sq = dalloc(c, 8);
    for (int i = 0; i < NB; i++)
        y[i] = x[i] = z[i] = st[i] = 7.0f;
    memset(tok, 0, 4 * 4);
    dt_device_t *d = c->dev;
    const dt_kernels_v1_t *K = c->K;
#define REFUSED(call, msg)                                                     \
    do {                                                                       \
        assert_status((call), DT_ERR_UNSUPPORTED);                            \
        assert_dev_msg(msg);                                                   \
    } while (0)
#define ACTS(op) op ": f16 activations: unsupported (the cpu device runs f32 or bf16 activations)"
#define MM_RUNS                                                                \
    "(the cpu device runs f32 activations with f32, bf16 or f16 weights, or bf16 "        \
    "activations with bf16 or f32 weights)"
    /* matmul: the activation and weight dtypes together */
    REFUSED(K->matmul_forward(d, NULL, y, x, z, NULL, DT_F32, DT_F64, 2, 2, 2),
            "matmul_forward: f32 activations with f64 weights: unsupported " MM_RUNS);
    REFUSED(K->matmul_forward(d, NULL, y, x, z, NULL, DT_BF16, DT_F16, 2, 2, 2),
            "matmul_forward: bf16 activations with f16 weights: unsupported " MM_RUNS);
    REFUSED(K->matmul_backward(d, NULL, y, z, st, x, x, x, DT_F16, DT_F32, 2, 2, 2),
            "matmul_backward: f16 activations with f32 weights: unsupported " MM_RUNS);
    /* the activation dtype of every layer kernel */
    REFUSED(K->embedding_forward(d, NULL, y, tok, x, x, DT_F16, 1, 2, 2),
            ACTS("embedding_forward"));
    REFUSED(K->embedding_backward(d, NULL, z, st, x, tok, DT_F16, 1, 2, 2),
            ACTS("embedding_backward"));
    REFUSED(K->vocab_embedding_forward(d, NULL, y, tok, x, x, DT_F16, 1, 2, 2, 0, 4),
            ACTS("vocab_embedding_forward"));
    REFUSED(K->gelu_forward(d, NULL, y, x, DT_F16, 4), ACTS("gelu_forward"));
    REFUSED(K->gelu_backward(d, NULL, y, x, x, DT_F16, 4), ACTS("gelu_backward"));
    REFUSED(K->softmax_xent_forward(d, NULL, st, y, x, tok, DT_F16, 2, 2),
            ACTS("softmax_xent_forward"));
    REFUSED(K->softmax_xent_backward(d, NULL, y, x, tok, DT_F16, 1.0f, 2, 2),
            ACTS("softmax_xent_backward"));
    REFUSED(K->vocab_xent_forward(d, NULL, 0, z, st, y, x, tok, DT_F16, 2, 0, 2),
            ACTS("vocab_xent_forward"));
    REFUSED(K->layernorm_forward(d, NULL, y, z, st, x, x, x, DT_F16, 2, 2),
            ACTS("layernorm_forward"));
    REFUSED(K->layernorm_backward(d, NULL, y, z, st, x, x, x, x, x, DT_F16, 2, 2),
            ACTS("layernorm_backward"));
    REFUSED(K->attention_forward(d, NULL, y, st, x, DT_F16, 1, 2, 2, 1),
            ACTS("attention_forward"));
    REFUSED(K->attention_backward(d, NULL, y, x, x, x, x, DT_F16, 1, 2, 2, 1),
            ACTS("attention_backward"));
    REFUSED(K->residual_forward(d, NULL, y, x, x, DT_F64, 4),
            "residual_forward: f64 activations: unsupported (the cpu device runs f32 or bf16 "
            "activations)");
    /* attention's state: f32 probabilities for f32 and bf16 activations */
    uint64_t sb = 0;
    assert_status(K->attention_state_bytes(1, 2, 2, 1, DT_F16, &sb), DT_ERR_UNSUPPORTED);
    /* element-wise arithmetic and the optimizers */
    REFUSED(K->axpy(d, NULL, y, x, DT_F16, 1.0f, 4),
            "axpy: f16 elements: unsupported (the cpu device runs f32 or bf16 elements)");
    REFUSED(K->scale(d, NULL, y, DT_F64, 2.0f, 4),
            "scale: f64 elements: unsupported (the cpu device runs f32 or bf16 elements)");
    REFUSED(K->adamw_update(d, NULL, y, x, z, st, DT_F16, 4, 0.1f, 0.9f, 0.99f, 1e-8f, 0.0f,
                            1.0f, 1),
            "adamw_update: f16 gradients: unsupported (the cpu device runs f32 or bf16 "
            "gradients)");
    REFUSED(K->sgd_update(d, NULL, y, x, z, DT_F16, 4, 0.1f, 0.9f, 0.0f, 0, 1.0f),
            "sgd_update: f16 gradients: unsupported (the cpu device runs f32 or bf16 "
            "gradients)");
    REFUSED(K->sumsq(d, NULL, sq, x, DT_F64, 4), "sumsq: dtype f64; only f32, bf16, f16");
    /* the zero-length call the model probes bf16 activations with is run */
    OK(K->residual_forward(d, NULL, NULL, NULL, NULL, DT_BF16, 0));
#undef MM_RUNS
#undef ACTS
#undef REFUSED
    for (int i = 0; i < NB; i++)
        if (y[i] != 7.0f || x[i] != 7.0f || z[i] != 7.0f || st[i] != 7.0f)
            fail_msg("a refused kernel wrote element %d", i);
    dfree(c, y), dfree(c, x), dfree(c, z), dfree(c, st), dfree(c, tok), dfree(c, sq);
}

static void test_threads_bitwise(void **state)
{
    dt_ref_rng_t r;
    cpu_t *cs[2] = {&g_t1, &g_t2};
    float *res[2][16];
    int64_t len[16];
    int nres = 0;
    for (int d = 0; d < 2; d++) {
        cpu_t *c = cs[d];
        dt_ref_rng_seed(&r, 1234); /* same inputs on both */
        int k = 0;
        /* element-wise: n = 70001 > 2 x 16384 */
        const int64_t n = 70001;
        float *x = drand(c, &r, n, -3, 3), *y = drand(c, &r, n, -1, 1);
        float *o = dalloc(c, n * 4);
        OK(c->K->gelu_forward(c->dev, NULL, o, x, DT_F32, n));
        OK(c->K->gelu_backward(c->dev, NULL, y, x, o, DT_F32, n));
        OK(c->K->residual_forward(c->dev, NULL, o, o, y, DT_F32, n));
        OK(c->K->axpy(c->dev, NULL, o, x, DT_F32, 0.3f, n));
        OK(c->K->scale(c->dev, NULL, o, DT_F32, 1.7f, n));
        float *m = drand(c, &r, n, -0.1, 0.1), *v = drand(c, &r, n, 0, 0.1);
        OK(c->K->adamw_update(c->dev, NULL, o, y, m, v, DT_F32, n, 1e-3f, 0.9f, 0.95f,
                                1e-8f, 0.1f, 0.5f, 3));
        OK(c->K->sgd_update(c->dev, NULL, x, y, m, DT_F32, n, 1e-2f, 0.9f, 0.01f, 1, 1.0f));
        uint16_t *hb = dalloc(c, n * 2);
        OK(c->K->cast(c->dev, NULL, hb, DT_F16, o, DT_F32, n));
        OK(c->K->cast(c->dev, NULL, y, DT_F32, hb, DT_F16, n));
        res[d][k] = o, len[k++] = n;
        res[d][k] = x, len[k++] = n;
        res[d][k] = y, len[k++] = n;
        res[d][k] = v, len[k++] = n;

        /* sumsq over several 64 Ki blocks */
        const int64_t ns = 300007;
        float *s = drand(c, &r, ns, -1, 1);
        double *sq = dalloc(c, 8);
        OK(c->K->sumsq(c->dev, NULL, sq, s, DT_F32, ns));
        res[d][k] = (float *)sq, len[k++] = 2;

        /* layernorm (N, C) = (64, 768): rows and columns both split */
        const int64_t N = 64, C = 768;
        float *li = drand(c, &r, N * C, -2, 2), *lw = drand(c, &r, C, 0.5, 1.5);
        float *lb = drand(c, &r, C, -1, 1), *lo = dalloc(c, N * C * 4);
        float *lm = dalloc(c, N * 4), *lr = dalloc(c, N * 4);
        float *ldo = drand(c, &r, N * C, -1, 1), *ldi = drand(c, &r, N * C, -1, 1);
        float *ldw = drand(c, &r, C, -1, 1), *ldb = drand(c, &r, C, -1, 1);
        OK(c->K->layernorm_forward(c->dev, NULL, lo, lm, lr, li, lw, lb, DT_F32, N, C));
        OK(c->K->layernorm_backward(c->dev, NULL, ldi, ldw, ldb, ldo, li, lw, lm, lr, DT_F32,
                                    N, C));
        res[d][k] = lo, len[k++] = N * C;
        res[d][k] = ldi, len[k++] = N * C;
        res[d][k] = ldw, len[k++] = C;
        res[d][k] = ldb, len[k++] = C;

        /* embedding (B, T, C) = (4, 64, 256), V = 50: repeats galore */
        const int64_t B = 4, T = 64, EC = 256, V = 50;
        int32_t *tok = dalloc(c, B * T * 4);
        dt_ref_fill_int(&r, tok, B * T, (int32_t)V);
        float *wte = drand(c, &r, V * EC, -1, 1), *wpe = drand(c, &r, T * EC, -1, 1);
        float *eo = dalloc(c, B * T * EC * 4);
        OK(c->K->embedding_forward(c->dev, NULL, eo, tok, wte, wpe, DT_F32, B, T, EC));
        OK(c->K->embedding_backward(c->dev, NULL, wte, wpe, eo, tok, DT_F32, B, T, EC));
        res[d][k] = eo, len[k++] = B * T * EC;
        res[d][k] = wte, len[k++] = V * EC;

        /* attention (B, T, C, NH) = (2, 64, 64, 4) */
        const int64_t AB = 2, AT = 64, AC = 64, NH = 4;
        float *qkv = drand(c, &r, AB * AT * 3 * AC, -1, 1);
        float *ao = dalloc(c, AB * AT * AC * 4), *att = dalloc(c, AB * NH * AT * AT * 4);
        float *dqkv = drand(c, &r, AB * AT * 3 * AC, -1, 1);
        OK(c->K->attention_forward(c->dev, NULL, ao, att, qkv, DT_F32, AB, AT, AC, NH));
        OK(c->K->attention_backward(c->dev, NULL, dqkv, ao, qkv, ao, att, DT_F32, AB, AT, AC,
                                    NH));
        res[d][k] = ao, len[k++] = AB * AT * AC;
        res[d][k] = dqkv, len[k++] = AB * AT * 3 * AC;

        /* softmax cross-entropy (64, 1000) */
        const int64_t XN = 64, XV = 1000;
        float *lg = drand(c, &r, XN * XV, -5, 5), *pr = dalloc(c, XN * XV * 4);
        float *ls = dalloc(c, XN * 4);
        int32_t *tg = dalloc(c, XN * 4);
        dt_ref_fill_int(&r, tg, XN, (int32_t)XV);
        OK(c->K->softmax_xent_forward(c->dev, NULL, ls, pr, lg, tg, DT_F32, XN, XV));
        OK(c->K->softmax_xent_backward(c->dev, NULL, lg, pr, tg, DT_F32, 0.25f, XN, XV));
        res[d][k] = ls, len[k++] = XN;
        res[d][k] = lg, len[k++] = XN * XV;
        nres = k;
    }
    static const char *names[] = {"gelu/residual/axpy/scale/adamw", "sgd param",
                                  "gelu_backward/cast", "adamw v", "sumsq",
                                  "layernorm out", "layernorm dinp",
                                  "layernorm dweight", "layernorm dbias",
                                  "embedding out", "embedding dwte",
                                  "attention out", "attention dqkv",
                                  "xent losses", "xent dlogits"};
    for (int k = 0; k < nres; k++)
        if (memcmp(res[0][k], res[1][k], (size_t)len[k] * 4) != 0)
            fail_msg("%s differs between 1 and 2 threads", names[k]);
    /* (device buffers are released with the devices at teardown) */
}

/* sgemm is OpenBLAS's, split by column slices over the pool: equal within
 * rounding at 1 and 2 threads.  The shape is big enough that forward,
 * dweight and dinp each split in two (CPU_MM_MIN_FLOPS per slice). */
static void test_threads_matmul(void **state)
{
    const int64_t N = 64, C = 256, OC = 528;
    for (int bf = 0; bf < 2; bf++) {
        dt_ref_rng_t r;
        float *res[2][4];
        for (int d = 0; d < 2; d++) {
            cpu_t *c = d ? &g_t2 : &g_t1;
            dt_ref_rng_seed(&r, 4321);
            float *inp = drand(c, &r, N * C, -1, 1), *w = drand(c, &r, OC * C, -1, 1);
            float *b = drand(c, &r, OC, -1, 1), *dout = drand(c, &r, N * OC, -1, 1);
            void *wt = w;
            if (bf) {
                wt = dalloc(c, OC * C * 2);
                OK(c->K->cast(c->dev, NULL, wt, DT_BF16, w, DT_F32, OC * C));
            }
            float *out = dalloc(c, N * OC * 4), *dinp = dalloc(c, N * C * 4);
            float *dw = dalloc(c, OC * C * 4), *db = dalloc(c, OC * 4);
            memset(dinp, 0, N * C * 4);
            memset(dw, 0, OC * C * 4);
            memset(db, 0, OC * 4);
            int wdt = bf ? DT_BF16 : DT_F32;
            OK(c->K->matmul_forward(c->dev, NULL, out, inp, wt, b, DT_F32, wdt, N, C, OC));
            OK(c->K->matmul_backward(c->dev, NULL, dinp, dw, db, dout, inp, wt, DT_F32, wdt,
                                       N, C, OC));
            res[d][0] = out, res[d][1] = dinp, res[d][2] = dw, res[d][3] = db;
            if (wt != w)
                dfree(c, wt);
            dfree(c, inp), dfree(c, w), dfree(c, b), dfree(c, dout);
        }
        const int64_t len[4] = {N * OC, N * C, OC * C, OC};
        const int64_t k[4] = {C, OC, N, N}; /* terms per sum */
        static const char *what[4] = {"matmul out", "matmul dinp", "matmul dweight",
                                      "matmul dbias"};
        for (int j = 0; j < 4; j++) {
            double *ref = hd(res[0][j], len[j]);
            /* both are k-term f32 dot products (see test_matmul) */
            CHECK(what[j], res[1][j], ref, len[j], 1e-5, 1e-6 * tol_sqrt(k[j]));
            free(ref);
            dfree(&g_t1, res[0][j]);
            dfree(&g_t2, res[1][j]);
        }
    }
}

/* ================================================ bf16 activations */

/* The cuda and cpu devices run every kernel with bf16 activations (dtype
 * DT_BF16, device.h): they widen bf16 exactly to f32, compute in f32 (the
 * matmuls and attention's products: exact bf16 products summed in f32, by
 * the tensor cores or by sgemm on widened blocks) and round every bf16
 * they store once, to nearest even.
 * Each test feeds the double reference exactly the values the bf16
 * buffers hold, and bounds every element on its own: the error of the f32
 * arithmetic, from the magnitudes of the terms it adds (the same reference
 * run on absolute values), plus each rounding to bf16.
 *
 * bf16 keeps 8 significant bits (7 stored): its unit roundoff is 2^-8 ~
 * 3.9e-3, the largest relative error of one rounding to nearest (as f32's
 * 24 bits give u = 2^-24), so a stored bf16 result is good to ~4e-3
 * relative and no better.  A bf16 store rounds an f32 value that was
 * itself rounded once from the sum or product it holds: within BF_R of
 * that exact value, relative.  (A result next to a tie comes within 0.4%
 * of this bound, as it should: a bound's margin is in its f32 part.) */
#define BF_R (0x1p-8 + 0x1p-23)
/* The error of one add in an f32 sum, relative to its operands'
 * magnitudes: 2^-22, four times f32's u, so that it also covers tensor-core
 * accumulators (which truncate instead of rounding) with a margin.  A
 * K-term sum in any order is then within (K + 1) F32_ADD of the sum of its
 * terms' magnitudes (the usual gamma_{K-1} bound). */
#define F32_ADD 0x1p-22

/* n uniform [lo, hi) draws rounded to bf16 into p; exact[i] (if not NULL)
 * receives the value p[i] holds. */
static void fill_bf(uint16_t *p, double *exact, dt_ref_rng_t *r, int64_t n, double lo,
                    double hi)
{
    for (int64_t i = 0; i < n; i++) {
        p[i] = dt_ref_f32_to_bf16((float)dt_ref_rng_uniform(r, lo, hi));
        if (exact)
            exact[i] = dt_ref_bf16_to_double(p[i]);
    }
}

/* A device bf16 buffer of n such values; *exact (host memory, free())
 * receives them exactly: what the reference is fed. */
static uint16_t *dbf(cpu_t *c, dt_ref_rng_t *r, int64_t n, double lo, double hi,
                     double **exact)
{
    uint16_t *p = dalloc(c, n * 2);
    *exact = hzero(n);
    fill_bf(p, *exact, r, n, lo, hi);
    return p;
}

/* Exact double copy of bf16 values (host memory, free()). */
static double *hbf(const uint16_t *x, int64_t n)
{
    double *d = hzero(n);
    for (int64_t i = 0; i < n; i++)
        d[i] = dt_ref_bf16_to_double(x[i]);
    return d;
}

static double *habs(const double *x, int64_t n)
{
    double *d = hzero(n);
    for (int64_t i = 0; i < n; i++)
        d[i] = fabs(x[i]);
    return d;
}

/* Bounds on a bf16 result after `calls` calls that each add to g0 (NULL:
 * zeros; with calls = 1, a plain result) a value computed in f32 within
 * e = ek mag[i] + e0 of grad[i] (mag may be NULL), and round the sum to
 * bf16: after call j the result is within
 *   b_j = b_{j-1} + e + BF_R (|g0 + j grad| + b_{j-1} + e)
 * of g0 + j grad, the last term the rounding of a value that far from it. */
static double *bound_bf16(const double *g0, const double *grad, const double *mag,
                          double ek, double e0, int calls, int64_t n)
{
    double *b = hzero(n);
    for (int64_t i = 0; i < n; i++) {
        const double e = (mag ? ek * mag[i] : 0.0) + e0;
        double s = 0.0;
        for (int j = 1; j <= calls; j++)
            s += e + BF_R * (fabs((g0 ? g0[i] : 0.0) + j * grad[i]) + s + e);
        b[i] = s;
    }
    return b;
}

/* Bounds on an f32 gradient after `calls` calls that each add a sum of at
 * most K terms whose magnitudes add up to mag[i] (K counts one more for
 * terms that are themselves rounded products): the whole is one f32 sum of
 * 1 + calls K terms, g0's and every call's, in whatever order. */
static double *bound_f32(const double *g0, const double *mag, int64_t K, int calls, int64_t n)
{
    double *b = hzero(n);
    for (int64_t i = 0; i < n; i++)
        b[i] = (double)(2 + calls * K) * F32_ADD * (fabs(g0[i]) + calls * mag[i]);
    return b;
}

/* Every |got[i] - want[i]| <= bound[i] (a NaN fails); else the count and
 * the element furthest past its bound. */
static void check_within(const char *what, const double *got, const double *want,
                         const double *bound, int64_t n)
{
    int64_t bad = 0, worst = -1;
    double worst_ratio = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs(got[i] - want[i]);
        if (err <= bound[i])
            continue;
        bad++;
        double ratio = isnan(err) ? INFINITY : err / bound[i];
        if (worst < 0 || ratio > worst_ratio) {
            worst = i;
            worst_ratio = ratio;
        }
    }
    if (bad)
        fail_msg("%s: %lld of %lld elements out of bounds; worst [%lld]: got %.9g, want "
                 "%.9g, bound %.3g (%.3gx)",
                 what, (long long)bad, (long long)n, (long long)worst, got[worst],
                 want[worst], bound[worst], worst_ratio);
}

/* check_within on bf16 or f32 results; both free `want` and `bound` (so
 * a reference output checked this way is not freed again). */
static void check_bf(const char *what, const uint16_t *got, double *want, double *bound,
                     int64_t n)
{
    double *g = hbf(got, n);
    check_within(what, g, want, bound, n);
    free(g), free(want), free(bound);
}
static void check_f(const char *what, const float *got, double *want, double *bound,
                    int64_t n)
{
    double *g = hd(got, n);
    check_within(what, g, want, bound, n);
    free(g), free(want), free(bound);
}

/* ---------------------------------------------------------- bf16 matmul */

/* Forward and two backward calls at (N, C, OC) with bf16 activations
 * (inp, out, bias, dout, dinp) and weights in `wdtype`: bf16, or an f32
 * master weight that the device rounds to bf16 (nearest even) before the
 * bf16 product, so that the reference multiplies by the rounded weight.
 * dweight and dbias are f32. */
static void matmul_bf16_case(cpu_t *c, uint64_t seed, int wdtype, int with_bias, int64_t N,
                             int64_t C, int64_t OC)
{
    /* which case failed: the instance (deterministic on, off), the shape */
    print_message("bf16 matmul: %s weights, deterministic %s, bias %s, N %lld C %lld OC %lld\n",
                  dt_dtype_name(wdtype), c == &g_t1 ? "on" : "off", with_bias ? "yes" : "no",
                  (long long)N, (long long)C, (long long)OC);
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, seed);
    double *inpd, *biasd = NULL, *wd;
    uint16_t *inp = dbf(c, &r, N * C, -1, 1, &inpd);
    uint16_t *bias = with_bias ? dbf(c, &r, OC, -1, 1, &biasd) : NULL;
    void *w;
    if (wdtype == DT_BF16) {
        w = dbf(c, &r, OC * C, -1, 1, &wd);
    } else {
        float *wf = drand(c, &r, OC * C, -1, 1);
        wd = hzero(OC * C);
        for (int64_t i = 0; i < OC * C; i++)
            wd[i] = dt_ref_bf16_to_double(dt_ref_f32_to_bf16(wf[i]));
        w = wf;
    }
    double *ai = habs(inpd, N * C), *aw = habs(wd, OC * C);
    double *ab = biasd ? habs(biasd, OC) : NULL;

    uint16_t *out = dalloc(c, N * OC * 2);
    OK(c->K->matmul_forward(c->dev, NULL, out, inp, w, bias, DT_BF16, wdtype, N, C, OC));
    double *outd = hzero(N * OC), *mo = hzero(N * OC);
    dt_ref_matmul_forward(outd, inpd, wd, biasd, N, C, OC);
    dt_ref_matmul_forward(mo, ai, aw, ab, N, C, OC); /* sum |inp w| + |bias| */
    /* C exact products and the bias (cuBLASLt's epilogue, in f32) summed in
     * f32: (C + 2) F32_ADD of their magnitudes; then one rounding to bf16
     * (~4e-3 relative) */
    check_bf("bf16 matmul_forward out", out,
             outd, bound_bf16(NULL, outd, mo, (double)(C + 2) * F32_ADD, 0, 1, N * OC),
             N * OC);

    double *doutd, *dinp0;
    uint16_t *dout = dbf(c, &r, N * OC, -1, 1, &doutd);
    uint16_t *dinp = dbf(c, &r, N * C, -1, 1, &dinp0); /* g0: backward must add */
    float *dw = drand(c, &r, OC * C, -1, 1), *db = drand(c, &r, OC, -1, 1);
    double *dw0 = hd(dw, OC * C), *db0 = hd(db, OC);
    double *gi = hzero(N * C), *gw = hzero(OC * C), *gb = hzero(OC);
    dt_ref_matmul_backward(gi, gw, gb, doutd, inpd, wd, N, C, OC);
    double *ado = habs(doutd, N * OC);
    double *mi = hzero(N * C), *mw = hzero(OC * C), *mb = hzero(OC);
    dt_ref_matmul_backward(mi, mw, mb, ado, ai, aw, N, C, OC);
    for (int call = 1; call <= 2; call++) {
        OK(c->K->matmul_backward(c->dev, NULL, dinp, dw, with_bias ? db : NULL, dout, inp,
                                 w, DT_BF16, wdtype, N, C, OC));
        /* dinp: OC exact products summed in f32, added to the bf16 dinp
         * (beta = 1) and rounded to bf16 once a call; and cuBLASLt rounds
         * the product itself to bf16 before it adds C: on the H200 the
         * (64, 96, 80) case was off by 3.8 ulps of the result (4.4x the
         * single rounding's bound), as a rounding of the larger product
         * would be.  So one more BF_R |product| a call. */
        double *bi = bound_bf16(dinp0, gi, mi, (double)(OC + 2) * F32_ADD, 0, call, N * C);
        for (int64_t i = 0; i < N * C; i++)
            bi[i] += call * BF_R * (fabs(gi[i]) + (double)(OC + 2) * F32_ADD * mi[i]);
        check_bf("bf16 matmul_backward dinp", dinp, accum(dinp0, gi, call, N * C), bi, N * C);
        /* dweight: N exact products a call, accumulated (beta = 1) into
         * the f32 dweight; dbias: N bf16 values a call, summed in f32 */
        check_f("bf16 matmul_backward dweight", dw, accum(dw0, gw, call, OC * C),
                bound_f32(dw0, mw, N, call, OC * C), OC * C);
        if (with_bias)
            check_f("bf16 matmul_backward dbias", db, accum(db0, gb, call, OC),
                    bound_f32(db0, mb, N, call, OC), OC);
        else /* NULL dbias: untouched */
            CHECK("bf16 matmul_backward dbias untouched", db, db0, OC, 0, 0);
    }
    dfree(c, inp), dfree(c, w), dfree(c, out), dfree(c, dout), dfree(c, dinp);
    dfree(c, dw), dfree(c, db);
    if (bias)
        dfree(c, bias);
    free(inpd), free(biasd), free(wd), free(ai), free(aw), free(ab), free(mo);
    free(doutd), free(dinp0), free(dw0), free(db0), free(gi), free(gw), free(gb);
    free(ado), free(mi), free(mw), free(mb);
}

/* bf16 weights and f32 master weights, with and without bias, on both
 * instances: odd shapes (7, 13, 9); (64, 96, 80); and N = 600 rows, past
 * the unrolled part of the bias gradient's column sums (8 x 64 rows). */
static void test_bf16_matmul(void **state)
{
    for (int f32w = 0; f32w < 2; f32w++) {
        const int wdt = f32w ? DT_F32 : DT_BF16;
        const uint64_t s = 300 + 10 * (uint64_t)f32w;
        matmul_bf16_case(&g_t1, s + 1, wdt, 1, 7, 13, 9);
        matmul_bf16_case(&g_t2, s + 2, wdt, 0, 7, 13, 9);
        matmul_bf16_case(&g_t2, s + 3, wdt, 1, 64, 96, 80);
        matmul_bf16_case(&g_t1, s + 4, wdt, 0, 64, 96, 80);
        matmul_bf16_case(&g_t1, s + 5, wdt, 1, 600, 24, 40);
    }
}

/* ------------------------------------------------------- bf16 embedding */

static void test_bf16_embedding(void **state)
{
    const int64_t B = 2, T = 5, C = 12, V = 17, n = B * T * C;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 311);
    for (int pass = 0; pass < 2; pass++) {
        cpu_t *c = pass ? &g_t2 : &g_t1;
        int32_t *tok = dalloc(c, B * T * 4);
        dt_ref_fill_int(&r, tok, B * T, (int32_t)V);
        tok[7] = tok[2]; /* a repeated token: its dwte row sums two rows */
        double *wted, *wped;
        uint16_t *wte = dbf(c, &r, V * C, -1, 1, &wted), *wpe = dbf(c, &r, T * C, -1, 1, &wped);
        uint16_t *out = dalloc(c, n * 2);
        OK(c->K->embedding_forward(c->dev, NULL, out, tok, wte, wpe, DT_BF16, B, T, C));
        double *outd = hzero(n);
        dt_ref_embedding_forward(outd, tok, wted, wped, B, T, C);
        /* one f32 add of two bf16 values, rounded to bf16: BF_R |out| */
        check_bf("bf16 embedding_forward", out, outd, bound_bf16(NULL, outd, NULL, 0, 0, 1, n),
                 n);

        double *doutd;
        uint16_t *dout = dbf(c, &r, n, -1, 1, &doutd);
        float *dwte = drand(c, &r, V * C, -1, 1), *dwpe = drand(c, &r, T * C, -1, 1);
        double *dwte0 = hd(dwte, V * C), *dwpe0 = hd(dwpe, T * C);
        double *gte = hzero(V * C), *gpe = hzero(T * C);
        dt_ref_embedding_backward(gte, gpe, doutd, tok, B, T, C);
        double *ado = habs(doutd, n), *mte = hzero(V * C), *mpe = hzero(T * C);
        dt_ref_embedding_backward(mte, mpe, ado, tok, B, T, C);
        for (int call = 1; call <= 2; call++) {
            OK(c->K->embedding_backward(c->dev, NULL, dwte, dwpe, dout, tok, DT_BF16, B, T, C));
            /* f32 sums of exact bf16 values: a dwte row gets at most B T of
             * them a call (atomics, any order), a dwpe row B */
            check_f("bf16 embedding_backward dwte", dwte, accum(dwte0, gte, call, V * C),
                    bound_f32(dwte0, mte, B * T, call, V * C), V * C);
            check_f("bf16 embedding_backward dwpe", dwpe, accum(dwpe0, gpe, call, T * C),
                    bound_f32(dwpe0, mpe, B, call, T * C), T * C);
        }
        dfree(c, tok), dfree(c, wte), dfree(c, wpe), dfree(c, out), dfree(c, dout);
        dfree(c, dwte), dfree(c, dwpe);
        free(wted), free(wped), free(doutd), free(dwte0), free(dwpe0);
        free(gte), free(gpe), free(ado), free(mte), free(mpe);
    }
}

/* ------------------------------------------------------- bf16 layernorm */

/* Forward, then two backward calls fed forward's own f32 mean and rstd
 * (what a model passes): the reference backward gets exactly those too. */
static void layernorm_bf16_case(cpu_t *c, uint64_t seed, int64_t N, int64_t C)
{
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, seed);
    double *inpd, *wd, *bd;
    uint16_t *inp = dbf(c, &r, N * C, 1, 5, &inpd); /* offset 3: the mean matters */
    uint16_t *w = dbf(c, &r, C, 0.5, 1.5, &wd), *b = dbf(c, &r, C, -1, 1, &bd);
    uint16_t *out = dalloc(c, N * C * 2);
    float *mean = dalloc(c, N * 4), *rstd = dalloc(c, N * 4);
    OK(c->K->layernorm_forward(c->dev, NULL, out, mean, rstd, inp, w, b, DT_BF16, N, C));
    double *outd = hzero(N * C), *meand = hzero(N), *rstdd = hzero(N);
    dt_ref_layernorm_forward(outd, meand, rstdd, inpd, wd, bd, N, C);
    /* mean: bf16 values in [1, 5] are multiples of 2^-7 and C <= 512 of them
     * add up to < 2^12, 19 bits: the f32 sum is exact in any order, and
     * the mean one division: 2 u */
    CHECK("bf16 layernorm_forward mean", mean, meand, N, 0x1p-23, 0);
    /* rstd: C squares of one-rounding differences (the mean's own error
     * enters only squared) summed by a tree of depth <= 10, / C, + eps,
     * then rsqrtf (2 ulp): <= 11 u; 1e-6 is 16 u */
    CHECK("bf16 layernorm_forward rstd", rstd, rstdd, N, 1e-6, 0);
    /* out = (x - mean) rstd w + b in f32: the difference's rounding and the
     * mean's (u |mean| rstd |w|), rstd's 16 u, three more roundings: within
     * 2^-19 (32 u) of |n w| + |b| + rstd |w| |mean|; then to bf16 */
    double *mo = hzero(N * C);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < C; j++)
            mo[i * C + j] = fabs((inpd[i * C + j] - meand[i]) * rstdd[i] * wd[j]) +
                            fabs(bd[j]) + rstdd[i] * fabs(wd[j]) * fabs(meand[i]);
    check_bf("bf16 layernorm_forward out", out, outd,
             bound_bf16(NULL, outd, mo, 0x1p-19, 0, 1, N * C), N * C);

    double *doutd, *dinp0;
    uint16_t *dout = dbf(c, &r, N * C, -1, 1, &doutd);
    uint16_t *dinp = dbf(c, &r, N * C, -1, 1, &dinp0); /* g0: backward must add */
    float *dw = drand(c, &r, C, -1, 1), *db = drand(c, &r, C, -1, 1);
    double *dw0 = hd(dw, C), *db0 = hd(db, C);
    double *mf = hd(mean, N), *rf = hd(rstd, N); /* what backward reads */
    double *gi = hzero(N * C), *gw = hzero(C), *gb = hzero(C);
    dt_ref_layernorm_backward(gi, gw, gb, doutd, inpd, wd, mf, rf, N, C);
    /* Magnitudes.  dinp = rstd (dn - mean(dn) - n mean(dn n)), dn = w dout
     * (exact), n = (x - mean) rstd: two C-term f32 means and a few
     * roundings a term, within (C + 8) F32_ADD of rstd (|dn| + mean|dn| +
     * |n| mean|dn n|).  dweight sums dout n (three roundings a term: one
     * more term), dbias sums dout. */
    double *mi = hzero(N * C), *mw = hzero(C), *mb = hzero(C);
    for (int64_t i = 0; i < N; i++) {
        const double *x = inpd + i * C, *g = doutd + i * C;
        double s1 = 0.0, s2 = 0.0;
        for (int64_t j = 0; j < C; j++) {
            double nj = (x[j] - mf[i]) * rf[i];
            s1 += fabs(wd[j] * g[j]) / (double)C;
            s2 += fabs(wd[j] * g[j] * nj) / (double)C;
            mw[j] += fabs(g[j] * nj);
            mb[j] += fabs(g[j]);
        }
        for (int64_t j = 0; j < C; j++)
            mi[i * C + j] = rf[i] * (fabs(wd[j] * g[j]) + s1 + fabs((x[j] - mf[i]) * rf[i]) * s2);
    }
    for (int call = 1; call <= 2; call++) {
        OK(c->K->layernorm_backward(c->dev, NULL, dinp, dw, db, dout, inp, w, mean, rstd,
                                    DT_BF16, N, C));
        check_bf("bf16 layernorm_backward dinp", dinp, accum(dinp0, gi, call, N * C),
                 bound_bf16(dinp0, gi, mi, (double)(C + 8) * F32_ADD, 0, call, N * C), N * C);
        check_f("bf16 layernorm_backward dweight", dw, accum(dw0, gw, call, C),
                bound_f32(dw0, mw, N + 1, call, C), C);
        check_f("bf16 layernorm_backward dbias", db, accum(db0, gb, call, C),
                bound_f32(db0, mb, N, call, C), C);
    }
    dfree(c, inp), dfree(c, w), dfree(c, b), dfree(c, out), dfree(c, mean), dfree(c, rstd);
    dfree(c, dout), dfree(c, dinp), dfree(c, dw), dfree(c, db);
    free(inpd), free(wd), free(bd), free(meand), free(rstdd), free(mo);
    free(doutd), free(dinp0), free(dw0), free(db0), free(mf), free(rf), free(gi), free(gw);
    free(gb), free(mi), free(mw), free(mb);
}

/* Odd shapes; C = 300, more than a row block's 256 threads; N = 520 rows,
 * past the unrolled part of dweight's and dbias' column sums. */
static void test_bf16_layernorm(void **state)
{
    layernorm_bf16_case(&g_t1, 321, 7, 13);
    layernorm_bf16_case(&g_t2, 322, 5, 300);
    layernorm_bf16_case(&g_t1, 323, 520, 40);
}

/* ------------------------------------------------------------ bf16 GELU */

static void test_bf16_gelu(void **state)
{
    const int64_t n = 1001;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 331);
    cpu_t *c = &g_t1;
    double *inpd;
    uint16_t *inp = dbf(c, &r, n, -4, 4, &inpd);
    /* the tails, where exp(-2u) over- and underflows (all exact in bf16) */
    static const float tails[] = {-100.0f, -30.0f, -10.0f, -5.5f, 0.0f,
                                  -0.0f, 5.5f, 10.0f, 30.0f, 100.0f};
    for (int k = 0; k < 10; k++) {
        inp[500 + k] = dt_ref_f32_to_bf16(tails[k]);
        inpd[500 + k] = dt_ref_bf16_to_double(inp[500 + k]);
    }
    uint16_t *out = dalloc(c, n * 2);
    OK(c->K->gelu_forward(c->dev, NULL, out, inp, DT_BF16, n));
    double *outd = hzero(n);
    dt_ref_gelu_forward(outd, inpd, n);
    /* 0.5 x (1 + th) in f32: tanhf's 2 ulp (and u's roundings through
     * tanh' <= 1: 2^-22 in all) times 0.5 |x|, and two roundings of |out|:
     * within 2^-22 (|x| + |out|); then to bf16 */
    double *mo = hzero(n);
    for (int64_t i = 0; i < n; i++)
        mo[i] = fabs(inpd[i]) + fabs(outd[i]);
    check_bf("bf16 gelu_forward", out, outd, bound_bf16(NULL, outd, mo, 0x1p-22, 0, 1, n), n);
    free(mo);

    double *doutd, *dinp0;
    uint16_t *dout = dbf(c, &r, n, -1, 1, &doutd), *dinp = dbf(c, &r, n, -1, 1, &dinp0);
    double *g = hzero(n);
    dt_ref_gelu_backward(g, inpd, doutd, n);
    /* gelu'(x) = 0.5 (1 + th) + 0.5 x (1 - th^2) k (1 + 3 0.044715 x^2), k =
     * sqrt(2/pi): th's 2^-22 times |d gelu'/d th| <= 0.5 + 0.8 |x| (1 +
     * 0.135 x^2), and a few roundings of its terms: within 2^-20 (1 + |x|
     * (1 + 0.135 x^2)) |dout|, plus the product's rounding (u |g|); then
     * added to dinp and rounded to bf16 */
    double *mg = hzero(n);
    for (int64_t i = 0; i < n; i++) {
        double x = fabs(inpd[i]);
        mg[i] = 0x1p-20 * (1.0 + x * (1.0 + 0.135 * x * x)) * fabs(doutd[i]) +
                0x1p-24 * fabs(g[i]);
    }
    for (int call = 1; call <= 2; call++) {
        OK(c->K->gelu_backward(c->dev, NULL, dinp, inp, dout, DT_BF16, n));
        check_bf("bf16 gelu_backward", dinp, accum(dinp0, g, call, n),
                 bound_bf16(dinp0, g, mg, 1.0, 0, call, n), n);
    }
    dfree(c, inp), dfree(c, out), dfree(c, dout), dfree(c, dinp);
    free(inpd), free(doutd), free(dinp0), free(g), free(mg);
}

/* ------------------------------------- bf16 residual, axpy and scale */

/* Each is one f32 operation on exact inputs, rounded to bf16, and so is
 * the reference: the double sum or product of these operands is exact (or
 * so far from a float midpoint that double rounding cannot matter), its
 * float rounding is the device's f32 result, and dt_ref_f32_to_bf16
 * rounds as the device's store does (test_cast_from_f32_vs_reference):
 * bit-exact. */
static void test_bf16_residual_axpy_scale(void **state)
{
    const int64_t n = 1003;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 341);
    cpu_t *c = &g_t2;
    double *ad, *bd;
    uint16_t *a = dbf(c, &r, n, -2, 2, &ad), *b = dbf(c, &r, n, -2, 2, &bd);
    uint16_t *o = dalloc(c, n * 2), *a2 = dalloc(c, n * 2);
    OK(c->K->residual_forward(c->dev, NULL, o, a, b, DT_BF16, n));
    for (int64_t i = 0; i < n; i++)
        if (o[i] != dt_ref_f32_to_bf16((float)(ad[i] + bd[i])))
            fail_msg("bf16 residual_forward [%lld]: %a + %a gave 0x%04X, want 0x%04X",
                     (long long)i, ad[i], bd[i], o[i],
                     dt_ref_f32_to_bf16((float)(ad[i] + bd[i])));
    /* in place (out aliases a) */
    memcpy(a2, a, (size_t)n * 2);
    OK(c->K->residual_forward(c->dev, NULL, a2, a2, b, DT_BF16, n));
    assert_memory_equal(a2, o, (size_t)n * 2);
    /* y += -0.75 x: -0.75 x is exact in f32 (10 bits), so fused or not the
     * f32 result is the rounded sum */
    OK(c->K->axpy(c->dev, NULL, a, b, DT_BF16, -0.75f, n));
    for (int64_t i = 0; i < n; i++)
        if (a[i] != dt_ref_f32_to_bf16((float)(ad[i] - 0.75 * bd[i])))
            fail_msg("bf16 axpy [%lld]: %a - 0.75 %a gave 0x%04X", (long long)i, ad[i],
                     bd[i], a[i]);
    /* x *= 0.3f: 24 bits times 8, exact in double */
    memcpy(a2, b, (size_t)n * 2);
    OK(c->K->scale(c->dev, NULL, a2, DT_BF16, 0.3f, n));
    for (int64_t i = 0; i < n; i++)
        if (a2[i] != dt_ref_f32_to_bf16((float)((double)0.3f * bd[i])))
            fail_msg("bf16 scale [%lld]: 0.3f %a gave 0x%04X", (long long)i, bd[i], a2[i]);
    dfree(c, a), dfree(c, b), dfree(c, o), dfree(c, a2);
    free(ad), free(bd);
}

/* ---------------------------------------- bf16 softmax + cross-entropy */

static void xent_bf16_case(cpu_t *c, uint64_t seed, int64_t N, int64_t V)
{
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, seed);
    double *ld;
    uint16_t *logits = dbf(c, &r, N * V, -4, 4, &ld);
    int32_t *tg = dalloc(c, N * 4);
    dt_ref_fill_int(&r, tg, N, (int32_t)V);
    float *losses = dalloc(c, N * 4);
    uint16_t *probs = dalloc(c, N * V * 2);
    OK(c->K->softmax_xent_forward(c->dev, NULL, losses, probs, logits, tg, DT_BF16, N, V));
    double *lossd = hzero(N), *probd = hzero(N * V);
    dt_ref_softmax_xent_forward(lossd, probd, ld, tg, N, V);
    /* probs in f32: expf (2 ulp) of x - max (one rounding of < 8), a tree
     * sum of depth <= 10 of positive terms, a reciprocal, a product: within
     * ~2.2e-6 relative, 1e-5 with margin; then to bf16 */
    check_bf("bf16 softmax_xent_forward probs", probs, probd,
             bound_bf16(NULL, probd, probd, 1e-5, 0, 1, N * V), N * V);
    /* losses (f32) = -(x_t - max - logf(sum)): the sum's ~1.3e-6 relative
     * error as an absolute one in its log, logf's ulp (|log sum| < 6:
     * 4.8e-7) and two subtractions of |terms| < 14 (1.4e-6): 4e-6 */
    CHECK("bf16 softmax_xent_forward losses", losses, lossd, N, 1e-6, 4e-6);

    const float dloss = 1.0f / (float)N;
    double *dl0;
    uint16_t *dl = dbf(c, &r, N * V, -1, 1, &dl0);
    double *pd = hbf(probs, N * V); /* backward reads the bf16 probs forward stored */
    double *g = hzero(N * V);
    dt_ref_softmax_xent_backward(g, pd, tg, dloss, N, V);
    double *mg = habs(g, N * V);
    for (int call = 1; call <= 2; call++) {
        OK(c->K->softmax_xent_backward(c->dev, NULL, dl, probs, tg, DT_BF16, dloss, N, V));
        /* dloss (p - y) in f32: p - 1 and the product, two roundings (2^-23
         * |g|); then added to dlogits and rounded to bf16 */
        check_bf("bf16 softmax_xent_backward", dl, accum(dl0, g, call, N * V),
                 bound_bf16(dl0, g, mg, 0x1p-23, 0, call, N * V), N * V);
    }
    dfree(c, logits), dfree(c, tg), dfree(c, losses), dfree(c, probs), dfree(c, dl);
    free(ld), free(lossd), free(dl0), free(pd), free(g), free(mg);
}

/* Rows of 17, and of 300 (more than a row block's 256 threads). */
static void test_bf16_softmax_xent(void **state)
{
    xent_bf16_case(&g_t1, 351, 7, 17);
    xent_bf16_case(&g_t2, 352, 5, 300);
}

/* ------------------------------------------------------- bf16 attention */

/* Element-wise error bounds of cuda's attention with bf16 activations
 * (cuda_attention.c; its fallback rounds less), from the exact qkv and
 * dout, the reference's probabilities P and output, and what the device's
 * forward gave and backward reads (out in bf16, lse in f32).  Per head,
 * scale = 1/sqrt(hs):
 *  S = scale q.k: hs exact products summed in f32, scaled (and scale
 *    itself rounded): within eS = (hs + 3) F32_ADD scale sum|q k|.
 *  lse = max + logf(sum expf(S - max)): within the row's largest eS, plus
 *    expf's 2 ulp, the subtraction's rounding (of < rng, the row's spread),
 *    a tree sum of depth <= 8 (T <= 128), logf's ulp and the add: 2^-20
 *    (16 u) (1 + rng + log(t + 1) + |lse|).
 *  Forward: P in f32 is within rho = eS + max eS + 2^-19 (1 + rng),
 *    relative (the same errors and a reciprocal and a product); rounded to
 *    bf16 for the product P V: pe = rho + BF_R (1 + rho); out = P V sums
 *    t + 1 terms in f32 (rounded to bf16 by the caller's bound).
 *  Backward, per row t and key s: dP = dout_t . v_s in f32 (hs exact
 *    products); D = dout_t . out_t from the bf16 out, whose difference from
 *    the exact dout_t . out_t is known here; P = expf(S - lse) from the
 *    device's lse, within rho_b of the exact P; dS = P (dP - D) rounded to
 *    bf16, and P rounded to bf16, for the products dV += P^T dout, dQ +=
 *    scale dS K, dK += scale dS^T Q: f32 sums of t + 1 terms (the added
 *    gradient's rounding is the caller's).
 * The cpu rounds less (cpu_kernels_attention.c): its state is the f32
 * probabilities P themselves (P_e, when not NULL, receives their bound:
 * rho P), its P V and backward products read them in f32, not rounded to
 * bf16, and backward reads forward's P instead of recomputing it from an
 * lse.  So the cuda bounds hold for it with a margin; it passes the exact
 * lse as lsed (eL = 0), as it keeps no lse, and the forward's rho covers
 * the P backward reads (rho's terms dwarf eL's where it matters: the
 * bf16 roundings of dS and P dominate each gradient's bound). */
static void att_bf16_bounds(const double *qkv, const double *dout, const double *outx,
                            const double *P, const double *od, const double *lsed, int64_t B,
                            int64_t T, int64_t C, int64_t NH, double *lse_want,
                            double *lse_e, double *out_e, double *dqkv_e, double *P_e)
{
    const int64_t hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    double *S = hzero(T), *eS = hzero(T), *pe = hzero(T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t t = 0; t < T; t++) {
                const int64_t row = (b * NH + h) * T + t;
                const double *q = qkv + (b * T + t) * 3 * C + h * hs;
                const double *g = dout + (b * T + t) * C + h * hs;
                const double *o = od + (b * T + t) * C + h * hs;
                const double *ox = outx + (b * T + t) * C + h * hs;
                const double *Pr = P + row * T;
                double mx = -INFINITY, meS = 0.0;
                for (int64_t s = 0; s <= t; s++) {
                    const double *k = qkv + (b * T + s) * 3 * C + C + h * hs;
                    double dot = 0.0, mag = 0.0;
                    for (int64_t i = 0; i < hs; i++) {
                        dot += q[i] * k[i];
                        mag += fabs(q[i] * k[i]);
                    }
                    S[s] = dot * scale;
                    eS[s] = (double)(hs + 3) * F32_ADD * scale * mag;
                    mx = fmax(mx, S[s]);
                    meS = fmax(meS, eS[s]);
                }
                double sum = 0.0, rng = 0.0;
                for (int64_t s = 0; s <= t; s++) {
                    sum += exp(S[s] - mx);
                    rng = fmax(rng, mx - S[s]);
                }
                const double L = mx + log(sum);
                lse_want[row] = L;
                lse_e[row] = meS + 0x1p-20 * (1.0 + rng + log((double)(t + 1)) + fabs(L));
                /* forward */
                for (int64_t s = 0; s <= t; s++) {
                    double rho = 1.01 * (eS[s] + meS + 0x1p-19 * (1.0 + rng));
                    pe[s] = rho + BF_R * (1.0 + rho);
                    if (P_e) /* the f32 probability itself */
                        P_e[row * T + s] = rho * Pr[s];
                }
                for (int64_t i = 0; i < hs; i++) {
                    double e = 0.0;
                    for (int64_t s = 0; s <= t; s++) {
                        double v = fabs(qkv[(b * T + s) * 3 * C + 2 * C + h * hs + i]);
                        e += Pr[s] * v * (pe[s] + (double)(T + 1) * F32_ADD * (1.0 + pe[s]));
                    }
                    out_e[(b * T + t) * C + h * hs + i] = e;
                }
                /* backward */
                double D = 0.0, Dd = 0.0, Dm = 0.0;
                for (int64_t i = 0; i < hs; i++) {
                    D += g[i] * ox[i];
                    Dd += g[i] * o[i];
                    Dm += fabs(g[i] * o[i]);
                }
                const double eD = fabs(Dd - D) + (double)(hs + 1) * F32_ADD * Dm;
                const double eL = fabs(lsed[row] - L);
                for (int64_t s = 0; s <= t; s++) {
                    const double *k = qkv + (b * T + s) * 3 * C + C + h * hs, *v = k + C;
                    double dP = 0.0, mP = 0.0;
                    for (int64_t i = 0; i < hs; i++) {
                        dP += g[i] * v[i];
                        mP += fabs(g[i] * v[i]);
                    }
                    const double X = fabs(dP - D), p = Pr[s];
                    const double eX = (double)(hs + 1) * F32_ADD * mP + eD;
                    const double eX2 = eX + 0x1p-24 * (X + eX); /* the subtraction */
                    const double rho = 1.01 * (eS[s] + eL + 0x1p-22 * (1.0 + fabs(S[s] - L)));
                    const double eG = p * ((rho + 0x1p-22) * (X + eX2) + eX2);
                    const double eDS = eG + BF_R * (p * X + eG);
                    const double eP = p * (rho + BF_R * (1.0 + rho));
                    const double fdq = scale * (eDS + (double)(T + 3) * F32_ADD * (p * X + eDS));
                    const double fdv = eP + (double)(T + 2) * F32_ADD * (p + eP);
                    double *dq = dqkv_e + (b * T + t) * 3 * C + h * hs;
                    double *dk = dqkv_e + (b * T + s) * 3 * C + C + h * hs, *dv = dk + C;
                    for (int64_t i = 0; i < hs; i++) {
                        dq[i] += fdq * fabs(k[i]);
                        dk[i] += fdq * fabs(q[i]);
                        dv[i] += fdv * fabs(g[i]);
                    }
                }
            }
    free(S), free(eS), free(pe);
}

/* Forward (out, and the state, sized by attention_state_bytes for bf16,
 * with guard bytes after it that forward must leave alone: on cuda the
 * (B, NH, T) f32 log-sum-exp, on the cpu the (B, NH, T, T) f32
 * probabilities, as for f32 activations), then two backward calls, on
 * both instances. */
static void attention_bf16_case(int64_t B, int64_t T, int64_t C, int64_t NH, uint64_t seed)
{
    const int64_t n3 = B * T * 3 * C, no = B * T * C, nl = B * NH * T, natt = nl * T;
    enum { GUARD = 64 };
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, seed);
    for (int pass = 0; pass < 2; pass++) {
        cpu_t *c = pass ? &g_t2 : &g_t1;
        uint64_t sb = 0;
        OK(c->K->attention_state_bytes(B, T, C, NH, DT_BF16, &sb));
        assert_int_equal(sb, (g_cuda ? nl : natt) * 4);
        double *qkvd;
        uint16_t *qkv = dbf(c, &r, n3, -1.5, 1.5, &qkvd);
        uint16_t *out = dalloc(c, no * 2);
        float *lse = dalloc(c, (int64_t)sb + GUARD);
        unsigned char *guard = (unsigned char *)lse + sb;
        memset(guard, 0xA5, GUARD);
        OK(c->K->attention_forward(c->dev, NULL, out, lse, qkv, DT_BF16, B, T, C, NH));
        for (int i = 0; i < GUARD; i++)
            assert_int_equal(guard[i], 0xA5);
        double *outd = hzero(no), *attd = hzero(natt);
        dt_ref_attention_forward(outd, attd, qkvd, B, T, C, NH);

        double *doutd, *dqkv0;
        uint16_t *dout = dbf(c, &r, no, -1, 1, &doutd), *dqkv = dbf(c, &r, n3, -1, 1, &dqkv0);
        double *od = hbf(out, no), *lse_want = hzero(nl), *lse_e = hzero(nl);
        double *out_e = hzero(no), *dqkv_e = hzero(n3), *P_e = g_cuda ? NULL : hzero(natt);
        /* cuda's backward reads forward's lse; the cpu keeps none: the exact
         * one, which att_bf16_bounds writes before it reads it (eL = 0) */
        double *lsed = g_cuda ? hd(lse, nl) : lse_want;
        att_bf16_bounds(qkvd, doutd, outd, attd, od, lsed, B, T, C, NH, lse_want, lse_e, out_e,
                        dqkv_e, P_e);
        if (g_cuda) {
            check_f("bf16 attention_forward lse", lse, lse_want, lse_e, nl);
        } else { /* the probabilities, zero above the diagonal (bound 0) */
            double *want = hzero(natt);
            memcpy(want, attd, (size_t)natt * sizeof *want);
            check_f("bf16 attention_forward probabilities", lse, want, P_e, natt);
            free(lse_want), free(lse_e);
            lsed = NULL;
        }
        check_bf("bf16 attention_forward out", out, outd,
                 bound_bf16(NULL, outd, out_e, 1.0, 0, 1, no), no);

        double *g = hzero(n3);
        dt_ref_attention_backward(g, doutd, qkvd, attd, B, T, C, NH);
        for (int call = 1; call <= 2; call++) {
            OK(c->K->attention_backward(c->dev, NULL, dqkv, dout, qkv, out, lse, DT_BF16, B,
                                        T, C, NH));
            check_bf("bf16 attention_backward dqkv", dqkv, accum(dqkv0, g, call, n3),
                     bound_bf16(dqkv0, g, dqkv_e, 1.0, 0, call, n3), n3);
        }
        dfree(c, qkv), dfree(c, out), dfree(c, lse), dfree(c, dout), dfree(c, dqkv);
        free(qkvd), free(attd), free(doutd), free(dqkv0), free(od), free(lsed);
        free(out_e), free(dqkv_e), free(g);
    }
}

/* The small case; T = 67 (rows longer than a warp and than 64, odd score
 * matrices, heads at 32-byte offsets in bf16). */
static void test_bf16_attention(void **state)
{
    attention_bf16_case(2, 5, 12, 3, 361);
    attention_bf16_case(2, 67, 48, 3, 362);
}

/* ------------------------------------------ optimizers, bf16 gradients */

/* test_adamw's and sgd_case's steps with the gradient in bf16: the same
 * f32 arithmetic on exact inputs, so their tolerances and reasons. */
static void test_bf16_optimizers(void **state)
{
    const int64_t n = 1003;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 371);
    cpu_t *c = &g_t1;
    uint16_t *g = dalloc(c, n * 2);
    double *gd = hzero(n);
    {
        const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
        float *p = drand(c, &r, n, -1, 1), *m = dalloc(c, n * 4), *v = dalloc(c, n * 4);
        memset(m, 0, (size_t)n * 4);
        memset(v, 0, (size_t)n * 4);
        double *pd = hd(p, n), *md = hzero(n), *vd = hzero(n);
        for (int64_t t = 1; t <= 5; t++) {
            fill_bf(g, gd, &r, n, -1, 1); /* fresh gradient each step */
            OK(c->K->adamw_update(c->dev, NULL, p, g, m, v, DT_BF16, n, lr, b1, b2, eps, wd,
                                  gs, t));
            dt_ref_adamw_update(pd, gd, md, vd, n, lr, b1, b2, eps, wd, gs, t);
            CHECK("bf16-gradient adamw m", m, md, n, 1e-5, 1e-7);
            CHECK("bf16-gradient adamw v", v, vd, n, 1e-5, 1e-12);
            CHECK("bf16-gradient adamw param", p, pd, n, 1e-6, 1e-6);
        }
        dfree(c, p), dfree(c, m), dfree(c, v);
        free(pd), free(md), free(vd);
    }
    for (int k = 0; k < 3; k++) { /* plain, nesterov, no momentum (no buffer) */
        const int nesterov = k == 1, with_buf = k < 2;
        const float lr = 0.05f, wd = 0.01f, gs = 0.5f, mu = with_buf ? 0.9f : 0.0f;
        float *p = drand(c, &r, n, -1, 1), *mom = with_buf ? dalloc(c, n * 4) : NULL;
        if (mom)
            memset(mom, 0, (size_t)n * 4);
        double *pd = hd(p, n), *momd = with_buf ? hzero(n) : NULL;
        for (int step = 0; step < 4; step++) {
            fill_bf(g, gd, &r, n, -1, 1);
            OK(c->K->sgd_update(c->dev, NULL, p, g, mom, DT_BF16, n, lr, mu, wd, nesterov, gs));
            dt_ref_sgd_update(pd, gd, momd, n, lr, mu, wd, nesterov, gs);
            CHECK("bf16-gradient sgd param", p, pd, n, 1e-6, 1e-6);
            if (mom)
                CHECK("bf16-gradient sgd momentum", mom, momd, n, 1e-5, 1e-6);
        }
        dfree(c, p);
        if (mom)
            dfree(c, mom);
        free(pd), free(momd);
    }
    dfree(c, g);
    free(gd);
}

/* ----------------------------------------- the cpu's bf16 specifics */

/* A bf16 matmul of more rows than one block holds (cpu_kernels_matmul.c:
 * CPU_BF16_MM_FLOATS = 2^23 floats of rows, C + OC a row forward, OC + 2C
 * backward): (N, C, OC) = (4100, 16, 2048) runs as blocks of 4064 + 36
 * rows forward and 4032 + 68 backward, with f32 weights (rounded to bf16)
 * and bf16 weights.  Checked against the cpu's f32 matmul fed the widened
 * inputs and the rounded weight: the same f32 sums, in one block.  Every
 * input is positive, so every sum is as large as its terms' magnitudes
 * (no cancellation): a block's rows lost or added twice would move a
 * result by at least 36 / 4100 ~ 0.9% of it, far past the bounds.
 *  out, dinp: one rounding to bf16 (BF_R) of an f32 sum of C + 1 or OC + 1
 *    terms, against another order of that sum: BF_R + 2 (K + 2) F32_ADD,
 *    relative;
 *  dweight, dbias (f32, N terms a call): 2 (N + 2) F32_ADD relative (5e-3;
 *    with identical summation orders they come out equal). */
static void test_bf16_matmul_row_blocks(void **state)
{
    const int64_t N = 4100, C = 16, OC = 2048;
    cpu_t *c = &g_t2;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 391);
    uint16_t *inp = dalloc(c, N * C * 2), *dout = dalloc(c, N * OC * 2);
    uint16_t *bias = dalloc(c, OC * 2), *wb = dalloc(c, OC * C * 2);
    uint16_t *out = dalloc(c, N * OC * 2), *dinp = dalloc(c, N * C * 2);
    float *inpf = dalloc(c, N * C * 4), *doutf = dalloc(c, N * OC * 4);
    float *biasf = dalloc(c, OC * 4), *w = dalloc(c, OC * C * 4), *wr = dalloc(c, OC * C * 4);
    float *outf = dalloc(c, N * OC * 4), *dinpf = dalloc(c, N * C * 4);
    float *dw = dalloc(c, OC * C * 4), *dwf = dalloc(c, OC * C * 4);
    float *db = dalloc(c, OC * 4), *dbf = dalloc(c, OC * 4);
    fill_bf(inp, NULL, &r, N * C, 0.25, 1);
    fill_bf(dout, NULL, &r, N * OC, 0.25, 1);
    fill_bf(bias, NULL, &r, OC, 0.25, 1);
    for (int64_t i = 0; i < N * C; i++)
        inpf[i] = (float)dt_ref_bf16_to_double(inp[i]);
    for (int64_t i = 0; i < N * OC; i++)
        doutf[i] = (float)dt_ref_bf16_to_double(dout[i]);
    for (int64_t i = 0; i < OC; i++)
        biasf[i] = (float)dt_ref_bf16_to_double(bias[i]);
    for (int64_t i = 0; i < OC * C; i++) {
        w[i] = (float)dt_ref_rng_uniform(&r, 0.25, 1);
        wb[i] = dt_ref_f32_to_bf16(w[i]);
        wr[i] = (float)dt_ref_bf16_to_double(wb[i]);
    }
    for (int f32w = 0; f32w < 2; f32w++) {
        const int wdt = f32w ? DT_F32 : DT_BF16;
        const void *wt = f32w ? (const void *)w : (const void *)wb;
        OK(c->K->matmul_forward(c->dev, NULL, out, inp, wt, bias, DT_BF16, wdt, N, C, OC));
        OK(c->K->matmul_forward(c->dev, NULL, outf, inpf, wr, biasf, DT_F32, DT_F32, N, C,
                                OC));
        fill_bf(dinp, NULL, &r, N * C, 0.25, 1);
        for (int64_t i = 0; i < N * C; i++)
            dinpf[i] = (float)dt_ref_bf16_to_double(dinp[i]);
        memset(dw, 0, (size_t)(OC * C) * 4), memset(dwf, 0, (size_t)(OC * C) * 4);
        memset(db, 0, (size_t)OC * 4), memset(dbf, 0, (size_t)OC * 4);
        OK(c->K->matmul_backward(c->dev, NULL, dinp, dw, db, dout, inp, wt, DT_BF16, wdt, N,
                                 C, OC));
        OK(c->K->matmul_backward(c->dev, NULL, dinpf, dwf, dbf, doutf, inpf, wr, DT_F32,
                                 DT_F32, N, C, OC));
        struct {
            const char *what;
            const uint16_t *h;
            const float *got, *want;
            int64_t n, K;
        } cmp[] = {{"out", out, NULL, outf, N * OC, C + 1},
                   {"dinp", dinp, NULL, dinpf, N * C, OC + 1},
                   {"dweight", NULL, dw, dwf, OC * C, N},
                   {"dbias", NULL, db, dbf, OC, N}};
        for (size_t k = 0; k < sizeof cmp / sizeof cmp[0]; k++) {
            const double rel = (cmp[k].h ? BF_R : 0.0) + 2.0 * (double)(cmp[k].K + 2) * F32_ADD;
            for (int64_t i = 0; i < cmp[k].n; i++) {
                double g = cmp[k].h ? dt_ref_bf16_to_double(cmp[k].h[i]) : cmp[k].got[i];
                double want = cmp[k].want[i];
                if (!(fabs(g - want) <= rel * fabs(want)))
                    fail_msg("bf16 matmul in row blocks (%s weights): %s[%lld] = %.9g, the f32 "
                             "matmul gives %.9g (relative bound %.3g)",
                             dt_dtype_name(wdt), cmp[k].what, (long long)i, g, want, rel);
            }
        }
    }
    dfree(c, inp), dfree(c, dout), dfree(c, bias), dfree(c, wb), dfree(c, out), dfree(c, dinp);
    dfree(c, inpf), dfree(c, doutf), dfree(c, biasf), dfree(c, w), dfree(c, wr);
    dfree(c, outf), dfree(c, dinpf), dfree(c, dw), dfree(c, dwf), dfree(c, db), dfree(c, dbf);
}

/* test_threads_bitwise with bf16 activations: every kernel but the matmul
 * (OpenBLAS's, equal within rounding: test_threads_matmul) gives the same
 * bits at 1 and 2 threads, widening and rounding included. */
static void test_threads_bitwise_bf16(void **state)
{
    dt_ref_rng_t r;
    cpu_t *cs[2] = {&g_t1, &g_t2};
    void *res[2][16];
    int64_t bytes[16];
    int nres = 0;
    for (int d = 0; d < 2; d++) {
        cpu_t *c = cs[d];
        dt_ref_rng_seed(&r, 4321); /* same inputs on both */
        int k = 0;
        double *e; /* exact values: not needed here */
        /* element-wise: n = 70001 > 2 x 16384 */
        const int64_t n = 70001;
        uint16_t *x = dbf(c, &r, n, -3, 3, &e);
        free(e);
        uint16_t *y = dbf(c, &r, n, -1, 1, &e);
        free(e);
        uint16_t *o = dalloc(c, n * 2);
        OK(c->K->gelu_forward(c->dev, NULL, o, x, DT_BF16, n));
        OK(c->K->gelu_backward(c->dev, NULL, y, x, o, DT_BF16, n));
        OK(c->K->residual_forward(c->dev, NULL, o, o, y, DT_BF16, n));
        OK(c->K->axpy(c->dev, NULL, o, x, DT_BF16, 0.3f, n));
        OK(c->K->scale(c->dev, NULL, o, DT_BF16, 1.7f, n));
        float *p = drand(c, &r, n, -1, 1), *m = drand(c, &r, n, -0.1, 0.1);
        float *v = drand(c, &r, n, 0, 0.1);
        OK(c->K->adamw_update(c->dev, NULL, p, y, m, v, DT_BF16, n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                              0.1f, 0.5f, 3));
        OK(c->K->sgd_update(c->dev, NULL, p, o, m, DT_BF16, n, 1e-2f, 0.9f, 0.01f, 1, 1.0f));
        res[d][k] = o, bytes[k++] = n * 2;
        res[d][k] = y, bytes[k++] = n * 2;
        res[d][k] = p, bytes[k++] = n * 4;
        res[d][k] = m, bytes[k++] = n * 4;

        /* layernorm (N, C) = (64, 768): rows and columns both split */
        const int64_t N = 64, C = 768;
        uint16_t *li = dbf(c, &r, N * C, -2, 2, &e);
        free(e);
        uint16_t *lw = dbf(c, &r, C, 0.5, 1.5, &e);
        free(e);
        uint16_t *lb = dbf(c, &r, C, -1, 1, &e);
        free(e);
        uint16_t *ldo = dbf(c, &r, N * C, -1, 1, &e);
        free(e);
        uint16_t *ldi = dbf(c, &r, N * C, -1, 1, &e);
        free(e);
        uint16_t *lo = dalloc(c, N * C * 2);
        float *lm = dalloc(c, N * 4), *lr = dalloc(c, N * 4);
        float *ldw = drand(c, &r, C, -1, 1), *ldb = drand(c, &r, C, -1, 1);
        OK(c->K->layernorm_forward(c->dev, NULL, lo, lm, lr, li, lw, lb, DT_BF16, N, C));
        OK(c->K->layernorm_backward(c->dev, NULL, ldi, ldw, ldb, ldo, li, lw, lm, lr, DT_BF16,
                                    N, C));
        res[d][k] = lo, bytes[k++] = N * C * 2;
        res[d][k] = ldi, bytes[k++] = N * C * 2;
        res[d][k] = ldw, bytes[k++] = C * 4;
        res[d][k] = ldb, bytes[k++] = C * 4;

        /* embedding (B, T, C) = (4, 64, 256), V = 50: repeats galore */
        const int64_t B = 4, T = 64, EC = 256, V = 50;
        int32_t *tok = dalloc(c, B * T * 4);
        dt_ref_fill_int(&r, tok, B * T, (int32_t)V);
        uint16_t *wte = dbf(c, &r, V * EC, -1, 1, &e);
        free(e);
        uint16_t *wpe = dbf(c, &r, T * EC, -1, 1, &e);
        free(e);
        uint16_t *eo = dalloc(c, B * T * EC * 2);
        float *dwte = drand(c, &r, V * EC, -1, 1);
        OK(c->K->embedding_forward(c->dev, NULL, eo, tok, wte, wpe, DT_BF16, B, T, EC));
        OK(c->K->embedding_backward(c->dev, NULL, dwte, NULL, eo, tok, DT_BF16, B, T, EC));
        res[d][k] = eo, bytes[k++] = B * T * EC * 2;
        res[d][k] = dwte, bytes[k++] = V * EC * 4;

        /* attention (B, T, C, NH) = (2, 64, 64, 4) */
        const int64_t AB = 2, AT = 64, AC = 64, NH = 4;
        uint16_t *qkv = dbf(c, &r, AB * AT * 3 * AC, -1, 1, &e);
        free(e);
        uint16_t *dqkv = dbf(c, &r, AB * AT * 3 * AC, -1, 1, &e);
        free(e);
        uint16_t *ao = dalloc(c, AB * AT * AC * 2);
        float *att = dalloc(c, AB * NH * AT * AT * 4);
        OK(c->K->attention_forward(c->dev, NULL, ao, att, qkv, DT_BF16, AB, AT, AC, NH));
        OK(c->K->attention_backward(c->dev, NULL, dqkv, ao, qkv, ao, att, DT_BF16, AB, AT, AC,
                                    NH));
        res[d][k] = ao, bytes[k++] = AB * AT * AC * 2;
        res[d][k] = dqkv, bytes[k++] = AB * AT * 3 * AC * 2;

        /* softmax cross-entropy (64, 1000) */
        const int64_t XN = 64, XV = 1000;
        uint16_t *lg = dbf(c, &r, XN * XV, -5, 5, &e);
        free(e);
        uint16_t *pr = dalloc(c, XN * XV * 2);
        float *ls = dalloc(c, XN * 4);
        int32_t *tg = dalloc(c, XN * 4);
        dt_ref_fill_int(&r, tg, XN, (int32_t)XV);
        OK(c->K->softmax_xent_forward(c->dev, NULL, ls, pr, lg, tg, DT_BF16, XN, XV));
        OK(c->K->softmax_xent_backward(c->dev, NULL, lg, pr, tg, DT_BF16, 0.25f, XN, XV));
        res[d][k] = ls, bytes[k++] = XN * 4;
        res[d][k] = lg, bytes[k++] = XN * XV * 2;
        nres = k;
    }
    static const char *names[] = {"gelu/residual/axpy/scale", "gelu_backward",
                                  "adamw/sgd param", "sgd momentum",
                                  "layernorm out", "layernorm dinp",
                                  "layernorm dweight", "layernorm dbias",
                                  "embedding out", "embedding dwte",
                                  "attention out", "attention dqkv",
                                  "xent losses", "xent dlogits"};
    for (int k = 0; k < nres; k++)
        if (memcmp(res[0][k], res[1][k], (size_t)bytes[k]) != 0)
            fail_msg("bf16 %s differs between 1 and 2 threads", names[k]);
    /* (device buffers are released with the devices at teardown) */
}

int main(int argc, char **argv)
{
    /* Every device: the kernels against the references (messages compared
     * with the device's prefix). */
    const struct CMUnitTest common[] = {
        cmocka_unit_test(test_ref_matmul_fd),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_bf16_blocks),
        cmocka_unit_test(test_matmul_errors),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_softmax_xent),
        cmocka_unit_test(test_residual_axpy_scale),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_cast_known_patterns),
        cmocka_unit_test(test_cast_exhaustive_16bit),
        cmocka_unit_test(test_cast_from_f32_vs_reference),
        cmocka_unit_test(test_vocab_parallel),
    };
    /* The cpu's own: its expf, its attention state (probabilities), its
     * argument and dtype refusals word for word, its thread split, its
     * bf16 matmul's blocks of rows. */
    const struct CMUnitTest cpu_only[] = {
        cmocka_unit_test(test_expf_accuracy),
        cmocka_unit_test(test_attention_errors),
        cmocka_unit_test(test_attention_state_bytes),
        cmocka_unit_test(test_softmax_xent_extremes),
        cmocka_unit_test(test_cast_errors),
        cmocka_unit_test(test_dtype_refusals),
        cmocka_unit_test(test_threads_bitwise),
        cmocka_unit_test(test_threads_matmul),
        cmocka_unit_test(test_sumsq_host_run),
        cmocka_unit_test(test_bf16_matmul_row_blocks),
        cmocka_unit_test(test_threads_bitwise_bf16),
    };
    /* Every device: every kernel with bf16 activations. */
    const struct CMUnitTest bf16[] = {
        cmocka_unit_test(test_bf16_matmul),
        cmocka_unit_test(test_bf16_embedding),
        cmocka_unit_test(test_bf16_layernorm),
        cmocka_unit_test(test_bf16_gelu),
        cmocka_unit_test(test_bf16_residual_axpy_scale),
        cmocka_unit_test(test_bf16_softmax_xent),
        cmocka_unit_test(test_bf16_attention),
        cmocka_unit_test(test_bf16_optimizers),
    };
    if (argc > 1)
        g_device = argv[1];
    snprintf(g_prefix, sizeof g_prefix, "device/%s", g_device);
    if (strcmp(g_device, "cuda") == 0) {
        char why[512];
        if (dt_test_cuda_devices(why, sizeof why) == 0) {
            printf("SKIPPED: %s\n", why);
            return DT_TEST_SKIP_CODE;
        }
        g_cuda = 1;
        int failed = cmocka_run_group_tests_name("kernels on cuda", common, group_setup,
                                                 group_teardown);
        return failed + cmocka_run_group_tests_name("bf16 activations on cuda", bf16,
                                                    group_setup, group_teardown);
    }
    if (strcmp(g_device, "cpu") != 0) {
        fprintf(stderr, "usage: test_kernels [cpu|cuda]\n");
        return 2;
    }
    int failed = cmocka_run_group_tests_name("kernels on cpu", common, group_setup,
                                             group_teardown);
    failed += cmocka_run_group_tests_name("bf16 activations on cpu", bf16, group_setup,
                                          group_teardown);
    return failed + cmocka_run_group_tests_name("the cpu's own", cpu_only, group_setup,
                                                group_teardown);
}
