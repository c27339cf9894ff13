/*
 * core/loader/host_services.h - the per-plugin host services table
 * (dtrain/host.h) and the core's log line format, which plugins share.
 *
 * The loader builds one dt_host_v1_t per loaded plugin: its set_error and
 * log know the plugin ("comm/shm: "), its alloc accounts host memory per
 * tag for that plugin, its cfg_* read the plugin's own config table.
 *
 * Log lines go to stderr as "[rank R] who: message" (R is "?" until
 * dt_log_set_rank), filtered by DTRAIN_LOG=error|warn|info|debug (default
 * info).
 */
#ifndef DT_CORE_HOST_SERVICES_H
#define DT_CORE_HOST_SERVICES_H

#include <stdarg.h>
#include <stdint.h>

#include "config/config.h"
#include "dtrain/dtrain.h"
#include "loader/loader.h"

/* The rank printed in every log line; < 0 prints "?". */
void dt_log_set_rank(int rank);
/* The current threshold (dt_log_level_t): DTRAIN_LOG on first use unless
 * dt_log_set_level was called. */
int dt_log_level(void);
/* Override DTRAIN_LOG (tests, --verbose); a level < 0 re-reads DTRAIN_LOG. */
void dt_log_set_level(int level);
/* Parse "error|warn|info|debug" (case-insensitive); -1 when unknown. */
int dt_log_level_from_name(const char *name);
/* Write "[rank R] who: message" to stderr when `level` passes the
 * threshold.  One write per line, so lines of threads do not interleave. */
void dt_log(int level, const char *who, const char *fmt, ...) DT_PRINTF(3, 4);
void dt_logv(int level, const char *who, const char *fmt, va_list ap);

/* Build p's host table (p->kind, p->name and p->info must be set) and
 * point p->host at it.  `cfg` may be NULL: then cfg_* read the defaults the
 * plugin declares (when every key has one).  Freed by dt_host_destroy. */
int dt_host_create(dt_plugin_t *p, const dt_config_t *cfg);
/* Free p's host table; warns when the plugin still holds host memory. */
void dt_host_destroy(dt_plugin_t *p);

/* Re-point the plugin's cfg_* at `cfg` (NULL: back to declared defaults),
 * e.g. when the config is resolved after the plugin was loaded. */
int dt_plugin_host_bind_config(dt_plugin_t *p, const dt_config_t *cfg);

/* Host memory the plugin holds through its table, per tag, with peaks. */
int dt_plugin_host_mem_stats(const dt_plugin_t *p, dt_mem_stats_t *out);
/* Start a measured phase: every peak becomes its current value. */
int dt_plugin_host_mem_reset_peaks(const dt_plugin_t *p);
/* Host memory budget for this plugin in bytes (0 = none); alloc past it
 * fails with DT_ERR_NOMEM. */
int dt_plugin_host_set_mem_limit(const dt_plugin_t *p, uint64_t limit);

#endif /* DT_CORE_HOST_SERVICES_H */
