/*
 * plugins/common/comm/creq.h - the request base the in-tree communicators
 * share (libfabric's util_ep / util_cq in prov/util): what an operation is
 * (the words of its messages), its number, its place on the group's list
 * of requests nobody has waited for yet, and the steps every transport's
 * start, wait, test and finalize take alike:
 *
 *     struct dt_comm_req { dt_creq_t b; ...the transport's own... };
 *
 *   start     dt_creq_check_op (the dtype and reduction checks),
 *             dt_creq_stream_sync (host-memory transport:
 *             what is queued on the stream first), dt_creq_number,
 *             dt_creq_refuse_broken / dt_creq_refuse_failed ("not
 *             started"), dt_creq_new (a copy of the template, "out of
 *             memory for the request"), dt_creq_live_add
 *   wait      dt_creq_limit_ms (the group's or the wait's own limit),
 *             dt_creq_timeout_text ("timed out after 1.0 s waiting for
 *             rank 1"), dt_creq_live_remove
 *   finalize  dt_creq_drop_live: whatever nobody waited for, dropped
 *
 * Each transport keeps its own progress engine (a progress thread and a
 * queue for shm and tcp, MPI_Test for mpi), its own locking (the live
 * list is guarded by whatever guards the group's queue) and its own
 * completion state.  DT_CREQ_OPS declares the comm ABI's operation slots
 * under a transport's prefix.
 *
 * In-tree only, not installed: part of dtrain_common_comm, the static,
 * hidden-visibility library the in-tree communicators link
 * (plugins/common/CMakeLists.txt); it changes with them.
 */
#ifndef DT_COMMON_CREQ_H
#define DT_COMMON_CREQ_H

#include <stddef.h>
#include <stdint.h>

#include "common/comm/comm_text.h"
#include "dtrain/comm.h"
#include "dtrain/device.h"
#include "dtrain/host.h"

typedef struct dt_creq {
    struct dt_creq *live_prev, *live_next; /* the group's live list */
    int kind;               /* dt_comm_op_kind_t */
    int dtype, op;
    int32_t root;           /* root, or peer for send / recv */
    int32_t tag;
    uint64_t count;         /* elements, as the op's ABI slot counts them */
    size_t esize;           /* bytes of one (1 for an unknown dtype) */
    uint64_t seq;           /* "#n": per group, collectives and p2p apart */
} dt_creq_t;

/* 1 for send and recv (numbered apart from the collectives). */
static inline int dt_creq_is_p2p(const dt_creq_t *r)
{
    return r->kind == DT_COMM_OP_SEND || r->kind == DT_COMM_OP_RECV;
}

/* r as comm_text describes an operation (bytes: count * esize). */
static inline dt_comm_op_desc_t dt_creq_desc(const dt_creq_t *r)
{
    return (dt_comm_op_desc_t){.kind = r->kind, .seq = r->seq, .dtype = r->dtype,
                               .op = r->op, .root = r->root, .tag = r->tag,
                               .bytes = r->count * r->esize};
}

/* "all_reduce #17 (f32, 4194304 bytes) on group world" */
void dt_creq_text(const dt_comm_names_t *g, const dt_creq_t *r, char *buf, size_t cap);

/* The first argument checks of the operation t describes (sets
 * t->esize, 1 for an unknown dtype, whose message counts its bytes as
 * elements): its dtype, then its reduction.  The transport's count limit
 * and dt_comm_check_args (buffers, root or peer) follow. */
int dt_creq_check_op(const dt_host_v1_t *h, const dt_comm_names_t *g, dt_creq_t *t);

/* A host-memory transport reads the caller's buffers on the host: what is
 * queued on `stream` must be done first (no device: nothing to wait for). */
static inline int dt_creq_stream_sync(dt_device_t *dev,
                                      dt_stream_t *stream)
{
    return dev && dev ? dt_device_ops(dev)->stream_sync(dev, stream) : DT_OK;
}

/* Give t the group's next number: collectives and p2p count apart. */
static inline void dt_creq_number(dt_creq_t *t, uint64_t *coll_seq, uint64_t *p2p_seq)
{
    t->seq = dt_creq_is_p2p(t) ? ++*p2p_seq : ++*coll_seq;
}

/* The refusals of an operation the group can no longer run, as every
 * transport words them: "<op>: not started: the group failed earlier:
 * <first cause>" and "<op>: not started: <the job's failure>".  Both
 * return `status` with the message set. */
int dt_creq_refuse_broken(const dt_host_v1_t *h, const dt_comm_names_t *g, const dt_creq_t *t,
                          int status, const char *broken_msg);
int dt_creq_refuse_failed(const dt_host_v1_t *h, const dt_comm_names_t *g, const dt_creq_t *t,
                          int status, const char *text);

/* A request of `size` bytes holding a copy of the template `tmpl` (a
 * transport's struct, starting with its dt_creq_t); NULL with "<op>: out
 * of memory for the request" set (DT_ERR_NOMEM). */
void *dt_creq_new(const dt_host_v1_t *h, const dt_comm_names_t *g, const void *tmpl,
                  size_t size);

/* The live list: requests started and not yet waited for (the caller
 * holds whatever guards it). */
void dt_creq_live_add(dt_creq_t **live, dt_creq_t *r);
void dt_creq_live_remove(dt_creq_t **live, dt_creq_t *r);
/* At finalize: take every request off the list, oldest last, handing each
 * to `drop` (which frees it, or leaves it to whoever still holds it);
 * returns how many. */
int dt_creq_drop_live(dt_creq_t **live, void (*drop)(void *ctx, dt_creq_t *r), void *ctx);

/* How long a wait waits: its own limit (timeout_ms >= 0; *own_limit = 1)
 * or the group's, capped at max_ms (keeps ms -> ns products in range). */
static inline int64_t dt_creq_limit_ms(int64_t timeout_ms, int64_t group_ms, int64_t max_ms,
                                       int *own_limit)
{
    *own_limit = timeout_ms >= 0;
    int64_t ms = *own_limit ? timeout_ms : group_ms;
    return ms > max_ms ? max_ms : ms;
}

/* "<desc>: timed out after 1.0 s[ (the wait's limit)] waiting for <who>" */
void dt_creq_timeout_text(const char *desc, int64_t ms, int own_limit, const char *who,
                          char *buf, size_t cap);

/* The comm ABI's operation slots (comm.h has their contracts) under a
 * transport's prefix: DT_CREQ_OPS(tcp_) declares tcp_all_reduce, ... */
#define DT_CREQ_OPS(p)                                                                      \
    int p##rank_size(dt_comm_t *c, int32_t *rank, int32_t *size);                           \
    int p##all_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count,           \
                      int dtype, int op, dt_stream_t *stream, dt_comm_req_t **req);         \
    int p##reduce_scatter(dt_comm_t *c, const void *send, void *recv, uint64_t recv_count,  \
                          int dtype, int op, dt_stream_t *stream, dt_comm_req_t **req);     \
    int p##all_gather(dt_comm_t *c, const void *send, void *recv, uint64_t send_count,      \
                      int dtype, dt_stream_t *stream, dt_comm_req_t **req);                 \
    int p##broadcast(dt_comm_t *c, void *buf, uint64_t count, int dtype, int32_t root,      \
                     dt_stream_t *stream, dt_comm_req_t **req);                             \
    int p##reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count, int dtype,    \
                  int op, int32_t root, dt_stream_t *stream, dt_comm_req_t **req);          \
    int p##send(dt_comm_t *c, const void *buf, uint64_t count, int dtype, int32_t peer,     \
                int32_t tag, dt_stream_t *stream, dt_comm_req_t **req);                     \
    int p##recv(dt_comm_t *c, void *buf, uint64_t count, int dtype, int32_t peer,           \
                int32_t tag, dt_stream_t *stream, dt_comm_req_t **req);                     \
    int p##sendrecv(dt_comm_t *c, const void *sendbuf, uint64_t send_count, void *recvbuf,  \
                    uint64_t recv_count, int dtype, int32_t send_peer, int32_t recv_peer,   \
                    int32_t send_tag, int32_t recv_tag, dt_stream_t *stream,                \
                    dt_comm_req_t **send_req, dt_comm_req_t **recv_req);                    \
    int p##barrier(dt_comm_t *c, dt_comm_req_t **req);                                      \
    int p##wait(dt_comm_t *c, dt_comm_req_t *r, int64_t timeout_ms);                        \
    int p##test(dt_comm_t *c, dt_comm_req_t *r, int *done)

#endif /* DT_COMMON_CREQ_H */
