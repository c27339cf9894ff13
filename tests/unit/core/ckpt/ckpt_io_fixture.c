/*
 * tests/unit/core/ckpt/ckpt_io_fixture.c - what test_ckpt_io's files share
 * (ckpt_io_test.h): the test's folder, the 3-rank checkpoint (its entries,
 * values, save and full check), editing a saved manifest (and resealing
 * COMPLETE over it), and a 2-D block.
 */
#include "ckpt_io_test.h"

char g_dir[256];

/* A fresh folder under g_dir for one test. */
void subdir(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
    assert_int_equal(dt_fileutil_rm_rf(buf), DT_OK);
    assert_int_equal(dt_fileutil_mkdir_p(buf), DT_OK);
}

/* ---- a 3-rank checkpoint --------------------------------------------- */

static const ent_spec_t ENTS[] = {
    {"embedding/params", DT_F32, 1000, 2, {10, 100}},
    {"block.0/params", DT_F32, 777, 0, {0}},
    {"block.0/exp_avg", DT_F32, 777, 0, {0}},
    {"block.0/exp_avg_sq", DT_F32, 777, 0, {0}},
    {"head/counter", DT_I64, 5, 1, {5}},
    {"empty/params", DT_F32, 0, 0, {0}},
};
#define N_ENTS (sizeof ENTS / sizeof *ENTS)

/* Element i of entry e for a save made with `seed`: exact in f32. */
static float fval(size_t e, uint64_t i, int seed)
{
    return (float)seed * 0.5f + (float)e * 1000.0f + (float)i * 0.25f;
}

static int64_t ival(size_t e, uint64_t i, int seed)
{
    return (int64_t)seed * 1000000000000LL + (int64_t)e * 1000 + (int64_t)i;
}

void fill(size_t e, uint64_t off, uint64_t n, int seed, void *dst)
{
    for (uint64_t i = 0; i < n; i++) {
        if (ENTS[e].dtype == DT_F32)
            ((float *)dst)[i] = fval(e, off + i, seed);
        else
            ((int64_t *)dst)[i] = ival(e, off + i, seed);
    }
}

/* Rank r's range of an entry of n elements: odd, uneven cuts. */
void rank_range(uint64_t n, int r, uint64_t *off, uint64_t *cnt)
{
    uint64_t c1 = n / 3 + 1, c2 = 2 * n / 3 > 1 ? 2 * n / 3 - 1 : 0;
    if (c1 > n)
        c1 = n;
    if (c2 < c1)
        c2 = c1;
    uint64_t cut[4] = {0, c1, c2, n};
    *off = cut[r];
    *cnt = cut[r + 1] - cut[r];
}

/* One whole segment through the streamed writer in a single piece. */
int shard_write(dt_ckpt_writer_t *w, const char *entry, int dtype, uint64_t offset,
                uint64_t count, const void *data)
{
    int rc = dt_ckpt_shard_begin(w, entry, dtype, offset, count);
    if (!rc)
        rc = dt_ckpt_shard_append(w, data, (size_t)(count * dt_dtype_size(dtype)));
    if (!rc)
        rc = dt_ckpt_shard_end(w);
    return rc;
}

/* A u64 of the manifest's "extra": dt_ckpt_json_add_u64's decimal string,
 * or a plain JSON number. */
uint64_t json_u64(const cJSON *o, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(it))
        return (uint64_t)it->valuedouble;
    if (!cJSON_IsString(it))
        fail_msg("'%s' is neither a number nor a string", key);
    char *end;
    unsigned long long v = strtoull(it->valuestring, &end, 10);
    if (*end || !it->valuestring[0])
        fail_msg("'%s' = \"%s\" is not a decimal integer", key, it->valuestring);
    return v;
}

static int write_seg(dt_ckpt_writer_t *w, size_t e, uint64_t off, uint64_t cnt,
                     int seed)
{
    size_t es = dt_dtype_size(ENTS[e].dtype);
    char *buf = malloc(cnt * es);
    fill(e, off, cnt, seed, buf);
    int rc;
    if (cnt > 10) { /* streamed in two uneven pieces */
        rc = dt_ckpt_shard_begin(w, ENTS[e].name, ENTS[e].dtype, off, cnt);
        if (!rc)
            rc = dt_ckpt_shard_append(w, buf, 7 * es + 3);
        if (!rc)
            rc = dt_ckpt_shard_append(w, buf + 7 * es + 3, cnt * es - 7 * es - 3);
        if (!rc)
            rc = dt_ckpt_shard_end(w);
    } else {
        rc = shard_write(w, ENTS[e].name, ENTS[e].dtype, off, cnt, buf);
    }
    free(buf);
    return rc;
}

/* One rank's shard: rank 1 writes entries in order, rank 2 in reverse with
 * each range split in two segments (second half first), rank 0 in order. */
static int write_rank(const char *tmp, int r, int seed, dt_ckpt_seg_t **segs,
                      size_t *n)
{
    dt_ckpt_writer_t *w;
    int rc = dt_ckpt_shard_open(tmp, (uint32_t)r, &w);
    if (rc)
        return rc;
    for (size_t k = 0; k < N_ENTS && !rc; k++) {
        size_t e = r == 2 ? N_ENTS - 1 - k : k;
        uint64_t off, cnt;
        rank_range(ENTS[e].numel, r, &off, &cnt); /* may be empty */
        if (r == 2 && cnt > 1) {
            uint64_t h = cnt / 2;
            rc = write_seg(w, e, off + h, cnt - h, seed);
            if (!rc)
                rc = write_seg(w, e, off, h, seed);
        } else {
            rc = write_seg(w, e, off, cnt, seed);
        }
    }
    if (rc) {
        dt_ckpt_shard_abort(w);
        return rc;
    }
    return dt_ckpt_shard_close(w, segs, n);
}

static void entries_decl(dt_ckpt_entry_t *out)
{
    memset(out, 0, N_ENTS * sizeof *out);
    for (size_t e = 0; e < N_ENTS; e++) {
        snprintf(out[e].name, sizeof out[e].name, "%s", ENTS[e].name);
        out[e].dtype = ENTS[e].dtype;
        out[e].numel = ENTS[e].numel;
        out[e].ndim = ENTS[e].ndim;
        out[e].shape[0] = ENTS[e].shape[0];
        out[e].shape[1] = ENTS[e].shape[1];
    }
}

/* The whole save as the lead's loop will drive it; on failure the tmp dir
 * is aborted and the status returned (message kept). */
int save(const char *root, uint64_t step, int seed)
{
    char tmp[600];
    int rc = dt_ckpt_begin(root, step, tmp, sizeof tmp);
    if (rc)
        return rc;
    dt_ckpt_seg_t *all = NULL;
    size_t n_all = 0;
    for (int r = 0; r < RANKS && !rc; r++) {
        dt_ckpt_seg_t *segs;
        size_t n;
        rc = write_rank(tmp, r, seed, &segs, &n);
        if (rc)
            break;
        /* "gather": the descriptors travel as plain bytes */
        all = realloc(all, (n_all + n) * sizeof *all);
        memcpy(all + n_all, segs, n * sizeof *segs);
        n_all += n;
        free(segs);
    }
    if (!rc) {
        dt_ckpt_entry_t ents[N_ENTS];
        entries_decl(ents);
        cJSON *model = cJSON_CreateObject();
        cJSON_AddStringToObject(model, "arch", "gpt2");
        cJSON_AddNumberToObject(model, "n_layer", 1);
        cJSON *extra = cJSON_CreateObject();
        dt_ckpt_json_add_u64(extra, "rng", UINT64_MAX - (uint64_t)seed);
        cJSON_AddNumberToObject(extra, "seed", seed);
        dt_ckpt_info_t info = {.step = step, .world_size = RANKS,
                               .strategy = "zero", .model = model,
                               .extra = extra};
        rc = dt_ckpt_write_manifest(tmp, &info, ents, N_ENTS, all, n_all);
        cJSON_Delete(model);
        cJSON_Delete(extra);
    }
    free(all);
    if (!rc)
        rc = dt_ckpt_commit(root, step);
    if (rc) {
        char keep[DT_ERR_MAX];
        snprintf(keep, sizeof keep, "%s", dt_last_error());
        assert_int_equal(dt_ckpt_abort(root, step), DT_OK);
        dt_err_set(rc, "%s", keep);
    }
    return rc;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Every entry fully and 300 random ranges match the values of `seed`. */
void check_ckpt(const char *dir, uint64_t step, int seed)
{
    dt_ckpt_reader_t *r;
    if (dt_ckpt_open(dir, &r) != DT_OK)
        fail_msg("open %s: %s", dir, dt_last_error());
    assert_int_equal(dt_ckpt_reader_step(r), step);
    assert_int_equal(dt_ckpt_reader_world_size(r), RANKS);
    assert_string_equal(dt_ckpt_reader_strategy(r), "zero");
    const cJSON *arch = cJSON_GetObjectItem(dt_ckpt_reader_model(r), "arch");
    assert_true(cJSON_IsString(arch));
    assert_string_equal(arch->valuestring, "gpt2");
    assert_true(json_u64(dt_ckpt_reader_extra(r), "rng") == UINT64_MAX - (uint64_t)seed);
    assert_int_equal(json_u64(dt_ckpt_reader_extra(r), "seed"), seed);
    assert_int_equal(dt_ckpt_n_entries(r), N_ENTS);
    for (size_t e = 0; e < N_ENTS; e++) {
        const dt_ckpt_entry_t *ce = dt_ckpt_entry_at(r, e);
        assert_string_equal(ce->name, ENTS[e].name); /* manifest order kept */
        assert_int_equal(ce->dtype, ENTS[e].dtype);
        assert_int_equal(ce->numel, ENTS[e].numel);
        assert_int_equal(ce->ndim, ENTS[e].ndim);
        if (ce->ndim)
            assert_int_equal(ce->shape[0], ENTS[e].shape[0]);
        assert_ptr_equal(dt_ckpt_find(r, ENTS[e].name), ce);
    }
    assert_null(dt_ckpt_find(r, "nope"));
    uint64_t s = 88172645463325252ull + (uint64_t)seed;
    for (int k = -(int)N_ENTS; k < 300; k++) {
        size_t e = k < 0 ? (size_t)(k + (int)N_ENTS) : rnd(&s) % N_ENTS;
        uint64_t n = ENTS[e].numel, off = 0, cnt = n;
        if (k >= 0 && n > 0) {
            off = rnd(&s) % n;
            cnt = rnd(&s) % (n - off + 1);
        }
        size_t es = dt_dtype_size(ENTS[e].dtype);
        char *got = malloc(cnt * es + 1), *want = malloc(cnt * es + 1);
        fill(e, off, cnt, seed, want);
        if (dt_ckpt_read(r, ENTS[e].name, off, cnt, got) != DT_OK)
            fail_msg("read %s [%llu,+%llu): %s", ENTS[e].name,
                     (unsigned long long)off, (unsigned long long)cnt,
                     dt_last_error());
        if (memcmp(got, want, cnt * es) != 0)
            fail_msg("%s [%llu,+%llu) differs", ENTS[e].name,
                     (unsigned long long)off, (unsigned long long)cnt);
        free(got);
        free(want);
    }
    float x;
    assert_int_equal(dt_ckpt_read(r, "block.0/params", 777, 1, &x),
                     DT_ERR_INVALID);
    assert_msg_has("entry block.0/params: range [777, +1) is outside its 777 "
               "elements");
    assert_int_equal(dt_ckpt_read(r, "nope", 0, 1, &x), DT_ERR_NOT_FOUND);
    assert_int_equal(dt_ckpt_verify(r), DT_OK);
    dt_ckpt_close(r);
}

/* Write COMPLETE as a save does, vouching for manifest.json as it now is
 * (size and zlib CRC-32), so a test's edit reaches the manifest checks. */
void reseal(const char *dir)
{
    char p[700], marker[128];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    char *text;
    size_t n;
    assert_ok(dt_fileutil_read_all(p, &text, &n));
    int mn = snprintf(marker, sizeof marker, "dtrain checkpoint complete\n"
                      "manifest.json %zu bytes crc32 %08x\n", n,
                      (unsigned)dt_fileutil_crc32(0, text, n));
    free(text);
    snprintf(p, sizeof p, "%s/COMPLETE", dir);
    assert_ok(dt_fileutil_write_atomic(p, marker, (size_t)mn));
}

/* Rewrite manifest.json through `edit`, then COMPLETE when `sealed`. */
void rewrite_manifest(const char *dir, void (*edit)(cJSON *), int sealed)
{
    char p[700];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    char *text;
    size_t n;
    assert_int_equal(dt_fileutil_read_all(p, &text, &n), DT_OK);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    edit(j);
    text = cJSON_Print(j);
    assert_int_equal(dt_fileutil_write_atomic(p, text, strlen(text)), DT_OK);
    cJSON_free(text);
    cJSON_Delete(j);
    if (sealed)
        reseal(dir);
}

void edit_manifest(const char *dir, void (*edit)(cJSON *))
{
    rewrite_manifest(dir, edit, 1);
}

cJSON *first_seg(cJSON *j, const char *entry)
{
    cJSON *e = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "entries"), entry);
    return cJSON_GetArrayItem(cJSON_GetObjectItem(e, "segments"), 0);
}

/* A 2-D block: rows r0..r0+nr, columns c0..c0+nc of an [r, c] entry at base. */
dt_ckpt_block_t blk2(uint64_t base, uint64_t r, uint64_t c, uint64_t r0,
                     uint64_t nr, uint64_t c0, uint64_t nc)
{
    return (dt_ckpt_block_t){.base = base, .ndim = 2, .shape = {r, c},
                             .start = {r0, c0}, .size = {nr, nc}};
}
