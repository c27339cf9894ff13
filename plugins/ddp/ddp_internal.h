/*
 * plugins/ddp/ddp_internal.h - the state of one ddp instance, shared by the
 * plugin's files (ddp.c: lifecycle, config, estimate; ddp_step.c: hooks,
 * gradient buckets, the optimizer step; ddp_state.c: checkpoint state and
 * the initial-replica check).
 *
 * DDP keeps a full replica of everything on every rank of its group: f32
 * master parameters, an optional bf16 compute copy, f32 gradients and the
 * optimizer moments, each ONE flat device buffer laid out unit after unit
 * (sdk_helpers.h dt_flat_layout_t).  Units are grouped into buckets in
 * backward order; a bucket is a contiguous span of the gradient buffer, so
 * an f32 bucket is all-reduced in place.
 */
#ifndef DT_DDP_INTERNAL_H
#define DT_DDP_INTERNAL_H

#include <stdint.h>

#include "dtrain/dtrain.h"
#include "dtrain/sdk_helpers.h"

/* Unit slices start on 16-element (64-byte f32) boundaries. */
#define DDP_ALIGN 16u
/* bf16 reduction buffers: two, so one bucket can be cast while the
 * previous one is on the wire. */
#define DDP_MAX_SLOTS 2u
/* Host staging for hashing parameters (init_check = checksum). */
#define DDP_HASH_STAGING (4u << 20)

typedef enum ddp_bucket_state {
    DDP_B_IDLE = 0,     /* waiting for its units' final post_backward */
    DDP_B_READY = 1,    /* gradients complete, not started (an earlier
                         * bucket has not started yet, or overlap = false) */
    DDP_B_INFLIGHT = 2, /* all_reduce started */
    DDP_B_DONE = 3      /* reduced (and cast back) */
} ddp_bucket_state_t;

typedef struct ddp_bucket {
    uint32_t unit_lo, unit_hi; /* units [unit_lo, unit_hi] */
    uint64_t off, count;       /* span of the flat layout, elements */
    uint32_t n_units, n_ready; /* units in it / units whose gradient is final */
    int32_t state;             /* ddp_bucket_state_t */
    uint32_t slot;             /* bf16: which reduction buffer */
    dt_comm_req_t *req;
} ddp_bucket_t;

struct dt_strategy {
    dt_dp_t dp;                 /* host, device, group, model, optimizer,
                                 * hook depths (sdk_helpers.h) */

    /* config */
    double bucket_cap_mb;
    int32_t reduce_dtype;       /* DT_F32 or DT_BF16 */
    int32_t overlap;
    int32_t init_broadcast;     /* 0: checksum, 1: broadcast */
    int32_t stagger;            /* stagger_update */

    /* staggered update: this rank (odd rank of a group of > 1, with
     * stagger) applies each unit's update at the unit's next use */
    int32_t defer;
    uint8_t *pending;           /* per unit: last step's update not applied */
    uint32_t n_pending;
    dt_optim_step_t pending_st; /* the step those updates belong to */

    /* replicated state, one flat buffer each (layout.total elements) */
    dt_flat_layout_t layout;
    float *master;              /* f32 master parameters */
    void *compute;              /* bf16 compute copy, or == master */
    float *grads;
    float *m, *v;               /* AdamW moments; SGD: m = momentum, v NULL */

    /* hook bookkeeping, per unit */
    uint8_t *final_done;        /* final post_backward seen this step */

    /* buckets */
    ddp_bucket_t *buckets;
    uint32_t n_buckets;
    uint32_t *bucket_of_unit;
    uint32_t next_launch;       /* buckets start strictly in index order */
    void *comm_buf;             /* bf16: n_slots * slot_elems */
    uint32_t n_slots;
    uint64_t slot_elems;
    int32_t slot_bucket[DDP_MAX_SLOTS]; /* bucket using the slot, -1 none */
    dt_stream_t *comm_stream;
    dt_event_t *ev_grads;       /* compute -> comm: gradients written */
    dt_event_t *ev_reduced;     /* comm -> compute: reductions done */
    double *norm_slot;          /* one device double for sumsq */
};

/* ddp_step.c */
int ddp_begin_step(dt_strategy_t *s, int64_t step);
int ddp_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out);
int ddp_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h);
int ddp_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out);
int ddp_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h);
int ddp_step(dt_strategy_t *s, const dt_step_args_v1_t *args, dt_step_result_v1_t *out);
/* Wait for every started reduction, stopping at the first failure (the
 * rest stay in flight, the message stays the failure's); timeout_ms 0
 * drops them all (finalize). */
int ddp_drain(dt_strategy_t *s, int64_t timeout_ms);
/* Apply unit u's deferred update, if any (no-op otherwise). */
int ddp_apply_pending(dt_strategy_t *s, uint32_t u);

/* ddp_state.c */
int ddp_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,
                     dt_range_t *out, uint32_t cap, uint32_t *n);
int ddp_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, float *buf);
int ddp_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                  const float *buf);
int ddp_state_loaded(dt_strategy_t *s);


#endif /* DT_DDP_INTERNAL_H */
