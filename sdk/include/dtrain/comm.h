/*
 * dtrain/comm.h - the communicator ABI (plugin kind "comm").
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * A communicator connects the `size` ranks of a group.  Collectives and
 * point-to-point transfers are started asynchronously and return a request
 * that is waited on, so communication overlaps compute.  EVERY wait is
 * bounded: a peer that died or stalled makes the wait fail with
 * DT_ERR_TIMEOUT or DT_ERR_REMOTE and a message naming the peer rank and the
 * operation (sequence number, op, bytes); never a hang.
 *
 * Ordering: every rank of a group must start the same collectives in the
 * same order (as in MPI and NCCL).  Buffers passed to a started operation
 * must stay valid and unmodified (send) / untouched (recv) until its wait
 * returns.
 *
 * Memory: every buffer passed to an operation is one of
 *  - device memory of the communicator's device (dt_comm_init_v1_t.dev,
 *    from its alloc, or a pointer into it).  This is the memory of all bulk
 *    traffic (gradients, parameters, activations) and the only memory
 *    send and recv take.  On a host-visible device (cpu) it is host
 *    memory;
 *  - host memory (malloc, the stack; not host_alloc's pinned memory,
 *    which holds bulk offload and staging data) holding a CONTROL
 *    MESSAGE: values the caller made on the host and reads back on the
 *    host (a config hash, a flag, the loss, an error text, a checkpoint's
 *    segment table), passed to a collective (all_reduce, reduce_scatter,
 *    all_gather, broadcast, reduce).
 * Who does what:
 *  - Callers pass device memory for anything large or frequent, and
 *    host memory only for control messages, normally blocking
 *    (req == NULL) on the NULL stream.  Another device's memory is never
 *    passed.  Every rank of an operation need not pass the same kind.
 *  - A communicator that moves host memory (shm, tcp, mpi) runs only
 *    with a host-visible device (dt_comm_check_host_memory), where the
 *    two kinds are the same memory.  self (one rank) copies an
 *    out-of-place operation with the device when its memory is not host
 *    memory, so there it takes host memory in place only; the core makes
 *    no control message at one rank.
 *  - A communicator for a device whose memory is not host memory (nccl
 *    on cuda) tells the two apart at each call and stages host memory
 *    through device memory of its own (accounted to DT_TAG_COMM and, for
 *    pinned copies, DT_TAG_STAGING).  A staged operation completes before
 *    it returns, even when `req` is given (the request handed out is
 *    already complete), bounded by the group's timeout; it is ordered
 *    after the work queued on `stream` and waits for it.  A host buffer
 *    is staged whole, in one operation, with no size limit, so every rank
 *    makes the same underlying calls whatever memory it passed; the
 *    staging buffers grown for it are kept up to 1 MiB each.  It refuses
 *    host memory in send and recv (DT_ERR_UNSUPPORTED: a staged transfer
 *    would wait for its peer, so two ranks that both send first would
 *    wait out the timeout) and memory of another device, or memory it
 *    cannot place (DT_ERR_INVALID), naming the buffer.
 *
 * Reductions of bf16 and f16: shm and tcp accumulate in f32 and round
 * once.  mpi rounds each combine of two partial results to the type
 * (as many roundings as ranks less one).  nccl reduces in the type's own
 * arithmetic as NCCL does, each step of its ring or tree rounding the
 * partial result to the type, so a sum over N ranks may differ from the
 * f32-accumulated one by up to N - 1 roundings of the partial sums.  A
 * caller that needs f32 accumulation on every communicator reduces f32
 * (the strategies' reduce_dtype = "fp32", their default).  Integer sums
 * wrap; f32 and f64 are reduced in their own type everywhere.
 *
 * Streams: `stream` orders the operation after work already queued on that
 * device stream (NCCL enqueues on its native handle; host-memory
 * communicators synchronise it first).  NULL means the default stream.
 *
 * Thread safety: a group (dt_comm_t) is driven by one thread at a time:
 * starting operations, wait, test, split and finalize are never called
 * concurrently on the same group (the order of collectives is part of the
 * contract, and concurrent starts would have none).  Different groups
 * (split from the same world) may be driven from different threads.
 * `abort` is the exception: any thread, any time, even while another
 * thread waits on the group.  cleanup_job needs no instance.
 */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include <stdint.h>

#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/plugin.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DT_COMM_ABI_MAJOR 1
#define DT_COMM_ABI_MINOR 0

/* A communicator (dt_comm_t): opaque to the core, the plugin's own struct, which
 * must start with a pointer to the table that made it (libfabric's rule):
 *     struct dt_comm { const dt_comm_ops_v1_t *ops; ... };  // ops = &my_ops
 * so a handle alone is enough to call it: dt_comm_ops(c)->slot(c, ...).
 * Groups split returns follow the same rule.  The core refuses a handle
 * whose first member is not the table it loaded from the plugin. */
typedef struct dt_comm dt_comm_t;         /* a group of ranks, opaque */
typedef struct dt_comm_req dt_comm_req_t; /* an operation in flight, opaque */

typedef enum dt_reduce_op {
    DT_OP_SUM = 0,
    DT_OP_AVG = 1, /* sum divided by the group size */
    DT_OP_MAX = 2,
    DT_OP_MIN = 3
} dt_reduce_op_t;

/* `color` passed to split by ranks that join no new group. */
#define DT_COMM_NO_COLOR (-1)

/* Arguments to comm init (in; valid during init only; read with
 * dt_args_read). */
typedef struct dt_comm_init_v1 {
    uint32_t struct_size;    /* sizeof(dt_comm_init_v1_t) at the core's build */
    int32_t rank;            /* this process's rank in [0, size) */
    int32_t size;            /* number of ranks in the world */
    int32_t local_rank;      /* rank on this machine */
    int32_t local_size;      /* ranks on this machine */
    int32_t reserved0;
    const char *job_id;      /* unique per job: names shared resources */
    const char *master_addr; /* rendezvous host (network comms), may be NULL */
    int32_t master_port;     /* rendezvous port, 0 = none */
    int32_t reserved1;
    int64_t timeout_ms;      /* default bound for every wait, > 0 */
    dt_device_t *dev;        /* the compute device, for streams (its table:
                              * dt_device_ops(dev)); NULL: none */
    /* A secret shared by the ranks of this job and nobody else (NUL-ended,
     * non-empty, any bytes; NULL: none).  Knowing job_id is then not
     * enough to join: a communicator that meets its peers through a named
     * resource refuses one whose creator had another secret (or none),
     * naming the resource, never the secret.  It stores or sends only a
     * keyed hash of it, never the secret itself.  The launcher generates
     * one per job (DTRAIN_JOB_SECRET); ranks of one job pass the same. */
    const char *job_secret;
    /* ---- minor 0 ends here; append only ---- */
} dt_comm_init_v1_t;
#define DT_COMM_INIT_V1_SIZE0 DT_FIELD_END(dt_comm_init_v1_t, job_secret)

typedef struct dt_comm_ops_v1 {
    dt_plugin_info_t info; /* base first; info.kind == DT_KIND_COMM */

    /* ---- lifecycle (mandatory) ---- */
    /* Join the world group: blocks until all `size` ranks arrived or
     * timeout_ms expired (then DT_ERR_TIMEOUT naming the missing ranks). */
    int (*init)(const dt_host_v1_t *host, const dt_comm_init_v1_t *args,
                dt_comm_t **out);
    /* Leave and free the group (and groups split from it are still valid
     * until their own finalize).  Releases shared resources.  NULL ok. */
    void (*finalize)(dt_comm_t *c);
    /* This rank's index and the group size. */
    int (*rank_size)(dt_comm_t *c, int32_t *rank, int32_t *size);

    /* ---- collectives (mandatory).  `req` out: the started operation, to
     * pass to wait.  Passing req == NULL makes the call blocking (waits with
     * the default timeout).  Counts are ELEMENTS of `dtype`.  count == 0 is
     * valid and still synchronises nothing. ---- */
    /* recv[i] = op over ranks of send[i], (count); send == recv in place. */
    int (*all_reduce)(dt_comm_t *c, const void *send, void *recv,
                      uint64_t count, int dtype, int op, dt_stream_t *stream,
                      dt_comm_req_t **req);
    /* send (size * recv_count) is reduced; rank r receives block r
     * (recv_count).  recv may alias send + r * recv_count. */
    int (*reduce_scatter)(dt_comm_t *c, const void *send, void *recv,
                          uint64_t recv_count, int dtype, int op,
                          dt_stream_t *stream, dt_comm_req_t **req);
    /* recv (size * send_count) = concatenation of every rank's send
     * (send_count), rank order.  send may alias recv + rank * send_count. */
    int (*all_gather)(dt_comm_t *c, const void *send, void *recv,
                      uint64_t send_count, int dtype, dt_stream_t *stream,
                      dt_comm_req_t **req);
    /* buf (count) on `root` is copied to every rank's buf. */
    int (*broadcast)(dt_comm_t *c, void *buf, uint64_t count, int dtype,
                     int32_t root, dt_stream_t *stream, dt_comm_req_t **req);
    /* recv on `root` = op over ranks of send (count); recv ignored elsewhere. */
    int (*reduce)(dt_comm_t *c, const void *send, void *recv, uint64_t count,
                  int dtype, int op, int32_t root, dt_stream_t *stream,
                  dt_comm_req_t **req);
    /* Point to point.  A send to `peer` matches the next recv from this rank
     * on `peer` with the same `tag`. */
    int (*send)(dt_comm_t *c, const void *buf, uint64_t count, int dtype,
                int32_t peer, int32_t tag, dt_stream_t *stream,
                dt_comm_req_t **req);
    int (*recv)(dt_comm_t *c, void *buf, uint64_t count, int dtype,
                int32_t peer, int32_t tag, dt_stream_t *stream,
                dt_comm_req_t **req);
    /* All ranks arrive before any leaves. */
    int (*barrier)(dt_comm_t *c, dt_comm_req_t **req);
    /* Wait for `req` to complete, at most timeout_ms (< 0: the group's
     * default).  Frees req whatever the outcome.  On timeout the message
     * names the ranks that did not arrive and the operation. */
    int (*wait)(dt_comm_t *c, dt_comm_req_t *req, int64_t timeout_ms);

    /* ---- groups (mandatory) ---- */
    /* Collective over `c`: ranks with the same color form a new group,
     * ordered by (key, rank).  color == DT_COMM_NO_COLOR gives *out = NULL. */
    int (*split)(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out);

    /* ---- failure (mandatory) ---- */
    /* Mark the whole job failed with `reason`: every rank's pending and
     * future waits fail promptly with DT_ERR_REMOTE naming this rank and the
     * reason.  Safe to call from a signal-free error path; never blocks. */
    int (*abort)(dt_comm_t *c, const char *reason);

    /* ---- optional ---- */
    /* Non-blocking completion check: *done = 1 when wait would return at once. */
    int (*test)(dt_comm_t *c, dt_comm_req_t *req, int *done);
    /* Remove what ranks of job `job_id` left behind when they died before
     * finalize (shared-memory segments, socket files).  No instance: the
     * launcher calls it once after every local rank has exited, with this
     * plugin's host table (its config).  Removes only what this plugin
     * creates for that job and the calling user owns; nothing to remove is
     * DT_OK.  Idempotent. */
    int (*cleanup_job)(const dt_host_v1_t *host, const char *job_id);

    /* ---- symmetric memory (optional) ----
     * Host memory that every rank of the group maps as well, as NCCL's
     * registered buffers and PyTorch's SymmetricMemory are on GPUs.  An
     * in-place all_reduce whose buffer lies in such an allocation at the
     * same offset on every rank reads and writes the peers' copies
     * directly instead of staging them through the communicator's own
     * buffers: a copy less per element.  Every rank of a collective must
     * then pass symmetric memory at the same place, or none (a mismatch
     * fails like mismatched arguments).  Otherwise it is ordinary host
     * memory: any thread may read and write it between operations.
     *
     * sym_alloc is collective over `c`: every rank calls it in the same
     * order with the same `bytes`; all succeed or all fail (then the caller
     * allocates ordinary memory instead; DT_ERR_UNSUPPORTED when the
     * communicator cannot or was told not to).  The memory is zeroed and
     * counted as the caller's under `tag` (dt_mem_tag_t).  sym_free is
     * local and needs no peer: every operation on the memory must have
     * been waited for; DT_ERR_INVALID for a pointer sym_alloc did not
     * return.  Finalizing the group frees what is left. */
    int (*sym_alloc)(dt_comm_t *c, uint64_t bytes, int tag, void **out);
    int (*sym_free)(dt_comm_t *c, void *ptr);

    /* ---- grouped point to point (optional) ----
     * A send to `send_peer` and a recv from `recv_peer` started as ONE
     * operation: neither waits for the other to be matched, whatever order
     * the peers start theirs in.  Where a send blocks until its receiver
     * runs (NCCL: a send on a stream, once the message is larger than
     * NCCL buffers), two ranks that each send to the other and then
     * receive from it deadlock unless each starts the two together (NCCL:
     * ncclGroupStart/End around them; Megatron's batch_isend_irecv).  A
     * pipeline stage exchanging an activation for a gradient with its
     * neighbour is that case.
     *
     * Each half is exactly send(c, sendbuf, send_count, dtype, send_peer,
     * send_tag) and recv(c, recvbuf, recv_count, dtype, recv_peer,
     * recv_tag): the same matching, tags, buffers and counts (ELEMENTS of
     * `dtype`; 0 moves nothing for that half), so a peer may match either
     * half with its own sendrecv or with a plain send or recv.  The peers
     * may differ (a middle stage sends on and receives from behind).
     * Requests: with send_req and recv_req both given, each half's
     * request, waited for on its own (the recv's data is there when its
     * wait returns, the send's buffer free when its wait returns); with
     * both NULL the call blocks until both halves are done; one NULL and
     * not the other is DT_ERR_INVALID.  On failure no request is handed
     * out and no half is left running (an argument error of either half
     * starts neither).  Where it is absent (DT_HAS_OP), a caller starts
     * the send, then the recv: the same where sends never wait for their
     * receiver (shm, tcp, mpi; all three have it), the deadlock above on
     * nccl. */
    int (*sendrecv)(dt_comm_t *c, const void *sendbuf, uint64_t send_count,
                    void *recvbuf, uint64_t recv_count, int dtype,
                    int32_t send_peer, int32_t recv_peer, int32_t send_tag,
                    int32_t recv_tag, dt_stream_t *stream,
                    dt_comm_req_t **send_req, dt_comm_req_t **recv_req);

    /* ---- minor 0 ends here; append only ---- */
} dt_comm_ops_v1_t;

/* Current-version names. */
typedef dt_comm_ops_v1_t dt_comm_ops_t;

/* The table instance `c` was made by: its first member (the rule at
 * dt_comm_t above); NULL for a NULL handle. */
static inline const dt_comm_ops_v1_t *dt_comm_ops(const dt_comm_t *c)
{
    return c ? *(const dt_comm_ops_v1_t *const *)(const void *)c : NULL;
}
typedef dt_comm_init_v1_t dt_comm_init_t;

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_COMM_H */
