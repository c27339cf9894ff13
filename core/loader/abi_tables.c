/*
 * core/loader/abi_tables.c - the majors this dtrain speaks per kind and the
 * method slots of each layout, taken with offsetof from the SDK headers;
 * also the slots of the tables an ops table hands out (the device's kernel
 * table).
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
#define K(field)                                                               \
    { #field, offsetof(dt_kernels_v1_t, field) }

typedef void (*dt_any_fn_t)(void);

/* Every slot after the head (`head`: the info block) is one function
 * pointer, so the count of listed slots fixes the struct's size; the last
 * optional slot must end the struct. */
#define DT_LAYOUT_CHECK_TABLE(type, head, list, n_fields)                      \
    _Static_assert(sizeof(type) == sizeof(head) +                              \
                                       (n_fields) * sizeof(dt_any_fn_t),       \
                   #type " changed: update abi_tables.c");                     \
    _Static_assert(DT_ARRAY_LEN(list##_mandatory) +                            \
                           DT_ARRAY_LEN(list##_optional) ==                    \
                       (n_fields),                                             \
                   "abi_tables.c: " #list " slot lists incomplete")
#define DT_LAYOUT_CHECK(kind, n_fields)                                        \
    DT_LAYOUT_CHECK_TABLE(dt_##kind##_ops_v1_t, dt_plugin_info_t, kind##_v1,  \
                          n_fields)

/* Mandatory slots are contiguous from the first one and the optional ones
 * end the table (DT_LAYOUT_CHECK_TABLE proves every slot is listed), so
 * the minimum size is the table less its optional slots.  Counted, not
 * read from the array: an array element is not a constant expression in
 * C, and clang rejects it in a static initializer. */
#define LAYOUT_OF(type, list, MAJOR, MINOR, table, abi, slot, sub_, n_sub_)    \
    {                                                                          \
        MAJOR, MINOR, sizeof(type), list##_mandatory,                          \
        DT_ARRAY_LEN(list##_mandatory), list##_optional,                       \
        DT_ARRAY_LEN(list##_optional),                                         \
        sizeof(type) - DT_ARRAY_LEN(list##_optional) * sizeof(dt_any_fn_t),   \
        table, abi, slot, sub_, n_sub_                                         \
    }

/* kernels v1 (the device's kernel table, from its `kernels` slot): the
 * core set every model and strategy needs is mandatory; what one arch
 * (GPT-2's norms, attention, residual adds) or one optimizer needs is
 * optional, checked where it is needed. */
static const dt_abi_method_t kernels_v1_mandatory[] = {
    K(matmul_forward), K(matmul_backward), K(embedding_forward),
    K(embedding_backward), K(gelu_forward), K(gelu_backward),
    K(softmax_xent_forward), K(softmax_xent_backward), K(axpy), K(sumsq),
    K(cast),
};
static const dt_abi_method_t kernels_v1_optional[] = {
    K(layernorm_forward), K(layernorm_backward), K(attention_state_bytes),
    K(attention_forward), K(attention_backward), K(residual_forward),
    K(scale), K(adamw_update), K(sgd_update),
    /* tensor parallelism's vocabulary split */
    K(vocab_embedding_forward), K(vocab_embedding_backward),
    K(vocab_xent_forward), K(vocab_xent_backward),
    /* the LLaMA family's layers */
    K(rmsnorm_forward), K(rmsnorm_backward), K(rope_forward),
    K(rope_backward), K(swiglu_forward), K(swiglu_backward),
    K(gqa_attention_forward), K(gqa_attention_backward),
};
DT_LAYOUT_CHECK_TABLE(dt_kernels_v1_t, dt_kernels_info_t, kernels_v1, 32);
static const dt_abi_layout_t kernels_v1_layout =
    LAYOUT_OF(dt_kernels_v1_t, kernels_v1, DT_KERNELS_ABI_MAJOR,
              DT_KERNELS_ABI_MINOR, "kernel table", "kernel", "kernel", NULL,
              0);

/* device v1 (the runtime): everything but the native stream handle is
 * mandatory; `kernels` hands out the kernel table. */
static const dt_abi_method_t device_v1_mandatory[] = {
    M(device, init), M(device, finalize), M(device, props), M(device, kernels),
    M(device, alloc), M(device, free), M(device, mem_stats),
    M(device, mem_reset_peaks), M(device, host_alloc), M(device, host_free),
    M(device, stream_create),
    M(device, stream_destroy), M(device, stream_sync), M(device, event_create),
    M(device, event_destroy), M(device, event_record),
    M(device, stream_wait_event), M(device, event_sync), M(device, synchronize),
    M(device, memcpy_async), M(device, memset_async),
};
static const dt_abi_method_t device_v1_optional[] = {
    M(device, native_stream),
};
DT_LAYOUT_CHECK(device, 22);
static const dt_abi_subtable_t device_v1_sub[] = {
    {"kernels", offsetof(dt_device_ops_v1_t, kernels), &kernels_v1_layout},
};

/* comm v1: the non-blocking completion check, the crash cleanup,
 * symmetric memory and the grouped send/recv are optional. */
static const dt_abi_method_t comm_v1_mandatory[] = {
    M(comm, init), M(comm, finalize), M(comm, rank_size), M(comm, all_reduce),
    M(comm, reduce_scatter), M(comm, all_gather), M(comm, broadcast),
    M(comm, reduce), M(comm, send), M(comm, recv), M(comm, barrier),
    M(comm, wait), M(comm, split), M(comm, abort),
};
static const dt_abi_method_t comm_v1_optional[] = {
    M(comm, test), M(comm, cleanup_job), M(comm, sym_alloc), M(comm, sym_free),
    M(comm, sendrecv),
};
DT_LAYOUT_CHECK(comm, 19);

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

/* strategy v1: the planner's presets are optional. */
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

/* schedule v1: a pipeline schedule; every slot is mandatory. */
static const dt_abi_method_t schedule_v1_mandatory[] = {
    M(schedule, init), M(schedule, finalize), M(schedule, assign_stages), M(schedule, run),
};
_Static_assert(sizeof(dt_schedule_ops_v1_t) ==
                   sizeof(dt_plugin_info_t) +
                       DT_ARRAY_LEN(schedule_v1_mandatory) * sizeof(dt_any_fn_t),
               "dt_schedule_ops_v1_t changed: update abi_tables.c");

/* tensor v1: a tensor-parallel scheme; every slot is mandatory. */
static const dt_abi_method_t tensor_v1_mandatory[] = {
    M(tensor, init), M(tensor, finalize), M(tensor, row_forward),
    M(tensor, column_backward_start), M(tensor, column_backward_wait),
    M(tensor, embedding_forward), M(tensor, xent_reduce),
};
_Static_assert(sizeof(dt_tensor_ops_v1_t) ==
                   sizeof(dt_plugin_info_t) +
                       DT_ARRAY_LEN(tensor_v1_mandatory) * sizeof(dt_any_fn_t),
               "dt_tensor_ops_v1_t changed: update abi_tables.c");

/* model v1: an architecture; pipeline stages, slots, per-unit FLOPs,
 * tensor parallelism's count, presets, the decoder and Hugging Face's files are optional. */
static const dt_abi_method_t model_v1_mandatory[] = {
    M(model, create), M(model, act_bytes), M(model, alloc_acts),
    M(model, forward), M(model, backward), M(model, flops_per_token),
};
static const dt_abi_method_t model_v1_optional[] = {
    M(model, stage_forward), M(model, stage_backward), M(model, use_slot),
    M(model, unit_flops), M(model, tp_comm), M(model, free),
    M(model, need_kernels), M(model, preset), M(model, decoder_create),
    M(model, decoder_step), M(model, decoder_len), M(model, decoder_reset),
    M(model, decoder_free), M(model, hf_architectures), M(model, hf_config_read),
    M(model, hf_config_write), M(model, hf_export_name), M(model, hf_import_name),
};
DT_LAYOUT_CHECK(model, 24);

#define LAYOUT(kind, KIND, sub_, n_sub_)                                       \
    LAYOUT_OF(dt_##kind##_ops_v1_t, kind##_v1, DT_##KIND##_ABI_MAJOR,          \
              DT_##KIND##_ABI_MINOR, "ops table", #kind, "method", sub_,     \
              n_sub_)

/* Indexed by kind; one layout each while every kind is at major 1.  A
 * second major adds a row per kind and an adapter in the loader. */
static const dt_abi_layout_t layouts_v1[DT_KIND_COUNT] = {
    [DT_KIND_DEVICE] = LAYOUT(device, DEVICE, device_v1_sub,
                              DT_ARRAY_LEN(device_v1_sub)),
    [DT_KIND_COMM] = LAYOUT(comm, COMM, NULL, 0),
    [DT_KIND_OFFLOAD] = LAYOUT(offload, OFFLOAD, NULL, 0),
    [DT_KIND_STRATEGY] = LAYOUT(strategy, STRATEGY, NULL, 0),
    /* no optional slot yet (an empty array is not C) */
    [DT_KIND_SCHEDULE] = {DT_SCHEDULE_ABI_MAJOR, DT_SCHEDULE_ABI_MINOR,
                          sizeof(dt_schedule_ops_v1_t), schedule_v1_mandatory,
                          DT_ARRAY_LEN(schedule_v1_mandatory), NULL, 0,
                          sizeof(dt_schedule_ops_v1_t), "ops table", "schedule", "method",
                          NULL, 0},
    [DT_KIND_TENSOR] = {DT_TENSOR_ABI_MAJOR, DT_TENSOR_ABI_MINOR, sizeof(dt_tensor_ops_v1_t),
                        tensor_v1_mandatory, DT_ARRAY_LEN(tensor_v1_mandatory), NULL, 0,
                        sizeof(dt_tensor_ops_v1_t), "ops table", "tensor", "method", NULL, 0},
    [DT_KIND_MODEL] = LAYOUT(model, MODEL, NULL, 0),
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
        [DT_KIND_OFFLOAD] = "offload", [DT_KIND_STRATEGY] = "strategy",
        [DT_KIND_SCHEDULE] = "schedule", [DT_KIND_TENSOR] = "tensor",
        [DT_KIND_MODEL] = "model"};
    const char *k = (kind >= 0 && kind < DT_KIND_COUNT) ? kinds[kind] : "?";
    /* Spelled as DT_ENTRY_NAME spells it: dtrain_##kind##_v##major. */
    snprintf(buf, cap, "dtrain_%s_v%u", k, (unsigned)major);
    return buf;
}
