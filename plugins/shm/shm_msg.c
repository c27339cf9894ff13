/*
 * plugins/shm/shm_msg.c - the text of the shared-memory communicator's
 * messages: an operation, a rank and a list of ranks named through the
 * comm_text (plugins/common/comm: the words every communicator uses), and the job's
 * failure record (published once, read by every group's waits).
 */
#include "shm_msg.h"

#include <stdatomic.h>
#include <stdio.h>

dt_comm_names_t shm_names(dt_comm_t *c)
{
    return (dt_comm_names_t){.gname = c->gname, .is_world = c->is_world,
                             .size = c->size, .wranks = c->wranks};
}

void shm_fmt_rank(dt_comm_t *c, int r, char *buf, size_t cap)
{
    dt_comm_names_t g = shm_names(c);
    dt_comm_fmt_rank(&g, r, buf, cap);
}

void shm_fmt_ranks(dt_comm_t *c, const int *list, int n, char *buf, size_t cap)
{
    dt_comm_names_t g = shm_names(c);
    dt_comm_fmt_ranks(&g, list, n, buf, cap);
}

void shm_req_desc(dt_comm_t *c, const struct dt_comm_req *r, char *buf, size_t cap)
{
    dt_comm_names_t g = shm_names(c);
    dt_creq_text(&g, &r->b, buf, cap);
}

void shm_publish_fail(shm_job_t *job, int kind, int32_t world_rank, int32_t pid,
                      const char *reason)
{
    shm_fail_t *f = &job->world->fail;
    uint32_t expect = 0;
    if (!atomic_compare_exchange_strong(&f->state, &expect, 1))
        return; /* somebody was first */
    f->kind = kind;
    f->world_rank = world_rank;
    f->pid = pid;
    snprintf(f->reason, sizeof f->reason, "%s", reason ? reason : "");
    atomic_store(&f->state, 2);
}

int shm_fail_text(dt_comm_t *c, char *buf, size_t cap)
{
    const shm_fail_t *f = &c->job->world->fail;
    const char *who = c->is_world ? "rank" : "world rank";
    switch (f->kind) {
    /* the reason is read from shared memory: never past its array */
    case SHM_FAIL_ABORT:
        snprintf(buf, cap, "%s %d aborted: %.*s", who, (int)f->world_rank,
                 (int)sizeof f->reason, f->reason);
        break;
    case SHM_FAIL_DEAD:
        snprintf(buf, cap, "%s %d (pid %d) died", who, (int)f->world_rank, (int)f->pid);
        break;
    default:
        snprintf(buf, cap, "%s %d failed: %.*s", who, (int)f->world_rank,
                 (int)sizeof f->reason, f->reason);
        break;
    }
    return DT_ERR_REMOTE;
}

int shm_bad_job_id(const dt_host_v1_t *host, const char *what, const char *job_id)
{
    return host->set_error(host, DT_ERR_INVALID,
                           "%s: job id '%s' must be 1..%d letters, digits, '.', '_' "
                           "or '-' (it names /dev/shm/dtrain-<job id>)",
                           what, job_id ? job_id : "(null)", SHM_JOB_ID_MAX);
}
