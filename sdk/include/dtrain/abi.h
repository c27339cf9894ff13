/*
 * dtrain/abi.h - how every table and struct of the ABI grows within a major,
 * and the two helpers that apply the rule.  Included by every SDK header.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 */
#ifndef DTRAIN_ABI_H
#define DTRAIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * How the ABI grows within a major.  One rule for every table and struct.
 *
 * 1. Ops tables (this info block's `struct_size`) and every struct that
 *    crosses the boundary and may grow start with their size: `uint32_t
 *    struct_size`, set by whoever owns the memory to sizeof at ITS build.
 *    For argument structs (`dt_*_init_v1_t`, `dt_hook_v1_t`, ...) and for
 *    result structs a plugin fills (`dt_device_props_v1_t`,
 *    `dt_mem_stats_v1_t`, `dt_estimate_v1_t`, `dt_step_result_v1_t`, ...)
 *    that is the CALLER: it zero-fills the struct and sets struct_size.
 * 2. Within a major, fields and slots are only appended, after the
 *    "minor N ends here" line, and zero always means "absent / default".
 *    Enums grow the same way; arrays sized by an enum that may grow never
 *    sit inside an ABI struct (a fixed capacity and a count do).
 * 3. A reader of an argument struct uses dt_struct_read (host.h:
 *    dt_args_read): fields an OLDER caller did not have read as zero;
 *    fields a NEWER caller has but the reader does not know must be zero,
 *    or the call fails with DT_ERR_UNSUPPORTED (the caller asked for
 *    something this plugin cannot do: never silently ignored); a size below
 *    the struct's minor-0 size fails with DT_ERR_ABI.
 * 4. A writer of a result struct uses dt_struct_write: it writes only the
 *    bytes the caller's struct_size covers, so an older caller's smaller
 *    struct is safe and a newer caller sees zero in fields an older plugin
 *    does not know.
 * 5. Optional slots are called only after DT_HAS_OP (tables) or
 *    DT_HOST_HAS (the host table); mandatory slots were checked once, when
 *    the loader registered the plugin.
 * 6. Arrays of structs are FROZEN for the major (their stride cannot grow):
 *    dt_config_key_t, dt_param_desc_v1_t, dt_unit_desc_v1_t, dt_range_t,
 *    dt_plan_preset_v1_t.  Where an element may need more later, it carries
 *    an `ext` pointer, NULL until a later minor defines what it points to
 *    (a struct starting with struct_size).
 *
 * Plugins see each other's tables (a comm gets the device's, a strategy
 * gets device, comm and offload tables).  Those tables are versioned
 * TOGETHER: every kind and the host table form one ABI generation
 * (DT_ABI_GENERATION).  Minors move independently (a receiver checks the
 * other table's optional slots with DT_HAS_OP, exactly as the loader
 * does); a major change of any one kind starts a new generation for all of
 * them, and the core never hands a plugin a table of another generation
 * (it refuses the combination, naming both plugins).  A table is passed as
 * the plugin exported it: its info.struct_size says which slots exist, and
 * its mandatory slots are known present because the loader checked them.
 * --------------------------------------------------------------------- */
#define DT_ABI_GENERATION 1

/* Compile-time check usable from C99 and C++ headers. */
#define DT_ABI_CHECK_(name, cond) typedef char name[(cond) ? 1 : -1]

/* Bytes a struct must span to contain `field`. */
#define DT_FIELD_END(type, field)                                              \
    (offsetof(type, field) + sizeof(((type *)0)->field))
/* True when a struct of `size` bytes contains `field` of `type`. */
#define DT_SIZE_HAS(size, type, field)                                         \
    ((size_t)(size) >= DT_FIELD_END(type, field))

/* True when the struct `p` of type `type` (starting with struct_size)
 * contains `field`: for code that reads a caller's struct in place. */
#define DT_HAS_FIELD(type, p, field) DT_SIZE_HAS((p)->struct_size, type, field)

/* Rule 3 without a copy, for a struct read in place: DT_OK when `src`
 * (whose first member is uint32_t struct_size) spans at least `min_size`
 * (the struct's size at minor 0, its DT_*_SIZE0) and every byte past the
 * `known_size` bytes the reader knows is zero; DT_ERR_ABI when smaller or
 * NULL; DT_ERR_UNSUPPORTED when a newer caller set a field the reader does
 * not know.  A result struct is checked the same way before it is
 * written (its writer knows every byte, so only the size counts). */
static inline int dt_struct_check(const void *src, size_t known_size,
                                  size_t min_size)
{
    const unsigned char *s = (const unsigned char *)src;
    size_t i;
    uint32_t size;
    if (!src)
        return DT_ERR_ABI;
    size = *(const uint32_t *)src;
    if (size < min_size || size < sizeof(uint32_t))
        return DT_ERR_ABI;
    for (i = known_size; i < size; i++)
        if (s[i] != 0)
            return DT_ERR_UNSUPPORTED;
    return DT_OK;
}

/* Rule 3: check the caller's struct `src` (dt_struct_check) and copy it
 * into the reader's own `dst` of `dst_size` bytes; fields an older caller
 * did not have read as zero.  On success dst->struct_size is dst_size. */
static inline int dt_struct_read(void *dst, size_t dst_size, const void *src,
                                 size_t min_size)
{
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    size_t n, i;
    int rc = dt_struct_check(src, dst_size, min_size);
    if (rc != DT_OK || !dst || dst_size < sizeof(uint32_t))
        return rc != DT_OK ? rc : DT_ERR_ABI;
    n = *(const uint32_t *)src;
    if (n > dst_size)
        n = dst_size;
    for (i = 0; i < dst_size; i++)
        d[i] = i < n ? s[i] : 0;
    *(uint32_t *)dst = (uint32_t)dst_size;
    return DT_OK;
}

/* Rule 4: copy the writer's complete struct `src` of `src_size` bytes into
 * the caller's `dst`, only as far as dst's struct_size reaches; the
 * caller's struct_size is kept.  DT_ERR_ABI when dst is NULL or smaller
 * than `min_size` (the struct's minor-0 size). */
static inline int dt_struct_write(void *dst, const void *src, size_t src_size,
                                  size_t min_size)
{
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    size_t n, i;
    uint32_t size;
    if (!dst || !src)
        return DT_ERR_ABI;
    size = *(const uint32_t *)dst;
    if (size < min_size || size < sizeof(uint32_t))
        return DT_ERR_ABI;
    n = size < src_size ? size : src_size;
    for (i = sizeof(uint32_t); i < n; i++)
        d[i] = s[i];
    return DT_OK;
}

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_ABI_H */
