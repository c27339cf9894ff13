/*
 * dtrain/status.h - the status codes every dtrain ABI function returns.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Every function that crosses the plugin boundary returns an `int` that is
 * one of these codes.  The numbers are stable: never renumber, only append.
 * The human-readable message for a failure is not returned; it lives in the
 * core's thread-local error buffer (see host.h: dt_host_v1_t.set_error and
 * the core's dt_last_error()).
 */
#ifndef DTRAIN_STATUS_H
#define DTRAIN_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dt_status {
    DT_OK = 0,
    /* An OS or library call failed (errno, BLAS, driver).  Use for
     * conditions outside the caller's control. */
    DT_ERR_SYSTEM = 1,
    /* The caller broke the API contract: NULL handle, bad size, wrong
     * order of calls.  A bug in dtrain or in a plugin, not in user input. */
    DT_ERR_INVALID = 2,
    /* A configuration value is wrong (type, range, combination).  The
     * message names the file, line, key. */
    DT_ERR_CONFIG = 3,
    /* Out of memory, or over a configured memory budget.  The message names
     * the tag and the sizes. */
    DT_ERR_NOMEM = 4,
    /* A named thing (plugin, file, tensor, key) does not exist. */
    DT_ERR_NOT_FOUND = 5,
    /* The operation exists in the ABI but this plugin/build does not
     * implement it (an optional method absent, a dtype not handled). */
    DT_ERR_UNSUPPORTED = 6,
    /* A bounded wait expired (collective, rendezvous, I/O). */
    DT_ERR_TIMEOUT = 7,
    /* A peer rank failed or aborted; this rank is healthy but cannot go on. */
    DT_ERR_REMOTE = 8,
    /* Reading or writing a file failed (short read, ENOSPC, EIO). */
    DT_ERR_IO = 9,
    /* A plugin's ABI does not match this dtrain (major, struct size, a
     * NULL mandatory method, name mismatch). */
    DT_ERR_ABI = 10,
    /* Numbers went non-finite (NaN/Inf in loss, gradients or parameters). */
    DT_ERR_NUMERIC = 11,
    /* Stored data is corrupt or inconsistent (checksum, magic, manifest). */
    DT_ERR_DATA = 12,
    /* The operation was cancelled by dt_comm abort or a signal. */
    DT_ERR_ABORTED = 13
    /* ---- append only ---- */
} dt_status_t;

/* A short stable name for a status ("DT_ERR_TIMEOUT"), never NULL. */
static inline const char *dt_status_name(int s)
{
    switch (s) {
    case DT_OK: return "DT_OK";
    case DT_ERR_SYSTEM: return "DT_ERR_SYSTEM";
    case DT_ERR_INVALID: return "DT_ERR_INVALID";
    case DT_ERR_CONFIG: return "DT_ERR_CONFIG";
    case DT_ERR_NOMEM: return "DT_ERR_NOMEM";
    case DT_ERR_NOT_FOUND: return "DT_ERR_NOT_FOUND";
    case DT_ERR_UNSUPPORTED: return "DT_ERR_UNSUPPORTED";
    case DT_ERR_TIMEOUT: return "DT_ERR_TIMEOUT";
    case DT_ERR_REMOTE: return "DT_ERR_REMOTE";
    case DT_ERR_IO: return "DT_ERR_IO";
    case DT_ERR_ABI: return "DT_ERR_ABI";
    case DT_ERR_NUMERIC: return "DT_ERR_NUMERIC";
    case DT_ERR_DATA: return "DT_ERR_DATA";
    case DT_ERR_ABORTED: return "DT_ERR_ABORTED";
    default: return "DT_ERR_UNKNOWN";
    }
}

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_STATUS_H */
