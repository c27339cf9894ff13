/*
 * core/cli/cmd_eval.c - `dtrain eval CKPT --data TOKENS`: the loss and
 * perplexity of a checkpoint on a token file, computed by a run's own
 * evaluation (core/train/train.h, eval_only: the state loaded as a resume
 * loads it, data.val evaluated once, nothing written), on one rank or, with
 * --nproc, on N local ranks started as `dtrain run` starts them.
 *
 * The config is the checkpoint's [model] (its manifest), under an
 * optional --config CONFIG (the training run's, for its batch shape,
 * dtypes and parallel layout), then --set overrides; data.val and
 * checkpoint.resume are the command's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "ckpt/ckpt_io.h"
#include "cli/cli.h"
#include "cli/cli_launch.h"
#include "launch/launcher.h"
#include "setup/resolve.h"
#include "train/preflight.h"
#include "train/train.h"
#include "util/error.h"
#include "util/log.h"

void dt_help_eval(FILE *f)
{
    fprintf(f,
            "usage: dtrain eval CKPT --data TOKENS [--batches N] [--config CONFIG]\n"
            "                   [--set table.key=value ...] [--nproc N]\n\n"
            "The loss and perplexity of checkpoint CKPT (a checkpoint directory, or a\n"
            "checkpoint root meaning its newest complete one) on the token file TOKENS\n"
            "(what 'dtrain data prepare' writes: uint16 or, for vocabularies above 65535,\n"
            "uint32 tokens).  It runs a training run's evaluation, as [train] eval_every\n"
            "does: the first N global batches of the file (default: every whole one) of\n"
            "train.global_batch sequences of train.seq_len tokens, each rank taking its\n"
            "share; no step is trained and no checkpoint written.  The last line is\n"
            "  eval: DIR step S: N batches of G x T tokens of 'TOKENS': loss L, perplexity P\n"
            "with the mean loss per token, the same a run evaluating that file with the\n"
            "same batch shape prints (its val loss).\n\n"
            "The model is the checkpoint's.  --config takes the rest from a config (the\n"
            "training run's: batch shape, dtypes, strategy, parallel layout); --set\n"
            "overrides keys as in 'dtrain run' (e.g. train.seq_len, train.micro_batch).\n"
            "Without either, sequences are the model's context long and the batch is\n"
            "[train]'s default.\n"
            "--nproc N starts N ranks on this machine as 'dtrain run --nproc' does (set a\n"
            "communicator for them, e.g. --set run.comm=shm).\n\n"
            "exit codes: 0 done, 1 an unreadable checkpoint or token file (or one too\n"
            "short for a sequence) or a runtime failure, 2 usage or config error (a bad\n"
            "option, more --batches than the file holds)\n");
}

static int usage(const char *why)
{
    fprintf(stderr, "%sdtrain eval: error: %s (see dtrain eval --help)\n", dt_cli_rank_prefix(),
            why);
    return DT_EXIT_USAGE;
}

typedef struct eval_args {
    const char *ckpt, *data, *config, *batches, *nproc;
    const char *sets[256];
    int n_sets;
} eval_args_t;

static int parse(int argc, char **argv, eval_args_t *a)
{
    static const char *const opts[] = {"--data", "--batches", "--config", "--nproc", "--set"};
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        int k = 0;
        while (k < 5 && strcmp(o, opts[k]) != 0)
            k++;
        if (k < 5) {
            if (i + 1 == argc) {
                char why[128];
                snprintf(why, sizeof why, "%s needs a value", o);
                return usage(why);
            }
            const char *v = argv[++i];
            if (k == 4) {
                if (a->n_sets == (int)(sizeof a->sets / sizeof a->sets[0]))
                    return usage("too many --set options");
                a->sets[a->n_sets++] = v;
            } else {
                const char **slot[4] = {&a->data, &a->batches, &a->config, &a->nproc};
                *slot[k] = v;
            }
        } else if (strncmp(o, "--set=", 6) == 0) {
            if (a->n_sets == (int)(sizeof a->sets / sizeof a->sets[0]))
                return usage("too many --set options");
            a->sets[a->n_sets++] = o + 6;
        } else if (o[0] == '-' && o[1]) {
            char why[256];
            snprintf(why, sizeof why, "unknown option '%s'", o);
            return usage(why);
        } else if (a->ckpt) {
            char why[256];
            snprintf(why, sizeof why, "unexpected argument '%s'", o);
            return usage(why);
        } else {
            a->ckpt = o;
        }
    }
    if (!a->ckpt)
        return usage("missing CKPT");
    if (!a->data)
        return usage("missing --data TOKENS");
    return DT_EXIT_OK;
}

/* A positive integer option. */
static int parse_count(const char *opt, const char *v, int64_t *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < 1) {
        char why[256];
        snprintf(why, sizeof why, "%s '%s' is not an integer >= 1", opt, v);
        return usage(why);
    }
    *out = x;
    return DT_EXIT_OK;
}

/* "key=\"value\"" into buf (a path as a TOML string). */
static int quoted_set(char *buf, size_t cap, const char *key, const char *opt, const char *v)
{
    if (strpbrk(v, "\"\\\n") || strlen(v) + strlen(key) + 4 > cap) {
        char why[512];
        snprintf(why, sizeof why, "%s '%.200s': a path with a quote, a backslash or a newline, "
                 "or too long, is not taken", opt, v);
        return usage(why);
    }
    int len = snprintf(buf, cap, "%s=\"%s\"", key, v);
    return len > 0 && (size_t)len < cap ? DT_EXIT_OK : usage("a path too long");
}

int dt_cmd_eval(int argc, char **argv)
{
    dt_world_t w;
    if (dt_world_from_env(NULL, &w) == DT_OK && w.size > 1)
        dt_cli_set_rank(w.rank);
    dt_err_clear();
    eval_args_t a;
    int64_t batches = 0, nproc = 0;
    int ec = parse(argc, argv, &a);
    if (!ec && a.batches)
        ec = parse_count("--batches", a.batches, &batches);
    if (!ec && a.nproc)
        ec = parse_count("--nproc", a.nproc, &nproc);
    if (ec)
        return ec;
    /* the checkpoint's [model], then --config's other tables, --set, and
     * the command's own keys last (they win) */
    char dir[4096], model_sets[DT_MODEL_MAX_KEYS + 1][96], val_set[4200], resume_set[4200];
    char nproc_set[64];
    int n_model = 0;
    dt_ckpt_reader_t *rd = NULL;
    int rc = dt_cli_ckpt_dir(a.ckpt, dir, sizeof dir);
    if (!rc && !(rc = dt_ckpt_open(dir, &rd)))
        rc = dt_ckpt_model_sets(rd, dir, model_sets, DT_MODEL_MAX_KEYS + 1, &n_model);
    dt_ckpt_close(rd);
    if (rc)
        return dt_cli_fail("eval", rc);
    if ((ec = quoted_set(val_set, sizeof val_set, "data.val", "--data", a.data)) ||
        (ec = quoted_set(resume_set, sizeof resume_set, "checkpoint.resume", "CKPT", dir)))
        return ec;
    const char *sets[DT_MODEL_MAX_KEYS + 1 + 256 + 3];
    int n = 0;
    for (int i = 0; i < n_model; i++)
        sets[n++] = model_sets[i];
    for (int i = 0; i < a.n_sets; i++)
        sets[n++] = a.sets[i];
    sets[n++] = val_set;
    sets[n++] = resume_set;
    if (nproc) {
        snprintf(nproc_set, sizeof nproc_set, "launch.nproc=%lld", (long long)nproc);
        sets[n++] = nproc_set;
    }
    dt_resolved_t r;
    if ((rc = dt_resolve_core(a.config, sets, n, &r)))
        return dt_cli_fail("eval", rc);
    /* sequences of the model's whole context unless the config or --set
     * says otherwise (train.seq_len's default may exceed a small one) */
    int64_t context = 0;
    for (int i = 0; i < n_model; i++)
        if (strncmp(model_sets[i], "model.context=", 14) == 0)
            context = strtoll(model_sets[i] + 14, NULL, 10);
    if (context > 0 && dt_config_origin(r.cfg, "train.seq_len") == DT_ORIGIN_DEFAULT) {
        char seq[64];
        snprintf(seq, sizeof seq, "train.seq_len=%lld", (long long)context);
        if ((rc = dt_resolve_set(&r, seq))) {
            ec = dt_cli_fail("eval", rc);
            dt_resolved_free(&r);
            return ec;
        }
    }
    dt_launch_plan_t plan;
    rc = dt_cli_plan_launch(&r, r.set.launch.nproc, nproc ? "--nproc" : "launch.nproc",
                            nproc ? "given" : "the config's", nproc != 0, &plan);
    if (rc == DT_OK && plan.spawn &&
        ((rc = dt_resolve_rest(&r, NULL)) ||
         (rc = dt_preflight(&r, (int64_t)plan.nproc * plan.nnodes, 0)))) {
        ec = dt_cli_fail("eval", rc);
        dt_resolved_free(&r);
        return ec;
    }
    if (rc == DT_OK && plan.spawn) {
        dt_launch_opts_t lo = {.nproc = plan.nproc, .argv = dt_cli_argv(),
                               .raw_stdout_rank = -1, .cleanup = dt_resolve_cleanup_job,
                               .cleanup_ctx = &r};
        char job[128];
        dt_cli_launch_nodes(&plan, &lo, job, sizeof job);
        dt_launch_result_t res;
        rc = dt_launch_run(&lo, &res);
        ec = rc ? dt_cli_fail("eval", rc) : res.exit_code;
        dt_resolved_free(&r);
        return ec;
    }
    if (rc == DT_OK && plan.world.size > 1) {
        dt_log_set_rank(plan.world.rank);
        setvbuf(stdout, NULL, _IOLBF, 0);
    }
    if (rc == DT_OK && (rc = dt_resolve_rest(&r, NULL)) == DT_OK) {
        dt_train_opts_t o = {.eval_only = 1, .eval_batches = batches};
        rc = dt_train(&r, &o);
    }
    ec = rc ? dt_cli_fail("eval", rc) : DT_EXIT_OK;
    dt_resolved_free(&r);
    return ec;
}
