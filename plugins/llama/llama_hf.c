/*
 * plugins/llama/llama_hf.c - Hugging Face's LLaMA family (transformers'
 * LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM without a sliding
 * window) as files, the model table's hf_* slots (dtrain/model.h) for
 * `dtrain import` and `dtrain export`:
 *
 *  - tensor names: dtrain's names are HF's without "model." (the decoder
 *    stack's prefix): "model.layers.3.self_attn.q_proj.weight" is
 *    "layers.3.self_attn.q_proj.weight"; "lm_head.weight" is the untied
 *    head, or, with tie_word_embeddings, a copy of embed_tokens (imported
 *    only when equal to it); an older save's rotary_emb.inv_freq is a
 *    buffer;
 *  - layout: nn.Linear weights (out, in), as dtrain's; q_proj and k_proj
 *    rows in HF's order, whose rotary embedding pairs channel i with
 *    i + head_dim/2 (rotate_half), which is dtrain's: no permutation;
 *  - config.json: the shape, rope_theta, rms_norm_eps, tie_word_embeddings,
 *    Llama 3.1's rope_scaling, as the legacy keys (rope_theta, rope_scaling)
 *    or transformers 5's rope_parameters; Qwen2 has q/k/v biases (dtrain's
 *    qkv_bias).  Every other key that changes what the model computes must
 *    hold what dtrain's llama computes (the checks below).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/model/hf_json.h"
#include "dtrain/model.h"
#include "llama_hf.h"

const char *const *llama_hf_architectures(void)
{
    static const char *const a[] = {"LlamaForCausalLM", "Qwen2ForCausalLM",
                                    "MistralForCausalLM", "llama", "qwen2", "mistral", NULL};
    return a;
}

void llama_hf_export_name(const char *name, char *hf, size_t cap, int *transpose)
{
    *transpose = 0;
    snprintf(hf, cap, "%s%s", strcmp(name, "lm_head.weight") == 0 ? "" : "model.", name);
}

int llama_hf_import_name(const dt_model_key_t *keys, uint32_t n, const char *hf, char *name,
                         size_t cap)
{
    const dt_model_key_t *tie = hfj_key(keys, n, "tie_embeddings");
    if (strcmp(hf, "lm_head.weight") == 0 && tie && tie->value) {
        snprintf(name, cap, "embed_tokens.weight");
        return DT_HF_TIED;
    }
    if (strncmp(hf, "model.", 6) == 0)
        hf += 6;
    const size_t len = strlen(hf), sfx = strlen(".rotary_emb.inv_freq");
    if (len > sfx && strcmp(hf + len - sfx, ".rotary_emb.inv_freq") == 0)
        return DT_HF_BUFFER;
    snprintf(name, cap, "%s", hf);
    return DT_HF_PARAM;
}

/* ---- config.json in ---------------------------------------------------- */

/* What a config.json is: its family, from architectures / model_type. */
enum { FAM_LLAMA = 0, FAM_QWEN2 = 1, FAM_MISTRAL = 2 };

static int family(const cJSON *j)
{
    static const char *const arch[] = {"LlamaForCausalLM", "Qwen2ForCausalLM",
                                       "MistralForCausalLM"};
    static const char *const type[] = {"llama", "qwen2", "mistral"};
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures"), *it;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    for (int f = 0; f < 3; f++) {
        cJSON_ArrayForEach(it, a)
        {
            if (cJSON_IsString(it) && strcmp(it->valuestring, arch[f]) == 0)
                return f;
        }
        if (cJSON_IsString(t) && strcmp(t->valuestring, type[f]) == 0)
            return f;
    }
    return FAM_LLAMA;
}

/* A number key (absent: def); DT_ERR_CONFIG in err when not a number. */
static int num_key(const char *path, const cJSON *j, const char *key, double def, double *out,
                   char *err, size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    *out = def;
    if (!v || cJSON_IsNull(v))
        return DT_OK;
    if (!cJSON_IsNumber(v)) {
        snprintf(err, cap, "'%s': \"%s\" is not a number", path, key);
        return DT_ERR_CONFIG;
    }
    *out = v->valuedouble;
    return DT_OK;
}

/* The settings dtrain's llama does not compute, each refused by key when
 * present with another value.  Ignored, as they do not change the
 * function: attention_dropout (dtrain trains without dropout), bos / eos /
 * pad ids, torch_dtype, use_cache, initializer_range. */
static int refusals(const char *path, const cJSON *j, int fam, char *err, size_t cap)
{
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "model_type")) &&
        !(cJSON_IsString(v) && (!strcmp(v->valuestring, "llama") ||
                                !strcmp(v->valuestring, "qwen2") ||
                                !strcmp(v->valuestring, "mistral"))))
        return hfj_refuse(err, cap, path, "model_type", v,
                          "dtrain's llama reads \"llama\", \"qwen2\" and \"mistral\"");
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "hidden_act")) &&
        !(cJSON_IsString(v) && strcmp(v->valuestring, "silu") == 0))
        return hfj_refuse(err, cap, path, "hidden_act", v,
                          "dtrain's llama computes SwiGLU with \"silu\"");
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "attention_bias")) && !cJSON_IsFalse(v))
        return hfj_refuse(err, cap, path, "attention_bias", v,
                          "dtrain's llama computes q/k/v biases only as Qwen2 does "
                          "(Qwen2ForCausalLM), never an o_proj bias");
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "mlp_bias")) && !cJSON_IsFalse(v))
        return hfj_refuse(err, cap, path, "mlp_bias", v,
                          "dtrain's llama computes its MLP without biases");
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "pretraining_tp")) && !cJSON_IsNull(v) &&
        !(cJSON_IsNumber(v) && v->valuedouble == 1.0))
        return hfj_refuse(err, cap, path, "pretraining_tp", v,
                          "dtrain's llama computes each projection as one matmul "
                          "(pretraining_tp 1)");
    if ((v = cJSON_GetObjectItemCaseSensitive(j, "partial_rotary_factor")) &&
        !(cJSON_IsNumber(v) && v->valuedouble == 1.0))
        return hfj_refuse(err, cap, path, "partial_rotary_factor", v,
                          "dtrain's llama rotates every channel of a head");
    if (fam == FAM_QWEN2) {
        if ((v = cJSON_GetObjectItemCaseSensitive(j, "use_sliding_window")) && !cJSON_IsFalse(v))
            return hfj_refuse(err, cap, path, "use_sliding_window", v,
                              "dtrain's llama computes full causal attention");
    } else if ((v = cJSON_GetObjectItemCaseSensitive(j, "sliding_window")) && !cJSON_IsNull(v)) {
        return hfj_refuse(err, cap, path, "sliding_window", v,
                          "dtrain's llama computes full causal attention (sliding_window "
                          "null)");
    }
    return DT_OK;
}

/* The rotary settings: rope_parameters (transformers 5) or rope_theta and
 * rope_scaling (earlier); rope_type "default" or "llama3". */
static int rope(const char *path, const cJSON *j, dt_model_key_t *out, uint32_t *n, char *err,
                size_t cap)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    const char *pkey = "rope_parameters";
    double theta;
    int rc = num_key(path, j, "rope_theta", 10000.0, &theta, err, cap);
    if (!rc && cJSON_IsObject(p))
        rc = num_key(path, p, "rope_theta", theta, &theta, err, cap);
    else if (!rc) {
        p = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
        pkey = "rope_scaling";
    }
    if (rc)
        return rc;
    hfj_put_float(out, n, "rope_theta", theta);
    if (!p || cJSON_IsNull(p))
        return DT_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "rope_type");
    if (!t)
        t = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "";
    if (!cJSON_IsObject(p) || (strcmp(type, "default") != 0 && strcmp(type, "llama3") != 0))
        return hfj_refuse(err, cap, path, pkey, p,
                          "dtrain's llama computes rotary embeddings without scaling "
                          "(\"default\") or with Llama 3.1's (rope_type \"llama3\")");
    if (strcmp(type, "default") == 0)
        return DT_OK;
    static const char *const hf[] = {"factor", "low_freq_factor", "high_freq_factor",
                                      "original_max_position_embeddings"};
    static const char *const key[] = {"rope_scaling_factor", "rope_scaling_low_freq_factor",
                                      "rope_scaling_high_freq_factor",
                                      "rope_scaling_original_max_position_embeddings"};
    hfj_put_choice(out, n, "rope_scaling", "llama3");
    for (int i = 0; i < 4; i++) {
        double v;
        if (!cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(p, hf[i]))) {
            snprintf(err, cap, "'%s': \"%s\" has no number \"%s\"", path, pkey, hf[i]);
            return DT_ERR_CONFIG;
        }
        num_key(path, p, hf[i], 0, &v, err, cap);
        if (i == 3)
            hfj_put_int(out, n, key[i], (int64_t)v);
        else
            hfj_put_float(out, n, key[i], v);
    }
    return DT_OK;
}

/* The shape: config.json's integer keys as dtrain's [model] keys. */
static int shape(const char *path, const cJSON *j, dt_model_key_t *out, uint32_t *n, char *err,
                 size_t cap)
{
    static const struct {
        const char *hf, *key;
        int required;
    } k[] = {{"num_hidden_layers", "n_layer", 1},   {"num_attention_heads", "n_head", 1},
             {"num_key_value_heads", "n_kv_head", 0}, {"hidden_size", "n_embd", 1},
             {"vocab_size", "vocab_size", 1},      {"intermediate_size", "intermediate_size", 1},
             {"head_dim", "head_dim", 0},          {"max_position_embeddings", "context", 1}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        int64_t v = 0;
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(j, k[i].hf);
        int rc = x && cJSON_IsNull(x) && !k[i].required ? DT_ERR_NOT_FOUND
                                                         : hfj_int(path, j, k[i].hf, &v, err, cap);
        if (rc == DT_ERR_NOT_FOUND && k[i].required) {
            snprintf(err, cap, "'%s' has no \"%s\": is it a LLaMA-family config.json?", path,
                     k[i].hf);
            return DT_ERR_CONFIG;
        }
        if (rc == DT_ERR_NOT_FOUND)
            continue; /* n_kv_head = n_head, head_dim = n_embd / n_head */
        if (rc)
            return rc;
        hfj_put_int(out, n, k[i].key, v);
    }
    return DT_OK;
}

int llama_hf_config_read(const char *path, const char *text, size_t len, dt_model_key_t *out,
                         uint32_t cap, uint32_t *n, char *err, size_t err_cap)
{
    *n = 0;
    if (cap < 18)
        return DT_ERR_INVALID;
    cJSON *j;
    int rc = hfj_parse(path, text, len, &j, err, err_cap);
    if (rc)
        return rc;
    const int fam = family(j);
    double eps;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(j, "tie_word_embeddings");
    if (!(rc = refusals(path, j, fam, err, err_cap)) &&
        !(rc = shape(path, j, out, n, err, err_cap)) &&
        !(rc = rope(path, j, out, n, err, err_cap)) &&
        !(rc = num_key(path, j, "rms_norm_eps", 1e-6, &eps, err, err_cap))) {
        hfj_put_float(out, n, "rms_norm_eps", eps);
        hfj_put_bool(out, n, "tie_embeddings", cJSON_IsTrue(tie));
        hfj_put_bool(out, n, "qkv_bias", fam == FAM_QWEN2);
    }
    cJSON_Delete(j);
    return rc;
}

/* ---- config.json out --------------------------------------------------- */

size_t llama_hf_config_write(const dt_model_key_t *keys, uint32_t n, char *buf, size_t cap,
                             char *err, size_t err_cap)
{
    static const struct {
        const char *key, *hf;
    } ints[] = {{"vocab_size", "vocab_size"},       {"n_embd", "hidden_size"},
                {"intermediate_size", "intermediate_size"}, {"n_layer", "num_hidden_layers"},
                {"n_head", "num_attention_heads"},  {"n_kv_head", "num_key_value_heads"},
                {"head_dim", "head_dim"},           {"context", "max_position_embeddings"}};
    const dt_model_key_t *qkv = hfj_key(keys, n, "qkv_bias"),
                         *tie = hfj_key(keys, n, "tie_embeddings"),
                         *rs = hfj_key(keys, n, "rope_scaling");
    const int qwen2 = qkv && qkv->value, llama3 = rs && rs->s && !strcmp(rs->s, "llama3");
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        if (!(hfj_num(keys, n, ints[i].key, 0) >= 1)) {
            snprintf(err, err_cap, "the model has no positive \"%s\" for config.json's \"%s\"",
                     ints[i].key, ints[i].hf);
            return 0;
        }
    cJSON *j = cJSON_CreateObject(), *arch = cJSON_CreateArray();
    if (!j || !arch) {
        cJSON_Delete(arch);
        cJSON_Delete(j);
        return hfj_finish(NULL, buf, cap, err, err_cap);
    }
    cJSON_AddItemToArray(arch, cJSON_CreateString(qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"));
    cJSON_AddItemToObject(j, "architectures", arch);
    cJSON_AddStringToObject(j, "model_type", qwen2 ? "qwen2" : "llama");
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        cJSON_AddNumberToObject(j, ints[i].hf, hfj_num(keys, n, ints[i].key, 0));
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNumberToObject(j, "rms_norm_eps", hfj_num(keys, n, "rms_norm_eps", 1e-5));
    cJSON_AddNumberToObject(j, "rope_theta", hfj_num(keys, n, "rope_theta", 10000.0));
    cJSON *s = llama3 ? cJSON_AddObjectToObject(j, "rope_scaling")
                      : cJSON_AddNullToObject(j, "rope_scaling");
    if (llama3 && s) {
        cJSON_AddStringToObject(s, "rope_type", "llama3");
        cJSON_AddNumberToObject(s, "factor", hfj_num(keys, n, "rope_scaling_factor", 0));
        cJSON_AddNumberToObject(s, "low_freq_factor",
                                hfj_num(keys, n, "rope_scaling_low_freq_factor", 0));
        cJSON_AddNumberToObject(s, "high_freq_factor",
                                hfj_num(keys, n, "rope_scaling_high_freq_factor", 0));
        cJSON_AddNumberToObject(s, "original_max_position_embeddings",
                                hfj_num(keys, n, "rope_scaling_original_max_position_embeddings",
                                        0));
    }
    if (qwen2) {
        cJSON_AddBoolToObject(j, "use_sliding_window", 0);
        cJSON_AddNullToObject(j, "sliding_window");
    } else {
        cJSON_AddBoolToObject(j, "attention_bias", 0);
        cJSON_AddBoolToObject(j, "mlp_bias", 0);
        cJSON_AddNumberToObject(j, "pretraining_tp", 1);
    }
    cJSON_AddNumberToObject(j, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", tie && tie->value);
    /* dtrain knows no special tokens of this vocabulary: stated as none,
     * so transformers assumes none (LlamaConfig's defaults are 1 and 2) */
    cJSON_AddNullToObject(j, "bos_token_id");
    cJSON_AddNullToObject(j, "eos_token_id");
    cJSON_AddNumberToObject(j, "initializer_range", 0.02);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    return hfj_finish(j, buf, cap, err, err_cap);
}
