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
 * key (another job, a port scanner) is closed and logged, never counted,
 * and the accept loop goes on; each gets TCP_HANDSHAKE_MS to prove itself.
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
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tcp_internal.h"

#define HS_MAGIC "DTTCP01"   /* 8 bytes with its NUL */
#define NONCE_BYTES 16

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
    if (s < 0 || bind(s, (struct sockaddr *)&sa, sl) != 0 || listen(s, 128) != 0 ||
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

/* Connector side: 0, or a text in why. */
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
    mac_of(c->job, "dtrain-tcp-ack", c->gname, ch.nonce, he.nonce, peer, want);
    if (!dt_equal_ct(ack, want, sizeof ack)) {
        snprintf(why, cap, "it could not prove the job's secret");
        return -1;
    }
    return 0;
}

/* Acceptor side: the proven peer's rank, or -1 with a text in why. */
static int hs_accept(dt_comm_t *c, int fd, int64_t deadline, char *why, size_t cap)
{
    challenge_t ch;
    hello_t he;
    uint8_t want[DT_SHA256_BYTES], ack[DT_SHA256_BYTES];
    memcpy(ch.magic, HS_MAGIC, 8);
    int e = fresh_nonce(ch.nonce);
    if (e == 0)
        e = io_full(fd, &ch, sizeof ch, 1, deadline);
    if (e == 0)
        e = io_full(fd, &he, sizeof he, 0, deadline);
    if (e) {
        snprintf(why, cap, "no hello: %s", e == EPIPE ? "closed" : strerror(e));
        return -1;
    }
    if (memcmp(he.magic, HS_MAGIC, 8) != 0) {
        snprintf(why, cap, "not a dtrain tcp peer (bad magic)");
        return -1;
    }
    mac_of(c->job, "dtrain-tcp-hello", c->gname, ch.nonce, he.nonce, he.rank, want);
    if (!dt_equal_ct(he.mac, want, sizeof want)) {
        snprintf(why, cap, "it could not prove the job's secret (another job, or none)");
        return -1;
    }
    if (he.rank <= c->rank || he.rank >= c->size) {
        snprintf(why, cap, "it claims rank %d, which does not connect to rank %d",
                 (int)he.rank, (int)c->rank);
        return -1;
    }
    mac_of(c->job, "dtrain-tcp-ack", c->gname, ch.nonce, he.nonce, c->rank, ack);
    if ((e = io_full(fd, ack, sizeof ack, 1, deadline)) != 0) {
        snprintf(why, cap, "answering: %s", strerror(e));
        return -1;
    }
    return he.rank;
}

/* Connect to peer p's listener, retrying refusals until the deadline. */
static int connect_peer(dt_comm_t *c, int p, const tcp_ip_t *addr, uint16_t port,
                        int64_t deadline, char *why, size_t cap)
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
            if (hs_connect(c, fd, p, deadline, why, cap) == 0)
                return fd;
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

int tcp_mesh_connect(dt_comm_t *c, int listen_fd, const tcp_ip_t *addrs,
                     const uint16_t *ports, int64_t timeout_ms)
{
    const dt_host_v1_t *h = c->host;
    int64_t t0 = now_ms(), deadline = t0 + timeout_ms;
    char why[300], who[200], ip[TCP_IP_TEXT];
    for (int p = 0; p < c->rank; p++) {
        int fd = connect_peer(c, p, &addrs[p], ports[p], deadline, why, sizeof why);
        if (fd < 0) {
            tcp_fmt_rank(c, p, who, sizeof who);
            tcp_ip_text(&addrs[p], ip, sizeof ip);
            return h->set_error(h, now_ms() >= deadline ? DT_ERR_TIMEOUT : DT_ERR_REMOTE,
                                "init: group %s: %s at %s:%u: %s", c->gname, who, ip,
                                (unsigned)ports[p], why);
        }
        c->peers[p].fd = fd;
    }
    int missing = c->size - 1 - c->rank;
    while (missing > 0) {
        int64_t left = deadline - now_ms();
        struct pollfd pf = {.fd = listen_fd, .events = POLLIN};
        if (left <= 0 || poll(&pf, 1, left > 1000 ? 1000 : (int)left) < 0) {
            if (left > 0 && errno == EINTR)
                continue;
        }
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        int fd = accept4(listen_fd, (struct sockaddr *)&from, &fl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (now_ms() < deadline)
                continue;
            int *list = malloc(sizeof(int) * (size_t)c->size), n = 0;
            for (int p = c->rank + 1; list && p < c->size; p++)
                if (c->peers[p].fd < 0)
                    list[n++] = p;
            dt_comm_names_t g = {.gname = c->gname, .is_world = c->is_world,
                                 .size = c->size, .wranks = c->wranks};
            char ranks[300] = "some ranks";
            if (list)
                dt_comm_fmt_ranks(&g, list, n, ranks, sizeof ranks);
            free(list);
            return h->set_error(h, DT_ERR_TIMEOUT, "init: group %s: timed out after %.1f s "
                                "waiting for %s to connect", c->gname,
                                (double)timeout_ms / 1000.0, ranks);
        }
        int64_t hs_deadline = now_ms() + TCP_HANDSHAKE_MS;
        int p = hs_accept(c, fd, hs_deadline < deadline ? hs_deadline : deadline, why,
                          sizeof why);
        tcp_ip_t fip;
        ip_from_sockaddr((struct sockaddr *)&from, &fip);
        tcp_ip_text(&fip, ip, sizeof ip);
        const uint16_t fport = sockaddr_port(&from);
        if (p >= 0 && c->peers[p].fd >= 0) {
            snprintf(why, sizeof why, "rank %d is connected already", p);
            p = -1;
        }
        if (p < 0) {
            h->log(h, DT_LOG_WARN, "group %s: refused a connection from %s:%u: %s", c->gname,
                   ip, (unsigned)fport, why);
            close(fd);
            continue;
        }
        c->peers[p].fd = fd;
        missing--;
    }
    for (int p = 0; p < c->size; p++)
        if (c->peers[p].fd >= 0)
            tcp_sock_setup(c->peers[p].fd, c->job->sock_buf, c->timeout_ms);
    return DT_OK;
}
