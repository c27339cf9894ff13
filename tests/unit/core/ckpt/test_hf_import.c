/*
 * tests/unit/core/ckpt/test_hf_import.c - `dtrain import`'s library side
 * (core/ckpt/ckpt_tools.h dt_ckpt_import, core/ckpt/hf_model.h with the
 * gpt2 plugin's hf_* slots, plugins/gpt2/gpt2_hf.c, the safetensors
 * reader): Hugging Face GPT-2 weights written by the float64
 * reference (tests/reference/gpt2_ref.py --write-hf-to: Conv1D weights
 * transposed, attn.bias / attn.masked_bias buffers, the tied head not
 * stored, its own config.json) become a checkpoint whose weights are the
 * reference's bit for bit and give the reference's loss, logits and
 * gradients in dtrain's GPT-2; files that do not fit are refused naming
 * the tensor, leaving no checkpoint behind.
 *
 * The model is test_gpt2_oracle.c's (L=3, H=4, C=48, V=83, maxT=20; B=2,
 * T=16), its parameters perturbed by tests/support/model_harness.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "ckpt/ckpt.h"
#include "ckpt/ckpt_io.h"
#include "ckpt/ckpt_tools.h"
#include "ckpt/hf_model.h"
#include "ckpt/safetensors.h"
#include "dtrain/dtrain.h"
#include "dtrain/half.h"
#include "model_harness.h"
#include "test_assert.h"
#include "util/error.h"
#include "util/fileutil.h"

enum { L = 3, NH = 4, C = 48, V = 83, MAXT = 20, B = 2, T = 16 };

static const char *toml = "[model]\n"
                          "arch = \"gpt2\"\n"
                          "n_layer = 3\n"
                          "n_head = 4\n"
                          "n_embd = 48\n"
                          "vocab_size = 83\n"
                          "context = 20\n";

static struct {
    int have_python;
    const char *why;
    char dir[512], params[600], tok[600], ref[600], hf[600], cfg[600];
    int32_t in[B * T], tg[B * T];
} g;

static void open_model(dt_mh_t *h)
{
    if (dt_mh_open(h, toml, B, T, 4242) != DT_OK)
        fail_msg("opening the model: %s", dt_last_error());
}

static int group_setup(void **state)
{
    (void)state;
    g.have_python = dt_mh_python_ok(&g.why);
    if (!g.have_python)
        return 0;
    dt_mh_tmpdir(g.dir, sizeof g.dir);
    snprintf(g.params, sizeof g.params, "%s/params.safetensors", g.dir);
    snprintf(g.tok, sizeof g.tok, "%s/tokens.bin", g.dir);
    snprintf(g.ref, sizeof g.ref, "%s/ref.safetensors", g.dir);
    snprintf(g.hf, sizeof g.hf, "%s/hf/model.safetensors", g.dir);
    snprintf(g.cfg, sizeof g.cfg, "%s/hf/config.json", g.dir);
    dt_mh_tokens(31, V, B * T, g.in, g.tg);
    dt_mh_t h;
    open_model(&h);
    if (dt_mh_write_params(&h, g.params, 0) != DT_OK ||
        dt_mh_write_tokens(g.tok, B, T, g.in, g.tg) != DT_OK)
        fail_msg("writing the reference's inputs: %s", dt_last_error());
    char args[600];
    snprintf(args, sizeof args, "--n-layer %d --n-head %d --write-hf-to %s/hf", L, NH, g.dir);
    dt_mh_ref(&h, "gpt2_ref.py", g.params, g.tok, g.ref, args);
    dt_mh_close(&h);
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    if (g.have_python)
        dt_fileutil_rm_rf(g.dir);
    return 0;
}

static void need_python(void)
{
    if (!g.have_python) {
        printf("SKIP: the float64 reference needs numpy: %s\n", g.why);
        skip();
    }
}

/* config.json `path` as [model] assignments, read by the gpt2 plugin. */
static int config_sets(const char *path, char (*sets)[96], int *n)
{
    dt_mh_t h;
    open_model(&h);
    int rc = dt_hf_model_sets(dt_model_ops(h.model), path, sets, 8, n);
    dt_mh_close(&h);
    return rc;
}

/* The assignment of `key` among sets[n] ("" when absent). */
static const char *set_of(char (*sets)[96], int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (strncmp(sets[i], key, strlen(key)) == 0 && sets[i][strlen(key)] == '=')
            return sets[i];
    return "";
}

/* The reference's config.json gives this model's shape. */
static void test_config_from_reference(void **state)
{
    (void)state;
    need_python();
    char sets[8][96], want[6][96];
    int n = 0;
    assert_ok(config_sets(g.cfg, sets, &n));
    assert_int_equal(n, 6);
    snprintf(want[0], 96, "model.arch=gpt2");
    snprintf(want[1], 96, "model.n_layer=%d", L);
    snprintf(want[2], 96, "model.n_head=%d", NH);
    snprintf(want[3], 96, "model.n_embd=%d", C);
    snprintf(want[4], 96, "model.vocab_size=%d", V);
    snprintf(want[5], 96, "model.context=%d", MAXT);
    for (int i = 0; i < 6; i++)
        assert_string_equal(sets[i], want[i]);
}

/* Read every unit's params of checkpoint root/step-00000000 into the
 * harness's masters; checks the moments are zero. */
static void load_import(dt_mh_t *h, const char *root)
{
    char dir[700];
    snprintf(dir, sizeof dir, "%s/step-00000000", root);
    dt_ckpt_reader_t *rd = NULL;
    assert_ok(dt_ckpt_open(dir, &rd));
    assert_int_equal(dt_ckpt_reader_step(rd), 0);
    assert_ok(dt_ckpt_check_tensors(dir, rd, h->desc));
    for (uint32_t u = 0; u < h->desc->n_units; u++) {
        const dt_unit_desc_t *ud = &h->desc->units[u];
        assert_ok(dt_ckpt_read_unit_params(rd, dir, h->desc, u, dt_mh_master(h, u)));
        float *m = malloc(ud->numel * sizeof *m);
        assert_non_null(m);
        for (int k = 0; k < 2; k++) {
            char e[160];
            snprintf(e, sizeof e, "%s/%s", ud->name, k ? "exp_avg_sq" : "exp_avg");
            assert_ok(dt_ckpt_read(rd, e, 0, ud->numel, m));
            for (uint64_t i = 0; i < ud->numel; i++)
                assert_true(m[i] == 0.0f);
        }
        free(m);
    }
    dt_ckpt_close(rd);
    assert_ok(dt_mh_sync_params(h));
}

/* Copies of the harness's masters, then the masters scrambled. */
static float **take_masters(dt_mh_t *h)
{
    float **o = calloc(h->desc->n_units, sizeof *o);
    assert_non_null(o);
    for (uint32_t u = 0; u < h->desc->n_units; u++) {
        const uint64_t n = h->desc->units[u].numel;
        o[u] = malloc(n * sizeof **o);
        assert_non_null(o[u]);
        memcpy(o[u], dt_mh_master(h, u), n * sizeof **o);
        for (uint64_t i = 0; i < n; i++)
            dt_mh_master(h, u)[i] = -7.0f;
    }
    return o;
}

static void free_masters(dt_mh_t *h, float **o)
{
    for (uint32_t u = 0; u < h->desc->n_units; u++)
        free(o[u]);
    free(o);
}

/*
 * The import holds the reference's weights bit for bit (F32 in, f32 out,
 * only transposed), and dtrain's forward and backward on them give the
 * reference's loss, logits and every gradient within the f32 tolerances
 * of tests/support/model_harness.h (DT_MH_TOL_F32 2e-5 relative,
 * DT_MH_LOSS_ATOL_F32 1e-5; test_gpt2_oracle.c says why they hold).
 */
static void test_import_matches_reference(void **state)
{
    (void)state;
    need_python();
    dt_mh_t h;
    open_model(&h);
    char root[600];
    snprintf(root, sizeof root, "%s/imported", g.dir);
    if (dt_ckpt_import(g.hf, h.model, root, 0) != DT_OK)
        fail_msg("dt_ckpt_import: %s", dt_last_error());
    float **orig = take_masters(&h);
    load_import(&h, root);
    for (uint32_t u = 0; u < h.desc->n_units; u++)
        assert_memory_equal(orig[u], dt_mh_master(&h, u), h.desc->units[u].numel * 4);
    double loss = dt_mh_step(&h, g.in, g.tg, 1, 0);
    float *logits = dt_mh_logits(&h);
    assert_non_null(logits);
    dt_mh_stats_t st;
    memset(&st, 0, sizeof st);
    dt_mh_compare(&h, g.ref, loss, logits, DT_MH_LOSS_ATOL_F32, DT_MH_TOL_F32, &st);
    dt_mh_print_stats("imported HF weights vs reference", &st);
    free(logits);
    free_masters(&h, orig);
    dt_mh_close(&h);
}

/* Variants of the reference's file, as other savers write them or as
 * they go wrong. */
enum {
    V_PREFIX_BF16, /* "transformer." names, BF16, lm_head.weight = wte: fine */
    V_DROP,        /* h.2.mlp.c_fc.bias missing */
    V_I32,         /* ln_f.bias declared I32 */
    V_EXTRA,       /* an h.3 tensor for a 3-layer config */
    V_UNTIED,      /* lm_head.weight differs from wte in one element */
    V_TWICE        /* wpe.weight and transformer.wpe.weight */
};

static void write_variant(const char *dst, int v)
{
    dt_safetensors_reader_t *r = NULL;
    assert_ok(dt_safetensors_open(g.hf, &r));
    dt_safetensors_writer_t *w = NULL;
    assert_ok(dt_safetensors_writer_open(dst, &w));
    const size_t n = dt_safetensors_count(r);
    /* declarations: the file's, changed; then lm_head / twice */
    for (size_t i = 0; i < n; i++) {
        const dt_safetensors_tensor_t *t = dt_safetensors_at(r, i);
        char name[200];
        snprintf(name, sizeof name, "%s%s", v == V_PREFIX_BF16 ? "transformer." : "", t->name);
        if (v == V_DROP && strcmp(t->name, "h.2.mlp.c_fc.bias") == 0)
            continue;
        int dt = v == V_PREFIX_BF16 ? DT_BF16 : v == V_I32 && !strcmp(t->name, "ln_f.bias") ? DT_I32 : DT_F32;
        assert_ok(dt_safetensors_declare(w, name, dt, t->ndim, t->shape));
    }
    const dt_safetensors_tensor_t *wte = dt_safetensors_find(r, "wte.weight");
    const dt_safetensors_tensor_t *wpe = dt_safetensors_find(r, "wpe.weight");
    const dt_safetensors_tensor_t *ln = dt_safetensors_find(r, "h.0.ln_1.weight");
    if (v == V_PREFIX_BF16)
        assert_ok(dt_safetensors_declare(w, "lm_head.weight", DT_BF16, 2, wte->shape));
    if (v == V_UNTIED)
        assert_ok(dt_safetensors_declare(w, "lm_head.weight", DT_F32, 2, wte->shape));
    if (v == V_EXTRA)
        assert_ok(dt_safetensors_declare(w, "h.3.ln_1.weight", DT_F32, 1, ln->shape));
    if (v == V_TWICE)
        assert_ok(dt_safetensors_declare(w, "transformer.wpe.weight", DT_F32, 2, wpe->shape));
    /* data */
    float *buf = malloc(1u << 20); /* more than the largest tensor, 4C x C f32 */
    uint16_t *half = malloc(1u << 19);
    assert_non_null(buf);
    assert_non_null(half);
    const dt_safetensors_tensor_t *extra[2] = {NULL, NULL};
    if (v == V_PREFIX_BF16 || v == V_UNTIED)
        extra[0] = wte;
    if (v == V_EXTRA)
        extra[0] = ln;
    if (v == V_TWICE)
        extra[0] = wpe;
    for (size_t i = 0; i <= n; i++) {
        const dt_safetensors_tensor_t *t = i < n ? dt_safetensors_at(r, i) : extra[0];
        if (!t || (i < n && v == V_DROP && strcmp(t->name, "h.2.mlp.c_fc.bias") == 0))
            continue;
        assert_ok(dt_safetensors_read(r, t, 0, t->nbytes, buf));
        if (i == n && v == V_UNTIED)
            buf[17] += 1.0f;
        if (v == V_PREFIX_BF16) {
            for (uint64_t k = 0; k < t->numel; k++)
                half[k] = dt_f32_to_bf16(buf[k]);
            assert_ok(dt_safetensors_write(w, half, t->numel * 2));
        } else {
            assert_ok(dt_safetensors_write(w, buf, t->nbytes));
        }
    }
    free(buf);
    free(half);
    assert_ok(dt_safetensors_commit(w));
    dt_safetensors_close(r);
}

/* Names prefixed "transformer.", BF16 values and a stored tied head
 * (what a GPT2LMHeadModel's state dict saved in bf16 holds): imported as
 * the bf16 values widened exactly. */
static void test_import_prefix_bf16_tied_head(void **state)
{
    (void)state;
    need_python();
    char path[700], root[700];
    snprintf(path, sizeof path, "%s/bf16.safetensors", g.dir);
    snprintf(root, sizeof root, "%s/bf16-import", g.dir);
    write_variant(path, V_PREFIX_BF16);
    dt_mh_t h;
    open_model(&h);
    if (dt_ckpt_import(path, h.model, root, 0) != DT_OK)
        fail_msg("dt_ckpt_import: %s", dt_last_error());
    float **orig = take_masters(&h);
    load_import(&h, root);
    for (uint32_t u = 0; u < h.desc->n_units; u++)
        for (uint64_t i = 0; i < h.desc->units[u].numel; i++)
            assert_true(dt_mh_master(&h, u)[i] == dt_bf16_to_f32(dt_f32_to_bf16(orig[u][i])));
    free_masters(&h, orig);
    dt_mh_close(&h);
}

/* Each wrong file: DT_ERR_DATA naming the file and the tensor, and no
 * checkpoint (nor a temporary one) left behind. */
static void test_import_refuses(void **state)
{
    (void)state;
    need_python();
    static const struct {
        int v;
        const char *msg; /* after "importing '<file>' into '<root>': '<file>'" */
    } cases[] = {
        {V_DROP, " has no tensor h.2.mlp.c_fc.bias"},
        {V_I32, ": tensor ln_f.bias is I32; import takes F32, BF16 or F16"},
        {V_EXTRA, ": tensor h.3.ln_1.weight is not a parameter of this gpt2 (from its "
                  "config.json: is it the one of these weights?)"},
        {V_UNTIED, ": tensor lm_head.weight differs from wte.weight: this gpt2 ties the two "
                   "(its config.json), so different ones cannot be imported"},
        {V_TWICE, ": tensor wpe.weight is given twice (as wpe.weight and "
                  "transformer.wpe.weight)"},
    };
    dt_mh_t h;
    open_model(&h);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char path[700], root[700], want[2200], step[800];
        snprintf(path, sizeof path, "%s/bad%zu.safetensors", g.dir, c);
        snprintf(root, sizeof root, "%s/bad%zu", g.dir, c);
        write_variant(path, cases[c].v);
        assert_status(dt_ckpt_import(path, h.model, root, 0), DT_ERR_DATA);
        snprintf(want, sizeof want, "importing '%s' into '%s': '%s'%s", path, root, path,
                 cases[c].msg);
        assert_msg(want);
        struct stat sb;
        snprintf(step, sizeof step, "%s/step-00000000", root);
        assert_int_not_equal(stat(step, &sb), 0);
        snprintf(step, sizeof step, "%s/step-00000000.tmp", root);
        assert_int_not_equal(stat(step, &sb), 0);
    }
    dt_mh_close(&h);
}

/* config.json: every setting dtrain's GPT-2 cannot compute is refused by
 * key, naming the value and what dtrain computes; the settings it does
 * compute (and those that do not change the function) are accepted. */
static void test_config_refuses(void **state)
{
    (void)state;
    char dir[512], path[600];
    dt_mh_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    static const char shape[] = "\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 8, "
                                "\"vocab_size\": 11";
    static const struct {
        const char *rest, *msg; /* after "'<path>'" */
    } cases[] = {
        {", \"n_positions\": 6}", NULL},
        {", \"n_ctx\": 6, \"activation_function\": \"gelu_pytorch_tanh\"}", NULL},
        /* what transformers' GPT-2 computes as dtrain does: accepted */
        {", \"n_positions\": 6, \"n_inner\": 32, \"scale_attn_weights\": true, "
         "\"scale_attn_by_inverse_layer_idx\": false, \"add_cross_attention\": false, "
         "\"tie_word_embeddings\": true, \"reorder_and_upcast_attn\": true, "
         "\"resid_pdrop\": 0.1, \"layer_norm_epsilon\": 1e-5, \"model_type\": \"gpt2\"}", NULL},
        {"}", " has no \"n_positions\": is it a GPT-2 config.json?"},
        {", \"n_positions\": 6, \"model_type\": \"llama\"}",
         ": \"model_type\" is \"llama\"; dtrain imports \"gpt2\" only"},
        {", \"n_positions\": 6, \"activation_function\": \"relu\"}",
         ": \"activation_function\" is \"relu\"; dtrain's GPT-2 computes \"gelu_new\" (GELU's "
         "tanh approximation)"},
        {", \"n_positions\": 6, \"activation_function\": 3}",
         ": \"activation_function\" is 3; dtrain's GPT-2 computes \"gelu_new\" (GELU's "
         "tanh approximation)"},
        {", \"n_positions\": 6, \"activation_function\": \"gelu_new_but_with_a_very_long_name_"
         "that_goes_on_and_on_and_on_and_on_and_on_and_on_and_on\"}",
         ": \"activation_function\" is \"gelu_new_but_with_a_very_long_name_that_goes_on_and_"
         "on_and_...; dtrain's GPT-2 computes \"gelu_new\" (GELU's tanh approximation)"},
        {", \"n_positions\": 6, \"layer_norm_epsilon\": 1e-6}",
         ": \"layer_norm_epsilon\" is 1e-06; dtrain's GPT-2 computes its layernorms with "
         "epsilon 1e-5"},
        {", \"n_positions\": 6, \"n_inner\": 20}",
         ": \"n_inner\" is 20; dtrain's GPT-2 computes an MLP 4 n_embd wide (n_inner null)"},
        {", \"n_positions\": 6, \"scale_attn_weights\": false}",
         ": \"scale_attn_weights\" is false; dtrain's GPT-2 scales attention scores by "
         "1/sqrt(head size) (scale_attn_weights true)"},
        {", \"n_positions\": 6, \"scale_attn_by_inverse_layer_idx\": true}",
         ": \"scale_attn_by_inverse_layer_idx\" is true; dtrain's GPT-2 scales attention "
         "scores by 1/sqrt(head size) only, not by 1/(layer index + 1)"},
        {", \"n_positions\": 6, \"add_cross_attention\": true}",
         ": \"add_cross_attention\" is true; dtrain's GPT-2 is decoder-only, without "
         "cross-attention"},
        {", \"n_positions\": 6, \"tie_word_embeddings\": false}",
         ": \"tie_word_embeddings\" is false; dtrain's GPT-2 ties the LM head to the token "
         "embedding wte (tie_word_embeddings true)"},
        {", \"n_positions\": 6.5}", ": \"n_positions\" is not a positive integer"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char text[1024], want[1024];
        snprintf(text, sizeof text, "{%s%s", shape, cases[c].rest);
        assert_ok(dt_fileutil_write_atomic(path, text, strlen(text)));
        char sets[8][96];
        int n = 0;
        if (!cases[c].msg) {
            assert_ok(config_sets(path, sets, &n));
            assert_string_equal(set_of(sets, n, "model.context"), "model.context=6");
            assert_string_equal(set_of(sets, n, "model.vocab_size"), "model.vocab_size=11");
            continue;
        }
        assert_status(config_sets(path, sets, &n), DT_ERR_CONFIG);
        snprintf(want, sizeof want, "'%s'%s", path, cases[c].msg);
        assert_msg(want);
    }
    dt_fileutil_rm_rf(dir);
}

/* bos_token_id / eos_token_id in the config.json export writes: GPT-2's
 * <|endoftext|> (50256) where the vocabulary holds it (GPT-2's 50257,
 * llm.c's padded 50304), null elsewhere (a byte-level 256 has no special
 * token; another vocabulary's is unknown), never absent, since
 * transformers would then assume 50256.  The file reads back as it was
 * written. */
static void test_config_special_tokens(void **state)
{
    (void)state;
    static const struct {
        int64_t vocab;
        int id; /* -1: null */
    } cases[] = {{256, -1}, {83, -1}, {50256, -1}, {50257, 50256}, {50304, 50256}};
    char dir[512], path[600];
    dt_mh_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/config.json", dir);
    dt_mh_t h;
    open_model(&h);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cJSON *model = cJSON_CreateObject(); /* a checkpoint manifest's "model" */
        assert_non_null(model);
        cJSON_AddStringToObject(model, "arch", "gpt2");
        cJSON_AddNumberToObject(model, "n_layer", 2);
        cJSON_AddNumberToObject(model, "n_head", 2);
        cJSON_AddNumberToObject(model, "n_embd", 8);
        cJSON_AddNumberToObject(model, "vocab_size", (double)cases[c].vocab);
        cJSON_AddNumberToObject(model, "context", 6);
        size_t len = 0;
        char *text = NULL;
        assert_ok(dt_hf_model_config_text(dt_model_ops(h.model), model, 0, dir, &text, &len));
        cJSON_Delete(model);
        assert_non_null(text);
        assert_int_equal(len, strlen(text));
        assert_int_equal(text[len - 1], '\n');
        cJSON *j = cJSON_Parse(text);
        assert_non_null(j);
        static const char *const keys[] = {"bos_token_id", "eos_token_id"};
        for (int k = 0; k < 2; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[k]);
            assert_non_null(v);
            if (cases[c].id < 0)
                assert_true(cJSON_IsNull(v));
            else
                assert_true(cJSON_IsNumber(v) && v->valuedouble == cases[c].id);
        }
        cJSON_Delete(j);
        assert_ok(dt_fileutil_write_atomic(path, text, len));
        char sets[8][96], want[96];
        int n = 0;
        assert_ok(dt_hf_model_sets(dt_model_ops(h.model), path, sets, 8, &n));
        snprintf(want, sizeof want, "model.vocab_size=%lld", (long long)cases[c].vocab);
        assert_string_equal(set_of(sets, n, "model.vocab_size"), want);
        free(text);
    }
    dt_mh_close(&h);
    dt_fileutil_rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_refuses),
        cmocka_unit_test(test_config_special_tokens),
        cmocka_unit_test(test_config_from_reference),
        cmocka_unit_test(test_import_matches_reference),
        cmocka_unit_test(test_import_prefix_bf16_tied_head),
        cmocka_unit_test(test_import_refuses),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
