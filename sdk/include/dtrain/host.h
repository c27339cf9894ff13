/*
 * dtrain/host.h - the services the core hands each plugin instance.
 *
 * Every plugin `init` receives a `const dt_host_v1_t *host`.  The table is
 * per plugin: the core knows which plugin it belongs to, so errors a plugin
 * reports are prefixed "kind/name: " (e.g. "comm/shm: ") without the plugin
 * writing its own name.  Every function takes the table itself as its first
 * argument.  The table stays valid until the plugin's `finalize` returns.
 *
 * Thread safety: all functions may be called from any thread.  The error
 * buffer is thread-local: a plugin sets it on the thread that returns the
 * failing status.
 */
#ifndef DTRAIN_HOST_H
#define DTRAIN_HOST_H

#include <stdarg.h>
#include <stdint.h>

#include "dtrain/plugin.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_HOST_ABI_MAJOR 1
#define DT_HOST_ABI_MINOR 0

typedef enum dt_log_level {
    DT_LOG_ERROR = 0,
    DT_LOG_WARN = 1,
    DT_LOG_INFO = 2,
    DT_LOG_DEBUG = 3
} dt_log_level_t;

/* A plugin's resolved configuration table (opaque; read with cfg_*). */
typedef struct dt_plugin_config dt_plugin_config_t;

#if defined(__GNUC__)
#define DT_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define DT_PRINTF(fmt, args)
#endif

typedef struct dt_host_v1 {
    uint32_t abi_major;   /* DT_HOST_ABI_MAJOR of the core */
    uint32_t abi_minor;   /* DT_HOST_ABI_MINOR of the core */
    uint32_t struct_size; /* sizeof(dt_host_v1_t) at the core's build */
    uint32_t reserved0;
    const char *name;     /* "dtrain" */
    const char *version;  /* core version string */
    void *ctx;            /* core-private; plugins must not touch */

    /* Log a line, prefixed with the rank and "kind/name:".  Never fails. */
    void (*log)(const struct dt_host_v1 *h, int level, const char *fmt, ...)
        DT_PRINTF(3, 4);

    /* Set this thread's error message to "kind/name: <formatted>" and return
     * `status` unchanged, so plugins write
     *     return host->set_error(host, DT_ERR_TIMEOUT, "allreduce #%llu ...");
     * The message is copied; the caller keeps ownership of its arguments. */
    int (*set_error)(const struct dt_host_v1 *h, int status, const char *fmt,
                     ...) DT_PRINTF(3, 4);

    /* Host memory, tagged for accounting (dt_mem_tag_t).  Returns NULL on
     * failure or when the host budget would be exceeded, with the error set.
     * Alignment is at least 64 bytes.  Free with `free` from the same table;
     * free(NULL) is a no-op. */
    void *(*alloc)(const struct dt_host_v1 *h, uint64_t bytes, int tag);
    void (*free)(const struct dt_host_v1 *h, void *ptr);

    /* Read this plugin's resolved config values by key.  Each returns DT_OK,
     * or DT_ERR_NOT_FOUND if the plugin did not declare `key`, or
     * DT_ERR_INVALID if it declared it with another type.  Strings are owned
     * by the core and valid until finalize. */
    int (*cfg_bool)(const struct dt_host_v1 *h, const char *key, int *out);
    int (*cfg_int)(const struct dt_host_v1 *h, const char *key, int64_t *out);
    int (*cfg_float)(const struct dt_host_v1 *h, const char *key, double *out);
    int (*cfg_string)(const struct dt_host_v1 *h, const char *key,
                      const char **out);

    /* Monotonic clock, nanoseconds. */
    uint64_t (*now_ns)(const struct dt_host_v1 *h);

    /* ---- minor 0 ends here; append only ---- */
} dt_host_v1_t;

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_HOST_H */
