/*
 * core/launch/elastic.h - an elastic job's rounds: the nodes' launchers
 * (agents) meet at a store on node 0 and re-form the job after a failure,
 * as torchrun's elastic agent and its c10d store do.
 *
 * The store is a thread of node 0's launcher listening on master_port;
 * every node's agent (node 0's own included) connects to it, proves it
 * holds the job secret (an HMAC-SHA256 under SHA-256(secret) of the
 * store's fresh nonce and what it sends) and then waits for a round.  A
 * round is formed when no node of the previous round is still running,
 * at least min_nodes agents wait, and either max_nodes wait or
 * DT_ELASTIC_LAST_CALL_S has passed since min_nodes did; after a failure
 * not before the back-off (DT_ELASTIC_BACKOFF_S, doubled per restart, at
 * most DT_ELASTIC_BACKOFF_MAX_S).  Nodes are ordered by node_rank (node 0,
 * the store's, first: its first rank hosts the ranks' rendezvous) and get
 * consecutive global ranks.  An agent whose ranks all exit 0 reports
 * done; one whose ranks failed reports the failure and waits for the next
 * round; an agent whose connection closes while its round runs is a node
 * lost.  A node that connects while a round runs waits for the next one.
 *
 * Every wait is bounded but one: an agent waiting to join while the job
 * runs waits until the next round or the job's end.  After a round's
 * first failure its other nodes have DT_ELASTIC_REPORT_S to report (a
 * node behind a link that went down keeps its connection open but says
 * nothing); then they are taken for lost and the next round forms.  The store gives up
 * (every agent gets the message and exits 1) when fewer than min_nodes
 * agents wait for launch.timeout, or when a failure would be restart
 * max_restarts + 1; its message names every failure of the job.  If node
 * 0 dies the store dies with it (torchrun's c10d store has the same
 * limit): every other agent finds the connection closed and exits 1
 * saying so.
 *
 * Wire: text lines of at most DT_ELASTIC_LINE bytes.
 *   store -> agent  "DTEL1 <nonce hex>"                 on connect
 *   agent -> store  "JOIN <node_rank> <nproc> <mac hex>"
 *   store -> agent  "ROUND <round> <world> <base> <nodes> <restarts>|<note>"
 *                   "STOP <exit code>|<message>"        the agent exits
 *   agent -> store  "END ok" | "END fail|<what>" | "END config|<what>"
 */
#ifndef DT_LAUNCH_ELASTIC_H
#define DT_LAUNCH_ELASTIC_H

#include <stddef.h>

#define DT_ELASTIC_LINE 4096
/* After min_nodes agents wait, how long more may still join the round. */
#define DT_ELASTIC_LAST_CALL_S 1.0
/* Before restart k: DT_ELASTIC_BACKOFF_S x 2^(k-1), at most the max. */
#define DT_ELASTIC_BACKOFF_S 0.5
#define DT_ELASTIC_BACKOFF_MAX_S 16.0
/* After a round's first failure, how long its other nodes have to report
 * (their ranks' collectives fail within launch.timeout, then the
 * launcher's grace) before the store takes them for lost. */
#define DT_ELASTIC_REPORT_S(timeout_s) (2.0 * (timeout_s) + 10.0)
/* Seconds a connection has to prove it belongs to the job. */
#define DT_ELASTIC_HELLO_S 3.0

typedef struct dt_elastic_store_opts {
    const char *addr;  /* node 0's address (its family picks the listener's) */
    int port;          /* master_port */
    const char *secret;
    int min_nodes, max_nodes, max_restarts;
    double timeout_s;  /* launch.timeout: the bound of a round's forming */
} dt_elastic_store_opts_t;

typedef struct dt_elastic_store dt_elastic_store_t;

/* Bind the port (DT_ERR_SYSTEM naming it when taken) and start the thread
 * (with every signal blocked: the launcher reads them). */
int dt_elastic_store_start(const dt_elastic_store_opts_t *o, dt_elastic_store_t **out);
/* Stop the thread (after it told every agent still connected to stop),
 * close everything, free s.  NULL is a no-op. */
void dt_elastic_store_stop(dt_elastic_store_t *s);
/* Node 0's agent is done: let the store settle the other nodes (their
 * reports, a last round without node 0's ranks refused), at most
 * timeout_s, then stop it. */
void dt_elastic_store_finish(dt_elastic_store_t *s, double timeout_s);

typedef struct dt_elastic_agent dt_elastic_agent_t;

typedef struct dt_elastic_round {
    int round;       /* 1, 2, ... */
    int restarts;    /* round - 1 */
    int world_size, rank_base, nnodes;
    char note[DT_ELASTIC_LINE]; /* the layout, and after a failure who failed */
} dt_elastic_round_t;

/* Connect to the store at addr:port (retried until timeout_s) and join as
 * node `node_rank` with `nproc` ranks.  DT_ERR_TIMEOUT / DT_ERR_REMOTE
 * with the message set. */
int dt_elastic_agent_join(const char *addr, int port, const char *secret, int node_rank,
                          int nproc, double timeout_s, dt_elastic_agent_t **out);
/* Wait for the store's word, at most wait_s (< 0: no bound: a node
 * waiting to join while a round runs): DT_OK with *stop = -1 and *round
 * filled, or DT_OK with *stop = the exit code and msg the store's
 * message; an error (the store gone or silent) with the message set. */
int dt_elastic_agent_next(dt_elastic_agent_t *a, double wait_s, dt_elastic_round_t *round,
                          int *stop, char *msg, size_t cap);
/* How long an agent that reported a failure waits for the next round: the
 * store's bound on the other nodes' reports, the longest back-off and
 * last call, and a round's forming (launch.timeout). */
#define DT_ELASTIC_AGENT_WAIT_S(timeout_s)                                                  \
    (DT_ELASTIC_REPORT_S(timeout_s) + DT_ELASTIC_BACKOFF_MAX_S + DT_ELASTIC_LAST_CALL_S +   \
     (timeout_s) + 10.0)
/* Report how this node's round ended: kind "ok", "fail" or "config". */
int dt_elastic_agent_report(dt_elastic_agent_t *a, const char *kind, const char *what);
void dt_elastic_agent_close(dt_elastic_agent_t *a);

#endif /* DT_LAUNCH_ELASTIC_H */
