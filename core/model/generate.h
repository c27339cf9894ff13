/*
 * core/model/generate.h - text generation from a trained model: a decoder
 * that runs one position at a time with a KV cache (the model plugin's
 * decoder slots, dtrain/model.h: plugins/gpt2/gpt2_decode.c), the
 * choice of the next token from its logits (generate.c), and the loop
 * joining the two (`dtrain sample`).
 *
 * The decoder runs on any device plugin through the same kernel table as
 * training: per layer it keeps K and V of every position so far, and each
 * new token runs one position through every layer (its attention reads
 * the cache), so a token costs one position whatever came before it.
 */
#ifndef DT_MODEL_GENERATE_H
#define DT_MODEL_GENERATE_H

#include <stdint.h>

#include "model/model.h"

typedef struct dt_decoder dt_decoder_t;

/* A decoder for model `m` (through its plugin's decoder slots: gpt2's
 * needs [model] dtype fp32 at tensor degree 1) on ctx's device
 * and stream (ctx->strat is not used: the decoder calls no hooks).
 * params[u] is unit u's flat parameter buffer, device memory of
 * desc.units[u].numel f32 laid out as the description says; the caller
 * keeps params and m alive while the decoder lives.  It holds up to
 * `max_len` positions (1 .. the model's context).  Its cache and scratch
 * are device memory tagged activations, freed by dt_decoder_free.
 * DT_ERR_INVALID / DT_ERR_UNSUPPORTED naming what is wrong for an arch
 * without a decoder, a bf16 model or a bad max_len. */
int dt_decoder_create(dt_model_t *m, const dt_model_ctx_t *ctx, void *const *params,
                      int64_t max_len, dt_decoder_t **out);
/* Run `token` (in [0, vocab_size)) at the next position, appending its K
 * and V to the cache; logits (vocab_size f32, host memory) receives the
 * scores of the token after it.  DT_ERR_INVALID once max_len positions
 * were run, or for a token outside the vocabulary. */
int dt_decoder_step(dt_decoder_t *d, int32_t token, float *logits);
/* Positions run so far. */
int64_t dt_decoder_len(const dt_decoder_t *d);
/* Forget every position (the cache is reused from position 0). */
void dt_decoder_reset(dt_decoder_t *d);
void dt_decoder_free(dt_decoder_t *d); /* NULL ok */

/* How the next token is chosen. */
typedef struct dt_pick_opts {
    double temperature; /* 0: greedy (the largest logit, the lowest id on
                         * ties); else logits / temperature */
    int64_t top_k;      /* 0: every token; k: only the k largest logits
                         * (top_k 1 is greedy whatever the temperature) */
    uint64_t seed;      /* the draws are a function of seed alone */
} dt_pick_opts_t;

/* A candidate token (generate.c's scratch). */
struct dt_pick_cand {
    float logit;
    int32_t id;
};

/* The draws of one generation (splitmix64 seeded with opts.seed). */
typedef struct dt_pick {
    dt_pick_opts_t opts;
    uint64_t rng;
    int64_t vocab;
    struct dt_pick_cand *cand; /* (vocab) scratch: candidates by logit */
    double *prob;              /* (vocab) scratch */
} dt_pick_t;

int dt_pick_init(dt_pick_t *p, const dt_pick_opts_t *opts, int64_t vocab);
void dt_pick_free(dt_pick_t *p);
/* The next token from logits (vocab f32): greedy, or one draw from
 * softmax(logits / temperature) over the top_k candidates, computed in
 * double.  Non-finite logits: DT_ERR_DATA naming the first. */
int dt_pick_next(dt_pick_t *p, const float *logits, int32_t *token);

/* Run `n_prompt` tokens (>= 1) through d, then generate n_new tokens,
 * each picked from the last logits by p and fed back; every generated
 * token goes to emit(arg, token) as it is chosen (emit may be NULL) and
 * to out[i] (out may be NULL).  d must have room for n_prompt + n_new - 1
 * positions more (the last token is never run).  Fails with the decoder's
 * or the pick's status. */
int dt_generate(dt_decoder_t *d, dt_pick_t *p, const int32_t *prompt, int64_t n_prompt,
                int64_t n_new, int32_t *out, void (*emit)(void *arg, int32_t token),
                void *arg);

#endif /* DT_MODEL_GENERATE_H */
