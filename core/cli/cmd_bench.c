/*
 * core/cli/cmd_bench.c - `dtrain bench comm`: bandwidth of a comm plugin's
 * collectives, printed like nccl-tests: size, count, type, redop, time,
 * algbw, busbw, #wrong.
 *
 * The ranks are real ones: `dtrain bench comm --nproc N` launches N copies
 * of itself through core/launch (rank 0's table is relayed unprefixed), and
 * under mpirun/torchrun the command joins that job instead.  Each rank loads
 * the plugin through the loader, as `dtrain run` does, and drives it through
 * its ops table.  Each rank also opens the compute device as `dtrain run`
 * does (--device, or run.device: cpu by default) and hands it to the comm
 * plugin; on a device whose memory the host cannot touch (cuda, for the
 * nccl communicator) the buffers are device memory, filled and checked
 * through copies outside the timed calls.
 *
 * Per size: `warmup` calls, a barrier, `iters` blocking calls back to back;
 * the time is the slowest rank's mean (an all_reduce MAX over the ranks).
 * Then one more call on fresh inputs (small integers, so every reduction is
 * exact whatever its order) is checked element by element on every rank: a
 * rank with a wrong element says which op, size, element and values, and
 * exits 1; the table marks the size WRONG and the benchmark stops there.
 *
 * "size" is nccl-tests': bytes of the largest buffer (all_reduce, reduce,
 * broadcast, sendrecv: the buffer; all_gather: the gathered output;
 * reduce_scatter: the input).  algbw = size / time, busbw = algbw x
 * 2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter, 1
 * otherwise (the bandwidth each rank's link would need, comparable across
 * rank counts).  GB/s are 1e9 bytes per second.
 *
 * Test hook (DTRAIN_TEST_HOOKS builds only): DTRAIN_TEST_BENCH_CORRUPT=R
 * makes rank R change one element of its checked output at the first
 * size, so the tests can prove that a wrong result is caught.
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "dtrain/half.h"
#include "config/config.h"
#include "cli/cli_launch.h"
#include "launch/launcher.h"
#include "launch/rendezvous.h"
#include "interpose/interpose.h"
#include "interpose/ledger.h"
#include "setup/resolve.h"
#include "util/error.h"
#include "util/log.h"

enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_REDUCE,
       OP_SENDRECV, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"all_reduce", "reduce_scatter", "all_gather",
                                               "broadcast", "reduce", "sendrecv"};
static const char *const redop_names[] = {"sum", "avg", "max", "min"};

typedef struct bench_opts {
    int nproc, nproc_given;
    int op;
    uint64_t min_bytes, max_bytes;
    int dtype;
    int redop;
    int iters; /* 0: auto */
    int warmup;
    int bind;  /* pin local rank i to the i-th usable CPU (mpirun's default) */
    int sym;   /* all_reduce in place on the comm's symmetric memory */
    int ledger; /* through the collective ledger's interposer, as `dtrain run` */
    double timeout_s;
    const char *comm;
    char comm_default[64]; /* run.comm's declared default */
    const char *device; /* NULL: run.device */
    dt_cli_config_args_t sets; /* --set, for the plugin's own keys */
} bench_opts_t;

void dt_help_bench(FILE *f)
{
    fprintf(f,
            "usage: dtrain bench comm [--op OP] [--nproc N] [--sizes MIN:MAX] [--dtype T]\n"
            "                         [--redop R] [--comm NAME] [--device NAME] [--iters N]\n"
            "                         [--warmup N] [--timeout S] [--bind] [--sym] [--ledger]\n"
            "                         [--set table.key=value ...]\n\n"
            "Time a comm plugin's collectives over N local ranks and print an nccl-tests\n"
            "style table (size, count, type, redop, time(us), algbw(GB/s), busbw(GB/s),\n"
            "#wrong).  Every size's result is checked on every rank; a wrong one names\n"
            "the op, size and rank and makes the command fail.\n\n"
            "  --op      all_reduce (default), reduce_scatter, all_gather, broadcast,\n"
            "            reduce, sendrecv (ranks 2k and 2k+1 exchange)\n"
            "  --nproc   ranks to start (default 2); under mpirun or torchrun the\n"
            "            command is one rank of that job instead\n"
            "  --sizes   MIN:MAX bytes, doubling from MIN (suffixes K, M, G; default\n"
            "            4K:256M)\n"
            "  --dtype   f32 (default), bf16, f16, f64, i32, i64, u16, u8\n"
            "  --redop   sum (default), avg, max, min\n"
            "  --comm    comm plugin (default shm)\n"
            "  --device  device plugin whose memory holds the buffers, opened as\n"
            "            `dtrain run` opens it (default run.device: cpu); nccl needs\n"
            "            --device cuda (one GPU per local rank)\n"
            "  --iters   timed calls per size; 0 (default) = 1 GiB / size in [10, 1000]\n"
            "  --warmup  untimed calls per size (default 3)\n"
            "  --timeout seconds any call may wait (default 60)\n"
            "  --bind    pin local rank i to the i-th CPU this process may use\n"
            "  --sym     the comm's symmetric memory (sym_alloc), where strategies keep\n"
            "            their gradients: all_reduce in place, reduce_scatter's send and\n"
            "            all_gather's recv there\n"
            "  --ledger  call the plugin through the collective ledger's interposer, as\n"
            "            `dtrain run` always does (what it costs: compare with and without)\n"
            "  --set     plugin keys, e.g. --set shm.spin_us=200\n\n"
            "busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter),\n"
            "1 (broadcast, reduce, sendrecv).\n"
            "exit codes: 0 every result checked, 1 wrong result or failed rank, 2 usage\n");
}

/* ---- values -------------------------------------------------------------- */

/* Small integers: every sum is exact in any order and any dtype here. */
static int val(int rank, uint64_t i) { return (int)((i * 7 + (uint64_t)rank * 3) % 5) - 2; }

static void put(void *p, int dt, uint64_t i, float v)
{
    switch (dt) {
    case DT_F32: ((float *)p)[i] = v; break;
    case DT_F64: ((double *)p)[i] = v; break;
    case DT_BF16: ((uint16_t *)p)[i] = dt_f32_to_bf16(v); break;
    case DT_F16: ((uint16_t *)p)[i] = dt_f32_to_f16(v); break;
    case DT_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case DT_U16: ((uint16_t *)p)[i] = (uint16_t)(int)v; break;
    case DT_U8: ((uint8_t *)p)[i] = (uint8_t)(int)v; break;
    default: break;
    }
}

/* Element i as a double, for messages. */
static double get(const void *p, int dt, uint64_t i)
{
    switch (dt) {
    case DT_F32: return ((const float *)p)[i];
    case DT_F64: return ((const double *)p)[i];
    case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)p)[i]);
    case DT_F16: return dt_f16_to_f32(((const uint16_t *)p)[i]);
    case DT_I32: return ((const int32_t *)p)[i];
    case DT_I64: return (double)((const int64_t *)p)[i];
    case DT_U16: return ((const uint16_t *)p)[i];
    case DT_U8: return ((const uint8_t *)p)[i];
    default: return 0;
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

typedef struct wrong {
    uint64_t count;     /* elements that differ */
    uint64_t first;     /* index of the first, in the checked buffer */
    double got, want;
} wrong_t;

/* Compare n elements of `got` (dtype dt) at element offset `at` of the
 * checked buffer with the expected values: a reduction over nranks of the
 * inputs base.. (red_op >= 0) or rank src_rank's inputs. */
static void count_wrong(const void *got, int dt, uint64_t n, uint64_t base, int red_op,
                        int nranks, int src_rank, uint64_t at, wrong_t *w)
{
    size_t es = dt_dtype_size(dt);
    unsigned char want[8];
    for (uint64_t i = 0; i < n; i++) {
        float v = red_op >= 0 ? expect_red(red_op, nranks, base + i)
                              : (float)val(src_rank, base + i);
        put(want, dt, 0, v);
        if (memcmp((const unsigned char *)got + i * es, want, es) == 0)
            continue;
        if (w->count++ == 0) {
            w->first = at + i;
            w->got = get(got, dt, i);
            w->want = get(want, dt, 0);
        }
    }
}

/* ---- one rank ------------------------------------------------------------ */

typedef struct rank_ctx {
    const bench_opts_t *o;
    const dt_plugin_t *plugin;
    dt_comm_t *c;               /* starts with its table (the interposer's
                                 * with --ledger) */
    int rank, n;
    /* the device; dev_mem: its memory is not the host's, so a and b are
     * device memory and ha, hb their host copies (else ha == a, hb == b) */
    const dt_plugin_t *pdev;
    dt_device_t *dev;
    int dev_mem;
    int dev_failed; /* the last failure was the device's (a copy) */
    void *ha, *hb;
} rank_ctx_t;

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

static int run_op(rank_ctx_t *x, void *a, void *b, uint64_t count)
{
    const dt_comm_ops_t *ops = dt_comm_ops(x->c);
    const bench_opts_t *o = x->o;
    dt_comm_t *c = x->c;
    switch (o->op) {
    case OP_ALL_REDUCE: return ops->all_reduce(c, a, b, count, o->dtype, o->redop, NULL, NULL);
    case OP_REDUCE_SCATTER:
        return ops->reduce_scatter(c, a, b, count, o->dtype, o->redop, NULL, NULL);
    case OP_ALL_GATHER: return ops->all_gather(c, a, b, count, o->dtype, NULL, NULL);
    case OP_BROADCAST: return ops->broadcast(c, a, count, o->dtype, 0, NULL, NULL);
    case OP_REDUCE: return ops->reduce(c, a, b, count, o->dtype, o->redop, 0, NULL, NULL);
    case OP_SENDRECV: {
        int peer = (x->rank ^ 1) < x->n ? x->rank ^ 1 : x->rank;
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

/* The buffer the check reads: broadcast works in place. */
static void *checked_buf(const bench_opts_t *o, void *a, void *b)
{
    return o->op == OP_BROADCAST ? a : b;
}

/* Bytes of the input (a) and the output (b) for `count`. */
static uint64_t in_bytes(const rank_ctx_t *x, uint64_t count)
{
    size_t es = dt_dtype_size(x->o->dtype);
    return x->o->op == OP_REDUCE_SCATTER ? count * (uint64_t)x->n * es : count * es;
}

static uint64_t out_bytes(const rank_ctx_t *x, uint64_t count)
{
    size_t es = dt_dtype_size(x->o->dtype);
    return x->o->op == OP_ALL_GATHER ? count * (uint64_t)x->n * es : count * es;
}

/* On a device with its own memory: `bytes` between the host copy and the
 * device buffer (kind DT_COPY_H2D or DT_COPY_D2H), waited for.  Nothing
 * to do where the host reads the buffers themselves. */
static int dev_copy(rank_ctx_t *x, void *dst, const void *src, uint64_t bytes, int kind)
{
    if (!x->dev_mem || bytes == 0)
        return DT_OK;
    int rc = dt_device_ops(x->dev)->memcpy_async(x->dev, dst, src, bytes, kind, NULL);
    if (rc == DT_OK)
        rc = dt_device_ops(x->dev)->stream_sync(x->dev, NULL);
    if (rc == DT_OK)
        return DT_OK;
    x->dev_failed = 1;
    return dt_plugin_failed(x->pdev, rc, kind == DT_COPY_H2D ? "copying the inputs in"
                                                             : "copying the results out");
}

static void check_result(rank_ctx_t *x, void *a, void *b, uint64_t count, wrong_t *w)
{
    const bench_opts_t *o = x->o;
    const int rank = x->rank, n = x->n;
    size_t es = dt_dtype_size(o->dtype);
    memset(w, 0, sizeof *w);
    switch (o->op) {
    case OP_ALL_REDUCE: count_wrong(b, o->dtype, count, 0, o->redop, n, 0, 0, w); break;
    case OP_REDUCE:
        if (rank == 0)
            count_wrong(b, o->dtype, count, 0, o->redop, n, 0, 0, w);
        break;
    case OP_REDUCE_SCATTER:
        count_wrong(b, o->dtype, count, (uint64_t)rank * count, o->redop, n, 0, 0, w);
        break;
    case OP_ALL_GATHER:
        for (int p = 0; p < n; p++)
            count_wrong((unsigned char *)b + (size_t)p * count * es, o->dtype, count, 0, -1, n,
                        p, (uint64_t)p * count, w);
        break;
    case OP_BROADCAST: count_wrong(a, o->dtype, count, 0, -1, n, 0, 0, w); break;
    case OP_SENDRECV: {
        int peer = (rank ^ 1) < n ? rank ^ 1 : rank;
        count_wrong(b, o->dtype, count, 0, -1, n, peer, 0, w);
        break;
    }
    default: break;
    }
}

/* Inputs for the checked run. */
static void prepare(rank_ctx_t *x, void *a, uint64_t count)
{
    const bench_opts_t *o = x->o;
    size_t es = dt_dtype_size(o->dtype);
    switch (o->op) {
    case OP_REDUCE_SCATTER:
        for (int blk = 0; blk < x->n; blk++)
            fill((unsigned char *)a + (size_t)blk * count * es, o->dtype, x->rank, count,
                 (uint64_t)blk * count);
        break;
    case OP_BROADCAST:
        if (x->rank == 0)
            fill(a, o->dtype, 0, count, 0);
        else
            memset(a, 0xee, count * es);
        break;
    default: fill(a, o->dtype, x->rank, count, 0); break;
    }
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

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int redop_used(int op)
{
    return op == OP_ALL_REDUCE || op == OP_REDUCE_SCATTER || op == OP_REDUCE;
}

/* What went wrong, for messages: "all_reduce (f32 sum) of 4096 bytes". */
static void describe(const bench_opts_t *o, uint64_t size, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s (%s%s%s) of %llu bytes", op_names[o->op], dt_dtype_name(o->dtype),
             redop_used(o->op) ? " " : "", redop_used(o->op) ? redop_names[o->redop] : "",
             (unsigned long long)size);
}

/* Every size on an initialised communicator.  DT_OK when all checked;
 * DT_ERR_DATA when this rank's results were wrong (message set); *any_wrong
 * tells whether any rank's were. */
static int bench_sizes(rank_ctx_t *x, void *a, void *b, int *any_wrong)
{
    const bench_opts_t *o = x->o;
    const size_t es = dt_dtype_size(o->dtype);
    const dt_comm_ops_t *ops = dt_comm_ops(x->c);
#ifdef DTRAIN_TEST_HOOKS
    const char *hook = getenv("DTRAIN_TEST_BENCH_CORRUPT");
    int corrupt = hook && hook[0] && atoi(hook) == x->rank;
#else
    int corrupt = 0;
#endif
    int rc = DT_OK;
    *any_wrong = 0;
    for (uint64_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= 2) {
        uint64_t count = count_for(o->op, bytes, es, x->n);
        uint64_t size = (o->op == OP_ALL_GATHER || o->op == OP_REDUCE_SCATTER)
                            ? count * es * (uint64_t)x->n : count * es;
        uint64_t per = (1ull << 30) / bytes;
        int iters = o->iters > 0 ? o->iters : per < 10 ? 10 : per > 1000 ? 1000 : (int)per;
        char what[160];
        describe(o, size, what, sizeof what);
        prepare(x, x->ha, count);
        int st = dev_copy(x, a, x->ha, in_bytes(x, count), DT_COPY_H2D);
        for (int w = 0; w < o->warmup && st == DT_OK; w++)
            st = run_op(x, a, b, count);
        if (st == DT_OK)
            st = ops->barrier(x->c, NULL);
        uint64_t t0 = mono_ns();
        for (int it = 0; it < iters && st == DT_OK; it++)
            st = run_op(x, a, b, count);
        double t = (double)(mono_ns() - t0) * 1e-9 / iters;
        wrong_t w;
        memset(&w, 0, sizeof w);
        if (st == DT_OK) {
            prepare(x, x->ha, count);
            st = dev_copy(x, a, x->ha, in_bytes(x, count), DT_COPY_H2D);
        }
        if (st == DT_OK)
            st = run_op(x, a, b, count);
        if (st == DT_OK)
            st = o->op == OP_BROADCAST
                     ? dev_copy(x, x->ha, a, in_bytes(x, count), DT_COPY_D2H)
                     : dev_copy(x, x->hb, b, out_bytes(x, count), DT_COPY_D2H);
        if (st == DT_OK) {
            if (corrupt) {
                void *out = checked_buf(o, x->ha, x->hb);
                put(out, o->dtype, 0, (float)get(out, o->dtype, 0) + 1.0f);
                corrupt = 0;
            }
            check_result(x, x->ha, x->hb, count, &w);
        }
        /* the slowest rank's time and everyone's wrong count, for rank 0 */
        double agg_t = t, agg_w = (double)w.count;
        if (st == DT_OK)
            st = ops->all_reduce(x->c, &agg_t, &agg_t, 1, DT_F64, DT_OP_MAX, NULL, NULL);
        if (st == DT_OK)
            st = ops->all_reduce(x->c, &agg_w, &agg_w, 1, DT_F64, DT_OP_SUM, NULL, NULL);
        if (st != DT_OK) {
            if (!x->dev_failed)
                dt_plugin_failed(x->plugin, st, "a collective");
            return dt_err_context(st, "rank %d: %s", x->rank, what);
        }
        if (x->rank == 0) {
            double algbw = (double)size / agg_t * 1e-9;
            printf("%12llu %12llu %6s %6s %12.2f %12.2f %12.2f %8s\n",
                   (unsigned long long)size, (unsigned long long)(size / es),
                   dt_dtype_name(o->dtype), redop_used(o->op) ? redop_names[o->redop] : "-",
                   agg_t * 1e6, algbw, algbw * busbw_factor(o->op, x->n),
                   agg_w > 0 ? "WRONG" : "0");
            if (agg_w > 0)
                printf("# %.0f wrong elements at size %llu (the ranks with wrong results "
                       "say which)\n", agg_w, (unsigned long long)size);
            fflush(stdout);
        }
        if (w.count > 0)
            rc = dt_err_set(DT_ERR_DATA,
                            "rank %d: %s: %llu of %llu elements wrong (element %llu is %g, "
                            "expected %g)",
                            x->rank, what, (unsigned long long)w.count,
                            (unsigned long long)(o->op == OP_ALL_GATHER
                                                     ? count * (uint64_t)x->n : count),
                            (unsigned long long)w.first, w.got, w.want);
        if (agg_w > 0) {
            /* every rank knows, so every rank stops here; the barrier lets
             * rank 0's row out before a failing rank's exit makes the
             * launcher stop the others */
            *any_wrong = 1;
            st = ops->barrier(x->c, NULL);
            if (st != DT_OK && rc == DT_OK)
                rc = dt_plugin_failed(x->plugin, st, "barrier");
            break;
        }
        if (bytes > UINT64_MAX / 2)
            break;
    }
    return rc;
}

/* The compute device of this rank, opened as `dtrain run` opens it (one
 * per local rank, device_index -1), and whether its memory is the host's. */
static int open_device(rank_ctx_t *x, const dt_world_t *world)
{
    dt_device_init_t da = {.struct_size = sizeof da, .rank = world->rank,
                           .local_rank = world->local_rank,
                           .local_size = world->local_size, .device_index = -1};
    const dt_device_ops_t *D = x->pdev->ops;
    int rc = D->init(x->pdev->host, &da, &x->dev);
    if (rc)
        return dt_plugin_failed(x->pdev, rc, "init");
    if ((rc = dt_plugin_check_instance(x->pdev, D, x->dev))) {
        x->dev = NULL;
        return rc;
    }
    dt_device_props_t props = {.struct_size = sizeof props};
    if ((rc = dt_device_ops(x->dev)->props(x->dev, &props)))
        return dt_plugin_failed(x->pdev, rc, "props");
    x->dev_mem = !props.host_visible;
    return DT_OK;
}

/* a (a_bytes) and b (b_bytes), the buffers the collectives are given: on
 * a device with its own memory, device memory (zeroed) with host copies
 * ha and hb; else host memory, faulted in before timing (unless --sym
 * placed one already). */
static int alloc_bufs(rank_ctx_t *x, uint64_t a_bytes, uint64_t b_bytes, void **a, void **b)
{
    if (x->dev_mem) {
        int rc = dt_device_ops(x->dev)->alloc(x->dev, a_bytes, DT_TAG_COMM, a);
        if (rc == DT_OK)
            rc = dt_device_ops(x->dev)->alloc(x->dev, b_bytes, DT_TAG_COMM, b);
        if (rc == DT_OK)
            rc = dt_device_ops(x->dev)->memset_async(x->dev, *a, 0, a_bytes, NULL);
        if (rc == DT_OK)
            rc = dt_device_ops(x->dev)->memset_async(x->dev, *b, 0, b_bytes, NULL);
        if (rc == DT_OK)
            rc = dt_device_ops(x->dev)->stream_sync(x->dev, NULL);
        if (rc)
            return dt_plugin_failed(x->pdev, rc, "allocating the buffers");
        x->ha = calloc(1, a_bytes);
        x->hb = calloc(1, b_bytes);
        if (!x->ha || !x->hb)
            return dt_err_set(DT_ERR_NOMEM, "rank %d: cannot allocate the host copies of "
                              "the buffers (%.1f MiB)", x->rank,
                              (double)(a_bytes + b_bytes) / 1048576.0);
        return DT_OK;
    }
    if ((!*a && posix_memalign(a, 4096, a_bytes)) || (!*b && posix_memalign(b, 4096, b_bytes)))
        return dt_err_set(DT_ERR_NOMEM, "rank %d: cannot allocate 2 x %.1f MiB of buffers",
                          x->rank,
                          (double)(a_bytes > b_bytes ? a_bytes : b_bytes) / 1048576.0);
    memset(*a, 0, a_bytes); /* fault the pages in before timing */
    memset(*b, 0, b_bytes);
    x->ha = *a;
    x->hb = *b;
    return DT_OK;
}

static int bench_rank(const bench_opts_t *o, dt_resolved_t *r, dt_world_t *world)
{
    if (o->bind)
        bind_rank(world->local_rank);
    char named_by[96], dev_named_by[96];
    snprintf(named_by, sizeof named_by, "--comm %s", o->comm);
    snprintf(dev_named_by, sizeof dev_named_by, "--device %s", o->device ? o->device : "");
    int rc = dt_resolve_plugin(r, DT_ROLE_COMM, o->comm, named_by);
    if (rc == DT_OK)
        rc = dt_resolve_plugin(r, DT_ROLE_DEVICE, o->device, o->device ? dev_named_by : NULL);
    if (rc == DT_OK)
        rc = dt_resolve_finish(r, "--set may name the core's tables, the comm plugin's and "
                                  "the device plugin's");
    if (rc)
        return rc;
    const dt_plugin_t *p = r->plugin[DT_ROLE_COMM];
    const dt_comm_ops_t *table = p->ops; /* what init is called through */
    rank_ctx_t x = {.o = o, .plugin = p, .rank = world->rank,
                    .n = world->size, .pdev = r->plugin[DT_ROLE_DEVICE]};
    dt_ledger_t *ledger = NULL;
    dt_interpose_comm_t *ic = NULL;
    if (o->ledger) {
        dt_interpose_hooks_t hooks;
        if (!(ledger = dt_ledger_create(world->rank, world->size))) {
            rc = DT_ERR_NOMEM;
            goto out;
        }
        hooks = dt_interpose_ledger_hooks(ledger);
        if ((rc = dt_interpose_comm_create(table, &hooks, &ic)))
            goto out;
        table = dt_interpose_comm_ops(ic);
    }
    if ((rc = open_device(&x, world)))
        goto out;
    if (o->sym && x.dev_mem) {
        rc = dt_err_set(DT_ERR_UNSUPPORTED, "--sym: symmetric memory is host memory, and "
                        "device '%s' keeps the buffers in its own memory", x.pdev->name);
        goto out;
    }
    dt_comm_init_t ia = {.struct_size = sizeof ia, .rank = world->rank,
                            .size = world->size, .local_rank = world->local_rank,
                            .local_size = world->local_size, .job_id = world->job_id,
                            .job_secret = world->job_secret[0] ? world->job_secret : NULL,
                            .master_addr = world->master_addr,
                            .master_port = world->master_port,
                            .timeout_ms = (int64_t)(o->timeout_s * 1000.0), .dev = x.dev};
    /* the job's rendezvous around init, as `dtrain run` opens it: a comm
     * plugin that exchanges bootstrap bytes (tcp, nccl) meets its peers
     * there, on one node or several ([launch] nnodes) */
    if ((rc = dt_rdzv_session_begin(world, dt_config_hash(r->cfg), o->timeout_s)))
        goto out;
    ia.job_id = world->job_id; /* the id the nodes agreed on */
    rc = table->init(p->host, &ia, &x.c);
    dt_rdzv_session_end();
    if (rc) {
        rc = dt_plugin_failed(p, rc, "init");
        goto out;
    }
    if ((rc = dt_plugin_check_instance(p, table, x.c))) {
        x.c = NULL;
        goto out;
    }
    const size_t es = dt_dtype_size(o->dtype);
    /* largest buffers: a holds the input, b the output */
    uint64_t max_count = count_for(o->op, o->max_bytes, es, x.n);
    uint64_t a_elems = o->op == OP_REDUCE_SCATTER ? max_count * (uint64_t)x.n : max_count;
    uint64_t b_elems = o->op == OP_ALL_GATHER ? max_count * (uint64_t)x.n : max_count;
    void *a = NULL, *b = NULL;
    /* --sym: the buffer the op reads from the peers lies in symmetric
     * memory: all_reduce's (in place), reduce_scatter's send, all_gather's
     * recv */
    void **symbuf = !o->sym ? NULL : o->op == OP_ALL_GATHER ? &b : &a;
    if (symbuf) {
        uint64_t bytes = (o->op == OP_ALL_GATHER ? b_elems : a_elems) * es + 64;
        if (!DT_HAS_OP(dt_comm_ops_t, dt_comm_ops(x.c), sym_alloc) ||
            !DT_HAS_OP(dt_comm_ops_t, dt_comm_ops(x.c), sym_free))
            rc = dt_err_set(DT_ERR_UNSUPPORTED, "--sym: comm plugin '%s' has no symmetric "
                            "memory (sym_alloc)", p->name);
        else if ((rc = dt_comm_ops(x.c)->sym_alloc(x.c, bytes, DT_TAG_COMM, symbuf)) != DT_OK)
            rc = dt_plugin_failed(p, rc, "sym_alloc");
        if (o->op == OP_ALL_REDUCE)
            b = a;
    }
    if (rc == DT_OK)
        rc = alloc_bufs(&x, a_elems * es + 64, b_elems * es + 64, &a, &b);
    if (rc == DT_OK) {
        if (x.rank == 0) {
            printf("# dtrain bench comm: %s%s, %d rank%s%s, comm %s%s, device %s, %s%s%s, "
                   "iters %s, warmup %d\n",
                   op_names[o->op],
                   !o->sym ? "" : o->op == OP_ALL_REDUCE ? " in place on symmetric memory"
                                                         : " on symmetric memory", x.n,
                   x.n == 1 ? "" : "s", o->bind ? " (bound to CPUs)" : "", p->name,
                   o->ledger ? " (through the ledger)" : "",
                   x.pdev->name, dt_dtype_name(o->dtype), redop_used(o->op) ? " " : "",
                   redop_used(o->op) ? redop_names[o->redop] : "", o->iters ? "fixed" : "auto",
                   o->warmup);
            printf("# %10s %12s %6s %6s %12s %12s %12s %8s\n", "size(B)", "count", "type",
                   "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
            fflush(stdout);
        }
        int any_wrong = 0;
        rc = bench_sizes(&x, a, b, &any_wrong);
        /* alone, a wrong result is this process's failure; with several
         * ranks only the ranks that saw one fail, so the launcher names
         * them */
        if (rc == DT_OK && any_wrong && x.n == 1)
            rc = dt_err_set(DT_ERR_DATA, "wrong results");
    }
    if (x.dev_mem) {
        dt_device_ops(x.dev)->free(x.dev, a);
        dt_device_ops(x.dev)->free(x.dev, b);
        free(x.ha);
        free(x.hb);
    } else if (symbuf) {
        void *other = symbuf == &a ? b : a; /* all_reduce: none */
        if (other != *symbuf)
            free(other);
        if (*symbuf)
            dt_comm_ops(x.c)->sym_free(x.c, *symbuf);
    } else {
        free(a);
        free(b);
    }
    dt_comm_ops(x.c)->finalize(x.c);
out:
    if (x.dev)
        dt_device_ops(x.dev)->finalize(x.dev);
    dt_interpose_comm_destroy(ic);
    dt_ledger_free(ledger);
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
    if (*end || v * (double)mul > 1e15)
        return -1;
    *out = (uint64_t)(v * (double)mul);
    return 0;
}

static int parse_int(const char *opt, const char *v, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "dtrain bench comm: error: %s '%s' is not an integer in [%ld, %ld]\n",
                opt, v, lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int pick(const char *opt, const char *v, const char *const *names, int n, int *out)
{
    for (int k = 0; k < n; k++)
        if (names[k] && strcmp(v, names[k]) == 0) {
            *out = k;
            return 0;
        }
    fprintf(stderr, "dtrain bench comm: error: unknown %s '%s' (one of:", opt, v);
    for (int k = 0; k < n; k++)
        if (names[k])
            fprintf(stderr, " %s", names[k]);
    fprintf(stderr, ")\n");
    return -1;
}

/* argv[0] is "comm".  Returns 0 or 2 (message printed). */
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
    o->timeout_s = 60;
    o->comm = dt_core_default_string("run", "comm", o->comm_default, sizeof o->comm_default);
    const char *dtypes[DT_DTYPE_COUNT];
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
        dtypes[d] = dt_dtype_name(d);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--bind")) {
            o->bind = 1;
            continue;
        }
        if (!strcmp(a, "--sym")) {
            o->sym = 1;
            continue;
        }
        if (!strcmp(a, "--ledger")) {
            o->ledger = 1;
            continue;
        }
        const char *v = NULL;
        if (!strncmp(a, "--", 2) && strchr(a, '=')) { /* --opt=value */
            static char opt[64];
            size_t n = (size_t)(strchr(a, '=') - a);
            snprintf(opt, sizeof opt, "%.*s", (int)(n < 63 ? n : 63), a);
            v = a + n + 1;
            a = opt;
        } else if (a[0] == '-' && i + 1 < argc) {
            v = argv[++i];
        } else if (a[0] == '-') {
            fprintf(stderr, "dtrain bench comm: error: %s needs a value\n", a);
            return DT_EXIT_USAGE;
        }
        int bad = 0;
        if (!v) {
            fprintf(stderr, "dtrain bench comm: error: unexpected argument '%s' (see dtrain "
                            "bench --help)\n", a);
            return DT_EXIT_USAGE;
        } else if (!strcmp(a, "--nproc") || !strcmp(a, "-n")) {
            bad = parse_int("--nproc", v, 1, DT_LAUNCH_MAX, &o->nproc);
            o->nproc_given = 1;
        } else if (!strcmp(a, "--op")) {
            bad = pick("--op", v, op_names, OP_COUNT, &o->op);
        } else if (!strcmp(a, "--sizes")) {
            char lo[64];
            snprintf(lo, sizeof lo, "%s", v);
            char *colon = strchr(lo, ':');
            if (colon)
                *colon = '\0';
            if (parse_bytes(lo, &o->min_bytes) ||
                parse_bytes(colon ? colon + 1 : lo, &o->max_bytes) || o->min_bytes == 0 ||
                o->max_bytes < o->min_bytes) {
                fprintf(stderr, "dtrain bench comm: error: bad --sizes '%s' (want MIN:MAX "
                                "like 4K:256M, MIN > 0)\n", v);
                bad = 1;
            }
        } else if (!strcmp(a, "--dtype")) {
            bad = pick("--dtype", v, dtypes, DT_DTYPE_COUNT, &o->dtype);
        } else if (!strcmp(a, "--redop")) {
            bad = pick("--redop", v, redop_names, 4, &o->redop);
        } else if (!strcmp(a, "--comm")) {
            o->comm = v;
        } else if (!strcmp(a, "--device")) {
            o->device = v;
        } else if (!strcmp(a, "--iters")) {
            bad = parse_int("--iters", v, 0, 1000000000, &o->iters);
        } else if (!strcmp(a, "--warmup")) {
            bad = parse_int("--warmup", v, 0, 1000000, &o->warmup);
        } else if (!strcmp(a, "--timeout")) {
            char *end;
            o->timeout_s = strtod(v, &end);
            if (end == v || *end || !(o->timeout_s >= 0.001 && o->timeout_s <= 1e6)) {
                fprintf(stderr, "dtrain bench comm: error: --timeout '%s' is not a number of "
                                "seconds in [0.001, 1e6]\n", v);
                bad = 1;
            }
        } else if (!strcmp(a, "--set")) {
            if (o->sets.n_sets == (int)(sizeof o->sets.sets / sizeof o->sets.sets[0])) {
                fprintf(stderr, "dtrain bench comm: error: too many --set options\n");
                bad = 1;
            } else {
                o->sets.sets[o->sets.n_sets++] = v;
            }
        } else {
            fprintf(stderr, "dtrain bench comm: error: unknown option '%s' (see dtrain bench "
                            "--help)\n", a);
            bad = 1;
        }
        if (bad)
            return DT_EXIT_USAGE;
    }
    if (o->sym && o->op != OP_ALL_REDUCE && o->op != OP_REDUCE_SCATTER &&
        o->op != OP_ALL_GATHER) {
        fprintf(stderr, "dtrain bench comm: error: --sym times all_reduce (in place), "
                        "reduce_scatter and all_gather, not %s\n", op_names[o->op]);
        return DT_EXIT_USAGE;
    }
    return DT_EXIT_OK;
}

static int bench_comm(int argc, char **argv)
{
    bench_opts_t o;
    int ec = parse_args(argc, argv, &o);
    if (ec)
        return ec;
    /* the core's defaults, the --set values, and --comm as run.comm and
     * --device as run.device (last, so they win) */
    const char *sets[DT_ARRAY_LEN(o.sets.sets) + 2];
    char comm_set[96], dev_set[96];
    int n = 0;
    for (int i = 0; i < o.sets.n_sets; i++)
        sets[n++] = o.sets.sets[i];
    snprintf(comm_set, sizeof comm_set, "run.comm=%s", o.comm);
    sets[n++] = comm_set;
    if (o.device) {
        snprintf(dev_set, sizeof dev_set, "run.device=%s", o.device);
        sets[n++] = dev_set;
    }
    dt_resolved_t r;
    int rc = dt_resolve_core(NULL, sets, n, &r);
    if (rc)
        return dt_cli_fail("bench comm", rc);
    dt_launch_plan_t plan;
    rc = dt_cli_plan_launch(&r, o.nproc, "--nproc",
                            o.nproc_given ? "from the command line" : "the default",
                            o.nproc_given, &plan);
    if (rc == DT_OK && plan.spawn) {
        dt_launch_opts_t lo = {.nproc = plan.nproc, .argv = dt_cli_argv(),
                               .raw_stdout_rank = 0, .cleanup = dt_resolve_cleanup_job,
                               .cleanup_ctx = &r};
        /* one node of several ([launch] nnodes, as `dtrain run` takes it):
         * this node's ranks of the job; rank 0's table on node 0 */
        char job[128];
        dt_cli_launch_nodes(&plan, &lo, job, sizeof job);
        dt_launch_result_t res;
        rc = dt_launch_run(&lo, &res);
        ec = rc ? dt_cli_fail("bench comm", rc) : res.exit_code;
        dt_resolved_free(&r);
        return ec;
    }
    if (rc == DT_OK) {
        if (plan.world.size > 1) {
            dt_log_set_rank(plan.world.rank);
            setvbuf(stdout, NULL, _IOLBF, 0);
        }
        rc = bench_rank(&o, &r, &plan.world);
    }
    ec = rc ? dt_cli_fail("bench comm", rc) : DT_EXIT_OK;
    dt_resolved_free(&r);
    return ec;
}

int dt_cmd_bench(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "dtrain bench: error: missing what to measure (dtrain bench comm; "
                        "see dtrain bench --help)\n");
        return DT_EXIT_USAGE;
    }
    if (strcmp(argv[1], "comm") == 0)
        return bench_comm(argc - 1, argv + 1);
    fprintf(stderr, "dtrain bench: error: unknown benchmark '%s' (known: comm)\n", argv[1]);
    return DT_EXIT_USAGE;
}
