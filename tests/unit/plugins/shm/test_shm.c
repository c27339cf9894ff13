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
 *
 * The cases by concern, this file listing them: shm_collectives.c,
 * shm_failures.c, shm_symmetric.c, shm_segments.c, shm_job_secret.c,
 * shm_arguments.c; what they share, shm_test.h (shm_fixture.c).
 */
#include "shm_test.h"

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
    free_template_image();
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
