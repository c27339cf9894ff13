/*
 * sdk/lib/dt_dp.c - what every data-parallel strategy (the ddp plugin, the
 * sharded engine behind zero and fsdp) checks and keeps alike: its init
 * arguments, the hook protocol, the start and the norm of a step, state
 * requests by global range, and the planner's persistent-state bytes.
 * One copy, so the strategies refuse the same misuse with the same words.
 */
#include "dtrain/sdk/dp.h"
#include "dtrain/sdk/norm.h"
#include "dtrain/sdk/ranges.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static const char *unit_name(const dt_dp_t *b, uint32_t u)
{
    const char *n = b->model->units[u].name;
    return n ? n : "?";
}

/* ------------------------------------------------------------ init */

int dt_strategy_args_read(const dt_host_v1_t *host, const dt_strategy_init_v1_t *in,
                          dt_strategy_args_t *out)
{
    memset(out, 0, sizeof *out);
    dt_strategy_init_v1_t *args = &out->init;
    int rc = dt_args_read(host, "init args", args, sizeof *args, in, DT_STRATEGY_INIT_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!args->model || !args->optim)
        return host->set_error(host, DT_ERR_INVALID, "init: NULL %s",
                               !args->model ? "model" : "optim");
    if ((rc = dt_args_read(host, "init args: model", &out->model, sizeof out->model,
                           args->model, DT_MODEL_DESC_V1_SIZE0)) != DT_OK ||
        (rc = dt_args_read(host, "init args: optim", &out->optim, sizeof out->optim,
                           args->optim, DT_OPTIM_DESC_V1_SIZE0)) != DT_OK)
        return rc;
    args->model = &out->model;
    args->optim = &out->optim;
    return DT_OK;
}

/* Read `in` into b->args and check it. */
static int read_args(dt_dp_t *b, const dt_host_v1_t *host, const dt_strategy_init_v1_t *in,
                     const char *what)
{
    int rc = dt_strategy_args_read(host, in, &b->args);
    if (rc != DT_OK)
        return rc;
    const dt_strategy_init_v1_t *args = &b->args.init;
    if (!args->dev || !args->comm)
        return host->set_error(host, DT_ERR_INVALID, "init: NULL %s",
                               !args->dev ? "dev" : "comm");
    if (args->n_micro < 1)
        return host->set_error(host, DT_ERR_INVALID, "init: n_micro = 0");
    const dt_model_desc_v1_t *model = args->model;
    if (model->param_dtype != DT_F32 && model->param_dtype != DT_BF16 &&
        model->param_dtype != DT_F16)
        return host->set_error(host, DT_ERR_UNSUPPORTED,
                               "param_dtype %s: %s keeps f32, bf16 or f16 compute parameters",
                               dt_dtype_name(model->param_dtype), what);
    if (args->optim->kind != DT_OPTIM_ADAMW && args->optim->kind != DT_OPTIM_SGD)
        return host->set_error(host, DT_ERR_INVALID, "init: unknown optimizer kind %d",
                               args->optim->kind);
    if (model->n_units > 0 && !model->units)
        return host->set_error(host, DT_ERR_INVALID, "init: model has %u units but no table",
                               model->n_units);
    for (uint32_t u = 0; u < model->n_units; u++) {
        if (model->units[u].index != u)
            return host->set_error(host, DT_ERR_INVALID, "unit '%s' at position %u has index %u",
                                   model->units[u].name, u, model->units[u].index);
        int rc = dt_unit_validate(host, &model->units[u]);
        if (rc != DT_OK)
            return rc;
    }
    return DT_OK;
}

/* A pipeline stage (strategy ABI 1.3): keep the flags, check them, and
 * point the model at a copy of its units with those not held emptied. */
static int read_stage(dt_dp_t *b, const char *what)
{
    const dt_host_v1_t *host = b->host;
    const dt_strategy_init_v1_t *args = &b->args.init;
    dt_model_desc_v1_t *model = &b->args.model;
    const uint32_t nu = model->n_units;
    b->norm_comm = args->norm_comm;
    b->tied_comm = args->tied_comm;
    if (!args->unit_flags)
        return b->tied_comm ? host->set_error(host, DT_ERR_INVALID,
                                              "init: tied_comm without unit_flags")
                            : DT_OK;
    b->unit_flags = host->alloc(host, (uint64_t)nu + 1, DT_TAG_OTHER);
    b->stage_units = host->alloc(host, ((uint64_t)nu + 1) * sizeof *b->stage_units,
                                 DT_TAG_OTHER);
    if (!b->unit_flags || !b->stage_units)
        return host->set_error(host, DT_ERR_NOMEM, "stage bookkeeping for %u units", nu);
    uint32_t held = 0, tied = 0;
    for (uint32_t u = 0; u < nu; u++) {
        uint8_t f = args->unit_flags[u];
        b->unit_flags[u] = f;
        b->stage_units[u] = model->units[u];
        if ((f & ~(DT_UNIT_HELD | DT_UNIT_TIED | DT_UNIT_COPY)) ||
            ((f & DT_UNIT_COPY) && !(f & DT_UNIT_TIED)) || ((f & DT_UNIT_TIED) && !(f & DT_UNIT_HELD)))
            return host->set_error(host, DT_ERR_INVALID,
                                   "init: unit '%s' has stage flags 0x%x (COPY needs TIED, "
                                   "TIED needs HELD)", unit_name(b, u), f);
        held += (f & DT_UNIT_HELD) != 0;
        tied += (f & DT_UNIT_TIED) != 0;
        if (!(f & DT_UNIT_HELD)) {
            b->stage_units[u].n_params = 0;
            b->stage_units[u].params = NULL;
            b->stage_units[u].numel = 0;
            b->stage_units[u].act_bytes = 0;
        }
    }
    if (!held)
        return host->set_error(host, DT_ERR_INVALID, "init: the stage holds none of the %u units",
                               nu);
    if ((tied > 0) != (b->tied_comm != NULL))
        return host->set_error(host, DT_ERR_INVALID,
                               "init: %s", tied ? "a unit is TIED but tied_comm is NULL"
                                                : "tied_comm set but no unit is TIED");
    model->units = b->stage_units;
    host->log(host, DT_LOG_DEBUG, "%s: pipeline stage holding %u of %u units%s", what, held, nu,
              tied ? ", tied units summed over tied_comm" : "");
    return DT_OK;
}

int dt_dp_init(dt_dp_t *b, const dt_strategy_ops_v1_t *ops, const dt_host_v1_t *host,
               const dt_strategy_init_v1_t *args, const char *what)
{
    memset(b, 0, sizeof *b);
    b->ops = ops;
    b->host = host;
    int rc = read_args(b, host, args, what);
    if (rc != DT_OK)
        return rc;
    b->dev = b->args.init.dev;
    b->kernels = dt_device_ops(b->dev)->kernels();
    b->cs = b->args.init.compute_stream;
    b->comm = b->args.init.comm;
    b->model = &b->args.model;
    b->optim = b->args.optim;
    if ((rc = read_stage(b, what)) != DT_OK)
        return rc;
    if ((rc = dt_comm_ops(b->comm)->rank_size(b->comm, &b->rank, &b->size)) != DT_OK) {
        host->log(host, DT_LOG_ERROR, "init: comm rank_size failed");
        return rc;
    }
    if (b->size < 1 || b->rank < 0 || b->rank >= b->size)
        return host->set_error(host, DT_ERR_INVALID, "init: comm reports rank %d of %d", b->rank,
                               b->size);
    uint64_t bytes = ((uint64_t)b->model->n_units + 1) * sizeof(uint32_t);
    b->fwd_depth = host->alloc(host, bytes, DT_TAG_OTHER);
    b->bwd_depth = host->alloc(host, bytes, DT_TAG_OTHER);
    if (!b->fwd_depth || !b->bwd_depth)
        return host->set_error(host, DT_ERR_NOMEM, "hook bookkeeping for %u units",
                               b->model->n_units);
    memset(b->fwd_depth, 0, bytes);
    memset(b->bwd_depth, 0, bytes);
    return DT_OK;
}

void dt_dp_free(dt_dp_t *b)
{
    if (!b || !b->host)
        return;
    b->host->free(b->host, b->fwd_depth);
    b->host->free(b->host, b->bwd_depth);
    b->host->free(b->host, b->unit_flags);
    b->host->free(b->host, b->stage_units);
    b->fwd_depth = b->bwd_depth = NULL;
    b->unit_flags = NULL;
    b->stage_units = NULL;
}

/* ------------------------------------------------------------ hooks */

/* Forward hooks do not look at micro-steps (evaluation passes may leave
 * them 0); backward hooks need them to find the final micro-step. */
static int hook_check(const dt_dp_t *b, const dt_hook_v1_t *h, const char *what,
                      int check_micro)
{
    const dt_host_v1_t *host = b->host;
    if (!h)
        return host->set_error(host, DT_ERR_INVALID, "%s: NULL hook", what);
    char name[48];
    snprintf(name, sizeof name, "%s: hook", what);
    int rc = dt_args_check(host, name, h, sizeof *h, DT_HOOK_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (h->unit >= b->model->n_units)
        return host->set_error(host, DT_ERR_INVALID,
                               "%s: unit %u out of range (model has %u units)", what, h->unit,
                               b->model->n_units);
    if (!(dt_dp_unit_flags(b, h->unit) & DT_UNIT_HELD))
        return host->set_error(host, DT_ERR_INVALID,
                               "%s: unit '%s' (%u) is another pipeline stage's", what,
                               unit_name(b, h->unit), h->unit);
    if (check_micro && (h->n_micro == 0 || h->micro >= h->n_micro))
        return host->set_error(host, DT_ERR_INVALID, "%s: unit '%s': micro-step %u of %u", what,
                               unit_name(b, h->unit), h->micro, h->n_micro);
    return DT_OK;
}

int dt_dp_hook_enter(dt_dp_t *b, const dt_hook_v1_t *h, int backward,
                     dt_unit_buffers_v1_t *out)
{
    const char *what = backward ? "pre_backward" : "pre_forward";
    int rc = hook_check(b, h, what, backward);
    if (rc != DT_OK)
        return rc;
    if (!out)
        return b->host->set_error(b->host, DT_ERR_INVALID, "%s: NULL buffers", what);
    /* the engine writes minor-0 fields only: the caller's size must span them */
    if ((rc = dt_args_check(b->host, backward ? "pre_backward: buffers" : "pre_forward: buffers",
                            out, out->struct_size, DT_UNIT_BUFFERS_V1_SIZE0)) != DT_OK)
        return rc;
    out->params = NULL;
    out->grads = NULL;
    if (backward && (h->flags & DT_HOOK_NO_GRAD))
        return b->host->set_error(b->host, DT_ERR_INVALID,
                                  "pre_backward: unit '%s' in a no-grad (evaluation) pass",
                                  unit_name(b, h->unit));
    (backward ? b->bwd_depth : b->fwd_depth)[h->unit]++;
    return DT_OK;
}

int dt_dp_hook_leave(dt_dp_t *b, const dt_hook_v1_t *h, int backward)
{
    const char *what = backward ? "post_backward" : "post_forward";
    int rc = hook_check(b, h, what, backward);
    if (rc != DT_OK)
        return rc;
    uint32_t *depth = backward ? b->bwd_depth : b->fwd_depth;
    if (depth[h->unit] == 0)
        return b->host->set_error(b->host, DT_ERR_INVALID, "%s: unit '%s' (%u) without a %s",
                                  what, unit_name(b, h->unit), h->unit,
                                  backward ? "pre_backward" : "pre_forward");
    depth[h->unit]--;
    return DT_OK;
}

void dt_dp_hooks_reset(dt_dp_t *b)
{
    uint32_t nu = b->model->n_units;
    memset(b->fwd_depth, 0, nu * sizeof(uint32_t));
    memset(b->bwd_depth, 0, nu * sizeof(uint32_t));
}

/* ------------------------------------------------------------ the step */

int dt_dp_step_check(const dt_dp_t *b, const dt_step_args_v1_t *args, dt_step_result_v1_t *out)
{
    const dt_host_v1_t *host = b->host;
    if (!args || !out)
        return host->set_error(host, DT_ERR_INVALID, "step: NULL %s", args ? "result" : "args");
    int rc = dt_args_check(host, "step args", args, sizeof *args, DT_STEP_ARGS_V1_SIZE0);
    if (rc == DT_OK)
        rc = dt_args_check(host, "step result", out, out->struct_size, DT_STEP_RESULT_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    out->grad_norm = 0.0;
    out->nonfinite = 0;
    if (b->optim.kind == DT_OPTIM_ADAMW && args->step < 1)
        return host->set_error(host, DT_ERR_INVALID,
                               "step: AdamW step count %lld (must be >= 1)",
                               (long long)args->step);
    for (uint32_t u = 0; u < b->model->n_units; u++)
        if (b->bwd_depth[u] || b->fwd_depth[u])
            return host->set_error(host, DT_ERR_INVALID,
                                   "step: unit '%s' (%u) is still inside a pre_%s hook",
                                   unit_name(b, u), u, b->bwd_depth[u] ? "backward" : "forward");
    return DT_OK;
}

dt_optim_step_t dt_dp_step_norm(const dt_dp_t *b, const dt_step_args_v1_t *args, double sumsq,
                                dt_step_result_v1_t *out)
{
    /* the gradients carry loss_scale (a power of two under dynamic
     * scaling, so dividing it out is exact): the norm is the unscaled
     * gradient's, and the optimizer's multiplier unscales as it clips */
    const float ls = DT_HAS_FIELD(dt_step_args_v1_t, args, loss_scale) ? args->loss_scale : 0.0f;
    const double carried = ls > 0 ? (double)ls : 1.0; /* an older core's args: absent */
    double norm = sqrt(sumsq) / carried;
    dt_optim_step_t st = {.desc = &b->optim, .lr = args->lr, .grad_scale = 0.0f, .t = args->step};
    out->grad_norm = norm;
    if (!isfinite(norm)) {
        out->nonfinite = 1;
        b->host->log(b->host, DT_LOG_WARN, "step %lld: gradient norm is %s, update skipped",
                     (long long)args->step, isnan(norm) ? "NaN" : norm > 0 ? "inf" : "-inf");
        return st;
    }
    st.grad_scale = (float)((double)dt_clip_scale(norm, args->clip) / carried);
    return st;
}

/* ------------------------------------------------------------ state */

const char *dt_state_kind_name(int kind)
{
    switch (kind) {
    case DT_STATE_PARAMS: return "params";
    case DT_STATE_EXP_AVG: return "exp_avg";
    case DT_STATE_EXP_AVG_SQ: return "exp_avg_sq";
    default: return "unknown";
    }
}

/* Unit and kind; DT_ERR_NOT_FOUND (message set) for SGD's missing second
 * moment. */
static int kind_check(const dt_dp_t *b, uint32_t unit, int kind, int has_v, const char *what)
{
    const dt_host_v1_t *host = b->host;
    if (unit >= b->model->n_units)
        return host->set_error(host, DT_ERR_INVALID,
                               "%s: unit %u out of range (model has %u units)", what, unit,
                               b->model->n_units);
    if (kind < 0 || kind >= DT_STATE_COUNT)
        return host->set_error(host, DT_ERR_INVALID, "%s: unit '%s': unknown state kind %d",
                               what, unit_name(b, unit), kind);
    if (kind == DT_STATE_EXP_AVG_SQ && !has_v)
        return host->set_error(host, DT_ERR_NOT_FOUND,
                               "%s: unit '%s': the sgd optimizer keeps no exp_avg_sq (second "
                               "moment); its momentum is state exp_avg",
                               what, unit_name(b, unit));
    return DT_OK;
}

int dt_dp_ranges_check(const dt_dp_t *b, uint32_t unit, int kind, int purpose, int has_v,
                       uint32_t *n)
{
    *n = 0;
    if (purpose != DT_RANGES_HELD && purpose != DT_RANGES_SAVE)
        return b->host->set_error(b->host, DT_ERR_INVALID, "state_ranges: unknown purpose %d",
                                  purpose);
    return kind_check(b, unit, kind, has_v, "state_ranges");
}

int dt_dp_ranges_one(dt_range_t r, dt_range_t *out, uint32_t cap, uint32_t *n)
{
    *n = 0;
    if (r.count == 0)
        return DT_OK;
    if (cap > 0 && out)
        out[0] = r;
    *n = 1;
    return DT_OK;
}

int dt_dp_state_check(const dt_dp_t *b, uint32_t unit, int kind, int has_v, dt_range_t r,
                      const void *buf, const char *what)
{
    const dt_host_v1_t *host = b->host;
    int rc = kind_check(b, unit, kind, has_v, what);
    if (rc != DT_OK)
        return rc;
    const dt_unit_desc_v1_t *u = &b->model->units[unit];
    if (r.count > u->numel || r.offset > u->numel - r.count)
        return host->set_error(host, DT_ERR_INVALID,
                               "%s: unit '%s' state %s: range [%llu, +%llu) outside the unit's "
                               "%llu elements", what, unit_name(b, unit), dt_state_kind_name(kind),
                               (unsigned long long)r.offset, (unsigned long long)r.count,
                               (unsigned long long)u->numel);
    if (r.count > 0 && !buf)
        return host->set_error(host, DT_ERR_INVALID, "%s: unit '%s' state %s: NULL buffer", what,
                               unit_name(b, unit), dt_state_kind_name(kind));
    return DT_OK;
}

int dt_dp_state_copy(const dt_dp_t *b, uint32_t unit, int kind, dt_range_t r, void *dst,
                     const void *src, int dir, const char *what)
{
    const dt_device_ops_v1_t *d = dt_device_ops(b->dev);
    int rc = DT_OK;
    if (r.count > 0) {
        rc = d->memcpy_async(b->dev, dst, src, r.count * sizeof(float), dir, b->cs);
        if (rc == DT_OK)
            rc = d->stream_sync(b->dev, b->cs);
    }
    if (rc != DT_OK)
        b->host->log(b->host, DT_LOG_ERROR, "%s: unit '%s' state %s [%llu, +%llu): copy failed",
                     what, unit_name(b, unit), dt_state_kind_name(kind),
                     (unsigned long long)r.offset, (unsigned long long)r.count);
    return rc;
}

/* ------------------------------------------------------------ estimate */

int dt_dp_estimate_read(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,
                        dt_estimate_args_v1_t *args, dt_model_desc_v1_t *model)
{
    int rc = dt_args_read(host, "estimate args", args, sizeof *args, in,
                          DT_ESTIMATE_ARGS_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!args->model)
        return host->set_error(host, DT_ERR_INVALID, "estimate: NULL model");
    if ((rc = dt_args_read(host, "estimate args: model", model, sizeof *model, args->model,
                           DT_MODEL_DESC_V1_SIZE0)) != DT_OK)
        return rc;
    args->model = model;
    if (args->group_size < 1)
        return host->set_error(host, DT_ERR_INVALID, "estimate: group_size %d",
                               args->group_size);
    if (args->param_bytes != 2 && args->param_bytes != 4)
        return host->set_error(host, DT_ERR_INVALID, "estimate: param_bytes %u (want 2 or 4)",
                               args->param_bytes);
    return DT_OK;
}

void dt_estimate_begin(dt_estimate_v1_t *e)
{
    memset(e, 0, sizeof *e);
    e->struct_size = (uint32_t)sizeof *e;
    e->n_tags = DT_TAG_COUNT;
}

void dt_dp_estimate_state(const dt_estimate_args_v1_t *args, uint64_t compute, uint64_t owned,
                          uint64_t grads, dt_estimate_v1_t *out)
{
    uint64_t pb = args->param_bytes;
    uint64_t master = pb == 2 ? owned * 4 : 0, optim = owned * args->optim_bytes;
    out->bytes[DT_TAG_PARAMS] = compute * pb + master;
    out->bytes[DT_TAG_GRADS] = grads * args->grad_bytes;
    out->bytes[DT_TAG_OPTIMIZER] = optim > master ? optim - master : 0;
    out->bytes[DT_TAG_ACTIVATIONS] = args->act_bytes;
}

/* ---- tensor parallelism: the copies a global norm counts elsewhere ---- */

static int norm_elsewhere(const dt_param_desc_v1_t *p)
{
    const dt_param_split_v1_t *sp = p->ext;
    return sp && sp->struct_size >= DT_FIELD_END(dt_param_split_v1_t, reserved0) &&
           (sp->flags & DT_SPLIT_DUPLICATE);
}

int dt_dp_has_norm_copies(const dt_dp_t *b)
{
    for (uint32_t u = 0; u < b->model->n_units; u++)
        for (uint32_t k = 0; k < b->model->units[u].n_params; k++)
            if (norm_elsewhere(&b->model->units[u].params[k]))
                return 1;
    return 0;
}

/* Call fn(ctx, r) for every run of DT_SPLIT_DUPLICATE tensors within
 * [first, first + n) of the flat space (dt_dp_norm_plan_add), r moved to
 * start at base; stops at fn's first failure.  Allocates nothing: the
 * norm runs it every step. */
typedef int (*copy_fn)(void *ctx, dt_range_t r);

static int each_copy_range(const dt_dp_t *b, uint64_t first, uint64_t n, uint32_t unit_lo,
                           uint32_t unit_hi, const uint64_t *unit_start, uint64_t base,
                           copy_fn fn, void *ctx)
{
    for (uint32_t u = unit_lo; u <= unit_hi && u < b->model->n_units; u++) {
        const dt_unit_desc_v1_t *ud = &b->model->units[u];
        for (uint32_t k = 0; k < ud->n_params;) { /* runs of adjacent copies */
            if (!norm_elsewhere(&ud->params[k])) {
                k++;
                continue;
            }
            uint32_t j = k + 1;
            while (j < ud->n_params && norm_elsewhere(&ud->params[j]))
                j++;
            uint64_t lo = unit_start[u - unit_lo] + ud->params[k].offset;
            uint64_t hi = unit_start[u - unit_lo] + ud->params[j - 1].offset +
                          ud->params[j - 1].numel;
            if (lo < first)
                lo = first;
            if (hi > first + n)
                hi = first + n;
            int rc = lo < hi ? fn(ctx, (dt_range_t){.offset = base + (lo - first),
                                                    .count = hi - lo})
                             : DT_OK;
            if (rc != DT_OK)
                return rc;
            k = j;
        }
    }
    return DT_OK;
}

typedef struct copy_sumsq {
    const dt_dp_t *b;
    double *slot, sum;
    const float *x;
} copy_sumsq_t;

static int sumsq_copy(void *ctx, dt_range_t r)
{
    copy_sumsq_t *c = ctx;
    double s = 0.0;
    int rc = dt_norm_sumsq(c->b->host, c->b->dev, c->b->cs, c->slot,
                           c->x + r.offset, DT_F32, (int64_t)r.count, &s);
    c->sum += s;
    return rc;
}

int dt_dp_norm_copies(const dt_dp_t *b, double *slot, const float *x, uint64_t first,
                      uint64_t n, uint32_t unit_lo, uint32_t unit_hi,
                      const uint64_t *unit_start, double *out)
{
    copy_sumsq_t c = {b, slot, 0.0, x};
    int rc = each_copy_range(b, first, n, unit_lo, unit_hi, unit_start, 0, sumsq_copy, &c);
    *out = c.sum;
    return rc;
}

typedef struct plan_skip {
    const dt_host_v1_t *host;
    dt_norm_plan_t *p;
} plan_skip_t;

static int skip_copy(void *ctx, dt_range_t r)
{
    plan_skip_t *c = ctx;
    return dt_norm_plan_skip(c->host, c->p, r);
}

int dt_dp_norm_plan_add(const dt_dp_t *b, dt_norm_plan_t *p, uint64_t first, uint64_t n,
                        uint32_t unit_lo, uint32_t unit_hi, const uint64_t *unit_start,
                        uint64_t base)
{
    int counted = 0;
    for (uint32_t u = unit_lo; u <= unit_hi && u < b->model->n_units; u++)
        counted |= !(dt_dp_unit_flags(b, u) & DT_UNIT_COPY);
    if (!counted)
        return DT_OK; /* the other stage's */
    int rc = dt_norm_plan_part(b->host, p, (dt_range_t){.offset = base, .count = n});
    plan_skip_t c = {b->host, p};
    if (rc == DT_OK)
        rc = each_copy_range(b, first, n, unit_lo, unit_hi, unit_start, base, skip_copy, &c);
    return rc;
}

/* ---- buffers the group reduces or gathers ---------------------------------- */

static int may_use_symmetric(const dt_dp_t *b, dt_comm_t *comm)
{
    int32_t rank, size;
    if (!comm || !DT_HAS_OP(dt_comm_ops_t, dt_comm_ops(b->comm), sym_alloc) ||
        !DT_HAS_OP(dt_comm_ops_t, dt_comm_ops(b->comm), sym_free) ||
        dt_comm_ops(comm)->rank_size(comm, &rank, &size) != DT_OK || size < 2)
        return 0;
    dt_device_props_t props = {.struct_size = sizeof props};
    return dt_device_ops(b->dev)->props(b->dev, &props) == DT_OK && props.host_visible;
}

int dt_dp_alloc_shared(const dt_dp_t *b, dt_comm_t *comm, uint64_t bytes, int tag,
                       const char *what, void **out, uint8_t *sym)
{
    *sym = 0;
    *out = NULL;
    if (may_use_symmetric(b, comm)) {
        int rc = dt_comm_ops(comm)->sym_alloc(comm, bytes, tag, out);
        if (rc == DT_OK) {
            *sym = 1;
            b->host->log(b->host, DT_LOG_DEBUG, "%s in the communicator's symmetric memory "
                         "(%.1f MiB)", what, (double)bytes / 1048576.0);
            return DT_OK;
        }
        /* a lost or stalled peer is the job's failure, not a refusal (the
         * ranks may not even agree on the outcome) */
        if (rc == DT_ERR_TIMEOUT || rc == DT_ERR_REMOTE) {
            b->host->log(b->host, DT_LOG_ERROR, "allocating %s in symmetric memory failed",
                         what);
            return rc;
        }
        b->host->log(b->host, rc == DT_ERR_UNSUPPORTED ? DT_LOG_DEBUG : DT_LOG_WARN,
                     "%s in device memory: the communicator refused symmetric memory (%s)",
                     what, dt_status_name(rc));
    }
    int rc = dt_device_ops(b->dev)->alloc(b->dev, bytes, tag, out);
    if (rc == DT_OK &&
        (rc = dt_device_ops(b->dev)->memset_async(b->dev, *out, 0, bytes, b->cs)) != DT_OK) {
        dt_device_ops(b->dev)->free(b->dev, *out);
        *out = NULL;
    }
    if (rc != DT_OK)
        b->host->log(b->host, DT_LOG_ERROR, "allocating %s (%llu bytes, tag %s) failed", what,
                     (unsigned long long)bytes, dt_mem_tag_name(tag));
    return rc;
}

void dt_dp_free_shared(const dt_dp_t *b, dt_comm_t *comm, void *p, uint8_t sym)
{
    if (sym)
        (void)dt_comm_ops(comm)->sym_free(comm, p);
    else
        dt_device_ops(b->dev)->free(b->dev, p);
}
