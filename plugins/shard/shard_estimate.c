/*
 * plugins/shard/shard_estimate.c - the planner's estimate for the sharded
 * engine, without a device or a communicator.
 *
 * Persistent state (parameters, gradients, optimizer) follows from the
 * plan by formula.  The transient buffers (gathered groups, gradient
 * buffers of groups in backward) depend on the schedule: prefetching,
 * resharding, nesting, reductions in flight.  Rather than a second model
 * of that schedule which could drift from the first, the estimate runs
 * the engine itself through one step of the core's hook order against a
 * device that only counts tagged bytes (its "memory" is address
 * arithmetic, never touched) and a communicator that only counts what
 * this rank would send.
 */
#include <stdio.h>
#include <string.h>

#include "dtrain/sdk/cfg.h"
#include "shard_internal.h"

/* ------------------------------------------------ a counting device */

typedef struct est_blk {
    uint64_t addr, bytes;
    int32_t tag, reserved0;
} est_blk_t;

struct dt_device {
    const dt_device_ops_v1_t *ops; /* first: the table that made it (dtrain/device.h) */
    const dt_host_v1_t *host;
    uint64_t next;        /* next fake address */
    est_blk_t *blk;       /* live allocations */
    uint32_t n, cap;
    dt_mem_stats_t st;
};

static char est_token; /* streams, events and requests all point here */

static int ed_alloc(dt_device_t *d, uint64_t bytes, int tag, void **out)
{
    if (tag < 0 || tag >= DT_TAG_COUNT)
        return d->host->set_error(d->host, DT_ERR_INVALID, "estimate: alloc tag %d", tag);
    if (d->n == d->cap) {
        uint32_t cap = d->cap ? 2 * d->cap : 64;
        est_blk_t *b = d->host->alloc(d->host, (uint64_t)cap * sizeof *b, DT_TAG_OTHER);
        if (!b)
            return d->host->set_error(d->host, DT_ERR_NOMEM, "estimate: allocation table");
        if (d->n)
            memcpy(b, d->blk, d->n * sizeof *b);
        d->host->free(d->host, d->blk);
        d->blk = b;
        d->cap = cap;
    }
    d->blk[d->n++] = (est_blk_t){.addr = d->next, .bytes = bytes, .tag = tag};
    *out = (void *)(uintptr_t)d->next;
    /* distinct, 64-byte aligned, never dereferenced */
    d->next += (bytes + 127) / 64 * 64;
    d->st.current[tag] += bytes;
    if (d->st.current[tag] > d->st.peak[tag])
        d->st.peak[tag] = d->st.current[tag];
    d->st.total_current += bytes;
    if (d->st.total_current > d->st.total_peak)
        d->st.total_peak = d->st.total_current;
    return DT_OK;
}

static int ed_free(dt_device_t *d, void *p)
{
    if (!p)
        return DT_OK;
    for (uint32_t i = d->n; i-- > 0;)
        if (d->blk[i].addr == (uint64_t)(uintptr_t)p) {
            d->st.current[d->blk[i].tag] -= d->blk[i].bytes;
            d->st.total_current -= d->blk[i].bytes;
            d->blk[i] = d->blk[--d->n];
            return DT_OK;
        }
    return d->host->set_error(d->host, DT_ERR_INVALID, "estimate: free of an unknown pointer");
}

static int ed_ok_stream(dt_device_t *d, dt_stream_t **out)
{
    *out = (dt_stream_t *)(void *)&est_token;
    return DT_OK;
}
static int ed_ok_s(dt_device_t *d, dt_stream_t *s) { return DT_OK; }
static int ed_ok_event(dt_device_t *d, dt_event_t **out)
{
    *out = (dt_event_t *)(void *)&est_token;
    return DT_OK;
}
static int ed_ok_e(dt_device_t *d, dt_event_t *e) { return DT_OK; }
static int ed_ok_es(dt_device_t *d, dt_event_t *e, dt_stream_t *s)
{
    return DT_OK;
}
static int ed_ok_se(dt_device_t *d, dt_stream_t *s, dt_event_t *e)
{
    return DT_OK;
}
static int ed_memcpy(dt_device_t *d, void *dst, const void *src, uint64_t bytes, int kind,
                     dt_stream_t *s)
{
    return DT_OK;
}
static int ed_memset(dt_device_t *d, void *dst, int v, uint64_t bytes, dt_stream_t *s)
{
    return DT_OK;
}
static int ed_axpy(dt_device_t *d, dt_stream_t *s, void *y, const void *x, int dt, float a,
                   int64_t n)
{
    return DT_OK;
}
static int ed_adamw(dt_device_t *d, dt_stream_t *s, float *p, const void *g, float *m, float *v,
                    int gdt, int64_t n, float lr, float b1, float b2, float eps, float wd,
                    float gs, int64_t t)
{
    return DT_OK;
}
static int ed_sgd(dt_device_t *d, dt_stream_t *s, float *p, const void *g, float *mom, int gdt,
                  int64_t n, float lr, float mu, float wd, int nest, float gs)
{
    return DT_OK;
}
static int ed_sumsq(dt_device_t *d, dt_stream_t *s, double *out, const void *x, int dt,
                    int64_t n)
{
    return DT_OK;
}
static int ed_cast(dt_device_t *d, dt_stream_t *s, void *dst, int ddt, const void *src,
                   int sdt, int64_t n)
{
    return DT_OK;
}

/* Only what the engine calls; the rest stays NULL. */
static const dt_kernels_v1_t est_kernels = {
    .info = DT_KERNELS_INFO(dt_kernels_v1_t),
    .axpy = ed_axpy,
    .adamw_update = ed_adamw,
    .sgd_update = ed_sgd,
    .sumsq = ed_sumsq,
    .cast = ed_cast,
};
static const dt_kernels_v1_t *ed_kernels(void) { return &est_kernels; }

static const dt_device_ops_v1_t est_dev_ops = {
    .info = {.abi_major = DT_DEVICE_ABI_MAJOR, .abi_minor = DT_DEVICE_ABI_MINOR,
             .struct_size = sizeof(dt_device_ops_v1_t), .kind = DT_KIND_DEVICE,
             .name = "estimate"},
    .kernels = ed_kernels,
    .alloc = ed_alloc,
    .free = ed_free,
    .stream_create = ed_ok_stream,
    .stream_destroy = ed_ok_s,
    .stream_sync = ed_ok_s,
    .event_create = ed_ok_event,
    .event_destroy = ed_ok_e,
    .event_record = ed_ok_es,
    .stream_wait_event = ed_ok_se,
    .memcpy_async = ed_memcpy,
    .memset_async = ed_memset,
};

/* ------------------------------------------------ a counting comm */

typedef struct est_count {
    int counting;
    double bytes; /* sent by rank 0 of every group it belongs to */
} est_count_t;

struct dt_comm {
    const dt_comm_ops_v1_t *ops; /* first: the table that made it (dtrain/comm.h) */
    const dt_host_v1_t *host;
    int32_t size;
    int32_t owned;       /* a split: freed by finalize */
    est_count_t *count;
    uint32_t shard;      /* the engine's shard group size (for splits) */
    uint32_t n_splits;
};

static void ec_add(dt_comm_t *c, double bytes, dt_comm_req_t **req)
{
    if (c->count->counting)
        c->count->bytes += bytes;
    if (req)
        *req = (dt_comm_req_t *)(void *)&est_token;
}

static int ec_rank_size(dt_comm_t *c, int32_t *r, int32_t *s)
{
    *r = 0;
    *s = c->size;
    return DT_OK;
}

/* What one rank sends in ring algorithms. */
static int ec_all_reduce(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt, int op,
                         dt_stream_t *st, dt_comm_req_t **req)
{
    ec_add(c, 2.0 * (c->size - 1) / c->size * (double)n * (double)dt_dtype_size(dt), req);
    return DT_OK;
}
static int ec_reduce_scatter(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt, int op,
                             dt_stream_t *st, dt_comm_req_t **req)
{
    ec_add(c, (double)(c->size - 1) * (double)n * (double)dt_dtype_size(dt), req);
    return DT_OK;
}
static int ec_all_gather(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt,
                         dt_stream_t *st, dt_comm_req_t **req)
{
    ec_add(c, (double)(c->size - 1) * (double)n * (double)dt_dtype_size(dt), req);
    return DT_OK;
}
static int ec_wait(dt_comm_t *c, dt_comm_req_t *req, int64_t t)
{
    return DT_OK;
}
static int ec_split(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out);
static void ec_finalize(dt_comm_t *c)
{
    if (c && c->owned)
        c->host->free(c->host, c);
}

static const dt_comm_ops_v1_t est_comm_ops = {
    .info = {.abi_major = DT_COMM_ABI_MAJOR, .abi_minor = DT_COMM_ABI_MINOR,
             .struct_size = sizeof(dt_comm_ops_v1_t), .kind = DT_KIND_COMM,
             .name = "estimate"},
    .finalize = ec_finalize,
    .rank_size = ec_rank_size,
    .all_reduce = ec_all_reduce,
    .reduce_scatter = ec_reduce_scatter,
    .all_gather = ec_all_gather,
    .wait = ec_wait,
    .split = ec_split,
};

/* The engine splits (shard_engine.c make_groups) first by rank / g,
 * rank 0's shard group of g ranks, then by rank % g, its size / g
 * replicas. */
static int ec_split(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    dt_comm_t *n = c->host->alloc(c->host, sizeof *n, DT_TAG_OTHER);
    if (!n)
        return c->host->set_error(c->host, DT_ERR_NOMEM, "estimate: split");
    *n = (dt_comm_t){.ops = &est_comm_ops, .host = c->host, .owned = 1, .count = c->count};
    n->size = c->n_splits++ == 0 ? (int32_t)c->shard : c->size / (int32_t)c->shard;
    *out = n;
    return DT_OK;
}

/* ------------------------------------------------ the replay */

static int hook(dt_shard_engine_t *e, int phase, uint32_t unit, uint32_t micro, uint32_t n_micro,
                int last_use)
{
    dt_hook_v1_t h = {.struct_size = sizeof(dt_hook_v1_t),
                      .unit = unit,
                      .micro = micro,
                      .n_micro = n_micro,
                      .last_use = last_use};
    dt_unit_buffers_v1_t b = {.struct_size = sizeof(dt_unit_buffers_v1_t)};
    switch (phase) {
    case 0: return dt_shard_pre_forward(e, &h, &b);
    case 1: return dt_shard_post_forward(e, &h);
    case 2: return dt_shard_pre_backward(e, &h, &b);
    default: return dt_shard_post_backward(e, &h);
    }
}

/* One step as the core drives `arch` (the model plugins: plugins/gpt2, plugins/mlp): every
 * unit forward; gpt2's head re-reads unit 0 (the tied embedding) inside
 * its own hooks, forward and backward; backward in reverse, each unit's
 * last post_backward ending its gradient. */
static int replay_step(dt_shard_engine_t *e, uint32_t n_micro, int tied)
{
    uint32_t nu = e->dp.model->n_units;
    int rc = dt_shard_begin_step(e, 1);
    for (uint32_t m = 0; rc == DT_OK && m < n_micro; m++) {
        for (uint32_t u = 0; rc == DT_OK && u < nu; u++) {
            rc = hook(e, 0, u, m, n_micro, 0);
            if (rc == DT_OK && tied && u == nu - 1 && (rc = hook(e, 0, 0, m, n_micro, 0)) == DT_OK)
                rc = hook(e, 1, 0, m, n_micro, 0);
            if (rc == DT_OK)
                rc = hook(e, 1, u, m, n_micro, 0);
        }
        for (uint32_t u = nu; rc == DT_OK && u-- > 0;) {
            rc = hook(e, 2, u, m, n_micro, 0);
            if (rc == DT_OK && tied && u == nu - 1 && (rc = hook(e, 2, 0, m, n_micro, 0)) == DT_OK)
                rc = hook(e, 3, 0, m, n_micro, 0);
            if (rc == DT_OK)
                rc = hook(e, 3, u, m, n_micro, 1);
        }
    }
    dt_step_args_v1_t sa = {
        .struct_size = sizeof(dt_step_args_v1_t), .step = 1, .lr = 0.0f, .clip = 0.0f};
    dt_step_result_v1_t res = {.struct_size = sizeof(dt_step_result_v1_t)};
    if (rc == DT_OK)
        rc = dt_shard_step(e, &sa, &res);
    return rc;
}

/* The row's note: what is sharded over how many ranks, in words that
 * hold for every configuration (NO_SHARD, or any strategy on one rank,
 * shards nothing: never "sharded" there).  Sizes stay out of it: the
 * planner prints them in its columns, in one unit system. */
static void shard_estimate_note(const dt_shard_cfg_t *cfg, uint32_t n_groups, uint32_t ssize,
                                uint32_t rsize, char *note, size_t cap)
{
    const char *what = cfg->what ? cfg->what : "sharded engine";
    if (ssize <= 1) {
        if (rsize > 1)
            snprintf(note, cap,
                     "%s: nothing sharded: every rank holds all %u group(s); grads all-reduced "
                     "over %u ranks%s%s", what, n_groups, rsize,
                     cfg->reduce_dtype ? " in " : "",
                     cfg->reduce_dtype ? dt_cfg_reduce_dtype_name(cfg->reduce_dtype) : "");
        else
            snprintf(note, cap, "%s: nothing sharded on 1 rank: it holds all %u group(s)", what,
                     n_groups);
        return;
    }
    char rep[64] = "";
    if (rsize > 1)
        snprintf(rep, sizeof rep, " x %u replicas (shard grads all-reduced across them)",
                 rsize);
    snprintf(note, cap, "%s: %u group(s) sharded over %u ranks%s; params %s, grads %s%s%s",
             what, n_groups, ssize, rep, cfg->params_replicated ? "replicated" : "sharded",
             cfg->grads_full ? "full" : "sharded", cfg->reduce_dtype ? ", reduced in " : "",
             cfg->reduce_dtype ? dt_cfg_reduce_dtype_name(cfg->reduce_dtype) : "");
}

int dt_shard_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,
                      const dt_shard_cfg_t *cfg, dt_estimate_v1_t *res)
{
    dt_estimate_args_v1_t a;
    dt_model_desc_v1_t model_desc = {.struct_size = sizeof(dt_model_desc_v1_t)};
    int rc = dt_dp_estimate_read(host, in, &a, &model_desc);
    if (rc != DT_OK)
        return rc;
    const dt_estimate_args_v1_t *args = &a;
    dt_estimate_v1_t est, *out = &est;
    dt_estimate_begin(out);

    /* the engine, on counting stand-ins, as rank 0 (whose shards are the
     * largest: padding falls on the last ranks) */
    dt_model_desc_v1_t model = *args->model;
    model.param_dtype = args->param_bytes == 2 ? DT_BF16 : DT_F32;
    struct dt_device dev = {.ops = &est_dev_ops, .host = host, .next = (uint64_t)1 << 40};
    est_count_t count = {0, 0.0};
    struct dt_comm comm = {.ops = &est_comm_ops, .host = host, .size = args->group_size,
                           .count = &count, .shard = cfg->shard_ranks ? cfg->shard_ranks : 1};
    const dt_optim_desc_v1_t optim = {.struct_size = sizeof optim,
                                      .kind = DT_OPTIM_ADAMW,
                                      .beta1 = 0.9f,
                                      .beta2 = 0.999f,
                                      .eps = 1e-8f};
    dt_strategy_init_v1_t ia = {
        .struct_size = sizeof ia,
        .n_micro = args->n_micro ? args->n_micro : 1,
        .dev = &dev,
        .compute_stream = (dt_stream_t *)(void *)&est_token,
        .comm = &comm,
        .model = &model,
        .optim = &optim,
    };
    /* offload: what the tier holds, and the schedule that gives (gradient
     * buffers per group where the gradient shard lives in the tier) */
    uint32_t what = 0;
    if (DT_HAS_FIELD(dt_estimate_args_v1_t, args, offload) && args->offload &&
        (rc = dt_offload_what_plan(host, cfg->params_offload_ok,
                                   cfg->what ? cfg->what : "sharding", &what)) != DT_OK)
        return rc;
    dt_shard_cfg_t rcfg = *cfg;
    rcfg.plan_offload_what = what;
    dt_shard_engine_t engine, *e = &engine;
    rc = dt_shard_engine_init(e, NULL, host, &ia, &rcfg);
    if (rc == DT_OK)
        rc = dt_shard_state_loaded(e);
    count.counting = 1;
    e->replay_loaded = 0; /* the step's loads, not init's */
    int tied = model.arch && strcmp(model.arch, "gpt2") == 0 && model.n_units >= 2;
    if (rc == DT_OK)
        rc = replay_step(e, ia.n_micro, tied);
    count.counting = 0;
    if (rc != DT_OK) {
        dt_shard_engine_free(e);
        host->free(host, dev.blk);
        return rc;
    }

    const dt_shard_plan_t *p = &e->plan;
    uint64_t S = p->shard_total, F = p->full_total, persist = 0;
    for (uint32_t i = 0; i < p->n_groups; i++)
        if (e->g[i].owns_full)
            persist += p->groups[i].padded;
    dt_dp_estimate_state(args, cfg->params_replicated ? F : S + persist, S,
                         cfg->grads_full ? F : S, out);
    if (what)
        dt_offload_estimate(args, what, S, S, out);
    if (what & DT_OFFLOAD_WHAT_PARAMS) {
        /* the compute shard's loads as the replayed schedule made them, in
         * place of the formula's two per micro-step (a group gathered in
         * forward and still held in backward, the tied embedding's, is
         * not loaded again), so the plan equals what the tier moves */
        uint64_t formula = 2 * ia.n_micro * S * args->param_bytes;
        out->offload_bytes_per_step = out->offload_bytes_per_step - formula + e->replay_loaded;
    }
    if (e->grads_offloaded) {
        /* the f32 gradient shard in the tier: each micro-step's blocks
         * stored (added to the sum so far, read back, after the first),
         * read for the norm and by the optimizer */
        uint64_t n_micro = ia.n_micro, gb = S * sizeof(float);
        out->bytes[DT_TAG_GRADS] = 0;
        out->bytes[DT_TAG_OFFLOAD] += gb;
        out->offload_bytes_per_step += (2 * n_micro + 1) * gb;
    }
    out->bytes[DT_TAG_COMM] = dev.st.peak[DT_TAG_COMM];
    out->bytes[DT_TAG_OTHER] = dev.st.peak[DT_TAG_OTHER];
    out->comm_bytes_per_step = (uint64_t)(count.bytes + 0.5);
    shard_estimate_note(cfg, p->n_groups, e->ssize, e->rsize, out->note, sizeof out->note);
    dt_shard_engine_free(e);
    host->free(host, dev.blk);
    return dt_result_write(host, "estimate", res, out, sizeof *out, DT_ESTIMATE_V1_SIZE0);
}
