/*
 * core/launch/world.c - rank and world size from the environment.
 */
#include "launch/world.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/error.h"

/* Parse env `name` as an int in [lo, hi]; *found = 0 when unset. */
static int env_int(const char *name, int lo, int hi, int *out, int *found)
{
    const char *v = getenv(name);
    *found = v != NULL;
    if (!v)
        return DT_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return dt_err_set(DT_ERR_CONFIG,
                          "environment variable %s = '%s' is not an integer in [%d, %d]", name,
                          v, lo, hi);
    *out = (int)x;
    return DT_OK;
}

static int from(const char *rank, const char *size, const char *lrank, const char *lsize,
                dt_world_t *w, int *found)
{
    int f1, f2, f3, f4, rc;
    dt_world_t t = *w;
    if ((rc = env_int(size, 1, 1 << 20, &t.size, &f2)))
        return rc;
    if ((rc = env_int(rank, 0, (1 << 20) - 1, &t.rank, &f1)))
        return rc;
    *found = f1 && f2;
    if (f1 != f2)
        /* e.g. a stray WORLD_SIZE: guessing "single process" would start a
         * run that later hangs or trains alone */
        return dt_err_set(DT_ERR_CONFIG,
                          "environment variable %s is set but %s is not: a launcher sets "
                          "both (unset %s to run one process)",
                          f1 ? rank : size, f1 ? size : rank, f1 ? rank : size);
    if (!*found)
        return DT_OK;
    t.local_rank = t.rank;
    t.local_size = t.size;
    if ((rc = env_int(lrank, 0, (1 << 20) - 1, &t.local_rank, &f3)) ||
        (rc = env_int(lsize, 1, 1 << 20, &t.local_size, &f4)))
        return rc;
    if (t.rank >= t.size)
        return dt_err_set(DT_ERR_CONFIG, "%s = %d is not below %s = %d", rank, t.rank, size,
                          t.size);
    if (f4 && t.local_rank >= t.local_size)
        return dt_err_set(DT_ERR_CONFIG, "%s = %d is not below %s = %d", lrank, t.local_rank,
                          lsize, t.local_size);
    t.size_var = size;
    t.local_size_var = f4 ? lsize : NULL;
    *w = t;
    return DT_OK;
}

/* Slurm's "2(x3),1" task counts per node: the count of node `node`. */
static int slurm_tasks_on_node(const char *spec, int node)
{
    int at = 0;
    while (spec && *spec) {
        char *end;
        long n = strtol(spec, &end, 10), rep = 1;
        if (end == spec || n < 1)
            return 0;
        if (strncmp(end, "(x", 2) == 0) {
            rep = strtol(end + 2, &end, 10);
            if (rep < 1 || *end != ')')
                return 0;
            end++;
        }
        if (node < at + rep)
            return (int)n;
        at += (int)rep;
        spec = *end == ',' ? end + 1 : end;
    }
    return 0;
}

/* srun: one process per task.  Keyed on SLURM_STEP_NUM_TASKS (set for a
 * job step, not for the batch script itself, which is one process even
 * when the allocation has many tasks). */
static int from_slurm(dt_world_t *w, int *found)
{
    int rc, fr, fs, fl, fn;
    dt_world_t t = *w;
    *found = 0;
    if ((rc = env_int("SLURM_STEP_NUM_TASKS", 1, 1 << 20, &t.size, &fs)) || !fs)
        return rc;
    if ((rc = env_int("SLURM_PROCID", 0, (1 << 20) - 1, &t.rank, &fr)))
        return rc;
    if (!fr)
        return dt_err_set(DT_ERR_CONFIG, "SLURM_STEP_NUM_TASKS is set but SLURM_PROCID is not");
    int node = 0;
    t.local_rank = t.rank;
    t.local_size = t.size;
    if ((rc = env_int("SLURM_LOCALID", 0, (1 << 20) - 1, &t.local_rank, &fl)) ||
        (rc = env_int("SLURM_NODEID", 0, 1 << 20, &node, &fn)))
        return rc;
    int per = slurm_tasks_on_node(getenv("SLURM_STEP_TASKS_PER_NODE"), node);
    if (per > 0)
        t.local_size = per;
    if (t.rank >= t.size || t.local_rank >= t.local_size)
        return dt_err_set(DT_ERR_CONFIG,
                          "Slurm environment is inconsistent: SLURM_PROCID = %d of "
                          "SLURM_STEP_NUM_TASKS = %d, SLURM_LOCALID = %d of %d on this node",
                          t.rank, t.size, t.local_rank, t.local_size);
    t.size_var = "SLURM_STEP_NUM_TASKS";
    t.local_size_var = per > 0 ? "SLURM_STEP_TASKS_PER_NODE" : NULL;
    *w = t;
    *found = 1;
    return DT_OK;
}

void dt_world_sanitize_job_id(char *s)
{
    /* plugins name files after job ids: keep them to a portable set */
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9') || *s == '-' || *s == '_' || *s == '.'))
            *s = '_';
}

int dt_world_from_launcher(const dt_world_t *w)
{
    return w->size_var != NULL;
}

int dt_world_from_env(const dt_launch_settings_t *launch, dt_world_t *w)
{
    memset(w, 0, sizeof *w);
    w->size = w->local_size = 1;
    w->source = "single process";
    int found = 0, rc;
    if ((rc = from("DTRAIN_RANK", "DTRAIN_WORLD_SIZE", "DTRAIN_LOCAL_RANK", "DTRAIN_LOCAL_SIZE",
                   w, &found)))
        return rc;
    if (found)
        w->source = "dtrain launcher";
    if (!found) {
        if ((rc = from("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", w, &found)))
            return rc;
        if (found)
            w->source = "torchrun";
    }
    int ompi = 0;
    if (!found) {
        if ((rc = from("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", w, &found)))
            return rc;
        if (found)
            w->source = "Open MPI";
        ompi = found;
    }
    int slurm = 0;
    if (!found) {
        if ((rc = from_slurm(w, &found)))
            return rc;
        if (found)
            w->source = "Slurm";
        slurm = found;
    }
    const char *addr = launch ? launch->master_addr : NULL;
    int64_t port = launch ? launch->master_port : 0;
    if (getenv("MASTER_ADDR"))
        addr = getenv("MASTER_ADDR");
    snprintf(w->master_addr, sizeof w->master_addr, "%s", addr ? addr : "127.0.0.1");
    w->master_port = (int)port;
    int p2 = 0, fp = 0;
    if ((rc = env_int("MASTER_PORT", 0, 65535, &p2, &fp)))
        return rc;
    if (fp)
        w->master_port = p2;
    const char *secret = getenv("DTRAIN_JOB_SECRET");
    if (secret && strlen(secret) >= sizeof w->job_secret)
        return dt_err_set(DT_ERR_CONFIG, "DTRAIN_JOB_SECRET is %zu characters long; at most %zu",
                          strlen(secret), sizeof w->job_secret - 1);
    snprintf(w->job_secret, sizeof w->job_secret, "%s", secret ? secret : "");
    const char *job = getenv("DTRAIN_JOB_ID");
    const char *ompi_job = getenv("OMPI_MCA_ess_base_jobid");
    if (!ompi_job || !ompi_job[0])
        ompi_job = getenv("PMIX_NAMESPACE");
    if (job && job[0]) {
        snprintf(w->job_id, sizeof w->job_id, "%.96s", job);
    } else if (ompi && ompi_job && ompi_job[0]) {
        /* two mpiruns on one machine share neither this id nor segments */
        snprintf(w->job_id, sizeof w->job_id, "ompi-%d-%.64s", (int)getuid(), ompi_job);
    } else if (slurm && getenv("SLURM_JOB_ID") && getenv("SLURM_STEP_ID")) {
        snprintf(w->job_id, sizeof w->job_id, "slurm-%d-%.40s.%.20s", (int)getuid(),
                 getenv("SLURM_JOB_ID"), getenv("SLURM_STEP_ID"));
    } else if (!found || w->size == 1) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(w->job_id, sizeof w->job_id, "%d-%lld%09ld", (int)getpid(),
                 (long long)ts.tv_sec, ts.tv_nsec);
    } else {
        /* Ranks started by another launcher must agree on a name without
         * talking first: derive it from the rendezvous address and port. */
        snprintf(w->job_id, sizeof w->job_id, "ext-%d-%.64s-%d", (int)getuid(), w->master_addr,
                 w->master_port);
    }
    dt_world_sanitize_job_id(w->job_id);
    return DT_OK;
}
