/*
 * core/engine/world.c - rank and world size from the environment.
 */
#include "engine/world.h"

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
    if ((rc = env_int(size, 1, 1 << 20, &w->size, &f2)))
        return rc;
    if ((rc = env_int(rank, 0, (1 << 20) - 1, &w->rank, &f1)))
        return rc;
    *found = f1 && f2;
    if (!*found)
        return DT_OK;
    w->local_rank = w->rank;
    w->local_size = w->size;
    if ((rc = env_int(lrank, 0, (1 << 20) - 1, &w->local_rank, &f3)) ||
        (rc = env_int(lsize, 1, 1 << 20, &w->local_size, &f4)))
        return rc;
    if (w->rank >= w->size)
        return dt_err_set(DT_ERR_CONFIG, "%s = %d is not below %s = %d", rank, w->rank, size,
                          w->size);
    return DT_OK;
}

int dt_world_from_env(const dt_config_t *cfg, dt_world_t *w)
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
    if (!found) {
        if ((rc = from("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", w, &found)))
            return rc;
        if (found)
            w->source = "Open MPI";
    }
    const char *addr = NULL;
    int64_t port = 0;
    if (cfg) {
        dt_config_get_string(cfg, "launch.master_addr", &addr);
        dt_config_get_int(cfg, "launch.master_port", &port);
    }
    if (getenv("MASTER_ADDR"))
        addr = getenv("MASTER_ADDR");
    snprintf(w->master_addr, sizeof w->master_addr, "%s", addr ? addr : "127.0.0.1");
    w->master_port = (int)port;
    int p2, fp;
    if ((rc = env_int("MASTER_PORT", 0, 65535, &p2, &fp)))
        return rc;
    if (fp)
        w->master_port = p2;
    const char *job = getenv("DTRAIN_JOB_ID");
    if (job && job[0]) {
        snprintf(w->job_id, sizeof w->job_id, "%s", job);
    } else if (w->size == 1) {
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
    return DT_OK;
}
