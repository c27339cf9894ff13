/*
 * bench/bench_comm.c - bandwidth of a communicator plugin's collectives,
 * printed like nccl-tests: size, count, type, time, algbw, busbw, wrong.
 *
 *   bench_comm [-n 2] [--op all_reduce] [--sizes 4K:256M] [--dtype f32]
 *              [--redop sum] [--iters 0=auto] [--warmup 3]
 *              [--plugin shm|path/dtrain_x.so] [--slot-bytes N]
 *              [--spin-us N] [--timeout-ms 60000] [--no-check] [--bind]
 *
 * Forks -n rank processes on this machine, each loading the plugin with
 * dlopen and a small host table of its own (no libdtrain), so it measures
 * only the plugin.  For every size: warm-up, a barrier, `iters` blocking
 * operations back to back; the time is the slowest rank's mean.  Then one
 * more operation on fresh inputs (small integers, so every reduction is
 * exact whatever its order) is checked element by element on every rank.
 *
 * "size" is nccl-tests': bytes of the largest buffer (all_reduce, reduce,
 * broadcast, sendrecv: the buffer; all_gather: the gathered output;
 * reduce_scatter: the input).  algbw = size / time, busbw = algbw times
 * 2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter, 1
 * otherwise: the bandwidth each rank's link would need, comparable across
 * rank counts.  GB/s are 1e9 bytes per second.
 *
 * The core is dt_bench_comm_main (bench_comm.h); main() is a thin wrapper
 * unless DT_BENCH_NO_MAIN is defined.
 */
#include "bench_comm.h"

#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/dtrain.h"

#ifndef DT_BENCH_PLUGIN_DIR
#define DT_BENCH_PLUGIN_DIR "."
#endif

enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_REDUCE,
       OP_SENDRECV };
static const char *const op_names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                       "broadcast", "reduce", "sendrecv"};

typedef struct bench_opts {
    int nproc;
    int op;
    uint64_t min_bytes, max_bytes;
    int dtype;
    int redop;
    int iters;   /* 0: auto */
    int warmup;
    int check;
    int bind;    /* pin rank i to the i-th usable CPU (like mpirun's default) */
    int64_t timeout_ms;
    char plugin[1024];
    char slot_bytes[32]; /* "" = plugin default */
    char spin_us[32];
} bench_opts_t;

/* What the ranks tell rank 0, in an anonymous shared mapping. */
typedef struct bench_shared {
    double time_s[256];
    uint64_t wrong[256];
    char error[256][1200];
} bench_shared_t;

/* ---- a tiny host --------------------------------------------------------- */

static _Thread_local char t_err[1024];
static const bench_opts_t *g_opts;
static char g_prefix[80]; /* "comm/shm" */

static void h_log(const dt_host_v1_t *h, int level, const char *fmt, ...)
{
    if (level > DT_LOG_WARN)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", g_prefix);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static int h_set_error(const dt_host_v1_t *h, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(t_err, sizeof t_err, "%s: ", g_prefix);
    vsnprintf(t_err + n, sizeof t_err - (size_t)n, fmt, ap);
    va_end(ap);
    return status;
}

static void *h_alloc(const dt_host_v1_t *h, uint64_t bytes, int tag)
{
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}
static void h_free(const dt_host_v1_t *h, void *p) { free(p); }
static int h_cfg_bool(const dt_host_v1_t *h, const char *k, int *o) { return DT_ERR_NOT_FOUND; }
static int h_cfg_int(const dt_host_v1_t *h, const char *k, int64_t *o)
{
    const char *v = strcmp(k, "slot_bytes") == 0 ? g_opts->slot_bytes
                    : strcmp(k, "spin_us") == 0  ? g_opts->spin_us
                                                 : "";
    if (!v[0])
        return DT_ERR_NOT_FOUND;
    *o = strtoll(v, NULL, 10);
    return DT_OK;
}
static int h_cfg_float(const dt_host_v1_t *h, const char *k, double *o) { return DT_ERR_NOT_FOUND; }
static int h_cfg_string(const dt_host_v1_t *h, const char *k, const char **o)
{
    return DT_ERR_NOT_FOUND;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static uint64_t h_now_ns(const dt_host_v1_t *h) { return mono_ns(); }

/* ---- values -------------------------------------------------------------- */

/* Small integers: every sum is exact in any order and any dtype here. */
static int val(int rank, uint64_t i) { return (int)((i * 7 + (uint64_t)rank * 3) % 5) - 2; }

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void put(void *p, int dt, uint64_t i, float v)
{
    switch (dt) {
    case DT_F32: ((float *)p)[i] = v; break;
    case DT_F64: ((double *)p)[i] = v; break;
    case DT_BF16: ((uint16_t *)p)[i] = to_bf16(v); break;
    case DT_F16: { _Float16 h = (_Float16)v; memcpy((uint16_t *)p + i, &h, 2); break; }
    case DT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case DT_U16: ((uint16_t *)p)[i] = (uint16_t)(int)v; break;
    case DT_U8: ((uint8_t *)p)[i] = (uint8_t)(int)v; break;
    default: break;
    }
}

static void fill(void *p, int dt, int rank, uint64_t n, uint64_t base)
{
    for (uint64_t i = 0; i < n; i++)
        put(p, dt, i, (float)val(rank, base + i));
}

/* Expected reduction of element `idx` over n ranks. */
static float expect_red(int op, int n, uint64_t idx)
{
    float acc = (float)val(0, idx);
    for (int r = 1; r < n; r++) {
        float x = (float)val(r, idx);
        acc = op == DT_OP_MAX ? (x > acc ? x : acc) : op == DT_OP_MIN ? (x < acc ? x : acc)
                                                                      : acc + x;
    }
    return op == DT_OP_AVG ? acc / (float)n : acc;
}

/* Count elements of `got` that differ from the expected values. */
static uint64_t count_wrong(const void *got, int dt, uint64_t n, uint64_t base, int red_op,
                            int nranks, int src_rank)
{
    size_t es = dt_dtype_size(dt);
    unsigned char want[8];
    uint64_t bad = 0;
    for (uint64_t i = 0; i < n; i++) {
        float v = red_op >= 0 ? expect_red(red_op, nranks, base + i) : (float)val(src_rank, base + i);
        put(want, dt, 0, v);
        if (memcmp((const unsigned char *)got + i * es, want, es) != 0)
            bad++;
    }
    return bad;
}

/* ---- one rank -------------------------------------------------------------- */

typedef struct rank_ctx {
    const bench_opts_t *o;
    const dt_comm_ops_v1_t *ops;
    bench_shared_t *sh;
    char job[64];
} rank_ctx_t;

static int parse_dtype(const char *s)
{
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
        if (strcmp(s, dt_dtype_name(d)) == 0)
            return d;
    return -1;
}

static double busbw_factor(int op, int n)
{
    switch (op) {
    case OP_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case OP_REDUCE_SCATTER:
    case OP_ALL_GATHER: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

/* Elements in each call's count argument for a table size of `bytes`. */
static uint64_t count_for(int op, uint64_t bytes, size_t es, int n)
{
    if (op == OP_ALL_GATHER || op == OP_REDUCE_SCATTER)
        return bytes / es / (uint64_t)n;
    return bytes / es;
}

static int run_op(rank_ctx_t *x, dt_comm_t *c, int rank, int n, void *a, void *b,
                  uint64_t count)
{
    const dt_comm_ops_v1_t *ops = x->ops;
    const bench_opts_t *o = x->o;
    switch (o->op) {
    case OP_ALL_REDUCE: return ops->all_reduce(c, a, b, count, o->dtype, o->redop, NULL, NULL);
    case OP_REDUCE_SCATTER:
        return ops->reduce_scatter(c, a, b, count, o->dtype, o->redop, NULL, NULL);
    case OP_ALL_GATHER: return ops->all_gather(c, a, b, count, o->dtype, NULL, NULL);
    case OP_BROADCAST: return ops->broadcast(c, a, count, o->dtype, 0, NULL, NULL);
    case OP_REDUCE: return ops->reduce(c, a, b, count, o->dtype, o->redop, 0, NULL, NULL);
    case OP_SENDRECV: {
        int peer = (rank ^ 1) < n ? rank ^ 1 : rank;
        dt_comm_req_t *rr, *rs;
        int st = ops->recv(c, b, count, o->dtype, peer, 0, NULL, &rr);
        if (st != DT_OK)
            return st;
        st = ops->send(c, a, count, o->dtype, peer, 0, NULL, &rs);
        int st2 = ops->wait(c, rr, -1);
        if (st != DT_OK)
            return st;
        int st3 = ops->wait(c, rs, -1);
        return st2 != DT_OK ? st2 : st3;
    }
    default: return DT_ERR_INVALID;
    }
}

static uint64_t check_result(rank_ctx_t *x, int rank, int n, void *a, void *b, uint64_t count)
{
    const bench_opts_t *o = x->o;
    size_t es = dt_dtype_size(o->dtype);
    switch (o->op) {
    case OP_ALL_REDUCE: return count_wrong(b, o->dtype, count, 0, o->redop, n, 0);
    case OP_REDUCE: return rank == 0 ? count_wrong(b, o->dtype, count, 0, o->redop, n, 0) : 0;
    case OP_REDUCE_SCATTER:
        return count_wrong(b, o->dtype, count, (uint64_t)rank * count, o->redop, n, 0);
    case OP_ALL_GATHER: {
        uint64_t bad = 0;
        for (int p = 0; p < n; p++)
            bad += count_wrong((unsigned char *)b + (size_t)p * count * es, o->dtype, count, 0,
                               -1, n, p);
        return bad;
    }
    case OP_BROADCAST: return count_wrong(a, o->dtype, count, 0, -1, n, 0);
    case OP_SENDRECV: {
        int peer = (rank ^ 1) < n ? rank ^ 1 : rank;
        return count_wrong(b, o->dtype, count, 0, -1, n, peer);
    }
    default: return 1;
    }
}

/* Inputs for the checked run. */
static void prepare(rank_ctx_t *x, int rank, int n, void *a, void *b, uint64_t count)
{
    const bench_opts_t *o = x->o;
    size_t es = dt_dtype_size(o->dtype);
    switch (o->op) {
    case OP_REDUCE_SCATTER:
        for (int blk = 0; blk < n; blk++)
            fill((unsigned char *)a + (size_t)blk * count * es, o->dtype, rank, count,
                 (uint64_t)blk * count);
        break;
    case OP_BROADCAST:
        if (rank == 0)
            fill(a, o->dtype, 0, count, 0);
        else
            memset(a, 0xee, count * es);
        break;
    default:
        fill(a, o->dtype, rank, count, 0);
        break;
    }
    (void)b;
}

/* Pin the calling process to the (rank mod count)-th CPU it may use. */
static void bind_rank(int rank)
{
    cpu_set_t set, one;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return;
    int n = CPU_COUNT(&set), want = rank % (n ? n : 1), k = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set))
            continue;
        if (k++ == want) {
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            sched_setaffinity(0, sizeof one, &one);
            return;
        }
    }
}

static int rank_main(rank_ctx_t *x, int rank, int n)
{
    const bench_opts_t *o = x->o;
    bench_shared_t *sh = x->sh;
    if (o->bind)
        bind_rank(rank);
    dt_host_v1_t host = {
        .abi_major = DT_HOST_ABI_MAJOR, .abi_minor = DT_HOST_ABI_MINOR,
        .struct_size = sizeof(dt_host_v1_t), .name = "dtrain-bench",
        .version = DTRAIN_VERSION_STRING, .log = h_log, .set_error = h_set_error,
        .alloc = h_alloc, .free = h_free, .cfg_bool = h_cfg_bool, .cfg_int = h_cfg_int,
        .cfg_float = h_cfg_float, .cfg_string = h_cfg_string, .now_ns = h_now_ns};
    dt_comm_init_v1_t ia = {.struct_size = sizeof ia, .rank = rank, .size = n,
                            .local_rank = rank, .local_size = n, .job_id = x->job,
                            .timeout_ms = o->timeout_ms};
    dt_comm_t *c = NULL;
    int st = x->ops->init(&host, &ia, &c);
    if (st != DT_OK) {
        snprintf(sh->error[rank], sizeof sh->error[rank], "init: %s: %s", dt_status_name(st),
                 t_err);
        return 1;
    }
    const size_t es = dt_dtype_size(o->dtype);
    /* Largest buffers: a holds the input, b the output. */
    uint64_t max_count = count_for(o->op, o->max_bytes, es, n);
    uint64_t a_elems = o->op == OP_REDUCE_SCATTER ? max_count * (uint64_t)n : max_count;
    uint64_t b_elems = o->op == OP_ALL_GATHER ? max_count * (uint64_t)n : max_count;
    void *a = NULL, *b = NULL;
    if (posix_memalign(&a, 4096, a_elems * es + 64) || posix_memalign(&b, 4096, b_elems * es + 64)) {
        snprintf(sh->error[rank], sizeof sh->error[rank], "out of memory");
        return 1;
    }
    memset(a, 0, a_elems * es + 64); /* fault the pages in before timing */
    memset(b, 0, b_elems * es + 64);
    int rc = 0;
    for (uint64_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= 2) {
        uint64_t count = count_for(o->op, bytes, es, n);
        uint64_t size = (o->op == OP_ALL_GATHER || o->op == OP_REDUCE_SCATTER)
                            ? count * es * (uint64_t)n : count * es;
        int iters = o->iters > 0 ? o->iters
                                 : (int)((1ull << 30) / (bytes ? bytes : 1) < 10 ? 10
                                         : (1ull << 30) / bytes > 1000 ? 1000
                                         : (1ull << 30) / bytes);
        prepare(x, rank, n, a, b, count);
        for (int w = 0; w < o->warmup && st == DT_OK; w++)
            st = run_op(x, c, rank, n, a, b, count);
        if (st == DT_OK)
            st = x->ops->barrier(c, NULL);
        uint64_t t0 = mono_ns();
        for (int it = 0; it < iters && st == DT_OK; it++)
            st = run_op(x, c, rank, n, a, b, count);
        uint64_t t1 = mono_ns();
        sh->time_s[rank] = (double)(t1 - t0) * 1e-9 / iters;
        uint64_t wrong = 0;
        if (st == DT_OK && o->check) {
            prepare(x, rank, n, a, b, count);
            st = run_op(x, c, rank, n, a, b, count);
            if (st == DT_OK)
                wrong = check_result(x, rank, n, a, b, count);
        }
        sh->wrong[rank] = wrong;
        if (st == DT_OK)
            st = x->ops->barrier(c, NULL); /* everyone's numbers are in */
        if (st != DT_OK) {
            snprintf(sh->error[rank], sizeof sh->error[rank], "%s at %llu bytes: %s: %s",
                     op_names[o->op], (unsigned long long)bytes, dt_status_name(st), t_err);
            rc = 1;
            break;
        }
        if (rank == 0) {
            double t = 0;
            uint64_t bad = 0;
            for (int p = 0; p < n; p++) {
                t = sh->time_s[p] > t ? sh->time_s[p] : t;
                bad += sh->wrong[p];
            }
            double algbw = (double)size / t * 1e-9;
            printf("%12llu %12llu %6s %6s %12.1f %12.2f %12.2f %8s\n",
                   (unsigned long long)size, (unsigned long long)(size / es),
                   dt_dtype_name(o->dtype),
                   (o->op == OP_ALL_REDUCE || o->op == OP_REDUCE_SCATTER || o->op == OP_REDUCE)
                       ? (const char *[]){"sum", "avg", "max", "min"}[o->redop] : "-",
                   t * 1e6, algbw, algbw * busbw_factor(o->op, n),
                   o->check ? (bad ? "WRONG" : "0") : "n/a");
            if (bad) {
                printf("# %llu wrong elements at size %llu\n", (unsigned long long)bad,
                       (unsigned long long)size);
                rc = 1;
            }
            fflush(stdout);
        }
        if (rank != 0 && wrong)
            rc = 1;
        if (bytes > UINT64_MAX / 2)
            break;
    }
    free(a);
    free(b);
    x->ops->finalize(c);
    return rc;
}

/* ---- options ------------------------------------------------------------- */

static int parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    uint64_t mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end)
        return -1;
    *out = (uint64_t)(v * (double)mul);
    return 0;
}

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s [-n NPROC] [--op OP] [--sizes MIN:MAX] [--dtype T] [--redop R]\n"
            "          [--iters N] [--warmup N] [--plugin NAME|PATH] [--slot-bytes N]\n"
            "          [--spin-us N] [--timeout-ms N] [--no-check] [--bind]\n"
            "  OP: all_reduce (default), reduce_scatter, all_gather, broadcast, reduce,\n"
            "      sendrecv (ranks 2k and 2k+1 exchange)\n"
            "  sizes double from MIN to MAX (suffixes K, M, G); default 4K:256M\n"
            "  T: f32 (default), bf16, f16, f64, i32, i64, u16, u8; R: sum, avg, max, min\n"
            "  iters 0 (default) picks 1 GiB / size, clamped to [10, 1000]\n"
            "  --bind pins rank i to the i-th usable CPU (what mpirun does by default)\n",
            prog);
}

static int parse_args(int argc, char **argv, bench_opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->nproc = 2;
    o->op = OP_ALL_REDUCE;
    o->min_bytes = 4ull << 10;
    o->max_bytes = 256ull << 20;
    o->dtype = DT_F32;
    o->redop = DT_OP_SUM;
    o->warmup = 3;
    o->check = 1;
    o->timeout_ms = 60000;
    snprintf(o->plugin, sizeof o->plugin, "shm");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                                           \
    do {                                                                       \
        if (!v) {                                                              \
            fprintf(stderr, "%s: %s needs a value\n", argv[0], a);             \
            return -1;                                                         \
        }                                                                      \
        i++;                                                                   \
    } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout, argv[0]);
            return 1;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--nproc")) {
            NEED_VALUE();
            o->nproc = atoi(v);
        } else if (!strcmp(a, "--op")) {
            NEED_VALUE();
            o->op = -1;
            for (int k = 0; k < (int)(sizeof op_names / sizeof op_names[0]); k++)
                if (!strcmp(v, op_names[k]))
                    o->op = k;
            if (o->op < 0) {
                fprintf(stderr, "%s: unknown --op '%s'\n", argv[0], v);
                return -1;
            }
        } else if (!strcmp(a, "--sizes")) {
            NEED_VALUE();
            char lo[64], *colon;
            snprintf(lo, sizeof lo, "%s", v);
            colon = strchr(lo, ':');
            if (colon)
                *colon = '\0';
            if (parse_bytes(lo, &o->min_bytes) ||
                parse_bytes(colon ? colon + 1 : lo, &o->max_bytes) || o->min_bytes == 0 ||
                o->max_bytes < o->min_bytes) {
                fprintf(stderr, "%s: bad --sizes '%s' (want MIN:MAX like 4K:256M)\n", argv[0], v);
                return -1;
            }
        } else if (!strcmp(a, "--dtype")) {
            NEED_VALUE();
            if ((o->dtype = parse_dtype(v)) < 0) {
                fprintf(stderr, "%s: unknown --dtype '%s'\n", argv[0], v);
                return -1;
            }
        } else if (!strcmp(a, "--redop")) {
            NEED_VALUE();
            const char *r[] = {"sum", "avg", "max", "min"};
            o->redop = -1;
            for (int k = 0; k < 4; k++)
                if (!strcmp(v, r[k]))
                    o->redop = k;
            if (o->redop < 0) {
                fprintf(stderr, "%s: unknown --redop '%s'\n", argv[0], v);
                return -1;
            }
        } else if (!strcmp(a, "--iters")) {
            NEED_VALUE();
            o->iters = atoi(v);
        } else if (!strcmp(a, "--warmup")) {
            NEED_VALUE();
            o->warmup = atoi(v);
        } else if (!strcmp(a, "--plugin")) {
            NEED_VALUE();
            snprintf(o->plugin, sizeof o->plugin, "%s", v);
        } else if (!strcmp(a, "--slot-bytes")) {
            NEED_VALUE();
            uint64_t b;
            if (parse_bytes(v, &b)) {
                fprintf(stderr, "%s: bad --slot-bytes '%s'\n", argv[0], v);
                return -1;
            }
            snprintf(o->slot_bytes, sizeof o->slot_bytes, "%llu", (unsigned long long)b);
        } else if (!strcmp(a, "--spin-us")) {
            NEED_VALUE();
            snprintf(o->spin_us, sizeof o->spin_us, "%s", v);
        } else if (!strcmp(a, "--timeout-ms")) {
            NEED_VALUE();
            o->timeout_ms = atoll(v);
        } else if (!strcmp(a, "--no-check")) {
            o->check = 0;
        } else if (!strcmp(a, "--bind")) {
            o->bind = 1;
        } else {
            fprintf(stderr, "%s: unknown argument '%s'\n", argv[0], a);
            usage(stderr, argv[0]);
            return -1;
        }
#undef NEED_VALUE
    }
    if (o->nproc < 1 || o->nproc > 256) {
        fprintf(stderr, "%s: -n must be in [1, 256]\n", argv[0]);
        return -1;
    }
    return 0;
}

int dt_bench_comm_main(int argc, char **argv)
{
    bench_opts_t o;
    int pr = parse_args(argc, argv, &o);
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    g_opts = &o;
    char path[1200];
    if (strchr(o.plugin, '/'))
        snprintf(path, sizeof path, "%s", o.plugin);
    else
        snprintf(path, sizeof path, "%s/dtrain_%s.so", DT_BENCH_PLUGIN_DIR, o.plugin);
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        fprintf(stderr, "%s: cannot load %s: %s\n", argv[0], path, dlerror());
        return 1;
    }
    typedef const dt_comm_ops_v1_t *(*entry_t)(void);
    entry_t entry = (entry_t)dlsym(dl, DT_ENTRY_STRING(comm, 1));
    if (!entry) {
        fprintf(stderr, "%s: %s has no %s entry: not a comm plugin\n", argv[0], path,
                DT_ENTRY_STRING(comm, 1));
        dlclose(dl);
        return 1;
    }
    bench_shared_t *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        fprintf(stderr, "%s: mmap: %s\n", argv[0], strerror(errno));
        dlclose(dl);
        return 1;
    }
    memset(sh, 0, sizeof *sh);
    rank_ctx_t x = {.o = &o, .ops = entry(), .sh = sh};
    snprintf(g_prefix, sizeof g_prefix, "comm/%s", x.ops->info.name);
    snprintf(x.job, sizeof x.job, "bench-%d", (int)getpid());

    int redop_used = o.op == OP_ALL_REDUCE || o.op == OP_REDUCE_SCATTER || o.op == OP_REDUCE;
    printf("# bench_comm: %s, %d ranks%s, plugin %s (slot_bytes %s, spin_us %s), %s%s%s, "
           "iters %s, warmup %d\n",
           op_names[o.op], o.nproc, o.bind ? " (bound to cores)" : "", x.ops->info.name,
           o.slot_bytes[0] ? o.slot_bytes : "default", o.spin_us[0] ? o.spin_us : "default",
           dt_dtype_name(o.dtype), redop_used ? " " : "",
           redop_used ? (const char *[]){"sum", "avg", "max", "min"}[o.redop] : "",
           o.iters ? "fixed" : "auto", o.warmup);
    printf("# %10s %12s %6s %6s %12s %12s %12s %8s\n", "size(B)", "count", "type", "redop",
           "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    fflush(stdout);

    pid_t pids[256];
    int started = 0, rc = 0;
    for (int r = 0; r < o.nproc; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "%s: fork: %s\n", argv[0], strerror(errno));
            rc = 1;
            break;
        }
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            int crc = rank_main(&x, r, o.nproc);
            fflush(stdout);
            _exit(crc);
        }
        pids[started++] = pid;
    }
    if (rc)
        for (int r = 0; r < started; r++)
            kill(pids[r], SIGKILL);
    for (int r = 0; r < started; r++) {
        int status = 0;
        while (waitpid(pids[r], &status, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            rc = 1;
            if (WIFSIGNALED(status))
                fprintf(stderr, "rank %d: killed by signal %d\n", r, WTERMSIG(status));
            else if (sh->error[r][0])
                fprintf(stderr, "rank %d: %s\n", r, sh->error[r]);
            else
                fprintf(stderr, "rank %d: wrong results\n", r);
        }
    }
    munmap(sh, sizeof *sh);
    dlclose(dl);
    return rc;
}

#ifndef DT_BENCH_NO_MAIN
int main(int argc, char **argv) { return dt_bench_comm_main(argc, argv); }
#endif
