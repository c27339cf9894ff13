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

/* "; indices [3, 0] to [3, 1] of its shape [8, 5]": where elements
 * [a, b) of an entry of 2 or more dimensions lie; "" otherwise. */
static void region_str(const dt_ckpt_entry_t *e, uint64_t a, uint64_t b,
                       char *buf, size_t cap)
{
    buf[0] = '\0';
    if (e->ndim < 2 || e->ndim > DT_CKPT_MAX_DIMS || b <= a || b > e->numel)
        return;
    uint64_t shape[DT_CKPT_MAX_DIMS], lo[DT_CKPT_MAX_DIMS], hi[DT_CKPT_MAX_DIMS];
    uint64_t x = a, y = b - 1;
    for (int d = e->ndim - 1; d >= 0; d--) {
        shape[d] = (uint64_t)e->shape[d];
        if (shape[d] == 0)
            return;
        lo[d] = x % shape[d];
        hi[d] = y % shape[d];
        x /= shape[d];
        y /= shape[d];
    }
    char l[DT_CKPT_MAX_DIMS * 22 + 4], h[sizeof l], sh[sizeof l];
    dt_ckpt_dims_str(lo, e->ndim, l, sizeof l);
    dt_ckpt_dims_str(hi, e->ndim, h, sizeof h);
    dt_ckpt_dims_str(shape, e->ndim, sh, sizeof sh);
    snprintf(buf, cap, "; indices %s to %s of its shape %s", l, h, sh);
}

/* Spans of one entry, sorted by offset, must tile [0, numel).  `where`
 * prefixes the message. */
int dt_ckpt_check_tiling(const char *where, const dt_ckpt_entry_t *e,
                         const char *noun, const dt_ckpt_span_t *s, size_t n)
{
    const char *entry = e->name;
    const uint64_t numel = e->numel;
    char region[3 * (DT_CKPT_MAX_DIMS * 22 + 4) + 48];
    uint64_t next = 0;
    const char *prev = NULL; /* the span that ends at `next` */
    for (size_t i = 0; i < n; i++) {
        if (s[i].offset > next) {
            region_str(e, next, s[i].offset, region, sizeof region);
            return dt_err_set(DT_ERR_DATA, "%sentry %s: elements [%" PRIu64
                              ", %" PRIu64 ") are in no %s%s", where, entry,
                              next, s[i].offset, noun, region);
        }
        if (s[i].offset < next) {
            uint64_t end = s[i].offset + s[i].count;
            uint64_t stop = next < end ? next : end;
            char who[1024] = "";
            if (s[i].name && prev)
                snprintf(who, sizeof who, " (%s and %s)", prev, s[i].name);
            region_str(e, s[i].offset, stop, region, sizeof region);
            return dt_err_set(DT_ERR_DATA, "%sentry %s: %ss overlap at "
                              "elements [%" PRIu64 ", %" PRIu64 ")%s%s", where,
                              entry, noun, s[i].offset, stop, who, region);
        }
        next = s[i].offset + s[i].count;
        prev = s[i].name;
    }
    if (next > numel) {
        char who[512] = "";
        if (prev)
            snprintf(who, sizeof who, " (%s)", prev);
        return dt_err_set(DT_ERR_DATA, "%sentry %s: %ss reach element %"
                          PRIu64 " but numel is %" PRIu64 "%s", where, entry,
                          noun, next, numel, who);
    }
    if (next < numel) {
        region_str(e, next, numel, region, sizeof region);
        return dt_err_set(DT_ERR_DATA, "%sentry %s: elements [%" PRIu64 ", %"
                          PRIu64 ") are in no %s%s", where, entry, next, numel,
                          noun, region);
    }
    return DT_OK;
}

/* ---- blocks ---------------------------------------------------------- */

void dt_ckpt_dims_str(const uint64_t *v, int n, char *buf, size_t cap)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int d = 0; d < n && at < cap; d++) {
        int k = snprintf(buf + at, cap - at, "%s%" PRIu64, d ? ", " : "[",
                         v[d]);
        if (k < 0)
            return;
        at += (size_t)k;
    }
    if (at < cap)
        snprintf(buf + at, cap - at, "]");
}

int dt_ckpt_block_check(int code, const char *where, const char *entry,
                        const dt_ckpt_block_t *b, uint64_t *count,
                        uint64_t *first)
{
    if (b->ndim < 1 || b->ndim > DT_CKPT_MAX_DIMS)
        return dt_err_set(code, "%sentry %s: a block has 1 to %d dimensions, "
                          "not %d", where, entry, DT_CKPT_MAX_DIMS,
                          (int)b->ndim);
    char sh[DT_CKPT_MAX_DIMS * 22 + 4], st[sizeof sh], sz[sizeof sh];
    dt_ckpt_dims_str(b->shape, b->ndim, sh, sizeof sh);
    dt_ckpt_dims_str(b->start, b->ndim, st, sizeof st);
    dt_ckpt_dims_str(b->size, b->ndim, sz, sizeof sz);
    uint64_t numel = 1, n = 1, at = 0;
    for (int d = 0; d < b->ndim; d++) {
        if (b->shape[d] < 1 || b->shape[d] > JSON_INT_MAX / numel)
            return dt_err_set(code, "%sentry %s: a block's tensor shape %s is "
                              "not whole dimensions >= 1 of at most 2^53 "
                              "elements", where, entry, sh);
        numel *= b->shape[d];
    }
    if (b->base > JSON_INT_MAX - numel)
        return dt_err_set(code, "%sentry %s: a block's tensor at element %"
                          PRIu64 " of shape %s reaches past 2^53", where,
                          entry, b->base, sh);
    for (int d = 0; d < b->ndim; d++) {
        if (b->start[d] > b->shape[d] || b->size[d] > b->shape[d] - b->start[d])
            return dt_err_set(code, "%sentry %s: block at offsets %s with "
                              "sizes %s lies outside the tensor's shape %s",
                              where, entry, st, sz, sh);
        n *= b->size[d];
        at = at * b->shape[d] + b->start[d];
    }
    *count = n;
    *first = b->base + at;
    return DT_OK;
}

int dt_ckpt_block_runs(const dt_ckpt_block_t *b,
                       int (*fn)(void *ctx, uint64_t offset, uint64_t count,
                                 uint64_t block_elem),
                       void *ctx)
{
    uint64_t count, first;
    int rc = dt_ckpt_block_check(DT_ERR_INVALID, "", "?", b, &count, &first);
    if (rc || count == 0)
        return rc;
    /* j: the outermost dimension of the run; the ones after it are
     * spanned whole, so a run is size[j] * (their product) elements. */
    int j = b->ndim - 1;
    uint64_t inner = 1; /* elements per index step of dimension j */
    while (j > 0 && b->start[j] == 0 && b->size[j] == b->shape[j]) {
        inner *= b->shape[j];
        j--;
    }
    uint64_t len = b->size[j] * inner;
    uint64_t stride[DT_CKPT_MAX_DIMS], idx[DT_CKPT_MAX_DIMS] = {0};
    stride[b->ndim - 1] = 1;
    for (int d = b->ndim - 1; d > 0; d--)
        stride[d - 1] = stride[d] * b->shape[d];
    for (uint64_t elem = 0; elem < count; elem += len) {
        uint64_t off = b->base;
        for (int d = 0; d < j; d++)
            off += (b->start[d] + idx[d]) * stride[d];
        off += b->start[j] * stride[j];
        if ((rc = fn(ctx, off, len, elem)))
            return rc;
        for (int d = j - 1; d >= 0; d--) { /* odometer over dims [0, j) */
            if (++idx[d] < b->size[d])
                break;
            idx[d] = 0;
        }
    }
    return DT_OK;
}

typedef struct {
    dt_ckpt_piece_t *p;
    size_t n, cap, seg;
} pieces_t;

static int piece_add(void *ctx, uint64_t offset, uint64_t count,
                     uint64_t seg_elem)
{
    pieces_t *ps = ctx;
    if (ps->n == ps->cap) {
        size_t nc = ps->cap ? 2 * ps->cap : 16;
        dt_ckpt_piece_t *q = realloc(ps->p, nc * sizeof *q);
        if (!q)
            return dt_err_set(DT_ERR_NOMEM, "checkpoint: out of memory");
        ps->p = q;
        ps->cap = nc;
    }
    ps->p[ps->n++] = (dt_ckpt_piece_t){offset, count, seg_elem, ps->seg};
    return DT_OK;
}

static int piece_cmp(const void *a, const void *b)
{
    const dt_ckpt_piece_t *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->seg < y->seg ? -1 : x->seg > y->seg;
}

/* What a segment is, for messages naming two that overlap. */
#define SEG_DESC_MAX 512
static void seg_desc(const dt_ckpt_seg_t *s, char *buf, size_t cap)
{
    char file[32];
    dt_ckpt_shard_name(s->shard, file, sizeof file);
    if (s->block.ndim > 0) {
        char st[DT_CKPT_MAX_DIMS * 22 + 4], sz[sizeof st];
        dt_ckpt_dims_str(s->block.start, s->block.ndim, st, sizeof st);
        dt_ckpt_dims_str(s->block.size, s->block.ndim, sz, sizeof sz);
        snprintf(buf, cap, "block at offsets %s with sizes %s in %s", st, sz,
                 file);
    } else {
        snprintf(buf, cap, "flat range [%" PRIu64 ", %" PRIu64 ") in %s",
                 s->offset, s->offset + s->count, file);
    }
}

int dt_ckpt_pieces(const char *where, const dt_ckpt_entry_t *e,
                   const dt_ckpt_seg_t *const *segs, size_t n,
                   dt_ckpt_piece_t **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    pieces_t ps = {0};
    int rc = DT_OK;
    for (size_t i = 0; i < n && !rc; i++) {
        ps.seg = i;
        if (segs[i]->block.ndim > 0)
            rc = dt_ckpt_block_runs(&segs[i]->block, piece_add, &ps);
        else if (segs[i]->count > 0)
            rc = piece_add(&ps, segs[i]->offset, segs[i]->count, 0);
    }
    dt_ckpt_span_t *spans = NULL;
    char *desc = NULL;
    if (!rc) {
        if (ps.n) /* qsort must not get NULL, even for 0 elements */
            qsort(ps.p, ps.n, sizeof *ps.p, piece_cmp);
        spans = malloc((ps.n + 1) * sizeof *spans);
        desc = malloc((n + 1) * SEG_DESC_MAX);
        if (!spans || !desc)
            rc = dt_err_set(DT_ERR_NOMEM, "checkpoint: out of memory");
    }
    if (!rc) {
        for (size_t i = 0; i < n; i++)
            seg_desc(segs[i], desc + i * SEG_DESC_MAX, SEG_DESC_MAX);
        for (size_t i = 0; i < ps.n; i++)
            spans[i] = (dt_ckpt_span_t){ps.p[i].offset, ps.p[i].count,
                                        desc + ps.p[i].seg * SEG_DESC_MAX};
        rc = dt_ckpt_check_tiling(where, e, "segment", spans, ps.n);
    }
    free(spans);
    free(desc);
    if (rc) {
        free(ps.p);
        return rc;
    }
    *out = ps.p;
    *n_out = ps.n;
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
