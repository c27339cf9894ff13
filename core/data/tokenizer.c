/*
 * core/data/tokenizer.c - byte-level BPE from a Hugging Face tokenizer.json
 * (tokenizer.h says what a text goes through and what is refused).
 *
 * Layout.  Every token's bytes live in one blob (`tok[id]` is its span);
 * byte-level vocabularies spell bytes as printable characters (GPT-2's
 * bytes_to_unicode), which are turned back into the bytes at load, so the
 * encoder works on raw bytes throughout.  Merges are a hash map from the
 * pair of ids to (rank, merged id); a piece is merged with a min-heap of
 * (rank, position), lowest rank first and then leftmost, which is the
 * order `tokenizers` merges in.  Pieces seen before come from a per-thread
 * cache.
 *
 * Threads.  Added-token splitting and the regex run on one thread (their
 * result depends on what came before); the pieces they produce, a window
 * at a time, are cut into contiguous ranges BPE'd on `threads` threads and
 * appended in order, so the ids are the same on any number of threads.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/tokenizer.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <pcre2.h>
#include <pthread.h>
#include <utf8proc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"
#include "util/fileutil.h"
#include "util/utf8.h"

/* tokenizers' ByteLevel pattern (use_regex = true): GPT-2's. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define NO_ID UINT32_MAX
#define MAX_FILE ((uint64_t)1 << 30) /* a tokenizer.json of more is refused */
#define WINDOW_PIECES ((size_t)1 << 20)
#define CACHE_SLOTS ((size_t)1 << 15)
#define CACHE_ARENA ((size_t)1 << 22)
#define CACHE_MAX_PIECE 255

typedef struct {
    uint32_t off, len;
} span_t;

typedef struct {
    uint32_t id, off, len; /* content in the blob */
    int lstrip, rstrip, normalized;
} added_t;

struct dt_tokenizer {
    char *path;
    char *blob;
    size_t blob_len, blob_cap;
    span_t *tok; /* id -> bytes; len UINT32_MAX: no token */
    uint32_t n_ids;
    uint32_t *vmap; /* bytes -> id + 1 (0: empty), open addressing */
    size_t vcap;
    uint64_t *mkey; /* (a << 32 | b) + 1, 0: empty */
    uint32_t *mrank, *mid;
    size_t mcap;
    uint32_t byte_id[256];
    added_t *added;   /* by first byte: first[b] .. first[b + 1] */
    uint32_t n_added, n_normalized;
    uint32_t first[257];
    pcre2_code *re;
    int add_prefix_space, ignore_merges, nfc;
};

/* ------------------------------------------------------------ helpers */

static uint64_t hash_bytes(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* GPT-2's bytes_to_unicode, inverted: code point -> byte, or -1. */
static int byte_of_cp[324];

static void byte_table_init(void)
{
    static int done;
    if (done)
        return;
    for (int i = 0; i < 324; i++)
        byte_of_cp[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        byte_of_cp[printable ? b : 256 + extra++] = b;
    }
    done = 1;
}

/* Rust's char::is_whitespace (Unicode White_Space), as lstrip/rstrip use. */
static int is_ws(int32_t c)
{
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* ------------------------------------------------------ the tokenizer */

static int fail(const dt_tokenizer_t *t, const char *key, const char *fmt, const char *what)
{
    return dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': %s: %s%s", t->path, key, fmt,
                      what ? what : "");
}

static int blob_add(dt_tokenizer_t *t, const void *p, size_t n, span_t *out)
{
    if (t->blob_len + n > UINT32_MAX)
        return dt_err_set(DT_ERR_DATA, "tokenizer '%s': its tokens hold more than 4 GiB",
                          t->path);
    if (t->blob_len + n > t->blob_cap) {
        size_t cap = t->blob_cap ? 2 * t->blob_cap : 1 << 16;
        while (cap < t->blob_len + n)
            cap *= 2;
        char *b = realloc(t->blob, cap);
        if (!b)
            return dt_err_set(DT_ERR_NOMEM, "tokenizer '%s': out of memory", t->path);
        t->blob = b;
        t->blob_cap = cap;
    }
    memcpy(t->blob + t->blob_len, p, n);
    *out = (span_t){(uint32_t)t->blob_len, (uint32_t)n};
    t->blob_len += n;
    return DT_OK;
}

static int ids_reserve(dt_tokenizer_t *t, uint32_t id)
{
    if (id < t->n_ids)
        return DT_OK;
    if (id >= (1u << 30))
        return dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': token id %u is too large",
                          t->path, id);
    uint32_t n = t->n_ids ? t->n_ids : 256;
    while (n <= id)
        n *= 2;
    span_t *s = realloc(t->tok, n * sizeof *s);
    if (!s)
        return dt_err_set(DT_ERR_NOMEM, "tokenizer '%s': out of memory", t->path);
    for (uint32_t i = t->n_ids; i < n; i++)
        s[i] = (span_t){0, UINT32_MAX};
    t->tok = s;
    t->n_ids = n;
    return DT_OK;
}

static uint32_t vmap_find(const dt_tokenizer_t *t, const void *p, size_t n)
{
    if (!t->vcap)
        return NO_ID;
    for (size_t i = hash_bytes(p, n) & (t->vcap - 1);; i = (i + 1) & (t->vcap - 1)) {
        uint32_t v = t->vmap[i];
        if (!v)
            return NO_ID;
        const span_t *s = &t->tok[v - 1];
        if (s->len == n && memcmp(t->blob + s->off, p, n) == 0)
            return v - 1;
    }
}

static void vmap_put(dt_tokenizer_t *t, uint32_t id)
{
    const span_t *s = &t->tok[id];
    for (size_t i = hash_bytes((const unsigned char *)t->blob + s->off, s->len) & (t->vcap - 1);;
         i = (i + 1) & (t->vcap - 1))
        if (!t->vmap[i]) {
            t->vmap[i] = id + 1;
            return;
        }
}

/* Merge of (a, b): its rank and the merged id, or NO_ID. */
static uint32_t merge_find(const dt_tokenizer_t *t, uint32_t a, uint32_t b, uint32_t *id)
{
    uint64_t k = ((uint64_t)a << 32 | b) + 1;
    for (size_t i = hash_u64(k) & (t->mcap - 1);; i = (i + 1) & (t->mcap - 1)) {
        if (t->mkey[i] == k) {
            *id = t->mid[i];
            return t->mrank[i];
        }
        if (!t->mkey[i])
            return NO_ID;
    }
}

/* A vocabulary key in byte-level spelling, as bytes (buf holds 4x). */
static int key_bytes(const char *key, unsigned char *buf, size_t *n)
{
    const unsigned char *s = (const unsigned char *)key;
    size_t len = strlen(key), k = 0;
    for (size_t i = 0; i < len;) {
        size_t used;
        int32_t cp = dt_utf8_decode(s + i, len - i, &used);
        if (cp < 0 || cp >= 324 || byte_of_cp[cp] < 0)
            return -1;
        buf[k++] = (unsigned char)byte_of_cp[cp];
        i += used;
    }
    *n = k;
    return 0;
}

static const char *json_type_name(const cJSON *j)
{
    return !j ? "missing" : cJSON_IsNull(j) ? "null" : cJSON_IsString(j) ? "a string"
         : cJSON_IsNumber(j) ? "a number" : cJSON_IsBool(j) ? "a boolean"
         : cJSON_IsArray(j) ? "an array" : "an object";
}

/* `model.vocab` and `model.merges`. */
static int load_model(dt_tokenizer_t *t, const cJSON *model)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0)
        return fail(t, "model.type", "only \"BPE\" is supported, not ",
                    cJSON_IsString(type) ? type->valuestring : json_type_name(type));
    static const char *const nulls[] = {"dropout", "continuing_subword_prefix",
                                        "end_of_word_suffix"};
    for (size_t i = 0; i < sizeof nulls / sizeof *nulls; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, nulls[i]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !*v->valuestring)) {
            char key[64];
            snprintf(key, sizeof key, "model.%s", nulls[i]);
            return fail(t, key, "not supported (it must be null)", NULL);
        }
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return fail(t, "model.byte_fallback", "true is not supported (a sentencepiece-style "
                    "vocabulary, as Llama 2's; byte-level BPE only)", NULL);
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return fail(t, "model.vocab", "expected an object of token -> id, found ",
                    json_type_name(vocab));
    size_t n = (size_t)cJSON_GetArraySize(vocab);
    unsigned char *buf = NULL;
    size_t bufcap = 0;
    int rc = DT_OK;
    for (const cJSON *e = vocab->child; e && !rc; e = e->next) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(d >= 0 && d < (1u << 30) && d == (double)(uint32_t)d)) {
            rc = dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': model.vocab[\"%s\"]: not a "
                            "token id (a whole number from 0)", t->path, e->string);
            break;
        }
        size_t need = 4 * strlen(e->string) + 1;
        if (need > bufcap) {
            unsigned char *b = realloc(buf, need);
            if (!b) {
                rc = dt_err_set(DT_ERR_NOMEM, "tokenizer '%s': out of memory", t->path);
                break;
            }
            buf = b;
            bufcap = need;
        }
        size_t len;
        uint32_t id = (uint32_t)d;
        if (key_bytes(e->string, buf, &len) != 0)
            rc = dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': model.vocab[\"%s\"] (id %u) is not "
                            "spelled in byte-level characters (GPT-2's bytes_to_unicode): "
                            "not a byte-level BPE vocabulary", t->path, e->string, id);
        else if (!(rc = ids_reserve(t, id)) && t->tok[id].len != UINT32_MAX)
            rc = dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': model.vocab: id %u is given twice "
                            "(\"%s\")", t->path, id, e->string);
        if (!rc)
            rc = blob_add(t, buf, len, &t->tok[id]);
    }
    free(buf);
    if (rc)
        return rc;
    t->vcap = pow2_at_least(2 * n + 1);
    if (!(t->vmap = calloc(t->vcap, sizeof *t->vmap)))
        return dt_err_set(DT_ERR_NOMEM, "tokenizer '%s': out of memory", t->path);
    for (const cJSON *e = vocab->child; e; e = e->next) {
        uint32_t id = (uint32_t)e->valuedouble;
        const span_t *s = &t->tok[id];
        if (vmap_find(t, t->blob + s->off, s->len) != NO_ID)
            return dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': model.vocab[\"%s\"]: its bytes are "
                              "another token's too", t->path, e->string);
        vmap_put(t, id);
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        if ((t->byte_id[b] = vmap_find(t, &c, 1)) == NO_ID)
            return dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': model.vocab has no token for byte "
                              "0x%02x: a byte-level vocabulary needs all 256", t->path, b);
    }

    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges))
        return fail(t, "model.merges", "expected an array, found ", json_type_name(merges));
    size_t nm = (size_t)cJSON_GetArraySize(merges);
    t->mcap = pow2_at_least(2 * nm + 1);
    t->mkey = calloc(t->mcap, sizeof *t->mkey);
    t->mrank = malloc(t->mcap * sizeof *t->mrank);
    t->mid = malloc(t->mcap * sizeof *t->mid);
    if (!t->mkey || !t->mrank || !t->mid)
        return dt_err_set(DT_ERR_NOMEM, "tokenizer '%s': out of memory", t->path);
    unsigned char ab[2][1024];
    uint32_t rank = 0;
    for (const cJSON *e = merges->child; e; e = e->next, rank++) {
        const char *part[2] = {NULL, NULL};
        char pair[2048];
        if (cJSON_IsString(e) && strlen(e->valuestring) < sizeof pair) { /* "a b" */
            snprintf(pair, sizeof pair, "%s", e->valuestring);
            char *sp = strchr(pair, ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                *sp = 0;
                part[0] = pair;
                part[1] = sp + 1;
            }
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
                   cJSON_IsString(e->child) && cJSON_IsString(e->child->next)) {
            part[0] = e->child->valuestring;
            part[1] = e->child->next->valuestring;
        }
        uint32_t id[3] = {NO_ID, NO_ID, NO_ID};
        size_t len[2] = {0, 0};
        for (int k = 0; k < 2 && part[0]; k++)
            if (strlen(part[k]) < 256 && key_bytes(part[k], ab[k], &len[k]) == 0)
                id[k] = vmap_find(t, ab[k], len[k]);
        if (id[0] != NO_ID && id[1] != NO_ID) {
            memcpy(ab[0] + len[0], ab[1], len[1]);
            id[2] = vmap_find(t, ab[0], len[0] + len[1]);
        }
        if (id[2] == NO_ID) {
            char *s = cJSON_PrintUnformatted(e);
            int rc2 = dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': model.merges[%u] = %s: %s",
                                 t->path, rank, s ? s : "?",
                                 !part[0] ? "not a pair (\"a b\" or [\"a\", \"b\"])"
                                 : id[0] == NO_ID || id[1] == NO_ID
                                     ? "a part that is no token of model.vocab"
                                     : "the merged token is not in model.vocab");
            free(s);
            return rc2;
        }
        uint64_t key = ((uint64_t)id[0] << 32 | id[1]) + 1;
        size_t i = hash_u64(key) & (t->mcap - 1);
        while (t->mkey[i] && t->mkey[i] != key)
            i = (i + 1) & (t->mcap - 1);
        if (!t->mkey[i]) { /* a repeated pair keeps its first (lowest) rank */
            t->mkey[i] = key;
            t->mrank[i] = rank;
            t->mid[i] = id[2];
        }
    }
    return DT_OK;
}

/* The id `tokenizers` gives added token k (AddedVocabulary::add_tokens):
 * an earlier added token's or the vocabulary's id for the same text, else
 * the next after the vocabulary's size (entries, not the largest id) or
 * after the largest added id so far. */
static uint32_t added_id_rule(const dt_tokenizer_t *t, uint32_t k, const char *content,
                              uint32_t vocab_n)
{
    for (uint32_t i = 0; i < k; i++)
        if (t->added[i].len == strlen(content) &&
            memcmp(t->blob + t->added[i].off, content, t->added[i].len) == 0)
            return t->added[i].id;
    size_t n = strlen(content), len;
    unsigned char *b = malloc(n + 1);
    uint32_t id = b && key_bytes(content, b, &len) == 0 ? vmap_find(t, b, len) : NO_ID;
    free(b);
    if (id != NO_ID)
        return id;
    if (k == 0)
        return vocab_n;
    uint32_t max = 0;
    for (uint32_t i = 0; i < k; i++)
        max = t->added[i].id > max ? t->added[i].id : max;
    return max >= vocab_n || vocab_n == 0 ? max + 1 : vocab_n;
}

static int load_added(dt_tokenizer_t *t, const cJSON *added, uint32_t vocab_n)
{
    if (!added || cJSON_IsNull(added))
        return DT_OK;
    if (!cJSON_IsArray(added))
        return fail(t, "added_tokens", "expected an array, found ", json_type_name(added));
    int n = cJSON_GetArraySize(added);
    if (n && !(t->added = calloc((size_t)n, sizeof *t->added)))
        return dt_err_set(DT_ERR_NOMEM, "tokenizer '%s': out of memory", t->path);
    int i = 0;
    for (const cJSON *e = added->child; e; e = e->next, i++) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || !(id->valuedouble >= 0 && id->valuedouble < (1u << 30)) ||
            !cJSON_IsString(content) || !*content->valuestring)
            return dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': added_tokens[%d]: needs a whole "
                              "\"id\" and a non-empty \"content\"", t->path, i);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "single_word")))
            return dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': added_tokens[%d] (\"%s\"): "
                              "single_word = true is not supported", t->path, i,
                              content->valuestring);
        uint32_t want = added_id_rule(t, t->n_added, content->valuestring, vocab_n);
        if (want != (uint32_t)id->valuedouble)
            return dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': added_tokens[%d] (\"%s\"): id %u, "
                              "but the tokenizers library gives it id %u (the vocabulary's id "
                              "for its text, or the next after the vocabulary and the added "
                              "tokens before it): the file's ids disagree", t->path, i,
                              content->valuestring, (uint32_t)id->valuedouble, want);
        added_t *a = &t->added[t->n_added++];
        a->id = want;
        a->lstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "lstrip"));
        a->rstrip = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "rstrip"));
        a->normalized = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "normalized"));
        span_t s;
        int rc = blob_add(t, content->valuestring, strlen(content->valuestring), &s);
        if (!rc)
            rc = ids_reserve(t, a->id);
        if (rc)
            return rc;
        a->off = s.off;
        a->len = s.len;
        t->tok[a->id] = s; /* an added token decodes to its text */
        t->n_normalized += (uint32_t)a->normalized;
    }
    /* grouped by first byte (a stable counting sort): first[b] is where
     * the tokens starting with byte b begin */
    added_t *sorted = t->n_added ? malloc(t->n_added * sizeof *sorted) : NULL;
    if (t->n_added && !sorted)
        return dt_err_set(DT_ERR_NOMEM, "tokenizer '%s': out of memory", t->path);
    uint32_t count[257] = {0};
    for (uint32_t k = 0; k < t->n_added; k++)
        count[(unsigned char)t->blob[t->added[k].off] + 1]++;
    for (int b = 0; b < 256; b++)
        count[b + 1] += count[b];
    memcpy(t->first, count, sizeof count);
    for (uint32_t k = 0; k < t->n_added; k++)
        sorted[count[(unsigned char)t->blob[t->added[k].off]]++] = t->added[k];
    free(t->added);
    t->added = sorted;
    return DT_OK;
}

static int compile_pattern(dt_tokenizer_t *t, const char *pattern, const char *key)
{
    int err;
    PCRE2_SIZE at;
    t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': %s: the pattern does not compile at "
                          "offset %zu: %s", t->path, key, (size_t)at, (const char *)msg);
    }
    (void)pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE); /* no JIT: interpreted, same result */
    return DT_OK;
}

static int byte_level(dt_tokenizer_t *t, const cJSON *p, const char *key, int regex_allowed)
{
    t->add_prefix_space = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space"));
    const cJSON *ur = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
    int use_regex = !ur || cJSON_IsTrue(ur); /* tokenizers' default: true */
    if (use_regex && !regex_allowed)
        return fail(t, key, "use_regex = true after a Split is not supported", NULL);
    return use_regex ? compile_pattern(t, GPT2_PATTERN, key) : DT_OK;
}

/* `pre_tokenizer`: ByteLevel, or Sequence [Split (Regex, Isolated),
 * ByteLevel (use_regex false)]. */
static int load_pre(dt_tokenizer_t *t, const cJSON *pre)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    const char *ty = cJSON_IsString(type) ? type->valuestring : "";
    if (strcmp(ty, "ByteLevel") == 0)
        return byte_level(t, pre, "pre_tokenizer", 1);
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers");
    if (strcmp(ty, "Sequence") != 0 || !cJSON_IsArray(steps) || cJSON_GetArraySize(steps) != 2)
        return fail(t, "pre_tokenizer", "only ByteLevel, or a Sequence of a Split and a "
                    "ByteLevel, is supported; this one is ", *ty ? ty : json_type_name(pre));
    const cJSON *split = steps->child, *bl = split->next;
    const char *t0 = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(split, "type"))
                         ? cJSON_GetObjectItemCaseSensitive(split, "type")->valuestring : "?";
    const char *t1 = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(bl, "type"))
                         ? cJSON_GetObjectItemCaseSensitive(bl, "type")->valuestring : "?";
    if (strcmp(t0, "Split") != 0 || strcmp(t1, "ByteLevel") != 0) {
        char what[160];
        snprintf(what, sizeof what, "[%s, %s]", t0, t1);
        return fail(t, "pre_tokenizer.pretokenizers", "only [Split, ByteLevel] is supported, "
                    "not ", what);
    }
    const cJSON *beh = cJSON_GetObjectItemCaseSensitive(split, "behavior");
    if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0)
        return fail(t, "pre_tokenizer.pretokenizers[0].behavior", "only \"Isolated\" is "
                    "supported, not ", cJSON_IsString(beh) ? beh->valuestring
                                                           : json_type_name(beh));
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(split, "invert")))
        return fail(t, "pre_tokenizer.pretokenizers[0].invert", "true is not supported", NULL);
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(split, "pattern");
    const cJSON *rx = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    if (!cJSON_IsString(rx))
        return fail(t, "pre_tokenizer.pretokenizers[0].pattern", "only {\"Regex\": ...} is "
                    "supported (a String pattern is not)", NULL);
    int rc = compile_pattern(t, rx->valuestring, "pre_tokenizer.pretokenizers[0].pattern.Regex");
    return rc ? rc : byte_level(t, bl, "pre_tokenizer.pretokenizers[1]", 0);
}

void dt_tokenizer_free(dt_tokenizer_t *t)
{
    if (!t)
        return;
    pcre2_code_free(t->re);
    free(t->path);
    free(t->blob);
    free(t->tok);
    free(t->vmap);
    free(t->mkey);
    free(t->mrank);
    free(t->mid);
    free(t->added);
    free(t);
}

int dt_tokenizer_load(const char *path, dt_tokenizer_t **out)
{
    *out = NULL;
    byte_table_init();
    dt_tokenizer_t *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return dt_err_set(DT_ERR_NOMEM, "tokenizer '%s': out of memory", path);
    }
    char what[PATH_MAX + 16];
    snprintf(what, sizeof what, "tokenizer '%s'", path);
    int fd = -1;
    uint64_t size = 0;
    size_t len = 0;
    char *text = NULL;
    cJSON *root = NULL;
    int rc = dt_fileutil_open_input(path, 0, what, &fd, &size);
    if (!rc) { /* a tokenizer.json of more than MAX_FILE is refused */
        rc = dt_fileutil_read_fd(fd, size, MAX_FILE, what, &text, &len);
        close(fd);
    }
    if (!rc) {
        root = cJSON_ParseWithLength(text, len);
        if (!root || !cJSON_IsObject(root))
            rc = dt_err_set(DT_ERR_CONFIG, "tokenizer '%s': not a JSON object (a Hugging Face "
                            "tokenizer.json)", path);
    }
    free(text);
    const cJSON *norm = root ? cJSON_GetObjectItemCaseSensitive(root, "normalizer") : NULL;
    if (!rc && norm && !cJSON_IsNull(norm)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(norm, "type");
        if (cJSON_IsString(ty) && strcmp(ty->valuestring, "NFC") == 0)
            t->nfc = 1; /* Qwen2's */
        else
            rc = fail(t, "normalizer", "not supported (only null and NFC); this one is ",
                      cJSON_IsString(ty) ? ty->valuestring : json_type_name(norm));
    }
    const cJSON *model = root ? cJSON_GetObjectItemCaseSensitive(root, "model") : NULL;
    if (!rc && !cJSON_IsObject(model))
        rc = fail(t, "model", "expected an object, found ", json_type_name(model));
    if (!rc)
        rc = load_model(t, model);
    if (!rc)
        rc = load_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"),
                        (uint32_t)cJSON_GetArraySize(
                            cJSON_GetObjectItemCaseSensitive(model, "vocab")));
    const cJSON *pre = root ? cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer") : NULL;
    if (!rc && !cJSON_IsObject(pre))
        rc = fail(t, "pre_tokenizer", "expected an object, found ", json_type_name(pre));
    if (!rc)
        rc = load_pre(t, pre);
    cJSON_Delete(root);
    if (rc) {
        dt_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return DT_OK;
}

uint32_t dt_tokenizer_vocab_size(const dt_tokenizer_t *t)
{
    uint32_t n = t->n_ids;
    while (n > 0 && t->tok[n - 1].len == UINT32_MAX)
        n--;
    return n;
}

const char *dt_tokenizer_token(const dt_tokenizer_t *t, uint32_t id, size_t *len)
{
    if (id >= t->n_ids || t->tok[id].len == UINT32_MAX)
        return NULL;
    *len = t->tok[id].len;
    return t->blob + t->tok[id].off;
}

void dt_token_vec_free(dt_token_vec_t *v)
{
    free(v->ids);
    *v = (dt_token_vec_t){0};
}

static int vec_push(dt_token_vec_t *v, const uint32_t *ids, size_t n)
{
    if (v->n + n > v->cap) {
        size_t cap = v->cap ? v->cap : 1024;
        while (cap < v->n + n)
            cap *= 2;
        uint32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p)
            return -1;
        v->ids = p;
        v->cap = cap;
    }
    memcpy(v->ids + v->n, ids, n * sizeof *ids);
    v->n += n;
    return 0;
}

/* ---------------------------------------------------------------- BPE */

typedef struct {
    uint64_t hash;
    uint32_t off; /* in the arena: the bytes, then the ids */
    uint16_t nbytes, nids;
} cslot_t;

/* One thread's working memory. */
typedef struct {
    cslot_t *slots;
    unsigned char *arena;
    size_t arena_used;
    uint32_t *id, *nxt, *prv;
    uint64_t *heap;
    size_t cap; /* of id/nxt/prv, and heap (2x) */
} work_t;

static void work_free(work_t *w)
{
    free(w->slots);
    free(w->arena);
    free(w->id);
    free(w->nxt);
    free(w->prv);
    free(w->heap);
}

static int work_grow(work_t *w, size_t n)
{
    if (n <= w->cap)
        return 0;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < n)
        cap *= 2;
    uint32_t *a = realloc(w->id, cap * 4), *b = a ? realloc(w->nxt, cap * 4) : NULL;
    if (a)
        w->id = a;
    if (b)
        w->nxt = b;
    uint32_t *c = b ? realloc(w->prv, cap * 4) : NULL;
    if (c)
        w->prv = c;
    uint64_t *h = c ? realloc(w->heap, 2 * cap * 8) : NULL;
    if (h)
        w->heap = h;
    if (!h)
        return -1;
    w->cap = cap;
    return 0;
}

static void heap_push(uint64_t *h, size_t *n, uint64_t v)
{
    size_t i = (*n)++;
    while (i > 0 && h[(i - 1) / 2] > v) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], v = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1] < h[c])
            c++;
        if (h[c] >= v)
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

static void push_pair(const dt_tokenizer_t *t, work_t *w, size_t *nh, uint32_t pos)
{
    uint32_t nx = w->nxt[pos], id = NO_ID;
    if (nx == NO_ID)
        return;
    uint32_t r = merge_find(t, w->id[pos], w->id[nx], &id);
    if (r != NO_ID)
        heap_push(w->heap, nh, (uint64_t)r << 32 | pos);
}

/* The ids of piece p[0, n), appended to out. */
static int bpe_piece(const dt_tokenizer_t *t, work_t *w, const unsigned char *p, size_t n,
                     dt_token_vec_t *out)
{
    if (n == 1)
        return vec_push(out, &t->byte_id[p[0]], 1);
    if (t->ignore_merges) {
        uint32_t id = vmap_find(t, p, n);
        if (id != NO_ID)
            return vec_push(out, &id, 1);
    }
    uint64_t hash = hash_bytes(p, n);
    cslot_t *slot = n <= CACHE_MAX_PIECE ? &w->slots[hash & (CACHE_SLOTS - 1)] : NULL;
    if (slot && slot->nbytes == n && slot->hash == hash &&
        memcmp(w->arena + slot->off, p, n) == 0) {
        uint32_t ids[CACHE_MAX_PIECE];
        memcpy(ids, w->arena + slot->off + n, (size_t)slot->nids * 4);
        return vec_push(out, ids, slot->nids);
    }
    if (work_grow(w, n) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        w->id[i] = t->byte_id[p[i]];
        w->nxt[i] = i + 1 < n ? (uint32_t)(i + 1) : NO_ID;
        w->prv[i] = i ? (uint32_t)(i - 1) : NO_ID;
    }
    size_t nh = 0;
    for (uint32_t i = 0; i + 1 < n; i++)
        push_pair(t, w, &nh, i);
    while (nh) {
        uint64_t top = heap_pop(w->heap, &nh);
        uint32_t pos = (uint32_t)top, rank = (uint32_t)(top >> 32), nx = w->nxt[pos], id = NO_ID;
        /* stale: the symbol was merged away or its pair changed since */
        if (w->id[pos] == NO_ID || nx == NO_ID ||
            merge_find(t, w->id[pos], w->id[nx], &id) != rank)
            continue;
        w->id[pos] = id;
        w->id[nx] = NO_ID;
        w->nxt[pos] = w->nxt[nx];
        if (w->nxt[nx] != NO_ID)
            w->prv[w->nxt[nx]] = pos;
        if (w->prv[pos] != NO_ID)
            push_pair(t, w, &nh, w->prv[pos]);
        push_pair(t, w, &nh, pos);
    }
    size_t k = 0;
    for (uint32_t i = 0; i != NO_ID; i = w->nxt[i])
        w->id[k++] = w->id[i];
    if (slot) { /* remember it; a full arena starts over */
        size_t need = n + 4 * k;
        if (w->arena_used + need > CACHE_ARENA) {
            memset(w->slots, 0, CACHE_SLOTS * sizeof *w->slots);
            w->arena_used = 0;
        }
        memcpy(w->arena + w->arena_used, p, n);
        memcpy(w->arena + w->arena_used + n, w->id, 4 * k);
        *slot = (cslot_t){hash, (uint32_t)w->arena_used, (uint16_t)n, (uint16_t)k};
        w->arena_used += need;
    }
    return vec_push(out, w->id, k);
}

/* ------------------------------------------------------------ pieces */

/* A piece: bytes p[0, len), or an added token (id != NO_ID). */
typedef struct {
    const unsigned char *p;
    uint32_t len, id;
} piece_t;

/* A stretch of bytes and where the scan of it stands. */
typedef struct {
    const unsigned char *p;
    size_t len, pos;
    unsigned char *owned; /* p, when this level made it (NFC, a prefix space) */
} cursor_t;

/* Where the splitting stands, three levels deep as in `tokenizers`:
 *  raw   the text, cut by the non-normalized added tokens;
 *  norm  a stretch of it between two of them, normalized (NFC) when the
 *        file asks, cut by the normalized added tokens;
 *  sub   a stretch of that, with a space in front under add_prefix_space,
 *        cut by the pattern into pieces.
 * A level's token after its current stretch is pending until the stretch
 * is done.  Buffers a level made stay alive until the window whose pieces
 * point into them has been encoded (retire, then split_window_done). */
typedef struct {
    const dt_tokenizer_t *t;
    cursor_t raw, norm, sub;
    int in_norm, in_sub;
    uint32_t raw_token, norm_token; /* pending, or NO_ID */
    size_t raw_next, norm_next;     /* where the level goes on after it */
    unsigned char **retired;
    size_t n_retired, cap_retired;
    pcre2_match_data *md;
} splitter_t;

/* The first added token in text[from, len), leftmost and then longest, of
 * the kind `normalized`; its span with the strips in [*b, *e). */
static uint32_t find_added(const dt_tokenizer_t *t, const unsigned char *text, size_t from,
                           size_t len, int normalized, size_t *b, size_t *e)
{
    if (normalized ? !t->n_normalized : t->n_normalized == t->n_added)
        return NO_ID;
    for (size_t i = from; i < len; i++) {
        uint32_t best = NO_ID, best_len = 0;
        for (uint32_t k = t->first[text[i]]; k < t->first[text[i] + 1]; k++) {
            const added_t *a = &t->added[k];
            if (a->normalized != normalized || a->len <= best_len || a->len > len - i ||
                memcmp(t->blob + a->off, text + i, a->len) != 0)
                continue;
            best = k;
            best_len = a->len;
        }
        if (best == NO_ID)
            continue;
        const added_t *a = &t->added[best];
        size_t s = i, end = i + a->len;
        if (a->lstrip)
            while (s > from) { /* whitespace characters just before it */
                size_t k = s - 1, used;
                while (k > from && (text[k] & 0xC0) == 0x80 && s - k < 4)
                    k--;
                if (!is_ws(dt_utf8_decode(text + k, s - k, &used)) || k + used != s)
                    break;
                s = k;
            }
        if (a->rstrip)
            for (size_t used; end < len && is_ws(dt_utf8_decode(text + end, len - end, &used));)
                end += used;
        *b = s;
        *e = end;
        return a->id;
    }
    return NO_ID;
}

static int retire(splitter_t *s, cursor_t *c)
{
    if (!c->owned)
        return 0;
    if (s->n_retired == s->cap_retired) {
        size_t cap = s->cap_retired ? 2 * s->cap_retired : 16;
        unsigned char **r = realloc(s->retired, cap * sizeof *r);
        if (!r)
            return -1;
        s->retired = r;
        s->cap_retired = cap;
    }
    s->retired[s->n_retired++] = c->owned;
    c->owned = NULL;
    return 0;
}

/* The window's pieces are encoded: the buffers they pointed into go. */
static void split_window_done(splitter_t *s)
{
    for (size_t i = 0; i < s->n_retired; i++)
        free(s->retired[i]);
    s->n_retired = 0;
}

/* NFC of p[0, n) into a new buffer (*out, *out_len): runs of valid UTF-8
 * are normalized, invalid bytes kept as they are. */
static int nfc(const unsigned char *p, size_t n, unsigned char **out, size_t *out_len)
{
    unsigned char *o = malloc(n * 3 + 1); /* NFC grows a character at most 3x */
    if (!o)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i, used;
        while (j < n && dt_utf8_decode(p + j, n - j, &used) >= 0)
            j += used;
        if (j > i) {
            utf8proc_uint8_t *m = NULL;
            utf8proc_ssize_t r = utf8proc_map(p + i, (utf8proc_ssize_t)(j - i), &m,
                                              UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (r < 0 || (size_t)r > (j - i) * 3) {
                free(m);
                free(o);
                return -1;
            }
            memcpy(o + k, m, (size_t)r);
            k += (size_t)r;
            free(m);
            i = j;
        }
        while (i < n && dt_utf8_decode(p + i, n - i, &used) < 0)
            o[k++] = p[i++];
    }
    *out = o;
    *out_len = k;
    return 0;
}

/* Enter the next stretch of the raw text: up to the next non-normalized
 * added token, normalized when the file asks. */
static int enter_norm(splitter_t *s)
{
    const dt_tokenizer_t *t = s->t;
    size_t b = s->raw.len, e = s->raw.len;
    s->raw_token = find_added(t, s->raw.p, s->raw.pos, s->raw.len, 0, &b, &e);
    s->raw_next = s->raw_token == NO_ID ? s->raw.len : e;
    s->norm = (cursor_t){s->raw.p + s->raw.pos, b - s->raw.pos, 0, NULL};
    if (t->nfc && s->norm.len) {
        unsigned char *o;
        size_t n;
        if (nfc(s->norm.p, s->norm.len, &o, &n) != 0)
            return -1;
        s->norm = (cursor_t){o, n, 0, o};
    }
    s->in_norm = 1;
    return 0;
}

/* Enter the next stretch of the normalized one: up to the next normalized
 * added token, with a space in front under add_prefix_space. */
static int enter_sub(splitter_t *s)
{
    const dt_tokenizer_t *t = s->t;
    size_t b = s->norm.len, e = s->norm.len;
    s->norm_token = find_added(t, s->norm.p, s->norm.pos, s->norm.len, 1, &b, &e);
    s->norm_next = s->norm_token == NO_ID ? s->norm.len : e;
    s->sub = (cursor_t){s->norm.p + s->norm.pos, b - s->norm.pos, 0, NULL};
    if (t->add_prefix_space && s->sub.len && s->sub.p[0] != ' ') {
        unsigned char *o = malloc(s->sub.len + 1);
        if (!o)
            return -1;
        o[0] = ' ';
        memcpy(o + 1, s->sub.p, s->sub.len);
        s->sub = (cursor_t){o, s->sub.len + 1, 0, o};
    }
    s->in_sub = 1;
    return 0;
}

/* Up to `max` pieces into out; 0 when the text is done. */
static size_t split_some(splitter_t *s, piece_t *out, size_t max, int *err)
{
    const dt_tokenizer_t *t = s->t;
    size_t n = 0;
    while (n < max) {
        if (!s->in_norm) {
            if (s->raw.pos >= s->raw.len)
                break;
            if (enter_norm(s) != 0)
                return *err = DT_ERR_NOMEM, n;
        }
        if (!s->in_sub) {
            if (s->norm.pos >= s->norm.len) {
                /* the normalized stretch is done: its token, then on */
                if (s->raw_token != NO_ID)
                    out[n++] = (piece_t){NULL, 0, s->raw_token};
                s->raw.pos = s->raw_next;
                s->in_norm = 0;
                if (retire(s, &s->norm) != 0)
                    return *err = DT_ERR_NOMEM, n;
                continue;
            }
            if (enter_sub(s) != 0)
                return *err = DT_ERR_NOMEM, n;
        }
        cursor_t *c = &s->sub;
        while (n < max && c->pos < c->len) {
            size_t at = c->pos, mb = c->len, me = c->len;
            if (t->re) {
                int rc = pcre2_match(t->re, c->p, c->len, at, 0, s->md, NULL);
                if (rc >= 0) {
                    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
                    mb = ov[0];
                    me = ov[1];
                } else if (rc != PCRE2_ERROR_NOMATCH) {
                    *err = dt_err_set(DT_ERR_DATA, "tokenizer '%s': pattern match failed at "
                                      "byte %zu (PCRE2 error %d)", t->path, at, rc);
                    return n;
                }
            }
            if (mb > at) { /* the text before the match is a piece too */
                out[n++] = (piece_t){c->p + at, (uint32_t)(mb - at), NO_ID};
                c->pos = mb;
                continue;
            }
            if (me == mb) { /* an empty match: one character on its own */
                size_t used;
                dt_utf8_decode(c->p + at, c->len - at, &used);
                me = at + used;
            }
            out[n++] = (piece_t){c->p + at, (uint32_t)(me - at), NO_ID};
            c->pos = me;
        }
        if (c->pos < c->len || n == max)
            break; /* the window is full */
        /* the sub-stretch is done: its normalized token, then on */
        if (s->norm_token != NO_ID)
            out[n++] = (piece_t){NULL, 0, s->norm_token};
        s->norm.pos = s->norm_next;
        s->norm_token = NO_ID;
        s->in_sub = 0;
        if (retire(s, &s->sub) != 0)
            return *err = DT_ERR_NOMEM, n;
    }
    return n;
}

/* ----------------------------------------------------------- encoding */

/* Bytes of the raw text split so far (a stretch being split counts as
 * done: progress only). */
static size_t split_done(const splitter_t *s)
{
    return s->raw.pos;
}

typedef struct {
    const dt_tokenizer_t *t;
    work_t w;
    const piece_t *pieces;
    size_t n;
    dt_token_vec_t out;
    int failed;
    pthread_t th;
} job_t;

static void *bpe_job(void *arg)
{
    job_t *j = arg;
    j->out.n = 0;
    for (size_t i = 0; i < j->n && !j->failed; i++) {
        const piece_t *p = &j->pieces[i];
        if (p->id != NO_ID ? vec_push(&j->out, &p->id, 1) != 0
                           : bpe_piece(j->t, &j->w, p->p, p->len, &j->out) != 0)
            j->failed = 1;
    }
    return NULL;
}

int dt_tokenizer_encode(const dt_tokenizer_t *t, const char *text, size_t len, int threads,
                        void (*progress)(void *arg, size_t done, size_t total), void *arg,
                        dt_token_vec_t *out)
{
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c > 0 ? (int)c : 1;
    }
    if (threads > 64)
        threads = 64;
    splitter_t s = {.t = t, .raw = {(const unsigned char *)text, len, 0, NULL},
                    .raw_token = NO_ID, .norm_token = NO_ID};
    piece_t *pieces = malloc(WINDOW_PIECES * sizeof *pieces);
    job_t *jobs = calloc((size_t)threads, sizeof *jobs);
    s.md = t->re ? pcre2_match_data_create_from_pattern(t->re, NULL) : NULL;
    int rc = DT_OK;
    for (int i = 0; jobs && i < threads && !rc; i++) {
        jobs[i].t = t;
        jobs[i].w.slots = calloc(CACHE_SLOTS, sizeof(cslot_t));
        jobs[i].w.arena = malloc(CACHE_ARENA);
        if (!jobs[i].w.slots || !jobs[i].w.arena)
            rc = DT_ERR_NOMEM;
    }
    if (!pieces || !jobs || (t->re && !s.md) || rc)
        rc = dt_err_set(DT_ERR_NOMEM, "tokenizer '%s': out of memory", t->path);
    while (!rc) {
        int err = DT_OK;
        size_t n = split_some(&s, pieces, WINDOW_PIECES, &err);
        if (err) {
            rc = err == DT_ERR_NOMEM ? dt_err_set(DT_ERR_NOMEM, "tokenizer '%s': out of memory",
                                                  t->path) : err;
            break;
        }
        if (n == 0)
            break;
        int used = n < 4096 ? 1 : threads; /* small windows: not worth a thread */
        for (int i = 0; i < used; i++) {
            size_t lo = n * (size_t)i / (size_t)used, hi = n * (size_t)(i + 1) / (size_t)used;
            jobs[i].pieces = pieces + lo;
            jobs[i].n = hi - lo;
            if (i == 0 || pthread_create(&jobs[i].th, NULL, bpe_job, &jobs[i]) != 0)
                jobs[i].th = 0, bpe_job(&jobs[i]);
        }
        for (int i = 1; i < used; i++)
            if (jobs[i].th)
                pthread_join(jobs[i].th, NULL);
        for (int i = 0; i < used && !rc; i++)
            if (jobs[i].failed || vec_push(out, jobs[i].out.ids, jobs[i].out.n) != 0)
                rc = dt_err_set(DT_ERR_NOMEM, "tokenizer '%s': out of memory", t->path);
        split_window_done(&s);
        if (progress)
            progress(arg, split_done(&s), len);
    }
    for (int i = 0; jobs && i < threads; i++) {
        work_free(&jobs[i].w);
        dt_token_vec_free(&jobs[i].out);
    }
    free(jobs);
    free(pieces);
    split_window_done(&s);
    free(s.norm.owned);
    free(s.sub.owned);
    free(s.retired);
    pcre2_match_data_free(s.md);
    return rc;
}
