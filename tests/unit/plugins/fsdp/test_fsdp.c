/*
 * tests/unit/plugins/fsdp/test_fsdp.c - the `fsdp` strategy plugin (FSDP's sharding
 * strategies on the SDK's sharded engine), loaded with dlopen and driven
 * through its ops table in the core's hook order.
 *
 * Device-parametrized: `test_fsdp [cpu|cuda]` (toy_train.h's backends:
 * cpu + shm, or cuda + nccl with one GPU per rank; ctest's
 * unit.test_fsdp.cuda, label gpu, is skipped without 4 GPUs).  The cuda
 * variant has not yet run on a GPU.
 *
 * Numbers: every sharding strategy at 2, 3 and 4 ranks (forked, over the
 * communicator), with the wrap, prefetch and resharding knobs varied between
 * runs, trains the toy model (tests/support/toy_model.h) for three steps
 * of two micro-steps and must match the float64 single-process reference
 * (tests/support/toy_train.h), with the device's tagged memory equal to
 * the plugin's estimate.  FULL_SHARD must be ZeRO stage 3: same memory,
 * same traffic, the same bits after training.
 */
#include <math.h>
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
#include "toy_train.h"

static const dt_strategy_ops_v1_t *F, *Z;
static const dt_device_ops_v1_t *D;
static const dt_comm_ops_v1_t *COMM;
static dt_toy_run_t *run, *run2;

static int group_setup(void **state)
{
    F = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_fsdp.so", DT_ENTRY_STRING(strategy, 1),
                             NULL);
    Z = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_zero.so", DT_ENTRY_STRING(strategy, 1),
                             NULL);
    if (!F || !Z) {
        fprintf(stderr, "%s\n", dt_last_error());
        return -1;
    }
    dt_toy_run_t *runs[2];
    int rc = dt_toy_setup(DT_TEST_PLUGIN_DIR, &D, &COMM, runs, 2);
    run = runs[0];
    run2 = runs[1];
    return rc;
}

/* The standard AdamW run (toy_train.h) of strategy S with `kv`. */
static void setup_run(dt_toy_run_t *r, const dt_strategy_ops_v1_t *S, const char *prefix,
                      const dt_test_kv_t *kv, int param_dtype, int eval_first)
{
    *r = (dt_toy_run_t){.S = S, .prefix = prefix, .D = D, .C = COMM, .kv = kv,
                        .param_dtype = param_dtype, .optim = DT_OPTIM_ADAMW,
                        .eval_first = eval_first, DT_TOY_RUN_STANDARD};
}

static void train_and_check(const dt_test_kv_t *kv, int size, int eval_first)
{
    setup_run(run, F, "strategy/fsdp", kv, DT_F32, eval_first);
    dt_toy_train_check(run, size, &dt_toy_tol_f32);
}

/* ------------------------------------------------ training, per strategy */

/* Default knobs; forward prefetch with BACKWARD_POST and one gather in
 * flight; the embedding and the block wrapped as one flat parameter
 * (min_num_params 100: 50 + 79) after an evaluation pass; one rank. */
static void test_mp_full_shard(void **state)
{
    const dt_test_kv_t k2[] = {{"sharding_strategy", "FULL_SHARD"}, {NULL, NULL}};
    const dt_test_kv_t k3[] = {{"forward_prefetch", "true"},
                               {"backward_prefetch", "BACKWARD_POST"},
                               {"limit_all_gathers", "1"}, {NULL, NULL}};
    const dt_test_kv_t k4[] = {{"min_num_params", "100"}, {"forward_prefetch", "true"},
                               {NULL, NULL}};
    train_and_check(k2, 2, 0);
    train_and_check(k3, 3, 0);
    train_and_check(k4, 4, 1);
    train_and_check(k3, 1, 0); /* one rank: no collective */
}

static void test_mp_shard_grad_op(void **state)
{
    const dt_test_kv_t k2[] = {{"sharding_strategy", "SHARD_GRAD_OP"}, {NULL, NULL}};
    const dt_test_kv_t k3[] = {{"sharding_strategy", "SHARD_GRAD_OP"}, {"min_num_params", "100"},
                               {"forward_prefetch", "true"}, {NULL, NULL}};
    const dt_test_kv_t k4[] = {{"sharding_strategy", "SHARD_GRAD_OP"},
                               {"backward_prefetch", "NONE"}, {"limit_all_gathers", "0"},
                               {NULL, NULL}};
    train_and_check(k2, 2, 0);
    train_and_check(k3, 3, 1);
    train_and_check(k4, 4, 0);
}

static void test_mp_no_shard(void **state)
{
    const dt_test_kv_t k2[] = {{"sharding_strategy", "NO_SHARD"}, {NULL, NULL}};
    const dt_test_kv_t k3[] = {{"sharding_strategy", "NO_SHARD"}, {"min_num_params", "100"},
                               {NULL, NULL}};
    train_and_check(k2, 2, 0);
    train_and_check(k3, 3, 0);
    train_and_check(k2, 4, 1);
}

/* Groups of 1 (replication only), 3 (one group: FULL_SHARD) and 2 (two
 * shard groups of 2, each shard all-reduced across its 2 replicas). */
static void test_mp_hybrid_shard(void **state)
{
    const dt_test_kv_t k2[] = {{"sharding_strategy", "HYBRID_SHARD"}, {"hybrid_group_size", "1"},
                               {NULL, NULL}};
    const dt_test_kv_t k3[] = {{"sharding_strategy", "HYBRID_SHARD"}, {"hybrid_group_size", "3"},
                               {NULL, NULL}};
    const dt_test_kv_t k4[] = {{"sharding_strategy", "HYBRID_SHARD"}, {"hybrid_group_size", "2"},
                               {"forward_prefetch", "true"}, {NULL, NULL}};
    train_and_check(k2, 2, 0);
    train_and_check(k3, 3, 0);
    train_and_check(k4, 4, 0);
    /* a replica group's shards: ranks 0 and 2 hold the same elements,
     * 0 and 1 different ones */
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        assert_memory_equal(run->rank[0].held[0][u], run->rank[2].held[0][u], DT_TOY_MAXN);
    assert_int_equal(dt_toy_held_count(&run->rank[0], 0) + dt_toy_held_count(&run->rank[1], 0),
                     DT_TOY_NUMEL);
}

/* bf16 compute parameters under HYBRID_SHARD, within dt_toy_tol_bf16
 * (parameters rounded to 2^-9 relative in loss and gradient). */
static void test_mp_hybrid_bf16(void **state)
{
    const dt_test_kv_t kv[] = {{"sharding_strategy", "HYBRID_SHARD"}, {"hybrid_group_size", "2"},
                               {NULL, NULL}};
    setup_run(run, F, "strategy/fsdp", kv, DT_BF16, 0);
    dt_toy_train_check(run, 4, &dt_toy_tol_bf16);
}

/* Gradients reduced in bf16 and fp16 (reduce_dtype): FULL_SHARD's
 * reduce-scatter within dt_toy_tol_reduce_bf16 / _f16 of the float64
 * reference; HYBRID_SHARD's reduce-scatter and then all-reduce across
 * replicas round twice as often (the shard is accumulated in f32 between
 * them), so within twice those bounds. */
static void test_mp_reduce_dtype(void **state)
{
    static const char *const dts[] = {"bf16", "fp16"};
    const dt_toy_tol_t *tols[] = {&dt_toy_tol_reduce_bf16, &dt_toy_tol_reduce_f16};
    for (int d = 0; d < 2; d++) {
        const dt_test_kv_t kf[] = {{"reduce_dtype", dts[d]}, {NULL, NULL}};
        const dt_test_kv_t kh[] = {{"sharding_strategy", "HYBRID_SHARD"},
                                   {"hybrid_group_size", "2"}, {"reduce_dtype", dts[d]},
                                   {NULL, NULL}};
        setup_run(run, F, "strategy/fsdp", kf, DT_F32, 0);
        dt_toy_train_check(run, 3, tols[d]);
        dt_toy_tol_t twice = *tols[d];
        twice.p_abs *= 2, twice.mom_rel *= 2, twice.norm_rel *= 2, twice.loss_abs *= 2;
        setup_run(run, F, "strategy/fsdp", kh, DT_F32, 0);
        dt_toy_train_check(run, 4, &twice);
    }
}

/* FULL_SHARD is ZeRO stage 3 with other knobs: with prefetching off and
 * no persistent unit, the same persistent memory and traffic in the
 * estimate (the transient peak differs: fsdp caps reductions in flight at
 * two, zero by reduce_bucket_size), and, the arithmetic being the same,
 * the same bits after training. */
static void test_full_shard_is_zero3(void **state)
{
    const dt_test_kv_t kf[] = {{"sharding_strategy", "FULL_SHARD"},
                               {"backward_prefetch", "NONE"}, {NULL, NULL}};
    const dt_test_kv_t kz[] = {{"stage", "3"}, {"param_persistence_threshold", "0"},
                               {"prefetch_bucket_size", "0"}, {NULL, NULL}};
    dt_test_host_t thf, thz;
    dt_test_host_init(&thf, "strategy/fsdp", kf);
    dt_test_host_init(&thz, "strategy/zero", kz);
    dt_model_desc_v1_t m = dt_toy_model(DT_F32);
    for (int size = 2; size <= 4; size++) {
        dt_estimate_args_v1_t ea = dt_toy_est_args(&m, size, DT_F32, DT_OPTIM_ADAMW, 2);
        dt_estimate_v1_t ef = {.struct_size = sizeof ef}, ez = {.struct_size = sizeof ez};
        assert_ok(F->estimate(&thf.host, &ea, &ef));
        assert_ok(Z->estimate(&thz.host, &ea, &ez));
        const int tags[] = {DT_TAG_PARAMS, DT_TAG_GRADS, DT_TAG_OPTIMIZER, DT_TAG_OTHER};
        for (int t = 0; t < 4; t++)
            assert_int_equal(ef.bytes[tags[t]], ez.bytes[tags[t]]);
        assert_int_equal(ef.comm_bytes_per_step, ez.comm_bytes_per_step);
    }
    /* training, with fsdp's prefetching on: schedules differ, bits do not */
    const dt_test_kv_t kp[] = {{"forward_prefetch", "true"}, {NULL, NULL}};
    setup_run(run, F, "strategy/fsdp", kp, DT_F32, 0);
    setup_run(run2, Z, "strategy/zero", kz, DT_F32, 0);
    dt_toy_run(run, 3);
    dt_toy_run(run2, 3);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(run->rank[r].rc, DT_OK);
        assert_int_equal(run2->rank[r].rc, DT_OK);
        assert_memory_equal(run->rank[r].held, run2->rank[r].held, sizeof run->rank[r].held);
        assert_memory_equal(run->rank[r].state, run2->rank[r].state, sizeof run->rank[r].state);
        assert_memory_equal(run->rank[r].norm, run2->rank[r].norm, sizeof run->rank[r].norm);
    }
}

/* ------------------------------------------------ memory */

/* Model state per rank for the ZeRO paper's 7.5B model on 64 ranks with
 * mixed-precision Adam (2 + 2 + 12 bytes per parameter), GB = 1e9, within
 * 1%: NO_SHARD is the paper's replicated baseline, 120 GB; FULL_SHARD and
 * SHARD_GRAD_OP hold 1/64 of it at rest (1.875 GB); HYBRID_SHARD over
 * groups of 8 holds 1/8 (15 GB). */
static void test_paper_figures(void **state)
{
    dt_model_desc_v1_t m = dt_toy_paper_model(DT_BF16);
    dt_estimate_args_v1_t ea = dt_toy_paper_args(&m);
    struct { const char *strategy; double gb; } want[4] = {
        {"NO_SHARD", 120.0}, {"FULL_SHARD", 1.875}, {"SHARD_GRAD_OP", 1.875},
        {"HYBRID_SHARD", 15.0}};
    for (int k = 0; k < 4; k++) {
        const dt_test_kv_t kv[] = {{"sharding_strategy", want[k].strategy},
                                   {"hybrid_group_size", "8"}, {NULL, NULL}};
        dt_test_host_t th;
        dt_test_host_init(&th, "strategy/fsdp", kv);
        dt_estimate_v1_t est = {.struct_size = sizeof(dt_estimate_v1_t)};
        assert_ok(F->estimate(&th.host, &ea, &est));
        double gb = dt_toy_model_state(&est) / 1e9;
        if (fabs(gb - want[k].gb) > 0.01 * want[k].gb)
            fail_msg("%s: %.4g GB per rank, want %.4g", want[k].strategy, gb, want[k].gb);
        assert_non_null(strstr(est.note, want[k].strategy));
    }
}

/* ------------------------------------------------ configuration */

/* A group of 4 ranks that answers rank_size only: enough for init to
 * reject a configuration before any collective. */
struct dt_comm {
    const dt_comm_ops_v1_t *ops; /* first: &fake_comm (dtrain/comm.h) */
    int32_t size;
};
static int fc_rank_size(dt_comm_t *c, int32_t *r, int32_t *s)
{
    *r = 0;
    *s = c->size;
    return DT_OK;
}
static const dt_comm_ops_v1_t fake_comm = {
    .info = {.abi_major = DT_COMM_ABI_MAJOR, .struct_size = sizeof(dt_comm_ops_v1_t),
             .kind = DT_KIND_COMM, .name = "fake"},
    .rank_size = fc_rank_size,
};

static const dt_optim_desc_v1_t toy_optim = {.struct_size = sizeof toy_optim,
                                               .kind = DT_OPTIM_ADAMW};

static void test_config_errors(void **state)
{
    struct dt_comm four = {&fake_comm, 4};
    dt_model_desc_v1_t m = dt_toy_model(DT_F32);
    dt_strategy_init_v1_t a = {
        .struct_size = sizeof a, .n_micro = 1, .model = &m, .comm = &four, .optim = &toy_optim};
    dt_estimate_args_v1_t ea = dt_toy_est_args(&m, 4, DT_F32, DT_OPTIM_ADAMW, 1);
    struct { dt_test_kv_t kv[3]; const char *msg; } cases[] = {
        {{{"sharding_strategy", "ZERO3"}, {NULL, NULL}},
         "strategy/fsdp: sharding_strategy = \"ZERO3\" is not one of the valid choices: "
         "FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD"},
        {{{"sharding_strategy", "HYBRID_SHARD"}, {"hybrid_group_size", "3"}, {NULL, NULL}},
         "strategy/fsdp: hybrid_group_size = 3 does not divide the data-parallel world of 4 "
         "ranks"},
        {{{"sharding_strategy", "HYBRID_SHARD"}, {"hybrid_group_size", "8"}, {NULL, NULL}},
         "hybrid_group_size = 8 does not divide the data-parallel world of 4 ranks"},
        {{{"sharding_strategy", "HYBRID_SHARD"}, {NULL, NULL}},
         "sharding_strategy = \"HYBRID_SHARD\" needs hybrid_group_size (ranks per shard "
         "group, dividing the data-parallel world of 4 ranks)"},
        {{{"backward_prefetch", "BACKWARD"}, {NULL, NULL}},
         "backward_prefetch = \"BACKWARD\" is not one of the valid choices: BACKWARD_PRE, "
         "BACKWARD_POST, NONE"},
        {{{"reduce_dtype", "float16"}, {NULL, NULL}},
         "strategy/fsdp: reduce_dtype = \"float16\" is not one of the valid choices: fp32, "
         "bf16, fp16"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        dt_test_host_t th;
        dt_test_host_init(&th, "strategy/fsdp", cases[k].kv);
        dt_strategy_t *s = (dt_strategy_t *)&a;
        assert_status(F->init(&th.host, &a, &s), DT_ERR_CONFIG);
        assert_msg_has(cases[k].msg);
        assert_null(s);
        dt_estimate_v1_t est = {.struct_size = sizeof(dt_estimate_v1_t)};
        assert_status(F->estimate(&th.host, &ea, &est), DT_ERR_CONFIG);
        assert_msg_has(cases[k].msg);
        assert_int_equal(th.mem.current[DT_TAG_OTHER], 0);
    }
    /* a declared range: the core refuses the value before init */
    const dt_test_kv_t neg[] = {{"limit_all_gathers", "-1"}, {NULL, NULL}};
    assert_status(dt_test_schema_check(&F->info, neg), DT_ERR_CONFIG);
    assert_msg_has("[fsdp] limit_all_gathers = -1 is out of range (allowed 0 .. 1000000000)");
    /* the declared schema lists the choices for the core's validation */
    assert_int_equal(F->info.n_config_keys, 9);
    assert_string_equal(F->info.config_keys[0].name, "sharding_strategy");
    assert_int_equal(F->info.config_keys[0].type, DT_CFG_ENUM);
    assert_string_equal(F->info.config_keys[0].choices,
                        "FULL_SHARD|SHARD_GRAD_OP|NO_SHARD|HYBRID_SHARD");
    assert_string_equal(F->info.config_keys[0].def, "\"FULL_SHARD\"");
    assert_string_equal(F->info.config_keys[4].choices, "BACKWARD_PRE|BACKWARD_POST|NONE");
    assert_string_equal(F->info.config_keys[7].name, "reduce_dtype");
    assert_string_equal(F->info.config_keys[7].choices, "fp32|bf16|fp16");
    assert_string_equal(F->info.config_keys[8].name, "offload_what");
    assert_string_equal(F->info.config_keys[8].choices, "optimizer|params|optimizer_and_params");
}

/* `dtrain plan`'s rows: one per sharding strategy, in the order the
 * table shows them, each of whose settings selects that strategy through
 * the plugin's own table (the estimate's note names it). */
static void test_plan_presets(void **state)
{
    assert_true(DT_HAS_OP(dt_strategy_ops_v1_t, F, plan_presets));
    const dt_plan_preset_v1_t *p = NULL;
    uint32_t n = 0;
    assert_ok(F->plan_presets(&p, &n));
    static const char *const names[] = {"NO_SHARD", "SHARD_GRAD_OP", "FULL_SHARD",
                                        "HYBRID_SHARD"};
    assert_int_equal(n, 4);
    dt_model_desc_v1_t m = dt_toy_model(DT_F32);
    dt_estimate_args_v1_t ea = dt_toy_est_args(&m, 4, DT_F32, DT_OPTIM_ADAMW, 1);
    for (uint32_t i = 0; i < n; i++) {
        char label[32], set[64];
        snprintf(label, sizeof label, "fsdp %s", names[i]);
        snprintf(set, sizeof set, "sharding_strategy=%s", names[i]);
        assert_string_equal(p[i].label, label);
        assert_string_equal(p[i].set, set);
        /* the settings select that strategy through the plugin's table */
        char key[32];
        const char *eq = strchr(p[i].set, '=');
        assert_non_null(eq);
        snprintf(key, sizeof key, "%.*s", (int)(eq - p[i].set), p[i].set);
        const dt_test_kv_t kv[] = {{key, eq + 1}, {"hybrid_group_size", "2"}, {NULL, NULL}};
        dt_test_host_t th;
        dt_test_host_init(&th, "strategy/fsdp", kv);
        dt_estimate_v1_t e = {.struct_size = sizeof e};
        assert_ok(F->estimate(&th.host, &ea, &e));
        assert_non_null(strstr(e.note, label));
    }
    assert_status(F->plan_presets(&p, NULL), DT_ERR_INVALID);
}

static const char *trace_run(const dt_test_kv_t *kv, int size, uint32_t n_micro)
{
    setup_run(run, F, "strategy/fsdp", kv, DT_F32, 0);
    return dt_toy_trace_run(run, size, n_micro);
}

/* Where communication happens, from rank 0's trace (toy_train.h tokens);
 * shards of 32, 48 and 16 elements at 2 ranks (units padded to 64, 96,
 * 32). */
static void test_schedule(void **state)
{
    /* FULL_SHARD, forward_prefetch and BACKWARD_POST: the next unit gathered
     * right after the current one in forward; in backward, the previous
     * one once the current unit's gradient is out */
    const dt_test_kv_t kf[] = {{"forward_prefetch", "true"},
                               {"backward_prefetch", "BACKWARD_POST"}, {NULL, NULL}};
    assert_string_equal(trace_run(kf, 2, 1),
                        "L T F0 AG32/2 AG48/2 f0 F1 AG16/2 f1 F2 F0 AG32/2 f0 f2 B2 AG16/2 B0 "
                        "AG32/2 b0 b2! RS16/2 AG48/2 B1 b1! RS48/2 AG32/2 B0 b0! RS32/2 S "
                        "AR1/2");
    /* SHARD_GRAD_OP: gathered in forward, kept through backward (no second
     * gather, the tied embedding not regathered), every micro-step */
    const dt_test_kv_t ks[] = {{"sharding_strategy", "SHARD_GRAD_OP"}, {NULL, NULL}};
    const char *t = trace_run(ks, 2, 2);
    const char *sgo = "F0 AG32/2 f0 F1 AG48/2 f1 F2 AG16/2 F0 f0 f2 B2 B0 b0 b2! RS16/2 B1 b1! "
                      "RS48/2 B0 b0! RS32/2";
    char want[1024];
    snprintf(want, sizeof want, "L T %s %s S AR1/2", sgo, sgo);
    assert_string_equal(t, want);
    /* NO_SHARD: DDP: gradients accumulate locally and are all-reduced unit
     * by unit in the final micro-step; the norm needs no collective */
    const dt_test_kv_t kn[] = {{"sharding_strategy", "NO_SHARD"}, {NULL, NULL}};
    assert_string_equal(trace_run(kn, 2, 2),
                        "L T F0 f0 F1 f1 F2 F0 f0 f2 B2 B0 b0 b2! B1 b1! B0 b0! F0 f0 F1 f1 F2 "
                        "F0 f0 f2 B2 B0 b0 b2! AR16/2 B1 b1! AR80/2 B0 b0! AR64/2 S");
    /* HYBRID_SHARD, 2 x 2: gathers and reduce-scatters inside the shard
     * group of 2, each shard all-reduced across its 2 replicas after the
     * final micro-step's reduce-scatter (at most two reductions in flight),
     * the norm over the shard group only */
    const dt_test_kv_t kh[] = {{"sharding_strategy", "HYBRID_SHARD"}, {"hybrid_group_size", "2"},
                               {NULL, NULL}};
    t = trace_run(kh, 4, 2);
    const char *first = strstr(t, "AR");
    assert_non_null(first);
    assert_ptr_equal(first, strstr(t, "B0 b0! AR16/2 AR48/2 RS32/2 S AR32/2 AR1/2") + 7);
    assert_null(strstr(t, "/4"));
}

int main(int argc, char **argv)
{
    int rc = dt_toy_backend_select(argc, argv, 4);
    if (rc >= 0)
        return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_plan_presets),
        cmocka_unit_test(test_paper_figures),
        cmocka_unit_test(test_mp_full_shard),
        cmocka_unit_test(test_mp_shard_grad_op),
        cmocka_unit_test(test_mp_no_shard),
        cmocka_unit_test(test_mp_hybrid_shard),
        cmocka_unit_test(test_mp_hybrid_bf16),
        cmocka_unit_test(test_mp_reduce_dtype),
        cmocka_unit_test(test_full_shard_is_zero3),
        cmocka_unit_test(test_schedule),
    };
    return cmocka_run_group_tests_name(dt_toy_backend_label(), tests, group_setup, NULL);
}
