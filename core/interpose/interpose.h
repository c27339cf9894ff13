/*
 * core/interpose/interpose.h - one wrapper over a plugin's ops table that
 * sees every call: tracing, profiling and fault injection without touching
 * the plugin (SQLite's vfstrace shim over sqlite3_io_methods).
 *
 * An interposer is built over a plugin's table and hands out a table of the
 * same type.  Each slot of that table calls the user's `before` hook, then
 * (unless `before` returned a failure to inject) the plugin's slot, then
 * the user's `after` hook with the status and the time the plugin took.
 * Handles the wrapper hands out are the interposer's own and carry the
 * plugin's handle; everything else (requests, streams, buffers) passes
 * through untouched, so bounded waits and abort work as they do without it.
 *
 *     dt_interpose_comm_t *ic;
 *     dt_interpose_hooks_t hooks = {.ctx = &mine, .before = trace_call};
 *     if (dt_interpose_comm_create(shm_ops, &hooks, &ic) != DT_OK) ...
 *     const dt_comm_ops_t *C = dt_interpose_comm_ops(ic); // use it as shm's
 *     C->init(host, &args, &comm);     // comm: the interposer's handle
 *     ...                               // every call goes through the hooks
 *     C->finalize(comm);
 *     dt_interpose_comm_destroy(ic);    // after every handle is finalized
 *
 * The device's works the same way (dt_interpose_device_create, _ops,
 * _destroy); its runtime table's `kernels` hands out the interposer's
 * kernel table, so kernels go through the hooks too.
 *
 * Interposers stack: the table of one may be wrapped by another.
 *
 * The wrapper table mirrors the plugin's: its info block is the plugin's
 * (same name, so messages and checks read the same), a slot is present
 * exactly when the plugin's is (DT_HAS_OP answers the same, so an older
 * plugin's smaller table gives a wrapper without `test` or `cleanup_job`),
 * and slots of a newer plugin this build does not know are left out
 * (info.struct_size is clamped to this build's struct).
 *
 * ---- How a kind plugs in (comm and device so far) ----
 * A kind is one file, interpose_<kind>.c, and nothing here changes:
 *  - its slot enum and names in this header (DT_INTERPOSE_<KIND>_SLOTS,
 *    names only; the .c proves at compile time that the enum follows the
 *    ops struct field by field and covers it, so a slot appended to the
 *    ABI fails the build until it is listed here and wrapped there);
 *  - each slot's signature written once, in an X-macro list in the .c,
 *    from which the pass-through functions (before, clock, plugin call,
 *    after) and the table (present iff the plugin's slot is) are
 *    generated; slots that create or destroy handles are written out;
 *  - a call record extending dt_interpose_call_t (base first) with the
 *    kind's arguments;
 *  - the wrapped handle: the interposer's own struct carrying the inner
 *    table and handle;
 *  - slots without an instance (comm init, cleanup_job; device init,
 *    kernels, attention_state_bytes) reach their interposer through a
 *    small pool of trampolines, since a C function pointer carries no
 *    closure.
 * A kind whose plugin hands out a second, separately sized table (the
 * device: a runtime table whose `kernels` slot returns the kernel table)
 * has one slot list per table, each clamped to its own struct_size and
 * numbered in one enum (the second list's slots after the first's), so
 * call->slot names one slot of the kind.  interpose_device.c is that
 * case: its wrapped dt_device_t carries the plugin's handle, its kernel
 * table is built once at create from the plugin's, and streams, events
 * and device pointers pass through like comm requests.  The hooks, the
 * call base, the per-slot call counts and the callbacks written against
 * them (a tracer, the profiler below, a countdown fault injector) work for
 * every kind unchanged (the profiler also sums the FLOPs a device call's
 * record carries): `dtrain run --profile device` is the profiler over the
 * device interposer, for every device plugin at once (core/cli/
 * run_profile.c); it replaced the cpu plugin's own profiler.
 * `dtrain run --strict-device` gives one set of hooks (the strict device
 * checks below) to both interposers of a rank: the device's calls feed
 * the allocation table the comm's calls are checked against
 * (core/cli/run_strict.c).  And every `dtrain run` gives its comm
 * plugin's innermost interposer the collective ledger's hooks (below;
 * core/cli/run_ledger.c), which record each call the plugin gets so the
 * ranks can name the first call where they differ when a collective fails.
 *
 * Thread safety: the interposer adds none of its own constraints.  Hooks
 * are called on the caller's thread, concurrently when the plugin's calls
 * are (different comm groups on different threads; comm abort from any
 * thread, any time): they must be safe for that.
 */
#ifndef DT_CORE_INTERPOSE_H
#define DT_CORE_INTERPOSE_H

#include <stdint.h>
#include <stdio.h>

#include "dtrain/dtrain.h"

/* What a call is (dt_interpose_call_t.flags). */
#define DT_ICALL_COLLECTIVE 0x1u /* every rank of the group calls it */
#define DT_ICALL_P2P 0x2u        /* point to point */
#define DT_ICALL_START 0x4u      /* starts an operation (hands out a request) */
#define DT_ICALL_WAIT 0x8u       /* completes or polls a started operation
                                  * (device: waits for a stream, an event,
                                  * the whole device) */
#define DT_ICALL_KERNEL 0x10u    /* a slot of the device's kernel table */
#define DT_ICALL_ENQUEUE 0x20u   /* puts work on a stream and may return
                                  * before it runs (device kernels, copies,
                                  * memset) */

/* One call through an interposer, as the hooks see it.  A kind's record
 * extends it (base first): for kind DT_KIND_COMM the hook may cast it to
 * const dt_interpose_comm_call_t *.  Valid during the hook only. */
typedef struct dt_interpose_call {
    uint32_t kind;    /* dt_plugin_kind_t */
    uint32_t slot;    /* the kind's slot (dt_interpose_comm_slot_t,
                       * dt_interpose_device_slot_t) */
    const char *name; /* the slot's field name: "all_reduce" */
    uint32_t flags;   /* DT_ICALL_* */
    int32_t rank;     /* world rank of the instance (init's rank; -1
                       * before init has read it, and for slots without an
                       * instance) */
    uint64_t seq;     /* 1 for the first call of this slot through this
                       * interposer (every instance, every thread), 2, ... */
    uint64_t bytes;   /* comm: payload, count x element size, count as
                       * the slot defines it (all_gather: elements each
                       * rank sends; reduce_scatter: each rank receives;
                       * sendrecv: both halves');
                       * device: the memory the call reads and writes
                       * (dt_interpose_device_call_t); 0 none */
    const char *op;   /* the operation the call's time belongs to: `name`,
                       * except for a wait or test, which belongs to the
                       * slot that started its request ("all_reduce"; the
                       * slot's own name when that is unknown) */
} dt_interpose_call_t;

/* The user's callbacks.  Either may be NULL. */
typedef struct dt_interpose_hooks {
    void *ctx; /* passed back to both */
    /* Before the plugin's slot.  DT_OK: call it.  Any other status: the
     * plugin is NOT called and the status is what the caller gets (inject
     * a failure; set its message through the kind's record, e.g. the comm
     * record's host->set_error).  Exceptions, where skipping the plugin
     * would break the contract: a `finalize` and the device's `kernels`
     * are always called (the status is ignored: neither can fail), and a
     * comm `wait` is always called (it frees the request whatever the
     * outcome) and the injected status replaces its result.  A start slot
     * that fails hands out no request. */
    int (*before)(void *ctx, const dt_interpose_call_t *call);
    /* After the slot: `status` is what the caller gets, `elapsed_ns` the
     * plugin's time (0 when the failure was injected). */
    void (*after)(void *ctx, const dt_interpose_call_t *call, int status, uint64_t elapsed_ns);
    /* Nonzero: the hooks have no use for the time, so the interposer reads
     * no clock around the plugin's call (two reads fewer per call: the
     * ledger, which is always on) and `after` gets elapsed_ns 0. */
    int untimed;
} dt_interpose_hooks_t;

/* Monotonic clock the interposers time calls with, nanoseconds. */
uint64_t dt_interpose_now_ns(void);

/* ---- a profiler: hooks for any kind's interposer ---------------------- */

/* Per operation (call->op): calls of its own slot, the bytes they moved,
 * the FLOPs they did (device kernels: dt_interpose_device_call_t.flops),
 * the time the plugin spent in them AND in the waits/tests that complete
 * them, those waits, and the calls that failed.  Thread safe. */
typedef struct dt_interpose_profile dt_interpose_profile_t;

/* NULL when out of memory (message set). */
dt_interpose_profile_t *dt_interpose_profile_create(void);
/* Hooks that record into `p` (an `after` only: nothing is injected). */
dt_interpose_hooks_t dt_interpose_profile_hooks(dt_interpose_profile_t *p);
/* Count passes: a pass begins at each call of operation `op` (a static
 * string, or alternatives "a|b", of which the first one called is taken
 * from then on; the device's "embedding_forward" (GPT-2) or
 * "vocab_embedding_forward" (llama, tensor-parallel models) is the first
 * kernel of every forward pass of the built-in models, so a pass is a
 * training step when a step has one micro-batch and no evaluation).  Nothing is recorded
 * until pass skip + 1 begins; from then on, once a later pass has begun,
 * the totals dt_interpose_profile_print_passes reports cover whole passes
 * only (from the start of pass skip + 1 to the start of the latest pass),
 * so the last pass and what follows it (a checkpoint, teardown) are left
 * out.  Call before the hooks record anything. */
void dt_interpose_profile_passes(dt_interpose_profile_t *p, const char *op, uint64_t skip);
/* `title`, then one line per operation in order of first use:
 *   "  all_reduce            40       20480      12.345     20      0"
 * (op, calls, bytes, time in ms, waits, errors) under a header line:
 * everything recorded. */
void dt_interpose_profile_print(dt_interpose_profile_t *p, FILE *f, const char *title);
/* Over the passes of dt_interpose_profile_passes: `title` and the window
 *   "device profile (rank 0, cpu): passes 2..4 of 5 (3 whole; a pass
 *    begins at each embedding_forward): 1080.71 ms per pass, in calls
 *    1080.24 ms (100.0%)"
 * then one line per operation, most time first:
 *   "  matmul_forward  147  948.57  316.19  29.3  6452.9  200.00  3.21  0"
 * (op, calls, total ms, ms per pass, % of the pass's wall time, us per
 * call, GFLOP/s, GB/s ("-" when the calls did no FLOPs or moved no
 * bytes), errors) under a header line.  With one pass begun the window
 * runs from its start to now ("per pass" is that one); with none past
 * the skipped ones it says so and prints no table. */
void dt_interpose_profile_print_passes(dt_interpose_profile_t *p, FILE *f, const char *title);
void dt_interpose_profile_free(dt_interpose_profile_t *p);

/* ---- strict device checks: hooks for the device and comm interposers --- */

/* Holds every comm call of a process to what a device communicator (nccl
 * on a GPU) accepts (comm.h, "Memory"), so a run on the cpu device fails
 * where it would on a GPU (interpose_strict.c says what is tracked and
 * checked).  Give the same hooks to the process's device interposer,
 * whose allocations they track, and to its comm interposer, whose calls
 * they check and refuse (DT_ERR_INVALID; DT_ERR_UNSUPPORTED for a dtype
 * nccl cannot carry in the call, and for sym_alloc) with "strict device:
 * <call>: <what is wrong>".  Thread safe. */
typedef struct dt_interpose_strict dt_interpose_strict_t;

/* NULL when out of memory (message set). */
dt_interpose_strict_t *dt_interpose_strict_create(void);
dt_interpose_hooks_t dt_interpose_strict_hooks(dt_interpose_strict_t *s);
/* `title`, then what was checked, on one line:
 *   "strict device (rank 0): 120 comm calls checked: 200 buffers in device
 *    memory, 30 control messages in host memory (at most 64 bytes); 0
 *    refused" */
void dt_interpose_strict_print(dt_interpose_strict_t *s, FILE *f, const char *title);
void dt_interpose_strict_free(dt_interpose_strict_t *s);

/* ---- the collective ledger: hooks for the comm interposer -------------- */

/* Record every collective and point-to-point call of a process's
 * communicator into `ledger` (core/interpose/ledger.h): the groups init
 * and split make, each call with its group's number, and the first
 * failure of a call that moves data or waits for it.  Injects nothing
 * (but see DTRAIN_FAULT_DIVERGE in interpose_ledger.c, test builds only).
 * `dtrain run` gives these hooks to the innermost comm interposer of every
 * run (core/cli/run_ledger.c). */
struct dt_ledger;
dt_interpose_hooks_t dt_interpose_ledger_hooks(struct dt_ledger *ledger);

/* ------------------------------------------------------------------ comm */

/* The comm table's slots in field order, as X(ENUM, field, DT_ICALL_*). */
#define DT_INTERPOSE_COMM_SLOTS(X)                                             \
    X(INIT, init, 0)                                                           \
    X(FINALIZE, finalize, 0)                                                   \
    X(RANK_SIZE, rank_size, 0)                                                 \
    X(ALL_REDUCE, all_reduce, DT_ICALL_COLLECTIVE | DT_ICALL_START)            \
    X(REDUCE_SCATTER, reduce_scatter, DT_ICALL_COLLECTIVE | DT_ICALL_START)    \
    X(ALL_GATHER, all_gather, DT_ICALL_COLLECTIVE | DT_ICALL_START)            \
    X(BROADCAST, broadcast, DT_ICALL_COLLECTIVE | DT_ICALL_START)              \
    X(REDUCE, reduce, DT_ICALL_COLLECTIVE | DT_ICALL_START)                    \
    X(SEND, send, DT_ICALL_P2P | DT_ICALL_START)                               \
    X(RECV, recv, DT_ICALL_P2P | DT_ICALL_START)                               \
    X(BARRIER, barrier, DT_ICALL_COLLECTIVE | DT_ICALL_START)                  \
    X(WAIT, wait, DT_ICALL_WAIT)                                               \
    X(SPLIT, split, DT_ICALL_COLLECTIVE)                                       \
    X(ABORT, abort, 0)                                                         \
    X(TEST, test, DT_ICALL_WAIT)                                               \
    X(CLEANUP_JOB, cleanup_job, 0)                                             \
    X(SYM_ALLOC, sym_alloc, DT_ICALL_COLLECTIVE)                               \
    X(SYM_FREE, sym_free, 0)                                                   \
    X(SENDRECV, sendrecv, DT_ICALL_P2P | DT_ICALL_START)

#define DT_INTERPOSE_ENUM_(up, field, flags) DT_ICOMM_##up,
typedef enum dt_interpose_comm_slot {
    DT_INTERPOSE_COMM_SLOTS(DT_INTERPOSE_ENUM_) DT_ICOMM_SLOT_COUNT
} dt_interpose_comm_slot_t;
#undef DT_INTERPOSE_ENUM_

/* A comm call as the hooks see it (base first).  Fields a slot does not
 * have are 0, or -1 for ranks. */
typedef struct dt_interpose_comm_call {
    dt_interpose_call_t base;
    const dt_comm_ops_t *ops; /* the plugin's table: a hook may call the
                               * plugin directly (abort, rank_size) */
    dt_comm_t *comm;          /* the plugin's handle of this group; NULL for
                               * init (before) and cleanup_job */
    const dt_host_t *host;    /* the plugin's host table (init's), for
                               * messages: "comm/shm: ..." */
    int32_t group_rank, group_size; /* in this group; -1 unknown (init) */
    uint64_t count;           /* elements, as the slot's count argument
                               * (sendrecv: its send's) */
    int32_t dtype, reduce_op; /* dt_dtype_t, dt_reduce_op_t; -1 none */
    int32_t peer, tag;        /* root (broadcast, reduce) or peer (send,
                               * recv; sendrecv: its send's); -1 none */
    const void *send;         /* the buffer the call reads (send's buf;
                               * broadcast: buf, also `recv`); NULL none */
    void *recv;               /* the buffer it writes (recv's buf) */
    uint64_t recv_count;      /* sendrecv: its recv's count, peer and tag */
    int32_t recv_peer, recv_tag;
    int32_t color, key;       /* split */
    int64_t timeout_ms;       /* wait */
    dt_comm_req_t *req;       /* wait/test: the request; start slots, in
                               * `after`: the one handed out (NULL when
                               * blocking or failed; sendrecv: its send's) */
    dt_comm_req_t *recv_req;  /* sendrecv, in `after`: its recv's request */
    int32_t req_slot;         /* wait/test: the slot that started req, -1
                               * unknown */
    const char *text;         /* abort: the reason; init, cleanup_job: the
                               * job id */
    dt_comm_t *new_comm;      /* init, split, in `after`: the plugin's
                               * handle of the group made (NULL: none) */
} dt_interpose_comm_call_t;

typedef struct dt_interpose_comm dt_interpose_comm_t;

/* An interposer over `inner` (a comm table of ABI major 1, as the loader
 * accepted it) calling `hooks` (copied).  DT_ERR_INVALID for a table of
 * another kind or major; DT_ERR_UNSUPPORTED when DT_INTERPOSE_COMM_MAX
 * interposers are alive.  The message is set. */
#define DT_INTERPOSE_COMM_MAX 8
int dt_interpose_comm_create(const dt_comm_ops_t *inner, const dt_interpose_hooks_t *hooks,
                             dt_interpose_comm_t **out);
/* Its table: valid until dt_interpose_comm_destroy. */
const dt_comm_ops_t *dt_interpose_comm_ops(const dt_interpose_comm_t *ic);
/* Free it.  Every handle its table handed out must be finalized first. */
void dt_interpose_comm_destroy(dt_interpose_comm_t *ic);

/* ---------------------------------------------------------------- device */

/* The runtime table's slots in field order (dt_device_ops_t), as
 * X(ENUM, field, DT_ICALL_*). */
#define DT_INTERPOSE_DEVICE_SLOTS(X)                                           \
    X(INIT, init, 0)                                                           \
    X(FINALIZE, finalize, 0)                                                   \
    X(PROPS, props, 0)                                                         \
    X(KERNELS, kernels, 0)                                                     \
    X(ALLOC, alloc, 0)                                                         \
    X(FREE, free, 0)                                                           \
    X(MEM_STATS, mem_stats, 0)                                                 \
    X(MEM_RESET_PEAKS, mem_reset_peaks, 0)                                     \
    X(HOST_ALLOC, host_alloc, 0)                                               \
    X(HOST_FREE, host_free, 0)                                                 \
    X(STREAM_CREATE, stream_create, 0)                                         \
    X(STREAM_DESTROY, stream_destroy, 0)                                       \
    X(STREAM_SYNC, stream_sync, DT_ICALL_WAIT)                                 \
    X(EVENT_CREATE, event_create, 0)                                           \
    X(EVENT_DESTROY, event_destroy, 0)                                         \
    X(EVENT_RECORD, event_record, 0)                                           \
    X(STREAM_WAIT_EVENT, stream_wait_event, 0)                                 \
    X(EVENT_SYNC, event_sync, DT_ICALL_WAIT)                                   \
    X(SYNCHRONIZE, synchronize, DT_ICALL_WAIT)                                 \
    X(MEMCPY_ASYNC, memcpy_async, DT_ICALL_ENQUEUE)                            \
    X(MEMSET_ASYNC, memset_async, DT_ICALL_ENQUEUE)                            \
    X(NATIVE_STREAM, native_stream, 0)

/* The kernel table's slots in field order (dt_kernels_t). */
#define DT_IKERN_FLAGS_ (DT_ICALL_KERNEL | DT_ICALL_ENQUEUE)
#define DT_INTERPOSE_KERNEL_SLOTS(X)                                           \
    X(MATMUL_FORWARD, matmul_forward, DT_IKERN_FLAGS_)                         \
    X(MATMUL_BACKWARD, matmul_backward, DT_IKERN_FLAGS_)                       \
    X(EMBEDDING_FORWARD, embedding_forward, DT_IKERN_FLAGS_)                   \
    X(EMBEDDING_BACKWARD, embedding_backward, DT_IKERN_FLAGS_)                 \
    X(GELU_FORWARD, gelu_forward, DT_IKERN_FLAGS_)                             \
    X(GELU_BACKWARD, gelu_backward, DT_IKERN_FLAGS_)                           \
    X(SOFTMAX_XENT_FORWARD, softmax_xent_forward, DT_IKERN_FLAGS_)             \
    X(SOFTMAX_XENT_BACKWARD, softmax_xent_backward, DT_IKERN_FLAGS_)           \
    X(AXPY, axpy, DT_IKERN_FLAGS_)                                             \
    X(SUMSQ, sumsq, DT_IKERN_FLAGS_)                                           \
    X(CAST, cast, DT_IKERN_FLAGS_)                                             \
    X(LAYERNORM_FORWARD, layernorm_forward, DT_IKERN_FLAGS_)                   \
    X(LAYERNORM_BACKWARD, layernorm_backward, DT_IKERN_FLAGS_)                 \
    X(ATTENTION_STATE_BYTES, attention_state_bytes, DT_ICALL_KERNEL)           \
    X(ATTENTION_FORWARD, attention_forward, DT_IKERN_FLAGS_)                   \
    X(ATTENTION_BACKWARD, attention_backward, DT_IKERN_FLAGS_)                 \
    X(RESIDUAL_FORWARD, residual_forward, DT_IKERN_FLAGS_)                     \
    X(SCALE, scale, DT_IKERN_FLAGS_)                                           \
    X(ADAMW_UPDATE, adamw_update, DT_IKERN_FLAGS_)                             \
    X(SGD_UPDATE, sgd_update, DT_IKERN_FLAGS_)                                 \
    X(VOCAB_EMBEDDING_FORWARD, vocab_embedding_forward, DT_IKERN_FLAGS_)       \
    X(VOCAB_EMBEDDING_BACKWARD, vocab_embedding_backward, DT_IKERN_FLAGS_)     \
    X(VOCAB_XENT_FORWARD, vocab_xent_forward, DT_IKERN_FLAGS_)                 \
    X(VOCAB_XENT_BACKWARD, vocab_xent_backward, DT_IKERN_FLAGS_)             \
    X(RMSNORM_FORWARD, rmsnorm_forward, DT_IKERN_FLAGS_)                       \
    X(RMSNORM_BACKWARD, rmsnorm_backward, DT_IKERN_FLAGS_)                     \
    X(ROPE_FORWARD, rope_forward, DT_IKERN_FLAGS_)                             \
    X(ROPE_BACKWARD, rope_backward, DT_IKERN_FLAGS_)                           \
    X(SWIGLU_FORWARD, swiglu_forward, DT_IKERN_FLAGS_)                         \
    X(SWIGLU_BACKWARD, swiglu_backward, DT_IKERN_FLAGS_)                       \
    X(GQA_ATTENTION_FORWARD, gqa_attention_forward, DT_IKERN_FLAGS_)           \
    X(GQA_ATTENTION_BACKWARD, gqa_attention_backward, DT_IKERN_FLAGS_)

/* One enum for both tables: the runtime's slots (DT_IDEV_*), then the
 * kernel table's (DT_IKERN_*), so call->slot names one slot of the kind;
 * a kernel's position in its table is DT_IKERN_x - DT_IKERN_FIRST. */
#define DT_INTERPOSE_ENUM_(up, field, flags) DT_IDEV_##up,
#define DT_INTERPOSE_KENUM_(up, field, flags) DT_IKERN_##up,
typedef enum dt_interpose_device_slot {
    DT_INTERPOSE_DEVICE_SLOTS(DT_INTERPOSE_ENUM_) DT_IDEV_RUNTIME_COUNT,
    DT_IKERN_FIRST = DT_IDEV_RUNTIME_COUNT,
    DT_IKERN_BEFORE_FIRST_ = DT_IKERN_FIRST - 1,
    DT_INTERPOSE_KERNEL_SLOTS(DT_INTERPOSE_KENUM_) DT_IDEV_SLOT_COUNT
} dt_interpose_device_slot_t;
#undef DT_INTERPOSE_ENUM_
#undef DT_INTERPOSE_KENUM_
#define DT_IKERN_COUNT (DT_IDEV_SLOT_COUNT - DT_IKERN_FIRST)

/* A device call as the hooks see it (base first).  Fields a slot does not
 * have are 0 (NULL), or -1 for the ints.  Streams, events and pointers are
 * the plugin's own: they pass through the interposer untouched.
 *
 * What a kernel costs, from its arguments (the one place dtrain knows it;
 * a = the size of an element of `dtype`, w of `wdtype`, g of grad_dtype):
 *   flops: the multiply-adds of the matrix products a kernel does, 2 FLOPs
 *     each; a kernel without one (elementwise, norms, embedding, the
 *     optimizers) counts 0 and is measured by its bytes.
 *       matmul_forward      2 N C OC
 *       matmul_backward     2 N C OC per product asked (dinp, dweight)
 *       attention_forward   2 B C T (T+1): Q K^T over the causal half (T
 *                           (T+1)/2 dot products of C/NH per head) and the
 *                           same for P V
 *       attention_backward  4 B C T (T+1): dP, dV, dQ, dK
 *       gqa_attention_*     as attention_* with C = NH HD
 *   base.bytes: every buffer read once and written once, gradients that
 *     are accumulated (+=) read and written, f32 statistics and indices
 *     counted, e.g.
 *       matmul_forward      a (N C + N OC) + w OC C [+ a OC bias]
 *       matmul_backward     a N OC [+ 2a N C + w OC C for dinp]
 *                           [+ a N C + 8 OC C for dweight] [+ 8 OC dbias]
 *       attention_forward   4a B T C + state
 *       attention_backward  11a B T C + state
 *     where state is the plugin's attention_state_bytes for the shape;
 *     adamw_update n (24 + g); memcpy_async and memset_async their `bytes`
 *     (the copy's size, as copy bandwidths are quoted); the other runtime
 *     slots 0. */
typedef struct dt_interpose_device_call {
    dt_interpose_call_t base;
    const dt_device_ops_t *ops;   /* the plugin's runtime table: a hook may
                                   * call it (stream_sync, mem_stats) */
    const dt_kernels_t *kernels;  /* the plugin's kernel table */
    dt_device_t *dev;             /* the plugin's handle; NULL for init
                                   * (before), kernels and
                                   * attention_state_bytes */
    const dt_host_t *host;        /* the host init was given, for messages:
                                   * "device/cpu: ..."; NULL for kernels and
                                   * attention_state_bytes */
    dt_stream_t *stream;          /* the stream the call enqueues on, waits
                                   * for or (stream_create, in `after`)
                                   * created; NULL: the default or none */
    dt_event_t *event;            /* event slots (event_create: in `after`) */
    void *ptr;                    /* free, host_free: the pointer;
                                   * memcpy_async, memset_async: dst;
                                   * alloc, host_alloc, native_stream: in
                                   * `after`, what the plugin handed out */
    uint64_t size;                /* alloc, host_alloc: bytes asked;
                                   * memcpy_async, memset_async: bytes */
    int32_t tag;                  /* alloc, host_alloc: dt_mem_tag_t */
    int32_t copy_kind;            /* memcpy_async: dt_copy_kind_t */
    int32_t dtype;                /* kernels: `dtype`, cast's dst_dtype,
                                   * the optimizers' grad_dtype */
    int32_t dtype2;               /* matmul: wdtype; cast: src_dtype */
    uint32_t n_dims;              /* kernels: the sizes they take, in their
                                   * argument order (matmul N, C, OC;
                                   * attention B, T, C, NH; embedding B, T,
                                   * C; softmax_xent N, V; layernorm N, C;
                                   * rmsnorm N, C; rope B, T, NH, HD;
                                   * swiglu N, H; gqa_attention B, T, NH,
                                   * NKV; the others n) */
    int64_t dims[4];
    uint64_t flops;               /* kernels: FLOPs, as above */
} dt_interpose_device_call_t;

/* dt_interpose_device_create flags. */
/* Synchronize: each kernel, copy and memset (DT_ICALL_ENQUEUE) waits for
 * its stream before it is timed and again after it, inside the time, so
 * the time is the work's own.  A backend whose calls run before they
 * return (cpu) needs none of it; one that only enqueues (CUDA) is timed
 * for the enqueue alone without it (the work's time then shows up in
 * whatever waits for it: stream_sync, event_sync, synchronize, a
 * blocking copy). */
#define DT_INTERPOSE_DEVICE_SYNC 0x1u

typedef struct dt_interpose_device dt_interpose_device_t;

/* An interposer over `inner` (a device runtime table of ABI major 1, as
 * the loader accepted it, whose kernels() hands out a kernel table of
 * major 1) calling `hooks` (copied), with DT_INTERPOSE_DEVICE_* `flags`.
 * DT_ERR_INVALID for a table of another kind or major, or unknown flags;
 * DT_ERR_UNSUPPORTED when DT_INTERPOSE_DEVICE_MAX interposers are alive.
 * The message is set. */
#define DT_INTERPOSE_DEVICE_MAX 8
int dt_interpose_device_create(const dt_device_ops_t *inner, const dt_interpose_hooks_t *hooks,
                               uint32_t flags, dt_interpose_device_t **out);
/* Its runtime table (whose kernels() hands out its kernel table): valid
 * until dt_interpose_device_destroy. */
const dt_device_ops_t *dt_interpose_device_ops(const dt_interpose_device_t *id);
/* Free it.  Every instance its table handed out must be finalized first. */
void dt_interpose_device_destroy(dt_interpose_device_t *id);

#endif /* DT_CORE_INTERPOSE_H */
