/*
 * core/model/model.c - the part of every model that does not depend on its
 * architecture: [model] config dispatch, the unit/tensor description
 * builder, deterministic initialisation, device allocations, strategy hook
 * calls, the f32 views of bf16 parameters, and the micro-step around an
 * arch's forward and backward (token checks, copies, the mean loss).
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

/* ---- describing ---- */

int dt_model_alloc_units(dt_model_t *m, uint32_t n)
{
    m->desc.units = calloc(n, sizeof *m->desc.units);
    m->extra = calloc(n, sizeof *m->extra);
    if (!m->desc.units || !m->extra)
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    m->desc.n_units = n;
    m->n_chunks = 1;
    m->chunk_first[0] = 0;
    m->chunk_end[0] = n;
    m->s.n_slots = 1;
    for (uint32_t i = 0; i < n; i++) {
        dt_unit_desc_t *u = &m->desc.units[i];
        u->index = i;
        u->params = calloc(DT_MODEL_MAX_PARAMS, sizeof *u->params);
        m->extra[i] = calloc(DT_MODEL_MAX_PARAMS, sizeof *m->extra[i]);
        if (!u->params || !m->extra[i])
            return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    }
    return DT_OK;
}

int dt_model_name_unit(dt_model_t *m, uint32_t unit, const char *name)
{
    if (!(m->desc.units[unit].name = strdup(name)))
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    return DT_OK;
}

int dt_model_add_param(dt_model_t *m, uint32_t unit, const char *name, int ndim, int64_t d0,
                       int64_t d1, int kind, double std)
{
    dt_unit_desc_t *u = &m->desc.units[unit];
    if (u->n_params == DT_MODEL_MAX_PARAMS) /* a programming error in an arch */
        return dt_err_set(DT_ERR_INVALID, "model: unit %u has more than %d tensors", unit,
                          DT_MODEL_MAX_PARAMS);
    uint32_t k = u->n_params;
    dt_param_desc_t *p = &u->params[k];
    memset(p, 0, sizeof *p);
    if (!(p->name = strdup(name)))
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    u->n_params++;
    p->offset = u->numel;
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim > 1 ? d1 : 0;
    p->numel = (uint64_t)d0 * (uint64_t)(ndim > 1 ? d1 : 1);
    p->flags = kind == DT_TENSOR_BIAS || kind == DT_TENSOR_NORM ? DT_PARAM_NO_DECAY : 0u;
    dt_tensor_extra_t *e = &m->extra[unit][k];
    e->kind = kind;
    e->std = std;
    /* f32-read tensors sit compactly in the view, in unit order */
    e->view_off = 0;
    for (uint32_t j = 0; j < k; j++)
        if (m->extra[unit][j].kind != DT_TENSOR_MATRIX)
            e->view_off += u->params[j].numel;
    u->numel += p->numel;
    return DT_OK;
}

int dt_model_part(dt_model_t *m, uint32_t unit, int64_t g0, int64_t g1, uint32_t n_blocks,
                  const dt_param_block_t *blocks)
{
    if (m->s.tp == 1)
        return DT_OK;
    dt_unit_desc_t *u = &m->desc.units[unit];
    const uint32_t k = u->n_params - 1;
    dt_param_desc_t *p = &u->params[k];
    dt_param_split_t *sp = &m->extra[unit][k].split;
    if (n_blocks > DT_PARAM_MAX_BLOCKS) /* a programming error in an arch */
        return dt_err_set(DT_ERR_INVALID, "model: %s in %u blocks; at most %d", p->name,
                          n_blocks, DT_PARAM_MAX_BLOCKS);
    memset(sp, 0, sizeof *sp);
    sp->struct_size = sizeof *sp;
    sp->global_shape[0] = g0;
    sp->global_shape[1] = p->ndim > 1 ? g1 : 0;
    sp->group_size = m->s.tp;
    if (n_blocks == 0) { /* whole on every rank */
        sp->n_blocks = 1;
        sp->copies = m->s.tp;
        sp->flags = m->s.tp_rank == 0 ? 0u : DT_SPLIT_DUPLICATE;
        for (int d = 0; d < p->ndim; d++)
            sp->blocks[0].size[d] = sp->global_shape[d];
    } else {
        sp->n_blocks = n_blocks;
        sp->copies = 1;
        memcpy(sp->blocks, blocks, n_blocks * sizeof *blocks);
    }
    uint64_t n = 0;
    for (uint32_t b = 0; b < sp->n_blocks; b++) {
        uint64_t bn = 1;
        for (int d = 0; d < p->ndim; d++)
            bn *= (uint64_t)sp->blocks[b].size[d];
        n += bn;
    }
    if (n != p->numel)
        return dt_err_set(DT_ERR_INVALID, "model: the blocks of %s hold %llu elements, not %llu",
                          p->name, (unsigned long long)n, (unsigned long long)p->numel);
    p->ext = sp;
    return DT_OK;
}

uint64_t dt_model_param_global(const dt_param_desc_t *p, int64_t *shape)
{
    const dt_param_split_t *sp = p->ext;
    uint64_t n = 1;
    for (int i = 0; i < p->ndim && i < 4; i++) {
        shape[i] = sp ? sp->global_shape[i] : p->shape[i];
        n *= (uint64_t)shape[i];
    }
    return n;
}

void dt_model_set_tensor(dt_model_t *m, dt_tensor_group_t *group)
{
    m->tp_group = group;
}

/* Under tensor parallelism a scheme must be set: 1 when the collective is
 * to be issued, 0 at tp 1, a negative status (message set) without one. */
static int tp_issue(const dt_model_t *m, const char *what, uint32_t unit)
{
    if (m->s.tp == 1)
        return 0;
    if (!m->tp_group)
        return -dt_err_set(DT_ERR_INVALID,
                           "model: the all-reduce of %s (unit %s) over the tensor group of %d "
                           "ranks: no tensor-parallel scheme was set (dt_model_set_tensor)",
                           what, m->desc.units[unit].name, (int)m->s.tp);
    return 1;
}

/* A scheme's failure, with the tensor and the unit. */
static int tp_failed(const dt_model_t *m, int rc, const char *what, uint32_t unit)
{
    if (rc)
        return dt_err_context(rc, "the all-reduce of %s (unit %s) over the tensor group", what,
                              m->desc.units[unit].name);
    return DT_OK;
}

int dt_model_tp_row_forward(const dt_model_t *m, const dt_model_ctx_t *ctx, void *buf,
                            int64_t n, const char *what, uint32_t unit)
{
    int go = tp_issue(m, what, unit);
    if (go <= 0)
        return -go;
    return tp_failed(m,
                     dt_tensor_ops(m->tp_group)
                         ->row_forward(m->tp_group, buf, (uint64_t)n, m->s.adtype, ctx->stream),
                     what, unit);
}

int dt_model_tp_column_start(const dt_model_t *m, const dt_model_ctx_t *ctx, void *buf,
                             int64_t n, const char *what, uint32_t unit, dt_comm_req_t **req)
{
    *req = NULL;
    int go = tp_issue(m, what, unit);
    if (go <= 0)
        return -go;
    return tp_failed(
        m,
        dt_tensor_ops(m->tp_group)
            ->column_backward_start(m->tp_group, buf, (uint64_t)n, m->s.adtype, ctx->stream, req),
        what, unit);
}

int dt_model_tp_column_wait(const dt_model_t *m, dt_comm_req_t *req, const char *what,
                            uint32_t unit)
{
    if (!req)
        return DT_OK;
    return tp_failed(m, dt_tensor_ops(m->tp_group)->column_backward_wait(m->tp_group, req), what,
                     unit);
}

int dt_model_tp_embedding(const dt_model_t *m, const dt_model_ctx_t *ctx, void *buf, int64_t n,
                          const char *what, uint32_t unit)
{
    int go = tp_issue(m, what, unit);
    if (go <= 0)
        return -go;
    return tp_failed(
        m,
        dt_tensor_ops(m->tp_group)
            ->embedding_forward(m->tp_group, buf, (uint64_t)n, m->s.adtype, ctx->stream),
        what, unit);
}

int dt_model_tp_xent(const dt_model_t *m, const dt_model_ctx_t *ctx, float *buf, int64_t n,
                     int op, const char *what, uint32_t unit)
{
    int go = tp_issue(m, what, unit);
    if (go <= 0)
        return -go;
    return tp_failed(
        m, dt_tensor_ops(m->tp_group)->xent_reduce(m->tp_group, buf, (uint64_t)n, op, ctx->stream),
        what, unit);
}

void dt_model_add_key(dt_model_t *m, const dt_model_key_t *k)
{
    if (m->info.n_keys < DT_MODEL_MAX_KEYS)
        m->info.keys[m->info.n_keys++] = *k;
}

/* ---- deterministic initialisation ---- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(uint64_t seed, const char *s)
{
    uint64_t h = 1469598103934665603ull ^ seed;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

int dt_model_init_unit(const dt_model_t *m, uint32_t unit, uint64_t seed, float *out)
{
    if (unit >= m->desc.n_units)
        return dt_err_set(DT_ERR_INVALID, "model: init of unit %u; the model has %u units",
                          unit, m->desc.n_units);
    const dt_unit_desc_t *u = &m->desc.units[unit];
    for (uint32_t k = 0; k < u->n_params; k++) {
        const dt_param_desc_t *p = &u->params[k];
        const dt_tensor_extra_t *e = &m->extra[unit][k];
        float *w = out + p->offset;
        if (e->kind == DT_TENSOR_BIAS) {
            memset(w, 0, p->numel * sizeof *w);
            continue;
        }
        if (e->kind == DT_TENSOR_NORM) {
            for (uint64_t i = 0; i < p->numel; i++)
                w[i] = 1.0f;
            continue;
        }
        /* A part (tensor parallelism) is its blocks of the global tensor's
         * values, so any tensor degree starts from the same model. */
        const dt_param_split_t *sp = p->ext;
        const int part = sp && sp->copies == 1;
        int64_t gshape[4];
        const uint64_t gn = part ? dt_model_param_global(p, gshape) : p->numel;
        float *g = part ? malloc(gn * sizeof *g) : w;
        if (!g)
            return dt_err_set(DT_ERR_NOMEM, "model: out of memory initialising %s", p->name);
        uint64_t st = hash_name(seed, p->name);
        for (uint64_t i = 0; i < gn; i += 2) {
            /* Box-Muller on 53-bit uniforms in (0, 1] */
            double u1 = ((double)(splitmix64(&st) >> 11) + 1.0) * 0x1.0p-53;
            double u2 = (double)(splitmix64(&st) >> 11) * 0x1.0p-53;
            double r = sqrt(-2.0 * log(u1));
            g[i] = (float)(e->std * r * cos(2.0 * M_PI * u2));
            if (i + 1 < gn)
                g[i + 1] = (float)(e->std * r * sin(2.0 * M_PI * u2));
        }
        if (part) {
            dt_model_gather_blocks(sp, p->ndim, g, w);
            free(g);
        }
    }
    return DT_OK;
}

void dt_model_gather_blocks(const dt_param_split_t *sp, int ndim, const float *global,
                            float *part)
{
    const int64_t g1 = ndim > 1 ? sp->global_shape[1] : 1;
    for (uint32_t b = 0; b < sp->n_blocks; b++) {
        const dt_param_block_t *bl = &sp->blocks[b];
        const int64_t rows = bl->size[0], cols = ndim > 1 ? bl->size[1] : 1;
        const int64_t c0 = ndim > 1 ? bl->start[1] : 0;
        for (int64_t r = 0; r < rows; r++)
            memcpy(part + r * cols, global + (bl->start[0] + r) * g1 + c0,
                   (size_t)cols * sizeof *part);
        part += rows * cols;
    }
}

/* ---- running ---- */

int dt_model_dalloc(dt_model_t *m, const dt_model_ctx_t *ctx, int64_t n, size_t es, void *out)
{
    if (m->n_allocs == m->cap_allocs) {
        size_t cap = m->cap_allocs ? 2 * m->cap_allocs : 64;
        void **a = realloc(m->allocs, cap * sizeof *a);
        if (!a)
            return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
        m->allocs = a;
        m->cap_allocs = cap;
    }
    void *p = NULL;
    int rc = dt_device_ops(ctx->dev)->alloc(ctx->dev, (uint64_t)n * es, DT_TAG_ACTIVATIONS, &p);
    if (rc)
        return dt_err_context(rc, "allocating activations (%lld x %zu bytes)", (long long)n, es);
    m->allocs[m->n_allocs++] = p;
    if (m->act_got)
        m->act_got[m->s.act_owner == DT_ACT_WORKSPACE ? m->desc.n_units : m->s.act_owner] +=
            (uint64_t)n * es;
    *(void **)out = p;
    return DT_OK;
}

int dt_model_keeps(const dt_model_t *m, uint32_t u)
{
    int keep = DT_KEEP_NONE;
    for (uint32_t i = 0; i < m->n_chunks; i++) {
        if (u >= m->chunk_first[i] && u < m->chunk_end[i])
            return DT_KEEP_ALL;
        if (u + 1 == m->chunk_first[i])
            keep = DT_KEEP_OUTPUT;
    }
    return keep;
}

int dt_model_set_stages(dt_model_t *m, uint32_t n, const uint32_t *first, const uint32_t *end)
{
    int same = n == m->n_chunks;
    for (uint32_t i = 0; same && i < n; i++)
        same = first[i] == m->chunk_first[i] && end[i] == m->chunk_end[i];
    if (same)
        return DT_OK;
    if (m->host_losses)
        return dt_err_set(DT_ERR_INVALID, "model: the stage is set before the activations "
                          "are allocated");
    if (n < 1 || n > DT_MODEL_MAX_CHUNKS)
        return dt_err_set(DT_ERR_INVALID, "model: a stage of %u unit ranges (1 to %d)", n,
                          DT_MODEL_MAX_CHUNKS);
    const int whole = n == 1 && first[0] == 0 && end[0] == m->desc.n_units;
    for (uint32_t i = 0; !whole && i < n; i++) {
        int rc = dt_model_stage_check(m, first[i], end[i]);
        if (rc)
            return rc;
        if (i > 0 && first[i] < end[i - 1])
            return dt_err_set(DT_ERR_INVALID, "model: a stage's unit ranges [%u, %u) and "
                              "[%u, %u) are not in model order without overlap",
                              first[i - 1], end[i - 1], first[i], end[i]);
    }
    m->n_chunks = n;
    for (uint32_t i = 0; i < n; i++) {
        m->chunk_first[i] = first[i];
        m->chunk_end[i] = end[i];
    }
    return DT_OK;
}

int dt_model_set_stage(dt_model_t *m, uint32_t first, uint32_t end)
{
    return dt_model_set_stages(m, 1, &first, &end);
}

int dt_model_set_slots(dt_model_t *m, uint32_t n)
{
    if (n == m->s.n_slots)
        return DT_OK;
    if (m->host_losses)
        return dt_err_set(DT_ERR_INVALID, "model: activation slots are set before the "
                          "activations are allocated");
    if (n < 1)
        return dt_err_set(DT_ERR_INVALID, "model: 0 activation slots");
    if (n > 1 && !m->arch->use_slot)
        return dt_err_set(DT_ERR_CONFIG, "model: arch %s keeps one micro-batch's activations "
                          "only, not %u", m->info.arch, n);
    m->s.n_slots = n;
    return DT_OK;
}

uint32_t dt_model_slots(const dt_model_t *m) { return m->s.n_slots; }

int dt_model_use_slot(dt_model_t *m, uint32_t i)
{
    if (!m->host_losses)
        return dt_err_set(DT_ERR_INVALID, "model: activation slot chosen before "
                          "dt_model_alloc_acts");
    if (i >= m->s.n_slots)
        return dt_err_set(DT_ERR_INVALID, "model: activation slot %u of %u", i, m->s.n_slots);
    m->s.tokens = m->slot_tokens[i];
    m->s.targets = m->slot_targets[i];
    if (m->arch->use_slot)
        m->arch->use_slot(&m->s, i);
    return DT_OK;
}

uint32_t dt_model_stages(const dt_model_t *m, uint32_t *first, uint32_t *end)
{
    for (uint32_t i = 0; i < m->n_chunks; i++) {
        first[i] = m->chunk_first[i];
        end[i] = m->chunk_end[i];
    }
    return m->n_chunks;
}

int dt_model_recomputes(const dt_model_t *m, int64_t l)
{
    if (m->recompute_mode == DT_RECOMPUTE_ALL)
        return 1;
    if (m->recompute_mode == DT_RECOMPUTE_EVERY)
        return (l % m->recompute_every) == 0;
    return 0;
}

static void grad_probe_note(dt_model_probe_t *p, uint32_t unit, float *grads);
static int grad_probe_unit(const dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t unit);

int dt_model_hook(const dt_model_t *m, const dt_model_ctx_t *ctx, int phase,
                  const dt_hook_t *h, uint32_t unit, int last_use, dt_unit_buffers_t *buf)
{
    static const char *names[] = {"pre_forward", "post_forward", "pre_backward", "post_backward"};
    dt_hook_t hk = *h;
    hk.unit = unit;
    hk.last_use = last_use;
    const dt_strategy_ops_t *s = dt_strategy_ops(ctx->strat);
    int rc;
    /* a crash from here on names the unit */
    dt_crash_set_unit(unit, m->desc.units[unit].name);
    /* the gradient as backward left it, before the strategy reduces it */
    if (phase == DT_POST_BACKWARD && m->grad_probe && (rc = grad_probe_unit(m, ctx, unit)))
        return rc;
    /* ... and the hook while it runs */
    dt_crash_enter("strategy", ctx->strat_name ? ctx->strat_name : "?", names[phase]);
    switch (phase) {
    case DT_PRE_FORWARD: rc = s->pre_forward(ctx->strat, &hk, buf); break;
    case DT_POST_FORWARD: rc = s->post_forward(ctx->strat, &hk); break;
    case DT_PRE_BACKWARD: rc = s->pre_backward(ctx->strat, &hk, buf); break;
    default: rc = s->post_backward(ctx->strat, &hk); break;
    }
    dt_crash_leave();
    if (rc)
        return dt_err_context(rc, "%s of unit %u (%s), micro-batch %u", names[phase], unit,
                              m->desc.units[unit].name, h->micro);
    if ((phase == DT_PRE_FORWARD || phase == DT_PRE_BACKWARD) &&
        (!buf->params || (phase == DT_PRE_BACKWARD && !buf->grads)))
        return dt_err_set(DT_ERR_INVALID, "strategy %s: %s of unit %u (%s) gave no %s",
                          ctx->strat_name ? ctx->strat_name : "?", names[phase], unit,
                          m->desc.units[unit].name, buf->params ? "gradients" : "parameters");
    if (phase == DT_PRE_BACKWARD && m->grad_probe)
        grad_probe_note(m->grad_probe, unit, buf->grads);
    return DT_OK;
}

int dt_model_view(dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t unit, const void *params,
                  int need_act, dt_unit_view_t *v)
{
    const dt_unit_desc_t *u = &m->desc.units[unit];
    const dt_tensor_extra_t *e = m->extra[unit];
    const size_t es = dt_dtype_size(m->s.wdtype), aes = dt_model_act_size(m);
    memset(v, 0, sizeof *v);
    for (uint32_t k = 0; k < u->n_params; k++) {
        v->w[k] = (const char *)params + u->params[k].offset * es;
        if (m->s.wdtype == m->s.adtype)
            v->a[k] = v->w[k];
        else if (need_act && e[k].kind != DT_TENSOR_MATRIX)
            v->a[k] = (const char *)m->view + e[k].view_off * aes;
        if (dt_model_probing(m)) {
            /* what the kernels read: the strategy's compute copy, which a
             * finite master can still overflow (bf16 rounding, a bad
             * gather) */
            char what[160];
            snprintf(what, sizeof what, "parameter %s as the forward reads it",
                     u->params[k].name);
            int rc = dt_model_probe(m, ctx, what, unit, NULL, v->w[k], m->s.wdtype,
                                    u->params[k].numel);
            if (rc)
                return rc;
        }
    }
    if (m->s.wdtype == m->s.adtype || !need_act)
        return DT_OK;
    /* One cast per run of adjacent non-matrix tensors: they are contiguous
     * in the strategy's buffer and in the view alike. */
    for (uint32_t k = 0; k < u->n_params;) {
        if (e[k].kind == DT_TENSOR_MATRIX) {
            k++;
            continue;
        }
        uint32_t j = k;
        uint64_t n = 0;
        while (j < u->n_params && e[j].kind != DT_TENSOR_MATRIX)
            n += u->params[j++].numel;
        int rc = m->s.kern->cast(ctx->dev, ctx->stream, (void *)v->a[k], m->s.adtype, v->w[k],
                               m->s.wdtype, (int64_t)n);
        if (rc)
            return dt_err_context(rc, "casting %s.. of unit %s to %s", u->params[k].name,
                                  u->name, dt_dtype_name(m->s.adtype));
        k = j;
    }
    return DT_OK;
}

/* ---- activation memory ---- */

/* Beyond 2^53 bytes the double counts may be inexact, and no device is
 * that large: refuse rather than plan with a wrong number. */
#define ACT_BYTES_MAX 0x1p53

int dt_model_act_bytes(const dt_model_t *m, int64_t B, int64_t T, uint64_t *unit_bytes,
                       dt_model_act_t *out)
{
    memset(out, 0, sizeof *out);
    if (B < 1 || T < 1)
        return dt_err_set(DT_ERR_INVALID, "model: micro-batch %lld x %lld tokens", (long long)B,
                          (long long)T);
    if (m->info.context > 0 && T > m->info.context)
        return dt_err_set(DT_ERR_INVALID,
                          "model: sequences of %lld tokens exceed the context of %lld",
                          (long long)T, (long long)m->info.context);
    const uint32_t n = m->desc.n_units;
    double *u = calloc((size_t)n, sizeof *u);
    if (!u)
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    /* common to every arch: its first unit embeds the (i32) input tokens
     * and its last computes the loss against the targets; a model whose
     * parameter and activation dtypes differ casts one unit's non-matrix
     * tensors at a time into the view */
    const double BT = (double)B * (double)T;
    double ws = m->s.wdtype == m->s.adtype
                    ? 0.0
                    : (double)dt_model_act_size(m) * (double)m->view_numel;
    if (dt_model_keeps(m, 0) == DT_KEEP_ALL)
        u[0] += 4.0 * BT;
    if (dt_model_keeps(m, n - 1) == DT_KEEP_ALL)
        u[n - 1] += 4.0 * BT;
    int rc = m->arch->act_bytes(&m->s, B, T, u, &ws);
    if (rc) {
        free(u);
        return rc;
    }
    double kept = 0;
    for (uint32_t i = 0; i < n; i++) {
        u[i] *= (double)m->s.n_slots; /* what a unit keeps, once per slot */
        kept += u[i];
    }
    if (!(kept + ws < ACT_BYTES_MAX)) {
        free(u);
        return dt_err_set(DT_ERR_INVALID,
                          "model: activations of a %lld x %lld micro-batch would take %.3g "
                          "bytes, beyond any device",
                          (long long)B, (long long)T, kept + ws);
    }
    for (uint32_t i = 0; i < n; i++) {
        if (unit_bytes)
            unit_bytes[i] = (uint64_t)u[i];
        out->kept += (uint64_t)u[i];
    }
    out->workspace = (uint64_t)ws;
    out->total = out->kept + out->workspace;
    free(u);
    return DT_OK;
}

int dt_model_plan_acts(dt_model_t *m, int64_t B, int64_t T, dt_model_act_t *out)
{
    uint64_t *u = malloc((size_t)m->desc.n_units * sizeof *u);
    if (!u)
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    int rc = dt_model_act_bytes(m, B, T, u, out);
    for (uint32_t i = 0; rc == DT_OK && i < m->desc.n_units; i++)
        m->desc.units[i].act_bytes = u[i];
    free(u);
    return rc;
}

int dt_model_alloc_acts(dt_model_t *m, const dt_model_ctx_t *ctx, int64_t B, int64_t T)
{
    if (m->host_losses)
        return dt_err_set(DT_ERR_INVALID, "model: activations are already allocated");
    if (dt_device_ops(ctx->dev)->kernels() != m->s.kern)
        return dt_err_set(
            DT_ERR_INVALID, "model: created for device '%s', run on an instance of device '%s'",
            m->s.dev_name,
            dt_device_ops(ctx->dev)->info.name ? dt_device_ops(ctx->dev)->info.name : "?");
    dt_model_act_t plan;
    int rc;
    if (m->s.adtype != DT_F32 &&
        (rc = m->s.kern->residual_forward(ctx->dev, ctx->stream, NULL, NULL, NULL, m->s.adtype,
                                          0))) {
        /* a call of no elements: the device's dtype check alone, before any
         * memory is planned for activations it cannot run */
        char why[256];
        snprintf(why, sizeof why, "%s", dt_last_error());
        return dt_err_set(DT_ERR_CONFIG, "[model] activations = \"%s\": device '%s' does not "
                          "run them (%s)", dt_dtype_name(m->s.adtype), m->s.dev_name, why);
    }
    if ((rc = dt_model_plan_acts(m, B, T, &plan)))
        return rc;
    const int64_t BT = B * T;
    const uint32_t n = m->desc.n_units;
    m->s.B = B;
    m->s.T = T;
    if (!(m->host_losses = malloc((size_t)BT * sizeof(float))) ||
        !(m->act_got = calloc((size_t)n + 1, sizeof *m->act_got)) ||
        !(m->slot_tokens = calloc(m->s.n_slots, sizeof *m->slot_tokens)) ||
        !(m->slot_targets = calloc(m->s.n_slots, sizeof *m->slot_targets)))
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    for (uint32_t s = 0; s < m->s.n_slots; s++) {
        m->s.act_owner = 0;
        if (dt_model_keeps(m, 0) == DT_KEEP_ALL &&
            (rc = dt_model_dalloc(m, ctx, BT, 4, &m->slot_tokens[s])))
            return rc;
        m->s.act_owner = n - 1;
        if (dt_model_keeps(m, n - 1) == DT_KEEP_ALL &&
            (rc = dt_model_dalloc(m, ctx, BT, 4, &m->slot_targets[s])))
            return rc;
    }
    m->s.tokens = m->slot_tokens[0];
    m->s.targets = m->slot_targets[0];
    m->s.act_owner = DT_ACT_WORKSPACE;
    if ((m->s.wdtype != m->s.adtype &&
         (rc = dt_model_dalloc(m, ctx, (int64_t)m->view_numel, dt_model_act_size(m),
                               &m->view))) ||
        (rc = m->arch->alloc_acts(&m->s, ctx)))
        return rc;
    /* The plan is what the planner and strategies were told: an arch whose
     * allocations drift from its act_bytes is a bug to report, not to run. */
    for (uint32_t i = 0; i <= n; i++) {
        const uint64_t want = i < n ? m->desc.units[i].act_bytes : plan.workspace;
        if (m->act_got[i] != want)
            return dt_err_set(DT_ERR_INVALID,
                              "model: arch %s allocated %llu activation bytes for %s%s, its "
                              "act_bytes plans %llu (B %lld, T %lld)",
                              m->info.arch, (unsigned long long)m->act_got[i],
                              i < n ? "unit " : "the workspace", i < n ? m->desc.units[i].name : "",
                              (unsigned long long)want, (long long)B, (long long)T);
    }
    free(m->act_got);
    m->act_got = NULL;
    if (m->arch->use_slot)
        m->arch->use_slot(&m->s, 0);
    return DT_OK;
}

static int check_tokens(const dt_model_t *m, const char *what, const int32_t *tok)
{
    for (int64_t i = 0; i < m->s.B * m->s.T; i++)
        if (tok[i] < 0 || tok[i] >= m->info.vocab_size)
            return dt_err_set(DT_ERR_INVALID,
                              "model: %s token %d at sequence %lld, position %lld is outside "
                              "the vocabulary [0, %lld)",
                              what, (int)tok[i], (long long)(i / m->s.T), (long long)(i % m->s.T),
                              (long long)m->info.vocab_size);
    return DT_OK;
}

/* Copy `tok` ((B, T) host, checked against the vocabulary: the kernels
 * index embeddings with them, and a bad token would read outside the
 * table) to the device's `dst`. */
static int put_tokens(const dt_model_t *m, const dt_model_ctx_t *ctx, const char *what,
                      const int32_t *tok, int32_t *dst)
{
    int rc = check_tokens(m, what, tok);
    return rc ? rc
              : dt_device_ops(ctx->dev)->memcpy_async(
                    ctx->dev, dst, tok, (uint64_t)(m->s.B * m->s.T) * 4, DT_COPY_H2D, ctx->stream);
}

/* The mean of m->s.losses, after the stream's work. */
static int mean_loss(const dt_model_t *m, const dt_model_ctx_t *ctx, double *loss)
{
    const int64_t BT = m->s.B * m->s.T;
    const dt_device_ops_t *R = dt_device_ops(ctx->dev);
    int rc;
    if ((rc = R->memcpy_async(ctx->dev, m->host_losses, m->s.losses, (uint64_t)BT * 4,
                              DT_COPY_D2H, ctx->stream)) ||
        (rc = R->stream_sync(ctx->dev, ctx->stream)))
        return rc;
    double sum = 0;
    for (int64_t i = 0; i < BT; i++)
        sum += m->host_losses[i];
    *loss = sum / (double)BT;
    return DT_OK;
}

/* 1 when the activations are the whole model's (no stage set); else
 * whole_model is DT_ERR_INVALID for a pass over the whole model on a rank
 * whose activations are one stage's (dt_model_set_stage). */
static int is_whole(const dt_model_t *m)
{
    return m->n_chunks == 1 && m->chunk_first[0] == 0 && m->chunk_end[0] == m->desc.n_units;
}

/* "units 2-4" or "units 0-1, 4-5": the ranges this rank runs. */
static const char *chunk_list(const dt_model_t *m, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "units");
    for (uint32_t i = 0; i < m->n_chunks && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s %u-%u", i ? "," : "", m->chunk_first[i],
                              m->chunk_end[i] - 1);
    return out;
}

static int whole_model(const dt_model_t *m, const char *what)
{
    if (is_whole(m))
        return DT_OK;
    char cl[256];
    return dt_err_set(DT_ERR_INVALID, "model: a whole-model %s on a rank that runs %s only (a "
                      "pipeline stage)", what, chunk_list(m, cl, sizeof cl));
}

/* dt_model_stage_check, and [first, end) one of the unit ranges the
 * activations were allocated for (the whole model's serve any). */
static int allocated_stage(const dt_model_t *m, uint32_t first, uint32_t end)
{
    int rc = dt_model_stage_check(m, first, end);
    if (rc || is_whole(m))
        return rc;
    for (uint32_t i = 0; i < m->n_chunks; i++)
        if (first == m->chunk_first[i] && end == m->chunk_end[i])
            return DT_OK;
    char cl[256];
    return dt_err_set(DT_ERR_INVALID, "model: stage units %u-%u run on activations allocated "
                      "for %s", first, end - 1, chunk_list(m, cl, sizeof cl));
}

int dt_model_step_micro(dt_model_t *m, const dt_model_ctx_t *ctx, const int32_t *inputs,
                        const int32_t *targets, uint32_t micro, uint32_t n_micro, int no_grad,
                        float loss_scale, double *loss)
{
    if (!m->host_losses)
        return dt_err_set(DT_ERR_INVALID, "model: step before dt_model_alloc_acts");
    int rc = whole_model(m, "step");
    if (rc)
        return rc;
    if ((rc = put_tokens(m, ctx, "input", inputs, m->s.tokens)) ||
        (rc = put_tokens(m, ctx, "target", targets, m->s.targets)))
        return rc;
    dt_hook_t h = {.struct_size = sizeof(dt_hook_t),
                      .micro = micro,
                      .n_micro = n_micro,
                      .flags = no_grad ? DT_HOOK_NO_GRAD : 0u};
    if ((rc = m->arch->forward(&m->s, ctx, &h)) || (rc = mean_loss(m, ctx, loss)))
        return rc;
    if (no_grad)
        return DT_OK;
    h.flags = 0;
    return m->arch->backward(&m->s, ctx, &h, loss_scale);
}

/* ---- pipeline stages ---- */

int dt_model_stage_check(const dt_model_t *m, uint32_t first, uint32_t end)
{
    if (!m->arch->stage_forward || !m->arch->stage_backward || m->info.boundary_width <= 0)
        return dt_err_set(DT_ERR_CONFIG, "model: arch %s cannot be split into pipeline stages",
                          m->info.arch);
    if (first >= end || end > m->desc.n_units)
        return dt_err_set(DT_ERR_INVALID,
                          "model: stage of units [%u, %u) is not a non-empty range of the "
                          "model's %u units",
                          first, end, m->desc.n_units);
    return DT_OK;
}

uint64_t dt_model_boundary_count(const dt_model_t *m)
{
    return (uint64_t)(m->s.B * m->s.T * m->info.boundary_width);
}

uint32_t dt_model_stage_tied(const dt_model_t *m, uint32_t first, uint32_t end, uint32_t *out,
                             uint32_t cap)
{
    if (!m->info.tied_embedding || first == 0 || end != m->desc.n_units)
        return 0;
    if (cap > 0)
        out[0] = 0;
    return 1;
}

int dt_model_stage_forward(dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t first, uint32_t end,
                           const int32_t *inputs, const int32_t *targets, const void *in,
                           void *out, uint32_t micro, uint32_t n_micro, int no_grad,
                           double *loss)
{
    int rc = allocated_stage(m, first, end);
    if (rc)
        return rc;
    if (!m->host_losses)
        return dt_err_set(DT_ERR_INVALID, "model: stage forward before dt_model_alloc_acts");
    const int last = end == m->desc.n_units;
    if ((first == 0 && (rc = put_tokens(m, ctx, "input", inputs, m->s.tokens))) ||
        (last && (rc = put_tokens(m, ctx, "target", targets, m->s.targets))))
        return rc;
    const dt_hook_t h = {.struct_size = sizeof(dt_hook_t), .micro = micro, .n_micro = n_micro,
                         .flags = no_grad ? DT_HOOK_NO_GRAD : 0u};
    if ((rc = m->arch->stage_forward(&m->s, ctx, &h, first, end, in, out)))
        return rc;
    if (last)
        return mean_loss(m, ctx, loss);
    return dt_device_ops(ctx->dev)->stream_sync(ctx->dev, ctx->stream);
}

int dt_model_stage_backward(dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t first,
                            uint32_t end, const void *dout, void *din, uint32_t micro,
                            uint32_t n_micro, float loss_scale)
{
    int rc = allocated_stage(m, first, end);
    if (rc)
        return rc;
    const dt_hook_t h = {.struct_size = sizeof(dt_hook_t), .micro = micro, .n_micro = n_micro};
    if ((rc = m->arch->stage_backward(&m->s, ctx, &h, first, end, dout, din, loss_scale)))
        return rc;
    return dt_device_ops(ctx->dev)->stream_sync(ctx->dev, ctx->stream);
}

/* ---- finding the first non-finite tensor ---- */

struct dt_model_probe {
    int found;
    void *host;       /* PROBE_CHUNK elements of the largest dtype */
    char *what;       /* the phrase, once found */
    size_t cap;
    float **grads;    /* gradient search: (n_units) each unit's gradient
                       * buffer from its pre_backward */
    double max_abs;   /* gradient search: the largest |element| seen, */
    char max_what[320]; /* and where (f32 tensors only) */
};

/* Host copies go through a fixed buffer: a (B, T, V) logits tensor of a
 * large run does not fit twice in host memory. */
#define PROBE_CHUNK ((uint64_t)1 << 16)

/* Index of the first non-finite element of x[0, n) (n when none). */
static uint64_t first_bad(const void *x, int dtype, uint64_t n, double *val)
{
    for (uint64_t i = 0; i < n; i++) {
        float f;
        if (dtype == DT_F32)
            f = ((const float *)x)[i];
        else if (dtype == DT_BF16)
            f = dt_bf16_to_f32(((const uint16_t *)x)[i]);
        else
            f = dt_f16_to_f32(((const uint16_t *)x)[i]);
        if (!isfinite(f)) {
            *val = f;
            return i;
        }
    }
    return n;
}

static int probe_into(dt_model_probe_t *p, const dt_model_t *m, const dt_model_ctx_t *ctx,
                      const char *what, uint32_t unit, const char *after, const void *x,
                      int dtype, uint64_t n);

int dt_model_probe(dt_model_t *m, const dt_model_ctx_t *ctx, const char *what, uint32_t unit,
                   const char *after, const void *x, int dtype, uint64_t n)
{
    return probe_into(m->probe, m, ctx, what, unit, after, x, dtype, n);
}

static void grad_probe_note(dt_model_probe_t *p, uint32_t unit, float *grads)
{
    p->grads[unit] = grads;
}

/* Each parameter tensor's gradient of `unit`, in the order of its
 * tensors. */
static int grad_probe_unit(const dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t unit)
{
    dt_model_probe_t *p = m->grad_probe;
    const dt_unit_desc_t *u = &m->desc.units[unit];
    char what[200], after[160];
    snprintf(after, sizeof after, "the backward of unit %s", u->name);
    for (uint32_t k = 0; !p->found && p->grads[unit] && k < u->n_params; k++) {
        snprintf(what, sizeof what, "gradient of parameter %s", u->params[k].name);
        int rc = probe_into(p, m, ctx, what, unit, after, p->grads[unit] + u->params[k].offset,
                            DT_F32, u->params[k].numel);
        if (rc)
            return rc;
    }
    return DT_OK;
}

static int probe_into(dt_model_probe_t *p, const dt_model_t *m, const dt_model_ctx_t *ctx,
                      const char *what, uint32_t unit, const char *after, const void *x,
                      int dtype, uint64_t n)
{
    if (!p || p->found)
        return DT_OK;
    if (dtype != DT_F32 && dtype != DT_BF16 && dtype != DT_F16)
        return dt_err_set(DT_ERR_INVALID, "model: probing %s: dtype %s is not f32, bf16 or f16", what,
                          dt_dtype_name(dtype));
    const size_t es = dt_dtype_size(dtype);
    for (uint64_t at = 0; at < n; at += PROBE_CHUNK) {
        const uint64_t k = n - at < PROBE_CHUNK ? n - at : PROBE_CHUNK;
        int rc = dt_device_ops(ctx->dev)->memcpy_async(ctx->dev, p->host, (const char *)x + at * es,
                                                       k * es, DT_COPY_D2H, ctx->stream);
        if (!rc)
            rc = dt_device_ops(ctx->dev)->stream_sync(ctx->dev, ctx->stream);
        if (rc)
            return dt_err_context(rc, "copying %s of unit %s to the host", what,
                                  m->desc.units[unit].name);
        double v = 0;
        const uint64_t i = first_bad(p->host, dtype, k, &v);
        if (p->grads && dtype == DT_F32) /* the largest, for when all are finite */
            for (uint64_t j = 0; j < i; j++) {
                const double a = fabs((double)((const float *)p->host)[j]);
                if (a > p->max_abs) {
                    p->max_abs = a;
                    snprintf(p->max_what, sizeof p->max_what, "%s (unit %s): element %llu of "
                             "%llu is %g", what, m->desc.units[unit].name,
                             (unsigned long long)(at + j), (unsigned long long)n,
                             (double)((const float *)p->host)[j]);
                }
            }
        if (i == k)
            continue;
        snprintf(p->what, p->cap, "%s (unit %s)%s%s: element %llu of %llu is %s", what,
                 m->desc.units[unit].name, after ? ", after " : "", after ? after : "",
                 (unsigned long long)(at + i), (unsigned long long)n,
                 isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
        p->found = 1;
        return DT_OK;
    }
    return DT_OK;
}

int dt_model_loss_forward(dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t head)
{
    const dt_kernels_t *K = m->s.kern;
    const int64_t BT = m->s.B * m->s.T, V = m->s.vocab_local;
    if (m->s.tp == 1) {
        DT_TRY_UNIT(K->softmax_xent_forward(ctx->dev, ctx->stream, m->s.losses, m->s.probs,
                                            m->s.logits, m->s.targets, m->s.adtype, BT, V),
                    "forward", head);
    } else {
        /* the parallel cross-entropy: the row maxima, then the sums of
         * exponentials and the target logits, reduced over the group */
        float *st = m->s.xent_stats;
        for (int phase = 0; phase < 3; phase++) {
            DT_TRY_UNIT(K->vocab_xent_forward(ctx->dev, ctx->stream, phase, st, m->s.losses,
                                              m->s.probs, m->s.logits, m->s.targets,
                                              m->s.adtype, BT, m->s.vocab_first, V),
                        "forward", head);
            if (phase == 0)
                DT_TRY(dt_model_tp_xent(m, ctx, st, BT, DT_OP_MAX, "the logits' row maxima",
                                        head));
            else if (phase == 1)
                DT_TRY(dt_model_tp_xent(m, ctx, st + BT, 2 * BT, DT_OP_SUM,
                                        "the sums of exponentials and target logits", head));
        }
    }
    DT_TRY(dt_model_probe(m, ctx, "activation probabilities", head,
                          "the forward of the softmax cross-entropy", m->s.probs, m->s.adtype,
                          (uint64_t)(BT * V)));
    return dt_model_probe(m, ctx, "per-position loss", head,
                          "the forward of the softmax cross-entropy", m->s.losses, DT_F32,
                          (uint64_t)BT);
}

int dt_model_loss_backward(dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t head,
                           void *dlogits, float loss_scale)
{
    const dt_kernels_t *K = m->s.kern;
    const int64_t BT = m->s.B * m->s.T, V = m->s.vocab_local;
    DT_TRY_UNIT(dt_model_zero(ctx, dlogits, (uint64_t)(BT * V) * dt_model_act_size(m)),
                "backward", head);
    if (m->s.tp == 1)
        DT_TRY_UNIT(K->softmax_xent_backward(ctx->dev, ctx->stream, dlogits, m->s.probs,
                                             m->s.targets, m->s.adtype, loss_scale / (float)BT, BT,
                                             V),
                    "backward", head);
    else
        DT_TRY_UNIT(K->vocab_xent_backward(ctx->dev, ctx->stream, dlogits, m->s.probs, m->s.targets,
                                           m->s.adtype, loss_scale / (float)BT, BT,
                                           m->s.vocab_first, V),
                    "backward", head);
    return DT_OK;
}

/* The probed forward of dt_model_find_nonfinite; p->found says whether
 * p->what was written. */
static int probed_forward(dt_model_t *m, const dt_model_ctx_t *ctx, const int32_t *inputs,
                          const int32_t *targets, dt_model_probe_t *p)
{
    if (!m->host_losses)
        return dt_err_set(DT_ERR_INVALID,
                          "model: dt_model_find_nonfinite before dt_model_alloc_acts");
    int rc = whole_model(m, "non-finite search");
    if (rc)
        return rc;
    if ((rc = check_tokens(m, "input", inputs)) || (rc = check_tokens(m, "target", targets)))
        return rc;
    const uint64_t bytes = (uint64_t)(m->s.B * m->s.T) * 4;
    const dt_device_ops_t *R = dt_device_ops(ctx->dev);
    if ((rc = R->memcpy_async(ctx->dev, m->s.tokens, inputs, bytes, DT_COPY_H2D, ctx->stream)) ||
        (rc = R->memcpy_async(ctx->dev, m->s.targets, targets, bytes, DT_COPY_H2D, ctx->stream)))
        return rc;
    /* an evaluation pass: strategies gather and release as for one */
    const dt_hook_t h = {
        .struct_size = sizeof(dt_hook_t), .micro = 0, .n_micro = 1, .flags = DT_HOOK_NO_GRAD};
    m->probe = p;
    rc = m->arch->forward(&m->s, ctx, &h);
    m->probe = NULL;
    return rc ? rc : R->stream_sync(ctx->dev, ctx->stream);
}

int dt_model_find_nonfinite(dt_model_t *m, const dt_model_ctx_t *ctx, const int32_t *inputs,
                            const int32_t *targets, char *out, size_t cap)
{
    dt_model_probe_t p = {.found = 0, .host = malloc(PROBE_CHUNK * 4), .what = out, .cap = cap};
    int rc = p.host ? probed_forward(m, ctx, inputs, targets, &p)
                    : dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    free(p.host);
    if (rc) {
        rc = dt_err_context(rc, "re-running the forward to find the first non-finite tensor");
        snprintf(out, cap, "unknown (the search failed: %s)", dt_last_error());
    } else if (!p.found) {
        snprintf(out, cap, "%s", DT_MODEL_FORWARD_FINITE);
    }
    return rc;
}

int dt_model_probe_begin(dt_model_t *m, char *out, size_t cap)
{
    if (m->probe)
        return dt_err_set(DT_ERR_INVALID, "model: a non-finite search is already running");
    dt_model_probe_t *p = calloc(1, sizeof *p);
    if (p)
        p->host = malloc(PROBE_CHUNK * 4);
    if (!p || !p->host) {
        free(p);
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    }
    p->what = out;
    p->cap = cap;
    m->probe = p;
    return DT_OK;
}

int dt_model_probe_end(dt_model_t *m)
{
    dt_model_probe_t *p = m->probe;
    if (!p)
        return 0;
    const int found = p->found;
    if (!found)
        snprintf(p->what, p->cap, "%s", DT_MODEL_FORWARD_FINITE);
    free(p->host);
    free(p);
    m->probe = NULL;
    return found;
}

int dt_model_grad_probe_begin(dt_model_t *m, char *out, size_t cap)
{
    if (m->grad_probe)
        return dt_err_set(DT_ERR_INVALID, "model: a gradient search is already running");
    dt_model_probe_t *p = calloc(1, sizeof *p);
    if (p) {
        p->host = malloc(PROBE_CHUNK * 4);
        p->grads = calloc(m->desc.n_units, sizeof(float *));
    }
    if (!p || !p->host || !p->grads) {
        if (p) {
            free(p->host);
            free(p->grads);
        }
        free(p);
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    }
    p->what = out;
    p->cap = cap;
    snprintf(p->max_what, sizeof p->max_what, "none (no gradient)");
    m->grad_probe = p;
    return DT_OK;
}

int dt_model_grad_probe_end(dt_model_t *m, double *max_abs)
{
    dt_model_probe_t *p = m->grad_probe;
    if (!p)
        return 0;
    const int found = p->found;
    if (!found) /* what a 16-bit reduction would have overflowed on */
        snprintf(p->what, p->cap, "%s; the largest: %s%s", DT_MODEL_GRADS_FINITE, p->max_what,
                 p->max_abs > 65504.0 ? " (above 65504, the largest f16: a reduce_dtype = "
                                        "\"fp16\" reduction overflows there)"
                                      : "");
    if (max_abs)
        *max_abs = p->max_abs;
    free(p->host);
    free(p->grads);
    free(p);
    m->grad_probe = NULL;
    return found;
}

int dt_model_find_nonfinite_grad(dt_model_t *m, const dt_model_ctx_t *ctx,
                                 const int32_t *inputs, const int32_t *targets,
                                 float loss_scale, char *out, size_t cap)
{
    int rc = dt_model_grad_probe_begin(m, out, cap);
    if (rc == DT_OK) {
        double loss;
        rc = dt_model_step_micro(m, ctx, inputs, targets, 0, 1, 0, loss_scale, &loss);
        dt_model_grad_probe_end(m, NULL);
    }
    if (rc) {
        rc = dt_err_context(rc, "re-running forward and backward to find the first non-finite "
                                "gradient");
        snprintf(out, cap, "unknown (the search failed: %s)", dt_last_error());
    }
    return rc;
}
