/*
 * plugins/offload_nvme/offload_nvme_files.c - the tier's files on disk:
 * the folder ([offload_nvme] path, default $TMPDIR or /var/tmp, under
 * dtrain-offload), one file per buffer named with the job id and rank,
 * created 0600 and never through a link, its bytes reserved with
 * fallocate after a statvfs check that names the path, the bytes needed
 * and the bytes free; the O_DIRECT probe (tmpfs of older kernels refuses
 * it); and cleanup_job, which removes the files a crashed job left.
 *
 * The folder: missing folders on the way are made 0700, like the tier's
 * own, and removed again at finalize when empty.  Every folder from the
 * root down (links resolved) must be ours or root's, and not writable by
 * others unless sticky (/tmp): otherwise another user could remove or
 * rename the tier's files, or swap a folder on the way for one of theirs,
 * so the tier refuses to start (DT_ERR_CONFIG), naming the folder and
 * why.  One writable by its group only is said (a warning, local rank 0):
 * a user's private group or a team's project folder is a site's choice.
 * The way is checked before anything is made in it and again once all is
 * made.
 *
 * Every file and folder made is registered with the core's signal cleanup
 * (host minor 3, cleanup_add) while it exists, so Ctrl-C or SIGTERM of a
 * one-process run (no launcher to call cleanup_job) leaves none of them.
 * A file is registered right after it is made: a signal between the two
 * leaves an empty file, never removes one that is not ours.
 *
 * Test hook (DTRAIN_TEST_HOOKS builds only, never in a shipped binary):
 * DTRAIN_FAULT_NO_ODIRECT=1 makes every O_DIRECT open here fail with
 * EINVAL, as tmpfs before Linux 6.6 does, so the buffered fallback is
 * tested on a file system that takes O_DIRECT.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "offload_nvme_internal.h"

#define NVME_PREFIX "dtrain-"

const char *nvme_default_dir(char *out, size_t n)
{
    const char *t = getenv("TMPDIR");
    snprintf(out, n, "%s/dtrain-offload", t && t[0] == '/' ? t : "/var/tmp");
    return out;
}

int nvme_valid_job(const char *job)
{
    if (!job || !job[0] || strlen(job) > 100)
        return 0;
    for (const char *p = job; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.'))
            return 0;
    return 1;
}

/* open(2), or the failure the test hook asks for. */
static int open_file(const char *path, int flags, mode_t mode)
{
#ifdef DTRAIN_TEST_HOOKS
    const char *v = getenv("DTRAIN_FAULT_NO_ODIRECT");
    if ((flags & O_DIRECT) && v && strcmp(v, "1") == 0) {
        errno = EINVAL;
        return -1;
    }
#endif
    return open(path, flags, mode);
}

/* ---- the core's signal cleanup (host minor 3) ---- */

/* Have the core remove `path` should the process get SIGINT or SIGTERM:
 * a one-process run has no launcher whose cleanup_job would.  Called
 * right after the path is made, so nothing that is not ours is ever
 * named.  A core without the slot: nothing (the launcher still cleans up
 * after a rank); a full list: said once per tier. */
static void cleanup_add(dt_offload_t *o, const char *path, uint32_t flags)
{
    const dt_host_v1_t *host = o->q.host;
    if (!DT_HOST_HAS(host, cleanup_add) || !DT_HOST_HAS(host, cleanup_remove))
        return;
    int rc = host->cleanup_add(host, path, flags);
    if (rc != DT_OK && !o->cleanup_warned) {
        o->cleanup_warned = 1;
        host->log(host, DT_LOG_WARN, "rank %d: '%s' is not removed should the run be stopped "
                  "by SIGINT or SIGTERM (%s: the core's list of paths to remove is full)",
                  o->q.rank, path, dt_status_name(rc));
    }
}

static void cleanup_forget(dt_offload_t *o, const char *path)
{
    const dt_host_v1_t *host = o->q.host;
    if (DT_HOST_HAS(host, cleanup_add) && DT_HOST_HAS(host, cleanup_remove))
        host->cleanup_remove(host, path);
}

/* ---- the folder ---- */

/* Whether folder `st` lets another user remove or rename what is in it:
 * 0 no (ours or root's, and only its owner may write it, or it is
 * sticky like /tmp, where only an entry's owner may remove or rename
 * it); 1 yes, refused: owned by another user, or writable by others; 2
 * writable by its group (a user's private group, or a team's folder: a
 * warning).  `why` says so. */
static int loose_folder(const struct stat *st, char *why, size_t n)
{
    unsigned mode = (unsigned)st->st_mode & 07777;
    if (st->st_uid != 0 && st->st_uid != geteuid()) {
        snprintf(why, n, "is owned by uid %u, not by this user (uid %u) or root: its owner could "
                 "remove or replace the tier's files; use a folder of your own",
                 (unsigned)st->st_uid, (unsigned)geteuid());
        return 1;
    }
    if (st->st_mode & S_ISVTX)
        return 0;
    if (st->st_mode & S_IWOTH) {
        snprintf(why, n, "is writable by others (mode %04o) and not sticky: another user could "
                 "remove or replace the tier's files; use a folder only you can write (or "
                 "chmod o-w, or chmod +t)", mode);
        return 1;
    }
    if (st->st_mode & S_IWGRP) {
        snprintf(why, n, "is writable by its group (mode %04o) and not sticky: another member "
                 "could remove or replace the tier's files (chmod g-w, or chmod +t)", mode);
        return 2;
    }
    return 0;
}

/* Every folder from the root down to `dir` (links resolved), checked
 * with loose_folder: DT_OK, or the refusal (DT_ERR_CONFIG) naming the
 * path as given and the folder; a group-writable one is said once per
 * machine (local rank 0) when `say`. */
static int check_folders(dt_offload_t *o, const char *dir, int say)
{
    const dt_host_v1_t *host = o->q.host;
    char real[PATH_MAX], p[PATH_MAX], why[256];
    if (!realpath(dir, real))
        return host->set_error(host, DT_ERR_IO, "rank %d: path '%s': resolving '%s': %s",
                               o->q.rank, o->dir, dir, strerror(errno));
    size_t n = strlen(real);
    for (size_t end = 1; end <= n; end++) {
        if (end < n && real[end] != '/')
            continue;
        memcpy(p, real, end);
        p[end] = '\0';
        struct stat st;
        if (lstat(p, &st) != 0)
            return host->set_error(host, DT_ERR_IO, "rank %d: path '%s': '%s': %s", o->q.rank,
                                   o->dir, p, strerror(errno));
        int loose = loose_folder(&st, why, sizeof why);
        if (loose == 1)
            return host->set_error(host, DT_ERR_CONFIG, "rank %d: path '%s': the folder '%s' %s",
                                   o->q.rank, o->dir, p, why);
        if (loose == 2 && say && o->local_rank == 0)
            host->log(host, DT_LOG_WARN, "path '%s': the folder '%s' %s", o->dir, p, why);
    }
    return DT_OK;
}

/* The first `len` bytes of dir as a path: "/" or "." for none. */
static const char *dir_prefix(const dt_offload_t *o, size_t len, char *out)
{
    if (len == 0)
        return strcpy(out, ".");
    memcpy(out, o->dir, len);
    out[len] = '\0';
    return out;
}

/* The length of dir's parent folder ("/a/b" -> 2, "/a" -> 1, "a" -> 0). */
static size_t parent_len(const char *dir, size_t len)
{
    while (len > 0 && dir[len - 1] != '/')
        len--;
    return len > 1 ? len - 1 : len;
}

int nvme_files_dir(dt_offload_t *o, const char *path)
{
    const dt_host_v1_t *host = o->q.host;
    char def[PATH_MAX], p[PATH_MAX];
    const char *dir = path && path[0] ? path : nvme_default_dir(def, sizeof def);
    if (strlen(dir) >= sizeof o->dir - 200) /* room for the file names */
        return host->set_error(host, DT_ERR_CONFIG, "path '%s' is too long", dir);
    /* one '/' between folders, none at the end (but for "/") */
    size_t len = 0;
    for (const char *c = dir; *c; c++)
        if (*c != '/' || len == 0 || o->dir[len - 1] != '/')
            o->dir[len++] = *c;
    while (len > 1 && o->dir[len - 1] == '/')
        len--;
    o->dir[len] = '\0';
    o->made_from = len;
    /* the deepest folder that exists ... */
    size_t have = len;
    struct stat st;
    while (have > 0 && stat(dir_prefix(o, have, p), &st) != 0) {
        if (errno != ENOENT && errno != ENOTDIR)
            return host->set_error(host, DT_ERR_IO, "rank %d: path '%s': '%s': %s", o->q.rank,
                                   o->dir, p, strerror(errno));
        have = parent_len(o->dir, have);
    }
    if (have == len && stat(o->dir, &st) == 0 && !S_ISDIR(st.st_mode))
        return host->set_error(host, DT_ERR_CONFIG, "path '%s' is not a folder", o->dir);
    if (have < len && stat(dir_prefix(o, have, p), &st) == 0 && !S_ISDIR(st.st_mode))
        return host->set_error(host, DT_ERR_CONFIG, "path '%s': '%s' is not a folder", o->dir,
                               p);
    /* ... is one nobody else can change, before anything is made in it */
    int rc = check_folders(o, dir_prefix(o, have, p), 0);
    if (rc != DT_OK)
        return rc;
    /* the missing ones, 0700 as the tier's own */
    for (size_t end = have + 1; end <= len; end++) {
        if (end < len && o->dir[end] != '/')
            continue;
        dir_prefix(o, end, p);
        if (mkdir(p, 0700) == 0) {
            if (o->made_from == len)
                o->made_from = parent_len(o->dir, end);
            cleanup_add(o, p, DT_HOST_CLEANUP_EMPTY_DIR);
        } else if (errno != EEXIST) { /* (EEXIST: another rank made it meanwhile) */
            return host->set_error(host, DT_ERR_IO, "rank %d: path '%s': creating the folder "
                                   "'%s': %s", o->q.rank, o->dir, p, strerror(errno));
        }
    }
    if (stat(o->dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return host->set_error(host, DT_ERR_CONFIG, "path '%s' is not a folder", o->dir);
    return check_folders(o, o->dir, 1); /* the whole way, as it is now */
}

void nvme_files_remove_dirs(dt_offload_t *o)
{
    char p[PATH_MAX];
    size_t len = strlen(o->dir);
    while (len > o->made_from) {
        dir_prefix(o, len, p);
        int removed = rmdir(p) == 0; /* only when empty: another job's files stay */
        cleanup_forget(o, p);
        if (!removed)
            break;
        len = parent_len(o->dir, len);
    }
}

int nvme_files_probe_direct(dt_offload_t *o, int *direct)
{
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/" NVME_PREFIX "%s-r%d-probe.bin", o->dir, o->job, o->q.rank);
    int fd = open_file(p, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_DIRECT, 0600);
    int err = errno;
    if (fd >= 0) {
        cleanup_add(o, p, DT_HOST_CLEANUP_FILE);
        close(fd);
        unlink(p);
        cleanup_forget(o, p);
        *direct = 1;
        return DT_OK;
    }
    if (err == EINVAL) { /* the file system refuses O_DIRECT */
        unlink(p);
        *direct = 0;
        return DT_OK;
    }
    return o->q.host->set_error(o->q.host, DT_ERR_IO, "rank %d: creating '%s': %s", o->q.rank, p,
                                strerror(err));
}

int nvme_files_free(dt_offload_t *o, uint64_t *free_bytes)
{
    struct statvfs sv;
    if (statvfs(o->dir, &sv) != 0)
        return o->q.host->set_error(o->q.host, DT_ERR_IO, "rank %d: statvfs of '%s': %s",
                                    o->q.rank, o->dir, strerror(errno));
    *free_bytes = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    return DT_OK;
}

int nvme_files_create(dt_offload_t *o, dt_offload_buf_t *b)
{
    const dt_host_v1_t *host = o->q.host;
    snprintf(b->path, sizeof b->path, "%s/" NVME_PREFIX "%s-r%d-%u.bin", o->dir, o->job, o->q.rank,
             b->ob.id);
    uint64_t free_bytes = 0;
    int rc = nvme_files_free(o, &free_bytes);
    if (rc != DT_OK)
        return rc;
    if (b->ob.held > free_bytes)
        return host->set_error(host, DT_ERR_NOMEM,
                               "rank %d: alloc: '%s' needs %llu bytes for %s, but its file "
                               "system has %llu bytes free", o->q.rank, b->path,
                               (unsigned long long)b->ob.held, dt_mem_tag_name(b->ob.tag),
                               (unsigned long long)free_bytes);
    int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | (o->direct ? O_DIRECT : 0);
    b->fd = open_file(b->path, flags, 0600);
    if (b->fd < 0)
        return host->set_error(host, DT_ERR_IO, "rank %d: alloc: creating '%s': %s", o->q.rank,
                               b->path, strerror(errno));
    cleanup_add(o, b->path, DT_HOST_CLEANUP_FILE);
    if (b->ob.held && fallocate(b->fd, 0, 0, (off_t)b->ob.held) != 0) {
        int err = errno;
        close(b->fd);
        unlink(b->path);
        cleanup_forget(o, b->path);
        b->fd = -1;
        return host->set_error(host, err == ENOSPC ? DT_ERR_NOMEM : DT_ERR_IO,
                               "rank %d: alloc: reserving %llu bytes for '%s': %s (%llu bytes "
                               "were free)", o->q.rank, (unsigned long long)b->ob.held,
                               b->path, strerror(err), (unsigned long long)free_bytes);
    }
    struct stat st;
    b->blocks_counted = fstat(b->fd, &st) == 0 && (uint64_t)st.st_blocks * 512u >= b->ob.held;
    return DT_OK;
}

void nvme_files_remove(dt_offload_t *o, dt_offload_buf_t *b)
{
    if (b->fd >= 0)
        close(b->fd);
    b->fd = -1;
    if (b->path[0] && unlink(b->path) != 0 && errno != ENOENT)
        o->q.host->log(o->q.host, DT_LOG_WARN, "removing '%s': %s", b->path, strerror(errno));
    if (b->path[0])
        cleanup_forget(o, b->path);
}

/* "dtrain-<job>-r<digits>-<digits|probe>.bin" */
static int is_job_file(const char *name, const char *job)
{
    size_t pl = strlen(NVME_PREFIX), jl = strlen(job);
    if (strncmp(name, NVME_PREFIX, pl) != 0 || strncmp(name + pl, job, jl) != 0 ||
        strncmp(name + pl + jl, "-r", 2) != 0)
        return 0;
    const char *p = name + pl + jl + 2;
    if (*p < '0' || *p > '9')
        return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    if (*p++ != '-')
        return 0;
    if (strncmp(p, "probe", 5) == 0)
        p += 5;
    else if (*p >= '0' && *p <= '9')
        while (*p >= '0' && *p <= '9')
            p++;
    else
        return 0;
    return strcmp(p, ".bin") == 0;
}

int nvme_cleanup_job(const dt_host_v1_t *host, const char *job_id)
{
    if (!host)
        return DT_ERR_INVALID;
    if (!nvme_valid_job(job_id))
        return host->set_error(host, DT_ERR_INVALID, "cleanup_job: job id '%s' is not a plain "
                               "name", job_id ? job_id : "(null)");
    const char *path = NULL;
    char def[PATH_MAX];
    if (host->cfg_string(host, "path", &path) != DT_OK || !path || !path[0])
        path = nvme_default_dir(def, sizeof def);
    DIR *d = opendir(path);
    if (!d)
        return errno == ENOENT ? DT_OK
                               : host->set_error(host, DT_ERR_SYSTEM,
                                                 "cleanup_job: cannot list '%s': %s", path,
                                                 strerror(errno));
    int removed = 0, rc = DT_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!is_job_file(e->d_name, job_id))
            continue;
        struct stat st;
        /* our own regular files only; a link is never followed */
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != geteuid())
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0)
            removed++;
        else if (errno != ENOENT && rc == DT_OK)
            rc = host->set_error(host, DT_ERR_SYSTEM, "cleanup_job: removing '%s/%s': %s", path,
                                 e->d_name, strerror(errno));
    }
    closedir(d);
    if (removed)
        host->log(host, DT_LOG_INFO, "removed %d offload file%s left by job %s in '%s'", removed,
                  removed == 1 ? "" : "s", job_id, path);
    return rc;
}
