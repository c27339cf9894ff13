/*
 * tests/unit/core/train/test_loss_scale.c - the fp16 loss scaler's state machine
 * (core/train/loss_scale.c) step by step against DeepSpeed's
 * DynamicLossScaler: an overflow halves the scale once hysteresis is used
 * up, loss_scale_window clean steps double it and restore hysteresis,
 * the scale is clamped at min_loss_scale and an overflow there is fatal,
 * a static scale never changes and any overflow with it is fatal; and
 * every bad [fp16] value is refused naming its key; and the state a
 * checkpoint keeps comes back as it was saved.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include <cjson/cJSON.h>

#include "train/loss_scale.h"
#include "util/error.h"
#include "test_assert.h"

static dt_loss_scale_cfg_t dyn(int64_t power, int64_t window, int64_t hyst, double min)
{
    return (dt_loss_scale_cfg_t){.loss_scale = 0, .initial_power = power, .window = window,
                                 .hysteresis = hyst, .min_scale = min};
}

/* Feed `n` steps of outcome `overflow`; each must give `want`. */
static void feed(dt_loss_scaler_t *s, int n, int overflow, dt_loss_scale_event_t want)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(dt_loss_scale_update(s, overflow), want);
}

static void test_overflow_halves_window_doubles(void **state)
{
    dt_loss_scaler_t s;
    dt_loss_scale_cfg_t c = dyn(16, 3, 1, 1.0);
    assert_ok(dt_loss_scale_init(&s, &c, "t.toml"));
    assert_true(s.scale == 65536.0);
    feed(&s, 1, 1, DT_LS_SKIP); /* hysteresis 1: the first overflow halves */
    assert_true(s.scale == 32768.0);
    assert_int_equal(s.skipped, 1);
    feed(&s, 2, 0, DT_LS_CLEAN); /* 2 of the 3-step window: unchanged */
    assert_true(s.scale == 32768.0);
    feed(&s, 1, 0, DT_LS_CLEAN); /* the third clean step doubles */
    assert_true(s.scale == 65536.0);
    feed(&s, 2, 0, DT_LS_CLEAN);
    feed(&s, 1, 1, DT_LS_SKIP); /* an overflow restarts the window */
    assert_true(s.scale == 32768.0);
    feed(&s, 2, 0, DT_LS_CLEAN);
    assert_true(s.scale == 32768.0);
    feed(&s, 1, 0, DT_LS_CLEAN);
    assert_true(s.scale == 65536.0);
    assert_int_equal(s.skipped, 2);
}

/* hysteresis = 3: two overflows are skipped at the same scale, the third
 * halves; from then every overflow halves until the scale grows, which
 * restores the count (DeepSpeed without consecutive_hysteresis). */
static void test_hysteresis_counts(void **state)
{
    dt_loss_scaler_t s;
    dt_loss_scale_cfg_t c = dyn(10, 4, 3, 1.0);
    assert_ok(dt_loss_scale_init(&s, &c, NULL));
    feed(&s, 2, 1, DT_LS_SKIP);
    assert_true(s.scale == 1024.0);
    feed(&s, 1, 1, DT_LS_SKIP);
    assert_true(s.scale == 512.0);
    feed(&s, 1, 0, DT_LS_CLEAN); /* clean steps alone do not restore it */
    feed(&s, 1, 1, DT_LS_SKIP);
    assert_true(s.scale == 256.0);
    feed(&s, 4, 0, DT_LS_CLEAN); /* growth restores hysteresis */
    assert_true(s.scale == 512.0);
    feed(&s, 2, 1, DT_LS_SKIP);
    assert_true(s.scale == 512.0);
    feed(&s, 1, 1, DT_LS_SKIP);
    assert_true(s.scale == 256.0);
    assert_int_equal(s.skipped, 7);
}

/* The floor: halving stops at min_loss_scale (clamped, not below), and an
 * overflow at the floor is fatal, never another skip. */
static void test_min_scale_is_fatal(void **state)
{
    dt_loss_scaler_t s;
    dt_loss_scale_cfg_t c = dyn(4, 100, 1, 3.0);
    assert_ok(dt_loss_scale_init(&s, &c, NULL));
    feed(&s, 1, 1, DT_LS_SKIP);
    assert_true(s.scale == 8.0);
    feed(&s, 1, 1, DT_LS_SKIP);
    assert_true(s.scale == 4.0);
    feed(&s, 1, 1, DT_LS_SKIP); /* 2 would be below 3: clamped */
    assert_true(s.scale == 3.0);
    feed(&s, 1, 1, DT_LS_FATAL);
    assert_true(s.scale == 3.0);
    assert_int_equal(s.skipped, 3);
    /* min = the initial scale: the first overflow (past hysteresis) ends it */
    c = dyn(0, 1, 2, 1.0);
    assert_ok(dt_loss_scale_init(&s, &c, NULL));
    feed(&s, 1, 1, DT_LS_SKIP);
    feed(&s, 1, 1, DT_LS_FATAL);
}

/* The scale stops growing at 2^127, the largest power of two an f32 holds. */
static void test_growth_capped(void **state)
{
    dt_loss_scaler_t s;
    dt_loss_scale_cfg_t c = dyn(126, 1, 1, 1.0);
    assert_ok(dt_loss_scale_init(&s, &c, NULL));
    feed(&s, 1, 0, DT_LS_CLEAN);
    assert_true(s.scale == DT_LOSS_SCALE_MAX);
    feed(&s, 5, 0, DT_LS_CLEAN);
    assert_true(s.scale == DT_LOSS_SCALE_MAX);
    assert_true(isfinite((float)s.scale));
}

static void test_static_never_changes(void **state)
{
    dt_loss_scaler_t s;
    dt_loss_scale_cfg_t c = dyn(16, 1, 2, 1.0);
    c.loss_scale = 128.0;
    assert_ok(dt_loss_scale_init(&s, &c, NULL));
    assert_true(s.scale == 128.0);
    feed(&s, 10, 0, DT_LS_CLEAN);
    assert_true(s.scale == 128.0);
    feed(&s, 1, 1, DT_LS_FATAL); /* hysteresis is for dynamic scaling */
    assert_true(s.scale == 128.0);
    assert_int_equal(s.skipped, 0);
}

static void test_bad_config_named(void **state)
{
    dt_loss_scaler_t s;
    dt_loss_scale_cfg_t c = dyn(128, 1, 1, 1.0);
    assert_status(dt_loss_scale_init(&s, &c, "t.toml"), DT_ERR_CONFIG);
    assert_msg("t.toml: [fp16] initial_scale_power = 128: must be in [0, 127] (the scale "
               "2^power must fit an f32)");
    c = dyn(8, 0, 1, 1.0);
    assert_status(dt_loss_scale_init(&s, &c, "t.toml"), DT_ERR_CONFIG);
    assert_msg("t.toml: [fp16] loss_scale_window = 0: must be at least 1");
    c = dyn(8, 1, 0, 1.0);
    assert_status(dt_loss_scale_init(&s, &c, "t.toml"), DT_ERR_CONFIG);
    assert_msg("t.toml: [fp16] hysteresis = 0: must be at least 1");
    c = dyn(8, 1, 1, 512.0);
    assert_status(dt_loss_scale_init(&s, &c, "t.toml"), DT_ERR_CONFIG);
    assert_msg("t.toml: [fp16] min_loss_scale = 512: must be > 0 and at most the initial "
               "scale 2^initial_scale_power = 256");
    c = dyn(8, 1, 1, 1.0);
    c.loss_scale = -1;
    assert_status(dt_loss_scale_init(&s, &c, ""), DT_ERR_CONFIG);
    assert_msg("config: [fp16] loss_scale = -1: must be 0 (dynamic) or a static scale in "
               "(0, 2^127]");
}

/* Save, then restore into a fresh scaler: the same state; restored into
 * a config with a higher floor, the scale is raised to it; a static scale
 * keeps the config's value and takes only the skip count; a malformed
 * record is refused naming the checkpoint. */
static void test_save_restore(void **state)
{
    dt_loss_scaler_t a, b;
    dt_loss_scale_cfg_t c = dyn(10, 4, 3, 1.0);
    assert_ok(dt_loss_scale_init(&a, &c, NULL));
    feed(&a, 3, 1, DT_LS_SKIP); /* 512, hysteresis used up */
    feed(&a, 2, 0, DT_LS_CLEAN);
    cJSON *loop = cJSON_CreateObject();
    assert_ok(dt_loss_scale_save(&a, loop));
    assert_ok(dt_loss_scale_init(&b, &c, NULL));
    assert_ok(dt_loss_scale_restore(&b, loop, "ck"));
    assert_true(b.scale == 512.0);
    assert_int_equal(b.clean, 2);
    assert_int_equal(b.hyst_left, 1);
    assert_int_equal(b.skipped, 3);
    /* the two continue alike: two clean steps double both */
    feed(&a, 2, 0, DT_LS_CLEAN);
    feed(&b, 2, 0, DT_LS_CLEAN);
    assert_true(a.scale == 1024.0 && b.scale == 1024.0);
    /* a floor above the saved scale */
    c = dyn(12, 4, 3, 2048.0);
    assert_ok(dt_loss_scale_init(&b, &c, NULL));
    assert_ok(dt_loss_scale_restore(&b, loop, "ck"));
    assert_true(b.scale == 2048.0);
    /* static: the config's scale */
    c.loss_scale = 8.0;
    assert_ok(dt_loss_scale_init(&b, &c, NULL));
    assert_ok(dt_loss_scale_restore(&b, loop, "ck"));
    assert_true(b.scale == 8.0);
    assert_int_equal(b.skipped, 3);
    /* none saved: unchanged */
    assert_ok(dt_loss_scale_restore(&b, NULL, "ck"));
    assert_true(b.scale == 8.0);
    cJSON_Delete(loop);
    loop = cJSON_Parse("{\"loss_scale\": {\"scale\": -1, \"clean\": 0, "
                       "\"hysteresis_left\": 1, \"skipped\": 0}}");
    assert_non_null(loop);
    assert_status(dt_loss_scale_restore(&b, loop, "ck/step-00000004"), DT_ERR_DATA);
    assert_msg("checkpoint 'ck/step-00000004': the loss scaler's record \"loop\": "
               "{\"loss_scale\": ...} is malformed");
    cJSON_Delete(loop);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overflow_halves_window_doubles),
        cmocka_unit_test(test_hysteresis_counts),
        cmocka_unit_test(test_min_scale_is_fatal),
        cmocka_unit_test(test_growth_capped),
        cmocka_unit_test(test_static_never_changes),
        cmocka_unit_test(test_bad_config_named),
        cmocka_unit_test(test_save_restore),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
