/*
 * core/engine/model.h - models as ordered lists of units, built from the
 * device's kernel table and driven through a strategy's unit hooks.
 *
 * The model never owns parameters or their gradients: a strategy does.
 * Around each use of a unit the model asks the strategy for that unit's
 * buffers (pre_forward / pre_backward) and hands them back (post_*), so the
 * same model code runs replicated (ddp), sharded (zero-3, fsdp) or
 * offloaded.  The model owns activations, tagged DT_TAG_ACTIVATIONS.
 */
#ifndef DT_ENGINE_MODEL_H
#define DT_ENGINE_MODEL_H

#include <stdint.h>

#include "config/config.h"
#include "dtrain/dtrain.h"

typedef struct dt_model dt_model_t;

/* The compute context the model runs in. */
typedef struct dt_model_ctx {
    const dt_device_ops_v1_t *dev_ops;
    dt_device_t *dev;
    dt_stream_t *stream;
    const dt_strategy_ops_v1_t *strat_ops;
    dt_strategy_t *strat;
    const char *strat_name; /* for messages */
} dt_model_ctx_t;

/* Shape of a GPT-2 family model. */
typedef struct dt_gpt2_shape {
    int64_t n_layer, n_head, n_embd, vocab_size, context;
} dt_gpt2_shape_t;

/* Build the description (units, tensors) from the resolved config's
 * [model] table; presets fill the shape and are shown as "derived". */
int dt_model_create(dt_config_t *cfg, dt_model_t **out);
void dt_model_free(dt_model_t *m, const dt_model_ctx_t *ctx);

/* The description strategies see (valid while the model lives). */
dt_model_desc_v1_t *dt_model_desc(dt_model_t *m);
const dt_gpt2_shape_t *dt_model_gpt2_shape(const dt_model_t *m);
/* Parameter count of a preset without building a model (planner, docs). */
uint64_t dt_gpt2_param_count(const dt_gpt2_shape_t *s);

/* Deterministic initial values of unit `unit` (host memory, unit.numel
 * floats), a function of (seed, tensor name) only: identical for any world
 * size or strategy. */
int dt_model_init_unit(const dt_model_t *m, uint32_t unit, uint64_t seed, float *out);

/* Allocate activations for micro-batches of B sequences of T tokens. */
int dt_model_alloc_acts(dt_model_t *m, const dt_model_ctx_t *ctx, int64_t B, int64_t T);

/* One micro-batch: forward (and, unless `no_grad`, backward) of
 * inputs/targets (B, T) i32 host arrays.  *loss receives the mean loss of
 * this micro-batch.  Backward scales the loss gradient by `loss_scale`
 * (1 / n_micro for gradient accumulation). */
int dt_model_step_micro(dt_model_t *m, const dt_model_ctx_t *ctx, const int32_t *inputs,
                        const int32_t *targets, uint32_t micro, uint32_t n_micro,
                        int no_grad, float loss_scale, double *loss);

/* FLOPs of one forward+backward token (for MFU), 6N + attention. */
double dt_model_flops_per_token(const dt_model_t *m, int64_t T);

#endif /* DT_ENGINE_MODEL_H */
