/*
 * plugins/shm/shm_sync.c - futexes, doorbells, peer liveness and the one
 * bounded wait loop every blocking step of the progress thread goes
 * through (see shm_sync.h for the why).
 */
#include "shm_sync.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm_msg.h"

uint64_t shm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void shm_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#endif
}

static int futex_wait_op(_Atomic uint32_t *word, int op, uint32_t expect,
                         uint64_t timeout_ns)
{
    struct timespec ts, *tp = NULL;
    if (timeout_ns) {
        ts.tv_sec = (time_t)(timeout_ns / 1000000000ull);
        ts.tv_nsec = (long)(timeout_ns % 1000000000ull);
        tp = &ts;
    }
    /* FUTEX_WAIT takes a relative timeout. */
    return (int)syscall(SYS_futex, (uint32_t *)word, op, expect, tp, NULL, 0);
}

int shm_futex_wait(_Atomic uint32_t *word, uint32_t expect, uint64_t timeout_ns)
{
    return futex_wait_op(word, FUTEX_WAIT, expect, timeout_ns);
}

int shm_futex_wake(_Atomic uint32_t *word, int n)
{
    return (int)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, n, NULL, NULL, 0);
}

int shm_futex_wait_private(_Atomic uint32_t *word, uint32_t expect,
                           uint64_t timeout_ns)
{
    return futex_wait_op(word, FUTEX_WAIT_PRIVATE, expect, timeout_ns);
}

int shm_futex_wake_private(_Atomic uint32_t *word, int n)
{
    return (int)syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n,
                        NULL, NULL, 0);
}

int shm_ring(dt_comm_t *c, int r, uint32_t min_mode)
{
    shm_rank_t *rk = &c->ranks[r];
    uint32_t s = atomic_load(&rk->sleeping);
    if (s == SHM_AWAKE || s < min_mode)
        return 0;
    atomic_fetch_add(&rk->bell, 1);
    shm_futex_wake(&rk->bell, 1);
    return 1;
}

void shm_post_phase(dt_comm_t *c, uint32_t value)
{
    c->phase = value;
    /* seq_cst: pairs with the sleeper's store to `sleeping` followed by
     * its re-check of our counter (one of the two sees the other). */
    atomic_store(&c->ranks[c->rank].seq, value);
    int rang = 0;
    for (int p = 0; p < c->size; p++)
        if (p != c->rank)
            rang |= shm_ring(c, p, SHM_SLEEP_PEERS);
    if (rang && c->spin_ns)
        c->rang_ns = shm_now_ns();
}

int shm_peer_gone(dt_comm_t *c, int p)
{
    if (p == c->rank)
        return 0;
    if (atomic_load(&c->ranks[p].state) == SHM_RANK_LEFT)
        return SHM_FAIL_LEFT;
    if (c->pidfds[p] >= 0) {
        /* A pidfd turns readable when the process exits, zombie or not,
         * and cannot be fooled by pid reuse. */
        struct pollfd pfd = {.fd = c->pidfds[p], .events = POLLIN};
        if (poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP)))
            return SHM_FAIL_DEAD;
        return 0;
    }
    if (kill(c->pids[p], 0) != 0 && errno == ESRCH)
        return SHM_FAIL_DEAD;
    return 0;
}

/* ---- the wait loop ----------------------------------------------------- */

typedef struct phase_cond {
    uint32_t target;
    int32_t only;
    int next; /* ranks before `next` are known to be there */
} phase_cond_t;

static inline int phase_reached(uint32_t seq, uint32_t target)
{
    return (int32_t)(seq - target) >= 0;
}

static int phase_ready(dt_comm_t *c, phase_cond_t *pc)
{
    if (pc->only >= 0)
        return phase_reached(atomic_load(&c->ranks[pc->only].seq), pc->target);
    for (; pc->next < c->size; pc->next++)
        if (!phase_reached(atomic_load(&c->ranks[pc->next].seq), pc->target))
            return 0;
    return 1;
}

#define MISS_CAP 1024

/* Ranks that have not posted the target yet (at most MISS_CAP). */
static int phase_missing(dt_comm_t *c, phase_cond_t *pc, int *out)
{
    int n = 0;
    for (int p = 0; p < c->size && n < MISS_CAP; p++) {
        if (pc->only >= 0 && p != pc->only)
            continue;
        if (!phase_reached(atomic_load(&c->ranks[p].seq), pc->target))
            out[n++] = p;
    }
    return n;
}

static int fail_req(dt_comm_t *c, struct dt_comm_req *r, int status,
                    const char *fmt, const char *a, const char *b)
{
    char desc[256];
    shm_req_desc(c, r, desc, sizeof desc);
    snprintf(r->msg, sizeof r->msg, "%s: ", desc);
    size_t n = strlen(r->msg);
    snprintf(r->msg + n, sizeof r->msg - n, fmt, a, b);
    return status;
}

/* Check everything except readiness; returns DT_OK to keep waiting.
 * `full` adds the periodic part (liveness of missing ranks, deadline). */
static int check_failures(dt_comm_t *c, struct dt_comm_req *r,
                          phase_cond_t *pc, uint64_t now, uint64_t t0,
                          uint64_t *next_check, int full)
{
    char text[512], who[1024];
    int miss[MISS_CAP];
    if (atomic_load(&c->job->world->fail.state) == 2) {
        int st = shm_fail_text(c, text, sizeof text);
        return fail_req(c, r, st, "%s%s", text, "");
    }
    if (atomic_load(&c->cancel_upto) >= r->id) {
        int n = phase_missing(c, pc, miss);
        shm_fmt_ranks(c, miss, n, who, sizeof who);
        snprintf(text, sizeof text, "timed out after %.1f s (the wait's limit) waiting for %s",
                 (double)atomic_load(&c->cancel_ms) / 1000.0, who);
        return fail_req(c, r, DT_ERR_TIMEOUT, "%s%s", text, "");
    }
    if (atomic_load(&c->stop))
        return fail_req(c, r, DT_ERR_ABORTED, "%s%s",
                        "the group was finalized while the operation was in flight", "");
    if (atomic_load(&c->broken)) /* a send/recv failed meanwhile */
        return fail_req(c, r, c->broken_status, "the group failed: %s%s", c->broken_msg, "");
    if (!full || now < *next_check)
        return DT_OK;
    *next_check = now + SHM_CHECK_NS;
    int n = phase_missing(c, pc, miss);
    for (int i = 0; i < n; i++) {
        int p = miss[i];
        int gone = shm_peer_gone(c, p);
        if (gone == SHM_FAIL_DEAD) {
            shm_publish_fail(c->job, SHM_FAIL_DEAD, c->wranks[p], c->pids[p], "died");
            int st = shm_fail_text(c, text, sizeof text);
            return fail_req(c, r, st, "%s%s", text, "");
        }
        if (gone == SHM_FAIL_LEFT) {
            shm_fmt_rank(c, p, who, sizeof who);
            return fail_req(c, r, DT_ERR_REMOTE,
                            "%s left the group (finalize) without joining it%s", who, "");
        }
    }
    if (now - t0 >= (uint64_t)c->timeout_ms * 1000000ull) {
        shm_fmt_ranks(c, miss, n, who, sizeof who);
        snprintf(text, sizeof text, "timed out after %.1f s waiting for %s",
                 (double)c->timeout_ms / 1000.0, who);
        return fail_req(c, r, DT_ERR_TIMEOUT, "%s%s", text, "");
    }
    return DT_OK;
}

static int wait_phase_slow(dt_comm_t *c, struct dt_comm_req *r, phase_cond_t *pcp);

int shm_wait_phase(dt_comm_t *c, struct dt_comm_req *r, uint32_t target,
                   int32_t only)
{
    phase_cond_t pc = {.target = target, .only = only, .next = 0};
    if (phase_ready(c, &pc))
        return DT_OK;
    if (!c->stats.on)
        return wait_phase_slow(c, r, &pc);
    uint64_t t0 = shm_now_ns();
    int st = wait_phase_slow(c, r, &pc);
    c->stats.waits++;
    c->stats.wait_ns += shm_now_ns() - t0;
    return st;
}

/* shm_wait_phase when the target was not reached at once. */
static int wait_phase_slow(dt_comm_t *c, struct dt_comm_req *r, phase_cond_t *pcp)
{
    phase_cond_t pc = *pcp;
    shm_rank_t *me = &c->ranks[c->rank];
    uint64_t t0 = shm_now_ns(), now = t0;
    const uint64_t spin = shm_exec_spin_ns(c);
    uint64_t spin_end = t0 + spin;
    if (spin && c->rang_ns + SHM_WAKE_SPIN_NS > spin_end)
        spin_end = c->rang_ns + SHM_WAKE_SPIN_NS; /* a peer we woke is on its way */
    uint64_t next_check = t0 + SHM_CHECK_NS;
    uint64_t limit = (uint64_t)c->timeout_ms * 1000000ull;
    unsigned iter = 0;
    for (;;) {
        int prog = c->p2p_head ? shm_p2p_progress(c) : 0;
        if (prog < 0)
            return fail_req(c, r, -prog, "the group failed: %s%s", c->broken_msg, "");
        if (phase_ready(c, &pc))
            return DT_OK;
        int full = (++iter & 63) == 0;
        if (full)
            now = shm_now_ns();
        int st = check_failures(c, r, &pc, now, t0, &next_check, full);
        if (st != DT_OK)
            return st;
        if (prog || now < spin_end) {
            shm_cpu_relax();
            continue;
        }
        /* Sleep.  Announce it, then look once more: a peer that posted
         * before seeing `sleeping` is seen here; one that posts after
         * rings the bell and the futex returns at once. */
        uint32_t v = atomic_load(&me->bell);
        atomic_store(&me->sleeping, SHM_SLEEP_PEERS);
        int again = phase_ready(c, &pc) ||
                    atomic_load(&c->job->world->fail.state) == 2 ||
                    atomic_load(&c->cancel_upto) >= r->id ||
                    atomic_load(&c->stop) ||
                    (c->p2p_head && shm_p2p_progress(c) != 0);
        if (!again) {
            uint64_t left = now - t0 < limit ? limit - (now - t0) : 1;
            shm_futex_wait(&me->bell, v, left < SHM_SLICE_NS ? left : SHM_SLICE_NS);
        }
        atomic_store(&me->sleeping, SHM_AWAKE);
        uint64_t before = now;
        now = shm_now_ns();
        if (c->stats.on && !again) {
            c->stats.sleeps++;
            c->stats.sleep_ns += now - before;
        }
        st = check_failures(c, r, &pc, now, t0, &next_check, 1);
        if (st != DT_OK)
            return st;
    }
}

void shm_p2p_wait(dt_comm_t *c, _Atomic uint32_t *done)
{
    shm_rank_t *me = &c->ranks[c->rank];
    const uint64_t spin = shm_exec_spin_ns(c);
    uint64_t spin_end = shm_now_ns() + spin;
    for (;;) {
        if (spin && c->rang_ns + SHM_WAKE_SPIN_NS > spin_end)
            spin_end = c->rang_ns + SHM_WAKE_SPIN_NS; /* a peer we woke is on its way */
        if (atomic_load(&c->enqueued) != atomic_load(&c->taken) || atomic_load(&c->stop) ||
            !c->p2p_head || (done && atomic_load(done) == SHM_REQ_DONE))
            return;
        int prog = shm_p2p_progress(c);
        if (prog < 0)
            return; /* the group broke: queued ops will fail at once */
        if (prog)
            continue;
        if (shm_now_ns() < spin_end) {
            shm_cpu_relax();
            continue;
        }
        /* Peers ring us when they move data; the slice bounds how late we
         * look at their liveness and our ops' stall timeouts. */
        uint32_t v = atomic_load(&me->bell);
        atomic_store(&me->sleeping, SHM_SLEEP_PEERS);
        int again = atomic_load(&c->enqueued) != atomic_load(&c->taken) ||
                    atomic_load(&c->stop) || shm_p2p_progress(c) != 0 ||
                    (done && atomic_load(done) == SHM_REQ_DONE);
        if (!again)
            shm_futex_wait(&me->bell, v, SHM_SLICE_NS);
        atomic_store(&me->sleeping, SHM_AWAKE);
    }
}
