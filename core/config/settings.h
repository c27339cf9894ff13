/*
 * core/config/settings.h - the core's own sections (schema.c) as typed
 * structs, read from the resolved config once (dt_settings_read) and passed
 * to the engine, the launcher and the planner, so no one else reads the
 * core's keys by name.
 *
 * Strings point into the config: they are valid while it lives and until
 * one of their keys is changed (dt_resolve_set re-reads the settings after
 * a change).  Plugin tables are not here: a plugin reads its own table
 * through its host services (dtrain/host.h), and the model reads [model]
 * itself (core/model), because a preset derives its shape there.
 */
#ifndef DT_CORE_SETTINGS_H
#define DT_CORE_SETTINGS_H

#include <stdint.h>

#include "config/config.h"

/* [train] decay */
typedef enum dt_lr_decay {
    DT_DECAY_COSINE = 0,
    DT_DECAY_LINEAR = 1,
    DT_DECAY_CONSTANT = 2
} dt_lr_decay_t;

/* The longest run.name: a plain name ([A-Za-z0-9._-], not "." or "..")
 * that names the folder <run.out_dir>/<run.name>. */
#define DT_RUN_NAME_MAX 64

typedef struct dt_run_settings {
    const char *name;        /* checked: a plain name (DT_RUN_NAME_MAX) */
    int64_t seed;
    const char *out_dir;
    const char *plugin_path; /* ':'-separated folders; "" = none */
    const char *device;      /* device plugin */
    const char *comm;        /* comm plugin */
    int64_t log_every;
    const char *metrics;     /* JSON-lines file; "" = none */
} dt_run_settings_t;

typedef struct dt_data_settings {
    const char *train; /* token file; "" = not given */
    const char *val;   /* "" = none */
    int shuffle;
} dt_data_settings_t;

typedef struct dt_train_settings {
    int64_t steps;
    int64_t micro_batch;  /* sequences per rank per micro-step */
    int64_t grad_accum;   /* 0 = derive (dt_batch_resolve) */
    int64_t global_batch; /* 0 = derive */
    int64_t seq_len;      /* tokens */
    double lr, min_lr;
    int64_t warmup_steps;
    dt_lr_decay_t decay;
    double gradient_clipping; /* 0 = off */
    int64_t eval_every;       /* 0 = never */
    int64_t eval_steps;
    int64_t stop_at;          /* 0 = run every step */
} dt_train_settings_t;

typedef struct dt_optimizer_settings {
    int type; /* dt_optim_kind_t (dtrain/strategy.h) */
    double beta1, beta2, eps, weight_decay, momentum;
    int nesterov;
} dt_optimizer_settings_t;

typedef struct dt_parallel_settings {
    const char *data;    /* data-parallel strategy plugin */
    int64_t tensor;      /* degree; > 1 selects tensor.scheme's plugin */
    int64_t pipeline;    /* stages; > 1 selects pipeline.schedule's plugin */
    const char *offload; /* offload plugin, "none" = no tier */
} dt_parallel_settings_t;

/* [pipeline]: the schedule plugin and the layout every schedule gets
 * (dtrain/schedule.h dt_stage_args_v1_t) */
typedef struct dt_pipeline_settings {
    const char *schedule;   /* schedule plugin, with parallel.pipeline > 1 */
    int keep_activations;
    int64_t virtual_stages; /* chunks per stage */
    int balance;            /* dt_balance_t */
} dt_pipeline_settings_t;

/* [tensor]: the tensor-parallel scheme (dtrain/tensor_parallel.h) */
typedef struct dt_tensor_settings {
    const char *scheme; /* scheme plugin, with parallel.tensor > 1 */
} dt_tensor_settings_t;

typedef struct dt_launch_settings {
    int64_t nproc;        /* local ranks, on each node */
    int64_t nnodes;       /* nodes; each starts nproc ranks */
    int64_t node_rank;    /* this node, in [0, nnodes) */
    double timeout_s;     /* bound of every collective wait, seconds */
    const char *master_addr;
    int64_t master_port;
    int64_t min_nnodes;   /* elastic: > 0, the fewest nodes of a round */
    int64_t max_restarts; /* elastic: restarts before giving up */
} dt_launch_settings_t;

typedef struct dt_checkpoint_settings {
    const char *dir; /* "" = <run.out_dir>/<run.name>/ckpt */
    int64_t every;   /* 0 = no periodic saves */
    int64_t keep;
    const char *resume; /* "", "latest" or a checkpoint path */
    int overwrite;      /* a fresh start removes the folder's checkpoints */
    int async_;         /* periodic saves written while the next step trains */
} dt_checkpoint_settings_t;

/* [fp16]: the loss scaler's keys (core/train/loss_scale.h) */
typedef struct dt_fp16_settings {
    double loss_scale;           /* 0 = dynamic */
    int64_t initial_scale_power;
    int64_t loss_scale_window;
    int64_t hysteresis;
    double min_loss_scale;
} dt_fp16_settings_t;

typedef struct dt_settings {
    const char *config_path; /* the file they came from ("" = none), for
                              * messages */
    dt_run_settings_t run;
    dt_data_settings_t data;
    dt_train_settings_t train;
    dt_optimizer_settings_t optimizer;
    dt_parallel_settings_t parallel;
    dt_pipeline_settings_t pipeline;
    dt_tensor_settings_t tensor;
    dt_launch_settings_t launch;
    dt_checkpoint_settings_t checkpoint;
    dt_fp16_settings_t fp16;
} dt_settings_t;

/* Read the core's sections of `cfg` (after their schemas were applied, as
 * dt_resolve_core does).  DT_ERR_NOT_FOUND / DT_ERR_INVALID when a section
 * was not applied: a bug in the caller, not user input. */
/* The first [fp16] key the config sets although model.dtype is not
 * "fp16" (the table is checked but not used then), or NULL. */
const char *dt_settings_fp16_unused(const dt_config_t *cfg);

/* [fp16]'s values together are what the loss scaler runs with
 * (core/train/loss_scale.c takes this check as its own): a static scale
 * in (0, DT_LOSS_SCALE_MAX], or a dynamic one whose initial power, window,
 * hysteresis and floor fit.  DT_ERR_CONFIG naming the file and the key. */
#define DT_LOSS_SCALE_MAX 0x1p127 /* the largest power of 2 an f32 holds */
int dt_settings_fp16_check(const dt_fp16_settings_t *f, const char *cfg_path);

int dt_settings_read(const dt_config_t *cfg, dt_settings_t *out);

/* "cosine", "linear", "constant". */
const char *dt_lr_decay_name(dt_lr_decay_t d);
/* "adamw", "sgd": the [optimizer] type of a dt_optim_kind_t. */
const char *dt_optim_name(int type);

#endif /* DT_CORE_SETTINGS_H */
