/*
 * tests/support/test_assert.h - assertions on dtrain status codes and on the
 * core's error message, printing both sides on failure.  Include after
 * <cmocka.h>.
 */
#ifndef DT_TEST_ASSERT_H
#define DT_TEST_ASSERT_H

#include <string.h>

#include "dtrain/status.h"
#include "util/error.h"

#define assert_status(expr, want)                                              \
    do {                                                                       \
        int rc_ = (expr);                                                      \
        if (rc_ != (want))                                                     \
            fail_msg("%s returned %s, expected %s (message: %s)", #expr,       \
                     dt_status_name(rc_), dt_status_name(want),                \
                     dt_last_error());                                         \
    } while (0)
#define assert_ok(expr) assert_status((expr), DT_OK)
/* The whole message equals `expected`. */
#define assert_msg(expected)                                                   \
    do {                                                                       \
        if (strcmp(dt_last_error(), (expected)) != 0)                          \
            fail_msg("message\n  got:      %s\n  expected: %s",                \
                     dt_last_error(), (expected));                             \
    } while (0)
/* The message contains `part`. */
#define assert_msg_has(part)                                                   \
    do {                                                                       \
        if (!strstr(dt_last_error(), (part)))                                  \
            fail_msg("message\n  got:      %s\n  lacks:    %s",                \
                     dt_last_error(), (part));                                 \
    } while (0)
/* The message starts with `prefix`. */
#define assert_msg_starts(prefix)                                              \
    do {                                                                       \
        if (strncmp(dt_last_error(), (prefix), strlen(prefix)) != 0)           \
            fail_msg("message\n  got:      %s\n  expected: %s...",             \
                     dt_last_error(), (prefix));                               \
    } while (0)

/* Fail if any entry of `dir` has ".tmp" in its name: an atomic write left
 * its temporary file ("x.tmp.<pid>") or directory ("step-N.tmp") behind. */
void dt_test_assert_no_tmp(const char *dir);

/* Capture what the process writes to stderr (the core's log lines) from
 * begin to end; end restores stderr and returns the text (malloc'd, NUL
 * terminated; the caller frees it). */
void dt_test_stderr_begin(void);
char *dt_test_stderr_end(void);

/* Bound a test that could hang: after `seconds` the process prints
 * "test deadline of N s passed: <what>" and exits 1 (a failure, not a
 * hang until ctest's timeout).  seconds 0 disarms. */
void dt_test_deadline(unsigned seconds, const char *what);

#endif /* DT_TEST_ASSERT_H */
