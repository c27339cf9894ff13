/*
 * plugins/nccl/nccl_bootstrap.c - how the ranks of a job agree on the
 * world's ncclUniqueId (see the seam described in nccl_internal.h).
 *
 * One machine: rank 0 calls ncclGetUniqueId and publishes
 * /dev/shm/dtrain-<job>-nccl-id (mode 0600, written under a temporary name
 * and renamed, so a reader never sees half a file) holding a magic, a hash
 * of the job secret and the id; the other ranks poll for it, bounded by
 * the init timeout, and refuse a file whose secret hash differs from
 * theirs (naming the file, never the secret).  Rank 0 removes it once
 * every rank has joined; cleanup_job removes one a crashed job left.
 *
 * The secret's hash here is FNV-1a, a check against a file of another job
 * under the same id, not a proof of knowledge like shm's HMAC-SHA256: the
 * file's mode (0600) is what keeps other users out.  Moving shm's keyed
 * hash into the SDK so both use it is left for a change that may touch
 * shm.  Compiled; not yet run on a GPU.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "nccl_internal.h"

#define ID_DIR "/dev/shm"
#define ID_MAGIC "DTNCCLID1"

typedef struct id_file {
    char magic[16];
    uint64_t secret_hash;
    ncclUniqueId id;
} id_file_t;

static int valid_job_id(const char *j)
{
    if (!j || !*j || strlen(j) > 128)
        return 0;
    for (; *j; j++)
        if (!((*j >= 'a' && *j <= 'z') || (*j >= 'A' && *j <= 'Z') ||
              (*j >= '0' && *j <= '9') || *j == '-' || *j == '_' || *j == '.'))
            return 0;
    return 1;
}

static uint64_t secret_hash(const char *secret)
{
    static const char salt[] = "dtrain-nccl-id";
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof salt; i++)
        h = (h ^ (uint8_t)salt[i]) * 0x100000001b3ull;
    for (const char *p = secret ? secret : ""; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    return h;
}

static void id_path(char *buf, size_t cap, const char *job)
{
    snprintf(buf, cap, ID_DIR "/dtrain-%s-nccl-id", job);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int publish(const dt_host_v1_t *host, const char *path, const id_file_t *f)
{
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return host->set_error(host, DT_ERR_SYSTEM, "init: creating %s: %s", tmp,
                               strerror(errno));
    ssize_t w = write(fd, f, sizeof *f);
    int e = w == (ssize_t)sizeof *f ? 0 : (w < 0 ? errno : EIO);
    if (close(fd) != 0 && !e)
        e = errno;
    if (!e && rename(tmp, path) != 0)
        e = errno;
    if (e) {
        unlink(tmp);
        return host->set_error(host, DT_ERR_SYSTEM, "init: publishing %s: %s", path,
                               strerror(e));
    }
    return DT_OK;
}

/* 1 when read, 0 when not there (yet), or a negative status (set). */
static int try_read(const dt_host_v1_t *host, const char *path, id_file_t *f)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errno == ENOENT ? 0
                               : -host->set_error(host, DT_ERR_SYSTEM, "init: opening %s: %s",
                                                  path, strerror(errno));
    ssize_t r = read(fd, f, sizeof *f);
    close(fd);
    if (r != (ssize_t)sizeof *f || memcmp(f->magic, ID_MAGIC, sizeof ID_MAGIC) != 0)
        return -host->set_error(host, DT_ERR_DATA,
                                "init: %s is not a dtrain NCCL id file (%zd bytes)", path,
                                r);
    return 1;
}

int nccl_bootstrap_id(const dt_host_v1_t *host, const dt_comm_init_v1_t *a,
                      ncclUniqueId *id)
{
    if (a->size > 1 && a->local_size < a->size)
        return host->set_error(host, DT_ERR_UNSUPPORTED,
                               "init: %d ranks on several machines (%d on this one): the "
                               "nccl communicator agrees on its unique id within one machine "
                               "only so far; the cross-machine rendezvous (MASTER_ADDR/"
                               "MASTER_PORT) is not built yet", (int)a->size,
                               (int)a->local_size);
    if (a->size == 1) /* nobody to tell */
        return ncclGetUniqueId(id) == ncclSuccess
                   ? DT_OK
                   : host->set_error(host, DT_ERR_SYSTEM, "init: ncclGetUniqueId failed");
    if (!valid_job_id(a->job_id))
        return host->set_error(host, DT_ERR_CONFIG,
                               "init: job id \"%s\" is not [A-Za-z0-9._-]{1,128}: the "
                               "ranks meet through a file named by it",
                               a->job_id ? a->job_id : "(null)");
    char path[256];
    id_path(path, sizeof path, a->job_id);
    id_file_t f;
    memset(&f, 0, sizeof f);
    uint64_t want = secret_hash(a->job_secret);
    if (a->rank == 0) {
        memcpy(f.magic, ID_MAGIC, sizeof ID_MAGIC);
        f.secret_hash = want;
        ncclResult_t r = ncclGetUniqueId(&f.id);
        if (r != ncclSuccess)
            return host->set_error(host, DT_ERR_SYSTEM, "init: ncclGetUniqueId: %s",
                                   ncclGetErrorString(r));
        int rc = publish(host, path, &f);
        if (rc != DT_OK)
            return rc;
        *id = f.id;
        return DT_OK;
    }
    int64_t t0 = now_ms();
    for (;;) {
        int got = try_read(host, path, &f);
        if (got < 0)
            return -got;
        if (got == 1) {
            if (f.secret_hash != want)
                return host->set_error(host, DT_ERR_CONFIG,
                                       "init: %s was published by a rank with another job "
                                       "secret (or none): not this job's", path);
            *id = f.id;
            return DT_OK;
        }
        if (now_ms() - t0 > a->timeout_ms)
            return host->set_error(host, DT_ERR_TIMEOUT,
                                   "init: rank %d waited %.1f s for rank 0 to publish the "
                                   "NCCL unique id in %s", (int)a->rank,
                                   (double)a->timeout_ms / 1000.0, path);
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void nccl_bootstrap_done(const dt_comm_init_v1_t *a)
{
    if (a->rank != 0 || a->size == 1 || !valid_job_id(a->job_id))
        return;
    char path[256];
    id_path(path, sizeof path, a->job_id);
    unlink(path);
}

int nccl_cleanup_job(const dt_host_v1_t *host, const char *job_id)
{
    if (!host)
        return DT_ERR_INVALID;
    if (!valid_job_id(job_id))
        return host->set_error(host, DT_ERR_INVALID,
                               "cleanup_job: job id \"%s\" is not [A-Za-z0-9._-]{1,128}",
                               job_id ? job_id : "(null)");
    char prefix[200];
    snprintf(prefix, sizeof prefix, "dtrain-%s-nccl-id", job_id);
    DIR *d = opendir(ID_DIR);
    if (!d)
        return DT_OK;
    int dfd = dirfd(d);
    struct dirent *e;
    size_t n = strlen(prefix);
    while ((e = readdir(d))) {
        /* the id file and its temporaries ("...-nccl-id.tmp.<pid>") */
        if (strncmp(e->d_name, prefix, n) != 0 ||
            (e->d_name[n] != '\0' && strncmp(e->d_name + n, ".tmp.", 5) != 0))
            continue;
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
            st.st_uid == geteuid())
            unlinkat(dfd, e->d_name, 0);
    }
    closedir(d);
    return DT_OK;
}
