/*
 * core/config/config.c - the typed configuration: the parsed TOML tree,
 * --set overrides, and per-table resolved values checked against schemas,
 * each remembering where it came from.
 *
 * Nothing is read from the raw tree after dt_config_apply_schema: a table's
 * schema turns it into resolved values (file, --set or default), and every
 * getter, the printout and the hash look only at those.  That keeps one
 * place where types, ranges and choices are enforced.
 */
#include "config/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/toml_shim.h"
#include "util/error.h"
#include "util/fileutil.h"

/* One resolved key of a claimed table.  The schema's strings are copied:
 * a plugin's static key table disappears when the plugin is unloaded, the
 * config may outlive it. */
typedef struct cval {
    char *name;
    int type;            /* dt_config_type_t */
    double min, max;
    char *choices;       /* ENUM only */
    int64_t i;           /* INT */
    double f;            /* FLOAT */
    int b;               /* BOOL */
    char *s;             /* STRING / ENUM */
    dt_origin_t origin;
    int line;            /* DT_ORIGIN_FILE: where the value is written */
} cval_t;

typedef struct ctable {
    char *name;
    cval_t *vals;
    uint32_t n;
    char *error;         /* claimed in spite of these errors (their values
                          * at the defaults): returned by every later claim */
} ctable_t;

/* One --set, kept until its table's schema is applied. */
typedef struct override {
    char *assign;        /* the whole "train.lr=abc", for messages */
    char *table, *key;
    char *text;          /* the value as typed, trimmed */
    dt_toml_node_t *node; /* parsed value; a STRING of `text` if bare */
} override_t;

struct dt_config {
    char *name;          /* stands for the file in messages */
    char *path;          /* "" unless loaded from a file */
    dt_toml_node_t *root;
    ctable_t *tables;    /* claim order */
    size_t n_tables, cap_tables;
    override_t *ovr;     /* command-line order; the last one wins */
    size_t n_ovr, cap_ovr;
    char **aside;        /* tables checked and set aside (dt_config_set_aside) */
    size_t n_aside;
};

/* ------------------------------------------------------------------------
 * Small helpers
 * --------------------------------------------------------------------- */

static int nomem(const char *what)
{
    return dt_err_set(DT_ERR_NOMEM, "config: out of memory (%s)", what);
}

/* A value sink: the printout writes to a FILE, the hash folds bytes into
 * FNV-1a, and the column alignment counts them, all from one formatter. */
enum { SINK_FILE, SINK_HASH, SINK_COUNT, SINK_BUF };
typedef struct sink {
    int mode;
    FILE *f;
    uint64_t h;
    size_t count;
    char *buf;           /* SINK_BUF: NUL-terminated, cut at cap */
    size_t cap;
} sink_t;

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static void sink_put(sink_t *s, const char *p, size_t n)
{
    switch (s->mode) {
    case SINK_FILE:
        fwrite(p, 1, n, s->f);
        break;
    case SINK_HASH:
        for (size_t i = 0; i < n; i++) {
            s->h ^= (unsigned char)p[i];
            s->h *= FNV_PRIME;
        }
        break;
    case SINK_BUF:
        for (size_t i = 0; i < n && s->count + 1 < s->cap; i++)
            s->buf[s->count++] = p[i];
        s->buf[s->count] = '\0';
        return;
    default:
        break;
    }
    s->count += n;
}

static void sink_str(sink_t *s, const char *p) { sink_put(s, p, strlen(p)); }

/* A TOML basic string: quoted, with the escapes TOML defines.  Bytes of
 * 0x80 and up pass through (UTF-8). */
static void sink_quoted(sink_t *s, const char *p)
{
    sink_put(s, "\"", 1);
    for (; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        char esc[8];
        switch (ch) {
        case '"': sink_put(s, "\\\"", 2); break;
        case '\\': sink_put(s, "\\\\", 2); break;
        case '\b': sink_put(s, "\\b", 2); break;
        case '\t': sink_put(s, "\\t", 2); break;
        case '\n': sink_put(s, "\\n", 2); break;
        case '\f': sink_put(s, "\\f", 2); break;
        case '\r': sink_put(s, "\\r", 2); break;
        default:
            if (ch < 0x20 || ch == 0x7f) {
                snprintf(esc, sizeof esc, "\\u%04X", ch);
                sink_put(s, esc, 6);
            } else {
                sink_put(s, (const char *)p, 1);
            }
        }
    }
    sink_put(s, "\"", 1);
}

/* The shortest "%.Ng" that reads back as the same double.  With `toml`,
 * the result is a TOML float literal: it always has a '.' or an exponent,
 * and non-finite values are spelled inf / -inf / nan. */
static void fmt_double(double v, char *buf, size_t n, int toml)
{
    if (isnan(v)) {
        snprintf(buf, n, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, n, v < 0 ? "-inf" : "inf");
        return;
    }
    /* Whole numbers in plain digits: "10", not the "1e+01" of %.1g. */
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, n, "%.0f", v);
        if (v == 0 && signbit(v) && n > 2)
            snprintf(buf, n, "-0");
    } else {
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(buf, n, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                break;
        }
    }
    if (toml && !strpbrk(buf, ".eE")) {
        size_t len = strlen(buf);
        if (len + 2 < n)
            memcpy(buf + len, ".0", 3);
    }
}

static void sink_value(sink_t *s, const cval_t *v)
{
    char num[64];
    switch (v->type) {
    case DT_CFG_BOOL:
        sink_str(s, v->b ? "true" : "false");
        break;
    case DT_CFG_INT:
        snprintf(num, sizeof num, "%" PRId64, v->i);
        sink_str(s, num);
        break;
    case DT_CFG_FLOAT:
        fmt_double(v->f, num, sizeof num, 1);
        sink_str(s, num);
        break;
    default:
        sink_quoted(s, v->s ? v->s : "");
        break;
    }
}

/* "FILE:LINE:COL", "FILE" when the position is unknown. */
static void fmt_loc(const dt_config_t *c, int line, int col, char *buf,
                    size_t n)
{
    if (line > 0 && col > 0)
        snprintf(buf, n, "%s:%d:%d", c->name, line, col);
    else if (line > 0)
        snprintf(buf, n, "%s:%d", c->name, line);
    else
        snprintf(buf, n, "%s", c->name);
}

/* Prefer the first known of two positions. */
static void node_loc(const dt_config_t *c, const dt_toml_node_t *n,
                     int prefer_key, char *buf, size_t size)
{
    int l1 = prefer_key ? n->key_line : n->line;
    int c1 = prefer_key ? n->key_col : n->col;
    int l2 = prefer_key ? n->line : n->key_line;
    int c2 = prefer_key ? n->col : n->key_col;
    if (l1 > 0)
        fmt_loc(c, l1, c1, buf, size);
    else
        fmt_loc(c, l2, c2, buf, size);
}

/* What a TOML value is, for "got ..." in messages: string "abc",
 * integer 5, float 2.5, boolean true, an array, a table, a date. */
static void describe_node(const dt_toml_node_t *n, char *buf, size_t size)
{
    char num[64];
    switch (n->type) {
    case DT_TOML_STRING: {
        /* Long strings are cut: the message should fit on a line. */
        char cut[64];
        size_t len = strlen(n->u.s);
        int more = len > 40;
        snprintf(cut, sizeof cut, "%.40s", n->u.s);
        sink_t s = {.mode = SINK_BUF, .buf = buf, .cap = size};
        sink_str(&s, "string ");
        sink_quoted(&s, cut);
        if (more)
            sink_str(&s, "...");
        break;
    }
    case DT_TOML_INT:
        snprintf(buf, size, "integer %" PRId64, n->u.i);
        break;
    case DT_TOML_FLOAT:
        fmt_double(n->u.f, num, sizeof num, 1);
        snprintf(buf, size, "float %s", num);
        break;
    case DT_TOML_BOOL:
        snprintf(buf, size, "boolean %s", n->u.b ? "true" : "false");
        break;
    case DT_TOML_ARRAY:
        snprintf(buf, size, "an array");
        break;
    case DT_TOML_TABLE:
        snprintf(buf, size, "a table");
        break;
    default:
        snprintf(buf, size, "a %s", dt_toml_type_name(n->type));
        break;
    }
}

/* `"a", "b", "c"` from "a|b|c". */
static void fmt_choices(const char *choices, char *buf, size_t size)
{
    sink_t s = {.mode = SINK_BUF, .buf = buf, .cap = size};
    buf[0] = '\0';
    const char *p = choices;
    while (p && *p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (p != choices)
            sink_str(&s, ", ");
        sink_put(&s, "\"", 1);
        sink_put(&s, p, len);
        sink_put(&s, "\"", 1);
        p = bar ? bar + 1 : NULL;
    }
}

/* Is `word` one of "a|b|c"? */
static int in_choices(const char *choices, const char *word)
{
    size_t wl = strlen(word);
    const char *p = choices;
    while (p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == wl && strncmp(p, word, len) == 0)
            return 1;
        p = bar ? bar + 1 : NULL;
    }
    return 0;
}

/* The did-you-mean among the choices of an ENUM (copied out of the
 * '|'-separated list into fixed slots). */
static void suggest_choice(const char *choices, const char *word, char *buf,
                           size_t size)
{
    char words[32][64];
    const char *ptrs[32];
    size_t n = 0;
    const char *p = choices;
    buf[0] = '\0';
    while (p && n < 32) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        snprintf(words[n], sizeof words[n], "%.*s", (int)len, p);
        ptrs[n] = words[n];
        n++;
        p = bar ? bar + 1 : NULL;
    }
    const char *best = dt_suggest(word, ptrs, n);
    if (best)
        snprintf(buf, size, "; did you mean \"%s\"?", best);
}

static const char *type_noun(int type)
{
    switch (type) {
    case DT_CFG_BOOL: return "a boolean";
    case DT_CFG_INT: return "an integer";
    case DT_CFG_FLOAT: return "a float";
    case DT_CFG_STRING: return "a string";
    default: return "an enum";
    }
}

/* No range when both bounds are 0 or min > max (dtrain/plugin.h). */
static int has_range(double min, double max) { return !(min == 0 && max == 0) && min <= max; }

static void fmt_range(int type, double min, double max, char *buf, size_t n)
{
    char a[64], b[64];
    if (type == DT_CFG_INT) {
        snprintf(a, sizeof a, "%.0f", min);
        snprintf(b, sizeof b, "%.0f", max);
    } else {
        fmt_double(min, a, sizeof a, 0);
        fmt_double(max, b, sizeof b, 0);
    }
    snprintf(buf, n, "allowed %s .. %s", a, b);
}

static void free_cval(cval_t *v)
{
    free(v->name);
    free(v->choices);
    free(v->s);
}

static void free_table(ctable_t *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        free_cval(&t->vals[i]);
    free(t->vals);
    free(t->name);
    free(t->error);
}

static ctable_t *find_table(const dt_config_t *c, const char *name)
{
    for (size_t i = 0; i < c->n_tables; i++)
        if (strcmp(c->tables[i].name, name) == 0)
            return &c->tables[i];
    return NULL;
}

static const dt_toml_node_t *root_child(const dt_config_t *c, const char *key)
{
    for (size_t i = 0; i < c->root->u.children.n; i++) {
        const dt_toml_node_t *n = &c->root->u.children.items[i];
        if (strcmp(n->key, key) == 0)
            return n;
    }
    return NULL;
}

/* ------------------------------------------------------------------------
 * Creating and freeing
 * --------------------------------------------------------------------- */

static int config_alloc(const char *name, const char *path,
                        dt_toml_node_t *root, dt_config_t **out)
{
    dt_config_t *c = calloc(1, sizeof *c);
    if (!c) {
        dt_toml_free(root);
        return nomem("config");
    }
    c->root = root;
    c->name = strdup(name);
    c->path = strdup(path);
    if (!c->root)
        c->root = calloc(1, sizeof *c->root); /* zeroed = empty table */
    if (!c->name || !c->path || !c->root) {
        dt_config_free(c);
        return nomem("config");
    }
    *out = c;
    return DT_OK;
}

void dt_config_free(dt_config_t *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_tables; i++)
        free_table(&c->tables[i]);
    free(c->tables);
    for (size_t i = 0; i < c->n_ovr; i++) {
        free(c->ovr[i].assign);
        free(c->ovr[i].table);
        free(c->ovr[i].key);
        free(c->ovr[i].text);
        dt_toml_free(c->ovr[i].node);
    }
    free(c->ovr);
    for (size_t i = 0; i < c->n_aside; i++)
        free(c->aside[i]);
    free(c->aside);
    dt_toml_free(c->root);
    free(c->name);
    free(c->path);
    free(c);
}

int dt_config_new(dt_config_t **out)
{
    if (!out)
        return dt_err_set(DT_ERR_INVALID, "dt_config_new: out is NULL");
    *out = NULL;
    return config_alloc("", "", NULL, out);
}

static int load_text(const char *name, const char *path, const char *text,
                     size_t len, dt_config_t **out)
{
    dt_toml_node_t *root = NULL;
    dt_toml_error_t err;
    int rc = dt_toml_parse(text, len, name, &root, &err);
    if (rc == DT_ERR_CONFIG) {
        if (err.line > 0)
            return dt_err_set(rc, "%s:%d:%d: TOML syntax error: %s", name,
                              err.line, err.col, err.msg);
        return dt_err_set(rc, "%s: TOML syntax error: %s", name, err.msg);
    }
    if (rc != DT_OK)
        return dt_err_set(rc, "%s: %s", name, err.msg);
    return config_alloc(name, path, root, out);
}

int dt_config_load_string(const char *name, const char *text,
                          dt_config_t **out)
{
    if (!out || !text)
        return dt_err_set(DT_ERR_INVALID, "dt_config_load_string: NULL argument");
    *out = NULL;
    return load_text(name && *name ? name : "<string>", "", text, strlen(text),
                     out);
}

int dt_config_load(const char *path, dt_config_t **out)
{
    if (!out || !path)
        return dt_err_set(DT_ERR_INVALID, "dt_config_load: NULL argument");
    *out = NULL;
    /* opened as an input: a FIFO or a device named as the config is an
     * error, never a hang (dt_fileutil_open_input) */
    char what[4200];
    snprintf(what, sizeof what, "cannot open config file '%s'", path);
    int fd = -1;
    uint64_t size = 0;
    int rc = dt_fileutil_open_input(path, 0, what, &fd, &size);
    if (rc)
        return rc;
    char *buf = NULL;
    size_t len = 0;
    snprintf(what, sizeof what, "reading config file '%s'", path);
    rc = dt_fileutil_read_fd(fd, size, (uint64_t)64 << 20, what, &buf, &len);
    close(fd);
    if (rc)
        return rc;
    rc = load_text(path, path, buf, len, out);
    free(buf);
    return rc;
}

const char *dt_config_path(const dt_config_t *c) { return c ? c->path : ""; }

/* ------------------------------------------------------------------------
 * --set overrides
 * --------------------------------------------------------------------- */

static int apply_to_claimed(const dt_config_t *c, ctable_t *t, const override_t *o);
static int alias_hint(const dt_config_t *c, const char *parent, const char *key,
                      const dt_toml_node_t *value, char *buf, size_t cap);

static int valid_name(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!isalnum(ch) && ch != '_' && ch != '-')
            return 0;
    }
    return 1;
}

int dt_config_override(dt_config_t *c, const char *assignment)
{
    if (!c || !assignment)
        return dt_err_set(DT_ERR_INVALID, "dt_config_override: NULL argument");
    const char *eq = strchr(assignment, '=');
    const char *lhs = assignment, *lhs_end = eq ? eq : assignment;
    while (lhs < lhs_end && isspace((unsigned char)*lhs))
        lhs++;
    while (lhs_end > lhs && isspace((unsigned char)lhs_end[-1]))
        lhs_end--;
    const char *dot = memchr(lhs, '.', (size_t)(lhs_end - lhs));
    if (!eq || !dot || !valid_name(lhs, (size_t)(dot - lhs)) ||
        !valid_name(dot + 1, (size_t)(lhs_end - dot - 1))) {
        /* "optimizer.params.lr": another stack's path, the hint at its end */
        char parent[256], alias[512] = "";
        const char *last = lhs_end;
        while (last > lhs && last[-1] != '.')
            last--;
        snprintf(parent, sizeof parent, "%.*s", last > lhs ? (int)(last - lhs - 1) : 0, lhs);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(lhs_end - last), last);
        dt_toml_node_t *value = NULL;
        if (eq && dt_toml_parse_value(eq + 1, &value) != DT_OK)
            value = NULL; /* only for a hint that computes with it */
        if (eq && alias_hint(c, parent, key, value, alias + 2, sizeof alias - 2))
            memcpy(alias, "; ", 2);
        dt_toml_free(value);
        return dt_err_set(DT_ERR_CONFIG,
                          "--set %s: expected table.key=value "
                          "(e.g. --set train.lr=3e-4)%s",
                          assignment, alias);
    }

    const char *v = eq + 1, *v_end = v + strlen(v);
    while (v < v_end && isspace((unsigned char)*v))
        v++;
    while (v_end > v && isspace((unsigned char)v_end[-1]))
        v_end--;

    if (c->n_ovr == c->cap_ovr) {
        size_t ncap = c->cap_ovr ? c->cap_ovr * 2 : 8;
        override_t *no = realloc(c->ovr, ncap * sizeof *no);
        if (!no)
            return nomem("--set");
        c->ovr = no;
        c->cap_ovr = ncap;
    }
    override_t o = {0};
    o.assign = strdup(assignment);
    o.table = strndup(lhs, (size_t)(dot - lhs));
    o.key = strndup(dot + 1, (size_t)(lhs_end - dot - 1));
    o.text = strndup(v, (size_t)(v_end - v));
    int rc = DT_ERR_NOMEM;
    if (o.assign && o.table && o.key && o.text) {
        rc = dt_toml_parse_value(o.text, &o.node);
        if (rc == DT_ERR_CONFIG) {
            /* Not a TOML value: a bare word, taken as a string. */
            o.node = calloc(1, sizeof *o.node);
            if (o.node) {
                o.node->type = DT_TOML_STRING;
                o.node->u.s = strdup(o.text);
                rc = o.node->u.s ? DT_OK : DT_ERR_NOMEM;
            } else {
                rc = DT_ERR_NOMEM;
            }
        }
    }
    if (rc != DT_OK) {
        free(o.assign);
        free(o.table);
        free(o.key);
        free(o.text);
        dt_toml_free(o.node);
        return nomem("--set");
    }
    c->ovr[c->n_ovr++] = o;
    ctable_t *t = find_table(c, o.table);
    return t ? apply_to_claimed(c, t, &c->ovr[c->n_ovr - 1]) : DT_OK;
}

/* ------------------------------------------------------------------------
 * Applying a schema
 * --------------------------------------------------------------------- */

/* Where a candidate value comes from, for messages and origins. */
typedef struct source {
    dt_origin_t origin;
    const char *loc;     /* "run.toml:3:6", "--set train.lr=abc", ... */
    int line;
    int fail;            /* status for a bad value: CONFIG, or INVALID for
                          * a schema default (a bug, not user input) */
} source_t;

/* Check one value against its key and store it in `out`.  `raw` is the
 * text of a --set (NULL otherwise): a --set for a string key keeps what
 * was typed, so `--set run.name=42` names the run "42". */
static int resolve_value(const char *table, const dt_config_key_t *k,
                         const dt_toml_node_t *n, const char *raw,
                         const source_t *src, cval_t *out)
{
    char got[160], ch[512], rng[160], num[64];
    int t = k->type;
    if (raw && (t == DT_CFG_STRING || t == DT_CFG_ENUM) &&
        n->type != DT_TOML_STRING) {
        dt_toml_node_t s = {.type = DT_TOML_STRING};
        s.u.s = (char *)raw;
        return resolve_value(table, k, &s, NULL, src, out);
    }
    describe_node(n, got, sizeof got);
    switch (t) {
    case DT_CFG_BOOL:
        if (n->type != DT_TOML_BOOL)
            goto wrong_type;
        out->b = n->u.b;
        break;
    case DT_CFG_INT:
        if (n->type != DT_TOML_INT)
            goto wrong_type;
        if (has_range(k->min, k->max) &&
            ((double)n->u.i < k->min || (double)n->u.i > k->max)) {
            fmt_range(t, k->min, k->max, rng, sizeof rng);
            return dt_err_set(src->fail,
                              "%s: [%s] %s = %" PRId64 " is out of range (%s)",
                              src->loc, table, k->name, n->u.i, rng);
        }
        out->i = n->u.i;
        break;
    case DT_CFG_FLOAT: {
        double f;
        if (n->type == DT_TOML_FLOAT)
            f = n->u.f;
        else if (n->type == DT_TOML_INT)
            f = (double)n->u.i;
        else
            goto wrong_type;
        /* NaN fails every comparison, so test "inside" rather than
         * "outside" the range. */
        if (has_range(k->min, k->max) && !(f >= k->min && f <= k->max)) {
            fmt_range(t, k->min, k->max, rng, sizeof rng);
            fmt_double(f, num, sizeof num, 1);
            return dt_err_set(src->fail, "%s: [%s] %s = %s is out of range (%s)",
                              src->loc, table, k->name, num, rng);
        }
        out->f = f;
        break;
    }
    case DT_CFG_STRING:
        if (n->type != DT_TOML_STRING)
            goto wrong_type;
        break;
    default: /* ENUM */
        fmt_choices(k->choices, ch, sizeof ch);
        if (n->type != DT_TOML_STRING)
            return dt_err_set(src->fail, "%s: [%s] %s: expected one of %s, got %s",
                              src->loc, table, k->name, ch, got);
        if (!in_choices(k->choices, n->u.s)) {
            char sug[128];
            suggest_choice(k->choices, n->u.s, sug, sizeof sug);
            return dt_err_set(src->fail,
                              "%s: [%s] %s = %s is not one of %s%s", src->loc,
                              table, k->name, got + strlen("string "), ch, sug);
        }
        break;
    }
    if (t == DT_CFG_STRING || t == DT_CFG_ENUM) {
        out->s = strdup(n->u.s);
        if (!out->s)
            return nomem("config value");
    }
    out->origin = src->origin;
    out->line = src->line;
    return DT_OK;

wrong_type:
    return dt_err_set(src->fail, "%s: [%s] %s: expected %s, got %s", src->loc,
                      table, k->name, type_noun(t), got);
}

/* A schema is code, not user input: a broken one is DT_ERR_INVALID. */
static int check_schema(const char *table, const dt_config_key_t *keys,
                        uint32_t n)
{
    if (n && !keys)
        return dt_err_set(DT_ERR_INVALID, "config schema for [%s]: keys is NULL",
                          table);
    for (uint32_t i = 0; i < n; i++) {
        const dt_config_key_t *k = &keys[i];
        if (!k->name || !valid_name(k->name, strlen(k->name)))
            return dt_err_set(DT_ERR_INVALID,
                              "config schema for [%s]: key #%u has no valid name",
                              table, i);
        if (k->type < DT_CFG_BOOL || k->type > DT_CFG_ENUM)
            return dt_err_set(DT_ERR_INVALID,
                              "config schema for [%s]: key '%s' has unknown type %d",
                              table, k->name, (int)k->type);
        if (k->type == DT_CFG_ENUM && (!k->choices || !*k->choices))
            return dt_err_set(DT_ERR_INVALID,
                              "config schema for [%s]: enum key '%s' has no choices",
                              table, k->name);
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(keys[j].name, k->name) == 0)
                return dt_err_set(DT_ERR_INVALID,
                                  "config schema for [%s]: key '%s' declared twice",
                                  table, k->name);
    }
    return DT_OK;
}

static const dt_config_key_t *schema_key(const dt_config_key_t *keys,
                                         uint32_t n, const char *name)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

/* "; did you mean 'x'?" among the schema's keys, or "". */
static void suggest_key(const dt_config_key_t *keys, uint32_t n,
                        const char *word, char *buf, size_t size)
{
    buf[0] = '\0';
    if (n == 0)
        return;
    const char **names = malloc(n * sizeof *names);
    if (!names)
        return; /* the message is still right, only shorter */
    for (uint32_t i = 0; i < n; i++)
        names[i] = keys[i].name;
    const char *best = dt_suggest(word, names, n);
    if (best)
        snprintf(buf, size, "; did you mean '%s'?", best);
    free(names);
}

static int unknown_key(const dt_config_t *c, const char *loc, const char *table,
                       const dt_config_key_t *keys, uint32_t n, const char *key,
                       const dt_toml_node_t *value)
{
    char sug[512];
    if (alias_hint(c, table, key, value, sug, sizeof sug) ||
        dt_config_home(table, key, sug, sizeof sug))
        return dt_err_set(DT_ERR_CONFIG, "%s: unknown key '%s' in [%s]; %s", loc, key, table,
                          sug);
    if (n == 0)
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: unknown key '%s' in [%s]; [%s] takes no keys",
                          loc, key, table, table);
    suggest_key(keys, n, key, sug, sizeof sug);
    return dt_err_set(DT_ERR_CONFIG, "%s: unknown key '%s' in [%s]%s", loc, key,
                      table, sug);
}

static int same_schema(const ctable_t *t, const dt_config_key_t *keys,
                       uint32_t n)
{
    if (t->n != n)
        return 0;
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(t->vals[i].name, keys[i].name) != 0 ||
            t->vals[i].type != keys[i].type)
            return 0;
    return 1;
}

/* The last --set of table.key, or NULL. */
static const override_t *find_override(const dt_config_t *c, const char *table,
                                       const char *key)
{
    for (size_t i = c->n_ovr; i-- > 0;)
        if (strcmp(c->ovr[i].table, table) == 0 &&
            strcmp(c->ovr[i].key, key) == 0)
            return &c->ovr[i];
    return NULL;
}

static cval_t *lookup(const dt_config_t *c, const char *path);

/* The number "table.key" holds before or after its table is resolved:
 * resolved, else its last --set, else the file, else the core schema's
 * default; 0 when it is none of these or not a number. */
static int raw_number(const dt_config_t *c, const char *path, double *out)
{
    const cval_t *v = lookup(c, path);
    if (v && (v->type == DT_CFG_INT || v->type == DT_CFG_FLOAT)) {
        *out = v->type == DT_CFG_INT ? (double)v->i : v->f;
        return 1;
    }
    const char *dot = strchr(path, '.');
    char table[64];
    if (!dot || (size_t)(dot - path) >= sizeof table)
        return 0;
    snprintf(table, sizeof table, "%.*s", (int)(dot - path), path);
    const dt_toml_node_t *n = NULL;
    const override_t *o = find_override(c, table, dot + 1);
    if (o) {
        n = o->node;
    } else {
        const dt_toml_node_t *t = root_child(c, table);
        for (size_t i = 0; t && t->type == DT_TOML_TABLE && i < t->u.children.n; i++)
            if (strcmp(t->u.children.items[i].key, dot + 1) == 0)
                n = &t->u.children.items[i];
    }
    if (n) {
        if (n->type != DT_TOML_INT && n->type != DT_TOML_FLOAT)
            return 0;
        *out = n->type == DT_TOML_INT ? (double)n->u.i : n->u.f;
        return 1;
    }
    for (uint32_t s = 0; s < dt_core_n_sections; s++)
        for (uint32_t k = 0; strcmp(dt_core_sections[s].table, table) == 0 &&
                             k < dt_core_sections[s].n_keys; k++) {
            const dt_config_key_t *key = &dt_core_sections[s].keys[k];
            if (strcmp(key->name, dot + 1) == 0 && key->def) {
                char *end;
                *out = strtod(key->def, &end);
                return *end == '\0' && end != key->def;
            }
        }
    return 0;
}

/* dt_config_alias's hint for key `key` under `parent`; for a key whose
 * dtrain value is a product (warmup_ratio x train.steps) and `value` a
 * number, what it comes to in this config: "...; here train.warmup_steps =
 * 30 (0.1 x train.steps = 300)". */
static int alias_hint(const dt_config_t *c, const char *parent, const char *key,
                      const dt_toml_node_t *value, char *buf, size_t cap)
{
    if (!dt_config_alias(parent, key, buf, cap))
        return 0;
    const char *times, *is;
    double of;
    if (!value || (value->type != DT_TOML_INT && value->type != DT_TOML_FLOAT) ||
        !dt_config_alias_product(parent, key, &times, &is) || !raw_number(c, times, &of))
        return 1;
    double v = value->type == DT_TOML_INT ? (double)value->u.i : value->u.f;
    char a[64], b[64];
    fmt_double(v, a, sizeof a, 0);
    fmt_double(of, b, sizeof b, 0);
    size_t len = strlen(buf);
    if (isfinite(v * of) && fabs(v * of) < 1e15)
        snprintf(buf + len, cap - len, "; here %s = %.0f (%s x %s = %s)", is, round(v * of), a,
                 times, b);
    return 1;
}

/* The first key under table node `t` (found at `path`, "fp16" or
 * "optimizer.params"), depth first, that another stack spells that way:
 * its hint (alias_hint) into buf, 1; else 0. */
static int tree_alias(const dt_config_t *c, const char *path, const dt_toml_node_t *t,
                      char *buf, size_t cap)
{
    if (t->type != DT_TOML_TABLE)
        return 0;
    for (size_t i = 0; i < t->u.children.n; i++) {
        const dt_toml_node_t *e = &t->u.children.items[i];
        if (alias_hint(c, path, e->key, e, buf, cap))
            return 1;
        char sub[256];
        snprintf(sub, sizeof sub, "%s.%s", path, e->key);
        if (e->type == DT_TOML_TABLE && tree_alias(c, sub, e, buf, cap))
            return 1;
    }
    return 0;
}

/* Check the table as written in the file: shape, then every key (unknown
 * keys, nesting), each problem added to `errs`.  DT_ERR_CONFIG when the
 * table is no table at all (its keys cannot be read). */
static int check_file_table(const dt_config_t *c, const char *table,
                            const dt_toml_node_t *tn,
                            const dt_config_key_t *keys, uint32_t n, dt_errlist_t *errs)
{
    char loc[1200];
    if (tn->type == DT_TOML_ARRAY) {
        int all_tables = tn->u.children.n > 0;
        for (size_t i = 0; i < tn->u.children.n; i++)
            all_tables &= tn->u.children.items[i].type == DT_TOML_TABLE;
        node_loc(c, tn, 0, loc, sizeof loc);
        if (all_tables)
            return dt_err_set(DT_ERR_CONFIG,
                              "%s: [[%s]] is an array of tables; [%s] must be "
                              "a single table",
                              loc, table, table);
    }
    if (tn->type != DT_TOML_TABLE) {
        char got[160];
        describe_node(tn, got, sizeof got);
        node_loc(c, tn, 1, loc, sizeof loc);
        return dt_err_set(DT_ERR_CONFIG, "%s: '%s' must be a table ([%s]), got %s",
                          loc, table, table, got);
    }
    for (size_t i = 0; i < tn->u.children.n; i++) {
        const dt_toml_node_t *e = &tn->u.children.items[i];
        if (e->type == DT_TOML_TABLE ||
            (e->type == DT_TOML_ARRAY && e->u.children.n > 0 &&
             e->u.children.items[0].type == DT_TOML_TABLE &&
             !schema_key(keys, n, e->key))) {
            node_loc(c, e, 0, loc, sizeof loc);
            char path[256], alias[512] = "";
            snprintf(path, sizeof path, "%s.%s", table, e->key);
            if (tree_alias(c, path, e, alias + 2, sizeof alias - 2))
                memcpy(alias, "; ", 2);
            dt_err_set(DT_ERR_CONFIG,
                       "%s: [%s] %s: nested tables are not allowed in "
                       "[%s] (no [%s.%s] headers or dotted keys "
                       "'%s.x = ...'; every key is a plain value)%s",
                       loc, table, e->key, table, table, e->key, e->key, alias);
            dt_errlist_add(errs, NULL);
        } else if (!schema_key(keys, n, e->key)) {
            node_loc(c, e, 1, loc, sizeof loc);
            unknown_key(c, loc, table, keys, n, e->key, e);
            dt_errlist_add(errs, NULL);
        }
    }
    return DT_OK;
}

static int is_aside(const dt_config_t *c, const char *table)
{
    for (size_t i = 0; i < c->n_aside; i++)
        if (strcmp(c->aside[i], table) == 0)
            return 1;
    return 0;
}

/* Check table `table` against `keys`; claim it (its values resolved, in
 * c->tables), or with `aside` only check what is written and remember the
 * name (a required key may be missing: the table is not used). */
static int apply_schema(dt_config_t *c, const char *table, const dt_config_key_t *keys,
                        uint32_t n_keys, int aside)
{
    if (!c || !table || !*table)
        return dt_err_set(DT_ERR_INVALID, "dt_config_apply_schema: NULL argument");
    int rc = check_schema(table, keys, n_keys);
    if (rc != DT_OK)
        return rc;
    const ctable_t *seen = find_table(c, table);
    if (seen) {
        if (!same_schema(seen, keys, n_keys))
            return dt_err_set(DT_ERR_INVALID,
                              "config table [%s] was already claimed with other keys",
                              table);
        return seen->error ? dt_err_set(DT_ERR_CONFIG, "%s", seen->error) : DT_OK;
    }

    /* every problem of the table is reported at once: each goes to errs,
     * and a value in error stands at its default meanwhile */
    dt_errlist_t errs = {.n = 0};
    const dt_toml_node_t *tn = root_child(c, table);
    if (tn && (rc = check_file_table(c, table, tn, keys, n_keys, &errs)) != DT_OK) {
        if (rc != DT_ERR_CONFIG)
            return rc;
        dt_errlist_add(&errs, NULL);
    }
    if (tn && tn->type != DT_TOML_TABLE)
        tn = NULL; /* reported above: no keys to read from it */
    for (size_t i = 0; i < c->n_ovr; i++) {
        const override_t *o = &c->ovr[i];
        if (strcmp(o->table, table) == 0 && !schema_key(keys, n_keys, o->key)) {
            char loc[1200];
            snprintf(loc, sizeof loc, "--set %s", o->assign);
            unknown_key(c, loc, table, keys, n_keys, o->key, o->node);
            dt_errlist_add(&errs, NULL);
        }
    }

    ctable_t t = {0};
    t.name = strdup(table);
    t.vals = n_keys ? calloc(n_keys, sizeof *t.vals) : NULL;
    if (!t.name || (n_keys && !t.vals)) {
        free_table(&t);
        return nomem("config table");
    }
    for (uint32_t i = 0; i < n_keys && rc == DT_OK; i++) {
        const dt_config_key_t *k = &keys[i];
        cval_t *v = &t.vals[t.n++];
        v->type = k->type;
        v->min = k->min;
        v->max = k->max;
        v->name = strdup(k->name);
        v->choices = k->choices ? strdup(k->choices) : NULL;
        if (!v->name || (k->choices && !v->choices)) {
            rc = nomem("config value");
            break;
        }
        const override_t *o = find_override(c, table, k->name);
        const dt_toml_node_t *fn = NULL;
        for (size_t j = 0; tn && j < tn->u.children.n && !o; j++)
            if (strcmp(tn->u.children.items[j].key, k->name) == 0)
                fn = &tn->u.children.items[j];
        char loc[1200];
        source_t src = {.fail = DT_ERR_CONFIG, .loc = loc};
        int bad = 0; /* a value was given and is in error (reported) */
        if (o) {
            snprintf(loc, sizeof loc, "--set %s", o->assign);
            src.origin = DT_ORIGIN_CLI;
            rc = resolve_value(table, k, o->node, o->text, &src, v);
        } else if (fn && fn->type == DT_TOML_TABLE) {
            bad = 1; /* check_file_table reported the nested table */
        } else if (fn) {
            node_loc(c, fn, 0, loc, sizeof loc);
            src.origin = DT_ORIGIN_FILE;
            src.line = fn->line > 0 ? fn->line : fn->key_line;
            rc = resolve_value(table, k, fn, NULL, &src, v);
        }
        if (rc == DT_ERR_CONFIG) {
            dt_errlist_add(&errs, NULL);
            rc = DT_OK;
            bad = 1;
            src = (source_t){.fail = DT_ERR_CONFIG, .loc = loc};
        }
        if (rc != DT_OK)
            break;
        if ((o || fn) && !bad)
            continue; /* resolved */
        if (k->def) {
            dt_toml_node_t *dn = NULL;
            rc = dt_toml_parse_value(k->def, &dn);
            if (rc == DT_ERR_NOMEM) {
                rc = nomem("config default");
            } else if (rc != DT_OK) {
                rc = dt_err_set(DT_ERR_INVALID,
                                "config schema for [%s]: default of '%s' is not "
                                "a TOML value: %s",
                                table, k->name, k->def);
            } else {
                snprintf(loc, sizeof loc, "config schema for [%s] (default)",
                         table);
                src.origin = DT_ORIGIN_DEFAULT;
                src.fail = DT_ERR_INVALID;
                rc = resolve_value(table, k, dn, NULL, &src, v);
            }
            dt_toml_free(dn);
        } else if (!aside && !bad) {
            if (tn)
                node_loc(c, tn, 0, loc, sizeof loc);
            else
                snprintf(loc, sizeof loc, "%s", c->name);
            dt_err_set(DT_ERR_CONFIG,
                       "%s%srequired key '%s.%s' is missing (add '%s = ...' "
                       "under [%s] or pass --set %s.%s=VALUE)",
                       loc, *loc ? ": " : "", table, k->name, k->name,
                       table, table, k->name);
            dt_errlist_add(&errs, NULL);
        }
        /* a required key missing or in error reads as empty, never NULL */
        if (rc == DT_OK && (k->type == DT_CFG_STRING || k->type == DT_CFG_ENUM) && !v->s &&
            !(v->s = strdup("")))
            rc = nomem("config value");
    }
    if (aside) {
        free_table(&t);
        if (rc != DT_OK)
            return rc;
        /* set aside in spite of errors: the table is known, its errors
         * reported here, not again as an unknown table */
        if (!is_aside(c, table)) {
            char **na = realloc(c->aside, (c->n_aside + 1) * sizeof *na);
            if (!na)
                return nomem("config table");
            c->aside = na;
            if (!(c->aside[c->n_aside] = strdup(table)))
                return nomem("config table");
            c->n_aside++;
        }
        return dt_errlist_fail(&errs, DT_ERR_CONFIG);
    }
    if (rc == DT_OK && c->n_tables == c->cap_tables) {
        size_t ncap = c->cap_tables ? c->cap_tables * 2 : 16;
        ctable_t *nt = realloc(c->tables, ncap * sizeof *nt);
        if (!nt) {
            rc = nomem("config table");
        } else {
            c->tables = nt;
            c->cap_tables = ncap;
        }
    }
    if (rc == DT_OK && (errs.n || errs.dropped)) {
        dt_errlist_fail(&errs, DT_ERR_CONFIG);
        if (!(t.error = strdup(dt_last_error())))
            rc = nomem("config table");
    }
    if (rc != DT_OK) {
        free_table(&t);
        return rc;
    }
    c->tables[c->n_tables++] = t;
    for (size_t i = 0; i < c->n_aside; i++)
        if (strcmp(c->aside[i], table) == 0) { /* selected after all */
            free(c->aside[i]);
            memmove(&c->aside[i], &c->aside[i + 1], (c->n_aside - i - 1) * sizeof *c->aside);
            c->n_aside--;
            break;
        }
    return t.error ? dt_err_set(DT_ERR_CONFIG, "%s", t.error) : DT_OK;
}

int dt_config_apply_schema(dt_config_t *c, const char *table,
                           const dt_config_key_t *keys, uint32_t n_keys)
{
    return apply_schema(c, table, keys, n_keys, 0);
}

int dt_config_set_aside(dt_config_t *c, const char *table, const dt_config_key_t *keys,
                        uint32_t n_keys)
{
    return apply_schema(c, table, keys, n_keys, 1);
}

const char *dt_config_aside(const dt_config_t *c, size_t i)
{
    return c && i < c->n_aside ? c->aside[i] : NULL;
}

size_t dt_config_unclaimed(const dt_config_t *c, const char **names, size_t cap)
{
    size_t n = 0;
    if (!c)
        return 0;
    for (size_t i = 0; i < c->root->u.children.n; i++) {
        const dt_toml_node_t *t = &c->root->u.children.items[i];
        if (t->type == DT_TOML_TABLE && !find_table(c, t->key) && !is_aside(c, t->key)) {
            if (n < cap)
                names[n] = t->key;
            n++;
        }
    }
    for (size_t i = 0; i < c->n_ovr; i++) {
        const char *t = c->ovr[i].table;
        int seen = find_table(c, t) || is_aside(c, t) || root_child(c, t);
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(c->ovr[j].table, t) == 0;
        if (!seen) {
            if (n < cap)
                names[n] = t;
            n++;
        }
    }
    return n;
}

/* A --set of a table already claimed takes effect at once, checked as it
 * would have been before the claim: unknown keys with a did-you-mean,
 * types, ranges and choices.  The schema's keys are rebuilt from the
 * table's values, which keep everything the check needs. */
static int apply_to_claimed(const dt_config_t *c, ctable_t *t, const override_t *o)
{
    dt_config_key_t *keys = calloc(t->n ? t->n : 1, sizeof *keys);
    if (!keys)
        return nomem("--set");
    uint32_t at = t->n;
    for (uint32_t i = 0; i < t->n; i++) {
        const cval_t *v = &t->vals[i];
        keys[i] = (dt_config_key_t){.name = v->name, .type = v->type, .min = v->min,
                                    .max = v->max, .choices = v->choices};
        if (strcmp(v->name, o->key) == 0)
            at = i;
    }
    char loc[1200];
    snprintf(loc, sizeof loc, "--set %s", o->assign);
    int rc;
    if (at == t->n) {
        rc = unknown_key(c, loc, t->name, keys, t->n, o->key, o->node);
    } else {
        cval_t v = t->vals[at];
        v.s = NULL;
        source_t src = {.origin = DT_ORIGIN_CLI, .loc = loc, .fail = DT_ERR_CONFIG};
        rc = resolve_value(t->name, &keys[at], o->node, o->text, &src, &v);
        if (rc == DT_OK) {
            free(t->vals[at].s);
            t->vals[at] = v;
        }
    }
    free(keys);
    return rc;
}

int dt_config_claimed(const dt_config_t *c, const char *table)
{
    return c && table && find_table(c, table) != NULL;
}

/* ------------------------------------------------------------------------
 * Unclaimed tables
 * --------------------------------------------------------------------- */

/* "; did you mean [train]?" among the claimed tables; or, with nothing
 * close, the list of tables in use. */
static void suggest_table(const dt_config_t *c, const char *word, char *buf,
                          size_t size)
{
    buf[0] = '\0';
    if (c->n_tables == 0)
        return;
    const char **names = malloc(c->n_tables * sizeof *names);
    if (!names)
        return;
    for (size_t i = 0; i < c->n_tables; i++)
        names[i] = c->tables[i].name;
    const char *best = dt_suggest(word, names, c->n_tables);
    if (best) {
        snprintf(buf, size, "; did you mean [%s]?", best);
    } else {
        sink_t s = {.mode = SINK_BUF, .buf = buf, .cap = size};
        sink_str(&s, "; the tables in use are");
        for (size_t i = 0; i < c->n_tables; i++) {
            sink_str(&s, i ? ", [" : " [");
            sink_str(&s, names[i]);
            sink_str(&s, "]");
        }
    }
    free(names);
}

static int unknown_table(const dt_config_t *c, const char *loc,
                         const char *table, const char *alias, const char *hint)
{
    char sug[2048];
    if (alias && *alias)
        return dt_err_set(DT_ERR_CONFIG, "%s: unknown table [%s]; %s", loc, table, alias);
    suggest_table(c, table, sug, sizeof sug);
    return dt_err_set(DT_ERR_CONFIG, "%s: unknown table [%s]%s%s%s%s", loc,
                      table, sug, hint && *hint ? " (" : "", hint ? hint : "",
                      hint && *hint ? ")" : "");
}

/* A key written above every [table] heading: name the claimed table that
 * declares it (or a close one), since that is where it was meant to go. */
static int stray_key(const dt_config_t *c, const char *loc, const char *key,
                     const dt_toml_node_t *value)
{
    const char *home = NULL, *close_key = NULL, *close_table = NULL;
    for (size_t i = 0; i < c->n_tables && !home; i++) {
        const ctable_t *t = &c->tables[i];
        for (uint32_t j = 0; j < t->n; j++) {
            if (strcmp(t->vals[j].name, key) == 0) {
                home = t->name;
                break;
            }
            const char *cand = t->vals[j].name;
            if (!close_key && dt_suggest(key, &cand, 1)) {
                close_key = cand;
                close_table = t->name;
            }
        }
    }
    char alias[512];
    if (home)
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: key '%s' is outside any table; did you mean to "
                          "put it under [%s]?",
                          loc, key, home);
    if (alias_hint(c, "", key, value, alias, sizeof alias))
        return dt_err_set(DT_ERR_CONFIG, "%s: key '%s' is outside any table; %s", loc, key,
                          alias);
    if (close_key)
        return dt_err_set(DT_ERR_CONFIG,
                          "%s: key '%s' is outside any table; did you mean "
                          "'%s' under [%s]?",
                          loc, key, close_key, close_table);
    return dt_err_set(DT_ERR_CONFIG,
                      "%s: key '%s' is outside any table; every key belongs "
                      "under a [table] heading",
                      loc, key);
}

int dt_config_check_unclaimed(const dt_config_t *c, const char *hint)
{
    if (!c)
        return dt_err_set(DT_ERR_INVALID, "dt_config_check_unclaimed: NULL config");
    char loc[1200];
    dt_errlist_t errs = {.n = 0};
    for (size_t i = 0; i < c->root->u.children.n; i++) {
        const dt_toml_node_t *n = &c->root->u.children.items[i];
        if (find_table(c, n->key) || (n->type == DT_TOML_TABLE && is_aside(c, n->key)))
            continue;
        if (n->type == DT_TOML_TABLE || n->type == DT_TOML_ARRAY) {
            node_loc(c, n, 0, loc, sizeof loc);
            char alias[512] = "";
            if (!tree_alias(c, n->key, n, alias, sizeof alias))
                dt_config_alias("", n->key, alias, sizeof alias);
            unknown_table(c, loc, n->key, alias, hint);
        } else {
            node_loc(c, n, 1, loc, sizeof loc);
            stray_key(c, loc, n->key, n);
        }
        dt_errlist_add(&errs, NULL);
    }
    for (size_t i = 0; i < c->n_ovr; i++) {
        if (find_table(c, c->ovr[i].table) || is_aside(c, c->ovr[i].table))
            continue;
        snprintf(loc, sizeof loc, "--set %s", c->ovr[i].assign);
        char alias[512] = "";
        if (!alias_hint(c, c->ovr[i].table, c->ovr[i].key, c->ovr[i].node, alias, sizeof alias))
            dt_config_alias("", c->ovr[i].table, alias, sizeof alias);
        unknown_table(c, loc, c->ovr[i].table, alias, hint);
        dt_errlist_add(&errs, NULL);
    }
    return dt_errlist_fail(&errs, DT_ERR_CONFIG);
}

/* ------------------------------------------------------------------------
 * Reading and setting resolved values
 * --------------------------------------------------------------------- */

static cval_t *lookup(const dt_config_t *c, const char *path)
{
    if (!c || !path)
        return NULL;
    const char *dot = strchr(path, '.');
    if (!dot)
        return NULL;
    size_t tl = (size_t)(dot - path);
    for (size_t i = 0; i < c->n_tables; i++) {
        ctable_t *t = &c->tables[i];
        if (strlen(t->name) != tl || strncmp(t->name, path, tl) != 0)
            continue;
        for (uint32_t j = 0; j < t->n; j++)
            if (strcmp(t->vals[j].name, dot + 1) == 0)
                return &t->vals[j];
    }
    return NULL;
}

static int not_found(const char *path)
{
    return dt_err_set(DT_ERR_NOT_FOUND,
                      "config key '%s' was not declared by any schema",
                      path ? path : "(null)");
}

static int wrong_kind(const char *path, const cval_t *v, const char *want)
{
    return dt_err_set(DT_ERR_INVALID, "config key '%s' is %s, not %s", path,
                      type_noun(v->type), want);
}

int dt_config_get_bool(const dt_config_t *c, const char *path, int *out)
{
    const cval_t *v = lookup(c, path);
    if (!v)
        return not_found(path);
    if (v->type != DT_CFG_BOOL)
        return wrong_kind(path, v, "a boolean");
    *out = v->b;
    return DT_OK;
}

int dt_config_get_int(const dt_config_t *c, const char *path, int64_t *out)
{
    const cval_t *v = lookup(c, path);
    if (!v)
        return not_found(path);
    if (v->type != DT_CFG_INT)
        return wrong_kind(path, v, "an integer");
    *out = v->i;
    return DT_OK;
}

int dt_config_get_float(const dt_config_t *c, const char *path, double *out)
{
    const cval_t *v = lookup(c, path);
    if (!v)
        return not_found(path);
    if (v->type == DT_CFG_INT)
        *out = (double)v->i;
    else if (v->type == DT_CFG_FLOAT)
        *out = v->f;
    else
        return wrong_kind(path, v, "a float");
    return DT_OK;
}

int dt_config_get_string(const dt_config_t *c, const char *path,
                         const char **out)
{
    const cval_t *v = lookup(c, path);
    if (!v)
        return not_found(path);
    if (v->type != DT_CFG_STRING && v->type != DT_CFG_ENUM)
        return wrong_kind(path, v, "a string");
    *out = v->s;
    return DT_OK;
}

dt_origin_t dt_config_origin(const dt_config_t *c, const char *path)
{
    const cval_t *v = lookup(c, path);
    return v ? v->origin : DT_ORIGIN_DEFAULT;
}

void dt_config_where(const dt_config_t *c, const char *path, char *buf,
                     size_t cap)
{
    const cval_t *v = lookup(c, path);
    const char *dot = path ? strchr(path, '.') : NULL;
    const override_t *o = NULL;
    if (v && v->origin == DT_ORIGIN_CLI && dot) {
        char table[256];
        snprintf(table, sizeof table, "%.*s", (int)(dot - path), path);
        o = find_override(c, table, dot + 1);
    }
    if (o) {
        snprintf(buf, cap, "--set %s", o->assign);
        return;
    }
    char val[512] = "";
    if (v) {
        sink_t s = {.mode = SINK_BUF, .buf = val, .cap = sizeof val};
        sink_value(&s, v);
    }
    if (v && v->origin == DT_ORIGIN_FILE) {
        char loc[1100];
        fmt_loc(c, v->line, 0, loc, sizeof loc);
        snprintf(buf, cap, "%s: %s = %s", loc, path, val);
    } else {
        snprintf(buf, cap, "%s = %s (%s)", path ? path : "(null)", val,
                 dt_config_origin_name(v ? v->origin : DT_ORIGIN_DEFAULT));
    }
}

const char *dt_config_origin_name(dt_origin_t o)
{
    switch (o) {
    case DT_ORIGIN_FILE: return "file";
    case DT_ORIGIN_CLI: return "--set";
    case DT_ORIGIN_DERIVED: return "derived";
    case DT_ORIGIN_PRESET: return "preset";
    default: return "default";
    }
}

/* The values the core sets pass the same range check as user input: a
 * derived grad_accum of 0 is as wrong as a written one. */
int dt_config_set_int(dt_config_t *c, const char *path, int64_t i,
                      dt_origin_t origin)
{
    cval_t *v = lookup(c, path);
    if (!v)
        return not_found(path);
    if (v->type != DT_CFG_FLOAT && v->type != DT_CFG_INT)
        return wrong_kind(path, v, "an integer");
    double d = (double)i;
    if (has_range(v->min, v->max) && !(d >= v->min && d <= v->max)) {
        char rng[160], num[64];
        fmt_range(v->type, v->min, v->max, rng, sizeof rng);
        snprintf(num, sizeof num, "%" PRId64, i);
        const char *dot = strchr(path, '.');
        return dt_err_set(DT_ERR_CONFIG, "[%.*s] %s = %s (%s) is out of range (%s)",
                          (int)(dot - path), path, dot + 1, num,
                          dt_config_origin_name(origin), rng);
    }
    if (v->type == DT_CFG_INT)
        v->i = i;
    else
        v->f = d;
    v->origin = origin;
    v->line = 0;
    return DT_OK;
}

int dt_config_set_float(dt_config_t *c, const char *path, double f,
                        dt_origin_t origin)
{
    cval_t *v = lookup(c, path);
    if (!v)
        return not_found(path);
    if (v->type != DT_CFG_FLOAT)
        return wrong_kind(path, v, "a float");
    if (has_range(v->min, v->max) && !(f >= v->min && f <= v->max)) {
        char rng[160];
        fmt_range(v->type, v->min, v->max, rng, sizeof rng);
        const char *dot = strchr(path, '.');
        return dt_err_set(DT_ERR_CONFIG, "[%.*s] %s = %g (%s) is out of range (%s)",
                          (int)(dot - path), path, dot + 1, f,
                          dt_config_origin_name(origin), rng);
    }
    v->f = f;
    v->origin = origin;
    v->line = 0;
    return DT_OK;
}

int dt_config_set_bool(dt_config_t *c, const char *path, int b,
                       dt_origin_t origin)
{
    cval_t *v = lookup(c, path);
    if (!v)
        return not_found(path);
    if (v->type != DT_CFG_BOOL)
        return wrong_kind(path, v, "a boolean");
    v->b = b != 0;
    v->origin = origin;
    v->line = 0;
    return DT_OK;
}

int dt_config_set_choice(dt_config_t *c, const char *path, const char *s,
                         dt_origin_t origin)
{
    cval_t *v = lookup(c, path);
    if (!v)
        return not_found(path);
    if (v->type != DT_CFG_ENUM)
        return wrong_kind(path, v, "one of its choices");
    if (!in_choices(v->choices, s)) {
        char ch[512];
        fmt_choices(v->choices, ch, sizeof ch);
        const char *dot = strchr(path, '.');
        return dt_err_set(DT_ERR_CONFIG, "[%.*s] %s = \"%s\" (%s) is not one of %s",
                          (int)(dot - path), path, dot + 1, s,
                          dt_config_origin_name(origin), ch);
    }
    char *dup = strdup(s);
    if (!dup)
        return dt_err_set(DT_ERR_NOMEM, "config: out of memory");
    free(v->s);
    v->s = dup;
    v->origin = origin;
    v->line = 0;
    return DT_OK;
}

/* ------------------------------------------------------------------------
 * Printing and hashing
 * --------------------------------------------------------------------- */

/* Comments start at this column unless a line is longer (then two spaces
 * after it); very long values do not push every comment to the right. */
#define PRINT_COMMENT_COL 23

void dt_config_print(const dt_config_t *c, FILE *f)
{
    if (!c || !f)
        return;
    for (size_t ti = 0; ti < c->n_tables; ti++) {
        const ctable_t *t = &c->tables[ti];
        fprintf(f, "%s[%s]\n", ti ? "\n" : "", t->name);
        for (uint32_t i = 0; i < t->n; i++) {
            const cval_t *v = &t->vals[i];
            sink_t count = {.mode = SINK_COUNT};
            sink_value(&count, v);
            size_t len = strlen(v->name) + 3 + count.count;
            sink_t out = {.mode = SINK_FILE, .f = f};
            fprintf(f, "%s = ", v->name);
            sink_value(&out, v);
            size_t pad = len + 2 > PRINT_COMMENT_COL ? 2 : PRINT_COMMENT_COL - len;
            fprintf(f, "%*s# %s", (int)pad, "", dt_config_origin_name(v->origin));
            if (v->origin == DT_ORIGIN_FILE) {
                if (v->line > 0)
                    fprintf(f, " %s:%d", c->name, v->line);
                else
                    fprintf(f, " %s", c->name);
            }
            fputc('\n', f);
        }
    }
}

/* Items are visited in (table, key) order by repeated minimum search:
 * quadratic, but a config has ~100 values and this way hashing cannot
 * fail on memory. */
static int item_less(const char *ta, const char *ka, const char *tb,
                     const char *kb)
{
    int r = strcmp(ta, tb);
    return r < 0 || (r == 0 && strcmp(ka, kb) < 0);
}

int dt_config_walk(const dt_config_t *c, dt_config_walk_fn fn, void *ctx)
{
    if (!c)
        return DT_OK;
    const char *last_t = NULL, *last_k = NULL;
    char text[512];
    for (;;) {
        const ctable_t *bt = NULL;
        const cval_t *bv = NULL;
        for (size_t i = 0; i < c->n_tables; i++) {
            const ctable_t *t = &c->tables[i];
            for (uint32_t j = 0; j < t->n; j++) {
                const cval_t *v = &t->vals[j];
                if (last_t && !item_less(last_t, last_k, t->name, v->name))
                    continue;
                if (!bv || item_less(t->name, v->name, bt->name, bv->name)) {
                    bt = t;
                    bv = v;
                }
            }
        }
        if (!bv)
            break;
        sink_t h = {.mode = SINK_HASH, .h = FNV_OFFSET};
        sink_value(&h, bv);
        sink_t s = {.mode = SINK_BUF, .buf = text, .cap = sizeof text};
        text[0] = '\0';
        sink_value(&s, bv);
        int rc = fn(bt->name, bv->name, text, h.h, ctx);
        if (rc)
            return rc;
        last_t = bt->name;
        last_k = bv->name;
    }
    return DT_OK;
}

int dt_config_per_node(const char *table, const char *key)
{
    return strcmp(table, "launch") == 0 && strcmp(key, "node_rank") == 0;
}

static int hash_item(const char *table, const char *key, const char *text, uint64_t vh,
                     void *ctx)
{
    (void)text; /* may be cut short; the value's own hash covers all of it */
    if (dt_config_per_node(table, key))
        return DT_OK;
    sink_t *s = ctx;
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(vh >> (8 * i));
    sink_str(s, table);
    sink_put(s, ".", 1);
    sink_str(s, key);
    sink_put(s, "=", 1);
    sink_put(s, (const char *)b, sizeof b);
    sink_put(s, "\n", 1);
    return DT_OK;
}

uint64_t dt_config_hash(const dt_config_t *c)
{
    sink_t s = {.mode = SINK_HASH, .h = FNV_OFFSET};
    dt_config_walk(c, hash_item, &s);
    return s.h;
}
