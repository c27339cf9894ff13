/*
 * tests/unit/plugins/self/test_self.c - the `self` communicator (a world of one rank,
 * sdk/examples/comm_self): a collective is a copy; send, recv and
 * sendrecv refuse, naming the peer, and sendrecv hands out no request.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "test_assert.h"
#include "test_host.h"
#include "test_plugin.h"

static const dt_comm_ops_t *SELF;

static void test_one_rank(void **state)
{
    (void)state;
    dt_test_host_t th;
    dt_test_host_init(&th, "comm/self", NULL);
    dt_comm_init_t a = {.struct_size = sizeof a, .rank = 0, .size = 1, .job_id = "j",
                        .timeout_ms = 1000};
    dt_comm_t *c = NULL;
    assert_ok(SELF->init(&th.host, &a, &c));
    float x[3] = {1, 2, 3}, y[3] = {0};
    assert_ok(SELF->all_reduce(c, x, y, 3, DT_F32, DT_OP_SUM, NULL, NULL));
    assert_memory_equal(x, y, sizeof x);
    assert_status(SELF->send(c, x, 3, DT_F32, 1, 0, NULL, NULL), DT_ERR_INVALID);
    assert_msg("comm/self: send/recv to rank 1: a world of one rank has no peers");
    assert_true(DT_HAS_OP(dt_comm_ops_t, SELF, sendrecv));
    dt_comm_req_t *rs = (dt_comm_req_t *)x, *rr = (dt_comm_req_t *)x;
    assert_status(SELF->sendrecv(c, x, 3, y, 3, DT_F32, 0, 0, 1, 2, NULL, &rs, &rr),
                  DT_ERR_INVALID);
    assert_msg("comm/self: send/recv to rank 0: a world of one rank has no peers");
    assert_null(rs);
    assert_null(rr);
    SELF->finalize(c);
}

int main(void)
{
    SELF = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_self.so", DT_ENTRY_STRING(comm, 1),
                                NULL);
    if (!SELF) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
