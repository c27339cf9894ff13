/*
 * plugins/shard/shard_internal.h - what the sharded engine's files share:
 * the state of a group and of a reduction in flight, where a group's
 * slices live in the engine's buffers, stream ordering, and each file's
 * functions the others call.
 *
 * The files stand in layers; each calls only into the layers above it, so
 * no two files depend on each other:
 *   shard_plan.c                   the plan (pure arithmetic)
 *   this header                    buffers, ordering, logging (inline)
 *   shard_gather.c, shard_reduce.c the collectives in flight (parameters;
 *                                  gradients), independent of each other
 *   shard_offload.c                optimizer state (and the reduced
 *                                  gradient shard) in an offload tier
 *   shard_hooks.c, shard_step.c,   the strategy's calls
 *   shard_state.c
 *   shard_engine.c                 init and free
 *   shard_estimate.c,              over a whole engine
 *   shard_strategy.c
 *
 * Everything lives in flat buffers laid out by one dt_shard_plan_t: a
 * shard buffer (plan.shard_total) per persistent sharded state, a full
 * layout (plan.full_total) for a replica, and per group a gathered copy
 * and a gradient buffer while the group is in use.
 */
#ifndef DT_SHARD_INTERNAL_H
#define DT_SHARD_INTERNAL_H

#include <stdint.h>

#include "shard.h"

/* Unit and shard starts on 16-element (64-byte f32) boundaries, as ddp. */
#define DT_SHARD_ALIGN 16u

/* A group's gathered parameters. */
enum { SH_P_FREE = 0,     /* not gathered (or stale) */
       SH_P_INFLIGHT = 1, /* all_gather started */
       SH_P_READY = 2 };  /* gathered and visible to the compute stream */

/* What a queued reduction does when it completes. */
enum { SH_R_SCATTER_ADD = 0, /* reduce_scatter a transient buffer, add the
                              * block to the gradient shard, free it */
       SH_R_SCATTER = 1,     /* reduce_scatter in place (full gradients) */
       SH_R_REPLICAS = 2 };  /* all_reduce a shard across replicas */

typedef struct dt_shard_group_state {
    /* parameters */
    void *full;            /* gathered copy (param dtype, padded) or NULL */
    int32_t pstate;        /* SH_P_* */
    int32_t persistent;    /* `full` stays allocated (replica, shard of one,
                            * or below persist_numel) */
    int32_t transient;     /* `full` is allocated per gather (tag comm) */
    int32_t owns_full;     /* persistent `full` allocated for the group */
    int32_t bwd_done;      /* gradient of this micro-step handed to the
                            * reduction: SHARD_GRAD_OP may reshard now */
    uint32_t active;       /* open hooks over the group's units */
    uint32_t n_units;
    uint64_t gseq;         /* when its gather started (oldest first) */
    dt_comm_req_t *greq;
    dt_offload_req_t *lreq;/* params offloaded: this rank's shard loading
                            * into `full` ahead of the gather */
    /* gradients */
    float *gbuf;           /* what backward accumulates into (padded f32) */
    int32_t gbuf_transient;/* allocated per micro-step (tag comm) */
    uint32_t n_final;      /* units whose gradient is final this micro-step */
    int32_t final_sent;    /* the step's last reduction chain started */
    int32_t queued;        /* reductions of this group in the queue */
    uint32_t gadds;        /* grads offloaded: blocks moved into the tier
                            * this step (the first is stored, not added) */
} sh_group_t;

typedef struct dt_shard_reduction {
    uint32_t group;
    int32_t kind;          /* SH_R_* */
    int32_t then_replicas; /* all_reduce the shard across replicas after */
    int32_t reserved0;
    uint64_t numel;        /* elements on the wire, for max_reduce_numel */
    float *buf;            /* SCATTER_ADD: the transient buffer */
    void *wire;            /* 16-bit reduce_dtype: what travels, or NULL */
    dt_comm_req_t *req;
} sh_red_t;

/* ------------------------------------------------ shard_plan.c */

/* Log that collective `what` of plan group `group` failed with rc, naming
 * its units, shard length and ranks (the group collectives of shard.h,
 * which know no engine). */
void shard_plan_log(const dt_host_v1_t *host, const dt_shard_plan_t *p, uint32_t group,
                    const char *what, int rc);

/* ------------------------------------------------ buffers */

/* Group g's f32 master shard (`shard` elements). */
static inline float *shard_master(dt_shard_engine_t *e, uint32_t g)
{
    const dt_shard_group_t *gr = &e->plan.groups[g];
    if (e->master)
        return e->master + gr->shard_off;
    if (e->replica)
        return (float *)e->replica + gr->full_off + (uint64_t)e->srank * gr->shard;
    return (float *)e->cshard + gr->shard_off;
}

/* Group g's compute-dtype shard: what its all-gather sends (NULL when
 * the parameters are offloaded: shard_offload_load_params). */
static inline void *shard_cshard(dt_shard_engine_t *e, uint32_t g)
{
    const dt_shard_group_t *gr = &e->plan.groups[g];
    if (!e->replica && !e->cshard)
        return NULL;
    if (e->replica)
        return (char *)e->replica + (gr->full_off + (uint64_t)e->srank * gr->shard) * e->pes;
    return (char *)e->cshard + gr->shard_off * e->pes;
}

/* Group g's f32 gradient shard: what the optimizer reads (NULL when it
 * lives in the offload tier). */
static inline float *shard_gshard(dt_shard_engine_t *e, uint32_t g)
{
    const dt_shard_group_t *gr = &e->plan.groups[g];
    if (e->gfull)
        return e->gfull + gr->full_off + (uint64_t)e->srank * gr->shard;
    return e->gshard ? e->gshard + gr->shard_off : NULL;
}

/* `elems` of `dtype` on the device, tagged, zeroed on the compute stream. */
static inline int shard_alloc_zeroed(dt_shard_engine_t *e, uint64_t elems, int dtype, int tag,
                                     const char *what, void **out)
{
    return dt_alloc_zeroed(e->dp.host, e->dp.dev_ops, e->dp.dev, e->dp.cs, elems, dtype, tag,
                           what, out);
}

/* ------------------------------------------------ ordering and messages */

/* Work started on the communication stream from now on follows the
 * compute stream's work so far (gradients written, shards updated). */
static inline int shard_comm_after_compute(dt_shard_engine_t *e)
{
    const dt_device_ops_v1_t *d = e->dp.dev_ops;
    int rc = d->event_record(e->dp.dev, e->ev_compute, e->dp.cs);
    if (rc == DT_OK)
        rc = d->stream_wait_event(e->dp.dev, e->comm_stream, e->ev_compute);
    return rc;
}

/* And the other way: kernels queued from now on see the collectives. */
static inline int shard_compute_after_comm(dt_shard_engine_t *e)
{
    if (!e->comm_stream)
        return DT_OK;
    const dt_device_ops_v1_t *d = e->dp.dev_ops;
    int rc = d->event_record(e->dp.dev, e->ev_comm, e->comm_stream);
    if (rc == DT_OK)
        rc = d->stream_wait_event(e->dp.dev, e->dp.cs, e->ev_comm);
    return rc;
}

static inline const char *shard_unit_name(const dt_shard_engine_t *e, uint32_t u)
{
    const char *n = e->dp.model->units[u].name;
    return n ? n : "?";
}

/* Log that `what` of group gi failed with rc, naming rank and units. */
static inline void shard_log_group(dt_shard_engine_t *e, uint32_t gi, const char *what, int rc)
{
    const dt_shard_group_t *g = &e->plan.groups[gi];
    e->dp.host->log(e->dp.host, DT_LOG_ERROR,
                    "rank %d/%d: %s of shard group %u (units '%s'..'%s') failed: %s", e->dp.rank,
                    e->dp.size, what, gi, shard_unit_name(e, g->unit_lo),
                    shard_unit_name(e, g->unit_hi), dt_status_name(rc));
}

/* ------------------------------------------------ shard_offload.c */

/* The optimizer state lives in the offload tier (e->off). */
static inline int shard_optim_offloaded(const dt_shard_engine_t *e)
{
    return (e->offload_what & DT_OFFLOAD_WHAT_OPTIMIZER) != 0;
}
/* The compute shard lives in the offload tier (zero-3, FULL_SHARD).  The
 * planner's replay (no tier: plan_offload_what) takes the same schedule -
 * every gathered group loaded into a buffer of its own, one loaded ahead,
 * small groups kept gathered - only the tier's transfers are left out
 * (shard_offload_load_start, shard_offload_push), so its comm bytes and
 * the persistent groups it counts are the run's. */
static inline int shard_params_offloaded(const dt_shard_engine_t *e)
{
    return ((e->offload_what | e->cfg.plan_offload_what) & DT_OFFLOAD_WHAT_PARAMS) != 0;
}
/* The reduced gradient shard lives in the tier beside the optimizer state
 * (DeepSpeed's offload_optimizer moves gradients too): whenever the
 * optimizer is offloaded and the engine keeps a gradient shard (not
 * ZeRO-1's full gradients) that no replica all-reduce needs on the
 * device (no HYBRID_SHARD replicas).  Each group's reduced block goes to
 * the tier as its reduction completes. */
static inline int shard_grads_offloaded(const dt_shard_engine_t *e)
{
    return e->grads_offloaded;
}
/* The optimizer keeps a second moment (AdamW), wherever it lives. */
static inline int shard_has_v(const dt_shard_engine_t *e)
{
    return e->dp.optim.kind == DT_OPTIM_ADAMW;
}
/* Read offload_what for this configuration (engine init). */
int shard_offload_configure(dt_shard_engine_t *e);
/* The tier's buffers: the master shard and the moments, the compute shard
 * (make_buffers), as offload_what says. */
int shard_offload_alloc(dt_shard_engine_t *e);
/* Free them (engine free). */
void shard_offload_free(dt_shard_engine_t *e);
/* Parameters offloaded: start loading this rank's shard of group gi from
 * the tier into its slot of the gathered buffer (allocating a transient
 * one), ordered after the compute stream's work so far; no-op when the
 * group is gathered or loading, or nothing is offloaded. */
int shard_offload_load_start(dt_shard_engine_t *e, uint32_t gi);
/* Wait for group gi's load, if one is in flight. */
int shard_offload_load_finish(dt_shard_engine_t *e, uint32_t gi);
/* Grads offloaded: group gi's f32 block (`shard` elements, device) after
 * the work queued on `stream` into the tier, added to what earlier
 * micro-steps put there (copy: the block is the whole sum so far).  In
 * the planner's replay (no tier) nothing moves. */
int shard_offload_grads_add(dt_shard_engine_t *e, uint32_t gi, const float *dblock,
                            dt_stream_t *stream, int copy);
/* Grads offloaded on one shard rank: a new gradient buffer for group gi
 * (`padded` f32, device, tag comm) holding what earlier micro-steps of the
 * step accumulated, so backward adds onto the same bits a persistent
 * buffer would hold (zeroed in the first). */
int shard_offload_grads_buffer(dt_shard_engine_t *e, uint32_t gi, float **out);
/* Grads offloaded: the sum of squares of this rank's gradient shard. */
int shard_offload_grads_sumsq(dt_shard_engine_t *e, double *out);
/* The update of every held range on the host, parameters written back to
 * the compute copy (the step, in place of the device optimizer). */
int shard_offload_step(dt_shard_engine_t *e, const dt_optim_step_t *st);
/* The whole master shard to the compute copy (state_loaded; after the
 * device optimizer's step when only the parameters are offloaded). */
int shard_offload_push(dt_shard_engine_t *e);

/* ------------------------------------------------ shard_gather.c */

/* Start group gi's all-gather unless it is gathered or in flight. */
int shard_gather_start(dt_shard_engine_t *e, uint32_t gi);
/* Wait for group gi's all-gather, if in flight (timeout_ms 0 after a
 * failure: drop it); the compute stream then sees the copy. */
int shard_gather_finish(dt_shard_engine_t *e, uint32_t gi, int64_t timeout_ms);
/* Gather group gi for use now, prefetching `count` groups in direction
 * `dir` (+1 forward, -1 backward).  Blocking until gi is gathered. */
int shard_use_params(dt_shard_engine_t *e, uint32_t gi, int dir, uint32_t count);
/* Start gathering up to `count` groups after (dir +1) or before (dir -1)
 * group gi, within prefetch_numel and max_gathers. */
int shard_prefetch(dt_shard_engine_t *e, uint32_t gi, int dir, uint32_t count);
/* Free a transient gathered copy (after waiting for its gather). */
int shard_release_params(dt_shard_engine_t *e, uint32_t gi);
/* Wait for (timeout_ms 0: drop) every all-gather in flight. */
int shard_gathers_finish(dt_shard_engine_t *e, int64_t timeout_ms);
/* Bring the compute copy up to date with the master shards and, for
 * replicated parameters, all-gather every group; sharded groups become
 * stale (gathered again on next use).  Blocking. */
int shard_refresh_params(dt_shard_engine_t *e, const char *when);

/* ------------------------------------------------ shard_reduce.c */

/* Make sure group gi has a buffer backward accumulates its gradient into
 * (a transient one, after the group's previous reduction completed). */
int shard_grad_buffer(dt_shard_engine_t *e, uint32_t gi);
/* Every unit of group gi has its gradient for the micro-step: start its
 * reduction (or, for persistent buffers, the final one of the step). */
int shard_group_complete(dt_shard_engine_t *e, uint32_t gi, int final_micro);
/* The step's end: start every reduction not started yet, in backward
 * order, and wait for all; the gradient shards are then final. */
int shard_reduce_all(dt_shard_engine_t *e);
/* Wait for every reduction in flight, stopping at the first failure (the
 * rest stay queued, the message stays the failure's); timeout_ms 0 drops
 * them all (destroy). */
int shard_reductions_finish(dt_shard_engine_t *e, int64_t timeout_ms);

/* Wait for every collective in flight, stopping at the first failure;
 * timeout_ms 0 drops them all (destroy). */
static inline int shard_drain(dt_shard_engine_t *e, int64_t timeout_ms)
{
    int first = shard_reductions_finish(e, timeout_ms);
    if (first != DT_OK && timeout_ms != 0)
        return first;
    int rc = shard_gathers_finish(e, timeout_ms);
    return first != DT_OK ? first : rc;
}

#endif /* DT_SHARD_INTERNAL_H */
