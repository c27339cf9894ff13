/*
 * core/loader/plugin_handle.h - a loaded plugin as the core holds it
 * (dt_plugin_t) and the names of the plugin kinds.
 *
 * Its own header because two modules share it and neither should include
 * the other for it: the loader (loader.h) fills a dt_plugin_t and builds
 * its host table through host_services.h; the host services
 * (host_services.h) read the plugin's kind, name and declared config.
 */
#ifndef DT_CORE_PLUGIN_HANDLE_H
#define DT_CORE_PLUGIN_HANDLE_H

#include <stdint.h>

#include "dtrain/dtrain.h"

typedef struct dt_plugin {
    int kind;                    /* dt_plugin_kind_t */
    char name[64];
    char path[4096];             /* file it came from */
    uint32_t major;              /* ABI major chosen */
    const dt_plugin_info_t *info;
    const void *ops;             /* cast to dt_<kind>_ops_v<major>_t */
    const dt_host_t *host;    /* this plugin's host table */
    void *priv;                  /* loader-private */
} dt_plugin_t;

/* "device", "comm", "offload", "strategy", "schedule",
 * "tensor", "model"; NULL for an unknown kind. */
const char *dt_kind_name(int kind);

#endif /* DT_CORE_PLUGIN_HANDLE_H */
