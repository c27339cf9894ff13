/*
 * tests/unit/plugins/shard/test_shard.c - the sharded engine's plan and group
 * collectives (plugins/shard/shard.h "The plan"): grouping units (wrap and
 * bucket plans), the group layout (alignment, padding, equal shards), the
 * ranges each rank holds (every element exactly once, also when a unit is
 * smaller than the world), and gather / reduce-scatter of groups over the
 * real shm communicator in forked ranks at world sizes 1-4, several started
 * before any is waited.
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
#include "mp_harness.h"
#include "shard.h"
#include "shard_internal.h"
#include "test_assert.h"
#include "test_host.h"
#include "test_plugin.h"
#include "toy_model.h"
#include "toy_train.h"

static const dt_device_ops_v1_t *D;
static const dt_comm_ops_v1_t *SHM;

/* the cpu and shm plugins, forked ranks leak-checked under ASan */
static int group_setup(void **state)
{
    return dt_toy_setup(DT_TEST_PLUGIN_DIR, &D, &SHM, NULL, 0);
}

/* ------------------------------------------------- a model of odd units */

/* Units of 2, 37, 5 and 64 elements, one tensor each: unit 0 is smaller
 * than every world size above 2. */
#define PU 4
static dt_param_desc_v1_t pp[PU] = {
    {.name = "a", .numel = 2, .ndim = 1, .shape = {2}},
    {.name = "b", .numel = 37, .ndim = 1, .shape = {37}},
    {.name = "c", .numel = 5, .ndim = 1, .shape = {5}},
    {.name = "d", .numel = 64, .ndim = 1, .shape = {64}},
};
static dt_unit_desc_v1_t pu[PU] = {
    {.name = "u0", .index = 0, .n_params = 1, .params = &pp[0], .numel = 2},
    {.name = "u1", .index = 1, .n_params = 1, .params = &pp[1], .numel = 37},
    {.name = "u2", .index = 2, .n_params = 1, .params = &pp[2], .numel = 5},
    {.name = "u3", .index = 3, .n_params = 1, .params = &pp[3], .numel = 64},
};
static dt_model_desc_v1_t pmodel = {.struct_size = sizeof(dt_model_desc_v1_t),
                                    .arch = "test",
                                    .n_units = PU,
                                    .units = pu,
                                    .numel = 108,
                                    .param_dtype = DT_F32};
/* units {0,1} and {2,3} merged */
static const dt_bucket_span_t merged[2] = {{.unit_lo = 2, .unit_hi = 3},
                                           {.unit_lo = 0, .unit_hi = 1}};

/* ------------------------------------------------------------ plans */

static void test_wrap_plan(void **state)
{
    dt_bucket_span_t sp[8];
    uint32_t gof[8];
    const uint64_t n1[6] = {2, 37, 5, 64, 3, 1};
    /* min 0 or 1: every unit alone */
    assert_int_equal(dt_shard_wrap_plan(n1, 6, 0, sp, gof), 6);
    assert_int_equal(dt_shard_wrap_plan(n1, 6, 1, sp, NULL), 6);
    for (uint32_t u = 0; u < 6; u++)
        assert_true(sp[u].unit_lo == u && sp[u].unit_hi == u && sp[u].bytes == n1[u]);
    /* min 10: big units alone, small neighbours merged (3 + 1 stays below) */
    assert_int_equal(dt_shard_wrap_plan(n1, 6, 10, sp, gof), 5);
    assert_true(sp[4].unit_lo == 4 && sp[4].unit_hi == 5 && sp[4].bytes == 4);
    const uint32_t want_gof[6] = {0, 1, 2, 3, 4, 4};
    assert_memory_equal(gof, want_gof, sizeof want_gof);
    /* small units merge until the group reaches the threshold, then close */
    const uint64_t n2[5] = {3, 3, 3, 3, 10};
    assert_int_equal(dt_shard_wrap_plan(n2, 5, 6, sp, gof), 3);
    assert_true(sp[0].unit_lo == 0 && sp[0].unit_hi == 1 && sp[0].bytes == 6);
    assert_true(sp[1].unit_lo == 2 && sp[1].unit_hi == 3);
    assert_true(sp[2].unit_lo == 4 && sp[2].unit_hi == 4);
    /* a threshold above the model: one group */
    assert_int_equal(dt_shard_wrap_plan(n2, 5, 1000, sp, NULL), 1);
    assert_true(sp[0].unit_lo == 0 && sp[0].unit_hi == 4 && sp[0].bytes == 22);
    assert_int_equal(dt_shard_wrap_plan(n2, 0, 6, sp, NULL), 0);
}

/* `alone`: a unit flagged so gets a group of its own out of any span (a
 * pipeline's tied unit), and the units around it keep their span's
 * grouping; without flags the spans stand. */
static void test_plan_alone(void **state)
{
    (void)state;
    dt_test_host_t th;
    dt_test_host_init(&th, "sdk/shard", NULL);
    dt_model_desc_v1_t toy = dt_toy_model(DT_F32);
    const dt_bucket_span_t one[1] = {{.unit_lo = 0, .unit_hi = 2, .bytes = 139}};
    dt_shard_plan_t p;
    const uint8_t first[3] = {1, 0, 0}, middle[3] = {0, 1, 0};
    assert_ok(dt_shard_plan_init(&p, &th.host, &toy, one, 1, 2, 1, first));
    assert_int_equal(p.n_groups, 2);
    assert_true(p.groups[0].unit_lo == 0 && p.groups[0].unit_hi == 0);
    assert_true(p.groups[1].unit_lo == 1 && p.groups[1].unit_hi == 2);
    assert_int_equal(p.groups[0].numel, 50);
    assert_int_equal(p.groups[0].shard, 25); /* the unit's own halves */
    dt_shard_plan_free(&p, &th.host);
    assert_ok(dt_shard_plan_init(&p, &th.host, &toy, one, 1, 2, 1, middle));
    assert_int_equal(p.n_groups, 3);
    assert_true(p.groups[1].unit_lo == 1 && p.groups[1].unit_hi == 1);
    assert_true(p.groups[2].unit_lo == 2 && p.groups[2].unit_hi == 2);
    assert_int_equal(p.group_of_unit[2], 2);
    dt_shard_plan_free(&p, &th.host);
    assert_ok(dt_shard_plan_init(&p, &th.host, &toy, one, 1, 2, 1, NULL));
    assert_int_equal(p.n_groups, 1);
    dt_shard_plan_free(&p, &th.host);
}

/* The toy model (50, 79, 10) in a bucket plan's backward-ordered spans:
 * cap 130 puts the head and the block together, the embedding alone. */
static void test_plan_layout(void **state)
{
    dt_test_host_t th;
    dt_test_host_init(&th, "sdk/shard", NULL);
    dt_model_desc_v1_t toy = dt_toy_model(DT_F32);
    const uint64_t numel[3] = {50, 79, 10};
    dt_bucket_span_t sp[3];
    assert_int_equal(dt_bucket_plan(numel, 3, 130, sp, NULL), 2);
    dt_shard_plan_t p;
    assert_ok(dt_shard_plan_init(&p, &th.host, &toy, sp, 2, 3, 16, NULL));
    assert_int_equal(p.n_groups, 2);
    assert_int_equal(p.groups[0].unit_lo, 0);
    assert_int_equal(p.groups[0].unit_hi, 0);
    assert_int_equal(p.groups[1].unit_lo, 1);
    assert_int_equal(p.groups[1].unit_hi, 2);
    /* unit 2 starts at 79 rounded up to 16: 80; group 1 spans 90 */
    assert_int_equal(p.unit_off[1], 0);
    assert_int_equal(p.unit_off[2], 80);
    assert_int_equal(p.groups[1].numel, 90);
    /* ceil(50 / 3) = 17 and ceil(90 / 3) = 30, both rounded up to 32 */
    assert_int_equal(p.groups[0].shard, 32);
    assert_int_equal(p.groups[1].shard, 32);
    assert_int_equal(p.groups[0].padded, 96);
    assert_int_equal(p.groups[1].full_off, 96);
    assert_int_equal(p.groups[1].shard_off, 32);
    assert_int_equal(p.full_total, 192);
    assert_int_equal(p.shard_total, 64);
    assert_int_equal(p.max_padded, 96);
    assert_int_equal(p.group_of_unit[2], 1);
    /* rank 2 holds [64, 96) of group 1: unit 1's [64, 79) at the start of
     * its shard of the group (buffer 32), unit 2's [0, 10) after the gap */
    uint64_t off;
    dt_range_t r = dt_shard_held(&p, 1, 2, &off);
    assert_true(r.offset == 64 && r.count == 15 && off == 32);
    r = dt_shard_held(&p, 2, 2, &off);
    assert_true(r.offset == 0 && r.count == 10 && off == 48);
    r = dt_shard_held(&p, 2, 1, &off);
    assert_int_equal(r.count, 0); /* rank 1's [32, 64) is all unit 1 */
    dt_shard_plan_free(&p, &th.host);

    /* bad spans: overlap, a hole, out of range */
    const dt_bucket_span_t overlap[2] = {{.unit_lo = 0, .unit_hi = 1}, {.unit_lo = 1, .unit_hi = 2}};
    assert_status(dt_shard_plan_init(&p, &th.host, &toy, overlap, 2, 2, 1, NULL), DT_ERR_INVALID);
    assert_msg_has("shard plan: unit 'block.0' (1) is in groups 0 and 1");
    assert_null(p.groups);
    const dt_bucket_span_t hole[1] = {{.unit_lo = 0, .unit_hi = 1}};
    assert_status(dt_shard_plan_init(&p, &th.host, &toy, hole, 1, 2, 1, NULL), DT_ERR_INVALID);
    assert_msg_has("shard plan: unit 'head' (2) is in no group");
    const dt_bucket_span_t far[1] = {{.unit_lo = 0, .unit_hi = 5}};
    assert_status(dt_shard_plan_init(&p, &th.host, &toy, far, 1, 2, 1, NULL), DT_ERR_INVALID);
    assert_msg_has("group 0 spans units 0..5 of a 3-unit model");
    assert_status(dt_shard_plan_init(&p, &th.host, &toy, NULL, 0, 0, 1, NULL), DT_ERR_INVALID);
    assert_int_equal(th.mem.current[DT_TAG_OTHER], 0); /* nothing leaked */
}

/* For every world size 1..5, alignment 1 and 16, one group per unit and
 * merged groups: the held ranges of all ranks partition each unit, and
 * each lands in its rank's shard buffer where the group layout says. */
static void test_held_partition(void **state)
{
    dt_test_host_t th;
    dt_test_host_init(&th, "sdk/shard", NULL);
    for (uint32_t ranks = 1; ranks <= 5; ranks++)
        for (int a = 0; a < 2; a++)
            for (int sp = 0; sp < 2; sp++) {
                uint32_t align = a ? 16 : 1;
                dt_shard_plan_t p;
                assert_ok(dt_shard_plan_init(&p, &th.host, &pmodel, sp ? merged : NULL,
                                             sp ? 2 : 0, ranks, align, NULL));
                uint64_t shard_sum = 0;
                for (uint32_t g = 0; g < p.n_groups; g++) {
                    assert_true(p.groups[g].shard >= 1 && p.groups[g].shard % align == 0);
                    assert_true(p.groups[g].padded >= p.groups[g].numel);
                    assert_true(p.groups[g].padded - p.groups[g].numel < (uint64_t)ranks * align +
                                                                             ranks);
                    shard_sum += p.groups[g].shard;
                }
                assert_int_equal(shard_sum, p.shard_total);
                for (uint32_t u = 0; u < PU; u++) {
                    uint8_t seen[64] = {0};
                    const dt_shard_group_t *g = &p.groups[p.group_of_unit[u]];
                    assert_int_equal(p.unit_off[u] % align, 0);
                    for (uint32_t r = 0; r < ranks; r++) {
                        uint64_t off;
                        dt_range_t h = dt_shard_held(&p, u, r, &off);
                        if (h.count == 0)
                            continue;
                        assert_true(h.offset + h.count <= pu[u].numel);
                        /* buffer position == position inside rank r's shard */
                        assert_int_equal(off - g->shard_off + (uint64_t)r * g->shard,
                                         p.unit_off[u] + h.offset);
                        assert_true(off + h.count <= g->shard_off + g->shard);
                        for (uint64_t i = h.offset; i < h.offset + h.count; i++)
                            assert_int_equal(seen[i]++, 0);
                    }
                    for (uint64_t i = 0; i < pu[u].numel; i++)
                        assert_int_equal(seen[i], 1);
                }
                /* a rank past the group, a unit past the model: nothing */
                assert_int_equal(dt_shard_held(&p, 0, ranks, NULL).count, 0);
                assert_int_equal(dt_shard_held(&p, PU, 0, NULL).count, 0);
                dt_shard_plan_free(&p, &th.host);
            }
    /* n < world: unit 0 (2 elements) over 4 ranks, alignment 1: ranks 2, 3
     * hold none of it, only padding */
    dt_shard_plan_t p;
    assert_ok(dt_shard_plan_init(&p, &th.host, &pmodel, NULL, 0, 4, 1, NULL));
    assert_int_equal(p.groups[0].shard, 1);
    assert_int_equal(dt_shard_held(&p, 0, 1, NULL).offset, 1);
    assert_int_equal(dt_shard_held(&p, 0, 2, NULL).count, 0);
    assert_int_equal(dt_shard_held(&p, 0, 3, NULL).count, 0);
    dt_shard_plan_free(&p, &th.host);
}

/* ------------------------------------------------ collectives over shm */

/* The value of element e of unit u (exact in f32). */
static float code(uint32_t u, uint64_t e)
{
    return (float)(1000 * u + e) + 0.5f;
}

/* What position k of group g holds in a full copy: a unit's element, or
 * 0 in alignment gaps and padding. */
static float full_value(const dt_shard_plan_t *p, uint32_t g, uint64_t k)
{
    for (uint32_t u = p->groups[g].unit_lo; u <= p->groups[g].unit_hi; u++)
        if (k >= p->unit_off[u] && k < p->unit_off[u] + pu[u].numel)
            return code(u, k - p->unit_off[u]);
    return 0.0f;
}

static const dt_test_kv_t shm_kv[] = {{"slot_bytes", "65536"}, {NULL, NULL}};

/* Rank `rank` of `size`: the test hosts (`th` the engine's), its cpu
 * device and its shm communicator; a failure ends the child. */
typedef struct rank_env {
    dt_test_host_t th_cpu, th_shm, th;
    dt_device_t *dev;
    dt_comm_t *comm;
} rank_env_t;

static void open_rank(rank_env_t *x, int rank, int size, const char *job)
{
    dt_test_host_init(&x->th_cpu, "device/cpu", NULL);
    dt_test_host_init(&x->th_shm, "comm/shm", shm_kv);
    dt_test_host_init(&x->th, "sdk/shard", NULL);
    dt_device_init_v1_t di = {.struct_size = sizeof di, .rank = rank, .local_rank = rank,
                              .local_size = size, .device_index = -1};
    DT_MP_OK(D->init(&x->th_cpu.host, &di, &x->dev));
    dt_comm_init_v1_t ci = {.struct_size = sizeof ci, .rank = rank, .size = size,
                            .local_rank = rank, .local_size = size, .job_id = job,
                            .timeout_ms = 20000, .dev = x->dev};
    DT_MP_OK(SHM->init(&x->th_shm.host, &ci, &x->comm));
}

static int rank_collectives(int rank, int size, const char *job, void *arg)
{
    rank_env_t x;
    open_rank(&x, rank, size, job);
    dt_device_t *dev = x.dev;
    dt_comm_t *comm = x.comm;
    static float shard[256], full[512], full2[512], grads[512], red[256];
    dt_comm_req_t *req[PU];
    for (int a = 0; a < 2; a++)
        for (int sp = 0; sp < 2; sp++) {
            dt_shard_plan_t p;
            DT_MP_OK(dt_shard_plan_init(&p, &x.th.host, &pmodel, sp ? merged : NULL, sp ? 2 : 0,
                                        (uint32_t)size, a ? 16 : 1, NULL));
            DT_MP_CHECK(p.full_total <= 512 && p.shard_total <= 256);
            /* this rank's shards: its part of every group, gaps zero */
            for (uint32_t g = 0; g < p.n_groups; g++)
                for (uint64_t j = 0; j < p.groups[g].shard; j++)
                    shard[p.groups[g].shard_off + j] =
                        full_value(&p, g, (uint64_t)rank * p.groups[g].shard + j);
            /* gather: every group started, then all waited (last first) */
            for (uint64_t i = 0; i < p.full_total; i++)
                full[i] = full2[i] = -7.0f;
            for (uint32_t g = 0; g < p.n_groups; g++)
                DT_MP_OK(dt_shard_gather(&x.th.host, comm, &p, g, shard + p.groups[g].shard_off,
                                         full + p.groups[g].full_off, DT_F32, NULL, &req[g]));
            for (uint32_t g = p.n_groups; g-- > 0;)
                DT_MP_OK(SHM->wait(comm, req[g], -1));
            /* in place: the shard already at its slot of the full copy */
            for (uint32_t g = 0; g < p.n_groups; g++) {
                float *f = full2 + p.groups[g].full_off;
                memcpy(f + (uint64_t)rank * p.groups[g].shard, shard + p.groups[g].shard_off,
                       p.groups[g].shard * sizeof(float));
                DT_MP_OK(dt_shard_gather(&x.th.host, comm, &p, g,
                                         f + (uint64_t)rank * p.groups[g].shard, f, DT_F32, NULL,
                                         NULL));
            }
            for (uint32_t g = 0; g < p.n_groups; g++)
                for (uint64_t k = 0; k < p.groups[g].padded; k++) {
                    float want = full_value(&p, g, k);
                    DT_MP_CHECK(full[p.groups[g].full_off + k] == want);
                    DT_MP_CHECK(full2[p.groups[g].full_off + k] == want);
                }
            /* reduce-scatter AVG: rank r contributes (r + 1) * x */
            for (uint32_t g = 0; g < p.n_groups; g++)
                for (uint64_t k = 0; k < p.groups[g].padded; k++)
                    grads[p.groups[g].full_off + k] = (float)(rank + 1) * 0.25f * (float)(k + 1);
            for (uint32_t g = 0; g < p.n_groups; g++)
                DT_MP_OK(dt_shard_reduce(&x.th.host, comm, &p, g, grads + p.groups[g].full_off,
                                         red + p.groups[g].shard_off, DT_F32, DT_OP_AVG, NULL,
                                         &req[g]));
            for (uint32_t g = 0; g < p.n_groups; g++)
                DT_MP_OK(SHM->wait(comm, req[g], -1));
            double mean = (size + 1) / 2.0;
            for (uint32_t g = 0; g < p.n_groups; g++)
                for (uint64_t j = 0; j < p.groups[g].shard; j++) {
                    uint64_t k = (uint64_t)rank * p.groups[g].shard + j;
                    double want = mean * 0.25 * (double)(k + 1);
                    DT_MP_CHECK(fabs(red[p.groups[g].shard_off + j] - want) <= 1e-6 * want);
                }
            /* in place: this rank's block of the input receives the result */
            for (uint32_t g = 0; g < p.n_groups; g++) {
                float *f = grads + p.groups[g].full_off;
                DT_MP_OK(dt_shard_reduce(&x.th.host, comm, &p, g, f,
                                         f + (uint64_t)rank * p.groups[g].shard, DT_F32,
                                         DT_OP_AVG, NULL, NULL));
                for (uint64_t j = 0; j < p.groups[g].shard; j++)
                    DT_MP_CHECK(f[(uint64_t)rank * p.groups[g].shard + j] ==
                                red[p.groups[g].shard_off + j]);
            }
            dt_shard_plan_free(&p, &x.th.host);
        }
    SHM->finalize(comm);
    D->finalize(dev);
    return 0;
}

/* A pipeline stage's data group (2 ranks, both the same stage): units 0
 * and 1 held, unit 2 another stage's, all three in one ZeRO-1 group (full
 * gradients reduced in place, overlapped).  The group is complete in the
 * last micro-step only when both held units reported their last use: a
 * count that took unit 2 in would run from micro-step 0 into 1 and start
 * the in-place reduce-scatter at unit 1's report, before unit 0's
 * gradient (the bug that gave ZeRO-1 at pp2 x dp2 wrong gradients).  Then
 * the step's norm is the reduced gradient's: rank r adds (r + 1) x (m + 1)
 * x c to every element in micro-step m, so the average over ranks and the
 * sum over micro-steps is 1.5 x 3 = 4.5 x c. */
static int rank_stage(int rank, int size, const char *job, void *arg)
{
    (void)arg;
    rank_env_t x;
    open_rank(&x, rank, size, job);
    dt_device_t *dev = x.dev;
    dt_comm_t *comm = x.comm;
    dt_stream_t *cs;
    DT_MP_OK(D->stream_create(dev, &cs));
    dt_model_desc_v1_t model = dt_toy_model(DT_F32);
    dt_optim_desc_v1_t optim = {.struct_size = sizeof optim, .kind = DT_OPTIM_SGD};
    const uint8_t flags[DT_TOY_NU] = {DT_UNIT_HELD, DT_UNIT_HELD, 0};
    dt_strategy_init_v1_t ia = {.struct_size = sizeof ia, .n_micro = 2,
                                .dev = dev, .compute_stream = cs,
                                .comm = comm, .model = &model, .optim = &optim,
                                .unit_flags = flags};
    const dt_bucket_span_t one[1] = {{.unit_lo = 0, .unit_hi = DT_TOY_NU - 1}};
    dt_shard_cfg_t cfg = {.what = "zero stage 1", .params_replicated = 1, .grads_full = 1,
                          .overlap = 1, .spans = one, .n_spans = 1};
    dt_shard_engine_t e;
    DT_MP_OK(dt_shard_engine_init(&e, NULL, &x.th.host, &ia, &cfg));
    DT_MP_CHECK(e.plan.n_groups == 1 && e.g[0].n_units == 2);
    static float buf[DT_TOY_MAXN];
    for (uint32_t u = 0; u < 2; u++) {
        uint64_t k = dt_toy_unit(u)->numel;
        for (uint64_t i = 0; i < k; i++)
            buf[i] = dt_toy_pval(u, i);
        uint64_t off;
        dt_range_t r = dt_shard_held(&e.plan, u, e.srank, &off);
        DT_MP_OK(dt_shard_set_state(&e, u, DT_STATE_PARAMS, r, buf + r.offset));
    }
    DT_MP_OK(dt_shard_state_loaded(&e));
    DT_MP_OK(dt_shard_begin_step(&e, 1));
    double want = 0.0;
    for (uint32_t m = 0; m < 2; m++)
        for (uint32_t u = 2; u-- > 0;) {
            dt_hook_v1_t h = {.struct_size = sizeof h, .unit = u, .micro = m, .n_micro = 2,
                              .last_use = 1};
            dt_unit_buffers_v1_t b = {.struct_size = sizeof b};
            DT_MP_OK(dt_shard_pre_backward(&e, &h, &b));
            uint64_t k = dt_toy_unit(u)->numel;
            DT_MP_OK(D->memcpy_async(dev, buf, b.grads, k * sizeof(float), DT_COPY_D2H, cs));
            DT_MP_OK(D->stream_sync(dev, cs));
            for (uint64_t i = 0; i < k; i++) {
                const double c = 0.01 * (double)(u + 1) + 0.001 * (double)i;
                buf[i] += (float)((rank + 1) * (m + 1) * c);
                if (m == 1)
                    want += 4.5 * c * 4.5 * c;
            }
            DT_MP_OK(D->memcpy_async(dev, b.grads, buf, k * sizeof(float), DT_COPY_H2D, cs));
            DT_MP_OK(D->stream_sync(dev, cs));
            DT_MP_OK(dt_shard_post_backward(&e, &h));
            /* started only once unit 0, the last held unit, reported in
             * the last micro-step */
            if (e.g[0].final_sent != (m == 1 && u == 0)) {
                dt_mp_fail("rank %d: after unit %u's last use in micro-step %u the group's "
                           "reduction is %s", rank, u, m,
                           e.g[0].final_sent ? "started" : "not started");
                DT_MP_CHECK(0);
            }
        }
    dt_step_args_v1_t sa = {.struct_size = sizeof sa, .step = 1, .lr = 0.0f};
    dt_step_result_v1_t res = {.struct_size = sizeof res};
    DT_MP_OK(dt_shard_step(&e, &sa, &res));
    if (fabs(res.grad_norm - sqrt(want)) > 1e-5 * sqrt(want)) {
        dt_mp_fail("rank %d: grad norm %.9g, want %.9g", rank, res.grad_norm, sqrt(want));
        DT_MP_CHECK(0);
    }
    dt_shard_engine_free(&e);
    D->stream_destroy(dev, cs);
    SHM->finalize(comm);
    D->finalize(dev);
    return 0;
}

static void test_mp_stage_group_complete(void **state)
{
    (void)state;
    dt_mp_run_ranks(2, rank_stage, NULL, 60.0, "shard-stage");
}

static void test_mp_gather_reduce(void **state)
{
    for (int size = 1; size <= 4; size++)
        dt_mp_run_ranks(size, rank_collectives, NULL, 60.0, "shard");
}

/* An out-of-range group is refused before any collective starts. */
static void test_collective_errors(void **state)
{
    dt_test_host_t th;
    dt_test_host_init(&th, "sdk/shard", NULL);
    dt_shard_plan_t p;
    assert_ok(dt_shard_plan_init(&p, &th.host, &pmodel, NULL, 0, 2, 1, NULL));
    float buf[4];
    assert_status(dt_shard_gather(&th.host, NULL, &p, 4, buf, buf, DT_F32, NULL, NULL),
                  DT_ERR_INVALID);
    assert_msg_has("sdk/shard: gather: group 4 of 4");
    assert_status(dt_shard_reduce(&th.host, NULL, &p, 9, buf, buf, DT_F32, DT_OP_AVG, NULL,
                                  NULL),
                  DT_ERR_INVALID);
    assert_msg_has("reduce: group 9 of 4");
    dt_shard_plan_free(&p, &th.host);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrap_plan),
        cmocka_unit_test(test_plan_layout),
        cmocka_unit_test(test_plan_alone),
        cmocka_unit_test(test_mp_stage_group_complete),
        cmocka_unit_test(test_held_partition),
        cmocka_unit_test(test_collective_errors),
        cmocka_unit_test(test_mp_gather_reduce),
    };
    return cmocka_run_group_tests(tests, group_setup, NULL);
}
