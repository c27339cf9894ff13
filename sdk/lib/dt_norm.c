/*
 * sdk/lib/dt_norm.c - gradient norms: a sum of squares on the device
 * brought to the host, and its sum across a group; the same sum over host
 * memory fed piece by piece (a gradient in an offload tier).
 */
#include <string.h>

#include "dtrain/sdk/norm.h"

int dt_norm_sumsq(const dt_host_v1_t *host, const dt_device_ops_v1_t *ops,
                  dt_device_t *dev, dt_stream_t *s, double *slot,
                  const void *x, int dtype, int64_t n, double *out)
{
    double h = 0.0;
    int rc = ops->kernels()->sumsq(dev, s, slot, x, dtype, n);
    if (rc == DT_OK)
        rc = ops->memcpy_async(dev, &h, slot, sizeof h, DT_COPY_D2H, s);
    if (rc == DT_OK)
        rc = ops->stream_sync(dev, s);
    if (rc != DT_OK) {
        host->log(host, DT_LOG_ERROR, "sum of squares over %lld %s elements failed: %s",
                  (long long)n, dt_dtype_name(dtype), dt_status_name(rc));
        return rc;
    }
    *out = h;
    return DT_OK;
}

int dt_norm_allreduce(const dt_host_v1_t *host, const dt_comm_ops_v1_t *cops,
                      dt_comm_t *comm, const dt_device_ops_v1_t *ops,
                      dt_device_t *dev, dt_stream_t *s, double *slot,
                      double *sumsq)
{
    double h = *sumsq;
    int rc = ops->memcpy_async(dev, slot, &h, sizeof h, DT_COPY_H2D, s);
    if (rc == DT_OK)
        rc = ops->stream_sync(dev, s); /* h lives on this stack frame */
    if (rc == DT_OK)
        rc = cops->all_reduce(comm, slot, slot, 1, DT_F64, DT_OP_SUM, s, NULL);
    if (rc == DT_OK)
        rc = ops->memcpy_async(dev, &h, slot, sizeof h, DT_COPY_D2H, s);
    if (rc == DT_OK)
        rc = ops->stream_sync(dev, s);
    if (rc != DT_OK) {
        host->log(host, DT_LOG_ERROR, "all-reducing the gradient norm failed: %s",
                  dt_status_name(rc));
        return rc;
    }
    *sumsq = h;
    return DT_OK;
}

void dt_sumsq_run_init(dt_sumsq_run_t *r, int64_t n)
{
    memset(r, 0, sizeof *r);
    r->block = dt_sumsq_block(n);
}

/* The block's eight running sums, pairwise (the kernel's order). */
static double block_sum(const double *a)
{
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

void dt_sumsq_run_add(dt_sumsq_run_t *r, const float *x, uint64_t k)
{
    for (uint64_t i = 0; i < k; i++) {
        double xv = (double)x[i];
        r->acc[r->pos & 7] += xv * xv;
        if (++r->pos == r->block) {
            r->total += block_sum(r->acc);
            memset(r->acc, 0, sizeof r->acc);
            r->pos = 0;
        }
    }
}

double dt_sumsq_run_end(dt_sumsq_run_t *r)
{
    if (r->pos) {
        r->total += block_sum(r->acc);
        memset(r->acc, 0, sizeof r->acc);
        r->pos = 0;
    }
    return r->total;
}
