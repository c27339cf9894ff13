/*
 * plugins/shm/shm_sym.c - symmetric memory (comm.h, sym_alloc): memory of
 * one rank that every rank of the group maps too, so an in-place
 * all_reduce on it reads and writes the peers' copies directly
 * (shm_collectives.c) instead of staging them through the slots.
 *
 * Each rank makes its copy as its group's segments are made (an unnamed
 * file in /dev/shm, mode 0600, its memory reserved with posix_fallocate
 * so a full /dev/shm fails here and not later with SIGBUS), names it
 * <group>-s<allocation>r<rank>, and the ranks exchange (device, inode,
 * size) of their files over the group itself.  Each then opens its peers'
 * names and maps them only when the file is the one its owner made (same
 * device and inode, regular, ours, mode 0600, one name, the size): a file
 * planted under a name is refused, never mapped.  Once every rank mapped
 * every copy (a second exchange says so), each removes its own name, so a
 * crash later leaves nothing in /dev/shm; a crash before that leaves names
 * cleanup_job removes (shm_is_job_segment).  All or nothing: when any rank
 * fails, every rank undoes its part and returns the same status.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm_internal.h"
#include "shm_msg.h"

/* What each rank tells the others about its copy. */
typedef struct sym_rec {
    int32_t status; /* DT_OK, or why this rank failed */
    uint32_t reserved;
    uint64_t dev, ino, bytes;
} sym_rec_t;

static void account(dt_comm_t *c, int tag, int64_t delta)
{
    if (DT_HOST_HAS(c->host, mem_account))
        c->host->mem_account(c->host, tag, delta);
}

static void sym_path(const dt_comm_t *c, uint32_t no, int32_t rank, char *buf, size_t cap)
{
    char name[SHM_NAME_MAX + 48];
    if (shm_sym_name(name, sizeof name, c->name, no, rank) < 0)
        name[0] = 0;
    snprintf(buf, cap, "%s%s", SHM_DIR, name);
}

/* Our copy: create, reserve, map and name it; fill *rec. */
static int make_own(dt_comm_t *c, const char *what, const char *path, uint64_t bytes,
                    unsigned char **base, sym_rec_t *rec)
{
    const dt_host_v1_t *h = c->host;
    int fd = open(SHM_DIR, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return h->set_error(h, DT_ERR_SYSTEM, "%s: cannot create a file in %s: %s", what,
                            SHM_DIR, strerror(errno));
    struct stat st;
    void *p = NULL;
    int err = shm_reserve(fd, bytes, &p);
    if (!err && fstat(fd, &st) != 0) {
        err = errno;
        munmap(p, bytes);
    }
    if (err) {
        close(fd);
        return h->set_error(h, err == ENOSPC ? DT_ERR_NOMEM : DT_ERR_SYSTEM,
                            "%s: cannot reserve %.1f MiB of shared memory: %s (enlarge "
                            "/dev/shm, e.g. docker --shm-size, or set shm.symmetric = false)",
                            what, (double)bytes / 1048576.0, strerror(err));
    }
    err = shm_name_fd(fd, path);
    if (err == EEXIST) {
        /* Our group's rendezvous succeeded, so no live rank of another job
         * uses this group's names: what is there was left by a crashed one.
         * Remove it only if it is a file of ours, as cleanup_job would. */
        struct stat old;
        int rc = lstat(path, &old) != 0 ? DT_ERR_SYSTEM : shm_check_file(c, what, path, &old);
        if (rc == DT_OK && unlink(path) == 0)
            err = shm_name_fd(fd, path);
        else if (rc == DT_OK)
            err = errno;
        else {
            close(fd);
            munmap(p, bytes);
            return rc;
        }
    }
    close(fd);
    if (err) {
        munmap(p, bytes);
        return h->set_error(h, DT_ERR_SYSTEM, "%s: cannot name %s: %s", what, path,
                            strerror(err));
    }
    *base = p;
    rec->dev = (uint64_t)st.st_dev;
    rec->ino = (uint64_t)st.st_ino;
    rec->bytes = bytes;
    return DT_OK;
}

/* Map rank p's copy after checking it is the file p made (rec). */
static int map_peer(dt_comm_t *c, const char *what, const char *path, const sym_rec_t *rec,
                    unsigned char **base)
{
    const dt_host_v1_t *h = c->host;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return h->set_error(h, DT_ERR_SYSTEM, "%s: cannot open %s: %s", what, path,
                            strerror(errno));
    struct stat st;
    int rc = fstat(fd, &st) != 0
                 ? h->set_error(h, DT_ERR_SYSTEM, "%s: cannot stat %s: %s", what, path,
                                strerror(errno))
                 : shm_check_file(c, what, path, &st);
    if (rc == DT_OK && ((uint64_t)st.st_dev != rec->dev || (uint64_t)st.st_ino != rec->ino ||
                        (uint64_t)st.st_size != rec->bytes))
        rc = h->set_error(h, DT_ERR_DATA, "%s: %s is not the file its rank made (another "
                          "file was put under its name); refusing to map it", what, path);
    void *p = MAP_FAILED;
    if (rc == DT_OK && (p = mmap(NULL, rec->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                                 0)) == MAP_FAILED)
        rc = h->set_error(h, DT_ERR_SYSTEM, "%s: cannot map %s: %s", what, path,
                          strerror(errno));
    close(fd);
    if (rc == DT_OK)
        *base = p;
    return rc;
}

static void unmap_all(dt_comm_t *c, shm_sym_t *s)
{
    for (int p = 0; p < c->size; p++)
        if (s->base[p])
            munmap(s->base[p], s->bytes);
    free(s->base);
    free(s);
}

/* Every rank's record of this step; DT_OK when all succeeded, else the
 * first failing rank's status with a message naming it (ours, when it is
 * us, is already set). */
static int exchange(dt_comm_t *c, const char *what, sym_rec_t *mine, sym_rec_t *all)
{
    int st = shm_op_all_gather(c, mine, all, sizeof *mine, DT_U8, NULL, NULL);
    if (st != DT_OK)
        return st;
    for (int p = 0; p < c->size; p++) {
        if (all[p].status == DT_OK)
            continue;
        if (p == c->rank)
            return all[p].status;
        char who[96];
        shm_fmt_rank(c, p, who, sizeof who);
        return c->host->set_error(c->host, all[p].status, "%s: %s could not make or map "
                                  "its part (its log says why)", what, who);
    }
    return DT_OK;
}

int shm_sym_alloc(dt_comm_t *c, uint64_t bytes, int tag, void **out)
{
    if (!c || !out)
        return DT_ERR_INVALID;
    *out = NULL;
    const dt_host_v1_t *h = c->host;
    if (!c->sym_enabled)
        return h->set_error(h, DT_ERR_UNSUPPORTED, "symmetric memory is off "
                            "(shm.symmetric = false)");
    const long page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
    if (bytes == 0 || bytes > (UINT64_MAX >> 2))
        return h->set_error(h, DT_ERR_INVALID, "sym_alloc on group %s: %llu bytes",
                            c->gname, (unsigned long long)bytes);
    const uint64_t asked = bytes;
    bytes = (bytes + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
    const uint32_t no = ++c->sym_no; /* the same on every rank: collective */
    char what[256], path[sizeof SHM_DIR + SHM_NAME_MAX + 48];
    snprintf(what, sizeof what, "symmetric allocation #%u (%.1f MiB) on group %s", no,
             (double)bytes / 1048576.0, c->gname);

    shm_sym_t *s = calloc(1, sizeof *s);
    sym_rec_t *all = calloc((size_t)c->size, sizeof *all);
    if (s)
        s->base = calloc((size_t)c->size, sizeof *s->base);
    if (!s || !all || !s->base) {
        free(all);
        if (s)
            free(s->base);
        free(s);
        return h->set_error(h, DT_ERR_NOMEM, "%s: out of memory", what);
    }
    s->no = no;
    s->tag = tag;
    s->bytes = bytes;
    s->asked = asked;

    /* 1: every rank makes and names its copy */
    sym_rec_t mine = {0};
    sym_path(c, no, c->rank, path, sizeof path);
    mine.status = make_own(c, what, path, bytes, &s->base[c->rank], &mine);
    int named = mine.status == DT_OK;
    int st = exchange(c, what, &mine, all);
    /* 2: every rank maps every other's */
    if (st == DT_OK) {
        for (int p = 0; p < c->size && mine.status == DT_OK; p++) {
            if (p == c->rank)
                continue;
            char pp[sizeof path];
            sym_path(c, no, p, pp, sizeof pp);
            mine.status = map_peer(c, what, pp, &all[p], &s->base[p]);
        }
        st = exchange(c, what, &mine, all);
    }
    /* 3: everybody has every copy (or gives up): our name goes */
    if (named)
        unlink(path);
    free(all);
    if (st != DT_OK) {
        unmap_all(c, s);
        return st;
    }
    s->next = c->sym;
    c->sym = s;
    /* counted as asked, as devices count their allocations (the page it
     * is rounded to is the mapping's, like an allocator's overhead) */
    account(c, tag, (int64_t)asked);
    *out = s->base[c->rank]; /* a fresh file: zeroed */
    return DT_OK;
}

int shm_sym_free(dt_comm_t *c, void *ptr)
{
    if (!c)
        return DT_ERR_INVALID;
    if (!ptr)
        return DT_OK;
    for (shm_sym_t **pp = &c->sym; *pp; pp = &(*pp)->next) {
        shm_sym_t *s = *pp;
        if (s->base[c->rank] != ptr)
            continue;
        *pp = s->next;
        account(c, s->tag, -(int64_t)s->asked);
        unmap_all(c, s);
        return DT_OK;
    }
    return c->host->set_error(c->host, DT_ERR_INVALID, "sym_free on group %s: %p is not "
                              "symmetric memory of this group (freed twice, or from "
                              "another group)", c->gname, ptr);
}

void shm_sym_free_all(dt_comm_t *c)
{
    while (c->sym)
        (void)shm_sym_free(c, c->sym->base[c->rank]);
}

const shm_sym_t *shm_sym_find(const dt_comm_t *c, const void *p, uint64_t n, uint64_t *off)
{
    const uintptr_t a = (uintptr_t)p;
    for (const shm_sym_t *s = c->sym; s; s = s->next) {
        const uintptr_t lo = (uintptr_t)s->base[c->rank];
        if (a >= lo && a - lo <= s->bytes && n <= s->bytes - (a - lo)) {
            *off = (uint64_t)(a - lo);
            return s;
        }
    }
    return NULL;
}
