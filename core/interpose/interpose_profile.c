/*
 * core/interpose/interpose_profile.c - the profiler hooks (interpose.h):
 * calls, bytes, FLOPs and time per operation, for any kind's interposer,
 * over the whole run or over whole passes.
 *
 * Rows are keyed by the operation's name (call->op), so a wait's time
 * lands on the collective it completes.  The table is small and fixed:
 * a kind has a few dozen slots at most; calls past DT_PROFILE_ROWS
 * distinct operations are counted in one "(other)" row.
 *
 * Passes (dt_interpose_profile_passes) are counted in `after` of the
 * marking operation, as beginning when that call began (now minus its
 * time), before the call itself is added: it is the first call of its
 * pass.  At each pass's start the rows are copied, so the report can end
 * at the start of the latest pass, leaving out the last, partial one.
 */
#include "interpose/interpose.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#define DT_PROFILE_ROWS 64

typedef struct profile_row {
    const char *op;
    uint64_t calls, waits, errors, bytes, flops, ns;
} profile_row_t;

/* The rows at one moment. */
typedef struct profile_rows {
    uint32_t n;
    profile_row_t rows[DT_PROFILE_ROWS + 1]; /* the last: "(other)" */
} profile_rows_t;

struct dt_interpose_profile {
    pthread_mutex_t lock;
    profile_rows_t live;     /* recorded so far */
    /* passes (dt_interpose_profile_passes); pass_op NULL: none, all counts */
    const char *pass_op;
    uint64_t skip;
    uint64_t passes;         /* pass_op calls so far */
    int active;              /* recording (pass skip + 1 has begun) */
    uint64_t t_start;        /* when pass skip + 1 began */
    profile_rows_t at_pass;  /* `live` when the latest later pass began */
    uint64_t t_pass;         /* when it began */
    uint64_t whole;          /* whole passes from t_start to t_pass */
};

dt_interpose_profile_t *dt_interpose_profile_create(void)
{
    dt_interpose_profile_t *p = calloc(1, sizeof *p);
    if (!p) {
        dt_err_set(DT_ERR_NOMEM, "profiler: out of memory");
        return NULL;
    }
    pthread_mutex_init(&p->lock, NULL);
    p->live.rows[DT_PROFILE_ROWS].op = "(other)";
    p->active = 1;
    return p;
}

void dt_interpose_profile_passes(dt_interpose_profile_t *p, const char *op, uint64_t skip)
{
    pthread_mutex_lock(&p->lock);
    p->pass_op = op;
    p->skip = skip;
    p->active = 0;
    pthread_mutex_unlock(&p->lock);
}

static profile_row_t *row_of(profile_rows_t *r, const char *op)
{
    for (uint32_t i = 0; i < r->n; i++) /* names are static: pointers first */
        if (r->rows[i].op == op || strcmp(r->rows[i].op, op) == 0)
            return &r->rows[i];
    if (r->n == DT_PROFILE_ROWS)
        return &r->rows[DT_PROFILE_ROWS];
    r->rows[r->n].op = op; /* slot names: static strings */
    return &r->rows[r->n++];
}

/* A pass begins at `t`: recording starts at pass skip + 1; every later
 * one closes the whole passes so far. */
static void pass_begins(dt_interpose_profile_t *p, uint64_t t)
{
    uint64_t n = ++p->passes;
    if (n <= p->skip)
        return;
    if (n == p->skip + 1) {
        p->active = 1;
        p->t_start = t;
        return;
    }
    p->at_pass = p->live;
    p->t_pass = t;
    p->whole = n - 1 - p->skip;
}

/* Whether `op` begins a pass: pass_op or, when pass_op lists
 * alternatives ("a|b": the first operation of a model's forward, which
 * differs by model), one of them; the first alternative seen becomes
 * pass_op (a run calls one of them, and the report names it). */
static int pass_marks(dt_interpose_profile_t *p, const char *op)
{
    if (op == p->pass_op || strcmp(op, p->pass_op) == 0)
        return 1;
    if (!strchr(p->pass_op, '|'))
        return 0;
    const size_t n = strlen(op);
    for (const char *a = p->pass_op; *a;) {
        const char *bar = strchr(a, '|');
        const size_t len = bar ? (size_t)(bar - a) : strlen(a);
        if (len == n && strncmp(a, op, n) == 0) {
            p->pass_op = op; /* static: an operation's name */
            return 1;
        }
        a += len + (bar != NULL);
    }
    return 0;
}

static void profile_after(void *ctx, const dt_interpose_call_t *call, int status,
                          uint64_t elapsed_ns)
{
    dt_interpose_profile_t *p = ctx;
    uint64_t flops = call->kind == DT_KIND_DEVICE
                         ? ((const dt_interpose_device_call_t *)call)->flops
                         : 0;
    pthread_mutex_lock(&p->lock);
    if (p->pass_op && pass_marks(p, call->op))
        pass_begins(p, dt_interpose_now_ns() - elapsed_ns);
    if (p->active) {
        profile_row_t *r = row_of(&p->live, call->op);
        if (call->op == call->name || strcmp(call->op, call->name) == 0)
            r->calls++;
        else
            r->waits++;
        r->bytes += call->bytes;
        r->flops += flops;
        r->ns += elapsed_ns;
        if (status != DT_OK)
            r->errors++;
    }
    pthread_mutex_unlock(&p->lock);
}

dt_interpose_hooks_t dt_interpose_profile_hooks(dt_interpose_profile_t *p)
{
    return (dt_interpose_hooks_t){.ctx = p, .after = profile_after};
}

/* Rows in use, in order of first use ("(other)" last, when used). */
static uint32_t rows_used(const profile_rows_t *r, const profile_row_t **out)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->n; i++)
        out[n++] = &r->rows[i];
    const profile_row_t *o = &r->rows[DT_PROFILE_ROWS];
    if (o->calls || o->waits)
        out[n++] = o;
    return n;
}

void dt_interpose_profile_print(dt_interpose_profile_t *p, FILE *f, const char *title)
{
    pthread_mutex_lock(&p->lock);
    const profile_row_t *rows[DT_PROFILE_ROWS + 1];
    uint32_t n = rows_used(&p->live, rows);
    fprintf(f, "%s\n  %-16s %10s %14s %12s %8s %8s\n", title, "op", "calls", "bytes", "time ms",
            "waits", "errors");
    for (uint32_t i = 0; i < n; i++) {
        const profile_row_t *r = rows[i];
        fprintf(f, "  %-16s %10llu %14llu %12.3f %8llu %8llu\n", r->op,
                (unsigned long long)r->calls, (unsigned long long)r->bytes, (double)r->ns / 1e6,
                (unsigned long long)r->waits, (unsigned long long)r->errors);
    }
    pthread_mutex_unlock(&p->lock);
}

/* "123.40" for a rate of `amount` per second over `ns`, in units of 1e9;
 * below 0.01 two significant digits ("0.0016"), so a rate that is there
 * never reads as 0.00 (a tiny matmul on a loaded machine); "-" when there
 * is none. */
static const char *rate(char buf[32], uint64_t amount, uint64_t ns)
{
    if (!amount || !ns)
        return "-";
    const double v = (double)amount / (double)ns;
    snprintf(buf, 32, v >= 0.01 ? "%.2f" : "%.2g", v);
    return buf;
}

void dt_interpose_profile_print_passes(dt_interpose_profile_t *p, FILE *f, const char *title)
{
    pthread_mutex_lock(&p->lock);
    const char *op = p->pass_op ? p->pass_op : "(none)";
    if (!p->active) {
        if (p->passes == 0)
            fprintf(f, "%s nothing measured: no pass began (no call of %s)\n", title, op);
        else
            fprintf(f, "%s nothing measured: %" PRIu64 " pass(es) began (at each %s), all "
                    "left out by skip=%" PRIu64 "\n", title, p->passes, op, p->skip);
        pthread_mutex_unlock(&p->lock);
        return;
    }
    /* whole passes when there are any, else from the first counted pass
     * (or the start) to now */
    const profile_rows_t *src = p->whole ? &p->at_pass : &p->live;
    uint64_t t_end = p->whole ? p->t_pass : dt_interpose_now_ns();
    double wall_ms = p->pass_op ? (double)(t_end - p->t_start) / 1e6 : 0;
    double per = p->whole ? (double)p->whole : 1.0;
    char span[200];
    if (!p->pass_op)
        snprintf(span, sizeof span, "no passes counted");
    else if (p->whole)
        snprintf(span, sizeof span, "passes %" PRIu64 "..%" PRIu64 " of %" PRIu64
                 " (%" PRIu64 " whole; a pass begins at each %s)", p->skip + 1,
                 p->skip + p->whole, p->passes, p->whole, op);
    else
        snprintf(span, sizeof span, "pass %" PRIu64 " to the end (%" PRIu64 " pass(es); a "
                 "pass begins at each %s)", p->skip + 1, p->passes, op);

    const profile_row_t *rows[DT_PROFILE_ROWS + 1];
    uint32_t n = rows_used(src, rows);
    uint64_t total_ns = 0;
    for (uint32_t i = 0; i < n; i++)
        total_ns += rows[i]->ns;
    /* most time first (insertion sort: a few dozen rows) */
    for (uint32_t i = 1; i < n; i++)
        for (uint32_t j = i; j > 0 && rows[j]->ns > rows[j - 1]->ns; j--) {
            const profile_row_t *t = rows[j];
            rows[j] = rows[j - 1];
            rows[j - 1] = t;
        }
    const double pct = wall_ms > 0 ? 100.0 / wall_ms : 0;
    const double total_ms = (double)total_ns / 1e6;
    fprintf(f, "%s %s: %.2f ms per pass, in calls %.2f ms (%.1f%%)\n", title, span,
            wall_ms / per, total_ms / per, total_ms * pct);
    fprintf(f, "  %-22s %9s %11s %10s %7s %10s %9s %8s %7s\n", "op", "calls", "total ms",
            "ms/pass", "% pass", "us/call", "GFLOP/s", "GB/s", "errors");
    for (uint32_t i = 0; i < n; i++) {
        const profile_row_t *r = rows[i];
        double ms = (double)r->ns / 1e6;
        char fl[32], by[32];
        fprintf(f, "  %-22s %9" PRIu64 " %11.2f %10.2f %7.1f %10.1f %9s %8s %7" PRIu64 "\n",
                r->op, r->calls, ms, ms / per, ms * pct,
                r->calls ? ms * 1e3 / (double)r->calls : 0.0, rate(fl, r->flops, r->ns),
                rate(by, r->bytes, r->ns), r->errors);
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
