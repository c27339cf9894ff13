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
 * the ranks still there.  So the ranks of one node meet on a socket of
 * their own: rank 0 listens, from the start of the run, on the abstract
 * Unix socket "dtrain-ledger-<uid>-<job id>" (no port, no file; it goes
 * away with the process), and accepts only connections of its own user
 * (SO_PEERCRED).  Ranks on several nodes are not compared yet
 * (DT_ERR_UNSUPPORTED): the rendezvous would have to stay joined for the
 * run and gather from the ranks present.
 *
 * Bounded: rank 0 takes ledgers until every rank sent one or timeout_s
 * passed, then answers those that did; a rank gives up when rank 0 is
 * gone (its socket refuses, or closes without an answer) or has not
 * answered within 2 x timeout_s + 5 s (rank 0 may itself wait out one
 * collective's timeout before it joins, then timeout_s for the others).
 */
#ifndef DT_LAUNCH_LEDGER_EXCHANGE_H
#define DT_LAUNCH_LEDGER_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "launch/world.h"

/* Most bytes one rank hands over. */
#define DT_LEDGER_XCHG_MAX 65536

typedef struct dt_ledger_xchg dt_ledger_xchg_t;

/* Rank 0 of a job whose ranks are all on this node starts listening; the
 * others only remember where.  DT_OK (also for one rank, and for ranks on
 * several nodes, whose exchange then says it is not supported) or
 * DT_ERR_SYSTEM naming the socket. */
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
