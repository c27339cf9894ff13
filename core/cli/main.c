/*
 * core/cli/main.c - `dtrain`: dispatch to subcommands, shared option
 * parsing and exit codes.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "dtrain/dtrain.h"
#include "util/error.h"

static const dt_cli_cmd_t cmds[] = {
    {"run", "train a model described by a config file", dt_cmd_run, dt_help_run},
    {"check", "validate a config and print it resolved, with each value's origin",
     dt_cmd_check, dt_help_check},
    {"config", "document the core's config keys (config doc [SECTION])", dt_cmd_config,
     dt_help_config},
    {"plugins", "list plugins found on the search path, or describe one",
     dt_cmd_plugins, dt_help_plugins},
    {"env", "report compiler, libraries, GPUs and plugins", dt_cmd_env, dt_help_env},
    {"data", "prepare token files from text", dt_cmd_data, dt_help_data},
    {"plan", "predict per-rank memory and communication for every strategy", dt_cmd_plan,
     dt_help_plan},
    {"ckpt", "inspect, consolidate or export a checkpoint", dt_cmd_ckpt, dt_help_ckpt},
    {"export", "write a checkpoint's weights as safetensors (GPT-2 names)", dt_cmd_export,
     dt_help_export},
    {"import", "write Hugging Face GPT-2 weights as a checkpoint to fine-tune", dt_cmd_import,
     dt_help_import},
    {"sample", "generate text from a checkpoint's GPT-2 (KV cache)", dt_cmd_sample,
     dt_help_sample},
    {"eval", "loss and perplexity of a checkpoint on a token file", dt_cmd_eval,
     dt_help_eval},
    {"bench", "measure a communicator's collectives (nccl-tests style)", dt_cmd_bench,
     dt_help_bench},
    {"plot", "draw a metrics file (loss, lr, tokens/s, norm, memory) with gnuplot",
     dt_cmd_plot, dt_help_plot},
};

static char **g_argv;

char *const *dt_cli_argv(void) { return g_argv; }

static void usage(FILE *f)
{
    fprintf(f, "usage: dtrain <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        fprintf(f, "  %-9s %s\n", cmds[i].name, cmds[i].summary);
    fprintf(f, "\n'dtrain <command> --help' describes a command.\n"
               "exit codes: 0 ok, 1 runtime failure, 2 usage or config error\n");
}

int dt_cli_exit_code(int status)
{
    switch (status) {
    case DT_OK: return DT_EXIT_OK;
    case DT_ERR_CONFIG: return DT_EXIT_USAGE;
    default: return DT_EXIT_RUNTIME;
    }
}

static char rank_prefix[32]; /* "[rank 3] " or "" */

void dt_cli_set_rank(int rank)
{
    if (rank < 0)
        rank_prefix[0] = '\0';
    else
        snprintf(rank_prefix, sizeof rank_prefix, "[rank %d] ", rank);
}

const char *dt_cli_rank_prefix(void)
{
    return rank_prefix;
}

int dt_cli_fail(const char *cmd, int status)
{
    const char *msg = dt_last_error();
    if (!msg[0])
        msg = dt_status_name(status);
    /* a message of several errors (a config's, util/error.h dt_errlist):
     * one prefixed line each */
    do {
        int n = (int)strcspn(msg, "\n");
        fprintf(stderr, "%sdtrain %s: error: %.*s\n", rank_prefix, cmd, n, msg);
        msg += n + (msg[n] == '\n');
    } while (*msg);
    return dt_cli_exit_code(status);
}

int dt_cli_wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
            return 1;
    return 0;
}

int dt_cli_parse_config_args(const char *cmd, int argc, char **argv,
                             dt_cli_config_args_t *out,
                             const char *const *value_opts, const char **values)
{
    memset(out, 0, sizeof *out);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *set = NULL;
        if (strcmp(a, "--set") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%sdtrain %s: error: --set needs table.key=value\n",
                        rank_prefix, cmd);
                return DT_EXIT_USAGE;
            }
            set = argv[++i];
        } else if (strncmp(a, "--set=", 6) == 0) {
            set = a + 6;
        }
        if (set) {
            if (out->n_sets == (int)(sizeof out->sets / sizeof out->sets[0])) {
                fprintf(stderr, "%sdtrain %s: error: too many --set options\n", rank_prefix,
                        cmd);
                return DT_EXIT_USAGE;
            }
            out->sets[out->n_sets++] = set;
            continue;
        }
        int matched = 0;
        for (int k = 0; value_opts && value_opts[k]; k++) {
            if (strcmp(a, value_opts[k]) != 0)
                continue;
            if (i + 1 >= argc) {
                fprintf(stderr, "%sdtrain %s: error: %s needs a value\n", rank_prefix, cmd, a);
                return DT_EXIT_USAGE;
            }
            values[k] = argv[++i];
            matched = 1;
        }
        if (matched)
            continue;
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "%sdtrain %s: error: unknown option '%s' (see dtrain %s --help)\n",
                    rank_prefix, cmd, a, cmd);
            return DT_EXIT_USAGE;
        }
        if (out->config) {
            fprintf(stderr, "%sdtrain %s: error: more than one config file ('%s', '%s')\n",
                    rank_prefix, cmd, out->config, a);
            return DT_EXIT_USAGE;
        }
        out->config = a;
    }
    if (!out->config) {
        fprintf(stderr, "%sdtrain %s: error: missing CONFIG (see dtrain %s --help)\n",
                rank_prefix, cmd, cmd);
        return DT_EXIT_USAGE;
    }
    return DT_EXIT_OK;
}

static int dispatch(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return DT_EXIT_USAGE;
    }
    const char *c = argv[1];
    if (strcmp(c, "-h") == 0 || strcmp(c, "--help") == 0 || strcmp(c, "help") == 0) {
        usage(stdout);
        return DT_EXIT_OK;
    }
    if (strcmp(c, "--version") == 0 || strcmp(c, "version") == 0) {
        printf("dtrain %s\n", DTRAIN_VERSION_STRING);
        return DT_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        if (strcmp(c, cmds[i].name) != 0)
            continue;
        if (dt_cli_wants_help(argc - 1, argv + 1)) {
            cmds[i].help(stdout);
            return DT_EXIT_OK;
        }
        return cmds[i].main(argc - 1, argv + 1);
    }
    fprintf(stderr, "dtrain: error: unknown command '%s'\n\n", c);
    usage(stderr);
    return DT_EXIT_USAGE;
}

/* Output is flushed before main returns: a sanitizer's report at exit (a
 * leak in a library `dtrain env` loaded) ends the process with _exit, and
 * whatever stdio still buffered for a pipe would be lost. */
int main(int argc, char **argv)
{
    g_argv = argv;
    int rc = dispatch(argc, argv);
    fflush(stdout);
    fflush(stderr);
    return rc;
}
