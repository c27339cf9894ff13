/*
 * dtrain/tensor.h - element types, memory tags and the tensor view that
 * crosses plugin boundaries.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * A tensor view does not own memory: it is a pointer, an element type, an
 * element count and where the bytes live.  Shapes belong to the model
 * (strategy.h: dt_param_desc_v1_t); kernels take explicit dimensions.
 */
#ifndef DTRAIN_TENSOR_H
#define DTRAIN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types.  Stable numbers: append only. */
typedef enum dt_dtype {
    DT_F32 = 0,
    DT_BF16 = 1,
    DT_F16 = 2,
    DT_F64 = 3,
    DT_I32 = 4,
    DT_I64 = 5,
    DT_U16 = 6,
    DT_U8 = 7,
    DT_DTYPE_COUNT
} dt_dtype_t;

/* Bytes per element of `dt`; 0 for an unknown type. */
static inline size_t dt_dtype_size(int dt)
{
    switch (dt) {
    case DT_F32: case DT_I32: return 4;
    case DT_BF16: case DT_F16: case DT_U16: return 2;
    case DT_F64: case DT_I64: return 8;
    case DT_U8: return 1;
    default: return 0;
    }
}

/* Lower-case name ("f32", "bf16"), never NULL. */
static inline const char *dt_dtype_name(int dt)
{
    switch (dt) {
    case DT_F32: return "f32";
    case DT_BF16: return "bf16";
    case DT_F16: return "f16";
    case DT_F64: return "f64";
    case DT_I32: return "i32";
    case DT_I64: return "i64";
    case DT_U16: return "u16";
    case DT_U8: return "u8";
    default: return "unknown";
    }
}

/* Where a pointer's bytes live. */
typedef enum dt_mem_space {
    DT_MEM_HOST = 0,   /* ordinary (or pinned) host memory */
    DT_MEM_DEVICE = 1  /* memory of the compute device (== host for `cpu`) */
} dt_mem_space_t;

/* What an allocation is for.  Every byte the device or the host allocates
 * for a plugin carries one tag so memory is accounted per purpose, with
 * peaks, and compared against the planner.  Stable numbers: append only. */
typedef enum dt_mem_tag {
    DT_TAG_PARAMS = 0,      /* model parameters (compute and master copies) */
    DT_TAG_GRADS = 1,       /* gradients, full or sharded */
    DT_TAG_OPTIMIZER = 2,   /* optimizer moments */
    DT_TAG_ACTIVATIONS = 3, /* forward activations and their gradients */
    DT_TAG_COMM = 4,        /* communication buckets and gather buffers */
    DT_TAG_STAGING = 5,     /* host<->device or offload staging */
    DT_TAG_OTHER = 6,       /* anything else (bookkeeping) */
    DT_TAG_OFFLOAD = 7,     /* state held in an offload tier (pinned host
                             * memory, NVMe files) */
    DT_TAG_COUNT            /* tags THIS build knows; grows with the enum */
} dt_mem_tag_t;

/* Per-tag arrays inside ABI structs have this fixed capacity and carry the
 * count of tags their writer knew (n_tags <= DT_TAG_CAPACITY): a newer tag
 * never moves a field.  Readers treat tags at or past n_tags as 0. */
#define DT_TAG_CAPACITY 16
DT_ABI_CHECK_(dt_tag_capacity_check_, DT_TAG_COUNT <= DT_TAG_CAPACITY);

static inline const char *dt_mem_tag_name(int tag)
{
    switch (tag) {
    case DT_TAG_PARAMS: return "params";
    case DT_TAG_GRADS: return "grads";
    case DT_TAG_OPTIMIZER: return "optimizer";
    case DT_TAG_ACTIVATIONS: return "activations";
    case DT_TAG_COMM: return "comm";
    case DT_TAG_STAGING: return "staging";
    case DT_TAG_OTHER: return "other";
    case DT_TAG_OFFLOAD: return "offload";
    default: return "unknown";
    }
}

/* Per-tag memory statistics, in bytes (out; the caller zero-fills it and
 * sets struct_size; the writer fills it with dt_struct_write, plugin.h).
 * A device reports its own memory (alloc) in current/peak/total_* and the
 * pinned host memory it handed out (host_alloc, device.h) in pinned_*: the
 * two never mix, and only the first counts against the device's budget.
 * Other writers (the host services' tagged host memory) leave pinned_* 0. */
typedef struct dt_mem_stats_v1 {
    uint32_t struct_size;   /* sizeof(dt_mem_stats_v1_t) at the caller's build */
    uint32_t n_tags;        /* entries of the per-tag arrays the writer filled */
    uint64_t total_current; /* sum over tags, now */
    uint64_t total_peak;    /* highest total seen (not the sum of peaks) */
    uint64_t limit;         /* configured budget, 0 = none */
    uint64_t current[DT_TAG_CAPACITY]; /* bytes allocated now, per tag */
    uint64_t peak[DT_TAG_CAPACITY];    /* highest `current` seen, per tag */
    uint64_t pinned_total_current;     /* pinned host bytes now, all tags */
    uint64_t pinned_total_peak;        /* highest pinned_total_current seen */
    uint64_t pinned_current[DT_TAG_CAPACITY]; /* pinned host bytes now */
    uint64_t pinned_peak[DT_TAG_CAPACITY];    /* highest pinned_current */
    /* ---- minor 0 ends here; append only ---- */
} dt_mem_stats_v1_t;
typedef dt_mem_stats_v1_t dt_mem_stats_t;
#define DT_MEM_STATS_V1_SIZE0 DT_FIELD_END(dt_mem_stats_v1_t, pinned_peak)

/* Bytes of tag `tag` in a per-tag array that holds `n_tags` entries: 0 for
 * a tag its writer did not know. */
static inline uint64_t dt_tag_bytes(const uint64_t *per_tag, uint32_t n_tags,
                                    int tag)
{
    return (tag >= 0 && (uint32_t)tag < n_tags && tag < DT_TAG_CAPACITY)
               ? per_tag[tag]
               : 0;
}

/* A non-owning view of a contiguous run of elements. */
typedef struct dt_tensor {
    void *data;      /* first element; NULL only when numel == 0 */
    uint64_t numel;  /* number of elements (not bytes) */
    int32_t dtype;   /* dt_dtype_t */
    int32_t space;   /* dt_mem_space_t */
} dt_tensor_t;

/* A range [offset, offset + count) of elements in some flat index space.
 * Frozen for the major (passed in arrays). */
typedef struct dt_range {
    uint64_t offset;
    uint64_t count;
} dt_range_t;

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TENSOR_H */
