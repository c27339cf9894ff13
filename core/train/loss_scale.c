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
    /* the one definition of a valid [fp16] is the config's */
    const dt_fp16_settings_t f = {.loss_scale = cfg->loss_scale,
                                  .initial_scale_power = cfg->initial_power,
                                  .loss_scale_window = cfg->window,
                                  .hysteresis = cfg->hysteresis,
                                  .min_loss_scale = cfg->min_scale};
    int rc = dt_settings_fp16_check(&f, cfg_path);
    if (rc)
        return rc;
    s->scale = cfg->loss_scale > 0 ? cfg->loss_scale : ldexp(1.0, (int)cfg->initial_power);
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
