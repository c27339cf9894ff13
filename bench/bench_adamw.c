/*
 * bench/bench_adamw.c - the host AdamW of offloaded optimizer state
 * (dt_adamw_f32, dtrain/sdk/optim.h: the loop the cpu device's kernel runs
 * too) against a plain copy of the same bytes.  AdamW reads param, grad,
 * m, v and writes param, m, v: 28 bytes per parameter; the copy moves 14
 * bytes per parameter (reads 14, writes 14), the same 28 bytes of traffic.
 *
 *   bench_adamw [--params N] [--threads 1,2] [--reps 5]
 *
 * Each figure is the best of `reps` passes (GB/s of traffic), with the
 * work cut into one contiguous slice per thread.  Prints a markdown table
 * (bench/results/offload.md).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sys/mman.h>

#include "dtrain/sdk/optim.h"

/* As the cpu device allocates what AdamW runs on (plugins/cpu/
 * cpu_device.c host_memalign): 2 MiB boundaries and transparent huge
 * pages for blocks of 2 MiB or more. */
static void *alloc_like_device(size_t n)
{
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (n < huge)
        return malloc(n);
    if (posix_memalign(&p, huge, n) != 0)
        return NULL;
    (void)madvise(p, n, MADV_HUGEPAGE);
    return p;
}

typedef struct {
    int op; /* 0 adamw, 1 copy */
    float *p, *g, *m, *v;
    char *dst, *src;
    int64_t n;          /* parameters of this slice */
    dt_adamw_hyper_t h;
} slice_t;

static void *run_slice(void *arg)
{
    slice_t *s = arg;
    if (s->op == 0)
        dt_adamw_f32(s->p, s->g, s->m, s->v, s->n, &s->h);
    else
        memcpy(s->dst, s->src, (size_t)s->n * 14);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best time of `reps` passes of `op` over n parameters on `threads`. */
static double best(int op, int threads, int64_t n, int reps, float *p, float *g, float *m,
                   float *v, char *dst, char *src, const dt_adamw_hyper_t *h)
{
    double t_best = 1e30;
    for (int r = 0; r < reps; r++) {
        pthread_t th[64];
        slice_t sl[64];
        double t0 = now_s();
        for (int t = 0; t < threads; t++) {
            int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
            sl[t] = (slice_t){.op = op, .p = p + lo, .g = g + lo, .m = m + lo, .v = v + lo,
                              .dst = dst + lo * 14, .src = src + lo * 14, .n = hi - lo, .h = *h};
            if (threads == 1)
                run_slice(&sl[t]);
            else
                pthread_create(&th[t], NULL, run_slice, &sl[t]);
        }
        for (int t = 0; threads > 1 && t < threads; t++)
            pthread_join(th[t], NULL);
        double dt = now_s() - t0;
        if (dt < t_best)
            t_best = dt;
    }
    return t_best;
}

/* The usage line; with `full`, what the program does. */
static void usage(FILE *f, int full)
{
    fprintf(f, "usage: bench_adamw [--params N] [--threads 1,2] [--reps 5]\n");
    if (full)
        fprintf(f, "\nThe host AdamW (dt_adamw_f32) against a copy of the same bytes, in GB/s "
                   "of\ntraffic, best of --reps passes, for each thread count of --threads "
                   "(1..64).\n--params N: parameters (default 8388608).  Prints a markdown "
                   "table.\n");
}

/* A whole decimal in [lo, hi], or -1. */
static long long number(const char *s, long long lo, long long hi)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    return end != s && !*end && !errno && v >= lo && v <= hi ? v : -1;
}

/* "1,2,4": every entry a thread count in [1, 64]. */
static int valid_threads(const char *s)
{
    char buf[256];
    if (!*s || strlen(s) >= sizeof buf)
        return 0;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (number(t, 1, 64) < 0)
            return 0;
    return s[strlen(s) - 1] != ',' && !strstr(s, ",,") && s[0] != ',';
}

int main(int argc, char **argv)
{
    int64_t n = 8 << 20;
    int reps = 5;
    const char *threads = "1,2";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout, 1);
            return 0;
        }
        int known = !strcmp(a, "--params") || !strcmp(a, "--threads") || !strcmp(a, "--reps");
        if (!known || !v) {
            fprintf(stderr, known ? "bench_adamw: error: %s needs a value\n"
                                  : "bench_adamw: error: unknown argument '%s'\n", a);
            usage(stderr, 0);
            return 2;
        }
        i++;
        long long x = 0;
        if (!strcmp(a, "--params") && (x = number(v, 1, 1LL << 36)) > 0)
            n = x;
        else if (!strcmp(a, "--reps") && (x = number(v, 1, 1000000)) > 0)
            reps = (int)x;
        else if (!strcmp(a, "--threads") && valid_threads(v))
            threads = v;
        else {
            fprintf(stderr, "bench_adamw: error: %s '%s': not a valid value\n", a, v);
            usage(stderr, 0);
            return 2;
        }
    }
    float *p = alloc_like_device((size_t)n * 4), *g = alloc_like_device((size_t)n * 4),
          *m = alloc_like_device((size_t)n * 4), *v = alloc_like_device((size_t)n * 4);
    char *dst = malloc((size_t)n * 14), *src = malloc((size_t)n * 14);
    if (!p || !g || !m || !v || !dst || !src) {
        fprintf(stderr, "bench_adamw: out of memory for %lld parameters\n", (long long)n);
        return 1;
    }
    for (int64_t i = 0; i < n; i++) { /* touch every page, realistic values */
        p[i] = 0.01f * (float)(i % 97);
        g[i] = 0.001f * (float)(i % 89) - 0.04f;
        m[i] = 0.0f;
        v[i] = 0.0f;
    }
    memset(dst, 0, (size_t)n * 14);
    memset(src, 1, (size_t)n * 14);
    const dt_optim_desc_v1_t o = {.struct_size = sizeof o, .kind = DT_OPTIM_ADAMW, .beta1 = 0.9f,
                                  .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    dt_adamw_hyper_t h = dt_adamw_hyper(&o, 6e-4f, 0.1f, 1.0f, 10);
    double bytes = 28.0 * (double)n;
    printf("| threads | AdamW GB/s | AdamW M params/s | copy GB/s | AdamW / copy |\n"
           "|---|---|---|---|---|\n");
    for (const char *s = threads; *s;) {
        int t = atoi(s); /* checked by valid_threads */
        double ta = best(0, t, n, reps, p, g, m, v, dst, src, &h);
        double tc = best(1, t, n, reps, p, g, m, v, dst, src, &h);
        printf("| %d | %.2f | %.1f | %.2f | %.0f %% |\n", t, bytes / ta / 1e9,
               (double)n / ta / 1e6, bytes / tc / 1e9, 100.0 * tc / ta);
        s = strchr(s, ',');
        if (!s)
            break;
        s++;
    }
    printf("\n%lld parameters (%.0f MB of traffic per pass), best of %d\n", (long long)n,
           bytes / 1e6, reps);
    free(p); free(g); free(m); free(v); free(dst); free(src);
    return 0;
}
