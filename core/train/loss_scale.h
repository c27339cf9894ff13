/*
 * core/train/loss_scale.h - the loss scaler of [model] dtype = "fp16": the
 * state machine that decides, step by step, the factor the loss (its
 * gradient) is multiplied by before backward, so small gradients survive
 * 16-bit storage and reduction, and what an overflow does.
 *
 * Semantics are DeepSpeed's DynamicLossScaler (fp16 block), so a config
 * moved from DeepSpeed behaves the same:
 *   - dynamic (loss_scale = 0): the scale starts at 2^initial_scale_power;
 *     a step whose gradient is non-finite anywhere (all ranks agree) is
 *     skipped; after `hysteresis` such steps the scale halves (never below
 *     min_loss_scale) and every later overflow halves it again until it
 *     grows; after `loss_scale_window` clean steps in a row it doubles
 *     (never above 2^127, the largest power of two in f32) and hysteresis
 *     is restored.  An overflow while the scale is already at
 *     min_loss_scale cannot be answered by lowering it: that is an error,
 *     never an endless run of skipped steps (DeepSpeed's
 *     raise_error_at_min_scale).
 *   - static (loss_scale > 0): the scale never changes; any overflow is
 *     an error (a static scale that overflowed once overflows again).
 * The scale is a power of two in dynamic mode, so scaling and unscaling
 * f32 gradients is exact: the scale changes no number but the ones that
 * would have overflowed or flushed to zero.
 */
#ifndef DT_TRAIN_LOSS_SCALE_H
#define DT_TRAIN_LOSS_SCALE_H

#include <stdint.h>

#include "config/settings.h"

struct cJSON;

/* [fp16] as read from the config. */
typedef struct dt_loss_scale_cfg {
    double loss_scale;         /* > 0: static scale; 0: dynamic */
    int64_t initial_power;     /* dynamic: start at 2^initial_power */
    int64_t window;            /* clean steps before the scale doubles, >= 1 */
    int64_t hysteresis;        /* overflows before the scale halves, >= 1 */
    double min_scale;          /* dynamic: the floor, > 0 */
} dt_loss_scale_cfg_t;

typedef struct dt_loss_scaler {
    dt_loss_scale_cfg_t cfg;
    double scale;       /* what the next step's loss is multiplied by */
    int64_t clean;      /* clean steps since the last overflow or growth */
    int64_t hyst_left;  /* overflows left before the next halving */
    int64_t skipped;    /* steps skipped so far in this run */
} dt_loss_scaler_t;

/* What one step's outcome does to the scaler. */
typedef enum dt_loss_scale_event {
    DT_LS_CLEAN = 0,    /* finite: the step counted (the scale may have grown) */
    DT_LS_SKIP = 1,     /* overflow: the step is skipped (the scale may have
                         * been lowered, or a hysteresis count used) */
    DT_LS_FATAL = 2     /* overflow with the scale at its floor (or static):
                         * the run must stop */
} dt_loss_scale_event_t;

/* The largest scale, DT_LOSS_SCALE_MAX (2^127), is config/settings.h's,
 * beside the check of [fp16] this scaler runs with. */

/* Check `cfg` (config errors name the key, with `cfg_path`, DT_ERR_CONFIG)
 * and start the scaler at its initial scale. */
int dt_loss_scale_init(dt_loss_scaler_t *s, const dt_loss_scale_cfg_t *cfg,
                       const char *cfg_path);

/* Account one step: `overflow` 1 when its gradient was non-finite on any
 * rank.  Changes s->scale for the next step and returns the event. */
dt_loss_scale_event_t dt_loss_scale_update(dt_loss_scaler_t *s, int overflow);

/* The scaler's state as the "loss_scale" member of `loop` (a JSON object
 * the checkpoint keeps: dt_ckpt_save's `loop`): scale, clean steps,
 * hysteresis left, steps skipped.  DT_ERR_NOMEM. */
int dt_loss_scale_save(const dt_loss_scaler_t *s, struct cJSON *loop);
/* Continue from the state in `loop` (may be NULL, or lack it: nothing
 * changes): the skipped count always; under dynamic scaling the scale
 * (kept within [min_loss_scale, 2^127]: the config may have changed),
 * clean steps and hysteresis left.  A static scale stays the config's.
 * DT_ERR_DATA naming `what` (the checkpoint) for a malformed record. */
int dt_loss_scale_restore(dt_loss_scaler_t *s, const struct cJSON *loop, const char *what);

#endif /* DT_TRAIN_LOSS_SCALE_H */
