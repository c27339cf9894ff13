/*
 * core/launch/ledger_exchange.c - the ledger exchange of
 * ledger_exchange.h: an abstract Unix socket on one node, TCP at
 * master_addr:master_port + 2 across nodes.
 *
 * A rank sends one frame: magic, its rank, the length, when it began to
 * exchange (ns, 64 bits: CLOCK_MONOTONIC on one node, CLOCK_REALTIME
 * across nodes), its bytes (little-endian).  Rank 0 answers each with the
 * verdict, how many ranks began before it, the length and the line.
 * Over TCP rank 0 first sends a challenge (a fresh nonce); the rank's
 * frame carries a nonce of its own after the header and ends with
 * HMAC-SHA256(SHA-256(job secret); "dtrain-ledger-hello", rank 0's
 * nonce, header, its nonce, bytes), and rank 0's answer ends with
 * HMAC(...; "dtrain-ledger-answer", the rank's nonce, answer) - the
 * rendezvous's proof (rendezvous.c), so neither side takes a stranger's
 * bytes or line.  Rank 0 serves every connection from one poll loop, so
 * a peer that connects and stays silent only runs out the deadline (or
 * is evicted, oldest first, when every slot is taken); lengths from the
 * socket are checked against DT_LEDGER_XCHG_MAX before a byte of the body
 * is read.
 */
#include "launch/ledger_exchange.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/sha256/sha256.h"
#include "launch/tcp_listen.h"
#include "util/error.h"
#include "util/log.h"

#define XCHG_MAGIC 0x58474c44u /* "DLGX" */
#define CONNECT_S 1.0          /* how long a refused connect is retried */
#define ANSWER_S 2.0           /* rank 0's answer to each rank */
#define HDR 20                 /* magic, rank, length, when it came (64 bits) */
#define NONCE 16
#define MAC DT_SHA256_BYTES
#define ANS 12 /* verdict, how many came before, length of the line */

static const char hello_label[] = "dtrain-ledger-hello";   /* with its NUL */
static const char answer_label[] = "dtrain-ledger-answer"; /* with its NUL */

struct dt_ledger_xchg {
    int rank, size, single;  /* single: every rank on this node */
    int tcp;                 /* across nodes: TCP at host:port */
    int listen_fd;           /* rank 0; -1 otherwise */
    struct sockaddr_un addr;
    socklen_t addr_len;
    char host[256];
    int port;
    uint8_t key[MAC]; /* SHA-256(job secret): the HMAC key (tcp) */
    const char *why;  /* no exchange: why (NULL: there is one) */
};

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int ms_until(double deadline)
{
    double left = deadline - mono_s();
    return left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t get64(const uint8_t *p) { return get32(p) | (uint64_t)get32(p + 4) << 32; }

/* When a rank began to exchange, in ns: CLOCK_MONOTONIC is one clock for
 * every process of a machine; across machines only the wall clock
 * (CLOCK_REALTIME, as well as the nodes keep it in step) compares. */
static uint64_t stamp_ns(const dt_ledger_xchg_t *x)
{
    struct timespec ts;
    clock_gettime(x->tcp ? CLOCK_REALTIME : CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* HMAC of a label, a nonce and up to three more parts. */
static void mac_of(const dt_ledger_xchg_t *x, const char *label, size_t label_bytes,
                   const uint8_t *nonce, const void *a, size_t na, const void *b, size_t nb,
                   const void *c, size_t nc, uint8_t out[MAC])
{
    const void *parts[5] = {label, nonce, a, b, c};
    size_t sizes[5] = {label_bytes, NONCE, na, nb, nc};
    dt_hmac_sha256_parts(x->key, sizeof x->key, parts, sizes, 5, out);
}

/* Rank 0 across nodes: listen on the wildcard address of the family
 * master_addr has (as the rendezvous does), so the others reach it by any
 * of its addresses. */
static int tcp_listen(dt_ledger_xchg_t *x)
{
    x->listen_fd = dt_tcp_listen_any(x->host, x->port, NULL);
    if (x->listen_fd >= 0)
        return DT_OK;
    return dt_err_set(DT_ERR_SYSTEM, "ledger exchange: rank 0 cannot listen on port %d "
                      "(master_port + 2): %s", x->port, strerror(errno));
}

int dt_ledger_xchg_open(const dt_world_t *w, dt_ledger_xchg_t **out)
{
    *out = NULL;
    dt_ledger_xchg_t *x = calloc(1, sizeof *x);
    if (!x)
        return dt_err_set(DT_ERR_NOMEM, "ledger exchange: out of memory");
    x->rank = w->rank;
    x->size = w->size;
    x->single = w->local_size == w->size;
    x->listen_fd = -1;
    if (!x->single) {
        x->tcp = 1;
        x->port = w->master_port + 2;
        snprintf(x->host, sizeof x->host, "%s", w->master_addr);
        if (!w->job_secret[0])
            x->why = "the ranks span several nodes and no job secret (DTRAIN_JOB_SECRET) "
                     "proves who is in the job";
        else if (w->master_port <= 0 || w->master_port > 65533 || !x->host[0])
            x->why = "the ranks span several nodes and there is no master_addr:master_port "
                     "to meet at";
        else
            dt_sha256(w->job_secret, strlen(w->job_secret), x->key);
        if (x->rank == 0 && !x->why && x->size > 1) {
            int rc = tcp_listen(x);
            if (rc != DT_OK) {
                free(x);
                return rc;
            }
        }
        *out = x;
        return DT_OK;
    }
    x->addr.sun_family = AF_UNIX;
    /* abstract: sun_path[0] is NUL, the name follows, no NUL counted */
    int n = snprintf(x->addr.sun_path + 1, sizeof x->addr.sun_path - 1,
                     "dtrain-ledger-%d-%s", (int)getuid(), w->job_id);
    if (n < 0 || (size_t)n >= sizeof x->addr.sun_path - 1)
        n = (int)sizeof x->addr.sun_path - 2;
    x->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    if (x->rank == 0 && x->size > 1) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&x->addr, x->addr_len) != 0 ||
            listen(fd, SOMAXCONN) != 0) {
            int e = errno;
            if (fd >= 0)
                close(fd);
            free(x);
            return dt_err_set(DT_ERR_SYSTEM, "ledger exchange: rank 0 cannot listen on the "
                              "abstract socket @dtrain-ledger-%d-%s: %s", (int)getuid(),
                              w->job_id, strerror(e));
        }
        x->listen_fd = fd;
    }
    *out = x;
    return DT_OK;
}

void dt_ledger_xchg_close(dt_ledger_xchg_t *x)
{
    if (!x)
        return;
    if (x->listen_fd >= 0)
        close(x->listen_fd);
    explicit_bzero(x->key, sizeof x->key);
    free(x);
}

/* Write or read n bytes by `deadline`: 0, or -1 (errno; ETIMEDOUT, EPIPE
 * for a peer that closed). */
static int io_all(int fd, void *buf, size_t n, int writing, double deadline)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0) {
            errno = EPIPE;
            return -1;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        struct pollfd pf = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        int ms = ms_until(deadline);
        if (ms == 0 || poll(&pf, 1, ms) == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
    }
    return 0;
}

/* Whether the process at the other end of fd runs as this user. */
static int same_user(int fd)
{
    struct ucred cr;
    socklen_t len = sizeof cr;
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) == 0 && cr.uid == getuid();
}

/* ---- rank 0 ---- */

typedef struct peer {
    int fd;
    double since;     /* when it was accepted */
    uint8_t hdr[HDR];
    size_t have;      /* header and body bytes read */
    int rank;         /* from the header; -1 before */
    uint32_t len;
    uint8_t *body;    /* tcp: its nonce, the bytes, the proof; else the bytes */
    uint8_t nonce[NONCE]; /* tcp: rank 0's challenge to it */
} peer_t;

static void peer_drop(peer_t *p)
{
    if (p->fd >= 0)
        close(p->fd);
    free(p->body);
    *p = (peer_t){.fd = -1, .rank = -1};
}

/* Bytes that follow the header: over TCP the rank's nonce and its proof
 * around the ledger. */
static size_t extra(const dt_ledger_xchg_t *x) { return x->tcp ? NONCE + MAC : 0; }

/* The ledger bytes of a whole frame. */
static const uint8_t *peer_bytes(const dt_ledger_xchg_t *x, const peer_t *p)
{
    return x->tcp ? p->body + NONCE : p->body;
}

/* Read what is there; 1: a whole frame, 0: more to come, -1: drop it
 * (-2: a whole frame whose proof of the job secret is wrong). */
static int peer_step(const dt_ledger_xchg_t *x, peer_t *p)
{
    for (;;) {
        uint8_t *dst;
        size_t want;
        if (p->have < HDR) {
            dst = p->hdr + p->have;
            want = HDR - p->have;
        } else {
            dst = p->body + (p->have - HDR);
            want = HDR + p->len + extra(x) - p->have;
        }
        if (want == 0)
            break;
        ssize_t k = recv(p->fd, dst, want, 0);
        if (k == 0)
            return -1;
        if (k < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        p->have += (size_t)k;
        if (p->have == HDR) {
            uint32_t r = get32(p->hdr + 4);
            p->len = get32(p->hdr + 8);
            if (get32(p->hdr) != XCHG_MAGIC || r == 0 || r >= (uint32_t)x->size ||
                p->len > DT_LEDGER_XCHG_MAX ||
                !(p->body = malloc(p->len + extra(x) ? p->len + extra(x) : 1)))
                return -1;
            p->rank = (int)r;
        }
    }
    if (x->tcp) {
        uint8_t mac[MAC];
        mac_of(x, hello_label, sizeof hello_label, p->nonce, p->hdr, HDR, p->body, NONCE,
               p->body + NONCE, p->len, mac);
        if (!dt_equal_ct(mac, p->body + NONCE + p->len, MAC))
            return -2;
    }
    return 1;
}

/* Over TCP: who is at the other end, for a log line. */
static void peer_name(int fd, char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            port = ntohs(a->sin6_port);
        } else if (ss.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
            port = ntohs(a->sin_port);
        }
    }
    snprintf(out, cap, "%s:%d", host, port);
}

/* A new connection into a free slot, or the slot of the oldest one that
 * has not handed over a whole frame (a silent stranger cannot keep a rank
 * out).  Over TCP it gets its challenge at once. */
static void take(dt_ledger_xchg_t *x, peer_t *peers, int maxp, peer_t **from, int fd)
{
    int slot = -1;
    for (int i = 0; i < maxp && slot < 0; i++)
        if (peers[i].fd < 0)
            slot = i;
    if (slot < 0)
        for (int i = 0; i < maxp; i++)
            if (!(peers[i].rank > 0 && from[peers[i].rank] == &peers[i]) &&
                (slot < 0 || peers[i].since < peers[slot].since))
                slot = i;
    if (slot < 0 || (!x->tcp && !same_user(fd))) {
        close(fd);
        return;
    }
    peer_drop(&peers[slot]);
    peer_t *p = &peers[slot];
    p->fd = fd;
    p->since = mono_s();
    if (x->tcp) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (getrandom(p->nonce, NONCE, 0) != NONCE ||
            io_all(fd, p->nonce, NONCE, 1, mono_s() + 0.05) != 0)
            peer_drop(p);
    }
}

static int serve(dt_ledger_xchg_t *x, const void *mine, size_t bytes, double timeout_s,
                 dt_ledger_xchg_judge_fn judge, void *ctx, char *text, size_t cap,
                 int *verdict, int *order)
{
    uint64_t t_mine = stamp_ns(x);
    int n = x->size, maxp = 2 * n + 8;
    peer_t *peers = calloc((size_t)maxp, sizeof *peers);
    peer_t **from = calloc((size_t)n, sizeof *from); /* rank -> its whole frame */
    const uint8_t **blobs = calloc((size_t)n, sizeof *blobs);
    size_t *sizes = calloc((size_t)n, sizeof *sizes);
    struct pollfd *pf = calloc((size_t)maxp + 1, sizeof *pf);
    int *which = calloc((size_t)maxp + 1, sizeof *which);
    if (!peers || !from || !blobs || !sizes || !pf || !which) {
        free(peers), free(from), free(blobs), free(sizes), free(pf), free(which);
        snprintf(text, cap, "ledger: not compared (rank 0 is out of memory)");
        return dt_err_set(DT_ERR_NOMEM, "ledger exchange: out of memory");
    }
    for (int i = 0; i < maxp; i++)
        peers[i] = (peer_t){.fd = -1, .rank = -1};
    int got = 1, refused = 0;
    double deadline = mono_s() + timeout_s;
    while (got < n) {
        int np = 0;
        pf[np] = (struct pollfd){.fd = x->listen_fd, .events = POLLIN};
        which[np++] = -1;
        for (int i = 0; i < maxp; i++)
            if (peers[i].fd >= 0 && !(peers[i].rank > 0 && from[peers[i].rank] == &peers[i])) {
                pf[np] = (struct pollfd){.fd = peers[i].fd, .events = POLLIN};
                which[np++] = i;
            }
        int ms = ms_until(deadline);
        if (ms == 0)
            break;
        if (poll(pf, (nfds_t)np, ms) < 0 && errno != EINTR)
            break;
        for (int j = 0; j < np; j++) {
            if (!pf[j].revents)
                continue;
            if (which[j] < 0) {
                int fd;
                while ((fd = accept4(x->listen_fd, NULL, NULL,
                                     SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0)
                    take(x, peers, maxp, from, fd);
                continue;
            }
            peer_t *p = &peers[which[j]];
            if (p->fd < 0)
                continue; /* evicted by a newer one in this round */
            int st = peer_step(x, p);
            if (st == -2 && refused++ == 0) {
                char who[INET6_ADDRSTRLEN + 8];
                peer_name(p->fd, who, sizeof who);
                dt_log(DT_LOG_WARN, "ledger", "refused a connection from %s: it claims rank %d "
                       "but its proof of the job secret is wrong", who, p->rank);
            }
            if (st < 0 || (st > 0 && from[p->rank])) {
                peer_drop(p); /* garbage, gone, a stranger, or a second frame for a rank */
            } else if (st > 0) {
                from[p->rank] = p;
                got++;
            }
        }
    }
    if (refused > 1)
        dt_log(DT_LOG_WARN, "ledger", "refused %d connections whose proof of the job secret "
               "was wrong", refused);
    blobs[0] = mine;
    sizes[0] = bytes;
    for (int r = 1; r < n; r++)
        if (from[r]) {
            blobs[r] = peer_bytes(x, from[r]);
            sizes[r] = from[r]->len;
        }
    *verdict = judge(ctx, blobs, sizes, n, text, cap);
    /* every rank that sent its ledger gets the line, and how many came
     * before it (a rank that failed first should exit first: the launcher
     * names the first rank that ends) */
    uint32_t tl = (uint32_t)strnlen(text, cap);
    double adl = mono_s() + ANSWER_S;
    *order = 0;
    for (int r = 1; r < n; r++)
        *order += from[r] && get64(from[r]->hdr + 12) < t_mine;
    for (int r = 1; r < n; r++) {
        if (!from[r])
            continue;
        uint64_t t = get64(from[r]->hdr + 12);
        uint32_t before = t_mine < t;
        for (int q = 1; q < n; q++)
            before += from[q] && q != r && get64(from[q]->hdr + 12) < t;
        uint8_t ans[ANS], mac[MAC];
        put32(ans, (uint32_t)*verdict);
        put32(ans + 4, before);
        put32(ans + 8, tl);
        int rc = io_all(from[r]->fd, ans, ANS, 1, adl);
        if (rc == 0)
            rc = io_all(from[r]->fd, text, tl, 1, adl);
        if (rc == 0 && x->tcp) {
            mac_of(x, answer_label, sizeof answer_label, from[r]->body, ans, ANS, text, tl,
                   NULL, 0, mac);
            (void)io_all(from[r]->fd, mac, MAC, 1, adl);
        }
    }
    for (int i = 0; i < maxp; i++)
        peer_drop(&peers[i]);
    free(peers), free(from), free(blobs), free(sizes), free(pf), free(which);
    return DT_OK;
}

/* ---- the other ranks ---- */

/* One TCP connect to rank 0 by `deadline`, every address its name
 * resolves to: the socket, or -1 (*refused: the host said no one
 * listens, worth another try while rank 0 may still be starting). */
static int tcp_connect(const dt_ledger_xchg_t *x, double deadline, int *refused)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", x->port);
    *refused = 0;
    if (getaddrinfo(x->host, port, &hints, &res) != 0)
        return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    a->ai_protocol);
        if (fd < 0)
            continue;
        int err = 0;
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS) {
                struct pollfd pf = {.fd = fd, .events = POLLOUT};
                socklen_t sl = sizeof err;
                err = ETIMEDOUT;
                if (poll(&pf, 1, ms_until(deadline)) > 0)
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl);
            }
        }
        if (err) {
            *refused |= err == ECONNREFUSED;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

static int ask(dt_ledger_xchg_t *x, const void *mine, size_t bytes, double timeout_s,
               char *text, size_t cap, int *verdict, int *order)
{
    uint64_t t_mine = stamp_ns(x);
    int fd = -1;
    /* across nodes a SYN may take a round trip or two more */
    double cdl = mono_s() + (x->tcp ? 2 * CONNECT_S : CONNECT_S);
    for (;;) {
        int again;
        if (x->tcp) {
            fd = tcp_connect(x, cdl, &again);
            if (fd >= 0)
                break;
        } else {
            fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0)
                break;
            if (connect(fd, (struct sockaddr *)&x->addr, x->addr_len) == 0)
                break;
            int e = errno;
            close(fd);
            fd = -1;
            again = e == ECONNREFUSED || e == ENOENT || e == EAGAIN;
        }
        if (!again || mono_s() >= cdl)
            break;
        struct timespec nap = {0, 20 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    if (fd < 0 || (!x->tcp && !same_user(fd))) {
        if (fd >= 0)
            close(fd);
        snprintf(text, cap, "ledger: not compared: rank 0, which compares the ledgers, is gone");
        return dt_err_set(DT_ERR_REMOTE, "ledger exchange: rank 0 is gone");
    }
    /* writes and reads below wait with a deadline, through poll */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    double deadline = mono_s() + 2 * timeout_s + 5.0;
    uint8_t hdr[HDR], ans[ANS], snonce[NONCE], cnonce[NONCE], mac[MAC];
    put32(hdr, XCHG_MAGIC);
    put32(hdr + 4, (uint32_t)x->rank);
    put32(hdr + 8, (uint32_t)bytes);
    put32(hdr + 12, (uint32_t)t_mine);
    put32(hdr + 16, (uint32_t)(t_mine >> 32));
    int rc = 0, forged = 0;
    if (x->tcp) {
        /* rank 0's challenge comes when it begins to compare */
        rc = io_all(fd, snonce, NONCE, 0, deadline);
        if (rc == 0 && getrandom(cnonce, NONCE, 0) != NONCE)
            rc = -1;
        if (rc == 0)
            mac_of(x, hello_label, sizeof hello_label, snonce, hdr, HDR, cnonce, NONCE, mine,
                   bytes, mac);
    }
    if (rc == 0)
        rc = io_all(fd, hdr, HDR, 1, deadline);
    if (rc == 0 && x->tcp)
        rc = io_all(fd, cnonce, NONCE, 1, deadline);
    if (rc == 0)
        rc = io_all(fd, (void *)mine, bytes, 1, deadline);
    if (rc == 0 && x->tcp)
        rc = io_all(fd, mac, MAC, 1, deadline);
    if (rc == 0)
        rc = io_all(fd, ans, ANS, 0, deadline);
    uint32_t tl = rc == 0 ? get32(ans + 8) : 0;
    if (rc == 0 && (tl >= cap || io_all(fd, text, tl, 0, deadline) != 0))
        rc = -1;
    if (rc == 0 && x->tcp) {
        uint8_t want[MAC];
        rc = io_all(fd, mac, MAC, 0, deadline);
        mac_of(x, answer_label, sizeof answer_label, cnonce, ans, ANS, text, tl, NULL, 0, want);
        if (rc == 0 && !dt_equal_ct(mac, want, MAC))
            rc = -1, forged = 1;
    }
    int timed_out = rc != 0 && !forged && errno == ETIMEDOUT;
    close(fd);
    if (rc != 0) {
        snprintf(text, cap, "ledger: not compared: rank 0, which compares the ledgers, %s",
                 forged      ? "did not answer (the answer failed the job secret check)"
                 : timed_out ? "did not answer in time"
                             : "is gone");
        return dt_err_set(timed_out ? DT_ERR_TIMEOUT : DT_ERR_REMOTE,
                          "ledger exchange: no answer from rank 0");
    }
    text[tl] = '\0';
    *verdict = (int)get32(ans);
    *order = (int)get32(ans + 4);
    return DT_OK;
}

int dt_ledger_xchg_run(dt_ledger_xchg_t *x, const void *mine, size_t bytes, double timeout_s,
                       dt_ledger_xchg_judge_fn judge, void *ctx, char *text, size_t cap,
                       int *verdict, int *order)
{
    *verdict = -1;
    *order = 0;
    if (cap)
        text[0] = '\0';
    if (!x || x->size < 2 || x->why || bytes > DT_LEDGER_XCHG_MAX || cap < 64) {
        if (cap)
            snprintf(text, cap, "ledger: not compared (%s)",
                     x && x->why ? x->why : "no exchange here");
        return dt_err_set(DT_ERR_UNSUPPORTED, "ledger exchange: not supported here");
    }
    if (x->rank == 0)
        return serve(x, mine, bytes, timeout_s, judge, ctx, text, cap, verdict, order);
    return ask(x, mine, bytes, timeout_s, text, cap, verdict, order);
}
