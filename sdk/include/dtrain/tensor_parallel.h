/*
 * dtrain/tensor_parallel.h - the tensor-parallel scheme ABI (plugin kind
 * "tensor").
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Tensor parallelism splits each large layer over the ranks of a tensor
 * group ([parallel] tensor = P > 1; world = tp x pp x dp, tp fastest).  The
 * split itself is the model's: each parameter says whether it is
 * column-parallel (its output features split), row-parallel (its input
 * features split), vocabulary-parallel (its vocabulary rows split) or
 * replicated (dtrain/strategy.h dt_param_split_v1_t).  A TENSOR SCHEME
 * ([tensor] scheme names the plugin; the shipped one is `megatron`,
 * Megatron-LM's 1D layout) owns the collectives that surround the split
 * layers, named by what they do for the layer, not by the collective:
 *
 *   row_forward            Megatron's g in forward: the partial outputs of
 *                          a row-parallel layer (attention and MLP output
 *                          projections) made whole;
 *   column_backward_start  Megatron's f in backward: the partial input
 *   column_backward_wait   gradients of a column-parallel layer (qkv, MLP
 *                          input projection, the LM head) made whole,
 *                          started so the model computes the weight
 *                          gradient while it is in flight, then waited;
 *   embedding_forward      the vocabulary-parallel embedding's partial
 *                          lookups (each rank holds a range of the
 *                          vocabulary) made whole;
 *   xent_reduce            the vocabulary-parallel cross-entropy's row
 *                          statistics (the logits' row maxima, then the
 *                          sums of exponentials and target logits).
 *
 * The model calls the scheme, the scheme calls the tensor group's
 * communicator (init.comm): two hops.  Every slot is collective over the
 * tensor group: every rank calls it in the same order with the same count.
 * Buffers are device memory, reduced in place; each call is ordered after
 * the work enqueued on `stream` and leaves `buf` ready for the work
 * enqueued after it (or, for column_backward_start, after the wait).
 * Every wait is bounded by the group's timeout: a dead peer fails the call
 * with DT_ERR_REMOTE / DT_ERR_TIMEOUT and the communicator's message naming
 * the operation and the peer; the model adds the tensor and the unit.
 *
 * A scheme holds no parameters: every rank's data strategy holds that
 * rank's parts, reduced over the ranks holding the same parts.
 *
 * Thread safety: the core drives an instance from one thread.
 */
#ifndef DTRAIN_TENSOR_PARALLEL_H
#define DTRAIN_TENSOR_PARALLEL_H

#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/plugin.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_TENSOR_ABI_MAJOR 1
#define DT_TENSOR_ABI_MINOR 0

/* A tensor group (dt_tensor_group_t): opaque to the core, the plugin's own struct, which
 * must start with a pointer to the table that made it (libfabric's rule):
 *     struct dt_tensor_group { const dt_tensor_ops_v1_t *ops; ... };  // ops = &my_ops
 * so a handle alone is enough to call it: dt_tensor_ops(g)->slot(g, ...).
 * The core refuses a handle whose first member is not the table it
 * loaded from the plugin. */
typedef struct dt_tensor_group dt_tensor_group_t; /* plugin instance, opaque */

/* init's arguments (in; valid during init). */
typedef struct dt_tensor_init_v1 {
    uint32_t struct_size;        /* sizeof(dt_tensor_init_v1_t), core's build */
    dt_device_t *dev;            /* its table: dt_device_ops(dev) */
    dt_stream_t *compute_stream; /* where the core runs kernels */
    dt_comm_t *comm;             /* the tensor group: P >= 2 ranks, group
                                  * rank = tensor rank (the model's part) */
    /* ---- minor 0 ends here; append only ---- */
} dt_tensor_init_v1_t;
#define DT_TENSOR_INIT_V1_SIZE0 DT_FIELD_END(dt_tensor_init_v1_t, comm)

typedef struct dt_tensor_ops_v1 {
    dt_plugin_info_t info; /* base first; info.kind == DT_KIND_TENSOR */

    /* ---- every slot is mandatory ---- */
    /* Create the instance over the tensor group (dt_args_read the args);
     * refuse what it cannot run: a missing communicator or device
     * (DT_ERR_INVALID), a group of fewer than 2 ranks (DT_ERR_INVALID). */
    int (*init)(const dt_host_v1_t *host, const dt_tensor_init_v1_t *args,
                dt_tensor_group_t **out);
    /* Free the instance (NULL: nothing).  Its group's rank 0 may log what
     * the group carried. */
    void (*finalize)(dt_tensor_group_t *g);
    /* Forward of a row-parallel layer: `buf` holds this rank's partial
     * output, `count` elements of `dtype` (activations: DT_F32, DT_BF16,
     * DT_F16); on return it holds the sum over the group. */
    int (*row_forward)(dt_tensor_group_t *g, void *buf, uint64_t count, int dtype,
                       dt_stream_t *stream);
    /* Backward of a column-parallel layer: `buf` holds this rank's partial
     * gradient of the layer's input; start summing it over the group and
     * return at once with the operation in *req (never NULL on DT_OK), or
     * with *req NULL when it is already done.  The model reads `buf` only
     * after column_backward_wait. */
    int (*column_backward_start)(dt_tensor_group_t *g, void *buf, uint64_t count, int dtype,
                                 dt_stream_t *stream, dt_comm_req_t **req);
    /* Wait for a column_backward_start's request (NULL: DT_OK at once):
     * DT_OK when its buffer holds the sum.  Frees the request either way. */
    int (*column_backward_wait)(dt_tensor_group_t *g, dt_comm_req_t *req);
    /* Forward of the vocabulary-parallel embedding: `buf` holds this
     * rank's lookups (zero where a token lies outside its vocabulary
     * range; the position embedding added by tensor rank 0 only); on
     * return it holds the sum over the group. */
    int (*embedding_forward)(dt_tensor_group_t *g, void *buf, uint64_t count, int dtype,
                             dt_stream_t *stream);
    /* The vocabulary-parallel cross-entropy's row statistics, `count`
     * DT_F32 values reduced with `op` over the group: DT_OP_MAX for the
     * logits' row maxima, DT_OP_SUM for the sums of exponentials and the
     * target logits. */
    int (*xent_reduce)(dt_tensor_group_t *g, float *buf, uint64_t count, int op,
                       dt_stream_t *stream);
    /* ---- minor 0 ends here; append only ---- */
} dt_tensor_ops_v1_t;

/* Current-version names. */
typedef dt_tensor_ops_v1_t dt_tensor_ops_t;

/* The table instance `g` was made by: its first member (the rule at
 * dt_tensor_group_t above); NULL for a NULL handle. */
static inline const dt_tensor_ops_v1_t *dt_tensor_ops(const dt_tensor_group_t *g)
{
    return g ? *(const dt_tensor_ops_v1_t *const *)(const void *)g : NULL;
}
typedef dt_tensor_init_v1_t dt_tensor_init_t;

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_TENSOR_PARALLEL_H */
