/*
 * core/train/consistency.c - every rank must run the same resolved config;
 * check it once at start and name the keys that differ.
 *
 * The common case costs one tiny all_gather of the config hash.  Only when
 * hashes differ does rank 0 broadcast its (key, value) list, every rank diff
 * its own against it, and the descriptions get gathered so that every rank
 * fails with the same message.
 */
#include "train/consistency.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#define KEY_MAX 80
#define TEXT_MAX 48
#define DIFF_MAX 480

/* One resolved value as rank 0 sends it (plain bytes). */
typedef struct item {
    uint64_t value_hash;
    char key[KEY_MAX];   /* "table.key" */
    char text[TEXT_MAX]; /* the value, cut */
} item_t;

typedef struct list {
    item_t *v;
    size_t n, cap;
} list_t;

static int collect(const char *table, const char *key, const char *text, uint64_t vh, void *ctx)
{
    list_t *l = ctx;
    if (dt_config_per_node(table, key))
        return DT_OK; /* differs between nodes by design */
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        item_t *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return dt_err_set(DT_ERR_NOMEM, "out of memory");
        l->v = v;
        l->cap = cap;
    }
    item_t *it = &l->v[l->n++];
    memset(it, 0, sizeof *it);
    it->value_hash = vh;
    snprintf(it->key, sizeof it->key, "%s.%s", table, key);
    snprintf(it->text, sizeof it->text, "%s", text);
    return DT_OK;
}

__attribute__((format(printf, 3, 4))) static void appendf(char *buf, size_t cap,
                                                          const char *fmt, ...)
{
    size_t len = strlen(buf);
    if (len + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
}

/* This rank's differences from rank 0's list, as "key = v (origin; rank 0:
 * w)" phrases. */
static void diff(const dt_config_t *cfg, const list_t *mine, const item_t *r0, size_t n0,
                 char *out, size_t cap)
{
    out[0] = '\0';
    for (size_t i = 0; i < mine->n; i++) {
        const item_t *a = &mine->v[i];
        const item_t *b = NULL;
        for (size_t j = 0; j < n0 && !b; j++)
            if (strcmp(r0[j].key, a->key) == 0)
                b = &r0[j];
        if (b && b->value_hash == a->value_hash)
            continue;
        appendf(out, cap, "%s%s = %s (%s; rank 0: %s)", out[0] ? "; " : "", a->key, a->text,
                dt_config_origin_name(dt_config_origin(cfg, a->key)), b ? b->text : "not set");
    }
    for (size_t j = 0; j < n0; j++) {
        int found = 0;
        for (size_t i = 0; i < mine->n && !found; i++)
            found = strcmp(r0[j].key, mine->v[i].key) == 0;
        if (!found)
            appendf(out, cap, "%s%s not set (rank 0: %s)", out[0] ? "; " : "", r0[j].key,
                    r0[j].text);
    }
    if (strlen(out) + 1 >= cap && cap > 4)
        memcpy(out + cap - 4, "...", 4);
}

int dt_consistency_check(const dt_world_t *w, const dt_config_t *cfg,
                         dt_comm_t *comm)
{
    if (w->size <= 1)
        return DT_OK;
    int64_t *hashes = calloc((size_t)w->size, sizeof *hashes);
    if (!hashes)
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    int64_t mine = (int64_t)dt_config_hash(cfg);
    int rc = dt_comm_ops(comm)->all_gather(comm, &mine, hashes, 1, DT_I64, NULL, NULL);
    int same = 1;
    for (int r = 1; r < w->size && !rc; r++)
        same &= hashes[r] == hashes[0];
    free(hashes);
    if (rc)
        return dt_err_context(rc, "comparing the config hash across ranks");
    if (same)
        return DT_OK;

    /* Someone differs: find out what. */
    list_t l = {0};
    char *all = NULL;
    item_t *r0 = NULL;
    if ((rc = dt_config_walk(cfg, collect, &l)))
        goto out;
    int64_t n0 = (int64_t)l.n;
    if ((rc = dt_comm_ops(comm)->broadcast(comm, &n0, 1, DT_I64, 0, NULL, NULL)))
        goto out;
    r0 = calloc(n0 > 0 ? (size_t)n0 : 1, sizeof *r0);
    all = calloc((size_t)w->size, DIFF_MAX);
    if (!r0 || !all) {
        rc = dt_err_set(DT_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (w->rank == 0)
        memcpy(r0, l.v, (size_t)n0 * sizeof *r0);
    if ((rc = dt_comm_ops(comm)->broadcast(comm, r0, (uint64_t)n0 * sizeof *r0, DT_U8, 0, NULL,
                                           NULL)))
        goto out;
    char d[DIFF_MAX];
    diff(cfg, &l, r0, (size_t)n0, d, sizeof d);
    if ((rc = dt_comm_ops(comm)->all_gather(comm, d, all, DIFF_MAX, DT_U8, NULL, NULL)))
        goto out;
    char msg[2048] = "";
    int shown = 0;
    for (int r = 1; r < w->size; r++) {
        const char *dr = all + (size_t)r * DIFF_MAX;
        if (!dr[0])
            continue;
        if (shown++ == 3) {
            appendf(msg, sizeof msg, "; and more ranks");
            break;
        }
        appendf(msg, sizeof msg, "%srank %d: %s", shown > 1 ? "; " : "", r, dr);
    }
    rc = dt_err_set(DT_ERR_CONFIG,
                    "%s: the ranks were started with different configs (every rank must "
                    "resolve the same values): %s",
                    dt_config_path(cfg), msg[0] ? msg : "the hashes differ");
out:
    free(l.v);
    free(r0);
    free(all);
    return rc;
}
