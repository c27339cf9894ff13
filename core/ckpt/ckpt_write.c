/*
 * core/ckpt/ckpt_write.c - the writing side of a checkpoint (ckpt_io.h):
 * shard writers that stream segments into one file per rank with their
 * CRC-32, and rank 0's manifest, checked to describe every entry exactly.
 */
#include "ckpt/ckpt_internal.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/tensor.h"
#include "util/error.h"
#include "util/fileutil.h"

/* ---- writing shards -------------------------------------------------- */

struct dt_ckpt_writer {
    dt_afile_t *f;
    char file[32];           /* "shard-00003.bin" */
    uint32_t shard;
    dt_ckpt_seg_t *segs;
    size_t n, cap;
    int in_seg;              /* between begin and end */
    uint64_t seg_left;       /* bytes the open segment still expects */
    uint32_t crc;
    /* deferred (dt_ckpt_shard_open_deferred): the bytes kept in memory
     * until dt_ckpt_shard_finish writes them */
    int deferred;
    char *mem;
    size_t mem_len, mem_cap;
};

int dt_ckpt_shard_open_deferred(const char *tmp_dir, uint32_t shard, void *buf, size_t cap,
                                dt_ckpt_writer_t **out)
{
    int rc = dt_ckpt_shard_open(tmp_dir, shard, out);
    if (!rc) {
        (*out)->deferred = 1;
        (*out)->mem = buf;
        (*out)->mem_cap = buf ? cap : 0;
    } else {
        free(buf);
    }
    return rc;
}

int dt_ckpt_shard_open(const char *tmp_dir, uint32_t shard,
                       dt_ckpt_writer_t **out)
{
    *out = NULL;
    dt_ckpt_writer_t *w = calloc(1, sizeof *w);
    if (!w)
        return dt_err_set(DT_ERR_NOMEM, "checkpoint shard: out of memory");
    w->shard = shard;
    dt_ckpt_shard_name(shard, w->file, sizeof w->file);
    char path[PATH_MAX];
    int rc = dt_ckpt_join(path, sizeof path, tmp_dir, w->file);
    if (!rc)
        rc = dt_afile_open(path, &w->f);
    if (rc) {
        free(w);
        return rc;
    }
    *out = w;
    return DT_OK;
}

/* Begin a segment of `count` elements whose first lies at `offset`;
 * block NULL for a flat range. */
static int shard_begin(dt_ckpt_writer_t *w, const char *entry, int dtype,
                       uint64_t offset, uint64_t count,
                       const dt_ckpt_block_t *block)
{
    if (w->in_seg)
        return dt_err_set(DT_ERR_INVALID, "%s: entry %s: segment begun while "
                          "another is open", w->file, entry);
    size_t es = dt_dtype_size(dtype);
    if (es == 0)
        return dt_err_set(DT_ERR_INVALID, "%s: entry %s: unknown dtype %d",
                          w->file, entry, dtype);
    if (strlen(entry) >= DT_CKPT_NAME_MAX || entry[0] == '\0')
        return dt_err_set(DT_ERR_INVALID, "%s: entry name '%s' is empty or "
                          "longer than %d bytes", w->file, entry,
                          DT_CKPT_NAME_MAX - 1);
    if (offset > JSON_INT_MAX || count > JSON_INT_MAX / 8 ||
        offset + count > JSON_INT_MAX)
        return dt_err_set(DT_ERR_INVALID, "%s: entry %s: segment [%" PRIu64
                          ", +%" PRIu64 ") is too large", w->file, entry,
                          offset, count);
    if (w->n == w->cap) {
        size_t nc = w->cap ? 2 * w->cap : 16;
        dt_ckpt_seg_t *s = realloc(w->segs, nc * sizeof *s);
        if (!s)
            return dt_err_set(DT_ERR_NOMEM, "%s: out of memory", w->file);
        w->segs = s;
        w->cap = nc;
    }
    dt_ckpt_seg_t *s = &w->segs[w->n];
    memset(s, 0, sizeof *s);
    memcpy(s->entry, entry, strlen(entry) + 1);
    s->offset = offset;
    s->count = count;
    s->byte_offset = w->deferred ? w->mem_len : dt_afile_offset(w->f);
    s->shard = w->shard;
    s->dtype = dtype;
    if (block)
        s->block = *block;
    w->in_seg = 1;
    w->seg_left = count * es;
    w->crc = 0;
    return DT_OK;
}

int dt_ckpt_shard_begin(dt_ckpt_writer_t *w, const char *entry, int dtype,
                        uint64_t offset, uint64_t count)
{
    return shard_begin(w, entry, dtype, offset, count, NULL);
}

int dt_ckpt_shard_begin_block(dt_ckpt_writer_t *w, const char *entry,
                              int dtype, const dt_ckpt_block_t *b)
{
    char where[48];
    snprintf(where, sizeof where, "%s: ", w->file);
    uint64_t count, first;
    int rc = dt_ckpt_block_check(DT_ERR_INVALID, where, entry, b, &count,
                                 &first);
    if (rc)
        return rc;
    return shard_begin(w, entry, dtype, first, count, b);
}

int dt_ckpt_shard_append(dt_ckpt_writer_t *w, const void *data, size_t nbytes)
{
    if (!w->in_seg || nbytes > w->seg_left)
        return dt_err_set(DT_ERR_INVALID, "%s: %zu bytes appended outside a "
                          "segment or past its end (%" PRIu64 " left)",
                          w->file, nbytes, w->in_seg ? w->seg_left : 0);
    int rc = DT_OK;
    if (w->deferred && w->mem_len + nbytes > w->mem_cap) {
        size_t nc = w->mem_cap ? w->mem_cap : 1 << 20;
        while (nc < w->mem_len + nbytes)
            nc *= 2;
        char *nm = realloc(w->mem, nc);
        if (!nm)
            return dt_err_set(DT_ERR_NOMEM, "%s: out of memory for the %zu-byte snapshot",
                              w->file, nc);
        w->mem = nm;
        w->mem_cap = nc;
    }
    if (w->deferred) {
        memcpy(w->mem + w->mem_len, data, nbytes);
        w->mem_len += nbytes;
    } else if ((rc = dt_afile_write(w->f, data, nbytes))) {
        return rc;
    }
    w->crc = dt_fileutil_crc32(w->crc, data, nbytes);
    w->seg_left -= nbytes;
    return DT_OK;
}

int dt_ckpt_shard_end(dt_ckpt_writer_t *w)
{
    if (!w->in_seg || w->seg_left)
        return dt_err_set(DT_ERR_INVALID, "%s: segment ended with %" PRIu64
                          " bytes still expected", w->file,
                          w->in_seg ? w->seg_left : 0);
    w->segs[w->n].crc32 = w->crc;
    /* An empty range (a rank owning nothing of a unit) stores nothing. */
    if (w->segs[w->n].count > 0)
        w->n++;
    w->in_seg = 0;
    return DT_OK;
}

void dt_ckpt_shard_abort(dt_ckpt_writer_t *w)
{
    if (!w)
        return;
    dt_afile_abort(w->f);
    free(w->mem);
    free(w->segs);
    free(w);
}

int dt_ckpt_shard_close(dt_ckpt_writer_t *w, dt_ckpt_seg_t **segs, size_t *n)
{
    *segs = NULL;
    *n = 0;
    if (w->in_seg) {
        int rc = dt_err_set(DT_ERR_INVALID, "%s: closed inside a segment "
                            "(entry %s)", w->file, w->segs[w->n].entry);
        dt_ckpt_shard_abort(w);
        return rc;
    }
    if (w->deferred) {
        /* the segments now; the bytes at dt_ckpt_shard_finish */
        *segs = w->segs;
        *n = w->n;
        w->segs = NULL;
        w->n = 0;
        return DT_OK;
    }
    int rc = dt_afile_commit(w->f);
    w->f = NULL;
    if (rc) {
        free(w->segs);
        free(w);
        return rc;
    }
    *segs = w->segs;
    *n = w->n;
    free(w);
    return DT_OK;
}

int dt_ckpt_shard_finish(dt_ckpt_writer_t *w, void **buf, size_t *cap)
{
    int rc = dt_afile_write(w->f, w->mem, w->mem_len);
    if (rc)
        dt_afile_abort(w->f);
    else
        rc = dt_afile_commit(w->f);
    *buf = w->mem;
    *cap = w->mem_cap;
    free(w->segs);
    free(w);
    return rc;
}

/* ---- the manifest ---------------------------------------------------- */

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

static cJSON *add_num(cJSON *o, const char *k, uint64_t v)
{
    return cJSON_AddNumberToObject(o, k, (double)v);
}

int dt_ckpt_write_manifest(const char *tmp_dir, const dt_ckpt_info_t *info,
                           const dt_ckpt_entry_t *entries, size_t n_entries,
                           const dt_ckpt_seg_t *segs, size_t n_segs)
{
    int rc = DT_OK;
    const dt_ckpt_seg_t **sorted = malloc((n_segs + 1) * sizeof *sorted);
    cJSON *root = cJSON_CreateObject();
    char *text = NULL;
    if (!sorted || !root) {
        rc = dt_err_set(DT_ERR_NOMEM, "checkpoint manifest: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n_segs; i++)
        sorted[i] = &segs[i];
    qsort(sorted, n_segs, sizeof *sorted, seg_cmp);

    /* Every segment must belong to a declared entry of its dtype. */
    for (size_t i = 0; i < n_segs && !rc; i++) {
        const dt_ckpt_seg_t *s = sorted[i];
        const dt_ckpt_entry_t *e = NULL;
        for (size_t j = 0; j < n_entries && !e; j++)
            if (strcmp(entries[j].name, s->entry) == 0)
                e = &entries[j];
        if (!e)
            rc = dt_err_set(DT_ERR_INVALID, "checkpoint manifest: segment of "
                            "undeclared entry '%s' in shard %" PRIu32,
                            s->entry, s->shard);
        else if (e->dtype != s->dtype)
            rc = dt_err_set(DT_ERR_INVALID, "checkpoint manifest: entry %s is "
                            "%s but shard %" PRIu32 " wrote it as %s",
                            s->entry, dt_dtype_name(e->dtype), s->shard,
                            dt_dtype_name(s->dtype));
    }

    /* The lowest version that describes these segments (ckpt_io.h). */
    int version = DT_CKPT_FORMAT_VERSION_FLAT;
    for (size_t i = 0; i < n_segs; i++)
        if (segs[i].block.ndim > 0)
            version = DT_CKPT_FORMAT_VERSION;
    cJSON_AddStringToObject(root, "format", DT_CKPT_FORMAT);
    add_num(root, "format_version", (uint64_t)version);
    add_num(root, "step", info->step);
    cJSON *wb = cJSON_AddObjectToObject(root, "written_by");
    add_num(wb, "world_size", info->world_size);
    cJSON_AddStringToObject(wb, "strategy", info->strategy ? info->strategy : "");
    cJSON_AddItemToObject(root, "model", info->model
                              ? cJSON_Duplicate(info->model, 1)
                              : cJSON_CreateObject());
    cJSON_AddItemToObject(root, "extra", info->extra
                              ? cJSON_Duplicate(info->extra, 1)
                              : cJSON_CreateObject());
    cJSON *files = cJSON_AddObjectToObject(root, "files");
    cJSON *jents = cJSON_AddObjectToObject(root, "entries");

    /* Shard sizes: segments of one shard are contiguous from byte 0, so
     * the file ends where its last segment ends. */
    for (size_t i = 0; i < n_segs && !rc; i++) {
        char fname[32];
        dt_ckpt_shard_name(segs[i].shard, fname, sizeof fname);
        uint64_t end = segs[i].byte_offset + dt_ckpt_seg_bytes(&segs[i]);
        cJSON *f = cJSON_GetObjectItemCaseSensitive(files, fname);
        if (!f) {
            f = cJSON_AddObjectToObject(files, fname);
            add_num(f, "bytes", end);
        } else if (end > (uint64_t)cJSON_GetObjectItem(f, "bytes")->valuedouble) {
            cJSON_SetNumberValue(cJSON_GetObjectItem(f, "bytes"), (double)end);
        }
    }

    for (size_t j = 0; j < n_entries && !rc; j++) {
        const dt_ckpt_entry_t *e = &entries[j];
        if (dt_dtype_size(e->dtype) == 0 || e->numel > JSON_INT_MAX ||
            e->ndim < 0 || e->ndim > DT_CKPT_MAX_DIMS ||
            cJSON_GetObjectItemCaseSensitive(jents, e->name)) {
            rc = dt_err_set(DT_ERR_INVALID, "checkpoint manifest: entry %s: "
                            "bad or duplicate declaration (dtype %d, ndim %d)",
                            e->name, e->dtype, e->ndim);
            break;
        }
        if (e->ndim > 0) {
            uint64_t prod = 1;
            for (int d = 0; d < e->ndim; d++)
                prod *= (uint64_t)e->shape[d];
            if (prod != e->numel) {
                rc = dt_err_set(DT_ERR_INVALID, "checkpoint manifest: entry "
                                "%s: shape holds %" PRIu64 " elements but "
                                "numel is %" PRIu64, e->name, prod, e->numel);
                break;
            }
        }
        /* This entry's segments are a run in the sorted array. */
        size_t lo = 0;
        while (lo < n_segs && strcmp(sorted[lo]->entry, e->name) < 0)
            lo++;
        size_t hi = lo;
        while (hi < n_segs && strcmp(sorted[hi]->entry, e->name) == 0)
            hi++;
        for (size_t i = lo; i < hi && !rc; i++) {
            const dt_ckpt_block_t *b = &sorted[i]->block;
            uint64_t cnt, first;
            if (b->ndim <= 0)
                continue;
            rc = dt_ckpt_block_check(DT_ERR_INVALID, "checkpoint manifest: ",
                                     e->name, b, &cnt, &first);
            uint64_t tn = 1;
            for (int d = 0; d < b->ndim && !rc; d++)
                tn *= b->shape[d];
            if (!rc && (b->base > e->numel || tn > e->numel - b->base))
                rc = dt_err_set(DT_ERR_INVALID, "checkpoint manifest: entry "
                                "%s: a block's tensor, elements [%" PRIu64
                                ", %" PRIu64 "), lies outside the entry's %"
                                PRIu64 " elements", e->name, b->base,
                                b->base + tn, e->numel);
        }
        if (rc)
            break;
        dt_ckpt_piece_t *pieces = NULL;
        size_t n_pieces = 0;
        rc = dt_ckpt_pieces("checkpoint manifest: ", e, sorted + lo, hi - lo,
                            &pieces, &n_pieces);
        free(pieces);
        if (rc) {
            if (rc == DT_ERR_DATA)
                rc = DT_ERR_INVALID; /* a bug in the caller, not bad data */
            break;
        }
        cJSON *je = cJSON_AddObjectToObject(jents, e->name);
        cJSON_AddStringToObject(je, "dtype", dt_dtype_name(e->dtype));
        add_num(je, "numel", e->numel);
        if (e->ndim > 0) {
            cJSON *sh = cJSON_AddArrayToObject(je, "shape");
            for (int d = 0; d < e->ndim; d++)
                cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e->shape[d]));
        }
        cJSON *js = cJSON_AddArrayToObject(je, "segments");
        for (size_t i = lo; i < hi; i++) {
            const dt_ckpt_seg_t *s = sorted[i];
            char fname[32], crc[16];
            dt_ckpt_shard_name(s->shard, fname, sizeof fname);
            snprintf(crc, sizeof crc, "%08" PRIx32, s->crc32);
            cJSON *o = cJSON_CreateObject();
            if (s->block.ndim > 0) {
                const dt_ckpt_block_t *b = &s->block;
                cJSON *sh = cJSON_CreateArray(), *of = cJSON_CreateArray(),
                      *sz = cJSON_CreateArray();
                for (int d = 0; d < b->ndim; d++) {
                    cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)b->shape[d]));
                    cJSON_AddItemToArray(of, cJSON_CreateNumber((double)b->start[d]));
                    cJSON_AddItemToArray(sz, cJSON_CreateNumber((double)b->size[d]));
                }
                add_num(o, "base", b->base);
                cJSON_AddItemToObject(o, "shape", sh);
                cJSON_AddItemToObject(o, "offsets", of);
                cJSON_AddItemToObject(o, "sizes", sz);
            } else {
                add_num(o, "offset", s->offset);
            }
            add_num(o, "count", s->count);
            cJSON_AddStringToObject(o, "file", fname);
            add_num(o, "byte_offset", s->byte_offset);
            cJSON_AddStringToObject(o, "crc32", crc);
            cJSON_AddItemToArray(js, o);
        }
    }
    if (rc)
        goto out;
    text = cJSON_Print(root);
    if (!text) {
        rc = dt_err_set(DT_ERR_NOMEM, "checkpoint manifest: out of memory");
        goto out;
    }
    char path[PATH_MAX];
    rc = dt_ckpt_join(path, sizeof path, tmp_dir, MANIFEST);
    if (!rc) {
        size_t len = strlen(text);
        text[len] = '\n'; /* replace the NUL: files end with a newline */
        rc = dt_fileutil_write_atomic(path, text, len + 1);
    }
out:
    free(sorted);
    cJSON_Delete(root);
    cJSON_free(text);
    return rc;
}
