/*
 * tests/unit/core/config/test_config.c - the config module through its public API:
 * parsing, schema checks and their exact messages (file:line:col, --set
 * locations, did-you-mean), overrides, provenance, printing, hashing, and
 * a mutation loop that feeds broken configs through everything.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config.h"
#include "config/settings.h"
#include "dtrain/strategy.h"
#include "util/error.h"
#include "test_assert.h"

/* The message must contain `want`; on failure show the whole message. */
static const dt_config_section_t *section(const char *table)
{
    for (uint32_t i = 0; i < dt_core_n_sections; i++)
        if (strcmp(dt_core_sections[i].table, table) == 0)
            return &dt_core_sections[i];
    fail_msg("no core section [%s]", table);
    return NULL;
}

static int apply(dt_config_t *c, const char *table)
{
    const dt_config_section_t *s = section(table);
    return dt_config_apply_schema(c, s->table, s->keys, s->n_keys);
}

static int apply_core(dt_config_t *c)
{
    for (uint32_t i = 0; i < dt_core_n_sections; i++) {
        const dt_config_section_t *s = &dt_core_sections[i];
        int rc = dt_config_apply_schema(c, s->table, s->keys, s->n_keys);
        if (rc != DT_OK)
            return rc;
    }
    return DT_OK;
}

static dt_config_t *load(const char *text)
{
    dt_config_t *c = NULL;
    int rc = dt_config_load_string("t.toml", text, &c);
    if (rc != DT_OK)
        fail_msg("load failed: %s", dt_last_error());
    return c;
}

/* Load `text`, apply [table] and expect `status` with message `want`. */
static void expect_apply_error(const char *text, const char *table,
                               int status, const char *want)
{
    dt_config_t *c = load(text);
    dt_err_clear();
    assert_int_equal(apply(c, table), status);
    assert_msg(want);
    dt_config_free(c);
}

/* dt_config_print into a string (caller frees). */
static char *print_to_string(const dt_config_t *c)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    dt_config_print(c, f);
    fclose(f);
    return buf;
}

/* ------------------------------------------------------------------------ */

static void test_suggest(void **state)
{
    (void)state;
    const char *keys[] = {"steps", "lr", "gradient_clipping", "seed", "grad_accum",
                          "warmup_steps"};
    size_t n = sizeof keys / sizeof keys[0];
    assert_string_equal(dt_suggest("gradient_clipp1ng", keys, n), "gradient_clipping");
    assert_string_equal(dt_suggest("gradient_clip", keys, n), "gradient_clipping");
    assert_string_equal(dt_suggest("warmup", keys, n), "warmup_steps"); /* prefix */
    assert_null(dt_suggest("war", keys, n)); /* too short to be a prefix hint */
    assert_string_equal(dt_suggest("lrr", keys, n), "lr");
    assert_string_equal(dt_suggest("LR", keys, n), "lr");
    assert_string_equal(dt_suggest("stpes", keys, n), "steps"); /* transposition */
    assert_string_equal(dt_suggest("sed", keys, n), "seed");
    assert_null(dt_suggest("xyz", keys, n));
    assert_null(dt_suggest("learning_rate", keys, n));
    assert_null(dt_suggest("", keys, n));
    assert_null(dt_suggest("lr", NULL, 0));
    const char *tables[] = {"run", "model", "train", "data"};
    assert_string_equal(dt_suggest("trian", tables, 4), "train");
    assert_string_equal(dt_suggest("modle", tables, 4), "model");
    assert_null(dt_suggest("optimizer", tables, 4));
}

static void test_defaults(void **state)
{
    (void)state;
    dt_config_t *c = NULL;
    assert_int_equal(dt_config_new(&c), DT_OK);
    assert_int_equal(apply_core(c), DT_OK);
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_OK);
    assert_string_equal(dt_config_path(c), "");

    int64_t i;
    double f;
    int b;
    const char *s;
    assert_int_equal(dt_config_get_int(c, "run.seed", &i), DT_OK);
    assert_int_equal(i, 1337);
    assert_int_equal(dt_config_get_float(c, "train.lr", &f), DT_OK);
    assert_true(f == 6e-4);
    assert_int_equal(dt_config_get_float(c, "launch.timeout", &f), DT_OK);
    assert_true(f == 300.0);
    assert_int_equal(dt_config_get_int(c, "launch.master_port", &i), DT_OK);
    assert_int_equal(i, 29500);
    assert_int_equal(dt_config_get_bool(c, "data.shuffle", &b), DT_OK);
    assert_int_equal(b, 1);
    assert_int_equal(dt_config_get_bool(c, "optimizer.nesterov", &b), DT_OK);
    assert_int_equal(b, 0);
    assert_int_equal(dt_config_get_string(c, "model.preset", &s), DT_OK);
    assert_string_equal(s, "custom");
    assert_int_equal(dt_config_get_string(c, "launch.master_addr", &s), DT_OK);
    assert_string_equal(s, "127.0.0.1");
    assert_int_equal(dt_config_get_string(c, "parallel.data", &s), DT_OK);
    assert_string_equal(s, "ddp");
    assert_int_equal(dt_config_get_string(c, "checkpoint.resume", &s), DT_OK);
    assert_string_equal(s, "");
    assert_int_equal(dt_config_origin(c, "train.lr"), DT_ORIGIN_DEFAULT);

    /* Reads: undeclared keys and type mismatches. */
    assert_int_equal(dt_config_get_int(c, "train.lrr", &i), DT_ERR_NOT_FOUND);
    assert_msg("config key 'train.lrr' was not declared by any schema");
    assert_int_equal(dt_config_get_int(c, "nodot", &i), DT_ERR_NOT_FOUND);
    assert_int_equal(dt_config_get_int(c, "train.lr", &i), DT_ERR_INVALID);
    assert_msg("config key 'train.lr' is a float, not an integer");
    assert_int_equal(dt_config_get_float(c, "train.steps", &f), DT_OK); /* INT as float */
    assert_true(f == 100.0);
    assert_int_equal(dt_config_get_string(c, "model.dtype", &s), DT_OK); /* ENUM */
    assert_string_equal(s, "fp32");
    assert_int_equal(dt_config_get_bool(c, "model.dtype", &b), DT_ERR_INVALID);
    assert_int_equal(dt_config_get_string(c, "run.seed", &s), DT_ERR_INVALID);
    dt_config_free(c);
}

static void test_syntax_error(void **state)
{
    (void)state;
    dt_config_t *c = (dt_config_t *)1;
    assert_int_equal(dt_config_load_string("t.toml", "[train]\nlr = = 1\n", &c),
                     DT_ERR_CONFIG);
    assert_null(c);
    assert_msg_has("t.toml:2:6: TOML syntax error: ");
    assert_msg_has("could not determine value type");

    assert_int_equal(dt_config_load_string("t.toml", "[train]\nlr = 1\nlr = 2\n", &c),
                     DT_ERR_CONFIG);
    assert_msg_has("t.toml:3:");
    assert_msg_has("cannot redefine existing integer 'lr'");

    assert_int_equal(dt_config_load_string("t.toml", "[train\n", &c), DT_ERR_CONFIG);
    assert_msg_has("t.toml:1:");
    assert_int_equal(dt_config_load_string("t.toml", "name = \"open\n", &c),
                     DT_ERR_CONFIG);
    assert_msg_has("t.toml:1:");
}

static void test_file_load(void **state)
{
    (void)state;
    char path[] = "/tmp/dt_test_config_XXXXXX.toml";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    const char *text = "# a run\n[train]\nsteps = 12\nlr = \"abc\"\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);

    dt_config_t *c = NULL;
    assert_int_equal(dt_config_load(path, &c), DT_OK);
    assert_string_equal(dt_config_path(c), path);
    assert_int_equal(apply(c, "train"), DT_ERR_CONFIG);
    char want[256];
    snprintf(want, sizeof want,
             "%s:4:6: [train] lr: expected a float, got string \"abc\"", path);
    assert_msg(want);
    dt_config_free(c);

    /* A syntax error in a real file names the file too. */
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("[train]\nsteps = 1\nlr = 0.1.2\n", f);
    fclose(f);
    assert_int_equal(dt_config_load(path, &c), DT_ERR_CONFIG);
    snprintf(want, sizeof want, "%s:3:", path);
    assert_msg_has(want);
    unlink(path);

    assert_int_equal(dt_config_load(path, &c), DT_ERR_NOT_FOUND);
    snprintf(want, sizeof want, "cannot open config file '%s': ", path);
    assert_msg_has(want);
}

static void test_unknown_key(void **state)
{
    (void)state;
    expect_apply_error("[train]\nsteps = 10\ngradient_clipp1ng = 1.0\n", "train",
                       DT_ERR_CONFIG,
                       "t.toml:3:1: unknown key 'gradient_clipp1ng' in [train]; "
                       "did you mean 'gradient_clipping'?");
    /* Nothing close: no suggestion part. */
    expect_apply_error("[train]\n  zzqqxx = 1\n", "train", DT_ERR_CONFIG,
                       "t.toml:2:3: unknown key 'zzqqxx' in [train]");
    /* A table whose schema has no keys. */
    static const dt_config_key_t none[1];
    dt_config_t *c = load("[ddp]\nbucket = 1\n");
    assert_int_equal(dt_config_apply_schema(c, "ddp", none, 0), DT_ERR_CONFIG);
    assert_msg("t.toml:2:1: unknown key 'bucket' in [ddp]; [ddp] takes no keys");
    dt_config_free(c);
}

static void test_unknown_table(void **state)
{
    (void)state;
    dt_config_t *c = load("[run]\nname = \"x\"\n\n[trian]\nsteps = 1\n");
    assert_int_equal(apply_core(c), DT_OK);
    assert_int_equal(dt_config_check_unclaimed(c, "plugin tables are named after "
                                                  "a selected plugin"),
                     DT_ERR_CONFIG);
    assert_msg("t.toml:4:1: unknown table [trian]; did you mean [train]? "
                  "(plugin tables are named after a selected plugin)");
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_ERR_CONFIG);
    assert_msg("t.toml:4:1: unknown table [trian]; did you mean [train]?");
    dt_config_free(c);

    c = load("[zzzz]\na = 1\n");
    assert_int_equal(apply(c, "run"), DT_OK);
    assert_int_equal(apply(c, "train"), DT_OK);
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_ERR_CONFIG);
    assert_msg("t.toml:1:1: unknown table [zzzz]; the tables in use are [run], [train]");
    dt_config_free(c);

    /* A key above every table heading. */
    c = load("lr = 0.1\n[train]\nsteps = 2\n");
    assert_int_equal(apply_core(c), DT_OK);
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_ERR_CONFIG);
    assert_msg("t.toml:1:1: key 'lr' is outside any table; did you mean to put "
                  "it under [train]?");
    dt_config_free(c);
    c = load("stepz = 1\n");
    assert_int_equal(apply_core(c), DT_OK);
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_ERR_CONFIG);
    assert_msg("t.toml:1:1: key 'stepz' is outside any table; did you mean "
                  "'steps' under [train]?");
    dt_config_free(c);

    /* Top-level dotted keys are ordinary TOML for a table: accepted. */
    c = load("train.lr = 0.5\n");
    assert_int_equal(apply_core(c), DT_OK);
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_OK);
    double f;
    assert_int_equal(dt_config_get_float(c, "train.lr", &f), DT_OK);
    assert_true(f == 0.5);
    dt_config_free(c);
}

/* Keys spelled as DeepSpeed, torchrun, PyTorch, the Hugging Face Trainer
 * or nanoGPT spell them: wherever they are written (a core table, the top
 * level, a table of their own, a nested table, --set), the message points
 * at dtrain's key. */
static void test_aliases(void **state)
{
    (void)state;
    static const struct {
        const char *text, *set, *want;
    } cases[] = {
        {"[train]\ngradient_accumulation_steps = 4\n", NULL,
         "t.toml:2:1: unknown key 'gradient_accumulation_steps' in [train]; "
         "gradient_accumulation_steps is DeepSpeed's name for train.grad_accum"},
        {"train_micro_batch_size_per_gpu = 4\n", NULL,
         "t.toml:1:1: key 'train_micro_batch_size_per_gpu' is outside any table; "
         "train_micro_batch_size_per_gpu is DeepSpeed's name for train.micro_batch"},
        {"train_batch_size = 32\n", NULL,
         "t.toml:1:1: key 'train_batch_size' is outside any table; train_batch_size is "
         "DeepSpeed's name for train.global_batch"},
        {"gradient_clipping = 1.0\n", NULL,
         "t.toml:1:1: key 'gradient_clipping' is outside any table; did you mean to put it "
         "under [train]?"},
        {"steps_per_print = 10\n", NULL,
         "t.toml:1:1: key 'steps_per_print' is outside any table; steps_per_print is "
         "DeepSpeed's name for run.log_every"},
        {"[run]\nname = \"x\"\n[zero_optimization]\nstage = 2\n", NULL,
         "t.toml:3:1: unknown table [zero_optimization]; zero_optimization.stage is "
         "DeepSpeed's name for [zero] stage (with parallel.data = \"zero\")"},
        {"zero_optimization.stage = 3\n", NULL,
         "t.toml:1:1: unknown table [zero_optimization]; zero_optimization.stage is "
         "DeepSpeed's name for [zero] stage (with parallel.data = \"zero\")"},
        {"[zero_optimization]\noverlap_comm = true\n", NULL,
         "t.toml:1:1: unknown table [zero_optimization]; zero_optimization is DeepSpeed's "
         "name for the [zero] table (with parallel.data = \"zero\"; its keys: dtrain "
         "plugins --describe zero)"},
        {"[zero_optimization]\nstage3_prefetch_bucket_size = 5\n", NULL,
         "t.toml:1:1: unknown table [zero_optimization]; "
         "zero_optimization.stage3_prefetch_bucket_size is DeepSpeed's name for [zero] "
         "prefetch_bucket_size"},
        {"[fp16]\nenabled = true\n", NULL,
         "t.toml:2:1: unknown key 'enabled' in [fp16]; fp16.enabled is DeepSpeed's name for "
         "model.dtype = \"fp16\""},
        {"[bf16]\nenabled = true\n", NULL,
         "t.toml:1:1: unknown table [bf16]; bf16.enabled is DeepSpeed's name for "
         "model.dtype = \"bf16\""},
        {"[optimizer]\ntype = \"adamw\"\n[optimizer.params]\nlr = 1e-3\n", NULL,
         "t.toml:3:1: [optimizer] params: nested tables are not allowed in [optimizer] (no "
         "[optimizer.params] headers or dotted keys 'params.x = ...'; every key is a plain "
         "value); optimizer.params.lr is DeepSpeed's name for train.lr"},
        {"[optimizer.params]\nbetas = [0.9, 0.95]\n", NULL,
         "t.toml:1:1: [optimizer] params: nested tables are not allowed in [optimizer] (no "
         "[optimizer.params] headers or dotted keys 'params.x = ...'; every key is a plain "
         "value); optimizer.params.betas is DeepSpeed's name for optimizer.beta1 and "
         "optimizer.beta2"},
        {"[optimizer.params]\nweight_decay = 0.1\n", NULL,
         "t.toml:1:1: [optimizer] params: nested tables are not allowed in [optimizer] (no "
         "[optimizer.params] headers or dotted keys 'params.x = ...'; every key is a plain "
         "value); optimizer.params.weight_decay is DeepSpeed's name for "
         "optimizer.weight_decay"},
        {"[scheduler]\ntype = \"WarmupLR\"\n[scheduler.params]\nwarmup_num_steps = 10\n",
         NULL,
         "t.toml:1:1: unknown table [scheduler]; scheduler.params.warmup_num_steps is "
         "DeepSpeed's name for train.warmup_steps"},
        {"communication_data_type = \"bf16\"\n", NULL,
         "t.toml:1:1: key 'communication_data_type' is outside any table; "
         "communication_data_type is DeepSpeed's name for reduce_dtype in the data-parallel "
         "strategy's table ([ddp] reduce_dtype)"},
        {"[launch]\nnproc_per_node = 2\n", NULL,
         "t.toml:2:1: unknown key 'nproc_per_node' in [launch]; nproc_per_node is "
         "torchrun's name for launch.nproc"},
        {"[launch]\nrdzv_endpoint = \"h:1\"\n", NULL,
         "t.toml:2:1: unknown key 'rdzv_endpoint' in [launch]; rdzv_endpoint is torchrun's "
         "name for launch.master_addr and launch.master_port"},
        {"[train]\nbetas = [0.9, 0.95]\n", NULL,
         "t.toml:2:1: unknown key 'betas' in [train]; betas is PyTorch's name for "
         "optimizer.beta1 and optimizer.beta2"},
        {"[optimizer]\nlr = 0.1\n", NULL,
         "t.toml:2:1: unknown key 'lr' in [optimizer]; 'lr' is a key of [train] (train.lr)"},
        {"[train]\nweight_decay = 0.1\n", NULL,
         "t.toml:2:1: unknown key 'weight_decay' in [train]; 'weight_decay' is a key of "
         "[optimizer] (optimizer.weight_decay)"},
        {"[train]\nlearning_rate = 0.1\n", NULL,
         "t.toml:2:1: unknown key 'learning_rate' in [train]; learning_rate is the Hugging "
         "Face Trainer's name for train.lr"},
        {"[train]\nmax_iters = 10\n", NULL,
         "t.toml:2:1: unknown key 'max_iters' in [train]; max_iters is nanoGPT's name for "
         "train.steps"},
        /* DeepSpeed's offload blocks, FSDP's cpu_offload and mixed_precision */
        {"[zero_optimization.offload_optimizer]\ndevice = \"cpu\"\n", NULL,
         "t.toml:1:1: unknown table [zero_optimization]; offload_optimizer is DeepSpeed's "
         "name for parallel.offload = \"offload_cpu\" (device \"nvme\": \"offload_nvme\" and its "
         "[offload_nvme] path) with offload_what = \"optimizer\" in the strategy's table "
         "([zero] offload_what)"},
        {"[zero_optimization]\n[zero_optimization.offload_param]\ndevice = \"nvme\"\n", NULL,
         "t.toml:1:1: unknown table [zero_optimization]; offload_param is DeepSpeed's name for "
         "parallel.offload = \"offload_cpu\" or \"offload_nvme\" with offload_what = \"params\" "
         "or \"optimizer_and_params\" in the strategy's table ([zero] offload_what, zero stage "
         "3)"},
        {"[parallel]\noffload_param = true\n", NULL,
         "t.toml:2:1: unknown key 'offload_param' in [parallel]; offload_param is DeepSpeed's "
         "name for parallel.offload = \"offload_cpu\" or \"offload_nvme\" with offload_what = "
         "\"params\" or \"optimizer_and_params\" in the strategy's table ([zero] offload_what, "
         "zero stage 3)"},
        {"[train]\ncpu_offload = true\n", NULL,
         "t.toml:2:1: unknown key 'cpu_offload' in [train]; cpu_offload is PyTorch FSDP's name "
         "for parallel.offload = \"offload_cpu\" with [fsdp] offload_what = "
         "\"optimizer_and_params\" (CPUOffload(offload_params=True): parameters on the host, "
         "the optimizer step there)"},
        {"mixed_precision = \"bf16\"\n", NULL,
         "t.toml:1:1: key 'mixed_precision' is outside any table; mixed_precision is PyTorch "
         "FSDP's name for model.dtype (MixedPrecision's param_dtype: \"bf16\" or \"fp16\") and "
         "[fsdp] reduce_dtype (its reduce_dtype)"},
        /* warmup_ratio: the warmup_steps it comes to, with train.steps from
         * the file, from --set, or the default (100) */
        {"[train]\nsteps = 300\nwarmup_ratio = 0.1\n", NULL,
         "t.toml:3:1: unknown key 'warmup_ratio' in [train]; warmup_ratio is the Hugging Face "
         "Trainer's name for train.warmup_steps, counted in steps (warmup_ratio x "
         "train.steps); here train.warmup_steps = 30 (0.1 x train.steps = 300)"},
        {"[train]\nsteps = 300\nwarmup_ratio = 0.03\n", "train.steps=1000",
         "t.toml:3:1: unknown key 'warmup_ratio' in [train]; warmup_ratio is the Hugging Face "
         "Trainer's name for train.warmup_steps, counted in steps (warmup_ratio x "
         "train.steps); here train.warmup_steps = 30 (0.03 x train.steps = 1000)"},
        {"warmup_ratio = 0.05\n", NULL,
         "t.toml:1:1: key 'warmup_ratio' is outside any table; warmup_ratio is the Hugging "
         "Face Trainer's name for train.warmup_steps, counted in steps (warmup_ratio x "
         "train.steps); here train.warmup_steps = 5 (0.05 x train.steps = 100)"},
        {"[train]\nsteps = 40\n", "train.warmup_ratio=0.25",
         "--set train.warmup_ratio=0.25: unknown key 'warmup_ratio' in [train]; warmup_ratio "
         "is the Hugging Face Trainer's name for train.warmup_steps, counted in steps "
         "(warmup_ratio x train.steps); here train.warmup_steps = 10 (0.25 x train.steps = "
         "40)"},
        {"[train]\nwarmup_ratio = \"a tenth\"\n", NULL,
         "t.toml:2:1: unknown key 'warmup_ratio' in [train]; warmup_ratio is the Hugging Face "
         "Trainer's name for train.warmup_steps, counted in steps (warmup_ratio x "
         "train.steps)"},
        {"", "train.gradient_accumulation_steps=2",
         "--set train.gradient_accumulation_steps=2: unknown key "
         "'gradient_accumulation_steps' in [train]; gradient_accumulation_steps is "
         "DeepSpeed's name for train.grad_accum"},
        {"", "zero_optimization.stage=2",
         "--set zero_optimization.stage=2: unknown table [zero_optimization]; "
         "zero_optimization.stage is DeepSpeed's name for [zero] stage (with parallel.data "
         "= \"zero\")"},
        {"", "optimizer.params.lr=0.1",
         "--set optimizer.params.lr=0.1: expected table.key=value (e.g. --set "
         "train.lr=3e-4); optimizer.params.lr is DeepSpeed's name for train.lr"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_config_t *c = load(cases[i].text);
        dt_err_clear();
        int rc = cases[i].set ? dt_config_override(c, cases[i].set) : DT_OK;
        if (rc == DT_OK)
            rc = apply_core(c);
        if (rc == DT_OK)
            rc = dt_config_check_unclaimed(c, NULL);
        if (rc != DT_ERR_CONFIG || strcmp(dt_last_error(), cases[i].want) != 0)
            fail_msg("case %zu: status %d, message\n  %s\nwanted\n  %s", i, rc,
                     dt_last_error(), cases[i].want);
        dt_config_free(c);
    }
}

/* Every error of a table, and of the tables nothing claims, at once: one
 * a line (a table's unknown keys, then its values in the schema's order),
 * a table in error claimed with its values in error
 * at their defaults, the same message for a second claim, at most
 * DT_ERRLIST_MAX lines. */
static void test_all_errors_at_once(void **state)
{
    (void)state;
    dt_config_t *c = load("[train]\nsteps = 0\nlrr = 1\nlr = \"fast\"\nmicro_batch = 8\n"
                          "[deepspeed]\nx = 1\nstray = 2\n");
    /* the file's [deepspeed] holds stray: only one table */
    assert_int_equal(dt_config_override(c, "train.seq_len=abc"), DT_OK);
    assert_int_equal(dt_config_override(c, "train.zz=1"), DT_OK);
    const char *want =
        "t.toml:3:1: unknown key 'lrr' in [train]; did you mean 'lr'?\n"
        "--set train.zz=1: unknown key 'zz' in [train]\n"
        "t.toml:2:9: [train] steps = 0 is out of range (allowed 1 .. 1000000000)\n"
        "--set train.seq_len=abc: [train] seq_len: expected an integer, got string \"abc\"\n"
        "t.toml:4:6: [train] lr: expected a float, got string \"fast\"";
    assert_int_equal(apply(c, "train"), DT_ERR_CONFIG);
    assert_msg(want);
    /* claimed: the good value read, those in error at their defaults */
    assert_true(dt_config_claimed(c, "train"));
    int64_t i = 0;
    double f = 0;
    assert_int_equal(dt_config_get_int(c, "train.micro_batch", &i), DT_OK);
    assert_int_equal(i, 8);
    assert_int_equal(dt_config_get_int(c, "train.steps", &i), DT_OK);
    assert_int_equal(i, 100);
    assert_int_equal(dt_config_get_float(c, "train.lr", &f), DT_OK);
    assert_true(f == 6e-4);
    assert_int_equal(dt_config_origin(c, "train.lr"), DT_ORIGIN_DEFAULT);
    /* claimed again (dtrain plan re-selects plugins): the same errors */
    dt_err_clear();
    assert_int_equal(apply(c, "train"), DT_ERR_CONFIG);
    assert_msg(want);
    /* the other tables are fine; the unclaimed ones, all at once */
    assert_int_equal(apply(c, "run"), DT_OK);
    assert_int_equal(dt_config_override(c, "deepspeed2.y=1"), DT_OK);
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_ERR_CONFIG);
    assert_msg_starts("t.toml:6:1: unknown table [deepspeed]; the tables in use are [train], "
                      "[run]\n--set deepspeed2.y=1: unknown table [deepspeed2]; ");
    dt_config_free(c);

    /* a required key missing and one in error, a nested table: all three */
    static const dt_config_key_t keys[] = {
        {"name", DT_CFG_STRING, NULL, 0, 0, NULL, "required"},
        {"size", DT_CFG_INT, NULL, 1, 9, NULL, "required"},
        {"mode", DT_CFG_ENUM, NULL, 0, 0, "a|b", "required"},
    };
    c = load("[p]\nsize = 10\nmode = \"c\"\n[p.sub]\nk = 1\n");
    assert_int_equal(dt_config_apply_schema(c, "p", keys, 3), DT_ERR_CONFIG);
    assert_msg("t.toml:4:1: [p] sub: nested tables are not allowed in [p] (no [p.sub] headers "
               "or dotted keys 'sub.x = ...'; every key is a plain value)\n"
               "t.toml:1:1: required key 'p.name' is missing (add 'name = ...' under [p] or "
               "pass --set p.name=VALUE)\n"
               "t.toml:2:8: [p] size = 10 is out of range (allowed 1 .. 9)\n"
               "t.toml:3:8: [p] mode = \"c\" is not one of \"a\", \"b\"");
    const char *str = NULL;
    assert_int_equal(dt_config_get_string(c, "p.name", &str), DT_OK);
    assert_string_equal(str, ""); /* never NULL */
    assert_int_equal(dt_config_get_string(c, "p.mode", &str), DT_OK);
    assert_string_equal(str, "");
    dt_config_free(c);

    /* the bound: 20 unknown keys, the first DT_ERRLIST_MAX (16) shown */
    char text[1024] = "[train]\n";
    for (int k = 0; k < 20; k++)
        snprintf(text + strlen(text), sizeof text - strlen(text), "zq%02d = 1\n", k);
    c = load(text);
    assert_int_equal(apply(c, "train"), DT_ERR_CONFIG);
    const char *m = dt_last_error();
    int lines = 1;
    for (const char *p = m; *p; p++)
        lines += *p == '\n';
    assert_int_equal(lines, DT_ERRLIST_MAX + 1);
    assert_msg_starts("t.toml:2:1: unknown key 'zq00' in [train]\n");
    assert_non_null(strstr(m, "t.toml:17:1: unknown key 'zq15' in [train]\n"
                              "... and 4 more errors (the first 16 are shown)"));
    assert_null(strstr(m, "zq16"));
    dt_config_free(c);

    /* the list itself: one line each, a repeated line once */
    dt_errlist_t l = {.n = 0};
    assert_int_equal(dt_errlist_fail(&l, DT_ERR_CONFIG), DT_OK);
    dt_errlist_add(&l, "a: one\nb: two");
    dt_errlist_add(&l, "a: one");
    dt_errlist_add(&l, "c: three\n");
    assert_int_equal(l.n, 3);
    assert_int_equal(dt_errlist_fail(&l, DT_ERR_CONFIG), DT_ERR_CONFIG);
    assert_msg("a: one\nb: two\nc: three");
    /* a list added to a list: what the first dropped is counted on */
    dt_errlist_add(&l, "d: four\n... and 3 more errors (the first 1 are shown)");
    assert_int_equal(dt_errlist_fail(&l, DT_ERR_CONFIG), DT_ERR_CONFIG);
    assert_msg("a: one\nb: two\nc: three\nd: four\n... and 3 more errors (the first 4 are "
               "shown)");
}

/* The table of a plugin the config does not select: checked, not claimed. */
static void test_set_aside(void **state)
{
    (void)state;
    static const dt_config_key_t zkeys[] = {
        {"stage", DT_CFG_INT, NULL, 1, 3, NULL, "required"},
        {"overlap_comm", DT_CFG_BOOL, "true", 0, 0, NULL, "doc"},
    };
    dt_config_t *c = load("[train]\nsteps = 2\n[zero]\noverlap_comm = false\n[other]\na = 1\n");
    assert_int_equal(dt_config_override(c, "fsdp.x=1"), DT_OK);
    assert_int_equal(apply_core(c), DT_OK);
    const char *names[4];
    assert_int_equal(dt_config_unclaimed(c, names, 4), 3);
    assert_string_equal(names[0], "zero");
    assert_string_equal(names[1], "other");
    assert_string_equal(names[2], "fsdp");
    assert_int_equal(dt_config_unclaimed(c, names, 1), 3); /* the count, names cut */
    /* a missing required key is no error: the table is not used */
    assert_int_equal(dt_config_set_aside(c, "zero", zkeys, 2), DT_OK);
    assert_string_equal(dt_config_aside(c, 0), "zero");
    assert_null(dt_config_aside(c, 1));
    assert_false(dt_config_claimed(c, "zero"));
    assert_int_equal(dt_config_get_bool(c, "zero.overlap_comm", &(int){0}), DT_ERR_NOT_FOUND);
    assert_int_equal(dt_config_unclaimed(c, names, 4), 2);
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_ERR_CONFIG);
    assert_msg_starts("t.toml:5:1: unknown table [other]");
    dt_config_free(c);

    /* unknown keys, types and ranges are checked, in the file and in --set */
    c = load("[zero]\nstgae = 1\n");
    assert_int_equal(dt_config_set_aside(c, "zero", zkeys, 2), DT_ERR_CONFIG);
    assert_msg("t.toml:2:1: unknown key 'stgae' in [zero]; did you mean 'stage'?");
    /* set aside all the same: a known table, its errors reported once, not
     * again as an unknown table by a check that goes on */
    assert_string_equal(dt_config_aside(c, 0), "zero");
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_OK);
    dt_config_free(c);
    c = load("[zero]\noverlap_comm = 1\n");
    assert_int_equal(dt_config_set_aside(c, "zero", zkeys, 2), DT_ERR_CONFIG);
    assert_msg("t.toml:2:16: [zero] overlap_comm: expected a boolean, got integer 1");
    dt_config_free(c);
    c = load("");
    assert_int_equal(dt_config_override(c, "zero.stage=4"), DT_OK);
    assert_int_equal(dt_config_set_aside(c, "zero", zkeys, 2), DT_ERR_CONFIG);
    assert_msg("--set zero.stage=4: [zero] stage = 4 is out of range (allowed 1 .. 3)");
    dt_config_free(c);

    /* claimed after being set aside: resolved, no longer aside */
    c = load("[zero]\nstage = 2\n");
    assert_int_equal(dt_config_set_aside(c, "zero", zkeys, 2), DT_OK);
    assert_int_equal(dt_config_set_aside(c, "zero", zkeys, 2), DT_OK); /* once in the list */
    assert_null(dt_config_aside(c, 1));
    assert_int_equal(dt_config_apply_schema(c, "zero", zkeys, 2), DT_OK);
    assert_null(dt_config_aside(c, 0));
    int64_t stage = 0;
    assert_int_equal(dt_config_get_int(c, "zero.stage", &stage), DT_OK);
    assert_int_equal(stage, 2);
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_OK);
    dt_config_free(c);
    /* ... the others keep their order */
    c = load("[a]\nstage = 1\n[b]\nstage = 1\n[d]\nstage = 1\n");
    assert_int_equal(dt_config_set_aside(c, "a", zkeys, 2), DT_OK);
    assert_int_equal(dt_config_set_aside(c, "b", zkeys, 2), DT_OK);
    assert_int_equal(dt_config_set_aside(c, "d", zkeys, 2), DT_OK);
    assert_int_equal(dt_config_apply_schema(c, "a", zkeys, 2), DT_OK);
    assert_string_equal(dt_config_aside(c, 0), "b");
    assert_string_equal(dt_config_aside(c, 1), "d");
    assert_null(dt_config_aside(c, 2));
    dt_config_free(c);
}

static void test_wrong_type(void **state)
{
    (void)state;
    expect_apply_error("[train]\nlr = \"abc\"\n", "train", DT_ERR_CONFIG,
                       "t.toml:2:6: [train] lr: expected a float, got string \"abc\"");
    expect_apply_error("[train]\nsteps = 2.5\n", "train", DT_ERR_CONFIG,
                       "t.toml:2:9: [train] steps: expected an integer, got float 2.5");
    expect_apply_error("[data]\nshuffle = 1\n", "data", DT_ERR_CONFIG,
                       "t.toml:2:11: [data] shuffle: expected a boolean, got integer 1");
    expect_apply_error("[run]\nname = true\n", "run", DT_ERR_CONFIG,
                       "t.toml:2:8: [run] name: expected a string, got boolean true");
    expect_apply_error("[train]\nlr = [1, 2]\n", "train", DT_ERR_CONFIG,
                       "t.toml:2:6: [train] lr: expected a float, got an array");
    expect_apply_error("[train]\nlr = 2024-01-01\n", "train", DT_ERR_CONFIG,
                       "t.toml:2:6: [train] lr: expected a float, got a date");
    expect_apply_error("[train]\nlr = { a = 1 }\n", "train", DT_ERR_CONFIG,
                       "t.toml:2:6: [train] lr: nested tables are not allowed in "
                       "[train] (no [train.lr] headers or dotted keys 'lr.x = ...'; "
                       "every key is a plain value)");

    /* A float key takes an integer literal. */
    dt_config_t *c = load("[train]\nlr = 1\n");
    assert_int_equal(apply(c, "train"), DT_OK);
    double f;
    assert_int_equal(dt_config_get_float(c, "train.lr", &f), DT_OK);
    assert_true(f == 1.0);
    dt_config_free(c);
}

static void test_range(void **state)
{
    (void)state;
    expect_apply_error("[train]\nsteps = 0\n", "train", DT_ERR_CONFIG,
                       "t.toml:2:9: [train] steps = 0 is out of range "
                       "(allowed 1 .. 1000000000)");
    expect_apply_error("[optimizer]\nbeta1 = 1.0\n", "optimizer", DT_ERR_CONFIG,
                       "t.toml:2:9: [optimizer] beta1 = 1.0 is out of range "
                       "(allowed 0 .. 0.999999999)");
    expect_apply_error("[train]\nlr = -1e-3\n", "train", DT_ERR_CONFIG,
                       "t.toml:2:6: [train] lr = -0.001 is out of range "
                       "(allowed 0 .. 10)");
    expect_apply_error("[train]\nlr = nan\n", "train", DT_ERR_CONFIG,
                       "t.toml:2:6: [train] lr = nan is out of range "
                       "(allowed 0 .. 10)");
    expect_apply_error("[launch]\ntimeout = 0\n", "launch", DT_ERR_CONFIG,
                       "t.toml:2:11: [launch] timeout = 0.0 is out of range "
                       "(allowed 0.001 .. 1000000)");
    expect_apply_error("[run]\nseed = 2147483648\n", "run", DT_ERR_CONFIG,
                       "t.toml:2:8: [run] seed = 2147483648 is out of range "
                       "(allowed 0 .. 2147483647)");
    /* The edges are inside. */
    dt_config_t *c = load("[run]\nseed = 2147483647\n[launch]\nmaster_port = 0\n");
    assert_int_equal(apply(c, "run"), DT_OK);
    assert_int_equal(apply(c, "launch"), DT_OK);
    dt_config_free(c);
}

static void test_enum(void **state)
{
    (void)state;
    expect_apply_error("[model]\ndtype = \"fp61\"\n", "model", DT_ERR_CONFIG,
                       "t.toml:2:9: [model] dtype = \"fp61\" is not one of "
                       "\"fp32\", \"bf16\", \"fp16\"; did you mean \"fp16\"?");
    expect_apply_error("[optimizer]\ntype = \"lion\"\n", "optimizer", DT_ERR_CONFIG,
                       "t.toml:2:8: [optimizer] type = \"lion\" is not one of "
                       "\"adamw\", \"sgd\"");
    expect_apply_error("[model]\ndtype = 16\n", "model", DT_ERR_CONFIG,
                       "t.toml:2:9: [model] dtype: expected one of \"fp32\", "
                       "\"bf16\", \"fp16\", got integer 16");
    dt_config_t *c = load("[model]\ndtype = \"bf16\"\npreset = \"gpt2-124m\"\n");
    assert_int_equal(apply(c, "model"), DT_OK);
    const char *s;
    assert_int_equal(dt_config_get_string(c, "model.preset", &s), DT_OK);
    assert_string_equal(s, "gpt2-124m");
    dt_config_free(c);
}

static const dt_config_key_t zero_keys[] = {
    {"stage", DT_CFG_INT, NULL, 1, 3, NULL, "ZeRO stage"},
    {"overlap", DT_CFG_BOOL, "true", 1, 0, NULL, "overlap comm"},
};

static void test_required(void **state)
{
    (void)state;
    dt_config_t *c = load("[zero]\noverlap = false\n");
    assert_int_equal(dt_config_apply_schema(c, "zero", zero_keys, 2), DT_ERR_CONFIG);
    assert_msg("t.toml:1:1: required key 'zero.stage' is missing (add "
                  "'stage = ...' under [zero] or pass --set zero.stage=VALUE)");
    dt_config_free(c);

    c = load("[train]\n");
    assert_int_equal(dt_config_apply_schema(c, "zero", zero_keys, 2), DT_ERR_CONFIG);
    assert_msg_has("t.toml: required key 'zero.stage' is missing");
    dt_config_free(c);

    /* Given by --set: fine, and the override is range-checked. */
    c = load("");
    assert_int_equal(dt_config_override(c, "zero.stage=2"), DT_OK);
    assert_int_equal(dt_config_apply_schema(c, "zero", zero_keys, 2), DT_OK);
    int64_t i;
    assert_int_equal(dt_config_get_int(c, "zero.stage", &i), DT_OK);
    assert_int_equal(i, 2);
    /* Applying the same schema again is allowed; other keys are not. */
    assert_int_equal(dt_config_apply_schema(c, "zero", zero_keys, 2), DT_OK);
    assert_int_equal(dt_config_apply_schema(c, "zero", zero_keys, 1), DT_ERR_INVALID);
    assert_msg_has("config table [zero] was already claimed with other keys");
    dt_config_free(c);
}

static void test_bad_schema(void **state)
{
    (void)state;
    static const dt_config_key_t bad_default[] = {
        {"n", DT_CFG_INT, "\"x\"", 1, 0, NULL, "doc"}};
    static const dt_config_key_t dup[] = {
        {"n", DT_CFG_INT, "1", 1, 0, NULL, "doc"},
        {"n", DT_CFG_INT, "1", 1, 0, NULL, "doc"}};
    static const dt_config_key_t no_choices[] = {
        {"e", DT_CFG_ENUM, "\"a\"", 1, 0, NULL, "doc"}};
    static const dt_config_key_t default_out_of_range[] = {
        {"n", DT_CFG_INT, "9", 1, 3, NULL, "doc"}};
    dt_config_t *c = NULL;
    assert_int_equal(dt_config_new(&c), DT_OK);
    assert_int_equal(dt_config_apply_schema(c, "p", bad_default, 1), DT_ERR_INVALID);
    assert_msg("config schema for [p] (default): [p] n: expected an integer, "
                  "got string \"x\"");
    assert_int_equal(dt_config_apply_schema(c, "p", dup, 2), DT_ERR_INVALID);
    assert_msg("config schema for [p]: key 'n' declared twice");
    assert_int_equal(dt_config_apply_schema(c, "p", no_choices, 1), DT_ERR_INVALID);
    assert_msg("config schema for [p]: enum key 'e' has no choices");
    assert_int_equal(dt_config_apply_schema(c, "p", default_out_of_range, 1),
                     DT_ERR_INVALID);
    assert_msg_has("n = 9 is out of range (allowed 1 .. 3)");
    /* A failed apply claims nothing. */
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_OK);
    int64_t i;
    assert_int_equal(dt_config_get_int(c, "p.n", &i), DT_ERR_NOT_FOUND);
    dt_config_free(c);
}

static void test_nested(void **state)
{
    (void)state;
    expect_apply_error("[train]\nsteps = 1\n[train.sub]\nx = 1\n", "train",
                       DT_ERR_CONFIG,
                       "t.toml:3:1: [train] sub: nested tables are not allowed in "
                       "[train] (no [train.sub] headers or dotted keys 'sub.x = ...'; "
                       "every key is a plain value)");
    expect_apply_error("[train]\noptim.beta1 = 0.9\n", "train", DT_ERR_CONFIG,
                       "t.toml:2:1: [train] optim: nested tables are not allowed in "
                       "[train] (no [train.optim] headers or dotted keys "
                       "'optim.x = ...'; every key is a plain value)");
    expect_apply_error("[[train]]\nsteps = 1\n[[train]]\nsteps = 2\n", "train",
                       DT_ERR_CONFIG,
                       "t.toml:1:1: [[train]] is an array of tables; [train] must "
                       "be a single table");
    expect_apply_error("train = 5\n", "train", DT_ERR_CONFIG,
                       "t.toml:1:1: 'train' must be a table ([train]), got integer 5");
}

static void test_override_values(void **state)
{
    (void)state;
    dt_config_t *c = load("[train]\nsteps = 50\n");
    assert_int_equal(dt_config_override(c, "train.steps=7"), DT_OK);
    assert_int_equal(dt_config_override(c, "train.lr=3e-4"), DT_OK);
    assert_int_equal(dt_config_override(c, "train.min_lr = 0"), DT_OK);
    assert_int_equal(dt_config_override(c, "data.shuffle=false"), DT_OK);
    assert_int_equal(dt_config_override(c, "run.name=\"my \\\"run\\\"\""), DT_OK);
    assert_int_equal(dt_config_override(c, "run.device=cuda"), DT_OK);    /* bare */
    assert_int_equal(dt_config_override(c, "run.out_dir=/tmp/x y"), DT_OK); /* bare */
    assert_int_equal(dt_config_override(c, "run.comm=42"), DT_OK); /* string key */
    assert_int_equal(dt_config_override(c, "model.dtype=bf16"), DT_OK);
    assert_int_equal(dt_config_override(c, "model.n_layer=3"), DT_OK);
    assert_int_equal(dt_config_override(c, "model.n_layer=5"), DT_OK); /* last wins */
    assert_int_equal(dt_config_override(c, "checkpoint.resume="), DT_OK); /* empty */
    assert_int_equal(apply_core(c), DT_OK);
    assert_int_equal(dt_config_check_unclaimed(c, NULL), DT_OK);

    int64_t i;
    double f;
    int b;
    const char *s;
    assert_int_equal(dt_config_get_int(c, "train.steps", &i), DT_OK);
    assert_int_equal(i, 7);
    assert_int_equal(dt_config_origin(c, "train.steps"), DT_ORIGIN_CLI);
    assert_int_equal(dt_config_get_float(c, "train.lr", &f), DT_OK);
    assert_true(f == 3e-4);
    assert_int_equal(dt_config_get_float(c, "train.min_lr", &f), DT_OK);
    assert_true(f == 0.0);
    assert_int_equal(dt_config_get_bool(c, "data.shuffle", &b), DT_OK);
    assert_int_equal(b, 0);
    assert_int_equal(dt_config_get_string(c, "run.name", &s), DT_OK);
    assert_string_equal(s, "my \"run\"");
    assert_int_equal(dt_config_get_string(c, "run.device", &s), DT_OK);
    assert_string_equal(s, "cuda");
    assert_int_equal(dt_config_get_string(c, "run.out_dir", &s), DT_OK);
    assert_string_equal(s, "/tmp/x y");
    assert_int_equal(dt_config_get_string(c, "run.comm", &s), DT_OK);
    assert_string_equal(s, "42");
    assert_int_equal(dt_config_get_string(c, "model.dtype", &s), DT_OK);
    assert_string_equal(s, "bf16");
    assert_int_equal(dt_config_get_int(c, "model.n_layer", &i), DT_OK);
    assert_int_equal(i, 5);
    assert_int_equal(dt_config_get_string(c, "checkpoint.resume", &s), DT_OK);
    assert_string_equal(s, "");
    dt_config_free(c);

    /* Malformed assignments. */
    assert_int_equal(dt_config_new(&c), DT_OK);
    assert_int_equal(dt_config_override(c, "trainlr=1"), DT_ERR_CONFIG);
    assert_msg("--set trainlr=1: expected table.key=value (e.g. --set train.lr=3e-4)");
    assert_int_equal(dt_config_override(c, "train.lr"), DT_ERR_CONFIG);
    assert_msg_has("--set train.lr: expected table.key=value");
    assert_int_equal(dt_config_override(c, "train.=1"), DT_ERR_CONFIG);
    assert_int_equal(dt_config_override(c, ".lr=1"), DT_ERR_CONFIG);
    assert_int_equal(dt_config_override(c, "train.a.b=1"), DT_ERR_CONFIG);
    dt_config_free(c);
}

static void test_override_errors(void **state)
{
    (void)state;
    dt_config_t *c = load("[train]\nlr = 0.1\n");
    assert_int_equal(dt_config_override(c, "train.lr=abc"), DT_OK);
    assert_int_equal(apply(c, "train"), DT_ERR_CONFIG);
    assert_msg("--set train.lr=abc: [train] lr: expected a float, got string \"abc\"");
    dt_config_free(c);

    c = load("");
    assert_int_equal(dt_config_override(c, "train.steps=0"), DT_OK);
    assert_int_equal(apply(c, "train"), DT_ERR_CONFIG);
    assert_msg("--set train.steps=0: [train] steps = 0 is out of range "
                  "(allowed 1 .. 1000000000)");
    dt_config_free(c);

    c = load("");
    assert_int_equal(dt_config_override(c, "train.lrr=1"), DT_OK);
    assert_int_equal(apply(c, "train"), DT_ERR_CONFIG);
    assert_msg("--set train.lrr=1: unknown key 'lrr' in [train]; did you mean 'lr'?");
    dt_config_free(c);

    c = load("");
    assert_int_equal(dt_config_override(c, "model.dtype=fp61"), DT_OK);
    assert_int_equal(apply(c, "model"), DT_ERR_CONFIG);
    assert_msg("--set model.dtype=fp61: [model] dtype = \"fp61\" is not one of "
                  "\"fp32\", \"bf16\", \"fp16\"; did you mean \"fp16\"?");
    dt_config_free(c);

    c = load("");
    assert_int_equal(dt_config_override(c, "trian.lr=1"), DT_OK);
    assert_int_equal(apply_core(c), DT_OK);
    assert_int_equal(dt_config_check_unclaimed(c, "plugin tables are named after "
                                                  "a selected plugin"),
                     DT_ERR_CONFIG);
    assert_msg("--set trian.lr=1: unknown table [trian]; did you mean [train]? "
                  "(plugin tables are named after a selected plugin)");
    dt_config_free(c);

    /* A --set replaces a bad file value instead of tripping over it. */
    c = load("[train]\nlr = \"oops\"\n");
    assert_int_equal(dt_config_override(c, "train.lr=0.5"), DT_OK);
    assert_int_equal(apply(c, "train"), DT_OK);
    dt_config_free(c);
}

/* A --set given after its table was claimed (dtrain plan selecting a
 * strategy's variant) replaces the resolved value at once, with the same
 * checks and messages as one given before. */
static void test_override_after_claim(void **state)
{
    (void)state;
    dt_config_t *c = load("[train]\nsteps = 50\n");
    assert_int_equal(apply_core(c), DT_OK);
    assert_true(dt_config_claimed(c, "train"));
    assert_false(dt_config_claimed(c, "zero"));
    assert_false(dt_config_claimed(NULL, "train"));
    int64_t i;
    const char *s;
    assert_int_equal(dt_config_override(c, "train.steps=7"), DT_OK);
    assert_int_equal(dt_config_get_int(c, "train.steps", &i), DT_OK);
    assert_int_equal(i, 7);
    assert_int_equal(dt_config_origin(c, "train.steps"), DT_ORIGIN_CLI);
    assert_int_equal(dt_config_override(c, "parallel.data=zero"), DT_OK); /* bare */
    assert_int_equal(dt_config_get_string(c, "parallel.data", &s), DT_OK);
    assert_string_equal(s, "zero");
    assert_int_equal(dt_config_override(c, "model.dtype=bf16"), DT_OK);
    assert_int_equal(dt_config_get_string(c, "model.dtype", &s), DT_OK);
    assert_string_equal(s, "bf16");

    /* refused values leave the resolved one as it was */
    assert_int_equal(dt_config_override(c, "train.steps=0"), DT_ERR_CONFIG);
    assert_msg("--set train.steps=0: [train] steps = 0 is out of range "
               "(allowed 1 .. 1000000000)");
    assert_int_equal(dt_config_override(c, "model.dtype=fp61"), DT_ERR_CONFIG);
    assert_msg("--set model.dtype=fp61: [model] dtype = \"fp61\" is not one of "
               "\"fp32\", \"bf16\", \"fp16\"; did you mean \"fp16\"?");
    assert_int_equal(dt_config_override(c, "train.stpes=3"), DT_ERR_CONFIG);
    assert_msg("--set train.stpes=3: unknown key 'stpes' in [train]; did you mean 'steps'?");
    assert_int_equal(dt_config_get_int(c, "train.steps", &i), DT_OK);
    assert_int_equal(i, 7);
    assert_int_equal(dt_config_get_string(c, "model.dtype", &s), DT_OK);
    assert_string_equal(s, "bf16");
    /* a table not claimed yet still waits for its schema */
    assert_int_equal(dt_config_override(c, "zero.stage=9"), DT_OK);
    dt_config_free(c);
}

/* Every core key reaches its typed field, enums included. */
static void test_settings(void **state)
{
    (void)state;
    dt_config_t *c = load("[run]\nname = \"n\"\nseed = 5\nout_dir = \"o\"\n"
                          "plugin_path = \"/p:/q\"\ndevice = \"cuda\"\ncomm = \"nccl\"\n"
                          "log_every = 3\nmetrics = \"m.jsonl\"\n"
                          "[data]\ntrain = \"t.bin\"\nval = \"v.bin\"\nshuffle = false\n"
                          "[train]\nsteps = 11\nmicro_batch = 2\ngrad_accum = 4\n"
                          "global_batch = 16\nseq_len = 32\nlr = 0.25\nmin_lr = 0.125\n"
                          "warmup_steps = 6\ndecay = \"linear\"\ngradient_clipping = 0.5\n"
                          "eval_every = 7\neval_steps = 8\nstop_at = 9\n"
                          "[optimizer]\ntype = \"sgd\"\nbeta1 = 0.5\nbeta2 = 0.75\n"
                          "eps = 0.001\nweight_decay = 0.0625\nmomentum = 0.875\n"
                          "nesterov = true\n"
                          "[parallel]\ndata = \"zero\"\ntensor = 2\npipeline = 3\n"
                          "offload = \"cpu_offload\"\n"
                          "[launch]\nnproc = 4\ntimeout = 1.5\nmaster_addr = \"h\"\n"
                          "master_port = 1234\n"
                          "[checkpoint]\ndir = \"ck\"\nevery = 10\nkeep = 3\n"
                          "resume = \"latest\"\n");
    assert_int_equal(apply_core(c), DT_OK);
    dt_settings_t s;
    assert_ok(dt_settings_read(c, &s));
    assert_string_equal(s.config_path, "");
    assert_string_equal(s.run.name, "n");
    assert_int_equal(s.run.seed, 5);
    assert_string_equal(s.run.out_dir, "o");
    assert_string_equal(s.run.plugin_path, "/p:/q");
    assert_string_equal(s.run.device, "cuda");
    assert_string_equal(s.run.comm, "nccl");
    assert_int_equal(s.run.log_every, 3);
    assert_string_equal(s.run.metrics, "m.jsonl");
    assert_string_equal(s.data.train, "t.bin");
    assert_string_equal(s.data.val, "v.bin");
    assert_int_equal(s.data.shuffle, 0);
    assert_int_equal(s.train.steps, 11);
    assert_int_equal(s.train.micro_batch, 2);
    assert_int_equal(s.train.grad_accum, 4);
    assert_int_equal(s.train.global_batch, 16);
    assert_int_equal(s.train.seq_len, 32);
    assert_true(s.train.lr == 0.25 && s.train.min_lr == 0.125);
    assert_int_equal(s.train.warmup_steps, 6);
    assert_int_equal(s.train.decay, DT_DECAY_LINEAR);
    assert_string_equal(dt_lr_decay_name(s.train.decay), "linear");
    assert_true(s.train.gradient_clipping == 0.5);
    assert_int_equal(s.train.eval_every, 7);
    assert_int_equal(s.train.eval_steps, 8);
    assert_int_equal(s.train.stop_at, 9);
    assert_int_equal(s.optimizer.type, DT_OPTIM_SGD);
    assert_true(s.optimizer.beta1 == 0.5 && s.optimizer.beta2 == 0.75);
    assert_true(s.optimizer.eps == 0.001 && s.optimizer.weight_decay == 0.0625);
    assert_true(s.optimizer.momentum == 0.875);
    assert_int_equal(s.optimizer.nesterov, 1);
    assert_string_equal(s.parallel.data, "zero");
    assert_int_equal(s.parallel.tensor, 2);
    assert_int_equal(s.parallel.pipeline, 3);
    assert_string_equal(s.parallel.offload, "cpu_offload");
    assert_int_equal(s.launch.nproc, 4);
    assert_true(s.launch.timeout_s == 1.5);
    assert_string_equal(s.launch.master_addr, "h");
    assert_int_equal(s.launch.master_port, 1234);
    assert_string_equal(s.checkpoint.dir, "ck");
    assert_int_equal(s.checkpoint.every, 10);
    assert_int_equal(s.checkpoint.keep, 3);
    assert_string_equal(s.checkpoint.resume, "latest");
    dt_config_free(c);

    /* the defaults: AdamW, cosine */
    assert_int_equal(dt_config_new(&c), DT_OK);
    assert_int_equal(apply_core(c), DT_OK);
    assert_ok(dt_settings_read(c, &s));
    assert_int_equal(s.optimizer.type, DT_OPTIM_ADAMW);
    assert_int_equal(s.train.decay, DT_DECAY_COSINE);
    assert_string_equal(dt_lr_decay_name(DT_DECAY_CONSTANT), "constant");
    dt_config_free(c);

    /* sections not applied: the caller's bug, said */
    assert_int_equal(dt_config_new(&c), DT_OK);
    assert_status(dt_settings_read(c, &s), DT_ERR_NOT_FOUND);
    assert_msg("config key 'run.name' was not declared by any schema");
    dt_config_free(c);
}

static void test_provenance_and_print(void **state)
{
    (void)state;
    dt_config_t *c = load("[run]\nname = \"tab\\there\"\n\n[train]\n"
                          "lr = 0.0006\nsteps = 20\n");
    assert_int_equal(dt_config_override(c, "train.micro_batch=4"), DT_OK);
    assert_int_equal(apply_core(c), DT_OK);
    assert_int_equal(dt_config_set_int(c, "train.grad_accum", 2, DT_ORIGIN_DERIVED),
                     DT_OK);

    assert_int_equal(dt_config_origin(c, "train.lr"), DT_ORIGIN_FILE);
    assert_int_equal(dt_config_origin(c, "train.warmup_steps"), DT_ORIGIN_DEFAULT);
    assert_int_equal(dt_config_origin(c, "train.micro_batch"), DT_ORIGIN_CLI);
    assert_int_equal(dt_config_origin(c, "train.grad_accum"), DT_ORIGIN_DERIVED);
    assert_int_equal(dt_config_origin(c, "no.such"), DT_ORIGIN_DEFAULT);

    char *out = print_to_string(c);
    const char *want[] = {
        "[run]\nname = \"tab\\there\"     # file t.toml:2\n",
        "\n[train]\nsteps = 20             # file t.toml:6\n",
        "\nlr = 0.0006            # file t.toml:5\n",
        "\nwarmup_steps = 0       # default\n",
        "\nmicro_batch = 4        # --set\n",
        "\ngrad_accum = 2         # derived\n",
        "\ngradient_clipping = 1.0  # default\n",
        "\nresume = \"\"            # default\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(out, want[i]))
            fail_msg("printout lacks \"%s\":\n%s", want[i], out);
    /* Claim order: [run] first, [checkpoint] last. */
    assert_true(strncmp(out, "[run]\n", 6) == 0);
    assert_true(strstr(out, "[model]") < strstr(out, "[train]"));

    /* The printout is TOML that reads back to the same values. */
    dt_config_t *back = NULL;
    if (dt_config_load_string("printed", out, &back) != DT_OK)
        fail_msg("printout does not parse: %s\n%s", dt_last_error(), out);
    assert_int_equal(apply_core(back), DT_OK);
    assert_true(dt_config_hash(back) == dt_config_hash(c));
    const char *s;
    assert_int_equal(dt_config_get_string(back, "run.name", &s), DT_OK);
    assert_string_equal(s, "tab\there");
    dt_config_free(back);
    free(out);

    /* Setting: undeclared, wrong type, out of range. */
    assert_int_equal(dt_config_set_int(c, "train.nope", 1, DT_ORIGIN_DERIVED),
                     DT_ERR_NOT_FOUND);
    assert_int_equal(dt_config_set_int(c, "run.name", 1, DT_ORIGIN_DERIVED),
                     DT_ERR_INVALID);
    assert_int_equal(dt_config_set_int(c, "train.grad_accum", -1, DT_ORIGIN_DERIVED),
                     DT_ERR_CONFIG);
    assert_msg("[train] grad_accum = -1 (derived) is out of range "
                  "(allowed 0 .. 1048576)");
    int64_t i;
    assert_int_equal(dt_config_get_int(c, "train.grad_accum", &i), DT_OK);
    assert_int_equal(i, 2); /* unchanged by the failed set */

    /* A float, a boolean, an enum choice (what a model preset fills in):
     * set with their origin, checked like the integer. */
    assert_int_equal(dt_config_set_float(c, "model.rope_theta", 5e5, DT_ORIGIN_PRESET), DT_OK);
    assert_int_equal(dt_config_set_bool(c, "model.tie_embeddings", 1, DT_ORIGIN_PRESET), DT_OK);
    assert_int_equal(dt_config_set_choice(c, "model.rope_scaling", "llama3", DT_ORIGIN_PRESET),
                     DT_OK);
    double f;
    int b;
    assert_int_equal(dt_config_get_float(c, "model.rope_theta", &f), DT_OK);
    assert_true(f == 5e5);
    assert_int_equal(dt_config_get_bool(c, "model.tie_embeddings", &b), DT_OK);
    assert_int_equal(b, 1);
    assert_int_equal(dt_config_get_string(c, "model.rope_scaling", &s), DT_OK);
    assert_string_equal(s, "llama3");
    assert_int_equal(dt_config_origin(c, "model.rope_scaling"), DT_ORIGIN_PRESET);
    assert_int_equal(dt_config_set_float(c, "model.rms_norm_eps", 2.0, DT_ORIGIN_PRESET),
                     DT_ERR_CONFIG);
    assert_msg("[model] rms_norm_eps = 2 (preset) is out of range (allowed 0 .. 1)");
    assert_int_equal(dt_config_set_choice(c, "model.rope_scaling", "yarn", DT_ORIGIN_PRESET),
                     DT_ERR_CONFIG);
    assert_msg_has("[model] rope_scaling = \"yarn\" (preset) is not one of ");
    assert_int_equal(dt_config_set_bool(c, "model.rope_theta", 1, DT_ORIGIN_PRESET),
                     DT_ERR_INVALID);
    assert_int_equal(dt_config_set_float(c, "model.qkv_bias", 1.0, DT_ORIGIN_PRESET),
                     DT_ERR_INVALID);
    assert_int_equal(dt_config_set_choice(c, "run.name", "x", DT_ORIGIN_PRESET),
                     DT_ERR_INVALID);
    dt_config_free(c);
}

static void test_hash(void **state)
{
    (void)state;
    /* Same values by different routes (order, file vs --set vs default). */
    dt_config_t *a = load("[train]\nsteps = 20\nlr = 0.001\n[run]\nseed = 1337\n");
    dt_config_t *b = load("[run]\n[train]\nlr = 1e-3\n");
    assert_int_equal(dt_config_override(b, "train.steps=20"), DT_OK);
    dt_config_t *d = load("[train]\nsteps = 20\nlr = 0.001\n[run]\nseed = 1338\n");
    dt_config_t *e = load("[train]\nsteps = 20\nlr = 0.0010000000000000002\n");
    assert_int_equal(apply_core(a), DT_OK);
    assert_int_equal(apply_core(b), DT_OK);
    assert_int_equal(apply_core(d), DT_OK);
    assert_int_equal(apply_core(e), DT_OK);
    uint64_t ha = dt_config_hash(a);
    assert_true(ha == dt_config_hash(a)); /* stable */
    assert_true(ha == dt_config_hash(b));
    assert_true(ha != dt_config_hash(d));
    assert_true(ha != dt_config_hash(e)); /* one ulp apart */
    /* Claim order does not matter. */
    dt_config_t *r = load("[train]\nsteps = 20\nlr = 0.001\n");
    for (uint32_t i = dt_core_n_sections; i-- > 0;)
        assert_int_equal(dt_config_apply_schema(r, dt_core_sections[i].table,
                                                dt_core_sections[i].keys,
                                                dt_core_sections[i].n_keys),
                         DT_OK);
    assert_true(ha == dt_config_hash(r));
    /* A string "1" is not the integer 1. */
    static const dt_config_key_t ks[] = {{"v", DT_CFG_STRING, "\"1\"", 1, 0, NULL, ""}};
    static const dt_config_key_t ki[] = {{"v", DT_CFG_INT, "1", 1, 0, NULL, ""}};
    dt_config_t *x = load(""), *y = load("");
    assert_int_equal(dt_config_apply_schema(x, "p", ks, 1), DT_OK);
    assert_int_equal(dt_config_apply_schema(y, "p", ki, 1), DT_OK);
    assert_true(dt_config_hash(x) != dt_config_hash(y));
    dt_config_free(x);
    dt_config_free(y);
    dt_config_free(a);
    dt_config_free(b);
    dt_config_free(d);
    dt_config_free(e);
    dt_config_free(r);
}

/* ------------------------------------------------------------------------
 * Mutations: truncate, flip, insert and delete bytes of a valid config and
 * push each variant through load + every core schema + unclaimed.  Nothing
 * may crash or leak (run under ASan), and every failure must say where.
 * --------------------------------------------------------------------- */

static const char fuzz_base[] =
    "# base\n"
    "[run]\nname = \"fz\"\nseed = 7\n"
    "[model]\narch = \"gpt2\"\nn_layer = 2\ndtype = \"fp32\"\n"
    "[train]\nsteps = 10\nlr = 3e-4\ngradient_clipping = 1.0\n"
    "[optimizer]\nbeta1 = 0.9\nnesterov = false\n"
    "[data]\nshuffle = true\n"
    "[launch]\nnproc = 2\ntimeout = 30.5\n";

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_mutations(void **state)
{
    (void)state;
    static const char alphabet[] = "[]=.\"'#\n 0123456789aexz_-{},+";
    uint64_t seed = 0x9e3779b97f4a7c15ULL;
    size_t base_len = strlen(fuzz_base);
    char buf[sizeof fuzz_base + 64];
    int n_ok = 0, n_fail = 0;
    for (int iter = 0; iter < 240; iter++) {
        size_t len = base_len;
        memcpy(buf, fuzz_base, base_len + 1);
        int kind = iter % 4;
        size_t pos = (size_t)(rng_next(&seed) % base_len);
        char ch = alphabet[rng_next(&seed) % (sizeof alphabet - 1)];
        if (kind == 0) { /* truncate */
            len = pos;
        } else if (kind == 1) { /* replace */
            buf[pos] = ch;
        } else if (kind == 2) { /* insert */
            memmove(buf + pos + 1, buf + pos, len - pos);
            buf[pos] = ch;
            len++;
        } else { /* delete */
            memmove(buf + pos, buf + pos + 1, len - pos - 1);
            len--;
        }
        buf[len] = '\0';

        dt_config_t *c = NULL;
        dt_err_clear();
        int rc = dt_config_load_string("fz.toml", buf, &c);
        if (rc == DT_OK) {
            /* Some variants also pass their tail as a --set. */
            if (iter % 7 == 0)
                rc = dt_config_override(c, buf + pos);
            if (rc == DT_OK)
                rc = apply_core(c);
            if (rc == DT_OK)
                rc = dt_config_check_unclaimed(c, "hint");
            if (rc == DT_OK) {
                char *out = print_to_string(c);
                dt_config_t *back = NULL;
                if (dt_config_load_string("printed", out, &back) != DT_OK ||
                    apply_core(back) != DT_OK ||
                    dt_config_hash(back) != dt_config_hash(c))
                    fail_msg("variant %d does not print back:\n%s\n%s", iter,
                             dt_last_error(), out);
                dt_config_free(back);
                free(out);
            }
            dt_config_free(c);
        } else {
            assert_null(c);
        }
        if (rc == DT_OK) {
            n_ok++;
            continue;
        }
        n_fail++;
        if (rc != DT_ERR_CONFIG)
            fail_msg("variant %d: status %s: %s\n%s", iter, dt_status_name(rc),
                     dt_last_error(), buf);
        if (!dt_last_error()[0] || !strchr(dt_last_error(), ':'))
            fail_msg("variant %d: message \"%s\" does not say where\n%s", iter,
                     dt_last_error(), buf);
    }
    /* Both outcomes were exercised, or the loop proves little. */
    assert_true(n_ok > 20);
    assert_true(n_fail > 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_suggest),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_syntax_error),
        cmocka_unit_test(test_file_load),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_unknown_table),
        cmocka_unit_test(test_aliases),
        cmocka_unit_test(test_set_aside),
        cmocka_unit_test(test_all_errors_at_once),
        cmocka_unit_test(test_wrong_type),
        cmocka_unit_test(test_range),
        cmocka_unit_test(test_enum),
        cmocka_unit_test(test_required),
        cmocka_unit_test(test_bad_schema),
        cmocka_unit_test(test_nested),
        cmocka_unit_test(test_override_values),
        cmocka_unit_test(test_override_errors),
        cmocka_unit_test(test_override_after_claim),
        cmocka_unit_test(test_settings),
        cmocka_unit_test(test_provenance_and_print),
        cmocka_unit_test(test_hash),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
