/*
 * plugins/shard/shard_reduce.c - gradients: moving a group from its full
 * form to its sharded form.  The reduce-scatter of one group's gradient
 * (ZeRO-2/3 and FSDP: as soon as backward completes the group, every
 * micro-step; ZeRO-1: once, in the final micro-step, in place in the full
 * gradient buffer), the all-reduce of a gradient shard across its replicas
 * (HYBRID_SHARD), and the queue of reductions in flight.
 *
 * Gradient averaging.  The core accumulates, over a step's micro-steps,
 * gradients of each micro-batch's mean loss already scaled by 1/n_micro,
 * so all that is left is the mean across ranks: reduce_scatter with
 * DT_OP_AVG inside a shard group, then (hybrid) all_reduce AVG across the
 * replicas of a shard; a mean of means of equal groups is the mean.
 *
 * reduce_dtype bf16/fp16: a reduction's f32 source is cast into a wire
 * buffer of that dtype (allocated per reduction, tagged comm, freed when
 * it completes), the collective runs on the wire buffer, and this rank's
 * reduced block is cast back into the f32 place the f32 collective would
 * have written.  The communicator sums in f32 and rounds once.
 *
 * A completed reduce-scatter's block goes to the gradient shard through
 * e->home.grads_add (the device's shard; an offload tier's with the
 * optimizer there, shard_offload.c); on one shard rank a transient buffer
 * (only a tier's) has nothing to reduce and goes there whole.
 *
 * Reductions run on the communication stream, ordered after the compute
 * stream by an event when they start, and complete oldest first; they
 * start only at hooks and in the step, so every rank makes the same calls
 * in the same order.
 */
#include "shard_internal.h"

static int red_finish_one(dt_shard_engine_t *e, int64_t timeout_ms);

/* What reduction `kind` of group gi moves: `numel` f32 elements at `src`
 * reduced over `comm`, this rank's reduced block (`shard` elements) `at`
 * elements into it.  `buf`: a SCATTER_ADD's transient buffer. */
typedef struct red_what {
    dt_comm_t *comm;
    float *src;
    uint64_t numel, at;
} red_what_t;

static red_what_t red_what(dt_shard_engine_t *e, uint32_t gi, int kind, float *buf)
{
    const dt_shard_group_t *gr = &e->plan.groups[gi];
    const uint64_t mine = (uint64_t)e->srank * gr->shard;
    switch (kind) {
    case SH_R_SCATTER_ADD: return (red_what_t){e->scomm, buf, gr->padded, mine};
    case SH_R_SCATTER: return (red_what_t){e->scomm, e->gfull + gr->full_off, gr->padded, mine};
    default: /* HYBRID: the reduced shard across its replicas */
        return (red_what_t){e->rcomm, shard_gshard(e, gi), gr->shard, 0};
    }
}

/* A 16-bit reduce_dtype: `numel` elements of the source cast into a new
 * wire buffer (*wire) on the communication stream. */
static int red_wire(dt_shard_engine_t *e, uint32_t gi, const float *src, uint64_t numel,
                    void **wire)
{
    const int dt = e->cfg.reduce_dtype;
    int rc =
        dt_device_ops(e->dp.dev)->alloc(e->dp.dev, numel * dt_dtype_size(dt), DT_TAG_COMM, wire);
    if (rc != DT_OK) {
        shard_log_group(e, gi, "allocating the 16-bit gradient wire buffer", rc);
        return rc;
    }
    rc = e->dp.kernels->cast(e->dp.dev, e->comm_stream, *wire, dt, src, DT_F32,
                                        (int64_t)numel);
    if (rc != DT_OK) {
        shard_log_group(e, gi, "casting the gradients to the reduce dtype", rc);
        dt_device_ops(e->dp.dev)->free(e->dp.dev, *wire);
        *wire = NULL;
    }
    return rc;
}

/* Queue a reduction of group gi: `kind` SH_R_*, `buf` the transient
 * buffer of a SCATTER_ADD (freed here on failure), `then_replicas` an
 * all-reduce across replicas to follow it.  Waits for older reductions
 * while the queue is over its caps. */
static int red_launch(dt_shard_engine_t *e, uint32_t gi, int kind, float *buf, int then_replicas)
{
    const red_what_t w = red_what(e, gi, kind, buf);
    int rc = DT_OK;
    while (e->red_n > 0 && (e->red_n == e->red_cap ||
                            (e->cfg.max_reduces && e->red_n >= e->cfg.max_reduces) ||
                            (e->cfg.max_reduce_numel &&
                             e->red_numel + w.numel > e->cfg.max_reduce_numel)))
        if ((rc = red_finish_one(e, -1)) != DT_OK)
            break;
    if (rc == DT_OK)
        rc = shard_comm_after_compute(e);
    dt_comm_req_t *req = NULL;
    /* in place, in f32 or in the wire buffer of the reduce dtype */
    const int dt = e->cfg.reduce_dtype ? e->cfg.reduce_dtype : DT_F32;
    void *wire = NULL;
    char *src = (char *)w.src;
    if (rc == DT_OK && dt != DT_F32 && (rc = red_wire(e, gi, w.src, w.numel, &wire)) == DT_OK)
        src = wire;
    if (rc == DT_OK && kind != SH_R_REPLICAS) {
        rc = dt_shard_reduce(e->dp.host, w.comm, &e->plan, gi, src,
                             src + w.at * dt_dtype_size(dt), dt, DT_OP_AVG, e->comm_stream,
                             &req);
    } else if (rc == DT_OK) {
        rc = dt_comm_ops(w.comm)->all_reduce(w.comm, src, src, w.numel, dt, DT_OP_AVG,
                                        e->comm_stream, &req);
        if (rc != DT_OK)
            shard_log_group(e, gi, "all_reduce across replicas of the gradient shard", rc);
    }
    if (rc != DT_OK) {
        e->failed = 1;
        if (buf)
            dt_device_ops(e->dp.dev)->free(e->dp.dev, buf);
        if (wire)
            dt_device_ops(e->dp.dev)->free(e->dp.dev, wire);
        return rc;
    }
    sh_red_t *r = &e->red[(e->red_head + e->red_n) % e->red_cap];
    *r = (sh_red_t){.group = gi, .kind = kind, .then_replicas = then_replicas,
                    .numel = w.numel, .buf = buf, .wire = wire, .req = req};
    e->red_n++;
    e->red_numel += w.numel;
    e->g[gi].queued++;
    return DT_OK;
}

/* Complete the oldest reduction: a SCATTER_ADD adds its block to the
 * gradient shard and frees its buffer; a chain goes on to the replicas. */
static int red_finish_one(dt_shard_engine_t *e, int64_t timeout_ms)
{
    sh_red_t r = e->red[e->red_head];
    e->red_head = (e->red_head + 1) % e->red_cap;
    e->red_n--;
    e->red_numel -= r.numel;
    e->g[r.group].queued--;
    const red_what_t w = red_what(e, r.group, r.kind, r.buf);
    const int64_t shard = (int64_t)e->plan.groups[r.group].shard;
    int rc = dt_comm_ops(w.comm)->wait(w.comm, r.req, timeout_ms); /* frees req */
    if (r.wire) { /* this rank's reduced block back to f32 where f32 would be */
        const int dt = e->cfg.reduce_dtype;
        if (rc == DT_OK)
            rc = e->dp.kernels->cast(e->dp.dev, e->comm_stream, w.src + w.at, DT_F32,
                                     (char *)r.wire + w.at * dt_dtype_size(dt), dt, shard);
        dt_device_ops(e->dp.dev)->free(e->dp.dev, r.wire);
    }
    if (rc == DT_OK && r.kind == SH_R_SCATTER_ADD) /* into the gradient shard */
        rc = e->home.grads_add(e, r.group, w.src + w.at, e->comm_stream, 0);
    if (r.buf)
        dt_device_ops(e->dp.dev)->free(e->dp.dev, r.buf); /* waits for the axpy */
    if (rc != DT_OK) {
        e->failed = 1;
        if (timeout_ms != 0)
            shard_log_group(e, r.group, r.kind == SH_R_REPLICAS ? "all_reduce across replicas"
                                                                : "reduce_scatter of the gradients",
                            rc);
        return rc;
    }
    if (r.then_replicas && timeout_ms != 0) /* dropping starts nothing new */
        return red_launch(e, r.group, SH_R_REPLICAS, NULL, 0);
    return DT_OK;
}

int shard_reductions_finish(dt_shard_engine_t *e, int64_t timeout_ms)
{
    int first = DT_OK;
    while (e->red_n > 0) {
        int rc = red_finish_one(e, timeout_ms);
        /* After a failure (timeout_ms != 0) the rest stay queued for
         * destroy, which drops them (timeout_ms 0): cancelling them here
         * would replace the first failure's message with a later one's. */
        if (rc != DT_OK && timeout_ms != 0)
            return rc;
        if (rc != DT_OK && first == DT_OK)
            first = rc;
    }
    return first;
}

/* The reduction that ends a group's gradient for the step, for gradient
 * buffers that persist across micro-steps (full gradients; whole shards). */
static int launch_final(dt_shard_engine_t *e, uint32_t gi)
{
    e->g[gi].final_sent = 1;
    if (e->gfull && e->ssize > 1)
        return red_launch(e, gi, SH_R_SCATTER, NULL, e->rsize > 1);
    if (e->rsize > 1)
        return red_launch(e, gi, SH_R_REPLICAS, NULL, 0);
    return DT_OK;
}

/* Hand group gi's gradient of this micro-step on: its transient buffer
 * to a reduce-scatter (then freed), `final` the step's last, followed
 * across replicas (HYBRID); on one shard rank (a tier's buffer, carrying
 * the step's sum so far: grads_buffer) nothing reduces, the buffer goes
 * to the gradient shard whole. */
static int hand_on(dt_shard_engine_t *e, uint32_t gi, int final)
{
    sh_group_t *g = &e->g[gi];
    float *buf = g->gbuf;
    g->gbuf = NULL;
    g->gbuf_transient = 0;
    if (final)
        g->final_sent = 1;
    if (e->ssize > 1)
        return red_launch(e, gi, SH_R_SCATTER_ADD, buf, final && e->rsize > 1);
    int rc = e->home.grads_add(e, gi, buf, e->dp.cs, 1);
    dt_device_ops(e->dp.dev)->free(e->dp.dev, buf);
    return rc;
}

int shard_group_complete(dt_shard_engine_t *e, uint32_t gi, int final_micro)
{
    sh_group_t *g = &e->g[gi];
    g->n_final = 0;
    g->bwd_done = 1;
    int rc = DT_OK;
    if (g->gbuf_transient) {
        rc = hand_on(e, gi, final_micro);
        if (rc == DT_OK && !e->cfg.overlap)
            rc = shard_reductions_finish(e, -1);
    } else if (final_micro && e->cfg.overlap) {
        rc = launch_final(e, gi);
    }
    return rc;
}

int shard_grad_buffer(dt_shard_engine_t *e, uint32_t gi)
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
        rc = e->home.grads_buffer(e, gi, &g->gbuf);
    if (rc != DT_OK)
        return rc;
    g->gbuf_transient = 1;
    return DT_OK;
}

int shard_reduce_all(dt_shard_engine_t *e)
{
    int rc = DT_OK;
    /* groups whose gradient never reported complete, or whose reduction
     * waits for the step (overlap off): in backward order, the same on
     * every rank */
    for (uint32_t i = e->plan.n_groups; rc == DT_OK && i-- > 0;) {
        if (e->g[i].gbuf_transient)
            rc = hand_on(e, i, 1);
        else if (!e->g[i].final_sent)
            rc = launch_final(e, i);
    }
    /* after a failure, what is queued is destroy's to drop */
    if (rc == DT_OK)
        rc = shard_reductions_finish(e, -1);
    if (rc == DT_OK)
        rc = e->home.grads_end(e);
    return rc;
}
