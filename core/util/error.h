/*
 * core/util/error.h - the one thread-local error message of the process.
 *
 * Every failing core function sets it (dt_err_set) and returns a status;
 * callers add context as the error travels up (dt_err_context), so the user
 * reads "loading checkpoint ckpt/step-200: shard 3: checksum mismatch".
 * Plugins reach the same buffer through the host table's set_error.
 */
#ifndef DT_CORE_ERROR_H
#define DT_CORE_ERROR_H

#include "dtrain/host.h"
#include "dtrain/status.h"

#define DT_ERR_MAX 4096

/* Replace the message; returns `status` so callers `return dt_err_set(...)`. */
int dt_err_set(int status, const char *fmt, ...) DT_PRINTF(2, 3);
/* Prepend "<context>: " to the current message; returns `status`. */
int dt_err_context(int status, const char *fmt, ...) DT_PRINTF(2, 3);
/* The current message ("" when none).  Owned by the core; do not free. */
const char *dt_last_error(void);
void dt_err_clear(void);

#endif /* DT_CORE_ERROR_H */
