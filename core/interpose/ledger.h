/*
 * core/interpose/ledger.h - the collective ledger: each rank keeps the
 * last DT_LEDGER_K communicator calls it issued, so that when a
 * collective fails (a timeout, a peer gone, ranks that disagree) the ranks
 * can compare what they issued and name the first call where they differ:
 *
 *   ledger: rank 1 issued broadcast(f32, 4.1K, root 0, world group) #7 at
 *   step 2, micro-batch 0 while ranks 0, 2 issued all_reduce(f32, 4.1K,
 *   sum, world group) #7 at step 2, micro-batch 0
 *
 * Recording (interpose_ledger.c, hooks over the comm interposer, on in
 * every `dtrain run`) is a store into a fixed ring: no allocation, no lock.
 * Each entry carries the group's own call number (every member numbers the
 * group's collectives 1, 2, ... alike, since they must issue them in the
 * same order), the operation and its arguments, and where the run was
 * (util/crash.h: step, micro-batch, unit).  A group is known by a key every
 * member derives alike without talking: 0 for the world group init made, a
 * hash of the parent's key, the split's number on the parent and the color
 * for a group split from it.
 *
 * Comparing (dt_ledger_compare) is pure: it takes the ranks' ledgers as
 * encoded (dt_ledger_encode; NULL for a rank that sent none) and writes
 * one line.  core/launch/ledger_exchange.h moves the encoded ledgers.
 *
 * Thread safety: dt_ledger_record may run on several threads at once (one
 * group per thread, as comm.h allows); the group table is written by the
 * calls that create and free groups (init, split, finalize), which comm.h
 * already serialises with the group's other calls.  Encoding while calls
 * are being recorded may catch an entry half written: the ledger is read
 * after a failure, when the calls have stopped.
 */
#ifndef DT_CORE_LEDGER_H
#define DT_CORE_LEDGER_H

#include <stddef.h>
#include <stdint.h>

/* Calls a rank keeps (a power of two). */
#define DT_LEDGER_K 64
/* Groups a rank names at once (the world, its splits); more are recorded
 * under an unknown group. */
#define DT_LEDGER_GROUPS 32
/* The world group's key. */
#define DT_LEDGER_WORLD 0u
/* The key of a call on a group the ledger does not know. */
#define DT_LEDGER_UNKNOWN 0xffffffffu
/* Bytes of the largest encoded ledger. */
#define DT_LEDGER_BLOB_MAX (16 + DT_LEDGER_GROUPS * 16 + DT_LEDGER_K * 48)

/* One call. */
typedef struct dt_ledger_entry {
    uint64_t seq;      /* the group's collective number (1, 2, ...); 0 for
                        * point-to-point calls, which are kept but not
                        * compared (a send on one rank is a recv on another) */
    uint64_t count;    /* elements, as the slot's count argument; sym_alloc:
                        * bytes */
    int64_t step;      /* util/crash.h's context when it was issued: 0 before
                        * the first step */
    int32_t micro, unit; /* -1: none */
    uint32_t group;    /* the group's key */
    int32_t peer;      /* root (broadcast, reduce) or peer (send, recv,
                        * sendrecv's send); -1 none */
    uint8_t slot;      /* dt_interpose_comm_slot_t */
    int8_t dtype;      /* dt_dtype_t; -1 none */
    int8_t reduce_op;  /* dt_reduce_op_t; -1 none */
    uint8_t pad_;
} dt_ledger_entry_t;

/* A group as this rank knows it. */
typedef struct dt_ledger_group {
    uint32_t key;
    int32_t rank, size; /* this rank in it; -1 unknown */
    uint32_t calls;     /* collectives issued on it so far (the last seq) */
} dt_ledger_group_t;

typedef struct dt_ledger dt_ledger_t;

/* NULL when out of memory (message set).  `rank` and `size` are the
 * world's (-1: learnt from the world group's init, dt_ledger_group_add). */
dt_ledger_t *dt_ledger_create(int32_t rank, int32_t size);
void dt_ledger_free(dt_ledger_t *l);

/* Groups, by the plugin's handle (an opaque pointer here).  add: a new
 * group `handle` with `key` (DT_LEDGER_WORLD for init's; the world rank
 * and size are taken from it); split_key: the key of the `split_no`th
 * split (1, 2, ...) of group `parent` with `color`; split_count: the next
 * split's number on `handle` (0: unknown group); remove: the handle is
 * finalized (its calls stay in the ring). */
void dt_ledger_group_add(dt_ledger_t *l, const void *handle, uint32_t key, int32_t rank,
                         int32_t size);
uint32_t dt_ledger_split_key(uint32_t parent, uint32_t split_no, int32_t color);
uint32_t dt_ledger_split_count(dt_ledger_t *l, const void *handle, uint32_t *parent_key);
void dt_ledger_group_remove(dt_ledger_t *l, const void *handle);
/* The world group's handle; NULL before init and after its finalize. */
const void *dt_ledger_world(const dt_ledger_t *l);

/* Record a call on group `handle`: e->group and e->seq are filled here
 * (seq only when `collective`), e->step, micro, unit from util/crash.h. */
void dt_ledger_record(dt_ledger_t *l, const void *handle, int collective, dt_ledger_entry_t *e);

/* The first failed communicator call's status (DT_OK: none yet), and
 * noting one (the first stays); whether the world group's init succeeded
 * (the ledger has a job to compare with). */
int dt_ledger_failed(const dt_ledger_t *l);
int dt_ledger_joined(const dt_ledger_t *l);
void dt_ledger_note_failure(dt_ledger_t *l, int status);
int32_t dt_ledger_rank(const dt_ledger_t *l);
int32_t dt_ledger_size(const dt_ledger_t *l);

/* The ledger as bytes (little-endian, at most DT_LEDGER_BLOB_MAX): the
 * world rank and size, the first failure, the groups, the kept calls
 * oldest first.  Returns
 * the bytes written. */
size_t dt_ledger_encode(const dt_ledger_t *l, uint8_t *out, size_t cap);

/* ---- comparing ---- */

/* One rank's ledger, decoded. */
typedef struct dt_ledger_view {
    int32_t rank, size;
    int32_t failed; /* its first failed communicator call's status; DT_OK */
    uint32_t n_groups, n_entries;
    dt_ledger_group_t groups[DT_LEDGER_GROUPS];
    dt_ledger_entry_t entries[DT_LEDGER_K]; /* oldest first */
} dt_ledger_view_t;

/* Decode; DT_OK or DT_ERR_INVALID for malformed bytes. */
int dt_ledger_decode(const uint8_t *in, size_t bytes, dt_ledger_view_t *out);

/* dt_ledger_compare's outcome. */
#define DT_LEDGER_AGREE 0    /* no call differs among the ledgers present */
#define DT_LEDGER_DIVERGED 1 /* the line names the first call that differs */
#define DT_LEDGER_QUIET 2    /* agree, every rank reported, and none had a
                              * communicator call fail: the failure is not
                              * the communicator's, nothing to add */

/* Compare the ledgers of `n` ranks (views[r]: rank r's, NULL when it sent
 * none; `missing_why` says why, e.g. "sent no ledger within 30 s") and
 * write one line into out (no newline):
 *   diverged: "ledger: rank 3 issued all_gather(bf16, 1.2M, group of
 *     ranks 1, 3) #41 at step 41, unit 7 while rank 1 issued
 *     reduce_scatter(bf16, 600K, sum, group of ranks 1, 3) #41 at step
 *     41, unit 7"
 *   agree: "ledger: ranks 0-3 issued the same calls (the last, #41 on the
 *     world group: all_reduce(f32, 4.1K, sum, world group) at step 5)"
 * either followed by "; rank 2 <missing_why>" for the ranks absent.
 * Within a group, calls are compared from the first number every member
 * still keeps; a member whose group has fewer calls "issued nothing after
 * #N" - named only when every member of the group sent its ledger (with
 * one gone, the group broke under the others wherever each was, and
 * only different calls at one number are a divergence).  Of several divergences the one at the earliest step is named (a
 * mismatch before a missing call, then the wider group's).  Returns DT_LEDGER_DIVERGED,
 * DT_LEDGER_AGREE, or DT_LEDGER_QUIET (the agree line written all the
 * same). */
int dt_ledger_compare(const dt_ledger_view_t *const *views, int n, const char *missing_why,
                      char *out, size_t cap);

/* How a call reads in those lines, into buf:
 * "all_reduce(f32, 4.1K, sum, world group)".  `names` may be NULL (the
 * group is then "group <key>"). */
void dt_ledger_call_text(const dt_ledger_entry_t *e, const char *group_name, char *buf,
                         size_t cap);

#endif /* DT_CORE_LEDGER_H */
