/*
 * dtrain/sdk/buckets.h - units grouped for one collective each: ddp's
 * gradient buckets, ZeRO's reduction buckets.  Pure arithmetic.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Part of the SDK helper library (dtrain/sdk_helpers.h says how to link
 * it and the conventions every helper follows).
 */
#ifndef DTRAIN_SDK_BUCKETS_H
#define DTRAIN_SDK_BUCKETS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_bucket_span {
    uint32_t unit_lo;  /* the bucket holds units [unit_lo, unit_hi] */
    uint32_t unit_hi;
    uint64_t bytes;    /* sum of unit_bytes over its units */
} dt_bucket_span_t;

/* Assign units to buckets in BACKWARD order (the last unit first, the order
 * gradients complete): walking u = n_units-1 .. 0, a unit joins the current
 * bucket unless that would take a non-empty bucket past `cap_bytes`, then a
 * new bucket starts.  A unit larger than the cap gets a bucket of its own;
 * units are never split.  So bucket 0 holds the last units, and every bucket
 * is a contiguous run of units (a contiguous span of a flat layout).
 * `out` has room for n_units spans; `bucket_of_unit` (n_units, may be NULL)
 * receives each unit's bucket.  Returns the number of buckets (0 when
 * n_units == 0). */
uint32_t dt_bucket_plan(const uint64_t *unit_bytes, uint32_t n_units,
                        uint64_t cap_bytes, dt_bucket_span_t *out,
                        uint32_t *bucket_of_unit);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_BUCKETS_H */
