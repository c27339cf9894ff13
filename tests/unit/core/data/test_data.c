/*
 * tests/unit/core/data/test_data.c - llm.c token files (every format error with its
 * exact message), byte-level preparation, and the sampler's promises:
 * dp-size-independent global batches, full disjoint epoch coverage,
 * determinism per seed, fresh order per epoch; and files that are not
 * what they should be (a FIFO, a file truncated or rewritten while in
 * use, a validation file too small for one batch) fail with the file named.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data.h"
#include "util/fileutil.h"
#include "util/error.h"
#include "test_assert.h"
#include "test_hooks.h"

static char g_dir[256];

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/dt_test_data.XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    dt_fileutil_test_fail_after(-1);
    return dt_fileutil_rm_rf(g_dir);
}

/* "<g_dir>/<name>" in a rotating buffer, valid for the next 7 calls; a
 * path a test keeps longer goes in a local copy (LOCAL_PATH). */
static const char *tpath(const char *name)
{
    static char buf[8][512];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

#define LOCAL_PATH(var, name) char var[512]; snprintf(var, sizeof var, "%s", tpath(name))

static void write_raw(const char *path, const void *buf, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
}

/* A valid token file of `n` tokens (llm.c's layout: 256 int32 header with
 * magic, version and count, then u16 tokens), written independently of
 * the core's writer. */
static void write_tokens(const char *path, const uint16_t *tok, uint64_t n)
{
    int32_t h[DT_DATA_HEADER_INTS] = {DT_DATA_MAGIC, DT_DATA_VERSION, (int32_t)n};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(h, sizeof h, 1, f), 1);
    assert_int_equal(fwrite(tok, sizeof *tok, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* The whole file `path`, malloc'd (the caller frees it); *n its size. */
static unsigned char *slurp(const char *path, size_t *n)
{
    char *b;
    assert_ok(dt_fileutil_read_all(path, &b, n));
    return (unsigned char *)b;
}

/* The tokens of a token file as its bytes say (llm.c's layout), read
 * independently of the core's reader; the caller frees *raw. */
static const uint16_t *file_tokens(const char *path, unsigned char **raw)
{
    size_t n;
    *raw = slurp(path, &n);
    assert_true(n >= DT_DATA_HEADER_BYTES);
    return (const uint16_t *)(*raw + DT_DATA_HEADER_BYTES);
}

/* A token file whose header says `claimed` tokens but holds `real`. */
static void write_header_file(const char *path, int32_t magic, int32_t ver,
                              int32_t claimed, size_t real)
{
    size_t n = DT_DATA_HEADER_BYTES + real * 2;
    char *buf = calloc(1, n);
    int32_t *h = (int32_t *)buf;
    h[0] = magic;
    h[1] = ver;
    h[2] = claimed;
    write_raw(path, buf, n);
    free(buf);
}


/* ---- file format ----------------------------------------------------- */

static void test_roundtrip(void **state)
{
    enum { N = 1000 };
    uint16_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (uint16_t)(i * 37 % 50257);
    tok[N - 1] = 50256;
    LOCAL_PATH(p, "rt.bin");
    write_tokens(p, tok, N);
    dt_dataset_t *ds;
    assert_int_equal(dt_data_open(p, &ds), DT_OK);
    assert_int_equal(ds->ntok, N);
    /* read back as one sequence of N - 1 tokens: inputs tok[0..N-2],
     * targets tok[1..N-1] */
    int32_t *in = malloc(sizeof(int32_t) * (N - 1));
    int32_t *tg = malloc(sizeof(int32_t) * (N - 1));
    assert_ok(dt_data_eval_fill(ds, N - 1, 1, 0, 0, 1, in, tg));
    for (int i = 0; i < N - 1; i++) {
        assert_int_equal(in[i], tok[i]);
        assert_int_equal(tg[i], tok[i + 1]);
    }
    free(in);
    free(tg);
    assert_int_equal(ds->max_token, 50256);
    assert_int_equal(dt_data_check_vocab(ds, 50257), DT_OK);
    dt_data_close(ds);
}

static void test_open_missing(void **state)
{
    dt_dataset_t *ds = (void *)1;
    LOCAL_PATH(p, "nope.bin");
    assert_int_equal(dt_data_open(p, &ds), DT_ERR_NOT_FOUND);
    assert_null(ds);
    char want[600];
    snprintf(want, sizeof want, "data file '%s': No such file or directory", p);
    assert_msg_has(want);
}

static void test_open_short_header(void **state)
{
    char buf[100] = {0};
    LOCAL_PATH(p, "short.bin");
    write_raw(p, buf, sizeof buf);
    dt_dataset_t *ds;
    assert_int_equal(dt_data_open(p, &ds), DT_ERR_DATA);
    assert_msg_has("truncated: 100 bytes, header needs 1024");
    write_raw(p, buf, 0);
    assert_int_equal(dt_data_open(p, &ds), DT_ERR_DATA);
    assert_msg_has("truncated: 0 bytes, header needs 1024");
}

static void test_open_bad_magic(void **state)
{
    LOCAL_PATH(p, "magic.bin");
    write_header_file(p, 123, 1, 4, 4);
    dt_dataset_t *ds;
    assert_int_equal(dt_data_open(p, &ds), DT_ERR_DATA);
    assert_msg_has("bad magic 123 (expected 20240520, or 20240801 for uint32 tokens): not an "
                   "llm.c token file");
}

static void test_open_bad_version(void **state)
{
    LOCAL_PATH(p, "ver.bin");
    write_header_file(p, DT_DATA_MAGIC, 7, 4, 4);
    dt_dataset_t *ds;
    assert_int_equal(dt_data_open(p, &ds), DT_ERR_DATA);
    assert_msg_has("unsupported version 7 (expected 1 with magic 20240520: uint16 tokens)");
    /* and the uint32 kind's magic with the uint16 kind's version */
    write_header_file(p, DT_DATA_MAGIC32, 1, 4, 4);
    assert_int_equal(dt_data_open(p, &ds), DT_ERR_DATA);
    assert_msg_has("unsupported version 1 (expected 7 with magic 20240801: uint32 tokens)");
}

static void test_open_count_mismatch(void **state)
{
    LOCAL_PATH(p, "count.bin");
    dt_dataset_t *ds;
    write_header_file(p, DT_DATA_MAGIC, 1, 1000, 500);
    assert_int_equal(dt_data_open(p, &ds), DT_ERR_DATA);
    assert_msg_has("truncated: header says 1000 tokens (3024 bytes) but the file "
               "has 2024 bytes");
    write_header_file(p, DT_DATA_MAGIC, 1, 10, 12);
    assert_int_equal(dt_data_open(p, &ds), DT_ERR_DATA);
    assert_msg_has("header says 10 tokens (1044 bytes) but the file has 1048 "
               "bytes (trailing data)");
    write_header_file(p, DT_DATA_MAGIC, 1, -5, 0);
    assert_int_equal(dt_data_open(p, &ds), DT_ERR_DATA);
    assert_msg_has("negative token count -5");
}

static void test_vocab_check(void **state)
{
    enum { N = 5000 };
    uint16_t *tok = malloc(N * sizeof *tok);
    for (int i = 0; i < N; i++)
        tok[i] = (uint16_t)(i % 256);
    tok[1234] = 300;
    tok[4000] = 65535;
    LOCAL_PATH(p, "vocab.bin");
    write_tokens(p, tok, N);
    dt_dataset_t *ds;
    assert_int_equal(dt_data_open(p, &ds), DT_OK);
    assert_int_equal(ds->max_token, 65535);
    assert_int_equal(dt_data_check_vocab(ds, 256), DT_ERR_DATA);
    char want[700];
    snprintf(want, sizeof want, "data file '%s': token 300 at position 1234 "
             "is outside the vocabulary (vocab_size 256)", p);
    assert_msg_has(want);
    assert_int_equal(dt_data_check_vocab(ds, 301), DT_ERR_DATA);
    assert_msg_has("token 65535 at position 4000 is outside the vocabulary "
               "(vocab_size 301)");
    assert_int_equal(dt_data_check_vocab(ds, 65536), DT_OK);
    dt_data_close(ds);

    /* The offender in the unblocked tail (N not a multiple of the block). */
    for (int i = 0; i < N; i++)
        tok[i] = (uint16_t)(i % 256);
    tok[N - 1] = 256;
    write_tokens(p, tok, N);
    assert_int_equal(dt_data_open(p, &ds), DT_OK);
    assert_int_equal(ds->max_token, 256);
    assert_int_equal(dt_data_check_vocab(ds, 256), DT_ERR_DATA);
    assert_msg_has("token 256 at position 4999 is outside");
    assert_int_equal(dt_data_check_vocab(ds, 257), DT_OK);
    dt_data_close(ds);
    free(tok);
}

/* ---- prepare --------------------------------------------------------- */

static void test_prepare_split(void **state)
{
    enum { N = 1000 };
    unsigned char text[N];
    for (int i = 0; i < N; i++)
        text[i] = (unsigned char)(i * 7 + 200); /* includes bytes >= 128 */
    LOCAL_PATH(tp, "in.txt");
    write_raw(tp, text, N);
    uint64_t nt = 0, nv = 0;
    assert_int_equal(dt_data_prepare(tp, tpath("tr.bin"), tpath("va.bin"), 0.1,
                                     &nt, &nv), DT_OK);
    assert_int_equal(nt, 900);
    assert_int_equal(nv, 100);
    dt_dataset_t *tr, *va;
    assert_int_equal(dt_data_open(tpath("tr.bin"), &tr), DT_OK);
    assert_int_equal(dt_data_open(tpath("va.bin"), &va), DT_OK);
    assert_int_equal(tr->ntok, 900);
    assert_int_equal(va->ntok, 100);
    /* the header is llm.c's byte for byte */
    unsigned char *rt, *rv;
    const uint16_t *tt = file_tokens(tpath("tr.bin"), &rt);
    const uint16_t *tv = file_tokens(tpath("va.bin"), &rv);
    const int32_t *h = (const int32_t *)rt;
    assert_int_equal(h[0], 20240520);
    assert_int_equal(h[1], 1);
    assert_int_equal(h[2], 900);
    for (int i = 3; i < 256; i++)
        assert_int_equal(h[i], 0);
    for (int i = 0; i < 900; i++)
        assert_int_equal(tt[i], text[i]);
    for (int i = 0; i < 100; i++)
        assert_int_equal(tv[i], text[900 + i]);
    free(rt);
    free(rv);
    assert_int_equal(dt_data_check_vocab(tr, 256), DT_OK);
    dt_data_close(tr);
    dt_data_close(va);

    /* no split */
    assert_int_equal(dt_data_prepare(tp, tpath("all.bin"), NULL, 0.0, &nt, &nv),
                     DT_OK);
    assert_int_equal(nt, N);
    assert_int_equal(nv, 0);
    dt_test_assert_no_tmp(g_dir);
}

static void test_prepare_large_chunks(void **state)
{
    /* More than one 1 MiB read chunk, split point inside a chunk. */
    size_t n = (3u << 20) + 12345;
    unsigned char *text = malloc(n);
    for (size_t i = 0; i < n; i++)
        text[i] = (unsigned char)((i * 2654435761u) >> 13);
    LOCAL_PATH(tp, "big.txt");
    write_raw(tp, text, n);
    uint64_t nt, nv;
    assert_int_equal(dt_data_prepare(tp, tpath("btr.bin"), tpath("bva.bin"),
                                     0.25, &nt, &nv), DT_OK);
    assert_int_equal(nv, (uint64_t)(n * 0.25));
    assert_int_equal(nt + nv, n);
    dt_dataset_t *tr, *va;
    assert_int_equal(dt_data_open(tpath("btr.bin"), &tr), DT_OK);
    assert_int_equal(dt_data_open(tpath("bva.bin"), &va), DT_OK);
    assert_int_equal(tr->ntok, nt);
    assert_int_equal(va->ntok, nv);
    unsigned char *rt, *rv;
    const uint16_t *tt = file_tokens(tpath("btr.bin"), &rt);
    const uint16_t *tv = file_tokens(tpath("bva.bin"), &rv);
    for (size_t i = 0; i < nt; i++)
        if (tt[i] != text[i])
            fail_msg("train token %zu: %u != %u", i, tt[i], text[i]);
    for (size_t i = 0; i < nv; i++)
        if (tv[i] != text[nt + i])
            fail_msg("val token %zu differs", i);
    free(rt);
    free(rv);
    dt_data_close(tr);
    dt_data_close(va);
    free(text);
}

static void test_prepare_errors(void **state)
{
    LOCAL_PATH(tp, "e.txt");
    write_raw(tp, "", 0);
    assert_int_equal(dt_data_prepare(tp, tpath("o.bin"), NULL, 0, NULL, NULL),
                     DT_ERR_DATA);
    assert_msg_has("is empty");
    assert_int_equal(dt_data_prepare(tpath("absent.txt"), tpath("o.bin"), NULL,
                                     0, NULL, NULL), DT_ERR_NOT_FOUND);
    assert_msg_has("absent.txt': No such file or directory");
    write_raw(tp, "hello", 5);
    assert_int_equal(dt_data_prepare(tp, tpath("o.bin"), NULL, 0.1, NULL, NULL),
                     DT_ERR_INVALID);
    assert_msg_has("a val file needs a val fraction > 0");
    assert_int_equal(dt_data_prepare(tp, tpath("o.bin"), tpath("v.bin"), 1.5,
                                     NULL, NULL), DT_ERR_INVALID);
    assert_msg_has("val fraction 1.5 is outside [0, 1)");
    assert_int_equal(dt_data_prepare(tp, tpath("o.bin"), tpath("v.bin"), 0.1,
                                     NULL, NULL), DT_ERR_DATA);
    assert_msg_has("val fraction 0.1 of 5 bytes leaves no val tokens");
    assert_int_equal(access(tpath("o.bin"), F_OK), -1);
}

static void test_prepare_disk_full(void **state)
{
    LOCAL_PATH(tp, "df.txt");
    write_raw(tp, "old text", 8);
    assert_int_equal(dt_data_prepare(tp, tpath("df.bin"), NULL, 0, NULL, NULL),
                     DT_OK);
    char text[4000];
    memset(text, 'x', sizeof text);
    write_raw(tp, text, sizeof text);
    /* Fail inside the token data, inside the header, and at the first byte. */
    int64_t budgets[] = {3000, 100, 0};
    for (size_t i = 0; i < sizeof budgets / sizeof *budgets; i++) {
        dt_fileutil_test_fail_after(budgets[i]);
        assert_int_equal(dt_data_prepare(tp, tpath("df.bin"), NULL, 0, NULL,
                                         NULL), DT_ERR_IO);
        dt_fileutil_test_fail_after(-1);
        char want[600];
        snprintf(want, sizeof want, "writing '%s': No space left on device",
                 tpath("df.bin"));
        assert_msg_has(want);
        dt_test_assert_no_tmp(g_dir);
        dt_dataset_t *ds; /* the previous file is intact */
        assert_int_equal(dt_data_open(tpath("df.bin"), &ds), DT_OK);
        assert_int_equal(ds->ntok, 8);
        int32_t in[7], tg[7];
        assert_ok(dt_data_eval_fill(ds, 7, 1, 0, 0, 1, in, tg));
        assert_int_equal(in[0], 'o');
        dt_data_close(ds);
    }
}

/* ---- sampler --------------------------------------------------------- */

/* A file whose token i is i, so a row's first input names its sequence. */
static dt_dataset_t *iota_dataset(const char *name, uint64_t n)
{
    uint16_t *tok = malloc(n * sizeof *tok);
    for (uint64_t i = 0; i < n; i++)
        tok[i] = (uint16_t)i;
    write_tokens(tpath(name), tok, n);
    free(tok);
    dt_dataset_t *ds;
    assert_int_equal(dt_data_open(tpath(name), &ds), DT_OK);
    return ds;
}

/* Sequence indices of one step in global order, gathered rank by rank and
 * micro-step by micro-step for `dp` ranks; also checks every row's
 * inputs/targets against the file. */
static void step_seqs(dt_sampler_t *s, uint64_t step, uint32_t dp, uint32_t B,
                      uint32_t T, uint32_t G, uint64_t *out /* (G,) */)
{
    uint32_t accum = dt_sampler_grad_accum(s, dp);
    assert_int_equal(accum * B * dp, G);
    int32_t *in = malloc(sizeof(int32_t) * B * T);
    int32_t *tg = malloc(sizeof(int32_t) * B * T);
    for (uint32_t m = 0; m < accum; m++)
        for (uint32_t r = 0; r < dp; r++) {
            assert_int_equal(dt_sampler_fill(s, step, m, r, dp, in, tg), DT_OK);
            for (uint32_t b = 0; b < B; b++) {
                int32_t first = in[b * T];
                assert_int_equal(first % T, 0);
                for (uint32_t t = 0; t < T; t++) {
                    assert_int_equal(in[b * T + t], first + (int32_t)t);
                    assert_int_equal(tg[b * T + t], first + (int32_t)t + 1);
                }
                out[(m * dp + r) * B + b] = (uint64_t)first / T;
            }
        }
    free(in);
    free(tg);
}

static void test_sampler_too_small(void **state)
{
    dt_dataset_t *ds = iota_dataset("small.bin", 10);
    dt_sampler_t *s = (void *)1;
    assert_int_equal(dt_sampler_init(&s, ds, 16, 1, 1, 0, 1), DT_ERR_DATA);
    assert_null(s);
    assert_msg_has("10 tokens hold no full sequence of seq_len 16 (need at least "
               "17 tokens)");
    /* exactly T+1 tokens make one sequence: every step serves it */
    assert_int_equal(dt_sampler_init(&s, ds, 9, 1, 1, 0, 1), DT_OK);
    for (uint64_t step = 0; step < 3; step++) {
        uint64_t got;
        step_seqs(s, step, 1, 1, 9, 1, &got);
        assert_int_equal(got, 0);
    }
    dt_sampler_free(s);
    assert_int_equal(dt_sampler_init(&s, ds, 4, 3, 4, 0, 1), DT_ERR_INVALID);
    assert_msg_has("global batch 4 sequences is not a multiple of micro_batch 3");
    dt_data_close(ds);
}

static void test_sampler_dp_equivalence(void **state)
{
    enum { T = 8, B = 2, G = 16 };
    dt_dataset_t *ds = iota_dataset("dp.bin", 1001); /* 125 sequences */
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        dt_sampler_t *s;
        assert_int_equal(dt_sampler_init(&s, ds, T, B, G, 42, shuffle), DT_OK);
        /* steps 0, 3 and 7 (7 spans the epoch boundary at position 125) */
        uint64_t steps[] = {0, 3, 7, 100};
        for (size_t k = 0; k < 4; k++) {
            uint64_t ref[G], got[G];
            step_seqs(s, steps[k], 1, B, T, G, ref);
            uint32_t dps[] = {2, 4, 8};
            for (size_t d = 0; d < 3; d++) {
                step_seqs(s, steps[k], dps[d], B, T, G, got);
                /* Same sequences in the same global order. */
                assert_memory_equal(ref, got, sizeof ref);
            }
            /* Within a step that stays in one epoch: all distinct. */
            if (steps[k] != 7)
                for (int i = 0; i < G; i++)
                    for (int j = i + 1; j < G; j++)
                        assert_true(ref[i] != ref[j]);
            if (!shuffle)
                for (int i = 0; i < G; i++)
                    assert_int_equal(ref[i], (steps[k] * G + i) % 125);
        }
        int32_t in[B * T], tg[B * T];
        assert_int_equal(dt_sampler_fill(s, 0, 0, 0, 3, in, tg), DT_ERR_INVALID);
        assert_msg_has("global batch 16 sequences does not split into micro_batch "
                   "2 x dp_size 3");
        assert_int_equal(dt_sampler_fill(s, 0, 4, 0, 2, in, tg), DT_ERR_INVALID);
        assert_msg_has("micro-step 4 of 4, rank 0 of 2 is out of range");
        dt_sampler_free(s);
    }
    dt_data_close(ds);
}

/* Positions in epoch order, by a sampler that serves one per step. */
static void epoch_order(dt_dataset_t *ds, uint32_t T, uint64_t seed,
                        uint64_t epoch, uint64_t n_seq, uint64_t *out)
{
    dt_sampler_t *s;
    assert_int_equal(dt_sampler_init(&s, ds, T, 1, 1, seed, 1), DT_OK);
    int32_t in[64], tg[64];
    for (uint64_t i = 0; i < n_seq; i++) {
        assert_int_equal(dt_sampler_fill(s, epoch * n_seq + i, 0, 0, 1, in, tg),
                         DT_OK);
        out[i] = (uint64_t)in[0] / T;
    }
    dt_sampler_free(s);
}

static void test_sampler_epochs(void **state)
{
    enum { T = 16, NSEQ = 60 };
    dt_dataset_t *ds = iota_dataset("ep.bin", NSEQ * T + 5);
    uint64_t e0[NSEQ], e1[NSEQ], e0b[NSEQ], other[NSEQ];
    epoch_order(ds, T, 7, 0, NSEQ, e0);
    epoch_order(ds, T, 7, 1, NSEQ, e1);
    epoch_order(ds, T, 7, 0, NSEQ, e0b);
    epoch_order(ds, T, 8, 0, NSEQ, other);
    /* each epoch is a permutation: every sequence exactly once */
    for (int e = 0; e < 2; e++) {
        int seen[NSEQ] = {0};
        for (int i = 0; i < NSEQ; i++)
            seen[(e ? e1 : e0)[i]]++;
        for (int i = 0; i < NSEQ; i++)
            assert_int_equal(seen[i], 1);
    }
    assert_memory_equal(e0, e0b, sizeof e0);         /* deterministic */
    assert_memory_not_equal(e0, e1, sizeof e0);      /* new order per epoch */
    assert_memory_not_equal(e0, other, sizeof e0);   /* seed matters */
    int identity = 1;
    for (int i = 0; i < NSEQ; i++)
        identity &= e0[i] == (uint64_t)i;
    assert_false(identity);

    /* A batched sampler (G = 8, 60 % 8 != 0) serves exactly the stream
     * e0 ++ e1: steps straddle the boundary without skipping or repeating. */
    dt_sampler_t *s;
    assert_int_equal(dt_sampler_init(&s, ds, T, 2, 8, 7, 1), DT_OK);
    for (uint64_t step = 0; step < 15; step++) {
        uint64_t got[8];
        step_seqs(s, step, 2, 2, T, 8, got);
        for (int i = 0; i < 8; i++) {
            uint64_t p = step * 8 + (uint64_t)i;
            uint64_t want = p < NSEQ ? e0[p] : e1[p - NSEQ];
            assert_int_equal(got[i], want);
        }
    }
    dt_sampler_free(s);
    dt_data_close(ds);
}

static void test_sampler_shuffle_uniform(void **state)
{
    /* Fisher-Yates sanity: over 4000 seeds, where sequence 0 lands among 4
     * slots is near uniform (expected 1000 each; 5 sigma is ~137). */
    enum { T = 4, NSEQ = 4, SEEDS = 4000 };
    dt_dataset_t *ds = iota_dataset("uni.bin", NSEQ * T + 1);
    int hist[NSEQ] = {0};
    for (uint64_t seed = 0; seed < SEEDS; seed++) {
        uint64_t e[NSEQ];
        epoch_order(ds, T, seed, 0, NSEQ, e);
        for (int i = 0; i < NSEQ; i++)
            if (e[i] == 0)
                hist[i]++;
    }
    for (int i = 0; i < NSEQ; i++)
        if (hist[i] < 860 || hist[i] > 1140)
            fail_msg("slot %d got sequence 0 %d times of %d", i, hist[i], SEEDS);
    dt_data_close(ds);
}

static void test_eval_in_order(void **state)
{
    enum { T = 10, B = 3 };
    dt_dataset_t *ds = iota_dataset("ev.bin", 250); /* 24 sequences */
    assert_int_equal(dt_data_eval_batches(ds, T, B, 1), 8);
    assert_int_equal(dt_data_eval_batches(ds, T, B, 2), 4);
    assert_int_equal(dt_data_eval_batches(ds, T, B, 5), 1);
    assert_int_equal(dt_data_eval_batches(ds, 300, B, 1), 0);
    int32_t in[B * T], tg[B * T];
    for (uint64_t i = 0; i < 4; i++)
        for (uint32_t r = 0; r < 2; r++) {
            assert_int_equal(dt_data_eval_fill(ds, T, B, i, r, 2, in, tg), DT_OK);
            for (uint32_t b = 0; b < B; b++) {
                int32_t seq = (int32_t)((i * 2 + r) * B + b);
                for (int t = 0; t < T; t++) {
                    assert_int_equal(in[b * T + t], seq * T + t);
                    assert_int_equal(tg[b * T + t], seq * T + t + 1);
                }
            }
        }
    assert_int_equal(dt_data_eval_fill(ds, T, B, 4, 0, 2, in, tg),
                     DT_ERR_INVALID);
    assert_msg_has("batch 4 (rank 0 of 2) is out of range: 250 tokens give 4 "
               "batches of 3 x 10 tokens per rank");
    dt_data_close(ds);
}

/* ---- files that are not what they were ------------------------------ */

/* A FIFO (or a directory) where a token or text file should be is an
 * error at once: opening a FIFO for reading would otherwise block until a
 * writer comes, which is forever. */
static void test_fifo_inputs(void **state)
{
    LOCAL_PATH(fifo, "fifo.bin");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    char want[700];
    dt_dataset_t *ds = (void *)1;
    dt_test_deadline(10, "opening a FIFO as a token file blocked");
    assert_status(dt_data_open(fifo, &ds), DT_ERR_IO);
    dt_test_deadline(0, NULL);
    assert_null(ds);
    snprintf(want, sizeof want, "data file '%s': not a regular file (a FIFO)",
             fifo);
    assert_msg(want);

    dt_test_deadline(10, "opening a FIFO as a text file blocked");
    assert_status(dt_data_prepare(fifo, tpath("out.bin"), NULL, 0, NULL, NULL),
                  DT_ERR_IO);
    dt_test_deadline(0, NULL);
    snprintf(want, sizeof want, "text file '%s': not a regular file (a FIFO)",
             fifo);
    assert_msg(want);
    assert_int_equal(access(tpath("out.bin"), F_OK), -1);

    assert_status(dt_data_open(g_dir, &ds), DT_ERR_IO);
    snprintf(want, sizeof want, "data file '%s': not a regular file (a "
             "directory)", g_dir);
    assert_msg(want);
}

/* A token file truncated while a run reads it: the next batch that needs
 * the missing bytes is an error naming the file (a mapping would have
 * died of SIGBUS instead, with no message). */
static void test_truncated_while_in_use(void **state)
{
    enum { N = 10000, T = 8, B = 2 };
    dt_dataset_t *ds = iota_dataset("shrinks.bin", N);
    LOCAL_PATH(p, "shrinks.bin");
    dt_sampler_t *s;
    assert_ok(dt_sampler_init(&s, ds, T, B, B, 1, 0));
    int32_t in[B * T], tg[B * T];
    assert_ok(dt_sampler_fill(s, 300, 0, 0, 1, in, tg));
    assert_int_equal(in[0], 600 * T);
    /* the file keeps its header and 1000 tokens: 3024 bytes */
    assert_int_equal(truncate(p, DT_DATA_HEADER_BYTES + 2 * 1000), 0);
    assert_ok(dt_sampler_fill(s, 10, 0, 0, 1, in, tg)); /* still there */
    assert_int_equal(in[0], 20 * T);
    /* step 300 is sequence 600: tokens [4800, 4809), bytes [10624, 10642) */
    assert_status(dt_sampler_fill(s, 300, 0, 0, 1, in, tg), DT_ERR_DATA);
    char want[700];
    snprintf(want, sizeof want, "data file '%s': changed while in use: it now "
             "has 3024 bytes, too few for bytes [10624, 10642) it had when "
             "opened", p);
    assert_msg(want);
    assert_status(dt_data_eval_fill(ds, T, B, 300, 0, 1, in, tg), DT_ERR_DATA);
    assert_msg(want);
    dt_sampler_free(s);
    dt_data_close(ds);
}

/* A token file rewritten in place with a token the vocabulary check never
 * saw: refused, since the model would index its embedding with it. */
static void test_rewritten_while_in_use(void **state)
{
    enum { N = 100, T = 8 };
    uint16_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (uint16_t)(i % 50);
    tok[N - 1] = 199;
    LOCAL_PATH(p, "rewritten.bin");
    write_tokens(p, tok, N);
    dt_dataset_t *ds;
    assert_ok(dt_data_open(p, &ds));
    assert_int_equal(ds->max_token, 199);
    assert_ok(dt_data_check_vocab(ds, 256));
    uint16_t big = 300;
    FILE *f = fopen(p, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, DT_DATA_HEADER_BYTES + 2 * 19, SEEK_SET), 0);
    assert_int_equal(fwrite(&big, 2, 1, f), 1);
    assert_int_equal(fclose(f), 0);
    int32_t in[T], tg[T];
    assert_ok(dt_data_eval_fill(ds, T, 1, 0, 0, 1, in, tg)); /* tokens 0-8 */
    assert_status(dt_data_eval_fill(ds, T, 1, 2, 0, 1, in, tg), DT_ERR_DATA);
    char want[700];
    snprintf(want, sizeof want, "data file '%s': changed while in use: token "
             "300 at position 19 is larger than any it held when opened (199)",
             p);
    assert_msg(want);
    dt_data_close(ds);
}

/* A validation file too small for one evaluation batch is an error naming
 * the file and the sizes, as the same file is for training, not a run
 * that silently has no validation loss. */
static void test_eval_check(void **state)
{
    dt_dataset_t *ds = iota_dataset("val_short.bin", 10);
    assert_status(dt_data_eval_check(ds, 16, 1, 1), DT_ERR_DATA);
    char want[700];
    snprintf(want, sizeof want, "data file '%s': 10 tokens hold no full "
             "sequence of seq_len 16 (need at least 17 tokens)",
             tpath("val_short.bin"));
    assert_msg(want);
    dt_sampler_t *s; /* the training side says the same words */
    assert_status(dt_sampler_init(&s, ds, 16, 1, 1, 0, 0), DT_ERR_DATA);
    assert_msg(want);
    dt_data_close(ds);

    ds = iota_dataset("val_few.bin", 50); /* 3 sequences of 16 */
    assert_ok(dt_data_eval_check(ds, 16, 3, 1));
    assert_ok(dt_data_eval_check(ds, 16, 1, 3));
    assert_status(dt_data_eval_check(ds, 16, 2, 2), DT_ERR_DATA);
    snprintf(want, sizeof want, "data file '%s': 50 tokens hold 3 sequences of "
             "seq_len 16, fewer than one evaluation batch of 2 sequence(s) x 2 "
             "rank(s) = 4 sequences (need at least 65 tokens)",
             tpath("val_few.bin"));
    assert_msg(want);
    assert_status(dt_data_eval_check(ds, 0, 2, 2), DT_ERR_INVALID);
    dt_data_close(ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_open_missing),
        cmocka_unit_test(test_open_short_header),
        cmocka_unit_test(test_open_bad_magic),
        cmocka_unit_test(test_open_bad_version),
        cmocka_unit_test(test_open_count_mismatch),
        cmocka_unit_test(test_vocab_check),
        cmocka_unit_test(test_prepare_split),
        cmocka_unit_test(test_prepare_large_chunks),
        cmocka_unit_test(test_prepare_errors),
        cmocka_unit_test(test_prepare_disk_full),
        cmocka_unit_test(test_sampler_too_small),
        cmocka_unit_test(test_sampler_dp_equivalence),
        cmocka_unit_test(test_sampler_epochs),
        cmocka_unit_test(test_sampler_shuffle_uniform),
        cmocka_unit_test(test_eval_in_order),
        cmocka_unit_test(test_fifo_inputs),
        cmocka_unit_test(test_truncated_while_in_use),
        cmocka_unit_test(test_rewritten_while_in_use),
        cmocka_unit_test(test_eval_check),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
