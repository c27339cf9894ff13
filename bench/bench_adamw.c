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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtrain/sdk/optim.h"

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

int main(int argc, char **argv)
{
    int64_t n = 8 << 20;
    int reps = 5;
    const char *threads = "1,2";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--params"))
            n = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = argv[i + 1];
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_adamw [--params N] [--threads 1,2] [--reps 5]\n");
            return 2;
        }
    }
    float *p = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *m = malloc((size_t)n * 4),
          *v = malloc((size_t)n * 4);
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
    printf("| threads | AdamW GB/s | copy GB/s | AdamW / copy |\n|---|---|---|---|\n");
    for (const char *s = threads; *s;) {
        int t = atoi(s);
        if (t < 1 || t > 64)
            return 2;
        double ta = best(0, t, n, reps, p, g, m, v, dst, src, &h);
        double tc = best(1, t, n, reps, p, g, m, v, dst, src, &h);
        printf("| %d | %.2f | %.2f | %.0f %% |\n", t, bytes / ta / 1e9, bytes / tc / 1e9,
               100.0 * tc / ta);
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
