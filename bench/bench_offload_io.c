/*
 * bench/bench_offload_io.c - the offload_nvme tier's raw write and read
 * throughput, through the offload ABI as a strategy drives it: the plugin
 * is found and loaded by the core's loader, its keys set like a config's
 * [offload_nvme] table (path, block_size, buffers, queue_depth, direct),
 * one buffer of N MiB allocated in it (its file reserved before timing),
 * then N MiB stored from host memory and loaded back in requests of
 * `request` bytes with `inflight` requests outstanding (each waited on in
 * order, the next submitted as one completes).  The tier splits every
 * request into block_size I/Os with `buffers` of them in flight, across
 * request boundaries (its worker starts the next request's I/Os while
 * the last ones of the current request run), so the device sees
 * `buffers` I/Os in flight whenever enough is outstanding: that is fio's
 * iodepth (bench_offload_fio.sh sets both to the same queue depth).
 *
 *   bench_offload_io --dir DIR [--mib N] [--bs BYTES] [--qd N]
 *                    [--request BYTES] [--inflight N] [--direct on|auto|off]
 *                    [--misalign BYTES]
 *
 * The host memory stored from and loaded into starts 4 KiB-aligned, so
 * the tier reads and writes it in place; --misalign 64 starts it 64 bytes
 * past that, as the cpu device's host_alloc (64-byte alignment) hands
 * the strategies their staging, so every block goes through the tier's
 * bounce buffers.
 *
 * Prints one line: "write_mib_s W read_mib_s R direct D" (MiB = 2^20
 * bytes, per second of wall time from the first submit to the last wait),
 * after checking the bytes read back equal the bytes written.  Exit 0, or
 * 1 with the tier's error on stderr, 2 for bad arguments.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "dtrain/dtrain.h"
#include "loader/loader.h"
#include "util/error.h"

typedef struct opts {
    const char *dir, *direct;
    uint64_t mib, bs, request, misalign;
    int64_t qd, inflight;
} opts_t;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define USAGE                                                                           \
    "usage: bench_offload_io --dir DIR [--mib N] [--bs BYTES (4096k)] [--qd N] "          \
    "[--request BYTES] [--inflight N] [--direct on|auto|off] [--misalign BYTES (< 4096)]\n"

/* 1: options in *o; 0: a usage error (printed); -1: --help (printed). */
static int parse(int argc, char **argv, opts_t *o)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(USAGE, stdout);
            return -1;
        }
    *o = (opts_t){.direct = "on", .mib = 256, .bs = 1 << 20, .request = 0, .qd = 4,
                  .inflight = 2};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        char *end = NULL;
        unsigned long long n = strtoull(v, &end, 10);
        int num = end != v && !*end;
        if (strcmp(k, "--dir") == 0)
            o->dir = v;
        else if (strcmp(k, "--direct") == 0)
            o->direct = v;
        else if (num && strcmp(k, "--mib") == 0)
            o->mib = n;
        else if (num && strcmp(k, "--bs") == 0)
            o->bs = n;
        else if (num && strcmp(k, "--request") == 0)
            o->request = n;
        else if (num && strcmp(k, "--qd") == 0)
            o->qd = (int64_t)n;
        else if (num && strcmp(k, "--misalign") == 0 && n < 4096)
            o->misalign = n;
        else if (num && strcmp(k, "--inflight") == 0)
            o->inflight = (int64_t)n;
        else {
            fprintf(stderr, "bench_offload_io: error: %s %s: unknown option or not a number\n",
                    k, v);
            return 0;
        }
    }
    if (argc % 2 == 0 || !o->dir || !o->mib || !o->bs || o->bs % 4096 || o->qd < 1 ||
        o->inflight < 1) {
        fputs(USAGE, stderr);
        return 0;
    }
    if (!o->request)
        o->request = 4 << 20; /* DT_OFFLOAD_PIECE f32: the strategies' piece */
    return 1;
}

/* One direction over the whole buffer: `store` 1 writes src, 0 reads into
 * dst; seconds in *s. */
static int stream(dt_offload_t *tier, dt_offload_buf_t *buf,
                  const opts_t *o, int store, char *mem, double *s)
{
    uint64_t total = o->mib << 20, next = 0;
    dt_offload_req_t **q = calloc((size_t)o->inflight, sizeof *q);
    if (!q)
        return dt_err_set(DT_ERR_NOMEM, "request ring");
    int rc = DT_OK;
    int64_t head = 0, n_out = 0;
    double t0 = now_s();
    while (rc == DT_OK && (next < total || n_out)) {
        while (rc == DT_OK && next < total && n_out < o->inflight) {
            uint64_t n = total - next < o->request ? total - next : o->request;
            dt_offload_req_t **slot = &q[(head + n_out) % o->inflight];
            rc = store ? dt_offload_ops(tier)->store(tier, buf, next, mem + next, n, DT_MEM_HOST,
                                                     NULL, slot)
                       : dt_offload_ops(tier)->load(tier, buf, next, mem + next, n, DT_MEM_HOST,
                                                    NULL, slot);
            if (rc == DT_OK) {
                next += n;
                n_out++;
            }
        }
        if (rc == DT_OK && n_out) {
            rc = dt_offload_ops(tier)->wait(tier, q[head], 60000);
            head = (head + 1) % o->inflight;
            n_out--;
        }
    }
    /* a failure: the rest are still waited on (wait frees them) */
    for (; n_out > 0; n_out--, head = (head + 1) % o->inflight)
        dt_offload_ops(tier)->wait(tier, q[head], 60000);
    *s = now_s() - t0;
    free(q);
    return rc;
}

int main(int argc, char **argv)
{
    opts_t o;
    int parsed = parse(argc, argv, &o);
    if (parsed <= 0)
        return parsed < 0 ? 0 : 2;
    dt_search_path_t *sp = NULL;
    dt_config_t *cfg = NULL;
    dt_plugin_t *pdev = NULL, *poff = NULL;
    dt_device_t *dev = NULL;
    dt_offload_t *tier = NULL;
    dt_offload_buf_t *buf = NULL;
    char *src_mem = NULL, *dst_mem = NULL, *src = NULL, *dst = NULL;
    uint64_t total = o.mib << 20;
    char set[5][4200];
    snprintf(set[0], sizeof set[0], "offload_nvme.path=%s", o.dir);
    snprintf(set[1], sizeof set[1], "offload_nvme.block_size=%llu", (unsigned long long)o.bs);
    snprintf(set[2], sizeof set[2], "offload_nvme.buffers=%lld", (long long)o.qd);
    snprintf(set[3], sizeof set[3], "offload_nvme.queue_depth=%lld", (long long)o.qd);
    snprintf(set[4], sizeof set[4], "offload_nvme.direct=%s", o.direct);
    int rc = dt_search_path_new(NULL, &sp);
    if (rc == DT_OK)
        rc = dt_plugin_load(sp, DT_KIND_DEVICE, "cpu", &pdev);
    if (rc == DT_OK)
        rc = dt_plugin_open(sp, DT_KIND_OFFLOAD, "offload_nvme", &poff);
    if (rc == DT_OK)
        rc = dt_config_new(&cfg);
    for (int k = 0; rc == DT_OK && k < 5; k++)
        rc = dt_config_override(cfg, set[k]);
    if (rc == DT_OK)
        rc = dt_config_apply_schema(cfg, "offload_nvme", poff->info->config_keys,
                                    poff->info->n_config_keys);
    if (rc == DT_OK)
        rc = dt_plugin_bind(poff, cfg);
    const dt_device_ops_t *dops = pdev ? pdev->ops : NULL;
    const dt_offload_ops_t *ops = poff ? poff->ops : NULL;
    dt_device_init_t da = {.struct_size = sizeof da, .local_size = 1, .device_index = -1};
    if (rc == DT_OK && (rc = dops->init(pdev->host, &da, &dev)) != DT_OK)
        dt_plugin_failed(pdev, rc, "init");
    char job[64];
    snprintf(job, sizeof job, "bench-io-%ld", (long)getpid());
    dt_offload_init_t oa = {
        .struct_size = sizeof oa, .job_id = job, .timeout_ms = 60000, .dev = dev};
    if (rc == DT_OK && (rc = ops->init(poff->host, &oa, &tier)) != DT_OK)
        dt_plugin_failed(poff, rc, "init");
    if (rc == DT_OK && (rc = ops->alloc(tier, total, DT_TAG_OFFLOAD, &buf)) != DT_OK)
        dt_plugin_failed(poff, rc, "alloc");
    if (rc == DT_OK && (posix_memalign((void **)&src_mem, 4096, total + o.misalign) ||
                        posix_memalign((void **)&dst_mem, 4096, total + o.misalign)))
        rc = dt_err_set(DT_ERR_NOMEM, "two buffers of %llu MiB", (unsigned long long)o.mib);
    double ws = 0, rs = 0;
    if (rc == DT_OK) {
        src = src_mem + o.misalign;
        dst = dst_mem + o.misalign;
        uint64_t x = 0x9e3779b97f4a7c15ull; /* not zeros: xorshift */
        for (uint64_t i = 0; i < total / 8; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            memcpy(src + 8 * i, &x, 8);
        }
        memset(dst, 0, total);
    }
    if (rc == DT_OK && (rc = stream(tier, buf, &o, 1, src, &ws)) != DT_OK)
        dt_plugin_failed(poff, rc, "store");
    if (rc == DT_OK && (rc = stream(tier, buf, &o, 0, dst, &rs)) != DT_OK)
        dt_plugin_failed(poff, rc, "load");
    if (rc == DT_OK && memcmp(src, dst, total) != 0)
        rc = dt_err_set(DT_ERR_IO, "the bytes read back differ from those written");
    if (rc == DT_OK) {
        /* direct "on": the tier refused to start without O_DIRECT */
        printf("write_mib_s %.1f read_mib_s %.1f direct %s\n", (double)o.mib / ws,
               (double)o.mib / rs, o.direct);
    } else {
        fprintf(stderr, "bench_offload_io: error: %s\n", dt_last_error());
    }
    if (buf)
        ops->free(tier, buf);
    if (tier)
        ops->finalize(tier);
    if (dev)
        dops->finalize(dev);
    free(src_mem);
    free(dst_mem);
    dt_plugin_unload(poff);
    dt_plugin_unload(pdev);
    dt_config_free(cfg);
    dt_search_path_free(sp);
    return rc == DT_OK ? 0 : 1;
}
