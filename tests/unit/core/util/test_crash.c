/*
 * tests/unit/core/util/test_crash.c - core/util/crash.c: a child process installs
 * the handler, sets the record, and really faults (a store to an unmapped
 * address, a read past the end of a mapped file, a signal sent to itself);
 * the parent checks that it died of that signal and what it printed: the
 * backtrace header and frames, then the summary line naming the signal,
 * its code and address, the plugin call in progress (nested, returned or
 * none), the phase, step, micro-batch and unit.  Plugin attribution by
 * address range is tested with a real plugin in
 * tests/integration/test_watch.sh.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/crash.h"
#include "test_assert.h"

enum { FAULT_SEGV, FAULT_BUS, FAULT_RAISE_FPE };

/* An address the compiler cannot see is bad (so it emits the store). */
static int *volatile g_bad = (int *)0x10;

static void fault(int how)
{
    if (how == FAULT_SEGV) {
        *g_bad = 1;
    } else if (how == FAULT_BUS) {
        /* a page mapped beyond the end of an empty file */
        FILE *f = tmpfile();
        void *p = f ? mmap(NULL, 4096, PROT_READ, MAP_SHARED, fileno(f), 0) : MAP_FAILED;
        if (p != MAP_FAILED)
            (void)*(volatile char *)p;
    } else {
        raise(SIGFPE);
    }
    _exit(99); /* the fault did not happen */
}

/* Fork; in the child install the handler as rank 3, run `setup`, fault
 * `how`.  The child's stderr into out[cap]; its wait status returned. */
static int crash_child(void (*setup)(void), int how, char *out, size_t cap)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        dup2(p[1], 2);
        close(p[0]);
        if (dt_crash_install(3) != DT_OK)
            _exit(98);
        if (setup)
            setup();
        fault(how);
    }
    close(p[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap) {
        r = read(p[0], out + n, cap - 1 - n);
        if (r > 0)
            n += (size_t)r;
        else if (!(r < 0 && errno == EINTR))
            break;
    }
    out[n] = '\0';
    close(p[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return st;
}

/* The last line of `out`, without its "; pid N" and newline. */
static const char *summary(char *out)
{
    size_t n = strlen(out);
    while (n > 0 && out[n - 1] == '\n')
        out[--n] = '\0';
    char *last = strrchr(out, '\n');
    last = last ? last + 1 : out;
    char *pid = strstr(last, "; pid ");
    assert_non_null(pid);
    assert_true(atoi(pid + 6) > 0);
    *pid = '\0';
    return last;
}

static void assert_backtrace(const char *out)
{
    const char *head = "[rank 3] crash: backtrace (innermost first):\n[rank 3]   #0 ";
    if (strncmp(out, head, strlen(head)) != 0)
        fail_msg("no backtrace header and first frame:\n%s", out);
    if (!strstr(out, "[rank 3]   #2 "))
        fail_msg("fewer than 3 frames:\n%s", out);
}

static void no_setup(void) {}

static void test_segv_before_any_call(void **state)
{
    (void)state;
    char out[16384];
    int st = crash_child(no_setup, FAULT_SEGV, out, sizeof out);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGSEGV);
    assert_backtrace(out);
    assert_string_equal(summary(out), "[rank 3] crash: SIGSEGV (address not mapped: 0x10) "
                                      "in the core, before any plugin call");
}

static void nested_in_step(void)
{
    dt_crash_set_phase("training", 7);
    dt_crash_set_micro(2);
    dt_crash_set_unit(3, "block.2");
    dt_crash_enter("strategy", "zero", "post_backward");
    dt_crash_enter("comm", "shm", "reduce_scatter");
}

/* The innermost call is named, the one it runs inside after it. */
static void test_segv_in_nested_call(void **state)
{
    (void)state;
    char out[16384];
    int st = crash_child(nested_in_step, FAULT_SEGV, out, sizeof out);
    assert_int_equal(WTERMSIG(st), SIGSEGV);
    assert_string_equal(summary(out),
                        "[rank 3] crash: SIGSEGV (address not mapped: 0x10) in comm/shm "
                        "reduce_scatter (inside strategy/zero post_backward), at step 7, "
                        "micro-batch 2, unit 3 (block.2), training");
}

static void returned_then_new_phase(void)
{
    dt_crash_set_phase("training", 4);
    dt_crash_set_micro(1);
    dt_crash_set_unit(0, "embedding");
    dt_crash_enter("strategy", "ddp", "pre_forward");
    dt_crash_leave();
    /* a new phase forgets the micro-batch and unit */
    dt_crash_set_phase("evaluation", 5);
}

static void test_bus_after_call_returned(void **state)
{
    (void)state;
    char out[16384];
    int st = crash_child(returned_then_new_phase, FAULT_BUS, out, sizeof out);
    assert_int_equal(WTERMSIG(st), SIGBUS);
    const char *s = summary(out);
    const char *want1 = "[rank 3] crash: SIGBUS (nonexistent address, e.g. past the end of a "
                        "mapped file: 0x";
    const char *want2 = ") in the core, between plugin calls (the last, strategy/ddp "
                        "pre_forward, had returned), at step 5, evaluation";
    if (strncmp(s, want1, strlen(want1)) != 0 || !strstr(s, want2))
        fail_msg("summary\n  got:  %s\n  want: %s<address>%s", s, want1, want2);
}

static void in_optimizer_step(void)
{
    dt_crash_set_phase("optimizer step", 2);
    dt_crash_enter("strategy", "fsdp", "step");
}

/* A signal another process (or raise) sent has no fault address. */
static void test_fpe_sent(void **state)
{
    (void)state;
    char out[16384];
    int st = crash_child(in_optimizer_step, FAULT_RAISE_FPE, out, sizeof out);
    assert_int_equal(WTERMSIG(st), SIGFPE);
    assert_backtrace(out);
    assert_string_equal(summary(out), "[rank 3] crash: SIGFPE (sent by a process) in "
                                      "strategy/fsdp step, at step 2, optimizer step");
}

static void loading_a_unit(void)
{
    dt_crash_set_phase("checkpoint load", 0);
    dt_crash_set_unit(1, "block.0");
    dt_crash_enter("strategy", "zero", "set_state");
}

/* Before any step (loading a checkpoint) the unit is still named. */
static void test_segv_loading_a_unit(void **state)
{
    (void)state;
    char out[16384];
    int st = crash_child(loading_a_unit, FAULT_SEGV, out, sizeof out);
    assert_int_equal(WTERMSIG(st), SIGSEGV);
    assert_string_equal(summary(out), "[rank 3] crash: SIGSEGV (address not mapped: 0x10) in "
                                      "strategy/zero set_state, at unit 1 (block.0), "
                                      "checkpoint load");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segv_before_any_call),
        cmocka_unit_test(test_segv_in_nested_call),
        cmocka_unit_test(test_bus_after_call_returned),
        cmocka_unit_test(test_fpe_sent),
        cmocka_unit_test(test_segv_loading_a_unit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
