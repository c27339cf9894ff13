/*
 * core/config/settings.c - the core's sections read once into typed
 * structs.  One table maps every key of schema.c the core uses to its
 * field, so the key names are spelled here and in schema.c only.
 */
#include "config/settings.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "dtrain/schedule.h"
#include "dtrain/strategy.h"
#include "util/error.h"

enum { F_STRING, F_INT, F_FLOAT, F_BOOL };

#define FIELD(path, type, member) {path, type, offsetof(dt_settings_t, member)}

static const struct field {
    const char *path;
    int type;
    size_t offset;
} fields[] = {
    FIELD("run.name", F_STRING, run.name),
    FIELD("run.seed", F_INT, run.seed),
    FIELD("run.out_dir", F_STRING, run.out_dir),
    FIELD("run.plugin_path", F_STRING, run.plugin_path),
    FIELD("run.device", F_STRING, run.device),
    FIELD("run.comm", F_STRING, run.comm),
    FIELD("run.log_every", F_INT, run.log_every),
    FIELD("run.metrics", F_STRING, run.metrics),
    FIELD("data.train", F_STRING, data.train),
    FIELD("data.val", F_STRING, data.val),
    FIELD("data.shuffle", F_BOOL, data.shuffle),
    FIELD("train.steps", F_INT, train.steps),
    FIELD("train.micro_batch", F_INT, train.micro_batch),
    FIELD("train.grad_accum", F_INT, train.grad_accum),
    FIELD("train.global_batch", F_INT, train.global_batch),
    FIELD("train.seq_len", F_INT, train.seq_len),
    FIELD("train.lr", F_FLOAT, train.lr),
    FIELD("train.min_lr", F_FLOAT, train.min_lr),
    FIELD("train.warmup_steps", F_INT, train.warmup_steps),
    FIELD("train.gradient_clipping", F_FLOAT, train.gradient_clipping),
    FIELD("train.eval_every", F_INT, train.eval_every),
    FIELD("train.eval_steps", F_INT, train.eval_steps),
    FIELD("train.stop_at", F_INT, train.stop_at),
    FIELD("optimizer.beta1", F_FLOAT, optimizer.beta1),
    FIELD("optimizer.beta2", F_FLOAT, optimizer.beta2),
    FIELD("optimizer.eps", F_FLOAT, optimizer.eps),
    FIELD("optimizer.weight_decay", F_FLOAT, optimizer.weight_decay),
    FIELD("optimizer.momentum", F_FLOAT, optimizer.momentum),
    FIELD("optimizer.nesterov", F_BOOL, optimizer.nesterov),
    FIELD("parallel.data", F_STRING, parallel.data),
    FIELD("parallel.tensor", F_INT, parallel.tensor),
    FIELD("parallel.pipeline", F_INT, parallel.pipeline),
    FIELD("parallel.offload", F_STRING, parallel.offload),
    FIELD("pipeline.schedule", F_STRING, pipeline.schedule),
    FIELD("pipeline.keep_activations", F_BOOL, pipeline.keep_activations),
    FIELD("pipeline.virtual_stages", F_INT, pipeline.virtual_stages),
    FIELD("tensor.scheme", F_STRING, tensor.scheme),
    FIELD("launch.nproc", F_INT, launch.nproc),
    FIELD("launch.nnodes", F_INT, launch.nnodes),
    FIELD("launch.node_rank", F_INT, launch.node_rank),
    FIELD("launch.timeout", F_FLOAT, launch.timeout_s),
    FIELD("launch.master_addr", F_STRING, launch.master_addr),
    FIELD("launch.master_port", F_INT, launch.master_port),
    FIELD("launch.min_nnodes", F_INT, launch.min_nnodes),
    FIELD("launch.max_restarts", F_INT, launch.max_restarts),
    FIELD("checkpoint.dir", F_STRING, checkpoint.dir),
    FIELD("fp16.loss_scale", F_FLOAT, fp16.loss_scale),
    FIELD("fp16.initial_scale_power", F_INT, fp16.initial_scale_power),
    FIELD("fp16.loss_scale_window", F_INT, fp16.loss_scale_window),
    FIELD("fp16.hysteresis", F_INT, fp16.hysteresis),
    FIELD("fp16.min_loss_scale", F_FLOAT, fp16.min_loss_scale),
    FIELD("checkpoint.every", F_INT, checkpoint.every),
    FIELD("checkpoint.keep", F_INT, checkpoint.keep),
    FIELD("checkpoint.resume", F_STRING, checkpoint.resume),
    FIELD("checkpoint.overwrite", F_BOOL, checkpoint.overwrite),
    FIELD("checkpoint.async", F_BOOL, checkpoint.async_),
};

/* The schema's ENUM choices, in dt_lr_decay_t order. */
static const char *const decay_names[] = {"cosine", "linear", "constant"};

/* The schema's [pipeline] balance choices, in dt_balance_t order. */
static const char *const balance_names[] = {"uniform", "params", "flops"};

const char *dt_lr_decay_name(dt_lr_decay_t d)
{
    return (unsigned)d < sizeof decay_names / sizeof decay_names[0] ? decay_names[d]
                                                                     : "unknown";
}

const char *dt_optim_name(int type) { return type == DT_OPTIM_SGD ? "sgd" : "adamw"; }

static int read_field(const dt_config_t *cfg, const struct field *f, dt_settings_t *s)
{
    void *dst = (char *)s + f->offset;
    switch (f->type) {
    case F_STRING: return dt_config_get_string(cfg, f->path, (const char **)dst);
    case F_INT: return dt_config_get_int(cfg, f->path, (int64_t *)dst);
    case F_FLOAT: return dt_config_get_float(cfg, f->path, (double *)dst);
    default: return dt_config_get_bool(cfg, f->path, (int *)dst);
    }
}

/* run.name names the folder <out_dir>/<name>: a plain name, so outputs
 * cannot land outside out_dir ("../../x") or in it ("."). */
static int check_run_name(const dt_config_t *cfg, const char *name)
{
    size_t n = strlen(name);
    int ok = n > 0 && n <= DT_RUN_NAME_MAX && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
    for (size_t i = 0; ok && i < n; i++) {
        char c = name[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    }
    if (ok)
        return DT_OK;
    char where[1400];
    dt_config_where(cfg, "run.name", where, sizeof where);
    return dt_err_set(DT_ERR_CONFIG,
                      "%s: run.name must be a plain name, 1 to %d letters, digits, '.', "
                      "'_' or '-', not \".\" or \"..\" (it names the folder "
                      "<run.out_dir>/<run.name>)",
                      where, DT_RUN_NAME_MAX);
}

/* [fp16] is checked whatever model.dtype is: the values together must be
 * what the scaler accepts (its own check: the one definition of a valid
 * [fp16]), so `dtrain check` and the launcher find a bad one before any
 * rank runs.  For another dtype the table is kept but not used, like a
 * plugin's table the config does not select, so one file can flip
 * model.dtype from the command line; `dtrain check` says so
 * (dt_settings_fp16_unused). */
int dt_settings_fp16_check(const dt_fp16_settings_t *f, const char *cfg_path)
{
    const char *where = cfg_path && cfg_path[0] ? cfg_path : "config";
    if (!(f->loss_scale >= 0 && f->loss_scale <= DT_LOSS_SCALE_MAX))
        return dt_err_set(DT_ERR_CONFIG, "%s: [fp16] loss_scale = %g: must be 0 (dynamic) or a "
                          "static scale in (0, 2^127]", where, f->loss_scale);
    if (f->loss_scale > 0)
        return DT_OK;
    if (f->initial_scale_power < 0 || f->initial_scale_power > 127)
        return dt_err_set(DT_ERR_CONFIG, "%s: [fp16] initial_scale_power = %lld: must be in "
                          "[0, 127] (the scale 2^power must fit an f32)", where,
                          (long long)f->initial_scale_power);
    if (f->loss_scale_window < 1 || f->hysteresis < 1)
        return dt_err_set(DT_ERR_CONFIG, "%s: [fp16] %s = %lld: must be at least 1", where,
                          f->loss_scale_window < 1 ? "loss_scale_window" : "hysteresis",
                          (long long)(f->loss_scale_window < 1 ? f->loss_scale_window
                                                               : f->hysteresis));
    const double initial = ldexp(1.0, (int)f->initial_scale_power);
    if (!(f->min_loss_scale > 0 && f->min_loss_scale <= initial))
        return dt_err_set(DT_ERR_CONFIG, "%s: [fp16] min_loss_scale = %g: must be > 0 and at "
                          "most the initial scale 2^initial_scale_power = %g", where,
                          f->min_loss_scale, initial);
    return DT_OK;
}

static int check_fp16_keys(const dt_config_t *cfg, const dt_fp16_settings_t *f)
{
    return dt_settings_fp16_check(f, dt_config_path(cfg));
}

const char *dt_settings_fp16_unused(const dt_config_t *cfg)
{
    static const char *const keys[] = {"fp16.loss_scale", "fp16.initial_scale_power",
                                       "fp16.loss_scale_window", "fp16.hysteresis",
                                       "fp16.min_loss_scale"};
    const char *dtype;
    if (dt_config_get_string(cfg, "model.dtype", &dtype) || strcmp(dtype, "fp16") == 0)
        return NULL;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        dt_origin_t o = dt_config_origin(cfg, keys[i]);
        if (o == DT_ORIGIN_FILE || o == DT_ORIGIN_CLI)
            return keys[i];
    }
    return NULL;
}

int dt_settings_read(const dt_config_t *cfg, dt_settings_t *out)
{
    dt_settings_t s;
    memset(&s, 0, sizeof s);
    s.config_path = dt_config_path(cfg);
    int rc;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if ((rc = read_field(cfg, &fields[i], &s)))
            return rc;
    if ((rc = check_run_name(cfg, s.run.name)) || (rc = check_fp16_keys(cfg, &s.fp16)))
        return rc;
    const char *decay, *opt, *balance;
    if ((rc = dt_config_get_string(cfg, "train.decay", &decay)) ||
        (rc = dt_config_get_string(cfg, "optimizer.type", &opt)) ||
        (rc = dt_config_get_string(cfg, "pipeline.balance", &balance)))
        return rc;
    s.pipeline.balance = DT_BALANCE_UNIFORM;
    for (int b = 0; b < (int)(sizeof balance_names / sizeof balance_names[0]); b++)
        if (strcmp(balance, balance_names[b]) == 0)
            s.pipeline.balance = b;
    s.train.decay = DT_DECAY_COSINE;
    for (int d = 0; d < (int)(sizeof decay_names / sizeof decay_names[0]); d++)
        if (strcmp(decay, decay_names[d]) == 0)
            s.train.decay = (dt_lr_decay_t)d;
    s.optimizer.type = strcmp(opt, dt_optim_name(DT_OPTIM_SGD)) == 0 ? DT_OPTIM_SGD
                                                                     : DT_OPTIM_ADAMW;
    *out = s;
    return DT_OK;
}
