/*
 * core/engine/world.h - who this process is in the job: rank, world size,
 * local rank, and the job id that names shared resources.
 *
 * Read from the environment, in this order of precedence:
 *   dtrain's own launcher: DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_LOCAL_RANK,
 *                          DTRAIN_LOCAL_SIZE, DTRAIN_JOB_ID
 *   torchrun style:        RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 *                          MASTER_ADDR, MASTER_PORT
 *   Open MPI:              OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
 *                          _LOCAL_SIZE
 *   none of these:         a single process (rank 0 of 1)
 */
#ifndef DT_ENGINE_WORLD_H
#define DT_ENGINE_WORLD_H

#include "config/config.h"

typedef struct dt_world {
    int rank, size, local_rank, local_size;
    char job_id[128];
    char master_addr[256];
    int master_port;
    const char *source; /* "single process", "dtrain launcher", "torchrun", "Open MPI" */
} dt_world_t;

int dt_world_from_env(const dt_config_t *cfg, dt_world_t *w);

#endif /* DT_ENGINE_WORLD_H */
