/*
 * tests/unit/plugins/shm/shm_arguments.c - test_shm's one-rank checks: every
 * operation's argument refusals, the plugin's info, and a job spanning nodes.
 */
#include "shm_test.h"

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

void test_arguments(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 2000, .kv = NULL};
    new_job(a.job, sizeof a.job, "args");
    run_expect_ok(1, child_args, &a, 20.0);
}

void test_plugin_info(void **state)
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
void test_spans_nodes(void **state)
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
