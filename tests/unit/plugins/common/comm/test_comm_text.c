/*
 * tests/unit/plugins/common/comm/test_comm_text.c - plugins/common/comm/comm_text.h: how every
 * communicator names its operations and ranks, and the argument checks
 * every operation makes, checked against the exact texts the shm and mpi
 * communicators' own tests expect (tests/unit/plugins/shm/test_shm.c, test_mpi.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "common/comm/comm_text.h"
#include "test_host.h"
#include "util/error.h"

static const int32_t tp_wranks[4] = {2, 3, 6, 7}; /* a split of a world of 8 */

static const dt_comm_names_t world = {.gname = "world", .is_world = 1, .size = 4,
                                      .wranks = NULL};
static const dt_comm_names_t tp = {.gname = "tp", .is_world = 0, .size = 4,
                                   .wranks = tp_wranks};
/* a split group whose world ranks the communicator does not know (nccl) */
static const dt_comm_names_t anon = {.gname = "world/split 1 color 0", .is_world = 0,
                                     .size = 4, .wranks = NULL};

static void text_is(const dt_comm_names_t *g, dt_comm_op_desc_t d, const char *want)
{
    char buf[256];
    dt_comm_op_text(g, &d, buf, sizeof buf);
    assert_string_equal(buf, want);
}

static void test_every_kind(void **state)
{
    (void)state;
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_ALL_REDUCE, .seq = 3,
                                        .dtype = DT_F32, .op = DT_OP_SUM, .root = -1,
                                        .bytes = 4096},
            "all_reduce #3 (f32, 4096 bytes) on group world");
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_REDUCE_SCATTER, .seq = 4,
                                        .dtype = DT_F32, .op = DT_OP_AVG, .root = -1,
                                        .bytes = 1024},
            "reduce_scatter #4 (f32 avg, 1024 bytes per rank) on group world");
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_ALL_GATHER, .seq = 5,
                                        .dtype = DT_BF16, .op = -1, .root = -1,
                                        .bytes = 1024},
            "all_gather #5 (bf16, 1024 bytes per rank) on group world");
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_BROADCAST, .seq = 6,
                                        .dtype = DT_F32, .op = -1, .root = 0, .bytes = 40},
            "broadcast #6 (f32, 40 bytes, root 0) on group world");
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_REDUCE, .seq = 7,
                                        .dtype = DT_I64, .op = DT_OP_MAX, .root = 1,
                                        .bytes = 80},
            "reduce #7 (i64 max, 80 bytes, root 1) on group world");
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_BARRIER, .seq = 8,
                                        .dtype = DT_U8, .root = -1},
            "barrier #8 on group world");
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_SEND, .seq = 2, .dtype = DT_F32,
                                        .root = 1, .tag = 5, .bytes = 40},
            "send #2 to rank 1 (tag 5, f32, 40 bytes) on group world");
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_RECV, .seq = 2, .dtype = DT_F16,
                                        .root = 0, .tag = 0, .bytes = 2},
            "recv #2 from rank 0 (tag 0, f16, 2 bytes) on group world");
    /* min reduction, u16 */
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_REDUCE_SCATTER, .seq = 1,
                                        .dtype = DT_U16, .op = DT_OP_MIN, .bytes = 6},
            "reduce_scatter #1 (u16 min, 6 bytes per rank) on group world");
}

/* An operation refused before it is numbered has no "#n". */
static void test_unnumbered(void **state)
{
    (void)state;
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_ALL_REDUCE, .dtype = DT_F32,
                                        .op = DT_OP_SUM, .bytes = 16},
            "all_reduce (f32, 16 bytes) on group world");
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_BARRIER, .dtype = DT_U8},
            "barrier on group world");
    text_is(&tp, (dt_comm_op_desc_t){.kind = DT_COMM_OP_RECV, .dtype = DT_F32, .root = 2,
                                     .tag = 9, .bytes = 4},
            "recv from rank 2 (world rank 6) (tag 9, f32, 4 bytes) on group tp");
}

/* A kind or op read from a peer may hold anything: named "?", never a
 * crash; an unknown dtype is named as dt_dtype_name names it. */
static void test_unknown_names(void **state)
{
    (void)state;
    assert_string_equal(dt_comm_op_name(0), "?");
    assert_string_equal(dt_comm_op_name(DT_COMM_OP_KIND_END), "?");
    assert_string_equal(dt_comm_op_name(-7), "?");
    assert_string_equal(dt_comm_redop_name(4), "?");
    assert_string_equal(dt_comm_redop_name(-1), "?");
    assert_string_equal(dt_comm_op_name(DT_COMM_OP_RECV), "recv");
    assert_string_equal(dt_comm_redop_name(DT_OP_MIN), "min");
    text_is(&world, (dt_comm_op_desc_t){.kind = 99, .seq = 1, .dtype = DT_F32, .bytes = 4},
            "? #1 (f32, 4 bytes) on group world");
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_ALL_REDUCE, .seq = 1,
                                        .dtype = DT_F32, .op = 9, .bytes = 4},
            "all_reduce #1 (f32, 4 bytes) on group world");
    text_is(&world, (dt_comm_op_desc_t){.kind = DT_COMM_OP_REDUCE, .seq = 1,
                                        .dtype = DT_F32, .op = 9, .root = 0, .bytes = 4},
            "reduce #1 (f32 ?, 4 bytes, root 0) on group world");
}

static void test_rank_world_vs_split(void **state)
{
    (void)state;
    char buf[128];
    dt_comm_fmt_rank(&world, 3, buf, sizeof buf);
    assert_string_equal(buf, "rank 3");
    dt_comm_fmt_rank(&tp, 1, buf, sizeof buf);
    assert_string_equal(buf, "rank 1 (world rank 3)");
    dt_comm_fmt_rank(&tp, 3, buf, sizeof buf);
    assert_string_equal(buf, "rank 3 (world rank 7)");
    /* a bad peer argument being reported: never read past wranks */
    dt_comm_fmt_rank(&tp, 4, buf, sizeof buf);
    assert_string_equal(buf, "rank 4");
    dt_comm_fmt_rank(&tp, -2, buf, sizeof buf);
    assert_string_equal(buf, "rank -2");
    dt_comm_fmt_rank(&anon, 2, buf, sizeof buf);
    assert_string_equal(buf, "rank 2");
    text_is(&tp, (dt_comm_op_desc_t){.kind = DT_COMM_OP_SEND, .seq = 2, .dtype = DT_F32,
                                     .root = 1, .tag = 5, .bytes = 40},
            "send #2 to rank 1 (world rank 3) (tag 5, f32, 40 bytes) on group tp");
    text_is(&anon, (dt_comm_op_desc_t){.kind = DT_COMM_OP_SEND, .seq = 2, .dtype = DT_F32,
                                       .root = 1, .tag = 5, .bytes = 40},
            "send #2 to rank 1 (tag 5, f32, 40 bytes) on group world/split 1 color 0");
    /* a collective's text names no rank: the same on a split */
    text_is(&tp, (dt_comm_op_desc_t){.kind = DT_COMM_OP_BROADCAST, .seq = 1,
                                     .dtype = DT_F32, .root = 2, .bytes = 8},
            "broadcast #1 (f32, 8 bytes, root 2) on group tp");
}

static void test_rank_lists(void **state)
{
    (void)state;
    char buf[128];
    const int one[] = {2}, two[] = {0, 3};
    dt_comm_fmt_ranks(&world, one, 1, buf, sizeof buf);
    assert_string_equal(buf, "rank 2");
    dt_comm_fmt_ranks(&world, two, 2, buf, sizeof buf);
    assert_string_equal(buf, "ranks 0, 3");
    dt_comm_fmt_ranks(&tp, one, 1, buf, sizeof buf);
    assert_string_equal(buf, "rank 2 (world rank 6)");
    dt_comm_fmt_ranks(&tp, two, 2, buf, sizeof buf);
    assert_string_equal(buf, "ranks 0 (world rank 2), 3 (world rank 7)");
    dt_comm_fmt_ranks(&tp, two, 0, buf, sizeof buf);
    assert_string_equal(buf, "no rank (the condition was met meanwhile)");
    /* cut to the buffer, never past it */
    char small[12];
    dt_comm_fmt_ranks(&tp, two, 2, small, sizeof small);
    assert_string_equal(small, "ranks 0 (wo");
}

/* ---- argument checks: exact messages through the host ----------------- */

static dt_test_host_t th;

static int setup(void **state)
{
    (void)state;
    dt_test_host_init(&th, "comm/test", NULL);
    dt_err_clear();
    return 0;
}

static void fails_with(int got, int status, const char *want)
{
    assert_int_equal(got, status);
    assert_string_equal(dt_last_error(), want);
    dt_err_clear();
}

static void test_check_dtype_and_reduce(void **state)
{
    (void)state;
    const dt_host_v1_t *h = &th.host;
    dt_comm_op_desc_t d = {.kind = DT_COMM_OP_ALL_REDUCE, .dtype = 42, .op = DT_OP_SUM,
                           .root = -1, .bytes = 8};
    fails_with(dt_comm_check_dtype(h, &world, &d), DT_ERR_INVALID,
               "comm/test: all_reduce (unknown, 8 bytes) on group world: unknown dtype 42");
    d.dtype = DT_F32;
    assert_int_equal(dt_comm_check_dtype(h, &world, &d), DT_OK);
    d.op = 9;
    fails_with(dt_comm_check_reduce(h, &world, &d), DT_ERR_INVALID,
               "comm/test: all_reduce (f32, 8 bytes) on group world: unknown reduction "
               "op 9");
    d.op = DT_OP_AVG;
    assert_int_equal(dt_comm_check_reduce(h, &world, &d), DT_OK);
    d = (dt_comm_op_desc_t){.kind = DT_COMM_OP_REDUCE_SCATTER, .dtype = DT_I32,
                            .op = DT_OP_AVG, .bytes = 16};
    fails_with(dt_comm_check_reduce(h, &tp, &d), DT_ERR_UNSUPPORTED,
               "comm/test: reduce_scatter (i32 avg, 16 bytes per rank) on group tp: op avg "
               "is not defined for integer dtype i32");
    d.op = DT_OP_SUM;
    assert_int_equal(dt_comm_check_reduce(h, &tp, &d), DT_OK);
    /* kinds that do not reduce ignore op */
    d = (dt_comm_op_desc_t){.kind = DT_COMM_OP_ALL_GATHER, .dtype = DT_I32, .op = -1};
    assert_int_equal(dt_comm_check_reduce(h, &world, &d), DT_OK);
    d = (dt_comm_op_desc_t){.kind = DT_COMM_OP_REDUCE, .dtype = DT_U8, .op = -3, .root = 0};
    fails_with(dt_comm_check_reduce(h, &world, &d), DT_ERR_INVALID,
               "comm/test: reduce (u8 ?, 0 bytes, root 0) on group world: unknown "
               "reduction op -3");
}

static void test_check_ranks(void **state)
{
    (void)state;
    const dt_host_v1_t *h = &th.host;
    int x = 0;
    dt_comm_op_desc_t d = {.kind = DT_COMM_OP_BROADCAST, .dtype = DT_F32, .root = 5,
                           .bytes = 4};
    fails_with(dt_comm_check_args(h, &world, &d, 0, 1, &x, &x), DT_ERR_INVALID,
               "comm/test: broadcast (f32, 4 bytes, root 5) on group world: root 5 is not "
               "a rank of the group [0, 4)");
    d = (dt_comm_op_desc_t){.kind = DT_COMM_OP_REDUCE, .dtype = DT_F32, .op = DT_OP_SUM,
                            .root = -1, .bytes = 4};
    fails_with(dt_comm_check_args(h, &world, &d, 0, 1, &x, &x), DT_ERR_INVALID,
               "comm/test: reduce (f32 sum, 4 bytes, root -1) on group world: root -1 is "
               "not a rank of the group [0, 4)");
    d = (dt_comm_op_desc_t){.kind = DT_COMM_OP_SEND, .dtype = DT_F32, .root = 4, .tag = 1,
                            .bytes = 4};
    fails_with(dt_comm_check_args(h, &tp, &d, 0, 1, &x, NULL), DT_ERR_INVALID,
               "comm/test: send to rank 4 (tag 1, f32, 4 bytes) on group tp: peer 4 is not "
               "a rank of the group [0, 4)");
    d.kind = DT_COMM_OP_RECV;
    d.root = 3;
    assert_int_equal(dt_comm_check_args(h, &tp, &d, 0, 1, NULL, &x), DT_OK);
    /* collectives have no root to check */
    d = (dt_comm_op_desc_t){.kind = DT_COMM_OP_ALL_REDUCE, .dtype = DT_F32, .root = -1};
    assert_int_equal(dt_comm_check_args(h, &world, &d, 0, 1, &x, &x), DT_OK);
    d = (dt_comm_op_desc_t){.kind = DT_COMM_OP_BARRIER, .dtype = DT_U8, .root = -1};
    assert_int_equal(dt_comm_check_args(h, &world, &d, 0, 0, NULL, NULL), DT_OK);
}

static void test_check_buffers(void **state)
{
    (void)state;
    const dt_host_v1_t *h = &th.host;
    int x = 0;
    dt_comm_op_desc_t d = {.kind = DT_COMM_OP_ALL_REDUCE, .dtype = DT_F32, .op = DT_OP_SUM,
                           .root = -1, .bytes = 8};
    fails_with(dt_comm_check_args(h, &world, &d, 0, 2, NULL, &x), DT_ERR_INVALID,
               "comm/test: all_reduce (f32, 8 bytes) on group world: send buffer is NULL");
    fails_with(dt_comm_check_args(h, &world, &d, 0, 2, &x, NULL), DT_ERR_INVALID,
               "comm/test: all_reduce (f32, 8 bytes) on group world: recv buffer is NULL");
    /* count 0: NULL buffers are fine */
    d.bytes = 0;
    assert_int_equal(dt_comm_check_args(h, &world, &d, 0, 0, NULL, NULL), DT_OK);
    d = (dt_comm_op_desc_t){.kind = DT_COMM_OP_ALL_GATHER, .dtype = DT_F32, .root = -1,
                            .bytes = 4};
    fails_with(dt_comm_check_args(h, &world, &d, 0, 1, &x, NULL), DT_ERR_INVALID,
               "comm/test: all_gather (f32, 4 bytes per rank) on group world: recv buffer "
               "is NULL");
    d = (dt_comm_op_desc_t){.kind = DT_COMM_OP_BROADCAST, .dtype = DT_F32, .root = 1,
                            .bytes = 4};
    fails_with(dt_comm_check_args(h, &world, &d, 1, 1, NULL, NULL), DT_ERR_INVALID,
               "comm/test: broadcast (f32, 4 bytes, root 1) on group world: data buffer "
               "is NULL");
    /* reduce: recv only on the root */
    d = (dt_comm_op_desc_t){.kind = DT_COMM_OP_REDUCE, .dtype = DT_F32, .op = DT_OP_SUM,
                            .root = 1, .bytes = 4};
    assert_int_equal(dt_comm_check_args(h, &world, &d, 0, 1, &x, NULL), DT_OK);
    fails_with(dt_comm_check_args(h, &world, &d, 1, 1, &x, NULL), DT_ERR_INVALID,
               "comm/test: reduce (f32 sum, 4 bytes, root 1) on group world: recv buffer "
               "is NULL");
    d = (dt_comm_op_desc_t){.kind = DT_COMM_OP_SEND, .seq = 4, .dtype = DT_F32, .root = 2,
                            .tag = 3, .bytes = 4};
    fails_with(dt_comm_check_args(h, &tp, &d, 0, 1, NULL, &x), DT_ERR_INVALID,
               "comm/test: send #4 to rank 2 (world rank 6) (tag 3, f32, 4 bytes) on group "
               "tp: send buffer is NULL");
    d.kind = DT_COMM_OP_RECV;
    fails_with(dt_comm_check_args(h, &tp, &d, 0, 1, &x, NULL), DT_ERR_INVALID,
               "comm/test: recv #4 from rank 2 (world rank 6) (tag 3, f32, 4 bytes) on "
               "group tp: recv buffer is NULL");
}

static void test_op_fail(void **state)
{
    (void)state;
    dt_comm_op_desc_t d = {.kind = DT_COMM_OP_ALL_REDUCE, .seq = 17, .dtype = DT_F32,
                           .op = DT_OP_SUM, .root = -1, .bytes = 4194304};
    fails_with(dt_comm_op_fail(&th.host, &world, &d, DT_ERR_TIMEOUT,
                               "timed out after %.1f s waiting for %s", 1.0, "rank 1"),
               DT_ERR_TIMEOUT,
               "comm/test: all_reduce #17 (f32, 4194304 bytes) on group world: timed out "
               "after 1.0 s waiting for rank 1");
}

/* A device whose props say what the host-memory check reads. */
static int fake_visible;
static int fake_props_rc;
static int fake_props(dt_device_t *d, dt_device_props_v1_t *out)
{
    (void)d;
    snprintf(out->name, sizeof out->name, "%s", "fakegpu");
    out->host_visible = fake_visible;
    return fake_props_rc;
}

static void test_check_init(void **state)
{
    (void)state;
    const dt_host_v1_t *h = &th.host;
    dt_comm_t *out = (dt_comm_t *)&th; /* anything non-NULL: init clears it */
    dt_comm_init_v1_t in = {.struct_size = sizeof in, .rank = 1, .size = 2,
                            .timeout_ms = 1000},
                      a;
    assert_int_equal(dt_comm_check_init(NULL, &in, &out, &a), DT_ERR_INVALID);
    fails_with(dt_comm_check_init(h, &in, NULL, &a), DT_ERR_INVALID, "comm/test: init: NULL out");
    fails_with(dt_comm_check_init(h, NULL, &out, &a), DT_ERR_INVALID,
               "comm/test: init: NULL args");
    assert_int_equal(dt_comm_check_init(h, &in, &out, &a), DT_OK);
    assert_null(out);
    assert_int_equal(a.rank, 1);
    assert_int_equal(a.size, 2);
    assert_int_equal(a.timeout_ms, 1000);
    in.struct_size = 4; /* below minor 0: the growth rule's own message */
    assert_int_not_equal(dt_comm_check_init(h, &in, &out, &a), DT_OK);
    assert_non_null(strstr(dt_last_error(), "init args: struct_size 4"));
    dt_err_clear();
    in.struct_size = sizeof in;
    in.rank = 3;
    fails_with(dt_comm_check_init(h, &in, &out, &a), DT_ERR_INVALID,
               "comm/test: init: rank 3 is not in [0, 2)");
    in.rank = 0;
    in.size = 0;
    fails_with(dt_comm_check_init(h, &in, &out, &a), DT_ERR_INVALID,
               "comm/test: init: rank 0 is not in [0, 0)");
    in.size = 2;
    in.timeout_ms = 0;
    fails_with(dt_comm_check_init(h, &in, &out, &a), DT_ERR_INVALID,
               "comm/test: init: timeout_ms must be > 0 (got 0)");
}

static void test_check_host_memory(void **state)
{
    (void)state;
    const dt_host_v1_t *h = &th.host;
    dt_device_ops_v1_t ops = {.props = fake_props};
    struct {
        const dt_device_ops_v1_t *ops; /* a device starts with its table */
    } devobj = {&ops};
    dt_comm_init_v1_t a = {.struct_size = sizeof a,
                           .dev = (dt_device_t *)&devobj};
    fake_visible = 0;
    fake_props_rc = DT_OK;
    fails_with(dt_comm_check_host_memory(h, &a, "shm"), DT_ERR_UNSUPPORTED,
               "comm/test: device 'fakegpu' memory is not host memory; the shm communicator "
               "moves host memory only (use nccl on GPUs)");
    fake_visible = 1;
    assert_int_equal(dt_comm_check_host_memory(h, &a, "shm"), DT_OK);
    fake_visible = 0;
    fake_props_rc = DT_ERR_UNSUPPORTED; /* the device cannot say: let it through */
    assert_int_equal(dt_comm_check_host_memory(h, &a, "shm"), DT_OK);
    a.dev = NULL; /* no device */
    assert_int_equal(dt_comm_check_host_memory(h, &a, "shm"), DT_OK);
}

static void test_check_wait_test(void **state)
{
    (void)state;
    const dt_host_v1_t *h = &th.host;
    int x = 0, done = 0;
    dt_comm_req_t *req = (dt_comm_req_t *)&x;
    assert_int_equal(dt_comm_check_wait(NULL, req), DT_ERR_INVALID);
    assert_int_equal(dt_comm_check_test(NULL, req, &done), DT_ERR_INVALID);
    assert_int_equal(dt_comm_check_wait(h, req), DT_OK);
    assert_int_equal(dt_comm_check_test(h, req, &done), DT_OK);
    fails_with(dt_comm_check_wait(h, NULL), DT_ERR_INVALID, "comm/test: wait: NULL request");
    fails_with(dt_comm_check_test(h, NULL, &done), DT_ERR_INVALID,
               "comm/test: test: NULL argument");
    fails_with(dt_comm_check_test(h, req, NULL), DT_ERR_INVALID,
               "comm/test: test: NULL argument");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kind),
        cmocka_unit_test(test_unnumbered),
        cmocka_unit_test(test_unknown_names),
        cmocka_unit_test(test_rank_world_vs_split),
        cmocka_unit_test(test_rank_lists),
        cmocka_unit_test_setup(test_check_dtype_and_reduce, setup),
        cmocka_unit_test_setup(test_check_ranks, setup),
        cmocka_unit_test_setup(test_check_buffers, setup),
        cmocka_unit_test_setup(test_op_fail, setup),
        cmocka_unit_test_setup(test_check_init, setup),
        cmocka_unit_test_setup(test_check_host_memory, setup),
        cmocka_unit_test_setup(test_check_wait_test, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
