/*
 * bench/bench_ledger.c - what the collective ledger adds to each
 * communicator call: a fake comm plugin whose all_reduce returns at once,
 * called directly, through the comm interposer with no hooks (timed, and
 * untimed), and through it with the ledger's hooks (core/interpose/
 * interpose_ledger.c, as every `dtrain run` calls its comm plugin), in ns
 * per call, best of `reps` passes of `calls` calls, the four interleaved.
 *
 *   bench_ledger [--calls N] [--reps R]
 *
 * The cost on a real collective is this difference; `dtrain bench comm
 * --ledger` shows it beside shm's small-message latency
 * (bench/results/ledger.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "interpose/interpose.h"
#include "interpose/ledger.h"
#include "util/crash.h"

struct dt_comm {
    int rank, size;
};

static int f_init(const dt_host_t *h, const dt_comm_init_t *a, dt_comm_t **out)
{
    (void)h;
    *out = calloc(1, sizeof **out);
    (*out)->rank = a->rank;
    (*out)->size = a->size;
    return *out ? DT_OK : DT_ERR_NOMEM;
}
static void f_finalize(dt_comm_t *c) { free(c); }
static int f_rank_size(dt_comm_t *c, int32_t *rank, int32_t *size)
{
    *rank = c->rank;
    *size = c->size;
    return DT_OK;
}
/* as little as a call can do: the time measured is the caller's path */
static int f_all_reduce(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt, int op,
                        dt_stream_t *st, dt_comm_req_t **req)
{
    (void)c, (void)s, (void)r, (void)n, (void)dt, (void)op, (void)st;
    if (req)
        *req = NULL;
    return DT_OK;
}

static const dt_comm_ops_t fake_ops = {
    .info = {.struct_size = sizeof(dt_comm_ops_t), .abi_major = DT_COMM_ABI_MAJOR,
             .abi_minor = DT_COMM_ABI_MINOR, .kind = DT_KIND_COMM, .name = "fake"},
    .init = f_init, .finalize = f_finalize, .rank_size = f_rank_size,
    .all_reduce = f_all_reduce};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ns per call of `calls` all_reduces through C on c */
static double pass(dt_comm_t *c, long calls)
{
    float x = 0;
    double t0 = now_s();
    for (long i = 0; i < calls; i++)
        if (dt_comm_ops(c)->all_reduce(c, &x, &x, 1, DT_F32, DT_OP_SUM, NULL, NULL) != DT_OK)
            abort();
    return (now_s() - t0) * 1e9 / (double)calls;
}

int main(int argc, char **argv)
{
    long calls = 2000000;
    int reps = 7;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--calls") && i + 1 < argc)
            calls = atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_ledger [--calls N] [--reps R]\n");
            return 2;
        }
    }
    if (calls < 1 || reps < 1) {
        fprintf(stderr, "bench_ledger: --calls and --reps must be at least 1\n");
        return 2;
    }
    dt_ledger_t *l = dt_ledger_create(0, 2);
    enum { N = 4 };
    dt_interpose_hooks_t hooks[N - 1] = {{0}, {.untimed = 1}, dt_interpose_ledger_hooks(l)};
    dt_interpose_comm_t *ic[N - 1] = {NULL};
    const dt_comm_ops_t *T[N] = {&fake_ops};
    for (int k = 1; k < N; k++) {
        if (!l || dt_interpose_comm_create(&fake_ops, &hooks[k - 1], &ic[k - 1]) != DT_OK) {
            fprintf(stderr, "bench_ledger: setup failed\n");
            return 1;
        }
        T[k] = dt_interpose_comm_ops(ic[k - 1]);
    }
    const char *names[N] = {"direct", "interposer, no hooks (timed, as under --profile)",
                            "interposer, no hooks, untimed",
                            "interposer, ledger hooks (untimed): every `dtrain run`"};
    dt_comm_t *c[N];
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = 0, .size = 2, .job_id = "bench"};
    for (int k = 0; k < N; k++)
        if (T[k]->init(NULL, &a, &c[k]) != DT_OK)
            return 1;
    dt_crash_set_phase("training", 1);
    double best[N] = {1e30, 1e30, 1e30, 1e30};
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < N; k++) {
            double ns = pass(c[k], calls);
            best[k] = ns < best[k] ? ns : best[k];
        }
    printf("| path | ns per all_reduce (best of %d x %ld) | added |\n|---|---|---|\n", reps,
           calls);
    for (int k = 0; k < N; k++)
        printf("| %s | %.1f | %+.1f |\n", names[k], best[k], best[k] - best[0]);
    for (int k = 0; k < N; k++)
        T[k]->finalize(c[k]);
    for (int k = 0; k < N - 1; k++)
        dt_interpose_comm_destroy(ic[k]);
    dt_ledger_free(l);
    return 0;
}
