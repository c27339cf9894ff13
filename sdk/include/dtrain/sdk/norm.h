/*
 * dtrain/sdk/norm.h - gradient norms: a sum of squares brought to the
 * host, and its sum across a group.
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

#ifdef __cplusplus
extern "C" {
#endif

/* *out = sum of x[i]^2 over (n) elements of `dtype`, in double, on the
 * host.  `slot` is device memory for one double (the caller's, reused each
 * step).  Blocking: synchronises stream `s`. */
int dt_norm_sumsq(const dt_host_v1_t *host, const dt_device_ops_v1_t *ops,
                  dt_device_t *dev, dt_stream_t *s, double *slot,
                  const void *x, int dtype, int64_t n, double *out);

/* *sumsq (in: this rank's part; out: the sum over the group), through an
 * all_reduce SUM of one f64 in device memory `slot`.  For strategies whose
 * ranks each own part of the gradient (ZeRO, FSDP, a replica whose ranks
 * each sum a different part); a rank must not add elements another rank
 * counts too.  Blocking. */
int dt_norm_allreduce(const dt_host_v1_t *host, const dt_comm_ops_v1_t *cops,
                      dt_comm_t *comm, const dt_device_ops_v1_t *ops,
                      dt_device_t *dev, dt_stream_t *s, double *slot,
                      double *sumsq);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_NORM_H */
