/*
 * tests/support/test_hooks.h - the production code's test hooks as the
 * unit tests call them, whether or not the build has them.
 *
 * With DTRAIN_TEST_HOOKS (the default for builds that run the tests) these
 * are the real hooks (util/fileutil.h, loader/abi_tables.h).  Without
 * (a Release build), the same names are stand-ins here: arming one skips
 * the calling cmocka test with a message saying the hook is compiled
 * out; disarming (a negative budget, major 0) does nothing, so setups and
 * teardowns need no #ifdef.
 */
#ifndef DT_TEST_HOOKS_H
#define DT_TEST_HOOKS_H

#include <stdint.h>

#ifdef DTRAIN_TEST_HOOKS
#include "launch/rendezvous.h"
#include "loader/abi_tables.h"
#include "util/fileutil.h"
#else
void dt_rdzv_test_resolve_fail(int gai_error, int times);
void dt_fileutil_test_fail_after(int64_t bytes);
void dt_fileutil_test_fail_fsync_after(int64_t n_fsyncs);
void dt_abi_set_extra_major(int kind, uint32_t major);
#endif

/* Skip the calling cmocka test when the build has no test hooks, naming
 * `what` the test needed (e.g. "DTRAIN_FAULT_WRITE_AFTER_BYTES"). */
void dt_test_require_hooks(const char *what);

#endif /* DT_TEST_HOOKS_H */
