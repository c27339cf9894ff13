/*
 * core/cli/cmd_run.c - `dtrain run CONFIG`: resolve the config and train,
 * or, with [launch] nproc > 1 and no launcher around, start the local
 * ranks and watch them (core/launch).
 *
 * The config file is parsed once (core/setup's staged resolve).  The
 * launching parent resolves every stage and takes run's checks that need
 * no plugin instance (train/preflight.h: the model described, not
 * allocated; the batch arithmetic for its N ranks), so a config error is
 * reported once and no rank is started; it initialises no device and
 * allocates no model, so N ranks cost N processes, not N + 1 copies of the
 * model.  Errors that only a plugin instance can find are reported by
 * every rank and end the job with their exit code.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_launch.h"
#include "cli/run_elastic.h"
#include "cli/run_ledger.h"
#include "cli/run_profile.h"
#include "cli/run_strict.h"
#include "train/preflight.h"
#include "train/train.h"
#include "launch/launcher.h"
#include "launch/rendezvous.h"
#include "util/crash.h"
#include "util/log.h"
#include "setup/resolve.h"
#include "util/error.h"

void dt_help_run(FILE *f)
{
    fprintf(f,
            "usage: dtrain run CONFIG [--set table.key=value ...] [--metrics FILE]\n"
            "                  [--profile comm|device[:skip=N][:sync]|comm,device]\n"
            "                  [--strict-device]\n"
            "                  [--nproc N] [--nnodes N|MIN:MAX --node-rank R --master-addr A\n"
            "                   --master-port P] [--max-restarts N]\n\n"
            "Train the model CONFIG describes.  --metrics writes one JSON object per\n"
            "step.  --profile comm wraps the communicator (any comm plugin) and, at the\n"
            "end of the run, prints on every rank per operation: calls, bytes, time in\n"
            "ms (the plugin's, waits for the operation included), waits, errors.\n"
            "--profile device wraps the device (any device plugin) and prints per kernel\n"
            "and runtime call: calls, time, ms per pass, share of the pass, us per call,\n"
            "GFLOP/s, GB/s, errors, over whole forward passes (one per step with one\n"
            "micro-batch a step; skip=N leaves out the first N).  Times are the calls'\n"
            "own: a device that only enqueues (CUDA) is timed for the enqueue unless\n"
            "sync waits for each kernel's stream around it.  comm,device does both.\n"
            "--strict-device holds every communicator call to what nccl on a GPU\n"
            "accepts, on any device and comm plugin: a buffer is device memory (inside\n"
            "one allocation of the device, with room for the call's bytes) or, for a\n"
            "collective only, a control message in plain host memory; the dtype is one\n"
            "NCCL has; a send and a recv exchanged with one peer go together\n"
            "(sendrecv).  The first call that breaks a rule stops the run (exit 1)\n"
            "with a message naming it; at the end every rank prints what it checked.\n\n"
            "Multi-process: with [launch] nproc = N > 1 (or --set launch.nproc=N) this\n"
            "command starts N ranks of itself on this machine and relays their output,\n"
            "each line prefixed \"[rank R] \".  Ctrl-C/SIGTERM/SIGHUP are passed on to\n"
            "every rank; when one rank fails the others are stopped (SIGTERM, then\n"
            "SIGKILL after %.0f s) and the last line names it.  When a collective fails\n"
            "(a timeout, a peer gone, ranks that disagree), the ranks on this machine\n"
            "compare the last 64 communicator calls each issued (the collective ledger)\n"
            "and every rank's last line names the first call where they differ:\n"
            "\"ledger: rank 3 issued all_gather(...) #41 at step 41, unit 7 while ranks\n"
            "0-2 issued reduce_scatter(...) #41 ...\".  nproc may be at most %d\n"
            "per CPU this process may use.  Started by torchrun (RANK, WORLD_SIZE,\n"
            "LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), mpirun\n"
            "(OMPI_COMM_WORLD_*) or dtrain itself (DTRAIN_RANK, DTRAIN_WORLD_SIZE, ...),\n"
            "the process is one rank of that job and starts none.\n\n"
            "Several nodes: run `dtrain run` once on each node with --nnodes N, its\n"
            "--node-rank R (0..N-1), node 0's --master-addr and a --master-port (the\n"
            "[launch] keys nnodes, node_rank, master_addr, master_port; --nproc is\n"
            "launch.nproc, ranks per node).  Each node starts its nproc ranks as global\n"
            "ranks R x nproc + i, as torchrun --nnodes does; they meet over TCP at\n"
            "master_addr:master_port (rank 0 listens), agree on the job id and check\n"
            "that every node runs the same config, within launch.timeout.  Every node\n"
            "needs the same DTRAIN_JOB_SECRET in its environment: the ranks prove with\n"
            "it that they belong to the job (it never crosses the network).\n\n"
            "Elastic: --nnodes MIN:MAX (launch.min_nnodes = MIN, launch.nnodes = MAX)\n"
            "keeps the job going when a rank or a node fails.  Node 0's launcher\n"
            "hosts the launchers' store on master_port (the ranks meet on\n"
            "master_port + 1); when a round's ranks fail, the launchers left (and\n"
            "any node started since, up to MAX) form the next round of at least MIN\n"
            "nodes, ordered by --node-rank, after a back-off, and every rank resumes\n"
            "from the last complete checkpoint at the new world size: the global\n"
            "batch stays, grad_accum is derived again (exit 2 when it cannot be).\n"
            "Each restart logs one line naming who failed and the new layout; after\n"
            "--max-restarts N (launch.max_restarts, default 3) restarts the job ends\n"
            "with exit 1 and a line naming every failure.  If node 0 dies the store\n"
            "dies with it (as torchrun's c10d store): the other nodes exit 1 saying\n"
            "so.  Not with run.comm = \"mpi\" or under another launcher (exit 2).\n\n"
            "exit codes: 0 trained, 2 usage or config error, 1 runtime failure; as a\n"
            "launcher, the failed rank's code (1 if it died by a signal), or 128 + N\n"
            "when stopped by signal N\n",
            DT_LAUNCH_GRACE_S, DT_LAUNCH_PER_CPU);
}

/* The crash handler for this rank, which names the plugins the run
 * loaded (util/crash.h). */
static int install_crash_handler(const dt_resolved_t *r, int rank)
{
    for (int role = 0; role < DT_ROLE_COUNT; role++) {
        const dt_plugin_t *p = r->plugin[role];
        if (p)
            dt_crash_add_object(dt_kind_name(p->kind), p->name, p->ops);
    }
    return dt_crash_install(rank);
}

/* The `dtrain run` options that are [launch] keys, as --set entries
 * appended to a (after the user's own --set, so the option wins). */
static int launch_options(const char *const *vals, dt_cli_config_args_t *a)
{
    static const char *const keys[] = {"launch.nproc",       "launch.nnodes",
                                       "launch.node_rank",   "launch.master_addr",
                                       "launch.master_port", "launch.max_restarts"};
    static char sets[7][320];
    for (int k = 0; k < 6; k++) {
        const char *v = vals[k];
        if (!v)
            continue;
        /* --nnodes MIN:MAX (torchrun's spelling): elastic, MIN to MAX nodes */
        const char *colon = k == 1 ? strchr(v, ':') : NULL;
        if (colon) {
            char *end;
            long lo = strtol(v, &end, 10);
            if (end != colon || colon == v || lo < 1 || lo > 65536 || strlen(colon) > 12) {
                fprintf(stderr, "%sdtrain run: error: --nnodes '%.40s': MIN:MAX needs MIN, a "
                        "whole number of nodes from 1\n", dt_cli_rank_prefix(), v);
                return DT_EXIT_USAGE;
            }
            if (a->n_sets == (int)(sizeof a->sets / sizeof a->sets[0])) {
                fprintf(stderr, "%sdtrain run: error: too many --set options\n",
                        dt_cli_rank_prefix());
                return DT_EXIT_USAGE;
            }
            snprintf(sets[6], sizeof sets[6], "launch.min_nnodes=%ld", lo);
            a->sets[a->n_sets++] = sets[6];
            v = colon + 1;
        }
        if (strlen(v) > 256 || strpbrk(v, "\"\\\n")) {
            fprintf(stderr, "%sdtrain run: error: %s: '%.40s' is not a value for %s\n",
                    dt_cli_rank_prefix(), k == 3 ? "--master-addr" : "option", v, keys[k]);
            return DT_EXIT_USAGE;
        }
        if (a->n_sets == (int)(sizeof a->sets / sizeof a->sets[0])) {
            fprintf(stderr, "%sdtrain run: error: too many --set options\n",
                    dt_cli_rank_prefix());
            return DT_EXIT_USAGE;
        }
        /* the address quoted: "::1" or "1e3" must stay a string */
        snprintf(sets[k], sizeof sets[k], k == 3 ? "%s=\"%s\"" : "%s=%s", keys[k], v);
        a->sets[a->n_sets++] = sets[k];
    }
    return DT_EXIT_OK;
}

/* Decide, from the core stage of the config (no plugin loaded), whether
 * this process launches ranks. */
static int plan_launch(const dt_resolved_t *r, dt_launch_plan_t *plan)
{
    dt_origin_t origin = dt_config_origin(r->cfg, "launch.nproc");
    char from[4200];
    if (origin == DT_ORIGIN_CLI)
        snprintf(from, sizeof from, "from --set");
    else if (origin == DT_ORIGIN_FILE)
        snprintf(from, sizeof from, "set in %s", r->set.config_path);
    else
        snprintf(from, sizeof from, "the default");
    return dt_cli_plan_launch(r, r->set.launch.nproc, "launch.nproc", from,
                              origin != DT_ORIGIN_DEFAULT, plan);
}

int dt_cmd_run(int argc, char **argv)
{
    static const char *const opts[] = {"--metrics",     "--profile",     "--nproc",
                                       "--nnodes",      "--node-rank",   "--master-addr",
                                       "--master-port", "--max-restarts", NULL};
    const char *vals[8] = {NULL};
    /* One rank of several (mpirun, srun, torchrun or dtrain's launcher
     * started it): its error lines name it, from the first.  A malformed
     * environment is reported by plan_launch, after the config is read. */
    dt_world_t w;
    if (dt_world_from_env(NULL, &w) == DT_OK && w.size > 1)
        dt_cli_set_rank(w.rank);
    dt_err_clear();
    dt_run_strict_t strict;
    char *args[argc + 1];
    int nargs = dt_run_strict_take(argc, argv, opts, args, &strict);
    dt_cli_config_args_t a;
    int ec = dt_cli_parse_config_args("run", nargs, args, &a, opts, vals);
    if (!ec)
        ec = launch_options(vals + 2, &a);
    if (ec)
        return ec;
    dt_run_profile_t prof;
    if ((ec = dt_run_profile_parse(vals[1], &prof)))
        return ec;
    dt_resolved_t r;
    int rc = dt_resolve_core(a.config, a.sets, a.n_sets, &r);
    if (rc)
        return dt_cli_fail("run", rc);
    dt_launch_plan_t plan;
    rc = plan_launch(&r, &plan);
    if (rc == DT_OK && plan.spawn && r.set.launch.min_nnodes > 0) {
        /* elastic: this node's agent; each round's world is checked as it
         * forms */
        ec = (rc = dt_resolve_rest(&r, NULL)) ? dt_cli_fail("run", rc)
                                               : dt_run_elastic(&a, &r, &plan);
        dt_resolved_free(&r);
        return ec;
    }
    /* a config error is found here, once, before any rank is started */
    if (rc == DT_OK && plan.spawn &&
        ((rc = dt_resolve_rest(&r, NULL)) ||
         (rc = dt_preflight(&r, (int64_t)plan.nproc * plan.nnodes, 1)))) {
        ec = dt_cli_fail("run", rc);
        dt_resolved_free(&r);
        return ec;
    }
    if (rc == DT_OK && plan.spawn) {
        dt_launch_opts_t lo = {.nproc = plan.nproc, .argv = dt_cli_argv(),
                               .raw_stdout_rank = -1, .cleanup = dt_resolve_cleanup_job,
                               .cleanup_ctx = &r};
        char job[128];
        dt_cli_launch_nodes(&plan, &lo, job, sizeof job);
        dt_launch_result_t res;
        rc = dt_launch_run(&lo, &res);
        ec = rc ? dt_cli_fail("run", rc) : res.exit_code;
        dt_resolved_free(&r);
        return ec;
    }
    if (rc == DT_OK && plan.world.size > 1) {
        /* one rank of several: log lines carry the rank, and lines reach
         * the launcher (a pipe) as they are written */
        dt_log_set_rank(plan.world.rank);
        setvbuf(stdout, NULL, _IOLBF, 0);
    }
    /* the ledger is the innermost interposer (the calls the plugin got);
     * after a failed collective its line comes last when it names a
     * divergence, since the launcher quotes a failed rank's last line */
    dt_run_ledger_t ledger = {0};
    char verdict[2048];
    int v = -1;
    if (rc == DT_OK && (rc = dt_resolve_rest(&r, NULL)) == DT_OK &&
        (rc = install_crash_handler(&r, plan.world.rank)) == DT_OK &&
        (rc = dt_run_ledger_begin(&ledger, &r, &plan.world)) == DT_OK &&
        (rc = dt_run_strict_begin(&strict, &r)) == DT_OK) {
        if ((rc = dt_run_profile_begin(&prof, &r)) == DT_OK) {
            dt_train_opts_t o = {.metrics_path = vals[0]};
            rc = dt_train(&r, &o);
            dt_run_profile_end(&prof, plan.world.rank);
        }
        dt_run_strict_end(&strict, plan.world.rank);
        v = dt_run_ledger_judge(&ledger, rc, verdict, sizeof verdict);
    }
    dt_run_ledger_end(&ledger);
    if (v == DT_LEDGER_AGREE)
        fprintf(stderr, "%s%s\n", dt_cli_rank_prefix(), verdict);
    ec = rc ? dt_cli_fail("run", rc) : DT_EXIT_OK;
    if (v == DT_LEDGER_DIVERGED)
        fprintf(stderr, "%s%s\n", dt_cli_rank_prefix(), verdict);
    dt_resolved_free(&r);
    return ec;
}
