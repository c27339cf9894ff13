/*
 * bench/mpi_allreduce.c - Open MPI's collectives timed the way `dtrain bench comm`
 * times a dtrain comm plugin, printing the same nccl-tests style table, so
 * the two can be compared side by side (bench/results/comm.md).
 *
 *   mpirun --oversubscribe -np 2 [--allow-run-as-root] bench/mpi_allreduce
 *          [--op all_reduce] [--sizes 4K:256M] [--dtype f32|f64]
 *          [--redop sum|max|min] [--iters 0=auto] [--warmup 3] [--no-check]
 *          [--nonblocking] [--thread-multiple]
 *
 * Ops: all_reduce (MPI_Allreduce), reduce_scatter (MPI_Reduce_scatter_block),
 * all_gather (MPI_Allgather), broadcast (MPI_Bcast), reduce (MPI_Reduce).
 * Same sizes, iteration rule (1 GiB / size clamped to [10, 1000]), timing
 * (slowest rank's mean after a barrier), busbw factors and exact checks on
 * small-integer inputs as `dtrain bench comm`.  --nonblocking runs
 * all_reduce as MPI_Iallreduce + MPI_Wait: the algorithm the mpi plugin's
 * nonblocking calls get (Open MPI's libnbc, not coll/tuned's blocking one),
 * to tell the plugin's own overhead from that choice; --thread-multiple
 * initialises MPI at MPI_THREAD_MULTIPLE, as the plugin does.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_REDUCE };
static const char *const op_names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                       "broadcast", "reduce"};

static int val(int rank, uint64_t i) { return (int)((i * 7 + (uint64_t)rank * 3) % 5) - 2; }

static int parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0)
        return -1;
    uint64_t mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1ull << 10, end++;
    else if (*end == 'm' || *end == 'M')
        mul = 1ull << 20, end++;
    else if (*end == 'g' || *end == 'G')
        mul = 1ull << 30, end++;
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end)
        return -1;
    *out = (uint64_t)(v * (double)mul);
    return 0;
}

static void put(void *p, int f64, uint64_t i, double v)
{
    if (f64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

static double get(const void *p, int f64, uint64_t i)
{
    return f64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

static double expect_red(int redop, int n, uint64_t idx)
{
    double acc = val(0, idx);
    for (int r = 1; r < n; r++) {
        double x = val(r, idx);
        acc = redop == 1 ? (x > acc ? x : acc) : redop == 2 ? (x < acc ? x : acc) : acc + x;
    }
    return acc;
}

int main(int argc, char **argv)
{
    /* --thread-multiple: the thread level the mpi plugin asks for (its
     * progress thread calls into MPI), to time what that level costs */
    int multiple = 0, provided = 0;
    for (int i = 1; i < argc; i++)
        multiple |= !strcmp(argv[i], "--thread-multiple");
    if (multiple)
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    else
        MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int op = OP_ALL_REDUCE, f64 = 0, redop = 0, iters_opt = 0, warmup = 3, check = 1, nonblocking = 0;
    uint64_t min_b = 4ull << 10, max_b = 256ull << 20;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        int bad = 0;
        if (!strcmp(a, "--op")) {
            op = -1;
            for (int k = 0; k < 5; k++)
                if (!strcmp(v, op_names[k]))
                    op = k;
            bad = op < 0;
            i++;
        } else if (!strcmp(a, "--sizes")) {
            char lo[64], *colon;
            snprintf(lo, sizeof lo, "%s", v);
            colon = strchr(lo, ':');
            if (colon)
                *colon = '\0';
            bad = parse_bytes(lo, &min_b) || parse_bytes(colon ? colon + 1 : lo, &max_b) ||
                  min_b == 0 || max_b < min_b;
            i++;
        } else if (!strcmp(a, "--dtype")) {
            bad = strcmp(v, "f32") && strcmp(v, "f64");
            f64 = !strcmp(v, "f64");
            i++;
        } else if (!strcmp(a, "--redop")) {
            redop = !strcmp(v, "sum") ? 0 : !strcmp(v, "max") ? 1 : !strcmp(v, "min") ? 2 : -1;
            bad = redop < 0;
            i++;
        } else if (!strcmp(a, "--iters")) {
            iters_opt = atoi(v);
            i++;
        } else if (!strcmp(a, "--warmup")) {
            warmup = atoi(v);
            i++;
        } else if (!strcmp(a, "--no-check")) {
            check = 0;
        } else if (!strcmp(a, "--nonblocking")) {
            nonblocking = 1;
        } else if (!strcmp(a, "--thread-multiple")) {
            /* read before MPI_Init_thread */
        } else {
            bad = 1;
        }
        if (bad) {
            if (rank == 0)
                fprintf(stderr, "usage: %s [--op all_reduce|reduce_scatter|all_gather|"
                        "broadcast|reduce] [--sizes 4K:256M] [--dtype f32|f64] "
                        "[--redop sum|max|min] [--iters N] [--warmup N] [--no-check] "
                        "[--nonblocking] [--thread-multiple]\n",
                        argv[0]);
            MPI_Finalize();
            return 2;
        }
    }
    const size_t es = f64 ? 8 : 4;
    MPI_Datatype dt = f64 ? MPI_DOUBLE : MPI_FLOAT;
    MPI_Op mop = redop == 1 ? MPI_MAX : redop == 2 ? MPI_MIN : MPI_SUM;
    const int per_rank = op == OP_ALL_GATHER || op == OP_REDUCE_SCATTER;
    uint64_t max_count = per_rank ? max_b / es / (uint64_t)n : max_b / es;
    uint64_t a_elems = op == OP_REDUCE_SCATTER ? max_count * (uint64_t)n : max_count;
    uint64_t b_elems = op == OP_ALL_GATHER ? max_count * (uint64_t)n : max_count;
    void *a = NULL, *b = NULL;
    if (posix_memalign(&a, 4096, a_elems * es + 64) || posix_memalign(&b, 4096, b_elems * es + 64)) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(a, 0, a_elems * es + 64);
    memset(b, 0, b_elems * es + 64);
    if (rank == 0) {
        const char *ver = "";
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len = 0;
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, ',');
        if (nl)
            *nl = '\0';
        ver = lib;
        printf("# mpi_allreduce: %s, %d ranks, %s, %s %s, iters %s, warmup %d\n",
               op_names[op], n, ver, f64 ? "f64" : "f32",
               per_rank || op == OP_BROADCAST ? (op == OP_REDUCE_SCATTER ? "sum" : "")
                                             : (const char *[]){"sum", "max", "min"}[redop],
               iters_opt ? "fixed" : "auto", warmup);
        printf("# %10s %12s %6s %6s %12s %12s %12s %8s\n", "size(B)", "count", "type",
               "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
        fflush(stdout);
    }
    int rc = 0;
    for (uint64_t bytes = min_b; bytes <= max_b; bytes *= 2) {
        uint64_t count = per_rank ? bytes / es / (uint64_t)n : bytes / es;
        uint64_t size = per_rank ? count * es * (uint64_t)n : count * es;
        int iters = iters_opt > 0 ? iters_opt
                    : (int)((1ull << 30) / bytes < 10 ? 10
                            : (1ull << 30) / bytes > 1000 ? 1000 : (1ull << 30) / bytes);
        /* inputs: the same rule as `dtrain bench comm` */
        if (op == OP_REDUCE_SCATTER)
            for (uint64_t i = 0; i < count * (uint64_t)n; i++)
                put(a, f64, i, val(rank, i));
        else if (op != OP_BROADCAST || rank == 0)
            for (uint64_t i = 0; i < count; i++)
                put(a, f64, i, val(rank, i));
        int ic = (int)count;
        double tmax = 0;
        for (int pass = 0; pass < 3; pass++) {
            /* pass 0: warm-up, 1: timed, 2: checked */
            int reps = pass == 0 ? warmup : pass == 1 ? iters : (check ? 1 : 0);
            if (pass == 1)
                MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int it = 0; it < reps; it++) {
                switch (op) {
                case OP_ALL_REDUCE:
                    if (nonblocking) {
                        MPI_Request rq;
                        MPI_Iallreduce(a, b, ic, dt, mop, MPI_COMM_WORLD, &rq);
                        MPI_Wait(&rq, MPI_STATUS_IGNORE);
                    } else {
                        MPI_Allreduce(a, b, ic, dt, mop, MPI_COMM_WORLD);
                    }
                    break;
                case OP_REDUCE_SCATTER:
                    MPI_Reduce_scatter_block(a, b, ic, dt, MPI_SUM, MPI_COMM_WORLD);
                    break;
                case OP_ALL_GATHER: MPI_Allgather(a, ic, dt, b, ic, dt, MPI_COMM_WORLD); break;
                case OP_BROADCAST: MPI_Bcast(a, ic, dt, 0, MPI_COMM_WORLD); break;
                case OP_REDUCE: MPI_Reduce(a, b, ic, dt, mop, 0, MPI_COMM_WORLD); break;
                default: break;
                }
            }
            double mine = (MPI_Wtime() - t0) / (reps ? reps : 1);
            if (pass == 1)
                MPI_Reduce(&mine, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        }
        uint64_t wrong = 0;
        if (check) {
            switch (op) {
            case OP_ALL_REDUCE:
            case OP_REDUCE:
                if (op == OP_ALL_REDUCE || rank == 0)
                    for (uint64_t i = 0; i < count; i++)
                        wrong += get(b, f64, i) != expect_red(redop, n, i);
                break;
            case OP_REDUCE_SCATTER:
                for (uint64_t i = 0; i < count; i++)
                    wrong += get(b, f64, i) != expect_red(0, n, (uint64_t)rank * count + i);
                break;
            case OP_ALL_GATHER:
                for (int p = 0; p < n; p++)
                    for (uint64_t i = 0; i < count; i++)
                        wrong += get(b, f64, (uint64_t)p * count + i) != val(p, i);
                break;
            case OP_BROADCAST:
                for (uint64_t i = 0; i < count; i++)
                    wrong += get(a, f64, i) != val(0, i);
                break;
            default: break;
            }
        }
        unsigned long long w = wrong, wsum = 0;
        MPI_Reduce(&w, &wsum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            double t = tmax;
            double algbw = (double)size / t * 1e-9;
            double f = op == OP_ALL_REDUCE ? 2.0 * (n - 1) / n
                       : per_rank          ? (double)(n - 1) / n
                                           : 1.0;
            printf("%12llu %12llu %6s %6s %12.1f %12.2f %12.2f %8s\n",
                   (unsigned long long)size, (unsigned long long)(size / es), f64 ? "f64" : "f32",
                   op == OP_ALL_GATHER || op == OP_BROADCAST ? "-"
                   : op == OP_REDUCE_SCATTER                 ? "sum"
                                             : (const char *[]){"sum", "max", "min"}[redop],
                   t * 1e6, algbw, algbw * f, check ? (wsum ? "WRONG" : "0") : "n/a");
            fflush(stdout);
            if (wsum)
                rc = 1;
        }
    }
    free(a);
    free(b);
    MPI_Finalize();
    return rc;
}
