/*
 * core/train/loss_scale.c - the loss scaler's state machine (loss_scale.h
 * says what it does and why it follows DeepSpeed).  Pure arithmetic: the
 * training loop asks it for the scale, tells it each step's outcome, and
 * owns the collectives and the messages around it.
 */
#include "train/loss_scale.h"

#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "util/error.h"

int dt_loss_scale_init(dt_loss_scaler_t *s, const dt_loss_scale_cfg_t *cfg,
                       const char *cfg_path)
{
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    const char *where = cfg_path && cfg_path[0] ? cfg_path : "config";
    if (!(cfg->loss_scale >= 0 && cfg->loss_scale <= DT_LOSS_SCALE_MAX))
        return dt_err_set(DT_ERR_CONFIG, "%s: [fp16] loss_scale = %g: must be 0 (dynamic) or a "
                          "static scale in (0, 2^127]", where, cfg->loss_scale);
    if (cfg->loss_scale > 0) {
        s->scale = cfg->loss_scale;
        return DT_OK;
    }
    if (cfg->initial_power < 0 || cfg->initial_power > 127)
        return dt_err_set(DT_ERR_CONFIG, "%s: [fp16] initial_scale_power = %lld: must be in "
                          "[0, 127] (the scale 2^power must fit an f32)", where,
                          (long long)cfg->initial_power);
    if (cfg->window < 1 || cfg->hysteresis < 1)
        return dt_err_set(DT_ERR_CONFIG, "%s: [fp16] %s = %lld: must be at least 1", where,
                          cfg->window < 1 ? "loss_scale_window" : "hysteresis",
                          (long long)(cfg->window < 1 ? cfg->window : cfg->hysteresis));
    s->scale = ldexp(1.0, (int)cfg->initial_power);
    if (!(cfg->min_scale > 0 && cfg->min_scale <= s->scale))
        return dt_err_set(DT_ERR_CONFIG, "%s: [fp16] min_loss_scale = %g: must be > 0 and at "
                          "most the initial scale 2^initial_scale_power = %g", where,
                          cfg->min_scale, s->scale);
    s->hyst_left = cfg->hysteresis;
    return DT_OK;
}

dt_loss_scale_event_t dt_loss_scale_update(dt_loss_scaler_t *s, int overflow)
{
    const int dynamic = s->cfg.loss_scale == 0;
    if (!overflow) {
        if (dynamic && ++s->clean >= s->cfg.window) {
            s->clean = 0;
            s->hyst_left = s->cfg.hysteresis;
            if (s->scale * 2 <= DT_LOSS_SCALE_MAX)
                s->scale *= 2;
        }
        return DT_LS_CLEAN;
    }
    s->clean = 0;
    if (!dynamic)
        return DT_LS_FATAL;
    if (s->hyst_left > 1) { /* tolerated: skip, keep the scale */
        s->hyst_left--;
        s->skipped++;
        return DT_LS_SKIP;
    }
    if (s->scale <= s->cfg.min_scale)
        return DT_LS_FATAL;
    s->scale = s->scale / 2 < s->cfg.min_scale ? s->cfg.min_scale : s->scale / 2;
    s->skipped++;
    return DT_LS_SKIP;
}

int dt_loss_scale_save(const dt_loss_scaler_t *s, cJSON *loop)
{
    cJSON *j = cJSON_CreateObject();
    if (!j || !cJSON_AddNumberToObject(j, "scale", s->scale) ||
        !cJSON_AddNumberToObject(j, "clean", (double)s->clean) ||
        !cJSON_AddNumberToObject(j, "hysteresis_left", (double)s->hyst_left) ||
        !cJSON_AddNumberToObject(j, "skipped", (double)s->skipped) ||
        !cJSON_AddItemToObject(loop, "loss_scale", j)) {
        cJSON_Delete(j);
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    }
    return DT_OK;
}

/* Member `key` of `j` as a number in [lo, hi]. */
static int member(const cJSON *j, const char *key, double lo, double hi, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return 0;
    *out = v->valuedouble;
    return 1;
}

int dt_loss_scale_restore(dt_loss_scaler_t *s, const cJSON *loop, const char *what)
{
    const cJSON *j = loop ? cJSON_GetObjectItemCaseSensitive(loop, "loss_scale") : NULL;
    if (!j)
        return DT_OK;
    double scale, clean, hyst, skipped;
    if (!member(j, "scale", 0x1p-149, DT_LOSS_SCALE_MAX, &scale) ||
        !member(j, "clean", 0, 9e15, &clean) || !member(j, "hysteresis_left", 0, 9e15, &hyst) ||
        !member(j, "skipped", 0, 9e15, &skipped))
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': the loss scaler's record \"loop\": "
                          "{\"loss_scale\": ...} is malformed", what);
    s->skipped = (int64_t)skipped;
    if (s->cfg.loss_scale > 0)
        return DT_OK;
    s->scale = scale < s->cfg.min_scale ? s->cfg.min_scale : scale;
    s->clean = (int64_t)clean < s->cfg.window ? (int64_t)clean : 0;
    s->hyst_left = hyst >= 1 && (int64_t)hyst <= s->cfg.hysteresis ? (int64_t)hyst
                                                                   : s->cfg.hysteresis;
    return DT_OK;
}
