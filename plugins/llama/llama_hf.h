/*
 * plugins/llama/llama_hf.h - the llama plugin's Hugging Face slots of the
 * model table (llama_hf.c; dtrain/model.h hf_*), for llama.c's table.
 */
#ifndef DT_LLAMA_HF_H
#define DT_LLAMA_HF_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/model.h"

const char *const *llama_hf_architectures(void);
int llama_hf_config_read(const char *path, const char *text, size_t len, dt_model_key_t *out,
                         uint32_t cap, uint32_t *n, char *err, size_t err_cap);
size_t llama_hf_config_write(const dt_model_key_t *keys, uint32_t n, char *buf, size_t cap,
                             char *err, size_t err_cap);
void llama_hf_export_name(const char *name, char *hf, size_t cap, int *transpose);
int llama_hf_import_name(const dt_model_key_t *keys, uint32_t n, const char *hf, char *name,
                         size_t cap);

#endif /* DT_LLAMA_HF_H */
