/*
 * plugins/shm/shm_internal.h - the shared-memory communicator's private
 * types: the layout of a group's POSIX shared-memory segment, the
 * process-local communicator and request structs, and the functions the
 * plugin's source files share.  Two concerns that need none of this have
 * their own headers, so nothing depends on the group lifecycle for them:
 * shm_msg.h (message texts, the failure record) and plugins/common/comm/reduce.h (the
 * arithmetic).
 *
 * One segment per group.  Every rank of the group maps it; nothing else
 * crosses between processes.  Layout (all offsets page aligned):
 *
 *   shm_hdr_t            configuration, attach counters, job failure record
 *   shm_rank_t[size]     per rank: pid, phase counter, doorbell, op records
 *   shm_chan_t[size^2]   point-to-point channel control, (src * size + dst)
 *   slots                per rank SHM_NBUF pipeline buffers of chunk bytes
 *   p2p data             per ordered pair SHM_P2P_NBUF buffers of p2p_chunk
 *
 * Synchronisation is by monotone 32-bit counters in shared memory: a rank
 * publishes progress by storing a larger value, peers compare with a signed
 * difference (so the counters may wrap).  Sleepers wait on their own rank's
 * doorbell word with FUTEX_WAIT (shared, not private: the word lives in a
 * mapping of several processes) and whoever changes a counter rings the
 * doorbells of ranks marked as sleeping.
 */
#ifndef DT_SHM_INTERNAL_H
#define DT_SHM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "dtrain/comm.h"
#include "common/comm/creq.h"
#include "shm_secret.h"

/* ------------------------------------------------------------------------
 * Segment names.
 *
 * Every segment of a job is named from the job id only:
 *     world group:        /dtrain-<job_id>
 *     split of a group:   <parent name>-g<split number>c<color>
 *                         e.g. /dtrain-j42-g1c0, /dtrain-j42-g1c0-g2c1
 *     a rank's symmetric memory:  <group name>-s<allocation>r<rank>
 *                         e.g. /dtrain-j42-s1r0 (shm_sym.c)
 * so the job's segments are exactly the names shm_is_job_segment accepts,
 * which is what cleanup_job removes after a crash (shm_cleanup.c).
 * Normally nothing is left: the first rank to see the whole group
 * attached unlinks the name (attach, then unlink), and the memory goes
 * away with the last mapping.
 *
 * A job id is 1..SHM_JOB_ID_MAX letters, digits, '.', '_' or '-': it is
 * part of a file name.  (A job id that itself ends like a split, "j4-g1c0",
 * names the same file as job "j4"'s first split: launchers derive ids that
 * do not, and two jobs of one user sharing a prefix that way would collide
 * at the rendezvous anyway.)
 * --------------------------------------------------------------------- */
#define SHM_DIR "/dev/shm" /* where glibc's shm_open puts POSIX segments */
#define SHM_NAME_MAX 240   /* below NAME_MAX (255) minus the "/dev/shm" part */
#define SHM_JOB_ID_MAX 96  /* longest job id accepted */

/* 1 when `s` is a valid job id (see above). */
static inline int shm_valid_job_id(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++) {
        char ch = s[n];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.'))
            return 0;
    }
    return n > 0 && n <= SHM_JOB_ID_MAX;
}

/* Write the world segment name for `job_id` into buf (cap bytes).
 * Returns the length, or -1 when it does not fit. */
static inline int shm_world_name(char *buf, size_t cap, const char *job_id)
{
    int n = snprintf(buf, cap, "/dtrain-%s", job_id);
    return (n < 0 || (size_t)n >= cap) ? -1 : n;
}

/* Write the name of split number `split_no` (1-based, counted per parent)
 * with `color` of the group named `parent`.  Returns the length, or -1. */
static inline int shm_split_name(char *buf, size_t cap, const char *parent,
                                 uint32_t split_no, int32_t color)
{
    int n = snprintf(buf, cap, "%s-g%uc%u", parent, split_no, (uint32_t)color);
    return (n < 0 || (size_t)n >= cap) ? -1 : n;
}

/* Write the name of symmetric allocation `no` of rank `rank` in the group
 * named `group`.  Returns the length, or -1. */
static inline int shm_sym_name(char *buf, size_t cap, const char *group, uint32_t no,
                               int32_t rank)
{
    int n = snprintf(buf, cap, "%s-s%ur%u", group, no, (uint32_t)rank);
    return (n < 0 || (size_t)n >= cap) ? -1 : n;
}

/* 1 when `file` (an entry of /dev/shm, no slash) is a name this plugin
 * gives a segment of job `job_id`: the world's "dtrain-<job_id>" or a
 * split's, that followed by one or more "-g<digits>c<digits>", either
 * of them followed by at most one "-s<digits>r<digits>" (symmetric
 * memory).  Another job whose id merely starts with ours ("j42" for
 * "j4", "j4-x") is not matched. */
static inline int shm_is_job_segment(const char *file, const char *job_id)
{
    size_t n = strlen(job_id);
    if (strncmp(file, "dtrain-", 7) != 0 || strncmp(file + 7, job_id, n) != 0)
        return 0;
    for (const char *p = file + 7 + n; *p;) {
        char a = p[1], b = a == 'g' ? 'c' : 'r';
        if (p[0] != '-' || (a != 'g' && a != 's') || !(p[2] >= '0' && p[2] <= '9'))
            return 0;
        for (p += 2; *p >= '0' && *p <= '9'; p++)
            ;
        if (p[0] != b || !(p[1] >= '0' && p[1] <= '9'))
            return 0;
        for (p++; *p >= '0' && *p <= '9'; p++)
            ;
        if (a == 's' && *p) /* symmetric memory ends the name */
            return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------------
 * Tunables that are not configuration keys.
 * --------------------------------------------------------------------- */
#define SHM_NBUF 4          /* pipeline buffers per rank slot (>= 3 needed) */
/* Reductions of cache-sized messages move SHM_MID_CHUNK-byte pieces per
 * round (see round_elems in shm_collectives.c); SHM_LLC_DEFAULT is the
 * last-level cache assumed where sysfs does not say. */
#define SHM_MID_CHUNK (256u << 10)
#define SHM_LLC_DEFAULT (32ull << 20)
#define SHM_P2P_NBUF 4      /* buffers per point-to-point channel */
#define SHM_LINE 128        /* false-sharing unit (adjacent-line prefetch) */
#define SHM_SLICE_NS 10000000ull   /* longest single futex sleep: 10 ms */
#define SHM_CHECK_NS 5000000ull    /* liveness/deadline checks: every 5 ms */
/* After waking a sleeping peer, spin at least this long in the next wait
 * (unless ranks outnumber cores): the woken peer needs tens of us (on a
 * VM up to ~100 us) to run again, and if we went to sleep meanwhile it
 * would have to wake us in turn, and so on: a convoy where every phase
 * costs a wake-up. */
#define SHM_WAKE_SPIN_NS 300000ull
/* Longest timeout honoured (~115 days): keeps ms -> ns products in range. */
#define SHM_TIMEOUT_MAX_MS 10000000000ll
#define SHM_VERSION 4u
#define SHM_MAGIC 0x31686d736e727464ull /* "dtrnshm1" little-endian */

/* Limits of the config keys (their key table, shm_comm.c, declares the
 * defaults). */
#define SHM_SLOT_MIN (16ll << 10)
#define SHM_SLOT_MAX (1ll << 30)
#define SHM_SPIN_MAX 1000000

/* Bounds of a segment's buffer sizes (shm_comm.c picks them, the
 * rendezvous checks a segment it did not create against them).  A
 * pipeline buffer holds at least one 64-byte piece per rank; both kinds
 * are whole multiples of SHM_CHUNK_ALIGN bytes. */
#define SHM_CHUNK_ALIGN 4096u
#define SHM_CHUNK_MAX ((uint64_t)SHM_SLOT_MAX / SHM_NBUF)
#define SHM_P2P_CHUNK_MIN (16u << 10)
#define SHM_P2P_CHUNK_MAX (256u << 10)
static inline uint64_t shm_chunk_min(int32_t size)
{
    uint64_t need = (uint64_t)(size > 0 ? size : 1) * 64;
    return (need + SHM_CHUNK_ALIGN - 1) / SHM_CHUNK_ALIGN * SHM_CHUNK_ALIGN;
}

/* ------------------------------------------------------------------------
 * Shared layout.
 * --------------------------------------------------------------------- */

/* Why the job failed (shm_fail_t.kind). */
enum { SHM_FAIL_NONE = 0, SHM_FAIL_ABORT = 1, SHM_FAIL_DEAD = 2,
       SHM_FAIL_LEFT = 3 };

/* The job's first failure, kept in the WORLD segment and read by every
 * group's waits: first writer wins (state 0 -> 1 -> 2). */
typedef struct shm_fail {
    _Atomic uint32_t state; /* 0 none, 1 being written, 2 published */
    int32_t kind;           /* SHM_FAIL_* */
    int32_t world_rank;     /* who failed / aborted */
    int32_t pid;
    char reason[384];
} shm_fail_t;

/* Whether a segment's creator was given a job secret (shm_hdr_t.secret). */
enum { SHM_SECRET_NONE = 0, SHM_SECRET_HMAC_SHA256 = 1 };

/* Written completely by the creator before the segment gets its name (see
 * shm_rendezvous.c): nobody ever sees a half-written one.  Everything up
 * to `tag` is fixed from then on; a joiner checks all of it against the
 * file before computing any pointer. */
typedef struct shm_hdr {
    _Atomic uint64_t magic;   /* SHM_MAGIC */
    uint32_t version;         /* SHM_VERSION: the layout of all the rest */
    _Atomic int32_t creator_pid;
    int32_t size;             /* ranks in the group */
    uint32_t nbuf, p2p_nbuf;
    uint32_t secret;          /* SHM_SECRET_* */
    /* the creator's start time (/proc/<pid>/stat field 22, clock ticks
     * since boot; 0 unknown): tells it from a later process with its pid */
    uint64_t creator_start;
    uint64_t chunk;           /* bytes of one pipeline buffer */
    uint64_t p2p_chunk;       /* bytes of one channel buffer */
    uint64_t total;           /* segment bytes */
    uint64_t off_ranks, off_chans, off_slots, off_p2p;
    /* SHM_SECRET_HMAC_SHA256: shm_secret_tag of the creator's key for this
     * segment's name and salt (shm_secret.h); zero otherwise */
    uint8_t salt[SHM_SALT_BYTES];
    uint8_t tag[SHM_SHA256_BYTES];
    _Alignas(SHM_LINE) _Atomic uint32_t attached; /* futex word */
    _Atomic uint32_t detached;
    _Atomic uint32_t unlinked; /* 1 once the name was removed */
    _Atomic uint32_t stale;    /* 1 once found abandoned (see rendezvous) */
    _Alignas(SHM_LINE) shm_fail_t fail; /* used in the world segment */
} shm_hdr_t;

/* What each rank says it is running, checked by peers at an op's first
 * round (catches ranks calling different collectives). */
typedef struct shm_desc {
    uint32_t kind;
    int32_t dtype;
    int32_t op;
    int32_t root;
    uint64_t count;
    uint64_t seq;
    uint32_t sym_no;  /* symmetric allocation of the buffer, 0: none */
    uint32_t reserved;
    uint64_t sym_off; /* byte offset of the buffer in it */
} shm_desc_t;

/* Slot state (shm_rank_t.state). */
enum { SHM_RANK_EMPTY = 0, SHM_RANK_JOINED = 1, SHM_RANK_LEFT = 2 };

#define SHM_CPU_WORDS 16 /* CPUs 0..1023 in a rank's affinity mask */

typedef struct shm_rank {
    /* written once by the owner at attach / finalize */
    _Atomic int32_t pid;
    int32_t world_rank;
    _Atomic uint32_t state;
    /* the CPUs this rank's threads may run on (bit c of word c / 64),
     * written before `attached` is incremented */
    uint64_t cpus[SHM_CPU_WORDS];
    /* phases this rank has posted: the owner stores, everyone reads */
    _Alignas(SHM_LINE) _Atomic uint32_t seq;
    /* this rank's progress thread sleeps on `bell`; others ring it */
    _Alignas(SHM_LINE) _Atomic uint32_t bell;
    _Atomic uint32_t sleeping;
    _Alignas(SHM_LINE) shm_desc_t desc[SHM_NBUF]; /* by round % SHM_NBUF */
} shm_rank_t;

/* One chunk's label in a point-to-point channel. */
typedef struct shm_chunk_hdr {
    int32_t tag;
    uint32_t len;        /* bytes in this chunk */
    uint64_t msg_bytes;  /* bytes of the whole message */
    uint64_t offset;     /* of this chunk in the message */
    uint64_t msg_no;     /* sender's send number (diagnostics) */
} shm_chunk_hdr_t;

/* Channel src -> dst: a ring of SHM_P2P_NBUF buffers. */
typedef struct shm_chan {
    _Atomic uint32_t posted;   /* chunks written by src */
    _Alignas(SHM_LINE) _Atomic uint32_t consumed; /* chunks read by dst */
    _Alignas(SHM_LINE) shm_chunk_hdr_t hdr[SHM_P2P_NBUF];
} shm_chan_t;

/* ------------------------------------------------------------------------
 * Process-local state.
 * --------------------------------------------------------------------- */

/* Shared by every group of the job in this process: the world mapping,
 * which holds the job's failure record.  Split groups keep it alive. */
typedef struct shm_job {
    _Atomic int refs;
    shm_hdr_t *world;     /* world segment header (failure record) */
    void *base;           /* world mapping */
    size_t bytes;
    int32_t world_rank;
    int32_t world_size;
    int oversubscribed;   /* more ranks than the CPUs they may run on together */
    int has_secret;       /* init was given a job secret ... */
    uint8_t secret_key[SHM_SHA256_BYTES]; /* ... reduced to this key */
    char job_id[SHM_JOB_ID_MAX + 1];
} shm_job_t;

/* Request states (a process-private futex word). */
enum { SHM_REQ_QUEUED = 0, SHM_REQ_DONE = 1 };

struct dt_comm_req {
    dt_creq_t b;                  /* the op, its number, `live` (qlock) */
    struct dt_comm_req *next;     /* queue link */
    struct dt_comm_req *p2p_next; /* active point-to-point list link */
    const void *send;
    void *recv;
    uint64_t id;                  /* enqueue order, for cancellation */
    /* point-to-point progress (progress thread only) */
    uint64_t done;                /* bytes moved */
    uint64_t last_ns;             /* last progress, for the stall timeout */
    int matched;                  /* recv: bound to a message in its channel */
    /* all_reduce in place on symmetric memory (looked up when started) */
    const struct shm_sym *sym;
    uint64_t sym_off;
    /* completion */
    _Atomic uint32_t state;
    _Atomic uint32_t waiters;
    _Atomic uint32_t released;    /* 1: the completer touches r no more */
    int status;
    char msg[640];
};

/* Opt-in counters (DTRAIN_SHM_STATS=1 in the environment), logged at
 * finalize: where a group's time goes, e.g. whether ranks spin or sleep
 * while they wait for each other, and how long callers wait for requests
 * (the communication a training step did not hide).  Off, the counting
 * sites cost one branch each. */
typedef struct shm_stats {
    int on;
    /* executor (holding exec) */
    uint64_t coll_ops, coll_inline, coll_bytes, coll_ns;
    uint64_t waits;          /* phase waits that were not satisfied at once */
    uint64_t wait_ns;        /* their time, spinning and sleeping */
    uint64_t sleeps, sleep_ns;
    /* callers: waits on requests that were not done yet */
    _Atomic uint64_t req_waits, req_wait_ns;
} shm_stats_t;

/* One symmetric allocation (shm_sym.c): every rank's copy, mapped here. */
typedef struct shm_sym {
    struct shm_sym *next;
    uint32_t no;            /* 1, 2, ... per group: the same on every rank */
    int tag;                /* the caller's dt_mem_tag_t */
    uint64_t bytes;         /* of each copy (whole pages) */
    uint64_t asked;         /* what the caller asked for (accounted) */
    unsigned char **base;   /* [size]: rank p's copy; base[rank] is ours */
} shm_sym_t;

typedef struct dt_comm dt_comm_t;

struct dt_comm {
    const dt_comm_ops_v1_t *ops; /* first: the table that made it (dtrain/comm.h) */
    const dt_host_v1_t *host;
    shm_job_t *job;
    char name[SHM_NAME_MAX + 16]; /* segment name, "/dtrain-..." */
    char gname[160];              /* "world", "world/g1c0" for messages */
    int32_t rank, size;
    int is_world;
    int64_t timeout_ms;
    uint64_t spin_ns;     /* wait spin budget; 0 when oversubscribed */
    /* The thread that initialised the group may run on one CPU only (bound
     * by mpirun, taskset, ...): then its waits for the progress thread
     * sleep at once, since that thread inherited the same CPU and a
     * spinning caller would only keep it off it. */
    int caller_one_cpu;
    /* Callers blocked in a wait on this group's requests.  The progress
     * thread spins in its phase waits only while one is (otherwise the
     * caller is computing and a spin would take its CPU). */
    _Atomic int callers_waiting;
    dt_device_t *dev;

    /* the mapping */
    void *base;
    size_t bytes;
    shm_hdr_t *hdr;
    shm_rank_t *ranks;
    shm_chan_t *chans;
    unsigned char *slots;
    unsigned char *p2p;
    uint64_t chunk, p2p_chunk;
    uint64_t mid_lo, mid_hi; /* message bytes that use SHM_MID_CHUNK rounds */
    int32_t *wranks;    /* world rank of each group rank */
    int32_t *pids;      /* pid of each group rank */
    int *pidfds;        /* -1 where pidfd_open is unavailable */
    const void **srcs;  /* (size) reduction sources, progress thread */

    /* progress thread and queue.  `exec` is held by whoever runs ops or
     * moves point-to-point data: the progress thread, or a caller running
     * a blocking collective inline while the thread has nothing to do
     * (saves two thread hand-offs, each a futex wake-up of ~30 us on a
     * VM).  Fields marked "executor" below need it. */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t exec;
    pthread_mutex_t qlock;
    _Atomic uint32_t idle_word;     /* private futex: local events */
    _Atomic uint32_t idle_sleeping; /* the thread sleeps on idle_word */
    struct dt_comm_req *qhead, *qtail;
    dt_creq_t *live;                /* every request not yet waited */
    _Atomic int stop;
    _Atomic uint64_t cancel_upto;   /* fail ops with id <= this */
    _Atomic int64_t cancel_ms;      /* the wait limit that expired */
    _Atomic uint64_t enqueued;      /* ops queued so far */
    _Atomic uint64_t taken;         /* ops the progress thread dequeued */
    uint64_t next_id;               /* caller side, under qlock */
    uint64_t coll_seq, p2p_seq;     /* caller side, under qlock */
    uint32_t split_no;              /* caller side */
    /* symmetric memory: allocations (caller side; the executor reads the
     * list, which changes only while no operation is in flight) */
    int sym_enabled;                /* [shm] symmetric */
    uint32_t sym_no;
    shm_sym_t *sym;

    /* executor state */
    uint32_t phase;                 /* phases this rank posted == its seq */
    uint64_t rang_ns;               /* when we last woke a sleeping peer */
    uint64_t round;                 /* rounds begun */
    _Atomic int broken;             /* set once; later ops fail at once */
    int broken_status;
    char broken_msg[640];
    struct dt_comm_req *p2p_head, *p2p_tail; /* active sends/recvs */
    _Atomic int p2p_active;         /* their number, readable without exec */
    struct dt_comm_req **cur_send;  /* per peer: the send owning the channel */
    struct dt_comm_req **cur_recv;  /* per peer: the recv bound to the head */
    uint64_t p2p_next_check;

    shm_stats_t stats;
};

/* ------------------------------------------------------------------------
 * Where a rank's buffers lie in the mapping.
 * --------------------------------------------------------------------- */
static inline shm_chan_t *shm_chan(dt_comm_t *c, int src, int dst)
{
    return &c->chans[(size_t)src * (size_t)c->size + (size_t)dst];
}
static inline unsigned char *shm_slot_buf(dt_comm_t *c, int r, uint64_t round)
{
    return c->slots + ((size_t)r * SHM_NBUF + (size_t)(round % SHM_NBUF)) *
                          (size_t)c->chunk;
}
static inline unsigned char *shm_chan_buf(dt_comm_t *c, int src, int dst,
                                          uint32_t i)
{
    size_t ch = (size_t)src * (size_t)c->size + (size_t)dst;
    return c->p2p + (ch * SHM_P2P_NBUF + (i % SHM_P2P_NBUF)) *
                        (size_t)c->p2p_chunk;
}

/* Rendezvous (shm_rendezvous.c).  Create or join the segment c->name for
 * a group of c->size ranks (pipeline and channel buffers of chunk and
 * p2p_chunk bytes when we create it) and wait until every rank is in, at
 * most c->timeout_ms; then the name is removed and c maps the segment.
 * `what` names the rendezvous in messages.  On failure nothing of ours is
 * left mapped. */
int shm_rendezvous(dt_comm_t *c, const char *what, uint64_t chunk,
                   uint64_t p2p_chunk);
/* Give up the segment c is attached to when the group cannot start: the
 * job is failing, so remove the name now (nobody else should join it). */
void shm_leave_failed(dt_comm_t *c);

/* Shared with shm_sym.c (shm_rendezvous.c): make the new unnamed file
 * `fd` mode 0600 whatever the umask, `bytes` long with its memory reserved
 * (posix_fallocate: a full /dev/shm fails here, not later with SIGBUS) and
 * map it shared at *base (0, or the errno of the step that failed: ENOSPC
 * for a full /dev/shm; nothing mapped then); give the complete file the
 * name `path` (0, EEXIST, or another errno); check a file we are about to
 * open that somebody else named (regular, one name, ours, mode 0600):
 * DT_OK or the refusal naming it (DT_ERR_DATA). */
int shm_reserve(int fd, uint64_t bytes, void **base);
int shm_name_fd(int fd, const char *path);
int shm_check_file(dt_comm_t *c, const char *what, const char *path, const struct stat *st);

/* Symmetric memory (shm_sym.c; see comm.h). */
int shm_sym_alloc(dt_comm_t *c, uint64_t bytes, int tag, void **out);
int shm_sym_free(dt_comm_t *c, void *ptr);
/* Free every allocation left (finalize). */
void shm_sym_free_all(dt_comm_t *c);
/* The allocation holding [p, p + n) and p's offset in it; NULL if none. */
const shm_sym_t *shm_sym_find(const dt_comm_t *c, const void *p, uint64_t n, uint64_t *off);

/* The ABI's cleanup_job (shm_cleanup.c; see comm.h): remove the segments
 * of job `job_id` its ranks left in /dev/shm, only regular files the
 * caller owns. */
int shm_cleanup_job(const dt_host_v1_t *host, const char *job_id);

/* Collectives (shm_collectives.c): run one op to completion on the
 * progress thread.  Returns a status; on failure r->msg holds the text. */
int shm_run_collective(dt_comm_t *c, struct dt_comm_req *r);

/* Point-to-point (shm_p2p.c), executor only. */
void shm_p2p_start(dt_comm_t *c, struct dt_comm_req *r);
/* Advance every active send/recv; returns 1 when anything moved, 0 when
 * nothing could, or -status when the group broke (message in broken_msg). */
int shm_p2p_progress(dt_comm_t *c);
/* Fail every active send/recv with `status` and text. */
void shm_p2p_fail_all(dt_comm_t *c, int status, const char *text);

/* Requests (shm_ops.c). */
void shm_req_complete(struct dt_comm_req *r, int status);
/* Mark the group unusable; the first cause is kept for later ops. */
void shm_break(dt_comm_t *c, int status, const char *text);
/* Wake this rank's progress thread for a local event (enqueue, cancel,
 * finalize) wherever it sleeps. */
void shm_wake_progress(dt_comm_t *c);
/* The progress thread's body (arg: the dt_comm_t). */
void *shm_progress_main(void *arg);
/* 1 on a group's progress thread, 0 on callers' threads. */
extern _Thread_local int shm_on_progress_thread;
/* How long an executor's wait may spin: the configured spin, except on
 * the progress thread while no caller waits for the group (the caller is
 * computing then, and the spin would take its CPU). */
static inline uint64_t shm_exec_spin_ns(dt_comm_t *c)
{
    if (shm_on_progress_thread && atomic_load_explicit(&c->callers_waiting,
                                                       memory_order_relaxed) == 0)
        return 0;
    return c->spin_ns;
}
/* The ABI's operations (shm_ops.c); see comm.h for their contracts. */
DT_CREQ_OPS(shm_op_);

#endif /* DT_SHM_INTERNAL_H */
