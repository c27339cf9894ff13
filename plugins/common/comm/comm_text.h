/*
 * plugins/common/comm/comm_text.h - how a communicator names its operations and
 * ranks in messages, and the argument checks every operation makes, so
 * that the shm, mpi and nccl communicators (and third-party ones) say the
 * same thing in the same words:
 *
 *     all_reduce #3 (f32, 4096 bytes) on group world
 *     send #2 to rank 1 (world rank 3) (tag 5, f32, 40 bytes) on group tp
 *     broadcast #1 (f32, 40 bytes, root 0) on group world: root 5 is not
 *     a rank of the group [0, 4)
 *
 * Pure text: no communication, nothing allocated.  Messages are cut to
 * the caller's buffer, never failed for length.
 *
 * In-tree only, not installed: part of dtrain_common_comm, the static,
 * hidden-visibility library the in-tree communicators link
 * (plugins/common/CMakeLists.txt); it changes with them and follows the SDK
 * helpers' conventions (dtrain/sdk_helpers.h).
 */
#ifndef DT_COMMON_COMM_TEXT_H
#define DT_COMMON_COMM_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The operations of dt_comm_ops_v1_t, as messages name them.  A plugin
 * may number its own kinds with these (shm and mpi do). */
typedef enum dt_comm_op_kind {
    DT_COMM_OP_ALL_REDUCE = 1,
    DT_COMM_OP_REDUCE_SCATTER,
    DT_COMM_OP_ALL_GATHER,
    DT_COMM_OP_BROADCAST,
    DT_COMM_OP_REDUCE,
    DT_COMM_OP_BARRIER,
    DT_COMM_OP_SEND,
    DT_COMM_OP_RECV,
    DT_COMM_OP_KIND_END
} dt_comm_op_kind_t;

/* "all_reduce", "send", ...; "?" for anything else (a kind read from a
 * peer may hold anything). */
const char *dt_comm_op_name(int kind);
/* "sum", "avg", "max", "min"; "?" for anything else. */
const char *dt_comm_redop_name(int op);

/* How a group is named: its name and, for a group split from another,
 * the world rank of each of its ranks. */
typedef struct dt_comm_names {
    const char *gname;       /* "world", "world/g1c0", ... */
    int is_world;            /* 1: ranks are world ranks already */
    int32_t size;            /* ranks in the group */
    const int32_t *wranks;   /* [size] world rank of each group rank, or
                              * NULL when unknown (ranks named plainly) */
} dt_comm_names_t;

/* One operation, as far as messages describe it. */
typedef struct dt_comm_op_desc {
    int kind;       /* dt_comm_op_kind_t */
    uint64_t seq;   /* " #n" when nonzero (per group; 0: not numbered yet) */
    int dtype;      /* dt_dtype_t */
    int op;         /* dt_reduce_op_t (all_reduce, reduce_scatter, reduce) */
    int32_t root;   /* root (broadcast, reduce) or peer (send, recv) */
    int32_t tag;    /* send, recv */
    uint64_t bytes; /* this rank's buffer; per rank for all_gather and
                     * reduce_scatter */
} dt_comm_op_desc_t;

/* "rank 3", or for a split group "rank 1 (world rank 3)".  A rank outside
 * [0, size) (a bad argument being reported) is named plainly. */
void dt_comm_fmt_rank(const dt_comm_names_t *g, int32_t r, char *buf,
                      size_t cap);
/* "rank 3" / "ranks 2, 3" (each with its world rank in a split group);
 * n <= 0 gives "no rank (the condition was met meanwhile)".  Every entry
 * of list must be in [0, size). */
void dt_comm_fmt_ranks(const dt_comm_names_t *g, const int *list, int n,
                       char *buf, size_t cap);

/* The operation, by kind:
 *   all_reduce #3 (f32, 4096 bytes) on group world
 *   reduce_scatter #4 (f32 avg, 1024 bytes per rank) on group world
 *   all_gather #5 (bf16, 1024 bytes per rank) on group world
 *   broadcast #6 (f32, 40 bytes, root 0) on group world
 *   reduce #7 (f32 max, 40 bytes, root 1) on group world
 *   barrier #8 on group world
 *   send #2 to rank 1 (world rank 3) (tag 5, f32, 40 bytes) on group tp
 *   recv #2 from rank 0 (tag 5, f32, 40 bytes) on group world
 * (the " #n" left out while seq is 0). */
void dt_comm_op_text(const dt_comm_names_t *g, const dt_comm_op_desc_t *d,
                     char *buf, size_t cap);

/* host->set_error(status, "<operation>: <fmt ...>"); returns status. */
int dt_comm_op_fail(const dt_host_v1_t *h, const dt_comm_names_t *g,
                    const dt_comm_op_desc_t *d, int status, const char *fmt,
                    ...) DT_PRINTF(5, 6);

/* ---- argument checks ---------------------------------------------------
 * Each returns DT_OK, or fails through dt_comm_op_fail (the message naming
 * the operation) with DT_ERR_INVALID unless said otherwise.  A plugin
 * calls them in this order, its own limits (a count too large for it, a
 * dtype it does not move) between the first two and the last. */

/* A dtype dt_dtype_size knows: "unknown dtype 42". */
int dt_comm_check_dtype(const dt_host_v1_t *h, const dt_comm_names_t *g,
                        const dt_comm_op_desc_t *d);
/* For all_reduce, reduce_scatter and reduce (DT_OK for other kinds): a
 * dt_reduce_op_t, "unknown reduction op 9"; and avg only on floating
 * dtypes, DT_ERR_UNSUPPORTED "op avg is not defined for integer dtype
 * i32". */
int dt_comm_check_reduce(const dt_host_v1_t *h, const dt_comm_names_t *g,
                         const dt_comm_op_desc_t *d);
/* The root of broadcast / reduce, the peer of send / recv, in [0, size):
 * "root 5 is not a rank of the group [0, 4)" ("peer 5 ..."); then the
 * buffers the kind reads or writes, when count > 0: "send buffer is NULL"
 * ("recv", or "data" for broadcast's one buffer; reduce's recv only on
 * its root, `rank` being this rank of the group). */
int dt_comm_check_args(const dt_host_v1_t *h, const dt_comm_names_t *g,
                       const dt_comm_op_desc_t *d, int32_t rank,
                       uint64_t count, const void *send, const void *recv);

/* sendrecv's requests: both out-pointers cleared where given; both given
 * or both NULL, else DT_ERR_INVALID "sendrecv: send_req and recv_req are
 * both given or both NULL". */
int dt_comm_sendrecv_reqs(const dt_host_v1_t *h, dt_comm_req_t **send_req,
                          dt_comm_req_t **recv_req);

/* ---- init, wait and test checks ----------------------------------------
 * The checks every communicator's init, wait and test make before its own,
 * in the same words.  h NULL (nowhere to put a message: a NULL host, or a
 * NULL communicator the caller could not take the host from) gives
 * DT_ERR_INVALID without one. */

/* init's: out and args non-NULL ("init: NULL out", "init: NULL args"),
 * *out set to NULL, args read into *a under the growth rule (dt_args_read,
 * "init args ..."), rank in [0, size) ("init: rank 3 is not in [0, 2)"),
 * timeout_ms > 0 ("init: timeout_ms must be > 0 (got 0)").  Each failure
 * is DT_ERR_INVALID but the growth rule's own statuses. */
int dt_comm_check_init(const dt_host_v1_t *h, const dt_comm_init_v1_t *args,
                       dt_comm_t **out, dt_comm_init_v1_t *a);
/* For a communicator that moves host memory only (named `comm`, "shm"):
 * DT_ERR_UNSUPPORTED "device 'cuda' memory is not host memory; the shm
 * communicator moves host memory only (use nccl on GPUs)" when a's device
 * says its memory is not host visible; DT_OK without a device, or when
 * the device cannot say. */
int dt_comm_check_host_memory(const dt_host_v1_t *h, const dt_comm_init_v1_t *a,
                              const char *comm);
/* wait's: "wait: NULL request". */
int dt_comm_check_wait(const dt_host_v1_t *h, const dt_comm_req_t *req);
/* test's: "test: NULL argument" (the request or done). */
int dt_comm_check_test(const dt_host_v1_t *h, const dt_comm_req_t *req,
                       const int *done);

#ifdef __cplusplus
}
#endif

#endif /* DT_COMMON_COMM_TEXT_H */
