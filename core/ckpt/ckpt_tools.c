/*
 * core/ckpt/ckpt_tools.c - inspect, consolidate and export a checkpoint
 * from its manifest and shards; import Hugging Face weights (one file or a
 * sharded set) as a checkpoint.  Hugging Face's names, layouts and
 * config.json are the model plugin's (hf_model.h).
 */
#include "ckpt/ckpt_tools.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtrain/half.h"
#include "dtrain/tensor.h"
#include "ckpt/ckpt.h"
#include "ckpt/ckpt_io.h"
#include "ckpt/hf_model.h"
#include "ckpt/safetensors.h"
#include "ckpt/safetensors_set.h"
#include "loader/plugin_handle.h"
#include "model/model.h"
#include "util/error.h"
#include "util/fileutil.h"
#include "util/log.h"

#define DEFAULT_CHUNK (4u << 20)

static void print_json_scalars(FILE *out, const char *indent, const cJSON *obj)
{
    const cJSON *it;
    cJSON_ArrayForEach(it, obj)
    {
        if (cJSON_IsString(it))
            fprintf(out, "%s%s = %s\n", indent, it->string, it->valuestring);
        else if (cJSON_IsNumber(it))
            fprintf(out, "%s%s = %.17g\n", indent, it->string, it->valuedouble);
    }
}

/* A block segment as " block [r0:r1, c0:c1] of [R, C] at B". */
static void print_block(FILE *out, const dt_ckpt_block_t *b)
{
    fprintf(out, " block [");
    for (int d = 0; d < b->ndim; d++)
        fprintf(out, "%s%" PRIu64 ":%" PRIu64, d ? ", " : "", b->start[d],
                b->start[d] + b->size[d]);
    fprintf(out, "] of [");
    for (int d = 0; d < b->ndim; d++)
        fprintf(out, "%s%" PRIu64, d ? ", " : "", b->shape[d]);
    fprintf(out, "] at %" PRIu64, b->base);
}

int dt_ckpt_inspect(const char *dir, int verify, FILE *out)
{
    dt_ckpt_reader_t *r = NULL;
    int rc = dt_ckpt_open_flags(dir, DT_CKPT_OPEN_INCOMPLETE, &r);
    if (rc)
        return rc;
    const char *strat = dt_ckpt_reader_strategy(r);
    fprintf(out, "checkpoint %s\n  step %" PRIu64 ", written by %u rank(s)%s%s, format "
            "version %u\n", dir, dt_ckpt_reader_step(r), dt_ckpt_reader_world_size(r),
            strat[0] ? " with " : "", strat, dt_ckpt_reader_format_version(r));
    fprintf(out, "model:\n");
    print_json_scalars(out, "  ", dt_ckpt_reader_model(r));
    if (dt_ckpt_has_tensors(r))
        fprintf(out, "  tensors = %zu\n", dt_ckpt_n_tensors(r));
    fprintf(out, "extra:\n");
    print_json_scalars(out, "  ", dt_ckpt_reader_extra(r));
    uint64_t total = 0;
    fprintf(out, "files:\n");
    for (size_t i = 0; i < dt_ckpt_n_files(r); i++) {
        uint64_t b = 0;
        const char *name = dt_ckpt_file_at(r, i, &b);
        fprintf(out, "  %-20s %12" PRIu64 " bytes\n", name, b);
        total += b;
    }
    fprintf(out, "entries (%zu, %.2f MiB):\n", dt_ckpt_n_entries(r),
            (double)total / (1024.0 * 1024.0));
    for (size_t i = 0; i < dt_ckpt_n_entries(r); i++) {
        const dt_ckpt_entry_t *e = dt_ckpt_entry_at(r, i);
        size_t ns = dt_ckpt_entry_n_segments(r, i);
        fprintf(out, "  %-28s %-4s %12" PRIu64 " elements in %zu segment(s):", e->name,
                dt_dtype_name(e->dtype), e->numel, ns);
        for (size_t k = 0; k < ns && k < 4; k++) {
            const dt_ckpt_seg_t *s = dt_ckpt_segment_at(r, i, k);
            if (s->block.ndim > 0) /* numpy-style: [r0:r1, c0:c1] of [R, C] at base */
                print_block(out, &s->block);
            else
                fprintf(out, " [%" PRIu64 ", %" PRIu64 ")", s->offset,
                        s->offset + s->count);
            fprintf(out, " shard %u%s", s->shard, k + 1 < ns ? ";" : "");
        }
        fprintf(out, "%s\n", ns > 4 ? " ..." : "");
    }
    if (verify) {
        rc = dt_ckpt_verify(r);
        if (!rc)
            fprintf(out, "verified: every segment's CRC-32 matches\n");
    }
    dt_ckpt_close(r);
    return rc;
}

int dt_ckpt_consolidate(const char *dir, const char *out_root, uint64_t chunk_elems)
{
    dt_ckpt_reader_t *r = NULL;
    int rc = dt_ckpt_open_flags(dir, DT_CKPT_OPEN_INCOMPLETE, &r);
    if (rc)
        return rc;
    if (!chunk_elems)
        chunk_elems = DEFAULT_CHUNK;
    const uint64_t step = dt_ckpt_reader_step(r);
    const size_t n = dt_ckpt_n_entries(r);
    char tmp[4096];
    dt_ckpt_writer_t *w = NULL;
    dt_ckpt_seg_t *segs = NULL;
    size_t n_segs = 0;
    dt_ckpt_entry_t *entries = calloc(n ? n : 1, sizeof *entries);
    void *buf = malloc(chunk_elems * 8);
    if (!entries || !buf) {
        rc = dt_err_set(DT_ERR_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = dt_ckpt_begin(out_root, step, tmp, sizeof tmp)) ||
        (rc = dt_ckpt_shard_open(tmp, 0, &w)))
        goto fail;
    for (size_t i = 0; i < n && !rc; i++) {
        entries[i] = *dt_ckpt_entry_at(r, i);
        const size_t es = dt_dtype_size(entries[i].dtype);
        if ((rc = dt_ckpt_shard_begin(w, entries[i].name, entries[i].dtype, 0, entries[i].numel)))
            break;
        for (uint64_t off = 0; off < entries[i].numel && !rc; off += chunk_elems) {
            uint64_t c = entries[i].numel - off < chunk_elems ? entries[i].numel - off : chunk_elems;
            if (!(rc = dt_ckpt_read(r, entries[i].name, off, c, buf)))
                rc = dt_ckpt_shard_append(w, buf, (size_t)c * es);
        }
        if (!rc)
            rc = dt_ckpt_shard_end(w);
    }
    if (rc)
        goto fail;
    rc = dt_ckpt_shard_close(w, &segs, &n_segs);
    w = NULL;
    if (rc)
        goto fail;
    dt_ckpt_info_t info = {.step = step, .world_size = 1,
                           .strategy = dt_ckpt_reader_strategy(r),
                           .model = dt_ckpt_reader_model(r), .extra = dt_ckpt_reader_extra(r)};
    if ((rc = dt_ckpt_write_manifest(tmp, &info, entries, n, segs, n_segs)) ||
        (rc = dt_ckpt_commit(out_root, step)))
        goto fail;
    goto out;
fail:
    dt_ckpt_shard_abort(w);
    dt_ckpt_abort(out_root, step);
    dt_err_context(rc, "consolidating '%s' into '%s'", dir, out_root);
out:
    free(segs);
    free(entries);
    free(buf);
    dt_ckpt_close(r);
    return rc;
}

/* ---- export -------------------------------------------------------------- */

/* The manifest's tensor table (checked by the reader: inside the entries,
 * tiling them) as export needs it: f32 entries, at most 4 dimensions. */
static int export_tensors(dt_ckpt_reader_t *r, const char *dir, uint64_t *largest)
{
    if (!dt_ckpt_has_tensors(r))
        return dt_err_set(DT_ERR_DATA,
                          "checkpoint '%s': manifest.json has no \"model\".\"tensors\" table "
                          "(written by an older dtrain); resume it once and save again",
                          dir);
    *largest = 0;
    for (size_t i = 0; i < dt_ckpt_n_tensors(r); i++) {
        const dt_ckpt_tensor_t *t = dt_ckpt_tensor_at(r, i);
        const dt_ckpt_entry_t *e = dt_ckpt_find(r, t->entry);
        if (e->dtype != DT_F32 || t->ndim > 4)
            return dt_err_set(DT_ERR_DATA,
                              "checkpoint '%s': tensor %s: export takes f32 tensors of 1 to 4 "
                              "dimensions, not %s with %d",
                              dir, t->name, dt_dtype_name(e->dtype), (int)t->ndim);
        if (t->numel > *largest)
            *largest = t->numel;
    }
    return DT_OK;
}

void dt_ckpt_hf_config_path(const char *weights, char *buf, size_t cap)
{
    const char *slash = strrchr(weights, '/');
    if (slash)
        snprintf(buf, cap, "%.*s/config.json", (int)(slash - weights), weights);
    else
        snprintf(buf, cap, "config.json");
}

/* Whether the export may write config.json at `path`: nothing there, the
 * very text it would write (the same model exported again), or
 * `overwrite`; anything but a regular file never (dt_fileutil_check_output).
 * Checked before the weights are written, so a refusal leaves both files
 * as they were. */
static int hf_config_may_write(const char *path, const char *text, size_t len, int overwrite)
{
    int exists, rc = dt_fileutil_check_output(path, &exists);
    if (rc || !exists || overwrite)
        return rc;
    char what[4200];
    snprintf(what, sizeof what, "reading '%s'", path);
    int fd;
    uint64_t size;
    if ((rc = dt_fileutil_open_input(path, DT_FILEUTIL_NOFOLLOW, what, &fd, &size)))
        return rc;
    int same = 0;
    char *old = NULL;
    size_t n = 0;
    if (size == len && !(rc = dt_fileutil_read_fd(fd, size, len, what, &old, &n)))
        same = n == len && memcmp(old, text, len) == 0;
    free(old);
    close(fd);
    if (rc || same)
        return rc;
    return dt_err_set(DT_ERR_CONFIG,
                      "'%s' already exists and is not this export's config.json (another "
                      "model's?): give --overwrite to replace it, or export to another folder",
                      path);
}

/* One export: the checkpoint, and in the HF layout the model plugin of its
 * arch when that plugin names Hugging Face's tensors (hf != NULL). */
typedef struct export_job {
    dt_ckpt_reader_t *r;
    const char *dir;
    dt_plugin_t *plugin;
    const dt_model_ops_t *hf;
    float *buf, *tr;
} export_job_t;

/* The HF layout's plugin: the manifest's arch, loaded from `sp`. */
static int export_plugin(export_job_t *x, const dt_search_path_t *sp)
{
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(dt_ckpt_reader_model(x->r), "arch");
    if (!cJSON_IsString(arch))
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': manifest.json has no \"model\".\"arch\"",
                          x->dir);
    if (!sp)
        return dt_err_set(DT_ERR_INVALID, "export: the hf layout needs the plugin search path");
    int rc = dt_plugin_load(sp, DT_KIND_MODEL, arch->valuestring, &x->plugin);
    if (rc)
        return dt_err_context(rc, "checkpoint '%s': its model plugin", x->dir);
    if (dt_hf_model_has(x->plugin->ops))
        x->hf = x->plugin->ops;
    return DT_OK;
}

/* The longest sequence of the checkpoint's model, for config.json when
 * the manifest has no "context" key: the import's record, else the
 * training run's train.seq_len; 0 when unknown. */
static int64_t export_context(const dt_ckpt_reader_t *r)
{
    const cJSON *extra = dt_ckpt_reader_extra(r);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(extra, "context");
    if (!cJSON_IsNumber(c))
        c = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(extra, "data"),
                                             "train.seq_len");
    return cJSON_IsNumber(c) && c->valuedouble >= 1 ? (int64_t)c->valuedouble : 0;
}

/* Tensor t's name and shape in the file, and whether it is transposed. */
static int export_name(const export_job_t *x, const dt_ckpt_tensor_t *t, char *name,
                       size_t cap, int64_t shape[4])
{
    int transpose = 0;
    memcpy(shape, t->shape, 4 * sizeof *shape);
    snprintf(name, cap, "%s", t->name);
    if (x->hf)
        x->hf->hf_export_name(t->name, name, cap, &transpose);
    transpose = transpose && t->ndim == 2;
    if (transpose) {
        shape[0] = t->shape[1];
        shape[1] = t->shape[0];
    }
    return transpose;
}

/* Every tensor declared, then written, read from the checkpoint one by one. */
static int export_weights(export_job_t *x, dt_safetensors_writer_t *w, int layout)
{
    char step[32], name[256];
    int64_t shape[4];
    const size_t n = dt_ckpt_n_tensors(x->r);
    snprintf(step, sizeof step, "%" PRIu64, dt_ckpt_reader_step(x->r));
    int rc = dt_safetensors_set_meta(w, "format", "pt");
    if (!rc)
        rc = dt_safetensors_set_meta(w, "dtrain_step", step);
    if (!rc)
        rc = dt_safetensors_set_meta(w, "dtrain_layout", layout == DT_EXPORT_HF ? "hf" : "dtrain");
    for (size_t i = 0; i < n && !rc; i++) {
        const dt_ckpt_tensor_t *t = dt_ckpt_tensor_at(x->r, i);
        export_name(x, t, name, sizeof name, shape);
        rc = dt_safetensors_declare(w, name, DT_F32, t->ndim, shape);
    }
    for (size_t i = 0; i < n && !rc; i++) {
        const dt_ckpt_tensor_t *t = dt_ckpt_tensor_at(x->r, i);
        if ((rc = dt_ckpt_read(x->r, t->entry, t->offset, t->numel, x->buf)))
            break;
        const float *src = x->buf;
        if (export_name(x, t, name, sizeof name, shape)) {
            const int64_t rows = t->shape[0], cols = t->shape[1];
            for (int64_t a = 0; a < rows; a++)
                for (int64_t b = 0; b < cols; b++)
                    x->tr[b * rows + a] = x->buf[a * cols + b];
            src = x->tr;
        }
        rc = dt_safetensors_write(w, src, (size_t)t->numel * sizeof *src);
    }
    return rc;
}

/* config.json's text and place, checked before a byte is written. */
static int export_config(export_job_t *x, const char *out_path, int overwrite, char *path,
                         size_t cap, char **text, size_t *len)
{
    dt_ckpt_hf_config_path(out_path, path, cap);
    int rc = dt_hf_model_config_text(x->hf, dt_ckpt_reader_model(x->r), export_context(x->r),
                                     x->dir, text, len);
    return rc ? rc : hf_config_may_write(path, *text, *len, overwrite);
}

int dt_ckpt_export(const char *dir, const char *out_path, int layout,
                   const dt_search_path_t *sp, int overwrite, int *wrote_config)
{
    if (wrote_config)
        *wrote_config = 0;
    export_job_t x = {.dir = dir};
    int rc = dt_ckpt_open_flags(dir, DT_CKPT_OPEN_INCOMPLETE, &x.r);
    if (rc)
        return rc;
    uint64_t largest = 0;
    char *cfg_text = NULL, cfg_path[4096];
    size_t cfg_len = 0;
    dt_safetensors_writer_t *w = NULL;
    if ((rc = export_tensors(x.r, dir, &largest)) ||
        (layout == DT_EXPORT_HF && (rc = export_plugin(&x, sp))))
        goto out;
    x.buf = malloc((largest ? largest : 1) * sizeof *x.buf);
    x.tr = malloc((largest ? largest : 1) * sizeof *x.tr);
    if (!x.buf || !x.tr) {
        rc = dt_err_set(DT_ERR_NOMEM, "out of memory (largest tensor %" PRIu64 " elements)",
                        largest);
        goto out;
    }
    /* OUT's folder made as mkdir -p would (the README's own line exports
     * into hf/, which need not exist); then config.json's place checked
     * before a byte of the weights is written */
    if ((rc = dt_fileutil_mkdir_parent(out_path)) ||
        (x.hf && (rc = export_config(&x, out_path, overwrite, cfg_path, sizeof cfg_path,
                                     &cfg_text, &cfg_len))) ||
        (rc = dt_safetensors_writer_open(out_path, &w)))
        goto out;
    if ((rc = export_weights(&x, w, layout))) {
        dt_safetensors_abort(w);
        goto out;
    }
    rc = dt_safetensors_commit(w);
    if (!rc && cfg_text && !(rc = dt_fileutil_write_atomic(cfg_path, cfg_text, cfg_len)) &&
        wrote_config)
        *wrote_config = 1;
out:
    if (rc)
        dt_err_context(rc, "exporting '%s' to '%s'", dir, out_path);
    free(cfg_text);
    free(x.buf);
    free(x.tr);
    if (x.plugin)
        dt_plugin_unload(x.plugin);
    dt_ckpt_close(x.r);
    return rc;
}

/* ---- import -------------------------------------------------------------- */

/* One import: the model's parameters (flat, in unit order) and the file's
 * tensor for each; tied copies to check. */
typedef struct import_job {
    const char *weights;
    dt_safetensors_set_t *st;
    const dt_model_t *m;
    const dt_model_ops_t *hf;
    const dt_param_desc_t **param;
    const dt_safetensors_tensor_t **src;
    const dt_safetensors_tensor_t **tied; /* tied[i]: must equal src[tied_of[i]] */
    size_t *tied_of, n_params, n_tied;
    uint64_t largest; /* elements of raw and buf: a chunk, or a transposed tensor */
    float *raw, *buf;
} import_job_t;

static void shape_text(const int64_t *s, int ndim, char *out, size_t cap)
{
    out[0] = '\0';
    for (int k = 0; k < ndim; k++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%lld", k ? ", " : "",
                 (long long)s[k]);
}

/* The parameter named `name`: its flat index, or n_params. */
static size_t import_find(const import_job_t *x, const char *name)
{
    size_t i = 0;
    while (i < x->n_params && strcmp(x->param[i]->name, name) != 0)
        i++;
    return i;
}

/* File tensor t as parameter i: not given before, HF's shape. */
static int import_param(import_job_t *x, const dt_safetensors_tensor_t *t, size_t i)
{
    const dt_param_desc_t *p = x->param[i];
    if (x->src[i])
        return dt_err_set(DT_ERR_DATA, "'%s': tensor %s is given twice (as %s and %s)",
                          x->weights, p->name, x->src[i]->name, t->name);
    char hf[256];
    int transpose = 0;
    int64_t want[4];
    memcpy(want, p->shape, sizeof want);
    x->hf->hf_export_name(p->name, hf, sizeof hf, &transpose);
    if (transpose && p->ndim == 2) {
        want[0] = p->shape[1];
        want[1] = p->shape[0];
    }
    int same = t->ndim == p->ndim;
    for (int k = 0; same && k < p->ndim; k++)
        same = t->shape[k] == want[k];
    if (!same) {
        char w[96], g[96];
        shape_text(want, p->ndim, w, sizeof w);
        shape_text(t->shape, t->ndim, g, sizeof g);
        return dt_err_set(DT_ERR_DATA,
                          "'%s': tensor %s has shape [%s], but this %s (from its config.json) "
                          "needs [%s]%s",
                          x->weights, t->name, g, dt_model_info(x->m)->arch, w,
                          transpose && p->ndim == 2 ? " (stored transposed, (in, out))" : "");
    }
    x->src[i] = t;
    return DT_OK;
}

/* Every tensor of the file accounted for (a parameter, a tied copy, a
 * buffer) and every parameter found. */
static int import_map(import_job_t *x)
{
    const dt_model_info_t *mi = dt_model_info(x->m);
    for (size_t k = 0; k < dt_safetensors_set_count(x->st); k++) {
        const dt_safetensors_tensor_t *t = dt_safetensors_set_at(x->st, k);
        char name[256] = "";
        const int role = x->hf->hf_import_name(mi->keys, mi->n_keys, t->name, name, sizeof name);
        if (role == DT_HF_BUFFER)
            continue;
        const size_t i = import_find(x, name);
        if (role == DT_HF_UNKNOWN || i == x->n_params)
            return dt_err_set(DT_ERR_DATA,
                              "'%s': tensor %s is not a parameter of this %s (from its "
                              "config.json: is it the one of these weights?)",
                              dt_safetensors_set_file(x->st, t), t->name, mi->arch);
        if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
            return dt_err_set(DT_ERR_DATA, "'%s': tensor %s is %s; import takes F32, BF16 or F16",
                              dt_safetensors_set_file(x->st, t), t->name, t->dtype_name);
        int rc = DT_OK;
        if (role == DT_HF_TIED) {
            x->tied[x->n_tied] = t;
            x->tied_of[x->n_tied++] = i;
        } else if ((rc = import_param(x, t, i))) {
            return rc;
        }
    }
    for (size_t i = 0; i < x->n_params; i++)
        if (!x->src[i])
            return dt_err_set(DT_ERR_DATA, "'%s' has no tensor %s", x->weights,
                              x->param[i]->name);
    return DT_OK;
}

/* A tied copy must be its parameter's tensor: the same dtype, shape and
 * bytes (compared chunk by chunk in raw and buf). */
static int import_check_tied(import_job_t *x)
{
    const uint64_t chunk = x->largest * sizeof *x->raw;
    for (size_t i = 0; i < x->n_tied; i++) {
        const dt_safetensors_tensor_t *a = x->tied[i], *b = x->src[x->tied_of[i]];
        int same = a->dtype == b->dtype && a->ndim == b->ndim;
        for (int k = 0; same && k < a->ndim; k++)
            same = a->shape[k] == b->shape[k];
        for (uint64_t off = 0; same && off < b->nbytes; off += chunk) {
            const uint64_t c = b->nbytes - off < chunk ? b->nbytes - off : chunk;
            int rc;
            if ((rc = dt_safetensors_set_read(x->st, a, off, c, x->raw)) ||
                (rc = dt_safetensors_set_read(x->st, b, off, c, x->buf)))
                return rc;
            same = memcmp(x->raw, x->buf, c) == 0;
        }
        if (!same)
            return dt_err_set(DT_ERR_DATA,
                              "'%s': tensor %s differs from %s: this %s ties the two (its "
                              "config.json), so different ones cannot be imported",
                              x->weights, a->name, b->name, dt_model_info(x->m)->arch);
    }
    return DT_OK;
}

/* Whether Hugging Face stores parameter i transposed. */
static int import_transposed(const import_job_t *x, size_t i)
{
    char hf[256];
    int transpose = 0;
    x->hf->hf_export_name(x->param[i]->name, hf, sizeof hf, &transpose);
    return transpose && x->param[i]->ndim == 2;
}

/* Elements [first, first + n) of tensor t as f32 into out: widened
 * exactly from bf16 / f16 (read through raw). */
static int import_chunk(import_job_t *x, const dt_safetensors_tensor_t *t, uint64_t first,
                        uint64_t n, float *out)
{
    const uint64_t es = t->dtype == DT_F32 ? 4 : 2;
    void *dst = t->dtype == DT_F32 ? (void *)out : (void *)x->raw;
    int rc = dt_safetensors_set_read(x->st, t, first * es, n * es, dst);
    for (uint64_t k = 0; !rc && t->dtype != DT_F32 && k < n; k++) {
        const uint16_t h = ((const uint16_t *)x->raw)[k];
        out[k] = t->dtype == DT_BF16 ? dt_bf16_to_f32(h) : dt_f16_to_f32(h);
    }
    return rc;
}

/* Parameter i in dtrain's layout appended to shard w: chunk by chunk, or
 * whole when Hugging Face stores it transposed ((in, out) -> (out, in)). */
static int import_param_data(import_job_t *x, dt_ckpt_writer_t *w, size_t i)
{
    const dt_safetensors_tensor_t *t = x->src[i];
    int rc = DT_OK;
    if (import_transposed(x, i)) {
        if ((rc = import_chunk(x, t, 0, t->numel, x->buf)))
            return rc;
        const int64_t rows = t->shape[0], cols = t->shape[1];
        for (int64_t a = 0; a < rows; a++)
            for (int64_t b = 0; b < cols; b++)
                x->raw[b * rows + a] = x->buf[a * cols + b];
        return dt_ckpt_shard_append(w, x->raw, t->numel * sizeof *x->raw);
    }
    for (uint64_t off = 0; off < t->numel && !rc; off += x->largest) {
        const uint64_t c = t->numel - off < x->largest ? t->numel - off : x->largest;
        if (!(rc = import_chunk(x, t, off, c, x->buf)))
            rc = dt_ckpt_shard_append(w, x->buf, c * sizeof *x->buf);
    }
    return rc;
}

/* An import may write into out_root when it holds no complete checkpoint,
 * or with `overwrite` (they go once the import is in place). */
static int import_may_write(const char *out_root, int overwrite)
{
    char dir[4096];
    uint64_t step;
    int rc = dt_ckpt_latest(out_root, dir, sizeof dir, &step);
    if (rc == DT_ERR_NOT_FOUND) {
        dt_err_clear();
        return DT_OK;
    }
    if (rc || overwrite)
        return rc;
    return dt_err_set(DT_ERR_CONFIG,
                      "the folder '%s' already holds checkpoints (the newest: step %" PRIu64
                      "): give --overwrite to replace them with the import, or import into "
                      "another folder",
                      out_root, step);
}

/* What AdamW resumes: params from the file, the two moments zero. */
enum { N_STATES = 3 };
static const char *const import_states[N_STATES] = {"params", "exp_avg", "exp_avg_sq"};

/* Unit u's three entries into shard w, tensor by tensor (flat: the index
 * of its first parameter). */
static int import_unit(import_job_t *x, dt_ckpt_writer_t *w, uint32_t u, size_t flat,
                       dt_ckpt_entry_t *entries, const float *zeros)
{
    const dt_unit_desc_t *ud = &dt_model_desc((dt_model_t *)x->m)->units[u];
    int rc = DT_OK;
    for (int s = 0; s < N_STATES && !rc; s++) {
        dt_ckpt_entry_t *e = &entries[u * (uint32_t)N_STATES + (uint32_t)s];
        snprintf(e->name, sizeof e->name, "%s/%s", ud->name, import_states[s]);
        e->dtype = DT_F32;
        e->numel = ud->numel;
        if ((rc = dt_ckpt_shard_begin(w, e->name, DT_F32, 0, ud->numel)))
            break;
        for (uint32_t k = 0; s == 0 && k < ud->n_params && !rc; k++)
            rc = import_param_data(x, w, flat + k);
        for (uint64_t off = 0; s > 0 && off < ud->numel && !rc; off += DEFAULT_CHUNK) {
            uint64_t c = ud->numel - off < DEFAULT_CHUNK ? ud->numel - off : DEFAULT_CHUNK;
            rc = dt_ckpt_shard_append(w, zeros, c * sizeof *zeros);
        }
        if (!rc)
            rc = dt_ckpt_shard_end(w);
    }
    return rc;
}

/* The checkpoint's one shard and manifest in tmp (step 0, world 1):
 * layout-free, any layout resumes it. */
static int import_write(import_job_t *x, const char *tmp)
{
    const dt_model_desc_t *d = dt_model_desc((dt_model_t *)x->m);
    dt_ckpt_entry_t *entries = calloc((size_t)d->n_units * N_STATES, sizeof *entries);
    float *zeros = calloc(DEFAULT_CHUNK, sizeof *zeros);
    dt_ckpt_writer_t *w = NULL;
    dt_ckpt_seg_t *segs = NULL;
    size_t n_segs = 0, flat = 0;
    cJSON *model = NULL, *extra = NULL;
    int rc = entries && zeros ? dt_ckpt_shard_open(tmp, 0, &w)
                              : dt_err_set(DT_ERR_NOMEM, "out of memory");
    for (uint32_t u = 0; u < d->n_units && !rc; flat += d->units[u++].n_params)
        rc = import_unit(x, w, u, flat, entries, zeros);
    if (!rc) {
        rc = dt_ckpt_shard_close(w, &segs, &n_segs);
        w = NULL;
    }
    if (!rc && (!(model = dt_ckpt_model_json((dt_model_t *)x->m)) ||
                !(extra = cJSON_CreateObject()) ||
                !cJSON_AddStringToObject(extra, "imported_from", x->weights) ||
                !cJSON_AddNumberToObject(extra, "context",
                                         (double)dt_model_info(x->m)->context)))
        rc = dt_err_set(DT_ERR_NOMEM, "out of memory");
    const dt_ckpt_info_t info = {.step = 0, .world_size = 1, .strategy = "import",
                                 .model = model, .extra = extra};
    if (!rc)
        rc = dt_ckpt_write_manifest(tmp, &info, entries, (size_t)d->n_units * N_STATES, segs,
                                    n_segs);
    dt_ckpt_shard_abort(w);
    cJSON_Delete(model);
    cJSON_Delete(extra);
    free(segs);
    free(entries);
    free(zeros);
    return rc;
}

/* The model's parameters listed flat, the file opened and mapped onto
 * them, the buffers sized: a chunk of DEFAULT_CHUNK elements, or the
 * largest tensor Hugging Face stores transposed (GPT-2's Conv1D). */
static int import_prepare(import_job_t *x)
{
    const dt_model_desc_t *d = dt_model_desc((dt_model_t *)x->m);
    for (uint32_t u = 0; u < d->n_units; u++)
        x->n_params += d->units[u].n_params;
    int rc = dt_safetensors_set_open(x->weights, &x->st);
    if (rc)
        return rc;
    const size_t n_file = dt_safetensors_set_count(x->st);
    x->param = calloc(x->n_params + 1, sizeof *x->param);
    x->src = calloc(x->n_params + 1, sizeof *x->src);
    x->tied = calloc(n_file + 1, sizeof *x->tied);
    x->tied_of = calloc(n_file + 1, sizeof *x->tied_of);
    if (!x->param || !x->src || !x->tied || !x->tied_of)
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    size_t flat = 0;
    for (uint32_t u = 0; u < d->n_units; u++)
        for (uint32_t k = 0; k < d->units[u].n_params; k++)
            x->param[flat++] = &d->units[u].params[k];
    if ((rc = import_map(x)))
        return rc;
    x->largest = DEFAULT_CHUNK; /* a chunk, or the largest tensor stored transposed */
    for (size_t i = 0; i < x->n_params; i++)
        if (import_transposed(x, i) && x->param[i]->numel > x->largest)
            x->largest = x->param[i]->numel;
    x->raw = malloc(x->largest * sizeof *x->raw);
    x->buf = malloc(x->largest * sizeof *x->buf);
    if (!x->raw || !x->buf)
        return dt_err_set(DT_ERR_NOMEM, "out of memory (buffers of %" PRIu64 " elements)",
                          x->largest);
    return DT_OK;
}

int dt_ckpt_import(const char *weights, dt_model_t *m, const char *out_root, int overwrite)
{
    import_job_t x = {.weights = weights, .m = m, .hf = dt_model_ops(m)};
    char tmp[4096];
    int begun = 0, lock_fd = -1, rc = DT_OK;
    if (!dt_hf_model_has(x.hf))
        rc = dt_err_set(DT_ERR_UNSUPPORTED, "model/%s reads no Hugging Face weights",
                        dt_model_info(m)->arch);
    if (rc || (rc = import_prepare(&x)) || (rc = import_check_tied(&x)))
        goto out;
    /* an import writes the folder as a run does: one writer at a time */
    if ((rc = dt_ckpt_lock(out_root, &lock_fd)) ||
        (rc = import_may_write(out_root, overwrite)) ||
        (rc = dt_ckpt_begin(out_root, 0, tmp, sizeof tmp)))
        goto out;
    begun = 1;
    if ((rc = import_write(&x, tmp)) || (rc = dt_ckpt_commit(out_root, 0)))
        goto out;
    begun = 0;
    size_t removed = 0;
    if (overwrite && !(rc = dt_ckpt_remove_others(out_root, 0, &removed)) && removed)
        dt_log(DT_LOG_WARN, "ckpt", "warning: --overwrite: removed the %zu other "
               "checkpoint(s) of '%s'; it now holds the import, step 0", removed, out_root);
out:
    if (lock_fd >= 0)
        close(lock_fd);
    if (begun)
        dt_ckpt_abort(out_root, 0);
    if (rc)
        dt_err_context(rc, "importing '%s' into '%s'", weights, out_root);
    dt_safetensors_set_close(x.st);
    free(x.param);
    free(x.src);
    free(x.tied);
    free(x.tied_of);
    free(x.raw);
    free(x.buf);
    return rc;
}
