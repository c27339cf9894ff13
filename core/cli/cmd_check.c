/*
 * core/cli/cmd_check.c - `dtrain check CONFIG`: resolve, take run's checks
 * that need no plugin instance (train/preflight.h), print with origins.
 */
#include <stdio.h>

#include "cli/cli.h"
#include "config/settings.h"
#include "setup/resolve.h"
#include "train/preflight.h"

void dt_help_check(FILE *f)
{
    fprintf(f,
            "usage: dtrain check CONFIG [--set table.key=value ...]\n\n"
            "Validate CONFIG against the core's schema and the tables of every plugin\n"
            "it selects (loading those plugins), take every check of dtrain run that\n"
            "needs no plugin instance (the model's shape, the batch arithmetic for\n"
            "launch.nproc ranks, seq_len within the context, the pipeline's layout of\n"
            "stages and chunks, the token files it names), then print the resolved\n"
            "config with each value's origin: default, file, --set, derived (computed\n"
            "from other values) or preset (from model.preset).\n"
            "The table of a plugin the config does not select is checked against that\n"
            "plugin's keys and noted as not used, so one file can configure every\n"
            "strategy and --set picks one.\n\n"
            "Errors name file:line:col and suggest the closest valid key, or dtrain's\n"
            "key for one spelled as DeepSpeed, torchrun, PyTorch or the Hugging Face\n"
            "Trainer spell it.  Every config error of the file is reported at once, one\n"
            "line each (the first 16, and how many more).  Every core key: dtrain\n"
            "config doc.\n"
            "exit codes: 0 valid, 2 usage or config error, 1 runtime failure\n");
}

int dt_cmd_check(int argc, char **argv)
{
    dt_cli_config_args_t a;
    int ec = dt_cli_parse_config_args("check", argc, argv, &a, NULL, NULL);
    if (ec)
        return ec;
    dt_resolved_t r;
    int rc = dt_resolve(a.config, a.sets, a.n_sets, &r);
    if (rc)
        return dt_cli_fail("check", rc);
    /* run's own checks, for launch.nproc data-parallel ranks */
    if ((rc = dt_preflight(&r, r.set.launch.nproc, 0))) {
        dt_resolved_free(&r);
        return dt_cli_fail("check", rc);
    }
    printf("# dtrain check: %s is valid\n", a.config);
    dt_config_print(r.cfg, stdout);
    const char *t;
    for (size_t i = 0; (t = dt_config_aside(r.cfg, i)); i++)
        printf("\n# note: [%s] is not used: the config does not select plugin '%s' "
               "(its keys were checked)\n", t, t);
    const char *fk = dt_settings_fp16_unused(r.cfg), *dtype = "?";
    if (fk && dt_config_get_string(r.cfg, "model.dtype", &dtype) == DT_OK)
        printf("\n# note: [fp16] is not used: %s is set but only model.dtype = \"fp16\" "
               "scales the loss, and this model is \"%s\" (its keys were checked)\n", fk,
               dtype);
    if (!r.set.data.train[0])
        printf("\n# note: [data] train is empty: dtrain run needs a token file\n");
    dt_resolved_free(&r);
    return DT_EXIT_OK;
}
