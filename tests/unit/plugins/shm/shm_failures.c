/*
 * tests/unit/plugins/shm/shm_failures.c - test_shm's failures: a rank killed
 * mid-collective, a rank that never arrives, one that stalls, the wait's
 * limit, abort with a reason, mismatched collectives and a send and recv of
 * different sizes; each with the exact status and message, how long it took,
 * and nothing left in /dev/shm.
 */
#include "shm_test.h"

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

void test_rank_killed(void **state)
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

void test_rendezvous_timeout(void **state)
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

void test_stalled_rank(void **state)
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

void test_wait_limit(void **state)
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

void test_abort(void **state)
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

void test_mismatched_collectives(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 3000, .kv = NULL};
    new_job(a.job, sizeof a.job, "mismatch");
    run_expect_ok(2, child_mismatch, &a, 20.0);
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

void test_p2p_size_mismatch(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 3000, .kv = NULL};
    new_job(a.job, sizeof a.job, "p2psize");
    run_expect_ok(2, child_p2p_size, &a, 20.0);
}
