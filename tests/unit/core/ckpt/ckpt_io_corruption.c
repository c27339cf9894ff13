/*
 * tests/unit/core/ckpt/ckpt_io_corruption.c - checkpoints damaged or hostile:
 * a checksum mismatch, a missing marker, missing or truncated shards,
 * inconsistent manifests and tensor tables, a manifest edited after the save,
 * links and FIFOs where files should be, the manifest writer's checks, and
 * links planted in the checkpoint root (never written or deleted through);
 * every message names the file and the entry.
 */
#include "ckpt_io_test.h"

/* ---- a damaged checkpoint ------------------------------------------- */

static void flip_byte(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    fclose(f);
}

void test_checksum_mismatch(void **state)
{
    char root[512], dir[600], shard[700];
    subdir(root, sizeof root, "crc");
    assert_int_equal(save(root, 200, 1), DT_OK);
    assert_int_equal(dt_ckpt_step_dir(root, 200, 0, dir, sizeof dir), DT_OK);
    /* Rank 1's first segment: embedding/params [334, 665), at byte 0. */
    uint64_t off, cnt;
    rank_range(1000, 1, &off, &cnt);
    assert_int_equal(off, 334);
    assert_int_equal(cnt, 331);
    float *orig = malloc(cnt * 4);
    fill(0, off, cnt, 1, orig);
    uint32_t want_crc = dt_fileutil_crc32(0, orig, cnt * 4);
    ((unsigned char *)orig)[100] ^= 0x40;
    uint32_t got_crc = dt_fileutil_crc32(0, orig, cnt * 4);
    free(orig);
    snprintf(shard, sizeof shard, "%s/shard-00001.bin", dir);
    flip_byte(shard, 100);

    dt_ckpt_reader_t *r;
    assert_int_equal(dt_ckpt_open(dir, &r), DT_OK); /* sizes still fine */
    float buf[1000];
    /* Ranges held only by intact segments still read. */
    assert_int_equal(dt_ckpt_read(r, "embedding/params", 0, 300, buf), DT_OK);
    assert_int_equal(dt_ckpt_read(r, "block.0/params", 0, 777, buf), DT_OK);
    assert_int_equal(dt_ckpt_read(r, "embedding/params", 600, 10, buf),
                     DT_ERR_DATA);
    char want[1000];
    snprintf(want, sizeof want, "checkpoint '%s': shard-00001.bin: entry "
             "embedding/params: checksum mismatch (expected %08x, got %08x)",
             dir, want_crc, got_crc);
    assert_msg_has(want);
    /* Reading again does not pass it off as verified. */
    assert_int_equal(dt_ckpt_read(r, "embedding/params", 334, 1, buf),
                     DT_ERR_DATA);
    assert_int_equal(dt_ckpt_verify(r), DT_ERR_DATA);
    assert_msg_has("shard-00001.bin: entry embedding/params: checksum mismatch");
    dt_ckpt_close(r);
}

void test_missing_marker(void **state)
{
    char root[512], dir[600], p[700];
    subdir(root, sizeof root, "marker");
    assert_int_equal(save(root, 100, 1), DT_OK);
    assert_int_equal(save(root, 200, 2), DT_OK);
    assert_int_equal(dt_ckpt_step_dir(root, 200, 0, dir, sizeof dir), DT_OK);
    snprintf(p, sizeof p, "%s/COMPLETE", dir);
    assert_int_equal(unlink(p), 0);
    dt_ckpt_reader_t *r = (void *)1;
    assert_int_equal(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    assert_null(r);
    char want[800];
    snprintf(want, sizeof want, "checkpoint '%s': incomplete (no COMPLETE "
             "marker): the write was interrupted", dir);
    assert_msg_has(want);
    /* latest skips it */
    uint64_t step;
    assert_int_equal(dt_ckpt_latest(root, p, sizeof p, &step), DT_OK);
    assert_int_equal(step, 100);
    check_ckpt(p, 100, 1);
}

void test_missing_and_truncated_shard(void **state)
{
    char root[512], dir[600], p[700];
    subdir(root, sizeof root, "shard");
    assert_int_equal(save(root, 300, 1), DT_OK);
    assert_int_equal(dt_ckpt_step_dir(root, 300, 0, dir, sizeof dir), DT_OK);
    dt_ckpt_reader_t *r;

    snprintf(p, sizeof p, "%s/shard-00000.bin", dir);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(truncate(p, st.st_size - 4), 0);
    assert_int_equal(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    char want[900];
    snprintf(want, sizeof want, "checkpoint '%s': shard-00000.bin: the "
             "manifest says %lld bytes but the file has %lld bytes", dir,
             (long long)st.st_size, (long long)st.st_size - 4);
    assert_msg_has(want);

    assert_int_equal(save(root, 300, 1), DT_OK); /* a fresh, good copy */
    snprintf(p, sizeof p, "%s/shard-00002.bin", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    snprintf(want, sizeof want, "checkpoint '%s': shard-00002.bin: No such "
             "file or directory", dir);
    assert_msg_has(want);
}

static void edit_gap(cJSON *j)
{
    cJSON *c = cJSON_GetObjectItem(first_seg(j, "embedding/params"), "count");
    cJSON_SetNumberValue(c, c->valuedouble - 1);
}

static void edit_version(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(j, "format_version"), 3);
}

static void edit_file_name(cJSON *j)
{
    cJSON *f = cJSON_GetObjectItem(first_seg(j, "block.0/params"), "file");
    cJSON_SetValuestring(f, "shard-00009.bin");
}

static void edit_path_escape(cJSON *j)
{
    cJSON *files = cJSON_GetObjectItem(j, "files");
    cJSON_AddItemToObject(files, "../x", cJSON_Parse("{\"bytes\": 1}"));
}

static void edit_seg_past_file(cJSON *j)
{
    cJSON *b = cJSON_GetObjectItem(first_seg(j, "block.0/params"),
                                   "byte_offset");
    cJSON_SetNumberValue(b, b->valuedouble + 1e6);
}

static void edit_dup_segment(cJSON *j)
{
    cJSON *e = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "entries"),
                                   "embedding/params");
    cJSON_AddItemToArray(cJSON_GetObjectItem(e, "segments"),
                         cJSON_Duplicate(first_seg(j, "embedding/params"), 1));
}

void test_manifest_inconsistent(void **state)
{
    struct {
        void (*edit)(cJSON *);
        const char *msg;
    } cases[] = {
        {edit_gap, "manifest.json: entry embedding/params: elements [333, 334) "
                   "are in no segment"},
        {edit_version, "manifest.json: format_version 3 is newer than this "
                       "dtrain reads (2)"},
        {edit_file_name, "manifest.json: segment file 'shard-00009.bin' is not "
                         "listed in \"files\""},
        {edit_path_escape, "manifest.json: file name '../x' is not a plain "
                           "file name"},
        {edit_seg_past_file, "manifest.json: entry block.0/params: segment 0 "
                             "needs bytes"},
        /* the shards hold 4 x 1000 + 4 x 3 x 777 + 8 x 5 bytes */
        {edit_dup_segment, "manifest.json: its segments hold more bytes in all "
                           "than the shard files' 13364: some of them share "
                           "bytes"},
    };
    char root[512], dir[600];
    subdir(root, sizeof root, "manifest");
    assert_int_equal(dt_ckpt_step_dir(root, 1, 0, dir, sizeof dir), DT_OK);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_int_equal(save(root, 1, 1), DT_OK);
        edit_manifest(dir, cases[i].edit);
        dt_ckpt_reader_t *r;
        assert_int_equal(dt_ckpt_open(dir, &r), DT_ERR_DATA);
        char want[900];
        snprintf(want, sizeof want, "checkpoint '%s': %s", dir, cases[i].msg);
        assert_msg_has(want);
    }
    /* not JSON at all */
    char p[700];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    assert_int_equal(dt_fileutil_write_atomic(p, "{\"format\": ", 11), DT_OK);
    reseal(dir);
    dt_ckpt_reader_t *r;
    assert_int_equal(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    assert_msg_has("manifest.json: not valid JSON");
}

/* ---- the manifest's checksum and tensor table ------------------------ */

static void edit_step(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(j, "step"), 2);
}

/* manifest.json edited (or rotted) after the save, with COMPLETE not
 * rewritten to match: caught, naming the file, before anything in it is
 * believed.  An older dtrain's marker (no checksum) still loads, warned. */
void test_manifest_checksum(void **state)
{
    char root[512], dir[600], p[700], want[1200];
    subdir(root, sizeof root, "sum");
    assert_ok(save(root, 1, 1));
    assert_ok(dt_ckpt_step_dir(root, 1, 0, dir, sizeof dir));
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    char *text;
    size_t n;
    assert_ok(dt_fileutil_read_all(p, &text, &n));
    uint32_t crc = dt_fileutil_crc32(0, text, n);
    free(text);

    rewrite_manifest(dir, edit_step, 0); /* valid JSON, consistent, edited */
    assert_ok(dt_fileutil_read_all(p, &text, &n));
    uint32_t now = dt_fileutil_crc32(0, text, n);
    size_t now_n = n;
    free(text);
    dt_ckpt_reader_t *r = (void *)1;
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    assert_null(r);
    /* the marker still records the saved manifest's size and CRC */
    snprintf(p, sizeof p, "%s/COMPLETE", dir);
    assert_ok(dt_fileutil_read_all(p, &text, &n));
    unsigned long long rec_n = 0;
    unsigned rec_crc = 0;
    assert_int_equal(sscanf(text, "dtrain checkpoint complete\nmanifest.json "
                            "%llu bytes crc32 %8x\n", &rec_n, &rec_crc), 2);
    free(text);
    assert_int_equal(rec_crc, crc);
    snprintf(want, sizeof want, "checkpoint '%s': manifest.json: checksum "
             "mismatch (COMPLETE records %llu bytes with crc32 %08x, the file "
             "has %zu bytes with crc32 %08x): it was edited or damaged after "
             "the save", dir, rec_n, crc, now_n, now);
    assert_msg(want);

    /* a marker this dtrain did not write */
    assert_ok(dt_fileutil_write_atomic(p, "done\n", 5));
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    snprintf(want, sizeof want, "checkpoint '%s': COMPLETE: not a completion "
             "marker this dtrain reads", dir);
    assert_msg(want);
    assert_ok(dt_fileutil_write_atomic(p, "dtrain checkpoint complete\n"
                                       "manifest.json 12 bytes crc32 0000000g\n", 65));
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    assert_msg(want);

    /* an older dtrain's marker: loads, with a warning */
    assert_ok(dt_fileutil_write_atomic(p, "dtrain checkpoint complete\n", 27));
    dt_test_stderr_begin();
    int rc = dt_ckpt_open(dir, &r);
    char *log = dt_test_stderr_end();
    assert_ok(rc);
    assert_int_equal(dt_ckpt_reader_step(r), 2);
    dt_ckpt_close(r);
    snprintf(want, sizeof want, "ckpt: warning: checkpoint '%s': COMPLETE holds "
             "no checksum of manifest.json (written by an older dtrain): the "
             "manifest is checked for consistency only\n", dir);
    if (!strstr(log, want))
        fail_msg("log\n  got:   %s\n  lacks: %s", log, want);
    free(log);
}

/* Files of a checkpoint that a save never makes: a link in place of a
 * shard or the manifest, a FIFO (which would block open forever). */
void test_ckpt_members_not_regular(void **state)
{
    char root[512], dir[600], p[700], q[800], want[1200];
    subdir(root, sizeof root, "members");
    assert_ok(save(root, 1, 1));
    assert_ok(dt_ckpt_step_dir(root, 1, 0, dir, sizeof dir));
    dt_ckpt_reader_t *r;

    /* shard-00001.bin a link to an identical copy: still refused */
    snprintf(p, sizeof p, "%s/shard-00001.bin", dir);
    snprintf(q, sizeof q, "%s/copy.bin", root);
    assert_int_equal(rename(p, q), 0);
    assert_int_equal(symlink(q, p), 0);
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_IO);
    snprintf(want, sizeof want, "checkpoint '%s': shard-00001.bin: a symbolic "
             "link, refused", dir);
    assert_msg(want);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(rename(q, p), 0);
    check_ckpt(dir, 1, 1);

    /* manifest.json a FIFO */
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    dt_test_deadline(10, "opening a checkpoint whose manifest is a FIFO blocked");
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_IO);
    dt_test_deadline(0, NULL);
    snprintf(want, sizeof want, "checkpoint '%s': manifest.json: not a regular "
             "file (a FIFO)", dir);
    assert_msg(want);
}

/* Without COMPLETE a checkpoint is never loaded, but offline tools may
 * read it after a warning that it may be partial. */
void test_open_incomplete_warns(void **state)
{
    char root[512], dir[600], p[700], want[1200];
    subdir(root, sizeof root, "partial");
    assert_ok(save(root, 5, 5));
    assert_ok(dt_ckpt_step_dir(root, 5, 0, dir, sizeof dir));
    snprintf(p, sizeof p, "%s/COMPLETE", dir);
    assert_int_equal(unlink(p), 0);
    dt_ckpt_reader_t *r;
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    dt_test_stderr_begin();
    int rc = dt_ckpt_open_flags(dir, DT_CKPT_OPEN_INCOMPLETE, &r);
    char *log = dt_test_stderr_end();
    assert_ok(rc);
    assert_int_equal(dt_ckpt_verify(r), DT_OK);
    dt_ckpt_close(r);
    snprintf(want, sizeof want, "ckpt: warning: checkpoint '%s' has no COMPLETE "
             "marker: it may be partial (a save that was interrupted), and "
             "manifest.json has no checksum to be checked against; reading it "
             "anyway\n", dir);
    if (!strstr(log, want))
        fail_msg("log\n  got:   %s\n  lacks: %s", log, want);
    free(log);
}

/* A tensor table of 3 tensors over the save's entries: a (10, 50) and b
 * (500) tile embedding/params (1000), c (777) tiles block.0/params. */
static const char TABLE[] =
    "[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [10, 50]},"
    " {\"name\": \"b\", \"unit\": \"embedding\", \"offset\": 500, \"shape\": [500]},"
    " {\"name\": \"c\", \"unit\": \"block.0\", \"offset\": 0, \"shape\": [777]}]";
static const char *g_table;

static void edit_table(cJSON *j)
{
    cJSON *m = cJSON_GetObjectItem(j, "model");
    cJSON_DeleteItemFromObject(m, "tensors");
    cJSON_AddItemToObject(m, "tensors", cJSON_Parse(g_table));
}

void test_tensor_table(void **state)
{
    char root[512], dir[600], want[1200];
    subdir(root, sizeof root, "tensors");
    assert_ok(dt_ckpt_step_dir(root, 1, 0, dir, sizeof dir));
    assert_ok(save(root, 1, 1));
    g_table = TABLE;
    edit_manifest(dir, edit_table);
    dt_ckpt_reader_t *r;
    assert_ok(dt_ckpt_open(dir, &r));
    assert_true(dt_ckpt_has_tensors(r));
    assert_int_equal(dt_ckpt_n_tensors(r), 3);
    const dt_ckpt_tensor_t *t = dt_ckpt_tensor_at(r, 0); /* manifest order */
    assert_string_equal(t->name, "a");
    assert_string_equal(t->entry, "embedding/params");
    assert_int_equal(t->numel, 500);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], 50);
    assert_ptr_equal(dt_ckpt_find_tensor(r, "c"), dt_ckpt_tensor_at(r, 2));
    assert_null(dt_ckpt_find_tensor(r, "d"));
    dt_ckpt_close(r);

    struct {
        const char *table, *msg;
    } cases[] = {
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [10, 50]},"
         " {\"name\": \"b\", \"unit\": \"embedding\", \"offset\": 499, \"shape\": [501]},"
         " {\"name\": \"c\", \"unit\": \"block.0\", \"offset\": 0, \"shape\": [777]}]",
         "entry embedding/params: tensors overlap at elements [499, 500) (a and b); "
         "indices [4, 99] to [4, 99] of its shape [10, 100]"},
        {"[]", "entry embedding/params: elements [0, 1000) are in no tensor; "
               "indices [0, 0] to [9, 99] of its shape [10, 100]"},
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [10, 49]},"
         " {\"name\": \"b\", \"unit\": \"embedding\", \"offset\": 500, \"shape\": [500]},"
         " {\"name\": \"c\", \"unit\": \"block.0\", \"offset\": 0, \"shape\": [777]}]",
         "entry embedding/params: elements [490, 500) are in no tensor; "
         "indices [4, 90] to [4, 99] of its shape [10, 100]"},
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [10, 50]},"
         " {\"name\": \"b\", \"unit\": \"embedding\", \"offset\": 500, \"shape\": [500]},"
         " {\"name\": \"c\", \"unit\": \"block.0\", \"offset\": 1, \"shape\": [777]}]",
         "tensor c: elements [1, 778) lie outside entry block.0/params (777 elements)"},
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [10, 50]},"
         " {\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 500, \"shape\": [500]}]",
         "tensor a listed twice"},
        {"[{\"name\": \"c\", \"unit\": \"nope\", \"offset\": 0, \"shape\": [777]}]",
         "tensor c: no entry nope/params"},
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [0, 50]}]",
         "tensor a: bad \"shape\" (dimensions are whole numbers >= 1, their product at most "
         "2^53)"},
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"shape\": [10]}]",
         "tensor 0 of \"model\".\"tensors\" lacks a name, a unit, an offset or a shape of 1 "
         "to 8 dimensions"},
        {"{}", "\"model\".\"tensors\" is not an array"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_ok(save(root, 1, 1));
        g_table = cases[i].table;
        edit_manifest(dir, edit_table);
        r = (void *)1;
        assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
        assert_null(r);
        snprintf(want, sizeof want, "checkpoint '%s': manifest.json: %s", dir,
                 cases[i].msg);
        assert_msg(want);
    }
}

void test_manifest_writer_checks(void **state)
{
    char root[512], tmp[600];
    subdir(root, sizeof root, "wcheck");
    assert_int_equal(dt_ckpt_begin(root, 7, tmp, sizeof tmp), DT_OK);
    dt_ckpt_entry_t e[1] = {{.name = "u/params", .dtype = DT_F32, .numel = 10}};
    dt_ckpt_seg_t s[2] = {
        {.entry = "u/params", .offset = 0, .count = 6, .dtype = DT_F32},
        {.entry = "u/params", .offset = 5, .count = 5, .dtype = DT_F32,
         .shard = 1},
    };
    dt_ckpt_info_t info = {.step = 7};
    assert_int_equal(dt_ckpt_write_manifest(tmp, &info, e, 1, s, 2),
                     DT_ERR_INVALID);
    assert_msg_has("entry u/params: segments overlap at elements [5, 6)");
    s[1].offset = 7;
    s[1].count = 3;
    assert_int_equal(dt_ckpt_write_manifest(tmp, &info, e, 1, s, 2),
                     DT_ERR_INVALID);
    assert_msg_has("entry u/params: elements [6, 7) are in no segment");
    s[1].offset = 6;
    s[1].count = 3;
    assert_int_equal(dt_ckpt_write_manifest(tmp, &info, e, 1, s, 2),
                     DT_ERR_INVALID);
    assert_msg_has("entry u/params: elements [9, 10) are in no segment");
    s[1].count = 4;
    s[1].dtype = DT_BF16;
    assert_int_equal(dt_ckpt_write_manifest(tmp, &info, e, 1, s, 2),
                     DT_ERR_INVALID);
    assert_msg_has("entry u/params is f32 but shard 1 wrote it as bf16");
    s[1].dtype = DT_F32;
    snprintf(s[1].entry, sizeof s[1].entry, "v/params");
    assert_int_equal(dt_ckpt_write_manifest(tmp, &info, e, 1, s, 2),
                     DT_ERR_INVALID);
    assert_msg_has("segment of undeclared entry 'v/params' in shard 1");
    /* commit refuses a directory without a manifest */
    assert_int_equal(dt_ckpt_commit(root, 7), DT_ERR_INVALID);
    assert_msg_has("commit without a manifest");

    /* shard writer misuse */
    dt_ckpt_writer_t *w;
    assert_int_equal(dt_ckpt_shard_open(tmp, 0, &w), DT_OK);
    float x[4] = {1, 2, 3, 4};
    assert_int_equal(dt_ckpt_shard_begin(w, "u/params", DT_F32, 0, 2), DT_OK);
    assert_int_equal(dt_ckpt_shard_append(w, x, 12), DT_ERR_INVALID);
    assert_msg_has("shard-00000.bin: 12 bytes appended outside a segment or past "
               "its end (8 left)");
    assert_int_equal(dt_ckpt_shard_append(w, x, 4), DT_OK);
    assert_int_equal(dt_ckpt_shard_end(w), DT_ERR_INVALID);
    assert_msg_has("segment ended with 4 bytes still expected");
    dt_ckpt_shard_abort(w);

    /* an empty range is accepted and stores nothing */
    assert_int_equal(dt_ckpt_shard_open(tmp, 0, &w), DT_OK);
    assert_int_equal(shard_write(w, "u/params", DT_F32, 3, 0, x), DT_OK);
    assert_int_equal(shard_write(w, "u/params", DT_F32, 0, 4, x), DT_OK);
    dt_ckpt_seg_t *out;
    size_t n_out;
    assert_int_equal(dt_ckpt_shard_close(w, &out, &n_out), DT_OK);
    assert_int_equal(n_out, 1);
    assert_int_equal(out[0].count, 4);
    assert_int_equal(out[0].byte_offset, 0);
    assert_int_equal(out[0].crc32, dt_fileutil_crc32(0, x, sizeof x));
    free(out);
    assert_int_equal(dt_ckpt_abort(root, 7), DT_OK);
    dt_test_assert_no_tmp(root);
}

/* Assert that `log` (captured stderr) has the warning about `name` under
 * `root`, ending in `why`. */
static void assert_ignored(const char *log, const char *root, const char *name,
                           const char *why)
{
    char want[900];
    snprintf(want, sizeof want, "ckpt: warning: checkpoint folder '%s': "
             "ignoring '%s': %s\n", root, name, why);
    if (!strstr(log, want))
        fail_msg("log\n  got:   %s\n  lacks: %s", log, want);
}

/* A step name that is not a real directory of ours (a link to another
 * run's checkpoint, a file, another user's directory) is neither the
 * latest nor pruned, and removal never reaches through a link: pruning
 * with keep = 1 leaves the other run whole. */
void test_links_in_ckpt_root(void **state)
{
    char other[512], root[512], target[600], p[700], q[800];
    subdir(other, sizeof other, "other_run");
    subdir(root, sizeof root, "linked_run");
    assert_ok(save(other, 1, 7));
    assert_ok(save(root, 2, 2));
    assert_ok(save(root, 3, 3));
    assert_ok(dt_ckpt_step_dir(other, 1, 0, target, sizeof target));
    /* links at an older and at a newer step than ours, a file at another */
    snprintf(p, sizeof p, "%s/step-00000001", root);
    assert_int_equal(symlink(target, p), 0);
    snprintf(p, sizeof p, "%s/step-00000009", root);
    assert_int_equal(symlink(target, p), 0);
    snprintf(p, sizeof p, "%s/step-00000008", root);
    assert_ok(dt_fileutil_write_atomic(p, "x", 1));
    /* inside our step 2, which keep = 1 prunes: links to the other run's
     * directory and to its shard */
    snprintf(p, sizeof p, "%s/step-00000002/elsewhere", root);
    assert_int_equal(symlink(target, p), 0);
    snprintf(p, sizeof p, "%s/step-00000002/shard-link", root);
    snprintf(q, sizeof q, "%s/shard-00000.bin", target);
    assert_int_equal(symlink(q, p), 0);

    char dir[700];
    uint64_t step = 0;
    dt_test_stderr_begin();
    int rc = dt_ckpt_latest(root, dir, sizeof dir, &step);
    char *log = dt_test_stderr_end();
    assert_ok(rc);
    assert_int_equal(step, 3);
    assert_ignored(log, root, "step-00000009", "a symbolic link, not a directory");
    assert_ignored(log, root, "step-00000001", "a symbolic link, not a directory");
    assert_ignored(log, root, "step-00000008", "not a directory");
    free(log);

    dt_test_stderr_begin();
    rc = dt_ckpt_prune(root, 1);
    free(dt_test_stderr_end());
    assert_ok(rc);
    check_ckpt(target, 1, 7); /* the other run: COMPLETE, shard and all */
    snprintf(p, sizeof p, "%s/step-00000002", root);
    assert_int_equal(access(p, F_OK), -1);
    snprintf(p, sizeof p, "%s/step-00000003", root);
    check_ckpt(p, 3, 3);
    const char *links[] = {"step-00000001", "step-00000009"};
    for (int i = 0; i < 2; i++) {
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", root, links[i]);
        assert_int_equal(lstat(p, &st), 0);
        assert_true(S_ISLNK(st.st_mode));
    }

    /* startup cleanup removes a leftover name that is a link as a link */
    snprintf(p, sizeof p, "%s/step-00000004.tmp", root);
    assert_int_equal(symlink(target, p), 0);
    assert_ok(dt_ckpt_clean_stale(root));
    struct stat st;
    assert_int_equal(lstat(p, &st), -1);
    check_ckpt(target, 1, 7);

    /* another user's directory, complete and newest (needs root to make) */
    if (geteuid() == 0) {
        assert_ok(save(root, 10, 10));
        snprintf(p, sizeof p, "%s/step-00000010", root);
        assert_int_equal(chown(p, 65534, 65534), 0);
        dt_test_stderr_begin();
        rc = dt_ckpt_latest(root, dir, sizeof dir, &step);
        log = dt_test_stderr_end();
        assert_ok(rc);
        assert_int_equal(step, 3);
        assert_ignored(log, root, "step-00000010",
                       "owned by uid 65534, not by this user (uid 0)");
        free(log);
    }
}
