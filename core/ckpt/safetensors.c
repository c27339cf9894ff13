/*
 * core/ckpt/safetensors.c - streaming safetensors writer and a validating
 * reader (memory-mapped).
 */
#include "ckpt/safetensors.h"

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
#include "util/fileutil.h"
#include "util/error.h"

#define META_KEY "__metadata__"
#define JSON_INT_MAX (UINT64_C(1) << 53)

const char *dt_safetensors_dtype_name(int dtype)
{
    switch (dtype) {
    case DT_F32: return "F32";
    case DT_BF16: return "BF16";
    case DT_F16: return "F16";
    case DT_F64: return "F64";
    case DT_I32: return "I32";
    case DT_I64: return "I64";
    case DT_U16: return "U16";
    case DT_U8: return "U8";
    default: return NULL;
    }
}

static int dtype_parse(const char *s)
{
    for (int d = 0; d < DT_DTYPE_COUNT; d++) {
        const char *n = dt_safetensors_dtype_name(d);
        if (n && strcmp(n, s) == 0)
            return d;
    }
    return -1;
}

/* ---- writer ---------------------------------------------------------- */

struct dt_safetensors_writer {
    dt_afile_t *f;
    char *path;
    cJSON *header;      /* tensors, then __metadata__ (built as we go) */
    cJSON *meta;        /* NULL until the first set_meta */
    uint64_t total;     /* declared data bytes */
    uint64_t written;   /* data bytes received */
    int started;        /* header written */
};

int dt_safetensors_writer_open(const char *path, dt_safetensors_writer_t **out)
{
    *out = NULL;
    dt_safetensors_writer_t *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path)) || !(w->header = cJSON_CreateObject())) {
        if (w) {
            free(w->path);
            free(w);
        }
        return dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory", path);
    }
    int rc = dt_afile_open(path, &w->f);
    if (rc) {
        cJSON_Delete(w->header);
        free(w->path);
        free(w);
        return rc;
    }
    *out = w;
    return DT_OK;
}

int dt_safetensors_declare(dt_safetensors_writer_t *w, const char *name,
                           int dtype, int ndim, const int64_t *shape)
{
    const char *dn = dt_safetensors_dtype_name(dtype);
    if (w->started)
        return dt_err_set(DT_ERR_INVALID, "safetensors '%s': tensor %s "
                          "declared after data was written", w->path, name);
    if (!dn)
        return dt_err_set(DT_ERR_UNSUPPORTED, "safetensors '%s': tensor %s: "
                          "dtype %s has no safetensors name", w->path, name,
                          dt_dtype_name(dtype));
    if (!name[0] || strcmp(name, META_KEY) == 0 ||
        cJSON_GetObjectItemCaseSensitive(w->header, name))
        return dt_err_set(DT_ERR_INVALID, "safetensors '%s': tensor name '%s' "
                          "is empty, reserved or declared twice", w->path,
                          name);
    if (ndim < 0 || ndim > DT_SAFETENSORS_MAX_DIMS)
        return dt_err_set(DT_ERR_INVALID, "safetensors '%s': tensor %s: %d "
                          "dimensions", w->path, name, ndim);
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || (shape[d] && numel > JSON_INT_MAX / (uint64_t)shape[d]))
            return dt_err_set(DT_ERR_INVALID, "safetensors '%s': tensor %s: "
                              "bad dimension %" PRId64, w->path, name,
                              shape[d]);
        numel *= (uint64_t)shape[d];
    }
    uint64_t bytes = numel * dt_dtype_size(dtype);
    if (bytes > JSON_INT_MAX - w->total)
        return dt_err_set(DT_ERR_INVALID, "safetensors '%s': tensor %s makes "
                          "the file too large", w->path, name);
    cJSON *t = cJSON_AddObjectToObject(w->header, name);
    cJSON *sh = NULL, *off = NULL;
    if (t && cJSON_AddStringToObject(t, "dtype", dn) &&
        (sh = cJSON_AddArrayToObject(t, "shape")))
        off = cJSON_AddArrayToObject(t, "data_offsets");
    if (!off)
        return dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory",
                          w->path);
    for (int d = 0; d < ndim; d++)
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)shape[d]));
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)w->total));
    cJSON_AddItemToArray(off, cJSON_CreateNumber((double)(w->total + bytes)));
    w->total += bytes;
    return DT_OK;
}

int dt_safetensors_set_meta(dt_safetensors_writer_t *w, const char *key,
                            const char *value)
{
    if (w->started)
        return dt_err_set(DT_ERR_INVALID, "safetensors '%s': metadata '%s' "
                          "set after data was written", w->path, key);
    if (!w->meta && !(w->meta = cJSON_CreateObject()))
        return dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory",
                          w->path);
    cJSON_DeleteItemFromObjectCaseSensitive(w->meta, key);
    if (!cJSON_AddStringToObject(w->meta, key, value))
        return dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory",
                          w->path);
    return DT_OK;
}

static int header_write(dt_safetensors_writer_t *w)
{
    if (w->meta) {
        cJSON_AddItemToObject(w->header, META_KEY, w->meta);
        w->meta = NULL;
    }
    char *json = cJSON_PrintUnformatted(w->header);
    if (!json)
        return dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory",
                          w->path);
    size_t n = strlen(json);
    size_t padded = (n + 7) & ~(size_t)7;
    uint64_t len = padded;
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(len >> (8 * i));
    static const char spaces[8] = "        ";
    int rc = dt_afile_write(w->f, le, sizeof le);
    if (!rc)
        rc = dt_afile_write(w->f, json, n);
    if (!rc)
        rc = dt_afile_write(w->f, spaces, padded - n);
    cJSON_free(json);
    w->started = 1;
    return rc;
}

int dt_safetensors_write(dt_safetensors_writer_t *w, const void *data,
                         size_t nbytes)
{
    if (!w->started) {
        int rc = header_write(w);
        if (rc)
            return rc;
    }
    if (nbytes > w->total - w->written)
        return dt_err_set(DT_ERR_INVALID, "safetensors '%s': %zu bytes "
                          "written past the %" PRIu64 " declared", w->path,
                          nbytes, w->total);
    int rc = dt_afile_write(w->f, data, nbytes);
    if (!rc)
        w->written += nbytes;
    return rc;
}

static void writer_free(dt_safetensors_writer_t *w)
{
    cJSON_Delete(w->header);
    cJSON_Delete(w->meta);
    free(w->path);
    free(w);
}

void dt_safetensors_abort(dt_safetensors_writer_t *w)
{
    if (!w)
        return;
    dt_afile_abort(w->f);
    writer_free(w);
}

int dt_safetensors_commit(dt_safetensors_writer_t *w)
{
    int rc = w->started ? DT_OK : header_write(w);
    if (!rc && w->written != w->total)
        rc = dt_err_set(DT_ERR_INVALID, "safetensors '%s': %" PRIu64 " of %"
                        PRIu64 " declared data bytes written", w->path,
                        w->written, w->total);
    if (rc) {
        dt_safetensors_abort(w);
        return rc;
    }
    rc = dt_afile_commit(w->f);
    writer_free(w);
    return rc;
}

/* ---- reader ---------------------------------------------------------- */

struct dt_safetensors {
    char *path;
    void *map;
    uint64_t map_bytes;
    cJSON *header;
    const cJSON *meta;
    dt_safetensors_tensor_t *t;
    size_t n;
};

void dt_safetensors_close(dt_safetensors_t *st)
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
    const dt_safetensors_tensor_t *const *x = a, *const *y = b;
    uintptr_t p = (uintptr_t)(*x)->data, q = (uintptr_t)(*y)->data;
    if (p != q)
        return p < q ? -1 : 1;
    /* Equal starts: the empty tensor first, so tiling sees it harmlessly. */
    return (*x)->nbytes < (*y)->nbytes ? -1 : (*x)->nbytes > (*y)->nbytes;
}

static int reader_parse(dt_safetensors_t *st, const char *json, size_t len,
                        const unsigned char *data, uint64_t data_bytes)
{
    st->header = cJSON_ParseWithLength(json, len);
    if (!st->header || !cJSON_IsObject(st->header))
        return SERR(st, "header is not a JSON object");
    size_t cap = (size_t)cJSON_GetArraySize(st->header);
    st->t = calloc(cap + 1, sizeof *st->t);
    const dt_safetensors_tensor_t **order = calloc(cap + 1, sizeof *order);
    if (!st->t || !order) {
        free(order);
        return dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory",
                          st->path);
    }
    int rc = DT_OK;
    const cJSON *it;
    cJSON_ArrayForEach(it, st->header) {
        const char *name = it->string;
        if (strcmp(name, META_KEY) == 0) {
            const cJSON *kv;
            if (!cJSON_IsObject(it)) {
                rc = SERR(st, META_KEY " is not an object");
                break;
            }
            cJSON_ArrayForEach(kv, it) if (!cJSON_IsString(kv)) {
                rc = SERR(st, META_KEY " value '%s' is not a string",
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
        dt_safetensors_tensor_t *t = &st->t[st->n];
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

int dt_safetensors_open(const char *path, dt_safetensors_t **out)
{
    *out = NULL;
    dt_safetensors_t *st = calloc(1, sizeof *st);
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
        if (hl > DT_SAFETENSORS_MAX_HEADER || hl > st->map_bytes - 8)
            rc = dt_err_set(DT_ERR_DATA, "safetensors '%s': header length %"
                            PRIu64 " exceeds the file (%" PRIu64 " bytes) or "
                            "the %u-byte limit", path, hl, st->map_bytes,
                            DT_SAFETENSORS_MAX_HEADER);
        else if (hl == 0 || m[8] != '{')
            rc = dt_err_set(DT_ERR_DATA, "safetensors '%s': header does not "
                            "start with '{'", path);
        else
            rc = reader_parse(st, (const char *)m + 8, (size_t)hl, m + 8 + hl,
                              st->map_bytes - 8 - hl);
    }
    if (rc) {
        dt_safetensors_close(st);
        return rc;
    }
    *out = st;
    return DT_OK;
}

size_t dt_safetensors_count(const dt_safetensors_t *st) { return st->n; }

const dt_safetensors_tensor_t *dt_safetensors_at(const dt_safetensors_t *st,
                                                 size_t i)
{
    return i < st->n ? &st->t[i] : NULL;
}

const dt_safetensors_tensor_t *dt_safetensors_find(const dt_safetensors_t *st,
                                                   const char *name)
{
    for (size_t i = 0; i < st->n; i++)
        if (strcmp(st->t[i].name, name) == 0)
            return &st->t[i];
    return NULL;
}

const char *dt_safetensors_meta(const dt_safetensors_t *st, const char *key)
{
    const cJSON *v = st->meta ? cJSON_GetObjectItemCaseSensitive(st->meta, key)
                              : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
