/*
 * sdk/lib/dt_shard_internal.h - the state of one sharded data-parallel
 * engine (sdk_helpers.h dt_shard_t), shared by its files:
 *   dt_shard_engine.c    create/destroy: groups, plan, persistent buffers
 *   dt_shard_step.c      the unit hooks, gathers and gradient reductions,
 *                        the optimizer step
 *   dt_shard_state.c     checkpoint state by global ranges, state_loaded
 *   dt_shard_estimate.c  the planner's estimate (a replay of one step)
 *   dt_shard_plugin.c    a strategy plugin's init and estimate over it
 *
 * Everything lives in flat buffers laid out by one dt_shard_plan_t: a
 * shard buffer (plan.shard_total) per persistent sharded state, a full
 * layout (plan.full_total) for a replica, and per group a gathered copy
 * and a gradient buffer while the group is in use.
 */
#ifndef DT_SHARD_INTERNAL_H
#define DT_SHARD_INTERNAL_H

#include <stdint.h>

#include "dtrain/sdk_helpers.h"

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

typedef struct sh_group {
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
    /* gradients */
    float *gbuf;           /* what backward accumulates into (padded f32) */
    int32_t gbuf_transient;/* allocated per micro-step (tag comm) */
    uint32_t n_final;      /* units whose gradient is final this micro-step */
    int32_t final_sent;    /* the step's last reduction chain started */
    int32_t queued;        /* reductions of this group in the queue */
} sh_group_t;

typedef struct sh_red {
    uint32_t group;
    int32_t kind;          /* SH_R_* */
    int32_t then_replicas; /* all_reduce the shard across replicas after */
    int32_t reserved0;
    uint64_t numel;        /* elements on the wire, for max_reduce_numel */
    float *buf;            /* SCATTER_ADD: the transient buffer */
    dt_comm_req_t *req;
} sh_red_t;

/* dt_shard_t: the engine is the strategy instance of zero and fsdp. */
struct dt_strategy {
    dt_dp_t dp;                   /* host, device, the whole data-parallel
                                   * group, model, optimizer, hook depths */
    dt_comm_t *scomm;             /* shard group (== dp.comm, a split, or NULL
                                   * when shards are whole: ssize 1) */
    dt_comm_t *rcomm;             /* replicas of a shard (NULL when rsize 1) */
    int32_t own_scomm, own_rcomm; /* split here: finalize them */
    uint32_t srank, ssize;        /* in the shard group */
    uint32_t rrank, rsize;        /* among the replicas */
    dt_shard_cfg_t cfg;           /* spans pointer cleared after planning */
    int32_t pdtype;               /* model->param_dtype */
    uint32_t pes;                 /* its element size */

    dt_shard_plan_t plan;
    sh_group_t *g;                /* (n_groups) */

    /* persistent state */
    void *replica;                /* params_replicated: full layout, pdtype */
    void *cshard;                 /* sharded params: compute shard, pdtype */
    float *master;                /* f32 master shard, or NULL when it lives
                                   * in cshard / replica (f32 params) */
    float *gshard;                /* grads sharded: f32 shard */
    float *gfull;                 /* grads_full: f32 full layout */
    float *m, *v;                 /* optimizer moments of the shard */
    double *norm_slot;

    /* hooks */
    uint32_t *final_at;           /* (n_units) micro-step + 1 of the last
                                   * last_use seen this step, 0: none */
    uint32_t n_active;            /* groups with open hooks */
    uint32_t n_gathers;           /* all_gathers in flight */
    uint64_t gather_inflight;     /* their elements */
    int32_t failed;               /* a collective failed: drop, never wait */
    uint64_t gseq;

    /* reductions in flight, oldest first (a ring of cap entries) */
    sh_red_t *red;
    uint32_t red_cap, red_head, red_n;
    uint64_t red_numel;           /* elements in flight */

    dt_stream_t *comm_stream;     /* NULL when nothing is communicated */
    dt_event_t *ev_compute;       /* compute -> comm */
    dt_event_t *ev_comm;          /* comm -> compute */
};

/* dt_shard_engine.c */
/* The group's master shard / compute shard (gather source) / gradient
 * shard, each `shard` elements. */
float *dt_shard__master(dt_shard_t *e, uint32_t g);
void *dt_shard__cshard(dt_shard_t *e, uint32_t g);
float *dt_shard__gshard(dt_shard_t *e, uint32_t g);
/* `elems` of `dtype` on the device, tagged, zeroed on the compute stream;
 * logs `what` on failure. */
int dt_shard__alloc_zeroed(dt_shard_t *e, uint64_t elems, int dtype, int tag, const char *what,
                           void **out);

/* dt_shard_step.c */
/* Bring the compute copy up to date with the master shards and, for
 * replicated parameters, all-gather every group; sharded groups become
 * stale (gathered again on next use).  Blocking. */
int dt_shard__refresh_params(dt_shard_t *e, const char *when);
/* Wait for every request in flight, stopping at the first failure (the
 * rest stay in flight, the message stays the failure's); timeout_ms 0
 * drops them all (destroy after a failure). */
int dt_shard__drain(dt_shard_t *e, int64_t timeout_ms);

#endif /* DT_SHARD_INTERNAL_H */
