/*
 * tests/support/test_assert.c - file-system assertions shared by tests,
 * stderr capture (to assert log lines) and a deadline for tests that could
 * hang.
 */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static int saved_stderr = -1;
static char capture_path[64];

void dt_test_stderr_begin(void)
{
    assert_int_equal(saved_stderr, -1);
    snprintf(capture_path, sizeof capture_path, "/tmp/dt_test_stderr.XXXXXX");
    int fd = mkstemp(capture_path);
    assert_true(fd >= 0);
    fflush(stderr);
    saved_stderr = dup(2);
    assert_true(saved_stderr >= 0);
    assert_int_equal(dup2(fd, 2), 2);
    close(fd);
}

char *dt_test_stderr_end(void)
{
    assert_true(saved_stderr >= 0);
    fflush(stderr);
    assert_int_equal(dup2(saved_stderr, 2), 2);
    close(saved_stderr);
    saved_stderr = -1;
    FILE *f = fopen(capture_path, "rb");
    assert_non_null(f);
    char *buf = calloc(1, 65537);
    assert_non_null(buf);
    size_t n = fread(buf, 1, 65536, f);
    buf[n] = '\0';
    fclose(f);
    unlink(capture_path);
    return buf;
}

static char deadline_msg[256];

static void deadline_hit(int sig)
{
    (void)sig;
    /* async-signal-safe: write and _exit only */
    ssize_t w = write(2, deadline_msg, strlen(deadline_msg));
    (void)w;
    _exit(1);
}

void dt_test_deadline(unsigned seconds, const char *what)
{
    if (seconds == 0) {
        alarm(0);
        signal(SIGALRM, SIG_DFL);
        return;
    }
    snprintf(deadline_msg, sizeof deadline_msg, "test deadline of %u s passed: "
             "%s\n", seconds, what);
    signal(SIGALRM, deadline_hit);
    alarm(seconds);
}
