/*
 * tests/support/mp_check.c - checks usable in forked ranks and the
 * cmocka-side runner of forked ranks (see mp_check.h).
 */
#include "mp_check.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "dtrain/status.h"
#include "mp_harness.h"
#include "util/error.h"

void dt_mp_check_failed(const char *file, int line, const char *what, int rc)
{
    /* a failed condition has no status: the error buffer would be stale */
    const char *msg = rc != DT_OK ? dt_last_error() : "";
    const char *st = rc != DT_OK ? dt_status_name(rc) : "false";
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    if (dt_mp_rank() >= 0) {
        dt_mp_fail("%s:%d: %s failed (%s) %s", base, line, what, st, msg);
        _exit(1);
    }
    print_error("%s:%d: %s failed (%s) %s\n", base, line, what, st, msg);
    _fail(file, line);
}

void *dt_mp_shared_alloc(size_t bytes)
{
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

typedef struct {
    dt_mp_rank_fn_t fn;
    void *arg;
    const char *job;
} rank_arg_t;

static int rank_entry(int rank, int nproc, void *arg)
{
    const rank_arg_t *a = arg;
    return a->fn(rank, nproc, a->job, a->arg);
}

void dt_mp_run_ranks(int nproc, dt_mp_rank_fn_t fn, void *arg, double deadline_s,
                     const char *tag)
{
    static int seq;
    static dt_mp_result_t res; /* large: not on the stack */
    char job[64], why[4096];
    snprintf(job, sizeof job, "%s%d-%d", tag, (int)getpid(), ++seq);
    rank_arg_t a = {.fn = fn, .arg = arg, .job = job};
    if (dt_mp_run(nproc, rank_entry, &a, deadline_s, &res) != 0)
        fail_msg("%d ranks (%s): fork failed", nproc, job);
    if (!dt_mp_all_ok(&res, why, sizeof why))
        fail_msg("%d ranks (%s): %s", nproc, job, why);
}
