/*
 * core/train/train.h - the training run: plugins brought up in order
 * (device, comm, strategy), the model initialised identically on every
 * rank, then steps of micro-batches with accumulation, clipping, schedule,
 * evaluation, metrics and checkpoints.
 */
#ifndef DT_TRAIN_H
#define DT_TRAIN_H

#include "setup/resolve.h"

typedef struct dt_train_opts {
    const char *metrics_path; /* --metrics FILE, overrides run.metrics; NULL */
} dt_train_opts_t;

/* Train as configured.  Returns DT_OK, DT_ERR_CONFIG for configuration
 * problems found only now (batch arithmetic, data vs model), or the
 * failure's status with the message set. */
int dt_train(dt_resolved_t *r, const dt_train_opts_t *opts);

/* Learning rate at 1-based `step`: linear warmup over `warmup` steps from
 * lr/warmup, then `decay` (cosine, linear, constant) from lr to min_lr at
 * `steps`. */
double dt_lr_at(int64_t step, int64_t steps, int64_t warmup, double lr, double min_lr,
                dt_lr_decay_t decay);

/* Resolve micro × accumulation × dp = global.  Zero accum or global means
 * "derive"; both given must agree.  The error explains with all three. */
int dt_batch_resolve(const char *cfg_path, int64_t micro, int64_t *accum, int64_t *global,
                     int64_t dp);

#endif /* DT_TRAIN_H */
