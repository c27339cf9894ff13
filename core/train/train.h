/*
 * core/train/train.h - the training run: plugins brought up in order
 * (device, comm, strategy), the model initialised identically on every
 * rank, then steps of micro-batches with accumulation, clipping, schedule,
 * evaluation, metrics and checkpoints; or, for `dtrain eval`, one
 * evaluation of a checkpoint's state.
 */
#ifndef DT_TRAIN_H
#define DT_TRAIN_H

#include "setup/resolve.h"

typedef struct dt_train_opts {
    const char *metrics_path; /* --metrics FILE, overrides run.metrics; NULL */
    /* `dtrain eval`: no training step and no checkpoint written.  The
     * state of checkpoint.resume (required) is loaded as a resumed run
     * loads it, then data.val (required; data.train is not read) is
     * evaluated once as a run's evaluation does (the same batches, the
     * same code: the first eval_batches global batches of the file, 0 =
     * every whole one), and rank 0 prints one line:
     *   eval: CKPT step S: N batches of G x T tokens of FILE: loss L, perplexity P
     * The mean loss, the same on every rank, goes to *eval_loss if given. */
    int eval_only;
    int64_t eval_batches;
    double *eval_loss;
} dt_train_opts_t;

/* Train as configured.  Returns DT_OK, DT_ERR_CONFIG for configuration
 * problems found only now (batch arithmetic, data vs model), or the
 * failure's status with the message set. */
int dt_train(dt_resolved_t *r, const dt_train_opts_t *opts);

#endif /* DT_TRAIN_H */
