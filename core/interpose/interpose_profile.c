/*
 * core/interpose/interpose_profile.c - the profiler hooks (interpose.h):
 * calls, bytes and time per operation, for any kind's interposer.
 *
 * Rows are keyed by the operation's name (call->op), so a wait's time
 * lands on the collective it completes.  The table is small and fixed:
 * a kind has a few dozen slots at most; calls past DT_PROFILE_ROWS
 * distinct operations are counted in one "(other)" row.
 */
#include "interpose/interpose.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#define DT_PROFILE_ROWS 64

typedef struct profile_row {
    const char *op;
    uint64_t calls, waits, errors, bytes, ns;
} profile_row_t;

struct dt_interpose_profile {
    pthread_mutex_t lock;
    uint32_t n;
    profile_row_t rows[DT_PROFILE_ROWS + 1]; /* the last: "(other)" */
};

dt_interpose_profile_t *dt_interpose_profile_create(void)
{
    dt_interpose_profile_t *p = calloc(1, sizeof *p);
    if (!p) {
        dt_err_set(DT_ERR_NOMEM, "profiler: out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    p->rows[DT_PROFILE_ROWS].op = "(other)";
    return p;
}

static profile_row_t *row_of(dt_interpose_profile_t *p, const char *op)
{
    for (uint32_t i = 0; i < p->n; i++)
        if (strcmp(p->rows[i].op, op) == 0)
            return &p->rows[i];
    if (p->n == DT_PROFILE_ROWS)
        return &p->rows[DT_PROFILE_ROWS];
    p->rows[p->n].op = op; /* slot names: static strings */
    return &p->rows[p->n++];
}

static void profile_after(void *ctx, const dt_interpose_call_t *call, int status,
                          uint64_t elapsed_ns)
{
    dt_interpose_profile_t *p = ctx;
    pthread_mutex_lock(&p->lock);
    profile_row_t *r = row_of(p, call->op);
    if (strcmp(call->op, call->name) == 0)
        r->calls++;
    else
        r->waits++;
    r->bytes += call->bytes;
    r->ns += elapsed_ns;
    if (status != DT_OK)
        r->errors++;
    pthread_mutex_unlock(&p->lock);
}

dt_interpose_hooks_t dt_interpose_profile_hooks(dt_interpose_profile_t *p)
{
    return (dt_interpose_hooks_t){.ctx = p, .after = profile_after};
}

void dt_interpose_profile_print(dt_interpose_profile_t *p, FILE *f, const char *title)
{
    pthread_mutex_lock(&p->lock);
    fprintf(f, "%s\n  %-16s %10s %14s %12s %8s %8s\n", title, "op", "calls", "bytes", "time ms",
            "waits", "errors");
    for (uint32_t i = 0; i <= DT_PROFILE_ROWS; i++) {
        const profile_row_t *r = &p->rows[i];
        if (i >= p->n && (i < DT_PROFILE_ROWS || (!r->calls && !r->waits)))
            continue;
        fprintf(f, "  %-16s %10llu %14llu %12.3f %8llu %8llu\n", r->op,
                (unsigned long long)r->calls, (unsigned long long)r->bytes, (double)r->ns / 1e6,
                (unsigned long long)r->waits, (unsigned long long)r->errors);
    }
    pthread_mutex_unlock(&p->lock);
}

void dt_interpose_profile_free(dt_interpose_profile_t *p)
{
    if (!p)
        return;
    pthread_mutex_destroy(&p->lock);
    free(p);
}
