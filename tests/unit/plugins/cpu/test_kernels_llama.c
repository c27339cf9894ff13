/*
 * tests/unit/plugins/cpu/test_kernels_llama.c - the LLaMA family's kernels (kernel
 * the LLaMA family: rmsnorm, rope, swiglu, gqa_attention, forward and backward)
 * against float64 references written here, on seeded random inputs of odd
 * shapes; the references' backward passes against central finite
 * differences of their forwards; accumulation (+=) of every gradient over
 * two calls; rope_backward in place; grouped-query attention with NKV = NH
 * against attention_forward/backward bit for bit; and, on the cpu, the
 * same bits at 1, 2 and 3 threads, bf16 activations within bf16's
 * rounding, the refusals word for word, and guard_memory's refusal of
 * host memory in every new kernel.
 *
 * Device-parametrized like test_kernels: `test_kernels_llama [cpu|cuda]`;
 * on cuda the buffers are managed memory and every call is synchronized.
 * The cuda variant has not run yet (no GPU where it was written): ctest
 * skips it (exit 77) without a CUDA device.
 *
 * Tolerances are |got - want| <= atol + rtol |want|, stated at each check.
 * u = 2^-24 ~ 6e-8 is the f32 unit roundoff.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "cuda_probe.h"
#include "ref_kernels.h"
#include "test_assert.h"
#include "test_host.h"
#include "test_plugin.h"
#include "util/error.h"

/* ------------------------------------------------------------ harness */

typedef struct {
    dt_test_host_t th;
    const dt_device_ops_v1_t *ops;
    const dt_kernels_v1_t *K;
    dt_device_t *dev;
} dev_t_;

#define NDEV 3
static dev_t_ g_dev[NDEV]; /* cpu: threads 1, 2, 3; cuda: deterministic on, off, on */

static const char *g_device = "cpu";
static int g_cuda;
static char g_prefix[32];

static const dt_device_ops_v1_t *plugin_ops(void)
{
    static const dt_device_ops_v1_t *ops;
    char path[512];
    snprintf(path, sizeof path, DT_TEST_PLUGIN_DIR "/dtrain_%s.so", g_device);
    if (!ops && !(ops = dt_test_plugin_entry(path, DT_ENTRY_STRING(device, 1), NULL)))
        fail_msg("%s", dt_last_error());
    return ops;
}

static const dt_test_kv_t kv_t1[] = {{"threads", "1"}, {NULL, NULL}};
static const dt_test_kv_t kv_t2[] = {{"threads", "2"}, {NULL, NULL}};
static const dt_test_kv_t kv_t3[] = {{"threads", "3"}, {NULL, NULL}};
static const dt_test_kv_t kv_det[] = {{"deterministic", "true"}, {NULL, NULL}};
static const dt_test_kv_t kv_nondet[] = {{"deterministic", "false"}, {NULL, NULL}};

static int group_setup(void **state)
{
    const dt_test_kv_t *kv[NDEV] = {g_cuda ? kv_det : kv_t1, g_cuda ? kv_nondet : kv_t2,
                                    g_cuda ? kv_det : kv_t3};
    for (int i = 0; i < NDEV; i++) {
        dev_t_ *c = &g_dev[i];
        c->ops = plugin_ops();
        c->K = c->ops->kernels();
        dt_test_host_init(&c->th, g_prefix, kv[i]);
        const dt_device_init_v1_t a = {.struct_size = sizeof a, .local_size = 1,
                                       .device_index = -1};
        if (c->ops->init(&c->th.host, &a, &c->dev) != DT_OK) {
            fprintf(stderr, "init: %s\n", dt_last_error());
            return -1;
        }
    }
    return 0;
}

static int group_teardown(void **state)
{
    for (int i = 0; i < NDEV; i++)
        g_dev[i].ops->finalize(g_dev[i].dev);
    return 0;
}

#define OK(expr)                                                               \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        for (int i_ = 0; rc_ == DT_OK && g_cuda && i_ < NDEV; i_++)            \
            rc_ = g_dev[i_].ops->synchronize(g_dev[i_].dev);                   \
        if (rc_ != DT_OK)                                                      \
            fail_msg("%s: %s: %s", #expr, dt_status_name(rc_),                 \
                     dt_last_error());                                         \
    } while (0)
#define assert_dev_msg(expected)                                               \
    do {                                                                       \
        char want_[512];                                                       \
        snprintf(want_, sizeof want_, "%s: %s", g_prefix, (expected));         \
        assert_string_equal(dt_last_error(), want_);                           \
    } while (0)
#define CHECK(what, got, want, n, rtol, atol)                                  \
    assert_int_equal(dt_ref_check((what), (got), (want), (n), (rtol), (atol)), 0)
#define CHECK_D(what, got, want, n, rtol, atol)                                \
    assert_int_equal(dt_ref_check_d((what), (got), (want), (n), (rtol), (atol)), 0)

static void *dalloc(dev_t_ *c, int64_t bytes)
{
    void *p = NULL;
    if (bytes < 4)
        bytes = 4;
    if (g_cuda) {
        if (!(p = dt_test_cuda_managed_alloc((size_t)bytes)))
            fail_msg("cudaMallocManaged(%lld) failed", (long long)bytes);
        return p;
    }
    OK(c->ops->alloc(c->dev, (uint64_t)bytes, DT_TAG_ACTIVATIONS, &p));
    return p;
}
static void dfree(dev_t_ *c, void *p)
{
    if (g_cuda)
        dt_test_cuda_managed_free(p);
    else
        OK(c->ops->free(c->dev, p));
}

/* A device copy of host floats. */
static float *dcopy(dev_t_ *c, const float *src, int64_t n)
{
    float *p = dalloc(c, n * 4);
    memcpy(p, src, (size_t)n * 4);
    return p;
}

static float *hrand(dt_ref_rng_t *r, int64_t n, double lo, double hi)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * 4);
    dt_ref_fill_uniform(r, p, n, lo, hi);
    return p;
}
/* Device floats, uniform in [lo, hi) (written in place: managed or host
 * memory on both devices). */
static float *drand(dev_t_ *c, dt_ref_rng_t *r, int64_t n, double lo, double hi)
{
    float *p = dalloc(c, n * 4);
    dt_ref_fill_uniform(r, p, n, lo, hi);
    return p;
}
static double *hd(const float *x, int64_t n)
{
    double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
    dt_ref_f2d(d, x, n);
    return d;
}
static double *hzero(int64_t n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(double)); }
static double *accum(const double *g0, const double *grad, double k, int64_t n)
{
    double *w = malloc((size_t)n * sizeof *w);
    for (int64_t i = 0; i < n; i++)
        w[i] = g0[i] + k * grad[i];
    return w;
}
static double dotd(const double *a, const double *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Central differences of L (eps 1e-6: truncation ~1e-12, rounding ~1e-9
 * for |L| < 10), rtol 1e-6 with atol 1e-8, as test_kernels. */
typedef double (*loss_fn)(void *ctx);
static void fd_check(const char *what, double *x, int64_t n, const double *analytic, loss_fn L,
                     void *ctx)
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

/* Same bits on every instance (cpu: 1, 2 and 3 threads). */
static void same_bits(const char *what, float *const got[NDEV], int64_t n)
{
    for (int i = 1; i < NDEV; i++)
        if (memcmp(got[0], got[i], (size_t)n * 4) != 0)
            fail_msg("%s: instance %d differs from instance 0 (cpu: %d threads vs 1)", what,
                     i, i + 1);
}

/* ========================================================= references */

/* RMSNorm: out = x rstd w, rstd = 1/sqrt(mean(x^2) + eps). */
static void ref_rms_fwd(double *out, double *rstd, const double *x, const double *w, int64_t N,
                        int64_t C, double eps)
{
    for (int64_t n = 0; n < N; n++) {
        const double *xr = x + n * C;
        double ss = 0.0;
        for (int64_t c = 0; c < C; c++)
            ss += xr[c] * xr[c];
        double rs = 1.0 / sqrt(ss / (double)C + eps);
        for (int64_t c = 0; c < C; c++)
            out[n * C + c] = xr[c] * rs * w[c];
        if (rstd)
            rstd[n] = rs;
    }
}

/* dx = rs (w g) - x rs^3 / C sum_j w_j g_j x_j; dw = sum_n x rs g. */
static void ref_rms_bwd(double *dx, double *dw, const double *g, const double *x,
                        const double *w, int64_t N, int64_t C, double eps)
{
    for (int64_t n = 0; n < N; n++) {
        const double *xr = x + n * C, *gr = g + n * C;
        double ss = 0.0, dot = 0.0;
        for (int64_t c = 0; c < C; c++) {
            ss += xr[c] * xr[c];
            dot += w[c] * gr[c] * xr[c];
        }
        double rs = 1.0 / sqrt(ss / (double)C + eps);
        for (int64_t c = 0; c < C; c++) {
            dx[n * C + c] += rs * w[c] * gr[c] - xr[c] * rs * rs * rs * dot / (double)C;
            dw[c] += xr[c] * rs * gr[c];
        }
    }
}

/* RoPE over rows of ld with NH heads of HD; dir +1 forward, -1 backward
 * (the transposed rotation), accumulating when acc. */
static void ref_rope(double *out, const double *x, const double *cs, const double *sn,
                     int64_t B, int64_t T, int64_t NH, int64_t HD, int64_t ld, int dir,
                     int acc)
{
    int64_t half = HD / 2;
    for (int64_t r = 0; r < B * T; r++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < half; i++) {
                int64_t o = r * ld + h * HD + i, t = r % T;
                double c = cs[t * half + i], s = sn[t * half + i] * dir;
                double y0 = x[o] * c - x[o + half] * s, y1 = x[o + half] * c + x[o] * s;
                out[o] = (acc ? out[o] : 0.0) + y0;
                out[o + half] = (acc ? out[o + half] : 0.0) + y1;
            }
}

static double ref_silu(double x) { return x / (1.0 + exp(-x)); }

static void ref_swiglu_fwd(double *out, const double *inp, int64_t N, int64_t H)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < H; j++)
            out[n * H + j] = ref_silu(inp[n * 2 * H + j]) * inp[n * 2 * H + H + j];
}

static void ref_swiglu_bwd(double *dinp, const double *inp, const double *dout, int64_t N,
                           int64_t H)
{
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < H; j++) {
            double g = inp[n * 2 * H + j], u = inp[n * 2 * H + H + j], dy = dout[n * H + j];
            double s = 1.0 / (1.0 + exp(-g));
            dinp[n * 2 * H + j] += s * (1.0 + g * (1.0 - s)) * u * dy;
            dinp[n * 2 * H + H + j] += g * s * dy;
        }
}

/* Grouped-query causal attention; att (B, NH, T, T) the probabilities. */
static void ref_gqa_fwd(double *out, double *att, const double *qkv, int64_t B, int64_t T,
                        int64_t NH, int64_t NKV, int64_t HD)
{
    int64_t ld = (NH + 2 * NKV) * HD, grp = NH / NKV;
    double sc = 1.0 / sqrt((double)HD);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            int64_t kc = (NH + h / grp) * HD, vc = kc + NKV * HD;
            for (int64_t t = 0; t < T; t++) {
                double *p = att + ((b * NH + h) * T + t) * T;
                const double *q = qkv + (b * T + t) * ld + h * HD;
                double mx = -INFINITY;
                for (int64_t t2 = 0; t2 < T; t2++) {
                    p[t2] = 0.0;
                    if (t2 > t)
                        continue;
                    const double *k = qkv + (b * T + t2) * ld + kc;
                    double s = 0.0;
                    for (int64_t i = 0; i < HD; i++)
                        s += q[i] * k[i];
                    p[t2] = s * sc;
                    mx = p[t2] > mx ? p[t2] : mx;
                }
                double sum = 0.0;
                for (int64_t t2 = 0; t2 <= t; t2++)
                    sum += (p[t2] = exp(p[t2] - mx));
                double *o = out + (b * T + t) * NH * HD + h * HD;
                for (int64_t i = 0; i < HD; i++)
                    o[i] = 0.0;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    p[t2] /= sum;
                    const double *v = qkv + (b * T + t2) * ld + vc;
                    for (int64_t i = 0; i < HD; i++)
                        o[i] += p[t2] * v[i];
                }
            }
        }
}

static void ref_gqa_bwd(double *dqkv, const double *dout, const double *qkv, const double *att,
                        int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HD)
{
    int64_t ld = (NH + 2 * NKV) * HD, grp = NH / NKV;
    double sc = 1.0 / sqrt((double)HD);
    double *da = malloc((size_t)T * sizeof *da);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            int64_t kc = (NH + h / grp) * HD, vc = kc + NKV * HD;
            for (int64_t t = 0; t < T; t++) {
                const double *p = att + ((b * NH + h) * T + t) * T;
                const double *g = dout + (b * T + t) * NH * HD + h * HD;
                const double *q = qkv + (b * T + t) * ld + h * HD;
                double *dq = dqkv + (b * T + t) * ld + h * HD;
                double ws = 0.0;
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const double *v = qkv + (b * T + t2) * ld + vc;
                    double *dv = dqkv + (b * T + t2) * ld + vc;
                    da[t2] = 0.0;
                    for (int64_t i = 0; i < HD; i++) {
                        da[t2] += g[i] * v[i];
                        dv[i] += p[t2] * g[i];
                    }
                    ws += p[t2] * da[t2];
                }
                for (int64_t t2 = 0; t2 <= t; t2++) {
                    const double *k = qkv + (b * T + t2) * ld + kc;
                    double *dk = dqkv + (b * T + t2) * ld + kc;
                    double dp = p[t2] * (da[t2] - ws) * sc;
                    for (int64_t i = 0; i < HD; i++) {
                        dq[i] += dp * k[i];
                        dk[i] += dp * q[i];
                    }
                }
            }
        }
    free(da);
}

/* ============================================================ RMSNorm */

typedef struct {
    double *x, *w, *g, *out;
    int64_t N, C;
    double eps;
} rms_ctx_t;

static double rms_loss(void *p)
{
    rms_ctx_t *a = p;
    ref_rms_fwd(a->out, NULL, a->x, a->w, a->N, a->C, a->eps);
    return dotd(a->out, a->g, a->N * a->C);
}

static void test_rmsnorm(void **state)
{
    const int64_t N = 9, C = 37; /* C: four lanes of 8 and a tail of 5 */
    const float eps = 1e-5f;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 2601);
    float *x = hrand(&r, N * C, -2, 2), *w = hrand(&r, C, 0.5, 1.5);
    float *g = hrand(&r, N * C, -1, 1), *dx0 = hrand(&r, N * C, -1, 1);
    float *dw0 = hrand(&r, C, -1, 1);
    double *xd = hd(x, N * C), *wd = hd(w, C), *gd = hd(g, N * C);
    double *outd = hzero(N * C), *rsd = hzero(N), *gx = hzero(N * C), *gw = hzero(C);
    ref_rms_fwd(outd, rsd, xd, wd, N, C, eps);
    ref_rms_bwd(gx, gw, gd, xd, wd, N, C, eps);
    double *dx0d = hd(dx0, N * C), *dw0d = hd(dw0, C);
    float *outs[NDEV], *rss[NDEV], *dxs[NDEV], *dws[NDEV];
    for (int i = 0; i < NDEV; i++) {
        dev_t_ *c = &g_dev[i];
        float *dxv = dcopy(c, x, N * C), *dwv = dcopy(c, w, C), *dg = dcopy(c, g, N * C);
        float *out = dalloc(c, N * C * 4), *rs = dalloc(c, N * 4);
        float *dx = dcopy(c, dx0, N * C), *dw = dcopy(c, dw0, C);
        OK(c->K->rmsnorm_forward(c->dev, NULL, out, rs, dxv, dwv, DT_F32, N, C, eps));
        /* rstd: in double, rounded once (cuda: f32 block sums, rsqrtf,
         * a few u) */
        CHECK("rmsnorm_forward rstd", rs, rsd, N, g_cuda ? 4e-7 : 1e-7, 0);
        /* out: x rstd w, two f32 roundings of |out| < 4 on an rstd good
         * to u */
        CHECK("rmsnorm_forward out", out, outd, N * C, 1e-6, 1e-7);
        for (int call = 1; call <= 2; call++) {
            OK(c->K->rmsnorm_backward(c->dev, NULL, dx, dw, dg, dxv, dwv, rs, DT_F32, N, C));
            double *w1 = accum(dx0d, gx, call, N * C), *w2 = accum(dw0d, gw, call, C);
            /* dinp: a C-term mean of |terms| < 3 times rstd (< 2):
             * atol 1e-6 sqrt(C) per call; dweight: N-term sums */
            CHECK("rmsnorm_backward dinp", dx, w1, N * C, 1e-5, 1e-6 * sqrt((double)C) * call);
            CHECK("rmsnorm_backward dweight", dw, w2, C, 1e-5, 1e-6 * sqrt((double)N) * call);
            free(w1), free(w2);
        }
        outs[i] = out, rss[i] = rs, dxs[i] = dx, dws[i] = dw;
        dfree(c, dxv), dfree(c, dwv), dfree(c, dg);
    }
    if (!g_cuda) {
        same_bits("rmsnorm_forward out", outs, N * C);
        same_bits("rmsnorm_forward rstd", rss, N);
        same_bits("rmsnorm_backward dinp", dxs, N * C);
        same_bits("rmsnorm_backward dweight", dws, C);
    }
    for (int i = 0; i < NDEV; i++)
        dfree(&g_dev[i], outs[i]), dfree(&g_dev[i], rss[i]), dfree(&g_dev[i], dxs[i]),
            dfree(&g_dev[i], dws[i]);
    /* dinp NULL: dweight alone */
    {
        dev_t_ *c = &g_dev[0];
        float *dxv = dcopy(c, x, N * C), *dwv = dcopy(c, w, C), *dg = dcopy(c, g, N * C);
        float *out = dalloc(c, N * C * 4), *rs = dalloc(c, N * 4), *dw = dcopy(c, dw0, C);
        OK(c->K->rmsnorm_forward(c->dev, NULL, out, rs, dxv, dwv, DT_F32, N, C, eps));
        OK(c->K->rmsnorm_backward(c->dev, NULL, NULL, dw, dg, dxv, NULL, rs, DT_F32, N, C));
        double *w2 = accum(dw0d, gw, 1, C);
        CHECK("rmsnorm_backward dweight (no dinp)", dw, w2, C, 1e-5, 1e-6 * sqrt((double)N));
        free(w2);
        dfree(c, dxv), dfree(c, dwv), dfree(c, dg), dfree(c, out), dfree(c, rs), dfree(c, dw);
    }
    /* the reference's gradients against finite differences (a smaller
     * shape: 2 N C forwards each) */
    {
        const int64_t n = 3, cc = 11;
        rms_ctx_t a = {.x = hd(x, n * cc), .w = hd(w, cc), .g = hd(g, n * cc),
                       .out = hzero(n * cc), .N = n, .C = cc, .eps = eps};
        double *ax = hzero(n * cc), *aw = hzero(cc);
        ref_rms_bwd(ax, aw, a.g, a.x, a.w, n, cc, eps);
        fd_check("ref rmsnorm dinp", a.x, n * cc, ax, rms_loss, &a);
        fd_check("ref rmsnorm dweight", a.w, cc, aw, rms_loss, &a);
        free(a.x), free(a.w), free(a.g), free(a.out), free(ax), free(aw);
    }
    free(x), free(w), free(g), free(dx0), free(dw0), free(xd), free(wd), free(gd);
    free(outd), free(rsd), free(gx), free(gw), free(dx0d), free(dw0d);
}

/* =============================================================== RoPE */

/* Llama's tables: inv_freq[i] = theta^(-2i/HD), angle t inv_freq[i]. */
static void rope_tables(float *cs, float *sn, int64_t T, int64_t HD, double theta)
{
    int64_t half = HD / 2;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            double a = (double)t * pow(theta, -2.0 * (double)i / (double)HD);
            cs[t * half + i] = (float)cos(a);
            sn[t * half + i] = (float)sin(a);
        }
}

typedef struct {
    double *x, *g, *out, *cs, *sn;
    int64_t B, T, NH, HD, ld;
} rope_ctx_t;

static double rope_loss(void *p)
{
    rope_ctx_t *a = p;
    int64_t n = a->B * a->T * a->ld;
    ref_rope(a->out, a->x, a->cs, a->sn, a->B, a->T, a->NH, a->HD, a->ld, 1, 0);
    return dotd(a->out, a->g, n);
}

static void test_rope(void **state)
{
    /* q (3 heads) and k (1 head) of a packed qkv row of (3 + 2) * 6:
     * rope on the q part and on the k part, v untouched */
    const int64_t B = 2, T = 7, NH = 3, NKV = 1, HD = 6, ld = (NH + 2 * NKV) * HD;
    const int64_t n = B * T * ld, half = HD / 2;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 2602);
    float *cs = malloc(T * half * 4), *sn = malloc(T * half * 4);
    rope_tables(cs, sn, T, HD, 10000.0);
    float *x = hrand(&r, n, -2, 2), *g = hrand(&r, n, -1, 1), *d0 = hrand(&r, n, -1, 1);
    double *xd = hd(x, n), *gd = hd(g, n), *csd = hd(cs, T * half), *snd = hd(sn, T * half);
    double *want = hd(x, n), *gx = hzero(n), *d0d = hd(d0, n), *gin = hd(g, n);
    ref_rope(want, xd, csd, snd, B, T, NH, HD, ld, 1, 0);
    ref_rope(want + NH * HD, xd + NH * HD, csd, snd, B, T, NKV, HD, ld, 1, 0);
    ref_rope(gx, gd, csd, snd, B, T, NH, HD, ld, -1, 0);
    ref_rope(gx + NH * HD, gd + NH * HD, csd, snd, B, T, NKV, HD, ld, -1, 0);
    /* v's part: forward leaves it, the in-place backward too; the
     * accumulating one adds nothing there */
    for (int64_t row = 0; row < B * T; row++)
        for (int64_t j = (NH + NKV) * HD; j < ld; j++)
            gin[row * ld + j] = gd[row * ld + j], gx[row * ld + j] = 0.0;
    double *gip = hd(g, n); /* the in-place result: rotated q, k, v as given */
    for (int64_t i = 0; i < n; i++)
        gip[i] = gx[i];
    for (int64_t row = 0; row < B * T; row++)
        for (int64_t j = (NH + NKV) * HD; j < ld; j++)
            gip[row * ld + j] = gd[row * ld + j];
    float *outs[NDEV], *dxs[NDEV], *ips[NDEV];
    for (int i = 0; i < NDEV; i++) {
        dev_t_ *c = &g_dev[i];
        float *dcs = dcopy(c, cs, T * half), *dsn = dcopy(c, sn, T * half);
        float *xin = dcopy(c, x, n), *out = dcopy(c, x, n), *dg = dcopy(c, g, n);
        OK(c->K->rope_forward(c->dev, NULL, out, xin, dcs, dsn, DT_F32, B, T, NH, HD, ld));
        OK(c->K->rope_forward(c->dev, NULL, out + NH * HD, xin + NH * HD, dcs, dsn, DT_F32, B,
                              T, NKV, HD, ld));
        /* two products and an add of |x| < 2 with |c|, |s| <= 1: a few u */
        CHECK("rope_forward out", out, want, n, 1e-6, 3e-7);
        /* in place: the same result */
        OK(c->K->rope_forward(c->dev, NULL, xin, xin, dcs, dsn, DT_F32, B, T, NH, HD, ld));
        OK(c->K->rope_forward(c->dev, NULL, xin + NH * HD, xin + NH * HD, dcs, dsn, DT_F32, B,
                              T, NKV, HD, ld));
        assert_memory_equal(xin, out, (size_t)n * 4);
        float *dx = dcopy(c, d0, n);
        for (int call = 1; call <= 2; call++) {
            OK(c->K->rope_backward(c->dev, NULL, dx, dg, dcs, dsn, DT_F32, B, T, NH, HD, ld));
            OK(c->K->rope_backward(c->dev, NULL, dx + NH * HD, dg + NH * HD, dcs, dsn, DT_F32,
                                   B, T, NKV, HD, ld));
            double *w1 = accum(d0d, gx, call, n);
            CHECK("rope_backward dinp", dx, w1, n, 1e-6, 3e-7 * call);
            free(w1);
        }
        OK(c->K->rope_backward(c->dev, NULL, dg, dg, dcs, dsn, DT_F32, B, T, NH, HD, ld));
        OK(c->K->rope_backward(c->dev, NULL, dg + NH * HD, dg + NH * HD, dcs, dsn, DT_F32, B,
                               T, NKV, HD, ld));
        CHECK("rope_backward in place", dg, gip, n, 1e-6, 3e-7);
        outs[i] = out, dxs[i] = dx, ips[i] = dg;
        dfree(c, dcs), dfree(c, dsn), dfree(c, xin);
    }
    if (!g_cuda) {
        same_bits("rope_forward", outs, n);
        same_bits("rope_backward", dxs, n);
        same_bits("rope_backward in place", ips, n);
    }
    for (int i = 0; i < NDEV; i++)
        dfree(&g_dev[i], outs[i]), dfree(&g_dev[i], dxs[i]), dfree(&g_dev[i], ips[i]);
    /* the reference's transposed rotation is the gradient of the forward
     * (q heads only: the context rotates NH heads of each row) */
    {
        rope_ctx_t a = {.x = hd(x, n), .g = hd(g, n), .out = hzero(n), .cs = csd, .sn = snd,
                        .B = B, .T = T, .NH = NH, .HD = HD, .ld = ld};
        /* the forward copies nothing outside the heads: zero the rest of g */
        for (int64_t row = 0; row < B * T; row++)
            for (int64_t j = NH * HD; j < ld; j++)
                a.g[row * ld + j] = 0.0;
        double *an = hzero(n);
        ref_rope(an, a.g, csd, snd, B, T, NH, HD, ld, -1, 0);
        fd_check("ref rope dinp", a.x, n, an, rope_loss, &a);
        free(a.x), free(a.g), free(a.out), free(an);
    }
    free(cs), free(sn), free(x), free(g), free(d0), free(xd), free(gd), free(csd), free(snd);
    free(want), free(gx), free(d0d), free(gin), free(gip);
}

/* ============================================================= SwiGLU */

typedef struct {
    double *x, *g, *out;
    int64_t N, H;
} swi_ctx_t;

static double swi_loss(void *p)
{
    swi_ctx_t *a = p;
    ref_swiglu_fwd(a->out, a->x, a->N, a->H);
    return dotd(a->out, a->g, a->N * a->H);
}

static void test_swiglu(void **state)
{
    const int64_t N = 5, H = 23;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 2603);
    /* gate over [-12, 12]: both tails of the sigmoid */
    float *x = hrand(&r, N * 2 * H, -12, 12), *g = hrand(&r, N * H, -1, 1);
    float *d0 = hrand(&r, N * 2 * H, -1, 1);
    double *xd = hd(x, N * 2 * H), *gd = hd(g, N * H), *d0d = hd(d0, N * 2 * H);
    double *want = hzero(N * H), *gx = hzero(N * 2 * H);
    ref_swiglu_fwd(want, xd, N, H);
    ref_swiglu_bwd(gx, xd, gd, N, H);
    float *outs[NDEV], *dxs[NDEV];
    for (int i = 0; i < NDEV; i++) {
        dev_t_ *c = &g_dev[i];
        float *xin = dcopy(c, x, N * 2 * H), *dg = dcopy(c, g, N * H);
        float *out = dalloc(c, N * H * 4), *dx = dcopy(c, d0, N * 2 * H);
        OK(c->K->swiglu_forward(c->dev, NULL, out, xin, DT_F32, N, H));
        /* expf within 2 ulp, then a divide and a product: rtol 1e-6,
         * atol for outputs near 0 from the far negative gate */
        CHECK("swiglu_forward out", out, want, N * H, 1e-6, 1e-7);
        for (int call = 1; call <= 2; call++) {
            OK(c->K->swiglu_backward(c->dev, NULL, dx, xin, dg, DT_F32, N, H));
            double *w1 = accum(d0d, gx, call, N * 2 * H);
            /* |silu'| <= 1.1 times |up| < 12: atol 4e-6 per call */
            CHECK("swiglu_backward dinp", dx, w1, N * 2 * H, 1e-5, 4e-6 * call);
            free(w1);
        }
        outs[i] = out, dxs[i] = dx;
        dfree(c, xin), dfree(c, dg);
    }
    if (!g_cuda) {
        same_bits("swiglu_forward", outs, N * H);
        same_bits("swiglu_backward", dxs, N * 2 * H);
    }
    for (int i = 0; i < NDEV; i++)
        dfree(&g_dev[i], outs[i]), dfree(&g_dev[i], dxs[i]);
    {
        /* finite differences away from the tails (eps 1e-6 of |x| < 3) */
        swi_ctx_t a = {.x = hzero(N * 2 * H), .g = gd, .out = hzero(N * H), .N = N, .H = H};
        for (int64_t i = 0; i < N * 2 * H; i++)
            a.x[i] = xd[i] / 4.0;
        double *an = hzero(N * 2 * H);
        ref_swiglu_bwd(an, a.x, gd, N, H);
        fd_check("ref swiglu dinp", a.x, N * 2 * H, an, swi_loss, &a);
        free(a.x), free(a.out), free(an);
    }
    free(x), free(g), free(d0), free(xd), free(gd), free(d0d), free(want), free(gx);
}

/* ================================================ grouped-query attention */

typedef struct {
    double *qkv, *g, *out, *att;
    int64_t B, T, NH, NKV, HD;
} gqa_ctx_t;

static double gqa_loss(void *p)
{
    gqa_ctx_t *a = p;
    ref_gqa_fwd(a->out, a->att, a->qkv, a->B, a->T, a->NH, a->NKV, a->HD);
    return dotd(a->out, a->g, a->B * a->T * a->NH * a->HD);
}

static void gqa_case(int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HD, uint64_t seed,
                     int fd)
{
    const int64_t ld = (NH + 2 * NKV) * HD, n3 = B * T * ld, no = B * T * NH * HD;
    const int64_t natt = B * NH * T * T;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, seed);
    float *qkv = hrand(&r, n3, -1.5, 1.5), *g = hrand(&r, no, -1, 1);
    float *d0 = hrand(&r, n3, -1, 1);
    double *qd = hd(qkv, n3), *gd = hd(g, no), *d0d = hd(d0, n3);
    double *want = hzero(no), *attd = hzero(natt), *gq = hzero(n3);
    ref_gqa_fwd(want, attd, qd, B, T, NH, NKV, HD);
    ref_gqa_bwd(gq, gd, qd, attd, B, T, NH, NKV, HD);
    float *outs[NDEV], *dqs[NDEV];
    for (int i = 0; i < NDEV; i++) {
        dev_t_ *c = &g_dev[i];
        uint64_t sb = 0;
        OK(c->K->attention_state_bytes(B, T, NH * HD, NH, DT_F32, &sb));
        float *dq = dcopy(c, qkv, n3), *dg = dcopy(c, g, no), *out = dalloc(c, no * 4);
        float *st = dalloc(c, (int64_t)sb), *dx = dcopy(c, d0, n3);
        OK(c->K->gqa_attention_forward(c->dev, NULL, out, st, dq, DT_F32, B, T, NH, NKV, HD));
        /* out: T-term weighted sums of |v| < 1.5 (as test_kernels) */
        CHECK("gqa_attention_forward out", out, want, no, 1e-5, 1e-6 * sqrt((double)T));
        for (int call = 1; call <= 2; call++) {
            OK(c->K->gqa_attention_backward(c->dev, NULL, dx, dg, dq, out, st, DT_F32, B, T,
                                            NH, NKV, HD));
            double *w1 = accum(d0d, gq, call, n3);
            /* dk, dv sum over the group's NH/NKV heads too: sqrt(T HD grp) */
            CHECK("gqa_attention_backward dqkv", dx, w1, n3, 1e-5,
                  1e-6 * sqrt((double)(T * HD * (NH / NKV))) * call);
            free(w1);
        }
        outs[i] = out, dqs[i] = dx;
        dfree(c, dq), dfree(c, dg), dfree(c, st);
    }
    if (!g_cuda) {
        same_bits("gqa_attention_forward", outs, no);
        same_bits("gqa_attention_backward", dqs, n3);
    }
    for (int i = 0; i < NDEV; i++)
        dfree(&g_dev[i], outs[i]), dfree(&g_dev[i], dqs[i]);
    if (fd) {
        gqa_ctx_t a = {.qkv = qd, .g = gd, .out = hzero(no), .att = hzero(natt), .B = B,
                       .T = T, .NH = NH, .NKV = NKV, .HD = HD};
        fd_check("ref gqa_attention dqkv", qd, n3, gq, gqa_loss, &a);
        free(a.out), free(a.att);
    }
    free(qkv), free(g), free(d0), free(qd), free(gd), free(d0d), free(want), free(attd);
    free(gq);
}

static void test_gqa_attention(void **state)
{
    gqa_case(2, 5, 4, 2, 3, 2604, 1);  /* groups of 2, odd head size */
    gqa_case(1, 6, 3, 1, 4, 2605, 1);  /* one kv head (multi-query) */
    gqa_case(2, 19, 6, 3, 10, 2606, 0); /* longer rows */
    gqa_case(1, 4, 2, 2, 5, 2607, 0);  /* NKV = NH */
}

/* NKV = NH is multi-head attention: the same bits as attention_*. */
static void test_gqa_is_attention(void **state)
{
    const int64_t B = 2, T = 9, NH = 3, HD = 5, C = NH * HD, n3 = B * T * 3 * C;
    const int64_t no = B * T * C;
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 2608);
    float *qkv = hrand(&r, n3, -1.5, 1.5), *g = hrand(&r, no, -1, 1);
    dev_t_ *c = &g_dev[1];
    uint64_t sb = 0;
    OK(c->K->attention_state_bytes(B, T, C, NH, DT_F32, &sb));
    float *dq = dcopy(c, qkv, n3), *dg = dcopy(c, g, no);
    float *o1 = dalloc(c, no * 4), *o2 = dalloc(c, no * 4);
    float *s1 = dalloc(c, (int64_t)sb), *s2 = dalloc(c, (int64_t)sb);
    float *d1 = dalloc(c, n3 * 4), *d2 = dalloc(c, n3 * 4);
    memset(d1, 0, (size_t)n3 * 4);
    memset(d2, 0, (size_t)n3 * 4);
    OK(c->K->attention_forward(c->dev, NULL, o1, s1, dq, DT_F32, B, T, C, NH));
    OK(c->K->gqa_attention_forward(c->dev, NULL, o2, s2, dq, DT_F32, B, T, NH, NH, HD));
    OK(c->K->attention_backward(c->dev, NULL, d1, dg, dq, o1, s1, DT_F32, B, T, C, NH));
    OK(c->K->gqa_attention_backward(c->dev, NULL, d2, dg, dq, o2, s2, DT_F32, B, T, NH, NH,
                                    HD));
    assert_memory_equal(o1, o2, (size_t)no * 4);
    assert_memory_equal(s1, s2, (size_t)sb);
    assert_memory_equal(d1, d2, (size_t)n3 * 4);
    dfree(c, dq), dfree(c, dg), dfree(c, o1), dfree(c, o2), dfree(c, s1), dfree(c, s2);
    dfree(c, d1), dfree(c, d2);
    free(qkv), free(g);
}

/* ================================================== bf16 activations */

/* Every kernel with bf16 storage against the f32 kernel on the same
 * (bf16-exact) inputs: bf16 results are the f32 computation rounded once
 * per stored element (cpu_bf16.h), so each is within 2^-8 relative of
 * the f32 result (a gradient accumulated once: of its f32 sum), plus the
 * f32 run's own tiny differences (a different accumulation order: none
 * here but the attention's widened copies, which compute the same). */
static uint16_t *to_bf(dev_t_ *c, float *f, int64_t n)
{
    uint16_t *p = dalloc(c, n * 2);
    OK(c->K->cast(c->dev, NULL, p, DT_BF16, f, DT_F32, n));
    OK(c->K->cast(c->dev, NULL, f, DT_F32, p, DT_BF16, n)); /* f now bf16-exact */
    return p;
}
static void check_bf(const char *what, dev_t_ *c, const uint16_t *got, const float *f32,
                     int64_t n)
{
    float *w = dalloc(c, n * 4);
    OK(c->K->cast(c->dev, NULL, w, DT_F32, got, DT_BF16, n));
    double *want = hd(f32, n);
    /* one rounding to bf16 (2^-8 relative) of the f32 value; atol for
     * values that cancel to near 0 in f32 vs bf16 inputs: none (inputs
     * are the same bf16-exact values) beyond 1e-30 */
    CHECK(what, w, want, n, 0x1p-8, 1e-30);
    free(want);
    dfree(c, w);
}

static void test_bf16(void **state)
{
    dev_t_ *c = &g_dev[1];
    dt_ref_rng_t r;
    dt_ref_rng_seed(&r, 2609);
    /* RMSNorm */
    {
        const int64_t N = 6, C = 29;
        float *x = drand(c, &r, N * C, -2, 2), *w = drand(c, &r, C, .5, 1.5);
        float *g = drand(c, &r, N * C, -1, 1);
        uint16_t *xb = to_bf(c, x, N * C), *wb = to_bf(c, w, C), *gb = to_bf(c, g, N * C);
        float *o = dalloc(c, N * C * 4), *rs = dalloc(c, N * 4), *rsb = dalloc(c, N * 4);
        uint16_t *ob = dalloc(c, N * C * 2);
        OK(c->K->rmsnorm_forward(c->dev, NULL, o, rs, x, w, DT_F32, N, C, 1e-6f));
        OK(c->K->rmsnorm_forward(c->dev, NULL, ob, rsb, xb, wb, DT_BF16, N, C, 1e-6f));
        assert_memory_equal(rs, rsb, (size_t)N * 4); /* the same f32 statistics */
        check_bf("bf16 rmsnorm_forward", c, ob, o, N * C);
        float *dx = dalloc(c, N * C * 4), *dw = dalloc(c, C * 4), *dwb = dalloc(c, C * 4);
        uint16_t *dxb = dalloc(c, N * C * 2);
        memset(dx, 0, (size_t)N * C * 4), memset(dw, 0, (size_t)C * 4);
        memset(dwb, 0, (size_t)C * 4), memset(dxb, 0, (size_t)N * C * 2);
        OK(c->K->rmsnorm_backward(c->dev, NULL, dx, dw, g, x, w, rs, DT_F32, N, C));
        OK(c->K->rmsnorm_backward(c->dev, NULL, dxb, dwb, gb, xb, wb, rs, DT_BF16, N, C));
        check_bf("bf16 rmsnorm_backward dinp", c, dxb, dx, N * C);
        assert_memory_equal(dw, dwb, (size_t)C * 4); /* f32 from exact widened loads */
    }
    /* RoPE, SwiGLU */
    {
        const int64_t B = 1, T = 5, NH = 2, HD = 8, n = B * T * NH * HD;
        float *cs = malloc(T * HD / 2 * 4), *sn = malloc(T * HD / 2 * 4);
        rope_tables(cs, sn, T, HD, 500000.0);
        float *dcs = dcopy(c, cs, T * HD / 2), *dsn = dcopy(c, sn, T * HD / 2);
        float *x = drand(c, &r, n, -2, 2), *o = dalloc(c, n * 4);
        uint16_t *xb = to_bf(c, x, n), *ob = dalloc(c, n * 2);
        OK(c->K->rope_forward(c->dev, NULL, o, x, dcs, dsn, DT_F32, B, T, NH, HD, NH * HD));
        OK(c->K->rope_forward(c->dev, NULL, ob, xb, dcs, dsn, DT_BF16, B, T, NH, HD, NH * HD));
        check_bf("bf16 rope_forward", c, ob, o, n);
        OK(c->K->rope_backward(c->dev, NULL, o, o, dcs, dsn, DT_F32, B, T, NH, HD, NH * HD));
        OK(c->K->rope_backward(c->dev, NULL, ob, ob, dcs, dsn, DT_BF16, B, T, NH, HD, NH * HD));
        /* ob was rounded once by forward: compare with the f32 run started
         * from the same rounded values */
        float *ow = dalloc(c, n * 4);
        uint16_t *ob2 = dalloc(c, n * 2);
        OK(c->K->rope_forward(c->dev, NULL, ob2, xb, dcs, dsn, DT_BF16, B, T, NH, HD, NH * HD));
        OK(c->K->cast(c->dev, NULL, ow, DT_F32, ob2, DT_BF16, n));
        OK(c->K->rope_backward(c->dev, NULL, ow, ow, dcs, dsn, DT_F32, B, T, NH, HD, NH * HD));
        check_bf("bf16 rope_backward in place", c, ob, ow, n);
        free(cs), free(sn);

        const int64_t N = 4, H = 17;
        float *si = drand(c, &r, N * 2 * H, -6, 6), *so = dalloc(c, N * H * 4);
        float *sg = drand(c, &r, N * H, -1, 1);
        uint16_t *sib = to_bf(c, si, N * 2 * H), *sgb = to_bf(c, sg, N * H);
        uint16_t *sob = dalloc(c, N * H * 2);
        OK(c->K->swiglu_forward(c->dev, NULL, so, si, DT_F32, N, H));
        OK(c->K->swiglu_forward(c->dev, NULL, sob, sib, DT_BF16, N, H));
        check_bf("bf16 swiglu_forward", c, sob, so, N * H);
        float *sd = dalloc(c, N * 2 * H * 4);
        uint16_t *sdb = dalloc(c, N * 2 * H * 2);
        memset(sd, 0, (size_t)N * 2 * H * 4), memset(sdb, 0, (size_t)N * 2 * H * 2);
        OK(c->K->swiglu_backward(c->dev, NULL, sd, si, sg, DT_F32, N, H));
        OK(c->K->swiglu_backward(c->dev, NULL, sdb, sib, sgb, DT_BF16, N, H));
        check_bf("bf16 swiglu_backward", c, sdb, sd, N * 2 * H);
    }
    /* grouped-query attention: the cpu computes the bf16 run in f32 on the
     * widened values, so out and dqkv are the f32 run's rounded once (the
     * state, f32 probabilities, the same bits) */
    if (!g_cuda) {
        const int64_t B = 2, T = 7, NH = 4, NKV = 2, HD = 6, ld = (NH + 2 * NKV) * HD;
        const int64_t n3 = B * T * ld, no = B * T * NH * HD;
        uint64_t sb = 0;
        OK(c->K->attention_state_bytes(B, T, NH * HD, NH, DT_BF16, &sb));
        float *q = drand(c, &r, n3, -1.5, 1.5), *g = drand(c, &r, no, -1, 1);
        uint16_t *qb = to_bf(c, q, n3), *gb = to_bf(c, g, no);
        float *o = dalloc(c, no * 4), *st = dalloc(c, (int64_t)sb), *stb = dalloc(c, (int64_t)sb);
        uint16_t *ob = dalloc(c, no * 2);
        OK(c->K->gqa_attention_forward(c->dev, NULL, o, st, q, DT_F32, B, T, NH, NKV, HD));
        OK(c->K->gqa_attention_forward(c->dev, NULL, ob, stb, qb, DT_BF16, B, T, NH, NKV, HD));
        assert_memory_equal(st, stb, (size_t)sb);
        check_bf("bf16 gqa_attention_forward", c, ob, o, no);
        float *d = dalloc(c, n3 * 4);
        uint16_t *db = dalloc(c, n3 * 2);
        memset(d, 0, (size_t)n3 * 4), memset(db, 0, (size_t)n3 * 2);
        OK(c->K->gqa_attention_backward(c->dev, NULL, d, g, q, o, st, DT_F32, B, T, NH, NKV, HD));
        OK(c->K->gqa_attention_backward(c->dev, NULL, db, gb, qb, ob, st, DT_BF16, B, T, NH, NKV,
                                        HD));
        check_bf("bf16 gqa_attention_backward", c, db, d, n3);
    }
    /* (buffers are released with the devices at teardown) */
}

/* ============================================================ refusals */

static void test_errors(void **state)
{
    dev_t_ *c = &g_dev[0];
    float x[256] = {0};
    assert_status(c->K->rope_forward(c->dev, NULL, x, x, x, x, DT_F32, 1, 2, 2, 5, 10),
                  DT_ERR_INVALID);
    assert_dev_msg("rope_forward: HD = 5 must be even (pairs i, i + HD/2)");
    assert_status(c->K->rope_backward(c->dev, NULL, x, x, x, x, DT_F32, 1, 2, 3, 4, 10),
                  DT_ERR_INVALID);
    assert_dev_msg("rope_backward: NH * HD = 12 is more than the row length ld = 10");
    assert_status(c->K->gqa_attention_forward(c->dev, NULL, x, x, x, DT_F32, 1, 2, 3, 2, 4),
                  DT_ERR_INVALID);
    assert_dev_msg("gqa_attention_forward: NH = 3 is not a multiple of NKV = 2");
    assert_status(c->K->gqa_attention_backward(c->dev, NULL, x, x, x, NULL, x, DT_F32, 1, 2, 2,
                                               1, 4),
                  DT_ERR_INVALID);
    assert_dev_msg("gqa_attention_backward: out is NULL (16 elements)");
    assert_status(c->K->rmsnorm_forward(c->dev, NULL, x, x, x, x, DT_F32, 2, 3, -1.0f),
                  DT_ERR_INVALID);
    assert_dev_msg("rmsnorm_forward: eps = -1 must be finite and >= 0");
    assert_status(c->K->rmsnorm_forward(c->dev, NULL, x, x, x, NULL, DT_F32, 2, 3, 1e-5f),
                  DT_ERR_INVALID);
    assert_dev_msg("rmsnorm_forward: weight is NULL (3 elements)");
    assert_status(c->K->swiglu_forward(c->dev, NULL, x, x, DT_F16, 2, 3), DT_ERR_UNSUPPORTED);
    assert_dev_msg("swiglu_forward: f16 activations: unsupported (the cpu device runs f32 or "
                   "bf16 activations)");
    assert_status(c->K->swiglu_backward(c->dev, NULL, x, x, x, DT_F32, -1, 3), DT_ERR_INVALID);
    assert_dev_msg("swiglu_backward: N = -1 must be >= 0");
    /* guard_memory: each new kernel refuses a host pointer, naming it */
    {
        dev_t_ gd;
        static const dt_test_kv_t kv_guard[] = {{"guard_memory", "true"}, {NULL, NULL}};
        gd.ops = plugin_ops();
        gd.K = gd.ops->kernels();
        dt_test_host_init(&gd.th, g_prefix, kv_guard);
        const dt_device_init_v1_t ia = {.struct_size = sizeof ia, .local_size = 1,
                                        .device_index = -1};
        OK(gd.ops->init(&gd.th.host, &ia, &gd.dev));
        float *dv = NULL;
        OK(gd.ops->alloc(gd.dev, 1024, DT_TAG_ACTIVATIONS, (void **)&dv));
        const char *why = " is not this device's memory";
        assert_status(gd.K->rmsnorm_forward(gd.dev, NULL, x, dv, dv, dv, DT_F32, 2, 3, 1e-5f),
                      DT_ERR_INVALID);
        assert_non_null(strstr(dt_last_error(), "rmsnorm_forward: out = "));
        assert_non_null(strstr(dt_last_error(), why));
        assert_status(gd.K->rmsnorm_backward(gd.dev, NULL, dv, x, dv, dv, dv, dv, DT_F32, 2, 3),
                      DT_ERR_INVALID);
        assert_non_null(strstr(dt_last_error(), "rmsnorm_backward: dweight = "));
        assert_status(gd.K->rope_forward(gd.dev, NULL, dv, dv, x, dv, DT_F32, 1, 2, 1, 4, 4),
                      DT_ERR_INVALID);
        assert_non_null(strstr(dt_last_error(), "rope_forward: cos = "));
        assert_status(gd.K->rope_backward(gd.dev, NULL, dv, dv, dv, x, DT_F32, 1, 2, 1, 4, 4),
                      DT_ERR_INVALID);
        assert_non_null(strstr(dt_last_error(), "rope_backward: sin = "));
        assert_status(gd.K->swiglu_forward(gd.dev, NULL, dv, x, DT_F32, 2, 3), DT_ERR_INVALID);
        assert_non_null(strstr(dt_last_error(), "swiglu_forward: inp = "));
        assert_status(gd.K->swiglu_backward(gd.dev, NULL, dv, dv, x, DT_F32, 2, 3),
                      DT_ERR_INVALID);
        assert_non_null(strstr(dt_last_error(), "swiglu_backward: dout = "));
        assert_status(gd.K->gqa_attention_forward(gd.dev, NULL, dv, x, dv, DT_F32, 1, 2, 2, 1,
                                                  4),
                      DT_ERR_INVALID);
        assert_non_null(strstr(dt_last_error(), "gqa_attention_forward: state = "));
        assert_status(gd.K->gqa_attention_backward(gd.dev, NULL, dv, dv, dv, dv, x, DT_F32, 1, 2,
                                                   2, 1, 4),
                      DT_ERR_INVALID);
        assert_non_null(strstr(dt_last_error(), "gqa_attention_backward: state = "));
        /* device memory runs (the arena opened and closed around it) */
        OK(gd.K->swiglu_forward(gd.dev, NULL, dv, dv + 64, DT_F32, 2, 3));
        OK(gd.ops->free(gd.dev, dv));
        gd.ops->finalize(gd.dev);
    }
    /* empty shapes touch nothing */
    OK(c->K->swiglu_forward(c->dev, NULL, NULL, NULL, DT_F32, 0, 3));
    OK(c->K->rope_forward(c->dev, NULL, NULL, NULL, NULL, NULL, DT_F32, 0, 2, 2, 4, 8));
    OK(c->K->rmsnorm_backward(c->dev, NULL, NULL, NULL, NULL, NULL, NULL, NULL, DT_F32, 0, 8));
}

int main(int argc, char **argv)
{
    const struct CMUnitTest common[] = {
        cmocka_unit_test(test_rmsnorm),      cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),       cmocka_unit_test(test_gqa_attention),
        cmocka_unit_test(test_gqa_is_attention), cmocka_unit_test(test_bf16),
    };
    const struct CMUnitTest cpu_only[] = {
        cmocka_unit_test(test_errors),
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
        return cmocka_run_group_tests_name("llama kernels on cuda", common, group_setup,
                                           group_teardown);
    }
    if (strcmp(g_device, "cpu") != 0) {
        fprintf(stderr, "usage: test_kernels_llama [cpu|cuda]\n");
        return 2;
    }
    int failed = cmocka_run_group_tests_name("llama kernels on cpu", common, group_setup,
                                             group_teardown);
    return failed + cmocka_run_group_tests_name("llama kernels: the cpu's own", cpu_only,
                                                group_setup, group_teardown);
}
