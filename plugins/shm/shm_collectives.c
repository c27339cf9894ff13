/*
 * plugins/shm/shm_collectives.c - the collectives, run by a group's
 * progress thread, one at a time, in the order they were started.
 *
 * Data moves in rounds through per-rank slots of SHM_NBUF pipeline buffers
 * (chunk bytes each).  Every round posts exactly two phases on the rank's
 * counter, A ("my buffer for this round is written") then R ("I am done
 * reading everybody's buffers of the previous round"), so all ranks agree
 * on phase numbers: round G posts 2G+1 and 2G+2, counting from the group's
 * creation.  A rank writes its buffer for round G only after every rank
 * posted R(G - SHM_NBUF + 1), i.e. finished with that buffer's previous
 * contents; with 4 buffers this rarely waits, so rounds pipeline.
 *
 * all_reduce (and reduce): each rank copies its chunk in, except its own
 * 1/N part; rank p reduces the p-th part over all slots (its own input
 * read in place), in rank order, into its own slot; then every rank copies
 * the N reduced parts out.  The copy-out of round G overlaps with the
 * copy-in of round G+1.  Every
 * output element is computed by exactly one rank in a fixed order, so all
 * ranks get the same bits.  On symmetric memory (shm_sym.c) the slots are
 * skipped: an in-place all_reduce reduces the parts from and into the
 * ranks' own copies, a reduce_scatter reads its blocks from the ranks'
 * send copies, an all_gather copies the blocks from the ranks' recv
 * copies (run_sym_*).
 */
#include <string.h>

#include "shm_internal.h"
#include "shm_msg.h"
#include "common/comm/reduce.h"
#include "shm_sync.h"

#define PH_A(G) ((uint32_t)(2u * (uint32_t)(G) + 1u))
#define PH_R(G) ((uint32_t)(2u * (uint32_t)(G) + 2u))

/* Begin round G: wait until every rank has finished reading this rank's
 * buffer (and op record) from round G - SHM_NBUF. */
static int round_begin(dt_comm_t *c, struct dt_comm_req *r, uint64_t G)
{
    if (G + 1 < SHM_NBUF)
        return DT_OK;
    return shm_wait_phase(c, r, PH_R(G + 1 - SHM_NBUF), -1);
}

static void put_desc(dt_comm_t *c, struct dt_comm_req *r, uint64_t G)
{
    shm_desc_t *d = &c->ranks[c->rank].desc[G % SHM_NBUF];
    d->kind = (uint32_t)r->b.kind;
    d->dtype = r->b.dtype;
    d->op = r->b.op;
    d->root = r->b.root;
    d->count = r->b.count;
    d->seq = r->b.seq;
    d->sym_no = r->sym ? r->sym->no : 0;
    d->sym_off = r->sym ? r->sym_off : 0;
}

/* Where an op record says its buffer lies, for messages. */
static void sym_place(const shm_desc_t *d, char *buf, size_t cap)
{
    if (d->sym_no)
        snprintf(buf, cap, "at byte %llu of symmetric allocation #%u",
                 (unsigned long long)d->sym_off, d->sym_no);
    else
        snprintf(buf, cap, "not in symmetric memory");
}

/* After the A phase of an op's first round: every rank (or `only`) must
 * be running the same collective with the same arguments. */
static int check_desc(dt_comm_t *c, struct dt_comm_req *r, uint64_t G, int only)
{
    const shm_desc_t *me = &c->ranks[c->rank].desc[G % SHM_NBUF];
    for (int p = 0; p < c->size; p++) {
        if ((only >= 0 && p != only) || p == c->rank)
            continue;
        const shm_desc_t *d = &c->ranks[p].desc[G % SHM_NBUF];
        char desc[256], who[96];
        if (d->kind == me->kind && d->dtype == me->dtype && d->op == me->op &&
            d->root == me->root && d->count == me->count) {
            if (d->sym_no == me->sym_no && d->sym_off == me->sym_off)
                continue;
            shm_req_desc(c, r, desc, sizeof desc);
            shm_fmt_rank(c, p, who, sizeof who);
            char mine[96], theirs[96];
            sym_place(me, mine, sizeof mine);
            sym_place(d, theirs, sizeof theirs);
            snprintf(r->msg, sizeof r->msg,
                     "%s: this rank's buffer is %s, %s's is %s; every rank must pass "
                     "symmetric memory at the same place of the same allocation, or none",
                     desc, mine, who, theirs);
            return DT_ERR_INVALID;
        }
        shm_req_desc(c, r, desc, sizeof desc);
        shm_fmt_rank(c, p, who, sizeof who);
        snprintf(r->msg, sizeof r->msg,
                 "%s: %s started %s #%llu (count %llu, %s, op %d, root %d) "
                 "instead; every rank must start the same collectives with "
                 "the same arguments in the same order",
                 desc, who, dt_comm_op_name((int)d->kind), (unsigned long long)d->seq,
                 (unsigned long long)d->count, dt_dtype_name(d->dtype), d->op,
                 d->root);
        return DT_ERR_INVALID;
    }
    return DT_OK;
}

/* Round G's buffer of this rank is written: publish it, with the op's
 * record on the op's first round (j == 0). */
static void round_publish(dt_comm_t *c, struct dt_comm_req *r, uint64_t G, uint64_t j)
{
    if (j == 0)
        put_desc(c, r, G);
    shm_post_phase(c, PH_A(G));
}

/* Wait until every rank (or `only`) published round G; on the op's first
 * round, check they all run this op. */
static int round_await(dt_comm_t *c, struct dt_comm_req *r, uint64_t G, uint64_t j, int only)
{
    int st = shm_wait_phase(c, r, PH_A(G), only);
    if (st == DT_OK && j == 0)
        st = check_desc(c, r, G, only);
    return st;
}

/* A one-round op's first half: begin round G, publish it with the op's
 * record, and wait until every rank did (records checked). */
static int round_meet(dt_comm_t *c, struct dt_comm_req *r, uint64_t G)
{
    int st = round_begin(c, r, G);
    if (st != DT_OK)
        return st;
    round_publish(c, r, G, 0);
    return round_await(c, r, G, 0, -1);
}

/* Done reading everybody's round-G buffers. */
static void round_end(dt_comm_t *c, uint64_t G)
{
    shm_post_phase(c, PH_R(G));
    c->round = G + 1;
}

/* First element of part p when `n` elements are split over `parts`,
 * boundaries aligned to `align` elements (64 bytes) against false sharing. */
static uint64_t part_lo(uint64_t n, int p, int parts, uint64_t align)
{
    if (p >= parts)
        return n;
    uint64_t x = n * (uint64_t)p / (uint64_t)parts;
    return x - x % align;
}

static uint64_t align_elems(size_t es) { return es >= 64 ? 1 : 64 / es; }

/* Elements per round of a reduction of `total` elements of `es` bytes.
 * Whole chunks, except for messages whose buffers on all ranks together
 * (2 x size x total bytes) are between one and two times the last-level
 * cache (c->mid_lo..c->mid_hi bytes): those go in rounds of SHM_MID_CHUNK
 * bytes, so that only that much of each rank's staging is in use and the
 * buffers keep more of the cache (2-rank f32 all_reduces of 8-16 MiB with a
 * 32 MiB L3 ran 10-15% faster in 256 KiB rounds than in 1 MiB ones; below
 * that everything fits either way and fewer rounds win, above it the data
 * streams from memory).  The same on every rank: the arguments and the
 * machine decide it. */
static uint64_t round_elems(dt_comm_t *c, uint64_t total, size_t es)
{
    uint64_t bytes = c->chunk, msg = total * es;
    if (msg >= c->mid_lo && msg <= c->mid_hi && bytes > SHM_MID_CHUNK)
        bytes = SHM_MID_CHUNK;
    return bytes / es;
}

/* all_reduce in place on symmetric memory: one round, no staging.  Once
 * every rank published A (its input is complete), rank p reduces part p
 * straight from every rank's copy, in rank order as the staged path does
 * (so both give the same bits), and writes the result into every copy;
 * each element is read and written by its part's rank only.  A rank
 * returns only after every rank posted R: nobody writes into its copy or
 * reads it any more. */
static int run_sym_all_reduce(dt_comm_t *c, struct dt_comm_req *r)
{
    const size_t es = r->b.esize;
    const int N = c->size, me = c->rank;
    const uint64_t total = r->b.count, align = align_elems(es);
    const uint64_t G = c->round;
    /* the result is read soon (the caller's next step): cached, unless all
     * copies together exceed the last-level cache (2 * mid_lo, see
     * set_mid_range in shm_comm.c) */
    const int nt = total * es > 2 * c->mid_lo;
    unsigned char *const *base = r->sym->base;
    const uint64_t off = r->sym_off;
    int st = round_meet(c, r, G);
    if (st != DT_OK)
        return st;
    const uint64_t lo = part_lo(total, me, N, align), hi = part_lo(total, me + 1, N, align);
    if (hi > lo) {
        const size_t at = off + lo * es, n = (hi - lo) * es;
        for (int p = 0; p < N; p++)
            c->srcs[p] = base[p] + at;
        const int next = (me + 1) % N;
        dt_reduce2(base[me] + at, N > 1 ? base[next] + at : NULL, c->srcs, N, hi - lo,
                   r->b.dtype, r->b.op, N, nt);
        for (int p = 0; p < N; p++)
            if (p != me && p != next)
                dt_reduce_copy_out(base[p] + at, base[me] + at, n, nt);
    }
    round_end(c, G);
    return shm_wait_phase(c, r, PH_R(G), -1);
}

/* reduce_scatter whose send buffer is symmetric memory at the same offset
 * on every rank: rank p reduces block p straight from every rank's copy,
 * in rank order as the staged path does, into its recv (which may be its
 * own block of send: each rank reads only its own block of the others'
 * copies).  A rank returns once every rank is done reading. */
static int run_sym_reduce_scatter(dt_comm_t *c, struct dt_comm_req *r)
{
    const size_t es = r->b.esize;
    const int N = c->size, me = c->rank;
    const uint64_t G = c->round, at = r->sym_off + (uint64_t)me * r->b.count * es;
    int st = round_meet(c, r, G);
    if (st != DT_OK)
        return st;
    for (int p = 0; p < N; p++)
        c->srcs[p] = r->sym->base[p] + at;
    dt_reduce(r->recv, c->srcs, N, r->b.count, r->b.dtype, r->b.op, N);
    round_end(c, G);
    return shm_wait_phase(c, r, PH_R(G), -1);
}

/* all_gather whose recv buffer is symmetric memory at the same offset on
 * every rank: each rank puts its block in place in its own copy (unless
 * send is already there), and once all did, copies every other block
 * from its owner's copy.  A rank returns once every rank is done reading
 * its block. */
static int run_sym_all_gather(dt_comm_t *c, struct dt_comm_req *r)
{
    const size_t es = r->b.esize, bytes = r->b.count * es;
    const int N = c->size, me = c->rank;
    const uint64_t G = c->round;
    unsigned char *const *base = r->sym->base;
    unsigned char *mine = base[me] + r->sym_off + (size_t)me * bytes;
    if (r->send != mine)
        memcpy(mine, r->send, bytes);
    int st = round_meet(c, r, G);
    if (st != DT_OK)
        return st;
    for (int p = 0; p < N; p++)
        if (p != me)
            memcpy(base[me] + r->sym_off + (size_t)p * bytes,
                   base[p] + r->sym_off + (size_t)p * bytes, bytes);
    round_end(c, G);
    return shm_wait_phase(c, r, PH_R(G), -1);
}

/* all_reduce (root < 0) and reduce (only `root` copies out). */
static int run_all_reduce(dt_comm_t *c, struct dt_comm_req *r, int root)
{
    const size_t es = r->b.esize;
    const int N = c->size, me = c->rank;
    const uint64_t total = r->b.count, ce_max = round_elems(c, total, es);
    const uint64_t nrounds = (total + ce_max - 1) / ce_max;
    const uint64_t align = align_elems(es);
    const unsigned char *send = r->send;
    unsigned char *recv = r->recv;
    const int out = root < 0 || root == me;
    const int nt = total * es >= DT_REDUCE_STREAM_MIN;
    const void **srcs = c->srcs;
    const uint64_t G0 = c->round;
    int st;

    for (uint64_t j = 0; j <= nrounds; j++) {
        const uint64_t G = G0 + j;
        uint64_t off = j * ce_max, ce = 0;
        if (j < nrounds) {
            ce = total - off < ce_max ? total - off : ce_max;
            if ((st = round_begin(c, r, G)) != DT_OK)
                return st;
            /* Only the parts the others reduce: ours is read in place. */
            uint64_t mlo = part_lo(ce, me, N, align), mhi = part_lo(ce, me + 1, N, align);
            unsigned char *slot = shm_slot_buf(c, me, G);
            memcpy(slot, send + off * es, mlo * es);
            memcpy(slot + mhi * es, send + (off + mhi) * es, (ce - mhi) * es);
            round_publish(c, r, G, j);
        }
        if (j > 0 && out) {
            /* Finish round j-1: copy out the parts the others reduced. */
            const uint64_t Gp = G - 1, offp = off - ce_max;
            const uint64_t cep = total - offp < ce_max ? total - offp : ce_max;
            if ((st = shm_wait_phase(c, r, PH_R(Gp), -1)) != DT_OK)
                return st;
            for (int p = 0; p < N; p++) {
                if (p == me)
                    continue;
                uint64_t lo = part_lo(cep, p, N, align), hi = part_lo(cep, p + 1, N, align);
                if (hi > lo)
                    dt_reduce_copy_out(recv + (offp + lo) * es, shm_slot_buf(c, p, Gp) + lo * es,
                                 (hi - lo) * es, nt);
            }
        }
        if (j < nrounds) {
            if ((st = round_await(c, r, G, j, -1)) != DT_OK)
                return st;
            uint64_t lo = part_lo(ce, me, N, align), hi = part_lo(ce, me + 1, N, align);
            if (hi > lo) {
                for (int p = 0; p < N; p++)
                    srcs[p] = p == me ? send + (off + lo) * es : shm_slot_buf(c, p, G) + lo * es;
                unsigned char *dst = shm_slot_buf(c, me, G) + lo * es;
                dt_reduce2(dst, out ? recv + (off + lo) * es : NULL, srcs, N, hi - lo,
                            r->b.dtype, r->b.op, N, nt);
            }
            round_end(c, G);
        }
    }
    return DT_OK;
}

/* reduce_scatter: round j moves piece j of every rank's N blocks; rank p
 * reduces the pieces of block p straight into its recv. */
static int run_reduce_scatter(dt_comm_t *c, struct dt_comm_req *r)
{
    const size_t es = r->b.esize;
    const int N = c->size, me = c->rank;
    const uint64_t rc = r->b.count, align = align_elems(es);
    uint64_t pe_max = (c->chunk / es) / (uint64_t)N;
    if (pe_max >= align)
        pe_max -= pe_max % align;
    const uint64_t nrounds = (rc + pe_max - 1) / pe_max;
    const unsigned char *send = r->send;
    unsigned char *recv = r->recv;
    const void **srcs = c->srcs;
    const uint64_t G0 = c->round;
    int st;

    for (uint64_t j = 0; j < nrounds; j++) {
        const uint64_t G = G0 + j, off = j * pe_max;
        const uint64_t pe = rc - off < pe_max ? rc - off : pe_max;
        if ((st = round_begin(c, r, G)) != DT_OK)
            return st;
        unsigned char *buf = shm_slot_buf(c, me, G);
        for (int b = 0; b < N; b++) /* our own block is read in place */
            if (b != me)
                memcpy(buf + (size_t)b * pe_max * es, send + ((uint64_t)b * rc + off) * es,
                       pe * es);
        round_publish(c, r, G, j);
        if ((st = round_await(c, r, G, j, -1)) != DT_OK)
            return st;
        for (int p = 0; p < N; p++)
            srcs[p] = p == me ? send + ((uint64_t)me * rc + off) * es
                              : shm_slot_buf(c, p, G) + (size_t)me * pe_max * es;
        dt_reduce(recv + off * es, srcs, N, pe, r->b.dtype, r->b.op, N);
        round_end(c, G);
    }
    return DT_OK;
}

static int run_all_gather(dt_comm_t *c, struct dt_comm_req *r)
{
    const size_t es = r->b.esize;
    const int N = c->size, me = c->rank;
    const uint64_t sc = r->b.count, ce_max = c->chunk / es;
    const uint64_t nrounds = (sc + ce_max - 1) / ce_max;
    const unsigned char *send = r->send;
    unsigned char *recv = r->recv;
    /* send may be our own block of recv: then it is already in place */
    const int aliased = send == recv + (uint64_t)me * sc * es;
    const int nt = (uint64_t)N * sc * es >= DT_REDUCE_STREAM_MIN;
    const uint64_t G0 = c->round;
    int st;

    for (uint64_t j = 0; j < nrounds; j++) {
        const uint64_t G = G0 + j, off = j * ce_max;
        const uint64_t ce = sc - off < ce_max ? sc - off : ce_max;
        if ((st = round_begin(c, r, G)) != DT_OK)
            return st;
        /* our own block goes to recv on the way (unless it is already there) */
        dt_reduce_copy2(shm_slot_buf(c, me, G), aliased ? NULL : recv + ((uint64_t)me * sc + off) * es,
                  send + off * es, ce * es, nt);
        round_publish(c, r, G, j);
        if ((st = round_await(c, r, G, j, -1)) != DT_OK)
            return st;
        for (int p = 0; p < N; p++)
            if (p != me)
                dt_reduce_copy_out(recv + ((uint64_t)p * sc + off) * es, shm_slot_buf(c, p, G),
                             ce * es, nt);
        round_end(c, G);
    }
    return DT_OK;
}

static int run_broadcast(dt_comm_t *c, struct dt_comm_req *r)
{
    const size_t es = r->b.esize;
    const int me = c->rank, root = r->b.root;
    const uint64_t count = r->b.count, ce_max = c->chunk / es;
    const uint64_t nrounds = (count + ce_max - 1) / ce_max;
    unsigned char *buf = r->recv;
    const int nt = count * es >= DT_REDUCE_STREAM_MIN;
    const uint64_t G0 = c->round;
    int st;

    for (uint64_t j = 0; j < nrounds; j++) {
        const uint64_t G = G0 + j, off = j * ce_max;
        const uint64_t ce = count - off < ce_max ? count - off : ce_max;
        if ((st = round_begin(c, r, G)) != DT_OK)
            return st;
        if (me == root)
            memcpy(shm_slot_buf(c, root, G), buf + off * es, ce * es);
        round_publish(c, r, G, j);
        if (me != root) {
            /* Only the root's data matters: the root runs ahead by up to
             * SHM_NBUF - 1 rounds. */
            if ((st = round_await(c, r, G, j, root)) != DT_OK)
                return st;
            dt_reduce_copy_out(buf + off * es, shm_slot_buf(c, root, G), ce * es, nt);
        }
        round_end(c, G);
    }
    return DT_OK;
}

static int run_barrier(dt_comm_t *c, struct dt_comm_req *r)
{
    const uint64_t G = c->round;
    int st = round_meet(c, r, G);
    if (st != DT_OK)
        return st;
    round_end(c, G);
    return DT_OK;
}

int shm_run_collective(dt_comm_t *c, struct dt_comm_req *r)
{
    switch (r->b.kind) {
    case DT_COMM_OP_ALL_REDUCE:
        return r->sym ? run_sym_all_reduce(c, r) : run_all_reduce(c, r, -1);
    case DT_COMM_OP_REDUCE: return run_all_reduce(c, r, r->b.root);
    case DT_COMM_OP_REDUCE_SCATTER:
        return r->sym ? run_sym_reduce_scatter(c, r) : run_reduce_scatter(c, r);
    case DT_COMM_OP_ALL_GATHER:
        return r->sym ? run_sym_all_gather(c, r) : run_all_gather(c, r);
    case DT_COMM_OP_BROADCAST: return run_broadcast(c, r);
    case DT_COMM_OP_BARRIER: return run_barrier(c, r);
    default:
        snprintf(r->msg, sizeof r->msg, "internal error: unknown collective %d", r->b.kind);
        return DT_ERR_INVALID;
    }
}
