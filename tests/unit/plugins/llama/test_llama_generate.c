/*
 * tests/unit/plugins/llama/test_llama_generate.c - the llama plugin's KV-cache decoder
 * (plugins/llama/llama_decode.c) on the real cpu device, against the
 * model's full forward: the logits of every position, and greedy
 * generation against the argmax of a full forward over the generated
 * sequence, for grouped-query (2 kv heads of 4), multi-query and
 * multi-head attention, untied and tied heads, q/k/v biases and llama3
 * rope scaling.
 *
 * The model is test_llama_oracle.c's small llama (L=3, H=4, C=48, HD=12,
 * I=80, V=83) with a context of 24, its parameters perturbed by the
 * harness (tests/support/model_harness.c) so attention is peaked and
 * logits are far from uniform.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/dtrain.h"
#include "model/generate.h"
#include "model_harness.h"
#include "test_assert.h"
#include "util/error.h"

enum { L = 3, NH = 4, C = 48, I = 80, V = 83, MAXT = 24 };

/*
 * Cached against full recompute, |cached - full| relative to the row's
 * largest |full| logit: both are f32 computations of the same sums in
 * other orders (the decoder's attention is a matmul over the cache, a
 * softmax kernel and a matmul backward; the full forward's is the
 * grouped-query attention kernel), each rounding at u = 6e-8 over at most
 * I = 80 terms, through 3 layers.  Measured worst 1.3e-6 (the multi-query
 * case) over the cases' 24 positions; 5e-6 leaves headroom while a wrong position (a rotary row,
 * a cache entry of another position or kv head, a missing 1/sqrt(HD)) is
 * off by O(1).
 */
#define TOL_CACHE 5e-6

/* The model's [model] table with n_kv_head and extra keys. */
static void model_toml(char *out, size_t cap, int n_kv, const char *extra)
{
    snprintf(out, cap,
             "[model]\narch = \"llama\"\nn_layer = %d\nn_head = %d\nn_kv_head = %d\n"
             "n_embd = %d\nintermediate_size = %d\nvocab_size = %d\ncontext = %d\n%s",
             L, NH, n_kv, C, I, V, MAXT, extra ? extra : "");
}

typedef struct fixture {
    dt_mh_t h;
    void **params;
} fixture_t;

static void open_fixture(fixture_t *f, int n_kv, const char *extra)
{
    char toml[1024];
    model_toml(toml, sizeof toml, n_kv, extra);
    if (dt_mh_open(&f->h, toml, 1, MAXT, 2626) != DT_OK)
        fail_msg("opening the llama (n_kv_head %d, %s): %s", n_kv, extra ? extra : "",
                 dt_last_error());
    const dt_model_desc_t *d = f->h.desc;
    f->params = calloc(d->n_units, sizeof *f->params);
    assert_non_null(f->params);
    for (uint32_t u = 0; u < d->n_units; u++) {
        const uint64_t bytes = d->units[u].numel * 4;
        assert_ok(f->h.D->alloc(f->h.dev, bytes ? bytes : 4, DT_TAG_PARAMS, &f->params[u]));
        if (bytes)
            assert_ok(f->h.D->memcpy_async(f->h.dev, f->params[u], dt_mh_master(&f->h, u),
                                           bytes, DT_COPY_H2D, f->h.stream));
    }
    assert_ok(f->h.D->stream_sync(f->h.dev, f->h.stream));
}

static void close_fixture(fixture_t *f)
{
    for (uint32_t u = 0; u < f->h.desc->n_units; u++)
        f->h.D->free(f->h.dev, f->params[u]);
    free(f->params);
    dt_mh_close(&f->h);
}

static dt_decoder_t *decoder(fixture_t *f, int64_t max_len)
{
    dt_decoder_t *d = NULL;
    if (dt_decoder_create(f->h.model, &f->h.ctx, f->params, max_len, &d) != DT_OK)
        fail_msg("dt_decoder_create: %s", dt_last_error());
    return d;
}

/* The cases: attention layouts, heads, biases, rotary settings. */
static const struct {
    int n_kv;
    const char *extra;
} cases[] = {
    {2, NULL},                                              /* GQA, untied */
    {1, "tie_embeddings = true\nqkv_bias = true\n"},        /* MQA, tied, biases */
    {4, "rope_scaling = \"llama3\"\nrope_theta = 500000.0\n" /* MHA, Llama 3.1's scaling */
        "rope_scaling_original_max_position_embeddings = 16\n"},
};

/* Every position's logits from the cache equal the full forward's. */
static void test_cache_matches_full_forward(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture_t f;
        open_fixture(&f, cases[c].n_kv, cases[c].extra);
        int32_t in[MAXT], tg[MAXT];
        dt_mh_tokens(17 + c, V, MAXT, in, tg);
        in[9] = in[3]; /* a repeated token: its two positions must differ */
        dt_mh_step(&f.h, in, tg, 1, 1);
        float *full = dt_mh_logits(&f.h);
        assert_non_null(full);
        dt_decoder_t *d = decoder(&f, MAXT);
        float got[V];
        double worst = 0;
        for (int t = 0; t < MAXT; t++) {
            assert_ok(dt_decoder_step(d, in[t], got));
            assert_int_equal(dt_decoder_len(d), t + 1);
            double mx = 0, diff = 0;
            for (int v = 0; v < V; v++) {
                mx = fmax(mx, fabs(full[t * V + v]));
                diff = fmax(diff, fabs(got[v] - full[t * V + v]));
            }
            if (diff / mx > TOL_CACHE)
                fail_msg("case %zu, position %d: cached logits differ from the full forward "
                         "by %g of %g",
                         c, t, diff, mx);
            worst = fmax(worst, diff / mx);
        }
        printf("case %zu (n_kv_head %d): cached vs full forward: worst relative difference "
               "%.3g over %d positions\n",
               c, cases[c].n_kv, worst, MAXT);
        assert_status(dt_decoder_step(d, in[0], got), DT_ERR_INVALID);
        assert_msg("decoder: all 24 positions are used");
        /* reset reuses the cache from position 0: the same logits, bit for bit */
        dt_decoder_reset(d);
        float again[V];
        assert_ok(dt_decoder_step(d, in[0], again));
        dt_decoder_reset(d);
        assert_ok(dt_decoder_step(d, in[0], got));
        assert_memory_equal(again, got, sizeof got);
        assert_status(dt_decoder_step(d, V, got), DT_ERR_INVALID);
        assert_msg("decoder: token 83 is outside the vocabulary (83)");
        dt_decoder_free(d);
        free(full);
        close_fixture(&f);
    }
}

/* Greedy generation is the argmax of the full forward over the generated
 * sequence at every position (a position whose top two logits are within
 * the cache tolerance would be a tie either way: none occurs here, and
 * the test says so if one does). */
static void test_greedy_is_full_forward_argmax(void **state)
{
    (void)state;
    enum { NP = 4, N = MAXT - NP };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fixture_t f;
        open_fixture(&f, cases[c].n_kv, cases[c].extra);
        const int32_t prompt[NP] = {12, 76, 8, 41};
        int32_t gen[N];
        dt_decoder_t *d = decoder(&f, NP + N - 1);
        dt_pick_t p;
        assert_ok(dt_pick_init(&p, &(dt_pick_opts_t){.temperature = 0}, V));
        if (dt_generate(d, &p, prompt, NP, N, gen, NULL, NULL) != DT_OK)
            fail_msg("dt_generate: %s", dt_last_error());
        dt_pick_free(&p);
        dt_decoder_free(d);
        int32_t in[MAXT], tg[MAXT] = {0};
        memcpy(in, prompt, sizeof prompt);
        memcpy(in + NP, gen, sizeof gen);
        dt_mh_step(&f.h, in, tg, 1, 1);
        float *full = dt_mh_logits(&f.h);
        assert_non_null(full);
        int distinct = 0;
        double smallest = INFINITY;
        for (int i = 0; i < N; i++) {
            const float *row = full + (NP - 1 + i) * V;
            int best = 0;
            float top = row[0], second = -INFINITY;
            double mx = 0;
            for (int v = 0; v < V; v++)
                mx = fmax(mx, fabs(row[v]));
            for (int v = 1; v < V; v++)
                if (row[v] > top) {
                    second = top;
                    top = row[v];
                    best = v;
                } else if (row[v] > second) {
                    second = row[v];
                }
            /* the decoder's logits are within TOL_CACHE mx of these: a gap
             * above twice that is the same choice for both */
            assert_true(top - second > 2 * TOL_CACHE * mx);
            smallest = fmin(smallest, top - second);
            if (gen[i] != best)
                fail_msg("case %zu: greedy token %d is %d, the full forward's argmax %d", c, i,
                         gen[i], best);
            distinct += i == 0 || gen[i] != gen[i - 1];
        }
        printf("case %zu: %d greedy tokens equal the full forward's argmax (smallest top-2 "
               "gap %.3g, %d changes of token)\n",
               c, N, smallest, distinct);
        assert_true(distinct > 3); /* a continuation, not one token repeated */
        free(full);
        close_fixture(&f);
    }
}

/* Generation runs fp32 activations and a whole model: bf16 activations
 * are refused naming the key; so is a tensor-parallel part (dtrain sample
 * always builds the whole model: checkpoints are layout-independent). */
static void test_refusals(void **state)
{
    (void)state;
    char toml[1024];
    model_toml(toml, sizeof toml, 2, "activations = \"bf16\"\n");
    dt_mh_t h;
    if (dt_mh_open(&h, toml, 1, MAXT, 2626) != DT_OK)
        fail_msg("opening the model: %s", dt_last_error());
    void *params[L + 2] = {0};
    dt_decoder_t *d = NULL;
    assert_status(dt_decoder_create(h.model, &h.ctx, params, MAXT, &d), DT_ERR_UNSUPPORTED);
    assert_msg("decoder: [model] activations = \"bf16\": generation runs fp32 activations (the "
               "weights of a run with bf16 activations sample in fp32)");
    assert_null(d);
    dt_mh_close(&h);

    fixture_t f;
    open_fixture(&f, 2, NULL);
    assert_status(dt_decoder_create(f.h.model, &f.h.ctx, f.params, MAXT + 1, &d), DT_ERR_INVALID);
    assert_msg("decoder: 25 positions: 1 to the model's context of 24");
    assert_null(d);
    close_fixture(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cache_matches_full_forward),
        cmocka_unit_test(test_greedy_is_full_forward_argmax),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
