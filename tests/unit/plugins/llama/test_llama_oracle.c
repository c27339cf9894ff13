/*
 * tests/unit/plugins/llama/test_llama_oracle.c - the LLaMA-family model (the llama
 * model plugin, plugins/llama/llama.c) on the real cpu device against
 * tests/reference/llama_ref.py, an independent float64 numpy LLaMA with a
 * hand-written backward (itself checked first by
 * test_llama_ref_selfcheck.py: finite differences, a naive loop forward).
 *
 * A small llama with grouped-query attention and an untied LM head (L=3,
 * n_head 4, n_kv_head 2, C=48 so head_dim 12, intermediate_size 80, V=83,
 * context 20; micro-batch B=3, T=16) is built from a [model] config and
 * run through the harness's strategy (tests/support/model_harness.c),
 * parameters perturbed from init (matrices to std 1/sqrt(fan_in), norm
 * weights 1 +/- 0.5, biases +/- 0.3).  One forward+backward is compared
 * with the oracle: loss, logits and the gradient of every parameter, for
 * activation_checkpointing none / all / every 2 (and recomputation
 * bit-identical), gradient accumulation over two micro-batches, an
 * evaluation pass, bf16 and fp16 parameters.  Two more shapes: the LM head
 * tied to embed_tokens with Qwen2's q/k/v biases and plain multi-head
 * attention, and Llama 3.1's rope_scaling (with original_max_position_
 * embeddings 64, so at head_dim 12 the frequencies fall in all three of
 * its bands: kept, smoothed, divided by the factor).
 *
 * Tolerances are GPT-2's (model_harness.h DT_MH_*, test_gpt2_oracle.c
 * says why); the measured worst per tensor type is printed.  Measured
 * worst (cpu, relative to the tensor's largest |ref|): fp32 1.4e-6 over
 * none/all/every (bound 2e-5), loss 8e-9 (1e-5); the tied + bias and
 * rope_scaling shapes 3.0e-6 and 2.3e-6; bf16 and fp16 against the oracle
 * on the rounded parameters 2.7e-6 and 2.1e-6 (2e-5).  Against the oracle
 * on the unrounded parameters bf16 reaches 4.5e-2 (q_proj; bound 5e-2,
 * loss 1.1e-3 of 2e-2) and fp16 6.0e-3 (post_attention_layernorm; bound
 * 6.25e-3, loss 3.3e-5 of 2.5e-3): the 8x ratio of the two roundings, and
 * close to GPT-2's bounds, which these shapes' peaked attention through
 * 3 layers of RMSNorm reaches.  The parameters are fixed (seeded), the cpu
 * results the same bits at any thread count, so the margin does not move
 * between runs; a wrong derivative term is O(1) off.
 *
 * Device-parametrized like test_gpt2_oracle: `test_llama_oracle [cpu|cuda]`;
 * unit.test_llama_oracle.cuda exits 77 (skipped) without a CUDA device.
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
#include "dtrain/dtrain.h"
#include "model/model.h"
#include "model_harness.h"
#include "cuda_probe.h"
#include "test_assert.h"
#include "util/error.h"

enum { L = 3, NH = 4, NKV = 2, C = 48, HD = 12, I = 80, V = 83, MAXT = 20, B = 3, T = 16 };
static const uint64_t SEED = 2626;

/* two micro-batches of B sequences: inputs/targets (2, B, T) */
static int32_t inputs[2 * B * T], targets[2 * B * T];

static void open_toml(dt_mh_t *h, int n_kv, const char *dtype, const char *ckpt,
                      const char *extra)
{
    char toml[1024];
    snprintf(toml, sizeof toml,
             "[model]\narch = \"llama\"\nn_layer = %d\nn_head = %d\nn_kv_head = %d\n"
             "n_embd = %d\nintermediate_size = %d\nvocab_size = %d\ncontext = %d\n"
             "dtype = \"%s\"\nactivation_checkpointing = \"%s\"\ncheckpoint_every = 2\n%s",
             L, NH, n_kv, C, I, V, MAXT, dtype, ckpt, extra ? extra : "");
    int rc = dt_mh_open(h, toml, B, T, SEED);
    if (rc != DT_OK)
        fail_msg("opening the llama (%s, %s, %s): %s", dtype, ckpt, extra ? extra : "",
                 dt_last_error());
}

static void open_model(dt_mh_t *h, const char *dtype, const char *ckpt)
{
    open_toml(h, NKV, dtype, ckpt, NULL);
}

static dt_mh_oracle_t orc = {.script = "llama_ref.py", .open = open_model, .inputs = inputs,
                             .targets = targets};

static int group_setup(void **state)
{
    (void)state;
    static char args[96];
    snprintf(args, sizeof args, "--n-layer %d --n-head %d --n-kv-head %d", L, NH, NKV);
    orc.args = args;
    dt_mh_tokens(2626, V, 2 * B * T, inputs, targets);
    inputs[7] = inputs[2]; /* repeated rows: the embedding backward adds */
    inputs[T + 3] = inputs[2];
    inputs[B * T + 1] = inputs[2];
    targets[9] = V - 1;
    inputs[10] = V - 1;
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
    assert_int_equal(dt_mh_run_ref(&h, "test_llama_ref_selfcheck.py", ">/dev/null"), 0);
}

static void test_fp32_checkpointing(void **state)
{
    (void)state;
    dt_mh_check_checkpointing(&orc, "llama");
}

static void test_fp32_accumulation(void **state)
{
    (void)state;
    dt_mh_check_accumulation(&orc, "every", "llama");
}

/* An evaluation pass: the oracle's loss and logits, untouched gradients. */
static void test_eval_pass(void **state)
{
    (void)state;
    dt_mh_need_python(&orc);
    dt_mh_t h;
    open_model(&h, "fp32", "all");
    double loss = dt_mh_step(&h, inputs, targets, 1, 1);
    float *logits = dt_mh_logits(&h);
    assert_non_null(logits);
    uint64_t n;
    float *g = dt_mh_all_grads(&h, &n);
    for (uint64_t i = 0; i < n; i++)
        if (g[i] != 0.0f)
            fail_msg("gradient element %llu is %g after a no-grad pass", (unsigned long long)i,
                     (double)g[i]);
    free(g);
    double loss2 = dt_mh_step(&h, inputs, targets, 1, 0);
    assert_true(loss2 == loss);
    dt_mh_compare(&h, orc.ref, loss, logits, DT_MH_LOSS_ATOL_F32, DT_MH_TOL_F32, NULL);
    free(logits);
    dt_mh_close(&h);
}

static void test_bf16(void **state)
{
    (void)state;
    dt_mh_check_half(&orc, "bf16", "llama");
}

static void test_fp16(void **state)
{
    (void)state;
    dt_mh_check_half(&orc, "fp16", "llama");
}

/* Another shape against its own oracle run, fp32, under each
 * checkpointing mode: `extra` [model] lines, `args` the oracle's. */
static void check_variant(int n_kv, const char *extra, const char *args, const char *label)
{
    dt_mh_need_python(&orc);
    char pp[600], rp[600], full[1024];
    snprintf(pp, sizeof pp, "%s/%s_params.safetensors", orc.dir, label);
    snprintf(rp, sizeof rp, "%s/%s_ref.safetensors", orc.dir, label);
    snprintf(full, sizeof full, "--n-layer %d --n-head %d --n-kv-head %d %s", L, NH, n_kv, args);
    static const char *modes[] = {"none", "every"};
    dt_mh_stats_t st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < 2; i++) {
        dt_mh_t h;
        open_toml(&h, n_kv, "fp32", modes[i], extra);
        if (i == 0) {
            assert_ok(dt_mh_write_params(&h, pp, DT_F32));
            dt_mh_ref(&h, "llama_ref.py", pp, orc.tok, rp, full);
        }
        double loss = dt_mh_step(&h, inputs, targets, 1, 0);
        float *logits = dt_mh_logits(&h);
        assert_non_null(logits);
        dt_mh_compare(&h, rp, loss, logits, DT_MH_LOSS_ATOL_F32, DT_MH_TOL_F32, &st);
        free(logits);
        dt_mh_close(&h);
    }
    char what[128];
    snprintf(what, sizeof what, "llama %s fp32 (none/every)", label);
    dt_mh_print_stats(what, &st);
}

/* The LM head tied to embed_tokens (its gradient holds both parts),
 * Qwen2's q/k/v biases, multi-head attention (n_kv_head = n_head). */
static void test_tied_qkv_bias(void **state)
{
    (void)state;
    check_variant(NH, "tie_embeddings = true\nqkv_bias = true\nrope_theta = 500.0\n",
                  "--tied 1 --qkv-bias 1 --rope-theta 500", "tied_bias");
}

/* Llama 3.1's frequency scaling, and a non-default RMSNorm epsilon. */
static void test_rope_scaling(void **state)
{
    (void)state;
    check_variant(NKV,
                  "rope_scaling = \"llama3\"\nrope_scaling_factor = 4.0\n"
                  "rope_scaling_low_freq_factor = 1.0\nrope_scaling_high_freq_factor = 4.0\n"
                  "rope_scaling_original_max_position_embeddings = 64\nrms_norm_eps = 1e-3\n",
                  "--rms-eps 1e-3 --rope-scaling '{\"rope_type\": \"llama3\", \"factor\": 4, "
                  "\"low_freq_factor\": 1, \"high_freq_factor\": 4, "
                  "\"original_max_position_embeddings\": 64}'",
                  "rope_scaling");
}

/* The description: units, Hugging Face's names, shapes, NO_DECAY flags,
 * sizes, info keys. */
static void test_description(void **state)
{
    (void)state;
    dt_mh_t h;
    open_model(&h, "fp32", "none");
    const dt_model_desc_v1_t *d = h.desc;
    assert_string_equal(d->arch, "llama");
    assert_int_equal(d->n_units, L + 2);
    assert_string_equal(d->units[0].name, "embedding");
    assert_string_equal(d->units[0].params[0].name, "embed_tokens.weight");
    assert_string_equal(d->units[2].name, "block.1");
    const dt_unit_desc_v1_t *b = &d->units[2];
    assert_int_equal(b->n_params, 9);
    static const char *names[] = {"input_layernorm.weight", "self_attn.q_proj.weight",
                                  "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                  "self_attn.o_proj.weight", "post_attention_layernorm.weight",
                                  "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                  "mlp.down_proj.weight"};
    const int64_t shapes[9][2] = {{C, 0},  {NH * HD, C}, {NKV * HD, C}, {NKV * HD, C},
                                  {C, NH * HD}, {C, 0},   {I, C},        {I, C},
                                  {C, I}};
    for (int k = 0; k < 9; k++) {
        char nm[96];
        snprintf(nm, sizeof nm, "layers.1.%s", names[k]);
        assert_string_equal(b->params[k].name, nm);
        assert_int_equal(b->params[k].shape[0], shapes[k][0]);
        assert_int_equal(b->params[k].shape[1], shapes[k][1]);
    }
    assert_string_equal(d->units[L + 1].name, "head");
    assert_string_equal(d->units[L + 1].params[0].name, "norm.weight");
    assert_string_equal(d->units[L + 1].params[1].name, "lm_head.weight");
    for (uint32_t u = 0; u < d->n_units; u++)
        for (uint32_t k = 0; k < d->units[u].n_params; k++) {
            const dt_param_desc_v1_t *p = &d->units[u].params[k];
            assert_int_equal((p->flags & DT_PARAM_NO_DECAY) != 0, p->ndim == 1);
        }
    const uint64_t block = 2 * C + (NH + 2 * NKV) * HD * C + C * NH * HD + 3 * I * C;
    assert_int_equal(d->numel, 2 * V * C + L * block + C);
    const dt_model_info_t *mi = dt_model_info(h.model);
    assert_string_equal(mi->arch, "llama");
    assert_int_equal(mi->vocab_size, V);
    assert_int_equal(mi->context, MAXT);
    assert_int_equal(mi->boundary_width, C);
    assert_int_equal(mi->tied_embedding, 0);
    /* context recorded too: dtrain sample rebuilds the model with it */
    static const char *keys[] = {"n_layer",   "n_head",       "n_kv_head",         "n_embd",
                                 "vocab_size", "context",     "intermediate_size", "head_dim",
                                 "tie_embeddings", "qkv_bias", "rope_theta",       "rms_norm_eps",
                                 "rope_scaling"};
    const int64_t vals[] = {L, NH, NKV, C, V, MAXT, I, HD, 0, 0};
    assert_int_equal(mi->n_keys, 13);
    for (int k = 0; k < 13; k++) {
        assert_string_equal(mi->keys[k].key, keys[k]);
        const int kind = k < 8 ? DT_MODEL_KEY_INT : k < 10 ? DT_MODEL_KEY_BOOL
                                                  : k < 12 ? DT_MODEL_KEY_FLOAT
                                                           : DT_MODEL_KEY_CHOICE;
        assert_int_equal(mi->keys[k].kind, kind);
        if (k < 10)
            assert_int_equal(mi->keys[k].value, vals[k]);
    }
    assert_true(mi->keys[10].f == 10000.0);
    assert_true(mi->keys[11].f == 1e-5);
    assert_string_equal(mi->keys[12].s, "none");
    assert_true(dt_hf_model_has(dt_model_ops(h.model))); /* reads HF's LlamaForCausalLM */
    dt_mh_close(&h);
    /* tied: no lm_head, the last unit reads unit 0; biases after v */
    open_toml(&h, NKV, "fp32", "none", "tie_embeddings = true\nqkv_bias = true\n");
    d = h.desc;
    assert_int_equal(d->units[L + 1].n_params, 1);
    assert_int_equal(dt_model_info(h.model)->tied_embedding, 1);
    assert_int_equal(d->units[1].n_params, 12);
    assert_string_equal(d->units[1].params[4].name, "layers.0.self_attn.q_proj.bias");
    assert_string_equal(d->units[1].params[6].name, "layers.0.self_attn.v_proj.bias");
    assert_int_equal(d->numel, V * C + L * (block + (NH + 2 * NKV) * HD) + C);
    dt_mh_close(&h);
    /* rope_scaling: its four settings recorded too */
    open_toml(&h, NKV, "fp32", "none", "rope_scaling = \"llama3\"\n");
    mi = dt_model_info(h.model);
    assert_int_equal(mi->n_keys, 17);
    assert_string_equal(mi->keys[12].s, "llama3");
    assert_string_equal(mi->keys[13].key, "rope_scaling_factor");
    assert_true(mi->keys[13].f == 8.0);
    assert_string_equal(mi->keys[16].key, "rope_scaling_original_max_position_embeddings");
    assert_int_equal(mi->keys[16].value, 8192);
    dt_mh_close(&h);
}

/* Impossible shapes and keys of another arch are refused by name. */
static void test_config_errors(void **state)
{
    (void)state;
    dt_mh_t h;
    const char *base = "[model]\narch = \"llama\"\nn_layer = 1\nn_head = 6\nn_embd = 48\n";
    char toml[512];
    snprintf(toml, sizeof toml, "%sn_kv_head = 4\n", base);
    assert_status(dt_mh_open(&h, toml, 1, 4, SEED), DT_ERR_CONFIG);
    assert_msg("config: [model] n_kv_head = 4 does not divide n_head = 6: query heads share "
               "key/value heads in equal groups");
    dt_mh_close(&h);
    snprintf(toml, sizeof toml, "%shead_dim = 7\n", base);
    assert_status(dt_mh_open(&h, toml, 1, 4, SEED), DT_ERR_CONFIG);
    assert_msg("config: [model] head_dim = 7 is odd: the rotary embedding pairs a head's "
               "channels");
    dt_mh_close(&h);
    snprintf(toml, sizeof toml, "%spreset = \"gpt2-124m\"\n", base);
    assert_status(dt_mh_open(&h, toml, 1, 4, SEED), DT_ERR_CONFIG);
    assert_msg_has("config: [model] preset = \"gpt2-124m\" is not a llama preset");
    dt_mh_close(&h);
    assert_status(dt_mh_open(&h, "[model]\narch = \"gpt2\"\npreset = \"llama-tiny\"\n", 1, 4,
                             SEED),
                  DT_ERR_CONFIG);
    assert_msg("config: [model] preset = \"llama-tiny\": gpt2's presets are custom, "
               "gpt2-tiny, gpt2-small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m");
    dt_mh_close(&h);
    assert_status(dt_mh_open(&h, "[model]\narch = \"gpt2\"\nn_kv_head = 2\n", 1, 4, SEED),
                  DT_ERR_CONFIG);
    assert_msg("config: [model] n_kv_head is set (in the file) but arch = \"gpt2\" does not "
               "read it");
    dt_mh_close(&h);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        dt_mh_device = argv[1];
    if (strcmp(dt_mh_device, "cuda") == 0) {
        char why[512];
        if (dt_test_cuda_devices(why, sizeof why) == 0) {
            printf("SKIPPED: %s\n", why);
            return DT_TEST_SKIP_CODE;
        }
    } else if (strcmp(dt_mh_device, "cpu") != 0) {
        fprintf(stderr, "usage: test_llama_oracle [cpu|cuda]\n");
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oracle_selfcheck),
        cmocka_unit_test(test_description),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_fp32_checkpointing),
        cmocka_unit_test(test_fp32_accumulation),
        cmocka_unit_test(test_eval_pass),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_tied_qkv_bias),
        cmocka_unit_test(test_rope_scaling),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
