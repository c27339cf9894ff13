/*
 * tests/unit/plugins/zero/test_zero.c - the `zero` strategy plugin (ZeRO stages 1-3 on
 * the SDK's sharded engine), loaded with dlopen and driven through its ops
 * table in the core's hook order.
 *
 * Device-parametrized: `test_zero [cpu|cuda]` (toy_train.h's backends:
 * cpu + shm, or cuda + nccl with one GPU per rank; ctest's
 * unit.test_zero.cuda, label gpu, is skipped without 4 GPUs).  Host code
 * reads and writes the strategy's buffers only through the device's
 * copies (dt_toy_read / dt_toy_write).  The cuda variant has not yet run
 * on a GPU.
 *
 * Numbers: every stage at 2, 3 and 4 ranks (forked, over the communicator)
 * trains the toy model (tests/support/toy_model.h: 50 + 79 + 10
 * parameters, no world size divides them) for three steps of two
 * micro-steps, clipped in the first and third, and must match the float64
 * single-process reference (tests/support/toy_train.h checks losses,
 * norms, every held state element, and that SAVE ranges partition the
 * model).  The device's tagged memory after training must equal the
 * plugin's estimate.  Memory per stage, the ZeRO paper's figures and
 * config errors are checked without forking.
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
#include "dtrain/sdk_helpers.h"
#include "mp_check.h"
#include "test_assert.h"
#include "test_host.h"
#include "test_plugin.h"
#include "toy_train.h"

static const dt_strategy_ops_v1_t *Z;
static const dt_device_ops_v1_t *D;
static const dt_comm_ops_v1_t *COMM;
static dt_toy_run_t *run;

static int group_setup(void **state)
{
    Z = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_zero.so", DT_ENTRY_STRING(strategy, 1),
                             NULL);
    if (!Z) {
        fprintf(stderr, "%s\n", dt_last_error());
        return -1;
    }
    return dt_toy_setup(DT_TEST_PLUGIN_DIR, &D, &COMM, &run, 1);
}

/* The standard run (toy_train.h) of `kv` at `size` ranks. */
static void setup_run(const dt_test_kv_t *kv, int param_dtype, int optim, int eval_first)
{
    *run = (dt_toy_run_t){.S = Z, .prefix = "strategy/zero", .D = D, .C = COMM, .kv = kv,
                          .param_dtype = param_dtype, .optim = optim,
                          .eval_first = eval_first, DT_TOY_RUN_STANDARD};
}

static void train_and_check(const dt_test_kv_t *kv, int size, int param_dtype, int optim,
                            int eval_first, const dt_toy_tol_t *tol)
{
    setup_run(kv, param_dtype, optim, eval_first);
    dt_toy_train_check(run, size, tol);
}

/* ------------------------------------------------ training, per stage */

/* Stage 1: without overlap (all reductions in step), three buckets with
 * a parameter all-gather cap below the model, one bucket. */
static void test_mp_stage1(void **state)
{
    const dt_test_kv_t k2[] = {{"stage", "1"}, {"overlap_comm", "false"}, {NULL, NULL}};
    const dt_test_kv_t k3[] = {{"stage", "1"}, {"reduce_bucket_size", "60"},
                               {"allgather_bucket_size", "100"}, {NULL, NULL}};
    const dt_test_kv_t k4[] = {{"stage", "1"}, {NULL, NULL}};
    train_and_check(k2, 2, DT_F32, DT_OPTIM_ADAMW, 0, &dt_toy_tol_f32);
    train_and_check(k3, 3, DT_F32, DT_OPTIM_ADAMW, 0, &dt_toy_tol_f32);
    train_and_check(k4, 4, DT_F32, DT_OPTIM_ADAMW, 1, &dt_toy_tol_f32);
}

/* Stage 2: one bucket, three buckets reduced blocking (no overlap), two
 * buckets (head + block, embedding); SGD with momentum once. */
static void test_mp_stage2(void **state)
{
    const dt_test_kv_t k2[] = {{"stage", "2"}, {NULL, NULL}};
    const dt_test_kv_t k3[] = {{"stage", "2"}, {"reduce_bucket_size", "60"},
                               {"overlap_comm", "false"}, {NULL, NULL}};
    const dt_test_kv_t k4[] = {{"stage", "2"}, {"reduce_bucket_size", "100"}, {NULL, NULL}};
    train_and_check(k2, 2, DT_F32, DT_OPTIM_ADAMW, 0, &dt_toy_tol_f32);
    train_and_check(k3, 3, DT_F32, DT_OPTIM_ADAMW, 0, &dt_toy_tol_f32);
    train_and_check(k4, 4, DT_F32, DT_OPTIM_ADAMW, 0, &dt_toy_tol_f32);
    train_and_check(k2, 2, DT_F32, DT_OPTIM_SGD, 0, &dt_toy_tol_f32);
}

/* Stage 3: no prefetch and nothing persistent; the head persistent, all
 * units prefetched, one reduction in flight; prefetch of about one unit,
 * blocking reductions, an evaluation pass first; and alone. */
static void test_mp_stage3(void **state)
{
    const dt_test_kv_t k2[] = {{"stage", "3"}, {"param_persistence_threshold", "0"},
                               {"prefetch_bucket_size", "0"}, {NULL, NULL}};
    const dt_test_kv_t k3[] = {{"stage", "3"}, {"param_persistence_threshold", "20"},
                               {"prefetch_bucket_size", "1000"}, {"reduce_bucket_size", "1"},
                               {NULL, NULL}};
    const dt_test_kv_t k4[] = {{"stage", "3"}, {"param_persistence_threshold", "0"},
                               {"prefetch_bucket_size", "100"}, {"overlap_comm", "false"},
                               {NULL, NULL}};
    train_and_check(k2, 2, DT_F32, DT_OPTIM_ADAMW, 0, &dt_toy_tol_f32);
    train_and_check(k3, 3, DT_F32, DT_OPTIM_ADAMW, 0, &dt_toy_tol_f32);
    train_and_check(k4, 4, DT_F32, DT_OPTIM_ADAMW, 1, &dt_toy_tol_f32);
    /* one rank: no collective */
    train_and_check(k3, 1, DT_F32, DT_OPTIM_ADAMW, 0, &dt_toy_tol_f32);
}

/* bf16 compute parameters (f32 master shards), within dt_toy_tol_bf16. */
static void test_mp_bf16(void **state)
{
    const dt_test_kv_t k3[] = {{"stage", "3"}, {"param_persistence_threshold", "20"},
                               {NULL, NULL}};
    const dt_test_kv_t k1[] = {{"stage", "1"}, {"reduce_bucket_size", "60"}, {NULL, NULL}};
    train_and_check(k3, 3, DT_BF16, DT_OPTIM_ADAMW, 0, &dt_toy_tol_bf16);
    train_and_check(k1, 2, DT_BF16, DT_OPTIM_ADAMW, 0, &dt_toy_tol_bf16);
}

/* Gradients reduced in bf16 and fp16 (reduce_dtype) under each stage's
 * reduction: stage 1 in place in the full gradient, stage 2 through
 * transient buffers in buckets, stage 3 per unit; f32 parameters, within
 * dt_toy_tol_reduce_bf16 / _f16 of the float64 reference (which reduces
 * in f64), and the planner's estimate counting the wire buffers. */
static void test_mp_reduce_dtype(void **state)
{
    static const char *const dts[] = {"bf16", "fp16"};
    const dt_toy_tol_t *tols[] = {&dt_toy_tol_reduce_bf16, &dt_toy_tol_reduce_f16};
    for (int d = 0; d < 2; d++) {
        const dt_test_kv_t k1[] = {{"stage", "1"}, {"reduce_dtype", dts[d]}, {NULL, NULL}};
        const dt_test_kv_t k2[] = {{"stage", "2"}, {"reduce_bucket_size", "60"},
                                   {"reduce_dtype", dts[d]}, {NULL, NULL}};
        const dt_test_kv_t k3[] = {{"stage", "3"}, {"param_persistence_threshold", "0"},
                                   {"reduce_dtype", dts[d]}, {NULL, NULL}};
        train_and_check(k1, 2, DT_F32, DT_OPTIM_ADAMW, 0, tols[d]);
        train_and_check(k2, 3, DT_F32, DT_OPTIM_ADAMW, 0, tols[d]);
        train_and_check(k3, 3, DT_F32, DT_OPTIM_ADAMW, 0, tols[d]);
    }
}

/* ------------------------------------------------ memory per stage */

/* What each stage keeps on 3 ranks, f32 AdamW, by hand from the layout:
 * stages 1-2 with one bucket: units at 0, 64, 144 (16-element starts),
 * 154 elements padded to 3 x 64 = 192 (F), shard 64 (S).  Stage 3, one
 * group per unit: shards 32 + 32 + 16 = 80. */
/* With [parallel] offload set (estimate args' offload), what offload_what
 * sends to the tier leaves the device tags for DT_TAG_OFFLOAD, as the
 * engine allocates it (toy model, 3 ranks, f32 AdamW: stage 1 owns 64
 * elements, stage 2 too, stage 3 holds 80 per rank).  The optimizer takes
 * the f32 gradient shard with it (stages 2 and 3: grads 0 on the device);
 * stage 1's full gradients stay. */
static void test_memory_offloaded(void **state)
{
    (void)state;
    dt_model_desc_v1_t m = dt_toy_model(DT_F32);
    dt_estimate_args_v1_t ea = dt_toy_est_args(&m, 3, DT_F32, DT_OPTIM_ADAMW, 1);
    ea.offload = 1;
    struct { const char *stage, *what; uint64_t params, grads, optim, tier; } want[] = {
        /* master + 2 moments of 64 go to the tier; the f32 replica and the
         * full gradients stay */
        {"1", "optimizer", 192 * 4, 192 * 4, 0, 64 * 12},
        /* and the gradient shard of 64 with them */
        {"2", "optimizer", 192 * 4, 0, 0, 64 * 12 + 64 * 4},
        /* the compute shard too; persistence 0: nothing left on the device */
        {"3", "optimizer_and_params", 0, 0, 0, 80 * 12 + 80 * 4 + 80 * 4},
        /* the shard to the tier, a device master for the device optimizer,
         * the gradients on the device with it */
        {"3", "params", 80 * 4, 80 * 4, 80 * 8, 80 * 4},
    };
    for (int k = 0; k < 4; k++) {
        const dt_test_kv_t kv[] = {{"stage", want[k].stage}, {"offload_what", want[k].what},
                                   {"param_persistence_threshold", "0"}, {NULL, NULL}};
        dt_test_host_t th;
        dt_test_host_init(&th, "strategy/zero", kv);
        dt_estimate_v1_t est = {.struct_size = sizeof(dt_estimate_v1_t)};
        assert_ok(Z->estimate(&th.host, &ea, &est));
        assert_int_equal(est.bytes[DT_TAG_PARAMS], want[k].params);
        assert_int_equal(est.bytes[DT_TAG_GRADS], want[k].grads);
        assert_int_equal(est.bytes[DT_TAG_OPTIMIZER], want[k].optim);
        assert_int_equal(est.bytes[DT_TAG_OFFLOAD], want[k].tier);
    }
    /* without a tier, offload_what changes nothing */
    ea.offload = 0;
    const dt_test_kv_t kv[] = {{"stage", "1"}, {"offload_what", "optimizer"}, {NULL, NULL}};
    dt_test_host_t th;
    dt_test_host_init(&th, "strategy/zero", kv);
    dt_estimate_v1_t est = {.struct_size = sizeof(dt_estimate_v1_t)};
    assert_ok(Z->estimate(&th.host, &ea, &est));
    assert_int_equal(est.bytes[DT_TAG_OPTIMIZER], 64 * 8);
    assert_int_equal(est.bytes[DT_TAG_OFFLOAD], 0);
    /* parameters below stage 3: the planner refuses them as init does */
    ea.offload = 1;
    const dt_test_kv_t kb[] = {{"stage", "2"}, {"offload_what", "params"}, {NULL, NULL}};
    dt_test_host_init(&th, "strategy/zero", kb);
    assert_status(Z->estimate(&th.host, &ea, &est), DT_ERR_CONFIG);
    assert_msg("strategy/zero: offload_what = \"params\": parameters are offloaded only by zero "
               "stage 3 and fsdp FULL_SHARD, and this is zero stage 2; offload the optimizer "
               "state instead (offload_what = \"optimizer\")");
}

static void test_memory_per_stage(void **state)
{
    dt_model_desc_v1_t m = dt_toy_model(DT_F32);
    dt_estimate_args_v1_t ea = dt_toy_est_args(&m, 3, DT_F32, DT_OPTIM_ADAMW, 1);
    struct { const char *stage; uint64_t params, grads, optim; } want[3] = {
        {"1", 192 * 4, 192 * 4, 64 * 8},
        {"2", 192 * 4, 64 * 4, 64 * 8},
        {"3", 80 * 4, 80 * 4, 80 * 8},
    };
    for (int k = 0; k < 3; k++) {
        const dt_test_kv_t kv[] = {{"stage", want[k].stage},
                                   {"param_persistence_threshold", "0"}, {NULL, NULL}};
        dt_test_host_t th;
        dt_test_host_init(&th, "strategy/zero", kv);
        dt_estimate_v1_t est = {.struct_size = sizeof(dt_estimate_v1_t)};
        assert_ok(Z->estimate(&th.host, &ea, &est));
        assert_int_equal(est.bytes[DT_TAG_PARAMS], want[k].params);
        assert_int_equal(est.bytes[DT_TAG_GRADS], want[k].grads);
        assert_int_equal(est.bytes[DT_TAG_OPTIMIZER], want[k].optim);
        assert_int_equal(est.bytes[DT_TAG_OTHER], 8); /* the norm slot */
        assert_non_null(strstr(est.note, "zero stage"));
    }
    /* Stage 3's transient peak by hand (no prefetch, 4 ranks: padded
     * groups 64, 128, 64 elements = 256, 512, 256 bytes): the block's
     * gathered copy and gradient buffer while the head's and the
     * embedding's gradient buffers are still being reduced or accumulated:
     * 512 + 512 + 256 + 256. */
    const dt_test_kv_t kv[] = {{"stage", "3"}, {"param_persistence_threshold", "0"},
                               {"prefetch_bucket_size", "0"}, {NULL, NULL}};
    dt_test_host_t th;
    dt_test_host_init(&th, "strategy/zero", kv);
    ea = dt_toy_est_args(&m, 4, DT_F32, DT_OPTIM_ADAMW, 1);
    dt_estimate_v1_t est = {.struct_size = sizeof est}, est2 = {.struct_size = sizeof est2};
    assert_ok(Z->estimate(&th.host, &ea, &est));
    assert_int_equal(est.bytes[DT_TAG_COMM], 1536);
    /* prefetching everything ahead keeps more gathered */
    const dt_test_kv_t kvp[] = {{"stage", "3"}, {"param_persistence_threshold", "0"},
                                {"prefetch_bucket_size", "1000"}, {NULL, NULL}};
    dt_test_host_init(&th, "strategy/zero", kvp);
    assert_ok(Z->estimate(&th.host, &ea, &est2));
    assert_true(est2.bytes[DT_TAG_COMM] > est.bytes[DT_TAG_COMM]);
    /* a persistent head moves its gathered copy (64 x 4 bytes) to params */
    const dt_test_kv_t kvh[] = {{"stage", "3"}, {"param_persistence_threshold", "20"},
                                {"prefetch_bucket_size", "0"}, {NULL, NULL}};
    dt_test_host_init(&th, "strategy/zero", kvh);
    assert_ok(Z->estimate(&th.host, &ea, &est2));
    assert_int_equal(est2.bytes[DT_TAG_PARAMS], est.bytes[DT_TAG_PARAMS] + 64 * 4);
    assert_true(est2.bytes[DT_TAG_COMM] <= est.bytes[DT_TAG_COMM]);
}

/* The ZeRO paper's Figure 1: 7.5B parameters, 64 ranks, mixed-precision
 * Adam (2 + 2 + 12 bytes per parameter): model state per rank 120 GB
 * replicated (the fsdp NO_SHARD test), 31.4 GB stage 1, 16.6 GB stage 2,
 * 1.9 GB stage 3 (16 x 7.5e9 / 64 = 1.875 GB, which the paper rounds).
 * GB = 1e9 bytes; within 1%.  And its communication claim: stages 1-2
 * send what an all-reduce does, stage 3 1.5 times that (f32 throughout,
 * no tied unit: arch "paper"). */
static void test_zero_paper_figures(void **state)
{
    dt_model_desc_v1_t m = dt_toy_paper_model(DT_BF16);
    dt_estimate_args_v1_t ea = dt_toy_paper_args(&m);
    const char *stages[3] = {"1", "2", "3"};
    const double paper[3] = {31.4e9, 16.6e9, 1.875e9};
    double comm[3];
    for (int k = 0; k < 3; k++) {
        const dt_test_kv_t kv[] = {{"stage", stages[k]}, {NULL, NULL}};
        dt_test_host_t th;
        dt_test_host_init(&th, "strategy/zero", kv);
        dt_estimate_v1_t est = {.struct_size = sizeof(dt_estimate_v1_t)};
        ea.param_bytes = 2;
        ea.grad_bytes = 2;
        ea.optim_bytes = 12;
        assert_ok(Z->estimate(&th.host, &ea, &est));
        double gb = dt_toy_model_state(&est);
        if (fabs(gb - paper[k]) > 0.01 * paper[k])
            fail_msg("stage %s: %.4g GB per rank, the paper says %.4g", stages[k], gb / 1e9,
                     paper[k] / 1e9);
        char one[16];
        snprintf(one, sizeof one, "%.1f", gb / 1e9);
        assert_string_equal(one, k == 0 ? "31.4" : k == 1 ? "16.6" : "1.9");
        /* communication, f32 parameters and gradients */
        ea.param_bytes = 4;
        ea.grad_bytes = 4;
        ea.optim_bytes = 8;
        assert_ok(Z->estimate(&th.host, &ea, &est));
        comm[k] = (double)est.comm_bytes_per_step;
    }
    double allreduce = 2.0 * 63 / 64 * 7.5e9 * 4;
    for (int k = 0; k < 2; k++)
        assert_true(fabs(comm[k] - allreduce) <= 0.01 * allreduce);
    assert_true(fabs(comm[2] / comm[1] - 1.5) <= 0.015);
}

/* ------------------------------------------------ protocol and state */

/* Two ranks drive stage 3 by hand (both make the same calls, so the
 * collectives stay matched even on the error paths). */
static int rank_protocol(int rank, int size, const char *job, void *arg)
{
    dt_toy_env_t env;
    DT_MP_OK(dt_toy_env_open(&env, run, rank, size, job));
    dt_strategy_t *s = env.s;
    /* HELD: unit 1 (79 elements) in shards of 48 (40 rounded up to 16) */
    dt_range_t rg[2];
    uint32_t n = 9;
    DT_MP_OK(Z->state_ranges(s, 1, DT_STATE_PARAMS, DT_RANGES_HELD, rg, 2, &n));
    DT_MP_CHECK(n == 1 && rg[0].offset == (rank ? 48u : 0u) && rg[0].count == (rank ? 31u : 48u));
    DT_MP_OK(Z->state_ranges(s, 1, DT_STATE_EXP_AVG_SQ, DT_RANGES_SAVE, rg, 2, &n));
    DT_MP_CHECK(n == 1 && rg[0].offset == (rank ? 48u : 0u)); /* no replicas: SAVE == HELD */
    DT_MP_OK(Z->state_ranges(s, 1, DT_STATE_PARAMS, DT_RANGES_HELD, NULL, 0, &n));
    DT_MP_CHECK(n == 1);
    DT_MP_CHECK(Z->state_ranges(s, 1, DT_STATE_PARAMS, 7, rg, 2, &n) == DT_ERR_INVALID);
    DT_MP_CHECK(strstr(dt_last_error(), "state_ranges: unknown purpose 7"));
    dt_toy_env_load(&env, run);

    /* state outside this rank's shard, or outside the unit */
    float buf[80] = {0};
    dt_range_t out = {rank ? 40u : 45u, 5};
    DT_MP_CHECK(Z->set_state(s, 1, DT_STATE_PARAMS, out, buf) == DT_ERR_INVALID);
    char want[160];
    snprintf(want, sizeof want, "strategy/zero: set_state: unit 'block.0' state params: range "
             "[%u, +5) is not inside this rank's shard [%u, +%u) (shard rank %d of 2)",
             rank ? 40u : 45u, rank ? 48u : 0u, rank ? 31u : 48u, rank);
    DT_MP_CHECK(strstr(dt_last_error(), want));
    DT_MP_CHECK(Z->get_state(s, 2, DT_STATE_EXP_AVG, (dt_range_t){8, 3}, buf) == DT_ERR_INVALID);
    DT_MP_CHECK(strstr(dt_last_error(), "get_state: unit 'head' state exp_avg: range [8, +3) "
                                        "outside the unit's 10 elements"));
    DT_MP_CHECK(Z->get_state(s, 0, 5, (dt_range_t){0, 1}, buf) == DT_ERR_INVALID);
    DT_MP_CHECK(strstr(dt_last_error(), "unit 'embedding': unknown state kind 5"));
    DT_MP_CHECK(Z->set_state(s, 3, DT_STATE_PARAMS, (dt_range_t){0, 1}, buf) == DT_ERR_INVALID);
    DT_MP_CHECK(strstr(dt_last_error(), "set_state: unit 3 out of range (model has 3 units)"));

    /* hook misuse, each named */
    dt_unit_buffers_v1_t b = {.struct_size = sizeof(dt_unit_buffers_v1_t)};
    dt_hook_v1_t h = {.struct_size = sizeof(dt_hook_v1_t), .unit = 1, .n_micro = 1};
    DT_MP_OK(Z->begin_step(s, 1));
    DT_MP_CHECK(Z->post_forward(s, &h) == DT_ERR_INVALID);
    DT_MP_CHECK(strstr(dt_last_error(), "post_forward: unit 'block.0' (1) without a "
                                        "pre_forward"));
    dt_hook_v1_t ng = {
        .struct_size = sizeof(dt_hook_v1_t), .unit = 0, .n_micro = 1, .flags = DT_HOOK_NO_GRAD};
    DT_MP_CHECK(Z->pre_backward(s, &ng, &b) == DT_ERR_INVALID);
    DT_MP_CHECK(strstr(dt_last_error(), "unit 'embedding' in a no-grad (evaluation) pass"));
    dt_hook_v1_t bad = {.struct_size = sizeof(dt_hook_v1_t), .unit = 0, .micro = 1, .n_micro = 1};
    DT_MP_CHECK(Z->pre_backward(s, &bad, &b) == DT_ERR_INVALID);
    DT_MP_CHECK(strstr(dt_last_error(), "pre_backward: unit 'embedding': micro-step 1 of 1"));
    DT_MP_OK(Z->pre_backward(s, &h, &b));
    DT_MP_CHECK((uintptr_t)b.params % 64 == 0 && (uintptr_t)b.grads % 64 == 0);
    float p78;
    DT_MP_OK(dt_toy_read(&env.dd, &p78, (const float *)b.params + 78, sizeof p78));
    DT_MP_CHECK(p78 == dt_toy_pval(1, 78)); /* gathered */
    dt_step_args_v1_t sa = {
        .struct_size = sizeof(dt_step_args_v1_t), .step = 1, .lr = 0.1f, .clip = 1.0f};
    dt_step_result_v1_t r = {.struct_size = sizeof(dt_step_result_v1_t)};
    DT_MP_CHECK(Z->step(s, &sa, &r) == DT_ERR_INVALID);
    DT_MP_CHECK(strstr(dt_last_error(), "step: unit 'block.0' (1) is still inside a "
                                        "pre_backward hook"));
    h.last_use = 1;
    DT_MP_OK(Z->post_backward(s, &h));
    DT_MP_OK(Z->pre_backward(s, &h, &b));
    DT_MP_CHECK(Z->post_backward(s, &h) == DT_ERR_INVALID);
    DT_MP_CHECK(strstr(dt_last_error(), "unit 'block.0' (1) reported last_use twice in "
                                        "micro-step 0"));

    /* a NaN gradient on one rank: every rank skips the update */
    float before[DT_TOY_NU][80], after[80];
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        DT_MP_OK(Z->state_ranges(s, u, DT_STATE_PARAMS, DT_RANGES_HELD, rg, 2, &n));
        if (n)
            DT_MP_OK(Z->get_state(s, u, DT_STATE_PARAMS, rg[0], before[u]));
    }
    DT_MP_OK(Z->begin_step(s, 1));
    double l;
    DT_MP_OK(dt_toy_forward(s, &env.dd, DT_F32, rank, 0, 1, 0, &l));
    dt_hook_v1_t h2 = {.struct_size = sizeof(dt_hook_v1_t), .unit = 2, .n_micro = 1, .last_use = 1};
    DT_MP_OK(Z->pre_backward(s, &h2, &b));
    float g3 = rank == 1 ? NAN : 0.5f;
    DT_MP_OK(dt_toy_write(&env.dd, b.grads + 3, &g3, sizeof g3));
    DT_MP_OK(Z->post_backward(s, &h2));
    DT_MP_OK(Z->step(s, &sa, &r));
    DT_MP_CHECK(r.nonfinite == 1 && isnan(r.grad_norm));
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        DT_MP_OK(Z->state_ranges(s, u, DT_STATE_PARAMS, DT_RANGES_HELD, rg, 2, &n));
        if (!n)
            continue;
        DT_MP_OK(Z->get_state(s, u, DT_STATE_PARAMS, rg[0], after));
        DT_MP_CHECK(memcmp(after, before[u], rg[0].count * sizeof(float)) == 0);
    }
    /* the next clean step updates */
    DT_MP_OK(Z->begin_step(s, 1));
    DT_MP_OK(dt_toy_forward(s, &env.dd, DT_F32, rank, 0, 1, 0, &l));
    DT_MP_OK(dt_toy_backward(s, &env.dd, DT_F32, rank, 0, 1));
    DT_MP_OK(Z->step(s, &sa, &r));
    DT_MP_CHECK(r.nonfinite == 0 && r.grad_norm > 0.1);
    DT_MP_OK(Z->state_ranges(s, 1, DT_STATE_PARAMS, DT_RANGES_HELD, rg, 2, &n));
    DT_MP_OK(Z->get_state(s, 1, DT_STATE_PARAMS, rg[0], after));
    DT_MP_CHECK(after[0] != before[1][0]);
    dt_toy_env_close(&env, run);
    return 0;
}

static void test_mp_protocol_and_state(void **state)
{
    const dt_test_kv_t kv[] = {{"stage", "3"}, {"param_persistence_threshold", "0"},
                               {NULL, NULL}};
    *run = (dt_toy_run_t){.S = Z, .prefix = "strategy/zero", .D = D, .C = COMM, .kv = kv,
                          .param_dtype = DT_F32, .optim = DT_OPTIM_ADAMW, .n_micro = 1};
    dt_mp_run_ranks(2, rank_protocol, NULL, 60.0, "zproto");
}

/* ------------------------------------------------ configuration */

static const dt_optim_desc_v1_t toy_optim = {.struct_size = sizeof toy_optim,
                                             .kind = DT_OPTIM_ADAMW};

static void test_config_errors(void **state)
{
    dt_model_desc_v1_t m = dt_toy_model(DT_F32);
    dt_strategy_init_v1_t a = {
        .struct_size = sizeof a, .n_micro = 1, .model = &m, .optim = &toy_optim};
    dt_strategy_t *s = (dt_strategy_t *)&a; /* must be reset to NULL */
    /* stage (required, 1..3) and the bucket sizes are checked by the core
     * against the declared keys before init */
    struct { dt_test_kv_t kv[3]; const char *msg; } cases[] = {
        {{{"stage", "4"}, {NULL, NULL}}, "[zero] stage = 4 is out of range (allowed 1 .. 3)"},
        {{{"stage", "0"}, {NULL, NULL}}, "[zero] stage = 0 is out of range (allowed 1 .. 3)"},
        {{{NULL, NULL}}, "required key 'zero.stage' is missing"},
        {{{"stage", "2"}, {"reduce_bucket_size", "0"}, {NULL, NULL}},
         "[zero] reduce_bucket_size = 0 is out of range (allowed 1 .. 1000000000000000)"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        assert_status(dt_test_schema_check(&Z->info, cases[k].kv), DT_ERR_CONFIG);
        assert_msg_has(cases[k].msg);
    }
    /* a host that holds no stage (it has no default): the plugin names the
     * key, in init and in the planner */
    dt_test_host_t th;
    dt_test_host_init(&th, "strategy/zero", NULL);
    assert_status(Z->init(&th.host, &a, &s), DT_ERR_CONFIG);
    assert_msg("strategy/zero: config key stage: no value (not declared by the plugin, or the "
               "host applied no defaults)");
    assert_null(s);
    dt_estimate_args_v1_t ea = dt_toy_est_args(&m, 2, DT_F32, DT_OPTIM_ADAMW, 1);
    dt_estimate_v1_t est = {.struct_size = sizeof(dt_estimate_v1_t)};
    assert_status(Z->estimate(&th.host, &ea, &est), DT_ERR_CONFIG);
    assert_msg("strategy/zero: config key stage: no value (not declared by the plugin, or the "
               "host applied no defaults)");
    /* the wire dtype of the gradient reductions, named with its choices */
    const dt_test_kv_t kr[] = {{"stage", "2"}, {"reduce_dtype", "f16"}, {NULL, NULL}};
    dt_test_host_init(&th, "strategy/zero", kr);
    assert_status(Z->init(&th.host, &a, &s), DT_ERR_CONFIG);
    assert_msg("strategy/zero: reduce_dtype = \"f16\" is not one of the valid choices: fp32, "
               "bf16, fp16");
    /* a valid config still needs a device and a group */
    const dt_test_kv_t ok[] = {{"stage", "2"}, {NULL, NULL}};
    dt_test_host_init(&th, "strategy/zero", ok);
    assert_status(Z->init(&th.host, &a, &s), DT_ERR_INVALID);
    assert_msg_has("init: NULL dev");
    assert_int_equal(th.mem.current[DT_TAG_OTHER], 0);

    /* the declared schema: stage is a required integer in [1, 3] */
    assert_int_equal(Z->info.n_config_keys, 8);
    assert_string_equal(Z->info.config_keys[0].name, "stage");
    assert_int_equal(Z->info.config_keys[0].type, DT_CFG_INT);
    assert_null(Z->info.config_keys[0].def);
    assert_true(Z->info.config_keys[0].min == 1 && Z->info.config_keys[0].max == 3);
    const char *names[] = {"reduce_bucket_size", "allgather_bucket_size", "overlap_comm",
                           "prefetch_bucket_size", "param_persistence_threshold",
                           "reduce_dtype", "offload_what"};
    for (int k = 0; k < 7; k++)
        assert_string_equal(Z->info.config_keys[k + 1].name, names[k]);
}

/* `dtrain plan`'s rows: one per stage, each of whose settings selects
 * that stage through the plugin's own table (the estimate's note names
 * it). */
static void test_plan_presets(void **state)
{
    assert_true(DT_HAS_OP(dt_strategy_ops_v1_t, Z, plan_presets));
    const dt_plan_preset_v1_t *p = NULL;
    uint32_t n = 0;
    assert_ok(Z->plan_presets(&p, &n));
    assert_int_equal(n, 3);
    dt_model_desc_v1_t m = dt_toy_model(DT_F32);
    dt_estimate_args_v1_t ea = dt_toy_est_args(&m, 4, DT_F32, DT_OPTIM_ADAMW, 1);
    for (uint32_t i = 0; i < n; i++) {
        char label[32], set[32], note[32];
        snprintf(label, sizeof label, "zero-%u", i + 1);
        snprintf(set, sizeof set, "stage=%u", i + 1);
        snprintf(note, sizeof note, "zero stage %u", i + 1);
        assert_string_equal(p[i].label, label);
        assert_string_equal(p[i].set, set);
        char key[32];
        const char *eq = strchr(p[i].set, '=');
        assert_non_null(eq);
        snprintf(key, sizeof key, "%.*s", (int)(eq - p[i].set), p[i].set);
        const dt_test_kv_t kv[] = {{key, eq + 1}, {NULL, NULL}};
        dt_test_host_t th;
        dt_test_host_init(&th, "strategy/zero", kv);
        dt_estimate_v1_t e = {.struct_size = sizeof e};
        assert_ok(Z->estimate(&th.host, &ea, &e));
        assert_non_null(strstr(e.note, note));
    }
    assert_status(Z->plan_presets(NULL, &n), DT_ERR_INVALID);
}

static void trace_run(const dt_test_kv_t *kv, int size, uint32_t n_micro)
{
    setup_run(kv, DT_F32, DT_OPTIM_ADAMW, 0);
    dt_toy_trace_run(run, size, n_micro);
}

/* Where communication happens, from rank 0's trace (toy_train.h tokens)
 * at 2 ranks; units padded to 64, 96 and 32 elements: shards 32, 48, 16.
 * Three buckets (reduce_bucket_size 60) for stages 1-2. */
static void test_schedule(void **state)
{
    /* stage 1: nothing during the first micro-step's backward; each bucket
     * reduce-scattered as the final micro-step completes it; after the
     * update, parameters all-gathered (state_loaded gathers them too) */
    const dt_test_kv_t k1[] = {{"stage", "1"}, {"reduce_bucket_size", "60"}, {NULL, NULL}};
    trace_run(k1, 2, 2);
    const char *fwd = "F0 f0 F1 f1 F2 F0 f0 f2";
    char want[1024];
    snprintf(want, sizeof want,
             "AG32/2 AG48/2 AG16/2 L T %s B2 B0 b0 b2! B1 b1! B0 b0! %s B2 B0 b0 b2! RS16/2 B1 "
             "b1! RS48/2 B0 b0! RS32/2 S AR1/2 AG32/2 AG48/2 AG16/2", fwd, fwd);
    assert_string_equal(dt_toy_trace(0), want);
    /* without overlap_comm, all in the step, in backward order */
    const dt_test_kv_t k1n[] = {{"stage", "1"}, {"reduce_bucket_size", "60"},
                                {"overlap_comm", "false"}, {NULL, NULL}};
    trace_run(k1n, 2, 1);
    assert_non_null(strstr(dt_toy_trace(0), "B0 b0! S RS16/2 RS48/2 RS32/2 AR1/2 AG32/2"));

    /* stage 2: every micro-step's gradient reduce-scattered bucket by bucket
     * as backward completes it (the tied embedding only at its last use) */
    const dt_test_kv_t k2[] = {{"stage", "2"}, {"reduce_bucket_size", "60"}, {NULL, NULL}};
    trace_run(k2, 2, 2);
    const char *bwd = "B2 B0 b0 b2! RS16/2 B1 b1! RS48/2 B0 b0! RS32/2";
    snprintf(want, sizeof want, "AG32/2 AG48/2 AG16/2 L T %s %s %s %s S AR1/2 AG32/2 AG48/2 "
             "AG16/2", fwd, bwd, fwd, bwd);
    assert_string_equal(dt_toy_trace(0), want);

    /* stage 3, prefetching: the first unit's gather followed at once by the
     * next units' (forward) and the previous ones' (backward); the nested
     * embedding gathered again without prefetching; gradients reduced as
     * units complete; no gather after the step */
    const dt_test_kv_t k3[] = {{"stage", "3"}, {"param_persistence_threshold", "0"},
                               {"prefetch_bucket_size", "1000"}, {NULL, NULL}};
    trace_run(k3, 2, 1);
    assert_string_equal(dt_toy_trace(0),
                        "L T F0 AG32/2 AG48/2 AG16/2 f0 F1 f1 F2 F0 AG32/2 f0 f2 B2 AG16/2 "
                        "AG48/2 AG32/2 B0 b0 b2! RS16/2 B1 AG32/2 b1! RS48/2 B0 b0! RS32/2 S "
                        "AR1/2");
    /* without prefetching, each unit gathered inside its own hook */
    const dt_test_kv_t k3n[] = {{"stage", "3"}, {"param_persistence_threshold", "0"},
                                {"prefetch_bucket_size", "0"}, {NULL, NULL}};
    trace_run(k3n, 2, 1);
    assert_non_null(strstr(dt_toy_trace(0), "L T F0 AG32/2 f0 F1 AG48/2 f1 F2 AG16/2 F0 AG32/2"));
    /* a persistent head: gathered once per step, at first use */
    const dt_test_kv_t k3p[] = {{"stage", "3"}, {"param_persistence_threshold", "20"},
                                {"prefetch_bucket_size", "0"}, {NULL, NULL}};
    trace_run(k3p, 2, 2);
    const char *t = dt_toy_trace(0);
    assert_non_null(strstr(t, "F2 AG16/2 F0 AG32/2"));
    assert_null(strstr(strstr(t, "F2 AG16/2") + 9, "AG16/2")); /* not in micro-step 2 */
}

int main(int argc, char **argv)
{
    int rc = dt_toy_backend_select(argc, argv, 4);
    if (rc >= 0)
        return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_plan_presets),
        cmocka_unit_test(test_memory_per_stage),
        cmocka_unit_test(test_memory_offloaded),
        cmocka_unit_test(test_zero_paper_figures),
        cmocka_unit_test(test_mp_stage1),
        cmocka_unit_test(test_mp_stage2),
        cmocka_unit_test(test_mp_stage3),
        cmocka_unit_test(test_mp_bf16),
        cmocka_unit_test(test_mp_reduce_dtype),
        cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_mp_protocol_and_state),
    };
    return cmocka_run_group_tests_name(dt_toy_backend_label(), tests, group_setup, NULL);
}
