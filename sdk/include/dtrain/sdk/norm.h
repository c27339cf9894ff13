/*
 * dtrain/sdk/norm.h - gradient norms: a sum of squares brought to the
 * host, its sum across a group, and a plan of the parts a rank sums.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Part of the SDK helper library (dtrain/sdk_helpers.h says how to link
 * it and the conventions every helper follows).
 */
#ifndef DTRAIN_SDK_NORM_H
#define DTRAIN_SDK_NORM_H

#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/device.h"
#include "dtrain/host.h"
#include "dtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* *out = sum of x[i]^2 over (n) elements of `dtype`, in double, on the
 * host.  `slot` is device memory for one double (the caller's, reused each
 * step).  Blocking: synchronises stream `s`. */
int dt_norm_sumsq(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s, double *slot,
                  const void *x, int dtype, int64_t n, double *out);

/* *sumsq (in: this rank's part; out: the sum over the group), through an
 * all_reduce SUM of one f64 in device memory `slot`.  For strategies whose
 * ranks each own part of the gradient (ZeRO, FSDP, a replica whose ranks
 * each sum a different part); a rank must not add elements another rank
 * counts too.  Blocking. */
int dt_norm_allreduce(const dt_host_v1_t *host, dt_comm_t *comm, dt_device_t *dev, dt_stream_t *s,
                      double *slot, double *sumsq);

/* ------------------------------------------------------------------------
 * A norm plan: the parts of a gradient buffer whose sums of squares make
 * this rank's share of the global norm, each less the elements in it that
 * another rank counts (skip ranges inside the part).  Built once at init
 * (dt_dp_norm_plan_add, dtrain/sdk/dp.h, knows which elements: a pipeline
 * stage's COPY units, tensor-parallel duplicates); every step is then one
 * loop (dt_norm_plan_sumsq).  Offsets are elements of the buffer.
 * --------------------------------------------------------------------- */
typedef struct dt_norm_part {
    dt_range_t sum;             /* the elements summed */
    uint32_t skip_lo, n_skip;   /* its entries of skip[]: taken off again */
} dt_norm_part_t;

typedef struct dt_norm_plan {
    dt_norm_part_t *parts;      /* in buffer order */
    dt_range_t *skip;           /* every part's skip ranges, in order */
    uint32_t n_parts, n_skip;
    uint32_t cap_parts, cap_skip;
} dt_norm_plan_t;

/* Append a part summing `sum`, then (dt_norm_plan_skip) its skip ranges.
 * Tables come from host->alloc (DT_ERR_NOMEM). */
int dt_norm_plan_part(const dt_host_v1_t *host, dt_norm_plan_t *p, dt_range_t sum);
int dt_norm_plan_skip(const dt_host_v1_t *host, dt_norm_plan_t *p, dt_range_t r);
void dt_norm_plan_free(const dt_host_v1_t *host, dt_norm_plan_t *p);

/* *out = the sum over the parts of `plan` of (the part's sum of squares
 * less its skip ranges', never below 0; NaN and Inf pass), each a
 * dt_norm_sumsq over f32 `x` (device) in plan order.  A plan of one part
 * without skips gives exactly dt_norm_sumsq over that part. */
int dt_norm_plan_sumsq(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s, double *slot,
                       const float *x, const dt_norm_plan_t *plan, double *out);

/* ------------------------------------------------------------------------
 * The sum of squares on the host, with the cpu device's bits (its sumsq
 * kernel): the input is cut into blocks whose size depends on the total n
 * alone (dt_sumsq_block); within a block element i is added into running
 * sum (i - block start) % 8, the eight are added pairwise at the block's
 * end, and the block sums in block order.  For a gradient that lives in an
 * offload tier, read piece by piece: the result equals the kernel's over
 * the same n elements held in one buffer.
 * --------------------------------------------------------------------- */
#define DT_SUMSQ_MAX_BLOCKS 1024
#define DT_SUMSQ_MIN_BLOCK 65536

/* Elements per block of a sum of squares over n elements. */
static inline int64_t dt_sumsq_block(int64_t n)
{
    int64_t block = (n + DT_SUMSQ_MAX_BLOCKS - 1) / DT_SUMSQ_MAX_BLOCKS;
    return block < DT_SUMSQ_MIN_BLOCK ? DT_SUMSQ_MIN_BLOCK : block;
}

typedef struct dt_sumsq_run {
    double acc[8];   /* the current block's running sums */
    double total;    /* the finished blocks' sums, in order */
    int64_t block;   /* elements per block */
    int64_t pos;     /* elements of the current block seen */
} dt_sumsq_run_t;

/* Start a sum over `n` elements (fed in order by dt_sumsq_run_add). */
void dt_sumsq_run_init(dt_sumsq_run_t *r, int64_t n);
/* The next `k` elements (f32, host memory). */
void dt_sumsq_run_add(dt_sumsq_run_t *r, const float *x, uint64_t k);
/* The sum over every element fed. */
double dt_sumsq_run_end(dt_sumsq_run_t *r);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_NORM_H */
