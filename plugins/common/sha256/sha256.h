/*
 * plugins/common/sha256/sha256.h - SHA-256, HMAC-SHA256 and a constant-time
 * compare: what a job secret's proof is built from (the core's TCP
 * rendezvous, the shm communicator's segment tags), so a secret is never
 * sent or stored, only a keyed hash bound to something fresh.
 *
 * In-tree only, not installed: dtrain_common_sha256, the static,
 * hidden-visibility library the core (the rendezvous) and the shm, tcp and
 * nccl communicators link (plugins/common/CMakeLists.txt).  Not fast, and
 * not meant for bulk data.
 */
#ifndef DT_COMMON_SHA256_H
#define DT_COMMON_SHA256_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DT_SHA256_BYTES 32

/* out = SHA-256 of the (bytes) at p (FIPS 180-4). */
void dt_sha256(const void *p, size_t bytes, uint8_t out[DT_SHA256_BYTES]);

/* out = HMAC-SHA256 (RFC 2104) of the (msg_bytes) at msg under the
 * (key_bytes) at key. */
void dt_hmac_sha256(const void *key, size_t key_bytes, const void *msg,
                    size_t msg_bytes, uint8_t out[DT_SHA256_BYTES]);

/* The same over the concatenation of n parts (parts[i], sizes[i] bytes),
 * without copying them together. */
void dt_hmac_sha256_parts(const void *key, size_t key_bytes,
                          const void *const *parts, const size_t *sizes, int n,
                          uint8_t out[DT_SHA256_BYTES]);

/* 1 when the (n) bytes at a and b are equal; its time does not depend on
 * where they differ. */
int dt_equal_ct(const void *a, const void *b, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* DT_COMMON_SHA256_H */
