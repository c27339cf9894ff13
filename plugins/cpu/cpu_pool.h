/*
 * plugins/cpu/cpu_pool.h - a small fixed pthread pool with one parallel_for.
 *
 * The calling thread is worker 0, so a pool of `n` threads starts n - 1
 * pthreads.  Work is split statically: chunk i of k covers
 * [i*n/k, (i+1)*n/k), so which element lands in which chunk depends only on
 * the range and the chunk count, and every element-wise kernel gives the
 * same bits at any thread count.  Idle workers spin briefly and then sleep
 * on a condition variable: ranks on one machine share few cores, and a
 * worker that spins forever steals them from the other ranks.
 *
 * Not reentrant: one cpu_pool_run at a time per pool (the device holds its
 * kernel lock around every kernel).
 */
#ifndef DT_CPU_POOL_H
#define DT_CPU_POOL_H

#include <stdint.h>

typedef struct cpu_pool cpu_pool_t;

/* Runs elements [begin, end) of a parallel_for; `tid` in [0, threads) is
 * the worker running it (index for per-thread scratch). */
typedef void (*cpu_task_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/* Start a pool of `threads` >= 1 workers (the caller counts as one).
 * Returns 0, or an errno value from pthread_create / allocation. */
int cpu_pool_create(int threads, cpu_pool_t **out);
/* Stop and join the workers.  NULL is a no-op. */
void cpu_pool_destroy(cpu_pool_t *p);
int cpu_pool_threads(const cpu_pool_t *p);

/* Call fn over [0, n) split into at most `threads` chunks of at least
 * `grain` elements each (grain >= 1), and return when all are done. */
void cpu_pool_run(cpu_pool_t *p, int64_t n, int64_t grain, cpu_task_fn fn,
                  void *ctx);

#endif /* DT_CPU_POOL_H */
