/*
 * core/cli/cli_model.h - the model of an offline command (sample, import):
 * a [model] table given as assignments, the device plugin loaded as
 * `dtrain run` loads it (run.device's default, cpu), and the model
 * described on that device's kernel table.
 */
#ifndef DT_CLI_MODEL_H
#define DT_CLI_MODEL_H

#include "model/model.h"
#include "setup/resolve.h"

typedef struct dt_cli_model {
    dt_resolved_t r;
    int resolved;
    const dt_plugin_t *dev; /* the device plugin (bound; no instance) */
    dt_model_t *model;
} dt_cli_model_t;

/* Build it from n "model.<key>=<value>" assignments; `origin` names where
 * they came from in messages ("checkpoint 'x'", "'config.json'").  On
 * failure what was built is released. */
int dt_cli_model_open(dt_cli_model_t *cm, const char *const *sets, int n, const char *origin);
void dt_cli_model_close(dt_cli_model_t *cm);

#endif /* DT_CLI_MODEL_H */
