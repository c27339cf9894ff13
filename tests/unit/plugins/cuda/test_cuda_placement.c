/*
 * tests/unit/plugins/cuda/test_cuda_placement.c - which GPU the cuda device runs a rank
 * on (plugins/cuda/cuda_placement.c, compiled in: host-only C, so this
 * runs on every machine): the local rank by default, the device_index key
 * over the core's argument over the local rank, and the exact refusals
 * when the machine has too few GPUs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "cuda/cuda_placement.h"
#include "dtrain/dtrain.h"
#include "test_host.h"
#include "util/error.h"

static dt_test_host_t th;

static int pick(int local_rank, int local_size, int arg_index, int64_t key, int count,
                int *out)
{
    dt_test_host_init(&th, "device/cuda", NULL);
    const dt_device_init_v1_t a = {.struct_size = sizeof a, .local_rank = local_rank,
                                   .local_size = local_size, .device_index = arg_index};
    *out = -7;
    return cuda_pick_device(&th.host, &a, key, count, out);
}

static void test_local_rank(void **state)
{
    (void)state;
    int dev;
    for (int r = 0; r < 4; r++) {
        assert_int_equal(pick(r, 4, -1, -1, 8, &dev), DT_OK);
        assert_int_equal(dev, r);
    }
    assert_int_equal(pick(0, 0, -1, -1, 1, &dev), DT_OK); /* no launcher: rank 0 */
    assert_int_equal(dev, 0);
}

static void test_overrides(void **state)
{
    (void)state;
    int dev;
    assert_int_equal(pick(1, 2, 3, -1, 4, &dev), DT_OK); /* the core's argument */
    assert_int_equal(dev, 3);
    assert_int_equal(pick(1, 2, 3, 0, 4, &dev), DT_OK); /* the key wins */
    assert_int_equal(dev, 0);
    /* the key may place more ranks than GPUs (sharing one) */
    assert_int_equal(pick(5, 8, -1, 1, 2, &dev), DT_OK);
    assert_int_equal(dev, 1);
}

static void test_refusals(void **state)
{
    (void)state;
    int dev;
    assert_int_equal(pick(0, 3, -1, -1, 2, &dev), DT_ERR_CONFIG);
    assert_string_equal(dt_last_error(),
                        "device/cuda: init: 3 local ranks on this machine but 2 CUDA "
                        "devices: the cuda device runs one GPU per local rank (start at "
                        "most 2 ranks per machine, or set device_index to place ranks "
                        "yourself)");
    assert_int_equal(pick(0, 2, -1, -1, 1, &dev), DT_ERR_CONFIG);
    assert_string_equal(dt_last_error(),
                        "device/cuda: init: 2 local ranks on this machine but 1 CUDA "
                        "device: the cuda device runs one GPU per local rank (start at "
                        "most 1 rank per machine, or set device_index to place ranks "
                        "yourself)");
    assert_int_equal(pick(0, 1, -1, 4, 4, &dev), DT_ERR_CONFIG);
    assert_string_equal(dt_last_error(),
                        "device/cuda: init: device_index = 4 but this machine has 4 CUDA "
                        "devices (0..3)");
    assert_int_equal(pick(0, 1, 2, -1, 1, &dev), DT_ERR_CONFIG);
    assert_string_equal(dt_last_error(),
                        "device/cuda: init: device 2 was asked for, but this machine has 1 "
                        "CUDA device (0..0)");
    assert_int_equal(pick(2, 2, -1, -1, 4, &dev), DT_ERR_CONFIG);
    assert_string_equal(dt_last_error(),
                        "device/cuda: init: local rank 2 is not below the 2 local ranks");
    assert_int_equal(dev, -7); /* untouched on a refusal */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_rank),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
