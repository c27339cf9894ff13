/*
 * core/train/train.c - the training loop.
 *
 * Knows the four interfaces, not their implementations: whatever device,
 * communicator and strategy the config names are driven the same way.
 */
#include "train/train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "train/consistency.h"
#include "data/data.h"
#include "util/fileutil.h"
#include "model/model.h"
#include "train/plan.h"
#include "launch/world.h"
#include "util/log.h"
#include "util/error.h"

double dt_lr_at(int64_t step, int64_t steps, int64_t warmup, double lr, double min_lr,
                dt_lr_decay_t decay)
{
    if (warmup > 0 && step <= warmup)
        return lr * (double)step / (double)warmup;
    if (decay == DT_DECAY_CONSTANT || steps <= warmup)
        return lr;
    double p = (double)(step - warmup) / (double)(steps - warmup);
    if (p > 1)
        p = 1;
    if (decay == DT_DECAY_LINEAR)
        return lr - (lr - min_lr) * p;
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + cos(M_PI * p));
}

int dt_batch_resolve(const char *cfg_path, int64_t micro, int64_t *accum, int64_t *global,
                     int64_t dp)
{
    int64_t per = micro * dp;
    if (*accum == 0 && *global == 0) {
        *accum = 1;
        *global = per;
    } else if (*accum == 0) {
        if (*global % per != 0)
            return dt_err_set(DT_ERR_CONFIG,
                              "%s: [train] global_batch = %lld is not a multiple of "
                              "micro_batch (%lld) x data-parallel size (%lld) = %lld; the "
                              "number of accumulation steps would not be whole",
                              cfg_path, (long long)*global, (long long)micro, (long long)dp,
                              (long long)per);
        *accum = *global / per;
    } else if (*global == 0) {
        *global = per * *accum;
    } else if (per * *accum != *global) {
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: [train] micro_batch (%lld) x grad_accum (%lld) x data-parallel "
                          "size (%lld) = %lld, but global_batch = %lld; give any two and the "
                          "third is derived",
                          cfg_path, (long long)micro, (long long)*accum, (long long)dp,
                          (long long)(per * *accum), (long long)*global);
    }
    return DT_OK;
}

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
    dt_world_t world;
    const dt_device_ops_t *dev_ops;
    const dt_comm_ops_t *comm_ops;
    const dt_strategy_ops_t *strat_ops;
    dt_device_t *dev;
    dt_stream_t *stream;
    dt_comm_t *comm;
    dt_strategy_t *strat;
    dt_model_t *model;
    dt_dataset_t *train, *val;
    dt_sampler_t *sampler;
    int32_t *inputs, *targets;
    FILE *metrics;
} run_t;

static void run_free(run_t *R)
{
    dt_model_ctx_t ctx = {R->dev_ops, R->dev, R->stream, NULL, NULL, NULL};
    if (R->strat)
        R->strat_ops->finalize(R->strat);
    if (R->model)
        dt_model_free(R->model, R->dev ? &ctx : NULL);
    if (R->comm)
        R->comm_ops->finalize(R->comm);
    if (R->stream)
        R->dev_ops->stream_destroy(R->dev, R->stream);
    if (R->dev)
        R->dev_ops->finalize(R->dev);
    dt_sampler_free(R->sampler);
    dt_data_close(R->train);
    dt_data_close(R->val);
    free(R->inputs);
    free(R->targets);
    if (R->metrics)
        fclose(R->metrics);
}

static int plugin_rc(const dt_plugin_t *p, int rc, const char *what)
{
    return rc ? dt_plugin_failed(p, rc, what) : DT_OK;
}

/* Call into plugin `p`: the error buffer is cleared first, so a plugin
 * that fails without a message is reported as such, never with a stale
 * message from earlier. */
#define PLUGIN_CALL(p, call, what) (dt_err_clear(), plugin_rc((p), (call), (what)))

static int setup(run_t *R)
{
    dt_resolved_t *r = R->r;
    dt_config_t *cfg = r->cfg;
    dt_plugin_t *pdev = r->plugin[DT_ROLE_DEVICE], *pcomm = r->plugin[DT_ROLE_COMM],
                *pstrat = r->plugin[DT_ROLE_DATA];
    int rc;
    if (r->plugin[DT_ROLE_TENSOR] || r->plugin[DT_ROLE_PIPELINE] || r->plugin[DT_ROLE_OFFLOAD])
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: tensor/pipeline parallelism and offload tiers are not part of "
                          "this build's training loop yet (parallel.tensor = 1, "
                          "parallel.pipeline = 1, parallel.offload = \"none\")",
                          dt_config_path(cfg));
    R->dev_ops = pdev->ops;
    R->comm_ops = pcomm->ops;
    R->strat_ops = pstrat->ops;
    if ((rc = dt_world_from_env(&r->set.launch, &R->world)))
        return rc;
    dt_log_set_rank(R->world.rank);

    dt_device_init_t da = {.struct_size = sizeof da, .rank = R->world.rank,
                              .local_rank = R->world.local_rank,
                              .local_size = R->world.local_size, .device_index = -1};
    if ((rc = PLUGIN_CALL(pdev, R->dev_ops->init(pdev->host, &da, &R->dev), "init")))
        return rc;
    if ((rc = PLUGIN_CALL(pdev, R->dev_ops->stream_create(R->dev, &R->stream), "stream_create")))
        return rc;
    dt_comm_init_t ca = {.struct_size = sizeof ca, .rank = R->world.rank,
                            .size = R->world.size, .local_rank = R->world.local_rank,
                            .local_size = R->world.local_size, .job_id = R->world.job_id,
                            .master_addr = R->world.master_addr,
                            .master_port = R->world.master_port,
                            .timeout_ms = (int64_t)(r->set.launch.timeout_s * 1000.0),
                            .dev_ops = R->dev_ops, .dev = R->dev};
    if ((rc = PLUGIN_CALL(pcomm, R->comm_ops->init(pcomm->host, &ca, &R->comm), "init")))
        return rc;
    if ((rc = dt_consistency_check(&R->world, cfg, R->comm_ops, R->comm)))
        return rc;

    if ((rc = dt_model_create(cfg, &R->model)))
        return rc;

    return DT_OK;
}

int dt_train(dt_resolved_t *r, const dt_train_opts_t *opts)
{
    run_t R;
    memset(&R, 0, sizeof R);
    R.r = r;
    dt_config_t *cfg = r->cfg;
    const char *cpath = dt_config_path(cfg);
    int rc = setup(&R);
    if (rc)
        goto out;

    /* ---- the run's settings ---- */
    dt_settings_t *set = &r->set;
    const int64_t steps = set->train.steps, micro = set->train.micro_batch,
                  seq_len = set->train.seq_len, eval_every = set->train.eval_every,
                  eval_steps = set->train.eval_steps, log_every = set->run.log_every,
                  ckpt_every = set->checkpoint.every, stop_at = set->train.stop_at;
    int64_t accum = set->train.grad_accum, global = set->train.global_batch;
    const char *metrics_path = set->run.metrics;
    if (opts && opts->metrics_path)
        metrics_path = opts->metrics_path;
    const int64_t dp = R.world.size;
    if ((rc = dt_batch_resolve(cpath, micro, &accum, &global, dp)))
        goto out;
    /* derived values are part of the resolved config (its printout, its
     * hash, the checkpoint's record of the data order) */
    if ((rc = dt_config_set_int(cfg, "train.grad_accum", accum, DT_ORIGIN_DERIVED)) ||
        (rc = dt_config_set_int(cfg, "train.global_batch", global, DT_ORIGIN_DERIVED)))
        goto out;
    set->train.grad_accum = accum;
    set->train.global_batch = global;
    const dt_model_info_t *mi = dt_model_info(R.model);
    if (mi->context > 0 && seq_len > mi->context) {
        rc = dt_err_set(DT_ERR_CONFIG,
                        "%s: [train] seq_len = %lld is longer than the model's context "
                        "(model.context = %lld)",
                        cpath, (long long)seq_len, (long long)mi->context);
        goto out;
    }

    /* ---- data ---- */
    if (!set->data.train[0]) {
        rc = dt_err_set(DT_ERR_CONFIG, "%s: [data] train is empty: name a token file "
                                       "(make one with 'dtrain data prepare TEXT OUT')", cpath);
        goto out;
    }
    if ((rc = dt_data_open(set->data.train, &R.train)) ||
        (rc = dt_data_check_vocab(R.train, (uint32_t)mi->vocab_size)))
        goto out;
    if (set->data.val[0] && ((rc = dt_data_open(set->data.val, &R.val)) ||
                        (rc = dt_data_check_vocab(R.val, (uint32_t)mi->vocab_size))))
        goto out;
    if ((rc = dt_sampler_init(&R.sampler, R.train, (uint32_t)seq_len, (uint32_t)micro,
                              (uint32_t)global, (uint64_t)set->run.seed,
                              set->data.shuffle)))
        goto out;
    R.inputs = malloc((size_t)(micro * seq_len) * sizeof *R.inputs);
    R.targets = malloc((size_t)(micro * seq_len) * sizeof *R.targets);
    if (!R.inputs || !R.targets) {
        rc = dt_err_set(DT_ERR_NOMEM, "out of memory");
        goto out;
    }

    /* ---- strategy and parameters ---- */
    dt_strategy_init_t sa = {
        .struct_size = sizeof sa, .n_micro = (uint32_t)accum, .dev_ops = R.dev_ops,
        .dev = R.dev, .compute_stream = R.stream, .comm_ops = R.comm_ops, .comm = R.comm,
        .model = dt_model_desc(R.model)};
    const dt_optimizer_settings_t *os = &set->optimizer;
    const dt_optim_desc_t optim = {.struct_size = sizeof optim,
                                   .kind = os->type,
                                   .nesterov = os->nesterov,
                                   .beta1 = (float)os->beta1,
                                   .beta2 = (float)os->beta2,
                                   .eps = (float)os->eps,
                                   .momentum = (float)os->momentum,
                                   .weight_decay = (float)os->weight_decay};
    sa.optim = &optim;
    dt_plugin_t *pstrat = r->plugin[DT_ROLE_DATA];
    if ((rc = PLUGIN_CALL(pstrat, R.strat_ops->init(pstrat->host, &sa, &R.strat), "init")))
        goto out;
    dt_model_ctx_t ctx = {R.dev_ops, R.dev, R.stream, R.strat_ops, R.strat, pstrat->name};
    if ((rc = dt_model_alloc_acts(R.model, &ctx, micro, seq_len)))
        goto out;
    int64_t start_step = 0;
    if ((rc = dt_ckpt_init_or_resume(&R.world, set, R.strat_ops, R.strat, R.model,
                                     &start_step)))
        goto out;
    if ((rc = PLUGIN_CALL(pstrat, R.strat_ops->state_loaded(R.strat), "state_loaded")))
        goto out;

    if (metrics_path[0] && R.world.rank == 0) {
        char parent[4096];
        snprintf(parent, sizeof parent, "%s", metrics_path);
        char *slash = strrchr(parent, '/');
        if (slash && slash != parent) {
            *slash = '\0';
            if ((rc = dt_fileutil_mkdir_p(parent)))
                goto out;
        }
        R.metrics = fopen(metrics_path, start_step > 0 ? "a" : "w");
        if (!R.metrics) {
            rc = dt_err_set(DT_ERR_IO, "opening metrics file '%s': %s", metrics_path,
                            strerror(errno));
            goto out;
        }
    }
    dt_device_props_t props = {.struct_size = sizeof(dt_device_props_t)};
    R.dev_ops->props(R.dev, &props);
    const double flops_tok = dt_model_flops_per_token(R.model, seq_len);
    if (R.world.rank == 0)
        printf("dtrain: %s, %.2fM parameters (%u units), %lld steps of %lld sequences x %lld "
               "tokens (micro %lld x accum %lld x dp %lld); device %s; strategy %s\n",
               dt_model_desc(R.model)->arch, (double)dt_model_desc(R.model)->numel / 1e6,
               dt_model_desc(R.model)->n_units, (long long)steps, (long long)global,
               (long long)seq_len, (long long)micro, (long long)accum, (long long)dp,
               props.name, pstrat->name);

    /* ---- steps ---- */
    for (int64_t step = start_step + 1; step <= steps; step++) {
        double t0 = now_s();
        double lr_now = dt_lr_at(step, steps, set->train.warmup_steps, set->train.lr,
                                 set->train.min_lr, set->train.decay);
        if ((rc = PLUGIN_CALL(pstrat, R.strat_ops->begin_step(R.strat, step), "begin_step")))
            goto out;
        double loss_sum = 0;
        for (uint32_t m = 0; m < (uint32_t)accum; m++) {
            if ((rc = dt_sampler_fill(R.sampler, (uint64_t)(step - 1), m,
                                      (uint32_t)R.world.rank, (uint32_t)dp, R.inputs,
                                      R.targets)))
                goto out;
            double loss;
            rc = dt_model_step_micro(R.model, &ctx, R.inputs, R.targets, m, (uint32_t)accum, 0,
                                     1.0f / (float)accum, &loss);
            if (rc) {
                dt_err_context(rc, "step %lld, micro-batch %u", (long long)step, m);
                goto out;
            }
            loss_sum += loss;
        }
        /* The loss reported is the mean over the whole global batch.  It is
         * reduced before the strategy's step, where the ranks meet anyway
         * (the gradients' reductions), not after it: a strategy may finish
         * its step at different times on different ranks (ddp's staggered
         * update), and a collective there would make them wait for each
         * other. */
        double loss_local[1] = {loss_sum / (double)accum};
        float lbuf = (float)loss_local[0];
        if (dp > 1 && (rc = PLUGIN_CALL(r->plugin[DT_ROLE_COMM],
                                      R.comm_ops->all_reduce(R.comm, &lbuf, &lbuf, 1, DT_F32,
                                                             DT_OP_AVG, NULL, NULL),
                                      "all_reduce of the loss")))
            goto out;
        double loss = dp > 1 ? (double)lbuf : loss_local[0];
        dt_step_args_t sargs = {.struct_size = sizeof(dt_step_args_t),
                                   .step = step,
                                   .lr = (float)lr_now,
                                   .clip = (float)set->train.gradient_clipping};
        dt_step_result_t sres = {.struct_size = sizeof(dt_step_result_t)};
        if ((rc = PLUGIN_CALL(pstrat, R.strat_ops->step(R.strat, &sargs, &sres), "step")))
            goto out;
        if (!isfinite(loss) || sres.nonfinite) {
            char what[1024];
            /* every rank: under a sharding strategy the forward's hooks are
             * collective (the loss and the norm agree across ranks) */
            dt_model_find_nonfinite(R.model, &ctx, R.inputs, R.targets, what, sizeof what);
            rc = dt_err_set(DT_ERR_NUMERIC,
                            "step %lld: %s is non-finite (loss %g, grad norm %g); first "
                            "non-finite tensor: %s; the last checkpoint is intact",
                            (long long)step, isfinite(loss) ? "the gradient" : "the loss",
                            loss, sres.grad_norm, what);
            goto out;
        }
        double dt_s = now_s() - t0;
        double tok_s = (double)(global * seq_len) / dt_s;
        double mfu = props.peak_flops_f32 > 0
                         ? tok_s * flops_tok / ((double)dp * props.peak_flops_f32)
                         : 0;
        dt_mem_stats_t ms = {.struct_size = sizeof(dt_mem_stats_t)};
        R.dev_ops->mem_stats(R.dev, &ms);
        double eval_loss = NAN;
        if (R.val && eval_every > 0 && (step % eval_every == 0 || step == steps)) {
            uint64_t nb = dt_data_eval_batches(R.val, (uint32_t)seq_len, (uint32_t)micro,
                                               (uint32_t)dp);
            if (nb > (uint64_t)eval_steps)
                nb = (uint64_t)eval_steps;
            double es = 0;
            for (uint64_t b = 0; b < nb; b++) {
                double l;
                if ((rc = dt_data_eval_fill(R.val, (uint32_t)seq_len, (uint32_t)micro, b,
                                            (uint32_t)R.world.rank, (uint32_t)dp, R.inputs,
                                            R.targets)) ||
                    (rc = dt_model_step_micro(R.model, &ctx, R.inputs, R.targets, 0, 1, 1, 1.0f,
                                              &l)))
                    goto out;
                es += l;
            }
            float ebuf = nb ? (float)(es / (double)nb) : NAN;
            if (dp > 1 && (rc = R.comm_ops->all_reduce(R.comm, &ebuf, &ebuf, 1, DT_F32,
                                                       DT_OP_AVG, NULL, NULL)))
                goto out;
            eval_loss = ebuf;
        }
        if (R.world.rank == 0 && (step % log_every == 0 || step == steps || step == 1)) {
            printf("step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms | "
                   "mfu %.1f%% | mem %.1f MiB",
                   (long long)step, (long long)steps, loss, lr_now, sres.grad_norm, tok_s,
                   dt_s * 1e3, mfu * 100, mib(ms.total_current));
            if (!isnan(eval_loss))
                printf(" | val %.4f", eval_loss);
            printf("\n");
            fflush(stdout);
        }
        if (R.metrics) {
            fprintf(R.metrics,
                    "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
                    "\"tokens_per_s\": %.6g, \"step_ms\": %.6g, \"mfu\": %.6g",
                    (long long)step, loss, lr_now, sres.grad_norm, tok_s, dt_s * 1e3, mfu);
            if (!isnan(eval_loss))
                fprintf(R.metrics, ", \"val_loss\": %.9g", eval_loss);
            fprintf(R.metrics, "}\n");
            fflush(R.metrics);
        }
        int stop = stop_at > 0 && step >= stop_at;
        if ((ckpt_every > 0 && step % ckpt_every == 0) || step == steps || stop) {
            if ((rc = dt_ckpt_save(&R.world, set, dt_config_hash(cfg), R.comm_ops, R.comm,
                                   R.strat_ops, R.strat, R.model, step)))
                goto out;
        }
        if (stop)
            break;
    }

    /* ---- memory summary: measured peaks beside the strategy's plan ---- */
    dt_mem_stats_t ms = {.struct_size = sizeof(dt_mem_stats_t)};
    R.dev_ops->mem_stats(R.dev, &ms);
    dt_estimate_t plan = {.struct_size = sizeof(dt_estimate_t)};
    if ((rc = dt_plan_strategy(pstrat, R.model, set, (int)dp, &plan)))
        goto out;
    uint64_t plan_total = 0;
    for (int t = 0; t < DT_TAG_COUNT; t++)
        plan_total += plan.bytes[t];
    if (R.world.rank == 0) {
        printf("memory (rank %d, peak MiB measured / planned):", R.world.rank);
        for (int t = 0; t < DT_TAG_COUNT; t++)
            printf(" %s %.2f / %.2f%s", dt_mem_tag_name(t), mib(ms.peak[t]), mib(plan.bytes[t]),
                   t + 1 < DT_TAG_COUNT ? "," : "");
        printf("; total %.2f / %.2f\n", mib(ms.total_peak), mib(plan_total));
    }
    if (R.metrics) {
        fprintf(R.metrics, "{\"memory\": {\"rank\": %d, \"peak_bytes\": {", R.world.rank);
        for (int t = 0; t < DT_TAG_COUNT; t++)
            fprintf(R.metrics, "%s\"%s\": %llu", t ? ", " : "", dt_mem_tag_name(t),
                    (unsigned long long)ms.peak[t]);
        fprintf(R.metrics, "}, \"planned_bytes\": {");
        for (int t = 0; t < DT_TAG_COUNT; t++)
            fprintf(R.metrics, "%s\"%s\": %llu", t ? ", " : "", dt_mem_tag_name(t),
                    (unsigned long long)plan.bytes[t]);
        fprintf(R.metrics, "}, \"total_peak_bytes\": %llu, \"planned_total_bytes\": %llu}}\n",
                (unsigned long long)ms.total_peak, (unsigned long long)plan_total);
    }
out:
    run_free(&R);
    return rc;
}
