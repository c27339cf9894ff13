/*
 * tests/unit/plugins/megatron/test_tensor_parallel.c - the shipped tensor-parallel scheme
 * (`megatron`, plugins/megatron), loaded with dlopen and driven through its
 * tensor table (dtrain/tensor_parallel.h) the way the model drives it.
 *
 *   - the table: kind tensor, ABI 1.0, every slot, no keys of its own;
 *   - init's refusals with their exact messages: an argument struct below
 *     its minor-0 size, no communicator operations, no communicator, a
 *     group of one rank (the self communicator);
 *   - each collective on 2 forked ranks over the shm communicator and the
 *     cpu device, against the expected sums and maxima: row_forward (f32
 *     and bf16), column_backward_start then _wait (and a wait of NULL),
 *     embedding_forward, xent_reduce with DT_OP_MAX and DT_OP_SUM, and an
 *     op the statistics never use refused on both ranks before anything
 *     is sent;
 *   - the traffic counters: the group's rank 0, and only it, logs
 *     "tensor group of 2 ranks: N all-reduces of B bytes in all" at
 *     finalize, with every collective above counted (the line
 *     bench/bench_tensor.sh reads).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "dtrain/half.h"
#include "mp_check.h"
#include "mp_cpu_shm.h"
#include "mp_harness.h"
#include "test_host.h"
#include "test_plugin.h"
#include "util/error.h"

static const dt_tensor_ops_v1_t *MG;
static const dt_device_ops_v1_t *DEV;
static const dt_comm_ops_v1_t *SHM, *SELF;

/* ----------------------------------------------------------- table -- */

static void test_table(void **state)
{
    (void)state;
    const dt_plugin_info_t *in = &MG->info;
    assert_string_equal(in->name, "megatron");
    assert_int_equal(in->kind, DT_KIND_TENSOR);
    assert_int_equal(in->abi_major, 1);
    assert_int_equal(in->abi_minor, 0);
    assert_int_equal(in->struct_size, sizeof(dt_tensor_ops_v1_t));
    assert_int_equal(in->n_config_keys, 0);
    assert_non_null(MG->init);
    assert_non_null(MG->finalize);
    assert_non_null(MG->row_forward);
    assert_non_null(MG->column_backward_start);
    assert_non_null(MG->column_backward_wait);
    assert_non_null(MG->embedding_forward);
    assert_non_null(MG->xent_reduce);
}

/* ------------------------------------------------------- refusals -- */

static void expect_init_refused(const dt_tensor_init_v1_t *a, int rc, const char *msg)
{
    dt_test_host_t th;
    dt_test_host_init(&th, "tensor/megatron", NULL);
    dt_err_clear();
    dt_tensor_group_t *g = (dt_tensor_group_t *)&th; /* overwritten with NULL */
    assert_int_equal(MG->init(&th.host, a, &g), rc);
    assert_null(g);
    assert_string_equal(dt_last_error(), msg);
}

static void test_init_refusals(void **state)
{
    (void)state;
    /* the self communicator: a world, and so a group, of one rank */
    dt_test_host_t ch;
    dt_test_host_init(&ch, "comm/self", NULL);
    dt_comm_init_v1_t ci = {.struct_size = sizeof ci, .rank = 0, .size = 1, .local_rank = 0,
                            .local_size = 1, .job_id = "tp-self", .timeout_ms = 5000};
    dt_comm_t *one = NULL;
    assert_int_equal(SELF->init(&ch.host, &ci, &one), DT_OK);

    dt_tensor_init_v1_t a = {.struct_size = 4, .comm = one};
    char msg[256];
    snprintf(msg, sizeof msg,
             "tensor/megatron: init args: struct_size 4 is below the %u bytes of its minor 0 "
             "(caller built against another ABI)",
             (unsigned)DT_TENSOR_INIT_V1_SIZE0);
    expect_init_refused(&a, DT_ERR_ABI, msg);
    a = (dt_tensor_init_v1_t){.struct_size = sizeof a};
    expect_init_refused(&a, DT_ERR_INVALID, "tensor/megatron: init: NULL comm");
    a = (dt_tensor_init_v1_t){.struct_size = sizeof a, .comm = one};
    expect_init_refused(&a, DT_ERR_INVALID,
                        "tensor/megatron: init: a tensor group of 1 rank(s)");
    SELF->finalize(one);
    MG->finalize(NULL); /* nothing */
}

/* ---------------------------------- the collectives, on 2 forked ranks -- */

#define P 2
#define N 6 /* elements of each buffer */

typedef struct {
    char log[P][8][256]; /* each rank's INFO lines from the scheme */
    int n_log[P];
} shared_t;
static shared_t *shared; /* with the forked ranks */

static void capture_log(const dt_host_v1_t *h, int level, const char *fmt, ...)
{
    (void)h;
    int r = dt_mp_rank();
    if (level != DT_LOG_INFO || r < 0 || r >= P || shared->n_log[r] >= 8)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(shared->log[r][shared->n_log[r]++], sizeof shared->log[0][0], fmt, ap);
    va_end(ap);
}

/* buf (device memory, f32) against want[], exactly: the sums of small
 * integers are exact in f32 */
static int same(const float *got, const float *want, int n)
{
    for (int i = 0; i < n; i++)
        if (got[i] != want[i]) {
            fprintf(stderr, "element %d: %g, want %g\n", i, (double)got[i], (double)want[i]);
            return 0;
        }
    return 1;
}

static int rank_collectives(int rank, int nproc, const char *job, void *arg)
{
    (void)arg;
    dt_test_host_t th;
    dt_test_host_init(&th, "tensor/megatron", NULL);
    th.host.log = capture_log;
    dt_mp_cpu_shm_t e;
    DT_MP_OK(dt_mp_cpu_shm_open(&e, DEV, SHM, rank, nproc, job));
    dt_device_t *dev = e.dev;
    dt_stream_t *cs = e.stream;
    dt_comm_t *world = e.world;
    dt_tensor_init_v1_t ti = {.struct_size = sizeof ti, .dev = dev,
                              .compute_stream = cs, .comm = world};
    dt_tensor_group_t *g;
    DT_MP_OK(MG->init(&th.host, &ti, &g));
    float *buf, want[N];
    uint16_t *half;
    DT_MP_OK(DEV->alloc(dev, N * sizeof *buf, DT_TAG_ACTIVATIONS, (void **)&buf));
    DT_MP_OK(DEV->alloc(dev, N * sizeof *half, DT_TAG_ACTIVATIONS, (void **)&half));
    const float r = (float)rank;

    /* row_forward: a row-parallel layer's partial outputs, summed */
    for (int i = 0; i < N; i++) {
        buf[i] = (r + 1) * (float)(i + 1);
        want[i] = 3.0f * (float)(i + 1);
    }
    DT_MP_OK(MG->row_forward(g, buf, N, DT_F32, cs));
    DT_MP_CHECK(same(buf, want, N));
    /* the same in bf16 (activations of a bf16 run): small integers exact */
    for (int i = 0; i < N; i++)
        half[i] = dt_f32_to_bf16((r + 1) * (float)(i + 1));
    DT_MP_OK(MG->row_forward(g, half, N, DT_BF16, cs));
    for (int i = 0; i < N; i++)
        DT_MP_CHECK(dt_bf16_to_f32(half[i]) == want[i]);

    /* column_backward: started, in flight, then waited */
    for (int i = 0; i < N; i++) {
        buf[i] = 10.0f * r + (float)i;
        want[i] = 10.0f + 2.0f * (float)i;
    }
    dt_comm_req_t *req = NULL;
    DT_MP_OK(MG->column_backward_start(g, buf, N, DT_F32, cs, &req));
    DT_MP_OK(MG->column_backward_wait(g, req));
    DT_MP_CHECK(same(buf, want, N));
    DT_MP_OK(MG->column_backward_wait(g, NULL)); /* nothing in flight */

    /* embedding_forward: each rank's vocabulary rows looked up, zero
     * elsewhere (here: rank 0 the even elements, rank 1 the odd) */
    for (int i = 0; i < N; i++) {
        buf[i] = i % 2 == rank ? (float)(100 + i) : 0.0f;
        want[i] = (float)(100 + i);
    }
    DT_MP_OK(MG->embedding_forward(g, buf, N, DT_F32, cs));
    DT_MP_CHECK(same(buf, want, N));

    /* xent_reduce: the row maxima, then the sums */
    for (int i = 0; i < N; i++) {
        buf[i] = i % 2 == rank ? (float)(7 + i) : -(float)(7 + i);
        want[i] = (float)(7 + i);
    }
    DT_MP_OK(MG->xent_reduce(g, buf, N, DT_OP_MAX, cs));
    DT_MP_CHECK(same(buf, want, N));
    for (int i = 0; i < N; i++) {
        buf[i] = (r + 1) * 0.5f * (float)i;
        want[i] = 1.5f * (float)i;
    }
    DT_MP_OK(MG->xent_reduce(g, buf, N, DT_OP_SUM, cs));
    DT_MP_CHECK(same(buf, want, N));
    /* another op: refused on each rank before anything is sent */
    dt_err_clear();
    DT_MP_CHECK(MG->xent_reduce(g, buf, N, DT_OP_MIN, cs) == DT_ERR_INVALID);
    char msg[160];
    snprintf(msg, sizeof msg,
             "tensor/megatron: xent_reduce: op %d (the row statistics are a maximum or a sum)",
             DT_OP_MIN);
    DT_MP_CHECK(strcmp(dt_last_error(), msg) == 0);
    /* the group still works after the refusal */
    DT_MP_OK(MG->row_forward(g, buf, 1, DT_F32, cs));
    DT_MP_CHECK(buf[0] == 0.0f);

    DEV->free(dev, buf);
    DEV->free(dev, half);
    MG->finalize(g);
    dt_mp_cpu_shm_close(&e);
    return 0;
}

static void test_collectives(void **state)
{
    (void)state;
    memset(shared, 0, sizeof *shared);
    dt_mp_run_ranks(P, rank_collectives, NULL, 60.0, "tpcoll");
    /* 7 all-reduces: row f32 (24 bytes), row bf16 (12), column (24),
     * embedding (24), the maxima (24), the sums (24), the last row (4);
     * the refused one sends nothing */
    assert_int_equal(shared->n_log[0], 1);
    assert_string_equal(shared->log[0][0],
                        "tensor group of 2 ranks: 7 all-reduces of 136 bytes in all");
    assert_int_equal(shared->n_log[1], 0); /* said once, by rank 0 */
}

static int setup(void **state)
{
    (void)state;
    MG = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_megatron.so",
                              DT_ENTRY_STRING(tensor, 1), NULL);
    DEV = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_cpu.so", DT_ENTRY_STRING(device, 1),
                               NULL);
    SHM = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_shm.so", DT_ENTRY_STRING(comm, 1),
                               NULL);
    SELF = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_self.so", DT_ENTRY_STRING(comm, 1),
                                NULL);
    if (!MG || !DEV || !SHM || !SELF) {
        fprintf(stderr, "%s\n", dt_last_error());
        return -1;
    }
    shared = dt_mp_shared_alloc(sizeof *shared);
    return shared ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_init_refusals),
        cmocka_unit_test(test_collectives),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
