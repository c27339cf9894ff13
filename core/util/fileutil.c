/*
 * core/util/fileutil.c - atomic file writes (temp + fsync + rename), the
 * registry of temp paths removed on SIGINT/SIGTERM, a few filesystem
 * helpers, CRC-32, and (DTRAIN_TEST_HOOKS builds only) the ENOSPC fault
 * hooks tests use.
 */
#include "util/fileutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "util/error.h"

/* ---- fault injection ------------------------------------------------- */
#ifdef DTRAIN_TEST_HOOKS

/* Budgets left before writes / fsyncs fail with ENOSPC; -1 = disarmed.
 * The environment is read once, lazily, so tests can also set it from a
 * shell around the CLI. */
static _Atomic int64_t fault_write_left = -1;
static _Atomic int64_t fault_fsync_left = -1;
static atomic_flag fault_env_read = ATOMIC_FLAG_INIT;

static void fault_read_env(void)
{
    if (atomic_flag_test_and_set(&fault_env_read))
        return;
    const char *w = getenv("DTRAIN_FAULT_WRITE_AFTER_BYTES");
    if (w && *w)
        atomic_store(&fault_write_left, strtoll(w, NULL, 10));
    const char *s = getenv("DTRAIN_FAULT_FSYNC_AFTER");
    if (s && *s)
        atomic_store(&fault_fsync_left, strtoll(s, NULL, 10));
}

void dt_fileutil_test_fail_after(int64_t bytes)
{
    atomic_flag_test_and_set(&fault_env_read); /* the explicit call wins */
    atomic_store(&fault_write_left, bytes < 0 ? -1 : bytes);
}

void dt_fileutil_test_fail_fsync_after(int64_t n_fsyncs)
{
    atomic_flag_test_and_set(&fault_env_read);
    atomic_store(&fault_fsync_left, n_fsyncs < 0 ? -1 : n_fsyncs);
}

/* How many of `n` bytes the hook lets through (n when disarmed). */
static size_t fault_take_bytes(size_t n)
{
    fault_read_env();
    int64_t left = atomic_load(&fault_write_left);
    for (;;) {
        if (left < 0)
            return n;
        int64_t take = (uint64_t)left < n ? left : (int64_t)n;
        if (atomic_compare_exchange_weak(&fault_write_left, &left, left - take))
            return (size_t)take;
    }
}

/* DTRAIN_FAULT_STOP_ON_FULL=1: instead of failing, the process stops itself
 * (SIGSTOP) where the disk would have filled, so a test can SIGKILL it from
 * outside at a known point in the middle of a write: a crash, not an
 * error path.  Never set outside tests. */
static void fault_stop_here(void)
{
    const char *v = getenv("DTRAIN_FAULT_STOP_ON_FULL");
    if (v && strcmp(v, "1") == 0)
        raise(SIGSTOP);
}

static int fault_fsync_fails(void)
{
    fault_read_env();
    int64_t left = atomic_load(&fault_fsync_left);
    for (;;) {
        if (left < 0)
            return 0;
        if (left == 0)
            return 1;
        if (atomic_compare_exchange_weak(&fault_fsync_left, &left, left - 1))
            return 0;
    }
}
#else /* no hooks: every byte and every fsync goes through */
static size_t fault_take_bytes(size_t n) { return n; }
static void fault_stop_here(void) {}
static int fault_fsync_fails(void) { return 0; }
#endif

/* ---- temp paths removed on a signal ----------------------------------- */

/* A slot is FREE, being FILLED by dt_cleanup_add (the handler skips it),
 * or ARMED (the handler removes its path).  Only lock-free atomics and
 * system calls are touched from the handler. */
enum { SLOT_FREE, SLOT_FILLING, SLOT_ARMED };

static struct cleanup_slot {
    _Atomic int state;
    int kind; /* DT_CLEANUP_* */
    char path[PATH_MAX];
} cleanup_slots[DT_CLEANUP_MAX];
static atomic_flag cleanup_installed = ATOMIC_FLAG_INIT;
static const int cleanup_signals[] = {SIGINT, SIGTERM};

/* The entries of directory `path`, then the directory itself; one level
 * (what dtrain puts in a temp directory are files), links removed as
 * links.  Async-signal-safe: getdents64 into a stack buffer, no stdio, no
 * malloc.  A few passes, for entries a peer process adds meanwhile. */
static void cleanup_remove_dir(const char *path)
{
    for (int pass = 0; pass < 4; pass++) {
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            return;
        char buf[4096];
        ssize_t n;
        while ((n = getdents64(fd, buf, sizeof buf)) > 0) {
            for (ssize_t off = 0; off < n;) {
                struct dirent64 *de = (struct dirent64 *)(void *)(buf + off);
                off += de->d_reclen;
                if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
                    unlinkat(fd, de->d_name, 0);
            }
        }
        close(fd);
        if (rmdir(path) == 0 || errno != ENOTEMPTY)
            return;
    }
}

static void cleanup_on_signal(int sig)
{
    int saved = errno;
    /* files and trees first, then the empty folders that held them */
    for (int i = 0; i < DT_CLEANUP_MAX; i++) {
        struct cleanup_slot *s = &cleanup_slots[i];
        if (atomic_load(&s->state) != SLOT_ARMED)
            continue;
        if (s->kind == DT_CLEANUP_TREE)
            cleanup_remove_dir(s->path);
        else if (s->kind == DT_CLEANUP_FILE)
            unlink(s->path);
    }
    /* a folder is empty only once the ones inside it are gone: passes
     * until one removes nothing (registration order says nothing) */
    for (int pass = 0, removed = 1; removed && pass < DT_CLEANUP_MAX; pass++) {
        removed = 0;
        for (int i = 0; i < DT_CLEANUP_MAX; i++) {
            struct cleanup_slot *s = &cleanup_slots[i];
            if (atomic_load(&s->state) == SLOT_ARMED && s->kind == DT_CLEANUP_EMPTY_DIR &&
                rmdir(s->path) == 0)
                removed = 1;
        }
    }
    /* die of the signal, as without this handler, so the exit status
     * says which one */
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    errno = saved;
}

/* Once per process: the handler for SIGINT and SIGTERM, only where the
 * signal has its default action (a program's own handler, or a signal it
 * ignores, is left as it is). */
static void cleanup_install(void)
{
    if (atomic_flag_test_and_set(&cleanup_installed))
        return;
    for (size_t i = 0; i < sizeof cleanup_signals / sizeof *cleanup_signals; i++) {
        struct sigaction old, sa;
        if (sigaction(cleanup_signals[i], NULL, &old) != 0 ||
            (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = cleanup_on_signal;
        sigfillset(&sa.sa_mask); /* one handler run at a time */
        sigaction(cleanup_signals[i], &sa, NULL);
    }
}

int dt_cleanup_add(const char *path, int kind)
{
    size_t n = path ? strlen(path) : 0;
    if (n == 0 || n >= PATH_MAX ||
        (kind != DT_CLEANUP_FILE && kind != DT_CLEANUP_TREE && kind != DT_CLEANUP_EMPTY_DIR))
        return DT_ERR_INVALID;
    cleanup_install();
    for (int i = 0; i < DT_CLEANUP_MAX; i++) {
        int want = SLOT_FREE;
        if (!atomic_compare_exchange_strong(&cleanup_slots[i].state, &want, SLOT_FILLING))
            continue;
        memcpy(cleanup_slots[i].path, path, n + 1);
        cleanup_slots[i].kind = kind;
        atomic_store(&cleanup_slots[i].state, SLOT_ARMED);
        return DT_OK;
    }
    return DT_ERR_NOMEM;
}

void dt_cleanup_remove(const char *path)
{
    if (!path)
        return;
    for (int i = 0; i < DT_CLEANUP_MAX; i++) {
        struct cleanup_slot *s = &cleanup_slots[i];
        int want = SLOT_ARMED;
        if (atomic_load(&s->state) != SLOT_ARMED || strcmp(s->path, path) != 0 ||
            !atomic_compare_exchange_strong(&s->state, &want, SLOT_FILLING))
            continue;
        atomic_store(&s->state, SLOT_FREE);
        return;
    }
}

/* ---- low-level ------------------------------------------------------- */

int dt_fileutil_write_fd(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        size_t allowed = fault_take_bytes(n);
        if (allowed == 0) {
            fault_stop_here();
            errno = ENOSPC;
            return -1;
        }
        ssize_t w = write(fd, p, allowed);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (w == 0) { /* no progress and no errno: treat as a full device */
            errno = ENOSPC;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int dt_fileutil_fsync_fd(int fd, const char *what)
{
    if (fault_fsync_fails())
        return dt_err_set(DT_ERR_IO, "writing '%s': fsync: %s", what,
                          strerror(ENOSPC));
    while (fsync(fd) != 0) {
        if (errno == EINTR)
            continue;
        return dt_err_set(DT_ERR_IO, "writing '%s': fsync: %s", what,
                          strerror(errno));
    }
    return DT_OK;
}

/* fsync an open directory, through the fault hook; `dir` names it. */
static int fsync_dirfd(int fd, const char *dir)
{
    if (fault_fsync_fails())
        return dt_err_set(DT_ERR_IO, "syncing directory '%s': %s", dir,
                          strerror(ENOSPC));
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS)
        /* EINVAL: the filesystem cannot sync directories; nothing to do */
        return dt_err_set(DT_ERR_IO, "syncing directory '%s': %s", dir,
                          strerror(errno));
    return DT_OK;
}

int dt_fileutil_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dt_err_set(DT_ERR_IO, "opening directory '%s': %s", dir,
                          strerror(errno));
    int rc = fsync_dirfd(fd, dir);
    close(fd);
    return rc;
}

/* Split `path` into its directory ("." when none) and its last component
 * (trailing slashes dropped), into dir[cap] and base[cap].  DT_ERR_INVALID
 * naming `path` when either does not fit or there is no last component. */
static int split_path(const char *path, char *dir, char *base, size_t cap)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/')
        b--;
    size_t dn = b == 0 ? 0 : (b == 1 ? 1 : b - 1); /* "/x" keeps its "/" */
    if (n - b == 0 || n - b >= cap || dn >= cap)
        return dt_err_set(DT_ERR_INVALID, "path '%s': no file name, or too "
                          "long", path);
    memcpy(base, path + b, n - b);
    base[n - b] = '\0';
    if (dn == 0) {
        snprintf(dir, cap, ".");
    } else {
        memcpy(dir, path, dn);
        dir[dn] = '\0';
    }
    return DT_OK;
}

/* ---- what an output may replace --------------------------------------- */

const char *dt_fileutil_file_type(unsigned m)
{
    return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory"
         : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : S_ISSOCK(m) ? "a socket" : S_ISLNK(m) ? "a symbolic link"
         : S_ISREG(m) ? "a regular file" : "of an unknown type";
}

/* Entry `name` of directory `dirfd` (AT_FDCWD: a path), never following a
 * link: nothing (*exists = 0) or a regular file (1) may be replaced;
 * anything else is refused, the message prefixed "<what>: ". */
static int check_target(int dirfd, const char *name, const char *what, int *exists)
{
    struct stat st;
    *exists = 0;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? DT_OK
                               : dt_err_set(DT_ERR_IO, "%s: %s", what, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return dt_err_set(DT_ERR_IO, "%s: not a regular file (%s): only a regular file is "
                          "replaced", what, dt_fileutil_file_type(st.st_mode));
    *exists = 1;
    return DT_OK;
}

/* "writing '<path>'" into what[cap], for messages. */
static const char *writing(char *what, size_t cap, const char *path)
{
    snprintf(what, cap, "writing '%s'", path);
    return what;
}

int dt_fileutil_check_output(const char *path, int *exists)
{
    char what[PATH_MAX + 16];
    int e;
    return check_target(AT_FDCWD, path, writing(what, sizeof what, path),
                        exists ? exists : &e);
}

int dt_fileutil_open_output(const char *path, int flags, const char *what, int *fd)
{
    *fd = -1;
    int exists, rc = check_target(AT_FDCWD, path, what, &exists);
    if (rc)
        return rc;
    /* O_NONBLOCK: a FIFO or a device put there since the check neither
     * blocks the open nor is written (fstat below); O_NOFOLLOW: nor a
     * link.  Not O_TRUNC: only a file known to be regular is truncated. */
    int f = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC |
                 ((flags & DT_FILEUTIL_APPEND) ? O_APPEND : 0), DT_FILEUTIL_FILE_MODE);
    if (f < 0) { /* ELOOP: a link swapped in; ENXIO: a FIFO without a reader */
        int e = errno;
        if (e == ELOOP || e == ENXIO)
            return dt_err_set(DT_ERR_IO, "%s: not a regular file (%s): only a regular file "
                              "is replaced", what, e == ELOOP ? "a symbolic link" : "a FIFO");
        return dt_err_set(DT_ERR_IO, "%s: %s", what, strerror(e));
    }
    struct stat st;
    int of;
    if (fstat(f, &st) != 0)
        rc = dt_err_set(DT_ERR_IO, "%s: %s", what, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = dt_err_set(DT_ERR_IO, "%s: not a regular file (%s): only a regular file is "
                        "replaced", what, dt_fileutil_file_type(st.st_mode));
    else if (!(flags & DT_FILEUTIL_APPEND) && ftruncate(f, 0) != 0)
        rc = dt_err_set(DT_ERR_IO, "%s: %s", what, strerror(errno));
    else if ((of = fcntl(f, F_GETFL)) < 0 || fcntl(f, F_SETFL, of & ~O_NONBLOCK) != 0)
        rc = dt_err_set(DT_ERR_IO, "%s: %s", what, strerror(errno));
    if (rc) {
        close(f);
        return rc;
    }
    *fd = f;
    return DT_OK;
}

/* ---- the atomic writer ----------------------------------------------- */

/* Small writes (headers, manifests) are coalesced; large ones go straight
 * through so streaming a multi-GB shard costs no extra copy. */
#define AFILE_BUF (1u << 20)
/* Names drawn before giving up: a collision means someone is planting
 * files at our random names, which 48 random bits make hopeless. */
#define AFILE_TRIES 64

struct dt_afile {
    int fd;
    int dirfd;        /* the target's directory, held open until the end */
    uint64_t offset;  /* bytes accepted so far */
    size_t buf_used;
    char *path;       /* the target, as given (for messages) */
    char *base;       /* its name inside dirfd */
    char *tmp_base;   /* the temp file's name inside dirfd */
    char *tmp;        /* the temp file's path (for messages) */
    char *buf;        /* AFILE_BUF bytes */
};

static void afile_free(dt_afile_t *f)
{
    if (f->dirfd >= 0)
        close(f->dirfd);
    free(f->path);
    free(f->base);
    free(f->tmp_base);
    free(f->tmp);
    free(f->buf);
    free(f);
}

/* 48 unpredictable bits as 12 hex digits: getrandom, or (no entropy
 * source) time and address bits: unpredictability is a second line of
 * defence, O_EXCL | O_NOFOLLOW is the first. */
static void random_suffix(char out[13])
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        r = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^
            (uint64_t)(uintptr_t)out ^ ((uint64_t)getpid() << 40);
    }
    snprintf(out, 13, "%012llx", (unsigned long long)(r & 0xffffffffffffull));
}

int dt_afile_open(const char *path, dt_afile_t **out)
{
    *out = NULL;
    char dir[PATH_MAX], base[PATH_MAX];
    int rc = split_path(path, dir, base, sizeof dir);
    if (rc)
        return dt_err_context(rc, "writing '%s'", path);
    dt_afile_t *f = calloc(1, sizeof *f);
    size_t tn = strlen(path) + 32;
    if (f) {
        f->fd = -1;
        f->dirfd = -1;
        f->path = strdup(path);
        f->base = strdup(base);
        f->tmp_base = malloc(strlen(base) + 32);
        f->tmp = malloc(tn);
        f->buf = malloc(AFILE_BUF);
    }
    if (!f || !f->path || !f->base || !f->tmp_base || !f->tmp || !f->buf) {
        if (f)
            afile_free(f);
        return dt_err_set(DT_ERR_NOMEM, "writing '%s': out of memory", path);
    }
    f->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (f->dirfd < 0) {
        int e = errno;
        afile_free(f);
        if (e == ENOENT)
            return dt_err_set(DT_ERR_IO, "writing '%s': the folder '%s' does not exist",
                              path, dir);
        return dt_err_set(DT_ERR_IO, "writing '%s': %s", path, strerror(e));
    }
    char what[PATH_MAX + 16];
    int exists; /* refused before a byte is written: the export may be long */
    if ((rc = check_target(f->dirfd, f->base, writing(what, sizeof what, path), &exists))) {
        afile_free(f);
        return rc;
    }
    int e = EEXIST;
    for (int i = 0; f->fd < 0 && e == EEXIST && i < AFILE_TRIES; i++) {
        char sfx[13];
        random_suffix(sfx);
        snprintf(f->tmp_base, strlen(base) + 32, "%s.tmp.%s", base, sfx);
        /* O_EXCL: never an existing file, and (with O_CREAT) never through
         * a link; O_NOFOLLOW says the same to a reader of this line.  The
         * final mode (the umask applies), so nobody sees more of the temp
         * file than of the finished one. */
        f->fd = openat(f->dirfd, f->tmp_base, O_WRONLY | O_CREAT | O_EXCL |
                       O_NOFOLLOW | O_CLOEXEC, DT_FILEUTIL_FILE_MODE);
        e = errno;
    }
    if (f->fd < 0) {
        afile_free(f);
        return dt_err_set(DT_ERR_IO, "writing '%s': %s", path, strerror(e));
    }
    snprintf(f->tmp, tn, "%s%s%s", strcmp(dir, ".") == 0 ? "" : dir,
             strcmp(dir, ".") == 0 || strcmp(dir, "/") == 0 ? "" : "/",
             f->tmp_base);
    dt_cleanup_add(f->tmp, DT_CLEANUP_FILE);
    *out = f;
    return DT_OK;
}

static int afile_flush(dt_afile_t *f)
{
    if (f->buf_used == 0)
        return DT_OK;
    if (dt_fileutil_write_fd(f->fd, f->buf, f->buf_used) != 0)
        return dt_err_set(DT_ERR_IO, "writing '%s': %s", f->path,
                          strerror(errno));
    f->buf_used = 0;
    return DT_OK;
}

int dt_afile_write(dt_afile_t *f, const void *buf, size_t n)
{
    if (n == 0)
        return DT_OK;
    if (f->buf_used + n <= AFILE_BUF) {
        memcpy(f->buf + f->buf_used, buf, n);
        f->buf_used += n;
        f->offset += n;
        return DT_OK;
    }
    int rc = afile_flush(f);
    if (rc)
        return rc;
    if (n < AFILE_BUF / 2) {
        memcpy(f->buf, buf, n);
        f->buf_used = n;
    } else if (dt_fileutil_write_fd(f->fd, buf, n) != 0) {
        return dt_err_set(DT_ERR_IO, "writing '%s': %s", f->path,
                          strerror(errno));
    }
    f->offset += n;
    return DT_OK;
}

uint64_t dt_afile_offset(const dt_afile_t *f) { return f->offset; }

void dt_afile_abort(dt_afile_t *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    unlinkat(f->dirfd, f->tmp_base, 0);
    dt_cleanup_remove(f->tmp);
    afile_free(f);
}

/* The temp file renamed over the target, which must still be nothing or
 * a regular file (the check at open was long ago: a big export takes
 * minutes).  Nothing there: RENAME_NOREPLACE, so whatever appears in
 * between is looked at again rather than replaced.  (A regular file
 * swapped for something else between the look and the rename is beyond
 * reach: whoever can do that owns the folder's entries anyway.) */
static int afile_rename(dt_afile_t *f)
{
    char what[PATH_MAX + 16];
    writing(what, sizeof what, f->path);
    for (int tries = 0; tries < 4; tries++) {
        int exists, rc = check_target(f->dirfd, f->base, what, &exists);
        if (rc)
            return rc;
        if (!exists) {
            if (renameat2(f->dirfd, f->tmp_base, f->dirfd, f->base, RENAME_NOREPLACE) == 0)
                return DT_OK;
            if (errno == EEXIST)
                continue; /* something appeared: look at it */
            if (errno != EINVAL && errno != ENOSYS)
                break;
            /* a filesystem without RENAME_NOREPLACE: a plain rename */
        }
        if (renameat(f->dirfd, f->tmp_base, f->dirfd, f->base) == 0)
            return DT_OK;
        break;
    }
    return dt_err_set(DT_ERR_IO, "writing '%s': rename from '%s': %s", f->path, f->tmp,
                      strerror(errno));
}

int dt_afile_commit(dt_afile_t *f)
{
    int rc = afile_flush(f);
    if (!rc)
        rc = dt_fileutil_fsync_fd(f->fd, f->path);
    if (!rc) {
        int fd = f->fd;
        f->fd = -1;
        if (close(fd) != 0) /* NFS may report a deferred write error here */
            rc = dt_err_set(DT_ERR_IO, "writing '%s': %s", f->path,
                            strerror(errno));
    }
    if (!rc)
        rc = afile_rename(f);
    if (rc) {
        dt_afile_abort(f);
        return rc;
    }
    dt_cleanup_remove(f->tmp); /* renamed: nothing left at the temp name */
    /* The new file is in place; a failed directory sync only means the
     * rename might not survive a power cut, which the caller must hear. */
    char dir[PATH_MAX], base[PATH_MAX];
    rc = split_path(f->path, dir, base, sizeof dir);
    if (!rc)
        rc = fsync_dirfd(f->dirfd, dir);
    afile_free(f);
    return rc;
}

int dt_fileutil_write_atomic(const char *path, const void *buf, size_t n)
{
    dt_afile_t *f;
    int rc = dt_afile_open(path, &f);
    if (rc)
        return rc;
    rc = dt_afile_write(f, buf, n);
    if (rc) {
        dt_afile_abort(f);
        return rc;
    }
    return dt_afile_commit(f);
}

/* ---- reading inputs -------------------------------------------------- */

int dt_fileutil_open_input(const char *path, int flags, const char *what,
                           int *fd, uint64_t *size)
{
    *fd = -1;
    int of = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
    if (flags & DT_FILEUTIL_NOFOLLOW)
        of |= O_NOFOLLOW;
    int f = open(path, of);
    if (f < 0) {
        int e = errno;
        if (e == ELOOP && (flags & DT_FILEUTIL_NOFOLLOW))
            return dt_err_set(DT_ERR_IO, "%s: a symbolic link, refused", what);
        return dt_err_set(e == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO, "%s: %s",
                          what, strerror(e));
    }
    struct stat st;
    int rc = DT_OK;
    if (fstat(f, &st) != 0)
        rc = dt_err_set(DT_ERR_IO, "%s: %s", what, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        rc = dt_err_set(DT_ERR_IO, "%s: not a regular file (%s)", what,
                        dt_fileutil_file_type(st.st_mode));
    else if ((of = fcntl(f, F_GETFL)) < 0 ||
             fcntl(f, F_SETFL, of & ~O_NONBLOCK) != 0)
        rc = dt_err_set(DT_ERR_IO, "%s: %s", what, strerror(errno));
    if (rc) {
        close(f);
        return rc;
    }
    *fd = f;
    if (size)
        *size = (uint64_t)st.st_size;
    return DT_OK;
}

int dt_fileutil_read_fd(int fd, uint64_t size, uint64_t max, const char *what,
                        char **buf, size_t *n)
{
    *buf = NULL;
    *n = 0;
    if (size > max || size >= SIZE_MAX)
        return dt_err_set(DT_ERR_DATA, "%s: %llu bytes, more than the %llu "
                          "expected", what, (unsigned long long)size,
                          (unsigned long long)max);
    char *b = malloc((size_t)size + 1);
    if (!b)
        return dt_err_set(DT_ERR_NOMEM, "%s: out of memory (%llu bytes)", what,
                          (unsigned long long)size);
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, b + got, (size_t)size - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            free(b);
            if (e)
                return dt_err_set(DT_ERR_IO, "%s: %s", what, strerror(e));
            return dt_err_set(DT_ERR_IO, "%s: file shrank from %llu to %zu "
                              "bytes while reading", what,
                              (unsigned long long)size, got);
        }
        got += (size_t)r;
    }
    b[size] = '\0';
    *buf = b;
    *n = (size_t)size;
    return DT_OK;
}

int dt_fileutil_read_all(const char *path, char **buf, size_t *n)
{
    *buf = NULL;
    *n = 0;
    char what[PATH_MAX + 16];
    snprintf(what, sizeof what, "reading '%s'", path);
    int fd;
    uint64_t size;
    int rc = dt_fileutil_open_input(path, 0, what, &fd, &size);
    if (rc)
        return rc;
    rc = dt_fileutil_read_fd(fd, size, UINT64_MAX, what, buf, n);
    close(fd);
    return rc;
}

/* ---- directories ----------------------------------------------------- */

int dt_fileutil_mkdir_p(const char *path)
{
    char p[PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof p)
        return dt_err_set(DT_ERR_INVALID, "creating directory '%s': bad path",
                          path);
    memcpy(p, path, n + 1);
    /* Create each prefix in turn; EEXIST on a prefix is the common case. */
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char saved = p[i];
        p[i] = '\0';
        if (mkdir(p, DT_FILEUTIL_DIR_MODE) != 0 && errno != EEXIST) {
            int e = errno;
            return dt_err_set(DT_ERR_IO, "creating directory '%s': %s", p,
                              strerror(e));
        }
        p[i] = saved;
    }
    struct stat st;
    if (stat(path, &st) != 0)
        return dt_err_set(DT_ERR_IO, "creating directory '%s': %s", path,
                          strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dt_err_set(DT_ERR_IO, "creating directory '%s': %s", path,
                          strerror(ENOTDIR));
    return DT_OK;
}

int dt_fileutil_mkdir_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    while (slash && slash > path && slash[-1] == '/')
        slash--; /* "a//b": the folder is "a" */
    if (!slash || slash == path) /* a bare name, or one in "/" */
        return DT_OK;
    char dir[PATH_MAX];
    if ((size_t)(slash - path) >= sizeof dir)
        return dt_err_set(DT_ERR_INVALID, "writing '%s': path too long", path);
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = '\0';
    return dt_fileutil_mkdir_p(dir);
}

/* Deeper trees than this are refused (ELOOP) rather than walked: what
 * dtrain removes is two or three levels deep, and each level holds one
 * descriptor. */
#define RM_MAX_DEPTH 32

/* Remove entry `name` of the open directory `parent`, never following a
 * link.  0, or -1 with errno set.  A missing entry is fine (something else
 * removed it first). */
static int rm_at(int parent, const char *name, int depth)
{
    struct stat st;
    if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode))
        return unlinkat(parent, name, 0) == 0 || errno == ENOENT ? 0 : -1;
    if (depth >= RM_MAX_DEPTH) {
        errno = ELOOP;
        return -1;
    }
    /* O_NOFOLLOW: if the directory was swapped for a link since fstatat,
     * the open fails instead of walking into someone else's tree. */
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                    O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -1;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    /* Entries removed while reading a directory may shift the ones not yet
     * read on some filesystems: read it again until it is empty (bounded;
     * each pass removes at least what it saw). */
    int rc = 0, e = 0;
    for (int pass = 0; pass < 4 && rc == 0; pass++) {
        int removed = 0;
        struct dirent *de;
        rewinddir(d);
        while (rc == 0 && (errno = 0, de = readdir(d))) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            rc = rm_at(dirfd(d), de->d_name, depth + 1);
            removed++;
        }
        if (rc == 0 && errno != 0)
            rc = -1;
        e = errno;
        if (rc || removed == 0)
            break;
    }
    closedir(d);
    if (rc) {
        errno = e;
        return -1;
    }
    return unlinkat(parent, name, AT_REMOVEDIR) == 0 || errno == ENOENT ? 0 : -1;
}

int dt_fileutil_rm_rf(const char *path)
{
    char dir[PATH_MAX], base[PATH_MAX];
    int rc = split_path(path, dir, base, sizeof dir);
    if (rc)
        return dt_err_context(rc, "removing '%s'", path);
    if (strcmp(base, ".") == 0 || strcmp(base, "..") == 0 || strcmp(base, "/") == 0)
        return dt_err_set(DT_ERR_INVALID, "removing '%s': refusing to remove "
                          "'%s'", path, base);
    int parent = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent < 0)
        return errno == ENOENT ? DT_OK
                               : dt_err_set(DT_ERR_IO, "removing '%s': %s",
                                            path, strerror(errno));
    if (rm_at(parent, base, 0) != 0)
        rc = dt_err_set(DT_ERR_IO, "removing '%s': %s", path, strerror(errno));
    close(parent);
    return rc;
}

/* ---- checksums ------------------------------------------------------- */

uint32_t dt_fileutil_crc32(uint32_t crc, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    /* zlib takes uInt lengths; feed huge buffers in pieces. */
    while (n > 0) {
        uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32((uLong)crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return crc;
}
