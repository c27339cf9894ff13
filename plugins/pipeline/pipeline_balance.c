/*
 * plugins/pipeline/pipeline_balance.c - which units each stage runs.
 *
 *   uniform  the same number of units per stage (the first n % p stages
 *            one more), as Megatron splits layers;
 *   params   contiguous stages whose largest parameter count is as small
 *            as it can be (the classic linear partition, solved exactly
 *            by dynamic programming: units are few);
 *   flops    the same partition of the units' FLOPs per token, the core's
 *            (dt_stage_args_v1_t.unit_flops): GPT-2's embedding costs
 *            nothing to run though it holds a third of the 124M
 *            parameters, and its head runs the tied LM head's matmul.
 */
#include <math.h>
#include <string.h>

#include "pipeline.h"

static void uniform(uint32_t n, int32_t p, uint32_t *out)
{
    uint32_t u = 0;
    for (int32_t k = 0; k < p; k++) {
        uint32_t take = n / (uint32_t)p + ((uint32_t)k < n % (uint32_t)p ? 1 : 0);
        for (uint32_t i = 0; i < take; i++)
            out[u++] = (uint32_t)k;
    }
}

/* The linear partition of weights w[n] into p contiguous stages whose
 * largest sum is least: best[k][j], the least possible largest stage over
 * units [0, j) in k + 1 stages; cut[k][j] where its last stage starts.
 * Weights are sums of whole numbers (parameters) or FLOPs below 2^53, so
 * the sums are exact. */
static int linear(const dt_host_v1_t *host, uint32_t n, const double *w, int32_t p,
                  uint32_t *out)
{
    const uint64_t cells = (uint64_t)p * (n + 1);
    double *pre = host->alloc(host, (n + 1) * sizeof *pre, DT_TAG_OTHER);
    double *best = host->alloc(host, cells * sizeof *best, DT_TAG_OTHER);
    uint32_t *cut = host->alloc(host, cells * sizeof *cut, DT_TAG_OTHER);
    if (!pre || !best || !cut) {
        host->free(host, pre);
        host->free(host, best);
        host->free(host, cut);
        return host->set_error(host, DT_ERR_NOMEM, "balance: %u units x %d stages", n, p);
    }
    pre[0] = 0;
    for (uint32_t u = 0; u < n; u++)
        pre[u + 1] = pre[u] + w[u];
#define AT(k, j) ((uint64_t)(k) * (n + 1) + (j))
    for (uint32_t j = 1; j <= n; j++) {
        best[AT(0, j)] = pre[j];
        cut[AT(0, j)] = 0;
    }
    for (int32_t k = 1; k < p; k++)
        for (uint32_t j = (uint32_t)k + 1; j <= n; j++) {
            best[AT(k, j)] = HUGE_VAL;
            for (uint32_t i = (uint32_t)k; i < j; i++) { /* last stage [i, j) */
                double a = best[AT(k - 1, i)], b = pre[j] - pre[i];
                double m = a > b ? a : b;
                if (m < best[AT(k, j)]) {
                    best[AT(k, j)] = m;
                    cut[AT(k, j)] = i;
                }
            }
        }
    uint32_t j = n;
    for (int32_t k = p - 1; k >= 0; k--) {
        uint32_t i = k > 0 ? cut[AT(k, j)] : 0;
        for (uint32_t u = i; u < j; u++)
            out[u] = (uint32_t)k;
        j = i;
    }
#undef AT
    host->free(host, pre);
    host->free(host, best);
    host->free(host, cut);
    return DT_OK;
}

int pp_assign(const dt_host_v1_t *host, const dt_model_desc_v1_t *model, int32_t n_stages,
              int policy, const double *unit_flops, uint32_t *out)
{
    const uint32_t n = model->n_units;
    if (n_stages < 1 || (uint32_t)n_stages > n)
        return host->set_error(host, DT_ERR_CONFIG,
                               "parallel.pipeline = %d stages, but model %s has %u units (each "
                               "stage needs at least one)",
                               n_stages, model->arch ? model->arch : "?", n);
    if (policy == DT_BALANCE_UNIFORM) {
        uniform(n, n_stages, out);
        return DT_OK;
    }
    if (policy == DT_BALANCE_FLOPS) {
        if (!unit_flops)
            return host->set_error(host, DT_ERR_CONFIG,
                                   "balance = \"flops\": the core gives no unit FLOPs; "
                                   "use \"params\"");
        return linear(host, n, unit_flops, n_stages, out);
    }
    double *w = host->alloc(host, (n ? n : 1) * sizeof *w, DT_TAG_OTHER);
    if (!w)
        return host->set_error(host, DT_ERR_NOMEM, "balance: %u units", n);
    for (uint32_t u = 0; u < n; u++)
        w[u] = (double)model->units[u].numel;
    int rc = linear(host, n, w, n_stages, out);
    host->free(host, w);
    return rc;
}
