/*
 * core/setup/resolve.h - from a config file to a validated configuration
 * with its plugins loaded, in stages, the file parsed once.
 *
 *   dt_resolve_core     parse the TOML (or start empty), apply the --set
 *                       overrides, check the core's sections, read them into
 *                       typed settings (config/settings.h) and build the
 *                       plugin search path (run.plugin_path)
 *   dt_resolve_plugins  for each role the settings select (run.device,
 *                       run.comm, parallel.data, parallel.offload,
 *                       model.arch,
 *                       tensor.scheme when parallel.tensor is above 1 and
 *                       pipeline.schedule when parallel.pipeline is): load
 *                       the plugin (which checks its ABI), check its table
 *                       against the keys it declares, then give it its host
 *                       table; dt_resolve_plugin does one role
 *   dt_resolve_finish   check the tables of plugins the config does not
 *                       select against their keys and set them aside;
 *                       reject any other table nothing claimed
 *
 * `dtrain check` and `dtrain run` go through every stage (dt_resolve); the
 * launching parent of `dtrain run` stops after the core stage; `dtrain
 * plan` changes the selection between estimates (dt_resolve_set) and skips
 * the last stage; `dtrain bench comm` loads only a comm plugin.
 *
 * Config errors are reported all at once (up to DT_ERRLIST_MAX of them,
 * one a line of the message): a stage goes on past a config error, and a
 * table in error is claimed all the same, its values in error at their
 * defaults, so the stages after it can check the rest of the file.  When
 * the core stage finds config errors it runs the later stages too, only
 * for their errors, before it fails.
 */
#ifndef DT_SETUP_RESOLVE_H
#define DT_SETUP_RESOLVE_H

#include "config/config.h"
#include "config/settings.h"
#include "loader/loader.h"

/* Roles a plugin plays in a run. */
typedef enum dt_role {
    DT_ROLE_DEVICE = 0,
    DT_ROLE_COMM,
    DT_ROLE_DATA,     /* data-parallel strategy (ddp, zero, fsdp) */
    DT_ROLE_TENSOR,   /* tensor-parallel scheme (kind tensor) */
    DT_ROLE_PIPELINE, /* pipeline schedule (kind schedule) */
    DT_ROLE_OFFLOAD,
    DT_ROLE_MODEL,    /* the architecture (kind model), [model] arch */
    DT_ROLE_COUNT
} dt_role_t;

typedef struct dt_resolved {
    dt_config_t *cfg;
    dt_settings_t set;                  /* the core's sections, typed */
    dt_search_path_t *search;           /* where plugins are looked for */
    dt_plugin_t *plugin[DT_ROLE_COUNT]; /* NULL when the role is unused
                                         * or not resolved yet */
} dt_resolved_t;

/* The core stage of `path` (NULL: no file, the core's defaults) with
 * `n_sets` "--set" assignments.  On failure everything is released and the
 * message says what is wrong; the status is DT_ERR_CONFIG for bad input
 * (an unreadable file included), another code for system failures. */
int dt_resolve_core(const char *path, const char *const *sets, int n_sets,
                    dt_resolved_t *out);

/* Apply one more "table.key=value" after the core stage (dt_config_override:
 * a table already claimed changes at once) and read the settings again.
 * The search path stays as built. */
int dt_resolve_set(dt_resolved_t *r, const char *assignment);

/* Resolve `role`: its plugin `name`, or the one the settings select when
 * `name` is NULL (none: the role is left empty).  A plugin already loaded
 * for the role under that name is kept; another is unloaded first.
 * Messages about a plugin that cannot be loaded start with `named_by`
 * ("--comm shmm"), or by default "<file>: run.comm = \"shmm\"".  On
 * failure the role is empty and the rest of *r stays valid. */
int dt_resolve_plugin(dt_resolved_t *r, dt_role_t role, const char *name,
                      const char *named_by);
/* The model plugin's table (DT_ROLE_MODEL), NULL before it is resolved. */
static inline const dt_model_ops_t *dt_resolved_model(const dt_resolved_t *r)
{
    return r->plugin[DT_ROLE_MODEL] ? (const dt_model_ops_t *)r->plugin[DT_ROLE_MODEL]->ops
                                    : NULL;
}
/* The tensor-parallel scheme's table (DT_ROLE_TENSOR) and name, NULL
 * without a tensor group. */
static inline const dt_tensor_ops_t *dt_resolved_tensor(const dt_resolved_t *r)
{
    return r->plugin[DT_ROLE_TENSOR] ? (const dt_tensor_ops_t *)r->plugin[DT_ROLE_TENSOR]->ops
                                     : NULL;
}
static inline const char *dt_resolved_tensor_name(const dt_resolved_t *r)
{
    return r->plugin[DT_ROLE_TENSOR] ? r->plugin[DT_ROLE_TENSOR]->name : NULL;
}
/* dt_resolve_plugin for every role, from the settings. */
int dt_resolve_plugins(dt_resolved_t *r);

/* Check the table of every plugin on the search path the config does not
 * select against that plugin's keys and set it aside (dt_config_set_aside:
 * one file may configure every strategy); reject any other table no stage
 * claimed.  `hint` (NULL: the default, that a plugin's table is named
 * after a plugin on the search path) ends the message. */
int dt_resolve_finish(const dt_resolved_t *r, const char *hint);

/* dt_resolve_plugins, then dt_resolve_finish even when the first found
 * config errors: the message holds both stages' errors. */
int dt_resolve_rest(dt_resolved_t *r, const char *hint);

/* Every stage; on failure everything is released. */
int dt_resolve(const char *path, const char *const *sets, int n_sets,
               dt_resolved_t *out);
void dt_resolved_free(dt_resolved_t *r);

/* For dt_launch_opts_t.cleanup, with `resolved` a dt_resolved_t after the
 * core stage: call the selected comm plugin's cleanup_job for `job_id`
 * (loading the plugin when it is not yet; nothing when it has no such
 * slot, or cannot be loaded, since then no rank could have used it). */
int dt_resolve_cleanup_job(void *resolved, const char *job_id);

/* The plugin kind each role needs. */
int dt_role_kind(dt_role_t role);
const char *dt_role_name(dt_role_t role);

#endif /* DT_SETUP_RESOLVE_H */
