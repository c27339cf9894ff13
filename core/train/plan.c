/*
 * core/train/plan.c - assembling a strategy's estimate arguments from the
 * typed settings and the model.
 */
#include "train/plan.h"

#include <stdio.h>
#include <string.h>

#include "util/error.h"

int dt_plan_strategy(const dt_plugin_t *strat, dt_model_t *m, const dt_settings_t *set,
                     int world, dt_estimate_t *out)
{
    const int64_t micro = set->train.micro_batch, seq_len = set->train.seq_len,
                  global = set->train.global_batch;
    int64_t accum = set->train.grad_accum;
    int rc;
    /* not dt_batch_resolve: a plan for another world size than the config's
     * batch was written for is the point of planning, so a global batch
     * that does not divide there is planned as one micro-step, not refused */
    if (accum == 0)
        accum = global > 0 && global % (micro * world) == 0 ? global / (micro * world) : 1;
    const dt_model_info_t *mi = dt_model_info(m);
    const int bf16 = strcmp(mi->dtype, "bf16") == 0;
    dt_model_act_t act;
    if ((rc = dt_model_plan_acts(m, micro, seq_len, &act)))
        return rc;
    /* what this implementation keeps: compute params in the model dtype
     * (plus f32 masters for bf16), f32 gradients, f32 optimizer moments */
    const uint32_t moments = set->optimizer.type == DT_OPTIM_SGD ? 1 : 2;
    dt_estimate_args_t a = {.struct_size = sizeof a, .group_size = world,
                               .model = dt_model_desc(m), .param_bytes = bf16 ? 2 : 4,
                               .grad_bytes = 4, .optim_bytes = 4 * moments + (bf16 ? 4 : 0),
                               .n_micro = (uint32_t)accum, .act_bytes = act.total,
                               .offload = strcmp(set->parallel.offload, "none") != 0};
    const dt_strategy_ops_t *ops = strat->ops;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    rc = ops->estimate(strat->host, &a, out);
    if (rc)
        return dt_plugin_failed(strat, rc, "estimate");
    return DT_OK;
}

uint64_t dt_plan_model_state(const dt_estimate_t *e)
{
    return e->bytes[DT_TAG_PARAMS] + e->bytes[DT_TAG_GRADS] + e->bytes[DT_TAG_OPTIMIZER];
}

const char *dt_plan_bytes(uint64_t b, char *buf, size_t cap)
{
    const double mib = 1024.0 * 1024.0, gib = mib * 1024.0;
    if ((double)b >= gib)
        snprintf(buf, cap, "%.2f GiB", (double)b / gib);
    else
        snprintf(buf, cap, "%.2f MiB", (double)b / mib);
    return buf;
}
