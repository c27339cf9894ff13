/*
 * plugins/tcp/tcp_comm.c - the `tcp` communicator plugin: ranks on any
 * machines that reach each other over IPv4 or IPv6, with nothing but sockets -
 * what carries the bytes between nodes when `dtrain run --nnodes N` starts
 * each node's ranks and no MPI launcher is involved.
 *
 * This file holds the plugin table and config keys and the group
 * lifecycle: init, split, abort, finalize.  The mesh and its handshake are
 * in tcp_mesh.c, the progress thread in tcp_engine.c, the operations in
 * tcp_ops.c.
 *
 * Meeting: every rank listens on an ephemeral port of its node's address
 * ([tcp] address, else the one its route to MASTER_ADDR leaves from) and
 * the job's rendezvous (host slot bootstrap_all_gather, which `dtrain run`
 * offers on one node or several) tells every rank every listener, as
 * plugins/nccl hands its unique id around.  A split's ranks listen anew
 * and swap addresses through an all_gather on the parent group.  Each
 * group is a full mesh of sockets, each proven by the job's key
 * (tcp_mesh.c), driven by one progress thread of the group.
 *
 * Abort: the job's failure is published in this process; every group's
 * thread fails its operations with it and sends it to each peer as a
 * notice, so every rank's waits fail promptly with "rank R aborted:
 * <reason>".  Finalize flushes the notices (at most TCP_FLUSH_MS).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/comm/comm_split.h"
#include "dtrain/sdk/cfg.h"
#include "tcp_internal.h"

static const dt_config_key_t tcp_keys[] = {
    {.name = "address", .type = DT_CFG_STRING, .def = "\"\"", .min = 0, .max = 0, .choices = NULL,
     .doc = "IPv4 or IPv6 address this rank listens on for its peers (empty: the address "
            "this node's route to MASTER_ADDR leaves from, 127.0.0.1 without one)"},
    {.name = "hierarchical", .type = DT_CFG_BOOL, .def = "true", .min = 0, .max = 0,
     .choices = NULL,
     .doc = "all_reduce in three rings when every node holds the same number (>= 2) of a "
            "group's ranks: inside the node, across the nodes, inside again, so each "
            "node's link carries 2(M-1)/M of the buffer instead of the flat ring's 2(n-1)/n "
            "x L (f32, f64 and integers; bf16/f16 keep the flat ring, rounded once)"},
    {.name = "socket_buffer_bytes", .type = DT_CFG_INT, .def = "0", .min = 0,
     .max = (double)(1 << 30), .choices = NULL,
     .doc = "send and receive buffer of every socket (0: the kernel's default, which "
            "autotunes)"},
};

/* What each rank gives the rendezvous: where it listens. */
#define ADDR_MAGIC "DTTCPA2"
typedef struct addr_blob {
    char magic[8];
    tcp_ip_t addr;
    uint16_t port;  /* host order */
    uint16_t valid; /* 1: a listener (a split's NO_COLOR rank gives 0) */
    uint32_t reserved;
} addr_blob_t;

/* ---- the job ---------------------------------------------------------------- */

static void job_unref(tcp_job_t *job)
{
    if (!job || atomic_fetch_sub(&job->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&job->mu);
    free(job);
}

static void job_add(tcp_job_t *job, dt_comm_t *c)
{
    pthread_mutex_lock(&job->mu);
    c->job_next = job->groups;
    job->groups = c;
    pthread_mutex_unlock(&job->mu);
}

static void job_remove(tcp_job_t *job, dt_comm_t *c)
{
    pthread_mutex_lock(&job->mu);
    for (dt_comm_t **pp = &job->groups; *pp; pp = &(*pp)->job_next)
        if (*pp == c) {
            *pp = c->job_next;
            break;
        }
    pthread_mutex_unlock(&job->mu);
}

/* ---- groups -------------------------------------------------------------------- */

static void comm_free(dt_comm_t *c)
{
    if (!c)
        return;
    free(c->local);
    free(c->cross);
    for (int p = 0; c->peers && p < c->size; p++) {
        tcp_peer_t *pe = &c->peers[p];
        if (pe->fd >= 0)
            close(pe->fd);
        while (pe->out_head) { /* the thread is gone: only owned frames matter */
            tcp_out_t *o = pe->out_head;
            pe->out_head = o->next;
            if (o->owned) {
                free(o->own_data);
                free(o);
            }
        }
        if (pe->in_stash && pe->in_stash->hdr.type == TCP_FR_ABORT) {
            free(pe->in_stash->data);
            free(pe->in_stash);
        }
    }
    while (c->stash) {
        tcp_stash_t *s = c->stash;
        c->stash = s->next;
        free(s->data);
        free(s);
    }
    tcp_drop_live(c);
    if (c->wake[0] >= 0)
        close(c->wake[0]);
    if (c->wake[1] >= 0)
        close(c->wake[1]);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->peers);
    free(c->wranks);
    free(c);
}

/* Defined below; every handle this plugin makes starts with it. */
static const dt_comm_ops_v1_t tcp_ops;

static dt_comm_t *comm_alloc(const dt_host_v1_t *host, tcp_job_t *job, int32_t rank,
                             int32_t size, int64_t timeout_ms)
{
    dt_comm_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->host = host;
    c->ops = &tcp_ops;
    c->job = job;
    c->rank = rank;
    c->size = size;
    c->timeout_ms = timeout_ms;
    c->wake[0] = c->wake[1] = -1;
    atomic_init(&c->waiting_on, -1);
    atomic_init(&c->notified, 0);
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->wranks = calloc((size_t)size, sizeof *c->wranks);
    c->peers = calloc((size_t)size, sizeof *c->peers);
    if (!c->wranks || !c->peers || pipe2(c->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        comm_free(c);
        return NULL;
    }
    for (int p = 0; p < size; p++)
        c->peers[p].fd = -1;
    return c;
}

/* Connect the mesh, start the thread, join the job's groups. */
static int comm_start(dt_comm_t *c, int listen_fd, const tcp_ip_t *addrs,
                      const uint16_t *ports)
{
    int st = tcp_mesh_connect(c, listen_fd, addrs, ports, c->timeout_ms);
    if (st == DT_OK && tcp_find_nodes(c, addrs, c->job->hierarchical) != DT_OK)
        st = c->host->set_error(c->host, DT_ERR_NOMEM, "group %s: out of memory", c->gname);
    if (st != DT_OK)
        return st;
    int e = pthread_create(&c->thread, NULL, tcp_thread_main, c);
    if (e != 0)
        return c->host->set_error(c->host, DT_ERR_SYSTEM, "group %s: cannot start its "
                                  "progress thread: %s", c->gname, strerror(e));
    c->thread_started = 1;
    job_add(c->job, c);
    return DT_OK;
}

/* Stop the thread (failing what is still queued when `why` is set) and
 * free the group. */
static void comm_stop(dt_comm_t *c, const char *why)
{
    if (c->thread_started) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        if (why)
            tcp_mark_broken_locked(c, DT_ERR_REMOTE, why);
        pthread_mutex_unlock(&c->mu);
        tcp_wake(c);
        pthread_join(c->thread, NULL);
        job_remove(c->job, c);
    }
    tcp_job_t *job = c->job;
    comm_free(c);
    job_unref(job);
}

static int read_keys(const dt_host_v1_t *h, const char **addr, int64_t *sock_buf, int *hier)
{
    int st = dt_cfg_bool(h, "hierarchical", hier);
    if (st == DT_OK)
        st = dt_cfg_string(h, "address", addr);
    if (st == DT_OK)
        st = dt_cfg_int(h, "socket_buffer_bytes", sock_buf);
    return st;
}

/* Every rank's listener from the job's rendezvous. */
static int swap_addresses(const dt_host_v1_t *h, const dt_comm_init_v1_t *a, dt_comm_t *c,
                          tcp_ip_t addr, uint16_t port, tcp_ip_t *addrs,
                          uint16_t *ports)
{
    if (!DT_HOST_HAS(h, bootstrap_all_gather))
        return h->set_error(h, DT_ERR_UNSUPPORTED, "init: the tcp communicator meets its "
                            "peers through the job's rendezvous (the host table's optional "
                            "bootstrap_all_gather), which this host (ABI %u.%u) lacks", h->abi_major,
                            h->abi_minor);
    addr_blob_t mine = {.addr = addr, .port = port, .valid = 1};
    memcpy(mine.magic, ADDR_MAGIC, sizeof mine.magic);
    addr_blob_t *all = calloc((size_t)a->size, sizeof *all);
    if (!all)
        return h->set_error(h, DT_ERR_NOMEM, "init: out of memory");
    int st = h->bootstrap_all_gather(h, &mine, sizeof mine, all, a->timeout_ms);
    if (st == DT_ERR_UNSUPPORTED) {
        free(all);
        return h->set_error(h, st, "init: the tcp communicator meets its peers through the "
                            "job's rendezvous, and this process has none (start the job "
                            "with `dtrain run`, which opens it on MASTER_ADDR:MASTER_PORT)");
    }
    for (int p = 0; st == DT_OK && p < a->size; p++) {
        if (memcmp(all[p].magic, ADDR_MAGIC, sizeof all[p].magic) != 0 || !all[p].valid) {
            char who[160];
            tcp_fmt_rank(c, p, who, sizeof who);
            st = h->set_error(h, DT_ERR_CONFIG, "init: %s gave the rendezvous no tcp address "
                              "(does its config name another communicator?)", who);
            break;
        }
        addrs[p] = all[p].addr;
        ports[p] = all[p].port;
    }
    free(all);
    return st;
}

static int tcp_init(const dt_host_v1_t *host, const dt_comm_init_v1_t *in, dt_comm_t **out)
{
    dt_comm_init_v1_t args;
    int rc = dt_comm_check_init(host, in, out, &args);
    if (rc != DT_OK)
        return rc;
    const dt_comm_init_v1_t *a = &args;
    if (!a->job_id || !a->job_id[0] || strlen(a->job_id) >= sizeof(((tcp_job_t *)0)->job_id))
        return host->set_error(host, DT_ERR_INVALID, "init: job id must be 1..%d bytes",
                               (int)sizeof(((tcp_job_t *)0)->job_id) - 1);
    if ((rc = dt_comm_check_host_memory(host, a, "tcp")) != DT_OK)
        return rc;
    const char *cfg_addr;
    int64_t sock_buf;
    int hier;
    int st = read_keys(host, &cfg_addr, &sock_buf, &hier);
    if (st != DT_OK)
        return st;
    int64_t timeout_ms = a->timeout_ms < TCP_TIMEOUT_MAX_MS ? a->timeout_ms : TCP_TIMEOUT_MAX_MS;

    tcp_job_t *job = calloc(1, sizeof *job);
    if (!job)
        return host->set_error(host, DT_ERR_NOMEM, "init: out of memory");
    atomic_init(&job->refs, 1);
    atomic_init(&job->failed, 0);
    pthread_mutex_init(&job->mu, NULL);
    job->world_rank = a->rank;
    job->world_size = a->size;
    job->sock_buf = sock_buf;
    job->hierarchical = hier;
    snprintf(job->job_id, sizeof job->job_id, "%s", a->job_id);
    /* the key every connection proves: the secret's hash, or (a job
     * without one) the job id's, which keeps other jobs out but not
     * someone who knows the id */
    if (a->job_secret && a->job_secret[0]) {
        dt_sha256(a->job_secret, strlen(a->job_secret), job->key);
    } else {
        const void *parts[2] = {"dtrain-tcp-no-secret", job->job_id};
        size_t sizes[2] = {20, strlen(job->job_id)};
        dt_hmac_sha256_parts("dtrain", 6, parts, sizes, 2, job->key);
    }
    st = tcp_pick_addr(host, cfg_addr, a->master_addr, a->master_port, &job->addr);
    if (st != DT_OK) {
        job_unref(job);
        return st;
    }
    dt_comm_t *c = comm_alloc(host, job, a->rank, a->size, timeout_ms);
    if (!c) {
        job_unref(job);
        return host->set_error(host, DT_ERR_NOMEM, "init: out of memory");
    }
    c->is_world = 1;
    c->dev = a->dev;
    snprintf(c->gname, sizeof c->gname, "world");
    for (int p = 0; p < c->size; p++)
        c->wranks[p] = p;

    int lfd = -1;
    uint16_t port = 0;
    tcp_ip_t *addrs = calloc((size_t)a->size, sizeof *addrs);
    uint16_t *ports = calloc((size_t)a->size, sizeof *ports);
    st = addrs && ports ? DT_OK : host->set_error(host, DT_ERR_NOMEM, "init: out of memory");
    if (st == DT_OK)
        st = tcp_listen(host, c->gname, job->addr, &lfd, &port);
    if (st == DT_OK)
        st = swap_addresses(host, a, c, job->addr, port, addrs, ports);
    if (st == DT_OK)
        st = comm_start(c, lfd, addrs, ports);
    if (lfd >= 0)
        close(lfd);
    free(addrs);
    free(ports);
    if (st == DT_OK)
        st = tcp_barrier(c, NULL); /* every rank is in, or the timeout names whom */
    c->coll_seq = 0;               /* users' collectives count from #1, as with shm */
    if (st != DT_OK) {
        comm_stop(c, NULL);
        return st;
    }
    host->log(host, DT_LOG_DEBUG, "joined group world as rank %d of %d over tcp",
              (int)c->rank, (int)c->size);
    *out = c;
    return DT_OK;
}

static void tcp_finalize(dt_comm_t *c)
{
    if (!c)
        return;
    const dt_host_v1_t *h = c->host;
    pthread_mutex_lock(&c->mu);
    int pending = 0;
    for (dt_creq_t *b = c->live; b; b = b->live_next)
        pending += ((struct dt_comm_req *)b)->state != TCP_RQ_DONE;
    pthread_mutex_unlock(&c->mu);
    char why[256];
    if (pending) {
        snprintf(why, sizeof why, "rank %d finalized group %s with %d operation(s) in "
                 "flight", (int)c->job->world_rank, c->gname, pending);
        h->log(h, DT_LOG_WARN, "%s", why);
    }
    comm_stop(c, pending ? why : NULL);
}

static int tcp_split(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    if (!c)
        return DT_ERR_INVALID;
    const dt_host_v1_t *h = c->host;
    int st = dt_comm_split_check(h, c->gname, color, out);
    if (st != DT_OK)
        return st;
    dt_comm_split_t s;
    st = dt_comm_split_gather(h, tcp_all_gather, c, c->gname, c->size, c->rank, color, key,
                              &s);
    if (st != DT_OK)
        return st;
    uint32_t no = ++c->split_no;
    int lfd = -1;
    addr_blob_t mine = {.valid = 0};
    memcpy(mine.magic, ADDR_MAGIC, sizeof mine.magic);
    if (color != DT_COMM_NO_COLOR) {
        char gname[160];
        snprintf(gname, sizeof gname, "%.120s/g%uc%u", c->gname, no, (uint32_t)color);
        st = tcp_listen(h, gname, c->job->addr, &lfd, &mine.port);
        mine.addr = c->job->addr;
        mine.valid = st == DT_OK;
    }
    /* every rank takes part, whatever its color or listener */
    addr_blob_t *all = calloc((size_t)c->size, sizeof *all);
    int gst = all ? tcp_all_gather(c, &mine, all, sizeof mine, DT_U8, NULL, NULL)
                  : h->set_error(h, DT_ERR_NOMEM, "split of group %s: out of memory",
                                 c->gname);
    if (st == DT_OK)
        st = gst;
    if (st != DT_OK || color == DT_COMM_NO_COLOR) {
        if (lfd >= 0)
            close(lfd);
        free(all);
        dt_comm_split_free(&s);
        return st;
    }
    dt_comm_t *g = comm_alloc(h, c->job, s.rank, s.size, c->timeout_ms);
    tcp_ip_t *addrs = calloc((size_t)s.size, sizeof *addrs);
    uint16_t *ports = calloc((size_t)s.size, sizeof *ports);
    if (g)
        atomic_fetch_add(&c->job->refs, 1); /* comm_stop gives it back */
    if (!g || !addrs || !ports) {
        st = h->set_error(h, DT_ERR_NOMEM, "split of group %s: out of memory", c->gname);
    } else {
        g->is_world = 0;
        g->dev = c->dev;
        snprintf(g->gname, sizeof g->gname, "%.120s/g%uc%u", c->gname, no, (uint32_t)color);
        for (int i = 0; i < s.size; i++) {
            int p = s.members[i];
            g->wranks[i] = c->wranks[p];
            if (!all[p].valid && st == DT_OK) {
                char who[160];
                tcp_fmt_rank(c, p, who, sizeof who);
                st = h->set_error(h, DT_ERR_SYSTEM, "split of group %s: %s could not listen "
                                  "for group %s", c->gname, who, g->gname);
            }
            addrs[i] = all[p].addr;
            ports[i] = all[p].port;
        }
        if (st == DT_OK)
            st = comm_start(g, lfd, addrs, ports);
    }
    if (lfd >= 0)
        close(lfd);
    free(all);
    free(addrs);
    free(ports);
    dt_comm_split_free(&s);
    if (st != DT_OK) {
        if (g)
            comm_stop(g, NULL);
        return st;
    }
    *out = g;
    return DT_OK;
}

static int tcp_abort(dt_comm_t *c, const char *reason)
{
    if (!c)
        return DT_ERR_INVALID;
    tcp_publish_fail(c->job, TCP_FAIL_ABORT, c->job->world_rank,
                     reason ? reason : "(no reason given)");
    return DT_OK;
}

static const dt_comm_ops_v1_t tcp_ops = {
    .info = DT_PLUGIN_INFO(COMM, dt_comm_ops_v1_t, "tcp", "1.0.0",
                           "ranks on any machines that reach each other over IPv4, through "
                           "authenticated TCP sockets (ring collectives; peers found through "
                           "the job's rendezvous, so `dtrain run --nnodes` needs nothing else)",
                           tcp_keys),
    .init = tcp_init,
    .finalize = tcp_finalize,
    .rank_size = tcp_rank_size,
    .all_reduce = tcp_all_reduce,
    .reduce_scatter = tcp_reduce_scatter,
    .all_gather = tcp_all_gather,
    .broadcast = tcp_broadcast,
    .reduce = tcp_reduce,
    .send = tcp_send,
    .recv = tcp_recv,
    .barrier = tcp_barrier,
    .wait = tcp_wait,
    .split = tcp_split,
    .abort = tcp_abort,
    .test = tcp_test,
    .sendrecv = tcp_sendrecv,
};

DT_PLUGIN_ENTRY(comm, 1, dt_comm_ops_v1_t, &tcp_ops)
