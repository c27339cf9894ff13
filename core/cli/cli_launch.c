/*
 * core/cli/cli_launch.c - the launch decision `dtrain run` and `dtrain
 * bench comm` share: cli_launch.h.
 */
#include "cli/cli_launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch/rendezvous.h"
#include "util/error.h"

/* Where [launch] `key` came from, for messages. */
static const char *key_from(const dt_resolved_t *r, const char *key, char *buf, size_t cap)
{
    dt_origin_t origin = dt_config_origin(r->cfg, key);
    if (origin == DT_ORIGIN_CLI)
        snprintf(buf, cap, "from the command line");
    else if (origin == DT_ORIGIN_FILE)
        snprintf(buf, cap, "set in %s", r->set.config_path);
    else
        snprintf(buf, cap, "the default");
    return buf;
}

/* An elastic job (launch.min_nnodes > 0): dtrain's own launcher on every
 * node, a comm plugin whose processes it may restart, and MIN <= MAX.
 * Its ranks (started by that launcher, at whatever world size the round
 * has) pass. */
static int check_elastic(const dt_resolved_t *r, const dt_launch_plan_t *plan)
{
    const dt_launch_settings_t *l = &r->set.launch;
    char f1[4200], f2[4200];
    if (dt_world_from_launcher(&plan->world)) {
        if (strcmp(plan->world.source, "dtrain launcher") == 0)
            return DT_OK;
        return dt_err_set(DT_ERR_CONFIG,
                          "launch.min_nnodes = %lld (%s) asks for an elastic job, but %s "
                          "started this process: only dtrain's own launcher (`dtrain run` on "
                          "each node) restarts ranks; under another launcher it owns the "
                          "processes (use its own restart, e.g. torchrun --max-restarts), so "
                          "remove --nnodes MIN:MAX",
                          (long long)l->min_nnodes, key_from(r, "launch.min_nnodes", f1, sizeof f1),
                          plan->world.source);
    }
    if (l->min_nnodes > l->nnodes)
        return dt_err_set(DT_ERR_CONFIG,
                          "launch.min_nnodes = %lld (%s) is more than launch.nnodes = %lld (%s): "
                          "an elastic job runs on MIN to MAX nodes (--nnodes MIN:MAX)",
                          (long long)l->min_nnodes, key_from(r, "launch.min_nnodes", f1, sizeof f1),
                          (long long)l->nnodes, key_from(r, "launch.nnodes", f2, sizeof f2));
    return DT_OK;
}

/* A job on several nodes needs a node_rank below nnodes, a shared secret
 * and a rendezvous address every node can reach (one that resolves). */
static int check_nodes(const dt_resolved_t *r, const dt_launch_plan_t *plan)
{
    const dt_launch_settings_t *l = &r->set.launch;
    char f1[4200], f2[4200];
    if (l->min_nnodes > 0) {
        int rc = check_elastic(r, plan);
        if (rc || dt_world_from_launcher(&plan->world))
            return rc;
    }
    if (l->min_nnodes == 0 && dt_config_origin(r->cfg, "launch.max_restarts") != DT_ORIGIN_DEFAULT &&
        !dt_world_from_launcher(&plan->world))
        return dt_err_set(DT_ERR_CONFIG,
                          "launch.max_restarts = %lld (%s) applies to an elastic job only: give "
                          "--nnodes MIN:MAX (launch.min_nnodes; MIN = MAX restarts at a fixed "
                          "size)",
                          (long long)l->max_restarts,
                          key_from(r, "launch.max_restarts", f1, sizeof f1));
    if (dt_world_from_launcher(&plan->world)) {
        if (l->nnodes > 1 && dt_config_origin(r->cfg, "launch.nnodes") != DT_ORIGIN_DEFAULT &&
            plan->world.size != l->nnodes * plan->world.local_size)
            return dt_err_set(DT_ERR_CONFIG,
                              "launch.nnodes = %lld (%s), but %s started this process as one "
                              "of %d rank%s, %d of them on this node: under another launcher "
                              "dtrain starts no ranks itself; remove launch.nnodes or make "
                              "the two agree",
                              (long long)l->nnodes, key_from(r, "launch.nnodes", f1, sizeof f1),
                              plan->world.source, plan->world.size,
                              plan->world.size == 1 ? "" : "s", plan->world.local_size);
        return DT_OK;
    }
    if (l->node_rank >= l->nnodes)
        return dt_err_set(DT_ERR_CONFIG,
                          "launch.node_rank = %lld (%s) is not below launch.nnodes = %lld (%s): "
                          "nodes are numbered 0 to nnodes - 1",
                          (long long)l->node_rank, key_from(r, "launch.node_rank", f1, sizeof f1),
                          (long long)l->nnodes, key_from(r, "launch.nnodes", f2, sizeof f2));
    if (l->nnodes <= 1)
        return DT_OK;
    if (!plan->world.job_secret[0])
        return dt_err_set(DT_ERR_CONFIG,
                          "launch.nnodes = %lld (%s) needs DTRAIN_JOB_SECRET in the environment, "
                          "the same on every node: the ranks prove with it that they belong to "
                          "this job (make one with `head -c 16 /dev/urandom | od -An -tx1 | tr "
                          "-d ' \\n'` and pass it to every node)",
                          (long long)l->nnodes, key_from(r, "launch.nnodes", f1, sizeof f1));
    if (dt_config_origin(r->cfg, "launch.master_addr") == DT_ORIGIN_DEFAULT &&
        !getenv("MASTER_ADDR"))
        return dt_err_set(DT_ERR_CONFIG,
                          "launch.nnodes = %lld (%s) needs launch.master_addr (--master-addr): "
                          "the address of node 0 that every node can reach (the default "
                          "127.0.0.1 reaches only this machine)",
                          (long long)l->nnodes, key_from(r, "launch.nnodes", f1, sizeof f1));
    /* a name that will never resolve fails here, once, before any rank
     * starts; one that may resolve later (EAI_AGAIN) is the ranks' to
     * retry within launch.timeout */
    char why[320];
    if (dt_rdzv_check_host(plan->world.master_addr, why, sizeof why) < 0)
        return dt_err_set(DT_ERR_CONFIG,
                          "launch.master_addr = '%s' (%s): %s: it must name node 0 so that "
                          "every node can reach it",
                          plan->world.master_addr,
                          getenv("MASTER_ADDR") ? "from MASTER_ADDR"
                                                : key_from(r, "launch.master_addr", f1, sizeof f1),
                          why);
    if (plan->world.master_port == 0)
        return dt_err_set(DT_ERR_CONFIG,
                          "launch.nnodes = %lld (%s) needs a rendezvous port: launch.master_port "
                          "= 0 (%s)",
                          (long long)l->nnodes, key_from(r, "launch.nnodes", f1, sizeof f1),
                          key_from(r, "launch.master_port", f2, sizeof f2));
    return DT_OK;
}

int dt_cli_plan_launch(const dt_resolved_t *r, int64_t nproc, const char *what,
                       const char *from, int given, dt_launch_plan_t *plan)
{
    int rc = dt_launch_plan(&r->set.launch, nproc, what, from, given, plan);
    if (rc == DT_OK && (rc = check_nodes(r, plan)) == DT_OK && r->set.launch.min_nnodes > 0 &&
        !dt_world_from_launcher(&plan->world))
        plan->spawn = 1; /* the elastic agent, even of one rank on one node */
    return rc;
}

void dt_cli_launch_nodes(const dt_launch_plan_t *plan, dt_launch_opts_t *lo, char *job,
                         size_t cap)
{
    if (plan->nnodes <= 1)
        return;
    lo->rank_base = plan->node_rank * plan->nproc;
    lo->world_size = plan->nnodes * plan->nproc;
    lo->master_addr = plan->world.master_addr;
    lo->master_port = plan->world.master_port;
    dt_rdzv_nodes_job_id(plan->world.job_secret, plan->world.master_addr,
                         plan->world.master_port, job, cap);
    lo->job_id = getenv("DTRAIN_JOB_ID") && getenv("DTRAIN_JOB_ID")[0] ? NULL : job;
}
