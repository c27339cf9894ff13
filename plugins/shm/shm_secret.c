/*
 * plugins/shm/shm_secret.c - the job secret's key and a segment's tag,
 * built from the shared SHA-256 and HMAC (plugins/common/sha256/sha256.h; see
 * shm_secret.h).
 */
#include "shm_secret.h"

#include <string.h>

void shm_secret_key(const char *secret, uint8_t key[SHM_SHA256_BYTES])
{
    dt_sha256(secret, strlen(secret), key);
}

void shm_secret_tag(const uint8_t key[SHM_SHA256_BYTES], const char *name,
                    const uint8_t salt[SHM_SALT_BYTES], uint8_t tag[SHM_SHA256_BYTES])
{
    static const char label[] = "dtrain-shm-secret"; /* with its NUL */
    const void *parts[3] = {label, name, salt};
    size_t sizes[3] = {sizeof label, strlen(name) + 1, SHM_SALT_BYTES};
    dt_hmac_sha256_parts(key, SHM_SHA256_BYTES, parts, sizes, 3, tag);
}
