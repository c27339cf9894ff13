/*
 * tests/unit/core/ckpt/test_safetensors_set.c - a model's weights as one
 * model.safetensors or as shards named by model.safetensors.index.json
 * (core/ckpt/safetensors_set.h): opened by folder, by index and by file,
 * every tensor read back from its shard; and an index trusted for nothing
 * (exact messages): a shard outside the folder, a tensor the index puts in
 * the wrong shard, a shard tensor the index does not name, a mapped tensor
 * missing from its shard, a missing shard, no weight_map.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/safetensors.h"
#include "ckpt/safetensors_set.h"
#include "dtrain/tensor.h"
#include "util/error.h"
#include "util/fileutil.h"

static char g_dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/dt_test_sts.XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    return dt_fileutil_rm_rf(g_dir) == DT_OK ? 0 : -1;
}

/* A shard `file` in folder `sub` of g_dir holding tensors names[0..n),
 * tensor i being 3 floats 10 i + base + {0, 1, 2}. */
static void write_shard(const char *sub, const char *file, const char *const *names, int n,
                        float base)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, sub);
    assert_int_equal(dt_fileutil_mkdir_p(path), DT_OK);
    snprintf(path, sizeof path, "%s/%s/%s", g_dir, sub, file);
    dt_safetensors_writer_t *w = NULL;
    assert_int_equal(dt_safetensors_writer_open(path, &w), DT_OK);
    int64_t shape[1] = {3};
    for (int i = 0; i < n; i++)
        assert_int_equal(dt_safetensors_declare(w, names[i], DT_F32, 1, shape), DT_OK);
    for (int i = 0; i < n; i++) {
        float v[3] = {10.0f * (float)i + base, 10.0f * (float)i + base + 1,
                      10.0f * (float)i + base + 2};
        assert_int_equal(dt_safetensors_write(w, v, sizeof v), DT_OK);
    }
    assert_int_equal(dt_safetensors_commit(w), DT_OK);
}

static void write_text(const char *sub, const char *file, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s/%s", g_dir, sub, file);
    assert_int_equal(dt_fileutil_write_atomic(path, text, strlen(text)), DT_OK);
}

static const char *const A[] = {"embed.weight", "layers.0.w"};
static const char *const B[] = {"layers.1.w", "norm.weight"};
#define SHARD_A "model-00001-of-00002.safetensors"
#define SHARD_B "model-00002-of-00002.safetensors"

/* A good two-shard set in folder `sub`. */
static void good_set(const char *sub)
{
    write_shard(sub, SHARD_A, A, 2, 0.0f);
    write_shard(sub, SHARD_B, B, 2, 100.0f);
    write_text(sub, DT_SAFETENSORS_INDEX_NAME,
               "{\"metadata\": {\"total_size\": 48}, \"weight_map\": {"
               "\"embed.weight\": \"" SHARD_A "\", \"layers.0.w\": \"" SHARD_A "\", "
               "\"layers.1.w\": \"" SHARD_B "\", \"norm.weight\": \"" SHARD_B "\"}}");
}

static void check_value(dt_safetensors_set_t *s, const char *name, float first)
{
    const dt_safetensors_tensor_t *t = dt_safetensors_set_find(s, name);
    assert_non_null(t);
    assert_string_equal(t->name, name);
    float v[3];
    assert_int_equal(dt_safetensors_set_read(s, t, 0, sizeof v, v), DT_OK);
    assert_true(v[0] == first && v[1] == first + 1 && v[2] == first + 2);
}

static void test_sharded(void **state)
{
    (void)state;
    good_set("m");
    char path[512];
    for (int how = 0; how < 2; how++) {
        if (how == 0)
            snprintf(path, sizeof path, "%s/m", g_dir); /* the folder */
        else
            snprintf(path, sizeof path, "%s/m/%s", g_dir, DT_SAFETENSORS_INDEX_NAME);
        dt_safetensors_set_t *s = NULL;
        assert_int_equal(dt_safetensors_set_open(path, &s), DT_OK);
        assert_int_equal(dt_safetensors_set_shards(s), 2);
        assert_int_equal(dt_safetensors_set_count(s), 4);
        assert_string_equal(dt_safetensors_set_at(s, 0)->name, "embed.weight");
        assert_string_equal(dt_safetensors_set_at(s, 3)->name, "norm.weight");
        assert_null(dt_safetensors_set_at(s, 4));
        check_value(s, "embed.weight", 0.0f);
        check_value(s, "layers.0.w", 10.0f);
        check_value(s, "layers.1.w", 100.0f);
        check_value(s, "norm.weight", 110.0f);
        assert_null(dt_safetensors_set_find(s, "lm_head.weight"));
        char want[512];
        snprintf(want, sizeof want, "%s/m/%s", g_dir, SHARD_B);
        assert_string_equal(dt_safetensors_set_file(s, dt_safetensors_set_find(s, "norm.weight")),
                            want);
        dt_safetensors_set_close(s);
    }
}

static void test_single(void **state)
{
    (void)state;
    write_shard("one", DT_SAFETENSORS_SINGLE_NAME, A, 2, 5.0f);
    char path[512];
    for (int how = 0; how < 2; how++) {
        if (how == 0)
            snprintf(path, sizeof path, "%s/one", g_dir);
        else
            snprintf(path, sizeof path, "%s/one/%s", g_dir, DT_SAFETENSORS_SINGLE_NAME);
        dt_safetensors_set_t *s = NULL;
        assert_int_equal(dt_safetensors_set_open(path, &s), DT_OK);
        assert_int_equal(dt_safetensors_set_shards(s), 1);
        assert_int_equal(dt_safetensors_set_count(s), 2);
        check_value(s, "layers.0.w", 15.0f);
        dt_safetensors_set_close(s);
    }
    /* a folder with neither */
    snprintf(path, sizeof path, "%s/empty", g_dir);
    assert_int_equal(dt_fileutil_mkdir_p(path), DT_OK);
    dt_safetensors_set_t *s = (dt_safetensors_set_t *)1;
    assert_int_equal(dt_safetensors_set_open(path, &s), DT_ERR_NOT_FOUND);
    assert_null(s);
    char want[768];
    snprintf(want, sizeof want, "'%s' holds neither model.safetensors.index.json nor "
             "model.safetensors", path);
    assert_string_equal(dt_last_error(), want);
}

/* Open folder `sub`'s index and expect DT_ERR_DATA with message
 * "'<index>': <tail>". */
static void expect_bad(const char *sub, int want_rc, const char *tail)
{
    char path[512], want[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, sub);
    dt_safetensors_set_t *s = (dt_safetensors_set_t *)1;
    assert_int_equal(dt_safetensors_set_open(path, &s), want_rc);
    assert_null(s);
    snprintf(want, sizeof want, "'%s/%s/%s': %s", g_dir, sub, DT_SAFETENSORS_INDEX_NAME,
             tail);
    assert_string_equal(dt_last_error(), want);
}

static void test_hostile_index(void **state)
{
    (void)state;
    good_set("esc");
    write_text("esc", DT_SAFETENSORS_INDEX_NAME,
               "{\"weight_map\": {\"embed.weight\": \"../m/" SHARD_A "\"}}");
    expect_bad("esc", DT_ERR_DATA, "weight_map: tensor 'embed.weight' names shard '../m/" SHARD_A
               "', which is not a plain *.safetensors file name in the index's folder");
    write_text("esc", DT_SAFETENSORS_INDEX_NAME,
               "{\"weight_map\": {\"embed.weight\": \".hidden.safetensors\"}}");
    expect_bad("esc", DT_ERR_DATA, "weight_map: tensor 'embed.weight' names shard "
               "'.hidden.safetensors', which is not a plain *.safetensors file name in the "
               "index's folder");

    good_set("wrong");
    write_text("wrong", DT_SAFETENSORS_INDEX_NAME,
               "{\"weight_map\": {\"embed.weight\": \"" SHARD_A "\", \"layers.0.w\": \"" SHARD_B
               "\", \"layers.1.w\": \"" SHARD_B "\", \"norm.weight\": \"" SHARD_B "\"}}");
    expect_bad("wrong", DT_ERR_DATA, "weight_map: tensor 'layers.0.w' is in shard '" SHARD_A
               "' but the index says '" SHARD_B "'");

    good_set("unnamed");
    write_text("unnamed", DT_SAFETENSORS_INDEX_NAME,
               "{\"weight_map\": {\"embed.weight\": \"" SHARD_A "\", \"layers.0.w\": \"" SHARD_A
               "\", \"layers.1.w\": \"" SHARD_B "\"}}");
    expect_bad("unnamed", DT_ERR_DATA, "shard '" SHARD_B "' holds tensor 'norm.weight', which "
               "the index's weight_map does not name");

    good_set("absent");
    write_text("absent", DT_SAFETENSORS_INDEX_NAME,
               "{\"weight_map\": {\"embed.weight\": \"" SHARD_A "\", \"layers.0.w\": \"" SHARD_A
               "\", \"layers.1.w\": \"" SHARD_B "\", \"norm.weight\": \"" SHARD_B "\", "
               "\"lm_head.weight\": \"" SHARD_B "\"}}");
    expect_bad("absent", DT_ERR_DATA, "weight_map: tensor 'lm_head.weight' is not in shard '"
               SHARD_B "'");

    good_set("nomap");
    write_text("nomap", DT_SAFETENSORS_INDEX_NAME, "[1, 2]");
    expect_bad("nomap", DT_ERR_DATA, "not a JSON object with a \"weight_map\" object");
    write_text("nomap", DT_SAFETENSORS_INDEX_NAME, "{\"weight_map\": {}}");
    expect_bad("nomap", DT_ERR_DATA, "weight_map is empty");
    write_text("nomap", DT_SAFETENSORS_INDEX_NAME, "{\"weight_map\": {\"x\": 3}}");
    expect_bad("nomap", DT_ERR_DATA, "weight_map: tensor 'x' maps to a non-string");

    /* a shard the index names that is not there */
    good_set("gone");
    char path[512];
    snprintf(path, sizeof path, "%s/gone/%s", g_dir, SHARD_B);
    assert_int_equal(unlink(path), 0);
    snprintf(path, sizeof path, "%s/gone", g_dir);
    dt_safetensors_set_t *s = (dt_safetensors_set_t *)1;
    assert_int_equal(dt_safetensors_set_open(path, &s), DT_ERR_NOT_FOUND);
    assert_null(s);
    assert_non_null(strstr(dt_last_error(), SHARD_B));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_single),
        cmocka_unit_test(test_hostile_index),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
