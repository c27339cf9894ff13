/*
 * sdk/lib/dt_hash.c - proving that replicated state really is the same
 * on every rank: a content hash of device memory and a collective
 * comparison of hashes that needs nothing but f32 MAX/MIN all-reduces
 * (which every communicator has; 64-bit integer reductions are not
 * guaranteed).
 */
#include "dtrain/sdk/hash.h"

#include <string.h>

#define FNV64_PRIME 0x100000001b3ull

uint64_t dt_hash64_update(uint64_t h, const void *p, size_t bytes)
{
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 4 <= bytes; i += 4) {
        /* assembled by hand: same value on any host byte order */
        uint32_t w = (uint32_t)b[i] | (uint32_t)b[i + 1] << 8 | (uint32_t)b[i + 2] << 16 |
                     (uint32_t)b[i + 3] << 24;
        h = (h ^ w) * FNV64_PRIME;
    }
    for (; i < bytes; i++)
        h = (h ^ b[i]) * FNV64_PRIME;
    return h;
}

int dt_hash_device(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s, const void *x,
                   uint64_t bytes, void *staging, uint64_t staging_bytes,
                   uint64_t *h)
{
    uint64_t chunk = staging_bytes / 8 * 8; /* keeps every chunk word-aligned */
    if (chunk == 0)
        return host->set_error(host, DT_ERR_INVALID, "hash: staging buffer of %llu bytes "
                               "(need >= 8)", (unsigned long long)staging_bytes);
    uint64_t acc = *h;
    for (uint64_t off = 0; off < bytes; off += chunk) {
        uint64_t n = bytes - off < chunk ? bytes - off : chunk;
        int rc = dt_device_ops(dev)->memcpy_async(dev, staging, (const char *)x + off, n,
                                                  DT_COPY_D2H, s);
        if (rc == DT_OK)
            rc = dt_device_ops(dev)->stream_sync(dev, s);
        if (rc != DT_OK) {
            host->log(host, DT_LOG_ERROR, "hash: copying %llu bytes at +%llu to the host failed",
                      (unsigned long long)n, (unsigned long long)off);
            return rc;
        }
        acc = dt_hash64_update(acc, staging, (size_t)n);
    }
    *h = acc;
    return DT_OK;
}

int dt_replica_check(const dt_host_v1_t *host, dt_comm_t *comm, dt_device_t *dev, dt_stream_t *s,
                     const uint64_t *hashes, uint32_t n, uint32_t *first_diff)
{
    *first_diff = n;
    if (n == 0)
        return DT_OK;
    uint64_t nf = (uint64_t)n * 4;      /* four 16-bit fields per hash */
    uint64_t bytes = nf * sizeof(float);
    float *hbuf = host->alloc(host, 3 * bytes, DT_TAG_OTHER); /* mine | max | min */
    if (!hbuf)
        return host->set_error(host, DT_ERR_NOMEM, "replica check: %llu host bytes",
                               (unsigned long long)(3 * bytes));
    void *dbuf = NULL;
    int rc = dt_device_ops(dev)->alloc(dev, 3 * bytes, DT_TAG_OTHER, &dbuf);
    if (rc != DT_OK) {
        host->free(host, hbuf);
        host->log(host, DT_LOG_ERROR, "replica check: allocating %llu device bytes failed",
                  (unsigned long long)(3 * bytes));
        return rc;
    }
    for (uint32_t i = 0; i < n; i++)
        for (int f = 0; f < 4; f++)
            hbuf[(uint64_t)i * 4 + f] = (float)((hashes[i] >> (16 * f)) & 0xffffu);
    float *dmine = dbuf, *dmax = dmine + nf, *dmin = dmax + nf;
    rc = dt_device_ops(dev)->memcpy_async(dev, dmine, hbuf, bytes, DT_COPY_H2D, s);
    if (rc == DT_OK)
        rc = dt_comm_ops(comm)->all_reduce(comm, dmine, dmax, nf, DT_F32, DT_OP_MAX, s, NULL);
    if (rc == DT_OK)
        rc = dt_comm_ops(comm)->all_reduce(comm, dmine, dmin, nf, DT_F32, DT_OP_MIN, s, NULL);
    if (rc == DT_OK)
        rc = dt_device_ops(dev)->memcpy_async(dev, hbuf + nf, dmax, 2 * bytes, DT_COPY_D2H, s);
    if (rc == DT_OK)
        rc = dt_device_ops(dev)->stream_sync(dev, s);
    if (rc == DT_OK) {
        for (uint64_t k = 0; k < nf; k++)
            if (hbuf[nf + k] != hbuf[2 * nf + k]) {
                *first_diff = (uint32_t)(k / 4);
                break;
            }
    } else {
        host->log(host, DT_LOG_ERROR, "replica check: comparing %u hashes across ranks "
                  "failed: %s", n, dt_status_name(rc));
    }
    dt_device_ops(dev)->free(dev, dbuf);
    host->free(host, hbuf);
    return rc;
}
