/*
 * tests/unit/core/model/test_model_acts.c - activation memory of the models
 * (dt_model_act_bytes, dt_model_plan_acts, core/model/model.h): the plan
 * the planner reads must be what dt_model_alloc_acts allocates.
 *
 * For gpt2 and mlp, over micro-batch shapes, activation_checkpointing
 * none / all / every 2, dtype fp32 / bf16 and activations fp32 / bf16
 * (the cpu device runs both):
 *   - the planned total equals, to the byte, what the cpu device reports
 *     as current DT_TAG_ACTIVATIONS after dt_model_alloc_acts (nothing
 *     else allocates that tag), and each unit's desc act_bytes equals the
 *     plan's per-unit bytes;
 *   - the plan equals a formula written out here from the tensors each
 *     arch keeps (GPT-2 block: 15 (B,T,C) tensors in the activation
 *     dtype, 4 (B,T) f32 norm statistics, the (B,NH,T,T) f32 attention
 *     probabilities), so
 *     checkpointing every block removes L - 1 blocks' worth exactly (one
 *     block's worth comes back as the shared recompute buffer).
 * Presets (gpt2-124m, gpt2-1558m) are planned from the description and
 * the cpu plugin's kernel table alone, with no device instance, and their
 * numbers printed.  A device without a kernel GPT-2 needs is refused when
 * the model is created, naming the kernel.
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

/* A small GPT-2 and MLP; sizes chosen unequal so a swapped term shows. */
enum { GL = 3, GNH = 2, GC = 16, GV = 40, GCTX = 16 };
enum { MV = 30, MD = 8, MH = 12, ML = 3 };

static void gpt2_toml_acts(char *out, size_t cap, const char *dtype, const char *ckpt,
                           const char *acts)
{
    snprintf(out, cap,
             "[model]\narch = \"gpt2\"\nn_layer = %d\nn_head = %d\nn_embd = %d\n"
             "vocab_size = %d\ncontext = %d\ndtype = \"%s\"\n"
             "activation_checkpointing = \"%s\"\ncheckpoint_every = 2\n"
             "activations = \"%s\"\n",
             GL, GNH, GC, GV, GCTX, dtype, ckpt, acts);
}

static void gpt2_toml(char *out, size_t cap, const char *dtype, const char *ckpt)
{
    gpt2_toml_acts(out, cap, dtype, ckpt, "fp32");
}

static void mlp_toml_acts(char *out, size_t cap, const char *dtype, const char *ckpt,
                          const char *acts)
{
    snprintf(out, cap,
             "[model]\narch = \"mlp\"\nvocab_size = %d\nmlp_in = %d\nmlp_hidden = %d\n"
             "mlp_layers = %d\ndtype = \"%s\"\nactivation_checkpointing = \"%s\"\n"
             "checkpoint_every = 2\nactivations = \"%s\"\n",
             MV, MD, MH, ML, dtype, ckpt, acts);
}

static void mlp_toml(char *out, size_t cap, const char *dtype, const char *ckpt)
{
    mlp_toml_acts(out, cap, dtype, ckpt, "fp32");
}

/* The cpu plugin's runtime table (never dlclosed). */
static const dt_device_ops_t *cpu_ops(void)
{
    static const dt_device_ops_t *ops;
    if (!ops && !(ops = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_cpu.so",
                                             DT_ENTRY_STRING(device, 1), NULL)))
        fail_msg("%s", dt_last_error());
    return ops;
}

/* The model plugin the config names (never dlclosed). */
static const dt_model_ops_t *arch_ops(const dt_config_t *cfg)
{
    const dt_model_ops_t *ops = dt_mh_model_ops(DT_TEST_PLUGIN_DIR, cfg);
    if (!ops)
        fail_msg("%s", dt_last_error());
    return ops;
}

/* The config of TOML text with the [model] schema applied. */
static dt_config_t *model_config(const char *toml)
{
    dt_config_t *cfg = NULL;
    assert_ok(dt_config_load_string("model.toml", toml, &cfg));
    for (uint32_t i = 0; i < dt_core_n_sections; i++)
        if (strcmp(dt_core_sections[i].table, "model") == 0)
            assert_ok(dt_config_apply_schema(cfg, "model", dt_core_sections[i].keys,
                                             dt_core_sections[i].n_keys));
    return cfg;
}

/* A model from TOML text, described only: the cpu plugin's kernel table,
 * no device instance, nothing allocated. */
static dt_model_t *describe(const char *toml, dt_config_t **cfg)
{
    *cfg = model_config(toml);
    dt_model_t *m = NULL;
    assert_ok(dt_model_create(*cfg, cpu_ops(), arch_ops(*cfg), &m));
    return m;
}

/* ---- the formulas, written out from the tensors each arch keeps ---- */

static int is_ckpt(const char *ckpt, int l)
{
    return strcmp(ckpt, "all") == 0 || (strcmp(ckpt, "every") == 0 && l % 2 == 0);
}

/* A block's kept bytes with activations of `es` bytes: 15 (B,T,C)
 * activations, 4 (B,T) f32 norm statistics, the f32 probabilities. */
static uint64_t gpt2_block_es(uint64_t B, uint64_t T, uint64_t es)
{
    return es * 15 * B * T * GC + 4 * (4 * B * T + B * GNH * T * T);
}

static uint64_t gpt2_block(uint64_t B, uint64_t T) { return gpt2_block_es(B, T, 4); }

/* Bytes of an element of a [model] dtype or activations value. */
static uint64_t esize(const char *dt) { return strcmp(dt, "fp32") == 0 ? 4 : 2; }

/* Per-unit kept bytes and the workspace of the small GPT-2: tokens,
 * targets, norm statistics and losses i32 / f32, the rest in the
 * activation dtype. */
static void gpt2_expect(uint64_t B, uint64_t T, const char *dtype, const char *ckpt,
                        const char *acts, uint64_t *unit, uint64_t *ws)
{
    const uint64_t BT = B * T, es = esize(acts);
    int any = 0;
    unit[0] = 4 * BT + es * BT * GC; /* tokens, x[0] */
    for (int l = 0; l < GL; l++) {
        unit[l + 1] = es * BT * GC + (is_ckpt(ckpt, l) ? 0 : gpt2_block_es(B, T, es));
        any |= is_ckpt(ckpt, l);
    }
    /* targets, ln_f, its mean and rstd, probs */
    unit[GL + 1] = 4 * BT + es * BT * GC + 4 * 2 * BT + es * BT * GV;
    /* recompute block, attproj + fcproj, logits, losses, dx dbuf_c dbuf_c2
     * dqkv dfch dfch_gelu (14 C), dlogits, and the view when the parameter
     * and activation dtypes differ (wte + wpe in the activation dtype) */
    *ws = (any ? gpt2_block_es(B, T, es) : 0) + es * (2 * BT * GC + BT * GV) + 4 * BT +
          es * (14 * BT * GC + BT * GV) +
          (strcmp(dtype, acts) != 0 ? es * (uint64_t)(GV + GCTX) * GC : 0);
}

static void mlp_expect(uint64_t B, uint64_t T, const char *dtype, const char *ckpt,
                       const char *acts, uint64_t *unit, uint64_t *ws)
{
    const uint64_t BT = B * T, es = esize(acts);
    int any = 0;
    unit[0] = 4 * BT + es * BT * MD; /* tokens, x0 */
    for (int l = 0; l < ML; l++) {
        unit[l + 1] = es * BT * MH * (is_ckpt(ckpt, l) ? 1 : 2); /* out, pre */
        any |= is_ckpt(ckpt, l);
    }
    unit[ML + 1] = 4 * BT + es * BT * MV; /* targets, probs */
    /* recompute pre, zeros (T, D), da db (max(D, H) = H), dpre, dlogits,
     * logits, losses (f32); the view, when the parameter and activation
     * dtypes differ, holds the largest unit's tensors read in the
     * activation dtype: embed.weight (V D) */
    *ws = es * ((any ? BT * MH : 0) + T * MD + 2 * BT * MH + BT * MH + 2 * BT * MV) + 4 * BT +
          (strcmp(dtype, acts) != 0 ? es * (uint64_t)MV * MD : 0);
}

/* ---- planned == allocated, planned == formula ---- */

typedef struct combo {
    int64_t B, T;
    const char *dtype, *ckpt, *acts;
} combo_t;

static const combo_t combos[] = {
    {2, 8, "fp32", "none", "fp32"}, {2, 8, "fp32", "all", "fp32"},
    {3, 5, "fp32", "every", "fp32"}, {1, 16, "fp32", "all", "fp32"},
    {4, 3, "bf16", "none", "fp32"}, {2, 7, "bf16", "every", "fp32"},
    {2, 8, "fp32", "none", "bf16"}, {3, 5, "fp32", "every", "bf16"},
    {2, 7, "bf16", "all", "bf16"},
};

static void check_arch(int gpt2)
{
    for (size_t c = 0; c < sizeof combos / sizeof combos[0]; c++) {
        const combo_t *k = &combos[c];
        char toml[512];
        if (gpt2)
            gpt2_toml_acts(toml, sizeof toml, k->dtype, k->ckpt, k->acts);
        else
            mlp_toml_acts(toml, sizeof toml, k->dtype, k->ckpt, k->acts);
        const uint32_t n = gpt2 ? GL + 2 : ML + 2;
        uint64_t want[8], want_ws;
        if (gpt2)
            gpt2_expect((uint64_t)k->B, (uint64_t)k->T, k->dtype, k->ckpt, k->acts, want,
                        &want_ws);
        else
            mlp_expect((uint64_t)k->B, (uint64_t)k->T, k->dtype, k->ckpt, k->acts, want,
                       &want_ws);
        uint64_t want_kept = 0;
        for (uint32_t u = 0; u < n; u++)
            want_kept += want[u];

        /* planned, from the description alone */
        dt_config_t *cfg = NULL;
        dt_model_t *m = describe(toml, &cfg);
        assert_int_equal(dt_model_desc(m)->n_units, n);
        uint64_t unit[8];
        dt_model_act_t plan;
        assert_ok(dt_model_act_bytes(m, k->B, k->T, unit, &plan));
        for (uint32_t u = 0; u < n; u++)
            if (unit[u] != want[u])
                fail_msg("%s %lldx%lld %s %s activations %s: unit %s plans %llu bytes, the "
                         "formula %llu",
                         gpt2 ? "gpt2" : "mlp", (long long)k->B, (long long)k->T, k->dtype,
                         k->ckpt, k->acts, dt_model_desc(m)->units[u].name,
                         (unsigned long long)unit[u], (unsigned long long)want[u]);
        assert_int_equal(plan.kept, want_kept);
        assert_int_equal(plan.workspace, want_ws);
        assert_int_equal(plan.total, want_kept + want_ws);
        /* without unit_bytes, the same sums */
        dt_model_act_t plan2;
        assert_ok(dt_model_act_bytes(m, k->B, k->T, NULL, &plan2));
        assert_memory_equal(&plan, &plan2, sizeof plan);
        dt_model_free(m, NULL);
        dt_config_free(cfg);

        /* allocated, as the cpu device counts it */
        dt_mh_t h;
        if (dt_mh_open(&h, toml, k->B, k->T, 5) != DT_OK)
            fail_msg("opening %s: %s", toml, dt_last_error());
        dt_mem_stats_t ms = {.struct_size = sizeof(dt_mem_stats_t)};
        assert_ok(h.D->mem_stats(h.dev, &ms));
        printf("%s B=%lld T=%lld %s %-5s acts %s: kept %llu + workspace %llu = %llu bytes; "
               "device activations %llu\n",
               gpt2 ? "gpt2" : "mlp ", (long long)k->B, (long long)k->T, k->dtype, k->ckpt,
               k->acts,
               (unsigned long long)plan.kept, (unsigned long long)plan.workspace,
               (unsigned long long)plan.total,
               (unsigned long long)ms.current[DT_TAG_ACTIVATIONS]);
        assert_int_equal(ms.current[DT_TAG_ACTIVATIONS], plan.total);
        for (uint32_t u = 0; u < n; u++)
            assert_int_equal(h.desc->units[u].act_bytes, want[u]);
        dt_mh_close(&h);
    }
}

static void test_gpt2_planned_is_allocated(void **state)
{
    (void)state;
    check_arch(1);
}

static void test_mlp_planned_is_allocated(void **state)
{
    (void)state;
    check_arch(0);
}

/* Checkpointing every block keeps each block's output only: L - 1 blocks
 * less in total (the recompute buffer is one block), for any B, T. */
static void test_gpt2_checkpointing_saves_blocks(void **state)
{
    (void)state;
    char t_none[512], t_all[512];
    gpt2_toml(t_none, sizeof t_none, "fp32", "none");
    gpt2_toml(t_all, sizeof t_all, "fp32", "all");
    dt_config_t *c1 = NULL, *c2 = NULL;
    dt_model_t *none = describe(t_none, &c1), *all = describe(t_all, &c2);
    for (int64_t B = 1; B <= 4; B++)
        for (int64_t T = 1; T <= GCTX; T += 5) {
            dt_model_act_t a, b;
            assert_ok(dt_model_act_bytes(none, B, T, NULL, &a));
            assert_ok(dt_model_act_bytes(all, B, T, NULL, &b));
            assert_int_equal(a.total - b.total, (GL - 1) * gpt2_block((uint64_t)B, (uint64_t)T));
            assert_int_equal(a.kept - b.kept, GL * gpt2_block((uint64_t)B, (uint64_t)T));
        }
    dt_model_free(none, NULL);
    dt_model_free(all, NULL);
    dt_config_free(c1);
    dt_config_free(c2);
}

/* The planner's case: a preset planned from the description alone (no
 * device instance: nothing can be allocated), set into the desc. */
static void check_preset(const char *preset, int64_t L, int64_t NH, int64_t C)
{
    const uint64_t V = 50257, B = 8, T = 1024, BT = B * T;
    const uint64_t block = 4 * (15 * BT * C + 4 * BT + B * NH * T * T);
    const char *modes[] = {"none", "all"};
    uint64_t totals[2];
    for (int i = 0; i < 2; i++) {
        char toml[256];
        snprintf(toml, sizeof toml,
                 "[model]\narch = \"gpt2\"\npreset = \"%s\"\nactivation_checkpointing = "
                 "\"%s\"\n",
                 preset, modes[i]);
        dt_config_t *cfg = NULL;
        dt_model_t *m = describe(toml, &cfg);
        dt_model_act_t a;
        assert_ok(dt_model_plan_acts(m, (int64_t)B, (int64_t)T, &a));
        const dt_model_desc_v1_t *d = dt_model_desc(m);
        assert_int_equal(d->n_units, (uint32_t)L + 2);
        uint64_t sum = 0;
        for (uint32_t u = 0; u < d->n_units; u++)
            sum += d->units[u].act_bytes;
        assert_int_equal(sum, a.kept);
        /* a block keeps its output, plus its intermediates unless
         * checkpointed */
        assert_int_equal(d->units[1].act_bytes, 4 * BT * C + (i ? 0 : block));
        assert_int_equal(d->units[L + 1].act_bytes, 4 * (BT + BT * C + 2 * BT + BT * V));
        printf("%s B=%llu T=%llu %-4s: kept %.3f GiB + workspace %.3f GiB = %.3f GiB "
               "(block %.1f MiB)\n",
               preset, (unsigned long long)B, (unsigned long long)T, modes[i],
               (double)a.kept / 1073741824.0, (double)a.workspace / 1073741824.0,
               (double)a.total / 1073741824.0, (double)d->units[1].act_bytes / 1048576.0);
        totals[i] = a.total;
        dt_model_free(m, NULL);
        dt_config_free(cfg);
    }
    assert_int_equal(totals[0] - totals[1], (uint64_t)(L - 1) * block);
}

static void test_presets_planned_without_a_device(void **state)
{
    (void)state;
    check_preset("gpt2-124m", 12, 12, 768);
    check_preset("gpt2-1558m", 48, 25, 1600);
}

/* The cpu's kernel table without one kernel GPT-2 needs: `missing` is
 * the offset of the slot cleared. */
static size_t g_missing;
static dt_kernels_v1_t g_lacking;
static const dt_kernels_v1_t *lacking_kernels(void)
{
    g_lacking = *cpu_ops()->kernels();
    memset((char *)&g_lacking + g_missing, 0, sizeof(void (*)(void)));
    return &g_lacking;
}

/* A device without an optional kernel the arch calls is refused when the
 * model is created, naming the device, the kernel and the dtypes; the MLP,
 * which needs the core set only, is not. */
static void test_device_lacking_a_kernel(void **state)
{
    (void)state;
    dt_device_ops_t dev = *cpu_ops();
    dev.info.name = "lacking";
    dev.kernels = lacking_kernels;
    static const struct {
        size_t offset;
        const char *name;
    } need[] = {
        {offsetof(dt_kernels_v1_t, layernorm_forward), "layernorm_forward"},
        {offsetof(dt_kernels_v1_t, layernorm_backward), "layernorm_backward"},
        {offsetof(dt_kernels_v1_t, attention_state_bytes), "attention_state_bytes"},
        {offsetof(dt_kernels_v1_t, attention_forward), "attention_forward"},
        {offsetof(dt_kernels_v1_t, attention_backward), "attention_backward"},
        {offsetof(dt_kernels_v1_t, residual_forward), "residual_forward"},
    };
    char toml[512], want[256];
    for (int bf16 = 0; bf16 < 2; bf16++) {
        gpt2_toml(toml, sizeof toml, bf16 ? "bf16" : "fp32", "none");
        for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
            g_missing = need[i].offset;
            dt_config_t *cfg = model_config(toml);
            dt_model_t *m = NULL;
            assert_status(dt_model_create(cfg, &dev, arch_ops(cfg), &m), DT_ERR_UNSUPPORTED);
            assert_null(m);
            snprintf(want, sizeof want,
                     "device 'lacking' has no kernel '%s' (f32 activations, %s weights); "
                     "arch gpt2 needs it",
                     need[i].name, bf16 ? "bf16" : "f32");
            assert_msg(want);
            dt_config_free(cfg);
        }
    }
    /* the MLP runs on the core set */
    g_missing = offsetof(dt_kernels_v1_t, attention_forward);
    mlp_toml(toml, sizeof toml, "fp32", "none");
    dt_config_t *cfg = model_config(toml);
    dt_model_t *m = NULL;
    assert_ok(dt_model_create(cfg, &dev, arch_ops(cfg), &m));
    dt_model_free(m, NULL);
    dt_config_free(cfg);
}

/* A flash-attention backend keeps the (B, NH, T) f32 log-sum-exp, not the
 * probabilities: the plan follows the device's attention_state_bytes (the
 * query alloc_acts sizes the buffer with), so only the state term of each
 * block changes.  Planned only: the cpu kernels behind it keep
 * probabilities and would not fit. */
static int lse_state_bytes(int64_t B, int64_t T, int64_t C, int64_t NH, int dtype,
                           uint64_t *out)
{
    if (dtype != DT_F32)
        return DT_ERR_UNSUPPORTED;
    *out = (uint64_t)(B * NH * T) * 4;
    return DT_OK;
}
static dt_kernels_v1_t g_flash;
static const dt_kernels_v1_t *flash_kernels(void)
{
    g_flash = *cpu_ops()->kernels();
    g_flash.attention_state_bytes = lse_state_bytes;
    return &g_flash;
}

static void test_attention_state_is_the_devices(void **state)
{
    (void)state;
    dt_device_ops_t dev = *cpu_ops();
    dev.info.name = "flash";
    dev.kernels = flash_kernels;
    char toml[512];
    gpt2_toml(toml, sizeof toml, "fp32", "none");
    dt_config_t *cfg = model_config(toml), *cfg2 = NULL;
    dt_model_t *flash = NULL, *cpu = describe(toml, &cfg2);
    assert_ok(dt_model_create(cfg, &dev, arch_ops(cfg), &flash));
    const uint64_t B = 3, T = 11;
    uint64_t uf[GL + 2], uc[GL + 2];
    dt_model_act_t af, ac;
    assert_ok(dt_model_act_bytes(flash, (int64_t)B, (int64_t)T, uf, &af));
    assert_ok(dt_model_act_bytes(cpu, (int64_t)B, (int64_t)T, uc, &ac));
    const uint64_t probs = 4 * B * GNH * T * T, lse = 4 * B * GNH * T;
    for (int l = 0; l < GL; l++) {
        assert_int_equal(uc[l + 1], 4 * B * T * GC + gpt2_block(B, T));
        assert_int_equal(uf[l + 1], uc[l + 1] - probs + lse);
    }
    assert_int_equal(uf[0], uc[0]);
    assert_int_equal(uf[GL + 1], uc[GL + 1]);
    assert_int_equal(af.workspace, ac.workspace);
    assert_int_equal(ac.total - af.total, GL * (probs - lse));
    dt_model_free(flash, NULL);
    dt_model_free(cpu, NULL);
    dt_config_free(cfg);
    dt_config_free(cfg2);
}

/* A device refusing the state query (here: the dtype) fails the plan
 * with the query named. */
static int refusing_state_bytes(int64_t B, int64_t T, int64_t C, int64_t NH, int dtype,
                                uint64_t *out)
{
    return DT_ERR_UNSUPPORTED;
}
static dt_kernels_v1_t g_refusing;
static const dt_kernels_v1_t *refusing_kernels(void)
{
    g_refusing = *cpu_ops()->kernels();
    g_refusing.attention_state_bytes = refusing_state_bytes;
    return &g_refusing;
}

static void test_attention_state_refused(void **state)
{
    (void)state;
    dt_device_ops_t dev = *cpu_ops();
    dev.info.name = "picky";
    dev.kernels = refusing_kernels;
    char toml[512];
    gpt2_toml(toml, sizeof toml, "fp32", "none");
    dt_config_t *cfg = model_config(toml);
    dt_model_t *m = NULL;
    assert_ok(dt_model_create(cfg, &dev, arch_ops(cfg), &m));
    dt_model_act_t a;
    assert_status(dt_model_act_bytes(m, 2, 8, NULL, &a), DT_ERR_UNSUPPORTED);
    assert_msg("model: device 'picky' refused attention_state_bytes for B 2, T 8, C 16, NH 2, "
               "f32 activations (DT_ERR_UNSUPPORTED)");
    dt_model_free(m, NULL);
    dt_config_free(cfg);
}

/* A device that refuses bf16 activations (the cpu and cuda run them; a
 * third party's may not) fails dt_model_alloc_acts with a config error
 * naming the key and the device's own refusal, asked with a zero-length
 * residual_forward before anything is planned or allocated. */
static int f32_only_residual(dt_device_t *d, dt_stream_t *s, void *out, const void *a,
                             const void *b, int dtype, int64_t n)
{
    if (dtype != DT_F32)
        return dt_err_set(DT_ERR_UNSUPPORTED,
                          "residual_forward: %s activations: unsupported (f32 only)",
                          dt_dtype_name(dtype));
    return DT_OK;
}
static dt_kernels_v1_t g_f32_only;
static const dt_kernels_v1_t *f32_only_kernels(void)
{
    g_f32_only = *cpu_ops()->kernels();
    g_f32_only.residual_forward = f32_only_residual;
    return &g_f32_only;
}

static void test_bf16_refused_by_device(void **state)
{
    (void)state;
    dt_device_ops_t dev = *cpu_ops();
    dev.info.name = "f32only";
    dev.kernels = f32_only_kernels;
    char toml[512];
    gpt2_toml_acts(toml, sizeof toml, "fp32", "none", "bf16");
    dt_config_t *cfg = model_config(toml);
    dt_model_t *m = NULL;
    assert_ok(dt_model_create(cfg, &dev, arch_ops(cfg), &m));
    struct {
        const dt_device_ops_t *ops; /* a device starts with its table */
    } fake = {&dev};
    const dt_model_ctx_t ctx = {.dev = (dt_device_t *)&fake};
    assert_status(dt_model_alloc_acts(m, &ctx, 2, 8), DT_ERR_CONFIG);
    assert_msg("[model] activations = \"bf16\": device 'f32only' does not run them "
               "(residual_forward: bf16 activations: unsupported (f32 only))");
    dt_model_free(m, NULL);
    dt_config_free(cfg);
}

static void test_bad_shapes(void **state)
{
    (void)state;
    char toml[512];
    gpt2_toml(toml, sizeof toml, "fp32", "none");
    dt_config_t *cfg = NULL;
    dt_model_t *m = describe(toml, &cfg);
    dt_model_act_t a;
    assert_status(dt_model_act_bytes(m, 0, 8, NULL, &a), DT_ERR_INVALID);
    assert_msg("model: micro-batch 0 x 8 tokens");
    assert_status(dt_model_act_bytes(m, 2, GCTX + 1, NULL, &a), DT_ERR_INVALID);
    assert_msg("model: sequences of 17 tokens exceed the context of 16");
    dt_model_free(m, NULL);
    dt_config_free(cfg);

    /* the mlp takes any length, but not more bytes than doubles count */
    mlp_toml(toml, sizeof toml, "fp32", "none");
    m = describe(toml, &cfg);
    assert_status(dt_model_act_bytes(m, (int64_t)1 << 40, (int64_t)1 << 20, NULL, &a),
                  DT_ERR_INVALID);
    assert_msg_starts("model: activations of a 1099511627776 x 1048576 micro-batch would take ");
    assert_msg_has(" bytes, beyond any device");
    dt_model_free(m, NULL);
    dt_config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_planned_is_allocated),
        cmocka_unit_test(test_mlp_planned_is_allocated),
        cmocka_unit_test(test_gpt2_checkpointing_saves_blocks),
        cmocka_unit_test(test_presets_planned_without_a_device),
        cmocka_unit_test(test_device_lacking_a_kernel),
        cmocka_unit_test(test_attention_state_is_the_devices),
        cmocka_unit_test(test_attention_state_refused),
        cmocka_unit_test(test_bf16_refused_by_device),
        cmocka_unit_test(test_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
