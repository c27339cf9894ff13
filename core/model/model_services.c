/*
 * core/model/model_services.c - the services table a model plugin calls
 * (dtrain/model.h dt_model_services_v1_t): each slot is one of model.c's
 * functions, reached from the plugin's dt_model_state_t * (the first
 * member of the core's struct dt_model), and the [model] config reads of
 * the plugin's create, which record the keys it read.
 */
#include <string.h>

#include "model/model_arch.h"
#include "util/error.h"

/* The core's model around a plugin's state (its first member). */
static dt_model_t *M(dt_model_state_t *s) { return (dt_model_t *)s; }
static const dt_model_t *CM(const dt_model_state_t *s) { return (const dt_model_t *)s; }

static const char *config_name(const dt_model_state_t *s)
{
    return CM(s)->cfg ? dt_model_cfg_name(CM(s)->cfg) : "config";
}

/* The core schema's [model] key `key` names (static), or NULL. */
static const char *schema_name(const char *key)
{
    for (uint32_t t = 0; t < dt_core_n_sections; t++)
        if (strcmp(dt_core_sections[t].table, "model") == 0)
            for (uint32_t i = 0; i < dt_core_sections[t].n_keys; i++)
                if (strcmp(dt_core_sections[t].keys[i].name, key) == 0)
                    return dt_core_sections[t].keys[i].name;
    return NULL;
}

/* The config during create; DT_ERR_INVALID after it.  A key is
 * "model.<key>" (the core's [model] table) or "<arch>.<key>" (the
 * plugin's own table, its declared config_keys). */
static int config_of(const dt_model_state_t *s, const char *key, dt_config_t **cfg)
{
    dt_model_t *m = M((dt_model_state_t *)s);
    if (!m->cfg)
        return dt_err_set(DT_ERR_INVALID, "model: %s read outside create", key);
    const size_t na = strlen(m->info.arch);
    *cfg = m->cfg;
    if (strncmp(key, m->info.arch, na) == 0 && key[na] == '.')
        return DT_OK;
    if (strncmp(key, "model.", 6) != 0)
        return dt_err_set(DT_ERR_INVALID, "model: '%s' is neither a [model] nor a [%s] key",
                          key, m->info.arch);
    for (uint32_t i = 0; i < m->n_read_keys; i++)
        if (strcmp(m->read_keys[i], key + 6) == 0)
            return DT_OK;
    /* recorded as the schema's own name: `key` may be the plugin's
     * buffer, gone after the call (an undeclared key is the get's error) */
    const char *name = schema_name(key + 6);
    if (name && m->n_read_keys < sizeof m->read_keys / sizeof m->read_keys[0])
        m->read_keys[m->n_read_keys++] = name;
    return DT_OK;
}

static int config_int(const dt_model_state_t *s, const char *key, int64_t *out)
{
    dt_config_t *cfg;
    int rc = config_of(s, key, &cfg);
    return rc ? rc : dt_config_get_int(cfg, key, out);
}

static int config_float(const dt_model_state_t *s, const char *key, double *out)
{
    dt_config_t *cfg;
    int rc = config_of(s, key, &cfg);
    return rc ? rc : dt_config_get_float(cfg, key, out);
}

static int config_string(const dt_model_state_t *s, const char *key, const char **out)
{
    dt_config_t *cfg;
    int rc = config_of(s, key, &cfg);
    return rc ? rc : dt_config_get_string(cfg, key, out);
}

static int config_bool(const dt_model_state_t *s, const char *key, int *out)
{
    dt_config_t *cfg;
    int rc = config_of(s, key, &cfg);
    return rc ? rc : dt_config_get_bool(cfg, key, out);
}

static int config_origin(const dt_model_state_t *s, const char *key)
{
    dt_config_t *cfg;
    if (config_of(s, key, &cfg))
        return DT_MODEL_ORIGIN_DEFAULT;
    switch (dt_config_origin(cfg, key)) {
    case DT_ORIGIN_FILE: return DT_MODEL_ORIGIN_FILE;
    case DT_ORIGIN_CLI: return DT_MODEL_ORIGIN_CLI;
    case DT_ORIGIN_DERIVED: return DT_MODEL_ORIGIN_DERIVED;
    case DT_ORIGIN_PRESET: return DT_MODEL_ORIGIN_PRESET;
    default: return DT_MODEL_ORIGIN_DEFAULT;
    }
}

static int config_set_preset(dt_model_state_t *s, const char *key, const dt_model_key_t *v)
{
    dt_config_t *cfg;
    int rc = config_of(s, key, &cfg);
    if (rc)
        return rc;
    switch (v->kind) {
    case DT_MODEL_KEY_INT: return dt_config_set_int(cfg, key, v->value, DT_ORIGIN_PRESET);
    case DT_MODEL_KEY_BOOL: return dt_config_set_bool(cfg, key, v->value != 0, DT_ORIGIN_PRESET);
    case DT_MODEL_KEY_FLOAT: return dt_config_set_float(cfg, key, v->f, DT_ORIGIN_PRESET);
    case DT_MODEL_KEY_CHOICE:
        return dt_config_set_choice(cfg, key, v->s ? v->s : "", DT_ORIGIN_PRESET);
    default:
        return dt_err_set(DT_ERR_INVALID, "model: %s: a preset value of unknown kind %d", key,
                          (int)v->kind);
    }
}

static int alloc_units(dt_model_state_t *s, uint32_t n) { return dt_model_alloc_units(M(s), n); }

static int name_unit(dt_model_state_t *s, uint32_t unit, const char *name)
{
    return dt_model_name_unit(M(s), unit, name);
}

static int add_param(dt_model_state_t *s, uint32_t unit, const char *name, int ndim, int64_t d0,
                     int64_t d1, int kind, double std)
{
    return dt_model_add_param(M(s), unit, name, ndim, d0, d1, kind, std);
}

static int part(dt_model_state_t *s, uint32_t unit, int64_t g0, int64_t g1, uint32_t n_blocks,
                const dt_param_block_t *blocks)
{
    return dt_model_part(M(s), unit, g0, g1, n_blocks, blocks);
}

static void add_key(dt_model_state_t *s, const dt_model_key_t *k) { dt_model_add_key(M(s), k); }

static int missing_kernel(const dt_model_state_t *s, const char *kernel)
{
    return dt_model_missing_kernel(CM(s), kernel);
}

static int dalloc(dt_model_state_t *s, const dt_model_ctx_t *ctx, int64_t n, size_t es,
                  void *out)
{
    return dt_model_dalloc(M(s), ctx, n, es, out);
}

static int recomputes(const dt_model_state_t *s, int64_t l)
{
    return dt_model_recomputes(CM(s), l);
}

static int keeps(const dt_model_state_t *s, uint32_t u) { return dt_model_keeps(CM(s), u); }

static int hook(const dt_model_state_t *s, const dt_model_ctx_t *ctx, int phase,
                const dt_hook_t *h, uint32_t unit, int last_use, dt_unit_buffers_t *buf)
{
    return dt_model_hook(CM(s), ctx, phase, h, unit, last_use, buf);
}

static int view(dt_model_state_t *s, const dt_model_ctx_t *ctx, uint32_t unit,
                const void *params, int need_act, dt_unit_view_t *v)
{
    return dt_model_view(M(s), ctx, unit, params, need_act, v);
}

static int probing(const dt_model_state_t *s) { return dt_model_probing(CM(s)); }

static int probe(dt_model_state_t *s, const dt_model_ctx_t *ctx, const char *what,
                 uint32_t unit, const char *after, const void *x, int dtype, uint64_t n)
{
    return dt_model_probe(M(s), ctx, what, unit, after, x, dtype, n);
}

static int loss_forward(dt_model_state_t *s, const dt_model_ctx_t *ctx, uint32_t head)
{
    return dt_model_loss_forward(M(s), ctx, head);
}

static int loss_backward(dt_model_state_t *s, const dt_model_ctx_t *ctx, uint32_t head,
                         void *dlogits, float loss_scale)
{
    return dt_model_loss_backward(M(s), ctx, head, dlogits, loss_scale);
}

static int tp_row_forward(const dt_model_state_t *s, const dt_model_ctx_t *ctx, void *buf,
                          int64_t n, const char *what, uint32_t unit)
{
    return dt_model_tp_row_forward(CM(s), ctx, buf, n, what, unit);
}

static int tp_column_start(const dt_model_state_t *s, const dt_model_ctx_t *ctx, void *buf,
                           int64_t n, const char *what, uint32_t unit, dt_comm_req_t **req)
{
    return dt_model_tp_column_start(CM(s), ctx, buf, n, what, unit, req);
}

static int tp_column_wait(const dt_model_state_t *s, dt_comm_req_t *req, const char *what,
                          uint32_t unit)
{
    return dt_model_tp_column_wait(CM(s), req, what, unit);
}

static int tp_embedding(const dt_model_state_t *s, const dt_model_ctx_t *ctx, void *buf,
                        int64_t n, const char *what, uint32_t unit)
{
    return dt_model_tp_embedding(CM(s), ctx, buf, n, what, unit);
}

static int tp_column_gather(const dt_model_state_t *s, const dt_model_ctx_t *ctx,
                            const void *shard, void *full, int64_t n, const char *what,
                            uint32_t unit)
{
    return dt_model_tp_column_gather(CM(s), ctx, shard, full, n, what, unit);
}

static int tp_column_scatter_start(const dt_model_state_t *s, const dt_model_ctx_t *ctx,
                                   const void *full, void *shard, int64_t n, const char *what,
                                   uint32_t unit, dt_comm_req_t **req)
{
    return dt_model_tp_column_scatter_start(CM(s), ctx, full, shard, n, what, unit, req);
}

static int tp_row_scatter(const dt_model_state_t *s, const dt_model_ctx_t *ctx,
                          const void *full, void *shard, int64_t n, const char *what,
                          uint32_t unit)
{
    return dt_model_tp_row_scatter(CM(s), ctx, full, shard, n, what, unit);
}

static int tp_row_gather(const dt_model_state_t *s, const dt_model_ctx_t *ctx, const void *shard,
                         void *full, int64_t n, const char *what, uint32_t unit)
{
    return dt_model_tp_row_gather(CM(s), ctx, shard, full, n, what, unit);
}

const dt_model_services_t dt_model_services = {
    .struct_size = sizeof(dt_model_services_t),
    .set_error = dt_err_set,
    .err_context = dt_err_context,
    .config_name = config_name,
    .config_int = config_int,
    .config_float = config_float,
    .config_string = config_string,
    .config_bool = config_bool,
    .config_origin = config_origin,
    .config_set_preset = config_set_preset,
    .alloc_units = alloc_units,
    .name_unit = name_unit,
    .add_param = add_param,
    .part = part,
    .add_key = add_key,
    .missing_kernel = missing_kernel,
    .dalloc = dalloc,
    .recomputes = recomputes,
    .keeps = keeps,
    .hook = hook,
    .view = view,
    .probing = probing,
    .probe = probe,
    .loss_forward = loss_forward,
    .loss_backward = loss_backward,
    .tp_row_forward = tp_row_forward,
    .tp_column_start = tp_column_start,
    .tp_column_wait = tp_column_wait,
    .tp_embedding = tp_embedding,
    .tp_column_gather = tp_column_gather,
    .tp_column_scatter_start = tp_column_scatter_start,
    .tp_row_scatter = tp_row_scatter,
    .tp_row_gather = tp_row_gather,
};
