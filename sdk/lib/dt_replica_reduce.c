/*
 * sdk/lib/dt_replica_reduce.c - a replica's gradients through a step: the
 * unit hooks, the buckets and their all-reduce overlapped with backward,
 * and the gradient norm.
 *
 * Gradient averaging.  The core accumulates, over the n_micro micro-steps,
 * the gradients of each micro-batch's MEAN loss, having scaled its loss
 * gradient by 1/n_micro; so after backward each rank holds the gradient of
 * its own mean loss over all its micro-batches.  The only averaging left
 * is across ranks: all_reduce with DT_OP_AVG (sum over the group divided
 * by its size; the communicator accumulates 16-bit values in f32 and rounds once).
 *
 * Buckets.  On every micro-step but the last, gradients only accumulate
 * locally.  On the last one a unit's gradient is final at its
 * post_backward with last_use == 1; when every unit of a bucket is final
 * the bucket's all_reduce starts on the reduction stream, ordered after
 * the compute stream by an event.  Buckets start strictly in index order
 * (the same on every rank, as collectives require), a later bucket that is
 * ready first waits for its predecessors.  dt_replica_reduce starts
 * whatever is left and waits for everything.
 *
 * With one rank, or when the strategy keeps every rank's own gradient
 * (cfg.reduce_grads 0), nothing is communicated.
 */
#include "dtrain/sdk/replica.h"

#include <string.h>

#include "dtrain/sdk/norm.h"
#include "dtrain/sdk/ranges.h"

/* Gradients travel between ranks. */
static int reduces(const dt_replica_t *r)
{
    return r->cfg.reduce_grads && r->dp.size > 1;
}

/* ------------------------------------------------------------ hooks */

int dt_replica_pre_forward(dt_replica_t *r, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = dt_dp_hook_enter(&r->dp, h, 0, out);
    if (rc != DT_OK)
        return rc;
    out->params = dt_replica_unit_params(r, h->unit);
    out->grads = NULL;
    return DT_OK;
}

int dt_replica_post_forward(dt_replica_t *r, const dt_hook_v1_t *h)
{
    return dt_dp_hook_leave(&r->dp, h, 0);
}

int dt_replica_pre_backward(dt_replica_t *r, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = dt_dp_hook_enter(&r->dp, h, 1, out);
    if (rc != DT_OK)
        return rc;
    out->params = dt_replica_unit_params(r, h->unit);
    out->grads = dt_replica_unit_grads(r, h->unit);
    return DT_OK;
}

/* ------------------------------------------------------------ buckets */

static float *bucket_slot(dt_replica_t *r, const dt_replica_bucket_t *b)
{
    return (float *)((char *)r->comm_buf +
                     (uint64_t)b->slot * r->slot_elems * dt_dtype_size(r->cfg.reduce_dtype));
}

static void log_bucket_failure(dt_replica_t *r, uint32_t bi, const char *what, int rc)
{
    const dt_replica_bucket_t *b = &r->buckets[bi];
    r->dp.host->log(r->dp.host, DT_LOG_ERROR,
                    "rank %d/%d: %s of gradient bucket %u (units '%s'..'%s', %llu %s elements) "
                    "failed: %s",
                    r->dp.rank, r->dp.size, what, bi, r->dp.model->units[b->unit_lo].name,
                    r->dp.model->units[b->unit_hi].name, (unsigned long long)b->count,
                    dt_dtype_name(r->cfg.reduce_dtype), dt_status_name(rc));
}

/* Wait for bucket bi's all_reduce; a 16-bit bucket is cast back into the f32
 * gradients (ordered on the reduction stream). */
static int finish_bucket(dt_replica_t *r, uint32_t bi, int64_t timeout_ms)
{
    dt_replica_bucket_t *b = &r->buckets[bi];
    if (b->state != DT_REPLICA_BUCKET_INFLIGHT)
        return DT_OK;
    int rc = dt_comm_ops(r->dp.comm)->wait(r->dp.comm, b->req, timeout_ms); /* frees req */
    b->req = NULL;
    b->state = DT_REPLICA_BUCKET_DONE;
    if (r->cfg.reduce_dtype != DT_F32) {
        r->slot_bucket[b->slot] = -1;
        if (rc == DT_OK)
            rc = r->dp.kernels->cast(r->dp.dev, r->comm_stream, r->grads + b->off, DT_F32,
                                     bucket_slot(r, b), r->cfg.reduce_dtype, (int64_t)b->count);
    }
    if (rc != DT_OK && timeout_ms != 0)
        log_bucket_failure(r, bi, "all_reduce", rc);
    return rc;
}

static int launch_bucket(dt_replica_t *r, uint32_t bi)
{
    dt_replica_bucket_t *b = &r->buckets[bi];
    const dt_device_ops_v1_t *d = dt_device_ops(r->dp.dev);
    int rc;
    /* the reduction stream starts after every gradient kernel queued so far */
    if ((rc = d->event_record(r->dp.dev, r->ev_grads, r->dp.cs)) != DT_OK ||
        (rc = d->stream_wait_event(r->dp.dev, r->comm_stream, r->ev_grads)) != DT_OK) {
        log_bucket_failure(r, bi, "ordering after backward", rc);
        return rc;
    }
    float *g = r->grads + b->off;
    if (r->cfg.reduce_dtype == DT_F32) {
        rc = dt_comm_ops(r->dp.comm)->all_reduce(r->dp.comm, g, g, b->count, DT_F32, DT_OP_AVG,
                                        r->comm_stream, &b->req);
    } else {
        b->slot = bi % r->n_slots;
        int32_t prev = r->slot_bucket[b->slot];
        if (prev >= 0 && (rc = finish_bucket(r, (uint32_t)prev, -1)) != DT_OK)
            return rc;
        void *w = bucket_slot(r, b);
        rc = r->dp.kernels->cast(r->dp.dev, r->comm_stream, w, r->cfg.reduce_dtype, g, DT_F32,
                                 (int64_t)b->count);
        if (rc == DT_OK)
            rc = dt_comm_ops(r->dp.comm)
                     ->all_reduce(r->dp.comm, w, w, b->count, r->cfg.reduce_dtype, DT_OP_AVG,
                                  r->comm_stream, &b->req);
        if (rc == DT_OK)
            r->slot_bucket[b->slot] = (int32_t)bi;
    }
    if (rc != DT_OK) {
        b->req = NULL;
        log_bucket_failure(r, bi, "starting the all_reduce", rc);
        return rc;
    }
    b->state = DT_REPLICA_BUCKET_INFLIGHT;
    return DT_OK;
}

/* Start ready buckets in index order, stopping at the first not ready. */
static int launch_ready(dt_replica_t *r)
{
    while (r->next_launch < r->n_buckets &&
           r->buckets[r->next_launch].state == DT_REPLICA_BUCKET_READY) {
        int rc = launch_bucket(r, r->next_launch);
        if (rc != DT_OK)
            return rc;
        r->next_launch++;
    }
    return DT_OK;
}

int dt_replica_post_backward(dt_replica_t *r, const dt_hook_v1_t *h)
{
    int rc = dt_dp_hook_leave(&r->dp, h, 1);
    if (rc != DT_OK)
        return rc;
    uint32_t u = h->unit;
    if (!h->last_use || h->micro + 1 != h->n_micro)
        return DT_OK; /* accumulation micro-step, or the gradient is not final */
    if (r->final_done[u])
        return r->dp.host->set_error(r->dp.host, DT_ERR_INVALID,
                                     "post_backward: unit '%s' (%u) reported last_use twice in "
                                     "the final micro-step", r->dp.model->units[u].name, u);
    r->final_done[u] = 1;
    if (!r->cfg.reduce_grads)
        return DT_OK;
    dt_replica_bucket_t *b = &r->buckets[r->bucket_of_unit[u]];
    if (++b->n_ready == b->n_units && b->state == DT_REPLICA_BUCKET_IDLE)
        b->state = DT_REPLICA_BUCKET_READY;
    if (reduces(r) && r->cfg.overlap)
        return launch_ready(r);
    return DT_OK;
}

int dt_replica_drain(dt_replica_t *r, int64_t timeout_ms)
{
    int first = DT_OK;
    for (uint32_t b = 0; b < r->n_buckets; b++) {
        int rc = finish_bucket(r, b, timeout_ms);
        /* The job is failing: leave the rest in flight for finalize's
         * drain (timeout 0 frees them).  Cancelling them here would
         * replace the first failure's message with a later one's. */
        if (rc != DT_OK && timeout_ms != 0)
            return rc;
        if (rc != DT_OK && first == DT_OK)
            first = rc;
    }
    return first;
}

/* ------------------------------------------------------------ the step */

int dt_replica_begin_step(dt_replica_t *r, int64_t step, const uint8_t *keep)
{
    /* A step abandoned after backward leaves reductions running; they
     * touch the gradients, so finish them before zeroing. */
    int rc = dt_replica_drain(r, -1);
    if (rc != DT_OK)
        return rc;
    for (uint32_t b = 0; b < r->n_buckets; b++) {
        r->buckets[b].state = DT_REPLICA_BUCKET_IDLE;
        r->buckets[b].n_ready = 0;
    }
    r->next_launch = 0;
    dt_dp_hooks_reset(&r->dp);
    uint32_t nu = r->dp.model->n_units;
    memset(r->final_done, 0, nu);
    /* zero the gradients in runs of units not kept */
    for (uint32_t lo = 0; rc == DT_OK && lo < nu;) {
        if (keep && keep[lo]) {
            lo++;
            continue;
        }
        uint32_t hi = lo + 1;
        while (hi < nu && !(keep && keep[hi]))
            hi++;
        rc = dt_replica_zero_grads(r, lo, hi);
        lo = hi;
    }
    if (rc != DT_OK)
        r->dp.host->log(r->dp.host, DT_LOG_ERROR, "begin_step %lld: zeroing gradients failed",
                        (long long)step);
    return rc;
}

int dt_replica_reduce(dt_replica_t *r)
{
    if (!reduces(r))
        return DT_OK;
    /* overlap off, or units that never reported a final last_use: the
     * gradients are what they are; start what is left, in order */
    for (uint32_t b = r->next_launch; b < r->n_buckets; b++)
        if (r->buckets[b].state == DT_REPLICA_BUCKET_IDLE)
            r->buckets[b].state = DT_REPLICA_BUCKET_READY;
    int rc = launch_ready(r);
    if (rc != DT_OK)
        return rc; /* what was started is finalize's to drop (dt_replica_drain) */
    if ((rc = dt_replica_drain(r, -1)) != DT_OK)
        return rc;
    const dt_device_ops_v1_t *d = dt_device_ops(r->dp.dev);
    if ((rc = d->event_record(r->dp.dev, r->ev_reduced, r->comm_stream)) != DT_OK ||
        (rc = d->stream_wait_event(r->dp.dev, r->dp.cs, r->ev_reduced)) != DT_OK)
        r->dp.host->log(r->dp.host, DT_LOG_ERROR, "ordering the optimizer after the reductions "
                        "failed");
    return rc;
}

/* The sum of squares of grads[part] over the units the norm counts: all
 * but a pipeline stage's COPY units (the other stage counts them), less
 * the tensors another rank of the tensor group counts. */
static int sumsq_counted(dt_replica_t *r, dt_range_t part, double *sumsq)
{
    const uint32_t nu = r->dp.model->n_units;
    const uint64_t *off = r->layout.offset;
    *sumsq = 0.0;
    for (uint32_t lo = 0; lo < nu;) {
        if (dt_dp_unit_flags(&r->dp, lo) & DT_UNIT_COPY) {
            lo++;
            continue;
        }
        uint32_t hi = lo + 1;
        while (hi < nu && !(dt_dp_unit_flags(&r->dp, hi) & DT_UNIT_COPY))
            hi++;
        uint64_t a = off[lo] > part.offset ? off[lo] : part.offset;
        uint64_t b = off[hi] < part.offset + part.count ? off[hi] : part.offset + part.count;
        double s = 0.0, copies = 0.0;
        if (a < b) {
            int rc = dt_norm_sumsq(r->dp.host, r->dp.dev, r->dp.cs, r->norm_slot,
                                   r->grads + a, DT_F32, (int64_t)(b - a), &s);
            /* tensor parallelism: the tensor group's rank 0 counts the
             * tensors every rank of it holds */
            if (rc == DT_OK && r->norm_copies)
                rc = dt_dp_norm_copies(&r->dp, r->norm_slot, r->grads + a, a, b - a, lo, hi - 1,
                                       off + lo, &copies);
            if (rc != DT_OK)
                return rc;
        }
        /* rounding may take a little below 0; NaN and Inf pass */
        *sumsq += s - copies < 0.0 ? 0.0 : s - copies;
        lo = hi;
    }
    return DT_OK;
}

int dt_replica_grad_sumsq(dt_replica_t *r, double *sumsq)
{
    const dt_host_v1_t *host = r->dp.host;
    /* The gradients are replicated once reduced.  Rather than every rank
     * reading all of them (a memory-bound pass the ranks would run at the
     * same moment), each sums the squares of its 1/size of the flat buffer
     * and one f64 all_reduce adds the parts; the communicator gives every
     * rank the same bits. */
    dt_range_t part = reduces(r) ? dt_range_split(r->layout.total, (uint32_t)r->dp.size,
                                                  (uint32_t)r->dp.rank)
                                 : (dt_range_t){0, r->layout.total};
    int rc = sumsq_counted(r, part, sumsq);
    if (rc == DT_OK && reduces(r))
        rc = dt_norm_allreduce(host, r->dp.comm, r->dp.dev,
                               r->dp.cs, r->norm_slot, sumsq);
    /* a pipeline stage: the other stages hold the rest of the model */
    if (rc == DT_OK && r->dp.norm_comm)
        rc = dt_norm_allreduce(host, r->dp.norm_comm, r->dp.dev,
                               r->dp.cs, r->norm_slot, sumsq);
    return rc;
}

int dt_replica_tied_sum(dt_replica_t *r)
{
    if (!r->dp.tied_comm)
        return DT_OK;
    for (uint32_t u = 0; u < r->dp.model->n_units; u++) {
        if (!(dt_dp_unit_flags(&r->dp, u) & DT_UNIT_TIED))
            continue;
        float *g = dt_replica_unit_grads(r, u);
        const uint64_t n = r->dp.model->units[u].numel;
        int rc = dt_comm_ops(r->dp.tied_comm)
                     ->all_reduce(r->dp.tied_comm, g, g, n, DT_F32, DT_OP_SUM, r->dp.cs, NULL);
        if (rc != DT_OK) {
            r->dp.host->log(r->dp.host, DT_LOG_ERROR,
                            "summing the gradient of tied unit '%s' (%llu elements) between the "
                            "first and the last pipeline stage failed",
                            r->dp.model->units[u].name, (unsigned long long)n);
            return rc;
        }
    }
    return DT_OK;
}
