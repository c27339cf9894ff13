/*
 * sdk/lib/dt_norm.c - gradient norms: a sum of squares on the device
 * brought to the host, its sum across a group, a norm plan's parts less
 * their skip ranges; the same sum over host memory fed piece by piece (a
 * gradient in an offload tier).
 */
#include <string.h>

#include "dtrain/sdk/norm.h"

int dt_norm_sumsq(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s, double *slot,
                  const void *x, int dtype, int64_t n, double *out)
{
    double h = 0.0;
    int rc = dt_device_ops(dev)->kernels()->sumsq(dev, s, slot, x, dtype, n);
    if (rc == DT_OK)
        rc = dt_device_ops(dev)->memcpy_async(dev, &h, slot, sizeof h, DT_COPY_D2H, s);
    if (rc == DT_OK)
        rc = dt_device_ops(dev)->stream_sync(dev, s);
    if (rc != DT_OK) {
        host->log(host, DT_LOG_ERROR, "sum of squares over %lld %s elements failed: %s",
                  (long long)n, dt_dtype_name(dtype), dt_status_name(rc));
        return rc;
    }
    *out = h;
    return DT_OK;
}

int dt_norm_allreduce(const dt_host_v1_t *host, dt_comm_t *comm, dt_device_t *dev, dt_stream_t *s,
                      double *slot, double *sumsq)
{
    double h = *sumsq;
    int rc = dt_device_ops(dev)->memcpy_async(dev, slot, &h, sizeof h, DT_COPY_H2D, s);
    if (rc == DT_OK)
        rc = dt_device_ops(dev)->stream_sync(dev, s); /* h lives on this stack frame */
    if (rc == DT_OK)
        rc = dt_comm_ops(comm)->all_reduce(comm, slot, slot, 1, DT_F64, DT_OP_SUM, s, NULL);
    if (rc == DT_OK)
        rc = dt_device_ops(dev)->memcpy_async(dev, &h, slot, sizeof h, DT_COPY_D2H, s);
    if (rc == DT_OK)
        rc = dt_device_ops(dev)->stream_sync(dev, s);
    if (rc != DT_OK) {
        host->log(host, DT_LOG_ERROR, "all-reducing the gradient norm failed: %s",
                  dt_status_name(rc));
        return rc;
    }
    *sumsq = h;
    return DT_OK;
}

/* Room for one more entry in a table of `size`-byte entries. */
static int grow(const dt_host_v1_t *host, void **tab, uint32_t n, uint32_t *cap, size_t size,
                const char *what)
{
    if (n < *cap)
        return DT_OK;
    uint32_t c = *cap ? 2 * *cap : 8;
    void *t = host->alloc(host, (uint64_t)c * size, DT_TAG_OTHER);
    if (!t)
        return host->set_error(host, DT_ERR_NOMEM, "norm plan: %u %s", c, what);
    if (n)
        memcpy(t, *tab, (size_t)n * size);
    if (*tab)
        host->free(host, *tab);
    *tab = t;
    *cap = c;
    return DT_OK;
}

int dt_norm_plan_part(const dt_host_v1_t *host, dt_norm_plan_t *p, dt_range_t sum)
{
    void *t = p->parts;
    int rc = grow(host, &t, p->n_parts, &p->cap_parts, sizeof *p->parts, "parts");
    p->parts = t;
    if (rc == DT_OK)
        p->parts[p->n_parts++] = (dt_norm_part_t){.sum = sum, .skip_lo = p->n_skip};
    return rc;
}

int dt_norm_plan_skip(const dt_host_v1_t *host, dt_norm_plan_t *p, dt_range_t r)
{
    if (p->n_parts == 0)
        return host->set_error(host, DT_ERR_INVALID, "norm plan: a skip range before any part");
    void *t = p->skip;
    int rc = grow(host, &t, p->n_skip, &p->cap_skip, sizeof *p->skip, "skip ranges");
    p->skip = t;
    if (rc == DT_OK) {
        p->skip[p->n_skip++] = r;
        p->parts[p->n_parts - 1].n_skip++;
    }
    return rc;
}

void dt_norm_plan_free(const dt_host_v1_t *host, dt_norm_plan_t *p)
{
    if (p->parts)
        host->free(host, p->parts);
    if (p->skip)
        host->free(host, p->skip);
    memset(p, 0, sizeof *p);
}

int dt_norm_plan_sumsq(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s, double *slot,
                       const float *x, const dt_norm_plan_t *plan, double *out)
{
    int rc = DT_OK;
    double ss = 0.0;
    for (uint32_t i = 0; rc == DT_OK && i < plan->n_parts; i++) {
        const dt_norm_part_t *pt = &plan->parts[i];
        double part = 0.0, skipped = 0.0;
        rc = dt_norm_sumsq(host, dev, s, slot, x + pt->sum.offset, DT_F32,
                           (int64_t)pt->sum.count, &part);
        for (uint32_t k = pt->skip_lo; rc == DT_OK && k < pt->skip_lo + pt->n_skip; k++) {
            double one = 0.0;
            rc = dt_norm_sumsq(host, dev, s, slot, x + plan->skip[k].offset, DT_F32,
                               (int64_t)plan->skip[k].count, &one);
            skipped += one;
        }
        /* rounding may take a little below 0; NaN and Inf pass */
        ss += part - skipped < 0.0 ? 0.0 : part - skipped;
    }
    *out = ss;
    return rc;
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
