/*
 * core/ckpt/safetensors.c - the streaming safetensors writer and a
 * validating reader (safetensors.h).
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
    if (!name[0] || strcmp(name, DT_SAFETENSORS_META_KEY) == 0 ||
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
        cJSON_AddItemToObject(w->header, DT_SAFETENSORS_META_KEY, w->meta);
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

struct dt_safetensors_reader {
    char *path;
    int fd;
    uint64_t size;       /* of the file */
    uint64_t data_start; /* 8 + header length */
    cJSON *header;       /* names and dtype names point into it */
    dt_safetensors_tensor_t *t;
    size_t n;
};

/* Every dtype the format names: its element size, and dtrain's dtype when
 * dtrain has one (-1 otherwise). */
static const struct {
    const char *name;
    unsigned size;
    int dtype;
} st_dtypes[] = {
    {"F64", 8, DT_F64},  {"F32", 4, DT_F32},  {"F16", 2, DT_F16},   {"BF16", 2, DT_BF16},
    {"I64", 8, DT_I64},  {"I32", 4, DT_I32},  {"U16", 2, DT_U16},   {"U8", 1, DT_U8},
    {"U64", 8, -1},      {"U32", 4, -1},      {"I16", 2, -1},       {"I8", 1, -1},
    {"BOOL", 1, -1},     {"F8_E5M2", 1, -1},  {"F8_E4M3", 1, -1},
};

static int bad(const dt_safetensors_reader_t *r, const char *name, const char *what)
{
    if (name)
        return dt_err_set(DT_ERR_DATA, "safetensors '%s': tensor %s: %s", r->path, name, what);
    return dt_err_set(DT_ERR_DATA, "safetensors '%s': %s", r->path, what);
}

/* A JSON number that is an exact integer in [0, 2^53]. */
static int json_u53(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > (double)JSON_INT_MAX ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

static int parse_tensor(dt_safetensors_reader_t *r, const cJSON *e, dt_safetensors_tensor_t *t)
{
    const char *nm = e->string;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
        cJSON_GetArraySize(off) != 2)
        return bad(r, nm, "its header entry needs dtype, shape and data_offsets [begin, end]");
    t->name = nm;
    t->dtype_name = dt->valuestring;
    unsigned es = 0;
    t->dtype = -1;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(dt->valuestring, st_dtypes[i].name) == 0) {
            es = st_dtypes[i].size;
            t->dtype = st_dtypes[i].dtype;
        }
    if (cJSON_GetArraySize(sh) > DT_SAFETENSORS_MAX_DIMS)
        return bad(r, nm, "more than 8 dimensions");
    t->ndim = cJSON_GetArraySize(sh);
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t v;
        if (!json_u53(cJSON_GetArrayItem(sh, d), &v) || (v && t->numel > JSON_INT_MAX / v))
            return bad(r, nm, "its shape holds a negative, fractional or huge dimension");
        t->shape[d] = (int64_t)v;
        t->numel *= v;
    }
    uint64_t b, en;
    if (!json_u53(cJSON_GetArrayItem(off, 0), &b) || !json_u53(cJSON_GetArrayItem(off, 1), &en) ||
        b > en || en > r->size - r->data_start) {
        char why[160];
        snprintf(why, sizeof why, "data_offsets lie outside the %" PRIu64 " bytes of data",
                 r->size - r->data_start);
        return bad(r, nm, why);
    }
    t->offset = r->data_start + b;
    t->nbytes = en - b;
    if (es && t->nbytes != t->numel * es) {
        char why[200];
        snprintf(why, sizeof why, "%" PRIu64 " bytes of data for %" PRIu64 " %s elements (%"
                 PRIu64 " bytes)", t->nbytes, t->numel, dt->valuestring, t->numel * es);
        return bad(r, nm, why);
    }
    return DT_OK;
}

/* Tensor pointers ordered by where their data begins (then ends). */
static int by_span(const void *a, const void *b)
{
    const dt_safetensors_tensor_t *x = *(const dt_safetensors_tensor_t *const *)a;
    const dt_safetensors_tensor_t *y = *(const dt_safetensors_tensor_t *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

/* The format's rule: the tensors' spans, in whatever order the header
 * lists them, tile the data buffer exactly - no two overlap, none leaves a
 * hole, and the last ends where the file does (the reference
 * implementation refuses the same files).  A hole would be bytes no tensor
 * owns; an overlap, two tensors that alias one another's bytes. */
static int check_tiling(dt_safetensors_reader_t *r)
{
    const uint64_t data = r->size - r->data_start;
    const dt_safetensors_tensor_t **ord = malloc((r->n ? r->n : 1) * sizeof *ord);
    if (!ord)
        return dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory", r->path);
    for (size_t i = 0; i < r->n; i++)
        ord[i] = &r->t[i];
    qsort(ord, r->n, sizeof *ord, by_span);
    uint64_t at = 0; /* where the tiled prefix of the buffer ends */
    const dt_safetensors_tensor_t *prev = NULL;
    int rc = DT_OK;
    char why[600];
    for (size_t i = 0; i < r->n && !rc; i++) {
        const dt_safetensors_tensor_t *t = ord[i];
        const uint64_t b = t->offset - r->data_start, e = b + t->nbytes;
        if (b == at) {
            at = e;
            prev = t;
            continue;
        }
        if (!prev)
            snprintf(why, sizeof why, "data_offsets [%" PRIu64 ", %" PRIu64 "] leave a hole: "
                     "no tensor holds data bytes [0, %" PRIu64 ")", b, e, b);
        else if (b > at)
            snprintf(why, sizeof why, "data_offsets [%" PRIu64 ", %" PRIu64 "] leave a hole: "
                     "no tensor holds data bytes [%" PRIu64 ", %" PRIu64 ") after tensor %s's [%"
                     PRIu64 ", %" PRIu64 "]", b, e, at, b, prev->name,
                     prev->offset - r->data_start, at);
        else
            snprintf(why, sizeof why, "data_offsets [%" PRIu64 ", %" PRIu64 "] overlap tensor "
                     "%s's [%" PRIu64 ", %" PRIu64 "]", b, e, prev->name,
                     prev->offset - r->data_start, at);
        rc = bad(r, t->name, why);
    }
    if (!rc && at != data) {
        if (prev)
            snprintf(why, sizeof why, "the tensors hold %" PRIu64 " of the %" PRIu64 " data "
                     "bytes: no tensor holds bytes [%" PRIu64 ", %" PRIu64 ") after tensor %s's "
                     "[%" PRIu64 ", %" PRIu64 "]", at, data, at, data, prev->name,
                     prev->offset - r->data_start, at);
        else
            snprintf(why, sizeof why, "the tensors hold none of the %" PRIu64 " data bytes",
                     data);
        rc = bad(r, NULL, why);
    }
    free(ord);
    return rc;
}

int dt_safetensors_open(const char *path, dt_safetensors_reader_t **out)
{
    *out = NULL;
    dt_safetensors_reader_t *r = calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        return dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory", path);
    }
    r->fd = -1;
    char what[4200];
    snprintf(what, sizeof what, "safetensors '%s'", path);
    char *json = NULL;
    int rc = dt_fileutil_open_input(path, 0, what, &r->fd, &r->size);
    unsigned char le[8];
    uint64_t hlen = 0;
    if (!rc && (r->size < 8 || pread(r->fd, le, 8, 0) != 8))
        rc = bad(r, NULL, "shorter than the 8-byte header length");
    for (int i = 0; !rc && i < 8; i++)
        hlen |= (uint64_t)le[i] << (8 * i);
    if (!rc && (hlen > r->size - 8 || hlen > DT_SAFETENSORS_MAX_HEADER)) {
        char why[160];
        snprintf(why, sizeof why, "header length %" PRIu64 " is beyond the file's %" PRIu64
                 " bytes or the 100 MiB limit", hlen, r->size);
        rc = bad(r, NULL, why);
    }
    if (!rc && !(json = malloc(hlen + 1)))
        rc = dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory", path);
    if (!rc && pread(r->fd, json, hlen, 8) != (ssize_t)hlen)
        rc = dt_err_set(DT_ERR_IO, "safetensors '%s': reading the header: %s", path,
                        strerror(errno));
    if (!rc) {
        r->data_start = 8 + hlen;
        r->header = cJSON_ParseWithLength(json, hlen);
        if (!cJSON_IsObject(r->header))
            rc = bad(r, NULL, "the header is not a JSON object");
    }
    free(json);
    const cJSON *e;
    size_t n = 0;
    if (!rc) {
        cJSON_ArrayForEach(e, r->header) n++;
        if (!(r->t = calloc(n ? n : 1, sizeof *r->t)))
            rc = dt_err_set(DT_ERR_NOMEM, "safetensors '%s': out of memory", path);
    }
    if (!rc) {
        cJSON_ArrayForEach(e, r->header)
        {
            if (strcmp(e->string, DT_SAFETENSORS_META_KEY) == 0)
                continue;
            if ((rc = parse_tensor(r, e, &r->t[r->n])))
                break;
            r->n++;
        }
    }
    if (!rc)
        rc = check_tiling(r);
    if (rc) {
        dt_safetensors_close(r);
        return rc;
    }
    *out = r;
    return DT_OK;
}

void dt_safetensors_close(dt_safetensors_reader_t *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    cJSON_Delete(r->header);
    free(r->t);
    free(r->path);
    free(r);
}

size_t dt_safetensors_count(const dt_safetensors_reader_t *r) { return r->n; }

const dt_safetensors_tensor_t *dt_safetensors_at(const dt_safetensors_reader_t *r, size_t i)
{
    return i < r->n ? &r->t[i] : NULL;
}

const dt_safetensors_tensor_t *dt_safetensors_find(const dt_safetensors_reader_t *r,
                                                   const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->t[i].name, name) == 0)
            return &r->t[i];
    return NULL;
}

int dt_safetensors_read(dt_safetensors_reader_t *r, const dt_safetensors_tensor_t *t,
                        uint64_t first, uint64_t n, void *dst)
{
    if (first > t->nbytes || n > t->nbytes - first)
        return dt_err_set(DT_ERR_INVALID, "safetensors '%s': tensor %s: bytes [%" PRIu64
                          ", %" PRIu64 ") are past its %" PRIu64, r->path, t->name, first,
                          first + n, t->nbytes);
    char *p = dst;
    uint64_t at = t->offset + first;
    while (n) {
        ssize_t got = pread(r->fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n, (off_t)at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return dt_err_set(got < 0 ? DT_ERR_IO : DT_ERR_DATA,
                              "safetensors '%s': tensor %s: reading: %s", r->path, t->name,
                              got < 0 ? strerror(errno) : "the file ended early");
        p += got;
        at += (uint64_t)got;
        n -= (uint64_t)got;
    }
    return DT_OK;
}
