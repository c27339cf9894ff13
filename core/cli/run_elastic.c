/*
 * core/cli/run_elastic.c - this node's elastic agent: run_elastic.h.
 */
#include "cli/run_elastic.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "launch/elastic.h"
#include "launch/rendezvous.h"
#include "train/preflight.h"
#include "util/error.h"

/* One rank of one node with no DTRAIN_JOB_SECRET: the agent makes one (a
 * job on several nodes needs the user's, checked before). */
static int ensure_secret(char *secret, size_t cap)
{
    const char *s = getenv("DTRAIN_JOB_SECRET");
    if (s && s[0]) {
        snprintf(secret, cap, "%s", s);
        return DT_OK;
    }
    unsigned char b[16];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        return dt_err_set(DT_ERR_SYSTEM, "elastic: getrandom for the job secret: %s",
                          strerror(errno));
    for (size_t i = 0; i < sizeof b; i++)
        snprintf(secret + 2 * i, 3, "%02x", b[i]);
    if (setenv("DTRAIN_JOB_SECRET", secret, 1) != 0)
        return dt_err_set(DT_ERR_SYSTEM, "elastic: setenv: %s", strerror(errno));
    return DT_OK;
}

/* The config at the round's world size: the run's checks that need no
 * plugin instance, the batch arithmetic (grad_accum derived again for the
 * same global batch) included.  msg gets the error when it fails. */
static int check_round(const dt_cli_config_args_t *a, int world, char *msg, size_t cap)
{
    dt_resolved_t r2;
    int rc = dt_resolve_core(a->config, a->sets, a->n_sets, &r2);
    if (rc == DT_OK) {
        if ((rc = dt_resolve_rest(&r2, NULL)) == DT_OK)
            rc = dt_preflight(&r2, world, 1);
        dt_resolved_free(&r2);
    }
    if (rc)
        snprintf(msg, cap, "at the round's world size of %d ranks: %s", world, dt_last_error());
    return rc;
}

/* The ranks' command line: ours, after the first round resuming from the
 * last complete checkpoint (the option last, so it wins). */
static char **round_argv(int round)
{
    char *const *argv = dt_cli_argv();
    int n = 0;
    while (argv[n])
        n++;
    char **out = calloc((size_t)n + 3, sizeof *out);
    if (!out)
        return NULL;
    for (int i = 0; i < n; i++)
        out[i] = argv[i];
    if (round > 1) {
        out[n++] = "--set";
        out[n++] = "checkpoint.resume=\"latest\"";
    }
    out[n] = NULL;
    return out;
}

/* Start this node's ranks for the round; returns the kind of report
 * ("ok", "fail", "config") and fills what/ec. */
static const char *run_round(dt_resolved_t *r, const dt_launch_plan_t *plan,
                             const dt_elastic_round_t *rd, const char *job_base, char *what,
                             size_t cap, int *ec)
{
    char job[160];
    snprintf(job, sizeof job, "%.120s-r%d", job_base, rd->round);
    char **argv = round_argv(rd->round);
    if (!argv) {
        snprintf(what, cap, "node %d: out of memory", plan->node_rank);
        *ec = 1;
        return "fail";
    }
    dt_launch_opts_t lo = {.nproc = plan->nproc, .rank_base = rd->rank_base,
                           .world_size = rd->world_size, .master_addr = plan->world.master_addr,
                           .master_port = plan->world.master_port + 1, .argv = argv,
                           .job_id = job, .raw_stdout_rank = -1,
                           .cleanup = dt_resolve_cleanup_job, .cleanup_ctx = r};
    dt_launch_result_t res;
    int rc = dt_launch_run(&lo, &res);
    free(argv);
    if (rc) {
        snprintf(what, cap, "node %d: %s", plan->node_rank, dt_last_error());
        fprintf(stderr, "dtrain: %s\n", dt_last_error());
        *ec = 1;
        return "fail";
    }
    *ec = res.exit_code;
    if (res.exit_code == 0)
        return "ok";
    if (res.signal) {
        snprintf(what, cap, "node %d's launcher was stopped by signal %d", plan->node_rank,
                 res.signal);
        return "fail";
    }
    snprintf(what, cap, "rank %d failed (%s)%s%.300s", res.failed_rank, res.how,
             res.last[0] ? ": " : "", res.last);
    /* a rank's config error (exit 2) is not cured by a restart */
    return res.exit_code == 2 ? "config" : "fail";
}

int dt_run_elastic(const dt_cli_config_args_t *a, dt_resolved_t *r, const dt_launch_plan_t *plan)
{
    const dt_launch_settings_t *l = &r->set.launch;
    char secret[DT_JOB_SECRET_MAX];
    int rc = ensure_secret(secret, sizeof secret);
    if (rc)
        return dt_cli_fail("run", rc);
    const char *addr = plan->world.master_addr;
    int port = plan->world.master_port;
    dt_elastic_store_t *store = NULL;
    if (plan->node_rank == 0) {
        dt_elastic_store_opts_t so = {.addr = addr, .port = port, .secret = secret,
                                      .min_nodes = (int)l->min_nnodes,
                                      .max_nodes = (int)l->nnodes,
                                      .max_restarts = (int)l->max_restarts,
                                      .timeout_s = l->timeout_s};
        if ((rc = dt_elastic_store_start(&so, &store)))
            return dt_cli_fail("run", rc);
    }
    dt_elastic_agent_t *agent = NULL;
    if ((rc = dt_elastic_agent_join(addr, port, secret, plan->node_rank, plan->nproc,
                                    l->timeout_s, &agent))) {
        int ec = dt_cli_fail("run", rc);
        dt_elastic_store_stop(store);
        return ec;
    }
    fprintf(stderr, "dtrain: elastic: node %d (%d rank%s) joined the job's store at %s:%d "
                    "(%lld to %lld nodes, at most %lld restarts)\n",
            plan->node_rank, plan->nproc, plan->nproc == 1 ? "" : "s", addr, port,
            (long long)l->min_nnodes, (long long)l->nnodes, (long long)l->max_restarts);
    char job_base[128];
    const char *env_job = getenv("DTRAIN_JOB_ID");
    if (env_job && env_job[0])
        snprintf(job_base, sizeof job_base, "%.100s", env_job);
    else if (l->nnodes > 1)
        dt_rdzv_nodes_job_id(secret, addr, port, job_base, sizeof job_base);
    else
        snprintf(job_base, sizeof job_base, "el%d", (int)getpid());
    int ec = 1, reported = 0;
    for (;;) {
        dt_elastic_round_t rd;
        int stop;
        char msg[DT_ELASTIC_LINE + 64];
        /* unbounded only before this node's first round (it may join
         * while a round runs); after a report, the store's bounds */
        double wait_s = reported ? DT_ELASTIC_AGENT_WAIT_S(l->timeout_s) : -1;
        if ((rc = dt_elastic_agent_next(agent, wait_s, &rd, &stop, msg, sizeof msg))) {
            ec = dt_cli_fail("run", rc);
            break;
        }
        if (stop >= 0) {
            if (stop != 0 || msg[0])
                fprintf(stderr, "dtrain: %s%s\n", strncmp(msg, "elastic: ", 9) ? "elastic: " : "",
                        msg);
            ec = stop;
            break;
        }
        fprintf(stderr, "dtrain: elastic: %s\n", rd.note);
        char what[DT_ELASTIC_LINE - 128];
        const char *kind;
        if (check_round(a, rd.world_size, what, sizeof what)) {
            fprintf(stderr, "dtrain run: error: elastic: %s\n", what);
            kind = "config";
            ec = 2;
        } else {
            kind = run_round(r, plan, &rd, job_base, what, sizeof what, &ec);
        }
        if (strcmp(kind, "ok") == 0) {
            dt_elastic_agent_report(agent, "ok", "");
            break;
        }
        reported = 1;
        if (dt_elastic_agent_report(agent, kind, what) != DT_OK && strcmp(kind, "config") != 0) {
            ec = dt_cli_fail("run", DT_ERR_REMOTE);
            break;
        }
        if (strcmp(kind, "config") == 0) {
            ec = 2;
            break;
        }
        if (ec > 128 && ec < 128 + 65) /* this launcher was stopped: the node leaves */
            break;
    }
    dt_elastic_agent_close(agent);
    dt_elastic_store_finish(store, l->timeout_s);
    return ec;
}
