/*
 * plugins/llama/llama_internal.h - what llama.c (the units, training) and
 * llama_decode.c (generation with a KV cache) share: the shape, the
 * rotary frequencies and the decoder's slots of the model table.
 */
#ifndef DT_LLAMA_INTERNAL_H
#define DT_LLAMA_INTERNAL_H

#define DT_MODEL_PLUGIN_HELPERS
#include "dtrain/model.h"

/* The shape and the settings of a LLaMA-family model ([model] keys). */
typedef struct llama_shape {
    int64_t n_layer, n_head, n_kv_head, n_embd, vocab_size, context;
    int64_t intermediate, head_dim;
    int tie, qkv_bias;
    double rope_theta, rms_eps;
    /* Llama 3.1's rope_scaling (rope_type "llama3") when `scaling` */
    int scaling;
    double rs_factor, rs_low, rs_high;
    int64_t rs_orig;
} llama_shape_t;

/* The model's shape (m is a llama model). */
const llama_shape_t *llama_shape(const dt_model_state_t *m);

/* The rotary frequency of channel pair i < head_dim / 2, in double:
 * theta^(-2i/head_dim), rescaled under rope_scaling "llama3". */
double llama_inv_freq(const llama_shape_t *s, int64_t i);

/* dt_model_ops_v1_t's decoder slots (llama_decode.c): a decoder for a
 * [model] dtype fp32 model at tensor degree 1. */
int llama_decoder_create(dt_model_state_t *m, const dt_model_ctx_t *ctx, void *const *params,
                         int64_t max_len, dt_model_decoder_t **out);
int llama_decoder_step(dt_model_decoder_t *d, int32_t token, float *logits);
int64_t llama_decoder_len(const dt_model_decoder_t *d);
void llama_decoder_reset(dt_model_decoder_t *d);
void llama_decoder_free(dt_model_decoder_t *d);

#endif /* DT_LLAMA_INTERNAL_H */
