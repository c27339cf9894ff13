/*
 * plugins/nccl/nccl_guard.c - a group's lock and failure record, and the
 * bounded poll every wait of the nccl communicator is made of
 * (nccl_logic.h says why abort never blocks and still never runs beside
 * another NCCL call).  Plain pthreads and C11 atomics: no CUDA, no NCCL.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "nccl_logic.h"

int nccl_fail_set(nccl_fail_t *f, int status, const char *msg)
{
    int expected = 0;
    if (status == 0 || !atomic_compare_exchange_strong(&f->claimed, &expected, 1))
        return 0;
    snprintf(f->msg, sizeof f->msg, "%s", msg ? msg : "");
    atomic_store(&f->status, status); /* seq_cst: after msg, and before the
                                       * aborter's fence (nccl_guard_abort) */
    return 1;
}

int nccl_fail_status(const nccl_fail_t *f)
{
    return atomic_load((atomic_int *)&f->status);
}

void nccl_guard_init(nccl_guard_t *g, void (*apply)(void *ctx), void *ctx)
{
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    atomic_init(&g->fail.claimed, 0);
    atomic_init(&g->fail.status, 0);
    g->apply = apply;
    g->ctx = ctx;
}

void nccl_guard_destroy(nccl_guard_t *g)
{
    pthread_mutex_destroy(&g->mu);
}

void nccl_guard_lock(nccl_guard_t *g)
{
    pthread_mutex_lock(&g->mu);
}

void nccl_guard_apply_locked(nccl_guard_t *g)
{
    if (!g->applied && nccl_fail_status(&g->fail)) {
        g->applied = 1;
        if (g->apply)
            g->apply(g->ctx);
    }
}

void nccl_guard_unlock(nccl_guard_t *g)
{
    for (;;) {
        nccl_guard_apply_locked(g);
        int pending = !g->applied; /* read while mu is held */
        pthread_mutex_unlock(&g->mu);
        if (!pending)
            return;
        /* The holder's half of the Dekker pair: released, fence, look.  A
         * failure recorded by an abort whose trylock saw mu still held is
         * seen here (nccl_logic.h). */
        atomic_thread_fence(memory_order_seq_cst);
        if (!nccl_fail_status(&g->fail))
            return;
        if (pthread_mutex_trylock(&g->mu) != 0)
            return; /* a new holder applies it when it releases */
    }
}

int nccl_guard_fail_locked(nccl_guard_t *g, int status, const char *msg)
{
    int first = nccl_fail_set(&g->fail, status, msg);
    /* a failure recorded before this one (by abort) is applied just the
     * same: the communicator goes either way */
    nccl_guard_apply_locked(g);
    return first;
}

int nccl_guard_abort(nccl_guard_t *g, int status, const char *msg)
{
    int first = nccl_fail_set(&g->fail, status, msg);
    /* the aborter's half: published, fence, try the lock */
    atomic_thread_fence(memory_order_seq_cst);
    if (pthread_mutex_trylock(&g->mu) == 0)
        nccl_guard_unlock(g); /* applies it */
    return first;
}

static int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

nccl_poll_end_t nccl_poll(nccl_look_fn look, void *ctx, const nccl_fail_t *stop,
                          int64_t timeout_us, int64_t nap_us)
{
    const int64_t t0 = mono_us();
    if (nap_us < 1)
        nap_us = 1;
    for (;;) {
        if (stop && nccl_fail_status(stop))
            return NCCL_POLL_STOPPED;
        int got = look(ctx);
        if (got > 0)
            return NCCL_POLL_DONE;
        if (got < 0)
            return NCCL_POLL_FAILED;
        if (mono_us() - t0 >= timeout_us)
            return NCCL_POLL_TIMEOUT;
        struct timespec ts = {(time_t)(nap_us / 1000000), (long)(nap_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
}
