/*
 * tests/unit/core/data/test_tokenizer.c - the byte-level BPE tokenizer
 * (core/data/tokenizer.c) against Hugging Face's `tokenizers` library:
 * the fixtures in tests/data/tokenizers (made by make_fixtures.py there)
 * hold four tokenizer.json files (GPT-2's pre-tokenizer, with and without
 * a prefix space; Llama 3's pattern; Qwen2's with its NFC normalizer) and the ids `tokenizers` gives for a
 * multilingual sample (whitespace runs, digits, CJK, Cyrillic, Arabic,
 * Devanagari, combining marks, emoji with ZWJ and skin tones, special
 * tokens inline) and for edge cases; every id must be equal, on 1 and 3
 * threads, and decoding gives the text back byte for byte.  Also: invalid
 * UTF-8 kept and round-tripped, token files of uint16 and uint32 ids
 * written and read back, and every refusal's message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "data/data.h"
#include "data/tokenizer.h"
#include "test_assert.h"
#include "util/error.h"

#define FIX DT_TEST_SOURCE_DIR "/tests/data/tokenizers/"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    p[n] = 0;
    if (len)
        *len = (size_t)n;
    return p;
}

static void same_ids(const char *what, const dt_token_vec_t *got, const cJSON *want)
{
    size_t n = (size_t)cJSON_GetArraySize(want), i = 0;
    const cJSON *e = want->child;
    for (; e && i < got->n; e = e->next, i++)
        if ((uint32_t)e->valuedouble != got->ids[i])
            fail_msg("%s: id %zu is %u, tokenizers gives %u", what, i, got->ids[i],
                     (uint32_t)e->valuedouble);
    if (got->n != n)
        fail_msg("%s: %zu ids, tokenizers gives %zu", what, got->n, n);
}

/* Decoding the ids gives text[0, len) back. */
static void round_trip(const dt_tokenizer_t *t, const dt_token_vec_t *v, const char *text,
                       size_t len)
{
    char *buf = malloc(len + 1);
    size_t at = 0;
    for (size_t i = 0; i < v->n; i++) {
        size_t n;
        const char *p = dt_tokenizer_token(t, v->ids[i], &n);
        assert_non_null(p);
        assert_true(at + n <= len);
        memcpy(buf + at, p, n);
        at += n;
    }
    assert_int_equal(at, len);
    assert_memory_equal(buf, text, len);
    free(buf);
}

/* Decoding gives the text back unless a prefix space was added, NFC
 * changed it (qwen2.json) or an lstrip/rstrip token (llama3.json's <mask>)
 * took whitespace. */
static int lossless(const char *name, const char *text)
{
    return !strstr(name, "prefix") && !strstr(name, "qwen2") &&
           !(strstr(name, "llama3") && strstr(text, "<mask>"));
}

static void against_tokenizers(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, FIX "%s.json", name);
    dt_tokenizer_t *t = NULL;
    assert_ok(dt_tokenizer_load(path, &t));
    snprintf(path, sizeof path, FIX "%s.expected.json", name);
    char *js = slurp(path, NULL);
    cJSON *want = cJSON_Parse(js);
    assert_non_null(want);
    size_t len;
    char *text = slurp(FIX "sample.txt", &len);
    for (int threads = 1; threads <= 3; threads += 2) {
        dt_token_vec_t v = {0};
        assert_ok(dt_tokenizer_encode(t, text, len, threads, NULL, NULL, &v));
        char what[64];
        snprintf(what, sizeof what, "%s: sample.txt on %d thread(s)", name, threads);
        same_ids(what, &v, cJSON_GetObjectItem(want, "sample"));
        if (lossless(name, text))
            round_trip(t, &v, text, len);
        dt_token_vec_free(&v);
    }
    int k = 0;
    for (const cJSON *c = cJSON_GetObjectItem(want, "cases")->child; c; c = c->next, k++) {
        const char *s = cJSON_GetObjectItem(c, "text")->valuestring;
        dt_token_vec_t v = {0};
        assert_ok(dt_tokenizer_encode(t, s, strlen(s), 1, NULL, NULL, &v));
        char what[96];
        snprintf(what, sizeof what, "%s: case %d \"%.40s\"", name, k, s);
        same_ids(what, &v, cJSON_GetObjectItem(c, "ids"));
        if (lossless(name, s))
            round_trip(t, &v, s, strlen(s));
        dt_token_vec_free(&v);
    }
    free(text);
    free(js);
    cJSON_Delete(want);
    dt_tokenizer_free(t);
}

/* GPT-2's pre-tokenizer, merges spelled "a b" */
static void test_gpt2(void **state)
{
    (void)state;
    against_tokenizers("gpt2");
}

/* the same with add_prefix_space: each stretch between added tokens */
static void test_gpt2_prefix_space(void **state)
{
    (void)state;
    against_tokenizers("gpt2_prefix");
}

/* Llama 3's Split pattern, ignore_merges, lstrip/rstrip, an id of 70000 */
static void test_llama3(void **state)
{
    (void)state;
    against_tokenizers("llama3");
    dt_tokenizer_t *t = NULL;
    assert_ok(dt_tokenizer_load(FIX "llama3.json", &t));
    assert_int_equal(dt_tokenizer_vocab_size(t), 70001);
    size_t n = 0;
    const char *the = dt_tokenizer_token(t, 70000, &n);
    assert_int_equal(n, 4);
    assert_memory_equal(the, " the", 4);
    assert_null(dt_tokenizer_token(t, 70001, &n));
    dt_tokenizer_free(t);
}

/* Qwen2's NFC normalizer and single-digit pattern, and a normalized added
 * token matched after NFC */
static void test_qwen2_nfc(void **state)
{
    (void)state;
    against_tokenizers("qwen2");
}

/* Invalid UTF-8 is kept: its bytes are pieces of their own and come back
 * on decoding. */
static void test_invalid_utf8(void **state)
{
    (void)state;
    dt_tokenizer_t *t = NULL;
    assert_ok(dt_tokenizer_load(FIX "llama3.json", &t));
    static const char text[] = "abc\xff\xfe def \xc3 caf\xc3\xa9 \xe2\x82 x\xf0\x9f\x98";
    dt_token_vec_t v = {0};
    assert_ok(dt_tokenizer_encode(t, text, sizeof text - 1, 1, NULL, NULL, &v));
    round_trip(t, &v, text, sizeof text - 1);
    dt_token_vec_free(&v);
    /* a run of invalid bytes is a piece of its own: "abc" is encoded as
     * alone, then each invalid byte is its byte's token */
    dt_token_vec_t abc = {0};
    assert_ok(dt_tokenizer_encode(t, "abc", 3, 1, NULL, NULL, &abc));
    assert_ok(dt_tokenizer_encode(t, "abc\xff\xfe", 5, 1, NULL, NULL, &v));
    assert_int_equal(v.n, abc.n + 2);
    assert_memory_equal(v.ids, abc.ids, abc.n * sizeof *abc.ids);
    size_t n;
    const char *p = dt_tokenizer_token(t, v.ids[abc.n], &n);
    assert_true(n == 1 && (unsigned char)p[0] == 0xff);
    p = dt_tokenizer_token(t, v.ids[abc.n + 1], &n);
    assert_true(n == 1 && (unsigned char)p[0] == 0xfe);
    dt_token_vec_free(&abc);
    dt_token_vec_free(&v);
    dt_tokenizer_free(t);
    /* under NFC too: an overlong form (C0 80) and a surrogate (ED A0 80)
     * are invalid bytes, kept as they are around the normalized text */
    assert_ok(dt_tokenizer_load(FIX "qwen2.json", &t));
    static const char bad[] = "ab\xc0\x80 x\xed\xa0\x80y caf\xc3\xa9";
    assert_ok(dt_tokenizer_encode(t, bad, sizeof bad - 1, 1, NULL, NULL, &v));
    round_trip(t, &v, bad, sizeof bad - 1);
    dt_token_vec_free(&v);
    dt_tokenizer_free(t);
}

static char tmpdir[] = "/tmp/dt_test_tokenizer_XXXXXX";

static const char *tpath(const char *name)
{
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

static void write_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

/* A token file of the tokenizer's ids, uint16 or uint32 by the
 * vocabulary, read back as the same ids; the val split in tokens. */
static void test_prepare_token_files(void **state)
{
    (void)state;
    const char *names[] = {"gpt2", "llama3"};
    for (int k = 0; k < 2; k++) {
        char path[512];
        snprintf(path, sizeof path, FIX "%s.json", names[k]);
        dt_tokenizer_t *t = NULL;
        assert_ok(dt_tokenizer_load(path, &t));
        size_t len;
        char *text = slurp(FIX "sample.txt", &len);
        dt_token_vec_t v = {0};
        assert_ok(dt_tokenizer_encode(t, text, len, 2, NULL, NULL, &v));
        uint64_t nt = 0, nv = 0;
        assert_ok(dt_data_prepare_bpe(FIX "sample.txt", t, 2, NULL, NULL, tpath("tr.bin"),
                                      tpath("va.bin"), 0.1, &nt, &nv));
        assert_int_equal(nt + nv, v.n);
        assert_int_equal(nv, (uint64_t)(0.1 * (double)v.n));
        dt_dataset_t *ds = NULL;
        assert_ok(dt_data_open(tpath("tr.bin"), &ds));
        assert_int_equal(ds->width, k ? 4 : 2);
        assert_int_equal(ds->ntok, nt);
        uint32_t max = 0;
        for (size_t i = 0; i < nt; i++)
            max = v.ids[i] > max ? v.ids[i] : max;
        assert_int_equal(ds->max_token, max);
        /* the first sequence of the file is the first ids */
        int32_t in[16], tg[16];
        assert_ok(dt_data_eval_fill(ds, 16, 1, 0, 0, 1, in, tg));
        for (int i = 0; i < 16; i++) {
            assert_int_equal((uint32_t)in[i], v.ids[i]);
            assert_int_equal((uint32_t)tg[i], v.ids[i + 1]);
        }
        if (k) /* the 70000 of " the" is in the file, and needs the vocabulary */
            assert_status(dt_data_check_vocab(ds, 65536), DT_ERR_DATA);
        assert_ok(dt_data_check_vocab(ds, dt_tokenizer_vocab_size(t)));
        dt_data_close(ds);
        FILE *f = fopen(tpath("tr.bin"), "rb");
        int32_t hdr[2];
        assert_int_equal(fread(hdr, 4, 2, f), 2);
        fclose(f);
        assert_int_equal(hdr[0], k ? 20240801 : 20240520);
        assert_int_equal(hdr[1], k ? 7 : 1);
        assert_ok(dt_data_open(tpath("va.bin"), &ds));
        assert_int_equal(ds->ntok, nv);
        dt_data_close(ds);
        free(text);
        dt_token_vec_free(&v);
        dt_tokenizer_free(t);
    }
}

/* What is refused, naming the file and the key. */
static void test_refusals(void **state)
{
    (void)state;
    dt_tokenizer_t *t = NULL;
    char *base = slurp(FIX "gpt2.json", NULL);
    cJSON *j = cJSON_Parse(base);
    free(base);
    struct {
        const char *path, *value, *msg;
    } cases[] = {
        {"normalizer", "{\"type\": \"NFKC\"}", "normalizer: not supported (only null and NFC); "
                                              "this one is NFKC"},
        {"model.type", "\"WordPiece\"", "model.type: only \"BPE\" is supported, not WordPiece"},
        {"model.dropout", "0.1", "model.dropout: not supported (it must be null)"},
        {"model.byte_fallback", "true", "model.byte_fallback: true is not supported (a "
                                        "sentencepiece-style vocabulary, as Llama 2's; "
                                        "byte-level BPE only)"},
        {"pre_tokenizer", "{\"type\": \"Metaspace\"}", "pre_tokenizer: only ByteLevel, or a "
         "Sequence of a Split and a ByteLevel, is supported; this one is Metaspace"},
        {"model.merges", "[\"\\u0120 t\", \"q z\"]", "model.merges[1] = \"q z\": the merged "
         "token is not in model.vocab"},
        {"model.merges", "[\"nonsense\"]", "model.merges[0] = \"nonsense\": not a pair "
         "(\"a b\" or [\"a\", \"b\"])"},
        {"added_tokens", "[{\"id\": 5, \"content\": \"<|endoftext|>\"}]", "added_tokens[0] "
         "(\"<|endoftext|>\"): id 5, but the tokenizers library gives it id 0 (the "
         "vocabulary's id for its text, or the next after the vocabulary and the added tokens "
         "before it): the file's ids disagree"},
        {"added_tokens", "[{\"id\": 0, \"content\": \"<|endoftext|>\", \"single_word\": true}]",
         "added_tokens[0] (\"<|endoftext|>\"): single_word = true is not supported"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        cJSON *c = cJSON_Duplicate(j, 1);
        cJSON *parent = c;
        char key[64];
        snprintf(key, sizeof key, "%s", cases[k].path);
        char *dot = strchr(key, '.');
        if (dot) {
            *dot = 0;
            parent = cJSON_GetObjectItem(c, key);
        }
        cJSON_ReplaceItemInObject(parent, dot ? dot + 1 : key, cJSON_Parse(cases[k].value));
        char *s = cJSON_Print(c);
        write_file(tpath("bad.json"), s);
        free(s);
        cJSON_Delete(c);
        assert_status(dt_tokenizer_load(tpath("bad.json"), &t), DT_ERR_CONFIG);
        assert_null(t);
        char want[1024];
        snprintf(want, sizeof want, "tokenizer '%s': %s", tpath("bad.json"), cases[k].msg);
        assert_msg(want);
    }
    /* a vocabulary without byte 0x41 ('A') */
    cJSON *c = cJSON_Duplicate(j, 1);
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(c, "model"), "merges");
    cJSON_AddItemToObject(cJSON_GetObjectItem(c, "model"), "merges", cJSON_CreateArray());
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "model"), "vocab"),
                               "A");
    char *s = cJSON_Print(c);
    write_file(tpath("bad.json"), s);
    free(s);
    cJSON_Delete(c);
    assert_status(dt_tokenizer_load(tpath("bad.json"), &t), DT_ERR_CONFIG);
    char want[512];
    snprintf(want, sizeof want, "tokenizer '%s': model.vocab has no token for byte 0x41: a "
             "byte-level vocabulary needs all 256", tpath("bad.json"));
    assert_msg(want);
    cJSON_Delete(j);
    write_file(tpath("bad.json"), "{\"model\": ");
    assert_status(dt_tokenizer_load(tpath("bad.json"), &t), DT_ERR_CONFIG);
    snprintf(want, sizeof want, "tokenizer '%s': not a JSON object (a Hugging Face "
             "tokenizer.json)", tpath("bad.json"));
    assert_msg(want);
    assert_status(dt_tokenizer_load(tpath("absent.json"), &t), DT_ERR_NOT_FOUND);
    unlink(tpath("bad.json"));
}

static int setup(void **state)
{
    (void)state;
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    unlink(tpath("tr.bin"));
    unlink(tpath("va.bin"));
    return rmdir(tmpdir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_gpt2_prefix_space),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_qwen2_nfc),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_prepare_token_files),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
