/*
 * core/setup/resolve.h - from a config file to a validated configuration
 * with its plugins loaded.
 *
 * Resolution: parse the TOML, apply --set overrides, check the core's
 * sections, find which plugins the config selects (run.device, run.comm,
 * parallel.data, parallel.offload, and tensor/pipeline when their sizes are
 * above 1), load each one (which checks its ABI), check each plugin's table
 * against the keys it declares, and finally reject any table nothing
 * claimed.  `dtrain check` stops here; `dtrain run` goes on to train.
 */
#ifndef DT_SETUP_RESOLVE_H
#define DT_SETUP_RESOLVE_H

#include "config/config.h"
#include "loader/loader.h"

/* Roles a plugin plays in a run. */
typedef enum dt_role {
    DT_ROLE_DEVICE = 0,
    DT_ROLE_COMM,
    DT_ROLE_DATA,     /* data-parallel strategy (ddp, zero, fsdp) */
    DT_ROLE_TENSOR,   /* tensor-parallel strategy */
    DT_ROLE_PIPELINE, /* pipeline strategy */
    DT_ROLE_OFFLOAD,
    DT_ROLE_COUNT
} dt_role_t;

typedef struct dt_resolved {
    dt_config_t *cfg;
    dt_search_path_t *search;           /* where plugins are looked for */
    dt_plugin_t *plugin[DT_ROLE_COUNT]; /* NULL when the role is unused */
} dt_resolved_t;

/* Resolve `path` with `n_sets` "--set" assignments.  On failure everything
 * is released and the message says what is wrong; the status is
 * DT_ERR_CONFIG for bad input, another code for system failures. */
int dt_resolve(const char *path, const char *const *sets, int n_sets,
               dt_resolved_t *out);
void dt_resolved_free(dt_resolved_t *r);

/* dt_resolve with flags: DT_RESOLVE_OTHER_TABLES_OK skips the final
 * unclaimed-table check, for tools that re-resolve one config with other
 * plugins selected (`dtrain plan` selects each strategy in turn while the
 * file may configure another). */
#define DT_RESOLVE_OTHER_TABLES_OK 0x1u
int dt_resolve_ex(const char *path, const char *const *sets, int n_sets, unsigned flags,
                  dt_resolved_t *out);

/* The plugin kind each role needs. */
int dt_role_kind(dt_role_t role);
const char *dt_role_name(dt_role_t role);

#endif /* DT_SETUP_RESOLVE_H */
