/*
 * tests/unit/core/train/test_grid.c - the 3-D process grid (core/train/grid.h):
 * every rank's coordinates and group members at tp 2 x pp 2 x dp 2,
 * listed; the split colors and keys agreeing with the members for many
 * shapes; config errors with their exact messages; and 8 forked ranks
 * splitting the shm communicator into the four groups, each group's
 * members checked by an all_reduce of rank bits and their order by an
 * all_gather of rank ids.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "mp_check.h"
#include "mp_harness.h"
#include "test_assert.h"
#include "test_host.h"
#include "test_plugin.h"
#include "train/grid.h"
#include "util/error.h"

#define PLUGIN_PATH DT_TEST_PLUGIN_DIR "/dtrain_shm.so"

static const dt_comm_ops_v1_t *g_ops; /* loaded in the parent, inherited */

/* tp 2 x pp 2 x dp 2 on 8 ranks, rank = pp * 4 + dp * 2 + tp. */
static const struct {
    int32_t tp, pp, dp;
    int32_t group[DT_GRID_N_GROUPS][4]; /* tensor, pipeline, data, embedding, model */
} T222[8] = {
    /*      tp pp dp   tensor   pipeline  data     embedding model */
    [0] = {0, 0, 0, {{0, 1}, {0, 4}, {0, 2}, {0, 4}, {0, 1, 4, 5}}},
    [1] = {1, 0, 0, {{0, 1}, {1, 5}, {1, 3}, {1, 5}, {0, 1, 4, 5}}},
    [2] = {0, 0, 1, {{2, 3}, {2, 6}, {0, 2}, {2, 6}, {2, 3, 6, 7}}},
    [3] = {1, 0, 1, {{2, 3}, {3, 7}, {1, 3}, {3, 7}, {2, 3, 6, 7}}},
    [4] = {0, 1, 0, {{4, 5}, {0, 4}, {4, 6}, {0, 4}, {0, 1, 4, 5}}},
    [5] = {1, 1, 0, {{4, 5}, {1, 5}, {5, 7}, {1, 5}, {0, 1, 4, 5}}},
    [6] = {0, 1, 1, {{6, 7}, {2, 6}, {4, 6}, {2, 6}, {2, 3, 6, 7}}},
    [7] = {1, 1, 1, {{6, 7}, {3, 7}, {5, 7}, {3, 7}, {2, 3, 6, 7}}},
};

static void test_grid_tp2_pp2_dp2(void **state)
{
    for (int32_t r = 0; r < 8; r++) {
        dt_grid_t g;
        assert_ok(dt_grid_init(&g, 8, r, 2, 2));
        assert_int_equal(g.dp, 2);
        assert_int_equal(g.tp_rank, T222[r].tp);
        assert_int_equal(g.pp_rank, T222[r].pp);
        assert_int_equal(g.dp_rank, T222[r].dp);
        assert_int_equal(dt_grid_rank_at(&g, g.tp_rank, g.pp_rank, g.dp_rank), r);
        for (int k = 0; k < DT_GRID_N_GROUPS; k++) {
            int32_t m[8] = {-1, -1, -1, -1};
            const int32_t n = k == DT_GRID_MODEL ? 4 : 2;
            assert_int_equal(dt_grid_members(&g, (dt_grid_group_t)k, m, 8), n);
            if (memcmp(m, T222[r].group[k], (size_t)n * sizeof *m) != 0)
                fail_msg("rank %d: %s group [%d, %d, ...], want [%d, %d, ...]", (int)r,
                         dt_grid_group_name((dt_grid_group_t)k), (int)m[0], (int)m[1],
                         (int)T222[r].group[k][0], (int)T222[r].group[k][1]);
        }
    }
}

/* Pipeline of 4 stages (tp 1, dp 2): middle stages join no embedding
 * group; the first and last of each pipeline do, in stage order. */
static void test_grid_embedding_pp4(void **state)
{
    static const int32_t want[8][2] = {{0, 6}, {1, 7}, {-1}, {-1}, {-1}, {-1},
                                       {0, 6}, {1, 7}};
    for (int32_t r = 0; r < 8; r++) {
        dt_grid_t g;
        assert_ok(dt_grid_init(&g, 8, r, 1, 4));
        int32_t m[4] = {-1, -1}, color, key;
        int32_t n = dt_grid_members(&g, DT_GRID_EMBEDDING, m, 4);
        dt_grid_split_args(&g, DT_GRID_EMBEDDING, &color, &key);
        if (want[r][0] < 0) {
            assert_int_equal(n, 0);
            assert_int_equal(color, DT_COMM_NO_COLOR);
        } else {
            assert_int_equal(n, 2);
            assert_int_equal(m[0], want[r][0]);
            assert_int_equal(m[1], want[r][1]);
            assert_true(color >= 0);
        }
        assert_int_equal(dt_grid_members(&g, DT_GRID_PIPELINE, m, 4), 4);
        for (int k = 0; k < 4; k++)
            assert_int_equal(m[k], r % 2 + 2 * k);
    }
    /* one stage: the embedding group is the stage alone */
    dt_grid_t g;
    assert_ok(dt_grid_init(&g, 4, 3, 2, 1));
    int32_t m[2];
    assert_int_equal(dt_grid_members(&g, DT_GRID_EMBEDDING, m, 2), 1);
    assert_int_equal(m[0], 3);
}

/* For many shapes: the groups split would form from every rank's color
 * and key (same color, ordered by key then rank) are exactly
 * dt_grid_members, each rank's key is its place in its group, and the
 * coordinates cover the world once. */
static void test_grid_split_args_match_members(void **state)
{
    static const int32_t shapes[][3] = {{1, 1, 1}, {8, 2, 2}, {8, 4, 1},
                                        {8, 1, 4}, {8, 8, 1}, {12, 2, 3},
                                        {12, 3, 2}, {16, 2, 4}, {24, 2, 3},
                                        {6, 1, 6}, {30, 5, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int32_t W = shapes[s][0];
        dt_grid_t g[32];
        int seen[32] = {0};
        for (int32_t r = 0; r < W; r++) {
            assert_ok(dt_grid_init(&g[r], W, r, shapes[s][1], shapes[s][2]));
            assert_int_equal(g[r].tp * g[r].pp * g[r].dp, W);
            int32_t at = dt_grid_rank_at(&g[r], g[r].tp_rank, g[r].pp_rank,
                                         g[r].dp_rank);
            assert_int_equal(at, r);
            seen[at]++;
        }
        for (int32_t r = 0; r < W; r++)
            assert_int_equal(seen[r], 1);
        for (int k = 0; k < DT_GRID_N_GROUPS; k++) {
            for (int32_t r = 0; r < W; r++) {
                int32_t color, key, want[32], n;
                dt_grid_split_args(&g[r], (dt_grid_group_t)k, &color, &key);
                n = dt_grid_members(&g[r], (dt_grid_group_t)k, want, 32);
                if (color == DT_COMM_NO_COLOR) {
                    assert_int_equal(n, 0);
                    continue;
                }
                /* brute force: ranks of the same color by (key, rank) */
                int32_t got[32], keys[32], m = 0;
                for (int32_t q = 0; q < W; q++) {
                    int32_t c, kq;
                    dt_grid_split_args(&g[q], (dt_grid_group_t)k, &c, &kq);
                    if (c != color)
                        continue;
                    int32_t i = m++;
                    while (i > 0 && keys[i - 1] > kq) {
                        keys[i] = keys[i - 1];
                        got[i] = got[i - 1];
                        i--;
                    }
                    keys[i] = kq;
                    got[i] = q;
                }
                if (m != n || memcmp(got, want, (size_t)n * sizeof *got) != 0)
                    fail_msg("world %d tp %d pp %d: rank %d: the %s group by "
                             "split has %d ranks, members() %d", (int)W,
                             (int)shapes[s][1], (int)shapes[s][2], (int)r,
                             dt_grid_group_name((dt_grid_group_t)k), (int)m,
                             (int)n);
                assert_int_equal(got[key], r);
            }
        }
    }
}

static void test_grid_config_errors(void **state)
{
    dt_grid_t g;
    assert_status(dt_grid_init(&g, 8, 0, 3, 1), DT_ERR_CONFIG);
    assert_msg("parallel.tensor = 3 x parallel.pipeline = 1 = 3 ranks per "
               "model replica does not divide the world of 8 ranks");
    assert_status(dt_grid_init(&g, 8, 5, 2, 3), DT_ERR_CONFIG);
    assert_msg("parallel.tensor = 2 x parallel.pipeline = 3 = 6 ranks per "
               "model replica does not divide the world of 8 ranks");
    assert_status(dt_grid_init(&g, 4, 0, 8, 1), DT_ERR_CONFIG);
    assert_msg("parallel.tensor = 8 x parallel.pipeline = 1 = 8 ranks per "
               "model replica does not divide the world of 4 ranks");
    assert_status(dt_grid_init(&g, 2, 0, 4096, 4096), DT_ERR_CONFIG);
    assert_msg("parallel.tensor = 4096 x parallel.pipeline = 4096 = 16777216 "
               "ranks per model replica does not divide the world of 2 ranks");
    assert_status(dt_grid_init(&g, 8, 0, 0, 2), DT_ERR_CONFIG);
    assert_msg("parallel.tensor = 0 and parallel.pipeline = 2: both must be at "
               "least 1");
    assert_status(dt_grid_init(&g, 8, 8, 2, 2), DT_ERR_INVALID);
    assert_msg("process grid: rank 8 of a world of 8 ranks");
    /* outside the grid */
    assert_ok(dt_grid_init(&g, 8, 0, 2, 2));
    assert_int_equal(dt_grid_rank_at(&g, 2, 0, 0), -1);
    assert_int_equal(dt_grid_rank_at(&g, 0, 0, -1), -1);
    assert_string_equal(dt_grid_group_name(DT_GRID_EMBEDDING), "embedding");
    assert_string_equal(dt_grid_group_name(DT_GRID_MODEL), "model");
}

/* ---- 8 ranks on the shm communicator --------------------------------- */

typedef struct {
    int64_t tp, pp;
} shape_t;

static int rank_split(int rank, int nproc, const char *job, void *arg)
{
    const shape_t *sh = arg;
    dt_test_host_t th;
    dt_test_host_init(&th, "comm/shm", NULL);
    dt_comm_init_v1_t ci = {.struct_size = sizeof ci, .rank = rank, .size = nproc,
                            .local_rank = rank, .local_size = nproc, .job_id = job,
                            .timeout_ms = 20000};
    dt_comm_t *world, *grp[DT_GRID_N_GROUPS];
    DT_MP_OK(g_ops->init(&th.host, &ci, &world));
    dt_grid_t g;
    DT_MP_OK(dt_grid_init(&g, nproc, rank, sh->tp, sh->pp));
    DT_MP_OK(dt_grid_split(&g, world, grp));
    for (int k = 0; k < DT_GRID_N_GROUPS; k++) {
        int32_t want[8], color, key;
        int32_t n = dt_grid_members(&g, (dt_grid_group_t)k, want, 8);
        dt_grid_split_args(&g, (dt_grid_group_t)k, &color, &key);
        if (n == 0) {
            DT_MP_CHECK(grp[k] == NULL);
            continue;
        }
        DT_MP_CHECK(grp[k] != NULL);
        int32_t r, s;
        DT_MP_OK(g_ops->rank_size(grp[k], &r, &s));
        DT_MP_CHECK(r == key && s == n);
        /* the members: the sum of their rank bits */
        int64_t bit = (int64_t)1 << rank, mask = 0, want_mask = 0;
        for (int32_t i = 0; i < n; i++)
            want_mask |= (int64_t)1 << want[i];
        DT_MP_OK(g_ops->all_reduce(grp[k], &bit, &mask, 1, DT_I64, DT_OP_SUM,
                                   NULL, NULL));
        if (mask != want_mask)
            return dt_mp_fail("rank %d: %s group holds ranks 0x%llx, want "
                              "0x%llx", rank,
                              dt_grid_group_name((dt_grid_group_t)k),
                              (unsigned long long)mask,
                              (unsigned long long)want_mask);
        /* their order: group rank i is want[i] */
        int32_t me = rank, ids[8];
        DT_MP_OK(g_ops->all_gather(grp[k], &me, ids, 1, DT_I32, NULL, NULL));
        DT_MP_CHECK(memcmp(ids, want, (size_t)n * sizeof *ids) == 0);
    }
    for (int k = 0; k < DT_GRID_N_GROUPS; k++)
        g_ops->finalize(grp[k]);
    g_ops->finalize(world);
    return 0;
}

static void test_grid_split_shm(void **state)
{
    shape_t a = {2, 2}; /* tp 2 x pp 2 x dp 2 */
    dt_mp_run_ranks(8, rank_split, &a, 60.0, "grid");
    shape_t b = {1, 4}; /* pp 4 x dp 2: middle stages sit out the embedding */
    dt_mp_run_ranks(8, rank_split, &b, 60.0, "grid");
}

static int setup(void **state)
{
    g_ops = dt_test_plugin_entry(PLUGIN_PATH, DT_ENTRY_STRING(comm, 1), NULL);
    if (!g_ops) {
        fprintf(stderr, "%s\n", dt_last_error());
        return -1;
    }
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grid_tp2_pp2_dp2),
        cmocka_unit_test(test_grid_embedding_pp4),
        cmocka_unit_test(test_grid_split_args_match_members),
        cmocka_unit_test(test_grid_config_errors),
        cmocka_unit_test(test_grid_split_shm),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
