/*
 * core/ckpt/ckpt_manifest.c - manifest.json, the checkpoint's table of
 * contents (ckpt_io.h): what a segment object holds is one field table,
 * seg_fields, walked once to write a segment (dt_ckpt_seg_to_json) and
 * once to read one (dt_ckpt_seg_from_json, ckpt_read.c); and rank 0's
 * dt_ckpt_write_manifest, which checks that the segments every rank wrote
 * describe every declared entry exactly before it writes the file.
 *
 *   {"format": "dtrain-ckpt", "format_version": 2, "step": 40,
 *    "written_by": {"world_size": 4, "strategy": "zero"},
 *    "model": {...}, "extra": {...},
 *    "files": {"shard-00000.bin": {"bytes": 123}, ...},
 *    "entries": {"<name>": {"dtype": "f32", "numel": 10, "shape": [2, 5],
 *                           "segments": [<segment>, ...]}, ...}}
 *
 * A segment is a flat range {"offset", "count", "file", "byte_offset",
 * "crc32"} or (format_version 2) a block of a tensor {"base", "shape",
 * "offsets", "sizes", "count", "file", "byte_offset", "crc32"}.
 */
#include "ckpt/ckpt_internal.h"

#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/tensor.h"
#include "util/error.h"
#include "util/fileutil.h"

/* ---- a segment's fields ------------------------------------------------ */

enum { SEG_FLAT = 1, SEG_BLOCK = 2, SEG_ANY = 3 };          /* which segments */
enum { F_U64, F_DIMS, F_FILE, F_CRC32 };                    /* how it is spelled */

typedef struct seg_field {
    const char *key;
    int kind;    /* F_* */
    int where;   /* SEG_*: the segments that have it */
    size_t off;  /* of the member in dt_ckpt_seg_t (F_DIMS: its array) */
} seg_field_t;

#define SF(key, kind, where, member) {key, kind, where, offsetof(dt_ckpt_seg_t, member)}
/* In the order the writer emits them. */
static const seg_field_t seg_fields[] = {
    SF("base", F_U64, SEG_BLOCK, block.base),       /* the tensor in the entry */
    SF("shape", F_DIMS, SEG_BLOCK, block.shape),    /* the tensor's shape */
    SF("offsets", F_DIMS, SEG_BLOCK, block.start),  /* the block in the tensor */
    SF("sizes", F_DIMS, SEG_BLOCK, block.size),
    SF("offset", F_U64, SEG_FLAT, offset),          /* the range in the entry */
    SF("count", F_U64, SEG_ANY, count),             /* elements */
    SF("file", F_FILE, SEG_ANY, shard),             /* shard-<5 digits>.bin */
    SF("byte_offset", F_U64, SEG_ANY, byte_offset), /* where in the file */
    SF("crc32", F_CRC32, SEG_ANY, crc32),           /* 8 hex digits */
};
#undef SF

static cJSON *add_num(cJSON *o, const char *k, uint64_t v)
{
    return cJSON_AddNumberToObject(o, k, (double)v);
}

cJSON *dt_ckpt_seg_to_json(const dt_ckpt_seg_t *s)
{
    const int where = s->block.ndim > 0 ? SEG_BLOCK : SEG_FLAT;
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; o && i < sizeof seg_fields / sizeof *seg_fields; i++) {
        const seg_field_t *f = &seg_fields[i];
        const void *m = (const char *)s + f->off;
        char text[32];
        cJSON *v = NULL;
        if (!(f->where & where))
            continue;
        switch (f->kind) {
        case F_U64:
            v = cJSON_CreateNumber((double)*(const uint64_t *)m);
            break;
        case F_DIMS:
            v = cJSON_CreateArray();
            for (int d = 0; v && d < s->block.ndim; d++)
                if (!cJSON_AddItemToArray(v, cJSON_CreateNumber((double)((const uint64_t *)m)[d])))
                    cJSON_Delete(v), v = NULL;
            break;
        case F_FILE:
            dt_ckpt_shard_name(*(const uint32_t *)m, text, sizeof text);
            v = cJSON_CreateString(text);
            break;
        default: /* F_CRC32 */
            snprintf(text, sizeof text, "%08" PRIx32, *(const uint32_t *)m);
            v = cJSON_CreateString(text);
            break;
        }
        if (!v || !cJSON_AddItemToObject(o, f->key, v)) {
            cJSON_Delete(v);
            cJSON_Delete(o);
            o = NULL;
        }
    }
    return o;
}

/* A JSON array of 1..DT_CKPT_MAX_DIMS exact integers into v: its length,
 * or -1. */
static int json_dims(const cJSON *a, uint64_t *v)
{
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    if (n < 1 || n > DT_CKPT_MAX_DIMS)
        return -1;
    int k = 0;
    const cJSON *d;
    cJSON_ArrayForEach(d, a) {
        double x = cJSON_IsNumber(d) ? d->valuedouble : -1;
        if (!(x >= 0 && x <= (double)JSON_INT_MAX) || x != (double)(uint64_t)x)
            return -1;
        v[k++] = (uint64_t)x;
    }
    return n;
}

int dt_ckpt_seg_from_json(const cJSON *js, dt_ckpt_seg_t *s, const char **file)
{
    const int where = cJSON_GetObjectItemCaseSensitive(js, "offsets") ? SEG_BLOCK : SEG_FLAT;
    int ndim = 0;
    *file = NULL;
    for (size_t i = 0; i < sizeof seg_fields / sizeof *seg_fields; i++) {
        const seg_field_t *f = &seg_fields[i];
        void *m = (char *)s + f->off;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(js, f->key);
        const int bad = f->where == SEG_BLOCK ? DT_CKPT_SEG_BAD_BLOCK : DT_CKPT_SEG_BAD_FIELD;
        char *end = NULL;
        if (!(f->where & where))
            continue;
        switch (f->kind) {
        case F_U64:
            if (!dt_ckpt_json_uint(js, f->key, (uint64_t *)m))
                return bad;
            break;
        case F_DIMS: {
            int n = json_dims(v, (uint64_t *)m);
            if (n < 0 || (ndim && n != ndim))
                return bad;
            ndim = n;
            break;
        }
        case F_FILE:
            if (!cJSON_IsString(v))
                return bad;
            *file = v->valuestring;
            *(uint32_t *)m = UINT32_MAX;
            sscanf(v->valuestring, "shard-%" SCNu32 ".bin", (uint32_t *)m);
            break;
        default: /* F_CRC32 */
            if (!cJSON_IsString(v))
                return bad;
            *(uint32_t *)m = (uint32_t)strtoul(v->valuestring, &end, 16);
            if (strlen(v->valuestring) != 8 || *end != '\0')
                return DT_CKPT_SEG_BAD_CRC;
            break;
        }
    }
    s->block.ndim = ndim;
    return 0;
}

/* ---- rank 0 writes the manifest ------------------------------------------ */

static int seg_cmp(const void *a, const void *b)
{
    const dt_ckpt_seg_t *x = *(const dt_ckpt_seg_t *const *)a;
    const dt_ckpt_seg_t *y = *(const dt_ckpt_seg_t *const *)b;
    int c = strcmp(x->entry, y->entry);
    if (c)
        return c;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    return x->byte_offset < y->byte_offset ? -1 : x->byte_offset > y->byte_offset;
}

/* Every segment belongs to a declared entry of its dtype. */
static int check_declared(const dt_ckpt_entry_t *entries, size_t n_entries,
                          const dt_ckpt_seg_t *const *sorted, size_t n_segs)
{
    for (size_t i = 0; i < n_segs; i++) {
        const dt_ckpt_seg_t *s = sorted[i];
        const dt_ckpt_entry_t *e = NULL;
        for (size_t j = 0; j < n_entries && !e; j++)
            if (strcmp(entries[j].name, s->entry) == 0)
                e = &entries[j];
        if (!e)
            return dt_err_set(DT_ERR_INVALID, "checkpoint manifest: segment of "
                              "undeclared entry '%s' in shard %" PRIu32, s->entry, s->shard);
        if (e->dtype != s->dtype)
            return dt_err_set(DT_ERR_INVALID, "checkpoint manifest: entry %s is "
                              "%s but shard %" PRIu32 " wrote it as %s", s->entry,
                              dt_dtype_name(e->dtype), s->shard, dt_dtype_name(s->dtype));
    }
    return DT_OK;
}

/* "files": each shard's size.  Segments of one shard are contiguous from
 * byte 0, so the file ends where its last segment ends. */
static int files_json(cJSON *files, const dt_ckpt_seg_t *segs, size_t n_segs)
{
    for (size_t i = 0; i < n_segs; i++) {
        char fname[32];
        dt_ckpt_shard_name(segs[i].shard, fname, sizeof fname);
        uint64_t end = segs[i].byte_offset + dt_ckpt_seg_bytes(&segs[i]);
        cJSON *f = cJSON_GetObjectItemCaseSensitive(files, fname);
        if (!f) {
            if (!(f = cJSON_AddObjectToObject(files, fname)) || !add_num(f, "bytes", end))
                return dt_err_set(DT_ERR_NOMEM, "checkpoint manifest: out of memory");
        } else if (end > (uint64_t)cJSON_GetObjectItem(f, "bytes")->valuedouble) {
            cJSON_SetNumberValue(cJSON_GetObjectItem(f, "bytes"), (double)end);
        }
    }
    return DT_OK;
}

/* Entry e's declaration and its segments (a run of the sorted array),
 * which must cover it exactly once. */
static int check_entry(const dt_ckpt_entry_t *e, const dt_ckpt_seg_t *const *segs, size_t n)
{
    if (dt_dtype_size(e->dtype) == 0 || e->numel > JSON_INT_MAX || e->ndim < 0 ||
        e->ndim > DT_CKPT_MAX_DIMS)
        return dt_err_set(DT_ERR_INVALID, "checkpoint manifest: entry %s: bad or duplicate "
                          "declaration (dtype %d, ndim %d)", e->name, e->dtype, e->ndim);
    uint64_t prod = 1;
    for (int d = 0; d < e->ndim; d++)
        prod *= (uint64_t)e->shape[d];
    if (e->ndim > 0 && prod != e->numel)
        return dt_err_set(DT_ERR_INVALID, "checkpoint manifest: entry %s: shape holds %" PRIu64
                          " elements but numel is %" PRIu64, e->name, prod, e->numel);
    for (size_t i = 0; i < n; i++) {
        const dt_ckpt_block_t *b = &segs[i]->block;
        uint64_t cnt, first, tn = 1;
        if (b->ndim <= 0)
            continue;
        int rc = dt_ckpt_block_check(DT_ERR_INVALID, "checkpoint manifest: ", e->name, b,
                                     &cnt, &first);
        if (rc)
            return rc;
        for (int d = 0; d < b->ndim; d++)
            tn *= b->shape[d];
        if (b->base > e->numel || tn > e->numel - b->base)
            return dt_err_set(DT_ERR_INVALID, "checkpoint manifest: entry %s: a block's "
                              "tensor, elements [%" PRIu64 ", %" PRIu64 "), lies outside the "
                              "entry's %" PRIu64 " elements", e->name, b->base, b->base + tn,
                              e->numel);
    }
    dt_ckpt_piece_t *pieces = NULL;
    size_t n_pieces = 0;
    int rc = dt_ckpt_pieces("checkpoint manifest: ", e, segs, n, &pieces, &n_pieces);
    free(pieces);
    return rc == DT_ERR_DATA ? DT_ERR_INVALID : rc; /* a bug in the caller, not bad data */
}

static cJSON *entry_json(const dt_ckpt_entry_t *e, const dt_ckpt_seg_t *const *segs, size_t n)
{
    cJSON *je = cJSON_CreateObject();
    cJSON *js = je ? cJSON_CreateArray() : NULL;
    int ok = js && cJSON_AddStringToObject(je, "dtype", dt_dtype_name(e->dtype)) &&
             add_num(je, "numel", e->numel);
    if (ok && e->ndim > 0) {
        cJSON *sh = cJSON_AddArrayToObject(je, "shape");
        ok = sh != NULL;
        for (int d = 0; ok && d < e->ndim; d++)
            ok = cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e->shape[d]));
    }
    ok = ok && cJSON_AddItemToObject(je, "segments", js);
    if (!ok) {
        if (je && !cJSON_GetObjectItemCaseSensitive(je, "segments"))
            cJSON_Delete(js);
        cJSON_Delete(je);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (!cJSON_AddItemToArray(js, dt_ckpt_seg_to_json(segs[i]))) {
            cJSON_Delete(je);
            return NULL;
        }
    return je;
}

/* The top of the manifest: format, version, step, who wrote it, model,
 * extra, and the (still empty) "files" and "entries" objects. */
static cJSON *head_json(const dt_ckpt_info_t *info, const dt_ckpt_seg_t *segs, size_t n_segs)
{
    /* the lowest version that describes these segments (ckpt_io.h) */
    int version = DT_CKPT_FORMAT_VERSION_FLAT;
    for (size_t i = 0; i < n_segs; i++)
        if (segs[i].block.ndim > 0)
            version = DT_CKPT_FORMAT_VERSION;
    cJSON *root = cJSON_CreateObject();
    cJSON *wb = root ? cJSON_CreateObject() : NULL;
    int ok = wb && cJSON_AddStringToObject(root, "format", DT_CKPT_FORMAT) &&
             add_num(root, "format_version", (uint64_t)version) &&
             add_num(root, "step", info->step) && cJSON_AddItemToObject(root, "written_by", wb);
    if (!ok)
        cJSON_Delete(wb);
    ok = ok && add_num(wb, "world_size", info->world_size) &&
         cJSON_AddStringToObject(wb, "strategy", info->strategy ? info->strategy : "") &&
         cJSON_AddItemToObject(root, "model", info->model ? cJSON_Duplicate(info->model, 1)
                                                         : cJSON_CreateObject()) &&
         cJSON_AddItemToObject(root, "extra", info->extra ? cJSON_Duplicate(info->extra, 1)
                                                         : cJSON_CreateObject()) &&
         cJSON_AddObjectToObject(root, "files") && cJSON_AddObjectToObject(root, "entries");
    if (!ok) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

static int write_json(const char *tmp_dir, const cJSON *root)
{
    char *text = cJSON_Print(root);
    if (!text)
        return dt_err_set(DT_ERR_NOMEM, "checkpoint manifest: out of memory");
    char path[PATH_MAX];
    int rc = dt_ckpt_join(path, sizeof path, tmp_dir, MANIFEST);
    if (!rc) {
        size_t len = strlen(text);
        text[len] = '\n'; /* replace the NUL: files end with a newline */
        rc = dt_fileutil_write_atomic(path, text, len + 1);
    }
    cJSON_free(text);
    return rc;
}

int dt_ckpt_write_manifest(const char *tmp_dir, const dt_ckpt_info_t *info,
                           const dt_ckpt_entry_t *entries, size_t n_entries,
                           const dt_ckpt_seg_t *segs, size_t n_segs)
{
    const dt_ckpt_seg_t **sorted = malloc((n_segs + 1) * sizeof *sorted);
    cJSON *root = sorted ? head_json(info, segs, n_segs) : NULL;
    int rc = root ? DT_OK : dt_err_set(DT_ERR_NOMEM, "checkpoint manifest: out of memory");
    for (size_t i = 0; !rc && i < n_segs; i++)
        sorted[i] = &segs[i];
    if (!rc) {
        qsort(sorted, n_segs, sizeof *sorted, seg_cmp);
        rc = check_declared(entries, n_entries, sorted, n_segs);
    }
    if (!rc)
        rc = files_json(cJSON_GetObjectItemCaseSensitive(root, "files"), segs, n_segs);
    cJSON *jents = root ? cJSON_GetObjectItemCaseSensitive(root, "entries") : NULL;
    for (size_t j = 0; j < n_entries && !rc; j++) {
        const dt_ckpt_entry_t *e = &entries[j];
        size_t lo = 0; /* this entry's segments are a run of the sorted array */
        while (lo < n_segs && strcmp(sorted[lo]->entry, e->name) < 0)
            lo++;
        size_t hi = lo;
        while (hi < n_segs && strcmp(sorted[hi]->entry, e->name) == 0)
            hi++;
        if (cJSON_GetObjectItemCaseSensitive(jents, e->name))
            rc = dt_err_set(DT_ERR_INVALID, "checkpoint manifest: entry %s: bad or "
                            "duplicate declaration (dtype %d, ndim %d)", e->name, e->dtype,
                            e->ndim);
        if (!rc)
            rc = check_entry(e, sorted + lo, hi - lo);
        cJSON *je = rc ? NULL : entry_json(e, sorted + lo, hi - lo);
        if (!rc && (!je || !cJSON_AddItemToObject(jents, e->name, je))) {
            cJSON_Delete(je);
            rc = dt_err_set(DT_ERR_NOMEM, "checkpoint manifest: out of memory");
        }
    }
    if (!rc)
        rc = write_json(tmp_dir, root);
    free(sorted);
    cJSON_Delete(root);
    return rc;
}
