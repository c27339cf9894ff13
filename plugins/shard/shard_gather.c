/*
 * plugins/shard/shard_gather.c - parameters: moving a group from its
 * sharded form to its full form.  The all-gather of one group (FSDP's
 * unit all-gather, ZeRO-3's parameter gather) started before the group's
 * forward or backward hook needs it, prefetching of the groups that come
 * next, freeing a gathered copy again (resharding), and after the
 * optimizer step the all-gather of every group's updated shard into the
 * replica (ZeRO-1/2) or marking sharded copies stale (ZeRO-3, FSDP).
 *
 * Gathers run on the communication stream, ordered after the compute
 * stream by an event when they start; the compute stream waits for the
 * communication stream when one finishes, before it reads the copy.  They
 * start only at hooks and in the step, never on completion polling, so
 * every rank makes the same calls in the same order.
 */
#include "shard_internal.h"

int shard_gather_finish(dt_shard_engine_t *e, uint32_t gi, int64_t timeout_ms)
{
    sh_group_t *g = &e->g[gi];
    if (g->pstate != SH_P_INFLIGHT)
        return DT_OK;
    int rc = dt_comm_ops(e->scomm)->wait(e->scomm, g->greq, timeout_ms); /* frees greq */
    g->greq = NULL;
    e->n_gathers--;
    e->gather_inflight -= e->plan.groups[gi].padded;
    g->pstate = SH_P_FREE;
    if (rc == DT_OK)
        rc = shard_compute_after_comm(e);
    if (rc != DT_OK) {
        if (timeout_ms != 0)
            shard_log_group(e, gi, "all_gather of the parameters", rc);
        return rc;
    }
    g->pstate = SH_P_READY;
    return DT_OK;
}

/* The gather started first among those in flight. */
static uint32_t oldest_gather(const dt_shard_engine_t *e)
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

int shard_gather_start(dt_shard_engine_t *e, uint32_t gi)
{
    sh_group_t *g = &e->g[gi];
    if (g->pstate != SH_P_FREE)
        return DT_OK;
    int rc;
    while (e->cfg.max_gathers && e->n_gathers >= e->cfg.max_gathers)
        if ((rc = shard_gather_finish(e, oldest_gather(e), -1)) != DT_OK)
            return rc;
    /* this rank's shard where the gather sends it from (one loaded from a
     * tier lands in its slot of `full`, gathered in place) */
    const void *send = NULL;
    if ((rc = shard_full_alloc(e, gi)) != DT_OK || (rc = e->home.load(e, gi, &send)) != DT_OK)
        return rc;
    if (e->ssize == 1) { /* nothing to gather: the shard is the group */
        g->pstate = SH_P_READY;
        return DT_OK;
    }
    if ((rc = shard_comm_after_compute(e)) != DT_OK)
        return rc;
    rc = dt_shard_gather(e->dp.host, e->scomm, &e->plan, gi, send,
                         g->full, e->pdtype, e->comm_stream, &g->greq);
    if (rc != DT_OK) {
        g->greq = NULL;
        return rc;
    }
    g->pstate = SH_P_INFLIGHT;
    g->gseq = ++e->gseq;
    e->n_gathers++;
    e->gather_inflight += e->plan.groups[gi].padded;
    return DT_OK;
}

int shard_release_params(dt_shard_engine_t *e, uint32_t gi)
{
    sh_group_t *g = &e->g[gi];
    int lrc = e->home.load_wait(e, gi); /* a load ahead never used */
    if (!g->transient)
        return lrc;
    int rc = shard_gather_finish(e, gi, -1); /* never free under a collective */
    if (rc == DT_OK)
        rc = lrc;
    if (g->full)
        dt_device_ops(e->dp.dev)->free(e->dp.dev, g->full);
    g->full = NULL;
    g->pstate = SH_P_FREE;
    return rc;
}

/* Start bringing this rank's shard of the group after `last` (in
 * direction dir) to its gathered buffer (home.load_ahead: from a tier),
 * so its gather finds it there. */
static int load_ahead(dt_shard_engine_t *e, int64_t last, int dir)
{
    int64_t j = last + dir;
    if (j < 0 || j >= (int64_t)e->plan.n_groups)
        return DT_OK;
    return e->home.load_ahead(e, (uint32_t)j);
}

int shard_prefetch(dt_shard_engine_t *e, uint32_t gi, int dir, uint32_t count)
{
    if (count == 0 || e->cfg.params_replicated)
        return DT_OK;
    if (e->ssize == 1) /* nothing to gather; maybe a shard to load */
        return load_ahead(e, gi, dir);
    uint64_t ahead = 0;
    int64_t last = gi;
    for (uint32_t k = 1; k <= count; k++) {
        int64_t j = (int64_t)gi + (int64_t)dir * (int64_t)k;
        if (j < 0 || j >= (int64_t)e->plan.n_groups)
            break;
        uint64_t padded = e->plan.groups[j].padded;
        if (e->cfg.prefetch_numel && ahead + padded > e->cfg.prefetch_numel)
            break;
        ahead += padded;
        if (e->g[j].pstate != SH_P_FREE) {
            last = j;
            continue;
        }
        if (e->cfg.max_gathers && e->n_gathers >= e->cfg.max_gathers)
            break;
        int rc = shard_gather_start(e, (uint32_t)j);
        if (rc != DT_OK)
            return rc;
        last = j;
    }
    return load_ahead(e, last, dir);
}

int shard_use_params(dt_shard_engine_t *e, uint32_t gi, int dir, uint32_t count)
{
    /* its own gather first, so the wire takes it before the prefetches */
    int rc = shard_gather_start(e, gi);
    if (rc == DT_OK)
        rc = shard_prefetch(e, gi, dir, count);
    if (rc == DT_OK)
        rc = shard_gather_finish(e, gi, -1);
    if (rc != DT_OK)
        e->failed = 1;
    return rc;
}

int shard_gathers_finish(dt_shard_engine_t *e, int64_t timeout_ms)
{
    int first = DT_OK;
    for (uint32_t i = 0; e->g && i < e->plan.n_groups; i++) {
        int rc = shard_gather_finish(e, i, timeout_ms);
        int lrc = e->home.load_wait(e, i); /* loads are waited even when dropping */
        if (rc == DT_OK)
            rc = lrc;
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

int shard_refresh_params(dt_shard_engine_t *e, const char *when)
{
    int rc = DT_OK;
    if (!e->cfg.params_replicated) {
        for (uint32_t i = 0; i < e->plan.n_groups; i++)
            if (e->g[i].persistent && !e->g[i].is_shard)
                e->g[i].pstate = SH_P_FREE; /* stale: gathered again on use */
        return DT_OK;
    }
    if (e->ssize == 1)
        return DT_OK; /* the replica is the shard itself */
    /* replicas: every rank's updated shard to everyone, in place, at most
     * gather_numel elements in flight */
    for (uint32_t i = 0; i < e->plan.n_groups; i++)
        e->g[i].pstate = SH_P_FREE;
    for (uint32_t i = 0; rc == DT_OK && i < e->plan.n_groups; i++) {
        uint64_t padded = e->plan.groups[i].padded;
        while (rc == DT_OK && e->n_gathers > 0 && e->cfg.gather_numel &&
               e->gather_inflight + padded > e->cfg.gather_numel)
            rc = shard_gather_finish(e, oldest_gather(e), -1);
        if (rc == DT_OK)
            rc = shard_gather_start(e, i);
    }
    if (rc == DT_OK)
        rc = shard_gathers_finish(e, -1); /* after a failure: destroy's to drop */
    if (rc != DT_OK) {
        e->failed = 1;
        e->dp.host->log(e->dp.host, DT_LOG_ERROR, "%s: rank %d/%d: all-gathering the updated "
                        "parameters failed", when, e->dp.rank, e->dp.size);
    }
    return rc;
}
