/*
 * tests/unit/plugins/shm/test_shm.c - the `shm` communicator plugin, driven through its
 * ABI table by forked rank processes (tests/support/mp_harness.h).
 *
 * Numbers: every rank generates deterministic inputs for every rank, so
 * each child computes the reference locally: the op applied in rank order,
 * in f32 for f32/bf16/f16 (rounded once to nearest-even at the end, with
 * conversions written independently of the plugin's: f16 through
 * tests/support's double-arithmetic reference, as clang 14 has no _Float16
 * on x86; bf16 by picking the nearer neighbour).  The plugin
 * promises that exact order, so results are compared BITWISE (tolerance 0),
 * which also proves every rank gets identical bits.
 *
 * Failures: a rank SIGKILLed mid-collective, a rank that never arrives, a
 * rank that stalls, abort with a reason, mismatched collectives; each with
 * the exact status, the message text, how long it took, and that nothing
 * is left in /dev/shm.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <math.h>
#include <pwd.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "mp_harness.h"
#include "ref_kernels.h"
#include "test_host.h"
#include "util/error.h"
/* white box: the segment naming helpers only (test_segment_names makes
 * one of them truncate on purpose; clang has no -Wformat-truncation) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif
#include "shm/shm_internal.h"
/* white box: the hash behind the job secret, checked against published
 * vectors (the module exports only its entry, so its copy is unreachable;
 * this is the same source, compiled into the test) */
#include "shm/shm_secret.c"
#include "test_plugin.h"

#define PLUGIN_PATH DT_TEST_PLUGIN_DIR "/dtrain_shm.so"

static const dt_comm_ops_v1_t *g_ops; /* loaded once in the parent, inherited */
static void *g_dl;
static char g_job_prefix[64];         /* "dtt<pid>" */
static int g_job_no;

/* ---- plumbing ---------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void new_job(char *buf, size_t cap, const char *what)
{
    snprintf(buf, cap, "%s-%d-%s", g_job_prefix, ++g_job_no, what);
}

/* Segments the job left in /dev/shm. */
static int leftovers(const char *job)
{
    char pat[256];
    snprintf(pat, sizeof pat, "/dev/shm/dtrain-%s*", job);
    glob_t g;
    int n = 0;
    if (glob(pat, 0, NULL, &g) == 0) {
        n = (int)g.gl_pathc;
        for (size_t i = 0; i < g.gl_pathc; i++)
            fprintf(stderr, "left behind: %s\n", g.gl_pathv[i]);
        globfree(&g);
    }
    return n;
}

typedef struct run_args {
    char job[128];
    int64_t timeout_ms;
    const dt_test_kv_t *kv;
    int param;    /* scenario-specific */
    const char *secret; /* the job secret, NULL: none */
} run_args_t;

/* In a child: join the world; returns a status, the message in *err. */
static int join(const run_args_t *a, int rank, int size, dt_test_host_t *th, dt_comm_t **c)
{
    dt_test_host_init(th, "comm/shm", a->kv);
    dt_comm_init_v1_t ia;
    memset(&ia, 0, sizeof ia);
    ia.struct_size = sizeof ia;
    ia.rank = rank;
    ia.size = size;
    ia.local_rank = rank;
    ia.local_size = size;
    ia.job_id = a->job;
    ia.timeout_ms = a->timeout_ms;
    ia.job_secret = a->secret;
    return g_ops->init(&th->host, &ia, c);
}

#define CHILD_CHECK(cond, ...)                                                  \
    do {                                                                       \
        if (!(cond))                                                           \
            return dt_mp_fail(__VA_ARGS__);                                    \
    } while (0)

#define CHILD_OK(expr)                                                         \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != DT_OK)                                                      \
            return dt_mp_fail("%s:%d: %s -> %s: %s", __FILE__, __LINE__, #expr, \
                              dt_status_name(rc_), dt_last_error());           \
    } while (0)

static void run_expect_ok(int nproc, dt_mp_fn_t fn, run_args_t *a, double deadline)
{
    dt_mp_result_t res;
    assert_int_equal(dt_mp_run(nproc, fn, a, deadline, &res), 0);
    char why[8192];
    if (!dt_mp_all_ok(&res, why, sizeof why))
        fail_msg("%s", why);
    assert_int_equal(leftovers(a->job), 0);
}

/* ---- reference numbers ------------------------------------------------- */

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* Input value of `rank` at index i for test variant `salt`: f32 with a
 * full mantissa in [-8, 8), so sums depend on the order of addition. */
static float gen(int rank, uint64_t i, uint32_t salt)
{
    uint32_t h = mix((uint32_t)i * 2654435761U ^ mix((uint32_t)rank * 97U + salt) ^
                     (uint32_t)(i >> 32));
    return (float)((int32_t)(h >> 8) - (1 << 23)) * 0x1p-20f;
}

/* f32 -> bf16, round to nearest even, by picking the nearer of the two
 * neighbours in double arithmetic (independent of the plugin's bit trick). */
static uint16_t ref_bf16(float f)
{
    if (f != f)
        return 0x7fc0;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
    uint32_t lo = a & 0xffff0000u;
    float flo;
    memcpy(&flo, &lo, 4);
    int e = (int)((lo >> 23) & 0xff);
    double step = e == 0 ? ldexp(1.0, -133) : ldexp(1.0, e - 127 - 7);
    double x = fabs((double)f), dl = x - (double)flo, dh = (double)flo + step - x;
    uint32_t pick = dl < dh ? lo : dh < dl ? lo + 0x10000u : (((lo >> 16) & 1) ? lo + 0x10000u : lo);
    if (isinf(f))
        pick = 0x7f800000u;
    return (uint16_t)((sign | pick) >> 16);
}

static float ref_bf16_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t ref_f16(float f) { return dt_ref_f32_to_f16(f); }

/* exact: every f16 value is a float */
static float ref_f16_f32(uint16_t u) { return (float)dt_ref_f16_to_double(u); }

/* Element i of rank r's input in dtype dt, as bytes (dt's size) at out. */
static void input_elem(void *out, int dt, int rank, uint64_t i, uint32_t salt)
{
    switch (dt) {
    case DT_F32: { float v = gen(rank, i, salt); memcpy(out, &v, 4); break; }
    case DT_BF16: { uint16_t v = ref_bf16(gen(rank, i, salt)); memcpy(out, &v, 2); break; }
    case DT_F16: { uint16_t v = ref_f16(gen(rank, i, salt)); memcpy(out, &v, 2); break; }
    case DT_I32: {
        int32_t v = (int32_t)mix((uint32_t)(i * 31 + (uint64_t)rank * 7 + salt));
        memcpy(out, &v, 4);
        break;
    }
    case DT_U8: *(uint8_t *)out = (uint8_t)mix((uint32_t)(i * 13 + (uint64_t)rank * 5 + salt)); break;
    default: break;
    }
}

/* dst[0..n) = rank's input elements 0..n-1. */
static void fill(void *dst, int dt, int rank, uint64_t n, uint32_t salt)
{
    size_t es = dt_dtype_size(dt);
    for (uint64_t i = 0; i < n; i++)
        input_elem((unsigned char *)dst + i * es, dt, rank, i, salt);
}

static float widen(const void *p, int dt, uint64_t i)
{
    switch (dt) {
    case DT_F32: return ((const float *)p)[i];
    case DT_BF16: return ref_bf16_f32(((const uint16_t *)p)[i]);
    case DT_F16: return ref_f16_f32(((const uint16_t *)p)[i]);
    default: return 0;
    }
}

/* Reference reduction of input element `idx` over ranks 0..n-1 in rank
 * order, accumulated in f32, narrowed once to dt; returned as bits. */
static uint32_t ref_reduce_bits(int dt, int op, int n, uint64_t idx, uint32_t salt)
{
    float acc = 0;
    for (int r = 0; r < n; r++) {
        float v = gen(r, idx, salt);
        float x;
        switch (dt) {
        case DT_BF16: x = ref_bf16_f32(ref_bf16(v)); break;
        case DT_F16: x = ref_f16_f32(ref_f16(v)); break;
        default: x = v; break;
        }
        if (r == 0)
            acc = x;
        else if (op == DT_OP_MAX)
            acc = x > acc ? x : acc;
        else if (op == DT_OP_MIN)
            acc = x < acc ? x : acc;
        else
            acc = acc + x;
    }
    if (op == DT_OP_AVG)
        acc = acc / (float)n;
    uint32_t bits;
    switch (dt) {
    case DT_BF16: return ref_bf16(acc);
    case DT_F16: return ref_f16(acc);
    default: memcpy(&bits, &acc, 4); return bits;
    }
}

static uint32_t bits_at(const void *p, int dt, uint64_t i)
{
    if (dt == DT_F32) {
        uint32_t u;
        memcpy(&u, (const float *)p + i, 4);
        return u;
    }
    return ((const uint16_t *)p)[i];
}

static const char *op_name(int op)
{
    static const char *names[] = {"sum", "avg", "max", "min"};
    return op >= 0 && op < 4 ? names[op] : "?";
}

/* Compare `got` (n elements) with the reference of input indices
 * base + i; fails the child with the first difference. */
static int check_reduced(const void *got, int dt, int op, int nranks, uint64_t n,
                         uint64_t base, uint32_t salt, const char *what)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t want = ref_reduce_bits(dt, op, nranks, base + i, salt);
        uint32_t have = bits_at(got, dt, i);
        if (want != have)
            return dt_mp_fail("%s %s %s: element %llu: got bits 0x%x (%g), want 0x%x",
                              what, dt_dtype_name(dt), op_name(op), (unsigned long long)i,
                              have, (double)widen(got, dt, i), want);
    }
    return 0;
}

/* Compare a plain copy: got[i] == rank `src`'s input element base + i. */
static int check_copy(const void *got, int dt, int src, uint64_t n, uint64_t base,
                      uint32_t salt, const char *what)
{
    size_t es = dt_dtype_size(dt);
    unsigned char want[8];
    for (uint64_t i = 0; i < n; i++) {
        input_elem(want, dt, src, base + i, salt);
        if (memcmp((const unsigned char *)got + i * es, want, es) != 0)
            return dt_mp_fail("%s %s: element %llu differs from rank %d's input", what,
                              dt_dtype_name(dt), (unsigned long long)i, src);
    }
    return 0;
}

/* ---- the battery: every collective, dtype and op at one world size ---- */

static const dt_test_kv_t small_slots[] = {{"slot_bytes", "65536"}, {NULL, NULL}};

static int battery_reductions(dt_comm_t *c, int rank, int N)
{
    const int dts[] = {DT_F32, DT_BF16, DT_F16};
    const uint64_t counts[] = {1, 1001, 4099 /* > one 16 KiB chunk of f32 */};
    uint32_t salt = 100;
    for (size_t d = 0; d < 3; d++) {
        int dt = dts[d];
        size_t es = dt_dtype_size(dt);
        for (int op = DT_OP_SUM; op <= DT_OP_MIN; op++) {
            for (size_t k = 0; k < 3; k++) {
                uint64_t n = counts[k];
                salt++;
                void *in = malloc(n * es), *out = malloc(n * es);
                fill(in, dt, rank, n, salt);
                memset(out, 0xa5, n * es);
                CHILD_OK(g_ops->all_reduce(c, in, out, n, dt, op, NULL, NULL));
                if (check_reduced(out, dt, op, N, n, 0, salt, "all_reduce"))
                    return 1;
                /* in place */
                CHILD_OK(g_ops->all_reduce(c, in, in, n, dt, op, NULL, NULL));
                if (check_reduced(in, dt, op, N, n, 0, salt, "all_reduce in place"))
                    return 1;
                /* reduce to the last rank */
                fill(in, dt, rank, n, salt);
                memset(out, 0xa5, n * es);
                CHILD_OK(g_ops->reduce(c, in, rank == N - 1 ? out : NULL, n, dt, op, N - 1,
                                       NULL, NULL));
                if (rank == N - 1 && check_reduced(out, dt, op, N, n, 0, salt, "reduce"))
                    return 1;
                free(in);
                free(out);
            }
            /* reduce_scatter: rank r gets block r of the reduced N*rc */
            const uint64_t rcs[] = {1, 333, 2100};
            for (size_t k = 0; k < 3; k++) {
                uint64_t rc = rcs[k];
                salt++;
                void *in = malloc((size_t)N * rc * es), *out = malloc(rc * es);
                fill(in, dt, rank, (uint64_t)N * rc, salt);
                memset(out, 0xa5, rc * es);
                CHILD_OK(g_ops->reduce_scatter(c, in, out, rc, dt, op, NULL, NULL));
                if (check_reduced(out, dt, op, N, rc, (uint64_t)rank * rc, salt, "reduce_scatter"))
                    return 1;
                /* in place: recv is our own block of send */
                void *mine = (unsigned char *)in + (size_t)rank * rc * es;
                CHILD_OK(g_ops->reduce_scatter(c, in, mine, rc, dt, op, NULL, NULL));
                if (check_reduced(mine, dt, op, N, rc, (uint64_t)rank * rc, salt,
                                  "reduce_scatter in place"))
                    return 1;
                free(in);
                free(out);
            }
        }
    }
    return 0;
}

static int battery_copies(dt_comm_t *c, int rank, int N)
{
    const int dts[] = {DT_F32, DT_I32, DT_U8, DT_BF16};
    const uint64_t counts[] = {1, 1001, 5000 /* > one chunk for 4-byte types */};
    uint32_t salt = 900;
    for (size_t d = 0; d < 4; d++) {
        int dt = dts[d];
        size_t es = dt_dtype_size(dt);
        for (size_t k = 0; k < 3; k++) {
            uint64_t n = counts[k];
            salt++;
            void *in = malloc(n * es), *out = malloc((size_t)N * n * es);
            fill(in, dt, rank, n, salt);
            memset(out, 0x5a, (size_t)N * n * es);
            CHILD_OK(g_ops->all_gather(c, in, out, n, dt, NULL, NULL));
            for (int p = 0; p < N; p++)
                if (check_copy((unsigned char *)out + (size_t)p * n * es, dt, p, n, 0, salt,
                               "all_gather"))
                    return 1;
            /* in place: send is our block of recv */
            memset(out, 0x5a, (size_t)N * n * es);
            memcpy((unsigned char *)out + (size_t)rank * n * es, in, n * es);
            CHILD_OK(g_ops->all_gather(c, (unsigned char *)out + (size_t)rank * n * es, out, n,
                                       dt, NULL, NULL));
            for (int p = 0; p < N; p++)
                if (check_copy((unsigned char *)out + (size_t)p * n * es, dt, p, n, 0, salt,
                               "all_gather in place"))
                    return 1;
            /* broadcast from a root that moves with k */
            int root = (int)(k + d) % N;
            void *buf = malloc(n * es);
            if (rank == root)
                fill(buf, dt, rank, n, salt);
            else
                memset(buf, 0x77, n * es);
            CHILD_OK(g_ops->broadcast(c, buf, n, dt, root, NULL, NULL));
            if (check_copy(buf, dt, root, n, 0, salt, "broadcast"))
                return 1;
            free(buf);
            free(in);
            free(out);
        }
    }
    return 0;
}

static int battery_zero_and_p2p(dt_comm_t *c, int rank, int N)
{
    /* count 0: valid everywhere, buffers may be NULL */
    CHILD_OK(g_ops->all_reduce(c, NULL, NULL, 0, DT_F32, DT_OP_SUM, NULL, NULL));
    CHILD_OK(g_ops->reduce_scatter(c, NULL, NULL, 0, DT_BF16, DT_OP_AVG, NULL, NULL));
    CHILD_OK(g_ops->all_gather(c, NULL, NULL, 0, DT_U8, NULL, NULL));
    CHILD_OK(g_ops->broadcast(c, NULL, 0, DT_I32, 0, NULL, NULL));
    CHILD_OK(g_ops->reduce(c, NULL, NULL, 0, DT_F16, DT_OP_MAX, 0, NULL, NULL));
    CHILD_OK(g_ops->send(c, NULL, 0, DT_F32, (rank + 1) % N, 0, NULL, NULL));
    CHILD_OK(g_ops->recv(c, NULL, 0, DT_F32, (rank + N - 1) % N, 0, NULL, NULL));
    CHILD_OK(g_ops->barrier(c, NULL));

    /* ring: send right, receive from the left, both in flight at once;
     * 100000 f32 is larger than a channel ring, so flow control runs */
    const uint64_t sizes[] = {1, 1001, 100000};
    for (size_t k = 0; k < 3; k++) {
        uint64_t n = sizes[k];
        uint32_t salt = 500 + (uint32_t)k;
        float *out = malloc(n * 4), *in = malloc(n * 4);
        fill(out, DT_F32, rank, n, salt);
        memset(in, 0, n * 4);
        dt_comm_req_t *rs, *rr;
        int right = (rank + 1) % N, left = (rank + N - 1) % N;
        CHILD_OK(g_ops->recv(c, in, n, DT_F32, left, 7, NULL, &rr));
        CHILD_OK(g_ops->send(c, out, n, DT_F32, right, 7, NULL, &rs));
        CHILD_OK(g_ops->wait(c, rs, -1));
        CHILD_OK(g_ops->wait(c, rr, -1));
        if (check_copy(in, DT_F32, left, n, 0, salt, "ring recv"))
            return 1;
        free(out);
        free(in);
    }
    /* two tags to the same peer, received in the order sent */
    if (N >= 2) {
        int32_t a[3] = {1, 2, 3}, b[5] = {9, 8, 7, 6, 5}, ra[3], rb[5];
        if (rank == 0) {
            dt_comm_req_t *r1, *r2;
            CHILD_OK(g_ops->send(c, a, 3, DT_I32, 1, 11, NULL, &r1));
            CHILD_OK(g_ops->send(c, b, 5, DT_I32, 1, 12, NULL, &r2));
            CHILD_OK(g_ops->wait(c, r1, -1));
            CHILD_OK(g_ops->wait(c, r2, -1));
        } else if (rank == 1) {
            dt_comm_req_t *r1, *r2;
            CHILD_OK(g_ops->recv(c, rb, 5, DT_I32, 0, 12, NULL, &r2));
            CHILD_OK(g_ops->recv(c, ra, 3, DT_I32, 0, 11, NULL, &r1));
            CHILD_OK(g_ops->wait(c, r2, -1));
            CHILD_OK(g_ops->wait(c, r1, -1));
            CHILD_CHECK(memcmp(a, ra, sizeof a) == 0 && memcmp(b, rb, sizeof b) == 0,
                        "tagged messages arrived mixed up");
        }
    }
    return 0;
}

/* Three ops in flight at once, waited in order. */
static int battery_async(dt_comm_t *c, int rank, int N)
{
    const uint64_t n = 3000;
    float *a_in = malloc(n * 4), *a_out = malloc(n * 4);
    int32_t *g_in = malloc(n * 4), *g_out = malloc((size_t)N * n * 4);
    uint16_t *b = malloc(n * 2);
    fill(a_in, DT_F32, rank, n, 41);
    fill(g_in, DT_I32, rank, n, 42);
    if (rank == N / 2)
        fill(b, DT_BF16, rank, n, 43);
    dt_comm_req_t *r1, *r2, *r3;
    CHILD_OK(g_ops->all_reduce(c, a_in, a_out, n, DT_F32, DT_OP_SUM, NULL, &r1));
    CHILD_OK(g_ops->all_gather(c, g_in, g_out, n, DT_I32, NULL, &r2));
    CHILD_OK(g_ops->broadcast(c, b, n, DT_BF16, N / 2, NULL, &r3));
    int done = -1;
    CHILD_OK(g_ops->test(c, r3, &done));
    CHILD_CHECK(done == 0 || done == 1, "test gave done = %d", done);
    CHILD_OK(g_ops->wait(c, r1, -1));
    CHILD_OK(g_ops->wait(c, r2, 5000));
    CHILD_OK(g_ops->wait(c, r3, -1));
    if (check_reduced(a_out, DT_F32, DT_OP_SUM, N, n, 0, 41, "async all_reduce"))
        return 1;
    for (int p = 0; p < N; p++)
        if (check_copy(g_out + (size_t)p * n, DT_I32, p, n, 0, 42, "async all_gather"))
            return 1;
    if (check_copy(b, DT_BF16, N / 2, n, 0, 43, "async broadcast"))
        return 1;
    free(a_in);
    free(a_out);
    free(g_in);
    free(g_out);
    free(b);
    return 0;
}

/* sendrecv (comm ABI 1.2): a ring exchange started as one, larger than
 * a channel ring; different counts each way, blocking; a half matched
 * by the peer's plain recv and send; an argument error in either half
 * starts neither (the next exchange on that tag gets the right message);
 * one request asked of two is refused. */
static int battery_sendrecv(dt_comm_t *c, int rank, int N)
{
    if (N < 2)
        return 0;
    const int right = (rank + 1) % N, left = (rank + N - 1) % N;
    enum { M = 300000 };
    float *sb = malloc(M * sizeof *sb), *rb = malloc(M * sizeof *rb);
    CHILD_CHECK(sb && rb, "out of memory");
    dt_comm_req_t *rs = NULL, *rr = NULL;
    fill(sb, DT_F32, rank, M, 901);
    CHILD_OK(g_ops->sendrecv(c, sb, M, rb, M, DT_F32, right, left, 5, 5, NULL, &rs, &rr));
    CHILD_CHECK(rs && rr && rs != rr, "sendrecv handed out %p and %p", (void *)rs, (void *)rr);
    CHILD_OK(g_ops->wait(c, rr, -1));
    if (check_copy(rb, DT_F32, left, M, 0, 901, "sendrecv ring"))
        return 1;
    CHILD_OK(g_ops->wait(c, rs, -1));
    /* blocking, 10 + rank elements to the right, 10 + left from the left */
    fill(sb, DT_F32, rank, 10 + (uint64_t)rank, 902);
    CHILD_OK(g_ops->sendrecv(c, sb, 10 + (uint64_t)rank, rb, 10 + (uint64_t)left, DT_F32,
                             right, left, 6, 6, NULL, NULL, NULL));
    if (check_copy(rb, DT_F32, left, 10 + (uint64_t)left, 0, 902, "blocking sendrecv"))
        return 1;
    /* rank 0's sendrecv against rank 1's plain recv, then send */
    fill(sb, DT_F32, rank, 64, 903);
    if (rank == 0)
        CHILD_OK(g_ops->sendrecv(c, sb, 64, rb, 64, DT_F32, 1, 1, 7, 8, NULL, NULL, NULL));
    if (rank == 1) {
        CHILD_OK(g_ops->recv(c, rb, 64, DT_F32, 0, 7, NULL, NULL));
        CHILD_OK(g_ops->send(c, sb, 64, DT_F32, 0, 8, NULL, NULL));
    }
    if (rank < 2 && check_copy(rb, DT_F32, 1 - rank, 64, 0, 903, "sendrecv vs send/recv"))
        return 1;
    /* refused: a bad recv peer (the send half not sent), one request */
    rs = rr = (dt_comm_req_t *)sb;
    int rc = g_ops->sendrecv(c, sb, 4, rb, 4, DT_F32, right, N, 9, 9, NULL, &rs, &rr);
    char want[128];
    snprintf(want, sizeof want, "peer %d is not a rank of the group [0, %d)", N, N);
    CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(), want) && !rs && !rr,
                "bad recv peer gave %s: %s", dt_status_name(rc), dt_last_error());
    rc = g_ops->sendrecv(c, sb, 4, rb, 4, DT_F32, right, left, 9, 9, NULL, &rs, NULL);
    CHILD_CHECK(rc == DT_ERR_INVALID && strcmp(dt_last_error(), "comm/shm: sendrecv: send_req "
                "and recv_req are both given or both NULL") == 0 && !rs,
                "one request gave %s: %s", dt_status_name(rc), dt_last_error());
    fill(sb, DT_F32, rank, 8, 904);
    CHILD_OK(g_ops->sendrecv(c, sb, 8, rb, 8, DT_F32, right, left, 9, 9, NULL, NULL, NULL));
    if (check_copy(rb, DT_F32, left, 8, 0, 904, "sendrecv after refusals"))
        return 1;
    free(sb);
    free(rb);
    return 0;
}

static int child_battery(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    int32_t r = -1, s = -1;
    CHILD_OK(g_ops->rank_size(c, &r, &s));
    CHILD_CHECK(r == rank && s == N, "rank_size gave %d/%d", r, s);
    if (battery_reductions(c, rank, N) || battery_copies(c, rank, N) ||
        battery_zero_and_p2p(c, rank, N) || battery_async(c, rank, N) ||
        battery_sendrecv(c, rank, N))
        return 1;
    g_ops->finalize(c);
    return 0;
}

static void run_battery(int N)
{
    run_args_t a = {.timeout_ms = 20000, .kv = small_slots};
    char what[16];
    snprintf(what, sizeof what, "bat%d", N);
    new_job(a.job, sizeof a.job, what);
    run_expect_ok(N, child_battery, &a, 60.0);
}

static void test_world_1(void **state) { (void)state; run_battery(1); }
static void test_world_2(void **state) { (void)state; run_battery(2); }
static void test_world_3(void **state) { (void)state; run_battery(3); }
static void test_world_4(void **state) { (void)state; run_battery(4); }
static void test_world_5(void **state) { (void)state; run_battery(5); }
static void test_world_6(void **state) { (void)state; run_battery(6); }
static void test_world_7(void **state) { (void)state; run_battery(7); }
static void test_world_8(void **state) { (void)state; run_battery(8); }

/* ---- every f16 and bf16 bit pattern ----------------------------------- */

static int is_nan16(int dt, uint16_t b)
{
    return dt == DT_F16 ? (b & 0x7c00) == 0x7c00 && (b & 0x3ff)
                        : (b & 0x7f80) == 0x7f80 && (b & 0x7f);
}

/* Rank 0 holds all 65536 patterns, rank 1 a permutation of them (NaN
 * inputs replaced by 1.0): sums cover subnormals, overflow to infinity,
 * ties and inf - inf, all narrowed once and compared with the reference
 * conversions (NaN matches any NaN). */
static int child_half_patterns(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    if (a->param)
        setenv("DTRAIN_SHM_PORTABLE_KERNELS", "1", 1); /* no F16C even if present */
    CHILD_OK(join(a, rank, N, &th, &c));
    const int dts[] = {DT_F16, DT_BF16};
    uint16_t *in[2], *out = malloc(65536 * 2);
    in[0] = malloc(65536 * 2);
    in[1] = malloc(65536 * 2);
    for (int d = 0; d < 2; d++) {
        int dt = dts[d];
        uint16_t one = dt == DT_F16 ? 0x3c00 : 0x3f80;
        for (uint32_t i = 0; i < 65536; i++) {
            uint16_t p0 = (uint16_t)i, p1 = (uint16_t)(i * 40503u + 12345u);
            in[0][i] = is_nan16(dt, p0) ? one : p0;
            in[1][i] = is_nan16(dt, p1) ? one : p1;
        }
        for (int op = DT_OP_SUM; op <= DT_OP_MAX; op++) {
            CHILD_OK(g_ops->all_reduce(c, in[rank], out, 65536, dt, op, NULL, NULL));
            for (uint32_t i = 0; i < 65536; i++) {
                float x = dt == DT_F16 ? ref_f16_f32(in[0][i]) : ref_bf16_f32(in[0][i]);
                float y = dt == DT_F16 ? ref_f16_f32(in[1][i]) : ref_bf16_f32(in[1][i]);
                float acc = op == DT_OP_MAX ? (y > x ? y : x) : x + y;
                if (op == DT_OP_AVG)
                    acc = acc / 2.0f;
                uint16_t want = dt == DT_F16 ? ref_f16(acc) : ref_bf16(acc);
                if (want == out[i] || (is_nan16(dt, want) && is_nan16(dt, out[i])))
                    continue;
                return dt_mp_fail("%s %s of patterns 0x%04x, 0x%04x: got 0x%04x, want 0x%04x",
                                  dt_dtype_name(dt), op_name(op), in[0][i], in[1][i], out[i],
                                  want);
            }
        }
    }
    free(in[0]);
    free(in[1]);
    free(out);
    g_ops->finalize(c);
    return 0;
}

static void test_half_precision_patterns(void **state)
{
    (void)state;
    for (int portable = 0; portable <= 1; portable++) {
        run_args_t a = {.timeout_ms = 10000, .kv = NULL, .param = portable};
        new_job(a.job, sizeof a.job, "half");
        run_expect_ok(2, child_half_patterns, &a, 30.0);
    }
}

/* ---- 64 MiB: many rounds through the default 4 MiB slots ---------------- */

static int child_large(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    const uint64_t n = (64ull << 20) / 4 + 3; /* 64 MiB of f32 and a ragged end */
    float *buf = malloc(n * 4);
    CHILD_CHECK(buf, "out of memory");
    fill(buf, DT_F32, rank, n, 7);
    CHILD_OK(g_ops->all_reduce(c, buf, buf, n, DT_F32, DT_OP_SUM, NULL, NULL));
    if (check_reduced(buf, DT_F32, DT_OP_SUM, N, n, 0, 7, "64 MiB all_reduce"))
        return 1;
    /* all_gather of 64 MiB in total */
    const uint64_t sc = n / (uint64_t)N;
    fill(buf + (size_t)rank * sc, DT_F32, rank, sc, 8);
    CHILD_OK(g_ops->all_gather(c, buf + (size_t)rank * sc, buf, sc, DT_F32, NULL, NULL));
    for (int p = 0; p < N; p++)
        if (check_copy(buf + (size_t)p * sc, DT_F32, p, sc, 0, 8, "64 MiB all_gather"))
            return 1;
    free(buf);
    g_ops->finalize(c);
    return 0;
}

static void test_large_64mib(void **state)
{
    (void)state;
    for (int N = 2; N <= 3; N++) {
        run_args_t a = {.timeout_ms = 20000, .kv = NULL};
        new_job(a.job, sizeof a.job, "large");
        run_expect_ok(N, child_large, &a, 80.0);
    }
}

/* ---- sub-groups -------------------------------------------------------- */

/* World R x C, rank = row * C + col.  Rows and columns are split out, with
 * keys that reverse the order in rows, and used concurrently. */
static int child_grid(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    const int C = a->param, R = N / C, row = rank / C, col = rank % C;
    dt_test_host_t th;
    dt_comm_t *w = NULL, *rowg = NULL, *colg = NULL, *none = (dt_comm_t *)1;
    CHILD_OK(join(a, rank, N, &th, &w));
    CHILD_OK(g_ops->split(w, row, C - 1 - col, &rowg));
    CHILD_OK(g_ops->split(w, col, row, &colg));
    /* rank 0 sits out of a third split */
    CHILD_OK(g_ops->split(w, rank == 0 ? DT_COMM_NO_COLOR : 0, rank, &none));
    int32_t r, s;
    CHILD_OK(g_ops->rank_size(rowg, &r, &s));
    CHILD_CHECK(r == C - 1 - col && s == C, "row group: rank %d size %d, want %d/%d", r, s,
                C - 1 - col, C);
    CHILD_OK(g_ops->rank_size(colg, &r, &s));
    CHILD_CHECK(r == row && s == R, "column group: rank %d size %d", r, s);
    CHILD_CHECK((rank == 0) == (none == NULL), "NO_COLOR split gave %p", (void *)none);

    /* Concurrent all_reduce in the row group and all_gather in the column
     * group, then a world all_reduce. */
    const uint64_t n = 2500;
    float *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(n * 4);
    int32_t *g = malloc((size_t)R * n * 4);
    fill(x, DT_F32, rank, n, 60);
    fill(y, DT_I32, rank, n, 61);
    dt_comm_req_t *q1, *q2;
    CHILD_OK(g_ops->all_reduce(rowg, x, x, n, DT_F32, DT_OP_SUM, NULL, &q1));
    CHILD_OK(g_ops->all_gather(colg, y, g, n, DT_I32, NULL, &q2));
    CHILD_OK(g_ops->wait(colg, q2, -1));
    CHILD_OK(g_ops->wait(rowg, q1, -1));
    /* row group order is by key: group rank k is column C-1-k */
    for (uint64_t i = 0; i < n; i++) {
        float acc = 0;
        for (int k = 0; k < C; k++) {
            float v = gen(row * C + (C - 1 - k), i, 60);
            acc = k ? acc + v : v;
        }
        CHILD_CHECK(memcmp(&acc, &x[i], 4) == 0, "row all_reduce element %llu: %g != %g",
                    (unsigned long long)i, (double)x[i], (double)acc);
    }
    for (int k = 0; k < R; k++)
        if (check_copy(g + (size_t)k * n, DT_I32, k * C + col, n, 0, 61, "column all_gather"))
            return 1;
    fill(z, DT_F32, rank, n, 62);
    CHILD_OK(g_ops->all_reduce(w, z, z, n, DT_F32, DT_OP_MAX, NULL, NULL));
    if (check_reduced(z, DT_F32, DT_OP_MAX, N, n, 0, 62, "world all_reduce after splits"))
        return 1;
    if (none) {
        CHILD_OK(g_ops->barrier(none, NULL));
        g_ops->finalize(none);
    }
    /* A split of a split, then the world goes first: groups stay valid. */
    dt_comm_t *sub = NULL;
    CHILD_OK(g_ops->split(rowg, 0, 0, &sub));
    g_ops->finalize(w);
    fill(x, DT_F32, rank, n, 63);
    CHILD_OK(g_ops->all_reduce(sub, x, x, n, DT_F32, DT_OP_MIN, NULL, NULL));
    for (uint64_t i = 0; i < n; i++) {
        float acc = 0;
        for (int k = 0; k < C; k++) {
            float v = gen(row * C + (C - 1 - k), i, 63);
            acc = k ? (v < acc ? v : acc) : v;
        }
        CHILD_CHECK(memcmp(&acc, &x[i], 4) == 0, "nested split all_reduce element %llu",
                    (unsigned long long)i);
    }
    g_ops->finalize(sub);
    g_ops->finalize(rowg);
    g_ops->finalize(colg);
    free(x);
    free(y);
    free(z);
    free(g);
    return 0;
}

static void test_split_grids(void **state)
{
    (void)state;
    const int shapes[][2] = {{2, 2}, {2, 3}};
    for (int k = 0; k < 2; k++) {
        run_args_t a = {.timeout_ms = 10000, .kv = small_slots, .param = shapes[k][1]};
        new_job(a.job, sizeof a.job, "grid");
        run_expect_ok(shapes[k][0] * shapes[k][1], child_grid, &a, 40.0);
    }
}

/* ---- point-to-point in flight with collectives ------------------------- */

/* A pipeline's traffic: every rank streams 6 tagged messages (some larger
 * than a channel ring) to the next rank while it receives 6 from the
 * previous one, with world all_reduces started in between; everything is
 * waited for in reverse order. */
static int child_p2p_mix(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    enum { M = 6 };
    const uint64_t sizes[M] = {1, 300000, 17, 65536, 200001, 3};
    float *out[M], *in[M], *ar[2];
    dt_comm_req_t *req[3 * M];
    int nreq = 0;
    const int right = (rank + 1) % N, left = (rank + N - 1) % N;
    for (int m = 0; m < M; m++) {
        out[m] = malloc(sizes[m] * 4);
        in[m] = malloc(sizes[m] * 4);
        fill(out[m], DT_F32, rank, sizes[m], 700 + (uint32_t)m);
        CHILD_OK(g_ops->recv(c, in[m], sizes[m], DT_F32, left, m, NULL, &req[nreq++]));
    }
    for (int m = 0; m < M; m++) {
        CHILD_OK(g_ops->send(c, out[m], sizes[m], DT_F32, right, m, NULL, &req[nreq++]));
        if (m == 1 || m == 4) {
            float *x = ar[m == 4] = malloc(50000 * 4);
            fill(x, DT_F32, rank, 50000, 800 + (uint32_t)m);
            CHILD_OK(g_ops->all_reduce(c, x, x, 50000, DT_F32, DT_OP_SUM, NULL, &req[nreq++]));
        }
    }
    for (int k = nreq - 1; k >= 0; k--)
        CHILD_OK(g_ops->wait(c, req[k], -1));
    for (int m = 0; m < M; m++) {
        if (check_copy(in[m], DT_F32, left, sizes[m], 0, 700 + (uint32_t)m, "pipeline recv"))
            return 1;
        free(in[m]);
        free(out[m]);
    }
    for (int k = 0; k < 2; k++) {
        if (check_reduced(ar[k], DT_F32, DT_OP_SUM, N, 50000, 0, k ? 804 : 801,
                          "all_reduce among sends"))
            return 1;
        free(ar[k]);
    }
    g_ops->finalize(c);
    return 0;
}

static void test_p2p_with_collectives(void **state)
{
    (void)state;
    for (int N = 2; N <= 4; N += 2) {
        run_args_t a = {.timeout_ms = 10000, .kv = N == 4 ? small_slots : NULL};
        new_job(a.job, sizeof a.job, "p2pmix");
        run_expect_ok(N, child_p2p_mix, &a, 40.0);
    }
}

/* ---- failures ---------------------------------------------------------- */

/* Rank 2 of 4 is SIGKILLed while an all_reduce is moving data. */
static int child_killed(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    CHILD_OK(g_ops->barrier(c, NULL));
    const uint64_t n = 8u << 20; /* 32 MiB: many rounds */
    float *buf = malloc(n * 4);
    fill(buf, DT_F32, rank, 1024, 3);
    dt_comm_req_t *q;
    double t0 = now_s();
    CHILD_OK(g_ops->all_reduce(c, buf, buf, n, DT_F32, DT_OP_SUM, NULL, &q));
    if (rank == 2) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
        kill(getpid(), SIGKILL);
    }
    int rc = g_ops->wait(c, q, -1);
    double dt = now_s() - t0;
    const char *msg = dt_last_error();
    CHILD_CHECK(rc == DT_ERR_REMOTE, "wait gave %s: %s", dt_status_name(rc), msg);
    CHILD_CHECK(strstr(msg, "comm/shm: all_reduce #2 (f32, 33554432 bytes) on group world: "
                            "rank 2 (pid ") && strstr(msg, ") died"),
                "message: %s", msg);
    CHILD_CHECK(dt < 2.5, "noticed the death after %.2f s (timeout 3 s)", dt);
    /* later operations fail at once, naming the same cause */
    rc = g_ops->barrier(c, NULL);
    CHILD_CHECK(rc == DT_ERR_REMOTE && strstr(dt_last_error(), "died"), "barrier after: %s: %s",
                dt_status_name(rc), dt_last_error());
    g_ops->finalize(c);
    free(buf);
    return 0;
}

static void test_rank_killed(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 3000, .kv = NULL};
    new_job(a.job, sizeof a.job, "kill");
    dt_mp_result_t res;
    assert_int_equal(dt_mp_run(4, child_killed, &a, 20.0, &res), 0);
    for (int r = 0; r < 4; r++) {
        char how[64];
        if (r == 2) {
            assert_true(res.child[r].signaled && res.child[r].term_signal == SIGKILL &&
                        !res.child[r].killed);
        } else if (!res.child[r].exited || res.child[r].exit_code != 0) {
            fail_msg("rank %d: %s: %s", r, dt_mp_how(&res.child[r], how, sizeof how),
                     res.child[r].msg);
        }
    }
    assert_int_equal(leftovers(a.job), 0);
}

/* Ranks 2 and 3 of 4 never call init. */
static int child_absent(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    if (rank >= 2)
        return 0;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    double t0 = now_s();
    int rc = join(a, rank, N, &th, &c);
    double dt = now_s() - t0;
    char want[256];
    snprintf(want, sizeof want, "comm/shm: rendezvous for job '%s': timed out after 1.5 s "
             "waiting for ranks 2, 3 of 4", a->job);
    CHILD_CHECK(rc == DT_ERR_TIMEOUT && c == NULL, "init gave %s", dt_status_name(rc));
    CHILD_CHECK(strcmp(dt_last_error(), want) == 0, "message: %s", dt_last_error());
    CHILD_CHECK(dt >= 1.4 && dt < 4.0, "took %.2f s for a 1.5 s timeout", dt);
    return 0;
}

static void test_rendezvous_timeout(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 1500, .kv = NULL};
    new_job(a.job, sizeof a.job, "absent");
    run_expect_ok(4, child_absent, &a, 20.0);
}

/* Rank 1 of 2 is alive but never starts the collective. */
static int child_stall(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    if (rank == 1) {
        struct timespec ts = {2, 500000000};
        nanosleep(&ts, NULL);
        g_ops->finalize(c);
        return 0;
    }
    float x[1000] = {0};
    double t0 = now_s();
    int rc = g_ops->all_reduce(c, x, x, 1000, DT_F32, DT_OP_SUM, NULL, NULL);
    double dt = now_s() - t0;
    CHILD_CHECK(rc == DT_ERR_TIMEOUT, "gave %s: %s", dt_status_name(rc), dt_last_error());
    CHILD_CHECK(strcmp(dt_last_error(), "comm/shm: all_reduce #1 (f32, 4000 bytes) on group "
                       "world: timed out after 1.0 s waiting for rank 1") == 0,
                "message: %s", dt_last_error());
    CHILD_CHECK(dt >= 0.95 && dt < 3.0, "took %.2f s for a 1.0 s timeout", dt);
    g_ops->finalize(c);
    return 0;
}

static void test_stalled_rank(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 1000, .kv = NULL};
    new_job(a.job, sizeof a.job, "stall");
    run_expect_ok(2, child_stall, &a, 20.0);
}

/* A wait's own, shorter limit; the group is unusable afterwards. */
static int child_wait_limit(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    if (rank == 1) {
        /* absent long enough that rank 0's 0.2 s limit ends first even on
         * a loaded machine (its timeout, not this rank's leaving) */
        struct timespec ts = {3, 0};
        nanosleep(&ts, NULL);
        g_ops->finalize(c);
        return 0;
    }
    int32_t v[10] = {0};
    dt_comm_req_t *q;
    CHILD_OK(g_ops->broadcast(c, v, 10, DT_I32, 1, NULL, &q));
    double t0 = now_s();
    int rc = g_ops->wait(c, q, 200);
    double dt = now_s() - t0;
    CHILD_CHECK(rc == DT_ERR_TIMEOUT, "gave %s: %s", dt_status_name(rc), dt_last_error());
    CHILD_CHECK(strcmp(dt_last_error(), "comm/shm: broadcast #1 (i32, 40 bytes, root 1) on "
                       "group world: timed out after 0.2 s (the wait's limit) waiting for "
                       "rank 1") == 0, "message: %s", dt_last_error());
    CHILD_CHECK(dt >= 0.19 && dt < 1.5, "took %.2f s for a 0.2 s limit", dt);
    rc = g_ops->barrier(c, NULL);
    CHILD_CHECK(rc == DT_ERR_TIMEOUT && strstr(dt_last_error(), "comm/shm: barrier on "
                "group world: not started: the group failed earlier: broadcast #1"),
                "after: %s: %s", dt_status_name(rc), dt_last_error());
    g_ops->finalize(c);
    return 0;
}

static void test_wait_limit(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 3000, .kv = NULL};
    new_job(a.job, sizeof a.job, "waitlim");
    run_expect_ok(2, child_wait_limit, &a, 20.0);
}

/* Rank 1 of 3 aborts while the others wait in an all_reduce. */
static int child_abort(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL, *sub = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    CHILD_OK(g_ops->split(c, rank == 1 ? DT_COMM_NO_COLOR : 0, 0, &sub));
    float x[100] = {0};
    if (rank == 1) {
        struct timespec ts = {0, 200000000};
        nanosleep(&ts, NULL);
        CHILD_OK(g_ops->abort(c, "loss is NaN at step 7"));
        int rc = g_ops->all_reduce(c, x, x, 100, DT_F32, DT_OP_SUM, NULL, NULL);
        CHILD_CHECK(rc == DT_ERR_REMOTE && strstr(dt_last_error(),
                    "rank 1 aborted: loss is NaN at step 7"), "own op after abort: %s: %s",
                    dt_status_name(rc), dt_last_error());
        g_ops->finalize(c);
        return 0;
    }
    double t0 = now_s();
    int rc = g_ops->all_reduce(c, x, x, 100, DT_F32, DT_OP_SUM, NULL, NULL);
    double dt = now_s() - t0;
    CHILD_CHECK(rc == DT_ERR_REMOTE, "gave %s: %s", dt_status_name(rc), dt_last_error());
    CHILD_CHECK(strcmp(dt_last_error(), "comm/shm: all_reduce #2 (f32, 400 bytes) on group "
                       "world: rank 1 aborted: loss is NaN at step 7") == 0,
                "message: %s", dt_last_error());
    CHILD_CHECK(dt < 2.0, "abort noticed after %.2f s", dt);
    /* the sub-group (without rank 1) is failed too: the whole job is */
    rc = g_ops->barrier(sub, NULL);
    CHILD_CHECK(rc == DT_ERR_REMOTE && strstr(dt_last_error(),
                "world rank 1 aborted: loss is NaN at step 7"), "sub-group: %s: %s",
                dt_status_name(rc), dt_last_error());
    g_ops->finalize(sub);
    g_ops->finalize(c);
    return 0;
}

static void test_abort(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 3000, .kv = NULL};
    new_job(a.job, sizeof a.job, "abort");
    run_expect_ok(3, child_abort, &a, 20.0);
}

/* Ranks that call different collectives are told so. */
static int child_mismatch(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    float x[10] = {0};
    int rc;
    if (rank == 0)
        rc = g_ops->all_reduce(c, x, x, 10, DT_F32, DT_OP_SUM, NULL, NULL);
    else
        rc = g_ops->broadcast(c, x, 10, DT_F32, 0, NULL, NULL);
    CHILD_CHECK(rc == DT_ERR_INVALID, "gave %s: %s", dt_status_name(rc), dt_last_error());
    const char *want = rank == 0 ? "rank 1 started broadcast #1 (count 10, f32, op 0, root 0) instead"
                                 : "rank 0 started all_reduce #1 (count 10, f32, op 0, root -1) instead";
    CHILD_CHECK(strstr(dt_last_error(), want), "message: %s", dt_last_error());
    g_ops->finalize(c);
    return 0;
}

static void test_mismatched_collectives(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 3000, .kv = NULL};
    new_job(a.job, sizeof a.job, "mismatch");
    run_expect_ok(2, child_mismatch, &a, 20.0);
}

/* ---- symmetric memory ---------------------------------------------------- */

/* In place on symmetric memory: bit-identical to the reference (and so to
 * the staged path, which test_world_* check against the same reference),
 * blocking and overlapped, at an offset, every reduced dtype; then
 * reduce_scatter out of it and all_gather into it, plain and in place;
 * counted under the caller's tag; freed once. */
static int child_sym(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    const uint64_t n = (1u << 20) + 77, off = 1000; /* elements of f32 */
    unsigned char *m = NULL;
    CHILD_OK(g_ops->sym_alloc(c, (n + off) * 4 * 2, DT_TAG_GRADS, (void **)&m));
    /* counted as asked; the mapping is whole pages, zeroed */
    const uint64_t asked = (n + off) * 4 * 2, bytes = (asked + 4095) / 4096 * 4096;
    CHILD_CHECK(th.mem.current[DT_TAG_GRADS] == asked, "accounted %llu bytes, want %llu",
                (unsigned long long)th.mem.current[DT_TAG_GRADS], (unsigned long long)asked);
    for (uint64_t i = 0; i < bytes; i++)
        CHILD_CHECK(m[i] == 0, "byte %llu of fresh symmetric memory is %d",
                    (unsigned long long)i, m[i]);
    static const int ops[] = {DT_OP_SUM, DT_OP_AVG, DT_OP_MAX};
    static const int dts[] = {DT_F32, DT_BF16, DT_F16};
    for (size_t o = 0; o < 3; o++)
        for (size_t d = 0; d < 3; d++) {
            uint32_t salt = (uint32_t)(90 + o * 4 + d);
            fill(m + off * 4, dts[d], rank, n, salt);
            CHILD_OK(g_ops->all_reduce(c, m + off * 4, m + off * 4, n, dts[d], ops[o], NULL,
                                       NULL));
            if (check_reduced(m + off * 4, dts[d], ops[o], N, n, 0, salt, "symmetric"))
                return 1;
        }
    /* two halves in flight at once, then a staged one beside them */
    float *plain = malloc(4096 * 4);
    CHILD_CHECK(plain, "out of memory");
    const uint64_t h = n / 2;
    fill(m, DT_F32, rank, h, 120);
    fill(m + h * 4, DT_F32, rank, n - h, 121);
    fill(plain, DT_F32, rank, 4096, 122);
    dt_comm_req_t *q1, *q2, *q3;
    CHILD_OK(g_ops->all_reduce(c, m, m, h, DT_F32, DT_OP_SUM, NULL, &q1));
    CHILD_OK(g_ops->all_reduce(c, m + h * 4, m + h * 4, n - h, DT_F32, DT_OP_SUM, NULL, &q2));
    CHILD_OK(g_ops->all_reduce(c, plain, plain, 4096, DT_F32, DT_OP_SUM, NULL, &q3));
    CHILD_OK(g_ops->wait(c, q2, -1));
    CHILD_OK(g_ops->wait(c, q1, -1));
    CHILD_OK(g_ops->wait(c, q3, -1));
    if (check_reduced(m, DT_F32, DT_OP_SUM, N, h, 0, 120, "first half") ||
        check_reduced(m + h * 4, DT_F32, DT_OP_SUM, N, n - h, 0, 121, "second half") ||
        check_reduced(plain, DT_F32, DT_OP_SUM, N, 4096, 0, 122, "staged beside"))
        return 1;
    /* reduce_scatter out of symmetric memory, into a plain buffer and in
     * place into this rank's own block */
    const uint64_t rcnt = 5003;
    fill(m, DT_F32, rank, rcnt * (uint64_t)N, 124);
    CHILD_OK(g_ops->reduce_scatter(c, m, plain, 4096, DT_F32, DT_OP_SUM, NULL,
                                   NULL));
    if (check_reduced(plain, DT_F32, DT_OP_SUM, N, 4096, (uint64_t)rank * 4096, 124,
                      "symmetric reduce_scatter"))
        return 1;
    fill(m, DT_F32, rank, rcnt * (uint64_t)N, 125);
    float *own = (float *)(void *)m + (uint64_t)rank * rcnt;
    CHILD_OK(g_ops->reduce_scatter(c, m, own, rcnt, DT_F32, DT_OP_AVG, NULL, NULL));
    if (check_reduced(own, DT_F32, DT_OP_AVG, N, rcnt, (uint64_t)rank * rcnt, 125,
                      "symmetric reduce_scatter in place"))
        return 1;
    /* all_gather into symmetric memory, from a plain buffer and in place */
    fill(plain, DT_F32, rank, 4096, 126);
    CHILD_OK(g_ops->all_gather(c, plain, m, 4096, DT_F32, NULL, NULL));
    for (int p = 0; p < N; p++)
        if (check_copy(m + (size_t)p * 4096 * 4, DT_F32, p, 4096, 0, 126,
                       "symmetric all_gather"))
            return 1;
    fill(own, DT_F32, rank, rcnt, 127);
    CHILD_OK(g_ops->all_gather(c, own, m, rcnt, DT_F32, NULL, NULL));
    for (int p = 0; p < N; p++)
        if (check_copy(m + (size_t)p * rcnt * 4, DT_F32, p, rcnt, 0, 127,
                       "symmetric all_gather in place"))
            return 1;
    /* out of place from symmetric memory is the staged path: still right */
    fill(m, DT_F32, rank, 4096, 123);
    CHILD_OK(g_ops->all_reduce(c, m, plain, 4096, DT_F32, DT_OP_SUM, NULL, NULL));
    if (check_reduced(plain, DT_F32, DT_OP_SUM, N, 4096, 0, 123, "out of place"))
        return 1;
    CHILD_OK(g_ops->sym_free(c, m));
    CHILD_CHECK(th.mem.current[DT_TAG_GRADS] == 0, "%llu bytes still accounted",
                (unsigned long long)th.mem.current[DT_TAG_GRADS]);
    int rc = g_ops->sym_free(c, m);
    CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(), "is not symmetric memory of "
                "this group (freed twice, or from another group)"), "second free: %s: %s",
                dt_status_name(rc), dt_last_error());
    /* one more, left for finalize to free */
    CHILD_OK(g_ops->sym_alloc(c, 100, DT_TAG_COMM, (void **)&m));
    g_ops->finalize(c);
    free(plain);
    return 0;
}

static void test_symmetric(void **state)
{
    (void)state;
    for (int N = 2; N <= 4; N++) {
        run_args_t a = {.timeout_ms = 10000, .kv = NULL};
        new_job(a.job, sizeof a.job, "sym");
        run_expect_ok(N, child_sym, &a, 60.0);
    }
}

/* Ranks that pass symmetric memory at different places, or only some of
 * them: refused like mismatched arguments, naming both places. */
static int child_sym_mismatch(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    float *m = NULL, plain[16] = {0};
    CHILD_OK(g_ops->sym_alloc(c, 4096, DT_TAG_GRADS, (void **)&m));
    float *mine = a->param == 0 ? (rank == 0 ? m : plain) : m + rank * 16;
    int rc = g_ops->all_reduce(c, mine, mine, 16, DT_F32, DT_OP_SUM, NULL, NULL);
    char want[256];
    if (a->param == 0)
        snprintf(want, sizeof want, "comm/shm: all_reduce #3 (f32, 64 bytes) on group world: "
                 "this rank's buffer is %s, rank %d's is %s; every rank must pass symmetric "
                 "memory at the same place of the same allocation, or none",
                 rank == 0 ? "at byte 0 of symmetric allocation #1" : "not in symmetric memory",
                 1 - rank,
                 rank == 0 ? "not in symmetric memory" : "at byte 0 of symmetric allocation #1");
    else
        snprintf(want, sizeof want, "this rank's buffer is at byte %d of symmetric allocation "
                 "#1, rank %d's is at byte %d of symmetric allocation #1", rank * 64, 1 - rank,
                 (1 - rank) * 64);
    CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(), want), "gave %s: %s",
                dt_status_name(rc), dt_last_error());
    g_ops->finalize(c);
    return 0;
}

static void test_symmetric_mismatch(void **state)
{
    (void)state;
    for (int v = 0; v <= 1; v++) {
        run_args_t a = {.timeout_ms = 3000, .kv = NULL, .param = v};
        new_job(a.job, sizeof a.job, "symmis");
        run_expect_ok(2, child_sym_mismatch, &a, 20.0);
    }
}

/* shm.symmetric = false: unsupported, nothing made.  A file planted under
 * rank 1's name that others may open: refused there, and rank 0 is told
 * which rank failed; the group goes on. */
static int child_sym_refused(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    void *m = (void *)1;
    int rc;
    if (a->param == 0) {
        rc = g_ops->sym_alloc(c, 4096, DT_TAG_GRADS, &m);
        CHILD_CHECK(rc == DT_ERR_UNSUPPORTED && m == NULL &&
                    strstr(dt_last_error(), "comm/shm: symmetric memory is off "
                           "(shm.symmetric = false)"), "gave %s: %s", dt_status_name(rc),
                    dt_last_error());
    } else {
        char path[256];
        snprintf(path, sizeof path, "/dev/shm/dtrain-%s-s1r1", a->job);
        if (rank == 0) {
            int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
            CHILD_CHECK(fd >= 0 && fchmod(fd, 0644) == 0, "planting %s: %s", path,
                        strerror(errno));
            close(fd);
        }
        CHILD_OK(g_ops->barrier(c, NULL));
        rc = g_ops->sym_alloc(c, 4096, DT_TAG_GRADS, &m);
        const char *want = rank == 1 ? "group or others may access it" :
            "comm/shm: symmetric allocation #1 (0.0 MiB) on group world: rank 1 could not "
            "make or map its part (its log says why)";
        CHILD_CHECK(rc == DT_ERR_DATA && m == NULL && strstr(dt_last_error(), want),
                    "gave %s: %s", dt_status_name(rc), dt_last_error());
        CHILD_CHECK(th.mem.current[DT_TAG_GRADS] == 0, "a failed allocation is accounted");
        if (rank == 1)
            unlink(path);
        /* the group still works, and the next allocation succeeds */
        CHILD_OK(g_ops->barrier(c, NULL));
        CHILD_OK(g_ops->sym_alloc(c, 4096, DT_TAG_GRADS, &m));
        CHILD_OK(g_ops->sym_free(c, m));
    }
    g_ops->finalize(c);
    return 0;
}

static void test_symmetric_refused(void **state)
{
    (void)state;
    static const dt_test_kv_t off[] = {{"symmetric", "false"}, {NULL, NULL}};
    run_args_t a = {.timeout_ms = 3000, .kv = off, .param = 0};
    new_job(a.job, sizeof a.job, "symoff");
    run_expect_ok(2, child_sym_refused, &a, 20.0);
    run_args_t b = {.timeout_ms = 3000, .kv = NULL, .param = 1};
    new_job(b.job, sizeof b.job, "symplant");
    run_expect_ok(2, child_sym_refused, &b, 20.0);
}

/* A rank killed inside an all_reduce on symmetric memory: the others fail
 * promptly naming it, as on the staged path. */
static int child_sym_killed(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    float *m = NULL;
    CHILD_OK(g_ops->sym_alloc(c, 1 << 20, DT_TAG_GRADS, (void **)&m));
    if (rank == 2)
        kill(getpid(), SIGKILL);
    double t0 = now_s();
    int rc = g_ops->all_reduce(c, m, m, 1 << 18, DT_F32, DT_OP_SUM, NULL, NULL);
    double dt = now_s() - t0;
    const char *msg = dt_last_error();
    CHILD_CHECK(rc == DT_ERR_REMOTE && strstr(msg, "comm/shm: all_reduce #3 (f32, 1048576 "
                "bytes) on group world: rank 2 (pid ") && strstr(msg, ") died"),
                "gave %s: %s", dt_status_name(rc), msg);
    CHILD_CHECK(dt < 2.5, "noticed the death after %.2f s (timeout 3 s)", dt);
    g_ops->finalize(c);
    return 0;
}

static void test_symmetric_rank_killed(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 3000, .kv = NULL};
    new_job(a.job, sizeof a.job, "symkill");
    dt_mp_result_t res;
    assert_int_equal(dt_mp_run(3, child_sym_killed, &a, 20.0, &res), 0);
    for (int r = 0; r < 3; r++) {
        char how[64];
        if (r == 2)
            assert_true(res.child[r].signaled && res.child[r].term_signal == SIGKILL);
        else if (!res.child[r].exited || res.child[r].exit_code != 0)
            fail_msg("rank %d: %s: %s", r, dt_mp_how(&res.child[r], how, sizeof how),
                     res.child[r].msg);
    }
    assert_int_equal(leftovers(a.job), 0);
}

/* A send and a recv of different sizes. */
static int child_p2p_size(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    float x[20] = {0};
    if (rank == 0) {
        CHILD_OK(g_ops->send(c, x, 10, DT_F32, 1, 3, NULL, NULL));
    } else {
        int rc = g_ops->recv(c, x, 20, DT_F32, 0, 3, NULL, NULL);
        CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(),
                    "comm/shm: recv #1 from rank 0 (tag 3, f32, 80 bytes) on group world: "
                    "rank 0 sent 40 bytes with tag 3"), "gave %s: %s", dt_status_name(rc),
                    dt_last_error());
    }
    g_ops->finalize(c);
    return 0;
}

static void test_p2p_size_mismatch(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 3000, .kv = NULL};
    new_job(a.job, sizeof a.job, "p2psize");
    run_expect_ok(2, child_p2p_size, &a, 20.0);
}

/* A segment left by a job whose process died mid-rendezvous does not stop
 * a new job with the same id. */
static int child_stale_ok(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    float x[64];
    fill(x, DT_F32, rank, 64, 5);
    CHILD_OK(g_ops->all_reduce(c, x, x, 64, DT_F32, DT_OP_SUM, NULL, NULL));
    if (check_reduced(x, DT_F32, DT_OP_SUM, N, 64, 0, 5, "after stale"))
        return 1;
    g_ops->finalize(c);
    return 0;
}

static void test_stale_segment(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 10000, .kv = NULL};
    new_job(a.job, sizeof a.job, "stale");
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s", a.job);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dt_test_host_t th;
        dt_comm_t *c;
        join(&a, 0, 2, &th, &c); /* waits for a rank 1 that never comes */
        _exit(0);
    }
    struct stat st;
    double t0 = now_s();
    while (stat(path, &st) != 0 && now_s() - t0 < 5.0) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(stat(path, &st), 0); /* the crash left it behind */
    run_expect_ok(2, child_stale_ok, &a, 20.0);
}

/* ---- what is found under the segment's name is trusted by no one ---------
 *
 * Job ids are predictable, so anybody can put a file where a job's segment
 * will be.  Each case plants one, runs both ranks of the victim job (rank
 * 0 creates segments, rank 1 joins them: both paths) and checks that each
 * is refused at once with the exact status and message, that the planted
 * file is left exactly as it was (nothing written into it, nothing of the
 * victim's beside it), and, in the sanitizer build, that nothing crashed
 * or leaked.  The planted segments are copies of a real one (made once by
 * template_image) whose creator is alive (this test), so that a victim
 * that did not check them would trust them rather than find them stale,
 * changed where each case says. */

#define PLANT_TIMEOUT_MS 10000 /* the victims' timeout: refusals take far less */
#define PROMPT_S 2.0           /* "at once": well under the 10 s timeout, with
                                * room for a loaded 2-core CI machine */

static unsigned char *g_image;  /* a real segment of a 2-rank group */
static size_t g_image_bytes;

static void seg_path_of(char *buf, size_t cap, const char *job)
{
    snprintf(buf, cap, "/dev/shm/dtrain-%s", job);
}

/* The segment rank 0 of a 2-rank group creates (slot_bytes 65536),
 * copied while rank 0 waits for a rank 1 that never comes; rank 0 is then
 * killed and the file removed. */
static const shm_hdr_t *template_image(void)
{
    if (g_image)
        return (const shm_hdr_t *)g_image;
    run_args_t a = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots};
    new_job(a.job, sizeof a.job, "tmpl");
    char path[256];
    seg_path_of(path, sizeof path, a.job);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dt_test_host_t th;
        dt_comm_t *c;
        join(&a, 0, 2, &th, &c);
        _exit(0);
    }
    unsigned char *img = NULL;
    size_t bytes = 0;
    for (double t0 = now_s(); !img && now_s() - t0 < 5.0;) {
        int fd = open(path, O_RDONLY);
        struct stat st;
        uint64_t magic = 0;
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(shm_hdr_t) &&
            pread(fd, &magic, sizeof magic, 0) == (ssize_t)sizeof magic && magic == SHM_MAGIC) {
            bytes = (size_t)st.st_size;
            img = malloc(bytes);
            assert_non_null(img);
            assert_int_equal(pread(fd, img, bytes, 0), (ssize_t)bytes);
        }
        if (fd >= 0)
            close(fd);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    unlink(path);
    assert_non_null(img);
    g_image = img;
    g_image_bytes = bytes;
    return (const shm_hdr_t *)g_image;
}

/* A copy of the template to change. */
static unsigned char *image_copy(void)
{
    template_image();
    unsigned char *p = malloc(g_image_bytes);
    assert_non_null(p);
    memcpy(p, g_image, g_image_bytes);
    return p;
}

/* A copy whose creator is alive (this process): not stale, so a victim
 * that did not check it would join it and trust its header. */
static unsigned char *live_image_copy(void)
{
    unsigned char *p = image_copy();
    shm_hdr_t *h = (shm_hdr_t *)p;
    atomic_store(&h->creator_pid, (int32_t)getpid());
    h->creator_start = 0; /* unknown: the pid alone says alive */
    return p;
}

/* Put `bytes` of `data` at the job's segment name, with `mode`, owned by
 * `owner`. */
static void plant_file(const char *job, const void *data, size_t bytes, mode_t mode,
                       uid_t owner)
{
    char path[256];
    seg_path_of(path, sizeof path, job);
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, bytes), (ssize_t)bytes);
    assert_int_equal(fchmod(fd, mode), 0);
    if (owner != geteuid())
        assert_int_equal(fchown(fd, owner, (gid_t)-1), 0);
    close(fd);
}

/* The planted file is still there, with that mode, owner and content. */
static void assert_untouched(const char *path, const void *data, size_t bytes, mode_t mode,
                             uid_t owner)
{
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 07777, mode);
    assert_int_equal(st.st_uid, owner);
    assert_int_equal((size_t)st.st_size, bytes);
    unsigned char *now = malloc(bytes + 1);
    assert_non_null(now);
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, now, bytes + 1, 0), (ssize_t)bytes);
    close(fd);
    assert_memory_equal(now, data, bytes);
    free(now);
}

/* "uid 0 (root)": how the plugin names an owner. */
static void owner_text(char *buf, size_t cap, uid_t uid)
{
    struct passwd *pw = getpwuid(uid);
    if (pw)
        snprintf(buf, cap, "uid %u (%s)", (unsigned)uid, pw->pw_name);
    else
        snprintf(buf, cap, "uid %u", (unsigned)uid);
}

typedef struct refuse_args {
    run_args_t run;
    int status;       /* expected of init */
    char want[2048];  /* expected message, exactly */
} refuse_args_t;

/* "comm/shm: rendezvous for job 'J': /dev/shm/dtrain-J (owner ..., mode
 * 0MMM): " followed by the formatted text. */
static void want_refusal(refuse_args_t *ra, uid_t owner, mode_t mode, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void want_refusal(refuse_args_t *ra, uid_t owner, mode_t mode, const char *fmt, ...)
{
    char who[320], text[1024], path[256];
    owner_text(who, sizeof who, owner);
    seg_path_of(path, sizeof path, ra->run.job);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    snprintf(ra->want, sizeof ra->want, "comm/shm: rendezvous for job '%s': %s (owner %s, "
             "mode %04o): %s", ra->run.job, path, who, (unsigned)mode, text);
}

/* Both ranks are refused with ra's status and message, at once. */
static int child_refused(int rank, int N, void *arg)
{
    const refuse_args_t *ra = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    double t0 = now_s();
    int rc = join(&ra->run, rank, N, &th, &c);
    double dt = now_s() - t0;
    CHILD_CHECK(rc == ra->status && c == NULL, "init gave %s (want %s): %s",
                dt_status_name(rc), dt_status_name(ra->status), dt_last_error());
    CHILD_CHECK(strcmp(dt_last_error(), ra->want) == 0, "message\n  got:  %s\n  want: %s",
                dt_last_error(), ra->want);
    CHILD_CHECK(dt < PROMPT_S, "refused after %.2f s (timeout %.1f s)", dt,
                (double)ra->run.timeout_ms / 1000.0);
    return 0;
}

/* Run both ranks of ra's job against what was planted at its name. */
static void run_refused(refuse_args_t *ra)
{
    dt_mp_result_t res;
    assert_int_equal(dt_mp_run(2, child_refused, ra, 20.0, &res), 0);
    char why[8192];
    if (!dt_mp_all_ok(&res, why, sizeof why))
        fail_msg("%s", why);
}

/* A copy of a real segment, owned by another user (nobody, 65534). */
static void test_planted_foreign_owner(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "test_planted_foreign_owner: not root: cannot plant a file of "
                        "another user; not checked\n");
        return;
    }
    refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                        .status = DT_ERR_DATA};
    new_job(ra.run.job, sizeof ra.run.job, "owner");
    unsigned char *img = live_image_copy();
    plant_file(ra.run.job, img, g_image_bytes, 0600, 65534);
    want_refusal(&ra, 65534, 0600, "owned by another user, not by this one (uid 0); "
                 "refusing to join a segment someone else created (its owner or root can "
                 "remove it; or use another job id)");
    run_refused(&ra);
    char path[256];
    seg_path_of(path, sizeof path, ra.run.job);
    assert_untouched(path, img, g_image_bytes, 0600, 65534);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(leftovers(ra.run.job), 0);
    free(img);
}

/* A copy of a real segment of ours that others may read (0644) or write
 * (0606). */
static void test_planted_open_mode(void **state)
{
    (void)state;
    static const mode_t modes[] = {0644, 0606, 0660};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                            .status = DT_ERR_DATA};
        new_job(ra.run.job, sizeof ra.run.job, "mode");
        char path[256];
        seg_path_of(path, sizeof path, ra.run.job);
        unsigned char *img = live_image_copy();
        plant_file(ra.run.job, img, g_image_bytes, modes[i], geteuid());
        want_refusal(&ra, geteuid(), modes[i], "group or others may access it (shm creates "
                     "segments with mode 0600); refusing it (remove it: rm %s)", path);
        run_refused(&ra);
        assert_untouched(path, img, g_image_bytes, modes[i], geteuid());
        assert_int_equal(unlink(path), 0);
        assert_int_equal(leftovers(ra.run.job), 0);
        free(img);
    }
}

/* A symlink at the name, to a copy of a real segment elsewhere. */
static void test_planted_symlink(void **state)
{
    (void)state;
    refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                        .status = DT_ERR_DATA};
    new_job(ra.run.job, sizeof ra.run.job, "link");
    char path[256], target[256];
    seg_path_of(path, sizeof path, ra.run.job);
    snprintf(target, sizeof target, "/tmp/%s-target", ra.run.job);
    unsigned char *img = live_image_copy();
    int fd = open(target, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, img, g_image_bytes), (ssize_t)g_image_bytes);
    close(fd);
    assert_int_equal(symlink(target, path), 0);
    struct stat lst;
    assert_int_equal(lstat(path, &lst), 0);
    want_refusal(&ra, geteuid(), lst.st_mode & 07777, "a symbolic link where the group's "
                 "segment should be (shm never creates one); refusing to follow it (remove "
                 "it: rm %s)", path);
    run_refused(&ra);
    assert_int_equal(lstat(path, &lst), 0);
    assert_true(S_ISLNK(lst.st_mode)); /* the link is left, and not followed: */
    assert_untouched(target, img, g_image_bytes, 0600, geteuid());
    assert_int_equal(unlink(path), 0);
    assert_int_equal(leftovers(ra.run.job), 0);
    unlink(target);
    free(img);
}

/* A second name (hard link) of another file of ours: of another job's
 * segment, say.  /tmp may be another file system, so the file is in
 * /dev/shm under a name no job uses. */
static void test_planted_hard_link(void **state)
{
    (void)state;
    refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                        .status = DT_ERR_DATA};
    new_job(ra.run.job, sizeof ra.run.job, "hard");
    char path[256], other[256];
    seg_path_of(path, sizeof path, ra.run.job);
    snprintf(other, sizeof other, "/dev/shm/%s-other", ra.run.job);
    unsigned char *img = live_image_copy();
    int fd = open(other, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, img, g_image_bytes), (ssize_t)g_image_bytes);
    close(fd);
    assert_int_equal(link(other, path), 0);
    want_refusal(&ra, geteuid(), 0600, "has 2 names (hard links) where a segment has one; "
                 "refusing it (remove this one: rm %s)", path);
    run_refused(&ra);
    assert_untouched(other, img, g_image_bytes, 0600, geteuid());
    assert_int_equal(unlink(path), 0);
    assert_int_equal(leftovers(ra.run.job), 0);
    unlink(other);
    free(img);
}

/* How a case changes the template's header (h) and what is refused. */
typedef struct corruption {
    const char *name;
    void (*apply)(shm_hdr_t *h);
    int status;
    const char *expect; /* printf format of the text; see want_corrupt */
} corruption_t;

static void c_off_ranks_far(shm_hdr_t *h) { h->off_ranks = 0xfffffffffffff000ull; }
static void c_off_p2p_end(shm_hdr_t *h) { h->off_p2p = h->total; }
static void c_total_double(shm_hdr_t *h) { h->total *= 2; }
static void c_chunk_overflow(shm_hdr_t *h) { h->chunk = 1ull << 62; }
static void c_chunk_zero(shm_hdr_t *h) { h->chunk = 0; }
static void c_p2p_overflow(shm_hdr_t *h) { h->p2p_chunk = 0xfffffffffffff000ull; }
static void c_size_huge(shm_hdr_t *h) { h->size = INT32_MAX; }
static void c_nbuf(shm_hdr_t *h) { h->nbuf = 0xffffffffu; }
static void c_attached(shm_hdr_t *h) { atomic_store(&h->attached, 0xffffffffu); }
static void c_version(shm_hdr_t *h) { h->version = 99; }
static void c_creator(shm_hdr_t *h) { atomic_store(&h->creator_pid, 0); }
/* consistent with itself, for 32 KiB chunks: larger than the file */
static void c_bigger_than_file(shm_hdr_t *h)
{
    uint64_t p2p_bytes = h->total - h->off_p2p;
    h->chunk = 32768;
    h->off_p2p = h->off_slots + 2ull * SHM_NBUF * h->chunk;
    h->total = h->off_p2p + p2p_bytes;
}

/* The expected text: the template's values go in by name. */
static void want_corrupt(refuse_args_t *ra, const corruption_t *k, const shm_hdr_t *t,
                         const shm_hdr_t *h)
{
    char path[256], detail[512];
    seg_path_of(path, sizeof path, ra->run.job);
    const unsigned long long T = t->total;
    if (k->apply == c_off_ranks_far)
        snprintf(detail, sizeof detail, "off_ranks 18446744073709547520, expected %llu for 2 "
                 "ranks with 16384- and 262144-byte buffers", (unsigned long long)t->off_ranks);
    else if (k->apply == c_off_p2p_end)
        snprintf(detail, sizeof detail, "off_p2p %llu, expected %llu for 2 ranks with 16384- "
                 "and 262144-byte buffers", T, (unsigned long long)t->off_p2p);
    else if (k->apply == c_total_double)
        snprintf(detail, sizeof detail, "total %llu, expected %llu for 2 ranks with 16384- "
                 "and 262144-byte buffers", 2 * T, T);
    else if (k->apply == c_chunk_overflow)
        snprintf(detail, sizeof detail, "chunk 4611686018427387904 bytes, expected a multiple "
                 "of 4096 in [4096, 268435456]");
    else if (k->apply == c_chunk_zero)
        snprintf(detail, sizeof detail, "chunk 0 bytes, expected a multiple of 4096 in "
                 "[4096, 268435456]");
    else if (k->apply == c_p2p_overflow)
        snprintf(detail, sizeof detail, "p2p_chunk 18446744073709547520 bytes, expected a "
                 "multiple of 4096 in [16384, 262144]");
    else if (k->apply == c_nbuf)
        snprintf(detail, sizeof detail, "4294967295 pipeline and 4 channel buffers, expected "
                 "4 and 4");
    else if (k->apply == c_attached)
        snprintf(detail, sizeof detail, "4294967295 ranks attached and 0 detached of 2");
    else if (k->apply == c_creator)
        snprintf(detail, sizeof detail, "creator pid 0");
    else if (k->apply == c_bigger_than_file)
        snprintf(detail, sizeof detail, "it describes %llu bytes, the file has %llu",
                 (unsigned long long)h->total, T);
    else
        detail[0] = '\0';
    if (k->status == DT_ERR_DATA) {
        want_refusal(ra, geteuid(), 0600, "corrupt segment header: %s; refusing it (remove "
                     "it: rm %s)", detail, path);
    } else if (k->apply == c_size_huge) {
        snprintf(ra->want, sizeof ra->want, "comm/shm: rendezvous for job '%s': /dtrain-%s "
                 "was created for 2147483647 ranks by pid %d, but this rank was told the "
                 "group has 2 (is the job id used twice?)", ra->run.job, ra->run.job,
                 (int)h->creator_pid);
    } else { /* c_version */
        snprintf(ra->want, sizeof ra->want, "comm/shm: rendezvous for job '%s': /dtrain-%s "
                 "was created by pid %d with layout version 99 of the shm plugin; this "
                 "rank's plugin has version %u (ranks of one job must load the same "
                 "dtrain_shm)", ra->run.job, ra->run.job, (int)h->creator_pid, SHM_VERSION);
    }
}

/* Header fields that put parts of the segment outside the file, sizes
 * whose products overflow, counts out of range: each refused. */
static void test_planted_corrupt_header(void **state)
{
    (void)state;
    static const corruption_t cases[] = {
        {"offset far outside", c_off_ranks_far, DT_ERR_DATA, NULL},
        {"offset at the end", c_off_p2p_end, DT_ERR_DATA, NULL},
        {"total beyond the file", c_total_double, DT_ERR_DATA, NULL},
        {"chunk overflowing", c_chunk_overflow, DT_ERR_DATA, NULL},
        {"chunk zero", c_chunk_zero, DT_ERR_DATA, NULL},
        {"p2p chunk overflowing", c_p2p_overflow, DT_ERR_DATA, NULL},
        {"self-consistent, larger than the file", c_bigger_than_file, DT_ERR_DATA, NULL},
        {"buffer count", c_nbuf, DT_ERR_DATA, NULL},
        {"attach counter", c_attached, DT_ERR_DATA, NULL},
        {"no creator", c_creator, DT_ERR_DATA, NULL},
        {"group size", c_size_huge, DT_ERR_INVALID, NULL},
        {"layout version", c_version, DT_ERR_INVALID, NULL},
    };
    const shm_hdr_t *t = template_image();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                            .status = cases[i].status};
        new_job(ra.run.job, sizeof ra.run.job, "hdr");
        unsigned char *img = live_image_copy();
        cases[i].apply((shm_hdr_t *)img);
        want_corrupt(&ra, &cases[i], t, (const shm_hdr_t *)img);
        plant_file(ra.run.job, img, g_image_bytes, 0600, geteuid());
        fprintf(stderr, "case: %s\n", cases[i].name);
        run_refused(&ra);
        char path[256];
        seg_path_of(path, sizeof path, ra.run.job);
        assert_untouched(path, img, g_image_bytes, 0600, geteuid());
        assert_int_equal(unlink(path), 0);
        assert_int_equal(leftovers(ra.run.job), 0);
        free(img);
    }
}

/* The unchanged template, planted: valid, its creator dead, so the
 * victims find it stale, replace it and run (the control for the cases
 * above: what they refuse is only what each changed). */
static void test_planted_valid_stale(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots};
    new_job(a.job, sizeof a.job, "valid");
    template_image();
    plant_file(a.job, g_image, g_image_bytes, 0600, geteuid());
    run_expect_ok(2, child_stale_ok, &a, 20.0);
}

/* Zero-filled, garbage, empty, shorter than a header, cut short: files a
 * creator that died would leave, or anybody could plant.  Never waited on. */
static void test_planted_garbage(void **state)
{
    (void)state;
    const shm_hdr_t *t = template_image();
    const size_t hdr = sizeof(shm_hdr_t);
    for (int k = 0; k < 5; k++) {
        refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                            .status = DT_ERR_DATA};
        new_job(ra.run.job, sizeof ra.run.job, "junk");
        char path[256];
        seg_path_of(path, sizeof path, ra.run.job);
        unsigned char *img = live_image_copy();
        size_t bytes = g_image_bytes;
        uint64_t magic = 0;
        if (k == 0) {
            memset(img, 0, bytes); /* zero-filled, full size */
        } else if (k == 1) {
            memset(img, 0xa5, bytes); /* garbage */
            magic = 0xa5a5a5a5a5a5a5a5ull;
        } else if (k == 2) {
            bytes = 0; /* empty */
        } else if (k == 3) {
            bytes = 100; /* a piece of a header */
        } else {
            bytes = g_image_bytes / 2; /* a complete header, half the segment */
        }
        plant_file(ra.run.job, img, bytes, 0600, geteuid());
        if (k <= 1)
            want_refusal(&ra, geteuid(), 0600, "not a dtrain shm segment (magic 0x%016llx, "
                         "expected 0x%016llx): zero-filled or garbage, and nobody is still "
                         "writing it (a segment gets its name only once complete); remove "
                         "it: rm %s", (unsigned long long)magic,
                         (unsigned long long)SHM_MAGIC, path);
        else if (k <= 3)
            want_refusal(&ra, geteuid(), 0600, "%zu bytes, too small for a segment header "
                         "(%zu bytes): truncated, or not a segment (remove it: rm %s)",
                         bytes, hdr, path);
        else
            want_refusal(&ra, geteuid(), 0600, "corrupt segment header: it describes %llu "
                         "bytes, the file has %zu; refusing it (remove it: rm %s)",
                         (unsigned long long)t->total, bytes, path);
        run_refused(&ra);
        assert_untouched(path, img, bytes, 0600, geteuid());
        assert_int_equal(unlink(path), 0);
        assert_int_equal(leftovers(ra.run.job), 0);
        free(img);
    }
}

/* A valid segment whose creator's pid now belongs to another running
 * process (here: this test's own) is stale: its creator's start time
 * tells them apart.  The victims replace it rather than join it. */
static void test_creator_pid_reused(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots};
    new_job(a.job, sizeof a.job, "reuse");
    unsigned char *img = image_copy();
    shm_hdr_t *h = (shm_hdr_t *)img;
    atomic_store(&h->creator_pid, (int32_t)getpid());
    h->creator_start = 1; /* nothing running now started 10 ms after boot */
    atomic_store(&h->attached, 0);
    shm_rank_t *ranks = (shm_rank_t *)(img + h->off_ranks);
    memset(ranks, 0, 2 * sizeof *ranks); /* nobody claimed a slot */
    plant_file(a.job, img, g_image_bytes, 0600, geteuid());
    char path[256];
    seg_path_of(path, sizeof path, a.job);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    const shm_hdr_t *planted = mmap(NULL, g_image_bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(planted != MAP_FAILED);
    run_expect_ok(2, child_stale_ok, &a, 20.0);
    assert_int_equal(atomic_load(&planted->attached), 0); /* nobody joined it */
    assert_int_equal(atomic_load(&planted->stale), 1);
    munmap((void *)planted, g_image_bytes);
    free(img);
}

/* ---- the job secret -------------------------------------------------------- */

/* Shared by the processes of one test (MAP_SHARED, made before forking). */
typedef struct secret_board {
    _Atomic int creator_pid; /* rank 0's, once it starts */
    _Atomic int refused;     /* outsiders done */
} secret_board_t;

typedef struct secret_args {
    run_args_t run;
    secret_board_t *board;
    const char *outsider_secret[2]; /* the outsiders', NULL: none */
    int outsiders;
} secret_args_t;

static int wait_for(_Atomic int *word, int value, double limit_s)
{
    for (double t0 = now_s(); atomic_load(word) < value;) {
        if (now_s() - t0 > limit_s)
            return -1;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

/* An outsider knows the job id, not its secret: refused at once, naming the
 * file and never the secret; the file holds no secret either. */
static int outsider(const secret_args_t *sa, int k)
{
    run_args_t a = sa->run;
    a.secret = sa->outsider_secret[k];
    CHILD_CHECK(wait_for(&sa->board->creator_pid, 1, 10.0) == 0, "rank 0 never started");
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    double t0 = now_s();
    int rc = join(&a, 1, 2, &th, &c);
    double dt = now_s() - t0;
    char path[256], who[320], want[2048];
    seg_path_of(path, sizeof path, a.job);
    owner_text(who, sizeof who, geteuid());
    const char *text;
    if (!a.secret)
        text = "with a job secret, but this rank has none (pass every rank the job's "
               "secret, DTRAIN_JOB_SECRET)";
    else if (!sa->run.secret)
        text = "without a job secret, but this rank has one: it is not this job's segment "
               "(another job uses this job id, or a rank was started without the job's "
               "secret)";
    else
        text = "with another job secret than this rank's: it is not this job's segment "
               "(another job uses this job id, or this rank was given another job's secret)";
    snprintf(want, sizeof want, "comm/shm: rendezvous for job '%s': %s (owner %s, mode "
             "0600): created by pid %d %s", a.job, path, who,
             atomic_load(&sa->board->creator_pid), text);
    CHILD_CHECK(rc == DT_ERR_DATA && c == NULL, "outsider %d: init gave %s: %s", k,
                dt_status_name(rc), dt_last_error());
    CHILD_CHECK(strcmp(dt_last_error(), want) == 0, "outsider %d: message\n  got:  %s\n  "
                "want: %s", k, dt_last_error(), want);
    CHILD_CHECK(dt < PROMPT_S, "outsider %d refused after %.2f s", k, dt);
    for (int s = 0; s < 2; s++) {
        const char *secret = s ? a.secret : sa->run.secret;
        CHILD_CHECK(!secret || !strstr(dt_last_error(), secret), "the message shows a secret");
    }
    /* the segment stores no secret, only a tag (of the creator's, if any) */
    int fd = open(path, O_RDONLY);
    CHILD_CHECK(fd >= 0, "the victim's segment is gone: %s", strerror(errno));
    shm_hdr_t h;
    CHILD_CHECK(pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h, "short read");
    struct stat st;
    fstat(fd, &st);
    char *all = malloc((size_t)st.st_size);
    CHILD_CHECK(all && pread(fd, all, (size_t)st.st_size, 0) == st.st_size, "read");
    close(fd);
    if (sa->run.secret) {
        CHILD_CHECK(!memmem(all, (size_t)st.st_size, sa->run.secret, strlen(sa->run.secret)),
                    "the segment holds the job secret");
        uint8_t zero[SHM_SHA256_BYTES] = {0};
        CHILD_CHECK(h.secret == SHM_SECRET_HMAC_SHA256 && memcmp(h.tag, zero, sizeof zero),
                    "no tag in the segment");
    }
    free(all);
    atomic_fetch_add(&sa->board->refused, 1);
    return 0;
}

/* Rank 0 (the job's secret) creates; the outsiders try as rank 1 and are
 * refused; then the real rank 1 (the same secret) joins and they add. */
static int child_secret(int proc, int nproc, void *arg)
{
    const secret_args_t *sa = arg;
    if (proc > 0 && proc < nproc - 1)
        return outsider(sa, proc - 1);
    int rank = proc == 0 ? 0 : 1;
    if (rank == 0)
        atomic_store(&sa->board->creator_pid, (int)getpid());
    else
        CHILD_CHECK(wait_for(&sa->board->refused, sa->outsiders, 10.0) == 0,
                    "the outsiders never finished");
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(&sa->run, rank, 2, &th, &c));
    float x[64];
    fill(x, DT_F32, rank, 64, 9);
    CHILD_OK(g_ops->all_reduce(c, x, x, 64, DT_F32, DT_OP_SUM, NULL, NULL));
    if (check_reduced(x, DT_F32, DT_OP_SUM, 2, 64, 0, 9, "with a secret"))
        return 1;
    g_ops->finalize(c);
    return 0;
}

static void run_secret_case(const char *job_secret, const char *o0, const char *o1,
                            int outsiders)
{
    secret_board_t *board = mmap(NULL, sizeof *board, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(board != MAP_FAILED);
    atomic_init(&board->creator_pid, 0);
    atomic_init(&board->refused, 0);
    secret_args_t sa = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots,
                                .secret = job_secret},
                        .board = board, .outsider_secret = {o0, o1},
                        .outsiders = outsiders};
    new_job(sa.run.job, sizeof sa.run.job, "secret");
    dt_mp_result_t res;
    assert_int_equal(dt_mp_run(2 + outsiders, child_secret, &sa, 30.0, &res), 0);
    char why[8192];
    if (!dt_mp_all_ok(&res, why, sizeof why))
        fail_msg("%s", why);
    assert_int_equal(leftovers(sa.run.job), 0);
    munmap(board, sizeof *board);
}

/* A job with a secret: a rank with another secret, or none, is refused;
 * ranks with the right one train together.  A job without one: a rank
 * with a secret is refused (it belongs to another job). */
static void test_job_secret(void **state)
{
    (void)state;
    run_secret_case("3b9f0c1e7d2a4f60a8c5e1d7b3f9a2c4", "guessed-or-another-jobs", NULL, 2);
    run_secret_case(NULL, "3b9f0c1e7d2a4f60a8c5e1d7b3f9a2c4", NULL, 1);
    /* and the right secret alone: no outsider */
    run_secret_case("s", NULL, NULL, 0);
}

/* SHA-256 (FIPS 180-4 examples) and HMAC-SHA256 (RFC 4231 cases 1, 2,
 * 6), through the plugin's own source (its functions are hidden in the
 * module). */
static void hex(char *out, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

static void test_secret_hash_vectors(void **state)
{
    (void)state;
    uint8_t d[SHM_SHA256_BYTES];
    char x[2 * SHM_SHA256_BYTES + 1];
    dt_sha256("abc", 3, d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    dt_sha256("", 0, d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    dt_sha256(two, strlen(two), d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *million = malloc(1000000);
    assert_non_null(million);
    memset(million, 'a', 1000000);
    dt_sha256(million, 1000000, d);
    free(million);
    hex(x, d, sizeof d);
    assert_string_equal(x, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");

    uint8_t key[131];
    memset(key, 0x0b, 20);
    dt_hmac_sha256(key, 20, "Hi There", 8, d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    const char *q = "what do ya want for nothing?";
    dt_hmac_sha256("Jefe", 4, q, strlen(q), d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(key, 0xaa, sizeof key);
    const char *big = "Test Using Larger Than Block-Size Key - Hash Key First";
    dt_hmac_sha256(key, sizeof key, big, strlen(big), d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");

    /* the tag: HMAC(SHA-256(secret), label NUL name NUL salt) */
    uint8_t k1[SHM_SHA256_BYTES], salt[SHM_SALT_BYTES], tag[SHM_SHA256_BYTES];
    uint8_t ref[SHM_SHA256_BYTES], msg[64];
    shm_secret_key("s3cret", k1);
    dt_sha256("s3cret", 6, d);
    assert_memory_equal(k1, d, sizeof d);
    for (int i = 0; i < SHM_SALT_BYTES; i++)
        salt[i] = (uint8_t)(i * 17 + 3);
    shm_secret_tag(k1, "/dtrain-j", salt, tag);
    memcpy(msg, "dtrain-shm-secret\0/dtrain-j\0", 28);
    memcpy(msg + 28, salt, sizeof salt);
    dt_hmac_sha256(k1, sizeof k1, msg, 28 + sizeof salt, ref);
    assert_memory_equal(tag, ref, sizeof ref);
    salt[0] ^= 1; /* another salt, another tag */
    shm_secret_tag(k1, "/dtrain-j", salt, ref);
    assert_false(dt_equal_ct(tag, ref, sizeof ref));
    assert_true(dt_equal_ct(tag, tag, sizeof tag));
}

/* ---- how segments are created ------------------------------------------- */

/* Rank 0 creates the segment 0600 even under umask 0777; a third process
 * looks at it before rank 1 joins (after that the name is gone). */
static int child_umask(int proc, int nproc, void *arg)
{
    (void)nproc;
    const secret_args_t *sa = arg;
    char path[256];
    seg_path_of(path, sizeof path, sa->run.job);
    if (proc == 2) {
        struct stat st;
        double t0 = now_s();
        while (lstat(path, &st) != 0) {
            CHILD_CHECK(now_s() - t0 < 10.0, "%s never appeared", path);
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        atomic_fetch_add(&sa->board->refused, 1);
        CHILD_CHECK(S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0600 &&
                    st.st_uid == geteuid(), "%s: mode %04o, uid %u", path,
                    (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        return 0;
    }
    if (proc == 0)
        umask(0777);
    else
        CHILD_CHECK(wait_for(&sa->board->refused, 1, 10.0) == 0, "never looked at");
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(&sa->run, proc, 2, &th, &c));
    CHILD_OK(g_ops->barrier(c, NULL));
    g_ops->finalize(c);
    return 0;
}

static void test_segment_mode_whatever_umask(void **state)
{
    (void)state;
    secret_board_t *board = mmap(NULL, sizeof *board, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(board != MAP_FAILED);
    atomic_init(&board->refused, 0);
    secret_args_t sa = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                        .board = board};
    new_job(sa.run.job, sizeof sa.run.job, "umask");
    dt_mp_result_t res;
    assert_int_equal(dt_mp_run(3, child_umask, &sa, 30.0, &res), 0);
    char why[8192];
    if (!dt_mp_all_ok(&res, why, sizeof why))
        fail_msg("%s", why);
    assert_int_equal(leftovers(sa.run.job), 0);
    munmap(board, sizeof *board);
}

/* Rank 0 creates the group's segment: without it, the others wait for it
 * by name, and time out saying so. */
static int child_no_rank0(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    if (rank == 0)
        return 0;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    double t0 = now_s();
    int rc = join(a, rank, N, &th, &c);
    double dt = now_s() - t0;
    char want[512];
    snprintf(want, sizeof want, "comm/shm: rendezvous for job '%s': timed out after 1.0 s "
             "waiting for rank 0 of 2, which creates /dev/shm/dtrain-%s", a->job, a->job);
    CHILD_CHECK(rc == DT_ERR_TIMEOUT && c == NULL, "init gave %s: %s", dt_status_name(rc),
                dt_last_error());
    CHILD_CHECK(strcmp(dt_last_error(), want) == 0, "message: %s", dt_last_error());
    CHILD_CHECK(dt >= 0.95 && dt < 3.0, "took %.2f s for a 1.0 s timeout", dt);
    return 0;
}

static void test_rendezvous_without_rank0(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 1000, .kv = NULL};
    new_job(a.job, sizeof a.job, "norank0");
    run_expect_ok(2, child_no_rank0, &a, 20.0);
}

/* ---- argument checks (one rank) ------------------------------------------ */

static int child_args(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    int rc;
    run_args_t bad = *a;
    snprintf(bad.job, sizeof bad.job, "a/b");
    rc = join(&bad, 0, 1, &th, &c);
    CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(), "comm/shm: init: job id 'a/b' must be"),
                "bad job id: %s: %s", dt_status_name(rc), dt_last_error());
    rc = join(a, 3, 2, &th, &c);
    CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(), "rank 3 is not in [0, 2)"),
                "bad rank: %s", dt_last_error());
    /* slot_bytes' range is declared once, in the key table, and checked by
     * the core (integration.config): the plugin repeats no check */
    bad = *a;
    bad.secret = "";
    rc = join(&bad, 0, 1, &th, &c);
    CHILD_CHECK(rc == DT_ERR_INVALID && strcmp(dt_last_error(), "comm/shm: init: "
                "job_secret is empty (NULL means none)") == 0,
                "empty secret: %s: %s", dt_status_name(rc), dt_last_error());

    CHILD_OK(join(a, 0, 1, &th, &c));
    float x[4] = {1, 2, 3, 4};
    int32_t iv[4] = {0};
    rc = g_ops->all_reduce(c, x, x, 4, 99, DT_OP_SUM, NULL, NULL);
    CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(), "unknown dtype 99"), "dtype: %s",
                dt_last_error());
    rc = g_ops->all_reduce(c, iv, iv, 4, DT_I32, DT_OP_AVG, NULL, NULL);
    CHILD_CHECK(rc == DT_ERR_UNSUPPORTED && strstr(dt_last_error(),
                "op avg is not defined for integer dtype i32"), "avg i32: %s", dt_last_error());
    rc = g_ops->all_reduce(c, x, x, 4, DT_F32, 9, NULL, NULL);
    CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(), "unknown reduction op 9"),
                "op: %s", dt_last_error());
    rc = g_ops->broadcast(c, x, 4, DT_F32, 5, NULL, NULL);
    CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(),
                "broadcast (f32, 16 bytes, root 5) on group world: root 5 is not a rank of "
                "the group [0, 1)"), "root: %s", dt_last_error());
    rc = g_ops->send(c, x, 4, DT_F32, -1, 0, NULL, NULL);
    CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(), "peer -1 is not a rank"),
                "peer: %s", dt_last_error());
    rc = g_ops->all_gather(c, NULL, x, 4, DT_F32, NULL, NULL);
    CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(), "send buffer is NULL"),
                "NULL: %s", dt_last_error());
    dt_comm_t *s = NULL;
    rc = g_ops->split(c, -5, 0, &s);
    CHILD_CHECK(rc == DT_ERR_INVALID && strstr(dt_last_error(), "color -5 must be >= 0"),
                "color: %s", dt_last_error());
    /* integer reductions are plain wrapping arithmetic at size 1: identity */
    int32_t big[2] = {INT32_MAX, -7};
    CHILD_OK(g_ops->all_reduce(c, big, iv, 2, DT_I32, DT_OP_SUM, NULL, NULL));
    CHILD_CHECK(iv[0] == INT32_MAX && iv[1] == -7, "i32 sum at size 1: %d %d", iv[0], iv[1]);
    /* a send to ourselves */
    float y[4] = {0};
    dt_comm_req_t *qs, *qr;
    CHILD_OK(g_ops->send(c, x, 4, DT_F32, 0, 1, NULL, &qs));
    CHILD_OK(g_ops->recv(c, y, 4, DT_F32, 0, 1, NULL, &qr));
    CHILD_OK(g_ops->wait(c, qr, 2000));
    CHILD_OK(g_ops->wait(c, qs, 2000));
    CHILD_CHECK(memcmp(x, y, sizeof x) == 0, "self send");
    /* test() until done, then a wait with limit 0 returns its status */
    dt_comm_req_t *qb;
    CHILD_OK(g_ops->barrier(c, &qb));
    int done = 0;
    for (double t0 = now_s(); !done && now_s() - t0 < 5.0;) {
        CHILD_OK(g_ops->test(c, qb, &done));
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    CHILD_CHECK(done == 1, "barrier of one rank never completed");
    CHILD_OK(g_ops->wait(c, qb, 0));
    g_ops->finalize(c);
    g_ops->finalize(NULL);
    return 0;
}

static void test_arguments(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 2000, .kv = NULL};
    new_job(a.job, sizeof a.job, "args");
    run_expect_ok(1, child_args, &a, 20.0);
}

static void test_plugin_info(void **state)
{
    (void)state;
    const dt_plugin_info_t *in = &g_ops->info;
    assert_int_equal(in->kind, DT_KIND_COMM);
    assert_int_equal(in->abi_major, DT_COMM_ABI_MAJOR);
    assert_int_equal(in->struct_size, sizeof(dt_comm_ops_v1_t));
    assert_string_equal(in->name, "shm");
    assert_int_equal(in->n_config_keys, 4);
    assert_string_equal(in->config_keys[0].name, "slot_bytes");
    assert_int_equal(in->config_keys[0].type, DT_CFG_INT);
    assert_string_equal(in->config_keys[1].name, "spin_us");
    assert_string_equal(in->config_keys[2].name, "symmetric");
    assert_int_equal(in->config_keys[2].type, DT_CFG_BOOL);
    assert_string_equal(in->config_keys[3].name, "nodes_share_memory");
    assert_int_equal(in->config_keys[3].type, DT_CFG_BOOL);
    assert_true(DT_HAS_OP(dt_comm_ops_v1_t, g_ops, test));
    assert_true(DT_HAS_OP(dt_comm_ops_v1_t, g_ops, sym_alloc));
    assert_true(DT_HAS_OP(dt_comm_ops_v1_t, g_ops, sym_free));
    /* only the entry symbol is exported */
    assert_null(dlsym(g_dl, "shm_reduce"));
    assert_null(dlsym(g_dl, "shm_ops"));
}

/* A job whose ranks span nodes (local_size < size) is refused before any
 * segment exists, unless shm.nodes_share_memory says the nodes share this
 * machine: then init goes on (and, with no peer here, times out). */
static void test_spans_nodes(void **state)
{
    (void)state;
    static const dt_test_kv_t share[] = {{"nodes_share_memory", "true"}, {NULL, NULL}};
    for (int k = 0; k < 2; k++) {
        dt_test_host_t th;
        dt_test_host_init(&th, "comm/shm", k ? share : NULL);
        char job[64];
        new_job(job, sizeof job, "nodes");
        dt_comm_init_v1_t ia = {.struct_size = sizeof ia, .rank = 0, .size = 4,
                                .local_rank = 0, .local_size = 2, .job_id = job,
                                .timeout_ms = 200};
        dt_comm_t *c = NULL;
        dt_err_clear();
        int rc = g_ops->init(&th.host, &ia, &c);
        if (k == 0) {
            assert_int_equal(rc, DT_ERR_CONFIG);
            assert_string_equal(dt_last_error(),
                                "comm/shm: init: the job spans several nodes (2 of its 4 ranks "
                                "on this one): shared memory reaches only the ranks of one "
                                "machine; pick a communicator that crosses nodes ([run] comm), "
                                "or set shm.nodes_share_memory = true if every node is on this "
                                "machine and shares its /dev/shm");
        } else {
            assert_int_equal(rc, DT_ERR_TIMEOUT);
        }
        assert_null(c);
        g_ops->cleanup_job(&th.host, job);
    }
}

static void test_segment_names(void **state)
{
    (void)state;
    /* Every segment of a job is named from /dtrain-<job id>: cleanup_job
     * finds a crashed job's by name. */
    char w[SHM_NAME_MAX + 16], s1[SHM_NAME_MAX + 16], s2[SHM_NAME_MAX + 16];
    assert_int_equal(shm_world_name(w, sizeof w, "j42"), 11);
    assert_string_equal(w, "/dtrain-j42");
    assert_true(shm_split_name(s1, sizeof s1, w, 1, 0) > 0);
    assert_string_equal(s1, "/dtrain-j42-g1c0");
    assert_true(shm_split_name(s2, sizeof s2, s1, 3, 12) > 0);
    assert_string_equal(s2, "/dtrain-j42-g1c0-g3c12");
    char small[12];
    assert_int_equal(shm_world_name(small, sizeof small, "j42x"), -1);
    /* what cleanup_job takes for job j42's: those names, nothing else */
    assert_true(shm_is_job_segment("dtrain-j42", "j42"));
    assert_true(shm_is_job_segment("dtrain-j42-g1c0", "j42"));
    assert_true(shm_is_job_segment("dtrain-j42-g1c0-g3c12", "j42"));
    assert_false(shm_is_job_segment("dtrain-j4", "j42"));
    assert_false(shm_is_job_segment("dtrain-j421", "j42"));     /* job j421 */
    assert_false(shm_is_job_segment("dtrain-j42-x", "j42"));    /* job j42-x */
    assert_false(shm_is_job_segment("dtrain-j42-g1", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-g1c", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-gc0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-g1c0x", "j42"));
    assert_false(shm_is_job_segment("xdtrain-j42", "j42"));
    /* symmetric memory: one "-s<no>r<rank>" at the end of a group's name */
    char sym[64];
    assert_int_equal(shm_sym_name(sym, sizeof sym, "/dtrain-j42-g1c0", 3, 1), 21);
    assert_string_equal(sym, "/dtrain-j42-g1c0-s3r1");
    assert_true(shm_is_job_segment(sym + 1, "j42"));
    assert_true(shm_is_job_segment("dtrain-j42-s1r0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-s1r0-g1c0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-s1r0-s2r0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-s1", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-s1r", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-s1c0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-g1r0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j421-s1r0", "j42"));
    assert_true(shm_valid_job_id("t-1_a.b"));
    assert_false(shm_valid_job_id(""));
    assert_false(shm_valid_job_id("a/b"));
    assert_false(shm_valid_job_id("../x"));
}

/* ---- cleanup_job ------------------------------------------------------- */

static void plant(const char *name, uid_t owner)
{
    char path[512];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    if (owner != geteuid())
        assert_int_equal(chown(path, owner, (gid_t)-1), 0);
}

static int shm_entry_exists(const char *name)
{
    char path[512];
    struct stat st;
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    return lstat(path, &st) == 0;
}

static void unlink_shm_entry(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    unlink(path);
}

static void test_cleanup_job(void **state)
{
    (void)state;
    assert_true(DT_HAS_OP(dt_comm_ops_v1_t, g_ops, cleanup_job));
    char job[128], mine[5][192], other[3][192], link[192], foreign[192], target[256];
    new_job(job, sizeof job, "clean");
    /* what a crash of job `job` can leave: the world and nested splits,
     * and ranks' symmetric memory of either */
    snprintf(mine[0], sizeof mine[0], "dtrain-%s", job);
    snprintf(mine[1], sizeof mine[1], "dtrain-%s-g1c0", job);
    snprintf(mine[2], sizeof mine[2], "dtrain-%s-g1c0-g2c1", job);
    snprintf(mine[3], sizeof mine[3], "dtrain-%s-s1r0", job);
    snprintf(mine[4], sizeof mine[4], "dtrain-%s-g1c0-s2r3", job);
    /* other jobs whose ids start with ours, and a name no split has */
    snprintf(other[0], sizeof other[0], "dtrain-%s7", job);
    snprintf(other[1], sizeof other[1], "dtrain-%s-x", job);
    snprintf(other[2], sizeof other[2], "dtrain-%s-g3", job);
    for (int i = 0; i < 5; i++)
        plant(mine[i], geteuid());
    for (int i = 0; i < 3; i++)
        plant(other[i], geteuid());
    /* a symlink under one of our names, pointing at a file of ours */
    snprintf(target, sizeof target, "/tmp/%s-target", job);
    int fd = open(target, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    snprintf(link, sizeof link, "dtrain-%s-g4c0", job);
    char link_path[512];
    snprintf(link_path, sizeof link_path, "/dev/shm/%s", link);
    assert_int_equal(symlink(target, link_path), 0);
    /* one of our names owned by another user (only root can plant it) */
    snprintf(foreign, sizeof foreign, "dtrain-%s-g5c0", job);
    int as_root = geteuid() == 0;
    if (as_root)
        plant(foreign, 65534);
    else
        fprintf(stderr, "test_cleanup_job: not root: the case of a file another user "
                        "owns is not checked\n");

    dt_test_host_t th;
    dt_test_host_init(&th, "comm/shm", NULL);
    assert_int_equal(g_ops->cleanup_job(&th.host, job), DT_OK);
    for (int i = 0; i < 5; i++)
        assert_false(shm_entry_exists(mine[i]));
    for (int i = 0; i < 3; i++)
        assert_true(shm_entry_exists(other[i]));
    struct stat st;
    assert_int_equal(lstat(link_path, &st), 0); /* the link itself is kept */
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(stat(target, &st), 0);     /* and was not followed */
    if (as_root)
        assert_true(shm_entry_exists(foreign));
    /* idempotent: nothing (of ours) left is DT_OK */
    assert_int_equal(g_ops->cleanup_job(&th.host, job), DT_OK);

    /* the job id is checked as init checks it */
    assert_int_equal(g_ops->cleanup_job(&th.host, "../x"), DT_ERR_INVALID);
    assert_string_equal(dt_last_error(), "comm/shm: cleanup_job: job id '../x' must be "
                        "1..96 letters, digits, '.', '_' or '-' (it names "
                        "/dev/shm/dtrain-<job id>)");
    assert_int_equal(g_ops->cleanup_job(&th.host, NULL), DT_ERR_INVALID);

    for (int i = 0; i < 3; i++)
        unlink_shm_entry(other[i]);
    unlink_shm_entry(link);
    unlink_shm_entry(foreign);
    unlink(target);
}

static int setup(void **state)
{
    (void)state;
    g_ops = dt_test_plugin_entry(PLUGIN_PATH, DT_ENTRY_STRING(comm, 1), &g_dl);
    if (!g_ops) {
        fprintf(stderr, "%s\n", dt_last_error());
        return -1;
    }
    dt_mp_set_leak_check(1);
    snprintf(g_job_prefix, sizeof g_job_prefix, "dtt%d", (int)getpid());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    free(g_image);
    if (g_dl)
        dlclose(g_dl);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plugin_info),
        cmocka_unit_test(test_segment_names),
        cmocka_unit_test(test_cleanup_job),
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_world_1),
        cmocka_unit_test(test_world_2),
        cmocka_unit_test(test_world_3),
        cmocka_unit_test(test_world_4),
        cmocka_unit_test(test_world_5),
        cmocka_unit_test(test_world_6),
        cmocka_unit_test(test_world_7),
        cmocka_unit_test(test_world_8),
        cmocka_unit_test(test_half_precision_patterns),
        cmocka_unit_test(test_large_64mib),
        cmocka_unit_test(test_split_grids),
        cmocka_unit_test(test_p2p_with_collectives),
        cmocka_unit_test(test_rank_killed),
        cmocka_unit_test(test_rendezvous_timeout),
        cmocka_unit_test(test_stalled_rank),
        cmocka_unit_test(test_wait_limit),
        cmocka_unit_test(test_abort),
        cmocka_unit_test(test_mismatched_collectives),
        cmocka_unit_test(test_p2p_size_mismatch),
        cmocka_unit_test(test_symmetric),
        cmocka_unit_test(test_symmetric_mismatch),
        cmocka_unit_test(test_symmetric_refused),
        cmocka_unit_test(test_symmetric_rank_killed),
        cmocka_unit_test(test_stale_segment),
        cmocka_unit_test(test_secret_hash_vectors),
        cmocka_unit_test(test_planted_foreign_owner),
        cmocka_unit_test(test_planted_open_mode),
        cmocka_unit_test(test_planted_symlink),
        cmocka_unit_test(test_planted_hard_link),
        cmocka_unit_test(test_planted_corrupt_header),
        cmocka_unit_test(test_planted_valid_stale),
        cmocka_unit_test(test_planted_garbage),
        cmocka_unit_test(test_creator_pid_reused),
        cmocka_unit_test(test_job_secret),
        cmocka_unit_test(test_spans_nodes),
        cmocka_unit_test(test_segment_mode_whatever_umask),
        cmocka_unit_test(test_rendezvous_without_rank0),
    };
    /* DT_TEST_FILTER=PATTERN (cmocka's * and ?) runs only the matching
     * cases: unit.test_shm_planted runs the planted-segment ones */
    const char *filter = getenv("DT_TEST_FILTER");
    if (filter)
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, setup, teardown);
}
