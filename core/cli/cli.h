/*
 * core/cli/cli.h - shared pieces of the `dtrain` subcommands.
 *
 * Exit codes are part of the interface: 0 success, 1 runtime failure,
 * 2 usage or configuration error.
 */
#ifndef DT_CLI_H
#define DT_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "dtrain/plugin.h"

enum { DT_EXIT_OK = 0, DT_EXIT_RUNTIME = 1, DT_EXIT_USAGE = 2 };

/* A subcommand: argv[0] is its name. */
typedef struct dt_cli_cmd {
    const char *name;
    const char *summary;
    int (*main)(int argc, char **argv);
    void (*help)(FILE *f);
} dt_cli_cmd_t;

/* Print a config table's keys, one entry each: name, type, default (or
 * "(required)"), range or choices, and the doc line under it (`dtrain
 * config doc` and `dtrain plugins --describe`).  The name column is as
 * wide as the table's longest name, 18 at least. */
void dt_cli_print_keys(FILE *f, const char *table, const dt_config_key_t *keys, uint32_t n);
/* The same keys as markdown, one list item per key on one line ("- `name`
 * (type, default `D`, range LO .. HI, one of `C`): doc"; a required key says
 * "required"): `--markdown`, for docs/config-reference.md. */
void dt_cli_print_keys_md(FILE *f, const char *table, const dt_config_key_t *keys, uint32_t n);

/* Map a dt_status_t to an exit code (config/usage errors -> 2). */
int dt_cli_exit_code(int status);
/* Print "dtrain <cmd>: error: <dt_last_error()>" to stderr, one such line
 * for each line of the message (a config's errors, all at once), and
 * return the exit code for `status`. */
int dt_cli_fail(const char *cmd, int status);
/* This process is rank `rank` of a job of several (< 0: not, the default):
 * its error lines start "[rank R] " from now on, as dtrain's launcher
 * prefixes its ranks' lines (core/launch/launcher.h), so that under mpirun,
 * srun or torchrun, which leave lines as they are, they say whose they
 * are.  (The launcher does not tag a line twice.) */
void dt_cli_set_rank(int rank);
/* "[rank R] ", or "" for a single process: what error lines start with. */
const char *dt_cli_rank_prefix(void);
/* True when argv has -h or --help. */
int dt_cli_wants_help(int argc, char **argv);
/* The whole command line main() got (NULL-terminated), which the launcher
 * gives each rank it starts. */
char *const *dt_cli_argv(void);

/* Parse the options every config-taking command shares: one CONFIG path
 * and any number of `--set table.key=value` (also `--set=...`), plus the
 * command's own options that take one value: `value_opts` is a NULL-ended
 * list ("--metrics"), values[k] receives the value of value_opts[k] (left
 * untouched when absent).  Unknown options are usage errors.  Returns 0,
 * or 2 after printing why. */
typedef struct dt_cli_config_args {
    const char *config;
    const char *sets[256];
    int n_sets;
} dt_cli_config_args_t;
int dt_cli_parse_config_args(const char *cmd, int argc, char **argv,
                             dt_cli_config_args_t *out,
                             const char *const *value_opts, const char **values);

/* A CKPT argument: a checkpoint directory (with manifest.json) as it is,
 * or a checkpoint root, which means its newest complete checkpoint
 * (DT_ERR_NOT_FOUND naming `arg` when it has none). */
int dt_cli_ckpt_dir(const char *arg, char *dir, size_t cap);

int dt_cmd_check(int argc, char **argv);
void dt_help_check(FILE *f);
int dt_cmd_config(int argc, char **argv);
void dt_help_config(FILE *f);
int dt_cmd_plugins(int argc, char **argv);
void dt_help_plugins(FILE *f);
int dt_cmd_env(int argc, char **argv);
void dt_help_env(FILE *f);
int dt_cmd_data(int argc, char **argv);
void dt_help_data(FILE *f);
int dt_cmd_run(int argc, char **argv);
void dt_help_run(FILE *f);
int dt_cmd_bench(int argc, char **argv);
void dt_help_bench(FILE *f);
int dt_cmd_plan(int argc, char **argv);
void dt_help_plan(FILE *f);
int dt_cmd_ckpt(int argc, char **argv);
void dt_help_ckpt(FILE *f);
int dt_cmd_export(int argc, char **argv);
void dt_help_export(FILE *f);
int dt_cmd_import(int argc, char **argv);
void dt_help_import(FILE *f);
int dt_cmd_sample(int argc, char **argv);
void dt_help_sample(FILE *f);
int dt_cmd_eval(int argc, char **argv);
void dt_help_eval(FILE *f);
int dt_cmd_plot(int argc, char **argv);
void dt_help_plot(FILE *f);

#endif /* DT_CLI_H */
