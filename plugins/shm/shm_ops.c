/*
 * plugins/shm/shm_ops.c - the shared-memory communicator's operations as
 * the ABI sees them: argument checks, the per-group queue, the progress
 * thread, and wait/test.
 *
 * Every operation becomes a request queued to its group.  Whoever holds
 * the group's `exec` lock runs requests in start order: normally the
 * group's progress thread, so started operations overlap the caller's
 * compute; but a caller that blocks (req == NULL, or wait with the default
 * limit) while the thread has nothing in flight runs them itself, which
 * saves two thread hand-offs per operation (a futex wake-up costs ~30 us
 * on a VM).  Collectives run one at a time (shm_collectives.c); sends and
 * recvs stay active side by side once started (shm_p2p.c).
 *
 * A failure breaks the group: the failed request carries the message,
 * every later one fails at once with "not started: the group failed
 * earlier: <first message>", since the ranks are out of step from then on.
 */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shm_internal.h"
#include "shm_msg.h"
#include "common/comm/reduce.h"
#include "shm_sync.h"

/* ---- requests ---------------------------------------------------------- */

void shm_req_complete(struct dt_comm_req *r, int status)
{
    r->status = status;
    /* seq_cst store then load of `waiters`, against the waiter's store of
     * `waiters` then load of `state`: one of the two sees the other. */
    atomic_store(&r->state, SHM_REQ_DONE);
    if (atomic_load(&r->waiters))
        shm_futex_wake_private(&r->state, INT_MAX);
    /* A waiter that saw DONE while spinning may free r as soon as this
     * store lands (req_release), not before: the load of `waiters` above
     * reads r after DONE is visible. */
    atomic_store(&r->released, 1);
}

/* Before freeing a request another thread completed: that thread may be
 * between its store of DONE and its last touch of r (a few instructions
 * and at most one futex wake), so wait for `released`, bounded; past the
 * bound r is leaked rather than freed under it.  Returns 1 when r may be
 * freed. */
static int req_release(struct dt_comm_req *r)
{
    uint64_t t0 = shm_now_ns();
    while (!atomic_load(&r->released)) {
        if (shm_now_ns() - t0 > 10000000000ull)
            return 0;
        sched_yield();
    }
    return 1;
}

void shm_break(dt_comm_t *c, int status, const char *text)
{
    if (!atomic_load(&c->broken)) {
        c->broken_status = status;
        snprintf(c->broken_msg, sizeof c->broken_msg, "%s", text);
        atomic_store(&c->broken, 1);
    }
    if (c->p2p_head) {
        char t[sizeof c->broken_msg + 32];
        snprintf(t, sizeof t, "the group failed: %s", c->broken_msg);
        shm_p2p_fail_all(c, c->broken_status, t);
    }
}

static void fail_unstarted(dt_comm_t *c, struct dt_comm_req *r, int status,
                           const char *why)
{
    char desc[256];
    shm_req_desc(c, r, desc, sizeof desc);
    snprintf(r->msg, sizeof r->msg, "%s: not started: %s", desc, why);
    shm_req_complete(r, status);
}

/* Progress thread: take one dequeued op. */
static void run_one(dt_comm_t *c, struct dt_comm_req *r)
{
    char text[700];
    if (atomic_load(&c->broken)) {
        snprintf(text, sizeof text, "the group failed earlier: %s", c->broken_msg);
        fail_unstarted(c, r, c->broken_status, text);
        return;
    }
    if (atomic_load(&c->job->world->fail.state) == 2) {
        int st = shm_fail_text(c, text, sizeof text);
        shm_break(c, st, text);
        fail_unstarted(c, r, st, text);
        return;
    }
    if (atomic_load(&c->stop)) {
        fail_unstarted(c, r, DT_ERR_ABORTED, "the group was finalized first");
        return;
    }
    if (atomic_load(&c->cancel_upto) >= r->id) {
        snprintf(text, sizeof text, "timed out after %.1f s (the wait's limit) while "
                 "earlier operations ran", (double)atomic_load(&c->cancel_ms) / 1000.0);
        char desc[256], cause[sizeof r->msg];
        shm_req_desc(c, r, desc, sizeof desc);
        snprintf(cause, sizeof cause, "%s: not started: %s", desc, text);
        /* the other ranks run it: this rank is out of step from now on
         * (broken before the caller hears of it, so its next op fails at
         * once) */
        shm_break(c, DT_ERR_TIMEOUT, cause);
        fail_unstarted(c, r, DT_ERR_TIMEOUT, text);
        return;
    }
    if (dt_creq_is_p2p(&r->b)) {
        shm_p2p_start(c, r);
        return;
    }
    uint64_t t0 = c->stats.on ? shm_now_ns() : 0;
    int st = shm_run_collective(c, r);
    if (c->stats.on) {
        c->stats.coll_ops++;
        c->stats.coll_bytes += r->b.count * r->b.esize;
        c->stats.coll_ns += shm_now_ns() - t0;
    }
    if (st == DT_OK) {
        shm_req_complete(r, DT_OK);
        return;
    }
    /* Break the group before the caller hears of the failure, so that
     * its next op fails at once with this cause. */
    shm_break(c, st, r->msg);
    shm_req_complete(r, st); /* r may be freed from here on */
}

/* Wake our own progress thread for a local event (enqueue, cancel,
 * finalize) wherever it sleeps: idle on its private word, or on the shared
 * doorbell while it moves point-to-point data. */
void shm_wake_progress(dt_comm_t *c)
{
    if (atomic_load(&c->idle_sleeping)) {
        atomic_fetch_add(&c->idle_word, 1);
        shm_futex_wake_private(&c->idle_word, 1);
    }
    shm_ring(c, c->rank, SHM_SLEEP_IDLE);
}

static int has_local_work(dt_comm_t *c)
{
    return atomic_load(&c->enqueued) != atomic_load(&c->taken) || atomic_load(&c->stop) ||
           atomic_load(&c->p2p_active) > 0;
}

/* Nothing queued, nothing in flight: spin a little (the next op usually
 * comes soon), then sleep until a local event. */
static void idle_sleep(dt_comm_t *c)
{
    uint64_t spin_end = shm_now_ns() + c->spin_ns;
    while (shm_now_ns() < spin_end) {
        if (has_local_work(c))
            return;
        shm_cpu_relax();
    }
    uint32_t v = atomic_load(&c->idle_word);
    /* seq_cst store, then the loads in has_local_work: pairs with
     * wake_progress (the waker publishes work, then loads idle_sleeping) */
    atomic_store(&c->idle_sleeping, 1);
    if (!has_local_work(c))
        shm_futex_wait_private(&c->idle_word, v, 0);
    atomic_store(&c->idle_sleeping, 0);
}

/* Executor (holding exec): dequeue and run one op.  Returns 0 when the
 * queue was empty. */
static int run_next(dt_comm_t *c)
{
    pthread_mutex_lock(&c->qlock);
    struct dt_comm_req *r = c->qhead;
    if (r) {
        c->qhead = r->next;
        if (!c->qhead)
            c->qtail = NULL;
        r->next = NULL;
        atomic_fetch_add(&c->taken, 1);
    }
    pthread_mutex_unlock(&c->qlock);
    if (r)
        run_one(c, r);
    return r != NULL;
}

_Thread_local int shm_on_progress_thread;

void *shm_progress_main(void *arg)
{
    dt_comm_t *c = arg;
    shm_on_progress_thread = 1;
    for (;;) {
        if (atomic_load(&c->enqueued) != atomic_load(&c->taken)) {
            pthread_mutex_lock(&c->exec);
            run_next(c);
            pthread_mutex_unlock(&c->exec);
            continue;
        }
        if (atomic_load(&c->stop))
            break;
        if (atomic_load(&c->p2p_active) > 0) {
            pthread_mutex_lock(&c->exec);
            shm_p2p_wait(c, NULL);
            pthread_mutex_unlock(&c->exec);
            continue;
        }
        idle_sleep(c);
    }
    pthread_mutex_lock(&c->exec);
    shm_p2p_fail_all(c, DT_ERR_ABORTED,
                     "the group was finalized while the operation was in flight");
    pthread_mutex_unlock(&c->exec);
    return NULL;
}

/* A waiting caller does the work itself when the progress thread is not
 * busy (it may be asleep): run queued ops and move point-to-point data
 * until r is done.  Holding exec, with nothing queued and nothing active,
 * r is necessarily done. */
static void help_until_done(dt_comm_t *c, struct dt_comm_req *r)
{
    while (atomic_load(&r->state) != SHM_REQ_DONE) {
        if (run_next(c))
            continue;
        if (!c->p2p_head)
            break;
        shm_p2p_wait(c, &r->state);
    }
}

/* Caller side: wait until r is done, at most timeout_ns (< 0: no limit);
 * spins for spin_ns first (0 when ranks outnumber cores, or when this
 * thread has one CPU, which it shares with the progress thread).  While it
 * waits, the progress thread may spin (shm_exec_spin_ns).  Returns 1 when
 * done. */
static int req_wait_done(dt_comm_t *c, struct dt_comm_req *r, int64_t timeout_ns)
{
    if (atomic_load(&r->state) == SHM_REQ_DONE)
        return 1;
    uint64_t t0 = shm_now_ns();
    uint64_t spin_end = t0 + (c->caller_one_cpu ? 0 : c->spin_ns);
    atomic_fetch_add(&c->callers_waiting, 1);
    for (;;) {
        if (atomic_load(&r->state) == SHM_REQ_DONE) {
            atomic_fetch_sub(&c->callers_waiting, 1);
            return 1;
        }
        uint64_t now = shm_now_ns(), left = 0;
        if (timeout_ns >= 0) {
            if (now - t0 >= (uint64_t)timeout_ns) {
                atomic_fetch_sub(&c->callers_waiting, 1);
                return 0;
            }
            left = (uint64_t)timeout_ns - (now - t0);
        }
        if (now < spin_end) {
            shm_cpu_relax();
            continue;
        }
        atomic_store(&r->waiters, 1);
        if (atomic_load(&r->state) != SHM_REQ_DONE)
            shm_futex_wait_private(&r->state, SHM_REQ_QUEUED, left);
    }
}

int shm_op_wait(dt_comm_t *c, dt_comm_req_t *r, int64_t timeout_ms)
{
    int chk = dt_comm_check_wait(c ? c->host : NULL, r);
    if (chk != DT_OK)
        return chk;
    uint64_t t_wait = 0;
    if (c->stats.on && atomic_load(&r->state) != SHM_REQ_DONE)
        t_wait = shm_now_ns();
    if (timeout_ms < 0) {
        /* Every step of the executor is bounded by the group timeout. */
        if (atomic_load(&r->state) != SHM_REQ_DONE && pthread_mutex_trylock(&c->exec) == 0) {
            help_until_done(c, r);
            int more = atomic_load(&c->enqueued) != atomic_load(&c->taken) ||
                       atomic_load(&c->p2p_active) > 0;
            pthread_mutex_unlock(&c->exec);
            if (more)
                shm_wake_progress(c); /* sends/recvs still moving: hand them back */
        }
        req_wait_done(c, r, -1);
    } else if (!req_wait_done(c, r, (timeout_ms < SHM_TIMEOUT_MAX_MS ? timeout_ms
                                                                      : SHM_TIMEOUT_MAX_MS) *
                                        1000000ll)) {
        /* Our own limit expired: ask the progress thread to give up on
         * everything up to this op (the rank is out of step with its
         * peers from now on), and wait for it to let go of the buffers. */
        atomic_store(&c->cancel_ms, timeout_ms);
        uint64_t cur = atomic_load(&c->cancel_upto);
        while (cur < r->id && !atomic_compare_exchange_weak(&c->cancel_upto, &cur, r->id))
            ;
        shm_wake_progress(c);
        if (!req_wait_done(c, r, 2 * c->timeout_ms * 1000000ll + 10000000000ll)) {
            char desc[256];
            shm_req_desc(c, r, desc, sizeof desc);
            /* Still running: leak the request rather than free it under
             * the progress thread. */
            return c->host->set_error(c->host, DT_ERR_TIMEOUT,
                                      "%s: timed out after %.1f s and the progress "
                                      "thread did not stop", desc, (double)timeout_ms / 1000.0);
        }
    }
    if (t_wait) {
        atomic_fetch_add(&c->stats.req_waits, 1);
        atomic_fetch_add(&c->stats.req_wait_ns, shm_now_ns() - t_wait);
    }
    int st = r->status;
    if (st != DT_OK)
        c->host->set_error(c->host, st, "%s", r->msg);
    pthread_mutex_lock(&c->qlock);
    dt_creq_live_remove(&c->live, &r->b);
    pthread_mutex_unlock(&c->qlock);
    if (req_release(r))
        free(r);
    return st;
}

int shm_op_test(dt_comm_t *c, dt_comm_req_t *r, int *done)
{
    int chk = dt_comm_check_test(c ? c->host : NULL, r, done);
    if (chk != DT_OK)
        return chk;
    *done = atomic_load(&r->state) == SHM_REQ_DONE;
    return DT_OK;
}

/* Before the operation t describes is queued: the work queued on the
 * stream done, the group and the job not failed. */
static int submit_check(dt_comm_t *c, const struct dt_comm_req *t, dt_stream_t *stream)
{
    char text[700];
    int st = dt_creq_stream_sync(c->dev, stream);
    if (st != DT_OK)
        return st;
    dt_comm_names_t g = shm_names(c);
    if (atomic_load(&c->broken))
        return dt_creq_refuse_broken(c->host, &g, &t->b, c->broken_status, c->broken_msg);
    if (atomic_load(&c->job->world->fail.state) == 2) {
        st = shm_fail_text(c, text, sizeof text);
        return dt_creq_refuse_failed(c->host, &g, &t->b, st, text);
    }
    return DT_OK;
}

/* A request for the caller to wait on, a copy of t; NULL (message set)
 * when out of memory. */
static struct dt_comm_req *req_new(dt_comm_t *c, const struct dt_comm_req *t)
{
    dt_comm_names_t g = shm_names(c);
    struct dt_comm_req *r = dt_creq_new(c->host, &g, t, sizeof *r);
    if (!r)
        return NULL;
    atomic_init(&r->state, SHM_REQ_QUEUED);
    atomic_init(&r->waiters, 0);
    atomic_init(&r->released, 0);
    return r;
}

/* Number r and queue it for the progress thread (qlock held). */
static void enqueue_locked(dt_comm_t *c, struct dt_comm_req *r)
{
    r->id = ++c->next_id;
    dt_creq_number(&r->b, &c->coll_seq, &c->p2p_seq);
    if (c->qtail)
        c->qtail->next = r;
    else
        c->qhead = r;
    c->qtail = r;
    dt_creq_live_add(&c->live, &r->b);
}

/* Validate, queue, and either hand out the request or wait for it. */
static int submit(dt_comm_t *c, struct dt_comm_req *t, dt_stream_t *stream,
                  dt_comm_req_t **req)
{
    const dt_host_v1_t *h = c->host;
    if (req)
        *req = NULL;
    int chk = submit_check(c, t, stream);
    if (chk != DT_OK)
        return chk;
    if (!req && !dt_creq_is_p2p(&t->b) &&
        atomic_load(&c->enqueued) == atomic_load(&c->taken) &&
        pthread_mutex_trylock(&c->exec) == 0) {
        /* Blocking collective and the progress thread has nothing queued
         * or in flight: run it here (in order: everything started before
         * has finished, since we hold `exec` and the queue is empty). */
        if (atomic_load(&c->enqueued) == atomic_load(&c->taken) && !c->p2p_head) {
            struct dt_comm_req *r = malloc(sizeof *r);
            if (r) {
                *r = *t;
                atomic_init(&r->state, SHM_REQ_QUEUED);
                atomic_init(&r->waiters, 0);
                atomic_init(&r->released, 0);
                pthread_mutex_lock(&c->qlock);
                r->id = ++c->next_id;
                dt_creq_number(&r->b, &c->coll_seq, &c->p2p_seq);
                pthread_mutex_unlock(&c->qlock);
                run_one(c, r);
                if (c->stats.on)
                    c->stats.coll_inline++;
                pthread_mutex_unlock(&c->exec);
                int st = r->status;
                if (st != DT_OK)
                    h->set_error(h, st, "%s", r->msg);
                free(r);
                return st;
            }
        }
        pthread_mutex_unlock(&c->exec);
    }
    struct dt_comm_req *r = req_new(c, t);
    if (!r)
        return DT_ERR_NOMEM;
    pthread_mutex_lock(&c->qlock);
    enqueue_locked(c, r);
    pthread_mutex_unlock(&c->qlock);
    atomic_fetch_add(&c->enqueued, 1);
    shm_wake_progress(c);
    if (!req)
        return shm_op_wait(c, r, -1);
    *req = r;
    return DT_OK;
}

/* Every argument check of the operation t describes (kind, send, recv,
 * count, dtype, op, root/peer; sets t->b.esize): the shared ones, with
 * shm's own count limit between them. */
static int check_args(dt_comm_t *c, struct dt_comm_req *t)
{
    const dt_host_v1_t *h = c->host;
    dt_comm_names_t g = shm_names(c);
    int st = dt_creq_check_op(h, &g, &t->b);
    dt_comm_op_desc_t d = dt_creq_desc(&t->b);
    if (st == DT_OK && t->b.count > (UINT64_MAX / 16) / t->b.esize / (uint64_t)c->size)
        st = dt_comm_op_fail(h, &g, &d, DT_ERR_INVALID, "count %llu is too large",
                             (unsigned long long)t->b.count);
    if (st == DT_OK)
        st = dt_comm_check_args(h, &g, &d, c->rank, t->b.count, t->send, t->recv);
    return st;
}

#define CHECK(x)                                                               \
    do {                                                                       \
        int st_ = (x);                                                         \
        if (st_ != DT_OK)                                                      \
            return st_;                                                        \
    } while (0)

int shm_op_all_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count,
                          int dtype, int op, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_ALL_REDUCE, .count = count, .dtype = dtype,
                                  .op = op, .root = -1}, .send = send, .recv = recv};
    CHECK(check_args(c, &t));
    /* in place on symmetric memory: the peers' copies are read directly
     * (shm_collectives.c); looked up here, on the caller's thread, which
     * alone changes the list */
    if (send == recv && count > 0)
        t.sym = shm_sym_find(c, recv, count * t.b.esize, &t.sym_off);
    return submit(c, &t, stream, req);
}

int shm_op_reduce_scatter(dt_comm_t *c, const void *send, void *recv,
                              uint64_t recv_count, int dtype, int op,
                              dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_REDUCE_SCATTER, .count = recv_count,
                                  .dtype = dtype, .op = op, .root = -1}, .send = send,
                                  .recv = recv};
    CHECK(check_args(c, &t));
    /* a send buffer in symmetric memory: the blocks are read in place */
    if (recv_count > 0)
        t.sym = shm_sym_find(c, send, recv_count * t.b.esize * (uint64_t)c->size, &t.sym_off);
    return submit(c, &t, stream, req);
}

int shm_op_all_gather(dt_comm_t *c, const void *send, void *recv, uint64_t send_count,
                          int dtype, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_ALL_GATHER, .count = send_count,
                                  .dtype = dtype, .root = -1}, .send = send, .recv = recv};
    CHECK(check_args(c, &t));
    /* a recv buffer in symmetric memory: the blocks are read in place */
    if (send_count > 0)
        t.sym = shm_sym_find(c, recv, send_count * t.b.esize * (uint64_t)c->size, &t.sym_off);
    return submit(c, &t, stream, req);
}

int shm_op_broadcast(dt_comm_t *c, void *buf, uint64_t count, int dtype, int32_t root,
                         dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_BROADCAST, .count = count, .dtype = dtype,
                                  .root = root}, .send = buf, .recv = buf};
    CHECK(check_args(c, &t));
    return submit(c, &t, stream, req);
}

int shm_op_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count,
                         int dtype, int op, int32_t root, dt_stream_t *stream,
                         dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_REDUCE, .count = count, .dtype = dtype,
                                  .op = op, .root = root}, .send = send, .recv = recv};
    CHECK(check_args(c, &t));
    return submit(c, &t, stream, req);
}

int shm_op_send(dt_comm_t *c, const void *buf, uint64_t count, int dtype, int32_t peer,
                    int32_t tag, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_SEND, .count = count, .dtype = dtype,
                                  .root = peer, .tag = tag}, .send = buf};
    CHECK(check_args(c, &t));
    return submit(c, &t, stream, req);
}

int shm_op_recv(dt_comm_t *c, void *buf, uint64_t count, int dtype, int32_t peer,
                    int32_t tag, dt_stream_t *stream, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_RECV, .count = count, .dtype = dtype,
                                  .root = peer, .tag = tag}, .recv = buf};
    CHECK(check_args(c, &t));
    return submit(c, &t, stream, req);
}

/* Both halves are checked, then queued together (one lock), so either
 * both run or neither: the progress thread keeps every started send and
 * recv moving side by side (shm_p2p.c), so neither waits for the other. */
int shm_op_sendrecv(dt_comm_t *c, const void *sendbuf, uint64_t send_count, void *recvbuf,
                    uint64_t recv_count, int dtype, int32_t send_peer, int32_t recv_peer,
                    int32_t send_tag, int32_t recv_tag, dt_stream_t *stream,
                    dt_comm_req_t **send_req, dt_comm_req_t **recv_req)
{
    if (!c)
        return DT_ERR_INVALID;
    int rq = dt_comm_sendrecv_reqs(c->host, send_req, recv_req);
    if (rq != DT_OK)
        return rq;
    struct dt_comm_req ts = {.b = {.kind = DT_COMM_OP_SEND, .count = send_count, .dtype = dtype,
                                   .root = send_peer, .tag = send_tag}, .send = sendbuf};
    struct dt_comm_req tr = {.b = {.kind = DT_COMM_OP_RECV, .count = recv_count, .dtype = dtype,
                                   .root = recv_peer, .tag = recv_tag}, .recv = recvbuf};
    CHECK(check_args(c, &ts));
    CHECK(check_args(c, &tr));
    CHECK(submit_check(c, &ts, stream));
    struct dt_comm_req *rs = req_new(c, &ts), *rr = rs ? req_new(c, &tr) : NULL;
    if (!rr) {
        free(rs);
        return DT_ERR_NOMEM;
    }
    pthread_mutex_lock(&c->qlock);
    enqueue_locked(c, rs);
    enqueue_locked(c, rr);
    pthread_mutex_unlock(&c->qlock);
    atomic_fetch_add(&c->enqueued, 2);
    shm_wake_progress(c);
    if (send_req) {
        *send_req = rs;
        *recv_req = rr;
        return DT_OK;
    }
    int st = shm_op_wait(c, rs, -1);
    int st2 = shm_op_wait(c, rr, -1);
    return st != DT_OK ? st : st2;
}

int shm_op_barrier(dt_comm_t *c, dt_comm_req_t **req)
{
    if (!c)
        return DT_ERR_INVALID;
    struct dt_comm_req t = {.b = {.kind = DT_COMM_OP_BARRIER, .dtype = DT_U8, .esize = 1,
                                  .root = -1}};
    return submit(c, &t, NULL, req);
}

int shm_op_rank_size(dt_comm_t *c, int32_t *rank, int32_t *size)
{
    if (!c)
        return DT_ERR_INVALID;
    if (rank)
        *rank = c->rank;
    if (size)
        *size = c->size;
    return DT_OK;
}
