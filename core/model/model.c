/*
 * core/model/model.c - a model as the core holds it, whatever its
 * architecture: [model] config dispatch (common keys here, shape keys the
 * plugin's), create and free, the accessors, the keys a checkpoint
 * records, and the plugin's FLOP and traffic counts.  The rest of the
 * model by concern: model_desc.c (units, tensors, initialisation),
 * model_tensor.c (the tensor-parallel services), model_acts.c (activation
 * memory), model_run.c (hooks, views, the micro-step, pipeline stages,
 * the loss), model_probe.c (finding the first non-finite tensor).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/half.h"
#include "model/model_arch.h"
#include "util/crash.h"
#include "util/error.h"

const char *dt_model_cfg_name(const dt_config_t *cfg)
{
    const char *p = dt_config_path(cfg);
    return p && p[0] ? p : "config";
}

/* The [model] keys the core reads itself, whatever the arch; every other
 * [model] key is an arch's shape key, read by the plugins that declare it
 * (their `create` reads it).  Setting one the selected plugin does not
 * read is refused, so a config never carries a value that silently does
 * nothing. */
static const char *const common_keys[] = {
    "arch", "dtype", "activations", "activation_checkpointing", "checkpoint_every",
};

/* Every [model] key the config sets (file or --set) must be common or
 * read by the plugin during create: checked after create, from the keys
 * it read (dt_model_t.read_keys). */
static int check_arch_keys(const dt_model_t *m, dt_config_t *cfg, const char *arch)
{
    for (uint32_t t = 0; t < dt_core_n_sections; t++) {
        const dt_config_section_t *sec = &dt_core_sections[t];
        if (strcmp(sec->table, "model") != 0)
            continue;
        for (uint32_t i = 0; i < sec->n_keys; i++) {
            const char *key = sec->keys[i].name;
            int known = 0;
            for (size_t j = 0; j < sizeof common_keys / sizeof common_keys[0]; j++)
                known |= strcmp(key, common_keys[j]) == 0;
            for (uint32_t j = 0; j < m->n_read_keys; j++)
                known |= strcmp(key, m->read_keys[j]) == 0;
            char path[96];
            snprintf(path, sizeof path, "model.%s", key);
            dt_origin_t o = dt_config_origin(cfg, path);
            if (!known && (o == DT_ORIGIN_FILE || o == DT_ORIGIN_CLI))
                return dt_err_set(DT_ERR_CONFIG,
                                  "%s: [model] %s is set (%s) but arch = \"%s\" does not read "
                                  "it",
                                  dt_model_cfg_name(cfg), key,
                                  o == DT_ORIGIN_CLI ? "--set" : "in the file", arch);
        }
    }
    return DT_OK;
}

int dt_model_missing_kernel(const dt_model_t *m, const char *kernel)
{
    return dt_err_set(DT_ERR_UNSUPPORTED,
                      "device '%s' has no kernel '%s' (%s activations, %s weights); arch %s "
                      "needs it",
                      m->s.dev_name, kernel, dt_dtype_name(m->s.adtype), dt_dtype_name(m->s.wdtype),
                      m->info.arch);
}

int dt_model_create(dt_config_t *cfg, const dt_device_ops_t *dev, const dt_model_ops_t *arch,
                    dt_model_t **out)
{
    return dt_model_create_part(cfg, dev, arch, 1, 0, out);
}

int dt_model_create_part(dt_config_t *cfg, const dt_device_ops_t *dev,
                         const dt_model_ops_t *a, int32_t tp, int32_t tp_rank,
                         dt_model_t **out)
{
    const char *arch, *dtype, *recompute, *acts;
    int rc;
    if ((rc = dt_config_get_string(cfg, "model.arch", &arch)) ||
        (rc = dt_config_get_string(cfg, "model.dtype", &dtype)) ||
        (rc = dt_config_get_string(cfg, "model.activations", &acts)) ||
        (rc = dt_config_get_string(cfg, "model.activation_checkpointing", &recompute)))
        return rc;
    if (tp < 1 || tp_rank < 0 || tp_rank >= tp)
        return dt_err_set(DT_ERR_INVALID,
                          "model: tensor rank %d is outside the tensor group of %d rank%s",
                          (int)tp_rank, (int)tp, tp == 1 ? "" : "s");
    if (!a || !a->info.name || strcmp(arch, a->info.name) != 0)
        return dt_err_set(DT_ERR_INVALID,
                          "model: [model] arch = \"%s\" but the model plugin given is '%s'",
                          arch, a && a->info.name ? a->info.name : "(none)");
    dt_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    m->arch = a;
    m->s.struct_size = sizeof m->s;
    m->s.svc = &dt_model_services;
    m->s.desc = &m->desc;
    m->s.info = &m->info;
    m->info.struct_size = sizeof m->info;
    m->cfg = cfg;
    m->s.tp = tp;
    m->s.tp_rank = tp_rank;
    m->info.tensor_parallel = tp;
    m->info.tensor_rank = tp_rank;
    m->s.kern = dev->kernels();
    m->s.dev_name = dev->info.name ? dev->info.name : "?";
    m->s.adtype = DT_F32;
    m->desc.struct_size = sizeof m->desc;
    m->desc.arch = a->info.name;
    m->info.arch = a->info.name;
    if (strcmp(dtype, "fp32") == 0) {
        m->s.wdtype = DT_F32;
        m->info.dtype = "fp32";
    } else if (strcmp(dtype, "bf16") == 0) {
        m->s.wdtype = DT_BF16;
        m->info.dtype = "bf16";
    } else if (strcmp(dtype, "fp16") == 0) {
        m->s.wdtype = DT_F16;
        m->info.dtype = "fp16";
    } else {
        rc = dt_err_set(DT_ERR_CONFIG, "%s: [model] dtype = \"%s\": fp32, bf16 or fp16",
                        dt_model_cfg_name(cfg), dtype);
        goto fail;
    }
    m->desc.param_dtype = m->s.wdtype;
    m->info.activations = "fp32";
    if (strcmp(acts, "bf16") == 0) {
        /* matmuls multiply bf16 activations by bf16 weights, or by f32 ones
         * rounded to bf16; f16 weights would need a third format */
        if (m->s.wdtype == DT_F16) {
            rc = dt_err_set(DT_ERR_CONFIG,
                            "%s: [model] activations = \"bf16\" with dtype = \"fp16\": bf16 "
                            "activations take fp32 or bf16 parameters",
                            dt_model_cfg_name(cfg));
            goto fail;
        }
        m->s.adtype = DT_BF16;
        m->info.activations = "bf16";
    }
    /* [model] activation_checkpointing: which units backward recomputes */
    m->recompute_mode = strcmp(recompute, "all") == 0     ? DT_RECOMPUTE_ALL
                        : strcmp(recompute, "every") == 0 ? DT_RECOMPUTE_EVERY
                                                          : DT_RECOMPUTE_NONE;
    if ((rc = dt_config_get_int(cfg, "model.checkpoint_every", &m->recompute_every)) ||
        (rc = a->create(&m->s)) || (rc = check_arch_keys(m, cfg, arch)) ||
        (a->need_kernels && (rc = a->need_kernels(&m->s))))
        goto fail;
    m->cfg = NULL;
    if (m->s.vocab_local == 0) /* the arch holds the whole vocabulary */
        m->s.vocab_local = m->info.vocab_size;
    for (uint32_t u = 0; u < m->desc.n_units; u++) {
        const dt_unit_desc_t *ud = &m->desc.units[u];
        if (!ud->name) {
            rc = dt_err_set(DT_ERR_NOMEM, "model: out of memory");
            goto fail;
        }
        m->desc.numel += ud->numel;
        int64_t shape[4];
        for (uint32_t k = 0; k < ud->n_params; k++)
            m->info.global_numel += dt_model_param_global(&ud->params[k], shape);
        uint64_t v = 0;
        for (uint32_t k = 0; k < ud->n_params; k++)
            if (m->extra[u][k].kind != DT_TENSOR_MATRIX)
                v += ud->params[k].numel;
        if (v > m->view_numel)
            m->view_numel = v;
    }
    *out = m;
    return DT_OK;
fail:
    dt_model_free(m, NULL);
    return rc;
}

void dt_model_free(dt_model_t *m, const dt_model_ctx_t *ctx)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_allocs; i++)
        if (ctx)
            dt_device_ops(ctx->dev)->free(ctx->dev, m->allocs[i]);
    free(m->allocs);
    free(m->act_got);
    free(m->slot_tokens);
    free(m->slot_targets);
    free(m->host_losses);
    free(m->seq_open);
    free(m->seq_grads);
    if (m->arch->free)
        m->arch->free(&m->s);
    for (uint32_t i = 0; m->desc.units && i < m->desc.n_units; i++) {
        dt_unit_desc_t *u = &m->desc.units[i];
        for (uint32_t k = 0; k < u->n_params; k++)
            free((char *)u->params[k].name);
        free(u->params);
        free((char *)u->name);
        if (m->extra)
            free(m->extra[i]);
    }
    free(m->extra);
    free(m->desc.units);
    free(m);
}

dt_model_desc_t *dt_model_desc(dt_model_t *m) { return &m->desc; }
const dt_model_info_t *dt_model_info(const dt_model_t *m) { return &m->info; }
const void *dt_model_logits(const dt_model_t *m) { return m->s.logits; }
const dt_model_ops_t *dt_model_ops(const dt_model_t *m) { return m->arch; }

const char *dt_model_key_table(const char *arch, const char *key)
{
    for (uint32_t i = 0; i < dt_core_n_sections; i++)
        if (strcmp(dt_core_sections[i].table, "model") == 0)
            for (uint32_t k = 0; k < dt_core_sections[i].n_keys; k++)
                if (strcmp(dt_core_sections[i].keys[k].name, key) == 0)
                    return "model";
    return arch;
}
dt_model_state_t *dt_model_state(dt_model_t *m) { return &m->s; }

int dt_model_act_dtype(const dt_model_t *m) { return m->s.adtype; }

void dt_model_tp_comm(const dt_model_t *m, int64_t B, int64_t T, dt_model_tp_comm_t *out)
{
    memset(out, 0, sizeof *out);
    if (m->s.tp > 1 && m->arch->tp_comm)
        m->arch->tp_comm(&m->s, B, T, out);
}

void dt_model_unit_flops(const dt_model_t *m, int64_t T, double *out)
{
    if (m->arch->unit_flops) {
        m->arch->unit_flops(&m->s, T, out);
        return;
    }
    const double all = dt_model_flops_per_token(m, T);
    for (uint32_t u = 0; u < m->desc.n_units; u++)
        out[u] = m->desc.numel ? all * (double)m->desc.units[u].numel / (double)m->desc.numel
                               : 0.0;
}

double dt_model_flops_per_token(const dt_model_t *m, int64_t T)
{
    return m->arch->flops_per_token(&m->s, T);
}

void dt_model_add_key(dt_model_t *m, const dt_model_key_t *k)
{
    if (m->info.n_keys < DT_MODEL_MAX_KEYS)
        m->info.keys[m->info.n_keys++] = *k;
}
