/*
 * core/ckpt/hf_model.h - Hugging Face transformers' model folders through
 * the model plugins' hf_* slots (dtrain/model.h): which plugin reads a
 * config.json, the [model] assignments it gives, the config.json a
 * checkpoint exports as.  The core names no architecture: each model
 * plugin says which `architectures` / `model_type` values it reads, what
 * its config.json keys mean and how its tensors are named there.
 */
#ifndef DT_CKPT_HF_MODEL_H
#define DT_CKPT_HF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "dtrain/model.h"
#include "loader/loader.h"

/* Whether model table `ops` has the five hf_* slots. */
int dt_hf_model_has(const dt_model_ops_t *ops);

/* The model plugin on `sp` that reads config.json `path`: the first (in
 * the search path's order) whose hf_architectures lists one of the file's
 * "architectures" or its "model_type"; loaded and bound with its defaults
 * into *out (dt_plugin_unload).  A missing or unparsable file, or one no
 * plugin reads, is DT_ERR_CONFIG naming the file, its architectures, and
 * what the plugins found read. */
int dt_hf_model_find(const dt_search_path_t *sp, const char *path, dt_plugin_t **out);

/* config.json `path` read by `ops`'s hf_config_read as [model]
 * assignments ("model.arch=<plugin>", "model.n_layer=12", ...) into
 * sets[cap], *n of them; its refusals are DT_ERR_CONFIG with the plugin's
 * message. */
int dt_hf_model_sets(const dt_model_ops_t *ops, const char *path, char (*sets)[96], int cap,
                     int *n);

/* config.json's text (malloc'd, *len bytes) of a checkpoint whose manifest
 * "model" object is `model`, written by `ops`'s hf_config_write; `context`
 * (> 0) is added as the "context" key when the manifest has none.  `dir`
 * names the checkpoint in messages. */
int dt_hf_model_config_text(const dt_model_ops_t *ops, const cJSON *model, int64_t context,
                            const char *dir, char **text, size_t *len);

#endif /* DT_CKPT_HF_MODEL_H */
