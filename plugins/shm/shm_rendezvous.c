/*
 * plugins/shm/shm_rendezvous.c - how the ranks of a group meet in its
 * shared-memory segment: create or open the segment, check a segment we
 * did not create before trusting it, map it, claim our rank's slot, wait
 * for every other rank, then remove the name.
 *
 * Each rank tries to create the segment with O_CREAT|O_EXCL (mode 0600);
 * the winner sizes and initialises it, the others open it and wait for its
 * magic.  Each rank claims its slot with its pid and counts itself in;
 * once all `size` are in, the first rank to notice unlinks the name, so a
 * crash later leaves nothing in /dev/shm.
 *
 * A stale segment (same name, left by a crashed earlier job that was never
 * cleaned up) is recognised by its creator's pid no longer existing (or a
 * slot claimed by a dead pid): the first rank to notice marks it stale in
 * the segment itself (so exactly one rank unlinks it), and everybody
 * retries with a fresh segment.  A segment whose creator is alive but whose
 * group size differs, or whose slot for our rank is held by a live process,
 * means the job id is in use twice: that fails with a message saying so.
 *
 * Every step returns DT_OK, RDV_RETRY (start over with a fresh shm_open:
 * the segment went away or was being set up) or an error status with the
 * message set and nothing of ours left mapped.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm_internal.h"
#include "shm_msg.h"
#include "shm_sync.h"

/* A step's "start over" (DT_* statuses are >= 0). */
#define RDV_RETRY (-1)

/* ---- small helpers ------------------------------------------------------ */

static size_t page_up(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* The header of a segment for `size` ranks: offsets, sizes, version. */
static void layout(shm_hdr_t *h, int32_t size, uint64_t chunk, uint64_t p2p_chunk)
{
    size_t n = (size_t)size, off = page_up(sizeof(shm_hdr_t));
    h->off_ranks = off;
    off += page_up(n * sizeof(shm_rank_t));
    h->off_chans = off;
    off += page_up(n * n * sizeof(shm_chan_t));
    h->off_slots = off;
    off += n * SHM_NBUF * chunk;
    h->off_p2p = off;
    off += n * n * SHM_P2P_NBUF * p2p_chunk;
    h->total = off;
    h->size = size;
    h->chunk = chunk;
    h->p2p_chunk = p2p_chunk;
    h->nbuf = SHM_NBUF;
    h->p2p_nbuf = SHM_P2P_NBUF;
    h->version = SHM_VERSION;
}

static int pid_alive(pid_t pid)
{
    return pid > 0 && !(kill(pid, 0) != 0 && errno == ESRCH);
}

static int sys_pidfd_open(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

static int rdv_error(dt_comm_t *c, const char *what, int status, const char *fmt, ...)
    DT_PRINTF(4, 5);

static int rdv_error(dt_comm_t *c, const char *what, int status, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return c->host->set_error(c->host, status, "%s: %s", what, text);
}

/* Drop our mapping of c's segment (the job's, for the world group). */
static void unmap_seg(dt_comm_t *c)
{
    if (c->base)
        munmap(c->base, c->bytes);
    if (c->is_world && c->job && c->job->base == c->base) {
        c->job->base = NULL;
        c->job->world = NULL;
    }
    c->base = NULL;
    c->hdr = NULL;
    c->ranks = NULL;
}

void shm_leave_failed(dt_comm_t *c)
{
    if (!c->hdr)
        return;
    if (c->ranks && atomic_load(&c->ranks[c->rank].pid) == (int32_t)getpid())
        atomic_store(&c->ranks[c->rank].state, SHM_RANK_LEFT);
    atomic_fetch_add(&c->hdr->detached, 1);
    uint32_t z = 0;
    if (atomic_compare_exchange_strong(&c->hdr->unlinked, &z, 1))
        shm_unlink(c->name);
    unmap_seg(c);
}

/* Mark a segment found abandoned; the first rank to do so unlinks it. */
static void drop_stale(const char *name, shm_hdr_t *h)
{
    uint32_t z = 0;
    if (atomic_compare_exchange_strong(&h->stale, &z, 1))
        shm_unlink(name);
}

/* ---- create or open ----------------------------------------------------- */

/* We won the O_EXCL create of c->name (open as `fd`): size it, reserve
 * its memory, map it and initialise the header (the magic last). */
static int seg_create(dt_comm_t *c, const char *what, int fd, uint64_t chunk,
                      uint64_t p2p_chunk)
{
    shm_hdr_t tmp;
    memset(&tmp, 0, sizeof tmp);
    layout(&tmp, c->size, chunk, p2p_chunk);
    int err = ftruncate(fd, (off_t)tmp.total) != 0 ? errno : 0;
    if (!err)
        err = posix_fallocate(fd, 0, (off_t)tmp.total);
    void *base = err ? MAP_FAILED
                     : mmap(NULL, tmp.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!err && base == MAP_FAILED)
        err = errno;
    if (err) {
        shm_unlink(c->name);
        return rdv_error(c, what, err == ENOSPC ? DT_ERR_NOMEM : DT_ERR_SYSTEM,
                         "cannot reserve %.1f MiB of shared memory for %s: %s "
                         "(enlarge /dev/shm, e.g. docker --shm-size, or lower "
                         "[shm] slot_bytes)",
                         (double)tmp.total / 1048576.0, c->name, strerror(err));
    }
    shm_hdr_t *h = base;
    atomic_store(&h->creator_pid, (int32_t)getpid());
    h->version = tmp.version;
    h->size = tmp.size;
    h->nbuf = tmp.nbuf;
    h->p2p_nbuf = tmp.p2p_nbuf;
    h->chunk = tmp.chunk;
    h->p2p_chunk = tmp.p2p_chunk;
    h->total = tmp.total;
    h->off_ranks = tmp.off_ranks;
    h->off_chans = tmp.off_chans;
    h->off_slots = tmp.off_slots;
    h->off_p2p = tmp.off_p2p;
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
    c->base = base;
    c->bytes = tmp.total;
    return DT_OK;
}

/* Whether a segment somebody else created can be joined yet: DT_OK when
 * initialised, RDV_RETRY when it is still being initialised or was
 * abandoned (then marked stale and unlinked, so the retry creates a fresh
 * one). */
static int segment_state(const char *name, shm_hdr_t *h)
{
    pid_t creator = atomic_load(&h->creator_pid);
    int ready = atomic_load_explicit(&h->magic, memory_order_acquire) == SHM_MAGIC;
    if (atomic_load(&h->stale))
        return RDV_RETRY;
    if (creator > 0 && !pid_alive(creator) &&
        (!ready || atomic_load(&h->attached) < (uint32_t)h->size)) {
        /* its creator died before the group was complete */
        drop_stale(name, h);
        return RDV_RETRY;
    }
    return ready ? DT_OK : RDV_RETRY;
}

/* Check an initialised segment that another process created (its file
 * `st`, its header `h`) before trusting any of it: DT_OK when this rank
 * may join it, else an error naming what does not match.  Every check of
 * a segment found under our name belongs here. */
static int validate_segment(dt_comm_t *c, const char *what, const struct stat *st,
                            const shm_hdr_t *h)
{
    (void)st;
    pid_t creator = atomic_load(&h->creator_pid);
    if (h->version != SHM_VERSION)
        return rdv_error(c, what, DT_ERR_INVALID,
                         "%s was created by pid %d with layout version %u of the "
                         "shm plugin; this rank's plugin has version %u (ranks of "
                         "one job must load the same dtrain_shm)",
                         c->name, (int)creator, (unsigned)h->version,
                         (unsigned)SHM_VERSION);
    if (h->size != c->size)
        return rdv_error(c, what, DT_ERR_INVALID,
                         "%s was created for %d ranks by pid %d, but this rank "
                         "was told the group has %d (is the job id used twice?)",
                         c->name, (int)h->size, (int)creator, (int)c->size);
    return DT_OK;
}

/* Join the existing segment c->name (open as `fd`): wait for its creator
 * to size and initialise it, validate it, map all of it. */
static int seg_join(dt_comm_t *c, const char *what, int fd)
{
    const size_t hdr_bytes = page_up(sizeof(shm_hdr_t));
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < hdr_bytes)
        return RDV_RETRY; /* the creator is between shm_open and ftruncate */
    shm_hdr_t *h = mmap(NULL, hdr_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED)
        return rdv_error(c, what, DT_ERR_SYSTEM, "cannot map %s: %s", c->name,
                         strerror(errno));
    int rc = segment_state(c->name, h);
    if (rc == DT_OK)
        rc = validate_segment(c, what, &st, h);
    size_t total = h->total;
    munmap(h, hdr_bytes);
    if (rc != DT_OK)
        return rc;
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return rdv_error(c, what, DT_ERR_SYSTEM, "cannot map %zu bytes of %s: %s", total,
                         c->name, strerror(errno));
    c->base = base;
    c->bytes = total;
    return DT_OK;
}

/* Create c->name, or join it when it exists; on DT_OK c->base maps it. */
static int seg_create_or_join(dt_comm_t *c, const char *what, uint64_t chunk,
                              uint64_t p2p_chunk)
{
    int fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) {
        int rc = seg_create(c, what, fd, chunk, p2p_chunk);
        close(fd);
        return rc;
    }
    if (errno != EEXIST)
        return rdv_error(c, what, DT_ERR_SYSTEM, "cannot create %s: %s", c->name,
                         strerror(errno));
    fd = shm_open(c->name, O_RDWR, 0);
    if (fd < 0)
        return errno == ENOENT ? RDV_RETRY /* unlinked meanwhile (stale) */
                               : rdv_error(c, what, DT_ERR_SYSTEM, "cannot open %s: %s",
                                           c->name, strerror(errno));
    int rc = seg_join(c, what, fd);
    close(fd);
    if (rc == RDV_RETRY)
        sleep_ms(1); /* its creator is still setting it up */
    return rc;
}

/* Point c's views (ranks, channels, slots) into its mapping; the world
 * group's mapping also holds the job's failure record. */
static void seg_bind(dt_comm_t *c)
{
    shm_hdr_t *h = c->base;
    c->hdr = h;
    c->ranks = (shm_rank_t *)((unsigned char *)c->base + h->off_ranks);
    c->chans = (shm_chan_t *)((unsigned char *)c->base + h->off_chans);
    c->slots = (unsigned char *)c->base + h->off_slots;
    c->p2p = (unsigned char *)c->base + h->off_p2p;
    c->chunk = h->chunk;
    c->p2p_chunk = h->p2p_chunk;
    if (c->is_world) {
        c->job->world = h;
        c->job->base = c->base;
        c->job->bytes = c->bytes;
    }
}

/* ---- joining the group -------------------------------------------------- */

/* Publish the CPUs this process may run on in its slot (bit per CPU). */
static void publish_cpus(shm_rank_t *rk)
{
    cpu_set_t mine;
    CPU_ZERO(&mine);
    memset(rk->cpus, 0, sizeof rk->cpus);
    if (sched_getaffinity(0, sizeof mine, &mine) == 0) {
        for (int cpu = 0; cpu < SHM_CPU_WORDS * 64 && cpu < CPU_SETSIZE; cpu++)
            if (CPU_ISSET(cpu, &mine))
                rk->cpus[cpu / 64] |= 1ull << (cpu % 64);
    } else {
        memset(rk->cpus, 0xff, sizeof rk->cpus); /* unknown: any */
    }
}

/* Claim our rank's slot with our pid and count ourselves in.  A slot held
 * by a dead process means the segment is stale (RDV_RETRY); by a live
 * one, the job id or rank is used twice. */
static int claim_slot(dt_comm_t *c, const char *what)
{
    shm_rank_t *rk = &c->ranks[c->rank];
    int32_t prev = 0;
    if (!atomic_compare_exchange_strong(&rk->pid, &prev, (int32_t)getpid())) {
        if (pid_alive(prev)) {
            unmap_seg(c);
            return rdv_error(c, what, DT_ERR_INVALID,
                             "rank %d of %s is already taken by pid %d (two processes "
                             "with the same rank, or the job id used twice)",
                             (int)c->rank, c->name, (int)prev);
        }
        drop_stale(c->name, c->hdr);
        unmap_seg(c);
        return RDV_RETRY;
    }
    rk->world_rank = c->wranks[c->rank];
    publish_cpus(rk);
    atomic_store(&rk->state, SHM_RANK_JOINED);
    atomic_fetch_add(&c->hdr->attached, 1);
    shm_futex_wake(&c->hdr->attached, INT_MAX);
    return DT_OK;
}

/* Wait until all c->size ranks are in, at most until t0 + limit (ns).
 * Fails early when a rank that claimed its slot died, or (split groups)
 * when the job failed meanwhile; on failure we leave the segment. */
static int wait_for_peers(dt_comm_t *c, const char *what, uint64_t t0, uint64_t limit)
{
    shm_hdr_t *h = c->hdr;
    uint64_t next_check = 0;
    for (;;) {
        uint32_t n = atomic_load(&h->attached);
        if (n >= (uint32_t)c->size)
            return DT_OK;
        uint64_t now = shm_now_ns();
        if (now >= next_check) {
            next_check = now + SHM_CHECK_NS;
            for (int p = 0; p < c->size; p++) {
                pid_t pp = atomic_load(&c->ranks[p].pid);
                /* A rank that gave up (its own timeout) is not a death:
                 * keep waiting and name the ranks that never came. */
                if (pp > 0 && p != c->rank && !pid_alive(pp) &&
                    atomic_load(&c->ranks[p].state) != SHM_RANK_LEFT) {
                    char who[96];
                    shm_fmt_rank(c, p, who, sizeof who);
                    shm_leave_failed(c);
                    return rdv_error(c, what, DT_ERR_REMOTE, "%s (pid %d) died before "
                                     "all ranks arrived", who, (int)pp);
                }
            }
            if (!c->is_world && atomic_load(&c->job->world->fail.state) == 2) {
                char text[512];
                int st = shm_fail_text(c, text, sizeof text);
                shm_leave_failed(c);
                return rdv_error(c, what, st, "%s", text);
            }
        }
        if (now - t0 >= limit) {
            int miss_n = 0;
            int *miss = malloc(sizeof(int) * (size_t)c->size);
            for (int p = 0; miss && p < c->size; p++)
                if (atomic_load(&c->ranks[p].pid) == 0)
                    miss[miss_n++] = p;
            char who[1024];
            shm_fmt_ranks(c, miss, miss_n, who, sizeof who);
            free(miss);
            shm_leave_failed(c);
            return rdv_error(c, what, DT_ERR_TIMEOUT,
                             "timed out after %.1f s waiting for %s of %d",
                             (double)c->timeout_ms / 1000.0, who, (int)c->size);
        }
        uint64_t left = limit - (now - t0);
        shm_futex_wait(&h->attached, n, left < SHM_SLICE_NS ? left : SHM_SLICE_NS);
    }
}

/* Everybody is in: remove the name (attach, then unlink) and note each
 * peer's pid, world rank and a pidfd to watch it by. */
static void seg_complete(dt_comm_t *c)
{
    uint32_t z = 0;
    if (atomic_compare_exchange_strong(&c->hdr->unlinked, &z, 1))
        shm_unlink(c->name);
    for (int p = 0; p < c->size; p++) {
        c->pids[p] = atomic_load(&c->ranks[p].pid);
        c->wranks[p] = c->ranks[p].world_rank;
        c->pidfds[p] = p == c->rank ? -1 : sys_pidfd_open(c->pids[p]);
    }
}

int shm_rendezvous(dt_comm_t *c, const char *what, uint64_t chunk, uint64_t p2p_chunk)
{
    const uint64_t t0 = shm_now_ns();
    const uint64_t limit = (uint64_t)c->timeout_ms * 1000000ull;
    for (;;) {
        if (shm_now_ns() - t0 > limit)
            return rdv_error(c, what, DT_ERR_TIMEOUT,
                             "timed out after %.1f s trying to create or open %s "
                             "(it exists but was never initialised: a stale segment "
                             "from a crashed job? remove /dev/shm%s)",
                             (double)c->timeout_ms / 1000.0, c->name, c->name);
        int rc = seg_create_or_join(c, what, chunk, p2p_chunk);
        if (rc == DT_OK) {
            seg_bind(c);
            rc = claim_slot(c, what);
        }
        if (rc == DT_OK)
            break;
        if (rc != RDV_RETRY)
            return rc;
    }
    int rc = wait_for_peers(c, what, t0, limit);
    if (rc == DT_OK)
        seg_complete(c);
    return rc;
}
