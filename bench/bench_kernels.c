/*
 * bench/bench_kernels.c - times the cpu device's kernels at GPT-2 124M
 * shapes: sgemm forward/backward for every linear layer (GFLOP/s, at each
 * thread count asked for) and every other kernel once per layer's size
 * (the LLaMA family's RMSNorm, SwiGLU, RoPE and grouped-query attention at
 * the same sizes).
 *
 *   bench_kernels [--threads 1,2] [--plugin path/dtrain_cpu.so]
 *                 [--B 4] [--T 64] [--min-time 0.3]
 *
 * Loads the plugin with dlopen and drives it through its ops table with a
 * small host table of its own (no libdtrain), so it measures only the
 * plugin.  Prints markdown tables (bench/results/kernels.md).
 */
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtrain/dtrain.h"

/* ------------------------------------------------------- a tiny host */

static int64_t g_threads;

static void h_log(const dt_host_v1_t *h, int level, const char *fmt, ...)
{
    if (level > DT_LOG_WARN)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("device/cpu: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static int h_set_error(const dt_host_v1_t *h, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("error: device/cpu: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return status;
}

static void *h_alloc(const dt_host_v1_t *h, uint64_t bytes, int tag)
{
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}
static void h_free(const dt_host_v1_t *h, void *p)
{
    free(p);
}
/* The cpu plugin's keys: threads as asked, no memory budget, no
 * guard_memory (the plugin reads each one and refuses an absent one). */
static int h_cfg_bool(const dt_host_v1_t *h, const char *k, int *o)
{
    if (strcmp(k, "guard_memory") != 0)
        return DT_ERR_NOT_FOUND;
    *o = 0;
    return DT_OK;
}
static int h_cfg_int(const dt_host_v1_t *h, const char *k, int64_t *o)
{
    if (strcmp(k, "memory_limit") == 0) {
        *o = 0;
        return DT_OK;
    }
    if (strcmp(k, "threads") != 0)
        return DT_ERR_NOT_FOUND;
    *o = g_threads;
    return DT_OK;
}
static int h_cfg_float(const dt_host_v1_t *h, const char *k, double *o)
{
    return DT_ERR_NOT_FOUND;
}
static int h_cfg_string(const dt_host_v1_t *h, const char *k, const char **o)
{
    return DT_ERR_NOT_FOUND;
}

static uint64_t h_now_ns(const dt_host_v1_t *h)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const dt_host_v1_t g_host = {
    .abi_major = DT_HOST_ABI_MAJOR,
    .abi_minor = DT_HOST_ABI_MINOR,
    .struct_size = sizeof(dt_host_v1_t),
    .name = "bench_kernels",
    .version = DTRAIN_VERSION_STRING,
    .log = h_log,
    .set_error = h_set_error,
    .alloc = h_alloc,
    .free = h_free,
    .cfg_bool = h_cfg_bool,
    .cfg_int = h_cfg_int,
    .cfg_float = h_cfg_float,
    .cfg_string = h_cfg_string,
    .now_ns = h_now_ns,
};

/* ---------------------------------------------------------- plumbing */

static const dt_device_ops_v1_t *ops;
static const dt_kernels_v1_t *K;
static dt_device_t *dev;
static double g_min_time = 0.3;

#define CK(expr)                                                               \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != DT_OK) {                                                    \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__,      \
                    #expr, dt_status_name(rc_));                               \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

static double now_s(void)
{
    return (double)h_now_ns(NULL) * 1e-9;
}

static void *dalloc(int64_t bytes, int tag)
{
    void *p;
    CK(ops->alloc(dev, (uint64_t)bytes, tag, &p));
    return p;
}

static float *drand(int64_t n, float lo, float hi, uint32_t seed)
{
    float *p = dalloc(n * 4, DT_TAG_ACTIVATIONS);
    uint32_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = lo + (hi - lo) * (float)(s >> 8) * (1.0f / 16777216.0f);
    }
    return p;
}

/* Calls `fn` until min_time has passed (at least 3 timed calls after one
 * warm-up); returns the median and the best, seconds per call.  Median,
 * not mean: the 2-core machines this runs on are shared, and a call that
 * loses its core for a scheduler slice should not move the number. */
typedef void (*bench_fn)(void *ctx);
#define BENCH_MAX_REPS 4096
static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static void timeit(bench_fn fn, void *ctx, double *median, double *best)
{
    static double t[BENCH_MAX_REPS];
    fn(ctx); /* warm-up: page faults, scratch growth */
    double total = 0.0;
    int reps = 0;
    while (reps < BENCH_MAX_REPS && (reps < 3 || total < g_min_time)) {
        double t0 = now_s();
        fn(ctx);
        t[reps] = now_s() - t0;
        total += t[reps++];
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    *median = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
    *best = t[0];
}

/* ------------------------------------------------------------ matmul */

typedef struct {
    float *out, *inp, *bias, *dout, *dinp, *dw, *db;
    void *w;
    int wdtype;
    int64_t N, C, OC;
} mm_t;

static void mm_fwd(void *p)
{
    mm_t *m = p;
    CK(K->matmul_forward(dev, NULL, m->out, m->inp, m->w, m->bias, DT_F32, m->wdtype,
                           m->N, m->C, m->OC));
}

static void mm_bwd(void *p)
{
    mm_t *m = p;
    CK(K->matmul_backward(dev, NULL, m->dinp, m->dw, m->db, m->dout, m->inp,
                            m->w, DT_F32, m->wdtype, m->N, m->C, m->OC));
}

static void bench_matmul(int64_t N)
{
    static const struct {
        const char *what;
        int64_t C, OC;
    } sh[] = {
        {"attn qkv", 768, 2304}, {"attn proj", 768, 768}, {"mlp fc", 768, 3072},
        {"mlp proj", 3072, 768}, {"lm head", 768, 50257},
    };
    printf("| layer | N x C x OC | weights | forward ms (median / best) | "
           "forward GFLOP/s (median) | backward ms (median / best) | "
           "backward GFLOP/s (median) |\n|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof sh / sizeof sh[0]; i++) {
        for (int bf = 0; bf < 2; bf++) {
            if (bf && strcmp(sh[i].what, "mlp fc") != 0 &&
                strcmp(sh[i].what, "lm head") != 0)
                continue; /* bf16 on two shapes is enough to see its cost */
            int64_t C = sh[i].C, OC = sh[i].OC;
            mm_t m = {
                .N = N, .C = C, .OC = OC, .wdtype = bf ? DT_BF16 : DT_F32};
            m.inp = drand(N * C, -1, 1, 1);
            float *wf = drand(OC * C, -0.05f, 0.05f, 2);
            m.w = wf;
            if (bf) {
                m.w = dalloc(OC * C * 2, DT_TAG_PARAMS);
                CK(K->cast(dev, NULL, m.w, DT_BF16, wf, DT_F32, OC * C));
            }
            m.bias = drand(OC, -1, 1, 3);
            m.out = dalloc(N * OC * 4, DT_TAG_ACTIVATIONS);
            m.dout = drand(N * OC, -1, 1, 4);
            m.dinp = drand(N * C, 0, 0, 5);
            m.dw = drand(OC * C, 0, 0, 6);
            m.db = drand(OC, 0, 0, 7);
            double fm, fb, bm, bb; /* median, best */
            timeit(mm_fwd, &m, &fm, &fb);
            timeit(mm_bwd, &m, &bm, &bb);
            double fl = 2.0 * (double)N * (double)C * (double)OC;
            printf("| %s | %lld x %lld x %lld | %s | %.2f / %.2f | %.1f | "
                   "%.2f / %.2f | %.1f |\n",
                   sh[i].what, (long long)N, (long long)C, (long long)OC,
                   bf ? "bf16" : "f32", fm * 1e3, fb * 1e3, fl / fm * 1e-9,
                   bm * 1e3, bb * 1e3, 2.0 * fl / bm * 1e-9);
            fflush(stdout);
            if (m.w != wf)
                CK(ops->free(dev, m.w));
            void *bufs[] = {m.inp,  wf,     m.bias, m.out,
                            m.dout, m.dinp, m.dw,   m.db};
            for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
                CK(ops->free(dev, bufs[k]));
        }
    }
}

/* ------------------------------------------------------- other kernels */

typedef struct {
    int64_t B, T, C, NH, V, P; /* P: parameter count for optimizer kernels */
    float *x, *y, *z, *w, *b, *mean, *rstd, *att, *qkv, *dqkv, *probs, *losses,
        *logits, *wte, *wpe;
    float *p, *g, *m, *v;
    float *cs, *sn; /* RoPE's (T, hs/2) tables */
    uint16_t *h;
    double *sq;
    int32_t *tok;
} k_t;

#define KFN(name, body)                                                        \
    static void name(void *ctx)                                                \
    {                                                                          \
        k_t *k = ctx;                                                          \
        body;                                                                  \
    }
KFN(k_emb_f, CK(K->embedding_forward(dev, NULL, k->x, k->tok, k->wte, k->wpe, DT_F32,
                                       k->B, k->T, k->C)))
KFN(k_emb_b, CK(K->embedding_backward(dev, NULL, k->wte, k->wpe, k->x, k->tok, DT_F32,
                                        k->B, k->T, k->C)))
KFN(k_ln_f, CK(K->layernorm_forward(dev, NULL, k->y, k->mean, k->rstd, k->x,
                                      k->w, k->b, DT_F32, k->B * k->T, k->C)))
KFN(k_ln_b,
    CK(K->layernorm_backward(dev, NULL, k->z, k->w, k->b, k->y, k->x, k->w,
                               k->mean, k->rstd, DT_F32, k->B * k->T, k->C)))
KFN(k_gelu_f,
    CK(K->gelu_forward(dev, NULL, k->y, k->x, DT_F32, k->B * k->T * 4 * k->C)))
KFN(k_gelu_b,
    CK(K->gelu_backward(dev, NULL, k->z, k->x, k->y, DT_F32, k->B * k->T * 4 * k->C)))
KFN(k_attn_f, CK(K->attention_forward(dev, NULL, k->y, k->att, k->qkv, DT_F32, k->B,
                                        k->T, k->C, k->NH)))
KFN(k_attn_b, CK(K->attention_backward(dev, NULL, k->dqkv, k->y, k->qkv, k->y,
                                         k->att, DT_F32, k->B, k->T, k->C, k->NH)))
/* the LLaMA family's: RMSNorm as layernorm's shape;
 * SwiGLU with H = 2C on x (N, 4C); RoPE in place on q and k of qkv (NH
 * heads of hs = C / NH each); grouped-query attention with NKV = NH / 3 */
KFN(k_rms_f, CK(K->rmsnorm_forward(dev, NULL, k->y, k->rstd, k->x, k->w, DT_F32,
                                     k->B * k->T, k->C, 1e-5f)))
KFN(k_rms_b, CK(K->rmsnorm_backward(dev, NULL, k->z, k->b, k->y, k->x, k->w, k->rstd,
                                      DT_F32, k->B * k->T, k->C)))
KFN(k_swi_f, CK(K->swiglu_forward(dev, NULL, k->y, k->x, DT_F32, k->B * k->T, 2 * k->C)))
KFN(k_swi_b, CK(K->swiglu_backward(dev, NULL, k->z, k->x, k->y, DT_F32, k->B * k->T,
                                     2 * k->C)))
KFN(k_rope_f, CK(K->rope_forward(dev, NULL, k->qkv, k->qkv, k->cs, k->sn, DT_F32, k->B,
                                   k->T, 2 * k->NH, k->C / k->NH, 3 * k->C)))
KFN(k_rope_b, CK(K->rope_backward(dev, NULL, k->dqkv, k->dqkv, k->cs, k->sn, DT_F32, k->B,
                                    k->T, 2 * k->NH, k->C / k->NH, 3 * k->C)))
KFN(k_gqa_f, CK(K->gqa_attention_forward(dev, NULL, k->y, k->att, k->qkv, DT_F32, k->B,
                                           k->T, k->NH, k->NH / 3, k->C / k->NH)))
KFN(k_gqa_b, CK(K->gqa_attention_backward(dev, NULL, k->dqkv, k->y, k->qkv, k->y, k->att,
                                            DT_F32, k->B, k->T, k->NH, k->NH / 3,
                                            k->C / k->NH)))
KFN(k_res,
    CK(K->residual_forward(dev, NULL, k->z, k->x, k->y, DT_F32, k->B * k->T * k->C)))
KFN(k_axpy, CK(K->axpy(dev, NULL, k->z, k->x, DT_F32, 0.5f, k->B * k->T * k->C)))
KFN(k_xent_f,
    CK(K->softmax_xent_forward(dev, NULL, k->losses, k->probs, k->logits,
                                 k->tok, DT_F32, k->B * k->T, k->V)))
KFN(k_xent_b, CK(K->softmax_xent_backward(dev, NULL, k->logits, k->probs,
                                            k->tok, DT_F32, 1e-3f, k->B * k->T, k->V)))
KFN(k_adamw, CK(K->adamw_update(dev, NULL, k->p, k->g, k->m, k->v, DT_F32, k->P,
                                  1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10)))
KFN(k_sgd, CK(K->sgd_update(dev, NULL, k->p, k->g, k->m, DT_F32, k->P, 1e-4f, 0.9f,
                              0.0f, 0, 1.0f)))
KFN(k_sumsq, CK(K->sumsq(dev, NULL, k->sq, k->g, DT_F32, k->P)))
KFN(k_scale, CK(K->scale(dev, NULL, k->g, DT_F32, 1.0f, k->P)))
KFN(k_cast, CK(K->cast(dev, NULL, k->h, DT_BF16, k->p, DT_F32, k->P)))

static void bench_others(int64_t B, int64_t T)
{
    k_t k = {.B = B, .T = T, .C = 768, .NH = 12, .V = 50257, .P = 124439808};
    int64_t N = B * T, C = k.C;
    k.x = drand(N * 4 * C, -2, 2, 11);
    k.y = drand(N * 4 * C, -1, 1, 12);
    k.z = drand(N * 4 * C, -1, 1, 13);
    k.w = drand(C, 0.5f, 1.5f, 14);
    k.b = drand(C, -1, 1, 15);
    k.mean = drand(N, 0, 0, 16);
    k.rstd = drand(N, 0, 0, 17);
    k.att = drand(B * k.NH * T * T, 0, 0, 18);
    k.qkv = drand(N * 3 * C, -1, 1, 19);
    k.dqkv = drand(N * 3 * C, 0, 0, 20);
    k.logits = drand(N * k.V, -3, 3, 21);
    k.probs = drand(N * k.V, 0, 0, 22);
    k.losses = drand(N, 0, 0, 23);
    k.wte = drand(k.V * C, -1, 1, 24);
    k.wpe = drand(1024 * C, -1, 1, 25);
    k.tok = dalloc(N * 4, DT_TAG_ACTIVATIONS);
    for (int64_t i = 0; i < N; i++)
        k.tok[i] = (int32_t)((i * 7919) % k.V);
    k.p = drand(k.P, -0.1f, 0.1f, 26);
    k.g = drand(k.P, -0.01f, 0.01f, 27);
    k.m = drand(k.P, 0, 0, 28);
    k.v = drand(k.P, 0, 0, 29);
    k.h = dalloc(k.P * 2, DT_TAG_PARAMS);
    k.sq = dalloc(8, DT_TAG_OTHER);
    /* real rotations (cos^2 + sin^2 = 1): rope runs in place on qkv call
     * after call, and a table of random numbers would shrink q and k into
     * subnormals (slow arithmetic in whatever reads them next) */
    k.cs = dalloc(T * (C / k.NH) / 2 * 4, DT_TAG_OTHER);
    k.sn = dalloc(T * (C / k.NH) / 2 * 4, DT_TAG_OTHER);
    for (int64_t i = 0; i < T * (C / k.NH) / 2; i++) {
        k.cs[i] = (float)cos(0.37 * (double)i);
        k.sn[i] = (float)sin(0.37 * (double)i);
    }
    CK(K->layernorm_forward(dev, NULL, k.y, k.mean, k.rstd, k.x, k.w, k.b, DT_F32, N,
                              C));
    CK(K->attention_forward(dev, NULL, k.y, k.att, k.qkv, DT_F32, B, T, C, k.NH));
    CK(K->softmax_xent_forward(dev, NULL, k.losses, k.probs, k.logits, k.tok, DT_F32,
                                 N, k.V));

    char s_btc[64], s_n4c[64], s_attn[64], s_nv[64], s_p[64];
    snprintf(s_btc, sizeof s_btc, "(%lld, %lld, %lld)", (long long)B,
             (long long)T, (long long)C);
    snprintf(s_n4c, sizeof s_n4c, "%lld", (long long)(N * 4 * C));
    snprintf(s_attn, sizeof s_attn, "B=%lld T=%lld C=%lld NH=%lld",
             (long long)B, (long long)T, (long long)C, (long long)k.NH);
    snprintf(s_nv, sizeof s_nv, "(%lld, %lld)", (long long)N, (long long)k.V);
    snprintf(s_p, sizeof s_p, "%lld (GPT-2 124M)", (long long)k.P);
    struct {
        const char *name, *shape;
        bench_fn fn;
        double bytes; /* bytes touched per call, for GB/s */
    } ks[] = {
        {"embedding_forward", s_btc, k_emb_f, 3.0 * N * C * 4},
        {"embedding_backward", s_btc, k_emb_b, 5.0 * N * C * 4},
        {"layernorm_forward", s_btc, k_ln_f, 2.0 * N * C * 4},
        {"layernorm_backward", s_btc, k_ln_b, 4.0 * N * C * 4},
        {"gelu_forward", s_n4c, k_gelu_f, 2.0 * N * 4 * C * 4},
        {"gelu_backward", s_n4c, k_gelu_b, 4.0 * N * 4 * C * 4},
        {"attention_forward", s_attn, k_attn_f, 0},
        {"attention_backward", s_attn, k_attn_b, 0},
        {"rmsnorm_forward", s_btc, k_rms_f, 2.0 * N * C * 4},
        {"rmsnorm_backward", s_btc, k_rms_b, 4.0 * N * C * 4},
        {"swiglu_forward (H = 2C)", s_n4c, k_swi_f, 1.5 * N * 4 * C * 4},
        {"swiglu_backward (H = 2C)", s_n4c, k_swi_b, 3.5 * N * 4 * C * 4},
        {"rope_forward (q, k in place)", s_btc, k_rope_f, 4.0 * N * C * 4},
        {"rope_backward (in place)", s_btc, k_rope_b, 4.0 * N * C * 4},
        {"gqa_attention_forward (NKV = 4)", s_attn, k_gqa_f, 0},
        {"gqa_attention_backward (NKV = 4)", s_attn, k_gqa_b, 0},
        {"residual_forward", s_btc, k_res, 3.0 * N * C * 4},
        {"axpy", s_btc, k_axpy, 3.0 * N * C * 4},
        {"softmax_xent_forward", s_nv, k_xent_f, 2.0 * N * k.V * 4},
        {"softmax_xent_backward", s_nv, k_xent_b, 3.0 * N * k.V * 4},
        {"adamw_update", s_p, k_adamw, 7.0 * k.P * 4},
        {"sgd_update", s_p, k_sgd, 5.0 * k.P * 4},
        {"sumsq (f32)", s_p, k_sumsq, 1.0 * k.P * 4},
        {"scale", s_p, k_scale, 2.0 * k.P * 4},
        {"cast f32->bf16", s_p, k_cast, 1.0 * k.P * 6},
    };
    printf("| kernel | shape | median ms | best ms | GB/s (median) |\n"
           "|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        double med, best;
        timeit(ks[i].fn, &k, &med, &best);
        char gbs[32] = "-";
        if (ks[i].bytes > 0)
            snprintf(gbs, sizeof gbs, "%.1f", ks[i].bytes / med * 1e-9);
        printf("| %s | %s | %.3f | %.3f | %s |\n", ks[i].name, ks[i].shape,
               med * 1e3, best * 1e3, gbs);
        fflush(stdout);
    }
    void *bufs[] = {k.x,      k.y,   k.z,   k.w,    k.b,      k.mean,
                    k.rstd,   k.att, k.qkv, k.dqkv, k.logits, k.probs,
                    k.losses, k.wte, k.wpe, k.tok,  k.p,      k.g,
                    k.m,      k.v,   k.h,   k.sq,   k.cs,     k.sn};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        CK(ops->free(dev, bufs[i]));
}

int main(int argc, char **argv)
{
    const char *plugin = DT_BENCH_PLUGIN_DIR "/dtrain_cpu.so";
    const char *threads_list = "1,2";
    int64_t B = 4, T = 64;
    int skip_others = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads_list = argv[++i];
        else if (!strcmp(argv[i], "--plugin") && i + 1 < argc)
            plugin = argv[++i];
        else if (!strcmp(argv[i], "--B") && i + 1 < argc)
            B = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--T") && i + 1 < argc)
            T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--min-time") && i + 1 < argc)
            g_min_time = atof(argv[++i]);
        else if (!strcmp(argv[i], "--matmul-only"))
            skip_others = 1;
        else {
            int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            fprintf(help ? stdout : stderr,
                    "usage: %s [--threads 1,2] [--plugin file] [--B 4] "
                    "[--T 64] [--min-time 0.3] [--matmul-only]\n",
                    argv[0]);
            return help ? 0 : 2;
        }
    }
    void *h = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", plugin, dlerror());
        return 1;
    }
    const dt_device_ops_v1_t *(*entry)(void) =
        (const dt_device_ops_v1_t *(*)(void))dlsym(h,
                                                   DT_ENTRY_STRING(device, 1));
    if (!entry) {
        fprintf(stderr, "dlsym: %s\n", dlerror());
        return 1;
    }
    ops = entry();
    K = ops->kernels();
    char list[64];
    snprintf(list, sizeof list, "%s", threads_list);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        g_threads = atoll(tok);
        dt_device_init_v1_t args = {
            .struct_size = sizeof args, .local_size = 1, .device_index = -1};
        CK(ops->init(&g_host, &args, &dev));
        dt_device_props_v1_t p = {.struct_size = sizeof(dt_device_props_v1_t)};
        CK(ops->props(dev, &p));
        printf(
            "\n### %s\n\npeak_flops_f32 estimate: %.1f GFLOP/s; B=%lld T=%lld "
            "(N = %lld)\n\n",
            p.name, p.peak_flops_f32 * 1e-9, (long long)B, (long long)T,
            (long long)(B * T));
        bench_matmul(B * T);
        if (!skip_others) {
            printf("\n");
            bench_others(B, T);
        }
        ops->finalize(dev);
        dev = NULL;
    }
    return 0;
}
