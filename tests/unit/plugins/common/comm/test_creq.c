/*
 * tests/unit/plugins/common/comm/test_creq.c - plugins/common/comm/creq.h: the request base
 * the shm, tcp, mpi and nccl communicators share: its texts, numbering,
 * refusals, allocation, the live list and its drop at finalize, the wait's
 * limit and its timeout text, with the exact words the communicators' own
 * tests expect (tests/unit/plugins/shm/test_shm.c, test_tcp.c, test_mpi.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/comm/creq.h"
#include "test_host.h"
#include "util/error.h"

static dt_test_host_t th;
static const int32_t tp_wranks[2] = {3, 5};
static const dt_comm_names_t world = {.gname = "world", .is_world = 1, .size = 2};
static const dt_comm_names_t tp = {.gname = "tp", .is_world = 0, .size = 2,
                                   .wranks = tp_wranks};

static int setup(void **state)
{
    (void)state;
    dt_test_host_init(&th, "comm/test", NULL);
    dt_err_clear();
    return 0;
}

/* A transport's request: the base first, then its own. */
typedef struct my_req {
    dt_creq_t b;
    int own;
} my_req_t;

static void test_text_and_desc(void **state)
{
    (void)state;
    dt_creq_t r = {.kind = DT_COMM_OP_ALL_REDUCE, .dtype = DT_F32, .op = DT_OP_SUM,
                   .root = -1, .count = 1048576, .esize = 4, .seq = 17};
    char buf[256];
    dt_creq_text(&world, &r, buf, sizeof buf);
    assert_string_equal(buf, "all_reduce #17 (f32, 4194304 bytes) on group world");
    dt_comm_op_desc_t d = dt_creq_desc(&r);
    assert_int_equal(d.bytes, 4194304);
    assert_int_equal(d.seq, 17);
    dt_creq_t s = {.kind = DT_COMM_OP_SEND, .dtype = DT_F32, .root = 1, .tag = 5,
                   .count = 10, .esize = 4, .seq = 2};
    dt_creq_text(&tp, &s, buf, sizeof buf);
    assert_string_equal(buf, "send #2 to rank 1 (world rank 5) (tag 5, f32, 40 bytes) on group tp");
    assert_true(dt_creq_is_p2p(&s));
    assert_false(dt_creq_is_p2p(&r));
}

static void test_number(void **state)
{
    (void)state;
    uint64_t coll = 0, p2p = 0;
    dt_creq_t a = {.kind = DT_COMM_OP_ALL_REDUCE}, s = {.kind = DT_COMM_OP_SEND},
              r = {.kind = DT_COMM_OP_RECV}, b = {.kind = DT_COMM_OP_BARRIER};
    dt_creq_number(&a, &coll, &p2p);
    dt_creq_number(&s, &coll, &p2p);
    dt_creq_number(&r, &coll, &p2p);
    dt_creq_number(&b, &coll, &p2p);
    assert_int_equal(a.seq, 1);
    assert_int_equal(s.seq, 1);
    assert_int_equal(r.seq, 2);
    assert_int_equal(b.seq, 2);
    assert_int_equal(coll, 2);
    assert_int_equal(p2p, 2);
}

static void test_check_op(void **state)
{
    (void)state;
    const dt_host_v1_t *h = &th.host;
    /* checked before it is numbered: the texts carry no "#n" */
    dt_creq_t t = {.kind = DT_COMM_OP_ALL_REDUCE, .dtype = DT_BF16, .op = DT_OP_SUM,
                   .root = -1, .count = 8};
    assert_int_equal(dt_creq_check_op(h, &world, &t), DT_OK);
    assert_int_equal(t.esize, 2);
    /* an unknown dtype counts its bytes as elements, and is refused */
    dt_creq_t u = {.kind = DT_COMM_OP_ALL_REDUCE, .dtype = 99, .op = DT_OP_SUM, .root = -1,
                   .count = 8};
    assert_int_equal(dt_creq_check_op(h, &world, &u), DT_ERR_INVALID);
    assert_int_equal(u.esize, 1);
    assert_string_equal(dt_last_error(), "comm/test: all_reduce (unknown, 8 bytes) on group "
                        "world: unknown dtype 99");
    /* an integer average is refused by the reduction check */
    dt_creq_t v = {.kind = DT_COMM_OP_REDUCE_SCATTER, .dtype = DT_I32, .op = DT_OP_AVG,
                   .root = -1, .count = 4};
    assert_int_equal(dt_creq_check_op(h, &tp, &v), DT_ERR_UNSUPPORTED);
    assert_string_equal(dt_last_error(), "comm/test: reduce_scatter (i32 avg, 16 bytes per "
                        "rank) on group tp: op avg is not defined for integer dtype i32");
}

static void test_refusals(void **state)
{
    (void)state;
    const dt_host_v1_t *h = &th.host;
    dt_creq_t t = {.kind = DT_COMM_OP_BROADCAST, .dtype = DT_F32, .root = 0, .count = 10,
                   .esize = 4, .seq = 6};
    assert_int_equal(dt_creq_refuse_broken(h, &world, &t, DT_ERR_TIMEOUT, "it timed out"),
                     DT_ERR_TIMEOUT);
    assert_string_equal(dt_last_error(), "comm/test: broadcast #6 (f32, 40 bytes, root 0) on "
                        "group world: not started: the group failed earlier: it timed out");
    assert_int_equal(dt_creq_refuse_failed(h, &world, &t, DT_ERR_REMOTE,
                                           "rank 1 aborted: bye"), DT_ERR_REMOTE);
    assert_string_equal(dt_last_error(), "comm/test: broadcast #6 (f32, 40 bytes, root 0) on "
                        "group world: not started: rank 1 aborted: bye");
}

static void test_new_copies(void **state)
{
    (void)state;
    my_req_t t = {.b = {.kind = DT_COMM_OP_BARRIER, .dtype = DT_U8, .esize = 1, .seq = 9},
                  .own = 42};
    my_req_t *r = dt_creq_new(&th.host, &world, &t, sizeof *r);
    assert_non_null(r);
    assert_int_equal(r->own, 42);
    assert_int_equal(r->b.seq, 9);
    free(r);
}

static int dropped;
static void drop(void *ctx, dt_creq_t *r)
{
    assert_ptr_equal(ctx, &dropped);
    dropped++;
    free(r);
}

static void test_live_list(void **state)
{
    (void)state;
    dt_creq_t *live = NULL;
    my_req_t *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *c = calloc(1, sizeof *c);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    dt_creq_live_add(&live, &a->b);
    dt_creq_live_add(&live, &b->b);
    dt_creq_live_add(&live, &c->b);
    assert_ptr_equal(live, &c->b);
    /* out of the middle, then the head */
    dt_creq_live_remove(&live, &b->b);
    assert_ptr_equal(live->live_next, &a->b);
    assert_ptr_equal(a->b.live_prev, &c->b);
    assert_null(b->b.live_prev);
    assert_null(b->b.live_next);
    free(b);
    dt_creq_live_remove(&live, &c->b);
    assert_ptr_equal(live, &a->b);
    assert_null(a->b.live_prev);
    free(c);
    /* finalize drops what is left */
    my_req_t *d = calloc(1, sizeof *d);
    assert_non_null(d);
    dt_creq_live_add(&live, &d->b);
    dropped = 0;
    assert_int_equal(dt_creq_drop_live(&live, drop, &dropped), 2);
    assert_int_equal(dropped, 2);
    assert_null(live);
    assert_int_equal(dt_creq_drop_live(&live, drop, &dropped), 0);
}

static void test_wait_limit_and_text(void **state)
{
    (void)state;
    int own = -1;
    assert_int_equal(dt_creq_limit_ms(-1, 30000, 1000000, &own), 30000);
    assert_int_equal(own, 0);
    assert_int_equal(dt_creq_limit_ms(250, 30000, 1000000, &own), 250);
    assert_int_equal(own, 1);
    assert_int_equal(dt_creq_limit_ms(-1, 5000000, 1000000, &own), 1000000);
    assert_int_equal(own, 0);
    char buf[256];
    dt_creq_timeout_text("all_reduce #17 (f32, 4194304 bytes) on group world", 1000, 0,
                         "rank 1", buf, sizeof buf);
    assert_string_equal(buf, "all_reduce #17 (f32, 4194304 bytes) on group world: timed out "
                        "after 1.0 s waiting for rank 1");
    dt_creq_timeout_text("recv #2 from rank 1 (tag 0, f32, 4 bytes) on group world", 250, 1,
                         "rank 1", buf, sizeof buf);
    assert_string_equal(buf, "recv #2 from rank 1 (tag 0, f32, 4 bytes) on group world: timed "
                        "out after 0.2 s (the wait's limit) waiting for rank 1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text_and_desc),
        cmocka_unit_test(test_number),
        cmocka_unit_test_setup(test_check_op, setup),
        cmocka_unit_test_setup(test_refusals, setup),
        cmocka_unit_test_setup(test_new_copies, setup),
        cmocka_unit_test(test_live_list),
        cmocka_unit_test(test_wait_limit_and_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
