/*
 * tests/support/comm_fault.c - the countdown fault injector over the comm
 * interposer (see comm_fault.h).
 */
#include "comm_fault.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>

#include <cmocka.h>

#include "util/error.h"

static dt_interpose_comm_t *fault_ic;
static const dt_comm_ops_t *fault_inner;
static dt_comm_fault_t armed;   /* nth == 0: nothing armed */
static uint32_t left;           /* matching calls until it fires */
static int fired;

static int fault_before(void *ctx, const dt_interpose_call_t *call)
{
    (void)ctx;
    if (!armed.nth || fired)
        return DT_OK;
    if (armed.rank >= 0 && call->rank != armed.rank)
        return DT_OK;
    if (armed.slot == DT_COMM_FAULT_ANY_COLLECTIVE ? !(call->flags & DT_ICALL_COLLECTIVE)
                                                   : (int32_t)call->slot != armed.slot)
        return DT_OK;
    if (--left > 0)
        return DT_OK;
    fired = 1;
    const dt_interpose_comm_call_t *k = (const dt_interpose_comm_call_t *)call;
    if (armed.abort_first && k->comm) {
        char why[256];
        snprintf(why, sizeof why, "fault injection: %s on rank %d (call %llu)", call->name,
                 call->rank, (unsigned long long)call->seq);
        k->ops->abort(k->comm, why);
    }
    return k->host->set_error(k->host, armed.status,
                              "%s on rank %d (group rank %d of %d, call %llu): injected %s "
                              "(fault injection)",
                              call->name, call->rank, k->group_rank, k->group_size,
                              (unsigned long long)call->seq, dt_status_name(armed.status));
}

const dt_comm_ops_t *dt_comm_fault_wrap(const dt_comm_ops_t *inner)
{
    if (!fault_ic) {
        dt_interpose_hooks_t hooks = {.before = fault_before};
        if (dt_interpose_comm_create(inner, &hooks, &fault_ic) != DT_OK)
            fail_msg("%s", dt_last_error());
        fault_inner = inner;
    }
    const dt_comm_ops_t *ops = dt_interpose_comm_ops(fault_ic);
    if (inner != fault_inner && inner != ops)
        fail_msg("dt_comm_fault_wrap: already wrapping comm '%s'", fault_inner->info.name);
    return ops;
}

void dt_comm_fault_arm(const dt_comm_fault_t *f)
{
    armed = *f;
    left = f->nth;
    fired = 0;
}

int dt_comm_fault_disarm(void)
{
    int was = fired;
    armed.nth = 0;
    fired = 0;
    return was;
}
