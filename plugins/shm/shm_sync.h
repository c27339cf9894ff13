/*
 * plugins/shm/shm_sync.h - waiting across processes without burning CPU.
 *
 * Ranks are often oversubscribed (8 ranks on 2 cores), so a wait spins for
 * at most spin_us and then sleeps on a futex in shared memory, in slices of
 * at most SHM_SLICE_NS so that it notices, even without a wake-up, a peer
 * that died (pidfd, else kill(pid, 0)), a failure published by any rank of
 * the job (abort, death), a cancelled wait, and its own deadline.
 *
 * Who may spin (shm_exec_spin_ns): nobody when the group's ranks can run on
 * fewer CPUs together than there are ranks; a caller running an operation
 * itself; the progress thread only while a caller waits for one of the
 * group's requests.  While the caller computes (a data-parallel backward
 * pass with its all_reduces in flight) the progress thread sleeps at once
 * instead, so its waits for the peers leave the CPU to the compute
 * threads: every core is busy then, and a spin would only take one from
 * them.
 */
#ifndef DT_SHM_SYNC_H
#define DT_SHM_SYNC_H

#include <stdint.h>

#include "shm_internal.h"

/* Monotonic clock in nanoseconds. */
uint64_t shm_now_ns(void);
/* One pause instruction where the CPU has one. */
void shm_cpu_relax(void);

/* Futex on a word in shared memory (no FUTEX_PRIVATE_FLAG: the word is
 * mapped by several processes).  Sleeps while *word == expect, at most
 * timeout_ns (0: no limit).  Returns 0 or -1 with errno (EAGAIN,
 * ETIMEDOUT, EINTR: all mean "look again"). */
int shm_futex_wait(_Atomic uint32_t *word, uint32_t expect, uint64_t timeout_ns);
int shm_futex_wake(_Atomic uint32_t *word, int n);
/* The same for process-private words (request completion). */
int shm_futex_wait_private(_Atomic uint32_t *word, uint32_t expect,
                           uint64_t timeout_ns);
int shm_futex_wake_private(_Atomic uint32_t *word, int n);

/* Values of shm_rank_t.sleeping: what wakes that rank's progress thread. */
enum { SHM_AWAKE = 0, SHM_SLEEP_IDLE = 1, SHM_SLEEP_PEERS = 2 };

/* Ring rank r's doorbell if its progress thread sleeps in a mode at least
 * `min_mode` (SHM_SLEEP_PEERS: it waits on peers; SHM_SLEEP_IDLE: any
 * sleeper, for local events).  The caller has already published what
 * changed with a seq_cst store. */
int shm_ring(dt_comm_t *c, int r, uint32_t min_mode); /* 1: it rang */

/* Post phase `value` of this rank and wake peers that wait on phases. */
void shm_post_phase(dt_comm_t *c, uint32_t value);

/* Peer p's liveness: 0 alive, SHM_FAIL_DEAD (process gone) or
 * SHM_FAIL_LEFT (it finalized this group). */
int shm_peer_gone(dt_comm_t *c, int p);

/* Wait until every rank of the group (or only `only` when >= 0) has
 * posted phase `target`, on behalf of collective `r`.  Returns DT_OK, or a
 * status with r->msg set ("<op>: rank 2 (pid 4242) died", "<op>: timed out
 * after 5.0 s waiting for rank 3", ...).  Advances active point-to-point
 * operations while it waits. */
int shm_wait_phase(dt_comm_t *c, struct dt_comm_req *r, uint32_t target,
                   int32_t only);

/* Executor (holding c->exec), with sends/recvs active and nothing else to
 * run: move their data until an op is queued, finalize asks to stop, none
 * is left, or (when `done` is not NULL) *done == SHM_REQ_DONE; sleeps on
 * the doorbell when nothing can move. */
void shm_p2p_wait(dt_comm_t *c, _Atomic uint32_t *done);

#endif /* DT_SHM_SYNC_H */
