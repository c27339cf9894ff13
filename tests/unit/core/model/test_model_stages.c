/*
 * tests/unit/core/model/test_model_stages.c - a model split into pipeline stages
 * (dt_model_stage_*, core/model/model.h) computes what the whole model
 * computes.
 *
 * GPT-2 (3 blocks: 5 units) is opened three times from the same seed, as
 * three ranks would hold it: the whole model, stage A = units [0, k) and
 * stage B = units [k, 5), each with its own oracle strategy (the test
 * harness's, which checks the hook protocol) and activations allocated
 * for its own units only (dt_model_set_stage), as a stage's rank has.  For every split k = 1..4,
 * 3 micro-batches with accumulation run GPipe's order as a pipeline rank
 * runs it: every forward of A then of B (B's inputs stashed, one boundary
 * tensor per micro-batch), then the backwards micro-batch by micro-batch,
 * each stage recomputing its forward from the stashed input unless the
 * micro-batch is the last it ran forward (dt_stage_runner_v1_t's
 * contract).  Asserted against the whole model's step:
 *   - the mean loss, within 1e-6 absolute (measured: 0, the same kernels
 *     on the same numbers);
 *   - every unit's gradient within 1e-6 of the largest |gradient| of its
 *     tensor: units [0, k) from A, [k, 5) from B, and unit 0 (wte tied to
 *     the LM head, held by B as a copy) as A's plus B's, the sum the
 *     pipeline forms over the embedding group (measured: 5.8e-8, the
 *     rounding of that sum).
 * Also: a stage's activation plan (nothing for units before its input
 * boundary, that unit's output only, no logits without the head) and its
 * refusals (another stage, a whole-model step, a stage set after the
 * allocation); with activation slots (dt_model_set_slots) every split
 * runs again keeping each micro-batch's activations (no recompute, the
 * backwards given no input) with the same results, the plan counts each
 * unit's kept bytes once per slot and the workspace once, and an mlp
 * (no slots), a slot out of range or slots set after allocation are
 * refused; B lists unit 0 as tied, A lists none; an mlp model cannot be
 * split (DT_ERR_CONFIG naming the arch); an empty or out-of-range stage is
 * DT_ERR_INVALID naming the range.
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
#include "model/model.h"
#include "model_harness.h"
#include "test_assert.h"
#include "util/error.h"

enum { L = 3, NU = L + 2, NH = 2, C = 16, V = 40, CTX = 16, B = 2, T = 8, M = 3 };
#define SEED 7
#define LOSS_ATOL 1e-6
#define GRAD_TOL 1e-6

static const char gpt2_toml[] =
    "[model]\narch = \"gpt2\"\nn_layer = 3\nn_head = 2\nn_embd = 16\nvocab_size = 40\n"
    "context = 16\n";

static void must(int rc, const char *what)
{
    if (rc != DT_OK)
        fail_msg("%s: %s", what, dt_last_error());
}

/* One stage [first, end) of the pipeline, on its own model and strategy,
 * keeping `slots` micro-batches' activations (micro-batch m in slot
 * m % slots). */
typedef struct stage {
    dt_mh_t h;
    uint32_t first, end, slots;
    int32_t slot_micro[M]; /* the micro-batch whose activations slot i holds; -1 */
    int recomputes;        /* forwards run again for a backward */
} stage_t;

static void stage_forward(stage_t *s, uint32_t m, const int32_t *in_tok, const int32_t *tg,
                          const void *in, void *out, double *loss)
{
    must(dt_model_use_slot(s->h.model, m % s->slots), "use slot");
    must(dt_model_stage_forward(s->h.model, &s->h.ctx, s->first, s->end, in_tok, tg, in, out, m,
                                M, 0, loss),
         "stage forward");
    s->slot_micro[m % s->slots] = (int32_t)m;
}

/* The runner's backward: on the slot's activations, recomputing the
 * forward first when the slot holds another micro-batch's (its output not
 * wanted: NULL; its loss unused). */
static void stage_backward(stage_t *s, uint32_t m, const int32_t *in_tok, const int32_t *tg,
                           const void *in, const void *dout, void *din)
{
    double unused = 0;
    must(dt_model_use_slot(s->h.model, m % s->slots), "use slot");
    if (s->slot_micro[m % s->slots] != (int32_t)m) {
        stage_forward(s, m, in_tok, tg, in, NULL, &unused);
        s->recomputes++;
    }
    must(dt_model_stage_backward(s->h.model, &s->h.ctx, s->first, s->end, dout, din, m, M,
                                 (float)(1.0 / M)),
         "stage backward");
}

/* Every gradient of two ranks' models against the whole model's `ref`:
 * unit u from A where on_a(u, k) else from B, unit 0 (wte, on A and, tied,
 * on B) as their sum, the pipeline's sum over the embedding group; each
 * within GRAD_TOL of its tensor's largest |gradient|. */
static void check_grads(const char *what, const dt_mh_t *w, dt_mh_t *a, dt_mh_t *b,
                        int (*on_a)(uint32_t u, uint32_t k), uint32_t k,
                        float *const *ref)
{
    double worst = 0;
    for (uint32_t u = 0; u < NU; u++) {
        const dt_unit_desc_v1_t *ud = &w->desc->units[u];
        const float *ga = dt_mh_grads(a, u), *gb = dt_mh_grads(b, u);
        for (uint32_t p = 0; p < ud->n_params; p++) {
            const dt_param_desc_v1_t *pd = &ud->params[p];
            double ref_max = 0, diff = 0;
            for (uint64_t i = pd->offset; i < pd->offset + pd->numel; i++) {
                double got = u == 0 ? (double)ga[i] + (double)gb[i] : on_a(u, k) ? ga[i] : gb[i];
                ref_max = fmax(ref_max, fabs((double)ref[u][i]));
                diff = fmax(diff, fabs(got - (double)ref[u][i]));
            }
            if (ref_max == 0 || diff / ref_max > GRAD_TOL)
                fail_msg("%s: gradient of %s: max |diff| %.3g, max |ref| %.3g", what, pd->name,
                         diff, ref_max);
            worst = fmax(worst, diff / ref_max);
        }
    }
    printf("%s: worst gradient diff %.3g of the tensor's max\n", what, worst);
}

/* The test's M micro-batches into inputs / targets (M x B x T), and the
 * whole model's step of them: its loss, and a copy of every unit's
 * gradient in grads[NU] (freed by the caller). */
static double whole_step(dt_mh_t *w, int32_t *inputs, int32_t *targets, float **grads)
{
    dt_mh_tokens(11, V, M * B * T, inputs, targets);
    must(dt_mh_open(w, gpt2_toml, B, T, SEED), "open whole model");
    const double loss = dt_mh_step(w, inputs, targets, M, 0);
    for (uint32_t u = 0; u < NU; u++) {
        uint64_t numel = w->desc->units[u].numel;
        grads[u] = malloc(numel * 4);
        assert_non_null(grads[u]);
        memcpy(grads[u], dt_mh_grads(w, u), numel * 4);
    }
    return loss;
}

static int before_split(uint32_t u, uint32_t k) { return u < k; }

static void check_split(uint32_t k, uint32_t slots, const int32_t *inputs,
                        const int32_t *targets, double whole_loss, float *const *whole_grads,
                        const dt_mh_t *w)
{
    stage_t a = {.first = 0, .end = k, .slots = slots};
    stage_t b = {.first = k, .end = NU, .slots = slots};
    memset(a.slot_micro, -1, sizeof a.slot_micro);
    memset(b.slot_micro, -1, sizeof b.slot_micro);
    /* each holds its own stage's activations only, as a stage's rank */
    dt_mh_slots = slots;
    dt_mh_stage_first = 0, dt_mh_stage_end = k;
    must(dt_mh_open(&a.h, gpt2_toml, B, T, SEED), "open stage A");
    dt_mh_stage_first = k, dt_mh_stage_end = NU;
    must(dt_mh_open(&b.h, gpt2_toml, B, T, SEED), "open stage B");
    dt_mh_stage_first = dt_mh_stage_end = 0;
    dt_mh_slots = 0;
    assert_int_equal(dt_model_slots(a.h.model), slots);
    const uint64_t n = dt_model_boundary_count(a.h.model);
    assert_int_equal(n, (uint64_t)B * T * C);
    void *act[M], *grad;
    for (int m = 0; m < M; m++)
        must(a.h.D->alloc(a.h.dev, n * 4, DT_TAG_ACTIVATIONS, &act[m]), "alloc boundary");
    must(a.h.D->alloc(a.h.dev, n * 4, DT_TAG_ACTIVATIONS, &grad), "alloc boundary gradient");
    must(dt_mh_begin_step(&a.h, M), "begin A");
    must(dt_mh_begin_step(&b.h, M), "begin B");

    const int64_t bt = B * T;
    double loss_sum = 0;
    for (uint32_t m = 0; m < M; m++)
        stage_forward(&a, m, inputs + m * bt, targets + m * bt, NULL, act[m], NULL);
    for (uint32_t m = 0; m < M; m++) {
        double l = NAN;
        stage_forward(&b, m, inputs + m * bt, targets + m * bt, act[m], NULL, &l);
        loss_sum += l;
    }
    for (uint32_t m = 0; m < M; m++) {
        /* with a slot per micro-batch the input is not needed: the slot
         * holds it (NULL here would fail a recompute) */
        stage_backward(&b, m, inputs + m * bt, targets + m * bt, slots == M ? NULL : act[m],
                       NULL, grad);
        stage_backward(&a, m, inputs + m * bt, targets + m * bt, NULL, grad, NULL);
    }
    /* one slot: every backward recomputes (in GPipe's order the slot
     * holds the last forward's micro-batch, M - 1, then the previous
     * backward's); a slot each: none */
    assert_int_equal(a.recomputes, slots == M ? 0 : M);
    assert_int_equal(b.recomputes, slots == M ? 0 : M);
    const double loss = loss_sum / M;
    printf("split at unit %u, %u slot(s): loss %.9f whole %.9f (diff %.3g)\n", k, slots, loss,
           whole_loss, fabs(loss - whole_loss));
    assert_true(fabs(loss - whole_loss) <= LOSS_ATOL);

    char what[64];
    snprintf(what, sizeof what, "split at unit %u, %u slot(s)", k, slots);
    check_grads(what, w, &a.h, &b.h, before_split, k, whole_grads);
    for (int m = 0; m < M; m++)
        a.h.D->free(a.h.dev, act[m]);
    a.h.D->free(a.h.dev, grad);
    dt_mh_close(&a.h);
    dt_mh_close(&b.h);
}

static void test_stages_match_whole(void **state)
{
    (void)state;
    int32_t inputs[M * B * T], targets[M * B * T];
    dt_mh_t w;
    float *grads[NU];
    const double whole_loss = whole_step(&w, inputs, targets, grads);
    for (uint32_t k = 1; k < NU; k++) {
        check_split(k, 1, inputs, targets, whole_loss, grads, &w);
        check_split(k, M, inputs, targets, whole_loss, grads, &w);
    }
    for (uint32_t u = 0; u < NU; u++)
        free(grads[u]);
    dt_mh_close(&w);
}

/* Rank A runs virtual stages 0 ([0, 2)) and 2 ([3, 4)). */
static int on_rank_a(uint32_t u, uint32_t k)
{
    (void)k;
    return u < 2 || u == 3;
}

/* An interleaved pipeline of 2 ranks x 2 chunks: virtual stages [0, 2),
 * [2, 3), [3, 4), [4, 5); rank A runs the first and third, rank B the
 * second and fourth, each allocating activations for its two unit ranges
 * only (dt_model_set_stages) and keeping every micro-batch's (M slots).
 * GPipe's order across the four virtual stages matches the whole model:
 * the loss within LOSS_ATOL, every gradient within GRAD_TOL of its
 * tensor's largest (unit 0 as A's plus B's: B's last chunk reads the tied
 * wte). */
static void test_interleaved_chunks_match_whole(void **state)
{
    (void)state;
    int32_t inputs[M * B * T], targets[M * B * T];
    dt_mh_t w;
    float *grads[NU];
    const double whole_loss = whole_step(&w, inputs, targets, grads);

    static const uint32_t vfirst[4] = {0, 2, 3, 4}, vend[4] = {2, 3, 4, NU};
    dt_mh_t r[2];
    for (int k = 0; k < 2; k++) {
        dt_mh_n_chunks = 2;
        for (int c = 0; c < 2; c++) {
            dt_mh_chunk_first[c] = vfirst[2 * c + k];
            dt_mh_chunk_end[c] = vend[2 * c + k];
        }
        dt_mh_slots = M;
        must(dt_mh_open(&r[k], gpt2_toml, B, T, SEED), k ? "open rank B" : "open rank A");
    }
    dt_mh_n_chunks = 0;
    dt_mh_slots = 0;
    uint32_t f[DT_MODEL_MAX_CHUNKS], e[DT_MODEL_MAX_CHUNKS];
    assert_int_equal(dt_model_stages(r[0].model, f, e), 2);
    assert_true(f[0] == 0 && e[0] == 2 && f[1] == 3 && e[1] == 4);
    /* a unit range it was not allocated for, named with both of its own */
    assert_int_equal(dt_model_stage_forward(r[0].model, &r[0].ctx, 2, 3, NULL, NULL, NULL, NULL,
                                            0, 1, 0, NULL),
                     DT_ERR_INVALID);
    assert_string_equal(dt_last_error(), "model: stage units 2-2 run on activations allocated "
                                         "for units 0-1, 3-3");

    const uint64_t n = dt_model_boundary_count(r[0].model);
    void *act[4][M], *grad[4];
    for (int v = 0; v < 4; v++) {
        for (int m = 0; m < M; m++)
            must(r[0].D->alloc(r[0].dev, n * 4, DT_TAG_ACTIVATIONS, &act[v][m]), "alloc");
        must(r[0].D->alloc(r[0].dev, n * 4, DT_TAG_ACTIVATIONS, &grad[v]), "alloc");
    }
    must(dt_mh_begin_step(&r[0], M), "begin A");
    must(dt_mh_begin_step(&r[1], M), "begin B");
    const int64_t bt = B * T;
    double loss_sum = 0;
    for (uint32_t m = 0; m < M; m++)
        for (int v = 0; v < 4; v++) {
            dt_mh_t *h = &r[v % 2];
            double l = NAN;
            must(dt_model_use_slot(h->model, m), "slot");
            must(dt_model_stage_forward(h->model, &h->ctx, vfirst[v], vend[v], inputs + m * bt,
                                        targets + m * bt, v ? act[v - 1][m] : NULL,
                                        v < 3 ? act[v][m] : NULL, m, M, 0, &l),
                 "forward");
            if (v == 3)
                loss_sum += l;
        }
    for (uint32_t m = 0; m < M; m++)
        for (int v = 3; v >= 0; v--) {
            dt_mh_t *h = &r[v % 2];
            must(dt_model_use_slot(h->model, m), "slot");
            must(dt_model_stage_backward(h->model, &h->ctx, vfirst[v], vend[v],
                                         v < 3 ? grad[v] : NULL, v ? grad[v - 1] : NULL, m, M,
                                         (float)(1.0 / M)),
                 "backward");
        }
    const double loss = loss_sum / M;
    printf("interleaved 2 x 2: loss %.9f whole %.9f (diff %.3g)\n", loss, whole_loss,
           fabs(loss - whole_loss));
    assert_true(fabs(loss - whole_loss) <= LOSS_ATOL);
    check_grads("interleaved 2 x 2", &w, &r[0], &r[1], on_rank_a, 0, grads);
    for (int v = 0; v < 4; v++) {
        for (int m = 0; m < M; m++)
            r[0].D->free(r[0].dev, act[v][m]);
        r[0].D->free(r[0].dev, grad[v]);
    }
    dt_mh_close(&r[0]);
    dt_mh_close(&r[1]);
    for (uint32_t u = 0; u < NU; u++)
        free(grads[u]);
    dt_mh_close(&w);
}

/* What a pipeline's balance by compute reads (dt_model_unit_flops): the
 * units' FLOPs sum to the model's per token, the embedding's lookups
 * count nothing, each block 6 per parameter plus 6 T C of attention, and
 * the head its ln_f and the tied LM head (6 x (2C + V C)). */
static void test_unit_flops(void **state)
{
    dt_mh_t w;
    must(dt_mh_open(&w, gpt2_toml, B, T, SEED), "open");
    double f[NU], sum = 0;
    dt_model_unit_flops(w.model, T, f);
    for (uint32_t u = 0; u < NU; u++)
        sum += f[u];
    assert_true(sum == dt_model_flops_per_token(w.model, T));
    assert_true(f[0] == 0.0);
    for (uint32_t u = 1; u <= L; u++)
        assert_true(f[u] == 6.0 * (double)w.desc->units[u].numel + 6.0 * T * C);
    assert_true(f[L + 1] == 6.0 * (2.0 * C + (double)V * C));
    dt_mh_close(&w);
}

static void test_stage_tied_and_refusals(void **state)
{
    (void)state;
    dt_mh_t w;
    must(dt_mh_open(&w, gpt2_toml, B, T, SEED), "open");
    uint32_t tied[2] = {99, 99};
    assert_int_equal(dt_model_stage_tied(w.model, 2, NU, tied, 2), 1);
    assert_int_equal(tied[0], 0);
    assert_int_equal(dt_model_stage_tied(w.model, 0, 2, tied, 2), 0);
    assert_int_equal(dt_model_stage_tied(w.model, 0, NU, tied, 2), 0);
    assert_int_equal(dt_model_stage_check(w.model, 2, 2), DT_ERR_INVALID);
    assert_string_equal(dt_last_error(),
                        "model: stage of units [2, 2) is not a non-empty range of the model's "
                        "5 units");
    assert_int_equal(dt_model_stage_check(w.model, 3, 6), DT_ERR_INVALID);
    /* allocated whole: any stage runs, a stage cannot be set any more */
    assert_int_equal(dt_model_set_stage(w.model, 2, NU), DT_ERR_INVALID);
    assert_string_equal(dt_last_error(),
                        "model: the stage is set before the activations are allocated");
    must(dt_model_set_stage(w.model, 0, NU), "the same (whole) stage again");
    dt_mh_close(&w);

    /* a stage's rank: units [2, 5) keep everything, unit 1 (block.0) its
     * output (the stage's input, B x T x C f32), units 0 nothing; its
     * workspace keeps the logits; the plan is what it allocated (model.c
     * checks it unit by unit); other stages' and whole-model passes are
     * refused */
    dt_mh_stage_first = 2, dt_mh_stage_end = NU;
    must(dt_mh_open(&w, gpt2_toml, B, T, SEED), "open stage [2, 5)");
    dt_mh_stage_first = dt_mh_stage_end = 0;
    uint64_t unit[NU];
    dt_model_act_t act;
    must(dt_model_act_bytes(w.model, B, T, unit, &act), "act bytes of the stage");
    assert_int_equal(unit[0], 0);
    assert_int_equal(unit[1], (uint64_t)B * T * C * 4);
    assert_true(unit[2] > unit[1] && unit[3] == unit[2] && unit[4] > 0);
    assert_int_equal(dt_model_stage_forward(w.model, &w.ctx, 1, NU, NULL, NULL, NULL, NULL, 0, 1,
                                            0, NULL),
                     DT_ERR_INVALID);
    assert_string_equal(dt_last_error(),
                        "model: stage units 1-4 run on activations allocated for units 2-4");
    int32_t tok[B * T] = {0};
    double loss = 0;
    assert_int_equal(dt_model_step_micro(w.model, &w.ctx, tok, tok, 0, 1, 1, 1.0f, &loss),
                     DT_ERR_INVALID);
    assert_string_equal(dt_last_error(), "model: a whole-model step on a rank that runs units "
                                         "2-4 only (a pipeline stage)");
    assert_int_equal(dt_model_set_slots(w.model, 2), DT_ERR_INVALID);
    assert_string_equal(dt_last_error(), "model: activation slots are set before the "
                                         "activations are allocated");
    dt_mh_close(&w);

    /* the same stage keeping 3 micro-batches: every unit's kept bytes
     * three times, the workspace once; slot 3 of 3 refused */
    dt_mh_slots = 3;
    dt_mh_stage_first = 2, dt_mh_stage_end = NU;
    must(dt_mh_open(&w, gpt2_toml, B, T, SEED), "open stage [2, 5), 3 slots");
    dt_mh_stage_first = dt_mh_stage_end = 0;
    dt_mh_slots = 0;
    uint64_t unit3[NU];
    dt_model_act_t act3;
    must(dt_model_act_bytes(w.model, B, T, unit3, &act3), "act bytes, 3 slots");
    for (uint32_t u = 0; u < NU; u++)
        assert_int_equal(unit3[u], 3 * unit[u]);
    assert_int_equal(act3.workspace, act.workspace);
    assert_int_equal(act3.kept, 3 * act.kept);
    must(dt_model_use_slot(w.model, 2), "slot 2 of 3");
    assert_int_equal(dt_model_use_slot(w.model, 3), DT_ERR_INVALID);
    assert_string_equal(dt_last_error(), "model: activation slot 3 of 3");
    dt_mh_close(&w);

    /* stage [0, 2): no head, so no logits in the workspace */
    dt_model_act_t whole, first;
    must(dt_mh_open(&w, gpt2_toml, B, T, SEED), "open whole");
    must(dt_model_act_bytes(w.model, B, T, NULL, &whole), "act bytes, whole");
    dt_mh_close(&w);
    dt_mh_stage_first = 0, dt_mh_stage_end = 2;
    must(dt_mh_open(&w, gpt2_toml, B, T, SEED), "open stage [0, 2)");
    dt_mh_stage_first = dt_mh_stage_end = 0;
    must(dt_model_act_bytes(w.model, B, T, unit, &first), "act bytes, stage [0, 2)");
    /* logits and their gradient (B x T x V f32 each) and the losses
     * (B x T f32) */
    assert_int_equal(whole.workspace - first.workspace,
                     (uint64_t)2 * B * T * V * 4 + (uint64_t)B * T * 4);
    assert_int_equal(unit[2] + unit[3] + unit[4], 0);
    dt_mh_close(&w);

    dt_mh_t m;
    must(dt_mh_open(&m, "[model]\narch = \"mlp\"\nvocab_size = 30\nmlp_in = 8\n"
                        "mlp_hidden = 12\nmlp_layers = 2\n",
                    B, T, SEED),
         "open mlp");
    assert_int_equal(dt_model_stage_check(m.model, 0, 1), DT_ERR_CONFIG);
    assert_string_equal(dt_last_error(), "model: arch mlp cannot be split into pipeline stages");
    dt_mh_close(&m);
    dt_mh_slots = 2;
    assert_int_equal(dt_mh_open(&m, "[model]\narch = \"mlp\"\nvocab_size = 30\nmlp_in = 8\n"
                                    "mlp_hidden = 12\nmlp_layers = 2\n",
                                B, T, SEED),
                     DT_ERR_CONFIG);
    dt_mh_slots = 0;
    assert_string_equal(dt_last_error(),
                        "model: arch mlp keeps one micro-batch's activations only, not 2");
    dt_mh_close(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stages_match_whole),
        cmocka_unit_test(test_interleaved_chunks_match_whole),
        cmocka_unit_test(test_stage_tied_and_refusals),
        cmocka_unit_test(test_unit_flops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
