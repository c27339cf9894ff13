/*
 * plugins/pipeline/pipeline_order.c - the order of a stage's forwards and
 * backwards in one step: GPipe, 1F1B (PipeDream-Flush) and their
 * interleaved forms over V chunks per stage (pipeline.h says how each
 * goes).  One list drives both the step (pipeline_schedule.c) and what
 * the stage tells the core it keeps (pp_order_in_flight), so the two
 * cannot disagree.
 */
#include <string.h>

#include "pipeline.h"

/* The k-th forward (backward: `bwd`) of a stage with V chunks: Megatron's
 * interleaved order, groups of p micro-batches through each chunk in turn
 * (the chunks reversed for backwards).  With V = 1: micro-batch k. */
static pp_op_t nth(uint32_t k, uint32_t V, int32_t p, int bwd)
{
    const uint32_t P = (uint32_t)p, group = k / (P * V), in_group = k % (P * V);
    uint32_t chunk = V == 1 ? 0 : in_group / P;
    if (bwd)
        chunk = V - 1 - chunk;
    const uint32_t micro = V == 1 ? k : group * P + in_group % P;
    return (pp_op_t){.kind = bwd ? PP_BWD : PP_FWD, .chunk = chunk, .micro = micro};
}

uint32_t pp_order(int schedule, uint32_t V, int32_t k, int32_t p, uint32_t m, int no_grad,
                  pp_op_t *out)
{
    const uint32_t N = m * V; /* forwards, and backwards, a step */
    uint32_t n = 0, f = 0, b = 0;
    if (no_grad || schedule == PP_SCHED_GPIPE) {
        while (f < N)
            out[n++] = nth(f++, V, p, 0);
        while (!no_grad && b < N)
            out[n++] = nth(b++, V, p, 1);
        return n;
    }
    /* 1F1B: warm-up forwards, then one forward one backward, then the
     * remaining backwards */
    uint32_t warm;
    if (V == 1)
        warm = (uint32_t)(p - k - 1);
    else if (m == (uint32_t)p)
        warm = N; /* Megatron: every forward first when m = p */
    else
        warm = (uint32_t)(p - k - 1) * 2 + (V - 1) * (uint32_t)p;
    if (warm > N)
        warm = N;
    while (f < warm)
        out[n++] = nth(f++, V, p, 0);
    while (f < N) {
        out[n++] = nth(f++, V, p, 0);
        out[n++] = nth(b++, V, p, 1);
    }
    while (b < N)
        out[n++] = nth(b++, V, p, 1);
    return n;
}

uint32_t pp_order_in_flight(const dt_host_v1_t *host, int schedule, uint32_t V, int32_t k,
                            int32_t p, uint32_t m)
{
    pp_op_t *ops = host->alloc(host, 2 * (size_t)m * V * sizeof *ops, DT_TAG_OTHER);
    if (!ops)
        return 0;
    const uint32_t n = pp_order(schedule, V, k, p, m, 0, ops);
    uint32_t now[PP_MAX_CHUNKS], most = 0;
    memset(now, 0, sizeof now);
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t c = ops[i].chunk;
        if (ops[i].kind == PP_FWD) {
            if (++now[c] > most)
                most = now[c];
        } else {
            now[c]--;
        }
    }
    host->free(host, ops);
    return most;
}
