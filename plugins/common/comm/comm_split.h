/*
 * plugins/common/comm/comm_split.h - who joins which group when a
 * communicator's group is split (dt_comm_ops_v1_t.split): every rank gives
 * {color, key}, the ranks of one color form a group ordered by (key, old
 * rank).  For communicators that build the new group themselves from this
 * membership (shm) or check their library's against it (mpi).
 *
 *     dt_comm_split_t s;
 *     int st = dt_comm_split_check(h, c->gname, color, out);
 *     if (st == DT_OK)
 *         st = dt_comm_split_gather(h, my_all_gather, c, c->gname, c->size,
 *                                   c->rank, color, key, &s);
 *     ... s.size ranks, this one s.rank, s.members[i] its old ranks ...
 *     dt_comm_split_free(&s);
 *
 * In-tree only, not installed: part of dtrain_common_comm, the static,
 * hidden-visibility library the in-tree communicators link
 * (plugins/common/CMakeLists.txt); it changes with them and follows the SDK
 * helpers' conventions (dtrain/sdk_helpers.h).
 */
#ifndef DT_COMMON_COMM_SPLIT_H
#define DT_COMMON_COMM_SPLIT_H

#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The group this rank joins. */
typedef struct dt_comm_split {
    int32_t size;     /* its ranks; 0 for DT_COMM_NO_COLOR */
    int32_t rank;     /* this rank's index among them; -1 when none */
    int32_t *members; /* [size] their ranks in the old group, in new-rank
                       * order (malloc'd; dt_comm_split_free) */
} dt_comm_split_t;

/* split's arguments: out not NULL ("split of group <gname>: NULL out"),
 * color >= 0 or DT_COMM_NO_COLOR ("split of group <gname>: color -3 must
 * be >= 0 or DT_COMM_NO_COLOR"); sets *out = NULL.  DT_OK or
 * DT_ERR_INVALID through host->set_error. */
int dt_comm_split_check(const dt_host_v1_t *h, const char *gname, int32_t color,
                        dt_comm_t **out);

/* The members of `color` from every rank's {color, key}: all[2 p] and
 * all[2 p + 1] are old rank p's, for p in [0, size).  Writes their old
 * ranks ordered by (key, old rank) to members[0 ..) and returns how many;
 * *new_rank is the index of old rank `self` among them (-1 when it is not
 * one).  members has room for 2 * size entries (the sort's scratch).
 * color is compared as a plain value (dt_comm_split_gather never asks for
 * DT_COMM_NO_COLOR's members).  Pure: no communication. */
int32_t dt_comm_split_members(const int32_t *all, int32_t size, int32_t color,
                              int32_t self, int32_t *members, int32_t *new_rank);

/* The ABI's all_gather slot's signature. */
typedef int (*dt_comm_all_gather_fn)(dt_comm_t *c, const void *send, void *recv,
                                     uint64_t send_count, int dtype,
                                     dt_stream_t *stream, dt_comm_req_t **req);

/* Collective over c (size ranks, this one `rank`): gathers every rank's
 * {color, key} as two i32 with all_gather (blocking: req NULL, so bounded
 * by the group's timeout) and fills *s with this rank's group through
 * dt_comm_split_members; a DT_COMM_NO_COLOR rank takes part and gets
 * size 0.  DT_OK; all_gather's status (its message kept); DT_ERR_NOMEM
 * ("split of group <gname>: out of memory", before anything is sent).
 * *s is zeroed on failure. */
int dt_comm_split_gather(const dt_host_v1_t *h, dt_comm_all_gather_fn all_gather,
                         dt_comm_t *c, const char *gname, int32_t size, int32_t rank,
                         int32_t color, int32_t key, dt_comm_split_t *s);

/* Free s->members (s may be zeroed; safe twice). */
void dt_comm_split_free(dt_comm_split_t *s);

#ifdef __cplusplus
}
#endif

#endif /* DT_COMMON_COMM_SPLIT_H */
