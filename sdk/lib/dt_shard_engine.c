/*
 * sdk/lib/dt_shard_engine.c - the sharded data-parallel engine behind the
 * zero and fsdp plugins: creating it (shard and replica groups, the plan,
 * its persistent buffers), destroying it, and where a group's slices live
 * in those buffers.  The step is dt_shard_step.c.
 */
#include <string.h>

#include "dt_shard_internal.h"

/* ------------------------------------------------------------ buffers */

float *dt_shard__master(dt_shard_t *e, uint32_t g)
{
    const dt_shard_group_t *gr = &e->plan.groups[g];
    if (e->master)
        return e->master + gr->shard_off;
    if (e->replica)
        return (float *)e->replica + gr->full_off + (uint64_t)e->srank * gr->shard;
    return (float *)e->cshard + gr->shard_off;
}

void *dt_shard__cshard(dt_shard_t *e, uint32_t g)
{
    const dt_shard_group_t *gr = &e->plan.groups[g];
    if (e->replica)
        return (char *)e->replica + (gr->full_off + (uint64_t)e->srank * gr->shard) * e->pes;
    return (char *)e->cshard + gr->shard_off * e->pes;
}

float *dt_shard__gshard(dt_shard_t *e, uint32_t g)
{
    const dt_shard_group_t *gr = &e->plan.groups[g];
    if (e->gfull)
        return e->gfull + gr->full_off + (uint64_t)e->srank * gr->shard;
    return e->gshard + gr->shard_off;
}

int dt_shard__alloc_zeroed(dt_shard_t *e, uint64_t elems, int dtype, int tag, const char *what,
                           void **out)
{
    const dt_device_ops_v1_t *d = e->dev_ops;
    uint64_t bytes = elems * dt_dtype_size(dtype);
    int rc = d->alloc(e->dev, bytes, tag, out);
    if (rc != DT_OK) {
        *out = NULL;
        e->host->log(e->host, DT_LOG_ERROR, "allocating %s (%llu bytes, tag %s) failed", what,
                     (unsigned long long)bytes, dt_mem_tag_name(tag));
        return rc;
    }
    rc = d->memset_async(e->dev, *out, 0, bytes, e->cs);
    if (rc != DT_OK) {
        d->free(e->dev, *out);
        *out = NULL;
        e->host->log(e->host, DT_LOG_ERROR, "zeroing %s failed", what);
    }
    return rc;
}

/* ------------------------------------------------------------ lifecycle */

const dt_shard_plan_t *dt_shard_get_plan(const dt_shard_t *e)
{
    return &e->plan;
}

void dt_shard_topology(const dt_shard_t *e, uint32_t *shard_rank, uint32_t *shard_ranks,
                       uint32_t *replica, uint32_t *replicas)
{
    if (shard_rank) *shard_rank = e->srank;
    if (shard_ranks) *shard_ranks = e->ssize;
    if (replica) *replica = e->rrank;
    if (replicas) *replicas = e->rsize;
}

void dt_shard_destroy(dt_shard_t *e)
{
    if (!e)
        return;
    const dt_host_v1_t *host = e->host;
    const dt_device_ops_v1_t *d = e->dev_ops;
    if (e->red)
        dt_shard__drain(e, e->failed ? 0 : -1);
    if (e->dev) {
        for (uint32_t i = 0; e->g && i < e->plan.n_groups; i++) {
            sh_group_t *g = &e->g[i];
            if (g->gbuf_transient)
                d->free(e->dev, g->gbuf);
            if (g->full && (g->transient || g->owns_full))
                d->free(e->dev, g->full);
        }
        d->free(e->dev, e->replica);
        d->free(e->dev, e->cshard);
        d->free(e->dev, e->master);
        d->free(e->dev, e->gshard);
        d->free(e->dev, e->gfull);
        d->free(e->dev, e->m);
        d->free(e->dev, e->v);
        d->free(e->dev, e->norm_slot);
        if (e->ev_compute)
            d->event_destroy(e->dev, e->ev_compute);
        if (e->ev_comm)
            d->event_destroy(e->dev, e->ev_comm);
        if (e->comm_stream)
            d->stream_destroy(e->dev, e->comm_stream);
    }
    if (e->own_scomm)
        e->comm_ops->finalize(e->scomm);
    if (e->own_rcomm)
        e->comm_ops->finalize(e->rcomm);
    dt_shard_plan_free(&e->plan, host);
    host->free(host, e->g);
    host->free(host, e->red);
    host->free(host, e->fwd_depth);
    host->free(host, e->bwd_depth);
    host->free(host, e->final_at);
    host->free(host, e);
}

/* Shard and replica groups: split only when both have more than one rank
 * (collective: every rank of the group makes the same two calls). */
static int make_groups(dt_shard_t *e)
{
    const dt_host_v1_t *host = e->host;
    uint32_t size = (uint32_t)e->size, rank = (uint32_t)e->rank;
    uint32_t ss = e->cfg.shard_ranks ? e->cfg.shard_ranks : size;
    if (ss > size || size % ss != 0)
        return host->set_error(host, DT_ERR_CONFIG,
                               "%s: shard groups of %u ranks do not divide the data-parallel "
                               "group of %u ranks", e->cfg.what ? e->cfg.what : "sharding", ss,
                               size);
    e->ssize = ss;
    e->rsize = size / ss;
    e->srank = rank % ss;
    e->rrank = rank / ss;
    if (ss > 1 && e->rsize == 1)
        e->scomm = e->comm;
    else if (ss == 1 && e->rsize > 1)
        e->rcomm = e->comm;
    else if (ss > 1) {
        int rc = e->comm_ops->split(e->comm, (int32_t)(rank / ss), (int32_t)rank, &e->scomm);
        if (rc == DT_OK)
            e->own_scomm = 1;
        if (rc == DT_OK &&
            (rc = e->comm_ops->split(e->comm, (int32_t)(rank % ss), (int32_t)rank,
                                     &e->rcomm)) == DT_OK)
            e->own_rcomm = 1;
        if (rc != DT_OK) {
            host->log(host, DT_LOG_ERROR, "rank %u/%u: splitting into shard groups of %u "
                      "ranks failed", rank, size, ss);
            return rc;
        }
        int32_t r1 = -1, s1 = -1, r2 = -1, s2 = -1;
        if ((rc = e->comm_ops->rank_size(e->scomm, &r1, &s1)) != DT_OK ||
            (rc = e->comm_ops->rank_size(e->rcomm, &r2, &s2)) != DT_OK)
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

static int make_buffers(dt_shard_t *e)
{
    const dt_host_v1_t *host = e->host;
    const dt_device_ops_v1_t *d = e->dev_ops;
    const dt_shard_plan_t *p = &e->plan;
    uint64_t S = p->shard_total, F = p->full_total;
    int rc;
    if (e->cfg.params_replicated)
        rc = dt_shard__alloc_zeroed(e, F, e->pdtype, DT_TAG_PARAMS, "the parameter replica",
                                    &e->replica);
    else
        rc = dt_shard__alloc_zeroed(e, S, e->pdtype, DT_TAG_PARAMS, "the parameter shard", &e->cshard);
    if (rc == DT_OK && e->pdtype == DT_BF16)
        rc = dt_shard__alloc_zeroed(e, S, DT_F32, DT_TAG_PARAMS, "the f32 master shard",
                          (void **)&e->master);
    if (rc == DT_OK) {
        if (e->cfg.grads_full)
            rc = dt_shard__alloc_zeroed(e, F, DT_F32, DT_TAG_GRADS, "the full gradients",
                              (void **)&e->gfull);
        else
            rc = dt_shard__alloc_zeroed(e, S, DT_F32, DT_TAG_GRADS, "the gradient shard",
                              (void **)&e->gshard);
    }
    if (rc == DT_OK)
        rc = dt_shard__alloc_zeroed(e, S, DT_F32, DT_TAG_OPTIMIZER,
                          e->optim.kind == DT_OPTIM_ADAMW ? "adamw exp_avg" : "sgd momentum",
                          (void **)&e->m);
    if (rc == DT_OK && e->optim.kind == DT_OPTIM_ADAMW)
        rc = dt_shard__alloc_zeroed(e, S, DT_F32, DT_TAG_OPTIMIZER, "adamw exp_avg_sq", (void **)&e->v);
    if (rc == DT_OK)
        rc = d->alloc(e->dev, sizeof(double), DT_TAG_OTHER, (void **)&e->norm_slot);
    if (rc != DT_OK)
        return rc;

    uint64_t ng1 = (uint64_t)p->n_groups + 1, nu1 = (uint64_t)p->n_units + 1;
    e->g = host->alloc(host, ng1 * sizeof *e->g, DT_TAG_OTHER);
    e->red_cap = 2 * p->n_groups + 2;
    e->red = host->alloc(host, (uint64_t)e->red_cap * sizeof *e->red, DT_TAG_OTHER);
    e->fwd_depth = host->alloc(host, nu1 * sizeof(uint32_t), DT_TAG_OTHER);
    e->bwd_depth = host->alloc(host, nu1 * sizeof(uint32_t), DT_TAG_OTHER);
    e->final_at = host->alloc(host, nu1 * sizeof(uint32_t), DT_TAG_OTHER);
    if (!e->g || !e->red || !e->fwd_depth || !e->bwd_depth || !e->final_at)
        return host->set_error(host, DT_ERR_NOMEM, "bookkeeping for %u groups", p->n_groups);
    memset(e->g, 0, ng1 * sizeof *e->g);
    memset(e->fwd_depth, 0, nu1 * sizeof(uint32_t));
    memset(e->bwd_depth, 0, nu1 * sizeof(uint32_t));
    memset(e->final_at, 0, nu1 * sizeof(uint32_t));

    for (uint32_t i = 0; i < p->n_groups; i++) {
        sh_group_t *g = &e->g[i];
        const dt_shard_group_t *gr = &p->groups[i];
        g->n_units = gr->unit_hi - gr->unit_lo + 1;
        if (e->cfg.params_replicated) {
            g->full = (char *)e->replica + gr->full_off * e->pes;
            g->persistent = 1;
            g->pstate = SH_P_READY;
        } else if (e->ssize == 1) {
            g->full = (char *)e->cshard + gr->shard_off * e->pes;
            g->persistent = 1;
            g->pstate = SH_P_READY;
        } else if (gr->numel < e->cfg.persist_numel) {
            if ((rc = dt_shard__alloc_zeroed(e, gr->padded, e->pdtype, DT_TAG_PARAMS,
                                   "a persistent gathered group", &g->full)) != DT_OK)
                return rc;
            g->persistent = 1;
            g->owns_full = 1;
        } else {
            g->transient = 1;
        }
        if (e->gfull)
            g->gbuf = e->gfull + gr->full_off;
        else if (e->ssize == 1)
            g->gbuf = e->gshard + gr->shard_off;
    }

    if (e->size > 1) {
        if ((rc = d->stream_create(e->dev, &e->comm_stream)) != DT_OK ||
            (rc = d->event_create(e->dev, &e->ev_compute)) != DT_OK ||
            (rc = d->event_create(e->dev, &e->ev_comm)) != DT_OK) {
            host->log(host, DT_LOG_ERROR, "creating the communication stream/events failed");
            return rc;
        }
    }
    return d->stream_sync(e->dev, e->cs);
}

int dt_shard_create(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                    const dt_shard_cfg_t *cfg, dt_shard_t **out)
{
    *out = NULL;
    if (!args || args->struct_size < sizeof(dt_strategy_init_v1_t))
        return host->set_error(host, DT_ERR_ABI, "init args struct_size %u < %zu (core too old)",
                               args ? args->struct_size : 0, sizeof(dt_strategy_init_v1_t));
    if (!args->dev_ops || !args->dev || !args->comm_ops || !args->comm || !args->model)
        return host->set_error(host, DT_ERR_INVALID, "init: NULL %s",
                               !args->dev_ops ? "dev_ops" : !args->dev ? "dev"
                               : !args->comm_ops ? "comm_ops" : !args->comm ? "comm" : "model");
    if (args->n_micro < 1)
        return host->set_error(host, DT_ERR_INVALID, "init: n_micro = 0");
    const dt_model_desc_v1_t *model = args->model;
    const char *what = cfg->what ? cfg->what : "sharding";
    if (model->param_dtype != DT_F32 && model->param_dtype != DT_BF16)
        return host->set_error(host, DT_ERR_UNSUPPORTED,
                               "param_dtype %s: %s keeps f32 or bf16 compute parameters",
                               dt_dtype_name(model->param_dtype), what);
    if (args->optim.kind != DT_OPTIM_ADAMW && args->optim.kind != DT_OPTIM_SGD)
        return host->set_error(host, DT_ERR_INVALID, "init: unknown optimizer kind %d",
                               args->optim.kind);
    if (model->n_units > 0 && !model->units)
        return host->set_error(host, DT_ERR_INVALID, "init: model has %u units but no table",
                               model->n_units);
    for (uint32_t u = 0; u < model->n_units; u++) {
        if (model->units[u].index != u)
            return host->set_error(host, DT_ERR_INVALID, "unit '%s' at position %u has index %u",
                                   model->units[u].name, u, model->units[u].index);
        int rc = dt_unit_validate(host, &model->units[u]);
        if (rc != DT_OK)
            return rc;
    }

    dt_shard_t *e = host->alloc(host, sizeof *e, DT_TAG_OTHER);
    if (!e)
        return host->set_error(host, DT_ERR_NOMEM, "init: instance");
    memset(e, 0, sizeof *e);
    e->host = host;
    e->dev_ops = args->dev_ops;
    e->dev = args->dev;
    e->cs = args->compute_stream;
    e->comm_ops = args->comm_ops;
    e->comm = args->comm;
    e->model = args->model;
    e->optim = args->optim;
    e->cfg = *cfg;
    e->cfg.spans = NULL; /* planned below; not kept */
    e->pdtype = model->param_dtype;
    e->pes = (uint32_t)dt_dtype_size(e->pdtype);

    int rc = e->comm_ops->rank_size(e->comm, &e->rank, &e->size);
    if (rc != DT_OK)
        host->log(host, DT_LOG_ERROR, "init: comm rank_size failed");
    if (rc == DT_OK && (e->size < 1 || e->rank < 0 || e->rank >= e->size))
        rc = host->set_error(host, DT_ERR_INVALID, "init: comm reports rank %d of %d", e->rank,
                             e->size);
    if (rc == DT_OK)
        rc = make_groups(e);
    if (rc == DT_OK)
        rc = dt_shard_plan_init(&e->plan, host, model, cfg->spans, cfg->n_spans, e->ssize,
                                DT_SHARD_ALIGN);
    if (rc == DT_OK)
        rc = make_buffers(e);
    if (rc != DT_OK) {
        e->failed = 1;
        dt_shard_destroy(e);
        return rc;
    }
    host->log(host, DT_LOG_DEBUG,
              "rank %d/%d: %s, %llu parameters in %u group(s), shard %llu elements, %u "
              "shard rank(s) x %u replica(s)", e->rank, e->size, what,
              (unsigned long long)model->numel, e->plan.n_groups,
              (unsigned long long)e->plan.shard_total, e->ssize, e->rsize);
    *out = e;
    return DT_OK;
}
