/*
 * plugins/tcp/tcp_ops.c - the TCP communicator's operations: starting
 * (argument checks, numbering, the queue), the algorithms the progress
 * thread runs, and the bounded waits.
 *
 * Algorithms, for bandwidth (each rank moves about 2 (n-1)/n of the
 * buffer whatever the group size):
 *   all_reduce      ring reduce-scatter, then ring all-gather; across
 *                   nodes of L >= 2 ranks each, three rings instead
 *                   (inside, across, inside: run_hier_all_reduce)
 *   reduce_scatter  ring reduce-scatter
 *   all_gather      ring all-gather
 *   reduce          ring reduce-scatter, then every block to the root
 *   broadcast       the root sends to every rank
 *   barrier         dissemination (log2 n rounds of empty frames)
 * The blocks of a ring are reduced with the shared kernels
 * (plugins/common/comm/reduce.h, as shm does).  bf16 / f16 travel through the
 * reduce-scatter as f32 partial sums and are rounded once, by the rank
 * that owns the block, so they accumulate in f32 like shm and mpi; the
 * result differs from shm's rank-order sum only by the order of the f32
 * additions (the block starting at rank b adds b, b+1, ..., b-1).  One
 * rank computes each block and the all-gather copies it, so every rank
 * holds the same bits.
 *
 * Messages have the shm communicator's shape:
 *     all_reduce #17 (f32, 4194304 bytes) on group world: timed out after
 *     1.0 s waiting for rank 1
 *     all_reduce #3 (f32, 40 bytes) on group world: rank 2 lost: it
 *     closed its connection (EOF)
 * A wait that gives up leaves the group failed for good (a ring cannot
 * resume half-way): later operations fail at once with the first cause.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtrain/half.h"
#include "common/comm/reduce.h"
#include "tcp_internal.h"

static dt_comm_names_t names(dt_comm_t *c)
{
    return (dt_comm_names_t){.gname = c->gname, .is_world = c->is_world,
                             .size = c->size, .wranks = c->wranks};
}

void tcp_req_desc(dt_comm_t *c, const struct dt_comm_req *r, char *buf, size_t cap)
{
    dt_comm_names_t g = names(c);
    dt_creq_text(&g, &r->b, buf, cap);
}

void tcp_fmt_rank(dt_comm_t *c, int r, char *buf, size_t cap)
{
    dt_comm_names_t g = names(c);
    dt_comm_fmt_rank(&g, r, buf, cap);
}

int tcp_rank_size(dt_comm_t *c, int32_t *rank, int32_t *size)
{
    if (!c || !rank || !size)
        return c ? c->host->set_error(c->host, DT_ERR_INVALID, "rank_size: NULL argument")
                 : DT_ERR_INVALID;
    *rank = c->rank;
    *size = c->size;
    return DT_OK;
}

void tcp_complete(dt_comm_t *c, struct dt_comm_req *r, int st, const char *msg)
{
    pthread_mutex_lock(&c->mu);
    r->status = st;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
    r->state = TCP_RQ_DONE;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* ---- moving blocks (progress thread) ------------------------------------- */

/* Send outs[i] to to[i] and complete every receive in posts, all at once;
 * DT_OK or the group's failure. */
static int xfer(dt_comm_t *c, const int *to, tcp_out_t *outs, int nout, tcp_post_t *posts,
                int npost)
{
    for (int i = 0; i < nout; i++)
        tcp_out_push(c, to[i], &outs[i]);
    for (int i = 0; i < npost; i++)
        tcp_post_recv(c, &posts[i]);
    for (;;) {
        int wait_for = -1;
        for (int i = 0; i < npost && wait_for < 0; i++)
            if (posts[i].done == 0)
                wait_for = posts[i].peer;
        for (int i = 0; i < nout && wait_for < 0; i++)
            if (outs[i].done == 0)
                wait_for = to[i];
        if (wait_for < 0)
            break;
        atomic_store(&c->waiting_on, wait_for);
        int st = tcp_pump(c, TCP_POLL_MS);
        int all_done = 1;
        for (int i = 0; i < npost; i++)
            all_done &= posts[i].done != 0;
        for (int i = 0; i < nout; i++)
            all_done &= outs[i].done != 0;
        /* what completed before the failure stands (a peer that sent its
         * last block and exited) */
        if (st != DT_OK && !all_done) {
            for (int i = 0; i < nout; i++)
                if (outs[i].done == 0)
                    tcp_out_forget(c, &outs[i]);
            for (int i = 0; i < npost; i++)
                if (posts[i].done == 0)
                    tcp_unpost(c, &posts[i]);
            return st;
        }
    }
    atomic_store(&c->waiting_on, -1);
    for (int i = 0; i < npost; i++)
        if (posts[i].done < 0)
            return -posts[i].done;
    return DT_OK;
}

static uint64_t coll_key(const struct dt_comm_req *r, uint32_t step)
{
    return (r->b.seq << 24) | step;
}

/* A ring over some of the group's ranks, in ring order (members NULL:
 * the whole group in rank order); `me` is this rank's position. */
typedef struct ring {
    const int32_t *members;
    int32_t n, me;
} ring_t;

static ring_t whole_ring(const dt_comm_t *c)
{
    return (ring_t){.members = NULL, .n = c->size, .me = c->rank};
}

/* The group rank at ring position i (any integer: taken mod n). */
static int ring_rank(const ring_t *g, int i)
{
    i = ((i % g->n) + g->n) % g->n;
    return g->members ? g->members[i] : i;
}

/* One ring step: sbytes from sbuf to the right, rbytes from the left. */
static int ring_step(dt_comm_t *c, const ring_t *g, const struct dt_comm_req *r, uint32_t step,
                     const void *sbuf, uint64_t sbytes, void *rbuf, uint64_t rbytes)
{
    int right = ring_rank(g, g->me + 1), left = ring_rank(g, g->me - 1);
    uint64_t key = coll_key(r, step);
    tcp_out_t o = {.hdr = {.type = TCP_FR_COLL, .key = key, .bytes = sbytes},
                   .data = sbuf};
    tcp_post_t p = {.peer = left, .type = TCP_FR_COLL, .key = key, .buf = rbuf,
                    .bytes = rbytes};
    return xfer(c, &right, &o, 1, &p, 1);
}

static int is_half(int dtype) { return dtype == DT_BF16 || dtype == DT_F16; }

static void widen(float *dst, const void *src, uint64_t n, int dtype)
{
    const uint16_t *s = src;
    if (dtype == DT_BF16)
        for (uint64_t i = 0; i < n; i++)
            dst[i] = dt_bf16_to_f32(s[i]);
    else
        for (uint64_t i = 0; i < n; i++)
            dst[i] = dt_f16_to_f32(s[i]);
}

static void narrow(void *dst, const float *src, uint64_t n, int dtype)
{
    uint16_t *d = dst;
    if (dtype == DT_BF16)
        for (uint64_t i = 0; i < n; i++)
            d[i] = dt_f32_to_bf16(src[i]);
    else
        for (uint64_t i = 0; i < n; i++)
            d[i] = dt_f32_to_f16(src[i]);
}

/* n blocks of a count: the first count % n one element longer. */
static void blocks_of(uint64_t count, int n, uint64_t *off, uint64_t *len)
{
    uint64_t base = count / (uint64_t)n, extra = count % (uint64_t)n, o = 0;
    for (int b = 0; b < n; b++) {
        len[b] = base + ((uint64_t)b < extra);
        off[b] = o;
        o += len[b];
    }
}

typedef struct scratch {
    const dt_host_v1_t *h;
    void *p[4];
} scratch_t;

static void *scratch_get(scratch_t *s, int i, uint64_t bytes)
{
    s->p[i] = s->h->alloc(s->h, bytes ? bytes : 64, DT_TAG_COMM);
    return s->p[i];
}

static void scratch_free(scratch_t *s)
{
    for (int i = 0; i < 4; i++)
        s->h->free(s->h, s->p[i]);
}

/* Ring reduce-scatter of `in` (dtype, blocks off/len in elements, one per
 * ring position) with `op` (DT_OP_AVG divides the sum by `div`): the
 * block of this rank's position lands in `out` (dtype).  Steps from
 * step0. */
static int ring_reduce_scatter(dt_comm_t *c, const ring_t *g, const struct dt_comm_req *r,
                               int op, int div, const void *in, const uint64_t *off,
                               const uint64_t *len, void *out, uint32_t step0, char *msg,
                               size_t cap)
{
    const int n = g->n, me = g->me, half = is_half(r->b.dtype);
    const int wdt = half ? DT_F32 : r->b.dtype;
    const size_t es = r->b.esize, wes = dt_dtype_size(wdt);
    const unsigned char *inb = in;
    uint64_t maxlen = 0;
    for (int b = 0; b < n; b++)
        maxlen = len[b] > maxlen ? len[b] : maxlen;
    scratch_t s = {.h = c->host};
    unsigned char *acc[2] = {scratch_get(&s, 0, maxlen * wes), scratch_get(&s, 1, maxlen * wes)};
    unsigned char *tmp = scratch_get(&s, 2, maxlen * wes);
    unsigned char *wid = half ? scratch_get(&s, 3, maxlen * wes) : NULL;
    if (!acc[0] || !acc[1] || !tmp || (half && !wid)) {
        scratch_free(&s);
        snprintf(msg, cap, "out of memory for the ring's %llu-byte blocks",
                 (unsigned long long)(maxlen * wes));
        return DT_ERR_NOMEM;
    }
    int cur = 0, st = DT_OK;
    for (int k = 0; k < n - 1 && st == DT_OK; k++) {
        int sb = (me - k - 1 + 2 * n) % n, rb = (me - k - 2 + 2 * n) % n;
        const void *sbuf;
        if (k > 0) {
            sbuf = acc[cur];
        } else if (half) {
            widen((float *)acc[0], inb + off[sb] * es, len[sb], r->b.dtype);
            sbuf = acc[0];
        } else {
            sbuf = inb + off[sb] * es;
        }
        st = ring_step(c, g, r, step0 + (uint32_t)k, sbuf, len[sb] * wes, tmp, len[rb] * wes);
        if (st != DT_OK)
            break;
        const void *mine = inb + off[rb] * es;
        if (half) {
            widen((float *)wid, mine, len[rb], r->b.dtype);
            mine = wid;
        }
        const int last = k == n - 2;
        void *dst = last && !half ? out : acc[cur ^ 1];
        const void *srcs[2] = {tmp, mine};
        dt_reduce(dst, srcs, 2, len[rb], wdt, last || op != DT_OP_AVG ? op : DT_OP_SUM, div);
        if (last && half)
            narrow(out, (const float *)dst, len[rb], r->b.dtype);
        cur ^= 1;
    }
    scratch_free(&s);
    return st;
}

/* Ring all-gather in place: the block of this rank's ring position in buf
 * is filled; after it, every block is. */
static int ring_all_gather(dt_comm_t *c, const ring_t *g, const struct dt_comm_req *r,
                           void *buf, const uint64_t *off, const uint64_t *len, uint32_t step0)
{
    const int n = g->n, me = g->me;
    const size_t es = r->b.esize;
    unsigned char *b = buf;
    int st = DT_OK;
    for (int k = 0; k < n - 1 && st == DT_OK; k++) {
        int sb = (me - k + n) % n, rb = (me - k - 1 + n) % n;
        st = ring_step(c, g, r, step0 + (uint32_t)k, b + off[sb] * es, len[sb] * es,
                       b + off[rb] * es, len[rb] * es);
    }
    return st;
}

/* all_reduce over L ranks per node on M nodes (dt_comm's node rings):
 * reduce-scatter inside the node into L blocks, all_reduce of this rank's
 * block across the nodes (reduce-scatter and all-gather in M pieces),
 * all-gather inside the node.  A node's link carries 2(M-1)/M of the
 * buffer each way instead of the flat ring's 2(n-1)/n x L.  Every element
 * is still computed by one rank, so every rank gets the same bits; not a
 * half dtype (each ring would round it again). */
static int run_hier_all_reduce(dt_comm_t *c, struct dt_comm_req *r, char *msg, size_t cap)
{
    const size_t es = r->b.esize;
    const int L = c->n_local, M = c->n_cross;
    const ring_t local = {.members = c->local, .n = L, .me = c->local_idx};
    const ring_t cross = {.members = c->cross, .n = M, .me = c->cross_idx};
    uint64_t *off = malloc(sizeof(uint64_t) * 2 * (size_t)(L + M));
    if (!off) {
        snprintf(msg, cap, "out of memory");
        return DT_ERR_NOMEM;
    }
    uint64_t *len = off + L, *coff = len + L, *clen = coff + M;
    blocks_of(r->b.count, L, off, len);
    unsigned char *recv = r->recv, *mine = recv + off[local.me] * es;
    blocks_of(len[local.me], M, coff, clen);
    /* the sum inside the node; max and min as they are; the average
     * divides by the whole group once, across */
    const int op1 = r->b.op == DT_OP_AVG ? DT_OP_SUM : r->b.op;
    uint32_t step = 0;
    int st = ring_reduce_scatter(c, &local, r, op1, 1, r->send, off, len, mine, step, msg, cap);
    step += (uint32_t)(L - 1);
    if (st == DT_OK)
        st = ring_reduce_scatter(c, &cross, r, r->b.op, c->size, mine, coff, clen,
                                 mine + coff[cross.me] * es, step, msg, cap);
    step += (uint32_t)(M - 1);
    if (st == DT_OK)
        st = ring_all_gather(c, &cross, r, mine, coff, clen, step);
    step += (uint32_t)(M - 1);
    if (st == DT_OK)
        st = ring_all_gather(c, &local, r, recv, off, len, step);
    free(off);
    return st;
}

/* ---- the operations (progress thread) -------------------------------------- */

static int run_all_reduce(dt_comm_t *c, struct dt_comm_req *r, char *msg, size_t cap)
{
    const int n = c->size;
    const size_t es = r->b.esize;
    if (n == 1) {
        if (r->send != r->recv)
            memcpy(r->recv, r->send, r->b.count * es);
        return DT_OK;
    }
    if (c->n_local && !is_half(r->b.dtype))
        return run_hier_all_reduce(c, r, msg, cap);
    const ring_t g = whole_ring(c);
    uint64_t *off = malloc(sizeof(uint64_t) * 2 * (size_t)n);
    if (!off) {
        snprintf(msg, cap, "out of memory");
        return DT_ERR_NOMEM;
    }
    uint64_t *len = off + n;
    blocks_of(r->b.count, n, off, len);
    unsigned char *recv = r->recv;
    int st = ring_reduce_scatter(c, &g, r, r->b.op, n, r->send, off, len,
                                 recv + off[c->rank] * es, 0, msg, cap);
    if (st == DT_OK)
        st = ring_all_gather(c, &g, r, recv, off, len, (uint32_t)(n - 1));
    free(off);
    return st;
}

static int run_reduce_scatter(dt_comm_t *c, struct dt_comm_req *r, char *msg, size_t cap)
{
    const int n = c->size;
    if (n == 1) {
        if (r->send != r->recv)
            memmove(r->recv, r->send, r->b.count * r->b.esize);
        return DT_OK;
    }
    uint64_t *off = malloc(sizeof(uint64_t) * 2 * (size_t)n);
    if (!off) {
        snprintf(msg, cap, "out of memory");
        return DT_ERR_NOMEM;
    }
    uint64_t *len = off + n;
    for (int b = 0; b < n; b++) {
        off[b] = (uint64_t)b * r->b.count;
        len[b] = r->b.count;
    }
    const ring_t g = whole_ring(c);
    int st = ring_reduce_scatter(c, &g, r, r->b.op, n, r->send, off, len, r->recv, 0, msg, cap);
    free(off);
    return st;
}

static int run_all_gather(dt_comm_t *c, struct dt_comm_req *r, char *msg, size_t cap)
{
    const int n = c->size;
    const size_t bytes = r->b.count * r->b.esize;
    unsigned char *mine = (unsigned char *)r->recv + (size_t)c->rank * bytes;
    if (r->send != mine)
        memmove(mine, r->send, bytes);
    if (n == 1)
        return DT_OK;
    uint64_t *off = malloc(sizeof(uint64_t) * 2 * (size_t)n);
    if (!off) {
        snprintf(msg, cap, "out of memory");
        return DT_ERR_NOMEM;
    }
    uint64_t *len = off + n;
    for (int b = 0; b < n; b++) {
        off[b] = (uint64_t)b * r->b.count;
        len[b] = r->b.count;
    }
    const ring_t g = whole_ring(c);
    int st = ring_all_gather(c, &g, r, r->recv, off, len, 0);
    free(off);
    return st;
}

static int run_broadcast(dt_comm_t *c, struct dt_comm_req *r, char *msg, size_t cap)
{
    const int n = c->size;
    const uint64_t bytes = r->b.count * r->b.esize, key = coll_key(r, 0);
    if (n == 1)
        return DT_OK;
    if (c->rank != r->b.root) {
        tcp_post_t p = {.peer = r->b.root, .type = TCP_FR_COLL, .key = key, .buf = r->recv,
                        .bytes = bytes};
        return xfer(c, NULL, NULL, 0, &p, 1);
    }
    tcp_out_t *o = calloc((size_t)n, sizeof *o);
    int *to = calloc((size_t)n, sizeof *to);
    if (!o || !to) {
        free(o);
        free(to);
        snprintf(msg, cap, "out of memory");
        return DT_ERR_NOMEM;
    }
    int k = 0;
    for (int p = 1; p < n; p++) { /* nearest first along the ring */
        int q = (c->rank + p) % n;
        o[k].hdr = (tcp_frame_hdr_t){.type = TCP_FR_COLL, .key = key, .bytes = bytes};
        o[k].data = r->recv;
        to[k++] = q;
    }
    int st = xfer(c, to, o, k, NULL, 0);
    free(o);
    free(to);
    return st;
}

static int run_reduce(dt_comm_t *c, struct dt_comm_req *r, char *msg, size_t cap)
{
    const int n = c->size, root = r->b.root;
    const size_t es = r->b.esize;
    if (n == 1) {
        if (r->send != r->recv)
            memcpy(r->recv, r->send, r->b.count * es);
        return DT_OK;
    }
    uint64_t *off = malloc(sizeof(uint64_t) * 2 * (size_t)n);
    tcp_post_t *posts = calloc((size_t)n, sizeof *posts);
    void *block = NULL;
    int st = DT_OK;
    if (!off || !posts) {
        snprintf(msg, cap, "out of memory");
        st = DT_ERR_NOMEM;
        goto out;
    }
    uint64_t *len = off + n;
    blocks_of(r->b.count, n, off, len);
    unsigned char *dst;
    if (c->rank == root) {
        dst = (unsigned char *)r->recv + off[c->rank] * es;
    } else {
        uint64_t bb = len[c->rank] * es;
        block = c->host->alloc(c->host, bb ? bb : 64, DT_TAG_COMM);
        if (!block) {
            snprintf(msg, cap, "out of memory for a %llu-byte block",
                     (unsigned long long)(len[c->rank] * es));
            st = DT_ERR_NOMEM;
            goto out;
        }
        dst = block;
    }
    const ring_t g = whole_ring(c);
    st = ring_reduce_scatter(c, &g, r, r->b.op, n, r->send, off, len, dst, 0, msg, cap);
    if (st != DT_OK)
        goto out;
    uint64_t key = coll_key(r, (uint32_t)(n - 1));
    if (c->rank != root) {
        tcp_out_t o = {.hdr = {.type = TCP_FR_COLL, .key = key, .bytes = len[c->rank] * es},
                       .data = block};
        st = xfer(c, &root, &o, 1, NULL, 0);
        goto out;
    }
    int k = 0;
    for (int p = 0; p < n; p++) {
        if (p == root)
            continue;
        posts[k++] = (tcp_post_t){.peer = p, .type = TCP_FR_COLL, .key = key,
                                  .buf = (unsigned char *)r->recv + off[p] * es,
                                  .bytes = len[p] * es};
    }
    st = xfer(c, NULL, NULL, 0, posts, k);
out:
    free(off);
    free(posts);
    c->host->free(c->host, block);
    return st;
}

static int run_barrier(dt_comm_t *c, struct dt_comm_req *r)
{
    const int n = c->size;
    int st = DT_OK;
    for (uint32_t k = 0; (1 << k) < n && st == DT_OK; k++) {
        int d = 1 << k, to = (c->rank + d) % n, from = (c->rank - d + n) % n;
        uint64_t key = coll_key(r, k);
        tcp_out_t o = {.hdr = {.type = TCP_FR_COLL, .key = key}};
        tcp_post_t p = {.peer = from, .type = TCP_FR_COLL, .key = key};
        st = xfer(c, &to, &o, 1, &p, 1);
    }
    return st;
}

void tcp_run_request(dt_comm_t *c, struct dt_comm_req *r)
{
    char desc[256], text[700], msg[1024];
    tcp_req_desc(c, r, desc, sizeof desc);
    int st = tcp_group_failure(c, text, sizeof text);
    if (st != DT_OK) {
        snprintf(msg, sizeof msg, "%s: %s", desc, text);
        tcp_complete(c, r, st, msg);
        return;
    }
    if (r->b.kind == DT_COMM_OP_SEND) {
        pthread_mutex_lock(&c->mu);
        r->state = TCP_RQ_POSTED;
        pthread_mutex_unlock(&c->mu);
        r->out.hdr = (tcp_frame_hdr_t){.type = TCP_FR_P2P, .tag = r->b.tag,
                                       .bytes = r->b.count * r->b.esize};
        r->out.data = r->send;
        r->out.req = r;
        tcp_out_push(c, r->b.root, &r->out);
        return;
    }
    if (r->b.kind == DT_COMM_OP_RECV) {
        pthread_mutex_lock(&c->mu);
        r->state = TCP_RQ_POSTED;
        pthread_mutex_unlock(&c->mu);
        r->post = (tcp_post_t){.peer = r->b.root, .type = TCP_FR_P2P, .tag = r->b.tag,
                               .buf = r->recv, .bytes = r->b.count * r->b.esize, .req = r};
        tcp_post_recv(c, &r->post);
        return;
    }
    text[0] = '\0';
    if (r->b.count == 0 && r->b.kind != DT_COMM_OP_BARRIER) {
        st = DT_OK; /* synchronises nothing */
    } else {
        switch (r->b.kind) {
        case DT_COMM_OP_ALL_REDUCE: st = run_all_reduce(c, r, text, sizeof text); break;
        case DT_COMM_OP_REDUCE_SCATTER: st = run_reduce_scatter(c, r, text, sizeof text); break;
        case DT_COMM_OP_ALL_GATHER: st = run_all_gather(c, r, text, sizeof text); break;
        case DT_COMM_OP_BROADCAST: st = run_broadcast(c, r, text, sizeof text); break;
        case DT_COMM_OP_REDUCE: st = run_reduce(c, r, text, sizeof text); break;
        case DT_COMM_OP_BARRIER: st = run_barrier(c, r); break;
        default: st = DT_ERR_INVALID; snprintf(text, sizeof text, "unknown operation"); break;
        }
    }
    atomic_store(&c->waiting_on, -1);
    if (st != DT_OK && !text[0])
        tcp_group_failure(c, text, sizeof text);
    if (st != DT_OK)
        snprintf(msg, sizeof msg, "%s: %s", desc, text);
    tcp_complete(c, r, st, st == DT_OK ? NULL : msg);
}

/* ---- starting (caller's thread) ------------------------------------------- */

static int check_args(dt_comm_t *c, struct dt_comm_req *t, const void *send, const void *recv)
{
    const dt_host_v1_t *h = c->host;
    dt_comm_names_t g = names(c);
    int st = dt_creq_check_op(h, &g, &t->b);
    dt_comm_op_desc_t d = dt_creq_desc(&t->b);
    if (st == DT_OK && t->b.count > (UINT64_MAX >> 8) / (uint64_t)c->size / 8)
        st = dt_comm_op_fail(h, &g, &d, DT_ERR_UNSUPPORTED, "count %llu is too large",
                             (unsigned long long)t->b.count);
    if (st == DT_OK)
        st = dt_comm_check_args(h, &g, &d, c->rank, t->b.count, send, recv);
    if (st == DT_OK && dt_creq_is_p2p(&t->b) && t->b.root == c->rank)
        st = dt_comm_op_fail(h, &g, &d, DT_ERR_UNSUPPORTED, "the tcp communicator does not "
                             "send to this rank itself (copy the buffer instead)");
    return st;
}

static void drop_one(void *ctx, dt_creq_t *r)
{
    (void)ctx;
    free(r); /* b is first: r is the whole request */
}

int tcp_drop_live(dt_comm_t *c)
{
    return dt_creq_drop_live(&c->live, drop_one, NULL);
}

/* Before queueing: what is queued on the stream done (host-memory
 * transport), t numbered, the group not failed. */
static int start_check(dt_comm_t *c, struct dt_comm_req *t, dt_stream_t *stream)
{
    char text[700];
    int st = dt_creq_stream_sync(c->dev, stream);
    if (st != DT_OK)
        return st;
    dt_creq_number(&t->b, &c->coll_seq, &c->p2p_seq);
    st = tcp_group_failure(c, text, sizeof text);
    if (st != DT_OK) {
        dt_comm_names_t g = names(c);
        return dt_creq_refuse_broken(c->host, &g, &t->b, st, text);
    }
    return DT_OK;
}

/* The request for t on send/recv; NULL (message set) when out of memory. */
static struct dt_comm_req *req_new(dt_comm_t *c, const struct dt_comm_req *t, const void *send,
                                   void *recv)
{
    dt_comm_names_t g = names(c);
    struct dt_comm_req *r = dt_creq_new(c->host, &g, t, sizeof *r);
    if (!r)
        return NULL;
    r->send = send;
    r->recv = recv;
    r->state = TCP_RQ_QUEUED;
    r->q_next = NULL;
    return r;
}

/* Queue r for the progress thread (c->mu held). */
static void enqueue_locked(dt_comm_t *c, struct dt_comm_req *r)
{
    dt_creq_live_add(&c->live, &r->b);
    if (c->q_tail)
        c->q_tail->q_next = r;
    else
        c->q_head = r;
    c->q_tail = r;
}

/* Check, number, queue for the progress thread, and hand out the request
 * or wait for it. */
static int submit(dt_comm_t *c, struct dt_comm_req *t, const void *send, void *recv,
                  dt_stream_t *stream, dt_comm_req_t **req)
{
    if (req)
        *req = NULL;
    int st = check_args(c, t, send, recv);
    if (st == DT_OK)
        st = start_check(c, t, stream);
    if (st != DT_OK)
        return st;
    struct dt_comm_req *r = req_new(c, t, send, recv);
    if (!r)
        return DT_ERR_NOMEM;
    pthread_mutex_lock(&c->mu);
    enqueue_locked(c, r);
    pthread_mutex_unlock(&c->mu);
    tcp_wake(c);
    if (req) {
        *req = r;
        return DT_OK;
    }
    return tcp_wait(c, r, -1);
}

static struct timespec deadline_after(uint64_t ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ns += (uint64_t)ts.tv_nsec;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    return ts;
}

static int before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

int tcp_wait(dt_comm_t *c, dt_comm_req_t *r, int64_t timeout_ms)
{
    int rc = dt_comm_check_wait(c ? c->host : NULL, r);
    if (rc != DT_OK) /* a NULL c gives no host: DT_ERR_INVALID */
        return rc;
    const dt_host_v1_t *h = c->host;
    int own_limit;
    int64_t ms = dt_creq_limit_ms(timeout_ms, c->timeout_ms, TCP_TIMEOUT_MAX_MS, &own_limit);
    struct timespec end = deadline_after((uint64_t)ms * 1000000ull), now;
    char msg[1024];
    int st;
    pthread_mutex_lock(&c->mu);
    while (r->state != TCP_RQ_DONE) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (!before(&now, &end))
            break;
        pthread_cond_timedwait(&c->cv, &c->mu, &end);
    }
    if (r->state == TCP_RQ_DONE) {
        st = r->status;
        snprintf(msg, sizeof msg, "%s", r->msg);
    } else {
        /* give up: the group fails for good, the progress thread leaves
         * the operation (it no longer touches r's buffers after that) */
        char desc[256], who[200];
        tcp_req_desc(c, r, desc, sizeof desc);
        int w = atomic_load(&c->waiting_on);
        if (r->state == TCP_RQ_QUEUED && w < 0)
            snprintf(who, sizeof who, "the operations started before it");
        else if (w < 0 && dt_creq_is_p2p(&r->b))
            tcp_fmt_rank(c, r->b.root, who, sizeof who);
        else if (w < 0)
            snprintf(who, sizeof who, "the other ranks");
        else
            tcp_fmt_rank(c, w, who, sizeof who);
        dt_creq_timeout_text(desc, ms, own_limit, who, msg, sizeof msg);
        st = DT_ERR_TIMEOUT;
        tcp_mark_broken_locked(c, st, msg);
        pthread_mutex_unlock(&c->mu);
        tcp_publish_fail(c->job, TCP_FAIL_OTHER, c->job->world_rank, msg);
        tcp_wake(c);
        pthread_mutex_lock(&c->mu);
        struct timespec detach = deadline_after((uint64_t)TCP_DETACH_MS * 1000000ull);
        while (r->state != TCP_RQ_DONE) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if (!before(&now, &detach))
                break;
            pthread_cond_timedwait(&c->cv, &c->mu, &detach);
        }
        if (r->state != TCP_RQ_DONE) {
            /* still in the thread's hands: finalize frees it */
            pthread_mutex_unlock(&c->mu);
            return h->set_error(h, st, "%s", msg);
        }
    }
    dt_creq_live_remove(&c->live, &r->b);
    pthread_mutex_unlock(&c->mu);
    free(r);
    if (st != DT_OK)
        return h->set_error(h, st, "%s", msg);
    return DT_OK;
}

int tcp_test(dt_comm_t *c, dt_comm_req_t *r, int *done)
{
    int rc = dt_comm_check_test(c ? c->host : NULL, r, done);
    if (rc != DT_OK) /* a NULL c gives no host: DT_ERR_INVALID */
        return rc;
    pthread_mutex_lock(&c->mu);
    *done = r->state == TCP_RQ_DONE;
    pthread_mutex_unlock(&c->mu);
    return DT_OK;
}

/* ---- the ABI's slots --------------------------------------------------------- */

#define START(kind_, dtype_, op_, root_, tag_, count_)                            \
    struct dt_comm_req t;                                                        \
    memset(&t, 0, sizeof t);                                                     \
    t.b.kind = (kind_);                                                          \
    t.b.dtype = (dtype_);                                                        \
    t.b.op = (op_);                                                              \
    t.b.root = (root_);                                                          \
    t.b.tag = (tag_);                                                            \
    t.b.count = (count_)

int tcp_all_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count, int dtype,
                   int op, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    START(DT_COMM_OP_ALL_REDUCE, dtype, op, 0, 0, count);
    return submit(c, &t, send, recv, stream, req);
}

int tcp_reduce_scatter(dt_comm_t *c, const void *send, void *recv, uint64_t recv_count,
                       int dtype, int op, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    START(DT_COMM_OP_REDUCE_SCATTER, dtype, op, 0, 0, recv_count);
    return submit(c, &t, send, recv, stream, req);
}

int tcp_all_gather(dt_comm_t *c, const void *send, void *recv, uint64_t send_count,
                   int dtype, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    START(DT_COMM_OP_ALL_GATHER, dtype, DT_OP_SUM, 0, 0, send_count);
    return submit(c, &t, send, recv, stream, req);
}

int tcp_broadcast(dt_comm_t *c, void *buf, uint64_t count, int dtype, int32_t root,
                  dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    START(DT_COMM_OP_BROADCAST, dtype, DT_OP_SUM, root, 0, count);
    return submit(c, &t, buf, buf, stream, req);
}

int tcp_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count, int dtype,
               int op, int32_t root, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    START(DT_COMM_OP_REDUCE, dtype, op, root, 0, count);
    return submit(c, &t, send, recv, stream, req);
}

int tcp_send(dt_comm_t *c, const void *buf, uint64_t count, int dtype, int32_t peer,
             int32_t tag, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    START(DT_COMM_OP_SEND, dtype, DT_OP_SUM, peer, tag, count);
    return submit(c, &t, buf, NULL, stream, req);
}

int tcp_recv(dt_comm_t *c, void *buf, uint64_t count, int dtype, int32_t peer,
             int32_t tag, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    START(DT_COMM_OP_RECV, dtype, DT_OP_SUM, peer, tag, count);
    return submit(c, &t, NULL, buf, stream, req);
}

/* Both halves checked, then queued together: the progress thread posts
 * the send's frame and the recv's receive without waiting for either to
 * be matched, so neither half holds up the other. */
int tcp_sendrecv(dt_comm_t *c, const void *sendbuf, uint64_t send_count, void *recvbuf,
                 uint64_t recv_count, int dtype, int32_t send_peer, int32_t recv_peer,
                 int32_t send_tag, int32_t recv_tag, dt_stream_t *stream,
                 dt_comm_req_t **send_req, dt_comm_req_t **recv_req)
{
    if (!c)
        return DT_ERR_INVALID;
    int rq = dt_comm_sendrecv_reqs(c->host, send_req, recv_req);
    if (rq != DT_OK)
        return rq;
    struct dt_comm_req ts = {.b = {.kind = DT_COMM_OP_SEND, .dtype = dtype, .op = DT_OP_SUM,
                                   .root = send_peer, .tag = send_tag, .count = send_count}};
    struct dt_comm_req tr = {.b = {.kind = DT_COMM_OP_RECV, .dtype = dtype, .op = DT_OP_SUM,
                                   .root = recv_peer, .tag = recv_tag, .count = recv_count}};
    int st = check_args(c, &ts, sendbuf, NULL);
    if (st == DT_OK)
        st = check_args(c, &tr, NULL, recvbuf);
    if (st == DT_OK)
        st = start_check(c, &ts, stream);
    if (st == DT_OK)
        tr.b.seq = ++c->p2p_seq;
    if (st != DT_OK)
        return st;
    struct dt_comm_req *rs = req_new(c, &ts, sendbuf, NULL);
    struct dt_comm_req *rr = rs ? req_new(c, &tr, NULL, recvbuf) : NULL;
    if (!rr) {
        free(rs);
        return DT_ERR_NOMEM;
    }
    pthread_mutex_lock(&c->mu);
    enqueue_locked(c, rs);
    enqueue_locked(c, rr);
    pthread_mutex_unlock(&c->mu);
    tcp_wake(c);
    if (send_req) {
        *send_req = rs;
        *recv_req = rr;
        return DT_OK;
    }
    st = tcp_wait(c, rs, -1);
    int st2 = tcp_wait(c, rr, -1);
    return st != DT_OK ? st : st2;
}

int tcp_barrier(dt_comm_t *c, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    START(DT_COMM_OP_BARRIER, DT_U8, DT_OP_SUM, 0, 0, 0);
    return submit(c, &t, NULL, NULL, NULL, req);
}
