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
 */
#include <math.h>
#include <string.h>

#include "ddp_internal.h"

/* Forward hooks do not look at micro-steps (evaluation passes may leave
 * them 0); backward hooks need them to find the final micro-step. */
static int check_hook(dt_strategy_t *s, const dt_hook_v1_t *h, const char *what,
                      int check_micro)
{
    if (!h)
        return s->host->set_error(s->host, DT_ERR_INVALID, "%s: NULL hook", what);
    if (h->unit >= s->model->n_units)
        return s->host->set_error(s->host, DT_ERR_INVALID, "%s: unit %u out of range (model "
                                  "has %u units)", what, h->unit, s->model->n_units);
    if (check_micro && (h->n_micro == 0 || h->micro >= h->n_micro))
        return s->host->set_error(s->host, DT_ERR_INVALID,
                                  "%s: unit '%s': micro-step %u of %u", what,
                                  s->model->units[h->unit].name, h->micro, h->n_micro);
    return DT_OK;
}

static const void *unit_params(dt_strategy_t *s, uint32_t u)
{
    return dt_flat_unit_ptr(s->compute, &s->layout, s->model->param_dtype, u);
}

int ddp_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = check_hook(s, h, "pre_forward", 0);
    if (rc != DT_OK)
        return rc;
    s->fwd_depth[h->unit]++;
    out->params = unit_params(s, h->unit);
    out->grads = NULL;
    return DT_OK;
}

int ddp_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    int rc = check_hook(s, h, "post_forward", 0);
    if (rc != DT_OK)
        return rc;
    if (s->fwd_depth[h->unit] == 0)
        return s->host->set_error(s->host, DT_ERR_INVALID,
                                  "post_forward: unit '%s' (%u) without a pre_forward",
                                  s->model->units[h->unit].name, h->unit);
    s->fwd_depth[h->unit]--;
    return DT_OK;
}

int ddp_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = check_hook(s, h, "pre_backward", 1);
    if (rc != DT_OK)
        return rc;
    if (h->flags & DT_HOOK_NO_GRAD)
        return s->host->set_error(s->host, DT_ERR_INVALID,
                                  "pre_backward: unit '%s' in a no-grad (evaluation) pass",
                                  s->model->units[h->unit].name);
    s->bwd_depth[h->unit]++;
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
    s->host->log(s->host, DT_LOG_ERROR,
                 "rank %d/%d: %s of gradient bucket %u (units '%s'..'%s', %llu %s elements) "
                 "failed: %s",
                 s->rank, s->size, what, bi, s->model->units[b->unit_lo].name,
                 s->model->units[b->unit_hi].name, (unsigned long long)b->count,
                 dt_dtype_name(s->reduce_dtype), dt_status_name(rc));
}

/* Wait for bucket bi's all_reduce; a bf16 bucket is cast back into the f32
 * gradients (ordered on the reduction stream). */
static int finish_bucket(dt_strategy_t *s, uint32_t bi, int64_t timeout_ms)
{
    ddp_bucket_t *b = &s->buckets[bi];
    if (b->state != DDP_B_INFLIGHT)
        return DT_OK;
    int rc = s->comm_ops->wait(s->comm, b->req, timeout_ms); /* frees req */
    b->req = NULL;
    b->state = DDP_B_DONE;
    if (s->reduce_dtype == DT_BF16) {
        s->slot_bucket[b->slot] = -1;
        if (rc == DT_OK)
            rc = s->dev_ops->cast(s->dev, s->comm_stream, s->grads + b->off, DT_F32,
                                  bucket_slot(s, b), DT_BF16, (int64_t)b->count);
    }
    if (rc != DT_OK && timeout_ms != 0)
        log_bucket_failure(s, bi, "all_reduce", rc);
    return rc;
}

static int launch_bucket(dt_strategy_t *s, uint32_t bi)
{
    ddp_bucket_t *b = &s->buckets[bi];
    const dt_device_ops_v1_t *d = s->dev_ops;
    int rc;
    /* the reduction stream starts after every gradient kernel queued so far */
    if ((rc = d->event_record(s->dev, s->ev_grads, s->cs)) != DT_OK ||
        (rc = d->stream_wait_event(s->dev, s->comm_stream, s->ev_grads)) != DT_OK) {
        log_bucket_failure(s, bi, "ordering after backward", rc);
        return rc;
    }
    float *g = s->grads + b->off;
    if (s->reduce_dtype == DT_F32) {
        rc = s->comm_ops->all_reduce(s->comm, g, g, b->count, DT_F32, DT_OP_AVG,
                                     s->comm_stream, &b->req);
    } else {
        b->slot = bi % s->n_slots;
        int32_t prev = s->slot_bucket[b->slot];
        if (prev >= 0 && (rc = finish_bucket(s, (uint32_t)prev, -1)) != DT_OK)
            return rc;
        void *w = bucket_slot(s, b);
        rc = d->cast(s->dev, s->comm_stream, w, DT_BF16, g, DT_F32, (int64_t)b->count);
        if (rc == DT_OK)
            rc = s->comm_ops->all_reduce(s->comm, w, w, b->count, DT_BF16, DT_OP_AVG,
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
    int rc = check_hook(s, h, "post_backward", 1);
    if (rc != DT_OK)
        return rc;
    uint32_t u = h->unit;
    const char *name = s->model->units[u].name;
    if (s->bwd_depth[u] == 0)
        return s->host->set_error(s->host, DT_ERR_INVALID,
                                  "post_backward: unit '%s' (%u) without a pre_backward", name, u);
    s->bwd_depth[u]--;
    if (!h->last_use || h->micro + 1 != h->n_micro)
        return DT_OK; /* accumulation micro-step, or the gradient is not final */
    if (s->final_done[u])
        return s->host->set_error(s->host, DT_ERR_INVALID,
                                  "post_backward: unit '%s' (%u) reported last_use twice in "
                                  "the final micro-step", name, u);
    s->final_done[u] = 1;
    ddp_bucket_t *b = &s->buckets[s->bucket_of_unit[u]];
    if (++b->n_ready == b->n_units && b->state == DDP_B_IDLE)
        b->state = DDP_B_READY;
    if (s->size > 1 && s->overlap)
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
    uint32_t nu = s->model->n_units;
    memset(s->fwd_depth, 0, nu * sizeof(uint32_t));
    memset(s->bwd_depth, 0, nu * sizeof(uint32_t));
    memset(s->final_done, 0, nu);
    rc = s->dev_ops->memset_async(s->dev, s->grads, 0, s->layout.total * sizeof(float), s->cs);
    if (rc != DT_OK)
        s->host->log(s->host, DT_LOG_ERROR, "begin_step %lld: zeroing gradients failed",
                     (long long)step);
    return rc;
}

/* All buckets reduced and visible to the compute stream. */
static int reduce_all(dt_strategy_t *s)
{
    if (s->size == 1)
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
    const dt_device_ops_v1_t *d = s->dev_ops;
    if ((rc = d->event_record(s->dev, s->ev_reduced, s->comm_stream)) != DT_OK ||
        (rc = d->stream_wait_event(s->dev, s->cs, s->ev_reduced)) != DT_OK)
        s->host->log(s->host, DT_LOG_ERROR, "ordering the optimizer after the reductions "
                     "failed");
    return rc;
}

int ddp_step(dt_strategy_t *s, const dt_step_args_v1_t *args, dt_step_result_v1_t *out)
{
    const dt_host_v1_t *host = s->host;
    memset(out, 0, sizeof *out);
    if (s->optim.kind == DT_OPTIM_ADAMW && args->step < 1)
        return host->set_error(host, DT_ERR_INVALID, "step: AdamW step count %lld (must be "
                               ">= 1)", (long long)args->step);
    for (uint32_t u = 0; u < s->model->n_units; u++)
        if (s->bwd_depth[u] || s->fwd_depth[u])
            return host->set_error(host, DT_ERR_INVALID, "step: unit '%s' (%u) is still inside "
                                   "a pre_%s hook", s->model->units[u].name, u,
                                   s->bwd_depth[u] ? "backward" : "forward");
    int rc = reduce_all(s);
    if (rc != DT_OK)
        return rc;

    /* The gradients are replicated now, so the local norm IS the global one
     * (summing across ranks would count every element size times). */
    double sumsq = 0.0;
    rc = dt_norm_sumsq(host, s->dev_ops, s->dev, s->cs, s->norm_slot, s->grads, DT_F32,
                       (int64_t)s->layout.total, &sumsq);
    if (rc != DT_OK)
        return rc;
    double norm = sqrt(sumsq);
    out->grad_norm = norm;
    if (!isfinite(norm)) {
        out->nonfinite = 1;
        host->log(host, DT_LOG_WARN, "step %lld: gradient norm is %g, update skipped",
                  (long long)args->step, norm);
        return DT_OK;
    }

    dt_optim_step_t st = {
        .desc = &s->optim,
        .lr = args->lr,
        .grad_scale = dt_clip_scale(norm, args->clip),
        .t = args->step,
    };
    for (uint32_t u = 0; u < s->model->n_units; u++) {
        const dt_unit_desc_v1_t *unit = &s->model->units[u];
        uint64_t off = s->layout.offset[u];
        rc = dt_optim_range(host, s->dev_ops, s->dev, s->cs, unit, (dt_range_t){0, unit->numel},
                            s->master + off, s->grads + off, s->m + off,
                            s->v ? s->v + off : NULL, &st);
        if (rc != DT_OK)
            return rc;
    }
    if (s->compute != (void *)s->master) {
        rc = s->dev_ops->cast(s->dev, s->cs, s->compute, DT_BF16, s->master, DT_F32,
                              (int64_t)s->layout.total);
        if (rc != DT_OK)
            host->log(host, DT_LOG_ERROR, "step %lld: refreshing the bf16 parameters failed",
                      (long long)args->step);
    }
    return rc;
}
