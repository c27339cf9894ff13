/*
 * tests/unit/core/train/test_plan.c - the planner's arithmetic and number format
 * (core/train/plan.c): totals over every device tag, the ring traffic's time on a
 * link, and sizes and times written one way at every magnitude, the unit
 * boundaries included.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "train/plan.h"

/* The device total counts every tag but the offload tier's (host memory
 * or files, printed on a line of its own). */
static void test_total_counts_every_tag(void **state)
{
    (void)state;
    dt_estimate_t e = {.struct_size = sizeof e, .n_tags = DT_TAG_COUNT};
    uint64_t want = 0;
    for (int t = 0; t < DT_TAG_COUNT; t++) {
        e.bytes[t] = (uint64_t)(t + 1) << 20;
        want += t == DT_TAG_OFFLOAD ? 0 : e.bytes[t];
    }
    assert_int_equal(dt_plan_total(&e), want);
    assert_int_equal(dt_plan_model_state(&e),
                     e.bytes[DT_TAG_PARAMS] + e.bytes[DT_TAG_GRADS] + e.bytes[DT_TAG_OPTIMIZER]);
}

/* GPT-2 124M's f32 gradients all-reduced by a ring of 8: 2 x 7/8 x 4 x
 * 124,439,808 = 871,078,656 bytes per rank; x 8 bits / 25e9 bit/s =
 * 0.27874517 s, a quarter of it at 100 Gb/s. */
static void test_comm_seconds(void **state)
{
    (void)state;
    assert_float_equal(dt_plan_comm_seconds(871078656u, 25.0), 0.27874517, 1e-8);
    assert_float_equal(dt_plan_comm_seconds(871078656u, 100.0), 0.0696862925, 1e-9);
    assert_float_equal(dt_plan_comm_seconds(0, 25.0), 0.0, 0.0);
}

static void check_bytes(uint64_t b, const char *want)
{
    char buf[32];
    assert_string_equal(dt_plan_bytes(b, buf, sizeof buf), want);
}

static void test_bytes_format(void **state)
{
    (void)state;
    const uint64_t mib = 1u << 20, gib = (uint64_t)1 << 30, tib = (uint64_t)1 << 40;
    check_bytes(0, "0.00 MiB");
    check_bytes(mib / 2, "0.50 MiB");
    check_bytes(474700000, "452.71 MiB");
    check_bytes(gib - mib, "1023.00 MiB");
    check_bytes(gib - 1, "1.00 GiB"); /* never "1024.00 MiB" */
    check_bytes(gib, "1.00 GiB");
    check_bytes(gib * 23 + gib / 4, "23.25 GiB");
    check_bytes(tib - 1, "1.00 TiB");
    check_bytes(tib - 6 * mib, "1023.99 GiB");
    check_bytes(tib, "1.00 TiB");
    check_bytes(tib * 3000, "3000.00 TiB"); /* TiB is the largest unit */
}

static void check_seconds(double s, const char *want)
{
    char buf[32];
    assert_string_equal(dt_plan_seconds(s, buf, sizeof buf), want);
}

static void test_seconds_format(void **state)
{
    (void)state;
    check_seconds(0.0, "0.00 ms");
    check_seconds(0.27874517, "278.75 ms");
    check_seconds(0.9994, "999.40 ms");
    check_seconds(0.999999, "1.00 s"); /* never "1000.00 ms" */
    check_seconds(1.0, "1.00 s");
    check_seconds(3.4890, "3.49 s");
    check_seconds(12345.6, "12345.60 s");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_total_counts_every_tag),
        cmocka_unit_test(test_comm_seconds),
        cmocka_unit_test(test_bytes_format),
        cmocka_unit_test(test_seconds_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
