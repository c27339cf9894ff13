/*
 * plugins/shard/shard_offload.c - ZeRO-Offload and ZeRO-Infinity's
 * parameter offload in the sharded engine.
 *
 * offload_what naming the optimizer: a rank's f32 master shard and its
 * moments live in the offload tier instead of the device
 * (dtrain/sdk/offload.h).  The step updates each held range on the host
 * and writes the new parameters into the compute copy, and the all-gather
 * after it runs as without offload.
 *
 * offload_what naming the parameters (zero stage 3, fsdp FULL_SHARD): the
 * compute shard itself lives in the tier.  A group's gather first loads
 * this rank's shard from the tier into its slot of the gathered buffer,
 * then all-gathers in place (shard_gather.c); prefetching starts the
 * next groups' loads and gathers ahead of use as it does the gathers.
 * The step writes the updated parameters straight into the tier (from the
 * host optimizer, or from the device master through pinned staging).
 *
 * With the optimizer there, the reduced gradient shard goes there too
 * (shard_grads_offloaded: DeepSpeed's offload_optimizer moves gradients to
 * the host as each bucket is reduced): as a group's reduce-scatter
 * completes, this rank's block is added into the tier's gradient (the
 * first block of a step stored as 0 + x), where the device would have
 * added it into its gradient shard; on one shard rank, where backward
 * accumulates straight into the shard, each micro-step's group buffer
 * starts from the tier's sum so far and is stored back whole.  The norm
 * and the host optimizer read it from the tier.  The device keeps no
 * gradient shard, only the transient group buffers (tag comm).
 *
 * Only where the state lives changes, never the arithmetic: losses equal
 * the run without offload bit for bit (on the cpu device, whose sum of
 * squares dt_sumsq_run_t reproduces on the host).
 *
 * All of it reaches the engine as the slots of dt_shard_home_t that
 * shard_offload_home puts in place of the device's (shard_home.c) at
 * init: gather, reduce, step and state never ask what is offloaded.
 */
#include <stdio.h>

#include "shard_internal.h"

int shard_offload_configure(dt_shard_engine_t *e)
{
    const char *what = e->cfg.what ? e->cfg.what : "sharding";
    return dt_offload_what(e->dp.host, &e->dp.args.init, e->cfg.params_offload_ok, what,
                           &e->offload_what);
}

/* Elements of e->pstage: a piece, or the whole shard when smaller. */
static uint64_t stage_numel(const dt_shard_engine_t *e)
{
    uint64_t S = e->plan.shard_total;
    return S < DT_OFFLOAD_PIECE ? (S ? S : 1) : DT_OFFLOAD_PIECE;
}

int shard_offload_alloc(dt_shard_engine_t *e)
{
    const dt_strategy_init_v1_t *a = &e->dp.args.init;
    uint64_t S = e->plan.shard_total;
    int rc = DT_OK;
    if (shard_params_offloaded(e)) {
        rc = dt_offload_params_init(&e->par, e->dp.host, a, e->dp.rank, S);
        if (rc == DT_OK && !shard_optim_offloaded(e))
            rc = dt_device_ops(a->dev)->host_alloc(a->dev, stage_numel(e) * sizeof(float),
                                                   DT_TAG_STAGING, (void **)&e->pstage);
        if (rc != DT_OK)
            return rc;
    }
    if (shard_optim_offloaded(e))
        rc = dt_offload_state_init(&e->off, e->dp.host, a, e->dp.rank, S, shard_has_v(e),
                                   shard_params_offloaded(e) ? &e->par : NULL);
    if (rc == DT_OK && shard_optim_offloaded(e) && shard_grads_offloaded(e))
        rc = dt_offload_state_grads(&e->off);
    return rc;
}

void shard_offload_free(dt_shard_engine_t *e)
{
    dt_offload_state_free(&e->off);
    dt_offload_params_free(&e->par);
    if (e->pstage)
        dt_device_ops(e->dp.dev)->host_free(e->dp.dev, e->pstage);
    e->pstage = NULL;
}

/* This rank's slot of group gi's gathered buffer. */
static void *slot_of(dt_shard_engine_t *e, uint32_t gi)
{
    return (char *)e->g[gi].full + (uint64_t)e->srank * e->plan.groups[gi].shard * e->pes;
}

/* load_ahead: start loading this rank's shard of group gi from the tier
 * into its slot of the gathered buffer (allocating a transient one),
 * ordered after the compute stream's work so far; no-op when the group is
 * gathered or loading.  The planner's replay allocates, and counts the
 * bytes a tier would load (e->replay_loaded). */
static int load_start(dt_shard_engine_t *e, uint32_t gi)
{
    sh_group_t *g = &e->g[gi];
    const dt_shard_group_t *gr = &e->plan.groups[gi];
    if (g->pstate != SH_P_FREE || g->lreq)
        return DT_OK;
    int rc = shard_full_alloc(e, gi);
    if (rc == DT_OK && !e->offload_what) {
        /* the planner's replay: no tier to load from; counted, and marked
         * loading as a tier's load would be (a second call is a no-op) */
        static char replay_load;
        e->replay_loaded += gr->shard * e->pes;
        g->lreq = (dt_offload_req_t *)(void *)&replay_load;
        return rc;
    }
    if (rc != DT_OK)
        return rc;
    rc = dt_offload_params_load(&e->par, gr->shard_off, gr->shard, slot_of(e, gi), e->dp.cs,
                                &g->lreq);
    if (rc != DT_OK) {
        g->lreq = NULL;
        shard_log_group(e, gi, "loading the offloaded parameter shard", rc);
    }
    return rc;
}

/* load_wait: wait for group gi's load, if one is in flight. */
static int load_finish(dt_shard_engine_t *e, uint32_t gi)
{
    sh_group_t *g = &e->g[gi];
    if (!g->lreq || !e->offload_what) { /* none, or the replay's mark */
        g->lreq = NULL;
        return DT_OK;
    }
    /* never dropped: the tier would still write into `full` */
    int rc = dt_offload_ops(e->par.tier)->wait(e->par.tier, g->lreq, -1);
    g->lreq = NULL;
    if (rc != DT_OK)
        shard_log_group(e, gi, "loading the offloaded parameter shard", rc);
    return rc;
}

/* load: the shard loaded (usually ahead, by shard_prefetch) into its
 * slot, which the gather then sends in place. */
static int load(dt_shard_engine_t *e, uint32_t gi, const void **send)
{
    int rc = load_start(e, gi);
    if (rc == DT_OK)
        rc = load_finish(e, gi);
    *send = rc == DT_OK ? slot_of(e, gi) : NULL;
    return rc;
}

/* grads_add: group gi's f32 block (`shard` elements, device) after the
 * work queued on `stream` into the tier, added to what earlier
 * micro-steps put there (whole: the block is the whole sum so far).  In
 * the planner's replay (no tier) nothing moves. */
static int grads_add(dt_shard_engine_t *e, uint32_t gi, const float *dblock, dt_stream_t *stream,
                     int whole)
{
    sh_group_t *g = &e->g[gi];
    const dt_shard_group_t *gr = &e->plan.groups[gi];
    int mode = whole ? DT_OFFLOAD_GRADS_COPY
               : g->gadds == 0 ? DT_OFFLOAD_GRADS_FIRST : DT_OFFLOAD_GRADS_ADD;
    int rc = DT_OK;
    if (shard_optim_offloaded(e)) /* else the planner's replay: no tier */
        rc = dt_offload_grads_add(&e->off, gr->shard_off, gr->shard, dblock, stream, mode);
    if (rc != DT_OK) {
        shard_log_group(e, gi, "moving the reduced gradient shard to the offload tier", rc);
        return rc;
    }
    g->gadds++;
    return DT_OK;
}

/* grads_buffer: a new gradient buffer for group gi (`padded` f32,
 * device, tag comm, zeroed: [shard, padded) is padding, zero like a
 * persistent buffer's); on one shard rank, where nothing reduces it,
 * holding what earlier micro-steps of the step accumulated, so backward
 * adds onto the same bits a persistent buffer would hold. */
static int grads_buffer(dt_shard_engine_t *e, uint32_t gi, float **out)
{
    const dt_shard_group_t *gr = &e->plan.groups[gi];
    *out = NULL;
    int rc = shard_alloc_zeroed(e, gr->padded, DT_F32, DT_TAG_COMM,
                                "a group's gradient buffer", (void **)out);
    if (e->ssize > 1)
        return rc; /* reduced into the tier block by block (grads_add) */
    if (rc == DT_OK && e->g[gi].gadds > 0 && shard_optim_offloaded(e))
        rc = dt_offload_grads_load(&e->off, gr->shard_off, gr->shard, *out, e->dp.cs);
    if (rc != DT_OK) {
        shard_log_group(e, gi, "loading the offloaded gradient shard", rc);
        if (*out)
            dt_device_ops(e->dp.dev)->free(e->dp.dev, *out);
        *out = NULL;
    }
    return rc;
}

/* grads_end: a group no backward touched this step holds zeros in the
 * tier, as the device's shard zeroed at begin_step would. */
static int grads_end(dt_shard_engine_t *e)
{
    int rc = DT_OK;
    for (uint32_t i = 0; rc == DT_OK && i < e->plan.n_groups; i++) {
        if (e->g[i].gadds > 0)
            continue;
        float *zeros = NULL;
        rc = shard_alloc_zeroed(e, e->plan.groups[i].shard, DT_F32, DT_TAG_COMM,
                                "zero gradients of an untouched group", (void **)&zeros);
        if (rc == DT_OK)
            rc = grads_add(e, i, zeros, e->dp.cs, 1);
        if (zeros)
            dt_device_ops(e->dp.dev)->free(e->dp.dev, zeros);
    }
    return rc;
}

/* grads_sumsq: the sum of squares of this rank's gradient shard in the
 * tier, less the norm plan's skip ranges (a shard of several parts: the
 * tensor-parallel copies another rank counts; never a stage's COPY unit,
 * whose tied gradient stays on the device). */
static int grads_sumsq(dt_shard_engine_t *e, double *out)
{
    *out = 0.0;
    if (!shard_optim_offloaded(e)) /* the planner's replay */
        return DT_OK;
    int rc = dt_offload_grads_sumsq_skip(&e->off, e->norm.skip, e->norm.n_skip, out);
    if (rc != DT_OK)
        e->dp.host->log(e->dp.host, DT_LOG_ERROR, "rank %d/%d: the norm of the offloaded "
                        "gradient shard failed", e->dp.rank, e->dp.size);
    return rc;
}

/* Parameters offloaded, optimizer on the device: the updated f32 master
 * (device) into the tier's compute shard, piece by piece through pinned
 * staging (bf16/f16 rounded on the host, nearest even like the device's cast). */
static int params_from_master(dt_shard_engine_t *e)
{
    const dt_device_ops_v1_t *d = dt_device_ops(e->dp.dev);
    uint64_t S = e->plan.shard_total, piece = stage_numel(e);
    int rc = DT_OK;
    for (uint64_t c = 0; rc == DT_OK && c < S; c += piece) {
        uint64_t k = S - c < piece ? S - c : piece;
        rc = d->memcpy_async(e->dp.dev, e->pstage, e->master + c, k * sizeof(float),
                             DT_COPY_D2H, e->dp.cs);
        if (rc == DT_OK)
            rc = d->stream_sync(e->dp.dev, e->dp.cs);
        if (rc == DT_OK)
            rc = dt_offload_params_write(&e->par, c, k, e->pstage);
    }
    if (rc != DT_OK)
        e->dp.host->log(e->dp.host, DT_LOG_ERROR, "rank %d: writing the updated parameters to "
                        "the offload tier failed", e->dp.rank);
    return rc;
}

/* Where group gi's compute copy of shard element `local` (group-relative)
 * is: the replica's slot of this rank, or the compute shard (on the device,
 * or in the tier). */
static void *compute_at(dt_shard_engine_t *e, uint32_t gi, uint64_t local)
{
    char *c = shard_cshard(e, gi);
    return c ? c + local * e->pes : NULL; /* NULL: the tier's (e->par) */
}

/* update: every held range on the host, parameters written back to the
 * compute copy (in place of the device optimizer). */
static int update(dt_shard_engine_t *e, const dt_optim_step_t *st)
{
    for (uint32_t u = 0; u < e->dp.model->n_units; u++) {
        uint64_t off;
        dt_range_t r = dt_shard_held(&e->plan, u, e->srank, &off);
        if (r.count == 0)
            continue;
        uint32_t gi = e->plan.group_of_unit[u];
        uint64_t local = off - e->plan.groups[gi].shard_off;
        float *dgrad = shard_gshard(e, gi); /* NULL: the tier's */
        int rc = dt_offload_state_update(&e->off, &e->dp.model->units[u], r, off,
                                         dgrad ? dgrad + local : NULL, compute_at(e, gi, local),
                                         st);
        if (rc != DT_OK)
            return rc;
    }
    /* the last unit's stores, before the step's parameters are loaded */
    int rc = dt_offload_state_flush(&e->off);
    if (rc != DT_OK)
        return rc;
    char when[48];
    snprintf(when, sizeof when, "step %lld", (long long)st->t);
    dt_offload_state_report(&e->off, when);
    return DT_OK;
}

/* The planner's replay with the gradient shard in the tier: the tier's
 * update is left out, the compute copy refreshed as on the device. */
static int replay_update(dt_shard_engine_t *e, const dt_optim_step_t *st)
{
    (void)st;
    return e->home.publish(e, "step");
}

/* publish: the whole master shard to the compute copy (state_loaded; after
 * the device optimizer's step when only the parameters are offloaded). */
static int push(dt_shard_engine_t *e, const char *when)
{
    (void)when; /* the tier names what failed */
    if (!shard_optim_offloaded(e))
        return params_from_master(e);
    int rc = DT_OK;
    for (uint32_t i = 0; rc == DT_OK && i < e->plan.n_groups; i++)
        rc = dt_offload_state_push(&e->off, e->plan.groups[i].shard_off,
                                   e->plan.groups[i].shard, compute_at(e, i, 0));
    return rc;
}

static int state_get(dt_shard_engine_t *e, uint32_t unit, int kind, dt_range_t r, uint64_t at,
                     float *buf)
{
    (void)unit;
    return r.count ? dt_offload_state_read(&e->off, kind, at, r.count, buf) : DT_OK;
}

static int state_set(dt_shard_engine_t *e, uint32_t unit, int kind, dt_range_t r, uint64_t at,
                     const float *buf)
{
    (void)unit;
    return r.count ? dt_offload_state_write(&e->off, kind, at, r.count, buf) : DT_OK;
}

void shard_offload_home(dt_shard_engine_t *e, dt_shard_home_t *h)
{
    if (shard_params_offloaded(e)) { /* the planner's replay too: its schedule */
        h->load_ahead = load_start;
        h->load = load;
        h->load_wait = load_finish;
    }
    if (shard_grads_offloaded(e)) {
        h->grads_buffer = grads_buffer;
        h->grads_add = grads_add;
        h->grads_end = grads_end;
        h->grads_sumsq = grads_sumsq;
        if (!shard_optim_offloaded(e))
            h->update = replay_update;
    }
    if (e->offload_what) /* a tier, not the replay */
        h->publish = push;
    if (shard_optim_offloaded(e)) {
        h->update = update;
        h->state_get = state_get;
        h->state_set = state_set;
    }
}
