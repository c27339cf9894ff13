/*
 * core/launch/launcher.c - spawn the local ranks, relay their output line by
 * line, forward signals, stop the job when one rank fails, and have what a
 * crash left removed (the caller's cleanup hook).  See launcher.h for the
 * behaviour.
 *
 * The parent is one poll loop over a signalfd (SIGCHLD and the forwarded
 * signals, blocked while it runs so none is lost between checks) and two
 * pipes per rank.  Each pipe has a line buffer: only whole lines are
 * written, each with one write(2), so lines of different ranks never mix.
 */
#include "launch/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/crash.h"
#include "util/error.h"

extern char **environ;

#define LINE_CAP 8192  /* a longer line is relayed in pieces of this size */
#define DRAIN_S 2.0    /* after the last rank exited, how long its pipes may
                        * stay open (a grandchild may hold them) */
#define N_STOP 2       /* the signals that stop a job: stop_signals */
#define LAST_CAP 400   /* a failed rank's last stderr line, for the summary */

/* ------------------------------------------------------------ planning -- */

int dt_launch_max_local(int *cpus)
{
    int n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0) {
        long x = sysconf(_SC_NPROCESSORS_ONLN);
        n = x > 0 ? (int)x : 1;
    }
    if (cpus)
        *cpus = n;
    long lim = (long)n * DT_LAUNCH_PER_CPU;
    return lim > DT_LAUNCH_MAX ? DT_LAUNCH_MAX : (int)lim;
}

int dt_launch_plan(const dt_launch_settings_t *launch, int64_t nproc,
                   const char *nproc_name, const char *nproc_from, int explicit_,
                   dt_launch_plan_t *out)
{
    memset(out, 0, sizeof *out);
    int rc = dt_world_from_env(launch, &out->world);
    if (rc)
        return rc;
    const dt_world_t *w = &out->world;
    if (dt_world_from_launcher(w)) {
        out->nproc = w->local_size;
        out->nnodes = w->size / w->local_size;
        if (explicit_ && nproc > 1 && nproc != w->local_size) {
            char sizes[160];
            if (w->local_size_var)
                snprintf(sizes, sizeof sizes, "%s = %d, %s = %d", w->local_size_var,
                         w->local_size, w->size_var, w->size);
            else
                snprintf(sizes, sizeof sizes, "%s = %d", w->size_var, w->size);
            return dt_err_set(DT_ERR_CONFIG,
                              "%s = %lld (%s) asks for %lld local ranks, but %s started this "
                              "process as one of %d local ranks (%s); under another launcher "
                              "dtrain starts no ranks itself: remove %s or make the two agree",
                              nproc_name, (long long)nproc, nproc_from, (long long)nproc,
                              w->source, w->local_size, sizes, nproc_name);
        }
        return DT_OK;
    }
    out->nnodes = launch && launch->nnodes > 1 ? (int)launch->nnodes : 1;
    out->node_rank = launch ? (int)launch->node_rank : 0;
    if (nproc < 1 || nproc > DT_LAUNCH_MAX)
        return dt_err_set(DT_ERR_CONFIG, "%s = %lld (%s) is outside [1, %d]", nproc_name,
                          (long long)nproc, nproc_from, DT_LAUNCH_MAX);
    out->nproc = (int)nproc;
    if (nproc > 1 || out->nnodes > 1) {
        int cpus;
        int lim = dt_launch_max_local(&cpus);
        if (nproc > lim)
            return dt_err_set(DT_ERR_CONFIG,
                              "%s = %lld (%s) is more local ranks than this machine can run: "
                              "the limit is %d (%d per CPU this process may use, %d CPU%s); "
                              "oversubscribed ranks spend their time waiting for each other",
                              nproc_name, (long long)nproc, nproc_from, lim, DT_LAUNCH_PER_CPU,
                              cpus, cpus == 1 ? "" : "s");
        out->spawn = 1;
    }
    return DT_OK;
}

/* ------------------------------------------------------------- running -- */

typedef struct stream {
    int fd;      /* read end; -1 once closed */
    int rank;
    int out_fd;  /* where its lines go: 1 or 2 */
    int raw;     /* relayed without the prefix */
    size_t len;
    char buf[LINE_CAP];
} stream_t;

typedef struct rank_state {
    pid_t pid;
    int alive;
    int status;              /* wait status once reaped */
    char last[LAST_CAP];     /* its last non-empty stderr line */
} rank_state_t;

static const char *const launch_vars[] = {"DTRAIN_RANK=", "DTRAIN_WORLD_SIZE=",
                                          "DTRAIN_LOCAL_RANK=", "DTRAIN_LOCAL_SIZE=",
                                          "DTRAIN_JOB_ID=", "DTRAIN_JOB_SECRET=",
                                          "MASTER_ADDR=", "MASTER_PORT="};
#define N_LAUNCH_VARS 8
#define N_JOB_VARS 6 /* without MASTER_*: those only when the caller gives them */

typedef struct launch {
    const dt_launch_opts_t *o;
    int n;
    double grace_s;
    char job_id[128];
    char job_secret[DT_JOB_SECRET_MAX]; /* what every rank proves it knows */
    rank_state_t *ranks;
    stream_t *streams;       /* [2r] stdout, [2r + 1] stderr of rank r */
    int n_alive;
    int first_fail;          /* -1 until a rank fails on its own */
    int n_stopped;           /* ranks still running when it failed */
    int stop_sig;            /* first signal the launcher got */
    int aborting;            /* could not start every rank */
    double kill_at;          /* SIGKILL deadline (monotonic s); 0 = none */
    double term_at;          /* after a failure, when the others still
                              * running are stopped (DT_LAUNCH_REPORT_S);
                              * 0 = none pending */
    /* what each rank is started with */
    char **envp;             /* ours minus an outer job's launch variables,
                              * then `vars` (rewritten before each fork) */
    int n_vars;              /* of launch_vars: N_JOB_VARS or all */
    int base;                /* global rank of local rank 0 */
    char vars[N_LAUNCH_VARS][300]; /* "NAME=value"; the secret's and an
                                    * address's fit */
    const char *exe, *fallback;
    char exe_fallback[4096];
    /* the signals the launcher takes over while it runs */
    int sfd;                 /* signalfd; -1 when it could not be made */
    sigset_t old_mask;
    struct sigaction old_pipe;
    struct sigaction old_stop[N_STOP]; /* SIGINT, SIGTERM as the caller had them */
    /* the poll set: the signalfd, then every open stream */
    struct pollfd *pf;
    int *which;              /* stream index of pf[i]; -1: the signalfd */
} launch_t;

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *sig_name(int sig, char *buf, size_t cap)
{
    static const struct { int sig; const char *name; } names[] = {
        {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
        {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig)
            return names[i].name;
    snprintf(buf, cap, "signal %d", sig);
    return buf;
}

/* Write all of buf; output that cannot be written (a closed pipe) is
 * dropped: the ranks keep running whether anyone reads or not. */
static void write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w > 0) {
            buf += w;
            n -= (size_t)w;
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, 100);
        } else {
            return;
        }
    }
}

static void emit_line(launch_t *L, stream_t *s, const char *line, size_t len)
{
    char out[LINE_CAP + 32];
    char prefix[24];
    int pn = snprintf(prefix, sizeof prefix, "[rank %d] ", L->base + s->rank);
    int tagged = len >= (size_t)pn && memcmp(line, prefix, (size_t)pn) == 0;
    size_t k = 0;
    if (!s->raw && !tagged) {
        memcpy(out, prefix, (size_t)pn);
        k = (size_t)pn;
    }
    memcpy(out + k, line, len);
    k += len;
    out[k++] = '\n';
    write_all(s->out_fd, out, k);
    if (s->out_fd == 2) {
        if (tagged) {
            line += pn;
            len -= (size_t)pn;
        }
        while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' '))
            len--;
        if (len > 0) {
            rank_state_t *r = &L->ranks[s->rank];
            size_t c = len < LAST_CAP - 1 ? len : LAST_CAP - 1;
            memcpy(r->last, line, c);
            r->last[c] = '\0';
        }
    }
}

static void close_stream(launch_t *L, stream_t *s)
{
    if (s->len > 0)
        emit_line(L, s, s->buf, s->len); /* a last line without '\n' */
    s->len = 0;
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}

static void read_stream(launch_t *L, stream_t *s)
{
    ssize_t got = read(s->fd, s->buf + s->len, LINE_CAP - s->len);
    if (got < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (got <= 0) {
        close_stream(L, s);
        return;
    }
    s->len += (size_t)got;
    size_t start = 0;
    for (size_t i = s->len - (size_t)got; i < s->len; i++) {
        if (s->buf[i] != '\n')
            continue;
        emit_line(L, s, s->buf + start, i - start);
        start = i + 1;
    }
    if (start > 0) {
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
    if (s->len == LINE_CAP) { /* no newline in LINE_CAP bytes: relay a piece */
        emit_line(L, s, s->buf, s->len);
        s->len = 0;
    }
}

static int signal_all(launch_t *L, int sig)
{
    int n = 0;
    for (int r = 0; r < L->n; r++)
        if (L->ranks[r].alive && kill(L->ranks[r].pid, sig) == 0)
            n++;
    return n;
}

static int failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

/* Reap every rank that has ended.  The first failure of the job stops the
 * others: of several found at once, a rank killed by a signal is more
 * likely the cause than one that exited after seeing its peer die. */
static void reap(launch_t *L)
{
    int cause = -1;
    for (int r = 0; r < L->n; r++) {
        rank_state_t *k = &L->ranks[r];
        if (!k->alive)
            continue;
        int st = 0;
        pid_t w = waitpid(k->pid, &st, WNOHANG);
        if (w == 0 || (w < 0 && errno == EINTR))
            continue;
        k->alive = 0;
        /* w < 0: not our child any more (reaped elsewhere): count it lost,
         * as if killed */
        k->status = w < 0 ? SIGKILL : st;
        L->n_alive--;
        if (!failed(k->status) || L->first_fail >= 0 || L->stop_sig || L->aborting)
            continue;
        if (cause < 0 || (WIFSIGNALED(k->status) && !WIFSIGNALED(L->ranks[cause].status)))
            cause = r;
    }
    if (cause < 0)
        return;
    L->first_fail = cause;
    /* the others may be reporting the same failure: let them finish */
    if (L->n_alive > 0)
        L->term_at = mono_s() + DT_LAUNCH_REPORT_S;
}

/* The report window after a failure has passed: stop who is left. */
static void stop_after_failure(launch_t *L)
{
    if (L->term_at <= 0 || mono_s() < L->term_at)
        return;
    L->term_at = 0;
    L->n_stopped = signal_all(L, SIGTERM);
    if (L->n_stopped > 0)
        L->kill_at = mono_s() + L->grace_s;
}

static void on_signal(launch_t *L, int sig)
{
    char b[32];
    if (L->stop_sig || L->first_fail >= 0) {
        /* asked again, or while stopping after a failure: no more grace */
        if (signal_all(L, SIGKILL) > 0)
            fprintf(stderr, "dtrain: %s again: killing the remaining ranks\n",
                    sig_name(sig, b, sizeof b));
        if (!L->stop_sig)
            L->stop_sig = sig;
        L->kill_at = L->term_at = 0;
        return;
    }
    L->stop_sig = sig;
    int n = signal_all(L, sig);
    fprintf(stderr, "dtrain: got %s: passed it on to %d rank%s\n", sig_name(sig, b, sizeof b),
            n, n == 1 ? "" : "s");
    L->kill_at = mono_s() + L->grace_s;
}

/* The signals that stop a job, which neither the launcher nor a rank may
 * leave ignored. */
static const int stop_signals[N_STOP] = {SIGINT, SIGTERM};

/* Between fork and exec: only async-signal-safe calls. */
static void child_exec(int out_w, int err_w, const char *exe, char *const *argv, char **envp,
                       const char *fallback, const sigset_t *mask, pid_t parent)
{
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0 && nul != 0) {
        dup2(nul, 0);
        close(nul);
    }
    dup2(out_w, 1);
    dup2(err_w, 2);
    for (int fd = 0; fd < 3; fd++)
        fcntl(fd, F_SETFD, 0);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &dfl, NULL);
    /* an ignored SIGINT/SIGTERM is inherited through exec: a rank would
     * train on after Ctrl-C and the launcher's forwarding */
    for (int i = 0; i < N_STOP; i++)
        sigaction(stop_signals[i], &dfl, NULL);
    sigprocmask(SIG_SETMASK, mask, NULL);
    /* a launcher killed with SIGKILL takes its ranks with it */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(1);
    execve(exe, argv, envp);
    if (fallback)
        execve(fallback, argv, envp);
    static const char msg[] = "dtrain: cannot execute the rank's program\n";
    ssize_t ignored = write(2, msg, sizeof msg - 1);
    (void)ignored;
    _exit(127); /* the forked copy of the launcher must not return */
}

/* Stop everything that started: the started ranks cannot form the job. */
static void abort_launch(launch_t *L)
{
    signal_all(L, SIGKILL);
    L->aborting = 1;
}

/* The job id every rank gets: the caller's, $DTRAIN_JOB_ID, or a new one. */
static void make_job_id(launch_t *L)
{
    const dt_launch_opts_t *o = L->o;
    const char *id = o->job_id && o->job_id[0] ? o->job_id : getenv("DTRAIN_JOB_ID");
    if (id && id[0]) {
        snprintf(L->job_id, sizeof L->job_id, "%.96s", id);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(L->job_id, sizeof L->job_id, "%d-%llx", (int)getpid(),
                 (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    }
    dt_world_sanitize_job_id(L->job_id);
}

/* The secret the ranks present to join each other (shm keeps only a keyed
 * hash of it): $DTRAIN_JOB_SECRET when the caller chose one, else 32
 * random bytes, so that knowing the job id is not enough to join. */
static int make_job_secret(launch_t *L)
{
    const char *s = getenv("DTRAIN_JOB_SECRET");
    if (s && s[0]) {
        if (strlen(s) >= sizeof L->job_secret)
            return dt_err_set(DT_ERR_CONFIG, "DTRAIN_JOB_SECRET is %zu characters long; at "
                              "most %zu", strlen(s), sizeof L->job_secret - 1);
        snprintf(L->job_secret, sizeof L->job_secret, "%s", s);
        return DT_OK;
    }
    unsigned char b[32];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return dt_err_set(DT_ERR_SYSTEM, "launch: getrandom for the job secret: %s",
                              strerror(errno));
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof b; i++)
        snprintf(L->job_secret + 2 * i, 3, "%02x", b[i]);
    return DT_OK;
}

/* Per-rank state, the environment and the program each rank runs. */
static int prepare(launch_t *L)
{
    /* fds 0-2 open, so no pipe lands there and gets lost in dup2 */
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) < 0)
            open("/dev/null", O_RDWR); /* takes the lowest free fd: this one; kept */

    /* the environment of each rank: ours, without launch variables of an
     * outer job, plus this job's (rewritten per rank before each fork) */
    size_t ne = 0;
    while (environ && environ[ne])
        ne++;
    L->n_vars = L->o->master_addr ? N_LAUNCH_VARS : N_JOB_VARS;
    L->envp = calloc(ne + N_LAUNCH_VARS + 1, sizeof *L->envp);
    L->ranks = calloc((size_t)L->n, sizeof *L->ranks);
    L->streams = calloc((size_t)L->n * 2, sizeof *L->streams);
    L->pf = calloc((size_t)L->n * 2 + 1, sizeof *L->pf);
    L->which = calloc((size_t)L->n * 2 + 1, sizeof *L->which);
    if (!L->envp || !L->ranks || !L->streams || !L->pf || !L->which)
        return dt_err_set(DT_ERR_NOMEM, "launch: out of memory for %d ranks", L->n);
    size_t k = 0;
    for (size_t i = 0; i < ne; i++) {
        int skip = 0;
        for (int v = 0; v < L->n_vars; v++)
            skip |= strncmp(environ[i], launch_vars[v], strlen(launch_vars[v])) == 0;
        if (!skip)
            L->envp[k++] = environ[i];
    }
    for (int v = 0; v < L->n_vars; v++)
        L->envp[k + (size_t)v] = L->vars[v];
    L->envp[k + (size_t)L->n_vars] = NULL;
    for (int i = 0; i < 2 * L->n; i++)
        L->streams[i].fd = -1;

    const dt_launch_opts_t *o = L->o;
    L->exe = o->exe ? o->exe : "/proc/self/exe";
    snprintf(L->exe_fallback, sizeof L->exe_fallback, "%s", o->argv[0]);
    L->fallback = !o->exe && strchr(L->exe_fallback, '/') ? L->exe_fallback : NULL;
    return DT_OK;
}

/* Block SIGCHLD and the forwarded signals (read from a signalfd, so none
 * is lost between checks) and ignore SIGPIPE; restore_signals undoes it. */
static int take_signals(launch_t *L)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, &L->old_mask);
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &L->old_pipe);
    /* an ignored signal is dropped, never pending: the signalfd would not
     * see it (blocked, the default action does not run) */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int i = 0; i < N_STOP; i++) {
        sigaction(stop_signals[i], NULL, &L->old_stop[i]);
        if (!(L->old_stop[i].sa_flags & SA_SIGINFO) && L->old_stop[i].sa_handler == SIG_IGN)
            sigaction(stop_signals[i], &dfl, NULL);
    }
    L->sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (L->sfd < 0)
        return dt_err_set(DT_ERR_SYSTEM, "launch: signalfd: %s", strerror(errno));
    return DT_OK;
}

/* Restore the caller's signal state (a signal still pending is read first,
 * so unblocking does not deliver it to us). */
static void restore_signals(launch_t *L)
{
    if (L->sfd >= 0) {
        struct signalfd_siginfo si;
        while (read(L->sfd, &si, sizeof si) == (ssize_t)sizeof si)
            ;
        close(L->sfd);
    }
    for (int i = 0; i < N_STOP; i++)
        sigaction(stop_signals[i], &L->old_stop[i], NULL);
    sigprocmask(SIG_SETMASK, &L->old_mask, NULL);
    sigaction(SIGPIPE, &L->old_pipe, NULL);
}

/* Fork rank r with its output on two pipes. */
static int start_rank(launch_t *L, int r)
{
    int po[2], pe[2];
    if (pipe2(po, O_CLOEXEC) != 0)
        return dt_err_set(DT_ERR_SYSTEM, "launch: pipe for rank %d: %s", r, strerror(errno));
    if (pipe2(pe, O_CLOEXEC) != 0) {
        int err = errno;
        close(po[0]);
        close(po[1]);
        return dt_err_set(DT_ERR_SYSTEM, "launch: pipe for rank %d: %s", r, strerror(err));
    }
    const dt_launch_opts_t *o = L->o;
    snprintf(L->vars[0], sizeof L->vars[0], "DTRAIN_RANK=%d", L->base + r);
    snprintf(L->vars[1], sizeof L->vars[1], "DTRAIN_WORLD_SIZE=%d",
             o->world_size > 0 ? o->world_size : L->n);
    snprintf(L->vars[2], sizeof L->vars[2], "DTRAIN_LOCAL_RANK=%d", r);
    snprintf(L->vars[3], sizeof L->vars[3], "DTRAIN_LOCAL_SIZE=%d", L->n);
    snprintf(L->vars[4], sizeof L->vars[4], "DTRAIN_JOB_ID=%s", L->job_id);
    snprintf(L->vars[5], sizeof L->vars[5], "DTRAIN_JOB_SECRET=%s", L->job_secret);
    if (o->master_addr) {
        snprintf(L->vars[6], sizeof L->vars[6], "MASTER_ADDR=%.256s", o->master_addr);
        snprintf(L->vars[7], sizeof L->vars[7], "MASTER_PORT=%d", o->master_port);
    }
    const pid_t me = getpid();
    pid_t pid = fork();
    if (pid == 0)
        child_exec(po[1], pe[1], L->exe, L->o->argv, L->envp, L->fallback, &L->old_mask, me);
    int err = errno;
    close(po[1]);
    close(pe[1]);
    if (pid < 0) {
        close(po[0]);
        close(pe[0]);
        return dt_err_set(DT_ERR_SYSTEM, "launch: fork of rank %d: %s", r, strerror(err));
    }
    L->ranks[r].pid = pid;
    L->ranks[r].alive = 1;
    L->n_alive++;
    stream_t *so = &L->streams[2 * r], *se = &L->streams[2 * r + 1];
    so->fd = po[0];
    so->rank = r;
    so->out_fd = 1;
    so->raw = r == L->o->raw_stdout_rank;
    se->fd = pe[0];
    se->rank = r;
    se->out_fd = 2;
    fcntl(po[0], F_SETFL, O_NONBLOCK);
    fcntl(pe[0], F_SETFL, O_NONBLOCK);
    return DT_OK;
}

/* One round of watching: wait (at most a second) for output, a signal or
 * a deadline, then relay, forward, reap, and kill what outlived its grace.
 * Returns 1 when every rank is gone and its output drained. */
static int watch_once(launch_t *L, double *drain_until, int *rc)
{
    int open_streams = 0;
    for (int i = 0; i < 2 * L->n; i++)
        open_streams += L->streams[i].fd >= 0;
    if (L->n_alive == 0 && open_streams == 0)
        return 1;
    double now = mono_s();
    if (L->n_alive == 0 && *drain_until == 0)
        *drain_until = now + DRAIN_S;
    if (L->n_alive == 0 && now >= *drain_until) {
        for (int i = 0; i < 2 * L->n; i++)
            if (L->streams[i].fd >= 0)
                close_stream(L, &L->streams[i]);
        return 1;
    }
    /* wake at least once a second: reaping does not rely on SIGCHLD */
    double until = now + 1.0;
    if (L->n_alive > 0 && L->kill_at > 0 && L->kill_at < until)
        until = L->kill_at;
    if (L->n_alive > 0 && L->term_at > 0 && L->term_at < until)
        until = L->term_at;
    if (L->n_alive == 0 && *drain_until < until)
        until = *drain_until;
    int timeout_ms = (int)((until - now) * 1000.0) + 1;
    int np = 0;
    if (L->sfd >= 0) {
        L->pf[np] = (struct pollfd){.fd = L->sfd, .events = POLLIN};
        L->which[np++] = -1;
    }
    for (int i = 0; i < 2 * L->n; i++)
        if (L->streams[i].fd >= 0) {
            L->pf[np] = (struct pollfd){.fd = L->streams[i].fd, .events = POLLIN};
            L->which[np++] = i;
        }
    int pr = poll(L->pf, (nfds_t)np, timeout_ms);
    if (pr < 0 && errno != EINTR) {
        /* nothing left to watch with: stop the ranks and just reap them */
        *rc = dt_err_set(DT_ERR_SYSTEM, "launch: poll: %s", strerror(errno));
        abort_launch(L);
        return -1;
    }
    for (int i = 0; pr > 0 && i < np; i++) {
        if (!L->pf[i].revents)
            continue;
        if (L->which[i] < 0) {
            struct signalfd_siginfo si;
            while (read(L->sfd, &si, sizeof si) == (ssize_t)sizeof si)
                if ((int)si.ssi_signo != SIGCHLD)
                    on_signal(L, (int)si.ssi_signo);
        } else {
            read_stream(L, &L->streams[L->which[i]]);
        }
    }
    reap(L);
    if (L->n_alive > 0)
        stop_after_failure(L);
    if (L->n_alive > 0 && L->kill_at > 0 && mono_s() >= L->kill_at) {
        for (int r = 0; r < L->n; r++)
            if (L->ranks[r].alive && kill(L->ranks[r].pid, SIGKILL) == 0)
                fprintf(stderr, "dtrain: rank %d did not stop within %g s of being asked "
                                "to; killed it\n", r, L->grace_s);
        L->kill_at = 0;
    }
    return 0;
}

/* Relay and watch until every rank is gone; without a poll set (poll
 * failed), only wait for the ranks. */
static int watch(launch_t *L)
{
    double drain_until = 0;
    int rc = DT_OK, done = 0;
    while (!done) {
        done = watch_once(L, &drain_until, &rc);
        if (done < 0) {
            int st;
            for (int r = 0; r < L->n; r++)
                if (L->ranks[r].alive && waitpid(L->ranks[r].pid, &st, 0) == L->ranks[r].pid) {
                    L->ranks[r].alive = 0;
                    L->ranks[r].status = st;
                    L->n_alive--;
                }
            for (int i = 0; i < 2 * L->n; i++)
                if (L->streams[i].fd >= 0)
                    close_stream(L, &L->streams[i]);
            done = 1;
        }
    }
    return rc;
}

/* Every rank has exited: the caller's hook removes what they left behind
 * (a crashed rank never ran its plugins' finalize).  Its failure is a
 * warning, not the job's outcome; the launcher's own error stays set. */
static void cleanup_job(launch_t *L, int rc)
{
    if (!L->o->cleanup)
        return;
    char err_copy[DT_ERR_MAX];
    snprintf(err_copy, sizeof err_copy, "%s", rc != DT_OK ? dt_last_error() : "");
    dt_err_clear();
    if (L->o->cleanup(L->o->cleanup_ctx, L->job_id) != DT_OK)
        fprintf(stderr, "dtrain: warning: cleaning up after job %s: %s\n", L->job_id,
                dt_last_error());
    if (rc != DT_OK)
        dt_err_set(rc, "%s", err_copy);
}

/* The last line: which rank failed and how, or the signal that stopped the
 * job; and the exit code that goes with it. */
static void summarize(const launch_t *L, int rc, dt_launch_result_t *res)
{
    char b[32];
    if (L->first_fail >= 0) {
        const rank_state_t *f = &L->ranks[L->first_fail];
        char how[64];
        if (WIFEXITED(f->status))
            snprintf(how, sizeof how, "exit %d", WEXITSTATUS(f->status));
        else
            snprintf(how, sizeof how, "killed by %s%s",
                     sig_name(WTERMSIG(f->status), b, sizeof b),
                     WCOREDUMP(f->status) ? ", core dumped" : "");
        char others[64] = "";
        if (L->n_stopped > 0)
            snprintf(others, sizeof others, "; stopped the other %d rank%s", L->n_stopped,
                     L->n_stopped == 1 ? "" : "s");
        /* its error line may have scrolled away under the others' reports;
         * a rank killed by a signal has one when its crash handler ran */
        if (f->last[0] && (WIFEXITED(f->status) ||
                           strncmp(f->last, DT_CRASH_PREFIX, strlen(DT_CRASH_PREFIX)) == 0))
            fprintf(stderr, "dtrain: rank %d failed (%s)%s; its last error line: %s\n",
                    L->base + L->first_fail, how, others, f->last);
        else
            fprintf(stderr, "dtrain: rank %d failed (%s)%s\n", L->base + L->first_fail, how,
                    others);
        res->failed_rank = L->base + L->first_fail;
        snprintf(res->how, sizeof res->how, "%s", how);
        if (f->last[0] && (WIFEXITED(f->status) ||
                           strncmp(f->last, DT_CRASH_PREFIX, strlen(DT_CRASH_PREFIX)) == 0))
            snprintf(res->last, sizeof res->last, "%s", f->last);
        res->exit_code = WIFEXITED(f->status) ? WEXITSTATUS(f->status) : 1;
    } else if (L->stop_sig) {
        fprintf(stderr, "dtrain: stopped by %s\n", sig_name(L->stop_sig, b, sizeof b));
        res->signal = L->stop_sig;
        res->exit_code = 128 + L->stop_sig;
    } else {
        res->exit_code = rc == DT_OK ? 0 : 1;
    }
}

int dt_launch_run(const dt_launch_opts_t *o, dt_launch_result_t *res)
{
    memset(res, 0, sizeof *res);
    res->failed_rank = -1;
    if (!o || !o->argv || !o->argv[0] || o->nproc < 1 || o->nproc > DT_LAUNCH_MAX ||
        o->rank_base < 0 || (o->world_size > 0 && o->rank_base + o->nproc > o->world_size))
        return dt_err_set(DT_ERR_INVALID, "launch: needs 1 to %d ranks (got %d) within the "
                          "world and a command line", DT_LAUNCH_MAX, o ? o->nproc : 0);
    launch_t *L = calloc(1, sizeof *L);
    if (!L)
        return dt_err_set(DT_ERR_NOMEM, "launch: out of memory");
    L->o = o;
    L->n = o->nproc;
    L->base = o->rank_base;
    L->grace_s = o->grace_s > 0 ? o->grace_s : DT_LAUNCH_GRACE_S;
    L->first_fail = -1;
    L->sfd = -1;
    make_job_id(L);
    snprintf(res->job_id, sizeof res->job_id, "%s", L->job_id);
    int rc = make_job_secret(L);
    if (rc == DT_OK)
        rc = prepare(L);
    if (rc != DT_OK)
        goto out;
    rc = take_signals(L);

    if (o->world_size > L->n && L->n == 1)
        fprintf(stderr, "dtrain: launching rank %d of %d (job %s)\n", L->base, o->world_size,
                L->job_id);
    else if (o->world_size > L->n)
        fprintf(stderr, "dtrain: launching ranks %d-%d of %d (job %s)\n", L->base,
                L->base + L->n - 1, o->world_size, L->job_id);
    else
        fprintf(stderr, "dtrain: launching %d ranks (job %s)\n", L->n, L->job_id);
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < L->n && rc == DT_OK; r++)
        rc = start_rank(L, r);
    if (rc != DT_OK)
        abort_launch(L); /* could not start them all */
    int wrc = watch(L);
    if (rc == DT_OK)
        rc = wrc;
    restore_signals(L);
    cleanup_job(L, rc);
    summarize(L, rc, res);
out:
    free(L->envp);
    free(L->ranks);
    free(L->streams);
    free(L->pf);
    free(L->which);
    free(L);
    return rc;
}
