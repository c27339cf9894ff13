/*
 * core/ckpt/ckpt_format.c - definitions the writing and the reading side of
 * the checkpoint format (ckpt_io.h) share: shard file names, the rule that
 * an entry's segments tile it, exact JSON integers, and the public helpers
 * for 64-bit values in the manifest's "model" and "extra".
 */
#include "ckpt/ckpt_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/tensor.h"
#include "util/error.h"

void dt_ckpt_shard_name(uint32_t shard, char *buf, size_t cap)
{
    snprintf(buf, cap, "shard-%05" PRIu32 ".bin", shard);
}

int dt_ckpt_join(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return dt_err_set(DT_ERR_INVALID, "path '%s/%s' is too long", dir,
                          name);
    return DT_OK;
}

/* ---- segments -------------------------------------------------------- */

/* Spans of one entry, sorted by offset, must tile [0, numel).  `where`
 * prefixes the message. */
int dt_ckpt_check_tiling(const char *where, const char *entry, uint64_t numel,
                         const char *noun, const dt_ckpt_span_t *s, size_t n)
{
    uint64_t next = 0;
    const char *prev = NULL; /* the span that ends at `next` */
    for (size_t i = 0; i < n; i++) {
        if (s[i].offset > next)
            return dt_err_set(DT_ERR_DATA, "%sentry %s: elements [%" PRIu64
                              ", %" PRIu64 ") are in no %s", where, entry,
                              next, s[i].offset, noun);
        if (s[i].offset < next) {
            uint64_t end = s[i].offset + s[i].count;
            char who[2 * DT_CKPT_NAME_MAX + 16] = "";
            if (s[i].name && prev)
                snprintf(who, sizeof who, " (%s and %s)", prev, s[i].name);
            return dt_err_set(DT_ERR_DATA, "%sentry %s: %ss overlap at "
                              "elements [%" PRIu64 ", %" PRIu64 ")%s", where,
                              entry, noun, s[i].offset,
                              next < end ? next : end, who);
        }
        next = s[i].offset + s[i].count;
        prev = s[i].name;
    }
    if (next > numel) {
        char who[DT_CKPT_NAME_MAX + 8] = "";
        if (prev)
            snprintf(who, sizeof who, " (%s)", prev);
        return dt_err_set(DT_ERR_DATA, "%sentry %s: %ss reach element %"
                          PRIu64 " but numel is %" PRIu64 "%s", where, entry,
                          noun, next, numel, who);
    }
    if (next < numel)
        return dt_err_set(DT_ERR_DATA, "%sentry %s: elements [%" PRIu64 ", %"
                          PRIu64 ") are in no %s", where, entry, next, numel,
                          noun);
    return DT_OK;
}

/* Segment bytes (count * dtype size); dtype already validated. */
uint64_t dt_ckpt_seg_bytes(const dt_ckpt_seg_t *s)
{
    return s->count * dt_dtype_size(s->dtype);
}

/* ---- JSON integers --------------------------------------------------- */

/* An exact non-negative integer field (JSON numbers are doubles). */
int dt_ckpt_json_uint(const cJSON *o, const char *key, uint64_t *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(it))
        return 0;
    double d = it->valuedouble;
    if (!(d >= 0 && d <= (double)JSON_INT_MAX) || d != (double)(uint64_t)d)
        return 0;
    *v = (uint64_t)d;
    return 1;
}

int dt_ckpt_json_add_u64(cJSON *obj, const char *key, uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    if (!cJSON_AddStringToObject(obj, key, buf))
        return dt_err_set(DT_ERR_NOMEM, "json: adding '%s': out of memory", key);
    return DT_OK;
}
