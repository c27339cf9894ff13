/*
 * tests/support/toy_model.c - the toy model's tables, its loss and
 * gradient driven through a strategy's hooks, and the float64 reference
 * (see toy_model.h).
 */
#include "toy_model.h"

#include <math.h>
#include <string.h>

static dt_param_desc_v1_t p_emb[] = {
    {.name = "wte.weight", .offset = 0, .numel = 35, .ndim = 2, .shape = {7, 5}},
    {.name = "wpe.weight", .offset = 35, .numel = 15, .ndim = 2, .shape = {3, 5}},
};
static dt_param_desc_v1_t p_blk[] = {
    {.name = "h.0.ln_1.weight", .offset = 0, .numel = 5, .ndim = 1, .shape = {5},
     .flags = DT_PARAM_NO_DECAY},
    {.name = "h.0.ln_1.bias", .offset = 5, .numel = 5, .ndim = 1, .shape = {5},
     .flags = DT_PARAM_NO_DECAY},
    {.name = "h.0.attn.c_attn.weight", .offset = 10, .numel = 45, .ndim = 2, .shape = {9, 5}},
    {.name = "h.0.attn.c_attn.bias", .offset = 55, .numel = 9, .ndim = 1, .shape = {9},
     .flags = DT_PARAM_NO_DECAY},
    {.name = "h.0.attn.c_proj.weight", .offset = 64, .numel = 15, .ndim = 2, .shape = {5, 3}},
};
static dt_param_desc_v1_t p_head[] = {
    {.name = "ln_f.weight", .offset = 0, .numel = 5, .ndim = 1, .shape = {5},
     .flags = DT_PARAM_NO_DECAY},
    {.name = "ln_f.bias", .offset = 5, .numel = 5, .ndim = 1, .shape = {5},
     .flags = DT_PARAM_NO_DECAY},
};
static dt_unit_desc_v1_t units[DT_TOY_NU] = {
    {.name = "embedding", .index = 0, .n_params = 2, .params = p_emb, .numel = 50,
     .act_bytes = 100},
    {.name = "block.0", .index = 1, .n_params = 5, .params = p_blk, .numel = 79,
     .act_bytes = 300},
    {.name = "head", .index = 2, .n_params = 2, .params = p_head, .numel = 10,
     .act_bytes = 50},
};

dt_optim_desc_v1_t dt_toy_optim(int kind)
{
    return (dt_optim_desc_v1_t){.struct_size = sizeof(dt_optim_desc_v1_t),
                                .kind = kind,
                                .beta1 = 0.9f,
                                .beta2 = 0.95f,
                                .eps = 1e-8f,
                                .weight_decay = 0.1f,
                                .momentum = 0.9f,
                                .nesterov = 0};
}

dt_model_desc_v1_t dt_toy_model(int param_dtype)
{
    return (dt_model_desc_v1_t){.struct_size = sizeof(dt_model_desc_v1_t),
                                .arch = "gpt2",
                                .n_units = DT_TOY_NU,
                                .units = units,
                                .numel = DT_TOY_NUMEL,
                                .param_dtype = param_dtype};
}

const dt_unit_desc_v1_t *dt_toy_unit(uint32_t u)
{
    return &units[u];
}

int dt_toy_no_decay(uint32_t u, uint64_t i)
{
    for (uint32_t k = 0; k < units[u].n_params; k++) {
        const dt_param_desc_v1_t *p = &units[u].params[k];
        if (i >= p->offset && i < p->offset + p->numel)
            return (p->flags & DT_PARAM_NO_DECAY) != 0;
    }
    return 0;
}

float dt_toy_pval(uint32_t u, uint64_t i)
{
    return (float)(0.02 * sin(1.0 + 0.37 * (double)i + 1.7 * u)) + (u == 1 ? 1.0f : 0.0f);
}

double dt_toy_sign(uint32_t u, uint64_t i)
{
    return ((i * 3 + u) % 2) ? 1.0 : -1.0;
}

double dt_toy_a(int rank, uint32_t micro, uint32_t u, uint64_t i)
{
    return dt_toy_sign(u, i) *
           (0.02 + 0.005 * (double)((i * 7 + u * 13 + micro * 5 + (uint64_t)rank * 3) % 17));
}

double dt_toy_t(int rank, uint32_t micro, uint64_t i)
{
    return dt_toy_sign(0, i) * (0.02 + 0.004 * (double)((i + micro + (uint64_t)rank) % 5));
}

/* Element i of a parameter buffer of `dtype` (f32 or bf16). */
static double rd(const void *p, int dtype, uint64_t i)
{
    if (dtype == DT_BF16) {
        uint32_t w = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &w, 4);
        return f;
    }
    return ((const float *)p)[i];
}

static double unit_loss(const void *p, int dtype, int rank, uint32_t micro, uint32_t u)
{
    double l = 0;
    for (uint64_t i = 0; i < units[u].numel; i++) {
        double x = rd(p, dtype, i);
        l += dt_toy_a(rank, micro, u, i) * x + 0.5 * DT_TOY_C * x * x;
    }
    return l;
}

static double tie_loss(const void *p0, int dtype, int rank, uint32_t micro)
{
    double l = 0;
    for (uint64_t i = 0; i < DT_TOY_TIED; i++) {
        double x = rd(p0, dtype, i);
        l += dt_toy_t(rank, micro, i) * x + 0.5 * DT_TOY_C * x * x;
    }
    return l;
}

int dt_toy_read(const dt_toy_dev_t *dd, void *dst, const void *src, uint64_t bytes)
{
    int rc = dd->ops->memcpy_async(dd->dev, dst, src, bytes, DT_COPY_D2H, dd->stream);
    return rc == DT_OK ? dd->ops->stream_sync(dd->dev, dd->stream) : rc;
}

int dt_toy_write(const dt_toy_dev_t *dd, void *dst, const void *src, uint64_t bytes)
{
    int rc = dd->ops->memcpy_async(dd->dev, dst, src, bytes, DT_COPY_H2D, dd->stream);
    return rc == DT_OK ? dd->ops->stream_sync(dd->dev, dd->stream) : rc;
}

/* Bytes of the first n elements of a parameter buffer of `dtype`. */
static uint64_t pbytes(int dtype, uint64_t n)
{
    return n * (dtype == DT_BF16 ? 2u : 4u);
}

int dt_toy_forward(dt_strategy_t *s, const dt_toy_dev_t *dd,
                   int param_dtype, int rank, uint32_t micro, uint32_t n_micro, uint32_t flags,
                   double *loss)
{
    dt_unit_buffers_v1_t b = {.struct_size = sizeof b}, b0 = {.struct_size = sizeof b0};
    float p[DT_TOY_MAXN]; /* a unit's parameters on the host (bf16 fits too) */
    double l = 0;
    int rc = DT_OK;
    for (uint32_t u = 0; rc == DT_OK && u < DT_TOY_NU; u++) {
        dt_hook_v1_t h = {.struct_size = sizeof(dt_hook_v1_t),
                          .unit = u,
                          .micro = micro,
                          .n_micro = n_micro,
                          .flags = flags};
        if ((rc = dt_strategy_ops(s)->pre_forward(s, &h, &b)) != DT_OK ||
            (rc = dt_toy_read(dd, p, b.params, pbytes(param_dtype, units[u].numel))) != DT_OK)
            break;
        l += unit_loss(p, param_dtype, rank, micro, u);
        if (u == DT_TOY_NU - 1) {
            dt_hook_v1_t h0 = {.struct_size = sizeof(dt_hook_v1_t),
                               .unit = 0,
                               .micro = micro,
                               .n_micro = n_micro,
                               .flags = flags};
            if ((rc = dt_strategy_ops(s)->pre_forward(s, &h0, &b0)) != DT_OK ||
                (rc = dt_toy_read(dd, p, b0.params, pbytes(param_dtype, DT_TOY_TIED))) != DT_OK)
                break;
            l += tie_loss(p, param_dtype, rank, micro);
            rc = dt_strategy_ops(s)->post_forward(s, &h0);
        }
        if (rc == DT_OK)
            rc = dt_strategy_ops(s)->post_forward(s, &h);
    }
    *loss = l;
    return rc;
}

/* grads[i] += a + C p over a unit (or its tied part with t), both read
 * from and the gradients written back to the device through `dd`. */
static int add_grad(const dt_toy_dev_t *dd, const dt_unit_buffers_v1_t *b, int dtype, int rank,
                    uint32_t micro, uint32_t u, int tie)
{
    uint64_t n = tie ? DT_TOY_TIED : units[u].numel;
    float p[DT_TOY_MAXN], g[DT_TOY_MAXN];
    int rc;
    if ((rc = dt_toy_read(dd, p, b->params, pbytes(dtype, n))) != DT_OK ||
        (rc = dt_toy_read(dd, g, b->grads, n * sizeof(float))) != DT_OK)
        return rc;
    for (uint64_t i = 0; i < n; i++) {
        double c = tie ? dt_toy_t(rank, micro, i) : dt_toy_a(rank, micro, u, i);
        g[i] += (float)(c + DT_TOY_C * rd(p, dtype, i));
    }
    return dt_toy_write(dd, b->grads, g, n * sizeof(float));
}

int dt_toy_backward(dt_strategy_t *s, const dt_toy_dev_t *dd,
                    int param_dtype, int rank, uint32_t micro, uint32_t n_micro)
{
    dt_unit_buffers_v1_t b = {.struct_size = sizeof b}, b0 = {.struct_size = sizeof b0};
    const uint32_t head = DT_TOY_NU - 1;
    dt_hook_v1_t h = {
        .struct_size = sizeof(dt_hook_v1_t), .unit = head, .micro = micro, .n_micro = n_micro};
    dt_hook_v1_t h0 = {
        .struct_size = sizeof(dt_hook_v1_t), .unit = 0, .micro = micro, .n_micro = n_micro};
    int rc;
    if ((rc = dt_strategy_ops(s)->pre_backward(s, &h, &b)) != DT_OK ||
        (rc = dt_strategy_ops(s)->pre_backward(s, &h0, &b0)) != DT_OK ||
        (rc = add_grad(dd, &b0, param_dtype, rank, micro, 0, 1)) != DT_OK ||
        (rc = dt_strategy_ops(s)->post_backward(s, &h0)) != DT_OK ||
        (rc = add_grad(dd, &b, param_dtype, rank, micro, head, 0)) != DT_OK)
        return rc;
    h.last_use = 1;
    if ((rc = dt_strategy_ops(s)->post_backward(s, &h)) != DT_OK)
        return rc;
    for (uint32_t u = head; u-- > 0;) {
        dt_hook_v1_t hu = {
            .struct_size = sizeof(dt_hook_v1_t), .unit = u, .micro = micro, .n_micro = n_micro};
        if ((rc = dt_strategy_ops(s)->pre_backward(s, &hu, &b)) != DT_OK ||
            (rc = add_grad(dd, &b, param_dtype, rank, micro, u, 0)) != DT_OK)
            return rc;
        hu.last_use = 1;
        if ((rc = dt_strategy_ops(s)->post_backward(s, &hu)) != DT_OK)
            return rc;
    }
    return DT_OK;
}

void dt_toy_ref_init(dt_toy_ref_t *r)
{
    memset(r, 0, sizeof *r);
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        for (uint64_t i = 0; i < units[u].numel; i++)
            r->p[u][i] = dt_toy_pval(u, i);
}

double dt_toy_ref_step(dt_toy_ref_t *r, int optim_kind, int size, uint32_t n_micro, int t,
                       double lr, double clip, double (*loss)[DT_TOY_MAX_MICRO])
{
    static double g[DT_TOY_NU][DT_TOY_MAXN];
    memset(g, 0, sizeof g);
    for (int k = 0; k < size; k++)
        for (uint32_t mi = 0; mi < n_micro; mi++) {
            double l = 0;
            for (uint32_t u = 0; u < DT_TOY_NU; u++)
                for (uint64_t i = 0; i < units[u].numel; i++) {
                    double x = r->p[u][i], a = dt_toy_a(k, mi, u, i);
                    l += a * x + 0.5 * DT_TOY_C * x * x;
                    g[u][i] += (a + DT_TOY_C * x) / size;
                }
            for (uint64_t i = 0; i < DT_TOY_TIED; i++) {
                double x = r->p[0][i], tc = dt_toy_t(k, mi, i);
                l += tc * x + 0.5 * DT_TOY_C * x * x;
                g[0][i] += (tc + DT_TOY_C * x) / size;
            }
            if (loss)
                loss[k][mi] = l;
        }
    return dt_toy_ref_update(r, optim_kind, g, t, lr, clip);
}

double dt_toy_ref_update(dt_toy_ref_t *r, int optim_kind, double g[DT_TOY_NU][DT_TOY_MAXN],
                         int t, double lr, double clip)
{
    double ss = 0;
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        for (uint64_t i = 0; i < units[u].numel; i++)
            ss += g[u][i] * g[u][i];
    double norm = sqrt(ss);
    double scale = clip > 0 ? clip / (norm + 1e-6) : 1.0;
    if (scale > 1)
        scale = 1;
    const dt_optim_desc_v1_t o = dt_toy_optim(optim_kind);
    const double b1 = o.beta1, b2 = o.beta2, eps = o.eps, mu = o.momentum;
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        for (uint64_t i = 0; i < units[u].numel; i++) {
            double wd = dt_toy_no_decay(u, i) ? 0.0 : o.weight_decay;
            double gi = g[u][i] * scale;
            if (optim_kind == DT_OPTIM_ADAMW) {
                r->m[u][i] = b1 * r->m[u][i] + (1 - b1) * gi;
                r->v[u][i] = b2 * r->v[u][i] + (1 - b2) * gi * gi;
                double mh = r->m[u][i] / (1 - pow(b1, t)), vh = r->v[u][i] / (1 - pow(b2, t));
                r->p[u][i] -= lr * (mh / (sqrt(vh) + eps) + wd * r->p[u][i]);
            } else {
                gi += wd * r->p[u][i];
                r->m[u][i] = mu * r->m[u][i] + gi;
                r->p[u][i] -= lr * r->m[u][i];
            }
        }
    return norm;
}

static dt_param_desc_v1_t paper_params[32];
static dt_unit_desc_v1_t paper_units[32];

dt_model_desc_v1_t dt_toy_paper_model(int param_dtype)
{
    for (uint32_t u = 0; u < 32; u++) {
        paper_params[u] = (dt_param_desc_v1_t){.name = "w", .numel = 234375000, .ndim = 1,
                                               .shape = {234375000}};
        paper_units[u] = (dt_unit_desc_v1_t){.name = "layer", .index = u, .n_params = 1,
                                             .params = &paper_params[u], .numel = 234375000};
    }
    return (dt_model_desc_v1_t){.struct_size = sizeof(dt_model_desc_v1_t),
                                .arch = "paper",
                                .n_units = 32,
                                .units = paper_units,
                                .numel = 7500000000ull,
                                .param_dtype = param_dtype};
}

dt_estimate_args_v1_t dt_toy_paper_args(const dt_model_desc_v1_t *m)
{
    return (dt_estimate_args_v1_t){.struct_size = sizeof(dt_estimate_args_v1_t),
                                   .group_size = 64, .model = m, .param_bytes = 2,
                                   .grad_bytes = 2, .optim_bytes = 12, .n_micro = 1};
}

double dt_toy_model_state(const dt_estimate_v1_t *e)
{
    return (double)(e->bytes[DT_TAG_PARAMS] + e->bytes[DT_TAG_GRADS] +
                    e->bytes[DT_TAG_OPTIMIZER]);
}
