/*
 * core/cli/run_ledger.h - the collective ledger of every `dtrain run`
 * (core/interpose/ledger.h): the comm plugin's table is, for the whole
 * run, the interposer over it with the ledger's hooks (the innermost one:
 * --strict-device and --profile comm wrap it in turn), and rank 0 of a
 * job on one node listens for the ledger exchange
 * (core/launch/ledger_exchange.h).  When the run fails after a
 * communicator call failed, the ranks hand their ledgers to rank 0, which
 * compares them; every rank gets the same line to print.
 */
#ifndef DT_CLI_RUN_LEDGER_H
#define DT_CLI_RUN_LEDGER_H

#include <stddef.h>

#include "interpose/interpose.h"
#include "interpose/ledger.h"
#include "launch/ledger_exchange.h"
#include "launch/world.h"
#include "setup/resolve.h"

/* After the exchange, how long a rank that did not fail first waits before
 * it ends (less than the launcher's DT_LAUNCH_REPORT_S). */
#define DT_LEDGER_LATER_MS 200

typedef struct dt_run_ledger {
    dt_ledger_t *ledger;
    dt_interpose_comm_t *ic;
    dt_plugin_t *comm_plugin;
    const void *comm_table;   /* the plugin's own table */
    dt_ledger_xchg_t *xchg;
    double timeout_s;       /* [launch] timeout */
} dt_run_ledger_t;

/* Wrap the comm plugin of `r` (when the run has one) and open the
 * exchange for rank w->rank of w->size.  *l zeroed first. */
int dt_run_ledger_begin(dt_run_ledger_t *l, dt_resolved_t *r, const dt_world_t *w);

/* After the run ended with status `rc`: when it failed after the
 * communicator was up, exchange the ledgers (bounded: see
 * ledger_exchange.h; every failed rank takes part, whatever failed, so
 * that one rank's failure outside the communicator, which its peers see
 * as a failed collective, does not leave them waiting for its ledger) and
 * write the line into text.  Returns DT_LEDGER_DIVERGED (print it after
 * the error: the launcher quotes a failed rank's last line),
 * DT_LEDGER_AGREE (print it before the error: no call differs, but a
 * collective failed or a rank sent no ledger; or the ledgers could not be
 * compared), or -1 (nothing to say: not run, or the ledgers agree and no
 * communicator call failed anywhere).  The error message (util/error.h)
 * is left as it was. */
int dt_run_ledger_judge(dt_run_ledger_t *l, int rc, char *text, size_t cap);

/* Put the plugin's table back and free everything (every group
 * finalized first). */
void dt_run_ledger_end(dt_run_ledger_t *l);

#endif /* DT_CLI_RUN_LEDGER_H */
