/*
 * core/train/plan.h - predicted per-rank memory and communication of a
 * strategy for a model, from the strategy plugin's estimate() and the
 * model's activation plan: what `dtrain plan` prints for every strategy,
 * and what a run prints beside the bytes it measured.
 */
#ifndef DT_ENGINE_PLAN_H
#define DT_ENGINE_PLAN_H

#include "config/settings.h"
#include "dtrain/dtrain.h"
#include "model/model.h"
#include "loader/loader.h"

/* The estimate of strategy plugin `strat` (its host carries its resolved
 * config) for model `m` trained as `set` says (optimizer, micro_batch x
 * seq_len, accumulation; the dtype is the model's) on a data-parallel
 * group of `world` ranks.  Sets the units' act_bytes as a side effect. */
int dt_plan_strategy(const dt_plugin_t *strat, dt_model_t *m, const dt_settings_t *set,
                     int world, dt_estimate_t *out);

/* Model-state bytes (params + grads + optimizer) of an estimate. */
uint64_t dt_plan_model_state(const dt_estimate_t *e);

/* `b` as "12.34 MiB" below 1 GiB and "1.92 GiB" above; returns buf. */
const char *dt_plan_bytes(uint64_t b, char *buf, size_t cap);

#endif /* DT_ENGINE_PLAN_H */
