/*
 * core/engine/ckpt.c - save and resume training state by global ranges.
 */
#include "engine/ckpt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ckpt_io.h"
#include "util/error.h"

static const char *const state_names[DT_STATE_COUNT] = {"params", "exp_avg", "exp_avg_sq"};

int dt_ckpt_root(const dt_config_t *cfg, char *buf, size_t cap)
{
    const char *dir, *out, *name;
    int rc;
    if ((rc = dt_config_get_string(cfg, "checkpoint.dir", &dir)) ||
        (rc = dt_config_get_string(cfg, "run.out_dir", &out)) ||
        (rc = dt_config_get_string(cfg, "run.name", &name)))
        return rc;
    int n = dir[0] ? snprintf(buf, cap, "%s", dir) : snprintf(buf, cap, "%s/%s/ckpt", out, name);
    if (n < 0 || (size_t)n >= cap)
        return dt_err_set(DT_ERR_CONFIG, "checkpoint directory path is too long");
    return DT_OK;
}

/* The states this optimizer keeps (SGD has no second moment). */
static int n_states(const dt_config_t *cfg)
{
    const char *t = "adamw";
    dt_config_get_string(cfg, "optimizer.type", &t);
    return strcmp(t, "sgd") == 0 ? 2 : 3;
}

/* Ranges of `unit`/`kind` for `purpose`, malloc'd into *out. */
static int ranges(const dt_strategy_ops_v1_t *ops, dt_strategy_t *s, uint32_t unit, int kind,
                  int purpose, dt_range_t **out, uint32_t *n)
{
    int rc = ops->state_ranges(s, unit, kind, purpose, NULL, 0, n);
    if (rc)
        return rc;
    *out = calloc(*n ? *n : 1, sizeof **out);
    if (!*out)
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    uint32_t n2 = 0;
    if ((rc = ops->state_ranges(s, unit, kind, purpose, *out, *n, &n2))) {
        free(*out);
        return rc;
    }
    return DT_OK;
}

static cJSON *model_json(dt_model_t *m)
{
    const dt_gpt2_shape_t *sh = dt_model_gpt2_shape(m);
    cJSON *j = cJSON_CreateObject();
    if (!j)
        return NULL;
    cJSON_AddStringToObject(j, "arch", dt_model_desc(m)->arch);
    cJSON_AddNumberToObject(j, "n_layer", (double)sh->n_layer);
    cJSON_AddNumberToObject(j, "n_head", (double)sh->n_head);
    cJSON_AddNumberToObject(j, "n_embd", (double)sh->n_embd);
    cJSON_AddNumberToObject(j, "vocab_size", (double)sh->vocab_size);
    cJSON_AddNumberToObject(j, "context", (double)sh->context);
    return j;
}

static int load(const dt_config_t *cfg, const dt_strategy_ops_v1_t *ops, dt_strategy_t *s,
                dt_model_t *m, const char *dir, int64_t *start_step)
{
    dt_ckpt_reader_t *rd = NULL;
    int rc = dt_ckpt_open(dir, &rd);
    if (rc)
        return rc;
    dt_model_desc_v1_t *d = dt_model_desc(m);
    float *buf = NULL;
    dt_range_t *rg = NULL;
    for (uint32_t u = 0; u < d->n_units && !rc; u++) {
        for (int k = 0; k < n_states(cfg) && !rc; k++) {
            char name[DT_CKPT_NAME_MAX];
            snprintf(name, sizeof name, "%s/%s", d->units[u].name, state_names[k]);
            const dt_ckpt_entry_t *e = dt_ckpt_find(rd, name);
            if (!e) {
                rc = dt_err_set(DT_ERR_DATA,
                                "checkpoint '%s' has no entry %s: it was saved from another "
                                "model or optimizer",
                                dir, name);
                break;
            }
            if (e->numel != d->units[u].numel) {
                rc = dt_err_set(DT_ERR_DATA,
                                "checkpoint '%s': entry %s has %llu elements but this model's "
                                "unit %s has %llu: the checkpoint is from another model shape",
                                dir, name, (unsigned long long)e->numel, d->units[u].name,
                                (unsigned long long)d->units[u].numel);
                break;
            }
            uint32_t n = 0;
            if ((rc = ranges(ops, s, u, k, DT_RANGES_HELD, &rg, &n)))
                break;
            for (uint32_t i = 0; i < n && !rc; i++) {
                float *b = realloc(buf, (rg[i].count ? rg[i].count : 1) * sizeof *buf);
                if (!b) {
                    rc = dt_err_set(DT_ERR_NOMEM, "out of memory");
                    break;
                }
                buf = b;
                if (!(rc = dt_ckpt_read(rd, name, rg[i].offset, rg[i].count, buf)))
                    rc = ops->set_state(s, u, k, rg[i], buf);
            }
            free(rg);
            rg = NULL;
        }
    }
    if (!rc)
        *start_step = (int64_t)dt_ckpt_reader_step(rd);
    free(buf);
    dt_ckpt_close(rd);
    if (rc)
        dt_err_context(rc, "resuming from '%s'", dir);
    return rc;
}

static int fresh(const dt_config_t *cfg, const dt_strategy_ops_v1_t *ops, dt_strategy_t *s,
                 dt_model_t *m, uint64_t seed)
{
    dt_model_desc_v1_t *d = dt_model_desc(m);
    int rc = DT_OK;
    for (uint32_t u = 0; u < d->n_units && !rc; u++) {
        float *full = malloc((d->units[u].numel ? d->units[u].numel : 1) * sizeof *full);
        if (!full)
            return dt_err_set(DT_ERR_NOMEM, "out of memory initialising unit %s",
                              d->units[u].name);
        rc = dt_model_init_unit(m, u, seed, full);
        for (int k = 0; k < n_states(cfg) && !rc; k++) {
            if (k == DT_STATE_EXP_AVG)
                memset(full, 0, d->units[u].numel * sizeof *full);
            dt_range_t *rg = NULL;
            uint32_t n = 0;
            if ((rc = ranges(ops, s, u, k, DT_RANGES_HELD, &rg, &n)))
                break;
            for (uint32_t i = 0; i < n && !rc; i++)
                rc = ops->set_state(s, u, k, rg[i], full + rg[i].offset);
            free(rg);
        }
        free(full);
    }
    return rc;
}

int dt_ckpt_init_or_resume(const dt_world_t *w, const dt_config_t *cfg,
                           const dt_strategy_ops_v1_t *ops, dt_strategy_t *s, dt_model_t *m,
                           uint64_t seed, int64_t *start_step)
{
    *start_step = 0;
    const char *resume;
    char root[2048], dir[4096];
    int rc;
    if ((rc = dt_config_get_string(cfg, "checkpoint.resume", &resume)) ||
        (rc = dt_ckpt_root(cfg, root, sizeof root)))
        return rc;
    if (!resume[0])
        return fresh(cfg, ops, s, m, seed);
    if (strcmp(resume, "latest") == 0) {
        uint64_t step;
        rc = dt_ckpt_latest(root, dir, sizeof dir, &step);
        if (rc == DT_ERR_NOT_FOUND) {
            if (w->rank == 0)
                printf("dtrain: no complete checkpoint under %s; starting fresh\n", root);
            return fresh(cfg, ops, s, m, seed);
        }
        if (rc)
            return rc;
    } else {
        snprintf(dir, sizeof dir, "%s", resume);
    }
    if ((rc = load(cfg, ops, s, m, dir, start_step)))
        return rc;
    if (w->rank == 0)
        printf("dtrain: resumed from %s (step %lld)\n", dir, (long long)*start_step);
    return DT_OK;
}

int dt_ckpt_save(const dt_world_t *w, const dt_config_t *cfg, const dt_strategy_ops_v1_t *ops,
                 dt_strategy_t *s, dt_model_t *m, int64_t step)
{
    if (w->size != 1)
        return dt_err_set(DT_ERR_UNSUPPORTED,
                          "saving a checkpoint from %d ranks is not implemented yet (needs "
                          "the segment gather of the sharded checkpoint issue)",
                          w->size);
    char root[2048], tmp[4096];
    int64_t keep;
    int rc;
    if ((rc = dt_ckpt_root(cfg, root, sizeof root)) ||
        (rc = dt_config_get_int(cfg, "checkpoint.keep", &keep)))
        return rc;
    if ((rc = dt_ckpt_begin(root, (uint64_t)step, tmp, sizeof tmp)))
        return dt_err_context(rc, "saving checkpoint of step %lld", (long long)step);
    dt_model_desc_v1_t *d = dt_model_desc(m);
    const int ns = n_states(cfg);
    dt_ckpt_writer_t *wr = NULL;
    dt_ckpt_entry_t *entries = calloc((size_t)d->n_units * (size_t)ns, sizeof *entries);
    dt_ckpt_seg_t *segs = NULL;
    size_t n_segs = 0;
    float *buf = NULL;
    cJSON *mj = model_json(m), *extra = cJSON_CreateObject();
    if (!entries || !mj || !extra) {
        rc = dt_err_set(DT_ERR_NOMEM, "out of memory");
        goto fail;
    }
    dt_ckpt_json_add_u64(extra, "config_hash", dt_config_hash(cfg));
    if ((rc = dt_ckpt_shard_open(tmp, (uint32_t)w->rank, &wr)))
        goto fail;
    for (uint32_t u = 0; u < d->n_units; u++) {
        for (int k = 0; k < ns; k++) {
            dt_ckpt_entry_t *e = &entries[u * (uint32_t)ns + (uint32_t)k];
            snprintf(e->name, sizeof e->name, "%s/%s", d->units[u].name, state_names[k]);
            e->dtype = DT_F32;
            e->numel = d->units[u].numel;
            dt_range_t *rg = NULL;
            uint32_t n = 0;
            if ((rc = ranges(ops, s, u, k, DT_RANGES_SAVE, &rg, &n)))
                goto fail;
            for (uint32_t i = 0; i < n && !rc; i++) {
                float *b = realloc(buf, (rg[i].count ? rg[i].count : 1) * sizeof *buf);
                if (!b) {
                    rc = dt_err_set(DT_ERR_NOMEM, "out of memory");
                    break;
                }
                buf = b;
                if (!(rc = ops->get_state(s, u, k, rg[i], buf)))
                    rc = dt_ckpt_shard_write(wr, e->name, DT_F32, rg[i].offset, rg[i].count,
                                             buf);
            }
            free(rg);
            if (rc)
                goto fail;
        }
    }
    rc = dt_ckpt_shard_close(wr, &segs, &n_segs);
    wr = NULL;
    if (rc)
        goto fail;
    dt_ckpt_info_t info = {.step = (uint64_t)step, .world_size = (uint32_t)w->size,
                           .strategy = NULL, .model = mj, .extra = extra};
    if ((rc = dt_ckpt_write_manifest(tmp, &info, entries, (size_t)d->n_units * (size_t)ns, segs,
                                     n_segs)) ||
        (rc = dt_ckpt_commit(root, (uint64_t)step)))
        goto fail;
    rc = dt_ckpt_prune(root, (uint32_t)keep);
    goto done;
fail:
    dt_ckpt_shard_abort(wr);
    dt_ckpt_abort(root, (uint64_t)step);
    dt_err_context(rc, "saving checkpoint of step %lld (the previous checkpoint is intact)",
                   (long long)step);
done:
    free(buf);
    free(segs);
    free(entries);
    cJSON_Delete(mj);
    cJSON_Delete(extra);
    return rc;
}
