/*
 * core/ckpt/ckpt_io.c - sharded checkpoint directories: shard writers,
 * the manifest, the COMPLETE marker and atomic directory rename, and a
 * reader that assembles any global range from whichever segments hold it.
 */
#include "ckpt/ckpt_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/tensor.h"
#include "util/fileutil.h"
#include "util/error.h"

#define MANIFEST "manifest.json"
#define MARKER "COMPLETE"
/* Largest integer a JSON number (a double) holds exactly. */
#define JSON_INT_MAX (UINT64_C(1) << 53)
/* Read size when streaming a segment through its CRC. */
#define VERIFY_CHUNK ((size_t)4 << 20)

static int dtype_parse(const char *s)
{
    for (int d = 0; d < DT_DTYPE_COUNT; d++)
        if (strcmp(s, dt_dtype_name(d)) == 0)
            return d;
    return -1;
}

static void shard_name(uint32_t shard, char *buf, size_t cap)
{
    snprintf(buf, cap, "shard-%05" PRIu32 ".bin", shard);
}

static int join(char *buf, size_t cap, const char *dir, const char *name)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return dt_err_set(DT_ERR_INVALID, "path '%s/%s' is too long", dir,
                          name);
    return DT_OK;
}

int dt_ckpt_step_dir(const char *root, uint64_t step, int tmp, char *buf,
                     size_t cap)
{
    int n = snprintf(buf, cap, "%s/step-%08" PRIu64 "%s", root, step,
                     tmp ? ".tmp" : "");
    if (n < 0 || (size_t)n >= cap)
        return dt_err_set(DT_ERR_INVALID, "checkpoint path under '%s' is too "
                          "long", root);
    return DT_OK;
}

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
};

int dt_ckpt_begin(const char *root, uint64_t step, char *tmp_dir, size_t cap)
{
    int rc = dt_fileutil_mkdir_p(root);
    if (!rc)
        rc = dt_ckpt_step_dir(root, step, 1, tmp_dir, cap);
    if (!rc)
        rc = dt_fileutil_rm_rf(tmp_dir);
    if (!rc && mkdir(tmp_dir, 0755) != 0)
        rc = dt_err_set(DT_ERR_IO, "creating directory '%s': %s", tmp_dir,
                        strerror(errno));
    if (rc)
        return dt_err_context(rc, "saving checkpoint step %" PRIu64, step);
    return DT_OK;
}

int dt_ckpt_shard_open(const char *tmp_dir, uint32_t shard,
                       dt_ckpt_writer_t **out)
{
    *out = NULL;
    dt_ckpt_writer_t *w = calloc(1, sizeof *w);
    if (!w)
        return dt_err_set(DT_ERR_NOMEM, "checkpoint shard: out of memory");
    w->shard = shard;
    shard_name(shard, w->file, sizeof w->file);
    char path[PATH_MAX];
    int rc = join(path, sizeof path, tmp_dir, w->file);
    if (!rc)
        rc = dt_afile_open(path, &w->f);
    if (rc) {
        free(w);
        return rc;
    }
    *out = w;
    return DT_OK;
}

int dt_ckpt_shard_begin(dt_ckpt_writer_t *w, const char *entry, int dtype,
                        uint64_t offset, uint64_t count)
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
    s->byte_offset = dt_afile_offset(w->f);
    s->shard = w->shard;
    s->dtype = dtype;
    w->in_seg = 1;
    w->seg_left = count * es;
    w->crc = 0;
    return DT_OK;
}

int dt_ckpt_shard_append(dt_ckpt_writer_t *w, const void *data, size_t nbytes)
{
    if (!w->in_seg || nbytes > w->seg_left)
        return dt_err_set(DT_ERR_INVALID, "%s: %zu bytes appended outside a "
                          "segment or past its end (%" PRIu64 " left)",
                          w->file, nbytes, w->in_seg ? w->seg_left : 0);
    int rc = dt_afile_write(w->f, data, nbytes);
    if (rc)
        return rc;
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

int dt_ckpt_shard_write(dt_ckpt_writer_t *w, const char *entry, int dtype,
                        uint64_t offset, uint64_t count, const void *data)
{
    int rc = dt_ckpt_shard_begin(w, entry, dtype, offset, count);
    if (!rc)
        rc = dt_ckpt_shard_append(w, data, (size_t)(count * dt_dtype_size(dtype)));
    if (!rc)
        rc = dt_ckpt_shard_end(w);
    return rc;
}

void dt_ckpt_shard_abort(dt_ckpt_writer_t *w)
{
    if (!w)
        return;
    dt_afile_abort(w->f);
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

/* ---- the manifest ---------------------------------------------------- */

static int seg_cmp(const void *a, const void *b)
{
    const dt_ckpt_seg_t *x = *(const dt_ckpt_seg_t *const *)a;
    const dt_ckpt_seg_t *y = *(const dt_ckpt_seg_t *const *)b;
    int c = strcmp(x->entry, y->entry);
    if (c)
        return c;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Segments of one entry, sorted by offset, must tile [0, numel).  `where`
 * prefixes the message. */
static int check_tiling(const char *where, const char *entry, uint64_t numel,
                        const dt_ckpt_seg_t *const *s, size_t n)
{
    uint64_t next = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i]->offset > next)
            return dt_err_set(DT_ERR_DATA, "%sentry %s: elements [%" PRIu64
                              ", %" PRIu64 ") are in no segment", where, entry,
                              next, s[i]->offset);
        if (s[i]->offset < next)
            return dt_err_set(DT_ERR_DATA, "%sentry %s: segments overlap at "
                              "elements [%" PRIu64 ", %" PRIu64 ")", where,
                              entry, s[i]->offset,
                              next < s[i]->offset + s[i]->count
                                  ? next : s[i]->offset + s[i]->count);
        next = s[i]->offset + s[i]->count;
    }
    if (next > numel)
        return dt_err_set(DT_ERR_DATA, "%sentry %s: segments reach element %"
                          PRIu64 " but numel is %" PRIu64, where, entry, next,
                          numel);
    if (next < numel)
        return dt_err_set(DT_ERR_DATA, "%sentry %s: elements [%" PRIu64 ", %"
                          PRIu64 ") are in no segment", where, entry, next,
                          numel);
    return DT_OK;
}

/* Segment bytes (count * dtype size); dtype already validated. */
static uint64_t seg_bytes(const dt_ckpt_seg_t *s)
{
    return s->count * dt_dtype_size(s->dtype);
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

    cJSON_AddStringToObject(root, "format", DT_CKPT_FORMAT);
    add_num(root, "format_version", DT_CKPT_FORMAT_VERSION);
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
        shard_name(segs[i].shard, fname, sizeof fname);
        uint64_t end = segs[i].byte_offset + seg_bytes(&segs[i]);
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
        rc = check_tiling("checkpoint manifest: ", e->name, e->numel,
                          sorted + lo, hi - lo);
        if (rc) {
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
            shard_name(s->shard, fname, sizeof fname);
            snprintf(crc, sizeof crc, "%08" PRIx32, s->crc32);
            cJSON *o = cJSON_CreateObject();
            add_num(o, "offset", s->offset);
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
    rc = join(path, sizeof path, tmp_dir, MANIFEST);
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

/* ---- commit / abort -------------------------------------------------- */

int dt_ckpt_commit(const char *root, uint64_t step)
{
    char tmp[PATH_MAX], fin[PATH_MAX], path[PATH_MAX];
    int rc = dt_ckpt_step_dir(root, step, 1, tmp, sizeof tmp);
    if (!rc)
        rc = dt_ckpt_step_dir(root, step, 0, fin, sizeof fin);
    if (!rc)
        rc = join(path, sizeof path, tmp, MANIFEST);
    if (rc)
        return rc;
    if (access(path, F_OK) != 0)
        return dt_err_set(DT_ERR_INVALID, "checkpoint '%s': commit without a "
                          "manifest", tmp);
    static const char marker[] = "dtrain checkpoint complete\n";
    rc = join(path, sizeof path, tmp, MARKER);
    if (!rc)
        rc = dt_fileutil_write_atomic(path, marker, sizeof marker - 1);
    if (rc)
        return rc;
    /* Shards were fsynced by their writers; the directory's own entries
     * (file names) were synced by each atomic write's directory fsync. */
    if (rename(tmp, fin) != 0) {
        if (errno != ENOTEMPTY && errno != EEXIST)
            return dt_err_set(DT_ERR_IO, "checkpoint '%s': renaming from "
                              "'%s': %s", fin, tmp, strerror(errno));
        /* The step was saved before (a resumed run saving it again): swap
         * atomically so the step directory always holds a complete
         * checkpoint, then drop the old one, which now sits at tmp. */
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, fin, RENAME_EXCHANGE) != 0) {
            /* No RENAME_EXCHANGE on this filesystem: move the old aside.
             * A crash in between leaves no step dir, but the aside copy and
             * the tmp dir both survive for manual recovery. */
            char old[PATH_MAX + 8];
            snprintf(old, sizeof old, "%s.old", fin);
            if (dt_fileutil_rm_rf(old) || rename(fin, old) != 0 ||
                rename(tmp, fin) != 0)
                return dt_err_set(DT_ERR_IO, "checkpoint '%s': replacing the "
                                  "earlier save of this step: %s", fin,
                                  strerror(errno));
            rc = dt_fileutil_fsync_dir(root);
            int rm = dt_fileutil_rm_rf(old);
            return rc ? rc : rm;
        }
        rc = dt_fileutil_fsync_dir(root);
        int rm = dt_fileutil_rm_rf(tmp);
        return rc ? rc : rm;
    }
    return dt_fileutil_fsync_dir(root);
}

int dt_ckpt_abort(const char *root, uint64_t step)
{
    char tmp[PATH_MAX];
    int rc = dt_ckpt_step_dir(root, step, 1, tmp, sizeof tmp);
    if (!rc)
        rc = dt_fileutil_rm_rf(tmp);
    return rc;
}

/* ---- finding and pruning --------------------------------------------- */

/* "step-" then at least 8 digits and nothing else. */
static int parse_step_name(const char *name, uint64_t *step)
{
    if (strncmp(name, "step-", 5) != 0)
        return 0;
    const char *p = name + 5;
    size_t nd = strspn(p, "0123456789");
    if (nd < 8 || nd > 19 || p[nd] != '\0')
        return 0;
    *step = strtoull(p, NULL, 10);
    return 1;
}

static int is_complete(const char *root, const char *name)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s/" MARKER, root, name) >=
        (int)sizeof path)
        return 0;
    return access(path, F_OK) == 0;
}

/* Steps of complete checkpoints under root, malloc'd, unsorted. */
static int list_complete(const char *root, uint64_t **steps, size_t *n)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(root);
    if (!d)
        return dt_err_set(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                          "checkpoint folder '%s': %s", root, strerror(errno));
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        uint64_t s;
        if (!parse_step_name(de->d_name, &s) || !is_complete(root, de->d_name))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            uint64_t *ns = realloc(*steps, cap * sizeof *ns);
            if (!ns) {
                closedir(d);
                free(*steps);
                *steps = NULL;
                *n = 0;
                return dt_err_set(DT_ERR_NOMEM, "listing '%s': out of memory",
                                  root);
            }
            *steps = ns;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    return DT_OK;
}

int dt_ckpt_latest(const char *root, char *dir, size_t cap, uint64_t *step)
{
    uint64_t *steps;
    size_t n;
    int rc = list_complete(root, &steps, &n);
    if (rc == DT_ERR_NOT_FOUND || (!rc && n == 0)) {
        free(steps);
        return dt_err_set(DT_ERR_NOT_FOUND, "no complete checkpoint in '%s'",
                          root);
    }
    if (rc)
        return rc;
    uint64_t best = steps[0];
    for (size_t i = 1; i < n; i++)
        best = steps[i] > best ? steps[i] : best;
    free(steps);
    if (step)
        *step = best;
    return dt_ckpt_step_dir(root, best, 0, dir, cap);
}

int dt_ckpt_clean_stale(const char *root)
{
    DIR *d = opendir(root);
    if (!d)
        return errno == ENOENT ? DT_OK
                               : dt_err_set(DT_ERR_IO, "checkpoint folder "
                                            "'%s': %s", root, strerror(errno));
    int rc = DT_OK;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        const char *dot = strrchr(de->d_name, '.');
        uint64_t step;
        char base[256];
        if (!dot || (strcmp(dot, ".tmp") != 0 && strcmp(dot, ".old") != 0) ||
            (size_t)(dot - de->d_name) >= sizeof base)
            continue;
        memcpy(base, de->d_name, (size_t)(dot - de->d_name));
        base[dot - de->d_name] = '\0';
        if (!parse_step_name(base, &step))
            continue;
        char path[PATH_MAX];
        rc = join(path, sizeof path, root, de->d_name);
        if (!rc)
            rc = dt_fileutil_rm_rf(path);
    }
    closedir(d);
    return rc;
}

static int u64_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int dt_ckpt_prune(const char *root, uint32_t keep)
{
    if (keep == 0)
        return dt_err_set(DT_ERR_INVALID, "checkpoint prune: keep must be at "
                          "least 1");
    uint64_t *steps;
    size_t n;
    int rc = list_complete(root, &steps, &n);
    if (rc == DT_ERR_NOT_FOUND)
        return DT_OK;
    if (rc)
        return rc;
    qsort(steps, n, sizeof *steps, u64_desc);
    for (size_t i = keep; i < n && !rc; i++) {
        char dir[PATH_MAX];
        rc = dt_ckpt_step_dir(root, steps[i], 0, dir, sizeof dir);
        /* Remove the marker first: a crash mid-delete then leaves an
         * incomplete directory that is never loaded, not a torn one. */
        char marker[PATH_MAX + 16];
        snprintf(marker, sizeof marker, "%s/" MARKER, dir);
        if (!rc && unlink(marker) != 0 && errno != ENOENT)
            rc = dt_err_set(DT_ERR_IO, "pruning '%s': %s", dir,
                            strerror(errno));
        if (!rc)
            rc = dt_fileutil_rm_rf(dir);
    }
    free(steps);
    if (!rc)
        rc = dt_fileutil_fsync_dir(root);
    return rc;
}

/* ---- reading --------------------------------------------------------- */

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
} rentry_t;

struct dt_ckpt_reader {
    char *dir;
    cJSON *json;
    uint64_t step;
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

/* An exact non-negative integer field (JSON numbers are doubles). */
static int json_uint(const cJSON *o, const char *key, uint64_t *v)
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
    free(r->segs);
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

static int reader_parse(dt_ckpt_reader_t *r)
{
    const cJSON *j = r->json;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    uint64_t ver;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, DT_CKPT_FORMAT) != 0)
        return MERR(r, "not a dtrain checkpoint (\"format\" is not \""
                    DT_CKPT_FORMAT "\")");
    if (!json_uint(j, "format_version", &ver))
        return MERR(r, "missing or bad \"format_version\"");
    if (ver != DT_CKPT_FORMAT_VERSION)
        return MERR(r, "format_version %" PRIu64 " is not the one this dtrain "
                    "reads (%d)", ver, DT_CKPT_FORMAT_VERSION);
    if (!json_uint(j, "step", &r->step))
        return MERR(r, "missing or bad \"step\"");
    const cJSON *wb = cJSON_GetObjectItemCaseSensitive(j, "written_by");
    uint64_t ws = 0;
    if (cJSON_IsObject(wb) && json_uint(wb, "world_size", &ws))
        r->world_size = (uint32_t)ws;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(wb, "strategy");
    r->strategy = cJSON_IsString(st) ? st->valuestring : "";
    r->model = cJSON_GetObjectItemCaseSensitive(j, "model");
    r->extra = cJSON_GetObjectItemCaseSensitive(j, "extra");
    if (!cJSON_IsObject(r->model) || !cJSON_IsObject(r->extra))
        return MERR(r, "\"model\" and \"extra\" must be objects");

    /* files */
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
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
        if (!cJSON_IsObject(f) || !json_uint(f, "bytes", &rf->bytes))
            return MERR(r, "file '%s': missing or bad \"bytes\"", name);
        rf->fd = -1;
        if (!(rf->name = strdup(name)))
            return dt_err_set(DT_ERR_NOMEM, "checkpoint '%s': out of memory",
                              r->dir);
        r->n_files++;
    }

    /* entries: count segments first to size one array */
    const cJSON *ents = cJSON_GetObjectItemCaseSensitive(j, "entries");
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
        if (!json_uint(e, "numel", &re->e.numel))
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
            rseg_t *rs = &r->segs[r->n_segs];
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(s, "file");
            const cJSON *crc = cJSON_GetObjectItemCaseSensitive(s, "crc32");
            char *endp = NULL;
            if (!json_uint(s, "offset", &rs->s.offset) ||
                !json_uint(s, "count", &rs->s.count) ||
                !json_uint(s, "byte_offset", &rs->s.byte_offset) ||
                !cJSON_IsString(fn) || !cJSON_IsString(crc))
                return MERR(r, "entry %s: segment %d: needs offset, count, "
                            "file, byte_offset and crc32", name, k);
            unsigned long cv = strtoul(crc->valuestring, &endp, 16);
            if (strlen(crc->valuestring) != 8 || *endp != '\0')
                return MERR(r, "entry %s: segment %d: bad crc32 '%s'", name, k,
                            crc->valuestring);
            int rc = reader_file(r, fn->valuestring, &rs->file);
            if (rc)
                return rc;
            memcpy(rs->s.entry, name, strlen(name) + 1);
            rs->s.crc32 = (uint32_t)cv;
            rs->s.dtype = re->e.dtype;
            rs->s.shard = UINT32_MAX;
            sscanf(fn->valuestring, "shard-%" SCNu32 ".bin", &rs->s.shard);
            uint64_t end = rs->s.byte_offset + seg_bytes(&rs->s);
            if (rs->s.count > JSON_INT_MAX / 8 || end > r->files[rs->file].bytes)
                return MERR(r, "entry %s: segment %d needs bytes [%" PRIu64
                            ", %" PRIu64 ") of %s but the manifest gives the "
                            "file %" PRIu64 " bytes", name, k,
                            rs->s.byte_offset, end, fn->valuestring,
                            r->files[rs->file].bytes);
            r->n_segs++;
            k++;
        }
        re->n = r->n_segs - re->first;
        qsort(r->segs + re->first, re->n, sizeof *r->segs, rseg_cmp);
        /* Reuse the writer's tiling check through pointer views. */
        const dt_ckpt_seg_t **view = malloc((re->n + 1) * sizeof *view);
        if (!view)
            return dt_err_set(DT_ERR_NOMEM, "checkpoint '%s': out of memory",
                              r->dir);
        for (size_t i = 0; i < re->n; i++)
            view[i] = &r->segs[re->first + i].s;
        char where[PATH_MAX + 32];
        snprintf(where, sizeof where, "checkpoint '%s': " MANIFEST ": ", r->dir);
        int rc = check_tiling(where, name, re->e.numel, view, re->n);
        free(view);
        if (rc)
            return rc;
        r->n_entries++;
    }
    return DT_OK;
}

/* Open every shard file and compare its size with the manifest. */
static int reader_open_files(dt_ckpt_reader_t *r)
{
    for (size_t i = 0; i < r->n_files; i++) {
        rfile_t *f = &r->files[i];
        char path[PATH_MAX];
        int rc = join(path, sizeof path, r->dir, f->name);
        if (rc)
            return rc;
        f->fd = open(path, O_RDONLY | O_CLOEXEC);
        if (f->fd < 0)
            return dt_err_set(errno == ENOENT ? DT_ERR_DATA : DT_ERR_IO,
                              "checkpoint '%s': %s: %s", r->dir, f->name,
                              strerror(errno));
        struct stat st;
        if (fstat(f->fd, &st) != 0)
            return dt_err_set(DT_ERR_IO, "checkpoint '%s': %s: %s", r->dir,
                              f->name, strerror(errno));
        if ((uint64_t)st.st_size != f->bytes)
            return dt_err_set(DT_ERR_DATA, "checkpoint '%s': %s: the manifest "
                              "says %" PRIu64 " bytes but the file has %" PRIu64
                              " bytes", r->dir, f->name, f->bytes,
                              (uint64_t)st.st_size);
    }
    return DT_OK;
}

int dt_ckpt_open(const char *dir, dt_ckpt_reader_t **out)
{
    *out = NULL;
    struct stat st;
    if (stat(dir, &st) != 0)
        return dt_err_set(errno == ENOENT ? DT_ERR_NOT_FOUND : DT_ERR_IO,
                          "checkpoint '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': not a directory", dir);
    char path[PATH_MAX];
    int rc = join(path, sizeof path, dir, MARKER);
    if (rc)
        return rc;
    if (access(path, F_OK) != 0)
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': incomplete (no "
                          MARKER " marker): the write was interrupted", dir);
    dt_ckpt_reader_t *r = calloc(1, sizeof *r);
    if (!r || !(r->dir = strdup(dir))) {
        free(r);
        return dt_err_set(DT_ERR_NOMEM, "checkpoint '%s': out of memory", dir);
    }
    char *text = NULL;
    size_t len;
    rc = join(path, sizeof path, dir, MANIFEST);
    if (!rc) {
        rc = dt_fileutil_read_all(path, &text, &len);
        if (rc == DT_ERR_NOT_FOUND)
            rc = DT_ERR_DATA; /* COMPLETE without manifest: corrupt */
        if (rc)
            dt_err_context(rc, "checkpoint '%s'", dir);
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
        rc = reader_open_files(r);
    if (rc) {
        dt_ckpt_close(r);
        return rc;
    }
    *out = r;
    return DT_OK;
}

uint64_t dt_ckpt_reader_step(const dt_ckpt_reader_t *r) { return r->step; }
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
    size_t es = dt_dtype_size(e->e.dtype);
    rseg_t *segs = r->segs + e->first;
    /* First segment ending after `offset` (segments tile the entry). */
    size_t lo = 0, hi = e->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (segs[mid].s.offset + segs[mid].s.count <= offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint64_t end = offset + count;
    for (size_t i = lo; i < e->n && segs[i].s.offset < end; i++) {
        rseg_t *s = &segs[i];
        uint64_t a = s->s.offset > offset ? s->s.offset : offset;
        uint64_t b = s->s.offset + s->s.count < end ? s->s.offset + s->s.count
                                                    : end;
        char *d = (char *)dst + (a - offset) * es;
        int rc = s->verified
                     ? read_exact(r, s, d, (size_t)((b - a) * es),
                                  s->s.byte_offset + (a - s->s.offset) * es)
                     : seg_verify(r, s, a - s->s.offset, b - s->s.offset, d);
        if (rc)
            return rc;
    }
    return DT_OK;
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

/* ---- JSON helpers ---------------------------------------------------- */

int dt_ckpt_json_add_u64(cJSON *obj, const char *key, uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    if (!cJSON_AddStringToObject(obj, key, buf))
        return dt_err_set(DT_ERR_NOMEM, "json: adding '%s': out of memory", key);
    return DT_OK;
}

int dt_ckpt_json_get_u64(const cJSON *obj, const char *key, uint64_t *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it)
        return dt_err_set(DT_ERR_NOT_FOUND, "json: no key '%s'", key);
    if (json_uint(obj, key, v))
        return DT_OK;
    if (cJSON_IsString(it)) {
        const char *s = it->valuestring;
        char *endp;
        errno = 0;
        unsigned long long x = strtoull(s, &endp, 10);
        if (s[0] >= '0' && s[0] <= '9' && *endp == '\0' && errno == 0) {
            *v = x;
            return DT_OK;
        }
    }
    return dt_err_set(DT_ERR_DATA, "json: '%s' is not an unsigned 64-bit "
                      "integer", key);
}
