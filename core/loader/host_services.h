/*
 * core/loader/host_services.h - the per-plugin host services table
 * (dtrain/host.h).
 *
 * The loader builds one dt_host_t per loaded plugin: its set_error and
 * log know the plugin ("comm/shm: "), its alloc accounts host memory per
 * tag for that plugin, its cfg_* read the plugin's own config table.  Its
 * log writes the core's log line (util/log.h).
 */
#ifndef DT_CORE_HOST_SERVICES_H
#define DT_CORE_HOST_SERVICES_H

#include <stdint.h>

#include "config/config.h"
#include "dtrain/dtrain.h"
#include "loader/plugin_handle.h"

/* Build p's host table (p->kind, p->name and p->info must be set) and
 * point p->host at it; the loader's dt_plugin_bind does, once the plugin's
 * config table is checked.  `cfg` may be NULL: then cfg_* read the defaults
 * the plugin declares (when every key has one).  Freed by
 * dt_host_destroy. */
int dt_host_create(dt_plugin_t *p, const dt_config_t *cfg);
/* Free p's host table; warns when the plugin still holds host memory. */
void dt_host_destroy(dt_plugin_t *p);

/* Host memory the plugin holds through its table, per tag, with peaks
 * (n_tags = DT_TAG_COUNT).  `out` is the caller's: zero-filled with
 * struct_size set; written under the growth rule (abi.h rule 4). */
int dt_plugin_host_mem_stats(const dt_plugin_t *p, dt_mem_stats_t *out);
/* The part of it held by other means than alloc (mem_account: a shared
 * mapping, such as a communicator's symmetric memory, which it maps on a
 * strategy's behalf under the strategy's tag).  The same contract. */
int dt_plugin_host_accounted_stats(const dt_plugin_t *p, dt_mem_stats_t *out);

#endif /* DT_CORE_HOST_SERVICES_H */
