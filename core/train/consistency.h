/*
 * core/train/consistency.h - checks that every rank of a job agrees before
 * training starts.
 */
#ifndef DT_TRAIN_CONSISTENCY_H
#define DT_TRAIN_CONSISTENCY_H

#include "config/config.h"
#include "dtrain/dtrain.h"
#include "launch/world.h"

/* Collective over `comm` (the world): all ranks resolved the same config.
 * Otherwise DT_ERR_CONFIG on every rank, naming each differing rank's keys
 * with its value, where the value came from, and rank 0's value. */
int dt_consistency_check(const dt_world_t *w, const dt_config_t *cfg,
                         dt_comm_t *comm);

#endif /* DT_TRAIN_CONSISTENCY_H */
