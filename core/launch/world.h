/*
 * core/launch/world.h - who this process is in the job: rank, world size,
 * local rank, and the job id that names shared resources.
 *
 * Read from the environment, in this order of precedence:
 *   dtrain's own launcher: DTRAIN_RANK, DTRAIN_WORLD_SIZE, DTRAIN_LOCAL_RANK,
 *                          DTRAIN_LOCAL_SIZE, DTRAIN_JOB_ID
 *   torchrun style:        RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 *                          MASTER_ADDR, MASTER_PORT
 *   Open MPI:              OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
 *                          _LOCAL_SIZE
 *   Slurm (srun):          SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID,
 *                          SLURM_NODEID + SLURM_STEP_TASKS_PER_NODE; the
 *                          job id from SLURM_JOB_ID and SLURM_STEP_ID
 *   none of these:         a single process (rank 0 of 1)
 * A source counts only when both its rank and its size are set; one without
 * the other is a DT_ERR_CONFIG (a half-set environment is a mistake, not a
 * single process).
 *
 * The job id names the job's shared resources (what a comm plugin creates
 * for the job, and removes in its cleanup_job), so every rank of a job must
 * derive the same one without talking: DTRAIN_JOB_ID when set; under Open MPI its job id
 * (OMPI_MCA_ess_base_jobid / PMIX_NAMESPACE); otherwise, for ranks of an
 * external launcher, the rendezvous address and port (MASTER_ADDR,
 * MASTER_PORT, else [launch] master_addr / master_port), which are unique
 * per concurrent torchrun job; a single process makes a fresh one.  Job ids
 * hold only letters, digits, '.', '_' and '-' (other characters become
 * '_').
 */
#ifndef DT_LAUNCH_WORLD_H
#define DT_LAUNCH_WORLD_H

#include "config/settings.h"

/* Bytes of a job secret, its terminating NUL included. */
#define DT_JOB_SECRET_MAX 128

typedef struct dt_world {
    int rank, size, local_rank, local_size;
    char job_id[128];
    /* DTRAIN_JOB_SECRET ("" = none): what this job's ranks present to join
     * each other (the launcher makes one per job; under another launcher
     * the user may set it for every rank) */
    char job_secret[DT_JOB_SECRET_MAX];
    char master_addr[256];
    int master_port;
    const char *source; /* "single process", "dtrain launcher", "torchrun", "Open MPI",
                         * "Slurm" */
    /* The variables the sizes came from (for messages), e.g. "WORLD_SIZE"
     * and "LOCAL_WORLD_SIZE"; NULL for a single process, local_size_var
     * also NULL when the launcher did not set it (local_size = size). */
    const char *size_var, *local_size_var;
} dt_world_t;

/* Fill *w from the environment; `launch` (may be NULL) gives the
 * rendezvous defaults ([launch] master_addr, master_port).  DT_ERR_CONFIG
 * for a malformed or half-set environment, naming the variables. */
int dt_world_from_env(const dt_launch_settings_t *launch, dt_world_t *w);

/* True when w came from a launcher's environment (not a single process). */
int dt_world_from_launcher(const dt_world_t *w);

/* Replace every character of a job id outside [A-Za-z0-9._-] with '_'. */
void dt_world_sanitize_job_id(char *s);

#endif /* DT_LAUNCH_WORLD_H */
