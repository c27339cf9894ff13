/*
 * tests/unit/plugins/ddp/test_ddp.c - the `ddp` strategy plugin, loaded with dlopen and
 * driven through its ops table the way the core's training loop drives it.
 *
 * Device-parametrized: `test_ddp [cpu|cuda]` (toy_train.h's backends).
 *
 * On cpu: the real `cpu` plugin.  Comm: a recording fake of `size` ranks
 * whose peers hold the same data as this rank (so AVG/MAX/MIN return the
 * input), which shows WHEN and WHAT ddp reduces; and, for real multi-rank
 * numbers, the `shm` plugin in forked processes (skipped when
 * dtrain_shm.so is not built).
 *
 * On cuda (ctest's unit.test_ddp.cuda, label gpu; skipped without 3
 * GPUs): the same cases, the multi-rank ones over the nccl communicator
 * with one GPU per forked rank, and the fake-comm ones (3 instances at
 * most: GPUs 0-2) after them in this process.
 *
 * On both, the host reaches the buffers ddp hands out only through the
 * device's copies (dt_toy_read / dt_toy_write, on_host, f32_at), and the
 * fake comm moves bytes with the device's memcpy_async; on the cpu device
 * those are memmoves, the same bits as before.  The cuda variant has not
 * yet run on a GPU.
 *
 * The model: the toy model's three units (tests/support/toy_model.h: 50,
 * 79 and 10 parameters, GPT-2-like, the head tied to unit 0, biases and
 * norms NO_DECAY), with gradients written by hand.  The flat layout aligns
 * unit starts to 16 elements: unit offsets 0, 64, 144, total 160.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "dtrain/sdk_helpers.h"
#include "mp_check.h"
#include "mp_harness.h"
#include "test_host.h"
#include "test_plugin.h"
#include "toy_model.h"
#include "toy_train.h"
#include "util/error.h"

/* ---------------------------------------------------------------- plugins */

static const dt_strategy_ops_v1_t *S;   /* ddp */
static const dt_device_ops_v1_t *D;     /* the backend's device: cpu or cuda */
static const dt_comm_ops_v1_t *COMM;    /* its communicator: shm (or NULL) or nccl */
static void *h_ddp, *h_dev, *h_comm;

/* ------------------------------------------------------------ the model */

static const dt_unit_desc_v1_t *units; /* the toy model's (DT_TOY_NU) */
#define TOTAL 160 /* the flat layout's elements, with 16-element alignment */

/* The toy model as ddp sees it: arch "test", not a model the core knows. */
static dt_model_desc_v1_t make_model(int param_dtype)
{
    dt_model_desc_v1_t m = dt_toy_model(param_dtype);
    m.arch = "test";
    return m;
}

/* What forked ranks report (the multi-rank cases), in shared memory. */
#define MAXR 3
typedef struct {
    int rc[MAXR];
    char msg[MAXR][512];
    float params[MAXR][DT_TOY_NU][80];
    double norm[MAXR][2];
    double f64sum[MAXR];
} mp_out_t;
static mp_out_t *mp_out;

static int group_setup(void **state)
{
    if (mp_out) /* the second group of main: loaded already */
        return 0;
    S = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_ddp.so", DT_ENTRY_STRING(strategy, 1),
                             &h_ddp);
    char path[1024];
    snprintf(path, sizeof path, "%s/dtrain_%s.so", DT_TEST_PLUGIN_DIR, dt_toy_backend_device());
    D = dt_test_plugin_entry(path, DT_ENTRY_STRING(device, 1), &h_dev);
    snprintf(path, sizeof path, "%s/dtrain_%s.so", DT_TEST_PLUGIN_DIR, dt_toy_backend_comm());
    COMM = dt_test_plugin_entry(path, DT_ENTRY_STRING(comm, 1), &h_comm);
    units = dt_toy_model(DT_F32).units;
    if (!(mp_out = dt_mp_shared_alloc(sizeof *mp_out)))
        return -1;
    if (!S || !D || (!COMM && strcmp(dt_toy_backend_comm(), "shm") != 0)) {
        fprintf(stderr, "cannot load ddp/%s/%s plugins from %s\n", dt_toy_backend_device(),
                dt_toy_backend_comm(), DT_TEST_PLUGIN_DIR);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ fake comm */

typedef struct {
    uint64_t count;
    int dtype, op;
} ar_call_t;

struct dt_comm {
    const dt_comm_ops_v1_t *ops; /* first: &fake_comm (dtrain/comm.h) */
    int32_t rank, size;
    dt_toy_dev_t dd;     /* the instance's device: the fake moves bytes with it */
    ar_call_t calls[64];
    int n_calls;
    int n_bcast, n_started, n_waited;
};
static char fake_req_token;

static int fc_rank_size(dt_comm_t *c, int32_t *r, int32_t *s)
{
    *r = c->rank;
    *s = c->size;
    return DT_OK;
}

/* Every peer holds the same data: AVG/MAX/MIN give the input back. */
static int fc_all_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count, int dtype,
                         int op, dt_stream_t *st, dt_comm_req_t **req)
{
    if (c->n_calls < 64)
        c->calls[c->n_calls] = (ar_call_t){count, dtype, op};
    c->n_calls++;
    /* on the device, on the caller's stream, done before returning */
    dt_toy_dev_t dd = c->dd;
    dd.stream = st;
    uint64_t bytes = count * dt_dtype_size(dtype);
    int rc = DT_OK;
    if (recv != send && (rc = dd.ops->memcpy_async(dd.dev, recv, send, bytes, DT_COPY_D2D,
                                                   st)) == DT_OK)
        rc = dd.ops->stream_sync(dd.dev, st);
    if (rc == DT_OK && op == DT_OP_SUM && dtype == DT_F32) {
        float *h = malloc(bytes ? bytes : 1);
        if (!h)
            return DT_ERR_NOMEM;
        if ((rc = dt_toy_read(&dd, h, recv, bytes)) == DT_OK) {
            for (uint64_t i = 0; i < count; i++)
                h[i] *= (float)c->size;
            rc = dt_toy_write(&dd, recv, h, bytes);
        }
        free(h);
    }
    if (rc != DT_OK)
        return rc;
    if (req) {
        *req = (dt_comm_req_t *)&fake_req_token;
        c->n_started++;
    }
    return DT_OK;
}

static int fc_broadcast(dt_comm_t *c, void *buf, uint64_t count, int dtype, int32_t root,
                        dt_stream_t *st, dt_comm_req_t **req)
{
    c->n_bcast++;
    if (req) {
        *req = (dt_comm_req_t *)&fake_req_token;
        c->n_started++;
    }
    return DT_OK;
}

static int fc_wait(dt_comm_t *c, dt_comm_req_t *req, int64_t timeout_ms)
{
    assert_ptr_equal(req, &fake_req_token);
    c->n_waited++;
    return DT_OK;
}

static const dt_comm_ops_v1_t fake_comm = {
    .info = {.abi_major = DT_COMM_ABI_MAJOR, .struct_size = sizeof(dt_comm_ops_v1_t),
             .kind = DT_KIND_COMM, .name = "fake"},
    .rank_size = fc_rank_size,
    .all_reduce = fc_all_reduce,
    .broadcast = fc_broadcast,
    .wait = fc_wait,
};

/* ------------------------------------------------------- a test instance */

typedef struct {
    dt_test_host_t th_ddp, th_dev, th_comm;
    dt_device_t *dev;
    dt_stream_t *cs;
    dt_toy_dev_t dd;    /* {D, dev, cs}: host access to ddp's buffers */
    struct dt_comm fc;
    dt_comm_t *comm;
    dt_comm_t *real;    /* a real group (forked ranks), or NULL */
    dt_model_desc_v1_t model;
    dt_optim_desc_v1_t optim;
    dt_strategy_t *s;
} inst_t;

/* The backend's device (cpu: threads = 1) + ddp over the fake comm of
 * `size`/`rank`, or, with `job`, over a real group of the backend's
 * communicator (at its defaults) of that job.  Returns ddp init's status. */
static int inst_open(inst_t *in, const dt_test_kv_t *kv, int param_dtype, int optim_kind,
                     uint32_t n_micro, int32_t size, int32_t rank, const char *job)
{
    memset(in, 0, sizeof *in);
    dt_test_host_init(&in->th_dev, dt_toy_backend_device_prefix(), dt_toy_backend_device_kv());
    dt_test_host_init(&in->th_ddp, "strategy/ddp", kv);
    dt_device_init_v1_t di = {.struct_size = sizeof di, .rank = rank, .local_rank = rank,
                              .local_size = size, .device_index = -1};
    DT_MP_OK(D->init(&in->th_dev.host, &di, &in->dev));
    DT_MP_OK(D->stream_create(in->dev, &in->cs));
    in->dd = (dt_toy_dev_t){.ops = D, .dev = in->dev, .stream = in->cs};
    in->fc.ops = &fake_comm;
    in->fc.dd = in->dd;
    in->fc.size = size;
    in->fc.rank = rank;
    in->comm = &in->fc;
    if (job) {
        dt_test_host_init(&in->th_comm, dt_toy_backend_comm_prefix(), NULL);
        dt_comm_init_v1_t ci = {.struct_size = sizeof ci, .rank = rank, .size = size,
                                .local_rank = rank, .local_size = size, .job_id = job,
                                .timeout_ms = 20000, .dev = in->dev};
        DT_MP_OK(COMM->init(&in->th_comm.host, &ci, &in->real));
        in->comm = in->real;
    }
    in->model = make_model(param_dtype);
    in->optim = dt_toy_optim(optim_kind);
    dt_strategy_init_v1_t a = {
        .struct_size = sizeof a,
        .n_micro = n_micro,
        .dev = in->dev,
        .compute_stream = in->cs,
        .comm = in->comm,
        .model = &in->model,
        .optim = &in->optim,
    };
    return S->init(&in->th_ddp.host, &a, &in->s);
}

static void inst_close(inst_t *in)
{
    S->finalize(in->s);
    if (in->real)
        COMM->finalize(in->real);
    D->stream_destroy(in->dev, in->cs);
    D->finalize(in->dev);
}

/* Gradients: the toy model's coefficients, distinct per rank / micro-step
 * / unit / element, each keeping its sign and >= 0.02 in size, so sums and
 * averages never cancel towards 0 (AdamW turns a rounding residue around 0
 * into a full lr-sized step). */
static float gval(int rank, uint32_t micro, uint32_t u, uint64_t i)
{
    return (float)dt_toy_a(rank, micro, u, i);
}
/* the head's contribution to the tied wte (unit 0, elements [0, 35)) */
static float tval(int rank, uint32_t micro, uint64_t i)
{
    return (float)(dt_toy_sign(0, i) * 0.004 * (double)(1 + (i + micro + (uint64_t)rank) % 5));
}

static void set_params(inst_t *in)
{
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        float buf[80];
        for (uint64_t i = 0; i < units[u].numel; i++)
            buf[i] = dt_toy_pval(u, i);
        DT_MP_OK(S->set_state(in->s, u, DT_STATE_PARAMS, (dt_range_t){0, units[u].numel}, buf));
    }
}

/* Forward over all units, the head re-reading unit 0 (tied) nested. */
static void forward(inst_t *in, uint32_t micro, uint32_t n_micro, const void *want[DT_TOY_NU])
{
    dt_unit_buffers_v1_t b = {.struct_size = sizeof b}, b0 = {.struct_size = sizeof b0};
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        dt_hook_v1_t h = {
            .struct_size = sizeof(dt_hook_v1_t), .unit = u, .micro = micro, .n_micro = n_micro};
        DT_MP_OK(S->pre_forward(in->s, &h, &b));
        DT_MP_CHECK(b.grads == NULL);
        if (want)
            DT_MP_CHECK(b.params == want[u]);
        if (u == 2) {
            dt_hook_v1_t h0 = {
                .struct_size = sizeof(dt_hook_v1_t), .unit = 0, .micro = micro, .n_micro = n_micro};
            DT_MP_OK(S->pre_forward(in->s, &h0, &b0));
            if (want)
                DT_MP_CHECK(b0.params == want[0]);
            DT_MP_OK(S->post_forward(in->s, &h0));
        }
        DT_MP_OK(S->post_forward(in->s, &h));
    }
}

/* What one rank's backward of one micro-step adds to its gradient (in
 * double): the head's own and its tied part of wte, then every unit's own. */
static void ref_micro(int rank, uint32_t micro, double ref[DT_TOY_NU][80])
{
    for (uint64_t i = 0; i < 35; i++)
        ref[0][i] += tval(rank, micro, i);
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        for (uint64_t i = 0; i < units[u].numel; i++)
            ref[u][i] += gval(rank, micro, u, i);
}

/* grads[i] += gval (or, for the head's tied part of wte, tval) for i < n,
 * through the device's copies: read, add in f32, write back. */
static void add_grads(inst_t *in, float *grads, uint64_t n, int rank, uint32_t micro,
                      uint32_t u, int tie)
{
    float g[80];
    DT_MP_OK(dt_toy_read(&in->dd, g, grads, n * sizeof(float)));
    for (uint64_t i = 0; i < n; i++)
        g[i] += tie ? tval(rank, micro, i) : gval(rank, micro, u, i);
    DT_MP_OK(dt_toy_write(&in->dd, grads, g, n * sizeof(float)));
}

/* `bytes` (<= 320) of device memory at `src`, copied to the host through
 * in's device: in host buffer `slot` (0 or 1), valid until the next call
 * with that slot. */
static const void *on_host(inst_t *in, const void *src, size_t bytes, int slot)
{
    static float buf[2][80];
    assert_true(bytes <= sizeof buf[0] && (slot == 0 || slot == 1));
    assert_int_equal(dt_toy_read(&in->dd, buf[slot], src, bytes), DT_OK);
    return buf[slot];
}

/* Element i of device f32 buffer `p`, read through in's device. */
static float f32_at(inst_t *in, const void *p, uint64_t i)
{
    float x;
    assert_int_equal(dt_toy_read(&in->dd, &x, (const float *)p + i, sizeof x), DT_OK);
    return x;
}

/* Set element i of device f32 buffer `p` to x through in's device. */
static void f32_set(inst_t *in, float *p, uint64_t i, float x)
{
    assert_int_equal(dt_toy_write(&in->dd, p + i, &x, sizeof x), DT_OK);
}

/* Backward of one micro-step: head (adds to its own grads and, nested, to
 * unit 0's wte), block, embedding.  `ref` (DT_TOY_NU x 80 doubles)
 * accumulates the expected local gradient.  `after[k]` (may be NULL)
 * receives the fake comm's all_reduce count after the k-th post_backward
 * (4 per micro). */
static void backward(inst_t *in, int rank, uint32_t micro, uint32_t n_micro,
                     double ref[DT_TOY_NU][80], int after[4])
{
    dt_unit_buffers_v1_t b = {.struct_size = sizeof b}, b0 = {.struct_size = sizeof b0};
    dt_hook_v1_t h = {
        .struct_size = sizeof(dt_hook_v1_t), .unit = 2, .micro = micro, .n_micro = n_micro};
    dt_hook_v1_t h0 = {
        .struct_size = sizeof(dt_hook_v1_t), .unit = 0, .micro = micro, .n_micro = n_micro};
    int k = 0;

    if (ref)
        ref_micro(rank, micro, ref);
    DT_MP_OK(S->pre_backward(in->s, &h, &b));
    DT_MP_OK(S->pre_backward(in->s, &h0, &b0));
    add_grads(in, b.grads, 10, rank, micro, 2, 0);
    add_grads(in, b0.grads, 35, rank, micro, 0, 1);
    h0.last_use = 0;
    DT_MP_OK(S->post_backward(in->s, &h0));
    if (after) after[k++] = in->fc.n_calls;
    h.last_use = 1;
    DT_MP_OK(S->post_backward(in->s, &h));
    if (after) after[k++] = in->fc.n_calls;

    for (uint32_t u = 2; u-- > 0;) {
        dt_hook_v1_t hu = {
            .struct_size = sizeof(dt_hook_v1_t), .unit = u, .micro = micro, .n_micro = n_micro};
        dt_unit_buffers_v1_t bu = {.struct_size = sizeof(dt_unit_buffers_v1_t)};
        DT_MP_OK(S->pre_backward(in->s, &hu, &bu));
        if (u == 0)
            DT_MP_CHECK(bu.grads == b0.grads); /* the same buffer as nested */
        add_grads(in, bu.grads, units[u].numel, rank, micro, u, 0);
        hu.last_use = 1;
        DT_MP_OK(S->post_backward(in->s, &hu));
        if (after) after[k++] = in->fc.n_calls;
    }
}

static void get_unit(inst_t *in, uint32_t u, int kind, float *buf)
{
    DT_MP_OK(S->get_state(in->s, u, kind, (dt_range_t){0, units[u].numel}, buf));
}

/* ----------------------------------------------------------- hook tests */

static void test_hook_protocol(void **state)
{
    inst_t in;
    assert_int_equal(inst_open(&in, NULL, DT_F32, DT_OPTIM_ADAMW, 1, 1, 0, NULL), DT_OK);
    set_params(&in);
    assert_int_equal(S->state_loaded(in.s), DT_OK);
    assert_int_equal(S->begin_step(in.s, 1), DT_OK);

    /* params of each unit: distinct, 64-byte aligned, stable across calls */
    const void *pp[DT_TOY_NU];
    dt_unit_buffers_v1_t b = {.struct_size = sizeof(dt_unit_buffers_v1_t)};
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        dt_hook_v1_t h = {.struct_size = sizeof(dt_hook_v1_t), .unit = u, .n_micro = 1};
        assert_int_equal(S->pre_forward(in.s, &h, &b), DT_OK);
        pp[u] = b.params;
        assert_int_equal((uintptr_t)pp[u] % 64, 0);
        assert_true(f32_at(&in, pp[u], 3) == dt_toy_pval(u, 3)); /* f32: the master itself */
        assert_int_equal(S->post_forward(in.s, &h), DT_OK);
    }
    assert_ptr_equal((const float *)pp[1] - (const float *)pp[0], 64);
    assert_ptr_equal((const float *)pp[2] - (const float *)pp[0], 144);
    forward(&in, 0, 1, pp);
    forward(&in, 0, 1, pp);
    /* an evaluation pass may leave micro-steps at 0 */
    dt_hook_v1_t ev = {.struct_size = sizeof(dt_hook_v1_t), .unit = 2, .flags = DT_HOOK_NO_GRAD};
    assert_int_equal(S->pre_forward(in.s, &ev, &b), DT_OK);
    assert_ptr_equal(b.params, pp[2]);
    assert_int_equal(S->post_forward(in.s, &ev), DT_OK);

    /* misuse, each named */
    dt_hook_v1_t h = {.struct_size = sizeof(dt_hook_v1_t), .unit = 1, .n_micro = 1};
    assert_int_equal(S->post_forward(in.s, &h), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "strategy/ddp: post_forward: unit 'block.0' (1) "
                                            "without a pre_forward"));
    assert_int_equal(S->post_backward(in.s, &h), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "post_backward: unit 'block.0' (1) without a "
                                            "pre_backward"));
    h.unit = 3;
    assert_int_equal(S->pre_forward(in.s, &h, &b), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "pre_forward: unit 3 out of range (model has 3 "
                                            "units)"));
    h = (dt_hook_v1_t){.struct_size = sizeof(dt_hook_v1_t), .unit = 0, .micro = 2, .n_micro = 2};
    assert_int_equal(S->pre_backward(in.s, &h, &b), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "pre_backward: unit 'embedding': micro-step 2 of 2"));
    h = (dt_hook_v1_t){
        .struct_size = sizeof(dt_hook_v1_t), .unit = 0, .n_micro = 1, .flags = DT_HOOK_NO_GRAD};
    assert_int_equal(S->pre_backward(in.s, &h, &b), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "unit 'embedding' in a no-grad (evaluation) pass"));
    /* the growth rule (abi.h): a hook or buffers below minor 0, a newer
     * core's field this plugin does not know */
    h = (dt_hook_v1_t){.struct_size = 4, .unit = 0, .n_micro = 1};
    assert_int_equal(S->pre_forward(in.s, &h, &b), DT_ERR_ABI);
    assert_non_null(strstr(dt_last_error(), "strategy/ddp: pre_forward: hook: struct_size 4 is "
                                            "below the 24 bytes of its minor 0"));
    struct {
        dt_hook_v1_t h;
        uint32_t later;
    } nh = {.h = {.struct_size = sizeof nh, .unit = 0, .n_micro = 1}, .later = 1};
    assert_int_equal(S->pre_forward(in.s, &nh.h, &b), DT_ERR_UNSUPPORTED);
    assert_non_null(strstr(dt_last_error(), "pre_forward: hook: the caller (struct_size 28) set "
                                            "fields past the 24 bytes this plugin knows"));
    dt_unit_buffers_v1_t small = {.struct_size = 8};
    h = (dt_hook_v1_t){.struct_size = sizeof h, .unit = 0, .n_micro = 1};
    assert_int_equal(S->pre_forward(in.s, &h, &small), DT_ERR_ABI);
    assert_non_null(strstr(dt_last_error(), "pre_forward: buffers: struct_size 8 is below"));

    /* a step inside an open hook is refused */
    h = (dt_hook_v1_t){.struct_size = sizeof(dt_hook_v1_t), .unit = 1, .n_micro = 1};
    assert_int_equal(S->pre_backward(in.s, &h, &b), DT_OK);
    dt_step_args_v1_t sa = {.struct_size = sizeof(dt_step_args_v1_t), .step = 1, .lr = 0.1f};
    dt_step_result_v1_t r = {.struct_size = sizeof(dt_step_result_v1_t)};
    assert_int_equal(S->step(in.s, &sa, &r), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "step: unit 'block.0' (1) is still inside a "
                                            "pre_backward hook"));
    /* twice-final is a protocol error */
    h.last_use = 1;
    assert_int_equal(S->post_backward(in.s, &h), DT_OK);
    assert_int_equal(S->pre_backward(in.s, &h, &b), DT_OK);
    assert_int_equal(S->post_backward(in.s, &h), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "unit 'block.0' (1) reported last_use twice"));
    inst_close(&in);
}

/* Gradients accumulate over micro-steps; nothing is reduced before the last
 * one; then each bucket starts at its last unit's final post_backward. */
static void test_accumulate_then_bucketed_reduce(void **state)
{
    /* 0.0003 MiB = 314 bytes: head (40 B), block (316 B), embedding (200 B)
     * each alone.  Bucket spans: 16, 80, 64 elements (padded). */
    const dt_test_kv_t kv[] = {{"bucket_cap_mb", "0.0003"}, {NULL, NULL}};
    inst_t in;
    assert_int_equal(inst_open(&in, kv, DT_F32, DT_OPTIM_ADAMW, 3, 2, 0, NULL), DT_OK);
    set_params(&in);
    assert_int_equal(S->state_loaded(in.s), DT_OK);
    assert_int_equal(in.fc.n_calls, 2); /* init_check: MAX + MIN of the hash fields */
    assert_int_equal(in.fc.calls[0].op, DT_OP_MAX);
    assert_int_equal(in.fc.calls[1].op, DT_OP_MIN);
    assert_int_equal(in.fc.calls[0].count, 4 * DT_TOY_NU);
    in.fc.n_calls = 0;

    static double ref[DT_TOY_NU][80];
    memset(ref, 0, sizeof ref);
    int after[4];
    assert_int_equal(S->begin_step(in.s, 1), DT_OK);
    for (uint32_t m = 0; m < 2; m++) {
        forward(&in, m, 3, NULL);
        backward(&in, 0, m, 3, ref, after);
        for (int k = 0; k < 4; k++)
            assert_int_equal(after[k], 0); /* accumulation micro-steps */
    }
    forward(&in, 2, 3, NULL);
    backward(&in, 0, 2, 3, ref, after);
    assert_int_equal(after[0], 0); /* nested unit-0 post (last_use 0) */
    assert_int_equal(after[1], 1); /* head final -> bucket 0 */
    assert_int_equal(after[2], 2); /* block final -> bucket 1 */
    assert_int_equal(after[3], 3); /* embedding final -> bucket 2 */
    const uint64_t want_count[3] = {16, 80, 64};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(in.fc.calls[k].count, want_count[k]);
        assert_int_equal(in.fc.calls[k].dtype, DT_F32);
        assert_int_equal(in.fc.calls[k].op, DT_OP_AVG);
    }
    assert_int_equal(in.fc.n_started, 3);
    assert_int_equal(in.fc.n_waited, 0); /* started during backward, waited in step */

    /* the accumulated gradient, exactly (identical peers: AVG = identity) */
    dt_unit_buffers_v1_t b = {.struct_size = sizeof(dt_unit_buffers_v1_t)};
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        dt_hook_v1_t h = {.struct_size = sizeof(dt_hook_v1_t), .unit = u, .micro = 0, .n_micro = 1};
        assert_int_equal(S->pre_backward(in.s, &h, &b), DT_OK);
        const float *g = on_host(&in, b.grads, units[u].numel * sizeof(float), 0);
        for (uint64_t i = 0; i < units[u].numel; i++)
            assert_true(fabs(g[i] - ref[u][i]) <= 1e-6);
        assert_int_equal(S->post_backward(in.s, &h), DT_OK);
    }
    dt_step_args_v1_t sa = {
        .struct_size = sizeof(dt_step_args_v1_t), .step = 1, .lr = 1e-3f, .clip = 1.0f};
    dt_step_result_v1_t r = {.struct_size = sizeof(dt_step_result_v1_t)};
    assert_int_equal(S->step(in.s, &sa, &r), DT_OK);
    assert_int_equal(in.fc.n_calls, 4);   /* step adds the norm's parts only */
    assert_int_equal(in.fc.calls[3].count, 1);
    assert_int_equal(in.fc.calls[3].dtype, DT_F64);
    assert_int_equal(in.fc.calls[3].op, DT_OP_SUM);
    assert_int_equal(in.fc.n_waited, 3);
    inst_close(&in);
}

/* Bucket assignment by bucket_cap_mb, in backward order, and buckets start
 * strictly in index order even when a later one completes first. */
static void test_bucket_assignment_and_order(void **state)
{
    static double ref[DT_TOY_NU][80];
    struct { const char *cap; int n; uint64_t counts[3]; int after[4]; } cases[] = {
        {"0.0003", 3, {16, 80, 64}, {0, 1, 2, 3}},
        {"0.0004", 2, {96, 64}, {0, 0, 1, 2}},  /* 40 + 316 <= 419 < 556 */
        {"25", 1, {160}, {0, 0, 0, 1}},
    };
    for (size_t c = 0; c < 3; c++) {
        const dt_test_kv_t kv[] = {{"bucket_cap_mb", cases[c].cap}, {"init_check", "broadcast"},
                                   {NULL, NULL}};
        inst_t in;
        assert_int_equal(inst_open(&in, kv, DT_F32, DT_OPTIM_ADAMW, 1, 2, 1, NULL), DT_OK);
        set_params(&in);
        assert_int_equal(S->state_loaded(in.s), DT_OK);
        assert_int_equal(in.fc.n_bcast, 1);
        assert_int_equal(in.fc.n_calls, 0);
        assert_int_equal(S->begin_step(in.s, 1), DT_OK);
        int after[4];
        backward(&in, 1, 0, 1, ref, after);
        for (int k = 0; k < 4; k++)
            assert_int_equal(after[k], cases[c].after[k]);
        assert_int_equal(in.fc.n_calls, cases[c].n);
        for (int k = 0; k < cases[c].n; k++)
            assert_int_equal(in.fc.calls[k].count, cases[c].counts[k]);
        inst_close(&in);
    }

    /* embedding reports final first: its bucket (2) waits for 0 and 1 */
    const dt_test_kv_t kv[] = {{"bucket_cap_mb", "0.0003"}, {NULL, NULL}};
    inst_t in;
    assert_int_equal(inst_open(&in, kv, DT_F32, DT_OPTIM_ADAMW, 1, 2, 0, NULL), DT_OK);
    assert_int_equal(S->begin_step(in.s, 1), DT_OK);
    dt_unit_buffers_v1_t b = {.struct_size = sizeof(dt_unit_buffers_v1_t)};
    const uint32_t order[3] = {0, 2, 1};
    const int want_after[3] = {0, 1, 3};
    for (int k = 0; k < 3; k++) {
        dt_hook_v1_t h = {
            .struct_size = sizeof(dt_hook_v1_t), .unit = order[k], .n_micro = 1, .last_use = 1};
        assert_int_equal(S->pre_backward(in.s, &h, &b), DT_OK);
        assert_int_equal(S->post_backward(in.s, &h), DT_OK);
        assert_int_equal(in.fc.n_calls, want_after[k]);
    }
    assert_int_equal(in.fc.calls[0].count, 16);
    assert_int_equal(in.fc.calls[1].count, 80);
    assert_int_equal(in.fc.calls[2].count, 64);
    inst_close(&in);
}

/* overlap = false reduces everything in step(); bf16 travels as bf16. */
static uint16_t bf16_rne(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_no_overlap_and_bf16_reduce(void **state)
{
    static double ref[DT_TOY_NU][80];
    const dt_test_kv_t kv[] = {{"bucket_cap_mb", "0.0003"}, {"overlap", "false"},
                               {"reduce_dtype", "bf16"}, {NULL, NULL}};
    inst_t in;
    assert_int_equal(inst_open(&in, kv, DT_F32, DT_OPTIM_SGD, 1, 2, 0, NULL), DT_OK);
    set_params(&in);
    assert_int_equal(S->state_loaded(in.s), DT_OK);
    in.fc.n_calls = 0;
    memset(ref, 0, sizeof ref);
    assert_int_equal(S->begin_step(in.s, 1), DT_OK);
    int after[4];
    backward(&in, 0, 0, 1, ref, after);
    assert_int_equal(after[3], 0);
    dt_step_args_v1_t sa = {
        .struct_size = sizeof(dt_step_args_v1_t), .step = 1, .lr = 0.0f}; /* lr 0: params stay */
    dt_step_result_v1_t r = {.struct_size = sizeof(dt_step_result_v1_t)};
    assert_int_equal(S->step(in.s, &sa, &r), DT_OK);
    assert_int_equal(in.fc.n_calls, 4); /* 3 buckets, then the norm's parts */
    const uint64_t want_count[3] = {16, 80, 64};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(in.fc.calls[k].count, want_count[k]);
        assert_int_equal(in.fc.calls[k].dtype, DT_BF16);
        assert_int_equal(in.fc.calls[k].op, DT_OP_AVG);
    }
    assert_int_equal(in.fc.n_waited, in.fc.n_started);
    /* the gradients went through bf16 and back: exactly bf16(g) */
    /* (the norm: each rank sums its half and the fake comm cannot add the
     * other's; test_mp_bf16_reduce checks it over real ranks) */
    dt_unit_buffers_v1_t b = {.struct_size = sizeof(dt_unit_buffers_v1_t)};
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        dt_hook_v1_t h = {.struct_size = sizeof(dt_hook_v1_t), .unit = u, .n_micro = 1};
        assert_int_equal(S->pre_backward(in.s, &h, &b), DT_OK);
        const float *g = on_host(&in, b.grads, units[u].numel * sizeof(float), 0);
        for (uint64_t i = 0; i < units[u].numel; i++) {
            float want = bf16_to_f32(bf16_rne((float)ref[u][i]));
            assert_true(g[i] == want);
        }
        assert_int_equal(S->post_backward(in.s, &h), DT_OK);
    }
    inst_close(&in);
}

/* -------------------------------------------------------- the optimizer */

/* AdamW over two steps of two micro-steps, the first clipped, against a
 * double-precision reference with the NO_DECAY mask.  Tolerance: f32
 * kernel vs double, rel 2e-5 + abs 1e-6 on params after 2 steps. */
static void test_step_adamw_reference(void **state)
{
    inst_t in;
    assert_int_equal(inst_open(&in, NULL, DT_F32, DT_OPTIM_ADAMW, 2, 1, 0, NULL), DT_OK);
    set_params(&in);
    assert_int_equal(S->state_loaded(in.s), DT_OK);
    static dt_toy_ref_t ref;
    static double g[DT_TOY_NU][80];
    dt_toy_ref_init(&ref);
    const float clips[2] = {0.05f, 100.0f}; /* clipped, then not */
    const double lr = 1e-2;
    for (int t = 1; t <= 2; t++) {
        memset(g, 0, sizeof g);
        assert_int_equal(S->begin_step(in.s, t), DT_OK);
        for (uint32_t mi = 0; mi < 2; mi++) {
            forward(&in, mi, 2, NULL);
            backward(&in, t, mi, 2, g, NULL);
        }
        dt_step_args_v1_t sa = {.struct_size = sizeof(dt_step_args_v1_t),
                                .step = t,
                                .lr = (float)lr,
                                .clip = clips[t - 1]};
        dt_step_result_v1_t r = {.struct_size = sizeof(dt_step_result_v1_t)};
        assert_int_equal(S->step(in.s, &sa, &r), DT_OK);
        assert_int_equal(r.nonfinite, 0);
        double norm = dt_toy_ref_update(&ref, DT_OPTIM_ADAMW, g, t, lr, clips[t - 1]);
        assert_true(fabs(r.grad_norm - norm) <= 1e-6 * norm);
        if (t == 1)
            assert_true(clips[0] / norm < 0.5); /* the clip really acts */
    }
    float got[80];
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        get_unit(&in, u, DT_STATE_PARAMS, got);
        for (uint64_t i = 0; i < units[u].numel; i++)
            assert_true(fabs(got[i] - ref.p[u][i]) <= 1e-6 + 2e-5 * fabs(ref.p[u][i]));
        get_unit(&in, u, DT_STATE_EXP_AVG, got);
        for (uint64_t i = 0; i < units[u].numel; i++)
            assert_true(fabs(got[i] - ref.m[u][i]) <= 1e-8 + 1e-5 * fabs(ref.m[u][i]));
        get_unit(&in, u, DT_STATE_EXP_AVG_SQ, got);
        for (uint64_t i = 0; i < units[u].numel; i++)
            assert_true(fabs(got[i] - ref.v[u][i]) <= 1e-12 + 1e-5 * fabs(ref.v[u][i]));
    }
    inst_close(&in);
}

/* A NaN gradient: nonfinite = 1, nothing changes; the next step works. */
static void test_nonfinite_skips_update(void **state)
{
    inst_t in;
    assert_int_equal(inst_open(&in, NULL, DT_F32, DT_OPTIM_ADAMW, 1, 1, 0, NULL), DT_OK);
    set_params(&in);
    assert_int_equal(S->state_loaded(in.s), DT_OK);
    static double g[DT_TOY_NU][80];
    assert_int_equal(S->begin_step(in.s, 1), DT_OK);
    backward(&in, 0, 0, 1, g, NULL);
    dt_unit_buffers_v1_t b = {.struct_size = sizeof(dt_unit_buffers_v1_t)};
    dt_hook_v1_t h = {.struct_size = sizeof(dt_hook_v1_t), .unit = 1, .n_micro = 1};
    assert_int_equal(S->pre_backward(in.s, &h, &b), DT_OK);
    f32_set(&in, b.grads, 70, INFINITY);
    assert_int_equal(S->post_backward(in.s, &h), DT_OK);
    float before[DT_TOY_NU][80], after[80];
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        get_unit(&in, u, DT_STATE_PARAMS, before[u]);
    dt_step_args_v1_t sa = {
        .struct_size = sizeof(dt_step_args_v1_t), .step = 1, .lr = 0.1f, .clip = 1.0f};
    dt_step_result_v1_t r = {.struct_size = sizeof(dt_step_result_v1_t)};
    assert_int_equal(S->step(in.s, &sa, &r), DT_OK);
    assert_int_equal(r.nonfinite, 1);
    assert_true(isinf(r.grad_norm));
    for (uint32_t u = 0; u < DT_TOY_NU; u++) {
        get_unit(&in, u, DT_STATE_PARAMS, after);
        assert_memory_equal(after, before[u], units[u].numel * sizeof(float));
        get_unit(&in, u, DT_STATE_EXP_AVG, after);
        for (uint64_t i = 0; i < units[u].numel; i++)
            assert_true(after[i] == 0.0f);
    }
    /* NaN too */
    assert_int_equal(S->begin_step(in.s, 1), DT_OK);
    assert_int_equal(S->pre_backward(in.s, &h, &b), DT_OK);
    f32_set(&in, b.grads, 0, NAN);
    assert_int_equal(S->post_backward(in.s, &h), DT_OK);
    assert_int_equal(S->step(in.s, &sa, &r), DT_OK);
    assert_int_equal(r.nonfinite, 1);
    assert_true(isnan(r.grad_norm));
    /* begin_step zeroed the bad gradient: a clean step updates */
    assert_int_equal(S->begin_step(in.s, 1), DT_OK);
    backward(&in, 0, 0, 1, g, NULL);
    assert_int_equal(S->step(in.s, &sa, &r), DT_OK);
    assert_int_equal(r.nonfinite, 0);
    get_unit(&in, 1, DT_STATE_PARAMS, after);
    assert_true(after[70] != before[1][70]);
    inst_close(&in);
}

/* stagger_update (default on): with 2 ranks, rank 1 keeps step()'s update
 * pending and applies each unit's part at its next pre_forward (zeroing
 * that unit's gradient), rank 0 updates in step(); with stagger off, or
 * alone, every rank updates in step().  Three instances (identical fake
 * peers, so all see the same averaged gradient), AdamW, 2 micro-steps, 5
 * steps, bf16 compute copy: parameters, compute copies and moments stay
 * bitwise equal across the three.  No clipping: under the fake comm each
 * rank's norm is only its own part of the split sum. */
static void test_staggered_update(void **state)
{
    const dt_test_kv_t off[] = {{"stagger_update", "false"}, {NULL, NULL}};
    inst_t in[3];
    assert_int_equal(inst_open(&in[0], NULL, DT_BF16, DT_OPTIM_ADAMW, 2, 2, 0, NULL), DT_OK);
    assert_int_equal(inst_open(&in[1], NULL, DT_BF16, DT_OPTIM_ADAMW, 2, 2, 1, NULL), DT_OK);
    assert_int_equal(inst_open(&in[2], off, DT_BF16, DT_OPTIM_ADAMW, 2, 2, 1, NULL), DT_OK);
    static double g[DT_TOY_NU][80];
    for (int k = 0; k < 3; k++) {
        set_params(&in[k]);
        assert_int_equal(S->state_loaded(in[k].s), DT_OK);
    }
    for (int t = 1; t <= 4; t++) {
        const uint16_t *cp[3][DT_TOY_NU];
        uint16_t before[3][DT_TOY_NU][80];
        for (int k = 0; k < 3; k++) {
            assert_int_equal(S->begin_step(in[k].s, t), DT_OK);
            for (uint32_t mi = 0; mi < 2; mi++) {
                forward(&in[k], mi, 2, NULL);
                backward(&in[k], t, mi, 2, g, NULL);
            }
            for (uint32_t u = 0; u < DT_TOY_NU; u++) {
                dt_unit_buffers_v1_t b = {.struct_size = sizeof(dt_unit_buffers_v1_t)};
                dt_hook_v1_t h = {.struct_size = sizeof(dt_hook_v1_t), .unit = u, .n_micro = 1};
                assert_int_equal(S->pre_forward(in[k].s, &h, &b), DT_OK);
                assert_int_equal(S->post_forward(in[k].s, &h), DT_OK);
                cp[k][u] = b.params;
                memcpy(before[k][u], on_host(&in[k], b.params, units[u].numel * 2, 0),
                       units[u].numel * 2);
            }
            dt_step_args_v1_t sa = {
                .struct_size = sizeof(dt_step_args_v1_t), .step = t, .lr = 1e-2f};
            dt_step_result_v1_t r = {.struct_size = sizeof(dt_step_result_v1_t)};
            assert_int_equal(S->step(in[k].s, &sa, &r), DT_OK);
            assert_int_equal(r.nonfinite, 0);
        }
        /* after step(): ranks updating in step() changed every unit, the
         * staggered rank 1 none yet */
        for (uint32_t u = 0; u < DT_TOY_NU; u++) {
            size_t n = units[u].numel * 2;
            assert_memory_not_equal(on_host(&in[0], cp[0][u], n, 0), before[0][u], n);
            assert_memory_equal(on_host(&in[1], cp[1][u], n, 0), before[1][u], n);
            assert_memory_not_equal(on_host(&in[2], cp[2][u], n, 0), before[2][u], n);
        }
        if (t % 2 == 0)
            continue; /* step t + 1's forward applies it, after begin_step */
        /* rank 1's first use of unit 0 updates unit 0 only */
        dt_unit_buffers_v1_t b = {.struct_size = sizeof(dt_unit_buffers_v1_t)};
        dt_hook_v1_t h0 = {.struct_size = sizeof(dt_hook_v1_t), .unit = 0, .n_micro = 1};
        assert_int_equal(S->pre_forward(in[1].s, &h0, &b), DT_OK);
        assert_int_equal(S->post_forward(in[1].s, &h0), DT_OK);
        assert_memory_equal(on_host(&in[1], cp[1][0], units[0].numel * 2, 0),
                            on_host(&in[0], cp[0][0], units[0].numel * 2, 1),
                            units[0].numel * 2);
        assert_memory_equal(on_host(&in[1], cp[1][1], units[1].numel * 2, 0), before[1][1],
                            units[1].numel * 2);
        /* a forward applies the rest */
        forward(&in[1], 0, 1, NULL);
        for (uint32_t u = 0; u < DT_TOY_NU; u++) {
            size_t n = units[u].numel * 2;
            const void *p0 = on_host(&in[0], cp[0][u], n, 1);
            assert_memory_equal(on_host(&in[1], cp[1][u], n, 0), p0, n);
            assert_memory_equal(on_host(&in[2], cp[2][u], n, 0), p0, n);
        }
    }
    /* masters and moments: bit for bit (get_state applies step 4's update) */
    for (int kind = 0; kind < DT_STATE_COUNT; kind++)
        for (uint32_t u = 0; u < DT_TOY_NU; u++) {
            float a[80], b1[80], b2[80];
            get_unit(&in[0], u, kind, a);
            get_unit(&in[1], u, kind, b1);
            get_unit(&in[2], u, kind, b2);
            assert_memory_equal(a, b1, units[u].numel * sizeof(float));
            assert_memory_equal(a, b2, units[u].numel * sizeof(float));
        }
    /* get_state applies a pending update first: step once more and read
     * rank 1's state without a forward */
    for (int k = 0; k < 2; k++) {
        assert_int_equal(S->begin_step(in[k].s, 5), DT_OK);
        backward(&in[k], 5, 0, 2, g, NULL);
        backward(&in[k], 5, 1, 2, g, NULL);
        dt_step_args_v1_t sa = {.struct_size = sizeof(dt_step_args_v1_t), .step = 5, .lr = 1e-2f};
        dt_step_result_v1_t r = {.struct_size = sizeof(dt_step_result_v1_t)};
        assert_int_equal(S->step(in[k].s, &sa, &r), DT_OK);
    }
    for (uint32_t u = DT_TOY_NU; u-- > 0;) {
        float a[80], b1[80];
        get_unit(&in[1], u, DT_STATE_EXP_AVG_SQ, b1);
        get_unit(&in[0], u, DT_STATE_EXP_AVG_SQ, a);
        assert_memory_equal(a, b1, units[u].numel * sizeof(float));
        get_unit(&in[1], u, DT_STATE_PARAMS, b1);
        get_unit(&in[0], u, DT_STATE_PARAMS, a);
        assert_memory_equal(a, b1, units[u].numel * sizeof(float));
    }
    for (int k = 0; k < 3; k++)
        inst_close(&in[k]);
}

/* bf16 compute parameters: pre_* hand out bf16(master), refreshed by
 * state_loaded and by every step. */
static void test_bf16_compute_copy(void **state)
{
    inst_t in;
    assert_int_equal(inst_open(&in, NULL, DT_BF16, DT_OPTIM_SGD, 1, 1, 0, NULL), DT_OK);
    set_params(&in);
    assert_int_equal(S->state_loaded(in.s), DT_OK);
    dt_unit_buffers_v1_t b = {.struct_size = sizeof(dt_unit_buffers_v1_t)};
    float master[80];
    static double g[DT_TOY_NU][80];
    for (int round = 0; round < 2; round++) {
        for (uint32_t u = 0; u < DT_TOY_NU; u++) {
            dt_hook_v1_t h = {.struct_size = sizeof(dt_hook_v1_t), .unit = u, .n_micro = 1};
            assert_int_equal(S->pre_forward(in.s, &h, &b), DT_OK);
            get_unit(&in, u, DT_STATE_PARAMS, master);
            const uint16_t *c = on_host(&in, b.params, units[u].numel * 2, 0);
            for (uint64_t i = 0; i < units[u].numel; i++)
                assert_int_equal(c[i], bf16_rne(master[i]));
            assert_int_equal(S->post_forward(in.s, &h), DT_OK);
        }
        assert_int_equal(S->begin_step(in.s, 1), DT_OK);
        backward(&in, 0, 0, 1, g, NULL);
        dt_step_args_v1_t sa = {.struct_size = sizeof(dt_step_args_v1_t), .step = 1, .lr = 0.5f};
        dt_step_result_v1_t r = {.struct_size = sizeof(dt_step_result_v1_t)};
        assert_int_equal(S->step(in.s, &sa, &r), DT_OK);
    }
    inst_close(&in);
}

/* ------------------------------------------------------------- state */

static void test_state_roundtrip_and_errors(void **state)
{
    inst_t in;
    assert_int_equal(inst_open(&in, NULL, DT_F32, DT_OPTIM_ADAMW, 1, 1, 0, NULL), DT_OK);
    float in_buf[80], out_buf[80];
    for (int kind = 0; kind < DT_STATE_COUNT; kind++)
        for (uint32_t u = 0; u < DT_TOY_NU; u++) {
            for (int i = 0; i < 80; i++)
                in_buf[i] = (float)(kind * 1000 + u * 100 + i) * 0.5f;
            assert_int_equal(S->set_state(in.s, u, kind, (dt_range_t){0, units[u].numel},
                                          in_buf), DT_OK);
        }
    for (int kind = 0; kind < DT_STATE_COUNT; kind++)
        for (uint32_t u = 0; u < DT_TOY_NU; u++) {
            get_unit(&in, u, kind, out_buf);
            for (uint64_t i = 0; i < units[u].numel; i++)
                assert_true(out_buf[i] == (float)(kind * 1000 + u * 100 + i) * 0.5f);
        }
    /* a sub-range lands at its offset */
    const float part[3] = {-1, -2, -3};
    assert_int_equal(S->set_state(in.s, 1, DT_STATE_EXP_AVG, (dt_range_t){76, 3}, part), DT_OK);
    get_unit(&in, 1, DT_STATE_EXP_AVG, out_buf);
    assert_true(out_buf[75] == (1000 + 100 + 75) * 0.5f);
    assert_true(out_buf[76] == -1 && out_buf[78] == -3);
    assert_int_equal(S->get_state(in.s, 1, DT_STATE_EXP_AVG, (dt_range_t){77, 2}, out_buf),
                     DT_OK);
    assert_true(out_buf[0] == -2 && out_buf[1] == -3);

    /* HELD: the whole unit, for every kind */
    dt_range_t rr[2];
    uint32_t n = 9;
    for (int kind = 0; kind < DT_STATE_COUNT; kind++) {
        assert_int_equal(S->state_ranges(in.s, 2, kind, DT_RANGES_HELD, rr, 2, &n), DT_OK);
        assert_int_equal(n, 1);
        assert_int_equal(rr[0].offset, 0);
        assert_int_equal(rr[0].count, 10);
    }
    assert_int_equal(S->state_ranges(in.s, 2, 0, DT_RANGES_HELD, NULL, 0, &n), DT_OK);
    assert_int_equal(n, 1); /* count only */

    /* errors name unit, kind and range */
    assert_int_equal(S->get_state(in.s, 1, DT_STATE_PARAMS, (dt_range_t){70, 10}, out_buf),
                     DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "strategy/ddp: get_state: unit 'block.0' state "
                                            "params: range [70, +10) outside the unit's 79 "
                                            "elements"));
    assert_int_equal(S->set_state(in.s, 3, DT_STATE_PARAMS, (dt_range_t){0, 1}, part),
                     DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "set_state: unit 3 out of range"));
    assert_int_equal(S->get_state(in.s, 0, 7, (dt_range_t){0, 1}, out_buf), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "unit 'embedding': unknown state kind 7"));
    assert_int_equal(S->state_ranges(in.s, 0, 0, 5, rr, 2, &n), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "unknown purpose 5"));
    inst_close(&in);

    /* SGD: momentum is exp_avg; there is no exp_avg_sq */
    assert_int_equal(inst_open(&in, NULL, DT_F32, DT_OPTIM_SGD, 1, 1, 0, NULL), DT_OK);
    assert_int_equal(S->get_state(in.s, 1, DT_STATE_EXP_AVG_SQ, (dt_range_t){0, 1}, out_buf),
                     DT_ERR_NOT_FOUND);
    assert_non_null(strstr(dt_last_error(), "get_state: unit 'block.0': the sgd optimizer "
                                            "keeps no exp_avg_sq"));
    assert_int_equal(S->state_ranges(in.s, 1, DT_STATE_EXP_AVG_SQ, DT_RANGES_HELD, rr, 2, &n),
                     DT_OK);
    assert_int_equal(n, 0);
    assert_int_equal(S->state_ranges(in.s, 1, DT_STATE_EXP_AVG, DT_RANGES_HELD, rr, 2, &n),
                     DT_OK);
    assert_int_equal(n, 1);
    inst_close(&in);
}

/* SAVE ranges of all ranks partition each unit exactly once, balanced. */
static void test_save_ranges_partition(void **state)
{
    for (int32_t size = 1; size <= 4; size++) {
        uint64_t next[DT_TOY_NU] = {0};
        for (int32_t rank = 0; rank < size; rank++) {
            inst_t in;
            assert_int_equal(inst_open(&in, NULL, DT_F32, DT_OPTIM_ADAMW, 1, size, rank, NULL),
                       DT_OK);
            for (uint32_t u = 0; u < DT_TOY_NU; u++) {
                dt_range_t rr[2];
                uint32_t n = 0;
                assert_int_equal(S->state_ranges(in.s, u, DT_STATE_EXP_AVG_SQ, DT_RANGES_SAVE,
                                                 rr, 2, &n), DT_OK);
                assert_true(n <= 1);
                uint64_t cnt = n ? rr[0].count : 0;
                if (n)
                    assert_int_equal(rr[0].offset, next[u]); /* contiguous, rank order */
                uint64_t lo = units[u].numel / (uint64_t)size;
                assert_true(cnt == lo || cnt == lo + 1);
                next[u] += cnt;
            }
            inst_close(&in);
        }
        for (uint32_t u = 0; u < DT_TOY_NU; u++)
            assert_int_equal(next[u], units[u].numel);
    }
}

/* ------------------------------------------------- config and estimate */

static void test_config_errors(void **state)
{
    inst_t in;
    const dt_test_kv_t k1[] = {{"bucket_cap_mb", "0"}, {NULL, NULL}};
    assert_int_equal(inst_open(&in, k1, DT_F32, DT_OPTIM_ADAMW, 1, 1, 0, NULL),
                     DT_ERR_CONFIG);
    assert_non_null(strstr(dt_last_error(), "strategy/ddp: bucket_cap_mb = 0: must be in "
                                            "(0, 1e6] MiB"));
    assert_null(in.s);
    D->stream_destroy(in.dev, in.cs);
    D->finalize(in.dev);
    const dt_test_kv_t k2[] = {{"reduce_dtype", "fp8"}, {NULL, NULL}};
    assert_int_equal(inst_open(&in, k2, DT_F32, DT_OPTIM_ADAMW, 1, 1, 0, NULL),
                     DT_ERR_CONFIG);
    assert_non_null(strstr(dt_last_error(), "reduce_dtype = \"fp8\" is not one of the valid "
                                            "choices: fp32, bf16, fp16"));
    D->stream_destroy(in.dev, in.cs);
    D->finalize(in.dev);
    const dt_test_kv_t k3[] = {{"init_check", "none"}, {NULL, NULL}};
    assert_int_equal(inst_open(&in, k3, DT_F32, DT_OPTIM_ADAMW, 1, 1, 0, NULL),
                     DT_ERR_CONFIG);
    assert_non_null(strstr(dt_last_error(), "init_check = \"none\""));
    D->stream_destroy(in.dev, in.cs);
    D->finalize(in.dev);
    /* f64 compute parameters are not a ddp thing (f32, bf16, f16 are) */
    assert_int_equal(inst_open(&in, NULL, DT_F64, DT_OPTIM_ADAMW, 1, 1, 0, NULL),
                     DT_ERR_UNSUPPORTED);
    assert_non_null(strstr(dt_last_error(), "param_dtype f64: ddp keeps f32, bf16 or f16 "
                                            "compute parameters"));
    D->stream_destroy(in.dev, in.cs);
    D->finalize(in.dev);

    /* the declared keys */
    assert_int_equal(S->info.n_config_keys, 6);
    assert_string_equal(S->info.config_keys[0].name, "bucket_cap_mb");
    assert_string_equal(S->info.config_keys[1].choices, "fp32|bf16|fp16");
    assert_string_equal(S->info.config_keys[3].def, "\"checksum\"");
    assert_string_equal(S->info.config_keys[4].name, "offload_what");
    assert_string_equal(S->info.config_keys[5].name, "stagger_update");
    assert_string_equal(S->info.config_keys[5].def, "true");
}

/* The estimate matches what init allocates on the device, tag by tag. */
static void test_estimate_matches_allocation(void **state)
{
    const dt_test_kv_t kv[] = {{"bucket_cap_mb", "0.0004"}, {"reduce_dtype", "bf16"},
                               {NULL, NULL}};
    dt_test_host_t th;
    dt_test_host_init(&th, "strategy/ddp", kv);
    dt_model_desc_v1_t model = make_model(DT_BF16);
    dt_estimate_args_v1_t ea = {.struct_size = sizeof ea, .group_size = 4, .model = &model,
                                .param_bytes = 2, .grad_bytes = 4, .optim_bytes = 12,
                                .n_micro = 2, .act_bytes = 12345};
    dt_estimate_v1_t est = {.struct_size = sizeof(dt_estimate_v1_t)};
    assert_int_equal(S->estimate(&th.host, &ea, &est), DT_OK);
    assert_int_equal(est.bytes[DT_TAG_PARAMS], TOTAL * 2 + TOTAL * 4);
    assert_int_equal(est.bytes[DT_TAG_GRADS], TOTAL * 4);
    assert_int_equal(est.bytes[DT_TAG_OPTIMIZER], TOTAL * 12 - TOTAL * 4);
    assert_int_equal(est.bytes[DT_TAG_COMM], 2 * 96 * 2); /* 2 slots x bucket {1,2} */
    assert_int_equal(est.bytes[DT_TAG_ACTIVATIONS], 12345);
    assert_int_equal(est.bytes[DT_TAG_OTHER], 8 + 3 * 16 * DT_TOY_NU);
    assert_int_equal(est.comm_bytes_per_step, 480); /* 2 * 3/4 * 160 * 2 */
    assert_non_null(strstr(est.note, "2 bucket(s)"));
    assert_non_null(strstr(est.note, "bf16"));

    /* fp32 params, fp32 reduce, one rank: no master copy, no comm */
    dt_test_host_init(&th, "strategy/ddp", NULL);
    model = make_model(DT_F32);
    ea.group_size = 1;
    ea.param_bytes = 4;
    ea.optim_bytes = 8;
    assert_int_equal(S->estimate(&th.host, &ea, &est), DT_OK);
    assert_int_equal(est.bytes[DT_TAG_PARAMS], TOTAL * 4);
    assert_int_equal(est.bytes[DT_TAG_OPTIMIZER], TOTAL * 8);
    assert_int_equal(est.bytes[DT_TAG_COMM], 0);
    assert_int_equal(est.comm_bytes_per_step, 0);
    assert_non_null(strstr(est.note, "1 bucket(s)"));
    ea.group_size = 3;
    assert_int_equal(S->estimate(&th.host, &ea, &est), DT_OK);
    assert_int_equal(est.comm_bytes_per_step, (uint64_t)(2.0 * 2 / 3 * TOTAL * 4));
    ea.group_size = 0;
    assert_int_equal(S->estimate(&th.host, &ea, &est), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "estimate: group_size 0"));

    /* measured: init with the same config on a 2-rank fake group */
    inst_t in;
    assert_int_equal(inst_open(&in, kv, DT_BF16, DT_OPTIM_ADAMW, 2, 2, 0, NULL), DT_OK);
    set_params(&in);
    assert_int_equal(S->state_loaded(in.s), DT_OK); /* the checksum scratch peaks OTHER */
    dt_test_host_init(&th, "strategy/ddp", kv);
    ea = (dt_estimate_args_v1_t){.struct_size = sizeof ea, .group_size = 2, .model = &in.model,
                                 .param_bytes = 2, .grad_bytes = 4, .optim_bytes = 12,
                                 .n_micro = 2};
    assert_int_equal(S->estimate(&th.host, &ea, &est), DT_OK);
    dt_mem_stats_t ms = {.struct_size = sizeof(dt_mem_stats_t)};
    assert_int_equal(D->mem_stats(in.dev, &ms), DT_OK);
    const int tags[] = {DT_TAG_PARAMS, DT_TAG_GRADS, DT_TAG_OPTIMIZER, DT_TAG_COMM};
    for (int k = 0; k < 4; k++)
        assert_int_equal(ms.current[tags[k]], est.bytes[tags[k]]);
    assert_int_equal(ms.peak[DT_TAG_OTHER], est.bytes[DT_TAG_OTHER]);
    inst_close(&in);
}

/* ------------------------------------------- multi-rank (shm or nccl)
 *
 * Each case forks `size` ranks; every rank runs ddp over a real group
 * and writes what it saw to a shared mapping; the parent checks the
 * numbers.  A rank reports failure by its exit status (never by cmocka). */

typedef struct {
    const dt_test_kv_t *kv;
    int optim;
    uint32_t n_micro;
    int steps;
    float lr;
    float clip[2];
    int perturb;        /* rank 1 changes, before state_loaded, parameters of
                         * unit 1 (bit 0) and unit 0 (bit 1) */
} mp_case_t;

/* Fork `size` ranks running fn on case c (bounded, 60 s) and require
 * every one to exit 0. */
static void run_ranks(int size, dt_mp_rank_fn_t fn, const mp_case_t *c)
{
    memset(mp_out, 0, sizeof *mp_out);
    dt_mp_run_ranks(size, fn, (void *)c, 60.0, "ddptest");
}

/* Train `steps` steps with this rank's own gradients; report params, norms
 * and a helper check (dt_norm_allreduce sums f64 over the group). */
static int rank_train(int rank, int size, const char *job, void *arg)
{
    const mp_case_t *c = arg;
    inst_t in;
    DT_MP_OK(inst_open(&in, c->kv, DT_F32, c->optim, c->n_micro, size, rank, job));
    set_params(&in);
    DT_MP_OK(S->state_loaded(in.s));
    for (int t = 1; t <= c->steps; t++) {
        DT_MP_OK(S->begin_step(in.s, t));
        for (uint32_t m = 0; m < c->n_micro; m++) {
            forward(&in, m, c->n_micro, NULL);
            backward(&in, rank, m, c->n_micro, NULL, NULL);
        }
        dt_step_args_v1_t sa = {.struct_size = sizeof(dt_step_args_v1_t),
                                .step = t,
                                .lr = c->lr,
                                .clip = c->clip[t - 1]};
        dt_step_result_v1_t r = {.struct_size = sizeof(dt_step_result_v1_t)};
        DT_MP_OK(S->step(in.s, &sa, &r));
        DT_MP_CHECK(r.nonfinite == 0);
        mp_out->norm[rank][t - 1] = r.grad_norm;
    }
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        DT_MP_OK(S->get_state(in.s, u, DT_STATE_PARAMS, (dt_range_t){0, units[u].numel},
                              mp_out->params[rank][u]));
    double *slot = NULL;
    DT_MP_OK(D->alloc(in.dev, sizeof(double), DT_TAG_OTHER, (void **)&slot));
    double x = rank + 1;
    DT_MP_OK(dt_norm_allreduce(&in.th_ddp.host, in.comm, in.dev, in.cs, slot, &x));
    mp_out->f64sum[rank] = x;
    DT_MP_OK(D->free(in.dev, slot));
    inst_close(&in);
    return 0;
}

/* state_loaded after rank 1 changed one element of unit 1 and/or unit 0
 * (c->perturb): report the status, message and params. */
static int rank_init_check(int rank, int size, const char *job, void *arg)
{
    const mp_case_t *c = arg;
    inst_t in;
    DT_MP_OK(inst_open(&in, c->kv, DT_F32, DT_OPTIM_ADAMW, 1, size, rank, job));
    set_params(&in);
    const float bump[1] = {dt_toy_pval(1, 7) + 1e-3f}, bump0[1] = {-5.0f};
    if (rank == 1 && (c->perturb & 1))
        DT_MP_OK(S->set_state(in.s, 1, DT_STATE_PARAMS, (dt_range_t){7, 1}, bump));
    if (rank == 1 && (c->perturb & 2))
        DT_MP_OK(S->set_state(in.s, 0, DT_STATE_PARAMS, (dt_range_t){49, 1}, bump0));
    int rc = S->state_loaded(in.s);
    mp_out->rc[rank] = rc;
    snprintf(mp_out->msg[rank], sizeof mp_out->msg[rank], "%s", rc ? dt_last_error() : "");
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        DT_MP_OK(S->get_state(in.s, u, DT_STATE_PARAMS, (dt_range_t){0, units[u].numel},
                              mp_out->params[rank][u]));
    inst_close(&in);
    return 0;
}

static void require_comm(void)
{
    if (!COMM) {
        fprintf(stderr, "dtrain_%s.so not built: multi-rank case skipped\n",
                dt_toy_backend_comm());
        skip();
    }
}

/* The averaged-gradient reference for `size` ranks (double). */
static void ref_avg_grads(int size, uint32_t n_micro, double g[DT_TOY_NU][80])
{
    memset(g, 0, sizeof(double) * DT_TOY_NU * 80);
    for (int r = 0; r < size; r++)
        for (uint32_t m = 0; m < n_micro; m++)
            ref_micro(r, m, g);
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        for (uint64_t i = 0; i < units[u].numel; i++)
            g[u][i] /= size;
}

static void check_replicas_identical(int size)
{
    for (int r = 1; r < size; r++)
        assert_memory_equal(mp_out->params[r], mp_out->params[0], sizeof mp_out->params[0]);
}

/* 2 ranks (one bucket) and 3 ranks (three buckets, overlapped), AdamW with
 * clipping then without: every rank ends bitwise identical, equal to the
 * single-process reference on the averaged gradient.  Tolerance: the
 * gradient differs from the double reference only by f32 accumulation and
 * reduction order (~1e-7 relative); params after 2 steps within rel 2e-5 +
 * abs 1e-6, the norm within rel 1e-6. */
static void test_mp_train_matches_reference(void **state)
{
    require_comm();
    const dt_test_kv_t kv3[] = {{"bucket_cap_mb", "0.0003"}, {NULL, NULL}};
    for (int size = 2; size <= 3; size++) {
        mp_case_t c = {.kv = size == 3 ? kv3 : NULL, .optim = DT_OPTIM_ADAMW, .n_micro = 2,
                       .steps = 2, .lr = 1e-2f, .clip = {0.05f, 100.0f}};
        run_ranks(size, rank_train, &c);
        check_replicas_identical(size);
        static dt_toy_ref_t ref;
        static double g[DT_TOY_NU][80];
        dt_toy_ref_init(&ref);
        ref_avg_grads(size, 2, g);
        for (int t = 1; t <= 2; t++) {
            double norm = dt_toy_ref_update(&ref, DT_OPTIM_ADAMW, g, t, 1e-2, c.clip[t - 1]);
            for (int r = 0; r < size; r++)
                assert_true(fabs(mp_out->norm[r][t - 1] - norm) <= 1e-6 * norm);
        }
        for (uint32_t u = 0; u < DT_TOY_NU; u++)
            for (uint64_t i = 0; i < units[u].numel; i++) {
                double want = ref.p[u][i];
                if (!(fabs(mp_out->params[0][u][i] - want) <= 1e-6 + 2e-5 * fabs(want)))
                    fprintf(stderr, "size %d unit %u [%llu]: got %.9g want %.9g (p0 %.9g)\n",
                            size, u, (unsigned long long)i, mp_out->params[0][u][i], want,
                            dt_toy_pval(u, i));
                assert_true(fabs(mp_out->params[0][u][i] - want) <= 1e-6 + 2e-5 * fabs(want));
            }
        for (int r = 0; r < size; r++)
            assert_true(mp_out->f64sum[r] == size * (size + 1) / 2.0);
    }
}

/* reduce_dtype = bf16 or fp16, 3 ranks, 3 buckets over 2 reduction
 * buffers, SGD: the update lr * avg(g) matches the reference within the
 * 16-bit precision `rel` (two roundings: to 8 significant bits for bf16,
 * rel 1e-2 of the update; to 11 for fp16, rel 2e-3). */
static void mp_half_reduce(const char *dtype, double rel)
{
    require_comm();
    const dt_test_kv_t kv[] = {{"bucket_cap_mb", "0.0003"}, {"reduce_dtype", dtype},
                               {NULL, NULL}};
    mp_case_t c = {.kv = kv, .optim = DT_OPTIM_SGD, .n_micro = 2, .steps = 1, .lr = 0.1f};
    run_ranks(3, rank_train, &c);
    check_replicas_identical(3);
    static double g[DT_TOY_NU][80];
    ref_avg_grads(3, 2, g);
    double ss = 0;
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        for (uint64_t i = 0; i < units[u].numel; i++) {
            double p0 = dt_toy_pval(u, i), w = dt_toy_no_decay(u, i) ? 0.0 : 0.1;
            double upd = 0.1 * (g[u][i] + w * p0); /* first SGD step: mom = g */
            double got = p0 - mp_out->params[0][u][i];
            assert_true(fabs(got - upd) <= rel * fabs(0.1 * g[u][i]) + 1e-6);
            ss += g[u][i] * g[u][i];
        }
    assert_true(fabs(mp_out->norm[0][0] - sqrt(ss)) <= rel * sqrt(ss));
}

static void test_mp_bf16_reduce(void **state) { mp_half_reduce("bf16", 1e-2); }
static void test_mp_f16_reduce(void **state) { mp_half_reduce("fp16", 2e-3); }

/* init_check = checksum: a rank whose parameters differ makes every rank
 * fail, naming the first differing unit. */
static void test_mp_init_check_detects(void **state)
{
    require_comm();
    /* only unit 1 differs (by 1e-3 in one element), 3 ranks */
    mp_case_t c = {.kv = NULL, .perturb = 1};
    run_ranks(3, rank_init_check, &c);
    for (int r = 0; r < 3; r++) {
        assert_int_equal(mp_out->rc[r], DT_ERR_DATA);
        assert_non_null(strstr(mp_out->msg[r],
                               "strategy/ddp: init_check: the parameters of unit 'block.0' "
                               "(unit 1) differ across the 3 ranks of the data-parallel "
                               "group"));
        char who[32];
        snprintf(who, sizeof who, "(rank %d's hash", r);
        assert_non_null(strstr(mp_out->msg[r], who));
        assert_non_null(strstr(mp_out->msg[r], "init_check = \"broadcast\""));
    }
    /* units 0 and 1 differ, 2 ranks: the FIRST differing unit is named */
    const dt_test_kv_t kv[] = {{"init_check", "checksum"}, {NULL, NULL}};
    c = (mp_case_t){.kv = kv, .perturb = 3};
    run_ranks(2, rank_init_check, &c);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(mp_out->rc[r], DT_ERR_DATA);
        assert_non_null(strstr(mp_out->msg[r], "unit 'embedding' (unit 0) differ across the 2 "
                                               "ranks"));
    }
}

/* init_check = broadcast: rank 0's parameters win everywhere. */
static void test_mp_init_broadcast(void **state)
{
    require_comm();
    const dt_test_kv_t kv[] = {{"init_check", "broadcast"}, {NULL, NULL}};
    mp_case_t c = {.kv = kv, .perturb = 3};
    run_ranks(2, rank_init_check, &c);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(mp_out->rc[r], DT_OK);
        for (uint32_t u = 0; u < DT_TOY_NU; u++)
            for (uint64_t i = 0; i < units[u].numel; i++)
                assert_true(mp_out->params[r][u][i] == dt_toy_pval(u, i));
    }
}

int main(int argc, char **argv)
{
    int rc = dt_toy_backend_select(argc, argv, MAXR);
    if (rc >= 0)
        return rc;
    /* over the fake comm, in this process */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hook_protocol),
        cmocka_unit_test(test_accumulate_then_bucketed_reduce),
        cmocka_unit_test(test_bucket_assignment_and_order),
        cmocka_unit_test(test_no_overlap_and_bf16_reduce),
        cmocka_unit_test(test_step_adamw_reference),
        cmocka_unit_test(test_nonfinite_skips_update),
        cmocka_unit_test(test_staggered_update),
        cmocka_unit_test(test_bf16_compute_copy),
        cmocka_unit_test(test_state_roundtrip_and_errors),
        cmocka_unit_test(test_save_ranges_partition),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_estimate_matches_allocation),
    };
    /* forked ranks over a real communicator: every backend */
    const struct CMUnitTest mp_tests[] = {
        cmocka_unit_test(test_mp_train_matches_reference),
        cmocka_unit_test(test_mp_bf16_reduce),
        cmocka_unit_test(test_mp_f16_reduce),
        cmocka_unit_test(test_mp_init_check_detects),
        cmocka_unit_test(test_mp_init_broadcast),
    };
    if (strcmp(dt_toy_backend_device(), "cpu") == 0)
        return cmocka_run_group_tests_name("cpu, fake comm", tests, group_setup, NULL) +
               cmocka_run_group_tests_name("cpu + shm", mp_tests, group_setup, NULL);
    /* cuda: the forked cases first, so that no CUDA context exists in this
     * process when it forks (a child cannot use an inherited one) */
    int failed = cmocka_run_group_tests_name("cuda + nccl", mp_tests, group_setup, NULL);
    return failed + cmocka_run_group_tests_name("cuda, fake comm", tests, group_setup, NULL);
}
