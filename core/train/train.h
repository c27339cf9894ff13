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

#endif /* DT_TRAIN_H */
