/*
 * core/loader/abi_tables.c - the majors this dtrain speaks per kind and the
 * method slots of each layout, taken with offsetof from the SDK headers.
 *
 * The lists are written out by hand (which slot is mandatory is a decision,
 * not something the compiler knows), so DT_LAYOUT_CHECK makes the build
 * fail when a header gains or loses a slot that is not listed here: the
 * listed slots plus the info block must add up to the struct's size.
 */
#include "loader/abi_tables.h"

#include <stdatomic.h>
#include <stdio.h>

#include "dtrain/dtrain.h"

#define M(kind, field)                                                         \
    { #field, offsetof(dt_##kind##_ops_v1_t, field) }

typedef void (*dt_any_fn_t)(void);

/* Every slot after the info block is one function pointer, so the count of
 * listed slots fixes the struct's size; the last optional slot must end the
 * struct. */
#define DT_LAYOUT_CHECK(kind, n_fields)                                        \
    _Static_assert(sizeof(dt_##kind##_ops_v1_t) ==                             \
                       sizeof(dt_plugin_info_t) +                              \
                           (n_fields) * sizeof(dt_any_fn_t),                   \
                   "dt_" #kind "_ops_v1_t changed: update abi_tables.c");      \
    _Static_assert(DT_ARRAY_LEN(kind##_v1_mandatory) +                         \
                           DT_ARRAY_LEN(kind##_v1_optional) ==                 \
                       (n_fields),                                             \
                   "abi_tables.c: " #kind " slot lists incomplete")

/* device v1: everything but the native stream handle is mandatory. */
static const dt_abi_method_t device_v1_mandatory[] = {
    M(device, init), M(device, finalize), M(device, props), M(device, alloc),
    M(device, free), M(device, mem_stats), M(device, mem_reset_peaks),
    M(device, stream_create), M(device, stream_destroy),
    M(device, stream_sync), M(device, event_create), M(device, event_destroy),
    M(device, event_record), M(device, stream_wait_event),
    M(device, event_sync), M(device, synchronize), M(device, memcpy_async),
    M(device, memset_async), M(device, matmul_forward),
    M(device, matmul_backward), M(device, embedding_forward),
    M(device, embedding_backward), M(device, layernorm_forward),
    M(device, layernorm_backward), M(device, gelu_forward),
    M(device, gelu_backward), M(device, attention_forward),
    M(device, attention_backward), M(device, residual_forward),
    M(device, axpy), M(device, softmax_xent_forward),
    M(device, softmax_xent_backward), M(device, adamw_update),
    M(device, sgd_update), M(device, sumsq), M(device, scale),
    M(device, cast),
};
static const dt_abi_method_t device_v1_optional[] = {
    M(device, native_stream),
};
DT_LAYOUT_CHECK(device, 38);

/* comm v1: the non-blocking completion check and the crash cleanup are
 * optional. */
static const dt_abi_method_t comm_v1_mandatory[] = {
    M(comm, init), M(comm, finalize), M(comm, rank_size), M(comm, all_reduce),
    M(comm, reduce_scatter), M(comm, all_gather), M(comm, broadcast),
    M(comm, reduce), M(comm, send), M(comm, recv), M(comm, barrier),
    M(comm, wait), M(comm, split), M(comm, abort),
};
static const dt_abi_method_t comm_v1_optional[] = {
    M(comm, test), M(comm, cleanup_job),
};
DT_LAYOUT_CHECK(comm, 16);

/* offload v1: host_ptr is a shortcut for host-memory tiers only. */
static const dt_abi_method_t offload_v1_mandatory[] = {
    M(offload, init), M(offload, finalize), M(offload, capacity),
    M(offload, alloc), M(offload, free), M(offload, store), M(offload, load),
    M(offload, wait),
};
static const dt_abi_method_t offload_v1_optional[] = {
    M(offload, host_ptr), M(offload, cleanup_job),
};
DT_LAYOUT_CHECK(offload, 10);

/* strategy v1: only the planner's presets are optional. */
static const dt_abi_method_t strategy_v1_mandatory[] = {
    M(strategy, init), M(strategy, finalize), M(strategy, begin_step),
    M(strategy, pre_forward), M(strategy, post_forward),
    M(strategy, pre_backward), M(strategy, post_backward), M(strategy, step),
    M(strategy, state_ranges), M(strategy, get_state), M(strategy, set_state),
    M(strategy, state_loaded), M(strategy, estimate),
};
static const dt_abi_method_t strategy_v1_optional[] = {
    M(strategy, plan_presets),
};
DT_LAYOUT_CHECK(strategy, 14);

/* Mandatory slots are contiguous from the first one, so the minimum size is
 * where the last mandatory slot ends: the info block plus one pointer per
 * mandatory slot (test_loader checks every listed offset against that).
 * Counted, not read from the array: an array element is not a constant
 * expression in C, and clang rejects it in a static initializer. */
#define LAYOUT(kind, KIND)                                                     \
    {                                                                          \
        DT_##KIND##_ABI_MAJOR, DT_##KIND##_ABI_MINOR,                          \
        sizeof(dt_##kind##_ops_v1_t), kind##_v1_mandatory,                     \
        DT_ARRAY_LEN(kind##_v1_mandatory), kind##_v1_optional,                 \
        DT_ARRAY_LEN(kind##_v1_optional),                                      \
        sizeof(dt_plugin_info_t) +                                             \
            DT_ARRAY_LEN(kind##_v1_mandatory) * sizeof(dt_any_fn_t)            \
    }

/* Indexed by kind; one layout each while every kind is at major 1.  A
 * second major adds a row per kind and an adapter in the loader. */
static const dt_abi_layout_t layouts_v1[DT_KIND_COUNT] = {
    [DT_KIND_DEVICE] = LAYOUT(device, DEVICE),
    [DT_KIND_COMM] = LAYOUT(comm, COMM),
    [DT_KIND_OFFLOAD] = LAYOUT(offload, OFFLOAD),
    [DT_KIND_STRATEGY] = LAYOUT(strategy, STRATEGY),
};

#ifdef DTRAIN_TEST_HOOKS
/* Test-only pretend majors, per kind (0: none). */
static _Atomic uint32_t extra_major[DT_KIND_COUNT];

void dt_abi_set_extra_major(int kind, uint32_t major)
{
    if (kind >= 0 && kind < DT_KIND_COUNT)
        atomic_store(&extra_major[kind], major);
}

static uint32_t get_extra_major(int kind) { return atomic_load(&extra_major[kind]); }
#else
static uint32_t get_extra_major(int kind)
{
    (void)kind;
    return 0;
}
#endif

size_t dt_abi_majors(int kind, uint32_t *out, size_t cap)
{
    if (kind < 0 || kind >= DT_KIND_COUNT)
        return 0;
    uint32_t all[2];
    size_t n = 0;
    uint32_t extra = get_extra_major(kind);
    if (extra != 0 && extra != layouts_v1[kind].major)
        all[n++] = extra;
    all[n++] = layouts_v1[kind].major;
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = all[i];
    return n < cap ? n : cap;
}

const dt_abi_layout_t *dt_abi_layout(int kind, uint32_t major)
{
    if (kind < 0 || kind >= DT_KIND_COUNT || major == 0)
        return NULL;
    if (major == layouts_v1[kind].major || major == get_extra_major(kind))
        return &layouts_v1[kind];
    return NULL;
}

const char *dt_abi_entry_name(int kind, uint32_t major, char *buf, size_t cap)
{
    static const char *const kinds[DT_KIND_COUNT] = {
        [DT_KIND_DEVICE] = "device", [DT_KIND_COMM] = "comm",
        [DT_KIND_OFFLOAD] = "offload", [DT_KIND_STRATEGY] = "strategy"};
    const char *k = (kind >= 0 && kind < DT_KIND_COUNT) ? kinds[kind] : "?";
    /* Spelled as DT_ENTRY_NAME spells it: dtrain_##kind##_v##major. */
    snprintf(buf, cap, "dtrain_%s_v%u", k, (unsigned)major);
    return buf;
}
