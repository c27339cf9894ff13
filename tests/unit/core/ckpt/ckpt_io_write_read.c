/*
 * tests/unit/core/ckpt/ckpt_io_write_read.c - sharded checkpoints written and
 * read back: a save by 3 "ranks" holding odd-sized ranges read by arbitrary
 * ranges (and by Python), a disk that fills up or fails fsync at any point
 * (the previous checkpoint stays loadable, no temp folder is left), latest
 * and prune, 64-bit values in JSON, and the earliest format.
 */
#include "ckpt_io_test.h"

/* ---- a 3-rank checkpoint written and read back ---------------------- */

void test_roundtrip_3ranks(void **state)
{
    char root[512], dir[600];
    subdir(root, sizeof root, "rt");
    assert_int_equal(save(root, 200, 1), DT_OK);
    dt_test_assert_no_tmp(root);
    uint64_t step = 0;
    assert_int_equal(dt_ckpt_latest(root, dir, sizeof dir, &step), DT_OK);
    assert_int_equal(step, 200);
    char want[600];
    snprintf(want, sizeof want, "%s/step-00000200", root);
    assert_string_equal(dir, want);
    check_ckpt(dir, 200, 1);
    /* the shard files are what 3 ranks wrote */
    for (int r = 0; r < RANKS; r++) {
        char p[700];
        snprintf(p, sizeof p, "%s/shard-%05d.bin", dir, r);
        assert_int_equal(access(p, F_OK), 0);
    }

    /* Saving the same step again replaces it atomically. */
    assert_int_equal(save(root, 200, 5), DT_OK);
    dt_test_assert_no_tmp(root);
    check_ckpt(dir, 200, 5);
}

/* The format is readable without dtrain: Python's json + zlib.crc32 verify
 * every segment and assemble embedding/params. */
void test_python_reads_checkpoint(void **state)
{
    if (access("/usr/bin/python3", X_OK) != 0)
        skip();
    static const char script[] =
        "import json, struct, sys, zlib\n"
        "d = sys.argv[1]\n"
        "m = json.load(open(d + '/manifest.json'))\n"
        "assert m['format'] == 'dtrain-checkpoint' and m['step'] == 200\n"
        "for f, info in m['files'].items():\n"
        "    assert len(open(d + '/' + f, 'rb').read()) == info['bytes']\n"
        "size = {'f32': 4, 'i64': 8}\n"
        "out = {}\n"
        "for name, e in m['entries'].items():\n"
        "    es = size[e['dtype']]\n"
        "    buf = bytearray(e['numel'] * es)\n"
        "    for s in e['segments']:\n"
        "        raw = open(d + '/' + s['file'], 'rb').read()\n"
        "        seg = raw[s['byte_offset']:s['byte_offset'] + s['count'] * es]\n"
        "        assert '%08x' % zlib.crc32(seg) == s['crc32'], (name, s)\n"
        "        buf[s['offset'] * es:(s['offset'] + s['count']) * es] = seg\n"
        "    out[name] = bytes(buf)\n"
        "emb = struct.unpack('<1000f', out['embedding/params'])\n"
        "assert list(emb) == [1 * 0.5 + 0 * 1000 + i * 0.25 for i in range(1000)]\n"
        "assert list(struct.unpack('<5q', out['head/counter'])) == "
        "[10**12 + 4000 + i for i in range(5)]\n";
    char root[512], dir[600], sp[600], cmd[1400];
    subdir(root, sizeof root, "py");
    assert_int_equal(save(root, 200, 1), DT_OK);
    assert_int_equal(dt_ckpt_step_dir(root, 200, 0, dir, sizeof dir), DT_OK);
    snprintf(sp, sizeof sp, "%s/check.py", root);
    assert_int_equal(dt_fileutil_write_atomic(sp, script, strlen(script)),
                     DT_OK);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s'", sp, dir);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* The newest complete checkpoint must be `step` and hold `seed`'s values;
 * no tmp directory may remain. */
static void assert_state(const char *root, uint64_t step, int seed)
{
    char dir[700];
    uint64_t got;
    dt_test_assert_no_tmp(root);
    assert_int_equal(dt_ckpt_latest(root, dir, sizeof dir, &got), DT_OK);
    assert_int_equal(got, step);
    check_ckpt(dir, step, seed);
}

void test_disk_full(void **state)
{
    char root[512];
    subdir(root, sizeof root, "full");
    assert_int_equal(save(root, 100, 1), DT_OK);
    /* Budgets from 0 up, growing ~1.5x, until the save fits: the failure
     * lands in every stage (shards, segment data, manifest, marker). */
    int failures = 0;
    for (int64_t budget = 0;; budget = budget * 3 / 2 + 1) {
        dt_fileutil_test_fail_after(budget);
        int rc = save(root, 200, 2);
        dt_fileutil_test_fail_after(-1);
        if (rc == DT_OK)
            break;
        failures++;
        assert_int_equal(rc, DT_ERR_IO);
        assert_msg_has("No space left on device");
        assert_state(root, 100, 1);
    }
    assert_true(failures > 15);
    assert_state(root, 200, 2);

    /* fsync failing at each point in turn. */
    char dir[700];
    assert_int_equal(dt_ckpt_step_dir(root, 300, 0, dir, sizeof dir), DT_OK);
    for (int64_t n = 0;; n++) {
        assert_true(n < 64);
        dt_fileutil_test_fail_fsync_after(n);
        int rc = save(root, 300, 3);
        dt_fileutil_test_fail_fsync_after(-1);
        if (rc == DT_OK)
            break;
        assert_int_equal(rc, DT_ERR_IO);
        assert_msg_has("No space left on device");
        if (access(dir, F_OK) == 0) {
            /* Only the last sync (of the root, after the rename) can fail
             * with the new checkpoint in place; it is complete and good. */
            assert_state(root, 300, 3);
            assert_int_equal(dt_fileutil_rm_rf(dir), DT_OK);
        }
        assert_state(root, 200, 2);
    }
    assert_state(root, 300, 3);
}

void test_latest_and_prune(void **state)
{
    char root[512], dir[700], p[800];
    subdir(root, sizeof root, "prune");
    uint64_t step;
    assert_int_equal(dt_ckpt_latest(root, dir, sizeof dir, &step),
                     DT_ERR_NOT_FOUND);
    char want[700];
    snprintf(want, sizeof want, "no complete checkpoint in '%s'", root);
    assert_msg_has(want);
    snprintf(p, sizeof p, "%s/absent", root);
    assert_int_equal(dt_ckpt_latest(p, dir, sizeof dir, &step),
                     DT_ERR_NOT_FOUND);

    uint64_t steps[] = {100, 400, 200, 300};
    for (int i = 0; i < 4; i++)
        assert_int_equal(save(root, steps[i], (int)i), DT_OK);
    /* An incomplete final-named dir, a tmp dir, and unrelated names. */
    snprintf(p, sizeof p, "%s/step-00000500", root);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK);
    snprintf(p, sizeof p, "%s/step-00000600.tmp", root);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK);
    snprintf(p, sizeof p, "%s/step-7", root);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK);
    snprintf(p, sizeof p, "%s/step-7/COMPLETE", root);
    assert_int_equal(dt_fileutil_write_atomic(p, "", 0), DT_OK);

    assert_int_equal(dt_ckpt_latest(root, dir, sizeof dir, &step), DT_OK);
    assert_int_equal(step, 400);
    assert_int_equal(dt_ckpt_prune(root, 0), DT_ERR_INVALID);
    assert_int_equal(dt_ckpt_prune(root, 2), DT_OK);
    const char *expect_present[] = {"step-00000300", "step-00000400",
                                    "step-00000500", "step-00000600.tmp",
                                    "step-7"};
    const char *expect_gone[] = {"step-00000100", "step-00000200"};
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", root, expect_present[i]);
        assert_int_equal(access(p, F_OK), 0);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", root, expect_gone[i]);
        assert_int_equal(access(p, F_OK), -1);
    }
    snprintf(p, sizeof p, "%s/step-00000300", root);
    check_ckpt(p, 300, 3);
    /* begin removes a stale tmp of its own step */
    char tmp[700];
    assert_int_equal(dt_ckpt_begin(root, 600, tmp, sizeof tmp), DT_OK);
    snprintf(p, sizeof p, "%s/stale", tmp);
    assert_int_equal(dt_fileutil_write_atomic(p, "x", 1), DT_OK);
    assert_int_equal(dt_ckpt_begin(root, 600, tmp, sizeof tmp), DT_OK);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(dt_ckpt_abort(root, 600), DT_OK);

    /* startup cleanup: leftovers of interrupted saves go, the rest stays */
    snprintf(p, sizeof p, "%s/step-00000700.tmp", root);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK);
    snprintf(p, sizeof p, "%s/step-00000300.old", root);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK);
    snprintf(p, sizeof p, "%s/notes.tmp", root);
    assert_int_equal(dt_fileutil_write_atomic(p, "x", 1), DT_OK);
    assert_int_equal(dt_ckpt_clean_stale(root), DT_OK);
    const char *after_gone[] = {"step-00000700.tmp", "step-00000300.old"};
    const char *after_kept[] = {"step-00000300", "step-00000400",
                                "step-00000500", "step-7", "notes.tmp"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", root, after_gone[i]);
        assert_int_equal(access(p, F_OK), -1);
    }
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", root, after_kept[i]);
        assert_int_equal(access(p, F_OK), 0);
    }
    snprintf(p, sizeof p, "%s/absent", root);
    assert_int_equal(dt_ckpt_clean_stale(p), DT_OK);
}

/* 64-bit values do not fit a JSON number (a double): add_u64 stores the
 * exact decimal string. */
void test_json_u64(void **state)
{
    cJSON *o = cJSON_CreateObject();
    assert_int_equal(dt_ckpt_json_add_u64(o, "a", UINT64_MAX), DT_OK);
    assert_int_equal(dt_ckpt_json_add_u64(o, "b", 0), DT_OK);
    char *t = cJSON_PrintUnformatted(o);
    assert_string_equal(t, "{\"a\":\"18446744073709551615\",\"b\":\"0\"}");
    cJSON *p = cJSON_Parse(t);
    assert_true(json_u64(p, "a") == UINT64_MAX);
    cJSON_free(t);
    cJSON_Delete(o);
    cJSON_Delete(p);
}

/* A checkpoint of the earliest format, written out by hand: no
 * "format_version" in the manifest, a one-line COMPLETE.  It still opens
 * (as version 1) and reads. */
void test_old_format_fixture(void **state)
{
    char root[512], dir[600], p[700], man[1024];
    subdir(root, sizeof root, "old-format");
    snprintf(dir, sizeof dir, "%s/step-00000003", root);
    assert_ok(dt_fileutil_mkdir_p(dir));
    const float vals[6] = {0.5f, -1.25f, 2.0f, 3.5f, -4.75f, 6.0f};
    snprintf(p, sizeof p, "%s/shard-00000.bin", dir);
    assert_ok(dt_fileutil_write_atomic(p, vals, 16));
    snprintf(p, sizeof p, "%s/shard-00001.bin", dir);
    assert_ok(dt_fileutil_write_atomic(p, vals + 4, 8));
    int mn = snprintf(man, sizeof man,
        "{\"format\": \"dtrain-checkpoint\", \"step\": 3,\n"
        " \"written_by\": {\"world_size\": 2, \"strategy\": \"ddp\"},\n"
        " \"model\": {}, \"extra\": {},\n"
        " \"files\": {\"shard-00000.bin\": {\"bytes\": 16},\n"
        "           \"shard-00001.bin\": {\"bytes\": 8}},\n"
        " \"entries\": {\"w/params\": {\"dtype\": \"f32\", \"numel\": 6,\n"
        "   \"shape\": [2, 3], \"segments\": [\n"
        "   {\"offset\": 4, \"count\": 2, \"file\": \"shard-00001.bin\","
        " \"byte_offset\": 0, \"crc32\": \"%08x\"},\n"
        "   {\"offset\": 0, \"count\": 4, \"file\": \"shard-00000.bin\","
        " \"byte_offset\": 0, \"crc32\": \"%08x\"}]}}}\n",
        (unsigned)dt_fileutil_crc32(0, vals + 4, 8),
        (unsigned)dt_fileutil_crc32(0, vals, 16));
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    assert_ok(dt_fileutil_write_atomic(p, man, (size_t)mn));
    snprintf(p, sizeof p, "%s/COMPLETE", dir);
    assert_ok(dt_fileutil_write_atomic(p, "dtrain checkpoint complete\n", 27));
    dt_ckpt_reader_t *r;
    assert_ok(dt_ckpt_open(dir, &r));
    assert_int_equal(dt_ckpt_reader_format_version(r), 1);
    assert_int_equal(dt_ckpt_reader_step(r), 3);
    float got[6];
    assert_ok(dt_ckpt_read(r, "w/params", 0, 6, got));
    assert_memory_equal(got, vals, sizeof vals);
    /* column 1 of the [2, 3] entry, as a tensor-parallel rank would ask */
    dt_ckpt_block_t b = blk2(0, 2, 3, 0, 2, 1, 1);
    assert_ok(dt_ckpt_read_block(r, "w/params", &b, got));
    assert_true(got[0] == vals[1] && got[1] == vals[4]);
    assert_ok(dt_ckpt_verify(r));
    dt_ckpt_close(r);
}
