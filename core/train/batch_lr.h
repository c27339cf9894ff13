/*
 * core/train/batch_lr.h - the learning-rate schedule and the batch
 * arithmetic, pure functions of their arguments (batch_lr.c).
 */
#ifndef DT_TRAIN_BATCH_LR_H
#define DT_TRAIN_BATCH_LR_H

#include <stdint.h>

#include "config/settings.h"

/* Learning rate at 1-based `step`: linear warmup over `warmup` steps from
 * lr/warmup, then `decay` (cosine, linear, constant) from lr to min_lr at
 * `steps`. */
double dt_lr_at(int64_t step, int64_t steps, int64_t warmup, double lr, double min_lr,
                dt_lr_decay_t decay);

/* Resolve micro × accumulation × dp = global.  Zero accum or global means
 * "derive"; both given must agree.  The error explains with all three. */
int dt_batch_resolve(const char *cfg_path, int64_t micro, int64_t *accum, int64_t *global,
                     int64_t dp);

#endif /* DT_TRAIN_BATCH_LR_H */
