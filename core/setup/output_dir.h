/*
 * core/setup/output_dir.h - the run's output folders checked before
 * training starts, not at the first checkpoint: a run that cannot write
 * there stops before step 1 with the key and the path.
 */
#ifndef DT_SETUP_OUTPUT_DIR_H
#define DT_SETUP_OUTPUT_DIR_H

#include "config/settings.h"

/* The longest checkpoint root (checkpoint.dir, or
 * <run.out_dir>/<run.name>/ckpt) in bytes, its NUL included: the size of
 * the buffers the checkpoint code builds it in (dt_ckpt_root callers). */
#define DT_CKPT_ROOT_MAX 2048

/* On every rank: DT_ERR_CONFIG when the checkpoint root is too long for
 * DT_CKPT_ROOT_MAX.  On rank 0 (of the world the environment describes):
 * create <run.out_dir>/<run.name> (and checkpoint.dir when set) and check
 * a file can be created there; DT_ERR_IO naming the key and the path
 * when not. */
int dt_setup_output_dir(const dt_settings_t *set);

#endif /* DT_SETUP_OUTPUT_DIR_H */
