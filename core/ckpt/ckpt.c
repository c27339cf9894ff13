/*
 * core/ckpt/ckpt.c - save and resume training state by global ranges (and
 * under tensor parallelism by blocks of the global tensors).
 */
#include "ckpt/ckpt.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ckpt/ckpt_io.h"
#include "train/batch_lr.h"
#include "util/crash.h"
#include "util/error.h"

static const char *const state_names[DT_STATE_COUNT] = {"params", "exp_avg", "exp_avg_sq"};

/* Every call into a plugin on the checkpoint paths (the strategy's
 * state_ranges, get_state and set_state; the communicator's collectives)
 * is attributed (util/crash.h): a crash inside one is reported naming the
 * plugin and its method, never as the core's "between plugin calls".
 * The comma operator enters the record before the call's arguments are
 * evaluated and the call made; left() leaves it when the call returns. */
static int left(int rc)
{
    dt_crash_leave();
    return rc;
}
#define STRATEGY_CALL(s, call, method)                                                         \
    (dt_crash_enter("strategy", dt_strategy_ops(s)->info.name, (method)), left(call))
#define COMM_CALL(comm, slot, args, method)                                                   \
    (dt_crash_enter("comm", dt_comm_ops(comm)->info.name, (method)),                            \
     left(dt_comm_ops(comm)->slot args))

int dt_ckpt_root(const dt_settings_t *set, char *buf, size_t cap)
{
    const char *dir = set->checkpoint.dir;
    int n = dir[0] ? snprintf(buf, cap, "%s", dir)
                   : snprintf(buf, cap, "%s/%s/ckpt", set->run.out_dir, set->run.name);
    if (n < 0 || (size_t)n >= cap)
        return dt_err_set(DT_ERR_CONFIG, "checkpoint directory path is too long");
    return DT_OK;
}

/* The states this optimizer keeps (SGD has no second moment). */
static int n_states(const dt_settings_t *set)
{
    return set->optimizer.type == DT_OPTIM_SGD ? 2 : 3;
}

/* Ranges of `unit`/`kind` for `purpose`, malloc'd into *out (the caller
 * frees it).  On failure *out is NULL and *n 0: ranges frees what it
 * allocated and hands the caller nothing to free. */
static int ranges(dt_strategy_t *s, uint32_t unit, int kind,
                  int purpose, dt_range_t **out, uint32_t *n)
{
    *out = NULL;
    *n = 0;
    uint32_t count = 0, n2 = 0;
    int rc =
        STRATEGY_CALL(s, dt_strategy_ops(s)->state_ranges(s, unit, kind, purpose, NULL, 0, &count),
                      "state_ranges");
    if (rc)
        return rc;
    dt_range_t *rg = calloc(count ? count : 1, sizeof *rg);
    if (!rg)
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    if ((rc = STRATEGY_CALL(
             s, dt_strategy_ops(s)->state_ranges(s, unit, kind, purpose, rg, count, &n2),
             "state_ranges"))) {
        free(rg);
        return rc;
    }
    if (n2 != count) {
        free(rg);
        return dt_err_set(DT_ERR_INVALID,
                          "state_ranges of unit %u, %s: %u ranges, then %u for the same query",
                          unit, kind == 0 ? "params" : kind == 1 ? "exp_avg" : "exp_avg_sq",
                          count, n2);
    }
    *out = rg;
    *n = count;
    return DT_OK;
}

/* Host staging for state copies: ranges are moved in pieces of at most
 * this many elements, so saving or loading a 1.5B-parameter unit needs
 * 16 MiB of host memory, not the unit's size. */
#define PIECE_ELEMS (4u << 20)

/* One (unit, state kind) moving between the strategy and a checkpoint
 * entry: rd when loading, wr when saving. */
typedef struct state_io {
    dt_strategy_t *s;
    uint32_t u;
    int k;
    const char *entry; /* "<unit>/<state>" */
    dt_ckpt_reader_t *rd;
    dt_ckpt_writer_t *wr;
    int direct; /* wr is deferred: get_state fills its memory in place */
} state_io_t;

/* What to do with each range (begin/end may be NULL) and each piece. */
typedef struct piece_ops {
    int (*begin)(const state_io_t *io, dt_range_t r);
    int (*piece)(const state_io_t *io, dt_range_t p, float *buf);
    int (*end)(const state_io_t *io);
} piece_ops_t;

/* Visit the `purpose` ranges of io's unit and state in pieces, with one
 * staging buffer (*buf, allocated on first use, freed by the caller; none
 * when io->direct). */
static int each_piece(const state_io_t *io, int purpose, const piece_ops_t *po, float **buf)
{
    dt_range_t *rg = NULL;
    uint32_t n = 0;
    int rc = ranges(io->s, io->u, io->k, purpose, &rg, &n);
    for (uint32_t i = 0; i < n && !rc; i++) {
        if (!rg[i].count)
            continue;
        if (po->begin && (rc = po->begin(io, rg[i])))
            break;
        for (uint64_t off = 0; off < rg[i].count && !rc; off += PIECE_ELEMS) {
            uint64_t c = rg[i].count - off < PIECE_ELEMS ? rg[i].count - off : PIECE_ELEMS;
            if (!io->direct && !*buf && !(*buf = malloc(PIECE_ELEMS * sizeof **buf)))
                rc = dt_err_set(DT_ERR_NOMEM, "out of memory staging checkpoint state");
            else
                rc = po->piece(io, (dt_range_t){.offset = rg[i].offset + off, .count = c},
                               *buf);
        }
        if (!rc && po->end)
            rc = po->end(io);
    }
    free(rg);
    return rc;
}

/* Loading: checkpoint entry -> strategy (set_state). */
static int load_piece(const state_io_t *io, dt_range_t p, float *buf)
{
    int rc = dt_ckpt_read(io->rd, io->entry, p.offset, p.count, buf);
    return rc ? rc
              : STRATEGY_CALL(io->s, dt_strategy_ops(io->s)->set_state(io->s, io->u, io->k, p, buf),
                              "set_state");
}

/* Saving: strategy (get_state) -> one segment per range of the shard. */
static int save_begin(const state_io_t *io, dt_range_t r)
{
    return dt_ckpt_shard_begin(io->wr, io->entry, DT_F32, r.offset, r.count);
}

/* get_state of range r, then into the shard: straight into a deferred
 * shard's memory (the snapshot's only copy), else through buf. */
static int save_state(const state_io_t *io, dt_range_t r, float *buf)
{
    const size_t nbytes = (size_t)r.count * sizeof *buf;
    void *dst = buf;
    int rc = io->direct ? dt_ckpt_shard_reserve(io->wr, nbytes, &dst) : DT_OK;
    if (!rc)
        rc = STRATEGY_CALL(io->s, dt_strategy_ops(io->s)->get_state(io->s, io->u, io->k, r, dst),
                           "get_state");
    return rc || io->direct ? rc : dt_ckpt_shard_append(io->wr, buf, nbytes);
}

static int save_piece(const state_io_t *io, dt_range_t p, float *buf)
{
    return save_state(io, p, buf);
}

static int save_end(const state_io_t *io) { return dt_ckpt_shard_end(io->wr); }

/* ---- tensor parallelism: a rank's parts as blocks of the global tensors
 *
 * A checkpoint holds the whole model whatever layout saved it: under
 * tensor parallelism the entry "<unit>/<state>" has the whole unit's
 * elements (the tensor table's global offsets and shapes), and a rank's
 * part of a split tensor is stored as blocks of it (format version 2;
 * ckpt_io.h): a flat range of the rank's unit space becomes, within each
 * block of each tensor it crosses, at most a partial first row, whole
 * rows and a partial last row, each a rectangle of the global tensor and
 * contiguous in the rank's memory.  A replicated tensor is a flat range
 * of the entry, saved by the tensor group's rank 0 only
 * (DT_SPLIT_DUPLICATE on the others).  Loading reads the same pieces
 * back, so any layout loads any other's. ---- */

/* Unit u's global element count, and (off, may be NULL) each tensor's
 * first element in the whole unit. */
static uint64_t unit_global(const dt_unit_desc_t *ud, uint64_t *off)
{
    uint64_t n = 0;
    int64_t shape[4];
    for (uint32_t k = 0; k < ud->n_params; k++) {
        if (off)
            off[k] = n;
        n += dt_model_param_global(&ud->params[k], shape);
    }
    return n;
}

/* One piece of a part: the rank's unit elements [local, local + count),
 * which are entry elements [flat, flat + count) when block.ndim is 0,
 * else the block. */
typedef struct part_piece {
    uint64_t local, count, flat;
    dt_ckpt_block_t block;
} part_piece_t;

typedef int (*part_fn)(const state_io_t *io, const part_piece_t *pc, float *buf);

/* Block b of tensor p (its elements from `lb` in the tensor's local
 * space), elements [x, y) of it: rectangles of at most PIECE_ELEMS. */
static int block_pieces(const state_io_t *io, const dt_param_desc_t *p, uint64_t gbase,
                        const dt_param_block_t *b, uint64_t lb, uint64_t x, uint64_t y,
                        part_fn fn, float *buf)
{
    const dt_param_split_t *sp = p->ext;
    const uint64_t cols = p->ndim > 1 ? (uint64_t)b->size[1] : 1;
    if (cols > PIECE_ELEMS)
        return dt_err_set(DT_ERR_INVALID, "%s: rows of %llu elements exceed the checkpoint's "
                          "staging", p->name, (unsigned long long)cols);
    part_piece_t pc = {0};
    pc.block.base = gbase;
    pc.block.ndim = p->ndim;
    for (int d = 0; d < p->ndim; d++)
        pc.block.shape[d] = (uint64_t)sp->global_shape[d];
    while (x < y) {
        const uint64_t row = x / cols, col = x % cols;
        uint64_t n;
        if (p->ndim == 1) {
            n = y - x < PIECE_ELEMS ? y - x : PIECE_ELEMS;
            pc.block.start[0] = (uint64_t)b->start[0] + x;
            pc.block.size[0] = n;
        } else if (col > 0 || y - x < cols) { /* a partial row */
            n = (cols - col < y - x ? cols - col : y - x);
            pc.block.start[0] = (uint64_t)b->start[0] + row;
            pc.block.start[1] = (uint64_t)b->start[1] + col;
            pc.block.size[0] = 1;
            pc.block.size[1] = n;
        } else { /* whole rows */
            uint64_t rows = (y - x) / cols, most = PIECE_ELEMS / cols;
            rows = rows < most ? rows : most;
            n = rows * cols;
            pc.block.start[0] = (uint64_t)b->start[0] + row;
            pc.block.start[1] = (uint64_t)b->start[1];
            pc.block.size[0] = rows;
            pc.block.size[1] = cols;
        }
        pc.local = p->offset + lb + x;
        pc.count = n;
        int rc = fn(io, &pc, buf);
        if (rc)
            return rc;
        x += n;
    }
    return DT_OK;
}

/* Range r of a part's unit, piece by piece (saving: the duplicates of
 * rank 0's replicated tensors left out). */
static int each_part_piece(const state_io_t *io, const dt_unit_desc_t *ud, dt_range_t r,
                           int saving, part_fn fn, float *buf)
{
    uint64_t goff[DT_MODEL_MAX_PARAMS];
    unit_global(ud, goff);
    const uint64_t r_end = r.offset + r.count;
    int rc = DT_OK;
    for (uint32_t k = 0; k < ud->n_params && !rc; k++) {
        const dt_param_desc_t *p = &ud->params[k];
        const dt_param_split_t *sp = p->ext;
        uint64_t pa = r.offset > p->offset ? r.offset : p->offset;
        uint64_t pb = r_end < p->offset + p->numel ? r_end : p->offset + p->numel;
        if (pa >= pb)
            continue;
        if (!sp || sp->copies > 1) { /* whole: a flat range of the entry */
            if (saving && sp && (sp->flags & DT_SPLIT_DUPLICATE))
                continue;
            for (uint64_t a = pa; a < pb && !rc; a += PIECE_ELEMS) {
                part_piece_t pc = {.local = a, .count = pb - a < PIECE_ELEMS ? pb - a
                                                                            : PIECE_ELEMS};
                pc.flat = goff[k] + (a - p->offset);
                rc = fn(io, &pc, buf);
            }
            continue;
        }
        uint64_t lb = 0;
        for (uint32_t b = 0; b < sp->n_blocks && !rc; b++) {
            const dt_param_block_t *bl = &sp->blocks[b];
            const uint64_t bn = (uint64_t)bl->size[0] * (p->ndim > 1 ? (uint64_t)bl->size[1] : 1);
            const uint64_t x = pa - p->offset > lb ? pa - p->offset - lb : 0;
            const uint64_t y = pb - p->offset < lb + bn ? pb - p->offset - lb : bn;
            if (pa - p->offset < lb + bn && x < y)
                rc = block_pieces(io, p, goff[k], bl, lb, x, y, fn, buf);
            lb += bn;
        }
    }
    return rc;
}

static int save_part_piece(const state_io_t *io, const part_piece_t *pc, float *buf)
{
    const dt_range_t r = {.offset = pc->local, .count = pc->count};
    int rc = pc->block.ndim ? dt_ckpt_shard_begin_block(io->wr, io->entry, DT_F32, &pc->block)
                            : dt_ckpt_shard_begin(io->wr, io->entry, DT_F32, pc->flat,
                                                  pc->count);
    if (!rc)
        rc = save_state(io, r, buf);
    return rc ? rc : dt_ckpt_shard_end(io->wr);
}

static int load_part_piece(const state_io_t *io, const part_piece_t *pc, float *buf)
{
    int rc = pc->block.ndim ? dt_ckpt_read_block(io->rd, io->entry, &pc->block, buf)
                            : dt_ckpt_read(io->rd, io->entry, pc->flat, pc->count, buf);
    const dt_range_t r = {.offset = pc->local, .count = pc->count};
    return rc ? rc
              : STRATEGY_CALL(io->s, dt_strategy_ops(io->s)->set_state(io->s, io->u, io->k, r, buf),
                              "set_state");
}

/* A part's `purpose` ranges of io's unit and state, piece by piece. */
static int each_part_range(const state_io_t *io, const dt_unit_desc_t *ud, int purpose,
                           part_fn fn, float **buf)
{
    dt_range_t *rg = NULL;
    uint32_t n = 0;
    int rc = ranges(io->s, io->u, io->k, purpose, &rg, &n);
    if (!rc && n && !io->direct && !*buf && !(*buf = malloc(PIECE_ELEMS * sizeof **buf)))
        rc = dt_err_set(DT_ERR_NOMEM, "out of memory staging checkpoint state");
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = each_part_piece(io, ud, rg[i], purpose == DT_RANGES_SAVE, fn, *buf);
    free(rg);
    return rc;
}

/* The manifest's "model": the model description - the arch, the keys that
 * with it fix what the model computes (dt_model_info's keys: GPT-2's
 * n_layer, n_head, n_embd, vocab_size, context; booleans as JSON
 * booleans, float and choice settings as numbers and strings), the
 * precisions (dtype,
 * activations) - and every parameter tensor (unit, offset in the unit's
 * flat space, global shape), so tools can export and check shapes without
 * building the model, and a resume can refuse another model
 * (check_model). */
cJSON *dt_ckpt_model_json(dt_model_t *m)
{
    const dt_model_info_t *mi = dt_model_info(m);
    const dt_model_desc_t *d = dt_model_desc(m);
    cJSON *j = cJSON_CreateObject(), *ts = cJSON_CreateArray();
    if (!j || !ts) {
        cJSON_Delete(j);
        cJSON_Delete(ts);
        return NULL;
    }
    cJSON_AddStringToObject(j, "arch", d->arch);
    for (uint32_t i = 0; i < mi->n_keys; i++) {
        const dt_model_key_t *k = &mi->keys[i];
        if (k->kind == DT_MODEL_KEY_BOOL)
            cJSON_AddBoolToObject(j, k->key, k->value != 0);
        else if (k->kind == DT_MODEL_KEY_FLOAT)
            cJSON_AddNumberToObject(j, k->key, k->f);
        else if (k->kind == DT_MODEL_KEY_CHOICE)
            cJSON_AddStringToObject(j, k->key, k->s ? k->s : "");
        else
            cJSON_AddNumberToObject(j, k->key, (double)k->value);
    }
    if (mi->dtype)
        cJSON_AddStringToObject(j, "dtype", mi->dtype);
    if (mi->activations)
        cJSON_AddStringToObject(j, "activations", mi->activations);
    cJSON_AddItemToObject(j, "tensors", ts);
    for (uint32_t u = 0; u < d->n_units; u++) {
        uint64_t goff[DT_MODEL_MAX_PARAMS];
        unit_global(&d->units[u], goff); /* a tensor-parallel part's whole unit */
        for (uint32_t k = 0; k < d->units[u].n_params; k++) {
            const dt_param_desc_t *p = &d->units[u].params[k];
            int64_t gshape[4];
            dt_model_param_global(p, gshape);
            cJSON *t = cJSON_CreateObject();
            if (!t || !cJSON_AddItemToArray(ts, t)) {
                cJSON_Delete(t);
                cJSON_Delete(j);
                return NULL;
            }
            cJSON_AddStringToObject(t, "name", p->name);
            cJSON_AddStringToObject(t, "unit", d->units[u].name);
            cJSON_AddNumberToObject(t, "offset", (double)goff[k]);
            double shape[4];
            for (int i = 0; i < p->ndim && i < 4; i++)
                shape[i] = (double)gshape[i];
            cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(shape, p->ndim));
        }
    }
    return j;
}

/* A checkpoint whose tensors do not match this model's: name the first.
 * The reader has checked the table itself (it tiles every unit); here it
 * must also be this model's layout, since state is loaded unit by unit:
 * the same shape at another place would load scrambled. */
int dt_ckpt_check_tensors(const char *dir, const dt_ckpt_reader_t *rd, const dt_model_desc_t *d)
{
    if (!dt_ckpt_has_tensors(rd))
        return DT_OK; /* written before tensors were recorded: unit sizes are checked */
    for (uint32_t u = 0; u < d->n_units; u++) {
        uint64_t goff[DT_MODEL_MAX_PARAMS];
        unit_global(&d->units[u], goff);
        for (uint32_t k = 0; k < d->units[u].n_params; k++) {
            const dt_param_desc_t *p = &d->units[u].params[k];
            int64_t gshape[4];
            dt_model_param_global(p, gshape);
            const dt_ckpt_tensor_t *t = dt_ckpt_find_tensor(rd, p->name);
            if (!t)
                return dt_err_set(DT_ERR_DATA,
                                  "checkpoint '%s' has no tensor %s: it was saved from another "
                                  "model (arch or depth)",
                                  dir, p->name);
            int same = t->ndim == p->ndim;
            for (int i = 0; same && i < p->ndim; i++)
                same = t->shape[i] == gshape[i];
            if (!same) {
                char want[96] = "", got[96] = "";
                for (int i = 0; i < p->ndim; i++)
                    snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld",
                             i ? ", " : "", (long long)gshape[i]);
                for (int i = 0; i < t->ndim; i++)
                    snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld",
                             i ? ", " : "", (long long)t->shape[i]);
                return dt_err_set(DT_ERR_DATA,
                                  "checkpoint '%s': tensor %s has shape [%s] there but [%s] in "
                                  "this model: the checkpoint is from another model shape",
                                  dir, p->name, got, want);
            }
            char entry[DT_CKPT_NAME_MAX];
            snprintf(entry, sizeof entry, "%s/params", d->units[u].name);
            if (strcmp(t->entry, entry) != 0 || t->offset != goff[k])
                return dt_err_set(DT_ERR_DATA,
                                  "checkpoint '%s': tensor %s is at element %llu of %s there "
                                  "but at element %llu of %s in this model: the checkpoint is "
                                  "from another model layout",
                                  dir, p->name, (unsigned long long)t->offset, t->entry,
                                  (unsigned long long)goff[k], entry);
        }
    }
    return DT_OK;
}

/* ---- the model description on resume ----
 * A checkpoint holds the state of one model function.  The arch and every
 * key that, with it, fixes what the model computes must be this run's:
 * most change a tensor's shape (dt_ckpt_check_tensors would catch those,
 * naming a tensor), but not all - GPT-2's n_head splits the same weights
 * into other attention heads, so a checkpoint of 4 heads would load into
 * a model of 2 and train on silently.  Checked at every layout, since the
 * description is the whole model's.  The precisions may change (the state
 * is f32 master weights whatever computed them; one config can flip
 * model.dtype): a change is noted.  A checkpoint that predates a key
 * (dtype and activations were first recorded by issue 24) is read, with a
 * note naming what was not checked. */
static const char *const precision_keys[] = {"dtype", "activations"};

/* Append "dtrain: note: ...\n" to note[cap]. */
static void add_note(char *note, size_t cap, const char *fmt, ...) DT_PRINTF(3, 4);
static void add_note(char *note, size_t cap, const char *fmt, ...)
{
    size_t len = strlen(note);
    if (len >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(note + len, cap - len, "dtrain: note: ");
    if (n > 0 && (size_t)n < cap - len)
        vsnprintf(note + len + (size_t)n, cap - len - (size_t)n, fmt, ap);
    va_end(ap);
    len = strlen(note);
    if (len + 1 < cap) {
        note[len] = '\n';
        note[len + 1] = '\0';
    }
}

/* Append key to the comma-separated list of keys the manifest lacks. */
static void add_missing(char *missing, size_t cap, const char *key)
{
    size_t len = strlen(missing);
    snprintf(missing + len, cap - len, "%s%s", len ? ", " : "", key);
}

/* One model key as the manifest recorded it (v) against this run's (k): a
 * shape key or flag must match; a setting (float or choice) may differ,
 * with a note that this run's value wins. */
static int check_model_key(const char *dir, const cJSON *v, const dt_model_key_t *k,
                           char *note, size_t cap)
{
    if (k->kind == DT_MODEL_KEY_BOOL) {
        if (!cJSON_IsBool(v))
            return dt_err_set(DT_ERR_DATA, "checkpoint '%s': manifest.json: \"model\".\"%s\" "
                              "is not a boolean", dir, k->key);
        if (cJSON_IsTrue(v) != (k->value != 0))
            return dt_err_set(DT_ERR_DATA, "checkpoint '%s': [model] %s = %s there but %s in "
                              "this run: it was saved from another model", dir, k->key,
                              cJSON_IsTrue(v) ? "true" : "false", k->value ? "true" : "false");
        return DT_OK;
    }
    if (k->kind == DT_MODEL_KEY_FLOAT || k->kind == DT_MODEL_KEY_CHOICE) {
        /* a setting, no shape: this run's wins, said once */
        const char *ks = k->s ? k->s : "";
        char was[64], now[64];
        if ((k->kind == DT_MODEL_KEY_FLOAT && !cJSON_IsNumber(v)) ||
            (k->kind == DT_MODEL_KEY_CHOICE && !cJSON_IsString(v)))
            return dt_err_set(DT_ERR_DATA, "checkpoint '%s': manifest.json: \"model\".\"%s\" "
                              "is not a %s", dir, k->key,
                              k->kind == DT_MODEL_KEY_FLOAT ? "number" : "string");
        if (k->kind == DT_MODEL_KEY_FLOAT && v->valuedouble != k->f) {
            snprintf(was, sizeof was, "%g", v->valuedouble);
            snprintf(now, sizeof now, "%g", k->f);
        } else if (k->kind == DT_MODEL_KEY_CHOICE && strcmp(v->valuestring, ks) != 0) {
            snprintf(was, sizeof was, "\"%s\"", v->valuestring);
            snprintf(now, sizeof now, "\"%s\"", ks);
        } else
            return DT_OK;
        add_note(note, cap, "[model] %s is %s in this run but %s in checkpoint '%s': "
                 "training continues with %s", k->key, now, was, dir, now);
        return DT_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble)
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': manifest.json: \"model\".\"%s\" is "
                          "not an integer", dir, k->key);
    if ((int64_t)v->valuedouble != k->value)
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': [model] %s = %lld there but %lld in "
                          "this run: it was saved from another model", dir,
                          k->key, (long long)v->valuedouble, (long long)k->value);
    return DT_OK;
}

static int check_model(const char *dir, const cJSON *saved, const dt_model_info_t *mi,
                       char *note, size_t cap)
{
    char missing[256] = "";
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(saved, "arch");
    if (!arch)
        snprintf(missing, sizeof missing, "arch");
    else if (!cJSON_IsString(arch))
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': manifest.json: \"model\".\"arch\" is "
                          "not a string", dir);
    else if (strcmp(arch->valuestring, mi->arch) != 0)
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': [model] arch = \"%s\" there but \"%s\" "
                          "in this run: it was saved from another model", dir, arch->valuestring,
                          mi->arch);
    for (uint32_t i = 0; i < mi->n_keys; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(saved, mi->keys[i].key);
        if (!v) {
            add_missing(missing, sizeof missing, mi->keys[i].key);
            continue;
        }
        int rc = check_model_key(dir, v, &mi->keys[i], note, cap);
        if (rc != DT_OK)
            return rc;
    }
    const char *now[] = {mi->dtype, mi->activations};
    for (size_t i = 0; i < sizeof precision_keys / sizeof precision_keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(saved, precision_keys[i]);
        if (!v) {
            add_missing(missing, sizeof missing, precision_keys[i]);
        } else if (!cJSON_IsString(v)) {
            return dt_err_set(DT_ERR_DATA, "checkpoint '%s': manifest.json: \"model\".\"%s\" is "
                              "not a string", dir, precision_keys[i]);
        } else if (now[i] && strcmp(v->valuestring, now[i]) != 0) {
            add_note(note, cap, "[model] %s is %s in this run but %s in checkpoint '%s': "
                     "training continues from its f32 state in %s", precision_keys[i], now[i],
                     v->valuestring, dir, now[i]);
        }
    }
    if (missing[0])
        add_note(note, cap, "checkpoint '%s' does not record [model] %s (an older dtrain saved "
                 "it): resuming without checking %s", dir, missing,
                 strchr(missing, ',') ? "them" : "it");
    return DT_OK;
}

/* The data loader's state: the sampler is a pure function of these and the
 * step, so recording them is what makes the data order resumable (and a
 * change to them on resume detectable). */
static const char *const data_keys[] = {"run.seed", "train.global_batch", "train.seq_len",
                                        "data.shuffle", "data.train"};

static cJSON *data_json(const dt_settings_t *set)
{
    cJSON *j = cJSON_CreateObject();
    if (j) {
        cJSON_AddNumberToObject(j, data_keys[0], (double)set->run.seed);
        cJSON_AddNumberToObject(j, data_keys[1], (double)set->train.global_batch);
        cJSON_AddNumberToObject(j, data_keys[2], (double)set->train.seq_len);
        cJSON_AddBoolToObject(j, data_keys[3], set->data.shuffle);
        cJSON_AddStringToObject(j, data_keys[4], set->data.train);
    }
    return j;
}

/* Which data-loader settings differ from the checkpoint's, as "key (was
 * X)" phrases; empty when none (or the checkpoint predates the record). */
static void data_changes(const dt_settings_t *set, const cJSON *extra, char *out,
                         size_t cap)
{
    out[0] = '\0';
    const cJSON *saved = cJSON_GetObjectItemCaseSensitive(extra, "data");
    cJSON *now = data_json(set);
    for (size_t i = 0; saved && now && i < sizeof data_keys / sizeof data_keys[0]; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(saved, data_keys[i]);
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(now, data_keys[i]);
        if (!a || !b || cJSON_Compare(a, b, 1))
            continue;
        char *was = cJSON_PrintUnformatted(a);
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s%s (was %s)", len ? ", " : "", data_keys[i],
                 was ? was : "?");
        cJSON_free(was);
    }
    cJSON_Delete(now);
}

/* Entry `name` of unit `ud` (its "<unit>/<state>"), present with the
 * unit's element count. */
static int find_unit_entry(const char *dir, const dt_ckpt_reader_t *rd,
                           const dt_unit_desc_t *ud, const char *name)
{
    const dt_ckpt_entry_t *e = dt_ckpt_find(rd, name);
    if (!e)
        return dt_err_set(DT_ERR_DATA,
                          "checkpoint '%s' has no entry %s: it was saved from another model or "
                          "optimizer",
                          dir, name);
    const uint64_t numel = unit_global(ud, NULL);
    if (e->numel != numel)
        return dt_err_set(DT_ERR_DATA,
                          "checkpoint '%s': entry %s has %llu elements but this model's unit %s "
                          "has %llu: the checkpoint is from another model shape",
                          dir, name, (unsigned long long)e->numel, ud->name,
                          (unsigned long long)numel);
    if (e->dtype != DT_F32)
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': entry %s holds %s, not f32", dir, name,
                          dt_dtype_name(e->dtype));
    return DT_OK;
}

int dt_ckpt_read_unit_params(dt_ckpt_reader_t *rd, const char *dir, const dt_model_desc_t *d,
                             uint32_t u, float *dst)
{
    char name[DT_CKPT_NAME_MAX];
    snprintf(name, sizeof name, "%s/params", d->units[u].name);
    int rc = find_unit_entry(dir, rd, &d->units[u], name);
    return rc ? rc : dt_ckpt_read(rd, name, 0, d->units[u].numel, dst);
}

int dt_ckpt_model_sets(const dt_ckpt_reader_t *rd, const char *dir, char (*sets)[96], int cap,
                       int *n)
{
    const cJSON *model = dt_ckpt_reader_model(rd), *it;
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(model, "arch");
    *n = 0;
    if (!cJSON_IsString(arch))
        return dt_err_set(DT_ERR_DATA, "checkpoint '%s': manifest.json has no \"model\".\"arch\"",
                          dir);
    snprintf(sets[(*n)++], 96, "model.arch=%s", arch->valuestring);
    cJSON_ArrayForEach(it, model)
    {
        /* integers, booleans, float and choice settings; not the arch,
         * the precisions (strings) nor the tensor list */
        const int str = cJSON_IsString(it) && strcmp(it->string, "arch") != 0 &&
                        strcmp(it->string, "dtype") != 0 &&
                        strcmp(it->string, "activations") != 0;
        if (!cJSON_IsNumber(it) && !cJSON_IsBool(it) && !str)
            continue;
        if (*n == cap || strlen(it->string) > 48 ||
            (str && (strlen(it->valuestring) > 32 ||
                     strspn(it->valuestring, "abcdefghijklmnopqrstuvwxyz0123456789_-.") !=
                         strlen(it->valuestring))))
            return dt_err_set(DT_ERR_DATA,
                              "checkpoint '%s': manifest.json: \"model\".\"%s\" is not a "
                              "model key dtrain writes",
                              dir, it->string);
        const char *table = dt_model_key_table(arch->valuestring, it->string);
        if (cJSON_IsBool(it))
            snprintf(sets[(*n)++], 96, "%s.%s=%s", table, it->string,
                     cJSON_IsTrue(it) ? "true" : "false");
        else if (str)
            snprintf(sets[(*n)++], 96, "%s.%s=%s", table, it->string, it->valuestring);
        else if (it->valuedouble == (double)(int64_t)it->valuedouble)
            snprintf(sets[(*n)++], 96, "%s.%s=%lld", table, it->string,
                     (long long)it->valuedouble);
        else
            snprintf(sets[(*n)++], 96, "%s.%s=%.17g", table, it->string, it->valuedouble);
    }
    return DT_OK;
}

/* The train.steps the checkpoint's run was configured with (the end of
 * its learning-rate schedule); 0 when it predates the record. */
static int64_t saved_steps(const cJSON *extra)
{
    const cJSON *sched = cJSON_GetObjectItemCaseSensitive(extra, "schedule");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(sched, "train.steps");
    return cJSON_IsNumber(v) && v->valuedouble >= 1 ? (int64_t)v->valuedouble : 0;
}

/* Rank 0's note when the schedule a resumed run follows is not the saved
 * run's: a decay runs to train.steps, so another value reshapes the rest
 * of it. */
static void schedule_note(const dt_train_settings_t *t, int64_t was, int64_t start_step)
{
    if (was <= 0 || was == t->steps || t->decay == DT_DECAY_CONSTANT || start_step >= t->steps)
        return;
    int64_t next = start_step + 1;
    printf("dtrain: note: train.steps is %lld, the saved run's was %lld: the %s learning-rate "
           "decay now ends at step %lld instead of %lld (lr at step %lld: %.3g, was %.3g)\n",
           (long long)t->steps, (long long)was, dt_lr_decay_name(t->decay), (long long)t->steps,
           (long long)was, (long long)next,
           dt_lr_at(next, t->steps, t->warmup_steps, t->lr, t->min_lr, t->decay),
           dt_lr_at(next, was, t->warmup_steps, t->lr, t->min_lr, t->decay));
}

static int load(const dt_settings_t *set, dt_strategy_t *s,
                dt_model_t *m, const char *dir, int64_t *start_step, char *changed,
                size_t changed_cap, char *note, size_t note_cap, int64_t *was_steps,
                cJSON **loop)
{
    dt_ckpt_reader_t *rd = NULL;
    int rc = dt_ckpt_open(dir, &rd);
    if (rc)
        return rc;
    dt_model_desc_t *d = dt_model_desc(m);
    const int parts = dt_model_info(m)->tensor_parallel > 1;
    float *buf = NULL;
    note[0] = '\0';
    rc = check_model(dir, dt_ckpt_reader_model(rd), dt_model_info(m), note, note_cap);
    if (!rc)
        rc = dt_ckpt_check_tensors(dir, rd, d);
    for (uint32_t u = 0; u < d->n_units && !rc; u++) {
        for (int k = 0; k < n_states(set) && !rc; k++) {
            char name[DT_CKPT_NAME_MAX];
            snprintf(name, sizeof name, "%s/%s", d->units[u].name, state_names[k]);
            if ((rc = find_unit_entry(dir, rd, &d->units[u], name)))
                break;
            dt_crash_set_unit(u, d->units[u].name);
            const state_io_t io = {s, u, k, name, rd, NULL, 0};
            static const piece_ops_t lo = {NULL, load_piece, NULL};
            rc = parts ? each_part_range(&io, &d->units[u], DT_RANGES_HELD, load_part_piece,
                                         &buf)
                       : each_piece(&io, DT_RANGES_HELD, &lo, &buf);
        }
    }
    dt_crash_set_unit(-1, NULL);
    if (!rc) {
        *start_step = (int64_t)dt_ckpt_reader_step(rd);
        data_changes(set, dt_ckpt_reader_extra(rd), changed, changed_cap);
        *was_steps = saved_steps(dt_ckpt_reader_extra(rd));
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(dt_ckpt_reader_extra(rd), "loop");
        if (loop && cJSON_IsObject(l) && !(*loop = cJSON_Duplicate(l, 1)))
            rc = dt_err_set(DT_ERR_NOMEM, "out of memory");
    }
    free(buf);
    dt_ckpt_close(rd);
    if (rc)
        dt_err_context(rc, "resuming from '%s'", dir);
    return rc;
}

static int fresh(const dt_settings_t *set, dt_strategy_t *s,
                 dt_model_t *m)
{
    dt_model_desc_t *d = dt_model_desc(m);
    int rc = DT_OK;
    for (uint32_t u = 0; u < d->n_units && !rc; u++) {
        float *full = malloc((d->units[u].numel ? d->units[u].numel : 1) * sizeof *full);
        if (!full)
            return dt_err_set(DT_ERR_NOMEM, "out of memory initialising unit %s",
                              d->units[u].name);
        dt_crash_set_unit(u, d->units[u].name);
        rc = dt_model_init_unit(m, u, (uint64_t)set->run.seed, full);
        for (int k = 0; k < n_states(set) && !rc; k++) {
            if (k == DT_STATE_EXP_AVG)
                memset(full, 0, d->units[u].numel * sizeof *full);
            dt_range_t *rg = NULL;
            uint32_t n = 0;
            if ((rc = ranges(s, u, k, DT_RANGES_HELD, &rg, &n)))
                break;
            for (uint32_t i = 0; i < n && !rc; i++)
                rc = STRATEGY_CALL(
                    s, dt_strategy_ops(s)->set_state(s, u, k, rg[i], full + rg[i].offset),
                    "set_state");
            free(rg);
        }
        free(full);
    }
    dt_crash_set_unit(-1, NULL);
    return rc;
}

int dt_ckpt_init_or_resume(const dt_world_t *w, const dt_settings_t *set,
                           dt_strategy_t *s, dt_model_t *m,
                           int64_t *start_step, cJSON **loop)
{
    *start_step = 0;
    if (loop)
        *loop = NULL;
    const char *resume = set->checkpoint.resume;
    char root[2048], dir[4096];
    int rc;
    if ((rc = dt_ckpt_root(set, root, sizeof root)))
        return rc;
    /* a crash report says which (util/crash.h); the save's phase is the
     * training loop's, which knows the step */
    dt_crash_set_phase("state initialisation", 0);
    if (!resume[0])
        return fresh(set, s, m);
    if (strcmp(resume, "latest") == 0) {
        uint64_t step;
        rc = dt_ckpt_latest(root, dir, sizeof dir, &step);
        if (rc == DT_ERR_NOT_FOUND) {
            if (w->rank == 0)
                printf("dtrain: no complete checkpoint under %s; starting fresh\n", root);
            return fresh(set, s, m);
        }
        if (rc)
            return rc;
    } else {
        snprintf(dir, sizeof dir, "%s", resume);
    }
    dt_crash_set_phase("checkpoint load", 0);
    char changed[512], note[3 * 4096 + 512];
    int64_t was_steps = 0;
    if ((rc = load(set, s, m, dir, start_step, changed, sizeof changed, note, sizeof note,
                   &was_steps, loop)))
        return rc;
    if (w->rank == 0) {
        printf("dtrain: resumed from %s (step %lld)\n", dir, (long long)*start_step);
        fputs(note, stdout);
        if (changed[0])
            printf("dtrain: note: the data order after step %lld differs from the saved run's: "
                   "changed %s\n",
                   (long long)*start_step, changed);
        schedule_note(&set->train, was_steps, *start_step);
    }
    return DT_OK;
}

/* The memory of the last asynchronous save's shard, for the next one
 * (training thread only; the writer thread hands it back through its
 * save: shard_thread, dt_ckpt_save_finish). */
static void *spare_buf;
static size_t spare_cap;

/* Write this rank's SAVE ranges of every entry into shard `rank` of tmp
 * (deferred: into memory, the writer handed back in *deferred). */
static int write_shard(const dt_world_t *w, dt_strategy_t *s,
                       dt_model_t *m, int ns, const char *tmp, dt_ckpt_seg_t **segs,
                       size_t *n_segs, dt_ckpt_writer_t **deferred)
{
    dt_model_desc_t *d = dt_model_desc(m);
    dt_ckpt_writer_t *wr = NULL;
    float *buf = NULL;
    int rc;
    if (deferred) {
        /* the previous asynchronous save's memory, its pages already
         * mapped (one save at a time: it was committed before) */
        rc = dt_ckpt_shard_open_deferred(tmp, (uint32_t)w->rank, spare_buf, spare_cap, &wr);
        spare_buf = NULL;
        spare_cap = 0;
    } else {
        rc = dt_ckpt_shard_open(tmp, (uint32_t)w->rank, &wr);
    }
    for (uint32_t u = 0; u < d->n_units && !rc; u++) {
        for (int k = 0; k < ns && !rc; k++) {
            char name[DT_CKPT_NAME_MAX];
            snprintf(name, sizeof name, "%s/%s", d->units[u].name, state_names[k]);
            dt_crash_set_unit(u, d->units[u].name);
            const state_io_t io = {s, u, k, name, NULL, wr, deferred != NULL};
            static const piece_ops_t so = {save_begin, save_piece, save_end};
            rc = dt_model_info(m)->tensor_parallel > 1
                     ? each_part_range(&io, &d->units[u], DT_RANGES_SAVE, save_part_piece, &buf)
                     : each_piece(&io, DT_RANGES_SAVE, &so, &buf);
        }
    }
    free(buf);
    dt_crash_set_unit(-1, NULL);
    if (rc) {
        dt_ckpt_shard_abort(wr);
        return rc;
    }
    rc = dt_ckpt_shard_close(wr, segs, n_segs);
    if (deferred)
        *deferred = rc ? NULL : wr;
    return rc;
}

/* Every rank learns the lowest failing rank (or -1) of a local outcome. */
static int agree(const dt_world_t *w, dt_comm_t *comm, int local_rc,
                 int32_t *failed)
{
    int32_t v = local_rc ? w->rank : INT32_MAX;
    if (w->size > 1) {
        int rc = COMM_CALL(comm, all_reduce, (comm, &v, &v, 1, DT_I32, DT_OP_MIN, NULL, NULL),
                           "all_reduce");
        if (rc)
            return rc;
    }
    *failed = v == INT32_MAX ? -1 : v;
    return DT_OK;
}

/* Gather every rank's segment table to all ranks (rank 0 uses it). */
static int gather_segs(const dt_world_t *w, dt_comm_t *comm,
                       const dt_ckpt_seg_t *mine, size_t n_mine, dt_ckpt_seg_t **all,
                       size_t *n_all)
{
    int64_t *counts = calloc((size_t)w->size, sizeof *counts);
    int64_t nm = (int64_t)n_mine, most = 0, total = 0;
    if (!counts)
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    int rc = COMM_CALL(comm, all_gather, (comm, &nm, counts, 1, DT_I64, NULL, NULL),
                       "all_gather");
    for (int r = 0; r < w->size && !rc; r++) {
        most = counts[r] > most ? counts[r] : most;
        total += counts[r];
    }
    dt_ckpt_seg_t *pad = NULL, *gath = NULL;
    if (!rc) {
        pad = calloc(most ? (size_t)most : 1, sizeof *pad);
        gath = calloc((size_t)w->size * (most ? (size_t)most : 1), sizeof *gath);
        *all = calloc(total ? (size_t)total : 1, sizeof **all);
        if (!pad || !gath || !*all)
            rc = dt_err_set(DT_ERR_NOMEM, "out of memory gathering checkpoint segments");
    }
    if (!rc) {
        memcpy(pad, mine, n_mine * sizeof *pad);
        rc = COMM_CALL(comm, all_gather, (comm, pad, gath, (uint64_t)most * sizeof *pad, DT_U8,
                                        NULL, NULL),
                       "all_gather");
    }
    if (!rc) {
        size_t k = 0;
        for (int r = 0; r < w->size; r++)
            for (int64_t i = 0; i < counts[r]; i++)
                (*all)[k++] = gath[(size_t)r * (size_t)most + (size_t)i];
        *n_all = k;
    }
    free(counts);
    free(pad);
    free(gath);
    return rc;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bytes of the regular files in `dir` (a checkpoint: no subfolders). */
static uint64_t dir_bytes(const char *dir)
{
    uint64_t total = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    struct stat st;
    while (d && (e = readdir(d)))
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            total += (uint64_t)st.st_size;
    if (d)
        closedir(d);
    return total;
}

/* Rank 0's line for a save that committed: "checkpoint: saved
 * out/run/ckpt/step-00000004 (123456 bytes, 0.012 s)"; an asynchronous
 * one (paused >= 0) adds how long it held the training loop up: "(123456
 * bytes, 0.512 s; training paused 0.004 s)". */
static void print_saved(const char *root, int64_t step, double t0, double paused)
{
    char dir[4096];
    if (dt_ckpt_step_dir(root, (uint64_t)step, 0, dir, sizeof dir) != DT_OK)
        return;
    printf("checkpoint: saved %s (%llu bytes, %.3f s", dir, (unsigned long long)dir_bytes(dir),
           mono_s() - t0);
    if (paused >= 0)
        printf("; training paused %.3f s", paused);
    printf(")\n");
    fflush(stdout);
}

/* A save between its phases (dt_ckpt_save does both at once; an
 * asynchronous one has its shard written by a thread in between). */
struct dt_ckpt_async {
    const dt_world_t *w;
    const dt_settings_t *set;
    uint64_t config_hash;
    dt_comm_t *comm;
    const char *strategy_name; /* the strategy's info.name, for the manifest */
    dt_model_t *m;
    int64_t step;
    cJSON *loop;            /* a copy of the caller's */
    char root[2048], tmp[4096];
    double t0;
    double paused;          /* async: s the training loop spent on it; -1 */
    double paused_since;    /* async: when the boundary's advance began */
    int written;            /* every rank's shard is on disk */
    dt_ckpt_seg_t *all;     /* every rank's segments (rank 0 uses them) */
    size_t n_all;
    dt_ckpt_writer_t *wr;   /* the deferred shard until its thread took it */
    void *mem;              /* the shard's memory, once written */
    size_t mem_cap;
    dt_ckpt_seg_t *segs;    /* this rank's segments, CRCs in, once written */
    size_t n_segs;
    /* rank 0's manifest (manifest_parts) */
    dt_ckpt_entry_t *entries;
    size_t n_entries;
    cJSON *mj, *extra;
    /* async: stage 1, every rank's thread writes its shard; stage 2, rank
     * 0's commits (manifest, COMPLETE, rename) and prunes */
    int stage;
    pthread_t th;
    int th_started;
    atomic_int th_done;     /* the thread's results below are in */
    int th_rc;              /* stage 2: the commit's */
    int prune_rc;           /* stage 2: the prune's (the save stands) */
    char th_err[DT_ERR_MAX];
};

/* A save failed with rc: what it left removed (rank 0 the temp folder, a
 * peer its shard while rank 0 cannot commit it yet), the reason kept. */
static int save_fail(dt_ckpt_async_t *sv, int rc)
{
    /* neither removing what this save left nor looking for an earlier one
     * may replace the reason the save failed */
    char why[DT_ERR_MAX];
    snprintf(why, sizeof why, "%s", dt_last_error());
    uint64_t step = (uint64_t)sv->step;
    if (sv->w->rank == 0) {
        /* "intact" only when there is one: the first save has none */
        char last[4096];
        dt_ckpt_abort(sv->root, step);
        int have = dt_ckpt_latest(sv->root, last, sizeof last, NULL) == DT_OK;
        dt_err_set(rc, "%s", why);
        dt_err_context(rc, "saving checkpoint of step %lld (%s)", (long long)sv->step,
                       have ? "the previous checkpoint is intact"
                            : "there is no earlier checkpoint to fall back on");
    } else {
        /* once every shard is written rank 0 may commit whatever this rank
         * learns, so only rank 0 removes the save then (a peer that
         * removed its shard after a failed gather or broadcast would leave
         * rank 0 committing a checkpoint without it) */
        if (!sv->written)
            dt_ckpt_abort_shard(sv->root, step, (uint32_t)sv->w->rank);
        dt_err_set(rc, "%s", why);
        dt_err_context(rc, "saving checkpoint of step %lld", (long long)sv->step);
    }
    return rc;
}

static void save_free(dt_ckpt_async_t *sv)
{
    if (!sv)
        return;
    dt_ckpt_shard_abort(sv->wr);
    if (sv->mem && !spare_buf) { /* kept for the next save */
        spare_buf = sv->mem;
        spare_cap = sv->mem_cap;
    } else {
        free(sv->mem);
    }
    free(sv->all);
    free(sv->segs);
    free(sv->entries);
    cJSON_Delete(sv->mj);
    cJSON_Delete(sv->extra);
    cJSON_Delete(sv->loop);
    free(sv);
}

/* Every rank's segment table (this rank's `segs`, taken over) to sv->all. */
static int share_segs(dt_ckpt_async_t *sv, dt_ckpt_seg_t *segs, size_t n_segs)
{
    if (sv->w->size == 1) {
        sv->all = segs;
        sv->n_all = n_segs;
        return DT_OK;
    }
    int rc = gather_segs(sv->w, sv->comm, segs, n_segs, &sv->all, &sv->n_all);
    free(segs);
    return rc;
}

/* Phase 1, collective: the temp folder, this rank's shard (to disk, the
 * segment tables gathered; or deferred: to memory, kept in sv->wr, its
 * CRCs and the gather left to dt_ckpt_save_finish). */
static int save_shards(dt_ckpt_async_t *sv, dt_strategy_t *s, int deferred)
{
    const dt_world_t *w = sv->w;
    int rc;
    int32_t failed = -1;
    const int ns = n_states(sv->set);
    dt_ckpt_seg_t *segs = NULL;
    size_t n_segs = 0;
    /* rank 0 makes the tmp dir; the others learn whether it could */
    int32_t begin_rc = w->rank == 0
                           ? dt_ckpt_begin(sv->root, (uint64_t)sv->step, sv->tmp, sizeof sv->tmp)
                           : dt_ckpt_step_dir(sv->root, (uint64_t)sv->step, 1, sv->tmp,
                                              sizeof sv->tmp);
    if ((rc = agree(w, sv->comm, begin_rc, &failed)))
        return save_fail(sv, rc); /* rank 0 made the tmp dir: it goes */
    if (failed >= 0) {
        if (failed != w->rank)
            dt_err_set(DT_ERR_IO, "rank %d could not start the checkpoint", (int)failed);
        return save_fail(sv, begin_rc ? begin_rc : DT_ERR_IO);
    }
    int local = write_shard(w, s, sv->m, ns, sv->tmp, &segs, &n_segs,
                            deferred ? &sv->wr : NULL);
    if ((rc = agree(w, sv->comm, local, &failed))) {
        free(segs);
        return save_fail(sv, rc);
    }
    if (failed >= 0) {
        free(segs);
        rc = local ? local : dt_err_set(DT_ERR_IO, "rank %d failed writing its shard", (int)failed);
        return save_fail(sv, rc);
    }
    sv->written = !deferred;
    if (deferred) {
        free(segs); /* none: the deferred shard keeps its own */
        return DT_OK;
    }
    rc = share_segs(sv, segs, n_segs);
    return rc ? save_fail(sv, rc) : DT_OK;
}

/* Rank 0: what the manifest records besides the segments (the entries,
 * the model, the extra keys), into sv. */
static int manifest_parts(dt_ckpt_async_t *sv)
{
    const dt_settings_t *set = sv->set;
    dt_model_desc_t *d = dt_model_desc(sv->m);
    const int ns = n_states(set);
    sv->n_entries = (size_t)d->n_units * (size_t)ns;
    sv->entries = calloc(sv->n_entries, sizeof *sv->entries);
    sv->mj = dt_ckpt_model_json(sv->m);
    cJSON *extra = sv->extra = cJSON_CreateObject();
    if (!sv->entries || !sv->mj || !extra)
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    dt_ckpt_json_add_u64(extra, "config_hash", sv->config_hash);
    dt_ckpt_json_add_u64(extra, "seed", (uint64_t)set->run.seed);
    cJSON *data = data_json(set);
    if (data)
        cJSON_AddItemToObject(extra, "data", data);
    /* where the learning-rate schedule ends (schedule_note) */
    cJSON *sched = cJSON_AddObjectToObject(extra, "schedule");
    if (sched)
        cJSON_AddNumberToObject(sched, "train.steps", (double)set->train.steps);
    cJSON *lp = sv->loop ? cJSON_Duplicate(sv->loop, 1) : NULL;
    if (lp)
        cJSON_AddItemToObject(extra, "loop", lp);
    for (uint32_t u = 0; u < d->n_units; u++)
        for (int k = 0; k < ns; k++) {
            dt_ckpt_entry_t *e = &sv->entries[u * (uint32_t)ns + (uint32_t)k];
            snprintf(e->name, sizeof e->name, "%s/%s", d->units[u].name, state_names[k]);
            e->dtype = DT_F32;
            e->numel = unit_global(&d->units[u], NULL);
        }
    return DT_OK;
}

/* Rank 0, every shard on disk and manifest_parts made: the manifest
 * written and the save committed (any thread). */
static int write_and_commit(dt_ckpt_async_t *sv)
{
    dt_ckpt_info_t info = {.step = (uint64_t)sv->step, .world_size = (uint32_t)sv->w->size,
                           .strategy = sv->strategy_name, .model = sv->mj, .extra = sv->extra};
    int rc = dt_ckpt_write_manifest(sv->tmp, &info, sv->entries, sv->n_entries, sv->all,
                                    sv->n_all);
    return rc ? rc : dt_ckpt_commit(sv->root, (uint64_t)sv->step);
}

/* Collective: every rank learns rank 0's commit_rc; a failed commit is
 * the save's failure (save_fail); after a commit rank 0 prunes (`prune`;
 * else its commit thread did, sv->prune_rc) and announces the save. */
static int commit_outcome(dt_ckpt_async_t *sv, int32_t commit_rc, int prune)
{
    int rc = DT_OK;
    if (sv->w->size > 1 &&
        (rc = COMM_CALL(sv->comm, broadcast, (sv->comm, &commit_rc, 1, DT_I32, 0, NULL, NULL),
                        "broadcast")))
        return save_fail(sv, rc);
    if (commit_rc) {
        if (sv->w->rank != 0)
            dt_err_set(commit_rc, "rank 0 could not write the manifest or commit");
        return save_fail(sv, commit_rc);
    }
    if (sv->w->rank != 0)
        return DT_OK;
    rc = prune ? dt_ckpt_prune(sv->root, (uint32_t)sv->set->checkpoint.keep) : sv->prune_rc;
    if (rc == DT_OK)
        print_saved(sv->root, sv->step, sv->t0,
                    sv->paused < 0 ? -1 : sv->paused + mono_s() - sv->paused_since);
    return rc;
}

/* Phase 2, collective, every shard on disk: rank 0 writes the manifest
 * and commits, every rank learns the outcome, rank 0 prunes. */
static int save_commit(dt_ckpt_async_t *sv)
{
    int32_t commit_rc = DT_OK;
    if (sv->w->rank == 0 && !(commit_rc = manifest_parts(sv)))
        commit_rc = write_and_commit(sv);
    return commit_outcome(sv, commit_rc, 1);
}

static int save_new(const dt_world_t *w, const dt_settings_t *set, uint64_t config_hash,
                    dt_comm_t *comm, dt_strategy_t *s,
                    dt_model_t *m, int64_t step, const cJSON *loop, dt_ckpt_async_t **out)
{
    dt_ckpt_async_t *sv = calloc(1, sizeof *sv);
    if (!sv || (loop && !(sv->loop = cJSON_Duplicate(loop, 1)))) {
        free(sv);
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    }
    *sv = (dt_ckpt_async_t){.w = w,
                            .set = set,
                            .config_hash = config_hash,
                            .comm = comm,
                            .strategy_name = dt_strategy_ops(s)->info.name,
                            .m = m,
                            .step = step,
                            .loop = sv->loop,
                            .t0 = mono_s(),
                            .paused = -1};
    int rc = dt_ckpt_root(set, sv->root, sizeof sv->root);
    if (rc) {
        save_free(sv);
        return rc;
    }
    *out = sv;
    return DT_OK;
}

int dt_ckpt_save(const dt_world_t *w, const dt_settings_t *set, uint64_t config_hash,
                 dt_comm_t *comm, dt_strategy_t *s, dt_model_t *m, int64_t step, const cJSON *loop)
{
    dt_ckpt_async_t *sv = NULL;
    int rc = save_new(w, set, config_hash, comm, s, m, step, loop, &sv);
    if (rc == DT_OK && (rc = save_shards(sv, s, 0)) == DT_OK)
        rc = save_commit(sv);
    save_free(sv);
    return rc;
}

/* The threads keep the training threads' priority: at idle priority
 * (SCHED_IDLE) or nice 19 they got nothing while other work kept the cores
 * busy, and the next save then waited for the whole write, which held
 * training up longer than a writer sharing the cores (bench/results/
 * elastic.md).  Test builds: DTRAIN_TEST_CKPT_WRITER_PRIORITY=idle or nice
 * lowers it, for bench/bench_ckpt_async.sh to compare. */
static void writer_priority(void)
{
#ifdef DTRAIN_TEST_HOOKS
    const char *how = getenv("DTRAIN_TEST_CKPT_WRITER_PRIORITY");
    const struct sched_param sp = {.sched_priority = 0};
    if (how && strcmp(how, "idle") == 0)
        (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
    else if (how && strcmp(how, "nice") == 0)
        (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
#endif
}

#ifdef DTRAIN_TEST_HOOKS
/* DTRAIN_FAULT_CKPT_WRITER_DELAY_MS=N (test builds only): the writer
 * waits N ms before it writes, so a test sees a commit deferred across
 * steps, and a crash while a save is in flight, at a known point. */
static void writer_delay(void)
{
    const char *v = getenv("DTRAIN_FAULT_CKPT_WRITER_DELAY_MS");
    long ms = v ? strtol(v, NULL, 10) : 0;
    if (ms > 0)
        nanosleep(&(struct timespec){.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000L}, NULL);
}
#else
static void writer_delay(void) {}
#endif

/* The work of an asynchronous save's stage, then th_done (polled by
 * dt_ckpt_save_advance): stage 1 this rank's shard checksummed and
 * written to disk; stage 2, rank 0, the manifest and the commit, then the
 * prune. */
static void stage_work(dt_ckpt_async_t *sv)
{
    if (sv->stage == 1) {
        dt_ckpt_writer_t *wr = sv->wr;
        sv->wr = NULL;
        writer_delay();
        sv->th_rc = dt_ckpt_shard_finish(wr, &sv->segs, &sv->n_segs, &sv->mem, &sv->mem_cap);
    } else if ((sv->th_rc = write_and_commit(sv)) == DT_OK) {
        sv->prune_rc = dt_ckpt_prune(sv->root, (uint32_t)sv->set->checkpoint.keep);
    }
    if (sv->th_rc || sv->prune_rc)
        snprintf(sv->th_err, sizeof sv->th_err, "%s", dt_last_error());
    atomic_store_explicit(&sv->th_done, 1, memory_order_release);
}

static void *stage_thread(void *arg)
{
    writer_priority();
    stage_work(arg);
    return NULL;
}

/* Stage `stage` begun: its work on a thread (that takes no signal: the
 * training loop's own are its to take), or now when none can be had. */
static void stage_start(dt_ckpt_async_t *sv, int stage)
{
    sv->stage = stage;
    atomic_store_explicit(&sv->th_done, 0, memory_order_relaxed);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    sv->th_started = pthread_create(&sv->th, NULL, stage_thread, sv) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!sv->th_started)
        stage_work(sv); /* no thread: done now */
}

/* The stage's thread joined: back at normal priority first when it is
 * still at work and was lowered (writer_priority; the training loop waits
 * for it now; best effort: an unprivileged process may not raise it). */
static void stage_join(dt_ckpt_async_t *sv)
{
    if (!sv->th_started)
        return;
    if (!atomic_load_explicit(&sv->th_done, memory_order_acquire)) {
        const struct sched_param sp = {.sched_priority = 0};
        (void)pthread_setschedparam(sv->th, SCHED_OTHER, &sp);
    }
    pthread_join(sv->th, NULL);
    sv->th_started = 0;
}

int dt_ckpt_save_async(const dt_world_t *w, const dt_settings_t *set, uint64_t config_hash,
                       dt_comm_t *comm, dt_strategy_t *s, dt_model_t *m, int64_t step,
                       const cJSON *loop, dt_ckpt_async_t **out)
{
    *out = NULL;
    dt_ckpt_async_t *sv = NULL;
    int rc = save_new(w, set, config_hash, comm, s, m, step, loop, &sv);
    if (rc == DT_OK && (rc = save_shards(sv, s, 1)) != DT_OK) {
        save_free(sv);
        return rc;
    }
    if (rc)
        return rc;
    stage_start(sv, 1);
    sv->paused = mono_s() - sv->t0;
    *out = sv;
    return DT_OK;
}

/* Collective, every rank's stage 1 done: the outcomes agreed, the segment
 * tables gathered, rank 0's commit begun (stage 2). */
static int stage1_end(dt_ckpt_async_t *sv)
{
    stage_join(sv);
    int local = sv->th_rc;
    if (local)
        dt_err_set(local, "%s", sv->th_err);
    int32_t failed = -1;
    int rc = agree(sv->w, sv->comm, local, &failed);
    if (rc == DT_OK && failed >= 0)
        rc = local ? local : dt_err_set(DT_ERR_IO, "rank %d failed writing its shard", (int)failed);
    if (rc == DT_OK) {
        /* every shard is on disk: from here rank 0 alone removes the save */
        sv->written = 1;
        rc = share_segs(sv, sv->segs, sv->n_segs);
        sv->segs = NULL;
    }
    if (rc)
        return save_fail(sv, rc);
    if (sv->w->rank == 0 && (sv->th_rc = manifest_parts(sv)) == DT_OK) {
        stage_start(sv, 2);
        return DT_OK;
    }
    /* a peer waits for rank 0's outcome; rank 0 out of memory has it */
    if (sv->th_rc)
        snprintf(sv->th_err, sizeof sv->th_err, "%s", dt_last_error());
    sv->stage = 2;
    atomic_store_explicit(&sv->th_done, 1, memory_order_relaxed);
    return DT_OK;
}

/* Collective, rank 0's commit done: every rank learns its outcome. */
static int stage2_end(dt_ckpt_async_t *sv)
{
    stage_join(sv);
    if (sv->th_rc || sv->prune_rc)
        dt_err_set(sv->th_rc ? sv->th_rc : sv->prune_rc, "%s", sv->th_err);
    return commit_outcome(sv, sv->th_rc, 0);
}

/* Collective: whether every rank's thread has finished its stage. */
static int all_done(dt_ckpt_async_t *sv, int *ready)
{
    int32_t v = atomic_load_explicit(&sv->th_done, memory_order_acquire);
    int rc = DT_OK;
    if (sv->w->size > 1)
        rc = COMM_CALL(sv->comm, all_reduce,
                       (sv->comm, &v, &v, 1, DT_I32, DT_OP_MIN, NULL, NULL), "all_reduce");
    *ready = rc == DT_OK && v == 1;
    return rc;
}

/* Collective: the save's stages advanced, each once every rank is done
 * with it (wait: until the save is over); *over when it is, rc its
 * outcome.  On failure the thread is joined and the save removed. */
static int advance(dt_ckpt_async_t *sv, int wait, int *over)
{
    const double t = sv->paused_since = mono_s();
    int rc = DT_OK, ready = 1;
    *over = 0;
    while (!*over && rc == DT_OK) {
        if (!wait && (rc = all_done(sv, &ready)) != DT_OK) {
            stage_join(sv);
            rc = save_fail(sv, rc);
            break;
        }
        if (!ready)
            break;
        if (sv->stage == 1) {
            rc = stage1_end(sv);
            *over = rc != DT_OK;
        } else {
            rc = stage2_end(sv);
            *over = 1;
        }
    }
    *over = *over || rc != DT_OK;
    sv->paused += mono_s() - t;
    return rc;
}

int dt_ckpt_save_advance(dt_ckpt_async_t **a)
{
    if (!*a)
        return DT_OK;
    int over, rc = advance(*a, 0, &over);
    if (over) {
        save_free(*a);
        *a = NULL;
    }
    return rc;
}

int dt_ckpt_save_finish(dt_ckpt_async_t *sv)
{
    if (!sv)
        return DT_OK;
    int over, rc = advance(sv, 1, &over);
    save_free(sv);
    return rc;
}

void dt_ckpt_save_discard(dt_ckpt_async_t *sv)
{
    if (!sv)
        return;
    stage_join(sv);
    char err[DT_ERR_MAX];
    snprintf(err, sizeof err, "%s", dt_last_error());
    /* rank 0 removes the temp folder (nothing once its commit renamed it:
     * that save is complete); a peer its shard, unless rank 0 may be
     * committing it */
    if (sv->w->rank == 0)
        dt_ckpt_abort(sv->root, (uint64_t)sv->step);
    else if (!sv->written)
        dt_ckpt_abort_shard(sv->root, (uint64_t)sv->step, (uint32_t)sv->w->rank);
    dt_err_set(DT_ERR_IO, "%s", err); /* the run's own error stays */
    save_free(sv);
}
