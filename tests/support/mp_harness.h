/*
 * tests/support/mp_harness.h - run a function in N forked child processes
 * (one per rank), collect how each ended and what it said, and never hang:
 * an overall deadline kills stragglers with SIGKILL.
 *
 * Typical use from a cmocka test (the parent only forks, waits and
 * asserts; each child drives the plugin):
 *
 *     static int child(int rank, int nproc, void *arg)
 *     {
 *         if (got != want)
 *             return dt_mp_fail("rank %d: got %d, want %d", rank, got, want);
 *         return 0;
 *     }
 *     dt_mp_result_t res;
 *     dt_mp_run(4, child, &args, 30.0, &res);
 *     char why[4096];
 *     assert_true(dt_mp_all_ok(&res, why, sizeof why) || (fail_msg("%s", why), 0));
 *
 * A child ends with _exit(fn's return value), so the parent's atexit
 * handlers and buffered output are not run twice.  Crash signals are reset
 * to their defaults in the child (so a crash is reported as a signal, not
 * caught by the parent's test framework), and a child dies with its parent.
 */
#ifndef DT_MP_HARNESS_H
#define DT_MP_HARNESS_H

#include <stddef.h>
#include <sys/types.h>

#define DT_MP_MAX 64       /* most children per run */
#define DT_MP_MSG_MAX 2048 /* bytes a child may report */

typedef struct dt_mp_child {
    pid_t pid;
    int exited;        /* 1: ended by exit/return, see exit_code */
    int exit_code;
    int signaled;      /* 1: ended by a signal, see term_signal */
    int term_signal;
    int killed;        /* 1: the harness killed it at the deadline */
    double elapsed_s;  /* from fork to reaping */
    char msg[DT_MP_MSG_MAX]; /* what it reported with dt_mp_fail/dt_mp_note */
} dt_mp_child_t;

typedef struct dt_mp_result {
    int n;
    int timed_out;     /* 1: the deadline expired and stragglers were killed */
    double elapsed_s;
    dt_mp_child_t child[DT_MP_MAX];
} dt_mp_result_t;

/* Body of a child: `rank` in [0, nproc); return 0 for success. */
typedef int (*dt_mp_fn_t)(int rank, int nproc, void *arg);

/* Fork `nproc` children running fn and wait for all of them, at most
 * `deadline_s` seconds in total; stragglers are killed (SIGKILL) and
 * reaped.  Returns 0, or -1 when forking failed (children already started
 * are killed and reaped; `res` says what happened). */
int dt_mp_run(int nproc, dt_mp_fn_t fn, void *arg, double deadline_s,
              dt_mp_result_t *res);

/* In a child: append a formatted message for the parent (also printed to
 * stderr with the rank).  Returns 1 so a child can `return dt_mp_fail(...)`. */
int dt_mp_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* In a child: append a message without meaning failure. */
void dt_mp_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* In a child: its rank (-1 in the parent). */
int dt_mp_rank(void);

/* Opt in (before dt_mp_run): in builds with AddressSanitizer, a child
 * whose function returned 0 also runs LeakSanitizer before _exit and fails
 * (exit 1, message) when memory leaked.  Off by default. */
void dt_mp_set_leak_check(int on);

/* In the parent: 1 when every child exited with code 0.  Otherwise 0 and
 * `buf` says, per unhappy child, how it ended and what it reported:
 * "rank 2: exit 1: <msg>; rank 3: killed by signal 9 (deadline)". */
int dt_mp_all_ok(const dt_mp_result_t *res, char *buf, size_t cap);
/* One child's ending in words ("exit 0", "signal 9", "signal 9 (deadline)"). */
const char *dt_mp_how(const dt_mp_child_t *ch, char *buf, size_t cap);

#endif /* DT_MP_HARNESS_H */
