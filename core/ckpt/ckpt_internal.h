/*
 * core/ckpt/ckpt_internal.h - what the four files behind ckpt_io.h share:
 * the names inside a checkpoint directory, the rule that segments tile an
 * entry, and exact JSON integers.  Internal to core/ckpt (ckpt_format.c,
 * ckpt_write.c, ckpt_dir.c, ckpt_read.c); everyone else uses ckpt_io.h.
 */
#ifndef DT_CKPT_INTERNAL_H
#define DT_CKPT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "ckpt/ckpt_io.h"

#define MANIFEST "manifest.json"
#define MARKER "COMPLETE"
/* Largest integer a JSON number (a double) holds exactly. */
#define JSON_INT_MAX (UINT64_C(1) << 53)

/* "shard-<shard, 5 digits>.bin" into buf[cap]. */
void dt_ckpt_shard_name(uint32_t shard, char *buf, size_t cap);

/* "<dir>/<name>" into buf[cap]; DT_ERR_INVALID when it does not fit. */
int dt_ckpt_join(char *buf, size_t cap, const char *dir, const char *name);

/* Segments of one entry, sorted by offset, must tile [0, numel): DT_OK, or
 * DT_ERR_DATA naming the gap or overlap, prefixed by `where`.  The writer
 * checks what the manifest will record, the reader what it records. */
int dt_ckpt_check_tiling(const char *where, const char *entry, uint64_t numel,
                         const dt_ckpt_seg_t *const *s, size_t n);

/* Segment bytes (count * dtype size); dtype already validated. */
uint64_t dt_ckpt_seg_bytes(const dt_ckpt_seg_t *s);

/* An exact non-negative integer field (JSON numbers are doubles): 1 with
 * *v set, or 0 when absent, not a number or not exact. */
int dt_ckpt_json_uint(const cJSON *o, const char *key, uint64_t *v);

#endif /* DT_CKPT_INTERNAL_H */
