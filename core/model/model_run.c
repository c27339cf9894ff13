/*
 * core/model/model_run.c - running a model: pipeline stages and
 * activation slots, the strategy's unit hooks with context in messages,
 * the f32 views of 16-bit parameters, the micro-step around the plugin's
 * forward and backward (token checks, copies, the mean loss), a stage's
 * forward and backward, and the loss head.
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
    /* sequence parallelism: the replicated tensors' gradients summed over
     * the tensor group, before the probe and the strategy see them */
    if (phase == DT_POST_BACKWARD && last_use && m->s.tp_seq && m->seq_open[unit] &&
        (rc = dt_model_seq_grads(m, ctx, unit, 1)))
        return rc;
    /* the gradient as backward left it, before the strategy reduces it */
    if (phase == DT_POST_BACKWARD && m->grad_probe && (rc = dt_model_grad_probe_unit(m, ctx, unit)))
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
        dt_model_grad_probe_note(m->grad_probe, unit, buf->grads);
    if (phase == DT_PRE_BACKWARD && m->s.tp_seq) {
        m->seq_grads[unit] = buf->grads; /* the buffer the last post_backward sums */
        if (!m->seq_open[unit]) {
            m->seq_open[unit] = 1;
            if ((rc = dt_model_seq_grads(m, ctx, unit, 0)))
                return rc;
        }
    }
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

int dt_model_check_tokens(const dt_model_t *m, const char *what, const int32_t *tok)
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
    int rc = dt_model_check_tokens(m, what, tok);
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
 * dt_model_whole is DT_ERR_INVALID for a pass over the whole model on a rank
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

int dt_model_whole(const dt_model_t *m, const char *what)
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
    int rc = dt_model_whole(m, "step");
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
    /* under sequence parallelism the residual stream is this rank's rows */
    return (uint64_t)(m->s.B * m->s.T / (m->s.tp_seq ? m->s.tp : 1) * m->info.boundary_width);
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
