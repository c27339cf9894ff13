/*
 * core/train/plan.c - assembling a strategy's estimate arguments from the
 * typed settings and the model.
 */
#include "train/plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

int dt_plan_strategy(const dt_plugin_t *strat, dt_model_t *m, const dt_settings_t *set,
                     int world, dt_estimate_t *out)
{
    return dt_plan_strategy_offload(strat, m, set, world,
                                    strcmp(set->parallel.offload, "none") != 0, out);
}

/* The estimate for description `d` (the model's, or one stage's) with
 * `act_bytes` of activations. */
static int estimate(const dt_plugin_t *strat, dt_model_t *m, const dt_model_desc_t *d,
                    const dt_settings_t *set, int world, int offload, uint64_t act_bytes,
                    dt_estimate_t *out)
{
    const int64_t micro = set->train.micro_batch, global = set->train.global_batch;
    int64_t accum = set->train.grad_accum;
    /* not dt_batch_resolve: a plan for another world size than the config's
     * batch was written for is the point of planning, so a global batch
     * that does not divide there is planned as one micro-step, not refused */
    if (accum == 0)
        accum = global > 0 && global % (micro * world) == 0 ? global / (micro * world) : 1;
    const int half = strcmp(dt_model_info(m)->dtype, "fp32") != 0; /* bf16, fp16 */
    /* what this implementation keeps: compute params in the model dtype
     * (plus f32 masters for bf16 and fp16), f32 gradients, f32 optimizer
     * moments */
    const uint32_t moments = set->optimizer.type == DT_OPTIM_SGD ? 1 : 2;
    dt_estimate_args_t a = {.struct_size = sizeof a, .group_size = world,
                               .model = d, .param_bytes = half ? 2 : 4,
                               .grad_bytes = 4, .optim_bytes = 4 * moments + (half ? 4 : 0),
                               .n_micro = (uint32_t)accum, .act_bytes = act_bytes,
                               .offload = offload != 0};
    const dt_strategy_ops_t *ops = strat->ops;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    int rc = ops->estimate(strat->host, &a, out);
    if (rc)
        return dt_plugin_failed(strat, rc, "estimate");
    return DT_OK;
}

int dt_plan_strategy_offload(const dt_plugin_t *strat, dt_model_t *m, const dt_settings_t *set,
                             int world, int offload, dt_estimate_t *out)
{
    dt_model_act_t act;
    int rc = dt_model_plan_acts(m, set->train.micro_batch, set->train.seq_len, &act);
    if (rc)
        return rc;
    return estimate(strat, m, dt_model_desc(m), set, world, offload, act.total, out);
}

int dt_plan_stage_acts(dt_model_t *m, int64_t B, int64_t T, uint32_t n, const uint32_t *first,
                       const uint32_t *end, uint32_t slots, uint64_t *out)
{
    /* the model's stage and slots are set only around the count (a
     * planner's model has none; a training rank's are these already) */
    uint32_t was_first[DT_MODEL_MAX_CHUNKS], was_end[DT_MODEL_MAX_CHUNKS];
    const uint32_t was_n = dt_model_stages(m, was_first, was_end), was_slots = dt_model_slots(m);
    int rc = dt_model_set_stages(m, n, first, end);
    if (!rc)
        rc = dt_model_set_slots(m, slots);
    if (rc) {
        dt_model_set_stages(m, was_n, was_first, was_end);
        return rc;
    }
    dt_model_act_t act;
    rc = dt_model_act_bytes(m, B, T, NULL, &act);
    dt_model_set_slots(m, was_slots);
    dt_model_set_stages(m, was_n, was_first, was_end);
    *out = act.total;
    return rc;
}

int dt_plan_stage(const dt_plugin_t *strat, dt_model_t *m, const dt_settings_t *set, int world,
                  int offload, uint32_t n, const uint32_t *first, const uint32_t *end,
                  uint32_t slots, uint64_t boundary_bytes, dt_estimate_t *out)
{
    const dt_model_desc_t *d = dt_model_desc(m);
    const uint32_t nu = d->n_units;
    uint64_t acts = 0;
    int rc = dt_plan_stage_acts(m, set->train.micro_batch, set->train.seq_len, n, first, end,
                                slots, &acts);
    if (rc)
        return rc;
    dt_unit_desc_t *units = calloc(nu, sizeof *units);
    uint8_t *held = calloc(nu, 1);
    if (!units || !held) {
        free(units);
        free(held);
        return dt_err_set(DT_ERR_NOMEM, "plan: out of memory");
    }
    uint32_t tied[4];
    const uint32_t nt = dt_model_stage_tied(m, first[n - 1], end[n - 1], tied, 4);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t u = first[i]; u < end[i]; u++)
            held[u] = 1;
    for (uint32_t i = 0; i < nt && i < 4; i++)
        held[tied[i]] = 1;
    /* the stage's description: the units it does not hold emptied, as a
     * data strategy running the stage sees them (sdk/dp.h) */
    dt_model_desc_t sd = *d;
    sd.units = units;
    sd.numel = 0;
    for (uint32_t u = 0; u < nu; u++) {
        units[u] = d->units[u];
        if (!held[u]) {
            units[u].n_params = 0;
            units[u].params = NULL;
            units[u].numel = 0;
            units[u].act_bytes = 0;
        }
        sd.numel += units[u].numel;
    }
    rc = estimate(strat, m, &sd, set, world, offload, acts + boundary_bytes, out);
    free(units);
    free(held);
    return rc;
}

uint64_t dt_plan_tier_traffic(const dt_estimate_t *e)
{
    if (e->offload_bytes_per_step || !e->bytes[DT_TAG_OFFLOAD])
        return e->offload_bytes_per_step;
    return 2 * e->bytes[DT_TAG_OFFLOAD]; /* the strategy did not say */
}

uint64_t dt_plan_model_state(const dt_estimate_t *e)
{
    return e->bytes[DT_TAG_PARAMS] + e->bytes[DT_TAG_GRADS] + e->bytes[DT_TAG_OPTIMIZER];
}

uint64_t dt_plan_total(const dt_estimate_t *e)
{
    uint64_t total = 0;
    for (int t = 0; t < DT_TAG_COUNT; t++)
        total += t == DT_TAG_OFFLOAD ? 0 : e->bytes[t]; /* the tier's, not the device's */
    return total;
}

double dt_plan_comm_seconds(uint64_t sent, double gbps)
{
    return (double)sent * 8.0 / (gbps * 1e9);
}

const char *dt_plan_bytes(uint64_t b, char *buf, size_t cap)
{
    static const char *const unit[] = {"MiB", "GiB", "TiB"};
    double v = (double)b / (1024.0 * 1024.0);
    int u = 0;
    /* the next unit from where two decimals would print 1024.00 */
    while (u < 2 && v >= 1024.0 - 0.005) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.2f %s", v, unit[u]);
    return buf;
}

const char *dt_plan_seconds(double s, char *buf, size_t cap)
{
    if (s < 1.0 - 0.000005) /* never "1000.00 ms" */
        snprintf(buf, cap, "%.2f ms", s * 1e3);
    else
        snprintf(buf, cap, "%.2f s", s);
    return buf;
}
