/*
 * plugins/cpu/cpu_device.c - the `cpu` device plugin: lifecycle, props,
 * tagged memory with a budget, streams and events, copies, the runtime
 * table and the kernel table.  Kernels live in cpu_kernels_*.c.  (Timing
 * them is the device interposer's work, for every device plugin:
 * `dtrain run --profile device`, core/interpose.)
 *
 * Everything runs synchronously on the calling thread (with the plugin's
 * thread pool and OpenBLAS's threads under it), which satisfies the
 * asynchronous contract of dtrain/device.h: by the time a call returns its
 * work is done, so every event is complete as soon as it is recorded.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cblas.h>

#include "cpu_internal.h"
#include "dtrain/sdk/cfg.h"

#define CPU_TOMBSTONE ((void *)(uintptr_t)1)
#define CPU_MAX_THREADS 1024
#define CPU_MAX_LIMIT 4611686018427387904.0 /* 2^62 */

/* ---------------------------------------------------------------- memory */

static uint64_t ptr_hash(const void *p)
{
    /* Blocks are 64-byte aligned: drop the always-zero bits, then mix. */
    return ((uint64_t)(uintptr_t)p >> 6) * 0x9E3779B97F4A7C15ull;
}

/* Slot holding `p`, or NULL. */
static cpu_block_t *block_find(dt_device_t *d, const void *p)
{
    if (!d->blocks)
        return NULL;
    uint64_t mask = d->nblocks_cap - 1;
    for (uint64_t i = ptr_hash(p) & mask;; i = (i + 1) & mask) {
        cpu_block_t *b = &d->blocks[i];
        if (b->ptr == NULL)
            return NULL;
        if (b->ptr == p)
            return b;
    }
}

static void block_put(cpu_block_t *tab, uint64_t cap, void *p, uint64_t bytes,
                      int tag, int pinned)
{
    uint64_t mask = cap - 1;
    uint64_t i = ptr_hash(p) & mask;
    while (tab[i].ptr != NULL && tab[i].ptr != CPU_TOMBSTONE)
        i = (i + 1) & mask;
    tab[i] = (cpu_block_t){.ptr = p, .bytes = bytes, .tag = tag, .pinned = pinned};
}

/* Make room for one more entry (keeps the load factor under 1/2). */
static int blocks_reserve(dt_device_t *d)
{
    if ((d->nblocks_used + 1) * 2 <= d->nblocks_cap)
        return 0;
    uint64_t cap = d->nblocks_cap ? d->nblocks_cap : 64;
    uint64_t live = 0;
    for (uint64_t i = 0; i < d->nblocks_cap; i++)
        if (d->blocks[i].ptr && d->blocks[i].ptr != CPU_TOMBSTONE)
            live++;
    while ((live + 1) * 4 > cap) /* rehash to at most 1/4 full */
        cap *= 2;
    cpu_block_t *tab = calloc(cap, sizeof *tab);
    if (!tab)
        return ENOMEM;
    for (uint64_t i = 0; i < d->nblocks_cap; i++)
        if (d->blocks[i].ptr && d->blocks[i].ptr != CPU_TOMBSTONE)
            block_put(tab, cap, d->blocks[i].ptr, d->blocks[i].bytes,
                      d->blocks[i].tag, d->blocks[i].pinned);
    free(d->blocks);
    d->blocks = tab;
    d->nblocks_cap = cap;
    d->nblocks_used = live;
    return 0;
}

/* Called with mem_mu held: the budget error, with every tag in use.
 * `who` ("matmul_forward: scratch") prefixes it when the plugin itself
 * allocates; NULL for the ABI's alloc. */
static int budget_error(dt_device_t *d, uint64_t bytes, int tag,
                        const char *who)
{
    char text[768];
    dt_mem_tally_budget_text(&d->mem, bytes, tag, d->limit, text, sizeof text);
    return d->host->set_error(d->host, DT_ERR_NOMEM, "%s%s%s", who ? who : "",
                              who ? ": " : "", text);
}

/* A cached block of exactly `bytes`, or NULL.  Called with mem_mu held. */
static void *cache_take(dt_device_t *d, uint64_t bytes)
{
    if (bytes < CPU_CACHE_MIN_BYTES)
        return NULL;
    for (int i = 0; i < CPU_CACHE_SLOTS; i++)
        if (d->cache[i].ptr && d->cache[i].bytes == bytes) {
            void *p = d->cache[i].ptr;
            d->cache[i].ptr = NULL;
            d->cached_bytes -= bytes;
            return p;
        }
    return NULL;
}

/* Keep a freed block for reuse when it is large and fits the cache (and
 * the budget: live + cached stays within memory_limit); 0 when the caller
 * must free it.  Called with mem_mu held. */
static int cache_put(dt_device_t *d, void *p, uint64_t bytes)
{
    if (bytes < CPU_CACHE_MIN_BYTES || d->cached_bytes + bytes > CPU_CACHE_MAX_BYTES ||
        (d->limit && d->mem.total_current + d->cached_bytes + bytes > d->limit))
        return 0;
    for (int i = 0; i < CPU_CACHE_SLOTS; i++)
        if (!d->cache[i].ptr) {
            d->cache[i] = (cpu_cached_t){p, bytes};
            d->cached_bytes += bytes;
            return 1;
        }
    return 0;
}

static void cache_release(dt_device_t *d)
{
    for (int i = 0; i < CPU_CACHE_SLOTS; i++) {
        free(d->cache[i].ptr);
        d->cache[i].ptr = NULL;
    }
    d->cached_bytes = 0;
}

/* Memory from the host's allocator: 64-byte aligned, and a block of 2 MiB
 * or more on 2 MiB boundaries with transparent huge pages asked for
 * (MADV_HUGEPAGE; ignored where the kernel has them off): element-wise
 * kernels streaming several large arrays (AdamW reads four, writes three)
 * run at the memory's speed instead of the page walker's, 15-20 % faster
 * on AdamW here (bench/results/offload.md).  bytes == 0 still gets a real
 * (smallest) block, so the pointer is unique and can be freed like any
 * other. */
static int host_memalign(void **p, uint64_t bytes)
{
    const size_t huge = (size_t)2 << 20;
    if (bytes < huge)
        return posix_memalign(p, 64, bytes ? (size_t)bytes : 64);
    int e = posix_memalign(p, huge, (size_t)bytes);
    if (e == 0)
        (void)madvise(*p, (size_t)bytes, MADV_HUGEPAGE);
    return e;
}

/* Device memory (pinned = 0: the budget and the block cache apply) or
 * pinned host memory (pinned = 1: accounted apart, outside the budget). */
static int mem_alloc(dt_device_t *d, uint64_t bytes, int tag, int pinned,
                     void **out, const char *who)
{
    const char *sep = who ? ": " : "";
    const char *fn = pinned ? "host_alloc" : "alloc";
    who = who ? who : "";
    *out = NULL;
    if (tag < 0 || tag >= DT_TAG_COUNT)
        return CPU_INVALID(d, "%s%s%s: tag %d is not a dt_mem_tag_t (0..%d)",
                           who, sep, fn, tag, DT_TAG_COUNT - 1);
    char req[32];
    if (bytes > (uint64_t)SIZE_MAX - 64)
        return d->host->set_error(d->host, DT_ERR_NOMEM,
                                  "%s%s%s: %" PRIu64 " bytes for %s is more "
                                  "than this machine can address",
                                  who, sep, fn, bytes, dt_mem_tag_name(tag));
    pthread_mutex_lock(&d->mem_mu);
    /* total_current never exceeds the limit, so this cannot wrap. */
    if (!pinned && d->limit && bytes > d->limit - d->mem.total_current) {
        int rc = budget_error(d, bytes, tag, *who ? who : NULL);
        pthread_mutex_unlock(&d->mem_mu);
        return rc;
    }
    if (blocks_reserve(d) != 0) {
        pthread_mutex_unlock(&d->mem_mu);
        return d->host->set_error(d->host, DT_ERR_NOMEM,
                                  "%s%s%s: no memory for the allocation "
                                  "table", who, sep, fn);
    }
    void *p = NULL;
    int e;
    if (!pinned && d->guard) { /* guard_memory: from the arena, no cache */
        e = cpu_guard_take(d, bytes, &p);
        goto taken;
    }
    p = pinned ? NULL : cache_take(d, bytes);
    /* the budget emulates a device's memory: cached blocks give way */
    if (!p && !pinned && d->limit &&
        d->mem.total_current + d->cached_bytes + bytes > d->limit)
        cache_release(d);
    e = p ? 0 : host_memalign(&p, bytes);
    if (e != 0 && d->cached_bytes) { /* the host is short: give the cache back */
        cache_release(d);
        e = host_memalign(&p, bytes);
    }
taken:
    if (e != 0) {
        pthread_mutex_unlock(&d->mem_mu);
        return d->host->set_error(d->host, DT_ERR_NOMEM,
                                  "%s%s%s: allocating %s for %s failed: %s",
                                  who, sep, fn, dt_mem_fmt_bytes(req, bytes),
                                  dt_mem_tag_name(tag), strerror(e));
    }
    block_put(d->blocks, d->nblocks_cap, p, bytes, tag, pinned);
    d->nblocks_used++;
    dt_mem_tally_add(pinned ? &d->pinned_mem : &d->mem, tag, bytes);
    pthread_mutex_unlock(&d->mem_mu);
    *out = p;
    return DT_OK;
}

int cpu_mem_alloc(dt_device_t *d, uint64_t bytes, int tag, void **out)
{
    return mem_alloc(d, bytes, tag, 0, out, NULL);
}

/* Free a block of the kind `pinned` says; the other kind is refused (a
 * pinned block freed as device memory would be counted wrong). */
static int mem_free(dt_device_t *d, void *ptr, int pinned)
{
    const char *fn = pinned ? "host_free" : "free";
    if (!ptr)
        return DT_OK;
    pthread_mutex_lock(&d->mem_mu);
    cpu_block_t *b = block_find(d, ptr);
    if (!b || b->pinned != pinned) {
        int other = b != NULL;
        pthread_mutex_unlock(&d->mem_mu);
        if (other)
            return CPU_INVALID(d, "%s: %p is %s (free it with %s)", fn, ptr,
                               pinned ? "device memory from alloc"
                                      : "pinned host memory from host_alloc",
                               pinned ? "free" : "host_free");
        return CPU_INVALID(d, "%s: %p was not allocated by this device "
                              "(or was already freed)", fn, ptr);
    }
    dt_mem_tally_sub(pinned ? &d->pinned_mem : &d->mem, b->tag, b->bytes);
    b->ptr = CPU_TOMBSTONE;
    if (!pinned && d->guard) {
        cpu_guard_give(d, ptr, b->bytes);
        pthread_mutex_unlock(&d->mem_mu);
        return DT_OK;
    }
    int kept = !pinned && cache_put(d, ptr, b->bytes);
    pthread_mutex_unlock(&d->mem_mu);
    if (!kept)
        free(ptr);
    return DT_OK;
}

int cpu_mem_free(dt_device_t *d, void *ptr) { return mem_free(d, ptr, 0); }

int cpu_scratch(dt_device_t *d, uint64_t bytes, void **out, const char *op)
{
    if (bytes <= d->scratch_bytes) {
        *out = d->scratch;
        return DT_OK;
    }
    if (d->scratch) {
        cpu_mem_free(d, d->scratch);
        d->scratch = NULL;
        d->scratch_bytes = 0;
    }
    char who[96];
    snprintf(who, sizeof who, "%s: scratch", op);
    void *p = NULL;
    int rc = mem_alloc(d, bytes, DT_TAG_STAGING, 0, &p, who);
    if (rc != DT_OK)
        return rc;
    d->scratch = p;
    d->scratch_bytes = bytes;
    *out = p;
    return DT_OK;
}

int cpu_dtype_refused(dt_device_t *d, const char *op, const char *got,
                      const char *runs)
{
    return d->host->set_error(d->host, DT_ERR_UNSUPPORTED,
                              "%s: %s: unsupported (the cpu device runs %s)", op,
                              got, runs);
}

int cpu_check_product(dt_device_t *d, const char *op, int64_t a, int64_t b,
                      int64_t *out)
{
    if (a < 0 || b < 0 || (a && b > INT64_MAX / a))
        return CPU_INVALID(d, "%s: size %lld x %lld overflows", op,
                           (long long)a, (long long)b);
    *out = a * b;
    return DT_OK;
}

int cpu_check_stream(dt_device_t *d, dt_stream_t *s, const char *op)
{
    if (s && (s->magic != CPU_STREAM_MAGIC || s->dev != d))
        return CPU_INVALID(d, "%s: stream %p is not a live stream of this "
                              "device", op, (void *)s);
    return DT_OK;
}

/* ---------------------------------------------------------------- config */

static const dt_config_key_t cpu_keys[] = {
    {.name = "threads", .type = DT_CFG_INT, .def = "0", .min = 0,
     .max = CPU_MAX_THREADS, .choices = NULL,
     .doc = "compute threads (kernels and OpenBLAS); 0 = online cores / "
            "local ranks, at least 1"},
    {.name = "memory_limit", .type = DT_CFG_INT, .def = "0", .min = 0,
     .max = CPU_MAX_LIMIT, .choices = NULL,
     .doc = "memory budget in bytes for device allocations; 0 = none"},
    {.name = "guard_memory", .type = DT_CFG_BOOL, .def = "false", .choices = NULL,
     .doc = "device memory the host cannot touch outside the device's kernels and "
            "copies, as on a GPU: a host access faults (SIGSEGV); for tests with small "
            "models, one rank"},
};

/* ----------------------------------------------------------------- props */

/* "0.3.21" from "OpenBLAS 0.3.21 DYNAMIC_ARCH ...". */
static void openblas_version(char *buf, size_t n)
{
    const char *cfg = openblas_get_config();
    snprintf(buf, n, "?");
    if (!cfg)
        return;
    const char *v = strchr(cfg, ' ');
    if (!v)
        return;
    v++;
    size_t len = strcspn(v, " ");
    snprintf(buf, n, "%.*s", (int)len, v);
}

/* ------------------------------------------------------------- lifecycle */

static void cpu_finalize(dt_device_t *d)
{
    if (!d)
        return;
    if (d->scratch)
        cpu_mem_free(d, d->scratch);
    uint64_t leaked = 0, nleaked = 0;
    for (uint64_t i = 0; i < d->nblocks_cap; i++) {
        cpu_block_t *b = &d->blocks[i];
        if (b->ptr && b->ptr != CPU_TOMBSTONE) {
            leaked += b->bytes;
            nleaked++;
            if (b->pinned || !d->guard) /* the arena goes whole below */
                free(b->ptr);
        }
    }
    if (nleaked)
        d->host->log(d->host, DT_LOG_DEBUG,
                     "finalize: freed %" PRIu64 " blocks (%" PRIu64 " bytes) "
                     "still allocated", nleaked, leaked);
    cache_release(d);
    cpu_guard_fini(d);
    cpu_pool_destroy(d->pool);
    free(d->blocks);
    pthread_mutex_destroy(&d->kmu);
    pthread_mutex_destroy(&d->mem_mu);
    free(d);
}

/* Defined below; every handle this plugin makes starts with it. */
static const dt_device_ops_v1_t cpu_ops;

static int cpu_init(const dt_host_v1_t *host, const dt_device_init_v1_t *args,
                    dt_device_t **out)
{
    if (!host || !out)
        return DT_ERR_INVALID;
    *out = NULL;
    dt_device_init_v1_t a;
    int rc = dt_args_read(host, "init args", &a, sizeof a, args, DT_DEVICE_INIT_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    int64_t threads = 0, limit = 0;
    int guard = 0;
    if ((rc = dt_cfg_int(host, "threads", &threads)) != DT_OK ||
        (rc = dt_cfg_int(host, "memory_limit", &limit)) != DT_OK ||
        (rc = dt_cfg_bool(host, "guard_memory", &guard)) != DT_OK)
        return rc;
    int local_size = a.local_size > 0 ? a.local_size : 1;
    if (threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        threads = online > 0 ? online / local_size : 1;
        if (threads < 1)
            threads = 1;
    }

    dt_device_t *d = calloc(1, sizeof *d);
    if (!d)
        return host->set_error(host, DT_ERR_NOMEM, "init: out of memory");
    d->host = host;
    d->ops = &cpu_ops;
    d->threads = (int)threads;
    d->limit = (uint64_t)limit;
    pthread_mutex_init(&d->mem_mu, NULL);
    pthread_mutex_init(&d->kmu, NULL);
    int e = cpu_pool_create(d->threads, &d->pool);
    if (e != 0) {
        pthread_mutex_destroy(&d->kmu);
        pthread_mutex_destroy(&d->mem_mu);
        free(d);
        return host->set_error(host, DT_ERR_SYSTEM,
                               "init: starting %lld worker threads: %s",
                               (long long)threads, strerror(e));
    }
    /* OpenBLAS single-threaded: the pool splits each sgemm (see
     * cpu_kernels_matmul.c for why).  Process-wide, like the setting. */
    openblas_set_num_threads(1);

    char ver[32];
    openblas_version(ver, sizeof ver);
    snprintf(d->name, sizeof d->name, "cpu (%d thread%s, OpenBLAS %s)",
             d->threads, d->threads == 1 ? "" : "s", ver);
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
    d->total_memory =
        pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
    if (d->limit && (d->total_memory == 0 || d->limit < d->total_memory))
        d->total_memory = d->limit;
    if (guard && (rc = cpu_guard_init(d)) != DT_OK) {
        cpu_finalize(d);
        return rc;
    }
    d->guard = guard;
    const char *how = "";
    d->peak_flops = (double)d->threads * cpu_peak_flops_per_thread(&how);
    host->log(host, DT_LOG_INFO, "%s, memory_limit %llu bytes%s", d->name,
              (unsigned long long)d->limit,
              guard ? ", guard_memory (device memory closed to the host)" : "");
    host->log(host, DT_LOG_DEBUG, "peak %.1f GFLOP/s f32 for MFU: %d thread%s x %.1f (%s)",
              d->peak_flops * 1e-9, d->threads, d->threads == 1 ? "" : "s",
              d->peak_flops * 1e-9 / d->threads, how);
    *out = d;
    return DT_OK;
}

static int cpu_props(dt_device_t *d, dt_device_props_v1_t *out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CPU_INVALID(d, "props: out is NULL");
    dt_device_props_v1_t p = {.struct_size = sizeof p};
    snprintf(p.name, sizeof p.name, "%s", d->name);
    p.total_memory = d->total_memory;
    p.peak_flops_f32 = d->peak_flops;
    /* bf16 weights are widened and multiplied in f32: same rate. */
    p.peak_flops_bf16 = d->peak_flops;
    p.host_visible = !d->guard; /* guard_memory: as a GPU's */
    p.threads = d->threads;
    return dt_result_write(d->host, "props", out, &p, sizeof p, DT_DEVICE_PROPS_V1_SIZE0);
}

/* --------------------------------------------------------- memory (ABI) */

static int cpu_alloc(dt_device_t *d, uint64_t bytes, int tag, void **out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CPU_INVALID(d, "alloc: out is NULL");
    return cpu_mem_alloc(d, bytes, tag, out);
}

static int cpu_free(dt_device_t *d, void *ptr)
{
    if (!d)
        return DT_ERR_INVALID;
    return cpu_mem_free(d, ptr);
}

static int cpu_host_alloc(dt_device_t *d, uint64_t bytes, int tag, void **out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CPU_INVALID(d, "host_alloc: out is NULL");
    return mem_alloc(d, bytes, tag, 1, out, NULL);
}

static int cpu_host_free(dt_device_t *d, void *ptr)
{
    if (!d)
        return DT_ERR_INVALID;
    return mem_free(d, ptr, 1);
}

static int cpu_mem_stats(dt_device_t *d, dt_mem_stats_t *out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CPU_INVALID(d, "mem_stats: out is NULL");
    dt_mem_stats_v1_t st;
    pthread_mutex_lock(&d->mem_mu);
    dt_mem_tally_stats(&d->mem, &d->pinned_mem, d->limit, &st);
    pthread_mutex_unlock(&d->mem_mu);
    return dt_result_write(d->host, "mem_stats", out, &st, sizeof st, DT_MEM_STATS_V1_SIZE0);
}

static int cpu_mem_reset_peaks(dt_device_t *d)
{
    if (!d)
        return DT_ERR_INVALID;
    pthread_mutex_lock(&d->mem_mu);
    dt_mem_tally_reset_peaks(&d->mem);
    dt_mem_tally_reset_peaks(&d->pinned_mem);
    pthread_mutex_unlock(&d->mem_mu);
    return DT_OK;
}

/* ---------------------------------------------------- streams and events */

static int check_event(dt_device_t *d, dt_event_t *e, const char *op)
{
    if (!e || e->magic != CPU_EVENT_MAGIC || e->dev != d)
        return CPU_INVALID(d, "%s: event %p is not a live event of this device",
                           op, (void *)e);
    return DT_OK;
}

static int cpu_stream_create(dt_device_t *d, dt_stream_t **out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CPU_INVALID(d, "stream_create: out is NULL");
    dt_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return d->host->set_error(d->host, DT_ERR_NOMEM,
                                  "stream_create: out of memory");
    s->magic = CPU_STREAM_MAGIC;
    s->dev = d;
    *out = s;
    return DT_OK;
}

static int cpu_stream_destroy(dt_device_t *d, dt_stream_t *s)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!s)
        return CPU_INVALID(d, "stream_destroy: the default stream (NULL) "
                              "cannot be destroyed");
    int rc = cpu_check_stream(d, s, "stream_destroy");
    if (rc != DT_OK)
        return rc;
    s->magic = 0;
    free(s);
    return DT_OK;
}

/* Waits for a kernel another thread may be running on this device; work
 * issued from this thread is already done. */
static int cpu_stream_sync(dt_device_t *d, dt_stream_t *s)
{
    if (!d)
        return DT_ERR_INVALID;
    int rc = cpu_check_stream(d, s, "stream_sync");
    if (rc != DT_OK)
        return rc;
    cpu_lock(d);
    cpu_unlock(d);
    return DT_OK;
}

static int cpu_event_create(dt_device_t *d, dt_event_t **out)
{
    if (!d)
        return DT_ERR_INVALID;
    if (!out)
        return CPU_INVALID(d, "event_create: out is NULL");
    dt_event_t *e = calloc(1, sizeof *e);
    if (!e)
        return d->host->set_error(d->host, DT_ERR_NOMEM,
                                  "event_create: out of memory");
    e->magic = CPU_EVENT_MAGIC;
    e->dev = d;
    *out = e;
    return DT_OK;
}

static int cpu_event_destroy(dt_device_t *d, dt_event_t *e)
{
    if (!d)
        return DT_ERR_INVALID;
    int rc = check_event(d, e, "event_destroy");
    if (rc != DT_OK)
        return rc;
    e->magic = 0;
    free(e);
    return DT_OK;
}

static int cpu_event_record(dt_device_t *d, dt_event_t *e, dt_stream_t *s)
{
    if (!d)
        return DT_ERR_INVALID;
    int rc = check_event(d, e, "event_record");
    if (rc == DT_OK)
        rc = cpu_check_stream(d, s, "event_record");
    if (rc != DT_OK)
        return rc;
    e->recorded = 1;
    return DT_OK;
}

/* Everything before the event has already run, so there is nothing to
 * order; the handles are still checked. */
static int cpu_stream_wait_event(dt_device_t *d, dt_stream_t *s, dt_event_t *e)
{
    if (!d)
        return DT_ERR_INVALID;
    int rc = check_event(d, e, "stream_wait_event");
    if (rc == DT_OK)
        rc = cpu_check_stream(d, s, "stream_wait_event");
    return rc;
}

/* An event never recorded counts as complete (CUDA's rule too). */
static int cpu_event_sync(dt_device_t *d, dt_event_t *e)
{
    if (!d)
        return DT_ERR_INVALID;
    return check_event(d, e, "event_sync");
}

static int cpu_synchronize(dt_device_t *d)
{
    if (!d)
        return DT_ERR_INVALID;
    cpu_lock(d);
    cpu_unlock(d);
    return DT_OK;
}

/* ----------------------------------------------------------------- copies */

int cpu_memcpy_async(dt_device_t *d, void *dst, const void *src,
                     uint64_t bytes, int kind, dt_stream_t *s)
{
    static const char op[] = "memcpy_async";
    CPU_BEGIN(d, s, op);
    if (kind < DT_COPY_H2D || kind > DT_COPY_H2H)
        return CPU_INVALID(d, "%s: kind %d is not a dt_copy_kind_t", op, kind);
    if (bytes && (!dst || !src))
        return CPU_INVALID(d, "%s: %s is NULL (%" PRIu64 " bytes)", op,
                           dst ? "src" : "dst", bytes);
    if (!bytes)
        return DT_OK;
    /* Host and device memory are the same here; memmove because nothing in
     * the contract forbids overlap and memcpy would be undefined. */
    if (!d->guard) {
        memmove(dst, src, (size_t)bytes);
        return DT_OK;
    }
    int rc = cpu_guard_check_copy(d, op, dst, src, bytes, kind);
    if (rc == DT_OK && (rc = cpu_guard_open(d, op)) == DT_OK) {
        memmove(dst, src, (size_t)bytes);
        rc = cpu_guard_close(d, op);
    }
    return rc;
}

int cpu_memset_async(dt_device_t *d, void *dst, int value, uint64_t bytes,
                     dt_stream_t *s)
{
    static const char op[] = "memset_async";
    CPU_BEGIN(d, s, op);
    if (bytes && !dst)
        return CPU_INVALID(d, "%s: dst is NULL (%" PRIu64 " bytes)", op, bytes);
    if (!bytes)
        return DT_OK;
    if (!d->guard) {
        memset(dst, value, (size_t)bytes);
        return DT_OK;
    }
    int rc = cpu_guard_check_copy(d, op, dst, NULL, bytes, DT_COPY_D2D);
    if (rc == DT_OK && (rc = cpu_guard_open(d, op)) == DT_OK) {
        memset(dst, value, (size_t)bytes);
        rc = cpu_guard_close(d, op);
    }
    return rc;
}

/* ----------------------------------------------------------------- tables */

static const dt_device_ops_v1_t cpu_ops = {
    .info = DT_PLUGIN_INFO(DEVICE, dt_device_ops_v1_t, "cpu", "1.0.0",
                           "host CPU: OpenBLAS sgemm plus threaded C kernels",
                           cpu_keys),
    .init = cpu_init,
    .finalize = cpu_finalize,
    .props = cpu_props,
    .kernels = cpu_kernel_table,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .mem_stats = cpu_mem_stats,
    .mem_reset_peaks = cpu_mem_reset_peaks,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_sync = cpu_event_sync,
    .synchronize = cpu_synchronize,
    .memcpy_async = cpu_memcpy_async,
    .memset_async = cpu_memset_async,
    .native_stream = NULL, /* optional; the cpu has no native queue */
};

DT_PLUGIN_ENTRY(device, 1, dt_device_ops_v1_t, &cpu_ops)
