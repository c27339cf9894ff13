/*
 * dtrain/offload.h - the offload tier ABI (plugin kind "offload").
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * An offload tier holds tensors away from the compute device: pinned host
 * memory (offload_cpu) or files on NVMe read and written with direct,
 * queued I/O (offload_nvme).  Strategies keep optimizer state or parameters
 * there and move them in and out around use.  Transfers are asynchronous:
 * store/load return a request that is waited on with a bounded timeout.
 *
 * Thread safety: one thread at a time drives an instance (alloc, free,
 * store, load, wait, capacity); transfers progress in the background.
 * cleanup_job needs no instance.
 */
#ifndef DTRAIN_OFFLOAD_H
#define DTRAIN_OFFLOAD_H

#include <stdint.h>

#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/plugin.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_OFFLOAD_ABI_MAJOR 1
#define DT_OFFLOAD_ABI_MINOR 0

/* An offload tier (dt_offload_t): opaque to the core, the plugin's own struct, which
 * must start with a pointer to the table that made it (libfabric's rule):
 *     struct dt_offload { const dt_offload_ops_v1_t *ops; ... };  // ops = &my_ops
 * so a handle alone is enough to call it: dt_offload_ops(o)->slot(o, ...).
 * The core refuses a handle whose first member is not the table it
 * loaded from the plugin. */
typedef struct dt_offload dt_offload_t;         /* the tier instance */
typedef struct dt_offload_buf dt_offload_buf_t; /* a region held there */
typedef struct dt_offload_req dt_offload_req_t; /* a transfer in flight */

/* Arguments to offload init (in; valid during init; dt_args_read). */
typedef struct dt_offload_init_v1 {
    uint32_t struct_size; /* sizeof(dt_offload_init_v1_t) at the core's build */
    int32_t rank;
    int32_t local_rank;
    int32_t reserved0;
    const char *job_id;   /* unique per job: names files */
    int64_t timeout_ms;   /* default bound for every wait */
    dt_device_t *dev;     /* for copies to/from the device (its table:
                           * dt_device_ops(dev)); pinned host buffers come
                           * from its host_alloc */
    /* ---- minor 0 ends here; append only ---- */
} dt_offload_init_v1_t;
#define DT_OFFLOAD_INIT_V1_SIZE0 DT_FIELD_END(dt_offload_init_v1_t, dev)

typedef struct dt_offload_ops_v1 {
    dt_plugin_info_t info; /* base first; info.kind == DT_KIND_OFFLOAD */

    /* ---- mandatory ---- */
    int (*init)(const dt_host_v1_t *host, const dt_offload_init_v1_t *args,
                dt_offload_t **out);
    /* Waits for transfers in flight, frees all buffers, removes files. */
    void (*finalize)(dt_offload_t *o);
    /* Bytes the tier can hold in all (0 = unbounded) and holds now. */
    int (*capacity)(dt_offload_t *o, uint64_t *total, uint64_t *used);
    /* Reserve `bytes` in the tier, tagged (dt_mem_tag_t).  Contents are
     * undefined until stored.  DT_ERR_NOMEM past capacity. */
    int (*alloc)(dt_offload_t *o, uint64_t bytes, int tag,
                 dt_offload_buf_t **out);
    /* Release a buffer (waits for its transfers).  NULL ok. */
    int (*free)(dt_offload_t *o, dt_offload_buf_t *buf);
    /* Copy `bytes` from `src` (in `space`: host or device memory) into the
     * buffer at byte `offset`.  Asynchronous: src must stay valid until the
     * request is waited on.  `stream` orders a device-side source. */
    int (*store)(dt_offload_t *o, dt_offload_buf_t *buf, uint64_t offset,
                 const void *src, uint64_t bytes, int space,
                 dt_stream_t *stream, dt_offload_req_t **req);
    /* Copy `bytes` at byte `offset` of the buffer into `dst` (in `space`). */
    int (*load)(dt_offload_t *o, dt_offload_buf_t *buf, uint64_t offset,
                void *dst, uint64_t bytes, int space, dt_stream_t *stream,
                dt_offload_req_t **req);
    /* Bounded wait (< 0: default timeout); frees req whatever the outcome. */
    int (*wait)(dt_offload_t *o, dt_offload_req_t *req, int64_t timeout_ms);

    /* ---- optional ---- */
    /* Direct host pointer to a buffer's bytes when the tier is host memory
     * (offload_cpu), so an optimizer can update state in place.  Absent or
     * DT_ERR_UNSUPPORTED: use load/store. */
    int (*host_ptr)(dt_offload_t *o, dt_offload_buf_t *buf, void **out);
    /* Remove files a crashed job `job_id` left in the tier (comm.h's
     * cleanup_job, same contract). */
    int (*cleanup_job)(const dt_host_v1_t *host, const char *job_id);

    /* ---- minor 0 ends here; append only ---- */
} dt_offload_ops_v1_t;

/* Current-version names. */
typedef dt_offload_ops_v1_t dt_offload_ops_t;

/* The table instance `o` was made by: its first member (the rule at
 * dt_offload_t above); NULL for a NULL handle. */
static inline const dt_offload_ops_v1_t *dt_offload_ops(const dt_offload_t *o)
{
    return o ? *(const dt_offload_ops_v1_t *const *)(const void *)o : NULL;
}
typedef dt_offload_init_v1_t dt_offload_init_t;

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_OFFLOAD_H */
