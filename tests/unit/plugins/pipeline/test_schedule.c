/*
 * tests/unit/plugins/pipeline/test_schedule.c - the shipped pipeline schedules (`gpipe`,
 * `1f1b`: plugins/pipeline), loaded with dlopen and driven through their
 * schedule table the way the core drives them.
 *
 *   - the tables: kind schedule, ABI 1.0, no keys of their own;
 *   - assign_stages: the balance policies (uniform, params, flops, over
 *     virtual stages too), what each stage keeps and stashes under each
 *     order, and the refusals with their exact messages;
 *   - run, on 2 forked ranks over the shm communicator and the cpu
 *     device: the order of each stage's forwards and backwards (GPipe,
 *     1F1B, interleaved 1F1B over 2 chunks) as the stage runner sees it,
 *     and that every boundary tensor and its gradient arrives from the
 *     virtual stage next to it, for the right micro-batch.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "mp_check.h"
#include "mp_cpu_shm.h"
#include "mp_harness.h"
#include "test_host.h"
#include "test_plugin.h"
#include "util/error.h"

static const dt_schedule_ops_v1_t *GPIPE, *ONEF;
static const dt_device_ops_v1_t *DEV;
static const dt_comm_ops_v1_t *COMM;

/* ---------------------------------------------------------- a model -- */

#define MAX_UNITS 8
static dt_unit_desc_v1_t units[MAX_UNITS];
static char unit_names[MAX_UNITS][16];

/* A model of n units of the given sizes (no parameter list: a schedule
 * reads unit sizes only). */
static dt_model_desc_v1_t model_of(uint32_t n, const uint64_t *numel)
{
    uint64_t total = 0;
    for (uint32_t u = 0; u < n; u++) {
        snprintf(unit_names[u], sizeof unit_names[u], "unit.%u", u);
        units[u] = (dt_unit_desc_v1_t){.name = unit_names[u], .index = u, .numel = numel[u]};
        total += numel[u];
    }
    return (dt_model_desc_v1_t){.struct_size = sizeof(dt_model_desc_v1_t), .n_units = n,
                                .arch = "test", .units = units, .numel = total,
                                .param_dtype = DT_F32};
}

static dt_stage_args_v1_t args_of(const dt_model_desc_v1_t *m, int32_t p, uint32_t n_micro,
                                  uint32_t chunks, uint32_t keep, int32_t balance)
{
    return (dt_stage_args_v1_t){.struct_size = sizeof(dt_stage_args_v1_t), .n_stages = p,
                                .model = m, .n_micro = n_micro, .chunks = chunks,
                                .keep_activations = keep, .balance = balance};
}

/* assign_stages through a host named "schedule/<name>", as the core's. */
static int assign(const dt_schedule_ops_v1_t *ops, const dt_stage_args_v1_t *a, uint32_t *out)
{
    dt_test_host_t th;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "schedule/%s", ops->info.name);
    dt_test_host_init(&th, prefix, NULL);
    dt_err_clear();
    return ops->assign_stages(&th.host, a, out);
}

static void assert_stages(const uint32_t *got, const uint32_t *want, uint32_t n)
{
    for (uint32_t u = 0; u < n; u++)
        if (got[u] != want[u])
            fail_msg("unit %u in stage %u, want %u", u, got[u], want[u]);
}

/* ----------------------------------------------------------- tables -- */

static void test_tables(void **state)
{
    (void)state;
    const dt_schedule_ops_v1_t *both[] = {GPIPE, ONEF};
    const char *names[] = {"gpipe", "1f1b"};
    for (int i = 0; i < 2; i++) {
        const dt_plugin_info_t *in = &both[i]->info;
        assert_string_equal(in->name, names[i]);
        assert_int_equal(in->kind, DT_KIND_SCHEDULE);
        assert_int_equal(in->abi_major, 1);
        assert_int_equal(in->abi_minor, 0);
        assert_int_equal(in->struct_size, sizeof(dt_schedule_ops_v1_t));
        assert_int_equal(in->n_config_keys, 0);
        assert_non_null(both[i]->init);
        assert_non_null(both[i]->finalize);
        assert_non_null(both[i]->assign_stages);
        assert_non_null(both[i]->run);
    }
}

/* ---------------------------------------------------------- balance -- */

static void test_balance(void **state)
{
    (void)state;
    uint32_t out[MAX_UNITS];
    /* uniform: equal counts, the first n % p stages one more */
    const uint64_t six[] = {10, 10, 1, 1, 1, 1};
    dt_model_desc_v1_t m = model_of(6, six);
    dt_stage_args_v1_t a = args_of(&m, 2, 4, 1, 1, DT_BALANCE_UNIFORM);
    assert_int_equal(assign(ONEF, &a, out), DT_OK);
    assert_stages(out, (const uint32_t[]){0, 0, 0, 1, 1, 1}, 6);
    dt_model_desc_v1_t m5 = model_of(5, six);
    a = args_of(&m5, 3, 3, 1, 1, DT_BALANCE_UNIFORM);
    assert_int_equal(assign(GPIPE, &a, out), DT_OK);
    assert_stages(out, (const uint32_t[]){0, 0, 1, 1, 2}, 5);
    /* params: the least largest stage, 10 | 10 + 4 (uniform's is 21) */
    m = model_of(6, six);
    a = args_of(&m, 2, 4, 1, 1, DT_BALANCE_PARAMS);
    assert_int_equal(assign(ONEF, &a, out), DT_OK);
    assert_stages(out, (const uint32_t[]){0, 1, 1, 1, 1, 1}, 6);
    /* flops: by the core's FLOPs a unit, the head alone */
    const double flops[] = {0, 1, 1, 1, 1, 5};
    a = args_of(&m, 2, 4, 1, 1, DT_BALANCE_FLOPS);
    a.unit_flops = flops;
    assert_int_equal(assign(GPIPE, &a, out), DT_OK);
    assert_stages(out, (const uint32_t[]){0, 0, 0, 0, 0, 1}, 6);
    /* 2 chunks a stage: 4 virtual stages over 2 ranks */
    const uint64_t eight[] = {1, 1, 1, 1, 1, 1, 1, 1};
    dt_model_desc_v1_t m8 = model_of(8, eight);
    a = args_of(&m8, 2, 4, 2, 1, DT_BALANCE_UNIFORM);
    assert_int_equal(assign(ONEF, &a, out), DT_OK);
    assert_stages(out, (const uint32_t[]){0, 0, 1, 1, 2, 2, 3, 3}, 8);
}

/* What each stage keeps and stashes: GPipe every micro-batch in flight,
 * 1F1B at most the stages left; without kept activations one, the
 * inputs stashed instead (the first stage reads tokens: none). */
static void test_in_flight(void **state)
{
    (void)state;
    uint32_t out[MAX_UNITS], keep[3], stash[3], bufs[3];
    const uint64_t six[] = {1, 1, 1, 1, 1, 1};
    dt_model_desc_v1_t m = model_of(6, six);
    static const struct {
        int gpipe;
        uint32_t keep;
        uint32_t in_flight[3], stash[3];
    } cases[] = {
        {1, 1, {4, 4, 4}, {0, 1, 1}},
        {0, 1, {3, 2, 1}, {0, 1, 1}},
        {1, 0, {1, 1, 1}, {0, 4, 4}},
        {0, 0, {1, 1, 1}, {0, 2, 1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        dt_stage_args_v1_t a = args_of(&m, 3, 4, 1, cases[i].keep, DT_BALANCE_UNIFORM);
        for (int k = 0; k < 3; k++)
            keep[k] = 1;
        a.in_flight = keep;
        a.stash = stash;
        a.buffers = bufs;
        assert_int_equal(assign(cases[i].gpipe ? GPIPE : ONEF, &a, out), DT_OK);
        for (int k = 0; k < 3; k++) {
            if (keep[k] != cases[i].in_flight[k] || stash[k] != cases[i].stash[k])
                fail_msg("case %zu stage %d: keeps %u, stashes %u; want %u, %u", i, k, keep[k],
                         stash[k], cases[i].in_flight[k], cases[i].stash[k]);
            assert_true(bufs[k] >= stash[k]);
        }
    }
}

/* ---------------------------------------------------------- refusals -- */

static void expect_refusal(const dt_schedule_ops_v1_t *ops, const dt_stage_args_v1_t *a, int rc,
                           const char *msg)
{
    uint32_t out[MAX_UNITS];
    assert_int_equal(assign(ops, a, out), rc);
    assert_string_equal(dt_last_error(), msg);
}

static void test_refusals(void **state)
{
    (void)state;
    const uint64_t four[] = {1, 1, 1, 1};
    dt_model_desc_v1_t m = model_of(4, four);
    dt_stage_args_v1_t a = args_of(&m, 2, 4, 2, 0, DT_BALANCE_UNIFORM);
    expect_refusal(ONEF, &a, DT_ERR_CONFIG,
                   "schedule/1f1b: pipeline.virtual_stages = 2 needs "
                   "pipeline.keep_activations = true: an interleaved stage keeps every chunk's "
                   "activations rather than stash each chunk's inputs to recompute them");
    a = args_of(&m, 2, 3, 2, 1, DT_BALANCE_UNIFORM);
    expect_refusal(GPIPE, &a, DT_ERR_CONFIG,
                   "schedule/gpipe: pipeline.virtual_stages = 2 needs the micro-batches of a "
                   "step ([train] grad_accum = 3) to be a multiple of the 2 stages");
    a = args_of(&m, 2, 4, 3, 1, DT_BALANCE_UNIFORM);
    expect_refusal(ONEF, &a, DT_ERR_CONFIG,
                   "schedule/1f1b: parallel.pipeline = 2 stages x pipeline.virtual_stages = 3 "
                   "chunks, but model test has 4 units (each chunk needs at least one)");
    a = args_of(&m, 2, 4, 17, 1, DT_BALANCE_UNIFORM);
    expect_refusal(ONEF, &a, DT_ERR_CONFIG,
                   "schedule/1f1b: pipeline.virtual_stages = 17: 1 to 16 chunks a stage");
    dt_model_desc_v1_t m2 = model_of(2, four);
    a = args_of(&m2, 3, 3, 1, 1, DT_BALANCE_UNIFORM);
    expect_refusal(GPIPE, &a, DT_ERR_CONFIG,
                   "schedule/gpipe: parallel.pipeline = 3 stages, but model test has 2 units "
                   "(each stage needs at least one)");
    a = args_of(&m, 2, 4, 1, 1, DT_BALANCE_FLOPS);
    expect_refusal(ONEF, &a, DT_ERR_CONFIG,
                   "schedule/1f1b: balance = \"flops\": the core gives no unit FLOPs; use "
                   "\"params\"");
    a = args_of(&m, 2, 4, 1, 1, 7);
    expect_refusal(ONEF, &a, DT_ERR_UNSUPPORTED, "schedule/1f1b: assign_stages: balance policy 7");
    /* a newer core's field this schedule does not know: refused (abi.h
     * rule 3), never ignored */
    struct {
        dt_stage_args_v1_t a;
        uint64_t newer;
    } big = {args_of(&m, 2, 4, 1, 1, DT_BALANCE_UNIFORM), 1};
    big.a.struct_size = sizeof big;
    uint32_t out[MAX_UNITS];
    assert_int_equal(assign(ONEF, &big.a, out), DT_ERR_UNSUPPORTED);
    big.newer = 0;
    assert_int_equal(assign(ONEF, &big.a, out), DT_OK);
}

/* ------------------------------------------- run, on 2 forked ranks -- */

#define P 2
#define M 4
#define MAX_OPS 32
#define ACT 8 /* elements of a boundary tensor */

typedef struct {
    int n[P];
    int op[P][MAX_OPS]; /* 10000 x backward + 100 x chunk + micro */
    int train_n[P];     /* the training pass's, kept from n and op */
    int train_op[P][MAX_OPS];
    char err[P][256];
} trace_t;
static trace_t *trace; /* shared with the forked ranks */

typedef struct {
    int rank;
    uint32_t V;
} runner_ctx_t;

/* virtual stage j's output for micro-batch m, and its input gradient */
static float act_of(uint32_t j, uint32_t m) { return (float)(1000 * (j + 1) + m); }

static int record(runner_ctx_t *c, int bwd, uint32_t chunk, uint32_t micro)
{
    int *n = &trace->n[c->rank];
    if (*n < MAX_OPS)
        trace->op[c->rank][(*n)++] = bwd * 10000 + (int)chunk * 100 + (int)micro;
    return DT_OK;
}

static int bad(runner_ctx_t *c, const char *what, uint32_t chunk, uint32_t micro, float got,
               float want)
{
    snprintf(trace->err[c->rank], sizeof trace->err[c->rank],
             "%s of chunk %u micro %u: %g, want %g", what, chunk, micro, got, want);
    return dt_err_set(DT_ERR_INVALID, "%s", trace->err[c->rank]);
}

static int fwd(void *ctx, uint32_t chunk, uint32_t micro, const void *in, void *out, double *loss)
{
    runner_ctx_t *c = ctx;
    const uint32_t j = chunk * P + (uint32_t)c->rank, last = c->V * P - 1;
    if ((j == 0) != (in == NULL) || (j == last) != (out == NULL))
        return bad(c, "forward's buffers", chunk, micro, in ? 1.0f : 0.0f, 0);
    if (in && ((const float *)in)[ACT - 1] != act_of(j - 1, micro))
        return bad(c, "forward input", chunk, micro, ((const float *)in)[ACT - 1],
                   act_of(j - 1, micro));
    if (out)
        for (int i = 0; i < ACT; i++)
            ((float *)out)[i] = act_of(j, micro);
    else
        *loss += (double)micro;
    return record(c, 0, chunk, micro);
}

static int bwd(void *ctx, uint32_t chunk, uint32_t micro, const void *in, const void *dout,
               void *din)
{
    runner_ctx_t *c = ctx;
    (void)in;
    const uint32_t j = chunk * P + (uint32_t)c->rank, last = c->V * P - 1;
    if ((j == last) != (dout == NULL) || (j == 0) != (din == NULL))
        return bad(c, "backward's buffers", chunk, micro, dout ? 1.0f : 0.0f, 0);
    if (dout && ((const float *)dout)[0] != -act_of(j + 1, micro))
        return bad(c, "output gradient", chunk, micro, ((const float *)dout)[0],
                   -act_of(j + 1, micro));
    if (din)
        for (int i = 0; i < ACT; i++)
            ((float *)din)[i] = -act_of(j, micro);
    return record(c, 1, chunk, micro);
}

typedef struct {
    const dt_schedule_ops_v1_t **ops;
    uint32_t V;
} run_case_t;

static int rank_run(int rank, int nproc, const char *job, void *arg)
{
    const run_case_t *rc_ = arg;
    const dt_schedule_ops_v1_t *ops = *rc_->ops;
    dt_test_host_t sh;
    dt_test_host_init(&sh, "schedule/test", NULL);
    dt_mp_cpu_shm_t e;
    DT_MP_OK(dt_mp_cpu_shm_open(&e, DEV, COMM, rank, nproc, job));
    dt_device_t *dev = e.dev;
    dt_stream_t *cs = e.stream;
    dt_comm_t *world = e.world;
    dt_schedule_init_v1_t si = {.struct_size = sizeof si, .n_micro = M,
                                .dev = dev, .compute_stream = cs,
                                .comm = world, .chunks = rc_->V, .keep_activations = 1};
    dt_schedule_t *s;
    DT_MP_OK(ops->init(&sh.host, &si, &s));
    runner_ctx_t c = {.rank = rank, .V = rc_->V};
    /* every micro-batch in flight kept: the schedule never recomputes */
    dt_stage_runner_v1_t rn = {.struct_size = sizeof rn, .act_slots = M, .ctx = &c,
                               .forward = fwd, .backward = bwd};
    dt_schedule_args_v1_t a = {.struct_size = sizeof a, .n_micro = M, .step = 1,
                               .act_count = ACT, .act_dtype = DT_F32, .runner = &rn};
    dt_schedule_result_v1_t r = {.struct_size = sizeof r};
    DT_MP_OK(ops->run(s, &a, &r));
    /* the last stage holds the losses: micro-batches 0..3 */
    if (rank == P - 1)
        DT_MP_CHECK(r.n_loss == M && r.loss_sum == 6.0);
    else
        DT_MP_CHECK(r.n_loss == 0);
    trace->train_n[rank] = trace->n[rank];
    memcpy(trace->train_op[rank], trace->op[rank], sizeof trace->op[rank]);
    /* a forwards-only pass (evaluation): every forward, no backward */
    trace->n[rank] = 0;
    a.flags = DT_SCHEDULE_NO_GRAD;
    DT_MP_OK(ops->run(s, &a, &r));
    DT_MP_CHECK(trace->n[rank] == (int)(M * rc_->V));
    ops->finalize(s);
    dt_mp_cpu_shm_close(&e);
    return 0;
}

/* F = forward, B = backward of (chunk, micro) */
#define F(c, m) ((c) * 100 + (m))
#define B(c, m) (10000 + (c) * 100 + (m))

/* Run the schedule on P ranks; each rank's training pass must be `want`
 * (n[k] operations on rank k). */
static void run_and_check(const dt_schedule_ops_v1_t **ops, uint32_t V, const int want[P][MAX_OPS],
                          const int n[P])
{
    memset(trace, 0, sizeof *trace);
    run_case_t rc_ = {.ops = ops, .V = V};
    dt_mp_run_ranks(P, rank_run, &rc_, 60.0, "sched");
    for (int k = 0; k < P; k++) {
        if (trace->err[k][0])
            fail_msg("rank %d: %s", k, trace->err[k]);
        assert_int_equal(trace->train_n[k], n[k]);
        for (int i = 0; i < n[k]; i++)
            if (trace->train_op[k][i] != want[k][i])
                fail_msg("rank %d, operation %d: %s(%d, %d), want %s(%d, %d)", k, i,
                         trace->train_op[k][i] >= 10000 ? "B" : "F",
                         trace->train_op[k][i] % 10000 / 100, trace->train_op[k][i] % 100,
                         want[k][i] >= 10000 ? "B" : "F", want[k][i] % 10000 / 100,
                         want[k][i] % 100);
    }
}

static void test_run_gpipe(void **state)
{
    (void)state;
    static const int want[P][MAX_OPS] = {
        {F(0, 0), F(0, 1), F(0, 2), F(0, 3), B(0, 0), B(0, 1), B(0, 2), B(0, 3)},
        {F(0, 0), F(0, 1), F(0, 2), F(0, 3), B(0, 0), B(0, 1), B(0, 2), B(0, 3)},
    };
    static const int n[P] = {8, 8};
    run_and_check(&GPIPE, 1, want, n);
}

static void test_run_1f1b(void **state)
{
    (void)state;
    /* stage 0 warms up with p - 1 = 1 forward; the last stage alternates */
    static const int want[P][MAX_OPS] = {
        {F(0, 0), F(0, 1), B(0, 0), F(0, 2), B(0, 1), F(0, 3), B(0, 2), B(0, 3)},
        {F(0, 0), B(0, 0), F(0, 1), B(0, 1), F(0, 2), B(0, 2), F(0, 3), B(0, 3)},
    };
    static const int n[P] = {8, 8};
    run_and_check(&ONEF, 1, want, n);
}

static void test_run_interleaved(void **state)
{
    (void)state;
    /* Megatron's interleaved 1F1B, 2 chunks: groups of p = 2 micro-batches
     * through each chunk in turn; stage k warms up with (p - k - 1) x 2 +
     * (V - 1) p forwards (4 and 2), backwards over the chunks reversed */
    static const int want[P][MAX_OPS] = {
        {F(0, 0), F(0, 1), F(1, 0), F(1, 1), F(0, 2), B(1, 0), F(0, 3), B(1, 1), F(1, 2),
         B(0, 0), F(1, 3), B(0, 1), B(1, 2), B(1, 3), B(0, 2), B(0, 3)},
        {F(0, 0), F(0, 1), F(1, 0), B(1, 0), F(1, 1), B(1, 1), F(0, 2), B(0, 0), F(0, 3),
         B(0, 1), F(1, 2), B(1, 2), F(1, 3), B(1, 3), B(0, 2), B(0, 3)},
    };
    static const int n[P] = {16, 16};
    run_and_check(&ONEF, 2, want, n);
}

static int setup(void **state)
{
    (void)state;
    GPIPE = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_gpipe.so",
                                 DT_ENTRY_STRING(schedule, 1), NULL);
    ONEF = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_1f1b.so",
                                DT_ENTRY_STRING(schedule, 1), NULL);
    DEV = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_cpu.so", DT_ENTRY_STRING(device, 1),
                               NULL);
    COMM = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_shm.so", DT_ENTRY_STRING(comm, 1),
                                NULL);
    if (!GPIPE || !ONEF || !DEV || !COMM) {
        fprintf(stderr, "%s\n", dt_last_error());
        return -1;
    }
    trace = mmap(NULL, sizeof *trace, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return trace == MAP_FAILED ? -1 : 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables),      cmocka_unit_test(test_balance),
        cmocka_unit_test(test_in_flight),   cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_run_gpipe),   cmocka_unit_test(test_run_1f1b),
        cmocka_unit_test(test_run_interleaved),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
