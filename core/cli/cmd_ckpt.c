/*
 * core/cli/cmd_ckpt.c - `dtrain ckpt inspect|consolidate|export` and its
 * shorthand `dtrain export`: offline tools over a saved checkpoint; and
 * `dtrain import`, the way in: a Hugging Face model folder as one (the
 * model plugin that reads its config.json says how: ckpt/hf_model.h).
 */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/cli_model.h"
#include "ckpt/ckpt_io.h"
#include "ckpt/ckpt_tools.h"
#include "ckpt/hf_model.h"
#include "loader/plugin_handle.h"
#include "util/error.h"

void dt_help_ckpt(FILE *f)
{
    fprintf(f,
            "usage: dtrain ckpt inspect CKPT [--verify]\n"
            "       dtrain ckpt consolidate CKPT OUT_ROOT\n"
            "       dtrain ckpt export CKPT OUT.safetensors [--layout hf|dtrain] [--overwrite]\n\n"
            "CKPT is a checkpoint directory (.../step-00000200) or a checkpoint root, which\n"
            "means its newest complete checkpoint.  inspect describes the manifest (--verify\n"
            "also checks every CRC); consolidate rewrites it as one shard under OUT_ROOT;\n"
            "export writes the weights as safetensors: --layout hf, the default, with\n"
            "Hugging Face's tensor names and layout (GPT-2's Conv1D weights as (in, out))\n"
            "and Hugging Face's config.json in the same folder, so the folder loads with\n"
            "transformers' from_pretrained (GPT2LMHeadModel, LlamaForCausalLM or, with\n"
            "q/k/v biases, Qwen2ForCausalLM), named by the model plugin of the\n"
            "checkpoint's arch (it must be on the plugin path); --layout dtrain keeps\n"
            "dtrain's names and (out, in) weights, without config.json.\n"
            "OUT's folder is made if missing.  A config.json already there that is not\n"
            "the one this export writes (another model's) is replaced only with\n"
            "--overwrite.  Only a regular file is ever replaced: a folder, a link, a FIFO\n"
            "or a device at OUT or config.json is an error.  Memory stays bounded by the\n"
            "largest tensor.\n"
            "exit codes: 0 done, 1 unreadable or corrupt checkpoint or an output that\n"
            "cannot be written, 2 usage error or a config.json not replaced\n");
}

void dt_help_export(FILE *f)
{
    fprintf(f, "usage: dtrain export CKPT OUT.safetensors [--layout hf|dtrain] [--overwrite]\n\n"
               "Same as 'dtrain ckpt export' (see dtrain ckpt --help).\n");
}

int dt_cli_ckpt_dir(const char *arg, char *dir, size_t cap)
{
    char probe[4096];
    struct stat st;
    snprintf(probe, sizeof probe, "%s/manifest.json", arg);
    if (stat(probe, &st) == 0 || stat(arg, &st) != 0) {
        snprintf(dir, cap, "%s", arg);
        return DT_OK;
    }
    uint64_t step;
    int rc = dt_ckpt_latest(arg, dir, cap, &step);
    if (rc != DT_ERR_NOT_FOUND)
        return rc;
    /* a run folder (<out_dir>/<name>): its checkpoints are in ckpt/ */
    char ckpt[4096], probe_dir[4096], hint[4200] = "";
    size_t n = strlen(arg);
    snprintf(ckpt, sizeof ckpt, "%s%sckpt", arg, n && arg[n - 1] == '/' ? "" : "/");
    if (dt_ckpt_latest(ckpt, probe_dir, sizeof probe_dir, &step) == DT_OK)
        snprintf(hint, sizeof hint, "; did you mean '%s'?", ckpt);
    return dt_err_set(DT_ERR_NOT_FOUND,
                      "'%s' is neither a checkpoint (no manifest.json) nor a folder of "
                      "complete checkpoints%s",
                      arg, hint);
}

static int usage(const char *cmd, const char *why)
{
    fprintf(stderr, "dtrain %s: error: %s (see dtrain %s --help)\n", cmd, why, cmd);
    return DT_EXIT_USAGE;
}

/* Split argv into positionals and the options this subcommand knows. */
static int parse(const char *cmd, int argc, char **argv, const char **pos, int n_pos,
                 int *verify, const char **layout, int *overwrite)
{
    int got = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (verify && strcmp(a, "--verify") == 0) {
            *verify = 1;
        } else if (overwrite && strcmp(a, "--overwrite") == 0) {
            *overwrite = 1;
        } else if (layout && strcmp(a, "--layout") == 0) {
            if (++i == argc)
                return usage(cmd, "--layout needs hf or dtrain");
            *layout = argv[i];
        } else if (a[0] == '-' && a[1]) {
            char why[256];
            snprintf(why, sizeof why, "unknown option '%s'", a);
            return usage(cmd, why);
        } else if (got == n_pos) {
            char why[256];
            snprintf(why, sizeof why, "unexpected argument '%s'", a);
            return usage(cmd, why);
        } else {
            pos[got++] = a;
        }
    }
    if (got != n_pos)
        return usage(cmd, "missing arguments");
    return DT_EXIT_OK;
}

static int do_export(const char *cmd, int argc, char **argv)
{
    const char *pos[2], *layout = "hf";
    int overwrite = 0;
    int ec = parse(cmd, argc, argv, pos, 2, NULL, &layout, &overwrite);
    if (ec)
        return ec;
    int lay;
    if (strcmp(layout, "hf") == 0)
        lay = DT_EXPORT_HF;
    else if (strcmp(layout, "dtrain") == 0)
        lay = DT_EXPORT_NATIVE;
    else
        return usage(cmd, "--layout is hf or dtrain");
    char dir[4096];
    int wrote_config = 0, resolved = 0;
    dt_resolved_t r; /* the plugin search path: the model plugin names HF's tensors */
    int rc = dt_cli_ckpt_dir(pos[0], dir, sizeof dir);
    if (!rc && lay == DT_EXPORT_HF && !(rc = dt_resolve_core(NULL, NULL, 0, &r)))
        resolved = 1;
    if (!rc)
        rc = dt_ckpt_export(dir, pos[1], lay, resolved ? r.search : NULL, overwrite,
                            &wrote_config);
    if (resolved)
        dt_resolved_free(&r);
    if (rc)
        return dt_cli_fail(cmd, rc);
    printf("dtrain: exported %s to %s (%s layout)\n", dir, pos[1], layout);
    if (wrote_config) {
        char cfg[4096];
        dt_ckpt_hf_config_path(pos[1], cfg, sizeof cfg);
        printf("dtrain: wrote %s (Hugging Face config)\n", cfg);
    }
    return DT_EXIT_OK;
}

int dt_cmd_export(int argc, char **argv) { return do_export("export", argc, argv); }

void dt_help_import(FILE *f)
{
    fprintf(f,
            "usage: dtrain import HF_FOLDER|WEIGHTS [config.json] OUT_CKPT [--overwrite]\n\n"
            "HF_FOLDER is a model folder; WEIGHTS one .safetensors file or an index\n"
            "(model.safetensors.index.json) with its shards.\n"
            "Write a model saved by Hugging Face transformers (save_pretrained's folder:\n"
            "model.safetensors, or shards model-0000N-of-0000M.safetensors with\n"
            "model.safetensors.index.json, and config.json) as a dtrain checkpoint under\n"
            "the folder OUT_CKPT: OUT_CKPT/step-00000000, written atomically, the\n"
            "parameters from the files and the optimizer's moments zero.  config.json\n"
            "(default: the one in the folder, or beside the file) picks the model plugin\n"
            "(its \"architectures\" or \"model_type\": GPT2LMHeadModel is gpt2;\n"
            "LlamaForCausalLM, Qwen2ForCausalLM and MistralForCausalLM are llama) and\n"
            "gives the [model] keys.  Every config.json setting that changes what the\n"
            "model computes and that dtrain does not compute is refused by name (e.g.\n"
            "GPT-2's scale_attn_weights false, llama's hidden_act other than silu or a\n"
            "sliding_window); see docs/running.md.  Every tensor is checked: a parameter\n"
            "of that shape (F32, BF16 or F16, stored as f32), a buffer (ignored), or a\n"
            "tied LM head equal to the embedding; every parameter must be there.  Tensors\n"
            "stream in 16 MiB chunks (memory does not grow with the model); the\n"
            "checkpoint resumes in any layout.\n"
            "OUT_CKPT must not hold checkpoints already: --overwrite replaces them (they\n"
            "are removed once the import is in place), as checkpoint.overwrite does for\n"
            "a run.\n\n"
            "To fine-tune, resume from it in a config with the same [model] shape:\n"
            "  [checkpoint]\n"
            "  resume = \"OUT_CKPT/step-00000000\"\n"
            "training then starts at step 1 from these weights (with fresh AdamW moments\n"
            "and the config's own schedule), as a fresh run starts from its init.\n"
            "exit codes: 0 done, 1 unreadable weights or a tensor that does not fit,\n"
            "2 usage error, a bad or unsupported config.json, or OUT_CKPT holding\n"
            "checkpoints\n");
}

/* config.json's [model] assignments, by the model plugin that reads it. */
static int import_sets(const char *cfg, char (*sets)[96], int cap, int *n)
{
    dt_resolved_t r;
    int rc = dt_resolve_core(NULL, NULL, 0, &r);
    if (rc)
        return rc;
    dt_plugin_t *p = NULL;
    if (!(rc = dt_hf_model_find(r.search, cfg, &p)))
        rc = dt_hf_model_sets(p->ops, cfg, sets, cap, n);
    if (p)
        dt_plugin_unload(p);
    dt_resolved_free(&r);
    return rc;
}

int dt_cmd_import(int argc, char **argv)
{
    const char *pos[3] = {NULL, NULL, NULL};
    int n = 0, overwrite = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--overwrite") == 0) {
            overwrite = 1;
            continue;
        }
        if (argv[i][0] == '-' && argv[i][1]) {
            char why[256];
            snprintf(why, sizeof why, "unknown option '%s'", argv[i]);
            return usage("import", why);
        }
        if (n == 3)
            return usage("import", "too many arguments");
        pos[n++] = argv[i];
    }
    if (n < 2)
        return usage("import", "need HF_FOLDER (or WEIGHTS.safetensors) and OUT_CKPT");
    const char *weights = pos[0], *out = pos[n - 1];
    char cfg[4096];
    struct stat st;
    if (n == 3)
        snprintf(cfg, sizeof cfg, "%s", pos[1]);
    else if (stat(weights, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(cfg, sizeof cfg, "%s/config.json", weights);
    else
        dt_ckpt_hf_config_path(weights, cfg, sizeof cfg);
    char sets[DT_MODEL_MAX_KEYS + 1][96], origin[4200], said[(DT_MODEL_MAX_KEYS + 1) * 97] = "";
    const char *setp[DT_MODEL_MAX_KEYS + 1];
    int n_sets = 0;
    int rc = import_sets(cfg, sets, DT_MODEL_MAX_KEYS + 1, &n_sets);
    if (rc)
        return dt_cli_fail("import", rc);
    for (int i = 0; i < n_sets; i++) {
        setp[i] = sets[i];
        size_t len = strlen(said);
        snprintf(said + len, sizeof said - len, "%s%s", i ? " " : "",
                 strncmp(sets[i], "model.", 6) == 0 ? sets[i] + 6 : sets[i]);
    }
    snprintf(origin, sizeof origin, "'%s'", cfg);
    dt_cli_model_t cm;
    if ((rc = dt_cli_model_open(&cm, setp, n_sets, origin)))
        return dt_cli_fail("import", rc);
    rc = dt_ckpt_import(weights, cm.model, out, overwrite);
    dt_cli_model_close(&cm);
    if (rc)
        return dt_cli_fail("import", rc);
    printf("dtrain: imported %s (%s) as %s/step-00000000\n"
           "dtrain: to fine-tune, set [checkpoint] resume = \"%s/step-00000000\" with that "
           "[model]\n",
           weights, said, out, out);
    return DT_EXIT_OK;
}

int dt_cmd_ckpt(int argc, char **argv)
{
    if (argc < 2)
        return usage("ckpt", "missing action: inspect, consolidate or export");
    const char *act = argv[1];
    char dir[4096];
    int rc;
    if (strcmp(act, "inspect") == 0) {
        const char *pos[1];
        int verify = 0;
        int ec = parse("ckpt inspect", argc - 1, argv + 1, pos, 1, &verify, NULL, NULL);
        if (ec)
            return ec;
        if (!(rc = dt_cli_ckpt_dir(pos[0], dir, sizeof dir)))
            rc = dt_ckpt_inspect(dir, verify, stdout);
        return rc ? dt_cli_fail("ckpt inspect", rc) : DT_EXIT_OK;
    }
    if (strcmp(act, "consolidate") == 0) {
        const char *pos[2];
        int ec = parse("ckpt consolidate", argc - 1, argv + 1, pos, 2, NULL, NULL, NULL);
        if (ec)
            return ec;
        if (!(rc = dt_cli_ckpt_dir(pos[0], dir, sizeof dir)))
            rc = dt_ckpt_consolidate(dir, pos[1], 0);
        if (rc)
            return dt_cli_fail("ckpt consolidate", rc);
        printf("dtrain: consolidated %s into one shard under %s\n", dir, pos[1]);
        return DT_EXIT_OK;
    }
    if (strcmp(act, "export") == 0)
        return do_export("ckpt export", argc - 1, argv + 1);
    char why[256];
    snprintf(why, sizeof why, "unknown action '%s': inspect, consolidate or export", act);
    return usage("ckpt", why);
}
