/*
 * core/cli/cmd_config.c - `dtrain config doc [--markdown] [SECTION]`: every
 * key of the core's sections with its type, default, range and doc; and the
 * key table printers (text, and markdown for docs/config-reference.md) it
 * shares with `dtrain plugins --describe`, so the core's keys and a
 * plugin's read the same.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "config/config.h"
#include "util/error.h"

/* `text` on lines of at most 76 columns, broken at spaces. */
static void print_wrapped(FILE *f, const char *text)
{
    const char *p = text;
    while (*p) {
        size_t n = strlen(p);
        if (n > 76) {
            n = 76;
            while (n > 0 && p[n] != ' ')
                n--;
            if (n == 0)
                n = strcspn(p, " ");
        }
        fprintf(f, "%.*s\n", (int)n, p);
        p += n;
        while (*p == ' ')
            p++;
    }
}

void dt_help_config(FILE *f)
{
    /* the sections from the schema itself, so the list cannot fall behind */
    char text[1024] = "Print every key of the core's config sections (or of SECTION:";
    for (uint32_t t = 0; t < dt_core_n_sections; t++) {
        size_t len = strlen(text);
        snprintf(text + len, sizeof text - len, " %s%s", dt_core_sections[t].table,
                 t + 1 < dt_core_n_sections ? "," : ")");
    }
    size_t len = strlen(text);
    snprintf(text + len, sizeof text - len, "%s",
             " with its type, default, allowed range or values, and documentation.  A "
             "plugin's keys: dtrain plugins --describe NAME.  --markdown prints the same as "
             "markdown, one list item per key (scripts/gen-config-reference.sh).");
    fprintf(f, "usage: dtrain config doc [--markdown] [SECTION]\n\n");
    print_wrapped(f, text);
    fprintf(f, "exit codes: 0 printed, 2 usage error (an unknown section)\n");
}

static const char *type_name(int t)
{
    switch (t) {
    case DT_CFG_BOOL: return "bool";
    case DT_CFG_INT: return "int";
    case DT_CFG_FLOAT: return "float";
    case DT_CFG_STRING: return "string";
    case DT_CFG_ENUM: return "enum";
    default: return "?";
    }
}

/* An int key's bound in full (1000000000, never 1e+09: one format for
 * every int); a float's as the shortest %g that reads back as v (6e-4, not
 * 0.000600000000000000012). */
static const char *shortest(double v, int is_int, char *buf, size_t n)
{
    if (is_int && v > -9007199254740992.0 && v < 9007199254740992.0) {
        snprintf(buf, n, "%.0f", v);
        return buf;
    }
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    return buf;
}

void dt_cli_print_keys(FILE *f, const char *table, const dt_config_key_t *keys, uint32_t n)
{
    if (n == 0) {
        fprintf(f, "[%s] takes no keys.\n", table);
        return;
    }
    /* the name column as wide as the table's longest name (18 at least),
     * so every key's type and default start at one column */
    int width = 18;
    for (uint32_t i = 0; i < n; i++) {
        size_t len = keys[i].name ? strlen(keys[i].name) : 0;
        if (len > (size_t)width)
            width = len < 200 ? (int)len : 200;
    }
    fprintf(f, "[%s]\n", table);
    for (uint32_t i = 0; i < n; i++) {
        const dt_config_key_t *k = &keys[i];
        fprintf(f, "  %-*s %-6s default %s", width, k->name ? k->name : "?",
                type_name(k->type), k->def ? k->def : "(required)");
        /* min = max = 0, or min > max: no range (dtrain/plugin.h) */
        if ((k->type == DT_CFG_INT || k->type == DT_CFG_FLOAT) && k->min <= k->max &&
            !(k->min == 0 && k->max == 0))
        {
            char lo[32], hi[32];
            fprintf(f, ", range %s .. %s", shortest(k->min, k->type == DT_CFG_INT, lo, sizeof lo),
                    shortest(k->max, k->type == DT_CFG_INT, hi, sizeof hi));
        }
        if (k->type == DT_CFG_ENUM && k->choices)
            fprintf(f, ", one of %s", k->choices);
        fprintf(f, "\n      %s\n", k->doc ? k->doc : "");
    }
}

/* One list item per key, on one line (docs/config-reference.md wraps
 * them): "- `name` (type, default `D`, range LO .. HI, one of `C`): doc". */
void dt_cli_print_keys_md(FILE *f, const char *table, const dt_config_key_t *keys, uint32_t n)
{
    if (n == 0) {
        fprintf(f, "`[%s]` takes no keys.\n", table);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        const dt_config_key_t *k = &keys[i];
        fprintf(f, "- `%s` (%s, ", k->name ? k->name : "?", type_name(k->type));
        if (!k->def)
            fprintf(f, "required");
        else if (!k->def[0])
            fprintf(f, "default `\"\"`");
        else
            fprintf(f, "default `%s`", k->def);
        if ((k->type == DT_CFG_INT || k->type == DT_CFG_FLOAT) && k->min <= k->max &&
            !(k->min == 0 && k->max == 0))
        {
            char lo[32], hi[32];
            fprintf(f, ", range %s .. %s", shortest(k->min, k->type == DT_CFG_INT, lo, sizeof lo),
                    shortest(k->max, k->type == DT_CFG_INT, hi, sizeof hi));
        }
        if (k->type == DT_CFG_ENUM && k->choices)
            fprintf(f, ", one of `%s`", k->choices);
        fprintf(f, "): %s\n", k->doc ? k->doc : "");
    }
}

static void print_section(const dt_config_section_t *s, int md)
{
    if (md) {
        printf("### [%s]\n\n%s\n\n", s->table, s->doc);
        dt_cli_print_keys_md(stdout, s->table, s->keys, s->n_keys);
        return;
    }
    printf("# %s\n", s->doc);
    dt_cli_print_keys(stdout, s->table, s->keys, s->n_keys);
}

static int doc(const char *section, int md)
{
    if (!section) {
        for (uint32_t i = 0; i < dt_core_n_sections; i++) {
            if (i)
                printf("\n");
            print_section(&dt_core_sections[i], md);
        }
        return DT_EXIT_OK;
    }
    const char *names[64] = {0};
    uint32_t n = 0;
    for (uint32_t i = 0; i < dt_core_n_sections; i++) {
        if (strcmp(dt_core_sections[i].table, section) == 0) {
            print_section(&dt_core_sections[i], md);
            return DT_EXIT_OK;
        }
        if (n < DT_ARRAY_LEN(names))
            names[n++] = dt_core_sections[i].table;
    }
    const char *best = dt_suggest(section, names, n);
    char list[512] = "";
    for (uint32_t i = 0; i < n; i++) {
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", names[i]);
    }
    fprintf(stderr,
            "dtrain config: error: no core section [%s]%s%s%s (the sections: %s; a plugin's "
            "keys: dtrain plugins --describe %s)\n",
            section, best ? "; did you mean [" : "", best ? best : "", best ? "]?" : "", list,
            section);
    return DT_EXIT_USAGE;
}

int dt_cmd_config(int argc, char **argv)
{
    /* --markdown right after doc: the rest reads as without it */
    int md = argc >= 3 && strcmp(argv[1], "doc") == 0 && strcmp(argv[2], "--markdown") == 0;
    if (md) {
        argv[2] = argv[1];
        argv++;
        argc--;
    }
    if (argc >= 2 && strcmp(argv[1], "doc") == 0 && argc <= 3 &&
        (argc == 2 || argv[2][0] != '-'))
        return doc(argc == 3 ? argv[2] : NULL, md);
    if (argc < 2)
        fprintf(stderr, "dtrain config: error: missing subcommand (see dtrain config --help)\n");
    else if (strcmp(argv[1], "doc") == 0)
        fprintf(stderr, "dtrain config: error: doc takes at most one SECTION, got '%s'%s "
                        "(see dtrain config --help)\n",
                argv[2], argc > 3 ? " and more" : "");
    else
        fprintf(stderr, "dtrain config: error: unknown subcommand '%s' (see dtrain config "
                        "--help)\n", argv[1]);
    return DT_EXIT_USAGE;
}
