/*
 * plugins/shm/shm_p2p.c - send and recv between any two ranks of a group.
 *
 * Each ordered pair (src, dst) has a channel: a ring of SHM_P2P_NBUF
 * buffers of p2p_chunk bytes and two counters, `posted` (src) and
 * `consumed` (dst).  A message is cut into chunks, each labelled with the
 * tag, the message size and its offset.  Messages of one pair travel in
 * send order, so a send matches the oldest started recv from that peer
 * with the same tag; a head message whose tag has no started recv yet
 * blocks the channel until one is started (a receiver must start the recv
 * of an earlier-sent message before waiting for a later one).
 *
 * Unlike collectives, sends and recvs do not run one after the other:
 * once dequeued they stay active and the progress thread advances all of
 * them whenever it runs (also while a collective waits), so a rank may
 * start a send and a recv to the same peer and wait for both, like MPI's
 * isend/irecv.  A send completes once its last chunk is in the ring.
 */
#include <string.h>

#include "shm_internal.h"
#include "shm_msg.h"
#include "shm_sync.h"

void shm_p2p_start(dt_comm_t *c, struct dt_comm_req *r)
{
    if (r->b.count == 0) {
        /* Nothing to move, nothing to match: the peer skips it as well. */
        shm_req_complete(r, DT_OK);
        return;
    }
    r->done = 0;
    r->matched = 0;
    r->last_ns = shm_now_ns();
    r->p2p_next = NULL;
    if (c->p2p_tail)
        c->p2p_tail->p2p_next = r;
    else
        c->p2p_head = r;
    c->p2p_tail = r;
    atomic_fetch_add(&c->p2p_active, 1);
}

static void unlink_active(dt_comm_t *c, struct dt_comm_req *r,
                          struct dt_comm_req *prev)
{
    if (prev)
        prev->p2p_next = r->p2p_next;
    else
        c->p2p_head = r->p2p_next;
    if (c->p2p_tail == r)
        c->p2p_tail = prev;
    r->p2p_next = NULL;
    atomic_fetch_sub(&c->p2p_active, 1);
}

static void fail_with(dt_comm_t *c, struct dt_comm_req *r, int status,
                      const char *text)
{
    char desc[256];
    shm_req_desc(c, r, desc, sizeof desc);
    snprintf(r->msg, sizeof r->msg, "%s: %s", desc, text);
    r->status = status;
}

/* Returns 1 when data moved, 0 when it could not, -status on failure. */
static int send_step(dt_comm_t *c, struct dt_comm_req *r)
{
    const int peer = r->b.root, me = c->rank;
    if (c->cur_send[peer] && c->cur_send[peer] != r)
        return 0; /* an earlier send to this peer owns the channel */
    c->cur_send[peer] = r;
    shm_chan_t *ch = shm_chan(c, me, peer);
    const uint64_t bytes = r->b.count * r->b.esize;
    uint32_t posted = atomic_load_explicit(&ch->posted, memory_order_relaxed);
    uint32_t consumed = atomic_load(&ch->consumed);
    int moved = 0;
    while (r->done < bytes && posted - consumed < SHM_P2P_NBUF) {
        uint64_t len = bytes - r->done < c->p2p_chunk ? bytes - r->done : c->p2p_chunk;
        memcpy(shm_chan_buf(c, me, peer, posted), (const unsigned char *)r->send + r->done, len);
        ch->hdr[posted % SHM_P2P_NBUF] = (shm_chunk_hdr_t){
            .tag = r->b.tag, .len = (uint32_t)len, .msg_bytes = bytes,
            .offset = r->done, .msg_no = r->b.seq};
        posted++;
        atomic_store(&ch->posted, posted);
        r->done += len;
        moved = 1;
        consumed = atomic_load(&ch->consumed);
    }
    if (moved) {
        r->last_ns = shm_now_ns();
        if (shm_ring(c, peer, SHM_SLEEP_PEERS) && c->spin_ns)
            c->rang_ns = r->last_ns;
    }
    if (r->done == bytes) {
        c->cur_send[peer] = NULL;
        return 2; /* complete */
    }
    return moved;
}

static int recv_step(dt_comm_t *c, struct dt_comm_req *r)
{
    const int peer = r->b.root, me = c->rank;
    if (c->cur_recv[peer] && c->cur_recv[peer] != r)
        return 0; /* the channel's head belongs to another recv */
    shm_chan_t *ch = shm_chan(c, peer, me);
    const uint64_t bytes = r->b.count * r->b.esize;
    uint32_t consumed = atomic_load_explicit(&ch->consumed, memory_order_relaxed);
    uint32_t posted = atomic_load(&ch->posted);
    int moved = 0;
    while (posted != consumed && r->done < bytes) {
        const shm_chunk_hdr_t *h = &ch->hdr[consumed % SHM_P2P_NBUF];
        if (!r->matched) {
            if (h->tag != r->b.tag)
                return moved; /* an older or other recv's message */
            if (h->msg_bytes != bytes || h->offset != 0) {
                char text[320], who[96];
                shm_fmt_rank(c, peer, who, sizeof who);
                snprintf(text, sizeof text,
                         "%s sent %llu bytes with tag %d (its send #%llu); "
                         "send and recv sizes must match",
                         who, (unsigned long long)h->msg_bytes, (int)h->tag,
                         (unsigned long long)h->msg_no);
                fail_with(c, r, DT_ERR_INVALID, text);
                return -DT_ERR_INVALID;
            }
            r->matched = 1;
            c->cur_recv[peer] = r;
        }
        memcpy((unsigned char *)r->recv + h->offset, shm_chan_buf(c, peer, me, consumed), h->len);
        r->done += h->len;
        consumed++;
        atomic_store(&ch->consumed, consumed);
        moved = 1;
        posted = atomic_load(&ch->posted);
    }
    if (moved) {
        r->last_ns = shm_now_ns();
        if (shm_ring(c, peer, SHM_SLEEP_PEERS) && c->spin_ns)
            c->rang_ns = r->last_ns;
    }
    if (r->done == bytes) {
        c->cur_recv[peer] = NULL;
        return 2;
    }
    return moved;
}

/* Periodic checks for one stuck op: job failure, cancel, stop, peer
 * death, stall timeout.  Returns DT_OK or a status with r->msg set. */
static int check_op(dt_comm_t *c, struct dt_comm_req *r, uint64_t now)
{
    char text[512];
    if (atomic_load(&c->job->world->fail.state) == 2) {
        int st = shm_fail_text(c, text, sizeof text);
        fail_with(c, r, st, text);
        return st;
    }
    if (atomic_load(&c->cancel_upto) >= r->id) {
        char who[96];
        shm_fmt_rank(c, r->b.root, who, sizeof who);
        snprintf(text, sizeof text, "timed out after %.1f s (the wait's limit) waiting for %s",
                 (double)atomic_load(&c->cancel_ms) / 1000.0, who);
        fail_with(c, r, DT_ERR_TIMEOUT, text);
        return DT_ERR_TIMEOUT;
    }
    if (atomic_load(&c->stop)) {
        fail_with(c, r, DT_ERR_ABORTED,
                  "the group was finalized while the operation was in flight");
        return DT_ERR_ABORTED;
    }
    int gone = shm_peer_gone(c, r->b.root);
    if (gone == SHM_FAIL_DEAD) {
        shm_publish_fail(c->job, SHM_FAIL_DEAD, c->wranks[r->b.root], c->pids[r->b.root], "died");
        int st = shm_fail_text(c, text, sizeof text);
        fail_with(c, r, st, text);
        return st;
    }
    if (gone == SHM_FAIL_LEFT) {
        char who[96];
        shm_fmt_rank(c, r->b.root, who, sizeof who);
        snprintf(text, sizeof text, "%s left the group (finalize) first", who);
        fail_with(c, r, DT_ERR_REMOTE, text);
        return DT_ERR_REMOTE;
    }
    if (now - r->last_ns >= (uint64_t)c->timeout_ms * 1000000ull) {
        char who[96];
        shm_fmt_rank(c, r->b.root, who, sizeof who);
        snprintf(text, sizeof text, "timed out after %.1f s waiting for %s",
                 (double)c->timeout_ms / 1000.0, who);
        fail_with(c, r, DT_ERR_TIMEOUT, text);
        return DT_ERR_TIMEOUT;
    }
    return DT_OK;
}

int shm_p2p_progress(dt_comm_t *c)
{
    int any = 0;
    struct dt_comm_req *prev = NULL, *r = c->p2p_head;
    while (r) {
        struct dt_comm_req *next = r->p2p_next;
        int st = r->b.kind == DT_COMM_OP_SEND ? send_step(c, r) : recv_step(c, r);
        if (st < 0) {
            unlink_active(c, r, prev);
            shm_break(c, -st, r->msg);
            shm_req_complete(r, -st);
            return st;
        }
        if (st == 2) {
            unlink_active(c, r, prev);
            shm_req_complete(r, DT_OK);
            any = 1;
        } else {
            any |= st;
            prev = r;
        }
        r = next;
    }
    if (!c->p2p_head)
        return any;
    /* Cheap checks every call, the rest every SHM_CHECK_NS. */
    uint64_t now = shm_now_ns();
    int urgent = atomic_load(&c->job->world->fail.state) == 2 ||
                 atomic_load(&c->stop) ||
                 atomic_load(&c->cancel_upto) >= c->p2p_head->id;
    if (!urgent && now < c->p2p_next_check)
        return any;
    c->p2p_next_check = now + SHM_CHECK_NS;
    prev = NULL;
    for (r = c->p2p_head; r; prev = r, r = r->p2p_next) {
        int st = check_op(c, r, now);
        if (st != DT_OK) {
            unlink_active(c, r, prev);
            shm_break(c, st, r->msg);
            shm_req_complete(r, st);
            return -st;
        }
    }
    return any;
}

void shm_p2p_fail_all(dt_comm_t *c, int status, const char *text)
{
    struct dt_comm_req *r = c->p2p_head;
    c->p2p_head = c->p2p_tail = NULL;
    atomic_store(&c->p2p_active, 0);
    for (int p = 0; p < c->size; p++)
        c->cur_send[p] = c->cur_recv[p] = NULL;
    while (r) {
        struct dt_comm_req *next = r->p2p_next;
        r->p2p_next = NULL;
        fail_with(c, r, status, text);
        shm_req_complete(r, status);
        r = next;
    }
}
