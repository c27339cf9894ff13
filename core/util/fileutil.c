/*
 * core/util/fileutil.c - atomic file writes (temp + fsync + rename), a few
 * filesystem helpers, CRC-32, and (DTRAIN_TEST_HOOKS builds only) the
 * ENOSPC fault hooks tests use.
 */
#include "util/fileutil.h"

#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

int dt_fileutil_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dt_err_set(DT_ERR_IO, "opening directory '%s': %s", dir,
                          strerror(errno));
    int rc = DT_OK;
    if (fault_fsync_fails()) {
        rc = dt_err_set(DT_ERR_IO, "syncing directory '%s': %s", dir,
                        strerror(ENOSPC));
    } else if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
        /* EINVAL: the filesystem cannot sync directories; nothing to do */
        rc = dt_err_set(DT_ERR_IO, "syncing directory '%s': %s", dir,
                        strerror(errno));
    }
    close(fd);
    return rc;
}

/* The directory part of `path` ("." when none) into out[cap]. */
static void dir_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(out, cap, ".");
    } else if (slash == path) {
        snprintf(out, cap, "/");
    } else {
        size_t n = (size_t)(slash - path);
        if (n >= cap)
            n = cap - 1;
        memcpy(out, path, n);
        out[n] = '\0';
    }
}

/* ---- the atomic writer ----------------------------------------------- */

/* Small writes (headers, manifests) are coalesced; large ones go straight
 * through so streaming a multi-GB shard costs no extra copy. */
#define AFILE_BUF (1u << 20)

struct dt_afile {
    int fd;
    uint64_t offset;  /* bytes accepted so far */
    size_t buf_used;
    char *path;
    char *tmp;
    char *buf;        /* AFILE_BUF bytes */
};

int dt_afile_open(const char *path, dt_afile_t **out)
{
    *out = NULL;
    dt_afile_t *f = calloc(1, sizeof *f);
    size_t tn = strlen(path) + 32;
    if (f) {
        f->path = strdup(path);
        f->tmp = malloc(tn);
        f->buf = malloc(AFILE_BUF);
    }
    if (!f || !f->path || !f->tmp || !f->buf) {
        if (f) {
            free(f->path);
            free(f->tmp);
            free(f->buf);
            free(f);
        }
        return dt_err_set(DT_ERR_NOMEM, "writing '%s': out of memory", path);
    }
    snprintf(f->tmp, tn, "%s.tmp.%ld", path, (long)getpid());
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        int e = errno;
        free(f->path);
        free(f->tmp);
        free(f->buf);
        free(f);
        return dt_err_set(DT_ERR_IO, "writing '%s': %s", path, strerror(e));
    }
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

static void afile_free(dt_afile_t *f)
{
    free(f->path);
    free(f->tmp);
    free(f->buf);
    free(f);
}

void dt_afile_abort(dt_afile_t *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    unlink(f->tmp);
    afile_free(f);
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
    if (!rc && rename(f->tmp, f->path) != 0)
        rc = dt_err_set(DT_ERR_IO, "writing '%s': rename from '%s': %s",
                        f->path, f->tmp, strerror(errno));
    if (rc) {
        dt_afile_abort(f);
        return rc;
    }
    char dir[PATH_MAX];
    dir_of(f->path, dir, sizeof dir);
    afile_free(f);
    /* The new file is in place; a failed directory sync only means the
     * rename might not survive a power cut, which the caller must hear. */
    return dt_fileutil_fsync_dir(dir);
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

int dt_fileutil_read_all(const char *path, char **buf, size_t *n)
{
    *buf = NULL;
    *n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return dt_err_set(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                          "reading '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dt_err_set(DT_ERR_IO, "reading '%s': %s", path, strerror(e));
    }
    size_t size = (size_t)st.st_size;
    char *b = malloc(size + 1);
    if (!b) {
        close(fd);
        return dt_err_set(DT_ERR_NOMEM, "reading '%s': out of memory (%zu bytes)",
                          path, size);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, b + got, size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            free(b);
            close(fd);
            if (e)
                return dt_err_set(DT_ERR_IO, "reading '%s': %s", path, strerror(e));
            return dt_err_set(DT_ERR_IO, "reading '%s': file shrank from %zu to "
                              "%zu bytes while reading", path, size, got);
        }
        got += (size_t)r;
    }
    close(fd);
    b[size] = '\0';
    *buf = b;
    *n = size;
    return DT_OK;
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
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
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

static int rm_one(const char *p, const struct stat *st, int flag,
                  struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(p) != 0 && errno != ENOENT ? -1 : 0;
}

int dt_fileutil_rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? DT_OK
                               : dt_err_set(DT_ERR_IO, "removing '%s': %s",
                                            path, strerror(errno));
    if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return dt_err_set(DT_ERR_IO, "removing '%s': %s", path,
                          strerror(errno));
    return DT_OK;
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
