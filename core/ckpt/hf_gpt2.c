/*
 * core/ckpt/hf_gpt2.c - Hugging Face's GPT-2 files: names, Conv1D layout,
 * config.json (hf_gpt2.h).
 */
#include "ckpt/hf_gpt2.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "util/error.h"
#include "util/fileutil.h"

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int dt_hf_gpt2_conv1d(const char *name)
{
    static const char *const sfx[] = {".attn.c_attn.weight", ".attn.c_proj.weight",
                                      ".mlp.c_fc.weight", ".mlp.c_proj.weight"};
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++)
        if (ends_with(name, sfx[i]))
            return 1;
    return 0;
}

int dt_hf_gpt2_role(const char *name, const char **base)
{
    static const char prefix[] = "transformer.";
    if (strncmp(name, prefix, sizeof prefix - 1) == 0)
        name += sizeof prefix - 1;
    *base = name;
    if (strcmp(name, "lm_head.weight") == 0)
        return DT_HF_LM_HEAD;
    if (strncmp(name, "h.", 2) == 0 && (ends_with(name, ".attn.bias") ||
                                        ends_with(name, ".attn.masked_bias")))
        return DT_HF_BUFFER;
    return DT_HF_PARAM;
}

static const char *const shape_keys[] = {"n_layer", "n_head", "n_embd", "vocab_size",
                                         "context"};

int dt_hf_gpt2_shape(const dt_model_info_t *mi, dt_gpt2_shape_t *out)
{
    int64_t *dst[] = {&out->n_layer, &out->n_head, &out->n_embd, &out->vocab_size,
                      &out->context};
    if (mi->n_keys != 5)
        return DT_ERR_NOT_FOUND;
    for (int i = 0; i < 5; i++) {
        if (strcmp(mi->keys[i].key, shape_keys[i]) != 0)
            return DT_ERR_NOT_FOUND;
        *dst[i] = mi->keys[i].value;
    }
    return DT_OK;
}

int dt_hf_gpt2_manifest(const cJSON *model)
{
    const cJSON *it;
    int i = 0;
    cJSON_ArrayForEach(it, model)
    {
        if (!cJSON_IsNumber(it))
            continue;
        if (i == 5 || strcmp(it->string, shape_keys[i]) != 0)
            return 0;
        i++;
    }
    return i == 5;
}

char *dt_hf_gpt2_config_text(const dt_gpt2_shape_t *s, size_t *len)
{
    *len = 0;
    cJSON *j = cJSON_CreateObject(), *arch = cJSON_CreateArray();
    if (!j || !arch) {
        cJSON_Delete(j);
        cJSON_Delete(arch);
        return NULL;
    }
    cJSON_AddItemToArray(arch, cJSON_CreateString("GPT2LMHeadModel"));
    cJSON_AddItemToObject(j, "architectures", arch);
    cJSON_AddStringToObject(j, "model_type", "gpt2");
    cJSON_AddNumberToObject(j, "n_layer", (double)s->n_layer);
    cJSON_AddNumberToObject(j, "n_head", (double)s->n_head);
    cJSON_AddNumberToObject(j, "n_embd", (double)s->n_embd);
    cJSON_AddNumberToObject(j, "vocab_size", (double)s->vocab_size);
    cJSON_AddNumberToObject(j, "n_positions", (double)s->context);
    cJSON_AddNumberToObject(j, "n_ctx", (double)s->context);
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
    /* absent, GPT2Config assumes 50256 whatever the vocabulary (hf_gpt2.h) */
    if (s->vocab_size > DT_HF_GPT2_EOT) {
        cJSON_AddNumberToObject(j, "bos_token_id", DT_HF_GPT2_EOT);
        cJSON_AddNumberToObject(j, "eos_token_id", DT_HF_GPT2_EOT);
    } else {
        cJSON_AddNullToObject(j, "bos_token_id");
        cJSON_AddNullToObject(j, "eos_token_id");
    }
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text)
        return NULL;
    size_t n = strlen(text);
    char *out = malloc(n + 2); /* cJSON's allocator is not ours to realloc */
    if (out) {
        memcpy(out, text, n);
        out[n] = '\n'; /* the file ends with a newline */
        out[n + 1] = '\0';
        *len = n + 1;
    }
    cJSON_free(text);
    return out;
}

int dt_hf_gpt2_config_write(const char *path, const dt_gpt2_shape_t *s)
{
    size_t n;
    char *text = dt_hf_gpt2_config_text(s, &n);
    if (!text)
        return dt_err_set(DT_ERR_NOMEM, "'%s': out of memory", path);
    int rc = dt_fileutil_write_atomic(path, text, n); /* its errors name `path` */
    free(text);
    return rc;
}

/* A positive integer key; absent: DT_ERR_NOT_FOUND without a message. */
static int int_key(const char *path, const cJSON *j, const char *key, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v)
        return DT_ERR_NOT_FOUND;
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e15 ||
        v->valuedouble != floor(v->valuedouble))
        return dt_err_set(DT_ERR_CONFIG, "'%s': \"%s\" is not a positive integer", path, key);
    *out = (int64_t)v->valuedouble;
    return DT_OK;
}

/* ---- the settings dtrain's GPT-2 computes -----------------------------
 * GPT2Config's keys that change what the model computes, each with the one
 * value (or the equivalent values) dtrain's GPT-2 (plugins/gpt2/gpt2.c and
 * the device's kernels) computes; a key absent takes transformers' default,
 * which is that value.  Keys that do not change the function are ignored:
 * reorder_and_upcast_attn (the same scaled scores, computed in f32 in
 * another order: transformers' remedy for f16 overflow), the dropouts
 * resid_pdrop, embd_pdrop and attn_pdrop (dtrain trains without dropout;
 * inference is the same), summary_* (heads of other model classes),
 * use_cache, bos/eos ids, torch_dtype (the tensors carry theirs). */

static int is_gpt2(const cJSON *v, const dt_gpt2_shape_t *s)
{
    (void)s;
    return cJSON_IsString(v) && strcmp(v->valuestring, "gpt2") == 0;
}

static int is_tanh_gelu(const cJSON *v, const dt_gpt2_shape_t *s)
{
    (void)s; /* gelu_pytorch_tanh: the same function, torch's kernel */
    return cJSON_IsString(v) && (strcmp(v->valuestring, "gelu_new") == 0 ||
                                 strcmp(v->valuestring, "gelu_pytorch_tanh") == 0);
}

static int is_ln_eps(const cJSON *v, const dt_gpt2_shape_t *s)
{
    (void)s;
    return cJSON_IsNumber(v) && fabs(v->valuedouble - 1e-5) <= 1e-12;
}

static int is_4_embd(const cJSON *v, const dt_gpt2_shape_t *s)
{
    return cJSON_IsNull(v) || (cJSON_IsNumber(v) && v->valuedouble == 4.0 * (double)s->n_embd);
}

static int is_true(const cJSON *v, const dt_gpt2_shape_t *s)
{
    (void)s;
    return cJSON_IsTrue(v);
}

static int is_false(const cJSON *v, const dt_gpt2_shape_t *s)
{
    (void)s;
    return cJSON_IsFalse(v);
}

static const struct {
    const char *key;
    int (*ok)(const cJSON *v, const dt_gpt2_shape_t *s);
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

/* "'<path>': \"<key>\" is <value as JSON>; <computes>" */
static int refuse(const char *path, const char *key, const cJSON *v, const char *computes)
{
    char *text = cJSON_PrintUnformatted(v);
    char shown[80];
    if (!text)
        snprintf(shown, sizeof shown, "not a value dtrain reads");
    else if (strlen(text) < sizeof shown)
        snprintf(shown, sizeof shown, "%s", text);
    else
        snprintf(shown, sizeof shown, "%.60s...", text);
    cJSON_free(text);
    return dt_err_set(DT_ERR_CONFIG, "'%s': \"%s\" is %s; %s", path, key, shown, computes);
}

int dt_hf_gpt2_config_read(const char *path, dt_gpt2_shape_t *out)
{
    char *text = NULL;
    size_t n = 0;
    int rc = dt_fileutil_read_all(path, &text, &n);
    if (rc == DT_ERR_NOT_FOUND) { /* a missing config.json is the user's to give */
        char why[1024];
        snprintf(why, sizeof why, "%s", dt_last_error());
        return dt_err_set(DT_ERR_CONFIG, "%s", why);
    }
    if (rc)
        return rc;
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return dt_err_set(DT_ERR_CONFIG, "'%s' is not a JSON object", path);
    }
    static const struct {
        const char *key;
        size_t off;
    } keys[] = {
        {"n_layer", offsetof(dt_gpt2_shape_t, n_layer)},
        {"n_head", offsetof(dt_gpt2_shape_t, n_head)},
        {"n_embd", offsetof(dt_gpt2_shape_t, n_embd)},
        {"vocab_size", offsetof(dt_gpt2_shape_t, vocab_size)},
        {"n_positions", offsetof(dt_gpt2_shape_t, context)},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0] && !rc; i++) {
        int64_t *dst = (int64_t *)((char *)out + keys[i].off);
        rc = int_key(path, j, keys[i].key, dst);
        if (rc == DT_ERR_NOT_FOUND && i == 4) /* older configs: n_ctx */
            rc = int_key(path, j, "n_ctx", dst);
        if (rc == DT_ERR_NOT_FOUND)
            rc = dt_err_set(DT_ERR_CONFIG, "'%s' has no \"%s\": is it a GPT-2 config.json?",
                            path, keys[i].key);
    }
    for (size_t i = 0; i < sizeof rules / sizeof rules[0] && !rc; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, rules[i].key);
        if (v && !rules[i].ok(v, out))
            rc = refuse(path, rules[i].key, v, rules[i].computes);
    }
    cJSON_Delete(j);
    return rc;
}
