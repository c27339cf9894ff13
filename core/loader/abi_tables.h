/*
 * core/loader/abi_tables.h - what the loader knows about each kind's ABI:
 * the majors this dtrain speaks (newest first) and, per major's layout, the
 * name and offset of every method, mandatory or optional, and of the tables
 * an ops table hands out (the device's kernel table).  The loader uses it
 * to check a plugin once at load; `dtrain plugins` to describe one.
 */
#ifndef DT_CORE_ABI_TABLES_H
#define DT_CORE_ABI_TABLES_H

#include <stddef.h>
#include <stdint.h>

/* One method slot of an ops table. */
typedef struct dt_abi_method {
    const char *name;  /* field name in dt_<kind>_ops_v<major>_t */
    size_t offset;     /* offsetof that field */
} dt_abi_method_t;

typedef struct dt_abi_layout dt_abi_layout_t;

/* A table an ops table hands out through one of its mandatory slots, a
 * function taking no arguments (the device's `kernels`), checked at load
 * like the ops table itself, against its own layout (its own major and
 * minor: NCCL's net vs collNet). */
typedef struct dt_abi_subtable {
    const char *slot;              /* the slot returning it: "kernels" */
    size_t slot_offset;            /* offsetof that slot */
    const dt_abi_layout_t *layout; /* the table's slots */
} dt_abi_subtable_t;

/* The layout of one table: a kind's ops table at one major, or a table it
 * hands out.  Either starts with the three fields abi_major, abi_minor,
 * struct_size (dt_plugin_info_t, dt_kernels_info_t). */
struct dt_abi_layout {
    uint32_t major, minor;             /* DT_<KIND>_ABI_MAJOR / _MINOR */
    size_t ops_size;                   /* sizeof the struct at our build */
    const dt_abi_method_t *mandatory;  /* in struct order */
    size_t n_mandatory;
    const dt_abi_method_t *optional;   /* in struct order */
    size_t n_optional;
    /* Smallest struct_size that still holds every mandatory method. */
    size_t min_size;
    /* How messages name the table, its ABI and one of its slots:
     * "ops table", "device" (ABI), "method" / "kernel table", "kernel",
     * "kernel". */
    const char *table_noun, *abi_name, *slot_noun;
    const dt_abi_subtable_t *sub;      /* tables it hands out */
    size_t n_sub;
};

/* The majors of `kind` this dtrain speaks, newest first (a test-only extra
 * major from dt_abi_set_extra_major comes first).  Returns the count
 * (written up to `cap`); 0 for an unknown kind. */
size_t dt_abi_majors(int kind, uint32_t *out, size_t cap);

/* The layout a table of `kind` probed at `major` is checked against; a
 * test-only extra major maps to the newest real layout (identity adapter).
 * NULL when this dtrain does not speak that major. */
const dt_abi_layout_t *dt_abi_layout(int kind, uint32_t major);

/* The entry symbol of `kind` at `major` ("dtrain_comm_v1"), the run-time
 * twin of DT_ENTRY_STRING (a test checks they agree).  Returns `buf`. */
const char *dt_abi_entry_name(int kind, uint32_t major, char *buf,
                              size_t cap);

#ifdef DTRAIN_TEST_HOOKS
/* Test hook (DTRAIN_TEST_HOOKS builds only): pretend this dtrain also
 * speaks `major` of `kind`, with the major-1 layout (adapter = identity).
 * Reset with major == 0. */
void dt_abi_set_extra_major(int kind, uint32_t major);
#endif

#endif /* DT_CORE_ABI_TABLES_H */
