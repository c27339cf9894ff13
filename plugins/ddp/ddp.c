/*
 * plugins/ddp/ddp.c - the `ddp` strategy: data parallelism with a full
 * replica of parameters, gradients and optimizer state on every rank, and
 * gradients averaged by bucketed all-reduces that overlap backward.
 *
 * This file: config keys, init/finalize, the planner estimate and the ops
 * table.  The step lives in ddp_step.c, checkpoint state in ddp_state.c.
 */
#include <stdio.h>
#include <string.h>

#include "ddp_internal.h"

static const dt_config_key_t ddp_keys[] = {
    {.name = "bucket_cap_mb",
     .type = DT_CFG_FLOAT,
     .def = "25",
     .min = 0.0,
     .max = 1e6,
     .doc = "gradient bucket size in MiB of f32 gradients (> 0); units are never split"},
    {.name = "reduce_dtype",
     .type = DT_CFG_ENUM,
     .def = "\"fp32\"",
     .choices = "fp32|bf16",
     .doc = "dtype gradients travel in (bf16 halves the bytes)"},
    {.name = "overlap",
     .type = DT_CFG_BOOL,
     .def = "true",
     .doc = "start a bucket's all-reduce during backward (false: all in step)"},
    {.name = "init_check",
     .type = DT_CFG_ENUM,
     .def = "\"checksum\"",
     .choices = "checksum|broadcast",
     .doc = "initial replicas: verify identical by hash, or copy rank 0's"},
    {.name = "stagger_update",
     .type = DT_CFG_BOOL,
     .def = "true",
     .doc = "odd ranks apply each unit's optimizer update at its next forward, so ranks "
            "sharing memory bandwidth do not all update at once (same results)"},
};

/* String key `key` (default: the first choice) as 0 for choice `a`, 1
 * for `b`; anything else is a config error naming both. */
static int read_pair(const dt_host_v1_t *host, const char *key, const char *a, const char *b,
                     int *out)
{
    const char *v;
    int rc = dt_cfg_string(host, key, a, &v);
    if (rc != DT_OK)
        return rc;
    if (strcmp(v, a) != 0 && strcmp(v, b) != 0)
        return host->set_error(host, DT_ERR_CONFIG, "%s = \"%s\": must be \"%s\" or \"%s\"",
                               key, v, a, b);
    *out = strcmp(v, b) == 0;
    return DT_OK;
}

/* The [ddp] table; a key the host did not declare takes its default. */
static int ddp_read_config(const dt_host_v1_t *host, double *bucket_cap_mb,
                           int32_t *reduce_dtype, int32_t *overlap, int32_t *init_broadcast,
                           int32_t *stagger)
{
    double cap;
    int bf16, ov, bc, st;
    int rc = dt_cfg_float(host, "bucket_cap_mb", 25.0, &cap);
    if (rc != DT_OK)
        return rc;
    if (!(cap > 0.0 && cap <= 1e6))
        return host->set_error(host, DT_ERR_CONFIG,
                               "bucket_cap_mb = %g: must be in (0, 1e6] MiB", cap);
    if ((rc = read_pair(host, "reduce_dtype", "fp32", "bf16", &bf16)) != DT_OK ||
        (rc = dt_cfg_bool(host, "overlap", 1, &ov)) != DT_OK ||
        (rc = read_pair(host, "init_check", "checksum", "broadcast", &bc)) != DT_OK ||
        (rc = dt_cfg_bool(host, "stagger_update", 1, &st)) != DT_OK)
        return rc;
    *stagger = st;
    *bucket_cap_mb = cap;
    *reduce_dtype = bf16 ? DT_BF16 : DT_F32;
    *overlap = ov;
    *init_broadcast = bc;
    return DT_OK;
}

static uint64_t cap_bytes_of(double mb)
{
    return (uint64_t)(mb * 1048576.0);
}

/* Bucket spans over `l` for `model` (unit sizes counted as f32 gradient
 * bytes, whatever reduce_dtype says, so switching the wire dtype keeps the
 * same buckets).  `spans` and `bucket_of_unit` have n_units entries. */
static uint32_t plan_buckets(const dt_host_v1_t *host, const dt_model_desc_v1_t *model,
                             double cap_mb, dt_bucket_span_t *spans, uint32_t *bucket_of_unit,
                             int *rc)
{
    uint64_t *bytes = host->alloc(host, ((uint64_t)model->n_units + 1) * sizeof(uint64_t),
                                  DT_TAG_OTHER);
    if (!bytes) {
        *rc = host->set_error(host, DT_ERR_NOMEM, "bucket plan for %u units", model->n_units);
        return 0;
    }
    for (uint32_t u = 0; u < model->n_units; u++)
        bytes[u] = model->units[u].numel * sizeof(float);
    uint32_t nb = dt_bucket_plan(bytes, model->n_units, cap_bytes_of(cap_mb), spans,
                                 bucket_of_unit);
    host->free(host, bytes);
    *rc = DT_OK;
    return nb;
}

static void ddp_finalize(dt_strategy_t *s)
{
    if (!s)
        return;
    const dt_host_v1_t *host = s->dp.host;
    const dt_device_ops_v1_t *d = s->dp.dev_ops;
    if (s->buckets)
        ddp_drain(s, 0); /* frees requests a failed step left behind */
    if (s->dp.dev) {
        if (s->compute && s->compute != (void *)s->master)
            d->free(s->dp.dev, s->compute);
        d->free(s->dp.dev, s->master);
        d->free(s->dp.dev, s->grads);
        d->free(s->dp.dev, s->m);
        d->free(s->dp.dev, s->v);
        d->free(s->dp.dev, s->comm_buf);
        d->free(s->dp.dev, s->norm_slot);
        if (s->ev_grads)
            d->event_destroy(s->dp.dev, s->ev_grads);
        if (s->ev_reduced)
            d->event_destroy(s->dp.dev, s->ev_reduced);
        if (s->comm_stream)
            d->stream_destroy(s->dp.dev, s->comm_stream);
    }
    dt_flat_layout_free(&s->layout, host);
    dt_dp_free(&s->dp);
    host->free(host, s->final_done);
    host->free(host, s->pending);
    host->free(host, s->buckets);
    host->free(host, s->bucket_of_unit);
    host->free(host, s);
}

/* Allocate one flat buffer of the replica; logs what failed. */
static int alloc_flat(dt_strategy_t *s, int dtype, int tag, const char *what, void **out)
{
    return dt_flat_alloc(s->dp.host, s->dp.dev_ops, s->dp.dev, s->dp.cs, &s->layout, dtype, tag,
                         what, out);
}

static int ddp_init_buffers(dt_strategy_t *s)
{
    const dt_host_v1_t *host = s->dp.host;
    const dt_device_ops_v1_t *d = s->dp.dev_ops;
    const dt_model_desc_v1_t *model = s->dp.model;
    uint32_t nu = model->n_units;
    int rc;

    if ((rc = dt_flat_layout_model(&s->layout, host, model, DDP_ALIGN)) != DT_OK)
        return rc;
    if ((rc = alloc_flat(s, DT_F32, DT_TAG_PARAMS, "master params", (void **)&s->master)))
        return rc;
    if (model->param_dtype == DT_BF16) {
        if ((rc = alloc_flat(s, DT_BF16, DT_TAG_PARAMS, "bf16 compute params", &s->compute)))
            return rc;
    } else {
        s->compute = s->master;
    }
    if ((rc = alloc_flat(s, DT_F32, DT_TAG_GRADS, "grads", (void **)&s->grads)))
        return rc;
    if ((rc = alloc_flat(s, DT_F32, DT_TAG_OPTIMIZER,
                         s->dp.optim.kind == DT_OPTIM_ADAMW ? "adamw exp_avg" : "sgd momentum",
                         (void **)&s->m)))
        return rc;
    if (s->dp.optim.kind == DT_OPTIM_ADAMW &&
        (rc = alloc_flat(s, DT_F32, DT_TAG_OPTIMIZER, "adamw exp_avg_sq", (void **)&s->v)))
        return rc;
    if ((rc = d->alloc(s->dp.dev, sizeof(double), DT_TAG_OTHER, (void **)&s->norm_slot)) != DT_OK)
        return rc;

    /* per-unit hook bookkeeping and the buckets */
    uint64_t nu1 = (uint64_t)nu + 1;
    s->final_done = host->alloc(host, nu1, DT_TAG_OTHER);
    s->pending = host->alloc(host, nu1, DT_TAG_OTHER);
    s->bucket_of_unit = host->alloc(host, nu1 * sizeof(uint32_t), DT_TAG_OTHER);
    s->buckets = host->alloc(host, nu1 * sizeof(ddp_bucket_t), DT_TAG_OTHER);
    dt_bucket_span_t *spans = host->alloc(host, nu1 * sizeof(dt_bucket_span_t), DT_TAG_OTHER);
    if (!s->final_done || !s->pending || !s->bucket_of_unit || !s->buckets || !spans) {
        host->free(host, spans);
        return host->set_error(host, DT_ERR_NOMEM, "bookkeeping for %u units", nu);
    }
    memset(s->final_done, 0, nu1);
    memset(s->pending, 0, nu1);
    memset(s->buckets, 0, nu1 * sizeof(ddp_bucket_t));
    s->n_buckets = plan_buckets(host, model, s->bucket_cap_mb, spans, s->bucket_of_unit, &rc);
    if (rc != DT_OK) {
        host->free(host, spans);
        return rc;
    }
    uint64_t max_count = 0;
    for (uint32_t b = 0; b < s->n_buckets; b++) {
        ddp_bucket_t *bk = &s->buckets[b];
        bk->unit_lo = spans[b].unit_lo;
        bk->unit_hi = spans[b].unit_hi;
        bk->off = s->layout.offset[bk->unit_lo];
        bk->count = s->layout.offset[bk->unit_hi + 1] - bk->off;
        bk->n_units = bk->unit_hi - bk->unit_lo + 1;
        if (bk->count > max_count)
            max_count = bk->count;
    }
    host->free(host, spans);

    /* Communication machinery only where there is someone to talk to. */
    if (s->dp.size > 1) {
        if ((rc = d->stream_create(s->dp.dev, &s->comm_stream)) != DT_OK ||
            (rc = d->event_create(s->dp.dev, &s->ev_grads)) != DT_OK ||
            (rc = d->event_create(s->dp.dev, &s->ev_reduced)) != DT_OK) {
            host->log(host, DT_LOG_ERROR, "creating the reduction stream/events failed");
            return rc;
        }
        if (s->reduce_dtype == DT_BF16 && s->n_buckets > 0) {
            s->n_slots = s->n_buckets < DDP_MAX_SLOTS ? s->n_buckets : DDP_MAX_SLOTS;
            s->slot_elems = max_count;
            uint64_t bytes = (uint64_t)s->n_slots * max_count * dt_dtype_size(DT_BF16);
            if ((rc = d->alloc(s->dp.dev, bytes, DT_TAG_COMM, &s->comm_buf)) != DT_OK) {
                host->log(host, DT_LOG_ERROR, "allocating %u bf16 bucket buffers (%llu bytes) "
                          "failed", s->n_slots, (unsigned long long)bytes);
                return rc;
            }
        }
    }
    for (uint32_t k = 0; k < DDP_MAX_SLOTS; k++)
        s->slot_bucket[k] = -1;
    /* the zeroing memsets are queued on the compute stream; make them land
     * before anyone reads state through get_state on another path */
    return d->stream_sync(s->dp.dev, s->dp.cs);
}

static int ddp_init(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args,
                    dt_strategy_t **out)
{
    *out = NULL;
    dt_strategy_t *s = host->alloc(host, sizeof *s, DT_TAG_OTHER);
    if (!s)
        return host->set_error(host, DT_ERR_NOMEM, "init: instance");
    memset(s, 0, sizeof *s);
    int rc = dt_dp_init(&s->dp, host, args, "ddp");
    if (rc == DT_OK)
        rc = ddp_read_config(host, &s->bucket_cap_mb, &s->reduce_dtype, &s->overlap,
                             &s->init_broadcast, &s->stagger);
    s->defer = s->stagger && s->dp.size > 1 && s->dp.rank % 2 == 1;
    if (rc == DT_OK)
        rc = ddp_init_buffers(s);
    if (rc != DT_OK) {
        ddp_finalize(s);
        return rc;
    }
    const dt_model_desc_v1_t *model = s->dp.model;
    host->log(host, DT_LOG_DEBUG,
              "rank %d/%d: %llu parameters in %u units, %u bucket(s) of <= %g MiB, reduce %s%s%s",
              s->dp.rank, s->dp.size, (unsigned long long)model->numel, model->n_units,
              s->n_buckets, s->bucket_cap_mb, dt_dtype_name(s->reduce_dtype),
              s->overlap ? ", overlapped" : "", s->defer ? ", update deferred to next use" : "");
    *out = s;
    return DT_OK;
}

/* Memory per rank, by tag, as init allocates it (same layout, same
 * buckets), so the planner's numbers match the device's peaks:
 *   params     = T * param_bytes, + T * 4 f32 master when param_bytes == 2
 *   grads      = T * grad_bytes (4 for the f32 buffers kernels accumulate
 *                into; the planner passes 4, the ZeRO paper's check 2)
 *   optimizer  = T * optim_bytes - the master copy already counted in params
 *                (optim_bytes = "optimizer state + master copy" per param)
 *   comm       = bf16 reduction: n_slots * largest bucket * 2; f32 reduces
 *                in place, nothing extra
 *   activations= act_bytes (micro-batches run one after another)
 *   other      = one double for the norm (+ the replica check's scratch)
 * T = the model's numel plus the 64-byte alignment between unit slices. */
static int ddp_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,
                        dt_estimate_v1_t *res)
{
    dt_estimate_args_v1_t a;
    dt_model_desc_v1_t model_desc = {.struct_size = sizeof(dt_model_desc_v1_t)};
    int rc = dt_dp_estimate_read(host, in, &a, &model_desc);
    if (rc != DT_OK)
        return rc;
    const dt_estimate_args_v1_t *args = &a;
    dt_estimate_v1_t est, *out = &est;
    dt_estimate_begin(out);
    double cap_mb;
    int32_t rdt, overlap, bcast, stagger;
    rc = ddp_read_config(host, &cap_mb, &rdt, &overlap, &bcast, &stagger);
    if (rc != DT_OK)
        return rc;
    const dt_model_desc_v1_t *model = args->model;
    dt_flat_layout_t l;
    if ((rc = dt_flat_layout_model(&l, host, model, DDP_ALIGN)) != DT_OK)
        return rc;
    uint64_t T = l.total;
    uint64_t nu1 = (uint64_t)model->n_units + 1;
    dt_bucket_span_t *spans = host->alloc(host, nu1 * sizeof *spans, DT_TAG_OTHER);
    if (!spans) {
        dt_flat_layout_free(&l, host);
        return host->set_error(host, DT_ERR_NOMEM, "estimate: bucket plan");
    }
    uint32_t nb = plan_buckets(host, model, cap_mb, spans, NULL, &rc);
    uint64_t max_count = 0;
    for (uint32_t b = 0; b < nb; b++) {
        uint64_t c = l.offset[spans[b].unit_hi + 1] - l.offset[spans[b].unit_lo];
        if (c > max_count)
            max_count = c;
    }
    host->free(host, spans);
    dt_flat_layout_free(&l, host);
    if (rc != DT_OK)
        return rc;

    int32_t n = args->group_size;
    dt_dp_estimate_state(args, T, T, T, out);
    if (n > 1 && rdt == DT_BF16 && nb > 0) {
        uint64_t slots = nb < DDP_MAX_SLOTS ? nb : DDP_MAX_SLOTS;
        out->bytes[DT_TAG_COMM] = slots * max_count * 2;
    }
    out->bytes[DT_TAG_OTHER] = sizeof(double) +
                               (n > 1 && !bcast ? 3ull * 4 * sizeof(float) * model->n_units : 0);
    /* ring all-reduce: each rank sends 2 (n-1)/n of the buffer */
    uint64_t rbytes = dt_dtype_size(rdt);
    out->comm_bytes_per_step =
        n > 1 ? (uint64_t)((2.0 * (double)(n - 1) / (double)n) * (double)(T * rbytes)) : 0;
    snprintf(out->note, sizeof out->note,
             "full replica per rank; grads all-reduced in %u bucket(s) <= %g MiB, %s%s%s", nb,
             cap_mb, rdt == DT_BF16 ? "bf16" : "fp32",
             n > 1 ? (overlap ? ", overlapped with backward" : ", in step") : ", 1 rank: none",
             n > 1 && stagger ? "; odd ranks update at next use" : "");
    return dt_result_write(host, "estimate", res, out, sizeof *out, DT_ESTIMATE_V1_SIZE0);
}

static const dt_strategy_ops_v1_t ddp_ops = {
    .info = DT_PLUGIN_INFO(STRATEGY, dt_strategy_ops_v1_t, "ddp", "0.1.0",
                           "data parallel: full replica, bucketed gradient all-reduce",
                           ddp_keys),
    .init = ddp_init,
    .finalize = ddp_finalize,
    .begin_step = ddp_begin_step,
    .pre_forward = ddp_pre_forward,
    .post_forward = ddp_post_forward,
    .pre_backward = ddp_pre_backward,
    .post_backward = ddp_post_backward,
    .step = ddp_step,
    .state_ranges = ddp_state_ranges,
    .get_state = ddp_get_state,
    .set_state = ddp_set_state,
    .state_loaded = ddp_state_loaded,
    .estimate = ddp_estimate,
};

DT_PLUGIN_ENTRY(strategy, 1, dt_strategy_ops_v1_t, &ddp_ops)
