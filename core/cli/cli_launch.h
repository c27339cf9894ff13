/*
 * core/cli/cli_launch.h - the launch decision the commands that start ranks
 * share (`dtrain run`, `dtrain bench comm`): whether this process starts
 * ranks, on one node or as one node of several (torchrun's --nnodes), and
 * the checks a job on several nodes needs.
 */
#ifndef DT_CLI_LAUNCH_H
#define DT_CLI_LAUNCH_H

#include <stddef.h>

#include "launch/launcher.h"
#include "setup/resolve.h"

/* dt_launch_plan for `nproc` ranks per node (`what`: the key or option
 * that gave it, `from` where it came from, `given`: not the default),
 * then the checks of a job on several nodes ([launch] nnodes): a
 * node_rank below nnodes, DTRAIN_JOB_SECRET, a master address every node
 * can reach and a port; under another launcher, an nnodes that agrees
 * with it.  An elastic job ([launch] min_nnodes > 0) needs dtrain's own
 * launcher, a comm other than mpi and min_nnodes <= nnodes, and always
 * spawns (this process is the node's agent: cli/run_elastic.h); its ranks
 * pass at any world size.  DT_ERR_CONFIG naming the key and where it was
 * set. */
int dt_cli_plan_launch(const dt_resolved_t *r, int64_t nproc, const char *what,
                       const char *from, int given, dt_launch_plan_t *plan);

/* Fill `lo` for this node's share of a job on several nodes (plan->nnodes
 * > 1; a no-op otherwise): the global rank of its first rank, the job's
 * size, node 0's address, and the job id every node's launcher derives
 * alike from the secret and the address (in job[cap]; DTRAIN_JOB_ID, when
 * set, wins), so each node's cleanup names what its ranks made. */
void dt_cli_launch_nodes(const dt_launch_plan_t *plan, dt_launch_opts_t *lo, char *job,
                         size_t cap);

#endif /* DT_CLI_LAUNCH_H */
