/*
 * plugins/gpt2/gpt2_hf.c - Hugging Face's GPT-2 (transformers'
 * GPT2LMHeadModel) as files, the model table's hf_* slots
 * (dtrain/model.h) for `dtrain import` and `dtrain export`:
 *
 *  - tensor names: dtrain's GPT-2 names are HF's ("h.3.attn.c_attn.weight",
 *    "wte.weight"); a GPT2LMHeadModel's state dict may prefix them
 *    "transformer."; its "lm_head.weight" is tied to wte (save_pretrained
 *    drops it); each block's "attn.bias" (the causal mask) and, in older
 *    versions, "attn.masked_bias" are buffers, not parameters;
 *  - layout: the four projections are Conv1D, weight (in, out), the
 *    transpose of dtrain's (out, in);
 *  - config.json: n_layer, n_head, n_embd, vocab_size, n_positions (and the
 *    older n_ctx); every key that changes what the model computes must
 *    hold what dtrain's GPT-2 computes (the rules below).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/model/hf_json.h"
#include "gpt2_internal.h"

/* GPT-2's <|endoftext|>, its one special token: bos and eos alike. */
#define GPT2_EOT 50256

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int conv1d(const char *name)
{
    static const char *const sfx[] = {".attn.c_attn.weight", ".attn.c_proj.weight",
                                      ".mlp.c_fc.weight", ".mlp.c_proj.weight"};
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++)
        if (ends_with(name, sfx[i]))
            return 1;
    return 0;
}

const char *const *gpt2_hf_architectures(void)
{
    static const char *const a[] = {"GPT2LMHeadModel", "gpt2", NULL};
    return a;
}

void gpt2_hf_export_name(const char *name, char *hf, size_t cap, int *transpose)
{
    snprintf(hf, cap, "%s", name);
    *transpose = conv1d(name);
}

int gpt2_hf_import_name(const dt_model_key_t *keys, uint32_t n, const char *hf, char *name,
                        size_t cap)
{
    (void)keys;
    (void)n;
    static const char prefix[] = "transformer.";
    if (strncmp(hf, prefix, sizeof prefix - 1) == 0)
        hf += sizeof prefix - 1;
    if (strcmp(hf, "lm_head.weight") == 0) {
        snprintf(name, cap, "wte.weight");
        return DT_HF_TIED;
    }
    if (strncmp(hf, "h.", 2) == 0 &&
        (ends_with(hf, ".attn.bias") || ends_with(hf, ".attn.masked_bias")))
        return DT_HF_BUFFER;
    snprintf(name, cap, "%s", hf);
    return DT_HF_PARAM;
}

size_t gpt2_hf_config_write(const dt_model_key_t *keys, uint32_t n, char *buf,
                            size_t cap, char *err, size_t err_cap)
{
    static const char *const need[] = {"n_layer", "n_head", "n_embd", "vocab_size", "context"};
    for (int i = 0; i < 5; i++)
        if (!(hfj_num(keys, n, need[i], 0) >= 1)) {
            snprintf(err, err_cap, "the model has no positive \"%s\"", need[i]);
            return 0;
        }
    const double vocab = hfj_num(keys, n, "vocab_size", 0), ctx = hfj_num(keys, n, "context", 0);
    cJSON *j = cJSON_CreateObject(), *arch = cJSON_CreateArray();
    if (!j || !arch) {
        cJSON_Delete(j);
        cJSON_Delete(arch);
        return hfj_finish(NULL, buf, cap, err, err_cap);
    }
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddItemToObject(j, "architectures", arch);
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    for (int i = 0; i < 4; i++)
        cJSON_AddNumberToObject(j, need[i], hfj_num(keys, n, need[i], 0));
    cJSON_AddNumberToObject(j, "n_positions", ctx);
    cJSON_AddNumberToObject(j, "n_ctx", ctx);
    cJSON_AddNullToObject(j, "n_inner"); /* 4 n_embd */
    cJSON_AddStringToObject(j, "activation_function", "gelu_new");
    cJSON_AddNumberToObject(j, "layer_norm_epsilon", 1e-5);
    /* dtrain trains without dropout; HF's defaults are 0.1 */
    cJSON_AddNumberToObject(j, "resid_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "embd_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "attn_pdrop", 0.0);
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddBoolToObject(j, "scale_attn_weights", 1);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 1);
    /* absent, GPT2Config assumes 50256 whatever the vocabulary: stated
     * either way, GPT-2's <|endoftext|> where the vocabulary holds it
     * (50257, llm.c's padded 50304), else null (a byte-level 256 has no
     * special token; another vocabulary's are unknown) */
    if (vocab > GPT2_EOT) {
        cJSON_AddNumberToObject(j, "bos_token_id", GPT2_EOT);
        cJSON_AddNumberToObject(j, "eos_token_id", GPT2_EOT);
    } else {
        cJSON_AddNullToObject(j, "bos_token_id");
        cJSON_AddNullToObject(j, "eos_token_id");
    }
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return hfj_finish(j, buf, cap, err, err_cap);
}

/* ---- the settings dtrain's GPT-2 computes -----------------------------
 * GPT2Config's keys that change what the model computes, each with the one
 * value (or the equivalent values) dtrain's GPT-2 (gpt2.c and the device's
 * kernels) computes; a key absent takes transformers' default, which is
 * that value.  Keys that do not change the function are ignored:
 * reorder_and_upcast_attn (the same scaled scores, computed in f32 in
 * another order: transformers' remedy for f16 overflow), the dropouts
 * resid_pdrop, embd_pdrop and attn_pdrop (dtrain trains without dropout;
 * inference is the same), summary_* (heads of other model classes),
 * use_cache, bos/eos ids, torch_dtype (the tensors carry theirs). */

static int is_gpt2(const cJSON *v, double n_embd)
{
    (void)n_embd;
    return cJSON_IsString(v) && strcmp(v->valuestring, "gpt2") == 0;
}

static int is_tanh_gelu(const cJSON *v, double n_embd)
{
    (void)n_embd; /* gelu_pytorch_tanh: the same function, torch's kernel */
    return cJSON_IsString(v) && (strcmp(v->valuestring, "gelu_new") == 0 ||
                                 strcmp(v->valuestring, "gelu_pytorch_tanh") == 0);
}

static int is_ln_eps(const cJSON *v, double n_embd)
{
    (void)n_embd;
    return cJSON_IsNumber(v) && fabs(v->valuedouble - 1e-5) <= 1e-12;
}

static int is_4_embd(const cJSON *v, double n_embd)
{
    return cJSON_IsNull(v) || (cJSON_IsNumber(v) && v->valuedouble == 4.0 * n_embd);
}

static int is_true(const cJSON *v, double n_embd)
{
    (void)n_embd;
    return cJSON_IsTrue(v);
}

static int is_false(const cJSON *v, double n_embd)
{
    (void)n_embd;
    return cJSON_IsFalse(v);
}

static const struct {
    const char *key;
    int (*ok)(const cJSON *v, double n_embd);
    const char *computes; /* what dtrain computes instead */
} rules[] = {
    {"model_type", is_gpt2, "dtrain imports \"gpt2\" only"},
    {"activation_function", is_tanh_gelu,
     "dtrain's GPT-2 computes \"gelu_new\" (GELU's tanh approximation)"},
    {"layer_norm_epsilon", is_ln_eps, "dtrain's GPT-2 computes its layernorms with epsilon 1e-5"},
    {"n_inner", is_4_embd, "dtrain's GPT-2 computes an MLP 4 n_embd wide (n_inner null)"},
    {"scale_attn_weights", is_true,
     "dtrain's GPT-2 scales attention scores by 1/sqrt(head size) (scale_attn_weights true)"},
    {"scale_attn_by_inverse_layer_idx", is_false,
     "dtrain's GPT-2 scales attention scores by 1/sqrt(head size) only, not by "
     "1/(layer index + 1)"},
    {"add_cross_attention", is_false, "dtrain's GPT-2 is decoder-only, without cross-attention"},
    {"tie_word_embeddings", is_true,
     "dtrain's GPT-2 ties the LM head to the token embedding wte (tie_word_embeddings true)"},
};

int gpt2_hf_config_read(const char *path, const char *text, size_t len, dt_model_key_t *out,
                        uint32_t cap, uint32_t *n, char *err, size_t err_cap)
{
    static const char *const keys[] = {"n_layer", "n_head", "n_embd", "vocab_size",
                                       "n_positions"};
    *n = 0;
    cJSON *j;
    int rc = hfj_parse(path, text, len, &j, err, err_cap);
    if (rc)
        return rc;
    int64_t v[5] = {0};
    for (int i = 0; i < 5 && !rc; i++) {
        rc = hfj_int(path, j, keys[i], &v[i], err, err_cap);
        if (rc == DT_ERR_NOT_FOUND && i == 4) /* older configs: n_ctx */
            rc = hfj_int(path, j, "n_ctx", &v[i], err, err_cap);
        if (rc == DT_ERR_NOT_FOUND) {
            snprintf(err, err_cap, "'%s' has no \"%s\": is it a GPT-2 config.json?", path,
                     keys[i]);
            rc = DT_ERR_CONFIG;
        }
    }
    for (size_t i = 0; i < sizeof rules / sizeof rules[0] && !rc; i++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, rules[i].key);
        if (x && !rules[i].ok(x, (double)v[2]))
            rc = hfj_refuse(err, err_cap, path, rules[i].key, x, rules[i].computes);
    }
    cJSON_Delete(j);
    if (rc || cap < 5)
        return rc ? rc : DT_ERR_INVALID;
    static const char *const names[] = {"n_layer", "n_head", "n_embd", "vocab_size", "context"};
    for (int i = 0; i < 5; i++)
        hfj_put_int(out, n, names[i], v[i]);
    return DT_OK;
}
