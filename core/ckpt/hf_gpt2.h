/*
 * core/ckpt/hf_gpt2.h - Hugging Face's GPT-2 (transformers'
 * GPT2LMHeadModel) as files, for `dtrain export` and `dtrain import`:
 *
 *  - tensor names: dtrain's GPT-2 names are HF's ("h.3.attn.c_attn.weight",
 *    "wte.weight"); a GPT2LMHeadModel's state dict may prefix them
 *    "transformer."; its "lm_head.weight" is tied to wte (save_pretrained
 *    drops it); each block's "attn.bias" (the causal mask) and, in older
 *    versions, "attn.masked_bias" are buffers, not parameters;
 *  - layout: the four projections are Conv1D, weight (in, out), the
 *    transpose of dtrain's (out, in);
 *  - config.json: n_layer, n_head, n_embd, vocab_size, n_positions (and the
 *    older n_ctx), model_type "gpt2", architectures ["GPT2LMHeadModel"],
 *    layer_norm_epsilon 1e-5 and activation_function "gelu_new" (GELU's
 *    tanh approximation), which are what dtrain's GPT-2 computes.
 */
#ifndef DT_CKPT_HF_GPT2_H
#define DT_CKPT_HF_GPT2_H

#include <cjson/cJSON.h>

#include "model/model.h"

/* The shape of a GPT-2 family model.  Which model is one is told by its
 * shape keys (dtrain/model.h dt_model_info_t), not by its plugin's name:
 * exactly n_layer, n_head, n_embd, vocab_size, context, in that order. */
typedef struct dt_gpt2_shape {
    int64_t n_layer, n_head, n_embd, vocab_size, context;
} dt_gpt2_shape_t;

/* The GPT-2 shape of model info `mi` into *out: DT_OK, or
 * DT_ERR_NOT_FOUND (no message) when its keys are not a GPT-2's. */
int dt_hf_gpt2_shape(const dt_model_info_t *mi, dt_gpt2_shape_t *out);
/* The same of a checkpoint manifest's "model" object (its numeric keys in
 * the order written): 1 when they are a GPT-2's, else 0. */
int dt_hf_gpt2_manifest(const cJSON *model);

/* Whether GPT-2 tensor `name` is a Conv1D weight (stored transposed). */
int dt_hf_gpt2_conv1d(const char *name);

/* What a tensor name of an HF file is to dtrain. */
typedef enum dt_hf_gpt2_role {
    DT_HF_PARAM = 0,   /* a parameter: *base is its dtrain name */
    DT_HF_LM_HEAD = 1, /* "lm_head.weight": must equal wte (tied) */
    DT_HF_BUFFER = 2   /* attn.bias / attn.masked_bias: ignored */
} dt_hf_gpt2_role_t;
/* The role of `name` and, for a parameter, the name without a
 * "transformer." prefix (a pointer into `name`). */
int dt_hf_gpt2_role(const char *name, const char **base);

/* GPT-2's <|endoftext|>, its one special token: bos and eos alike. */
#define DT_HF_GPT2_EOT 50256

/* config.json's text for a GPT-2 of shape `s` (malloc'd, NUL-terminated,
 * ending in a newline; *len excludes the NUL; NULL when out of memory).
 * bos_token_id and eos_token_id are DT_HF_GPT2_EOT when the vocabulary
 * holds GPT-2's (vocab_size > 50256: 50257, or llm.c's padded 50304), else
 * null: a byte-level vocabulary of 256 (`dtrain data prepare`) has no
 * special token, every id is a byte, and any other vocabulary is not one
 * dtrain knows the tokens of.  Stated either way, so transformers neither
 * assumes GPT-2's 50256 for a model without it nor warns at each load. */
char *dt_hf_gpt2_config_text(const dt_gpt2_shape_t *s, size_t *len);
/* That text written atomically at `path`. */
int dt_hf_gpt2_config_write(const char *path, const dt_gpt2_shape_t *s);
/* Read a GPT-2 config.json: n_layer, n_head, n_embd, vocab_size and
 * n_positions (or n_ctx) as positive integers.  Every key that changes
 * what the model computes, when present, must hold what dtrain's GPT-2
 * computes: model_type "gpt2", activation_function "gelu_new" (or
 * "gelu_pytorch_tanh", the same function), layer_norm_epsilon 1e-5,
 * n_inner null or 4 n_embd, scale_attn_weights true,
 * scale_attn_by_inverse_layer_idx false, add_cross_attention false,
 * tie_word_embeddings true.  DT_ERR_CONFIG otherwise:
 * "'<path>': \"<key>\" is <value>; <what dtrain computes>". */
int dt_hf_gpt2_config_read(const char *path, dt_gpt2_shape_t *out);

#endif /* DT_CKPT_HF_GPT2_H */
