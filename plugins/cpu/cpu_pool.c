/*
 * plugins/cpu/cpu_pool.c - the cpu device's worker threads (see cpu_pool.h).
 *
 * A job is published by bumping a generation counter under the mutex and
 * broadcasting; workers that are still spinning see the new generation
 * without a syscall.  Completion is an atomic countdown over EVERY worker,
 * including those with no chunk: otherwise a late worker could read the
 * next job's fields while the caller is still writing them.  The last
 * worker signals the caller under the mutex so the wakeup cannot be lost.
 */
#include "cpu_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* How many pause instructions a worker polls for the next job before it
 * sleeps (some tens of microseconds): enough to catch back-to-back kernels
 * of one layer without a futex round trip, short enough not to burn a core
 * that another rank needs. */
#define CPU_POOL_SPIN 1000

typedef struct cpu_worker {
    cpu_pool_t *pool;
    int tid;
    pthread_t thread;
} cpu_worker_t;

struct cpu_pool {
    int threads;
    cpu_worker_t *workers; /* [threads]; entry 0 is the caller, no thread */
    int started;           /* pthreads actually started */

    pthread_mutex_t mu;
    pthread_cond_t wake; /* workers wait here for a new generation */
    pthread_cond_t done; /* the caller waits here for pending == 0 */
    _Atomic uint64_t gen;
    _Atomic int stop;

    /* The current job (written before gen is bumped). */
    cpu_task_fn fn;
    void *ctx;
    int64_t n;
    int chunks;
    _Atomic int pending; /* workers 1..threads-1 not yet done with the job */
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_chunk(cpu_pool_t *p, int i)
{
    int64_t b = p->n * i / p->chunks;
    int64_t e = p->n * (i + 1) / p->chunks;
    if (e > b)
        p->fn(p->ctx, b, e, i);
}

static void *worker_main(void *arg)
{
    cpu_worker_t *w = arg;
    cpu_pool_t *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int spin = 0; g == seen && spin < CPU_POOL_SPIN; spin++) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed))
                break;
            cpu_relax();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        if (w->tid < p->chunks)
            run_chunk(p, w->tid);
        if (atomic_fetch_sub_explicit(&p->pending, 1,
                                      memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int cpu_pool_create(int threads, cpu_pool_t **out)
{
    *out = NULL;
    if (threads < 1)
        return EINVAL;
    cpu_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return ENOMEM;
    p->threads = threads;
    p->workers = calloc((size_t)threads, sizeof *p->workers);
    if (!p->workers) {
        free(p);
        return ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->pending, 0);
    for (int i = 0; i < threads; i++) {
        p->workers[i].pool = p;
        p->workers[i].tid = i;
    }
    for (int i = 1; i < threads; i++) {
        int rc = pthread_create(&p->workers[i].thread, NULL, worker_main,
                                &p->workers[i]);
        if (rc != 0) {
            cpu_pool_destroy(p);
            return rc;
        }
        p->started = i;
    }
    *out = p;
    return 0;
}

void cpu_pool_destroy(cpu_pool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->started; i++)
        pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

int cpu_pool_threads(const cpu_pool_t *p) { return p->threads; }

void cpu_pool_run(cpu_pool_t *p, int64_t n, int64_t grain, cpu_task_fn fn,
                  void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int64_t k = (n + grain - 1) / grain;
    if (k > p->threads)
        k = p->threads;
    if (k <= 1) { /* not worth waking anyone */
        fn(ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    p->chunks = (int)k;
    atomic_store_explicit(&p->pending, p->threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    run_chunk(p, 0);

    for (int spin = 0; spin < CPU_POOL_SPIN; spin++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0)
            return;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
