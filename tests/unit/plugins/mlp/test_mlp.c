/*
 * tests/unit/plugins/mlp/test_mlp.c - the arch = "mlp" model (plugins/mlp/mlp.c): its
 * description and config rules, and one forward+backward on the real cpu
 * device against tests/reference/mlp_ref.py (float64 numpy, hand-written
 * backward, itself checked first by test_mlp_ref_selfcheck.py: naive loop
 * forward and finite differences).
 *
 * Model: V = 83, mlp_in = 24, mlp_hidden = 40, mlp_layers = 3; micro-batch
 * B = 3, T = 16.  The in-test strategy of tests/support/model_harness.c
 * holds the parameters and checks the hook contract; parameters are
 * dt_model_init_unit perturbed (matrices to std 1/sqrt(fan_in), biases
 * +/- 0.3) so GELU is non-linear and every gradient carries signal.
 * Compared: loss, logits, every gradient, for activation_checkpointing
 * none / all / every 2, accumulation over two micro-batches, mlp_layers =
 * 0, and dtype = "bf16".
 *
 * Skipped, with the reason, only when /usr/bin/python3 or numpy is missing.
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

#include "ckpt/hf_model.h"
#include "config/config.h"
#include "dtrain/dtrain.h"
#include "model/model.h"
#include "model_harness.h"
#include "test_assert.h"
#include "util/error.h"

enum { V = 83, DIN = 24, HID = 40, NL = 3, B = 3, T = 16 };
static const uint64_t SEED = 777;

/*
 * Tolerances (tests/support/model_harness.h DT_MH_*), |got - ref| relative
 * to the tensor's largest |ref|, as in test_gpt2_oracle.c: fp32 sums here
 * are short (at most 48 positions or 40 features) and there is no
 * normalisation: measured worst 4.7e-7 (printed below), bound 2e-5, while
 * any wrong derivative term is O(1) off.  bf16 against the oracle on bf16-rounded parameters must be as
 * tight (measured 4.6e-7); against the f32 oracle, 8-bit mantissas (up to
 * 2^-9 relative per parameter) through 4 layers give 4.3e-3 (measured):
 * bound 5e-2 as for GPT-2, loss 2e-2 absolute (measured 5e-5).
 */

/* two micro-batches of B sequences: inputs/targets (2, B, T) */
static int32_t inputs[2 * B * T], targets[2 * B * T];

static void model_toml(char *out, size_t cap, int layers, const char *dtype, const char *ckpt,
                       const char *extra)
{
    snprintf(out, cap,
             "[model]\narch = \"mlp\"\nvocab_size = %d\nmlp_in = %d\nmlp_hidden = %d\n"
             "mlp_layers = %d\ndtype = \"%s\"\nactivation_checkpointing = \"%s\"\n"
             "checkpoint_every = 2\n%s",
             V, DIN, HID, layers, dtype, ckpt, extra ? extra : "");
}

static void open_model(dt_mh_t *h, int layers, const char *dtype, const char *ckpt)
{
    char toml[512];
    model_toml(toml, sizeof toml, layers, dtype, ckpt, NULL);
    if (dt_mh_open(h, toml, B, T, SEED) != DT_OK)
        fail_msg("opening the mlp (%d layers, %s, %s): %s", layers, dtype, ckpt,
                 dt_last_error());
}

static void open_fixed(dt_mh_t *h, const char *dtype, const char *ckpt)
{
    open_model(h, NL, dtype, ckpt);
}

static void run_ref(const dt_mh_t *h, const char *tok, const char *out, const char *params,
                    int layers)
{
    char args[64];
    snprintf(args, sizeof args, "--mlp-layers %d", layers);
    dt_mh_ref(h, "mlp_ref.py", params, tok, out, args);
}

/* The oracle's files (model_harness.h): params, tokens, its outputs. */
static dt_mh_oracle_t orc = {.script = "mlp_ref.py", .open = open_fixed, .inputs = inputs,
                             .targets = targets};

static int group_setup(void **state)
{
    (void)state;
    static char args[64];
    snprintf(args, sizeof args, "--mlp-layers %d", NL);
    orc.args = args;
    dt_mh_tokens(1234, V, 2 * B * T, inputs, targets);
    inputs[5] = inputs[1]; /* repeated rows: the embedding backward adds */
    inputs[B * T + 2] = inputs[1];
    return dt_mh_oracle_setup(&orc);
}

static int group_teardown(void **state)
{
    (void)state;
    return dt_mh_oracle_teardown(&orc);
}

/* The oracle must pass its own checks before it judges the model. */
static void test_oracle_selfcheck(void **state)
{
    (void)state;
    dt_mh_need_python(&orc);
    dt_mh_t h = {.source_dir = DT_TEST_SOURCE_DIR};
    assert_int_equal(dt_mh_run_ref(&h, "test_mlp_ref_selfcheck.py", ">/dev/null"), 0);
}

static void test_fp32_checkpointing(void **state)
{
    (void)state;
    dt_mh_check_checkpointing(&orc, "mlp");
}

static void test_fp32_accumulation(void **state)
{
    (void)state;
    dt_mh_check_accumulation(&orc, "all", "mlp");
}

/* No hidden layer: the head reads the embedding (a linear bigram model). */
static void test_zero_layers(void **state)
{
    (void)state;
    dt_mh_need_python(&orc);
    char pp[600], rp[600];
    snprintf(pp, sizeof pp, "%s/params0.safetensors", orc.dir);
    snprintf(rp, sizeof rp, "%s/ref0.safetensors", orc.dir);
    dt_mh_t h;
    open_model(&h, 0, "fp32", "all");
    assert_int_equal(h.desc->n_units, 2);
    assert_int_equal(h.desc->units[1].params[0].shape[1], DIN);
    assert_ok(dt_mh_write_params(&h, pp, DT_F32));
    run_ref(&h, orc.tok, rp, pp, 0);
    double loss = dt_mh_step(&h, inputs, targets, 1, 0);
    float *logits = dt_mh_logits(&h);
    dt_mh_stats_t st;
    memset(&st, 0, sizeof st);
    dt_mh_compare(&h, rp, loss, logits, DT_MH_LOSS_ATOL_F32, DT_MH_TOL_F32, &st);
    dt_mh_print_stats("mlp fp32 0 layers", &st);
    free(logits);
    dt_mh_close(&h);
}

static void test_bf16(void **state)
{
    (void)state;
    dt_mh_check_half(&orc, "bf16", "mlp");
}

/* fp16 compute parameters: as bf16, at fp16's precision; and loss
 * scaling is exact. */
static void test_fp16(void **state)
{
    (void)state;
    dt_mh_check_half(&orc, "fp16", "mlp");
}

/* Units, names, shapes, flags, info keys; init rules; no context limit. */
static void test_description(void **state)
{
    (void)state;
    dt_mh_t h;
    open_model(&h, NL, "fp32", "none");
    const dt_model_desc_v1_t *d = h.desc;
    assert_string_equal(d->arch, "mlp");
    assert_int_equal(d->n_units, NL + 2);
    static const char *units[] = {"embedding", "layer.0", "layer.1", "layer.2", "head"};
    for (uint32_t u = 0; u < d->n_units; u++)
        assert_string_equal(d->units[u].name, units[u]);
    assert_string_equal(d->units[0].params[0].name, "embed.weight");
    assert_int_equal(d->units[0].params[0].shape[0], V);
    assert_int_equal(d->units[0].params[0].shape[1], DIN);
    assert_string_equal(d->units[1].params[0].name, "fc.0.weight");
    assert_int_equal(d->units[1].params[0].shape[1], DIN);
    assert_string_equal(d->units[2].params[1].name, "fc.1.bias");
    assert_int_equal(d->units[2].params[0].shape[1], HID);
    assert_string_equal(d->units[4].params[0].name, "head.weight");
    assert_int_equal(d->units[4].params[0].shape[0], V);
    uint64_t want = (uint64_t)V * DIN + (uint64_t)HID * DIN + HID +
                    (uint64_t)(NL - 1) * (HID * HID + HID) + (uint64_t)V * HID + V;
    assert_int_equal(d->numel, want);
    for (uint32_t u = 0; u < d->n_units; u++)
        for (uint32_t k = 0; k < d->units[u].n_params; k++) {
            const dt_param_desc_v1_t *p = &d->units[u].params[k];
            assert_int_equal((p->flags & DT_PARAM_NO_DECAY) != 0, p->ndim == 1);
        }
    const dt_model_info_t *mi = dt_model_info(h.model);
    assert_string_equal(mi->arch, "mlp");
    assert_string_equal(mi->dtype, "fp32");
    assert_int_equal(mi->vocab_size, V);
    assert_int_equal(mi->context, 0);
    assert_int_equal(mi->n_keys, 4);
    static const char *keys[] = {"vocab_size", "mlp_in", "mlp_hidden", "mlp_layers"};
    static const int64_t vals[] = {V, DIN, HID, NL};
    for (int i = 0; i < 4; i++) {
        assert_string_equal(mi->keys[i].key, keys[i]);
        assert_int_equal(mi->keys[i].value, vals[i]);
    }
    assert_false(dt_hf_model_has(dt_model_ops(h.model))); /* no Hugging Face files */
    /* 6 FLOPs per matmul parameter; the lookup table is no matmul */
    assert_true(dt_model_flops_per_token(h.model, T) == 6.0 * (double)(want - V * DIN));

    /* init: a function of (seed, name); normal(0, 0.02); biases 0 */
    float *a = malloc(d->units[4].numel * 4), *b = malloc(d->units[4].numel * 4);
    assert_non_null(a);
    assert_non_null(b);
    assert_ok(dt_model_init_unit(h.model, 4, 5, a));
    assert_ok(dt_model_init_unit(h.model, 4, 5, b));
    assert_memory_equal(a, b, d->units[4].numel * 4);
    const dt_param_desc_v1_t *w = &d->units[4].params[0], *bias = &d->units[4].params[1];
    double ss = 0;
    for (uint64_t i = 0; i < w->numel; i++)
        ss += (double)a[w->offset + i] * a[w->offset + i];
    /* 3320 samples: the sample std is within 5% of 0.02 with margin */
    assert_true(fabs(sqrt(ss / (double)w->numel) - 0.02) < 0.001);
    for (uint64_t i = 0; i < bias->numel; i++)
        assert_true(a[bias->offset + i] == 0.0f);
    assert_ok(dt_model_init_unit(h.model, 4, 6, b));
    assert_true(memcmp(a, b, w->numel * 4) != 0);
    free(a);
    free(b);
    dt_mh_close(&h);

    /* a bigram model takes any sequence length */
    char toml[512];
    model_toml(toml, sizeof toml, 1, "fp32", "none", NULL);
    assert_ok(dt_mh_open(&h, toml, 2, 3000, SEED));
    dt_mh_close(&h);
}

/* Keys of the other arch are errors, naming the key and where it came from. */
static void test_config_errors(void **state)
{
    (void)state;
    char toml[512];
    dt_mh_t h;
    model_toml(toml, sizeof toml, NL, "fp32", "none", "n_layer = 4\n");
    assert_status(dt_mh_open(&h, toml, B, T, SEED), DT_ERR_CONFIG);
    assert_msg("config: [model] n_layer is set (in the file) but arch = \"mlp\" does not "
               "read it");
    dt_mh_close(&h);
    assert_status(dt_mh_open(&h, "[model]\narch = \"gpt2\"\nmlp_hidden = 8\n", B, T, SEED),
                  DT_ERR_CONFIG);
    assert_msg("config: [model] mlp_hidden is set (in the file) but arch = \"gpt2\" does not "
               "read it");
    dt_mh_close(&h);
    assert_status(dt_mh_open(&h, "[model]\narch = \"mlp\"\nmlp_out = 8\n", B, T, SEED),
                  DT_ERR_CONFIG);
    assert_msg_has("unknown key 'mlp_out' in [model]");
    dt_mh_close(&h);
    /* a vocabulary past uint16 (token files of uint32 ids hold it) */
    assert_ok(dt_mh_open(&h, "[model]\narch = \"mlp\"\nvocab_size = 70000\n", B, T, SEED));
    dt_mh_close(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_description),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_oracle_selfcheck),
        cmocka_unit_test(test_fp32_checkpointing),
        cmocka_unit_test(test_fp32_accumulation),
        cmocka_unit_test(test_zero_layers),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_fp16),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
