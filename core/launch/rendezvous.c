/*
 * core/launch/rendezvous.c - the TCP rendezvous of rendezvous.h.
 *
 * Rank 0 is one poll loop over its listener and every connection: an
 * accepted connection gets a challenge (a fresh nonce) and has
 * DT_RDZV_HELLO_S to answer with a hello that proves the job secret; until
 * then it is "pending".  Pending connections are capped, and a new one
 * evicts the oldest rather than being refused, so strangers that connect
 * and stay silent (a port scanner, a flood) only ever shorten each
 * other's time: a real rank answers its challenge within a round trip and
 * is filed under its rank before it could be evicted.  Drops are logged
 * through a limiter (droplog_t): a burst of lines, then a count.  When every rank is in (or the deadline passed)
 * rank 0 answers each with a welcome: the job id and status, or the error
 * every rank then reports.  The connections stay open for the bootstrap
 * all-gathers: each rank sends its blob, rank 0 answers with all of them.
 *
 * Frames are read incrementally into a per-connection buffer (frame_step),
 * so a silent or slow peer never blocks the loop, and every payload length
 * is checked against its type's limit before a byte of it is read.
 */
#include "launch/rendezvous.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/sha256/sha256.h"
#include "launch/world.h"
#include "launch/tcp_listen.h"
#include "util/error.h"
#include "util/log.h"

#define NONCE_BYTES 16
#define MAC_BYTES DT_SHA256_BYTES
#define JOB_ID_CAP 128
#define MSG_MAX 1024
/* rank 0's answers reach a rank before that rank's own deadline */
#define CLIENT_GRACE_S 1.0
#define CONNECT_TRY_S 2.0 /* one connect attempt */
#define BACKOFF_MIN_S 0.05
#define BACKOFF_MAX_S 1.0

enum frame_type {
    T_CHALLENGE = 1, /* rank 0 -> rank: nonce */
    T_HELLO = 2,     /* rank -> rank 0: who it is and its proof */
    T_WELCOME = 3,   /* rank 0 -> rank: status, job id, message, proof */
    T_GATHER = 4,    /* rank -> rank 0: one blob */
    T_GATHERED = 5,  /* rank 0 -> rank: status, every blob or a message */
    T_REFUSED = 6    /* rank 0 -> rank: why its hello was refused (REFUSED_*) */
};

/* T_REFUSED's payload: one reason code. */
#define REFUSED_SECRET 1 /* the hello's proof of the job secret is wrong */
#define REFUSED_MAX 4

/* Payload sizes: fixed parts and the limits a reader enforces. */
#define HELLO_FIXED (4 + 4 + 8 + NONCE_BYTES + 2 + MAC_BYTES)
#define HELLO_MAX (HELLO_FIXED + JOB_ID_CAP - 1)
#define WELCOME_FIXED (4 + 2 + 2 + MAC_BYTES)
#define WELCOME_MAX (WELCOME_FIXED + JOB_ID_CAP - 1 + MSG_MAX)
#define GATHER_MAX (8 + DT_RDZV_BLOB_MAX)

static const char hello_label[] = "dtrain-rdzv-hello";     /* with its NUL */
static const char welcome_label[] = "dtrain-rdzv-welcome"; /* with its NUL */

/* One connection and the frame being read from it. */
typedef struct conn {
    int fd; /* -1: a free slot */
    double since;               /* pending: when it was accepted */
    double deadline;            /* pending: when its hello is due */
    uint8_t nonce[NONCE_BYTES]; /* rank 0's challenge to it */
    uint8_t peer_nonce[NONCE_BYTES];
    uint64_t config_hash;
    char peer[96]; /* "addr:port", for messages */
    uint8_t hdr[DT_RDZV_HEADER_BYTES];
    size_t have; /* header and payload bytes read so far */
    uint16_t type;
    uint32_t len;
    uint8_t *payload; /* len bytes, once the header was accepted */
} conn_t;

struct dt_rdzv {
    char addr[256];
    int port, rank, size;
    char proposal[JOB_ID_CAP];
    char job_id[JOB_ID_CAP];
    uint8_t key[DT_SHA256_BYTES]; /* SHA-256(secret): the HMAC key */
    uint64_t config_hash;
    double timeout_s;
    int listen_fd; /* rank 0 */
    conn_t up;     /* rank > 0: the connection to rank 0 */
    conn_t *peers; /* rank 0: [rank], joined ranks (fd >= 0) */
    int joined;    /* a join succeeded */
    uint32_t gather_seq;
};

/* ------------------------------------------------------------ helpers -- */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int ms_until(double deadline)
{
    double left = deadline - mono_s();
    if (left <= 0)
        return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

static void put16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}
static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (24 - 8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}
static uint32_t get16(const uint8_t *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }

static int random_bytes(uint8_t *b, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom(b + got, n - got, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return dt_err_set(DT_ERR_SYSTEM, "rendezvous: getrandom: %s", strerror(errno));
        got += (size_t)k;
    }
    return DT_OK;
}

/* "2, 3, 5" for the ranks r in [0, size) with want[r]; cut with "...". */
static void rank_list(char *buf, size_t cap, const int *want, int size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int r = 0; r < size; r++) {
        if (!want[r])
            continue;
        if (len + 16 >= cap) {
            snprintf(buf + len, cap - len, ", ...");
            return;
        }
        int n = snprintf(buf + len, cap - len, "%s%d", len ? ", " : "", r);
        if (n > 0)
            len += (size_t)n;
    }
}

static void peer_name(int fd, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[NI_MAXHOST], serv[NI_MAXSERV];
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0 ||
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(buf, cap, "an unknown address");
        return;
    }
    snprintf(buf, cap, ss.ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, serv);
}

static void conn_reset_frame(conn_t *c)
{
    free(c->payload);
    c->payload = NULL;
    c->have = 0;
    c->len = 0;
    c->type = 0;
}

static void conn_close(conn_t *c)
{
    conn_reset_frame(c);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

/* Write all n bytes to the non-blocking fd by `deadline`: 0, or -1 with
 * errno (ETIMEDOUT when the deadline passed). */
static int write_all(int fd, const uint8_t *p, size_t n, double deadline)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        int ms = ms_until(deadline);
        if (ms == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        if (poll(&pf, 1, ms) < 0 && errno != EINTR)
            return -1;
    }
    return 0;
}

static int write_frame(int fd, uint16_t type, const uint8_t *payload, uint32_t len,
                       double deadline)
{
    uint8_t h[DT_RDZV_HEADER_BYTES] = {0};
    put32(h, DT_RDZV_MAGIC);
    put16(h + 4, DT_RDZV_VERSION);
    put16(h + 6, type);
    put32(h + 8, len);
    if (write_all(fd, h, sizeof h, deadline) != 0)
        return -1;
    return len ? write_all(fd, payload, len, deadline) : 0;
}

/* Read what the non-blocking c->fd has of its next frame, which must be of
 * type `want` (or `alt`, unless 0) with a payload of at most `max_len`
 * bytes.  1: the frame is complete (c->type, c->payload, c->len); 0: more
 * to come; -1: refused, with the reason in why (the peer closed, sent
 * something else - judged from its first byte - or claims a size over the
 * limit: checked before any payload byte is read). */
static int frame_step(conn_t *c, uint16_t want, uint16_t alt, uint32_t max_len, char *why,
                      size_t cap)
{
    for (;;) {
        size_t need = c->have < DT_RDZV_HEADER_BYTES ? DT_RDZV_HEADER_BYTES
                                                     : DT_RDZV_HEADER_BYTES + c->len;
        if (c->have == need && c->have >= DT_RDZV_HEADER_BYTES &&
            (c->payload || c->len == 0))
            return 1;
        uint8_t *dst = c->have < DT_RDZV_HEADER_BYTES
                           ? c->hdr + c->have
                           : c->payload + (c->have - DT_RDZV_HEADER_BYTES);
        ssize_t got = recv(c->fd, dst, need - c->have, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (got <= 0) {
            snprintf(why, cap, "%s", got == 0 ? "it closed the connection" : strerror(errno));
            return -1;
        }
        c->have += (size_t)got;
        if (!c->payload && c->have < DT_RDZV_HEADER_BYTES) {
            /* garbage shows in its first bytes: drop it without waiting
             * for a whole header */
            static const uint8_t magic[4] = {DT_RDZV_MAGIC >> 24, (DT_RDZV_MAGIC >> 16) & 0xff,
                                             (DT_RDZV_MAGIC >> 8) & 0xff, DT_RDZV_MAGIC & 0xff};
            size_t n = c->have < 4 ? c->have : 4;
            if (memcmp(c->hdr, magic, n) != 0) {
                char hex[9] = "";
                for (size_t i = 0; i < n; i++)
                    snprintf(hex + 2 * i, 3, "%02x", c->hdr[i]);
                snprintf(why, cap, "not a dtrain rendezvous frame (it starts 0x%s)", hex);
                return -1;
            }
        }
        if (c->have != DT_RDZV_HEADER_BYTES || c->payload)
            continue;
        /* the header is complete: judge it before reading a payload */
        uint32_t magic = get32(c->hdr), version = get16(c->hdr + 4);
        c->type = (uint16_t)get16(c->hdr + 6);
        c->len = get32(c->hdr + 8);
        if (magic != DT_RDZV_MAGIC) {
            snprintf(why, cap, "not a dtrain rendezvous frame (it starts 0x%08x)", magic);
            return -1;
        }
        if (version != DT_RDZV_VERSION) {
            snprintf(why, cap, "rendezvous protocol version %u (this dtrain speaks %d)",
                     version, DT_RDZV_VERSION);
            return -1;
        }
        if (c->type != want && (!alt || c->type != alt)) {
            snprintf(why, cap, "a frame of type %u where type %u was due", c->type, want);
            return -1;
        }
        if (c->type == T_REFUSED && c->type != want)
            max_len = REFUSED_MAX;
        if (c->len > max_len) {
            snprintf(why, cap, "a frame claiming %u bytes, over the %u-byte limit of its type",
                     c->len, max_len);
            return -1;
        }
        c->payload = malloc(c->len ? c->len : 1);
        if (!c->payload) {
            snprintf(why, cap, "out of memory for a %u-byte frame", c->len);
            return -1;
        }
    }
}

/* The same, blocking until the frame is complete or `deadline`:
 * 1, or -1 with why set. */
static int read_frame(conn_t *c, uint16_t want, uint16_t alt, uint32_t max_len, double deadline,
                      char *why, size_t cap)
{
    conn_reset_frame(c);
    for (;;) {
        int st = frame_step(c, want, alt, max_len, why, cap);
        if (st != 0)
            return st;
        int ms = ms_until(deadline);
        if (ms == 0) {
            snprintf(why, cap, "no answer in time");
            return -1;
        }
        struct pollfd pf = {.fd = c->fd, .events = POLLIN};
        if (poll(&pf, 1, ms) < 0 && errno != EINTR) {
            snprintf(why, cap, "poll: %s", strerror(errno));
            return -1;
        }
    }
}

/* HMAC of a label, a nonce and a payload's bytes. */
static void mac_of(const dt_rdzv_t *r, const char *label, size_t label_bytes,
                   const uint8_t *nonce, const uint8_t *p, size_t n, uint8_t out[MAC_BYTES])
{
    const void *parts[3] = {label, nonce, p};
    size_t sizes[3] = {label_bytes, NONCE_BYTES, n};
    dt_hmac_sha256_parts(r->key, sizeof r->key, parts, sizes, 3, out);
}

/* ------------------------------------------------------------- open -- */

static int bind_listener(dt_rdzv_t *r)
{
    int fd = dt_tcp_listen_any(r->addr, r->port, &r->port);
    if (fd >= 0) {
        r->listen_fd = fd;
        return DT_OK;
    }
    int err = errno;
    return dt_err_set(DT_ERR_SYSTEM,
                      "rendezvous: rank 0 cannot listen on port %d (master_port): %s%s",
                      r->port, strerror(err),
                      err == EADDRINUSE ? " (another job's rendezvous, or a leftover "
                                          "process, holds it: pick another master_port)"
                                        : "");
}

int dt_rdzv_open(const dt_rdzv_opts_t *o, dt_rdzv_t **out)
{
    *out = NULL;
    if (!o || !o->addr || !o->addr[0] || o->size < 1 || o->rank < 0 || o->rank >= o->size ||
        o->port < 0 || o->port > 65535 || (o->port == 0 && o->rank != 0) || o->timeout_s <= 0)
        return dt_err_set(DT_ERR_INVALID,
                          "rendezvous: needs an address, a port in [1, 65535] (0 only on "
                          "rank 0), rank < size and a timeout > 0");
    if (o->size > 1 && (!o->secret || !o->secret[0])) /* one rank meets no one */
        return dt_err_set(DT_ERR_CONFIG,
                          "rendezvous: no job secret: set DTRAIN_JOB_SECRET to the same value "
                          "on every node (ranks prove they belong to the job with it)");
    if (!o->job_id || strlen(o->job_id) >= JOB_ID_CAP)
        return dt_err_set(DT_ERR_INVALID, "rendezvous: job id missing or %d bytes or longer",
                          JOB_ID_CAP);
    dt_rdzv_t *r = calloc(1, sizeof *r);
    if (!r)
        return dt_err_set(DT_ERR_NOMEM, "rendezvous: out of memory");
    snprintf(r->addr, sizeof r->addr, "%s", o->addr);
    r->port = o->port;
    r->rank = o->rank;
    r->size = o->size;
    snprintf(r->proposal, sizeof r->proposal, "%s", o->job_id);
    if (o->secret)
        dt_sha256(o->secret, strlen(o->secret), r->key);
    r->config_hash = o->config_hash;
    r->timeout_s = o->timeout_s;
    r->listen_fd = -1;
    r->up.fd = -1;
    int rc = DT_OK;
    if (r->rank == 0 && r->size > 1) {
        r->peers = calloc((size_t)r->size, sizeof *r->peers);
        if (!r->peers)
            rc = dt_err_set(DT_ERR_NOMEM, "rendezvous: out of memory for %d ranks", r->size);
        for (int i = 0; r->peers && i < r->size; i++)
            r->peers[i].fd = -1;
        if (!rc)
            rc = bind_listener(r);
    }
    if (rc) {
        dt_rdzv_close(r);
        return rc;
    }
    *out = r;
    return DT_OK;
}

int dt_rdzv_port(const dt_rdzv_t *r) { return r->port; }

const char *dt_rdzv_job_id(const dt_rdzv_t *r) { return r->job_id; }

void dt_rdzv_close(dt_rdzv_t *r)
{
    if (!r)
        return;
    if (r->listen_fd >= 0)
        close(r->listen_fd);
    conn_close(&r->up);
    for (int i = 0; r->peers && i < r->size; i++)
        conn_close(&r->peers[i]);
    free(r->peers);
    explicit_bzero(r->key, sizeof r->key);
    free(r);
}

/* ------------------------------------------------------ rank 0's join -- */

/* The log of dropped connections, bounded: the first DT_RDZV_LOG_BURST
 * drops of a window of DT_RDZV_LOG_WINDOW_S are logged one by one, the
 * rest counted and logged as one line when the window ends (or the join
 * does), so a flood of thousands a second writes a few lines, while a
 * single misconfigured node is still named at once. */
typedef struct droplog {
    double start;          /* the window's first drop; 0: no window open */
    unsigned logged, held; /* lines written, drops counted this window */
    char last_peer[96], last_why[240];
} droplog_t;

static void drop_flush(droplog_t *d, double now)
{
    if (d->held)
        dt_log(DT_LOG_WARN, "rendezvous",
               "dropped %u more connection%s that did not prove they belong to the job in "
               "the last %.1f s (the last from %s: %s)",
               d->held, d->held == 1 ? "" : "s", now - d->start, d->last_peer, d->last_why);
    d->start = 0;
    d->logged = d->held = 0;
}

/* Close the window when its time is up. */
static void drop_tick(droplog_t *d, double now)
{
    if (d->start > 0 && now - d->start >= DT_RDZV_LOG_WINDOW_S)
        drop_flush(d, now);
}

static void drop_note(droplog_t *d, const char *peer, const char *why)
{
    double now = mono_s();
    drop_tick(d, now);
    if (d->start == 0)
        d->start = now;
    if (d->logged < DT_RDZV_LOG_BURST) {
        d->logged++;
        dt_log(DT_LOG_WARN, "rendezvous", "refused a connection from %s: %s%s", peer, why,
               d->logged == DT_RDZV_LOG_BURST
                   ? " (further refusals in the next 10 s are counted, not logged one by one)"
                   : "");
        return;
    }
    d->held++;
    snprintf(d->last_peer, sizeof d->last_peer, "%s", peer);
    snprintf(d->last_why, sizeof d->last_why, "%s", why);
}

typedef struct server {
    dt_rdzv_t *r;
    conn_t *pend;           /* [cap]: accepted, not proven (fd < 0: free) */
    int cap, n_pend;
    struct pollfd *pf;      /* [1 + size + cap] */
    conn_t **who;
    double listen_pause;    /* out of file descriptors: accept again then */
    droplog_t drops;
    char bad_peer[96];      /* the last hello that failed the secret */
    uint32_t bad_rank;
    int fatal;              /* a job-level failure (status) found while joining */
    char fatal_msg[MSG_MAX];
} server_t;

/* Drop pending connection c, logged through the limiter. */
static void refuse(server_t *s, conn_t *c, const char *why)
{
    drop_note(&s->drops, c->peer, why);
    conn_close(c);
    s->n_pend--;
}

__attribute__((format(printf, 3, 4))) static void set_fatal(server_t *s, int status,
                                                            const char *fmt, ...)
{
    if (s->fatal)
        return;
    s->fatal = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->fatal_msg, sizeof s->fatal_msg, fmt, ap);
    va_end(ap);
}

/* How many unproven connections to hold: DT_RDZV_PENDING_MAX, or half the
 * open-file limit when that is less. */
static int pending_cap(void)
{
    struct rlimit rl;
    int cap = DT_RDZV_PENDING_MAX;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur / 2 < (rlim_t)cap)
        cap = (int)(rl.rlim_cur / 2);
    return cap < 8 ? 8 : cap;
}

/* The pending connection a newcomer replaces: the oldest that sent
 * nothing yet, else the oldest. */
static conn_t *evictee(server_t *s)
{
    conn_t *silent = NULL, *any = NULL;
    for (int i = 0; i < s->cap; i++) {
        conn_t *c = &s->pend[i];
        if (c->fd < 0)
            continue;
        if (!any || c->since < any->since)
            any = c;
        if (c->have == 0 && (!silent || c->since < silent->since))
            silent = c;
    }
    return silent ? silent : any;
}

/* Accept what the listener has (at most a bounded batch, so the hellos of
 * those already in are read between batches).  Each newcomer gets a slot
 * and a challenge; when every slot is taken, the oldest unproven
 * connection makes room. */
static void accept_some(server_t *s)
{
    dt_rdzv_t *r = s->r;
    for (int n = 0; n < 64; n++) {
        int fd = accept4(r->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE) && s->n_pend > 0) {
            refuse(s, evictee(s), "rank 0 ran out of file descriptors and a newer connection "
                                  "came (this one was the oldest unproven)");
            continue;
        }
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) /* nothing to give up: wait a little */
                s->listen_pause = mono_s() + 0.01;
            return; /* EAGAIN, or a connection that went away meanwhile */
        }
        if (s->n_pend == s->cap) {
            char why[160];
            snprintf(why, sizeof why, "%d connections had not proved they belong to the job "
                     "and a newer one came (this one was the oldest)", s->cap);
            refuse(s, evictee(s), why);
        }
        conn_t *c = NULL;
        for (int i = 0; i < s->cap && !c; i++)
            if (s->pend[i].fd < 0)
                c = &s->pend[i];
        if (!c) { /* (cannot be: a slot was just given up) */
            close(fd);
            return;
        }
        memset(c, 0, sizeof *c);
        c->fd = fd;
        s->n_pend++;
        peer_name(fd, c->peer, sizeof c->peer);
        c->since = mono_s();
        c->deadline = c->since + DT_RDZV_HELLO_S;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        /* a fresh socket's send buffer takes the 32 bytes at once */
        if (random_bytes(c->nonce, sizeof c->nonce) ||
            write_frame(fd, T_CHALLENGE, c->nonce, NONCE_BYTES, c->since + 0.05) != 0)
            refuse(s, c, "could not send it a challenge");
    }
}

/* The welcome rank 0 sends rank q: status, the job id, a message. */
static int send_welcome(dt_rdzv_t *r, conn_t *c, int status, const char *msg, double deadline)
{
    uint8_t p[WELCOME_MAX];
    size_t idlen = strlen(r->job_id), mlen = strlen(msg);
    if (mlen > MSG_MAX)
        mlen = MSG_MAX;
    put32(p, (uint32_t)status);
    put16(p + 4, (uint32_t)idlen);
    memcpy(p + 6, r->job_id, idlen);
    put16(p + 6 + idlen, (uint32_t)mlen);
    memcpy(p + 8 + idlen, msg, mlen);
    size_t body = 8 + idlen + mlen;
    mac_of(r, welcome_label, sizeof welcome_label, c->peer_nonce, p, body, p + body);
    return write_frame(c->fd, T_WELCOME, p, (uint32_t)(body + MAC_BYTES), deadline);
}

/* A complete hello on pending connection c: file it under its rank, or
 * refuse it. */
static void take_hello(server_t *s, conn_t *c)
{
    dt_rdzv_t *r = s->r;
    const uint8_t *p = c->payload;
    if (c->len < HELLO_FIXED || get16(p + 32) != c->len - HELLO_FIXED) {
        refuse(s, c, "a malformed hello");
        return;
    }
    uint32_t idlen = get16(p + 32);
    uint32_t rank = get32(p), size = get32(p + 4);
    uint8_t mac[MAC_BYTES];
    mac_of(r, hello_label, sizeof hello_label, c->nonce, p, 34 + idlen, mac);
    if (!dt_equal_ct(mac, p + 34 + idlen, MAC_BYTES)) {
        /* a dtrain rank with another secret, most likely: tell it (it
         * learns nothing it did not know), and remember it for the
         * timeout's message */
        uint8_t why[REFUSED_MAX];
        put32(why, REFUSED_SECRET);
        write_frame(c->fd, T_REFUSED, why, sizeof why, mono_s() + 0.05);
        snprintf(s->bad_peer, sizeof s->bad_peer, "%s", c->peer);
        s->bad_rank = rank;
        char text[200];
        snprintf(text, sizeof text, "it claims rank %u of %u but its proof of the job secret "
                 "is wrong (DTRAIN_JOB_SECRET differs on its node, or it is another job's "
                 "rank)", rank, size);
        refuse(s, c, text);
        return;
    }
    uint64_t hash = get64(p + 8);
    memcpy(c->peer_nonce, p + 16, NONCE_BYTES);
    conn_reset_frame(c);
    if (size != (uint32_t)r->size || rank == 0 || rank >= size)
        set_fatal(s, DT_ERR_CONFIG,
                  "rendezvous: %s joined as rank %u of %u, but rank 0 was started for %d "
                  "ranks: every node must run the same nnodes x nproc",
                  c->peer, rank, size, r->size);
    else if (r->peers[rank].fd >= 0)
        set_fatal(s, DT_ERR_CONFIG,
                  "rendezvous: rank %u joined twice (from %s and from %s): two nodes were "
                  "given the same node_rank?",
                  rank, r->peers[rank].peer, c->peer);
    s->n_pend--;
    if (s->fatal) {
        /* it proved the secret: it is the job's, and learns why it fails */
        send_welcome(r, c, s->fatal, s->fatal_msg, mono_s() + 0.5);
        conn_close(c);
        return;
    }
    conn_t *slot = &r->peers[rank];
    *slot = *c;
    slot->config_hash = hash;
    memset(c, 0, sizeof *c);
    c->fd = -1;
}

/* Serve the listener and the connections until every rank joined, the
 * deadline passed, or a job-level failure was found. */
static void gather_ranks(server_t *s, double deadline)
{
    dt_rdzv_t *r = s->r;
    struct pollfd *pf = s->pf;
    conn_t **who = s->who;
    for (;;) {
        int n_in = 0;
        for (int q = 1; q < r->size; q++)
            n_in += r->peers[q].fd >= 0;
        if (n_in == r->size - 1 || s->fatal)
            return;
        double now = mono_s();
        if (now >= deadline)
            return;
        drop_tick(&s->drops, now);
        double wake = deadline;
        int np = 0;
        if (now >= s->listen_pause) {
            pf[np] = (struct pollfd){.fd = r->listen_fd, .events = POLLIN};
            who[np++] = NULL;
        } else if (s->listen_pause < wake) {
            wake = s->listen_pause;
        }
        /* a joined rank that closes before the job formed leaves its slot
         * free for a retry; anything it sends is left unread until then */
        for (int q = 1; q < r->size; q++)
            if (r->peers[q].fd >= 0) {
                pf[np] = (struct pollfd){.fd = r->peers[q].fd, .events = POLLRDHUP};
                who[np++] = &r->peers[q];
            }
        for (int i = 0; i < s->cap; i++) {
            conn_t *c = &s->pend[i];
            if (c->fd < 0)
                continue;
            if (now >= c->deadline) {
                char why[96];
                snprintf(why, sizeof why, "it proved nothing within %g s", DT_RDZV_HELLO_S);
                refuse(s, c, why);
                continue;
            }
            if (c->deadline < wake)
                wake = c->deadline;
            pf[np] = (struct pollfd){.fd = c->fd, .events = POLLIN};
            who[np++] = c;
        }
        if (s->drops.held && s->drops.start + DT_RDZV_LOG_WINDOW_S < wake)
            wake = s->drops.start + DT_RDZV_LOG_WINDOW_S;
        if (poll(pf, (nfds_t)np, ms_until(wake)) < 0 && errno != EINTR)
            return;
        for (int i = 0; i < np; i++) {
            conn_t *c = who[i];
            if (!pf[i].revents || (c && c->fd != pf[i].fd))
                continue; /* (a slot evicted and reused in this round) */
            if (!c) {
                accept_some(s);
            } else if (c >= r->peers && c < r->peers + r->size) {
                char b;
                ssize_t k = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
                if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK &&
                               errno != EINTR)) {
                    dt_log(DT_LOG_WARN, "rendezvous",
                           "rank %d (%s) left before the job formed; waiting for it again",
                           (int)(c - r->peers), c->peer);
                    conn_close(c);
                }
            } else {
                char why[200];
                int st = frame_step(c, T_HELLO, 0, HELLO_MAX, why, sizeof why);
                if (st < 0)
                    refuse(s, c, why);
                else if (st > 0)
                    take_hello(s, c);
            }
        }
    }
}

static void server_free(server_t *s)
{
    if (!s)
        return;
    for (int i = 0; s->pend && i < s->cap; i++)
        conn_close(&s->pend[i]);
    free(s->pend);
    free(s->pf);
    free(s->who);
    free(s);
}

static int server_join(dt_rdzv_t *r)
{
    server_t *s = calloc(1, sizeof *s);
    if (s) {
        s->r = r;
        s->cap = pending_cap();
        s->pend = calloc((size_t)s->cap, sizeof *s->pend);
        s->pf = calloc(1 + (size_t)r->size + (size_t)s->cap, sizeof *s->pf);
        s->who = calloc(1 + (size_t)r->size + (size_t)s->cap, sizeof *s->who);
    }
    if (!s || !s->pend || !s->pf || !s->who) {
        server_free(s);
        return dt_err_set(DT_ERR_NOMEM, "rendezvous: out of memory");
    }
    for (int i = 0; i < s->cap; i++)
        s->pend[i].fd = -1;
    double t0 = mono_s();
    snprintf(r->job_id, sizeof r->job_id, "%s", r->proposal);
    gather_ranks(s, t0 + r->timeout_s);
    for (int i = 0; i < s->cap; i++)
        if (s->pend[i].fd >= 0)
            refuse(s, &s->pend[i], "the job formed (or failed) before it proved anything");
    drop_flush(&s->drops, mono_s());

    int *mark = calloc((size_t)r->size, sizeof *mark);
    if (!mark) {
        server_free(s);
        return dt_err_set(DT_ERR_NOMEM, "rendezvous: out of memory");
    }
    int n_missing = 0, n_diff = 0;
    for (int q = 1; q < r->size; q++)
        n_missing += r->peers[q].fd < 0;
    if (!s->fatal && n_missing > 0) {
        char missing[400], in[400], bad[300] = "";
        for (int q = 0; q < r->size; q++)
            mark[q] = q > 0 && r->peers[q].fd < 0;
        rank_list(missing, sizeof missing, mark, r->size);
        for (int q = 0; q < r->size; q++)
            mark[q] = q == 0 || r->peers[q].fd >= 0;
        rank_list(in, sizeof in, mark, r->size);
        if (s->bad_peer[0])
            snprintf(bad, sizeof bad, "; a connection from %s claiming rank %u failed the "
                     "job secret check: is DTRAIN_JOB_SECRET the same on every node?",
                     s->bad_peer, s->bad_rank);
        set_fatal(s, DT_ERR_TIMEOUT,
                  "rendezvous at %s:%d timed out after %g s: rank%s %s of %d never joined "
                  "(joined: %s)%s",
                  r->addr, r->port, r->timeout_s, n_missing == 1 ? "" : "s", missing, r->size,
                  in, bad);
    }
    if (!s->fatal) {
        /* every rank is in: do they run the same config? */
        char diff[600] = "";
        size_t len = 0;
        for (int q = 1; q < r->size; q++) {
            if (r->peers[q].config_hash == r->config_hash)
                continue;
            if (n_diff++ < 8 && len + 80 < sizeof diff) {
                int k = snprintf(diff + len, sizeof diff - len, "%srank %d has %016llx",
                                 len ? ", " : "", q,
                                 (unsigned long long)r->peers[q].config_hash);
                len += k > 0 ? (size_t)k : 0;
            }
        }
        if (n_diff)
            set_fatal(s, DT_ERR_CONFIG,
                      "rendezvous: the ranks resolved different configs: rank 0 has config "
                      "hash %016llx, %s%s (every node must run the same config; only "
                      "launch.node_rank may differ)",
                      (unsigned long long)r->config_hash, diff, n_diff > 8 ? ", ..." : "");
    }
    double wdl = mono_s() + 2.0;
    for (int q = 1; q < r->size; q++) {
        conn_t *c = &r->peers[q];
        if (c->fd >= 0 && send_welcome(r, c, s->fatal, s->fatal ? s->fatal_msg : "", wdl) != 0)
            set_fatal(s, DT_ERR_REMOTE, "rendezvous: rank %d (%s) went away before it was "
                      "welcomed: %s", q, c->peer, strerror(errno));
    }
    if (r->listen_fd >= 0)
        close(r->listen_fd); /* the job is formed or failed: no one else may join */
    r->listen_fd = -1;
    int rc = DT_OK;
    if (s->fatal)
        rc = dt_err_set(s->fatal, "%s", s->fatal_msg);
    free(mark);
    server_free(s);
    return rc;
}

/* ------------------------------------------------- another rank's join -- */

#ifdef DTRAIN_TEST_HOOKS
static _Atomic int hook_gai_error, hook_gai_times;

void dt_rdzv_test_resolve_fail(int gai_error, int times)
{
    hook_gai_error = gai_error;
    hook_gai_times = times;
}
#endif

/* The getaddrinfo error's own name, for messages a user can search. */
static const char *gai_name(int g)
{
    switch (g) {
    case EAI_NONAME: return "EAI_NONAME";
    case EAI_AGAIN: return "EAI_AGAIN";
    case EAI_FAIL: return "EAI_FAIL";
    case EAI_FAMILY: return "EAI_FAMILY";
    case EAI_SERVICE: return "EAI_SERVICE";
    case EAI_MEMORY: return "EAI_MEMORY";
    case EAI_SYSTEM: return "EAI_SYSTEM";
#ifdef EAI_NODATA
    case EAI_NODATA: return "EAI_NODATA";
#endif
#ifdef EAI_ADDRFAMILY
    case EAI_ADDRFAMILY: return "EAI_ADDRFAMILY";
#endif
    default: return "EAI_?";
    }
}

/* Whether asking again cannot help: the name does not exist, has no
 * address, or the resolver says its failure is final.  EAI_AGAIN (a DNS
 * server that did not answer), EAI_MEMORY and EAI_SYSTEM may pass. */
static int gai_permanent(int g)
{
    return g == EAI_NONAME || g == EAI_FAIL || g == EAI_FAMILY || g == EAI_SERVICE
#ifdef EAI_NODATA
           || g == EAI_NODATA
#endif
#ifdef EAI_ADDRFAMILY
           || g == EAI_ADDRFAMILY
#endif
        ;
}

/* getaddrinfo for a stream socket to host:port (port NULL: any); on
 * failure `why` = "cannot resolve 'host': <gai_strerror> (EAI_...)". */
static int resolve(const char *host, const char *port, struct addrinfo **res, char *why,
                   size_t cap)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    int g;
#ifdef DTRAIN_TEST_HOOKS
    if (hook_gai_times > 0 && hook_gai_times-- > 0)
        g = hook_gai_error;
    else
#endif
        g = getaddrinfo(host, port, &hints, res);
    if (g != 0)
        snprintf(why, cap, "cannot resolve '%.180s': %s (%s)", host,
                 g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g), gai_name(g));
    return g;
}

int dt_rdzv_check_host(const char *host, char *why, size_t cap)
{
    struct addrinfo *res = NULL;
    int g = resolve(host, NULL, &res, why, cap);
    if (g == 0) {
        freeaddrinfo(res);
        return 1;
    }
    return gai_permanent(g) ? -1 : 0;
}

/* One connect attempt to rank 0, every address its name resolves to: the
 * socket, or -1 with why (*final: a name that will never resolve). */
static int try_connect(dt_rdzv_t *r, double deadline, char *why, size_t cap, int *final)
{
    struct addrinfo *res = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", r->port);
    int g = resolve(r->addr, port, &res, why, cap);
    if (g != 0) {
        *final = gai_permanent(g);
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    a->ai_protocol);
        if (fd < 0) {
            snprintf(why, cap, "socket: %s", strerror(errno));
            continue;
        }
        int err = 0;
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            err = errno;
            if (err == EINPROGRESS) {
                double until = mono_s() + CONNECT_TRY_S;
                struct pollfd pf = {.fd = fd, .events = POLLOUT};
                int pr = poll(&pf, 1, ms_until(until < deadline ? until : deadline));
                socklen_t sl = sizeof err;
                err = ETIMEDOUT;
                if (pr > 0)
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl);
            }
        }
        if (err) {
            snprintf(why, cap, "%s", strerror(err));
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

/* Answer rank 0's challenge and wait for its welcome.  1: welcomed (r's
 * job id set) or a failure rank 0 reported (*status, msg); 0: the attempt
 * failed (why), worth another; -1: rank 0 could not prove the secret;
 * -2: rank 0 refused this rank's proof of it (why). */
static int client_attempt(dt_rdzv_t *r, double deadline, int *status, char *msg, size_t mcap,
                          char *why, size_t cap)
{
    conn_t *c = &r->up;
    double hello_by = mono_s() + DT_RDZV_HELLO_S;
    if (read_frame(c, T_CHALLENGE, 0, NONCE_BYTES, hello_by < deadline ? hello_by : deadline,
                   why, cap) < 0)
        return 0;
    if (c->len != NONCE_BYTES) {
        snprintf(why, cap, "a malformed challenge");
        return 0;
    }
    uint8_t nonce_s[NONCE_BYTES];
    memcpy(nonce_s, c->payload, NONCE_BYTES);
    uint8_t p[HELLO_MAX];
    size_t idlen = strlen(r->proposal);
    put32(p, (uint32_t)r->rank);
    put32(p + 4, (uint32_t)r->size);
    put64(p + 8, r->config_hash);
    if (random_bytes(p + 16, NONCE_BYTES))
        return 0;
    memcpy(c->peer_nonce, p + 16, NONCE_BYTES); /* our nonce: rank 0 proves over it */
    put16(p + 32, (uint32_t)idlen);
    memcpy(p + 34, r->proposal, idlen);
    mac_of(r, hello_label, sizeof hello_label, nonce_s, p, 34 + idlen, p + 34 + idlen);
    if (write_frame(c->fd, T_HELLO, p, (uint32_t)(HELLO_FIXED + idlen), deadline) != 0) {
        snprintf(why, cap, "sending the hello: %s", strerror(errno));
        return 0;
    }
    if (read_frame(c, T_WELCOME, T_REFUSED, WELCOME_MAX, deadline, why, cap) < 0)
        return 0;
    if (c->type == T_REFUSED) {
        /* not authenticated (rank 0 cannot prove a key this rank does not
         * share), but a wrong secret does not mend itself, and whoever can
         * answer on master_port can stop the job anyway */
        uint32_t code = c->len == REFUSED_MAX ? get32(c->payload) : 0;
        if (code == REFUSED_SECRET)
            snprintf(why, cap, "refused this rank's proof of the job secret: "
                     "DTRAIN_JOB_SECRET on this node differs from rank 0's (set the same "
                     "value on every node; or master_addr:master_port is another job's "
                     "rendezvous)");
        else
            snprintf(why, cap, "refused this rank (reason %u)", code);
        return -2;
    }
    const uint8_t *w = c->payload;
    uint32_t wl = c->len;
    if (wl < WELCOME_FIXED)
        goto malformed;
    uint32_t jl = get16(w + 4);
    if (jl >= JOB_ID_CAP || 8 + jl > wl - MAC_BYTES)
        goto malformed;
    uint32_t ml = get16(w + 6 + jl);
    if (ml > MSG_MAX || 8 + jl + ml + MAC_BYTES != wl)
        goto malformed;
    uint8_t mac[MAC_BYTES];
    mac_of(r, welcome_label, sizeof welcome_label, c->peer_nonce, w, 8 + jl + ml, mac);
    if (!dt_equal_ct(mac, w + 8 + jl + ml, MAC_BYTES))
        return -1;
    *status = (int)get32(w);
    memcpy(r->job_id, w + 6, jl);
    r->job_id[jl] = '\0';
    dt_world_sanitize_job_id(r->job_id);
    size_t mk = ml < mcap - 1 ? ml : mcap - 1;
    memcpy(msg, w + 8 + jl, mk);
    msg[mk] = '\0';
    return 1;
malformed:
    snprintf(why, cap, "a malformed welcome");
    return 0;
}

static int client_join(dt_rdzv_t *r)
{
    double t0 = mono_s(), deadline = t0 + r->timeout_s + CLIENT_GRACE_S;
    double backoff = BACKOFF_MIN_S;
    char why[256] = "no attempt finished";
    int reached = 0, impostor = 0;
    while (mono_s() < deadline) {
        conn_close(&r->up);
        int final = 0;
        r->up.fd = try_connect(r, deadline, why, sizeof why, &final);
        if (final)
            return dt_err_set(DT_ERR_CONFIG,
                              "rendezvous: rank %d of %d %s: check launch.master_addr "
                              "(--master-addr; MASTER_ADDR under torchrun)",
                              r->rank, r->size, why);
        if (r->up.fd >= 0) {
            reached = 1;
            int status = 0;
            char msg[MSG_MAX + 1];
            int st = client_attempt(r, deadline, &status, msg, sizeof msg, why, sizeof why);
            if (st > 0 && status == DT_OK)
                return DT_OK;
            if (st > 0) {
                conn_close(&r->up);
                return dt_err_set(status == DT_ERR_TIMEOUT || status == DT_ERR_CONFIG
                                      ? status
                                      : DT_ERR_REMOTE,
                                  "%s (reported by rank 0)", msg);
            }
            if (st == -2) {
                conn_close(&r->up);
                return dt_err_set(DT_ERR_CONFIG, "rendezvous: rank %d of %d: rank 0 at %s:%d %s",
                                  r->rank, r->size, r->addr, r->port, why);
            }
            if (st < 0) {
                impostor = 1;
                snprintf(why, sizeof why, "the rendezvous there could not prove it holds "
                                          "this job's secret (another job's, on the same port?)");
            }
        }
        conn_close(&r->up);
        double left = deadline - mono_s();
        if (left <= 0)
            break;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 0};
        double nap = backoff < left ? backoff : left;
        ts.tv_sec = (time_t)nap;
        ts.tv_nsec = (long)((nap - (double)ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
        backoff = backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : backoff * 2;
    }
    return dt_err_set(DT_ERR_TIMEOUT,
                      "rendezvous: rank %d of %d could not join rank 0 at %s:%d within %g s: "
                      "%s (last: %s)",
                      r->rank, r->size, r->addr, r->port, r->timeout_s,
                      impostor  ? "rank 0's answer failed the job secret check"
                      : reached ? "rank 0 was reached but the job did not form"
                                : "rank 0 never answered (not started, a firewall, or the "
                                  "wrong master_addr/master_port?)",
                      why);
}

int dt_rdzv_join(dt_rdzv_t *r)
{
    if (r->size == 1) {
        snprintf(r->job_id, sizeof r->job_id, "%s", r->proposal);
        r->joined = 1;
        return DT_OK;
    }
    int rc = r->rank == 0 ? server_join(r) : client_join(r);
    r->joined = rc == DT_OK;
    return rc;
}

/* ---------------------------------------------------------- all-gather -- */

static int server_gather(dt_rdzv_t *r, const void *mine, size_t bytes, uint8_t *all,
                         double timeout_s)
{
    const uint32_t seq = r->gather_seq;
    memcpy(all, mine, bytes);
    int *got = calloc((size_t)r->size, sizeof *got);
    struct pollfd *pf = calloc((size_t)r->size, sizeof *pf);
    int *which = calloc((size_t)r->size, sizeof *which);
    if (!got || !pf || !which) {
        free(got);
        free(pf);
        free(which);
        return dt_err_set(DT_ERR_NOMEM, "rendezvous: out of memory");
    }
    got[0] = 1;
    int status = DT_OK, n_got = 1;
    char msg[MSG_MAX] = "";
    double deadline = mono_s() + timeout_s;
    for (int q = 1; q < r->size; q++)
        conn_reset_frame(&r->peers[q]);
    while (n_got < r->size && status == DT_OK) {
        int np = 0;
        for (int q = 1; q < r->size; q++)
            if (!got[q]) {
                pf[np] = (struct pollfd){.fd = r->peers[q].fd, .events = POLLIN};
                which[np++] = q;
            }
        int ms = ms_until(deadline);
        if (ms == 0) {
            char missing[400];
            int *miss = got; /* reuse: mark the missing ones */
            for (int q = 0; q < r->size; q++)
                miss[q] = !miss[q];
            rank_list(missing, sizeof missing, miss, r->size);
            for (int q = 0; q < r->size; q++)
                miss[q] = !miss[q];
            status = DT_ERR_TIMEOUT;
            snprintf(msg, sizeof msg,
                     "rendezvous: bootstrap all-gather #%u timed out after %g s: rank%s %s "
                     "of %d sent nothing",
                     seq, timeout_s, r->size - n_got == 1 ? "" : "s", missing, r->size);
            break;
        }
        if (poll(pf, (nfds_t)np, ms) < 0 && errno != EINTR)
            continue;
        for (int i = 0; i < np && status == DT_OK; i++) {
            if (!pf[i].revents)
                continue;
            int q = which[i];
            conn_t *c = &r->peers[q];
            char why[200];
            int st = frame_step(c, T_GATHER, 0, GATHER_MAX, why, sizeof why);
            if (st == 0)
                continue;
            if (st < 0) {
                status = DT_ERR_REMOTE;
                snprintf(msg, sizeof msg, "rendezvous: bootstrap all-gather #%u: rank %d (%s): %s",
                         seq, q, c->peer, why);
            } else if (c->len < 8 || get32(c->payload) != seq ||
                       get32(c->payload + 4) != bytes || c->len != 8 + bytes) {
                status = DT_ERR_INVALID;
                snprintf(msg, sizeof msg,
                         "rendezvous: bootstrap all-gather #%u: rank %d offered %u bytes for "
                         "all-gather #%u, rank 0 %zu bytes for #%u (every rank must make the "
                         "same calls)",
                         seq, q, c->len >= 8 ? get32(c->payload + 4) : 0,
                         c->len >= 8 ? get32(c->payload) : 0, bytes, seq);
            } else {
                memcpy(all + (size_t)q * bytes, c->payload + 8, bytes);
                got[q] = 1;
                n_got++;
            }
            conn_reset_frame(c);
        }
    }
    /* every rank learns the outcome: the blobs, or the message */
    size_t body = status == DT_OK ? 8 + (size_t)r->size * bytes : 10 + strlen(msg);
    uint8_t *p = malloc(body);
    if (!p) {
        status = DT_ERR_NOMEM;
        snprintf(msg, sizeof msg, "rendezvous: out of memory");
    } else {
        put32(p, (uint32_t)status);
        put32(p + 4, seq);
        if (status == DT_OK) {
            memcpy(p + 8, all, (size_t)r->size * bytes);
        } else {
            put16(p + 8, (uint32_t)strlen(msg));
            memcpy(p + 10, msg, strlen(msg));
        }
        double wdl = mono_s() + 2.0;
        for (int q = 1; q < r->size; q++)
            if (r->peers[q].fd >= 0)
                write_frame(r->peers[q].fd, T_GATHERED, p, (uint32_t)body, wdl);
        free(p);
    }
    free(got);
    free(pf);
    free(which);
    return status == DT_OK ? DT_OK : dt_err_set(status, "%s", msg);
}

static int client_gather(dt_rdzv_t *r, const void *mine, size_t bytes, uint8_t *all,
                         double timeout_s)
{
    const uint32_t seq = r->gather_seq;
    double deadline = mono_s() + timeout_s + CLIENT_GRACE_S;
    uint8_t p[GATHER_MAX];
    put32(p, seq);
    put32(p + 4, (uint32_t)bytes);
    memcpy(p + 8, mine, bytes);
    if (write_frame(r->up.fd, T_GATHER, p, (uint32_t)(8 + bytes), deadline) != 0)
        return dt_err_set(DT_ERR_REMOTE,
                          "rendezvous: bootstrap all-gather #%u: sending to rank 0 at %s:%d: %s",
                          seq, r->addr, r->port, strerror(errno));
    size_t want = 8 + (size_t)r->size * bytes;
    uint32_t max = (uint32_t)(want > 10 + MSG_MAX ? want : 10 + MSG_MAX);
    char why[200];
    if (read_frame(&r->up, T_GATHERED, 0, max, deadline, why, sizeof why) < 0)
        return dt_err_set(DT_ERR_TIMEOUT,
                          "rendezvous: bootstrap all-gather #%u: rank 0 at %s:%d did not "
                          "answer within %g s: %s",
                          seq, r->addr, r->port, timeout_s, why);
    const uint8_t *g = r->up.payload;
    uint32_t len = r->up.len;
    if (len < 8 || get32(g + 4) != seq)
        return dt_err_set(DT_ERR_REMOTE, "rendezvous: bootstrap all-gather #%u: a malformed "
                          "answer from rank 0", seq);
    int status = (int)get32(g);
    if (status != DT_OK) {
        uint32_t ml = len >= 10 ? get16(g + 8) : 0;
        if (ml > len - 10 || ml > MSG_MAX)
            ml = 0;
        return dt_err_set(status == DT_ERR_TIMEOUT || status == DT_ERR_INVALID ? status
                                                                               : DT_ERR_REMOTE,
                          "%.*s (reported by rank 0)", (int)ml, (const char *)g + 10);
    }
    if (len != want)
        return dt_err_set(DT_ERR_REMOTE, "rendezvous: bootstrap all-gather #%u: rank 0 "
                          "answered %u bytes, %zu were due", seq, len, want);
    memcpy(all, g + 8, (size_t)r->size * bytes);
    return DT_OK;
}

int dt_rdzv_all_gather(dt_rdzv_t *r, const void *mine, size_t bytes, void *all,
                       double timeout_s)
{
    if (!r->joined)
        return dt_err_set(DT_ERR_INVALID, "rendezvous: all-gather before the job formed");
    if (bytes > DT_RDZV_BLOB_MAX || (bytes && (!mine || !all)))
        return dt_err_set(DT_ERR_INVALID,
                          "rendezvous: a bootstrap blob of %zu bytes (at most %d)", bytes,
                          DT_RDZV_BLOB_MAX);
    if (timeout_s <= 0)
        timeout_s = r->timeout_s;
    r->gather_seq++;
    if (r->size == 1) {
        memcpy(all, mine, bytes);
        return DT_OK;
    }
    return r->rank == 0 ? server_gather(r, mine, bytes, all, timeout_s)
                        : client_gather(r, mine, bytes, all, timeout_s);
}

void dt_rdzv_nodes_job_id(const char *secret, const char *addr, int port, char *out,
                          size_t cap)
{
    static const char label[] = "dtrain-job-id"; /* with its NUL */
    uint8_t key[DT_SHA256_BYTES], mac[MAC_BYTES];
    char where[300];
    int n = snprintf(where, sizeof where, "%s:%d", addr, port);
    dt_sha256(secret, strlen(secret), key);
    const void *parts[2] = {label, where};
    size_t sizes[2] = {sizeof label, n > 0 ? strlen(where) : 0};
    dt_hmac_sha256_parts(key, sizeof key, parts, sizes, 2, mac);
    explicit_bzero(key, sizeof key);
    char hex[17];
    for (int i = 0; i < 8; i++)
        snprintf(hex + 2 * i, 3, "%02x", mac[i]);
    snprintf(out, cap, "mn-%s", hex);
}

/* ------------------------------------------------------------ session -- */

static struct {
    pthread_mutex_t lock;
    int active;
    dt_rdzv_opts_t o;  /* its strings point into the copies below */
    char addr[256], job_id[JOB_ID_CAP], secret[DT_JOB_SECRET_MAX];
    dt_rdzv_t *r;      /* joined, or NULL */
} session = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Open and join; the session's lock held. */
static int session_join(void)
{
    dt_rdzv_t *r = NULL;
    int rc = dt_rdzv_open(&session.o, &r);
    if (!rc)
        rc = dt_rdzv_join(r);
    if (rc) {
        dt_rdzv_close(r);
        return rc;
    }
    session.r = r;
    dt_log(DT_LOG_INFO, "rendezvous", "rank %d of %d joined job %s (rank 0 at %s:%d)",
           session.o.rank, session.o.size, dt_rdzv_job_id(r), session.o.addr,
           dt_rdzv_port(r));
    return DT_OK;
}

int dt_rdzv_session_begin(struct dt_world *w, uint64_t config_hash, double timeout_s)
{
    pthread_mutex_lock(&session.lock);
    if (session.r)
        dt_rdzv_close(session.r);
    session.r = NULL;
    snprintf(session.addr, sizeof session.addr, "%s", w->master_addr);
    snprintf(session.job_id, sizeof session.job_id, "%s", w->job_id);
    snprintf(session.secret, sizeof session.secret, "%s", w->job_secret);
    session.o = (dt_rdzv_opts_t){.addr = session.addr, .port = w->master_port,
                                 .rank = w->rank, .size = w->size, .job_id = session.job_id,
                                 .secret = session.secret, .config_hash = config_hash,
                                 .timeout_s = timeout_s};
    session.active = 1;
    int rc = DT_OK;
    int spans = w->local_size < w->size && dt_world_from_launcher(w) &&
                strcmp(w->source, "dtrain launcher") == 0;
    if (spans) {
        rc = session_join();
        if (!rc)
            snprintf(w->job_id, sizeof w->job_id, "%s", dt_rdzv_job_id(session.r));
    }
    pthread_mutex_unlock(&session.lock);
    return rc;
}

int dt_rdzv_session_all_gather(const void *mine, size_t bytes, void *all, double timeout_s)
{
    pthread_mutex_lock(&session.lock);
    int rc;
    if (!session.active)
        rc = dt_err_set(DT_ERR_UNSUPPORTED, "bootstrap all-gather: no rendezvous here (it is "
                        "offered while `dtrain run` initialises the communicator)");
    else if (!session.r && (rc = session_join()))
        ;
    else
        rc = dt_rdzv_all_gather(session.r, mine, bytes, all, timeout_s);
    pthread_mutex_unlock(&session.lock);
    return rc;
}

void dt_rdzv_session_end(void)
{
    pthread_mutex_lock(&session.lock);
    dt_rdzv_close(session.r);
    session.r = NULL;
    session.active = 0;
    explicit_bzero(session.secret, sizeof session.secret);
    pthread_mutex_unlock(&session.lock);
}
