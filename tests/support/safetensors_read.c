/*
 * tests/support/safetensors_read.c - the tests' validating safetensors
 * reader (see safetensors_read.h).
 */
#include "safetensors_read.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dtrain/tensor.h"
#include "util/error.h"

#define JSON_INT_MAX (UINT64_C(1) << 53)

/* The dt_dtype_t the core's writer names `s`, or -1. */
static int dtype_parse(const char *s)
{
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        const char *n = dt_safetensors_dtype_name(d);
        if (n && strcmp(n, s) == 0)
            return d;
    }
    return -1;
}

struct dt_test_st {
    char *path;
    void *map;
    uint64_t map_bytes;
    cJSON *header;
    const cJSON *meta;
    dt_test_st_tensor_t *t;
    size_t n;
};

void dt_test_st_close(dt_test_st_t *st)
{
    if (!st)
        return;
    if (st->map)
        munmap(st->map, st->map_bytes);
    cJSON_Delete(st->header);
    free(st->t);
    free(st->path);
    free(st);
}

#define SERR(st, ...) dt_err_context(dt_err_set(DT_ERR_DATA, __VA_ARGS__), \
                                     "safetensors '%s'", (st)->path)

static int off_cmp(const void *a, const void *b)
{
    const dt_test_st_tensor_t *const *x = a, *const *y = b;
    uintptr_t p = (uintptr_t)(*x)->data, q = (uintptr_t)(*y)->data;
    if (p != q)
        return p < q ? -1 : 1;
    /* Equal starts: the empty tensor first, so tiling sees it harmlessly. */
    return (*x)->nbytes < (*y)->nbytes ? -1 : (*x)->nbytes > (*y)->nbytes;
}

static int reader_parse(dt_test_st_t *st, const char *json, size_t len,
                        const unsigned char *data, uint64_t data_bytes)
{
    st->header = cJSON_ParseWithLength(json, len);
    if (!st->header || !cJSON_IsObject(st->header))
        return SERR(st, "header is not a JSON object");
    size_t cap = (size_t)cJSON_GetArraySize(st->header);
    st->t = calloc(cap + 1, sizeof *st->t);
    const dt_test_st_tensor_t **order = calloc(cap + 1, sizeof *order);
    if (!st->t || !order) {
        free(order);
        return dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory",
                          st->path);
    }
    int rc = DT_OK;
    const cJSON *it;
    cJSON_ArrayForEach(it, st->header) {
        const char *name = it->string;
        if (strcmp(name, DT_SAFETENSORS_META_KEY) == 0) {
            const cJSON *kv;
            if (!cJSON_IsObject(it)) {
                rc = SERR(st, DT_SAFETENSORS_META_KEY " is not an object");
                break;
            }
            cJSON_ArrayForEach(kv, it) if (!cJSON_IsString(kv)) {
                rc = SERR(st, DT_SAFETENSORS_META_KEY " value '%s' is not a string",
                          kv->string);
                break;
            }
            if (rc)
                break;
            st->meta = it;
            continue;
        }
        for (size_t i = 0; i < st->n && !rc; i++)
            if (strcmp(st->t[i].name, name) == 0)
                rc = SERR(st, "tensor %s appears twice", name);
        if (rc)
            break;
        dt_test_st_tensor_t *t = &st->t[st->n];
        t->name = name;
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        t->dtype = cJSON_IsString(dt) ? dtype_parse(dt->valuestring) : -1;
        if (t->dtype < 0) {
            rc = SERR(st, "tensor %s: missing or unsupported dtype %s", name,
                      cJSON_IsString(dt) ? dt->valuestring : "(none)");
            break;
        }
        if (!cJSON_IsArray(sh) || cJSON_GetArraySize(sh) > DT_SAFETENSORS_MAX_DIMS) {
            rc = SERR(st, "tensor %s: missing or bad shape", name);
            break;
        }
        t->numel = 1;
        const cJSON *d;
        cJSON_ArrayForEach(d, sh) {
            double v = cJSON_IsNumber(d) ? d->valuedouble : -1;
            if (!(v >= 0 && v <= (double)JSON_INT_MAX) || v != (double)(int64_t)v ||
                (v > 0 && t->numel > JSON_INT_MAX / (uint64_t)v)) {
                rc = SERR(st, "tensor %s: bad shape", name);
                break;
            }
            t->shape[t->ndim++] = (int64_t)v;
            t->numel *= (uint64_t)v;
        }
        if (rc)
            break;
        double b0 = -1, b1 = -1;
        if (cJSON_IsArray(off) && cJSON_GetArraySize(off) == 2 &&
            cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) &&
            cJSON_IsNumber(cJSON_GetArrayItem(off, 1))) {
            b0 = cJSON_GetArrayItem(off, 0)->valuedouble;
            b1 = cJSON_GetArrayItem(off, 1)->valuedouble;
        }
        if (!(b0 >= 0 && b1 >= b0 && b1 <= (double)data_bytes) ||
            b0 != (double)(uint64_t)b0 || b1 != (double)(uint64_t)b1) {
            rc = SERR(st, "tensor %s: data_offsets missing or outside the %"
                      PRIu64 "-byte data buffer", name, data_bytes);
            break;
        }
        t->nbytes = (uint64_t)b1 - (uint64_t)b0;
        if (t->nbytes != t->numel * dt_dtype_size(t->dtype)) {
            rc = SERR(st, "tensor %s: data_offsets span %" PRIu64 " bytes but "
                      "shape and dtype need %" PRIu64, name, t->nbytes,
                      t->numel * dt_dtype_size(t->dtype));
            break;
        }
        t->data = data + (uint64_t)b0;
        order[st->n] = t;
        st->n++;
    }
    if (!rc) {
        /* Tensors must tile the buffer: no holes, no overlap. */
        qsort(order, st->n, sizeof *order, off_cmp);
        const unsigned char *next = data;
        for (size_t i = 0; i < st->n && !rc; i++) {
            const unsigned char *p = order[i]->data;
            if (p != next)
                rc = SERR(st, "tensor %s: data starts at byte %td, expected %td "
                          "(%s)", order[i]->name, p - data, next - data,
                          p > next ? "hole before it" : "overlaps the previous");
            next = p + order[i]->nbytes;
        }
        if (!rc && next != data + data_bytes)
            rc = SERR(st, "tensors cover %td of %" PRIu64 " data bytes",
                      next - data, data_bytes);
    }
    free(order);
    return rc;
}

int dt_test_st_open(const char *path, dt_test_st_t **out)
{
    *out = NULL;
    dt_test_st_t *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        return dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory", path);
    }
    int rc = DT_OK;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0) {
        rc = dt_err_set(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                        "safetensors '%s': %s", path, strerror(errno));
    } else if (fstat(fd, &sb) != 0) {
        rc = dt_err_set(DT_ERR_IO, "safetensors '%s': %s", path, strerror(errno));
    } else if (sb.st_size < 8) {
        rc = dt_err_set(DT_ERR_DATA, "safetensors '%s': truncated: %lld bytes, "
                        "the header length alone needs 8", path,
                        (long long)sb.st_size);
    } else {
        st->map_bytes = (uint64_t)sb.st_size;
        st->map = mmap(NULL, st->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (st->map == MAP_FAILED) {
            st->map = NULL;
            rc = dt_err_set(DT_ERR_IO, "safetensors '%s': mmap: %s", path,
                            strerror(errno));
        }
    }
    if (fd >= 0)
        close(fd);
    if (!rc) {
        const unsigned char *m = st->map;
        uint64_t hl = 0;
        for (int i = 0; i < 8; i++)
            hl |= (uint64_t)m[i] << (8 * i);
        if (hl > DT_TEST_ST_MAX_HEADER || hl > st->map_bytes - 8)
            rc = dt_err_set(DT_ERR_DATA, "safetensors '%s': header length %"
                            PRIu64 " exceeds the file (%" PRIu64 " bytes) or "
                            "the %u-byte limit", path, hl, st->map_bytes,
                            DT_TEST_ST_MAX_HEADER);
        else if (hl == 0 || m[8] != '{')
            rc = dt_err_set(DT_ERR_DATA, "safetensors '%s': header does not "
                            "start with '{'", path);
        else
            rc = reader_parse(st, (const char *)m + 8, (size_t)hl, m + 8 + hl,
                              st->map_bytes - 8 - hl);
    }
    if (rc) {
        dt_test_st_close(st);
        return rc;
    }
    *out = st;
    return DT_OK;
}

size_t dt_test_st_count(const dt_test_st_t *st) { return st->n; }

const dt_test_st_tensor_t *dt_test_st_at(const dt_test_st_t *st,
                                                 size_t i)
{
    return i < st->n ? &st->t[i] : NULL;
}

const dt_test_st_tensor_t *dt_test_st_find(const dt_test_st_t *st,
                                                   const char *name)
{
    for (size_t i = 0; i < st->n; i++)
        if (strcmp(st->t[i].name, name) == 0)
            return &st->t[i];
    return NULL;
}

const char *dt_test_st_meta(const dt_test_st_t *st, const char *key)
{
    const cJSON *v = st->meta ? cJSON_GetObjectItemCaseSensitive(st->meta, key)
                              : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
