/*
 * plugins/offload_nvme/offload_nvme_files.c - the tier's files on disk:
 * the folder ([offload_nvme] path, default $TMPDIR or /var/tmp, under
 * dtrain-offload), one file per buffer named with the job id and rank,
 * created 0600 and never through a link, its bytes reserved with
 * fallocate after a statvfs check that names the path, the bytes needed
 * and the bytes free; the O_DIRECT probe (tmpfs of older kernels refuses
 * it); and cleanup_job, which removes the files a crashed job left.
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

#define ON_PREFIX "dtrain-"

const char *on_default_dir(char *out, size_t n)
{
    const char *t = getenv("TMPDIR");
    snprintf(out, n, "%s/dtrain-offload", t && t[0] == '/' ? t : "/var/tmp");
    return out;
}

int on_valid_job(const char *job)
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

int on_files_dir(dt_offload_t *o, const char *path)
{
    const dt_host_v1_t *host = o->q.host;
    char def[PATH_MAX];
    const char *dir = path && path[0] ? path : on_default_dir(def, sizeof def);
    if (strlen(dir) >= sizeof o->dir - 200) /* room for the file names */
        return host->set_error(host, DT_ERR_CONFIG, "path '%s' is too long", dir);
    snprintf(o->dir, sizeof o->dir, "%s", dir);
    if (mkdir(o->dir, 0700) == 0)
        o->made_dir = 1;
    else if (errno != EEXIST)
        return host->set_error(host, DT_ERR_IO, "rank %d: creating the offload folder '%s': %s",
                               o->q.rank, o->dir, strerror(errno));
    struct stat st;
    if (stat(o->dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return host->set_error(host, DT_ERR_CONFIG, "path '%s' is not a folder", o->dir);
    return DT_OK;
}

int on_files_probe_direct(dt_offload_t *o, int *direct)
{
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/" ON_PREFIX "%s-r%d-probe.bin", o->dir, o->job, o->q.rank);
    int fd = open_file(p, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_DIRECT, 0600);
    int err = errno;
    if (fd >= 0) {
        close(fd);
        unlink(p);
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

int on_files_free(dt_offload_t *o, uint64_t *free_bytes)
{
    struct statvfs sv;
    if (statvfs(o->dir, &sv) != 0)
        return o->q.host->set_error(o->q.host, DT_ERR_IO, "rank %d: statvfs of '%s': %s",
                                    o->q.rank, o->dir, strerror(errno));
    *free_bytes = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    return DT_OK;
}

int on_files_create(dt_offload_t *o, dt_offload_buf_t *b)
{
    const dt_host_v1_t *host = o->q.host;
    snprintf(b->path, sizeof b->path, "%s/" ON_PREFIX "%s-r%d-%u.bin", o->dir, o->job, o->q.rank,
             b->ob.id);
    uint64_t free_bytes = 0;
    int rc = on_files_free(o, &free_bytes);
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
    if (b->ob.held && fallocate(b->fd, 0, 0, (off_t)b->ob.held) != 0) {
        int err = errno;
        close(b->fd);
        unlink(b->path);
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

void on_files_remove(dt_offload_t *o, dt_offload_buf_t *b)
{
    if (b->fd >= 0)
        close(b->fd);
    b->fd = -1;
    if (b->path[0] && unlink(b->path) != 0 && errno != ENOENT)
        o->q.host->log(o->q.host, DT_LOG_WARN, "removing '%s': %s", b->path, strerror(errno));
}

/* "dtrain-<job>-r<digits>-<digits|probe>.bin" */
static int is_job_file(const char *name, const char *job)
{
    size_t pl = strlen(ON_PREFIX), jl = strlen(job);
    if (strncmp(name, ON_PREFIX, pl) != 0 || strncmp(name + pl, job, jl) != 0 ||
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

int on_cleanup_job(const dt_host_v1_t *host, const char *job_id)
{
    if (!host)
        return DT_ERR_INVALID;
    if (!on_valid_job(job_id))
        return host->set_error(host, DT_ERR_INVALID, "cleanup_job: job id '%s' is not a plain "
                               "name", job_id ? job_id : "(null)");
    const char *path = NULL;
    char def[PATH_MAX];
    if (host->cfg_string(host, "path", &path) != DT_OK || !path || !path[0])
        path = on_default_dir(def, sizeof def);
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
