/*
 * plugins/shm/shm_msg.h - how the shared-memory communicator names things
 * in its messages (operations, ranks, rank lists) and the job's failure
 * record every group's waits read (shm_msg.c).
 *
 * Its own header, below everything that reports errors: the waits
 * (shm_sync.c), the operations (shm_ops.c, shm_collectives.c, shm_p2p.c)
 * and the group lifecycle (shm_comm.c) all use it, and it uses none of
 * them.
 */
#ifndef DT_SHM_MSG_H
#define DT_SHM_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "shm_internal.h"

/* The texts themselves are comm_text's (plugins/common/comm), so every
 * communicator says the same; these apply them to a shm group and request.
 * Operation kinds are named with dt_comm_op_name. */
/* c's name and ranks, for the shared texts. */
dt_comm_names_t shm_names(dt_comm_t *c);
/* "all_reduce #17 (f32, 4194304 bytes) on group world" */
void shm_req_desc(dt_comm_t *c, const struct dt_comm_req *r, char *buf,
                  size_t cap);
/* "rank 3" / "ranks 2, 3" in group terms, world ranks added for splits. */
void shm_fmt_ranks(dt_comm_t *c, const int *list, int n, char *buf,
                   size_t cap);
/* How rank r (of this group) is named in messages. */
void shm_fmt_rank(dt_comm_t *c, int r, char *buf, size_t cap);
/* Publish the job's first failure (no-op when one is already published). */
void shm_publish_fail(shm_job_t *job, int kind, int32_t world_rank,
                      int32_t pid, const char *reason);
/* Fail `what` ("init", "cleanup_job") for an invalid job id (see
 * shm_valid_job_id) through host->set_error; returns DT_ERR_INVALID. */
int shm_bad_job_id(const dt_host_v1_t *host, const char *what, const char *job_id);
/* Message for a published failure, e.g. "rank 2 (pid 4242) died";
 * returns DT_ERR_REMOTE. */
int shm_fail_text(dt_comm_t *c, char *buf, size_t cap);

#endif /* DT_SHM_MSG_H */
