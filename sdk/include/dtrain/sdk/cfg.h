/*
 * dtrain/sdk/cfg.h - reading a plugin's configuration values through
 * host->cfg_*.  Defaults, ranges and choices are declared once, in the
 * plugin's config_keys (dtrain/plugin.h); the core checks and fills them
 * before init, so these helpers take no default and repeat no check.
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Part of the SDK helper library (dtrain/sdk_helpers.h says how to link
 * it and the conventions every helper follows).
 *
 * One rule for every plugin: a key the host holds no value for
 * (DT_ERR_NOT_FOUND: the plugin did not declare it, or the host applied
 * no defaults) is DT_ERR_CONFIG "config key <key>: no value (not declared
 * by the plugin, or the host applied no defaults)"; any other failure is
 * DT_ERR_CONFIG "config key <key>: cannot read (<status>)".  A plugin
 * keeps only the checks its declared keys cannot express (e.g. "> 0"
 * where the range is [0, x], or one key against another).
 */
#ifndef DTRAIN_SDK_CFG_H
#define DTRAIN_SDK_CFG_H

#include <stdint.h>

#include "dtrain/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* *out = the integer (its declared range already checked by the core). */
int dt_cfg_int(const dt_host_v1_t *host, const char *key, int64_t *out);
/* *out = 0 or 1. */
int dt_cfg_bool(const dt_host_v1_t *host, const char *key, int *out);
int dt_cfg_float(const dt_host_v1_t *host, const char *key, double *out);
/* *out: the core's string (valid until finalize). */
int dt_cfg_string(const dt_host_v1_t *host, const char *key, const char **out);
/* *out = the string's index in `choices` ("A|B|C", the declared choices in
 * the order the plugin numbers them); another value (a host that did not
 * check the choices) is DT_ERR_CONFIG "<key> = \"<v>\" is not one of the
 * valid choices: A, B, C". */
int dt_cfg_enum(const dt_host_v1_t *host, const char *key, const char *choices, int *out);

/* The dtype gradients travel in when a data-parallel strategy reduces
 * them: one key every such strategy declares alike (ddp's, zero's and
 * fsdp's reduce_dtype; DeepSpeed's communication_data_type, FSDP's
 * MixedPrecision(reduce_dtype)).  The gradients are cast to it before the
 * collective and back to f32 after; the communicator sums 16-bit values
 * in f32 and rounds once.  A designated initializer of dt_config_key_t
 * (dtrain/plugin.h) for a strategy's key table. */
#define DT_CFG_KEY_REDUCE_DTYPE                                                \
    {.name = "reduce_dtype", .type = DT_CFG_ENUM, .def = "\"fp32\"",          \
     .choices = "fp32|bf16|fp16",                                              \
     .doc = "dtype gradients travel in: fp32, or bf16/fp16 (half the bytes, "  \
            "summed in f32, rounded once; fp16 overflows above 65504: use "    \
            "it with model.dtype = \"fp16\", whose loss scaling backs off)"}
/* reduce_dtype as *out = DT_F32, DT_BF16 or DT_F16; another value is
 * DT_ERR_CONFIG "reduce_dtype = \"<v>\" is not one of the valid choices:
 * fp32, bf16, fp16". */
int dt_cfg_reduce_dtype(const dt_host_v1_t *host, int *out);
/* The key's value for a dtype dt_cfg_reduce_dtype gives: "fp32", "bf16",
 * "fp16" (messages, plan notes). */
const char *dt_cfg_reduce_dtype_name(int dtype);

#ifdef __cplusplus
}
#endif
#endif /* DTRAIN_SDK_CFG_H */
