/*
 * plugins/pipeline/pipeline_balance.c - which units each stage runs.
 *
 *   uniform  the same number of units per stage (the first n % p stages
 *            one more), as Megatron splits layers;
 *   params   contiguous stages whose largest parameter count is as small
 *            as it can be (the classic linear partition, solved exactly
 *            by dynamic programming: units are few).
 */
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

/* best[k][j]: the least possible largest stage over units [0, j) in k + 1
 * stages; cut[k][j] where its last stage starts. */
static int by_params(const dt_host_v1_t *host, const dt_model_desc_v1_t *m, int32_t p,
                     uint32_t *out)
{
    const uint32_t n = m->n_units;
    const uint64_t cells = (uint64_t)p * (n + 1);
    uint64_t *pre = host->alloc(host, (n + 1) * sizeof *pre, DT_TAG_OTHER);
    uint64_t *best = host->alloc(host, cells * sizeof *best, DT_TAG_OTHER);
    uint32_t *cut = host->alloc(host, cells * sizeof *cut, DT_TAG_OTHER);
    if (!pre || !best || !cut) {
        host->free(host, pre);
        host->free(host, best);
        host->free(host, cut);
        return host->set_error(host, DT_ERR_NOMEM, "balance: %u units x %d stages", n, p);
    }
    pre[0] = 0;
    for (uint32_t u = 0; u < n; u++)
        pre[u + 1] = pre[u] + m->units[u].numel;
#define AT(k, j) ((uint64_t)(k) * (n + 1) + (j))
    for (uint32_t j = 1; j <= n; j++) {
        best[AT(0, j)] = pre[j];
        cut[AT(0, j)] = 0;
    }
    for (int32_t k = 1; k < p; k++)
        for (uint32_t j = (uint32_t)k + 1; j <= n; j++) {
            best[AT(k, j)] = UINT64_MAX;
            for (uint32_t i = (uint32_t)k; i < j; i++) { /* last stage [i, j) */
                uint64_t a = best[AT(k - 1, i)], b = pre[j] - pre[i];
                uint64_t w = a > b ? a : b;
                if (w < best[AT(k, j)]) {
                    best[AT(k, j)] = w;
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
              int policy, uint32_t *out)
{
    if (n_stages < 1 || (uint32_t)n_stages > model->n_units)
        return host->set_error(host, DT_ERR_CONFIG,
                               "parallel.pipeline = %d stages, but model %s has %u units (each "
                               "stage needs at least one)",
                               n_stages, model->arch ? model->arch : "?", model->n_units);
    if (policy == PP_BALANCE_PARAMS)
        return by_params(host, model, n_stages, out);
    uniform(model->n_units, n_stages, out);
    return DT_OK;
}
