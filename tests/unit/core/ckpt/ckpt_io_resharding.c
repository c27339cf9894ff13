/*
 * tests/unit/core/ckpt/ckpt_io_resharding.c - block shards (tensor-parallel
 * layouts): blocks saved and read back as ranges, ranges read as blocks, and
 * every inconsistent block manifest refused with its message.
 */
#include "ckpt_io_test.h"

/* ---- block shards (tensor-parallel layouts) -------------------------- */

/* The entries of the block saves: block.0/params holds a tensor table
 * (w_col [6, 10] at 0, w_row [10, 6] at 60, bias [7] at 120), head/w is
 * a [8, 5] entry of its own shape, ln/x a [3, 4, 5] one. */
static const ent_spec_t BENTS[] = {
    {"block.0/params", DT_F32, 127, 0, {0}},
    {"head/w", DT_F32, 40, 2, {8, 5}},
    {"ln/x", DT_F32, 60, 0, {0}}, /* shape [3, 4, 5] set in bents_decl */
};
#define N_BENTS (sizeof BENTS / sizeof *BENTS)
static const char BTABLE[] =
    "[{\"name\": \"w_col\", \"unit\": \"block.0\", \"offset\": 0, \"shape\": [6, 10]},"
    " {\"name\": \"w_row\", \"unit\": \"block.0\", \"offset\": 60, \"shape\": [10, 6]},"
    " {\"name\": \"bias\", \"unit\": \"block.0\", \"offset\": 120, \"shape\": [7]}]";

/* Element i of BENTS entry e: exact in f32. */
static float bval(size_t e, uint64_t i)
{
    return (float)e * 1000.0f + (float)i * 0.5f + 0.25f;
}

/* One piece a rank saves: a block (b.ndim > 0) or the flat range
 * [off, off + cnt). */
typedef struct {
    int rank;
    size_t e;
    uint64_t off, cnt;
    dt_ckpt_block_t b;
} bpiece_t;

static dt_ckpt_block_t blk3(uint64_t a0, uint64_t na, uint64_t b0, uint64_t nb,
                            uint64_t c0, uint64_t nc)
{
    return (dt_ckpt_block_t){.base = 0, .ndim = 3, .shape = {3, 4, 5},
                             .start = {a0, b0, c0}, .size = {na, nb, nc}};
}

/* The global element of the k-th (row-major) element of block b, computed
 * the slow way: unravel k over the sizes, ravel over the shape. */
static uint64_t block_flat(const dt_ckpt_block_t *b, uint64_t k)
{
    uint64_t idx[DT_CKPT_MAX_DIMS], at = 0;
    for (int d = b->ndim - 1; d >= 0; d--) {
        idx[d] = k % b->size[d];
        k /= b->size[d];
    }
    for (int d = 0; d < b->ndim; d++)
        at = at * b->shape[d] + b->start[d] + idx[d];
    return b->base + at;
}

static uint64_t block_numel(const dt_ckpt_block_t *b)
{
    uint64_t n = 1;
    for (int d = 0; d < b->ndim; d++)
        n *= b->size[d];
    return n;
}

/* The piece's values, as it is stored (row-major for a block). */
static float *piece_values(const bpiece_t *p, uint64_t *n)
{
    *n = p->b.ndim > 0 ? block_numel(&p->b) : p->cnt;
    float *v = malloc((*n + 1) * sizeof *v);
    for (uint64_t k = 0; k < *n; k++)
        v[k] = bval(p->e, p->b.ndim > 0 ? block_flat(&p->b, k) : p->off + k);
    return v;
}

/* 4 ranks as a tensor-parallel save would write them: head/w in 2 x 2
 * blocks (uneven), w_col split by columns over ranks 0 and 1 (a
 * column-parallel weight), w_row by rows over ranks 2 and 3 (row-parallel:
 * each block one contiguous run), bias a flat range of rank 3, ln/x in
 * 2 x 2 blocks over its first two dimensions. */
static const bpiece_t *block_layout(size_t *n)
{
    static bpiece_t p[16];
    size_t k = 0;
    for (int r = 0; r < 4; r++) {
        uint64_t ri = (uint64_t)r / 2, ci = (uint64_t)r % 2;
        p[k++] = (bpiece_t){r, 1, 0, 0, blk2(0, 8, 5, ri ? 3 : 0, ri ? 5 : 3,
                                             ci ? 2 : 0, ci ? 3 : 2)};
        p[k++] = (bpiece_t){r, 2, 0, 0, blk3(ri ? 2 : 0, ri ? 1 : 2,
                                             ci ? 1 : 0, ci ? 3 : 1, 0, 5)};
    }
    p[k++] = (bpiece_t){0, 0, 0, 0, blk2(0, 6, 10, 0, 6, 0, 4)};
    p[k++] = (bpiece_t){1, 0, 0, 0, blk2(0, 6, 10, 0, 6, 4, 6)};
    p[k++] = (bpiece_t){2, 0, 0, 0, blk2(60, 10, 6, 0, 7, 0, 6)};
    p[k++] = (bpiece_t){3, 0, 0, 0, blk2(60, 10, 6, 7, 3, 0, 6)};
    p[k++] = (bpiece_t){3, 0, 120, 7, {0}};
    *n = k;
    return p;
}

/* 3 ranks as a data-parallel save writes them: rank_range of every entry. */
static const bpiece_t *flat_layout(size_t *n)
{
    static bpiece_t p[3 * N_BENTS];
    size_t k = 0;
    for (int r = 0; r < 3; r++)
        for (size_t e = 0; e < N_BENTS; e++) {
            p[k] = (bpiece_t){r, e, 0, 0, {0}};
            rank_range(BENTS[e].numel, r, &p[k].off, &p[k].cnt);
            k++;
        }
    *n = k;
    return p;
}

static void bents_decl(dt_ckpt_entry_t *out)
{
    memset(out, 0, N_BENTS * sizeof *out);
    for (size_t e = 0; e < N_BENTS; e++) {
        snprintf(out[e].name, sizeof out[e].name, "%s", BENTS[e].name);
        out[e].dtype = DT_F32;
        out[e].numel = BENTS[e].numel;
        out[e].ndim = BENTS[e].ndim;
        out[e].shape[0] = BENTS[e].shape[0];
        out[e].shape[1] = BENTS[e].shape[1];
    }
    out[2].ndim = 3;
    out[2].shape[0] = 3;
    out[2].shape[1] = 4;
    out[2].shape[2] = 5;
}

/* Save `pieces` as `ranks` shards, each piece streamed in two parts;
 * returns the first failure (message kept, tmp dir removed). */
static int save_pieces(const char *root, uint64_t step, const bpiece_t *p,
                       size_t n, int ranks)
{
    char tmp[600];
    int rc = dt_ckpt_begin(root, step, tmp, sizeof tmp);
    if (rc)
        return rc;
    dt_ckpt_seg_t *all = NULL;
    size_t n_all = 0;
    for (int r = 0; r < ranks && !rc; r++) {
        dt_ckpt_writer_t *w;
        if ((rc = dt_ckpt_shard_open(tmp, (uint32_t)r, &w)))
            break;
        for (size_t i = 0; i < n && !rc; i++) {
            if (p[i].rank != r)
                continue;
            uint64_t cnt;
            float *v = piece_values(&p[i], &cnt);
            const char *name = BENTS[p[i].e].name;
            rc = p[i].b.ndim > 0
                     ? dt_ckpt_shard_begin_block(w, name, DT_F32, &p[i].b)
                     : dt_ckpt_shard_begin(w, name, DT_F32, p[i].off, cnt);
            size_t half = (size_t)cnt / 2 * sizeof *v + 2;
            if (half > cnt * sizeof *v)
                half = (size_t)cnt * sizeof *v;
            if (!rc)
                rc = dt_ckpt_shard_append(w, v, half);
            if (!rc)
                rc = dt_ckpt_shard_append(w, (char *)v + half,
                                          (size_t)cnt * sizeof *v - half);
            if (!rc)
                rc = dt_ckpt_shard_end(w);
            free(v);
        }
        if (rc) {
            dt_ckpt_shard_abort(w);
            break;
        }
        dt_ckpt_seg_t *segs;
        size_t ns;
        if ((rc = dt_ckpt_shard_close(w, &segs, &ns)))
            break;
        all = realloc(all, (n_all + ns + 1) * sizeof *all);
        memcpy(all + n_all, segs, ns * sizeof *segs);
        n_all += ns;
        free(segs);
    }
    if (!rc) {
        dt_ckpt_entry_t ents[N_BENTS];
        bents_decl(ents);
        cJSON *model = cJSON_CreateObject();
        cJSON_AddStringToObject(model, "arch", "toy");
        cJSON_AddItemToObject(model, "tensors", cJSON_Parse(BTABLE));
        dt_ckpt_info_t info = {.step = step, .world_size = (uint32_t)ranks,
                               .strategy = "tensor", .model = model};
        rc = dt_ckpt_write_manifest(tmp, &info, ents, N_BENTS, all, n_all);
        cJSON_Delete(model);
    }
    free(all);
    if (!rc)
        rc = dt_ckpt_commit(root, step);
    if (rc) {
        char keep[DT_ERR_MAX];
        snprintf(keep, sizeof keep, "%s", dt_last_error());
        assert_ok(dt_ckpt_abort(root, step));
        dt_err_set(rc, "%s", keep);
    }
    return rc;
}

/* Every entry read back as the flat ranges of `ranks` even ranks is
 * bit-identical to the values saved. */
static void check_ranges(dt_ckpt_reader_t *r, int ranks)
{
    for (size_t e = 0; e < N_BENTS; e++) {
        uint64_t n = BENTS[e].numel;
        for (int k = 0; k < ranks; k++) {
            uint64_t off = n * (uint64_t)k / (uint64_t)ranks;
            uint64_t cnt = n * (uint64_t)(k + 1) / (uint64_t)ranks - off;
            float *got = malloc((cnt + 1) * sizeof *got);
            float *want = malloc((cnt + 1) * sizeof *want);
            for (uint64_t i = 0; i < cnt; i++)
                want[i] = bval(e, off + i);
            if (dt_ckpt_read(r, BENTS[e].name, off, cnt, got) != DT_OK)
                fail_msg("%d ranks: read %s [%llu, +%llu): %s", ranks,
                         BENTS[e].name, (unsigned long long)off,
                         (unsigned long long)cnt, dt_last_error());
            if (memcmp(got, want, cnt * sizeof *got) != 0)
                fail_msg("%d ranks: %s [%llu, +%llu) differs", ranks,
                         BENTS[e].name, (unsigned long long)off,
                         (unsigned long long)cnt);
            free(got);
            free(want);
        }
    }
}

/* Every piece of `p` read back as what it is (a block through
 * dt_ckpt_read_block, a range through dt_ckpt_read) is bit-identical. */
static void check_pieces(dt_ckpt_reader_t *r, const bpiece_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t cnt;
        float *want = piece_values(&p[i], &cnt);
        float *got = malloc((cnt + 1) * sizeof *got);
        const char *name = BENTS[p[i].e].name;
        int rc = p[i].b.ndim > 0 ? dt_ckpt_read_block(r, name, &p[i].b, got)
                                 : dt_ckpt_read(r, name, p[i].off, cnt, got);
        if (rc != DT_OK)
            fail_msg("piece %zu of %s: %s", i, name, dt_last_error());
        if (memcmp(got, want, cnt * sizeof *got) != 0)
            fail_msg("piece %zu of %s differs", i, name);
        free(got);
        free(want);
    }
}

/* Other block layouts than the saved one: w_col split 3 ways by rows and
 * 4 by columns (unevenly), odd sub-blocks of every tensor. */
static const bpiece_t *other_blocks(size_t *n)
{
    static bpiece_t p[16];
    size_t k = 0;
    for (uint64_t i = 0; i < 3; i++)
        p[k++] = (bpiece_t){0, 0, 0, 0, blk2(0, 6, 10, 2 * i, 2, 0, 10)};
    static const uint64_t cuts[] = {0, 1, 5, 6, 10};
    for (int i = 0; i < 4; i++)
        p[k++] = (bpiece_t){0, 0, 0, 0, blk2(0, 6, 10, 0, 6, cuts[i],
                                             cuts[i + 1] - cuts[i])};
    p[k++] = (bpiece_t){0, 0, 0, 0, blk2(60, 10, 6, 3, 5, 1, 4)};
    p[k++] = (bpiece_t){0, 1, 0, 0, blk2(0, 8, 5, 1, 6, 1, 3)};
    p[k++] = (bpiece_t){0, 1, 0, 0, blk2(0, 8, 5, 0, 8, 0, 5)};
    p[k++] = (bpiece_t){0, 2, 0, 0, blk3(1, 2, 1, 2, 2, 3)};
    p[k++] = (bpiece_t){0, 2, 0, 0, blk3(0, 3, 0, 4, 0, 5)};
    p[k++] = (bpiece_t){0, 0, 0, 0, {.base = 120, .ndim = 1, .shape = {7},
                                     .start = {2}, .size = {4}}};
    *n = k;
    return p;
}

void test_blocks_read_as_ranges(void **state)
{
    char root[512], dir[600], out[600], cdir[700];
    subdir(root, sizeof root, "blocks");
    size_t n, no;
    const bpiece_t *p = block_layout(&n);
    assert_ok(save_pieces(root, 5, p, n, 4));
    assert_ok(dt_ckpt_step_dir(root, 5, 0, dir, sizeof dir));
    dt_ckpt_reader_t *r;
    assert_ok(dt_ckpt_open(dir, &r));
    assert_int_equal(dt_ckpt_reader_format_version(r), 2);
    /* head/w is 4 block segments in the manifest, by first element */
    size_t hw = 1;
    assert_string_equal(dt_ckpt_entry_at(r, hw)->name, "head/w");
    assert_int_equal(dt_ckpt_entry_n_segments(r, hw), 4);
    const dt_ckpt_seg_t *s = dt_ckpt_segment_at(r, hw, 1);
    assert_int_equal(s->block.ndim, 2);
    assert_int_equal(s->block.start[1], 2);
    assert_int_equal(s->block.size[0], 3);
    assert_int_equal(s->offset, 2);
    assert_int_equal(s->count, 9);
    assert_int_equal(s->shard, 1);
    for (int ranks = 1; ranks <= 4; ranks++)
        check_ranges(r, ranks);
    check_pieces(r, p, n);
    const bpiece_t *po = other_blocks(&no);
    check_pieces(r, po, no);
    assert_ok(dt_ckpt_verify(r));
    dt_ckpt_close(r);

    /* inspect says what each block is */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_ok(dt_ckpt_inspect(dir, 1, f));
    fclose(f);
    assert_non_null(strstr(text, "written by 4 rank(s) with tensor, format version 2"));
    assert_non_null(strstr(text, "head/w                       f32            40 "
                                 "elements in 4 segment(s): block [0:3, 0:2] of "
                                 "[8, 5] at 0 shard 0; block [0:3, 2:5] of [8, 5] "
                                 "at 0 shard 1; block [3:8, 0:2] of [8, 5] at 0 "
                                 "shard 2; block [3:8, 2:5] of [8, 5] at 0 shard 3\n"));
    assert_non_null(strstr(text, "block [0:7, 0:6] of [10, 6] at 60 shard 2;"));
    assert_non_null(strstr(text, "block [7:10, 0:6] of [10, 6] at 60 shard 3; ...\n"));
    free(text);

    /* consolidate: one flat shard, version 1, same values */
    snprintf(out, sizeof out, "%s/consolidated", root);
    assert_ok(dt_ckpt_consolidate(dir, out, 7));
    assert_ok(dt_ckpt_step_dir(out, 5, 0, cdir, sizeof cdir));
    assert_ok(dt_ckpt_open(cdir, &r));
    assert_int_equal(dt_ckpt_reader_format_version(r), 1);
    for (size_t e = 0; e < N_BENTS; e++) {
        assert_int_equal(dt_ckpt_entry_n_segments(r, e), 1);
        assert_int_equal(dt_ckpt_segment_at(r, e, 0)->block.ndim, 0);
    }
    check_ranges(r, 1);
    check_pieces(r, p, n);
    dt_ckpt_close(r);

    /* export: the tensors of the table, whole, from their blocks */
    snprintf(out, sizeof out, "%s/model.safetensors", root);
    assert_ok(dt_ckpt_export(dir, out, DT_EXPORT_NATIVE, NULL, 0, NULL));
    dt_test_st_t *st;
    assert_ok(dt_test_st_open(out, &st));
    static const struct {
        const char *name;
        uint64_t off, n;
        int64_t d0, d1;
    } want[] = {{"w_col", 0, 60, 6, 10}, {"w_row", 60, 60, 10, 6},
                {"bias", 120, 7, 7, 0}};
    for (size_t i = 0; i < 3; i++) {
        const dt_test_st_tensor_t *t = dt_test_st_find(st, want[i].name);
        assert_non_null(t);
        assert_int_equal(t->numel, want[i].n);
        assert_int_equal(t->shape[0], want[i].d0);
        if (want[i].d1)
            assert_int_equal(t->shape[1], want[i].d1);
        float v[60];
        memcpy(v, t->data, want[i].n * sizeof *v);
        for (uint64_t k = 0; k < want[i].n; k++)
            assert_true(v[k] == bval(0, want[i].off + k));
    }
    dt_test_st_close(st);
}

void test_ranges_read_as_blocks(void **state)
{
    char root[512], dir[600];
    subdir(root, sizeof root, "ranges");
    size_t n, nb, no;
    const bpiece_t *p = flat_layout(&n);
    assert_ok(save_pieces(root, 6, p, n, 3));
    assert_ok(dt_ckpt_step_dir(root, 6, 0, dir, sizeof dir));
    dt_ckpt_reader_t *r;
    assert_ok(dt_ckpt_open(dir, &r));
    /* flat ranges only: the version older dtrains read */
    assert_int_equal(dt_ckpt_reader_format_version(r), 1);
    const bpiece_t *pb = block_layout(&nb), *po = other_blocks(&no);
    check_pieces(r, pb, nb);
    check_pieces(r, po, no);
    for (int ranks = 1; ranks <= 4; ranks++)
        check_ranges(r, ranks);
    dt_ckpt_close(r);
}

/* Save head/w alone from the pieces given (2 ranks): the writer's checks. */
static int save_head(const char *root, const bpiece_t *p, size_t n)
{
    char tmp[600];
    int rc = dt_ckpt_begin(root, 9, tmp, sizeof tmp);
    dt_ckpt_seg_t all[4];
    size_t n_all = 0;
    for (int r = 0; r < 2 && !rc; r++) {
        dt_ckpt_writer_t *w;
        assert_ok(dt_ckpt_shard_open(tmp, (uint32_t)r, &w));
        for (size_t i = 0; i < n; i++) {
            if (p[i].rank != r)
                continue;
            uint64_t cnt;
            float *v = piece_values(&p[i], &cnt);
            assert_ok(dt_ckpt_shard_begin_block(w, "head/w", DT_F32, &p[i].b));
            assert_ok(dt_ckpt_shard_append(w, v, (size_t)cnt * sizeof *v));
            assert_ok(dt_ckpt_shard_end(w));
            free(v);
        }
        dt_ckpt_seg_t *segs;
        size_t ns;
        assert_ok(dt_ckpt_shard_close(w, &segs, &ns));
        memcpy(all + n_all, segs, ns * sizeof *segs);
        n_all += ns;
        free(segs);
    }
    dt_ckpt_entry_t ents[N_BENTS];
    bents_decl(ents);
    dt_ckpt_info_t info = {.step = 9, .world_size = 2};
    rc = dt_ckpt_write_manifest(tmp, &info, ents + 1, 1, all, n_all);
    char keep[DT_ERR_MAX];
    snprintf(keep, sizeof keep, "%s", dt_last_error());
    assert_ok(dt_ckpt_abort(root, 9));
    dt_err_set(rc, "%s", keep);
    return rc;
}

static void edit_version3(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(j, "format_version"), 3);
}

static void edit_version1(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(j, "format_version"), 1);
}

/* head/w's second segment (rank 1's block at [0:3, 2:5]) */
static cJSON *head_seg(cJSON *j, int k)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(
        cJSON_GetObjectItem(j, "entries"), "head/w"), "segments"), k);
}

static void edit_block_overlap(cJSON *j) /* [0:3, 2:5] -> [0:3, 1:4] */
{
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(head_seg(j, 1), "offsets"), 1,
                             cJSON_CreateNumber(1));
}

static void edit_block_gap(cJSON *j) /* [3:8, 0:2] -> [4:8, 0:2] */
{
    cJSON *s = head_seg(j, 2);
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(s, "offsets"), 0,
                             cJSON_CreateNumber(4));
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(s, "sizes"), 0,
                             cJSON_CreateNumber(4));
    cJSON_SetNumberValue(cJSON_GetObjectItem(s, "count"), 8);
}

static void edit_block_outside(cJSON *j) /* [3:8, 2:5] -> [3:8, 2:6] */
{
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(head_seg(j, 3), "sizes"), 1,
                             cJSON_CreateNumber(4));
}

static void edit_block_count(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(head_seg(j, 3), "count"), 14);
}

static void edit_block_base(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(head_seg(j, 3), "base"), 1);
}

void test_block_errors(void **state)
{
    char root[512], dir[600], want[1200];
    subdir(root, sizeof root, "block-errors");

    /* writer: a block outside its tensor, refused at begin */
    char tmp[600];
    assert_ok(dt_ckpt_begin(root, 9, tmp, sizeof tmp));
    dt_ckpt_writer_t *w;
    assert_ok(dt_ckpt_shard_open(tmp, 0, &w));
    dt_ckpt_block_t b = blk2(0, 8, 5, 4, 5, 0, 5);
    assert_status(dt_ckpt_shard_begin_block(w, "head/w", DT_F32, &b),
                  DT_ERR_INVALID);
    assert_msg("shard-00000.bin: entry head/w: block at offsets [4, 0] with "
               "sizes [5, 5] lies outside the tensor's shape [8, 5]");
    b.ndim = 0;
    assert_status(dt_ckpt_shard_begin_block(w, "head/w", DT_F32, &b),
                  DT_ERR_INVALID);
    assert_msg("shard-00000.bin: entry head/w: a block has 1 to 8 dimensions, "
               "not 0");
    dt_ckpt_shard_abort(w);
    assert_ok(dt_ckpt_abort(root, 9));

    /* writer: overlap, gaps (between row blocks, inside rows between
     * column blocks), a tensor outside the entry: each named */
    struct {
        bpiece_t p[2];
        const char *msg;
    } wcases[] = {
        {{{0, 1, 0, 0, blk2(0, 8, 5, 0, 4, 0, 5)},
          {1, 1, 0, 0, blk2(0, 8, 5, 3, 5, 0, 5)}},
         "checkpoint manifest: entry head/w: segments overlap at elements "
         "[15, 20) (block at offsets [0, 0] with sizes [4, 5] in "
         "shard-00000.bin and block at offsets [3, 0] with sizes [5, 5] in "
         "shard-00001.bin); indices [3, 0] to [3, 4] of its shape [8, 5]"},
        {{{0, 1, 0, 0, blk2(0, 8, 5, 0, 3, 0, 5)},
          {1, 1, 0, 0, blk2(0, 8, 5, 4, 4, 0, 5)}},
         "checkpoint manifest: entry head/w: elements [15, 20) are in no "
         "segment; indices [3, 0] to [3, 4] of its shape [8, 5]"},
        {{{0, 1, 0, 0, blk2(0, 8, 5, 0, 8, 0, 2)},
          {1, 1, 0, 0, blk2(0, 8, 5, 0, 8, 3, 2)}},
         "checkpoint manifest: entry head/w: elements [2, 3) are in no "
         "segment; indices [0, 2] to [0, 2] of its shape [8, 5]"},
        {{{0, 1, 0, 0, blk2(0, 8, 5, 0, 8, 0, 5)},
          {1, 1, 0, 0, blk2(30, 3, 5, 0, 1, 0, 5)}},
         "checkpoint manifest: entry head/w: a block's tensor, elements [30, "
         "45), lies outside the entry's 40 elements"},
    };
    for (size_t i = 0; i < sizeof wcases / sizeof *wcases; i++) {
        assert_status(save_head(root, wcases[i].p, 2), DT_ERR_INVALID);
        assert_msg(wcases[i].msg);
        dt_test_assert_no_tmp(root);
    }

    /* reader: manifests edited after the save */
    struct {
        void (*edit)(cJSON *);
        const char *msg;
    } cases[] = {
        {edit_version3, "format_version 3 is newer than this dtrain reads "
                        "(2): load it with the dtrain that wrote it, or a "
                        "newer one"},
        {edit_version1, "entry block.0/params: segment 0 is a block "
                        "(\"offsets\"), which needs format_version 2, but the "
                        "manifest is version 1"},
        {edit_block_overlap, "entry head/w: segments overlap at elements [1, "
                             "2) (block at offsets [0, 0] with sizes [3, 2] in "
                             "shard-00000.bin and block at offsets [0, 1] with "
                             "sizes [3, 3] in shard-00001.bin); indices [0, "
                             "1] to [0, 1] of its shape [8, 5]"},
        {edit_block_gap, "entry head/w: elements [15, 17) are in no segment; "
                         "indices [3, 0] to [3, 1] of its shape [8, 5]"},
        {edit_block_outside, "entry head/w: block at offsets [3, 2] with sizes "
                             "[5, 4] lies outside the tensor's shape [8, 5]"},
        {edit_block_count, "entry head/w: segment 3: \"count\" 14 is not the "
                           "product of \"sizes\" (15)"},
        {edit_block_base, "entry head/w: segment 3: the block's tensor, "
                          "elements [1, 41), lies outside the entry's 40 "
                          "elements"},
    };
    size_t n;
    const bpiece_t *p = block_layout(&n);
    assert_ok(dt_ckpt_step_dir(root, 5, 0, dir, sizeof dir));
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_ok(save_pieces(root, 5, p, n, 4));
        edit_manifest(dir, cases[i].edit);
        dt_ckpt_reader_t *r;
        assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
        snprintf(want, sizeof want, "checkpoint '%s': manifest.json: %s", dir,
                 cases[i].msg);
        assert_msg(want);
    }

    /* reading a block outside the tensor, or its tensor outside the entry */
    assert_ok(save_pieces(root, 5, p, n, 4));
    dt_ckpt_reader_t *r;
    assert_ok(dt_ckpt_open(dir, &r));
    float buf[64];
    b = blk2(0, 6, 10, 0, 6, 8, 3);
    assert_status(dt_ckpt_read_block(r, "block.0/params", &b, buf),
                  DT_ERR_INVALID);
    snprintf(want, sizeof want, "checkpoint '%s': entry block.0/params: block "
             "at offsets [0, 8] with sizes [6, 3] lies outside the tensor's "
             "shape [6, 10]", dir);
    assert_msg(want);
    b = blk2(100, 6, 10, 0, 1, 0, 1);
    assert_status(dt_ckpt_read_block(r, "block.0/params", &b, buf),
                  DT_ERR_INVALID);
    snprintf(want, sizeof want, "checkpoint '%s': entry block.0/params: the "
             "block's tensor, elements [100, 160), lies outside the entry's "
             "127 elements", dir);
    assert_msg(want);
    assert_status(dt_ckpt_read_block(r, "nope", &b, buf), DT_ERR_NOT_FOUND);
    dt_ckpt_close(r);
}
