/*
 * core/ckpt/ckpt_dir.c - checkpoint directories under a root (ckpt_io.h):
 * step directory names, a save's tmp directory, its commit (COMPLETE
 * marker, then an atomic rename into place) or abort, and finding the
 * latest complete checkpoint, pruning old ones and cleaning up what
 * interrupted saves left (a save's tmp directory is also registered for
 * removal on SIGINT/SIGTERM), and one run per folder: its LOCK, and a
 * fresh run refused over (or, asked to, removing) existing checkpoints.  Nothing here follows a symbolic link: a step
 * name that is a link, a file or another user's directory is skipped with
 * a warning, and removal never reaches through a link.
 */
#include "ckpt/ckpt_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"
#include "util/fileutil.h"
#include "util/log.h"

int dt_ckpt_step_dir(const char *root, uint64_t step, int tmp, char *buf,
                     size_t cap)
{
    int n = snprintf(buf, cap, "%s/step-%08" PRIu64 "%s", root, step,
                     tmp ? ".tmp" : "");
    if (n < 0 || (size_t)n >= cap)
        return dt_err_set(DT_ERR_INVALID, "checkpoint path under '%s' is too "
                          "long", root);
    return DT_OK;
}

/* ---- begin / commit / abort ------------------------------------------ */

int dt_ckpt_begin(const char *root, uint64_t step, char *tmp_dir, size_t cap)
{
    int rc = dt_fileutil_mkdir_p(root);
    if (!rc)
        rc = dt_ckpt_step_dir(root, step, 1, tmp_dir, cap);
    if (!rc)
        rc = dt_fileutil_rm_rf(tmp_dir);
    if (!rc && mkdir(tmp_dir, DT_FILEUTIL_DIR_MODE) != 0)
        rc = dt_err_set(DT_ERR_IO, "creating directory '%s': %s", tmp_dir,
                        strerror(errno));
    if (!rc) /* removed on SIGINT/SIGTERM until commit or abort */
        dt_cleanup_add(tmp_dir, DT_CLEANUP_TREE);
    if (rc)
        return dt_err_context(rc, "saving checkpoint step %" PRIu64, step);
    return DT_OK;
}

/* The rename into place and the directory sync; commit without the
 * registry's bookkeeping. */
static int commit_dir(const char *root, uint64_t step)
{
    char tmp[PATH_MAX], fin[PATH_MAX], path[PATH_MAX];
    int rc = dt_ckpt_step_dir(root, step, 1, tmp, sizeof tmp);
    if (!rc)
        rc = dt_ckpt_step_dir(root, step, 0, fin, sizeof fin);
    if (!rc)
        rc = dt_ckpt_join(path, sizeof path, tmp, MANIFEST);
    if (rc)
        return rc;
    /* The marker vouches for the manifest as it is on disk. */
    char *text;
    size_t len;
    rc = dt_fileutil_read_all(path, &text, &len);
    if (rc == DT_ERR_NOT_FOUND)
        return dt_err_set(DT_ERR_INVALID, "checkpoint '%s': commit without a "
                          "manifest", tmp);
    if (rc)
        return rc;
    char marker[sizeof MARKER_LINE + 64];
    int mn = snprintf(marker, sizeof marker, MARKER_LINE MARKER_SUM_FMT,
                      (unsigned long long)len,
                      (unsigned)dt_fileutil_crc32(0, text, len));
    free(text);
    rc = dt_ckpt_join(path, sizeof path, tmp, MARKER);
    if (!rc)
        rc = dt_fileutil_write_atomic(path, marker, (size_t)mn);
    if (rc)
        return rc;
    /* Shards were fsynced by their writers; the directory's own entries
     * (file names) were synced by each atomic write's directory fsync. */
    if (rename(tmp, fin) != 0) {
        if (errno != ENOTEMPTY && errno != EEXIST)
            return dt_err_set(DT_ERR_IO, "checkpoint '%s': renaming from "
                              "'%s': %s", fin, tmp, strerror(errno));
        /* The step was saved before (a resumed run saving it again): swap
         * atomically so the step directory always holds a complete
         * checkpoint, then drop the old one, which now sits at tmp. */
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, fin, RENAME_EXCHANGE) != 0) {
            /* No RENAME_EXCHANGE on this filesystem: move the old aside.
             * A crash in between leaves no step dir, but the aside copy and
             * the tmp dir both survive for manual recovery. */
            char old[PATH_MAX + 8];
            snprintf(old, sizeof old, "%s.old", fin);
            if (dt_fileutil_rm_rf(old) || rename(fin, old) != 0 ||
                rename(tmp, fin) != 0)
                return dt_err_set(DT_ERR_IO, "checkpoint '%s': replacing the "
                                  "earlier save of this step: %s", fin,
                                  strerror(errno));
            rc = dt_fileutil_fsync_dir(root);
            int rm = dt_fileutil_rm_rf(old);
            return rc ? rc : rm;
        }
        rc = dt_fileutil_fsync_dir(root);
        int rm = dt_fileutil_rm_rf(tmp);
        return rc ? rc : rm;
    }
    return dt_fileutil_fsync_dir(root);
}

int dt_ckpt_commit(const char *root, uint64_t step)
{
    int rc = commit_dir(root, step);
    char tmp[PATH_MAX];
    /* committed: the temp name is gone (or holds the replaced earlier
     * save, already removed); failed: the caller aborts, which removes
     * it.  Either way the registry no longer needs it. */
    if (dt_ckpt_step_dir(root, step, 1, tmp, sizeof tmp) == DT_OK && !rc)
        dt_cleanup_remove(tmp);
    return rc;
}

int dt_ckpt_abort(const char *root, uint64_t step)
{
    char tmp[PATH_MAX];
    int rc = dt_ckpt_step_dir(root, step, 1, tmp, sizeof tmp);
    if (!rc)
        rc = dt_fileutil_rm_rf(tmp);
    if (!rc)
        dt_cleanup_remove(tmp);
    return rc;
}

int dt_ckpt_abort_shard(const char *root, uint64_t step, uint32_t shard)
{
    char tmp[PATH_MAX], name[64], path[PATH_MAX];
    int rc = dt_ckpt_step_dir(root, step, 1, tmp, sizeof tmp);
    dt_ckpt_shard_name(shard, name, sizeof name);
    if (!rc)
        rc = dt_ckpt_join(path, sizeof path, tmp, name);
    if (rc)
        return rc;
    if (unlink(path) != 0 && errno != ENOENT)
        return dt_err_set(DT_ERR_IO, "removing '%s': %s", path, strerror(errno));
    /* rank 0 removes the rest; a peer's shard still there keeps it */
    if (rmdir(tmp) != 0 && errno != ENOENT && errno != ENOTEMPTY && errno != EEXIST)
        return dt_err_set(DT_ERR_IO, "removing '%s': %s", tmp, strerror(errno));
    return DT_OK;
}

/* ---- finding and pruning --------------------------------------------- */

/* "step-" then at least 8 digits and nothing else. */
static int parse_step_name(const char *name, uint64_t *step)
{
    if (strncmp(name, "step-", 5) != 0)
        return 0;
    const char *p = name + 5;
    size_t nd = strspn(p, "0123456789");
    if (nd < 8 || nd > 19 || p[nd] != '\0')
        return 0;
    *step = strtoull(p, NULL, 10);
    return 1;
}

/* A step entry of root's directory `dfd` that is a real directory owned by
 * this user, holding a COMPLETE file (links are not followed anywhere).
 * Anything else under a step name was not made by a save of ours: a link
 * to another run's checkpoint, a file, someone else's directory.  It is
 * never loaded or pruned, and said once per scan (incomplete directories
 * are normal, interrupted saves, and pass silently). */
static int step_is_ours_and_complete(int dfd, const char *root,
                                     const char *name)
{
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return 0;
    const char *why = NULL;
    char buf[96];
    if (S_ISLNK(st.st_mode)) {
        why = "a symbolic link, not a directory";
    } else if (!S_ISDIR(st.st_mode)) {
        why = "not a directory";
    } else if (st.st_uid != geteuid()) {
        snprintf(buf, sizeof buf, "owned by uid %u, not by this user (uid %u)",
                 (unsigned)st.st_uid, (unsigned)geteuid());
        why = buf;
    }
    if (why) {
        dt_log(DT_LOG_WARN, "ckpt", "warning: checkpoint folder '%s': "
               "ignoring '%s': %s", root, name, why);
        return 0;
    }
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int ok = fstatat(fd, MARKER, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
             S_ISREG(st.st_mode);
    close(fd);
    return ok;
}

/* Steps of complete checkpoints under root, malloc'd, unsorted. */
static int list_complete(const char *root, uint64_t **steps, size_t *n)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d)
        return dt_err_set(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                          "checkpoint folder '%s': %s", root, strerror(errno));
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t s;
        if (!parse_step_name(de->d_name, &s) ||
            !step_is_ours_and_complete(dirfd(d), root, de->d_name))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            uint64_t *ns = realloc(*steps, cap * sizeof *ns);
            if (!ns) {
                closedir(d);
                free(*steps);
                *steps = NULL;
                *n = 0;
                return dt_err_set(DT_ERR_NOMEM, "listing '%s': out of memory",
                                  root);
            }
            *steps = ns;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    return DT_OK;
}

int dt_ckpt_latest(const char *root, char *dir, size_t cap, uint64_t *step)
{
    uint64_t *steps;
    size_t n;
    int rc = list_complete(root, &steps, &n);
    if (rc == DT_ERR_NOT_FOUND || (!rc && n == 0)) {
        free(steps);
        return dt_err_set(DT_ERR_NOT_FOUND, "no complete checkpoint in '%s'",
                          root);
    }
    if (rc)
        return rc;
    uint64_t best = steps[0];
    for (size_t i = 1; i < n; i++)
        best = steps[i] > best ? steps[i] : best;
    free(steps);
    if (step)
        *step = best;
    return dt_ckpt_step_dir(root, best, 0, dir, cap);
}

int dt_ckpt_clean_stale(const char *root)
{
    DIR *d = opendir(root);
    if (!d)
        return errno == ENOENT ? DT_OK
                               : dt_err_set(DT_ERR_IO, "checkpoint folder "
                                            "'%s': %s", root, strerror(errno));
    int rc = DT_OK;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        const char *dot = strrchr(de->d_name, '.');
        uint64_t step;
        char base[256];
        if (!dot || (strcmp(dot, ".tmp") != 0 && strcmp(dot, ".old") != 0) ||
            (size_t)(dot - de->d_name) >= sizeof base)
            continue;
        memcpy(base, de->d_name, (size_t)(dot - de->d_name));
        base[dot - de->d_name] = '\0';
        if (!parse_step_name(base, &step))
            continue;
        char path[PATH_MAX];
        rc = dt_ckpt_join(path, sizeof path, root, de->d_name);
        if (!rc)
            rc = dt_fileutil_rm_rf(path);
    }
    closedir(d);
    return rc;
}

static int u64_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Remove complete checkpoint `step` of root.  The marker goes first: a
 * crash mid-delete then leaves an incomplete directory that is never
 * loaded, not a torn one.  The directory is opened without following a
 * link (list_complete skipped links; this closes the window since). */
static int remove_step(const char *root, uint64_t step)
{
    char dir[PATH_MAX];
    int rc = dt_ckpt_step_dir(root, step, 0, dir, sizeof dir);
    int fd = rc ? -1 : open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (!rc && fd < 0)
        rc = dt_err_set(DT_ERR_IO, "pruning '%s': %s", dir, strerror(errno));
    if (!rc && unlinkat(fd, MARKER, 0) != 0 && errno != ENOENT)
        rc = dt_err_set(DT_ERR_IO, "pruning '%s': %s", dir, strerror(errno));
    if (fd >= 0)
        close(fd);
    return rc ? rc : dt_fileutil_rm_rf(dir);
}

/* Remove all but the `keep` newest complete checkpoints (keep may be 0),
 * and never step `spare` (UINT64_MAX: none); *removed (may be NULL)
 * counts what went. */
static int remove_beyond_sparing(const char *root, uint32_t keep, uint64_t spare,
                                 size_t *removed)
{
    uint64_t *steps;
    size_t n;
    if (removed)
        *removed = 0;
    int rc = list_complete(root, &steps, &n);
    if (rc == DT_ERR_NOT_FOUND)
        return DT_OK;
    if (rc)
        return rc;
    qsort(steps, n, sizeof *steps, u64_desc);
    for (size_t i = keep; i < n && !rc; i++) {
        if (steps[i] == spare)
            continue;
        if (!(rc = remove_step(root, steps[i])) && removed)
            (*removed)++;
    }
    free(steps);
    if (!rc)
        rc = dt_fileutil_fsync_dir(root);
    return rc;
}

static int remove_beyond(const char *root, uint32_t keep)
{
    return remove_beyond_sparing(root, keep, UINT64_MAX, NULL);
}

int dt_ckpt_remove_others(const char *root, uint64_t step, size_t *removed)
{
    return remove_beyond_sparing(root, 0, step, removed);
}

int dt_ckpt_prune(const char *root, uint32_t keep)
{
    if (keep == 0)
        return dt_err_set(DT_ERR_INVALID, "checkpoint prune: keep must be at "
                          "least 1");
    return remove_beyond(root, keep);
}

/* ---- one run per folder ---------------------------------------------- */

int dt_ckpt_lock(const char *root, int *fd_out)
{
    *fd_out = -1;
    char path[PATH_MAX];
    int rc = dt_fileutil_mkdir_p(root);
    if (!rc)
        rc = dt_ckpt_join(path, sizeof path, root, LOCK_FILE);
    if (rc)
        return rc;
    /* A FIFO or a device at the name is refused before it is opened, and
     * O_NONBLOCK | O_NOCTTY keep one swapped in since from blocking the
     * open (fstat below refuses it); never through a link planted at the
     * name.  0600, never more whatever the umask: anyone who may open it may
     * flock it, and so keep this folder's runs from starting. */
    if ((rc = dt_fileutil_check_output(path, NULL)))
        return dt_err_context(rc, "checkpoint folder '%s'", root);
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                  0600);
    if (fd < 0)
        return dt_err_set(DT_ERR_IO, "checkpoint folder '%s': opening '%s': %s",
                          root, path, errno == ELOOP ? "a symbolic link, refused"
                                                     : strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dt_err_set(DT_ERR_IO, "checkpoint folder '%s': '%s' is not a "
                          "regular file", root, path);
    }
    /* flock: released by the kernel when this process ends, however */
    int r;
    while ((r = flock(fd, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR)
        ;
    if (r != 0) {
        int e = errno;
        char buf[32] = "";
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        close(fd);
        if (e != EWOULDBLOCK)
            return dt_err_set(DT_ERR_IO, "checkpoint folder '%s': locking '%s': "
                              "%s", root, path, strerror(e));
        long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
        char who[48] = "another process";
        if (pid > 0)
            snprintf(who, sizeof who, "process %ld", pid);
        return dt_err_set(DT_ERR_IO, "checkpoint folder '%s' is in use by "
                          "another run (%s holds '%s'): two runs never write "
                          "one checkpoint folder; wait for it to end, or give "
                          "this run another run.name or checkpoint.dir",
                          root, who, path);
    }
    char pid[32];
    int pn = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)pn, 0) != pn) {
        int e = errno;
        close(fd);
        return dt_err_set(DT_ERR_IO, "checkpoint folder '%s': writing '%s': %s",
                          root, path, strerror(e));
    }
    *fd_out = fd;
    return DT_OK;
}

int dt_ckpt_claim_fresh(const char *root, int overwrite, const char *cfg_path)
{
    char dir[PATH_MAX];
    uint64_t step;
    int rc = dt_ckpt_latest(root, dir, sizeof dir, &step);
    if (rc == DT_ERR_NOT_FOUND) {
        dt_err_clear();
        return DT_OK;
    }
    if (rc)
        return rc;
    if (!overwrite)
        return dt_err_set(DT_ERR_CONFIG, "%s: [checkpoint] resume = \"\" starts a "
                          "fresh run, but the checkpoint folder '%s' already "
                          "holds checkpoints (the newest: step %" PRIu64 "): set "
                          "checkpoint.resume = \"latest\" to continue them, "
                          "another run.name (or checkpoint.dir) to keep them "
                          "apart, or checkpoint.overwrite = true to remove them",
                          cfg_path, root, step);
    dt_log(DT_LOG_WARN, "ckpt", "warning: checkpoint.overwrite = true: removing "
           "the checkpoints in '%s' (the newest: step %" PRIu64 ")", root, step);
    return remove_beyond(root, 0);
}
