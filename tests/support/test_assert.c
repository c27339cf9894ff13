/*
 * tests/support/test_assert.c - file-system assertions shared by tests.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "test_assert.h"

void dt_test_assert_no_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".tmp"))
            fail_msg("temp file left behind in %s: %s", dir, de->d_name);
    closedir(d);
}
