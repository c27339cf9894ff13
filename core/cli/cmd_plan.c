/*
 * core/cli/cmd_plan.c - `dtrain plan CONFIG [--world N] [--model PRESET]`:
 * per-rank memory by tag and communication per step for every
 * data-parallel strategy, predicted without running anything.
 *
 * The rows: every strategy plugin on the plugin search path (the config's
 * run.plugin_path included) and the config's own parallel.data, one row
 * per preset the plugin lists (plan_presets: ZeRO's stages, FSDP's
 * sharding strategies), one row with its defaults when it lists none.
 * The config is parsed once; each row selects its strategy and preset on
 * it and loads what it then selects, so the numbers come from the strategy
 * plugin's own estimate() with its knobs as the config sets them; a
 * strategy that does not load, or that refuses the layout (a hybrid group
 * that does not divide the world), shows why.
 *
 * Deciding: --device-memory adds whether each row fits and recommends the
 * row that sends the least per step among those that fit (none fitting:
 * the smallest, and each remedy planned for it alone, most first);  --link-gbps
 * adds the time each row's traffic takes on such a link.
 *
 * Offload: --offload TIER (or the config's [parallel] offload) adds under
 * each row one sub-row per offload_what value the strategy accepts, with
 * the device bytes and the tier's bytes and I/O per rank; the recommendation
 * then takes a sub-row only where no row fits without offload.  A flag, not
 * always-on sub-rows: they triple the table, and the table without a tier
 * is the one most plans need; the numbers do not depend on which tier (the
 * same bytes in host memory or in NVMe files), only the header's words do.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "config/config.h"
#include "loader/loader.h"
#include "model/model.h"
#include "train/plan.h"
#include "train/preflight.h"
#include "train/stage_runner.h"
#include "train/batch_lr.h"
#include "setup/resolve.h"
#include "util/error.h"

void dt_help_plan(FILE *f)
{
    fprintf(f,
            "usage: dtrain plan CONFIG [--world N] [--model PRESET] [--device-memory SIZE]\n"
            "                          [--link-gbps GBPS] [--offload TIER]\n"
            "                          [--set table.key=value ...]\n\n"
            "Predict, for every data-parallel strategy, the peak bytes per rank by tag\n"
            "(params, grads, optimizer, activations, comm buffers), the model state per\n"
            "rank, and the bytes each rank sends per step, for the model and batch CONFIG\n"
            "describes.  The strategies: every strategy plugin on the plugin search path\n"
            "and the config's parallel.data, one row per preset a plugin lists (zero's\n"
            "stages 1-3, fsdp's sharding strategies), else one with its defaults.\n"
            "--world defaults to launch.nproc; --model picks a preset of the config's arch\n"
            "(gpt2: gpt2-124m ... gpt2-1558m; llama: smollm-135m, tinyllama-1.1b,\n"
            "llama-3.2-1b ...).  Nothing is allocated, so any size can be planned on any\n"
            "machine.\n\n"
            "--device-memory SIZE  memory per rank (80GiB, 24GiB, 512MiB; binary KiB MiB GiB\n"
            "                      TiB, or decimal KB MB GB TB): a \"fits\" column, and the\n"
            "                      recommended strategy: of those that fit, the one that\n"
            "                      sends the least per step (within 1%%: the least memory);\n"
            "                      when none fits, the smallest and what lowers it, each\n"
            "                      planned alone, most first: activation checkpointing, a\n"
            "                      micro-batch of 1, offload, twice the ranks\n"
            "--link-gbps GBPS      link bandwidth per rank in Gb/s (10^9 bit/s): a column\n"
            "                      with each strategy's communication time per step, its\n"
            "                      ring algorithms' bytes over the link (bandwidth-bound,\n"
            "                      no latency, no overlap with compute)\n"
            "--offload TIER        an offload plugin (offload_cpu: host memory, offload_nvme:\n"
            "                      NVMe files; default: the config's parallel.offload, none\n"
            "                      for none): under each strategy a row per offload_what it\n"
            "                      accepts (optimizer; params and optimizer_and_params only\n"
            "                      where parameters can be offloaded), with device bytes and\n"
            "                      the tier's bytes and I/O per step per rank; with\n"
            "                      --device-memory a row that fits only with offload says\n"
            "                      \"offload\", and an offload choice is recommended only when\n"
            "                      nothing fits without, the least tier I/O first\n"
            "Sizes print in binary units (1 MiB = 2^20 bytes), bandwidth in decimal ones.\n"
            "exit codes: 0 planned, 2 usage or config error\n");
}

/* A row: strategy plugin `plugin` with the settings of its table that
 * select the row ("zero.stage=1"). */
#define PLAN_MAX_SETS 8
typedef struct variant {
    char label[64];
    char plugin[64];
    char sets[PLAN_MAX_SETS][160];
    int n_sets;
    char err[512]; /* the plugin's presets could not be read: why */
} variant_t;

typedef struct variants {
    variant_t *v;
    size_t n, cap;
} variants_t;

static variant_t *variant_add(variants_t *vs, const char *plugin, const char *label)
{
    if (vs->n == vs->cap) {
        size_t cap = vs->cap ? 2 * vs->cap : 16;
        variant_t *grown = realloc(vs->v, cap * sizeof *grown);
        if (!grown)
            return NULL;
        vs->v = grown;
        vs->cap = cap;
    }
    variant_t *v = &vs->v[vs->n++];
    memset(v, 0, sizeof *v);
    snprintf(v->plugin, sizeof v->plugin, "%s", plugin);
    snprintf(v->label, sizeof v->label, "%s", label);
    return v;
}

/* A preset's "key=value key2=value2" as --set assignments of table
 * `plugin` into v; 0 when malformed. */
static int variant_sets(variant_t *v, const char *set)
{
    const char *p = set ? set : "";
    while (*p) {
        while (*p == ' ')
            p++;
        size_t len = strcspn(p, " ");
        if (!len)
            break;
        const char *eq = memchr(p, '=', len);
        if (!eq || eq == p || v->n_sets == PLAN_MAX_SETS)
            return 0;
        int n = snprintf(v->sets[v->n_sets], sizeof v->sets[0], "%s.%.*s", v->plugin,
                         (int)len, p);
        if (n < 0 || (size_t)n >= sizeof v->sets[0])
            return 0;
        v->n_sets++;
        p += len;
    }
    return 1;
}

/* The rows of strategy plugin `name`: one per preset it lists, or one
 * with its defaults.  A plugin that does not load gets one row, which
 * fails to resolve and so says why. */
static int add_strategy(variants_t *vs, const char *name, const dt_search_path_t *sp)
{
    dt_plugin_t *p = NULL;
    const dt_plan_preset_t *pre = NULL;
    uint32_t n = 0;
    /* presets need no instance and no config: open, never bind */
    int rc = dt_plugin_open(sp, DT_KIND_STRATEGY, name, &p);
    if (rc == DT_OK) {
        const dt_strategy_ops_t *ops = p->ops;
        if (DT_HAS_OP(dt_strategy_ops_t, ops, plan_presets) &&
            (rc = ops->plan_presets(&pre, &n)) != DT_OK)
            dt_plugin_failed(p, rc, "plan_presets");
    }
    if (rc != DT_OK || n == 0 || !pre) {
        variant_t *v = variant_add(vs, name, name);
        if (!v) {
            dt_plugin_unload(p);
            return DT_ERR_NOMEM;
        }
        if (p && rc != DT_OK)
            snprintf(v->err, sizeof v->err, "%s", dt_last_error());
        dt_plugin_unload(p);
        return DT_OK;
    }
    for (uint32_t i = 0; i < n; i++) {
        variant_t *v = variant_add(vs, name, pre[i].label && pre[i].label[0] ? pre[i].label
                                                                            : name);
        if (!v) {
            dt_plugin_unload(p);
            return DT_ERR_NOMEM;
        }
        if (!variant_sets(v, pre[i].set))
            snprintf(v->err, sizeof v->err,
                     "strategy/%s: plan preset '%s' sets \"%s\", not up to %d "
                     "key=value assignments separated by spaces",
                     name, v->label, pre[i].set, PLAN_MAX_SETS);
    }
    dt_plugin_unload(p); /* labels and settings were copied */
    return DT_OK;
}

/* A strategy row's place: the plugins in dtrain's own plugin folder (the
 * search path's last) first, then those found elsewhere (a user's or a
 * third party's), each group by name.  Only the order of the rows:
 * nothing here depends on which strategy a plugin is. */
typedef struct strategy_row {
    const char *name;
    int elsewhere; /* 0: in dtrain's own plugin folder */
} strategy_row_t;

static int cmp_strategy(const void *a, const void *b)
{
    const strategy_row_t *x = a, *y = b;
    return x->elsewhere != y->elsewhere ? x->elsewhere - y->elsewhere : strcmp(x->name, y->name);
}

/* Whether plugin file `path` lies in folder `dir`. */
static int in_folder(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return dir[0] && strncmp(path, dir, n) == 0 && path[n] == '/' && !strchr(path + n + 1, '/');
}

/* Every row, in display order: the strategy plugins on the search path
 * and the config's own parallel.data. */
static int plan_variants(const dt_resolved_t *r, variants_t *vs)
{
    const char *own = r->set.parallel.data ? r->set.parallel.data : "";
    dt_plugin_listing_t *ls = NULL;
    size_t n = 0;
    int rc = dt_plugin_discover(r->search, &ls, &n);
    if (rc)
        return rc;
    strategy_row_t *names = malloc((n + 1) * sizeof *names);
    size_t nn = 0, n_dirs = dt_search_path_count(r->search);
    const char *own_dir = n_dirs ? dt_search_path_dir(r->search, n_dirs - 1) : "";
    int own_listed = !own[0] || strcmp(own, "none") == 0;
    for (size_t i = 0; names && i < n; i++)
        if (ls[i].kind == DT_KIND_STRATEGY) {
            names[nn++] = (strategy_row_t){ls[i].name, !in_folder(ls[i].path, own_dir)};
            own_listed |= strcmp(ls[i].name, own) == 0;
        }
    if (names && !own_listed)
        names[nn++] = (strategy_row_t){own, 1}; /* not found: its row says so */
    if (!names)
        rc = dt_err_set(DT_ERR_NOMEM, "plan: out of memory");
    else
        qsort(names, nn, sizeof *names, cmp_strategy);
    for (size_t i = 0; rc == DT_OK && i < nn; i++)
        rc = add_strategy(vs, names[i].name, r->search);
    if (rc == DT_ERR_NOMEM)
        dt_err_set(rc, "plan: out of memory");
    free(names);
    free(ls);
    return rc;
}

/* Apply --model PRESET: model.preset, and the keys (of any kind) the
 * model plugin's preset slot says it sets, as --set would (--model
 * replaces the file's shape, not just its defaults). */
static int apply_preset(dt_resolved_t *r, const char *preset)
{
    char buf[128];
    snprintf(buf, sizeof buf, "model.preset=%s", preset);
    int rc = dt_resolve_set(r, buf);
    if (!rc)
        rc = dt_resolve_plugin(r, DT_ROLE_MODEL, NULL, NULL);
    const dt_model_ops_t *ops = dt_resolved_model(r);
    if (rc || !DT_HAS_OP(dt_model_ops_v1_t, ops, preset))
        return rc;
    dt_model_key_t keys[DT_MODEL_MAX_KEYS];
    uint32_t n = ops->preset(preset, keys, DT_MODEL_MAX_KEYS);
    for (uint32_t k = 0; k < n && !rc; k++) {
        const dt_model_key_t *key = &keys[k];
        const char *table = dt_model_key_table(ops->info.name, key->key);
        if (key->kind == DT_MODEL_KEY_BOOL)
            snprintf(buf, sizeof buf, "%s.%s=%s", table, key->key, key->value ? "true" : "false");
        else if (key->kind == DT_MODEL_KEY_FLOAT)
            snprintf(buf, sizeof buf, "%s.%s=%.17g", table, key->key, key->f);
        else if (key->kind == DT_MODEL_KEY_CHOICE)
            snprintf(buf, sizeof buf, "%s.%s=%s", table, key->key, key->s ? key->s : "");
        else
            snprintf(buf, sizeof buf, "%s.%s=%lld", table, key->key, (long long)key->value);
        rc = dt_resolve_set(r, buf);
    }
    return rc;
}

/* Select the variant on the one resolved config (its strategy and that
 * strategy's settings) and load what the config then selects.  The
 * config's own strategy (`own`) is blamed where the config names it
 * (`own_where`, taken before any row changed the selection); a row plan
 * added is plan's, never a --set the user did not give. */
static int select_variant(dt_resolved_t *r, const variant_t *v, const char *own,
                          const char *own_where)
{
    if (v->err[0])
        return dt_err_set(DT_ERR_INVALID, "%s", v->err);
    char data[96];
    snprintf(data, sizeof data, "parallel.data=%s", v->plugin);
    int rc = dt_resolve_set(r, data);
    for (int k = 0; rc == DT_OK && k < v->n_sets; k++)
        rc = dt_resolve_set(r, v->sets[k]);
    char by[160];
    snprintf(by, sizeof by, "dtrain plan's row for strategy '%s'", v->plugin);
    if (rc == DT_OK)
        rc = dt_resolve_plugin(r, DT_ROLE_DATA, NULL,
                               strcmp(v->plugin, own) == 0 ? own_where : by);
    return rc ? rc : dt_resolve_plugins(r);
}

/* What decides: --device-memory and --link-gbps (0: not given), and
 * the offload tier whose choices are planned under each row. */
typedef struct plan_limits {
    uint64_t mem;      /* bytes per rank */
    double gbps;       /* link, 10^9 bit/s */
    const char *tier;  /* --offload or [parallel] offload; NULL: none */
    int width;         /* the label column */
} plan_limits_t;

/* A planned row or offload sub-row, for the recommendation. */
typedef struct plan_row {
    char label[128];
    uint64_t total, sent, held, traffic; /* held, traffic: the tier's */
    int planned, offload;
    size_t variant; /* its variant (row of the table) */
    char what[40];  /* an offload sub-row's offload_what; "" for a row */
} plan_row_t;

/* Traffic within this fraction of the least counts as the same. */
#define PLAN_TRAFFIC_TIE 0.01
/* offload_what choices planned per row, at most */
#define PLAN_MAX_CHOICES 4

#define PLAN_COLS "%-*s %11s %11s %11s %11s %11s %11s %12s %12s"

static void print_header(const dt_resolved_t *r, dt_model_t *m, int64_t world,
                         const plan_limits_t *lim, const char *tier_summary)
{
    const dt_model_info_t *mi = dt_model_info(m);
    char b[32];
    printf("plan: %s, %.2fM parameters, %s, %s; %lld rank(s); micro-batch %lld x %lld "
           "tokens\n",
           mi->arch, (double)mi->global_numel / 1e6, mi->dtype,
           dt_optim_name(r->set.optimizer.type), (long long)world,
           (long long)r->set.train.micro_batch, (long long)r->set.train.seq_len);
    printf("units: sizes binary (1 MiB = 2^20 bytes, 1 GiB = 2^30 bytes), bandwidth decimal "
           "(1 Gb/s = 10^9 bit/s)\n");
    if (mi->tensor_parallel > 1)
        printf("tensor parallel: %d ranks; the rows plan tensor rank 0's part of the model "
               "(%.2fM parameters) over the %lld ranks holding the same part\n",
               (int)mi->tensor_parallel, (double)dt_model_desc(m)->numel / 1e6,
               (long long)(world / mi->tensor_parallel));
    if (lim->mem)
        printf("device memory: %s per rank (fits: total/rank within it%s)\n",
               dt_plan_bytes(lim->mem, b, sizeof b),
               lim->tier ? "; \"offload\": only with one of the offload rows under it" : "");
    if (lim->gbps > 0)
        printf("link: %.2f Gb/s per rank (comm/step: sent/step over it; ring algorithms, "
               "bandwidth-bound, no latency, no overlap with compute)\n",
               lim->gbps);
    if (lim->tier)
        printf("offload: %s (%s); under each strategy a row per offload_what it accepts: "
               "device bytes in the columns, tier/rank what the tier holds per rank (not "
               "in total/rank), tier I/O what a step reads from and writes to it\n",
               lim->tier, tier_summary);
    printf("\n" PLAN_COLS, lim->width, "strategy", "params", "grads", "optimizer",
           "activations", "comm bufs", "model state", "total/rank", "sent/step");
    if (lim->tier)
        printf(" %11s %11s", "tier/rank", "tier I/O");
    if (lim->gbps > 0)
        printf(" %11s", "comm/step");
    if (lim->mem)
        printf(" %*s", lim->tier ? 7 : 4, "fits");
    printf("\n");
}

/* `fits`: the fits cell ("yes", "no", "offload"). */
static void print_row(const char *label, const dt_estimate_t *e, const plan_limits_t *lim,
                      const char *fits)
{
    char b[11][32];
    uint64_t total = dt_plan_total(e);
    printf(PLAN_COLS, lim->width, label, dt_plan_bytes(e->bytes[DT_TAG_PARAMS], b[0], 32),
           dt_plan_bytes(e->bytes[DT_TAG_GRADS], b[1], 32),
           dt_plan_bytes(e->bytes[DT_TAG_OPTIMIZER], b[2], 32),
           dt_plan_bytes(e->bytes[DT_TAG_ACTIVATIONS], b[3], 32),
           dt_plan_bytes(e->bytes[DT_TAG_COMM], b[4], 32),
           dt_plan_bytes(dt_plan_model_state(e), b[5], 32), dt_plan_bytes(total, b[6], 32),
           dt_plan_bytes(e->comm_bytes_per_step, b[7], 32));
    if (lim->tier)
        printf(" %11s %11s", dt_plan_bytes(e->bytes[DT_TAG_OFFLOAD], b[9], 32),
               dt_plan_bytes(dt_plan_tier_traffic(e), b[10], 32));
    if (lim->gbps > 0)
        printf(" %11s",
               dt_plan_seconds(dt_plan_comm_seconds(e->comm_bytes_per_step, lim->gbps), b[8],
                               32));
    if (lim->mem)
        printf(" %*s", lim->tier ? 7 : 4, fits);
    printf("\n");
}

/* The best of the planned rows with offload == `offload` that fit: the
 * least tier I/O (0 without offload), of those within PLAN_TRAFFIC_TIE of
 * it the least traffic, of those within PLAN_TRAFFIC_TIE of that the
 * least memory per rank (the first of equals, in display order).  NULL
 * when none fits; *n_fit counts those that do. */
static const plan_row_t *pick(const plan_row_t *rows, size_t n, uint64_t mem, int offload,
                              size_t *n_fit)
{
    uint64_t least_io = UINT64_MAX, least_sent = UINT64_MAX;
    const plan_row_t *best = NULL;
    *n_fit = 0;
#define PLAN_FITS(x) ((x).planned && (x).offload == offload && (x).total <= mem)
#define PLAN_NEAR(v, least) ((double)(v) <= (double)(least) * (1.0 + PLAN_TRAFFIC_TIE))
    for (size_t i = 0; i < n; i++)
        if (PLAN_FITS(rows[i])) {
            (*n_fit)++;
            if (rows[i].traffic < least_io)
                least_io = rows[i].traffic;
        }
    for (size_t i = 0; i < n; i++)
        if (PLAN_FITS(rows[i]) && PLAN_NEAR(rows[i].traffic, least_io) &&
            rows[i].sent < least_sent)
            least_sent = rows[i].sent;
    for (size_t i = 0; i < n; i++)
        if (PLAN_FITS(rows[i]) && PLAN_NEAR(rows[i].traffic, least_io) &&
            PLAN_NEAR(rows[i].sent, least_sent) && (!best || rows[i].total < best->total))
            best = &rows[i];
#undef PLAN_NEAR
#undef PLAN_FITS
    return best;
}

/* What lowers the smallest row's memory when nothing fits: each remedy
 * planned on its own for that row (the same strategy, preset and offload
 * choice), the row's total with it. */
typedef struct remedy {
    char what[200]; /* "activation checkpointing (--set ...)" */
    uint64_t total;
} remedy_t;

#define PLAN_MAX_REMEDIES 4

typedef struct plan_ctx {
    dt_resolved_t *r;
    const variant_t *variants;
    const char *own, *own_where;
    int64_t world;
    int32_t tp;
} plan_ctx_t;

/* Row `row` planned again on a model built from the config as it now is,
 * at `world` ranks, with offload_what `what` on a tier ("": none): its
 * device total per rank. */
static int replan(const plan_ctx_t *c, const plan_row_t *row, const char *what, int64_t world,
                  uint64_t *total)
{
    dt_resolved_t *r = c->r;
    const variant_t *v = &c->variants[row->variant];
    dt_model_t *m = NULL;
    dt_estimate_t e = {.struct_size = sizeof e};
    int rc = select_variant(r, v, c->own, c->own_where);
    if (!rc && what[0]) {
        char set[160];
        snprintf(set, sizeof set, "%s.offload_what=%s", v->plugin, what);
        rc = dt_resolve_set(r, set);
    }
    if (!rc)
        rc = dt_model_create_part(r->cfg, r->plugin[DT_ROLE_DEVICE]->ops, dt_resolved_model(r),
                                  c->tp, 0, &m);
    if (!rc)
        rc = dt_plan_strategy_offload(r->plugin[DT_ROLE_DATA], m, &r->set,
                                      (int)(world / c->tp), what[0] != 0, &e);
    if (m)
        dt_model_free(m, NULL);
    *total = dt_plan_total(&e);
    return rc;
}

/* The remedies that lower `row` (nothing fits; `row` is the smallest),
 * most first: activation checkpointing of every unit (when not already),
 * micro-batches of 1 sequence (when larger), offload (when no tier was
 * planned: the strategy's offload_what choice that saves the most), twice
 * the ranks (what a sharded strategy's state shrinks by).  Each is planned
 * from the config as given with only that change; the config is restored
 * after each.  Returns how many lower it. */
static size_t remedies(const plan_ctx_t *c, const plan_row_t *row, const plan_limits_t *lim,
                       remedy_t *out)
{
    dt_resolved_t *r = c->r;
    size_t n = 0;
    uint64_t t;
    const char *was;
    char restore[160];
    if (dt_config_get_string(r->cfg, "model.activation_checkpointing", &was) == DT_OK &&
        strcmp(was, "all") != 0) {
        snprintf(restore, sizeof restore, "model.activation_checkpointing=%s", was);
        if (dt_resolve_set(r, "model.activation_checkpointing=all") == DT_OK &&
            replan(c, row, row->what, c->world, &t) == DT_OK && t < row->total) {
            snprintf(out[n].what, sizeof out[n].what,
                     "activation checkpointing (--set model.activation_checkpointing=all)");
            out[n++].total = t;
        }
        dt_resolve_set(r, restore);
    }
    const int64_t micro = r->set.train.micro_batch;
    if (micro > 1) {
        snprintf(restore, sizeof restore, "train.micro_batch=%lld", (long long)micro);
        if (dt_resolve_set(r, "train.micro_batch=1") == DT_OK &&
            replan(c, row, row->what, c->world, &t) == DT_OK && t < row->total) {
            snprintf(out[n].what, sizeof out[n].what,
                     "a micro-batch of 1 sequence (--set train.micro_batch=1)");
            out[n++].total = t;
        }
        dt_resolve_set(r, restore);
    }
    if (!lim->tier && !row->offload) {
        const dt_plugin_t *p = NULL;
        const dt_config_key_t *key = NULL;
        uint64_t best = row->total;
        char best_what[40] = "";
        if (select_variant(r, &c->variants[row->variant], c->own, c->own_where) == DT_OK)
            p = r->plugin[DT_ROLE_DATA];
        for (uint32_t k = 0; p && k < p->info->n_config_keys; k++)
            if (strcmp(p->info->config_keys[k].name, "offload_what") == 0)
                key = &p->info->config_keys[k];
        for (const char *v = key ? key->choices : NULL; v && *v;) {
            char what[40];
            size_t len = strcspn(v, "|");
            snprintf(what, sizeof what, "%.*s", (int)len, v);
            v += len + (v[len] == '|');
            if (replan(c, row, what, c->world, &t) == DT_OK && t < best) {
                best = t;
                snprintf(best_what, sizeof best_what, "%s", what);
            }
        }
        if (best_what[0]) {
            snprintf(out[n].what, sizeof out[n].what,
                     "offload (--offload offload_cpu --set %s.offload_what=%s)",
                     c->variants[row->variant].plugin, best_what);
            out[n++].total = best;
        }
    }
    if (replan(c, row, row->what, 2 * c->world, &t) == DT_OK && t < row->total) {
        snprintf(out[n].what, sizeof out[n].what, "twice the ranks (--world %lld)",
                 (long long)(2 * c->world));
        out[n++].total = t;
    }
    /* most first: the least total (stable: ties keep the order above) */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && out[j].total < out[j - 1].total; j--) {
            remedy_t x = out[j];
            out[j] = out[j - 1];
            out[j - 1] = x;
        }
    return n;
}

/* No offload where a row fits without it; else, with a tier planned, the
 * offload choice with the least tier I/O per step (then the least traffic,
 * then the least memory).  None fits: say which comes closest, and what
 * lowers it, most first (remedies). */
static void print_recommendation(const plan_ctx_t *c, const plan_row_t *rows, size_t n,
                                 const plan_limits_t *lim)
{
    const plan_row_t *smallest = NULL, *best;
    size_t n_fit = 0;
    char b[5][32];
    for (size_t i = 0; i < n; i++)
        if (rows[i].planned && (!smallest || rows[i].total < smallest->total))
            smallest = &rows[i];
    if (!smallest)
        return;
    int offload = 0;
    if (!(best = pick(rows, n, lim->mem, 0, &n_fit)) && lim->tier)
        best = pick(rows, n, lim->mem, offload = 1, &n_fit);
    if (!best) {
        printf("\nrecommended: none: no planned strategy fits in %s per rank; the smallest, "
               "%s, needs %s",
               dt_plan_bytes(lim->mem, b[0], 32), smallest->label,
               dt_plan_bytes(smallest->total, b[1], 32));
        remedy_t rem[PLAN_MAX_REMEDIES];
        const size_t nrem = remedies(c, smallest, lim, rem);
        if (!nrem)
            printf("; neither activation checkpointing, a smaller micro-batch, offload nor "
                   "more ranks lowers it\n");
        else
            printf("; what lowers it, each alone, most first:\n");
        for (size_t i = 0; i < nrem; i++)
            printf("  %s: %s per rank%s\n", rem[i].what, dt_plan_bytes(rem[i].total, b[2], 32),
                   rem[i].total <= lim->mem ? ", fits" : "");
        return;
    }
    printf("\nrecommended: %s (%s per rank of %s; ", best->label,
           dt_plan_bytes(best->total, b[0], 32), dt_plan_bytes(lim->mem, b[1], 32));
    if (offload)
        printf("the tier holds %s per rank and moves %s per step; ",
               dt_plan_bytes(best->held, b[3], 32), dt_plan_bytes(best->traffic, b[4], 32));
    printf("sends %s per step", dt_plan_bytes(best->sent, b[2], 32));
    if (lim->gbps > 0)
        printf(", %s at %.2f Gb/s",
               dt_plan_seconds(dt_plan_comm_seconds(best->sent, lim->gbps), b[0], 32),
               lim->gbps);
    if (offload && n_fit == 1)
        printf(")\n  nothing fits without offload; the only offload choice that fits\n");
    else if (offload)
        printf(")\n  nothing fits without offload; of the %zu offload choices that fit, the "
               "least tier I/O per step; of those within %.0f%% of it, the least traffic, "
               "then the least memory per rank\n",
               n_fit, PLAN_TRAFFIC_TIE * 100.0);
    else if (n_fit == 1)
        printf(")\n  the only strategy that fits\n");
    else
        printf(")\n  the least traffic of the %zu strategies that fit; of those within %.0f%% "
               "of it, the least memory per rank\n",
               n_fit, PLAN_TRAFFIC_TIE * 100.0);
}

/* The offload choices of a planned row: one estimate per value of the
 * strategy's offload_what key (dtrain/sdk/offload.h's DT_OFFLOAD_KEY_WHAT,
 * read from the plugin's declared keys, so any strategy declaring it is
 * planned alike), with the tier in use.  A value the row's configuration
 * refuses (DT_ERR_CONFIG: parameters outside zero stage 3 and fsdp
 * FULL_SHARD) is left out; another failure is kept with its message. */
typedef struct plan_choice {
    char what[40];
    int rc;
    char err[512];
    dt_estimate_t e;
} plan_choice_t;

static int plan_choices(dt_resolved_t *r, dt_model_t *m, int64_t world, plan_choice_t *c,
                        int *n)
{
    const dt_plugin_t *p = r->plugin[DT_ROLE_DATA];
    const dt_config_key_t *key = NULL;
    *n = 0;
    for (uint32_t k = 0; k < p->info->n_config_keys; k++)
        if (strcmp(p->info->config_keys[k].name, "offload_what") == 0)
            key = &p->info->config_keys[k];
    if (!key || !key->choices)
        return 0; /* keeps nothing in a tier */
    for (const char *v = key->choices; *v && *n < PLAN_MAX_CHOICES;) {
        size_t len = strcspn(v, "|");
        plan_choice_t *ch = &c[*n];
        char set[160];
        snprintf(ch->what, sizeof ch->what, "%.*s", (int)len, v);
        v += len + (v[len] == '|');
        snprintf(set, sizeof set, "%s.offload_what=%s", p->name, ch->what);
        memset(&ch->e, 0, sizeof ch->e);
        ch->e.struct_size = sizeof ch->e;
        ch->err[0] = 0;
        ch->rc = dt_resolve_set(r, set);
        if (ch->rc == DT_OK)
            ch->rc = dt_plan_strategy_offload(p, m, &r->set, (int)world, 1, &ch->e);
        if (ch->rc == DT_ERR_CONFIG)
            continue;
        if (ch->rc != DT_OK)
            snprintf(ch->err, sizeof ch->err, "%s", dt_last_error());
        (*n)++;
    }
    return 1;
}

/* --device-memory: a positive number and a unit, "80GiB" or "80 GiB";
 * 0 when it is not one. */
static int parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *name;
        double bytes;
    } units[] = {{"B", 1.0},      {"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30},
                 {"TiB", 0x1p40}, {"KB", 1e3},     {"MB", 1e6},     {"GB", 1e9},
                 {"TB", 1e12}};
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v <= 0)
        return 0;
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < DT_ARRAY_LEN(units); i++)
        if (strcmp(end, units[i].name) == 0) {
            double b = v * units[i].bytes;
            if (b < 1.0 || b >= 0x1p63)
                return 0;
            *out = (uint64_t)b;
            return 1;
        }
    return 0;
}

/* The command's own options; 0 or DT_EXIT_USAGE after saying why. */
static int parse_options(const char *const *vals, int64_t *world, plan_limits_t *lim)
{
    if (vals[0]) {
        char *end;
        *world = strtoll(vals[0], &end, 10);
        if (*end || *world < 1 || *world > 1000000) {
            fprintf(stderr, "dtrain plan: error: --world %s is not a rank count in 1..1000000\n",
                    vals[0]);
            return DT_EXIT_USAGE;
        }
    }
    if (vals[2] && !parse_size(vals[2], &lim->mem)) {
        fprintf(stderr,
                "dtrain plan: error: --device-memory %s is not a size: a number above 0 and a "
                "unit, binary KiB MiB GiB TiB or decimal KB MB GB TB (e.g. 80GiB)\n",
                vals[2]);
        return DT_EXIT_USAGE;
    }
    if (vals[3]) {
        char *end;
        lim->gbps = strtod(vals[3], &end);
        if (end == vals[3] || *end || !isfinite(lim->gbps) || lim->gbps <= 0) {
            fprintf(stderr,
                    "dtrain plan: error: --link-gbps %s is not a link bandwidth: a number of "
                    "Gb/s above 0 (e.g. 25)\n",
                    vals[3]);
            return DT_EXIT_USAGE;
        }
    }
    return DT_EXIT_OK;
}

/* The tier --offload names (or [parallel] offload does): it must load as
 * an offload plugin; its summary says where it keeps bytes (host memory,
 * NVMe).  DT_EXIT_USAGE after saying why. */
static int check_tier(const dt_resolved_t *r, const char *tier, const char *named_by,
                      char *summary, size_t cap)
{
    dt_plugin_t *p = NULL;
    int rc = dt_plugin_open(r->search, DT_KIND_OFFLOAD, tier, &p);
    if (rc != DT_OK) {
        fprintf(stderr, "dtrain plan: error: %s: offload tier '%s': %s\n", named_by, tier,
                dt_last_error());
        return DT_EXIT_USAGE;
    }
    snprintf(summary, cap, "%s", p->info->summary ? p->info->summary : "offload tier");
    dt_plugin_unload(p);
    return DT_EXIT_OK;
}

/* ---- pipeline: the model state (parameters, gradients,
 * optimizer) per rank of each stage under each planned row's data
 * strategy, over the data group (dt_plan_stage): state[row * p + k]. */
typedef struct stage_rows {
    const char **label; /* per row; NULL: not planned */
    uint64_t *state;
    size_t n;
} stage_rows_t;

/* The schedule plugin's layout: p stages of V chunks each (virtual
 * stage j = chunk j / p of stage j % p, units [start[j], start[j + 1])),
 * M micro-batches a step, and per stage the inputs its schedule stashes,
 * the micro-batches whose activations it keeps and the boundary tensors
 * its schedule allocates; bnd the bytes of one. */
typedef struct stage_layout {
    int32_t p;
    uint32_t V, M;
    uint32_t *start;     /* p x V + 1 */
    uint32_t *stash, *in_flight, *buffers; /* p each */
    uint64_t bnd;
} stage_layout_t;

static void layout_free(stage_layout_t *L)
{
    free(L->start);
    free(L->stash);
    free(L->in_flight);
    free(L->buffers);
    memset(L, 0, sizeof *L);
}

static int stage_layout(const dt_resolved_t *r, dt_model_t *m, int64_t dp, stage_layout_t *L)
{
    const dt_plugin_t *pp = r->plugin[DT_ROLE_PIPELINE];
    const dt_schedule_ops_t *ops = pp->ops;
    dt_model_desc_t *d = dt_model_desc(m);
    const uint32_t nu = d->n_units;
    memset(L, 0, sizeof *L);
    L->p = (int32_t)r->set.parallel.pipeline;
    L->V = (uint32_t)r->set.pipeline.virtual_stages;
    uint32_t *stage_of = calloc(nu, sizeof *stage_of);
    L->start = calloc((size_t)nu + 1, sizeof *L->start);
    L->stash = calloc((size_t)L->p, sizeof *L->stash);
    L->in_flight = calloc((size_t)L->p, sizeof *L->in_flight);
    L->buffers = calloc((size_t)L->p, sizeof *L->buffers);
    L->bnd = (uint64_t)(r->set.train.micro_batch * r->set.train.seq_len *
                        dt_model_info(m)->boundary_width) *
             dt_dtype_size(dt_model_act_dtype(m));
    int rc = DT_OK;
    if (!stage_of || !L->start || !L->stash || !L->in_flight || !L->buffers)
        rc = dt_err_set(DT_ERR_NOMEM, "plan: out of memory");
    for (int32_t k = 0; !rc && k < L->p; k++)
        L->in_flight[k] = 1;
    /* the micro-batches of a step, as the run resolves them */
    int64_t accum = r->set.train.grad_accum, global = r->set.train.global_batch;
    if (!rc)
        rc = dt_batch_resolve(r->set.config_path, r->set.train.micro_batch, &accum, &global, dp);
    L->M = (uint32_t)accum;
    double *flops = calloc(nu ? nu : 1, sizeof *flops);
    if (!rc && !flops)
        rc = dt_err_set(DT_ERR_NOMEM, "plan: out of memory");
    if (flops)
        dt_model_unit_flops(m, r->set.train.seq_len, flops);
    dt_stage_args_t sa;
    dt_stage_args_init(&sa, &r->set, L->p, d, L->M);
    sa.stash = L->stash;
    sa.in_flight = L->in_flight;
    sa.buffers = L->buffers;
    sa.unit_flops = flops;
    if (!rc && (rc = ops->assign_stages(pp->host, &sa, stage_of)))
        dt_plugin_failed(pp, rc, "assign_stages");
    free(flops);
    const uint32_t nv = (uint32_t)L->p * L->V;
    if (!rc && (L->V < 1 || L->V > DT_MODEL_MAX_CHUNKS || nv > nu))
        rc = dt_err_set(DT_ERR_CONFIG, "pipeline.virtual_stages = %u chunks per stage for "
                        "%u units", L->V, nu);
    for (uint32_t u = 0, j = 0; !rc && j < nv; j++) {
        L->start[j] = u;
        while (u < nu && stage_of[u] == j)
            u++;
        L->start[j + 1] = u;
        if (L->start[j + 1] == L->start[j])
            rc = dt_err_set(DT_ERR_INVALID, "schedule plugin '%s': stage %u has no unit",
                            pp->name, j);
    }
    free(stage_of);
    if (rc)
        layout_free(L);
    return rc;
}

/* Stage k's unit ranges (its chunks, in model order): their count. */
static uint32_t layout_chunks(const stage_layout_t *L, uint32_t k, uint32_t *first,
                              uint32_t *end)
{
    for (uint32_t c = 0; c < L->V; c++) {
        first[c] = L->start[c * (uint32_t)L->p + k];
        end[c] = L->start[c * (uint32_t)L->p + k + 1];
    }
    return L->V;
}

/* Row `row`'s stage states, planned with the data strategy the row
 * selected (a failure leaves the row out of the stage table). */
static void plan_stage_row(const dt_resolved_t *r, dt_model_t *m, int64_t world,
                           stage_rows_t *sr, size_t row, const char *label)
{
    const int32_t p = (int32_t)r->set.parallel.pipeline;
    int64_t dp = 0;
    stage_layout_t L = {0};
    int rc = dt_preflight_dp(r, world, &dp);
    if (!rc)
        rc = stage_layout(r, m, dp, &L);
    for (int32_t k = 0; !rc && k < p; k++) {
        dt_estimate_t e = {.struct_size = sizeof e};
        uint32_t f[DT_MODEL_MAX_CHUNKS], en[DT_MODEL_MAX_CHUNKS];
        const uint32_t n = layout_chunks(&L, (uint32_t)k, f, en);
        rc = dt_plan_stage(r->plugin[DT_ROLE_DATA], m, &r->set, (int)dp,
                           strcmp(r->set.parallel.offload, "none") != 0, n, f, en,
                           L.in_flight[k], (uint64_t)L.buffers[k] * L.bnd, &e);
        sr->state[row * (size_t)p + (size_t)k] = dt_plan_model_state(&e);
    }
    sr->label[row] = rc ? NULL : label;
    layout_free(&L);
}

/* "units 2-3 (block.1 .. head)", or with chunks "units 0-1, 4-5 (2
 * chunks: embedding .. block.0, block.3 .. block.4)". */
static void units_phrase(const dt_model_desc_t *d, uint32_t n, const uint32_t *f,
                         const uint32_t *e, char *out, size_t cap)
{
    size_t w = (size_t)snprintf(out, cap, "units");
    for (uint32_t c = 0; c < n && w < cap; c++)
        w += (size_t)snprintf(out + w, cap - w, "%s %u-%u", c ? "," : "", f[c], e[c] - 1);
    if (w < cap && n > 1)
        w += (size_t)snprintf(out + w, cap - w, " (%u chunks:", n);
    else if (w < cap)
        w += (size_t)snprintf(out + w, cap - w, " (");
    for (uint32_t c = 0; c < n && w < cap; c++)
        w += (size_t)snprintf(out + w, cap - w, "%s%s .. %s", n > 1 ? (c ? ", " : " ") : "",
                              d->units[f[c]].name, d->units[e[c] - 1].name);
    if (w < cap)
        snprintf(out + w, cap - w, ")");
}

/* ---- pipeline: with parallel.pipeline > 1, a block per
 * stage after the table: its units and parameters (a tied copy
 * included), the activations it keeps (its units' for each micro-batch
 * in flight it keeps, plus the stage inputs the schedule stashes: the
 * schedule plugin says both), the bytes it sends a step (boundary tensors
 * forward, their gradients back, each chunk's, and the tied gradient's
 * all-reduce), and the bubble ((p - 1) / (V m + p - 1) with V chunks a
 * stage); then each stage's model state under every planned row
 * (stage_rows_t). ---- */
static int print_pipeline(const dt_resolved_t *r, dt_model_t *m, int64_t world,
                          const stage_rows_t *sr)
{
    dt_model_desc_t *d = dt_model_desc(m);
    const uint32_t nu = d->n_units;
    const int32_t p = (int32_t)r->set.parallel.pipeline;
    int64_t dp = 0;
    stage_layout_t L = {0};
    int rc = dt_preflight_dp(r, world, &dp);
    if (!rc)
        rc = dt_preflight_stages(r, m);
    if (!rc)
        rc = stage_layout(r, m, dp, &L);
    const int64_t B = r->set.train.micro_batch, T = r->set.train.seq_len;
    if (!rc) {
        const uint64_t bnd = L.bnd;
        const uint32_t M = L.M, V = L.V, nv = (uint32_t)p * V;
        char b1[32], b2[32], b3[32], chunks[48] = "";
        if (V > 1)
            snprintf(chunks, sizeof chunks, " of %u interleaved chunks", V);
        printf("\npipeline: %d stages%s x %lld data-parallel replicas, %u micro-batches a step: "
               "bubble (p - 1) / (%sm + p - 1) = %.1f%%; the rows above plan the whole model, "
               "a stage's rank holds its units only:\n",
               p, chunks, (long long)dp, M, V > 1 ? "V " : "",
               100.0 * (double)(p - 1) / (double)(V * M + (uint32_t)p - 1));
        uint32_t tied[4];
        const uint32_t nt = dt_model_stage_tied(m, L.start[nv - 1], nu, tied, 4);
        for (uint32_t k = 0; k < (uint32_t)p; k++) {
            uint32_t f[DT_MODEL_MAX_CHUNKS], e[DT_MODEL_MAX_CHUNKS];
            const uint32_t n = layout_chunks(&L, k, f, e);
            uint64_t params = 0, keep = 0, sent = 0;
            for (uint32_t c = 0; c < n; c++) {
                for (uint32_t u = f[c]; u < e[c]; u++)
                    params += d->units[u].numel;
                const uint32_t j = c * (uint32_t)p + k; /* its virtual stage */
                if (j + 1 < nv)
                    sent += (uint64_t)M * bnd; /* activations to the next */
                if (j > 0)
                    sent += (uint64_t)M * bnd; /* their gradients to the previous */
            }
            if ((rc = dt_plan_stage_acts(m, B, T, n, f, e, L.in_flight[k], &keep)))
                break;
            for (uint32_t i = 0; k == (uint32_t)p - 1 && i < nt && i < 4; i++)
                params += d->units[tied[i]].numel; /* the last stage's copy */
            /* the tied gradient, all-reduced between first and last stage
             * (2 ranks: a ring sends the whole buffer once) */
            if (nt && (k == 0 || k == (uint32_t)p - 1))
                for (uint32_t i = 0; i < nt && i < 4; i++)
                    sent += d->units[tied[i]].numel * 4;
            char up[256];
            units_phrase(d, n, f, e, up, sizeof up);
            printf("  stage %u: %s%s, %.3fM parameters; activations %s (%u micro-batch%s of "
                   "its units) + boundary tensors %s (%u: %u stashed input%s, sends in "
                   "flight, received gradients); sends %s a step\n",
                   k, up, k == (uint32_t)p - 1 && nt ? " + a tied copy of the embedding" : "",
                   (double)params / 1e6, dt_plan_bytes(keep, b1, sizeof b1), L.in_flight[k],
                   L.in_flight[k] == 1 ? "" : "es",
                   dt_plan_bytes((uint64_t)L.buffers[k] * bnd, b2, sizeof b2), L.buffers[k],
                   L.stash[k], L.stash[k] == 1 ? "" : "s", dt_plan_bytes(sent, b3, sizeof b3));
        }
    }
    if (!rc) {
        printf("model state per rank of each stage (parameters, gradients, optimizer over the "
               "%lld-rank data group):\n", (long long)dp);
        printf("  %-22s", "strategy");
        for (int32_t k = 0; k < p; k++) {
            char h[24];
            snprintf(h, sizeof h, "stage %d", k);
            printf(" %12s", h);
        }
        printf("\n");
        for (size_t i = 0; i < sr->n; i++) {
            if (!sr->label[i])
                continue;
            printf("  %-22s", sr->label[i]);
            for (int32_t k = 0; k < p; k++) {
                char b[32];
                printf(" %12s", dt_plan_bytes(sr->state[i * (size_t)p + (size_t)k], b, sizeof b));
            }
            printf("\n");
        }
    }
    layout_free(&L);
    return rc;
}

/* ---- tensor parallelism: with parallel.tensor > 1, a block
 * after the table: what a rank holds of the model, and the all-reduces
 * its tensor group runs a step (dt_model_tp_comm, per micro-batch: the
 * model's count, checked against the run in test_model_tp), with the
 * bytes a rank sends for them (a ring all-reduce sends 2 (tp - 1) / tp of
 * its buffer). ---- */
static void print_tensor(const dt_resolved_t *r, dt_model_t *m, int64_t world)
{
    const dt_model_info_t *mi = dt_model_info(m);
    const int64_t tp = mi->tensor_parallel, pp = r->set.parallel.pipeline;
    const int64_t B = r->set.train.micro_batch, T = r->set.train.seq_len;
    int64_t dp = world / (tp * pp), accum = r->set.train.grad_accum,
            global = r->set.train.global_batch;
    if (dp < 1 || dt_batch_resolve(r->set.config_path, B, &accum, &global, dp) != DT_OK)
        accum = 1;
    dt_model_tp_comm_t c;
    dt_model_tp_comm(m, B, T, &c);
    const double ring = 2.0 * (double)(tp - 1) / (double)tp;
    const uint64_t bytes = (uint64_t)accum * (c.fwd_bytes + c.bwd_bytes);
    char b1[32], b2[32];
    printf("\ntensor: %lld ranks x %lld stage(s) x %lld data-parallel replicas; a rank holds "
           "%.3fM of the %.3fM parameters (heads, MLP width and vocabulary split %lld ways; "
           "LayerNorms, wpe and the row-parallel biases whole)\n",
           (long long)tp, (long long)pp, (long long)dp, (double)dt_model_desc(m)->numel / 1e6,
           (double)mi->global_numel / 1e6, (long long)tp);
    printf("  all-reduces over the tensor group per micro-batch%s: %u forward, %u backward "
           "(%s); %lld micro-batches a step: %s all-reduced, %s sent per rank\n",
           pp > 1 ? " (the whole model: each stage runs its units' share)" : "", c.fwd, c.bwd,
           "2 + 2 per transformer block, the embedding's, the LM head's and the "
           "cross-entropy's 2",
           (long long)accum, dt_plan_bytes(bytes, b1, sizeof b1),
           dt_plan_bytes((uint64_t)(ring * (double)bytes), b2, sizeof b2));
}

int dt_cmd_plan(int argc, char **argv)
{
    static const char *const opts[] = {"--world", "--model", "--device-memory", "--link-gbps",
                                       "--offload", NULL};
    const char *vals[5] = {NULL, NULL, NULL, NULL, NULL};
    dt_cli_config_args_t a;
    int ec = dt_cli_parse_config_args("plan", argc, argv, &a, opts, vals);
    if (ec)
        return ec;
    int64_t world = 0;
    plan_limits_t lim = {0, 0.0, NULL, 19};
    if ((ec = parse_options(vals, &world, &lim)))
        return ec;
    /* one parse of the file; each variant changes the selection on it */
    dt_resolved_t r;
    int rc = dt_resolve_core(a.config, a.sets, a.n_sets, &r);
    if (rc)
        return dt_cli_fail("plan", rc);
    if (vals[1] && (rc = apply_preset(&r, vals[1]))) {
        dt_resolved_free(&r);
        return dt_cli_fail("plan", rc);
    }
    if (world <= 0)
        world = r.set.launch.nproc;
    char own[96], own_where[1400], tier[96] = "", tier_summary[256] = "";
    snprintf(own, sizeof own, "%s", r.set.parallel.data ? r.set.parallel.data : "");
    dt_config_where(r.cfg, "parallel.data", own_where, sizeof own_where);
    /* the tier: --offload, else the config's own; "none" plans none */
    if (vals[4])
        snprintf(tier, sizeof tier, "%s", vals[4]);
    else if (strcmp(r.set.parallel.offload, "none") != 0)
        snprintf(tier, sizeof tier, "%s", r.set.parallel.offload);
    if (tier[0] && strcmp(tier, "none") != 0) {
        char where[1400] = "--offload";
        if (!vals[4])
            dt_config_where(r.cfg, "parallel.offload", where, sizeof where);
        if ((ec = check_tier(&r, tier, where, tier_summary, sizeof tier_summary))) {
            dt_resolved_free(&r);
            return ec;
        }
        lim.tier = tier;
        lim.width = 22; /* "  optimizer_and_params" */
    }
    variants_t vs = {0};
    plan_row_t *rows = NULL;
    const size_t per = 1 + (lim.tier ? PLAN_MAX_CHOICES : 0);
    if ((rc = plan_variants(&r, &vs)) == DT_OK &&
        !(rows = calloc(vs.n ? vs.n * per : 1, sizeof *rows)))
        rc = dt_err_set(DT_ERR_NOMEM, "plan: out of memory");
    if (rc != DT_OK) {
        free(vs.v);
        dt_resolved_free(&r);
        return dt_cli_fail("plan", rc);
    }
    const variant_t *variants = vs.v;
    dt_model_t *m = NULL;
    int planned = 0, first_rc = DT_OK;
    size_t nr = 0;
    plan_choice_t choice[PLAN_MAX_CHOICES];
    const int32_t n_stages = r.set.parallel.pipeline > 1 ? (int32_t)r.set.parallel.pipeline : 0;
    const int32_t tp = (int32_t)r.set.parallel.tensor;
    if (world % tp != 0)
        vs.n = 0, rc = dt_err_set(DT_ERR_CONFIG, "%s: parallel.tensor = %d does not divide "
                                  "the world of %lld rank%s", r.set.config_path, (int)tp,
                                  (long long)world, world == 1 ? "" : "s");
    stage_rows_t sr = {calloc(vs.n ? vs.n : 1, sizeof *sr.label),
                       calloc((vs.n ? vs.n : 1) * (size_t)(n_stages ? n_stages : 1),
                              sizeof *sr.state),
                       vs.n};
    if (!sr.label || !sr.state)
        vs.n = 0, rc = dt_err_set(DT_ERR_NOMEM, "plan: out of memory");
    for (size_t i = 0; i < vs.n; i++) {
        dt_estimate_t e = {.struct_size = sizeof(dt_estimate_t)};
        int n_choice = 0, has_key = 0;
        rc = select_variant(&r, &variants[i], own, own_where);
        /* under tensor parallelism, a rank's part (tensor rank 0's: the
         * first ranks hold a vocabulary row more when it does not divide) */
        if (rc == DT_OK && !m &&
            (rc = dt_model_create_part(r.cfg, r.plugin[DT_ROLE_DEVICE]->ops,
                                       dt_resolved_model(&r), tp, 0, &m)) == DT_OK)
            print_header(&r, m, world, &lim, tier_summary);
        if (rc == DT_OK)
            rc = dt_plan_strategy_offload(r.plugin[DT_ROLE_DATA], m, &r.set, (int)(world / tp),
                                          0, &e);
        if (rc == DT_OK && lim.tier)
            has_key = plan_choices(&r, m, world, choice, &n_choice);
        if (rc == DT_OK) {
            const char *fits = dt_plan_total(&e) <= lim.mem ? "yes" : "no";
            for (int k = 0; k < n_choice && fits[0] == 'n'; k++)
                if (choice[k].rc == DT_OK && dt_plan_total(&choice[k].e) <= lim.mem)
                    fits = "offload";
            print_row(variants[i].label, &e, &lim, fits);
            if (n_stages)
                plan_stage_row(&r, m, world, &sr, i, variants[i].label);
            if (e.note[0])
                printf("%-*s   %s\n", lim.width, "", e.note);
            plan_row_t *row = &rows[nr++];
            snprintf(row->label, sizeof row->label, "%s", variants[i].label);
            row->total = dt_plan_total(&e);
            row->sent = e.comm_bytes_per_step;
            row->planned = 1;
            row->variant = i;
            planned++;
            if (lim.tier && !has_key)
                printf("%-*s   offload: %s keeps nothing in an offload tier (no offload_what "
                       "key)\n",
                       lim.width, "", variants[i].plugin);
            for (int k = 0; k < n_choice; k++) {
                char label[48];
                snprintf(label, sizeof label, "  %.40s", choice[k].what);
                if (choice[k].rc != DT_OK) {
                    printf("%-*s   not planned: %s\n", lim.width, label, choice[k].err);
                    continue;
                }
                const dt_estimate_t *ce = &choice[k].e;
                print_row(label, ce, &lim, dt_plan_total(ce) <= lim.mem ? "yes" : "no");
                row = &rows[nr++];
                *row = (plan_row_t){.total = dt_plan_total(ce), .sent = ce->comm_bytes_per_step,
                                    .held = ce->bytes[DT_TAG_OFFLOAD],
                                    .traffic = dt_plan_tier_traffic(ce), .planned = 1,
                                    .offload = 1, .variant = i};
                snprintf(row->what, sizeof row->what, "%.39s", choice[k].what);
                snprintf(row->label, sizeof row->label, "%.63s, offload_what = \"%.20s\" on %.20s",
                         variants[i].label, choice[k].what, lim.tier);
            }
        } else if (i == 0) {
            /* the first row (ddp, when installed) failing is the
             * config's failure: say it once as `check` would */
            break;
        } else {
            printf("%-*s   not planned: %s\n", lim.width, variants[i].label, dt_last_error());
            if (!first_rc)
                first_rc = rc;
        }
    }
    if (planned && lim.mem) {
        const plan_ctx_t pc = {&r, variants, own, own_where, world, tp};
        print_recommendation(&pc, rows, nr, &lim);
    }
    if (planned && m && r.plugin[DT_ROLE_PIPELINE] && (rc = print_pipeline(&r, m, world, &sr)))
        planned = 0, first_rc = rc;
    if (planned && m && tp > 1)
        print_tensor(&r, m, world);
    free(sr.label);
    free(sr.state);
    ec = planned ? DT_EXIT_OK : dt_cli_fail("plan", first_rc ? first_rc : rc);
    if (m)
        dt_model_free(m, NULL);
    free(rows);
    free(vs.v);
    dt_resolved_free(&r);
    return ec;
}
