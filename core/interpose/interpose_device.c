/*
 * core/interpose/interpose_device.c - the interposer over a device
 * plugin's runtime table and the kernel table it hands out (interpose.h):
 * every slot of both runs the user's before hook, the plugin's slot on the
 * plugin's handle, and the after hook.
 *
 * Two tables, two slot lists: the runtime's (DT_INTERPOSE_DEVICE_SLOTS)
 * and the kernels' (DT_INTERPOSE_KERNEL_SLOTS), each clamped to its own
 * struct_size.  The kernel table is built once, at create, from the one
 * the plugin's kernels() hands out (a static table, the same pointer on
 * every call); the wrapper's kernels() hands out that one.  The instance
 * the wrapper hands out (struct dt_device below) carries the plugin's
 * handle, the init host (for messages) and the world rank.  Streams,
 * events and memory are the plugin's and pass through untouched.
 *
 * What each kernel costs (FLOPs, bytes read and written) is computed here
 * from its arguments, once for every device plugin; interpose.h states
 * the formulas beside dt_interpose_device_call_t.
 *
 * Each slot's signature is written once, in ID_PLAIN_SLOTS (runtime
 * slots that only forward) or IK_SLOTS (kernels), or as a function (init,
 * finalize, kernels, attention_state_bytes: they create or destroy the
 * instance or have none).  The compile-time checks after the includes
 * prove the slot enum of interpose.h follows both tables field by field.
 */
#include "interpose/interpose.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

typedef void (*id_fn_t)(void);

/* DT_INTERPOSE_DEVICE_SLOTS names the runtime table's slots in field
 * order, DT_INTERPOSE_KERNEL_SLOTS the kernel table's: */
_Static_assert(offsetof(dt_device_ops_t, init) == sizeof(dt_plugin_info_t),
               "dt_device_ops_t: a slot before init");
#define ID_CHECK_ORDER(up, field, flags)                                       \
    _Static_assert(offsetof(dt_device_ops_t, field) ==                         \
                       offsetof(dt_device_ops_t, init) + DT_IDEV_##up * sizeof(id_fn_t), \
                   "DT_INTERPOSE_DEVICE_SLOTS: " #field " is not at its position in "  \
                   "dt_device_ops_t");
DT_INTERPOSE_DEVICE_SLOTS(ID_CHECK_ORDER)
_Static_assert(sizeof(dt_device_ops_t) ==
                   offsetof(dt_device_ops_t, init) + DT_IDEV_RUNTIME_COUNT * sizeof(id_fn_t),
               "dt_device_ops_t has a slot DT_INTERPOSE_DEVICE_SLOTS does not list");
_Static_assert(offsetof(dt_kernels_t, matmul_forward) == sizeof(dt_kernels_info_t),
               "dt_kernels_t: a slot before matmul_forward");
#define IK_CHECK_ORDER(up, field, flags)                                       \
    _Static_assert(offsetof(dt_kernels_t, field) ==                            \
                       offsetof(dt_kernels_t, matmul_forward) +                \
                           (DT_IKERN_##up - DT_IKERN_FIRST) * sizeof(id_fn_t), \
                   "DT_INTERPOSE_KERNEL_SLOTS: " #field " is not at its position in "  \
                   "dt_kernels_t");
DT_INTERPOSE_KERNEL_SLOTS(IK_CHECK_ORDER)
_Static_assert(sizeof(dt_kernels_t) ==
                   offsetof(dt_kernels_t, matmul_forward) + DT_IKERN_COUNT * sizeof(id_fn_t),
               "dt_kernels_t has a slot DT_INTERPOSE_KERNEL_SLOTS does not list");

#define ID_NAME(up, field, flags) [DT_IDEV_##up] = #field,
#define IK_NAME(up, field, flags) [DT_IKERN_##up] = #field,
#define ID_FLAGS(up, field, flags) [DT_IDEV_##up] = (flags),
#define IK_FLAGS(up, field, flags) [DT_IKERN_##up] = (flags),
static const char *const id_names[DT_IDEV_SLOT_COUNT] = {
    DT_INTERPOSE_DEVICE_SLOTS(ID_NAME) DT_INTERPOSE_KERNEL_SLOTS(IK_NAME)};
static const uint32_t id_flags[DT_IDEV_SLOT_COUNT] = {
    DT_INTERPOSE_DEVICE_SLOTS(ID_FLAGS) DT_INTERPOSE_KERNEL_SLOTS(IK_FLAGS)};

struct dt_interpose_device {
    dt_device_ops_t ops;            /* the runtime table handed out */
    dt_kernels_t kern;              /* the kernel table its kernels() hands out */
    const dt_device_ops_t *inner;   /* the plugin's */
    const dt_kernels_t *inner_kern; /* the plugin's kernel table */
    dt_interpose_hooks_t hooks;
    uint32_t flags;                 /* DT_INTERPOSE_DEVICE_* */
    int pool;                       /* its trampolines (init, kernels,
                                     * attention_state_bytes) */
    _Atomic uint64_t seq[DT_IDEV_SLOT_COUNT];
};

/* The instance the wrapper hands out. */
struct dt_device {
    const dt_device_ops_v1_t *ops; /* first: the table that made it (dtrain/device.h) */
    dt_interpose_device_t *id;
    dt_device_t *inner;             /* the plugin's handle */
    const dt_host_t *host;          /* the host init was given */
    int32_t rank;                   /* init's world rank */
};

/* One call in progress: what the hooks see and what the wrapper needs. */
typedef struct id_call {
    dt_interpose_device_call_t k;
    dt_interpose_device_t *id;
    dt_device_t *d;                 /* NULL for init, kernels and
                                     * attention_state_bytes */
    void **out_ptr;                 /* what the slot hands out, shown to */
    dt_stream_t **out_stream;       /* `after` when it succeeded */
    dt_event_t **out_event;
    int sync;                       /* wait for the stream around the call */
    int called;                     /* the plugin's slot ran */
    uint64_t t0;
} id_call_t;

/* ---- one call ----------------------------------------------------------- */

static void call_begin(id_call_t *x, dt_interpose_device_t *id, dt_device_t *d, int slot)
{
    memset(x, 0, sizeof *x);
    x->id = id;
    x->d = d;
    dt_interpose_device_call_t *k = &x->k;
    k->base.kind = DT_KIND_DEVICE;
    k->base.slot = (uint32_t)slot;
    k->base.name = id_names[slot];
    k->base.op = id_names[slot];
    k->base.flags = id_flags[slot];
    k->base.seq = atomic_fetch_add(&id->seq[slot], 1) + 1;
    k->base.rank = d ? d->rank : -1;
    k->ops = id->inner;
    k->kernels = id->inner_kern;
    k->dev = d ? d->inner : NULL;
    k->host = d ? d->host : NULL;
    k->tag = k->copy_kind = k->dtype = k->dtype2 = -1;
    x->sync = d && (id->flags & DT_INTERPOSE_DEVICE_SYNC) && (id_flags[slot] & DT_ICALL_ENQUEUE);
}

/* The before hook, then (sync) the wait for the work queued before this
 * call, outside its time.  A failure of either hands nothing out and the
 * plugin's slot is not called. */
static int call_enter(id_call_t *x)
{
    const dt_interpose_hooks_t *h = &x->id->hooks;
    int rc = h->before ? h->before(h->ctx, &x->k.base) : DT_OK;
    if (rc == DT_OK && x->sync)
        rc = x->id->inner->stream_sync(x->d->inner, x->k.stream);
    if (rc != DT_OK) {
        if (x->out_ptr)
            *x->out_ptr = NULL;
        if (x->out_stream)
            *x->out_stream = NULL;
        if (x->out_event)
            *x->out_event = NULL;
    }
    x->called = rc == DT_OK;
    x->t0 = x->id->hooks.untimed ? 0 : dt_interpose_now_ns();
    return rc;
}

/* (sync) The wait for the call's own work, inside its time; then the
 * after hook, with the status the caller gets. */
static int call_leave(id_call_t *x, int rc)
{
    if (x->called && x->sync && rc == DT_OK)
        rc = x->id->inner->stream_sync(x->d->inner, x->k.stream);
    uint64_t elapsed = x->called && !x->id->hooks.untimed ? dt_interpose_now_ns() - x->t0 : 0;
    if (rc == DT_OK) {
        if (x->out_ptr)
            x->k.ptr = *x->out_ptr;
        if (x->out_stream)
            x->k.stream = *x->out_stream;
        if (x->out_event)
            x->k.event = *x->out_event;
    }
    const dt_interpose_hooks_t *h = &x->id->hooks;
    if (h->after)
        h->after(h->ctx, &x->k.base, rc, elapsed);
    return rc;
}

static int null_device(const char *slot)
{
    return dt_err_set(DT_ERR_INVALID, "device interposer: %s: NULL device", slot);
}

/* ---- what a kernel costs (the formulas: interpose.h) --------------------- */

/* A size as a count: negative sizes (refused by the kernel) count 0. */
static double n_(int64_t v) { return v > 0 ? (double)v : 0.0; }
static double sz(int dtype) { return (double)dt_dtype_size(dtype); }

/* Counts are summed in double, exact to 2^53, and clamped. */
static uint64_t count(double v) { return v > 0 && v < 1.8e19 ? (uint64_t)v : 0; }

static void shape(id_call_t *x, int dtype, int dtype2, uint32_t n, int64_t a, int64_t b,
                  int64_t c, int64_t e)
{
    x->k.dtype = dtype;
    x->k.dtype2 = dtype2;
    x->k.n_dims = n;
    const int64_t dims[4] = {a, b, c, e};
    for (uint32_t i = 0; i < n; i++)
        x->k.dims[i] = dims[i];
}

static void cost(id_call_t *x, double flops, double bytes)
{
    x->k.flops = count(flops);
    x->k.base.bytes = count(bytes);
}

static void cost_matmul_forward(id_call_t *x, int has_bias, int dtype, int wdtype, int64_t N,
                                int64_t C, int64_t OC)
{
    shape(x, dtype, wdtype, 3, N, C, OC, 0);
    double n = n_(N), c = n_(C), oc = n_(OC), a = sz(dtype), w = sz(wdtype);
    cost(x, 2 * n * c * oc, a * (n * c + n * oc) + w * oc * c + (has_bias ? a * oc : 0));
}

static void cost_matmul_backward(id_call_t *x, int dinp, int dweight, int dbias, int dtype,
                                 int wdtype, int64_t N, int64_t C, int64_t OC)
{
    shape(x, dtype, wdtype, 3, N, C, OC, 0);
    double n = n_(N), c = n_(C), oc = n_(OC), a = sz(dtype), w = sz(wdtype);
    double bytes = a * n * oc;
    if (dinp)
        bytes += 2 * a * n * c + w * oc * c;
    if (dweight)
        bytes += a * n * c + 8 * oc * c;
    if (dbias)
        bytes += 8 * oc;
    cost(x, 2 * n * c * oc * (double)((dinp != 0) + (dweight != 0)), bytes);
}

/* The plugin's state size for the shape (0 when it has none or refuses:
 * the kernel will refuse it too). */
static double attention_state(const dt_kernels_t *k, int64_t B, int64_t T, int64_t C,
                              int64_t NH, int dtype)
{
    uint64_t bytes = 0;
    if (!DT_HAS_OP(dt_kernels_t, k, attention_state_bytes) ||
        k->attention_state_bytes(B, T, C, NH, dtype, &bytes) != DT_OK)
        return 0;
    return (double)bytes;
}

/* forward 2 B C T (T+1) FLOPs, backward twice that (interpose.h) */
static void cost_attention(id_call_t *x, int backward, int dtype, int64_t B, int64_t T,
                           int64_t C, int64_t NH)
{
    shape(x, dtype, -1, 4, B, T, C, NH);
    double b = n_(B), t = n_(T), c = n_(C), a = sz(dtype);
    double state = attention_state(x->id->inner_kern, B, T, C, NH, dtype);
    double fwd = 2 * b * c * t * (t + 1);
    cost(x, backward ? 2 * fwd : fwd, a * b * t * c * (backward ? 11 : 4) + state);
}

/* Grouped-query attention: attention's FLOPs with C = NH HD; qkv holds
 * (NH + 2 NKV) HD per position, out and dout NH HD; the state is
 * multi-head attention's with NH heads (device.h). */
static void cost_gqa_attention(id_call_t *x, int backward, int dtype, int64_t B, int64_t T,
                               int64_t NH, int64_t NKV, int64_t HD)
{
    shape(x, dtype, -1, 4, B, T, NH, NKV);
    double b = n_(B), t = n_(T), c = n_(NH) * n_(HD), a = sz(dtype);
    double qkv = (n_(NH) + 2 * n_(NKV)) * n_(HD);
    double state = attention_state(x->id->inner_kern, B, T, NH * HD, NH, dtype);
    double fwd = 2 * b * c * t * (t + 1);
    /* forward: qkv, out; backward: qkv, dqkv (+=), out, dout */
    cost(x, backward ? 2 * fwd : fwd,
         a * b * t * (backward ? 3 * qkv + 2 * c : qkv + c) + state);
}

/* RMSNorm: as layernorm without the bias and with one statistic */
static void cost_rmsnorm(id_call_t *x, int backward, int dinp, int dweight, int dtype,
                         int64_t N, int64_t C)
{
    shape(x, dtype, -1, 2, N, C, 0, 0);
    double n = n_(N), c = n_(C), a = sz(dtype);
    if (!backward) /* inp, out, weight; rstd */
        cost(x, 0, a * (2 * n * c + c) + 4 * n);
    else           /* dout, inp, rstd; dinp (+=) and weight; dweight (+=) */
        cost(x, 0, a * 2 * n * c + 4 * n + (dinp ? a * (2 * n * c + c) : 0) +
                       (dweight ? 8 * c : 0));
}

/* RoPE: NH heads of HD per position read and written, and the tables */
static void cost_rope(id_call_t *x, int backward, int dtype, int64_t B, int64_t T,
                      int64_t NH, int64_t HD)
{
    shape(x, dtype, -1, 4, B, T, NH, HD);
    double bt = n_(B) * n_(T), h = n_(NH) * n_(HD), a = sz(dtype);
    cost(x, 0, a * bt * h * (backward ? 3 : 2) + 4 * n_(T) * n_(HD));
}

static void cost_embedding(id_call_t *x, int backward, int dwte, int dwpe, int dtype,
                           int64_t B, int64_t T, int64_t C)
{
    shape(x, dtype, -1, 3, B, T, C, 0);
    double b = n_(B), t = n_(T), c = n_(C), a = sz(dtype);
    if (!backward) /* tokens, a row of wte per token, wpe, out */
        cost(x, 0, 4 * b * t + a * (2 * b * t * c + t * c));
    else           /* tokens, dout, the rows accumulated into */
        cost(x, 0, 4 * b * t + a * b * t * c + (dwte ? 8 * b * t * c : 0) +
                       (dwpe ? 8 * t * c : 0));
}

/* n elements of `dtype`, `passes` buffers of them read or written */
static void cost_elementwise(id_call_t *x, int dtype, int64_t n, double passes, double extra)
{
    shape(x, dtype, -1, 1, n, 0, 0, 0);
    cost(x, 0, passes * sz(dtype) * n_(n) + extra);
}

static void cost_softmax_xent(id_call_t *x, int backward, int dtype, int64_t N, int64_t V)
{
    shape(x, dtype, -1, 2, N, V, 0, 0);
    double n = n_(N), v = n_(V), a = sz(dtype);
    if (!backward) /* logits, probs; targets, losses */
        cost(x, 0, 2 * a * n * v + 8 * n);
    else           /* dlogits (+=), probs; targets */
        cost(x, 0, 3 * a * n * v + 4 * n);
}

static void cost_layernorm(id_call_t *x, int backward, int dweight, int dbias, int dtype,
                           int64_t N, int64_t C)
{
    shape(x, dtype, -1, 2, N, C, 0, 0);
    double n = n_(N), c = n_(C), a = sz(dtype);
    if (!backward) /* inp, out, weight, bias; mean, rstd */
        cost(x, 0, a * (2 * n * c + 2 * c) + 8 * n);
    else           /* dinp (+=), dout, inp, weight; mean, rstd; dweight, dbias (+=) */
        cost(x, 0, a * (4 * n * c + c) + 8 * n + (dweight ? 8 * c : 0) + (dbias ? 8 * c : 0));
}

/* SwiGLU: inp (N, 2H), out (N, H); backward: inp, dout, dinp (+=) */
static void cost_swiglu(id_call_t *x, int backward, int dtype, int64_t N, int64_t H)
{
    shape(x, dtype, -1, 2, N, H, 0, 0);
    double nh = n_(N) * n_(H), a = sz(dtype);
    cost(x, 0, a * nh * (backward ? 7 : 3));
}

static void cost_cast(id_call_t *x, int dst_dtype, int src_dtype, int64_t n)
{
    shape(x, dst_dtype, src_dtype, 1, n, 0, 0, 0);
    cost(x, 0, n_(n) * (sz(dst_dtype) + sz(src_dtype)));
}

/* param, m, v (f32, read and written) and grad */
static void cost_adamw(id_call_t *x, int grad_dtype, int64_t n)
{
    shape(x, grad_dtype, -1, 1, n, 0, 0, 0);
    cost(x, 0, n_(n) * (24 + sz(grad_dtype)));
}

/* param (f32, read and written), grad, mom (f32, read and written) */
static void cost_sgd(id_call_t *x, int grad_dtype, int has_mom, int64_t n)
{
    shape(x, grad_dtype, -1, 1, n, 0, 0, 0);
    cost(x, 0, n_(n) * (8 + sz(grad_dtype) + (has_mom ? 8 : 0)));
}

/* ---- runtime slots that forward ----------------------------------------- */

/* X(ENUM, field, (parameters), (the plugin's arguments), describe the call) */
#define ID_PLAIN_SLOTS(X)                                                                      \
    X(PROPS, props, (dt_device_t * d, dt_device_props_v1_t *out), (d->inner, out), (void)0)   \
    X(ALLOC, alloc, (dt_device_t * d, uint64_t bytes, int tag, void **out),                   \
      (d->inner, bytes, tag, out), x.k.size = bytes; x.k.tag = tag; x.out_ptr = out)           \
    X(FREE, free, (dt_device_t * d, void *ptr), (d->inner, ptr), x.k.ptr = ptr)                \
    X(MEM_STATS, mem_stats, (dt_device_t * d, dt_mem_stats_v1_t *out), (d->inner, out),        \
      (void)0)                                                                                 \
    X(MEM_RESET_PEAKS, mem_reset_peaks, (dt_device_t * d), (d->inner), (void)0)               \
    X(HOST_ALLOC, host_alloc, (dt_device_t * d, uint64_t bytes, int tag, void **out),         \
      (d->inner, bytes, tag, out), x.k.size = bytes; x.k.tag = tag; x.out_ptr = out)           \
    X(HOST_FREE, host_free, (dt_device_t * d, void *ptr), (d->inner, ptr), x.k.ptr = ptr)      \
    X(STREAM_CREATE, stream_create, (dt_device_t * d, dt_stream_t **out), (d->inner, out),     \
      x.out_stream = out)                                                                      \
    X(STREAM_DESTROY, stream_destroy, (dt_device_t * d, dt_stream_t *s), (d->inner, s),        \
      x.k.stream = s)                                                                          \
    X(STREAM_SYNC, stream_sync, (dt_device_t * d, dt_stream_t *s), (d->inner, s),              \
      x.k.stream = s)                                                                          \
    X(EVENT_CREATE, event_create, (dt_device_t * d, dt_event_t **out), (d->inner, out),        \
      x.out_event = out)                                                                       \
    X(EVENT_DESTROY, event_destroy, (dt_device_t * d, dt_event_t *e), (d->inner, e),           \
      x.k.event = e)                                                                           \
    X(EVENT_RECORD, event_record, (dt_device_t * d, dt_event_t *e, dt_stream_t *s),            \
      (d->inner, e, s), x.k.event = e; x.k.stream = s)                                         \
    X(STREAM_WAIT_EVENT, stream_wait_event, (dt_device_t * d, dt_stream_t *s, dt_event_t *e),  \
      (d->inner, s, e), x.k.event = e; x.k.stream = s)                                         \
    X(EVENT_SYNC, event_sync, (dt_device_t * d, dt_event_t *e), (d->inner, e), x.k.event = e)  \
    X(SYNCHRONIZE, synchronize, (dt_device_t * d), (d->inner), (void)0)                        \
    X(MEMCPY_ASYNC, memcpy_async,                                                              \
      (dt_device_t * d, void *dst, const void *src, uint64_t bytes, int kind, dt_stream_t *s), \
      (d->inner, dst, src, bytes, kind, s), x.k.ptr = dst; x.k.size = bytes;                   \
      x.k.base.bytes = bytes; x.k.copy_kind = kind; x.k.stream = s)                            \
    X(MEMSET_ASYNC, memset_async,                                                              \
      (dt_device_t * d, void *dst, int value, uint64_t bytes, dt_stream_t *s),                 \
      (d->inner, dst, value, bytes, s), x.k.ptr = dst; x.k.size = bytes;                       \
      x.k.base.bytes = bytes; x.k.stream = s)                                                  \
    X(NATIVE_STREAM, native_stream, (dt_device_t * d, dt_stream_t *s, void **out),             \
      (d->inner, s, out), x.k.stream = s; x.out_ptr = out)

#define ID_PLAIN_FN(up, field, params, args, describe)                         \
    static int id_##field params                                               \
    {                                                                          \
        id_call_t x;                                                           \
        if (!d)                                                                \
            return null_device(#field);                                        \
        call_begin(&x, d->id, d, DT_IDEV_##up);                                \
        describe;                                                              \
        int rc = call_enter(&x);                                               \
        if (rc == DT_OK)                                                       \
            rc = d->id->inner->field args;                                     \
        return call_leave(&x, rc);                                             \
    }
ID_PLAIN_SLOTS(ID_PLAIN_FN)

/* ---- kernels (every one but attention_state_bytes, which has no
 * instance) --------------------------------------------------------------- */

#define IK_SLOTS(X)                                                                            \
    X(MATMUL_FORWARD, matmul_forward,                                                          \
      (dt_device_t * d, dt_stream_t *s, void *out, const void *inp, const void *weight,        \
       const void *bias, int dtype, int wdtype, int64_t N, int64_t C, int64_t OC),             \
      (d->inner, s, out, inp, weight, bias, dtype, wdtype, N, C, OC),                          \
      cost_matmul_forward(&x, bias != NULL, dtype, wdtype, N, C, OC))                          \
    X(MATMUL_BACKWARD, matmul_backward,                                                        \
      (dt_device_t * d, dt_stream_t *s, void *dinp, float *dweight, float *dbias,              \
       const void *dout, const void *inp, const void *weight, int dtype, int wdtype,           \
       int64_t N, int64_t C, int64_t OC),                                                      \
      (d->inner, s, dinp, dweight, dbias, dout, inp, weight, dtype, wdtype, N, C, OC),         \
      cost_matmul_backward(&x, dinp != NULL, dweight != NULL, dbias != NULL, dtype, wdtype,    \
                           N, C, OC))                                                          \
    X(EMBEDDING_FORWARD, embedding_forward,                                                    \
      (dt_device_t * d, dt_stream_t *s, void *out, const int32_t *tokens, const void *wte,     \
       const void *wpe, int dtype, int64_t B, int64_t T, int64_t C),                           \
      (d->inner, s, out, tokens, wte, wpe, dtype, B, T, C),                                    \
      cost_embedding(&x, 0, 0, 0, dtype, B, T, C))                                             \
    X(EMBEDDING_BACKWARD, embedding_backward,                                                  \
      (dt_device_t * d, dt_stream_t *s, float *dwte, float *dwpe, const void *dout,            \
       const int32_t *tokens, int dtype, int64_t B, int64_t T, int64_t C),                     \
      (d->inner, s, dwte, dwpe, dout, tokens, dtype, B, T, C),                                 \
      cost_embedding(&x, 1, dwte != NULL, dwpe != NULL, dtype, B, T, C))                       \
    X(GELU_FORWARD, gelu_forward,                                                              \
      (dt_device_t * d, dt_stream_t *s, void *out, const void *inp, int dtype, int64_t n),     \
      (d->inner, s, out, inp, dtype, n), cost_elementwise(&x, dtype, n, 2, 0))                 \
    X(GELU_BACKWARD, gelu_backward,                                                            \
      (dt_device_t * d, dt_stream_t *s, void *dinp, const void *inp, const void *dout,         \
       int dtype, int64_t n),                                                                  \
      (d->inner, s, dinp, inp, dout, dtype, n), cost_elementwise(&x, dtype, n, 4, 0))          \
    X(SOFTMAX_XENT_FORWARD, softmax_xent_forward,                                              \
      (dt_device_t * d, dt_stream_t *s, float *losses, void *probs, const void *logits,        \
       const int32_t *targets, int dtype, int64_t N, int64_t V),                               \
      (d->inner, s, losses, probs, logits, targets, dtype, N, V),                              \
      cost_softmax_xent(&x, 0, dtype, N, V))                                                   \
    X(SOFTMAX_XENT_BACKWARD, softmax_xent_backward,                                            \
      (dt_device_t * d, dt_stream_t *s, void *dlogits, const void *probs,                      \
       const int32_t *targets, int dtype, float dloss, int64_t N, int64_t V),                  \
      (d->inner, s, dlogits, probs, targets, dtype, dloss, N, V),                              \
      cost_softmax_xent(&x, 1, dtype, N, V))                                                   \
    X(AXPY, axpy,                                                                              \
      (dt_device_t * d, dt_stream_t *s, void *y, const void *xs, int dtype, float alpha,       \
       int64_t n),                                                                             \
      (d->inner, s, y, xs, dtype, alpha, n), cost_elementwise(&x, dtype, n, 3, 0))             \
    X(SUMSQ, sumsq,                                                                            \
      (dt_device_t * d, dt_stream_t *s, double *out, const void *xs, int dtype, int64_t n),    \
      (d->inner, s, out, xs, dtype, n), cost_elementwise(&x, dtype, n, 1, 8))                  \
    X(CAST, cast,                                                                              \
      (dt_device_t * d, dt_stream_t *s, void *dst, int dst_dtype, const void *src,             \
       int src_dtype, int64_t n),                                                              \
      (d->inner, s, dst, dst_dtype, src, src_dtype, n), cost_cast(&x, dst_dtype, src_dtype, n)) \
    X(LAYERNORM_FORWARD, layernorm_forward,                                                    \
      (dt_device_t * d, dt_stream_t *s, void *out, float *mean, float *rstd, const void *inp,  \
       const void *weight, const void *bias, int dtype, int64_t N, int64_t C),                 \
      (d->inner, s, out, mean, rstd, inp, weight, bias, dtype, N, C),                          \
      cost_layernorm(&x, 0, 0, 0, dtype, N, C))                                                \
    X(LAYERNORM_BACKWARD, layernorm_backward,                                                  \
      (dt_device_t * d, dt_stream_t *s, void *dinp, float *dweight, float *dbias,              \
       const void *dout, const void *inp, const void *weight, const float *mean,               \
       const float *rstd, int dtype, int64_t N, int64_t C),                                    \
      (d->inner, s, dinp, dweight, dbias, dout, inp, weight, mean, rstd, dtype, N, C),         \
      cost_layernorm(&x, 1, dweight != NULL, dbias != NULL, dtype, N, C))                      \
    X(ATTENTION_FORWARD, attention_forward,                                                    \
      (dt_device_t * d, dt_stream_t *s, void *out, void *state, const void *qkv, int dtype,    \
       int64_t B, int64_t T, int64_t C, int64_t NH),                                           \
      (d->inner, s, out, state, qkv, dtype, B, T, C, NH),                                      \
      cost_attention(&x, 0, dtype, B, T, C, NH))                                               \
    X(ATTENTION_BACKWARD, attention_backward,                                                  \
      (dt_device_t * d, dt_stream_t *s, void *dqkv, const void *dout, const void *qkv,         \
       const void *out, const void *state, int dtype, int64_t B, int64_t T, int64_t C,         \
       int64_t NH),                                                                            \
      (d->inner, s, dqkv, dout, qkv, out, state, dtype, B, T, C, NH),                          \
      cost_attention(&x, 1, dtype, B, T, C, NH))                                               \
    X(RESIDUAL_FORWARD, residual_forward,                                                      \
      (dt_device_t * d, dt_stream_t *s, void *out, const void *a, const void *b, int dtype,    \
       int64_t n),                                                                             \
      (d->inner, s, out, a, b, dtype, n), cost_elementwise(&x, dtype, n, 3, 0))                \
    X(SCALE, scale,                                                                            \
      (dt_device_t * d, dt_stream_t *s, void *xs, int dtype, float alpha, int64_t n),          \
      (d->inner, s, xs, dtype, alpha, n), cost_elementwise(&x, dtype, n, 2, 0))                \
    X(ADAMW_UPDATE, adamw_update,                                                              \
      (dt_device_t * d, dt_stream_t *s, float *param, const void *grad, float *m, float *v,    \
       int grad_dtype, int64_t n, float lr, float beta1, float beta2, float eps,               \
       float weight_decay, float grad_scale, int64_t t),                                       \
      (d->inner, s, param, grad, m, v, grad_dtype, n, lr, beta1, beta2, eps, weight_decay,     \
       grad_scale, t),                                                                         \
      cost_adamw(&x, grad_dtype, n))                                                           \
    X(SGD_UPDATE, sgd_update,                                                                  \
      (dt_device_t * d, dt_stream_t *s, float *param, const void *grad, float *mom,            \
       int grad_dtype, int64_t n, float lr, float momentum, float weight_decay, int nesterov,  \
       float grad_scale),                                                                      \
      (d->inner, s, param, grad, mom, grad_dtype, n, lr, momentum, weight_decay, nesterov,     \
       grad_scale),                                                                            \
      cost_sgd(&x, grad_dtype, mom != NULL, n))                                                \
    X(VOCAB_EMBEDDING_FORWARD, vocab_embedding_forward,                                        \
      (dt_device_t * d, dt_stream_t *s, void *out, const int32_t *tokens, const void *wte,     \
       const void *wpe, int dtype, int64_t B, int64_t T, int64_t C, int64_t v0, int64_t nv),   \
      (d->inner, s, out, tokens, wte, wpe, dtype, B, T, C, v0, nv),                            \
      cost_embedding(&x, 0, 0, 0, dtype, B, T, C))                                             \
    X(VOCAB_EMBEDDING_BACKWARD, vocab_embedding_backward,                                      \
      (dt_device_t * d, dt_stream_t *s, float *dwte, float *dwpe, const void *dout,            \
       const int32_t *tokens, int dtype, int64_t B, int64_t T, int64_t C, int64_t v0,          \
       int64_t nv),                                                                            \
      (d->inner, s, dwte, dwpe, dout, tokens, dtype, B, T, C, v0, nv),                         \
      cost_embedding(&x, 1, dwte != NULL, dwpe != NULL, dtype, B, T, C))                       \
    X(VOCAB_XENT_FORWARD, vocab_xent_forward,                                                  \
      (dt_device_t * d, dt_stream_t *s, int phase, float *stats, float *losses, void *probs,   \
       const void *logits, const int32_t *targets, int dtype, int64_t N, int64_t v0,           \
       int64_t nv),                                                                            \
      (d->inner, s, phase, stats, losses, probs, logits, targets, dtype, N, v0, nv),           \
      cost_softmax_xent(&x, 0, dtype, N, nv))                                                  \
    X(VOCAB_XENT_BACKWARD, vocab_xent_backward,                                                \
      (dt_device_t * d, dt_stream_t *s, void *dlogits, const void *probs,                      \
       const int32_t *targets, int dtype, float dloss, int64_t N, int64_t v0, int64_t nv),     \
      (d->inner, s, dlogits, probs, targets, dtype, dloss, N, v0, nv),                         \
      cost_softmax_xent(&x, 1, dtype, N, nv))                                                  \
    X(RMSNORM_FORWARD, rmsnorm_forward,                                                        \
      (dt_device_t * d, dt_stream_t *s, void *out, float *rstd, const void *inp,              \
       const void *weight, int dtype, int64_t N, int64_t C, float eps),                        \
      (d->inner, s, out, rstd, inp, weight, dtype, N, C, eps),                                 \
      cost_rmsnorm(&x, 0, 0, 0, dtype, N, C))                                                  \
    X(RMSNORM_BACKWARD, rmsnorm_backward,                                                      \
      (dt_device_t * d, dt_stream_t *s, void *dinp, float *dweight, const void *dout,         \
       const void *inp, const void *weight, const float *rstd, int dtype, int64_t N,           \
       int64_t C),                                                                             \
      (d->inner, s, dinp, dweight, dout, inp, weight, rstd, dtype, N, C),                      \
      cost_rmsnorm(&x, 1, dinp != NULL, dweight != NULL, dtype, N, C))                         \
    X(ROPE_FORWARD, rope_forward,                                                              \
      (dt_device_t * d, dt_stream_t *s, void *out, const void *inp, const float *cos,         \
       const float *sin, int dtype, int64_t B, int64_t T, int64_t NH, int64_t HD, int64_t ld), \
      (d->inner, s, out, inp, cos, sin, dtype, B, T, NH, HD, ld),                              \
      cost_rope(&x, 0, dtype, B, T, NH, HD))                                                   \
    X(ROPE_BACKWARD, rope_backward,                                                            \
      (dt_device_t * d, dt_stream_t *s, void *dinp, const void *dout, const float *cos,       \
       const float *sin, int dtype, int64_t B, int64_t T, int64_t NH, int64_t HD, int64_t ld), \
      (d->inner, s, dinp, dout, cos, sin, dtype, B, T, NH, HD, ld),                            \
      cost_rope(&x, dinp != dout, dtype, B, T, NH, HD))                                        \
    X(SWIGLU_FORWARD, swiglu_forward,                                                          \
      (dt_device_t * d, dt_stream_t *s, void *out, const void *inp, int dtype, int64_t N,     \
       int64_t H),                                                                             \
      (d->inner, s, out, inp, dtype, N, H), cost_swiglu(&x, 0, dtype, N, H))                   \
    X(SWIGLU_BACKWARD, swiglu_backward,                                                        \
      (dt_device_t * d, dt_stream_t *s, void *dinp, const void *inp, const void *dout,        \
       int dtype, int64_t N, int64_t H),                                                       \
      (d->inner, s, dinp, inp, dout, dtype, N, H), cost_swiglu(&x, 1, dtype, N, H))            \
    X(GQA_ATTENTION_FORWARD, gqa_attention_forward,                                            \
      (dt_device_t * d, dt_stream_t *s, void *out, void *state, const void *qkv, int dtype,    \
       int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HD),                             \
      (d->inner, s, out, state, qkv, dtype, B, T, NH, NKV, HD),                                \
      cost_gqa_attention(&x, 0, dtype, B, T, NH, NKV, HD))                                     \
    X(GQA_ATTENTION_BACKWARD, gqa_attention_backward,                                          \
      (dt_device_t * d, dt_stream_t *s, void *dqkv, const void *dout, const void *qkv,         \
       const void *out, const void *state, int dtype, int64_t B, int64_t T, int64_t NH,        \
       int64_t NKV, int64_t HD),                                                               \
      (d->inner, s, dqkv, dout, qkv, out, state, dtype, B, T, NH, NKV, HD),                    \
      cost_gqa_attention(&x, 1, dtype, B, T, NH, NKV, HD))

#define IK_FN(up, field, params, args, describe)                               \
    static int ik_##field params                                               \
    {                                                                          \
        id_call_t x;                                                           \
        if (!d)                                                                \
            return null_device(#field);                                        \
        call_begin(&x, d->id, d, DT_IKERN_##up);                               \
        x.k.stream = s;                                                        \
        describe;                                                              \
        int rc = call_enter(&x);                                               \
        if (rc == DT_OK)                                                       \
            rc = d->id->inner_kern->field args;                                \
        return call_leave(&x, rc);                                             \
    }
IK_SLOTS(IK_FN)

/* ---- slots that create or destroy the instance, or have none ----------- */

static int id_init(dt_interpose_device_t *id, const dt_host_t *host,
                   const dt_device_init_t *args, dt_device_t **out)
{
    id_call_t x;
    call_begin(&x, id, NULL, DT_IDEV_INIT);
    x.k.host = host;
    if (args && args->struct_size >= DT_DEVICE_INIT_V1_SIZE0)
        x.k.base.rank = args->rank;
    if (out)
        *out = NULL;
    dt_device_t *inner = NULL;
    int rc = call_enter(&x);
    if (rc == DT_OK)
        rc = id->inner->init(host, args, out ? &inner : NULL);
    if (rc == DT_OK && inner) {
        dt_device_t *d = calloc(1, sizeof *d);
        if (!d) {
            id->inner->finalize(inner);
            rc = dt_err_set(DT_ERR_NOMEM, "device interposer over '%s': out of memory for "
                            "an instance", id->inner->info.name);
        } else {
            d->ops = &id->ops; /* the interposer's table, as the comm's */
            d->id = id;
            d->inner = inner;
            d->host = host;
            d->rank = x.k.base.rank;
            *out = d;
            x.k.dev = inner;
        }
    }
    return call_leave(&x, rc);
}

static void id_finalize(dt_device_t *d)
{
    if (!d)
        return;
    id_call_t x;
    call_begin(&x, d->id, d, DT_IDEV_FINALIZE);
    (void)call_enter(&x); /* nothing to inject: finalize always runs */
    x.called = 1;
    d->id->inner->finalize(d->inner);
    x.d = NULL;
    (void)call_leave(&x, DT_OK);
    free(d);
}

/* The plugin's kernels() is called too (the hooks see a call that ran);
 * its table was wrapped once, at create. */
static const dt_kernels_t *id_kernels(dt_interpose_device_t *id)
{
    id_call_t x;
    call_begin(&x, id, NULL, DT_IDEV_KERNELS);
    (void)call_enter(&x); /* nothing to inject: kernels() cannot fail */
    x.called = 1;
    (void)id->inner->kernels();
    (void)call_leave(&x, DT_OK);
    return &id->kern;
}

static int id_attention_state_bytes(dt_interpose_device_t *id, int64_t B, int64_t T,
                                    int64_t C, int64_t NH, int dtype, uint64_t *out)
{
    id_call_t x;
    call_begin(&x, id, NULL, DT_IKERN_ATTENTION_STATE_BYTES);
    shape(&x, dtype, -1, 4, B, T, C, NH);
    int rc = call_enter(&x);
    if (rc == DT_OK)
        rc = id->inner_kern->attention_state_bytes(B, T, C, NH, dtype, out);
    return call_leave(&x, rc);
}

/* ---- trampolines: init, kernels and attention_state_bytes have no
 * instance to find their interposer by, so each live interposer owns one
 * set --------------------------------------------------------------------- */

static dt_interpose_device_t *id_pool[DT_INTERPOSE_DEVICE_MAX];
static pthread_mutex_t id_pool_lock = PTHREAD_MUTEX_INITIALIZER;

#define ID_TRAMPOLINE(n)                                                       \
    static int id_init_##n(const dt_host_t *h, const dt_device_init_t *a, dt_device_t **o) \
    {                                                                          \
        return id_init(id_pool[n], h, a, o);                                   \
    }                                                                          \
    static const dt_kernels_t *id_kernels_##n(void) { return id_kernels(id_pool[n]); } \
    static int id_asb_##n(int64_t B, int64_t T, int64_t C, int64_t NH, int dtype, uint64_t *o) \
    {                                                                          \
        return id_attention_state_bytes(id_pool[n], B, T, C, NH, dtype, o);    \
    }
ID_TRAMPOLINE(0)
ID_TRAMPOLINE(1)
ID_TRAMPOLINE(2)
ID_TRAMPOLINE(3)
ID_TRAMPOLINE(4)
ID_TRAMPOLINE(5)
ID_TRAMPOLINE(6)
ID_TRAMPOLINE(7)
_Static_assert(DT_INTERPOSE_DEVICE_MAX == 8, "one ID_TRAMPOLINE per pool entry");

static const struct {
    int (*init)(const dt_host_t *, const dt_device_init_t *, dt_device_t **);
    const dt_kernels_t *(*kernels)(void);
    int (*attention_state_bytes)(int64_t, int64_t, int64_t, int64_t, int, uint64_t *);
} id_tramps[DT_INTERPOSE_DEVICE_MAX] = {
    {id_init_0, id_kernels_0, id_asb_0}, {id_init_1, id_kernels_1, id_asb_1},
    {id_init_2, id_kernels_2, id_asb_2}, {id_init_3, id_kernels_3, id_asb_3},
    {id_init_4, id_kernels_4, id_asb_4}, {id_init_5, id_kernels_5, id_asb_5},
    {id_init_6, id_kernels_6, id_asb_6}, {id_init_7, id_kernels_7, id_asb_7},
};

/* ---- the interposer ----------------------------------------------------- */

/* The plugin's kernel table, checked as far as the wrapper relies on it
 * (the loader checked the rest); NULL with the message set. */
static const dt_kernels_t *inner_kernels(const dt_device_ops_t *inner)
{
    if (!DT_HAS_OP(dt_device_ops_t, inner, kernels)) {
        dt_err_set(DT_ERR_INVALID, "device interposer over '%s': the table has no kernels "
                   "slot", inner->info.name);
        return NULL;
    }
    const dt_kernels_t *k = inner->kernels();
    if (!k || k->info.abi_major != DT_KERNELS_ABI_MAJOR) {
        dt_err_set(DT_ERR_INVALID, "device interposer over '%s': kernels() handed out %s, "
                   "not a kernel table of ABI major %d", inner->info.name,
                   k ? "a table of another major" : "NULL", DT_KERNELS_ABI_MAJOR);
        return NULL;
    }
    return k;
}

int dt_interpose_device_create(const dt_device_ops_t *inner, const dt_interpose_hooks_t *hooks,
                               uint32_t flags, dt_interpose_device_t **out)
{
    *out = NULL;
    if (!inner || inner->info.kind != DT_KIND_DEVICE ||
        inner->info.abi_major != DT_DEVICE_ABI_MAJOR)
        return dt_err_set(DT_ERR_INVALID, "device interposer: %s is not a device table of "
                          "ABI major %d", inner ? "the table" : "NULL", DT_DEVICE_ABI_MAJOR);
    if (flags & ~DT_INTERPOSE_DEVICE_SYNC)
        return dt_err_set(DT_ERR_INVALID, "device interposer over '%s': unknown flags 0x%x",
                          inner->info.name, flags & ~DT_INTERPOSE_DEVICE_SYNC);
    const dt_kernels_t *k = inner_kernels(inner);
    if (!k)
        return DT_ERR_INVALID;
    dt_interpose_device_t *id = calloc(1, sizeof *id);
    if (!id)
        return dt_err_set(DT_ERR_NOMEM, "device interposer over '%s': out of memory",
                          inner->info.name);
    pthread_mutex_lock(&id_pool_lock);
    int pool = -1;
    for (int i = 0; i < DT_INTERPOSE_DEVICE_MAX && pool < 0; i++)
        if (!id_pool[i])
            pool = i;
    if (pool >= 0)
        id_pool[pool] = id;
    pthread_mutex_unlock(&id_pool_lock);
    if (pool < 0) {
        free(id);
        return dt_err_set(DT_ERR_UNSUPPORTED, "device interposer over '%s': %d interposers "
                          "are alive already, the most there can be", inner->info.name,
                          DT_INTERPOSE_DEVICE_MAX);
    }
    id->pool = pool;
    id->inner = inner;
    id->inner_kern = k;
    id->flags = flags;
    if (hooks)
        id->hooks = *hooks;
    for (int s = 0; s < DT_IDEV_SLOT_COUNT; s++)
        atomic_init(&id->seq[s], 0);

    /* each table: the plugin's head; slots this build does not know are
     * left out */
    id->ops.info = inner->info;
    if (id->ops.info.struct_size > sizeof(dt_device_ops_t)) {
        id->ops.info.struct_size = (uint32_t)sizeof(dt_device_ops_t);
        id->ops.info.abi_minor = DT_DEVICE_ABI_MINOR;
    }
    id->kern.info = k->info;
    if (id->kern.info.struct_size > sizeof(dt_kernels_t)) {
        id->kern.info.struct_size = (uint32_t)sizeof(dt_kernels_t);
        id->kern.info.abi_minor = DT_KERNELS_ABI_MINOR;
    }
#define ID_HAS(field) DT_HAS_OP(dt_device_ops_t, inner, field)
#define ID_SET(up, field, params, args, describe)                              \
    id->ops.field = ID_HAS(field) ? id_##field : NULL;
    ID_PLAIN_SLOTS(ID_SET)
    id->ops.init = ID_HAS(init) ? id_tramps[pool].init : NULL;
    id->ops.finalize = ID_HAS(finalize) ? id_finalize : NULL;
    id->ops.kernels = id_tramps[pool].kernels; /* checked above */
#define IK_HAS(field) DT_HAS_OP(dt_kernels_t, k, field)
#define IK_SET(up, field, params, args, describe)                              \
    id->kern.field = IK_HAS(field) ? ik_##field : NULL;
    IK_SLOTS(IK_SET)
    id->kern.attention_state_bytes =
        IK_HAS(attention_state_bytes) ? id_tramps[pool].attention_state_bytes : NULL;
#undef IK_SET
#undef IK_HAS
#undef ID_SET
#undef ID_HAS
    *out = id;
    return DT_OK;
}

/* Every slot is set above: the plain ones and the ones written out. */
#define ID_COUNT(up, field, params, args, describe) +1
_Static_assert(0 ID_PLAIN_SLOTS(ID_COUNT) + 3 == DT_IDEV_RUNTIME_COUNT,
               "a runtime slot has no wrapper in interpose_device.c");
_Static_assert(0 IK_SLOTS(ID_COUNT) + 1 == DT_IKERN_COUNT,
               "a kernel has no wrapper in interpose_device.c");

const dt_device_ops_t *dt_interpose_device_ops(const dt_interpose_device_t *id)
{
    return &id->ops;
}

void dt_interpose_device_destroy(dt_interpose_device_t *id)
{
    if (!id)
        return;
    pthread_mutex_lock(&id_pool_lock);
    id_pool[id->pool] = NULL;
    pthread_mutex_unlock(&id_pool_lock);
    free(id);
}
