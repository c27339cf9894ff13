/*
 * tests/unit/plugins/common/comm/test_comm_split.c - plugins/common/comm/comm_split.h: split
 * membership (ranks of a color ordered by (key, old rank), this rank's new
 * index, DT_COMM_NO_COLOR), the gather through a communicator's all_gather
 * (a fake here, holding the other ranks' {color, key}) and split's argument
 * messages.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/comm/comm_split.h"
#include "test_host.h"
#include "util/error.h"

/* {color, key} of old ranks 0..7 */
static const int32_t pairs8[16] = {
    0, 5,   1, 0,   0, 5,   DT_COMM_NO_COLOR, 0,
    1, -1,  0, 2,   1, 0,   0, 5,
};

static void members_are(int32_t color, int32_t self, const int32_t *want, int32_t n,
                        int32_t want_rank)
{
    int32_t members[16], new_rank = 99;
    memset(members, 0x7f, sizeof members);
    int32_t got = dt_comm_split_members(pairs8, 8, color, self, members, &new_rank);
    assert_int_equal(got, n);
    for (int32_t i = 0; i < n; i++)
        assert_int_equal(members[i], want[i]);
    assert_int_equal(new_rank, want_rank);
}

/* color 0: old ranks 0 (key 5), 2 (key 5), 5 (key 2), 7 (key 5): key first,
 * ties in key broken by old rank. */
static void test_order_by_key_then_old_rank(void **state)
{
    (void)state;
    const int32_t c0[] = {5, 0, 2, 7};
    members_are(0, 0, c0, 4, 1);
    members_are(0, 2, c0, 4, 2);
    members_are(0, 5, c0, 4, 0);
    members_are(0, 7, c0, 4, 3);
    /* color 1: old ranks 1 (key 0), 4 (key -1), 6 (key 0) */
    const int32_t c1[] = {4, 1, 6};
    members_are(1, 4, c1, 3, 0);
    members_are(1, 1, c1, 3, 1);
    members_are(1, 6, c1, 3, 2);
}

static void test_no_color_and_strangers(void **state)
{
    (void)state;
    /* old rank 3 gave DT_COMM_NO_COLOR: a member of no color's group */
    const int32_t c0[] = {5, 0, 2, 7}, c1[] = {4, 1, 6};
    members_are(0, 3, c0, 4, -1);
    members_are(1, 3, c1, 3, -1);
    /* a color nobody gave has no members */
    members_are(7, 0, NULL, 0, -1);
}

/* Keys equal everywhere: the old order is kept (the common case, key = 0). */
static void test_equal_keys_keep_old_order(void **state)
{
    (void)state;
    int32_t all[12], members[12], r = -5;
    for (int p = 0; p < 6; p++) {
        all[2 * p] = p % 2;
        all[2 * p + 1] = 0;
    }
    assert_int_equal(dt_comm_split_members(all, 6, 1, 5, members, &r), 3);
    assert_int_equal(members[0], 1);
    assert_int_equal(members[1], 3);
    assert_int_equal(members[2], 5);
    assert_int_equal(r, 2);
}

/* ---- the gather ------------------------------------------------------- */

/* The fake group: rank `me` of 8, the others' pairs from pairs8. */
struct dt_comm {
    int me;
    int calls;
    int fail;
};

static int fake_all_gather(dt_comm_t *c, const void *send, void *recv, uint64_t count,
                           int dtype, dt_stream_t *stream, dt_comm_req_t **req)
{
    c->calls++;
    assert_int_equal(count, 2);
    assert_int_equal(dtype, DT_I32);
    assert_null(stream);
    assert_null(req); /* blocking: the group's bounded wait */
    if (c->fail)
        return DT_ERR_TIMEOUT;
    memcpy(recv, pairs8, sizeof pairs8);
    memcpy((int32_t *)recv + 2 * c->me, send, 2 * sizeof(int32_t));
    return DT_OK;
}

static dt_test_host_t th;

static int setup(void **state)
{
    (void)state;
    dt_test_host_init(&th, "comm/test", NULL);
    dt_err_clear();
    return 0;
}

static void test_gather(void **state)
{
    (void)state;
    /* rank 2 gives color 0, key 1 (pairs8 has key 5 there): ordered
     * 2 (key 1), 5 (key 2), 0 and 7 (key 5, by old rank) */
    struct dt_comm c = {.me = 2};
    dt_comm_split_t s;
    assert_int_equal(dt_comm_split_gather(&th.host, fake_all_gather, &c, "world", 8, 2, 0,
                                          1, &s),
                     DT_OK);
    assert_int_equal(c.calls, 1);
    assert_int_equal(s.size, 4);
    assert_int_equal(s.rank, 0);
    assert_int_equal(s.members[0], 2);
    assert_int_equal(s.members[1], 5);
    assert_int_equal(s.members[2], 0);
    assert_int_equal(s.members[3], 7);
    dt_comm_split_free(&s);
    assert_null(s.members);
    dt_comm_split_free(&s); /* twice: harmless */
}

/* A NO_COLOR rank still takes part in the gather (split is collective)
 * and joins nothing. */
static void test_gather_no_color(void **state)
{
    (void)state;
    struct dt_comm c = {.me = 3};
    dt_comm_split_t s;
    assert_int_equal(dt_comm_split_gather(&th.host, fake_all_gather, &c, "world", 8, 3,
                                          DT_COMM_NO_COLOR, 0, &s),
                     DT_OK);
    assert_int_equal(c.calls, 1);
    assert_int_equal(s.size, 0);
    assert_int_equal(s.rank, -1);
    assert_null(s.members);
}

/* all_gather's failure is returned as it is, its message kept. */
static void test_gather_fails(void **state)
{
    (void)state;
    struct dt_comm c = {.me = 0, .fail = 1};
    dt_comm_split_t s;
    assert_int_equal(dt_comm_split_gather(&th.host, fake_all_gather, &c, "world", 8, 0, 0,
                                          0, &s),
                     DT_ERR_TIMEOUT);
    assert_int_equal(s.size, 0);
    assert_null(s.members);
}

static void test_check(void **state)
{
    (void)state;
    dt_comm_t *out = (dt_comm_t *)&th; /* anything: check must clear it */
    assert_int_equal(dt_comm_split_check(&th.host, "world", 0, &out), DT_OK);
    assert_null(out);
    out = (dt_comm_t *)&th;
    assert_int_equal(dt_comm_split_check(&th.host, "world", DT_COMM_NO_COLOR, &out), DT_OK);
    assert_null(out);
    assert_int_equal(dt_comm_split_check(&th.host, "world/g1c0", -3, &out), DT_ERR_INVALID);
    assert_string_equal(dt_last_error(), "comm/test: split of group world/g1c0: color -3 "
                                         "must be >= 0 or DT_COMM_NO_COLOR");
    assert_int_equal(dt_comm_split_check(&th.host, "world", 1, NULL), DT_ERR_INVALID);
    assert_string_equal(dt_last_error(), "comm/test: split of group world: NULL out");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_by_key_then_old_rank),
        cmocka_unit_test(test_no_color_and_strangers),
        cmocka_unit_test(test_equal_keys_keep_old_order),
        cmocka_unit_test_setup(test_gather, setup),
        cmocka_unit_test_setup(test_gather_no_color, setup),
        cmocka_unit_test_setup(test_gather_fails, setup),
        cmocka_unit_test_setup(test_check, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
