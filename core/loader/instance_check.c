/*
 * core/loader/instance_check.c - the check the core makes on every
 * instance a plugin hands out (init, split): its handle starts with the
 * table the loader loaded from that plugin (libfabric's "handle starts
 * with its ops" rule, the SDK headers' dt_<kind>_ops accessors), so a
 * plugin that forgot the rule fails with a message, not a crash.
 */
#include "loader/loader.h"

#include <stddef.h>

#include "util/error.h"

/* The opaque type and the header that states the rule, by kind. */
static const char *const handle_type[DT_KIND_COUNT] = {
    [DT_KIND_DEVICE] = "dt_device", [DT_KIND_COMM] = "dt_comm",
    [DT_KIND_OFFLOAD] = "dt_offload", [DT_KIND_STRATEGY] = "dt_strategy",
    [DT_KIND_SCHEDULE] = "dt_schedule", [DT_KIND_TENSOR] = "dt_tensor_group",
};
static const char *const handle_header[DT_KIND_COUNT] = {
    [DT_KIND_DEVICE] = "dtrain/device.h", [DT_KIND_COMM] = "dtrain/comm.h",
    [DT_KIND_OFFLOAD] = "dtrain/offload.h", [DT_KIND_STRATEGY] = "dtrain/strategy.h",
    [DT_KIND_SCHEDULE] = "dtrain/schedule.h", [DT_KIND_TENSOR] = "dtrain/tensor_parallel.h",
};

/* Finalize a refused instance through the table it came from: the
 * plugin's own finalize, which needs no ops member. */
static void drop(const dt_plugin_t *p, const void *ops, void *h)
{
    switch (p->kind) {
    case DT_KIND_DEVICE: ((const dt_device_ops_t *)ops)->finalize(h); break;
    case DT_KIND_COMM: ((const dt_comm_ops_t *)ops)->finalize(h); break;
    case DT_KIND_OFFLOAD: ((const dt_offload_ops_t *)ops)->finalize(h); break;
    case DT_KIND_STRATEGY: ((const dt_strategy_ops_t *)ops)->finalize(h); break;
    case DT_KIND_SCHEDULE: ((const dt_schedule_ops_t *)ops)->finalize(h); break;
    case DT_KIND_TENSOR: ((const dt_tensor_ops_t *)ops)->finalize(h); break;
    default: break;
    }
}

int dt_plugin_check_instance(const dt_plugin_t *p, const void *ops, void *handle)
{
    if (!handle || p->kind < 0 || p->kind >= DT_KIND_COUNT || !handle_type[p->kind])
        return DT_OK;
    if (*(const void *const *)handle == ops)
        return DT_OK;
    drop(p, ops, handle);
    return dt_err_set(DT_ERR_INVALID,
                      "plugin '%s': its %s handle does not start with its ops table (%s)",
                      p->name, handle_type[p->kind], handle_header[p->kind]);
}
