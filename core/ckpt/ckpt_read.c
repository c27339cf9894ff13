/*
 * core/ckpt/ckpt_read.c - the reading side of a checkpoint (ckpt_io.h):
 * open a complete checkpoint, check its manifest against the checksum in
 * COMPLETE, validate the manifest (segments, tensor table) and the shard
 * files, and assemble any global range of an entry from whichever
 * segments hold it, checking each segment's CRC-32 the first time it is
 * read.  Every file is opened without following a link and without
 * blocking, and must be a regular file.
 */
#include "ckpt/ckpt_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/tensor.h"
#include "util/error.h"
#include "util/fileutil.h"
#include "util/log.h"

/* Read size when streaming a segment through its CRC. */
#define VERIFY_CHUNK ((size_t)4 << 20)

static int dtype_parse(const char *s)
{
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
        if (strcmp(s, dt_dtype_name(d)) == 0)
            return d;
    return -1;
}

typedef struct {
    char *name;     /* "shard-00000.bin" */
    uint64_t bytes; /* as the manifest says, checked against the file */
    int fd;         /* opened at dt_ckpt_open */
} rfile_t;

typedef struct {
    dt_ckpt_seg_t s;
    uint32_t file;  /* index into files */
    int verified;
} rseg_t;

typedef struct {
    dt_ckpt_entry_t e;
    size_t first, n; /* its segments in segs[], sorted by offset */
    dt_ckpt_piece_t *pieces; /* its contiguous runs, sorted, tiling it;
                              * .seg relative to first */
    size_t n_pieces;
} rentry_t;

struct dt_ckpt_reader {
    char *dir;
    cJSON *json;
    int has_tensors;         /* "model" has a "tensors" table */
    dt_ckpt_tensor_t *tensors;
    size_t n_tensors;
    uint64_t step;
    uint32_t version;        /* format_version (1 when absent) */
    uint32_t world_size;
    const char *strategy;
    const cJSON *model, *extra;
    rentry_t *entries;
    size_t n_entries;
    rseg_t *segs;
    size_t n_segs;
    rfile_t *files;
    size_t n_files;
};

/* Errors while opening carry "checkpoint '<dir>': manifest.json: ". */
#define MERR(r, ...) dt_err_context(dt_err_set(DT_ERR_DATA, __VA_ARGS__), \
                                    "checkpoint '%s': " MANIFEST, (r)->dir)

void dt_ckpt_close(dt_ckpt_reader_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_files; i++) {
        if (r->files[i].fd >= 0)
            close(r->files[i].fd);
        free(r->files[i].name);
    }
    free(r->files);
    free(r->tensors);
    free(r->segs);
    for (size_t i = 0; i < r->n_entries; i++)
        free(r->entries[i].pieces);
    free(r->entries);
    cJSON_Delete(r->json);
    free(r->dir);
    free(r);
}

static int rseg_cmp(const void *a, const void *b)
{
    const rseg_t *x = a, *y = b;
    return x->s.offset < y->s.offset ? -1 : x->s.offset > y->s.offset;
}

/* Find or add a shard file by name; names must be plain file names. */
static int reader_file(dt_ckpt_reader_t *r, const char *name, uint32_t *idx)
{
    for (size_t i = 0; i < r->n_files; i++)
        if (strcmp(r->files[i].name, name) == 0) {
            *idx = (uint32_t)i;
            return DT_OK;
        }
    return MERR(r, "segment file '%s' is not listed in \"files\"", name);
}

/* A block segment's checks beyond its fields (manifest version 2): the
 * block inside its tensor and the tensor inside entry e; s->offset is set
 * to its first element, *count to its elements. */
static int check_block(dt_ckpt_reader_t *r, const dt_ckpt_entry_t *e, int k,
                       dt_ckpt_seg_t *s, uint64_t *count)
{
    const dt_ckpt_block_t *b = &s->block;
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "checkpoint '%s': " MANIFEST ": ", r->dir);
    int rc = dt_ckpt_block_check(DT_ERR_DATA, where, e->name, b, count, &s->offset);
    if (rc)
        return rc;
    uint64_t tn = 1;
    for (int d = 0; d < b->ndim; d++)
        tn *= b->shape[d];
    if (b->base > e->numel || tn > e->numel - b->base)
        return MERR(r, "entry %s: segment %d: the block's tensor, elements [%"
                    PRIu64 ", %" PRIu64 "), lies outside the entry's %" PRIu64
                    " elements", e->name, k, b->base, b->base + tn, e->numel);
    return DT_OK;
}

/* Segment k of entry re from object js, appended to r->segs. */
static int parse_segment(dt_ckpt_reader_t *r, const rentry_t *re, int k, const cJSON *js)
{
    const char *name = re->e.name, *fn = NULL;
    rseg_t *rs = &r->segs[r->n_segs];
    int blk = cJSON_GetObjectItemCaseSensitive(js, "offsets") != NULL;
    if (blk && r->version < 2)
        return MERR(r, "entry %s: segment %d is a block (\"offsets\"), which "
                    "needs format_version 2, but the manifest is version %"
                    PRIu32, name, k, r->version);
    switch (dt_ckpt_seg_from_json(js, &rs->s, &fn)) {
    case 0:
        break;
    case DT_CKPT_SEG_BAD_BLOCK:
        return MERR(r, "entry %s: segment %d: a block needs \"base\" and "
                    "\"shape\", \"offsets\" and \"sizes\" of one length, 1 "
                    "to %d", name, k, DT_CKPT_MAX_DIMS);
    case DT_CKPT_SEG_BAD_CRC:
        return MERR(r, "entry %s: segment %d: bad crc32 '%s'", name, k,
                    cJSON_GetObjectItemCaseSensitive(js, "crc32")->valuestring);
    default:
        return MERR(r, "entry %s: segment %d: needs offset, count, "
                    "file, byte_offset and crc32", name, k);
    }
    uint64_t blk_count = 0;
    int rc = blk ? check_block(r, &re->e, k, &rs->s, &blk_count) : DT_OK;
    if (!rc)
        rc = reader_file(r, fn, &rs->file);
    if (rc)
        return rc;
    memcpy(rs->s.entry, name, strlen(name) + 1);
    rs->s.dtype = re->e.dtype;
    uint64_t end = rs->s.byte_offset + dt_ckpt_seg_bytes(&rs->s);
    if (blk && rs->s.count != blk_count)
        return MERR(r, "entry %s: segment %d: \"count\" %" PRIu64
                    " is not the product of \"sizes\" (%" PRIu64 ")",
                    name, k, rs->s.count, blk_count);
    if (rs->s.count > JSON_INT_MAX / 8 || end > r->files[rs->file].bytes)
        return MERR(r, "entry %s: segment %d needs bytes [%" PRIu64
                    ", %" PRIu64 ") of %s but the manifest gives the "
                    "file %" PRIu64 " bytes", name, k,
                    rs->s.byte_offset, end, fn, r->files[rs->file].bytes);
    r->n_segs++;
    return DT_OK;
}

/* The top: format, version, step, who wrote it, model and extra. */
static int parse_head(dt_ckpt_reader_t *r)
{
    const cJSON *j = r->json;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    uint64_t ver;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, DT_CKPT_FORMAT) != 0)
        return MERR(r, "not a dtrain checkpoint (\"format\" is not \""
                    DT_CKPT_FORMAT "\")");
    /* The earliest manifests have no version: they are version 1. */
    if (!cJSON_GetObjectItemCaseSensitive(j, "format_version"))
        ver = DT_CKPT_FORMAT_VERSION_FLAT;
    else if (!dt_ckpt_json_uint(j, "format_version", &ver) || ver < 1)
        return MERR(r, "bad \"format_version\" (a whole number >= 1)");
    if (ver > DT_CKPT_FORMAT_VERSION)
        return MERR(r, "format_version %" PRIu64 " is newer than this dtrain "
                    "reads (%d): load it with the dtrain that wrote it, or a "
                    "newer one", ver, DT_CKPT_FORMAT_VERSION);
    r->version = (uint32_t)ver;
    if (!dt_ckpt_json_uint(j, "step", &r->step))
        return MERR(r, "missing or bad \"step\"");
    const cJSON *wb = cJSON_GetObjectItemCaseSensitive(j, "written_by");
    uint64_t ws = 0;
    if (cJSON_IsObject(wb) && dt_ckpt_json_uint(wb, "world_size", &ws))
        r->world_size = (uint32_t)ws;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(wb, "strategy");
    r->strategy = cJSON_IsString(st) ? st->valuestring : "";
    r->model = cJSON_GetObjectItemCaseSensitive(j, "model");
    r->extra = cJSON_GetObjectItemCaseSensitive(j, "extra");
    if (!cJSON_IsObject(r->model) || !cJSON_IsObject(r->extra))
        return MERR(r, "\"model\" and \"extra\" must be objects");
    return DT_OK;
}

/* "files": plain names, each once, with their sizes. */
static int parse_files(dt_ckpt_reader_t *r)
{
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(r->json, "files");
    if (!cJSON_IsObject(files))
        return MERR(r, "missing \"files\"");
    size_t nf = (size_t)cJSON_GetArraySize(files);
    r->files = calloc(nf + 1, sizeof *r->files);
    if (!r->files)
        return dt_err_set(DT_ERR_NOMEM, "checkpoint '%s': out of memory", r->dir);
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        rfile_t *rf = &r->files[r->n_files];
        const char *name = f->string;
        if (!name[0] || strchr(name, '/') || strcmp(name, ".") == 0 ||
            strcmp(name, "..") == 0)
            return MERR(r, "file name '%s' is not a plain file name", name);
        for (size_t i = 0; i < r->n_files; i++)
            if (strcmp(r->files[i].name, name) == 0)
                return MERR(r, "file '%s' listed twice", name);
        if (!cJSON_IsObject(f) || !dt_ckpt_json_uint(f, "bytes", &rf->bytes))
            return MERR(r, "file '%s': missing or bad \"bytes\"", name);
        rf->fd = -1;
        if (!(rf->name = strdup(name)))
            return dt_err_set(DT_ERR_NOMEM, "checkpoint '%s': out of memory",
                              r->dir);
        r->n_files++;
    }
    return DT_OK;
}

/* Entry object e (its name, dtype, numel, shape and segments) appended to
 * r->entries, its segments to r->segs sorted by offset. */
static int parse_entry(dt_ckpt_reader_t *r, const cJSON *e)
{
    rentry_t *re = &r->entries[r->n_entries];
    const char *name = e->string;
    if (strlen(name) >= DT_CKPT_NAME_MAX)
        return MERR(r, "entry name '%.40s...' is too long", name);
    for (size_t i = 0; i < r->n_entries; i++)
        if (strcmp(r->entries[i].e.name, name) == 0)
            return MERR(r, "entry %s listed twice", name);
    memcpy(re->e.name, name, strlen(name) + 1);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    re->e.dtype = cJSON_IsString(dt) ? dtype_parse(dt->valuestring) : -1;
    if (re->e.dtype < 0)
        return MERR(r, "entry %s: missing or unknown \"dtype\"", name);
    if (!dt_ckpt_json_uint(e, "numel", &re->e.numel))
        return MERR(r, "entry %s: missing or bad \"numel\"", name);
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    if (sh) {
        int nd = cJSON_GetArraySize(sh);
        if (!cJSON_IsArray(sh) || nd > DT_CKPT_MAX_DIMS)
            return MERR(r, "entry %s: bad \"shape\"", name);
        uint64_t prod = 1;
        const cJSON *d;
        cJSON_ArrayForEach(d, sh) {
            if (!cJSON_IsNumber(d) || d->valuedouble < 0 ||
                d->valuedouble > (double)JSON_INT_MAX)
                return MERR(r, "entry %s: bad \"shape\"", name);
            re->e.shape[re->e.ndim++] = (int64_t)d->valuedouble;
            prod *= (uint64_t)d->valuedouble;
        }
        if (prod != re->e.numel)
            return MERR(r, "entry %s: shape holds %" PRIu64 " elements "
                        "but numel is %" PRIu64, name, prod, re->e.numel);
    }
    re->first = r->n_segs;
    const cJSON *s;
    int k = 0;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(e, "segments")) {
        int rc = parse_segment(r, re, k++, s);
        if (rc)
            return rc;
    }
    re->n = r->n_segs - re->first;
    qsort(r->segs + re->first, re->n, sizeof *r->segs, rseg_cmp);
    r->n_entries++;
    return DT_OK;
}

static int reader_parse(dt_ckpt_reader_t *r)
{
    int rc = parse_head(r);
    if (!rc)
        rc = parse_files(r);
    if (rc)
        return rc;
    /* entries: count segments first to size one array */
    const cJSON *ents = cJSON_GetObjectItemCaseSensitive(r->json, "entries");
    if (!cJSON_IsObject(ents))
        return MERR(r, "missing \"entries\"");
    size_t ne = (size_t)cJSON_GetArraySize(ents), ns = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, ents) {
        const cJSON *sg = cJSON_GetObjectItemCaseSensitive(e, "segments");
        if (!cJSON_IsArray(sg))
            return MERR(r, "entry %s: missing \"segments\"", e->string);
        ns += (size_t)cJSON_GetArraySize(sg);
    }
    r->entries = calloc(ne + 1, sizeof *r->entries);
    r->segs = calloc(ns + 1, sizeof *r->segs);
    if (!r->entries || !r->segs)
        return dt_err_set(DT_ERR_NOMEM, "checkpoint '%s': out of memory", r->dir);
    cJSON_ArrayForEach(e, ents) {
        if ((rc = parse_entry(r, e)))
            return rc;
    }
    return DT_OK;
}

/* The writer's tiling check, over the runs of each entry's segments (kept
 * to read by).  After reader_open_files, and only when the segments'
 * bytes fit in the shard files' (a save never stores a byte twice): a
 * block has at most one run per element, so a small manifest cannot ask
 * for a table of runs larger than the data it describes. */
static int reader_tile(dt_ckpt_reader_t *r)
{
    uint64_t have = 0, claimed = 0;
    for (size_t i = 0; i < r->n_files; i++)
        have += r->files[i].bytes; /* each checked against its file */
    for (size_t i = 0; i < r->n_segs && claimed <= have; i++)
        claimed += dt_ckpt_seg_bytes(&r->segs[i].s); /* each <= 2^53 */
    if (claimed > have)
        return MERR(r, "its segments hold more bytes in all than the shard "
                    "files' %" PRIu64 ": some of them share bytes", have);
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "checkpoint '%s': " MANIFEST ": ", r->dir);
    for (size_t j = 0; j < r->n_entries; j++) {
        rentry_t *re = &r->entries[j];
        const dt_ckpt_seg_t **ptrs = malloc((re->n + 1) * sizeof *ptrs);
        if (!ptrs)
            return dt_err_set(DT_ERR_NOMEM, "checkpoint '%s': out of memory",
                              r->dir);
        for (size_t i = 0; i < re->n; i++)
            ptrs[i] = &r->segs[re->first + i].s;
        int rc = dt_ckpt_pieces(where, &re->e, ptrs, re->n, &re->pieces,
                                &re->n_pieces);
        free(ptrs);
        if (rc)
            return rc;
    }
    return DT_OK;
}

/* A tensor's span with its entry, sorted by entry, offset, then name (so
 * a message naming two tensors at one offset is always the same). */
typedef struct {
    const char *entry;
    dt_ckpt_span_t s;
} tspan_t;

static int tspan_cmp(const void *a, const void *b)
{
    const tspan_t *x = a, *y = b;
    int c = strcmp(x->entry, y->entry);
    if (c)
        return c;
    if (x->s.offset != y->s.offset)
        return x->s.offset < y->s.offset ? -1 : 1;
    return strcmp(x->s.name, y->s.name);
}

_Static_assert(offsetof(dt_ckpt_entry_t, name) == 0,
               "reader_parse_tensors finds an entry from its name's address");

static int str_ptr_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Tensor object t of the tensor table into x (checked: a name, a unit,
 * an offset, a shape of 1 to DT_CKPT_MAX_DIMS whole dimensions) and its
 * span inside its "<unit>/params" entry, found among the sorted entry
 * names. */
static int parse_tensor(dt_ckpt_reader_t *r, const cJSON *t, const char **names,
                        dt_ckpt_tensor_t *x)
{
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(t, "name");
    const cJSON *un = cJSON_GetObjectItemCaseSensitive(t, "unit");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
    int nd = cJSON_IsArray(sh) ? cJSON_GetArraySize(sh) : 0;
    if (!cJSON_IsString(nm) || !nm->valuestring[0] ||
        strlen(nm->valuestring) >= DT_CKPT_NAME_MAX ||
        !cJSON_IsString(un) || !un->valuestring[0] ||
        strlen(un->valuestring) + sizeof "/params" > DT_CKPT_NAME_MAX ||
        !dt_ckpt_json_uint(t, "offset", &x->offset) || nd < 1 ||
        nd > DT_CKPT_MAX_DIMS)
        return MERR(r, "tensor %zu of \"model\".\"tensors\" lacks a name, a "
                    "unit, an offset or a shape of 1 to %d dimensions",
                    r->n_tensors, DT_CKPT_MAX_DIMS);
    memcpy(x->name, nm->valuestring, strlen(nm->valuestring) + 1);
    snprintf(x->entry, sizeof x->entry, "%s/params", un->valuestring);
    x->numel = 1;
    const cJSON *d;
    cJSON_ArrayForEach(d, sh) {
        double v = cJSON_IsNumber(d) ? d->valuedouble : -1;
        if (!(v >= 1 && v <= (double)JSON_INT_MAX) || v != (double)(uint64_t)v ||
            x->numel > JSON_INT_MAX / (uint64_t)v)
            return MERR(r, "tensor %s: bad \"shape\" (dimensions are whole "
                        "numbers >= 1, their product at most 2^53)", x->name);
        x->shape[x->ndim++] = (int64_t)v;
        x->numel *= (uint64_t)v;
    }
    const char *key = x->entry;
    const char **hit = bsearch(&key, names, r->n_entries, sizeof *names, str_ptr_cmp);
    /* name is the first member: its address is the entry's */
    const dt_ckpt_entry_t *e = hit ? (const dt_ckpt_entry_t *)(const void *)*hit : NULL;
    if (!e)
        return MERR(r, "tensor %s: no entry %s", x->name, x->entry);
    if (x->offset > e->numel || x->numel > e->numel - x->offset)
        return MERR(r, "tensor %s: elements [%" PRIu64 ", %" PRIu64 ") lie "
                    "outside entry %s (%" PRIu64 " elements)", x->name,
                    x->offset, x->offset + x->numel, x->entry, e->numel);
    return DT_OK;
}

/* The tensors' spans sp[] (sorted) tile every "<unit>/params" entry, in
 * manifest order, exactly once (a run of the sorted spans; none at all is
 * a gap); `run` has room for every span. */
static int check_tensor_tiling(dt_ckpt_reader_t *r, const tspan_t *sp, dt_ckpt_span_t *run)
{
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "checkpoint '%s': " MANIFEST ": ", r->dir);
    for (size_t i = 0; i < r->n_entries; i++) {
        const dt_ckpt_entry_t *e = &r->entries[i].e;
        size_t len = strlen(e->name);
        if (len < 7 || strcmp(e->name + len - 7, "/params") != 0)
            continue;
        size_t lo = 0, hi = r->n_tensors; /* first span of entry e */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (strcmp(sp[mid].entry, e->name) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        size_t m = 0;
        for (size_t k = lo; k < r->n_tensors && strcmp(sp[k].entry, e->name) == 0; k++)
            run[m++] = sp[k].s;
        int rc = dt_ckpt_check_tiling(where, e, "tensor", run, m);
        if (rc)
            return rc;
    }
    return DT_OK;
}

/* The tensor table ("model"."tensors"), when there is one: every tensor
 * well formed and inside an existing "<unit>/params" entry, and the
 * tensors of each such entry tiling it exactly once.  Kept in manifest
 * order.  O(n log n) in tensors and entries: a manifest is checked before
 * anything in it is trusted, its size included. */
static int reader_parse_tensors(dt_ckpt_reader_t *r)
{
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(r->model, "tensors");
    if (!ts)
        return DT_OK;
    if (!cJSON_IsArray(ts))
        return MERR(r, "\"model\".\"tensors\" is not an array");
    r->has_tensors = 1;
    size_t n = (size_t)cJSON_GetArraySize(ts);
    r->tensors = calloc(n + 1, sizeof *r->tensors);
    tspan_t *sp = calloc(n + 1, sizeof *sp);
    dt_ckpt_span_t *run = calloc(n + 1, sizeof *run);
    const char **names = calloc((n > r->n_entries ? n : r->n_entries) + 1,
                                sizeof *names);
    int rc = DT_OK;
    if (!r->tensors || !sp || !run || !names) {
        rc = dt_err_set(DT_ERR_NOMEM, "checkpoint '%s': out of memory", r->dir);
        goto out;
    }
    /* Entry names, sorted, to look tensors' entries up (each points at
     * its dt_ckpt_entry_t, whose first member it is). */
    for (size_t i = 0; i < r->n_entries; i++)
        names[i] = r->entries[i].e.name;
    qsort(names, r->n_entries, sizeof *names, str_ptr_cmp);
    const cJSON *t;
    cJSON_ArrayForEach(t, ts) {
        dt_ckpt_tensor_t *x = &r->tensors[r->n_tensors];
        if ((rc = parse_tensor(r, t, names, x)))
            goto out;
        sp[r->n_tensors] = (tspan_t){x->entry, {x->offset, x->numel, x->name}};
        r->n_tensors++;
    }
    /* Names unique: adjacent once sorted. */
    for (size_t i = 0; i < r->n_tensors; i++)
        names[i] = r->tensors[i].name;
    qsort(names, r->n_tensors, sizeof *names, str_ptr_cmp);
    for (size_t i = 1; i < r->n_tensors; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            rc = MERR(r, "tensor %s listed twice", names[i]);
            goto out;
        }
    qsort(sp, r->n_tensors, sizeof *sp, tspan_cmp);
    rc = check_tensor_tiling(r, sp, run);
out:
    free(sp);
    free(run);
    free(names);
    return rc;
}

/* Open every shard file (a regular file, not a link: a save never makes
 * one) and compare its size with the manifest. */
static int reader_open_files(dt_ckpt_reader_t *r)
{
    for (size_t i = 0; i < r->n_files; i++) {
        rfile_t *f = &r->files[i];
        char path[PATH_MAX], what[2 * PATH_MAX];
        int rc = dt_ckpt_join(path, sizeof path, r->dir, f->name);
        if (rc)
            return rc;
        snprintf(what, sizeof what, "checkpoint '%s': %s", r->dir, f->name);
        uint64_t size;
        rc = dt_fileutil_open_input(path, DT_FILEUTIL_NOFOLLOW, what, &f->fd,
                                    &size);
        if (rc)
            return rc == DT_ERR_NOT_FOUND ? DT_ERR_DATA : rc;
        if (size != f->bytes)
            return dt_err_set(DT_ERR_DATA, "checkpoint '%s': %s: the manifest "
                              "says %" PRIu64 " bytes but the file has %" PRIu64
                              " bytes", r->dir, f->name, f->bytes, size);
    }
    return DT_OK;
}

/* Read `name` of the checkpoint (a regular file, not a link) whole, at
 * most `max` bytes: DT_ERR_NOT_FOUND when absent. */
static int read_member(const char *dir, const char *name, uint64_t max,
                       char **text, size_t *len)
{
    char path[PATH_MAX], what[2 * PATH_MAX];
    int rc = dt_ckpt_join(path, sizeof path, dir, name);
    if (rc)
        return rc;
    snprintf(what, sizeof what, "checkpoint '%s': %s", dir, name);
    int fd;
    uint64_t size;
    rc = dt_fileutil_open_input(path, DT_FILEUTIL_NOFOLLOW, what, &fd, &size);
    if (rc)
        return rc;
    rc = dt_fileutil_read_fd(fd, size, max, what, text, len);
    close(fd);
    return rc;
}

/* The COMPLETE marker: *sealed = 1 with the manifest's size and CRC-32 it
 * records, 0 for an older dtrain's marker (no checksum), -1 when absent. */
static int read_marker(const char *dir, int *sealed, uint64_t *bytes,
                       uint32_t *crc)
{
    char *text;
    size_t len;
    int rc = read_member(dir, MARKER, MARKER_MAX, &text, &len);
    if (rc == DT_ERR_NOT_FOUND) {
        *sealed = -1;
        return DT_OK;
    }
    if (rc)
        return rc;
    size_t l1 = strlen(MARKER_LINE);
    unsigned long long b = 0;
    unsigned c = 0;
    int used = 0;
    rc = DT_OK;
    if (len < l1 || memcmp(text, MARKER_LINE, l1) != 0) {
        rc = DT_ERR_DATA;
    } else if (len == l1) {
        *sealed = 0;
    } else if (sscanf(text + l1, MANIFEST " %llu bytes crc32 %8x\n%n", &b, &c,
                      &used) == 2 && used > 0 && l1 + (size_t)used == len) {
        char again[128]; /* canonical form only: nothing added or changed */
        snprintf(again, sizeof again, MARKER_SUM_FMT, b, c);
        if (strcmp(again, text + l1) != 0)
            rc = DT_ERR_DATA;
        *sealed = 1;
        *bytes = b;
        *crc = c;
    } else {
        rc = DT_ERR_DATA;
    }
    free(text);
    if (rc)
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': " MARKER ": not a "
                          "completion marker this dtrain reads", dir);
    return DT_OK;
}

int dt_ckpt_open(const char *dir, dt_ckpt_reader_t **out)
{
    return dt_ckpt_open_flags(dir, 0, out);
}

int dt_ckpt_open_flags(const char *dir, unsigned flags, dt_ckpt_reader_t **out)
{
    *out = NULL;
    struct stat st;
    if (stat(dir, &st) != 0)
        return dt_err_set(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                          "checkpoint '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': not a directory", dir);
    int sealed = -1;
    uint64_t sum_bytes = 0;
    uint32_t sum_crc = 0;
    int rc = read_marker(dir, &sealed, &sum_bytes, &sum_crc);
    if (rc)
        return rc;
    if (sealed < 0 && !(flags & DT_CKPT_OPEN_INCOMPLETE))
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': incomplete (no "
                          MARKER " marker): the write was interrupted", dir);
    if (sealed < 0)
        dt_log(DT_LOG_WARN, "ckpt", "warning: checkpoint '%s' has no " MARKER
               " marker: it may be partial (a save that was interrupted), and "
               MANIFEST " has no checksum to be checked against; reading it "
               "anyway", dir);
    else if (sealed == 0)
        dt_log(DT_LOG_WARN, "ckpt", "warning: checkpoint '%s': " MARKER
               " holds no checksum of " MANIFEST " (written by an older "
               "dtrain): the manifest is checked for consistency only", dir);
    dt_ckpt_reader_t *r = calloc(1, sizeof *r);
    if (!r || !(r->dir = strdup(dir))) {
        free(r);
        return dt_err_set(DT_ERR_NOMEM, "checkpoint '%s': out of memory", dir);
    }
    char *text = NULL;
    size_t len = 0;
    rc = read_member(dir, MANIFEST, MANIFEST_MAX, &text, &len);
    if (rc == DT_ERR_NOT_FOUND)
        rc = DT_ERR_DATA; /* COMPLETE without manifest: corrupt */
    if (!rc && sealed > 0) {
        uint32_t crc = dt_fileutil_crc32(0, text, len);
        if (len != sum_bytes || crc != sum_crc)
            rc = dt_err_set(DT_ERR_DATA, "checkpoint '%s': " MANIFEST ": "
                            "checksum mismatch (" MARKER " records %" PRIu64
                            " bytes with crc32 %08" PRIx32 ", the file has %zu "
                            "bytes with crc32 %08" PRIx32 "): it was edited or "
                            "damaged after the save", dir, sum_bytes, sum_crc,
                            len, crc);
    }
    if (!rc) {
        r->json = cJSON_ParseWithLength(text, len);
        if (!r->json || !cJSON_IsObject(r->json)) {
            const char *at = cJSON_GetErrorPtr();
            rc = dt_err_set(DT_ERR_DATA, "checkpoint '%s': " MANIFEST ": not "
                            "valid JSON (near byte %td)", dir,
                            at && at >= text && at <= text + len ? at - text
                                                                 : (ptrdiff_t)0);
        }
    }
    free(text);
    if (!rc)
        rc = reader_parse(r);
    if (!rc)
        rc = reader_parse_tensors(r);
    if (!rc)
        rc = reader_open_files(r);
    if (!rc)
        rc = reader_tile(r);
    if (rc) {
        dt_ckpt_close(r);
        return rc;
    }
    *out = r;
    return DT_OK;
}

uint64_t dt_ckpt_reader_step(const dt_ckpt_reader_t *r) { return r->step; }
uint32_t dt_ckpt_reader_format_version(const dt_ckpt_reader_t *r)
{
    return r->version;
}
uint32_t dt_ckpt_reader_world_size(const dt_ckpt_reader_t *r)
{
    return r->world_size;
}
const char *dt_ckpt_reader_strategy(const dt_ckpt_reader_t *r)
{
    return r->strategy;
}
const cJSON *dt_ckpt_reader_model(const dt_ckpt_reader_t *r) { return r->model; }
const cJSON *dt_ckpt_reader_extra(const dt_ckpt_reader_t *r) { return r->extra; }
size_t dt_ckpt_n_entries(const dt_ckpt_reader_t *r) { return r->n_entries; }

size_t dt_ckpt_entry_n_segments(const dt_ckpt_reader_t *r, size_t i)
{
    return i < r->n_entries ? r->entries[i].n : 0;
}

const dt_ckpt_seg_t *dt_ckpt_segment_at(const dt_ckpt_reader_t *r, size_t entry, size_t k)
{
    if (entry >= r->n_entries || k >= r->entries[entry].n)
        return NULL;
    return &r->segs[r->entries[entry].first + k].s;
}

size_t dt_ckpt_n_files(const dt_ckpt_reader_t *r) { return r->n_files; }

const char *dt_ckpt_file_at(const dt_ckpt_reader_t *r, size_t i, uint64_t *bytes)
{
    if (i >= r->n_files)
        return NULL;
    if (bytes)
        *bytes = r->files[i].bytes;
    return r->files[i].name;
}

const dt_ckpt_entry_t *dt_ckpt_entry_at(const dt_ckpt_reader_t *r, size_t i)
{
    return i < r->n_entries ? &r->entries[i].e : NULL;
}

static rentry_t *entry_find(const dt_ckpt_reader_t *r, const char *name)
{
    for (size_t i = 0; i < r->n_entries; i++)
        if (strcmp(r->entries[i].e.name, name) == 0)
            return &r->entries[i];
    return NULL;
}

const dt_ckpt_entry_t *dt_ckpt_find(const dt_ckpt_reader_t *r,
                                    const char *name)
{
    rentry_t *e = entry_find(r, name);
    return e ? &e->e : NULL;
}

int dt_ckpt_has_tensors(const dt_ckpt_reader_t *r) { return r->has_tensors; }
size_t dt_ckpt_n_tensors(const dt_ckpt_reader_t *r) { return r->n_tensors; }

const dt_ckpt_tensor_t *dt_ckpt_tensor_at(const dt_ckpt_reader_t *r, size_t i)
{
    return i < r->n_tensors ? &r->tensors[i] : NULL;
}

const dt_ckpt_tensor_t *dt_ckpt_find_tensor(const dt_ckpt_reader_t *r,
                                            const char *name)
{
    for (size_t i = 0; i < r->n_tensors; i++)
        if (strcmp(r->tensors[i].name, name) == 0)
            return &r->tensors[i];
    return NULL;
}

/* pread exactly n bytes or fail with the file and entry named. */
static int read_exact(dt_ckpt_reader_t *r, const rseg_t *s, void *dst,
                      size_t n, uint64_t at)
{
    const rfile_t *f = &r->files[s->file];
    char *p = dst;
    while (n > 0) {
        ssize_t got = pread(f->fd, p, n, (off_t)at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return dt_err_set(DT_ERR_IO, "checkpoint '%s': %s: entry %s: %s",
                              r->dir, f->name, s->s.entry,
                              got < 0 ? strerror(errno)
                                      : "file shrank while reading");
        p += got;
        n -= (size_t)got;
        at += (uint64_t)got;
    }
    return DT_OK;
}

/* Stream a whole segment through its CRC, copying element range
 * [lo, hi) (relative to the segment) into dst on the way (dst may be NULL:
 * verify only). */
static int seg_verify(dt_ckpt_reader_t *r, rseg_t *s, uint64_t lo,
                      uint64_t hi, char *dst)
{
    size_t es = dt_dtype_size(s->s.dtype);
    uint64_t total = s->s.count * es, blo = lo * es, bhi = hi * es;
    size_t cap = total < VERIFY_CHUNK ? (size_t)total : VERIFY_CHUNK;
    char *buf = malloc(cap ? cap : 1);
    if (!buf)
        return dt_err_set(DT_ERR_NOMEM, "checkpoint '%s': out of memory",
                          r->dir);
    uint32_t crc = 0;
    int rc = DT_OK;
    for (uint64_t at = 0; at < total && !rc; at += cap) {
        size_t n = total - at < cap ? (size_t)(total - at) : cap;
        rc = read_exact(r, s, buf, n, s->s.byte_offset + at);
        if (rc)
            break;
        crc = dt_fileutil_crc32(crc, buf, n);
        /* overlap of [at, at+n) with the wanted [blo, bhi) */
        uint64_t a = at > blo ? at : blo, b = at + n < bhi ? at + n : bhi;
        if (dst && a < b)
            memcpy(dst + (a - blo), buf + (a - at), (size_t)(b - a));
    }
    free(buf);
    if (rc)
        return rc;
    if (crc != s->s.crc32)
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': %s: entry %s: "
                          "checksum mismatch (expected %08" PRIx32 ", got %08"
                          PRIx32 ")", r->dir, r->files[s->file].name,
                          s->s.entry, s->s.crc32, crc);
    s->verified = 1;
    return DT_OK;
}

/* Entry elements [offset, offset+count) (inside it) into dst, from the
 * pieces that hold them. */
static int entry_read(dt_ckpt_reader_t *r, rentry_t *e, uint64_t offset,
                      uint64_t count, void *dst)
{
    size_t es = dt_dtype_size(e->e.dtype);
    const dt_ckpt_piece_t *p = e->pieces;
    /* First piece ending after `offset` (pieces tile the entry). */
    size_t lo = 0, hi = e->n_pieces;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (p[mid].offset + p[mid].count <= offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint64_t end = offset + count;
    for (size_t i = lo; i < e->n_pieces && p[i].offset < end; i++) {
        rseg_t *s = &r->segs[e->first + p[i].seg];
        uint64_t a = p[i].offset > offset ? p[i].offset : offset;
        uint64_t b = p[i].offset + p[i].count < end ? p[i].offset + p[i].count
                                                    : end;
        uint64_t at = p[i].seg_elem + (a - p[i].offset); /* in the segment */
        char *d = (char *)dst + (a - offset) * es;
        int rc = s->verified
                     ? read_exact(r, s, d, (size_t)((b - a) * es),
                                  s->s.byte_offset + at * es)
                     : seg_verify(r, s, at, at + (b - a), d);
        if (rc)
            return rc;
    }
    return DT_OK;
}

int dt_ckpt_read(dt_ckpt_reader_t *r, const char *entry, uint64_t offset,
                 uint64_t count, void *dst)
{
    rentry_t *e = entry_find(r, entry);
    if (!e)
        return dt_err_set(DT_ERR_NOT_FOUND, "checkpoint '%s': no entry %s",
                          r->dir, entry);
    if (offset > e->e.numel || count > e->e.numel - offset)
        return dt_err_set(DT_ERR_INVALID, "checkpoint '%s': entry %s: range "
                          "[%" PRIu64 ", +%" PRIu64 ") is outside its %" PRIu64
                          " elements", r->dir, entry, offset, count,
                          e->e.numel);
    return entry_read(r, e, offset, count, dst);
}

typedef struct {
    dt_ckpt_reader_t *r;
    rentry_t *e;
    char *dst;
    size_t es;
} block_read_t;

static int block_run_read(void *ctx, uint64_t offset, uint64_t count,
                          uint64_t block_elem)
{
    block_read_t *br = ctx;
    return entry_read(br->r, br->e, offset, count,
                      br->dst + block_elem * br->es);
}

int dt_ckpt_read_block(dt_ckpt_reader_t *r, const char *entry,
                       const dt_ckpt_block_t *b, void *dst)
{
    rentry_t *e = entry_find(r, entry);
    if (!e)
        return dt_err_set(DT_ERR_NOT_FOUND, "checkpoint '%s': no entry %s",
                          r->dir, entry);
    char where[PATH_MAX + 32];
    snprintf(where, sizeof where, "checkpoint '%s': ", r->dir);
    uint64_t count, first, tn = 1;
    int rc = dt_ckpt_block_check(DT_ERR_INVALID, where, entry, b, &count,
                                 &first);
    if (rc)
        return rc;
    for (int d = 0; d < b->ndim; d++)
        tn *= b->shape[d];
    if (b->base > e->e.numel || tn > e->e.numel - b->base)
        return dt_err_set(DT_ERR_INVALID, "checkpoint '%s': entry %s: the "
                          "block's tensor, elements [%" PRIu64 ", %" PRIu64
                          "), lies outside the entry's %" PRIu64 " elements",
                          r->dir, entry, b->base, b->base + tn, e->e.numel);
    block_read_t br = {r, e, dst, dt_dtype_size(e->e.dtype)};
    return dt_ckpt_block_runs(b, block_run_read, &br);
}

int dt_ckpt_verify(dt_ckpt_reader_t *r)
{
    for (size_t i = 0; i < r->n_segs; i++) {
        if (r->segs[i].verified)
            continue;
        int rc = seg_verify(r, &r->segs[i], 0, 0, NULL);
        if (rc)
            return rc;
    }
    return DT_OK;
}
