/*
 * core/ckpt/ckpt.h - training state to and from checkpoints, through a
 * strategy's global ranges (so what is saved does not depend on who saved
 * it), and the first initialisation of parameters.
 *
 * Entries are "<unit name>/<state>" ("block.3/params", "embedding/exp_avg").
 */
#ifndef DT_CKPT_H
#define DT_CKPT_H

#include "config/settings.h"
#include "dtrain/dtrain.h"
#include "model/model.h"
#include "launch/world.h"

#include <cjson/cJSON.h>

/* The checkpoint root: checkpoint.dir, or <run.out_dir>/<run.name>/ckpt. */
int dt_ckpt_root(const dt_settings_t *set, char *buf, size_t cap);

/* Fill the strategy's state: from checkpoint.resume ("latest" picks the
 * newest complete checkpoint under the root, starting fresh when there is
 * none; a path names one), else from the model's initialisation seeded
 * with run.seed.  *start_step is the step the loaded checkpoint ended (0
 * when fresh).  `loop` (may be NULL): *loop receives a copy of the
 * training loop's own state saved with the checkpoint (dt_ckpt_save's
 * `loop`; the caller cJSON_Deletes it), NULL when fresh or none was saved. */
int dt_ckpt_init_or_resume(const dt_world_t *w, const dt_settings_t *set,
                           dt_strategy_t *s,
                           dt_model_t *m, int64_t *start_step, cJSON **loop);

/* Save the state after `step`, atomically, then keep checkpoint.keep.
 * Collective over `comm` (the world; may be NULL at world size 1): every
 * rank writes its strategy's SAVE ranges to its own shard file in
 * parallel, rank 0 gathers the segment tables, writes the manifest (with
 * `config_hash`, the resolved config's dt_config_hash) and commits.  Every
 * rank returns the same outcome; on failure the temporary directory is
 * removed and the previous checkpoint is untouched.  `loop` (may be NULL:
 * none): the training loop's own state (the fp16 loss scaler's), an
 * object rank 0 records in the manifest as extra "loop", opaque here. */
int dt_ckpt_save(const dt_world_t *w, const dt_settings_t *set, uint64_t config_hash,
                 dt_comm_t *comm, dt_strategy_t *s, dt_model_t *m, int64_t step, const cJSON *loop);

/* The same save in collective parts (checkpoint.async).
 * dt_ckpt_save_async copies this rank's shard to memory (get_state
 * straight into a buffer kept from the previous save) and hands it to a
 * thread that checksums, writes and fsyncs it while training goes on.  dt_ckpt_save_advance (every rank at the same step
 * boundaries; one all-reduce of an int while a thread works) moves the
 * save on once every rank's thread is done: the outcomes agreed (a rank's
 * failed write named with its file), the segment tables gathered, rank
 * 0's thread writes the manifest, commits and prunes; at the boundary
 * after that, every rank learns the outcome, and the handle is freed and
 * *a set to NULL (also on failure: the save removed, the previous
 * checkpoint intact).  dt_ckpt_save_finish (every rank, before the next
 * save) does what is left, waiting for the threads, and frees the handle.
 * dt_ckpt_save_discard (not collective: the run failed) waits for the
 * thread and removes what the save wrote, keeping the error message as
 * it was. */
typedef struct dt_ckpt_async dt_ckpt_async_t;
int dt_ckpt_save_async(const dt_world_t *w, const dt_settings_t *set, uint64_t config_hash,
                       dt_comm_t *comm, dt_strategy_t *s, dt_model_t *m, int64_t step,
                       const cJSON *loop, dt_ckpt_async_t **out);
int dt_ckpt_save_advance(dt_ckpt_async_t **a);
int dt_ckpt_save_finish(dt_ckpt_async_t *a);
void dt_ckpt_save_discard(dt_ckpt_async_t *a);

/* ---- a checkpoint's weights, for tools (sample, import) ---- */

typedef struct dt_ckpt_reader dt_ckpt_reader_t;

/* The manifest's "model" for model m: arch, shape keys and the tensor
 * table (where each parameter lies in its unit).  NULL when out of memory. */
cJSON *dt_ckpt_model_json(dt_model_t *m);
/* DT_ERR_DATA naming the first tensor of d that checkpoint `dir` (read by
 * rd) lacks, holds in another shape or at another place. */
int dt_ckpt_check_tensors(const char *dir, const dt_ckpt_reader_t *rd, const dt_model_desc_t *d);
/* The "model.<key>=<value>" assignments that rebuild the [model] table
 * the checkpoint was saved with (arch, its shape keys and settings of
 * every kind: integers, booleans, floats, choices; a key that
 * is not a [model] key is the model plugin's own: "<arch>.<key>=<value>")
 * for dt_resolve_core: *n of at most `cap` into sets. */
int dt_ckpt_model_sets(const dt_ckpt_reader_t *rd, const char *dir, char (*sets)[96], int cap,
                       int *n);
/* Unit u's parameters (entry "<unit>/params", f32, the unit's numel
 * elements) into dst, CRC-checked as read. */
int dt_ckpt_read_unit_params(dt_ckpt_reader_t *rd, const char *dir, const dt_model_desc_t *d,
                             uint32_t u, float *dst);

#endif /* DT_CKPT_H */
