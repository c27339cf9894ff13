/*
 * core/cli/run_strict.c - `dtrain run --strict-device` (run_strict.h):
 * take the option, wrap the device and comm plugins' tables in the
 * interposers with the strict checks' hooks, print and unwrap at the end.
 * The same interposers and the same table swap as --profile
 * (run_profile.c); only the hooks differ.
 */
#include "cli/run_strict.h"

#include <stdio.h>
#include <string.h>

#define DT_STRICT_OPTION "--strict-device"

int dt_run_strict_take(int argc, char **argv, const char *const *value_opts, char **out,
                       dt_run_strict_t *s)
{
    memset(s, 0, sizeof *s);
    int n = 0;
    if (argc > 0)
        out[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        int takes_value = strcmp(argv[i], "--set") == 0;
        for (int k = 0; value_opts && value_opts[k] && !takes_value; k++)
            takes_value = strcmp(argv[i], value_opts[k]) == 0;
        if (takes_value && i + 1 < argc) {
            out[n++] = argv[i++];
            out[n++] = argv[i];
            continue;
        }
        if (strcmp(argv[i], DT_STRICT_OPTION) == 0) {
            s->on = 1;
            continue;
        }
        out[n++] = argv[i];
    }
    out[n] = NULL;
    return n;
}

static void finish(dt_run_strict_t *s, int rank)
{
    if (s->checks && s->comm_plugin && rank >= 0) {
        char title[200];
        snprintf(title, sizeof title, "strict device (rank %d, %s over %s):", rank,
                 s->comm_plugin->name, s->dev_plugin->name);
        dt_interpose_strict_print(s->checks, stdout, title);
        fflush(stdout);
    }
    if (s->comm_plugin)
        s->comm_plugin->ops = s->comm_table;
    if (s->dev_plugin)
        s->dev_plugin->ops = s->dev_table;
    dt_interpose_comm_destroy(s->ic);
    dt_interpose_device_destroy(s->id);
    dt_interpose_strict_free(s->checks);
    int on = s->on;
    memset(s, 0, sizeof *s);
    s->on = on;
}

int dt_run_strict_begin(dt_run_strict_t *s, dt_resolved_t *r)
{
    dt_plugin_t *dev = r->plugin[DT_ROLE_DEVICE], *comm = r->plugin[DT_ROLE_COMM];
    if (!s->on || !dev || !comm)
        return DT_OK;
    if (!(s->checks = dt_interpose_strict_create()))
        return DT_ERR_NOMEM;
    dt_interpose_hooks_t hooks = dt_interpose_strict_hooks(s->checks);
    int rc = dt_interpose_device_create(dev->ops, &hooks, 0u, &s->id);
    if (rc == DT_OK)
        rc = dt_interpose_comm_create(comm->ops, &hooks, &s->ic);
    if (rc != DT_OK) {
        finish(s, -1);
        return rc;
    }
    s->dev_plugin = dev;
    s->dev_table = dev->ops;
    dev->ops = dt_interpose_device_ops(s->id);
    s->comm_plugin = comm;
    s->comm_table = comm->ops;
    comm->ops = dt_interpose_comm_ops(s->ic);
    return DT_OK;
}

void dt_run_strict_end(dt_run_strict_t *s, int rank)
{
    finish(s, rank);
}
