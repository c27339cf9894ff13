/*
 * tests/support/comm_fault.h - fault injection by countdown over any comm
 * plugin (SQLite's testvfs), built on the comm interposer
 * (core/interpose/interpose.h): "fail the Nth all_reduce from now", "fail
 * the Nth collective", "abort at the Nth call".
 *
 *     C = dt_comm_fault_wrap(shm_ops);       // in the parent, before forking
 *     ...                                     // in a rank, at the chosen moment:
 *     dt_comm_fault_arm(&(dt_comm_fault_t){.rank = 1, .slot = DT_ICOMM_REDUCE_SCATTER,
 *                                          .nth = 2, .status = DT_ERR_REMOTE});
 *
 * The state is per process (each forked rank arms its own).  A fired fault
 * sets the message through the plugin's host: "comm/shm: reduce_scatter on
 * rank 1 (group rank 1 of 2, call 7): injected DT_ERR_REMOTE (fault
 * injection)".  With abort_first the plugin's abort runs first with the
 * reason "fault injection: reduce_scatter on rank 1 (call 7)", so every
 * peer's wait fails promptly with the plugin's DT_ERR_REMOTE naming the
 * rank.
 */
#ifndef DT_COMM_FAULT_H
#define DT_COMM_FAULT_H

#include <stddef.h>
#include <stdint.h>

#include "interpose/interpose.h"

/* dt_comm_fault_t.slot: any collective (DT_ICALL_COLLECTIVE). */
#define DT_COMM_FAULT_ANY_COLLECTIVE (-1)

typedef struct dt_comm_fault {
    int32_t rank;        /* world rank that fails; -1: any */
    int32_t slot;        /* DT_ICOMM_* counted, or DT_COMM_FAULT_ANY_COLLECTIVE */
    uint32_t nth;        /* the nth matching call after arming fails (1: the next) */
    int32_t status;      /* what that call returns instead of running */
    int32_t abort_first; /* call the plugin's abort on that group first */
} dt_comm_fault_t;

/* The interposed table over `inner` (one per process, made once; a second
 * call with another table fails the test). */
const dt_comm_ops_t *dt_comm_fault_wrap(const dt_comm_ops_t *inner);
/* Arm `f` from now on, replacing what was armed; `f` is copied. */
void dt_comm_fault_arm(const dt_comm_fault_t *f);
/* Disarm; returns 1 when the armed fault fired. */
int dt_comm_fault_disarm(void);

#endif /* DT_COMM_FAULT_H */
