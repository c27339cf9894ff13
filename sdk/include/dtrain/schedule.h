/*
 * dtrain/schedule.h - the pipeline schedule ABI (plugin kind "schedule").
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Pipeline parallelism splits the model's units into stages, one per rank
 * of the pipeline group.  World = tp x pp x dp (tp fastest, then dp, then
 * pp).  On a rank two plugins share the work:
 *
 *   - the SCHEDULE ([parallel] pipeline > 1 selects the plugin [pipeline]
 *     schedule names), initialised over the pipeline group (init.comm:
 *     one rank per stage, group rank = stage).  It holds no parameters and
 *     owns the order of a step: `assign_stages` (no instance) maps units
 *     to stages, and `run` runs this stage's forward and backward passes
 *     of every micro-batch in the schedule's order, moving the boundary
 *     activations and their gradients to the neighbouring stages with the
 *     comm table's send / recv (started on the compute stream, asynchronous
 *     requests, bounded waits), through the core's dt_stage_runner_v1_t;
 *   - the DATA strategy (strategy.h: ddp, zero, fsdp), told which units its
 *     stage holds (dt_strategy_init_v1_t.unit_flags): it allocates, hooks,
 *     reduces, updates and saves only those.
 *
 * The core owns the pipeline's layout settings ([pipeline] virtual_stages,
 * keep_activations, balance) and hands them to every schedule in
 * dt_stage_args_v1_t and dt_schedule_init_v1_t, so any schedule reads the
 * same keys; a schedule that cannot honour one refuses it with
 * DT_ERR_CONFIG and a message naming the key.  A schedule's own settings
 * live in the table named after it.
 *
 * Interleaved stages: with chunks V > 1 ("virtual stages", Megatron's
 * interleaved layout) the units are cut into n_stages x V virtual stages,
 * virtual stage j running on rank j % n_stages as its chunk j / n_stages,
 * so the units a rank holds need not be contiguous.
 *
 * Thread safety: the core drives an instance from one thread; run never
 * overlaps itself.  assign_stages needs no instance and may be called from
 * any thread (the planner and the launcher's preflight call it).
 */
#ifndef DTRAIN_SCHEDULE_H
#define DTRAIN_SCHEDULE_H

#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/plugin.h"
#include "dtrain/strategy.h" /* dt_model_desc_v1_t */
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_SCHEDULE_ABI_MAJOR 1
#define DT_SCHEDULE_ABI_MINOR 0

/* A schedule instance (dt_schedule_t): opaque to the core, the plugin's own struct, which
 * must start with a pointer to the table that made it (libfabric's rule):
 *     struct dt_schedule { const dt_schedule_ops_v1_t *ops; ... };  // ops = &my_ops
 * so a handle alone is enough to call it: dt_schedule_ops(s)->slot(s, ...).
 * The core refuses a handle whose first member is not the table it
 * loaded from the plugin. */
typedef struct dt_schedule dt_schedule_t; /* plugin instance, opaque */

/* dt_stage_args_v1_t.balance: how units are spread over the (virtual)
 * stages ([pipeline] balance).  Stable numbers: append only. */
typedef enum dt_balance {
    DT_BALANCE_UNIFORM = 0, /* equal unit counts */
    DT_BALANCE_PARAMS = 1,  /* contiguous stages, the least largest
                             * parameter count */
    DT_BALANCE_FLOPS = 2    /* the same by FLOPs per token (unit_flops) */
} dt_balance_t;

/* assign_stages' question (in, the core's, except the optional outputs). */
typedef struct dt_stage_args_v1 {
    uint32_t struct_size;            /* sizeof(dt_stage_args_v1_t), core's build */
    int32_t n_stages;                /* [parallel] pipeline, >= 2 */
    const dt_model_desc_v1_t *model; /* units in model order */
    uint32_t n_micro;                /* micro-batches a step */
    uint32_t chunks;                 /* [pipeline] virtual_stages, V >= 1: out[u]
                                      * in [0, n_stages x V) */
    uint32_t keep_activations;       /* [pipeline] keep_activations: 1 = the core
                                      * may keep every micro-batch's activations
                                      * in flight; 0 = it keeps one and
                                      * recomputes the others' forwards */
    int32_t balance;                 /* [pipeline] balance, dt_balance_t */
    /* in, optional (NULL: the core does not say): model->n_units entries,
     * the FLOPs each unit spends on one token, forward and backward (6 per
     * matmul parameter plus attention's; GPT-2's tied LM head counted in
     * the head unit that runs it), for DT_BALANCE_FLOPS. */
    const double *unit_flops;
    /* out, optional (NULL: not asked; the planner asks): n_stages entries,
     * the most stage inputs (boundary tensors) stage k stashes at once
     * under the schedule for n_micro micro-batches (0 for the first
     * stage's first chunk, which reads tokens). */
    uint32_t *stash;
    /* out, optional (NULL: not asked), n_stages entries, filled with 1 by
     * the caller: the micro-batches whose activations stage k keeps at
     * once per chunk, so that each backward runs on the activations its
     * forward left (the core allocates that many activation slots): the
     * most in flight under the schedule (GPipe n_micro, 1F1B min(n_micro,
     * n_stages - k)), or 1 with keep_activations 0 (the core recomputes a
     * micro-batch's forward before its backward). */
    uint32_t *in_flight;
    /* out, optional (NULL: not asked), n_stages entries: the boundary
     * tensors (B x T x boundary width in the activation dtype) the
     * schedule allocates on stage k: stashed inputs, outputs and input
     * gradients in flight, received gradients.  The planner adds them to
     * the stage's activations. */
    uint32_t *buffers;
    /* ---- minor 0 ends here; append only ---- */
} dt_stage_args_v1_t;
#define DT_STAGE_ARGS_V1_SIZE0 DT_FIELD_END(dt_stage_args_v1_t, buffers)

/* init's arguments (in; valid during init). */
typedef struct dt_schedule_init_v1 {
    uint32_t struct_size;      /* sizeof(dt_schedule_init_v1_t), core's build */
    uint32_t n_micro;          /* micro-batches a training step */
    dt_device_t *dev;          /* its table: dt_device_ops(dev) */
    dt_stream_t *compute_stream; /* where the core runs kernels */
    dt_comm_t *comm;           /* the pipeline group: rank = stage */
    uint32_t chunks;           /* as dt_stage_args_v1_t */
    uint32_t keep_activations; /* as dt_stage_args_v1_t */
    /* ---- minor 0 ends here; append only ---- */
} dt_schedule_init_v1_t;
#define DT_SCHEDULE_INIT_V1_SIZE0 DT_FIELD_END(dt_schedule_init_v1_t, keep_activations)

/* The core's side of a stage, handed to run (in; the core's, valid during
 * the call).  Boundary tensors are device memory of
 * dt_schedule_args_v1_t.act_count elements of act_dtype, (B, T, C) for
 * GPT-2: the residual stream between two units.  Both calls queue their
 * kernels on the compute stream and return when the output is ready to be
 * sent (the core synchronises the stream).  Any failure is returned with
 * the message set; the schedule stops and returns it. */
typedef struct dt_stage_runner_v1 {
    uint32_t struct_size;  /* sizeof(dt_stage_runner_v1_t), core's build */
    uint32_t act_slots;    /* the activation slots the core keeps per chunk:
                            * a schedule passes `in` NULL to backward only
                            * when this covers its micro-batches in flight */
    void *ctx;             /* the core's, passed back */
    /* Forward of micro-batch `micro` through this rank's chunk `chunk`
     * (its virtual stage chunk x n_stages + stage; 0 without chunks).
     * `in`: the previous virtual stage's output (NULL on virtual stage 0,
     * which reads the micro-batch's tokens itself); `out`: this chunk's
     * output (NULL on the last virtual stage, which computes the loss
     * instead and adds the micro-batch's mean loss to *loss; untouched
     * elsewhere). */
    int (*forward)(void *ctx, uint32_t chunk, uint32_t micro, const void *in, void *out,
                   double *loss);
    /* Backward of micro-batch `micro` through chunk `chunk`: `in` is the
     * same input its forward had (NULL on virtual stage 0); `dout` the
     * gradient of the chunk's output (NULL on the last virtual stage: the
     * loss starts it), `din` receives the gradient of `in` (NULL on
     * virtual stage 0).  The core keeps the activations of act_slots
     * micro-batches (slot micro % act_slots): when those of `micro` are
     * still there it runs backward on them and `in` may be NULL; otherwise
     * it recomputes the chunk's forward from `in` first (GPipe's
     * re-materialisation), so such a schedule stashes the stage inputs.  A
     * backward that would need `in` and has NULL fails DT_ERR_INVALID. */
    int (*backward)(void *ctx, uint32_t chunk, uint32_t micro, const void *in,
                    const void *dout, void *din);
    /* ---- minor 0 ends here; append only ---- */
} dt_stage_runner_v1_t;
#define DT_STAGE_RUNNER_V1_SIZE0 DT_FIELD_END(dt_stage_runner_v1_t, backward)

/* dt_schedule_args_v1_t.flags */
#define DT_SCHEDULE_NO_GRAD 0x1u /* forwards only (evaluation): the runner's
                                  * backward is never called, and the
                                  * runner's forward flags its hooks
                                  * DT_HOOK_NO_GRAD */

/* run's arguments (in; the core's). */
typedef struct dt_schedule_args_v1 {
    uint32_t struct_size;     /* sizeof(dt_schedule_args_v1_t), core's build */
    uint32_t n_micro;         /* micro-batches this pass */
    int64_t step;             /* 1-based, for messages */
    uint64_t act_count;       /* elements of one boundary tensor */
    int32_t act_dtype;        /* their dtype (dt_dtype_t) */
    uint32_t flags;           /* DT_SCHEDULE_* */
    const dt_stage_runner_v1_t *runner;
    /* ---- minor 0 ends here; append only ---- */
} dt_schedule_args_v1_t;
#define DT_SCHEDULE_ARGS_V1_SIZE0 DT_FIELD_END(dt_schedule_args_v1_t, runner)

/* run's result (out: core zero-fills and sets struct_size;
 * dt_result_write). */
typedef struct dt_schedule_result_v1 {
    uint32_t struct_size;     /* sizeof(dt_schedule_result_v1_t), core's build */
    uint32_t n_loss;          /* micro-batches whose loss this stage computed:
                               * n_micro on the last stage, else 0 */
    double loss_sum;          /* the sum of their mean losses */
    double recv_wait_s;       /* seconds waiting on receives: the bubble as
                               * measured on this stage */
    /* ---- minor 0 ends here; append only ---- */
} dt_schedule_result_v1_t;
#define DT_SCHEDULE_RESULT_V1_SIZE0 DT_FIELD_END(dt_schedule_result_v1_t, recv_wait_s)

typedef struct dt_schedule_ops_v1 {
    dt_plugin_info_t info; /* base first; info.kind == DT_KIND_SCHEDULE */

    /* ---- every slot is mandatory ---- */
    /* Create the instance over the pipeline group (dt_args_read the
     * args); refuse settings it cannot run (DT_ERR_CONFIG). */
    int (*init)(const dt_host_v1_t *host, const dt_schedule_init_v1_t *args,
                dt_schedule_t **out);
    void (*finalize)(dt_schedule_t *s);
    /* Map every unit to a (virtual) stage, no instance (the planner and
     * the launcher call it too): out[u] in [0, n_stages x chunks) for each
     * of model->n_units units, never decreasing, every stage given at least
     * one unit, by args->balance; fill the optional outputs asked for.
     * DT_ERR_CONFIG naming the key when the layout cannot be run (fewer
     * units than stages, a chunk count or micro-batch count the schedule
     * does not take). */
    int (*assign_stages)(const dt_host_v1_t *host, const dt_stage_args_v1_t *args,
                         uint32_t *out);
    /* One pass of this stage: every micro-batch's forward and (unless
     * DT_SCHEDULE_NO_GRAD) backward in the schedule's order, boundary
     * tensors received from stage - 1 and sent to stage + 1 (their
     * gradients the other way) on the pipeline group.  Collective over the
     * pipeline group; blocking, every wait bounded by the group's timeout:
     * a dead peer fails it with DT_ERR_REMOTE / DT_ERR_TIMEOUT and a
     * message naming the peer stage, the operation (send / recv of
     * activation or gradient), the micro-batch and the step.  The data
     * strategy's begin_step before and step after are the core's. */
    int (*run)(dt_schedule_t *s, const dt_schedule_args_v1_t *args,
               dt_schedule_result_v1_t *out);
    /* ---- minor 0 ends here; append only ---- */
} dt_schedule_ops_v1_t;

/* Current-version names. */
typedef dt_schedule_ops_v1_t dt_schedule_ops_t;

/* The table instance `s` was made by: its first member (the rule at
 * dt_schedule_t above); NULL for a NULL handle. */
static inline const dt_schedule_ops_v1_t *dt_schedule_ops(const dt_schedule_t *s)
{
    return s ? *(const dt_schedule_ops_v1_t *const *)(const void *)s : NULL;
}
typedef dt_schedule_init_v1_t dt_schedule_init_t;
typedef dt_stage_args_v1_t dt_stage_args_t;
typedef dt_stage_runner_v1_t dt_stage_runner_t;
typedef dt_schedule_args_v1_t dt_schedule_args_t;
typedef dt_schedule_result_v1_t dt_schedule_result_t;

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SCHEDULE_H */
