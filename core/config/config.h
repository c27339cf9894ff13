/*
 * core/config/config.h - the typed configuration: TOML (through toml++
 * behind a C shim) checked against schemas, with command-line overrides and
 * the origin of every value.  Checks report every problem they find at
 * once, one a line of the message.
 *
 * Life of a config:
 *   dt_config_load(path)             parse; syntax errors give file:line:col
 *   dt_config_override("a.b=v") ...  --set, value parsed as a TOML value
 *                                    (a bare word is taken as a string)
 *   dt_config_apply_schema(...)      once per table: the core's sections and
 *                                    each selected plugin's table; types,
 *                                    ranges, choices, required keys, unknown
 *                                    keys with a did-you-mean; defaults fill
 *                                    absent keys (origin "default")
 *   dt_config_set_aside(...)         the table of a plugin the config
 *                                    does not select: checked, not claimed
 *   dt_config_check_unclaimed(...)   any table no schema claimed (or set
 *                                    aside) is an error with a did-you-mean,
 *                                    or with dtrain's name for a key spelled
 *                                    as another stack spells it (aliases.c)
 *   dt_config_get_*(...)             typed reads by "table.key"; the
 *                                    core's own sections are read once
 *                                    into typed structs (settings.h)
 *
 * Errors are returned as DT_ERR_CONFIG with the message in dt_last_error():
 *   "run.toml:12:1: unknown key 'gradient_clipp1ng' in [train]; did you
 *    mean 'gradient_clipping'?"
 * Values from --set are located as "--set train.lr=abc".
 */
#ifndef DT_CORE_CONFIG_H
#define DT_CORE_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "dtrain/plugin.h"

typedef struct dt_config dt_config_t;

typedef enum dt_origin {
    DT_ORIGIN_DEFAULT = 0,
    DT_ORIGIN_FILE = 1,
    DT_ORIGIN_CLI = 2,    /* --set */
    DT_ORIGIN_DERIVED = 3, /* computed by the core (e.g. grad_accum) */
    DT_ORIGIN_PRESET = 4   /* supplied by a named preset (model.preset) */
} dt_origin_t;

/* Parse a TOML file.  *out is freed with dt_config_free. */
int dt_config_load(const char *path, dt_config_t **out);
/* Parse TOML text; `name` stands for the file name in messages. */
int dt_config_load_string(const char *name, const char *text,
                          dt_config_t **out);
/* An empty config (every value will come from defaults). */
int dt_config_new(dt_config_t **out);
void dt_config_free(dt_config_t *c);

/* Apply "table.key=value".  Checked against the schema when the table's
 * schema is applied (so unknown keys in --set are caught with a
 * did-you-mean too), or at once when it already was (the value replaces
 * the resolved one, origin "--set").  A value that does not parse as TOML
 * is a string. */
int dt_config_override(dt_config_t *c, const char *assignment);

/* Validate table `table` ("train", or a plugin's name) against `keys` and
 * fill defaults.  A missing table is created from defaults.  Nested tables
 * inside are errors.  Calling it twice for one table is allowed (same
 * keys).  Returns DT_ERR_CONFIG with every problem of the table, one a
 * line with its file:line:col (the unknown keys, then the values in the
 * keys' order; at most DT_ERRLIST_MAX, util/error.h).  A table in error is
 * claimed all the same, each value in error at its default (a required
 * one empty or 0), so a check can go on; claiming it again returns the
 * same errors. */
int dt_config_apply_schema(dt_config_t *c, const char *table,
                           const dt_config_key_t *keys, uint32_t n_keys);

/* Error on any top-level table or key that no dt_config_apply_schema call
 * claimed, one line each (all of them, up to DT_ERRLIST_MAX).  `hint` (may
 * be NULL) is appended to the message for unknown tables, e.g. "plugin
 * tables are named after a selected plugin". */
int dt_config_check_unclaimed(const dt_config_t *c, const char *hint);

/* Check table `table` as dt_config_apply_schema would (unknown keys with a
 * did-you-mean, types, ranges, choices, in the file and in --set) without
 * claiming it: its values are not resolved, a missing required key is no
 * error, dt_config_check_unclaimed passes it over.  For the table of an
 * installed plugin the config does not select, so one file can configure
 * every strategy and --set picks one.  A later dt_config_apply_schema of
 * the table claims it after all.  A table with errors is set aside all
 * the same (its errors are returned, not reported again as an unknown
 * table). */
int dt_config_set_aside(dt_config_t *c, const char *table, const dt_config_key_t *keys,
                        uint32_t n_keys);
/* The i-th table set aside, in the order they were; NULL past the end. */
const char *dt_config_aside(const dt_config_t *c, size_t i);
/* The top-level tables of the file and the tables of --set assignments
 * that are neither claimed nor set aside, in file then command-line order:
 * up to `cap` names into `names` (owned by the config); returns how many
 * there are. */
size_t dt_config_unclaimed(const dt_config_t *c, const char **names, size_t cap);

/* True when dt_config_apply_schema claimed `table`. */
int dt_config_claimed(const dt_config_t *c, const char *table);

/* Typed reads of "table.key" after apply_schema.  DT_ERR_NOT_FOUND when no
 * schema declared it; DT_ERR_INVALID on a type mismatch (ENUM reads as
 * string; FLOAT accepts INT values).  Strings are owned by the config. */
int dt_config_get_bool(const dt_config_t *c, const char *path, int *out);
int dt_config_get_int(const dt_config_t *c, const char *path, int64_t *out);
int dt_config_get_float(const dt_config_t *c, const char *path, double *out);
int dt_config_get_string(const dt_config_t *c, const char *path,
                         const char **out);
/* Where "table.key" came from; DT_ORIGIN_DEFAULT when unknown. */
dt_origin_t dt_config_origin(const dt_config_t *c, const char *path);
/* Where "table.key" came from and what it is, for messages that blame a
 * value: "--set run.comm=shmm" (as typed), "run.toml:3: run.comm = \"shmm\""
 * (its line in the file), or "run.comm = \"shm\" (default)" ("derived"). */
void dt_config_where(const dt_config_t *c, const char *path, char *buf,
                     size_t cap);
/* "file", "--set", "derived", "preset" or "default". */
const char *dt_config_origin_name(dt_origin_t o);

/* Set an integer computed by the core (origin "derived"); the key must
 * have been declared by a schema (range-checked like a file value). */
int dt_config_set_int(dt_config_t *c, const char *path, int64_t v,
                      dt_origin_t origin);
/* The same for a FLOAT (range-checked), a BOOL and an ENUM (one of its
 * choices, else DT_ERR_CONFIG): what a model preset fills in. */
int dt_config_set_float(dt_config_t *c, const char *path, double v,
                        dt_origin_t origin);
int dt_config_set_bool(dt_config_t *c, const char *path, int v,
                       dt_origin_t origin);
int dt_config_set_choice(dt_config_t *c, const char *path, const char *v,
                         dt_origin_t origin);

/* Print the resolved config as TOML, every claimed table in claim order,
 * each value followed by a comment with its origin:
 *     lr = 0.0006            # file run.toml:14
 *     warmup_steps = 0       # default
 *     micro_batch = 4        # --set
 *     grad_accum = 2         # derived                                    */
void dt_config_print(const dt_config_t *c, FILE *f);

/* A stable 64-bit hash of the resolved values (ranks compare it at start),
 * the per-node values (dt_config_per_node) left out. */
uint64_t dt_config_hash(const dt_config_t *c);

/* True for a value that legitimately differs between the nodes of one job
 * (launch.node_rank): left out wherever ranks compare configs. */
int dt_config_per_node(const char *table, const char *key);

/* Visit every resolved value in sorted "table.key" order: `text` is the
 * value as TOML (cut at 511 bytes), `value_hash` a hash of all of it.  A
 * non-zero return from `fn` stops the walk and is returned. */
typedef int (*dt_config_walk_fn)(const char *table, const char *key, const char *text,
                                 uint64_t value_hash, void *ctx);
int dt_config_walk(const dt_config_t *c, dt_config_walk_fn fn, void *ctx);

/* The path the config was loaded from ("" for strings / new). */
const char *dt_config_path(const dt_config_t *c);

/* Levenshtein-based suggestion: the candidate closest to `word` within a
 * distance that makes sense for its length, or NULL. */
const char *dt_suggest(const char *word, const char *const *candidates,
                       size_t n);

/* A key spelled as another training stack spells it (aliases.c): for key
 * `key` found under `parent` ("" at the top level, "train", "fp16",
 * "optimizer.params"), write "gradient_accumulation_steps is DeepSpeed's
 * name for train.grad_accum" into buf and return 1; 0 when it is none. */
int dt_config_alias(const char *parent, const char *key, char *buf, size_t cap);
/* For an alias whose dtrain value is a product (warmup_ratio x
 * train.steps is train.warmup_steps): *times = "train.steps", *is =
 * "train.warmup_steps", 1; else 0. */
int dt_config_alias_product(const char *parent, const char *key, const char **times,
                            const char **is);
/* A key of one of the core's sections other than `parent`: write "'lr' is
 * a key of [train] (train.lr)" and return 1; 0 when it is none. */
int dt_config_home(const char *parent, const char *key, char *buf, size_t cap);

/* The core's own sections (run, model, data, train, optimizer, parallel,
 * launch, checkpoint): defined in schema.c. */
typedef struct dt_config_section {
    const char *table;
    const dt_config_key_t *keys;
    uint32_t n_keys;
    const char *doc;
} dt_config_section_t;
extern const dt_config_section_t dt_core_sections[];
extern const uint32_t dt_core_n_sections;
/* The declared default of the core's string key table.key (run.comm:
 * "shm") into buf, or NULL when there is none: a tool that picks a plugin
 * by default takes the config's, so no plugin name is spelled twice. */
const char *dt_core_default_string(const char *table, const char *key, char *buf, size_t cap);

#endif /* DT_CORE_CONFIG_H */
