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
 * Interposers stack: the table of one may be wrapped by another.
 *
 * The wrapper table mirrors the plugin's: its info block is the plugin's
 * (same name, so messages and checks read the same), a slot is present
 * exactly when the plugin's is (DT_HAS_OP answers the same, so an older
 * plugin's smaller table gives a wrapper without `test` or `cleanup_job`),
 * and slots of a newer plugin this build does not know are left out
 * (info.struct_size is clamped to this build's struct).
 *
 * ---- How a kind plugs in (the comm is the first; the device next) ----
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
 *  - slots without an instance (comm init, cleanup_job; device init)
 *    reach their interposer through a small pool of trampolines, since a
 *    C function pointer carries no closure.
 * The device (being redesigned as a runtime table plus a separately sized
 * kernel table) gets interpose_device.c with TWO slot lists, one per
 * table, each clamped to its own struct_size: a wrapped dt_device_t
 * carries the inner runtime handle and the inner kernel table; streams,
 * events and device pointers pass through like comm requests.  The hooks,
 * the call base, the per-slot call counts and the callbacks written
 * against them (a tracer, a profiler keyed by call->op, a countdown fault
 * injector) work for it unchanged; the cpu plugin's own profiler
 * (plugins/cpu/cpu_profile.c) is then replaced by the profiler over the
 * device interposer, for every device plugin at once.
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
#define DT_ICALL_WAIT 0x8u       /* completes or polls a started operation */

/* One call through an interposer, as the hooks see it.  A kind's record
 * extends it (base first): for kind DT_KIND_COMM the hook may cast it to
 * const dt_interpose_comm_call_t *.  Valid during the hook only. */
typedef struct dt_interpose_call {
    uint32_t kind;    /* dt_plugin_kind_t */
    uint32_t slot;    /* the kind's slot (dt_interpose_comm_slot_t) */
    const char *name; /* the slot's field name: "all_reduce" */
    uint32_t flags;   /* DT_ICALL_* */
    int32_t rank;     /* world rank of the instance (comm: init's rank; -1
                       * before init has read it) */
    uint64_t seq;     /* 1 for the first call of this slot through this
                       * interposer (every instance, every thread), 2, ... */
    uint64_t bytes;   /* payload: count x element size, count as the slot
                       * defines it (all_gather: elements each rank sends;
                       * reduce_scatter: each rank receives); 0 none */
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
     * would break the contract: a `finalize` is always called (the status
     * is ignored), and a comm `wait` is always called (it frees the
     * request whatever the outcome) and the injected status replaces its
     * result.  A start slot that fails hands out no request. */
    int (*before)(void *ctx, const dt_interpose_call_t *call);
    /* After the slot: `status` is what the caller gets, `elapsed_ns` the
     * plugin's time (0 when the failure was injected). */
    void (*after)(void *ctx, const dt_interpose_call_t *call, int status, uint64_t elapsed_ns);
} dt_interpose_hooks_t;

/* Monotonic clock the interposers time calls with, nanoseconds. */
uint64_t dt_interpose_now_ns(void);

/* ---- a profiler: hooks for any kind's interposer ---------------------- */

/* Per operation (call->op): calls of its own slot, the bytes they moved,
 * the time the plugin spent in them AND in the waits/tests that complete
 * them, those waits, and the calls that failed.  Thread safe. */
typedef struct dt_interpose_profile dt_interpose_profile_t;

/* NULL when out of memory (message set). */
dt_interpose_profile_t *dt_interpose_profile_create(void);
/* Hooks that record into `p` (an `after` only: nothing is injected). */
dt_interpose_hooks_t dt_interpose_profile_hooks(dt_interpose_profile_t *p);
/* `title`, then one line per operation in order of first use:
 *   "  all_reduce            40       20480      12.345     20      0"
 * (op, calls, bytes, time in ms, waits, errors) under a header line. */
void dt_interpose_profile_print(dt_interpose_profile_t *p, FILE *f, const char *title);
void dt_interpose_profile_free(dt_interpose_profile_t *p);

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
    X(CLEANUP_JOB, cleanup_job, 0)

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
    uint64_t count;           /* elements, as the slot's count argument */
    int32_t dtype, reduce_op; /* dt_dtype_t, dt_reduce_op_t; -1 none */
    int32_t peer, tag;        /* root (broadcast, reduce) or peer (send,
                               * recv); -1 none */
    int32_t color, key;       /* split */
    int64_t timeout_ms;       /* wait */
    dt_comm_req_t *req;       /* wait/test: the request; start slots, in
                               * `after`: the one handed out (NULL when
                               * blocking or failed) */
    int32_t req_slot;         /* wait/test: the slot that started req, -1
                               * unknown */
    const char *text;         /* abort: the reason; init, cleanup_job: the
                               * job id */
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

#endif /* DT_CORE_INTERPOSE_H */
