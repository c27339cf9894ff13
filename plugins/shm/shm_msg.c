/*
 * plugins/shm/shm_msg.c - the text of the shared-memory communicator's
 * messages: how an operation, a rank and a list of ranks are named, and
 * the job's failure record (published once, read by every group's waits).
 */
#include "shm_msg.h"

#include <stdatomic.h>
#include <stdio.h>

const char *shm_op_name(int k)
{
    switch (k) {
    case SHM_OP_ALL_REDUCE: return "all_reduce";
    case SHM_OP_REDUCE_SCATTER: return "reduce_scatter";
    case SHM_OP_ALL_GATHER: return "all_gather";
    case SHM_OP_BROADCAST: return "broadcast";
    case SHM_OP_REDUCE: return "reduce";
    case SHM_OP_BARRIER: return "barrier";
    case SHM_OP_SEND: return "send";
    case SHM_OP_RECV: return "recv";
    default: return "?"; /* a peer's descriptor may hold anything */
    }
}

static const char *red_op_name(int op)
{
    switch (op) {
    case DT_OP_SUM: return "sum";
    case DT_OP_AVG: return "avg";
    case DT_OP_MAX: return "max";
    case DT_OP_MIN: return "min";
    default: return "?";
    }
}

void shm_fmt_rank(dt_comm_t *c, int r, char *buf, size_t cap)
{
    if (c->is_world || !c->wranks)
        snprintf(buf, cap, "rank %d", r);
    else
        snprintf(buf, cap, "rank %d (world rank %d)", r, (int)c->wranks[r]);
}

void shm_fmt_ranks(dt_comm_t *c, const int *list, int n, char *buf, size_t cap)
{
    if (n <= 0) {
        snprintf(buf, cap, "no rank (the condition was met meanwhile)");
        return;
    }
    size_t len = (size_t)snprintf(buf, cap, "%s", n == 1 ? "rank " : "ranks ");
    for (int i = 0; i < n && len < cap; i++) {
        if (c->is_world || !c->wranks)
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? ", " : "", list[i]);
        else
            len += (size_t)snprintf(buf + len, cap - len, "%s%d (world rank %d)",
                                    i ? ", " : "", list[i], (int)c->wranks[list[i]]);
    }
}

void shm_req_desc(dt_comm_t *c, const struct dt_comm_req *r, char *buf, size_t cap)
{
    char seq[32] = "";
    if (r->seq)
        snprintf(seq, sizeof seq, " #%llu", (unsigned long long)r->seq);
    unsigned long long bytes = (unsigned long long)(r->count * r->esize);
    const char *dt = dt_dtype_name(r->dtype);
    switch (r->kind) {
    case SHM_OP_BARRIER:
        snprintf(buf, cap, "barrier%s on group %s", seq, c->gname);
        break;
    case SHM_OP_SEND:
    case SHM_OP_RECV: {
        char who[96];
        shm_fmt_rank(c, r->root, who, sizeof who);
        snprintf(buf, cap, "%s%s %s %s (tag %d, %s, %llu bytes) on group %s",
                 shm_op_name(r->kind), seq, r->kind == SHM_OP_SEND ? "to" : "from",
                 who, (int)r->tag, dt, bytes, c->gname);
        break;
    }
    case SHM_OP_BROADCAST:
        snprintf(buf, cap, "broadcast%s (%s, %llu bytes, root %d) on group %s", seq, dt,
                 bytes, (int)r->root, c->gname);
        break;
    case SHM_OP_REDUCE:
        snprintf(buf, cap, "reduce%s (%s %s, %llu bytes, root %d) on group %s", seq, dt,
                 red_op_name(r->op), bytes, (int)r->root, c->gname);
        break;
    case SHM_OP_ALL_GATHER:
        snprintf(buf, cap, "all_gather%s (%s, %llu bytes per rank) on group %s", seq, dt,
                 bytes, c->gname);
        break;
    case SHM_OP_REDUCE_SCATTER:
        snprintf(buf, cap, "reduce_scatter%s (%s %s, %llu bytes per rank) on group %s",
                 seq, dt, red_op_name(r->op), bytes, c->gname);
        break;
    default:
        snprintf(buf, cap, "%s%s (%s, %llu bytes) on group %s", shm_op_name(r->kind),
                 seq, dt, bytes, c->gname);
        break;
    }
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
