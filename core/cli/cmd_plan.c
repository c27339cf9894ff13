/*
 * core/cli/cmd_plan.c - `dtrain plan CONFIG [--world N] [--model PRESET]`:
 * per-rank memory by tag and communication per step for every
 * data-parallel strategy, predicted without running anything.
 *
 * The config is parsed once; each row selects its strategy (and that
 * strategy's settings) on it and loads what it then selects, so the numbers
 * come from the strategy plugin's own estimate() with its knobs as the
 * config sets them; a strategy that is not installed, or that refuses the
 * layout (a hybrid group that does not divide the world), shows why.
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

/* The assignments --model PRESET stands for, into sets[] from *n on:
 * --model replaces the file's shape, not just its defaults. */
static void preset_sets(const char *preset, char buf[6][96], const char **sets, int *n)
{
    dt_gpt2_shape_t s;
    snprintf(buf[0], 96, "model.preset=%s", preset);
    sets[(*n)++] = buf[0];
    if (dt_gpt2_preset(preset, &s) != DT_OK)
        return;
    snprintf(buf[1], 96, "model.n_layer=%lld", (long long)s.n_layer);
    snprintf(buf[2], 96, "model.n_head=%lld", (long long)s.n_head);
    snprintf(buf[3], 96, "model.n_embd=%lld", (long long)s.n_embd);
    snprintf(buf[4], 96, "model.vocab_size=%lld", (long long)s.vocab_size);
    snprintf(buf[5], 96, "model.context=%lld", (long long)s.context);
    for (int k = 1; k < 6; k++)
        sets[(*n)++] = buf[k];
}

/* Select the variant on the one resolved config (its strategy and that
 * strategy's settings) and load what the config then selects. */
static int select_variant(dt_resolved_t *r, const variant_t *v)
{
    char data[96];
    snprintf(data, sizeof data, "parallel.data=%s", v->plugin);
    int rc = dt_resolve_set(r, data);
    if (rc == DT_OK && v->set)
        rc = dt_resolve_set(r, v->set);
    return rc ? rc : dt_resolve_plugins(r);
}

static void print_header(const dt_resolved_t *r, dt_model_t *m, int64_t world)
{
    const dt_model_info_t *mi = dt_model_info(m);
    printf("plan: %s, %.2fM parameters, %s, %s; %lld rank(s); micro-batch %lld x %lld "
           "tokens\n\n",
           mi->arch, (double)dt_model_desc(m)->numel / 1e6, mi->dtype,
           dt_optim_name(r->set.optimizer.type), (long long)world,
           (long long)r->set.train.micro_batch, (long long)r->set.train.seq_len);
    printf("%-19s %11s %11s %11s %11s %11s %11s %12s %12s\n", "strategy", "params",
           "grads", "optimizer", "activations", "comm bufs", "model state",
           "total/rank", "sent/step");
}

static void print_row(const char *label, const dt_estimate_t *e)
{
    char b[8][32];
    uint64_t total = 0;
    for (int t = 0; t < DT_TAG_COUNT; t++)
        total += e->bytes[t];
    printf("%-19s %11s %11s %11s %11s %11s %11s %12s %12s\n", label,
           dt_plan_bytes(e->bytes[DT_TAG_PARAMS], b[0], 32),
           dt_plan_bytes(e->bytes[DT_TAG_GRADS], b[1], 32),
           dt_plan_bytes(e->bytes[DT_TAG_OPTIMIZER], b[2], 32),
           dt_plan_bytes(e->bytes[DT_TAG_ACTIVATIONS], b[3], 32),
           dt_plan_bytes(e->bytes[DT_TAG_COMM], b[4], 32),
           dt_plan_bytes(dt_plan_model_state(e), b[5], 32), dt_plan_bytes(total, b[6], 32),
           dt_plan_bytes(e->comm_bytes_per_step, b[7], 32));
    if (e->note[0])
        printf("%-19s   %s\n", "", e->note);
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
    const char *sets[DT_ARRAY_LEN(a.sets) + 6];
    char preset[6][96];
    int n = 0;
    for (int i = 0; i < a.n_sets; i++)
        sets[n++] = a.sets[i];
    if (vals[1])
        preset_sets(vals[1], preset, sets, &n);
    /* one parse of the file; each variant changes the selection on it */
    dt_resolved_t r;
    int rc = dt_resolve_core(a.config, sets, n, &r);
    if (rc)
        return dt_cli_fail("plan", rc);
    if (world <= 0)
        world = r.set.launch.nproc;
    dt_model_t *m = NULL;
    int planned = 0, first_rc = DT_OK;
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        dt_estimate_t e = {.struct_size = sizeof(dt_estimate_t)};
        rc = select_variant(&r, &variants[i]);
        if (rc == DT_OK && !m && (rc = dt_model_create(r.cfg, &m)) == DT_OK)
            print_header(&r, m, world);
        if (rc == DT_OK)
            rc = dt_plan_strategy(r.plugin[DT_ROLE_DATA], m, &r.set, (int)world, &e);
        if (rc == DT_OK) {
            print_row(variants[i].label, &e);
            planned++;
        } else if (i == 0) {
            /* ddp is always there: a failure here is the config's, say it
             * once as `check` would */
            break;
        } else {
            printf("%-19s   not planned: %s\n", variants[i].label, dt_last_error());
            if (!first_rc)
                first_rc = rc;
        }
    }
    ec = planned ? DT_EXIT_OK : dt_cli_fail("plan", first_rc ? first_rc : rc);
    if (m)
        dt_model_free(m, NULL);
    dt_resolved_free(&r);
    return ec;
}
