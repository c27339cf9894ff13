/*
 * plugins/tensor/tensor.c - the `tensor` strategy: Megatron-LM's tensor
 * parallelism, chosen by [parallel] tensor = P > 1.
 *
 * The split itself is the model's (core/model/model.h): each rank of a
 * tensor group holds its heads, its share of the MLP and its range of the
 * vocabulary, and the layers say where their partial results meet.  This
 * strategy owns the group they meet over: reduce_activation all-reduces a
 * row-parallel layer's output in forward, a column-parallel layer's input
 * gradient in backward and the parallel cross-entropy's row statistics,
 * each bounded by the group's timeout so a dead peer stops every rank.
 * Per transformer block and micro-batch that is 2 all-reduces of
 * (B, T, n_embd) in forward and 2 in backward, as in Megatron; the
 * vocabulary-parallel embedding adds one in forward, the LM head one in
 * backward, the cross-entropy two small ones (B*T and 2 B*T f32).
 *
 * It holds no parameters (sdk/no_params.h): every rank's data strategy
 * holds that rank's parts, reduced over the ranks holding the same parts.
 */
#include <stdio.h>
#include <string.h>

#include "dtrain/sdk/no_params.h"
#include "dtrain/strategy.h"

struct dt_strategy {
    const dt_host_v1_t *host;
    const dt_comm_ops_v1_t *comm_ops;
    dt_comm_t *comm; /* the tensor group */
    int32_t rank, size;
    uint64_t calls;  /* all-reduces so far (messages, the report) */
    uint64_t bytes;  /* their bytes */
};

/* The group's traffic, said once by its rank 0 (bench/bench_tensor.sh
 * reads it): what a run's micro-batches issued, evaluation included. */
static void tp_finalize(dt_strategy_t *s)
{
    if (!s)
        return;
    if (s->rank == 0 && s->calls)
        s->host->log(s->host, DT_LOG_INFO,
                     "tensor group of %d ranks: %llu all-reduces of %llu bytes in all", s->size,
                     (unsigned long long)s->calls, (unsigned long long)s->bytes);
    s->host->free(s->host, s);
}

static int tp_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *in,
                   dt_strategy_t **out)
{
    *out = NULL;
    dt_strategy_init_v1_t a;
    int rc = dt_args_read(host, "init args", &a, sizeof a, in, DT_STRATEGY_INIT_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if ((rc = dt_no_params_init_check(host, &a, "the tensor strategy")) != DT_OK)
        return rc;
    dt_strategy_t *s = host->alloc(host, sizeof *s, DT_TAG_OTHER);
    if (!s)
        return host->set_error(host, DT_ERR_NOMEM, "init: instance");
    memset(s, 0, sizeof *s);
    s->host = host;
    s->comm_ops = a.comm_ops;
    s->comm = a.comm;
    if ((rc = a.comm_ops->rank_size(a.comm, &s->rank, &s->size)) == DT_OK && s->size < 2)
        rc = host->set_error(host, DT_ERR_INVALID, "init: a tensor group of %d rank(s)",
                             s->size);
    if (rc != DT_OK) {
        tp_finalize(s);
        return rc;
    }
    host->log(host, DT_LOG_DEBUG, "tensor rank %d of %d", s->rank, s->size);
    *out = s;
    return DT_OK;
}

static int tp_failed(dt_strategy_t *s, int rc)
{
    if (rc != DT_OK) /* the communicator's message names the operation and the peer */
        s->host->log(s->host, DT_LOG_ERROR,
                     "all-reduce %llu of the tensor group (tensor rank %d of %d) failed",
                     (unsigned long long)s->calls, (int)s->rank, (int)s->size);
    return rc;
}

static int tp_reduce_activation(dt_strategy_t *s, void *buf, uint64_t count, int dtype, int op,
                                dt_stream_t *stream, dt_comm_req_t **req)
{
    dt_comm_req_t *r = NULL;
    s->calls++;
    s->bytes += count * dt_dtype_size(dtype);
    int rc = s->comm_ops->all_reduce(s->comm, buf, buf, count, dtype, op, stream, &r);
    if (rc == DT_OK && req) {
        *req = r; /* in flight: wait_activation */
        return DT_OK;
    }
    if (rc == DT_OK)
        rc = s->comm_ops->wait(s->comm, r, -1); /* the group's timeout */
    return tp_failed(s, rc);
}

static int tp_wait_activation(dt_strategy_t *s, dt_comm_req_t *req)
{
    return tp_failed(s, s->comm_ops->wait(s->comm, req, -1));
}

DT_NO_PARAMS_SLOTS(tp, "the tensor strategy", s->host)

/* The planner's tensor rows are the core's, from the model's layout
 * (which tensors are split, how many all-reduces a micro-batch runs). */
DT_NO_PARAMS_ESTIMATE(tp, "ranks hold their parts; 2 + 2 activation all-reduces per block")

static const dt_strategy_ops_v1_t tp_ops = {
    .info = DT_PLUGIN_INFO_NOKEYS(STRATEGY, dt_strategy_ops_v1_t, "tensor", "0.1.0",
                                  "tensor parallel (Megatron-LM): heads, MLP and vocabulary "
                                  "split over the tensor group, activations all-reduced"),
    .init = tp_init,
    .finalize = tp_finalize,
    .begin_step = tp_begin_step,
    .pre_forward = tp_pre_forward,
    .post_forward = tp_post_forward,
    .pre_backward = tp_pre_backward,
    .post_backward = tp_post_backward,
    .step = tp_step,
    .state_ranges = tp_state_ranges,
    .get_state = tp_get_state,
    .set_state = tp_set_state,
    .state_loaded = tp_state_loaded,
    .estimate = tp_estimate,
    .reduce_activation = tp_reduce_activation,
    .wait_activation = tp_wait_activation,
};

DT_PLUGIN_ENTRY(strategy, 1, dt_strategy_ops_v1_t, &tp_ops)
