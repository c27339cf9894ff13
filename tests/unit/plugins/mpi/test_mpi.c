/*
 * tests/unit/plugins/mpi/test_mpi.c - the `mpi` communicator plugin, driven through its
 * ABI table by ranks that mpirun starts.
 *
 * One program, two roles.  Run plainly it is a cmocka suite whose cases
 * each start `mpirun -np N <this program> --rank CASE` (as root:
 * --allow-run-as-root; --oversubscribe for 4 ranks on a 2-core machine;
 * btl self,vader with vader's single-copy mechanism off, which needs
 * ptrace rights a container may not give) and assert on its output.  Run
 * with --rank CASE it is one rank: it loads the plugin, runs the case, and
 * prints "rank R: ok CASE" or "rank R: FAIL ..." lines.
 *
 * Numbers (the "battery" case, at 2 and 4 ranks, [mpi] ring_bytes = 4096
 * so all-reduces run both of libnbc's algorithms the plugin picks between:
 * its ring from 4 KiB up, its own choice below): every rank generates
 * every rank's inputs, so each computes the expectation locally, in double:
 *  - copies (all_gather, broadcast, send/recv) and max/min: bit-exact;
 *  - integer sums: exact, wrapping in the dtype's width;
 *  - float sums and averages: MPI's algorithms add in an order of their
 *    own, so |got - exact| <= (N - 1) * (u + 2^-24) * sum|x| + slack, with
 *    u the dtype's unit roundoff (f32 2^-24, f64 2^-53, bf16 2^-8, f16
 *    2^-11; bf16/f16 partial sums are rounded at each of the N - 1
 *    combines) and slack 2^-24 for f16's subnormals; avg adds one rounding
 *    of the quotient.  f32 at 2 ranks must be exactly the one rounding of
 *    the exact sum (MPI adds the two inputs once).
 * Failures: a wait that times out (a receive with its own limit, a
 * collective with the group's) with the shm-shaped message, then the group
 * refusing new operations; at 4 ranks, a split pair's timeout naming the
 * missing rank in both numberings and the world's listing every other rank; abort on one rank failing the other's wait
 * with the reason, and with [mpi] abort_job also ending the job through
 * MPI_Abort; dtrain's rank not matching MPI's.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef DT_TEST_MPIEXEC
#include <mpi.h> /* the application-initialised MPI cases */
#endif

#include "dtrain/dtrain.h"
#include "ref_kernels.h"
#include "test_host.h"
#include "test_plugin.h"
#include "util/error.h"

#define PLUGIN_PATH DT_TEST_PLUGIN_DIR "/dtrain_mpi.so"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ======================================================================
 * The rank side.
 * ==================================================================== */

static const dt_comm_ops_v1_t *g_ops;
static int g_rank = -1;

static int rank_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int rank_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("rank %d: FAIL ", g_rank);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    return 1;
}

#define RK_CHECK(cond, ...)                                                     \
    do {                                                                       \
        if (!(cond))                                                           \
            return rank_fail(__VA_ARGS__);                                     \
    } while (0)
#define RK_OK(expr)                                                             \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != DT_OK)                                                      \
            return rank_fail("%s:%d: %s -> %s: %s", __FILE__, __LINE__, #expr,  \
                             dt_status_name(rc_), dt_last_error());            \
    } while (0)
/* A call that must fail with `st` and exactly `msg`. */
#define RK_FAILS(expr, st, msg)                                                 \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != (st) || strcmp(dt_last_error(), (msg)) != 0)                 \
            return rank_fail("%s:%d: %s -> %s '%s', want %s '%s'", __FILE__,    \
                             __LINE__, #expr, dt_status_name(rc_),             \
                             dt_last_error(), dt_status_name(st), (msg));      \
    } while (0)

static int env_int(const char *name)
{
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

/* Join the world with the rank and size mpirun gave (or `size`, >0). */
static int join(dt_test_host_t *th, const dt_test_kv_t *kv, int size, int64_t timeout_ms,
                dt_comm_t **c)
{
    dt_test_host_init(th, "comm/mpi", kv);
    dt_comm_init_v1_t ia;
    memset(&ia, 0, sizeof ia);
    ia.struct_size = sizeof ia;
    ia.rank = g_rank;
    ia.size = size;
    ia.local_rank = g_rank;
    ia.local_size = size;
    ia.job_id = "mpitest";
    ia.timeout_ms = timeout_ms;
    return g_ops->init(&th->host, &ia, c);
}

/* ---- inputs and expectations ---------------------------------------- */

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

static uint32_t hash3(int rank, uint64_t i, uint32_t salt)
{
    return mix((uint32_t)i * 2654435761U ^ mix((uint32_t)rank * 97U + salt) ^
               (uint32_t)(i >> 32));
}

/* f32 with a full mantissa in [-8, 8): sums depend on the order. */
static float gen(int rank, uint64_t i, uint32_t salt)
{
    return (float)((int32_t)(hash3(rank, i, salt) >> 8) - (1 << 23)) * 0x1p-20f;
}

/* Rank `rank`'s input element i as dtype dt at out. */
static void input_elem(void *out, int dt, int rank, uint64_t i, uint32_t salt)
{
    uint32_t h = hash3(rank, i, salt ^ 0x5bd1e995U);
    switch (dt) {
    case DT_F32: { float v = gen(rank, i, salt); memcpy(out, &v, 4); break; }
    case DT_F64: {
        double v = (double)gen(rank, i, salt) + (double)(h & 0xffffff) * 0x1p-44;
        memcpy(out, &v, 8);
        break;
    }
    case DT_BF16: { /* a bf16 value: the float's top half */
        float f = gen(rank, i, salt);
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t v = (uint16_t)(u >> 16);
        memcpy(out, &v, 2);
        break;
    }
    case DT_F16: { uint16_t v = dt_ref_f32_to_f16(gen(rank, i, salt)); memcpy(out, &v, 2); break; }
    case DT_I32: { int32_t v = (int32_t)h; memcpy(out, &v, 4); break; }
    case DT_I64: {
        int64_t v = (int64_t)(((uint64_t)h << 32) | mix(h));
        memcpy(out, &v, 8);
        break;
    }
    case DT_U16: { uint16_t v = (uint16_t)h; memcpy(out, &v, 2); break; }
    case DT_U8: *(uint8_t *)out = (uint8_t)h; break;
    default: break;
    }
}

static void fill(void *dst, int dt, int rank, uint64_t n, uint64_t base, uint32_t salt)
{
    size_t es = dt_dtype_size(dt);
    for (uint64_t i = 0; i < n; i++)
        input_elem((unsigned char *)dst + i * es, dt, rank, base + i, salt);
}

static int is_float(int dt) { return dt == DT_F32 || dt == DT_F64 || dt == DT_BF16 || dt == DT_F16; }

static double as_double(const void *p, int dt)
{
    switch (dt) {
    case DT_F32: { float f; memcpy(&f, p, 4); return f; }
    case DT_F64: { double d; memcpy(&d, p, 8); return d; }
    case DT_BF16: return dt_ref_bf16_to_double(*(const uint16_t *)p);
    case DT_F16: return dt_ref_f16_to_double(*(const uint16_t *)p);
    default: return 0;
    }
}

/* An integer element as a signed / unsigned 64-bit value. */
static int64_t as_i64(const void *p, int dt)
{
    switch (dt) {
    case DT_I32: { int32_t v; memcpy(&v, p, 4); return v; }
    case DT_I64: { int64_t v; memcpy(&v, p, 8); return v; }
    case DT_U16: return *(const uint16_t *)p;
    case DT_U8: return *(const uint8_t *)p;
    default: return 0;
    }
}

static double unit_roundoff(int dt)
{
    switch (dt) {
    case DT_F32: return 0x1p-24;
    case DT_F64: return 0x1p-53;
    case DT_BF16: return 0x1p-8;
    case DT_F16: return 0x1p-11;
    default: return 0;
    }
}

static const char *red_name(int op)
{
    static const char *names[] = {"sum", "avg", "max", "min"};
    return op >= 0 && op < 4 ? names[op] : "?";
}

/* got[j] (n elements) against op over all N ranks of input index base + j. */
static int check_reduced(const void *got, int dt, int op, int N, uint64_t n, uint64_t base,
                         uint32_t salt, const char *what)
{
    size_t es = dt_dtype_size(dt);
    unsigned char x[8];
    for (uint64_t j = 0; j < n; j++) {
        const void *g = (const unsigned char *)got + j * es;
        if (is_float(dt)) {
            double s = 0, a = 0, mx = -INFINITY, mn = INFINITY;
            for (int r = 0; r < N; r++) {
                input_elem(x, dt, r, base + j, salt);
                double v = as_double(x, dt);
                s += v;
                a += fabs(v);
                mx = v > mx ? v : mx;
                mn = v < mn ? v : mn;
            }
            double have = as_double(g, dt), want, tol;
            double u = unit_roundoff(dt);
            tol = (N - 1) * (u + 0x1p-24) * a + (dt == DT_F16 ? 0x1p-24 : 0);
            switch (op) {
            case DT_OP_MAX: want = mx; tol = 0; break;
            case DT_OP_MIN: want = mn; tol = 0; break;
            case DT_OP_AVG: want = s / N; tol = tol / N + (u + 0x1p-24) * fabs(want); break;
            default: want = s; break;
            }
            if (dt == DT_F32 && N == 2 && op != DT_OP_AVG)
                want = (double)(float)want, tol = 0; /* one rounding of the exact sum */
            if (!(fabs(have - want) <= tol))
                return rank_fail("%s %s %s at %d ranks: element %llu: got %.9g, want %.9g "
                                 "(tolerance %.3g)", what, dt_dtype_name(dt), red_name(op), N,
                                 (unsigned long long)j, have, want, tol);
        } else {
            uint64_t s = 0;
            int64_t mx = INT64_MIN, mn = INT64_MAX;
            for (int r = 0; r < N; r++) {
                input_elem(x, dt, r, base + j, salt);
                int64_t v = as_i64(x, dt);
                s += (uint64_t)v;
                mx = v > mx ? v : mx;
                mn = v < mn ? v : mn;
            }
            uint64_t want = op == DT_OP_MAX ? (uint64_t)mx : op == DT_OP_MIN ? (uint64_t)mn : s;
            uint64_t have = (uint64_t)as_i64(g, dt);
            uint64_t mask = es == 8 ? ~0ull : (1ull << (8 * es)) - 1;
            if ((have & mask) != (want & mask))
                return rank_fail("%s %s %s at %d ranks: element %llu: got %llu, want %llu",
                                 what, dt_dtype_name(dt), red_name(op), N,
                                 (unsigned long long)j, (unsigned long long)(have & mask),
                                 (unsigned long long)(want & mask));
        }
    }
    return 0;
}

/* got (n elements) == rank src's inputs base.. */
static int check_copy(const void *got, int dt, int src, uint64_t n, uint64_t base,
                      uint32_t salt, const char *what)
{
    size_t es = dt_dtype_size(dt);
    unsigned char want[8];
    for (uint64_t i = 0; i < n; i++) {
        input_elem(want, dt, src, base + i, salt);
        if (memcmp((const unsigned char *)got + i * es, want, es) != 0)
            return rank_fail("%s %s: element %llu differs from rank %d's input", what,
                             dt_dtype_name(dt), (unsigned long long)i, src);
    }
    return 0;
}

/* ---- the battery ------------------------------------------------------ */

static const int k_dtypes[] = {DT_F32, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I64, DT_U16, DT_U8};
#define N_DTYPES (sizeof k_dtypes / sizeof k_dtypes[0])
/* one element, an odd count, one above MPI's eager limits */
static const uint64_t k_counts[] = {1, 1001, 40000};

static int battery_reductions(dt_comm_t *c, int rank, int N)
{
    uint32_t salt = 1000;
    for (size_t d = 0; d < N_DTYPES; d++) {
        int dt = k_dtypes[d];
        size_t es = dt_dtype_size(dt);
        for (int op = DT_OP_SUM; op <= DT_OP_MIN; op++) {
            if (op == DT_OP_AVG && !is_float(dt))
                continue;
            for (size_t k = 0; k < 3; k++) {
                uint64_t n = k_counts[k];
                int rc = 0;
                salt++;
                unsigned char *in = malloc(n * es * (size_t)N), *out = malloc(n * es * (size_t)N);
                RK_CHECK(in && out, "out of memory");
                /* all_reduce, out of place then in place */
                fill(in, dt, rank, n, 0, salt);
                RK_OK(g_ops->all_reduce(c, in, out, n, dt, op, NULL, NULL));
                if ((rc = check_reduced(out, dt, op, N, n, 0, salt, "all_reduce")))
                    goto done;
                RK_OK(g_ops->all_reduce(c, in, in, n, dt, op, NULL, NULL));
                if ((rc = check_reduced(in, dt, op, N, n, 0, salt, "all_reduce in place")))
                    goto done;
                /* reduce_scatter: block r of the reduced N * n, then into
                 * the rank's own block of the input */
                fill(in, dt, rank, n * (uint64_t)N, 0, salt);
                RK_OK(g_ops->reduce_scatter(c, in, out, n, dt, op, NULL, NULL));
                if ((rc = check_reduced(out, dt, op, N, n, (uint64_t)rank * n, salt,
                                        "reduce_scatter")))
                    goto done;
                unsigned char *mine = in + (size_t)rank * n * es;
                RK_OK(g_ops->reduce_scatter(c, in, mine, n, dt, op, NULL, NULL));
                if ((rc = check_reduced(mine, dt, op, N, n, (uint64_t)rank * n, salt,
                                        "reduce_scatter into its own block")))
                    goto done;
                /* reduce to the last rank */
                fill(in, dt, rank, n, 0, salt);
                memset(out, 0, n * es);
                RK_OK(g_ops->reduce(c, in, rank == N - 1 ? out : NULL, n, dt, op, N - 1, NULL,
                                   NULL));
                if (rank == N - 1 && (rc = check_reduced(out, dt, op, N, n, 0, salt, "reduce")))
                    goto done;
            done:
                free(in);
                free(out);
                if (rc)
                    return rc;
            }
        }
    }
    return 0;
}

static int battery_copies(dt_comm_t *c, int rank, int N)
{
    uint32_t salt = 5000;
    for (size_t d = 0; d < N_DTYPES; d++) {
        int dt = k_dtypes[d];
        size_t es = dt_dtype_size(dt);
        for (size_t k = 0; k < 3; k++) {
            uint64_t n = k_counts[k];
            salt++;
            unsigned char *in = malloc(n * es), *out = malloc(n * es * (size_t)N);
            RK_CHECK(in && out, "out of memory");
            fill(in, dt, rank, n, 0, salt);
            /* all_gather, out of place and in place */
            RK_OK(g_ops->all_gather(c, in, out, n, dt, NULL, NULL));
            for (int p = 0; p < N; p++)
                if (check_copy(out + (size_t)p * n * es, dt, p, n, 0, salt, "all_gather"))
                    return 1;
            memset(out, 0, n * es * (size_t)N);
            fill(out + (size_t)rank * n * es, dt, rank, n, 0, salt);
            RK_OK(g_ops->all_gather(c, out + (size_t)rank * n * es, out, n, dt, NULL, NULL));
            for (int p = 0; p < N; p++)
                if (check_copy(out + (size_t)p * n * es, dt, p, n, 0, salt, "all_gather in place"))
                    return 1;
            /* broadcast from every root */
            for (int root = 0; root < N; root++) {
                if (rank == root)
                    fill(out, dt, rank, n, 0, salt);
                else
                    memset(out, 0, n * es);
                RK_OK(g_ops->broadcast(c, out, n, dt, root, NULL, NULL));
                if (check_copy(out, dt, root, n, 0, salt, "broadcast"))
                    return 1;
            }
            /* a ring of sends, two messages with one tag arrive in order */
            int to = (rank + 1) % N, from = (rank + N - 1) % N;
            dt_comm_req_t *rq[4];
            unsigned char *second = malloc(n * es), *got2 = malloc(n * es);
            RK_CHECK(second && got2, "out of memory");
            fill(second, dt, rank, n, n, salt);
            RK_OK(g_ops->recv(c, out, n, dt, from, 7, NULL, &rq[0]));
            RK_OK(g_ops->recv(c, got2, n, dt, from, 7, NULL, &rq[1]));
            RK_OK(g_ops->send(c, in, n, dt, to, 7, NULL, &rq[2]));
            RK_OK(g_ops->send(c, second, n, dt, to, 7, NULL, &rq[3]));
            for (int i = 3; i >= 0; i--)
                RK_OK(g_ops->wait(c, rq[i], -1));
            if (check_copy(out, dt, from, n, 0, salt, "recv, first message") ||
                check_copy(got2, dt, from, n, n, salt, "recv, second message"))
                return 1;
            free(second);
            free(got2);
            free(in);
            free(out);
        }
    }
    return 0;
}

/* Several operations in flight at once, waited out of order; test(). */
static int battery_overlap(dt_comm_t *c, int rank, int N)
{
    const uint64_t n = 5000;
    float *a = malloc(n * 4), *b = malloc(n * 4 * (size_t)N), *d = malloc(n * 4);
    RK_CHECK(a && b && d, "out of memory");
    fill(a, DT_F32, rank, n, 0, 77);
    fill(d, DT_F32, rank, n, 0, 78);
    dt_comm_req_t *r1, *r2, *r3, *r4;
    RK_OK(g_ops->all_reduce(c, a, a, n, DT_F32, DT_OP_SUM, NULL, &r1));
    RK_OK(g_ops->all_gather(c, d, b, n, DT_F32, NULL, &r2));
    RK_OK(g_ops->broadcast(c, d, n, DT_F32, 0, NULL, &r3));
    RK_OK(g_ops->barrier(c, &r4));
    int done = 0;
    double t0 = now_s();
    while (!done && now_s() - t0 < 10)
        RK_OK(g_ops->test(c, r4, &done));
    RK_CHECK(done, "test never said the barrier completed");
    RK_OK(g_ops->wait(c, r4, -1));
    RK_OK(g_ops->wait(c, r3, -1));
    RK_OK(g_ops->wait(c, r2, 5000));
    RK_OK(g_ops->wait(c, r1, -1));
    int rc = check_reduced(a, DT_F32, DT_OP_SUM, N, n, 0, 77, "overlapped all_reduce");
    for (int p = 0; p < N && !rc; p++)
        rc = check_copy(b + (size_t)p * n, DT_F32, p, n, 0, 78, "overlapped all_gather");
    if (!rc)
        rc = check_copy(d, DT_F32, 0, n, 0, 78, "overlapped broadcast");
    /* count 0 is valid */
    RK_OK(g_ops->all_reduce(c, a, a, 0, DT_F32, DT_OP_SUM, NULL, NULL));
    /* a request never waited for is freed by finalize (the sanitizer
     * build's leak check sees it otherwise); its buffer lives as long */
    static int32_t never_waited[16];
    dt_comm_req_t *orphan;
    RK_OK(g_ops->broadcast(c, never_waited, 16, DT_I32, 0, NULL, &orphan));
    free(a);
    free(b);
    free(d);
    return rc;
}

/* Split into parities ordered by descending world rank; then only the
 * even ranks form a group. */
static int battery_split(dt_comm_t *c, int rank, int N)
{
    dt_comm_t *g = NULL;
    RK_OK(g_ops->split(c, rank % 2, -rank, &g));
    RK_CHECK(g, "split gave no group");
    int32_t gr = -1, gs = -1;
    RK_OK(g_ops->rank_size(g, &gr, &gs));
    int want_size = (N - rank % 2 + 1) / 2, want_rank = 0;
    for (int p = rank + 2; p < N; p += 2)
        want_rank++; /* members above us come first */
    RK_CHECK(gs == want_size && gr == want_rank, "split: rank %d of %d, want %d of %d", gr, gs,
            want_rank, want_size);
    int32_t me = rank, all[64];
    RK_OK(g_ops->all_gather(g, &me, all, 1, DT_I32, NULL, NULL));
    for (int i = 0; i < gs; i++) {
        int want = (N - 1) - ((N - 1 - rank % 2) % 2) - 2 * i; /* highest of the parity first */
        RK_CHECK(all[i] == want, "split group member %d is world rank %d, want %d", i,
                (int)all[i], want);
    }
    int32_t sum = rank, want_sum = 0;
    for (int p = rank % 2; p < N; p += 2)
        want_sum += p;
    RK_OK(g_ops->all_reduce(g, &sum, &sum, 1, DT_I32, DT_OP_SUM, NULL, NULL));
    RK_CHECK(sum == want_sum, "split group sum %d, want %d", (int)sum, want_sum);
    /* a message to a bad peer names the group */
    char msg[256];
    snprintf(msg, sizeof msg, "comm/mpi: send to rank %d (tag 0, f32, 4 bytes) on group "
             "world/g1c%d: peer %d is not a rank of the group [0, %d)", gs, rank % 2, gs, gs);
    RK_FAILS(g_ops->send(g, &sum, 1, DT_F32, gs, 0, NULL, NULL), DT_ERR_INVALID, msg);
    if (gs > 1) {
        /* send / recv inside the split */
        int32_t v = rank, got = -1;
        dt_comm_req_t *rs, *rr;
        RK_OK(g_ops->recv(g, &got, 1, DT_I32, (gr + gs - 1) % gs, 3, NULL, &rr));
        RK_OK(g_ops->send(g, &v, 1, DT_I32, (gr + 1) % gs, 3, NULL, &rs));
        RK_OK(g_ops->wait(g, rs, -1));
        RK_OK(g_ops->wait(g, rr, -1));
        RK_CHECK(got == all[(gr + gs - 1) % gs], "split recv got %d, want %d", (int)got,
                (int)all[(gr + gs - 1) % gs]);
    }
    g_ops->finalize(g);

    dt_comm_t *e = NULL;
    RK_OK(g_ops->split(c, rank % 2 == 0 ? 0 : DT_COMM_NO_COLOR, rank, &e));
    RK_CHECK((rank % 2 == 0) == (e != NULL), "NO_COLOR split: group %p on rank %d", (void *)e,
            rank);
    if (e) {
        int32_t one = 1;
        RK_OK(g_ops->all_reduce(e, &one, &one, 1, DT_I32, DT_OP_SUM, NULL, NULL));
        RK_CHECK(one == (N + 1) / 2, "even group has %d ranks, want %d", (int)one, (N + 1) / 2);
        g_ops->finalize(e);
    }
    return 0;
}

/* sendrecv: a ring exchange started as one; different
 * counts each way, blocking; a half matched by the peer's plain recv and
 * send; an argument error in either half starts neither (the next
 * exchange on that tag gets the right message); one request asked of two
 * is refused. */
static int battery_sendrecv(dt_comm_t *c, int rank, int N)
{
    if (N < 2)
        return 0;
    const int right = (rank + 1) % N, left = (rank + N - 1) % N;
    enum { M = 300000 };
    float *sb = malloc(M * sizeof *sb), *rb = malloc(M * sizeof *rb);
    RK_CHECK(sb && rb, "out of memory");
    dt_comm_req_t *rs = NULL, *rr = NULL;
    fill(sb, DT_F32, rank, M, 0, 901);
    RK_OK(g_ops->sendrecv(c, sb, M, rb, M, DT_F32, right, left, 5, 5, NULL, &rs, &rr));
    RK_CHECK(rs && rr && rs != rr, "sendrecv handed out %p and %p", (void *)rs, (void *)rr);
    RK_OK(g_ops->wait(c, rr, -1));
    if (check_copy(rb, DT_F32, left, M, 0, 901, "sendrecv ring"))
        return 1;
    RK_OK(g_ops->wait(c, rs, -1));
    /* blocking, 10 + rank elements to the right, 10 + left from the left */
    fill(sb, DT_F32, rank, 10 + (uint64_t)rank, 0, 902);
    RK_OK(g_ops->sendrecv(c, sb, 10 + (uint64_t)rank, rb, 10 + (uint64_t)left, DT_F32, right,
                        left, 6, 6, NULL, NULL, NULL));
    if (check_copy(rb, DT_F32, left, 10 + (uint64_t)left, 0, 902, "blocking sendrecv"))
        return 1;
    /* rank 0's sendrecv against rank 1's plain recv, then send */
    fill(sb, DT_F32, rank, 64, 0, 903);
    if (rank == 0)
        RK_OK(g_ops->sendrecv(c, sb, 64, rb, 64, DT_F32, 1, 1, 7, 8, NULL, NULL, NULL));
    if (rank == 1) {
        RK_OK(g_ops->recv(c, rb, 64, DT_F32, 0, 7, NULL, NULL));
        RK_OK(g_ops->send(c, sb, 64, DT_F32, 0, 8, NULL, NULL));
    }
    if (rank < 2 && check_copy(rb, DT_F32, 1 - rank, 64, 0, 903, "sendrecv vs send/recv"))
        return 1;
    /* refused: a bad recv peer (the send half not sent), one request */
    rs = rr = (dt_comm_req_t *)sb;
    int rc = g_ops->sendrecv(c, sb, 4, rb, 4, DT_F32, right, N, 9, 9, NULL, &rs, &rr);
    char want[128];
    snprintf(want, sizeof want, "peer %d is not a rank of the group [0, %d)", N, N);
    RK_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(), want) && !rs && !rr,
           "bad recv peer gave %s: %s", dt_status_name(rc), dt_last_error());
    rc = g_ops->sendrecv(c, sb, 4, rb, 4, DT_F32, right, left, 9, 9, NULL, &rs, NULL);
    RK_CHECK(rc == DT_ERR_INVALID && strcmp(dt_last_error(), "comm/mpi: sendrecv: send_req "
           "and recv_req are both given or both NULL") == 0 && !rs,
           "one request gave %s: %s", dt_status_name(rc), dt_last_error());
    fill(sb, DT_F32, rank, 8, 0, 904);
    RK_OK(g_ops->sendrecv(c, sb, 8, rb, 8, DT_F32, right, left, 9, 9, NULL, NULL, NULL));
    if (check_copy(rb, DT_F32, left, 8, 0, 904, "sendrecv after refusals"))
        return 1;
    free(sb);
    free(rb);
    return 0;
}

static int battery_errors(dt_comm_t *c, int rank, int N)
{
    int32_t x[4] = {0};
    RK_FAILS(g_ops->all_reduce(c, x, x, 4, DT_I32, DT_OP_AVG, NULL, NULL), DT_ERR_UNSUPPORTED,
            "comm/mpi: all_reduce (i32, 16 bytes) on group world: op avg is not defined for "
            "integer dtype i32");
    char msg[256];
    snprintf(msg, sizeof msg, "comm/mpi: broadcast (f32, 16 bytes, root %d) on group world: "
             "root %d is not a rank of the group [0, %d)", N, N, N);
    RK_FAILS(g_ops->broadcast(c, x, 4, DT_F32, N, NULL, NULL), DT_ERR_INVALID, msg);
    RK_FAILS(g_ops->all_reduce(c, x, x, 4, 99, DT_OP_SUM, NULL, NULL), DT_ERR_INVALID,
            "comm/mpi: all_reduce (unknown, 4 bytes) on group world: unknown dtype 99");
    (void)rank;
    return 0;
}

static int case_battery(int N)
{
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    /* all-reduces of 4 KiB and more on libnbc's ring (mpi_tune.c), the
     * smaller ones on its own choice: both paths checked below */
    static const dt_test_kv_t kv[] = {{"ring_bytes", "4096"}, {NULL, NULL}};
    RK_OK(join(&th, kv, N, 20000, &c));
    int32_t r = -1, s = -1;
    RK_OK(g_ops->rank_size(c, &r, &s));
    RK_CHECK(r == g_rank && s == N, "rank_size %d of %d", r, s);
    int rc = battery_reductions(c, g_rank, N);
    if (!rc)
        rc = battery_copies(c, g_rank, N);
    if (!rc)
        rc = battery_overlap(c, g_rank, N);
    if (!rc)
        rc = battery_split(c, g_rank, N);
    if (!rc)
        rc = battery_errors(c, g_rank, N);
    if (!rc)
        rc = battery_sendrecv(c, g_rank, N);
    if (!rc)
        RK_OK(g_ops->barrier(c, NULL));
    g_ops->finalize(c);
    return rc;
}

/* Rank 1 never posts: rank 0's receive (with a wait limit) and its
 * collective (the group's timeout) fail in time with shm's messages, and
 * the broken group refuses what comes next. */
static int case_timeout(int N)
{
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    RK_OK(join(&th, NULL, N, 1000, &c));
    if (g_rank != 0) {
        /* posts nothing; mpirun ends it when rank 0 is done */
        struct timespec ts = {8, 0};
        nanosleep(&ts, NULL);
        return 0;
    }
    float buf[1024] = {0};
    dt_comm_req_t *rq;
    RK_OK(g_ops->recv(c, buf, 10, DT_F32, 1, 5, NULL, &rq));
    double t0 = now_s();
    RK_FAILS(g_ops->wait(c, rq, 300), DT_ERR_TIMEOUT,
            "comm/mpi: recv #1 from rank 1 (tag 5, f32, 40 bytes) on group world: timed out "
            "after 0.3 s (the wait's limit) waiting for rank 1");
    double dt = now_s() - t0;
    RK_CHECK(dt >= 0.3 && dt < 1.5, "the receive's wait took %.2f s", dt);
    t0 = now_s();
    RK_FAILS(g_ops->all_reduce(c, buf, buf, 1024, DT_F32, DT_OP_SUM, NULL, NULL), DT_ERR_TIMEOUT,
            "comm/mpi: all_reduce #1 (f32, 4096 bytes) on group world: timed out after 1.0 s "
            "waiting for rank 1");
    dt = now_s() - t0;
    RK_CHECK(dt >= 1.0 && dt < 3.0, "the all_reduce took %.2f s", dt);
    RK_FAILS(g_ops->barrier(c, NULL), DT_ERR_TIMEOUT,
            "comm/mpi: barrier #2 on group world: not started: the group failed earlier: "
            "all_reduce #1 (f32, 4096 bytes) on group world: timed out after 1.0 s waiting "
            "for rank 1");
    g_ops->finalize(c); /* must not wait for the abandoned all_reduce */
    return 0;
}

/* 4 ranks split in pairs {0, 1} and {2, 3}; rank 3 never posts.  Rank 2's
 * wait on the pair names rank 3 in both numberings; its wait on the world
 * cannot know who is missing and lists every other rank. */
static int case_timeout_split(int N)
{
    dt_test_host_t th;
    dt_comm_t *c = NULL, *g = NULL;
    RK_CHECK(N == 4, "needs 4 ranks, not %d", N);
    RK_OK(join(&th, NULL, N, 1000, &c));
    RK_OK(g_ops->split(c, g_rank / 2, g_rank, &g));
    struct timespec nap = {8, 0}; /* mpirun ends the others when rank 2 is done */
    if (g_rank == 3) {
        nanosleep(&nap, NULL);
        return 0;
    }
    float buf[16];
    for (int i = 0; i < 16; i++)
        buf[i] = (float)(g_rank + i);
    if (g_rank < 2) {
        RK_OK(g_ops->all_reduce(g, buf, buf, 16, DT_F32, DT_OP_SUM, NULL, NULL));
        for (int i = 0; i < 16; i++)
            RK_CHECK(buf[i] == (float)(1 + 2 * i), "pair sum [%d] = %g", i, (double)buf[i]);
        printf("rank %d: pair all_reduce ok\n", g_rank);
        fflush(stdout);
        nanosleep(&nap, NULL);
        return 0;
    }
    RK_FAILS(g_ops->all_reduce(g, buf, buf, 16, DT_F32, DT_OP_SUM, NULL, NULL), DT_ERR_TIMEOUT,
             "comm/mpi: all_reduce #1 (f32, 64 bytes) on group world/g1c1: timed out after "
             "1.0 s waiting for rank 1 (world rank 3)");
    RK_FAILS(g_ops->barrier(c, NULL), DT_ERR_TIMEOUT,
             "comm/mpi: barrier #2 on group world: timed out after 1.0 s waiting for one or "
             "more of ranks 0, 1, 3");
    return 0;
}

/* An all_reduce of 4 MiB started before 2 s of "compute" without a
 * single MPI call is complete by then: the progress thread moved it
 * (Open MPI moves nonblocking collectives only inside MPI calls, and
 * through shared memory without single-copy that is hundreds of
 * fragments).  DT_TEST_MPI_PROGRESS_US sets [mpi] progress_us (0: no
 * thread) for trying it by hand. */
static int case_progress(int N)
{
    const char *us = getenv("DT_TEST_MPI_PROGRESS_US");
    const dt_test_kv_t kv[] = {{"progress_us", us ? us : "100"}, {NULL, NULL}};
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    RK_OK(join(&th, kv, N, 20000, &c));
    const uint64_t n = 1u << 20; /* 4 MiB: past the eager limit, quick when moved */
    float *buf = malloc(n * sizeof *buf);
    RK_CHECK(buf, "out of memory");
    for (uint64_t i = 0; i < n; i++)
        buf[i] = (float)((i + (uint64_t)g_rank) % 7);
    dt_comm_req_t *rq;
    RK_OK(g_ops->all_reduce(c, buf, buf, n, DT_F32, DT_OP_SUM, NULL, &rq));
    struct timespec ts = {2, 0};
    nanosleep(&ts, NULL);
    int done = -1;
    RK_OK(g_ops->test(c, rq, &done));
    printf("rank %d: done after the compute: %d\n", g_rank, done);
    RK_OK(g_ops->wait(c, rq, -1));
    for (uint64_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < N; r++)
            want += (float)((i + (uint64_t)r) % 7);
        RK_CHECK(buf[i] == want, "element %llu: %g, want %g", (unsigned long long)i,
                 (double)buf[i], (double)want);
    }
    free(buf);
    RK_CHECK(done == 1 || (us && strcmp(us, "0") == 0),
             "the all_reduce had not moved during 2 s of compute");
    g_ops->finalize(c);
    return 0;
}

/* Rank 1 aborts while rank 0 waits: rank 0's wait fails at once with the
 * reason, and so does its next operation. */
static int case_abort(int N)
{
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    RK_OK(join(&th, NULL, N, 20000, &c));
    if (g_rank == 1) {
        struct timespec ts = {0, 300000000};
        nanosleep(&ts, NULL);
        RK_OK(g_ops->abort(c, "gave up at step 3"));
        ts.tv_sec = 8; /* mpirun ends it when rank 0 is done */
        ts.tv_nsec = 0;
        nanosleep(&ts, NULL);
        return 0;
    }
    float buf[1024] = {0};
    double t0 = now_s();
    RK_FAILS(g_ops->all_reduce(c, buf, buf, 1024, DT_F32, DT_OP_SUM, NULL, NULL), DT_ERR_REMOTE,
            "comm/mpi: all_reduce #1 (f32, 4096 bytes) on group world: rank 1 aborted: "
            "gave up at step 3");
    double dt = now_s() - t0;
    RK_CHECK(dt < 3.0, "the abort reached rank 0 after %.2f s", dt);
    RK_FAILS(g_ops->barrier(c, NULL), DT_ERR_REMOTE,
            "comm/mpi: barrier #2 on group world: not started: the group failed earlier: "
            "all_reduce #1 (f32, 4096 bytes) on group world: rank 1 aborted: gave up at step 3");
    g_ops->finalize(c);
    return 0;
}

/* [mpi] abort_job = true: after telling rank 0 why, rank 1's abort ends
 * the whole job with MPI_Abort, long before rank 0's 20 s nap ends. */
static int case_abort_job(int N)
{
    static const dt_test_kv_t kv[] = {{"abort_job", "true"}, {NULL, NULL}};
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    RK_OK(join(&th, kv, N, 20000, &c));
    struct timespec ts = {0, 300000000};
    if (g_rank == 1) {
        nanosleep(&ts, NULL);
        const char *side = getenv("DT_TEST_MPI_SIDE"); /* run_ranks' file */
        int f = side && side[0] ? open(side, O_WRONLY | O_APPEND | O_NOFOLLOW) : -1;
        if (f >= 0) {
            fflush(stderr);
            dup2(f, 2);
            close(f);
        }
        g_ops->abort(c, "out of patience");
        return rank_fail("abort returned with abort_job = true");
    }
    float buf[16] = {0};
    RK_FAILS(g_ops->all_reduce(c, buf, buf, 16, DT_F32, DT_OP_SUM, NULL, NULL), DT_ERR_REMOTE,
             "comm/mpi: all_reduce #1 (f32, 64 bytes) on group world: rank 1 aborted: "
             "out of patience");
    printf("rank 0: got the reason\n");
    fflush(stdout);
    ts.tv_sec = 20;
    ts.tv_nsec = 0;
    nanosleep(&ts, NULL); /* MPI_Abort ends this first */
    return rank_fail("still running 20 s after rank 1's MPI_Abort");
}

#ifdef DT_TEST_MPIEXEC
/* An application that initialised MPI itself at MPI_THREAD_SERIALIZED:
 * the plugin serialises its calls, and leaves MPI_Finalize to it. */
static int case_app_serialized(int N)
{
    int provided = -1;
    RK_CHECK(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) == MPI_SUCCESS,
             "MPI_Init_thread");
    RK_CHECK(provided == MPI_THREAD_SERIALIZED, "MPI gave thread level %d", provided);
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    RK_OK(join(&th, NULL, N, 20000, &c));
    int32_t v[3] = {g_rank, 1, -g_rank};
    RK_OK(g_ops->all_reduce(c, v, v, 3, DT_I32, DT_OP_SUM, NULL, NULL));
    RK_CHECK(v[0] == N * (N - 1) / 2 && v[1] == N && v[2] == -v[0], "sums %d %d %d",
             (int)v[0], (int)v[1], (int)v[2]);
    g_ops->finalize(c);
    int finalized = 1;
    MPI_Finalized(&finalized);
    RK_CHECK(!finalized, "the plugin finalized the application's MPI");
    MPI_Finalize();
    return 0;
}

/* ... and one at MPI_THREAD_FUNNELED is refused, naming the level. */
static int case_app_funneled(int N)
{
    int provided = -1;
    RK_CHECK(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS,
             "MPI_Init_thread");
    RK_CHECK(provided == MPI_THREAD_FUNNELED, "MPI gave thread level %d", provided);
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    RK_FAILS(join(&th, NULL, N, 20000, &c), DT_ERR_UNSUPPORTED,
             "comm/mpi: init: MPI runs at MPI_THREAD_FUNNELED; the mpi communicator needs "
             "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (its groups may be driven from "
             "several threads): initialise MPI with one of them");
    MPI_Finalize();
    return 0;
}
#endif

/* Without mpirun MPI_COMM_WORLD is this process alone: dtrain's size 2
 * is refused, naming both. */
static int case_mismatch(void)
{
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    g_rank = 0;
    RK_FAILS(join(&th, NULL, 2, 5000, &c), DT_ERR_CONFIG,
            "comm/mpi: init: dtrain has this process as rank 0 of 2, MPI_COMM_WORLD as rank 0 "
            "of 1: start every rank with mpirun (mpirun -np N dtrain run|bench ...), one MPI "
            "process per rank");
    return 0;
}

static int rank_main(const char *name)
{
    g_ops = dt_test_plugin_entry(PLUGIN_PATH, DT_ENTRY_STRING(comm, 1), NULL);
    if (!g_ops)
        return rank_fail("cannot load %s: %s", PLUGIN_PATH, dt_last_error());
    int rc;
    if (strcmp(name, "mismatch") == 0) {
        rc = case_mismatch();
    } else {
        g_rank = env_int("OMPI_COMM_WORLD_RANK");
        int N = env_int("OMPI_COMM_WORLD_SIZE");
        if (g_rank < 0 || N < 1)
            return rank_fail("not started by mpirun (no OMPI_COMM_WORLD_RANK/SIZE)");
        if (strcmp(name, "battery") == 0)
            rc = case_battery(N);
        else if (strcmp(name, "timeout") == 0)
            rc = case_timeout(N);
        else if (strcmp(name, "timeout_split") == 0)
            rc = case_timeout_split(N);
        else if (strcmp(name, "abort") == 0)
            rc = case_abort(N);
        else if (strcmp(name, "progress") == 0)
            rc = case_progress(N);
        else if (strcmp(name, "abort_job") == 0)
            rc = case_abort_job(N);
#ifdef DT_TEST_MPIEXEC
        else if (strcmp(name, "app_serialized") == 0)
            rc = case_app_serialized(N);
        else if (strcmp(name, "app_funneled") == 0)
            rc = case_app_funneled(N);
#endif
        else
            rc = rank_fail("unknown case '%s'", name);
    }
    if (!rc) {
        printf("rank %d: ok %s\n", g_rank, name);
        fflush(stdout);
    }
    return rc;
}

/* ======================================================================
 * The cmocka side: start mpirun, assert on what the ranks printed.
 * ==================================================================== */

#ifdef DT_TEST_MPIEXEC
static char g_self[4096];

typedef struct mpirun_out {
    int status;      /* waitpid status; -1 when killed at the deadline */
    double elapsed;
    char text[65536];
} mpirun_out_t;

/* Run `<mpiexec> ... -np np <this program> --rank name` (np 0: the program
 * alone, no mpirun), at most deadline_s; output in o->text. */
static void run_ranks(int np, const char *name, double deadline_s, mpirun_out_t *o)
{
    char path[] = "/tmp/dt_test_mpi_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    /* a rank that ends the job (MPI_Abort) writes its last words here:
     * mpirun's forwarding of its stderr may be torn down unread */
    char side[] = "/tmp/dt_test_mpi_side_XXXXXX";
    int sfd = mkstemp(side);
    assert_true(sfd >= 0);
    char npbuf[16];
    snprintf(npbuf, sizeof npbuf, "%d", np);
    const char *argv_mpi[] = {DT_TEST_MPIEXEC, "--allow-run-as-root", "--oversubscribe",
                              "--bind-to", "none", "--mca", "btl", "self,vader",
                              "--mca", "btl_vader_single_copy_mechanism", "none",
                              "-x", "DT_TEST_MPI_SIDE",
                              "-np", npbuf, g_self, "--rank", name, NULL};
    const char *argv_alone[] = {g_self, "--rank", name, NULL};
    double t0 = now_s();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        /* as root, and for a singleton's own runtime */
        setenv("DT_TEST_MPI_SIDE", side, 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        setenv("OMPI_MCA_btl", "self,vader", 1);
        setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
        /* sanitizer builds: MPI's and PMIx's components stay loaded, and
         * the slow unwinder reaches the frames lsan.supp names (a leak
         * check stopping at an unloaded component's frame cannot tell
         * MPI's allocations from ours) */
        setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 1);
        setenv("PMIX_MCA_mca_base_component_disable_dlclose", "1", 1);
        const char *lsan = getenv("LSAN_OPTIONS");
        if (lsan) {
            char full[2048];
            snprintf(full, sizeof full, "%s:fast_unwind_on_malloc=0", lsan);
            setenv("LSAN_OPTIONS", full, 1);
        }
        execv(np ? argv_mpi[0] : argv_alone[0], (char *const *)(np ? argv_mpi : argv_alone));
        _exit(127);
    }
    setpgid(pid, pid);
    int st = 0;
    o->status = -1;
    for (;;) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) {
            o->status = st;
            break;
        }
        if (now_s() - t0 > deadline_s) {
            kill(-pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    o->elapsed = now_s() - t0;
    ssize_t n = pread(fd, o->text, sizeof o->text - 1, 0);
    size_t len = n > 0 ? (size_t)n : 0;
    ssize_t m = pread(sfd, o->text + len, sizeof o->text - 1 - len, 0);
    o->text[len + (m > 0 ? (size_t)m : 0)] = '\0';
    close(fd);
    close(sfd);
    unlink(side);
}

static void expect_ok_lines(const mpirun_out_t *o, int np, const char *name)
{
    if (o->status == -1)
        fail_msg("%s: killed at the deadline after %.1f s:\n%s", name, o->elapsed, o->text);
    if (strstr(o->text, "FAIL"))
        fail_msg("%s:\n%s", name, o->text);
    for (int r = 0; r < np; r++) {
        char want[64];
        snprintf(want, sizeof want, "rank %d: ok %s\n", r, name);
        if (!strstr(o->text, want))
            fail_msg("%s: no '%s' line:\n%s", name, want, o->text);
    }
}

static void battery(int np)
{
    static mpirun_out_t o;
    run_ranks(np, "battery", 150, &o);
    expect_ok_lines(&o, np, "battery");
    if (!WIFEXITED(o.status) || WEXITSTATUS(o.status) != 0)
        fail_msg("mpirun ended with status 0x%x:\n%s", o.status, o.text);
}

static void test_battery_2(void **state) { (void)state; battery(2); }
static void test_battery_4(void **state) { (void)state; battery(4); }

static void test_wait_timeout(void **state)
{
    (void)state;
    static mpirun_out_t o;
    run_ranks(2, "timeout", 60, &o);
    /* rank 1 posts nothing and is ended by mpirun once rank 0 leaves */
    expect_ok_lines(&o, 1, "timeout");
    assert_true(o.elapsed < 30);
}

static void test_wait_timeout_split(void **state)
{
    (void)state;
    static mpirun_out_t o;
    run_ranks(4, "timeout_split", 60, &o);
    if (!strstr(o.text, "rank 2: ok timeout_split\n") ||
        !strstr(o.text, "rank 0: pair all_reduce ok\n") ||
        !strstr(o.text, "rank 1: pair all_reduce ok\n") || strstr(o.text, "FAIL"))
        fail_msg("timeout_split:\n%s", o.text);
    assert_true(o.elapsed < 30);
}

static void test_progress_thread(void **state)
{
    (void)state;
    static mpirun_out_t o;
    run_ranks(2, "progress", 60, &o);
    expect_ok_lines(&o, 2, "progress");
}

static void test_abort(void **state)
{
    (void)state;
    static mpirun_out_t o;
    run_ranks(2, "abort", 60, &o);
    expect_ok_lines(&o, 1, "abort");
    assert_true(o.elapsed < 30);
}

static void test_abort_job(void **state)
{
    (void)state;
    static mpirun_out_t o;
    run_ranks(2, "abort_job", 60, &o);
    if (o.status == -1 || strstr(o.text, "FAIL"))
        fail_msg("abort_job:\n%s", o.text);
    assert_non_null(strstr(o.text, "rank 0: got the reason\n"));
    assert_non_null(strstr(o.text, "comm/mpi: ending the job with MPI_Abort ([mpi] "
                                   "abort_job = true) in 1.0 s: out of patience"));
    /* the job ended by MPI_Abort: failed, and before rank 0's nap ended */
    assert_false(WIFEXITED(o.status) && WEXITSTATUS(o.status) == 0);
    assert_true(o.elapsed < 15);
}

static void test_app_thread_levels(void **state)
{
    (void)state;
    static mpirun_out_t o;
    run_ranks(2, "app_serialized", 60, &o);
    expect_ok_lines(&o, 2, "app_serialized");
    run_ranks(2, "app_funneled", 60, &o);
    expect_ok_lines(&o, 2, "app_funneled");
}

static void test_rank_mismatch(void **state)
{
    (void)state;
    static mpirun_out_t o;
    run_ranks(0, "mismatch", 60, &o);
    expect_ok_lines(&o, 1, "mismatch");
}

static void test_plugin_info(void **state)
{
    (void)state;
    const dt_comm_ops_v1_t *ops =
        dt_test_plugin_entry(PLUGIN_PATH, DT_ENTRY_STRING(comm, 1), NULL);
    assert_non_null(ops);
    assert_string_equal(ops->info.name, "mpi");
    assert_int_equal(ops->info.n_config_keys, 4);
    assert_string_equal(ops->info.config_keys[0].name, "spin_us");
    assert_string_equal(ops->info.config_keys[1].name, "progress_us");
    assert_string_equal(ops->info.config_keys[2].name, "ring_bytes");
    assert_string_equal(ops->info.config_keys[3].name, "abort_job");
    assert_non_null(ops->test);
}
#endif /* DT_TEST_MPIEXEC */

#ifndef DT_TEST_MPIEXEC
static void test_skipped_without_mpi(void **state)
{
    (void)state;
    fprintf(stderr, "no MPI in this build: the mpi communicator is not built\n");
    skip();
}
#endif

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--rank") == 0)
        return rank_main(argv[2]);
#ifdef DT_TEST_MPIEXEC
    ssize_t n = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (n <= 0)
        return 1;
    g_self[n] = '\0';
#endif
    const struct CMUnitTest tests[] = {
#ifndef DT_TEST_MPIEXEC
        cmocka_unit_test(test_skipped_without_mpi),
#else
        cmocka_unit_test(test_plugin_info),
        cmocka_unit_test(test_battery_2),
        cmocka_unit_test(test_battery_4),
        cmocka_unit_test(test_wait_timeout),
        cmocka_unit_test(test_wait_timeout_split),
        cmocka_unit_test(test_progress_thread),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_abort_job),
        cmocka_unit_test(test_app_thread_levels),
        cmocka_unit_test(test_rank_mismatch),
#endif
    };
    /* DT_TEST_FILTER=PATTERN (cmocka's * and ?) runs the matching cases */
    const char *filter = getenv("DT_TEST_FILTER");
    if (filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
