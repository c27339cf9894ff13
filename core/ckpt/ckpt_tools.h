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
    DT_EXPORT_HF = 0,    /* Hugging Face GPT-2: Conv1D weights as (in, out) */
    DT_EXPORT_NATIVE = 1 /* dtrain's (out, in), every tensor as stored */
} dt_export_layout_t;

/* Write the parameters of checkpoint `dir` to a safetensors file, one
 * tensor per model parameter under its GPT-2 name, f32.  A GPT-2 in the
 * HF layout also gets Hugging Face's config.json beside the file
 * (dt_ckpt_hf_config_path), so the folder loads as a GPT2LMHeadModel;
 * *wrote_config (may be NULL) says whether it did.  out_path's folder is
 * made if missing (mkdir -p).  Either file replaces only a regular file
 * (or nothing); a config.json already there that is not byte for byte the
 * one this export writes (another model's, or one edited by hand) is
 * replaced only with `overwrite`, else DT_ERR_CONFIG "'<dir>/config.json'
 * already exists and is not this export's config.json (another model's?):
 * give --overwrite to replace it, or export to another folder" before
 * anything is written. */
int dt_ckpt_export(const char *dir, const char *out_path, int layout, int overwrite,
                   int *wrote_config);
/* The config.json beside weights file `weights` (same folder). */
void dt_ckpt_hf_config_path(const char *weights, char *buf, size_t cap);

typedef struct dt_model dt_model_t;

/* The GPT-2 weights of safetensors file `weights`, in Hugging Face's
 * layout (hf_gpt2.h), as a checkpoint of model `m` (a gpt2 built from the
 * weights' config.json; fp32) at step 0 under `out_root`
 * (out_root/step-00000000, written atomically like any save): the
 * parameters from the file, widened exactly to f32 when BF16 or F16 and
 * the Conv1D weights transposed to dtrain's (out, in); AdamW's two
 * moments zero.  Resuming it (checkpoint.resume = that directory) starts
 * training at step 1 from these weights, as a fresh run starts from its
 * initialisation: fine-tuning.  Every tensor of the file must be a
 * parameter of m in HF's shape (F32, BF16 or F16), the attn.bias /
 * attn.masked_bias buffers (ignored) or an lm_head.weight equal to wte;
 * every parameter must be there.  Errors are DT_ERR_DATA naming the file
 * and the tensor.  Memory: two buffers of the largest tensor.
 * out_root is locked as a run locks it (dt_ckpt_lock).  When it already
 * holds complete checkpoints: without `overwrite`, DT_ERR_CONFIG "the
 * folder '<out_root>' already holds checkpoints (the newest: step N): give
 * --overwrite to replace them with the import, or import into another
 * folder", nothing written; with it, they are removed once the import is
 * in place (dt_ckpt_remove_others), with a warning. */
int dt_ckpt_import(const char *weights, dt_model_t *m, const char *out_root, int overwrite);

#endif /* DT_CKPT_TOOLS_H */
