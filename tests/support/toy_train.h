/*
 * tests/support/toy_train.h - train the toy model (toy_model.h) with a
 * data-parallel strategy plugin in forked ranks over a real communicator,
 * and check the result against the float64 reference.
 *
 * Each rank opens the device and the communicator of the backend the test
 * runs on (dt_toy_backend_select: cpu + shm, or cuda + nccl), initialises the
 * strategy from the config values `kv`, loads the initial state through
 * its HELD ranges (as the core does), trains `steps` steps of n_micro
 * micro-steps, and reports through shared memory: losses, norms, every
 * state element it holds, its SAVE ranges and the device's memory by tag.
 *
 *     dt_toy_run_t *run = dt_toy_run_alloc();   // shared with the ranks
 *     *run = (dt_toy_run_t){.S = zero, .D = cpu, .C = shm, .kv = kv, ...};
 *     dt_toy_run(run, 3);                        // forks, fails the test
 *     dt_toy_check(run, 3, &tol);                // against the reference
 */
#ifndef DT_TOY_TRAIN_H
#define DT_TOY_TRAIN_H

#include "dtrain/dtrain.h"
#include "test_host.h"
#include "toy_model.h"

#define DT_TOY_MAX_RANKS 4
#define DT_TOY_MAX_STEPS 4

typedef struct dt_toy_rank {
    int rc;                      /* the strategy's init status */
    char msg[512];               /* its message when rc != DT_OK */
    double loss[DT_TOY_MAX_STEPS][DT_TOY_MAX_MICRO];
    double norm[DT_TOY_MAX_STEPS];
    int nonfinite[DT_TOY_MAX_STEPS];
    /* state this rank holds after training, by kind; held[][][] marks it */
    float state[DT_STATE_COUNT][DT_TOY_NU][DT_TOY_MAXN];
    uint8_t held[DT_STATE_COUNT][DT_TOY_NU][DT_TOY_MAXN];
    dt_range_t save[DT_STATE_COUNT][DT_TOY_NU];
    uint32_t n_save[DT_STATE_COUNT][DT_TOY_NU];
    dt_mem_stats_t mem;          /* the strategy's on the device, after the last
                                  * step (dt_toy_env_mem) */
} dt_toy_rank_t;

typedef struct dt_toy_run {
    /* in */
    const dt_strategy_ops_v1_t *S;
    const char *prefix;          /* "strategy/zero": the host's error prefix */
    const dt_device_ops_v1_t *D; /* the backend's device (dt_toy_setup) */
    const dt_comm_ops_v1_t *C;   /* the backend's communicator */
    const dt_test_kv_t *kv;      /* the strategy's config */
    int param_dtype;             /* DT_F32 or DT_BF16 */
    int optim;                   /* DT_OPTIM_* */
    uint32_t n_micro;
    int steps;
    float lr;
    float clip[DT_TOY_MAX_STEPS];
    int eval_first;              /* a no-grad forward before training */
    int64_t timeout_ms;          /* the communicator's bound on waits; 0: 20 s */
    /* out */
    dt_toy_rank_t rank[DT_TOY_MAX_RANKS];
} dt_toy_run_t;

/* One rank's open device, communicator and strategy (run->S from
 * run->kv), for tests that drive a strategy by hand inside their own
 * forked ranks (dt_mp_run_ranks). */
typedef struct dt_toy_env {
    dt_test_host_t th_dev, th_comm, th_s;
    dt_device_t *dev;
    dt_stream_t *cs;
    dt_toy_dev_t dd;    /* {run->D, dev, cs}: host access to the strategy's buffers */
    dt_comm_t *comm;
    dt_mem_stats_t base; /* the device's memory once the communicator is open,
                          * before the strategy: what the comm holds itself
                          * (shm none; nccl its barrier word, DT_TAG_COMM) */
    dt_model_desc_v1_t model;
    dt_optim_desc_v1_t optim;
    dt_strategy_t *s;   /* NULL when init failed */
} dt_toy_env_t;

/* Open rank `rank` of `size` (job id `job`); returns the strategy init's
 * status (device and comm failures fail the rank). */
int dt_toy_env_open(dt_toy_env_t *env, const dt_toy_run_t *run, int rank, int size,
                    const char *job);
/* The device's memory by tag now, less env->base: what the strategy
 * holds (current and peak; on cpu + shm exactly the device's). */
void dt_toy_env_mem(const dt_toy_env_t *env, const dt_toy_run_t *run, dt_mem_stats_t *out);
/* Finalize what dt_toy_env_open opened. */
void dt_toy_env_close(dt_toy_env_t *env, const dt_toy_run_t *run);
/* Load the initial state through HELD ranges, as the core's fresh start
 * does (parameters dt_toy_pval, moments zero), then state_loaded. */
void dt_toy_env_load(dt_toy_env_t *env, const dt_toy_run_t *run);

/* The backend a strategy test runs on, picked by its argv:
 *   (none) or "cpu": the cpu device (threads = 1) and the shm communicator;
 *   "cuda": the cuda device (deterministic = true) and the nccl
 *           communicator, one GPU per forked rank (device_index -1: the
 *           rank's local rank).
 * Returns -1 to go on and run the tests, or the code main should exit
 * with: DT_TEST_SKIP_CODE (ctest: skipped) after printing "SKIPPED: no
 * CUDA device: <CUDA error string>" or "SKIPPED: <test> needs <n> CUDA
 * devices (one per rank), found <m>" when `max_ranks` (the most ranks any
 * of the program's cases forks) exceeds the GPUs; 2 after a usage line.
 * The CUDA probe runs in a forked child, so the parent never initialises
 * CUDA (a CUDA context does not survive fork into the ranks). */
int dt_toy_backend_select(int argc, char **argv, int max_ranks);
/* "cpu" or "cuda", and "shm" or "nccl": the picked backend's plugins. */
const char *dt_toy_backend_device(void);
const char *dt_toy_backend_comm(void);
/* "cpu + shm" or "cuda + nccl": a cmocka group name. */
const char *dt_toy_backend_label(void);
/* The config and error prefix ("device/cpu") for a rank's device and
 * communicator of the picked backend. */
const dt_test_kv_t *dt_toy_backend_device_kv(void);
const dt_test_kv_t *dt_toy_backend_comm_kv(void);
const char *dt_toy_backend_device_prefix(void);
const char *dt_toy_backend_comm_prefix(void);

/* A zeroed run in memory shared with forked ranks. */
dt_toy_run_t *dt_toy_run_alloc(void);

/* A strategy test's group setup: forked ranks leak-check under ASan, the
 * picked backend's device (*D) and communicator (*C) loaded from `plugin_dir`
 * (the test's DT_TEST_PLUGIN_DIR), and `n_runs` runs from
 * dt_toy_run_alloc into runs[].  0, or -1 with the reason on stderr. */
int dt_toy_setup(const char *plugin_dir, const dt_device_ops_v1_t **D,
                 const dt_comm_ops_v1_t **C, dt_toy_run_t **runs, int n_runs);

/* The strategy tests' standard training (designated initializers of a
 * dt_toy_run_t): two micro-steps, three steps at lr 1e-2, clipped in the
 * first (0.5) and the third (1.0). */
#define DT_TOY_RUN_STANDARD .n_micro = 2, .steps = 3, .lr = 1e-2f, .clip = {0.5f, 100.0f, 1.0f}

/* Fork `size` ranks that train as `run` says (outputs cleared first).
 * Fails the calling cmocka test when a rank fails, except that a rank
 * whose strategy init fails records rc/msg and exits cleanly (config
 * error tests read them). */
void dt_toy_run(dt_toy_run_t *run, int size);

/* Tolerances of dt_toy_check (relative + absolute). */
typedef struct dt_toy_tol {
    double p_rel, p_abs;         /* parameters */
    double mom_rel;              /* optimizer moments (+ 1e-9 absolute) */
    double norm_rel, loss_rel;
    double loss_abs;             /* added to loss_rel * |loss| */
} dt_toy_tol_t;

/* f32 throughout: gradients differ from the float64 reference by f32
 * accumulation and reduction order (~1e-7 relative); after three AdamW
 * steps parameters agree to rel 2e-5 + abs 1e-6, norms and losses to
 * 1e-5 / 1e-6 relative. */
extern const dt_toy_tol_t dt_toy_tol_f32;
/* bf16 compute parameters (f32 master shards): the loss and gradients see
 * parameters rounded to bf16 (relative 2^-9).  The loss sums ~140 terms
 * a p with sum |a p| < 5, so it moves by at most 5 x 2^-9 ~ 1e-2; a
 * gradient element's C p term by 1e-2 x 2^-9 ~ 2e-5, up to 2e-3 of
 * |g| >= 0.01: norms agree to 1e-3, moments (m ~ g, v ~ g^2) to 5e-3
 * relative, parameters after three steps to 3e-4 (lr 1e-2 x a few % of
 * AdamW's unit-sized step). */
extern const dt_toy_tol_t dt_toy_tol_bf16;
/* f32 parameters, gradients reduced in 16 bits (reduce_dtype): each
 * rank's gradient is rounded once on the way in and the f32 sum once on
 * the way out, so an element is off by at most two unit roundoffs u
 * (bf16 2^-9, fp16 2^-12) relative: norms to 2.5u; moments (m ~ g,
 * v ~ g^2) to 5u relative; AdamW's unit-sized step lr m / sqrt(v) to ~4u
 * relative, over three steps at lr 1e-2 parameters to 1.2e-1 u absolute;
 * the loss moves by at most sum |a dp| < 5 dp.  Gradient elements below
 * fp16's smallest normal (6e-5) lose relative precision: the absolute
 * terms cover them. */
extern const dt_toy_tol_t dt_toy_tol_reduce_bf16, dt_toy_tol_reduce_f16;

/* Check a finished run of `size` ranks (fails the cmocka test):
 *  - every rank's init succeeded; losses and norms match the reference;
 *  - HELD ranges together cover every element of every unit, ranks
 *    holding the same element hold the same bits, and params and exp_avg
 *    (and exp_avg_sq for AdamW) match the reference;
 *  - SAVE ranges lie inside HELD ones and partition each unit exactly once. */
void dt_toy_check(const dt_toy_run_t *run, int size, const dt_toy_tol_t *tol);

/* Planner arguments for the toy model at `size` ranks as the engine runs
 * it: param_bytes by dtype, grad_bytes 4 (f32 gradients), optim_bytes the
 * optimizer's f32 states plus the f32 master when params are bf16. */
dt_estimate_args_v1_t dt_toy_est_args(const dt_model_desc_v1_t *m, int size, int param_dtype,
                                      int optim, uint32_t n_micro);

/* run->S's estimate for the run's config (run->kv) equals what the
 * strategy held on every rank's device after training (dt_toy_env_mem:
 * the communicator's own memory left out) (fails the cmocka test): params,
 * grads, optimizer and other exactly; the comm peak within 5%; no comm
 * buffer left. */
void dt_toy_check_estimate(const dt_toy_run_t *run, int size);

/* Tracing: replace run->S with an ops table that forwards to it and
 * run->C with the comm interposer over it (core/interpose/interpose.h),
 * both appending, per rank, a token for every hook and every collective
 * started to a trace the parent reads after dt_toy_run:
 *   L state_loaded, T begin_step, S step,
 *   F<u> / f<u> pre / post_forward, B<u> / b<u> pre / post_backward
 *   (b<u>! with last_use), AG<n>/<g> all_gather of n elements per rank
 *   in a group of g, RS<n>/<g> reduce_scatter (n per rank), AR<n>/<g>
 *   all_reduce; tokens separated by one space.  A hook's token comes
 *   before the collectives it starts. */
void dt_toy_trace_wrap(dt_toy_run_t *run);
/* Rank `rank`'s trace of the last dt_toy_run ("" when not traced). */
const char *dt_toy_trace(int rank);
/* Trace one step of `n_micro` micro-steps at `size` ranks (the rest of
 * `run` as set up), check it with dt_toy_tol_f32; rank 0's trace. */
const char *dt_toy_trace_run(dt_toy_run_t *run, int size, uint32_t n_micro);

/* Train as `run` says at `size` ranks, check the result with `tol` and
 * the estimate against the device (dt_toy_check, dt_toy_check_estimate). */
void dt_toy_train_check(dt_toy_run_t *run, int size, const dt_toy_tol_t *tol);

/* Elements of each state kind this rank holds (from held[][][]). */
uint64_t dt_toy_held_count(const dt_toy_rank_t *r, int kind);

#endif /* DT_TOY_TRAIN_H */
