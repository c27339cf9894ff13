/*
 * core/ckpt/safetensors.c - the streaming safetensors writer.
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
