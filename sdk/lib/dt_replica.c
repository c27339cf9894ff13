/*
 * sdk/lib/dt_replica.c - the replica machinery's configuration, setting a
 * replica up (flat buffers, buckets, the reduction stream) and freeing it,
 * and the planner's estimate of what it allocates.  Gradients and their
 * buckets: dt_replica_reduce.c; the update: dt_replica_step.c; state by
 * range and the init check: dt_replica_state.c.
 */
#include "dtrain/sdk/replica.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/sdk/buckets.h"
#include "dtrain/sdk/cfg.h"

/* ------------------------------------------------------------ config */

/* The replica's keys.  A strategy declares those it offers (the host then
 * fills their defaults); one it does not declare takes the default written
 * in these macros, so each is written once. */
static const dt_config_key_t replica_keys[] = {
    DT_REPLICA_KEY_BUCKET_CAP_MB,
    DT_REPLICA_KEY_REDUCE_DTYPE,
    DT_REPLICA_KEY_OVERLAP,
    DT_REPLICA_KEY_INIT_CHECK,
};
enum { KEY_CAP, KEY_DTYPE, KEY_OVERLAP, KEY_INIT };

/* Whether the strategy declared `key` (the host knows it, whatever its
 * type). */
static int declared(const dt_host_v1_t *host, const char *key)
{
    const char *v = NULL;
    return host->cfg_string(host, key, &v) != DT_ERR_NOT_FOUND;
}

/* Whether string key k's declared default (TOML: "\"fp32\"") is `v`. */
static int default_is(const dt_config_key_t *k, const char *v)
{
    size_t n = strlen(v);
    return k->def[0] == '"' && strncmp(k->def + 1, v, n) == 0 &&
           strcmp(k->def + 1 + n, "\"") == 0;
}

int dt_replica_read_config(const dt_host_v1_t *host, dt_replica_cfg_t *cfg)
{
    static const int dtypes[] = {DT_F32, DT_BF16, DT_F16};
    double cap = strtod(replica_keys[KEY_CAP].def, NULL);
    int rdt = DT_F32, ov = strcmp(replica_keys[KEY_OVERLAP].def, "true") == 0;
    int bc = default_is(&replica_keys[KEY_INIT], "broadcast");
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (default_is(&replica_keys[KEY_DTYPE], dt_cfg_reduce_dtype_name(dtypes[i])))
            rdt = dtypes[i];
    memset(cfg, 0, sizeof *cfg);
    int rc = DT_OK;
    if (declared(host, "bucket_cap_mb")) {
        if ((rc = dt_cfg_float(host, "bucket_cap_mb", &cap)) != DT_OK)
            return rc;
        /* narrower than the declared range [0, 1e6]: 0 is no bucket size */
        if (!(cap > 0.0 && cap <= 1e6))
            return host->set_error(host, DT_ERR_CONFIG,
                                   "bucket_cap_mb = %g: must be in (0, 1e6] MiB", cap);
    }
    if ((declared(host, "reduce_dtype") && (rc = dt_cfg_reduce_dtype(host, &rdt)) != DT_OK) ||
        (declared(host, "overlap") && (rc = dt_cfg_bool(host, "overlap", &ov)) != DT_OK) ||
        (declared(host, "init_check") &&
         (rc = dt_cfg_enum(host, "init_check", replica_keys[KEY_INIT].choices, &bc)) != DT_OK))
        return rc;
    cfg->bucket_cap_mb = cap;
    cfg->reduce_grads = 1;
    cfg->reduce_dtype = rdt;
    cfg->overlap = ov;
    cfg->init_broadcast = bc;
    return DT_OK;
}

/* Bucket spans for `model` (unit sizes counted as f32 gradient bytes,
 * whatever reduce_dtype says, so switching the wire dtype keeps the same
 * buckets).  `spans` and `bucket_of_unit` (may be NULL) have n_units
 * entries. */
static int plan_buckets(const dt_host_v1_t *host, const dt_model_desc_v1_t *model,
                        double cap_mb, dt_bucket_span_t *spans, uint32_t *bucket_of_unit,
                        uint32_t *n_buckets)
{
    uint64_t *bytes = host->alloc(host, ((uint64_t)model->n_units + 1) * sizeof(uint64_t),
                                  DT_TAG_OTHER);
    if (!bytes)
        return host->set_error(host, DT_ERR_NOMEM, "bucket plan for %u units", model->n_units);
    for (uint32_t u = 0; u < model->n_units; u++)
        bytes[u] = model->units[u].numel * sizeof(float);
    *n_buckets = dt_bucket_plan(bytes, model->n_units, (uint64_t)(cap_mb * 1048576.0), spans,
                                bucket_of_unit);
    host->free(host, bytes);
    return DT_OK;
}

/* ------------------------------------------------------------ lifecycle */

static void free_reduced(dt_replica_t *r, void *p, uint8_t sym);

void dt_replica_free(dt_replica_t *r)
{
    if (!r || !r->dp.host)
        return;
    const dt_host_v1_t *host = r->dp.host;
    const dt_device_ops_v1_t *d = dt_device_ops(r->dp.dev);
    if (r->buckets)
        dt_replica_drain(r, 0); /* frees requests a failed step left behind */
    if (r->dp.dev) {
        if (r->compute && r->compute != (void *)r->master)
            d->free(r->dp.dev, r->compute);
        d->free(r->dp.dev, r->master);
        free_reduced(r, r->grads, r->sym_grads);
        d->free(r->dp.dev, r->m);
        d->free(r->dp.dev, r->v);
        free_reduced(r, r->comm_buf, r->sym_comm_buf);
        d->free(r->dp.dev, r->norm_slot);
        dt_offload_state_free(&r->off);
        if (r->ev_grads)
            d->event_destroy(r->dp.dev, r->ev_grads);
        if (r->ev_reduced)
            d->event_destroy(r->dp.dev, r->ev_reduced);
        if (r->comm_stream)
            d->stream_destroy(r->dp.dev, r->comm_stream);
    }
    dt_flat_layout_free(&r->layout, host);
    dt_dp_free(&r->dp);
    host->free(host, r->final_done);
    host->free(host, r->buckets);
    host->free(host, r->bucket_of_unit);
    memset(r, 0, sizeof *r);
}

/* One flat buffer of the replica, zeroed; logs what failed. */
static int alloc_flat(dt_replica_t *r, int dtype, int tag, const char *what, void **out)
{
    return dt_flat_alloc(r->dp.host, r->dp.dev, r->dp.cs, &r->layout, dtype, tag,
                         what, out);
}

/* A buffer the group all-reduces in place: in its symmetric memory where
 * it has some (dt_dp_alloc_shared), else device memory. */
static int alloc_reduced(dt_replica_t *r, uint64_t bytes, int tag, const char *what,
                         void **out, uint8_t *sym)
{
    dt_comm_t *comm = r->cfg.reduce_grads && r->dp.size > 1 ? r->dp.comm : NULL;
    return dt_dp_alloc_shared(&r->dp, comm, bytes, tag, what, out, sym);
}

static void free_reduced(dt_replica_t *r, void *p, uint8_t sym)
{
    dt_dp_free_shared(&r->dp, r->dp.comm, p, sym);
}

/* The f32 gradients: all-reduced in place bucket by bucket when
 * reduce_dtype is f32. */
static int alloc_grads(dt_replica_t *r)
{
    if (r->cfg.reduce_dtype != DT_F32)
        return alloc_flat(r, DT_F32, DT_TAG_GRADS, "grads", (void **)&r->grads);
    return alloc_reduced(r, r->layout.total * sizeof(float), DT_TAG_GRADS, "grads",
                         (void **)&r->grads, &r->sym_grads);
}


static int alloc_state(dt_replica_t *r)
{
    const dt_model_desc_v1_t *model = r->dp.model;
    int rc;
    if ((rc = dt_flat_layout_model(&r->layout, r->dp.host, model, DT_REPLICA_ALIGN)) != DT_OK)
        return rc;
    if (dt_replica_offloaded(r)) {
        /* the master and the moments live in the tier; the device keeps
         * what kernels read and the gradients */
        if ((rc = dt_offload_state_init(&r->off, r->dp.host, &r->dp.args.init, r->dp.rank,
                                        r->layout.total, dt_replica_has_v(r), NULL)) ||
            (rc = alloc_flat(r, model->param_dtype, DT_TAG_PARAMS, "compute params",
                             &r->compute)) ||
            (rc = alloc_grads(r)))
            return rc;
        return dt_device_ops(r->dp.dev)->alloc(r->dp.dev, sizeof(double), DT_TAG_OTHER,
                                    (void **)&r->norm_slot);
    }
    if ((rc = alloc_flat(r, DT_F32, DT_TAG_PARAMS, "master params", (void **)&r->master)))
        return rc;
    if (model->param_dtype != DT_F32) {
        if ((rc = alloc_flat(r, model->param_dtype, DT_TAG_PARAMS, "16-bit compute params",
                             &r->compute)))
            return rc;
    } else {
        r->compute = r->master;
    }
    if ((rc = alloc_grads(r)))
        return rc;
    if ((rc = alloc_flat(r, DT_F32, DT_TAG_OPTIMIZER,
                         r->dp.optim.kind == DT_OPTIM_ADAMW ? "adamw exp_avg" : "sgd momentum",
                         (void **)&r->m)))
        return rc;
    if (r->dp.optim.kind == DT_OPTIM_ADAMW &&
        (rc = alloc_flat(r, DT_F32, DT_TAG_OPTIMIZER, "adamw exp_avg_sq", (void **)&r->v)))
        return rc;
    r->norm_copies = dt_dp_has_norm_copies(&r->dp);
    return dt_device_ops(r->dp.dev)->alloc(r->dp.dev, sizeof(double), DT_TAG_OTHER,
                                           (void **)&r->norm_slot);
}

/* The buckets over the layout and, where there is someone to talk to, the
 * reduction stream, its events and the 16-bit slots. */
static int make_buckets(dt_replica_t *r)
{
    const dt_host_v1_t *host = r->dp.host;
    const dt_device_ops_v1_t *d = dt_device_ops(r->dp.dev);
    uint32_t nu = r->dp.model->n_units;
    uint64_t nu1 = (uint64_t)nu + 1;
    r->bucket_of_unit = host->alloc(host, nu1 * sizeof(uint32_t), DT_TAG_OTHER);
    r->buckets = host->alloc(host, nu1 * sizeof(dt_replica_bucket_t), DT_TAG_OTHER);
    dt_bucket_span_t *spans = host->alloc(host, nu1 * sizeof(dt_bucket_span_t), DT_TAG_OTHER);
    if (!r->bucket_of_unit || !r->buckets || !spans) {
        host->free(host, spans);
        return host->set_error(host, DT_ERR_NOMEM, "buckets for %u units", nu);
    }
    memset(r->buckets, 0, nu1 * sizeof(dt_replica_bucket_t));
    int rc = plan_buckets(host, r->dp.model, r->cfg.bucket_cap_mb, spans, r->bucket_of_unit,
                          &r->n_buckets);
    if (rc != DT_OK) {
        host->free(host, spans);
        return rc;
    }
    uint64_t max_count = 0;
    for (uint32_t b = 0; b < r->n_buckets; b++) {
        dt_replica_bucket_t *bk = &r->buckets[b];
        bk->unit_lo = spans[b].unit_lo;
        bk->unit_hi = spans[b].unit_hi;
        bk->off = r->layout.offset[bk->unit_lo];
        bk->count = r->layout.offset[bk->unit_hi + 1] - bk->off;
        /* the units that report their last use: a pipeline stage's own
         * (another stage's are never hooked here; counting them would keep
         * the bucket from starting before the step) */
        bk->n_units = 0;
        for (uint32_t u = bk->unit_lo; u <= bk->unit_hi; u++)
            bk->n_units += (dt_dp_unit_flags(&r->dp, u) & DT_UNIT_HELD) != 0;
        if (bk->count > max_count)
            max_count = bk->count;
    }
    host->free(host, spans);
    if (r->dp.size == 1)
        return DT_OK;
    if ((rc = d->stream_create(r->dp.dev, &r->comm_stream)) != DT_OK ||
        (rc = d->event_create(r->dp.dev, &r->ev_grads)) != DT_OK ||
        (rc = d->event_create(r->dp.dev, &r->ev_reduced)) != DT_OK) {
        host->log(host, DT_LOG_ERROR, "creating the reduction stream/events failed");
        return rc;
    }
    if (r->cfg.reduce_dtype != DT_F32 && r->n_buckets > 0) {
        r->n_slots = r->n_buckets < DT_REPLICA_MAX_SLOTS ? r->n_buckets : DT_REPLICA_MAX_SLOTS;
        r->slot_elems = max_count;
        uint64_t bytes = (uint64_t)r->n_slots * max_count * dt_dtype_size(r->cfg.reduce_dtype);
        char what[64];
        snprintf(what, sizeof what, "%u %s bucket buffers", r->n_slots,
                 dt_dtype_name(r->cfg.reduce_dtype));
        if ((rc = alloc_reduced(r, bytes, DT_TAG_COMM, what, &r->comm_buf,
                                &r->sym_comm_buf)) != DT_OK)
            return rc;
    }
    return DT_OK;
}

int dt_replica_init(dt_replica_t *r, const dt_strategy_ops_v1_t *ops, const dt_host_v1_t *host,
                    const dt_strategy_init_v1_t *args, const dt_replica_cfg_t *cfg,
                    const char *what)
{
    memset(r, 0, sizeof *r);
    r->cfg = *cfg;
    for (uint32_t k = 0; k < DT_REPLICA_MAX_SLOTS; k++)
        r->slot_bucket[k] = -1;
    int rc = dt_dp_init(&r->dp, ops, host, args, what);
    if (rc == DT_OK)
        rc = dt_offload_what(host, &r->dp.args.init, 0, what, &r->offload_what);
    if (rc == DT_OK)
        rc = alloc_state(r);
    if (rc == DT_OK) {
        uint64_t nu1 = (uint64_t)r->dp.model->n_units + 1;
        if (!(r->final_done = host->alloc(host, nu1, DT_TAG_OTHER)))
            rc = host->set_error(host, DT_ERR_NOMEM, "bookkeeping for %u units",
                                 r->dp.model->n_units);
        else
            memset(r->final_done, 0, nu1);
    }
    if (rc == DT_OK && r->cfg.reduce_grads)
        rc = make_buckets(r);
    /* the zeroing memsets are queued on the compute stream; make them land
     * before anyone reads state through get_state on another path */
    if (rc == DT_OK)
        rc = dt_device_ops(r->dp.dev)->stream_sync(r->dp.dev, r->dp.cs);
    if (rc != DT_OK) {
        dt_replica_free(r);
        return rc;
    }
    return DT_OK;
}

/* ------------------------------------------------------------ estimate */

int dt_replica_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *args,
                        const dt_replica_cfg_t *cfg, dt_estimate_v1_t *out,
                        uint32_t *n_buckets)
{
    const dt_model_desc_v1_t *model = args->model;
    dt_flat_layout_t l;
    int rc = dt_flat_layout_model(&l, host, model, DT_REPLICA_ALIGN);
    if (rc != DT_OK)
        return rc;
    uint64_t T = l.total;
    uint64_t nu1 = (uint64_t)model->n_units + 1;
    uint32_t nb = 0;
    uint64_t max_count = 0;
    dt_bucket_span_t *spans = host->alloc(host, nu1 * sizeof *spans, DT_TAG_OTHER);
    if (!spans)
        rc = host->set_error(host, DT_ERR_NOMEM, "estimate: bucket plan");
    if (rc == DT_OK && cfg->reduce_grads)
        rc = plan_buckets(host, model, cfg->bucket_cap_mb, spans, NULL, &nb);
    for (uint32_t b = 0; rc == DT_OK && b < nb; b++) {
        uint64_t c = l.offset[spans[b].unit_hi + 1] - l.offset[spans[b].unit_lo];
        if (c > max_count)
            max_count = c;
    }
    host->free(host, spans);
    dt_flat_layout_free(&l, host);
    if (rc != DT_OK)
        return rc;

    int32_t n = args->group_size;
    int reduces = cfg->reduce_grads && n > 1;
    dt_dp_estimate_state(args, T, T, T, out);
    if (DT_HAS_FIELD(dt_estimate_args_v1_t, args, offload) && args->offload) {
        uint32_t what = 0;
        if ((rc = dt_offload_what_plan(host, 0, "a replica strategy (ddp)", &what)) != DT_OK)
            return rc;
        dt_offload_estimate(args, what, T, 0, out);
    }
    if (reduces && cfg->reduce_dtype != DT_F32 && nb > 0) {
        uint64_t slots = nb < DT_REPLICA_MAX_SLOTS ? nb : DT_REPLICA_MAX_SLOTS;
        out->bytes[DT_TAG_COMM] = slots * max_count * 2;
    }
    out->bytes[DT_TAG_OTHER] =
        sizeof(double) +
        (n > 1 && !cfg->init_broadcast ? 3ull * 4 * sizeof(float) * model->n_units : 0);
    /* ring all-reduce: each rank sends 2 (n-1)/n of the buffer */
    uint64_t rbytes = dt_dtype_size(cfg->reduce_dtype);
    out->comm_bytes_per_step =
        reduces ? (uint64_t)((2.0 * (double)(n - 1) / (double)n) * (double)(T * rbytes)) : 0;
    if (n_buckets)
        *n_buckets = nb;
    return DT_OK;
}
