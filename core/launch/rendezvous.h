/*
 * core/launch/rendezvous.h - the ranks of a job meet over TCP before any
 * communicator exists: rank 0 listens on MASTER_ADDR:MASTER_PORT
 * (torchrun's convention), every other rank connects to it.
 *
 * What the meeting settles:
 *   membership  each rank proves it holds the job secret (an HMAC-SHA256
 *               under SHA-256(secret) of rank 0's fresh nonce and what it
 *               sends; rank 0 proves the same back over the rank's nonce).
 *               The secret itself never crosses the wire.  A connection
 *               without the proof - a rank of another job, a port scanner,
 *               garbage - is dropped and never holds up the real ranks:
 *               rank 0 serves every connection at once from one poll loop,
 *               each with DT_RDZV_HELLO_S to prove itself; garbage is
 *               dropped at its first wrong byte; and when
 *               DT_RDZV_PENDING_MAX connections are unproven a new one
 *               evicts the oldest (one that sent nothing first), so a flood
 *               cannot fill the slots a real rank needs.  Drops are logged
 *               ("rendezvous: refused a connection from A:P: why"), at
 *               most DT_RDZV_LOG_BURST lines in DT_RDZV_LOG_WINDOW_S, then
 *               one line counting the rest.  A rank whose hello is well
 *               formed but fails the secret is told so (a refusal frame:
 *               it fails at once naming DTRAIN_JOB_SECRET), and rank 0's
 *               timeout names where it came from.
 *   job id      rank 0's proposal is the job's; every rank learns it
 *   config      every rank sends its config hash; any difference fails the
 *               job on every rank with DT_ERR_CONFIG naming the ranks and
 *               both hashes
 *   bootstrap   afterwards, all-gathers of small blobs (a communicator's
 *               NCCL unique id, its listening addresses) through the
 *               connections that stay open until dt_rdzv_close
 *
 * Wire format: frames of a 16-byte header (magic "DTRV", version, type,
 * payload length, all big-endian) and a payload.  A reader knows the
 * largest payload each type may have and refuses a frame that claims more
 * before reading it: sizes from the wire are never trusted.
 *
 * Every wait is bounded by timeout_s.  Rank 0's timeout names the ranks
 * that never joined and tells the ranks that did; a rank that cannot reach
 * rank 0 names rank 0 and the address it tried.
 */
#ifndef DT_LAUNCH_RENDEZVOUS_H
#define DT_LAUNCH_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#define DT_RDZV_MAGIC 0x44545256u /* "DTRV" */
#define DT_RDZV_VERSION 1
#define DT_RDZV_HEADER_BYTES 16
/* Bytes one rank may contribute to a bootstrap all-gather. */
#define DT_RDZV_BLOB_MAX 4096
/* Connections rank 0 holds before they proved they belong to the job (at
 * most half the process's open-file limit); one more evicts the oldest. */
#define DT_RDZV_PENDING_MAX 1024
/* Seconds a connection has to prove itself after it was accepted. */
#define DT_RDZV_HELLO_S 3.0
/* Dropped connections logged one by one per window; the rest are counted
 * in one line when the window ends (or the join does). */
#define DT_RDZV_LOG_BURST 5
#define DT_RDZV_LOG_WINDOW_S 10.0

typedef struct dt_rdzv_opts {
    const char *addr;     /* rank 0's host name or IPv4/IPv6 literal */
    int port;             /* its port; rank 0 may pass 0: any free port
                           * (dt_rdzv_port says which) */
    int rank, size;       /* this rank, of size */
    const char *job_id;   /* this rank's proposal; rank 0's becomes the
                           * job's (< 128 bytes) */
    const char *secret;   /* the job secret, NUL-ended, non-empty when
                           * size > 1 */
    uint64_t config_hash; /* what every rank must agree on */
    double timeout_s;     /* bound of the join and of each all-gather */
} dt_rdzv_opts_t;

typedef struct dt_rdzv dt_rdzv_t;

/* Make the handle; rank 0 binds and listens at once (so the port is taken
 * before any peer tries it; "address in use" is reported naming it).
 * Copies what it needs from *o.  DT_ERR_INVALID for bad options,
 * DT_ERR_SYSTEM when the port cannot be bound. */
int dt_rdzv_open(const dt_rdzv_opts_t *o, dt_rdzv_t **out);

/* The port rank 0 listens on (the one asked for, or the one the system
 * chose for 0); the configured port on other ranks. */
int dt_rdzv_port(const dt_rdzv_t *r);

/* Collective: meet every rank, agree on the job id, compare config hashes.
 * DT_OK, or DT_ERR_TIMEOUT naming the missing ranks, DT_ERR_CONFIG naming
 * the ranks whose config hash differs, DT_ERR_REMOTE when rank 0 reported
 * another failure.  A rank > 0 fails at once with DT_ERR_CONFIG when rank
 * 0's address does not resolve (EAI_NONAME and the like; EAI_AGAIN is
 * retried until the timeout) or rank 0 refused its proof of the secret. */
int dt_rdzv_join(dt_rdzv_t *r);

/* The job id every rank agreed on (rank 0's); "" before a join. */
const char *dt_rdzv_job_id(const dt_rdzv_t *r);

/* Collective after a join: all (size x bytes) = every rank's `mine`
 * (bytes, the same on every rank, <= DT_RDZV_BLOB_MAX) in rank order.
 * timeout_s <= 0: the handle's.  DT_ERR_TIMEOUT naming the ranks that did
 * not contribute; DT_ERR_INVALID when ranks disagree on `bytes`. */
int dt_rdzv_all_gather(dt_rdzv_t *r, const void *mine, size_t bytes, void *all,
                       double timeout_s);

/* Close the connections and the listener and free r.  NULL is a no-op. */
void dt_rdzv_close(dt_rdzv_t *r);

/* The job id of a job on several nodes, which each node's launcher derives
 * alone and alike from what all of them share (the secret, rank 0's
 * address and port): "mn-" and 16 hex digits of an HMAC under the secret,
 * so it names the job without revealing the secret. */
void dt_rdzv_nodes_job_id(const char *secret, const char *addr, int port, char *out,
                          size_t cap);

/* Whether `host` resolves as the ranks will resolve master_addr: 1 yes;
 * 0 not now, but it may (EAI_AGAIN: the ranks retry within their timeout);
 * -1 never (EAI_NONAME, ...).  Unless 1, `why` says "cannot resolve
 * 'host': <gai_strerror> (EAI_...)". */
int dt_rdzv_check_host(const char *host, char *why, size_t cap);

#ifdef DTRAIN_TEST_HOOKS
/* Test hook: the next `times` resolutions of rank 0's address fail with
 * getaddrinfo error `gai_error` (EAI_AGAIN: the retry path). */
void dt_rdzv_test_resolve_fail(int gai_error, int times);
#endif

/* ---- the job's rendezvous while a run starts (one per process) ----
 * `dtrain run` opens a session around its communicator's init: when the
 * ranks span several nodes (w->local_size < w->size under dtrain's own
 * launcher) the ranks join at once, and w->job_id becomes the job id they
 * agreed on (every rank logs "rendezvous: rank R of N joined job ID ...").
 * Otherwise the join waits for the first bootstrap all-gather a comm
 * plugin asks for (host.h: bootstrap_all_gather), so a single-node job
 * whose communicator needs none never takes a port.  Thread safe. */
struct dt_world;
int dt_rdzv_session_begin(struct dt_world *w, uint64_t config_hash, double timeout_s);
/* The host slot's implementation: DT_ERR_UNSUPPORTED outside a session. */
int dt_rdzv_session_all_gather(const void *mine, size_t bytes, void *all, double timeout_s);
/* Close the session's connections; idempotent. */
void dt_rdzv_session_end(void);

#endif /* DT_LAUNCH_RENDEZVOUS_H */
