/*
 * plugins/ddp/ddp_internal.h - the state of one ddp instance, shared by the
 * plugin's files (ddp.c: config, lifecycle, estimate, the ops table;
 * ddp_stagger.c: the staggered optimizer update and the hooks, step and
 * state calls that apply a deferred update first).
 *
 * DDP keeps a full replica of everything on every rank of its group and
 * averages gradients by bucketed all-reduces that overlap backward: that
 * is the SDK's replica machinery (dtrain/sdk/replica.h), first in the
 * instance.  What ddp adds is the staggered update.
 */
#ifndef DT_DDP_INTERNAL_H
#define DT_DDP_INTERNAL_H

#include <stdint.h>

#include "dtrain/dtrain.h"
#include "dtrain/sdk/replica.h"

struct dt_strategy {
    dt_replica_t rep;           /* first: buffers, buckets, dp group */

    /* config beyond the replica's */
    int32_t stagger;            /* stagger_update */

    /* staggered update: this rank (odd rank of a group of > 1, with
     * stagger) applies each unit's update at the unit's next use */
    int32_t defer;
    uint8_t *pending;           /* per unit: last step's update not applied */
    uint32_t n_pending;
    dt_optim_step_t pending_st; /* the step those updates belong to */
};

/* ddp_stagger.c */
int ddp_begin_step(dt_strategy_t *s, int64_t step);
int ddp_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out);
int ddp_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out);
int ddp_step(dt_strategy_t *s, const dt_step_args_v1_t *args, dt_step_result_v1_t *out);
int ddp_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, float *buf);
int ddp_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,
                  const float *buf);

#endif /* DT_DDP_INTERNAL_H */
