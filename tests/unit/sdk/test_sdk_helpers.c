/*
 * tests/unit/sdk/test_sdk_helpers.c - the SDK helper library (dtrain_sdk):
 * ranges and shards, tensor pieces, flat layouts, bucket plans, the
 * optimizer-over-a-range driver, norms, hashes and the replica check.
 *
 * Device and comm are small fakes in this file: host memory, kernels with
 * the formulas of dtrain/device.h, and a log of every optimizer call so the
 * driver's split into pieces and its weight decays are checked exactly.
 * The config readers (dt_cfg_*) read a plugin's declared keys through the
 * test host, which holds their defaults as the core does.
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

#include "dtrain/sdk_helpers.h"
#include "test_host.h"
#include "util/error.h"

/* ------------------------------------------------------------------ fakes */

typedef struct {
    int kind;            /* 0 adamw, 1 sgd */
    ptrdiff_t off;       /* param pointer - base, elements */
    int64_t n;
    float wd, gs, lr;
    int64_t t;
} call_t;

struct dt_device {
    const dt_device_ops_v1_t *ops; /* first: &fake_dev_ops, or a copy (device.h) */
    float *base;         /* the param buffer calls are measured against */
    call_t calls[32];
    int n_calls;
    int fail_adamw;      /* return DT_ERR_SYSTEM from adamw_update */
};

static int fd_alloc(dt_device_t *d, uint64_t bytes, int tag, void **out)
{
    *out = calloc(1, bytes ? bytes : 1);
    return *out ? DT_OK : DT_ERR_NOMEM;
}
static int fd_free(dt_device_t *d, void *p) { free(p); return DT_OK; }
static int fd_memcpy(dt_device_t *d, void *dst, const void *src, uint64_t bytes, int kind,
                     dt_stream_t *s)
{
    memcpy(dst, src, bytes);
    return DT_OK;
}
static int fd_memset(dt_device_t *d, void *dst, int v, uint64_t bytes, dt_stream_t *s)
{
    memset(dst, v, bytes);
    return DT_OK;
}
static int fd_sync(dt_device_t *d, dt_stream_t *s) { return DT_OK; }

static int fd_adamw(dt_device_t *d, dt_stream_t *s, float *p, const void *gv, float *m,
                    float *v, int gdt, int64_t n, float lr, float b1, float b2, float eps,
                    float wd, float gs, int64_t t)
{
    const float *g = gv;
    if (d->fail_adamw)
        return DT_ERR_SYSTEM;
    d->calls[d->n_calls++] = (call_t){0, p - d->base, n, wd, gs, lr, t};
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * gs;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        float mh = m[i] / (float)(1 - pow(b1, (double)t));
        float vh = v[i] / (float)(1 - pow(b2, (double)t));
        p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
    }
    return DT_OK;
}

static int fd_sgd(dt_device_t *d, dt_stream_t *s, float *p, const void *gv, float *mom,
                  int gdt, int64_t n, float lr, float mu, float wd, int nesterov, float gs)
{
    const float *g = gv;
    d->calls[d->n_calls++] = (call_t){1, p - d->base, n, wd, gs, lr, 0};
    for (int64_t i = 0; i < n; i++) {
        float gi = g[i] * gs + wd * p[i];
        mom[i] = mu * mom[i] + gi;
        p[i] -= lr * (nesterov ? gi + mu * mom[i] : mom[i]);
    }
    return DT_OK;
}

static int fd_sumsq(dt_device_t *d, dt_stream_t *s, double *out, const void *x, int dtype,
                    int64_t n)
{
    double acc = 0;
    for (int64_t i = 0; i < n; i++)
        acc += (double)((const float *)x)[i] * ((const float *)x)[i];
    *out = acc;
    return DT_OK;
}

static const dt_kernels_v1_t fake_kernels = {
    .info = DT_KERNELS_INFO(dt_kernels_v1_t),
    .adamw_update = fd_adamw,
    .sgd_update = fd_sgd,
    .sumsq = fd_sumsq,
};
/* kernels() calls: a helper fetches the table once per call, not once per
 * kernel it runs (an interposed device counts and traces every call). */
static int n_kernels_fetched;
static const dt_kernels_v1_t *fd_kernels(void)
{
    n_kernels_fetched++;
    return &fake_kernels;
}

static const dt_device_ops_v1_t fake_dev_ops = {
    .info = {.abi_major = DT_DEVICE_ABI_MAJOR, .struct_size = sizeof(dt_device_ops_v1_t),
             .kind = DT_KIND_DEVICE, .name = "fake"},
    .kernels = fd_kernels,
    .alloc = fd_alloc,
    .free = fd_free,
    .memcpy_async = fd_memcpy,
    .memset_async = fd_memset,
    .stream_sync = fd_sync,
};

/* A comm of `size` ranks where every other rank holds this rank's data,
 * except that `peer_diff` (>= 0) adds 1 to f32 element peer_diff on the
 * peers: MAX then sees the bump, MIN does not. */
struct dt_comm {
    const dt_comm_ops_v1_t *ops; /* first: &fake_comm_ops (dtrain/comm.h) */
    int32_t size;
    int64_t peer_diff;
    int n_allreduce;
};

static int fc_rank_size(dt_comm_t *c, int32_t *r, int32_t *s)
{
    *r = 0;
    *s = c->size;
    return DT_OK;
}

static int fc_all_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count, int dtype,
                         int op, dt_stream_t *st, dt_comm_req_t **req)
{
    c->n_allreduce++;
    if (dtype == DT_F64) {
        /* SUM over identical ranks */
        for (uint64_t i = 0; i < count; i++)
            ((double *)recv)[i] = ((const double *)send)[i] * c->size;
    } else {
        memmove(recv, send, count * sizeof(float));
        if (c->peer_diff >= 0 && (uint64_t)c->peer_diff < count && op == DT_OP_MAX)
            ((float *)recv)[c->peer_diff] += 1.0f;
    }
    if (req)
        *req = NULL;
    return DT_OK;
}

static const dt_comm_ops_v1_t fake_comm_ops = {
    .info = {.abi_major = DT_COMM_ABI_MAJOR, .struct_size = sizeof(dt_comm_ops_v1_t),
             .kind = DT_KIND_COMM, .name = "fake"},
    .rank_size = fc_rank_size,
    .all_reduce = fc_all_reduce,
};

/* --------------------------------------------------------- a test unit */

/* w (2,3) decay | b (3) no-decay | ln.w (4) no-decay | w2 (7) decay = 20 */
static dt_param_desc_v1_t unit_params[] = {
    {.name = "w", .offset = 0, .numel = 6, .ndim = 2, .shape = {2, 3}},
    {.name = "b", .offset = 6, .numel = 3, .ndim = 1, .flags = DT_PARAM_NO_DECAY, .shape = {3}},
    {.name = "ln.w", .offset = 9, .numel = 4, .ndim = 1, .flags = DT_PARAM_NO_DECAY,
     .shape = {4}},
    {.name = "w2", .offset = 13, .numel = 7, .ndim = 1, .shape = {7}},
};
static dt_unit_desc_v1_t test_unit = {
    .name = "block.0", .index = 0, .n_params = 4, .params = unit_params, .numel = 20};

static dt_test_host_t th;

static int setup(void **state)
{
    dt_test_host_init(&th, "strategy/test", NULL);
    dt_err_clear();
    return 0;
}

/* ------------------------------------------------------------------ tests */

static void test_range_split_partitions(void **state)
{
    dt_range_t r = dt_range_split(10, 3, 0);
    assert_int_equal(r.offset, 0);
    assert_int_equal(r.count, 4);
    r = dt_range_split(10, 3, 1);
    assert_int_equal(r.offset, 4);
    assert_int_equal(r.count, 3);
    r = dt_range_split(10, 3, 2);
    assert_int_equal(r.offset, 7);
    assert_int_equal(r.count, 3);
    r = dt_range_split(10, 3, 3);
    assert_int_equal(r.count, 0);
    r = dt_range_split(10, 0, 0);
    assert_int_equal(r.count, 0);

    const uint64_t ns[] = {0, 1, 2, 7, 64, 1001};
    const uint32_t ps[] = {1, 2, 3, 5, 8};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (size_t j = 0; j < sizeof ps / sizeof ps[0]; j++) {
            uint64_t next = 0, lo = UINT64_MAX, hi = 0;
            for (uint32_t k = 0; k < ps[j]; k++) {
                dt_range_t x = dt_range_split(ns[i], ps[j], k);
                assert_int_equal(x.offset, next); /* contiguous, in rank order */
                next += x.count;
                lo = x.count < lo ? x.count : lo;
                hi = x.count > hi ? x.count : hi;
            }
            assert_int_equal(next, ns[i]);    /* covers [0, n) exactly */
            assert_true(hi - lo <= 1);        /* balanced */
        }
}

static void test_shards_and_intersect(void **state)
{
    assert_int_equal(dt_shard_size(10, 3, 1), 4);
    assert_int_equal(dt_shard_size(10, 3, 8), 8);
    assert_int_equal(dt_shard_size(12, 3, 0), 4);
    assert_int_equal(dt_shard_size(5, 0, 0), 0);
    dt_range_t r = dt_range_intersect((dt_range_t){3, 10}, (dt_range_t){8, 10});
    assert_int_equal(r.offset, 8);
    assert_int_equal(r.count, 5);
    r = dt_range_intersect((dt_range_t){0, 3}, (dt_range_t){5, 2});
    assert_int_equal(r.count, 0);
    r = dt_range_intersect((dt_range_t){0, 5}, (dt_range_t){5, 2}); /* touching */
    assert_int_equal(r.count, 0);
}

static void test_pieces_of_a_range(void **state)
{
    dt_piece_iter_t it;
    dt_piece_t p;
    /* [4, 17): w[4,6) b[6,9) ln.w[9,13) w2[13,17) */
    const struct { uint32_t param; uint64_t off, n, ro, to; } want[] = {
        {0, 4, 2, 0, 4}, {1, 6, 3, 2, 0}, {2, 9, 4, 5, 0}, {3, 13, 4, 9, 0}};
    dt_piece_iter_init(&it, &test_unit, (dt_range_t){4, 13});
    for (int k = 0; k < 4; k++) {
        assert_int_equal(dt_piece_iter_next(&it, &p), 1);
        assert_int_equal(p.param, want[k].param);
        assert_ptr_equal(p.desc, &unit_params[want[k].param]);
        assert_int_equal(p.offset, want[k].off);
        assert_int_equal(p.count, want[k].n);
        assert_int_equal(p.range_offset, want[k].ro);
        assert_int_equal(p.tensor_offset, want[k].to);
    }
    assert_int_equal(dt_piece_iter_next(&it, &p), 0);
    assert_int_equal(dt_piece_iter_next(&it, &p), 0); /* stays finished */

    /* a range strictly inside one tensor */
    dt_piece_iter_init(&it, &test_unit, (dt_range_t){14, 3});
    assert_int_equal(dt_piece_iter_next(&it, &p), 1);
    assert_int_equal(p.param, 3);
    assert_int_equal(p.tensor_offset, 1);
    assert_int_equal(p.count, 3);
    assert_int_equal(dt_piece_iter_next(&it, &p), 0);

    /* empty and past-the-end ranges give nothing */
    dt_piece_iter_init(&it, &test_unit, (dt_range_t){20, 0});
    assert_int_equal(dt_piece_iter_next(&it, &p), 0);
    dt_piece_iter_init(&it, &test_unit, (dt_range_t){7, 0});
    assert_int_equal(dt_piece_iter_next(&it, &p), 0);
}

static void test_unit_validate(void **state)
{
    assert_int_equal(dt_unit_validate(&th.host, &test_unit), DT_OK);

    dt_param_desc_v1_t bad[2] = {
        {.name = "a", .offset = 0, .numel = 4, .ndim = 1, .shape = {4}},
        {.name = "b.overlaps", .offset = 3, .numel = 2, .ndim = 1, .shape = {2}}};
    dt_unit_desc_v1_t u = {.name = "block.7", .index = 8, .n_params = 2, .params = bad,
                           .numel = 6};
    assert_int_equal(dt_unit_validate(&th.host, &u), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "strategy/test: unit 'block.7' (8): tensor "
                                            "'b.overlaps' at offset 3 overlaps"));

    bad[1].offset = 4;
    bad[1].numel = 3; /* 4 + 3 > 6 */
    bad[1].shape[0] = 3;
    assert_int_equal(dt_unit_validate(&th.host, &u), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "tensor 'b.overlaps' [4, +3) runs past the "
                                            "unit's 6 elements"));

    bad[1].numel = 2; /* shape says 3 */
    assert_int_equal(dt_unit_validate(&th.host, &u), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "tensor 'b.overlaps' has numel 2 but its shape "
                                            "holds 3"));
}

static void test_flat_layout(void **state)
{
    const uint64_t counts[] = {5, 0, 17, 16};
    dt_flat_layout_t l;
    assert_int_equal(dt_flat_layout_init(&l, &th.host, counts, 4, 16), DT_OK);
    assert_int_equal(l.n_units, 4);
    assert_int_equal(l.offset[0], 0);
    assert_int_equal(l.offset[1], 16);
    assert_int_equal(l.offset[2], 16);
    assert_int_equal(l.offset[3], 48);
    assert_int_equal(l.offset[4], 64);
    assert_int_equal(l.total, 64);
    assert_int_equal(l.count[2], 17);
    float buf[64];
    assert_ptr_equal(dt_flat_unit_ptr(buf, &l, DT_F32, 3), buf + 48);
    uint16_t hb[64];
    assert_ptr_equal(dt_flat_unit_ptr(hb, &l, DT_BF16, 2), hb + 16);
    dt_flat_layout_free(&l, &th.host);
    assert_int_equal(th.mem.current[DT_TAG_OTHER], 0); /* tables freed */

    /* from a model, and a per-tensor pointer */
    dt_unit_desc_v1_t units[2] = {test_unit, test_unit};
    units[1].index = 1;
    dt_model_desc_v1_t model = {
        .struct_size = sizeof(dt_model_desc_v1_t), .n_units = 2, .units = units, .numel = 40};
    assert_int_equal(dt_flat_layout_model(&l, &th.host, &model, 16), DT_OK);
    assert_int_equal(l.offset[1], 32);
    assert_int_equal(l.total, 64);
    assert_ptr_equal(dt_flat_param_ptr(buf, &l, DT_F32, &units[1], 3), buf + 32 + 13);
    dt_flat_layout_free(&l, &th.host);

    /* dt_flat_alloc zero-fills the whole padded buffer */
    struct dt_device dev = {.ops = &fake_dev_ops};
    assert_int_equal(dt_flat_layout_init(&l, &th.host, counts, 4, 16), DT_OK);
    float *p = NULL;
    assert_int_equal(dt_flat_alloc(&th.host, &dev, NULL, &l, DT_F32,
                                   DT_TAG_GRADS, "grads", (void **)&p), DT_OK);
    for (int i = 0; i < 64; i++)
        assert_true(p[i] == 0.0f);
    free(p);
    assert_int_equal(dt_flat_alloc(&th.host, &dev, NULL, &l, 99,
                                   DT_TAG_GRADS, "grads", (void **)&p), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "allocating 'grads': unknown dtype 99"));
    dt_flat_layout_free(&l, &th.host);
}

static void test_bucket_plan(void **state)
{
    dt_bucket_span_t sp[8];
    uint32_t of[8];
    /* backward order: u2 (200) alone, since 200 + 256 > 300; then u1 + u0 */
    const uint64_t a[] = {40, 256, 200};
    assert_int_equal(dt_bucket_plan(a, 3, 300, sp, of), 2);
    assert_int_equal(sp[0].unit_lo, 2);
    assert_int_equal(sp[0].unit_hi, 2);
    assert_int_equal(sp[0].bytes, 200);
    assert_int_equal(sp[1].unit_lo, 0);
    assert_int_equal(sp[1].unit_hi, 1);
    assert_int_equal(sp[1].bytes, 296);
    assert_int_equal(of[0], 1);
    assert_int_equal(of[1], 1);
    assert_int_equal(of[2], 0);

    /* an exact fit stays in one bucket; one byte less splits off unit 0 */
    assert_int_equal(dt_bucket_plan(a, 3, 496, sp, NULL), 1);
    assert_int_equal(sp[0].bytes, 496);
    assert_int_equal(dt_bucket_plan(a, 3, 495, sp, NULL), 2);
    assert_int_equal(sp[0].bytes, 456);
    assert_int_equal(sp[1].unit_lo, 0);
    assert_int_equal(sp[1].unit_hi, 0);

    /* a unit larger than the cap gets its own bucket, zero-size units join */
    const uint64_t b[] = {10, 1000, 0, 10, 10};
    assert_int_equal(dt_bucket_plan(b, 5, 25, sp, of), 3);
    assert_int_equal(sp[0].unit_lo, 2); /* units 4, 3, 2 (20 bytes) */
    assert_int_equal(sp[0].unit_hi, 4);
    assert_int_equal(sp[1].unit_lo, 1);
    assert_int_equal(sp[1].unit_hi, 1);
    assert_int_equal(sp[1].bytes, 1000);
    assert_int_equal(sp[2].unit_lo, 0);
    assert_int_equal(of[2], 0);
    assert_int_equal(dt_bucket_plan(b, 0, 25, sp, of), 0);
}

static void test_clip_scale(void **state)
{
    assert_true(dt_clip_scale(5.0, 0.0f) == 1.0f);
    assert_true(dt_clip_scale(5.0, -1.0f) == 1.0f);
    assert_true(dt_clip_scale(0.5, 1.0f) == 1.0f);
    assert_true(dt_clip_scale(2.0, 1.0f) == (float)(1.0 / (2.0 + 1e-6)));
    /* just under the clip the coefficient is 1 (min), not > 1 */
    assert_true(dt_clip_scale(1.0, 1.0f) == (float)(1.0 / (1.0 + 1e-6)));
    assert_true(dt_clip_scale(0.0, 1.0f) == 1.0f);
}

/* Double-precision AdamW / SGD on one element (device.h formulas). */
static void ref_adamw(double *p, double g, double *m, double *v, double lr, double b1,
                      double b2, double eps, double wd, double gs, int64_t t)
{
    g *= gs;
    *m = b1 * *m + (1 - b1) * g;
    *v = b2 * *v + (1 - b2) * g * g;
    double mh = *m / (1 - pow(b1, (double)t)), vh = *v / (1 - pow(b2, (double)t));
    *p -= lr * (mh / (sqrt(vh) + eps) + wd * *p);
}

static void test_optim_range_adamw(void **state)
{
    struct dt_device dev = {.ops = &fake_dev_ops};
    const dt_optim_desc_v1_t od = {.struct_size = sizeof(dt_optim_desc_v1_t),
                                   .kind = DT_OPTIM_ADAMW,
                                   .beta1 = 0.9f,
                                   .beta2 = 0.95f,
                                   .eps = 1e-8f,
                                   .weight_decay = 0.1f};
    /* a shard [4, 17) held in buffers of 13 elements */
    float p[13], g[13], m[13] = {0}, v[13] = {0};
    double rp[13], rm[13] = {0}, rv[13] = {0};
    for (int i = 0; i < 13; i++) {
        p[i] = (float)(0.5 - 0.07 * i);
        g[i] = (float)(0.3 * sin(1.0 + i));
        rp[i] = p[i];
    }
    dev.base = p;
    dt_optim_step_t st = {.desc = &od, .lr = 0.01f, .grad_scale = 0.5f, .t = 1};
    for (int64_t t = 1; t <= 3; t++) {
        st.t = t;
        dev.n_calls = 0;
        n_kernels_fetched = 0;
        assert_int_equal(dt_optim_range(&th.host, &dev, NULL, &test_unit,
                                        (dt_range_t){4, 13}, p, g, m, v, &st), DT_OK);
        /* w tail (decay), then b + ln.w merged (no decay), then w2 head */
        assert_int_equal(dev.n_calls, 3);
        assert_int_equal(n_kernels_fetched, 1); /* three kernels, one table fetch */
        assert_int_equal(dev.calls[0].off, 0);
        assert_int_equal(dev.calls[0].n, 2);
        assert_true(dev.calls[0].wd == 0.1f);
        assert_int_equal(dev.calls[1].off, 2);
        assert_int_equal(dev.calls[1].n, 7);
        assert_true(dev.calls[1].wd == 0.0f);
        assert_int_equal(dev.calls[2].off, 9);
        assert_int_equal(dev.calls[2].n, 4);
        assert_true(dev.calls[2].wd == 0.1f);
        for (int k = 0; k < 3; k++) {
            assert_true(dev.calls[k].gs == 0.5f);
            assert_int_equal(dev.calls[k].t, t);
        }
        for (int i = 0; i < 13; i++) {
            int unit_i = 4 + i;
            double wd = (unit_i >= 6 && unit_i < 13) ? 0.0 : 0.1;
            ref_adamw(&rp[i], g[i], &rm[i], &rv[i], 0.01, 0.9, 0.95, 1e-8, wd, 0.5, t);
        }
    }
    /* f32 kernel vs double reference: 3 steps, |delta| ~ lr, rel 1e-5 */
    for (int i = 0; i < 13; i++)
        assert_true(fabs(p[i] - rp[i]) <= 1e-6 + 1e-5 * fabs(rp[i]));

    /* errors: outside the unit, step 0, unknown kind, missing v */
    assert_int_equal(dt_optim_range(&th.host, &dev, NULL, &test_unit,
                                    (dt_range_t){10, 11}, p, g, m, v, &st), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "range [10, +11) is outside unit 'block.0' (0) "
                                            "of 20 elements"));
    st.t = 0;
    assert_int_equal(dt_optim_range(&th.host, &dev, NULL, &test_unit,
                                    (dt_range_t){4, 13}, p, g, m, v, &st), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "AdamW step count 0 for unit 'block.0'"));
    st.t = 1;
    assert_int_equal(dt_optim_range(&th.host, &dev, NULL, &test_unit,
                                    (dt_range_t){4, 13}, p, g, m, NULL, &st), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "NULL second-moment buffer for unit 'block.0'"));
    dt_optim_desc_v1_t bad = od;
    bad.kind = 7;
    st.desc = &bad;
    assert_int_equal(dt_optim_range(&th.host, &dev, NULL, &test_unit,
                                    (dt_range_t){4, 13}, p, g, m, v, &st), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "unknown kind 7"));

    /* a device failure keeps the device's status */
    st.desc = &od;
    dev.fail_adamw = 1;
    assert_int_equal(dt_optim_range(&th.host, &dev, NULL, &test_unit,
                                    (dt_range_t){0, 20}, p, g, m, v, &st), DT_ERR_SYSTEM);
}

static void test_optim_range_sgd_whole_unit(void **state)
{
    struct dt_device dev = {.ops = &fake_dev_ops};
    const dt_optim_desc_v1_t od = {.struct_size = sizeof(dt_optim_desc_v1_t),
                                   .kind = DT_OPTIM_SGD,
                                   .momentum = 0.9f,
                                   .nesterov = 1,
                                   .weight_decay = 0.01f};
    float p[20], g[20], mom[20] = {0};
    double rp[20], rmom[20] = {0};
    for (int i = 0; i < 20; i++) {
        p[i] = (float)(1.0 + 0.1 * i);
        g[i] = (float)(0.2 * cos(0.5 * i));
        rp[i] = p[i];
    }
    dev.base = p;
    dt_optim_step_t st = {.desc = &od, .lr = 0.1f, .grad_scale = 1.0f, .t = 1};
    for (int rep = 0; rep < 2; rep++) {
        dev.n_calls = 0;
        assert_int_equal(dt_optim_range(&th.host, &dev, NULL, &test_unit,
                                        (dt_range_t){0, 20}, p, g, mom, NULL, &st), DT_OK);
        assert_int_equal(dev.n_calls, 3); /* [0,6) wd, [6,13) 0, [13,20) wd */
        assert_int_equal(dev.calls[1].off, 6);
        assert_int_equal(dev.calls[1].n, 7);
        assert_true(dev.calls[1].wd == 0.0f);
        assert_true(dev.calls[2].wd == 0.01f);
        for (int i = 0; i < 20; i++) {
            double wd = (i >= 6 && i < 13) ? 0.0 : 0.01;
            double gi = g[i] + wd * rp[i];
            rmom[i] = 0.9 * rmom[i] + gi;
            rp[i] -= 0.1 * (gi + 0.9 * rmom[i]);
        }
    }
    for (int i = 0; i < 20; i++)
        assert_true(fabs(p[i] - rp[i]) <= 1e-6 + 1e-6 * fabs(rp[i]));
    /* an empty range makes no call */
    dev.n_calls = 0;
    assert_int_equal(dt_optim_range(&th.host, &dev, NULL, &test_unit,
                                    (dt_range_t){20, 0}, p, g, mom, NULL, &st), DT_OK);
    assert_int_equal(dev.n_calls, 0);
}

/* The optimizer updates are optional kernels: a device without the one
 * asked for is refused, naming it, and nothing is called. */
static const dt_kernels_v1_t adamw_only_kernels = {
    .info = DT_KERNELS_INFO(dt_kernels_v1_t),
    .adamw_update = fd_adamw,
};
static const dt_kernels_v1_t *fd_adamw_only(void) { return &adamw_only_kernels; }

static void test_optim_range_kernel_missing(void **state)
{
    dt_device_ops_v1_t ops = fake_dev_ops;
    ops.kernels = fd_adamw_only;
    struct dt_device dev = {.ops = &ops};
    const dt_optim_desc_v1_t od = {.struct_size = sizeof(dt_optim_desc_v1_t),
                                   .kind = DT_OPTIM_SGD};
    float p[20] = {0}, g[20] = {0}, mom[20] = {0};
    dev.base = p;
    dt_optim_step_t st = {.desc = &od, .lr = 0.1f, .grad_scale = 1.0f, .t = 1};
    assert_int_equal(dt_optim_range(&th.host, &dev, NULL, &test_unit,
                                    (dt_range_t){0, 20}, p, g, mom, NULL, &st),
                     DT_ERR_UNSUPPORTED);
    assert_string_equal(dt_last_error(), "strategy/test: optimizer: device 'fake' has no "
                                         "kernel 'sgd_update' (f32 parameters and "
                                         "gradients; unit 'block.0')");
    assert_int_equal(dev.n_calls, 0);
}

static void test_norms(void **state)
{
    struct dt_device dev = {.ops = &fake_dev_ops};
    float x[37];
    double want = 0;
    for (int i = 0; i < 37; i++) {
        x[i] = (float)(0.25 * i - 3.0);
        want += (double)x[i] * x[i];
    }
    double slot, got = -1;
    assert_int_equal(dt_norm_sumsq(&th.host, &dev, NULL, &slot, x, DT_F32, 37,
                                   &got), DT_OK);
    assert_true(got == want); /* both exact double sums of the same order */

    struct dt_comm comm = {.ops = &fake_comm_ops, .size = 3, .peer_diff = -1};
    double s = 2.5;
    assert_int_equal(dt_norm_allreduce(&th.host, &comm, &dev,
                                       NULL, &slot, &s), DT_OK);
    assert_true(s == 7.5);
    assert_int_equal(comm.n_allreduce, 1);
}

/* (part - skipped, never below 0) with the fake device's sequential sums. */
static double part_less(const float *x, uint64_t lo, uint64_t n, uint64_t slo, uint64_t sn)
{
    double part = 0, skipped = 0;
    for (uint64_t i = lo; i < lo + n; i++)
        part += (double)x[i] * x[i];
    double one = 0;
    for (uint64_t i = slo; i < slo + sn; i++)
        one += (double)x[i] * x[i];
    skipped += one;
    return part - skipped < 0.0 ? 0.0 : part - skipped;
}

/* The norm plan dt_dp builds once: a pipeline stage's COPY unit left out
 * whole, tensor-parallel duplicates as skip ranges of their part, moved to
 * where the buffer keeps the span; the norm is then one loop. */
static void test_norm_plan(void **state)
{
    const dt_param_split_v1_t dup = {.struct_size = sizeof dup, .n_blocks = 1,
                                     .flags = DT_SPLIT_DUPLICATE};
    dt_param_desc_v1_t p0[3] = {{.name = "a", .offset = 0, .numel = 4},
                                {.name = "b", .offset = 4, .numel = 6, .ext = &dup},
                                {.name = "c", .offset = 10, .numel = 2, .ext = &dup}};
    dt_param_desc_v1_t p1[1] = {{.name = "wte", .offset = 0, .numel = 8}};
    dt_param_desc_v1_t p2[2] = {{.name = "d", .offset = 0, .numel = 5, .ext = &dup},
                                {.name = "e", .offset = 5, .numel = 5}};
    dt_unit_desc_v1_t units[3] = {{.name = "u0", .index = 0, .n_params = 3, .params = p0, .numel = 12},
                                  {.name = "u1", .index = 1, .n_params = 1, .params = p1, .numel = 8},
                                  {.name = "u2", .index = 2, .n_params = 2, .params = p2, .numel = 10}};
    dt_model_desc_v1_t model = {.struct_size = sizeof model, .n_units = 3, .units = units};
    uint8_t flags[3] = {DT_UNIT_HELD, DT_UNIT_HELD | DT_UNIT_TIED | DT_UNIT_COPY, DT_UNIT_HELD};
    dt_dp_t b = {.host = &th.host, .model = &model, .unit_flags = flags};
    dt_norm_plan_t plan = {0};
    const uint64_t at0 = 0, at1 = 0, at2 = 0;
    /* elements [2, 12) of u0 at buffer 0; u1 (COPY) at 10; [0, 10) of u2 at 20 */
    assert_int_equal(dt_dp_norm_plan_add(&b, &plan, 2, 10, 0, 0, &at0, 0), DT_OK);
    assert_int_equal(dt_dp_norm_plan_add(&b, &plan, 0, 8, 1, 1, &at1, 10), DT_OK);
    assert_int_equal(dt_dp_norm_plan_add(&b, &plan, 0, 10, 2, 2, &at2, 20), DT_OK);
    assert_int_equal(plan.n_parts, 2);
    assert_int_equal(plan.n_skip, 2);
    assert_true(plan.parts[0].sum.offset == 0 && plan.parts[0].sum.count == 10);
    assert_true(plan.parts[0].skip_lo == 0 && plan.parts[0].n_skip == 1);
    assert_true(plan.skip[0].offset == 2 && plan.skip[0].count == 8); /* b and c, one run */
    assert_true(plan.parts[1].sum.offset == 20 && plan.parts[1].sum.count == 10);
    assert_true(plan.parts[1].skip_lo == 1 && plan.parts[1].n_skip == 1);
    assert_true(plan.skip[1].offset == 20 && plan.skip[1].count == 5);

    struct dt_device dev = {.ops = &fake_dev_ops};
    float x[30];
    for (int i = 0; i < 30; i++)
        x[i] = (float)(0.5 * i - 4.0);
    double slot, got = -1;
    assert_int_equal(dt_norm_plan_sumsq(&th.host, &dev, NULL, &slot, x, &plan,
                                        &got), DT_OK);
    double want = 0.0;
    want += part_less(x, 0, 10, 2, 8);
    want += part_less(x, 20, 10, 20, 5);
    assert_true(got == want);
    dt_norm_plan_free(&th.host, &plan);
    assert_null(plan.parts);

    /* one part without skips: exactly dt_norm_sumsq over it */
    double whole = -1;
    assert_int_equal(dt_norm_plan_part(&th.host, &plan, (dt_range_t){.offset = 3, .count = 27}),
                     DT_OK);
    assert_int_equal(dt_norm_plan_sumsq(&th.host, &dev, NULL, &slot, x, &plan,
                                        &got), DT_OK);
    assert_int_equal(dt_norm_sumsq(&th.host, &dev, NULL, &slot, x + 3, DT_F32, 27,
                                   &whole), DT_OK);
    assert_true(got == whole);
    dt_norm_plan_free(&th.host, &plan);

    /* an empty plan sums nothing; a skip range needs a part */
    assert_int_equal(dt_norm_plan_sumsq(&th.host, &dev, NULL, &slot, x, &plan,
                                        &got), DT_OK);
    assert_true(got == 0.0);
    assert_int_equal(dt_norm_plan_skip(&th.host, &plan, (dt_range_t){0, 1}), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "norm plan: a skip range before any part"));
}

static void test_hash(void **state)
{
    uint32_t w[257];
    for (int i = 0; i < 257; i++)
        w[i] = (uint32_t)i * 2654435761u;
    uint64_t one = dt_hash64_update(DT_HASH64_INIT, w, sizeof w);
    /* chunked in multiples of 4 bytes == one shot */
    uint64_t h = DT_HASH64_INIT;
    h = dt_hash64_update(h, w, 12);
    h = dt_hash64_update(h, (char *)w + 12, 400);
    h = dt_hash64_update(h, (char *)w + 412, sizeof w - 412);
    assert_true(h == one);
    /* FNV-1a of the empty input is the offset basis; of "a" the known value */
    assert_true(dt_hash64_update(DT_HASH64_INIT, "", 0) == DT_HASH64_INIT);
    assert_true(dt_hash64_update(DT_HASH64_INIT, "a", 1) == 0xaf63dc4c8601ec8cull);
    /* every single-word change is seen (each step is a bijection) */
    for (int i = 0; i < 257; i += 16) {
        uint32_t save = w[i];
        w[i] ^= 1u << (i % 32);
        assert_true(dt_hash64_update(DT_HASH64_INIT, w, sizeof w) != one);
        w[i] = save;
    }
    /* through the device with a tiny staging buffer (13 -> 8-byte chunks) */
    struct dt_device dev = {.ops = &fake_dev_ops};
    char staging[13];
    uint64_t hd = DT_HASH64_INIT;
    assert_int_equal(dt_hash_device(&th.host, &dev, NULL, w, sizeof w, staging,
                                    sizeof staging, &hd), DT_OK);
    assert_true(hd == one);
    assert_int_equal(dt_hash_device(&th.host, &dev, NULL, w, sizeof w, staging,
                                    4, &hd), DT_ERR_INVALID);
    assert_non_null(strstr(dt_last_error(), "staging buffer of 4 bytes (need >= 8)"));
}

static void test_replica_check(void **state)
{
    struct dt_device dev = {.ops = &fake_dev_ops};
    const uint64_t hashes[4] = {0x1111222233334444ull, 0xffffffffffffffffull, 0, 42};
    uint32_t first = 99;
    struct dt_comm comm = {.ops = &fake_comm_ops, .size = 2, .peer_diff = -1};
    assert_int_equal(dt_replica_check(&th.host, &comm, &dev,
                                      NULL, hashes, 4, &first), DT_OK);
    assert_int_equal(first, 4);
    assert_int_equal(comm.n_allreduce, 2); /* MAX and MIN */
    /* a peer whose hash 2 differs in its third 16-bit field (f32 element 10) */
    comm.peer_diff = 2 * 4 + 2;
    assert_int_equal(dt_replica_check(&th.host, &comm, &dev,
                                      NULL, hashes, 4, &first), DT_OK);
    assert_int_equal(first, 2);
    comm.peer_diff = 3 * 4 + 3; /* the last field of the last hash */
    assert_int_equal(dt_replica_check(&th.host, &comm, &dev,
                                      NULL, hashes, 4, &first), DT_OK);
    assert_int_equal(first, 3);
    assert_int_equal(th.mem.current[DT_TAG_OTHER], 0); /* scratch freed */
}

/* -------------------------------------------------------------- config */

static const dt_config_key_t cfgtest_keys[] = {
    {.name = "n", .type = DT_CFG_INT, .def = "1_024", DT_CFG_RANGE(0, 1e6)},
    {.name = "on", .type = DT_CFG_BOOL, .def = "true"},
    {.name = "rate", .type = DT_CFG_FLOAT, .def = "2.5"},
    {.name = "path", .type = DT_CFG_STRING, .def = "\"/tmp/a_b\""},
    {.name = "mode", .type = DT_CFG_ENUM, .def = "\"b\"", .choices = "a|b|c"},
    {.name = "req", .type = DT_CFG_INT, .def = NULL},
};
static const dt_plugin_info_t cfgtest_info = {
    .kind = DT_KIND_STRATEGY, .name = "cfgtest", .config_keys = cfgtest_keys,
    .n_config_keys = sizeof cfgtest_keys / sizeof cfgtest_keys[0]};

static int cfg_int_fails(const dt_host_v1_t *h, const char *key, int64_t *out)
{
    (void)h, (void)key, (void)out;
    return DT_ERR_INVALID;
}

static void test_cfg_reads_declared_defaults(void **state)
{
    (void)state;
    dt_test_host_declare(&cfgtest_info);
    dt_test_host_t h;
    const dt_test_kv_t kv[] = {{"mode", "c"}, {"rate", "0.5"}, {NULL, NULL}};
    dt_test_host_init(&h, "strategy/cfgtest", kv);
    int64_t n = -1;
    int on = 0, mode = -1;
    double rate = 0;
    const char *path = NULL;
    /* the declared defaults reach the plugin; the host's values win */
    assert_int_equal(dt_cfg_int(&h.host, "n", &n), DT_OK);
    assert_int_equal(n, 1024);
    assert_int_equal(dt_cfg_bool(&h.host, "on", &on), DT_OK);
    assert_int_equal(on, 1);
    assert_int_equal(dt_cfg_string(&h.host, "path", &path), DT_OK);
    assert_string_equal(path, "/tmp/a_b");
    assert_int_equal(dt_cfg_float(&h.host, "rate", &rate), DT_OK);
    assert_true(rate == 0.5);
    assert_int_equal(dt_cfg_enum(&h.host, "mode", "a|b|c", &mode), DT_OK);
    assert_int_equal(mode, 2);
    dt_test_host_init(&h, "strategy/cfgtest", NULL);
    assert_int_equal(dt_cfg_enum(&h.host, "mode", "a|b|c", &mode), DT_OK);
    assert_int_equal(mode, 1);
}

static void test_cfg_key_without_value(void **state)
{
    (void)state;
    dt_test_host_declare(&cfgtest_info);
    dt_test_host_t h;
    dt_test_host_init(&h, "strategy/cfgtest", NULL);
    int64_t v = 7;
    /* a required key the host holds no value for, a key not declared */
    assert_int_equal(dt_cfg_int(&h.host, "req", &v), DT_ERR_CONFIG);
    assert_string_equal(dt_last_error(), "strategy/cfgtest: config key req: no value (not "
                                         "declared by the plugin, or the host applied no "
                                         "defaults)");
    assert_int_equal(v, 7);
    int b = 0;
    assert_int_equal(dt_cfg_bool(&h.host, "nope", &b), DT_ERR_CONFIG);
    assert_string_equal(dt_last_error(), "strategy/cfgtest: config key nope: no value (not "
                                         "declared by the plugin, or the host applied no "
                                         "defaults)");
    /* a host that applied no defaults (no plugin of that name declared) */
    dt_test_host_init(&h, "strategy/undeclared", NULL);
    const char *sv = NULL;
    assert_int_equal(dt_cfg_string(&h.host, "path", &sv), DT_ERR_CONFIG);
    assert_string_equal(dt_last_error(), "strategy/undeclared: config key path: no value (not "
                                         "declared by the plugin, or the host applied no "
                                         "defaults)");
    /* any other failure names the key and the status */
    dt_test_host_init(&h, "strategy/cfgtest", NULL);
    h.host.cfg_int = cfg_int_fails;
    assert_int_equal(dt_cfg_int(&h.host, "n", &v), DT_ERR_CONFIG);
    char want[160];
    snprintf(want, sizeof want, "strategy/cfgtest: config key n: cannot read (%s)",
             dt_status_name(DT_ERR_INVALID));
    assert_string_equal(dt_last_error(), want);
    /* a value outside the choices the plugin converts (a host that did not
     * check them) */
    const dt_test_kv_t bad[] = {{"mode", "d"}, {NULL, NULL}};
    dt_test_host_init(&h, "strategy/cfgtest", bad);
    int mode = -1;
    assert_int_equal(dt_cfg_enum(&h.host, "mode", "a|b|c", &mode), DT_ERR_CONFIG);
    assert_string_equal(dt_last_error(),
                        "strategy/cfgtest: mode = \"d\" is not one of the valid choices: a, b, c");
    assert_int_equal(mode, -1);
    /* the core's check of the same value against the declared keys */
    assert_int_equal(dt_test_schema_check(&cfgtest_info, bad), DT_ERR_CONFIG);
    assert_non_null(strstr(dt_last_error(), "[cfgtest] mode = \"d\" is not one of"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_range_split_partitions, setup),
        cmocka_unit_test_setup(test_cfg_reads_declared_defaults, setup),
        cmocka_unit_test_setup(test_cfg_key_without_value, setup),
        cmocka_unit_test_setup(test_shards_and_intersect, setup),
        cmocka_unit_test_setup(test_pieces_of_a_range, setup),
        cmocka_unit_test_setup(test_unit_validate, setup),
        cmocka_unit_test_setup(test_flat_layout, setup),
        cmocka_unit_test_setup(test_bucket_plan, setup),
        cmocka_unit_test_setup(test_clip_scale, setup),
        cmocka_unit_test_setup(test_optim_range_adamw, setup),
        cmocka_unit_test_setup(test_optim_range_sgd_whole_unit, setup),
        cmocka_unit_test_setup(test_optim_range_kernel_missing, setup),
        cmocka_unit_test_setup(test_norms, setup),
        cmocka_unit_test_setup(test_norm_plan, setup),
        cmocka_unit_test_setup(test_hash, setup),
        cmocka_unit_test_setup(test_replica_check, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
