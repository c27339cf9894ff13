/*
 * plugins/common/model/hf_json.h - what the model plugins' Hugging Face
 * slots share (dtrain/model.h hf_*): config.json parsed, its keys read
 * and refused in one message form, the exported text finished, a [model]
 * key found among a checkpoint's.
 */
#ifndef DT_COMMON_MODEL_HF_JSON_H
#define DT_COMMON_MODEL_HF_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "dtrain/model.h"

/* Parse config.json text[len]: an object, else DT_ERR_CONFIG ("'<path>'
 * is not a JSON object") in err. */
int hfj_parse(const char *path, const char *text, size_t len, cJSON **out, char *err,
              size_t cap);
/* "'<path>': \"<key>\" is <v as JSON, at most 60 chars>; <computes>" into
 * err; returns DT_ERR_CONFIG. */
int hfj_refuse(char *err, size_t cap, const char *path, const char *key, const cJSON *v,
               const char *computes);
/* A positive integer key into *out: DT_OK; DT_ERR_NOT_FOUND (no message)
 * when absent; DT_ERR_CONFIG "'<path>': \"<key>\" is not a positive
 * integer". */
int hfj_int(const char *path, const cJSON *j, const char *key, int64_t *out, char *err,
            size_t cap);
/* j printed (formatted, ending in a newline) into buf[cap] (NUL-terminated
 * when it fits); its length, 0 when out of memory (err says so). j freed. */
size_t hfj_finish(cJSON *j, char *buf, size_t cap, char *err, size_t err_cap);
/* Key `name` of keys[n] (NULL when absent); its number (f for a FLOAT,
 * value else) or `def`. */
const dt_model_key_t *hfj_key(const dt_model_key_t *keys, uint32_t n, const char *name);
double hfj_num(const dt_model_key_t *keys, uint32_t n, const char *name, double def);
/* out[*n] = {key, value/f/s, kind}: the helpers a config reader fills its
 * keys with (cap checked by the caller). */
void hfj_put_int(dt_model_key_t *out, uint32_t *n, const char *key, int64_t v);
void hfj_put_bool(dt_model_key_t *out, uint32_t *n, const char *key, int v);
void hfj_put_float(dt_model_key_t *out, uint32_t *n, const char *key, double v);
void hfj_put_choice(dt_model_key_t *out, uint32_t *n, const char *key, const char *s);

#endif /* DT_COMMON_MODEL_HF_JSON_H */
