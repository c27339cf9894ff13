/*
 * core/interpose/interpose_ledger.c - the collective ledger's hooks over
 * the comm interposer (interpose.h, dt_interpose_ledger_hooks): the groups
 * init and split make and finalize ends, one ledger entry per call that
 * moves data (ledger.h), and the first such call that fails.
 *
 * The before hook is the whole cost on the hot path: a scan of a few
 * group handles, four relaxed loads of the crash record's context and a
 * 48-byte store into the ring.
 *
 * Test hook (DTRAIN_TEST_HOOKS builds only): DTRAIN_FAULT_DIVERGE=R:S
 * makes world rank R, at its first all_reduce, reduce_scatter or
 * all_gather of training step S, issue a broadcast (root 0, of the
 * call's output buffer and count, which it can hold) in its place: one
 * rank issuing a different collective, for tests/integration/
 * test_ledger.sh.  R:S:world issues it on the world group instead of the
 * call's (where the others are not: they wait until the timeout).  The
 * broadcast is recorded; the call it replaces fails with the broadcast's
 * status (the communicator's message).
 */
#include "interpose/interpose.h"

#include <stdlib.h>
#include <string.h>

#include "interpose/ledger.h"
#include "util/crash.h"
#include "util/error.h"

#ifdef DTRAIN_TEST_HOOKS
#include <stdatomic.h>
#include <stdio.h>

static _Atomic int diverge_fired;

/* DTRAIN_FAULT_DIVERGE=R:S[:world]: whether this call is the one to
 * replace (*world: on the world group). */
static int diverge_now(const dt_interpose_comm_call_t *k, int *world)
{
    const char *v = getenv("DTRAIN_FAULT_DIVERGE");
    int rank, n = 0;
    long long step;
    if (!v || sscanf(v, "%d:%lld%n", &rank, &step, &n) != 2 || rank != k->base.rank)
        return 0;
    *world = strcmp(v + n, ":world") == 0;
    if (k->base.slot != DT_ICOMM_ALL_REDUCE && k->base.slot != DT_ICOMM_REDUCE_SCATTER &&
        k->base.slot != DT_ICOMM_ALL_GATHER)
        return 0;
    dt_crash_where_t w;
    dt_crash_where(&w);
    if (w.step != step || !w.phase || strcmp(w.phase, "training") != 0)
        return 0;
    int expect = 0;
    return atomic_compare_exchange_strong(&diverge_fired, &expect, 1);
}

static int diverge(dt_ledger_t *l, const dt_interpose_comm_call_t *k, int world)
{
    dt_comm_t *g = world && dt_ledger_world(l) ? (dt_comm_t *)dt_ledger_world(l) : k->comm;
    dt_ledger_entry_t e = {.count = k->count, .peer = 0, .slot = DT_ICOMM_BROADCAST,
                           .dtype = (int8_t)k->dtype, .reduce_op = -1};
    dt_ledger_record(l, g, 1, &e);
    int rc = k->ops->broadcast(g, k->recv, k->count, k->dtype, 0, NULL, NULL);
    if (rc == DT_OK && k->host)
        rc = k->host->set_error(k->host, DT_ERR_INVALID, "test hook DTRAIN_FAULT_DIVERGE: the "
                                "broadcast issued in place of %s completed", k->base.name);
    dt_ledger_note_failure(l, rc);
    return rc;
}
#endif

static int ledger_before(void *ctx, const dt_interpose_call_t *call)
{
    dt_ledger_t *l = ctx;
    const dt_interpose_comm_call_t *k = (const dt_interpose_comm_call_t *)call;
    uint32_t flags = call->flags;
    if (call->slot == DT_ICOMM_FINALIZE) {
        dt_ledger_group_remove(l, k->comm);
        return DT_OK;
    }
    if (!(flags & (DT_ICALL_COLLECTIVE | DT_ICALL_P2P)))
        return DT_OK;
#ifdef DTRAIN_TEST_HOOKS
    int world = 0;
    if (diverge_now(k, &world))
        return diverge(l, k, world);
#endif
    dt_ledger_entry_t e = {.count = k->count, .peer = k->peer, .slot = (uint8_t)call->slot,
                           .dtype = (int8_t)k->dtype, .reduce_op = (int8_t)k->reduce_op};
    if (call->slot == DT_ICOMM_SPLIT) {
        e.count = 0;
        e.peer = -1;
    }
    dt_ledger_record(l, k->comm, (flags & DT_ICALL_COLLECTIVE) != 0, &e);
    return DT_OK;
}

static void ledger_after(void *ctx, const dt_interpose_call_t *call, int status,
                         uint64_t elapsed_ns)
{
    (void)elapsed_ns;
    dt_ledger_t *l = ctx;
    const dt_interpose_comm_call_t *k = (const dt_interpose_comm_call_t *)call;
    if (status != DT_OK) {
        if (call->flags & (DT_ICALL_COLLECTIVE | DT_ICALL_P2P | DT_ICALL_WAIT))
            dt_ledger_note_failure(l, status);
        return;
    }
    if (call->slot == DT_ICOMM_INIT && k->new_comm) {
        dt_ledger_group_add(l, k->new_comm, DT_LEDGER_WORLD, k->group_rank, k->group_size);
    } else if (call->slot == DT_ICOMM_SPLIT && k->new_comm) {
        /* every member counts the parent's splits alike, whether it
         * joins a group or not (the branch below) */
        uint32_t parent = 0;
        uint32_t no = dt_ledger_split_count(l, k->comm, &parent);
        int32_t rank = -1, size = -1;
        if (k->ops->rank_size(k->new_comm, &rank, &size) != DT_OK)
            rank = size = -1;
        dt_ledger_group_add(l, k->new_comm, no ? dt_ledger_split_key(parent, no, k->color)
                                               : DT_LEDGER_UNKNOWN,
                            rank, size);
    } else if (call->slot == DT_ICOMM_SPLIT) {
        uint32_t parent = 0;
        (void)dt_ledger_split_count(l, k->comm, &parent); /* a rank joining no group */
    }
}

dt_interpose_hooks_t dt_interpose_ledger_hooks(dt_ledger_t *ledger)
{
    return (dt_interpose_hooks_t){.ctx = ledger, .before = ledger_before, .after = ledger_after,
                                  .untimed = 1};
}
