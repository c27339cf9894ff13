/*
 * tests/unit/test_replica.c - the SDK's replica machinery
 * (dtrain/sdk/replica.h) beyond what ddp exercises through its plugin:
 * averaging state across the group (what local SGD does every K steps),
 * gradients kept local (reduce_grads 0: no reduction stream, a local
 * norm, a local update) against averaged ones, and the init check
 * refusing replicas that differ until they are averaged.  Forked ranks at
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
                            .timeout_ms = 20000, .dev_ops = D, .dev = dev};
    DT_MP_OK(COMM->init(&th_comm.host, &ci, &comm));
    DT_MP_OK(D->stream_create(dev, &cs));
    dt_model_desc_v1_t model = dt_toy_model(DT_F32);
    dt_optim_desc_v1_t optim = {.struct_size = sizeof optim, .kind = DT_OPTIM_SGD};
    dt_strategy_init_v1_t ia = {.struct_size = sizeof ia, .n_micro = 1, .dev_ops = D,
                                .dev = dev, .compute_stream = cs, .comm_ops = COMM,
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
        DT_MP_OK(dt_replica_init(&r, &th.host, &ia, &cfg, "test"));
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
        if (variant == 0) { /* a minor-0 core's args: bytes past them are not its */
            sa.struct_size = (uint32_t)DT_STEP_ARGS_V1_SIZE0;
            sa.loss_scale = 8.0f;
        }
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
    };
    return cmocka_run_group_tests_name(dt_toy_backend_label(), tests, group_setup, NULL);
}
