/*
 * plugins/megatron/megatron.c - the `megatron` tensor-parallel scheme
 * (dtrain/tensor_parallel.h): Megatron-LM's 1D tensor parallelism, chosen
 * by [tensor] scheme = "megatron" (the default) when [parallel] tensor =
 * P > 1.
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
 * It counts what it sends: the group's rank 0 logs the traffic at
 * finalize (bench/bench_tensor.sh reads that line).
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
};

/* The group's traffic, said once by its rank 0 (bench/bench_tensor.sh
 * reads it): what a run's micro-batches issued, evaluation included. */
static void mg_finalize(dt_tensor_group_t *g)
{
    if (!g)
        return;
    if (g->rank == 0 && g->calls)
        g->host->log(g->host, DT_LOG_INFO,
                     "tensor group of %d ranks: %llu all-reduces of %llu bytes in all", g->size,
                     (unsigned long long)g->calls, (unsigned long long)g->bytes);
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

DT_PLUGIN_ENTRY(tensor, 1, dt_tensor_ops_v1_t, &mg_ops)
