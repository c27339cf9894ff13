/*
 * core/cli/cmd_plan.c - `dtrain plan CONFIG [--world N] [--model PRESET]`:
 * per-rank memory by tag and communication per step for every
 * data-parallel strategy, predicted without running anything.
 *
 * Each row resolves the config again with that strategy selected, so the
 * numbers come from the strategy plugin's own estimate() with its knobs as
 * the config sets them; a strategy that is not installed, or that refuses
 * the layout (a hybrid group that does not divide the world), shows why.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "model/model.h"
#include "train/plan.h"
#include "setup/resolve.h"
#include "util/error.h"

void dt_help_plan(FILE *f)
{
    fprintf(f,
            "usage: dtrain plan CONFIG [--world N] [--model PRESET] [--set table.key=value ...]\n\n"
            "Predict, for every data-parallel strategy (ddp, zero stages 1-3, fsdp's sharding\n"
            "strategies), the peak bytes per rank by tag (params, grads, optimizer,\n"
            "activations, comm buffers), the model state per rank, and the bytes each rank\n"
            "sends per step, for the model and batch CONFIG describes.  --world defaults to\n"
            "launch.nproc; --model picks a preset (gpt2-124m ... gpt2-1558m).  Nothing is\n"
            "allocated, so any size can be planned on any machine.\n"
            "exit codes: 0 planned, 2 usage or config error\n");
}

typedef struct variant {
    const char *label;
    const char *plugin;
    const char *set; /* one extra assignment, or NULL */
} variant_t;

static const variant_t variants[] = {
    {"ddp", "ddp", NULL},
    {"zero-1", "zero", "zero.stage=1"},
    {"zero-2", "zero", "zero.stage=2"},
    {"zero-3", "zero", "zero.stage=3"},
    {"fsdp NO_SHARD", "fsdp", "fsdp.sharding_strategy=NO_SHARD"},
    {"fsdp SHARD_GRAD_OP", "fsdp", "fsdp.sharding_strategy=SHARD_GRAD_OP"},
    {"fsdp FULL_SHARD", "fsdp", "fsdp.sharding_strategy=FULL_SHARD"},
    {"fsdp HYBRID_SHARD", "fsdp", "fsdp.sharding_strategy=HYBRID_SHARD"},
};

/* Resolve with the variant selected and estimate; *m receives the model
 * (the caller prints its header from the first one). */
static int plan_one(const dt_cli_config_args_t *a, const variant_t *v, const char *preset,
                    int64_t *world, dt_resolved_t *r, dt_model_t **m, dt_estimate_t *e)
{
    const char *sets[264];
    char data[96], pre[96], shape[5][64];
    int n = 0;
    for (int i = 0; i < a->n_sets && n < 256; i++)
        sets[n++] = a->sets[i];
    snprintf(data, sizeof data, "parallel.data=%s", v->plugin);
    sets[n++] = data;
    if (v->set)
        sets[n++] = v->set;
    if (preset) {
        /* --model replaces the file's shape, not just its defaults */
        dt_gpt2_shape_t s;
        snprintf(pre, sizeof pre, "model.preset=%s", preset);
        sets[n++] = pre;
        if (dt_gpt2_preset(preset, &s) == DT_OK) {
            snprintf(shape[0], 64, "model.n_layer=%lld", (long long)s.n_layer);
            snprintf(shape[1], 64, "model.n_head=%lld", (long long)s.n_head);
            snprintf(shape[2], 64, "model.n_embd=%lld", (long long)s.n_embd);
            snprintf(shape[3], 64, "model.vocab_size=%lld", (long long)s.vocab_size);
            snprintf(shape[4], 64, "model.context=%lld", (long long)s.context);
            for (int k = 0; k < 5; k++)
                sets[n++] = shape[k];
        }
    }
    int rc = dt_resolve_ex(a->config, sets, n, DT_RESOLVE_OTHER_TABLES_OK, r);
    if (rc)
        return rc;
    if (*world <= 0 && (rc = dt_config_get_int(r->cfg, "launch.nproc", world)))
        return rc;
    if ((rc = dt_model_create(r->cfg, r->plugin[DT_ROLE_DEVICE]->ops, m)))
        return rc;
    return dt_plan_strategy(r->plugin[DT_ROLE_DATA], *m, r->cfg, (int)*world, e);
}

int dt_cmd_plan(int argc, char **argv)
{
    static const char *const opts[] = {"--world", "--model", NULL};
    const char *vals[2] = {NULL, NULL};
    dt_cli_config_args_t a;
    int ec = dt_cli_parse_config_args("plan", argc, argv, &a, opts, vals);
    if (ec)
        return ec;
    int64_t world = 0;
    if (vals[0]) {
        char *end;
        world = strtoll(vals[0], &end, 10);
        if (*end || world < 1 || world > 1000000) {
            fprintf(stderr, "dtrain plan: error: --world %s is not a rank count in 1..1000000\n",
                    vals[0]);
            return DT_EXIT_USAGE;
        }
    }
    int printed_header = 0, planned = 0, first_rc = DT_OK;
    char b[DT_TAG_COUNT + 2][32];
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        dt_resolved_t r;
        dt_model_t *m = NULL;
        dt_estimate_t e = {.struct_size = sizeof(dt_estimate_t)};
        int rc = plan_one(&a, &variants[i], vals[1], &world, &r, &m, &e);
        if (rc == DT_OK && !printed_header) {
            const dt_model_info_t *mi = dt_model_info(m);
            int64_t micro = 0, T = 0, accum = 0;
            const char *opt = "";
            dt_config_get_int(r.cfg, "train.micro_batch", &micro);
            dt_config_get_int(r.cfg, "train.seq_len", &T);
            dt_config_get_int(r.cfg, "train.grad_accum", &accum);
            dt_config_get_string(r.cfg, "optimizer.type", &opt);
            printf("plan: %s, %.2fM parameters, %s, %s; %lld rank(s); micro-batch %lld x %lld "
                   "tokens\n\n",
                   mi->arch, (double)dt_model_desc(m)->numel / 1e6, mi->dtype, opt,
                   (long long)world, (long long)micro, (long long)T);
            printf("%-19s %11s %11s %11s %11s %11s %11s %12s %12s\n", "strategy", "params",
                   "grads", "optimizer", "activations", "comm bufs", "model state",
                   "total/rank", "sent/step");
            printed_header = 1;
        }
        if (rc == DT_OK) {
            uint64_t total = 0;
            for (int t = 0; t < DT_TAG_COUNT; t++)
                total += e.bytes[t];
            printf("%-19s %11s %11s %11s %11s %11s %11s %12s %12s\n", variants[i].label,
                   dt_plan_bytes(e.bytes[DT_TAG_PARAMS], b[0], 32),
                   dt_plan_bytes(e.bytes[DT_TAG_GRADS], b[1], 32),
                   dt_plan_bytes(e.bytes[DT_TAG_OPTIMIZER], b[2], 32),
                   dt_plan_bytes(e.bytes[DT_TAG_ACTIVATIONS], b[3], 32),
                   dt_plan_bytes(e.bytes[DT_TAG_COMM], b[4], 32),
                   dt_plan_bytes(dt_plan_model_state(&e), b[5], 32),
                   dt_plan_bytes(total, b[6], 32),
                   dt_plan_bytes(e.comm_bytes_per_step, b[7], 32));
            if (e.note[0])
                printf("%-19s   %s\n", "", e.note);
            planned++;
        } else if (i == 0) {
            /* ddp is always there: a failure here is the config's, say it
             * once as `check` would */
            if (m)
                dt_model_free(m, NULL);
            dt_resolved_free(&r);
            return dt_cli_fail("plan", rc);
        } else {
            printf("%-19s   not planned: %s\n", variants[i].label, dt_last_error());
            if (!first_rc)
                first_rc = rc;
        }
        if (m)
            dt_model_free(m, NULL);
        dt_resolved_free(&r);
    }
    if (!planned)
        return dt_cli_fail("plan", first_rc);
    return DT_EXIT_OK;
}
