/*
 * core/cli/run_profile.c - `dtrain run --profile LIST` (run_profile.h):
 * parse LIST, wrap the comm and device plugins' tables in the interposers
 * with the profiler's hooks, print and unwrap at the end.
 *
 * The device table is per forward pass, counted at embedding_forward,
 * the first kernel of every forward pass of the built-in models (gpt2,
 * mlp): with one micro-batch per step and no evaluation, a pass is a
 * training step.
 */
#include "cli/run_profile.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* A pass (one forward) begins at the model's embedding: GPT-2's
 * embedding_forward, llama's (and any tensor-parallel model's)
 * vocab_embedding_forward. */
#define DT_PROFILE_PASS_OP "embedding_forward|vocab_embedding_forward"

__attribute__((format(printf, 2, 3))) static int usage(const char *list, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%sdtrain run: error: --profile '%s': ", dt_cli_rank_prefix(), list);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return DT_EXIT_USAGE;
}

/* One device option, `opt` (NUL-terminated). */
static int device_option(const char *list, const char *opt, dt_run_profile_t *p)
{
    if (strcmp(opt, "sync") == 0) {
        p->sync = 1;
        return 0;
    }
    if (strncmp(opt, "skip=", 5) == 0) {
        const char *v = opt + 5;
        char *end = NULL;
        errno = 0;
        unsigned long long n = *v >= '0' && *v <= '9' ? strtoull(v, &end, 10) : 0;
        if (!end || *end || errno)
            return usage(list, "skip=%s: not a whole number of passes", v);
        p->skip = n;
        return 0;
    }
    return usage(list, "unknown device option '%s' (one of: skip=N, sync)", opt);
}

int dt_run_profile_parse(const char *list, dt_run_profile_t *p)
{
    memset(p, 0, sizeof *p);
    if (!list)
        return 0;
    char buf[256];
    if (strlen(list) >= sizeof buf)
        return usage(list, "too long");
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *opts = strchr(item, ':');
        if (opts)
            *opts++ = '\0';
        int *kind = strcmp(item, "comm") == 0 ? &p->comm
                    : strcmp(item, "device") == 0 ? &p->device
                                                  : NULL;
        if (!kind)
            return usage(list, "unknown '%s' (one of: comm, device; e.g. comm,device or "
                         "device:skip=1:sync)", item);
        if (*kind)
            return usage(list, "%s given twice", item);
        *kind = 1;
        if (opts && kind == &p->comm)
            return usage(list, "comm takes no options (got '%s')", opts);
        char *save2 = NULL;
        for (char *o = opts ? strtok_r(opts, ":", &save2) : NULL; o;
             o = strtok_r(NULL, ":", &save2)) {
            int ec = device_option(list, o, p);
            if (ec)
                return ec;
        }
    }
    if (!p->comm && !p->device)
        return usage(list, "empty (one of: comm, device)");
    return 0;
}

static int begin_comm(dt_run_profile_t *p, dt_plugin_t *pl)
{
    if (!(p->comm_prof = dt_interpose_profile_create()))
        return DT_ERR_NOMEM;
    dt_interpose_hooks_t hooks = dt_interpose_profile_hooks(p->comm_prof);
    int rc = dt_interpose_comm_create(pl->ops, &hooks, &p->ic);
    if (rc != DT_OK)
        return rc;
    p->comm_plugin = pl;
    p->comm_table = pl->ops;
    pl->ops = dt_interpose_comm_ops(p->ic);
    return DT_OK;
}

static int begin_device(dt_run_profile_t *p, dt_plugin_t *pl)
{
    if (!(p->dev_prof = dt_interpose_profile_create()))
        return DT_ERR_NOMEM;
    dt_interpose_profile_passes(p->dev_prof, DT_PROFILE_PASS_OP, p->skip);
    dt_interpose_hooks_t hooks = dt_interpose_profile_hooks(p->dev_prof);
    int rc = dt_interpose_device_create(pl->ops, &hooks,
                                        p->sync ? DT_INTERPOSE_DEVICE_SYNC : 0u, &p->id);
    if (rc != DT_OK)
        return rc;
    p->dev_plugin = pl;
    p->dev_table = pl->ops;
    pl->ops = dt_interpose_device_ops(p->id);
    return DT_OK;
}

/* Unwrap and free; print first when `rank` >= 0. */
static void finish(dt_run_profile_t *p, int rank)
{
    char title[200];
    if (p->comm_plugin && rank >= 0) {
        snprintf(title, sizeof title, "comm profile (rank %d, %s):", rank, p->comm_plugin->name);
        dt_interpose_profile_print(p->comm_prof, stdout, title);
    }
    if (p->dev_plugin && rank >= 0) {
        snprintf(title, sizeof title, "device profile (rank %d, %s%s):", rank,
                 p->dev_plugin->name, p->sync ? ", synchronized" : "");
        dt_interpose_profile_print_passes(p->dev_prof, stdout, title);
    }
    fflush(stdout);
    if (p->comm_plugin)
        p->comm_plugin->ops = p->comm_table;
    if (p->dev_plugin)
        p->dev_plugin->ops = p->dev_table;
    dt_interpose_comm_destroy(p->ic);
    dt_interpose_device_destroy(p->id);
    dt_interpose_profile_free(p->comm_prof);
    dt_interpose_profile_free(p->dev_prof);
    memset(p, 0, sizeof *p);
}

int dt_run_profile_begin(dt_run_profile_t *p, dt_resolved_t *r)
{
    int rc = DT_OK;
    if (p->comm && r->plugin[DT_ROLE_COMM])
        rc = begin_comm(p, r->plugin[DT_ROLE_COMM]);
    if (rc == DT_OK && p->device && r->plugin[DT_ROLE_DEVICE])
        rc = begin_device(p, r->plugin[DT_ROLE_DEVICE]);
    if (rc != DT_OK)
        finish(p, -1);
    return rc;
}

void dt_run_profile_end(dt_run_profile_t *p, int rank)
{
    finish(p, rank);
}
