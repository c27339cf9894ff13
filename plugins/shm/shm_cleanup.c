/*
 * plugins/shm/shm_cleanup.c - the comm ABI's cleanup_job: remove the
 * segments ranks of a job left in /dev/shm when they died before their
 * group was complete (after that, the name is already gone).
 *
 * Only what this plugin creates for that job is touched: the names
 * shm_is_job_segment accepts, that are regular files the calling user
 * owns.  Entries are examined with fstatat(AT_SYMLINK_NOFOLLOW), so a
 * symlink is never followed (nor removed: shm_open makes none), and
 * another user's file under one of our names is left alone.  /dev/shm is
 * sticky (mode 1777), so nobody else can swap a file we found to be ours
 * for another between that check and unlinkat, which removes the name
 * itself and never follows it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm_internal.h"
#include "shm_msg.h"

/* Remove /dev/shm/<name> when it is a regular file owned by us: 1 when
 * removed, 0 when skipped or already gone, -errno on failure. */
static int remove_if_ours(const dt_host_v1_t *host, int dfd, const char *name)
{
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
        host->log(host, DT_LOG_WARN, "cleanup_job: left %s/%s alone: %s", SHM_DIR, name,
                  !S_ISREG(st.st_mode) ? "not a regular file (shm creates no other kind)"
                                       : "owned by another user");
        return 0;
    }
    if (unlinkat(dfd, name, 0) != 0)
        return errno == ENOENT ? 0 : -errno;
    return 1;
}

int shm_cleanup_job(const dt_host_v1_t *host, const char *job_id)
{
    if (!host)
        return DT_ERR_INVALID;
    if (!job_id || !shm_valid_job_id(job_id))
        return shm_bad_job_id(host, "cleanup_job", job_id);
    DIR *d = opendir(SHM_DIR);
    if (!d)
        return errno == ENOENT ? DT_OK
                               : host->set_error(host, DT_ERR_SYSTEM,
                                                 "cleanup_job: cannot list %s: %s", SHM_DIR,
                                                 strerror(errno));
    int removed = 0, rc = DT_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!shm_is_job_segment(e->d_name, job_id))
            continue;
        int r = remove_if_ours(host, dirfd(d), e->d_name);
        if (r > 0)
            removed++;
        else if (r < 0 && rc == DT_OK)
            rc = host->set_error(host, DT_ERR_SYSTEM, "cleanup_job: removing %s/%s: %s",
                                 SHM_DIR, e->d_name, strerror(-r));
    }
    closedir(d);
    if (removed)
        host->log(host, DT_LOG_INFO, "removed %d shared-memory segment%s left by job %s",
                  removed, removed == 1 ? "" : "s", job_id);
    return rc;
}
