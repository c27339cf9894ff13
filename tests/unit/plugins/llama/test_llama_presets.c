/*
 * tests/unit/plugins/llama/test_llama_presets.c - every llama preset described (the
 * planner's path: the cpu plugin's kernel table, no device instance,
 * nothing allocated) has the real model's parameter count, to the
 * parameter: transformers' LlamaForCausalLM built from each Hugging Face
 * config.json on the meta device counts (sum of numel over parameters,
 * transformers 5.24, a tied lm_head counted once)
 *   SmolLM-135M 134,515,008   SmolLM-360M 361,821,120
 *   TinyLlama-1.1B 1,100,048,384   Llama-3.2-1B 1,235,814,400
 *   Llama-3.2-3B 3,212,749,824   Llama-2-7b 6,738,415,616
 * and llama-tiny (L 2, C 128, 4 heads of 32, 2 kv heads, I 256, V 256,
 * untied) 361,088.  `dtrain plan --model` prints these counts (rounded to
 * 0.01M; integration.llama checks three of them there).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "dtrain/dtrain.h"
#include "model/model.h"
#include "model_harness.h"
#include "test_assert.h"
#include "test_plugin.h"
#include "util/error.h"

/* The cpu plugin's runtime table (never dlclosed). */
static const dt_device_ops_t *cpu_ops(void)
{
    static const dt_device_ops_t *ops;
    if (!ops && !(ops = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_cpu.so",
                                             DT_ENTRY_STRING(device, 1), NULL)))
        fail_msg("%s", dt_last_error());
    return ops;
}

static void test_preset_parameter_counts(void **state)
{
    (void)state;
    static const struct {
        const char *preset;
        uint64_t params;
        uint32_t layers;
        int tied;
    } want[] = {
        {"llama-tiny", 361088ULL, 2, 0},          {"smollm-135m", 134515008ULL, 30, 1},
        {"smollm-360m", 361821120ULL, 32, 1},     {"tinyllama-1.1b", 1100048384ULL, 22, 0},
        {"llama-3.2-1b", 1235814400ULL, 16, 1},   {"llama-3.2-3b", 3212749824ULL, 28, 1},
        {"llama-2-7b", 6738415616ULL, 32, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char toml[128];
        snprintf(toml, sizeof toml, "[model]\narch = \"llama\"\npreset = \"%s\"\n",
                 want[i].preset);
        dt_config_t *cfg = NULL;
        assert_ok(dt_config_load_string("model.toml", toml, &cfg));
        for (uint32_t s = 0; s < dt_core_n_sections; s++)
            if (strcmp(dt_core_sections[s].table, "model") == 0)
                assert_ok(dt_config_apply_schema(cfg, "model", dt_core_sections[s].keys,
                                                 dt_core_sections[s].n_keys));
        const dt_model_ops_t *ops = dt_mh_model_ops(DT_TEST_PLUGIN_DIR, cfg);
        if (!ops)
            fail_msg("%s", dt_last_error());
        dt_model_t *m = NULL;
        if (dt_model_create(cfg, cpu_ops(), ops, &m) != DT_OK)
            fail_msg("preset %s: %s", want[i].preset, dt_last_error());
        const dt_model_desc_v1_t *d = dt_model_desc(m);
        printf("%-15s %13llu parameters (%u units)\n", want[i].preset,
               (unsigned long long)d->numel, d->n_units);
        if (d->numel != want[i].params)
            fail_msg("preset %s: %llu parameters, the real model has %llu", want[i].preset,
                     (unsigned long long)d->numel, (unsigned long long)want[i].params);
        assert_int_equal(d->n_units, want[i].layers + 2);
        assert_int_equal(dt_model_info(m)->tied_embedding, want[i].tied);
        dt_model_free(m, NULL);
        dt_config_free(cfg);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preset_parameter_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
