/*
 * plugins/megatron/megatron.c - the `megatron` and `megatron_sp`
 * tensor-parallel schemes (dtrain/tensor_parallel.h): Megatron-LM's 1D
 * tensor parallelism, chosen by [tensor] scheme = "megatron" (the
 * default) when [parallel] tensor = P > 1, and the same with Megatron's
 * sequence parallelism, [tensor] scheme = "megatron_sp" (this file built
 * a second time with DT_MEGATRON_SP, plugins/megatron_sp).
 *
 * The split itself is the model's (core/model/model.h): each rank of a
 * tensor group holds its heads, its share of the MLP and its range of the
 * vocabulary.  This scheme owns the group where their partial results
 * meet, and meets them with one all-reduce each, in place: a row-parallel
 * layer's output in forward (Megatron's g), a column-parallel layer's
 * input gradient in backward (Megatron's f, started and waited so the
 * model overlaps it with the weight gradient), the vocabulary-parallel
 * embedding's output and the parallel cross-entropy's row statistics.
 * Per transformer block and micro-batch that is 2 all-reduces of (B, T,
 * n_embd) in forward and 2 in backward, as in Megatron; the embedding
 * adds one in forward, the LM head one in backward, the cross-entropy two
 * small ones (B*T and 2 B*T f32).  Every wait is bounded by the group's
 * timeout, so a dead peer stops every rank.
 *
 * megatron_sp (Korthikanti et al. 2022) splits each all-reduce around
 * the blocks in its two halves and moves the regions between them (the
 * norms, the residual adds, the embedding's output) onto 1/P of the
 * positions: a column-parallel layer's input is all-gathered in forward
 * and its gradient reduce-scattered in backward; a row-parallel layer's
 * output is reduce-scattered in forward and its gradient all-gathered in
 * backward; the tensors every rank holds whole (norms, biases) have their
 * gradients summed over the group.  A reduce-scatter and an all-gather
 * move what one all-reduce of the whole tensor moves: (P-1)/P of it
 * each on a ring.
 *
 * It counts what it sends: the group's rank 0 logs the traffic at
 * finalize (bench/bench_tensor.sh reads that line): the collectives, the
 * bytes of the tensors they reduce (the whole tensor for a gather or a
 * scatter) and the bytes a rank sends on a ring, 2 (P-1)/P of the tensor
 * for an all-reduce, (P-1)/P for the others.
 */
#include <stdio.h>
#include <string.h>

#include "dtrain/tensor_parallel.h"

struct dt_tensor_group {
    const dt_tensor_ops_v1_t *ops; /* first: the table that made it (dtrain/tensor_parallel.h) */
    const dt_host_v1_t *host;
    dt_comm_t *comm; /* the tensor group */
    int32_t rank, size;
    uint64_t calls;  /* all-reduces so far (messages, the report) */
    uint64_t bytes;  /* their bytes */
    uint64_t gathers, scatters; /* all-gathers and reduce-scatters */
    uint64_t gs_bytes;          /* their whole tensors' bytes */
    double wire;                /* bytes this rank sent on a ring */
};

/* The group's traffic, said once by its rank 0 (bench/bench_tensor.sh
 * reads it): what a run's micro-batches issued, evaluation included. */
static void mg_finalize(dt_tensor_group_t *g)
{
    if (!g)
        return;
    if (g->rank == 0 && (g->calls || g->gathers || g->scatters))
        g->host->log(g->host, DT_LOG_INFO,
                     "tensor group of %d ranks: %llu all-reduces of %llu bytes in all, %llu "
                     "all-gathers and %llu reduce-scatters of %llu bytes in all; %.0f bytes "
                     "sent per rank",
                     g->size, (unsigned long long)g->calls, (unsigned long long)g->bytes,
                     (unsigned long long)g->gathers, (unsigned long long)g->scatters,
                     (unsigned long long)g->gs_bytes, g->wire);
    g->host->free(g->host, g);
}

/* Defined below; every handle this plugin makes starts with it. */
static const dt_tensor_ops_v1_t mg_ops;

static int mg_init(const dt_host_v1_t *host, const dt_tensor_init_v1_t *in,
                   dt_tensor_group_t **out)
{
    *out = NULL;
    dt_tensor_init_v1_t a;
    int rc = dt_args_read(host, "init args", &a, sizeof a, in, DT_TENSOR_INIT_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a.comm)
        return host->set_error(host, DT_ERR_INVALID, "init: NULL comm");
    dt_tensor_group_t *g = host->alloc(host, sizeof *g, DT_TAG_OTHER);
    if (!g)
        return host->set_error(host, DT_ERR_NOMEM, "init: instance");
    memset(g, 0, sizeof *g);
    g->host = host;
    g->ops = &mg_ops;
    g->comm = a.comm;
    if ((rc = dt_comm_ops(a.comm)->rank_size(a.comm, &g->rank, &g->size)) == DT_OK && g->size < 2)
        rc = host->set_error(host, DT_ERR_INVALID, "init: a tensor group of %d rank(s)",
                             g->size);
    if (rc != DT_OK) {
        mg_finalize(g);
        return rc;
    }
    host->log(host, DT_LOG_DEBUG, "tensor rank %d of %d", g->rank, g->size);
    *out = g;
    return DT_OK;
}

static int mg_failed(dt_tensor_group_t *g, int rc)
{
    if (rc != DT_OK) /* the communicator's message names the operation and the peer */
        g->host->log(g->host, DT_LOG_ERROR,
                     "all-reduce %llu of the tensor group (tensor rank %d of %d) failed",
                     (unsigned long long)g->calls, (int)g->rank, (int)g->size);
    return rc;
}

/* One all-reduce of `count` elements over the group, in place: left in
 * flight in *req when req is given, else waited for. */
static int mg_all_reduce(dt_tensor_group_t *g, void *buf, uint64_t count, int dtype, int op,
                         dt_stream_t *stream, dt_comm_req_t **req)
{
    dt_comm_req_t *r = NULL;
    g->calls++;
    g->bytes += count * dt_dtype_size(dtype);
    g->wire += 2.0 * (double)(g->size - 1) / g->size * (double)(count * dt_dtype_size(dtype));
    int rc = dt_comm_ops(g->comm)->all_reduce(g->comm, buf, buf, count, dtype, op, stream, &r);
    if (rc == DT_OK && req) {
        *req = r; /* in flight: column_backward_wait */
        return DT_OK;
    }
    if (rc == DT_OK)
        rc = dt_comm_ops(g->comm)->wait(g->comm, r, -1); /* the group's timeout */
    return mg_failed(g, rc);
}

static int mg_row_forward(dt_tensor_group_t *g, void *buf, uint64_t count, int dtype,
                          dt_stream_t *stream)
{
    return mg_all_reduce(g, buf, count, dtype, DT_OP_SUM, stream, NULL);
}

static int mg_column_backward_start(dt_tensor_group_t *g, void *buf, uint64_t count, int dtype,
                                    dt_stream_t *stream, dt_comm_req_t **req)
{
    *req = NULL;
    return mg_all_reduce(g, buf, count, dtype, DT_OP_SUM, stream, req);
}

static int mg_column_backward_wait(dt_tensor_group_t *g, dt_comm_req_t *req)
{
    if (!req)
        return DT_OK;
    return mg_failed(g, dt_comm_ops(g->comm)->wait(g->comm, req, -1));
}

static int mg_embedding_forward(dt_tensor_group_t *g, void *buf, uint64_t count, int dtype,
                                dt_stream_t *stream)
{
    return mg_all_reduce(g, buf, count, dtype, DT_OP_SUM, stream, NULL);
}

static int mg_xent_reduce(dt_tensor_group_t *g, float *buf, uint64_t count, int op,
                          dt_stream_t *stream)
{
    if (op != DT_OP_SUM && op != DT_OP_MAX)
        return g->host->set_error(g->host, DT_ERR_INVALID,
                                  "xent_reduce: op %d (the row statistics are a maximum or a "
                                  "sum)",
                                  op);
    return mg_all_reduce(g, buf, count, DT_F32, op, stream, NULL);
}

#ifdef DT_MEGATRON_SP
/* ---- sequence parallelism ---- */

static int sp_sequence_parallel(void) { return 1; }

static int sp_failed(dt_tensor_group_t *g, int rc, const char *op)
{
    if (rc != DT_OK)
        g->host->log(g->host, DT_LOG_ERROR,
                     "%s %llu of the tensor group (tensor rank %d of %d) failed", op,
                     (unsigned long long)(g->gathers + g->scatters), (int)g->rank, (int)g->size);
    return rc;
}

/* Count a gather or scatter of a whole tensor P x count. */
static void sp_count(dt_tensor_group_t *g, uint64_t *n, uint64_t count, int dtype)
{
    const uint64_t whole = (uint64_t)g->size * count * dt_dtype_size(dtype);
    (*n)++;
    g->gs_bytes += whole;
    g->wire += (double)(g->size - 1) / g->size * (double)whole;
}

static int sp_gather(dt_tensor_group_t *g, const void *shard, void *full, uint64_t count,
                     int dtype, dt_stream_t *stream)
{
    dt_comm_req_t *r = NULL;
    sp_count(g, &g->gathers, count, dtype);
    int rc = dt_comm_ops(g->comm)->all_gather(g->comm, shard, full, count, dtype, stream, &r);
    if (rc == DT_OK)
        rc = dt_comm_ops(g->comm)->wait(g->comm, r, -1);
    return sp_failed(g, rc, "all-gather");
}

static int sp_scatter(dt_tensor_group_t *g, const void *full, void *shard, uint64_t count,
                      int dtype, dt_stream_t *stream, dt_comm_req_t **req)
{
    dt_comm_req_t *r = NULL;
    sp_count(g, &g->scatters, count, dtype);
    int rc = dt_comm_ops(g->comm)->reduce_scatter(g->comm, full, shard, count, dtype, DT_OP_SUM,
                                                  stream, &r);
    if (rc == DT_OK && req) {
        *req = r; /* in flight: column_backward_wait */
        return DT_OK;
    }
    if (rc == DT_OK)
        rc = dt_comm_ops(g->comm)->wait(g->comm, r, -1);
    return sp_failed(g, rc, "reduce-scatter");
}

static int sp_column_backward_scatter(dt_tensor_group_t *g, const void *full, void *shard,
                                      uint64_t count, int dtype, dt_stream_t *stream,
                                      dt_comm_req_t **req)
{
    *req = NULL;
    return sp_scatter(g, full, shard, count, dtype, stream, req);
}

static int sp_row_forward_scatter(dt_tensor_group_t *g, const void *full, void *shard,
                                  uint64_t count, int dtype, dt_stream_t *stream)
{
    return sp_scatter(g, full, shard, count, dtype, stream, NULL);
}

static int sp_duplicated_grad_reduce(dt_tensor_group_t *g, float *buf, uint64_t count,
                                     dt_stream_t *stream)
{
    return mg_all_reduce(g, buf, count, DT_F32, DT_OP_SUM, stream, NULL);
}

static const dt_tensor_ops_v1_t mg_ops = {
    .info = DT_PLUGIN_INFO_NOKEYS(TENSOR, dt_tensor_ops_v1_t, "megatron_sp", "1.0.0",
                                  "Megatron-LM tensor parallelism with sequence parallelism: "
                                  "the 1D split, the regions between its layers on 1/P of the "
                                  "positions (all-gathers and reduce-scatters)"),
    .init = mg_init,
    .finalize = mg_finalize,
    .row_forward = mg_row_forward,
    .column_backward_start = mg_column_backward_start,
    .column_backward_wait = mg_column_backward_wait,
    .embedding_forward = mg_embedding_forward,
    .xent_reduce = mg_xent_reduce,
    .sequence_parallel = sp_sequence_parallel,
    .column_forward_gather = sp_gather,
    .column_backward_scatter = sp_column_backward_scatter,
    .row_forward_scatter = sp_row_forward_scatter,
    .row_backward_gather = sp_gather,
    .duplicated_grad_reduce = sp_duplicated_grad_reduce,
};
#else
static const dt_tensor_ops_v1_t mg_ops = {
    .info = DT_PLUGIN_INFO_NOKEYS(TENSOR, dt_tensor_ops_v1_t, "megatron", "1.0.0",
                                  "Megatron-LM 1D tensor parallelism: heads, MLP and vocabulary "
                                  "split over the tensor group, partial results all-reduced"),
    .init = mg_init,
    .finalize = mg_finalize,
    .row_forward = mg_row_forward,
    .column_backward_start = mg_column_backward_start,
    .column_backward_wait = mg_column_backward_wait,
    .embedding_forward = mg_embedding_forward,
    .xent_reduce = mg_xent_reduce,
};
#endif

DT_PLUGIN_ENTRY(tensor, 1, dt_tensor_ops_v1_t, &mg_ops)
