/*
 * core/interpose/interpose_strict.c - strict device checks (interpose.h):
 * hooks for a process's device and comm interposers that hold every
 * communicator call to what a device communicator (nccl on a GPU)
 * accepts, so that a run on the cpu device fails where the same run on a
 * GPU would, with a message naming the call.
 *
 * What is tracked: the device's live allocations, from its interposer's
 * `after` hooks: alloc/free (device memory) and host_alloc/host_free
 * (pinned host memory), by address, in one sorted array; and, per comm
 * group and peer, the last point-to-point operation started with that
 * peer and whether its request was waited for.
 *
 * What is checked, before the plugin runs (comm.h, "Memory"):
 *  - the dtype is one the nccl communicator carries: NCCL's own types
 *    anywhere, and u16 (which NCCL has no type for) as bytes where
 *    nothing is reduced (all_gather, broadcast, send, recv, sendrecv);
 *  - each buffer that moves bytes is either inside one live device
 *    allocation with room for them from where it starts, or plain host
 *    memory (in no allocation the device handed out) passed to a
 *    collective: a control message.  Host memory in send, recv or
 *    sendrecv is refused (a device communicator cannot stage a transfer
 *    that waits for its peer), and so is pinned host memory anywhere:
 *    host_alloc is the device's memory for asynchronous copies (offload
 *    tiers, staging), so a comm call on it is bulk data through host
 *    memory, which on a GPU is copied twice and synchronously, or read
 *    by the kernel over the bus; control messages live in malloc'd or
 *    stack memory;
 *  - an ungrouped recv from a peer started while this rank's last
 *    operation with that peer on the same group is an ungrouped send not
 *    yet waited for (or a send after such a recv): on NCCL both ranks of
 *    such an exchange block in their first operation once a message
 *    exceeds what NCCL buffers.  sendrecv starts the two as one.  This
 *    is the exchange pattern of one rank, not a search for cycles across
 *    ranks (which needs the peers' orders): a send whose next operation
 *    with that peer is a sendrecv, or that was waited for, is not
 *    reported.
 * Symmetric memory (sym_alloc) is refused: it is host memory every rank
 * maps, which a device communicator does not have, so strategies fall
 * back to device memory as they do on a GPU.
 *
 * A violation fails the call with DT_ERR_INVALID (DT_ERR_UNSUPPORTED for
 * a dtype) and the message, so the run stops as on any comm error.
 * Messages: "strict device: <call>: <what is wrong>", where <call> is the
 * slot, its number (calls of that slot through this interposer, on every
 * group, from 1) and its data, peers and roots being ranks of the call's
 * group:
 *     all_gather #1 (i64, 8 bytes per rank)
 *     send #3 (f32, 4096 bytes to rank 1, tag 2)
 *     sendrecv #2 (f32, 64 bytes to rank 1, tag 4; 64 bytes from rank 1,
 *     tag 1)
 * A buffer of no bytes is not checked, nor a NULL one (the plugin's own
 * argument checks refuse it, in its words).
 */
#include "interpose/interpose.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* One live allocation the device handed out. */
typedef struct strict_alloc {
    uintptr_t base;
    uint64_t size;
    int32_t tag;    /* dt_mem_tag_t */
    int32_t pinned; /* 1: host_alloc, 0: alloc */
} strict_alloc_t;

enum { P2P_NONE = 0, P2P_SEND, P2P_RECV, P2P_GROUPED };

/* The last point-to-point operation started with one peer of a group. */
typedef struct strict_p2p {
    int kind;          /* P2P_* */
    int open;          /* its request not waited for yet */
    dt_comm_req_t *req;
    char what[200];    /* the call, as messages name it */
} strict_p2p_t;

typedef struct strict_group {
    dt_comm_t *comm;   /* the plugin's handle */
    int32_t size;
    strict_p2p_t *peers; /* [size] */
} strict_group_t;

struct dt_interpose_strict {
    pthread_mutex_t lock;
    strict_alloc_t *allocs; /* sorted by base */
    uint32_t n_allocs, cap_allocs;
    strict_group_t *groups;
    uint32_t n_groups, cap_groups;
    int oom;                /* tracking lost an entry: say so once */
    /* for the summary */
    uint64_t calls, device_bufs, host_bufs, host_max, refused;
};

dt_interpose_strict_t *dt_interpose_strict_create(void)
{
    dt_interpose_strict_t *s = calloc(1, sizeof *s);
    if (!s) {
        dt_err_set(DT_ERR_NOMEM, "strict device checks: out of memory");
        return NULL;
    }
    pthread_mutex_init(&s->lock, NULL);
    return s;
}

void dt_interpose_strict_free(dt_interpose_strict_t *s)
{
    if (!s)
        return;
    for (uint32_t i = 0; i < s->n_groups; i++)
        free(s->groups[i].peers);
    free(s->groups);
    free(s->allocs);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* ---- allocations (lock held) ------------------------------------------- */

/* Index of the first allocation whose base is above p. */
static uint32_t upper(const dt_interpose_strict_t *s, uintptr_t p)
{
    uint32_t lo = 0, hi = s->n_allocs;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (s->allocs[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void alloc_add(dt_interpose_strict_t *s, const void *ptr, uint64_t size, int tag,
                      int pinned)
{
    const uintptr_t p = (uintptr_t)ptr;
    uint32_t i = upper(s, p);
    if (i > 0 && s->allocs[i - 1].base == p) { /* a free we did not see */
        s->allocs[i - 1] = (strict_alloc_t){p, size, tag, pinned};
        return;
    }
    if (s->n_allocs == s->cap_allocs) {
        uint32_t cap = s->cap_allocs ? 2 * s->cap_allocs : 256;
        strict_alloc_t *a = realloc(s->allocs, cap * sizeof *a);
        if (!a) {
            s->oom = 1;
            return;
        }
        s->allocs = a;
        s->cap_allocs = cap;
    }
    memmove(&s->allocs[i + 1], &s->allocs[i], (s->n_allocs - i) * sizeof *s->allocs);
    s->allocs[i] = (strict_alloc_t){p, size, tag, pinned};
    s->n_allocs++;
}

static void alloc_remove(dt_interpose_strict_t *s, const void *ptr)
{
    const uintptr_t p = (uintptr_t)ptr;
    uint32_t i = upper(s, p);
    if (i == 0 || s->allocs[i - 1].base != p)
        return;
    i--;
    memmove(&s->allocs[i], &s->allocs[i + 1], (s->n_allocs - i - 1) * sizeof *s->allocs);
    s->n_allocs--;
}

/* The allocation p points into (its first byte for an empty one). */
static const strict_alloc_t *alloc_of(const dt_interpose_strict_t *s, const void *ptr)
{
    const uintptr_t p = (uintptr_t)ptr;
    uint32_t i = upper(s, p);
    if (i == 0)
        return NULL;
    const strict_alloc_t *a = &s->allocs[i - 1];
    return p - a->base < a->size || p == a->base ? a : NULL;
}

/* ---- messages ------------------------------------------------------------ */

static const char *dtype_text(int dtype, char buf[24])
{
    if (dt_dtype_size(dtype))
        return dt_dtype_name(dtype);
    snprintf(buf, 24, "dtype %d", dtype);
    return buf;
}

/* The call as messages name it: "all_reduce #3 (f32, 16 bytes)". */
static void describe(const dt_interpose_comm_call_t *k, char *buf, size_t cap)
{
    char dtb[24];
    const char *dt = dtype_text(k->dtype, dtb);
    const unsigned long long es = dt_dtype_size(k->dtype) ? dt_dtype_size(k->dtype) : 1;
    const char *unit = dt_dtype_size(k->dtype) ? "bytes" : "elements";
    const unsigned long long n = (unsigned long long)k->count * es;
    const unsigned long long seq = (unsigned long long)k->base.seq;
    const char *name = k->base.name;
    switch (k->base.slot) {
    case DT_ICOMM_REDUCE_SCATTER:
    case DT_ICOMM_ALL_GATHER:
        snprintf(buf, cap, "%s #%llu (%s, %llu %s per rank)", name, seq, dt, n, unit);
        break;
    case DT_ICOMM_BROADCAST:
    case DT_ICOMM_REDUCE:
        snprintf(buf, cap, "%s #%llu (%s, %llu %s, root %d)", name, seq, dt, n, unit,
                 (int)k->peer);
        break;
    case DT_ICOMM_SEND:
        snprintf(buf, cap, "%s #%llu (%s, %llu %s to rank %d, tag %d)", name, seq, dt, n, unit,
                 (int)k->peer, (int)k->tag);
        break;
    case DT_ICOMM_RECV:
        snprintf(buf, cap, "%s #%llu (%s, %llu %s from rank %d, tag %d)", name, seq, dt, n, unit,
                 (int)k->peer, (int)k->tag);
        break;
    case DT_ICOMM_SENDRECV:
        snprintf(buf, cap, "%s #%llu (%s, %llu %s to rank %d, tag %d; %llu %s from rank %d, "
                 "tag %d)", name, seq, dt, n, unit, (int)k->peer, (int)k->tag,
                 (unsigned long long)k->recv_count * es, unit, (int)k->recv_peer,
                 (int)k->recv_tag);
        break;
    default:
        snprintf(buf, cap, "%s #%llu (%s, %llu %s)", name, seq, dt, n, unit);
        break;
    }
}

/* Refuse the call (lock held): "strict device: <call>: <fmt ...>". */
__attribute__((format(printf, 4, 5))) static int refuse(dt_interpose_strict_t *s, int status,
                                                        const char *call, const char *fmt, ...)
{
    char text[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    s->refused++;
    return dt_err_set(status, "strict device: %s: %s", call, text);
}

/* ---- the checks (lock held) ---------------------------------------------- */

/* NCCL's own types (ncclFloat32, ncclBfloat16, ncclFloat16, ncclFloat64,
 * ncclInt32, ncclInt64, ncclUint8; ncclInt8 too, which dtrain has no
 * dtype for). */
#define STRICT_NCCL_TYPES "f32, bf16, f16, f64, i32, i64, u8"
static int nccl_type(int dtype)
{
    switch (dtype) {
    case DT_F32: case DT_BF16: case DT_F16: case DT_F64:
    case DT_I32: case DT_I64: case DT_U8:
        return 1;
    default:
        return 0;
    }
}

/* An operation that reduces (NCCL needs the type's arithmetic). */
static int reduces(int slot)
{
    return slot == DT_ICOMM_ALL_REDUCE || slot == DT_ICOMM_REDUCE_SCATTER ||
           slot == DT_ICOMM_REDUCE;
}

/* The dtype is one nccl carries in this operation: NCCL's own types
 * anywhere; u16, which has none, as bytes (ncclUint8, twice the count)
 * where nothing is reduced, as the nccl communicator does
 * (plugins/nccl, nccl_wire). */
static int check_dtype(dt_interpose_strict_t *s, const dt_interpose_comm_call_t *k,
                       const char *call)
{
    if (nccl_type(k->dtype) || (k->dtype == DT_U16 && !reduces((int)k->base.slot)))
        return DT_OK;
    char dtb[24];
    if (k->dtype == DT_U16)
        return refuse(s, DT_ERR_UNSUPPORTED, call, "u16 cannot be reduced on NCCL: it has no "
                      "NCCL type (NCCL reduces " STRICT_NCCL_TYPES "; the nccl communicator "
                      "moves u16 as bytes, without reducing it)");
    return refuse(s, DT_ERR_UNSUPPORTED, call, "%s is not a type NCCL moves ("
                  STRICT_NCCL_TYPES ", and u16 as bytes)", dtype_text(k->dtype, dtb));
}

/* Bytes of `count` elements of `es` bytes times `n` (saturated). */
static uint64_t span(uint64_t count, uint64_t es, uint64_t n)
{
    uint64_t a, b;
    if (__builtin_mul_overflow(count, es, &a) || __builtin_mul_overflow(a, n, &b))
        return UINT64_MAX;
    return b;
}

/* One buffer of the call: `what` ("send buffer") must hold `bytes`.  A
 * NULL buffer is the plugin's to refuse. */
static int check_buf(dt_interpose_strict_t *s, const char *call, const char *what,
                     const void *ptr, uint64_t bytes, int p2p)
{
    if (bytes == 0 || !ptr)
        return DT_OK;
    const uintptr_t p = (uintptr_t)ptr;
    const strict_alloc_t *a = alloc_of(s, ptr);
    if (a && a->pinned)
        return refuse(s, DT_ERR_INVALID, call, "%s 0x%" PRIxPTR " is pinned host memory "
                      "(host_alloc of %" PRIu64 " bytes, tag %s), but %s", what, p, a->size,
                      dt_mem_tag_name(a->tag),
                      p2p ? "send and recv take only device memory"
                          : "bulk data travels in device memory (alloc), and a control "
                            "message in plain host memory (malloc, the stack)");
    if (a) {
        const uint64_t off = (uint64_t)(p - a->base);
        if (bytes > a->size - off)
            return refuse(s, DT_ERR_INVALID, call, "%s 0x%" PRIxPTR " needs %" PRIu64
                          " bytes, but it starts %" PRIu64 " bytes into a device allocation "
                          "of %" PRIu64 " bytes (tag %s) at 0x%" PRIxPTR ": it runs %" PRIu64
                          " bytes past its end", what, p, bytes, off, a->size,
                          dt_mem_tag_name(a->tag), a->base, bytes - (a->size - off));
        s->device_bufs++;
        return DT_OK;
    }
    if (p2p)
        return refuse(s, DT_ERR_INVALID, call, "%s 0x%" PRIxPTR " is host memory (in no "
                      "device allocation), but send and recv take only device memory (a "
                      "device communicator refuses host memory there)", what, p);
    s->host_bufs++;
    if (bytes > s->host_max)
        s->host_max = bytes;
    return DT_OK;
}

/* Every buffer of the call. */
static int check_bufs(dt_interpose_strict_t *s, const dt_interpose_comm_call_t *k,
                      const char *call)
{
    const uint64_t es = (uint64_t)dt_dtype_size(k->dtype);
    const uint64_t n = span(k->count, es, 1);
    const uint64_t size = k->group_size > 0 ? (uint64_t)k->group_size : 1;
    int rc = DT_OK;
    switch (k->base.slot) {
    case DT_ICOMM_ALL_REDUCE:
        if ((rc = check_buf(s, call, "send buffer", k->send, n, 0)) == DT_OK)
            rc = check_buf(s, call, "recv buffer", k->recv, n, 0);
        break;
    case DT_ICOMM_REDUCE_SCATTER:
        if ((rc = check_buf(s, call, "send buffer", k->send, span(k->count, es, size), 0)) ==
            DT_OK)
            rc = check_buf(s, call, "recv buffer", k->recv, n, 0);
        break;
    case DT_ICOMM_ALL_GATHER:
        if ((rc = check_buf(s, call, "send buffer", k->send, n, 0)) == DT_OK)
            rc = check_buf(s, call, "recv buffer", k->recv, span(k->count, es, size), 0);
        break;
    case DT_ICOMM_BROADCAST:
        rc = check_buf(s, call, "data buffer", k->recv, n, 0);
        break;
    case DT_ICOMM_REDUCE:
        rc = check_buf(s, call, "send buffer", k->send, n, 0);
        if (rc == DT_OK && k->group_rank == k->peer) /* recv: the root's only */
            rc = check_buf(s, call, "recv buffer", k->recv, n, 0);
        break;
    case DT_ICOMM_SEND:
        rc = check_buf(s, call, "send buffer", k->send, n, 1);
        break;
    case DT_ICOMM_RECV:
        rc = check_buf(s, call, "recv buffer", k->recv, n, 1);
        break;
    case DT_ICOMM_SENDRECV:
        if ((rc = check_buf(s, call, "send buffer", k->send, n, 1)) == DT_OK)
            rc = check_buf(s, call, "recv buffer", k->recv, span(k->recv_count, es, 1), 1);
        break;
    default:
        break;
    }
    return rc;
}

/* The group's p2p records, made on first use; NULL when its size is
 * unknown or memory ran out (then its order goes unchecked). */
static strict_group_t *group_of(dt_interpose_strict_t *s, dt_comm_t *comm, int32_t size,
                                int make)
{
    for (uint32_t i = 0; i < s->n_groups; i++)
        if (s->groups[i].comm == comm)
            return &s->groups[i];
    if (!make || size <= 0)
        return NULL;
    if (s->n_groups == s->cap_groups) {
        uint32_t cap = s->cap_groups ? 2 * s->cap_groups : 8;
        strict_group_t *g = realloc(s->groups, cap * sizeof *g);
        if (!g)
            return NULL;
        s->groups = g;
        s->cap_groups = cap;
    }
    strict_p2p_t *peers = calloc((size_t)size, sizeof *peers);
    if (!peers)
        return NULL;
    strict_group_t *g = &s->groups[s->n_groups++];
    *g = (strict_group_t){comm, size, peers};
    return g;
}

static void group_drop(dt_interpose_strict_t *s, dt_comm_t *comm)
{
    for (uint32_t i = 0; i < s->n_groups; i++)
        if (s->groups[i].comm == comm) {
            free(s->groups[i].peers);
            s->groups[i] = s->groups[--s->n_groups];
            return;
        }
}

static strict_p2p_t *peer_of(strict_group_t *g, int32_t peer)
{
    return g && peer >= 0 && peer < g->size ? &g->peers[peer] : NULL;
}

/* An ungrouped send or recv: the last operation with its peer must not
 * be the other direction, ungrouped and still in flight. */
static int check_order(dt_interpose_strict_t *s, const dt_interpose_comm_call_t *k,
                       const char *call)
{
    const int send = k->base.slot == DT_ICOMM_SEND;
    const strict_p2p_t *last = peer_of(group_of(s, k->comm, k->group_size, 0), k->peer);
    if (!last || !last->open || last->kind != (send ? P2P_RECV : P2P_SEND))
        return DT_OK;
    return refuse(s, DT_ERR_INVALID, call, "%s on the same group is still in flight (not "
                  "waited for) and was not started with this %s: on NCCL two ranks that each "
                  "send before they receive block in their sends, a deadlock once a message "
                  "exceeds NCCL's buffers; start the two together with sendrecv", last->what,
                  send ? "send" : "recv");
}

/* After a start that succeeded: the last operation with its peer(s). */
static void record_p2p(dt_interpose_strict_t *s, const dt_interpose_comm_call_t *k,
                       const char *call)
{
    strict_group_t *g = group_of(s, k->comm, k->group_size, 1);
    const int slot = (int)k->base.slot;
    strict_p2p_t *a = peer_of(g, k->peer);
    strict_p2p_t *b = slot == DT_ICOMM_SENDRECV ? peer_of(g, k->recv_peer) : NULL;
    if (a) {
        a->kind = slot == DT_ICOMM_SEND ? P2P_SEND
                  : slot == DT_ICOMM_RECV ? P2P_RECV
                                          : P2P_GROUPED;
        a->req = k->req;
        a->open = k->req != NULL;
        snprintf(a->what, sizeof a->what, "%s", call);
    }
    if (b) {
        b->kind = P2P_GROUPED;
        b->req = k->recv_req;
        b->open = k->recv_req != NULL;
        snprintf(b->what, sizeof b->what, "%s", call);
    }
}

/* A wait freed req: its operation is no longer in flight. */
static void record_wait(dt_interpose_strict_t *s, const dt_interpose_comm_call_t *k)
{
    strict_group_t *g = group_of(s, k->comm, k->group_size, 0);
    for (int32_t p = 0; g && p < g->size; p++)
        if (g->peers[p].req == k->req) {
            g->peers[p].open = 0;
            g->peers[p].req = NULL;
        }
}

/* ---- the hooks ------------------------------------------------------------ */

static int comm_before(dt_interpose_strict_t *s, const dt_interpose_comm_call_t *k)
{
    const int slot = (int)k->base.slot;
    if (slot == DT_ICOMM_SYM_ALLOC) {
        return dt_err_set(DT_ERR_UNSUPPORTED, "strict device: sym_alloc #%llu: symmetric "
                          "memory is host memory every rank maps, which a device "
                          "communicator does not have; refused, so buffers go in device "
                          "memory as on a GPU", (unsigned long long)k->base.seq);
    }
    if (!(k->base.flags & DT_ICALL_START) || slot == DT_ICOMM_BARRIER)
        return DT_OK;
    char call[200];
    describe(k, call, sizeof call);
    s->calls++;
    int rc = check_dtype(s, k, call);
    if (rc == DT_OK)
        rc = check_bufs(s, k, call);
    if (rc == DT_OK && (slot == DT_ICOMM_SEND || slot == DT_ICOMM_RECV))
        rc = check_order(s, k, call);
    return rc;
}

static void comm_after(dt_interpose_strict_t *s, const dt_interpose_comm_call_t *k, int status)
{
    const int slot = (int)k->base.slot;
    if (slot == DT_ICOMM_WAIT && (k->req_slot == DT_ICOMM_SEND || k->req_slot == DT_ICOMM_RECV ||
                                  k->req_slot == DT_ICOMM_SENDRECV))
        record_wait(s, k);
    else if (slot == DT_ICOMM_FINALIZE)
        group_drop(s, k->comm);
    else if (status == DT_OK &&
             (slot == DT_ICOMM_SEND || slot == DT_ICOMM_RECV || slot == DT_ICOMM_SENDRECV)) {
        char call[200];
        describe(k, call, sizeof call);
        record_p2p(s, k, call);
    }
}

static void device_after(dt_interpose_strict_t *s, const dt_interpose_device_call_t *k,
                         int status)
{
    if (status != DT_OK)
        return;
    switch (k->base.slot) {
    case DT_IDEV_ALLOC:
    case DT_IDEV_HOST_ALLOC:
        if (k->ptr)
            alloc_add(s, k->ptr, k->size, k->tag, k->base.slot == DT_IDEV_HOST_ALLOC);
        break;
    case DT_IDEV_FREE:
    case DT_IDEV_HOST_FREE:
        if (k->ptr)
            alloc_remove(s, k->ptr);
        break;
    case DT_IDEV_FINALIZE: /* the instance's memory went with it */
        s->n_allocs = 0;
        break;
    default:
        break;
    }
}

static int strict_before(void *ctx, const dt_interpose_call_t *call)
{
    dt_interpose_strict_t *s = ctx;
    if (call->kind != DT_KIND_COMM)
        return DT_OK;
    pthread_mutex_lock(&s->lock);
    int rc = comm_before(s, (const dt_interpose_comm_call_t *)call);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static void strict_after(void *ctx, const dt_interpose_call_t *call, int status,
                         uint64_t elapsed_ns)
{
    (void)elapsed_ns;
    dt_interpose_strict_t *s = ctx;
    pthread_mutex_lock(&s->lock);
    if (call->kind == DT_KIND_COMM)
        comm_after(s, (const dt_interpose_comm_call_t *)call, status);
    else if (call->kind == DT_KIND_DEVICE)
        device_after(s, (const dt_interpose_device_call_t *)call, status);
    pthread_mutex_unlock(&s->lock);
}

dt_interpose_hooks_t dt_interpose_strict_hooks(dt_interpose_strict_t *s)
{
    return (dt_interpose_hooks_t){.ctx = s, .before = strict_before, .after = strict_after};
}

void dt_interpose_strict_print(dt_interpose_strict_t *s, FILE *f, const char *title)
{
    pthread_mutex_lock(&s->lock);
    fprintf(f, "%s %" PRIu64 " comm calls checked: %" PRIu64 " buffers in device memory, %"
            PRIu64 " control messages in host memory (at most %" PRIu64 " bytes); %" PRIu64
            " refused%s\n", title, s->calls, s->device_bufs, s->host_bufs, s->host_max,
            s->refused, s->oom ? " (out of memory: some allocations were not tracked)" : "");
    pthread_mutex_unlock(&s->lock);
}
