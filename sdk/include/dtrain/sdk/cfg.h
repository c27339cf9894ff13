/*
 * dtrain/sdk/cfg.h - reading a plugin's configuration values through
 * host->cfg_* (its declared keys), with one rule for every plugin: a key
 * the host does not know (DT_ERR_NOT_FOUND) takes `def`; any other failure
 * is DT_ERR_CONFIG "<key>: cannot read (<status>)".
 *
 * Stable: part of the dtrain 1.0 SDK; it grows only by dtrain/abi.h's rules.
 *
 * Part of the SDK helper library (dtrain/sdk_helpers.h says how to link
 * it and the conventions every helper follows).
 */
#ifndef DTRAIN_SDK_CFG_H
#define DTRAIN_SDK_CFG_H

#include <stdint.h>

#include "dtrain/host.h"

#ifdef __cplusplus
extern "C" {
#endif

/* *out = the integer; DT_ERR_CONFIG "<key> = <v>: must be >= <min>" below. */
int dt_cfg_int(const dt_host_v1_t *host, const char *key, int64_t def, int64_t min,
               int64_t *out);
/* *out = 0 or 1. */
int dt_cfg_bool(const dt_host_v1_t *host, const char *key, int def, int *out);
int dt_cfg_float(const dt_host_v1_t *host, const char *key, double def, double *out);
/* *out: the core's string (valid until finalize), or `def`. */
int dt_cfg_string(const dt_host_v1_t *host, const char *key, const char *def,
                  const char **out);
/* *out = the string's index in `choices` ("A|B|C"); another value is
 * DT_ERR_CONFIG "<key> = \"<v>\" is not one of the valid choices: A, B, C". */
int dt_cfg_enum(const dt_host_v1_t *host, const char *key, const char *def,
                const char *choices, int *out);

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
