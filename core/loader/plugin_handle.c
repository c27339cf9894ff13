/*
 * core/loader/plugin_handle.c - the names of the plugin kinds
 * (plugin_handle.h), shared by the loader and the host services.
 */
#include "loader/plugin_handle.h"

#include <string.h>

static const char *const kind_names[DT_KIND_COUNT] = {
    [DT_KIND_DEVICE] = "device",
    [DT_KIND_COMM] = "comm",
    [DT_KIND_OFFLOAD] = "offload",
    [DT_KIND_STRATEGY] = "strategy",
    [DT_KIND_SCHEDULE] = "schedule",
    [DT_KIND_TENSOR] = "tensor",
    [DT_KIND_MODEL] = "model",
};

const char *dt_kind_name(int kind)
{
    return (kind >= 0 && kind < DT_KIND_COUNT) ? kind_names[kind] : NULL;
}
