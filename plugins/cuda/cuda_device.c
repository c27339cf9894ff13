/*
 * plugins/cuda/cuda_device.c - the `cuda` device plugin: lifecycle (one
 * GPU per local rank), props, tagged device memory through the caching
 * allocator (cuda_alloc.c), pinned host memory, streams and events on CUDA
 * streams and events, asynchronous copies, the runtime table and the
 * kernel table.  Kernels: cuda_kernels.c (entry points and checks),
 * cuda_matmul.c (cuBLASLt), cuda_*.cu (device code).
 *
 * Memory is reused in stream order (see mem_put): a free never waits for
 * the device; every wait for the device (synchronize, stream_sync,
 * event_sync, stream_destroy, the allocator under pressure) polls, spinning
 * briefly then sleeping, and gives up after CUDA_WAIT_LIMIT_MS with a
 * message.  Every entry point that makes CUDA calls first makes the
 * instance's GPU current in the calling thread (cuda_guard).
 *
 * Status: on one NVIDIA H200 (2026-11-27, scripts/gpu-check.sh) the
 * runtime tests, the kernel tests under compute-sanitizer, the GPT-2
 * oracle and GPT-2 124M training ran with the fences and the bounded
 * waits; the guard's switch between GPUs and a wait running into its
 * bound need more than one GPU or a stuck collective, and have not run.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtrain/sdk/cfg.h"
#include "cuda_internal.h"
#include "cuda_placement.h"

#define CUDA_MAX_LIMIT 4611686018427387904.0 /* 2^62 */

int cuda_fail(dt_device_t *d, const char *op, const char *call, cudaError_t e)
{
    return d->host->set_error(d->host, DT_ERR_SYSTEM, "%s: %s: %s (%s)", op,
                              call, cudaGetErrorString(e), cudaGetErrorName(e));
}

int cuda_lt_fail(dt_device_t *d, const char *op, const char *call,
                 cublasStatus_t st)
{
    return d->host->set_error(d->host, DT_ERR_SYSTEM, "%s: %s: %s (%s)", op,
                              call, cublasLtGetStatusString(st), cublasLtGetStatusName(st));
}

int cuda_dtype_refused(dt_device_t *d, const char *op, const char *got,
                       const char *runs)
{
    return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                              "%s: %s: unsupported (the cuda device runs %s)",
                              op, got, runs);
}

int cuda_check_act(dt_device_t *d, const char *op, int dtype)
{
    if (dtype == DT_F32 || dtype == DT_BF16)
        return DT_OK;
    char got[64];
    snprintf(got, sizeof got, "%s activations", dt_dtype_name(dtype));
    return cuda_dtype_refused(d, op, got, "f32 or bf16 activations");
}

int cuda_check_elems(dt_device_t *d, const char *op, int dtype, int f16_ok)
{
    if (dtype == DT_F32 || dtype == DT_BF16 || (f16_ok && dtype == DT_F16))
        return DT_OK;
    char got[64];
    snprintf(got, sizeof got, "%s elements", dt_dtype_name(dtype));
    return cuda_dtype_refused(d, op, got,
                              f16_ok ? "f32, bf16 or f16 elements"
                                     : "f32 or bf16 elements");
}

/* ------------------------------------------------ the guard and the waits */

int cuda_guard(dt_device_t *d, const char *op)
{
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur == d->index)
        return DT_OK;
    if (e != cudaSuccess)
        (void)cudaGetLastError(); /* leave no error behind for a launch */
    if ((e = cudaSetDevice(d->index)) != cudaSuccess) {
        (void)cudaGetLastError();
        return d->host->set_error(d->host, DT_ERR_SYSTEM,
                                  "%s: cudaSetDevice(%d): %s (%s)", op, d->index,
                                  cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return DT_OK;
}

/* Guard, or return its failure. */
#define CUDA_GUARD(d, op)                                                      \
    do {                                                                       \
        int grc_ = cuda_guard((d), (op));                                      \
        if (grc_ != DT_OK)                                                     \
            return grc_;                                                       \
    } while (0)

/* A wait's first CUDA_SPIN_NS look without sleeping, so a short wait
 * returns within microseconds; then naps of 2, 4, ... up to
 * CUDA_NAP_MAX_NS between looks (a long wait costs at most that much
 * latency and a few thousand queries a second). */
#define CUDA_SPIN_NS 20000ull
#define CUDA_NAP_MAX_NS 100000ull

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

typedef cudaError_t (*cuda_query_fn)(void *h);

static cudaError_t query_event(void *h) { return cudaEventQuery((cudaEvent_t)h); }
static cudaError_t query_stream(void *h) { return cudaStreamQuery((cudaStream_t)h); }

/* Poll q(h) until it is not cudaErrorNotReady, for at most `ms` (0: look
 * once): cudaSuccess, cudaErrorNotReady when still not done, or the
 * query's error.  Never a blocking CUDA call. */
static cudaError_t cuda_poll(cuda_query_fn q, void *h, uint64_t ms)
{
    uint64_t t0 = mono_ns(), nap = 2000;
    for (;;) {
        cudaError_t e = q(h);
        if (e != cudaErrorNotReady)
            return e;
        /* "not ready" is no error: leave none behind for the next launch's
         * cudaGetLastError (PyTorch does the same) */
        (void)cudaGetLastError();
        uint64_t spent = mono_ns() - t0;
        if (spent >= ms * 1000000ull)
            return cudaErrorNotReady;
        if (spent < CUDA_SPIN_NS)
            continue;
        struct timespec ts = {0, (long)nap};
        nanosleep(&ts, NULL);
        if (nap < CUDA_NAP_MAX_NS)
            nap = nap * 2 < CUDA_NAP_MAX_NS ? nap * 2 : CUDA_NAP_MAX_NS;
    }
}

/* "300 s", "50 ms". */
static const char *fmt_ms(char buf[32], uint64_t ms)
{
    if (ms >= 1000 && ms % 1000 == 0)
        snprintf(buf, 32, "%" PRIu64 " s", ms / 1000);
    else
        snprintf(buf, 32, "%" PRIu64 " ms", ms);
    return buf;
}

/* ---------------------------------------------------------------- fences
 *
 * A fence is an event that completes once all the work queued so far on
 * every live stream of this instance (its default stream and every stream
 * from stream_create: all its kernels, copies, and a comm's collectives
 * queued through native_stream) has finished.  Making one: a look at each
 * live stream (cudaStreamQuery); the idle ones need nothing.  No busy
 * stream: no fence at all (the block is reusable at once).  One busy
 * stream: the fence's event is recorded on it.  More: on each busy stream
 * its marker event is recorded and the private fence stream made to wait
 * for it, then the fence's event is recorded on the fence stream.
 * cudaStreamWaitEvent waits for the marker's record at the time of the
 * call, so the one marker per stream can be recorded again by the next
 * fence without disturbing this one; the fence stream holds nothing but
 * these waits and records.  Cost per fence: a query per live stream, 2
 * calls per busy one, 1 record; no host wait, and no event created in
 * steady state (the fences' events come from a pool).  The alternative,
 * one event per busy stream per fence, avoids the fence stream but makes
 * every later look at the fence a query per stream.  All under mem_mu.
 */

typedef struct cuda_live_stream {
    dt_stream_t *s;
    cudaEvent_t marker; /* recorded on s by the fences */
    int busy;           /* fence_make's scratch */
} cuda_live_stream_t;

struct cuda_fences {
    cudaStream_t cs;          /* the fence stream */
    cuda_live_stream_t *live; /* every live stream, the default one included */
    int nlive, live_cap;
    cudaEvent_t *idle; /* events for the next fences */
    int nidle, idle_cap;
    uint64_t wait_ms; /* bound on every wait for the device */
    int stuck;        /* finalize's wait ran out: no cudaFree, which could
                       * block on the stuck work */
};

static void fence_put(struct cuda_fences *f, cudaEvent_t ev)
{
    if (f->nidle == f->idle_cap) {
        int cap = f->idle_cap ? f->idle_cap * 2 : 64;
        cudaEvent_t *n = realloc(f->idle, (size_t)cap * sizeof *n);
        if (!n) {
            (void)cudaEventDestroy(ev); /* released once it completes */
            return;
        }
        f->idle = n;
        f->idle_cap = cap;
    }
    f->idle[f->nidle++] = ev;
}

/* A fence for the work queued so far, into *out (NULL: every live stream
 * is idle, nothing to wait for); mem_mu held.  *call names the CUDA call
 * that failed. */
static cudaError_t fence_make(dt_device_t *d, cudaEvent_t *out, const char **call,
                              int force)
{
    struct cuda_fences *f = d->fences;
    cudaError_t e;
    int nbusy = 0, last = -1;
    *out = NULL;
    for (int i = 0; i < f->nlive; i++) {
        e = force ? cudaErrorNotReady : cudaStreamQuery(f->live[i].s->cs);
        f->live[i].busy = e == cudaErrorNotReady;
        if (e == cudaErrorNotReady) {
            (void)cudaGetLastError(); /* no error (cuda_poll) */
            nbusy++;
            last = i;
        } else if (e != cudaSuccess) {
            *call = "cudaStreamQuery";
            (void)cudaGetLastError();
            return e;
        }
    }
    if (nbusy == 0)
        return cudaSuccess;
    cudaEvent_t ev;
    if (f->nidle) {
        ev = f->idle[--f->nidle];
    } else if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) {
        *call = "cudaEventCreateWithFlags";
        (void)cudaGetLastError();
        return e;
    }
    cudaStream_t tail = f->cs;
    if (nbusy == 1) {
        tail = f->live[last].s->cs;
    } else {
        for (int i = 0; i < f->nlive; i++) {
            if (!f->live[i].busy)
                continue;
            *call = "cudaEventRecord";
            if ((e = cudaEventRecord(f->live[i].marker, f->live[i].s->cs)) != cudaSuccess)
                goto fail;
            *call = "cudaStreamWaitEvent";
            if ((e = cudaStreamWaitEvent(f->cs, f->live[i].marker, 0)) != cudaSuccess)
                goto fail;
        }
    }
    *call = "cudaEventRecord";
    if ((e = cudaEventRecord(ev, tail)) != cudaSuccess)
        goto fail;
    *out = ev;
    return cudaSuccess;
fail:
    (void)cudaGetLastError();
    fence_put(f, ev);
    return e;
}

/* `s` joins (or leaves) the streams every fence covers (mem_mu taken). */
static int live_add(dt_device_t *d, dt_stream_t *s, const char *op)
{
    struct cuda_fences *f = d->fences;
    cudaEvent_t marker;
    cudaError_t e = cudaEventCreateWithFlags(&marker, cudaEventDisableTiming);
    if (e != cudaSuccess)
        return cuda_fail(d, op, "cudaEventCreateWithFlags", e);
    pthread_mutex_lock(&d->mem_mu);
    if (f->nlive == f->live_cap) {
        int cap = f->live_cap ? f->live_cap * 2 : 8;
        cuda_live_stream_t *n = realloc(f->live, (size_t)cap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&d->mem_mu);
            (void)cudaEventDestroy(marker);
            return d->host->set_error(d->host, DT_ERR_NOMEM, "%s: out of memory", op);
        }
        f->live = n;
        f->live_cap = cap;
    }
    f->live[f->nlive++] = (cuda_live_stream_t){.s = s, .marker = marker};
    pthread_mutex_unlock(&d->mem_mu);
    return DT_OK;
}

static void live_remove(dt_device_t *d, dt_stream_t *s)
{
    struct cuda_fences *f = d->fences;
    if (!f)
        return;
    pthread_mutex_lock(&d->mem_mu);
    for (int i = 0; i < f->nlive; i++)
        if (f->live[i].s == s) {
            /* a fence stream waiting on it still works: CUDA releases a
             * destroyed event once it has completed */
            (void)cudaEventDestroy(f->live[i].marker);
            f->live[i] = f->live[--f->nlive];
            break;
        }
    pthread_mutex_unlock(&d->mem_mu);
}

static int fences_open(dt_device_t *d)
{
    struct cuda_fences *f = calloc(1, sizeof *f);
    if (!f)
        return d->host->set_error(d->host, DT_ERR_NOMEM, "init: out of memory");
    cudaError_t e = cudaStreamCreateWithFlags(&f->cs, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(f);
        return cuda_fail(d, "init: fence stream", "cudaStreamCreateWithFlags", e);
    }
    f->wait_ms = CUDA_WAIT_LIMIT_MS;
    d->fences = f;
    return DT_OK;
}

/* After the allocator and every stream are gone. */
static void fences_close(dt_device_t *d)
{
    struct cuda_fences *f = d->fences;
    if (!f)
        return;
    for (int i = 0; i < f->nlive; i++) /* none by now */
        (void)cudaEventDestroy(f->live[i].marker);
    for (int i = 0; i < f->nidle; i++)
        (void)cudaEventDestroy(f->idle[i]);
    (void)cudaStreamDestroy(f->cs);
    free(f->live);
    free(f->idle);
    free(f);
    d->fences = NULL;
}

/* Once a poll has seen `ev` complete, cudaEventSynchronize on it returns at
 * once, and it is the synchronization point that tools watching the API
 * recognise: the H200 under compute-sanitizer memcheck read stale results
 * from managed memory after a poll alone (CUDA documents a successful query
 * as equivalent for Unified Memory; the tool did not act so). */
static cudaError_t sync_point(cudaEvent_t ev) { return cudaEventSynchronize(ev); }

/* Wait until the work queued so far on every live stream is done (a
 * fence over all of them, idle or not, polled, up to `ms`): DT_OK, or a
 * status and the text ("the work queued on the device's streams not done
 * after 300 s", or the failed call) in msg.  mem_mu only around making and returning the fence. */
static int device_settle(dt_device_t *d, uint64_t ms, char *msg, size_t len)
{
    cudaEvent_t ev;
    const char *call = "";
    pthread_mutex_lock(&d->mem_mu);
    cudaError_t e = fence_make(d, &ev, &call, 1);
    pthread_mutex_unlock(&d->mem_mu);
    if (e != cudaSuccess) {
        snprintf(msg, len, "%s: %s (%s)", call, cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return DT_ERR_SYSTEM;
    }
    if (!ev)
        return DT_OK; /* every stream idle */
    e = cuda_poll(query_event, (void *)ev, ms);
    if (e == cudaSuccess) /* returns at once: see sync_point */
        e = sync_point(ev);
    pthread_mutex_lock(&d->mem_mu);
    fence_put(d->fences, ev);
    pthread_mutex_unlock(&d->mem_mu);
    if (e == cudaSuccess)
        return DT_OK;
    if (e == cudaErrorNotReady) {
        char t[32];
        snprintf(msg, len, "the work queued on the device's streams not done "
                 "after %s", fmt_ms(t, ms));
        return DT_ERR_TIMEOUT;
    }
    snprintf(msg, len, "cudaEventQuery: %s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
    return DT_ERR_SYSTEM;
}

/* Wait for the work before an event, or queued on a stream, up to the
 * bound: DT_OK, or the message "<op>: <what> not done after 300 s<tail>"
 * (DT_ERR_TIMEOUT) or "<op>: <query>: <CUDA's string> (<its name>)". */
static int wait_done(dt_device_t *d, const char *op, cuda_query_fn q, void *h,
                     const char *what, const char *tail)
{
    cudaEvent_t mark = NULL;
    if (q == query_stream) { /* an event after the stream's work: polled, then synced */
        pthread_mutex_lock(&d->mem_mu);
        struct cuda_fences *f = d->fences;
        cudaError_t ce = f->nidle ? cudaSuccess
                                  : cudaEventCreateWithFlags(&mark, cudaEventDisableTiming);
        if (ce == cudaSuccess && f->nidle)
            mark = f->idle[--f->nidle];
        if (ce == cudaSuccess && (ce = cudaEventRecord(mark, (cudaStream_t)h)) != cudaSuccess)
            fence_put(f, mark);
        pthread_mutex_unlock(&d->mem_mu);
        if (ce != cudaSuccess) {
            (void)cudaGetLastError();
            return cuda_fail(d, op, "cudaEventRecord", ce);
        }
        q = query_event;
        h = (void *)mark;
    }
    cudaError_t e = cuda_poll(q, h, d->fences->wait_ms);
    if (e == cudaSuccess)
        e = sync_point((cudaEvent_t)h);
    if (mark) {
        pthread_mutex_lock(&d->mem_mu);
        fence_put(d->fences, mark);
        pthread_mutex_unlock(&d->mem_mu);
    }
    if (e == cudaSuccess)
        return DT_OK;
    if (e == cudaErrorNotReady) {
        char t[32];
        return d->host->set_error(d->host, DT_ERR_TIMEOUT,
                                  "%s: %s not done after %s%s", op, what,
                                  fmt_ms(t, d->fences->wait_ms), tail);
    }
    return cuda_fail(d, op, "cudaEventQuery", e);
}

/* The allocator's fences (cuda_alloc.h), ctx the instance; mem_mu is held
 * and the guard done by mem_get / mem_put, their only callers. */
static int dev_fence_new(void *ctx, void **out, char *err, size_t errlen)
{
    cudaEvent_t ev;
    const char *call = "";
    cudaError_t e = fence_make(ctx, &ev, &call, 0);
    if (e != cudaSuccess) {
        *out = NULL;
        snprintf(err, errlen, "%s: %s (%s)", call, cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return 1;
    }
    *out = (void *)ev;
    return 0;
}

static int dev_fence_result(cudaError_t e, char *err, size_t errlen)
{
    if (e == cudaSuccess)
        return 1;
    if (e == cudaErrorNotReady)
        return 0;
    snprintf(err, errlen, "cudaEventQuery: %s (%s)", cudaGetErrorString(e),
             cudaGetErrorName(e));
    return -1;
}

static int dev_fence_done(void *ctx, void *fence, char *err, size_t errlen)
{
    (void)ctx;
    return dev_fence_result(cuda_poll(query_event, fence, 0), err, errlen);
}

static int dev_fence_wait(void *ctx, void *fence, uint64_t timeout_ms, char *err,
                          size_t errlen)
{
    (void)ctx;
    return dev_fence_result(cuda_poll(query_event, fence, timeout_ms), err, errlen);
}

static void dev_fence_free(void *ctx, void *fence)
{
    dt_device_t *d = ctx;
    fence_put(d->fences, (cudaEvent_t)fence);
}

/* ---------------------------------------------------------------- memory */

static int dev_raw_alloc(void *ctx, uint64_t bytes, void **out, char *err,
                         size_t errlen)
{
    (void)ctx;
    cudaError_t e = cudaMalloc(out, (size_t)bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear it: OOM is not sticky */
        snprintf(err, errlen, "cudaMalloc: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return 1;
    }
    return 0;
}

static void dev_raw_free(void *ctx, void *p)
{
    dt_device_t *d = ctx;
    if (d->fences && d->fences->stuck)
        return; /* cudaFree may wait for the stuck work: left to the exit */
    (void)cudaFree(p);
}

static int pinned_raw_alloc(void *ctx, uint64_t bytes, void **out, char *err,
                            size_t errlen)
{
    (void)ctx;
    cudaError_t e = cudaHostAlloc(out, (size_t)bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(err, errlen, "cudaHostAlloc: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
        return 1;
    }
    return 0;
}

static void pinned_raw_free(void *ctx, void *p)
{
    dt_device_t *d = ctx;
    if (d->fences && d->fences->stuck)
        return; /* as dev_raw_free */
    (void)cudaFreeHost(p);
}

/* Device memory or pinned host memory; `who` NULL for the ABI's calls. */
static int mem_get(dt_device_t *d, uint64_t bytes, int tag, int pinned,
                   void **out, const char *who)
{
    char err[640];
    *out = NULL;
    CUDA_GUARD(d, who ? who : pinned ? "host_alloc" : "alloc");
    pthread_mutex_lock(&d->mem_mu);
    int rc = cuda_alloc_get(pinned ? &d->pmem : &d->dmem, bytes, tag, out,
                            err, sizeof err);
    pthread_mutex_unlock(&d->mem_mu);
    if (rc != DT_OK)
        return d->host->set_error(d->host, rc, "%s%s%s: %s", who ? who : "",
                                  who ? ": " : "",
                                  pinned ? "host_alloc" : "alloc", err);
    return DT_OK;
}

int cuda_mem_alloc(dt_device_t *d, uint64_t bytes, int tag, void **out,
                   const char *who)
{
    return mem_get(d, bytes, tag, 0, out, who);
}

/* Stream-ordered reuse.  A freed device block goes into the allocator's
 * cache with a fence (above): an event that completes once everything
 * queued so far on every live stream of this instance has finished, so
 * whatever work used the block, on whichever stream, is behind it.  The
 * allocator hands the block out again, or gives it back with cudaFree,
 * only after the fence has completed (cuda_alloc.h), so a free never
 * waits for the device and the host runs ahead.  The host waits (bounded
 * by CUDA_WAIT_LIMIT_MS, mem_mu held) only when memory is short (the
 * budget or cudaMalloc) and no completed block is left to give back, or
 * when the cache cannot keep the block (caching = false, over the
 * budget).  Pinned host memory has no fences and no cache: cudaFreeHost
 * at once, as before, relying on its implicit synchronization with the
 * device (not bounded).  None of this has run on a GPU yet. */
static int mem_put(dt_device_t *d, void *ptr, int pinned)
{
    const char *fn = pinned ? "host_free" : "free";
    if (!ptr)
        return DT_OK;
    CUDA_GUARD(d, fn);
    char err[640] = "";
    pthread_mutex_lock(&d->mem_mu);
    cuda_alloc_t *mine = pinned ? &d->pmem : &d->dmem;
    cuda_alloc_t *other = pinned ? &d->dmem : &d->pmem;
    if (!cuda_alloc_owns(mine, ptr)) {
        int theirs = cuda_alloc_owns(other, ptr);
        pthread_mutex_unlock(&d->mem_mu);
        if (theirs)
            return CUDA_INVALID(d, "%s: %p is %s (free it with %s)", fn, ptr,
                                pinned ? "device memory from alloc"
                                       : "pinned host memory from host_alloc",
                                pinned ? "free" : "host_free");
        return CUDA_INVALID(d, "%s: %p was not allocated by this device (or "
                               "was already freed)", fn, ptr);
    }
    int rc = cuda_alloc_put(mine, ptr, err, sizeof err);
    pthread_mutex_unlock(&d->mem_mu);
    if (rc != DT_OK)
        return d->host->set_error(d->host, rc, "%s: %s", fn, err);
    return DT_OK;
}

int cuda_mem_free(dt_device_t *d, void *ptr) { return mem_put(d, ptr, 0); }

static int cuda_alloc_op(dt_device_t *d, uint64_t bytes, int tag, void **out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CUDA_INVALID(d, "alloc: out is NULL");
    return mem_get(d, bytes, tag, 0, out, NULL);
}

static int cuda_free_op(dt_device_t *d, void *ptr)
{
    if (!d)
        return DT_ERR_INVALID;
    return mem_put(d, ptr, 0);
}

static int cuda_host_alloc(dt_device_t *d, uint64_t bytes, int tag, void **out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CUDA_INVALID(d, "host_alloc: out is NULL");
    return mem_get(d, bytes, tag, 1, out, NULL);
}

static int cuda_host_free(dt_device_t *d, void *ptr)
{
    if (!d)
        return DT_ERR_INVALID;
    return mem_put(d, ptr, 1);
}

static int cuda_mem_stats(dt_device_t *d, dt_mem_stats_t *out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CUDA_INVALID(d, "mem_stats: out is NULL");
    dt_mem_stats_v1_t st;
    pthread_mutex_lock(&d->mem_mu);
    dt_mem_tally_stats(&d->dmem.st.tally, &d->pmem.st.tally, d->limit, &st);
    pthread_mutex_unlock(&d->mem_mu);
    return dt_result_write(d->host, "mem_stats", out, &st, sizeof st,
                           DT_MEM_STATS_V1_SIZE0);
}

static int cuda_mem_reset_peaks(dt_device_t *d)
{
    if (!d)
        return DT_ERR_INVALID;
    pthread_mutex_lock(&d->mem_mu);
    cuda_alloc_reset_peaks(&d->dmem);
    cuda_alloc_reset_peaks(&d->pmem);
    pthread_mutex_unlock(&d->mem_mu);
    return DT_OK;
}

/* ---------------------------------------------------------------- config */

static const dt_config_key_t cuda_keys[] = {
    {.name = "device_index", .type = DT_CFG_INT, .def = "-1", .min = -1,
     .max = 1023, .choices = NULL,
     .doc = "CUDA device this rank runs on; -1 = its local rank (one GPU per "
            "local rank; more local ranks than GPUs is refused)"},
    {.name = "memory_limit", .type = DT_CFG_INT, .def = "0", .min = 0,
     .max = CUDA_MAX_LIMIT, .choices = NULL,
     .doc = "memory budget in bytes for device allocations (bytes asked for, "
            "all tags); 0 = none (the GPU's memory is the limit)"},
    {.name = "caching", .type = DT_CFG_BOOL, .def = "true", .min = 0, .max = 0,
     .choices = NULL,
     .doc = "keep freed device blocks by size class for reuse, so a "
            "steady-state step calls no cudaMalloc/cudaFree; false = free at "
            "once"},
    {.name = "tf32", .type = DT_CFG_BOOL, .def = "false", .min = 0, .max = 0,
     .choices = NULL,
     .doc = "f32 matmuls may use TF32 tensor cores (10-bit mantissa inputs, "
            "f32 accumulation): faster, not bit-comparable with the cpu"},
    {.name = "deterministic", .type = DT_CFG_BOOL, .def = "false", .min = 0,
     .max = 0, .choices = NULL,
     .doc = "no atomics in reductions (embedding backward sums per column in "
            "a fixed order) and cuBLASLt without split-K reductions, so a "
            "resumed run repeats the same bits"},
};

/* ----------------------------------------------------------------- props */

/* FLOP/s estimates for MFU: SMs x clock x FLOP per SM per clock, dense.
 * f32 on the CUDA cores (2 x 64 lanes on sm_80, 2 x 128 on sm_86, sm_89
 * and sm_90), bf16 on the tensor cores (2048 on sm_80, 4096 on sm_90: 312
 * and 989 TFLOP/s on A100 and H100 SXM at their boost clocks). */
static void peak_flops(int major, int minor, int sms, double ghz, double *f32,
                       double *bf16)
{
    /* 128 f32 lanes an SM from sm_86 (GA10x, Ada) and sm_90; 64 on sm_80 */
    double lanes = major >= 9 || (major == 8 && minor >= 6) ? 128.0 : 64.0;
    double tc = major >= 9 ? 4096.0 : major >= 8 ? 2048.0 : 1024.0;
    *f32 = (double)sms * ghz * 1e9 * 2.0 * lanes;
    *bf16 = (double)sms * ghz * 1e9 * tc;
}

/* ------------------------------------------------------------- lifecycle */

/* Idempotent: what it released is NULL afterwards. */
static void stream_release(dt_device_t *d, dt_stream_t *s)
{
    live_remove(d, s); /* fences no longer look at it */
    if (s->cs)
        (void)cudaStreamDestroy(s->cs);
    if (s->workspace)
        cuda_mem_free(d, s->workspace);
    if (s->partials)
        cuda_mem_free(d, s->partials);
    if (s->wide)
        cuda_mem_free(d, s->wide);
    if (s->att)
        cuda_mem_free(d, s->att);
    s->cs = NULL;
    s->workspace = NULL;
    s->partials = NULL;
    s->wide = NULL;
    s->wide_bytes = 0;
    s->att = NULL;
    s->att_bytes = 0;
    s->magic = 0;
}

/* A stream with its scratch, covered by the fences from now on; the
 * caller sets s->magic last. */
static int stream_open(dt_device_t *d, dt_stream_t *s, const char *op)
{
    memset(s, 0, sizeof *s);
    s->dev = d;
    cudaError_t e = cudaStreamCreateWithFlags(&s->cs, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return cuda_fail(d, op, "cudaStreamCreateWithFlags", e);
    char who[64];
    snprintf(who, sizeof who, "%s: workspace", op);
    int rc = cuda_mem_alloc(d, CUDA_LT_WORKSPACE, DT_TAG_STAGING, &s->workspace, who);
    if (rc == DT_OK)
        rc = cuda_mem_alloc(d, CUDA_PARTIALS * sizeof(double), DT_TAG_STAGING,
                            (void **)&s->partials, who);
    if (rc == DT_OK)
        rc = live_add(d, s, op);
    if (rc != DT_OK)
        stream_release(d, s);
    return rc;
}

/* Finish the queued work (bounded: when it does not finish, say so and
 * leave the device memory to the process's exit, since cudaFree could
 * block on the stuck work), then free everything. */
static void cuda_finalize(dt_device_t *d)
{
    if (!d)
        return;
    int cur = -1; /* the guard, silent: finalize never fails */
    if (cudaGetDevice(&cur) != cudaSuccess || cur != d->index) {
        (void)cudaGetLastError();
        if (cudaSetDevice(d->index) != cudaSuccess)
            (void)cudaGetLastError();
    }
    char msg[640];
    if (d->fences && device_settle(d, d->fences->wait_ms, msg, sizeof msg) != DT_OK) {
        d->host->log(d->host, DT_LOG_WARN, "finalize: %s; device memory and "
                     "cuBLASLt are left to the process's exit", msg);
        d->fences->stuck = 1;
        d->dmem.wait_ms = 0; /* waited already: look once */
    }
    stream_release(d, &d->def);
    if (d->lt && !(d->fences && d->fences->stuck))
        cublasLtDestroy(d->lt);
    const cuda_alloc_stats_t *as = &d->dmem.st;
    char peak[32];
    d->host->log(d->host, DT_LOG_DEBUG,
                 "caching allocator: %" PRIu64 " cudaMalloc, %" PRIu64 " cudaFree, %" PRIu64
                 " requests served from the cache, emptied %" PRIu64 " time%s, waited for "
                 "the device %" PRIu64 " time%s; peak in use %s",
                 as->raw_allocs, as->raw_frees, as->cache_hits, as->releases,
                 as->releases == 1 ? "" : "s", as->fence_waits,
                 as->fence_waits == 1 ? "" : "s",
                 dt_mem_fmt_bytes(peak, as->tally.total_peak));
    uint64_t n = 0, bytes = 0, pn = 0, pbytes = 0;
    msg[0] = '\0';
    if (cuda_alloc_destroy(&d->dmem, &n, &bytes, msg, sizeof msg) != DT_OK)
        d->host->log(d->host, DT_LOG_WARN, "finalize: %s", msg);
    (void)cuda_alloc_destroy(&d->pmem, &pn, &pbytes, NULL, 0); /* no fences */
    if (n || pn)
        d->host->log(d->host, DT_LOG_DEBUG,
                     "finalize: freed %" PRIu64 " device blocks (%" PRIu64
                     " bytes) and %" PRIu64 " pinned blocks (%" PRIu64
                     " bytes) still allocated", n, bytes, pn, pbytes);
    fences_close(d);
    pthread_mutex_destroy(&d->mem_mu);
    free(d);
}

/* Defined below; every handle this plugin makes starts with it. */
static const dt_device_ops_v1_t cuda_ops;

static int cuda_init(const dt_host_v1_t *host, const dt_device_init_v1_t *args,
                     dt_device_t **out)
{
    if (!host || !out)
        return DT_ERR_INVALID;
    *out = NULL;
    dt_device_init_v1_t a;
    int rc = dt_args_read(host, "init args", &a, sizeof a, args,
                          DT_DEVICE_INIT_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    int64_t key_index = 0, limit = 0;
    int caching = 0, tf32 = 0, deterministic = 0;
    if ((rc = dt_cfg_int(host, "device_index", &key_index)) != DT_OK ||
        (rc = dt_cfg_int(host, "memory_limit", &limit)) != DT_OK ||
        (rc = dt_cfg_bool(host, "caching", &caching)) != DT_OK ||
        (rc = dt_cfg_bool(host, "tf32", &tf32)) != DT_OK ||
        (rc = dt_cfg_bool(host, "deterministic", &deterministic)) != DT_OK)
        return rc;

    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return host->set_error(host, DT_ERR_SYSTEM,
                               "init: no CUDA device: cudaGetDeviceCount: %s "
                               "(%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    if (count == 0)
        return host->set_error(host, DT_ERR_SYSTEM,
                               "init: no CUDA device: cudaGetDeviceCount found "
                               "none");
    int index = 0;
    if ((rc = cuda_pick_device(host, &a, key_index, count, &index)) != DT_OK)
        return rc;
    if ((e = cudaSetDevice(index)) != cudaSuccess)
        return host->set_error(host, DT_ERR_SYSTEM,
                               "init: cudaSetDevice(%d): %s (%s)", index,
                               cudaGetErrorString(e), cudaGetErrorName(e));

    dt_device_t *d = calloc(1, sizeof *d);
    if (!d)
        return host->set_error(host, DT_ERR_NOMEM, "init: out of memory");
    d->host = host;
    d->ops = &cuda_ops;
    d->index = index;
    d->tf32 = tf32;
    d->deterministic = deterministic;
    d->limit = (uint64_t)limit;
    pthread_mutex_init(&d->mem_mu, NULL);
    cuda_alloc_backend_t dbe = {.ctx = d, .raw_alloc = dev_raw_alloc,
                                .raw_free = dev_raw_free,
                                .fence_new = dev_fence_new,
                                .fence_done = dev_fence_done,
                                .fence_wait = dev_fence_wait,
                                .fence_free = dev_fence_free};
    cuda_alloc_backend_t pbe = {.ctx = d, .raw_alloc = pinned_raw_alloc,
                                .raw_free = pinned_raw_free};
    cuda_alloc_init(&d->dmem, &dbe, d->limit, caching);
    cuda_alloc_init(&d->pmem, &pbe, 0, 0);
    if ((rc = fences_open(d)) != DT_OK) {
        cuda_finalize(d);
        return rc;
    }

    struct cudaDeviceProp prop;
    int clock_khz = 0;
    if ((e = cudaGetDeviceProperties(&prop, index)) != cudaSuccess ||
        (e = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, index)) !=
            cudaSuccess) {
        rc = cuda_fail(d, "init", "cudaGetDeviceProperties", e);
        cuda_finalize(d);
        return rc;
    }
    d->sm_count = prop.multiProcessorCount;
    /* Usable, not installed: what is free once this process's context
     * exists, less a margin for what the allocator does not see (NCCL's
     * buffers, cuBLASLt's internal allocations, the allocator's class
     * rounding): 512 MiB and 2 % of the card.  A plan sized to
     * totalGlobalMem would not fit. */
    size_t mfree = 0, mtotal = 0;
    if ((e = cudaMemGetInfo(&mfree, &mtotal)) != cudaSuccess) {
        rc = cuda_fail(d, "init", "cudaMemGetInfo", e);
        cuda_finalize(d);
        return rc;
    }
    const uint64_t margin = ((uint64_t)512 << 20) + (uint64_t)mtotal / 50;
    d->total_memory = (uint64_t)mfree > margin ? (uint64_t)mfree - margin : 0;
    if (d->limit && d->limit < d->total_memory)
        d->total_memory = d->limit;
    peak_flops(prop.major, prop.minor, prop.multiProcessorCount, (double)clock_khz / 1e6,
               &d->peak_f32, &d->peak_bf16);
    /* With tf32 the f32 products run on the tensor cores at half the bf16
     * rate: that is the f32 peak an MFU is measured against (the H200's
     * first profile read 139 % against the CUDA cores' peak). */
    if (tf32)
        d->peak_f32 = d->peak_bf16 / 2.0;
    snprintf(d->name, sizeof d->name, "%.100s (cuda:%d, sm_%d%d)", prop.name,
             index, prop.major, prop.minor);

    cublasStatus_t st = cublasLtCreate(&d->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        d->lt = NULL;
        rc = cuda_lt_fail(d, "init", "cublasLtCreate", st);
        cuda_finalize(d);
        return rc;
    }
    if ((rc = stream_open(d, &d->def, "init: default stream")) != DT_OK) {
        cuda_finalize(d);
        return rc;
    }
    d->def.magic = CUDA_STREAM_MAGIC;
    host->log(host, DT_LOG_INFO, "%s, memory_limit %llu bytes, tf32 %s, "
              "deterministic %s", d->name, (unsigned long long)d->limit,
              tf32 ? "on" : "off", deterministic ? "on" : "off");
    *out = d;
    return DT_OK;
}

static int cuda_props(dt_device_t *d, dt_device_props_v1_t *out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CUDA_INVALID(d, "props: out is NULL");
    dt_device_props_v1_t p = {.struct_size = sizeof p};
    snprintf(p.name, sizeof p.name, "%s", d->name);
    p.total_memory = d->total_memory;
    p.peak_flops_f32 = d->peak_f32;
    p.peak_flops_bf16 = d->peak_bf16;
    p.host_visible = 0;
    p.threads = 0;
    return dt_result_write(d->host, "props", out, &p, sizeof p,
                           DT_DEVICE_PROPS_V1_SIZE0);
}

/* ---------------------------------------------------- streams and events */

dt_stream_t *cuda_stream(dt_device_t *d, dt_stream_t *s, const char *op)
{
    if (!s)
        return &d->def;
    if (s->magic != CUDA_STREAM_MAGIC || s->dev != d) {
        CUDA_INVALID(d, "%s: stream %p is not a live stream of this device", op,
                     (void *)s);
        return NULL;
    }
    return s;
}

static int check_event(dt_device_t *d, dt_event_t *e, const char *op)
{
    if (!e || e->magic != CUDA_EVENT_MAGIC || e->dev != d)
        return CUDA_INVALID(d, "%s: event %p is not a live event of this device",
                            op, (void *)e);
    return DT_OK;
}

static int cuda_stream_create(dt_device_t *d, dt_stream_t **out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CUDA_INVALID(d, "stream_create: out is NULL");
    CUDA_GUARD(d, "stream_create");
    dt_stream_t *s = malloc(sizeof *s);
    if (!s)
        return d->host->set_error(d->host, DT_ERR_NOMEM,
                                  "stream_create: out of memory");
    int rc = stream_open(d, s, "stream_create");
    if (rc != DT_OK) {
        free(s);
        return rc;
    }
    s->magic = CUDA_STREAM_MAGIC;
    *out = s;
    return DT_OK;
}

static int cuda_stream_destroy(dt_device_t *d, dt_stream_t *s)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!s)
        return CUDA_INVALID(d, "stream_destroy: the default stream (NULL) "
                               "cannot be destroyed");
    if (!cuda_stream(d, s, "stream_destroy"))
        return DT_ERR_INVALID;
    CUDA_GUARD(d, "stream_destroy");
    int rc = wait_done(d, "stream_destroy", query_stream, (void *)s->cs,
                       "the work queued on the stream", "; the stream is kept");
    if (rc != DT_OK)
        return rc;
    stream_release(d, s);
    free(s);
    return DT_OK;
}

static int cuda_stream_sync(dt_device_t *d, dt_stream_t *s)
{
    if (!d)
        return DT_ERR_INVALID;
    dt_stream_t *st = cuda_stream(d, s, "stream_sync");
    if (!st)
        return DT_ERR_INVALID;
    CUDA_GUARD(d, "stream_sync");
    return wait_done(d, "stream_sync", query_stream, (void *)st->cs,
                     "the work queued on the stream", "");
}

static int cuda_event_create(dt_device_t *d, dt_event_t **out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CUDA_INVALID(d, "event_create: out is NULL");
    CUDA_GUARD(d, "event_create");
    dt_event_t *ev = calloc(1, sizeof *ev);
    if (!ev)
        return d->host->set_error(d->host, DT_ERR_NOMEM,
                                  "event_create: out of memory");
    cudaError_t e = cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(ev);
        return cuda_fail(d, "event_create", "cudaEventCreateWithFlags", e);
    }
    ev->magic = CUDA_EVENT_MAGIC;
    ev->dev = d;
    *out = ev;
    return DT_OK;
}

static int cuda_event_destroy(dt_device_t *d, dt_event_t *ev)
{
    if (!d)
        return DT_ERR_INVALID;
    int rc = check_event(d, ev, "event_destroy");
    if (rc != DT_OK)
        return rc;
    CUDA_GUARD(d, "event_destroy");
    (void)cudaEventDestroy(ev->ev);
    ev->magic = 0;
    free(ev);
    return DT_OK;
}

static int cuda_event_record(dt_device_t *d, dt_event_t *ev, dt_stream_t *s)
{
    if (!d)
        return DT_ERR_INVALID;
    int rc = check_event(d, ev, "event_record");
    if (rc != DT_OK)
        return rc;
    dt_stream_t *st = cuda_stream(d, s, "event_record");
    if (!st)
        return DT_ERR_INVALID;
    CUDA_GUARD(d, "event_record");
    cudaError_t e = cudaEventRecord(ev->ev, st->cs);
    return e == cudaSuccess ? DT_OK
                            : cuda_fail(d, "event_record", "cudaEventRecord", e);
}

static int cuda_stream_wait_event(dt_device_t *d, dt_stream_t *s,
                                  dt_event_t *ev)
{
    if (!d)
        return DT_ERR_INVALID;
    int rc = check_event(d, ev, "stream_wait_event");
    if (rc != DT_OK)
        return rc;
    dt_stream_t *st = cuda_stream(d, s, "stream_wait_event");
    if (!st)
        return DT_ERR_INVALID;
    CUDA_GUARD(d, "stream_wait_event");
    cudaError_t e = cudaStreamWaitEvent(st->cs, ev->ev, 0);
    return e == cudaSuccess
               ? DT_OK
               : cuda_fail(d, "stream_wait_event", "cudaStreamWaitEvent", e);
}

static int cuda_event_sync(dt_device_t *d, dt_event_t *ev)
{
    if (!d)
        return DT_ERR_INVALID;
    int rc = check_event(d, ev, "event_sync");
    if (rc != DT_OK)
        return rc;
    CUDA_GUARD(d, "event_sync");
    return wait_done(d, "event_sync", query_event, (void *)ev->ev,
                     "the work before the event", "");
}

/* device.h: "all queued work on all streams": this instance's, the
 * default stream and every stream from stream_create, where everything it
 * runs is queued (a comm's collectives too, through native_stream).  One
 * fence over them, polled: bounded, unlike cudaDeviceSynchronize, which
 * also waited for other instances on the same GPU. */
static int cuda_synchronize(dt_device_t *d)
{
    if (!d)
        return DT_ERR_INVALID;
    CUDA_GUARD(d, "synchronize");
    char msg[256];
    int rc = device_settle(d, d->fences->wait_ms, msg, sizeof msg);
    return rc == DT_OK ? DT_OK : d->host->set_error(d->host, rc, "synchronize: %s", msg);
}

static int cuda_native_stream(dt_device_t *d, dt_stream_t *s, void **out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CUDA_INVALID(d, "native_stream: out is NULL");
    dt_stream_t *st = cuda_stream(d, s, "native_stream");
    if (!st)
        return DT_ERR_INVALID;
    *out = (void *)st->cs;
    return DT_OK;
}

/* ----------------------------------------------------------------- copies */

static int cuda_memcpy_async(dt_device_t *d, void *dst, const void *src,
                             uint64_t bytes, int kind, dt_stream_t *s)
{
    static const char op[] = "memcpy_async";
    CUDA_BEGIN(d, s, op, st);
    static const enum cudaMemcpyKind kinds[] = {
        cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost,
        cudaMemcpyDeviceToDevice, cudaMemcpyHostToHost};
    if (kind < DT_COPY_H2D || kind > DT_COPY_H2H)
        return CUDA_INVALID(d, "%s: kind %d is not a dt_copy_kind_t", op, kind);
    if (bytes && (!dst || !src))
        return CUDA_INVALID(d, "%s: %s is NULL (%" PRIu64 " bytes)", op,
                            dst ? "src" : "dst", bytes);
    if (!bytes)
        return DT_OK;
    CUDA_GUARD(d, op);
    cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)bytes, kinds[kind], st->cs);
    return e == cudaSuccess ? DT_OK : cuda_fail(d, op, "cudaMemcpyAsync", e);
}

static int cuda_memset_async(dt_device_t *d, void *dst, int value,
                             uint64_t bytes, dt_stream_t *s)
{
    static const char op[] = "memset_async";
    CUDA_BEGIN(d, s, op, st);
    if (bytes && !dst)
        return CUDA_INVALID(d, "%s: dst is NULL (%" PRIu64 " bytes)", op, bytes);
    if (!bytes)
        return DT_OK;
    CUDA_GUARD(d, op);
    cudaError_t e = cudaMemsetAsync(dst, value, (size_t)bytes, st->cs);
    return e == cudaSuccess ? DT_OK : cuda_fail(d, op, "cudaMemsetAsync", e);
}

/* ----------------------------------------------------------------- tables */

static const dt_kernels_v1_t cuda_kernels = {
    .info = DT_KERNELS_INFO(dt_kernels_v1_t),
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .softmax_xent_forward = cuda_softmax_xent_forward,
    .softmax_xent_backward = cuda_softmax_xent_backward,
    .axpy = cuda_axpy,
    .sumsq = cuda_sumsq,
    .cast = cuda_cast,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .attention_state_bytes = cuda_attention_state_bytes,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .residual_forward = cuda_residual_forward,
    .scale = cuda_scale,
    .adamw_update = cuda_adamw_update,
    .sgd_update = cuda_sgd_update,
    /* the vocabulary-parallel kernels (tensor parallelism) */
    .vocab_embedding_forward = cuda_vocab_embedding_forward,
    .vocab_embedding_backward = cuda_vocab_embedding_backward,
    .vocab_xent_forward = cuda_vocab_xent_forward,
    .vocab_xent_backward = cuda_vocab_xent_backward,
    /* the LLaMA family's: compiled, not yet run on a GPU (cuda_llama.c) */
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
    .gqa_attention_forward = cuda_gqa_attention_forward,
    .gqa_attention_backward = cuda_gqa_attention_backward,
};

static const dt_kernels_v1_t *cuda_kernel_table(void) { return &cuda_kernels; }

static const dt_device_ops_v1_t cuda_ops = {
    .info = DT_PLUGIN_INFO(DEVICE, dt_device_ops_v1_t, "cuda", "1.0.0",
                           "NVIDIA GPU: CUDA kernels, cuBLASLt matmuls, a "
                           "caching allocator",
                           cuda_keys),
    .init = cuda_init,
    .finalize = cuda_finalize,
    .props = cuda_props,
    .kernels = cuda_kernel_table,
    .alloc = cuda_alloc_op,
    .free = cuda_free_op,
    .mem_stats = cuda_mem_stats,
    .mem_reset_peaks = cuda_mem_reset_peaks,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_sync = cuda_event_sync,
    .synchronize = cuda_synchronize,
    .memcpy_async = cuda_memcpy_async,
    .memset_async = cuda_memset_async,
    .native_stream = cuda_native_stream,
};

DT_PLUGIN_ENTRY(device, 1, dt_device_ops_v1_t, &cuda_ops)
