/*
 * sdk/lib/dt_offload_state.c - optimizer state in an offload tier: the
 * tier buffers, the host update piece by piece (gradients in, the
 * optimizer on the tier's memory, parameters out), and the parameters
 * pushed to the device after a load.  See dtrain/sdk/offload.h.
 */
#include <string.h>

#include "dtrain/half.h"
#include "dtrain/sdk/cfg.h"
#include "dtrain/sdk/dp.h"
#include "dtrain/sdk/offload.h"

int dt_offload_what(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args, int params_ok,
                    const char *what_is, uint32_t *what)
{
    static const char choices[] = "optimizer|params|optimizer_and_params";
    static const uint32_t bits[] = {DT_OFFLOAD_WHAT_OPTIMIZER, DT_OFFLOAD_WHAT_PARAMS,
                                    DT_OFFLOAD_WHAT_OPTIMIZER | DT_OFFLOAD_WHAT_PARAMS};
    static const char *names[] = {"optimizer", "params", "optimizer_and_params"};
    int idx = 0;
    const char *v = NULL;
    *what = 0;
    if (!args->offload_ops || !args->offload)
        return dt_cfg_enum(host, "offload_what", "optimizer", choices, &idx);
    if (host->cfg_string(host, "offload_what", &v) == DT_ERR_NOT_FOUND)
        return host->set_error(host, DT_ERR_CONFIG,
                               "[parallel] offload names tier '%s', but %s keeps no state in an "
                               "offload tier (it declares no offload_what key); set "
                               "[parallel] offload = \"none\" or use zero, fsdp or ddp",
                               args->offload_ops->info.name ? args->offload_ops->info.name : "?",
                               what_is);
    int rc = dt_cfg_enum(host, "offload_what", "optimizer", choices, &idx);
    if (rc != DT_OK)
        return rc;
    if ((bits[idx] & DT_OFFLOAD_WHAT_PARAMS) && !params_ok)
        return host->set_error(host, DT_ERR_CONFIG,
                               "offload_what = \"%s\": parameters are offloaded only by zero "
                               "stage 3 and fsdp FULL_SHARD, and this is %s; offload the "
                               "optimizer state instead (offload_what = \"optimizer\")",
                               names[idx], what_is);
    *what = bits[idx];
    return DT_OK;
}

void dt_offload_state_free(dt_offload_state_t *st)
{
    if (!st || !st->host)
        return;
    for (int k = 0; k < DT_STATE_COUNT; k++)
        if (st->buf[k])
            st->ops->free(st->tier, st->buf[k]);
    if (st->gstage)
        st->dev_ops->host_free(st->dev, st->gstage);
    if (st->pstage)
        st->dev_ops->host_free(st->dev, st->pstage);
    memset(st, 0, sizeof *st);
}

int dt_offload_host_ptr(const dt_host_v1_t *host, const dt_offload_ops_v1_t *ops,
                        dt_offload_t *tier, dt_offload_buf_t *buf, const char *what,
                        void **out)
{
    if (!DT_HAS_OP(dt_offload_ops_t, ops, host_ptr))
        return host->set_error(host, DT_ERR_UNSUPPORTED,
                               "offload tier '%s' gives no host pointer (host_ptr): %s cannot "
                               "be updated in it by this build",
                               ops->info.name ? ops->info.name : "?", what);
    return ops->host_ptr(tier, buf, out);
}

int dt_offload_state_init(dt_offload_state_t *st, const dt_host_v1_t *host,
                          const dt_strategy_init_v1_t *args, int32_t rank, uint64_t numel,
                          int has_v, int compute_space)
{
    static const char *names[] = {"f32 master parameters", "optimizer exp_avg",
                                  "optimizer exp_avg_sq"};
    static const int tags[] = {DT_TAG_PARAMS, DT_TAG_OPTIMIZER, DT_TAG_OPTIMIZER};
    memset(st, 0, sizeof *st);
    const dt_offload_ops_v1_t *ops = args->offload_ops;
    *st = (dt_offload_state_t){.host = host, .ops = ops, .tier = args->offload,
                               .dev_ops = args->dev_ops, .dev = args->dev,
                               .cs = args->compute_stream, .rank = rank,
                               .pdtype = args->model->param_dtype,
                               .compute_space = compute_space, .numel = numel};
    st->piece = numel < DT_OFFLOAD_PIECE ? (numel ? numel : 1) : DT_OFFLOAD_PIECE;
    int rc = DT_OK;
    for (int k = 0; rc == DT_OK && k < (has_v ? 3 : 2); k++) {
        void *p = NULL;
        rc = ops->alloc(st->tier, numel * sizeof(float), tags[k], &st->buf[k]);
        if (rc == DT_OK && (rc = dt_offload_host_ptr(host, ops, st->tier, st->buf[k],
                                                     "optimizer state", &p)) == DT_OK) {
            st->state[k] = p;
            memset(p, 0, numel * sizeof(float)); /* moments start at zero */
        }
        if (rc != DT_OK)
            host->log(host, DT_LOG_ERROR, "rank %d: %llu bytes of %s in offload tier '%s' failed",
                      rank, (unsigned long long)(numel * sizeof(float)), names[k],
                      ops->info.name ? ops->info.name : "?");
    }
    if (rc == DT_OK)
        rc = st->dev_ops->host_alloc(st->dev, st->piece * sizeof(float), DT_TAG_STAGING,
                                     (void **)&st->gstage);
    if (rc == DT_OK && st->pdtype == DT_BF16 && compute_space == DT_MEM_DEVICE)
        rc = st->dev_ops->host_alloc(st->dev, st->piece * sizeof(uint16_t), DT_TAG_STAGING,
                                     (void **)&st->pstage);
    if (rc != DT_OK)
        dt_offload_state_free(st);
    return rc;
}

/* Parameters [at, at + n) of the master (n <= piece) to dcompute: f32
 * straight from the tier's pinned memory, bf16 rounded on the host (the
 * device's cast rounds alike: nearest even) through pinned staging. */
static int push_piece(dt_offload_state_t *st, uint64_t at, uint64_t n, void *dcompute)
{
    const float *src = st->state[DT_STATE_PARAMS] + at;
    if (st->compute_space == DT_MEM_HOST) { /* the tier's compute copy */
        if (st->pdtype != DT_BF16) {
            memcpy(dcompute, src, n * sizeof(float));
        } else {
            uint16_t *dst = dcompute;
            for (uint64_t i = 0; i < n; i++)
                dst[i] = dt_f32_to_bf16(src[i]);
        }
        return DT_OK;
    }
    if (st->pdtype != DT_BF16)
        return st->dev_ops->memcpy_async(st->dev, dcompute, src, n * sizeof(float), DT_COPY_H2D,
                                         st->cs);
    for (uint64_t i = 0; i < n; i++)
        st->pstage[i] = dt_f32_to_bf16(src[i]);
    int rc = st->dev_ops->memcpy_async(st->dev, dcompute, st->pstage, n * sizeof(uint16_t),
                                       DT_COPY_H2D, st->cs);
    /* the staging is reused by the next piece */
    return rc == DT_OK ? st->dev_ops->stream_sync(st->dev, st->cs) : rc;
}

int dt_offload_state_push(dt_offload_state_t *st, uint64_t at, uint64_t n, void *dcompute)
{
    size_t pes = dt_dtype_size(st->pdtype);
    int rc = DT_OK;
    for (uint64_t c = 0; rc == DT_OK && c < n; c += st->piece) {
        uint64_t k = n - c < st->piece ? n - c : st->piece;
        rc = push_piece(st, at + c, k, (char *)dcompute + c * pes);
    }
    if (rc == DT_OK)
        rc = st->dev_ops->stream_sync(st->dev, st->cs);
    if (rc != DT_OK)
        st->host->log(st->host, DT_LOG_ERROR, "rank %d: copying %llu offloaded parameters to "
                      "the device failed", st->rank, (unsigned long long)n);
    return rc;
}

int dt_offload_state_update(dt_offload_state_t *st, const dt_unit_desc_v1_t *unit,
                            dt_range_t r, uint64_t at, const float *dgrad, void *dcompute,
                            const dt_optim_step_t *opt)
{
    size_t pes = dt_dtype_size(st->pdtype);
    const dt_device_ops_v1_t *d = st->dev_ops;
    float *const *s = st->state;
    if (at > st->numel || r.count > st->numel - at)
        return st->host->set_error(st->host, DT_ERR_INVALID,
                                   "offloaded optimizer: unit '%s' range [%llu, +%llu) at %llu "
                                   "is outside the %llu elements held", unit->name,
                                   (unsigned long long)r.offset, (unsigned long long)r.count,
                                   (unsigned long long)at, (unsigned long long)st->numel);
    for (uint64_t c = 0; c < r.count; c += st->piece) {
        uint64_t k = r.count - c < st->piece ? r.count - c : st->piece;
        const char *what = "copying gradients from the device";
        /* the gradients of the piece, once the compute stream wrote them */
        int rc = d->memcpy_async(st->dev, st->gstage, dgrad + c, k * sizeof(float), DT_COPY_D2H,
                                 st->cs);
        if (rc == DT_OK)
            rc = d->stream_sync(st->dev, st->cs);
        if (rc == DT_OK) {
            what = "the host optimizer";
            uint64_t a = at + c;
            rc = dt_optim_range_host(st->host, unit, (dt_range_t){r.offset + c, k},
                                     s[DT_STATE_PARAMS] + a, st->gstage, s[DT_STATE_EXP_AVG] + a,
                                     s[DT_STATE_EXP_AVG_SQ] ? s[DT_STATE_EXP_AVG_SQ] + a : NULL,
                                     opt);
        }
        if (rc == DT_OK) {
            what = "copying parameters to the device";
            rc = push_piece(st, at + c, k, (char *)dcompute + c * pes);
        }
        if (rc != DT_OK) {
            st->host->log(st->host, DT_LOG_ERROR, "rank %d: offloaded optimizer step of unit "
                          "'%s' [%llu, +%llu): %s failed", st->rank, unit->name,
                          (unsigned long long)(r.offset + c), (unsigned long long)k, what);
            return rc;
        }
    }
    /* the next piece's staging, and the next step's kernels, see it all */
    return d->stream_sync(st->dev, st->cs);
}

int dt_offload_state_collective(dt_offload_state_t *st, int kind, const dt_comm_ops_v1_t *cops,
                                dt_comm_t *comm, int32_t root, int op)
{
    const dt_device_ops_v1_t *d = st->dev_ops;
    float *host = kind >= 0 && kind < DT_STATE_COUNT ? st->state[kind] : NULL;
    if (!host)
        return DT_OK; /* SGD keeps no second moment */
    float *dbuf = NULL;
    int rc = d->alloc(st->dev, st->piece * sizeof(float), DT_TAG_COMM, (void **)&dbuf);
    for (uint64_t c = 0; rc == DT_OK && c < st->numel; c += st->piece) {
        uint64_t k = st->numel - c < st->piece ? st->numel - c : st->piece;
        rc = d->memcpy_async(st->dev, dbuf, host + c, k * sizeof(float), DT_COPY_H2D, st->cs);
        if (rc == DT_OK)
            rc = root >= 0 ? cops->broadcast(comm, dbuf, k, DT_F32, root, st->cs, NULL)
                           : cops->all_reduce(comm, dbuf, dbuf, k, DT_F32, op, st->cs, NULL);
        if (rc == DT_OK)
            rc = d->memcpy_async(st->dev, host + c, dbuf, k * sizeof(float), DT_COPY_D2H, st->cs);
        if (rc == DT_OK)
            rc = d->stream_sync(st->dev, st->cs);
    }
    if (dbuf)
        d->free(st->dev, dbuf);
    if (rc != DT_OK)
        st->host->log(st->host, DT_LOG_ERROR, "rank %d: %s of the offloaded %s (%llu elements) "
                      "failed", st->rank, root >= 0 ? "broadcast" : "all-reduce",
                      dt_state_kind_name(kind), (unsigned long long)st->numel);
    return rc;
}
