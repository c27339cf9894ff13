/*
 * core/launch/ledger_exchange.h - after a failed collective, the ranks of
 * a job hand their collective ledgers (core/interpose/ledger.h) to rank
 * 0, which compares them and answers every rank with one line.
 *
 * Why not the TCP rendezvous (rendezvous.h): on one node it is joined
 * only when a comm plugin asks for bootstrap bytes (shm never does), on
 * master_port, which concurrent single-node jobs share (29500 by
 * default); its connections close once the communicator is up; and its
 * all-gather is all-or-nothing, where the ledgers must be compared among
 * the ranks still there.  So the ranks meet on a socket of their own,
 * which rank 0 listens on from the start of the run:
 *   - every rank on one node: the abstract Unix socket
 *     "dtrain-ledger-<uid>-<job id>" (no port, no file; it goes away with
 *     the process), taking only connections of its own user (SO_PEERCRED);
 *   - ranks on several nodes: TCP on master_port + 2 (the wildcard address
 *     of master_addr's family; the others connect to master_addr).  The
 *     rendezvous holds master_port, an elastic job's store master_port and
 *     its ranks master_port + 1 (world.master_port is then that + 1, so
 *     the exchange is on the store's + 3): + 2 collides with neither.  A
 *     fixed offset, not an ephemeral port, because the ranks share nothing
 *     after the rendezvous to tell it through.  Each side proves the job
 *     secret as the rendezvous does (HMAC-SHA256 keyed by SHA-256 of
 *     DTRAIN_JOB_SECRET over the other side's fresh nonce); a connection
 *     whose proof is wrong is dropped (rank 0 logs the first, then a
 *     count), and pending connections are capped, the oldest evicted for
 *     a new one.  Without a job secret, several nodes are not compared
 *     (DT_ERR_UNSUPPORTED, saying so).
 *
 * Bounded: rank 0 takes ledgers until every rank sent one or timeout_s
 * passed, then answers those that did; a rank gives up when rank 0 is
 * gone (its socket refuses for 1 s - 2 s across nodes - or closes without
 * an answer) or has not answered within 2 x timeout_s + 5 s (rank 0 may
 * itself wait out one collective's timeout before it joins, then
 * timeout_s for the others).  Every length from a peer is checked against
 * DT_LEDGER_XCHG_MAX before a byte of the body is read.
 */
#ifndef DT_LAUNCH_LEDGER_EXCHANGE_H
#define DT_LAUNCH_LEDGER_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "launch/world.h"

/* Most bytes one rank hands over. */
#define DT_LEDGER_XCHG_MAX 65536

typedef struct dt_ledger_xchg dt_ledger_xchg_t;

/* Rank 0 starts listening (the Unix socket, or TCP across nodes); the
 * others only remember where.  DT_OK (also for one rank, and for ranks on
 * several nodes without a job secret, whose exchange then says why it
 * does not compare) or DT_ERR_SYSTEM naming the socket or port. */
int dt_ledger_xchg_open(const dt_world_t *w, dt_ledger_xchg_t **out);

/* Rank 0's judge: rank r's bytes are blobs[r] (NULL: none came), sizes[r]
 * long; write the line every rank prints into text and return a verdict
 * (a number passed on to every rank with the line). */
typedef int (*dt_ledger_xchg_judge_fn)(void *ctx, const uint8_t *const *blobs,
                                       const size_t *sizes, int n, char *text, size_t cap);

/* Hand `mine` (at most DT_LEDGER_XCHG_MAX bytes) over and get the line
 * into text, the judge's verdict into *verdict, and into *order how many
 * of the ranks that took part began to exchange before this one (0: it
 * failed first; the clock is the machine's, CLOCK_MONOTONIC).  Rank 0
 * runs `judge` (with its own bytes as blobs[0]).  DT_OK, or
 * DT_ERR_UNSUPPORTED / DT_ERR_REMOTE / DT_ERR_TIMEOUT with text saying
 * why no line came ("rank 0, which compares the ledgers, is gone"). */
int dt_ledger_xchg_run(dt_ledger_xchg_t *x, const void *mine, size_t bytes, double timeout_s,
                       dt_ledger_xchg_judge_fn judge, void *ctx, char *text, size_t cap,
                       int *verdict, int *order);

/* Stop listening and free; NULL is a no-op. */
void dt_ledger_xchg_close(dt_ledger_xchg_t *x);

#endif /* DT_LAUNCH_LEDGER_EXCHANGE_H */
