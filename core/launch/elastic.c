/*
 * core/launch/elastic.c - the store of an elastic job (a thread of node
 * 0's launcher) and an agent's side of it: elastic.h.
 *
 * The store is one poll loop over its listener, a wake-up pipe and every
 * agent's connection; after each pass it decides whether a round can be
 * formed, the job is over, or it must give up.
 */
#include "launch/elastic.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/sha256/sha256.h"
#include "launch/tcp_listen.h"
#include "util/error.h"

#define NONCE_BYTES 16
#define MAX_CONN 256
#define FAILS_CAP 8192

static const char join_label[] = "dtrain-elastic-join"; /* with its NUL */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* The proof an agent sends: HMAC(SHA-256(secret), label, nonce, "nr np"). */
static void join_mac(const char *secret, const char *nonce_hex, int node_rank, int nproc,
                     char out[2 * DT_SHA256_BYTES + 1])
{
    uint8_t key[DT_SHA256_BYTES], mac[DT_SHA256_BYTES];
    dt_sha256(secret, strlen(secret), key);
    char who[64];
    int wn = snprintf(who, sizeof who, "%d %d", node_rank, nproc);
    const void *parts[3] = {join_label, nonce_hex, who};
    size_t sizes[3] = {sizeof join_label, strlen(nonce_hex), (size_t)wn};
    dt_hmac_sha256_parts(key, sizeof key, parts, sizes, 3, mac);
    hex(mac, sizeof mac, out);
}

/* Write a whole line (small: the socket buffer takes it); 0 or -1. */
static int send_line(int fd, const char *line)
{
    size_t n = strlen(line), off = 0;
    double until = mono_s() + DT_ELASTIC_HELLO_S;
    while (off < n) {
        ssize_t w = send(fd, line + off, n - off, MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
        } else if (w < 0 && (errno == EINTR || errno == EAGAIN)) {
            if (mono_s() > until)
                return -1;
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, 100);
        } else {
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------- store -- */

enum { N_HELLO, N_WAIT, N_RUN };

typedef struct node {
    int fd;
    int state;
    int node_rank, nproc;
    char addr[96];
    char nonce[2 * NONCE_BYTES + 1];
    double hello_until;
    size_t len;
    char buf[DT_ELASTIC_LINE];
} node_t;

struct dt_elastic_store {
    dt_elastic_store_opts_t o;
    char addr[256], secret[256];
    int lfd, wake[2];
    pthread_t th;
    int started;
    node_t *nodes[MAX_CONN];
    int n;
    int round, restarts;
    int live;               /* nodes of the current round not yet reported */
    int done;               /* nodes of the current round that ended well */
    double formable_since;  /* when a round could first be formed */
    double enough_since;    /* when min_nodes first waited; 0: not yet */
    double backoff_until;
    double first_fail_at;   /* when this round's first failure came; 0 */
    char fails[FAILS_CAP];  /* this round's failures */
    char all_fails[FAILS_CAP]; /* the job's */
    int n_fails;
    _Atomic int over;       /* the thread has ended its work */
};

static void append(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t cap, const char *fmt, ...)
{
    size_t n = strlen(buf);
    if (n + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

static void peer_name(int fd, char *buf, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[80] = "?", port[16] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0)
        getnameinfo((struct sockaddr *)&ss, sl, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(buf, cap, "%s", host);
}

static void drop(dt_elastic_store_t *s, int i)
{
    close(s->nodes[i]->fd);
    free(s->nodes[i]);
    s->nodes[i] = s->nodes[--s->n];
}

/* A failure of this round, for the restart line and the final message. */
static void add_fail(dt_elastic_store_t *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void add_fail(dt_elastic_store_t *s, const char *fmt, ...)
{
    char one[DT_ELASTIC_LINE];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(one, sizeof one, fmt, ap);
    va_end(ap);
    if (!s->fails[0])
        s->first_fail_at = mono_s();
    append(s->fails, sizeof s->fails, "%s%s", s->fails[0] ? "; " : "", one);
    append(s->all_fails, sizeof s->all_fails, "%s(round %d) %s", s->all_fails[0] ? "; " : "",
        s->round, one);
    s->n_fails++;
}

/* Tell every agent connected to stop with `code` and `msg`. */
static void stop_all(dt_elastic_store_t *s, int code, const char *msg)
{
    char line[DT_ELASTIC_LINE + 32];
    snprintf(line, sizeof line, "STOP %d|%.*s\n", code, DT_ELASTIC_LINE - 64, msg);
    for (int i = 0; i < s->n; i++)
        if (s->nodes[i]->state != N_HELLO)
            send_line(s->nodes[i]->fd, line);
}

static void take_line(dt_elastic_store_t *s, int i, char *line)
{
    node_t *c = s->nodes[i];
    if (c->state == N_HELLO) {
        int nr, np;
        char mac[80], want[2 * DT_SHA256_BYTES + 1];
        if (sscanf(line, "JOIN %d %d %70s", &nr, &np, mac) != 3 || nr < 0 || np < 1) {
            drop(s, i);
            return;
        }
        join_mac(s->secret, c->nonce, nr, np, want);
        if (strcmp(mac, want) != 0) {
            fprintf(stderr, "dtrain: elastic: refused node %d from %s: it does not hold this "
                            "job's DTRAIN_JOB_SECRET\n", nr, c->addr);
            send_line(c->fd, "STOP 2|the elastic store refused this node: it does not hold "
                             "the job's DTRAIN_JOB_SECRET\n");
            drop(s, i);
            return;
        }
        for (int k = 0; k < s->n; k++)
            if (k != i && s->nodes[k]->state != N_HELLO && s->nodes[k]->node_rank == nr) {
                char msg[300];
                snprintf(msg, sizeof msg, "STOP 2|node_rank %d is already in the job (from %s):"
                         " every node needs its own launch.node_rank\n", nr,
                         s->nodes[k]->addr);
                send_line(c->fd, msg);
                drop(s, i);
                return;
            }
        c->node_rank = nr;
        c->nproc = np;
        c->state = N_WAIT;
        if (s->live > 0)
            fprintf(stderr, "dtrain: elastic: node %d (%s) joined; it waits for the next "
                            "round\n", nr, c->addr);
        return;
    }
    if (c->state == N_RUN && strncmp(line, "END ", 4) == 0) {
        s->live--;
        const char *what = strchr(line, '|');
        what = what ? what + 1 : "";
        if (strncmp(line + 4, "ok", 2) == 0) {
            s->done++;
            drop(s, i); /* its agent exits */
        } else if (strncmp(line + 4, "config", 6) == 0) {
            stop_all(s, 2, what);
            s->live = -1; /* the job is over */
        } else {
            add_fail(s, "node %d (%s): %s", c->node_rank, c->addr, what);
            c->state = N_WAIT;
        }
    }
}

/* Read what node i sent; a closed connection drops it (a node lost when
 * its round runs). */
static void read_node(dt_elastic_store_t *s, int i)
{
    node_t *c = s->nodes[i];
    ssize_t got = recv(c->fd, c->buf + c->len, sizeof c->buf - 1 - c->len, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (got <= 0 || (c->len += (size_t)got) >= sizeof c->buf - 1) {
        if (c->state == N_RUN) {
            s->live--;
            add_fail(s, "node %d (%s) lost: its launcher's connection closed", c->node_rank,
                     c->addr);
        }
        drop(s, i);
        return;
    }
    c->buf[c->len] = '\0';
    char *nl;
    while ((nl = strchr(c->buf, '\n'))) {
        *nl = '\0';
        char line[DT_ELASTIC_LINE];
        snprintf(line, sizeof line, "%s", c->buf);
        size_t used = (size_t)(nl - c->buf) + 1;
        memmove(c->buf, nl + 1, c->len - used + 1);
        c->len -= used;
        int before = s->n;
        node_t *was = c;
        take_line(s, i, line);
        if (s->n != before || s->nodes[i] != was)
            return; /* dropped */
    }
}

static void accept_some(dt_elastic_store_t *s)
{
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        if (s->n == MAX_CONN) {
            close(fd);
            continue;
        }
        node_t *c = calloc(1, sizeof *c);
        uint8_t nonce[NONCE_BYTES];
        if (!c || getrandom(nonce, sizeof nonce, 0) != (ssize_t)sizeof nonce) {
            free(c);
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->fd = fd;
        c->state = N_HELLO;
        c->hello_until = mono_s() + DT_ELASTIC_HELLO_S;
        hex(nonce, sizeof nonce, c->nonce);
        peer_name(fd, c->addr, sizeof c->addr);
        char line[64];
        snprintf(line, sizeof line, "DTEL1 %s\n", c->nonce);
        if (send_line(fd, line) != 0) {
            free(c);
            close(fd);
            continue;
        }
        s->nodes[s->n++] = c;
    }
}

static int by_node_rank(const void *a, const void *b)
{
    const node_t *x = *(node_t *const *)a, *y = *(node_t *const *)b;
    return (x->node_rank > y->node_rank) - (x->node_rank < y->node_rank);
}

/* Form a round of the waiting nodes (at most max_nodes, by node_rank). */
static void form_round(dt_elastic_store_t *s)
{
    node_t *w[MAX_CONN];
    int nw = 0;
    for (int i = 0; i < s->n; i++)
        if (s->nodes[i]->state == N_WAIT)
            w[nw++] = s->nodes[i];
    qsort(w, (size_t)nw, sizeof *w, by_node_rank);
    if (nw > s->o.max_nodes)
        nw = s->o.max_nodes;
    int world = 0;
    for (int i = 0; i < nw; i++)
        world += w[i]->nproc;
    s->round++;
    char note[DT_ELASTIC_LINE] = "";
    if (s->round > 1)
        append(note, sizeof note, "restart %d of at most %d after %s; ", s->restarts,
            s->o.max_restarts, s->fails);
    append(note, sizeof note, "round %d: %d node%s, %d ranks:", s->round, nw, nw == 1 ? "" : "s",
        world);
    int base = 0;
    for (int i = 0; i < nw; i++) {
        append(note, sizeof note, "%s node %d (%s) ranks %d-%d", i ? "," : "", w[i]->node_rank,
            w[i]->addr, base, base + w[i]->nproc - 1);
        base += w[i]->nproc;
    }
    base = 0;
    for (int i = 0; i < nw; i++) {
        char line[DT_ELASTIC_LINE + 96];
        snprintf(line, sizeof line, "ROUND %d %d %d %d %d|%s\n", s->round, world, base, nw,
                 s->restarts, note);
        base += w[i]->nproc;
        w[i]->state = N_RUN;
        send_line(w[i]->fd, line);
    }
    s->live = nw;
    s->done = 0;
    s->fails[0] = '\0';
    s->first_fail_at = 0;
    s->enough_since = 0;
}

/* After a pass: form a round, end the job, or give up.  Returns 1 when
 * the store's work is over. */
static int decide(dt_elastic_store_t *s, double now)
{
    if (s->live < 0)
        return 1; /* a config error ended it */
    if (s->live > 0 && s->fails[0] && now > s->first_fail_at + DT_ELASTIC_REPORT_S(s->o.timeout_s)) {
        /* a node that has not reported long after the round failed (its
         * ranks' collectives time out within launch.timeout) is cut off:
         * its link may be down with its connection still open */
        for (int i = s->n - 1; i >= 0; i--)
            if (s->nodes[i]->state == N_RUN) {
                add_fail(s, "node %d (%s) did not report within %g s of the round's first "
                         "failure: taken for lost", s->nodes[i]->node_rank, s->nodes[i]->addr,
                         DT_ELASTIC_REPORT_S(s->o.timeout_s));
                s->live--;
                drop(s, i);
            }
    }
    if (s->live > 0)
        return 0;
    if (s->round > 0 && s->formable_since == 0) {
        /* the round just ended */
        s->formable_since = now;
        if (!s->fails[0]) {
            stop_all(s, 0, "the job finished before this node could join it");
            return 1;
        }
        s->restarts++;
        if (s->restarts > s->o.max_restarts) {
            char msg[FAILS_CAP + 256];
            snprintf(msg, sizeof msg, "elastic: gave up after %d restart%s (launch.max_restarts"
                     " = %d): %d failure%s: %s", s->o.max_restarts,
                     s->o.max_restarts == 1 ? "" : "s", s->o.max_restarts, s->n_fails,
                     s->n_fails == 1 ? "" : "s", s->all_fails);
            stop_all(s, 1, msg);
            return 1;
        }
        double b = DT_ELASTIC_BACKOFF_S;
        for (int k = 1; k < s->restarts && b < DT_ELASTIC_BACKOFF_MAX_S; k++)
            b *= 2;
        s->backoff_until = now + (b < DT_ELASTIC_BACKOFF_MAX_S ? b : DT_ELASTIC_BACKOFF_MAX_S);
    }
    int nw = 0, host = 0;
    for (int i = 0; i < s->n; i++)
        if (s->nodes[i]->state == N_WAIT) {
            nw++;
            host |= s->nodes[i]->node_rank == 0;
        }
    if (nw >= s->o.min_nodes && host) {
        if (s->enough_since == 0)
            s->enough_since = now;
        if (now >= s->backoff_until &&
            (nw >= s->o.max_nodes || now >= s->enough_since + DT_ELASTIC_LAST_CALL_S)) {
            form_round(s);
            s->formable_since = 0;
        }
        return 0;
    }
    s->enough_since = 0;
    if (now - s->formable_since > s->o.timeout_s + (s->backoff_until > s->formable_since
                                                        ? s->backoff_until - s->formable_since
                                                        : 0)) {
        char msg[FAILS_CAP + 256];
        snprintf(msg, sizeof msg, "elastic: only %d of at least %d node%s (node 0 %s) waited for "
                 "round %d within %g s (launch.timeout)%s%s", nw, s->o.min_nodes,
                 s->o.min_nodes == 1 ? "" : "s", host ? "among them" : "not among them",
                 s->round + 1, s->o.timeout_s, s->all_fails[0] ? "; failures: " : "",
                 s->all_fails);
        stop_all(s, 1, msg);
        return 1;
    }
    return 0;
}

static void *store_main(void *arg)
{
    dt_elastic_store_t *s = arg;
    s->formable_since = mono_s();
    for (;;) {
        struct pollfd pf[MAX_CONN + 2];
        int np = 0;
        pf[np++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        pf[np++] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
        for (int i = 0; i < s->n; i++)
            pf[np++] = (struct pollfd){.fd = s->nodes[i]->fd, .events = POLLIN};
        int pr = poll(pf, (nfds_t)np, 100);
        if (pr < 0 && errno != EINTR)
            break;
        if (pf[0].revents)
            break;
        /* nodes first (their indices shift as some drop), from the end */
        for (int k = np - 1; k >= 2; k--)
            if (pf[k].revents && k - 2 < s->n && s->nodes[k - 2]->fd == pf[k].fd)
                read_node(s, k - 2);
        if (pf[1].revents)
            accept_some(s);
        double now = mono_s();
        for (int i = s->n - 1; i >= 0; i--)
            if (s->nodes[i]->state == N_HELLO && now > s->nodes[i]->hello_until)
                drop(s, i);
        if (decide(s, now))
            break;
    }
    s->over = 1;
    return NULL;
}

static int bind_store(dt_elastic_store_t *s)
{
    s->lfd = dt_tcp_listen_any(s->addr, s->o.port, NULL);
    if (s->lfd >= 0)
        return DT_OK;
    return dt_err_set(DT_ERR_SYSTEM,
                      "elastic: node 0 cannot listen on port %d (launch.master_port) for the "
                      "job's store: %s", s->o.port, strerror(errno));
}

int dt_elastic_store_start(const dt_elastic_store_opts_t *o, dt_elastic_store_t **out)
{
    *out = NULL;
    dt_elastic_store_t *s = calloc(1, sizeof *s);
    if (!s)
        return dt_err_set(DT_ERR_NOMEM, "elastic: out of memory");
    s->o = *o;
    snprintf(s->addr, sizeof s->addr, "%s", o->addr);
    snprintf(s->secret, sizeof s->secret, "%s", o->secret);
    s->lfd = s->wake[0] = s->wake[1] = -1;
    int rc = bind_store(s);
    if (rc == DT_OK && pipe2(s->wake, O_CLOEXEC) != 0)
        rc = dt_err_set(DT_ERR_SYSTEM, "elastic: pipe: %s", strerror(errno));
    if (rc == DT_OK) {
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        int e = pthread_create(&s->th, NULL, store_main, s);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (e != 0)
            rc = dt_err_set(DT_ERR_SYSTEM, "elastic: starting the store: %s", strerror(e));
        else
            s->started = 1;
    }
    if (rc != DT_OK) {
        dt_elastic_store_stop(s);
        return rc;
    }
    *out = s;
    return DT_OK;
}

void dt_elastic_store_finish(dt_elastic_store_t *s, double timeout_s)
{
    double until = mono_s() + timeout_s;
    while (s && s->started && !s->over && mono_s() < until) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    dt_elastic_store_stop(s);
}

void dt_elastic_store_stop(dt_elastic_store_t *s)
{
    if (!s)
        return;
    if (s->started) {
        ssize_t ignored = write(s->wake[1], "x", 1);
        (void)ignored;
        pthread_join(s->th, NULL);
    }
    while (s->n > 0)
        drop(s, s->n - 1);
    if (s->lfd >= 0)
        close(s->lfd);
    for (int i = 0; i < 2; i++)
        if (s->wake[i] >= 0)
            close(s->wake[i]);
    free(s);
}

/* ------------------------------------------------------------- agent -- */

struct dt_elastic_agent {
    int fd;
    char where[300];
    size_t len;
    char buf[DT_ELASTIC_LINE + 128];
};

/* One line from the store; deadline < 0: none.  0, or -1 with why set. */
static int read_line(dt_elastic_agent_t *a, char *line, size_t cap, double deadline, char *why,
                     size_t wcap)
{
    for (;;) {
        char *nl = memchr(a->buf, '\n', a->len);
        if (nl) {
            size_t n = (size_t)(nl - a->buf);
            snprintf(line, cap, "%.*s", (int)n, a->buf);
            memmove(a->buf, nl + 1, a->len - n - 1);
            a->len -= n + 1;
            return 0;
        }
        if (a->len >= sizeof a->buf) {
            snprintf(why, wcap, "a line longer than %zu bytes", sizeof a->buf);
            return -1;
        }
        int ms = 1000;
        if (deadline >= 0) {
            double left = deadline - mono_s();
            if (left <= 0) {
                snprintf(why, wcap, "no answer in time");
                return -1;
            }
            ms = (int)(left * 1000) + 1;
        }
        struct pollfd p = {.fd = a->fd, .events = POLLIN};
        int pr = poll(&p, 1, ms);
        if (pr < 0 && errno != EINTR) {
            snprintf(why, wcap, "poll: %s", strerror(errno));
            return -1;
        }
        if (pr <= 0)
            continue;
        ssize_t got = recv(a->fd, a->buf + a->len, sizeof a->buf - a->len, 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got <= 0) {
            snprintf(why, wcap, "%s", got == 0 ? "the connection closed" : strerror(errno));
            return -1;
        }
        a->len += (size_t)got;
    }
}

static int try_connect(const char *addr, int port, char *why, size_t cap)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int g = getaddrinfo(addr, ps, &hints, &res);
    if (g != 0) {
        snprintf(why, cap, "cannot resolve '%s': %s", addr, gai_strerror(g));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            snprintf(why, cap, "%s", strerror(errno));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

int dt_elastic_agent_join(const char *addr, int port, const char *secret, int node_rank,
                          int nproc, double timeout_s, dt_elastic_agent_t **out)
{
    *out = NULL;
    dt_elastic_agent_t *a = calloc(1, sizeof *a);
    if (!a)
        return dt_err_set(DT_ERR_NOMEM, "elastic: out of memory");
    snprintf(a->where, sizeof a->where, "%s:%d", addr, port);
    double deadline = mono_s() + timeout_s;
    char why[256] = "";
    while ((a->fd = try_connect(addr, port, why, sizeof why)) < 0 && mono_s() < deadline) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (a->fd < 0) {
        free(a);
        return dt_err_set(DT_ERR_TIMEOUT,
                          "elastic: node %d could not reach the job's store at %s:%d (node 0's "
                          "launcher) within %g s: %s", node_rank, addr, port, timeout_s, why);
    }
    char line[DT_ELASTIC_LINE], nonce[80], mac[2 * DT_SHA256_BYTES + 1];
    if (read_line(a, line, sizeof line, mono_s() + DT_ELASTIC_HELLO_S, why, sizeof why) != 0 ||
        sscanf(line, "DTEL1 %64s", nonce) != 1) {
        dt_elastic_agent_close(a);
        return dt_err_set(DT_ERR_REMOTE, "elastic: %s:%d is not the job's store: %s", addr,
                          port, why[0] ? why : "it did not greet as one");
    }
    join_mac(secret, nonce, node_rank, nproc, mac);
    snprintf(line, sizeof line, "JOIN %d %d %s\n", node_rank, nproc, mac);
    if (send_line(a->fd, line) != 0) {
        dt_elastic_agent_close(a);
        return dt_err_set(DT_ERR_REMOTE, "elastic: the store at %s:%d closed the connection",
                          addr, port);
    }
    *out = a;
    return DT_OK;
}

static int lost_store(const dt_elastic_agent_t *a, const char *why)
{
    return dt_err_set(DT_ERR_REMOTE,
                      "elastic: lost the job's store at %s (node 0's launcher): %s; the job "
                      "cannot re-form without node 0 (it hosts the store, as torchrun's c10d "
                      "store does): start node 0 and this node again to resume from the last "
                      "checkpoint", a->where, why);
}

int dt_elastic_agent_next(dt_elastic_agent_t *a, double wait_s, dt_elastic_round_t *r,
                          int *stop, char *msg, size_t cap)
{
    *stop = -1;
    msg[0] = '\0';
    char line[DT_ELASTIC_LINE + 128], why[256];
    if (read_line(a, line, sizeof line, wait_s < 0 ? -1 : mono_s() + wait_s, why,
                  sizeof why) != 0) {
        if (strcmp(why, "no answer in time") == 0)
            snprintf(why, sizeof why, "no word from it within %g s", wait_s);
        return lost_store(a, why);
    }
    const char *text = strchr(line, '|');
    text = text ? text + 1 : "";
    memset(r, 0, sizeof *r);
    if (sscanf(line, "ROUND %d %d %d %d %d|", &r->round, &r->world_size, &r->rank_base,
               &r->nnodes, &r->restarts) == 5) {
        snprintf(r->note, sizeof r->note, "%s", text);
        return DT_OK;
    }
    if (sscanf(line, "STOP %d|", stop) == 1) {
        snprintf(msg, cap, "%s", text);
        return DT_OK;
    }
    return dt_err_set(DT_ERR_REMOTE, "elastic: the store at %s sent '%.60s'", a->where, line);
}

int dt_elastic_agent_report(dt_elastic_agent_t *a, const char *kind, const char *what)
{
    char line[DT_ELASTIC_LINE];
    snprintf(line, sizeof line, "END %s|%.*s\n", kind, DT_ELASTIC_LINE - 64, what ? what : "");
    for (char *p = line; p[1]; p++)
        if (*p == '\n')
            *p = ' ';
    if (send_line(a->fd, line) != 0)
        return lost_store(a, "the connection closed");
    return DT_OK;
}

void dt_elastic_agent_close(dt_elastic_agent_t *a)
{
    if (!a)
        return;
    if (a->fd >= 0)
        close(a->fd);
    free(a);
}
