/*
 * core/model/model_tensor.c - the tensor-parallel services a model plugin
 * calls (dtrain/model.h tp_*): the scheme's collectives with the unit and
 * the operation named in every failure, the 1D all-reduces and, under
 * sequence parallelism (dt_model_set_sequence), the all-gathers and
 * reduce-scatters, and the sum of replicated tensors' gradients over the
 * tensor group (dt_model_seq_grads, from the hooks).
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

void dt_model_set_tensor(dt_model_t *m, dt_tensor_group_t *group)
{
    m->tp_group = group;
}

int dt_model_set_sequence(dt_model_t *m, const dt_tensor_ops_t *ops, const char *name)
{
    if (m->s.tp == 1 || !ops || !ops->sequence_parallel || !ops->sequence_parallel())
        return DT_OK;
    if (!ops->column_forward_gather || !ops->column_backward_scatter ||
        !ops->row_forward_scatter || !ops->row_backward_gather || !ops->duplicated_grad_reduce)
        return dt_err_set(DT_ERR_INVALID,
                          "tensor plugin '%s' splits the sequence but lacks some of "
                          "sequence parallelism's slots (all six or none)",
                          name);
    if (!m->info.sequence_parallel)
        return dt_err_set(DT_ERR_CONFIG,
                          "[tensor] scheme = \"%s\" splits the sequence over the tensor group; "
                          "[model] arch = \"%s\" does not run sequence parallelism (use scheme "
                          "\"megatron\")",
                          name, m->info.arch);
    m->seq_open = calloc(m->desc.n_units, sizeof *m->seq_open);
    m->seq_grads = calloc(m->desc.n_units, sizeof *m->seq_grads);
    if (!m->seq_open || !m->seq_grads)
        return dt_err_set(DT_ERR_NOMEM, "model: out of memory");
    m->seq_scheme = name;
    m->s.tp_seq = 1;
    return DT_OK;
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

/* Sequence parallelism's collectives: 1 to issue, else a negative
 * status (message set). */
static int seq_issue(const dt_model_t *m, const char *what, uint32_t unit)
{
    if (!m->s.tp_seq)
        return -dt_err_set(DT_ERR_INVALID,
                           "model: %s (unit %s): the sequence is not split over the tensor "
                           "group (a scheme without sequence parallelism)",
                           what, m->desc.units[unit].name);
    return tp_issue(m, what, unit);
}

static int seq_failed(const dt_model_t *m, int rc, const char *op, const char *what,
                      uint32_t unit)
{
    if (rc)
        return dt_err_context(rc, "the %s of %s (unit %s) over the tensor group", op, what,
                              m->desc.units[unit].name);
    return DT_OK;
}

int dt_model_tp_column_gather(const dt_model_t *m, const dt_model_ctx_t *ctx, const void *shard,
                              void *full, int64_t n, const char *what, uint32_t unit)
{
    int go = seq_issue(m, what, unit);
    if (go <= 0)
        return -go;
    dt_tensor_group_t *g = m->tp_group;
    return seq_failed(m,
                      dt_tensor_ops(g)->column_forward_gather(g, shard, full, (uint64_t)n,
                                                              m->s.adtype, ctx->stream),
                      "all-gather", what, unit);
}

int dt_model_tp_column_scatter_start(const dt_model_t *m, const dt_model_ctx_t *ctx,
                                     const void *full, void *shard, int64_t n, const char *what,
                                     uint32_t unit, dt_comm_req_t **req)
{
    *req = NULL;
    int go = seq_issue(m, what, unit);
    if (go <= 0)
        return -go;
    dt_tensor_group_t *g = m->tp_group;
    return seq_failed(m,
                      dt_tensor_ops(g)->column_backward_scatter(g, full, shard, (uint64_t)n,
                                                                m->s.adtype, ctx->stream, req),
                      "reduce-scatter", what, unit);
}

int dt_model_tp_row_scatter(const dt_model_t *m, const dt_model_ctx_t *ctx, const void *full,
                            void *shard, int64_t n, const char *what, uint32_t unit)
{
    int go = seq_issue(m, what, unit);
    if (go <= 0)
        return -go;
    dt_tensor_group_t *g = m->tp_group;
    return seq_failed(m,
                      dt_tensor_ops(g)->row_forward_scatter(g, full, shard, (uint64_t)n,
                                                            m->s.adtype, ctx->stream),
                      "reduce-scatter", what, unit);
}

int dt_model_tp_row_gather(const dt_model_t *m, const dt_model_ctx_t *ctx, const void *shard,
                           void *full, int64_t n, const char *what, uint32_t unit)
{
    int go = seq_issue(m, what, unit);
    if (go <= 0)
        return -go;
    dt_tensor_group_t *g = m->tp_group;
    return seq_failed(m,
                      dt_tensor_ops(g)->row_backward_gather(g, shard, full, (uint64_t)n,
                                                            m->s.adtype, ctx->stream),
                      "all-gather", what, unit);
}

/* Sequence parallelism's replicated tensors (a part of copies > 1: norm
 * weights and biases, a row-parallel layer's bias, a position embedding)
 * in unit `unit`'s gradient.  Each rank computes their gradient from its
 * own positions, so the whole is the sum over the tensor group; the
 * buffer may already hold earlier micro-batches' sum, the same on every
 * rank.  So at the unit's first pre_backward (sum 0) ranks other than 0
 * zero those slices, and at its last post_backward (sum 1) every rank sums
 * them: rank 0's earlier sum plus every rank's share of this one. */
int dt_model_seq_grads(const dt_model_t *m, const dt_model_ctx_t *ctx, uint32_t unit, int sum)
{
    const dt_unit_desc_t *u = &m->desc.units[unit];
    float *g = m->seq_grads[unit];
    int rc = DT_OK;
    if (sum)
        m->seq_open[unit] = 0;
    if (!sum && m->s.tp_rank == 0)
        return DT_OK;
    for (uint32_t k = 0; rc == DT_OK && k < u->n_params; k++) {
        const dt_param_split_t *sp = u->params[k].ext;
        if (!sp || sp->copies <= 1)
            continue;
        float *at = g + u->params[k].offset;
        if (!sum)
            rc = dt_device_ops(ctx->dev)->memset_async(
                ctx->dev, at, 0, u->params[k].numel * sizeof(float), ctx->stream);
        else if ((rc = dt_tensor_ops(m->tp_group)
                           ->duplicated_grad_reduce(m->tp_group, at, u->params[k].numel,
                                                    ctx->stream)) != DT_OK)
            rc = dt_err_context(rc, "the sum of %s's gradient (unit %s) over the tensor group",
                                u->params[k].name, u->name);
    }
    return rc;
}
