/*
 * tests/unit/core/launch/test_launch.c - core/launch and the rank environment
 * (core/launch/world.c): which launcher's variables win and what job id
 * they give, the launch decision and its errors, and dt_launch_run driving
 * /bin/sh ranks: line relay with prefixes (partial, overlong and
 * unterminated lines), exit codes, stopping the others when one fails,
 * SIGKILL after the grace period, the cleanup hook after every rank.
 */
#include <fcntl.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "launch/world.h"
#include "launch/launcher.h"
#include "util/error.h"
#include "test_assert.h"

static const char *const env_vars[] = {
    "DTRAIN_RANK", "DTRAIN_WORLD_SIZE", "DTRAIN_LOCAL_RANK", "DTRAIN_LOCAL_SIZE",
    "DTRAIN_JOB_ID", "DTRAIN_JOB_SECRET", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid",
    "PMIX_NAMESPACE"};

/* The cleanup hook run_sh passes (NULL: none; reset before every test). */
static int (*g_cleanup)(void *ctx, const char *job_id);
static void *g_cleanup_ctx;
/* One node of several for run_sh: rank_base, world_size, master_* (zero:
 * a single node; reset before every test). */
static dt_launch_opts_t g_node;

static int clean_env(void **state)
{
    for (size_t i = 0; i < sizeof env_vars / sizeof env_vars[0]; i++)
        unsetenv(env_vars[i]);
    dt_err_clear();
    g_cleanup = NULL;
    g_cleanup_ctx = NULL;
    memset(&g_node, 0, sizeof g_node);
    return 0;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- world ---------------------------------------------------------------- */

static void test_world_single(void **state)
{
    dt_world_t w;
    assert_ok(dt_world_from_env(NULL, &w));
    assert_int_equal(w.rank, 0);
    assert_int_equal(w.size, 1);
    assert_string_equal(w.source, "single process");
    assert_false(dt_world_from_launcher(&w));
    assert_non_null(strchr(w.job_id, '-')); /* "<pid>-<time>" */
}

static void test_world_torchrun(void **state)
{
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "::1", 1);
    setenv("MASTER_PORT", "29777", 1);
    dt_world_t w;
    assert_ok(dt_world_from_env(NULL, &w));
    assert_int_equal(w.rank, 3);
    assert_int_equal(w.size, 4);
    assert_int_equal(w.local_rank, 1);
    assert_int_equal(w.local_size, 2);
    assert_string_equal(w.source, "torchrun");
    assert_string_equal(w.size_var, "WORLD_SIZE");
    assert_string_equal(w.local_size_var, "LOCAL_WORLD_SIZE");
    assert_int_equal(w.master_port, 29777);
    /* two independent processes derive the same id; ':' is not kept */
    char want[128];
    snprintf(want, sizeof want, "ext-%d-__1-29777", (int)getuid());
    assert_string_equal(w.job_id, want);
}

static void test_world_dtrain_wins(void **state)
{
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("DTRAIN_RANK", "1", 1);
    setenv("DTRAIN_WORLD_SIZE", "2", 1);
    setenv("DTRAIN_JOB_ID", "job/with space", 1);
    dt_world_t w;
    assert_ok(dt_world_from_env(NULL, &w));
    assert_int_equal(w.rank, 1);
    assert_int_equal(w.size, 2);
    assert_int_equal(w.local_size, 2); /* defaults to the world */
    assert_null(w.local_size_var);
    assert_string_equal(w.source, "dtrain launcher");
    assert_string_equal(w.job_id, "job_with_space");
}

static void test_world_ompi_job_id(void **state)
{
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    setenv("OMPI_MCA_ess_base_jobid", "982122497", 1);
    dt_world_t w;
    assert_ok(dt_world_from_env(NULL, &w));
    assert_string_equal(w.source, "Open MPI");
    char want[128];
    snprintf(want, sizeof want, "ompi-%d-982122497", (int)getuid());
    assert_string_equal(w.job_id, want);
    /* Open MPI 5 (PRRTE) sets no ess jobid: the PMIx namespace, which
     * every rank of one mpirun shares, made a file-name-safe job id */
    unsetenv("OMPI_MCA_ess_base_jobid");
    setenv("PMIX_NAMESPACE", "prterun-node1-4242@1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    assert_ok(dt_world_from_env(NULL, &w));
    snprintf(want, sizeof want, "ompi-%d-prterun-node1-4242_1", (int)getuid());
    assert_string_equal(w.job_id, want);
    assert_int_equal(w.local_rank, 1);
    assert_int_equal(w.local_size, 2);
    assert_string_equal(w.local_size_var, "OMPI_COMM_WORLD_LOCAL_SIZE");
}

static void test_world_bad_env(void **state)
{
    dt_world_t w;
    setenv("WORLD_SIZE", "2", 1);
    assert_status(dt_world_from_env(NULL, &w), DT_ERR_CONFIG);
    assert_msg("environment variable WORLD_SIZE is set but RANK is not: a launcher sets both "
               "(unset WORLD_SIZE to run one process)");
    setenv("RANK", "2", 1);
    assert_status(dt_world_from_env(NULL, &w), DT_ERR_CONFIG);
    assert_msg("RANK = 2 is not below WORLD_SIZE = 2");
    setenv("RANK", "x", 1);
    assert_status(dt_world_from_env(NULL, &w), DT_ERR_CONFIG);
    assert_msg_has("RANK = 'x' is not an integer");
}

/* The job secret: read from DTRAIN_JOB_SECRET, bounded. */
static void test_world_job_secret(void **state)
{
    dt_world_t w;
    assert_ok(dt_world_from_env(NULL, &w));
    assert_string_equal(w.job_secret, "");
    setenv("DTRAIN_JOB_SECRET", "s3cr3t", 1);
    assert_ok(dt_world_from_env(NULL, &w));
    assert_string_equal(w.job_secret, "s3cr3t");
    char big[DT_JOB_SECRET_MAX + 1];
    memset(big, 'k', DT_JOB_SECRET_MAX);
    big[DT_JOB_SECRET_MAX] = '\0';
    setenv("DTRAIN_JOB_SECRET", big, 1);
    assert_status(dt_world_from_env(NULL, &w), DT_ERR_CONFIG);
    assert_msg("DTRAIN_JOB_SECRET is 128 characters long; at most 127");
}

/* ---- plan ----------------------------------------------------------------- */

static void test_plan(void **state)
{
    dt_launch_plan_t p;
    assert_ok(dt_launch_plan(NULL, 1, "launch.nproc", "the default", 0, &p));
    assert_int_equal(p.spawn, 0);
    assert_ok(dt_launch_plan(NULL, 2, "launch.nproc", "from --set", 1, &p));
    assert_int_equal(p.spawn, 1);
    assert_int_equal(p.nproc, 2);

    int cpus;
    int lim = dt_launch_max_local(&cpus);
    assert_int_equal(lim, cpus * DT_LAUNCH_PER_CPU > DT_LAUNCH_MAX
                              ? DT_LAUNCH_MAX : cpus * DT_LAUNCH_PER_CPU);
    if (lim < DT_LAUNCH_MAX) {
        char want[256];
        snprintf(want, sizeof want,
                 "launch.nproc = %d (from --set) is more local ranks than this machine can "
                 "run: the limit is %d (4 per CPU this process may use, %d CPU",
                 lim + 1, lim, cpus);
        assert_status(dt_launch_plan(NULL, lim + 1, "launch.nproc", "from --set", 1, &p),
                      DT_ERR_CONFIG);
        assert_msg_starts(want);
    }
    assert_status(dt_launch_plan(NULL, 0, "--nproc", "from the command line", 1, &p),
                  DT_ERR_CONFIG);
    assert_msg("--nproc = 0 (from the command line) is outside [1, 256]");
}

/* nnodes > 1 spawns even one rank per node: it needs its global rank */
static void test_plan_nodes(void **state)
{
    dt_launch_settings_t l = {.nproc = 1, .nnodes = 2, .node_rank = 1, .timeout_s = 1,
                              .master_addr = "10.0.0.1", .master_port = 29500};
    dt_launch_plan_t p;
    assert_ok(dt_launch_plan(&l, 1, "launch.nproc", "the default", 0, &p));
    assert_int_equal(p.spawn, 1);
    assert_int_equal(p.nproc, 1);
    assert_int_equal(p.nnodes, 2);
    assert_int_equal(p.node_rank, 1);
    /* a rank of that job (what the node's launcher set): joins */
    setenv("DTRAIN_RANK", "3", 1);
    setenv("DTRAIN_WORLD_SIZE", "4", 1);
    setenv("DTRAIN_LOCAL_RANK", "1", 1);
    setenv("DTRAIN_LOCAL_SIZE", "2", 1);
    assert_ok(dt_launch_plan(&l, 2, "launch.nproc", "the default", 1, &p));
    assert_int_equal(p.spawn, 0);
    assert_int_equal(p.nnodes, 2);
    assert_int_equal(p.world.rank, 3);
}

static void test_plan_under_launcher(void **state)
{
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    dt_launch_plan_t p;
    /* the default or an agreeing nproc: join, never spawn */
    assert_ok(dt_launch_plan(NULL, 1, "launch.nproc", "the default", 0, &p));
    assert_int_equal(p.spawn, 0);
    assert_int_equal(p.world.size, 2);
    assert_ok(dt_launch_plan(NULL, 2, "launch.nproc", "set in a.toml", 1, &p));
    assert_int_equal(p.spawn, 0);
    assert_ok(dt_launch_plan(NULL, 1, "launch.nproc", "set in a.toml", 1, &p));
    assert_status(dt_launch_plan(NULL, 3, "launch.nproc", "set in a.toml", 1, &p),
                  DT_ERR_CONFIG);
    assert_msg("launch.nproc = 3 (set in a.toml) asks for 3 local ranks, but torchrun started "
               "this process as one of 2 local ranks (WORLD_SIZE = 2); under another launcher "
               "dtrain starts no ranks itself: remove launch.nproc or make the two agree");
}

/* ---- running ranks --------------------------------------------------------- */

typedef struct captured {
    char out[65536], err[65536];
    int rc;
    dt_launch_result_t res;
    double secs;
} captured_t;

static void slurp(int fd, char *buf, size_t cap)
{
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, buf, cap - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
}

/* Run `script` in /bin/sh as each of `n` ranks, stdout and stderr captured. */
static void run_sh(int n, const char *script, double grace_s, captured_t *c)
{
    char *argv[] = {"sh", "-c", (char *)script, NULL};
    dt_launch_opts_t o = {.nproc = n, .exe = "/bin/sh", .argv = argv, .grace_s = grace_s,
                          .raw_stdout_rank = -1, .cleanup = g_cleanup,
                          .cleanup_ctx = g_cleanup_ctx, .rank_base = g_node.rank_base,
                          .world_size = g_node.world_size, .master_addr = g_node.master_addr,
                          .master_port = g_node.master_port};
    char tout[] = "/tmp/dt-launch-out-XXXXXX", terr[] = "/tmp/dt-launch-err-XXXXXX";
    int fo = mkstemp(tout), fe = mkstemp(terr);
    assert_true(fo >= 0 && fe >= 0);
    unlink(tout);
    unlink(terr);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    dup2(fo, 1);
    dup2(fe, 2);
    double t0 = mono_s();
    c->rc = dt_launch_run(&o, &c->res);
    c->secs = mono_s() - t0;
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so);
    close(se);
    slurp(fo, c->out, sizeof c->out);
    slurp(fe, c->err, sizeof c->err);
}

static int count_lines(const char *text, const char *line)
{
    int n = 0;
    size_t len = strlen(line);
    for (const char *p = text; (p = strstr(p, line)); p += len)
        if ((p == text || p[-1] == '\n') && p[len] == '\n')
            n++;
    return n;
}

static captured_t cap;

static void test_run_relays_lines(void **state)
{
    /* a line written in three pieces, a line already tagged, an unterminated
     * last line, a 10000-byte line, and stderr */
    run_sh(2,
           "printf 'hello from %s' $DTRAIN_RANK; sleep 0.05; printf ' of %s' "
           "$DTRAIN_WORLD_SIZE; printf ' (%s)\\n' $DTRAIN_LOCAL_RANK/$DTRAIN_LOCAL_SIZE; "
           "echo \"[rank $DTRAIN_RANK] tagged\"; echo \"job=$DTRAIN_JOB_ID\" >&2; "
           "head -c 10000 /dev/zero | tr '\\0' x; echo; printf 'last'",
           0, &cap);
    assert_ok(cap.rc);
    assert_int_equal(cap.res.exit_code, 0);
    assert_int_equal(cap.res.failed_rank, -1);
    for (int r = 0; r < 2; r++) {
        char line[256];
        snprintf(line, sizeof line, "[rank %d] hello from %d of 2 (%d/2)", r, r, r);
        assert_int_equal(count_lines(cap.out, line), 1);
        snprintf(line, sizeof line, "[rank %d] tagged", r);
        assert_int_equal(count_lines(cap.out, line), 1);
        snprintf(line, sizeof line, "[rank %d] last", r);
        assert_int_equal(count_lines(cap.out, line), 1);
        snprintf(line, sizeof line, "[rank %d] job=%s", r, cap.res.job_id);
        assert_int_equal(count_lines(cap.err, line), 1);
    }
    /* 10000 x: a piece of 8192 and one of 1808, each a prefixed line */
    char xs[8193];
    memset(xs, 'x', 8192);
    xs[8192] = '\0';
    char piece[8300];
    snprintf(piece, sizeof piece, "[rank 1] %s", xs);
    assert_int_equal(count_lines(cap.out, piece), 1);
    snprintf(piece, sizeof piece, "[rank 1] %.*s", 1808, xs);
    assert_int_equal(count_lines(cap.out, piece), 1);
    /* nothing else: every line has one of the prefixes */
    int lines = 0;
    for (const char *p = cap.out; *p; p = strchr(p, '\n') + 1) {
        assert_true(strncmp(p, "[rank 0] ", 9) == 0 || strncmp(p, "[rank 1] ", 9) == 0);
        lines++;
        if (!strchr(p, '\n'))
            break;
    }
    assert_int_equal(lines, 10);
    assert_non_null(strstr(cap.err, "dtrain: launching 2 ranks (job "));
}

/* One node of two: global ranks in the environment and in the prefixes,
 * the rendezvous address replacing the launcher's own MASTER_*, and the
 * failed rank named by its global number. */
static void test_run_node_ranks(void **state)
{
    setenv("MASTER_ADDR", "elsewhere", 1);
    setenv("MASTER_PORT", "1", 1);
    g_node = (dt_launch_opts_t){.rank_base = 2, .world_size = 4, .master_addr = "10.1.2.3",
                                .master_port = 29555};
    /* rank 3 fails once rank 2 has written its line (a file says so) */
    char flag[64], script[512];
    snprintf(flag, sizeof flag, "/tmp/dt-launch-node-%d", (int)getpid());
    unlink(flag);
    snprintf(script, sizeof script,
             "echo \"$DTRAIN_RANK $DTRAIN_WORLD_SIZE $DTRAIN_LOCAL_RANK $DTRAIN_LOCAL_SIZE "
             "$MASTER_ADDR:$MASTER_PORT\"; if [ $DTRAIN_LOCAL_RANK = 1 ]; then i=0; while [ "
             "! -e %s ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; exit 3; fi; "
             "touch %s; sleep 5",
             flag, flag);
    run_sh(2, script, 0.5, &cap);
    unlink(flag);
    assert_ok(cap.rc);
    assert_int_equal(count_lines(cap.out, "[rank 2] 2 4 0 2 10.1.2.3:29555"), 1);
    assert_int_equal(count_lines(cap.out, "[rank 3] 3 4 1 2 10.1.2.3:29555"), 1);
    assert_int_equal(cap.res.failed_rank, 3);
    assert_int_equal(cap.res.exit_code, 3);
    assert_non_null(strstr(cap.err, "dtrain: launching ranks 2-3 of 4 (job "));
    assert_non_null(strstr(cap.err, "dtrain: rank 3 failed (exit 3); stopped the other 1 rank"));
}

/* Every rank of a launch gets the same fresh 64-hex-digit secret; another
 * launch gets another one; a secret the caller set is passed on. */
static void test_run_job_secret(void **state)
{
    const char *script = "echo \"secret=$DTRAIN_JOB_SECRET\"";
    char first[128] = "";
    for (int k = 0; k < 2; k++) {
        run_sh(2, script, 0, &cap);
        assert_ok(cap.rc);
        assert_int_equal(cap.res.exit_code, 0);
        char want[160];
        const char *at = strstr(cap.out, "[rank 0] secret=");
        assert_non_null(at);
        char s0[128];
        assert_int_equal(sscanf(at, "[rank 0] secret=%127s", s0), 1);
        assert_int_equal(strlen(s0), 64);
        assert_true(strspn(s0, "0123456789abcdef") == 64);
        snprintf(want, sizeof want, "[rank 1] secret=%s", s0);
        assert_int_equal(count_lines(cap.out, want), 1);
        if (k == 0)
            snprintf(first, sizeof first, "%s", s0);
        else
            assert_string_not_equal(first, s0);
    }
    setenv("DTRAIN_JOB_SECRET", "chosen", 1);
    run_sh(2, script, 0, &cap);
    assert_ok(cap.rc);
    assert_int_equal(count_lines(cap.out, "[rank 0] secret=chosen"), 1);
    assert_int_equal(count_lines(cap.out, "[rank 1] secret=chosen"), 1);
}

static void test_run_failure_stops_others(void **state)
{
    /* rank 1 fails at once; rank 0 would sleep 30 s */
    run_sh(3,
           "if [ $DTRAIN_RANK = 1 ]; then echo 'rank one: bad thing' >&2; exit 3; fi; "
           "exec sleep 30",
           0, &cap);
    assert_ok(cap.rc);
    assert_int_equal(cap.res.exit_code, 3);
    assert_int_equal(cap.res.failed_rank, 1);
    assert_true(cap.secs < 10);
    assert_non_null(strstr(cap.err, "[rank 1] rank one: bad thing\n"));
    assert_non_null(strstr(cap.err, "dtrain: rank 1 failed (exit 3); stopped the other 2 "
                                    "ranks; its last error line: rank one: bad thing\n"));
}

static void test_run_signal_death(void **state)
{
    run_sh(2, "[ $DTRAIN_RANK = 0 ] && kill -USR1 $$; exit 0", 0, &cap);
    assert_ok(cap.rc);
    assert_int_equal(cap.res.exit_code, 1);
    assert_int_equal(cap.res.failed_rank, 0);
    assert_non_null(strstr(cap.err, "dtrain: rank 0 failed (killed by SIGUSR1"));
}

static void test_run_kill_after_grace(void **state)
{
    /* rank 0 ignores SIGTERM: SIGKILL after the 0.3 s grace */
    run_sh(2,
           "if [ $DTRAIN_RANK = 1 ]; then sleep 0.2; exit 1; fi; trap '' TERM; exec sleep 30",
           0.3, &cap);
    assert_ok(cap.rc);
    assert_int_equal(cap.res.exit_code, 1);
    assert_int_equal(cap.res.failed_rank, 1);
    assert_true(cap.secs < 10);
    assert_non_null(strstr(cap.err, "dtrain: rank 0 did not stop within 0.3 s of being asked "
                                    "to; killed it\n"));
    assert_non_null(strstr(cap.err, "dtrain: rank 1 failed (exit 1); stopped the other 1 "
                                    "rank\n"));
}

/* A launcher started with SIGINT and SIGTERM ignored (a script's
 * background job, `trap '' INT`) starts its ranks with both at their
 * default action, so Ctrl-C and the launcher's forwarding reach them; its
 * own dispositions are restored when it returns. */
static void test_run_ranks_not_ignoring_stop_signals(void **state)
{
    struct sigaction ign = {.sa_handler = SIG_IGN}, old_int, old_term, now;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGINT, &ign, &old_int);
    sigaction(SIGTERM, &ign, &old_term);
    run_sh(1, "grep '^SigIgn:' /proc/$$/status", 0, &cap);
    sigaction(SIGINT, NULL, &now);
    assert_true(now.sa_handler == SIG_IGN);
    sigaction(SIGTERM, NULL, &now);
    assert_true(now.sa_handler == SIG_IGN);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    assert_ok(cap.rc);
    assert_int_equal(cap.res.exit_code, 0);
    unsigned long long ignored = ~0ull;
    const char *at = strstr(cap.out, "[rank 0] SigIgn:");
    assert_non_null(at);
    assert_int_equal(sscanf(at, "[rank 0] SigIgn: %llx", &ignored), 1);
    assert_int_equal((ignored >> (SIGINT - 1)) & 1, 0);
    assert_int_equal((ignored >> (SIGTERM - 1)) & 1, 0);
}

static void test_run_cannot_exec(void **state)
{
    char *argv[] = {"nope", NULL};
    dt_launch_opts_t o = {.nproc = 2, .exe = "/nonexistent/dtrain", .argv = argv,
                          .raw_stdout_rank = -1};
    fflush(stderr);
    int se = dup(2), nul = open("/dev/null", O_WRONLY);
    dup2(nul, 2);
    dt_launch_result_t res;
    int rc = dt_launch_run(&o, &res);
    dup2(se, 2);
    close(se);
    close(nul);
    assert_ok(rc);
    assert_int_equal(res.exit_code, 127);
    assert_true(res.failed_rank == 0 || res.failed_rank == 1);
}

/* ---- cleanup after the ranks ------------------------------------------------ */

typedef struct cleanup_seen {
    char dir[64];      /* where the ranks write "pid-<rank>" */
    int n;
    int status;        /* what the hook returns */
    int calls;
    char job_id[128];
    int alive;         /* ranks whose process still existed at the call */
} cleanup_seen_t;

static int record_cleanup(void *ctx, const char *job_id)
{
    cleanup_seen_t *c = ctx;
    c->calls++;
    snprintf(c->job_id, sizeof c->job_id, "%s", job_id);
    for (int r = 0; r < c->n; r++) {
        char path[128];
        snprintf(path, sizeof path, "%s/pid-%d", c->dir, r);
        FILE *f = fopen(path, "r");
        long pid = 0;
        if (f && fscanf(f, "%ld", &pid) == 1 && pid > 0 && kill((pid_t)pid, 0) == 0)
            c->alive++;
        if (f)
            fclose(f);
        unlink(path);
    }
    if (c->status)
        return dt_err_set(c->status, "comm/x: cannot remove /dev/x-%s: Permission denied",
                          job_id);
    return DT_OK;
}

/* The last line of `text`. */
static const char *last_line(const char *text)
{
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n')
        n--;
    while (n > 0 && text[n - 1] != '\n')
        n--;
    return text + n;
}

static void test_run_cleanup_after_every_rank(void **state)
{
    /* rank 1 fails after 0.2 s; rank 0 would sleep 30 s and is stopped */
    static cleanup_seen_t seen;
    memset(&seen, 0, sizeof seen);
    snprintf(seen.dir, sizeof seen.dir, "/tmp/dt-launch-clean-XXXXXX");
    assert_non_null(mkdtemp(seen.dir));
    seen.n = 2;
    g_cleanup = record_cleanup;
    g_cleanup_ctx = &seen;
    char script[512];
    snprintf(script, sizeof script,
             "echo $$ > %s/pid-$DTRAIN_RANK; "
             "if [ $DTRAIN_RANK = 1 ]; then sleep 0.2; exit 3; fi; exec sleep 30",
             seen.dir);
    run_sh(2, script, 0, &cap);
    assert_ok(cap.rc);
    assert_int_equal(cap.res.exit_code, 3);
    assert_int_equal(cap.res.failed_rank, 1);
    assert_int_equal(seen.calls, 1);
    assert_string_equal(seen.job_id, cap.res.job_id);
    assert_int_equal(seen.alive, 0); /* called after every rank was reaped */
    assert_string_equal(last_line(cap.err), "dtrain: rank 1 failed (exit 3); stopped the "
                                            "other 1 rank\n");

    /* a failing hook is a warning before the last line; the job's outcome
     * stands */
    seen.status = DT_ERR_IO;
    seen.calls = 0;
    snprintf(script, sizeof script, "echo $$ > %s/pid-$DTRAIN_RANK", seen.dir);
    run_sh(2, script, 0, &cap);
    assert_ok(cap.rc);
    assert_int_equal(cap.res.exit_code, 0);
    assert_int_equal(seen.calls, 1);
    assert_int_equal(seen.alive, 0);
    char want[512];
    snprintf(want, sizeof want, "dtrain: warning: cleaning up after job %s: comm/x: cannot "
             "remove /dev/x-%s: Permission denied\n", cap.res.job_id, cap.res.job_id);
    assert_string_equal(last_line(cap.err), want);
    rmdir(seen.dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_world_single, clean_env),
        cmocka_unit_test_setup(test_world_job_secret, clean_env),
        cmocka_unit_test_setup(test_world_torchrun, clean_env),
        cmocka_unit_test_setup(test_world_dtrain_wins, clean_env),
        cmocka_unit_test_setup(test_world_ompi_job_id, clean_env),
        cmocka_unit_test_setup(test_world_bad_env, clean_env),
        cmocka_unit_test_setup(test_plan, clean_env),
        cmocka_unit_test_setup(test_plan_under_launcher, clean_env),
        cmocka_unit_test_setup(test_run_relays_lines, clean_env),
        cmocka_unit_test_setup(test_run_job_secret, clean_env),
        cmocka_unit_test_setup(test_run_node_ranks, clean_env),
        cmocka_unit_test_setup(test_plan_nodes, clean_env),
        cmocka_unit_test_setup(test_run_failure_stops_others, clean_env),
        cmocka_unit_test_setup(test_run_signal_death, clean_env),
        cmocka_unit_test_setup(test_run_kill_after_grace, clean_env),
        cmocka_unit_test_setup(test_run_ranks_not_ignoring_stop_signals, clean_env),
        cmocka_unit_test_setup(test_run_cannot_exec, clean_env),
        cmocka_unit_test_setup(test_run_cleanup_after_every_rank, clean_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
