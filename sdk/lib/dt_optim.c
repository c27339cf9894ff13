/*
 * sdk/lib/dt_optim.c - the optimizer driven over a range of a unit's flat
 * space (tensor by tensor, so weight decay follows each tensor's flags even
 * when a shard cuts a tensor in two), on the device or on host memory (the
 * loops of dt_optim_host.c), and the clip coefficient.
 */
#include "dtrain/sdk/optim.h"
#include "dtrain/sdk/ranges.h"

#include <math.h>

float dt_clip_scale(double norm, float clip)
{
    if (!(clip > 0.0f))
        return 1.0f;
    double c = (double)clip / (norm + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}

/* One device call over [off, off + n) of the range (range-local indices). */
static int optim_run(const dt_host_v1_t *host, const dt_kernels_t *k, dt_device_t *dev,
                     dt_stream_t *s, const dt_unit_desc_v1_t *unit, const dt_param_desc_v1_t *first,
                     uint64_t off, uint64_t n, float wd, float *param, const float *grad, float *m,
                     float *v, const dt_optim_step_t *st)
{
    const dt_optim_desc_v1_t *o = st->desc;
    int rc;
    if (o->kind == DT_OPTIM_ADAMW ? !DT_HAS_OP(dt_kernels_t, k, adamw_update)
                                  : !DT_HAS_OP(dt_kernels_t, k, sgd_update))
        return host->set_error(host, DT_ERR_UNSUPPORTED,
                               "optimizer: device '%s' has no kernel '%s' (f32 parameters "
                               "and gradients; unit '%s')",
                               dt_device_ops(dev)->info.name ? dt_device_ops(dev)->info.name : "?",
                               o->kind == DT_OPTIM_ADAMW ? "adamw_update" : "sgd_update",
                               unit->name);
    if (o->kind == DT_OPTIM_ADAMW)
        rc = k->adamw_update(dev, s, param + off, grad + off, m + off, v + off, DT_F32,
                             (int64_t)n, st->lr, o->beta1, o->beta2, o->eps, wd, st->grad_scale,
                             st->t);
    else
        rc = k->sgd_update(dev, s, param + off, grad + off, m + off, DT_F32, (int64_t)n,
                           st->lr, o->momentum, wd, o->nesterov, st->grad_scale);
    if (rc != DT_OK)
        host->log(host, DT_LOG_ERROR,
                  "optimizer update of unit '%s' from tensor '%s' (%llu elements) failed: %s",
                  unit->name, first->name ? first->name : "?", (unsigned long long)n,
                  dt_status_name(rc));
    return rc;
}

/* Where a run of merged pieces goes: the device's kernel or the host loop. */
typedef struct optim_target {
    const dt_kernels_t *k;         /* the device's kernels(), fetched once per range */
    dt_device_t *dev;              /* NULL: host memory */
    dt_stream_t *s;
} optim_target_t;

/* One host update over [off, off + n) of the range: dt_optim_host.c's loops. */
static void optim_run_host(uint64_t off, uint64_t n, float wd, float *param, const float *grad,
                           float *m, float *v, const dt_optim_step_t *st)
{
    const dt_optim_desc_v1_t *o = st->desc;
    if (o->kind == DT_OPTIM_ADAMW) {
        dt_adamw_hyper_t h = dt_adamw_hyper(o, st->lr, wd, st->grad_scale, st->t);
        dt_adamw_f32(param + off, grad + off, m + off, v + off, (int64_t)n, &h);
    } else {
        dt_sgd_f32(param + off, grad + off, m + off, (int64_t)n,
                   st->lr, o->momentum, wd, o->nesterov, st->grad_scale);
    }
}

/* The checks and the walk both paths share: pieces of `r` merged into
 * runs of one decay, each run handed to the target. */
static int optim_range(const dt_host_v1_t *host, const optim_target_t *tg,
                       const dt_unit_desc_v1_t *unit, dt_range_t r, float *param,
                       const float *grad, float *m, float *v, const dt_optim_step_t *st)
{
    const dt_optim_desc_v1_t *o = st->desc;
    if (r.count > unit->numel || r.offset > unit->numel - r.count)
        return host->set_error(host, DT_ERR_INVALID,
                               "optimizer: range [%llu, +%llu) is outside unit '%s' (%u) of "
                               "%llu elements",
                               (unsigned long long)r.offset, (unsigned long long)r.count,
                               unit->name, unit->index, (unsigned long long)unit->numel);
    if (o->kind != DT_OPTIM_ADAMW && o->kind != DT_OPTIM_SGD)
        return host->set_error(host, DT_ERR_INVALID, "optimizer: unknown kind %d (unit '%s')",
                               o->kind, unit->name);
    if (r.count == 0)
        return DT_OK;
    if (!param || !grad || !m || (o->kind == DT_OPTIM_ADAMW && !v))
        return host->set_error(host, DT_ERR_INVALID,
                               "optimizer: NULL %s buffer for unit '%s'",
                               !param ? "param" : !grad ? "grad" : !m ? "first-moment" : "second-moment",
                               unit->name);
    if (o->kind == DT_OPTIM_ADAMW && st->t < 1)
        return host->set_error(host, DT_ERR_INVALID,
                               "optimizer: AdamW step count %lld for unit '%s' (must be >= 1)",
                               (long long)st->t, unit->name);

    /* Merge neighbouring pieces that share a decay: a GPT-2 block then costs
     * a handful of launches instead of one per tensor. */
    dt_piece_iter_t it;
    dt_piece_t p;
    dt_piece_iter_init(&it, unit, r);
    const dt_param_desc_v1_t *run_first = NULL;
    uint64_t run_off = 0, run_n = 0;
    float run_wd = 0.0f;
    for (int more = 1; more;) {
        more = dt_piece_iter_next(&it, &p);
        float wd = more && !(p.desc->flags & DT_PARAM_NO_DECAY) ? o->weight_decay : 0.0f;
        if (more && run_first && wd == run_wd && run_off + run_n == p.range_offset) {
            run_n += p.count;
            continue;
        }
        if (run_first) {
            if (!tg->dev) {
                optim_run_host(run_off, run_n, run_wd, param, grad, m, v, st);
            } else {
                int rc = optim_run(host, tg->k, tg->dev, tg->s, unit, run_first, run_off,
                                   run_n, run_wd, param, grad, m, v, st);
                if (rc != DT_OK)
                    return rc;
            }
        }
        if (more) {
            run_first = p.desc;
            run_off = p.range_offset;
            run_n = p.count;
            run_wd = wd;
        }
    }
    return DT_OK;
}

int dt_optim_range(const dt_host_v1_t *host, dt_device_t *dev, dt_stream_t *s,
                   const dt_unit_desc_v1_t *unit, dt_range_t r, float *param,
                   const float *grad, float *m, float *v,
                   const dt_optim_step_t *st)
{
    if (!dev)
        return host->set_error(host, DT_ERR_INVALID, "optimizer: no device (unit '%s')",
                               unit->name);
    const optim_target_t tg = {dt_device_ops(dev)->kernels(), dev, s};
    return optim_range(host, &tg, unit, r, param, grad, m, v, st);
}

int dt_optim_range_host(const dt_host_v1_t *host, const dt_unit_desc_v1_t *unit, dt_range_t r,
                        float *param, const float *grad, float *m, float *v,
                        const dt_optim_step_t *st)
{
    const optim_target_t tg = {NULL, NULL, NULL};
    return optim_range(host, &tg, unit, r, param, grad, m, v, st);
}
