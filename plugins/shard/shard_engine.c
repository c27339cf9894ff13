/*
 * plugins/shard/shard_engine.c - setting up and freeing a sharded engine:
 * the shard and replica groups (comm splits for HYBRID_SHARD), the plan,
 * where the shard lives (e->home), the persistent buffers and each
 * group's place in them, the norm plan; and waiting for everything in
 * flight (shard_drain).
 */
#include <string.h>

#include "shard_internal.h"

int shard_drain(dt_shard_engine_t *e, int64_t timeout_ms)
{
    int first = shard_reductions_finish(e, timeout_ms);
    if (first != DT_OK && timeout_ms != 0)
        return first;
    int rc = shard_gathers_finish(e, timeout_ms);
    return first != DT_OK ? first : rc;
}

void dt_shard_engine_free(dt_shard_engine_t *e)
{
    if (!e || !e->dp.host)
        return;
    const dt_host_v1_t *host = e->dp.host;
    const dt_device_ops_v1_t *d = dt_device_ops(e->dp.dev);
    /* nothing may be freed under a collective: a failing drain leaves
     * requests in flight, dropped then */
    if (e->red && (e->failed || shard_drain(e, -1) != DT_OK))
        shard_drain(e, 0);
    if (e->dp.dev) {
        for (uint32_t i = 0; e->g && i < e->plan.n_groups; i++) {
            sh_group_t *g = &e->g[i];
            if (g->gbuf_transient)
                d->free(e->dp.dev, g->gbuf);
            if (g->full && (g->transient || g->owns_full))
                d->free(e->dp.dev, g->full);
        }
        dt_dp_free_shared(&e->dp, e->scomm, e->replica, e->sym_replica);
        d->free(e->dp.dev, e->cshard);
        d->free(e->dp.dev, e->master);
        d->free(e->dp.dev, e->gshard);
        dt_dp_free_shared(&e->dp, e->scomm, e->gfull, e->sym_gfull);
        d->free(e->dp.dev, e->m);
        d->free(e->dp.dev, e->v);
        d->free(e->dp.dev, e->norm_slot);
        shard_offload_free(e);
        if (e->ev_compute)
            d->event_destroy(e->dp.dev, e->ev_compute);
        if (e->ev_comm)
            d->event_destroy(e->dp.dev, e->ev_comm);
        if (e->comm_stream)
            d->stream_destroy(e->dp.dev, e->comm_stream);
    }
    if (e->own_scomm)
        dt_comm_ops(e->scomm)->finalize(e->scomm);
    if (e->own_rcomm)
        dt_comm_ops(e->rcomm)->finalize(e->rcomm);
    dt_shard_plan_free(&e->plan, host);
    host->free(host, e->g);
    host->free(host, e->red);
    dt_dp_free(&e->dp);
    host->free(host, e->final_at);
    dt_norm_plan_free(host, &e->norm);
    memset(e, 0, sizeof *e);
}

/* What this rank's norm sums, as ranges of its gradient buffer (gfull's
 * full layout, else the shard buffer, where a tier keeps it too): the
 * whole shard buffer at once when nothing is left out, else group by
 * group, a pipeline stage's COPY units left to the owning stage and
 * tensor-parallel duplicates to the tensor group's rank 0. */
static int norm_plan(dt_shard_engine_t *e)
{
    const dt_shard_plan_t *p = &e->plan;
    if (!e->gfull && !e->dp.tied_comm && !dt_dp_has_norm_copies(&e->dp))
        return dt_norm_plan_part(e->dp.host, &e->norm,
                                 (dt_range_t){.offset = 0, .count = p->shard_total});
    int rc = DT_OK;
    for (uint32_t i = 0; rc == DT_OK && i < p->n_groups; i++) {
        const dt_shard_group_t *gr = &p->groups[i];
        const uint64_t first = (uint64_t)e->srank * gr->shard;
        rc = dt_dp_norm_plan_add(&e->dp, &e->norm, first, gr->shard, gr->unit_lo, gr->unit_hi,
                                 p->unit_off + gr->unit_lo,
                                 e->gfull ? gr->full_off + first : gr->shard_off);
    }
    return rc;
}

/* Shard and replica groups: split only when both have more than one rank
 * (collective: every rank of the group makes the same two calls). */
static int make_groups(dt_shard_engine_t *e)
{
    const dt_host_v1_t *host = e->dp.host;
    uint32_t size = (uint32_t)e->dp.size, rank = (uint32_t)e->dp.rank;
    uint32_t ss = e->cfg.shard_ranks ? e->cfg.shard_ranks : size;
    if (ss > size || size % ss != 0)
        return host->set_error(host, DT_ERR_CONFIG,
                               "%s: shard groups of %u rank%s do not divide the data-parallel "
                               "group of %u rank%s", e->cfg.what ? e->cfg.what : "sharding", ss,
                               ss == 1 ? "" : "s", size, size == 1 ? "" : "s");
    e->ssize = ss;
    e->rsize = size / ss;
    e->srank = rank % ss;
    e->rrank = rank / ss;
    if (ss > 1 && e->rsize == 1)
        e->scomm = e->dp.comm;
    else if (ss == 1 && e->rsize > 1)
        e->rcomm = e->dp.comm;
    else if (ss > 1) {
        int rc = dt_comm_ops(e->dp.comm)
                     ->split(e->dp.comm, (int32_t)(rank / ss), (int32_t)rank, &e->scomm);
        if (rc == DT_OK)
            e->own_scomm = 1;
        if (rc == DT_OK &&
            (rc = dt_comm_ops(e->dp.comm)->split(e->dp.comm, (int32_t)(rank % ss), (int32_t)rank,
                                        &e->rcomm)) == DT_OK)
            e->own_rcomm = 1;
        if (rc != DT_OK) {
            host->log(host, DT_LOG_ERROR, "rank %u/%u: splitting into shard groups of %u "
                      "ranks failed", rank, size, ss);
            return rc;
        }
        int32_t r1 = -1, s1 = -1, r2 = -1, s2 = -1;
        if ((rc = dt_comm_ops(e->scomm)->rank_size(e->scomm, &r1, &s1)) != DT_OK ||
            (rc = dt_comm_ops(e->rcomm)->rank_size(e->rcomm, &r2, &s2)) != DT_OK)
            return rc;
        if (r1 != (int32_t)e->srank || s1 != (int32_t)ss || r2 != (int32_t)e->rrank ||
            s2 != (int32_t)e->rsize)
            return host->set_error(host, DT_ERR_INVALID,
                                   "rank %u: split groups report rank %d of %d and %d of %d, "
                                   "expected %u of %u and %u of %u", rank, r1, s1, r2, s2,
                                   e->srank, ss, e->rrank, e->rsize);
    }
    return DT_OK;
}

static int make_buffers(dt_shard_engine_t *e)
{
    const dt_host_v1_t *host = e->dp.host;
    const dt_device_ops_v1_t *d = dt_device_ops(e->dp.dev);
    const dt_shard_plan_t *p = &e->plan;
    uint64_t S = p->shard_total, F = p->full_total;
    int rc;
    /* the gradient shard follows the optimizer into the tier (not ZeRO-1's
     * full gradients; not a shard the replicas all-reduce on the device;
     * not on a pipeline stage holding a tied unit, whose shard is summed
     * with the other stage's on the device) */
    uint32_t what = e->offload_what ? e->offload_what : e->cfg.plan_offload_what;
    e->grads_offloaded = (what & DT_OFFLOAD_WHAT_OPTIMIZER) && !e->cfg.grads_full &&
                         e->rsize == 1 && !e->dp.tied_comm;
    /* where the shard lives, once: the device, the tier for what it holds */
    shard_home_device(&e->home);
    shard_offload_home(e, &e->home);
    /* the buffers the shard group gathers into (the replica) and
     * reduce-scatters from (the full gradients): in its symmetric memory
     * where it has some */
    dt_comm_t *sym_comm = e->ssize > 1 ? e->scomm : NULL;
    if (e->cfg.params_replicated)
        rc = dt_dp_alloc_shared(&e->dp, sym_comm, F * e->pes, DT_TAG_PARAMS,
                                "the parameter replica", &e->replica, &e->sym_replica);
    else if (!shard_params_offloaded(e))
        rc = shard_alloc_zeroed(e, S, e->pdtype, DT_TAG_PARAMS, "the parameter shard",
                                    &e->cshard);
    else
        rc = DT_OK; /* the compute shard lives in the tier */
    /* offloaded: the master and the moments (and the compute shard) live
     * in the tier; a device optimizer over offloaded parameters keeps an
     * f32 master of its own on the device */
    if (rc == DT_OK && e->offload_what)
        rc = shard_offload_alloc(e);
    if (rc == DT_OK && (e->pdtype != DT_F32 || shard_params_offloaded(e)) &&
        !shard_optim_offloaded(e))
        rc = shard_alloc_zeroed(e, S, DT_F32, DT_TAG_PARAMS, "the f32 master shard",
                          (void **)&e->master);
    if (rc == DT_OK) {
        if (e->cfg.grads_full)
            rc = dt_dp_alloc_shared(&e->dp, sym_comm, F * sizeof(float), DT_TAG_GRADS,
                                    "the full gradients", (void **)&e->gfull, &e->sym_gfull);
        else if (!shard_grads_offloaded(e))
            rc = shard_alloc_zeroed(e, S, DT_F32, DT_TAG_GRADS, "the gradient shard",
                              (void **)&e->gshard);
    }
    if (rc == DT_OK && !shard_optim_offloaded(e))
        rc = shard_alloc_zeroed(e, S, DT_F32, DT_TAG_OPTIMIZER,
                          e->dp.optim.kind == DT_OPTIM_ADAMW ? "adamw exp_avg" : "sgd momentum",
                          (void **)&e->m);
    if (rc == DT_OK && e->dp.optim.kind == DT_OPTIM_ADAMW && !shard_optim_offloaded(e))
        rc = shard_alloc_zeroed(e, S, DT_F32, DT_TAG_OPTIMIZER, "adamw exp_avg_sq",
                                    (void **)&e->v);
    if (rc == DT_OK)
        rc = d->alloc(e->dp.dev, sizeof(double), DT_TAG_OTHER, (void **)&e->norm_slot);
    if (rc == DT_OK)
        rc = norm_plan(e);
    if (rc != DT_OK)
        return rc;

    uint64_t ng1 = (uint64_t)p->n_groups + 1, nu1 = (uint64_t)p->n_units + 1;
    e->g = host->alloc(host, ng1 * sizeof *e->g, DT_TAG_OTHER);
    e->red_cap = 2 * p->n_groups + 2;
    e->red = host->alloc(host, (uint64_t)e->red_cap * sizeof *e->red, DT_TAG_OTHER);
    e->final_at = host->alloc(host, nu1 * sizeof(uint32_t), DT_TAG_OTHER);
    if (!e->g || !e->red || !e->final_at)
        return host->set_error(host, DT_ERR_NOMEM, "bookkeeping for %u groups", p->n_groups);
    memset(e->g, 0, ng1 * sizeof *e->g);
    memset(e->final_at, 0, nu1 * sizeof(uint32_t));

    for (uint32_t i = 0; i < p->n_groups; i++) {
        sh_group_t *g = &e->g[i];
        const dt_shard_group_t *gr = &p->groups[i];
        /* the units that report their last use: a pipeline stage's own
         * (a unit another stage holds is never hooked here, so counting it
         * would let the count of one micro-step run into the next and
         * call the group complete before its last backward) */
        g->n_units = 0;
        for (uint32_t u = gr->unit_lo; u <= gr->unit_hi; u++)
            g->n_units += (dt_dp_unit_flags(&e->dp, u) & DT_UNIT_HELD) != 0;
        if (e->cfg.params_replicated) {
            g->full = (char *)e->replica + gr->full_off * e->pes;
            g->persistent = 1;
            g->pstate = SH_P_READY;
        } else if (e->ssize == 1 && !shard_params_offloaded(e)) {
            g->full = (char *)e->cshard + gr->shard_off * e->pes;
            g->persistent = 1;
            g->is_shard = 1;
            g->pstate = SH_P_READY;
        } else if (gr->numel < e->cfg.persist_numel) {
            if ((rc = shard_alloc_zeroed(e, gr->padded, e->pdtype, DT_TAG_PARAMS,
                                   "a persistent gathered group", &g->full)) != DT_OK)
                return rc;
            g->persistent = 1;
            g->owns_full = 1;
        } else {
            g->transient = 1;
        }
        if (e->gfull)
            g->gbuf = e->gfull + gr->full_off;
        else if (e->ssize == 1 && e->gshard)
            g->gbuf = e->gshard + gr->shard_off;
    }

    if (e->dp.size > 1) {
        if ((rc = d->stream_create(e->dp.dev, &e->comm_stream)) != DT_OK ||
            (rc = d->event_create(e->dp.dev, &e->ev_compute)) != DT_OK ||
            (rc = d->event_create(e->dp.dev, &e->ev_comm)) != DT_OK) {
            host->log(host, DT_LOG_ERROR, "creating the communication stream/events failed");
            return rc;
        }
    }
    return d->stream_sync(e->dp.dev, e->dp.cs);
}

/* Runs of contiguous held units that are not TIED: more than one when
 * an interleaved pipeline stage holds several chunks. */
static uint32_t held_runs(const dt_shard_engine_t *e)
{
    uint32_t runs = 0;
    int in = 0;
    for (uint32_t u = 0; u < e->dp.model->n_units; u++) {
        const uint32_t f = dt_dp_unit_flags(&e->dp, u);
        const int held = (f & DT_UNIT_HELD) && !(f & DT_UNIT_TIED);
        runs += held && !in;
        in = held;
    }
    return runs;
}

/* The groups: the strategy's spans, with a pipeline stage's TIED units
 * (GPT-2's wte on the first and the last stage) each in a group of its
 * own, so both stages cut it into the same shards whatever units they
 * hold beside it, and the tied sum adds shard to matching shard.  On a
 * stage of several chunks (interleaved), no group spans two chunks: the
 * units between them (other stages') are groups of their own.  A group
 * completes a micro-batch once each of its units has, which needs the
 * group's backwards of one micro-batch to end before the next micro-
 * batch's begin; the schedule runs one chunk's micro-batches in order,
 * but the chunks' interleave. */
static int plan_groups(dt_shard_engine_t *e, const dt_shard_cfg_t *cfg)
{
    const dt_host_v1_t *host = e->dp.host;
    const uint32_t nu = e->dp.model->n_units;
    uint8_t *alone = NULL;
    const int chunks = e->dp.unit_flags && held_runs(e) > 1;
    if (e->dp.tied_comm || chunks) {
        if (!(alone = host->alloc(host, nu, DT_TAG_OTHER)))
            return host->set_error(host, DT_ERR_NOMEM, "shard plan: %u unit flags", nu);
        for (uint32_t u = 0; u < nu; u++) {
            const uint32_t f = dt_dp_unit_flags(&e->dp, u);
            alone[u] = (f & DT_UNIT_TIED) != 0 || (chunks && !(f & DT_UNIT_HELD));
        }
    }
    int rc = dt_shard_plan_init(&e->plan, host, e->dp.model, cfg->spans, cfg->n_spans, e->ssize,
                                DT_SHARD_ALIGN, alone);
    host->free(host, alone);
    return rc;
}

int dt_shard_engine_init(dt_shard_engine_t *e, const dt_strategy_ops_v1_t *ops,
                         const dt_host_v1_t *host,
                         const dt_strategy_init_v1_t *args, const dt_shard_cfg_t *cfg)
{
    const char *what = cfg->what ? cfg->what : "sharding";
    memset(e, 0, sizeof *e);
    e->cfg = *cfg;
    e->cfg.spans = NULL; /* planned below; not kept */
    int rc = dt_dp_init(&e->dp, ops, host, args, what);
    if (rc == DT_OK) {
        e->pdtype = args->model->param_dtype;
        e->pes = (uint32_t)dt_dtype_size(e->pdtype);
        rc = shard_offload_configure(e);
    }
    if (rc == DT_OK)
        rc = make_groups(e);
    if (rc == DT_OK)
        rc = plan_groups(e, cfg);
    if (rc == DT_OK)
        rc = make_buffers(e);
    if (rc != DT_OK) {
        e->failed = 1;
        dt_shard_engine_free(e);
        return rc;
    }
    host->log(host, DT_LOG_DEBUG,
              "rank %d/%d: %s, %llu parameters in %u group(s), shard %llu elements, %u "
              "shard rank(s) x %u replica(s)%s%s", e->dp.rank, e->dp.size, what,
              (unsigned long long)e->dp.model->numel, e->plan.n_groups,
              (unsigned long long)e->plan.shard_total, e->ssize, e->rsize,
              !e->offload_what                 ? ""
              : e->offload_what == DT_OFFLOAD_WHAT_OPTIMIZER ? ", optimizer state offloaded"
              : e->offload_what == DT_OFFLOAD_WHAT_PARAMS    ? ", parameters offloaded"
                                                             : ", optimizer state and parameters offloaded",
              e->grads_offloaded ? ", the reduced gradient shard with the optimizer" : "");
    return DT_OK;
}
