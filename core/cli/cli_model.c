/*
 * core/cli/cli_model.c - the model of an offline command (cli_model.h).
 */
#include "cli/cli_model.h"

#include <string.h>

#include "util/error.h"

int dt_cli_model_open(dt_cli_model_t *cm, const char *const *sets, int n, const char *origin)
{
    memset(cm, 0, sizeof *cm);
    int rc = dt_resolve_core(NULL, sets, n, &cm->r);
    if (rc)
        return dt_err_context(rc, "%s: its [model] table", origin);
    cm->resolved = 1;
    if (!(rc = dt_resolve_plugin(&cm->r, DT_ROLE_DEVICE, NULL, NULL)) &&
        !(rc = dt_resolve_plugin(&cm->r, DT_ROLE_MODEL, NULL, NULL))) {
        cm->dev = cm->r.plugin[DT_ROLE_DEVICE];
        if ((rc = dt_model_create(cm->r.cfg, cm->dev->ops, dt_resolved_model(&cm->r),
                                  &cm->model)))
            dt_err_context(rc, "%s", origin);
    }
    if (rc)
        dt_cli_model_close(cm);
    return rc;
}

void dt_cli_model_close(dt_cli_model_t *cm)
{
    if (cm->model)
        dt_model_free(cm->model, NULL);
    if (cm->resolved)
        dt_resolved_free(&cm->r);
    memset(cm, 0, sizeof *cm);
}
