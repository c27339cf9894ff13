/*
 * core/util/log.h - the core's log line, which plugins share through their
 * host table's log (core/loader/host_services.c prefixes "kind/name").
 *
 * Log lines go to stderr as "[rank R] who: message" (R is "?" until
 * dt_log_set_rank), filtered by DTRAIN_LOG=error|warn|info|debug (default
 * info).
 */
#ifndef DT_CORE_LOG_H
#define DT_CORE_LOG_H

#include <stdarg.h>

#include "dtrain/host.h" /* dt_log_level_t, DT_PRINTF */

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

#endif /* DT_CORE_LOG_H */
