/*
 * core/cli/cmd_run.c - `dtrain run CONFIG`: resolve the config and train.
 */
#include <stdio.h>

#include "cli/cli.h"
#include "engine/train.h"
#include "setup/resolve.h"
#include "util/error.h"

void dt_help_run(FILE *f)
{
    fprintf(f, "usage: dtrain run CONFIG [--set table.key=value ...] [--metrics FILE]\n\n"
               "Train the model CONFIG describes.  --metrics writes one JSON object per\n"
               "step.  exit codes: 0 trained, 2 usage or config error, 1 runtime failure\n");
}

int dt_cmd_run(int argc, char **argv)
{
    static const char *const opts[] = {"--metrics", NULL};
    const char *vals[1] = {NULL};
    dt_cli_config_args_t a;
    int ec = dt_cli_parse_config_args("run", argc, argv, &a, opts, vals);
    if (ec)
        return ec;
    dt_resolved_t r;
    int rc = dt_resolve(a.config, a.sets, a.n_sets, &r);
    if (rc)
        return dt_cli_fail("run", rc);
    dt_train_opts_t o = {.metrics_path = vals[0]};
    rc = dt_train(&r, &o);
    dt_resolved_free(&r);
    return rc ? dt_cli_fail("run", rc) : DT_EXIT_OK;
}
