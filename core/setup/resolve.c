/*
 * core/setup/resolve.c - the staged resolve: parse once, override,
 * validate the core's sections into typed settings, load the selected
 * plugins and validate their tables before they get their host tables.
 * Knows which settings select plugins; knows nothing about any particular
 * plugin.
 */
#include "setup/resolve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/log.h"

static const struct {
    const char *name;
    int kind;
    const char *key; /* config key naming the plugin, for messages */
} roles[DT_ROLE_COUNT] = {
    [DT_ROLE_DEVICE] = {"device", DT_KIND_DEVICE, "run.device"},
    [DT_ROLE_COMM] = {"comm", DT_KIND_COMM, "run.comm"},
    [DT_ROLE_DATA] = {"data-parallel strategy", DT_KIND_STRATEGY, "parallel.data"},
    [DT_ROLE_TENSOR] = {"tensor-parallel scheme", DT_KIND_TENSOR, "tensor.scheme"},
    [DT_ROLE_PIPELINE] = {"pipeline schedule", DT_KIND_SCHEDULE, "pipeline.schedule"},
    [DT_ROLE_OFFLOAD] = {"offload tier", DT_KIND_OFFLOAD, "parallel.offload"},
    [DT_ROLE_MODEL] = {"model", DT_KIND_MODEL, "model.arch"},
};

#define DEFAULT_HINT "a plugin's table is named after a plugin on the search path"

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

/* A config error is added to `errs` and the check goes on; any other
 * failure stops it (returned). */
static int keep_going(dt_errlist_t *errs, int rc)
{
    if (rc != DT_ERR_CONFIG)
        return rc;
    dt_errlist_add(errs, NULL);
    return DT_OK;
}

static int rest_stages(dt_resolved_t *r, const char *hint, dt_errlist_t *errs);

int dt_resolve_core(const char *path, const char *const *sets, int n_sets,
                    dt_resolved_t *out)
{
    memset(out, 0, sizeof *out);
    int rc = path ? dt_config_load(path, &out->cfg) : dt_config_new(&out->cfg);
    if (rc) {
        /* a config that cannot be read is the user's input, like a bad one */
        if (rc != DT_ERR_NOMEM)
            rc = DT_ERR_CONFIG;
        goto fail;
    }
    /* every config error of the file is reported at once: a table in error
     * is claimed all the same (its values in error at their defaults), so
     * the checks go on through every section */
    dt_errlist_t errs = {.n = 0};
    for (int i = 0; i < n_sets; i++)
        if ((rc = keep_going(&errs, dt_config_override(out->cfg, sets[i]))))
            goto fail;
    for (uint32_t i = 0; i < dt_core_n_sections; i++) {
        const dt_config_section_t *s = &dt_core_sections[i];
        if ((rc = keep_going(&errs, dt_config_apply_schema(out->cfg, s->table, s->keys,
                                                           s->n_keys))))
            goto fail;
    }
    rc = dt_settings_read(out->cfg, &out->set);
    if (rc == DT_OK)
        rc = dt_search_path_new(out->set.run.plugin_path, &out->search);
    else if ((rc = keep_going(&errs, rc)) == DT_OK)
        goto report; /* without settings, no plugin can be chosen */
    if (rc)
        goto fail;
    if (errs.n == 0)
        return DT_OK;
    /* the rest of the file too: the tables of the plugins it selects, and
     * tables nothing claims (the values in error stand at their defaults,
     * which select plugins as an unset key would) */
    rest_stages(out, NULL, &errs); /* a failure that is not the config's shows later */
report:
    rc = dt_errlist_fail(&errs, DT_ERR_CONFIG);
fail:
    dt_resolved_free(out);
    return rc;
}

int dt_resolve_set(dt_resolved_t *r, const char *assignment)
{
    int rc = dt_config_override(r->cfg, assignment);
    return rc ? rc : dt_settings_read(r->cfg, &r->set);
}

/* The plugin the settings select for `role`, or NULL when the role is
 * unused. */
static int role_plugin_name(const dt_resolved_t *r, dt_role_t role, const char **name)
{
    const dt_settings_t *s = &r->set;
    const char *v = NULL;
    *name = NULL;
    switch (role) {
    case DT_ROLE_DEVICE: v = s->run.device; break;
    case DT_ROLE_COMM: v = s->run.comm; break;
    case DT_ROLE_DATA: v = s->parallel.data; break;
    case DT_ROLE_OFFLOAD: v = s->parallel.offload; break;
    case DT_ROLE_MODEL: /* [model] is read by the model itself (core/model) */
        if (dt_config_get_string(r->cfg, "model.arch", &v) != DT_OK)
            return DT_OK;
        break;
    case DT_ROLE_TENSOR: /* the scheme, only with a tensor group to run */
        if (s->parallel.tensor <= 1)
            return DT_OK;
        v = s->tensor.scheme;
        break;
    default: /* DT_ROLE_PIPELINE: the schedule, only with stages to run */
        if (s->parallel.pipeline <= 1)
            return DT_OK;
        v = s->pipeline.schedule;
        break;
    }
    if (role == DT_ROLE_OFFLOAD && strcmp(v, "none") == 0)
        return DT_OK;
    char where[1400];
    dt_config_where(r->cfg, roles[role].key, where, sizeof where);
    if (role == DT_ROLE_DATA && strcmp(v, "none") == 0)
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: a data-parallel strategy is required to hold "
                          "parameters (use \"ddp\", which is exact for one process)",
                          where);
    if (!v[0])
        return dt_err_set(DT_ERR_CONFIG, "%s: %s is empty: name a %s plugin", where,
                          roles[role].key, roles[role].name);
    *name = v;
    return DT_OK;
}

/* After "<kind> plugin 'fsdq' not found in: ...": append "; did you mean
 * 'fsdp'?" when a plugin of that kind on the search path is close.  The
 * status and the message are kept whatever the search finds. */
static int suggest_plugin(const dt_resolved_t *r, int rc, int kind, const char *name)
{
    char msg[DT_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", dt_last_error());
    dt_plugin_listing_t *ls = NULL;
    size_t n = 0;
    const char *best = NULL;
    const char **names = NULL;
    if (dt_plugin_discover(r->search, &ls, &n) == DT_OK && n > 0 &&
        (names = malloc(n * sizeof *names)) != NULL) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (ls[i].kind == kind)
                names[k++] = ls[i].name;
        best = dt_suggest(name, names, k);
    }
    if (best)
        dt_err_set(rc, "%s; did you mean '%s'?", msg, best);
    else
        dt_err_set(rc, "%s", msg);
    free(names);
    free(ls);
    return rc;
}

int dt_resolve_plugin(dt_resolved_t *r, dt_role_t role, const char *name,
                      const char *named_by)
{
    int rc = DT_OK;
    if (!name && (rc = role_plugin_name(r, role, &name)))
        return rc;
    dt_plugin_t *have = r->plugin[role];
    if (have && name && strcmp(have->name, name) == 0)
        return DT_OK;
    r->plugin[role] = NULL;
    dt_plugin_unload(have);
    if (!name)
        return DT_OK;
    dt_plugin_t *p = NULL;
    rc = dt_plugin_open(r->search, roles[role].kind, name, &p);
    if (rc) {
        /* naming a plugin that does not exist, or by a name no plugin can
         * have, is a config error; one that exists but is broken is the
         * installation's problem */
        const int not_found = rc == DT_ERR_NOT_FOUND;
        if (not_found || !dt_plugin_name_ok(name))
            rc = DT_ERR_CONFIG;
        if (not_found)
            suggest_plugin(r, rc, roles[role].kind, name);
        if (named_by) {
            dt_err_context(rc, "%s", named_by);
        } else if (roles[role].key) {
            /* blame the value where it was written: the file, or --set */
            char where[1400];
            dt_config_where(r->cfg, roles[role].key, where, sizeof where);
            dt_err_context(rc, "%s", where);
        }
        return rc;
    }
    /* the table is checked before the plugin gets a host table to read it */
    rc = dt_config_apply_schema(r->cfg, name, p->info->config_keys, p->info->n_config_keys);
    if (rc == DT_OK)
        rc = dt_plugin_bind(p, r->cfg);
    if (rc) {
        dt_plugin_unload(p);
        return rc;
    }
    r->plugin[role] = p;
    return DT_OK;
}

/* Every role, a config error of one not stopping the others. */
static int plugin_stage(dt_resolved_t *r, dt_errlist_t *errs)
{
    int rc = DT_OK;
    for (int role = 0; role < DT_ROLE_COUNT && rc == DT_OK; role++)
        rc = keep_going(errs, dt_resolve_plugin(r, (dt_role_t)role, NULL, NULL));
    return rc;
}

int dt_resolve_plugins(dt_resolved_t *r)
{
    dt_errlist_t errs = {.n = 0};
    int rc = plugin_stage(r, &errs);
    return rc ? rc : dt_errlist_fail(&errs, DT_ERR_CONFIG);
}

/* The most unclaimed tables looked at; more than this many tables no
 * plugin claims is a config for something else. */
#define MAX_UNCLAIMED 64

/* The tables the config writes for plugins on the search path that it does
 * not select: each checked against its plugin's keys, then set aside (its
 * errors added to errs). */
static int set_aside_unselected(const dt_resolved_t *r, dt_errlist_t *errs)
{
    const char *names[MAX_UNCLAIMED];
    size_t n = dt_config_unclaimed(r->cfg, names, MAX_UNCLAIMED);
    if (n == 0)
        return DT_OK;
    if (n > MAX_UNCLAIMED)
        n = MAX_UNCLAIMED;
    dt_plugin_listing_t *ls = NULL;
    size_t nl = 0;
    int rc = dt_plugin_discover(r->search, &ls, &nl);
    for (size_t i = 0; rc == DT_OK && i < n; i++) {
        for (size_t j = 0; j < nl; j++) {
            if (strcmp(ls[j].name, names[i]) != 0 || !ls[j].loadable || ls[j].kind < 0)
                continue;
            dt_plugin_t *p = NULL;
            if ((rc = dt_plugin_open(r->search, ls[j].kind, ls[j].name, &p)) == DT_OK)
                rc = keep_going(errs, dt_config_set_aside(r->cfg, ls[j].name,
                                                          p->info->config_keys,
                                                          p->info->n_config_keys));
            dt_plugin_unload(p);
            break;
        }
    }
    free(ls);
    return rc;
}

static int finish_stage(const dt_resolved_t *r, const char *hint, dt_errlist_t *errs)
{
    int rc = set_aside_unselected(r, errs);
    return rc ? rc : keep_going(errs, dt_config_check_unclaimed(r->cfg, hint ? hint
                                                                             : DEFAULT_HINT));
}

int dt_resolve_finish(const dt_resolved_t *r, const char *hint)
{
    dt_errlist_t errs = {.n = 0};
    int rc = finish_stage(r, hint, &errs);
    return rc ? rc : dt_errlist_fail(&errs, DT_ERR_CONFIG);
}

static int rest_stages(dt_resolved_t *r, const char *hint, dt_errlist_t *errs)
{
    int rc = plugin_stage(r, errs);
    return rc ? rc : finish_stage(r, hint, errs);
}

int dt_resolve_rest(dt_resolved_t *r, const char *hint)
{
    dt_errlist_t errs = {.n = 0};
    int rc = rest_stages(r, hint, &errs);
    return rc ? rc : dt_errlist_fail(&errs, DT_ERR_CONFIG);
}

int dt_resolve(const char *path, const char *const *sets, int n_sets,
               dt_resolved_t *out)
{
    int rc = dt_resolve_core(path, sets, n_sets, out);
    if (rc)
        return rc;
    if ((rc = dt_resolve_rest(out, NULL)))
        dt_resolved_free(out);
    return rc;
}

int dt_resolve_cleanup_job(void *resolved, const char *job_id)
{
    dt_resolved_t *r = resolved;
    if (!r->plugin[DT_ROLE_COMM] && dt_resolve_plugin(r, DT_ROLE_COMM, NULL, NULL) != DT_OK) {
        dt_log(DT_LOG_DEBUG, "launch", "no cleanup after job %s: %s", job_id,
               dt_last_error());
        dt_err_clear();
        return DT_OK;
    }
    int rc = dt_plugin_cleanup_job(r->plugin[DT_ROLE_COMM], job_id);
    /* the offload tier's files too (offload_nvme), through its own slot */
    if (!r->plugin[DT_ROLE_OFFLOAD] && dt_resolve_plugin(r, DT_ROLE_OFFLOAD, NULL, NULL) != DT_OK) {
        dt_log(DT_LOG_DEBUG, "launch", "no offload cleanup after job %s: %s", job_id,
               dt_last_error());
        dt_err_clear();
        return rc;
    }
    if (r->plugin[DT_ROLE_OFFLOAD]) {
        char first[DT_ERR_MAX];
        snprintf(first, sizeof first, "%s", rc ? dt_last_error() : "");
        int orc = dt_plugin_cleanup_job(r->plugin[DT_ROLE_OFFLOAD], job_id);
        if (rc) /* the communicator's failure is the one reported */
            return dt_err_set(rc, "%s", first);
        rc = orc;
    }
    return rc;
}
