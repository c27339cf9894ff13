/*
 * plugins/nccl/nccl_logic.h - the nccl communicator's decisions that need
 * no GPU, kept apart from the CUDA and NCCL calls so that the unit tests
 * run them on any machine (tests/unit/plugins/nccl/test_nccl_logic.c):
 *
 *   nccl_guard.c    the group's lock and its failure record: abort from
 *                   any thread without ever blocking, and the bounded
 *                   polls that notice it;
 *   nccl_buffers.c  how NCCL carries each dtype, what memory a buffer is
 *                   (given the pointer-attribute query, real or fake), and
 *                   how an operation's host buffers are staged through the
 *                   group's device bounce buffer.
 *
 * Only the types of nccl.h and the CUDA runtime are used here; nothing is
 * called from either library.
 */
#ifndef DT_NCCL_LOGIC_H
#define DT_NCCL_LOGIC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

/* ---- the failure record and the lock (nccl_guard.c) ------------------- */

#define NCCL_FAIL_MSG_MAX 640

/* Why a group failed: first reason wins.  Written once, by whichever
 * thread reports first (an operation's error, a timeout, abort from any
 * thread), readable by every thread without the lock: the message is
 * written before the status is published, so a reader that sees a
 * nonzero status reads a whole message. */
typedef struct nccl_fail {
    atomic_int claimed;  /* 0, then 1: the first reporter owns msg */
    atomic_int status;   /* a dt_status_t; 0 while healthy */
    char msg[NCCL_FAIL_MSG_MAX];
} nccl_fail_t;

/* Record `status` (nonzero) and `msg` unless a failure is recorded
 * already.  Returns 1 when this call recorded it.  Never blocks. */
int nccl_fail_set(nccl_fail_t *f, int status, const char *msg);
/* The recorded status (0: healthy); f->msg is whole once it is nonzero. */
int nccl_fail_status(const nccl_fail_t *f);

/* The lock of a group and what it guards: every NCCL call on the group's
 * communicator, which NCCL forbids from two threads at once ("it is not
 * allowed to issue NCCL operations to a single communicator in parallel
 * with multiple threads"), ncclCommAbort included.
 *
 * `apply` (called with mu held, exactly once, after a failure is recorded)
 * aborts the communicator.  A failure recorded by a thread that holds mu
 * is applied at once (nccl_guard_fail_locked).  One recorded by a thread
 * that does not (abort) is applied by that thread when mu is free
 * (trylock), and otherwise by the thread holding it: every holder looks
 * before it releases mu (nccl_guard_unlock), and the bounded polls made
 * with mu held look between two naps.  So abort never waits for the lock,
 * and still no NCCL call runs beside ncclCommAbort.  The race (abort
 * records while the holder releases) is closed by a Dekker pair: abort
 * publishes the status, fences, then tries the lock; the holder releases,
 * fences, then reads the status, and takes the lock back to apply it when
 * it sees one.  With both fences, at least one of them sees the other. */
typedef struct nccl_guard {
    pthread_mutex_t mu;
    nccl_fail_t fail;
    int applied;                /* apply ran (guarded by mu) */
    void (*apply)(void *ctx);   /* with mu held */
    void *ctx;
} nccl_guard_t;

void nccl_guard_init(nccl_guard_t *g, void (*apply)(void *ctx), void *ctx);
void nccl_guard_destroy(nccl_guard_t *g);
void nccl_guard_lock(nccl_guard_t *g);
/* Release mu, applying a recorded failure first (and again after, if one
 * arrived while releasing and the lock is free). */
void nccl_guard_unlock(nccl_guard_t *g);
/* With mu held: record the failure (if first) and apply it now.  Returns
 * 1 when this call recorded it. */
int nccl_guard_fail_locked(nccl_guard_t *g, int status, const char *msg);
/* Without mu, from any thread: record the failure (if first) and apply it
 * now when mu is free, else leave it to the holder.  Never blocks.
 * Returns 1 when this call recorded it. */
int nccl_guard_abort(nccl_guard_t *g, int status, const char *msg);
/* With mu held: apply a recorded failure now (a poll that saw one). */
void nccl_guard_apply_locked(nccl_guard_t *g);

/* ---- bounded polls (nccl_guard.c) -------------------------------------- */

/* One look: 1 done, 0 not yet, -1 failed (the look says why itself). */
typedef int (*nccl_look_fn)(void *ctx);

typedef enum nccl_poll_end {
    NCCL_POLL_DONE = 0,
    NCCL_POLL_FAILED,   /* the look returned -1 */
    NCCL_POLL_STOPPED,  /* a failure was recorded in `stop` (abort) */
    NCCL_POLL_TIMEOUT
} nccl_poll_end_t;

/* Look until done, failed, `stop` records a failure (checked before each
 * look; NULL: none) or `timeout_us` passed since the call (checked after
 * each look, so a look is made at least once), napping `nap_us` between
 * looks.  Never blocks longer than timeout_us plus one look and one nap. */
nccl_poll_end_t nccl_poll(nccl_look_fn look, void *ctx, const nccl_fail_t *stop,
                          int64_t timeout_us, int64_t nap_us);

/* ---- dtypes and buffers (nccl_buffers.c) -------------------------------- */

/* How NCCL carries `dtype` in an operation of `kind` (dt_comm_op_kind_t)
 * with `count` elements: *nt and the count NCCL is given (*ncount).
 * f32, bf16, f16, f64, i32, i64 and u8 are NCCL's own types.  u16 has no
 * NCCL type: it is moved as bytes (ncclUint8, 2 x count) by the
 * operations that only move data (all_gather, broadcast, send, recv) and
 * cannot be reduced.  Returns 1, or 0 when NCCL cannot carry it. */
int nccl_wire(int kind, int dtype, uint64_t count, ncclDataType_t *nt, uint64_t *ncount);

/* What memory a buffer is, to this group's GPU. */
typedef enum nccl_mem {
    NCCL_MEM_NONE = 0,   /* NULL (a buffer the operation does not use) */
    NCCL_MEM_DEVICE,     /* device memory of the group's GPU, or managed
                          * memory: NCCL reads and writes it directly */
    NCCL_MEM_HOST,       /* pageable or pinned host memory: staged */
    NCCL_MEM_OTHER_GPU,  /* device memory of another GPU: refused */
    NCCL_MEM_UNKNOWN     /* the runtime could not say: refused */
} nccl_mem_t;

/* cudaPointerGetAttributes' signature (a fake one in the tests). */
typedef cudaError_t (*nccl_attr_fn)(struct cudaPointerAttributes *attr, const void *p);

/* The memory `p` is, asking `attr`; `gpu` is the group's device.
 * *where: the GPU of device memory (else -1); *err: the query's error for
 * NCCL_MEM_UNKNOWN (else cudaSuccess).  Either may be NULL.  A pageable
 * pointer is cudaMemoryTypeUnregistered (CUDA 11 and later). */
nccl_mem_t nccl_mem_of(nccl_attr_fn attr, const void *p, int gpu, int *where,
                       cudaError_t *err);

/* Whether an operation of `kind` takes a buffer of memory `m`: DT_OK;
 * DT_ERR_UNSUPPORTED for host memory in send or recv (a staged transfer
 * completes before it returns, so it would block until the peer posts its
 * half: two ranks that both send first would wait for each other until
 * the timeout); DT_ERR_INVALID for another GPU's memory or memory the
 * runtime cannot place. */
int nccl_mem_allowed(int kind, nccl_mem_t m);

/* Host bytes are staged whole, in one NCCL call, whatever their size, so
 * that every rank makes the same NCCL calls whether its buffers are host
 * or device memory.  The bounce buffers grown for an operation are kept
 * for the next one up to NCCL_BOUNCE_KEEP bytes each (control messages
 * are a few KiB); larger ones are freed after the operation. */
#define NCCL_BOUNCE_KEEP (1u << 20)
#define NCCL_BOUNCE_ALIGN 256u

/* How one operation uses the bounce buffers: device offsets of the staged
 * send and recv buffers, and what is copied each way. */
typedef struct nccl_stage_plan {
    int stage_send, stage_recv; /* 1: that buffer is host memory, staged */
    uint64_t send_bytes;        /* this rank's send buffer, by kind */
    uint64_t recv_bytes;        /* this rank's recv buffer, by kind */
    uint64_t send_off, recv_off; /* in the device bounce buffer */
    uint64_t dev_bytes;         /* device bounce buffer needed */
    uint64_t host_bytes;        /* pinned bounce buffer needed */
    int copy_in;                /* host send -> pinned -> device, before */
    int copy_out;               /* device -> pinned -> host recv, after */
} nccl_stage_plan_t;

/* The plan for an operation of `kind` (a collective: all_reduce,
 * reduce_scatter, all_gather, broadcast, reduce) with `count` elements
 * of `esize` bytes (the count argument, as comm.h defines it per kind),
 * on a group of `size` ranks where this is `rank` and `root` the root
 * (broadcast, reduce).  Broadcast's one buffer is passed as both send and
 * recv.  send_mem / recv_mem: nccl_mem_of each buffer (NCCL_MEM_HOST or
 * NCCL_MEM_DEVICE or NCCL_MEM_NONE; nccl_mem_allowed checked before).
 * Staging keeps an operation in place when its host buffers are
 * (all_reduce and reduce with send == recv; all_gather's send at recv +
 * rank x count; reduce_scatter's recv at send + rank x count; broadcast).
 * Returns 1 when anything is staged, 0 when both buffers are device
 * memory (then *p says nothing more). */
int nccl_stage_plan(int kind, uint64_t count, size_t esize, int32_t size, int32_t rank,
                    int32_t root, const void *send, const void *recv, nccl_mem_t send_mem,
                    nccl_mem_t recv_mem, nccl_stage_plan_t *p);

#endif /* DT_NCCL_LOGIC_H */
