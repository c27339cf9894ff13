/*
 * core/ckpt/ckpt_tools.c - inspect, consolidate and export a checkpoint
 * from its manifest and shards alone.
 */
#include "ckpt/ckpt_tools.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/tensor.h"
#include "ckpt/ckpt_io.h"
#include "ckpt/hf_gpt2.h"
#include "ckpt/safetensors.h"
#include "util/error.h"

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

int dt_ckpt_inspect(const char *dir, int verify, FILE *out)
{
    dt_ckpt_reader_t *r = NULL;
    int rc = dt_ckpt_open_flags(dir, DT_CKPT_OPEN_INCOMPLETE, &r);
    if (rc)
        return rc;
    const char *strat = dt_ckpt_reader_strategy(r);
    fprintf(out, "checkpoint %s\n  step %" PRIu64 ", written by %u rank(s)%s%s\n", dir,
            dt_ckpt_reader_step(r), dt_ckpt_reader_world_size(r), strat[0] ? " with " : "",
            strat);
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
            fprintf(out, " [%" PRIu64 ", %" PRIu64 ") shard %u%s", s->offset,
                    s->offset + s->count, s->shard, k + 1 < ns ? ";" : "");
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

/* config.json beside the exported weights, from the manifest's shape keys. */
static int write_hf_config(const dt_ckpt_reader_t *r, const char *dir, const char *out_path)
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
    char path[4096];
    dt_ckpt_hf_config_path(out_path, path, sizeof path);
    return dt_hf_gpt2_config_write(path, &s);
}

int dt_ckpt_export(const char *dir, const char *out_path, int layout, int *wrote_config)
{
    if (wrote_config)
        *wrote_config = 0;
    dt_ckpt_reader_t *r = NULL;
    int rc = dt_ckpt_open_flags(dir, DT_CKPT_OPEN_INCOMPLETE, &r);
    if (rc)
        return rc;
    uint64_t largest = 0;
    float *buf = NULL, *tr = NULL;
    dt_safetensors_writer_t *w = NULL;
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(dt_ckpt_reader_model(r), "arch");
    const int gpt2 = cJSON_IsString(arch) && strcmp(arch->valuestring, "gpt2") == 0;
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
    if (!rc && gpt2 && layout == DT_EXPORT_HF && !(rc = write_hf_config(r, dir, out_path)) &&
        wrote_config)
        *wrote_config = 1;
    goto out;
fail:
    dt_safetensors_abort(w);
out:
    if (rc)
        dt_err_context(rc, "exporting '%s' to '%s'", dir, out_path);
    free(buf);
    free(tr);
    dt_ckpt_close(r);
    return rc;
}

