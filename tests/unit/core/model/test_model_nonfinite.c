/*
 * tests/unit/core/model/test_model_nonfinite.c - dt_model_find_nonfinite
 * (core/model/model.h): after a non-finite loss, the engine re-runs the
 * forward of the last micro-batch and names the first parameter or
 * activation holding a NaN/Inf.
 *
 * Models on the cpu device with the in-test strategy of
 * tests/support/model_harness.c.  Faults are injected into the host master
 * parameters and pushed to the compute copies; the overflow cases make
 * every product of the faulty matmul overflow (inputs >= 3.4 through a
 * bias, weights 1e38, all finite), so no summation order keeps it finite:
 *   - h.1.mlp.c_fc.weight: the phrase names h.1.mlp.c_fc's output in unit
 *     block.1, not the NaNs every later tensor then holds;
 *   - an Inf in h.0.attn.c_attn.weight: named as a parameter;
 *   - a bf16 model whose finite f32 master (FLT_MAX) rounds to Inf in the
 *     bf16 compute copy: the compute copy is what is named;
 *   - mlp: fc.1.weight names fc.1's output, head.weight the logits of
 *     unit head;
 *   - a finite model gives DT_MODEL_FORWARD_FINITE.
 * Each time: the search is an evaluation pass (every unit released, no gradient touched).
 *
 * dt_model_find_nonfinite_grad, after an fp16 step's gradient overflowed:
 * with ln_f.weight 60000 at loss scale 1e38 the tied LM head's gradient
 * overflows first, in the first unit backward completes (the embedding's
 * wte, which the head shares); at scale 1 every gradient is finite and the
 * phrase names the largest element, with the f16 warning only once it
 * passes 65504.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "dtrain/dtrain.h"
#include "model/model.h"
#include "model_harness.h"
#include "test_assert.h"
#include "util/error.h"

enum { L = 3, NH = 2, C = 16, V = 40, CTX = 16, B = 2, T = 8 };
enum { MV = 30, MD = 8, MH = 12, ML = 3 };

static int32_t inputs[B * T], targets[B * T];

static void open_gpt2(dt_mh_t *h, const char *dtype)
{
    char toml[512];
    snprintf(toml, sizeof toml,
             "[model]\narch = \"gpt2\"\nn_layer = %d\nn_head = %d\nn_embd = %d\n"
             "vocab_size = %d\ncontext = %d\ndtype = \"%s\"\n",
             L, NH, C, V, CTX, dtype);
    if (dt_mh_open(h, toml, B, T, 11) != DT_OK)
        fail_msg("opening the gpt2: %s", dt_last_error());
    assert_ok(dt_mh_begin_step(h, 1));
}

static void open_mlp(dt_mh_t *h)
{
    char toml[512];
    snprintf(toml, sizeof toml,
             "[model]\narch = \"mlp\"\nvocab_size = %d\nmlp_in = %d\nmlp_hidden = %d\n"
             "mlp_layers = %d\n",
             MV, MD, MH, ML);
    if (dt_mh_open(h, toml, B, T, 11) != DT_OK)
        fail_msg("opening the mlp: %s", dt_last_error());
    assert_ok(dt_mh_begin_step(h, 1));
}

/* Host master of the tensor called `name`, and its unit and numel. */
static float *tensor(dt_mh_t *h, const char *name, uint64_t *numel)
{
    for (uint32_t u = 0; u < h->desc->n_units; u++)
        for (uint32_t k = 0; k < h->desc->units[u].n_params; k++) {
            const dt_param_desc_v1_t *p = &h->desc->units[u].params[k];
            if (strcmp(p->name, name) == 0) {
                *numel = p->numel;
                return dt_mh_master(h, u) + p->offset;
            }
        }
    fail_msg("no tensor %s", name);
    return NULL;
}

static void fill(dt_mh_t *h, const char *name, float v)
{
    uint64_t n;
    float *w = tensor(h, name, &n);
    for (uint64_t i = 0; i < n; i++)
        w[i] = v;
    assert_ok(dt_mh_sync_params(h));
}

/* The forward alone gives a non-finite loss: the fault is real. */
static void assert_loss_nonfinite(dt_mh_t *h)
{
    double loss = 0;
    assert_ok(dt_model_step_micro(h->model, &h->ctx, inputs, targets, 0, 1, 1, 1.0f, &loss));
    if (isfinite(loss))
        fail_msg("the injected fault left the loss finite (%g)", loss);
}

/* Run the search; check it was an evaluation pass that touched no
 * gradient and released every unit; return the phrase. */
static void find(dt_mh_t *h, char *out, size_t cap)
{
    uint64_t plain0, ng0, plain1, ng1;
    dt_mh_forward_hooks(h, &plain0, &ng0);
    assert_ok(dt_model_find_nonfinite(h->model, &h->ctx, inputs, targets, out, cap));
    dt_mh_forward_hooks(h, &plain1, &ng1);
    assert_int_equal(plain1, plain0);
    /* every unit once; GPT-2 takes unit 0 again for its tied LM head */
    const int gpt2 = strcmp(h->desc->arch, "gpt2") == 0;
    assert_int_equal(ng1 - ng0, h->desc->n_units + (gpt2 ? 1u : 0u));
    assert_ok(dt_mh_end_step(h));
    for (uint32_t u = 0; u < h->desc->n_units; u++) {
        const float *g = dt_mh_grads(h, u);
        for (uint64_t i = 0; i < h->desc->units[u].numel; i++)
            if (g[i] != 0.0f)
                fail_msg("unit %u gradient [%llu] = %g after the search", u,
                         (unsigned long long)i, (double)g[i]);
    }
    printf("  -> %s\n", out);
}

static void test_finite_model(void **state)
{
    (void)state;
    dt_mh_t h;
    open_gpt2(&h, "fp32");
    char out[512];
    find(&h, out, sizeof out);
    assert_string_equal(out, DT_MODEL_FORWARD_FINITE);
    assert_non_null(strstr(out, "every parameter and activation is finite"));
    dt_mh_close(&h);
}

static void test_gpt2_activation_overflow(void **state)
{
    (void)state;
    dt_mh_t h;
    open_gpt2(&h, "fp32");
    /* Finite values whose every product overflows: ln_2's output is
     * z w + 10 with |z| <= sqrt(C - 1) < 4 and w in [0.5, 1.5] (the
     * harness's norm weights), so >= 4 > FLT_MAX / 1e38 = 3.4. */
    fill(&h, "h.1.ln_2.bias", 10.0f);
    fill(&h, "h.1.mlp.c_fc.weight", 1e38f);
    assert_loss_nonfinite(&h);
    assert_ok(dt_mh_begin_step(&h, 1));
    char out[512];
    find(&h, out, sizeof out);
    /* every element overflows to +inf: the first is element 0 */
    assert_string_equal(out, "activation h.1.mlp.c_fc output (unit block.1), after the forward "
                             "of h.1.mlp.c_fc: element 0 of 1024 is inf");
    dt_mh_close(&h);
}

static void test_gpt2_parameter(void **state)
{
    (void)state;
    dt_mh_t h;
    open_gpt2(&h, "fp32");
    uint64_t n;
    tensor(&h, "h.0.attn.c_attn.weight", &n)[5] = INFINITY;
    assert_ok(dt_mh_sync_params(&h));
    char out[512];
    find(&h, out, sizeof out);
    assert_string_equal(out, "parameter h.0.attn.c_attn.weight as the forward reads it (unit "
                             "block.0): element 5 of 768 is inf");
    dt_mh_close(&h);
}

/* The master is finite; the bf16 copy the kernels read is not. */
static void test_gpt2_bf16_compute_copy(void **state)
{
    (void)state;
    dt_mh_t h;
    open_gpt2(&h, "bf16");
    uint64_t n;
    tensor(&h, "h.2.mlp.c_proj.weight", &n)[7] = -FLT_MAX;
    assert_ok(dt_mh_sync_params(&h));
    char out[512];
    find(&h, out, sizeof out);
    assert_string_equal(out, "parameter h.2.mlp.c_proj.weight as the forward reads it (unit "
                             "block.2): element 7 of 1024 is -inf");
    dt_mh_close(&h);
}

static void test_mlp(void **state)
{
    (void)state;
    dt_mh_t h;
    char out[512];
    open_mlp(&h);
    fill(&h, "fc.0.bias", 10.0f); /* fc.1's inputs ~10: every product 1e39 */
    fill(&h, "fc.1.weight", 1e38f);
    assert_loss_nonfinite(&h);
    assert_ok(dt_mh_begin_step(&h, 1));
    find(&h, out, sizeof out);
    assert_string_equal(out, "activation fc.1 output (unit layer.1), after the forward of fc.1: "
                             "element 0 of 192 is inf");
    dt_mh_close(&h);

    open_mlp(&h);
    fill(&h, "fc.2.bias", 10.0f);
    fill(&h, "head.weight", 1e38f);
    assert_loss_nonfinite(&h);
    assert_ok(dt_mh_begin_step(&h, 1));
    find(&h, out, sizeof out);
    assert_string_equal(out, "logits (unit head), after the forward of head.weight, head.bias: "
                             "element 0 of 480 is inf");
    dt_mh_close(&h);
}

/* The gradient search of an fp16 model at scale `scale`: the phrase, with
 * the step's hooks completed. */
static void find_grad(dt_mh_t *h, float scale, char *out, size_t cap)
{
    assert_ok(dt_model_find_nonfinite_grad(h->model, &h->ctx, inputs, targets, scale, out, cap));
    assert_ok(dt_mh_end_step(h));
    printf("  -> %s\n", out);
}

static void test_gpt2_gradient_overflow(void **state)
{
    (void)state;
    dt_mh_t h;
    char out[640];
    open_gpt2(&h, "fp16");
    /* the final layernorm's output x 60000 (finite in f16): the LM head's
     * gradient of wte, dlogits^T @ that output, passes FLT_MAX at scale
     * 1e38 (dlogits alone stays finite even at FLT_MAX) */
    fill(&h, "ln_f.weight", 60000.0f);
    find_grad(&h, 1e38f, out, sizeof out);
    assert_string_equal(out, "gradient of parameter wte.weight (unit embedding), after the "
                             "backward of unit embedding: element 0 of 640 is inf");
    /* scale 1, weights as initialised: all finite; the largest named,
     * below f16's limit */
    fill(&h, "ln_f.weight", 1.0f);
    assert_ok(dt_mh_begin_step(&h, 1));
    find_grad(&h, 1.0f, out, sizeof out);
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s; the largest: gradient of parameter ",
             DT_MODEL_GRADS_FINITE);
    assert_int_equal(strncmp(out, prefix, strlen(prefix)), 0);
    assert_null(strstr(out, "above 65504"));
    /* 2^24: finite in f32, past what an fp16 reduction carries */
    assert_ok(dt_mh_begin_step(&h, 1));
    find_grad(&h, 16777216.0f, out, sizeof out);
    assert_int_equal(strncmp(out, prefix, strlen(prefix)), 0);
    assert_non_null(strstr(out, "(above 65504, the largest f16: a reduce_dtype = \"fp16\" "
                                "reduction overflows there)"));
    dt_mh_close(&h);
}

/* A failing search says so in the phrase too: the caller may print it
 * unconditionally. */
static void test_bad_token(void **state)
{
    (void)state;
    dt_mh_t h;
    open_mlp(&h);
    int32_t bad[B * T];
    memcpy(bad, inputs, sizeof bad);
    bad[3] = MV;
    char out[512];
    assert_status(dt_model_find_nonfinite(h.model, &h.ctx, bad, targets, out, sizeof out),
                  DT_ERR_INVALID);
    const char *want = "re-running the forward to find the first non-finite tensor: model: "
                       "input token 30 at sequence 0, position 3 is outside the vocabulary "
                       "[0, 30)";
    assert_msg(want);
    char full[600];
    snprintf(full, sizeof full, "unknown (the search failed: %s)", want);
    assert_string_equal(out, full);
    dt_mh_close(&h);
}

static int setup(void **state)
{
    (void)state;
    uint64_t st = 99;
    for (int i = 0; i < B * T; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        inputs[i] = (int32_t)((st >> 33) % MV); /* < MV < V: valid for both */
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        targets[i] = (int32_t)((st >> 33) % MV);
    }
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_finite_model),
        cmocka_unit_test(test_gpt2_activation_overflow),
        cmocka_unit_test(test_gpt2_parameter),
        cmocka_unit_test(test_gpt2_bf16_compute_copy),
        cmocka_unit_test(test_mlp),
        cmocka_unit_test(test_gpt2_gradient_overflow),
        cmocka_unit_test(test_bad_token),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
