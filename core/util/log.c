/*
 * core/util/log.c - the core's log line: "[rank R] who: message" on
 * stderr, filtered by DTRAIN_LOG.
 */
#include "util/log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/error.h"

static atomic_int log_rank = -1;
static atomic_int log_level = -1; /* -1: not yet read from DTRAIN_LOG */

void dt_log_set_rank(int rank) { atomic_store(&log_rank, rank < 0 ? -1 : rank); }

int dt_log_level_from_name(const char *name)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};
    if (!name)
        return -1;
    for (int i = 0; i < 4; i++)
        if (strcasecmp(name, names[i]) == 0)
            return i;
    return -1;
}

int dt_log_level(void)
{
    int lv = atomic_load(&log_level);
    if (lv >= 0)
        return lv;
    const char *env = getenv("DTRAIN_LOG");
    int parsed = (env && *env) ? dt_log_level_from_name(env) : DT_LOG_INFO;
    int expected = -1;
    int chosen = parsed < 0 ? DT_LOG_INFO : parsed;
    /* Only the thread that settles the level complains, so a bad value is
     * reported once. */
    if (atomic_compare_exchange_strong(&log_level, &expected, chosen) &&
        parsed < 0)
        dt_log(DT_LOG_WARN, "dtrain",
               "DTRAIN_LOG='%s' is not one of error|warn|info|debug; "
               "using info", env);
    return atomic_load(&log_level);
}

void dt_log_set_level(int level)
{
    if (level > DT_LOG_DEBUG)
        level = DT_LOG_DEBUG;
    atomic_store(&log_level, level < 0 ? -1 : level);
}

void dt_logv(int level, const char *who, const char *fmt, va_list ap)
{
    if (level > dt_log_level())
        return;
    char msg[DT_ERR_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && msg[n - 1] == '\n')
        msg[--n] = '\0';
    char rank[16];
    int r = atomic_load(&log_rank);
    if (r < 0)
        snprintf(rank, sizeof rank, "?");
    else
        snprintf(rank, sizeof rank, "%d", r);
    /* One fprintf: stdio locks the stream per call, so concurrent lines do
     * not mix. */
    fprintf(stderr, "[rank %s] %s: %s\n", rank, who ? who : "dtrain", msg);
}

void dt_log(int level, const char *who, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dt_logv(level, who, fmt, ap);
    va_end(ap);
}
