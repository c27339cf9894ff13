/*
 * tests/unit/sdk/test_abi.c - the ABI growth rule (dtrain/abi.h) on its own and
 * as real plugins apply it: an older caller's smaller struct, a newer
 * caller's larger one (zero or set tail), a struct below its minor-0 size,
 * result structs written only as far as the caller's struct_size reaches,
 * per-tag arrays with a count, DT_HAS_OP on a short table.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "test_assert.h"
#include "test_host.h"
#include "test_plugin.h"
#include "toy_model.h"
#include "toy_train.h"
#include "config/config.h"
#include "util/error.h"

/* A struct as a newer minor would have it: minor 0's fields, then two. */
typedef struct v_new {
    uint32_t struct_size;
    uint32_t a;
    uint64_t b;
    /* ---- minor 0 ends here ---- */
    uint64_t c;
    uint64_t d;
} v_new_t;
typedef struct v_old {
    uint32_t struct_size;
    uint32_t a;
    uint64_t b;
} v_old_t;
#define V_SIZE0 DT_FIELD_END(v_new_t, b)

static void test_read_older_caller(void **state)
{
    (void)state;
    v_old_t old = {.struct_size = sizeof old, .a = 7, .b = 9};
    v_new_t got;
    memset(&got, 0xAB, sizeof got);
    assert_int_equal(dt_struct_read(&got, sizeof got, &old, V_SIZE0), DT_OK);
    assert_int_equal(got.struct_size, sizeof got);
    assert_int_equal(got.a, 7);
    assert_int_equal(got.b, 9);
    assert_int_equal(got.c, 0); /* absent fields read as zero */
    assert_int_equal(got.d, 0);
}

static void test_read_newer_caller(void **state)
{
    (void)state;
    v_new_t nw = {.struct_size = sizeof nw, .a = 1, .b = 2};
    v_old_t got = {0};
    /* fields the reader does not know, all zero: fine */
    assert_int_equal(dt_struct_read(&got, sizeof got, &nw, V_SIZE0), DT_OK);
    assert_int_equal(got.struct_size, sizeof got);
    assert_int_equal(got.a, 1);
    assert_int_equal(got.b, 2);
    /* a field set that the reader does not know: refused, never ignored */
    nw.d = 5;
    assert_int_equal(dt_struct_read(&got, sizeof got, &nw, V_SIZE0), DT_ERR_UNSUPPORTED);
    assert_int_equal(dt_struct_check(&nw, sizeof got, V_SIZE0), DT_ERR_UNSUPPORTED);
    assert_int_equal(dt_struct_check(&nw, sizeof nw, V_SIZE0), DT_OK);
}

static void test_read_too_small(void **state)
{
    (void)state;
    v_new_t nw = {.struct_size = (uint32_t)V_SIZE0 - 1, .a = 1};
    v_new_t got;
    assert_int_equal(dt_struct_read(&got, sizeof got, &nw, V_SIZE0), DT_ERR_ABI);
    assert_int_equal(dt_struct_read(&got, sizeof got, NULL, V_SIZE0), DT_ERR_ABI);
    nw.struct_size = 0;
    assert_int_equal(dt_struct_check(&nw, sizeof nw, V_SIZE0), DT_ERR_ABI);
}

static void test_write_stops_at_callers_size(void **state)
{
    (void)state;
    v_new_t full = {.struct_size = sizeof full, .a = 1, .b = 2, .c = 3, .d = 4};
    /* an older caller: only its bytes are written, its struct_size kept */
    struct {
        v_old_t old;
        uint64_t guard;
    } dst;
    memset(&dst, 0, sizeof dst);
    dst.old.struct_size = sizeof dst.old;
    dst.guard = 0x5151515151515151ull;
    assert_int_equal(dt_struct_write(&dst.old, &full, sizeof full, V_SIZE0), DT_OK);
    assert_int_equal(dst.old.struct_size, sizeof dst.old);
    assert_int_equal(dst.old.a, 1);
    assert_int_equal(dst.old.b, 2);
    assert_true(dst.guard == 0x5151515151515151ull);
    /* a newer caller than the writer: the writer's fields, the rest as the
     * caller zero-filled them */
    v_old_t small = {.struct_size = sizeof small, .a = 8, .b = 9};
    v_new_t big = {.struct_size = sizeof big};
    assert_int_equal(dt_struct_write(&big, &small, sizeof small, V_SIZE0), DT_OK);
    assert_int_equal(big.struct_size, sizeof big);
    assert_int_equal(big.a, 8);
    assert_int_equal(big.c, 0);
    v_old_t tiny = {.struct_size = 4};
    assert_int_equal(dt_struct_write(&tiny, &full, sizeof full, V_SIZE0), DT_ERR_ABI);
}

static void test_has_op_on_short_table(void **state)
{
    (void)state;
    /* a comm table built before `test` and `cleanup_job` existed */
    dt_comm_ops_v1_t t;
    memset(&t, 0, sizeof t);
    t.test = (int (*)(dt_comm_t *, dt_comm_req_t *, int *))1;
    t.info.struct_size = (uint32_t)offsetof(dt_comm_ops_v1_t, test);
    assert_false(DT_HAS_OP(dt_comm_ops_v1_t, &t, test)); /* past the table: absent */
    t.info.struct_size = (uint32_t)sizeof t;
    assert_true(DT_HAS_OP(dt_comm_ops_v1_t, &t, test));
    assert_false(DT_HAS_OP(dt_comm_ops_v1_t, &t, cleanup_job)); /* NULL: absent */
}

static void test_tag_bytes_counts(void **state)
{
    (void)state;
    uint64_t per_tag[DT_TAG_CAPACITY] = {0};
    per_tag[DT_TAG_OFFLOAD] = 42;
    assert_int_equal(dt_tag_bytes(per_tag, DT_TAG_COUNT, DT_TAG_OFFLOAD), 42);
    /* a writer that knew 7 tags never filled the offload entry */
    assert_int_equal(dt_tag_bytes(per_tag, DT_TAG_OFFLOAD, DT_TAG_OFFLOAD), 0);
    assert_int_equal(dt_tag_bytes(per_tag, DT_TAG_COUNT, -1), 0);
    assert_int_equal(dt_tag_bytes(per_tag, DT_TAG_CAPACITY, DT_TAG_CAPACITY), 0);
    assert_string_equal(dt_mem_tag_name(DT_TAG_OFFLOAD), "offload");
}

/* ---- real plugins apply the rule ---- */

static const dt_device_ops_v1_t *cpu(void)
{
    static const dt_device_ops_v1_t *ops;
    if (!ops && !(ops = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_cpu.so",
                                             DT_ENTRY_STRING(device, 1), NULL)))
        fail_msg("%s", dt_last_error());
    return ops;
}

static void test_cpu_init_args(void **state)
{
    (void)state;
    dt_test_host_t th;
    dt_test_host_init(&th, "device/cpu", NULL);
    dt_device_t *dev = NULL;
    /* a newer core that set a field this plugin does not know */
    struct {
        dt_device_init_v1_t a;
        uint64_t extra;
    } nw;
    memset(&nw, 0, sizeof nw);
    nw.a.struct_size = sizeof nw;
    nw.a.local_size = 1;
    nw.extra = 1;
    assert_status(cpu()->init(&th.host, &nw.a, &dev), DT_ERR_UNSUPPORTED);
    char want[200];
    snprintf(want, sizeof want,
             "device/cpu: init args: the caller (struct_size %zu) set fields past the %zu "
             "bytes this plugin knows; it needs a newer plugin",
             sizeof nw, sizeof(dt_device_init_v1_t));
    assert_msg(want);
    assert_null(dev);
    /* the same with the new field zero: accepted */
    nw.extra = 0;
    assert_ok(cpu()->init(&th.host, &nw.a, &dev));
    /* results: a caller whose struct is larger than the plugin's gets the
     * plugin's fields and its own zeroed tail back */
    struct {
        dt_device_props_v1_t p;
        uint64_t extra;
    } props;
    memset(&props, 0, sizeof props);
    props.p.struct_size = sizeof props;
    assert_ok(cpu()->props(dev, &props.p));
    assert_int_equal(props.p.struct_size, sizeof props);
    assert_int_equal(props.p.host_visible, 1);
    assert_int_equal(props.extra, 0);
    dt_mem_stats_t st = {.struct_size = sizeof st};
    void *p = NULL;
    assert_ok(cpu()->alloc(dev, 4096, DT_TAG_OFFLOAD, &p));
    assert_ok(cpu()->mem_stats(dev, &st));
    assert_int_equal(st.n_tags, DT_TAG_COUNT);
    assert_true(dt_tag_bytes(st.current, st.n_tags, DT_TAG_OFFLOAD) >= 4096);
    assert_ok(cpu()->free(dev, p));
    /* a caller below minor 0 */
    dt_mem_stats_t bad = {.struct_size = 8};
    assert_status(cpu()->mem_stats(dev, &bad), DT_ERR_ABI);
    assert_msg_has("device/cpu: mem_stats: struct_size 8 is below the");
    cpu()->finalize(dev);
    /* init args below minor 0 */
    dt_device_init_v1_t tiny = {.struct_size = 4};
    assert_status(cpu()->init(&th.host, &tiny, &dev), DT_ERR_ABI);
    assert_msg_has("device/cpu: init args: struct_size 4 is below the");
}

/* Both data-parallel strategy families refuse estimate args the same way
 * (they used to return different statuses for the same condition). */
static void test_strategies_agree_on_args(void **state)
{
    (void)state;
    const char *plugins[] = {"ddp", "zero", "fsdp"};
    dt_model_desc_v1_t m = dt_toy_model(DT_F32);
    for (size_t k = 0; k < 3; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/dtrain_%s.so", DT_TEST_PLUGIN_DIR, plugins[k]);
        const dt_strategy_ops_v1_t *S =
            dt_test_plugin_entry(path, DT_ENTRY_STRING(strategy, 1), NULL);
        if (!S)
            fail_msg("%s", dt_last_error());
        const dt_test_kv_t kv[] = {{"stage", "2"}, {NULL, NULL}};
        dt_test_host_t th;
        char who[64];
        snprintf(who, sizeof who, "strategy/%s", plugins[k]);
        dt_test_host_init(&th, who, k == 1 ? kv : NULL);
        dt_estimate_args_v1_t ea = dt_toy_est_args(&m, 2, DT_F32, DT_OPTIM_ADAMW, 1);
        dt_estimate_v1_t est = {.struct_size = sizeof est};
        assert_ok(S->estimate(&th.host, &ea, &est));
        assert_int_equal(est.n_tags, DT_TAG_COUNT);
        assert_true(est.bytes[DT_TAG_PARAMS] > 0);
        ea.struct_size = 8;
        assert_status(S->estimate(&th.host, &ea, &est), DT_ERR_ABI);
        assert_msg_has("estimate args: struct_size 8 is below the");
        ea.struct_size = sizeof ea;
        dt_estimate_v1_t small = {.struct_size = 16};
        assert_status(S->estimate(&th.host, &ea, &small), DT_ERR_ABI);
        assert_msg_has("estimate: struct_size 16 is below the");
    }
}

/* Config keys: leaving min and max out (both 0) means no range, so no
 * plugin hand-writes a sentinel; DT_CFG_RANGE sets one. */
static void test_config_key_ranges(void **state)
{
    (void)state;
    static const dt_config_key_t keys[] = {
        {.name = "free", .type = DT_CFG_INT, .def = "5", .doc = "no range"},
        {.name = "ranged", .type = DT_CFG_INT, .def = "1", DT_CFG_RANGE(1, 3), .doc = "1..3"},
    };
    dt_config_t *c = NULL;
    assert_ok(dt_config_load_string("r.toml", "[p]\nfree = -7000000000000\nranged = 3\n", &c));
    assert_ok(dt_config_apply_schema(c, "p", keys, 2));
    int64_t v = 0;
    assert_ok(dt_config_get_int(c, "p.free", &v));
    assert_true(v == -7000000000000ll);
    dt_config_free(c);
    assert_ok(dt_config_load_string("r.toml", "[p]\nranged = 4\n", &c));
    assert_status(dt_config_apply_schema(c, "p", keys, 2), DT_ERR_CONFIG);
    assert_msg_has("r.toml:2:10: [p] ranged = 4 is out of range (allowed 1 .. 3)");
    dt_config_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_older_caller),
        cmocka_unit_test(test_read_newer_caller),
        cmocka_unit_test(test_read_too_small),
        cmocka_unit_test(test_write_stops_at_callers_size),
        cmocka_unit_test(test_has_op_on_short_table),
        cmocka_unit_test(test_tag_bytes_counts),
        cmocka_unit_test(test_cpu_init_args),
        cmocka_unit_test(test_strategies_agree_on_args),
        cmocka_unit_test(test_config_key_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
