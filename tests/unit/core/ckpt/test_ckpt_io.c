/*
 * tests/unit/core/ckpt/test_ckpt_io.c - atomic file writes (fileutil) and sharded
 * checkpoints: a save by 3 "ranks" holding odd-sized ranges read back by
 * arbitrary ranges; corruption, missing marker, missing or truncated
 * shards, inconsistent manifests and tensor tables, a manifest edited
 * after the save, links and FIFOs where files should be give messages
 * naming the file and the entry; a disk that fills up (or fails fsync) at
 * any point leaves the previous checkpoint loadable and no temp directory
 * behind; links planted by someone else are never written or deleted
 * through.
 *
 * The cases by concern, this file listing them: ckpt_io_fileutil.c,
 * ckpt_io_write_read.c, ckpt_io_corruption.c, ckpt_io_resharding.c; what
 * they share, ckpt_io_test.h (ckpt_io_fixture.c).
 */
#include "ckpt_io_test.h"

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/dt_test_ckpt.XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    dt_fileutil_test_fail_after(-1);
    dt_fileutil_test_fail_fsync_after(-1);
    return dt_fileutil_rm_rf(g_dir);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--env-child") == 0) {
        snprintf(g_dir, sizeof g_dir, "%s", argv[2]);
        return env_child();
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32),
        cmocka_unit_test(test_mkdir_rm),
        cmocka_unit_test(test_atomic_write),
        cmocka_unit_test(test_atomic_write_enospc),
        cmocka_unit_test(test_atomic_write_planted_links),
        cmocka_unit_test(test_atomic_write_not_regular),
        cmocka_unit_test(test_output_modes),
        cmocka_unit_test(test_open_output),
        cmocka_unit_test(test_mkdir_parent),
        cmocka_unit_test(test_fault_env),
        cmocka_unit_test(test_roundtrip_3ranks),
        cmocka_unit_test(test_python_reads_checkpoint),
        cmocka_unit_test(test_checksum_mismatch),
        cmocka_unit_test(test_missing_marker),
        cmocka_unit_test(test_missing_and_truncated_shard),
        cmocka_unit_test(test_manifest_inconsistent),
        cmocka_unit_test(test_manifest_checksum),
        cmocka_unit_test(test_ckpt_members_not_regular),
        cmocka_unit_test(test_open_incomplete_warns),
        cmocka_unit_test(test_tensor_table),
        cmocka_unit_test(test_manifest_writer_checks),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_latest_and_prune),
        cmocka_unit_test(test_links_in_ckpt_root),
        cmocka_unit_test(test_json_u64),
        cmocka_unit_test(test_blocks_read_as_ranges),
        cmocka_unit_test(test_ranges_read_as_blocks),
        cmocka_unit_test(test_block_errors),
        cmocka_unit_test(test_old_format_fixture),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
