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

/* How the last line of a list that dropped lines starts. */
#define MORE_LINE "... and "

void dt_errlist_add(dt_errlist_t *l, const char *msg)
{
    char copy[DT_ERR_MAX];
    snprintf(copy, sizeof copy, "%s", msg ? msg : err_buf); /* msg may be err_buf */
    for (char *line = copy, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        size_t n = strlen(line);
        if (n == 0)
            continue;
        int more = 0;
        if (sscanf(line, MORE_LINE "%d more error", &more) == 1 && more > 0) {
            l->dropped += more; /* a list added to a list: its count carries over */
            continue;
        }
        int seen = 0;
        for (const char *p = l->text; !seen && p < l->text + l->len;) {
            const char *e = memchr(p, '\n', (size_t)(l->text + l->len - p));
            size_t pn = e ? (size_t)(e - p) : (size_t)(l->text + l->len - p);
            seen = pn == n && memcmp(p, line, n) == 0;
            p += pn + 1;
        }
        if (seen)
            continue;
        if (l->n == 0 && n + 1 > sizeof l->text)
            n = sizeof l->text - 1; /* a first line too long for the list: cut */
        if (l->n >= DT_ERRLIST_MAX || l->len + n + 2 > sizeof l->text) {
            l->dropped++;
            continue;
        }
        if (l->len)
            l->text[l->len++] = '\n';
        memcpy(l->text + l->len, line, n);
        l->len += n;
        l->text[l->len] = '\0';
        l->n++;
    }
}

int dt_errlist_fail(const dt_errlist_t *l, int status)
{
    if (l->n == 0 && l->dropped == 0)
        return DT_OK;
    if (l->dropped == 0)
        return dt_err_set(status, "%s", l->text);
    return dt_err_set(status, "%s\n" MORE_LINE "%d more error%s (the first %d are shown)",
                      l->text, l->dropped, l->dropped == 1 ? "" : "s", l->n);
}
