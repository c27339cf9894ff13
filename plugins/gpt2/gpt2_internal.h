/*
 * plugins/gpt2/gpt2_internal.h - what gpt2.c (the units, training) and
 * gpt2_decode.c (generation with a KV cache) share: the shape and the
 * decoder's slots of the model table.
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

#endif /* DT_GPT2_INTERNAL_H */
