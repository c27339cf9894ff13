/*
 * core/util/error.c - thread-local error message with context prefixes.
 */
#include "util/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char err_buf[DT_ERR_MAX];

int dt_err_set(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    return status;
}

int dt_err_context(int status, const char *fmt, ...)
{
    char ctx[DT_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    const char *tail = err_buf[0] ? err_buf : dt_status_name(status);
    size_t nc = strlen(ctx), nt = strlen(tail);
    /* "<ctx>: <tail>", cut at the buffer's end; tail may be err_buf itself */
    if (nc > DT_ERR_MAX - 3)
        nc = DT_ERR_MAX - 3;
    if (nt > DT_ERR_MAX - 3 - nc)
        nt = DT_ERR_MAX - 3 - nc;
    memmove(err_buf + nc + 2, tail, nt);
    memcpy(err_buf, ctx, nc);
    err_buf[nc] = ':';
    err_buf[nc + 1] = ' ';
    err_buf[nc + 2 + nt] = '\0';
    return status;
}

const char *dt_last_error(void) { return err_buf; }

void dt_err_clear(void) { err_buf[0] = '\0'; }
