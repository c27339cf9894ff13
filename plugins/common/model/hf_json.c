/*
 * plugins/common/model/hf_json.c - the model plugins' shared Hugging Face
 * config.json helpers (hf_json.h).
 */
#include "common/model/hf_json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int hfj_parse(const char *path, const char *text, size_t len, cJSON **out, char *err,
              size_t cap)
{
    *out = cJSON_ParseWithLength(text, len);
    if (cJSON_IsObject(*out))
        return DT_OK;
    cJSON_Delete(*out);
    *out = NULL;
    snprintf(err, cap, "'%s' is not a JSON object", path);
    return DT_ERR_CONFIG;
}

int hfj_refuse(char *err, size_t cap, const char *path, const char *key, const cJSON *v,
               const char *computes)
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
    snprintf(err, cap, "'%s': \"%s\" is %s; %s", path, key, shown, computes);
    return DT_ERR_CONFIG;
}

int hfj_int(const char *path, const cJSON *j, const char *key, int64_t *out, char *err,
            size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!v)
        return DT_ERR_NOT_FOUND;
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble > 1e15 ||
        v->valuedouble != floor(v->valuedouble)) {
        snprintf(err, cap, "'%s': \"%s\" is not a positive integer", path, key);
        return DT_ERR_CONFIG;
    }
    *out = (int64_t)v->valuedouble;
    return DT_OK;
}

size_t hfj_finish(cJSON *j, char *buf, size_t cap, char *err, size_t err_cap)
{
    char *text = j ? cJSON_Print(j) : NULL;
    cJSON_Delete(j);
    if (!text) {
        snprintf(err, err_cap, "out of memory");
        return 0;
    }
    const size_t n = strlen(text) + 1; /* the file ends with a newline */
    if (n < cap) {
        memcpy(buf, text, n - 1);
        buf[n - 1] = '\n';
        buf[n] = '\0';
    }
    cJSON_free(text);
    return n;
}

const dt_model_key_t *hfj_key(const dt_model_key_t *keys, uint32_t n, const char *name)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(keys[i].key, name) == 0)
            return &keys[i];
    return NULL;
}

double hfj_num(const dt_model_key_t *keys, uint32_t n, const char *name, double def)
{
    const dt_model_key_t *k = hfj_key(keys, n, name);
    if (!k)
        return def;
    return k->kind == DT_MODEL_KEY_FLOAT ? k->f : (double)k->value;
}

void hfj_put_int(dt_model_key_t *out, uint32_t *n, const char *key, int64_t v)
{
    out[(*n)++] = (dt_model_key_t){.key = key, .value = v, .f = (double)v,
                                   .kind = DT_MODEL_KEY_INT};
}

void hfj_put_bool(dt_model_key_t *out, uint32_t *n, const char *key, int v)
{
    out[(*n)++] = (dt_model_key_t){.key = key, .value = v != 0, .kind = DT_MODEL_KEY_BOOL};
}

void hfj_put_float(dt_model_key_t *out, uint32_t *n, const char *key, double v)
{
    out[(*n)++] = (dt_model_key_t){.key = key, .f = v, .kind = DT_MODEL_KEY_FLOAT};
}

void hfj_put_choice(dt_model_key_t *out, uint32_t *n, const char *key, const char *s)
{
    out[(*n)++] = (dt_model_key_t){.key = key, .s = s, .kind = DT_MODEL_KEY_CHOICE};
}
