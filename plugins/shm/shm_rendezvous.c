/*
 * plugins/shm/shm_rendezvous.c - how the ranks of a group meet in its
 * shared-memory segment: create or open the segment, check a segment we
 * did not create before trusting any byte of it, map it, claim our rank's
 * slot, wait for every other rank, then remove the name.
 *
 * Trust no one.  Segment names are predictable (job ids of ranks started
 * by torchrun, Slurm or Open MPI are derived from public things), so
 * whatever is found under the name may have been planted: by another
 * user, or as garbage.  Rank 0 of the group creates the segment in
 * /dev/shm as an unnamed file (O_TMPFILE, mode 0600 whatever the umask),
 * sizes and initialises all of it and only then gives it its name
 * (linkat, which fails when the name exists: the exclusive create).  So a
 * live creator never exposes a half-built segment, and anything found
 * under the name that is not a complete, valid segment is garbage:
 * refused at once, never waited on.  Every other rank opens the name
 * (O_NOFOLLOW: a symlink is refused, never followed), and
 * validate_segment checks the file (regular, ours, mode 0600) and every
 * field of its header against the file's size before any pointer is
 * computed; a refusal names the file, its owner and mode, what is wrong,
 * and what to do.  With a job secret (comm.h), the creator stores a keyed
 * hash of it (shm_secret.h) and a joiner whose secret does not match is
 * refused too: knowing the name is not enough to join.
 *
 * Each rank then claims its slot with its pid and counts itself in; once
 * all `size` are in, the first rank to notice unlinks the name, so a crash
 * later leaves nothing in /dev/shm.
 *
 * A stale segment (same name, left by a crashed earlier job that was never
 * cleaned up) is recognised by its creator no longer running (pid and
 * start time) or a slot claimed by a dead pid: the first rank to notice
 * marks it stale in the segment itself (so exactly one rank unlinks it),
 * and everybody retries with a fresh segment.  A segment whose creator is
 * alive but whose group size differs, or whose slot for our rank is held
 * by a live process, means the job id is in use twice: that fails with a
 * message saying so.
 *
 * Every step returns DT_OK, RDV_RETRY (start over: the segment went away
 * or was found stale), RDV_WAIT (it does not exist yet: rank 0 creates
 * it) or an error status with the message set and nothing of ours left
 * mapped.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shm_internal.h"
#include "shm_msg.h"
#include "shm_secret.h"
#include "shm_sync.h"

/* A step's "start over" and "not there yet" (DT_* statuses are >= 0). */
#define RDV_RETRY (-1)
#define RDV_WAIT (-2)

/* Where a segment's parts lie: computed from (size, chunk, p2p_chunk) by
 * the creator, and by a joiner from the header's values, which must then
 * match it exactly. */
typedef struct seg_layout {
    uint64_t chunk, p2p_chunk; /* bytes of a pipeline / channel buffer */
    uint64_t off_ranks, off_chans, off_slots, off_p2p, total;
} seg_layout_t;

/* ---- small helpers ------------------------------------------------------ */

/* *n rounded up to whole pages: 0, or -1 when that overflows. */
static int page_up(uint64_t *n)
{
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    if (*n > UINT64_MAX - (pg - 1))
        return -1;
    *n = (*n + pg - 1) / pg * pg;
    return 0;
}

/* *part = a * b * c: 0, or -1 when it overflows. */
static int mul3(uint64_t *part, uint64_t a, uint64_t b, uint64_t c)
{
    return __builtin_mul_overflow(a, b, part) || __builtin_mul_overflow(*part, c, part) ? -1
                                                                                         : 0;
}

/* Append a part of `part` bytes at *off (rounded up to whole pages when
 * `pages`): 0, or -1 when that overflows. */
static int append(uint64_t *off, uint64_t part, int pages)
{
    if (pages && page_up(&part) != 0)
        return -1;
    return __builtin_add_overflow(*off, part, off) ? -1 : 0;
}

/* The layout of a segment for `size` ranks with those buffer sizes: 0, or
 * -1 when its arithmetic overflows or it could not be mapped (only a
 * corrupt header asks for that).  All parts but the buffers are page
 * aligned. */
static int layout_for(int32_t size, uint64_t chunk, uint64_t p2p_chunk, seg_layout_t *L)
{
    const uint64_t n = size > 0 ? (uint64_t)size : 0;
    uint64_t off = 0, part;
    if (n == 0 || append(&off, sizeof(shm_hdr_t), 1) != 0)
        return -1;
    L->chunk = chunk;
    L->p2p_chunk = p2p_chunk;
    L->off_ranks = off;
    if (mul3(&part, n, sizeof(shm_rank_t), 1) || append(&off, part, 1))
        return -1;
    L->off_chans = off;
    if (mul3(&part, n, n, sizeof(shm_chan_t)) || append(&off, part, 1))
        return -1;
    L->off_slots = off;
    if (mul3(&part, n, SHM_NBUF, chunk) || append(&off, part, 0))
        return -1;
    L->off_p2p = off;
    if (mul3(&part, n, n, SHM_P2P_NBUF) || mul3(&part, part, p2p_chunk, 1) ||
        append(&off, part, 0))
        return -1;
    L->total = off;
    return off > (uint64_t)SIZE_MAX || off > (uint64_t)INT64_MAX ? -1 : 0;
}

/* When process `pid` started (clock ticks since boot, /proc/<pid>/stat
 * field 22), 0 when unknown. */
static uint64_t proc_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* after the command name in parentheses (which may hold anything):
     * state is field 3, starttime field 22 */
    const char *p = strrchr(buf, ')');
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

static int pid_alive(pid_t pid)
{
    return pid > 0 && !(kill(pid, 0) != 0 && errno == ESRCH);
}

/* Process `pid` is running and, where both are known, started at `start`
 * (else a later process got its pid). */
static int process_is(pid_t pid, uint64_t start)
{
    if (!pid_alive(pid))
        return 0;
    uint64_t now = start ? proc_start_time(pid) : 0;
    return !start || !now || now == start;
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
    char text[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return c->host->set_error(c->host, status, "%s: %s", what, text);
}

/* The file's path, "/dev/shm/dtrain-...". */
static void seg_path(const dt_comm_t *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s%s", SHM_DIR, c->name);
}

/* Refuse the file at `path` (its status `st`): "<what>: <path> (owner uid
 * U (name), mode 0MMM): <text>". */
static int refuse(dt_comm_t *c, const char *what, int status, const char *path,
                  const struct stat *st, const char *fmt, ...) DT_PRINTF(6, 7);

static int refuse(dt_comm_t *c, const char *what, int status, const char *path,
                  const struct stat *st, const char *fmt, ...)
{
    char text[1024], owner[320], pwbuf[1024];
    struct passwd pw, *found = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (getpwuid_r(st->st_uid, &pw, pwbuf, sizeof pwbuf, &found) == 0 && found &&
        found->pw_name)
        snprintf(owner, sizeof owner, "uid %u (%s)", (unsigned)st->st_uid, found->pw_name);
    else
        snprintf(owner, sizeof owner, "uid %u", (unsigned)st->st_uid);
    return rdv_error(c, what, status, "%s (owner %s, mode %04o): %s", path, owner,
                     (unsigned)(st->st_mode & 07777), text);
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

/* Split groups: DT_ERR_REMOTE with the message when the job failed
 * meanwhile (its failure record is in the world segment), else DT_OK. */
static int job_failed(dt_comm_t *c, const char *what)
{
    if (c->is_world || atomic_load(&c->job->world->fail.state) != 2)
        return DT_OK;
    char text[512];
    int st = shm_fail_text(c, text, sizeof text);
    return rdv_error(c, what, st, "%s", text);
}

/* ---- checking a segment somebody else created --------------------------- */

/* The file itself: a regular file of ours with one name (a hard link
 * would make some other file of ours this segment) that nobody else may
 * open.  DT_OK, or the refusal (DT_ERR_DATA). */
int shm_check_file(dt_comm_t *c, const char *what, const char *path, const struct stat *st)
{
    if (S_ISLNK(st->st_mode))
        return refuse(c, what, DT_ERR_DATA, path, st,
                      "a symbolic link where the group's segment should be (shm never "
                      "creates one); refusing to follow it (remove it: rm %s)", path);
    if (!S_ISREG(st->st_mode))
        return refuse(c, what, DT_ERR_DATA, path, st,
                      "not a regular file (shm creates only regular files); refusing it "
                      "(remove it: rm %s)", path);
    if (st->st_nlink != 1)
        return refuse(c, what, DT_ERR_DATA, path, st,
                      "has %lu names (hard links) where a segment has one; refusing it "
                      "(remove this one: rm %s)", (unsigned long)st->st_nlink, path);
    if (st->st_uid != geteuid())
        return refuse(c, what, DT_ERR_DATA, path, st,
                      "owned by another user, not by this one (uid %u); refusing to join a "
                      "segment someone else created (its owner or root can remove it; or "
                      "use another job id)", (unsigned)geteuid());
    if (st->st_mode & 077)
        return refuse(c, what, DT_ERR_DATA, path, st,
                      "group or others may access it (shm creates segments with mode 0600); "
                      "refusing it (remove it: rm %s)", path);
    return DT_OK;
}

/* The job secret: both sides have none, or the same. */
static int check_secret(dt_comm_t *c, const char *what, const char *path,
                        const struct stat *st, const shm_hdr_t *h)
{
    const shm_job_t *job = c->job;
    int pid = (int)h->creator_pid;
    if (h->secret == SHM_SECRET_NONE && !job->has_secret)
        return DT_OK;
    if (h->secret == SHM_SECRET_NONE)
        return refuse(c, what, DT_ERR_DATA, path, st,
                      "created by pid %d without a job secret, but this rank has one: it is "
                      "not this job's segment (another job uses this job id, or a rank was "
                      "started without the job's secret)", pid);
    if (!job->has_secret)
        return refuse(c, what, DT_ERR_DATA, path, st,
                      "created by pid %d with a job secret, but this rank has none (pass "
                      "every rank the job's secret, DTRAIN_JOB_SECRET)", pid);
    uint8_t tag[SHM_SHA256_BYTES];
    shm_secret_tag(job->secret_key, c->name, h->salt, tag);
    if (!dt_equal_ct(tag, h->tag, sizeof tag))
        return refuse(c, what, DT_ERR_DATA, path, st,
                      "created by pid %d with another job secret than this rank's: it is "
                      "not this job's segment (another job uses this job id, or this rank "
                      "was given another job's secret)", pid);
    return DT_OK;
}

/* A buffer size: whole pages within [lo, hi]. */
static int size_ok(uint64_t v, uint64_t lo, uint64_t hi)
{
    return v >= lo && v <= hi && v % SHM_CHUNK_ALIGN == 0;
}

/* Check a segment found under our name (open as `fd`, its status `st`)
 * before trusting any of it: the file, then every header field against
 * the file's size.  Reads the header into `h` (a snapshot: the mapping is
 * made only once it passed) and, on DT_OK, sets *L from the checked
 * values.  Every check of a segment someone else created is here. */
static int validate_segment(dt_comm_t *c, const char *what, const char *path, int fd,
                            const struct stat *st, shm_hdr_t *h, seg_layout_t *L)
{
    int rc = shm_check_file(c, what, path, st);
    if (rc != DT_OK)
        return rc;
    if (st->st_size < (off_t)sizeof *h)
        return refuse(c, what, DT_ERR_DATA, path, st,
                      "%lld bytes, too small for a segment header (%zu bytes): truncated, or "
                      "not a segment (remove it: rm %s)", (long long)st->st_size, sizeof *h,
                      path);
    ssize_t got = pread(fd, h, sizeof *h, 0);
    if (got != (ssize_t)sizeof *h)
        return refuse(c, what, got < 0 ? DT_ERR_SYSTEM : DT_ERR_DATA, path, st,
                      "cannot read its header: %s",
                      got < 0 ? strerror(errno) : "short read");
    uint64_t magic = atomic_load_explicit(&h->magic, memory_order_relaxed);
    if (magic != SHM_MAGIC)
        return refuse(c, what, DT_ERR_DATA, path, st,
                      "not a dtrain shm segment (magic 0x%016llx, expected 0x%016llx): "
                      "zero-filled or garbage, and nobody is still writing it (a segment "
                      "gets its name only once complete); remove it: rm %s",
                      (unsigned long long)magic, (unsigned long long)SHM_MAGIC, path);
    int creator = (int)atomic_load_explicit(&h->creator_pid, memory_order_relaxed);
    if (h->version != SHM_VERSION)
        return rdv_error(c, what, DT_ERR_INVALID,
                         "%s was created by pid %d with layout version %u of the "
                         "shm plugin; this rank's plugin has version %u (ranks of "
                         "one job must load the same dtrain_shm)",
                         c->name, creator, (unsigned)h->version, (unsigned)SHM_VERSION);
    rc = check_secret(c, what, path, st, h);
    if (rc != DT_OK)
        return rc;
    if (h->size != c->size)
        return rdv_error(c, what, DT_ERR_INVALID,
                         "%s was created for %d ranks by pid %d, but this rank "
                         "was told the group has %d (is the job id used twice?)",
                         c->name, (int)h->size, creator, (int)c->size);

    /* From here on, a value that is not what this plugin writes is a
     * corrupt header.  The layout is recomputed from (size, chunk,
     * p2p_chunk) with overflow checks, and must match the header's
     * offsets and the file's size exactly. */
    char bad[384] = "";
    uint64_t cmin = shm_chunk_min(c->size);
    uint64_t cmax = cmin > SHM_CHUNK_MAX ? cmin : SHM_CHUNK_MAX;
    if (creator <= 0)
        snprintf(bad, sizeof bad, "creator pid %d", creator);
    else if (h->nbuf != SHM_NBUF || h->p2p_nbuf != SHM_P2P_NBUF)
        snprintf(bad, sizeof bad, "%u pipeline and %u channel buffers, expected %u and %u",
                 (unsigned)h->nbuf, (unsigned)h->p2p_nbuf, SHM_NBUF, SHM_P2P_NBUF);
    else if (h->secret > SHM_SECRET_HMAC_SHA256)
        snprintf(bad, sizeof bad, "secret kind %u", (unsigned)h->secret);
    else if (!size_ok(h->chunk, cmin, cmax))
        snprintf(bad, sizeof bad, "chunk %llu bytes, expected a multiple of %u in "
                 "[%llu, %llu]", (unsigned long long)h->chunk, SHM_CHUNK_ALIGN,
                 (unsigned long long)cmin, (unsigned long long)cmax);
    else if (!size_ok(h->p2p_chunk, SHM_P2P_CHUNK_MIN, SHM_P2P_CHUNK_MAX))
        snprintf(bad, sizeof bad, "p2p_chunk %llu bytes, expected a multiple of %u in "
                 "[%u, %u]", (unsigned long long)h->p2p_chunk, SHM_CHUNK_ALIGN,
                 SHM_P2P_CHUNK_MIN, SHM_P2P_CHUNK_MAX);
    else if (layout_for(c->size, h->chunk, h->p2p_chunk, L) != 0)
        snprintf(bad, sizeof bad, "%d ranks with %llu-byte chunks do not fit in memory",
                 (int)c->size, (unsigned long long)h->chunk);
    else {
        static const char *const names[] = {"off_ranks", "off_chans", "off_slots",
                                            "off_p2p", "total"};
        const uint64_t want[] = {L->off_ranks, L->off_chans, L->off_slots, L->off_p2p,
                                 L->total};
        const uint64_t have[] = {h->off_ranks, h->off_chans, h->off_slots, h->off_p2p,
                                 h->total};
        for (int i = 0; i < 5 && !bad[0]; i++)
            if (have[i] != want[i])
                snprintf(bad, sizeof bad, "%s %llu, expected %llu for %d ranks with "
                         "%llu- and %llu-byte buffers", names[i],
                         (unsigned long long)have[i], (unsigned long long)want[i],
                         (int)c->size, (unsigned long long)h->chunk,
                         (unsigned long long)h->p2p_chunk);
    }
    if (!bad[0] && (uint64_t)st->st_size != L->total)
        snprintf(bad, sizeof bad, "it describes %llu bytes, the file has %lld",
                 (unsigned long long)L->total, (long long)st->st_size);
    uint32_t attached = atomic_load_explicit(&h->attached, memory_order_relaxed);
    uint32_t detached = atomic_load_explicit(&h->detached, memory_order_relaxed);
    uint32_t fail = atomic_load_explicit(&h->fail.state, memory_order_relaxed);
    if (!bad[0] && (attached > (uint32_t)c->size || detached > (uint32_t)c->size))
        snprintf(bad, sizeof bad, "%u ranks attached and %u detached of %d", attached,
                 detached, (int)c->size);
    if (!bad[0] && (atomic_load_explicit(&h->unlinked, memory_order_relaxed) > 1 ||
                    atomic_load_explicit(&h->stale, memory_order_relaxed) > 1 || fail > 2))
        snprintf(bad, sizeof bad, "state words out of range");
    if (bad[0])
        return refuse(c, what, DT_ERR_DATA, path, st,
                      "corrupt segment header: %s; refusing it (remove it: rm %s)", bad, path);
    return DT_OK;
}

/* ---- create or open ----------------------------------------------------- */

/* Give the complete segment open as `fd` the name `path`: 0, EEXIST when
 * the name is taken, or another errno.  AT_EMPTY_PATH needs
 * CAP_DAC_READ_SEARCH; /proc/self/fd works for anyone. */
int shm_reserve(int fd, uint64_t bytes, void **base)
{
    /* 0600 whatever the umask: only this user may open it */
    int err = fchmod(fd, 0600) != 0 ? errno : 0;
    if (!err && ftruncate(fd, (off_t)bytes) != 0)
        err = errno;
    if (!err)
        err = posix_fallocate(fd, 0, (off_t)bytes);
    void *p = err ? MAP_FAILED : mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!err && p == MAP_FAILED)
        err = errno;
    if (!err)
        *base = p;
    return err;
}

int shm_name_fd(int fd, const char *path)
{
    if (linkat(fd, "", AT_FDCWD, path, AT_EMPTY_PATH) == 0)
        return 0;
    if (errno == EEXIST)
        return EEXIST;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    return linkat(AT_FDCWD, proc, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0 ? 0 : errno;
}

/* Initialise the header of a new segment (mapped at h, laid out as L). */
static int init_header(dt_comm_t *c, const char *what, shm_hdr_t *h, const seg_layout_t *L)
{
    atomic_store(&h->creator_pid, (int32_t)getpid());
    h->creator_start = proc_start_time(getpid());
    h->version = SHM_VERSION;
    h->size = c->size;
    h->nbuf = SHM_NBUF;
    h->p2p_nbuf = SHM_P2P_NBUF;
    h->chunk = L->chunk;
    h->p2p_chunk = L->p2p_chunk;
    h->total = L->total;
    h->off_ranks = L->off_ranks;
    h->off_chans = L->off_chans;
    h->off_slots = L->off_slots;
    h->off_p2p = L->off_p2p;
    if (c->job->has_secret) {
        ssize_t n;
        do
            n = getrandom(h->salt, sizeof h->salt, 0);
        while (n < 0 && errno == EINTR);
        if (n != (ssize_t)sizeof h->salt)
            return rdv_error(c, what, DT_ERR_SYSTEM, "cannot draw a salt for %s: %s",
                             c->name, n < 0 ? strerror(errno) : "short read");
        shm_secret_tag(c->job->secret_key, c->name, h->salt, h->tag);
        h->secret = SHM_SECRET_HMAC_SHA256;
    }
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
    return DT_OK;
}

/* Rank 0: create the segment as an unnamed file, size it, reserve its
 * memory, initialise it, and only then name it `path`.  RDV_RETRY when
 * the name was taken meanwhile (the next round checks what is there). */
static int seg_create(dt_comm_t *c, const char *what, const char *path, uint64_t chunk,
                      uint64_t p2p_chunk, seg_layout_t *L)
{
    if (layout_for(c->size, chunk, p2p_chunk, L) != 0)
        return rdv_error(c, what, DT_ERR_INVALID, "a segment for %d ranks with %llu-byte "
                         "chunks does not fit in memory", (int)c->size,
                         (unsigned long long)chunk);
    int fd = open(SHM_DIR, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return rdv_error(c, what, DT_ERR_SYSTEM, "cannot create a segment in %s: %s (shm "
                         "needs %s to be a tmpfs with O_TMPFILE, Linux 3.11 or later)",
                         SHM_DIR, strerror(errno), SHM_DIR);
    void *base = NULL;
    int err = shm_reserve(fd, L->total, &base);
    if (err) {
        close(fd);
        return rdv_error(c, what, err == ENOSPC ? DT_ERR_NOMEM : DT_ERR_SYSTEM,
                         "cannot reserve %.1f MiB of shared memory for %s: %s "
                         "(enlarge /dev/shm, e.g. docker --shm-size, or lower "
                         "[shm] slot_bytes)",
                         (double)L->total / 1048576.0, c->name, strerror(err));
    }
    int rc = init_header(c, what, base, L);
    if (rc == DT_OK) {
        err = shm_name_fd(fd, path);
        rc = err == EEXIST ? RDV_RETRY
             : err        ? rdv_error(c, what, DT_ERR_SYSTEM, "cannot name the segment %s: %s",
                                      path, strerror(err))
                          : DT_OK;
    }
    close(fd);
    if (rc != DT_OK) {
        munmap(base, L->total);
        return rc;
    }
    c->base = base;
    c->bytes = L->total;
    return DT_OK;
}

/* Whether a valid segment (mapped at h, its creator `creator` started at
 * `start`) can be joined: DT_OK, or RDV_RETRY when it was abandoned (then
 * marked stale and unlinked, so the retry finds a fresh one). */
static int segment_state(dt_comm_t *c, shm_hdr_t *h, pid_t creator, uint64_t start)
{
    if (atomic_load(&h->stale))
        return RDV_RETRY;
    if (!process_is(creator, start) && atomic_load(&h->attached) < (uint32_t)c->size) {
        /* its creator died before the group was complete */
        drop_stale(c->name, h);
        return RDV_RETRY;
    }
    return DT_OK;
}

/* Join the segment at `path` (open as `fd`): validate it, map all of it. */
static int seg_join(dt_comm_t *c, const char *what, const char *path, int fd,
                    seg_layout_t *L)
{
    struct stat st;
    shm_hdr_t snap;
    if (fstat(fd, &st) != 0)
        return rdv_error(c, what, DT_ERR_SYSTEM, "cannot stat %s: %s", path, strerror(errno));
    /* No name left: another rank found this one stale and unlinked it
     * between our open and fstat (drop_stale); the name now leads to a
     * fresh segment or to nothing, so look again (bounded by the
     * rendezvous' timeout like every retry). */
    if (S_ISREG(st.st_mode) && st.st_nlink == 0)
        return RDV_RETRY;
    int rc = validate_segment(c, what, path, fd, &st, &snap, L);
    if (rc != DT_OK)
        return rc;
    void *base = mmap(NULL, L->total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return rdv_error(c, what, DT_ERR_SYSTEM, "cannot map %llu bytes of %s: %s",
                         (unsigned long long)L->total, path, strerror(errno));
    rc = segment_state(c, base, (pid_t)snap.creator_pid, snap.creator_start);
    if (rc != DT_OK) {
        munmap(base, L->total);
        return rc;
    }
    c->base = base;
    c->bytes = L->total;
    return DT_OK;
}

/* `path` exists but cannot be opened (errno `err`): say why from what it
 * is, without following it. */
static int seg_unopenable(dt_comm_t *c, const char *what, const char *path, int err)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? RDV_RETRY /* removed meanwhile */
                               : rdv_error(c, what, DT_ERR_SYSTEM, "cannot open %s: %s",
                                           path, strerror(err));
    int rc = shm_check_file(c, what, path, &st);
    return rc != DT_OK ? rc
                       : rdv_error(c, what, DT_ERR_SYSTEM, "cannot open %s: %s", path,
                                   strerror(err));
}

/* Join c's segment, or (rank 0) create it when it does not exist; on
 * DT_OK c->base maps it, laid out as *L. */
static int seg_create_or_join(dt_comm_t *c, const char *what, uint64_t chunk,
                              uint64_t p2p_chunk, seg_layout_t *L)
{
    char path[sizeof SHM_DIR + sizeof c->name];
    seg_path(c, path, sizeof path);
    /* O_NONBLOCK: whatever was planted here (a FIFO), open returns */
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT)
        return c->rank == 0 ? seg_create(c, what, path, chunk, p2p_chunk, L) : RDV_WAIT;
    if (fd < 0)
        return seg_unopenable(c, what, path, errno);
    int rc = seg_join(c, what, path, fd, L);
    close(fd);
    return rc;
}

/* Point c's views (ranks, channels, slots) into its mapping, where the
 * checked layout L says; the world group's mapping also holds the job's
 * failure record. */
static void seg_bind(dt_comm_t *c, const seg_layout_t *L)
{
    shm_hdr_t *h = c->base;
    c->hdr = h;
    c->ranks = (shm_rank_t *)((unsigned char *)c->base + L->off_ranks);
    c->chans = (shm_chan_t *)((unsigned char *)c->base + L->off_chans);
    c->slots = (unsigned char *)c->base + L->off_slots;
    c->p2p = (unsigned char *)c->base + L->off_p2p;
    c->chunk = L->chunk;
    c->p2p_chunk = L->p2p_chunk;
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
            int st = job_failed(c, what);
            if (st != DT_OK) {
                shm_leave_failed(c);
                return st;
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
    seg_layout_t L;
    for (;;) {
        int rc = seg_create_or_join(c, what, chunk, p2p_chunk, &L);
        if (rc == DT_OK) {
            seg_bind(c, &L);
            rc = claim_slot(c, what);
        }
        if (rc == DT_OK)
            break;
        if (rc != RDV_RETRY && rc != RDV_WAIT)
            return rc;
        int st = job_failed(c, what);
        if (st != DT_OK)
            return st;
        uint64_t spent = shm_now_ns() - t0;
        if (spent > limit) {
            char path[sizeof SHM_DIR + sizeof c->name];
            seg_path(c, path, sizeof path);
            if (rc == RDV_WAIT)
                return rdv_error(c, what, DT_ERR_TIMEOUT,
                                 "timed out after %.1f s waiting for rank 0 of %d, which "
                                 "creates %s", (double)c->timeout_ms / 1000.0,
                                 (int)c->size, path);
            return rdv_error(c, what, DT_ERR_TIMEOUT,
                             "timed out after %.1f s trying to join %s: found it "
                             "abandoned by an earlier job each time, yet it is still "
                             "there (remove it: rm %s)",
                             (double)c->timeout_ms / 1000.0, path, path);
        }
        /* rank 0 may take a while to start: poll gently after 100 ms */
        sleep_ms(spent < 100000000ull ? 1 : 10);
    }
    int rc = wait_for_peers(c, what, t0, limit);
    if (rc == DT_OK)
        seg_complete(c);
    return rc;
}
