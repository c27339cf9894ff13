/*
 * core/setup/resolve.c - parse, override, validate, load plugins, validate
 * their tables.  Knows which config keys select plugins; knows nothing
 * about any particular plugin.
 */
#include "setup/resolve.h"

#include <stdio.h>
#include <string.h>

#include "util/error.h"

static const struct {
    const char *name;
    int kind;
    const char *key; /* config key naming the plugin */
} roles[DT_ROLE_COUNT] = {
    [DT_ROLE_DEVICE] = {"device", DT_KIND_DEVICE, "run.device"},
    [DT_ROLE_COMM] = {"comm", DT_KIND_COMM, "run.comm"},
    [DT_ROLE_DATA] = {"data-parallel strategy", DT_KIND_STRATEGY, "parallel.data"},
    [DT_ROLE_TENSOR] = {"tensor-parallel strategy", DT_KIND_STRATEGY, NULL},
    [DT_ROLE_PIPELINE] = {"pipeline strategy", DT_KIND_STRATEGY, NULL},
    [DT_ROLE_OFFLOAD] = {"offload tier", DT_KIND_OFFLOAD, "parallel.offload"},
};

int dt_role_kind(dt_role_t role) { return roles[role].kind; }
const char *dt_role_name(dt_role_t role) { return roles[role].name; }

void dt_resolved_free(dt_resolved_t *r)
{
    if (!r)
        return;
    for (int i = 0; i < DT_ROLE_COUNT; i++)
        dt_plugin_unload(r->plugin[i]);
    dt_search_path_free(r->search);
    dt_config_free(r->cfg);
    memset(r, 0, sizeof *r);
}

/* The plugin name a role selects, or NULL when the role is unused. */
static int role_plugin_name(const dt_config_t *cfg, dt_role_t role,
                            const char **name)
{
    *name = NULL;
    if (role == DT_ROLE_TENSOR || role == DT_ROLE_PIPELINE) {
        int64_t n = 1;
        int rc = dt_config_get_int(
            cfg, role == DT_ROLE_TENSOR ? "parallel.tensor" : "parallel.pipeline", &n);
        if (rc)
            return rc;
        if (n > 1)
            *name = role == DT_ROLE_TENSOR ? "tensor" : "pipeline";
        return DT_OK;
    }
    const char *v = NULL;
    int rc = dt_config_get_string(cfg, roles[role].key, &v);
    if (rc)
        return rc;
    if (role == DT_ROLE_OFFLOAD && strcmp(v, "none") == 0)
        return DT_OK;
    if (role == DT_ROLE_DATA && strcmp(v, "none") == 0)
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: parallel.data = \"none\": a data-parallel strategy is "
                          "required to hold parameters (use \"ddp\", which is exact "
                          "for one process)",
                          dt_config_path(cfg));
    if (!v[0])
        return dt_err_set(DT_ERR_CONFIG, "%s: %s is empty: name a %s plugin",
                          dt_config_path(cfg), roles[role].key, roles[role].name);
    *name = v;
    return DT_OK;
}

int dt_resolve(const char *path, const char *const *sets, int n_sets,
               dt_resolved_t *out)
{
    return dt_resolve_ex(path, sets, n_sets, 0, out);
}

int dt_resolve_ex(const char *path, const char *const *sets, int n_sets, unsigned flags,
                  dt_resolved_t *out)
{
    memset(out, 0, sizeof *out);
    int rc = dt_config_load(path, &out->cfg);
    if (rc) {
        /* a config that cannot be read is the user's input, like a bad one */
        if (rc != DT_ERR_NOMEM)
            rc = DT_ERR_CONFIG;
        goto fail;
    }
    for (int i = 0; i < n_sets; i++)
        if ((rc = dt_config_override(out->cfg, sets[i])))
            goto fail;
    for (uint32_t i = 0; i < dt_core_n_sections; i++) {
        const dt_config_section_t *s = &dt_core_sections[i];
        if ((rc = dt_config_apply_schema(out->cfg, s->table, s->keys, s->n_keys)))
            goto fail;
    }
    const char *plugin_path;
    if ((rc = dt_config_get_string(out->cfg, "run.plugin_path", &plugin_path)) ||
        (rc = dt_search_path_new(plugin_path, &out->search)))
        goto fail;
    for (int role = 0; role < DT_ROLE_COUNT; role++) {
        const char *name;
        if ((rc = role_plugin_name(out->cfg, (dt_role_t)role, &name)))
            goto fail;
        if (!name)
            continue;
        rc = dt_plugin_open(out->search, roles[role].kind, name, &out->plugin[role]);
        if (rc) {
            /* naming a plugin that does not exist is a config error; one
             * that exists but is broken is the installation's problem */
            if (rc == DT_ERR_NOT_FOUND)
                rc = DT_ERR_CONFIG;
            if (roles[role].key)
                dt_err_context(rc, "%s: %s = \"%s\"", dt_config_path(out->cfg),
                               roles[role].key, name);
            goto fail;
        }
        const dt_plugin_info_t *info = out->plugin[role]->info;
        rc = dt_config_apply_schema(out->cfg, name, info->config_keys,
                                    info->n_config_keys);
        if (rc || (rc = dt_plugin_bind(out->plugin[role], out->cfg)))
            goto fail;
    }
    if (flags & DT_RESOLVE_OTHER_TABLES_OK)
        return DT_OK;
    rc = dt_config_check_unclaimed(
        out->cfg, "a plugin's table is named after the plugin and only allowed "
                  "when the config selects it");
    if (rc)
        goto fail;
    return DT_OK;
fail:
    dt_resolved_free(out);
    return rc;
}
