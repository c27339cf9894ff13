/*
 * plugins/tcp/tcp_engine.c - a group's progress thread: it runs the
 * group's operations in start order and is the only thread that touches
 * its sockets.  Between and during operations it polls every socket:
 * frames go out from per-peer queues, frames come in and land directly in
 * the receive posted for them (a ring step's block, a p2p recv's buffer)
 * or, when they arrive first, in a stash the receive takes them from.
 *
 * Failures: a peer's EOF or reset (or a link whose unacknowledged data
 * outlived TCP_USER_TIMEOUT) loses that peer: the job's failure is
 * published as "rank R lost: <how>" and every group of the process fails
 * its pending and later operations with it.  Each group then tells its
 * peers (a notice frame carrying the failure), so ranks that never talked
 * to the lost one fail at once too, naming it.  A frame cut in the middle
 * cannot be finished after its buffer was given back, so that socket
 * carries nothing more (no notice either) until finalize closes it.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tcp_internal.h"

/* The notice frame's payload: the failure as its publisher saw it. */
typedef struct notice {
    int32_t kind;
    int32_t world_rank;
    char reason[TCP_REASON_MAX];
} notice_t;

void tcp_wake(dt_comm_t *c)
{
    char b = 1;
    ssize_t k = write(c->wake[1], &b, 1);
    (void)k; /* full pipe: a wake is pending anyway */
}

void tcp_publish_fail(tcp_job_t *job, int kind, int32_t world_rank, const char *reason)
{
    int expect = 0;
    if (!atomic_compare_exchange_strong(&job->failed, &expect, 1))
        return;
    job->fail_kind = kind;
    job->fail_rank = world_rank;
    snprintf(job->fail_reason, sizeof job->fail_reason, "%s", reason ? reason : "");
    atomic_store(&job->failed, 2);
    /* every group of this process fails and tells its peers */
    pthread_mutex_lock(&job->mu);
    for (dt_comm_t *g = job->groups; g; g = g->job_next)
        tcp_wake(g);
    pthread_mutex_unlock(&job->mu);
}

int tcp_job_failure(dt_comm_t *c, char *buf, size_t cap)
{
    tcp_job_t *job = c->job;
    if (atomic_load(&job->failed) != 2)
        return DT_OK;
    const char *who = c->is_world ? "rank" : "world rank";
    switch (job->fail_kind) {
    case TCP_FAIL_ABORT:
        snprintf(buf, cap, "%s %d aborted: %s", who, (int)job->fail_rank, job->fail_reason);
        break;
    case TCP_FAIL_LOST:
        snprintf(buf, cap, "%s %d lost: %s", who, (int)job->fail_rank, job->fail_reason);
        break;
    default:
        snprintf(buf, cap, "%s %d failed: %s", who, (int)job->fail_rank, job->fail_reason);
        break;
    }
    return DT_ERR_REMOTE;
}

void tcp_mark_broken_locked(dt_comm_t *c, int status, const char *text)
{
    if (c->broken)
        return;
    c->broken = 1;
    c->broken_status = status;
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s", text);
}

int tcp_group_failure(dt_comm_t *c, char *buf, size_t cap)
{
    pthread_mutex_lock(&c->mu);
    int st = c->broken ? c->broken_status : DT_OK;
    if (st)
        snprintf(buf, cap, "%s", c->broken_msg);
    pthread_mutex_unlock(&c->mu);
    if (st == DT_OK)
        st = tcp_job_failure(c, buf, cap);
    return st;
}

/* ---- queues --------------------------------------------------------------- */

static void fail_peer(dt_comm_t *c, int p, const char *how);

void tcp_out_push(dt_comm_t *c, int peer, tcp_out_t *o)
{
    tcp_peer_t *pe = &c->peers[peer];
    o->next = NULL;
    o->sent = 0;
    o->done = 0;
    if (pe->fd < 0) {
        /* it left (goodbye) or was lost: the group fails, this frame
         * with it (fail_pending completes its request) */
        fail_peer(c, peer, "it left the group before this rank sent to it");
    }
    if (pe->out_tail)
        pe->out_tail->next = o;
    else
        pe->out_head = o;
    pe->out_tail = o;
}

/* Unlink o from its queue (wherever it is). */
static void out_unlink(tcp_peer_t *pe, tcp_out_t *o)
{
    tcp_out_t **pp = &pe->out_head, *prev = NULL;
    while (*pp && *pp != o) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = o->next;
    if (pe->out_tail == o)
        pe->out_tail = prev;
}

void tcp_out_forget(dt_comm_t *c, tcp_out_t *o)
{
    for (int p = 0; p < c->size; p++)
        out_unlink(&c->peers[p], o);
}

static int post_matches(const tcp_post_t *p, int peer, const tcp_frame_hdr_t *h)
{
    if (p->peer != peer || p->type != h->type)
        return 0;
    return h->type == TCP_FR_P2P ? p->tag == h->tag : p->key == h->key;
}

static void fail_post(dt_comm_t *c, tcp_post_t *p, int st, const char *fmt, uint64_t got);

/* A completed receive: its request, if any, completes. */
static void post_done(dt_comm_t *c, tcp_post_t *p)
{
    p->done = 1;
    if (p->req)
        tcp_complete(c, p->req, DT_OK, NULL);
}

void tcp_post_recv(dt_comm_t *c, tcp_post_t *p)
{
    p->next = NULL;
    p->done = 0;
    tcp_stash_t **sp = &c->stash;
    for (; *sp; sp = &(*sp)->next) {
        tcp_stash_t *s = *sp;
        if (s->claim || s->drop || !post_matches(p, s->peer, &s->hdr))
            continue;
        if (s->hdr.bytes != p->bytes) {
            fail_post(c, p, DT_ERR_INVALID, "rank sent %llu bytes", s->hdr.bytes);
            s->drop = 1; /* consumed by this receive, dropped on arrival */
            if (s->have == s->hdr.bytes) {
                *sp = s->next;
                free(s->data);
                free(s);
            }
            return;
        }
        if (s->have < s->hdr.bytes) {
            s->claim = p; /* copied in when it has arrived */
            return;
        }
        if (p->bytes)
            memcpy(p->buf, s->data, p->bytes);
        *sp = s->next;
        free(s->data);
        free(s);
        post_done(c, p);
        return;
    }
    tcp_post_t **pp = &c->posts;
    while (*pp)
        pp = &(*pp)->next;
    *pp = p;
    if (c->peers[p->peer].fd < 0)
        fail_peer(c, p->peer, "it left the group before sending what this rank waits for");
}

void tcp_unpost(dt_comm_t *c, tcp_post_t *p)
{
    for (tcp_post_t **pp = &c->posts; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    for (tcp_stash_t *s = c->stash; s; s = s->next)
        if (s->claim == p)
            s->claim = NULL;
    for (int q = 0; q < c->size; q++)
        if (c->peers[q].in_post == p) {
            c->peers[q].in_post = NULL;
            c->peers[q].in_dst = NULL; /* the rest is read and dropped */
        }
}

/* A receive whose frame had another size: a p2p recv fails alone (the
 * stream stays in step), a ring step fails the group (the ranks called
 * different collectives). */
static void fail_post(dt_comm_t *c, tcp_post_t *p, int st, const char *fmt, uint64_t got)
{
    (void)fmt;
    p->done = -st;
    p->got = got;
    char who[160], desc[256], msg[768];
    tcp_fmt_rank(c, p->peer, who, sizeof who);
    if (p->req) {
        tcp_req_desc(c, p->req, desc, sizeof desc);
        snprintf(msg, sizeof msg, "%s: %s sent %llu bytes with tag %d, the recv expects "
                 "%llu", desc, who, (unsigned long long)got, (int)p->tag,
                 (unsigned long long)p->bytes);
        tcp_complete(c, p->req, st, msg);
        return;
    }
    snprintf(msg, sizeof msg, "%s sent a %llu-byte block where this rank expects %llu "
             "(the ranks called different collectives)", who, (unsigned long long)got,
             (unsigned long long)p->bytes);
    pthread_mutex_lock(&c->mu);
    tcp_mark_broken_locked(c, st, msg);
    pthread_mutex_unlock(&c->mu);
}

/* ---- failures -------------------------------------------------------------- */

/* A receive from peer p is posted (or waits for a stashed frame). */
static int waits_for(dt_comm_t *c, int p)
{
    for (tcp_post_t *po = c->posts; po; po = po->next)
        if (po->peer == p)
            return 1;
    for (tcp_stash_t *s = c->stash; s; s = s->next)
        if (s->claim && s->peer == p)
            return 1;
    return 0;
}

/* Peer p's connection ended without a goodbye. */
static void peer_lost(dt_comm_t *c, int p, const char *how)
{
    tcp_peer_t *pe = &c->peers[p];
    if (pe->fd >= 0)
        close(pe->fd);
    pe->fd = -1;
    if (pe->bye && !waits_for(c, p))
        return; /* it left after saying goodbye, and nothing waits for it */
    fail_peer(c, p, how);
}

/* The group (and the job) fails for want of peer p. */
static void fail_peer(dt_comm_t *c, int p, const char *how)
{
    tcp_publish_fail(c->job, TCP_FAIL_LOST, c->wranks[p], how);
    char text[TCP_REASON_MAX + 64];
    tcp_job_failure(c, text, sizeof text);
    pthread_mutex_lock(&c->mu);
    tcp_mark_broken_locked(c, DT_ERR_REMOTE, text);
    pthread_mutex_unlock(&c->mu);
}

/* A request ends with the group's failure: "<op>: <text>". */
static void fail_req(dt_comm_t *c, struct dt_comm_req *r, int st, const char *text)
{
    char desc[256], msg[1024];
    tcp_req_desc(c, r, desc, sizeof desc);
    snprintf(msg, sizeof msg, "%s: %s", desc, text);
    tcp_complete(c, r, st, msg);
}

/* Once the group failed: every receive (posted, or waiting for a frame
 * still arriving) and queued frame ends with the failure, and each peer
 * is told (a notice at a frame boundary) unless a frame to it was cut in
 * the middle (then nothing more goes out on that socket). */
static void fail_pending(dt_comm_t *c, int st)
{
    char text[700];
    tcp_group_failure(c, text, sizeof text);
    while (c->posts) {
        tcp_post_t *p = c->posts;
        c->posts = p->next;
        p->done = -st;
        if (p->req)
            fail_req(c, p->req, st, text);
    }
    for (tcp_stash_t *s = c->stash; s; s = s->next) {
        /* a receive waiting for a frame still arriving fails too */
        tcp_post_t *p = s->claim;
        s->claim = NULL;
        if (!p || p->done)
            continue;
        p->done = -st;
        if (p->req)
            fail_req(c, p->req, st, text);
    }
    tcp_job_t *job = c->job;
    notice_t nt = {.kind = TCP_FAIL_NONE};
    if (atomic_load(&job->failed) == 2) {
        nt.kind = job->fail_kind;
        nt.world_rank = job->fail_rank;
        snprintf(nt.reason, sizeof nt.reason, "%s", job->fail_reason);
    }
    for (int q = 0; q < c->size; q++) {
        tcp_peer_t *pe = &c->peers[q];
        pe->in_post = NULL;
        if (pe->in_body && !pe->in_stash)
            pe->in_dst = NULL;
        int cut = pe->out_head && pe->out_head->sent > 0 &&
                  pe->out_head->sent < sizeof pe->out_head->hdr + pe->out_head->hdr.bytes;
        while (pe->out_head) {
            tcp_out_t *o = pe->out_head;
            pe->out_head = o->next;
            o->done = -1;
            if (o->owned) {
                free(o->own_data);
                free(o);
            } else if (o->req) { /* o lives in the request: last touch */
                fail_req(c, o->req, st, text);
            }
        }
        pe->out_tail = NULL;
        if (pe->fd < 0)
            continue;
        if (cut) {
            /* nothing more goes out on it; it closes at finalize, by
             * when its peer has most likely learnt the cause elsewhere
             * (closing now would name this rank as the lost one) */
            pe->cut = 1;
            continue;
        }
        if (nt.kind == TCP_FAIL_NONE)
            continue;
        tcp_out_t *o = calloc(1, sizeof *o);
        notice_t *copy = malloc(sizeof *copy);
        if (!o || !copy) {
            free(o);
            free(copy);
            continue;
        }
        *copy = nt;
        o->hdr = (tcp_frame_hdr_t){.type = TCP_FR_ABORT, .bytes = sizeof *copy};
        o->data = (const unsigned char *)copy;
        o->own_data = (unsigned char *)copy;
        o->owned = 1;
        tcp_out_push(c, q, o);
    }
}

/* ---- frames in and out ------------------------------------------------------ */

static void read_peer(dt_comm_t *c, int p);

/* Write what peer p's queue holds until the socket is full. */
static void write_peer(dt_comm_t *c, int p)
{
    tcp_peer_t *pe = &c->peers[p];
    while (pe->out_head && pe->fd >= 0 && !pe->cut) {
        tcp_out_t *o = pe->out_head;
        uint64_t total = sizeof o->hdr + o->hdr.bytes;
        while (o->sent < total) {
            ssize_t k;
            if (o->sent < sizeof o->hdr) {
                struct iovec iov[2] = {
                    {(unsigned char *)&o->hdr + o->sent, sizeof o->hdr - o->sent},
                    {(void *)o->data, o->hdr.bytes}};
                struct msghdr mh = {.msg_iov = iov, .msg_iovlen = o->hdr.bytes ? 2 : 1};
                k = sendmsg(pe->fd, &mh, MSG_NOSIGNAL);
            } else {
                uint64_t off = o->sent - sizeof o->hdr, left = o->hdr.bytes - off;
                k = send(pe->fd, o->data + off, left > (1u << 30) ? (1u << 30) : left,
                         MSG_NOSIGNAL);
            }
            if (k > 0) {
                o->sent += (uint64_t)k;
                continue;
            }
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return;
            char how[200];
            snprintf(how, sizeof how, "sending to it failed: %s",
                     k < 0 ? strerror(errno) : "nothing written");
            /* what it sent before it went (a failure's notice) first:
             * the first cause published is the one every rank names */
            read_peer(c, p);
            if (pe->fd >= 0)
                peer_lost(c, p, how);
            return;
        }
        pe->out_head = o->next;
        if (!pe->out_head)
            pe->out_tail = NULL;
        o->done = 1;
        /* a request's frame lives in the request, which its waiter may
         * free the moment it completes: nothing of o is read after */
        if (o->owned) {
            free(o->own_data);
            free(o);
        } else if (o->req) {
            tcp_complete(c, o->req, DT_OK, NULL);
        }
    }
}

/* A header arrived from peer p: where does its payload go? */
static void begin_frame(dt_comm_t *c, int p)
{
    tcp_peer_t *pe = &c->peers[p];
    tcp_frame_hdr_t *h = &pe->in_hdr;
    pe->in_body = 1;
    pe->in_have = 0;
    pe->in_dst = NULL;
    pe->in_post = NULL;
    pe->in_stash = NULL;
    if (h->type == TCP_FR_BYE) {
        pe->bye = 1;
        return;
    }
    if (h->type == TCP_FR_ABORT && h->bytes != sizeof(notice_t)) {
        peer_lost(c, p, "it sent a malformed failure notice");
        return;
    }
    if (h->type == TCP_FR_COLL || h->type == TCP_FR_P2P) {
        for (tcp_post_t **pp = &c->posts; *pp; pp = &(*pp)->next) {
            tcp_post_t *po = *pp;
            if (!post_matches(po, p, h))
                continue;
            *pp = po->next;
            if (po->bytes != h->bytes) {
                fail_post(c, po, DT_ERR_INVALID, NULL, h->bytes);
                return; /* payload dropped */
            }
            pe->in_post = po;
            pe->in_dst = po->buf;
            return;
        }
    } else if (h->type != TCP_FR_ABORT) {
        peer_lost(c, p, "it sent a frame of unknown type (not a dtrain tcp peer of this "
                        "version)");
        return;
    }
    tcp_stash_t *s = calloc(1, sizeof *s);
    unsigned char *data = h->bytes ? malloc(h->bytes) : NULL;
    if (!s || (h->bytes && !data)) {
        free(s);
        free(data);
        char msg[200];
        snprintf(msg, sizeof msg, "out of memory for a %llu-byte frame that arrived "
                 "before its receive", (unsigned long long)h->bytes);
        pthread_mutex_lock(&c->mu);
        tcp_mark_broken_locked(c, DT_ERR_NOMEM, msg);
        pthread_mutex_unlock(&c->mu);
        return;
    }
    s->peer = p;
    s->hdr = *h;
    s->data = data;
    pe->in_stash = s;
    pe->in_dst = data;
    if (h->type == TCP_FR_ABORT)
        return; /* not a stash entry: read, then published */
    tcp_stash_t **sp = &c->stash;
    while (*sp)
        sp = &(*sp)->next;
    *sp = s;
}

/* The payload from peer p is complete. */
static void end_frame(dt_comm_t *c, int p)
{
    tcp_peer_t *pe = &c->peers[p];
    pe->in_body = 0;
    pe->in_hdr_have = 0;
    if (pe->in_post) {
        tcp_post_t *po = pe->in_post;
        pe->in_post = NULL;
        po->got = pe->in_hdr.bytes;
        post_done(c, po);
        return;
    }
    tcp_stash_t *s = pe->in_stash;
    pe->in_stash = NULL;
    if (!s)
        return;
    s->have = s->hdr.bytes;
    if (s->hdr.type == TCP_FR_ABORT) {
        notice_t nt;
        memcpy(&nt, s->data, sizeof nt);
        nt.reason[sizeof nt.reason - 1] = '\0';
        if (nt.kind != TCP_FAIL_ABORT && nt.kind != TCP_FAIL_LOST)
            nt.kind = TCP_FAIL_OTHER;
        free(s->data);
        free(s);
        tcp_publish_fail(c->job, nt.kind, nt.world_rank, nt.reason);
        return;
    }
    if (!s->claim && !s->drop)
        return;
    tcp_post_t *po = s->claim;
    for (tcp_stash_t **sp = &c->stash; *sp; sp = &(*sp)->next)
        if (*sp == s) {
            *sp = s->next;
            break;
        }
    if (po && po->bytes)
        memcpy(po->buf, s->data, po->bytes);
    free(s->data);
    free(s);
    if (po && po->done == 0)
        post_done(c, po);
}

/* Read what peer p sent until the socket is empty. */
static void read_peer(dt_comm_t *c, int p)
{
    tcp_peer_t *pe = &c->peers[p];
    static unsigned char sink[65536]; /* dropped payloads (contents unused) */
    while (pe->fd >= 0) {
        ssize_t k;
        if (!pe->in_body) {
            k = recv(pe->fd, (unsigned char *)&pe->in_hdr + pe->in_hdr_have,
                     sizeof pe->in_hdr - pe->in_hdr_have, 0);
        } else {
            uint64_t left = pe->in_hdr.bytes - pe->in_have;
            if (left == 0) {
                end_frame(c, p);
                continue;
            }
            if (pe->in_dst)
                k = recv(pe->fd, pe->in_dst + pe->in_have,
                         left > (1u << 30) ? (1u << 30) : left, 0);
            else
                k = recv(pe->fd, sink, left > sizeof sink ? sizeof sink : left, 0);
        }
        if (k == 0) {
            if (pe->bye && !pe->in_body && pe->in_hdr_have == 0) {
                close(pe->fd);
                pe->fd = -1;
                if (waits_for(c, p))
                    peer_lost(c, p, "it finalized the group while this rank still waited "
                                    "for its data");
                return;
            }
            peer_lost(c, p, "it closed its connection (EOF)");
            return;
        }
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            char how[200];
            snprintf(how, sizeof how, "its connection failed: %s", strerror(errno));
            peer_lost(c, p, how);
            return;
        }
        if (!pe->in_body) {
            pe->in_hdr_have += (size_t)k;
            if (pe->in_hdr_have == sizeof pe->in_hdr)
                begin_frame(c, p);
        } else {
            pe->in_have += (uint64_t)k;
        }
    }
}

int tcp_pump(dt_comm_t *c, int ms)
{
    struct pollfd fds[1 + 256];
    int map[1 + 256];
    struct pollfd *pf = c->size + 1 <= 257 ? fds : malloc(sizeof *pf * (size_t)(c->size + 1));
    int *mp = c->size + 1 <= 257 ? map : malloc(sizeof *mp * (size_t)(c->size + 1));
    int n = 0;
    if (!pf || !mp) {
        if (pf != fds)
            free(pf);
        if (mp != map)
            free(mp);
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
        return DT_OK;
    }
    pf[n].fd = c->wake[0];
    pf[n].events = POLLIN;
    mp[n++] = -1;
    for (int p = 0; p < c->size; p++) {
        if (c->peers[p].fd < 0)
            continue;
        pf[n].fd = c->peers[p].fd;
        pf[n].events = (short)(POLLIN | (c->peers[p].out_head ? POLLOUT : 0));
        mp[n++] = p;
    }
    int k = poll(pf, (nfds_t)n, ms);
    for (int i = 0; k > 0 && i < n; i++) {
        if (!pf[i].revents)
            continue;
        if (mp[i] < 0) {
            char buf[64];
            while (read(c->wake[0], buf, sizeof buf) > 0) {
            }
            continue;
        }
        if (pf[i].revents & (POLLIN | POLLHUP | POLLERR))
            read_peer(c, mp[i]);
    }
    /* writes after every read: a peer's notice is seen before the error
     * writing to it gives */
    for (int i = 0; k > 0 && i < n; i++)
        if (mp[i] >= 0 && (pf[i].revents & POLLOUT) && c->peers[mp[i]].out_head)
            write_peer(c, mp[i]);
    if (pf != fds)
        free(pf);
    if (mp != map)
        free(mp);
    /* the job failed elsewhere (a notice, another group, an abort): this
     * group fails too, once, and tells its peers */
    char text[TCP_REASON_MAX + 64];
    int jst = tcp_job_failure(c, text, sizeof text);
    pthread_mutex_lock(&c->mu);
    if (jst != DT_OK)
        tcp_mark_broken_locked(c, jst, text);
    int st = c->broken ? c->broken_status : DT_OK;
    pthread_mutex_unlock(&c->mu);
    if (st != DT_OK && !atomic_exchange(&c->notified, 1))
        fail_pending(c, st);
    return st;
}

/* ---- the thread -------------------------------------------------------------- */

static int queues_empty(dt_comm_t *c)
{
    for (int p = 0; p < c->size; p++)
        if (c->peers[p].out_head && c->peers[p].fd >= 0 && !c->peers[p].cut)
            return 0;
    return 1;
}

void *tcp_thread_main(void *arg)
{
    dt_comm_t *c = arg;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        struct dt_comm_req *r = c->q_head;
        if (r) {
            c->q_head = r->q_next;
            if (!c->q_head)
                c->q_tail = NULL;
            r->state = TCP_RQ_RUNNING;
        }
        int stop = c->stop;
        pthread_mutex_unlock(&c->mu);
        if (r)
            tcp_run_request(c, r);
        else if (stop)
            break;
        else
            tcp_pump(c, TCP_POLL_MS);
    }
    /* Leaving: goodbyes (so peers take our EOF as the end, not a loss),
     * or the failure's notices, flushed for at most TCP_FLUSH_MS.  One
     * pump first: a failure published just before finalize queues its
     * notices there. */
    tcp_pump(c, 0);
    pthread_mutex_lock(&c->mu);
    int broken = c->broken;
    pthread_mutex_unlock(&c->mu);
    if (!broken)
        for (int p = 0; p < c->size; p++) {
            if (c->peers[p].fd < 0)
                continue;
            tcp_out_t *o = calloc(1, sizeof *o);
            if (!o)
                continue;
            o->hdr.type = TCP_FR_BYE;
            o->owned = 1;
            tcp_out_push(c, p, o);
        }
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t ms = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 +
                     (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (queues_empty(c) || ms >= TCP_FLUSH_MS)
            break;
        tcp_pump(c, 5);
    }
    return NULL;
}
