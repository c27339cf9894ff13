/*
 * sdk/lib/dt_cfg.c - reading a plugin's configuration values through the
 * host table, with one rule for every plugin: the defaults, ranges and
 * choices are the plugin's declared keys (the host applied them), and a
 * read that fails - a key the host does not know included - is a config
 * error naming the key.
 */
#include "dtrain/sdk/cfg.h"

#include <string.h>

/* The error for host->cfg_* status `rc` reading `key`. */
static int read_failed(const dt_host_v1_t *host, const char *key, int rc)
{
    if (rc == DT_ERR_NOT_FOUND)
        return host->set_error(host, DT_ERR_CONFIG,
                               "config key %s: no value (not declared by the plugin, or the "
                               "host applied no defaults)",
                               key);
    return host->set_error(host, DT_ERR_CONFIG, "config key %s: cannot read (%s)", key,
                           dt_status_name(rc));
}

int dt_cfg_int(const dt_host_v1_t *host, const char *key, int64_t *out)
{
    int64_t v = 0;
    int rc = host->cfg_int(host, key, &v);
    if (rc != DT_OK)
        return read_failed(host, key, rc);
    *out = v;
    return DT_OK;
}

int dt_cfg_bool(const dt_host_v1_t *host, const char *key, int *out)
{
    int v = 0;
    int rc = host->cfg_bool(host, key, &v);
    if (rc != DT_OK)
        return read_failed(host, key, rc);
    *out = v ? 1 : 0;
    return DT_OK;
}

int dt_cfg_float(const dt_host_v1_t *host, const char *key, double *out)
{
    double v = 0.0;
    int rc = host->cfg_float(host, key, &v);
    if (rc != DT_OK)
        return read_failed(host, key, rc);
    *out = v;
    return DT_OK;
}

int dt_cfg_string(const dt_host_v1_t *host, const char *key, const char **out)
{
    const char *v = NULL;
    int rc = host->cfg_string(host, key, &v);
    if (rc != DT_OK)
        return read_failed(host, key, rc);
    if (!v)
        return read_failed(host, key, DT_ERR_INVALID);
    *out = v;
    return DT_OK;
}

/* Index of `v` in `choices` ("A|B|C"), or -1. */
static int choice_index(const char *choices, const char *v)
{
    size_t n = strlen(v);
    int i = 0;
    for (const char *p = choices; *p; i++) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0)
            return i;
        if (!bar)
            break;
        p = bar + 1;
    }
    return -1;
}

int dt_cfg_enum(const dt_host_v1_t *host, const char *key, const char *choices, int *out)
{
    const char *v = NULL;
    int rc = dt_cfg_string(host, key, &v);
    if (rc != DT_OK)
        return rc;
    int i = choice_index(choices, v);
    if (i < 0) {
        char list[160];
        size_t n = 0;
        for (const char *c = choices; *c && n + 3 < sizeof list; c++) {
            if (*c == '|') {
                list[n++] = ',';
                list[n++] = ' ';
            } else {
                list[n++] = *c;
            }
        }
        list[n] = 0;
        return host->set_error(host, DT_ERR_CONFIG,
                               "%s = \"%s\" is not one of the valid choices: %s", key, v, list);
    }
    *out = i;
    return DT_OK;
}

int dt_cfg_reduce_dtype(const dt_host_v1_t *host, int *out)
{
    static const int dtypes[] = {DT_F32, DT_BF16, DT_F16}; /* the choices' order */
    int i = 0;
    int rc = dt_cfg_enum(host, "reduce_dtype", "fp32|bf16|fp16", &i);
    *out = rc == DT_OK ? dtypes[i] : DT_F32;
    return rc;
}

const char *dt_cfg_reduce_dtype_name(int dtype)
{
    return dtype == DT_BF16 ? "bf16" : dtype == DT_F16 ? "fp16" : "fp32";
}
