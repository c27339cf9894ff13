/*
 * core/ckpt/hf_model.c - Hugging Face model folders through the model
 * plugins' hf_* slots (hf_model.h).
 */
#include "ckpt/hf_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/plugin_handle.h"
#include "model/model.h"
#include "util/error.h"
#include "util/fileutil.h"

int dt_hf_model_has(const dt_model_ops_t *ops)
{
    return ops && DT_HAS_OP(dt_model_ops_v1_t, ops, hf_architectures) &&
           DT_HAS_OP(dt_model_ops_v1_t, ops, hf_config_read) &&
           DT_HAS_OP(dt_model_ops_v1_t, ops, hf_config_write) &&
           DT_HAS_OP(dt_model_ops_v1_t, ops, hf_export_name) &&
           DT_HAS_OP(dt_model_ops_v1_t, ops, hf_import_name);
}

/* config.json whole: a missing one is the user's to give (DT_ERR_CONFIG). */
static int read_text(const char *path, char **text, size_t *n)
{
    int rc = dt_fileutil_read_all(path, text, n);
    if (rc == DT_ERR_NOT_FOUND) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dt_last_error());
        return dt_err_set(DT_ERR_CONFIG, "%s", why);
    }
    return rc;
}

/* Whether `ops` reads a config.json whose architectures / model_type are
 * `arch` / `type` (either may be NULL). */
static int reads(const dt_model_ops_t *ops, const cJSON *arch, const cJSON *type)
{
    if (!dt_hf_model_has(ops))
        return 0;
    for (const char *const *a = ops->hf_architectures(); a && *a; a++) {
        const cJSON *it;
        cJSON_ArrayForEach(it, arch)
        {
            if (cJSON_IsString(it) && strcmp(it->valuestring, *a) == 0)
                return 1;
        }
        if (cJSON_IsString(type) && strcmp(type->valuestring, *a) == 0)
            return 1;
    }
    return 0;
}

/* "gpt2 (GPT2LMHeadModel, gpt2)" appended to list[cap]. */
static void say_reads(const dt_model_ops_t *ops, char *list, size_t cap)
{
    size_t len = strlen(list);
    snprintf(list + len, cap - len, "%s%s (", len ? "; " : "", ops->info.name);
    const char *const *a = ops->hf_architectures();
    for (int i = 0; a && a[i]; i++) {
        len = strlen(list);
        snprintf(list + len, cap - len, "%s%s", i ? ", " : "", a[i]);
    }
    len = strlen(list);
    snprintf(list + len, cap - len, ")");
}

/* The model plugins of the search path's listing `ls`, one at a time,
 * until one reads the config; *out that one, loaded. */
static int find_in(const dt_search_path_t *sp, const dt_plugin_listing_t *ls, size_t n,
                   const cJSON *cfg, char *list, size_t cap, dt_plugin_t **out)
{
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(cfg, "architectures");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    for (size_t i = 0; i < n; i++) {
        dt_plugin_t *p = NULL;
        if (ls[i].kind != DT_KIND_MODEL || !ls[i].loadable)
            continue;
        if (dt_plugin_load(sp, DT_KIND_MODEL, ls[i].name, &p) != DT_OK) {
            dt_err_clear();
            continue;
        }
        const dt_model_ops_t *ops = p->ops;
        if (reads(ops, cJSON_IsArray(arch) ? arch : NULL, type)) {
            *out = p;
            return DT_OK;
        }
        if (dt_hf_model_has(ops))
            say_reads(ops, list, cap);
        dt_plugin_unload(p);
    }
    return DT_ERR_NOT_FOUND;
}

int dt_hf_model_find(const dt_search_path_t *sp, const char *path, dt_plugin_t **out)
{
    *out = NULL;
    char *text = NULL;
    size_t n = 0;
    int rc = read_text(path, &text, &n);
    if (rc)
        return rc;
    cJSON *cfg = cJSON_ParseWithLength(text, n);
    free(text);
    if (!cJSON_IsObject(cfg)) {
        cJSON_Delete(cfg);
        return dt_err_set(DT_ERR_CONFIG, "'%s' is not a JSON object", path);
    }
    dt_plugin_listing_t *ls = NULL;
    size_t nl = 0;
    char list[1024] = "";
    if (!(rc = dt_plugin_discover(sp, &ls, &nl)) &&
        (rc = find_in(sp, ls, nl, cfg, list, sizeof list, out)) == DT_ERR_NOT_FOUND) {
        char *a = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cfg, "architectures"));
        char *t = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cfg, "model_type"));
        rc = dt_err_set(DT_ERR_CONFIG,
                        "'%s': \"architectures\" is %s, \"model_type\" is %s; no model plugin "
                        "reads it (%s)",
                        path, a ? a : "absent", t ? t : "absent",
                        list[0] ? list : "none on the plugin path reads Hugging Face files");
        cJSON_free(a);
        cJSON_free(t);
    }
    free(ls);
    cJSON_Delete(cfg);
    return rc;
}

/* Key k of a model of plugin `arch` as an assignment ("model.n_layer=12"). */
static void key_set(const char *arch, const dt_model_key_t *k, char *buf, size_t cap)
{
    const char *table = dt_model_key_table(arch, k->key);
    if (k->kind == DT_MODEL_KEY_BOOL)
        snprintf(buf, cap, "%s.%s=%s", table, k->key, k->value ? "true" : "false");
    else if (k->kind == DT_MODEL_KEY_FLOAT) /* the shortest text that reads back exactly */
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(buf, cap, "%s.%s=%.*g", table, k->key, prec, k->f);
            if (strtod(strchr(buf, '=') + 1, NULL) == k->f)
                break;
        }
    else if (k->kind == DT_MODEL_KEY_CHOICE)
        snprintf(buf, cap, "%s.%s=%s", table, k->key, k->s ? k->s : "");
    else
        snprintf(buf, cap, "%s.%s=%lld", table, k->key, (long long)k->value);
}

int dt_hf_model_sets(const dt_model_ops_t *ops, const char *path, char (*sets)[96], int cap,
                     int *n)
{
    *n = 0;
    if (!dt_hf_model_has(ops))
        return dt_err_set(DT_ERR_UNSUPPORTED, "model/%s reads no Hugging Face config.json",
                          ops->info.name);
    char *text = NULL, err[1024] = "";
    size_t len = 0;
    int rc = read_text(path, &text, &len);
    if (rc)
        return rc;
    dt_model_key_t keys[DT_MODEL_MAX_KEYS];
    uint32_t nk = 0;
    rc = ops->hf_config_read(path, text, len, keys, DT_MODEL_MAX_KEYS, &nk, err, sizeof err);
    free(text);
    if (rc)
        return dt_err_set(rc, "%s", err[0] ? err : "config.json refused (no reason given)");
    if ((int)nk + 1 > cap)
        return dt_err_set(DT_ERR_CONFIG, "'%s': more keys than dtrain reads", path);
    snprintf(sets[(*n)++], 96, "model.arch=%s", ops->info.name);
    for (uint32_t i = 0; i < nk; i++)
        key_set(ops->info.name, &keys[i], sets[(*n)++], 96);
    return DT_OK;
}

/* The manifest's "model" object as keys (numbers with f and value). */
static uint32_t manifest_keys(const cJSON *model, int64_t context, dt_model_key_t *k,
                              uint32_t cap)
{
    uint32_t n = 0;
    int has_context = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, model)
    {
        if (n == cap || strcmp(it->string, "arch") == 0 || strcmp(it->string, "dtype") == 0 ||
            strcmp(it->string, "activations") == 0)
            continue;
        dt_model_key_t key = {.key = it->string};
        if (cJSON_IsBool(it)) {
            key.kind = DT_MODEL_KEY_BOOL;
            key.value = cJSON_IsTrue(it);
        } else if (cJSON_IsString(it)) {
            key.kind = DT_MODEL_KEY_CHOICE;
            key.s = it->valuestring;
        } else if (cJSON_IsNumber(it)) {
            key.f = it->valuedouble;
            key.value = (int64_t)it->valuedouble;
            key.kind = key.f == (double)key.value ? DT_MODEL_KEY_INT : DT_MODEL_KEY_FLOAT;
        } else {
            continue;
        }
        has_context |= strcmp(it->string, "context") == 0;
        k[n++] = key;
    }
    if (!has_context && context > 0 && n < cap)
        k[n++] = (dt_model_key_t){.key = "context", .value = context, .f = (double)context,
                                  .kind = DT_MODEL_KEY_INT};
    return n;
}

int dt_hf_model_config_text(const dt_model_ops_t *ops, const cJSON *model, int64_t context,
                            const char *dir, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    dt_model_key_t keys[DT_MODEL_MAX_KEYS + 1];
    const uint32_t n = manifest_keys(model, context, keys, DT_MODEL_MAX_KEYS + 1);
    char err[1024] = "";
    size_t cap = 4096;
    for (;;) {
        char *buf = malloc(cap);
        if (!buf)
            return dt_err_set(DT_ERR_NOMEM, "config.json: out of memory");
        size_t need = ops->hf_config_write(keys, n, buf, cap, err, sizeof err);
        if (need == 0) {
            free(buf);
            return dt_err_set(DT_ERR_DATA, "checkpoint '%s': config.json: %s", dir,
                              err[0] ? err : "the model plugin wrote none");
        }
        if (need < cap) {
            *text = buf;
            *len = need;
            return DT_OK;
        }
        free(buf);
        cap = need + 1;
    }
}
