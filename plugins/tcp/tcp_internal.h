/*
 * plugins/tcp/tcp_internal.h - the TCP communicator's private types: the
 * job (what every group of this process shares: its failure, the key that
 * proves a connection belongs to the job), a group (a full mesh of
 * authenticated sockets, one per peer, driven by the group's own progress
 * thread), a request, and the functions the plugin's files share.
 *
 *   tcp_comm.c    plugin table, config keys, init / split / abort /
 *                 finalize
 *   tcp_mesh.c    addresses, listening, connecting, the handshake that
 *                 proves both ends know the job's key
 *   tcp_engine.c  the progress thread: frames in and out of every socket,
 *                 receives matched to what was posted, peers lost
 *   tcp_ops.c     starting operations, the collectives' ring algorithms,
 *                 wait / test with the timeout, messages
 *
 * Threads: the caller's thread starts operations (queued under `mu`) and
 * waits on `cv`; the group's progress thread runs them in start order and
 * is the only one that touches the sockets.  Every ring step, p2p send
 * and receive moves while the caller computes.
 */
#ifndef DT_TCP_INTERNAL_H
#define DT_TCP_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"
#include "common/comm/creq.h"
#include "common/sha256/sha256.h"

/* Longest timeout honoured (~115 days): keeps ms -> ns products in range. */
#define TCP_TIMEOUT_MAX_MS 10000000000ll
/* Bytes of a failure's reason (an abort's, a lost peer's). */
#define TCP_REASON_MAX 400
/* How often the progress thread looks at the job's failure and the
 * group's state when no socket wakes it (ms). */
#define TCP_POLL_MS 20
/* How long finalize flushes goodbyes (and an abort's notices) to peers. */
#define TCP_FLUSH_MS 1000
/* How long a wait that gave up lets the progress thread leave the
 * operation (it checks every TCP_POLL_MS; a reduction step may be
 * running). */
#define TCP_DETACH_MS 5000
/* How long one incoming connection may take to prove itself. */
#define TCP_HANDSHAKE_MS 2000

/* What a frame carries (tcp_frame_hdr_t.type). */
enum { TCP_FR_COLL = 1, TCP_FR_P2P = 2, TCP_FR_ABORT = 3, TCP_FR_BYE = 4 };

/* Every frame starts with this, little-endian as the hosts are (ranks of
 * one job run one build on one architecture). */
typedef struct tcp_frame_hdr {
    uint32_t type;
    int32_t tag;     /* p2p: the user's tag */
    uint64_t key;    /* coll: (seq << 24) | step */
    uint64_t bytes;  /* payload */
} tcp_frame_hdr_t;

/* A failure of the job seen by this process: the first one wins. */
enum { TCP_FAIL_NONE = 0, TCP_FAIL_ABORT = 1, TCP_FAIL_LOST = 2, TCP_FAIL_OTHER = 3 };

/* An IPv4 or IPv6 address without its port: plain data, so it crosses
 * the rendezvous in a blob as it is. */
typedef struct tcp_ip {
    int32_t family;    /* AF_INET or AF_INET6 */
    uint32_t scope;    /* IPv6 scope id (a link-local address), else 0 */
    uint8_t bytes[16]; /* network order; AF_INET uses the first 4 */
} tcp_ip_t;

/* Longest text of one (tcp_ip_text): "[" IPv6 "%" scope "]". */
#define TCP_IP_TEXT 64

typedef struct tcp_job {
    _Atomic int refs;
    int32_t world_rank, world_size;
    char job_id[160];
    uint8_t key[DT_SHA256_BYTES];   /* HMAC key: SHA-256 of the secret (or job id) */
    tcp_ip_t addr;                  /* where this process listens */
    int64_t sock_buf;               /* [tcp] socket_buffer_bytes, 0: kernel's */
    int hierarchical;               /* [tcp] hierarchical */
    pthread_mutex_t mu;             /* groups list, failure record */
    struct dt_comm *groups;         /* live groups of this process */
    _Atomic int failed;             /* 0 none, 1 being written, 2 published */
    int fail_kind;
    int32_t fail_rank;              /* world rank */
    char fail_reason[TCP_REASON_MAX];
} tcp_job_t;

/* A receive waiting for its frame (a p2p recv, a ring step's block). */
typedef struct tcp_post {
    struct tcp_post *next;
    int peer;
    uint32_t type;
    int32_t tag;
    uint64_t key;
    void *buf;
    uint64_t bytes;       /* what the receiver expects */
    int done;             /* 1 complete, -status failed (msg in owner) */
    uint64_t got;         /* bytes the frame had (size mismatch) */
    struct dt_comm_req *req; /* a p2p recv's request, NULL for ring steps */
} tcp_post_t;

/* A frame that arrived before its receive was posted. */
typedef struct tcp_stash {
    struct tcp_stash *next;
    int peer;
    tcp_frame_hdr_t hdr;
    unsigned char *data;  /* hdr.bytes, malloc'd */
    uint64_t have;        /* payload bytes read so far */
    tcp_post_t *claim;    /* a receive posted while it was still arriving */
    int drop;             /* taken by a receive of another size: freed on arrival */
} tcp_stash_t;

/* A frame on its way out. */
typedef struct tcp_out {
    struct tcp_out *next;
    tcp_frame_hdr_t hdr;
    const unsigned char *data; /* hdr.bytes (the caller's, or own_data) */
    unsigned char *own_data;   /* malloc'd payload to free (abort reason) */
    uint64_t sent;             /* of sizeof hdr + hdr.bytes */
    int done;                  /* 1 written, -1 dropped */
    struct dt_comm_req *req;   /* a p2p send's request, NULL otherwise */
    int owned;                 /* freed by the engine once written */
} tcp_out_t;

/* One peer's socket and what moves on it. */
typedef struct tcp_peer {
    int fd;                    /* -1 for this rank, or once closed */
    tcp_out_t *out_head, *out_tail;
    /* the incoming frame: header bytes, then its payload's destination */
    tcp_frame_hdr_t in_hdr;
    size_t in_hdr_have;
    int in_body;               /* reading a payload */
    unsigned char *in_dst;     /* where it goes (NULL: discarded) */
    uint64_t in_have;
    tcp_post_t *in_post;       /* the receive it completes, or */
    tcp_stash_t *in_stash;     /* the stash entry it fills */
    int bye;                   /* the peer said goodbye: EOF is expected */
    int cut;                   /* a frame to it was cut short: send nothing more */
} tcp_peer_t;

struct dt_comm {
    const dt_comm_ops_v1_t *ops; /* first: the table that made it (dtrain/comm.h) */
    const dt_host_v1_t *host;
    tcp_job_t *job;
    struct dt_comm *job_next;  /* the job's groups list */
    int32_t rank, size;
    int is_world;
    int32_t *wranks;           /* world rank of each group rank */
    char gname[160];           /* "world", "world/g1c0", ... */
    int64_t timeout_ms;
    uint32_t split_no;
    uint64_t coll_seq, p2p_seq;
    dt_device_t *dev;
    tcp_peer_t *peers;         /* [size] */
    int wake[2];               /* pipe: a caller wakes the thread's poll */
    /* Nodes (tcp_mesh.c, tcp_find_nodes): the ranks that listen on one
     * address share a machine.  When every node holds the same number L
     * >= 2 of the group's ranks and there are M >= 2 nodes, all_reduce
     * goes hierarchically ([tcp] hierarchical): a ring inside the node,
     * a ring across the nodes between ranks of the same local index, a
     * ring inside the node again; n_local = 0 otherwise. */
    int32_t n_local, local_idx, n_cross, cross_idx;
    int32_t *local;            /* [n_local] group ranks on this node, in order */
    int32_t *cross;            /* [n_cross] this local index on every node */

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;        /* everything below */
    pthread_cond_t cv;         /* a request completed, the thread left one */
    struct dt_comm_req *q_head, *q_tail; /* started, not yet run */
    dt_creq_t *live;           /* started and not waited for */
    int stop;                  /* finalize: drain and leave */
    _Atomic int notified;      /* the group's failure was handled: receives
                                * failed, peers told (progress thread) */
    /* the group failed for good (a peer lost, a wait gave up): later
     * operations fail with this */
    int broken;
    int broken_status;
    char broken_msg[640];
    _Atomic int waiting_on;    /* the peer the running operation waits for */

    /* owned by the progress thread */
    tcp_post_t *posts;         /* posted receives, in post order */
    tcp_stash_t *stash;        /* early frames, in arrival order */
};

/* Request states. */
enum { TCP_RQ_QUEUED = 0, TCP_RQ_RUNNING = 1, TCP_RQ_POSTED = 2, TCP_RQ_DONE = 3 };

struct dt_comm_req {
    dt_creq_t b;            /* the op, its number, the group's `live` list */
    struct dt_comm_req *q_next;             /* the group's queue */
    const void *send;
    void *recv;
    int state;              /* TCP_RQ_* (under c->mu) */
    int status;             /* once DONE */
    char msg[768];
    tcp_out_t out;          /* a p2p send's frame */
    tcp_post_t post;        /* a p2p recv's receive */
};

/* ---- tcp_mesh.c ---------------------------------------------------------- */
/* Where this process listens: [tcp] address, else the address this host
 * reaches master_addr from, else 127.0.0.1. */
int tcp_pick_addr(const dt_host_v1_t *h, const char *cfg_addr, const char *master_addr,
                  int32_t master_port, tcp_ip_t *out);
/* "10.0.0.1" or "[fd00::1]" (bracketed, so ":port" may follow). */
void tcp_ip_text(const tcp_ip_t *ip, char *buf, size_t cap);
/* A listening socket on addr, any port; *port its port (host order). */
int tcp_listen(const dt_host_v1_t *h, const char *gname, tcp_ip_t addr, int *fd,
               uint16_t *port);
/* Connect the group's mesh: every rank connects to every lower one's
 * listener (addrs[p], ports[p]), then serves its own for the higher ones,
 * every incoming connection at once (tcp_mesh.c); both ends prove the
 * job's key.  Fills c->peers[p].fd; bounded by timeout_ms.  The listener
 * is the caller's (closed by it). */
int tcp_mesh_connect(dt_comm_t *c, int listen_fd, const tcp_ip_t *addrs,
                     const uint16_t *ports, int64_t timeout_ms);
/* Fill c's node rings from every member's listen address (addrs[size])
 * when hierarchical all_reduce applies (see dt_comm); DT_OK, or
 * DT_ERR_NOMEM.  `want`: [tcp] hierarchical. */
int tcp_find_nodes(dt_comm_t *c, const tcp_ip_t *addrs, int want);
/* Socket options every data socket gets (nonblocking, no Nagle, buffers,
 * a user timeout so a dead link fails its writes). */
void tcp_sock_setup(int fd, int64_t sock_buf, int64_t timeout_ms);

/* ---- tcp_engine.c ---------------------------------------------------------- */
/* The progress thread's body. */
void *tcp_thread_main(void *arg);
/* Wake the thread's poll (any thread). */
void tcp_wake(dt_comm_t *c);
/* The job's failure in words, as this group names ranks: DT_OK while
 * none, else DT_ERR_REMOTE with "rank 1 aborted: <why>" or "rank 1 lost:
 * <how>" in buf. */
int tcp_job_failure(dt_comm_t *c, char *buf, size_t cap);
/* Record the job's first failure. */
void tcp_publish_fail(tcp_job_t *job, int kind, int32_t world_rank, const char *reason);
/* Mark the group failed (first cause kept; under c->mu). */
void tcp_mark_broken_locked(dt_comm_t *c, int status, const char *text);
/* Queue a frame to `peer` (thread only). */
void tcp_out_push(dt_comm_t *c, int peer, tcp_out_t *o);
/* Post a receive (thread only): matched against early frames first. */
void tcp_post_recv(dt_comm_t *c, tcp_post_t *p);
/* Take back a receive that never completed (thread only). */
void tcp_unpost(dt_comm_t *c, tcp_post_t *p);
/* Drop queued frames that never started (thread only). */
void tcp_out_forget(dt_comm_t *c, tcp_out_t *o);
/* Run the sockets for at most ms (thread only): 0 while the group lives,
 * else the status it failed with. */
int tcp_pump(dt_comm_t *c, int ms);
/* The group's failure, if any: a status and its text. */
int tcp_group_failure(dt_comm_t *c, char *buf, size_t cap);

/* ---- tcp_ops.c (contracts in comm.h) ------------------------------------- */
DT_CREQ_OPS(tcp_);
/* Run one started request on the progress thread. */
void tcp_run_request(dt_comm_t *c, struct dt_comm_req *r);
/* Finish r with status st and message (NULL: none); wakes waiters. */
void tcp_complete(dt_comm_t *c, struct dt_comm_req *r, int st, const char *msg);
/* "all_reduce #3 (f32, 4096 bytes) on group world" */
void tcp_req_desc(dt_comm_t *c, const struct dt_comm_req *r, char *buf, size_t cap);
/* How rank r of the group is named ("rank 1 (world rank 3)"). */
void tcp_fmt_rank(dt_comm_t *c, int r, char *buf, size_t cap);
/* At finalize (thread stopped): free requests nobody waited for. */
int tcp_drop_live(dt_comm_t *c);

#endif /* DT_TCP_INTERNAL_H */
