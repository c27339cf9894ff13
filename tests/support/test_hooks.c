/*
 * tests/support/test_hooks.c - skip, rather than fail, the tests that need
 * a test hook the build compiled out (see test_hooks.h).
 */
#include "test_hooks.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

void dt_test_require_hooks(const char *what)
{
#ifdef DTRAIN_TEST_HOOKS
    (void)what;
#else
    print_message("skipped: needs the test hook %s, compiled out of this build "
                  "(DTRAIN_TEST_HOOKS=OFF, the Release default)\n", what);
    skip();
#endif
}

#ifndef DTRAIN_TEST_HOOKS
void dt_rdzv_test_resolve_fail(int gai_error, int times)
{
    (void)gai_error;
    if (times > 0)
        dt_test_require_hooks("dt_rdzv_test_resolve_fail");
}

void dt_fileutil_test_fail_after(int64_t bytes)
{
    if (bytes >= 0)
        dt_test_require_hooks("dt_fileutil_test_fail_after");
}

void dt_fileutil_test_fail_fsync_after(int64_t n_fsyncs)
{
    if (n_fsyncs >= 0)
        dt_test_require_hooks("dt_fileutil_test_fail_fsync_after");
}

void dt_abi_set_extra_major(int kind, uint32_t major)
{
    (void)kind;
    if (major != 0)
        dt_test_require_hooks("dt_abi_set_extra_major");
}
#endif
