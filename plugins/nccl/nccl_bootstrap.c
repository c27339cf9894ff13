/*
 * plugins/nccl/nccl_bootstrap.c - how the ranks of a job agree on the
 * world's ncclUniqueId (see the seam described in nccl_internal.h).
 *
 * Through the job's rendezvous, when the host offers it
 * (DT_HOST_HAS(host, bootstrap_all_gather)): every rank contributes one
 * blob of NCCL_UNIQUE_ID_BYTES (rank 0 the id it made, the others zeros)
 * and every rank takes rank 0's entry of the all-gather.  This is the TCP
 * rendezvous at MASTER_ADDR:MASTER_PORT that `dtrain run` opens around the
 * communicator's init, on one node or several (--nnodes, or torchrun-,
 * srun- or mpirun-style environments), so a multi-node job needs nothing
 * else.  The rendezvous admits only ranks that prove the job secret (an
 * HMAC, core/launch/rendezvous.c), so nothing here checks it again; a
 * timeout or a rank that offered another size fails with the rendezvous's
 * message, which names the ranks.
 *
 * Through a file, when the host has no such slot (a core of host minor 0)
 * or offers no rendezvous here (DT_ERR_UNSUPPORTED: a program that
 * initialises the communicator outside `dtrain run`, such as `dtrain bench
 * comm`): one machine only.  Rank 0 calls ncclGetUniqueId and publishes
 * /dev/shm/dtrain-<job>-nccl-id (mode 0600, written under a temporary name
 * and renamed, so a reader never sees half a file) holding a magic, the
 * id, and an HMAC-SHA256 under the job secret of the job id and the id
 * (plugins/common/sha256/sha256.h, as shm's segment tags); the other ranks poll for
 * it, bounded by the init timeout, and refuse a file whose HMAC their
 * secret does not reproduce (naming the file, never the secret).  The
 * file's mode keeps other users out; the HMAC keeps another job of this
 * user under the same job id out.  Rank 0 removes it once every rank has
 * joined; cleanup_job removes one a crashed job left.
 *
 * Compiled; not yet run on a GPU (the bootstrap itself needs none and is
 * unit-tested, tests/unit/plugins/nccl/test_nccl_bootstrap.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/sha256/sha256.h"
#include "nccl_internal.h"

#define ID_DIR "/dev/shm"
#define ID_MAGIC "DTNCCLID2" /* 1 was the FNV-hashed layout */

_Static_assert(sizeof(ncclUniqueId) == NCCL_UNIQUE_ID_BYTES,
               "the rendezvous blob is the id's bytes, nothing else");
_Static_assert(NCCL_UNIQUE_ID_BYTES <= DT_HOST_BOOTSTRAP_MAX,
               "an id fits one bootstrap blob");

typedef struct id_file {
    char magic[16];
    uint8_t mac[DT_SHA256_BYTES]; /* HMAC-SHA256(secret, label, job, id) */
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

/* The file's proof that its writer holds this job's secret (none: the
 * empty key), bound to the job id and the id it carries. */
static void id_mac(const char *secret, const char *job, const ncclUniqueId *id,
                   uint8_t out[DT_SHA256_BYTES])
{
    static const char label[] = "dtrain-nccl-id";
    const void *parts[] = {label, job, id};
    const size_t sizes[] = {sizeof label, strlen(job) + 1, sizeof *id};
    const char *key = secret ? secret : "";
    dt_hmac_sha256_parts(key, strlen(key), parts, sizes, 3, out);
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

static int make_id(const dt_host_v1_t *host, ncclUniqueId *id)
{
    ncclResult_t r = ncclGetUniqueId(id);
    return r == ncclSuccess ? DT_OK
                            : host->set_error(host, DT_ERR_SYSTEM, "init: ncclGetUniqueId: %s",
                                              ncclGetErrorString(r));
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
    /* O_NONBLOCK: a FIFO planted at the name (by anyone: /dev/shm is
     * shared) would block the open forever; only a regular file is read */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return errno == ENOENT ? 0
                               : -host->set_error(host, DT_ERR_SYSTEM, "init: opening %s: %s",
                                                  path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -host->set_error(host, DT_ERR_SYSTEM, "init: %s is not a regular file", path);
    }
    ssize_t r = read(fd, f, sizeof *f);
    close(fd);
    if (r != (ssize_t)sizeof *f || memcmp(f->magic, ID_MAGIC, sizeof ID_MAGIC) != 0)
        return -host->set_error(host, DT_ERR_DATA,
                                "init: %s is not a dtrain NCCL id file (%zd bytes)", path,
                                r);
    return 1;
}

/* The id through the host's rendezvous: rank 0's entry of an all-gather
 * of id-sized blobs.  The host's status and message (naming the ranks)
 * as they are on failure.  A rank 0 whose ncclGetUniqueId failed still
 * takes part, with zeros, so the others fail at once naming it rather
 * than waiting out the timeout. */
static int via_rendezvous(const dt_host_v1_t *host, const dt_comm_init_v1_t *a,
                          ncclUniqueId *id)
{
    ncclUniqueId mine, zero;
    memset(&mine, 0, sizeof mine);
    memset(&zero, 0, sizeof zero);
    int made = a->rank == 0 ? make_id(host, &mine) : DT_OK;
    if (made != DT_OK)
        memset(&mine, 0, sizeof mine);
    ncclUniqueId *all = calloc((size_t)a->size, sizeof *all);
    if (!all)
        return host->set_error(host, DT_ERR_NOMEM,
                               "init: rank %d: out of memory for %d NCCL id blobs",
                               (int)a->rank, (int)a->size);
    int rc = host->bootstrap_all_gather(host, &mine, sizeof mine, all, a->timeout_ms);
    if (rc == DT_OK && made != DT_OK)
        rc = made; /* rank 0: make_id's message stands */
    else if (rc == DT_OK && memcmp(&all[0], &zero, sizeof zero) == 0)
        rc = host->set_error(host, DT_ERR_REMOTE,
                             "init: rank %d of %d: rank 0 offered no NCCL unique id through "
                             "the rendezvous (its ncclGetUniqueId failed; see rank 0's error)",
                             (int)a->rank, (int)a->size);
    else if (rc == DT_OK)
        *id = all[0];
    free(all);
    return rc;
}

/* The id through a file in /dev/shm: ranks of one machine only. */
static int via_file(const dt_host_v1_t *host, const dt_comm_init_v1_t *a, ncclUniqueId *id)
{
    if (!valid_job_id(a->job_id))
        return host->set_error(host, DT_ERR_CONFIG,
                               "init: job id \"%s\" is not [A-Za-z0-9._-]{1,128}: the "
                               "ranks meet through a file named by it",
                               a->job_id ? a->job_id : "(null)");
    char path[256];
    id_path(path, sizeof path, a->job_id);
    id_file_t f;
    memset(&f, 0, sizeof f);
    int rc;
    if (a->rank == 0) {
        memcpy(f.magic, ID_MAGIC, sizeof ID_MAGIC);
        if ((rc = make_id(host, &f.id)) != DT_OK)
            return rc;
        id_mac(a->job_secret, a->job_id, &f.id, f.mac);
        if ((rc = publish(host, path, &f)) != DT_OK)
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
            uint8_t want[DT_SHA256_BYTES];
            id_mac(a->job_secret, a->job_id, &f.id, want);
            if (!dt_equal_ct(want, f.mac, sizeof want))
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

int nccl_bootstrap_id(const dt_host_v1_t *host, const dt_comm_init_v1_t *a,
                      ncclUniqueId *id)
{
    if (a->size == 1) /* nobody to tell */
        return make_id(host, id);
    int spans = a->local_size < a->size;
    if (DT_HOST_HAS(host, bootstrap_all_gather)) {
        int rc = via_rendezvous(host, a, id);
        if (rc == DT_OK)
            host->log(host, DT_LOG_DEBUG, "init: rank %d of %d: NCCL unique id from rank 0 "
                      "through the rendezvous", (int)a->rank, (int)a->size);
        if (rc != DT_ERR_UNSUPPORTED)
            return rc;
        /* no rendezvous in this process (outside `dtrain run`) */
        if (spans)
            return host->set_error(host, DT_ERR_UNSUPPORTED,
                                   "init: %d ranks on several machines (%d on this one) and "
                                   "no rendezvous to exchange the NCCL unique id through: "
                                   "start every node with `dtrain run` (--nnodes, or "
                                   "MASTER_ADDR/MASTER_PORT in the environment)",
                                   (int)a->size, (int)a->local_size);
    } else if (spans) {
        return host->set_error(host, DT_ERR_UNSUPPORTED,
                               "init: %d ranks on several machines (%d on this one): the NCCL "
                               "unique id crosses machines through the host's rendezvous "
                               "(the host table's optional bootstrap_all_gather), which this host (ABI "
                               "%u.%u) does not offer", (int)a->size, (int)a->local_size,
                               (unsigned)host->abi_major, (unsigned)host->abi_minor);
    }
    return via_file(host, a, id);
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
