/*
 * tests/unit/core/model/test_generate.c - generation (core/model/generate.h) on the
 * real cpu device: the KV-cache decoder against the model's full forward,
 * greedy generation against tests/reference/gpt2_ref.py's (which
 * recomputes the whole sequence each step, float64), and the choice of
 * the next token (greedy, temperature, top-k, seeds).
 *
 * The model is test_gpt2_oracle.c's small GPT-2 (L=3, H=4, C=48, V=83)
 * with a context of 24, its parameters perturbed by the harness
 * (tests/support/model_harness.c) so attention is peaked and logits are
 * far from uniform.
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
#include "safetensors_read.h"
#include "test_assert.h"
#include "util/error.h"

enum { L = 3, NH = 4, C = 48, V = 83, MAXT = 24 };

/*
 * Cached against full recompute, |cached - full| relative to the row's
 * largest |full| logit: both are f32 computations of the same sums in
 * other orders (the decoder's attention is a matmul over the cache, a
 * softmax kernel and a matmul backward; the full forward's is the
 * attention kernel), each rounding at u = 6e-8 over at most 4C = 192
 * terms, through 3 blocks.  Measured worst 5.2e-7 over all 24 positions;
 * 5e-6 leaves 10x headroom while a wrong position (wpe row, a cache entry
 * of another position or head, a missing 1/sqrt(hs)) is off by O(1).
 */
#define TOL_CACHE 5e-6

static const char *toml = "[model]\n"
                          "arch = \"gpt2\"\n"
                          "n_layer = 3\n"
                          "n_head = 4\n"
                          "n_embd = 48\n"
                          "vocab_size = 83\n"
                          "context = 24\n";

/* The harness's model (B = 1, T = MAXT) and device copies of its
 * parameters, as the decoder reads them. */
typedef struct fixture {
    dt_mh_t h;
    void **params;
} fixture_t;

static void open_fixture(fixture_t *f)
{
    if (dt_mh_open(&f->h, toml, 1, MAXT, 4244) != DT_OK)
        fail_msg("opening the model: %s", dt_last_error());
    const dt_model_desc_t *d = f->h.desc;
    f->params = calloc(d->n_units, sizeof *f->params);
    assert_non_null(f->params);
    for (uint32_t u = 0; u < d->n_units; u++) {
        const uint64_t bytes = d->units[u].numel * 4;
        assert_ok(f->h.D->alloc(f->h.dev, bytes, DT_TAG_PARAMS, &f->params[u]));
        assert_ok(f->h.D->memcpy_async(f->h.dev, f->params[u], dt_mh_master(&f->h, u), bytes,
                                       DT_COPY_H2D, f->h.stream));
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

/* Every position's logits from the cache equal the full forward's. */
static void test_cache_matches_full_forward(void **state)
{
    (void)state;
    fixture_t f;
    open_fixture(&f);
    int32_t in[MAXT], tg[MAXT];
    dt_mh_tokens(17, V, MAXT, in, tg);
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
            fail_msg("position %d: cached logits differ from the full forward by %g of %g", t,
                     diff, mx);
        worst = fmax(worst, diff / mx);
    }
    printf("cached vs full forward: worst relative difference %.3g over %d positions\n", worst,
           MAXT);
    /* full: one more position is refused, naming the limit */
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

static void generate(fixture_t *f, const int32_t *prompt, int n_prompt, int n,
                     const dt_pick_opts_t *o, int32_t *out)
{
    dt_decoder_t *d = decoder(f, n_prompt + n - 1);
    dt_pick_t p;
    assert_ok(dt_pick_init(&p, o, V));
    if (dt_generate(d, &p, prompt, n_prompt, n, out, NULL, NULL) != DT_OK)
        fail_msg("dt_generate: %s", dt_last_error());
    dt_pick_free(&p);
    dt_decoder_free(d);
}

/* Greedy (temperature 0, and top-k 1 at any temperature) is the float64
 * reference's greedy continuation, every run the same. */
static void test_greedy_matches_reference(void **state)
{
    (void)state;
    const char *why;
    if (!dt_mh_python_ok(&why)) {
        printf("SKIP: the float64 oracle needs numpy: %s\n", why);
        skip();
    }
    enum { NP = 4, N = 18 };
    fixture_t f;
    open_fixture(&f);
    /* (a prompt whose greedy continuation wanders: 13 changes of token in 18) */
    const int32_t prompt[NP] = {12, 76, 8, 41}, zeros[NP] = {0};
    char dir[512], pp[600], tp[600], rp[600];
    dt_mh_tmpdir(dir, sizeof dir);
    snprintf(pp, sizeof pp, "%s/params.safetensors", dir);
    snprintf(tp, sizeof tp, "%s/prompt.bin", dir);
    snprintf(rp, sizeof rp, "%s/ref.safetensors", dir);
    assert_ok(dt_mh_write_params(&f.h, pp, 0));
    assert_ok(dt_mh_write_tokens(tp, 1, NP, prompt, zeros));
    char args[64];
    snprintf(args, sizeof args, "--n-layer %d --n-head %d --generate %d", L, NH, N);
    dt_mh_ref(&f.h, "gpt2_ref.py", pp, tp, rp, args);
    dt_test_st_t *st = NULL;
    assert_ok(dt_test_st_open(rp, &st));
    const dt_test_st_tensor_t *ids = dt_test_st_find(st, "generated");
    const dt_test_st_tensor_t *margin = dt_test_st_find(st, "margin");
    assert_non_null(ids);
    assert_non_null(margin);
    assert_int_equal(ids->numel, N);
    double want[N], gap[N];
    memcpy(want, ids->data, sizeof want);
    memcpy(gap, margin->data, sizeof gap);
    dt_test_st_close(st);

    int32_t got[N], again[N], topk1[N];
    const dt_pick_opts_t greedy = {.temperature = 0}, k1 = {.temperature = 1.5, .top_k = 1,
                                                            .seed = 3};
    generate(&f, prompt, NP, N, &greedy, got);
    generate(&f, prompt, NP, N, &greedy, again);
    generate(&f, prompt, NP, N, &k1, topk1);
    double smallest = INFINITY;
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        /* the oracle's choice is clear of f32 rounding (TOL_CACHE of
         * logits of magnitude ~10 is 5e-5), so an equal choice is owed */
        assert_true(gap[i] > 1e-3);
        smallest = fmin(smallest, gap[i]);
        if (got[i] != (int32_t)want[i])
            fail_msg("greedy token %d is %d, the reference's %d", i, got[i], (int)want[i]);
        distinct += i == 0 || got[i] != got[i - 1];
    }
    assert_true(distinct > 9); /* a continuation, not one token repeated */
    assert_memory_equal(got, again, sizeof got);
    assert_memory_equal(got, topk1, sizeof got);
    printf("greedy: %d tokens equal the reference's (smallest top-2 gap %.3g)\n", N, smallest);
    dt_mh_rmdir(dir);
    close_fixture(&f);
}

/* Sampling is a function of the seed: the same seed, the same tokens;
 * another seed, others. */
static void test_seed_reproducible(void **state)
{
    (void)state;
    enum { N = 20 };
    fixture_t f;
    open_fixture(&f);
    const int32_t prompt[1] = {11};
    int32_t a[N], b[N], c[N];
    dt_pick_opts_t o = {.temperature = 1.0, .top_k = 0, .seed = 7};
    generate(&f, prompt, 1, N, &o, a);
    generate(&f, prompt, 1, N, &o, b);
    o.seed = 8;
    generate(&f, prompt, 1, N, &o, c);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    close_fixture(&f);
}

/* The choice itself: greedy takes the largest logit (the lower id on a
 * tie); draws follow softmax(logits / T) over the top k. */
/* Generation runs f32 activations: a model built with bf16 ones (which the
 * cpu device now runs) is refused naming the key, not its fp32 dtype;
 * `dtrain sample` builds its model with fp32 activations whatever the
 * checkpoint's run used (tests/integration/test_bf16.sh samples one). */
static void test_bf16_activations_refused(void **state)
{
    (void)state;
    char t[512];
    snprintf(t, sizeof t, "%sactivations = \"bf16\"\n", toml);
    dt_mh_t h;
    if (dt_mh_open(&h, t, 1, MAXT, 4244) != DT_OK)
        fail_msg("opening the model: %s", dt_last_error());
    void *params[L + 2] = {0};
    dt_decoder_t *d = NULL;
    assert_status(dt_decoder_create(h.model, &h.ctx, params, MAXT, &d), DT_ERR_UNSUPPORTED);
    assert_msg("decoder: [model] activations = \"bf16\": generation runs fp32 activations (the "
               "weights of a run with bf16 activations sample in fp32)");
    assert_null(d);
    dt_mh_close(&h);
}

static void test_pick(void **state)
{
    (void)state;
    enum { NV = 6, DRAWS = 60000 };
    /* token 4 and 1 tie for the largest; probabilities at T = 1 over the
     * top 3 {1, 4, 2}: e^0, e^0, e^-ln2 -> 2/5, 2/5, 1/5 */
    const float logits[NV] = {-3.0f, 1.0f, 1.0f - (float)M_LN2, -1.0f, 1.0f, -9.0f};
    dt_pick_t p;
    int32_t t;
    assert_ok(dt_pick_init(&p, &(dt_pick_opts_t){.temperature = 0}, NV));
    assert_ok(dt_pick_next(&p, logits, &t));
    assert_int_equal(t, 1);
    dt_pick_free(&p);

    const struct {
        double temp;
        int64_t k;
        double want[NV];
    } cases[] = {
        {1.0, 3, {0, 0.4, 0.2, 0, 0.4, 0}},
        /* T = 2 halves the gaps: weights 1, 1, 2^-1/2 */
        {2.0, 3, {0, 1 / (2 + M_SQRT1_2), M_SQRT1_2 / (2 + M_SQRT1_2), 0, 1 / (2 + M_SQRT1_2),
                  0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        assert_ok(dt_pick_init(&p, &(dt_pick_opts_t){cases[c].temp, cases[c].k, 99}, NV));
        int count[NV] = {0};
        for (int i = 0; i < DRAWS; i++) {
            assert_ok(dt_pick_next(&p, logits, &t));
            count[t]++;
        }
        for (int v = 0; v < NV; v++) {
            /* 5 standard deviations of a binomial frequency */
            double w = cases[c].want[v], sd = sqrt(w * (1 - w) / DRAWS);
            double got = (double)count[v] / DRAWS;
            if (fabs(got - w) > 5 * sd + 1e-12)
                fail_msg("T %g top-k %lld: token %d drawn %.4f of the time, expected %.4f",
                         cases[c].temp, (long long)cases[c].k, v, got, w);
        }
        dt_pick_free(&p);
    }

    float bad[NV];
    memcpy(bad, logits, sizeof bad);
    bad[3] = NAN;
    assert_ok(dt_pick_init(&p, &(dt_pick_opts_t){.temperature = 1}, NV));
    assert_status(dt_pick_next(&p, bad, &t), DT_ERR_DATA);
    assert_msg("sampling: logit of token 3 is nan");
    dt_pick_free(&p);
    assert_status(dt_pick_init(&p, &(dt_pick_opts_t){.temperature = -1}, NV), DT_ERR_INVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick),
        cmocka_unit_test(test_cache_matches_full_forward),
        cmocka_unit_test(test_greedy_matches_reference),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_bf16_activations_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
