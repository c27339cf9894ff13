/*
 * plugins/ddp/ddp_stagger.c - ddp's staggered optimizer update, and the
 * hooks, step and state calls that apply a deferred update first.  The
 * rest of a step (buffers, buckets, the all-reduce overlapped with
 * backward, the norm) is the SDK's replica machinery.
 *
 * Staggered update (stagger_update, groups of more than one rank).  The
 * optimizer update is memory bound (AdamW streams 28 bytes per parameter)
 * and ddp's step synchronises the ranks, so ranks sharing one machine's
 * memory would all run it at the same moment, each at a fraction of the
 * bandwidth.  Odd ranks therefore keep the update pending and apply each
 * unit's part at the unit's next use (pre_forward or pre_backward), spread
 * over their forward, while even ranks update everything in step(),
 * starting with the last unit (the one odd ranks reach last).  The update
 * is elementwise, so every rank ends with the same bits either way; state
 * read through get_state, and a unit nobody used by the next step(), get
 * their pending update first.  A unit's gradient is zeroed right after its
 * deferred update rather than in begin_step.
 */
#include <string.h>

#include "ddp_internal.h"

/* Apply unit u's deferred update, if any (no-op otherwise). */
static int apply_pending(dt_strategy_t *s, uint32_t u)
{
    if (!s->n_pending || !s->pending[u])
        return DT_OK;
    dt_replica_t *r = &s->rep;
    int rc = dt_replica_update_unit(r, u, &s->pending_st);
    if (rc == DT_OK)
        rc = dt_replica_refresh(r, u, u + 1);
    if (rc == DT_OK)
        rc = dt_replica_zero_grads(r, u, u + 1);
    if (rc != DT_OK) {
        r->dp.host->log(r->dp.host, DT_LOG_ERROR,
                        "rank %d/%d: the deferred update of step %lld for unit '%s' failed",
                        r->dp.rank, r->dp.size, (long long)s->pending_st.t,
                        r->dp.model->units[u].name);
        return rc;
    }
    s->pending[u] = 0;
    s->n_pending--;
    return DT_OK;
}

static int apply_all_pending(dt_strategy_t *s)
{
    int rc = DT_OK;
    for (uint32_t u = 0; rc == DT_OK && s->n_pending && u < s->rep.dp.model->n_units; u++)
        rc = apply_pending(s, u);
    return rc;
}

int ddp_begin_step(dt_strategy_t *s, int64_t step)
{
    /* the gradients a deferred update still needs are not zeroed (that
     * update zeroes them) */
    return dt_replica_begin_step(&s->rep, step, s->n_pending ? s->pending : NULL);
}

int ddp_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = dt_replica_pre_forward(&s->rep, h, out);
    if (rc == DT_OK)
        rc = apply_pending(s, h->unit);
    return rc;
}

int ddp_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    int rc = dt_replica_pre_backward(&s->rep, h, out);
    if (rc == DT_OK)
        rc = apply_pending(s, h->unit); /* a unit used without a forward */
    return rc;
}

int ddp_step(dt_strategy_t *s, const dt_step_args_v1_t *args, dt_step_result_v1_t *out)
{
    dt_replica_t *r = &s->rep;
    dt_optim_step_t st;
    int rc = dt_dp_step_check(&r->dp, args, out);
    if (rc == DT_OK)
        rc = apply_all_pending(s); /* units this step never used */
    if (rc == DT_OK)
        rc = dt_replica_step_grads(r, args, out, &st);
    if (rc != DT_OK || out->nonfinite)
        return rc;
    uint32_t nu = r->dp.model->n_units;
    if (s->defer) {
        s->pending_st = st;
        memset(s->pending, 1, nu);
        s->n_pending = nu;
        return DT_OK;
    }
    /* last unit first when staggered: the deferring ranks start at unit 0 */
    return dt_replica_update(r, &st, s->stagger && r->dp.size > 1);
}

/* get_state / set_state: the arguments checked, then the unit's deferred
 * update applied (a state read sees it; a state set replaces it). */
static int state_access(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, const void *buf,
                        const char *what)
{
    int rc = dt_dp_state_check(&s->rep.dp, unit, kind, dt_replica_has_v(&s->rep), r, buf, what);
    return rc == DT_OK ? apply_pending(s, unit) : rc;
}

int ddp_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, float *buf)
{
    int rc = state_access(s, unit, kind, r, buf, "get_state");
    return rc == DT_OK ? dt_replica_get_state(&s->rep, unit, kind, r, buf) : rc;
}

int ddp_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r, const float *buf)
{
    int rc = state_access(s, unit, kind, r, buf, "set_state");
    return rc == DT_OK ? dt_replica_set_state(&s->rep, unit, kind, r, buf) : rc;
}
