/*
 * tests/support/model_harness.h - run one model (core/model/model.h) on
 * a real device plugin (cpu, or cuda: dt_mh_device) with a minimal strategy that lives in the
 * test, and compare its loss, logits and gradients with a float64 numpy
 * reference (tests/reference/<arch>_ref.py) run as a subprocess.
 *
 * The strategy ("oracle strategy") holds, per unit, f32 master parameters,
 * a compute copy in the model's param_dtype (cast with the device's cast
 * kernel for bf16) and f32 gradients.  It also checks the hook contract of
 * dtrain/strategy.h as the model drives it: every pre_* has its post_*,
 * gradients only in backward, last_use exactly once per unit and
 * micro-batch and no use after it; a violation fails the hook with
 * DT_ERR_INVALID and a message saying what happened.
 */
#ifndef DT_TEST_MODEL_HARNESS_H
#define DT_TEST_MODEL_HARNESS_H

#include <stdint.h>

#include "dtrain/dtrain.h"
#include "model/model.h"

typedef struct dt_mh_strategy dt_mh_strategy_t;

typedef struct dt_mh {
    const dt_device_ops_v1_t *D;
    dt_device_t *dev;
    dt_stream_t *stream;
    dt_config_t *cfg;
    dt_model_t *model;
    dt_model_desc_v1_t *desc;
    dt_mh_strategy_t *strat;
    dt_model_ctx_t ctx;
    int64_t B, T;
    const char *source_dir; /* DT_TEST_SOURCE_DIR of the test */
} dt_mh_t;

/* The device plugin dt_mh_open_at loads: "cpu" (the default; 2 threads)
 * or "cuda" (deterministic).  Set it before opening. */
extern const char *dt_mh_device;
/* dt_mh_stage_end > 0: dt_mh_open_at allocates activations for units
 * [dt_mh_stage_first, dt_mh_stage_end) only (dt_model_set_stage), as a
 * pipeline stage's rank does; 0 (the default): the whole model's. */
extern uint32_t dt_mh_stage_first, dt_mh_stage_end;
/* The tensor rank dt_mh_open_at builds the model for (dt_model_create_part;
 * the [parallel] tensor degree is the TOML's, 1 without that table). */
extern int32_t dt_mh_tp_rank;
/* Non-NULL: dt_mh_open_at sets the model's sequence split from this
 * tensor-parallel scheme (dt_model_set_sequence, named "test") before
 * allocating activations. */
extern const dt_tensor_ops_t *dt_mh_tp_scheme;
/* > 1: activations for that many micro-batches at once (dt_model_set_slots). */
extern uint32_t dt_mh_slots;
/* dt_mh_n_chunks > 0: the unit ranges [dt_mh_chunk_first[i],
 * dt_mh_chunk_end[i]) of an interleaved pipeline's rank instead
 * (dt_model_set_stages). */
extern uint32_t dt_mh_n_chunks, dt_mh_chunk_first[4], dt_mh_chunk_end[4];

/* Non-NULL: the folder dt_mh_open_at loads the model plugin from (an
 * example plugin's build folder) instead of its plugin_dir. */
extern const char *dt_mh_model_dir;
/* The model plugin the config's [model] arch names, from `plugin_dir`
 * (never dlclosed); NULL with the message set when it is missing. */
const dt_model_ops_t *dt_mh_model_ops(const char *plugin_dir, const dt_config_t *cfg);

/* Load the device plugin (dt_mh_device) and the model plugin ([model]
 * arch), build the model from TOML text holding
 * a [model] table, allocate activations for B x T and the strategy, and
 * set the parameters to dt_model_init_unit(seed) perturbed by
 * dt_mh_perturb.  Returns DT_OK or a status with dt_last_error(). */
int dt_mh_open_at(dt_mh_t *h, const char *plugin_dir, const char *source_dir,
                  const char *model_toml, int64_t B, int64_t T, uint64_t seed);
/* The test's own build folders (compile definitions of unit tests). */
#define dt_mh_open(h, toml, B, T, seed)                                        \
    dt_mh_open_at((h), DT_TEST_PLUGIN_DIR, DT_TEST_SOURCE_DIR, (toml), (B), (T), (seed))
void dt_mh_close(dt_mh_t *h);

/* Move the parameters away from init so every gradient path carries
 * signal: 2-D tensors rescaled to std 1/sqrt(shape[1]) (attention is
 * peaked, GELU is non-linear), 1-D ".weight" tensors (norms) to
 * 1 + U(-0.5, 0.5), other 1-D tensors (biases) to U(-0.3, 0.3).  Host
 * master values of unit u: h->strat's, via dt_mh_master. */
void dt_mh_perturb(float *unit_params, const dt_unit_desc_v1_t *u, uint64_t seed);

/* Host master parameters of unit u (unit.numel f32; writable: call
 * dt_mh_sync_params after changing them). */
float *dt_mh_master(dt_mh_t *h, uint32_t u);
/* Rebuild the compute copies from the masters. */
int dt_mh_sync_params(dt_mh_t *h);
/* Gradients of unit u (unit.numel f32), copied to a host buffer the
 * harness owns (valid until the next call for u or dt_mh_close). */
const float *dt_mh_grads(dt_mh_t *h, uint32_t u);

/* How many pre_forward calls the strategy has seen since dt_mh_open,
 * without and with DT_HOOK_NO_GRAD. */
void dt_mh_forward_hooks(const dt_mh_t *h, uint64_t *plain, uint64_t *no_grad);

/* Zero the gradients and reset the hook bookkeeping for a step of n_micro
 * micro-batches; dt_mh_end_step checks every unit finished each of them. */
int dt_mh_begin_step(dt_mh_t *h, uint32_t n_micro);
int dt_mh_end_step(dt_mh_t *h);

/* Write every parameter by name to a safetensors file as F32.  With
 * `as_dtype` DT_BF16 or DT_F16, each value is first rounded to it (what a
 * bf16 or fp16 model computes with); DT_F32 writes them as they are. */
int dt_mh_write_params(dt_mh_t *h, const char *path, int as_dtype);
/* T.bin of tests/reference: i32 B, T, B*T inputs, B*T targets. */
int dt_mh_write_tokens(const char *path, int64_t B, int64_t T, const int32_t *inputs,
                       const int32_t *targets);

/* 1 when /usr/bin/python3 runs and imports numpy (the reference's only
 * needs); otherwise 0 and *why says what is missing. */
int dt_mh_python_ok(const char **why);
/* Run `/usr/bin/python3 <h->source_dir>/tests/reference/<script> <args>`;
 * its stderr goes to the test's output.  Returns the exit status (-1 when
 * it could not run). */
int dt_mh_run_ref(const dt_mh_t *h, const char *script, const char *args);

/* What a comparison found, per tensor "type" (the name without layer
 * numbers: "h.1.ln_1.weight" -> "ln_1.weight"): the largest
 * max|got - ref| / max|ref| over tensors of that type. */
#define DT_MH_MAX_TYPES 32
typedef struct dt_mh_stats {
    double loss_err;         /* |loss - ref| */
    double logits_rel;       /* max|got - ref| / max|ref| */
    int logits_seen;         /* logits were compared */
    uint32_t n_types;
    char type[DT_MH_MAX_TYPES][48];
    double rel[DT_MH_MAX_TYPES];
} dt_mh_stats_t;

/* Compare with the reference output file `ref_path`: loss (`loss`, within
 * loss_atol), logits (unless logits == NULL: then not compared) and the
 * gradient of every parameter within `tol` relative to the tensor's max
 * |ref|.  Fails the cmocka test on a mismatch, naming the tensor and the
 * worst element.  Merges into *st (may be NULL). */
void dt_mh_compare(dt_mh_t *h, const char *ref_path, double loss, const float *logits,
                   double loss_atol, double tol, dt_mh_stats_t *st);
/* Print stats as "what: type rel" lines. */
void dt_mh_print_stats(const char *what, const dt_mh_stats_t *st);

/* Host copy of the model's logits (B*T*V floats, malloc'ed). */
float *dt_mh_logits(dt_mh_t *h);

/* A fresh temporary folder (mkdtemp under $TMPDIR or /tmp) in `out`, and
 * its removal with the files in it. */
void dt_mh_tmpdir(char *out, size_t cap);
void dt_mh_rmdir(const char *dir);

/* ---------------------------------------------------------------------
 * Oracle tests: what the model tests against a float64 reference
 * (test_gpt2_oracle.c, test_mlp.c) share.
 * ------------------------------------------------------------------ */

/* Tolerances, |got - ref| relative to the tensor's largest |ref| and the
 * loss absolute (each test states what it measured against them): f32
 * computation (and bf16 against the oracle run on the bf16-rounded
 * parameters), and bf16 against the oracle on the unrounded ones. */
#define DT_MH_TOL_F32 2e-5
#define DT_MH_LOSS_ATOL_F32 1e-5
#define DT_MH_TOL_BF16 5e-2
#define DT_MH_LOSS_ATOL_BF16 2e-2
/* fp16 keeps 11 significant bits, 3 more than bf16: its parameter
 * rounding (2^-12) is 8x smaller, and so are the bounds. */
#define DT_MH_TOL_F16 6.25e-3
#define DT_MH_LOSS_ATOL_F16 2.5e-3

/* Open the test's model with `dtype` ("fp32", "bf16") and
 * activation_checkpointing `ckpt`, or fail the cmocka test. */
typedef void (*dt_mh_open_fn)(dt_mh_t *h, const char *dtype, const char *ckpt);

typedef struct dt_mh_oracle {
    /* in: the test's */
    const char *script;              /* the reference, "gpt2_ref.py" */
    const char *args;                /* its model arguments, "--n-layer 3" */
    dt_mh_open_fn open;              /* the model (micro-batch B x T) */
    const int32_t *inputs, *targets; /* (2, B, T): two micro-batches */
    /* out: dt_mh_oracle_setup's */
    int have_python;
    const char *no_python_why;
    char dir[512];                   /* the temporary folder */
    char params[600], params_bf16[600], params_f16[600]; /* f32, bf16-, f16-rounded */
    char tok[600], tok2[600];        /* one micro-batch; both as one batch of 2B */
    char ref[600], ref_bf16[600], ref_f16[600], ref_accum[600]; /* the oracle on
                                      * (params, tok), (params_bf16, tok),
                                      * (params_f16, tok), (params, tok2) */
} dt_mh_oracle_t;

/* Group setup: unless python/numpy is missing (have_python 0: the tests
 * skip), write the model's parameters (opened fp32, checkpointing "none")
 * and the tokens to a temporary folder and run the oracle on them.
 * Returns 0; failures fail the cmocka setup. */
int dt_mh_oracle_setup(dt_mh_oracle_t *o);
/* Group teardown: remove the folder. */
int dt_mh_oracle_teardown(dt_mh_oracle_t *o);
/* Skip the calling test, with the reason, when the oracle cannot run. */
void dt_mh_need_python(const dt_mh_oracle_t *o);

/* Run `script` (tests/reference) on `params` and `tok` into `out`, with
 * model arguments `args`; fails the cmocka test when it fails. */
void dt_mh_ref(const dt_mh_t *h, const char *script, const char *params, const char *tok,
               const char *out, const char *args);
/* Seeded tokens in [0, vocab): n inputs and n targets. */
void dt_mh_tokens(uint64_t seed, int32_t vocab, int n, int32_t *inputs, int32_t *targets);
/* One step of n_micro micro-batches (inputs/targets: (n_micro, B, T)) at
 * loss_scale 1/n_micro, checking the hook contract; the mean loss. */
double dt_mh_step(dt_mh_t *h, const int32_t *inputs, const int32_t *targets, uint32_t n_micro,
                  int no_grad);
/* dt_mh_step at loss_scale scale/n_micro (fp16 loss scaling). */
double dt_mh_step_scaled(dt_mh_t *h, const int32_t *inputs, const int32_t *targets,
                         uint32_t n_micro, int no_grad, double scale);
/* The gradients of all units, concatenated (desc->numel f32, malloc'ed). */
float *dt_mh_all_grads(dt_mh_t *h, uint64_t *n);

/* The checks every oracle test makes (fail the cmocka test; stats
 * printed under `label`):
 *   checkpointing: "none", "all", "every" match ref (loss, logits, every
 *     gradient) within the f32 tolerances, and recomputation gives
 *     bit-identical gradients;
 *   accumulation (checkpointing `ckpt`): two micro-batches at loss_scale
 *     1/2 match ref_accum, the mean over both;
 *   half (checkpointing "every"), `dtype` "bf16" or "fp16": 16-bit compute
 *     parameters match ref_bf16 / ref_f16 within the f32 tolerances and
 *     ref within the bf16 / fp16 ones; fp16 also: the gradients at loss
 *     scale 2^16 are exactly 2^16 times the unscaled ones. */
void dt_mh_check_checkpointing(const dt_mh_oracle_t *o, const char *label);
void dt_mh_check_accumulation(const dt_mh_oracle_t *o, const char *ckpt, const char *label);
void dt_mh_check_half(const dt_mh_oracle_t *o, const char *dtype, const char *label);

#endif /* DT_TEST_MODEL_HARNESS_H */
