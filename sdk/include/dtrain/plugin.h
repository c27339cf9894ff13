/*
 * dtrain/plugin.h - what every plugin of every kind starts with: the common
 * info block, the declaration of its configuration keys, and the one
 * exported entry symbol per kind and ABI major.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * A plugin is a shared object exporting exactly one function per kind and
 * major it implements, named by DT_ENTRY_NAME(kind, major), e.g.
 * `dtrain_comm_v1`.  The function takes no arguments and returns a pointer
 * to a `static const` ops table that stays valid and unchanged while the
 * plugin is loaded.  Build plugins with -fvisibility=hidden: the entry
 * macros below mark only the entry function as exported.
 */
#ifndef DTRAIN_PLUGIN_H
#define DTRAIN_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/abi.h"
#include "dtrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kinds of plugin.  Stable numbers: append only. */
typedef enum dt_plugin_kind {
    DT_KIND_DEVICE = 0,
    DT_KIND_COMM = 1,
    DT_KIND_OFFLOAD = 2,
    DT_KIND_STRATEGY = 3,
    DT_KIND_SCHEDULE = 4, /* a pipeline schedule (schedule.h) */
    DT_KIND_TENSOR = 5,   /* a tensor-parallel scheme (tensor_parallel.h) */
    DT_KIND_MODEL = 6,    /* a model architecture (model.h) */
    DT_KIND_COUNT
} dt_plugin_kind_t;

/* ------------------------------------------------------------------------
 * Configuration keys a plugin declares.
 *
 * A plugin's own settings live in the config table named after the plugin
 * (`[zero]`, `[shm]`, `[cpu]`).  The core validates that table against the
 * keys declared here before `init` is called: unknown keys, wrong types and
 * out-of-range values are reported with file:line:col and never reach the
 * plugin.  At `init` the plugin reads resolved values (file, command line or
 * default) through the host services table (host.h).
 * --------------------------------------------------------------------- */
typedef enum dt_config_type {
    DT_CFG_BOOL = 0,   /* true/false */
    DT_CFG_INT = 1,    /* int64; min/max apply */
    DT_CFG_FLOAT = 2,  /* double; min/max apply; an integer literal is accepted */
    DT_CFG_STRING = 3, /* any string */
    DT_CFG_ENUM = 4    /* a string from `choices` */
} dt_config_type_t;

typedef struct dt_config_key {
    const char *name;     /* key as written in TOML, [a-z0-9_]+ */
    int32_t type;         /* dt_config_type_t */
    const char *def;      /* default, in TOML literal syntax ("1", "2.5",
                           * "true", "\"fp32\""); NULL = required key */
    double min, max;      /* inclusive range for INT/FLOAT.  No range when
                           * both are 0 (leave them out) or min > max; set
                           * one with DT_CFG_RANGE(lo, hi) */
    const char *choices;  /* ENUM: "a|b|c"; NULL otherwise */
    const char *doc;      /* one line, shown by `dtrain plugins --describe` */
} dt_config_key_t;

/* An inclusive range for a key: {.name = "stage", ..., DT_CFG_RANGE(1, 3)}.
 * Leaving min and max out (both 0) means no range. */
#define DT_CFG_RANGE(lo, hi) .min = (double)(lo), .max = (double)(hi)

/* ------------------------------------------------------------------------
 * The info block every ops table starts with (the "base first" rule: each
 * kind's ops struct has this as its first member, so the loader can check
 * any table before it knows its kind's layout).  Frozen for the major: its
 * struct_size is the size of the whole ops table, which grows (abi.h).
 * --------------------------------------------------------------------- */
typedef struct dt_plugin_info {
    uint32_t abi_major;    /* DT_<KIND>_ABI_MAJOR the plugin was built with */
    uint32_t abi_minor;    /* DT_<KIND>_ABI_MINOR the plugin was built with */
    uint32_t struct_size;  /* sizeof(ops struct) at the plugin's build: the
                            * core treats fields past it as absent */
    uint32_t kind;         /* dt_plugin_kind_t */
    const char *name;      /* must equal the file's plugin name */
    const char *version;   /* the plugin's own version, e.g. "0.1.0" */
    const char *summary;   /* one line for `dtrain plugins` */
    const dt_config_key_t *config_keys; /* may be NULL when n_config_keys == 0 */
    uint32_t n_config_keys;
    uint32_t reserved0;
} dt_plugin_info_t;

/* ------------------------------------------------------------------------
 * Entry symbols.  DT_ENTRY_NAME(comm, 1) -> dtrain_comm_v1.  The same macro
 * builds the name the loader looks up, so code and docs cannot drift.
 * --------------------------------------------------------------------- */
#define DT_ENTRY_NAME_(kind, major) dtrain_##kind##_v##major
#define DT_ENTRY_NAME(kind, major) DT_ENTRY_NAME_(kind, major)
#define DT_STR_(x) #x
#define DT_STR(x) DT_STR_(x)
#define DT_ENTRY_STRING(kind, major) DT_STR(DT_ENTRY_NAME(kind, major))

#if defined(_WIN32)
#define DT_EXPORT __declspec(dllexport)
#else
#define DT_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
#define DT_EXTERN_C extern "C"
#else
#define DT_EXTERN_C
#endif

/* Define the exported entry of a plugin.  `ops` is the address of a
 * `static const` ops table of the matching kind and major:
 *     DT_PLUGIN_ENTRY(comm, 1, dt_comm_ops_v1_t, &shm_ops)             */
#define DT_PLUGIN_ENTRY(kind, major, type, ops)                               \
    DT_EXTERN_C DT_EXPORT const type *DT_ENTRY_NAME(kind, major)(void);       \
    DT_EXTERN_C DT_EXPORT const type *DT_ENTRY_NAME(kind, major)(void)        \
    {                                                                          \
        return (ops);                                                          \
    }

/* Fill the info block's fixed fields:
 *     .info = DT_PLUGIN_INFO(COMM, dt_comm_ops_v1_t, "shm", "0.1.0", "...",
 *                            shm_keys)                                     */
#define DT_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define DT_PLUGIN_INFO(KIND, type, name_, version_, summary_, keys_)           \
    {                                                                          \
        .abi_major = DT_##KIND##_ABI_MAJOR,                                    \
        .abi_minor = DT_##KIND##_ABI_MINOR,                                    \
        .struct_size = (uint32_t)sizeof(type),                                 \
        .kind = DT_KIND_##KIND,                                                \
        .name = (name_),                                                       \
        .version = (version_),                                                 \
        .summary = (summary_),                                                 \
        .config_keys = (keys_),                                                \
        .n_config_keys = (uint32_t)DT_ARRAY_LEN(keys_),                        \
        .reserved0 = 0,                                                        \
    }
/* The same, for a plugin with no configuration keys. */
#define DT_PLUGIN_INFO_NOKEYS(KIND, type, name_, version_, summary_)           \
    {                                                                          \
        .abi_major = DT_##KIND##_ABI_MAJOR,                                    \
        .abi_minor = DT_##KIND##_ABI_MINOR,                                    \
        .struct_size = (uint32_t)sizeof(type),                                 \
        .kind = DT_KIND_##KIND,                                                \
        .name = (name_),                                                       \
        .version = (version_),                                                 \
        .summary = (summary_),                                                 \
        .config_keys = NULL,                                                   \
        .n_config_keys = 0,                                                    \
        .reserved0 = 0,                                                        \
    }

/* True when the ops table `ops` (of type `type`) is large enough to contain
 * `field` and the field is non-NULL: call optional methods only after this
 * check (libfabric's FI_CHECK_OP).  The type is explicit, so the macro is
 * plain C99:
 *     if (DT_HAS_OP(dt_comm_ops_t, dt_comm_ops(c), test)) dt_comm_ops(c)->test(c, ...);  */
#define DT_HAS_OP(type, ops, field)                                            \
    (DT_SIZE_HAS((ops)->info.struct_size, type, field) &&                     \
     (ops)->field != NULL)

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_PLUGIN_H */
