/*
 * tests/unit/plugins/common/device/test_mem_tally.c -
 * plugins/common/device/mem_tally.h: a device's memory accounting by tag
 * (current, peaks per tag and in total, reset), the mem_stats it fills,
 * and the budget refusal's exact words, which the cpu and cuda devices
 * both give (tests/unit/plugins/cpu/test_cpu_device.c and
 * tests/unit/plugins/cuda/test_cuda_alloc.c check them through the
 * devices).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/device/mem_tally.h"

#define MiB (1024ull * 1024ull)

static void test_add_sub_peaks(void **state)
{
    (void)state;
    dt_mem_tally_t m = {0};
    dt_mem_tally_add(&m, DT_TAG_PARAMS, 1000);
    dt_mem_tally_add(&m, DT_TAG_GRADS, 300);
    dt_mem_tally_add(&m, DT_TAG_PARAMS, 24);
    assert_int_equal(m.current[DT_TAG_PARAMS], 1024);
    assert_int_equal(m.current[DT_TAG_GRADS], 300);
    assert_int_equal(m.total_current, 1324);
    assert_int_equal(m.total_peak, 1324);
    dt_mem_tally_sub(&m, DT_TAG_PARAMS, 1000);
    dt_mem_tally_add(&m, DT_TAG_GRADS, 200); /* total 524: under the old peak */
    assert_int_equal(m.current[DT_TAG_PARAMS], 24);
    assert_int_equal(m.peak[DT_TAG_PARAMS], 1024);
    assert_int_equal(m.current[DT_TAG_GRADS], 500);
    assert_int_equal(m.peak[DT_TAG_GRADS], 500);
    assert_int_equal(m.total_current, 524);
    /* the total's peak is the highest total, not the sum of the peaks */
    assert_int_equal(m.total_peak, 1324);
    dt_mem_tally_reset_peaks(&m);
    assert_int_equal(m.peak[DT_TAG_PARAMS], 24);
    assert_int_equal(m.peak[DT_TAG_GRADS], 500);
    assert_int_equal(m.total_peak, 524);
    assert_int_equal(m.current[DT_TAG_PARAMS], 24); /* currents untouched */
    dt_mem_tally_sub(&m, DT_TAG_PARAMS, 24);
    dt_mem_tally_sub(&m, DT_TAG_GRADS, 500);
    assert_int_equal(m.total_current, 0);
    assert_int_equal(m.total_peak, 524);
}

static void test_stats(void **state)
{
    (void)state;
    dt_mem_tally_t dev = {0}, pin = {0};
    dt_mem_tally_add(&dev, DT_TAG_OPTIMIZER, 4096);
    dt_mem_tally_add(&dev, DT_TAG_ACTIVATIONS, 100);
    dt_mem_tally_sub(&dev, DT_TAG_ACTIVATIONS, 100);
    dt_mem_tally_add(&pin, DT_TAG_STAGING, 64);
    dt_mem_stats_t st;
    memset(&st, 0xAB, sizeof st); /* every field written */
    dt_mem_tally_stats(&dev, &pin, 1 * MiB, &st);
    assert_int_equal(st.struct_size, sizeof st);
    assert_int_equal(st.n_tags, DT_TAG_COUNT);
    assert_int_equal(st.limit, 1 * MiB);
    assert_int_equal(st.total_current, 4096);
    assert_int_equal(st.total_peak, 4196);
    assert_int_equal(st.current[DT_TAG_OPTIMIZER], 4096);
    assert_int_equal(st.current[DT_TAG_ACTIVATIONS], 0);
    assert_int_equal(st.peak[DT_TAG_ACTIVATIONS], 100);
    assert_int_equal(st.current[DT_TAG_STAGING], 0);
    assert_int_equal(st.pinned_current[DT_TAG_STAGING], 64);
    assert_int_equal(st.pinned_peak[DT_TAG_STAGING], 64);
    assert_int_equal(st.pinned_total_current, 64);
    assert_int_equal(st.pinned_total_peak, 64);
    assert_int_equal(st.pinned_current[DT_TAG_OPTIMIZER], 0);
    /* no pinned tally: zeros */
    memset(&st, 0xAB, sizeof st);
    dt_mem_tally_stats(&dev, NULL, 0, &st);
    assert_int_equal(st.limit, 0);
    assert_int_equal(st.pinned_total_current, 0);
    assert_int_equal(st.pinned_total_peak, 0);
    assert_int_equal(st.pinned_current[DT_TAG_STAGING], 0);
    assert_int_equal(st.pinned_peak[DT_TAG_STAGING], 0);
}

static void test_fmt_bytes(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(dt_mem_fmt_bytes(b, 0), "0 B");
    assert_string_equal(dt_mem_fmt_bytes(b, 1023), "1023 B");
    assert_string_equal(dt_mem_fmt_bytes(b, 4096), "4.0 KiB");
    assert_string_equal(dt_mem_fmt_bytes(b, 12 * MiB + MiB / 2), "12.5 MiB");
    assert_string_equal(dt_mem_fmt_bytes(b, 3 * 1024 * MiB + 205 * MiB), "3.2 GiB");
}

static void test_budget_text(void **state)
{
    (void)state;
    dt_mem_tally_t m = {0};
    char buf[512];
    dt_mem_tally_budget_text(&m, 3 * MiB, DT_TAG_GRADS, 2 * MiB, buf, sizeof buf);
    assert_string_equal(buf, "out of memory budget: allocating 3.0 MiB (3145728 bytes) for "
                             "grads would bring the total to 3.0 MiB, over memory_limit "
                             "2.0 MiB (in use: nothing)");
    dt_mem_tally_add(&m, DT_TAG_PARAMS, 1 * MiB);
    dt_mem_tally_add(&m, DT_TAG_COMM, 512);
    dt_mem_tally_budget_text(&m, 3 * MiB, DT_TAG_GRADS, 3 * MiB + MiB / 2, buf, sizeof buf);
    assert_string_equal(buf, "out of memory budget: allocating 3.0 MiB (3145728 bytes) for "
                             "grads would bring the total to 4.0 MiB, over memory_limit "
                             "3.5 MiB (in use: params 1.0 MiB, comm 512 B)");
    /* an absurd request: the total does not wrap */
    dt_mem_tally_budget_text(&m, UINT64_MAX, DT_TAG_GRADS, 1024, buf, sizeof buf);
    assert_string_equal(buf, "out of memory budget: allocating 17179869184.0 GiB "
                             "(18446744073709551615 bytes) for grads would bring the total "
                             "to 17179869184.0 GiB, over memory_limit 1.0 KiB (in use: "
                             "params 1.0 MiB, comm 512 B)");
    /* cut to the buffer, still a string */
    char small[16];
    dt_mem_tally_budget_text(&m, 1, DT_TAG_GRADS, 1, small, sizeof small);
    assert_string_equal(small, "out of memory b");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_sub_peaks),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_fmt_bytes),
        cmocka_unit_test(test_budget_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
