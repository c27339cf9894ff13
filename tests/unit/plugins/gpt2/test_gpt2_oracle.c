/*
 * tests/unit/plugins/gpt2/test_gpt2_oracle.c - the GPT-2 model (plugins/gpt2/gpt2.c) on
 * the real cpu device against tests/reference/gpt2_ref.py, an independent
 * float64 numpy GPT-2 with a hand-written backward (itself checked by
 * finite differences in test_gpt2_ref_selfcheck.py).
 *
 * A small GPT-2 (L=3, H=4, C=48, V=83, maxT=20; micro-batch B=3, T=16) is
 * built from a [model] config; a strategy inside the test
 * (tests/support/model_harness.c) holds flat f32 parameters per unit and
 * checks the hook contract.  Parameters start at dt_model_init_unit and
 * are perturbed (matrices to std 1/sqrt(fan_in), norm weights 1 +/- 0.5,
 * biases +/- 0.3) so attention is peaked and every bias / norm gradient
 * path carries signal.  One forward+backward in dtrain is compared with the
 * oracle: loss, logits and the gradient of every parameter, for
 * activation_checkpointing none / all / every 2, for gradient accumulation
 * over two micro-batches, for an evaluation (no-grad) pass, and for
 * dtype = "bf16".
 *
 * Skipped, with the reason, only when /usr/bin/python3 or numpy is missing
 * (python3-numpy is in the project's install list, so CI runs it).
 *
 * Device-parametrized: `test_gpt2_oracle [cpu|cuda]` (default cpu) runs the
 * model on that device plugin (tests/support/model_harness.c,
 * dt_mh_device), with the same tolerances: the cuda kernels compute in f32
 * too (TF32 off).  unit.test_gpt2_oracle.cuda exits 77, which ctest
 * reports as skipped, printing "no CUDA device: ..." where there is none;
 * it passed on an H200 (scripts/gpu-check.sh).
 *
 * AdamW is not checked here: tests/unit/plugins/cpu/test_kernels.c (test_adamw:
 * the kernel's bias correction and decoupled decay against
 * dt_ref_adamw_update, 5 steps) and tests/unit/plugins/ddp/test_ddp.c
 * (test_step_adamw_reference: the strategy's step with clipping and the
 * NO_DECAY mask against a double reference) already do.
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

enum { L = 3, NH = 4, C = 48, V = 83, MAXT = 20, B = 3, T = 16 };
static const uint64_t SEED = 4242;

/*
 * Tolerances (tests/support/model_harness.h DT_MH_*), |got - ref| relative
 * to the tensor's largest |ref|:
 *
 * fp32 (DT_MH_TOL_F32 = 2e-5).  Every value is an f32 computation of a few
 * hundred terms at most (C = 48 channels, 4C = 192 hidden, B*T = 48
 * positions, V = 83 classes; 512 and 256 in the gpt2-tiny shape), each
 * rounding at u = 6e-8; errors grow through the blocks' layernorm backward
 * (which subtracts means of products) and the softmax.  Measured worst
 * over all tensors and cases: 9.5e-7 (printed per tensor type), so 2e-5
 * leaves 20x headroom, while a wrong term in any derivative (a missing
 * residual path, a transposed weight, a dropped bias or layernorm
 * gradient, a wrong attention scale) is off by O(1): dropping one bias
 * gradient or the tied head's wte gradient fails with 1.0.
 * Loss: a mean of 48 cross-entropies of size ~4.4 summed in double from f32
 * values: 1e-5 absolute (measured 6e-8).
 *
 * bf16 (DT_MH_TOL_F32 again against the oracle run on the bf16-rounded
 * parameters): the model computes with exactly those values (bf16 widens
 * to f32 without error), so it must match as tightly as fp32 (measured
 * 7.7e-7); this checks that every kernel reads the right bf16 tensor.
 * Against the oracle on the unrounded parameters (DT_MH_TOL_BF16 = 5e-2):
 * bf16 keeps 8 significant bits (relative rounding up to 2^-9 = 2e-3 per
 * parameter); those errors add up over the 3 blocks and are amplified by
 * the peaked attention and the normalisations.  Measured worst 1.6e-2
 * (ln_2.weight), loss 5.5e-4; bounds 5e-2 and 2e-2 absolute.
 *
 * fp16 the same way: exact against the oracle on the fp16-rounded
 * parameters (measured 8e-7), and against the unrounded ones within
 * DT_MH_TOL_F16 = 6.25e-3 (fp16 keeps 11 significant bits, its rounding
 * 8x smaller than bf16's): measured worst 2.35e-3 (ln_2.weight), loss
 * 5.6e-5; bounds 6.25e-3 and 2.5e-3 absolute.  And loss scaling is
 * exact: the gradients at loss scale 2^16 are the unscaled ones x 2^16,
 * bit for bit.
 */

/* two micro-batches of B sequences: inputs/targets (2, B, T) */
static int32_t inputs[2 * B * T], targets[2 * B * T];

static const char *toml_fmt = "[model]\n"
                              "arch = \"gpt2\"\n"
                              "n_layer = %d\n"
                              "n_head = %d\n"
                              "n_embd = %d\n"
                              "vocab_size = %d\n"
                              "context = %d\n"
                              "dtype = \"%s\"\n"
                              "activation_checkpointing = \"%s\"\n"
                              "checkpoint_every = 2\n";

static void open_shape(dt_mh_t *h, int l, int nh, int c, int v, int maxt, int b, int t,
                       const char *dtype, const char *ckpt)
{
    char toml[512];
    snprintf(toml, sizeof toml, toml_fmt, l, nh, c, v, maxt, dtype, ckpt);
    int rc = dt_mh_open(h, toml, b, t, SEED);
    if (rc != DT_OK)
        fail_msg("opening the model (%s, %s): %s", dtype, ckpt, dt_last_error());
}

static void open_model(dt_mh_t *h, const char *dtype, const char *ckpt)
{
    open_shape(h, L, NH, C, V, MAXT, B, T, dtype, ckpt);
}

static void run_ref(const dt_mh_t *h, const char *tok, const char *out, const char *params,
                    int l, int nh)
{
    char args[64];
    snprintf(args, sizeof args, "--n-layer %d --n-head %d", l, nh);
    dt_mh_ref(h, "gpt2_ref.py", params, tok, out, args);
}

/* The oracle's files (model_harness.h): params, tokens, its outputs. */
static dt_mh_oracle_t orc = {.script = "gpt2_ref.py", .open = open_model, .inputs = inputs,
                             .targets = targets};

static int group_setup(void **state)
{
    (void)state;
    static char args[64];
    snprintf(args, sizeof args, "--n-layer %d --n-head %d", L, NH);
    orc.args = args;
    /* tokens: seeded, with repeats inside and across sequences so the
     * embedding backward accumulates rows */
    dt_mh_tokens(99, V, 2 * B * T, inputs, targets);
    inputs[7] = inputs[2];
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

/* fp32: none, all, every 2 all match the oracle, and recomputation gives
 * bit-identical gradients (same kernels, same inputs, same threads). */
static void test_fp32_checkpointing(void **state)
{
    (void)state;
    dt_mh_check_checkpointing(&orc, "gpt2");
}

/* Two micro-batches with loss_scale 1/2 accumulate the gradient of the
 * mean over both: the oracle's on the 2B sequences at once. */
static void test_fp32_accumulation(void **state)
{
    (void)state;
    dt_mh_check_accumulation(&orc, "every", "gpt2");
}

/* The shape of the gpt2-tiny preset at full context (C = 128, V = 256,
 * T = 64, micro-batch 4): products big enough that the cpu plugin splits
 * them over its threads and blocks its bf16 widening, as in real runs
 * (the small model above fits one slice per product). */
static void test_fp32_tiny_preset_shape(void **state)
{
    (void)state;
    dt_mh_need_python(&orc);
    enum { L2 = 2, NH2 = 4, C2 = 128, V2 = 256, T2 = 64, B2 = 4 };
    char pp[600], tp[600], rp[600];
    snprintf(pp, sizeof pp, "%s/tiny_params.safetensors", orc.dir);
    snprintf(tp, sizeof tp, "%s/tiny_tokens.bin", orc.dir);
    snprintf(rp, sizeof rp, "%s/tiny_ref.safetensors", orc.dir);
    static int32_t in[B2 * T2], tg[B2 * T2];
    uint64_t st = 7;
    for (int i = 0; i < B2 * T2; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        in[i] = (int32_t)((st >> 33) % V2);
        tg[i] = (int32_t)((st >> 17) % V2);
    }
    dt_mh_t h;
    open_shape(&h, L2, NH2, C2, V2, T2, B2, T2, "fp32", "none");
    assert_ok(dt_mh_write_params(&h, pp, DT_F32));
    assert_ok(dt_mh_write_tokens(tp, B2, T2, in, tg));
    run_ref(&h, tp, rp, pp, L2, NH2);
    double loss = dt_mh_step(&h, in, tg, 1, 0);
    float *logits = dt_mh_logits(&h);
    assert_non_null(logits);
    dt_mh_stats_t s;
    memset(&s, 0, sizeof s);
    dt_mh_compare(&h, rp, loss, logits, DT_MH_LOSS_ATOL_F32, DT_MH_TOL_F32, &s);
    dt_mh_print_stats("fp32 gpt2-tiny shape", &s);
    free(logits);
    dt_mh_close(&h);
}

/* An evaluation pass: the oracle's loss and logits, no backward hook (the
 * strategy fails any in a NO_GRAD pass) and untouched gradients. */
static void test_eval_pass(void **state)
{
    (void)state;
    dt_mh_need_python(&orc);
    dt_mh_t h;
    open_model(&h, "fp32", "all");
    double loss = dt_mh_step(&h, inputs, targets, 1, 1);
    float *logits = dt_mh_logits(&h);
    assert_non_null(logits);
    /* no gradient was written */
    uint64_t n;
    float *g = dt_mh_all_grads(&h, &n);
    for (uint64_t i = 0; i < n; i++)
        if (g[i] != 0.0f)
            fail_msg("gradient element %llu is %g after a no-grad pass", (unsigned long long)i,
                     (double)g[i]);
    free(g);
    /* then the oracle's loss and logits (and, from a training pass on the
     * same batch, its gradients) */
    double loss2 = dt_mh_step(&h, inputs, targets, 1, 0);
    assert_true(loss2 == loss); /* same forward, same bits */
    dt_mh_compare(&h, orc.ref, loss, logits, DT_MH_LOSS_ATOL_F32, DT_MH_TOL_F32, NULL);
    free(logits);
    dt_mh_close(&h);
}

/* bf16 compute parameters: exact against the oracle on the bf16-rounded
 * parameters, within bf16 precision against the f32 oracle. */
static void test_bf16(void **state)
{
    (void)state;
    dt_mh_check_half(&orc, "bf16", "gpt2");
}

/* fp16 compute parameters: as bf16, at fp16's precision; and loss
 * scaling is exact. */
static void test_fp16(void **state)
{
    (void)state;
    dt_mh_check_half(&orc, "fp16", "gpt2");
}

/* Tokens outside the vocabulary are refused before any kernel runs. */
static void test_token_range(void **state)
{
    (void)state;
    dt_mh_t h;
    open_model(&h, "fp32", "none");
    int32_t bad[B * T];
    memcpy(bad, inputs, sizeof bad);
    bad[T + 5] = V;
    double loss;
    assert_ok(dt_mh_begin_step(&h, 1));
    assert_status(dt_model_step_micro(h.model, &h.ctx, bad, targets, 0, 1, 0, 1.0f, &loss),
                  DT_ERR_INVALID);
    assert_msg("model: input token 83 at sequence 1, position 5 is outside the vocabulary "
               "[0, 83)");
    bad[T + 5] = -2;
    assert_status(dt_model_step_micro(h.model, &h.ctx, inputs, bad, 0, 1, 0, 1.0f, &loss),
                  DT_ERR_INVALID);
    assert_msg("model: target token -2 at sequence 1, position 5 is outside the vocabulary "
               "[0, 83)");
    dt_mh_close(&h);
}

/* The description: units, names, NO_DECAY flags, sizes, info keys. */
static void test_description(void **state)
{
    (void)state;
    dt_mh_t h;
    open_model(&h, "fp32", "none");
    const dt_model_desc_v1_t *d = h.desc;
    assert_string_equal(d->arch, "gpt2");
    assert_int_equal(d->n_units, L + 2);
    assert_string_equal(d->units[0].name, "embedding");
    assert_string_equal(d->units[2].name, "block.1");
    assert_string_equal(d->units[L + 1].name, "head");
    assert_string_equal(d->units[1].params[2].name, "h.0.attn.c_attn.weight");
    assert_int_equal(d->units[1].params[2].shape[0], 3 * C);
    assert_int_equal(d->units[1].params[2].shape[1], C);
    for (uint32_t u = 0; u < d->n_units; u++)
        for (uint32_t k = 0; k < d->units[u].n_params; k++) {
            const dt_param_desc_v1_t *p = &d->units[u].params[k];
            int nd = p->ndim == 1; /* biases and norms, and only they */
            assert_int_equal((p->flags & DT_PARAM_NO_DECAY) != 0, nd);
        }
    /* wte, wpe, per block ln_1, c_attn, attn.c_proj, ln_2, c_fc,
     * mlp.c_proj with their biases, ln_f */
    const uint64_t block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C +
                           4 * C * C + C;
    assert_int_equal(d->numel, (uint64_t)V * C + (uint64_t)MAXT * C + L * block + 2 * C);
    const dt_model_info_t *mi = dt_model_info(h.model);
    assert_string_equal(mi->arch, "gpt2");
    assert_int_equal(mi->vocab_size, V);
    assert_int_equal(mi->context, MAXT);
    assert_int_equal(mi->n_keys, 5);
    assert_string_equal(mi->keys[0].key, "n_layer");
    assert_int_equal(mi->keys[0].value, L);
    assert_string_equal(mi->keys[4].key, "context");
    assert_int_equal(mi->keys[4].value, MAXT);
    assert_true(dt_hf_model_has(dt_model_ops(h.model))); /* reads HF's GPT2LMHeadModel */
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
        fprintf(stderr, "usage: test_gpt2_oracle [cpu|cuda]\n");
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_description),
        cmocka_unit_test(test_token_range),
        cmocka_unit_test(test_fp32_checkpointing),
        cmocka_unit_test(test_fp32_accumulation),
        cmocka_unit_test(test_fp32_tiny_preset_shape),
        cmocka_unit_test(test_eval_pass),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_fp16),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
