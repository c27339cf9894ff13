/*
 * tests/unit/plugins/shm/shm_symmetric.c - test_shm's symmetric memory:
 * buffers every rank maps, their collectives, a mismatched or refused
 * allocation and a rank killed while they are in use.
 */
#include "shm_test.h"

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

void test_symmetric(void **state)
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

void test_symmetric_mismatch(void **state)
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

void test_symmetric_refused(void **state)
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

void test_symmetric_rank_killed(void **state)
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
