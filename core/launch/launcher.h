/*
 * core/launch/launcher.h - a command as the parent of its local ranks.
 *
 * `dtrain run` with [launch] nproc = N > 1 (and `dtrain bench comm
 * --nproc N`) starts N copies of this program with DTRAIN_RANK,
 * DTRAIN_WORLD_SIZE, DTRAIN_LOCAL_RANK, DTRAIN_LOCAL_SIZE, DTRAIN_JOB_ID
 * and DTRAIN_JOB_SECRET set, and then only watches them.  On one node of
 * several ([launch] nnodes, node_rank) its ranks are the global ranks
 * node_rank x N + i of a world of nnodes x N, as torchrun numbers them,
 * and get MASTER_ADDR / MASTER_PORT (the rendezvous) too; lines and
 * messages name global ranks:
 *
 *   output   every line a rank writes is relayed whole, prefixed
 *            "[rank R] " (stdout to stdout, stderr to stderr); a line that
 *            already starts with "[rank R] " for that rank (the core's log
 *            lines) is relayed as it is, so it is not tagged twice
 *   signals  SIGINT, SIGTERM and SIGHUP are forwarded to every rank; a
 *            second one kills them at once.  SIGINT and SIGTERM reach the
 *            launcher and the ranks even when the launcher was started with
 *            them ignored (a background job of a script, `trap '' INT`):
 *            the launcher takes them while it runs, and each rank starts
 *            with both at their default action (SIGHUP keeps what nohup
 *            set)
 *   failure  the first rank that exits non-zero or by a signal makes the
 *            launcher send SIGTERM to the others, then SIGKILL after a
 *            grace period; the last line says which rank failed and how
 *   cleanup  when every rank is gone, the caller's cleanup hook removes
 *            what a crashed rank left behind (`dtrain run`: the comm
 *            plugin's cleanup_job, through the loader); the launcher itself
 *            knows nothing of what a plugin creates
 *
 * Whether to launch at all is dt_launch_plan's decision: never when another
 * launcher (torchrun, mpirun, dtrain's own) already made this process one
 * rank of a job.
 */
#ifndef DT_LAUNCH_LAUNCHER_H
#define DT_LAUNCH_LAUNCHER_H

#include <stdint.h>

#include "config/settings.h"
#include "launch/world.h"

/* Most local ranks one launcher starts (the schema's bound on nproc). */
#define DT_LAUNCH_MAX 256
/* Local ranks allowed per usable CPU: more only thrash and make timeouts
 * likely (waits that should take microseconds take scheduler quanta). */
#define DT_LAUNCH_PER_CPU 4
/* Seconds between SIGTERM and SIGKILL when ranks are stopped. */
#define DT_LAUNCH_GRACE_S 5.0
/* After a rank fails on its own, how long the others have to end by
 * themselves before they are stopped: a failure that every rank learns
 * (a rendezvous timeout rank 0 reports to the others, a dead peer) lets
 * each of them say what it saw, rather than be cut off mid-report. */
#define DT_LAUNCH_REPORT_S 0.5

typedef struct dt_launch_plan {
    int spawn;        /* 1: this process launches `nproc` ranks */
    int nproc;
    int nnodes, node_rank; /* [launch]: nodes of the job, this one */
    dt_world_t world; /* who this process is (rank 0 of 1 when spawning) */
} dt_launch_plan_t;

/* Decide whether this process launches ranks.
 *   launch       the [launch] settings (may be NULL): rendezvous defaults
 *   nproc        local ranks asked for
 *   nproc_name   how the user spells it, for messages ("launch.nproc")
 *   nproc_from   where the value came from ("set in run.toml", "--set")
 *   explicit_    1 when the user gave nproc (not a default)
 * With a launcher's variables in the environment the process is a rank of
 * that job (spawn = 0); an explicit nproc > 1 that differs from that job's
 * local size is a DT_ERR_CONFIG naming both numbers and their sources.
 * Otherwise nproc > 1, or launch->nnodes > 1, spawns, up to
 * dt_launch_max_local() (DT_ERR_CONFIG beyond, naming the value and the
 * limit); the combination of nnodes and node_rank is the caller's to
 * check (it knows where each came from). */
int dt_launch_plan(const dt_launch_settings_t *launch, int64_t nproc,
                   const char *nproc_name, const char *nproc_from, int explicit_,
                   dt_launch_plan_t *out);

/* DT_LAUNCH_PER_CPU x the CPUs this process may run on, at most
 * DT_LAUNCH_MAX.  *cpus (may be NULL) receives the CPU count. */
int dt_launch_max_local(int *cpus);

typedef struct dt_launch_opts {
    int nproc;            /* ranks to start, 1..DT_LAUNCH_MAX */
    int rank_base;        /* global rank of the first (node_rank x nproc) */
    int world_size;       /* ranks of the job on all nodes; 0: nproc */
    const char *master_addr; /* non-NULL: given to the ranks as MASTER_ADDR
                              * and MASTER_PORT (replacing the launcher's) */
    int master_port;
    const char *exe;      /* program each rank runs; NULL: this one
                           * (/proc/self/exe, then argv[0] if it has a '/') */
    char *const *argv;    /* its arguments, NULL-terminated */
    const char *job_id;   /* NULL or "": $DTRAIN_JOB_ID if set, else new */
    double grace_s;       /* SIGTERM -> SIGKILL; <= 0: DT_LAUNCH_GRACE_S */
    int raw_stdout_rank;  /* this rank's stdout is relayed without the
                           * prefix (a table for scripts); -1: none */
    /* Called once, after every rank has exited and before the last line,
     * with `cleanup_ctx` and the job id, to remove what the ranks left
     * (dt_resolve_cleanup_job).  A failure is printed as "dtrain: warning:
     * cleaning up after job <id>: <message>" and changes no exit code.
     * NULL: nothing to clean. */
    int (*cleanup)(void *ctx, const char *job_id);
    void *cleanup_ctx;
} dt_launch_opts_t;

typedef struct dt_launch_result {
    int exit_code;    /* what the launching command should exit with: 0,
                       * the failed rank's exit code (1 when it died by a
                       * signal), or 128 + the signal the launcher got */
    int failed_rank;  /* first rank that failed (global); -1 when none */
    int signal;       /* signal that stopped the launcher; 0 when none */
    char how[64];     /* how the failed rank ended ("exit 1", "killed by
                       * SIGKILL"); "" when none failed */
    char last[400];   /* the failed rank's last error line; "" when none */
    char job_id[128];
} dt_launch_result_t;

/* Start the ranks, relay and watch them until all are gone.  Returns
 * DT_OK when the ranks were started and waited for (how they ended is in
 * *res), or a system error (pipe, fork) with the message set; ranks already
 * started are then killed and reaped.  Prints its own lines to stderr
 * prefixed "dtrain: ".  Blocks SIGCHLD, SIGINT, SIGTERM, SIGHUP, ignores
 * SIGPIPE and gives an ignored SIGINT or SIGTERM its default action while
 * it runs (so the blocked signal is read, not dropped); restores them all
 * before returning. */
int dt_launch_run(const dt_launch_opts_t *o, dt_launch_result_t *res);

#endif /* DT_LAUNCH_LAUNCHER_H */
