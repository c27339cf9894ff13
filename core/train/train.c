/*
 * core/train/train.c - the training loop.
 *
 * Knows the four interfaces, not their implementations: whatever device,
 * communicator and strategy the config names are driven the same way.
 * dt_train reads top to bottom as a run goes: plugins up, model, batch
 * arithmetic, data, strategy, the checkpoint folder claimed (its lock,
 * interrupted saves removed, no other run's checkpoints), resume, metrics,
 * then each step (micro-batches, evaluation, the log line, checkpoints),
 * then the memory reports (device, and host memory per plugin) and the
 * summary line; each of those is one function below, in that order.  As
 * it goes it keeps the crash handler's record (util/crash.h): the phase,
 * step and micro-batch, and every plugin call PLUGIN_CALL makes.  An fp16
 * model's loss scaling (the scaler itself: loss_scale.c) is one block of
 * its own, before "one step".  Under pipeline parallelism
 * (parallel.pipeline > 1) the schedule plugin drives this rank's stage
 * (stage_runner.c: its units, the runner, the bubble) in place of the
 * micro-batch loop; the blocks here that say "pipeline" hand over to it.
 */
#include "train/train.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "ckpt/ckpt.h"
#include "ckpt/ckpt_io.h"
#include "train/consistency.h"
#include "train/grid.h"
#include "train/loss_scale.h"
#include "setup/output_dir.h"
#include "data/data.h"
#include "util/fileutil.h"
#include "model/model.h"
#include "train/plan.h"
#include "train/plugin_call.h"
#include "train/batch_lr.h"
#include "train/stage_runner.h"
#include "train/preflight.h"
#include "launch/rendezvous.h"
#include "launch/world.h"
#include "loader/host_services.h"
#include "util/crash.h"
#include "util/log.h"
#include "util/error.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double mib(uint64_t b) { return (double)b / (1024.0 * 1024.0); }

/* Everything a run holds, released by run_free. */
typedef struct run {
    dt_resolved_t *r;
    dt_settings_t *set;       /* r->set; the batch values resolved here */
    const char *metrics_path; /* --metrics, else run.metrics; "" = none */
    const dt_train_opts_t *opts; /* eval_only: `dtrain eval` (train.h) */
    dt_world_t world;
    int64_t dp;               /* data-parallel ranks: world / pipeline stages */
    int32_t dp_rank;          /* this rank among them (the sampler's rank) */
    const dt_plugin_t *pdev, *pcomm, *pstrat;
    dt_device_t *dev;
    dt_stream_t *stream;
    dt_comm_t *comm;
    const dt_plugin_t *poff;  /* [parallel] offload's tier; NULL: none */
    dt_offload_t *off;
    dt_strategy_t *strat;
    dt_comm_t *dp_comm;       /* the data strategy's group: comm, or the
                               * grid's data group under a pipeline */
    /* ---- tensor parallelism: all zero without parallel.tensor > 1; the
     * tensor-parallel scheme (tensor.scheme) over the grid's tensor group,
     * which the model calls itself ---- */
    const dt_plugin_t *ptens;
    dt_tensor_group_t *tens;
    /* ---- the grid (tp x pp x dp) under tensor or pipeline parallelism,
     * and the stage this rank runs (all zero without parallel.pipeline >
     * 1: stage.plugin NULL) ---- */
    dt_grid_t grid;
    dt_comm_t *groups[DT_GRID_N_GROUPS]; /* split from comm (grid.h) */
    dt_stage_t stage;
    dt_optim_desc_t optim;    /* the strategy keeps a pointer until finalize */
    dt_model_t *model;
    dt_model_ctx_t ctx;       /* where the model's kernels and hooks run */
    dt_dataset_t *train, *val;
    dt_sampler_t *sampler;
    int32_t *inputs, *targets; /* (micro_batch, seq_len) token ids */
    dt_device_props_t props;
    double flops_per_token;
    int64_t start_step;       /* the step a resumed checkpoint ended; 0 */
    int ckpt_lock;            /* rank 0: the checkpoint folder's lock; -1 */
    FILE *metrics;
    int metrics_errno;        /* the first failed write to it; 0 */
    /* what the summary and the log line's elapsed time and ETA need */
    double loop_start;        /* monotonic s when the first step began */
    int64_t last_step;        /* the last step trained; start_step before */
    double last_loss, last_val; /* NAN until there is one */
    int64_t last_val_step;
    int ls_on;                /* model.dtype = "fp16": the loss is scaled */
    dt_loss_scaler_t ls;      /* loss_scale.h */
    dt_ckpt_async_t *pending; /* checkpoint.async: the save of the step
                               * before, committed after this one */
} run_t;

/* What one step measured, for the log line and the metrics file. */
typedef struct step_report {
    int64_t step;
    double loss;       /* mean over the global batch */
    double lr, grad_norm;
    double step_s;     /* wall time of the step, evaluation excluded */
    double tokens_per_s, mfu;
    uint64_t mem_now;  /* device bytes allocated after the step */
    double eval_loss;  /* NAN when not evaluated this step */
    double loss_scale; /* fp16: the scale this step's loss carried; else 0 */
    int skipped;       /* fp16: the gradient overflowed, no update */
} step_report_t;

static void run_free(run_t *R)
{
    dt_model_ctx_t ctx = {R->dev, R->stream, NULL, NULL};
    dt_crash_set_phase("shutting down", 0);
    dt_ckpt_save_discard(R->pending); /* the run failed before committing it */
    R->pending = NULL;
    if (R->strat)
        dt_strategy_ops(R->strat)->finalize(R->strat);
    dt_stage_free(&R->stage);
    if (R->tens)
        dt_tensor_ops(R->tens)->finalize(R->tens);
    if (R->off) /* after the strategy, which frees its buffers there */
        dt_offload_ops(R->off)->finalize(R->off);
    if (R->model)
        dt_model_free(R->model, R->dev ? &ctx : NULL);
    for (int g = 0; g < DT_GRID_N_GROUPS; g++) /* before the world they came from */
        if (R->groups[g])
            dt_comm_ops(R->groups[g])->finalize(R->groups[g]);
    if (R->comm)
        dt_comm_ops(R->comm)->finalize(R->comm);
    if (R->stream)
        dt_device_ops(R->dev)->stream_destroy(R->dev, R->stream);
    if (R->dev)
        dt_device_ops(R->dev)->finalize(R->dev);
    dt_sampler_free(R->sampler);
    dt_data_close(R->train);
    dt_data_close(R->val);
    free(R->inputs);
    free(R->targets);
    if (R->metrics)
        fclose(R->metrics);
    if (R->ckpt_lock >= 0)
        close(R->ckpt_lock);
}

/* ---- start: plugins, model, batch, data, strategy, resume, metrics ---- */

/* ---- pipeline and tensor parallelism: the grid's groups
 * (core/train/grid.h: tp fastest, then dp, then pp); the data strategy
 * gets the data group ---- */
static int start_grid(run_t *R)
{
    const dt_plugin_t *ppipe = R->r->plugin[DT_ROLE_PIPELINE];
    R->ptens = R->r->plugin[DT_ROLE_TENSOR];
    if (!ppipe && !R->ptens)
        return DT_OK;
    int rc = dt_grid_init(&R->grid, R->world.size, R->world.rank, R->set->parallel.tensor,
                          R->set->parallel.pipeline);
    if (!rc)
        rc = dt_grid_split(&R->grid, R->comm, R->groups);
    if (rc)
        return rc;
    R->dp_rank = R->grid.dp_rank;
    R->dp_comm = R->groups[DT_GRID_DATA];
    return ppipe ? dt_stage_start(&R->stage, ppipe, &R->grid) : DT_OK;
}

/* The roles this loop drives, who this rank is, the device and its
 * stream, the communicator, and every rank agreeing on the config. */
static int start_plugins(run_t *R)
{
    dt_resolved_t *r = R->r;
    int rc;
    R->pdev = r->plugin[DT_ROLE_DEVICE];
    R->pcomm = r->plugin[DT_ROLE_COMM];
    R->pstrat = r->plugin[DT_ROLE_DATA];
    if ((rc = dt_world_from_env(&R->set->launch, &R->world)))
        return rc;
    dt_log_set_rank(R->world.rank);
    if ((rc = dt_preflight_dp(r, R->world.size, &R->dp)))
        return rc;
    R->dp_rank = R->world.rank;

    dt_device_init_t da = {.struct_size = sizeof da, .rank = R->world.rank,
                           .local_rank = R->world.local_rank,
                           .local_size = R->world.local_size, .device_index = -1};
    rc = PLUGIN_CALL(R->pdev,
                     ((const dt_device_ops_t *)R->pdev->ops)->init(R->pdev->host, &da, &R->dev),
                     "init");
    if (!rc && (rc = dt_plugin_check_instance(R->pdev, R->pdev->ops, R->dev)))
        R->dev = NULL;
    if (rc || (rc = PLUGIN_CALL(R->pdev, dt_device_ops(R->dev)->stream_create(R->dev, &R->stream),
                          "stream_create")))
        return rc;
    /* ranks on several nodes meet first (core/launch/rendezvous.h): the job
     * id they agree on names what the communicator creates; a comm plugin
     * may exchange bootstrap bytes through the same meeting during init */
    if ((rc = dt_rdzv_session_begin(&R->world, dt_config_hash(R->r->cfg),
                                    R->set->launch.timeout_s)))
        return rc;
    dt_comm_init_t ca = {.struct_size = sizeof ca, .rank = R->world.rank,
                         .size = R->world.size, .local_rank = R->world.local_rank,
                         .local_size = R->world.local_size, .job_id = R->world.job_id,
                         .job_secret = R->world.job_secret[0] ? R->world.job_secret : NULL,
                         .master_addr = R->world.master_addr,
                         .master_port = R->world.master_port,
                         .timeout_ms = (int64_t)(R->set->launch.timeout_s * 1000.0), .dev = R->dev};
    rc = PLUGIN_CALL(R->pcomm,
                     ((const dt_comm_ops_t *)R->pcomm->ops)->init(R->pcomm->host, &ca, &R->comm),
                     "init");
    if (!rc && (rc = dt_plugin_check_instance(R->pcomm, R->pcomm->ops, R->comm)))
        R->comm = NULL;
    dt_rdzv_session_end();
    if (rc)
        return rc;
    /* ---- offload tier: the strategy keeps state there ---- */
    if ((R->poff = r->plugin[DT_ROLE_OFFLOAD])) {
        const dt_offload_ops_t *oops = R->poff->ops;
        dt_offload_init_t oa = {.struct_size = sizeof oa, .rank = R->world.rank,
                                .local_rank = R->world.local_rank, .job_id = R->world.job_id,
                                .timeout_ms = ca.timeout_ms,
                                .dev = R->dev};
        rc = PLUGIN_CALL(R->poff, oops->init(R->poff->host, &oa, &R->off), "init");
        if (!rc && (rc = dt_plugin_check_instance(R->poff, R->poff->ops, R->off)))
            R->off = NULL;
        if (rc)
            return rc;
    }
    /* ---- end offload tier ---- */
    if ((rc = dt_consistency_check(&R->world, R->r->cfg, R->comm)))
        return rc;
    R->dp_comm = R->comm;
    return start_grid(R);
}

/* micro x accumulation x dp = global, written back as derived values, and
 * sequences that fit the model's context. */
static int resolve_batch(run_t *R)
{
    int rc = dt_preflight_stages(R->r, R->model);
    return rc ? rc : dt_preflight_batch(R->r, R->dp, dt_model_info(R->model)->context);
}

/* The token files, checked against the vocabulary; the sampler; the
 * host buffers one micro-batch is read into. */
static int open_data(run_t *R)
{
    const dt_data_settings_t *d = &R->set->data;
    const dt_train_settings_t *t = &R->set->train;
    const uint32_t vocab = (uint32_t)dt_model_info(R->model)->vocab_size;
    int rc;
    const int eval_only = R->opts && R->opts->eval_only;
    if (eval_only && !d->val[0]) /* dtrain eval sets it: a caller's slip */
        return dt_err_set(DT_ERR_CONFIG, "%s: evaluation needs [data] val", R->set->config_path);
    if (!eval_only && (rc = dt_preflight_data_named(R->set)))
        return rc;
    if (!eval_only && ((rc = dt_data_open(d->train, &R->train)) ||
                       (rc = dt_data_check_vocab(R->train, vocab))))
        return rc;
    /* a validation file too short for one evaluation batch is an error, as
     * the same file is for training: never a run with no val loss */
    if (d->val[0] && ((rc = dt_data_open(d->val, &R->val)) ||
                      (rc = dt_data_check_vocab(R->val, vocab)) ||
                      (rc = dt_data_eval_check(R->val, (uint32_t)t->seq_len,
                                               (uint32_t)(t->global_batch / R->dp),
                                               (uint32_t)R->dp))))
        return rc;
    if (!eval_only && (rc = dt_sampler_init(&R->sampler, R->train, (uint32_t)t->seq_len,
                                            (uint32_t)t->micro_batch,
                                            (uint32_t)t->global_batch,
                                            (uint64_t)R->set->run.seed, d->shuffle)))
        return rc;
    R->inputs = malloc((size_t)(t->micro_batch * t->seq_len) * sizeof *R->inputs);
    R->targets = malloc((size_t)(t->micro_batch * t->seq_len) * sizeof *R->targets);
    if (!R->inputs || !R->targets)
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    return DT_OK;
}

/* The tensor-parallel scheme over the tensor group; the model calls it
 * itself (dt_model_set_tensor). */
static int init_tensor(run_t *R)
{
    dt_tensor_init_t ta = {.struct_size = sizeof ta, .dev = R->dev,
                           .compute_stream = R->stream,
                           .comm = R->groups[DT_GRID_TENSOR]};
    int rc = PLUGIN_CALL(
        R->ptens, ((const dt_tensor_ops_t *)R->ptens->ops)->init(R->ptens->host, &ta, &R->tens),
        "init");
    if (!rc && (rc = dt_plugin_check_instance(R->ptens, R->ptens->ops, R->tens)))
        R->tens = NULL;
    if (!rc)
        dt_model_set_tensor(R->model, R->tens);
    return rc;
}

/* The optimizer, the strategy instance over the model, and the model's
 * activations for one micro-batch. */
static int init_strategy(run_t *R)
{
    const dt_optimizer_settings_t *os = &R->set->optimizer;
    R->optim = (dt_optim_desc_t){.struct_size = sizeof R->optim,
                                 .kind = os->type,
                                 .nesterov = os->nesterov,
                                 .beta1 = (float)os->beta1,
                                 .beta2 = (float)os->beta2,
                                 .eps = (float)os->eps,
                                 .momentum = (float)os->momentum,
                                 .weight_decay = (float)os->weight_decay};
    /* the optimizer's update is an optional kernel: refuse a device without
     * it now, not at the end of the first step */
    const dt_kernels_t *kern = dt_device_ops(R->dev)->kernels();
    if (R->optim.kind == DT_OPTIM_SGD ? !DT_HAS_OP(dt_kernels_t, kern, sgd_update)
                                      : !DT_HAS_OP(dt_kernels_t, kern, adamw_update))
        return dt_err_set(DT_ERR_UNSUPPORTED,
                          "%s: [optimizer] type = \"%s\": device '%s' has no kernel '%s' "
                          "(f32 parameters and gradients)",
                          R->set->config_path, dt_optim_name(os->type),
                          R->r->plugin[DT_ROLE_DEVICE]->name,
                          R->optim.kind == DT_OPTIM_SGD ? "sgd_update" : "adamw_update");
    dt_strategy_init_t sa = {.struct_size = sizeof sa,
                             .n_micro = (uint32_t)R->set->train.grad_accum,
                             .dev = R->dev,
                             .compute_stream = R->stream,
                             .comm = R->dp_comm,
                             .model = dt_model_desc(R->model),
                             .optim = &R->optim,
                             .offload = R->off};
    /* ---- pipeline: the data strategy holds this rank's stage ---- */
    uint8_t *flags = NULL;
    int rc, tied = 0;
    if (R->ptens && (rc = init_tensor(R)))
        return rc;
    /* the gradient norm over the model's ranks (tp x pp): each holds part */
    if (R->ptens || R->stage.plugin)
        sa.norm_comm = R->groups[DT_GRID_MODEL];
    if (R->stage.plugin) {
        if (!(flags = calloc(dt_model_desc(R->model)->n_units, 1)))
            return dt_err_set(DT_ERR_NOMEM, "out of memory");
        if ((rc = dt_stage_assign(&R->stage, R->model, R->set, R->world.rank, flags, &tied)) ||
            (rc = dt_stage_init(&R->stage, R->set, R->dev, R->stream,
                                R->groups[DT_GRID_PIPELINE]))) {
            free(flags);
            return rc;
        }
        sa.unit_flags = flags;
        sa.tied_comm = tied ? R->groups[DT_GRID_EMBEDDING] : NULL;
    }
    rc = PLUGIN_CALL(
        R->pstrat,
        ((const dt_strategy_ops_t *)R->pstrat->ops)->init(R->pstrat->host, &sa, &R->strat), "init");
    if (!rc && (rc = dt_plugin_check_instance(R->pstrat, R->pstrat->ops, R->strat)))
        R->strat = NULL;
    free(flags);
    if (rc == DT_ERR_UNSUPPORTED && (R->stage.plugin || R->ptens)) {
        char msg[DT_ERR_MAX];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        return dt_err_set(DT_ERR_CONFIG, "%s: [parallel] data = \"%s\" with parallel.%s "
                          "= %lld: %s", R->set->config_path, R->pstrat->name,
                          R->stage.plugin ? "pipeline" : "tensor",
                          (long long)(R->stage.plugin ? R->set->parallel.pipeline
                                                      : R->set->parallel.tensor), msg);
    }
    if (rc == DT_ERR_NOMEM && !R->poff) {
        /* ---- offload tier: say how the state could fit ---- */
        char msg[DT_ERR_MAX];
        snprintf(msg, sizeof msg, "%s", dt_last_error());
        return dt_err_set(rc, "%s; to keep the optimizer state (f32 master and moments) in "
                          "host memory instead, set [parallel] offload = \"offload_cpu\" "
                          "(and offload_what = \"optimizer\" in the strategy's table; zero "
                          "stage 3 and fsdp FULL_SHARD may offload \"params\" too)", msg);
    }
    if (rc)
        return rc;
    R->ctx = (dt_model_ctx_t){R->dev, R->stream, R->strat,
                              R->pstrat->name};
    /* a stage's rank keeps its own units' activations only */
    dt_stage_t *S = &R->stage;
    if (S->plugin) {
        dt_stage_env_t env = {.set = R->set, .model = R->model, .ctx = &R->ctx,
                              .sampler = R->sampler, .val = R->val, .inputs = R->inputs,
                              .targets = R->targets, .dp = R->dp, .dp_rank = R->dp_rank,
                              .world_rank = R->world.rank, .world_size = R->world.size,
                              .pcomm = R->pcomm, .comm = R->comm,
                              .pstrat = R->pstrat, .strat = R->strat};
        dt_stage_bind(S, &env);
    }
    if (S->plugin && ((rc = dt_model_set_stages(R->model, S->n_chunks, S->chunk_first,
                                                S->chunk_end)) ||
                      (rc = dt_model_set_slots(R->model, S->n_slots))))
        return rc;
    return dt_model_alloc_acts(R->model, &R->ctx, R->set->train.micro_batch,
                               R->set->train.seq_len);
}

/* Rank 0, which begins and commits every save, claims the checkpoint
 * folder for this run: its lock, held to the end (two runs never write
 * one folder), then the leftovers of saves a crash interrupted
 * ("step-N.tmp", "step-N.old") removed, and, for a fresh start, no other
 * run's checkpoints left there for a later resume = "latest" to continue
 * (refused, or removed with checkpoint.overwrite).  Every rank learns
 * rank 0's outcome. */
static int claim_checkpoints(run_t *R)
{
    char root[2048];
    int rc = DT_OK;
    if (R->world.rank == 0) {
        rc = dt_ckpt_root(R->set, root, sizeof root);
        if (!rc)
            rc = dt_ckpt_lock(root, &R->ckpt_lock);
        if (!rc && (rc = dt_ckpt_clean_stale(root)))
            dt_err_context(rc, "removing interrupted saves from the checkpoint folder");
        if (!rc && !R->set->checkpoint.resume[0])
            rc = dt_ckpt_claim_fresh(root, (int)R->set->checkpoint.overwrite,
                                     R->set->config_path);
    }
    if (R->world.size <= 1)
        return rc;
    /* rank 0's outcome and, on failure, its message: every rank then says
     * why (the launcher reports whichever rank ends first) */
    int32_t v = rc;
    char msg[2048] = "";
    if (rc)
        snprintf(msg, sizeof msg, "%s", dt_last_error());
    int arc = PLUGIN_CALL(R->pcomm, dt_comm_ops(R->comm)->broadcast(R->comm, &v, 1, DT_I32, 0, NULL,
                                                           NULL),
                          "broadcast of the checkpoint folder's claim");
    if (!arc && v)
        arc = PLUGIN_CALL(
            R->pcomm,
            dt_comm_ops(R->comm)->broadcast(R->comm, msg, sizeof msg, DT_U8, 0, NULL, NULL),
            "broadcast of the checkpoint folder's claim");
    if (arc)
        return arc;
    /* (the broadcasts cleared rank 0's own message: set it again) */
    return v ? dt_err_set(v, "%s", msg) : DT_OK;
}

/* The strategy's state from the checkpoint to resume, or freshly
 * initialised. */
static int load_state(run_t *R)
{
    cJSON *loop = NULL; /* the loop's own state: the loss scaler's */
    int rc = dt_ckpt_init_or_resume(&R->world, R->set, R->strat, R->model,
                                    &R->start_step, &loop);
    if (!rc && R->ls_on)
        rc = dt_loss_scale_restore(&R->ls, loop, R->set->checkpoint.resume);
    cJSON_Delete(loop);
    return rc ? rc : PLUGIN_CALL(R->pstrat, dt_strategy_ops(R->strat)->state_loaded(R->strat),
                                 "state_loaded");
}

/* Rank 0's metrics file: appended to when resuming, else new. */
static int open_metrics(run_t *R)
{
    const char *path = R->metrics_path;
    if (!path[0] || R->world.rank != 0)
        return DT_OK;
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    int rc;
    if (slash && slash != parent) {
        *slash = '\0';
        if ((rc = dt_fileutil_mkdir_p(parent)))
            return rc;
    }
    /* a regular file or nothing, never written through a link, and a FIFO
     * or a device there is an error, not a hang (dt_fileutil_open_output) */
    char what[4200];
    snprintf(what, sizeof what, "opening metrics file '%s'", path);
    int fd;
    if ((rc = dt_fileutil_open_output(path, R->start_step > 0 ? DT_FILEUTIL_APPEND : 0, what,
                                      &fd)))
        return rc;
    if (!(R->metrics = fdopen(fd, R->start_step > 0 ? "a" : "w"))) {
        int err = errno;
        close(fd);
        return dt_err_set(DT_ERR_IO, "%s: %s", what, strerror(err));
    }
    return DT_OK;
}

/* The device's properties (for MFU) and rank 0's line saying what runs. */
static void print_header(run_t *R)
{
    const dt_train_settings_t *t = &R->set->train;
    R->props = (dt_device_props_t){.struct_size = sizeof(dt_device_props_t)};
    dt_device_ops(R->dev)->props(R->dev, &R->props);
    R->flops_per_token = dt_model_flops_per_token(R->model, t->seq_len);
    if (R->world.rank != 0)
        return;
    const dt_model_desc_t *d = dt_model_desc(R->model);
    printf("dtrain: %s, %.2fM parameters (%u units), %lld steps of %lld sequences x %lld "
           "tokens (micro %lld x accum %lld x dp %lld); device %s; strategy %s\n",
           d->arch, (double)dt_model_info(R->model)->global_numel / 1e6, d->n_units, (long long)t->steps,
           (long long)t->global_batch, (long long)t->seq_len, (long long)t->micro_batch,
           (long long)t->grad_accum, (long long)R->dp, R->props.name, R->pstrat->name);
    if (R->stage.plugin)
        printf("dtrain: pipeline of %d stages x %d data-parallel replicas (schedule %s over "
               "the pipeline groups, strategy %s over the data groups)\n",
               R->grid.pp, R->grid.dp, R->stage.plugin->name, R->pstrat->name);
    if (R->ptens)
        printf("dtrain: tensor parallel over %d ranks x %d pipeline stage(s) x %d "
               "data-parallel replicas (scheme %s over the tensor groups; this rank holds "
               "%.3fM of the parameters)\n",
               R->grid.tp, R->grid.pp, R->grid.dp, R->ptens->name, (double)d->numel / 1e6);
}

/* ---- fp16 loss scaling (loss_scale.h): start, one step's outcome ---- */

static int start_loss_scale(run_t *R)
{
    const dt_fp16_settings_t *f = &R->set->fp16;
    R->ls_on = strcmp(dt_model_info(R->model)->dtype, "fp16") == 0;
    dt_loss_scale_cfg_t c = {.loss_scale = f->loss_scale,
                             .initial_power = f->initial_scale_power,
                             .window = f->loss_scale_window,
                             .hysteresis = f->hysteresis,
                             .min_scale = f->min_loss_scale};
    return R->ls_on ? dt_loss_scale_init(&R->ls, &c, R->set->config_path) : DT_OK;
}

/* After the strategy's step under loss scaling: whether the gradient
 * overflowed on ANY rank (the strategies' norms are global already; the
 * MAX makes it so for any strategy, and keeps every rank's scaler equal),
 * then the scaler's answer: a clean step, a skipped one (*skipped), or,
 * with the scale at its floor, the run's end naming the first non-finite
 * gradient, the rank and the step. */
static int loss_scale_step(run_t *R, int64_t step, const dt_step_result_t *sres, int *skipped)
{
    float any = sres->nonfinite ? 1.0f : 0.0f;
    int rc;
    if (R->world.size > 1 &&
        (rc = PLUGIN_CALL(R->pcomm,
                          dt_comm_ops(R->comm)->all_reduce(R->comm, &any, &any, 1, DT_F32,
                                                           DT_OP_MAX, NULL, NULL),
                          "all_reduce of the overflow flag")))
        return rc;
    const double scale = R->ls.scale;
    dt_loss_scale_event_t ev = dt_loss_scale_update(&R->ls, any != 0.0f);
    *skipped = ev != DT_LS_CLEAN;
    if (ev == DT_LS_SKIP && R->world.rank == 0)
        dt_log(DT_LOG_WARN, "train", "step %lld: gradient overflowed at loss scale %g: step "
               "skipped, scale now %g", (long long)step, scale, R->ls.scale);
    if (ev != DT_LS_FATAL)
        return DT_OK;
    char what[1024] = "";
    /* a fresh step's gradients (zeroed by begin_step), the overflowing
     * micro-batch again; every rank, as its hooks are collective (under a
     * pipeline the step's micro-batches through the schedule, each stage
     * searching its own units) */
    if (R->stage.plugin) {
        if (dt_stage_find_nonfinite_grad(&R->stage, step, scale, what, sizeof what))
            snprintf(what, sizeof what, "unknown (the search failed: %s)", dt_last_error());
    } else if ((rc = PLUGIN_CALL(R->pstrat, dt_strategy_ops(R->strat)->begin_step(R->strat, step),
                                 "begin_step"))) {
        snprintf(what, sizeof what, "unknown (the search failed: %s)", dt_last_error());
    } else if (!dt_model_find_nonfinite_grad(R->model, &R->ctx, R->inputs, R->targets,
                                             (float)(scale / (double)R->set->train.grad_accum),
                                             what, sizeof what)) {
        /* the search's reductions end in a step, as every step's do (lr 0;
         * the run stops here, nothing is saved) */
        dt_step_args_t sa = {.struct_size = sizeof sa, .step = step, .loss_scale = (float)scale};
        dt_step_result_t sr = {.struct_size = sizeof sr};
        dt_strategy_ops(R->strat)->step(R->strat, &sa, &sr);
    }
    return dt_err_set(DT_ERR_NUMERIC,
                      "step %lld, rank %d: the gradient overflowed at loss scale %g, %s, so it "
                      "cannot be lowered (%lld steps skipped before); first non-finite tensor: "
                      "%s; the last checkpoint is intact",
                      (long long)step, R->world.rank, scale,
                      R->ls.cfg.loss_scale > 0 ? "the static [fp16] loss_scale"
                                               : "[fp16] min_loss_scale",
                      (long long)R->ls.skipped, what);
}

/* ---- one step ---- */

#ifdef DTRAIN_TEST_HOOKS
/* DTRAIN_FAULT_HOST_READS_DEVICE=STEP (test builds only): as step STEP
 * starts, the core reads the model's logits, device memory, straight from
 * the host, which a GPU forbids; [cpu] guard_memory must turn that into a
 * SIGSEGV (tests/integration/test_guard_memory.sh). */
static void fault_host_reads_device(const run_t *R, int64_t step)
{
    const char *v = getenv("DTRAIN_FAULT_HOST_READS_DEVICE");
    const volatile unsigned char *logits = dt_model_logits(R->model);
    if (v && atoll(v) == step && logits)
        fprintf(stderr, "test hook: the host reads device memory: %u\n", logits[0]);
}
#endif

/* The device's memory peaks.  The communicator's symmetric memory
 * (comm.h: the strategy's gradients, where it offers some) is the host
 * memory a host-visible device computes in: counted as the device's, by
 * its tag. */
static void device_mem_stats(run_t *R, dt_mem_stats_t *ms)
{
    *ms = (dt_mem_stats_t){.struct_size = sizeof(dt_mem_stats_t)};
    dt_device_ops(R->dev)->mem_stats(R->dev, ms);
    /* on a device whose memory is host memory, the strategy's buffers the
     * communicator maps as symmetric memory (under the strategy's tags,
     * as its plan counts them); not the communicator's own working
     * buffers (tcp's ring scratch), which are its host memory, on the
     * host memory line by plugin, and in no strategy's plan */
    const dt_plugin_t *pc = R->r->plugin[DT_ROLE_COMM];
    dt_mem_stats_t cs = {.struct_size = sizeof(dt_mem_stats_t)};
    if (!R->props.host_visible || !pc || dt_plugin_host_accounted_stats(pc, &cs) != DT_OK)
        return;
    for (int t = 0; t < DT_TAG_COUNT && t < (int)ms->n_tags; t++) {
        ms->peak[t] += dt_tag_bytes(cs.peak, cs.n_tags, t);
        ms->current[t] += dt_tag_bytes(cs.current, cs.n_tags, t);
    }
    ms->total_peak += cs.total_peak;
    ms->total_current += cs.total_current;
}

/* The micro-batches of `step`, the loss over the global batch, and the
 * strategy's optimizer step; a non-finite loss or gradient stops the run
 * naming the first non-finite tensor. */
static int train_step(run_t *R, int64_t step, step_report_t *rep)
{
    const dt_train_settings_t *t = &R->set->train;
    const uint32_t accum = (uint32_t)t->grad_accum;
    double t0 = now_s();
    memset(rep, 0, sizeof *rep);
    rep->step = step;
    rep->eval_loss = NAN;
    rep->lr = dt_lr_at(step, t->steps, t->warmup_steps, t->lr, t->min_lr, t->decay);
    dt_crash_set_phase("training", step);
#ifdef DTRAIN_TEST_HOOKS
    fault_host_reads_device(R, step);
#endif
    int rc =
        PLUGIN_CALL(R->pstrat, dt_strategy_ops(R->strat)->begin_step(R->strat, step), "begin_step");
    if (rc)
        return rc;
    double loss_sum = 0;
    rep->loss_scale = R->ls_on ? R->ls.scale : 0; /* fp16: what the loss carries */
    const float micro_scale = (float)((R->ls_on ? R->ls.scale : 1.0) / (double)accum);
    if (R->stage.plugin) {
        if ((rc = dt_stage_pass(&R->stage, step, accum, micro_scale, 0, &rep->loss)))
            return rc;
    }
    for (uint32_t m = 0; m < accum && !R->stage.plugin; m++) {
        dt_crash_set_micro(m);
#ifdef DTRAIN_TEST_HOOKS
        dt_fault_kill_at_backward(step, m); /* the whole model: as the micro-batch starts */
#endif
        if ((rc = dt_sampler_fill(R->sampler, (uint64_t)(step - 1), m, (uint32_t)R->dp_rank,
                                  (uint32_t)R->dp, R->inputs, R->targets)))
            return rc;
        double loss;
        rc = dt_model_step_micro(R->model, &R->ctx, R->inputs, R->targets, m, accum, 0,
                                 micro_scale, &loss);
        if (rc)
            return dt_err_context(rc, "step %lld, micro-batch %u", (long long)step, m);
        loss_sum += loss;
    }
    /* The loss reported is the mean over the whole global batch.  It is
     * reduced before the strategy's step, where the ranks meet anyway (the
     * gradients' reductions), not after it: a strategy may finish its step
     * at different times on different ranks (ddp's staggered update), and a
     * collective there would make them wait for each other. */
    double loss_local = loss_sum / (double)accum;
    float lbuf = (float)loss_local;
    if (!R->stage.plugin && R->dp > 1 &&
        (rc = PLUGIN_CALL(R->pcomm,
                          dt_comm_ops(R->comm)->all_reduce(R->comm, &lbuf, &lbuf, 1, DT_F32,
                                                           DT_OP_AVG, NULL, NULL),
                          "all_reduce of the loss")))
        return rc;
    if (!R->stage.plugin)
        rep->loss = R->dp > 1 ? (double)lbuf : loss_local;
    dt_step_args_t sargs = {.struct_size = sizeof(dt_step_args_t), .step = step,
                            .lr = (float)rep->lr, .clip = (float)t->gradient_clipping,
                            .loss_scale = (float)rep->loss_scale};
    dt_step_result_t sres = {.struct_size = sizeof(dt_step_result_t)};
    dt_crash_set_phase("optimizer step", step);
    if ((rc = PLUGIN_CALL(R->pstrat, dt_strategy_ops(R->strat)->step(R->strat, &sargs, &sres),
                          "step")))
        return rc;
    rep->grad_norm = sres.grad_norm;
    if (R->ls_on && isfinite(rep->loss) &&
        (rc = loss_scale_step(R, step, &sres, &rep->skipped)))
        return rc;
    if (!isfinite(rep->loss) || (sres.nonfinite && !rep->skipped)) {
        char what[1024] = "";
        /* every rank: under a sharding strategy the forward's hooks are
         * collective (the loss and the norm agree across ranks); under a
         * pipeline the stages search their own units through the schedule */
        if (!R->stage.plugin)
            dt_model_find_nonfinite(R->model, &R->ctx, R->inputs, R->targets, what,
                                    sizeof what);
        else if (dt_stage_find_nonfinite(&R->stage, step, what, sizeof what))
            snprintf(what, sizeof what, "unknown (the search failed: %s)", dt_last_error());
        return dt_err_set(DT_ERR_NUMERIC,
                          "step %lld: %s is non-finite (loss %g, grad norm %g); first "
                          "non-finite tensor: %s; the last checkpoint is intact",
                          (long long)step, isfinite(rep->loss) ? "the gradient" : "the loss",
                          rep->loss, sres.grad_norm, what);
    }
    rep->step_s = now_s() - t0;
    rep->tokens_per_s = (double)(t->global_batch * t->seq_len) / rep->step_s;
    /* against the peak of the type the products run in: bf16 activations
     * multiply in bf16, f32 ones in f32 (a device that runs them on TF32
     * tensor cores says so in peak_flops_f32) */
    const double peak = dt_model_act_dtype(R->model) == DT_BF16 ? R->props.peak_flops_bf16
                                                                : R->props.peak_flops_f32;
    rep->mfu = peak > 0 ? rep->tokens_per_s * R->flops_per_token / ((double)R->world.size * peak)
                        : 0;
    dt_mem_stats_t ms;
    device_mem_stats(R, &ms);
    rep->mem_now = ms.total_current;
    return DT_OK;
}

/* The validation loss, averaged over the ranks, every eval_every steps and
 * at the last one (when there is validation data).  It covers the same
 * sequences at every world size: the first eval_steps global batches of
 * the file (fewer when it is shorter), each rank taking its share of each
 * in micro-batches, like a training step; so the same weights give the
 * same loss on 1 rank or N (up to the order of the reduction). */
static int evaluate_batches(run_t *R, int64_t step, uint64_t global, double *eval_loss);

static int evaluate(run_t *R, int64_t step, double *eval_loss)
{
    const dt_train_settings_t *t = &R->set->train;
    if (!R->val || t->eval_every <= 0 || (step % t->eval_every != 0 && step != t->steps))
        return DT_OK;
    uint64_t global = dt_data_eval_batches(R->val, (uint32_t)t->seq_len,
                                           (uint32_t)t->global_batch, 1);
    if (global > (uint64_t)t->eval_steps)
        global = (uint64_t)t->eval_steps;
    return evaluate_batches(R, step, global, eval_loss);
}

/* The validation loss over the first `global` global batches of data.val:
 * a run's evaluation, and `dtrain eval`'s. */
static int evaluate_batches(run_t *R, int64_t step, uint64_t global, double *eval_loss)
{
    const dt_train_settings_t *t = &R->set->train;
    /* micro x dp sequences per round, grad_accum rounds per global batch */
    uint64_t nb = global * (uint64_t)t->grad_accum;
    double es = 0;
    int rc;
    dt_crash_set_phase("evaluation", step);
    if (R->stage.plugin) /* the validation batches' forwards through the schedule */
        return dt_stage_pass(&R->stage, step, (uint32_t)nb, 1.0f, 1, eval_loss);
    for (uint64_t b = 0; b < nb; b++) {
        double l;
        dt_crash_set_micro((int64_t)b);
        if ((rc = dt_data_eval_fill(R->val, (uint32_t)t->seq_len, (uint32_t)t->micro_batch, b,
                                    (uint32_t)R->dp_rank, (uint32_t)R->dp, R->inputs,
                                    R->targets)) ||
            (rc = dt_model_step_micro(R->model, &R->ctx, R->inputs, R->targets, 0, 1, 1, 1.0f,
                                      &l)))
            return rc;
        es += l;
    }
    float ebuf = nb ? (float)(es / (double)nb) : NAN;
    if (R->dp > 1 && (rc = dt_comm_ops(R->comm)->all_reduce(R->comm, &ebuf, &ebuf, 1, DT_F32,
                                                            DT_OP_AVG, NULL, NULL)))
        return rc;
    *eval_loss = ebuf;
    return DT_OK;
}

/* Append to the metrics file; the first failure is kept for
 * metrics_line_end. */
static void DT_PRINTF(2, 3) metrics_printf(run_t *R, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (vfprintf(R->metrics, fmt, ap) < 0 && !R->metrics_errno)
        R->metrics_errno = errno ? errno : EIO;
    va_end(ap);
}

/* A line of the metrics file is complete: flushed, so a reader (or a
 * crash) sees whole lines, and any failed write since the last line is
 * the run's error (a full disk, /dev/full), naming the file. */
static int metrics_line_end(run_t *R)
{
    if (fflush(R->metrics) != 0 && !R->metrics_errno)
        R->metrics_errno = errno ? errno : EIO;
    if (!R->metrics_errno)
        return DT_OK;
    return dt_err_set(DT_ERR_IO, "writing metrics file '%s': %s", R->metrics_path,
                      strerror(R->metrics_errno));
}

/* The metrics line's pipeline fields of the last training pass: per
 * stage, its receive-wait and schedule seconds and its idle fraction. */
static void metrics_pipeline(run_t *R)
{
    const dt_stage_t *S = &R->stage;
    const int32_t pp = R->grid.pp;
    const double *wait = S->red + 1, *wall = S->red + 1 + pp;
    static const char *const key[] = {"recv_wait_s", "schedule_s", "pipeline_idle"};
    for (int k = 0; k < 3; k++) {
        metrics_printf(R, ", \"%s\": [", key[k]);
        for (int32_t s = 0; s < pp; s++)
            metrics_printf(R, "%s%.6g", s ? ", " : "",
                           k == 0   ? wait[s]
                           : k == 1 ? wall[s]
                                    : dt_stage_idle_fraction(wall[s] - wait[s], S->step_span));
        metrics_printf(R, "]");
    }
}

/* "1:02:03" (h:mm:ss) into buf[cap]. */
static void format_hms(double s, char *buf, size_t cap)
{
    long long t = s > 0 && s < 1e12 ? (long long)(s + 0.5) : 0;
    snprintf(buf, cap, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
}

/* The step this run ends at: train.stop_at when it comes first. */
static int64_t end_step(const run_t *R)
{
    const dt_train_settings_t *t = &R->set->train;
    return t->stop_at > 0 && t->stop_at < t->steps ? t->stop_at : t->steps;
}

/* The log line's " | elapsed 0:00:12 | eta 0:01:05": wall time since this
 * run's first step (evaluations and checkpoints included), and the steps
 * left to its end at the mean pace so far. */
static void print_progress(const run_t *R, int64_t step)
{
    char el[32], eta[32];
    double elapsed = now_s() - R->loop_start;
    double left = (double)(end_step(R) - step);
    format_hms(elapsed, el, sizeof el);
    format_hms(left > 0 ? elapsed / (double)(step - R->start_step) * left : 0, eta, sizeof eta);
    printf(" | elapsed %s | eta %s", el, eta);
}

/* Rank 0's log line (every log_every steps, the first and the last) and
 * the step's line in the metrics file. */
static int report_step(run_t *R, const step_report_t *rep)
{
    const int64_t step = rep->step, steps = R->set->train.steps;
    R->last_step = step;
    R->last_loss = rep->loss;
    if (!isnan(rep->eval_loss)) {
        R->last_val = rep->eval_loss;
        R->last_val_step = step;
    }
    if (R->world.rank == 0 && (step % R->set->run.log_every == 0 || step == steps || step == 1)) {
        /* an fp16 step skipped on overflow has no norm ("null" in the
         * metrics file): "n/a", not printf's "-nan" */
        char norm[32] = "n/a";
        if (isfinite(rep->grad_norm))
            snprintf(norm, sizeof norm, "%.3f", rep->grad_norm);
        printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %s | %.0f tok/s | %.1f ms | "
               "mfu %.1f%% | mem %.1f MiB",
               (long long)step, (long long)steps, rep->loss, rep->lr, norm,
               rep->tokens_per_s, rep->step_s * 1e3, rep->mfu * 100, mib(rep->mem_now));
        print_progress(R, step);
        if (!isnan(rep->eval_loss))
            printf(" | val %.4f", rep->eval_loss);
        if (R->ls_on)
            printf(" | scale %g%s | skipped %lld", rep->loss_scale,
                   rep->skipped ? " (overflow, step skipped)" : "", (long long)R->ls.skipped);
        printf("\n");
        fflush(stdout);
    }
    if (!R->metrics)
        return DT_OK;
    metrics_printf(R, "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, ", (long long)step,
                   rep->loss, rep->lr);
    if (isfinite(rep->grad_norm)) /* an fp16 step skipped on overflow: null */
        metrics_printf(R, "\"grad_norm\": %.9g, ", rep->grad_norm);
    else
        metrics_printf(R, "\"grad_norm\": null, ");
    metrics_printf(R, "\"tokens_per_s\": %.6g, \"step_ms\": %.6g, \"mfu\": %.6g",
                   rep->tokens_per_s, rep->step_s * 1e3, rep->mfu);
    if (!isnan(rep->eval_loss))
        metrics_printf(R, ", \"val_loss\": %.9g", rep->eval_loss);
    if (R->ls_on)
        metrics_printf(R, ", \"loss_scale\": %.9g, \"skipped\": %s, \"skipped_steps\": %lld",
                       rep->loss_scale, rep->skipped ? "true" : "false",
                       (long long)R->ls.skipped);
    if (R->stage.plugin)
        metrics_pipeline(R);
    metrics_printf(R, "}\n");
    return metrics_line_end(R);
}

/* A checkpoint every checkpoint.every steps, at the last step and at
 * train.stop_at (then *stop).  With checkpoint.async the periodic ones
 * are written by threads while the next steps train, moved on at each
 * step boundary where every rank's thread is done (dt_ckpt_save_advance)
 * and finished at the latest before the next save (the last step's and
 * stop_at's are written at once: nothing trains after). */
static int checkpoint(run_t *R, int64_t step, int *stop)
{
    const dt_settings_t *set = R->set;
    *stop = set->train.stop_at > 0 && step >= set->train.stop_at;
    int last = step == set->train.steps || *stop;
    int due = (set->checkpoint.every > 0 && step % set->checkpoint.every == 0) || last;
    if (R->pending) {
        dt_crash_set_phase("checkpoint commit", step);
        int rc;
        if (due) {
            rc = dt_ckpt_save_finish(R->pending);
            R->pending = NULL;
        } else {
            rc = dt_ckpt_save_advance(&R->pending);
        }
        if (rc)
            return rc;
    }
    if (!due)
        return DT_OK;
    dt_crash_set_phase("checkpoint save", step);
    cJSON *loop = R->ls_on ? cJSON_CreateObject() : NULL; /* the loss scaler's state */
    if (R->ls_on && (!loop || dt_loss_scale_save(&R->ls, loop))) {
        cJSON_Delete(loop);
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    }
    int rc = set->checkpoint.async_ && !last
                 ? dt_ckpt_save_async(&R->world, set, dt_config_hash(R->r->cfg), R->comm, R->strat,
                                      R->model, step, loop, &R->pending)
                 : dt_ckpt_save(&R->world, set, dt_config_hash(R->r->cfg), R->comm, R->strat,
                                R->model, step, loop);
    cJSON_Delete(loop);
    return rc;
}

/* The header line, then every step from the one after a resumed
 * checkpoint; ends early at train.stop_at. */
static int train_steps(run_t *R)
{
    print_header(R);
    R->loop_start = now_s();
    R->last_step = R->start_step;
    for (int64_t step = R->start_step + 1; step <= R->set->train.steps; step++) {
        step_report_t rep;
        int stop = 0, rc;
        if ((rc = train_step(R, step, &rep)) || (rc = evaluate(R, step, &rep.eval_loss)))
            return rc;
        if ((rc = report_step(R, &rep)) || (rc = checkpoint(R, step, &stop)) || stop)
            return rc;
    }
    return DT_OK;
}

/* ---- end: measured peaks beside the strategy's plan ---- */

/* Host memory each plugin allocated through its host table, by tag (its
 * peaks since it was loaded): rank 0's line names the plugins that used
 * any, the metrics file has every plugin and tag. */
static int report_host_memory(run_t *R)
{
    dt_mem_stats_t st[DT_ROLE_COUNT];
    const dt_plugin_t *p[DT_ROLE_COUNT];
    int n = 0;
    for (int role = 0; role < DT_ROLE_COUNT; role++) {
        const dt_plugin_t *q = R->r->plugin[role];
        st[n] = (dt_mem_stats_t){.struct_size = sizeof(dt_mem_stats_t)};
        if (q && dt_plugin_host_mem_stats(q, &st[n]) == DT_OK)
            p[n++] = q;
    }
    if (R->world.rank == 0) {
        int shown = 0;
        printf("host memory (rank %d, peak MiB by plugin):", R->world.rank);
        for (int i = 0; i < n; i++) {
            if (!st[i].total_peak)
                continue;
            printf("%s %s/%s %.3f (", shown++ ? ";" : "", dt_kind_name(p[i]->kind),
                   p[i]->name, mib(st[i].total_peak));
            for (int t = 0, k = 0; t < DT_TAG_COUNT; t++) {
                uint64_t b = dt_tag_bytes(st[i].peak, st[i].n_tags, t);
                if (b)
                    printf("%s%s %.3f", k++ ? ", " : "", dt_mem_tag_name(t), mib(b));
            }
            printf(")");
        }
        printf("%s\n", shown ? "" : " none");
    }
    if (!R->metrics)
        return DT_OK;
    metrics_printf(R, "{\"host_memory\": {\"rank\": %d, \"peak_bytes\": {", R->world.rank);
    for (int i = 0; i < n; i++) {
        metrics_printf(R, "%s\"%s/%s\": {", i ? ", " : "", dt_kind_name(p[i]->kind),
                       p[i]->name);
        for (int t = 0; t < DT_TAG_COUNT; t++)
            metrics_printf(R, "%s\"%s\": %llu", t ? ", " : "", dt_mem_tag_name(t),
                           (unsigned long long)dt_tag_bytes(st[i].peak, st[i].n_tags, t));
        metrics_printf(R, ", \"total\": %llu}", (unsigned long long)st[i].total_peak);
    }
    metrics_printf(R, "}}}\n");
    return metrics_line_end(R);
}

static int report_memory(run_t *R)
{
    dt_mem_stats_t ms;
    device_mem_stats(R, &ms);
    dt_estimate_t plan = {.struct_size = sizeof(dt_estimate_t)};
    /* a pipeline stage's rank holds its units only: plan those */
    const dt_stage_t *S = &R->stage;
    int rc = S->plugin ? dt_plan_stage(R->pstrat, R->model, R->set, (int)R->dp,
                                      strcmp(R->set->parallel.offload, "none") != 0,
                                      S->n_chunks, S->chunk_first, S->chunk_end, S->n_slots,
                                      S->n_boundary * dt_model_boundary_count(R->model) *
                                          dt_dtype_size(dt_model_act_dtype(R->model)),
                                      &plan)
                      : dt_plan_strategy(R->pstrat, R->model, R->set, (int)R->dp, &plan);
    if (rc)
        return rc;
    uint64_t peak[DT_TAG_COUNT], planned[DT_TAG_COUNT], plan_total = 0;
    for (int t = 0; t < DT_TAG_COUNT; t++) {
        peak[t] = dt_tag_bytes(ms.peak, ms.n_tags, t);
        planned[t] = dt_tag_bytes(plan.bytes, plan.n_tags, t);
        plan_total += planned[t];
    }
    /* ---- offload tier: the plan's offload tag is the tier's
     * bytes, measured by the tier (not device memory: not in the total) */
    if (R->poff) {
        uint64_t total = 0, held = 0;
        if ((rc = PLUGIN_CALL(R->poff, dt_offload_ops(R->off)->capacity(R->off, &total, &held),
                              "capacity")))
            return rc;
        peak[DT_TAG_OFFLOAD] = held;
        plan_total -= planned[DT_TAG_OFFLOAD];
    }
    /* ---- end offload tier ---- */
    if (R->world.rank == 0) {
        printf("memory (rank %d, peak MiB measured / planned):", R->world.rank);
        for (int t = 0; t < DT_TAG_COUNT; t++)
            printf(" %s %.2f / %.2f%s", dt_mem_tag_name(t), mib(peak[t]), mib(planned[t]),
                   t + 1 < DT_TAG_COUNT ? "," : "");
        printf("; total %.2f / %.2f\n", mib(ms.total_peak), mib(plan_total));
    }
    if (R->metrics) {
        metrics_printf(R, "{\"memory\": {\"rank\": %d, \"peak_bytes\": {", R->world.rank);
        for (int t = 0; t < DT_TAG_COUNT; t++)
            metrics_printf(R, "%s\"%s\": %llu", t ? ", " : "", dt_mem_tag_name(t),
                           (unsigned long long)peak[t]);
        metrics_printf(R, "}, \"planned_bytes\": {");
        for (int t = 0; t < DT_TAG_COUNT; t++)
            metrics_printf(R, "%s\"%s\": %llu", t ? ", " : "", dt_mem_tag_name(t),
                           (unsigned long long)planned[t]);
        metrics_printf(R, "}, \"total_peak_bytes\": %llu, \"planned_total_bytes\": %llu}}\n",
                       (unsigned long long)ms.total_peak, (unsigned long long)plan_total);
        if ((rc = metrics_line_end(R)))
            return rc;
    }
    /* ---- offload tier: the bytes it holds (its own count:
     * pinned memory or files), and the pinned staging beside it ---- */
    if (R->poff) {
        uint64_t total = 0, tier = 0;
        if ((rc = PLUGIN_CALL(R->poff, dt_offload_ops(R->off)->capacity(R->off, &total, &tier),
                              "capacity")))
            return rc;
        uint64_t stage = dt_tag_bytes(ms.pinned_peak, ms.n_tags, DT_TAG_STAGING);
        if (R->world.rank == 0)
            printf("offload tier (rank %d, MiB held): %s %.2f, pinned staging peak %.2f\n",
                   R->world.rank, R->poff->name, mib(tier), mib(stage));
        if (R->metrics) {
            metrics_printf(R, "{\"offload_tier\": {\"rank\": %d, \"plugin\": \"%s\", "
                           "\"held_bytes\": %llu, \"staging_peak_bytes\": %llu}}\n",
                           R->world.rank, R->poff->name, (unsigned long long)tier,
                           (unsigned long long)stage);
            if ((rc = metrics_line_end(R)))
                return rc;
        }
    }
    /* ---- end offload tier ---- */
    return report_host_memory(R);
}

/* Rank 0's last line: what the run did, "summary: 8 steps (1-8 of 8),
 * 16384 tokens in 3.20 s (5120 tok/s); final loss 4.1234, val 4.2345 (step
 * 8); peak device memory 12.34 MiB (rank 0)"; the time is the steps' wall
 * time, evaluations and checkpoints included. */
static int print_summary(run_t *R)
{
    const dt_train_settings_t *t = &R->set->train;
    if (R->world.rank != 0)
        return DT_OK;
    int64_t n = R->last_step - R->start_step;
    double secs = n > 0 ? now_s() - R->loop_start : 0;
    double tokens = (double)n * (double)t->global_batch * (double)t->seq_len;
    dt_mem_stats_t ms;
    device_mem_stats(R, &ms);
    char range[96], val[64] = "";
    if (n > 0)
        snprintf(range, sizeof range, " (%lld-%lld of %lld%s)", (long long)R->start_step + 1,
                 (long long)R->last_step, (long long)t->steps,
                 R->last_step < t->steps ? ", stopped at train.stop_at" : "");
    else
        snprintf(range, sizeof range, " (the checkpoint is at step %lld of %lld)",
                 (long long)R->start_step, (long long)t->steps);
    if (!isnan(R->last_val))
        snprintf(val, sizeof val, ", val %.4f (step %lld)", R->last_val,
                 (long long)R->last_val_step);
    printf("summary: %lld step%s%s, %.0f tokens in %.2f s (%.0f tok/s); final loss ",
           (long long)n, n == 1 ? "" : "s", range, tokens, secs, secs > 0 ? tokens / secs : 0.0);
    if (n > 0)
        printf("%.4f%s", R->last_loss, val);
    else
        printf("-");
    printf("; peak device memory %.2f MiB (rank 0)\n", mib(ms.total_peak));
    const dt_stage_t *S = &R->stage;
    if (S->plugin && n > 0 && S->span > 0) { /* the pipeline's measured bubble */
        printf("pipeline: idle fraction per stage over %lld step%s (of the slowest stage's "
               "%.3f s in the schedule; receive wait in s):",
               (long long)n, n == 1 ? "" : "s", S->span);
        for (int32_t s = 0; s < R->grid.pp; s++)
            printf("%s stage %d %.3f (%.3f)", s ? "," : "", (int)s,
                   dt_stage_idle_fraction(S->busy[s], S->span), S->wait[s]);
        printf("\n");
    }
    fflush(stdout);
    return DT_OK;
}

/* The model the config describes, on no device yet. */
static int create_model(run_t *R)
{
    /* under tensor parallelism, this rank's part of it, the sequence
     * split when the scheme splits it */
    int rc = dt_model_create_part(R->r->cfg, R->pdev->ops, dt_resolved_model(R->r),
                                  R->grid.tp ? R->grid.tp : 1, R->grid.tp_rank, &R->model);
    return rc ? rc
              : dt_model_set_sequence(R->model, dt_resolved_tensor(R->r),
                                      dt_resolved_tensor_name(R->r));
}

/* A run, in order; each stage runs only when every earlier one succeeded. */
static int (*const stages[])(run_t *) = {
    start_plugins, create_model, start_loss_scale, resolve_batch, open_data, init_strategy,
    claim_checkpoints, load_state, open_metrics, train_steps, report_memory, print_summary,
};

/* ---- `dtrain eval`: the checkpoint's state, one evaluation ---- */

/* One evaluation of data.val after load_state, and rank 0's line. */
static int eval_once(run_t *R)
{
    const dt_train_settings_t *t = &R->set->train;
    const int64_t want = R->opts->eval_batches;
    uint64_t global = dt_data_eval_batches(R->val, (uint32_t)t->seq_len,
                                           (uint32_t)t->global_batch, 1);
    if (want > 0 && (uint64_t)want > global)
        return dt_err_set(DT_ERR_CONFIG,
                          "--batches %lld: '%s' holds %llu whole batch%s of %lld sequences "
                          "of %lld tokens",
                          (long long)want, R->set->data.val, (unsigned long long)global,
                          global == 1 ? "" : "es", (long long)t->global_batch,
                          (long long)t->seq_len);
    if (want > 0)
        global = (uint64_t)want;
    double loss = NAN;
    int rc = evaluate_batches(R, R->start_step, global, &loss);
    if (rc)
        return rc;
    if (R->opts->eval_loss)
        *R->opts->eval_loss = loss;
    if (R->world.rank == 0) {
        printf("eval: %s step %lld: %llu batch%s of %lld x %lld tokens of '%s': loss %.9g, "
               "perplexity %.9g\n",
               R->set->checkpoint.resume, (long long)R->start_step, (unsigned long long)global,
               global == 1 ? "" : "es", (long long)t->global_batch, (long long)t->seq_len,
               R->set->data.val, loss, exp(loss));
        fflush(stdout);
    }
    return DT_OK;
}

/* load_state without the notes a resumed run prints (the data order and
 * the learning-rate schedule it continues with: an evaluation has
 * neither): dt_ckpt_init_or_resume prints them on rank 0 only, and reads
 * nothing else from the world. */
static int eval_load_state(run_t *R)
{
    dt_world_t quiet = R->world;
    quiet.rank = -1;
    cJSON *loop = NULL;
    int rc = dt_ckpt_init_or_resume(&quiet, R->set, R->strat, R->model,
                                    &R->start_step, &loop);
    cJSON_Delete(loop);
    return rc ? rc : PLUGIN_CALL(R->pstrat, dt_strategy_ops(R->strat)->state_loaded(R->strat),
                                 "state_loaded");
}

/* The resume an evaluation needs (dtrain eval sets it). */
static int eval_needs_resume(run_t *R)
{
    if (!R->set->checkpoint.resume[0])
        return dt_err_set(DT_ERR_CONFIG, "%s: evaluation needs [checkpoint] resume",
                          R->set->config_path);
    return DT_OK;
}

/* An evaluation, in order: a run's start without its train data, sampler
 * and checkpoint folder claim (nothing is written), then eval_once. */
static int (*const eval_stages[])(run_t *) = {
    eval_needs_resume, start_plugins, create_model, start_loss_scale, resolve_batch,
    open_data, init_strategy, eval_load_state, eval_once,
};

int dt_train(dt_resolved_t *r, const dt_train_opts_t *opts)
{
    run_t R;
    memset(&R, 0, sizeof R);
    R.r = r;
    R.set = &r->set;
    R.ckpt_lock = -1;
    R.last_loss = R.last_val = NAN;
    R.metrics_path = opts && opts->metrics_path ? opts->metrics_path : r->set.run.metrics;
    R.opts = opts;
    int rc = DT_OK;
    if (opts && opts->eval_only) {
        for (size_t i = 0; i < sizeof eval_stages / sizeof eval_stages[0] && rc == DT_OK; i++)
            rc = eval_stages[i](&R);
    } else {
        rc = dt_setup_output_dir(&r->set);
        for (size_t i = 0; i < sizeof stages / sizeof stages[0] && rc == DT_OK; i++)
            rc = stages[i](&R);
    }
    /* Teardown drops what a failed step left in flight (the strategy's
     * finalize drains its requests with timeout 0, and a communicator
     * reports each one it drops); those reports must not replace the
     * failure the run returns. */
    char failure[DT_ERR_MAX];
    snprintf(failure, sizeof failure, "%s", rc != DT_OK ? dt_last_error() : "");
    run_free(&R);
    if (rc != DT_OK && failure[0])
        dt_err_set(rc, "%s", failure);
    return rc;
}
