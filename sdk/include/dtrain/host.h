/*
 * dtrain/host.h - the services the core hands each plugin instance.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Every plugin `init` receives a `const dt_host_v1_t *host`.  The table is
 * per plugin: the core knows which plugin it belongs to, so errors a plugin
 * reports are prefixed "kind/name: " (e.g. "comm/shm: ") without the plugin
 * writing its own name.  Every function takes the table itself as its first
 * argument.  The table stays valid until the plugin's `finalize` returns.
 *
 * Thread safety: every function may be called from any thread, at the
 * same time.  The error buffer is thread-local: a plugin sets it on the
 * thread that returns the failing status.
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

    /* Optional (DT_HOST_HAS(h, bootstrap_all_gather)): an all-gather of
     * small blobs among every rank of the job through the core's TCP
     * rendezvous, for a communicator that must exchange bootstrap bytes
     * before it can talk (NCCL's unique id, the addresses a TCP transport
     * listens on).  Collective: every rank calls it, in the same order,
     * with the same `bytes` (at most DT_HOST_BOOTSTRAP_MAX).  in: `mine`
     * (bytes); out: `all` (world size x bytes, rank order, the caller's
     * memory).  Blocks up to timeout_ms (<= 0: the job's timeout); on
     * timeout DT_ERR_TIMEOUT naming the ranks that did not contribute.
     * Valid during comm init only; DT_ERR_UNSUPPORTED where the core runs
     * no rendezvous (a process outside `dtrain run`).  Not reentrant:
     * calls of one process are serialised. */
    int (*bootstrap_all_gather)(const struct dt_host_v1 *h, const void *mine,
                                uint64_t bytes, void *all, int64_t timeout_ms);

    /* Optional (DT_HOST_HAS(h, mem_account)): count `delta` bytes (negative:
     * give back) of host memory this plugin holds by other means than
     * `alloc` (a shared mapping) under `tag`, so reports see it.  Never
     * fails; an unknown tag is ignored. */
    void (*mem_account)(const struct dt_host_v1 *h, int tag, int64_t delta);

    /* Optional (DT_HOST_HAS(h, cleanup_add)): should this process be
     * stopped by SIGINT or SIGTERM before cleanup_remove(h, path), the
     * core's signal handler removes `path` (in: copied) and the process
     * then dies of the signal as it would have.  For what a plugin makes
     * on disk and removes itself when it ends (the offload_nvme tier's
     * files): a one-process run has no launcher to call cleanup_job.
     * `flags` (in): DT_HOST_CLEANUP_FILE, a file (unlinked: a link is
     * removed as a link), or DT_HOST_CLEANUP_EMPTY_DIR, a folder removed
     * only if it is empty once every registered file is gone.  A relative
     * path is taken from the working folder (the core never changes it).
     * Register right after creating (what is not yours yet must not be
     * removed), forget right after removing.  Where the handler cannot be
     * installed (the program has its own for the signal, or ignores it)
     * the path is kept in the list and nothing happens.  Returns DT_OK;
     * DT_ERR_NOMEM when the core's list is full (the path is then only
     * left behind, as without this slot); DT_ERR_INVALID for a NULL or
     * empty path, one longer than the core's PATH_MAX, or unknown flags.
     * Sets no error message: the caller says what it means (a log line).
     * Non-blocking; SIGKILL and crashes are beyond it. */
    int (*cleanup_add)(const struct dt_host_v1 *h, const char *path,
                       uint32_t flags);
    /* Forget `path` (the same string given to cleanup_add; unknown: a
     * no-op).  Non-blocking. */
    void (*cleanup_remove)(const struct dt_host_v1 *h, const char *path);

    /* ---- minor 0 ends here; append only ---- */
} dt_host_v1_t;

/* cleanup_add's flags. */
#define DT_HOST_CLEANUP_FILE 0u
#define DT_HOST_CLEANUP_EMPTY_DIR 1u

/* Most bytes one rank contributes to bootstrap_all_gather. */
#define DT_HOST_BOOTSTRAP_MAX 4096

/* The current version's name; plugin and core code spell this. */
typedef dt_host_v1_t dt_host_t;

/* True when the host table `h` has slot `field` and it is set (a core of
 * an older minor has fewer slots): check before calling an optional slot. */
#define DT_HOST_HAS(h, field)                                                  \
    (DT_SIZE_HAS((h)->struct_size, dt_host_v1_t, field) && (h)->field != NULL)

/* Check a caller's argument struct in place under the growth rule
 * (abi.h, rule 3), with the message set through `h`: `what` names the
 * struct in it ("init args"); `known_size` is sizeof the struct at the
 * reader's build.  Returns DT_OK, DT_ERR_ABI or DT_ERR_UNSUPPORTED. */
static inline int dt_args_check(const dt_host_v1_t *h, const char *what,
                                const void *src, size_t known_size,
                                size_t min_size)
{
    int rc = dt_struct_check(src, known_size, min_size);
    uint32_t got = src ? *(const uint32_t *)src : 0;
    if (rc == DT_ERR_ABI)
        return h->set_error(h, rc,
                            "%s: struct_size %u is below the %u bytes of "
                            "its minor 0 (caller built against another ABI)",
                            what, (unsigned)got, (unsigned)min_size);
    if (rc == DT_ERR_UNSUPPORTED)
        return h->set_error(h, rc,
                            "%s: the caller (struct_size %u) set fields "
                            "past the %u bytes this plugin knows; it needs "
                            "a newer plugin",
                            what, (unsigned)got, (unsigned)known_size);
    return rc;
}

/* The same, copying the struct into the reader's own `dst` (dst_size
 * bytes): fields an older caller did not have read as zero. */
static inline int dt_args_read(const dt_host_v1_t *h, const char *what,
                               void *dst, size_t dst_size, const void *src,
                               size_t min_size)
{
    int rc = dt_args_check(h, what, src, dst_size, min_size);
    if (rc == DT_OK)
        rc = dt_struct_read(dst, dst_size, src, min_size);
    return rc;
}

/* Fill a caller's result struct under the growth rule (abi.h, rule 4). */
static inline int dt_result_write(const dt_host_v1_t *h, const char *what,
                                  void *dst, const void *src, size_t src_size,
                                  size_t min_size)
{
    int rc = dt_struct_write(dst, src, src_size, min_size);
    if (rc != DT_OK)
        return h->set_error(h, rc,
                            "%s: struct_size %u is below the %u bytes of "
                            "its minor 0 (caller built against another ABI)",
                            what, dst ? (unsigned)*(const uint32_t *)dst : 0u,
                            (unsigned)min_size);
    return rc;
}

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_HOST_H */
