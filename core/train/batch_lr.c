/*
 * core/train/batch_lr.c - the two pure functions of a run's arithmetic
 * (batch_lr.h): the learning rate at a step, and micro x accumulation x
 * data-parallel size = global batch.  A leaf: the checkpoint code, the
 * planner and the preflight use them without depending on the loop.
 */
#include "train/batch_lr.h"

#include <math.h>

#include "util/error.h"

double dt_lr_at(int64_t step, int64_t steps, int64_t warmup, double lr, double min_lr,
                dt_lr_decay_t decay)
{
    if (warmup > 0 && step <= warmup)
        return lr * (double)step / (double)warmup;
    if (decay == DT_DECAY_CONSTANT || steps <= warmup)
        return lr;
    double p = (double)(step - warmup) / (double)(steps - warmup);
    if (p > 1)
        p = 1;
    if (decay == DT_DECAY_LINEAR)
        return lr - (lr - min_lr) * p;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * p));
}

int dt_batch_resolve(const char *cfg_path, int64_t micro, int64_t *accum, int64_t *global,
                     int64_t dp)
{
    int64_t per = micro * dp;
    if (*accum == 0 && *global == 0) {
        *accum = 1;
        *global = per;
    } else if (*accum == 0) {
        if (*global % per != 0)
            return dt_err_set(DT_ERR_CONFIG,
                              "%s: [train] global_batch = %lld is not a multiple of "
                              "micro_batch (%lld) x data-parallel size (%lld) = %lld; the "
                              "number of accumulation steps would not be whole",
                              cfg_path, (long long)*global, (long long)micro, (long long)dp,
                              (long long)per);
        *accum = *global / per;
    } else if (*global == 0) {
        *global = per * *accum;
    } else if (per * *accum != *global) {
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: [train] micro_batch (%lld) x grad_accum (%lld) x data-parallel "
                          "size (%lld) = %lld, but global_batch = %lld; give any two and the "
                          "third is derived",
                          cfg_path, (long long)micro, (long long)*accum, (long long)dp,
                          (long long)(per * *accum), (long long)*global);
    }
    return DT_OK;
}
