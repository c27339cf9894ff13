/*
 * core/cli/run_elastic.h - `dtrain run --nnodes MIN:MAX` ([launch]
 * min_nnodes > 0): this node's elastic agent.  Node 0's also hosts the
 * job's store (core/launch/elastic.h).  Round after round the agent gets
 * its share of the job from the store, checks the config at the round's
 * world size (the global batch kept, grad_accum derived again: a batch
 * that cannot be kept is an exit 2 on every node), starts its ranks
 * (core/launch/launcher.h; after the first round with
 * checkpoint.resume = "latest", so every rank resumes from the last
 * complete checkpoint at the new world size) and reports how they ended.
 * The ranks of round R meet at master_port + 1 under the job id
 * "<job>-rR", so nothing of one round is taken for another's.
 */
#ifndef DT_CLI_RUN_ELASTIC_H
#define DT_CLI_RUN_ELASTIC_H

#include "cli/cli.h"
#include "launch/launcher.h"
#include "setup/resolve.h"

/* Run this node's agent until the job ends; returns the exit code: 0 the
 * job trained, 1 it gave up (the store's message names every failure) or
 * lost node 0, 2 a config error, 128 + N when a signal stopped it. */
int dt_run_elastic(const dt_cli_config_args_t *a, dt_resolved_t *r,
                   const dt_launch_plan_t *plan);

#endif /* DT_CLI_RUN_ELASTIC_H */
