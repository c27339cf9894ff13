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
    int rc = dt_ckpt_open(dir, &r);
    if (rc)
        return rc;
    const char *strat = dt_ckpt_reader_strategy(r);
    fprintf(out, "checkpoint %s\n  step %" PRIu64 ", written by %u rank(s)%s%s\n", dir,
            dt_ckpt_reader_step(r), dt_ckpt_reader_world_size(r), strat[0] ? " with " : "",
            strat);
    fprintf(out, "model:\n");
    print_json_scalars(out, "  ", dt_ckpt_reader_model(r));
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(dt_ckpt_reader_model(r), "tensors");
    if (cJSON_IsArray(ts))
        fprintf(out, "  tensors = %d\n", cJSON_GetArraySize(ts));
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
    int rc = dt_ckpt_open(dir, &r);
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

/* HF's GPT-2 keeps these four projections as Conv1D, weight (in, out). */
static int hf_conv1d(const char *name)
{
    static const char *const sfx[] = {".attn.c_attn.weight", ".attn.c_proj.weight",
                                      ".mlp.c_fc.weight", ".mlp.c_proj.weight"};
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
        size_t m = strlen(sfx[i]);
        if (n > m && strcmp(name + n - m, sfx[i]) == 0)
            return 1;
    }
    return 0;
}

typedef struct xtensor {
    const char *name, *unit;
    uint64_t offset, numel;
    int ndim;
    int64_t shape[4];
    int transpose;
} xtensor_t;

/* The manifest's tensor table, checked against the entries it points into. */
static int read_tensors(dt_ckpt_reader_t *r, const char *dir, int layout, xtensor_t **out,
                        size_t *n, uint64_t *largest)
{
    const cJSON *model = dt_ckpt_reader_model(r);
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(model, "tensors");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(model, "arch");
    if (!cJSON_IsArray(ts))
        return dt_err_set(DT_ERR_DATA,
                          "checkpoint '%s': manifest.json has no \"model\".\"tensors\" table "
                          "(written by an older dtrain); resume it once and save again",
                          dir);
    const int gpt2 = cJSON_IsString(arch) && strcmp(arch->valuestring, "gpt2") == 0;
    *n = (size_t)cJSON_GetArraySize(ts);
    *out = calloc(*n ? *n : 1, sizeof **out);
    if (!*out)
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    *largest = 0;
    size_t i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, ts)
    {
        xtensor_t *x = &(*out)[i++];
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(t, "name");
        const cJSON *un = cJSON_GetObjectItemCaseSensitive(t, "unit");
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(t, "offset");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
        if (!cJSON_IsString(nm) || !cJSON_IsString(un) || !cJSON_IsNumber(of) ||
            !cJSON_IsArray(sh) || cJSON_GetArraySize(sh) < 1 || cJSON_GetArraySize(sh) > 4)
            return dt_err_set(DT_ERR_DATA,
                              "checkpoint '%s': manifest.json: tensor %zu of \"model\"."
                              "\"tensors\" lacks name, unit, offset or a 1-4 dim shape",
                              dir, i - 1);
        x->name = nm->valuestring;
        x->unit = un->valuestring;
        x->offset = (uint64_t)of->valuedouble;
        x->ndim = cJSON_GetArraySize(sh);
        x->numel = 1;
        for (int d = 0; d < x->ndim; d++) {
            x->shape[d] = (int64_t)cJSON_GetArrayItem(sh, d)->valuedouble;
            x->numel *= (uint64_t)x->shape[d];
        }
        x->transpose = layout == DT_EXPORT_HF && gpt2 && x->ndim == 2 && hf_conv1d(x->name);
        char entry[DT_CKPT_NAME_MAX];
        snprintf(entry, sizeof entry, "%s/params", x->unit);
        const dt_ckpt_entry_t *e = dt_ckpt_find(r, entry);
        if (!e || e->dtype != DT_F32 || x->offset + x->numel > e->numel)
            return dt_err_set(DT_ERR_DATA,
                              "checkpoint '%s': tensor %s lies outside entry %s (%s)", dir,
                              x->name, entry, e ? "out of range or not f32" : "missing");
        if (x->numel > *largest)
            *largest = x->numel;
    }
    return DT_OK;
}

int dt_ckpt_export(const char *dir, const char *out_path, int layout)
{
    dt_ckpt_reader_t *r = NULL;
    int rc = dt_ckpt_open(dir, &r);
    if (rc)
        return rc;
    xtensor_t *xs = NULL;
    size_t n = 0;
    uint64_t largest = 0;
    float *buf = NULL, *tr = NULL;
    dt_safetensors_writer_t *w = NULL;
    if ((rc = read_tensors(r, dir, layout, &xs, &n, &largest)))
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
        int64_t shape[4];
        memcpy(shape, xs[i].shape, sizeof shape);
        if (xs[i].transpose) {
            shape[0] = xs[i].shape[1];
            shape[1] = xs[i].shape[0];
        }
        rc = dt_safetensors_declare(w, xs[i].name, DT_F32, xs[i].ndim, shape);
    }
    for (size_t i = 0; i < n && !rc; i++) {
        char entry[DT_CKPT_NAME_MAX];
        snprintf(entry, sizeof entry, "%s/params", xs[i].unit);
        if ((rc = dt_ckpt_read(r, entry, xs[i].offset, xs[i].numel, buf)))
            break;
        const float *src = buf;
        if (xs[i].transpose) {
            const int64_t rows = xs[i].shape[0], cols = xs[i].shape[1];
            for (int64_t a = 0; a < rows; a++)
                for (int64_t b = 0; b < cols; b++)
                    tr[b * rows + a] = buf[a * cols + b];
            src = tr;
        }
        rc = dt_safetensors_write(w, src, (size_t)xs[i].numel * sizeof *src);
    }
    if (rc)
        goto fail;
    rc = dt_safetensors_commit(w);
    w = NULL;
    goto out;
fail:
    dt_safetensors_abort(w);
out:
    if (rc)
        dt_err_context(rc, "exporting '%s' to '%s'", dir, out_path);
    free(xs);
    free(buf);
    free(tr);
    dt_ckpt_close(r);
    return rc;
}
