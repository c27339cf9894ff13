/*
 * core/ckpt/ckpt_write.c - the writing side of a checkpoint (ckpt_io.h):
 * shard writers that stream segments into one file per rank with their
 * CRC-32, or (deferred, for an asynchronous save) keep the bytes in memory
 * until dt_ckpt_shard_finish, on the save's thread, checksums and writes
 * them.  Rank 0's manifest is ckpt_manifest.c's.
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
    if (w->deferred) {
        void *dst;
        int rc = dt_ckpt_shard_reserve(w, nbytes, &dst);
        if (!rc)
            memcpy(dst, data, nbytes);
        return rc;
    }
    int rc = dt_afile_write(w->f, data, nbytes);
    if (rc)
        return rc;
    w->crc = dt_fileutil_crc32(w->crc, data, nbytes);
    w->seg_left -= nbytes;
    return DT_OK;
}

int dt_ckpt_shard_reserve(dt_ckpt_writer_t *w, size_t nbytes, void **dst)
{
    *dst = NULL;
    if (!w->deferred || !w->in_seg || nbytes > w->seg_left)
        return dt_err_set(DT_ERR_INVALID, "%s: %zu bytes reserved %s (%" PRIu64 " left)",
                          w->file, nbytes,
                          w->deferred ? "outside a segment or past its end"
                                      : "in a shard that is not deferred",
                          w->in_seg ? w->seg_left : 0);
    if (w->mem_len + nbytes > w->mem_cap) {
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
    *dst = w->mem + w->mem_len;
    w->mem_len += nbytes;
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
    if (w->deferred) /* the segments and the bytes at dt_ckpt_shard_finish */
        return DT_OK;
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

/* Bytes checksummed and written at a time: the CRC reads them into the
 * cache, the write copies them from there. */
#define FINISH_CHUNK ((size_t)4 << 20)

int dt_ckpt_shard_finish(dt_ckpt_writer_t *w, dt_ckpt_seg_t **segs, size_t *n, void **buf,
                         size_t *cap)
{
    int rc = DT_OK;
    size_t at = 0; /* bytes of w->mem written */
    for (size_t i = 0; i < w->n && !rc; i++) {
        dt_ckpt_seg_t *s = &w->segs[i];
        const size_t end = (size_t)s->byte_offset + (size_t)s->count * dt_dtype_size(s->dtype);
        uint32_t crc = 0;
        for (size_t p = (size_t)s->byte_offset; p < end && !rc; p += FINISH_CHUNK) {
            const size_t len = end - p < FINISH_CHUNK ? end - p : FINISH_CHUNK;
            crc = dt_fileutil_crc32(crc, w->mem + p, len);
            rc = dt_afile_write(w->f, w->mem + at, p + len - at);
            at = p + len;
        }
        s->crc32 = crc;
    }
    if (!rc && at < w->mem_len) /* nothing is appended outside a segment */
        rc = dt_afile_write(w->f, w->mem + at, w->mem_len - at);
    if (rc)
        dt_afile_abort(w->f);
    else
        rc = dt_afile_commit(w->f);
    *segs = rc ? NULL : w->segs;
    *n = rc ? 0 : w->n;
    if (rc)
        free(w->segs);
    *buf = w->mem;
    *cap = w->mem_cap;
    free(w);
    return rc;
}
