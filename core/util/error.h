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

/* A bounded list of error messages, one a line, for checks that report
 * every problem they find at once (a config file's errors).  Lines past
 * DT_ERRLIST_MAX, or past what fits the message buffer, are counted and
 * not kept; a line already in the list is not added again. */
#define DT_ERRLIST_MAX 16
typedef struct dt_errlist {
    char text[DT_ERR_MAX - 128]; /* room left for the "and N more" line */
    size_t len;
    int n;       /* lines kept */
    int dropped; /* lines counted past the bound */
} dt_errlist_t;
/* Add each line of `msg`; NULL adds the current message (dt_last_error). */
void dt_errlist_add(dt_errlist_t *l, const char *msg);
/* DT_OK for an empty list; else the current message becomes the list's
 * lines (and, when some were dropped, "... and N more errors (the first K
 * are shown)") and `status` is returned. */
int dt_errlist_fail(const dt_errlist_t *l, int status);

#endif /* DT_CORE_ERROR_H */
