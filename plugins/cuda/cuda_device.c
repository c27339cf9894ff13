/*
 * plugins/cuda/cuda_device.c - the `cuda` device plugin: lifecycle (one
 * GPU per local rank), props, tagged device memory through the caching
 * allocator (cuda_alloc.c), pinned host memory, streams and events on CUDA
 * streams and events, asynchronous copies, the runtime table and the
 * kernel table.  Kernels: cuda_kernels.c (entry points and checks),
 * cuda_matmul.c (cuBLASLt), cuda_*.cu (device code).
 *
 * Status: compiled (sm_80, sm_90) and tested without a GPU only: the init
 * error on a machine without one, the keys, the allocator's bookkeeping.
 * None of it has run on a GPU yet.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    (void)ctx;
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
    (void)ctx;
    (void)cudaFreeHost(p);
}

/* Device memory or pinned host memory; `who` NULL for the ABI's calls. */
static int mem_get(dt_device_t *d, uint64_t bytes, int tag, int pinned,
                   void **out, const char *who)
{
    char err[640];
    *out = NULL;
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

/* A freed block may be handed out again at once, to work on any stream.
 * With only the default stream live, stream order already runs that work
 * after the work queued on the old owner; with more streams live, the
 * device is synchronized first (correct and slow: per-stream free lists
 * are the better design, not done yet). */
static int mem_put(dt_device_t *d, void *ptr, int pinned)
{
    const char *fn = pinned ? "host_free" : "free";
    if (!ptr)
        return DT_OK;
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
    if (!pinned && d->nstreams > 0) {
        cudaError_t e = cudaDeviceSynchronize();
        if (e != cudaSuccess) {
            pthread_mutex_unlock(&d->mem_mu);
            return cuda_fail(d, fn, "cudaDeviceSynchronize", e);
        }
    }
    cuda_alloc_put(mine, ptr);
    pthread_mutex_unlock(&d->mem_mu);
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
 * f32 on the CUDA cores (2 x 64 lanes on sm_80, 2 x 128 from sm_90), bf16
 * on the tensor cores (2048 on sm_80, 4096 on sm_90: 312 and 989 TFLOP/s
 * on A100 and H100 SXM at their boost clocks). */
static void peak_flops(int major, int sms, double ghz, double *f32,
                       double *bf16)
{
    double lanes = major >= 9 ? 128.0 : 64.0;
    double tc = major >= 9 ? 4096.0 : major >= 8 ? 2048.0 : 1024.0;
    *f32 = (double)sms * ghz * 1e9 * 2.0 * lanes;
    *bf16 = (double)sms * ghz * 1e9 * tc;
}

/* ------------------------------------------------------------- lifecycle */

/* Idempotent: what it released is NULL afterwards. */
static void stream_release(dt_device_t *d, dt_stream_t *s)
{
    if (s->cs)
        (void)cudaStreamDestroy(s->cs);
    if (s->workspace)
        cuda_mem_free(d, s->workspace);
    if (s->partials)
        cuda_mem_free(d, s->partials);
    if (s->wide)
        cuda_mem_free(d, s->wide);
    s->cs = NULL;
    s->workspace = NULL;
    s->partials = NULL;
    s->wide = NULL;
    s->wide_bytes = 0;
    s->magic = 0;
}

/* A stream with its scratch; the caller sets s->magic last. */
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
    if (rc != DT_OK)
        stream_release(d, s);
    return rc;
}

static void cuda_finalize(dt_device_t *d)
{
    if (!d)
        return;
    (void)cudaDeviceSynchronize();
    stream_release(d, &d->def);
    if (d->lt)
        cublasLtDestroy(d->lt);
    const cuda_alloc_stats_t *as = &d->dmem.st;
    char peak[32];
    d->host->log(d->host, DT_LOG_DEBUG,
                 "caching allocator: %" PRIu64 " cudaMalloc, %" PRIu64 " cudaFree, %" PRIu64
                 " requests served from the cache, emptied %" PRIu64 " time%s; peak in use %s",
                 as->raw_allocs, as->raw_frees, as->cache_hits, as->releases,
                 as->releases == 1 ? "" : "s", dt_mem_fmt_bytes(peak, as->tally.total_peak));
    uint64_t n = 0, bytes = 0, pn = 0, pbytes = 0;
    cuda_alloc_destroy(&d->dmem, &n, &bytes);
    cuda_alloc_destroy(&d->pmem, &pn, &pbytes);
    if (n || pn)
        d->host->log(d->host, DT_LOG_DEBUG,
                     "finalize: freed %" PRIu64 " device blocks (%" PRIu64
                     " bytes) and %" PRIu64 " pinned blocks (%" PRIu64
                     " bytes) still allocated", n, bytes, pn, pbytes);
    pthread_mutex_destroy(&d->mem_mu);
    free(d);
}

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
    int64_t key_index = -1, limit = 0;
    int caching = 1, tf32 = 0, deterministic = 0;
    if ((rc = dt_cfg_int(host, "device_index", -1, -1, &key_index)) != DT_OK ||
        (rc = dt_cfg_int(host, "memory_limit", 0, 0, &limit)) != DT_OK ||
        (rc = dt_cfg_bool(host, "caching", 1, &caching)) != DT_OK ||
        (rc = dt_cfg_bool(host, "tf32", 0, &tf32)) != DT_OK ||
        (rc = dt_cfg_bool(host, "deterministic", 0, &deterministic)) != DT_OK)
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
    d->index = index;
    d->tf32 = tf32;
    d->deterministic = deterministic;
    d->limit = (uint64_t)limit;
    pthread_mutex_init(&d->mem_mu, NULL);
    cuda_alloc_backend_t dbe = {.ctx = d, .raw_alloc = dev_raw_alloc,
                                .raw_free = dev_raw_free};
    cuda_alloc_backend_t pbe = {.ctx = d, .raw_alloc = pinned_raw_alloc,
                                .raw_free = pinned_raw_free};
    cuda_alloc_init(&d->dmem, &dbe, d->limit, caching);
    cuda_alloc_init(&d->pmem, &pbe, 0, 0);

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
    d->total_memory = (uint64_t)prop.totalGlobalMem;
    if (d->limit && d->limit < d->total_memory)
        d->total_memory = d->limit;
    peak_flops(prop.major, prop.multiProcessorCount, (double)clock_khz / 1e6,
               &d->peak_f32, &d->peak_bf16);
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
    pthread_mutex_lock(&d->mem_mu);
    d->nstreams++;
    pthread_mutex_unlock(&d->mem_mu);
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
    cudaError_t e = cudaStreamSynchronize(s->cs);
    if (e != cudaSuccess)
        return cuda_fail(d, "stream_destroy", "cudaStreamSynchronize", e);
    stream_release(d, s);
    free(s);
    pthread_mutex_lock(&d->mem_mu);
    d->nstreams--;
    pthread_mutex_unlock(&d->mem_mu);
    return DT_OK;
}

static int cuda_stream_sync(dt_device_t *d, dt_stream_t *s)
{
    if (!d)
        return DT_ERR_INVALID;
    dt_stream_t *st = cuda_stream(d, s, "stream_sync");
    if (!st)
        return DT_ERR_INVALID;
    cudaError_t e = cudaStreamSynchronize(st->cs);
    return e == cudaSuccess ? DT_OK
                            : cuda_fail(d, "stream_sync", "cudaStreamSynchronize", e);
}

static int cuda_event_create(dt_device_t *d, dt_event_t **out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CUDA_INVALID(d, "event_create: out is NULL");
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
    cudaError_t e = cudaEventSynchronize(ev->ev);
    return e == cudaSuccess ? DT_OK
                            : cuda_fail(d, "event_sync", "cudaEventSynchronize", e);
}

static int cuda_synchronize(dt_device_t *d)
{
    if (!d)
        return DT_ERR_INVALID;
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess
               ? DT_OK
               : cuda_fail(d, "synchronize", "cudaDeviceSynchronize", e);
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
};

static const dt_kernels_v1_t *cuda_kernel_table(void) { return &cuda_kernels; }

static const dt_device_ops_v1_t cuda_ops = {
    .info = DT_PLUGIN_INFO(DEVICE, dt_device_ops_v1_t, "cuda", "0.1.0",
                           "NVIDIA GPU: CUDA kernels, cuBLASLt matmuls, a "
                           "caching allocator (compiled, not yet run on a GPU)",
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
