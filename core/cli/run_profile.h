/*
 * core/cli/run_profile.h - `dtrain run --profile LIST`: for one run, the
 * comm and/or device plugin's table is the interposer over it with the
 * profiler's hooks (core/interpose); the core and the other plugins see it
 * as the plugin's.  At the end each rank prints its tables and the
 * plugins' own tables are put back.
 *
 * LIST is comma-separated: `comm`, `device`, or both; the device takes
 * options after colons: `device:skip=N` (leave out the first N forward
 * passes: steps, with one micro-batch per step), `device:sync`
 * (synchronize each kernel's stream around it, for exact per-kernel times
 * on a device that only enqueues).
 */
#ifndef DT_CLI_RUN_PROFILE_H
#define DT_CLI_RUN_PROFILE_H

#include <stdint.h>

#include "interpose/interpose.h"
#include "setup/resolve.h"

typedef struct dt_run_profile {
    int comm, device;       /* what LIST asked for */
    uint64_t skip;          /* device:skip=N */
    int sync;               /* device:sync */
    /* while the run is wrapped */
    dt_plugin_t *comm_plugin, *dev_plugin;
    const void *comm_table, *dev_table; /* the plugins' own tables */
    dt_interpose_profile_t *comm_prof, *dev_prof;
    dt_interpose_comm_t *ic;
    dt_interpose_device_t *id;
} dt_run_profile_t;

/* Parse LIST into *p (zeroed first; NULL LIST: no profile).  Returns 0,
 * or prints "dtrain run: error: --profile '...': ..." to stderr and
 * returns DT_EXIT_USAGE. */
int dt_run_profile_parse(const char *list, dt_run_profile_t *p);
/* Wrap the plugins of `r` that p asks for (those the run uses). */
int dt_run_profile_begin(dt_run_profile_t *p, dt_resolved_t *r);
/* Print this rank's tables to stdout, put the plugins' tables back, free
 * everything.  A no-op for a profile that wrapped nothing. */
void dt_run_profile_end(dt_run_profile_t *p, int rank);

#endif /* DT_CLI_RUN_PROFILE_H */
