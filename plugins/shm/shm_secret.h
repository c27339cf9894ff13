/*
 * plugins/shm/shm_secret.h - the job secret's keyed hash (shm_secret.c):
 * what a segment's creator stores so that a joiner can prove it holds the
 * same secret, without the secret itself ever being written to shared
 * memory.
 *
 * The secret is reduced once to a key, SHA-256(secret), kept in process
 * memory only.  A segment stores a random salt and the tag
 * HMAC-SHA256(key, "dtrain-shm-secret\0" <segment name> "\0" <salt>);
 * a joiner recomputes the tag with its own key and compares in constant
 * time.  The tag is bound to the segment's name and salt, so one copied
 * from another segment does not fit.
 *
 * Nothing here knows about groups or segments beyond those bytes.
 */
#ifndef DT_SHM_SECRET_H
#define DT_SHM_SECRET_H

#include <stddef.h>
#include <stdint.h>

#include "common/sha256/sha256.h"

#define SHM_SHA256_BYTES DT_SHA256_BYTES
#define SHM_SALT_BYTES 16

/* The key a secret is reduced to: SHA-256 of its bytes (the NUL excluded). */
void shm_secret_key(const char *secret, uint8_t key[SHM_SHA256_BYTES]);

/* The tag a segment named `name` ("/dtrain-...") with `salt` stores for
 * `key` (see above). */
void shm_secret_tag(const uint8_t key[SHM_SHA256_BYTES], const char *name,
                    const uint8_t salt[SHM_SALT_BYTES],
                    uint8_t tag[SHM_SHA256_BYTES]);

#endif /* DT_SHM_SECRET_H */
