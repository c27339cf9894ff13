/*
 * core/launch/ledger_exchange.c - the ledger exchange of
 * ledger_exchange.h over an abstract Unix socket.
 *
 * A rank sends one frame: magic, its rank, the length, when it began to
 * exchange (CLOCK_MONOTONIC, ns, 64 bits), its bytes (little-endian).
 * Rank 0 answers each with the verdict, how many ranks began before it,
 * the length and the line.  Rank 0 serves every connection from one poll loop, so a rank that
 * connects and stays silent only runs out the deadline; lengths from the
 * socket are checked before a byte of the body is read.
 */
#include "launch/ledger_exchange.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "util/error.h"

#define XCHG_MAGIC 0x58474c44u /* "DLGX" */
#define CONNECT_S 1.0          /* how long a refused connect is retried */
#define ANSWER_S 2.0           /* rank 0's answer to each rank */
#define HDR 20                 /* magic, rank, length, when it came (64 bits) */

struct dt_ledger_xchg {
    int rank, size, single;  /* single: every rank on this node */
    int listen_fd;           /* rank 0; -1 otherwise */
    struct sockaddr_un addr;
    socklen_t addr_len;
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

/* CLOCK_MONOTONIC in ns: one clock for every process of a machine. */
static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
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
    x->addr.sun_family = AF_UNIX;
    /* abstract: sun_path[0] is NUL, the name follows, no NUL counted */
    int n = snprintf(x->addr.sun_path + 1, sizeof x->addr.sun_path - 1,
                     "dtrain-ledger-%d-%s", (int)getuid(), w->job_id);
    if (n < 0 || (size_t)n >= sizeof x->addr.sun_path - 1)
        n = (int)sizeof x->addr.sun_path - 2;
    x->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    if (x->rank == 0 && x->size > 1 && x->single) {
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
    uint8_t hdr[HDR];
    size_t have;      /* header and body bytes read */
    int rank;         /* from the header; -1 before */
    uint32_t len;
    uint8_t *body;
} peer_t;

static void peer_drop(peer_t *p)
{
    if (p->fd >= 0)
        close(p->fd);
    free(p->body);
    *p = (peer_t){.fd = -1, .rank = -1};
}

/* Read what is there; 1: a whole frame, 0: more to come, -1: drop it. */
static int peer_step(peer_t *p, int size)
{
    for (;;) {
        uint8_t *dst;
        size_t want;
        if (p->have < HDR) {
            dst = p->hdr + p->have;
            want = HDR - p->have;
        } else {
            dst = p->body + (p->have - HDR);
            want = HDR + p->len - p->have;
        }
        if (want == 0)
            return 1;
        ssize_t k = recv(p->fd, dst, want, 0);
        if (k == 0)
            return -1;
        if (k < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        p->have += (size_t)k;
        if (p->have == HDR) {
            uint32_t r = get32(p->hdr + 4);
            p->len = get32(p->hdr + 8);
            if (get32(p->hdr) != XCHG_MAGIC || r == 0 || r >= (uint32_t)size ||
                p->len > DT_LEDGER_XCHG_MAX || !(p->body = malloc(p->len ? p->len : 1)))
                return -1;
            p->rank = (int)r;
        }
    }
}

static int serve(dt_ledger_xchg_t *x, const void *mine, size_t bytes, double timeout_s,
                 dt_ledger_xchg_judge_fn judge, void *ctx, char *text, size_t cap,
                 int *verdict, int *order)
{
    uint64_t t_mine = mono_ns();
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
    int got = 1;
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
                                     SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    int slot = -1;
                    for (int i = 0; i < maxp && slot < 0; i++)
                        if (peers[i].fd < 0)
                            slot = i;
                    if (slot < 0 || !same_user(fd)) {
                        close(fd);
                        continue;
                    }
                    peers[slot].fd = fd;
                }
                continue;
            }
            peer_t *p = &peers[which[j]];
            int st = peer_step(p, n);
            if (st < 0 || (st > 0 && from[p->rank])) {
                peer_drop(p); /* garbage, gone, or a second frame for a rank */
            } else if (st > 0) {
                from[p->rank] = p;
                got++;
            }
        }
    }
    blobs[0] = mine;
    sizes[0] = bytes;
    for (int r = 1; r < n; r++)
        if (from[r]) {
            blobs[r] = from[r]->body;
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
        uint8_t len[12];
        put32(len, (uint32_t)*verdict);
        put32(len + 4, before);
        put32(len + 8, tl);
        if (io_all(from[r]->fd, len, 12, 1, adl) == 0)
            (void)io_all(from[r]->fd, text, tl, 1, adl);
    }
    for (int i = 0; i < maxp; i++)
        peer_drop(&peers[i]);
    free(peers), free(from), free(blobs), free(sizes), free(pf), free(which);
    return DT_OK;
}

/* ---- the other ranks ---- */

static int ask(dt_ledger_xchg_t *x, const void *mine, size_t bytes, double timeout_s,
               char *text, size_t cap, int *verdict, int *order)
{
    uint64_t t_mine = mono_ns();
    int fd = -1;
    double cdl = mono_s() + CONNECT_S;
    for (;;) {
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            break;
        if (connect(fd, (struct sockaddr *)&x->addr, x->addr_len) == 0)
            break;
        int e = errno;
        close(fd);
        fd = -1;
        if ((e != ECONNREFUSED && e != ENOENT && e != EAGAIN) || mono_s() >= cdl)
            break;
        struct timespec nap = {0, 20 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
    if (fd < 0 || !same_user(fd)) {
        if (fd >= 0)
            close(fd);
        snprintf(text, cap, "ledger: not compared: rank 0, which compares the ledgers, is gone");
        return dt_err_set(DT_ERR_REMOTE, "ledger exchange: rank 0 is gone");
    }
    /* writes and reads below wait with a deadline, through poll */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    double deadline = mono_s() + 2 * timeout_s + 5.0;
    uint8_t hdr[HDR], len[12];
    put32(hdr, XCHG_MAGIC);
    put32(hdr + 4, (uint32_t)x->rank);
    put32(hdr + 8, (uint32_t)bytes);
    put32(hdr + 12, (uint32_t)t_mine);
    put32(hdr + 16, (uint32_t)(t_mine >> 32));
    int rc = io_all(fd, hdr, HDR, 1, deadline);
    if (rc == 0)
        rc = io_all(fd, (void *)mine, bytes, 1, deadline);
    if (rc == 0)
        rc = io_all(fd, len, 12, 0, deadline);
    uint32_t tl = rc == 0 ? get32(len + 8) : 0;
    if (rc == 0 && (tl >= cap || io_all(fd, text, tl, 0, deadline) != 0))
        rc = -1;
    int timed_out = rc != 0 && errno == ETIMEDOUT;
    close(fd);
    if (rc != 0) {
        snprintf(text, cap, "ledger: not compared: rank 0, which compares the ledgers, %s",
                 timed_out ? "did not answer in time" : "is gone");
        return dt_err_set(timed_out ? DT_ERR_TIMEOUT : DT_ERR_REMOTE,
                          "ledger exchange: no answer from rank 0");
    }
    text[tl] = '\0';
    *verdict = (int)get32(len);
    *order = (int)get32(len + 4);
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
    if (!x || x->size < 2 || !x->single || bytes > DT_LEDGER_XCHG_MAX || cap < 64) {
        if (cap)
            snprintf(text, cap, "ledger: not compared (%s)",
                     x && !x->single ? "the ranks span several nodes: not supported yet"
                                     : "no exchange here");
        return dt_err_set(DT_ERR_UNSUPPORTED, "ledger exchange: not supported here");
    }
    if (x->rank == 0)
        return serve(x, mine, bytes, timeout_s, judge, ctx, text, cap, verdict, order);
    return ask(x, mine, bytes, timeout_s, text, cap, verdict, order);
}
