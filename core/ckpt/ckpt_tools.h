/*
 * core/ckpt/ckpt_tools.h - offline operations on a saved checkpoint:
 * describe it, merge its shards into one, export its weights.
 *
 * All of them read only the manifest and the shard files (no model is
 * built, no plugin is loaded) and stream: memory stays bounded by the
 * largest parameter tensor (export) or a fixed chunk (consolidate),
 * whatever the model size.  Import, the way in, writes a checkpoint of a
 * model description its caller built.
 */
#ifndef DT_CKPT_TOOLS_H
#define DT_CKPT_TOOLS_H

#include <stdint.h>
#include <stddef.h>
#include <stdio.h>

/* Print the manifest in words: step, writer, model, entries with their
 * segments and shard files.  verify != 0 also checks every CRC. */
int dt_ckpt_inspect(const char *dir, int verify, FILE *out);

/* Rewrite checkpoint `dir` as one shard under `out_root`
 * (out_root/step-XXXXXXXX, written atomically like any save), in chunks of
 * at most `chunk_elems` elements (0: a default of 4M). */
int dt_ckpt_consolidate(const char *dir, const char *out_root, uint64_t chunk_elems);

/* Layout of exported weight matrices. */
typedef enum dt_export_layout {
    DT_EXPORT_HF = 0,    /* Hugging Face's names, layout and config.json */
    DT_EXPORT_NATIVE = 1 /* dtrain's names, (out, in), every tensor as stored */
} dt_export_layout_t;

typedef struct dt_search_path dt_search_path_t;

/* Write the parameters of checkpoint `dir` to a safetensors file, one f32
 * tensor per model parameter.  In the HF layout the model plugin of the
 * manifest's arch (loaded from `sp`) names them as Hugging Face does and
 * says which 2-D weights it stores transposed (its hf_* slots,
 * dtrain/model.h), and its config.json is written beside the file
 * (dt_ckpt_hf_config_path), so the folder loads with transformers'
 * from_pretrained; *wrote_config (may be NULL) says whether it did.  A
 * plugin without those slots (mlp): dtrain's names, no config.json.
 * out_path's folder is made if missing (mkdir -p).  Either file replaces
 * only a regular file (or nothing); a config.json already there that is
 * not byte for byte the one this export writes (another model's, or one
 * edited by hand) is replaced only with `overwrite`, else DT_ERR_CONFIG
 * "'<dir>/config.json' already exists and is not this export's
 * config.json (another model's?): give --overwrite to replace it, or
 * export to another folder" before anything is written.  Memory: two
 * buffers of the largest tensor. */
int dt_ckpt_export(const char *dir, const char *out_path, int layout,
                   const dt_search_path_t *sp, int overwrite, int *wrote_config);
/* The config.json beside weights file `weights` (same folder). */
void dt_ckpt_hf_config_path(const char *weights, char *buf, size_t cap);

typedef struct dt_model dt_model_t;

/* The Hugging Face weights `weights` (a model folder, an index
 * model.safetensors.index.json with its shards, or one .safetensors file:
 * safetensors_set.h) as a checkpoint of model `m` (built from their
 * config.json: dt_hf_model_sets; fp32, tp 1) at step 0 under `out_root`
 * (out_root/step-00000000, written atomically like any save, by one
 * writer: a checkpoint every layout resumes): the parameters from the
 * files, widened exactly to f32 when BF16 or F16 and the weights Hugging
 * Face stores transposed put back to dtrain's (out, in); AdamW's two
 * moments zero.  The manifest's extra records "imported_from" and the
 * model's "context".  Resuming it (checkpoint.resume = that directory)
 * starts training at step 1 from these weights: fine-tuning.  Every
 * tensor of the files must be, by m's plugin (hf_import_name), a
 * parameter of m in HF's shape (F32, BF16 or F16), a buffer (ignored) or
 * a tied copy equal to its parameter (a tied LM head); every parameter
 * must be there.  Errors are DT_ERR_DATA naming the file and the tensor.
 * Memory: two buffers of 4M elements (16 MiB each; of the largest tensor
 * when Hugging Face stores it transposed, GPT-2's Conv1D), whatever the
 * model size: tensors are read by ranges and written chunk by chunk.
 * out_root is locked as a run locks it (dt_ckpt_lock).  When it already
 * holds complete checkpoints: without `overwrite`, DT_ERR_CONFIG "the
 * folder '<out_root>' already holds checkpoints (the newest: step N): give
 * --overwrite to replace them with the import, or import into another
 * folder", nothing written; with it, they are removed once the import is
 * in place (dt_ckpt_remove_others), with a warning. */
int dt_ckpt_import(const char *weights, dt_model_t *m, const char *out_root, int overwrite);

#endif /* DT_CKPT_TOOLS_H */
