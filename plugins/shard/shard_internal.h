/*
 * plugins/shard/shard_internal.h - what the sharded engine's files share:
 * the state of a group and of a reduction in flight, where a group's
 * slices live in the engine's buffers, stream ordering, and each file's
 * functions the others call.
 *
 * The files stand in layers; each calls only into the layers above it, so
 * no two files depend on each other:
 *   shard_plan.c                   the plan (pure arithmetic), the group
 *                                  collectives (dt_shard_gather, _reduce)
 *   this header                    buffers, ordering, logging (inline)
 *   shard_home.c, shard_offload.c  where the shard lives (dt_shard_home_t):
 *                                  device buffers; an offload tier for
 *                                  what offload_what names
 *   shard_gather.c, shard_reduce.c the collectives in flight (parameters;
 *                                  gradients), independent of each other;
 *                                  they reach the shard through e->home
 *   shard_engine.c                 init (groups, plan, buffers, the home,
 *                                  the norm plan), free, shard_drain
 *   shard_hooks.c, shard_step.c,   the strategy's calls
 *   shard_state.c
 *   shard_estimate.c               the planner's replay of a whole engine
 *   shard_strategy.c               a strategy plugin over all of it
 * (tests/unit/plugins/shard/shard_layers.sh checks this on what the objects link to.)
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
    int32_t is_shard;      /* `full` is the compute shard itself (one
                            * shard rank): never stale */
    int32_t bwd_done;      /* gradient of this micro-step handed to the
                            * reduction: SHARD_GRAD_OP may reshard now */
    uint32_t active;       /* open hooks over the group's units */
    uint32_t n_units;
    uint64_t gseq;         /* when its gather started (oldest first) */
    dt_comm_req_t *greq;
    dt_offload_req_t *lreq;/* a tier's load of this rank's shard into
                            * `full` ahead of the gather (home.load_ahead) */
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
 * the parameters live in the offload tier). */
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
    return dt_alloc_zeroed(e->dp.host, e->dp.dev, e->dp.cs, elems, dtype, tag,
                           what, out);
}

/* ------------------------------------------------ ordering and messages */

/* Work started on the communication stream from now on follows the
 * compute stream's work so far (gradients written, shards updated). */
static inline int shard_comm_after_compute(dt_shard_engine_t *e)
{
    const dt_device_ops_v1_t *d = dt_device_ops(e->dp.dev);
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
    const dt_device_ops_v1_t *d = dt_device_ops(e->dp.dev);
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

/* Group g's gathered buffer, allocated (tag comm) if it is transient and
 * has none: where its gather lands (and an offloaded shard loads). */
static inline int shard_full_alloc(dt_shard_engine_t *e, uint32_t g)
{
    sh_group_t *gs = &e->g[g];
    if (!gs->transient || gs->full)
        return DT_OK;
    int rc = dt_device_ops(e->dp.dev)->alloc(e->dp.dev, e->plan.groups[g].padded * e->pes,
                                             DT_TAG_COMM, &gs->full);
    if (rc != DT_OK) {
        gs->full = NULL;
        shard_log_group(e, g, "allocating the gathered parameters", rc);
    }
    return rc;
}

/* ------------------------------------------------ where the shard lives
 *
 * e->home (dt_shard_home_t, shard.h), filled once at init: the device's
 * slots (shard_home_device), then the tier's for what offload_what names
 * (shard_offload_home).  The contracts:
 *   load_ahead(gi)   start bringing this rank's shard of group gi to its
 *                    slot of the gathered buffer (device: nothing to do)
 *   load(gi, &send)  that shard ready; *send is what the gather sends
 *                    (device: the compute shard; tier: the slot, in place)
 *   load_wait(gi)    wait for a load ahead, if any (before freeing)
 *   grads_buffer(gi, &buf)  a new transient gradient buffer for group gi
 *                    (padded f32, zeroed where nothing is carried over)
 *   grads_add(gi, block, stream, whole)  this rank's reduced block
 *                    (`shard` f32, device) after the work on `stream` into
 *                    the gradient shard: added, or (whole) replacing it
 *   grads_end()      the step's reductions are done
 *   grads_sumsq(&ss) this rank's part of the norm (the norm plan)
 *   update(st)       the optimizer over every held range, then the compute
 *                    copy current
 *   publish(when)    the compute copy from the master (state_loaded)
 *   state_get/set(unit, kind, r, at, buf)  checkpoint state at shard
 *                    buffer element `at`
 * --------------------------------------------------------------------- */
/* Fill `h` with the device's slots (shard_home.c). */
void shard_home_device(dt_shard_home_t *h);

/* ------------------------------------------------ shard_offload.c
 *
 * What the tier holds: asked only where the home is chosen and its
 * buffers made (shard_engine.c) and inside the tier (shard_offload.c). */

/* The optimizer state lives in the offload tier (e->off). */
static inline int shard_optim_offloaded(const dt_shard_engine_t *e)
{
    return (e->offload_what & DT_OFFLOAD_WHAT_OPTIMIZER) != 0;
}
/* The compute shard lives in the offload tier (zero-3, FULL_SHARD).  The
 * planner's replay (no tier: plan_offload_what) takes the same schedule -
 * every gathered group loaded into a buffer of its own, one loaded ahead,
 * small groups kept gathered - only the tier's transfers are left out
 * (the tier's loads and pushes), so its comm bytes and
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
/* Put the tier's slots in place of the device's in `h` for what it holds
 * (the planner's replay: the same schedule, no tier). */
void shard_offload_home(dt_shard_engine_t *e, dt_shard_home_t *h);

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
/* After the compute shards are current (home.update, home.publish): for
 * replicated parameters all-gather every group; sharded groups become
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

/* ------------------------------------------------ shard_engine.c */

/* Wait for every collective in flight (reductions, then gathers),
 * stopping at the first failure; timeout_ms 0 drops them all (destroy). */
int shard_drain(dt_shard_engine_t *e, int64_t timeout_ms);

#endif /* DT_SHARD_INTERNAL_H */
