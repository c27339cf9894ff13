/*
 * tests/unit/sdk/test_model_bigram.c - the example model plugin
 * (sdk/examples/model_bigram: a plugin that reaches the core only through
 * dtrain/model.h's services) on the real cpu device:
 *  - its loss, logits and every gradient against tests/reference/mlp_ref.py
 *    with --mlp-layers 0 (float64 numpy: the same model, a Linear head on
 *    the embedding), within the f32 oracle tolerances DT_MH_LOSS_ATOL_F32
 *    (loss, absolute) and DT_MH_TOL_F32 (relative to each tensor's largest);
 *  - bit for bit the in-tree arch = "mlp" with mlp_layers = 0 (the same
 *    tensor names, so the same initial parameters, and the same kernels);
 *  - its description, shape keys and its own [bigram] width key.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "dtrain/dtrain.h"
#include "model/model.h"
#include "model_harness.h"
#include "test_assert.h"
#include "util/error.h"

enum { V = 83, WIDTH = 24, B = 3, T = 16 };
static const uint64_t SEED = 777;

static int32_t inputs[2 * B * T], targets[2 * B * T];

static const char bigram_toml[] = "[model]\narch = \"bigram\"\nvocab_size = 83\n"
                                  "[bigram]\nwidth = 24\n";
static const char mlp_toml[] = "[model]\narch = \"mlp\"\nvocab_size = 83\nmlp_in = 24\n"
                               "mlp_layers = 0\n";

/* dt_mh_open_fn: the example (fp32, no checkpointing: it has none). */
static void open_bigram(dt_mh_t *h, const char *dtype, const char *ckpt)
{
    (void)dtype, (void)ckpt;
    dt_mh_model_dir = DT_TEST_BINARY_DIR "/example-plugins";
    int rc = dt_mh_open(h, bigram_toml, B, T, SEED);
    dt_mh_model_dir = NULL;
    if (rc != DT_OK)
        fail_msg("opening the bigram example: %s", dt_last_error());
}

static dt_mh_oracle_t orc = {.script = "mlp_ref.py", .args = "--mlp-layers 0",
                             .open = open_bigram, .inputs = inputs, .targets = targets};

static int group_setup(void **state)
{
    (void)state;
    dt_mh_tokens(4321, V, 2 * B * T, inputs, targets);
    inputs[5] = inputs[1]; /* repeated rows: the embedding backward adds */
    return dt_mh_oracle_setup(&orc);
}

static int group_teardown(void **state)
{
    (void)state;
    return dt_mh_oracle_teardown(&orc);
}

/* One step against the float64 oracle: loss, logits, every gradient. */
static void test_against_float64(void **state)
{
    (void)state;
    dt_mh_need_python(&orc);
    char pp[600], rp[600];
    snprintf(pp, sizeof pp, "%s/params.safetensors", orc.dir);
    snprintf(rp, sizeof rp, "%s/ref.safetensors", orc.dir);
    dt_mh_t h;
    open_bigram(&h, "fp32", "none");
    assert_ok(dt_mh_write_params(&h, pp, DT_F32));
    dt_mh_ref(&h, "mlp_ref.py", pp, orc.tok, rp, "--mlp-layers 0");
    double loss = dt_mh_step(&h, inputs, targets, 1, 0);
    float *logits = dt_mh_logits(&h);
    dt_mh_stats_t st;
    memset(&st, 0, sizeof st);
    dt_mh_compare(&h, rp, loss, logits, DT_MH_LOSS_ATOL_F32, DT_MH_TOL_F32, &st);
    dt_mh_print_stats("bigram example fp32", &st);
    free(logits);
    dt_mh_close(&h);
}

/* The same losses and gradients as arch = "mlp" with no hidden layer, to
 * the bit, over two accumulated micro-batches. */
static void test_same_as_mlp(void **state)
{
    (void)state;
    dt_mh_t a, b;
    open_bigram(&a, "fp32", "none");
    if (dt_mh_open(&b, mlp_toml, B, T, SEED) != DT_OK)
        fail_msg("opening the mlp: %s", dt_last_error());
    assert_int_equal(a.desc->numel, b.desc->numel);
    const double la = dt_mh_step(&a, inputs, targets, 2, 0);
    const double lb = dt_mh_step(&b, inputs, targets, 2, 0);
    assert_true(la == lb);
    for (uint32_t u = 0; u < 2; u++) {
        const float *ga = dt_mh_grads(&a, u), *gb = dt_mh_grads(&b, u);
        assert_memory_equal(ga, gb, a.desc->units[u].numel * sizeof(float));
    }
    printf("bigram example = mlp (0 layers): loss %.9g over 2 micro-batches, bit for bit\n", la);
    dt_mh_close(&a);
    dt_mh_close(&b);
}

/* Units, tensors, shape keys (its own width among them), no context. */
static void test_description(void **state)
{
    (void)state;
    dt_mh_t h;
    open_bigram(&h, "fp32", "none");
    const dt_model_desc_v1_t *d = h.desc;
    assert_string_equal(d->arch, "bigram");
    assert_int_equal(d->n_units, 2);
    assert_string_equal(d->units[0].name, "embedding");
    assert_string_equal(d->units[1].params[0].name, "head.weight");
    assert_int_equal(d->units[1].params[0].shape[1], WIDTH);
    assert_true((d->units[1].params[1].flags & DT_PARAM_NO_DECAY) != 0);
    const dt_model_info_t *mi = dt_model_info(h.model);
    assert_int_equal(mi->n_keys, 2);
    assert_string_equal(mi->keys[1].key, "width");
    assert_int_equal(mi->keys[1].value, WIDTH);
    assert_int_equal(mi->context, 0);
    assert_int_equal(dt_model_stage_check(h.model, 0, 1), DT_ERR_CONFIG);
    /* the state the plugin saw: the core's description and info, its
     * services; the config is the plugin's during create only */
    dt_model_state_t *st = dt_model_state(h.model);
    assert_int_equal(st->struct_size, sizeof(dt_model_state_t));
    assert_ptr_equal(st->desc, h.desc);
    assert_ptr_equal(st->info, mi);
    assert_int_equal(st->svc->struct_size, sizeof(dt_model_services_t));
    int64_t v = 0;
    assert_status(st->svc->config_int(st, "bigram.width", &v), DT_ERR_INVALID);
    assert_msg("model: bigram.width read outside create");
    dt_mh_close(&h);
}

int main(int argc, char **argv)
{
    (void)argc, (void)argv;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_float64),
        cmocka_unit_test(test_same_as_mlp),
        cmocka_unit_test(test_description),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
