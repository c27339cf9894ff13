/*
 * plugins/pipeline/pipeline.h - what the shipped pipeline schedules share
 * (a static, hidden library linked into the `gpipe` and `1f1b` schedule
 * plugins): the instance and its four parts: the glue every schedule
 * plugin's table points at (pipeline_glue.c: init, finalize,
 * assign_stages, run; PP_SCHEDULE_PLUGIN), the balance policies
 * (pipeline_balance.c: units -> stages), the order of a stage's operations
 * (pipeline_order.c: GPipe, 1F1B, interleaved) and running them
 * (pipeline_schedule.c: the runner, send and recv).
 *
 * How a pipeline runs (schedule.h is the ABI): the core splits the world
 * into the grid's groups (core/train/grid.h), asks assign_stages which
 * units each stage runs, initialises the schedule over the pipeline group
 * and the data strategy (ddp) over the data group holding only its
 * stage's units, and each step calls run, which drives the core's stage
 * runner (core/train/stage_runner.c).
 *
 * Schedules, with p stages and m micro-batches ([train] grad_accum), F and
 * B a micro-batch's forward and backward on this stage:
 *   gpipe  every F, then every B (in micro-batch order).  A stage stashes
 *          all m inputs.  Bubble (p - 1) / (m + p - 1).
 *   1f1b   p - stage - 1 warm-up Fs, then F and B alternating, then the
 *          remaining Bs (PipeDream-Flush, Megatron's default).  A stage
 *          stashes at most p - stage inputs; same bubble as GPipe.
 * Interleaved ([pipeline] virtual_stages = V > 1: Megatron's interleaved
 * 1F1B with the `1f1b` plugin, interleaved GPipe with `gpipe`): the units
 * are cut into p x V virtual stages, stage k running virtual stages k,
 * k + p, ... as its chunks 0..V-1.  Every stage runs
 * the forwards in one order, the k-th being micro-batch
 * (k / (p V)) p + k % p of chunk (k / p) % V (groups of p micro-batches
 * through each chunk in turn), and the backwards in the same order over
 * the chunks reversed; 1F1B warms up with (p - stage - 1) x 2 + (V - 1) p
 * forwards (all when m = p), then alternates.  The bubble shrinks to
 * (p - 1) / (V m + p - 1); m must be a multiple of p.  Activations and
 * their gradients travel on two groups of their own (split from the
 * pipeline group), so each pair of ranks carries one kind of tensor per
 * group, sent and received in the same order on both sides.
 *
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
 * stage computes while its output travels.  An operation's output is
 * sent as the next operation starts, together with that one's input in
 * one sendrecv when both go to and come from the same neighbour on the
 * same group (1F1B's steady state), so that two stages that each send
 * first cannot deadlock on a communicator whose sends wait for their
 * receiver (nccl); interleaved schedules move activations and gradients
 * on two groups, which one sendrecv cannot join, and still exchange them
 * one after the other (--strict-device stops them).  Every wait is
 * bounded by the group's timeout; a failure is logged naming the peer
 * stage, the operation and the micro-batch, with the communicator's own
 * message (the peer rank) kept as the error.
 */
#ifndef DT_PLUGIN_PIPELINE_H
#define DT_PLUGIN_PIPELINE_H

#include "dtrain/dtrain.h"

enum { PP_SCHED_GPIPE = 0, PP_SCHED_1F1B = 1 };
#define PP_MAX_CHUNKS 16 /* the core's DT_MODEL_MAX_CHUNKS */

/* A device buffer of one boundary tensor and the send still reading it. */
typedef struct pp_buf {
    void *p;
    dt_comm_req_t *send; /* NULL: free to reuse */
    dt_comm_t *comm;     /* the group it travels on */
    uint32_t from, peer; /* the virtual stages it goes from and to */
    uint32_t micro;      /* and its micro-batch, for messages */
    int grad;            /* 1: a gradient (to the previous stage) */
} pp_buf_t;

/* One operation of a stage's step: the forward or backward of a
 * micro-batch through one of its chunks. */
enum { PP_FWD = 0, PP_BWD = 1 };
typedef struct pp_op {
    uint8_t kind;    /* PP_FWD / PP_BWD */
    uint32_t chunk, micro;
} pp_op_t;

/* pipeline_order.c: stage k's operations for one step (forwards only with
 * `no_grad`) into out (2 m V entries): their count. */
uint32_t pp_order(int schedule, uint32_t V, int32_t k, int32_t p, uint32_t m, int no_grad,
                  pp_op_t *out);
/* The most micro-batches any one chunk of stage k has in flight (forward
 * run, backward not yet) in that order: host memory for the order through
 * `host`; 0 when it cannot be had. */
uint32_t pp_order_in_flight(const dt_host_v1_t *host, int schedule, uint32_t V, int32_t k,
                            int32_t p, uint32_t m);

struct dt_schedule {
    const dt_schedule_ops_v1_t *ops; /* first: the table that made it (dtrain/schedule.h) */
    const dt_host_v1_t *host;
    dt_device_t *dev;
    dt_stream_t *cs;            /* the core's compute stream */
    dt_comm_t *comm;            /* the pipeline group: rank = stage */
    dt_comm_t *grad_comm;       /* interleaved: activations on `comm`'s
                                 * split copy act_comm, their gradients on
                                 * this one (NULL: both on `comm`) */
    dt_comm_t *act_comm;
    uint32_t V;                 /* [pipeline] virtual_stages: chunks */
    int32_t stage, n_stages;
    uint32_t n_micro;
    int schedule;               /* PP_SCHED_* */
    int keep;                   /* [pipeline] keep_activations */
    /* buffers, (re)made when act_count, n_micro or what the core keeps
     * changes; chunk c's are [c x n, (c + 1) x n) of each array */
    uint64_t act_bytes;
    int buf_keep;               /* the `keep` they were made for */
    uint32_t buf_micro;         /* and the micro-batches */
    uint32_t n_stash;           /* inputs stashed per receiving chunk */
    pp_buf_t *stash;            /* (V x n_stash) chunk inputs, by micro % n_stash */
    uint32_t n_ring;            /* sends in flight per chunk and direction */
    pp_buf_t *out;              /* (V x n_ring) outputs on their way on */
    pp_buf_t *din;              /* (V x n_ring) input gradients on their way back */
    pp_buf_t *dout;             /* (V) the output gradient received */
    pp_op_t *order;             /* the step's order (room for order_cap) */
    uint32_t order_cap;
    uint32_t most, most_micro;  /* pp_order_in_flight for most_micro
                                 * micro-batches (0: not yet asked) */
};

/* The sends in flight per chunk and direction: 2, each waited for before
 * its buffer is reused; interleaved one per micro-batch, none reused
 * within a step (a send completes only as its receiver takes it, and with
 * chunks that receiver may first wait on this stage's other chunk). */
static inline uint32_t pp_ring(uint32_t V, uint32_t m) { return V == 1 ? 2 : m; }

/* pipeline_schedule.c: the boundary tensors stage k allocates, stashing
 * n_stash inputs a receiving chunk: a receiving chunk's stash and input
 * gradients in flight, a sending chunk's outputs in flight and its
 * received output gradient. */
uint32_t pp_buffers(uint32_t V, int32_t k, int32_t p, uint32_t m, uint32_t n_stash);

/* The stage inputs one chunk of stage k stashes at once: with `keep` one
 * receive buffer (the kept activations hold each input); else one per
 * micro-batch in flight (`in_flight`), for the recomputes.  Chunk 0 of
 * stage 0 reads tokens and stashes none. */
static inline uint32_t pp_stash(int keep, uint32_t in_flight) { return keep ? 1 : in_flight; }

/* pipeline_balance.c: out[u] = the stage of unit u (never decreasing,
 * every stage non-empty) for `policy`; DT_ERR_CONFIG through host when
 * there are fewer units than stages. */
int pp_assign(const dt_host_v1_t *host, const dt_model_desc_v1_t *model, int32_t n_stages,
              int policy, const double *unit_flops, uint32_t *out);

/* pipeline_schedule.c: one step (schedule.h run). */
int pp_run(dt_schedule_t *s, const dt_schedule_args_v1_t *args, dt_schedule_result_v1_t *res);
/* Wait for (timeout 0: drop) every send in flight; frees the buffers. */
void pp_free_buffers(dt_schedule_t *s);

/* pipeline_glue.c: the schedule table's slots for the order `schedule`
 * (PP_SCHED_*); `ops`, the plugin's table, is the instance's first member. */
int pp_init(const dt_host_v1_t *host, const dt_schedule_ops_v1_t *ops, int schedule,
            const dt_schedule_init_v1_t *args, dt_schedule_t **out);
void pp_finalize(dt_schedule_t *s);
int pp_assign_stages(const dt_host_v1_t *host, int schedule, const dt_stage_args_v1_t *args,
                     uint32_t *out);

/* A schedule plugin of the order SCHED (GPIPE, 1F1B) named `name_`: its
 * table and entry, every slot the shared glue's.  `id` is a C name. */
#define PP_SCHEDULE_PLUGIN(id, SCHED, name_, summary_)                                        \
    static const dt_schedule_ops_v1_t id##_ops;                                                \
    static int id##_init(const dt_host_v1_t *host, const dt_schedule_init_v1_t *args,         \
                         dt_schedule_t **out)                                                 \
    {                                                                                          \
        return pp_init(host, &id##_ops, PP_SCHED_##SCHED, args, out);                          \
    }                                                                                          \
    static int id##_assign_stages(const dt_host_v1_t *host, const dt_stage_args_v1_t *args,   \
                                  uint32_t *out)                                               \
    {                                                                                          \
        return pp_assign_stages(host, PP_SCHED_##SCHED, args, out);                           \
    }                                                                                          \
    static const dt_schedule_ops_v1_t id##_ops = {                                             \
        .info = DT_PLUGIN_INFO_NOKEYS(SCHEDULE, dt_schedule_ops_v1_t, name_, "1.0.0",          \
                                      summary_),                                               \
        .init = id##_init,                                                                     \
        .finalize = pp_finalize,                                                               \
        .assign_stages = id##_assign_stages,                                                   \
        .run = pp_run,                                                                         \
    };                                                                                         \
    DT_PLUGIN_ENTRY(schedule, 1, dt_schedule_ops_v1_t, &id##_ops)

#endif /* DT_PLUGIN_PIPELINE_H */
