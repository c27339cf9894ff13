/*
 * plugins/pipeline/pipeline.h - the `pipeline` strategy's instance and its
 * three parts: the plugin glue (pipeline.c: config, init, the ops table),
 * the balance policies (pipeline_balance.c: units -> stages) and the
 * schedules (pipeline_schedule.c: GPipe, 1F1B).
 *
 * How a pipeline runs (strategy.h, "Pipeline parallelism", is the ABI):
 * the core splits the world into the grid's groups (core/train/grid.h),
 * asks assign_stages which units each stage runs, initialises this
 * strategy over the pipeline group and the data strategy (ddp) over the
 * data group holding only its stage's units, and each step calls
 * run_schedule, which drives the core's stage runner.
 *
 * Schedules, with p stages and m micro-batches ([train] grad_accum), F and
 * B a micro-batch's forward and backward on this stage:
 *   gpipe  every F, then every B (in micro-batch order).  A stage stashes
 *          all m inputs.  Bubble (p - 1) / (m + p - 1).
 *   1f1b   p - stage - 1 warm-up Fs, then F and B alternating, then the
 *          remaining Bs (PipeDream-Flush, Megatron's default).  A stage
 *          stashes at most p - stage inputs; same bubble as GPipe.
 * Activations: with [pipeline] keep_activations (the default) the core
 * keeps those of every micro-batch in flight (assign_stages' in_flight,
 * pp_in_flight), each backward runs on its own forward's, and a stage
 * needs one receive buffer for its inputs.  Without, the core keeps one
 * micro-batch's and recomputes a stage's forward from its input before
 * that micro-batch's backward unless it was the last forward the stage
 * ran (so 1F1B's last stage never recomputes, and the others do a third
 * more work: unbalanced stages), and the stage inputs are stashed.
 *
 * Transfers: the boundary tensor of micro-batch i goes from stage s to
 * s + 1 with tag 2i, its gradient back with tag 2i + 1, each started on
 * the compute stream with an asynchronous request; a send is waited for
 * only when its buffer is needed again or at the end of the step, so a
 * stage computes while its output travels.  Every wait is bounded by the
 * group's timeout; a failure is logged naming the peer stage, the
 * operation and the micro-batch, with the communicator's own message
 * (the peer rank) kept as the error.
 */
#ifndef DT_PLUGIN_PIPELINE_H
#define DT_PLUGIN_PIPELINE_H

#include "dtrain/dtrain.h"

enum { PP_SCHED_GPIPE = 0, PP_SCHED_1F1B = 1 };
enum { PP_BALANCE_UNIFORM = 0, PP_BALANCE_PARAMS = 1 };

#define PP_SCHEDULES "gpipe|1f1b"
#define PP_BALANCES "uniform|params"

/* A device buffer of one boundary tensor and the send still reading it. */
typedef struct pp_buf {
    void *p;
    dt_comm_req_t *send; /* NULL: free to reuse */
    int32_t peer;        /* the stage it goes to */
    uint32_t micro;      /* and its micro-batch, for messages */
    int grad;            /* 1: a gradient (to stage - 1) */
} pp_buf_t;

struct dt_strategy {
    const dt_host_v1_t *host;
    const dt_device_ops_v1_t *dev_ops;
    dt_device_t *dev;
    dt_stream_t *cs;            /* the core's compute stream */
    const dt_comm_ops_v1_t *comm_ops;
    dt_comm_t *comm;            /* the pipeline group: rank = stage */
    int32_t stage, n_stages;
    uint32_t n_micro;
    int schedule;               /* PP_SCHED_* */
    int keep;                   /* [pipeline] keep_activations */
    /* buffers, (re)made when act_count or n_micro grows */
    uint64_t act_bytes;
    uint32_t n_stash;
    pp_buf_t *stash;            /* (n_stash) stage inputs, by micro % n_stash */
    pp_buf_t out[2];            /* outputs on their way to stage + 1 */
    pp_buf_t din[2];            /* input gradients on their way to stage - 1 */
    pp_buf_t dout;              /* the output gradient received */
};

/* The most micro-batches stage `k` of `p` has in flight (forward run,
 * backward not yet) for `m` micro-batches: GPipe all m, 1F1B p - k. */
static inline uint32_t pp_max_in_flight(int schedule, int32_t k, int32_t p, uint32_t m)
{
    uint32_t inflight = (uint32_t)(p - k);
    return schedule == PP_SCHED_GPIPE || m < inflight ? m : inflight;
}

/* The micro-batches whose activations the core keeps on stage k: those in
 * flight with `keep`, else one (the others' forwards are recomputed). */
static inline uint32_t pp_in_flight(int schedule, int keep, int32_t k, int32_t p, uint32_t m)
{
    return keep ? pp_max_in_flight(schedule, k, p, m) : 1;
}

/* The stage inputs stage k stashes at once: none on the first stage (it
 * reads tokens); with `keep` one receive buffer (the kept activations
 * hold each input); else one per micro-batch in flight, for the
 * recomputes. */
static inline uint32_t pp_stash(int schedule, int keep, int32_t k, int32_t p, uint32_t m)
{
    return k == 0 ? 0 : keep ? 1 : pp_max_in_flight(schedule, k, p, m);
}

/* pipeline_balance.c: out[u] = the stage of unit u (never decreasing,
 * every stage non-empty) for `policy`; DT_ERR_CONFIG through host when
 * there are fewer units than stages. */
int pp_assign(const dt_host_v1_t *host, const dt_model_desc_v1_t *model, int32_t n_stages,
              int policy, uint32_t *out);

/* pipeline_schedule.c: one step (strategy.h run_schedule). */
int pp_run(dt_strategy_t *s, const dt_schedule_args_v1_t *args, dt_schedule_result_v1_t *res);
/* Wait for (timeout 0: drop) every send in flight; frees the buffers. */
void pp_free_buffers(dt_strategy_t *s);

#endif /* DT_PLUGIN_PIPELINE_H */
