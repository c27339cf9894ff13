/*
 * core/train/plan.h - predicted per-rank memory and communication of a
 * strategy for a model, from the strategy plugin's estimate() and the
 * model's activation plan: what `dtrain plan` prints for every strategy,
 * and what a run prints beside the bytes it measured.
 */
#ifndef DT_TRAIN_PLAN_H
#define DT_TRAIN_PLAN_H

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

/* The same with the tier chosen here rather than by set->parallel.offload:
 * `offload` 1 plans the strategy's offload_what (its table in the config)
 * onto a tier, 0 plans everything on the device.  dt_plan_strategy is
 * this with the config's own choice. */
int dt_plan_strategy_offload(const dt_plugin_t *strat, dt_model_t *m, const dt_settings_t *set,
                             int world, int offload, dt_estimate_t *out);

/* dt_plan_strategy_offload for a rank of one pipeline stage: the units
 * of its n ranges [first[i], end[i]) (an interleaved stage's chunks, in
 * model order) and the tied units its last range also reads
 * (dt_model_stage_tied: GPT-2's last stage holds a copy of wte), the
 * others emptied from the description as a data strategy running the
 * stage sees them; activations of the stage's units for `slots`
 * micro-batches, and `boundary_bytes` the schedule's boundary tensors
 * (counted as activations: the schedule plugin allocates them so).
 * `world` is the data-parallel group's size. */
int dt_plan_stage(const dt_plugin_t *strat, dt_model_t *m, const dt_settings_t *set, int world,
                  int offload, uint32_t n, const uint32_t *first, const uint32_t *end,
                  uint32_t slots, uint64_t boundary_bytes, dt_estimate_t *out);
/* The activation bytes (kept and workspace) a rank running the n unit
 * ranges [first[i], end[i]) (one stage, or an interleaved stage's chunks)
 * allocates for B x T, keeping `slots` micro-batches' activations
 * (dt_model_set_stages, dt_model_set_slots). */
int dt_plan_stage_acts(dt_model_t *m, int64_t B, int64_t T, uint32_t n, const uint32_t *first,
                       const uint32_t *end, uint32_t slots, uint64_t *out);

/* Bytes a rank reads from and writes to the offload tier per step: the
 * estimate's offload_bytes_per_step, or, from a strategy that leaves it 0,
 * twice the bytes the tier holds. */
uint64_t dt_plan_tier_traffic(const dt_estimate_t *e);

/* Model-state bytes (params + grads + optimizer) of an estimate. */
uint64_t dt_plan_model_state(const dt_estimate_t *e);

/* Peak device bytes per rank of an estimate: every tag but the offload
 * tier's (DT_TAG_OFFLOAD, host or NVMe, shown on a line of its own). */
uint64_t dt_plan_total(const dt_estimate_t *e);

/* Seconds a rank needs to send `sent` bytes over a link of `gbps` Gb/s
 * (10^9 bit/s): the bandwidth-bound time of the ring algorithms whose
 * bytes the estimates count (an all-reduce sends 2(n-1)/n of its buffer,
 * a reduce-scatter or all-gather (n-1)/n), every rank sending and
 * receiving at once on a full-duplex link; no latency, no overlap with
 * compute. */
double dt_plan_comm_seconds(uint64_t sent, double gbps);

/* How the planner writes numbers, one format throughout: two decimals,
 * sizes in binary units ("474.70 MiB" below 1 GiB, "1.92 GiB", "2.00 TiB"
 * from 1 TiB), times as "12.34 ms" below a second and "3.49 s" above; a
 * value that would round to 1024.00 (1000.00 ms) takes the next unit.
 * Each returns buf. */
const char *dt_plan_bytes(uint64_t b, char *buf, size_t cap);
const char *dt_plan_seconds(double s, char *buf, size_t cap);

#endif /* DT_TRAIN_PLAN_H */
