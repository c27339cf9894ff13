/*
 * plugins/mpi/mpi_comm.c - the `mpi` communicator plugin: ranks anywhere
 * MPI reaches (one machine or many), each rank one MPI process started by
 * mpirun (or srun with PMIx).
 *
 * This file holds the plugin table and config keys, MPI's own lifecycle
 * and the group lifecycle: init, split, abort, finalize.  The operations
 * and their waits are in mpi_ops.c, the arithmetic in mpi_reduce.c.
 *
 * MPI itself: init calls MPI_Init_thread asking for MPI_THREAD_MULTIPLE
 * (comm.h lets different groups run on different threads, and abort come
 * from any thread) unless the application initialised MPI already; with
 * MPI_THREAD_SERIALIZED the plugin serialises its own MPI calls under one
 * lock, below that it refuses.  The finalize of the job's last group calls
 * MPI_Finalize when the plugin initialised MPI, and not when an operation
 * was abandoned (MPI would wait for it).  MPI allows one MPI_Init per
 * process, so a process can join one mpi job in its life; the plugin and
 * libmpi stay loaded from the first init on (stay_resident).
 *
 * Progress: Open MPI moves a nonblocking collective only inside MPI calls;
 * while any operation of the job is in flight a thread of the plugin
 * calls into MPI every [mpi] progress_us (an MPI_Iprobe on the control
 * communicator, which runs MPI's progress engine without touching the
 * callers' requests), and sleeps on a condition variable otherwise.
 *
 * Every communicator the plugin creates (a duplicate of MPI_COMM_WORLD
 * per world group, MPI_Comm_split for splits) has MPI_ERRORS_RETURN: an
 * MPI error becomes a status and a message, never an exit.  Blocking MPI
 * calls that wait for peers are avoided or preceded by a bounded
 * nonblocking one: init duplicates the world with MPI_Comm_idup and meets
 * the others in MPI_Ibarrier, split gathers colours with MPI_Iallgather
 * (bounded like any collective) before MPI_Comm_split.
 *
 * Abort: a rank that aborts sends its reason to every world rank on a
 * control communicator of its own (a second duplicate of the world where
 * each rank keeps one receive posted); every wait polls it, so all ranks
 * fail promptly with DT_ERR_REMOTE "rank 1 aborted: <reason>" and exit
 * themselves.  Only when [mpi] abort_job is set does abort then end the
 * whole job with MPI_Abort, after a grace of MPI_ABORT_GRACE_NS in which
 * the peers report the reason (for ranks that may be blocked inside MPI
 * calls of other code, which no wait of ours would reach).
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/comm/comm_split.h"
#include "dtrain/sdk/cfg.h"
#include "mpi_internal.h"

static const dt_config_key_t mpi_keys[] = {
    {.name = "spin_us", .type = DT_CFG_INT, .def = "50", .min = 0, .max = (double)MPI_SPIN_MAX,
     .choices = NULL,
     .doc = "microseconds a wait polls MPI_Test back to back before it yields the CPU "
            "between polls (after 10 ms of waiting it naps between them; MPI's nonblocking "
            "collectives progress only inside MPI calls)"},
    {.name = "progress_us", .type = DT_CFG_INT, .def = "100", .min = 0,
     .max = (double)MPI_PROGRESS_MAX, .choices = NULL,
     .doc = "microseconds between a progress thread's calls into MPI while operations "
            "are in flight, so they move while the caller computes (0: no thread; "
            "operations then move only inside the plugin's calls)"},
    {.name = "ring_bytes", .type = DT_CFG_INT, .def = "524288", .min = 0,
     .max = (double)MPI_RING_MAX, .choices = NULL,
     .doc = "all-reduces of at least this many bytes run Open MPI's nonblocking ring "
            "(libnbc's coll_libnbc_iallreduce_algorithm = 1, set through MPI_T unless you "
            "set it), smaller ones libnbc's own choice; 0: every one libnbc's choice"},
    {.name = "abort_job", .type = DT_CFG_BOOL, .def = "false", .min = 0, .max = 0,
     .choices = NULL,
     .doc = "abort also ends the whole job with MPI_Abort, 1 s after telling every rank "
            "why (off: the ranks' waits fail with the reason and they exit themselves)"},
};

/* ---- MPI, once per process ----------------------------------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER; /* serialised MPI calls */
static pthread_mutex_t g_life = PTHREAD_MUTEX_INITIALIZER; /* init / finalize */
static int g_serialise;   /* MPI gave MPI_THREAD_SERIALIZED only */
static int g_we_init;     /* the plugin called MPI_Init_thread */
static int g_setup;       /* reduce ops created */
static int g_jobs;        /* live jobs of this process */

void mpic_lock(void)
{
    if (g_serialise)
        pthread_mutex_lock(&g_lock);
}

void mpic_unlock(void)
{
    if (g_serialise)
        pthread_mutex_unlock(&g_lock);
}

static const char *level_name(int level)
{
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown level";
    }
}

/* Keep this plugin and libmpi loaded for the life of the process once MPI
 * is in use: MPI cannot be initialised twice, MPI holds pointers to the
 * plugin's reduction functions, and libmpi becomes RTLD_GLOBAL so the
 * components Open MPI dlopens find its symbols whatever way the loader
 * opened us (RTLD_LOCAL).  Best effort: a failure here only matters at
 * unload. */
static void stay_resident(void)
{
    static const void *const anchors[2] = {(const void *)&mpic_lock,
                                           (const void *)&MPI_Init_thread};
    for (int i = 0; i < 2; i++) {
        Dl_info info;
        if (dladdr(anchors[i], &info) && info.dli_fname)
            dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE |
                                       (i ? RTLD_GLOBAL : RTLD_LOCAL));
    }
}

/* Initialise MPI if nobody did, check the thread level, create the user
 * ops.  Under g_life. */
static int mpi_up(const dt_host_v1_t *h)
{
    int inited = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
    stay_resident();
    MPI_Finalized(&finalized);
    if (finalized)
        return h->set_error(h, DT_ERR_UNSUPPORTED,
                            "init: MPI was finalized earlier in this process, and MPI allows "
                            "one MPI_Init per process (join one mpi job per process)");
    MPI_Initialized(&inited);
    if (!inited) {
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS)
            return h->set_error(h, DT_ERR_SYSTEM, "init: MPI_Init_thread failed (error %d)",
                                rc);
        g_we_init = 1;
        /* ours: errors are statuses, never an exit */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED)
        return h->set_error(h, DT_ERR_UNSUPPORTED,
                            "init: MPI runs at %s; the mpi communicator needs "
                            "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (its groups may be "
                            "driven from several threads)%s", level_name(provided),
                            g_we_init ? "" : ": initialise MPI with one of them");
    g_serialise = provided < MPI_THREAD_MULTIPLE;
    if (!g_setup) {
        mpic_lock();
        int rc = mpic_reduce_setup();
        mpic_unlock();
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING + 16];
            mpic_err_text(rc, text, sizeof text);
            return h->set_error(h, DT_ERR_SYSTEM, "init: cannot create the bf16/f16 "
                                "reduction ops: %s", text);
        }
        g_setup = 1;
        mpic_tune_up(h);
    }
    return DT_OK;
}

/* The job's last group is gone: finalize MPI when it is ours to, unless
 * `why_not` says why not (MPI_Finalize waits for every rank and for
 * operations in flight; a failed job's peers may never come). */
static void mpi_down(const dt_host_v1_t *h, const char *why_not)
{
    pthread_mutex_lock(&g_life);
    if (--g_jobs == 0 && g_we_init) {
        if (why_not) {
            h->log(h, DT_LOG_WARN, "MPI is not finalized: %s", why_not);
        } else {
            mpic_lock();
            mpic_tune_down();
            mpic_reduce_teardown();
            g_setup = 0;
            MPI_Finalize();
            mpic_unlock();
        }
    }
    pthread_mutex_unlock(&g_life);
}

/* ---- the job's failure ----------------------------------------------------- */

static void publish_fail(mpic_job_t *job, int32_t world_rank, const char *reason)
{
    int expect = 0;
    if (!atomic_compare_exchange_strong(&job->failed, &expect, 1))
        return;
    job->fail_rank = world_rank;
    snprintf(job->fail_reason, sizeof job->fail_reason, "%s", reason);
    atomic_store(&job->failed, 2);
}

int mpic_job_failure(mpic_job_t *job, int is_world, char *buf, size_t cap)
{
    /* another thread polling it now will publish what it finds */
    if (atomic_load(&job->failed) != 2 && pthread_mutex_trylock(&job->poll_lock) == 0) {
        int flag = 0;
        MPI_Status status;
        if (job->abort_req != MPI_REQUEST_NULL) {
            mpic_lock();
            int rc = MPI_Test(&job->abort_req, &flag, &status);
            mpic_unlock();
            flag = rc == MPI_SUCCESS && flag;
        }
        if (flag) {
            int n = 0;
            MPI_Get_count(&status, MPI_CHAR, &n);
            if (n < 0 || n >= MPI_ABORT_MSG)
                n = MPI_ABORT_MSG - 1;
            job->abort_buf[n] = '\0';
            publish_fail(job, status.MPI_SOURCE, job->abort_buf);
        }
        pthread_mutex_unlock(&job->poll_lock);
    }
    if (atomic_load(&job->failed) != 2)
        return DT_OK;
    snprintf(buf, cap, "%s %d aborted: %s", is_world ? "rank" : "world rank",
             (int)job->fail_rank, job->fail_reason);
    return DT_ERR_REMOTE;
}

/* ---- groups ---------------------------------------------------------------- */

/* Poll an MPI request (a communicator duplicate, a barrier) for at most
 * timeout_ms.  1: done, 0: timed out, < 0: -(MPI error code). */
static int poll_request(MPI_Request *rq, int64_t timeout_ms)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int flag = 0;
        mpic_lock();
        int rc = MPI_Test(rq, &flag, MPI_STATUS_IGNORE);
        mpic_unlock();
        if (rc != MPI_SUCCESS)
            return rc > 0 ? -rc : -1;
        if (flag)
            return 1;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t ms = (int64_t)(now.tv_sec - t0.tv_sec) * 1000 +
                     (now.tv_nsec - t0.tv_nsec) / 1000000;
        if (ms >= timeout_ms)
            return 0;
        struct timespec nap = {0, 100000};
        nanosleep(&nap, NULL);
    }
}

/* ---- the progress thread ------------------------------------------------- */

void mpic_inflight_add(mpic_job_t *job)
{
    if (atomic_fetch_add(&job->inflight, 1) == 0 && job->prog_started) {
        pthread_mutex_lock(&job->prog_mu);
        pthread_cond_signal(&job->prog_cv);
        pthread_mutex_unlock(&job->prog_mu);
    }
}

void mpic_inflight_sub(mpic_job_t *job)
{
    atomic_fetch_sub(&job->inflight, 1);
}

static void *progress_main(void *arg)
{
    mpic_job_t *job = arg;
    struct timespec nap = {(time_t)(job->progress_ns / 1000000000),
                           (long)(job->progress_ns % 1000000000)};
    for (;;) {
        pthread_mutex_lock(&job->prog_mu);
        while (!atomic_load(&job->prog_stop) && atomic_load(&job->inflight) == 0)
            pthread_cond_wait(&job->prog_cv, &job->prog_mu);
        pthread_mutex_unlock(&job->prog_mu);
        if (atomic_load(&job->prog_stop))
            break;
        if (atomic_load(&job->spinning) == 0) {
            int flag = 0;
            mpic_lock();
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_TAG_PROGRESS, job->ctrl, &flag, MPI_STATUS_IGNORE);
            mpic_unlock();
        }
        nanosleep(&nap, NULL);
    }
    return NULL;
}

static int start_progress(const dt_host_v1_t *h, mpic_job_t *job)
{
    if (job->progress_ns <= 0)
        return DT_OK;
    sigset_t all, old;
    sigfillset(&all);
    /* signals go to the application's threads, never to ours */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&job->prog, NULL, progress_main, job);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err)
        return h->set_error(h, DT_ERR_SYSTEM, "init: cannot start the progress thread: %s",
                            strerror(err));
    job->prog_started = 1;
    pthread_setname_np(job->prog, "dtrain-mpi");
    return DT_OK;
}

static void stop_progress(mpic_job_t *job)
{
    if (!job->prog_started)
        return;
    pthread_mutex_lock(&job->prog_mu);
    atomic_store(&job->prog_stop, 1);
    pthread_cond_broadcast(&job->prog_cv);
    pthread_mutex_unlock(&job->prog_mu);
    pthread_join(job->prog, NULL);
    job->prog_started = 0;
}

static void job_unref(const dt_host_v1_t *h, mpic_job_t *job)
{
    if (!job || atomic_fetch_sub(&job->refs, 1) != 1)
        return;
    stop_progress(job);
    const char *why_not = NULL;
    if (atomic_load(&job->abandoned))
        why_not = "an operation that failed or timed out is still with MPI, and "
                  "MPI_Finalize would wait for it";
    else if (atomic_load(&job->failed) == 2)
        why_not = "the job failed (abort), and MPI_Finalize would wait for every rank";
    mpic_lock();
    if (job->abort_req != MPI_REQUEST_NULL) {
        /* a cancelled receive completes locally */
        MPI_Cancel(&job->abort_req);
        MPI_Wait(&job->abort_req, MPI_STATUS_IGNORE);
    }
    if (job->ctrl != MPI_COMM_NULL)
        MPI_Comm_free(&job->ctrl);
    mpic_unlock();
    pthread_mutex_destroy(&job->poll_lock);
    pthread_mutex_destroy(&job->prog_mu);
    pthread_cond_destroy(&job->prog_cv);
    free(job);
    mpi_down(h, why_not);
}

static void comm_free(dt_comm_t *c)
{
    if (!c)
        return;
    if (c->comm != MPI_COMM_NULL && !c->broken) {
        mpic_lock();
        MPI_Comm_free(&c->comm);
        mpic_unlock();
    }
    free(c->wranks);
    free(c);
}

/* Defined below; every handle this plugin makes starts with it. */
static const dt_comm_ops_v1_t mpi_ops;

static dt_comm_t *comm_alloc(const dt_host_v1_t *host, int32_t rank, int32_t size)
{
    dt_comm_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->host = host;
    c->ops = &mpi_ops;
    c->rank = rank;
    c->size = size;
    c->comm = MPI_COMM_NULL;
    c->wranks = calloc((size_t)size, sizeof *c->wranks);
    if (!c->wranks) {
        free(c);
        return NULL;
    }
    return c;
}

static int read_keys(const dt_host_v1_t *h, int64_t *spin, int64_t *progress, int64_t *ring,
                     int *abort_job)
{
    int st = dt_cfg_int(h, "spin_us", spin);
    if (st == DT_OK)
        st = dt_cfg_int(h, "progress_us", progress);
    if (st == DT_OK)
        st = dt_cfg_int(h, "ring_bytes", ring);
    if (st == DT_OK)
        st = dt_cfg_bool(h, "abort_job", abort_job);
    return st;
}

/* Duplicate the world (MPI_Comm_idup, bounded) with MPI_ERRORS_RETURN. */
static int dup_world(const dt_host_v1_t *h, int64_t timeout_ms, const char *what,
                     MPI_Comm *out)
{
    MPI_Request rq = MPI_REQUEST_NULL;
    mpic_lock();
    int rc = MPI_Comm_idup(MPI_COMM_WORLD, out, &rq);
    mpic_unlock();
    int done = rc == MPI_SUCCESS ? poll_request(&rq, timeout_ms) : -rc;
    if (done == 0)
        return h->set_error(h, DT_ERR_TIMEOUT, "init: %s: timed out after %.1f s waiting for "
                            "the other ranks of MPI_COMM_WORLD", what,
                            (double)timeout_ms / 1000.0);
    if (done < 0) {
        char text[MPI_MAX_ERROR_STRING + 16];
        mpic_err_text(-done, text, sizeof text);
        return h->set_error(h, DT_ERR_SYSTEM, "init: %s: MPI_Comm_idup failed: %s", what,
                            text);
    }
    mpic_lock();
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    mpic_unlock();
    return DT_OK;
}

static int mpi_init(const dt_host_v1_t *host, const dt_comm_init_v1_t *in, dt_comm_t **out)
{
    dt_comm_init_v1_t args;
    int rc = dt_comm_check_init(host, in, out, &args);
    if (rc != DT_OK)
        return rc;
    const dt_comm_init_v1_t *a = &args;
    int64_t spin, progress, ring;
    int abort_job;
    int st = read_keys(host, &spin, &progress, &ring, &abort_job);
    if (st == DT_OK)
        st = dt_comm_check_host_memory(host, a, "mpi");
    if (st != DT_OK)
        return st;
    int64_t timeout_ms = a->timeout_ms < MPI_TIMEOUT_MAX_MS ? a->timeout_ms : MPI_TIMEOUT_MAX_MS;

    pthread_mutex_lock(&g_life);
    st = mpi_up(host);
    if (st == DT_OK)
        g_jobs++;
    pthread_mutex_unlock(&g_life);
    if (st != DT_OK)
        return st;
    int wrank = -1, wsize = 0;
    mpic_lock();
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    mpic_unlock();
    if (wrank != a->rank || wsize != a->size) {
        st = host->set_error(host, DT_ERR_CONFIG,
                             "init: dtrain has this process as rank %d of %d, MPI_COMM_WORLD as "
                             "rank %d of %d: start every rank with mpirun (mpirun -np N "
                             "dtrain run|bench ...), one MPI process per rank",
                             (int)a->rank, (int)a->size, wrank, wsize);
        mpi_down(host, NULL);
        return st;
    }

    mpic_job_t *job = calloc(1, sizeof *job);
    dt_comm_t *c = comm_alloc(host, a->rank, a->size);
    if (!job || !c) {
        free(job);
        comm_free(c);
        mpi_down(host, NULL);
        return host->set_error(host, DT_ERR_NOMEM, "init: out of memory");
    }
    atomic_init(&job->refs, 1);
    pthread_mutex_init(&job->poll_lock, NULL);
    job->world_rank = a->rank;
    job->world_size = a->size;
    job->ctrl = MPI_COMM_NULL;
    job->abort_req = MPI_REQUEST_NULL;
    job->spin_ns = spin * 1000;
    job->progress_ns = progress * 1000;
    pthread_mutex_init(&job->prog_mu, NULL);
    pthread_cond_init(&job->prog_cv, NULL);
    job->mpi_abort = abort_job;
    job->ring_bytes = ring;
    c->job = job;
    c->is_world = 1;
    c->timeout_ms = timeout_ms;
    c->dev = a->dev;
    snprintf(c->gname, sizeof c->gname, "world");
    for (int p = 0; p < c->size; p++)
        c->wranks[p] = p;

    st = dup_world(host, timeout_ms, "duplicating MPI_COMM_WORLD", &c->comm);
    if (st == DT_OK)
        st = dup_world(host, timeout_ms, "the abort channel", &job->ctrl);
    if (st == DT_OK) {
        mpic_lock();
        rc = MPI_Irecv(job->abort_buf, MPI_ABORT_MSG, MPI_CHAR, MPI_ANY_SOURCE, MPI_TAG_ABORT,
                       job->ctrl, &job->abort_req);
        mpic_unlock();
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING + 16];
            mpic_err_text(rc, text, sizeof text);
            st = host->set_error(host, DT_ERR_SYSTEM, "init: the abort channel: MPI_Irecv "
                                 "failed: %s", text);
        }
    }
    if (st == DT_OK)
        st = start_progress(host, job);
    if (st == DT_OK)
        st = mpic_barrier(c, NULL); /* every rank is in, or the timeout names the op */
    c->coll_seq = 0;                /* users' collectives count from #1, as with shm */
    if (st != DT_OK) {
        comm_free(c);
        job_unref(host, job);
        return st;
    }
    host->log(host, DT_LOG_DEBUG, "joined group world as rank %d of %d through MPI (%s)",
              (int)c->rank, (int)c->size,
              g_serialise ? "MPI_THREAD_SERIALIZED, calls serialised" : "MPI_THREAD_MULTIPLE");
    *out = c;
    return DT_OK;
}

static void mpi_finalize(dt_comm_t *c)
{
    if (!c)
        return;
    const dt_host_v1_t *h = c->host;
    int unfinished = 0, n = mpic_drop_live(c, &unfinished);
    if (n)
        h->log(h, DT_LOG_DEBUG, "group %s: finalize freed %d request(s) that were never "
               "waited for%s", c->gname, n, unfinished ? " (some still with MPI)" : "");
    mpic_job_t *job = c->job;
    comm_free(c);
    job_unref(h, job);
}

static int mpi_split(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    if (!c)
        return DT_ERR_INVALID;
    const dt_host_v1_t *h = c->host;
    int st = dt_comm_split_check(h, c->gname, color, out);
    if (st != DT_OK)
        return st;
    /* bounded: every rank is here once this returns, so the blocking
     * MPI_Comm_split below only does its own exchange */
    dt_comm_split_t s;
    st = dt_comm_split_gather(h, mpic_all_gather, c, c->gname, c->size, c->rank, color, key,
                              &s);
    uint32_t no = ++c->split_no; /* same on every rank: split is collective */
    MPI_Comm nc = MPI_COMM_NULL;
    if (st == DT_OK) {
        mpic_lock();
        int rc = MPI_Comm_split(c->comm, color == DT_COMM_NO_COLOR ? MPI_UNDEFINED : color, key,
                                &nc);
        if (rc == MPI_SUCCESS && nc != MPI_COMM_NULL)
            MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
        mpic_unlock();
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING + 16];
            mpic_err_text(rc, text, sizeof text);
            st = h->set_error(h, DT_ERR_SYSTEM, "split of group %s (color %d): "
                              "MPI_Comm_split failed: %s", c->gname, (int)color, text);
        }
    }
    if (st != DT_OK || color == DT_COMM_NO_COLOR) {
        dt_comm_split_free(&s);
        return st;
    }
    const int n = s.size;
    int new_rank = -1, new_size = 0;
    mpic_lock();
    MPI_Comm_rank(nc, &new_rank);
    MPI_Comm_size(nc, &new_size);
    mpic_unlock();
    dt_comm_t *g = new_size == n ? comm_alloc(h, new_rank, n) : NULL;
    if (!g) {
        dt_comm_split_free(&s);
        mpic_lock();
        MPI_Comm_free(&nc);
        mpic_unlock();
        if (new_size != n)
            return h->set_error(h, DT_ERR_SYSTEM, "split of group %s (color %d): MPI made a "
                                "group of %d ranks, the colours say %d", c->gname, (int)color,
                                new_size, n);
        return h->set_error(h, DT_ERR_NOMEM, "split of group %s: out of memory", c->gname);
    }
    for (int i = 0; i < n; i++)
        g->wranks[i] = c->wranks[s.members[i]];
    dt_comm_split_free(&s);
    g->comm = nc;
    atomic_fetch_add(&c->job->refs, 1);
    g->job = c->job;
    g->is_world = 0;
    g->timeout_ms = c->timeout_ms;
    g->dev = c->dev;
    snprintf(g->gname, sizeof g->gname, "%.120s/g%uc%u", c->gname, no, (uint32_t)color);
    *out = g;
    return DT_OK;
}

static int mpi_abort(dt_comm_t *c, const char *reason)
{
    if (!c)
        return DT_ERR_INVALID;
    mpic_job_t *job = c->job;
    const char *why = reason ? reason : "(no reason given)";
    publish_fail(job, job->world_rank, why);
    char notice[MPI_ABORT_MSG];
    int len = snprintf(notice, sizeof notice, "%s", why);
    if (len < 0 || len >= (int)sizeof notice)
        len = (int)sizeof notice - 1;
    /* Eager-sized notices: MPI delivers them without this rank waiting.
     * Never waited for (MPI_Request_free lets MPI finish them). */
    static const char *volatile kept; /* the buffer must outlive the sends */
    char *copy = malloc((size_t)len + 1);
    if (copy) {
        memcpy(copy, notice, (size_t)len + 1);
        kept = copy;
    }
    mpic_lock();
    for (int p = 0; p < job->world_size && copy; p++) {
        if (p == job->world_rank)
            continue;
        MPI_Request rq;
        if (MPI_Isend(copy, len, MPI_CHAR, p, MPI_TAG_ABORT, job->ctrl, &rq) == MPI_SUCCESS)
            MPI_Request_free(&rq);
    }
    mpic_unlock();
    if (job->mpi_abort) {
        c->host->log(c->host, DT_LOG_ERROR, "ending the job with MPI_Abort ([mpi] abort_job "
                     "= true) in %.1f s: %s", (double)MPI_ABORT_GRACE_NS * 1e-9, why);
        /* the peers' waits poll for the notice every few ms: give them
         * the grace to report the reason before MPI_Abort ends them
         * (MPI progresses the sends meanwhile) */
        struct timespec t0, now, nap = {0, 1000000};
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do {
            int flag;
            mpic_lock();
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, job->ctrl, &flag, MPI_STATUS_IGNORE);
            mpic_unlock();
            nanosleep(&nap, NULL);
            clock_gettime(CLOCK_MONOTONIC, &now);
        } while ((uint64_t)(now.tv_sec - t0.tv_sec) * 1000000000ull + (uint64_t)now.tv_nsec -
                     (uint64_t)t0.tv_nsec < MPI_ABORT_GRACE_NS);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    (void)kept;
    return DT_OK;
}

static const dt_comm_ops_v1_t mpi_ops = {
    .info = DT_PLUGIN_INFO(COMM, dt_comm_ops_v1_t, "mpi", "1.0.0",
                           "ranks anywhere MPI reaches, through MPI's nonblocking collectives "
                           "(one MPI process per rank, started by mpirun)",
                           mpi_keys),
    .init = mpi_init,
    .finalize = mpi_finalize,
    .rank_size = mpic_rank_size,
    .all_reduce = mpic_all_reduce,
    .reduce_scatter = mpic_reduce_scatter,
    .all_gather = mpic_all_gather,
    .broadcast = mpic_broadcast,
    .reduce = mpic_reduce,
    .send = mpic_send,
    .recv = mpic_recv,
    .barrier = mpic_barrier,
    .wait = mpic_wait,
    .split = mpi_split,
    .abort = mpi_abort,
    .test = mpic_test,
    .sendrecv = mpic_sendrecv,
};

DT_PLUGIN_ENTRY(comm, 1, dt_comm_ops_v1_t, &mpi_ops)
