/*
 * tests/support/mp_check.h - checks that work both in cmocka's process and
 * in ranks forked by mp_harness, and a runner for "every rank runs this
 * function against a fresh job id".
 *
 * A forked rank must never longjmp into cmocka (it would go on running the
 * suite in the child), so there a failed check prints, reports to the
 * parent through dt_mp_fail and exits 1; in the parent it fails the test.
 *
 *     static int rank_main(int rank, int nproc, const char *job, void *arg)
 *     {
 *         DT_MP_OK(comm_ops->init(...));       // a dt_status_t call
 *         DT_MP_CHECK(got == want);            // any condition
 *         return 0;
 *     }
 *     dt_mp_run_ranks(4, rank_main, &args, 60.0, "shardtest");
 */
#ifndef DT_MP_CHECK_H
#define DT_MP_CHECK_H

#include <stddef.h>

/* Report a failed check at file:line: `what` is the expression, `rc` the
 * status it returned (DT_OK for a false condition: the message buffer is
 * then not shown).  Exits a child, fails the test in the parent. */
void dt_mp_check_failed(const char *file, int line, const char *what, int rc);

#define DT_MP_OK(expr)                                                         \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != 0)                                                          \
            dt_mp_check_failed(__FILE__, __LINE__, #expr, rc_);                \
    } while (0)
#define DT_MP_CHECK(cond)                                                      \
    do {                                                                       \
        if (!(cond))                                                           \
            dt_mp_check_failed(__FILE__, __LINE__, #cond, 0);                  \
    } while (0)

/* `bytes` of zeroed memory shared with children forked later (results
 * come back through it).  Never freed (tests are short-lived); NULL on
 * failure. */
void *dt_mp_shared_alloc(size_t bytes);

/* Body of a rank: `job` is a job id unique to this run (for communicator
 * rendezvous).  Return 0 for success. */
typedef int (*dt_mp_rank_fn_t)(int rank, int nproc, const char *job, void *arg);

/* Fork `nproc` ranks running fn with a fresh job id "<tag><pid>-<n>",
 * at most deadline_s seconds, and fail the calling cmocka test (with every
 * unhappy rank's ending and messages) unless all exit 0. */
void dt_mp_run_ranks(int nproc, dt_mp_rank_fn_t fn, void *arg, double deadline_s,
                     const char *tag);

#endif /* DT_MP_CHECK_H */
