/*
 * core/train/stage_runner.h - the core's side of a pipeline stage: this
 * rank's units under the schedule plugin's layout (assign_stages), the
 * schedule instance over the pipeline group, and the stage runner
 * (dtrain/schedule.h dt_stage_runner_v1_t) the schedule drives in place
 * of the training loop's micro-batch loop: each forward and backward of a
 * micro-batch through this rank's chunks, its activation slots, the loss
 * and the measured bubble reduced over the world, and the non-finite
 * searches that go through the schedule.
 *
 * The training loop (train.c) embeds one dt_stage_t, zero without
 * parallel.pipeline > 1, and calls, in order: dt_stage_start (the plugin
 * and the grid), dt_stage_assign (which units this rank holds),
 * dt_stage_init (the schedule instance), dt_stage_bind (what a pass reads
 * from the run, once it is all up), then dt_stage_pass each step, and
 * dt_stage_free at the end.
 */
#ifndef DT_TRAIN_STAGE_RUNNER_H
#define DT_TRAIN_STAGE_RUNNER_H

#include <stdint.h>

#include "config/settings.h"
#include "data/data.h"
#include "dtrain/dtrain.h"
#include "loader/loader.h"
#include "model/model.h"
#include "train/grid.h"

/* What a pass reads from the run (dt_stage_bind): the model where its
 * kernels run, the batches, this rank's data-parallel place, the world's
 * communicator for the loss and the searches' reductions, and the data
 * strategy the gradient search steps. */
typedef struct dt_stage_env {
    const dt_settings_t *set;
    dt_model_t *model;
    dt_model_ctx_t *ctx;
    dt_sampler_t *sampler;
    dt_dataset_t *val;
    int32_t *inputs, *targets;  /* (micro_batch, seq_len) */
    int64_t dp;                 /* data-parallel replicas */
    int32_t dp_rank;
    int32_t world_rank, world_size;
    const dt_plugin_t *pcomm;
    dt_comm_t *comm;            /* the world */
    const dt_plugin_t *pstrat;
    dt_strategy_t *strat;
} dt_stage_env_t;

typedef struct dt_stage {
    const dt_plugin_t *plugin;  /* the schedule plugin; NULL: no pipeline */
    dt_schedule_t *sched;       /* its instance (starts with its table) */
    const dt_grid_t *grid;      /* the run's */
    /* this rank's units: its chunks [chunk_first[c], chunk_end[c]), one
     * unless the schedule interleaves (virtual stage c x pp + pp_rank) */
    uint32_t n_chunks;
    uint32_t chunk_first[DT_MODEL_MAX_CHUNKS], chunk_end[DT_MODEL_MAX_CHUNKS];
    uint32_t n_slots;           /* micro-batches' activations kept per chunk
                                 * (assign_stages' in_flight) */
    uint32_t n_boundary;        /* boundary tensors the schedule allocates
                                 * (assign_stages' buffers), planned */
    int64_t *slot_micro;        /* (n_chunks x n_slots) the micro-batch whose
                                 * activations chunk c's slot i holds (-1:
                                 * none of this pass) */
    /* The measured bubble, one block of 4 * pp + 1 doubles: red is what
     * the loss's all-reduce sums over the world (the loss, then each
     * stage's receive-wait seconds, then its seconds in the schedule's
     * run; a rank fills its own stage's slots; after a training pass, the
     * means over the data-parallel replicas); wait and busy the training
     * steps' totals per stage (busy: in run, not waiting on a receive);
     * step_span the last training pass's slowest stage's schedule
     * seconds, span their total. */
    double *red, *wait, *busy;
    double step_span, span;
    dt_stage_env_t env;
} dt_stage_t;

/* The assign_stages question for `set`'s [pipeline] layout over p stages
 * of model d and n_micro micro-batches, outputs unasked (the training
 * loop, the launcher's preflight and `dtrain plan` ask the same). */
void dt_stage_args_init(dt_stage_args_t *sa, const dt_settings_t *set, int32_t p,
                        const dt_model_desc_t *d, uint32_t n_micro);

/* The schedule plugin `p` over `grid`: the bubble's counters. */
int dt_stage_start(dt_stage_t *S, const dt_plugin_t *p, const dt_grid_t *grid);

/* The schedule's assignment of units to stages, checked and printed by
 * world rank 0 (one line per stage, or per virtual stage when it
 * interleaves V chunks per rank: virtual stage j is rank j % pp's chunk
 * j / pp); this rank's chunks, and the DT_UNIT_* flags its data strategy
 * holds them by (`flags`: n_units entries): the chunks' units, and a unit
 * the last stage also reads (GPT-2's wte, for the tied LM head) TIED on
 * its owner and a TIED COPY on the last stage.  *tied: this rank holds a
 * TIED unit. */
int dt_stage_assign(dt_stage_t *S, dt_model_t *model, const dt_settings_t *set, int32_t world_rank,
                    uint8_t *flags, int *tied);

/* The schedule instance over the pipeline group `comm`. */
int dt_stage_init(dt_stage_t *S, const dt_settings_t *set, dt_device_t *dev, dt_stream_t *stream,
                  dt_comm_t *comm);

/* What the passes read from the run, once it is all up. */
void dt_stage_bind(dt_stage_t *S, const dt_stage_env_t *env);

/* The n_micro micro-batches of a training step (or, with `eval`, the
 * forwards of n_micro validation batches) through the schedule; *loss the
 * mean micro-batch loss over the data-parallel replicas (the last stages
 * hold it; f64, so one replica's is the single-rank number exactly).  A
 * training pass adds its measured bubble to the totals.  Collective over
 * the world. */
int dt_stage_pass(dt_stage_t *S, int64_t step, uint32_t n_micro, float micro_scale, int eval,
                  double *loss);

/* After the loss scale reached its floor: the step's forwards and
 * backwards again at `scale`, each stage probing its own units'
 * gradients; `what` then names the first non-finite gradient in backward
 * order and its stage, or, all finite, the model's largest element.  Ends
 * in a data strategy step (lr 0).  Collective over the world. */
int dt_stage_find_nonfinite_grad(dt_stage_t *S, int64_t step, double scale, char *what,
                                 size_t cap);

/* After a non-finite step: the step's forwards again, each stage probing
 * its own units; `what` is then the first non-finite tensor of the
 * earliest stage that found one, with the stage named.  Collective. */
int dt_stage_find_nonfinite(dt_stage_t *S, int64_t step, char *what, size_t cap);

/* The fraction of `span` seconds a stage was not busy (computing or
 * sending: in the schedule's run, not waiting on a receive).  span is the
 * slowest stage's schedule time, so the last stage's idle tail counts as
 * idle, as in the formula (p-1)/(m+p-1). */
double dt_stage_idle_fraction(double busy, double span);

/* The schedule instance and the counters. */
void dt_stage_free(dt_stage_t *S);

#ifdef DTRAIN_TEST_HOOKS
/* DTRAIN_FAULT_KILL_AT_BACKWARD=STEP:MICRO (test builds only): this rank
 * kills itself (SIGKILL) as its stage starts the backward of micro-batch
 * MICRO of step STEP (without a pipeline: as the micro-batch starts), so a
 * test finds its peers inside the pipeline's send/recv or the tensor
 * group's all-reduce, not wherever a kill from outside happened to land. */
void dt_fault_kill_at_backward(int64_t step, uint32_t micro);
#endif

#endif /* DT_TRAIN_STAGE_RUNNER_H */
