/*
 * core/model/model_acts.c - activation memory: which units backward
 * recomputes, the plugin's count of activation bytes (planned) and its
 * allocations (measured, checked unit by unit against the plan), and the
 * device allocations a model frees with itself.
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

int dt_model_recomputes(const dt_model_t *m, int64_t l)
{
    if (m->recompute_mode == DT_RECOMPUTE_ALL)
        return 1;
    if (m->recompute_mode == DT_RECOMPUTE_EVERY)
        return (l % m->recompute_every) == 0;
    return 0;
}

/* Beyond 2^53 bytes the double counts may be inexact, and no device is
 * that large: refuse rather than plan with a wrong number. */
#define ACT_BYTES_MAX 0x1p53

int dt_model_check_seq_len(const dt_model_t *m, int64_t T)
{
    if (m->s.tp_seq && T % m->s.tp != 0)
        return dt_err_set(DT_ERR_CONFIG,
                          "[train] seq_len = %lld is not a multiple of [parallel] tensor = %d: "
                          "[tensor] scheme = \"%s\" splits each sequence over the tensor group",
                          (long long)T, (int)m->s.tp, m->seq_scheme);
    return DT_OK;
}

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
    int rc = dt_model_check_seq_len(m, T);
    if (rc)
        return rc;
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
    rc = m->arch->act_bytes(&m->s, B, T, u, &ws);
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
