/*
 * tests/support/model_harness.c - a model on the cpu device with an
 * in-test strategy, and comparison with a float64 reference (see
 * model_harness.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/config.h"
#include "ckpt/safetensors.h"
#include "safetensors_read.h"
#include "model_harness.h"
#include "ref_kernels.h"
#include "test_host.h"
#include "test_plugin.h"
#include "util/error.h"

/* ------------------------------------------------------------ strategy */

struct dt_mh_strategy {
    const dt_strategy_ops_v1_t *ops; /* first: &mh_ops (dtrain/strategy.h) */
    dt_mh_t *h;
    uint32_t n_units, n_micro;
    float **master;  /* host, f32 */
    void **compute;  /* device, desc->param_dtype */
    float **grads;   /* device, f32 */
    float **grads_host; /* host copies dt_mh_grads hands out */
    int *fdepth, *bdepth;
    uint8_t *done;   /* [micro * n_units + unit]: last_use seen */
    uint8_t *bwd;    /* [micro]: any backward hook seen */
    uint64_t n_fwd[2]; /* pre_forward calls without / with DT_HOOK_NO_GRAD */
};

static dt_mh_strategy_t *S_(dt_strategy_t *s) { return (dt_mh_strategy_t *)s; }

static int violation(const char *fmt, ...) DT_PRINTF(1, 2);
static int violation(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return dt_err_set(DT_ERR_INVALID, "oracle strategy: hook contract: %s", buf);
}

static int check_hook(dt_mh_strategy_t *s, const dt_hook_v1_t *h, const char *what)
{
    if (h->unit >= s->n_units)
        return violation("%s of unit %u; the model has %u", what, h->unit, s->n_units);
    if (h->micro >= s->n_micro || h->n_micro != s->n_micro)
        return violation("%s of unit %u: micro %u of %u, the step has %u", what, h->unit,
                         h->micro, h->n_micro, s->n_micro);
    return DT_OK;
}

static int mh_pre_forward(dt_strategy_t *st, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    dt_mh_strategy_t *s = S_(st);
    int rc = check_hook(s, h, "pre_forward");
    if (rc)
        return rc;
    s->fdepth[h->unit]++;
    s->n_fwd[(h->flags & DT_HOOK_NO_GRAD) ? 1 : 0]++;
    out->params = s->compute[h->unit];
    out->grads = NULL;
    return DT_OK;
}

static int mh_post_forward(dt_strategy_t *st, const dt_hook_v1_t *h)
{
    dt_mh_strategy_t *s = S_(st);
    int rc = check_hook(s, h, "post_forward");
    if (rc)
        return rc;
    if (s->fdepth[h->unit] <= 0)
        return violation("post_forward of unit %u without its pre_forward", h->unit);
    s->fdepth[h->unit]--;
    return DT_OK;
}

static int mh_pre_backward(dt_strategy_t *st, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *out)
{
    dt_mh_strategy_t *s = S_(st);
    int rc = check_hook(s, h, "pre_backward");
    if (rc)
        return rc;
    if (h->flags & DT_HOOK_NO_GRAD)
        return violation("pre_backward of unit %u flagged NO_GRAD", h->unit);
    for (uint32_t u = 0; u < s->n_units; u++)
        if (s->fdepth[u])
            return violation("pre_backward of unit %u while unit %u is held for forward",
                             h->unit, u);
    if (s->done[h->micro * s->n_units + h->unit])
        return violation("pre_backward of unit %u in micro-batch %u after its last_use",
                         h->unit, h->micro);
    s->bwd[h->micro] = 1;
    s->bdepth[h->unit]++;
    out->params = s->compute[h->unit];
    out->grads = s->grads[h->unit];
    return DT_OK;
}

static int mh_post_backward(dt_strategy_t *st, const dt_hook_v1_t *h)
{
    dt_mh_strategy_t *s = S_(st);
    int rc = check_hook(s, h, "post_backward");
    if (rc)
        return rc;
    if (s->bdepth[h->unit] <= 0)
        return violation("post_backward of unit %u without its pre_backward", h->unit);
    s->bdepth[h->unit]--;
    if (h->last_use) {
        if (s->bdepth[h->unit])
            return violation("last_use of unit %u while an outer pre_backward holds it",
                             h->unit);
        s->done[h->micro * s->n_units + h->unit] = 1;
    }
    return DT_OK;
}

/* Only the unit hooks: the model calls nothing else. */
static const dt_strategy_ops_v1_t mh_ops = {
    .info = {.abi_major = DT_STRATEGY_ABI_MAJOR, .abi_minor = DT_STRATEGY_ABI_MINOR,
             .struct_size = sizeof(dt_strategy_ops_v1_t), .kind = DT_KIND_STRATEGY,
             .name = "oracle", .version = "0", .summary = "test strategy"},
    .pre_forward = mh_pre_forward,
    .post_forward = mh_post_forward,
    .pre_backward = mh_pre_backward,
    .post_backward = mh_post_backward,
};

/* ------------------------------------------------------------- harness */

const char *dt_mh_device = "cpu";
uint32_t dt_mh_stage_first, dt_mh_stage_end, dt_mh_slots;
int32_t dt_mh_tp_rank;
uint32_t dt_mh_n_chunks, dt_mh_chunk_first[4], dt_mh_chunk_end[4];
static const dt_test_kv_t cpu_kv[] = {{"threads", "2"}, {NULL, NULL}};
/* cuda: no atomics, so a rerun repeats the bits */
static const dt_test_kv_t cuda_kv[] = {{"deterministic", "true"}, {NULL, NULL}};
static dt_test_host_t dev_host;
static char dev_prefix[40];

float *dt_mh_master(dt_mh_t *h, uint32_t u) { return h->strat->master[u]; }

/* Copied to the host, so the host reads them on any device. */
const float *dt_mh_grads(dt_mh_t *h, uint32_t u)
{
    dt_mh_strategy_t *s = h->strat;
    const uint64_t n = h->desc->units[u].numel;
    if (!s->grads_host[u] && !(s->grads_host[u] = malloc(n * 4)))
        fail_msg("dt_mh_grads: out of host memory");
    int rc = h->D->memcpy_async(h->dev, s->grads_host[u], s->grads[u], n * 4, DT_COPY_D2H,
                                h->stream);
    if (rc == DT_OK)
        rc = h->D->stream_sync(h->dev, h->stream);
    if (rc != DT_OK)
        fail_msg("dt_mh_grads: copying unit %u's gradients: %s", u, dt_last_error());
    return s->grads_host[u];
}

void dt_mh_forward_hooks(const dt_mh_t *h, uint64_t *plain, uint64_t *no_grad)
{
    *plain = h->strat->n_fwd[0];
    *no_grad = h->strat->n_fwd[1];
}

/* f32 masters are copied; others go up as f32 and are cast on the device
 * (the host masters are not device memory on every device). */
int dt_mh_sync_params(dt_mh_t *h)
{
    dt_mh_strategy_t *s = h->strat;
    for (uint32_t u = 0; u < s->n_units; u++) {
        const uint64_t n = h->desc->units[u].numel;
        if (h->desc->param_dtype == DT_F32) {
            int rc = h->D->memcpy_async(h->dev, s->compute[u], s->master[u], n * 4,
                                        DT_COPY_H2D, h->stream);
            if (rc)
                return rc;
            continue;
        }
        void *up = NULL;
        int rc = h->D->alloc(h->dev, n * 4, DT_TAG_STAGING, &up);
        if (!rc)
            rc = h->D->memcpy_async(h->dev, up, s->master[u], n * 4, DT_COPY_H2D, h->stream);
        if (!rc)
            rc = h->D->kernels()->cast(h->dev, h->stream, s->compute[u], h->desc->param_dtype,
                                       up, DT_F32, (int64_t)n);
        if (!rc)
            rc = h->D->stream_sync(h->dev, h->stream);
        if (up)
            h->D->free(h->dev, up);
        if (rc)
            return rc;
    }
    return h->D->stream_sync(h->dev, h->stream);
}

/* A uniform double in [0, 1) from a 64-bit LCG state (test data only). */
static double urand(uint64_t *st)
{
    *st = *st * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*st >> 11) * 0x1.0p-53;
}

void dt_mh_perturb(float *w, const dt_unit_desc_v1_t *u, uint64_t seed)
{
    uint64_t st = seed * 0x9E3779B97F4A7C15ull + u->index + 1;
    for (uint32_t k = 0; k < u->n_params; k++) {
        const dt_param_desc_v1_t *p = &u->params[k];
        float *x = w + p->offset;
        if (p->ndim == 2) {
            double ss = 0;
            for (uint64_t i = 0; i < p->numel; i++)
                ss += (double)x[i] * x[i];
            double sd = sqrt(ss / (double)p->numel);
            double f = (1.0 / sqrt((double)p->shape[1])) / (sd > 0 ? sd : 1.0);
            for (uint64_t i = 0; i < p->numel; i++)
                x[i] = (float)(x[i] * f);
            continue;
        }
        size_t n = strlen(p->name);
        int is_weight = n > 7 && strcmp(p->name + n - 7, ".weight") == 0;
        for (uint64_t i = 0; i < p->numel; i++)
            x[i] = is_weight ? (float)(1.0 + (urand(&st) - 0.5))
                             : (float)(0.6 * (urand(&st) - 0.5));
    }
}

const dt_model_ops_t *dt_mh_model_ops(const char *plugin_dir, const dt_config_t *cfg)
{
    const char *arch = NULL;
    if (dt_config_get_string(cfg, "model.arch", &arch))
        return NULL;
    char path[1024];
    snprintf(path, sizeof path, "%s/dtrain_%s.so", plugin_dir, arch);
    return dt_test_plugin_entry(path, DT_ENTRY_STRING(model, 1), NULL);
}

const char *dt_mh_model_dir;

int dt_mh_open_at(dt_mh_t *h, const char *plugin_dir, const char *source_dir,
                  const char *model_toml, int64_t B, int64_t T, uint64_t seed)
{
    memset(h, 0, sizeof *h);
    h->source_dir = source_dir;
    h->B = B;
    h->T = T;
    int rc;
    char path[1024];
    snprintf(path, sizeof path, "%s/dtrain_%s.so", plugin_dir, dt_mh_device);
    /* never dlclosed: OpenBLAS threads live as long as the process */
    h->D = dt_test_plugin_entry(path, DT_ENTRY_STRING(device, 1), NULL);
    if (!h->D)
        return DT_ERR_NOT_FOUND;
    snprintf(dev_prefix, sizeof dev_prefix, "device/%s", dt_mh_device);
    dt_test_host_init(&dev_host, dev_prefix,
                      strcmp(dt_mh_device, "cuda") == 0 ? cuda_kv : cpu_kv);
    const dt_device_init_v1_t da = {.struct_size = sizeof da, .local_size = 1,
                                    .device_index = -1};
    if ((rc = h->D->init(&dev_host.host, &da, &h->dev)) ||
        (rc = h->D->stream_create(h->dev, &h->stream)))
        return rc;
    if ((rc = dt_config_load_string("model.toml", model_toml, &h->cfg)))
        return rc;
    for (uint32_t i = 0; i < dt_core_n_sections; i++)
        if ((strcmp(dt_core_sections[i].table, "model") == 0 ||
             strcmp(dt_core_sections[i].table, "parallel") == 0) &&
            (rc = dt_config_apply_schema(h->cfg, dt_core_sections[i].table,
                                         dt_core_sections[i].keys,
                                         dt_core_sections[i].n_keys)))
            return rc;
    int64_t tp = 1;
    const dt_model_ops_t *ops = NULL;
    if ((rc = dt_config_get_int(h->cfg, "parallel.tensor", &tp)) ||
        !(ops = dt_mh_model_ops(dt_mh_model_dir ? dt_mh_model_dir : plugin_dir, h->cfg)))
        return rc ? rc : DT_ERR_NOT_FOUND;
    /* the plugin's own table, as the core resolves it */
    if ((rc = dt_config_apply_schema(h->cfg, ops->info.name, ops->info.config_keys,
                                     ops->info.n_config_keys)) ||
        (rc = dt_model_create_part(h->cfg, h->D, ops, (int32_t)tp, dt_mh_tp_rank, &h->model)))
        return rc;
    h->desc = dt_model_desc(h->model);
    dt_mh_strategy_t *s = calloc(1, sizeof *s);
    if (!s)
        return DT_ERR_NOMEM;
    h->strat = s;
    s->h = h;
    s->n_units = h->desc->n_units;
    s->master = calloc(s->n_units, sizeof *s->master);
    s->compute = calloc(s->n_units, sizeof *s->compute);
    s->grads = calloc(s->n_units, sizeof *s->grads);
    s->grads_host = calloc(s->n_units, sizeof *s->grads_host);
    s->fdepth = calloc(s->n_units, sizeof *s->fdepth);
    s->bdepth = calloc(s->n_units, sizeof *s->bdepth);
    if (!s->master || !s->compute || !s->grads || !s->grads_host || !s->fdepth ||
        !s->bdepth)
        return DT_ERR_NOMEM;
    const size_t es = dt_dtype_size(h->desc->param_dtype);
    for (uint32_t u = 0; u < s->n_units; u++) {
        const dt_unit_desc_v1_t *ud = &h->desc->units[u];
        if (!(s->master[u] = malloc(ud->numel * 4)))
            return DT_ERR_NOMEM;
        if ((rc = h->D->alloc(h->dev, ud->numel * es, DT_TAG_PARAMS, &s->compute[u])) ||
            (rc = h->D->alloc(h->dev, ud->numel * 4, DT_TAG_GRADS, (void **)&s->grads[u])) ||
            (rc = dt_model_init_unit(h->model, u, seed, s->master[u])))
            return rc;
        dt_mh_perturb(s->master[u], ud, seed);
    }
    s->ops = &mh_ops;
    h->ctx = (dt_model_ctx_t){h->dev, h->stream, (dt_strategy_t *)s, "oracle"};
    if (dt_mh_slots > 1 && (rc = dt_model_set_slots(h->model, dt_mh_slots)))
        return rc;
    if (dt_mh_n_chunks &&
        (rc = dt_model_set_stages(h->model, dt_mh_n_chunks, dt_mh_chunk_first, dt_mh_chunk_end)))
        return rc;
    if (dt_mh_stage_end && (rc = dt_model_set_stage(h->model, dt_mh_stage_first, dt_mh_stage_end)))
        return rc;
    if ((rc = dt_model_alloc_acts(h->model, &h->ctx, B, T)) || (rc = dt_mh_sync_params(h)))
        return rc;
    return DT_OK;
}

void dt_mh_close(dt_mh_t *h)
{
    dt_mh_strategy_t *s = h->strat;
    if (h->model)
        dt_model_free(h->model, h->dev ? &h->ctx : NULL);
    if (s) {
        for (uint32_t u = 0; u < s->n_units; u++) {
            free(s->master ? s->master[u] : NULL);
            free(s->grads_host ? s->grads_host[u] : NULL);
            if (s->compute)
                h->D->free(h->dev, s->compute[u]);
            if (s->grads)
                h->D->free(h->dev, s->grads[u]);
        }
        free(s->master), free(s->compute), free(s->grads), free(s->grads_host);
        free(s->fdepth), free(s->bdepth), free(s->done), free(s->bwd);
        free(s);
    }
    if (h->dev) {
        if (h->stream)
            h->D->stream_destroy(h->dev, h->stream);
        h->D->finalize(h->dev);
    }
    dt_config_free(h->cfg);
    memset(h, 0, sizeof *h);
}

int dt_mh_begin_step(dt_mh_t *h, uint32_t n_micro)
{
    dt_mh_strategy_t *s = h->strat;
    free(s->done);
    free(s->bwd);
    s->n_micro = n_micro;
    s->done = calloc((size_t)n_micro * s->n_units, 1);
    s->bwd = calloc(n_micro, 1);
    if (!s->done || !s->bwd)
        return DT_ERR_NOMEM;
    for (uint32_t u = 0; u < s->n_units; u++) {
        int rc = h->D->memset_async(h->dev, s->grads[u], 0, h->desc->units[u].numel * 4,
                                    h->stream);
        if (rc)
            return rc;
    }
    return h->D->stream_sync(h->dev, h->stream);
}

int dt_mh_end_step(dt_mh_t *h)
{
    dt_mh_strategy_t *s = h->strat;
    for (uint32_t u = 0; u < s->n_units; u++)
        if (s->fdepth[u] || s->bdepth[u])
            return violation("step ended with unit %u held (forward %d, backward %d)", u,
                             s->fdepth[u], s->bdepth[u]);
    for (uint32_t mi = 0; mi < s->n_micro; mi++)
        for (uint32_t u = 0; s->bwd[mi] && u < s->n_units; u++)
            if (!s->done[mi * s->n_units + u])
                return violation("unit %u never got last_use in micro-batch %u", u, mi);
    return DT_OK;
}

/* ------------------------------------------------------------- files */

/* f32 -> `dtype` -> f32, round to nearest even (the reference
 * conversions of ref_kernels.h); DT_F32: x. */
static float round_to(float x, int dtype)
{
    return dtype == DT_BF16  ? (float)dt_ref_bf16_to_double(dt_ref_f32_to_bf16(x))
           : dtype == DT_F16 ? (float)dt_ref_f16_to_double(dt_ref_f32_to_f16(x))
                             : x;
}

int dt_mh_write_params(dt_mh_t *h, const char *path, int as_dtype)
{
    dt_safetensors_writer_t *w;
    int rc = dt_safetensors_writer_open(path, &w);
    if (rc)
        return rc;
    for (uint32_t u = 0; u < h->desc->n_units; u++)
        for (uint32_t k = 0; k < h->desc->units[u].n_params; k++) {
            const dt_param_desc_v1_t *p = &h->desc->units[u].params[k];
            if ((rc = dt_safetensors_declare(w, p->name, DT_F32, p->ndim, p->shape))) {
                dt_safetensors_abort(w);
                return rc;
            }
        }
    for (uint32_t u = 0; u < h->desc->n_units; u++) {
        const dt_unit_desc_v1_t *ud = &h->desc->units[u];
        float *v = malloc(ud->numel * 4);
        if (!v) {
            dt_safetensors_abort(w);
            return DT_ERR_NOMEM;
        }
        for (uint64_t i = 0; i < ud->numel; i++)
            v[i] = round_to(h->strat->master[u][i], as_dtype);
        rc = dt_safetensors_write(w, v, ud->numel * 4);
        free(v);
        if (rc) {
            dt_safetensors_abort(w);
            return rc;
        }
    }
    return dt_safetensors_commit(w);
}

int dt_mh_write_tokens(const char *path, int64_t B, int64_t T, const int32_t *inputs,
                       const int32_t *targets)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return dt_err_set(DT_ERR_IO, "cannot write %s", path);
    int32_t hdr[2] = {(int32_t)B, (int32_t)T};
    size_t n = (size_t)(B * T);
    int ok = fwrite(hdr, 4, 2, f) == 2 && fwrite(inputs, 4, n, f) == n &&
             fwrite(targets, 4, n, f) == n;
    if (fclose(f) != 0 || !ok)
        return dt_err_set(DT_ERR_IO, "writing %s failed", path);
    return DT_OK;
}

int dt_mh_python_ok(const char **why)
{
    if (access("/usr/bin/python3", X_OK) != 0) {
        *why = "/usr/bin/python3 is missing (install python3-numpy)";
        return 0;
    }
    if (system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        *why = "/usr/bin/python3 cannot import numpy (install python3-numpy)";
        return 0;
    }
    return 1;
}

int dt_mh_run_ref(const dt_mh_t *h, const char *script, const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tests/reference/%s %s", h->source_dir,
             script, args);
    int st = system(cmd);
    if (st == -1 || !WIFEXITED(st)) {
        fprintf(stderr, "could not run: %s\n", cmd);
        return -1;
    }
    if (WEXITSTATUS(st) != 0)
        fprintf(stderr, "exit %d: %s\n", WEXITSTATUS(st), cmd);
    return WEXITSTATUS(st);
}

float *dt_mh_logits(dt_mh_t *h)
{
    const int64_t n = h->B * h->T * dt_model_info(h->model)->vocab_size;
    if (dt_model_act_dtype(h->model) != DT_F32)
        return NULL; /* the references compare f32 logits */
    float *out = malloc((size_t)n * 4);
    if (!out)
        return NULL;
    if (h->D->memcpy_async(h->dev, out, dt_model_logits(h->model), (uint64_t)n * 4, DT_COPY_D2H,
                           h->stream) ||
        h->D->stream_sync(h->dev, h->stream)) {
        free(out);
        return NULL;
    }
    return out;
}

/* ---------------------------------------------------------- comparing */

/* "h.12.attn.c_attn.weight" -> "h.attn.c_attn.weight": numeric parts go. */
static void type_of(const char *name, char *out, size_t cap)
{
    size_t o = 0;
    const char *p = name;
    while (*p) {
        const char *e = strchr(p, '.');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int digits = n > 0;
        for (size_t i = 0; i < n; i++)
            digits &= p[i] >= '0' && p[i] <= '9';
        if (!digits) {
            if (o && o + 1 < cap)
                out[o++] = '.';
            for (size_t i = 0; i < n && o + 1 < cap; i++)
                out[o++] = p[i];
        }
        p += n;
        if (*p == '.')
            p++;
    }
    out[o] = 0;
}

static void merge(dt_mh_stats_t *st, const char *name, double rel)
{
    if (!st)
        return;
    char t[48];
    type_of(name, t, sizeof t);
    for (uint32_t i = 0; i < st->n_types; i++)
        if (strcmp(st->type[i], t) == 0) {
            if (rel > st->rel[i])
                st->rel[i] = rel;
            return;
        }
    if (st->n_types < DT_MH_MAX_TYPES) {
        snprintf(st->type[st->n_types], sizeof st->type[0], "%s", t);
        st->rel[st->n_types++] = rel;
    }
}

static const dt_test_st_tensor_t *ref_tensor(const dt_test_st_t *f, const char *name,
                                                 uint64_t numel)
{
    const dt_test_st_tensor_t *t = dt_test_st_find(f, name);
    if (!t)
        fail_msg("reference output lacks '%s'", name);
    if (t->dtype != DT_F64 || t->numel != numel)
        fail_msg("reference '%s': %s with %llu elements, expected F64 with %llu", name,
                 dt_dtype_name(t->dtype), (unsigned long long)t->numel,
                 (unsigned long long)numel);
    return t;
}

/* max|got - ref| / max|ref| over n elements; fails above tol. */
static double compare_one(const char *name, const float *got, const dt_test_st_tensor_t *t,
                          double tol)
{
    double *ref = malloc(t->numel * 8);
    assert_non_null(ref);
    memcpy(ref, t->data, t->numel * 8);
    double rmax = 0, emax = 0;
    uint64_t worst = 0;
    for (uint64_t i = 0; i < t->numel; i++) {
        if (fabs(ref[i]) > rmax)
            rmax = fabs(ref[i]);
        double e = fabs((double)got[i] - ref[i]);
        if (!(e <= emax)) { /* NaN counts as the worst */
            emax = e;
            worst = i;
        }
    }
    double rel = rmax > 0 ? emax / rmax : emax;
    if (!(rel <= tol)) {
        double r = ref[worst];
        free(ref);
        fail_msg("%s: max|got - ref| / max|ref| = %.3g > %.3g; worst [%llu] got %.9g, ref "
                 "%.9g, max|ref| %.3g",
                 name, rel, tol, (unsigned long long)worst, (double)got[worst], r, rmax);
    }
    free(ref);
    return rel;
}

void dt_mh_compare(dt_mh_t *h, const char *ref_path, double loss, const float *logits,
                   double loss_atol, double tol, dt_mh_stats_t *st)
{
    dt_test_st_t *f = NULL;
    if (dt_test_st_open(ref_path, &f) != DT_OK)
        fail_msg("%s", dt_last_error());
    const dt_test_st_tensor_t *t = ref_tensor(f, "loss", 1);
    double rl;
    memcpy(&rl, t->data, 8);
    double le = fabs(loss - rl);
    if (!(le <= loss_atol)) {
        dt_test_st_close(f);
        fail_msg("loss %.9g, reference %.9g: |diff| %.3g > %.3g", loss, rl, le, loss_atol);
    }
    if (st && le > st->loss_err)
        st->loss_err = le;
    if (logits) {
        uint64_t n = (uint64_t)(h->B * h->T * dt_model_info(h->model)->vocab_size);
        double r = compare_one("logits", logits, ref_tensor(f, "logits", n), tol);
        if (st && r > st->logits_rel)
            st->logits_rel = r;
        if (st)
            st->logits_seen = 1;
    }
    for (uint32_t u = 0; u < h->desc->n_units; u++)
        for (uint32_t k = 0; k < h->desc->units[u].n_params; k++) {
            const dt_param_desc_v1_t *p = &h->desc->units[u].params[k];
            char nm[160];
            snprintf(nm, sizeof nm, "grad.%s", p->name);
            double r = compare_one(nm, dt_mh_grads(h, u) + p->offset,
                                   ref_tensor(f, nm, p->numel), tol);
            merge(st, p->name, r);
        }
    dt_test_st_close(f);
}

void dt_mh_print_stats(const char *what, const dt_mh_stats_t *st)
{
    if (st->logits_seen)
        printf("%s: |loss - ref| %.3g, logits %.3g\n", what, st->loss_err, st->logits_rel);
    else
        printf("%s: |loss - ref| %.3g (logits not compared)\n", what, st->loss_err);
    for (uint32_t i = 0; i < st->n_types; i++)
        printf("%s:   grad %-22s %.3g\n", what, st->type[i], st->rel[i]);
}

/* ------------------------------------------------------------- folders */

void dt_mh_tmpdir(char *out, size_t cap)
{
    const char *base = getenv("TMPDIR");
    snprintf(out, cap, "%s/dt_model_XXXXXX", base && base[0] ? base : "/tmp");
    if (!mkdtemp(out))
        fail_msg("mkdtemp %s failed", out);
}

void dt_mh_rmdir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

/* ------------------------------------------------------------ oracle tests */

int dt_mh_oracle_setup(dt_mh_oracle_t *o)
{
    o->have_python = dt_mh_python_ok(&o->no_python_why);
    if (!o->have_python)
        return 0;
    dt_mh_tmpdir(o->dir, sizeof o->dir);
    snprintf(o->params, sizeof o->params, "%s/params.safetensors", o->dir);
    snprintf(o->params_bf16, sizeof o->params_bf16, "%s/params_bf16.safetensors", o->dir);
    snprintf(o->params_f16, sizeof o->params_f16, "%s/params_f16.safetensors", o->dir);
    snprintf(o->tok, sizeof o->tok, "%s/tokens.bin", o->dir);
    snprintf(o->tok2, sizeof o->tok2, "%s/tokens2.bin", o->dir);
    snprintf(o->ref, sizeof o->ref, "%s/ref.safetensors", o->dir);
    snprintf(o->ref_bf16, sizeof o->ref_bf16, "%s/ref_bf16.safetensors", o->dir);
    snprintf(o->ref_f16, sizeof o->ref_f16, "%s/ref_f16.safetensors", o->dir);
    snprintf(o->ref_accum, sizeof o->ref_accum, "%s/ref_accum.safetensors", o->dir);

    dt_mh_t h;
    o->open(&h, "fp32", "none");
    if (dt_mh_write_params(&h, o->params, 0) != DT_OK ||
        dt_mh_write_params(&h, o->params_bf16, DT_BF16) != DT_OK ||
        dt_mh_write_params(&h, o->params_f16, DT_F16) != DT_OK ||
        dt_mh_write_tokens(o->tok, h.B, h.T, o->inputs, o->targets) != DT_OK ||
        /* both micro-batches as one batch of 2B: the mean over 2B*T
         * positions is the mean of the two micro-batch means */
        dt_mh_write_tokens(o->tok2, 2 * h.B, h.T, o->inputs, o->targets) != DT_OK)
        fail_msg("writing the oracle's inputs: %s", dt_last_error());
    dt_mh_ref(&h, o->script, o->params, o->tok, o->ref, o->args);
    dt_mh_ref(&h, o->script, o->params_bf16, o->tok, o->ref_bf16, o->args);
    dt_mh_ref(&h, o->script, o->params_f16, o->tok, o->ref_f16, o->args);
    dt_mh_ref(&h, o->script, o->params, o->tok2, o->ref_accum, o->args);
    dt_mh_close(&h);
    return 0;
}

int dt_mh_oracle_teardown(dt_mh_oracle_t *o)
{
    if (o->have_python)
        dt_mh_rmdir(o->dir);
    return 0;
}

void dt_mh_need_python(const dt_mh_oracle_t *o)
{
    if (!o->have_python) {
        printf("SKIP: the float64 oracle needs numpy: %s\n", o->no_python_why);
        skip();
    }
}

void dt_mh_ref(const dt_mh_t *h, const char *script, const char *params, const char *tok,
               const char *out, const char *args)
{
    char line[2048];
    snprintf(line, sizeof line, "--params %s --tokens %s --out %s %s", params, tok, out, args);
    if (dt_mh_run_ref(h, script, line) != 0)
        fail_msg("%s failed (its message is above)", script);
}

void dt_mh_tokens(uint64_t seed, int32_t vocab, int n, int32_t *inputs, int32_t *targets)
{
    uint64_t st = seed;
    for (int i = 0; i < n; i++) {
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        inputs[i] = (int32_t)((st >> 33) % (uint64_t)vocab);
        st = st * 6364136223846793005ull + 1442695040888963407ull;
        targets[i] = (int32_t)((st >> 33) % (uint64_t)vocab);
    }
}

double dt_mh_step(dt_mh_t *h, const int32_t *inputs, const int32_t *targets, uint32_t n_micro,
                  int no_grad)
{
    return dt_mh_step_scaled(h, inputs, targets, n_micro, no_grad, 1.0);
}

double dt_mh_step_scaled(dt_mh_t *h, const int32_t *inputs, const int32_t *targets,
                         uint32_t n_micro, int no_grad, double scale)
{
    int64_t bt = h->B * h->T;
    double sum = 0.0;
    assert_int_equal(dt_mh_begin_step(h, n_micro), DT_OK);
    for (uint32_t m = 0; m < n_micro; m++) {
        double loss = NAN;
        int rc = dt_model_step_micro(h->model, &h->ctx, inputs + m * bt, targets + m * bt, m,
                                     n_micro, no_grad, (float)(scale / n_micro), &loss);
        if (rc != DT_OK)
            fail_msg("micro-batch %u of %u: %s", m, n_micro, dt_last_error());
        sum += loss;
    }
    if (dt_mh_end_step(h) != DT_OK)
        fail_msg("%s", dt_last_error());
    return n_micro == 1 ? sum : sum / n_micro;
}

float *dt_mh_all_grads(dt_mh_t *h, uint64_t *n)
{
    *n = h->desc->numel;
    float *g = malloc(*n * 4);
    assert_non_null(g);
    uint64_t o = 0;
    for (uint32_t u = 0; u < h->desc->n_units; u++) {
        memcpy(g + o, dt_mh_grads(h, u), h->desc->units[u].numel * 4);
        o += h->desc->units[u].numel;
    }
    return g;
}

void dt_mh_check_checkpointing(const dt_mh_oracle_t *o, const char *label)
{
    dt_mh_need_python(o);
    static const char *modes[] = {"none", "all", "every"};
    float *first = NULL;
    uint64_t n = 0;
    dt_mh_stats_t st;
    memset(&st, 0, sizeof st);
    for (int i = 0; i < 3; i++) {
        dt_mh_t h;
        o->open(&h, "fp32", modes[i]);
        double loss = dt_mh_step(&h, o->inputs, o->targets, 1, 0);
        float *logits = dt_mh_logits(&h);
        assert_non_null(logits);
        dt_mh_compare(&h, o->ref, loss, logits, DT_MH_LOSS_ATOL_F32, DT_MH_TOL_F32, &st);
        free(logits);
        /* recomputation: the same kernels on the same inputs */
        float *g = dt_mh_all_grads(&h, &n);
        if (!first)
            first = g;
        else {
            if (memcmp(first, g, n * 4) != 0)
                fail_msg("activation_checkpointing = \"%s\" changed the gradients' bits",
                         modes[i]);
            free(g);
        }
        dt_mh_close(&h);
    }
    free(first);
    char what[128];
    snprintf(what, sizeof what, "%s fp32 (none/all/every)", label);
    dt_mh_print_stats(what, &st);
}

void dt_mh_check_accumulation(const dt_mh_oracle_t *o, const char *ckpt, const char *label)
{
    dt_mh_need_python(o);
    dt_mh_t h;
    o->open(&h, "fp32", ckpt);
    double loss = dt_mh_step(&h, o->inputs, o->targets, 2, 0);
    dt_mh_stats_t st;
    memset(&st, 0, sizeof st);
    dt_mh_compare(&h, o->ref_accum, loss, NULL, DT_MH_LOSS_ATOL_F32, DT_MH_TOL_F32, &st);
    char what[128];
    snprintf(what, sizeof what, "%s fp32 accumulation", label);
    dt_mh_print_stats(what, &st);
    dt_mh_close(&h);
}

void dt_mh_check_half(const dt_mh_oracle_t *o, const char *dtype, const char *label)
{
    dt_mh_need_python(o);
    const int bf16 = strcmp(dtype, "bf16") == 0;
    dt_mh_t h;
    o->open(&h, dtype, "every");
    assert_int_equal(h.desc->param_dtype, bf16 ? DT_BF16 : DT_F16);
    double loss = dt_mh_step(&h, o->inputs, o->targets, 1, 0);
    float *logits = dt_mh_logits(&h);
    assert_non_null(logits);
    dt_mh_stats_t exact, loose;
    memset(&exact, 0, sizeof exact);
    memset(&loose, 0, sizeof loose);
    dt_mh_compare(&h, bf16 ? o->ref_bf16 : o->ref_f16, loss, logits, DT_MH_LOSS_ATOL_F32,
                  DT_MH_TOL_F32, &exact);
    dt_mh_compare(&h, o->ref, loss, logits, bf16 ? DT_MH_LOSS_ATOL_BF16 : DT_MH_LOSS_ATOL_F16,
                  bf16 ? DT_MH_TOL_BF16 : DT_MH_TOL_F16, &loose);
    char what[128];
    snprintf(what, sizeof what, "%s %s vs oracle on %s-rounded params", label, dtype, dtype);
    dt_mh_print_stats(what, &exact);
    snprintf(what, sizeof what, "%s %s vs oracle on f32 params", label, dtype);
    dt_mh_print_stats(what, &loose);
    if (!bf16) {
        /* fp16 loss scaling: the gradient of the loss x 2^16 is the
         * gradient x 2^16 exactly, element for element (every backward
         * kernel is linear in the incoming gradient and a power of two
         * scales f32 without rounding), so unscaling loses nothing */
        uint64_t n;
        float *g = dt_mh_all_grads(&h, &n);
        double loss2 = dt_mh_step_scaled(&h, o->inputs, o->targets, 1, 0, 65536.0);
        float *g2 = dt_mh_all_grads(&h, &n);
        assert_true(loss2 == loss);
        for (uint64_t i = 0; i < n; i++)
            if (g2[i] != g[i] * 65536.0f)
                fail_msg("%s: gradient element %llu at loss scale 2^16: %a, want %a x 2^16",
                         label, (unsigned long long)i, (double)g2[i], (double)g[i]);
        free(g);
        free(g2);
    }
    free(logits);
    dt_mh_close(&h);
}
