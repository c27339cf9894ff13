/*
 * tests/support/mp_harness.c - fork-based multi-process test runner (see
 * mp_harness.h).  Each child writes its messages into a pipe that the
 * parent drains while it waits, so a chatty child never blocks.
 */
#include "mp_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define DT_MP_HAVE_LSAN 1
#endif

static int g_rank = -1;   /* in a child: its rank */
static int g_msg_fd = -1; /* in a child: write end of its pipe */
static size_t g_msg_len;  /* bytes written so far */
static int g_leak_check;  /* dt_mp_set_leak_check */

void dt_mp_set_leak_check(int on) { g_leak_check = on; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int dt_mp_rank(void) { return g_rank; }

static void vnote(const char *fmt, va_list ap)
{
    char buf[DT_MP_MSG_MAX];
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof buf)
        n = (int)sizeof buf - 1;
    fprintf(stderr, "[rank %d] %s\n", g_rank, buf);
    if (g_msg_fd < 0 || g_msg_len >= DT_MP_MSG_MAX - 2)
        return;
    size_t room = DT_MP_MSG_MAX - 2 - g_msg_len;
    size_t len = (size_t)n < room ? (size_t)n : room;
    char sep = g_msg_len ? '\n' : 0;
    if (sep && write(g_msg_fd, &sep, 1) == 1)
        g_msg_len++;
    ssize_t w = write(g_msg_fd, buf, len);
    if (w > 0)
        g_msg_len += (size_t)w;
}

int dt_mp_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vnote(fmt, ap);
    va_end(ap);
    return 1;
}

void dt_mp_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vnote(fmt, ap);
    va_end(ap);
}

static void drain(int fd, dt_mp_child_t *ch, size_t *len)
{
    for (;;) {
        if (*len >= sizeof ch->msg - 1) {
            char junk[256];
            if (read(fd, junk, sizeof junk) <= 0)
                return;
            continue;
        }
        ssize_t n = read(fd, ch->msg + *len, sizeof ch->msg - 1 - *len);
        if (n <= 0)
            return;
        *len += (size_t)n;
        ch->msg[*len] = '\0';
    }
}

static void record(dt_mp_child_t *ch, int status, double t0)
{
    ch->elapsed_s = now_s() - t0;
    if (WIFEXITED(status)) {
        ch->exited = 1;
        ch->exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
        ch->signaled = 1;
        ch->term_signal = WTERMSIG(status);
    }
}

static void child_main(int rank, int nproc, dt_mp_fn_t fn, void *arg, int fd)
{
    g_rank = rank;
    g_msg_fd = fd;
    g_msg_len = 0;
    /* Die with the parent; crash like a normal process. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int crash[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGALRM};
    for (size_t i = 0; i < sizeof crash / sizeof crash[0]; i++)
        signal(crash[i], SIG_DFL);
    int rc = fn(rank, nproc, arg);
#ifdef DT_MP_HAVE_LSAN
    /* _exit skips LeakSanitizer's exit hook: run it here when asked */
    if (rc == 0 && g_leak_check && __lsan_do_recoverable_leak_check())
        rc = dt_mp_fail("LeakSanitizer: memory leaked in this rank (report above)");
#endif
    fflush(stdout);
    fflush(stderr);
    _exit(rc & 0xff);
}

int dt_mp_run(int nproc, dt_mp_fn_t fn, void *arg, double deadline_s, dt_mp_result_t *res)
{
    memset(res, 0, sizeof *res);
    if (nproc < 1 || nproc > DT_MP_MAX)
        return -1;
    res->n = nproc;
    int fds[DT_MP_MAX];
    size_t lens[DT_MP_MAX] = {0};
    int alive = 0, rc = 0;
    const double t0 = now_s();
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < nproc; r++) {
        int p[2];
        if (pipe(p) != 0) {
            rc = -1;
            break;
        }
        pid_t pid = fork();
        if (pid < 0) {
            close(p[0]);
            close(p[1]);
            rc = -1;
            break;
        }
        if (pid == 0) {
            close(p[0]);
            for (int q = 0; q < r; q++)
                close(fds[q]);
            child_main(r, nproc, fn, arg, p[1]);
        }
        close(p[1]);
        fcntl(p[0], F_SETFL, O_NONBLOCK);
        fds[r] = p[0];
        res->child[r].pid = pid;
        alive++;
    }
    int started = alive;
    if (rc != 0)
        for (int r = 0; r < started; r++)
            kill(res->child[r].pid, SIGKILL);

    int done[DT_MP_MAX] = {0};
    while (alive > 0) {
        int progressed = 0;
        for (int r = 0; r < started; r++) {
            if (done[r])
                continue;
            drain(fds[r], &res->child[r], &lens[r]);
            int status;
            pid_t w = waitpid(res->child[r].pid, &status, WNOHANG);
            if (w == res->child[r].pid) {
                record(&res->child[r], status, t0);
                drain(fds[r], &res->child[r], &lens[r]);
                done[r] = 1;
                alive--;
                progressed = 1;
            }
        }
        if (alive == 0)
            break;
        if (now_s() - t0 > deadline_s) {
            res->timed_out = 1;
            for (int r = 0; r < started; r++) {
                if (done[r])
                    continue;
                kill(res->child[r].pid, SIGKILL);
                res->child[r].killed = 1;
                int status;
                while (waitpid(res->child[r].pid, &status, 0) < 0 && errno == EINTR)
                    ;
                record(&res->child[r], status, t0);
                drain(fds[r], &res->child[r], &lens[r]);
                done[r] = 1;
                alive--;
            }
            break;
        }
        if (!progressed) {
            struct timespec ts = {0, 1000000}; /* 1 ms */
            nanosleep(&ts, NULL);
        }
    }
    for (int r = 0; r < started; r++)
        close(fds[r]);
    res->elapsed_s = now_s() - t0;
    return rc;
}

const char *dt_mp_how(const dt_mp_child_t *ch, char *buf, size_t cap)
{
    if (ch->exited)
        snprintf(buf, cap, "exit %d", ch->exit_code);
    else if (ch->signaled)
        snprintf(buf, cap, "signal %d%s", ch->term_signal, ch->killed ? " (deadline)" : "");
    else
        snprintf(buf, cap, "not started");
    return buf;
}

int dt_mp_all_ok(const dt_mp_result_t *res, char *buf, size_t cap)
{
    int ok = 1;
    size_t len = 0;
    if (cap)
        buf[0] = '\0';
    for (int r = 0; r < res->n; r++) {
        const dt_mp_child_t *ch = &res->child[r];
        if (ch->exited && ch->exit_code == 0)
            continue;
        ok = 0;
        char how[64];
        if (len < cap)
            len += (size_t)snprintf(buf + len, cap - len, "%srank %d: %s: %s",
                                    len ? "; " : "", r, dt_mp_how(ch, how, sizeof how),
                                    ch->msg[0] ? ch->msg : "(no message)");
    }
    if (res->timed_out && len < cap)
        snprintf(buf + len, cap - len, "%s(deadline expired after %.1f s)", len ? "; " : "",
                 res->elapsed_s);
    return ok;
}
