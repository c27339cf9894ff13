/*
 * dtrain/sdk/offload.h - optimizer state held in an offload tier
 * (ZeRO-Offload): the f32 master parameters and the optimizer moments of
 * the elements a rank updates live in three tier buffers, updated in place
 * on the host (the tier's host_ptr) by the same loops as the cpu device's
 * kernels (optim.h), with the gradients brought over from the device and
 * the updated parameters sent back to the device's compute copy, piece by
 * piece through pinned staging.  The sharded engine (zero, fsdp) and the
 * replica machinery (ddp) use it alike.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Layout: the strategy's own flat index space of `numel` elements (a shard
 * buffer, a replica's layout); `at` arguments are offsets in it.
 *
 * Part of the SDK helper library (dtrain/sdk_helpers.h says how to link
 * it and the conventions every helper follows).  Blocking, except the
 * writes of parameters and gradients into a tier without host pointers:
 * their stores run on behind the call, a bounded window of pieces,
 * completed before the bytes are read again (see each function).
 */
#ifndef DTRAIN_SDK_OFFLOAD_H
#define DTRAIN_SDK_OFFLOAD_H

#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/offload.h"
#include "dtrain/sdk/optim.h"
#include "dtrain/strategy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Elements moved per piece between the device and the host (the size of
 * the pinned staging buffers, f32). */
#define DT_OFFLOAD_PIECE (1u << 20)
/* The host optimizer: at most this many threads, each over at least
 * DT_OFFLOAD_MIN_SLICE elements of a piece. */
#define DT_OFFLOAD_MAX_THREADS 64
#define DT_OFFLOAD_MIN_SLICE 65536u

/* What a strategy's `offload_what` key selects (DT_OFFLOAD_KEY_WHAT). */
#define DT_OFFLOAD_WHAT_OPTIMIZER 0x1u /* master parameters + moments */
#define DT_OFFLOAD_WHAT_PARAMS 0x2u    /* the compute parameters (stage 3) */

/* The key, for a strategy's dt_config_key_t list: which state goes to the
 * tier [parallel] offload names (ignored without one). */
#define DT_OFFLOAD_KEY_WHAT                                                    \
    {.name = "offload_what", .type = DT_CFG_ENUM, .def = "\"optimizer\"",     \
     .choices = "optimizer|params|optimizer_and_params",                       \
     .doc = "with [parallel] offload: what the tier holds - optimizer "       \
            "(f32 master + moments; zero stage 2/3 and fsdp without "         \
            "hybrid replicas move the reduced f32 gradient shard there "      \
            "too, as DeepSpeed's offload_optimizer), params (zero stage 3 "   \
            "/ fsdp FULL_SHARD only) or both"}

/* Read `offload_what` into *what (DT_OFFLOAD_WHAT_* bits).  `args` are the
 * strategy's init args: without a tier *what is 0.  `params_ok` says
 * whether this configuration may offload parameters; `what_is` names it
 * ("zero stage 2") for the DT_ERR_CONFIG that says which strategies may.
 * A tier given to a strategy that does not declare the key is a
 * DT_ERR_CONFIG too: it would keep nothing there. */
int dt_offload_what(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args, int params_ok,
                    const char *what_is, uint32_t *what);
/* The same for the planner (estimate args with offload set): the key as
 * configured, checked alike; a strategy without the key offloads nothing
 * (*what 0). */
int dt_offload_what_plan(const dt_host_v1_t *host, int params_ok, const char *what_is,
                         uint32_t *what);
/* Move what offload_what sends to the tier out of a planned device
 * estimate (dt_dp_estimate_state's tags) and into its DT_TAG_OFFLOAD: the
 * optimizer's f32 master and moments of the `owned` elements, and with
 * the parameters the compute copy's `sharded` elements (a device master
 * of `owned` f32 appearing where the optimizer stays on the device).
 * Adds to out->offload_bytes_per_step what a step reads from and writes to
 * the tier: the optimizer's bytes twice (read, updated, written back) and
 * the compute shard (2 n_micro + 1) times (loaded before the forward and
 * the backward gather of every micro-step, written once by the update). */
void dt_offload_estimate(const dt_estimate_args_v1_t *args, uint32_t what, uint64_t owned,
                         uint64_t sharded, dt_estimate_v1_t *out);

/* ------------------------------------------------------------------------
 * Compute parameters in a tier (ZeRO-Infinity's offload_param): `numel`
 * elements of the model's param dtype in one tier buffer, written from
 * f32 values (rounded to bf16/f16 on the host, nearest even like the device's
 * cast) and loaded into device memory before use.  Through the tier's
 * host_ptr where it has one, else through store / load and pinned staging.
 * --------------------------------------------------------------------- */
struct dt_offload_state;
typedef struct dt_offload_params {
    const dt_host_v1_t *host;
    dt_offload_t *tier;
    dt_device_t *dev;
    int32_t rank;
    int32_t pdtype;           /* DT_F32, DT_BF16 or DT_F16 */
    uint64_t numel;
    dt_offload_buf_t *buf;
    void *host_ptr;           /* the tier's host pointer, or NULL */
    void *stage;              /* pinned: one piece of pdtype (no host_ptr or
                               * 16-bit); wstage[0] */
    uint64_t piece;
    /* Writes through store (no host_ptr): asynchronous from a pinned
     * piece, reused once its store is waited on (dt_offload_params_flush
     * waits); wstage[1], where allocated, a second piece alternating with
     * it (NULL in this version: no more pinned memory than before). */
    void *wstage[2];
    dt_offload_req_t *wreq[2];  /* the store from wstage[i] in flight, or NULL */
    uint64_t wat[2], wn[2];     /* its elements (messages) */
    uint32_t wnext;             /* the piece the next write uses */
    uint32_t reserved0;
    uint64_t moved[2];          /* bytes loaded [0] and stored [1] since the
                                 * last dt_offload_state_report */
    struct dt_offload_state *writer; /* the optimizer state whose update
                                 * stores these parameters (its stores are
                                 * waited before a load), or NULL */
} dt_offload_params_t;

int dt_offload_params_init(dt_offload_params_t *p, const dt_host_v1_t *host,
                           const dt_strategy_init_v1_t *args, int32_t rank, uint64_t numel);
void dt_offload_params_free(dt_offload_params_t *p);
/* Elements [at, at + n) from f32 host memory `src`, which may be reused
 * on return: copied (rounded to bf16/f16) into pinned staging whose store
 * runs on while the caller goes on (the next piece waits for it before
 * reusing the staging).  A tier with host_ptr is written at once.  A
 * store that failed is reported by the write or flush that waits for it,
 * naming the elements. */
int dt_offload_params_write(dt_offload_params_t *p, uint64_t at, uint64_t n, const float *src);
/* Wait (each within the tier's bound) for the writes still in flight.
 * dt_offload_params_load and dt_offload_params_free call it first, so a
 * load reads what was written. */
int dt_offload_params_flush(dt_offload_params_t *p);
/* Start loading elements [at, at + n) into device memory `dst`, ordered
 * after the work queued on `stream` and after the writes before it (its
 * own and its writer's update's, flushed first); wait on *req with the
 * tier's wait. */
int dt_offload_params_load(dt_offload_params_t *p, uint64_t at, uint64_t n, void *dst,
                           dt_stream_t *stream, dt_offload_req_t **req);

/* ------------------------------------------------------------------------
 * Optimizer state in a tier (ZeRO-Offload): master, m, v of `numel` f32.
 * On a tier with host_ptr (offload_cpu) the update runs in place; on one
 * without (offload_nvme) each piece is loaded into pinned staging, updated
 * and stored back, two sets of staging alternating so the next piece's
 * loads and the previous piece's stores run while a piece is updated.
 * --------------------------------------------------------------------- */
typedef struct dt_offload_state {
    const dt_host_v1_t *host;
    dt_offload_t *tier;
    dt_device_t *dev;
    dt_stream_t *cs;          /* the compute stream: copies are ordered on it */
    int32_t rank;
    int32_t pdtype;           /* compute parameters: DT_F32, DT_BF16 or DT_F16 */
    int32_t n_kinds;          /* 3 (AdamW) or 2 (SGD: no second moment) */
    int32_t reserved0;
    uint64_t numel;
    dt_offload_params_t *params; /* compute copy in the tier, or NULL: on
                                  * the device (dcompute pointers) */
    dt_offload_buf_t *buf[DT_STATE_COUNT];
    float *state[DT_STATE_COUNT]; /* host pointers (host_ptr tiers), else NULL */
    float *stage[2][DT_STATE_COUNT]; /* pinned pieces (tiers without host_ptr) */
    float *gstage;            /* pinned: gradients of one piece */
    uint16_t *pstage;         /* pinned: 16-bit parameters of one piece */
    uint64_t piece;           /* elements per piece */
    /* time spent in update since the last dt_offload_state_report, ns */
    uint64_t ns_wait;         /* waiting for the tier's loads and stores */
    uint64_t ns_copy;         /* gradients in, parameters out */
    uint64_t ns_optim;        /* the host optimizer */
    /* the reduced gradient shard in the tier too (dt_offload_state_grads:
     * ZeRO-Offload's gradients on the host), or gbuf NULL: on the device */
    dt_offload_buf_t *gbuf;   /* numel f32, tag grads */
    float *grads;             /* its host pointer (host_ptr tiers), else NULL */
    float *gload[2];          /* pinned: a piece of it per staging set */
    uint64_t ns_grads;        /* moving gradients into the tier since the
                               * last report (dt_offload_grads_add) */
    int32_t threads;          /* host optimizer threads: the device's
                               * compute threads (props), at least 1;
                               * each piece is split into this many
                               * slices (element-wise: the same bits) */
    int32_t reserved1;
    /* dt_offload_grads_add's stores (tiers without host_ptr): from
     * gload[i], asynchronous, completed before anything reads the
     * gradient or reuses gload[i] (the norm, the update, grads_load, a
     * later add over the same elements, free). */
    dt_offload_req_t *gwreq[2];
    uint64_t gwat[2], gwn[2];   /* their elements (messages, overlap) */
    uint32_t gwnext;            /* the staging the next piece uses */
    int32_t reserved2;
    /* A step's traffic: bytes loaded from [0] and stored to [1] the tier
     * by update, the gradients' add / load / norm and (in `params`) the
     * parameters' loads and writes since the last report; checkpoints'
     * reads and writes are not counted. */
    uint64_t moved[2];
    /* update's stores from staging set i (the state's kinds, unused, the
     * f32 parameters'): a call's last piece's run on past its return,
     * waited by the next call's first piece (which starts on the other
     * set, uset) or by dt_offload_state_flush */
    dt_offload_req_t *ustore[2][DT_STATE_COUNT + 2];
    uint32_t uset;
    int32_t reserved3;
} dt_offload_state_t;

/* Allocate master, m (and v when has_v) of `numel` f32 in the tier and the
 * pinned staging; the host optimizer takes as many threads as the device
 * computes with (dt_device_props_v1_t threads; 1 when it says none).  `params`: the compute copy lives in the tier there
 * (update and push write it), or NULL: on the device.  On failure
 * everything made is freed again. */
int dt_offload_state_init(dt_offload_state_t *st, const dt_host_v1_t *host,
                          const dt_strategy_init_v1_t *args, int32_t rank, uint64_t numel,
                          int has_v, dt_offload_params_t *params);
/* Free what init made; safe on a zeroed state. */
void dt_offload_state_free(dt_offload_state_t *st);

/* The optimizer over range `r` of `unit`, whose elements sit at `at` in
 * the state: gradients `dgrad` (r.count f32, device) copied over, or with
 * dgrad NULL read from the tier's gradients at `at` (loaded alongside the
 * state), the update on the host, the new parameters written to
 * `dcompute` (r.count elements of pdtype, device), or to the tier's
 * compute copy at `at`.  On a tier without host pointers the stores of
 * the last piece (the state's, and f32 parameters' in the tier) are still
 * in flight on return, so consecutive calls (a step's units) keep the
 * tier busy across them: call dt_offload_state_flush after a step's last
 * update (the state's other functions and free flush first). */
int dt_offload_state_update(dt_offload_state_t *st, const dt_unit_desc_v1_t *unit,
                            dt_range_t r, uint64_t at, const float *dgrad, void *dcompute,
                            const dt_optim_step_t *opt);
/* Wait (each within the tier's bound) for the stores update left in
 * flight; a failure is logged and returned. */
int dt_offload_state_flush(dt_offload_state_t *st);
/* Copy the master parameters [at, at + n) to `dcompute` (device), or to
 * the tier's compute copy: after loading state. */
int dt_offload_state_push(dt_offload_state_t *st, uint64_t at, uint64_t n, void *dcompute);
/* State `kind` [at, at + n) to or from host memory (checkpoints).
 * Blocking. */
int dt_offload_state_read(dt_offload_state_t *st, int kind, uint64_t at, uint64_t n,
                          float *dst);
int dt_offload_state_write(dt_offload_state_t *st, int kind, uint64_t at, uint64_t n,
                           const float *src);
/* Continue 64-bit content hash *h (dtrain/sdk/hash.h) over state `kind`
 * [at, at + n).  Blocking. */
int dt_offload_state_hash(dt_offload_state_t *st, int kind, uint64_t at, uint64_t n,
                          uint64_t *h);

/* ------------------------------------------------------------------------
 * The reduced gradient in the tier as well (DeepSpeed's offload_optimizer
 * moves gradients to the host as they are reduced): `numel` f32 beside the
 * state, tag grads, filled a reduced block at a time and read by update.
 * --------------------------------------------------------------------- */
/* Allocate it (zeroed) and, for a tier without host pointers, two pinned
 * pieces to read it through.  Freed with the state. */
int dt_offload_state_grads(dt_offload_state_t *st);
/* How dt_offload_grads_add combines x (the device's) with y (the tier's),
 * each the bits the device path gives: */
enum { DT_OFFLOAD_GRADS_ADD = 0,   /* y + x: the device's axpy, alpha 1 */
       DT_OFFLOAD_GRADS_FIRST = 1, /* 0 + x: a zeroed buffer plus x */
       DT_OFFLOAD_GRADS_COPY = 2 }; /* x: the buffer itself */
/* Elements [at, at + n) of the gradient from device memory `dsrc` (f32),
 * after the work queued on `stream`, combined into the tier's as `mode`
 * (DT_OFFLOAD_GRADS_*) says.  Returns once dsrc is read: the last pieces'
 * stores to the tier run on (two pieces at most), waited for before
 * anything reads the gradient (grads_load, the norm, update) or frees
 * the state. */
int dt_offload_grads_add(dt_offload_state_t *st, uint64_t at, uint64_t n, const float *dsrc,
                         dt_stream_t *stream, int mode);
/* Elements [at, at + n) of the gradient to device memory `ddst` (f32), on
 * `stream`.  Blocking. */
int dt_offload_grads_load(dt_offload_state_t *st, uint64_t at, uint64_t n, float *ddst,
                          dt_stream_t *stream);
/* *out = the sum of squares of the whole gradient (numel elements), with
 * the bits of the cpu device's sumsq kernel over it (dt_sumsq_run_t). */
int dt_offload_grads_sumsq(dt_offload_state_t *st, double *out);
/* The same, less the sum of squares of the elements in skip[n_skip]
 * (ranges of the shard, in order, not overlapping): tensor parallelism's
 * copies another rank counts (a norm plan's skip ranges,
 * dt_dp_norm_plan_add).  Read once. */
int dt_offload_grads_sumsq_skip(dt_offload_state_t *st, const dt_range_t *skip,
                                uint32_t n_skip, double *out);

/* Log (DT_LOG_DEBUG) where the updates since the last call spent their
 * time - waiting for the tier, copies to and from the device, the host
 * optimizer - and the bytes the step moved through the tier (`moved`,
 * the parameters' included: "tier bytes loaded L, stored S, moved L+S",
 * what the planner's offload_bytes_per_step predicts) as "<when>: ...",
 * and start counting again. */
void dt_offload_state_report(dt_offload_state_t *st, const char *when);

/* Collective over `comm` on the whole of state `kind` (dt_state_kind_t),
 * which every rank holds alike (a replica): `root` >= 0 broadcasts that
 * rank's copy, root < 0 all-reduces with `op` (DT_OP_AVG: local SGD's
 * averaging).  Pieces travel through a transient device buffer (tag
 * comm), as communicators move device memory. */
int dt_offload_state_collective(dt_offload_state_t *st, int kind, dt_comm_t *comm, int32_t root,
                                int op);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_OFFLOAD_H */
