/*
 * dtrain/sdk/hash.h - are the bytes the same on every rank?  A 64-bit
 * content hash of device memory, and a collective comparison of hashes
 * that needs nothing but f32 MAX/MIN all-reduces (which every communicator
 * has; 64-bit integer reductions are not guaranteed).
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Part of the SDK helper library (dtrain/sdk_helpers.h says how to link
 * it and the conventions every helper follows).
 */
#ifndef DTRAIN_SDK_HASH_H
#define DTRAIN_SDK_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/device.h"
#include "dtrain/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* FNV-1a, 64-bit, over 32-bit little-endian words (bytes % 4 trailing bytes
 * one at a time).  Every step is a bijection of the state for a fixed word,
 * so two inputs of the same length differing in ONE word always hash
 * differently.  Incremental: chunks must be multiples of 4 bytes except the
 * last.  Not cryptographic. */
#define DT_HASH64_INIT 0xcbf29ce484222325ull
uint64_t dt_hash64_update(uint64_t h, const void *p, size_t bytes);

/* Hash `bytes` of device memory `x` (continuing from *h), copying through
 * host memory `staging` (`staging_bytes`, >= 8) chunk by chunk on stream
 * `s`.  Blocking. */
int dt_hash_device(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s, const void *x,
                   uint64_t bytes, void *staging, uint64_t staging_bytes,
                   uint64_t *h);

/* Collective over `comm`: do all ranks hold the same `hashes` (n)?  Each
 * hash travels as four 16-bit fields, exact in f32, through one all_reduce
 * MAX and one MIN; a field whose MAX != MIN differs somewhere.  *first_diff
 * = the first index that differs on some rank, or n when all agree (the
 * same answer on every rank).  Scratch comes from dev alloc / host alloc
 * (DT_TAG_OTHER) and is freed before return.  Blocking. */
int dt_replica_check(const dt_host_v1_t *host, dt_comm_t *comm, dt_device_t *dev, dt_stream_t *s,
                     const uint64_t *hashes, uint32_t n, uint32_t *first_diff);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_HASH_H */
