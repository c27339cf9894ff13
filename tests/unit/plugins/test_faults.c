/*
 * tests/unit/plugins/test_faults.c - a collective failing mid-step under ddp and
 * the shard engine (zero stages 1-3, fsdp): every rank stops with an error
 * naming the collective, the failing rank and the step, within the
 * communicator's timeout, and finalize frees everything.
 *
 * Device-parametrized: `test_faults [cpu|cuda]` (toy_train.h's backends:
 * cpu + shm, or cuda + nccl with one GPU per rank; ctest's
 * unit.test_faults.cuda, labels gpu and faults, is skipped without 4
 * GPUs).  The messages checked are the ones the shm plugin gives and the
 * nccl plugin is built to give alike ("all_reduce #12 (...)", "rank 1");
 * the cuda variant has not yet run on a GPU.
 *
 * Real ranks: forked processes training the toy model (toy_train.h) over
 * the communicator, whose table is wrapped by the countdown fault injector
 * (comm_fault.h, on core/interpose).  Rank 1 arms a fault at a chosen
 * point of step 2 (the first forward, the last micro-step's backward, or
 * the optimizer step): its Nth matching collective returns DT_ERR_REMOTE
 * or DT_ERR_TIMEOUT without running, or first aborts the job through the
 * plugin.  Each rank drives the strategy as the core's loop does and, at
 * the first failure, stops, adds the loop's context ("step 2,
 * micro-batch 1: backward: ..."; the core's train loop says "step S,
 * micro-batch M") and finalizes; in the stall cases the failing rank
 * first stays alive, not arriving, past the others' timeout.
 *
 * Checked per rank:
 *  - the status: the injected one on rank 1; DT_ERR_REMOTE or
 *    DT_ERR_TIMEOUT elsewhere (DT_ERR_TIMEOUT when rank 1 stalls);
 *  - it surfaced in step 2 (a peer's wait pending in step 1's last
 *    collective may fail by an abort, as the ABI says: then step 1);
 *  - the message names that step, "rank 1" and the collective: the
 *    injected one on rank 1 and, after an abort (its reason), everywhere;
 *    without an abort a peer names the collective it was waiting in (and,
 *    outside rank 1's groups, the neighbour it heard from: `cascade`);
 *  - it came within the comm timeout (+ FAULT_SLACK_S for scheduling on a
 *    loaded, sanitized machine), after a stall not before the timeout,
 *    and finalize took at most FAULT_SLACK_S;
 *  - after the strategy's finalize no device byte of any tag and no host
 *    byte of its host table is left; the process ends normally before
 *    the harness deadline (nothing hangs) and, in the sanitizer build,
 *    LeakSanitizer finds nothing (dt_mp_set_leak_check).
 *
 * The injection points were read off the traces (toy_train.h tokens) and
 * are named in each case's comment; a fault that fired in another phase
 * or step fails the case.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "comm_fault.h"
#include "dtrain/dtrain.h"
#include "mp_check.h"
#include "test_plugin.h"
#include "toy_train.h"
#include "util/error.h"

#define FAULT_TIMEOUT_MS 3000 /* the communicator's bound on every wait */
#define FAULT_SLACK_S 2.0     /* scheduling on a shared, sanitized machine */
#define FAULT_STALL_TIMEOUT_MS 1000 /* the bound when the failing rank stalls */
#define FAULT_STALL_S 2.5     /* how long it stalls: > the bound + a margin */
#define FAULT_STEP 2          /* the step that fails (of 3) */
#define FAULT_DEADLINE_S 60.0 /* the whole run; a rank still alive has hung */

enum { PH_BEGIN = -1, PH_FORWARD, PH_BACKWARD, PH_STEP };
static const char *const phase_name[] = {"forward", "backward", "step"};

typedef struct fault_rank {
    int rc;                            /* the first failure (DT_OK: none) */
    char msg[1536];                    /* its message, with the step */
    int step;                          /* where it surfaced: step, */
    int phase;                         /* PH_* (-1: begin_step) */
    double t_fail;                     /* seconds from the step's start */
    double t_close;                    /* seconds finalize took */
    int fired;                         /* this rank's fault fired */
    uint64_t dev_left[DT_TAG_COUNT];   /* device bytes after finalize */
    uint64_t host_left;                /* strategy host bytes after finalize */
} fault_rank_t;

typedef struct fault_case {
    int phase;                         /* where the fault is armed in FAULT_STEP */
    dt_comm_fault_t fault;
    double stall_s;                    /* the failing rank waits this long before
                                        * finalize (alive, not arriving) */
    fault_rank_t r[DT_TOY_MAX_RANKS];
} fault_case_t;

static const dt_strategy_ops_t *DDP, *ZERO, *FSDP;
static const dt_device_ops_t *D;
static const dt_comm_ops_t *COMM, *FAULTY;
static dt_toy_run_t *run;
static fault_case_t *fc;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void arm_at(int rank, int step, int phase)
{
    if (rank == fc->fault.rank && step == FAULT_STEP && phase == fc->phase)
        dt_comm_fault_arm(&fc->fault);
}

/* One rank: train until the first failure, as the core's loop does. */
static int fault_rank(int rank, int size, const char *job, void *arg)
{
    (void)arg;
    fault_rank_t *out = &fc->r[rank];
    const dt_strategy_ops_t *S = run->S;
    dt_toy_env_t env;
    DT_MP_OK(dt_toy_env_open(&env, run, rank, size, job));
    dt_toy_env_load(&env, run);
    int rc = DT_OK;
    for (int t = 1; rc == DT_OK && t <= run->steps; t++) {
        double t0 = now_s();
        uint32_t m = 0;
        int phase = PH_BEGIN;
        rc = S->begin_step(env.s, t);
        while (rc == DT_OK && m < run->n_micro) {
            double loss;
            phase = PH_FORWARD;
            if (m == 0)
                arm_at(rank, t, PH_FORWARD);
            if ((rc = dt_toy_forward(env.s, &env.dd, run->param_dtype, rank, m,
                                     run->n_micro, 0, &loss)) != DT_OK)
                break;
            phase = PH_BACKWARD;
            if (m + 1 == run->n_micro)
                arm_at(rank, t, PH_BACKWARD);
            if ((rc = dt_toy_backward(env.s, &env.dd, run->param_dtype, rank, m,
                                      run->n_micro)) == DT_OK)
                m++;
        }
        if (rc == DT_OK) {
            phase = PH_STEP;
            arm_at(rank, t, PH_STEP);
            dt_step_args_t sa = {.struct_size = sizeof sa, .step = t, .lr = run->lr,
                                 .clip = run->clip[t - 1]};
            dt_step_result_t sr = {.struct_size = sizeof sr};
            rc = S->step(env.s, &sa, &sr);
        }
        if (rc != DT_OK) {
            out->t_fail = now_s() - t0;
            out->rc = rc;
            out->step = t;
            out->phase = phase;
            if (phase == PH_FORWARD || phase == PH_BACKWARD)
                dt_err_context(rc, "step %d, micro-batch %u: %s", t, m, phase_name[phase]);
            else
                dt_err_context(rc, "step %d: %s", t, phase == PH_STEP ? "step" : "begin_step");
            snprintf(out->msg, sizeof out->msg, "%s", dt_last_error());
        }
    }
    out->fired = dt_comm_fault_disarm();
    if (out->fired && fc->stall_s > 0) {
        double until = now_s() + fc->stall_s;
        while (now_s() < until)
            nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    double t1 = now_s();
    S->finalize(env.s);
    env.s = NULL;
    dt_mem_stats_t ms;
    dt_toy_env_mem(&env, run, &ms);
    memcpy(out->dev_left, ms.current, sizeof out->dev_left);
    out->host_left = env.th_s.mem.total_current;
    dt_toy_env_close(&env, run);
    out->t_close = now_s() - t1;
    return 0;
}

/* Every rank of the case ran; what each ended with, for failure messages. */
static const char *outcomes(int size)
{
    static char buf[8192];
    size_t n = 0;
    buf[0] = '\0';
    for (int r = 0; r < size && n < sizeof buf; r++)
        n += (size_t)snprintf(buf + n, sizeof buf - n,
                              "\n  rank %d: %s in step %d after %.2f s (close %.2f s)%s: %s", r,
                              dt_status_name(fc->r[r].rc), fc->r[r].step, fc->r[r].t_fail,
                              fc->r[r].t_close, fc->r[r].fired ? ", fired" : "", fc->r[r].msg);
    return buf;
}

/* "all_reduce #12 (" and the like: the shm plugin's name of an operation. */
static int names_collective(const char *msg)
{
    static const char *const ops[] = {"all_reduce #", "reduce_scatter #", "all_gather #",
                                      "broadcast #", "reduce #", "barrier #"};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (strstr(msg, ops[i]))
            return 1;
    return 0;
}

static void expect_has(int size, int r, const char *part)
{
    if (!strstr(fc->r[r].msg, part))
        fail_msg("rank %d's message lacks \"%s\"; outcomes:%s", r, part, outcomes(size));
}

/* One case: strategy S with config kv at `size` ranks, `fault` armed in
 * `phase` of step FAULT_STEP on rank fault.rank. */
typedef struct fault_spec {
    const dt_strategy_ops_t *S;
    const char *prefix;      /* "strategy/zero" */
    const dt_test_kv_t *kv;
    int size;
    int phase;
    dt_comm_fault_t fault;
    const char *collective;  /* the injected one's name, in the messages */
    /* Without an abort, a rank outside the failing rank's groups hears of
     * the failure from a neighbour that stopped: it names that neighbour
     * (some rank), not the failing one. */
    int cascade;
    /* The failing rank stays alive this long before finalize: the others
     * must give up by the communicator's timeout (FAULT_STALL_TIMEOUT_MS
     * then), with DT_ERR_TIMEOUT. */
    double stall_s;
} fault_spec_t;

/* Run the case and check every rank (see the top of the file). */
static void fault_run(const fault_spec_t *c)
{
    const dt_comm_fault_t *f = &c->fault;
    int64_t timeout_ms = c->stall_s > 0 ? FAULT_STALL_TIMEOUT_MS : FAULT_TIMEOUT_MS;
    *run = (dt_toy_run_t){.S = c->S, .prefix = c->prefix, .D = D, .C = FAULTY, .kv = c->kv,
                          .param_dtype = DT_F32, .optim = DT_OPTIM_ADAMW,
                          .timeout_ms = timeout_ms, DT_TOY_RUN_STANDARD};
    memset(fc, 0, sizeof *fc);
    fc->phase = c->phase;
    fc->fault = *f;
    fc->stall_s = c->stall_s;
    dt_mp_run_ranks(c->size, fault_rank, NULL, FAULT_DEADLINE_S, "flt");

    int size = c->size;
    if (getenv("DT_TEST_VERBOSE"))
        fprintf(stderr, "%s %s x%d:%s\n", c->prefix, phase_name[c->phase], size,
                outcomes(size));
    char rank_name[32], step_name[32];
    snprintf(rank_name, sizeof rank_name, "rank %d", f->rank);
    double bound = (double)timeout_ms / 1000.0 + FAULT_SLACK_S;
    for (int r = 0; r < size; r++) {
        const fault_rank_t *o = &fc->r[r];
        int failing = r == f->rank;
        if (failing ? !o->fired || o->rc != f->status
                    : o->fired || (c->stall_s > 0 ? o->rc != DT_ERR_TIMEOUT
                                                  : o->rc != DT_ERR_REMOTE &&
                                                        o->rc != DT_ERR_TIMEOUT))
            fail_msg("rank %d: %s; expected %s; outcomes:%s", r, dt_status_name(o->rc),
                     failing          ? dt_status_name(f->status)
                     : c->stall_s > 0 ? "DT_ERR_TIMEOUT"
                                      : "DT_ERR_REMOTE or DT_ERR_TIMEOUT",
                     outcomes(size));
        /* an abort also fails a peer's wait still pending in the last
         * collective of the step before (the ABI: "pending and future
         * waits fail") */
        if (o->step != FAULT_STEP && !(f->abort_first && !failing && o->step == FAULT_STEP - 1))
            fail_msg("rank %d failed in step %d, expected %d; outcomes:%s", r, o->step,
                     FAULT_STEP, outcomes(size));
        snprintf(step_name, sizeof step_name, "step %d", o->step);
        expect_has(size, r, step_name);
        expect_has(size, r, failing || !c->cascade ? rank_name : "rank ");
        /* the injected collective; a peer without the abort's reason names
         * the collective IT was in when it gave up */
        if (failing || f->abort_first)
            expect_has(size, r, c->collective);
        else if (!names_collective(o->msg))
            fail_msg("rank %d's message names no collective; outcomes:%s", r, outcomes(size));
        if (failing && o->phase != c->phase)
            fail_msg("rank %d failed in %s, armed in %s; outcomes:%s", r,
                     o->phase == PH_BEGIN ? "begin_step" : phase_name[o->phase],
                     phase_name[c->phase], outcomes(size));
        /* waiting for the stalled rank: a real timeout, not before it */
        if (c->stall_s > 0 && !failing) {
            expect_has(size, r, "timed out");
            if (o->t_fail < (double)timeout_ms / 1000.0)
                fail_msg("rank %d gave up after %.2f s, before the %.1f s timeout; "
                         "outcomes:%s", r, o->t_fail, (double)timeout_ms / 1000.0,
                         outcomes(size));
        }
        if (o->t_fail > bound || o->t_close > FAULT_SLACK_S)
            fail_msg("rank %d: failed after %.2f s, finalized in %.2f s (bounds %.1f s and "
                     "%.1f s); outcomes:%s", r, o->t_fail, o->t_close, bound, FAULT_SLACK_S,
                     outcomes(size));
        for (int t = 0; t < DT_TAG_COUNT; t++)
            if (o->dev_left[t])
                fail_msg("rank %d: %llu device bytes of tag %s left after finalize", r,
                         (unsigned long long)o->dev_left[t], dt_mem_tag_name(t));
        if (o->host_left)
            fail_msg("rank %d: %llu host bytes of the strategy left after finalize", r,
                     (unsigned long long)o->host_left);
    }
}

/* Fail the `nth` call of `slot` on rank 1 with `status`. */
static dt_comm_fault_t fail_nth(int slot, uint32_t nth, int status)
{
    return (dt_comm_fault_t){.rank = 1, .slot = slot, .nth = nth, .status = status};
}

/* The same call, after aborting the job through the plugin. */
static dt_comm_fault_t abort_nth(int slot, uint32_t nth)
{
    return (dt_comm_fault_t){.rank = 1, .slot = slot, .nth = nth, .status = DT_ERR_ABORTED,
                             .abort_first = 1};
}

#define DDP_CASE(...) fault_run(&(fault_spec_t){.S = DDP, .prefix = "strategy/ddp", __VA_ARGS__})
#define ZERO_CASE(...)                                                         \
    fault_run(&(fault_spec_t){.S = ZERO, .prefix = "strategy/zero", __VA_ARGS__})
#define FSDP_CASE(...)                                                         \
    fault_run(&(fault_spec_t){.S = FSDP, .prefix = "strategy/fsdp", __VA_ARGS__})

/* ---------------------------------------------------------------- ddp */

/* Buckets of one unit each (AR16 AR80 AR64 at the final micro-step's
 * post_backward, overlapping backward; then the norm's AR1 in step). */
static void test_ddp(void **state)
{
    const dt_test_kv_t kv[] = {{"bucket_cap_mb", "0.0001"}, {NULL, NULL}};
    DDP_CASE(.kv = kv, .size = 2, .phase = PH_BACKWARD,
             .fault = fail_nth(DT_ICOMM_ALL_REDUCE, 2, DT_ERR_REMOTE), .collective = "all_reduce");
    DDP_CASE(.kv = kv, .size = 2, .phase = PH_STEP,
             .fault = fail_nth(DT_ICOMM_ALL_REDUCE, 1, DT_ERR_TIMEOUT), .collective = "all_reduce");
    DDP_CASE(.kv = kv, .size = 2, .phase = PH_BACKWARD,
             .fault = abort_nth(DT_ICOMM_ALL_REDUCE, 1), .collective = "all_reduce");
    /* the failing rank stays: the others time out in the bucket's wait */
    DDP_CASE(.kv = kv, .size = 2, .phase = PH_BACKWARD,
             .fault = fail_nth(DT_ICOMM_ALL_REDUCE, 2, DT_ERR_REMOTE), .collective = "all_reduce",
             .stall_s = FAULT_STALL_S);
    /* overlap off: the buckets' all_reduces start in step; the third
     * fails (any collective counts) while two are in flight */
    const dt_test_kv_t kn[] = {{"bucket_cap_mb", "0.0001"}, {"overlap", "false"}, {NULL, NULL}};
    DDP_CASE(.kv = kn, .size = 3, .phase = PH_STEP, .fault = abort_nth(DT_ICOMM_ALL_REDUCE, 2),
             .collective = "all_reduce");
    DDP_CASE(.kv = kn, .size = 2, .phase = PH_STEP,
             .fault = fail_nth(DT_COMM_FAULT_ANY_COLLECTIVE, 3, DT_ERR_REMOTE),
             .collective = "all_reduce");
}

/* ---------------------------------------------------------------- zero */

/* Three reduce buckets (RS16 RS48 RS32 at the final micro-step's
 * post_backwards), the norm and three all_gather buckets in step. */
static void test_zero_stage1(void **state)
{
    const dt_test_kv_t kv[] = {{"stage", "1"}, {"reduce_bucket_size", "60"},
                               {"allgather_bucket_size", "100"}, {NULL, NULL}};
    ZERO_CASE(.kv = kv, .size = 2, .phase = PH_BACKWARD,
              .fault = fail_nth(DT_ICOMM_REDUCE_SCATTER, 2, DT_ERR_REMOTE),
              .collective = "reduce_scatter");
    ZERO_CASE(.kv = kv, .size = 2, .phase = PH_STEP, .fault = abort_nth(DT_ICOMM_ALL_GATHER, 2),
              .collective = "all_gather");
    ZERO_CASE(.kv = kv, .size = 2, .phase = PH_STEP,
              .fault = fail_nth(DT_ICOMM_ALL_GATHER, 3, DT_ERR_REMOTE), .collective = "all_gather");
    /* no all_gather limit: the third bucket's fails while two are in
     * flight; overlap off: the reduce_scatters run in step */
    const dt_test_kv_t kn[] = {{"stage", "1"}, {"reduce_bucket_size", "60"},
                               {"overlap_comm", "false"}, {NULL, NULL}};
    ZERO_CASE(.kv = kn, .size = 2, .phase = PH_STEP,
              .fault = fail_nth(DT_ICOMM_ALL_GATHER, 3, DT_ERR_TIMEOUT),
              .collective = "all_gather");
    ZERO_CASE(.kv = kn, .size = 2, .phase = PH_STEP,
              .fault = fail_nth(DT_ICOMM_REDUCE_SCATTER, 2, DT_ERR_REMOTE),
              .collective = "reduce_scatter");
}

/* Three reduce buckets, reduced in every micro-step's backward. */
static void test_zero_stage2(void **state)
{
    const dt_test_kv_t kv[] = {{"stage", "2"}, {"reduce_bucket_size", "60"}, {NULL, NULL}};
    ZERO_CASE(.kv = kv, .size = 2, .phase = PH_BACKWARD,
              .fault = fail_nth(DT_ICOMM_REDUCE_SCATTER, 2, DT_ERR_TIMEOUT),
              .collective = "reduce_scatter");
    ZERO_CASE(.kv = kv, .size = 3, .phase = PH_BACKWARD,
              .fault = abort_nth(DT_ICOMM_REDUCE_SCATTER, 1), .collective = "reduce_scatter");
    ZERO_CASE(.kv = kv, .size = 2, .phase = PH_STEP,
              .fault = fail_nth(DT_ICOMM_ALL_REDUCE, 1, DT_ERR_REMOTE), .collective = "all_reduce");
    ZERO_CASE(.kv = kv, .size = 2, .phase = PH_BACKWARD,
              .fault = fail_nth(DT_ICOMM_REDUCE_SCATTER, 3, DT_ERR_REMOTE),
              .collective = "reduce_scatter", .stall_s = FAULT_STALL_S);
}

/* Nothing persists gathered: backward gathers (AG16 AG48 AG32 at the
 * head's pre_backward, prefetching) and reduce-scatters (RS16 RS48 RS32);
 * the norm in step; a gather in forward. */
static void test_zero_stage3(void **state)
{
    const dt_test_kv_t kv[] = {{"stage", "3"}, {"param_persistence_threshold", "0"},
                               {NULL, NULL}};
    ZERO_CASE(.kv = kv, .size = 2, .phase = PH_BACKWARD,
              .fault = fail_nth(DT_ICOMM_ALL_GATHER, 2, DT_ERR_REMOTE), .collective = "all_gather");
    ZERO_CASE(.kv = kv, .size = 2, .phase = PH_BACKWARD,
              .fault = abort_nth(DT_ICOMM_REDUCE_SCATTER, 2), .collective = "reduce_scatter");
    ZERO_CASE(.kv = kv, .size = 2, .phase = PH_STEP,
              .fault = fail_nth(DT_ICOMM_ALL_REDUCE, 1, DT_ERR_TIMEOUT),
              .collective = "all_reduce");
    ZERO_CASE(.kv = kv, .size = 2, .phase = PH_FORWARD,
              .fault = fail_nth(DT_ICOMM_ALL_GATHER, 2, DT_ERR_REMOTE), .collective = "all_gather");
    ZERO_CASE(.kv = kv, .size = 2, .phase = PH_BACKWARD,
              .fault = fail_nth(DT_ICOMM_ALL_GATHER, 1, DT_ERR_TIMEOUT), .collective = "all_gather",
              .stall_s = FAULT_STALL_S);
}

/* ---------------------------------------------------------------- fsdp */

/* FULL_SHARD, last micro-step's backward: B2 AG16 AG48 B0 AG32 b0 b2!
 * RS16 B1 AG32 b1! RS48 B0 b0! RS32; the norm in step.  HYBRID_SHARD 2 x
 * 2: the shards' all_reduce across replicas after their reduce_scatter. */
static void test_fsdp(void **state)
{
    const dt_test_kv_t kf[] = {{"sharding_strategy", "FULL_SHARD"}, {NULL, NULL}};
    const dt_test_kv_t kh[] = {{"sharding_strategy", "HYBRID_SHARD"},
                               {"hybrid_group_size", "2"}, {NULL, NULL}};
    FSDP_CASE(.kv = kf, .size = 2, .phase = PH_BACKWARD,
              .fault = fail_nth(DT_ICOMM_ALL_GATHER, 1, DT_ERR_TIMEOUT),
              .collective = "all_gather");
    FSDP_CASE(.kv = kf, .size = 2, .phase = PH_BACKWARD,
              .fault = fail_nth(DT_ICOMM_REDUCE_SCATTER, 2, DT_ERR_REMOTE),
              .collective = "reduce_scatter");
    FSDP_CASE(.kv = kf, .size = 2, .phase = PH_STEP, .fault = abort_nth(DT_ICOMM_ALL_REDUCE, 1),
              .collective = "all_reduce");
    FSDP_CASE(.kv = kf, .size = 2, .phase = PH_BACKWARD,
              .fault = fail_nth(DT_ICOMM_REDUCE_SCATTER, 1, DT_ERR_REMOTE),
              .collective = "reduce_scatter", .stall_s = FAULT_STALL_S);
    /* with an abort every rank hears of rank 1, also those outside its
     * groups */
    FSDP_CASE(.kv = kh, .size = 4, .phase = PH_BACKWARD,
              .fault = abort_nth(DT_ICOMM_ALL_REDUCE, 1), .collective = "all_reduce");
    FSDP_CASE(.kv = kh, .size = 4, .phase = PH_STEP,
              .fault = fail_nth(DT_ICOMM_ALL_REDUCE, 1, DT_ERR_REMOTE), .collective = "all_reduce",
              .cascade = 1);
}

static int group_setup(void **state)
{
    DDP = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_ddp.so",
                               DT_ENTRY_STRING(strategy, 1), NULL);
    ZERO = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_zero.so",
                                DT_ENTRY_STRING(strategy, 1), NULL);
    FSDP = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_fsdp.so",
                                DT_ENTRY_STRING(strategy, 1), NULL);
    if (!DDP || !ZERO || !FSDP) {
        fprintf(stderr, "%s\n", dt_last_error());
        return -1;
    }
    if (dt_toy_setup(DT_TEST_PLUGIN_DIR, &D, &COMM, &run, 1) != 0)
        return -1;
    FAULTY = dt_comm_fault_wrap(COMM);
    fc = dt_mp_shared_alloc(sizeof *fc);
    return fc ? 0 : -1;
}

int main(int argc, char **argv)
{
    int rc = dt_toy_backend_select(argc, argv, 4);
    if (rc >= 0)
        return rc;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ddp),
        cmocka_unit_test(test_zero_stage1),
        cmocka_unit_test(test_zero_stage2),
        cmocka_unit_test(test_zero_stage3),
        cmocka_unit_test(test_fsdp),
    };
    return cmocka_run_group_tests_name(dt_toy_backend_label(), tests, group_setup, NULL);
}
