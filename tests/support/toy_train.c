/*
 * tests/support/toy_train.c - forked ranks training the toy model with a
 * strategy plugin, and the parent's comparison with the float64
 * reference (see toy_train.h).
 */
#include "toy_train.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda_probe.h"
#include "interpose/interpose.h"
#include "mp_check.h"
#include "mp_harness.h"
#include "test_plugin.h"
#include "util/error.h"

dt_toy_run_t *dt_toy_run_alloc(void)
{
    return dt_mp_shared_alloc(sizeof(dt_toy_run_t));
}

/* ------------------------------------------------------------ backends */

static const dt_test_kv_t cpu_kv[] = {{"threads", "1"}, {NULL, NULL}};
/* small pipeline slots: several groups (splits) per test stay cheap */
static const dt_test_kv_t shm_kv[] = {{"slot_bytes", "65536"}, {NULL, NULL}};
/* no atomics in the cuda reductions: a rerun repeats the same bits */
static const dt_test_kv_t cuda_kv[] = {{"deterministic", "true"}, {NULL, NULL}};

typedef struct backend {
    const char *label, *device, *comm;
    const dt_test_kv_t *device_kv, *comm_kv;
    const char *device_prefix, *comm_prefix;
} backend_t;

static const backend_t backends[] = {
    {"cpu + shm", "cpu", "shm", cpu_kv, shm_kv, "device/cpu", "comm/shm"},
    {"cuda + nccl", "cuda", "nccl", cuda_kv, NULL, "device/cuda", "comm/nccl"},
};
static const backend_t *g_backend = &backends[0];

const char *dt_toy_backend_label(void) { return g_backend->label; }
const char *dt_toy_backend_device(void) { return g_backend->device; }
const char *dt_toy_backend_comm(void) { return g_backend->comm; }
const dt_test_kv_t *dt_toy_backend_device_kv(void) { return g_backend->device_kv; }
const dt_test_kv_t *dt_toy_backend_comm_kv(void) { return g_backend->comm_kv; }
const char *dt_toy_backend_device_prefix(void) { return g_backend->device_prefix; }
const char *dt_toy_backend_comm_prefix(void) { return g_backend->comm_prefix; }

/* dt_test_cuda_devices in a forked child (CUDA initialised in this
 * process would not survive the fork into the ranks), waited for at most
 * 60 s. */
static int cuda_devices_forked(char *why, size_t n)
{
    struct {
        int devs;
        char why[512];
    } r = {0, "no CUDA device: the probe process failed"};
    int fd[2];
    if (pipe(fd) != 0) {
        snprintf(why, n, "no CUDA device: pipe for the probe: %s", strerror(errno));
        return 0;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(why, n, "no CUDA device: fork for the probe: %s", strerror(errno));
        close(fd[0]);
        close(fd[1]);
        return 0;
    }
    if (pid == 0) {
        close(fd[0]);
        r.devs = dt_test_cuda_devices(r.why, sizeof r.why);
        ssize_t w = write(fd[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fd[1]);
    struct pollfd pfd = {.fd = fd[0], .events = POLLIN};
    if (poll(&pfd, 1, 60000) != 1 || read(fd[0], &r, sizeof r) != (ssize_t)sizeof r) {
        r.devs = 0;
        snprintf(r.why, sizeof r.why, "no CUDA device: the probe process gave no answer");
        kill(pid, SIGKILL);
    }
    close(fd[0]);
    waitpid(pid, NULL, 0);
    snprintf(why, n, "%s", r.why);
    return r.devs;
}

int dt_toy_backend_select(int argc, char **argv, int max_ranks)
{
    const char *name = argc > 1 ? argv[1] : "cpu";
    if (argc > 2 || (strcmp(name, "cpu") != 0 && strcmp(name, "cuda") != 0)) {
        fprintf(stderr, "usage: %s [cpu|cuda]\n", argv[0]);
        return 2;
    }
    g_backend = &backends[strcmp(name, "cuda") == 0];
    if (g_backend == &backends[0])
        return -1;
    char why[512];
    int devs = cuda_devices_forked(why, sizeof why);
    if (devs == 0) {
        printf("SKIPPED: %s\n", why);
        return DT_TEST_SKIP_CODE;
    }
    if (devs < max_ranks) {
        printf("SKIPPED: %s needs %d CUDA devices (one per rank), found %d\n", argv[0],
               max_ranks, devs);
        return DT_TEST_SKIP_CODE;
    }
    return -1;
}

int dt_toy_setup(const char *plugin_dir, const dt_device_ops_v1_t **D,
                 const dt_comm_ops_v1_t **C, dt_toy_run_t **runs, int n_runs)
{
    char path[1024];
    dt_mp_set_leak_check(1);
    snprintf(path, sizeof path, "%s/dtrain_%s.so", plugin_dir, g_backend->device);
    *D = dt_test_plugin_entry(path, DT_ENTRY_STRING(device, 1), NULL);
    snprintf(path, sizeof path, "%s/dtrain_%s.so", plugin_dir, g_backend->comm);
    *C = *D ? dt_test_plugin_entry(path, DT_ENTRY_STRING(comm, 1), NULL) : NULL;
    if (!*D || !*C) {
        fprintf(stderr, "cannot load %s/%s from %s: %s\n", g_backend->device, g_backend->comm,
                plugin_dir, dt_last_error());
        return -1;
    }
    for (int k = 0; k < n_runs; k++)
        if (!(runs[k] = dt_toy_run_alloc())) {
            fprintf(stderr, "cannot map a shared run\n");
            return -1;
        }
    return 0;
}

/* Load the initial state through HELD ranges, as the core's fresh start
 * does: parameters from dt_toy_pval, moments zero. */
static void load_fresh(dt_strategy_t *s)
{
    float full[DT_TOY_MAXN];
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        for (int k = 0; k < DT_STATE_COUNT; k++) {
            for (uint64_t i = 0; i < dt_toy_unit(u)->numel; i++)
                full[i] = k == DT_STATE_PARAMS ? dt_toy_pval(u, i) : 0.0f;
            dt_range_t rg[8];
            uint32_t n = 0;
            DT_MP_OK(dt_strategy_ops(s)->state_ranges(s, u, k, DT_RANGES_HELD, rg, 8, &n));
            DT_MP_CHECK(n <= 8);
            for (uint32_t j = 0; j < n; j++)
                DT_MP_OK(dt_strategy_ops(s)->set_state(s, u, k, rg[j], full + rg[j].offset));
        }
}

static void report_state(dt_strategy_t *s, dt_toy_rank_t *out)
{
    for (int k = 0; k < DT_STATE_COUNT; k++)
        for (uint32_t u = 0; u < DT_TOY_NU; u++) {
            dt_range_t rg[8];
            uint32_t n = 0;
            DT_MP_OK(dt_strategy_ops(s)->state_ranges(s, u, k, DT_RANGES_HELD, rg, 8, &n));
            DT_MP_CHECK(n <= 8);
            for (uint32_t j = 0; j < n; j++) {
                DT_MP_OK(
                    dt_strategy_ops(s)->get_state(s, u, k, rg[j], &out->state[k][u][rg[j].offset]));
                memset(&out->held[k][u][rg[j].offset], 1, rg[j].count);
            }
            DT_MP_OK(dt_strategy_ops(s)->state_ranges(s, u, k, DT_RANGES_SAVE, rg, 8, &n));
            DT_MP_CHECK(n <= 1); /* the engine saves one range per unit */
            out->n_save[k][u] = n;
            if (n)
                out->save[k][u] = rg[0];
        }
}

int dt_toy_env_open(dt_toy_env_t *env, const dt_toy_run_t *run, int rank, int size,
                    const char *job)
{
    memset(env, 0, sizeof *env);
    dt_test_host_init(&env->th_dev, g_backend->device_prefix, g_backend->device_kv);
    dt_test_host_init(&env->th_comm, g_backend->comm_prefix, g_backend->comm_kv);
    dt_test_host_init(&env->th_s, run->prefix, run->kv);
    const dt_device_ops_v1_t *D = run->D;
    dt_device_init_v1_t di = {.struct_size = sizeof di, .rank = rank, .local_rank = rank,
                              .local_size = size, .device_index = -1};
    DT_MP_OK(D->init(&env->th_dev.host, &di, &env->dev));
    DT_MP_OK(D->stream_create(env->dev, &env->cs));
    env->dd = (dt_toy_dev_t){.ops = D, .dev = env->dev, .stream = env->cs};
    dt_comm_init_v1_t ci = {.struct_size = sizeof ci,
                            .rank = rank,
                            .size = size,
                            .local_rank = rank,
                            .local_size = size,
                            .job_id = job,
                            .timeout_ms = run->timeout_ms ? run->timeout_ms : 20000,
                            .dev = env->dev};
    DT_MP_OK(run->C->init(&env->th_comm.host, &ci, &env->comm));
    env->base.struct_size = sizeof env->base;
    DT_MP_OK(D->mem_stats(env->dev, &env->base));
    env->model = dt_toy_model(run->param_dtype);
    env->optim = dt_toy_optim(run->optim);
    dt_strategy_init_v1_t a = {.struct_size = sizeof a,
                               .n_micro = run->n_micro,
                               .dev = env->dev,
                               .compute_stream = env->cs,
                               .comm = env->comm,
                               .model = &env->model,
                               .optim = &env->optim};
    return run->S->init(&env->th_s.host, &a, &env->s);
}

void dt_toy_env_mem(const dt_toy_env_t *env, const dt_toy_run_t *run, dt_mem_stats_t *out)
{
    out->struct_size = sizeof *out;
    DT_MP_OK(run->D->mem_stats(env->dev, out));
    for (int t = 0; t < DT_TAG_CAPACITY; t++) {
        out->current[t] -= env->base.current[t];
        out->peak[t] -= env->base.current[t];
    }
    out->total_current -= env->base.total_current;
    out->total_peak -= env->base.total_current;
    /* the communicator's symmetric memory (comm.h sym_alloc), where the
     * strategy put buffers it reduces or gathers, is memory of a
     * host-visible device as the core counts it (train.c,
     * device_mem_stats) */
    dt_device_props_t props = {.struct_size = sizeof props};
    if (run->D->props(env->dev, &props) == DT_OK && props.host_visible) {
        const dt_mem_stats_t *cm = &env->th_comm.mem;
        for (int t = 0; t < DT_TAG_COUNT; t++) {
            out->current[t] += cm->current[t];
            out->peak[t] += cm->peak[t];
        }
        out->total_current += cm->total_current;
        out->total_peak += cm->total_peak;
    }
}

void dt_toy_env_close(dt_toy_env_t *env, const dt_toy_run_t *run)
{
    if (env->s)
        run->S->finalize(env->s);
    run->C->finalize(env->comm);
    run->D->stream_destroy(env->dev, env->cs);
    run->D->finalize(env->dev);
}

void dt_toy_env_load(dt_toy_env_t *env, const dt_toy_run_t *run)
{
    load_fresh(env->s);
    DT_MP_OK(run->S->state_loaded(env->s));
}

static int rank_main(int rank, int size, const char *job, void *arg)
{
    dt_toy_run_t *run = arg;
    dt_toy_rank_t *out = &run->rank[rank];
    const dt_strategy_ops_v1_t *S = run->S;
    dt_toy_env_t env;
    out->rc = dt_toy_env_open(&env, run, rank, size, job);
    if (out->rc != DT_OK) {
        snprintf(out->msg, sizeof out->msg, "%s", dt_last_error());
    } else {
        dt_strategy_t *s = env.s;
        dt_toy_env_load(&env, run);
        double l;
        if (run->eval_first)
            DT_MP_OK(dt_toy_forward(s, &env.dd, run->param_dtype, rank, 0, 0,
                                    DT_HOOK_NO_GRAD, &l));
        for (int t = 1; t <= run->steps; t++) {
            DT_MP_OK(S->begin_step(s, t));
            for (uint32_t m = 0; m < run->n_micro; m++) {
                DT_MP_OK(dt_toy_forward(s, &env.dd, run->param_dtype, rank, m, run->n_micro,
                                        0, &out->loss[t - 1][m]));
                DT_MP_OK(dt_toy_backward(s, &env.dd, run->param_dtype, rank, m,
                                         run->n_micro));
            }
            dt_step_args_v1_t sa = {.struct_size = sizeof(dt_step_args_v1_t),
                                    .step = t,
                                    .lr = run->lr,
                                    .clip = run->clip[t - 1]};
            dt_step_result_v1_t r = {.struct_size = sizeof(dt_step_result_v1_t)};
            DT_MP_OK(S->step(s, &sa, &r));
            out->norm[t - 1] = r.grad_norm;
            out->nonfinite[t - 1] = r.nonfinite;
        }
        dt_toy_env_mem(&env, run, &out->mem);
        report_state(s, out);
    }
    dt_toy_env_close(&env, run);
    return 0;
}

static void trace_clear(void);

void dt_toy_run(dt_toy_run_t *run, int size)
{
    assert_true(size >= 1 && size <= DT_TOY_MAX_RANKS);
    assert_true(run->steps <= DT_TOY_MAX_STEPS && run->n_micro <= DT_TOY_MAX_MICRO);
    memset(run->rank, 0, sizeof run->rank);
    trace_clear();
    dt_mp_run_ranks(size, rank_main, run, 60.0, "toy");
}

const dt_toy_tol_t dt_toy_tol_f32 = {.p_rel = 2e-5, .p_abs = 1e-6, .mom_rel = 2e-5,
                                     .norm_rel = 1e-5, .loss_rel = 1e-6};
const dt_toy_tol_t dt_toy_tol_bf16 = {.p_rel = 0, .p_abs = 3e-4, .mom_rel = 5e-3,
                                      .norm_rel = 1e-3, .loss_rel = 0, .loss_abs = 1e-2};

const dt_toy_tol_t dt_toy_tol_reduce_bf16 = {.p_rel = 0, .p_abs = 2.4e-4, .mom_rel = 1e-2,
                                             .norm_rel = 5e-3, .loss_rel = 0,
                                             .loss_abs = 1.2e-3};
const dt_toy_tol_t dt_toy_tol_reduce_f16 = {.p_rel = 0, .p_abs = 3e-5, .mom_rel = 1.2e-3,
                                            .norm_rel = 6e-4, .loss_rel = 0,
                                            .loss_abs = 1.5e-4};

void dt_toy_train_check(dt_toy_run_t *run, int size, const dt_toy_tol_t *tol)
{
    dt_toy_run(run, size);
    dt_toy_check(run, size, tol);
    dt_toy_check_estimate(run, size);
}

uint64_t dt_toy_held_count(const dt_toy_rank_t *r, int kind)
{
    uint64_t n = 0;
    for (uint32_t u = 0; u < DT_TOY_NU; u++)
        for (uint64_t i = 0; i < dt_toy_unit(u)->numel; i++)
            n += r->held[kind][u][i];
    return n;
}

static int close_to(double got, double want, double rel, double abs_)
{
    return fabs(got - want) <= abs_ + rel * fabs(want);
}

void dt_toy_check(const dt_toy_run_t *run, int size, const dt_toy_tol_t *tol)
{
    for (int r = 0; r < size; r++)
        if (run->rank[r].rc != DT_OK)
            fail_msg("rank %d: init failed (%s): %s", r, dt_status_name(run->rank[r].rc),
                     run->rank[r].msg);
    static dt_toy_ref_t ref;
    static double loss[DT_TOY_MAX_RANKS][DT_TOY_MAX_MICRO];
    dt_toy_ref_init(&ref);
    for (int t = 1; t <= run->steps; t++) {
        double norm = dt_toy_ref_step(&ref, run->optim, size, run->n_micro, t, run->lr,
                                      run->clip[t - 1], loss);
        for (int r = 0; r < size; r++) {
            const dt_toy_rank_t *o = &run->rank[r];
            if (!close_to(o->norm[t - 1], norm, tol->norm_rel, 0) || o->nonfinite[t - 1])
                fail_msg("%d ranks, step %d, rank %d: norm %.9g, reference %.9g", size, t, r,
                         o->norm[t - 1], norm);
            for (uint32_t m = 0; m < run->n_micro; m++)
                if (!close_to(o->loss[t - 1][m], loss[r][m], tol->loss_rel, tol->loss_abs))
                    fail_msg("%d ranks, step %d, rank %d, micro %u: loss %.9g, reference "
                             "%.9g", size, t, r, m, o->loss[t - 1][m], loss[r][m]);
        }
    }
    int kinds = run->optim == DT_OPTIM_ADAMW ? 3 : 2;
    for (int k = 0; k < kinds; k++)
        for (uint32_t u = 0; u < DT_TOY_NU; u++) {
            uint64_t numel = dt_toy_unit(u)->numel;
            const double *want = k == 0 ? ref.p[u] : k == 1 ? ref.m[u] : ref.v[u];
            for (uint64_t i = 0; i < numel; i++) {
                int holder = -1;
                for (int r = 0; r < size; r++) {
                    if (!run->rank[r].held[k][u][i])
                        continue;
                    float got = run->rank[r].state[k][u][i];
                    if (holder < 0) {
                        holder = r;
                        if (k == 0 ? !close_to(got, want[i], tol->p_rel, tol->p_abs)
                                   : !close_to(got, want[i], tol->mom_rel, 1e-9))
                            fail_msg("%d ranks: state %d of unit %u [%llu] on rank %d: %.9g, "
                                     "reference %.9g", size, k, u, (unsigned long long)i, r,
                                     got, want[i]);
                    } else if (memcmp(&got, &run->rank[holder].state[k][u][i], 4) != 0) {
                        fail_msg("%d ranks: state %d of unit %u [%llu]: rank %d holds %.9g, "
                                 "rank %d %.9g", size, k, u, (unsigned long long)i, holder,
                                 run->rank[holder].state[k][u][i], r, got);
                    }
                }
                if (holder < 0)
                    fail_msg("%d ranks: nobody holds state %d of unit %u [%llu]", size, k, u,
                             (unsigned long long)i);
            }
            /* SAVE: inside HELD, every element exactly once */
            uint8_t seen[DT_TOY_MAXN] = {0};
            for (int r = 0; r < size; r++) {
                const dt_toy_rank_t *o = &run->rank[r];
                if (!o->n_save[k][u])
                    continue;
                dt_range_t sr = o->save[k][u];
                assert_true(sr.count > 0 && sr.offset + sr.count <= numel);
                for (uint64_t i = sr.offset; i < sr.offset + sr.count; i++) {
                    if (!o->held[k][u][i])
                        fail_msg("%d ranks: rank %d saves element %llu of unit %u it does not "
                                 "hold", size, r, (unsigned long long)i, u);
                    if (seen[i]++)
                        fail_msg("%d ranks: element %llu of unit %u (state %d) saved twice",
                                 size, (unsigned long long)i, u, k);
                }
            }
            for (uint64_t i = 0; i < numel; i++)
                if (!seen[i])
                    fail_msg("%d ranks: element %llu of unit %u (state %d) saved by nobody",
                             size, (unsigned long long)i, u, k);
        }
}

dt_estimate_args_v1_t dt_toy_est_args(const dt_model_desc_v1_t *m, int size, int param_dtype,
                                      int optim, uint32_t n_micro)
{
    uint32_t pb = param_dtype == DT_BF16 ? 2 : 4;
    uint32_t states = optim == DT_OPTIM_ADAMW ? 8 : 4;
    return (dt_estimate_args_v1_t){.struct_size = sizeof(dt_estimate_args_v1_t),
                                   .group_size = size, .model = m, .param_bytes = pb,
                                   .grad_bytes = 4, .optim_bytes = states + (pb == 2 ? 4 : 0),
                                   .n_micro = n_micro};
}

void dt_toy_check_estimate(const dt_toy_run_t *run, int size)
{
    dt_test_host_t th;
    dt_test_host_init(&th, run->prefix, run->kv);
    dt_model_desc_v1_t m = dt_toy_model(run->param_dtype);
    dt_estimate_args_v1_t ea = dt_toy_est_args(&m, size, run->param_dtype, run->optim,
                                               run->n_micro);
    dt_estimate_v1_t est = {.struct_size = sizeof(dt_estimate_v1_t)};
    int rc = run->S->estimate(&th.host, &ea, &est);
    if (rc != DT_OK)
        fail_msg("estimate: %s: %s", dt_status_name(rc), dt_last_error());
    const int tags[] = {DT_TAG_PARAMS, DT_TAG_GRADS, DT_TAG_OPTIMIZER, DT_TAG_OTHER};
    if (getenv("DTRAIN_TEST_VERBOSE")) {
        const dt_mem_stats_t *ms = &run->rank[0].mem;
        fprintf(stderr, "estimate %s x%d:", run->prefix, size);
        for (const dt_test_kv_t *kv = run->kv; kv && kv->key; kv++)
            fprintf(stderr, " %s=%s", kv->key, kv->value);
        fprintf(stderr, "\n  measured/estimated bytes: params %llu/%llu grads %llu/%llu "
                "optimizer %llu/%llu comm peak %llu/%llu other %llu/%llu; sends %llu B/step\n",
                (unsigned long long)ms->current[DT_TAG_PARAMS],
                (unsigned long long)est.bytes[DT_TAG_PARAMS],
                (unsigned long long)ms->current[DT_TAG_GRADS],
                (unsigned long long)est.bytes[DT_TAG_GRADS],
                (unsigned long long)ms->current[DT_TAG_OPTIMIZER],
                (unsigned long long)est.bytes[DT_TAG_OPTIMIZER],
                (unsigned long long)ms->peak[DT_TAG_COMM],
                (unsigned long long)est.bytes[DT_TAG_COMM],
                (unsigned long long)ms->current[DT_TAG_OTHER],
                (unsigned long long)est.bytes[DT_TAG_OTHER],
                (unsigned long long)est.comm_bytes_per_step);
    }
    for (int k = 0; k < size; k++) {
        const dt_mem_stats_t *ms = &run->rank[k].mem;
        for (int t = 0; t < 4; t++)
            if (ms->current[tags[t]] != est.bytes[tags[t]])
                fail_msg("%d ranks, rank %d, %s: measured %llu bytes, estimated %llu", size, k,
                         dt_mem_tag_name(tags[t]), (unsigned long long)ms->current[tags[t]],
                         (unsigned long long)est.bytes[tags[t]]);
        if (ms->current[DT_TAG_COMM] != 0)
            fail_msg("%d ranks, rank %d: %llu comm bytes still allocated after the step", size,
                     k, (unsigned long long)ms->current[DT_TAG_COMM]);
        double peak = (double)ms->peak[DT_TAG_COMM], want = (double)est.bytes[DT_TAG_COMM];
        if (fabs(peak - want) > 0.05 * want)
            fail_msg("%d ranks, rank %d: comm peak %.0f bytes, estimated %.0f", size, k, peak,
                     want);
    }
}

/* ---------------------------------------------------------------- traces */

#define TRACE_BYTES 16384
static char *traces;                     /* DT_TOY_MAX_RANKS x TRACE_BYTES, shared */
static const dt_strategy_ops_v1_t *tr_S; /* what trace_strategy forwards to */
static dt_interpose_comm_t *tr_C;        /* the comm, interposed */

static void tr_add(const char *fmt, ...)
{
    int r = dt_mp_rank();
    if (!traces || r < 0 || r >= DT_TOY_MAX_RANKS)
        return;
    char *t = traces + (size_t)r * TRACE_BYTES;
    size_t n = strlen(t);
    if (n + 32 >= TRACE_BYTES)
        return;
    if (n)
        t[n++] = ' ';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t + n, TRACE_BYTES - n, fmt, ap);
    va_end(ap);
}

/* Collectives, from the comm interposer's before hook. */
static int tr_comm(void *ctx, const dt_interpose_call_t *call)
{
    (void)ctx;
    const dt_interpose_comm_call_t *k = (const dt_interpose_comm_call_t *)call;
    static const char *const token[DT_ICOMM_SLOT_COUNT] = {
        [DT_ICOMM_ALL_REDUCE] = "AR", [DT_ICOMM_REDUCE_SCATTER] = "RS",
        [DT_ICOMM_ALL_GATHER] = "AG", [DT_ICOMM_BROADCAST] = "BC"};
    if (token[call->slot])
        tr_add("%s%llu/%d", token[call->slot], (unsigned long long)k->count, k->group_size);
    return DT_OK;
}

/* Defined below: the traced handles start with it (ts_init). */
static dt_strategy_ops_v1_t trace_strategy;

static int ts_init(const dt_host_v1_t *h, const dt_strategy_init_v1_t *a, dt_strategy_t **out)
{
    int rc = tr_S->init(h, a, out);
    /* callers reach a strategy through its handle's first member (its
     * table, dtrain/strategy.h): point it here so the hooks are traced */
    if (rc == DT_OK && *out)
        *(const dt_strategy_ops_v1_t **)(void *)*out = &trace_strategy;
    return rc;
}
static void ts_finalize(dt_strategy_t *s) { tr_S->finalize(s); }
static int ts_begin_step(dt_strategy_t *s, int64_t step)
{
    tr_add("T");
    return tr_S->begin_step(s, step);
}
static int ts_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *o)
{
    tr_add("F%u", h->unit);
    return tr_S->pre_forward(s, h, o);
}
static int ts_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    tr_add("f%u", h->unit);
    return tr_S->post_forward(s, h);
}
static int ts_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h, dt_unit_buffers_v1_t *o)
{
    tr_add("B%u", h->unit);
    return tr_S->pre_backward(s, h, o);
}
static int ts_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h)
{
    tr_add("b%u%s", h->unit, h->last_use ? "!" : "");
    return tr_S->post_backward(s, h);
}
static int ts_step(dt_strategy_t *s, const dt_step_args_v1_t *a, dt_step_result_v1_t *o)
{
    tr_add("S");
    return tr_S->step(s, a, o);
}
static int ts_state_ranges(dt_strategy_t *s, uint32_t u, int k, int p, dt_range_t *out,
                           uint32_t cap, uint32_t *n)
{
    return tr_S->state_ranges(s, u, k, p, out, cap, n);
}
static int ts_get_state(dt_strategy_t *s, uint32_t u, int k, dt_range_t r, float *b)
{
    return tr_S->get_state(s, u, k, r, b);
}
static int ts_set_state(dt_strategy_t *s, uint32_t u, int k, dt_range_t r, const float *b)
{
    return tr_S->set_state(s, u, k, r, b);
}
static int ts_state_loaded(dt_strategy_t *s)
{
    int rc = tr_S->state_loaded(s);
    tr_add("L");
    return rc;
}
static int ts_estimate(const dt_host_v1_t *h, const dt_estimate_args_v1_t *a,
                       dt_estimate_v1_t *o)
{
    return tr_S->estimate(h, a, o);
}

static dt_strategy_ops_v1_t trace_strategy = {
    .init = ts_init,
    .finalize = ts_finalize,
    .begin_step = ts_begin_step,
    .pre_forward = ts_pre_forward,
    .post_forward = ts_post_forward,
    .pre_backward = ts_pre_backward,
    .post_backward = ts_post_backward,
    .step = ts_step,
    .state_ranges = ts_state_ranges,
    .get_state = ts_get_state,
    .set_state = ts_set_state,
    .state_loaded = ts_state_loaded,
    .estimate = ts_estimate,
};

static void trace_clear(void)
{
    if (traces)
        memset(traces, 0, (size_t)DT_TOY_MAX_RANKS * TRACE_BYTES);
}

void dt_toy_trace_wrap(dt_toy_run_t *run)
{
    if (!traces)
        traces = dt_mp_shared_alloc((size_t)DT_TOY_MAX_RANKS * TRACE_BYTES);
    assert_non_null(traces);
    if (run->S != &trace_strategy) {
        tr_S = run->S;
        trace_strategy.info = tr_S->info;
        run->S = &trace_strategy;
    }
    if (!tr_C || run->C != dt_interpose_comm_ops(tr_C)) {
        dt_interpose_comm_destroy(tr_C); /* no handle of it is alive here */
        dt_interpose_hooks_t hooks = {.before = tr_comm};
        if (dt_interpose_comm_create(run->C, &hooks, &tr_C) != DT_OK)
            fail_msg("%s", dt_last_error());
        run->C = dt_interpose_comm_ops(tr_C);
    }
}

const char *dt_toy_trace(int rank)
{
    return traces && rank >= 0 && rank < DT_TOY_MAX_RANKS ? traces + (size_t)rank * TRACE_BYTES
                                                          : "";
}

const char *dt_toy_trace_run(dt_toy_run_t *run, int size, uint32_t n_micro)
{
    run->n_micro = n_micro;
    run->steps = 1;
    dt_toy_trace_wrap(run);
    dt_toy_run(run, size);
    dt_toy_check(run, size, &dt_toy_tol_f32);
    return dt_toy_trace(0);
}
