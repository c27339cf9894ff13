/*
 * core/model/model_desc.c - describing a model: its units and their
 * tensors (the services a plugin's create calls: alloc_units, name_unit,
 * add_param, part for a tensor-parallel part), and their deterministic
 * initialisation (a tensor's values depend on the seed and its name only,
 * so every layout and world size starts from the same model).
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
