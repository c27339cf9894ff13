/*
 * core/cli/cmd_plugins.c - `dtrain plugins [--describe NAME [--markdown]]`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "loader/loader.h"
#include "util/error.h"

void dt_help_plugins(FILE *f)
{
    fprintf(f,
            "usage: dtrain plugins [--describe NAME [--markdown]] [--path DIRS]\n\n"
            "List every plugin module (dtrain_<name>.so) on the search path with its\n"
            "kind, ABI, version and whether it loads (and why not).  --describe NAME\n"
            "prints the keys of the plugin's config table [NAME] with type, default,\n"
            "allowed values and documentation (--markdown: as markdown, one list\n"
            "item per key).  Exits 1 when no plugin is found.\n\n"
            "Search path, in order: $DTRAIN_PLUGIN_PATH, --path (as run.plugin_path\n"
            "in a config), then dtrain's own plugins: the build tree's for a dtrain\n"
            "run from its build tree, else ../lib/dtrain/plugins beside the\n"
            "installed dtrain program.\n");
}

static int describe(const char *name, const dt_search_path_t *sp, int md)
{
    dt_plugin_listing_t *ls = NULL;
    size_t n = 0;
    int rc = dt_plugin_discover(sp, &ls, &n);
    if (rc)
        return dt_cli_fail("plugins", rc);
    int kind = -1;
    for (size_t i = 0; i < n; i++)
        if (strcmp(ls[i].name, name) == 0)
            kind = ls[i].kind;
    free(ls);
    if (kind < 0) {
        char where[2048] = "";
        for (size_t i = 0; i < dt_search_path_count(sp); i++) {
            size_t l = strlen(where);
            snprintf(where + l, sizeof where - l, "%s%s", i ? ", " : "",
                     dt_search_path_dir(sp, i));
        }
        return dt_cli_fail("plugins", dt_err_set(DT_ERR_NOT_FOUND,
                                                 "plugin '%s' not found in: %s (files are "
                                                 "named dtrain_<name>.so)",
                                                 name, where));
    }
    dt_plugin_t *p = NULL;
    if ((rc = dt_plugin_open(sp, kind, name, &p)))
        return dt_cli_fail("plugins", rc);
    const dt_plugin_info_t *in = p->info;
    if (md) {
        printf("### %s\n\n%s plugin, ABI %u.%u, version %s: %s\n\n", in->name,
               dt_kind_name(kind), in->abi_major, in->abi_minor, in->version ? in->version : "?",
               in->summary ? in->summary : "");
        dt_cli_print_keys_md(stdout, in->name, in->config_keys, in->n_config_keys);
        dt_plugin_unload(p);
        return DT_EXIT_OK;
    }
    printf("%s: %s plugin, ABI %u.%u, version %s\n  %s\n  file: %s\n\n", in->name,
           dt_kind_name(kind), in->abi_major, in->abi_minor, in->version ? in->version : "?",
           in->summary ? in->summary : "", p->path);
    dt_cli_print_keys(stdout, in->name, in->config_keys, in->n_config_keys);
    dt_plugin_unload(p);
    return DT_EXIT_OK;
}

int dt_cmd_plugins(int argc, char **argv)
{
    const char *desc = NULL, *path = NULL;
    int md = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--describe") == 0 && i + 1 < argc) {
            desc = argv[++i];
        } else if (strcmp(argv[i], "--markdown") == 0) {
            md = 1;
        } else if (strcmp(argv[i], "--path") == 0 && i + 1 < argc) {
            path = argv[++i];
        } else {
            fprintf(stderr, "dtrain plugins: error: unexpected argument '%s' "
                            "(see dtrain plugins --help)\n", argv[i]);
            return DT_EXIT_USAGE;
        }
    }
    dt_search_path_t *sp = NULL;
    int rc = dt_search_path_new(path, &sp);
    if (rc)
        return dt_cli_fail("plugins", rc);
    if (md && !desc) {
        dt_search_path_free(sp);
        fprintf(stderr, "dtrain plugins: error: --markdown needs --describe NAME "
                        "(see dtrain plugins --help)\n");
        return DT_EXIT_USAGE;
    }
    if (desc) {
        int ec = describe(desc, sp, md);
        dt_search_path_free(sp);
        return ec;
    }

    dt_plugin_listing_t *ls = NULL;
    size_t n = 0;
    rc = dt_plugin_discover(sp, &ls, &n);
    if (rc) {
        dt_search_path_free(sp);
        return dt_cli_fail("plugins", rc);
    }
    if (n == 0) {
        /* Nothing to list is a failure: usually an install whose plugins
         * went elsewhere, or a DTRAIN_PLUGIN_PATH with a typo. */
        fprintf(stderr, "dtrain plugins: error: no plugins found in:");
        for (size_t i = 0; i < dt_search_path_count(sp); i++)
            fprintf(stderr, "%s %s", i ? "," : "", dt_search_path_dir(sp, i));
        fprintf(stderr, " (files are named dtrain_<name>.so; add folders with "
                        "DTRAIN_PLUGIN_PATH or --path)\n");
        free(ls);
        dt_search_path_free(sp);
        return DT_EXIT_RUNTIME;
    }
    printf("search path:");
    for (size_t i = 0; i < dt_search_path_count(sp); i++)
        printf("%s %s", i ? "," : "", dt_search_path_dir(sp, i));
    /* the NAME column as wide as the longest name (offload_nvme) */
    int w = 10;
    for (size_t i = 0; i < n; i++)
        if ((int)strlen(ls[i].name) > w)
            w = (int)strlen(ls[i].name);
    printf("\n\n%-*s %-9s %-5s %-8s %-10s %s\n", w, "NAME", "KIND", "ABI", "VERSION", "STATUS",
           "PATH");
    for (size_t i = 0; i < n; i++) {
        char abi[16];
        snprintf(abi, sizeof abi, "%u.%u", ls[i].abi_major, ls[i].abi_minor);
        printf("%-*s %-9s %-5s %-8s %-10s %s\n", w, ls[i].name,
               ls[i].kind >= 0 ? dt_kind_name(ls[i].kind) : "?", ls[i].kind >= 0 ? abi : "-",
               ls[i].version[0] ? ls[i].version : "-", ls[i].loadable ? "loadable" : "BROKEN",
               ls[i].path);
        if (!ls[i].loadable)
            printf("           why: %s\n", ls[i].why);
    }
    free(ls);
    dt_search_path_free(sp);
    return DT_EXIT_OK;
}
