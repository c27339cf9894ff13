/*
 * plugins/gpt2/gpt2_internal.h - what gpt2.c (the units, training) and
 * gpt2_decode.c (generation with a KV cache) and gpt2_hf.c (Hugging Face's
 * files) share: the shape, the decoder's and the Hugging Face slots of the
 * model table.
 */
#ifndef DT_GPT2_INTERNAL_H
#define DT_GPT2_INTERNAL_H

#define DT_MODEL_PLUGIN_HELPERS
#include "dtrain/model.h"

/* Shape of a GPT-2 family model: the [model] keys n_layer, n_head,
 * n_embd, vocab_size, context. */
typedef struct gpt2_shape {
    int64_t n_layer, n_head, n_embd, vocab_size, context;
} gpt2_shape_t;

/* The model's shape (m is a gpt2 model). */
const gpt2_shape_t *gpt2_shape(const dt_model_state_t *m);

/* dt_model_ops_v1_t's decoder slots (gpt2_decode.c): a decoder for a
 * [model] dtype fp32 model at tensor degree 1. */
int gpt2_decoder_create(dt_model_state_t *m, const dt_model_ctx_t *ctx, void *const *params,
                        int64_t max_len, dt_model_decoder_t **out);
int gpt2_decoder_step(dt_model_decoder_t *d, int32_t token, float *logits);
int64_t gpt2_decoder_len(const dt_model_decoder_t *d);
void gpt2_decoder_reset(dt_model_decoder_t *d);
void gpt2_decoder_free(dt_model_decoder_t *d);

/* dt_model_ops_v1_t's Hugging Face slots (gpt2_hf.c): GPT2LMHeadModel's
 * names, Conv1D layout and config.json. */
const char *const *gpt2_hf_architectures(void);
int gpt2_hf_config_read(const char *path, const char *text, size_t len, dt_model_key_t *out,
                        uint32_t cap, uint32_t *n, char *err, size_t err_cap);
size_t gpt2_hf_config_write(const dt_model_key_t *keys, uint32_t n, char *buf, size_t cap,
                            char *err, size_t err_cap);
void gpt2_hf_export_name(const char *name, char *hf, size_t cap, int *transpose);
int gpt2_hf_import_name(const dt_model_key_t *keys, uint32_t n, const char *hf, char *name,
                        size_t cap);

#endif /* DT_GPT2_INTERNAL_H */
