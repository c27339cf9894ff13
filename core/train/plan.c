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
    return dt_plan_strategy_offload(strat, m, set, world,
                                    strcmp(set->parallel.offload, "none") != 0, out);
}

int dt_plan_strategy_offload(const dt_plugin_t *strat, dt_model_t *m, const dt_settings_t *set,
                             int world, int offload, dt_estimate_t *out)
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
    const int half = strcmp(mi->dtype, "fp32") != 0; /* bf16, fp16 */
    dt_model_act_t act;
    if ((rc = dt_model_plan_acts(m, micro, seq_len, &act)))
        return rc;
    /* what this implementation keeps: compute params in the model dtype
     * (plus f32 masters for bf16 and fp16), f32 gradients, f32 optimizer
     * moments */
    const uint32_t moments = set->optimizer.type == DT_OPTIM_SGD ? 1 : 2;
    dt_estimate_args_t a = {.struct_size = sizeof a, .group_size = world,
                               .model = dt_model_desc(m), .param_bytes = half ? 2 : 4,
                               .grad_bytes = 4, .optim_bytes = 4 * moments + (half ? 4 : 0),
                               .n_micro = (uint32_t)accum, .act_bytes = act.total,
                               .offload = offload != 0};
    const dt_strategy_ops_t *ops = strat->ops;
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    rc = ops->estimate(strat->host, &a, out);
    if (rc)
        return dt_plugin_failed(strat, rc, "estimate");
    return DT_OK;
}

uint64_t dt_plan_tier_traffic(const dt_estimate_t *e)
{
    if (e->offload_bytes_per_step || !e->bytes[DT_TAG_OFFLOAD])
        return e->offload_bytes_per_step;
    return 2 * e->bytes[DT_TAG_OFFLOAD]; /* a plugin before strategy ABI 1.2 */
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
