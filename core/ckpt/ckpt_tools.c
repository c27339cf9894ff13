/*
 * core/ckpt/ckpt_tools.c - inspect, consolidate and export a checkpoint
 * from its manifest and shards alone; import Hugging Face GPT-2 weights
 * as a checkpoint.
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
#include "ckpt/hf_gpt2.h"
#include "ckpt/safetensors.h"
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

/* Stored transposed in the export: HF layout, a GPT-2 Conv1D weight. */
static int transposed(const dt_ckpt_tensor_t *t, int layout, int gpt2)
{
    return layout == DT_EXPORT_HF && gpt2 && t->ndim == 2 && dt_hf_gpt2_conv1d(t->name);
}

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

/* config.json's text for the exported weights (*text, malloc'd), from the
 * manifest's shape keys. */
static int hf_config_text(const dt_ckpt_reader_t *r, const char *dir, char **text, size_t *len)
{
    const cJSON *model = dt_ckpt_reader_model(r);
    dt_gpt2_shape_t s;
    static const char *const keys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "context"};
    int64_t *dst[] = {&s.n_layer, &s.n_head, &s.n_embd, &s.vocab_size, &s.context};
    for (int i = 0; i < 5; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, keys[i]);
        if (!cJSON_IsNumber(v) || v->valuedouble < 1)
            return dt_err_set(DT_ERR_DATA,
                              "checkpoint '%s': manifest.json: \"model\" has no positive "
                              "\"%s\" for config.json",
                              dir, keys[i]);
        *dst[i] = (int64_t)v->valuedouble;
    }
    if (!(*text = dt_hf_gpt2_config_text(&s, len)))
        return dt_err_set(DT_ERR_NOMEM, "config.json: out of memory");
    return DT_OK;
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

int dt_ckpt_export(const char *dir, const char *out_path, int layout, int overwrite,
                   int *wrote_config)
{
    if (wrote_config)
        *wrote_config = 0;
    dt_ckpt_reader_t *r = NULL;
    int rc = dt_ckpt_open_flags(dir, DT_CKPT_OPEN_INCOMPLETE, &r);
    if (rc)
        return rc;
    uint64_t largest = 0;
    float *buf = NULL, *tr = NULL;
    char *cfg_text = NULL, cfg_path[4096];
    size_t cfg_len = 0;
    dt_safetensors_writer_t *w = NULL;
    /* a GPT-2 by its shape keys: Hugging Face's GPT-2 layout applies */
    const int gpt2 = dt_hf_gpt2_manifest(dt_ckpt_reader_model(r));
    const size_t n = dt_ckpt_n_tensors(r);
    if ((rc = export_tensors(r, dir, &largest)))
        goto out;
    buf = malloc((largest ? largest : 1) * sizeof *buf);
    tr = malloc((largest ? largest : 1) * sizeof *tr);
    if (!buf || !tr) {
        rc = dt_err_set(DT_ERR_NOMEM, "out of memory (largest tensor %" PRIu64 " elements)",
                        largest);
        goto out;
    }
    /* OUT's folder made as mkdir -p would (the README's own line exports
     * into hf/, which need not exist); then config.json's place checked
     * before a byte of the weights is written */
    if ((rc = dt_fileutil_mkdir_parent(out_path)))
        goto out;
    if (gpt2 && layout == DT_EXPORT_HF) {
        dt_ckpt_hf_config_path(out_path, cfg_path, sizeof cfg_path);
        if ((rc = hf_config_text(r, dir, &cfg_text, &cfg_len)) ||
            (rc = hf_config_may_write(cfg_path, cfg_text, cfg_len, overwrite)))
            goto out;
    }
    if ((rc = dt_safetensors_writer_open(out_path, &w)))
        goto out;
    char step[32];
    snprintf(step, sizeof step, "%" PRIu64, dt_ckpt_reader_step(r));
    if ((rc = dt_safetensors_set_meta(w, "format", "pt")) ||
        (rc = dt_safetensors_set_meta(w, "dtrain_step", step)) ||
        (rc = dt_safetensors_set_meta(w, "dtrain_layout", layout == DT_EXPORT_HF ? "hf" : "dtrain")))
        goto fail;
    for (size_t i = 0; i < n && !rc; i++) {
        const dt_ckpt_tensor_t *t = dt_ckpt_tensor_at(r, i);
        int64_t shape[4];
        memcpy(shape, t->shape, sizeof shape);
        if (transposed(t, layout, gpt2)) {
            shape[0] = t->shape[1];
            shape[1] = t->shape[0];
        }
        rc = dt_safetensors_declare(w, t->name, DT_F32, t->ndim, shape);
    }
    for (size_t i = 0; i < n && !rc; i++) {
        const dt_ckpt_tensor_t *t = dt_ckpt_tensor_at(r, i);
        if ((rc = dt_ckpt_read(r, t->entry, t->offset, t->numel, buf)))
            break;
        const float *src = buf;
        if (transposed(t, layout, gpt2)) {
            const int64_t rows = t->shape[0], cols = t->shape[1];
            for (int64_t a = 0; a < rows; a++)
                for (int64_t b = 0; b < cols; b++)
                    tr[b * rows + a] = buf[a * cols + b];
            src = tr;
        }
        rc = dt_safetensors_write(w, src, (size_t)t->numel * sizeof *src);
    }
    if (rc)
        goto fail;
    rc = dt_safetensors_commit(w);
    w = NULL;
    if (!rc && cfg_text && !(rc = dt_fileutil_write_atomic(cfg_path, cfg_text, cfg_len)) &&
        wrote_config)
        *wrote_config = 1;
    goto out;
fail:
    dt_safetensors_abort(w);
out:
    if (rc)
        dt_err_context(rc, "exporting '%s' to '%s'", dir, out_path);
    free(cfg_text);
    free(buf);
    free(tr);
    dt_ckpt_close(r);
    return rc;
}

/* ---- import ------------------------------------------------------------ */

/* The file's tensor for each model parameter (src[u][k], flat in unit
 * order), every tensor of the file accounted for: a parameter of this
 * model in HF's shape and a float dtype, a tied lm_head, or a buffer. */
static int import_map(const dt_safetensors_reader_t *st, const char *weights,
                      const dt_model_desc_t *d, const dt_safetensors_tensor_t **src,
                      const dt_safetensors_tensor_t **lm_head)
{
    *lm_head = NULL;
    for (size_t i = 0; i < dt_safetensors_count(st); i++) {
        const dt_safetensors_tensor_t *t = dt_safetensors_at(st, i);
        const char *base;
        int role = dt_hf_gpt2_role(t->name, &base);
        if (role == DT_HF_BUFFER)
            continue;
        if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
            return dt_err_set(DT_ERR_DATA,
                              "'%s': tensor %s is %s; import takes F32, BF16 or F16", weights,
                              t->name, t->dtype_name);
        if (role == DT_HF_LM_HEAD) {
            *lm_head = t;
            continue;
        }
        size_t flat = 0;
        const dt_param_desc_t *p = NULL;
        for (uint32_t u = 0; u < d->n_units && !p; u++)
            for (uint32_t k = 0; k < d->units[u].n_params && !p; k++, flat++)
                if (strcmp(d->units[u].params[k].name, base) == 0)
                    p = &d->units[u].params[k];
        if (!p)
            return dt_err_set(DT_ERR_DATA,
                              "'%s': tensor %s is not a parameter of a GPT-2 with n_layer = "
                              "%u (is config.json the one of these weights?)",
                              weights, t->name, d->n_units - 2);
        flat--;
        if (src[flat])
            return dt_err_set(DT_ERR_DATA, "'%s': tensor %s is given twice (as %s and %s)",
                              weights, base, src[flat]->name, t->name);
        int64_t want[4];
        memcpy(want, p->shape, sizeof want);
        if (p->ndim == 2 && dt_hf_gpt2_conv1d(base)) {
            want[0] = p->shape[1];
            want[1] = p->shape[0];
        }
        int same = t->ndim == p->ndim;
        for (int k = 0; same && k < p->ndim; k++)
            same = t->shape[k] == want[k];
        if (!same) {
            char w[96] = "", g[96] = "";
            for (int k = 0; k < p->ndim; k++)
                snprintf(w + strlen(w), sizeof w - strlen(w), "%s%lld", k ? ", " : "",
                         (long long)want[k]);
            for (int k = 0; k < t->ndim; k++)
                snprintf(g + strlen(g), sizeof g - strlen(g), "%s%lld", k ? ", " : "",
                         (long long)t->shape[k]);
            return dt_err_set(DT_ERR_DATA,
                              "'%s': tensor %s has shape [%s], but this GPT-2 (from its "
                              "config.json) needs [%s]%s",
                              weights, t->name, g, w,
                              dt_hf_gpt2_conv1d(base) ? " (Hugging Face's Conv1D layout, (in, out))"
                                                      : "");
        }
        src[flat] = t;
    }
    size_t flat = 0;
    for (uint32_t u = 0; u < d->n_units; u++)
        for (uint32_t k = 0; k < d->units[u].n_params; k++, flat++)
            if (!src[flat])
                return dt_err_set(DT_ERR_DATA, "'%s' has no tensor %s", weights,
                                  d->units[u].params[k].name);
    return DT_OK;
}

/* Tensor t of the file as f32 in dtrain's layout into out (its numel):
 * widened exactly from bf16 / f16, a Conv1D weight transposed. */
static int import_read(dt_safetensors_reader_t *st, const dt_safetensors_tensor_t *t,
                       const dt_param_desc_t *p, void *raw, float *out)
{
    int rc = dt_safetensors_read(st, t, 0, t->nbytes, raw);
    if (rc)
        return rc;
    float *f = raw; /* widened in place, from the end: 2-byte elements */
    if (t->dtype != DT_F32)
        for (uint64_t i = t->numel; i-- > 0;) {
            const uint16_t h = ((const uint16_t *)raw)[i];
            f[i] = t->dtype == DT_BF16 ? dt_bf16_to_f32(h) : dt_f16_to_f32(h);
        }
    if (p->ndim == 2 && dt_hf_gpt2_conv1d(p->name)) { /* (in, out) -> (out, in) */
        const int64_t rows = t->shape[0], cols = t->shape[1];
        for (int64_t a = 0; a < rows; a++)
            for (int64_t b = 0; b < cols; b++)
                out[b * rows + a] = f[a * cols + b];
    } else {
        memcpy(out, f, t->numel * sizeof *out);
    }
    return DT_OK;
}

/* A present lm_head.weight must be wte itself (dtrain's head is tied):
 * the same dtype, shape and bytes, compared in raw and buf (each holds the
 * largest parameter tensor, wte's bytes included). */
static int import_check_head(dt_safetensors_reader_t *st, const char *weights,
                             const dt_safetensors_tensor_t *head,
                             const dt_safetensors_tensor_t *wte, void *raw, void *buf)
{
    int same = head->dtype == wte->dtype && head->ndim == wte->ndim;
    for (int k = 0; same && k < head->ndim; k++)
        same = head->shape[k] == wte->shape[k];
    int rc;
    if (same) {
        if ((rc = dt_safetensors_read(st, head, 0, head->nbytes, raw)) ||
            (rc = dt_safetensors_read(st, wte, 0, wte->nbytes, buf)))
            return rc;
        same = memcmp(raw, buf, wte->nbytes) == 0;
    }
    if (!same)
        return dt_err_set(DT_ERR_DATA,
                          "'%s': tensor %s differs from %s: dtrain's GPT-2 ties the LM head to "
                          "the token embedding, so an untied head cannot be imported",
                          weights, head->name, wte->name);
    return DT_OK;
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

int dt_ckpt_import(const char *weights, dt_model_t *m, const char *out_root, int overwrite)
{
    dt_gpt2_shape_t shape;
    if (dt_hf_gpt2_shape(dt_model_info(m), &shape) != DT_OK)
        return dt_err_set(DT_ERR_INVALID, "importing '%s': the model is not a gpt2", weights);
    const dt_model_desc_t *d = dt_model_desc(m);
    const int n_states = 3; /* params, exp_avg, exp_avg_sq: what AdamW resumes */
    static const char *const states[] = {"params", "exp_avg", "exp_avg_sq"};
    size_t n_params = 0;
    uint64_t largest = 0;
    for (uint32_t u = 0; u < d->n_units; u++) {
        n_params += d->units[u].n_params;
        for (uint32_t k = 0; k < d->units[u].n_params; k++)
            if (d->units[u].params[k].numel > largest)
                largest = d->units[u].params[k].numel;
    }
    dt_safetensors_reader_t *st = NULL;
    const dt_safetensors_tensor_t **src = calloc(n_params ? n_params : 1, sizeof *src);
    const dt_safetensors_tensor_t *head = NULL;
    dt_ckpt_entry_t *entries = calloc((size_t)d->n_units * n_states, sizeof *entries);
    float *raw = malloc((largest ? largest : 1) * sizeof *raw);
    float *buf = malloc((largest ? largest : 1) * sizeof *buf);
    float *zeros = calloc(DEFAULT_CHUNK, sizeof *zeros);
    dt_ckpt_writer_t *w = NULL;
    dt_ckpt_seg_t *segs = NULL;
    size_t n_segs = 0;
    cJSON *model = NULL, *extra = NULL;
    char tmp[4096];
    int begun = 0, lock_fd = -1, rc;
    if (!src || !entries || !raw || !buf || !zeros) {
        rc = dt_err_set(DT_ERR_NOMEM, "out of memory (largest tensor %" PRIu64 " elements)",
                        largest);
        goto out;
    }
    if ((rc = dt_safetensors_open(weights, &st)) || (rc = import_map(st, weights, d, src, &head)))
        goto out;
    if (head) { /* wte is the embedding unit's first tensor (plugins/gpt2/gpt2.c) */
        if (strcmp(d->units[0].params[0].name, "wte.weight") != 0)
            rc = dt_err_set(DT_ERR_INVALID, "import: the model's first tensor is %s, not "
                            "wte.weight", d->units[0].params[0].name);
        else
            rc = import_check_head(st, weights, head, src[0], raw, buf);
        if (rc)
            goto out;
    }
    /* an import writes the folder as a run does: one writer at a time */
    if ((rc = dt_ckpt_lock(out_root, &lock_fd)) ||
        (rc = import_may_write(out_root, overwrite)) ||
        (rc = dt_ckpt_begin(out_root, 0, tmp, sizeof tmp)))
        goto out;
    begun = 1;
    if ((rc = dt_ckpt_shard_open(tmp, 0, &w)))
        goto out;
    size_t flat = 0;
    for (uint32_t u = 0; u < d->n_units && !rc; u++) {
        const dt_unit_desc_t *ud = &d->units[u];
        for (int s = 0; s < n_states && !rc; s++) {
            dt_ckpt_entry_t *e = &entries[u * (uint32_t)n_states + (uint32_t)s];
            snprintf(e->name, sizeof e->name, "%s/%s", ud->name, states[s]);
            e->dtype = DT_F32;
            e->numel = ud->numel;
            if ((rc = dt_ckpt_shard_begin(w, e->name, DT_F32, 0, ud->numel)))
                break;
            if (s == 0) {
                for (uint32_t k = 0; k < ud->n_params && !rc; k++, flat++)
                    if (!(rc = import_read(st, src[flat], &ud->params[k], raw, buf)))
                        rc = dt_ckpt_shard_append(w, buf, ud->params[k].numel * sizeof *buf);
            } else {
                for (uint64_t off = 0; off < ud->numel && !rc; off += DEFAULT_CHUNK) {
                    uint64_t c = ud->numel - off < DEFAULT_CHUNK ? ud->numel - off : DEFAULT_CHUNK;
                    rc = dt_ckpt_shard_append(w, zeros, c * sizeof *zeros);
                }
            }
            if (!rc)
                rc = dt_ckpt_shard_end(w);
        }
    }
    if (rc)
        goto out;
    rc = dt_ckpt_shard_close(w, &segs, &n_segs);
    w = NULL;
    if (rc)
        goto out;
    if (!(model = dt_ckpt_model_json(m)) || !(extra = cJSON_CreateObject()) ||
        !cJSON_AddStringToObject(extra, "imported_from", weights)) {
        rc = dt_err_set(DT_ERR_NOMEM, "out of memory");
        goto out;
    }
    const dt_ckpt_info_t info = {.step = 0, .world_size = 1, .strategy = "import",
                                 .model = model, .extra = extra};
    if ((rc = dt_ckpt_write_manifest(tmp, &info, entries, (size_t)d->n_units * n_states, segs,
                                     n_segs)) ||
        (rc = dt_ckpt_commit(out_root, 0)))
        goto out;
    begun = 0;
    size_t removed = 0;
    if (overwrite && !(rc = dt_ckpt_remove_others(out_root, 0, &removed)) && removed)
        dt_log(DT_LOG_WARN, "ckpt", "warning: --overwrite: removed the %zu other "
               "checkpoint(s) of '%s'; it now holds the import, step 0", removed, out_root);
out:
    if (lock_fd >= 0)
        close(lock_fd);
    dt_ckpt_shard_abort(w);
    if (begun)
        dt_ckpt_abort(out_root, 0);
    if (rc)
        dt_err_context(rc, "importing '%s' into '%s'", weights, out_root);
    dt_safetensors_close(st);
    cJSON_Delete(model);
    cJSON_Delete(extra);
    free(segs);
    free(src);
    free(entries);
    free(raw);
    free(buf);
    free(zeros);
    return rc;
}
