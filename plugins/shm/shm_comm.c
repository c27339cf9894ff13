/*
 * plugins/shm/shm_comm.c - the `shm` communicator plugin: ranks of one
 * machine exchange data through a POSIX shared-memory segment per group.
 *
 * This file holds the plugin table and config keys and the group
 * lifecycle: init (rendezvous), split, abort, finalize.  The operations
 * themselves, their queue and the progress thread are in shm_ops.c; the
 * data movement in shm_collectives.c and shm_p2p.c; waiting in
 * shm_sync.c; arithmetic in plugins/common/comm/reduce.c; the text of messages and the
 * job's failure record in shm_msg.c.
 *
 * Failure handling: every wait is bounded by the group's timeout (a stall
 * fails with DT_ERR_TIMEOUT naming the ranks waited for).  A peer whose
 * process is gone (pidfd, else kill(pid, 0)) is published in the WORLD
 * segment's failure record, as is abort(reason); every wait of every group
 * of the job looks at that record, so all ranks fail promptly with
 * DT_ERR_REMOTE naming the rank ("rank 2 (pid 4242) died", "rank 1
 * aborted: <reason>").
 *
 * Rendezvous (shm_rendezvous.c): rank 0 creates the group's segment, the
 * others join it once they checked it (trusting nothing a name may lead
 * to; with the job secret, if any) and wait for the others; once all are
 * in, the name is removed, so a crash later leaves nothing in /dev/shm.  A
 * crash before that can leave a segment behind: cleanup_job
 * (shm_cleanup.c) removes it.
 */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/comm/comm_split.h"
#include "dtrain/sdk/cfg.h"
#include "shm_internal.h"
#include "shm_msg.h"
#include "shm_sync.h"

static const dt_config_key_t shm_keys[] = {
    {.name = "slot_bytes", .type = DT_CFG_INT, .def = "4194304",
     .min = (double)SHM_SLOT_MIN, .max = (double)SHM_SLOT_MAX, .choices = NULL,
     .doc = "shared staging bytes per rank and group, cut into 4 pipeline "
            "chunks (a collective moves one chunk per rank per round)"},
    {.name = "spin_us", .type = DT_CFG_INT, .def = "50", .min = 0,
     .max = (double)SHM_SPIN_MAX, .choices = NULL,
     .doc = "microseconds a wait spins before sleeping on a futex "
            "(ignored, 0, when ranks outnumber cores)"},
    {.name = "symmetric", .type = DT_CFG_BOOL, .def = "true", .min = 0, .max = 0,
     .choices = NULL,
     .doc = "offer symmetric memory (comm sym_alloc): strategies keep gradients "
            "in memory every rank maps, and an in-place all_reduce there skips "
            "the staging copies"},
    {.name = "nodes_share_memory", .type = DT_CFG_BOOL, .def = "false",
     .min = 0, .max = 0, .choices = NULL,
     .doc = "the job's \"nodes\" are on one machine and share /dev/shm "
            "(containers, network namespaces): allow a job that spans nodes"},
};

/* ---- groups ------------------------------------------------------------ */

static void job_unref(shm_job_t *job)
{
    if (!job || atomic_fetch_sub(&job->refs, 1) != 1)
        return;
    if (job->base)
        munmap(job->base, job->bytes);
    explicit_bzero(job->secret_key, sizeof job->secret_key);
    free(job);
}

static void comm_free(dt_comm_t *c)
{
    if (!c)
        return;
    if (c->pidfds)
        for (int p = 0; p < c->size; p++)
            if (c->pidfds[p] >= 0)
                close(c->pidfds[p]);
    free(c->pidfds);
    free(c->pids);
    free(c->wranks);
    free((void *)c->srcs);
    free(c->cur_send);
    free(c->cur_recv);
    pthread_mutex_destroy(&c->qlock);
    pthread_mutex_destroy(&c->exec);
    free(c);
}

/* A new comm struct for rank `rank` of `size` (no segment yet). */
/* Defined below; every handle this plugin makes starts with it. */
static const dt_comm_ops_v1_t shm_ops;

static dt_comm_t *comm_alloc(const dt_host_v1_t *host, int32_t rank, int32_t size)
{
    dt_comm_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->host = host;
    c->ops = &shm_ops;
    c->rank = rank;
    c->size = size;
    pthread_mutex_init(&c->qlock, NULL);
    pthread_mutex_init(&c->exec, NULL);
    size_t n = (size_t)size;
    c->pids = calloc(n, sizeof *c->pids);
    c->wranks = calloc(n, sizeof *c->wranks);
    c->pidfds = malloc(n * sizeof *c->pidfds);
    c->srcs = calloc(n, sizeof *c->srcs);
    c->cur_send = calloc(n, sizeof *c->cur_send);
    c->cur_recv = calloc(n, sizeof *c->cur_recv);
    if (!c->pids || !c->wranks || !c->pidfds || !c->srcs || !c->cur_send || !c->cur_recv) {
        comm_free(c);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        c->pidfds[i] = -1;
    const char *stats = getenv("DTRAIN_SHM_STATS");
    c->stats.on = stats && strcmp(stats, "1") == 0;
    return c;
}

/* DTRAIN_SHM_STATS=1: one line per group at finalize. */
static void log_stats(dt_comm_t *c)
{
    const shm_stats_t *s = &c->stats;
    if (!s->on)
        return;
    double coll_ms = (double)s->coll_ns * 1e-6, wait_ms = (double)s->wait_ns * 1e-6;
    double sleep_ms = (double)s->sleep_ns * 1e-6;
    c->host->log(c->host, DT_LOG_INFO,
                 "stats, group %s, rank %d: %llu collectives (%llu on the caller's thread), "
                 "%.1f MB, %.1f ms executing (%.2f GB/s); %llu phase waits not ready at once: "
                 "%.1f ms, of which %.1f ms asleep (%llu sleeps) and %.1f ms spinning; "
                 "callers waited on %llu unfinished requests for %.1f ms",
                 c->gname, (int)c->rank, (unsigned long long)s->coll_ops,
                 (unsigned long long)s->coll_inline, (double)s->coll_bytes * 1e-6, coll_ms,
                 coll_ms > 0 ? (double)s->coll_bytes / (double)s->coll_ns : 0.0,
                 (unsigned long long)s->waits, wait_ms, sleep_ms,
                 (unsigned long long)s->sleeps, wait_ms - sleep_ms,
                 (unsigned long long)atomic_load(&s->req_waits),
                 (double)atomic_load(&s->req_wait_ns) * 1e-6);
}

static int start_thread(dt_comm_t *c)
{
    sigset_t all, old;
    sigfillset(&all);
    /* The thread inherits a full mask: signals go to the application's
     * threads, never to ours. */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&c->thread, NULL, shm_progress_main, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err)
        return c->host->set_error(c->host, DT_ERR_SYSTEM, "group %s: cannot start the "
                                  "progress thread: %s", c->gname, strerror(err));
    c->thread_started = 1;
    pthread_setname_np(c->thread, "dtrain-shm");
    return DT_OK;
}

/* Chunk sizes for a group of `size` from the configured slot bytes. */
static void chunk_sizes(int64_t slot_bytes, int32_t size, uint64_t *chunk, uint64_t *p2p)
{
    uint64_t ch = (uint64_t)slot_bytes / SHM_NBUF;
    ch -= ch % SHM_CHUNK_ALIGN;
    uint64_t need = shm_chunk_min(size); /* one aligned piece per rank */
    if (ch < need)
        ch = need;
    *chunk = ch;
    /* Point-to-point rings: ~16 MiB for all ordered pairs together,
     * 16 KiB..256 KiB per buffer. */
    uint64_t pairs = (uint64_t)size * (uint64_t)size * SHM_P2P_NBUF;
    uint64_t pc = (16ull << 20) / pairs;
    pc -= pc % SHM_CHUNK_ALIGN;
    if (pc < SHM_P2P_CHUNK_MIN)
        pc = SHM_P2P_CHUNK_MIN;
    if (pc > SHM_P2P_CHUNK_MAX)
        pc = SHM_P2P_CHUNK_MAX;
    *p2p = pc;
}

/* Bytes of the last-level cache CPU 0 sees, from sysfs (sysconf's
 * _SC_LEVEL3_CACHE_SIZE reports the whole package's on some VMs, e.g.
 * 384 MiB where one core's L3 is 32 MiB); SHM_LLC_DEFAULT if unknown. */
static uint64_t llc_bytes(void)
{
    uint64_t best = 0;
    int best_level = 0;
    for (int i = 0; i < 10; i++) {
        char path[96], buf[32];
        int level = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f)
            break;
        int ok = fscanf(f, "%d", &level) == 1;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        f = fopen(path, "r");
        if (!f || !ok)
            continue;
        ok = fgets(buf, sizeof buf, f) != NULL;
        fclose(f);
        if (!ok || level < best_level)
            continue;
        char *end = NULL;
        unsigned long long v = strtoull(buf, &end, 10);
        if (end && (*end == 'K' || *end == 'k'))
            v <<= 10;
        else if (end && *end == 'M')
            v <<= 20;
        if (v > 0) {
            best = v;
            best_level = level;
        }
    }
    return best ? best : SHM_LLC_DEFAULT;
}

/* Message sizes whose reductions use SHM_MID_CHUNK rounds: 2 x size x
 * bytes between one and two last-level caches. */
static void set_mid_range(dt_comm_t *c)
{
    static _Atomic uint64_t llc;
    uint64_t l = atomic_load(&llc);
    if (!l) {
        l = llc_bytes();
        atomic_store(&llc, l);
    }
    uint64_t n = 2 * (uint64_t)(c->size > 0 ? c->size : 1);
    c->mid_lo = l / n;
    c->mid_hi = 2 * l / n;
}

/* Finish a comm after its rendezvous succeeded. */
static int comm_start(dt_comm_t *c)
{
    set_mid_range(c);
    int st = start_thread(c);
    if (st != DT_OK)
        return st;
    c->host->log(c->host, DT_LOG_DEBUG,
                 "joined group %s as rank %d of %d (segment %s, %.1f MiB, %llu-byte "
                 "chunks, %s)", c->gname, (int)c->rank, (int)c->size, c->name,
                 (double)c->bytes / 1048576.0, (unsigned long long)c->chunk,
                 c->spin_ns ? (c->caller_one_cpu ? "waits spin then sleep, callers sleep at once"
                                                 : "waits spin then sleep")
                            : "waits sleep at once (ranks share CPUs)");
    return DT_OK;
}

static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* CPUs the group's ranks may run on together (the union of the masks they
 * published at the rendezvous).  Ranks bound one per core (by the cpu
 * device, mpirun, taskset) each see one CPU, yet do not share any. */
static int group_cpus(dt_comm_t *c)
{
    int n = 0;
    for (int w = 0; w < SHM_CPU_WORDS; w++) {
        uint64_t u = 0;
        for (int p = 0; p < c->size; p++)
            u |= c->ranks[p].cpus[w];
        n += __builtin_popcountll(u);
    }
    return n;
}

static int shm_init(const dt_host_v1_t *host, const dt_comm_init_v1_t *in, dt_comm_t **out)
{
    dt_comm_init_v1_t args;
    int rc = dt_comm_check_init(host, in, out, &args);
    if (rc != DT_OK)
        return rc;
    const dt_comm_init_v1_t *a = &args;
    if (!a->job_id || !shm_valid_job_id(a->job_id))
        return shm_bad_job_id(host, "init", a->job_id);
    if (a->job_secret && !a->job_secret[0])
        return host->set_error(host, DT_ERR_INVALID, "init: job_secret is empty (NULL "
                               "means none)");
    /* shared memory reaches the ranks of one machine only: ranks on other
     * nodes would never see our segments, and "nodes" that do share them
     * (namespaces of one host) must say so, or a test of several nodes
     * passes by a path no real cluster has */
    if (a->local_size > 0 && a->local_size < a->size) {
        int share = 0;
        int st = dt_cfg_bool(host, "nodes_share_memory", &share);
        if (st != DT_OK)
            return st;
        if (!share)
            return host->set_error(
                host, DT_ERR_CONFIG,
                "init: the job spans several nodes (%d of its %d ranks on this one): shared "
                "memory reaches only the ranks of one machine; pick a communicator that "
                "crosses nodes ([run] comm), or set shm.nodes_share_memory = true if every "
                "node is on this machine and shares its /dev/shm",
                (int)a->local_size, (int)a->size);
    }
    int64_t slot, spin;
    int sym;
    int st = dt_cfg_int(host, "slot_bytes", &slot);
    if (st == DT_OK)
        st = dt_cfg_int(host, "spin_us", &spin);
    if (st == DT_OK)
        st = dt_cfg_bool(host, "symmetric", &sym);
    if (st != DT_OK)
        return st;

    if ((st = dt_comm_check_host_memory(host, a, "shm")) != DT_OK)
        return st;
    dt_device_t *dev = a->dev;

    shm_job_t *job = calloc(1, sizeof *job);
    dt_comm_t *c = comm_alloc(host, a->rank, a->size);
    if (!job || !c) {
        free(job);
        comm_free(c);
        return host->set_error(host, DT_ERR_NOMEM, "init: out of memory");
    }
    atomic_init(&job->refs, 1);
    job->world_rank = a->rank;
    job->world_size = a->size;
    snprintf(job->job_id, sizeof job->job_id, "%s", a->job_id);
    if (a->job_secret) {
        job->has_secret = 1;
        shm_secret_key(a->job_secret, job->secret_key);
    }

    c->sym_enabled = sym;
    c->job = job;
    c->is_world = 1;
    c->timeout_ms = a->timeout_ms < SHM_TIMEOUT_MAX_MS ? a->timeout_ms : SHM_TIMEOUT_MAX_MS;
    c->caller_one_cpu = usable_cpus() == 1;
    c->dev = dev;
    snprintf(c->gname, sizeof c->gname, "world");
    shm_world_name(c->name, sizeof c->name, a->job_id);
    for (int p = 0; p < c->size; p++)
        c->wranks[p] = p;

    uint64_t chunk, p2p;
    chunk_sizes(slot, c->size, &chunk, &p2p);
    char what[160];
    snprintf(what, sizeof what, "rendezvous for job '%s'", a->job_id);
    st = shm_rendezvous(c, what, chunk, p2p);
    if (st == DT_OK) {
        /* Spinning only pays when every rank has a CPU of its own. */
        job->oversubscribed = c->size > group_cpus(c);
        c->spin_ns = job->oversubscribed ? 0 : (uint64_t)spin * 1000ull;
        st = comm_start(c);
    }
    if (st != DT_OK) {
        if (c->hdr)
            shm_leave_failed(c);
        comm_free(c);
        job_unref(job);
        return st;
    }
    *out = c;
    return DT_OK;
}

/* A request nobody waited for, at finalize (the progress thread is gone). */
static void drop_req(void *ctx, dt_creq_t *r)
{
    (void)ctx;
    free(r); /* b is first: r is the whole request */
}

static void shm_finalize(dt_comm_t *c)
{
    if (!c)
        return;
    if (c->thread_started) {
        atomic_store(&c->stop, 1);
        shm_wake_progress(c);
        pthread_join(c->thread, NULL);
    }
    log_stats(c);
    shm_sym_free_all(c);
    /* Requests never waited for: nobody can wait for them any more. */
    int leaked = dt_creq_drop_live(&c->live, drop_req, NULL);
    if (leaked)
        c->host->log(c->host, DT_LOG_DEBUG, "group %s: finalize freed %d request(s) that "
                     "were never waited for", c->gname, leaked);
    if (c->hdr) {
        atomic_store(&c->ranks[c->rank].state, SHM_RANK_LEFT);
        uint32_t left = atomic_fetch_add(&c->hdr->detached, 1) + 1;
        uint32_t z = 0;
        /* Normally unlinked right after the rendezvous; last one out makes
         * sure. */
        if (left >= (uint32_t)c->size && atomic_compare_exchange_strong(&c->hdr->unlinked, &z, 1))
            shm_unlink(c->name);
        if (!c->is_world)
            munmap(c->base, c->bytes);
    }
    shm_job_t *job = c->job;
    comm_free(c);
    job_unref(job); /* the world mapping goes with the last group */
}

static int shm_split(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    if (!c)
        return DT_ERR_INVALID;
    const dt_host_v1_t *h = c->host;
    int st = dt_comm_split_check(h, c->gname, color, out);
    if (st != DT_OK)
        return st;
    dt_comm_split_t s;
    st = dt_comm_split_gather(h, shm_op_all_gather, c, c->gname, c->size, c->rank, color,
                              key, &s);
    uint32_t no = ++c->split_no; /* same on every rank: split is collective */
    if (st != DT_OK || color == DT_COMM_NO_COLOR)
        return st;
    const int n = s.size;
    dt_comm_t *g = comm_alloc(h, s.rank, n);
    if (!g) {
        dt_comm_split_free(&s);
        return h->set_error(h, DT_ERR_NOMEM, "split of group %s: out of memory", c->gname);
    }
    for (int i = 0; i < n; i++)
        g->wranks[i] = c->wranks[s.members[i]];
    dt_comm_split_free(&s);
    atomic_fetch_add(&c->job->refs, 1);
    g->job = c->job;
    g->is_world = 0;
    g->timeout_ms = c->timeout_ms;
    g->sym_enabled = c->sym_enabled;
    g->spin_ns = c->spin_ns;
    g->caller_one_cpu = usable_cpus() == 1;
    g->dev = c->dev;
    snprintf(g->gname, sizeof g->gname, "%.120s/g%uc%u", c->gname, no, (uint32_t)color);
    if (shm_split_name(g->name, sizeof g->name, c->name, no, color) < 0 ||
        strlen(g->name) > SHM_NAME_MAX) {
        st = h->set_error(h, DT_ERR_INVALID, "split of group %s: the segment name for "
                          "split %u color %d is too long (nested splits too deep, or a "
                          "long job id)", c->gname, no, (int)color);
        job_unref(g->job);
        comm_free(g);
        return st;
    }
    uint64_t chunk, p2p;
    chunk_sizes((int64_t)c->chunk * SHM_NBUF, n, &chunk, &p2p);
    char what[256];
    snprintf(what, sizeof what, "split of group %s (color %d): rendezvous of group %s",
             c->gname, (int)color, g->gname);
    st = shm_rendezvous(g, what, chunk, p2p);
    if (st == DT_OK)
        st = comm_start(g);
    if (st != DT_OK) {
        if (g->hdr)
            shm_leave_failed(g);
        job_unref(g->job);
        comm_free(g);
        return st;
    }
    *out = g;
    return DT_OK;
}

static int shm_abort(dt_comm_t *c, const char *reason)
{
    if (!c)
        return DT_ERR_INVALID;
    shm_publish_fail(c->job, SHM_FAIL_ABORT, c->job->world_rank, (int32_t)getpid(),
                     reason ? reason : "(no reason given)");
    /* Wake this group's sleepers now; other groups notice within a
     * sleep slice (SHM_SLICE_NS). */
    for (int p = 0; p < c->size; p++)
        shm_ring(c, p, SHM_SLEEP_IDLE);
    return DT_OK;
}

static const dt_comm_ops_v1_t shm_ops = {
    .info = DT_PLUGIN_INFO(COMM, dt_comm_ops_v1_t, "shm", "1.0.0",
                           "ranks on one machine through POSIX shared memory",
                           shm_keys),
    .init = shm_init,
    .finalize = shm_finalize,
    .rank_size = shm_op_rank_size,
    .all_reduce = shm_op_all_reduce,
    .reduce_scatter = shm_op_reduce_scatter,
    .all_gather = shm_op_all_gather,
    .broadcast = shm_op_broadcast,
    .reduce = shm_op_reduce,
    .send = shm_op_send,
    .recv = shm_op_recv,
    .barrier = shm_op_barrier,
    .wait = shm_op_wait,
    .split = shm_split,
    .abort = shm_abort,
    .test = shm_op_test,
    .cleanup_job = shm_cleanup_job,
    .sym_alloc = shm_sym_alloc,
    .sym_free = shm_sym_free,
    .sendrecv = shm_op_sendrecv,
};

DT_PLUGIN_ENTRY(comm, 1, dt_comm_ops_v1_t, &shm_ops)
