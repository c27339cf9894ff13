/*
 * core/model/model_probe.c - finding the first non-finite tensor: the
 * probes a plugin's forward passes its kernels' outputs to (nothing
 * unless a search is on), the forward search (which kernel first made a
 * NaN or an Inf) and the gradient search (which unit's gradient, and the
 * largest element seen).
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

void dt_model_grad_probe_note(dt_model_probe_t *p, uint32_t unit, float *grads)
{
    p->grads[unit] = grads;
}

/* Each parameter tensor's gradient of `unit`, in the order of its
 * tensors. */
int dt_model_grad_probe_unit(const dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t unit)
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
        return dt_err_set(DT_ERR_INVALID, "model: probing %s: dtype %s is not f32, bf16 or f16",
                          what, dt_dtype_name(dtype));
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

/* The probed forward of dt_model_find_nonfinite; p->found says whether
 * p->what was written. */
static int probed_forward(dt_model_t *m, const dt_model_ctx_t *ctx, const int32_t *inputs,
                          const int32_t *targets, dt_model_probe_t *p)
{
    if (!m->host_losses)
        return dt_err_set(DT_ERR_INVALID,
                          "model: dt_model_find_nonfinite before dt_model_alloc_acts");
    int rc = dt_model_whole(m, "non-finite search");
    if (rc)
        return rc;
    if ((rc = dt_model_check_tokens(m, "input", inputs)) ||
        (rc = dt_model_check_tokens(m, "target", targets)))
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
