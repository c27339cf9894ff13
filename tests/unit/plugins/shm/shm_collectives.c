/*
 * tests/unit/plugins/shm/shm_collectives.c - test_shm's collectives: the
 * battery (every collective, dtype and op at world sizes 1 to 8, bitwise
 * against the rank-order reference), every f16 and bf16 bit pattern, 64 MiB
 * through the slots, sub-groups split from the world, and point-to-point in
 * flight with collectives.
 */
#include "shm_test.h"

/* ---- the battery: every collective, dtype and op at one world size ---- */

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

void test_world_1(void **state) { (void)state; run_battery(1); }
void test_world_2(void **state) { (void)state; run_battery(2); }
void test_world_3(void **state) { (void)state; run_battery(3); }
void test_world_4(void **state) { (void)state; run_battery(4); }
void test_world_5(void **state) { (void)state; run_battery(5); }
void test_world_6(void **state) { (void)state; run_battery(6); }
void test_world_7(void **state) { (void)state; run_battery(7); }
void test_world_8(void **state) { (void)state; run_battery(8); }

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

void test_half_precision_patterns(void **state)
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

void test_large_64mib(void **state)
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

void test_split_grids(void **state)
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

void test_p2p_with_collectives(void **state)
{
    (void)state;
    for (int N = 2; N <= 4; N += 2) {
        run_args_t a = {.timeout_ms = 10000, .kv = N == 4 ? small_slots : NULL};
        new_job(a.job, sizeof a.job, "p2pmix");
        run_expect_ok(N, child_p2p_mix, &a, 40.0);
    }
}
