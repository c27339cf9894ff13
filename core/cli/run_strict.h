/*
 * core/cli/run_strict.h - `dtrain run --strict-device`: for one run, the
 * device and comm plugins' tables are the interposers over them with the
 * strict device checks' hooks (core/interpose/interpose_strict.c), so a
 * communicator call that a device communicator (nccl on a GPU) would
 * refuse, or deadlock on, stops the run on the cpu device with a message
 * naming the call.  The core and the other plugins see the tables as the
 * plugins'.  At the end each rank prints what was checked and the
 * plugins' own tables are put back.  --profile wraps these in turn (its
 * tables then count the calls the checks refused).
 */
#ifndef DT_CLI_RUN_STRICT_H
#define DT_CLI_RUN_STRICT_H

#include "interpose/interpose.h"
#include "setup/resolve.h"

typedef struct dt_run_strict {
    int on;                          /* --strict-device given */
    /* while the run is wrapped */
    dt_plugin_t *comm_plugin, *dev_plugin;
    const void *comm_table, *dev_table;  /* the plugins' own tables */
    dt_interpose_strict_t *checks;
    dt_interpose_comm_t *ic;
    dt_interpose_device_t *id;
} dt_run_strict_t;

/* argv without any "--strict-device" (option values left alone:
 * `value_opts` as dt_cli_parse_config_args takes them, and --set) into
 * out (argc + 1 entries, NULL-ended; argv itself is left as it is, for
 * the launcher to start ranks with); returns its argc and sets s->on when
 * there was one. */
int dt_run_strict_take(int argc, char **argv, const char *const *value_opts, char **out,
                       dt_run_strict_t *s);
/* With s->on, wrap the device and comm plugins of `r` (both, or neither:
 * the checks need the allocations the device hands out).  A no-op
 * otherwise. */
int dt_run_strict_begin(dt_run_strict_t *s, dt_resolved_t *r);
/* Print this rank's line ("strict device (rank R, shm over cpu): ...")
 * to stdout when `rank` >= 0, put the plugins' tables back, free
 * everything.  A no-op when nothing was wrapped. */
void dt_run_strict_end(dt_run_strict_t *s, int rank);

#endif /* DT_CLI_RUN_STRICT_H */
