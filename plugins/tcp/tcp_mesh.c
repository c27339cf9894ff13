/*
 * plugins/tcp/tcp_mesh.c - how a group's ranks find and trust each other:
 * the address this process listens on, the listener, and the mesh of
 * sockets (one per pair of ranks) with the handshake on each.
 *
 * The mesh: rank r connects to every rank below it and accepts every rank
 * above it; the listeners' addresses came from the job's rendezvous
 * (bootstrap_all_gather) or, for a split, from the parent group.
 *
 * The handshake proves both ends hold the job's key (SHA-256 of
 * DTRAIN_JOB_SECRET, or of the job id when the job has no secret) without
 * sending it, as the core's rendezvous does: the acceptor sends a fresh
 * nonce; the connector answers with its rank, a nonce of its own and
 * HMAC(key, "dtrain-tcp-hello", job id, group, both nonces, its rank);
 * the acceptor checks it and answers HMAC(key, "dtrain-tcp-ack", ... its
 * rank), which the connector checks.  A connection that cannot prove the
 * key (another job, a port scanner) is closed and logged, never counted.
 * The acceptor serves every incoming connection at once from one poll
 * loop, each with TCP_HANDSHAKE_MS to prove itself (garbage is dropped at
 * its first wrong byte); at most TCP_PENDING_MAX are unproven, and a
 * newcomer evicts the oldest rather than being refused, so silent
 * connections cannot hold up a real rank.  Drops are logged a few lines
 * per window, then counted (droplog_t).  A hello whose proof of the key is
 * wrong is answered with TCP_REFUSED_SECRET instead of an ack: the
 * connector fails at once naming DTRAIN_JOB_SECRET, and the acceptor's
 * timeout names where the wrong proof came from.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tcp_internal.h"

#define HS_MAGIC "DTTCP01"   /* 8 bytes with its NUL */
#define NONCE_BYTES 16
/* Unproven incoming connections held at once (at most a quarter of the
 * open-file limit); one more evicts the oldest. */
#define TCP_PENDING_MAX 256
/* Drops logged one by one per window, the rest counted in one line. */
#define TCP_LOG_BURST 5
#define TCP_LOG_WINDOW_MS 10000

/* What the acceptor sends instead of its ack when the hello's proof of the
 * key is wrong (32 bytes, as an ack; no HMAC is this text). */
static const uint8_t refused_secret[DT_SHA256_BYTES] = "DTTCP01 refused: job secret";

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- addresses ----------------------------------------------------------- */

static void ip_from_sockaddr(const struct sockaddr *sa, tcp_ip_t *out)
{
    memset(out, 0, sizeof *out);
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)(const void *)sa;
        out->family = AF_INET6;
        out->scope = s6->sin6_scope_id;
        memcpy(out->bytes, &s6->sin6_addr, 16);
    } else {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)(const void *)sa;
        out->family = AF_INET;
        memcpy(out->bytes, &s4->sin_addr, 4);
    }
}

/* The port of a socket address (host order). */
static uint16_t sockaddr_port(const struct sockaddr_storage *ss)
{
    return ntohs(ss->ss_family == AF_INET6
                     ? ((const struct sockaddr_in6 *)(const void *)ss)->sin6_port
                     : ((const struct sockaddr_in *)(const void *)ss)->sin_port);
}

/* ip:port as a socket address; its length. */
static socklen_t ip_sockaddr(const tcp_ip_t *ip, uint16_t port, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof *ss);
    if (ip->family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)(void *)ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(port);
        s6->sin6_scope_id = ip->scope;
        memcpy(&s6->sin6_addr, ip->bytes, 16);
        return sizeof *s6;
    }
    struct sockaddr_in *s4 = (struct sockaddr_in *)(void *)ss;
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    memcpy(&s4->sin_addr, ip->bytes, 4);
    return sizeof *s4;
}

void tcp_ip_text(const tcp_ip_t *ip, char *buf, size_t cap)
{
    char t[INET6_ADDRSTRLEN] = "?";
    if (ip->family == AF_INET6) {
        inet_ntop(AF_INET6, ip->bytes, t, sizeof t);
        if (ip->scope)
            snprintf(buf, cap, "[%s%%%u]", t, (unsigned)ip->scope);
        else
            snprintf(buf, cap, "[%s]", t);
    } else {
        inet_ntop(AF_INET, ip->bytes, t, sizeof t);
        snprintf(buf, cap, "%s", t);
    }
}

int tcp_pick_addr(const dt_host_v1_t *h, const char *cfg_addr, const char *master_addr,
                  int32_t master_port, tcp_ip_t *out)
{
    memset(out, 0, sizeof *out);
    if (cfg_addr && cfg_addr[0]) {
        /* a numeric address of either family (an IPv6 one may carry a
         * scope: fe80::1%eth0) */
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                                 .ai_flags = AI_NUMERICHOST}, *ai = NULL;
        if (getaddrinfo(cfg_addr, NULL, &hints, &ai) != 0 || !ai)
            return h->set_error(h, DT_ERR_CONFIG, "[tcp] address = '%s' is not an IPv4 or "
                                "IPv6 address (10.0.0.1, fd00::1)", cfg_addr);
        ip_from_sockaddr(ai->ai_addr, out);
        freeaddrinfo(ai);
        return DT_OK;
    }
    out->family = AF_INET;
    const uint32_t lo = htonl(INADDR_LOOPBACK);
    memcpy(out->bytes, &lo, 4);
    if (!master_addr || !master_addr[0])
        return DT_OK;
    /* The address this host's route to the master leaves from: the one
     * the other nodes reach it by (a UDP connect sends nothing); of the
     * master's family, so an IPv6 master gives an IPv6 mesh. */
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM}, *ai = NULL;
    int gai = getaddrinfo(master_addr, NULL, &hints, &ai);
    if (gai != 0 || !ai)
        return h->set_error(h, DT_ERR_CONFIG, "init: cannot resolve master address '%s': %s "
                            "(set [tcp] address to this node's address)", master_addr,
                            gai_strerror(gai));
    tcp_ip_t master;
    ip_from_sockaddr(ai->ai_addr, &master);
    freeaddrinfo(ai);
    struct sockaddr_storage sa, me;
    socklen_t sl = ip_sockaddr(&master, (uint16_t)(master_port > 0 ? master_port : 9), &sa);
    int fd = socket(master.family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    socklen_t len = sizeof me;
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sl) != 0 ||
        getsockname(fd, (struct sockaddr *)&me, &len) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return h->set_error(h, DT_ERR_SYSTEM, "init: no route to master address '%s': %s "
                            "(set [tcp] address to this node's address)", master_addr,
                            strerror(e));
    }
    close(fd);
    ip_from_sockaddr((struct sockaddr *)&me, out);
    return DT_OK;
}

int tcp_listen(const dt_host_v1_t *h, const char *gname, tcp_ip_t addr, int *fd,
               uint16_t *port)
{
    char ip[TCP_IP_TEXT];
    tcp_ip_text(&addr, ip, sizeof ip);
    struct sockaddr_storage sa;
    socklen_t sl = ip_sockaddr(&addr, 0, &sa), len = sizeof sa;
    int s = socket(addr.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0 || bind(s, (struct sockaddr *)&sa, sl) != 0 || listen(s, SOMAXCONN) != 0 ||
        getsockname(s, (struct sockaddr *)&sa, &len) != 0) {
        int e = errno;
        if (s >= 0)
            close(s);
        return h->set_error(h, DT_ERR_SYSTEM, "init: group %s: cannot listen on %s: %s",
                            gname, ip, strerror(e));
    }
    *fd = s;
    *port = sockaddr_port(&sa);
    return DT_OK;
}

static int same_ip(const tcp_ip_t *a, const tcp_ip_t *b)
{
    return a->family == b->family && a->scope == b->scope &&
           memcmp(a->bytes, b->bytes, a->family == AF_INET6 ? 16 : 4) == 0;
}

int tcp_find_nodes(dt_comm_t *c, const tcp_ip_t *addrs, int want)
{
    const int n = c->size;
    c->n_local = c->n_cross = 0;
    if (!want || n < 4)
        return DT_OK;
    int32_t *node = malloc(sizeof(int32_t) * (size_t)n * 3); /* node id of each rank */
    if (!node)
        return DT_ERR_NOMEM;
    int32_t *count = node + n, *first = node + 2 * n, m = 0;
    for (int p = 0; p < n; p++) {
        int q = 0;
        while (q < p && !same_ip(&addrs[q], &addrs[p]))
            q++;
        node[p] = q < p ? node[q] : m++;
        if (q == p) {
            first[node[p]] = p;
            count[node[p]] = 0;
        }
        count[node[p]]++;
    }
    const int32_t L = count[node[c->rank]];
    int uniform = m >= 2 && L >= 2;
    for (int k = 0; k < m && uniform; k++)
        uniform = count[k] == L;
    if (uniform) {
        c->local = malloc(sizeof(int32_t) * (size_t)L);
        c->cross = malloc(sizeof(int32_t) * (size_t)m);
        if (!c->local || !c->cross) {
            free(node);
            return DT_ERR_NOMEM;
        }
        /* local: this node's ranks in rank order; cross: the rank of each
         * node (in order of their first rank) at this rank's local index */
        int li = 0;
        for (int p = 0; p < n; p++)
            if (node[p] == node[c->rank]) {
                if (p == c->rank)
                    c->local_idx = li;
                c->local[li++] = p;
            }
        for (int k = 0; k < m; k++) {
            int seen = 0;
            for (int p = first[k]; p < n; p++)
                if (node[p] == k && seen++ == c->local_idx) {
                    c->cross[k] = p;
                    break;
                }
            if (c->cross[k] == c->rank)
                c->cross_idx = k;
        }
        c->n_local = L;
        c->n_cross = m;
    }
    free(node);
    return DT_OK;
}

void tcp_sock_setup(int fd, int64_t sock_buf, int64_t timeout_ms)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (sock_buf > 0) {
        int b = sock_buf > (1 << 30) ? (1 << 30) : (int)sock_buf;
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof b);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof b);
    }
    /* unacknowledged data older than half the comm timeout fails the
     * connection (a link taken down ends in an error naming the peer
     * across it, before the waits of ranks that wait on a rank that waits
     * on it run out and name their neighbour instead; the half spans a
     * peer whose progress thread stalls for a while: it reads, and so
     * acknowledges, whatever it computes) */
    int64_t half = timeout_ms / 2 > 1000 ? timeout_ms / 2 : timeout_ms;
    unsigned ut = half > 0x7fffffff ? 0x7fffffffu : (unsigned)half;
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
    /* and an idle connection is probed after a quarter of it, so a link
     * that died under a rank waiting to RECEIVE fails that socket too
     * (with TCP_USER_TIMEOUT set, the kernel ends a connection whose
     * probes go unanswered for that long): every rank with a peer across
     * the dead link names that peer, whichever rank it waits for */
    int idle = (int)(timeout_ms / 4000 > 0 ? (timeout_ms / 4000 < 3600 ? timeout_ms / 4000 : 3600) : 1);
    int intvl = 1, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Move n bytes on a nonblocking socket before `deadline` (ms, now_ms's
 * clock).  0 done, ETIMEDOUT, or an errno (EPIPE for a peer's EOF). */
static int io_full(int fd, void *buf, size_t n, int writing, int64_t deadline)
{
    unsigned char *p = buf;
    while (n) {
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0)
            return EPIPE;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno;
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return ETIMEDOUT;
        struct pollfd pf = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        poll(&pf, 1, left > 100 ? 100 : (int)left);
    }
    return 0;
}

static void mac_of(const tcp_job_t *job, const char *label, const char *gname,
                   const uint8_t *na, const uint8_t *nc, int32_t rank,
                   uint8_t out[DT_SHA256_BYTES])
{
    const void *parts[6] = {label, job->job_id, gname, na, nc, &rank};
    size_t sizes[6] = {strlen(label) + 1, strlen(job->job_id) + 1, strlen(gname) + 1,
                       NONCE_BYTES, NONCE_BYTES, sizeof rank};
    dt_hmac_sha256_parts(job->key, sizeof job->key, parts, sizes, 6, out);
}

static int fresh_nonce(uint8_t *n)
{
    return getrandom(n, NONCE_BYTES, 0) == NONCE_BYTES ? 0 : errno ? errno : EIO;
}

typedef struct hello {
    char magic[8];
    int32_t rank;
    uint8_t nonce[NONCE_BYTES];
    uint8_t mac[DT_SHA256_BYTES];
} hello_t;

typedef struct challenge {
    char magic[8];
    uint8_t nonce[NONCE_BYTES];
} challenge_t;

/* Connector side: 0, or -1 with a text in why (-2: the peer refused this
 * rank's proof of the key). */
static int hs_connect(dt_comm_t *c, int fd, int peer, int64_t deadline, char *why, size_t cap)
{
    challenge_t ch;
    hello_t he = {.rank = c->rank};
    uint8_t ack[DT_SHA256_BYTES], want[DT_SHA256_BYTES];
    int e = io_full(fd, &ch, sizeof ch, 0, deadline);
    if (e) {
        snprintf(why, cap, "reading its challenge: %s", strerror(e));
        return -1;
    }
    if (memcmp(ch.magic, HS_MAGIC, 8) != 0) {
        snprintf(why, cap, "it is not a dtrain tcp listener (bad magic)");
        return -1;
    }
    memcpy(he.magic, HS_MAGIC, 8);
    if ((e = fresh_nonce(he.nonce)) != 0) {
        snprintf(why, cap, "no random bytes: %s", strerror(e));
        return -1;
    }
    mac_of(c->job, "dtrain-tcp-hello", c->gname, ch.nonce, he.nonce, c->rank, he.mac);
    if ((e = io_full(fd, &he, sizeof he, 1, deadline)) != 0 ||
        (e = io_full(fd, ack, sizeof ack, 0, deadline)) != 0) {
        snprintf(why, cap, "%s (it refuses a peer that cannot prove the job's secret)",
                 e == EPIPE ? "it closed the connection" : strerror(e));
        return -1;
    }
    if (memcmp(ack, refused_secret, sizeof ack) == 0) {
        snprintf(why, cap, "it refused this rank's proof of the job secret: DTRAIN_JOB_SECRET "
                 "on this node differs from its node's");
        return -2;
    }
    mac_of(c->job, "dtrain-tcp-ack", c->gname, ch.nonce, he.nonce, peer, want);
    if (!dt_equal_ct(ack, want, sizeof ack)) {
        snprintf(why, cap, "it could not prove the job's secret");
        return -1;
    }
    return 0;
}

/* Connect to peer p's listener, retrying refusals until the deadline:
 * the socket, or -1 (*secret: the peer refused this rank's proof). */
static int connect_peer(dt_comm_t *c, int p, const tcp_ip_t *addr, uint16_t port,
                        int64_t deadline, char *why, size_t cap, int *secret)
{
    char last[200] = "";
    struct sockaddr_storage sa;
    const socklen_t sl = ip_sockaddr(addr, port, &sa);
    for (;;) {
        int fd = socket(addr->family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            snprintf(why, cap, "socket: %s", strerror(errno));
            return -1;
        }
        int rc = connect(fd, (struct sockaddr *)&sa, sl), e = rc == 0 ? 0 : errno;
        if (e == EINPROGRESS) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int64_t left = deadline - now_ms();
            if (poll(&pf, 1, left > 0 ? (int)(left > 1000 ? 1000 : left) : 0) == 1) {
                socklen_t l = sizeof e;
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l);
            } else {
                e = ETIMEDOUT;
            }
        }
        if (e == 0) {
            int hs = hs_connect(c, fd, p, deadline, why, cap);
            if (hs == 0)
                return fd;
            *secret = hs == -2;
            close(fd);
            return -1;
        }
        close(fd);
        snprintf(last, sizeof last, "%s", strerror(e));
        if (now_ms() >= deadline) {
            snprintf(why, cap, "connecting: %s", last);
            return -1;
        }
        struct timespec nap = {0, 20000000};
        nanosleep(&nap, NULL);
    }
}

/* ---- the acceptor ---------------------------------------------------------- */

/* The log of dropped connections, bounded: TCP_LOG_BURST lines a window of
 * TCP_LOG_WINDOW_MS, the rest counted in one line when it ends (or the
 * accept loop does). */
typedef struct droplog {
    int64_t start;         /* the window's first drop (ms); 0: none open */
    unsigned logged, held;
    char last_from[TCP_IP_TEXT + 8], last_why[200];
} droplog_t;

static void drop_flush(dt_comm_t *c, droplog_t *d, int64_t now)
{
    if (d->held)
        c->host->log(c->host, DT_LOG_WARN, "group %s: dropped %u more connection%s that did "
                     "not prove the job's secret in the last %.1f s (the last from %s: %s)",
                     c->gname, d->held, d->held == 1 ? "" : "s", (double)(now - d->start) / 1e3,
                     d->last_from, d->last_why);
    d->start = 0;
    d->logged = d->held = 0;
}

static void drop_tick(dt_comm_t *c, droplog_t *d, int64_t now)
{
    if (d->start > 0 && now - d->start >= TCP_LOG_WINDOW_MS)
        drop_flush(c, d, now);
}

/* An incoming connection that has not proved itself yet. */
typedef struct pending {
    int fd;            /* -1: a free slot */
    int64_t since, deadline;
    challenge_t ch;
    hello_t he;
    size_t got;        /* bytes of the hello read */
    char from[TCP_IP_TEXT + 8];
} pending_t;

typedef struct acceptor {
    dt_comm_t *c;
    int listen_fd;
    pending_t *pend;   /* [cap] */
    int cap, n;
    struct pollfd *pf; /* [1 + cap] */
    int64_t pause_until; /* out of file descriptors: accept again then */
    droplog_t drops;
    char bad_from[TCP_IP_TEXT + 8]; /* the last hello that failed the key */
    int32_t bad_rank;
} acceptor_t;

static void drop(acceptor_t *A, pending_t *q, const char *why)
{
    droplog_t *d = &A->drops;
    int64_t now = now_ms();
    drop_tick(A->c, d, now);
    if (d->start == 0)
        d->start = now;
    if (d->logged < TCP_LOG_BURST) {
        d->logged++;
        A->c->host->log(A->c->host, DT_LOG_WARN, "group %s: refused a connection from %s: %s%s",
                        A->c->gname, q->from, why,
                        d->logged == TCP_LOG_BURST ? " (further refusals in the next 10 s are "
                                                     "counted, not logged one by one)" : "");
    } else {
        d->held++;
        snprintf(d->last_from, sizeof d->last_from, "%s", q->from);
        snprintf(d->last_why, sizeof d->last_why, "%s", why);
    }
    close(q->fd);
    q->fd = -1;
    A->n--;
}

/* The pending connection a newcomer replaces: the oldest that sent
 * nothing, else the oldest. */
static pending_t *evictee(acceptor_t *A)
{
    pending_t *silent = NULL, *any = NULL;
    for (int i = 0; i < A->cap; i++) {
        pending_t *q = &A->pend[i];
        if (q->fd < 0)
            continue;
        if (!any || q->since < any->since)
            any = q;
        if (q->got == 0 && (!silent || q->since < silent->since))
            silent = q;
    }
    return silent ? silent : any;
}

/* Accept a batch of newcomers; each gets a slot and a challenge. */
static void accept_some(acceptor_t *A)
{
    for (int k = 0; k < 64; k++) {
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        int fd = accept4(A->listen_fd, (struct sockaddr *)&from, &fl,
                         SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE) && A->n > 0) {
            drop(A, evictee(A), "this rank ran out of file descriptors and a newer "
                                "connection came (this one was the oldest unproven)");
            continue;
        }
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                A->pause_until = now_ms() + 10;
            return;
        }
        if (A->n == A->cap) {
            char why[160];
            snprintf(why, sizeof why, "%d connections had not proved the job's secret and a "
                     "newer one came (this one was the oldest)", A->cap);
            drop(A, evictee(A), why);
        }
        pending_t *q = NULL;
        for (int i = 0; i < A->cap && !q; i++)
            if (A->pend[i].fd < 0)
                q = &A->pend[i];
        if (!q) { /* (cannot be: a slot was just given up) */
            close(fd);
            return;
        }
        memset(q, 0, sizeof *q);
        q->fd = fd;
        A->n++;
        tcp_ip_t ip;
        char t[TCP_IP_TEXT];
        ip_from_sockaddr((struct sockaddr *)&from, &ip);
        tcp_ip_text(&ip, t, sizeof t);
        snprintf(q->from, sizeof q->from, "%s:%u", t, (unsigned)sockaddr_port(&from));
        q->since = now_ms();
        q->deadline = q->since + TCP_HANDSHAKE_MS;
        memcpy(q->ch.magic, HS_MAGIC, 8);
        int e = fresh_nonce(q->ch.nonce);
        /* a fresh socket's send buffer takes the 24 bytes at once */
        if (e || send(fd, &q->ch, sizeof q->ch, MSG_NOSIGNAL) != (ssize_t)sizeof q->ch)
            drop(A, q, "could not send it a challenge");
    }
}

/* Read what pending q has of its hello; judge it when complete. */
static void read_hello(acceptor_t *A, pending_t *q)
{
    dt_comm_t *c = A->c;
    ssize_t k = recv(q->fd, (uint8_t *)&q->he + q->got, sizeof q->he - q->got, 0);
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (k <= 0) {
        char why[120];
        snprintf(why, sizeof why, "no hello: %s", k == 0 ? "closed" : strerror(errno));
        drop(A, q, why);
        return;
    }
    q->got += (size_t)k;
    size_t m = q->got < 8 ? q->got : 8;
    if (memcmp(q->he.magic, HS_MAGIC, m) != 0) { /* garbage: judged at once */
        drop(A, q, "not a dtrain tcp peer (bad magic)");
        return;
    }
    if (q->got < sizeof q->he)
        return;
    uint8_t want[DT_SHA256_BYTES], ack[DT_SHA256_BYTES];
    mac_of(c->job, "dtrain-tcp-hello", c->gname, q->ch.nonce, q->he.nonce, q->he.rank, want);
    if (!dt_equal_ct(q->he.mac, want, sizeof want)) {
        /* a dtrain rank with another secret, most likely: tell it (it
         * learns nothing it did not know), remember it for the timeout */
        ssize_t w = send(q->fd, refused_secret, sizeof refused_secret, MSG_NOSIGNAL);
        (void)w;
        snprintf(A->bad_from, sizeof A->bad_from, "%s", q->from);
        A->bad_rank = q->he.rank;
        char why[200];
        snprintf(why, sizeof why, "it claims rank %d but its proof of the job's secret is "
                 "wrong (DTRAIN_JOB_SECRET differs on its node, or it is another job's rank)",
                 (int)q->he.rank);
        drop(A, q, why);
        return;
    }
    const int p = q->he.rank;
    char why[160];
    if (p <= c->rank || p >= c->size) {
        snprintf(why, sizeof why, "it claims rank %d, which does not connect to rank %d", p,
                 (int)c->rank);
        drop(A, q, why);
        return;
    }
    if (c->peers[p].fd >= 0) {
        snprintf(why, sizeof why, "rank %d is connected already", p);
        drop(A, q, why);
        return;
    }
    mac_of(c->job, "dtrain-tcp-ack", c->gname, q->ch.nonce, q->he.nonce, c->rank, ack);
    if (send(q->fd, ack, sizeof ack, MSG_NOSIGNAL) != (ssize_t)sizeof ack) {
        snprintf(why, sizeof why, "answering: %s", strerror(errno));
        drop(A, q, why);
        return;
    }
    c->peers[p].fd = q->fd; /* proven: filed under its rank */
    q->fd = -1;
    A->n--;
}

/* The timeout of the accept loop: the ranks that never connected. */
static int accept_timeout(acceptor_t *A, int64_t timeout_ms)
{
    dt_comm_t *c = A->c;
    const dt_host_v1_t *h = c->host;
    int *list = malloc(sizeof(int) * (size_t)c->size), n = 0;
    for (int p = c->rank + 1; list && p < c->size; p++)
        if (c->peers[p].fd < 0)
            list[n++] = p;
    dt_comm_names_t g = {.gname = c->gname, .is_world = c->is_world, .size = c->size,
                         .wranks = c->wranks};
    char ranks[300] = "some ranks", bad[300] = "";
    if (list)
        dt_comm_fmt_ranks(&g, list, n, ranks, sizeof ranks);
    free(list);
    if (A->bad_from[0])
        snprintf(bad, sizeof bad, "; a connection from %s claiming rank %d failed the job "
                 "secret check: is DTRAIN_JOB_SECRET the same on every node?",
                 A->bad_from, (int)A->bad_rank);
    return h->set_error(h, DT_ERR_TIMEOUT, "init: group %s: timed out after %.1f s waiting "
                        "for %s to connect%s", c->gname, (double)timeout_ms / 1000.0, ranks,
                        bad);
}

/* Serve the listener until every higher rank connected and proved itself
 * (c->peers filled), or the deadline. */
static int accept_peers(dt_comm_t *c, int listen_fd, int64_t deadline, int64_t timeout_ms)
{
    acceptor_t A = {.c = c, .listen_fd = listen_fd, .cap = TCP_PENDING_MAX};
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur / 4 < (rlim_t)A.cap)
        A.cap = rl.rlim_cur / 4 < 8 ? 8 : (int)(rl.rlim_cur / 4);
    A.pend = malloc(sizeof *A.pend * (size_t)A.cap);
    A.pf = malloc(sizeof *A.pf * (1 + (size_t)A.cap));
    pending_t **who = malloc(sizeof *who * (1 + (size_t)A.cap));
    if (!A.pend || !A.pf || !who) {
        free(A.pend);
        free(A.pf);
        free(who);
        return c->host->set_error(c->host, DT_ERR_NOMEM, "init: group %s: the accept loop",
                                  c->gname);
    }
    for (int i = 0; i < A.cap; i++)
        A.pend[i].fd = -1;
    int rc = DT_OK;
    for (;;) {
        int missing = 0;
        for (int p = c->rank + 1; p < c->size; p++)
            missing += c->peers[p].fd < 0;
        if (missing == 0)
            break;
        int64_t now = now_ms();
        if (now >= deadline) {
            rc = accept_timeout(&A, timeout_ms);
            break;
        }
        drop_tick(c, &A.drops, now);
        int64_t wake = deadline;
        int np = 0;
        if (now >= A.pause_until) {
            A.pf[np] = (struct pollfd){.fd = listen_fd, .events = POLLIN};
            who[np++] = NULL;
        } else if (A.pause_until < wake) {
            wake = A.pause_until;
        }
        for (int i = 0; i < A.cap; i++) {
            pending_t *q = &A.pend[i];
            if (q->fd < 0)
                continue;
            if (now >= q->deadline) {
                char why[80];
                snprintf(why, sizeof why, "no hello within %.1f s", TCP_HANDSHAKE_MS / 1000.0);
                drop(&A, q, why);
                continue;
            }
            if (q->deadline < wake)
                wake = q->deadline;
            A.pf[np] = (struct pollfd){.fd = q->fd, .events = POLLIN};
            who[np++] = q;
        }
        if (A.drops.held && A.drops.start + TCP_LOG_WINDOW_MS < wake)
            wake = A.drops.start + TCP_LOG_WINDOW_MS;
        int64_t left = wake - now;
        if (poll(A.pf, (nfds_t)np, left > 0 ? (int)(left > 1000 ? 1000 : left) : 0) < 0 &&
            errno != EINTR) {
            rc = c->host->set_error(c->host, DT_ERR_SYSTEM, "init: group %s: poll: %s",
                                    c->gname, strerror(errno));
            break;
        }
        for (int i = 0; i < np; i++) {
            pending_t *q = who[i];
            if (!A.pf[i].revents || (q && q->fd != A.pf[i].fd))
                continue; /* (a slot given up and reused in this round) */
            if (!q)
                accept_some(&A);
            else
                read_hello(&A, q);
        }
    }
    for (int i = 0; i < A.cap; i++)
        if (A.pend[i].fd >= 0)
            drop(&A, &A.pend[i], "the group formed (or failed) before it proved anything");
    drop_flush(c, &A.drops, now_ms());
    free(A.pend);
    free(A.pf);
    free(who);
    return rc;
}

int tcp_mesh_connect(dt_comm_t *c, int listen_fd, const tcp_ip_t *addrs,
                     const uint16_t *ports, int64_t timeout_ms)
{
    const dt_host_v1_t *h = c->host;
    int64_t t0 = now_ms(), deadline = t0 + timeout_ms;
    char why[300], who[200], ip[TCP_IP_TEXT];
    for (int p = 0; p < c->rank; p++) {
        int secret = 0;
        int fd = connect_peer(c, p, &addrs[p], ports[p], deadline, why, sizeof why, &secret);
        if (fd < 0) {
            tcp_fmt_rank(c, p, who, sizeof who);
            tcp_ip_text(&addrs[p], ip, sizeof ip);
            return h->set_error(h, secret                   ? DT_ERR_CONFIG
                                   : now_ms() >= deadline ? DT_ERR_TIMEOUT
                                                          : DT_ERR_REMOTE,
                                "init: group %s: %s at %s:%u: %s", c->gname, who, ip,
                                (unsigned)ports[p], why);
        }
        c->peers[p].fd = fd;
    }
    int rc = accept_peers(c, listen_fd, deadline, timeout_ms);
    if (rc)
        return rc;
    for (int p = 0; p < c->size; p++)
        if (c->peers[p].fd >= 0)
            tcp_sock_setup(c->peers[p].fd, c->job->sock_buf, c->timeout_ms);
    return DT_OK;
}
