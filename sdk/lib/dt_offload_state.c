/*
 * sdk/lib/dt_offload_state.c - state in an offload tier: which state a
 * strategy's offload_what puts there; compute parameters in a tier
 * (written from f32, loaded to the device before use); optimizer state in
 * a tier, updated on the host piece by piece (gradients in, the optimizer
 * in place or on pinned staging, parameters out), read and written for
 * checkpoints, hashed, and moved by collectives.  Tiers with host_ptr are
 * used in place; others through store / load, waited on within the
 * tier's own timeout.  Writes of parameters and gradients run behind the
 * caller (gradients through two pinned pieces, parameters through one),
 * each store waited on only when its piece is reused or the bytes are read
 * again (the load, the norm, the update, free); parameters updated on the
 * host are stored from the optimizer's own staging with the state, whose
 * last stores run on into the next unit's update.  Pieces sit in their
 * staging at their offset within the file's 4 KiB blocks, so an O_DIRECT
 * tier uses the staging in place.  See dtrain/sdk/offload.h.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/half.h"
#include "dtrain/sdk/cfg.h"
#include "dtrain/sdk/dp.h"
#include "dtrain/sdk/hash.h"
#include "dtrain/sdk/norm.h"
#include "dtrain/sdk/offload.h"

static const char what_choices[] = "optimizer|params|optimizer_and_params";
static const uint32_t what_bits[] = {DT_OFFLOAD_WHAT_OPTIMIZER, DT_OFFLOAD_WHAT_PARAMS,
                                     DT_OFFLOAD_WHAT_OPTIMIZER | DT_OFFLOAD_WHAT_PARAMS};
static const char *what_names[] = {"optimizer", "params", "optimizer_and_params"};

/* offload_what as configured, checked against params_ok. */
static int what_read(const dt_host_v1_t *host, int params_ok, const char *what_is,
                     uint32_t *what)
{
    int idx = 0;
    int rc = dt_cfg_enum(host, "offload_what", what_choices, &idx);
    if (rc != DT_OK)
        return rc;
    if ((what_bits[idx] & DT_OFFLOAD_WHAT_PARAMS) && !params_ok)
        return host->set_error(host, DT_ERR_CONFIG,
                               "offload_what = \"%s\": parameters are offloaded only by zero "
                               "stage 3 and fsdp FULL_SHARD, and this is %s; offload the "
                               "optimizer state instead (offload_what = \"optimizer\")",
                               what_names[idx], what_is);
    *what = what_bits[idx];
    return DT_OK;
}

int dt_offload_what(const dt_host_v1_t *host, const dt_strategy_init_v1_t *args, int params_ok,
                    const char *what_is, uint32_t *what)
{
    const char *v = NULL;
    *what = 0;
    if (!args->offload) {
        int idx;
        /* no tier: the key, where declared, is only checked */
        if (host->cfg_string(host, "offload_what", &v) == DT_ERR_NOT_FOUND)
            return DT_OK;
        return dt_cfg_enum(host, "offload_what", what_choices, &idx);
    }
    if (host->cfg_string(host, "offload_what", &v) == DT_ERR_NOT_FOUND)
        return host->set_error(host, DT_ERR_CONFIG,
                               "[parallel] offload names tier '%s', but %s keeps no state in an "
                               "offload tier (it declares no offload_what key); set "
                               "[parallel] offload = \"none\" or use zero, fsdp or ddp",
                               dt_offload_ops(args->offload)->info.name
                                   ? dt_offload_ops(args->offload)->info.name
                                   : "?",
                               what_is);
    return what_read(host, params_ok, what_is, what);
}

int dt_offload_what_plan(const dt_host_v1_t *host, int params_ok, const char *what_is,
                         uint32_t *what)
{
    const char *v = NULL;
    *what = 0;
    if (host->cfg_string(host, "offload_what", &v) == DT_ERR_NOT_FOUND)
        return DT_OK;
    return what_read(host, params_ok, what_is, what);
}

void dt_offload_estimate(const dt_estimate_args_v1_t *args, uint32_t what, uint64_t owned,
                         uint64_t sharded, dt_estimate_v1_t *out)
{
    uint64_t pb = args->param_bytes;
    uint64_t master = owned * 4; /* f32, whatever the compute dtype */
    uint64_t device_master = pb == 2 ? master : 0; /* what the device kept */
    uint64_t *b = out->bytes;
    uint64_t n_micro = args->n_micro ? args->n_micro : 1;
    if (what & DT_OFFLOAD_WHAT_OPTIMIZER) {
        /* the moments (optim_bytes less a bf16 run's master) and the
         * master, each read and written once by the step's update */
        out->offload_bytes_per_step += 2 * (b[DT_TAG_OPTIMIZER] + master);
        b[DT_TAG_OFFLOAD] += b[DT_TAG_OPTIMIZER] + master;
        b[DT_TAG_OPTIMIZER] = 0;
        b[DT_TAG_PARAMS] -= device_master;
        device_master = 0;
    } else if (what & DT_OFFLOAD_WHAT_PARAMS) {
        /* a device optimizer needs an f32 master of its own */
        b[DT_TAG_PARAMS] += master - device_master;
        device_master = master;
    }
    if (what & DT_OFFLOAD_WHAT_PARAMS) {
        b[DT_TAG_PARAMS] -= sharded * pb;
        b[DT_TAG_OFFLOAD] += sharded * pb;
        /* loaded before every gather, forward and backward of each
         * micro-step, and written once by the step */
        out->offload_bytes_per_step += (2 * n_micro + 1) * sharded * pb;
    }
    if (DT_TAG_OFFLOAD >= (int)out->n_tags)
        out->n_tags = DT_TAG_OFFLOAD + 1;
}

/* ------------------------------------------------------------ helpers */

static const char *tier_name(const dt_offload_ops_v1_t *ops)
{
    return ops->info.name ? ops->info.name : "?";
}

/* The tier's host pointer of `buf`, or NULL when it has none. */
static int host_ptr_of(dt_offload_t *tier, dt_offload_buf_t *buf,
                       void **out)
{
    *out = NULL;
    if (!DT_HAS_OP(dt_offload_ops_t, dt_offload_ops(tier), host_ptr))
        return DT_OK;
    int rc = dt_offload_ops(tier)->host_ptr(tier, buf, out);
    if (rc == DT_ERR_UNSUPPORTED) {
        *out = NULL;
        return DT_OK;
    }
    return rc;
}

/* Blocking store / load of host memory at byte `off` of `buf`; a step's
 * traffic is counted in moved[0] (loaded) or moved[1] (stored), other
 * (init, checkpoints: moved NULL) is not. */
static int tier_io(dt_offload_t *tier, dt_offload_buf_t *buf,
                   int store, uint64_t off, void *mem, uint64_t bytes, uint64_t *moved)
{
    dt_offload_req_t *req = NULL;
    if (moved)
        moved[store ? 1 : 0] += bytes;
    int rc = store
                 ? dt_offload_ops(tier)->store(tier, buf, off, mem, bytes, DT_MEM_HOST, NULL, &req)
                 : dt_offload_ops(tier)->load(tier, buf, off, mem, bytes, DT_MEM_HOST, NULL, &req);
    return rc == DT_OK ? dt_offload_ops(tier)->wait(tier, req, -1) : rc;
}

/* f32 to 16-bit compute parameters (bf16 or f16), round to nearest even as
 * the device's cast does (dtrain/half.h), so an offloaded optimizer's
 * parameters equal the device's bit for bit. */
static void round_half(int32_t dtype, const float *src, uint16_t *dst, uint64_t n)
{
    if (dtype == DT_F16)
        for (uint64_t i = 0; i < n; i++)
            dst[i] = dt_f32_to_f16(src[i]);
    else
        for (uint64_t i = 0; i < n; i++)
            dst[i] = dt_f32_to_bf16(src[i]);
}

static uint64_t piece_of(uint64_t numel)
{
    return numel < DT_OFFLOAD_PIECE ? (numel ? numel : 1) : DT_OFFLOAD_PIECE;
}

/* Where a piece that starts at element `a` of a tier buffer (`es` bytes
 * an element) sits in its staging: `lead` elements in, its offset within
 * its 4 KiB block of the file, so that every whole block of it lies
 * 4 KiB-aligned in the (large, aligned) staging and an O_DIRECT tier
 * reads and writes it there in place, as fio does, instead of through
 * its bounce buffers; only the blocks at a range's ends are partial.
 * Such a piece holds piece - lead elements, so the next one starts on a
 * block (lead 0).  A small piece (a small buffer) keeps lead 0. */
static uint64_t lead_of(uint64_t a, size_t es, uint64_t piece)
{
    uint64_t lead = (a * es) % 4096u / es;
    return lead < piece / 2 ? lead : 0;
}

/* Elements of the piece at element `a` with `left` elements to go. */
static uint64_t chunk_of(uint64_t a, size_t es, uint64_t piece, uint64_t left)
{
    uint64_t k = piece - lead_of(a, es, piece);
    return left < k ? left : k;
}

/* Wait for the gradient store from gload[i], if one is in flight; a
 * failure names its elements. */
static int grads_wait(dt_offload_state_t *st, int i)
{
    if (!st->gwreq[i])
        return DT_OK;
    int rc = dt_offload_ops(st->tier)->wait(st->tier, st->gwreq[i], -1);
    st->gwreq[i] = NULL;
    if (rc != DT_OK)
        st->host->log(st->host, DT_LOG_ERROR, "rank %d: storing reduced gradients [%llu, +%llu) "
                      "to offload tier '%s' failed", st->rank, (unsigned long long)st->gwat[i],
                      (unsigned long long)st->gwn[i], tier_name(dt_offload_ops(st->tier)));
    return rc;
}

/* Every gradient store done: before the gradient is read or its staging
 * reused for anything else. */
static int grads_flush(dt_offload_state_t *st)
{
    int rc = DT_OK;
    for (int i = 0; i < 2; i++) {
        int e = grads_wait(st, i);
        if (rc == DT_OK)
            rc = e;
    }
    return rc;
}

/* --------------------------------------------------- compute parameters */

/* Wait for the write from wstage[i], if one is in flight; a failure
 * names its elements. */
static int params_wait(dt_offload_params_t *p, int i)
{
    if (!p->wreq[i])
        return DT_OK;
    int rc = dt_offload_ops(p->tier)->wait(p->tier, p->wreq[i], -1);
    p->wreq[i] = NULL;
    if (rc != DT_OK)
        p->host->log(p->host, DT_LOG_ERROR, "rank %d: storing offloaded parameters [%llu, "
                     "+%llu) to offload tier '%s' failed", p->rank,
                     (unsigned long long)p->wat[i], (unsigned long long)p->wn[i],
                     tier_name(dt_offload_ops(p->tier)));
    return rc;
}

int dt_offload_params_flush(dt_offload_params_t *p)
{
    int rc = DT_OK;
    for (int i = 0; i < 2; i++) {
        int e = params_wait(p, i);
        if (rc == DT_OK)
            rc = e;
    }
    return rc;
}

void dt_offload_params_free(dt_offload_params_t *p)
{
    if (!p || !p->host)
        return;
    /* a store that did not finish in time keeps its staging (left
     * allocated): the tier may still read it */
    int left = dt_offload_params_flush(p) != DT_OK;
    if (p->buf)
        dt_offload_ops(p->tier)->free(p->tier, p->buf);
    for (int i = 0; i < 2 && !left; i++)
        if (p->wstage[i])
            dt_device_ops(p->dev)->host_free(p->dev, p->wstage[i]);
    memset(p, 0, sizeof *p);
}

int dt_offload_params_init(dt_offload_params_t *p, const dt_host_v1_t *host,
                           const dt_strategy_init_v1_t *args, int32_t rank, uint64_t numel)
{
    *p = (dt_offload_params_t){.host = host, .tier = args->offload, .dev = args->dev, .rank = rank,
                               .pdtype = args->model->param_dtype, .numel = numel,
                               .piece = piece_of(numel)};
    size_t pes = dt_dtype_size(p->pdtype);
    int rc = dt_offload_ops(p->tier)->alloc(p->tier, numel * pes, DT_TAG_PARAMS, &p->buf);
    if (rc == DT_OK)
        rc = host_ptr_of(p->tier, p->buf, &p->host_ptr);
    if (rc == DT_OK && p->host_ptr)
        memset(p->host_ptr, 0, numel * pes);
    /* staging: one piece where writes go through store (a second, for
     * two stores in flight, would cost a piece of pinned memory more than
     * before; the optimizer's own writes go from its staging instead);
     * with host_ptr, 16-bit values are rounded straight into the tier */
    if (rc == DT_OK && !p->host_ptr)
        rc = dt_device_ops(p->dev)->host_alloc(p->dev, p->piece * pes, DT_TAG_STAGING,
                                               &p->wstage[0]);
    p->stage = p->wstage[0];
    if (rc != DT_OK) {
        host->log(host, DT_LOG_ERROR,
                  "rank %d: %llu bytes of parameters in offload tier '%s' "
                  "failed",
                  rank, (unsigned long long)(numel * pes), tier_name(dt_offload_ops(p->tier)));
        dt_offload_params_free(p);
    }
    return rc;
}

int dt_offload_params_write(dt_offload_params_t *p, uint64_t at, uint64_t n, const float *src)
{
    size_t pes = dt_dtype_size(p->pdtype);
    int rc = DT_OK;
    for (uint64_t c = 0, k = 0; rc == DT_OK && c < n; c += k) {
        k = p->host_ptr ? (n - c < p->piece ? n - c : p->piece)
                        : chunk_of(at + c, pes, p->piece, n - c);
        const float *s = src + c;
        int i = p->wstage[1] ? (int)p->wnext : 0;
        void *dst = (char *)p->host_ptr + (at + c) * pes;
        if (!p->host_ptr) {
            /* the staging's previous store done (the window's oldest) */
            rc = params_wait(p, i);
            if (rc != DT_OK)
                break;
            dst = (char *)p->wstage[i] + lead_of(at + c, pes, p->piece) * pes;
            p->wnext = (uint32_t)(i ^ 1);
        }
        if (p->pdtype != DT_F32)
            round_half(p->pdtype, s, (uint16_t *)dst, k);
        else
            memcpy(dst, s, k * sizeof(float));
        if (!p->host_ptr) {
            p->wat[i] = at + c;
            p->wn[i] = k;
            p->moved[1] += k * pes;
            rc = dt_offload_ops(p->tier)->store(p->tier, p->buf, (at + c) * pes, dst, k * pes,
                                                DT_MEM_HOST, NULL, &p->wreq[i]);
            if (rc != DT_OK)
                p->wreq[i] = NULL;
        }
    }
    if (rc != DT_OK)
        p->host->log(p->host, DT_LOG_ERROR, "rank %d: writing %llu offloaded parameters failed",
                     p->rank, (unsigned long long)n);
    return rc;
}

int dt_offload_params_load(dt_offload_params_t *p, uint64_t at, uint64_t n, void *dst,
                           dt_stream_t *stream, dt_offload_req_t **req)
{
    size_t pes = dt_dtype_size(p->pdtype);
    int rc = dt_offload_params_flush(p);
    if (rc == DT_OK && p->writer)
        rc = dt_offload_state_flush(p->writer);
    if (rc != DT_OK) {
        *req = NULL;
        return rc;
    }
    p->moved[0] += n * pes;
    return dt_offload_ops(p->tier)->load(p->tier, p->buf, at * pes, dst, n * pes, DT_MEM_DEVICE,
                                         stream, req);
}

/* ------------------------------------------------------ optimizer state */

void dt_offload_state_free(dt_offload_state_t *st)
{
    if (!st || !st->host)
        return;
    if (st->params && st->params->writer == st)
        st->params->writer = NULL;
    if (dt_offload_state_flush(st) != DT_OK) /* the tier may still read the staging */
        memset(st->stage, 0, sizeof st->stage);
    if (grads_flush(st) != DT_OK) /* the tier may still read gload: keep it */
        st->gload[0] = st->gload[1] = NULL;
    for (int k = 0; k < DT_STATE_COUNT; k++) {
        if (st->buf[k])
            dt_offload_ops(st->tier)->free(st->tier, st->buf[k]);
        for (int s = 0; s < 2; s++)
            if (st->stage[s][k])
                dt_device_ops(st->dev)->host_free(st->dev, st->stage[s][k]);
    }
    if (st->gstage)
        dt_device_ops(st->dev)->host_free(st->dev, st->gstage);
    if (st->gbuf)
        dt_offload_ops(st->tier)->free(st->tier, st->gbuf);
    for (int s = 0; s < 2; s++)
        if (st->gload[s])
            dt_device_ops(st->dev)->host_free(st->dev, st->gload[s]);
    if (st->pstage)
        dt_device_ops(st->dev)->host_free(st->dev, st->pstage);
    memset(st, 0, sizeof *st);
}

int dt_offload_state_init(dt_offload_state_t *st, const dt_host_v1_t *host,
                          const dt_strategy_init_v1_t *args, int32_t rank, uint64_t numel,
                          int has_v, dt_offload_params_t *params)
{
    static const char *names[] = {"f32 master parameters", "optimizer exp_avg",
                                  "optimizer exp_avg_sq"};
    static const int tags[] = {DT_TAG_PARAMS, DT_TAG_OPTIMIZER, DT_TAG_OPTIMIZER};
    *st = (dt_offload_state_t){.host = host, .tier = args->offload, .dev = args->dev,
                               .cs = args->compute_stream, .rank = rank,
                               .pdtype = args->model->param_dtype, .n_kinds = has_v ? 3 : 2,
                               .numel = numel, .params = params, .piece = piece_of(numel)};
    const dt_device_ops_v1_t *d = dt_device_ops(st->dev);
    int rc = DT_OK;
    if (params)
        params->writer = st;
    for (int k = 0; rc == DT_OK && k < st->n_kinds; k++) {
        void *p = NULL;
        rc = dt_offload_ops(st->tier)->alloc(st->tier, numel * sizeof(float), tags[k], &st->buf[k]);
        if (rc == DT_OK && (rc = host_ptr_of(st->tier, st->buf[k], &p)) == DT_OK) {
            st->state[k] = p;
            if (p)
                memset(p, 0, numel * sizeof(float)); /* moments start at zero */
        }
        for (int s = 0; rc == DT_OK && !p && s < 2; s++)
            rc = d->host_alloc(st->dev, st->piece * sizeof(float), DT_TAG_STAGING,
                               (void **)&st->stage[s][k]);
        if (rc != DT_OK)
            host->log(host, DT_LOG_ERROR, "rank %d: %llu bytes of %s in offload tier '%s' failed",
                      rank, (unsigned long long)(numel * sizeof(float)), names[k],
                      tier_name(dt_offload_ops(st->tier)));
    }
    /* a tier without host pointers starts zeroed too: written piece by piece */
    for (int k = 1; rc == DT_OK && !st->state[0] && k < st->n_kinds; k++) {
        memset(st->stage[0][k], 0, st->piece * sizeof(float));
        for (uint64_t c = 0; rc == DT_OK && c < numel; c += st->piece) {
            uint64_t n = numel - c < st->piece ? numel - c : st->piece;
            rc = tier_io(st->tier, st->buf[k], 1, c * sizeof(float), st->stage[0][k],
                         n * sizeof(float), NULL);
        }
    }
    if (rc == DT_OK)
        rc = d->host_alloc(st->dev, st->piece * sizeof(float), DT_TAG_STAGING,
                           (void **)&st->gstage);
    /* the host optimizer's threads: the device's (cpu: [cpu] threads) */
    dt_device_props_v1_t pr = {.struct_size = sizeof pr};
    st->threads = 1;
    if (rc == DT_OK && d->props && d->props(st->dev, &pr) == DT_OK && pr.threads > 1)
        st->threads = pr.threads < DT_OFFLOAD_MAX_THREADS ? pr.threads : DT_OFFLOAD_MAX_THREADS;
    if (rc == DT_OK && st->pdtype != DT_F32 && !params)
        rc = d->host_alloc(st->dev, st->piece * sizeof(uint16_t), DT_TAG_STAGING,
                           (void **)&st->pstage);
    if (rc != DT_OK)
        dt_offload_state_free(st);
    return rc;
}

/* New parameters [at, at + n) (n <= piece, f32 host memory `src`) to the
 * compute copy: the tier's, or the device's `dcompute` (f32 straight from
 * pinned memory, bf16/f16 rounded on the host like the device's cast). */
static int push_piece(dt_offload_state_t *st, const float *src, uint64_t at, uint64_t n,
                      void *dcompute)
{
    if (st->params)
        return dt_offload_params_write(st->params, at, n, src);
    const dt_device_ops_v1_t *d = dt_device_ops(st->dev);
    int rc;
    if (st->pdtype == DT_F32) {
        rc = d->memcpy_async(st->dev, dcompute, src, n * sizeof(float), DT_COPY_H2D, st->cs);
    } else {
        round_half(st->pdtype, src, st->pstage, n);
        rc = d->memcpy_async(st->dev, dcompute, st->pstage, n * sizeof(uint16_t), DT_COPY_H2D,
                             st->cs);
    }
    /* the source (staging, a piece of a tier) is reused next */
    return rc == DT_OK ? d->stream_sync(st->dev, st->cs) : rc;
}

int dt_offload_state_read(dt_offload_state_t *st, int kind, uint64_t at, uint64_t n, float *dst)
{
    int rc = dt_offload_state_flush(st); /* the update's last stores */
    if (rc != DT_OK)
        return rc;
    if (st->state[kind]) {
        memcpy(dst, st->state[kind] + at, n * sizeof(float));
        return DT_OK;
    }
    return tier_io(st->tier, st->buf[kind], 0, at * sizeof(float), dst,
                   n * sizeof(float), NULL);
}

int dt_offload_state_write(dt_offload_state_t *st, int kind, uint64_t at, uint64_t n,
                           const float *src)
{
    int rc = dt_offload_state_flush(st);
    if (rc != DT_OK)
        return rc;
    if (st->state[kind]) {
        memcpy(st->state[kind] + at, src, n * sizeof(float));
        return DT_OK;
    }
    return tier_io(st->tier, st->buf[kind], 1, at * sizeof(float), (void *)src,
                   n * sizeof(float), NULL);
}

int dt_offload_state_hash(dt_offload_state_t *st, int kind, uint64_t at, uint64_t n, uint64_t *h)
{
    if (st->state[kind]) {
        *h = dt_hash64_update(*h, st->state[kind] + at, n * sizeof(float));
        return DT_OK;
    }
    int rc = DT_OK;
    for (uint64_t c = 0; rc == DT_OK && c < n; c += st->piece) {
        uint64_t k = n - c < st->piece ? n - c : st->piece;
        rc = dt_offload_state_read(st, kind, at + c, k, st->stage[0][kind]);
        if (rc == DT_OK)
            *h = dt_hash64_update(*h, st->stage[0][kind], k * sizeof(float));
    }
    return rc;
}

int dt_offload_state_push(dt_offload_state_t *st, uint64_t at, uint64_t n, void *dcompute)
{
    size_t pes = dt_dtype_size(st->pdtype);
    int rc = DT_OK;
    for (uint64_t c = 0; rc == DT_OK && c < n; c += st->piece) {
        uint64_t k = n - c < st->piece ? n - c : st->piece;
        const float *src = st->state[DT_STATE_PARAMS];
        if (src) {
            src += at + c;
        } else {
            rc = dt_offload_state_read(st, DT_STATE_PARAMS, at + c, k, st->stage[0][0]);
            src = st->stage[0][0];
        }
        if (rc == DT_OK)
            rc = push_piece(st, src, at + c, k, dcompute ? (char *)dcompute + c * pes : NULL);
    }
    if (rc != DT_OK)
        st->host->log(st->host, DT_LOG_ERROR, "rank %d: copying %llu offloaded parameters to "
                      "the compute copy failed", st->rank, (unsigned long long)n);
    return rc;
}

/* A slice of a piece for one host optimizer thread. */
typedef struct optim_slice {
    const dt_host_v1_t *host;
    const dt_unit_desc_v1_t *unit;
    dt_range_t r;
    float *p, *m, *v;
    const float *g;
    const dt_optim_step_t *opt;
    int rc;
} optim_slice_t;

static void *optim_slice_run(void *arg)
{
    optim_slice_t *s = arg;
    s->rc = dt_optim_range_host(s->host, s->unit, s->r, s->p, s->g, s->m, s->v, s->opt);
    return NULL;
}

/* The host optimizer over range `r` of `unit` (p, g, m, v its r.count
 * elements), cut into st->threads slices of at least
 * DT_OFFLOAD_MIN_SLICE elements, each started on 64-byte boundaries, run
 * at once: the caller runs the first, a thread each the rest (inline
 * where a thread cannot start).  Every element's arithmetic is the same
 * wherever it runs, so the bits equal one thread's.  A failure is the
 * caller's slice's (the checks are the same for every slice, and come
 * before any write). */
static int optim_slices(dt_offload_state_t *st, const dt_unit_desc_v1_t *unit, dt_range_t r,
                        float *p, const float *g, float *m, float *v, const dt_optim_step_t *opt)
{
    uint64_t T = st->threads > 1 ? (uint64_t)st->threads : 1;
    if (T > r.count / DT_OFFLOAD_MIN_SLICE)
        T = r.count / DT_OFFLOAD_MIN_SLICE;
    if (T <= 1)
        return dt_optim_range_host(st->host, unit, r, p, g, m, v, opt);
    optim_slice_t sl[DT_OFFLOAD_MAX_THREADS];
    pthread_t th[DT_OFFLOAD_MAX_THREADS];
    int started[DT_OFFLOAD_MAX_THREADS] = {0};
    for (uint64_t t = 0; t < T; t++) {
        uint64_t lo = t == 0 ? 0 : (r.count * t / T) & ~(uint64_t)15;
        uint64_t hi = t + 1 == T ? r.count : (r.count * (t + 1) / T) & ~(uint64_t)15;
        sl[t] = (optim_slice_t){.host = st->host, .unit = unit,
                                .r = {r.offset + lo, hi - lo}, .p = p + lo, .g = g + lo,
                                .m = m + lo, .v = v ? v + lo : NULL, .opt = opt};
    }
    for (uint64_t t = 1; t < T; t++)
        started[t] = pthread_create(&th[t], NULL, optim_slice_run, &sl[t]) == 0;
    optim_slice_run(&sl[0]);
    for (uint64_t t = 1; t < T; t++) {
        if (started[t])
            pthread_join(th[t], NULL);
        else
            optim_slice_run(&sl[t]);
    }
    return sl[0].rc;
}

/* Requests of one staging set: its loads or its stores, one per kind,
 * then the gradients' (a load), then the parameters' (a store of the
 * tier's compute copy from the set's staging: f32 from the master's,
 * 16-bit from the gradients'): REQ_N of them. */
enum { REQ_GRADS = DT_STATE_COUNT, REQ_PARAMS = DT_STATE_COUNT + 1, REQ_N = DT_STATE_COUNT + 2 };

/* Wait for every request of `q` (each once), keeping the first failure. */
static int wait_all(dt_offload_state_t *st, dt_offload_req_t **q, int rc)
{
    for (int k = 0; k < REQ_N; k++) {
        if (!q[k])
            continue;
        int e = dt_offload_ops(st->tier)->wait(st->tier, q[k], -1);
        q[k] = NULL;
        if (rc == DT_OK)
            rc = e;
    }
    return rc;
}

int dt_offload_state_flush(dt_offload_state_t *st)
{
    int rc = DT_OK;
    for (int set = 0; set < 2; set++)
        rc = wait_all(st, st->ustore[set], rc);
    if (rc != DT_OK)
        st->host->log(st->host, DT_LOG_ERROR, "rank %d: storing the offloaded optimizer state "
                      "to offload tier '%s' failed", st->rank, tier_name(dt_offload_ops(st->tier)));
    return rc;
}

/* Start the transfers of state piece [a, a + n) between the tier and
 * staging set `set` (store or load; lead_of(a) elements into it), one
 * request per kind; `grads`: a load brings the piece's gradients too. */
static int start_piece(dt_offload_state_t *st, int set, int store, uint64_t a, uint64_t n,
                       int grads, dt_offload_req_t **q)
{
    int rc = DT_OK;
    const uint64_t lead = lead_of(a, sizeof(float), st->piece);
    st->moved[store ? 1 : 0] += (uint64_t)(st->n_kinds + (grads && !store)) * n * sizeof(float);
    if (grads && !store)
        rc = dt_offload_ops(st->tier)->load(st->tier, st->gbuf, a * sizeof(float),
                                            st->gload[set] + lead, n * sizeof(float), DT_MEM_HOST,
                                            NULL, &q[REQ_GRADS]);
    for (int k = 0; rc == DT_OK && k < st->n_kinds; k++)
        rc = store ? dt_offload_ops(st->tier)->store(st->tier, st->buf[k], a * sizeof(float),
                                    st->stage[set][k] + lead, n * sizeof(float), DT_MEM_HOST,
                                    NULL, &q[k])
                   : dt_offload_ops(st->tier)->load(st->tier, st->buf[k], a * sizeof(float),
                                   st->stage[set][k] + lead, n * sizeof(float), DT_MEM_HOST,
                                   NULL, &q[k]);
    return rc;
}

int dt_offload_state_update(dt_offload_state_t *st, const dt_unit_desc_v1_t *unit,
                            dt_range_t r, uint64_t at, const float *dgrad, void *dcompute,
                            const dt_optim_step_t *opt)
{
    size_t pes = dt_dtype_size(st->pdtype);
    const dt_device_ops_v1_t *d = dt_device_ops(st->dev);
    const int staged = st->state[0] == NULL;
    const int tier_grads = dgrad == NULL; /* read from the tier */
    if (tier_grads && !st->gbuf)
        return st->host->set_error(st->host, DT_ERR_INVALID,
                                   "offloaded optimizer: unit '%s': no gradients given and "
                                   "none in the tier", unit->name);
    if (at > st->numel || r.count > st->numel - at)
        return st->host->set_error(st->host, DT_ERR_INVALID,
                                   "offloaded optimizer: unit '%s' range [%llu, +%llu) at %llu "
                                   "is outside the %llu elements held", unit->name,
                                   (unsigned long long)r.offset, (unsigned long long)r.count,
                                   (unsigned long long)at, (unsigned long long)st->numel);
    /* the loads are this call's; the stores the state's (ustore): the
     * last piece's run on past the return, waited by the next call's
     * first piece that reuses its staging (or dt_offload_state_flush), so
     * the tier stays busy from one unit into the next */
    dt_offload_req_t *loads[2][REQ_N];
    dt_offload_req_t *(*stores)[REQ_N] = st->ustore;
    memset(loads, 0, sizeof loads);
    int rc = DT_OK;
    const char *what = "loading the state";
    /* the gradient's stores done before it is read into gload */
    if (tier_grads && (rc = grads_flush(st)) != DT_OK)
        return rc;
    /* parameters in a tier without host pointers are stored with the
     * state's stores: f32 straight from the master's staging, 16-bit
     * rounded into the piece's gradient staging (read by then) */
    dt_offload_params_t *par = st->params;
    const int direct = staged && par && !par->host_ptr &&
                       (st->pdtype == DT_F32 || (tier_grads && st->gload[0] && st->gload[1]));
    /* staged: pieces cut at the file's 4 KiB blocks (lead_of) */
    const size_t es = sizeof(float);
    const int set0 = (int)(st->uset & 1);
    const dt_host_v1_t *h = st->host;
    uint64_t p = 0, t0 = h->now_ns(h), t1;
    if (staged && r.count > 0)
        rc = wait_all(st, stores[set0], DT_OK);
    if (rc == DT_OK && staged && r.count > 0)
        rc = start_piece(st, set0, 0, at, chunk_of(at, es, st->piece, r.count), tier_grads,
                         loads[set0]);
    int last = set0 ^ 1;
    for (uint64_t c = 0, k = 0; rc == DT_OK && c < r.count; c += k, p++) {
        k = staged ? chunk_of(at + c, es, st->piece, r.count - c)
                   : (r.count - c < st->piece ? r.count - c : st->piece);
        const uint64_t lead = staged ? lead_of(at + c, es, st->piece) : 0;
        int set = (int)((set0 + p) & 1);
        last = set;
        float *s[DT_STATE_COUNT] = {NULL, NULL, NULL};
        if (staged) {
            /* the next piece's loads into the other set, once that set's
             * stores (the previous piece's) are done; then this piece's */
            uint64_t c2 = c + k;
            rc = wait_all(st, stores[set ^ 1], DT_OK);
            if (rc == DT_OK && c2 < r.count)
                rc = start_piece(st, set ^ 1, 0, at + c2,
                                 chunk_of(at + c2, es, st->piece, r.count - c2), tier_grads,
                                 loads[set ^ 1]);
            if (rc == DT_OK)
                rc = wait_all(st, loads[set], DT_OK);
            for (int kk = 0; kk < st->n_kinds; kk++)
                s[kk] = st->stage[set][kk] + lead;
            t1 = h->now_ns(h);
            st->ns_wait += t1 - t0;
            t0 = t1;
        } else {
            for (int kk = 0; kk < st->n_kinds; kk++)
                s[kk] = st->state[kk] + at + c;
        }
        /* the gradients of the piece: the tier's (loaded with the state),
         * or the device's once the compute stream wrote them */
        const float *g = st->gstage;
        if (tier_grads)
            g = st->grads ? st->grads + at + c : st->gload[set] + lead;
        if (rc == DT_OK && !tier_grads) {
            what = "copying gradients from the device";
            rc = d->memcpy_async(st->dev, st->gstage, dgrad + c, k * sizeof(float), DT_COPY_D2H,
                                 st->cs);
            if (rc == DT_OK)
                rc = d->stream_sync(st->dev, st->cs);
        }
        t1 = h->now_ns(h);
        st->ns_copy += t1 - t0;
        t0 = t1;
        if (rc == DT_OK) {
            what = "the host optimizer";
            rc = optim_slices(st, unit, (dt_range_t){r.offset + c, k}, s[0], g, s[1], s[2],
                              opt);
        }
        t1 = h->now_ns(h);
        st->ns_optim += t1 - t0;
        t0 = t1;
        if (rc == DT_OK && direct) {
            what = "storing the parameters";
            const void *src = s[0];
            if (st->pdtype != DT_F32) {
                uint16_t *h16 = (uint16_t *)(void *)st->gload[set] + lead_of(at + c, pes, st->piece);
                round_half(st->pdtype, s[0], h16, k);
                src = h16;
            }
            par->moved[1] += k * pes;
            rc = dt_offload_ops(par->tier)->store(par->tier, par->buf, (at + c) * pes, src, k * pes,
                                                  DT_MEM_HOST, NULL, &stores[set][REQ_PARAMS]);
        } else if (rc == DT_OK) {
            what = "writing the parameters";
            rc = push_piece(st, s[0], at + c, k, dcompute ? (char *)dcompute + c * pes : NULL);
        }
        t1 = h->now_ns(h);
        st->ns_copy += t1 - t0;
        t0 = t1;
        if (rc == DT_OK && staged) {
            what = "storing the state";
            rc = start_piece(st, set, 1, at + c, k, 0, stores[set]);
        }
        if (rc != DT_OK)
            st->host->log(st->host, DT_LOG_ERROR, "rank %d: offloaded optimizer step of unit "
                          "'%s' [%llu, +%llu): %s failed", st->rank, unit->name,
                          (unsigned long long)(r.offset + c), (unsigned long long)k, what);
    }
    /* no load stays in flight; the last piece's stores do (on success) */
    for (int set = 0; set < 2; set++)
        rc = wait_all(st, loads[set], rc);
    if (rc != DT_OK)
        rc = wait_all(st, stores[0], wait_all(st, stores[1], rc));
    st->uset = (uint32_t)(last ^ 1); /* the next call starts on the other set */
    st->ns_wait += h->now_ns(h) - t0;
    int e = d->stream_sync(st->dev, st->cs);
    return rc != DT_OK ? rc : e;
}

/* ------------------------------------------------------------ gradients */

int dt_offload_state_grads(dt_offload_state_t *st)
{
    int rc = dt_offload_ops(st->tier)->alloc(st->tier, st->numel * sizeof(float), DT_TAG_GRADS,
                                             &st->gbuf);
    if (rc == DT_OK && (rc = host_ptr_of(st->tier, st->gbuf, (void **)&st->grads)) ==
                           DT_OK && st->grads)
        memset(st->grads, 0, st->numel * sizeof(float));
    for (int s = 0; rc == DT_OK && !st->grads && s < 2; s++)
        rc = dt_device_ops(st->dev)->host_alloc(st->dev, st->piece * sizeof(float), DT_TAG_STAGING,
                                     (void **)&st->gload[s]);
    if (rc != DT_OK)
        st->host->log(st->host, DT_LOG_ERROR,
                      "rank %d: %llu bytes of gradients in offload "
                      "tier '%s' failed",
                      st->rank, (unsigned long long)(st->numel * sizeof(float)),
                      tier_name(dt_offload_ops(st->tier)));
    return rc;
}

/* Check [at, at + n) lies in the gradient held. */
static int grads_range(dt_offload_state_t *st, const char *what, uint64_t at, uint64_t n)
{
    if (!st->gbuf)
        return st->host->set_error(st->host, DT_ERR_INVALID, "%s: no gradients in the tier",
                                   what);
    if (at > st->numel || n > st->numel - at)
        return st->host->set_error(st->host, DT_ERR_INVALID, "%s: [%llu, +%llu) is outside "
                                   "the %llu gradient elements held", what,
                                   (unsigned long long)at, (unsigned long long)n,
                                   (unsigned long long)st->numel);
    return DT_OK;
}

int dt_offload_grads_add(dt_offload_state_t *st, uint64_t at, uint64_t n, const float *dsrc,
                         dt_stream_t *stream, int mode)
{
    const dt_device_ops_v1_t *d = dt_device_ops(st->dev);
    const dt_host_v1_t *h = st->host;
    int rc = grads_range(st, "gradients to the tier", at, n);
    uint64_t t0 = h->now_ns(h);
    for (uint64_t c = 0; rc == DT_OK && st->grads && c < n; c += st->piece) {
        /* in place in the tier's host memory */
        uint64_t k = n - c < st->piece ? n - c : st->piece;
        float *y = st->grads + at + c;
        rc = d->memcpy_async(st->dev, st->gstage, dsrc + c, k * sizeof(float), DT_COPY_D2H,
                             stream);
        if (rc == DT_OK)
            rc = d->stream_sync(st->dev, stream);
        if (rc != DT_OK)
            break;
        const float *x = st->gstage;
        if (mode == DT_OFFLOAD_GRADS_COPY)
            memcpy(y, x, k * sizeof(float));
        else if (mode == DT_OFFLOAD_GRADS_FIRST)
            for (uint64_t i = 0; i < k; i++)
                y[i] = 0.0f + x[i];
        else
            for (uint64_t i = 0; i < k; i++)
                y[i] = y[i] + x[i];
    }
    /* Through store: each piece combined in one of the two gload pieces
     * and stored from it while the next piece comes over; a piece waits
     * only for the store that last used its staging (two pieces back),
     * and for one in flight over the same elements before reading them. */
    for (uint64_t c = 0, k = 0; rc == DT_OK && !st->grads && c < n; c += k) {
        const uint64_t a = at + c;
        k = chunk_of(a, sizeof(float), st->piece, n - c);
        int s = (int)st->gwnext;
        st->gwnext ^= 1;
        rc = grads_wait(st, s);
        if (rc == DT_OK && st->gwreq[s ^ 1] &&
            st->gwat[s ^ 1] < a + k && a < st->gwat[s ^ 1] + st->gwn[s ^ 1])
            rc = grads_wait(st, s ^ 1);
        if (rc != DT_OK)
            break;
        float *y = st->gload[s] + lead_of(a, sizeof(float), st->piece);
        dt_offload_req_t *lreq = NULL;
        /* the sum so far loading while the block comes from the device */
        if (mode == DT_OFFLOAD_GRADS_ADD) {
            st->moved[0] += k * sizeof(float);
            rc = dt_offload_ops(st->tier)->load(st->tier, st->gbuf, a * sizeof(float), y,
                                                k * sizeof(float), DT_MEM_HOST, NULL, &lreq);
        }
        float *x = mode == DT_OFFLOAD_GRADS_ADD ? st->gstage : y;
        if (rc == DT_OK)
            rc = d->memcpy_async(st->dev, x, dsrc + c, k * sizeof(float), DT_COPY_D2H, stream);
        if (rc == DT_OK)
            rc = d->stream_sync(st->dev, stream);
        if (lreq) {
            int e = dt_offload_ops(st->tier)->wait(st->tier, lreq, -1);
            if (rc == DT_OK)
                rc = e;
        }
        if (rc != DT_OK)
            break;
        if (mode == DT_OFFLOAD_GRADS_FIRST)
            for (uint64_t i = 0; i < k; i++)
                y[i] = 0.0f + y[i];
        else if (mode == DT_OFFLOAD_GRADS_ADD)
            for (uint64_t i = 0; i < k; i++)
                y[i] = y[i] + x[i];
        st->gwat[s] = a;
        st->gwn[s] = k;
        st->moved[1] += k * sizeof(float);
        rc = dt_offload_ops(st->tier)->store(st->tier, st->gbuf, a * sizeof(float), y,
                                             k * sizeof(float), DT_MEM_HOST, NULL, &st->gwreq[s]);
        if (rc != DT_OK)
            st->gwreq[s] = NULL;
    }
    st->ns_grads += h->now_ns(h) - t0;
    if (rc != DT_OK)
        h->log(h, DT_LOG_ERROR, "rank %d: moving %llu reduced gradients at %llu to offload "
               "tier '%s' failed", st->rank, (unsigned long long)n, (unsigned long long)at,
               tier_name(dt_offload_ops(st->tier)));
    return rc;
}

int dt_offload_grads_load(dt_offload_state_t *st, uint64_t at, uint64_t n, float *ddst,
                          dt_stream_t *stream)
{
    const dt_device_ops_v1_t *d = dt_device_ops(st->dev);
    int rc = grads_range(st, "gradients from the tier", at, n);
    if (rc == DT_OK)
        rc = grads_flush(st); /* the stores done, gload[0] free */
    for (uint64_t c = 0; rc == DT_OK && c < n; c += st->piece) {
        uint64_t k = n - c < st->piece ? n - c : st->piece;
        float *x = st->grads ? st->grads + at + c : st->gload[0];
        if (!st->grads)
            rc = tier_io(st->tier, st->gbuf, 0, (at + c) * sizeof(float), x,
                         k * sizeof(float), st->moved);
        if (rc == DT_OK)
            rc = d->memcpy_async(st->dev, ddst + c, x, k * sizeof(float), DT_COPY_H2D, stream);
        if (rc == DT_OK) /* the staging is reused next */
            rc = d->stream_sync(st->dev, stream);
    }
    if (rc != DT_OK)
        st->host->log(st->host, DT_LOG_ERROR, "rank %d: loading %llu gradients at %llu from "
                      "offload tier '%s' failed", st->rank, (unsigned long long)n,
                      (unsigned long long)at, tier_name(dt_offload_ops(st->tier)));
    return rc;
}

/* Add the elements of x = shard elements [at, at + k) that lie in
 * skip[] (sorted) to *run. */
static void add_skipped(dt_sumsq_run_t *run, const float *x, uint64_t at, uint64_t k,
                        const dt_range_t *skip, uint32_t n_skip)
{
    for (uint32_t i = 0; i < n_skip; i++) {
        uint64_t lo = skip[i].offset > at ? skip[i].offset : at;
        uint64_t hi = skip[i].offset + skip[i].count < at + k ? skip[i].offset + skip[i].count
                                                              : at + k;
        if (lo < hi)
            dt_sumsq_run_add(run, x + (lo - at), hi - lo);
    }
}

int dt_offload_grads_sumsq_skip(dt_offload_state_t *st, const dt_range_t *skip,
                                uint32_t n_skip, double *out)
{
    dt_sumsq_run_t run, left;
    dt_sumsq_run_init(&run, (int64_t)st->numel);
    dt_sumsq_run_init(&left, (int64_t)st->numel);
    int rc = grads_range(st, "the gradient norm", 0, st->numel);
    if (rc == DT_OK)
        rc = grads_flush(st);
    if (rc == DT_OK && st->grads) {
        dt_sumsq_run_add(&run, st->grads, st->numel);
        add_skipped(&left, st->grads, 0, st->numel, skip, n_skip);
    }
    /* through store: the next piece loading into the other gload while
     * this one is summed, in order */
    dt_offload_req_t *lr[2] = {NULL, NULL};
    const uint64_t N = st->numel, P = st->piece;
    if (rc == DT_OK && !st->grads) {
        st->moved[0] += N * sizeof(float);
        rc = dt_offload_ops(st->tier)->load(st->tier, st->gbuf, 0, st->gload[0],
                           (N < P ? N : P) * sizeof(float), DT_MEM_HOST, NULL, &lr[0]);
    }
    for (uint64_t c = 0, p = 0; rc == DT_OK && !st->grads && c < N; c += P, p++) {
        const int b = (int)(p & 1);
        uint64_t k = N - c < P ? N - c : P, c2 = c + P;
        if (c2 < N)
            rc = dt_offload_ops(st->tier)->load(
                st->tier, st->gbuf, c2 * sizeof(float), st->gload[b ^ 1],
                (N - c2 < P ? N - c2 : P) * sizeof(float), DT_MEM_HOST, NULL, &lr[b ^ 1]);
        int e = dt_offload_ops(st->tier)->wait(st->tier, lr[b], -1);
        lr[b] = NULL;
        if (rc == DT_OK)
            rc = e;
        if (rc == DT_OK) {
            dt_sumsq_run_add(&run, st->gload[b], k);
            add_skipped(&left, st->gload[b], c, k, skip, n_skip);
        }
    }
    for (int b = 0; b < 2; b++) /* a failure's load still in flight */
        if (lr[b])
            (void)dt_offload_ops(st->tier)->wait(st->tier, lr[b], -1);
    if (rc != DT_OK)
        st->host->log(st->host, DT_LOG_ERROR, "rank %d: reading the offloaded gradients for "
                      "their norm failed", st->rank);
    const double all = dt_sumsq_run_end(&run), copies = dt_sumsq_run_end(&left);
    /* rounding may take a little below 0; NaN and Inf pass */
    *out = n_skip == 0 ? all : all - copies < 0.0 ? 0.0 : all - copies;
    return rc;
}

int dt_offload_grads_sumsq(dt_offload_state_t *st, double *out)
{
    return dt_offload_grads_sumsq_skip(st, NULL, 0, out);
}

void dt_offload_state_report(dt_offload_state_t *st, const char *when)
{
    const dt_host_v1_t *h = st->host;
    uint64_t rd = st->moved[0], wr = st->moved[1];
    if (st->params) {
        rd += st->params->moved[0];
        wr += st->params->moved[1];
        st->params->moved[0] = st->params->moved[1] = 0;
    }
    h->log(h, DT_LOG_DEBUG, "%s: offloaded optimizer: tier I/O wait %.2f ms, device copies "
           "%.2f ms, host optimizer %.2f ms (%d thread(s)), gradients to the tier %.2f ms; "
           "tier bytes loaded %llu, stored %llu, moved %llu", when,
           (double)st->ns_wait / 1e6, (double)st->ns_copy / 1e6, (double)st->ns_optim / 1e6,
           st->threads, (double)st->ns_grads / 1e6, (unsigned long long)rd,
           (unsigned long long)wr, (unsigned long long)(rd + wr));
    st->ns_wait = st->ns_copy = st->ns_optim = st->ns_grads = 0;
    st->moved[0] = st->moved[1] = 0;
}

int dt_offload_state_collective(dt_offload_state_t *st, int kind, dt_comm_t *comm, int32_t root,
                                int op)
{
    const dt_device_ops_v1_t *d = dt_device_ops(st->dev);
    if (kind < 0 || kind >= st->n_kinds)
        return DT_OK; /* SGD keeps no second moment */
    float *dbuf = NULL;
    float *stage = st->stage[0][kind];
    int rc = d->alloc(st->dev, st->piece * sizeof(float), DT_TAG_COMM, (void **)&dbuf);
    for (uint64_t c = 0; rc == DT_OK && c < st->numel; c += st->piece) {
        uint64_t k = st->numel - c < st->piece ? st->numel - c : st->piece;
        float *host = st->state[kind] ? st->state[kind] + c : stage;
        if (!st->state[kind])
            rc = dt_offload_state_read(st, kind, c, k, stage);
        if (rc == DT_OK)
            rc = d->memcpy_async(st->dev, dbuf, host, k * sizeof(float), DT_COPY_H2D, st->cs);
        if (rc == DT_OK)
            rc = root >= 0
                     ? dt_comm_ops(comm)->broadcast(comm, dbuf, k, DT_F32, root, st->cs, NULL)
                     : dt_comm_ops(comm)->all_reduce(comm, dbuf, dbuf, k, DT_F32, op, st->cs, NULL);
        if (rc == DT_OK)
            rc = d->memcpy_async(st->dev, host, dbuf, k * sizeof(float), DT_COPY_D2H, st->cs);
        if (rc == DT_OK)
            rc = d->stream_sync(st->dev, st->cs);
        if (rc == DT_OK && !st->state[kind])
            rc = dt_offload_state_write(st, kind, c, k, stage);
    }
    if (dbuf)
        d->free(st->dev, dbuf);
    if (rc != DT_OK)
        st->host->log(st->host, DT_LOG_ERROR, "rank %d: %s of the offloaded %s (%llu elements) "
                      "failed", st->rank, root >= 0 ? "broadcast" : "all-reduce",
                      dt_state_kind_name(kind), (unsigned long long)st->numel);
    return rc;
}
