/*
 * tests/unit/sdk/test_replica.c - the SDK's replica machinery
 * (dtrain/sdk/replica.h) beyond what ddp exercises through its plugin:
 * averaging state across the group (what local SGD does every K steps),
 * gradients kept local (reduce_grads 0: no reduction stream, a local
 * norm, a local update) against averaged ones, and the init check
 * refusing replicas that differ until they are averaged, and a pipeline
 * stage (only its units, a tied unit summed between stages, the norm of
 * the whole model).  Forked ranks at
 * world sizes 2 and 3 over a real communicator and device, the toy model
 * with SGD (no momentum, no decay), every number against its closed form.
 *
 * Device-parametrized: `test_replica [cpu|cuda]` (toy_train.h's backends:
 * cpu + shm, or cuda + nccl with one GPU per rank; ctest's
 * unit.test_replica.cuda, label gpu, is skipped without 3 GPUs).  The
 * host reaches device memory only through the device's copies and the
 * replica's get/set_state.  The cuda variant has not yet run on a GPU.
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
#include "dtrain/sdk/replica.h"
#include "mp_check.h"
#include "mp_harness.h"
#include "test_host.h"
#include "test_plugin.h"
#include "toy_model.h"
#include "toy_train.h"
#include "util/error.h"

static const dt_device_ops_v1_t *D;
static const dt_comm_ops_v1_t *COMM;

/* the backend's device and communicator (cpu + shm, or cuda + nccl),
 * forked ranks leak-checked under ASan */
static int group_setup(void **state)
{
    return dt_toy_setup(DT_TEST_PLUGIN_DIR, &D, &COMM, NULL, 0);
}

/* The gradient rank r writes for element i of unit u: (r + 1) c(u, i). */
static float coef(uint32_t u, uint64_t i)
{
    return 0.01f * (float)(i + 1) * (float)(u + 1) * (i % 2 ? -1.0f : 1.0f);
}

/* Within `rel` of want, relative to max(|want|, 1): the values are O(1),
 * and an update that cancels to near 0 keeps its operands' rounding. */
static int close_to(double got, double want, double rel)
{
    return fabs(got - want) <= rel * fmax(fabs(want), 1.0);
}

/* Write state `kind` of every unit from f(u, i) (through set_state). */
static void set_all(dt_replica_t *r, int kind, float (*f)(uint32_t, uint64_t, int), int rank)
{
    static float buf[DT_TOY_MAXN];
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        uint64_t n = dt_toy_unit(u)->numel;
        for (uint64_t i = 0; i < n; i++)
            buf[i] = f(u, i, rank);
        DT_MP_OK(dt_replica_set_state(r, u, kind, (dt_range_t){0, n}, buf));
    }
}

/* Every element of state `kind` against want(u, i) within `rel`. */
static void check_all(dt_replica_t *r, int kind, double (*want)(uint32_t, uint64_t, int, int),
                      int rank, int size, double rel)
{
    static float buf[DT_TOY_MAXN];
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        uint64_t n = dt_toy_unit(u)->numel;
        DT_MP_OK(dt_replica_get_state(r, u, kind, (dt_range_t){0, n}, buf));
        for (uint64_t i = 0; i < n; i++)
            if (!close_to(buf[i], want(u, i, rank, size), rel)) {
                dt_mp_fail("rank %d of %d: state %s of unit %u element %llu is %.9g, want %.9g",
                           rank, size, dt_state_kind_name(kind), u, (unsigned long long)i,
                           buf[i], want(u, i, rank, size));
                DT_MP_CHECK(0);
            }
    }
}

/* Rank r's parameters: the toy's, shifted by 0.25 r; their average. */
static float p_rank(uint32_t u, uint64_t i, int rank)
{
    return dt_toy_pval(u, i) + 0.25f * (float)rank;
}
static double p_avg(uint32_t u, uint64_t i, int rank, int size)
{
    return dt_toy_pval(u, i) + 0.25 * (size - 1) / 2.0;
}
/* Rank r's momentum r + 1; its average (n + 1) / 2, exact in f32. */
static float m_rank(uint32_t u, uint64_t i, int rank)
{
    return (float)(rank + 1);
}
static double m_avg(uint32_t u, uint64_t i, int rank, int size)
{
    return (size + 1) / 2.0;
}
/* The gradient a step uses: this rank's own, or the group's mean. */
static int g_reduced;
static double g_used(uint32_t u, uint64_t i, int rank, int size)
{
    return (g_reduced ? (size + 1) / 2.0 : (double)(rank + 1)) * coef(u, i);
}
/* After one SGD step at lr 0.5 from the averaged parameters. */
static double p_after(uint32_t u, uint64_t i, int rank, int size)
{
    return p_avg(u, i, rank, size) - 0.5 * g_used(u, i, rank, size);
}

static int rank_replica(int rank, int size, const char *job, void *arg)
{
    dt_test_host_t th_dev, th_comm, th;
    /* the device at its defaults; the backend's communicator config (shm:
     * small slots) */
    dt_test_host_init(&th_dev, dt_toy_backend_device_prefix(), NULL);
    dt_test_host_init(&th_comm, dt_toy_backend_comm_prefix(), dt_toy_backend_comm_kv());
    dt_test_host_init(&th, "sdk/replica", NULL);
    dt_device_t *dev;
    dt_comm_t *comm;
    dt_stream_t *cs;
    dt_device_init_v1_t di = {.struct_size = sizeof di, .rank = rank, .local_rank = rank,
                              .local_size = size, .device_index = -1};
    DT_MP_OK(D->init(&th_dev.host, &di, &dev));
    dt_comm_init_v1_t ci = {.struct_size = sizeof ci, .rank = rank, .size = size,
                            .local_rank = rank, .local_size = size, .job_id = job,
                            .timeout_ms = 20000, .dev = dev};
    DT_MP_OK(COMM->init(&th_comm.host, &ci, &comm));
    DT_MP_OK(D->stream_create(dev, &cs));
    dt_model_desc_v1_t model = dt_toy_model(DT_F32);
    dt_optim_desc_v1_t optim = {.struct_size = sizeof optim, .kind = DT_OPTIM_SGD};
    dt_strategy_init_v1_t ia = {.struct_size = sizeof ia, .n_micro = 1,
                                .dev = dev, .compute_stream = cs,
                                .comm = comm, .model = &model, .optim = &optim};
    /* local and reduced gradients; each also as an fp16 run hands them
     * over: multiplied by the loss scale 8, which the step divides out
     * (dt_step_args_v1_t.loss_scale) before the norm, clipping and the
     * update, giving the same result */
    for (int variant = 0; variant < 4; variant++) {
        g_reduced = variant & 1;
        const float scale = variant & 2 ? 8.0f : 0.0f;
        dt_replica_cfg_t cfg = {.bucket_cap_mb = 0.0003, .reduce_grads = g_reduced,
                                .reduce_dtype = DT_F32, .overlap = 1};
        dt_replica_t r;
        DT_MP_OK(dt_replica_init(&r, NULL, &th.host, &ia, &cfg, "test"));
        /* local gradients: no buckets, no reduction stream */
        DT_MP_CHECK((r.comm_stream != NULL) == g_reduced);
        DT_MP_CHECK((r.n_buckets == 3) == g_reduced);

        /* replicas that differ are refused alike on every rank ... */
        set_all(&r, DT_STATE_PARAMS, p_rank, rank);
        DT_MP_CHECK(dt_replica_state_loaded(&r) == DT_ERR_DATA);
        DT_MP_CHECK(strstr(dt_last_error(), "sdk/replica: init_check: the parameters of unit "
                                            "'embedding' (unit 0) differ") != NULL);
        /* ... until averaged: the mean, and the check passes */
        DT_MP_OK(dt_replica_average(&r, DT_STATE_PARAMS));
        check_all(&r, DT_STATE_PARAMS, p_avg, rank, size, 1e-6);
        DT_MP_OK(dt_replica_state_loaded(&r));
        set_all(&r, DT_STATE_EXP_AVG, m_rank, rank);
        DT_MP_OK(dt_replica_average(&r, DT_STATE_EXP_AVG));
        check_all(&r, DT_STATE_EXP_AVG, m_avg, rank, size, 0.0);
        DT_MP_OK(dt_replica_average(&r, DT_STATE_EXP_AVG_SQ)); /* SGD keeps none */
        DT_MP_CHECK(dt_replica_average(&r, 7) == DT_ERR_INVALID);

        /* one step: gradients written through the hooks, backward order */
        static float g[DT_TOY_MAXN];
        DT_MP_OK(dt_replica_begin_step(&r, 1, NULL));
        double ss = 0.0;
        for (uint32_t u = DT_TOY_NU; u-- > 0;) {
            dt_hook_v1_t h = {.struct_size = sizeof h, .unit = u, .n_micro = 1, .last_use = 1};
            dt_unit_buffers_v1_t b = {.struct_size = sizeof b};
            DT_MP_OK(dt_replica_pre_backward(&r, &h, &b));
            uint64_t n = dt_toy_unit(u)->numel;
            for (uint64_t i = 0; i < n; i++) {
                g[i] = (float)(rank + 1) * coef(u, i) * (scale > 0 ? scale : 1.0f);
                ss += g_used(u, i, rank, size) * g_used(u, i, rank, size);
            }
            DT_MP_OK(D->memcpy_async(dev, b.grads, g, n * sizeof(float), DT_COPY_H2D, cs));
            DT_MP_OK(D->stream_sync(dev, cs));
            DT_MP_OK(dt_replica_post_backward(&r, &h));
        }
        dt_step_args_v1_t sa = {.struct_size = sizeof sa, .step = 1, .lr = 0.5f,
                                .loss_scale = scale};
        dt_step_result_v1_t res = {.struct_size = sizeof res};
        DT_MP_OK(dt_replica_step(&r, &sa, &res));
        /* the norm of the gradient used: this rank's own, or the mean's */
        DT_MP_CHECK(close_to(res.grad_norm, sqrt(ss), 1e-5));
        check_all(&r, DT_STATE_PARAMS, p_after, rank, size, 1e-6);
        dt_replica_free(&r);
        dt_replica_free(&r); /* safe twice */
    }
    D->stream_destroy(dev, cs);
    COMM->finalize(comm);
    D->finalize(dev);
    return 0;
}

/* ---- a pipeline stage (dtrain/sdk/dp.h) ----
 * Two ranks as the two stages of one pipeline (data groups of one rank:
 * the world split by rank; the world as pipeline and embedding group):
 * stage 0 holds units 0 (TIED) and 1, stage 1 unit 2 and a TIED COPY of
 * unit 0.  Rank r writes gradient (r + 1) c(u, i).  Asserted: ranges
 * (nothing of another stage's unit; a COPY loaded, never saved), a hook
 * on another stage's unit refused naming it, unit 0's gradient the sum
 * 3 c over both stages (the same SGD update on both), the norm over the
 * whole model counting unit 0 once, and bad flags refused. */
static int rank_stage(int rank, int size, const char *job, void *arg)
{
    (void)arg;
    dt_test_host_t th_dev, th_comm, th;
    dt_test_host_init(&th_dev, dt_toy_backend_device_prefix(), NULL);
    dt_test_host_init(&th_comm, dt_toy_backend_comm_prefix(), dt_toy_backend_comm_kv());
    dt_test_host_init(&th, "sdk/replica", NULL);
    dt_device_t *dev;
    dt_comm_t *world, *dpc;
    dt_stream_t *cs;
    dt_device_init_v1_t di = {.struct_size = sizeof di, .rank = rank, .local_rank = rank,
                              .local_size = size, .device_index = -1};
    DT_MP_OK(D->init(&th_dev.host, &di, &dev));
    dt_comm_init_v1_t ci = {.struct_size = sizeof ci, .rank = rank, .size = size,
                            .local_rank = rank, .local_size = size, .job_id = job,
                            .timeout_ms = 20000, .dev = dev};
    DT_MP_OK(COMM->init(&th_comm.host, &ci, &world));
    DT_MP_OK(COMM->split(world, rank, 0, &dpc));
    DT_MP_OK(D->stream_create(dev, &cs));
    dt_model_desc_v1_t model = dt_toy_model(DT_F32);
    dt_optim_desc_v1_t optim = {.struct_size = sizeof optim, .kind = DT_OPTIM_SGD};
    const uint8_t T = DT_UNIT_HELD | DT_UNIT_TIED;
    const uint8_t flags[2][DT_TOY_NU] = {{T, DT_UNIT_HELD, 0}, {T | DT_UNIT_COPY, 0, DT_UNIT_HELD}};
    dt_strategy_init_v1_t ia = {.struct_size = sizeof ia, .n_micro = 1,
                                .dev = dev, .compute_stream = cs,
                                .comm = dpc, .model = &model, .optim = &optim,
                                .unit_flags = flags[rank], .norm_comm = world,
                                .tied_comm = world};
    dt_replica_cfg_t cfg = {.bucket_cap_mb = 0.0003, .reduce_grads = 1,
                            .reduce_dtype = DT_F32, .overlap = 1};
    dt_replica_t r;
    DT_MP_OK(dt_replica_init(&r, NULL, &th.host, &ia, &cfg, "test"));
    const uint32_t other = rank == 0 ? 2 : 1; /* a unit of the other stage */
    dt_range_t rg[2];
    uint32_t n = 9;
    DT_MP_OK(dt_replica_state_ranges(&r, other, DT_STATE_PARAMS, DT_RANGES_HELD, rg, 2, &n));
    DT_MP_CHECK(n == 0);
    DT_MP_OK(dt_replica_state_ranges(&r, 0, DT_STATE_PARAMS, DT_RANGES_HELD, rg, 2, &n));
    DT_MP_CHECK(n == 1 && rg[0].offset == 0 && rg[0].count == dt_toy_unit(0)->numel);
    DT_MP_OK(dt_replica_state_ranges(&r, 0, DT_STATE_PARAMS, DT_RANGES_SAVE, rg, 2, &n));
    DT_MP_CHECK(n == (rank == 0 ? 1u : 0u));
    static float buf[DT_TOY_MAXN];
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        if (!(flags[rank][u] & DT_UNIT_HELD))
            continue;
        uint64_t k = dt_toy_unit(u)->numel;
        for (uint64_t i = 0; i < k; i++)
            buf[i] = dt_toy_pval(u, i);
        DT_MP_OK(dt_replica_set_state(&r, u, DT_STATE_PARAMS, (dt_range_t){0, k}, buf));
    }
    DT_MP_OK(dt_replica_state_loaded(&r));
    DT_MP_OK(dt_replica_begin_step(&r, 1, NULL));
    dt_hook_v1_t h = {.struct_size = sizeof h, .unit = other, .n_micro = 1, .last_use = 1};
    dt_unit_buffers_v1_t b = {.struct_size = sizeof b};
    DT_MP_CHECK(dt_replica_pre_backward(&r, &h, &b) == DT_ERR_INVALID);
    char want[128];
    snprintf(want, sizeof want, "sdk/replica: pre_backward: unit '%s' (%u) is another pipeline "
             "stage's", dt_toy_unit(other)->name, other);
    DT_MP_CHECK(strcmp(dt_last_error(), want) == 0);
    static float g[DT_TOY_MAXN];
    for (uint32_t u = DT_TOY_NU; u-- > 0;) {
        if (!(flags[rank][u] & DT_UNIT_HELD))
            continue;
        h.unit = u;
        DT_MP_OK(dt_replica_pre_backward(&r, &h, &b));
        uint64_t k = dt_toy_unit(u)->numel;
        for (uint64_t i = 0; i < k; i++)
            g[i] = (float)(rank + 1) * coef(u, i);
        DT_MP_OK(D->memcpy_async(dev, b.grads, g, k * sizeof(float), DT_COPY_H2D, cs));
        DT_MP_OK(D->stream_sync(dev, cs));
        DT_MP_OK(dt_replica_post_backward(&r, &h));
    }
    /* the whole model's norm: unit 0 summed (3c) and counted once, unit 1
     * stage 0's (c), unit 2 stage 1's (2c) */
    double whole = 0.0;
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        for (uint64_t i = 0; i < dt_toy_unit(u)->numel; i++) {
            double gu = (u == 0 ? 3.0 : u == 1 ? 1.0 : 2.0) * coef(u, i);
            whole += gu * gu;
        }
    dt_step_args_v1_t sa = {.struct_size = sizeof sa, .step = 1, .lr = 0.5f};
    dt_step_result_v1_t res = {.struct_size = sizeof res};
    DT_MP_OK(dt_replica_step(&r, &sa, &res));
    if (!close_to(res.grad_norm, sqrt(whole), 1e-5)) {
        dt_mp_fail("rank %d: grad norm %.9g, want %.9g", rank, res.grad_norm, sqrt(whole));
        DT_MP_CHECK(0);
    }
    uint64_t k0 = dt_toy_unit(0)->numel;
    DT_MP_OK(dt_replica_get_state(&r, 0, DT_STATE_PARAMS, (dt_range_t){0, k0}, buf));
    for (uint64_t i = 0; i < k0; i++)
        if (!close_to(buf[i], dt_toy_pval(0, i) - 0.5 * 3.0 * coef(0, i), 1e-6)) {
            dt_mp_fail("rank %d: tied unit 0 element %llu is %.9g after the step, want %.9g",
                       rank, (unsigned long long)i, buf[i],
                       dt_toy_pval(0, i) - 0.5 * 3.0 * coef(0, i));
            DT_MP_CHECK(0);
        }
    dt_replica_free(&r);
    /* flags that make no sense: a COPY that is not TIED */
    const uint8_t bad[DT_TOY_NU] = {DT_UNIT_HELD | DT_UNIT_COPY, DT_UNIT_HELD, 0};
    ia.unit_flags = bad;
    DT_MP_CHECK(dt_replica_init(&r, NULL, &th.host, &ia, &cfg, "test") == DT_ERR_INVALID);
    snprintf(want, sizeof want, "sdk/replica: init: unit '%s' has stage flags 0x5 (COPY needs "
             "TIED, TIED needs HELD)", dt_toy_unit(0)->name);
    DT_MP_CHECK(strcmp(dt_last_error(), want) == 0);
    D->stream_destroy(dev, cs);
    COMM->finalize(dpc);
    COMM->finalize(world);
    D->finalize(dev);
    return 0;
}

static void test_mp_pipeline_stage(void **state)
{
    (void)state;
    dt_mp_run_ranks(2, rank_stage, NULL, 60.0, "replica-stage");
}

static void test_mp_average_and_local_gradients(void **state)
{
    for (int size = 2; size <= 3; size++)
        dt_mp_run_ranks(size, rank_replica, NULL, 60.0, "replica");
}

int main(int argc, char **argv)
{
    int rc = dt_toy_backend_select(argc, argv, 3);
    if (rc >= 0)
        return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mp_average_and_local_gradients),
        cmocka_unit_test(test_mp_pipeline_stage),
    };
    return cmocka_run_group_tests_name(dt_toy_backend_label(), tests, group_setup, NULL);
}
