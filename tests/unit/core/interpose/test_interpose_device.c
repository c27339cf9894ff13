/*
 * tests/unit/core/interpose/test_interpose_device.c - the device interposer
 * (core/interpose/interpose_device.c) over the real cpu plugin: every
 * runtime slot and every kernel passes its arguments and results through
 * unchanged (the hooks see what the caller passed, the plugin's handles
 * come back as they are, and a kernel sweep gives the same bits through
 * the wrapper as straight into the plugin); a slot absent from a smaller
 * table is absent from the wrapper, a newer table is clamped; a failure
 * injected by `before` is returned without calling the plugin (an inner
 * interposer counts what reaches it); `sync` waits for the stream around
 * each kernel; the FLOP and byte counts of matmul and attention match
 * their formulas (the attention FLOPs counted by a loop over the causal
 * half); the profiler's pass window, FLOP rates and errors; what cannot
 * be wrapped.
 *
 * The comm interposer's cases are in test_interpose.c.
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
#include "interpose/interpose.h"
#include "ref_kernels.h"
#include "test_assert.h"
#include "test_host.h"
#include "test_plugin.h"

static const dt_device_ops_t *CPU; /* the plugin's own table */
static const dt_test_kv_t kv_t1[] = {{"threads", "1"}, {NULL, NULL}};
static dt_test_host_t th;

/* ---- recording hooks ------------------------------------------------------ */

typedef struct rec {
    int n_before, n_after;
    dt_interpose_device_call_t before, after; /* the last calls, copied */
    int status;
    uint64_t elapsed_ns;
    int inject;          /* status before returns for inject_slot */
    int inject_slot;
    int seen[DT_IDEV_SLOT_COUNT]; /* `after` calls per slot */
    int order[64];       /* slots in the order `after` saw them */
    dt_stream_t *streams[64];
    int n_order;
} rec_t;

static int r_before(void *ctx, const dt_interpose_call_t *call)
{
    rec_t *r = ctx;
    r->n_before++;
    r->before = *(const dt_interpose_device_call_t *)call;
    if (r->inject != DT_OK && (int)call->slot == r->inject_slot) {
        const dt_interpose_device_call_t *k = (const dt_interpose_device_call_t *)call;
        return k->host ? k->host->set_error(k->host, r->inject, "%s: injected", call->name)
                       : dt_err_set(r->inject, "%s: injected", call->name);
    }
    return DT_OK;
}

static void r_after(void *ctx, const dt_interpose_call_t *call, int status, uint64_t elapsed_ns)
{
    rec_t *r = ctx;
    const dt_interpose_device_call_t *k = (const dt_interpose_device_call_t *)call;
    r->n_after++;
    r->after = *k;
    r->status = status;
    r->elapsed_ns = elapsed_ns;
    r->seen[call->slot]++;
    if (r->n_order < 64) {
        r->streams[r->n_order] = k->stream;
        r->order[r->n_order++] = (int)call->slot;
    }
}

static dt_interpose_hooks_t rec_hooks(rec_t *r)
{
    return (dt_interpose_hooks_t){.ctx = r, .before = r_before, .after = r_after};
}

/* Both hooks saw exactly one call of `slot` named `name` on a cpu table,
 * and `after` got status `st`; the counts start over. */
static void saw(rec_t *r, int slot, const char *name, int st)
{
    assert_int_equal(r->n_before, 1);
    assert_int_equal(r->n_after, 1);
    for (int i = 0; i < 2; i++) {
        const dt_interpose_device_call_t *k = i ? &r->after : &r->before;
        assert_int_equal(k->base.kind, DT_KIND_DEVICE);
        assert_int_equal(k->base.slot, slot);
        assert_string_equal(k->base.name, name);
        assert_string_equal(k->base.op, name);
        assert_ptr_equal(k->ops, CPU);
        assert_ptr_equal(k->kernels, CPU->kernels());
    }
    assert_int_equal(r->status, st);
    r->n_before = r->n_after = 0;
    r->n_order = 0;
}

/* An instance through `ops`, world rank 2. */
static dt_device_t *open_dev(const dt_device_ops_t *ops)
{
    dt_test_host_init(&th, "device/cpu", kv_t1);
    const dt_device_init_t a = {.struct_size = sizeof a, .rank = 2, .local_size = 1,
                                .device_index = -1};
    dt_device_t *d = NULL;
    assert_ok(ops->init(&th.host, &a, &d));
    assert_non_null(d);
    return d;
}

static float *frand(dt_ref_rng_t *g, int64_t n, double lo, double hi)
{
    float *p = malloc((size_t)n * sizeof *p);
    dt_ref_fill_uniform(g, p, n, lo, hi);
    return p;
}

/* ---- every runtime slot ------------------------------------------------- */

static void test_runtime_slots_pass_through(void **state)
{
    (void)state;
    rec_t R = {0};
    dt_interpose_hooks_t hk = rec_hooks(&R);
    dt_interpose_device_t *id = NULL;
    assert_ok(dt_interpose_device_create(CPU, &hk, 0, &id));
    const dt_device_ops_t *W = dt_interpose_device_ops(id);
    assert_ptr_not_equal(W, CPU);
    assert_string_equal(W->info.name, "cpu");
    assert_int_equal(W->info.struct_size, CPU->info.struct_size);
    assert_int_equal(W->info.kind, DT_KIND_DEVICE);

    /* init: the caller gets the interposer's instance, the hooks the
     * plugin's and the rank */
    dt_device_t *d = open_dev(W);
    saw(&R, DT_IDEV_INIT, "init", DT_OK);
    assert_null(R.before.dev);
    dt_device_t *inner = R.after.dev;
    assert_non_null(inner);
    assert_ptr_not_equal(inner, d);
    assert_ptr_equal(R.after.host, &th.host);
    assert_int_equal(R.before.base.rank, 2);
    assert_int_equal(R.after.base.seq, 1);

    dt_device_props_t p1 = {.struct_size = sizeof p1}, p2 = {.struct_size = sizeof p2};
    assert_ok(W->props(d, &p1));
    assert_ok(CPU->props(inner, &p2));
    assert_memory_equal(&p1, &p2, sizeof p1);
    saw(&R, DT_IDEV_PROPS, "props", DT_OK);
    assert_ptr_equal(R.after.dev, inner);
    assert_int_equal(R.after.base.rank, 2);

    /* kernels(): the interposer's table, the same every time, sized as
     * the plugin's; no instance */
    const dt_kernels_t *K = W->kernels();
    assert_ptr_not_equal(K, CPU->kernels());
    assert_int_equal(K->info.struct_size, CPU->kernels()->info.struct_size);
    assert_int_equal(K->info.abi_major, DT_KERNELS_ABI_MAJOR);
    saw(&R, DT_IDEV_KERNELS, "kernels", DT_OK);
    assert_null(R.after.dev);
    assert_int_equal(R.after.base.rank, -1);
    assert_ptr_equal(W->kernels(), K);
    R.n_before = R.n_after = 0;

    /* memory: the plugin's pointer, accounted by the plugin */
    void *p = NULL;
    assert_ok(W->alloc(d, 1000, DT_TAG_ACTIVATIONS, &p));
    assert_non_null(p);
    saw(&R, DT_IDEV_ALLOC, "alloc", DT_OK);
    assert_int_equal(R.before.size, 1000);
    assert_int_equal(R.before.tag, DT_TAG_ACTIVATIONS);
    assert_null(R.before.ptr);
    assert_ptr_equal(R.after.ptr, p);
    dt_mem_stats_t m1 = {.struct_size = sizeof m1}, m2 = {.struct_size = sizeof m2};
    assert_ok(W->mem_stats(d, &m1));
    saw(&R, DT_IDEV_MEM_STATS, "mem_stats", DT_OK);
    assert_ok(CPU->mem_stats(inner, &m2));
    assert_memory_equal(&m1, &m2, sizeof m1);
    assert_true(m1.current[DT_TAG_ACTIVATIONS] >= 1000);
    assert_ok(W->mem_reset_peaks(d));
    saw(&R, DT_IDEV_MEM_RESET_PEAKS, "mem_reset_peaks", DT_OK);

    void *h = NULL;
    assert_ok(W->host_alloc(d, 256, DT_TAG_STAGING, &h));
    saw(&R, DT_IDEV_HOST_ALLOC, "host_alloc", DT_OK);
    assert_int_equal(R.before.size, 256);
    assert_int_equal(R.before.tag, DT_TAG_STAGING);
    assert_ptr_equal(R.after.ptr, h);
    assert_ok(CPU->mem_stats(inner, &m2));
    assert_true(m2.pinned_current[DT_TAG_STAGING] >= 256);

    /* streams and events are the plugin's: they work on its instance */
    dt_stream_t *s = NULL;
    assert_ok(W->stream_create(d, &s));
    saw(&R, DT_IDEV_STREAM_CREATE, "stream_create", DT_OK);
    assert_ptr_equal(R.after.stream, s);
    assert_ok(CPU->stream_sync(inner, s));
    dt_event_t *e = NULL;
    assert_ok(W->event_create(d, &e));
    saw(&R, DT_IDEV_EVENT_CREATE, "event_create", DT_OK);
    assert_ptr_equal(R.after.event, e);
    assert_ok(W->event_record(d, e, s));
    saw(&R, DT_IDEV_EVENT_RECORD, "event_record", DT_OK);
    assert_ptr_equal(R.before.event, e);
    assert_ptr_equal(R.before.stream, s);
    assert_ok(W->stream_wait_event(d, NULL, e));
    saw(&R, DT_IDEV_STREAM_WAIT_EVENT, "stream_wait_event", DT_OK);
    assert_null(R.before.stream);
    assert_ptr_equal(R.before.event, e);
    assert_ok(W->event_sync(d, e));
    saw(&R, DT_IDEV_EVENT_SYNC, "event_sync", DT_OK);
    assert_int_equal(R.after.base.flags, DT_ICALL_WAIT);

    /* copies: the data arrives; the hooks see sizes and kinds */
    unsigned char src[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    assert_ok(W->memcpy_async(d, p, src, sizeof src, DT_COPY_H2D, s));
    saw(&R, DT_IDEV_MEMCPY_ASYNC, "memcpy_async", DT_OK);
    assert_ptr_equal(R.before.ptr, p);
    assert_int_equal(R.before.size, 1000);
    assert_int_equal(R.before.base.bytes, 1000);
    assert_int_equal(R.before.copy_kind, DT_COPY_H2D);
    assert_ptr_equal(R.before.stream, s);
    assert_int_equal(R.before.base.flags, DT_ICALL_ENQUEUE);
    assert_ok(W->memset_async(d, p, 0x5a, 100, s));
    saw(&R, DT_IDEV_MEMSET_ASYNC, "memset_async", DT_OK);
    assert_int_equal(R.before.size, 100);
    assert_ok(W->stream_sync(d, s));
    saw(&R, DT_IDEV_STREAM_SYNC, "stream_sync", DT_OK);
    assert_ptr_equal(R.before.stream, s);
    assert_ok(W->memcpy_async(d, back, p, sizeof back, DT_COPY_D2H, NULL));
    R.n_before = R.n_after = 0;
    assert_ok(W->synchronize(d));
    saw(&R, DT_IDEV_SYNCHRONIZE, "synchronize", DT_OK);
    for (int i = 0; i < 1000; i++)
        assert_int_equal(back[i], i < 100 ? 0x5a : src[i]);

    /* a failing call: the plugin's status and message, as without us */
    assert_status(W->free(d, back), DT_ERR_INVALID);
    saw(&R, DT_IDEV_FREE, "free", DT_ERR_INVALID);
    char *msg = strdup(dt_last_error());
    assert_status(CPU->free(inner, back), DT_ERR_INVALID);
    assert_msg(msg);
    free(msg);

    assert_ok(W->free(d, p));
    saw(&R, DT_IDEV_FREE, "free", DT_OK);
    assert_ptr_equal(R.before.ptr, p);
    assert_ok(W->host_free(d, h));
    saw(&R, DT_IDEV_HOST_FREE, "host_free", DT_OK);
    assert_ptr_equal(R.before.ptr, h);
    assert_ok(W->event_destroy(d, e));
    saw(&R, DT_IDEV_EVENT_DESTROY, "event_destroy", DT_OK);
    assert_ok(W->stream_destroy(d, s));
    saw(&R, DT_IDEV_STREAM_DESTROY, "stream_destroy", DT_OK);
    assert_ptr_equal(R.before.stream, s);

    /* the cpu has no native_stream: neither has the wrapper */
    assert_false(DT_HAS_OP(dt_device_ops_t, CPU, native_stream));
    assert_false(DT_HAS_OP(dt_device_ops_t, W, native_stream));

    W->finalize(d);
    saw(&R, DT_IDEV_FINALIZE, "finalize", DT_OK);
    assert_ptr_equal(R.before.dev, inner);
    W->finalize(NULL); /* a no-op, as the plugin's */
    assert_int_equal(R.n_after, 0);

    /* every runtime slot the plugin has went through the hooks */
    for (int sl = 0; sl < DT_IDEV_RUNTIME_COUNT; sl++)
        if (sl != DT_IDEV_NATIVE_STREAM && R.seen[sl] == 0)
            fail_msg("runtime slot %d never reached the hooks", sl);
    dt_interpose_device_destroy(id);
}

/* ---- every kernel: the same bits through the wrapper -------------------- */

/* Two copies of an output (or accumulated) buffer with the same random
 * start: `w` gets the wrapper's result, `c` the plugin's. */
typedef struct pair {
    float *w, *c;
    size_t bytes;
} pair_t;

static pair_t pair_rand(dt_ref_rng_t *g, int64_t n)
{
    pair_t p = {.bytes = (size_t)n * sizeof(float)};
    p.w = frand(g, n, -1, 1);
    p.c = malloc(p.bytes);
    memcpy(p.c, p.w, p.bytes);
    return p;
}

static void pair_same(pair_t *p, const char *what)
{
    if (memcmp(p->w, p->c, p->bytes) != 0)
        fail_msg("%s: the wrapper's result differs from the plugin's", what);
    free(p->w);
    free(p->c);
}

#define BOTH(call_w, call_c)                                                   \
    do {                                                                       \
        assert_ok(call_w);                                                     \
        assert_ok(call_c);                                                     \
    } while (0)

static void test_kernels_match_the_plugin(void **state)
{
    (void)state;
    rec_t R = {0};
    dt_interpose_hooks_t hk = rec_hooks(&R);
    dt_interpose_device_t *id = NULL;
    assert_ok(dt_interpose_device_create(CPU, &hk, 0, &id));
    const dt_device_ops_t *W = dt_interpose_device_ops(id);
    dt_device_t *d = open_dev(W);
    dt_device_t *in = R.after.dev;
    const dt_kernels_t *KW = W->kernels(), *KC = CPU->kernels();
    dt_ref_rng_t g;
    dt_ref_rng_seed(&g, 20261130);
    const int F = DT_F32;

    /* matmul (N, C) x (OC, C)^T */
    const int64_t N = 6, C = 8, OC = 5;
    float *inp = frand(&g, N * C, -1, 1), *wt = frand(&g, OC * C, -1, 1);
    float *bias = frand(&g, OC, -1, 1), *dout = frand(&g, N * OC, -1, 1);
    pair_t o = pair_rand(&g, N * OC);
    BOTH(KW->matmul_forward(d, NULL, o.w, inp, wt, bias, F, F, N, C, OC),
         KC->matmul_forward(in, NULL, o.c, inp, wt, bias, F, F, N, C, OC));
    assert_int_equal(R.after.n_dims, 3);
    assert_int_equal(R.after.dims[0], N);
    assert_int_equal(R.after.dims[1], C);
    assert_int_equal(R.after.dims[2], OC);
    assert_int_equal(R.after.dtype, F);
    assert_int_equal(R.after.dtype2, F);
    assert_ptr_equal(R.after.dev, in);
    assert_int_equal(R.after.base.flags, DT_ICALL_KERNEL | DT_ICALL_ENQUEUE);
    pair_same(&o, "matmul_forward");
    pair_t di = pair_rand(&g, N * C), dw = pair_rand(&g, OC * C), db = pair_rand(&g, OC);
    BOTH(KW->matmul_backward(d, NULL, di.w, dw.w, db.w, dout, inp, wt, F, F, N, C, OC),
         KC->matmul_backward(in, NULL, di.c, dw.c, db.c, dout, inp, wt, F, F, N, C, OC));
    pair_same(&di, "matmul_backward dinp");
    pair_same(&dw, "matmul_backward dweight");
    pair_same(&db, "matmul_backward dbias");

    /* a refusal: the same status and message */
    assert_status(KW->matmul_forward(d, NULL, inp, inp, wt, NULL, DT_F16, F, N, C, OC),
                  DT_ERR_UNSUPPORTED);
    char *msg = strdup(dt_last_error());
    assert_int_equal(R.status, DT_ERR_UNSUPPORTED);
    assert_status(KC->matmul_forward(in, NULL, inp, inp, wt, NULL, DT_F16, F, N, C, OC),
                  DT_ERR_UNSUPPORTED);
    assert_msg(msg);
    free(msg);

    /* embedding (B, T, C) from a vocabulary of V */
    const int64_t B = 2, T = 5, V = 11, NH = 2;
    int32_t tok[2 * 5], tgt[6];
    dt_ref_fill_int(&g, tok, B * T, (int32_t)V);
    dt_ref_fill_int(&g, tgt, N, (int32_t)V);
    float *wte = frand(&g, V * C, -1, 1), *wpe = frand(&g, T * C, -1, 1);
    float *dbtc = frand(&g, B * T * C, -1, 1);
    pair_t e = pair_rand(&g, B * T * C);
    BOTH(KW->embedding_forward(d, NULL, e.w, tok, wte, wpe, F, B, T, C),
         KC->embedding_forward(in, NULL, e.c, tok, wte, wpe, F, B, T, C));
    pair_same(&e, "embedding_forward");
    pair_t dwte = pair_rand(&g, V * C), dwpe = pair_rand(&g, T * C);
    BOTH(KW->embedding_backward(d, NULL, dwte.w, dwpe.w, dbtc, tok, F, B, T, C),
         KC->embedding_backward(in, NULL, dwte.c, dwpe.c, dbtc, tok, F, B, T, C));
    pair_same(&dwte, "embedding_backward dwte");
    pair_same(&dwpe, "embedding_backward dwpe");
    /* the vocabulary-parallel forms over rows [3, 3 + 5) of the table */
    pair_t ev = pair_rand(&g, B * T * C);
    BOTH(KW->vocab_embedding_forward(d, NULL, ev.w, tok, wte, NULL, F, B, T, C, 3, 5),
         KC->vocab_embedding_forward(in, NULL, ev.c, tok, wte, NULL, F, B, T, C, 3, 5));
    pair_same(&ev, "vocab_embedding_forward");
    pair_t dwtev = pair_rand(&g, 5 * C), dwpev = pair_rand(&g, T * C);
    BOTH(KW->vocab_embedding_backward(d, NULL, dwtev.w, dwpev.w, dbtc, tok, F, B, T, C, 3, 5),
         KC->vocab_embedding_backward(in, NULL, dwtev.c, dwpev.c, dbtc, tok, F, B, T, C, 3, 5));
    pair_same(&dwtev, "vocab_embedding_backward dwte");
    pair_same(&dwpev, "vocab_embedding_backward dwpe");

    /* elementwise on n */
    const int64_t n = 37;
    float *xa = frand(&g, n, -3, 3), *xb = frand(&g, n, -3, 3);
    pair_t y = pair_rand(&g, n);
    BOTH(KW->gelu_forward(d, NULL, y.w, xa, F, n), KC->gelu_forward(in, NULL, y.c, xa, F, n));
    pair_same(&y, "gelu_forward");
    y = pair_rand(&g, n);
    BOTH(KW->gelu_backward(d, NULL, y.w, xa, xb, F, n),
         KC->gelu_backward(in, NULL, y.c, xa, xb, F, n));
    pair_same(&y, "gelu_backward");
    y = pair_rand(&g, n);
    BOTH(KW->axpy(d, NULL, y.w, xa, F, 0.7f, n), KC->axpy(in, NULL, y.c, xa, F, 0.7f, n));
    pair_same(&y, "axpy");
    double sw = -1, sc = -2;
    BOTH(KW->sumsq(d, NULL, &sw, xa, F, n), KC->sumsq(in, NULL, &sc, xa, F, n));
    assert_memory_equal(&sw, &sc, sizeof sw);
    uint16_t bw[37], bc[37];
    BOTH(KW->cast(d, NULL, bw, DT_BF16, xa, F, n), KC->cast(in, NULL, bc, DT_BF16, xa, F, n));
    assert_memory_equal(bw, bc, sizeof bw);
    assert_int_equal(R.after.dtype, DT_BF16);
    assert_int_equal(R.after.dtype2, F);
    y = pair_rand(&g, n);
    BOTH(KW->residual_forward(d, NULL, y.w, xa, xb, F, n),
         KC->residual_forward(in, NULL, y.c, xa, xb, F, n));
    pair_same(&y, "residual_forward");
    y = pair_rand(&g, n);
    BOTH(KW->scale(d, NULL, y.w, F, -1.5f, n), KC->scale(in, NULL, y.c, F, -1.5f, n));
    pair_same(&y, "scale");

    /* softmax cross-entropy over (N, V) */
    float *logits = frand(&g, N * V, -2, 2);
    pair_t loss = pair_rand(&g, N), probs = pair_rand(&g, N * V);
    BOTH(KW->softmax_xent_forward(d, NULL, loss.w, probs.w, logits, tgt, F, N, V),
         KC->softmax_xent_forward(in, NULL, loss.c, probs.c, logits, tgt, F, N, V));
    pair_t dl = pair_rand(&g, N * V);
    BOTH(KW->softmax_xent_backward(d, NULL, dl.w, probs.w, tgt, F, 0.5f, N, V),
         KC->softmax_xent_backward(in, NULL, dl.c, probs.w, tgt, F, 0.5f, N, V));
    pair_same(&loss, "softmax_xent_forward losses");
    pair_same(&probs, "softmax_xent_forward probs");
    pair_same(&dl, "softmax_xent_backward");
    /* the vocabulary-parallel cross-entropy's three phases over columns
     * [2, 2 + V - 2) seen as a rank's part (no reduction between them) */
    pair_t st = pair_rand(&g, 3 * N), lv = pair_rand(&g, N), pv = pair_rand(&g, N * (V - 2));
    for (int ph = 0; ph < 3; ph++)
        BOTH(KW->vocab_xent_forward(d, NULL, ph, st.w, lv.w, pv.w, logits, tgt, F, N, 2, V - 2),
             KC->vocab_xent_forward(in, NULL, ph, st.c, lv.c, pv.c, logits, tgt, F, N, 2, V - 2));
    pair_same(&st, "vocab_xent_forward stats");
    pair_same(&lv, "vocab_xent_forward losses");
    pair_t dlv = pair_rand(&g, N * (V - 2));
    BOTH(KW->vocab_xent_backward(d, NULL, dlv.w, pv.w, tgt, F, 0.5f, N, 2, V - 2),
         KC->vocab_xent_backward(in, NULL, dlv.c, pv.w, tgt, F, 0.5f, N, 2, V - 2));
    pair_same(&pv, "vocab_xent_forward probs");
    pair_same(&dlv, "vocab_xent_backward");

    /* layernorm over (N, C) */
    float *lw = frand(&g, C, 0.5, 1.5), *lb = frand(&g, C, -1, 1);
    pair_t ln = pair_rand(&g, N * C), mean = pair_rand(&g, N), rstd = pair_rand(&g, N);
    BOTH(KW->layernorm_forward(d, NULL, ln.w, mean.w, rstd.w, inp, lw, lb, F, N, C),
         KC->layernorm_forward(in, NULL, ln.c, mean.c, rstd.c, inp, lw, lb, F, N, C));
    float *dln = frand(&g, N * C, -1, 1);
    pair_t ldi = pair_rand(&g, N * C), ldw = pair_rand(&g, C), ldb = pair_rand(&g, C);
    BOTH(KW->layernorm_backward(d, NULL, ldi.w, ldw.w, ldb.w, dln, inp, lw, mean.w, rstd.w, F,
                                N, C),
         KC->layernorm_backward(in, NULL, ldi.c, ldw.c, ldb.c, dln, inp, lw, mean.w, rstd.w, F,
                                N, C));
    pair_same(&ln, "layernorm_forward");
    pair_same(&mean, "layernorm_forward mean");
    pair_same(&rstd, "layernorm_forward rstd");
    pair_same(&ldi, "layernorm_backward dinp");
    pair_same(&ldw, "layernorm_backward dweight");
    pair_same(&ldb, "layernorm_backward dbias");

    /* attention (B, T, C) in NH heads: its state size, forward, backward */
    uint64_t stw = 0, stc = 1;
    BOTH(KW->attention_state_bytes(B, T, C, NH, F, &stw),
         KC->attention_state_bytes(B, T, C, NH, F, &stc));
    assert_int_equal(stw, stc);
    assert_int_equal(R.after.n_dims, 4);
    assert_int_equal(R.after.dims[3], NH);
    assert_int_equal(R.after.base.flags, DT_ICALL_KERNEL);
    assert_int_equal(KW->attention_state_bytes(B, T, 7, NH, F, &stw),
                     KC->attention_state_bytes(B, T, 7, NH, F, &stc));
    assert_int_equal(R.status, DT_ERR_INVALID);
    float *qkv = frand(&g, B * T * 3 * C, -1, 1);
    pair_t ao = pair_rand(&g, B * T * C), ast = pair_rand(&g, (int64_t)stc / 4);
    BOTH(KW->attention_forward(d, NULL, ao.w, ast.w, qkv, F, B, T, C, NH),
         KC->attention_forward(in, NULL, ao.c, ast.c, qkv, F, B, T, C, NH));
    pair_t dqkv = pair_rand(&g, B * T * 3 * C);
    BOTH(KW->attention_backward(d, NULL, dqkv.w, dbtc, qkv, ao.w, ast.w, F, B, T, C, NH),
         KC->attention_backward(in, NULL, dqkv.c, dbtc, qkv, ao.w, ast.w, F, B, T, C, NH));
    pair_same(&ao, "attention_forward");
    pair_same(&ast, "attention_forward state");
    pair_same(&dqkv, "attention_backward");

    /* optimizers over n, step 3 */
    float *grad = frand(&g, n, -1, 1);
    pair_t pw = pair_rand(&g, n), mw = pair_rand(&g, n), vw = pair_rand(&g, n);
    for (int64_t i = 0; i < n; i++)
        vw.w[i] = vw.c[i] = vw.w[i] * vw.w[i]; /* second moments are >= 0 */
    BOTH(KW->adamw_update(d, NULL, pw.w, grad, mw.w, vw.w, F, n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                          0.1f, 0.5f, 3),
         KC->adamw_update(in, NULL, pw.c, grad, mw.c, vw.c, F, n, 1e-2f, 0.9f, 0.95f, 1e-8f,
                          0.1f, 0.5f, 3));
    assert_int_equal(R.after.dtype, F);
    pair_same(&pw, "adamw_update param");
    pair_same(&mw, "adamw_update m");
    pair_same(&vw, "adamw_update v");
    pair_t ps = pair_rand(&g, n), mom = pair_rand(&g, n);
    BOTH(KW->sgd_update(d, NULL, ps.w, grad, mom.w, F, n, 0.1f, 0.9f, 0.01f, 1, 2.0f),
         KC->sgd_update(in, NULL, ps.c, grad, mom.c, F, n, 0.1f, 0.9f, 0.01f, 1, 2.0f));
    pair_same(&ps, "sgd_update param");
    pair_same(&mom, "sgd_update mom");

    /* the LLaMA family's kernels: RMSNorm over (N, C), RoPE on
     * the q part of qkv (NH heads of C/NH), SwiGLU on inp as (N, 2 (C/2)),
     * grouped-query attention with one kv head over qkv's first
     * (NH + 2) C/NH columns of each row */
    pair_t ro = pair_rand(&g, N * C), rr = pair_rand(&g, N);
    BOTH(KW->rmsnorm_forward(d, NULL, ro.w, rr.w, inp, lw, F, N, C, 1e-6f),
         KC->rmsnorm_forward(in, NULL, ro.c, rr.c, inp, lw, F, N, C, 1e-6f));
    assert_int_equal(R.after.n_dims, 2);
    pair_t rdi = pair_rand(&g, N * C), rdw = pair_rand(&g, C);
    BOTH(KW->rmsnorm_backward(d, NULL, rdi.w, rdw.w, dln, inp, lw, rr.w, F, N, C),
         KC->rmsnorm_backward(in, NULL, rdi.c, rdw.c, dln, inp, lw, rr.w, F, N, C));
    pair_same(&ro, "rmsnorm_forward");
    pair_same(&rr, "rmsnorm_forward rstd");
    pair_same(&rdi, "rmsnorm_backward dinp");
    pair_same(&rdw, "rmsnorm_backward dweight");
    const int64_t HD = C / NH;
    float *rcos = frand(&g, T * HD / 2, -1, 1), *rsin = frand(&g, T * HD / 2, -1, 1);
    pair_t rp = pair_rand(&g, B * T * 3 * C), rpd = pair_rand(&g, B * T * 3 * C);
    BOTH(KW->rope_forward(d, NULL, rp.w, qkv, rcos, rsin, F, B, T, NH, HD, 3 * C),
         KC->rope_forward(in, NULL, rp.c, qkv, rcos, rsin, F, B, T, NH, HD, 3 * C));
    assert_int_equal(R.after.n_dims, 4);
    assert_int_equal(R.after.dims[3], HD);
    BOTH(KW->rope_backward(d, NULL, rpd.w, qkv, rcos, rsin, F, B, T, NH, HD, 3 * C),
         KC->rope_backward(in, NULL, rpd.c, qkv, rcos, rsin, F, B, T, NH, HD, 3 * C));
    pair_same(&rp, "rope_forward");
    pair_same(&rpd, "rope_backward");
    pair_t so = pair_rand(&g, N * C / 2), sd = pair_rand(&g, N * C);
    BOTH(KW->swiglu_forward(d, NULL, so.w, inp, F, N, C / 2),
         KC->swiglu_forward(in, NULL, so.c, inp, F, N, C / 2));
    BOTH(KW->swiglu_backward(d, NULL, sd.w, inp, dout, F, N, C / 2),
         KC->swiglu_backward(in, NULL, sd.c, inp, dout, F, N, C / 2));
    pair_same(&so, "swiglu_forward");
    pair_same(&sd, "swiglu_backward");
    pair_t go = pair_rand(&g, B * T * C), gst = pair_rand(&g, (int64_t)stc / 4);
    BOTH(KW->gqa_attention_forward(d, NULL, go.w, gst.w, qkv, F, B, T, NH, 1, HD),
         KC->gqa_attention_forward(in, NULL, go.c, gst.c, qkv, F, B, T, NH, 1, HD));
    assert_int_equal(R.after.dims[3], 1);
    pair_t gdq = pair_rand(&g, B * T * (NH + 2) * HD);
    BOTH(KW->gqa_attention_backward(d, NULL, gdq.w, dbtc, qkv, go.w, gst.w, F, B, T, NH, 1, HD),
         KC->gqa_attention_backward(in, NULL, gdq.c, dbtc, qkv, go.w, gst.w, F, B, T, NH, 1,
                                    HD));
    pair_same(&go, "gqa_attention_forward");
    pair_same(&gst, "gqa_attention_forward state");
    pair_same(&gdq, "gqa_attention_backward");
    free(rcos), free(rsin);

    /* every kernel went through the hooks */
    for (int sl = DT_IKERN_FIRST; sl < DT_IDEV_SLOT_COUNT; sl++)
        if (R.seen[sl] == 0)
            fail_msg("kernel slot %d never reached the hooks", sl);
    void *bufs[] = {inp, wt, bias, dout, wte, wpe, dbtc, xa, xb, logits, lw, lb, dln, qkv, grad};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    W->finalize(d);
    dt_interpose_device_destroy(id);
}

/* ---- smaller and larger tables ------------------------------------------- */

static dt_kernels_t small_k;
static const dt_kernels_t *small_kernels(void) { return &small_k; }
static struct {
    dt_kernels_t k;
    void (*later)(void);
} big_k;
static const dt_kernels_t *big_kernels(void) { return &big_k.k; }

static void test_older_and_newer_tables(void **state)
{
    (void)state;
    /* an older plugin: a runtime ending before memset_async, a kernel
     * table ending before residual_forward and without layernorm_forward */
    dt_device_ops_t old = *CPU;
    old.info.struct_size = (uint32_t)offsetof(dt_device_ops_t, memset_async);
    old.kernels = small_kernels;
    small_k = *CPU->kernels();
    small_k.info.struct_size = (uint32_t)offsetof(dt_kernels_t, residual_forward);
    small_k.layernorm_forward = NULL;
    dt_interpose_device_t *id = NULL;
    assert_ok(dt_interpose_device_create(&old, NULL, 0, &id));
    const dt_device_ops_t *W = dt_interpose_device_ops(id);
    assert_int_equal(W->info.struct_size, offsetof(dt_device_ops_t, memset_async));
    assert_false(DT_HAS_OP(dt_device_ops_t, W, memset_async));
    assert_false(DT_HAS_OP(dt_device_ops_t, W, native_stream));
    assert_true(DT_HAS_OP(dt_device_ops_t, W, memcpy_async));
    assert_true(DT_HAS_OP(dt_device_ops_t, W, host_free));
    const dt_kernels_t *K = W->kernels();
    assert_int_equal(K->info.struct_size, offsetof(dt_kernels_t, residual_forward));
    assert_false(DT_HAS_OP(dt_kernels_t, K, residual_forward));
    assert_false(DT_HAS_OP(dt_kernels_t, K, sgd_update));
    assert_false(DT_HAS_OP(dt_kernels_t, K, layernorm_forward));
    assert_true(DT_HAS_OP(dt_kernels_t, K, layernorm_backward));
    assert_true(DT_HAS_OP(dt_kernels_t, K, attention_backward));
    assert_true(DT_HAS_OP(dt_kernels_t, K, attention_state_bytes));
    /* and it works */
    dt_device_t *d = open_dev(W);
    float x[3] = {1, 2, 3}, yv[3] = {1, 1, 1};
    assert_ok(K->axpy(d, NULL, yv, x, DT_F32, 2.0f, 3));
    assert_true(yv[0] == 3.0f && yv[1] == 5.0f && yv[2] == 7.0f);
    W->finalize(d);
    dt_interpose_device_destroy(id);

    /* a newer plugin's larger tables: this build's slots only */
    struct {
        dt_device_ops_t ops;
        void (*later)(void);
    } newer = {*CPU, NULL};
    newer.ops.info.struct_size = (uint32_t)sizeof newer;
    newer.ops.info.abi_minor = DT_DEVICE_ABI_MINOR + 1;
    newer.ops.kernels = big_kernels;
    big_k.k = *CPU->kernels();
    big_k.k.info.struct_size = (uint32_t)sizeof big_k;
    big_k.k.info.abi_minor = DT_KERNELS_ABI_MINOR + 1;
    assert_ok(dt_interpose_device_create(&newer.ops, NULL, 0, &id));
    W = dt_interpose_device_ops(id);
    assert_int_equal(W->info.struct_size, sizeof(dt_device_ops_t));
    assert_int_equal(W->info.abi_minor, DT_DEVICE_ABI_MINOR);
    K = W->kernels();
    assert_int_equal(K->info.struct_size, sizeof(dt_kernels_t));
    assert_int_equal(K->info.abi_minor, DT_KERNELS_ABI_MINOR);
    assert_true(DT_HAS_OP(dt_kernels_t, K, sgd_update));
    assert_true(DT_HAS_OP(dt_device_ops_t, W, memset_async));
    dt_interpose_device_destroy(id);
}

/* ---- injected failures (an inner interposer counts what reaches it) ---- */

static void test_injected_failure(void **state)
{
    (void)state;
    rec_t IN = {0}, R = {0};
    dt_interpose_hooks_t hin = rec_hooks(&IN), hout = rec_hooks(&R);
    dt_interpose_device_t *ii = NULL, *io = NULL;
    assert_ok(dt_interpose_device_create(CPU, &hin, 0, &ii));
    assert_ok(dt_interpose_device_create(dt_interpose_device_ops(ii), &hout, 0, &io));
    const dt_device_ops_t *O = dt_interpose_device_ops(io);
    dt_device_t *d = open_dev(O);
    assert_int_equal(IN.seen[DT_IDEV_INIT], 1); /* stacked: both saw init */
    const dt_kernels_t *K = O->kernels();

    R.inject = DT_ERR_REMOTE;
    R.inject_slot = DT_IKERN_MATMUL_FORWARD;
    float out[2] = {-7, -7}, inp[2] = {1, 2}, w[2] = {3, 4};
    R.n_before = R.n_after = 0;
    assert_status(K->matmul_forward(d, NULL, out, inp, w, NULL, DT_F32, DT_F32, 1, 2, 1),
                  DT_ERR_REMOTE);
    assert_msg("device/cpu: matmul_forward: injected");
    assert_int_equal(IN.seen[DT_IKERN_MATMUL_FORWARD], 0);
    assert_true(out[0] == -7.0f);
    assert_int_equal(R.n_before, 1);
    assert_int_equal(R.n_after, 1);
    assert_int_equal(R.status, DT_ERR_REMOTE);
    assert_int_equal(R.elapsed_ns, 0);
    assert_int_equal(R.after.flops, 4);  /* described all the same */
    /* other kernels are untouched */
    assert_ok(K->scale(d, NULL, out, DT_F32, 2.0f, 1));
    assert_int_equal(IN.seen[DT_IKERN_SCALE], 1);
    assert_true(out[0] == -14.0f);

    /* alloc: nothing handed out, nothing allocated */
    R.inject_slot = DT_IDEV_ALLOC;
    dt_mem_stats_t m0 = {.struct_size = sizeof m0}, m1 = {.struct_size = sizeof m1};
    assert_ok(O->mem_stats(d, &m0));
    void *p = (void *)out;
    assert_status(O->alloc(d, 4096, DT_TAG_PARAMS, &p), DT_ERR_REMOTE);
    assert_null(p);
    assert_int_equal(IN.seen[DT_IDEV_ALLOC], 0);
    assert_ok(O->mem_stats(d, &m1));
    assert_int_equal(m1.current[DT_TAG_PARAMS], m0.current[DT_TAG_PARAMS]);

    /* no instance: attention_state_bytes, init */
    R.inject_slot = DT_IKERN_ATTENTION_STATE_BYTES;
    uint64_t sb = 0;
    assert_status(K->attention_state_bytes(1, 2, 4, 2, DT_F32, &sb), DT_ERR_REMOTE);
    assert_msg("attention_state_bytes: injected");
    assert_int_equal(IN.seen[DT_IKERN_ATTENTION_STATE_BYTES], 0);
    R.inject_slot = DT_IDEV_INIT;
    const dt_device_init_t a = {.struct_size = sizeof a, .local_size = 1, .device_index = -1};
    dt_device_t *d2 = (dt_device_t *)out;
    assert_status(O->init(&th.host, &a, &d2), DT_ERR_REMOTE);
    assert_null(d2);
    assert_int_equal(IN.seen[DT_IDEV_INIT], 1);

    /* kernels() and finalize cannot be refused */
    R.inject_slot = DT_IDEV_KERNELS;
    int kernels_calls = IN.seen[DT_IDEV_KERNELS];
    assert_ptr_equal(O->kernels(), K);
    assert_int_equal(IN.seen[DT_IDEV_KERNELS], kernels_calls + 1);
    R.inject_slot = DT_IDEV_FINALIZE;
    O->finalize(d);
    assert_int_equal(IN.seen[DT_IDEV_FINALIZE], 1);
    dt_interpose_device_destroy(io);
    dt_interpose_device_destroy(ii);
}

/* ---- sync: the stream is waited for around each kernel and copy -------- */

static void test_sync(void **state)
{
    (void)state;
    rec_t IN = {0};
    dt_interpose_hooks_t hin = rec_hooks(&IN);
    dt_interpose_device_t *ii = NULL, *io = NULL;
    assert_ok(dt_interpose_device_create(CPU, &hin, 0, &ii));
    assert_ok(dt_interpose_device_create(dt_interpose_device_ops(ii), NULL,
                                         DT_INTERPOSE_DEVICE_SYNC, &io));
    const dt_device_ops_t *O = dt_interpose_device_ops(io);
    dt_device_t *d = open_dev(O);
    const dt_kernels_t *K = O->kernels();
    dt_stream_t *s = NULL;
    assert_ok(O->stream_create(d, &s));
    float y[4] = {1, 2, 3, 4}, x[4] = {1, 1, 1, 1};
    IN.n_order = 0;
    assert_ok(K->axpy(d, s, y, x, DT_F32, 1.0f, 4));
    assert_true(y[3] == 5.0f);
    assert_int_equal(IN.n_order, 3);
    assert_int_equal(IN.order[0], DT_IDEV_STREAM_SYNC);
    assert_int_equal(IN.order[1], DT_IKERN_AXPY);
    assert_int_equal(IN.order[2], DT_IDEV_STREAM_SYNC);
    for (int i = 0; i < 3; i++)
        assert_ptr_equal(IN.streams[i], s);
    /* a copy too, on the default stream; an event record is not work */
    IN.n_order = 0;
    assert_ok(O->memcpy_async(d, y, x, sizeof x, DT_COPY_D2D, NULL));
    assert_int_equal(IN.n_order, 3);
    assert_int_equal(IN.order[1], DT_IDEV_MEMCPY_ASYNC);
    assert_null(IN.streams[0]);
    dt_event_t *e = NULL;
    assert_ok(O->event_create(d, &e));
    IN.n_order = 0;
    assert_ok(O->event_record(d, e, s));
    assert_int_equal(IN.n_order, 1);
    /* a refused kernel: no wait after it, its status as is */
    IN.n_order = 0;
    assert_status(K->axpy(d, s, y, x, DT_I32, 1.0f, 4), DT_ERR_UNSUPPORTED);
    assert_int_equal(IN.n_order, 2);
    assert_int_equal(IN.order[1], DT_IKERN_AXPY);
    assert_ok(O->event_destroy(d, e));
    assert_ok(O->stream_destroy(d, s));
    O->finalize(d);
    dt_interpose_device_destroy(io);

    /* without the flag: the kernel alone */
    assert_ok(dt_interpose_device_create(dt_interpose_device_ops(ii), NULL, 0, &io));
    O = dt_interpose_device_ops(io);
    d = open_dev(O);
    IN.n_order = 0;
    assert_ok(O->kernels()->axpy(d, NULL, y, x, DT_F32, 1.0f, 4));
    assert_int_equal(IN.n_order, 2); /* kernels(), axpy */
    assert_int_equal(IN.order[1], DT_IKERN_AXPY);
    O->finalize(d);
    dt_interpose_device_destroy(io);
    dt_interpose_device_destroy(ii);
}

/* ---- what a kernel costs ------------------------------------------------- */

/* Multiply-adds of causal attention counted one dot product at a time:
 * Q K^T for every (i, j <= i) and the same for P V, per batch and head. */
static uint64_t attention_macs(int64_t B, int64_t T, int64_t C, int64_t NH)
{
    uint64_t macs = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++)
                for (int64_t j = 0; j <= i; j++)
                    macs += 2 * (uint64_t)(C / NH);
    return macs;
}

static void test_kernel_costs(void **state)
{
    (void)state;
    rec_t R = {0};
    dt_interpose_hooks_t hk = rec_hooks(&R);
    dt_interpose_device_t *id = NULL;
    assert_ok(dt_interpose_device_create(CPU, &hk, 0, &id));
    const dt_device_ops_t *W = dt_interpose_device_ops(id);
    dt_device_t *d = open_dev(W);
    const dt_kernels_t *K = W->kernels();
    dt_ref_rng_t g;
    dt_ref_rng_seed(&g, 7);

    /* matmul: 2 N C OC FLOPs; bytes: inp, out, weight, bias */
    const uint64_t N = 6, C = 8, OC = 5;
    float *inp = frand(&g, N * C, -1, 1), *out = frand(&g, N * OC, -1, 1);
    float *w = frand(&g, OC * C, -1, 1), *bias = frand(&g, OC, -1, 1);
    float *dinp = frand(&g, N * C, -1, 1), *dw = frand(&g, OC * C, -1, 1);
    float *dbias = frand(&g, OC, -1, 1);
    assert_ok(K->matmul_forward(d, NULL, out, inp, w, bias, DT_F32, DT_F32, 6, 8, 5));
    assert_int_equal(R.after.flops, 2 * N * C * OC);
    assert_int_equal(R.after.base.bytes, 4 * (N * C + N * OC) + 4 * OC * C + 4 * OC);
    /* bf16 weights, no bias: the weight counts 2 bytes an element */
    uint16_t wb[40];
    assert_ok(K->cast(d, NULL, wb, DT_BF16, w, DT_F32, 40));
    assert_int_equal(R.after.base.bytes, 40 * (2 + 4));
    assert_ok(K->matmul_forward(d, NULL, out, inp, wb, NULL, DT_F32, DT_BF16, 6, 8, 5));
    assert_int_equal(R.after.flops, 2 * N * C * OC);
    assert_int_equal(R.after.base.bytes, 4 * (N * C + N * OC) + 2 * OC * C);
    /* backward: one product per gradient asked of dinp and dweight */
    assert_ok(K->matmul_backward(d, NULL, dinp, dw, dbias, out, inp, w, DT_F32, DT_F32, 6, 8,
                                 5));
    assert_int_equal(R.after.flops, 2 * 2 * N * C * OC);
    assert_int_equal(R.after.base.bytes, 4 * N * OC + (2 * 4 * N * C + 4 * OC * C) +
                                             (4 * N * C + 8 * OC * C) + 8 * OC);
    assert_ok(K->matmul_backward(d, NULL, NULL, dw, NULL, out, inp, w, DT_F32, DT_F32, 6, 8, 5));
    assert_int_equal(R.after.flops, 2 * N * C * OC);
    assert_int_equal(R.after.base.bytes, 4 * N * OC + (4 * N * C + 8 * OC * C));

    /* attention: 2 FLOPs per multiply-add of the causal half; bytes: qkv,
     * out and the state the plugin keeps (the cpu: (B, NH, T, T) f32) */
    const int64_t B = 2, T = 5, AC = 8, NH = 2;
    uint64_t st = 0;
    assert_ok(K->attention_state_bytes(B, T, AC, NH, DT_F32, &st));
    assert_int_equal(st, (uint64_t)(B * NH * T * T) * 4);
    assert_int_equal(R.after.flops, 0);
    assert_int_equal(R.after.base.bytes, 0);
    const uint64_t btc = (uint64_t)(B * T * AC);
    float *qkv = frand(&g, B * T * 3 * AC, -1, 1), *ao = frand(&g, B * T * AC, -1, 1);
    float *ast = frand(&g, (int64_t)st / 4, 0, 1), *dqkv = frand(&g, B * T * 3 * AC, -1, 1);
    float *dao = frand(&g, B * T * AC, -1, 1);
    assert_ok(K->attention_forward(d, NULL, ao, ast, qkv, DT_F32, B, T, AC, NH));
    assert_int_equal(R.after.flops, 2 * attention_macs(B, T, AC, NH));
    assert_int_equal(R.after.flops, 2 * B * AC * T * (T + 1));
    assert_int_equal(R.after.base.bytes, 4 * (3 * btc + btc) + st);
    assert_ok(K->attention_backward(d, NULL, dqkv, dao, qkv, ao, ast, DT_F32, B, T, AC, NH));
    assert_int_equal(R.after.flops, 4 * attention_macs(B, T, AC, NH));
    assert_int_equal(R.after.base.bytes, 4 * (2 * 3 * btc + btc + 3 * btc + btc) + st);

    /* memory-bound kernels count bytes only */
    float *pm = frand(&g, 10, -1, 1), *m = frand(&g, 10, -1, 1), *v = frand(&g, 10, 0, 1);
    assert_ok(K->adamw_update(d, NULL, pm, dw, m, v, DT_F32, 10, 1e-3f, 0.9f, 0.99f, 1e-8f,
                              0.0f, 1.0f, 1));
    assert_int_equal(R.after.flops, 0);
    assert_int_equal(R.after.base.bytes, 10 * (24 + 4));
    assert_ok(K->residual_forward(d, NULL, out, out, out, DT_F32, 30));
    assert_int_equal(R.after.base.bytes, 3 * 4 * 30);
    void *bufs[] = {inp, out, w, bias, dinp, dw, dbias, qkv, ao, ast, dqkv, dao, pm, m, v};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    W->finalize(d);
    dt_interpose_device_destroy(id);
}

/* ---- the profiler over the device --------------------------------------- */

/* The row of `op` in a print_passes table: calls, GFLOP/s, GB/s (as text),
 * errors; 0 when absent. */
static int row(const char *text, const char *op, unsigned long long *calls, char *gf, char *gb,
               unsigned long long *errors)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\n  %s ", op);
    const char *l = strstr(text, pat);
    if (!l)
        return 0;
    char name[40];
    double ms, per, pct, us;
    return sscanf(l, " %39s %llu %lf %lf %lf %lf %31s %31s %llu", name, calls, &ms, &per, &pct,
                  &us, gf, gb, errors) == 9;
}

static char *print_passes(dt_interpose_profile_t *p)
{
    /* static: the stream keeps the addresses until fclose, and GCC -O3
     * (-Wdangling-pointer) cannot see that fclose is the end of it */
    static char *text;
    static size_t len;
    text = NULL;
    len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    dt_interpose_profile_print_passes(p, f, "device profile (test):");
    fclose(f);
    return text;
}

static void test_profile_passes(void **state)
{
    (void)state;
    dt_interpose_profile_t *prof = dt_interpose_profile_create();
    assert_non_null(prof);
    dt_interpose_profile_passes(prof, "embedding_forward", 1);
    dt_interpose_hooks_t hk = dt_interpose_profile_hooks(prof);
    dt_interpose_device_t *id = NULL;
    assert_ok(dt_interpose_device_create(CPU, &hk, 0, &id));
    const dt_device_ops_t *W = dt_interpose_device_ops(id);
    dt_device_t *d = open_dev(W);
    const dt_kernels_t *K = W->kernels();

    /* nothing yet: no pass began */
    char *text = print_passes(prof);
    assert_string_equal(text, "device profile (test): nothing measured: no pass began (no "
                              "call of embedding_forward)\n");
    free(text);

    /* pass p (1..4) runs p matmuls; pass 1 is skipped, pass 4 is the
     * last, partial one: the table has passes 2 and 3, 5 matmuls */
    float emb[2 * 3 * 4] = {0}, wte[5 * 4] = {0}, wpe[3 * 4] = {0}, out[4 * 3], inp[4 * 2],
          w[3 * 2];
    int32_t tok[6] = {0, 1, 2, 3, 4, 0};
    memset(out, 0, sizeof out);
    for (int i = 0; i < 8; i++)
        inp[i] = (float)i;
    for (int i = 0; i < 6; i++)
        w[i] = 1.0f;
    void *early = NULL;
    for (int pass = 1; pass <= 4; pass++) {
        assert_ok(K->embedding_forward(d, NULL, emb, tok, wte, wpe, DT_F32, 2, 3, 4));
        if (pass == 1)
            assert_ok(W->alloc(d, 64, DT_TAG_OTHER, &early)); /* left out */
        for (int m = 0; m < pass; m++)
            assert_ok(K->matmul_forward(d, NULL, out, inp, w, NULL, DT_F32, DT_F32, 4, 2, 3));
        if (pass == 2) /* a refused call counts as an error */
            assert_status(K->matmul_forward(d, NULL, out, inp, w, NULL, DT_F16, DT_F32, 4, 2,
                                            3),
                          DT_ERR_UNSUPPORTED);
    }
    text = print_passes(prof);
    assert_non_null(strstr(text, "device profile (test): passes 2..3 of 4 (2 whole; a pass "
                                 "begins at each embedding_forward): "));
    assert_non_null(strstr(text, " ms per pass, in calls "));
    unsigned long long calls = 0, errors = 9;
    char gf[32], gb[32];
    assert_true(row(text, "matmul_forward", &calls, gf, gb, &errors));
    assert_int_equal(calls, 2 + 3 + 1);
    assert_int_equal(errors, 1);
    assert_true(strtod(gf, NULL) > 0); /* 2 x 4 x 2 x 3 FLOPs each */
    assert_true(strtod(gb, NULL) > 0);
    assert_true(row(text, "embedding_forward", &calls, gf, gb, &errors));
    assert_int_equal(calls, 2);
    assert_string_equal(gf, "-"); /* no matrix product */
    assert_int_equal(errors, 0);
    assert_false(row(text, "alloc", &calls, gf, gb, &errors));
    free(text);

    W->free(d, early);
    W->finalize(d);
    dt_interpose_device_destroy(id);
    dt_interpose_profile_free(prof);

    /* one pass past the skipped ones: from its start to now */
    prof = dt_interpose_profile_create();
    dt_interpose_profile_passes(prof, "embedding_forward", 1);
    hk = dt_interpose_profile_hooks(prof);
    assert_ok(dt_interpose_device_create(CPU, &hk, 0, &id));
    W = dt_interpose_device_ops(id);
    d = open_dev(W);
    K = W->kernels();
    for (int pass = 1; pass <= 2; pass++)
        assert_ok(K->embedding_forward(d, NULL, emb, tok, wte, wpe, DT_F32, 2, 3, 4));
    text = print_passes(prof);
    assert_non_null(strstr(text, "device profile (test): pass 2 to the end (2 pass(es); a "
                                 "pass begins at each embedding_forward): "));
    assert_true(row(text, "embedding_forward", &calls, gf, gb, &errors));
    assert_int_equal(calls, 1);
    free(text);
    W->finalize(d);
    dt_interpose_device_destroy(id);
    dt_interpose_profile_free(prof);

    /* every pass skipped */
    prof = dt_interpose_profile_create();
    dt_interpose_profile_passes(prof, "embedding_forward", 5);
    hk = dt_interpose_profile_hooks(prof);
    assert_ok(dt_interpose_device_create(CPU, &hk, 0, &id));
    W = dt_interpose_device_ops(id);
    d = open_dev(W);
    assert_ok(W->kernels()->embedding_forward(d, NULL, emb, tok, wte, wpe, DT_F32, 2, 3, 4));
    text = print_passes(prof);
    assert_string_equal(text, "device profile (test): nothing measured: 1 pass(es) began (at "
                              "each embedding_forward), all left out by skip=5\n");
    free(text);
    W->finalize(d);
    dt_interpose_device_destroy(id);
    dt_interpose_profile_free(prof);
}

/* ---- what cannot be wrapped, and the pool ------------------------------- */

static void test_create_errors(void **state)
{
    (void)state;
    dt_interpose_device_t *id = (dt_interpose_device_t *)&th;
    dt_device_ops_t wrong = *CPU;
    wrong.info.kind = DT_KIND_COMM;
    assert_status(dt_interpose_device_create(&wrong, NULL, 0, &id), DT_ERR_INVALID);
    assert_msg("device interposer: the table is not a device table of ABI major 1");
    assert_null(id);
    wrong = *CPU;
    wrong.info.abi_major = 2;
    assert_status(dt_interpose_device_create(&wrong, NULL, 0, &id), DT_ERR_INVALID);
    assert_status(dt_interpose_device_create(NULL, NULL, 0, &id), DT_ERR_INVALID);
    assert_msg("device interposer: NULL is not a device table of ABI major 1");
    assert_status(dt_interpose_device_create(CPU, NULL, 0x6, &id), DT_ERR_INVALID);
    assert_msg("device interposer over 'cpu': unknown flags 0x6");
    wrong = *CPU;
    wrong.kernels = big_kernels;
    big_k.k = *CPU->kernels();
    big_k.k.info.abi_major = 2;
    assert_status(dt_interpose_device_create(&wrong, NULL, 0, &id), DT_ERR_INVALID);
    assert_msg("device interposer over 'cpu': kernels() handed out a table of another major, "
               "not a kernel table of ABI major 1");

    /* fill the pool; each one's instance-less slots reach its own hooks */
    rec_t R[DT_INTERPOSE_DEVICE_MAX];
    dt_interpose_device_t *all[DT_INTERPOSE_DEVICE_MAX];
    memset(R, 0, sizeof R);
    for (int i = 0; i < DT_INTERPOSE_DEVICE_MAX; i++) {
        dt_interpose_hooks_t hk = rec_hooks(&R[i]);
        assert_ok(dt_interpose_device_create(CPU, &hk, 0, &all[i]));
    }
    assert_status(dt_interpose_device_create(CPU, NULL, 0, &id), DT_ERR_UNSUPPORTED);
    assert_msg("device interposer over 'cpu': 8 interposers are alive already, the most "
               "there can be");
    const dt_device_ops_t *W5 = dt_interpose_device_ops(all[5]);
    dt_device_t *d = open_dev(W5);
    (void)W5->kernels();
    uint64_t sb;
    assert_ok(W5->kernels()->attention_state_bytes(1, 2, 4, 2, DT_F32, &sb));
    for (int i = 0; i < DT_INTERPOSE_DEVICE_MAX; i++) {
        int want = i == 5;
        assert_int_equal(R[i].seen[DT_IDEV_INIT], want);
        assert_int_equal(R[i].seen[DT_IDEV_KERNELS], 2 * want);
        assert_int_equal(R[i].seen[DT_IKERN_ATTENTION_STATE_BYTES], want);
    }
    W5->finalize(d);
    /* a destroyed one's place is free again */
    dt_interpose_device_destroy(all[0]);
    assert_ok(dt_interpose_device_create(CPU, NULL, 0, &all[0]));
    for (int i = 0; i < DT_INTERPOSE_DEVICE_MAX; i++)
        dt_interpose_device_destroy(all[i]);
    dt_interpose_device_destroy(NULL);
}

int main(void)
{
    /* never dlclosed: OpenBLAS threads live as long as the process */
    CPU = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_cpu.so", DT_ENTRY_STRING(device, 1),
                               NULL);
    if (!CPU) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_runtime_slots_pass_through),
        cmocka_unit_test(test_kernels_match_the_plugin),
        cmocka_unit_test(test_older_and_newer_tables),
        cmocka_unit_test(test_injected_failure),
        cmocka_unit_test(test_sync),
        cmocka_unit_test(test_kernel_costs),
        cmocka_unit_test(test_profile_passes),
        cmocka_unit_test(test_create_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
