/*
 * core/train/preflight.h - what `dtrain run` checks before training that
 * needs no plugin instance, as one step `dtrain check` and the launching
 * parent of a multi-rank run take too: a config `check` passes is one
 * `run` starts, and a config error stops a launch before any rank exists.
 */
#ifndef DT_TRAIN_PREFLIGHT_H
#define DT_TRAIN_PREFLIGHT_H

#include "model/model.h"
#include "setup/resolve.h"

/* After dt_resolve_plugins (the device plugin's kernel table is consulted,
 * no device is initialised), for a world of `world` ranks:
 *   dt_preflight_dp      the data-parallel degree: world / (tensor x
 *                        pipeline ranks)
 *   the model as the config describes it (tensor rank 0's part of it on
 *   no device: the keys its arch reads, a preset's shapes with origin
 *   "preset", the shape's own rules and its tensor-parallel layout), then
 *   dt_preflight_batch   micro_batch x grad_accum x dp = global_batch,
 *                        the two written back to the config (origin
 *                        "derived" where computed), seq_len within the
 *                        model's context
 *   dt_preflight_pipeline  with parallel.pipeline > 1, the schedule
 *                        plugin's layout for that many micro-batches
 *                        (its assign_stages: virtual_stages against
 *                        keep_activations, grad_accum and the model's
 *                        units; stages against units)
 *   dt_preflight_data    the token files: [data] train named (only with
 *                        `require_data`: `check` of a config without data
 *                        passes), each file given opened and its tokens
 *                        checked against the model's vocabulary
 * DT_ERR_CONFIG with the message set on the first problem (a token file
 * that is not one: the data module's status). */
int dt_preflight(dt_resolved_t *r, int64_t world, int require_data);


/* *dp = world / parallel.pipeline (core/train/grid.h); DT_ERR_CONFIG
 * naming the config when the stages do not divide the world. */
int dt_preflight_dp(const dt_resolved_t *r, int64_t world, int64_t *dp);

/* With parallel.pipeline > 1: the model splits into that many stages
 * (an arch that cannot be split, or fewer units than stages, is
 * DT_ERR_CONFIG naming the config). */
int dt_preflight_stages(const dt_resolved_t *r, dt_model_t *m);

/* With parallel.pipeline > 1: the schedule plugin's assign_stages, as the
 * training loop calls it (after dt_preflight_batch: n_micro is
 * train.grad_accum), on the model `m` describes; its error (DT_ERR_CONFIG,
 * "schedule/1f1b: ...") as it would fail every rank.  DT_OK when there is
 * no pipeline. */
int dt_preflight_pipeline(const dt_resolved_t *r, dt_model_t *m);

/* [data] train names a token file: DT_ERR_CONFIG when it is empty. */
int dt_preflight_data_named(const dt_settings_t *set);

/* dt_preflight_data_named (with `require_train`), then [data] train and
 * val, where given, opened as token files (dt_data_open) with every token
 * below `vocab_size`, and closed again. */
int dt_preflight_data(const dt_settings_t *set, int64_t vocab_size, int require_train);

/* The batch arithmetic (dt_batch_resolve) written back to r->cfg and
 * r->set, and seq_len checked against `context` (<= 0: no limit). */
int dt_preflight_batch(dt_resolved_t *r, int64_t dp, int64_t context);

#endif /* DT_TRAIN_PREFLIGHT_H */
