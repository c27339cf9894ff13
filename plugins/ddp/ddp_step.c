/*
 * plugins/ddp/ddp_step.c - one training step of ddp: the unit hooks, the
 * gradient buckets and the optimizer step.
 *
 * Gradient averaging.  The core accumulates, over the n_micro micro-steps,
 * the gradients of each micro-batch's MEAN loss, having scaled its loss
 * gradient by 1/n_micro; so after backward each rank holds the gradient of
 * its own mean loss over all its micro-batches.  The only averaging left to
 * ddp is across ranks: all_reduce with DT_OP_AVG (sum over the group divided
 * by its size; the communicator accumulates bf16 in f32 and rounds once).
 *
 * Buckets.  On every micro-step but the last, gradients only accumulate
 * locally.  On the last one a unit's gradient is final at its post_backward
 * with last_use == 1; when every unit of a bucket is final the bucket's
 * all_reduce starts on the reduction stream, ordered after the compute
 * stream by an event.  Buckets start strictly in index order (the same on
 * every rank, as collectives require), a later bucket that is ready first
 * waits for its predecessors.  step() starts whatever is left, waits for
 * everything, then runs the optimizer on the compute stream.
 *
 * With one rank nothing is communicated (reduce_dtype has no effect).
 *
 * Staggered update (stagger_update, groups of more than one rank).  The
 * optimizer update is memory bound (AdamW streams 28 bytes per parameter)
 * and ddp's step synchronises the ranks, so ranks sharing one machine's
 * memory would all run it at the same moment, each at a fraction of the
 * bandwidth.  Odd ranks therefore keep the update pending and apply each
 * unit's part at the unit's next use (pre_forward or pre_backward), spread
 * over their forward, while even ranks update everything in step(),
 * starting with the last unit (the one odd ranks reach last).  The update
 * is elementwise, so every rank ends with the same bits either way; state
 * read through get_state, and a unit nobody used by the next step(), get
 * their pending update first.  A unit's gradient is zeroed right after its
 * deferred update rather than in begin_step.
 */
#include <string.h>

#include "ddp_internal.h"

static const void *unit_params(dt_strategy_t *s, uint32_t u)
{
    return dt_flat_unit_ptr(s->compute, &s->layout, s->dp.model->param_dtype, u);
}

/* Elements of unit u's slice of the flat buffers, alignment padding included. */
static uint64_t unit_span(const dt_strategy_t *s, uint32_t u)
{
    return s->layout.offset[u + 1] - s->layout.offset[u];
}

/* The optimizer update of unit u (on the compute stream). */
static int update_unit(dt_strategy_t *s, uint32_t u, const dt_optim_step_t *st)
{
    const dt_unit_desc_v1_t *unit = &s->dp.model->units[u];
    uint64_t off = s->layout.offset[u];
    return dt_optim_range(s->dp.host, s->dp.dev_ops, s->dp.dev, s->dp.cs, unit,
                          (dt_range_t){0, unit->numel}, s->master + off, s->grads + off,
                          s->m + off, s->v ? s->v + off : NULL, st);
}

/* The bf16 compute copy of units [lo, hi) from the masters. */
static int refresh_compute(dt_strategy_t *s, uint32_t lo, uint32_t hi)
{
    if (s->compute == (void *)s->master || lo >= hi)
        return DT_OK;
    uint64_t off = s->layout.offset[lo];
    return s->dp.dev_ops->kernels()->cast(s->dp.dev, s->dp.cs,
                                          (char *)s->compute + off * dt_dtype_size(DT_BF16),
                                          DT_BF16, s->master + off, DT_F32,
                                          (int64_t)(s->layout.offset[hi] - off));
}

int ddp_apply_pending(dt_strategy_t *s, uint32_t u)
{
    if (!s->n_pending || !s->pending[u])
        return DT_OK;
    int rc = update_unit(s, u, &s->pending_st);
    if (rc == DT_OK)
        rc = refresh_compute(s, u, u + 1);
    if (rc == DT_OK)
        rc = s->dp.dev_ops->memset_async(s->dp.dev, s->grads + s->layout.offset[u], 0,
                                         unit_span(s, u) * sizeof(float), s->dp.cs);
    if (rc != DT_OK) {
        s->dp.host->log(s->dp.host, DT_LOG_ERROR,
                        "rank %d/%d: the deferred update of step %lld for unit '%s' failed",
                        s->dp.rank, s->dp.size, (long long)s->pending_st.t,
                        s->dp.model->units[u].name);
        return rc;
    }
    s->pending[u] = 0;
    s->n_pending--;
    return DT_OK;
}

static int apply_all_pending(dt_strategy_t *s)
{
    int rc = DT_OK;
    for (uint32_t u = 0; rc == DT_OK && s->n_pending && u < s->dp.model->n_units; u++)
        rc = ddp_apply_pending(s, u);
    return rc;
}

int ddp_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = dt_dp_hook_enter(&s->dp, h, 0, out);
    if (rc == DT_OK)
        rc = ddp_apply_pending(s, h->unit);
    if (rc != DT_OK)
        return rc;
    out->params = unit_params(s, h->unit);
    out->grads = NULL;
    return DT_OK;
}

int ddp_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    return dt_dp_hook_leave(&s->dp, h, 0);
}

int ddp_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = dt_dp_hook_enter(&s->dp, h, 1, out);
    if (rc == DT_OK)
        rc = ddp_apply_pending(s, h->unit); /* a unit used without a forward */
    if (rc != DT_OK)
        return rc;
    out->params = unit_params(s, h->unit);
    out->grads = (float *)dt_flat_unit_ptr(s->grads, &s->layout, DT_F32, h->unit);
    return DT_OK;
}

static float *bucket_slot(dt_strategy_t *s, const ddp_bucket_t *b)
{
    return (float *)((char *)s->comm_buf +
                     (uint64_t)b->slot * s->slot_elems * dt_dtype_size(DT_BF16));
}

static void log_bucket_failure(dt_strategy_t *s, uint32_t bi, const char *what, int rc)
{
    const ddp_bucket_t *b = &s->buckets[bi];
    s->dp.host->log(s->dp.host, DT_LOG_ERROR,
                    "rank %d/%d: %s of gradient bucket %u (units '%s'..'%s', %llu %s elements) "
                    "failed: %s",
                    s->dp.rank, s->dp.size, what, bi, s->dp.model->units[b->unit_lo].name,
                    s->dp.model->units[b->unit_hi].name, (unsigned long long)b->count,
                    dt_dtype_name(s->reduce_dtype), dt_status_name(rc));
}

/* Wait for bucket bi's all_reduce; a bf16 bucket is cast back into the f32
 * gradients (ordered on the reduction stream). */
static int finish_bucket(dt_strategy_t *s, uint32_t bi, int64_t timeout_ms)
{
    ddp_bucket_t *b = &s->buckets[bi];
    if (b->state != DDP_B_INFLIGHT)
        return DT_OK;
    int rc = s->dp.comm_ops->wait(s->dp.comm, b->req, timeout_ms); /* frees req */
    b->req = NULL;
    b->state = DDP_B_DONE;
    if (s->reduce_dtype == DT_BF16) {
        s->slot_bucket[b->slot] = -1;
        if (rc == DT_OK)
            rc = s->dp.dev_ops->kernels()->cast(s->dp.dev, s->comm_stream, s->grads + b->off,
                                                DT_F32, bucket_slot(s, b), DT_BF16,
                                                (int64_t)b->count);
    }
    if (rc != DT_OK && timeout_ms != 0)
        log_bucket_failure(s, bi, "all_reduce", rc);
    return rc;
}

static int launch_bucket(dt_strategy_t *s, uint32_t bi)
{
    ddp_bucket_t *b = &s->buckets[bi];
    const dt_device_ops_v1_t *d = s->dp.dev_ops;
    int rc;
    /* the reduction stream starts after every gradient kernel queued so far */
    if ((rc = d->event_record(s->dp.dev, s->ev_grads, s->dp.cs)) != DT_OK ||
        (rc = d->stream_wait_event(s->dp.dev, s->comm_stream, s->ev_grads)) != DT_OK) {
        log_bucket_failure(s, bi, "ordering after backward", rc);
        return rc;
    }
    float *g = s->grads + b->off;
    if (s->reduce_dtype == DT_F32) {
        rc = s->dp.comm_ops->all_reduce(s->dp.comm, g, g, b->count, DT_F32, DT_OP_AVG,
                                        s->comm_stream, &b->req);
    } else {
        b->slot = bi % s->n_slots;
        int32_t prev = s->slot_bucket[b->slot];
        if (prev >= 0 && (rc = finish_bucket(s, (uint32_t)prev, -1)) != DT_OK)
            return rc;
        void *w = bucket_slot(s, b);
        rc = d->kernels()->cast(s->dp.dev, s->comm_stream, w, DT_BF16, g, DT_F32,
                                (int64_t)b->count);
        if (rc == DT_OK)
            rc = s->dp.comm_ops->all_reduce(s->dp.comm, w, w, b->count, DT_BF16, DT_OP_AVG,
                                            s->comm_stream, &b->req);
        if (rc == DT_OK)
            s->slot_bucket[b->slot] = (int32_t)bi;
    }
    if (rc != DT_OK) {
        b->req = NULL;
        log_bucket_failure(s, bi, "starting the all_reduce", rc);
        return rc;
    }
    b->state = DDP_B_INFLIGHT;
    return DT_OK;
}

/* Start ready buckets in index order, stopping at the first not ready. */
static int launch_ready(dt_strategy_t *s)
{
    while (s->next_launch < s->n_buckets && s->buckets[s->next_launch].state == DDP_B_READY) {
        int rc = launch_bucket(s, s->next_launch);
        if (rc != DT_OK)
            return rc;
        s->next_launch++;
    }
    return DT_OK;
}

int ddp_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    int rc = dt_dp_hook_leave(&s->dp, h, 1);
    if (rc != DT_OK)
        return rc;
    uint32_t u = h->unit;
    const char *name = s->dp.model->units[u].name;
    if (!h->last_use || h->micro + 1 != h->n_micro)
        return DT_OK; /* accumulation micro-step, or the gradient is not final */
    if (s->final_done[u])
        return s->dp.host->set_error(s->dp.host, DT_ERR_INVALID,
                                     "post_backward: unit '%s' (%u) reported last_use twice in "
                                     "the final micro-step", name, u);
    s->final_done[u] = 1;
    ddp_bucket_t *b = &s->buckets[s->bucket_of_unit[u]];
    if (++b->n_ready == b->n_units && b->state == DDP_B_IDLE)
        b->state = DDP_B_READY;
    if (s->dp.size > 1 && s->overlap)
        return launch_ready(s);
    return DT_OK;
}

int ddp_drain(dt_strategy_t *s, int64_t timeout_ms)
{
    int first = DT_OK;
    for (uint32_t b = 0; b < s->n_buckets; b++) {
        int rc = finish_bucket(s, b, timeout_ms);
        if (rc != DT_OK && first == DT_OK) {
            first = rc;
            timeout_ms = 0; /* the job is failing: free the rest, wait no more */
        }
    }
    return first;
}

int ddp_begin_step(dt_strategy_t *s, int64_t step)
{
    /* A step abandoned after backward leaves reductions running; they
     * touch the gradients, so finish them before zeroing. */
    int rc = ddp_drain(s, -1);
    if (rc != DT_OK)
        return rc;
    for (uint32_t b = 0; b < s->n_buckets; b++) {
        s->buckets[b].state = DDP_B_IDLE;
        s->buckets[b].n_ready = 0;
    }
    s->next_launch = 0;
    dt_dp_hooks_reset(&s->dp);
    uint32_t nu = s->dp.model->n_units;
    memset(s->final_done, 0, nu);
    /* zero the gradients, but not those a deferred update still needs (that
     * update zeroes them): runs of units without a pending update */
    for (uint32_t lo = 0; rc == DT_OK && lo < nu;) {
        if (s->n_pending && s->pending[lo]) {
            lo++;
            continue;
        }
        uint32_t hi = lo + 1;
        while (hi < nu && !(s->n_pending && s->pending[hi]))
            hi++;
        uint64_t off = s->layout.offset[lo];
        rc = s->dp.dev_ops->memset_async(s->dp.dev, s->grads + off, 0,
                                         (s->layout.offset[hi] - off) * sizeof(float), s->dp.cs);
        lo = hi;
    }
    if (rc != DT_OK)
        s->dp.host->log(s->dp.host, DT_LOG_ERROR, "begin_step %lld: zeroing gradients failed",
                        (long long)step);
    return rc;
}

/* All buckets reduced and visible to the compute stream. */
static int reduce_all(dt_strategy_t *s)
{
    if (s->dp.size == 1)
        return DT_OK;
    /* overlap = false, or units that never reported a final last_use: the
     * gradients are what they are; start what is left, in order */
    for (uint32_t b = s->next_launch; b < s->n_buckets; b++)
        if (s->buckets[b].state == DDP_B_IDLE)
            s->buckets[b].state = DDP_B_READY;
    int rc = launch_ready(s);
    if (rc != DT_OK) {
        ddp_drain(s, 0);
        return rc;
    }
    if ((rc = ddp_drain(s, -1)) != DT_OK)
        return rc;
    const dt_device_ops_v1_t *d = s->dp.dev_ops;
    if ((rc = d->event_record(s->dp.dev, s->ev_reduced, s->comm_stream)) != DT_OK ||
        (rc = d->stream_wait_event(s->dp.dev, s->dp.cs, s->ev_reduced)) != DT_OK)
        s->dp.host->log(s->dp.host, DT_LOG_ERROR, "ordering the optimizer after the reductions "
                        "failed");
    return rc;
}

int ddp_step(dt_strategy_t *s, const dt_step_args_v1_t *args, dt_step_result_v1_t *out)
{
    const dt_host_v1_t *host = s->dp.host;
    int rc = dt_dp_step_check(&s->dp, args, out);
    if (rc == DT_OK)
        rc = apply_all_pending(s); /* units this step never used */
    if (rc == DT_OK)
        rc = reduce_all(s);
    if (rc != DT_OK)
        return rc;

    /* The gradients are replicated now.  Rather than every rank reading all
     * of them (a memory-bound pass the ranks would run at the same moment),
     * each sums the squares of its 1/size of the flat buffer and one f64
     * all_reduce adds the parts; the communicator gives every rank the same
     * bits. */
    double sumsq = 0.0;
    dt_range_t part = dt_range_split(s->layout.total, (uint32_t)s->dp.size,
                                     (uint32_t)s->dp.rank);
    rc = dt_norm_sumsq(host, s->dp.dev_ops, s->dp.dev, s->dp.cs, s->norm_slot,
                       s->grads + part.offset, DT_F32, (int64_t)part.count, &sumsq);
    if (rc == DT_OK && s->dp.size > 1)
        rc = dt_norm_allreduce(host, s->dp.comm_ops, s->dp.comm, s->dp.dev_ops, s->dp.dev,
                               s->dp.cs, s->norm_slot, &sumsq);
    if (rc != DT_OK)
        return rc;
    dt_optim_step_t st = dt_dp_step_norm(&s->dp, args, sumsq, out);
    if (out->nonfinite)
        return DT_OK;
    uint32_t nu = s->dp.model->n_units;
    if (s->defer) {
        s->pending_st = st;
        memset(s->pending, 1, nu);
        s->n_pending = nu;
        return DT_OK;
    }
    /* last unit first when staggered: the deferring ranks start at unit 0 */
    for (uint32_t k = 0; k < nu; k++) {
        rc = update_unit(s, s->stagger && s->dp.size > 1 ? nu - 1 - k : k, &st);
        if (rc != DT_OK)
            return rc;
    }
    rc = refresh_compute(s, 0, nu);
    if (rc != DT_OK)
        host->log(host, DT_LOG_ERROR, "step %lld: refreshing the bf16 parameters failed",
                  (long long)args->step);
    return rc;
}
