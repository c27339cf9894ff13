/*
 * sdk/lib/dt_shard_step.c - one training step of the sharded engine: the
 * unit hooks (gathering a group's parameters on demand and prefetching
 * the next, resharding, reducing a group's gradient as soon as backward
 * completes it) and the optimizer step over this rank's shard.
 *
 * Gradient averaging.  The core accumulates, over a step's micro-steps,
 * gradients of each micro-batch's mean loss already scaled by 1/n_micro,
 * so all that is left is the mean across ranks: reduce_scatter with
 * DT_OP_AVG inside a shard group, then (hybrid) all_reduce AVG across the
 * replicas of a shard; a mean of means of equal groups is the mean.
 *
 * Ordering.  Collectives run on a communication stream ordered after the
 * compute stream by an event at every start, and the compute stream waits
 * for the communication stream before it reads a gathered copy or the
 * reduced gradients.  Every rank makes the same calls in the same order:
 * gathers and reductions start only at hooks (never on completion
 * polling), so the schedule depends on the hook sequence alone.
 */
#include <string.h>

#include "dt_shard_internal.h"

static const char *unit_name(const dt_shard_t *e, uint32_t u)
{
    const char *n = e->dp.model->units[u].name;
    return n ? n : "?";
}

static void log_group(dt_shard_t *e, uint32_t gi, const char *what, int rc)
{
    const dt_shard_group_t *g = &e->plan.groups[gi];
    e->dp.host->log(e->dp.host, DT_LOG_ERROR,
                    "rank %d/%d: %s of shard group %u (units '%s'..'%s') failed: %s", e->dp.rank,
                    e->dp.size, what, gi, unit_name(e, g->unit_lo), unit_name(e, g->unit_hi),
                    dt_status_name(rc));
}

/* Work started on the communication stream from now on follows the
 * compute stream's work so far (gradients written, shards updated). */
static int comm_after_compute(dt_shard_t *e)
{
    const dt_device_ops_v1_t *d = e->dp.dev_ops;
    int rc = d->event_record(e->dp.dev, e->ev_compute, e->dp.cs);
    if (rc == DT_OK)
        rc = d->stream_wait_event(e->dp.dev, e->comm_stream, e->ev_compute);
    return rc;
}

/* And the other way: kernels queued from now on see the collectives. */
static int compute_after_comm(dt_shard_t *e)
{
    if (!e->comm_stream)
        return DT_OK;
    const dt_device_ops_v1_t *d = e->dp.dev_ops;
    int rc = d->event_record(e->dp.dev, e->ev_comm, e->comm_stream);
    if (rc == DT_OK)
        rc = d->stream_wait_event(e->dp.dev, e->dp.cs, e->ev_comm);
    return rc;
}

/* ------------------------------------------------------------ gathers */

static int gather_finish(dt_shard_t *e, uint32_t gi, int64_t timeout_ms)
{
    sh_group_t *g = &e->g[gi];
    if (g->pstate != SH_P_INFLIGHT)
        return DT_OK;
    int rc = e->dp.comm_ops->wait(e->scomm, g->greq, timeout_ms); /* frees greq */
    g->greq = NULL;
    e->n_gathers--;
    e->gather_inflight -= e->plan.groups[gi].padded;
    g->pstate = SH_P_FREE;
    if (rc == DT_OK)
        rc = compute_after_comm(e);
    if (rc != DT_OK) {
        if (timeout_ms != 0)
            log_group(e, gi, "all_gather of the parameters", rc);
        return rc;
    }
    g->pstate = SH_P_READY;
    return DT_OK;
}

/* The gather started first among those in flight. */
static uint32_t oldest_gather(const dt_shard_t *e)
{
    uint32_t best = UINT32_MAX;
    uint64_t seq = UINT64_MAX;
    for (uint32_t i = 0; i < e->plan.n_groups; i++)
        if (e->g[i].pstate == SH_P_INFLIGHT && e->g[i].gseq < seq) {
            seq = e->g[i].gseq;
            best = i;
        }
    return best;
}

static int gather_start(dt_shard_t *e, uint32_t gi)
{
    sh_group_t *g = &e->g[gi];
    if (g->pstate != SH_P_FREE)
        return DT_OK;
    int rc;
    while (e->cfg.max_gathers && e->n_gathers >= e->cfg.max_gathers)
        if ((rc = gather_finish(e, oldest_gather(e), -1)) != DT_OK)
            return rc;
    const dt_shard_group_t *gr = &e->plan.groups[gi];
    if (g->transient && !g->full) {
        rc = e->dp.dev_ops->alloc(e->dp.dev, gr->padded * e->pes, DT_TAG_COMM, &g->full);
        if (rc != DT_OK) {
            g->full = NULL;
            log_group(e, gi, "allocating the gathered parameters", rc);
            return rc;
        }
    }
    if ((rc = comm_after_compute(e)) != DT_OK)
        return rc;
    rc = dt_shard_gather(e->dp.host, e->dp.comm_ops, e->scomm, &e->plan, gi,
                         dt_shard__cshard(e, gi), g->full, e->pdtype, e->comm_stream, &g->greq);
    if (rc != DT_OK) {
        g->greq = NULL;
        return rc;
    }
    g->pstate = SH_P_INFLIGHT;
    g->gseq = ++e->gseq;
    e->n_gathers++;
    e->gather_inflight += gr->padded;
    return DT_OK;
}

/* A gathered copy that will not be read before the next gather goes. */
static int release_params(dt_shard_t *e, uint32_t gi)
{
    sh_group_t *g = &e->g[gi];
    if (!g->transient)
        return DT_OK;
    int rc = gather_finish(e, gi, -1); /* never free under a collective */
    if (g->full)
        e->dp.dev_ops->free(e->dp.dev, g->full);
    g->full = NULL;
    g->pstate = SH_P_FREE;
    return rc;
}

/* Start gathering up to `count` groups after (dir +1) or before (dir -1)
 * group gi that are not gathered, within prefetch_numel and max_gathers. */
static int prefetch(dt_shard_t *e, uint32_t gi, int dir, uint32_t count)
{
    if (count == 0 || e->ssize == 1 || e->cfg.params_replicated)
        return DT_OK;
    uint64_t ahead = 0;
    for (uint32_t k = 1; k <= count; k++) {
        int64_t j = (int64_t)gi + (int64_t)dir * (int64_t)k;
        if (j < 0 || j >= (int64_t)e->plan.n_groups)
            break;
        uint64_t padded = e->plan.groups[j].padded;
        if (e->cfg.prefetch_numel && ahead + padded > e->cfg.prefetch_numel)
            break;
        ahead += padded;
        if (e->g[j].pstate != SH_P_FREE)
            continue;
        if (e->cfg.max_gathers && e->n_gathers >= e->cfg.max_gathers)
            break;
        int rc = gather_start(e, (uint32_t)j);
        if (rc != DT_OK)
            return rc;
    }
    return DT_OK;
}

/* ------------------------------------------------------------ reductions */

static dt_comm_t *red_comm(const dt_shard_t *e, int kind)
{
    return kind == SH_R_REPLICAS ? e->rcomm : e->scomm;
}

static int red_finish_one(dt_shard_t *e, int64_t timeout_ms);

static int red_launch(dt_shard_t *e, uint32_t gi, int kind, float *buf, int then_replicas)
{
    const dt_shard_group_t *gr = &e->plan.groups[gi];
    uint64_t numel = kind == SH_R_REPLICAS ? gr->shard : gr->padded;
    int rc = DT_OK;
    while (e->red_n > 0 && (e->red_n == e->red_cap ||
                            (e->cfg.max_reduces && e->red_n >= e->cfg.max_reduces) ||
                            (e->cfg.max_reduce_numel &&
                             e->red_numel + numel > e->cfg.max_reduce_numel)))
        if ((rc = red_finish_one(e, -1)) != DT_OK)
            break;
    if (rc == DT_OK)
        rc = comm_after_compute(e);
    dt_comm_req_t *req = NULL;
    if (rc == DT_OK) {
        if (kind == SH_R_SCATTER_ADD) {
            rc = dt_shard_reduce(e->dp.host, e->dp.comm_ops, e->scomm, &e->plan, gi, buf,
                                 buf + (uint64_t)e->srank * gr->shard, DT_OP_AVG,
                                 e->comm_stream, &req);
        } else if (kind == SH_R_SCATTER) {
            float *f = e->gfull + gr->full_off;
            rc = dt_shard_reduce(e->dp.host, e->dp.comm_ops, e->scomm, &e->plan, gi, f,
                                 f + (uint64_t)e->srank * gr->shard, DT_OP_AVG,
                                 e->comm_stream, &req);
        } else {
            float *s = dt_shard__gshard(e, gi);
            rc = e->dp.comm_ops->all_reduce(e->rcomm, s, s, gr->shard, DT_F32, DT_OP_AVG,
                                            e->comm_stream, &req);
            if (rc != DT_OK)
                log_group(e, gi, "all_reduce across replicas of the gradient shard", rc);
        }
    }
    if (rc != DT_OK) {
        e->failed = 1;
        if (buf)
            e->dp.dev_ops->free(e->dp.dev, buf);
        return rc;
    }
    sh_red_t *r = &e->red[(e->red_head + e->red_n) % e->red_cap];
    *r = (sh_red_t){.group = gi, .kind = kind, .then_replicas = then_replicas,
                    .numel = numel, .buf = buf, .req = req};
    e->red_n++;
    e->red_numel += numel;
    e->g[gi].queued++;
    return DT_OK;
}

static int red_finish_one(dt_shard_t *e, int64_t timeout_ms)
{
    sh_red_t r = e->red[e->red_head];
    e->red_head = (e->red_head + 1) % e->red_cap;
    e->red_n--;
    e->red_numel -= r.numel;
    e->g[r.group].queued--;
    const dt_shard_group_t *gr = &e->plan.groups[r.group];
    int rc = e->dp.comm_ops->wait(red_comm(e, r.kind), r.req, timeout_ms); /* frees req */
    if (rc == DT_OK && r.kind == SH_R_SCATTER_ADD)
        rc = e->dp.dev_ops->kernels()->axpy(e->dp.dev, e->comm_stream,
                                            dt_shard__gshard(e, r.group),
                                            r.buf + (uint64_t)e->srank * gr->shard, DT_F32,
                                            1.0f, (int64_t)gr->shard);
    if (r.buf)
        e->dp.dev_ops->free(e->dp.dev, r.buf); /* waits for the axpy */
    if (rc != DT_OK) {
        e->failed = 1;
        if (timeout_ms != 0)
            log_group(e, r.group, r.kind == SH_R_REPLICAS ? "all_reduce across replicas"
                                                          : "reduce_scatter of the gradients",
                      rc);
        return rc;
    }
    if (r.then_replicas)
        return red_launch(e, r.group, SH_R_REPLICAS, NULL, 0);
    return DT_OK;
}

static int red_finish_all(dt_shard_t *e, int64_t timeout_ms)
{
    int first = DT_OK;
    while (e->red_n > 0) {
        int rc = red_finish_one(e, timeout_ms);
        if (rc != DT_OK && first == DT_OK) {
            first = rc;
            timeout_ms = 0; /* failing: free the rest, wait no more */
        }
    }
    return first;
}

int dt_shard__drain(dt_shard_t *e, int64_t timeout_ms)
{
    int first = red_finish_all(e, timeout_ms);
    if (first != DT_OK)
        timeout_ms = 0;
    for (uint32_t i = 0; e->g && i < e->plan.n_groups; i++) {
        int rc = gather_finish(e, i, timeout_ms);
        if (rc != DT_OK && first == DT_OK) {
            first = rc;
            timeout_ms = 0;
        }
    }
    return first;
}

/* The reduction that ends a group's gradient for the step, for gradient
 * buffers that persist across micro-steps (full gradients; whole shards). */
static int launch_final(dt_shard_t *e, uint32_t gi)
{
    e->g[gi].final_sent = 1;
    if (e->gfull && e->ssize > 1)
        return red_launch(e, gi, SH_R_SCATTER, NULL, e->rsize > 1);
    if (e->rsize > 1)
        return red_launch(e, gi, SH_R_REPLICAS, NULL, 0);
    return DT_OK;
}

/* Every unit of group gi has its gradient for micro-step `micro`. */
static int group_complete(dt_shard_t *e, uint32_t gi, int final_micro)
{
    sh_group_t *g = &e->g[gi];
    g->n_final = 0;
    g->bwd_done = 1;
    int rc = DT_OK;
    if (g->gbuf_transient) {
        float *buf = g->gbuf;
        g->gbuf = NULL;
        g->gbuf_transient = 0;
        if (final_micro)
            g->final_sent = 1;
        rc = red_launch(e, gi, SH_R_SCATTER_ADD, buf, final_micro && e->rsize > 1);
        if (rc == DT_OK && !e->cfg.overlap)
            rc = red_finish_all(e, -1);
    } else if (final_micro && e->cfg.overlap) {
        rc = launch_final(e, gi);
    }
    return rc;
}

/* What backward accumulates group gi's gradient into. */
static int grad_buffer(dt_shard_t *e, uint32_t gi)
{
    sh_group_t *g = &e->g[gi];
    if (g->gbuf)
        return DT_OK;
    /* at most one transient buffer per group: the previous micro-step's
     * must be reduced (and freed) first */
    int rc = DT_OK;
    while (rc == DT_OK && g->queued > 0)
        rc = red_finish_one(e, -1);
    if (rc == DT_OK)
        rc = dt_shard__alloc_zeroed(e, e->plan.groups[gi].padded, DT_F32, DT_TAG_COMM,
                          "a group's gradient buffer", (void **)&g->gbuf);
    if (rc != DT_OK)
        return rc;
    g->gbuf_transient = 1;
    return DT_OK;
}

/* ------------------------------------------------------------ hooks */

static void enter(dt_shard_t *e, uint32_t gi)
{
    if (e->g[gi].active++ == 0)
        e->n_active++;
}

static void leave(dt_shard_t *e, uint32_t gi)
{
    if (--e->g[gi].active == 0)
        e->n_active--;
}

static const void *unit_params(dt_shard_t *e, uint32_t u)
{
    return (const char *)e->g[e->plan.group_of_unit[u]].full + e->plan.unit_off[u] * e->pes;
}

/* Gather group gi for use now; prefetch `count` groups in direction
 * `dir` (after starting its own gather, so the wire takes it first). */
static int use_params(dt_shard_t *e, uint32_t gi, int dir, uint32_t count)
{
    int rc = gather_start(e, gi);
    if (rc == DT_OK)
        rc = prefetch(e, gi, dir, count);
    if (rc == DT_OK)
        rc = gather_finish(e, gi, -1);
    if (rc != DT_OK)
        e->failed = 1;
    return rc;
}

int dt_shard_pre_forward(dt_shard_t *e, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = dt_dp_hook_enter(&e->dp, h, 0, out);
    if (rc != DT_OK)
        return rc;
    uint32_t u = h->unit, gi = e->plan.group_of_unit[u];
    /* prefetch only from the outer unit: a nested one (the tied embedding
     * inside the head) is a detour, not the direction of the pass */
    uint32_t ahead = e->n_active == 0 ? e->cfg.prefetch_fwd : 0;
    enter(e, gi);
    if ((rc = use_params(e, gi, +1, ahead)) != DT_OK) {
        e->dp.fwd_depth[u]--;
        leave(e, gi);
        return rc;
    }
    out->params = unit_params(e, u);
    out->grads = NULL;
    return DT_OK;
}

int dt_shard_post_forward(dt_shard_t *e, const dt_hook_v1_t *h)
{
    int rc = dt_dp_hook_leave(&e->dp, h, 0);
    if (rc != DT_OK)
        return rc;
    uint32_t gi = e->plan.group_of_unit[h->unit];
    leave(e, gi);
    if (e->g[gi].active == 0 && e->cfg.reshard_after_forward)
        return release_params(e, gi);
    return DT_OK;
}

int dt_shard_pre_backward(dt_shard_t *e, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = dt_dp_hook_enter(&e->dp, h, 1, out);
    if (rc != DT_OK)
        return rc;
    uint32_t u = h->unit, gi = e->plan.group_of_unit[u];
    sh_group_t *g = &e->g[gi];
    uint32_t ahead = (e->n_active == 0 && !e->cfg.prefetch_bwd_post) ? e->cfg.prefetch_bwd : 0;
    if (g->active == 0)
        g->bwd_done = 0;
    enter(e, gi);
    rc = use_params(e, gi, -1, ahead);
    if (rc == DT_OK)
        rc = grad_buffer(e, gi);
    if (rc != DT_OK) {
        e->dp.bwd_depth[u]--;
        leave(e, gi);
        return rc;
    }
    out->params = unit_params(e, u);
    out->grads = g->gbuf + e->plan.unit_off[u];
    return DT_OK;
}

int dt_shard_post_backward(dt_shard_t *e, const dt_hook_v1_t *h)
{
    int rc = dt_dp_hook_leave(&e->dp, h, 1);
    if (rc != DT_OK)
        return rc;
    uint32_t u = h->unit, gi = e->plan.group_of_unit[u];
    sh_group_t *g = &e->g[gi];
    leave(e, gi);
    if (h->last_use) {
        if (e->final_at[u] == h->micro + 1)
            return e->dp.host->set_error(e->dp.host, DT_ERR_INVALID,
                                         "post_backward: unit '%s' (%u) reported last_use twice "
                                         "in micro-step %u", unit_name(e, u), u, h->micro);
        e->final_at[u] = h->micro + 1;
        if (++g->n_final == g->n_units &&
            (rc = group_complete(e, gi, h->micro + 1 == h->n_micro)) != DT_OK)
            return rc;
    }
    if (g->active == 0 && (e->cfg.reshard_after_forward || g->bwd_done) &&
        (rc = release_params(e, gi)) != DT_OK)
        return rc;
    if (g->active == 0 && e->n_active == 0 && e->cfg.prefetch_bwd_post &&
        (rc = prefetch(e, gi, -1, e->cfg.prefetch_bwd)) != DT_OK)
        e->failed = 1;
    return rc;
}

int dt_shard_begin_step(dt_shard_t *e, int64_t step)
{
    /* A step abandoned mid-way leaves reductions running into the
     * gradient shards: finish them before zeroing. */
    int rc = dt_shard__drain(e, -1);
    if (rc != DT_OK)
        return rc;
    for (uint32_t i = 0; i < e->plan.n_groups; i++) {
        sh_group_t *g = &e->g[i];
        if (g->gbuf_transient) {
            e->dp.dev_ops->free(e->dp.dev, g->gbuf);
            g->gbuf = NULL;
            g->gbuf_transient = 0;
        }
        g->n_final = 0;
        g->final_sent = 0;
        g->bwd_done = 0;
        g->active = 0;
    }
    e->n_active = 0;
    dt_dp_hooks_reset(&e->dp);
    memset(e->final_at, 0, e->dp.model->n_units * sizeof(uint32_t));
    float *grads = e->gfull ? e->gfull : e->gshard;
    uint64_t n = e->gfull ? e->plan.full_total : e->plan.shard_total;
    rc = e->dp.dev_ops->memset_async(e->dp.dev, grads, 0, n * sizeof(float), e->dp.cs);
    if (rc != DT_OK)
        e->dp.host->log(e->dp.host, DT_LOG_ERROR, "begin_step %lld: zeroing gradients failed",
                        (long long)step);
    return rc;
}

/* ------------------------------------------------------------ the step */

/* Every gradient reduced into this rank's shard, visible to compute. */
static int reduce_all(dt_shard_t *e)
{
    int rc = DT_OK;
    /* groups whose gradient never reported complete, or whose reduction
     * waits for the step (overlap off): in backward order, the same on
     * every rank */
    for (uint32_t i = e->plan.n_groups; rc == DT_OK && i-- > 0;) {
        sh_group_t *g = &e->g[i];
        if (g->gbuf_transient) {
            float *buf = g->gbuf;
            g->gbuf = NULL;
            g->gbuf_transient = 0;
            g->final_sent = 1;
            rc = red_launch(e, i, SH_R_SCATTER_ADD, buf, e->rsize > 1);
        } else if (!g->final_sent) {
            rc = launch_final(e, i);
        }
    }
    int rc2 = red_finish_all(e, rc == DT_OK ? -1 : 0);
    return rc != DT_OK ? rc : rc2;
}

static int grad_sumsq(dt_shard_t *e, double *out)
{
    const dt_host_v1_t *host = e->dp.host;
    int rc;
    double ss = 0.0;
    if (e->gshard) {
        rc = dt_norm_sumsq(host, e->dp.dev_ops, e->dp.dev, e->dp.cs, e->norm_slot, e->gshard,
                           DT_F32, (int64_t)e->plan.shard_total, &ss);
    } else {
        rc = DT_OK;
        for (uint32_t i = 0; rc == DT_OK && i < e->plan.n_groups; i++) {
            double part = 0.0;
            rc = dt_norm_sumsq(host, e->dp.dev_ops, e->dp.dev, e->dp.cs, e->norm_slot,
                               dt_shard__gshard(e, i), DT_F32,
                               (int64_t)e->plan.groups[i].shard, &part);
            ss += part;
        }
    }
    /* each element is owned by one rank of the shard group; replicas of a
     * shard hold the same numbers and are not summed again */
    if (rc == DT_OK && e->ssize > 1)
        rc = dt_norm_allreduce(host, e->dp.comm_ops, e->scomm, e->dp.dev_ops, e->dp.dev, e->dp.cs,
                               e->norm_slot, &ss);
    *out = ss;
    return rc;
}

static int optimizer(dt_shard_t *e, const dt_optim_step_t *st)
{
    for (uint32_t u = 0; u < e->dp.model->n_units; u++) {
        uint64_t off;
        dt_range_t r = dt_shard_held(&e->plan, u, e->srank, &off);
        if (r.count == 0)
            continue;
        uint32_t gi = e->plan.group_of_unit[u];
        uint64_t local = off - e->plan.groups[gi].shard_off;
        int rc = dt_optim_range(e->dp.host, e->dp.dev_ops, e->dp.dev, e->dp.cs,
                                &e->dp.model->units[u], r,
                                dt_shard__master(e, gi) + local,
                                dt_shard__gshard(e, gi) + local, e->m + off,
                                e->v ? e->v + off : NULL, st);
        if (rc != DT_OK)
            return rc;
    }
    return DT_OK;
}

int dt_shard__refresh_params(dt_shard_t *e, const char *when)
{
    const dt_kernels_t *d = e->dp.dev_ops->kernels();
    int rc = DT_OK;
    if (e->pdtype == DT_BF16) {
        if (e->replica) {
            for (uint32_t i = 0; rc == DT_OK && i < e->plan.n_groups; i++)
                rc = d->cast(e->dp.dev, e->dp.cs, dt_shard__cshard(e, i), DT_BF16,
                             dt_shard__master(e, i), DT_F32,
                             (int64_t)e->plan.groups[i].shard);
        } else {
            rc = d->cast(e->dp.dev, e->dp.cs, e->cshard, DT_BF16, e->master, DT_F32,
                         (int64_t)e->plan.shard_total);
        }
        if (rc != DT_OK) {
            e->dp.host->log(e->dp.host, DT_LOG_ERROR, "%s: refreshing the bf16 parameters failed",
                            when);
            return rc;
        }
    }
    if (e->ssize == 1)
        return DT_OK; /* the compute copy is the shard itself */
    if (!e->cfg.params_replicated) {
        for (uint32_t i = 0; i < e->plan.n_groups; i++)
            if (e->g[i].persistent)
                e->g[i].pstate = SH_P_FREE; /* stale: gathered again on use */
        return DT_OK;
    }
    /* replicas: every rank's updated shard to everyone, in place, at most
     * gather_numel elements in flight */
    for (uint32_t i = 0; i < e->plan.n_groups; i++)
        e->g[i].pstate = SH_P_FREE;
    for (uint32_t i = 0; rc == DT_OK && i < e->plan.n_groups; i++) {
        uint64_t padded = e->plan.groups[i].padded;
        while (rc == DT_OK && e->n_gathers > 0 && e->cfg.gather_numel &&
               e->gather_inflight + padded > e->cfg.gather_numel)
            rc = gather_finish(e, oldest_gather(e), -1);
        if (rc == DT_OK)
            rc = gather_start(e, i);
    }
    int rc2 = dt_shard__drain(e, rc == DT_OK ? -1 : 0);
    if (rc == DT_OK)
        rc = rc2;
    if (rc != DT_OK) {
        e->failed = 1;
        e->dp.host->log(e->dp.host, DT_LOG_ERROR, "%s: rank %d/%d: all-gathering the updated "
                        "parameters failed", when, e->dp.rank, e->dp.size);
    }
    return rc;
}

int dt_shard_step(dt_shard_t *e, const dt_step_args_v1_t *args, dt_step_result_v1_t *out)
{
    int rc = dt_dp_step_check(&e->dp, args, out);
    if (rc != DT_OK)
        return rc;
    rc = reduce_all(e);
    /* gathered copies go stale with the update (and were only a cache) */
    for (uint32_t i = 0; i < e->plan.n_groups; i++) {
        int rc2 = release_params(e, i);
        if (rc == DT_OK)
            rc = rc2;
    }
    if (rc == DT_OK)
        rc = compute_after_comm(e);
    if (rc != DT_OK) {
        e->failed = 1;
        return rc;
    }

    double sumsq = 0.0;
    if ((rc = grad_sumsq(e, &sumsq)) != DT_OK)
        return rc;
    dt_optim_step_t st = dt_dp_step_norm(&e->dp, args, sumsq, out);
    if (out->nonfinite)
        return DT_OK;
    if ((rc = optimizer(e, &st)) != DT_OK)
        return rc;
    return dt_shard__refresh_params(e, "step");
}
