/*
 * core/train/stage_runner.c - the core's side of a pipeline stage
 * (stage_runner.h): this rank's units under the schedule plugin's layout,
 * the schedule instance, the stage runner the schedule drives (each
 * micro-batch's forward and backward through this rank's chunks, their
 * activation slots), a pass's loss and bubble over the world, and the
 * non-finite searches through the schedule.
 */
#include "train/stage_runner.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train/plugin_call.h"
#include "util/crash.h"
#include "util/error.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dt_stage_args_init(dt_stage_args_t *sa, const dt_settings_t *set, int32_t p,
                        const dt_model_desc_t *d, uint32_t n_micro)
{
    *sa = (dt_stage_args_t){.struct_size = sizeof *sa,
                            .n_stages = p,
                            .model = d,
                            .n_micro = n_micro,
                            .chunks = (uint32_t)set->pipeline.virtual_stages,
                            .keep_activations = set->pipeline.keep_activations ? 1u : 0u,
                            .balance = set->pipeline.balance};
}

int dt_stage_start(dt_stage_t *S, const dt_plugin_t *p, const dt_grid_t *grid)
{
    S->plugin = p;
    S->grid = grid;
    if (!(S->red = calloc(4 * (size_t)grid->pp + 1, sizeof *S->red)))
        return dt_err_set(DT_ERR_NOMEM, "pipeline: the bubble's %d stage slots", (int)grid->pp);
    S->wait = S->red + 1 + 2 * grid->pp;
    S->busy = S->wait + grid->pp;
    return DT_OK;
}

void dt_stage_free(dt_stage_t *S)
{
    if (S->sched)
        dt_schedule_ops(S->sched)->finalize(S->sched);
    free(S->red);
    free(S->slot_micro);
    memset(S, 0, sizeof *S);
}

/* ---- this rank's stage ---- */

/* A stage's units as a phrase: "units 0-2 (embedding .. block.1), 1.23M
 * parameters". */
static void stage_phrase(const dt_model_desc_t *d, uint32_t a, uint32_t b, char *out, size_t cap)
{
    uint64_t n = 0;
    for (uint32_t u = a; u < b; u++)
        n += d->units[u].numel;
    snprintf(out, cap, "units %u-%u (%s .. %s), %.3fM parameters", a, b - 1, d->units[a].name,
             d->units[b - 1].name, (double)n / 1e6);
}

int dt_stage_assign(dt_stage_t *S, dt_model_t *model, const dt_settings_t *set, int32_t world_rank,
                    uint8_t *flags, int *tied)
{
    dt_model_desc_t *d = dt_model_desc(model);
    const uint32_t nu = d->n_units;
    const int32_t pp = S->grid->pp, me = S->grid->pp_rank;
    const char *name = S->plugin->name;
    uint32_t *stage_of = calloc(nu, sizeof *stage_of);
    uint32_t *start = calloc((size_t)nu + 1, sizeof *start); /* per virtual stage */
    uint32_t *in_flight = calloc((size_t)pp, sizeof *in_flight);
    uint32_t *buffers = calloc((size_t)pp, sizeof *buffers);
    double *flops = calloc(nu, sizeof *flops);
    if (!stage_of || !start || !in_flight || !buffers || !flops) {
        free(stage_of);
        free(start);
        free(in_flight);
        free(buffers);
        free(flops);
        return dt_err_set(DT_ERR_NOMEM, "out of memory");
    }
    dt_model_unit_flops(model, set->train.seq_len, flops);
    for (int32_t k = 0; k < pp; k++)
        in_flight[k] = 1; /* a plugin that does not say: one, recompute the rest */
    const uint32_t n_micro = (uint32_t)set->train.grad_accum;
    dt_stage_args_t sa;
    dt_stage_args_init(&sa, set, pp, d, n_micro);
    sa.in_flight = in_flight;
    sa.buffers = buffers;
    sa.unit_flops = flops;
    const uint32_t V = sa.chunks;
    int rc = PLUGIN_CALL(
        S->plugin,
        ((const dt_schedule_ops_t *)S->plugin->ops)->assign_stages(S->plugin->host, &sa, stage_of),
        "assign_stages");
    free(flops);
    const uint32_t nv = (uint32_t)pp * V; /* virtual stages */
    if (!rc && (V < 1 || V > DT_MODEL_MAX_CHUNKS || nv > nu))
        rc = dt_err_set(DT_ERR_CONFIG,
                        "%s: pipeline.virtual_stages = %u chunks on each of %d stages (1 to %d, "
                        "at most %u virtual stages for the model's %u units)",
                        set->config_path, V, pp, DT_MODEL_MAX_CHUNKS, nu, nu);
    for (int32_t k = 0; !rc && k < pp; k++)
        if (in_flight[k] < 1 || in_flight[k] > n_micro)
            rc = dt_err_set(DT_ERR_INVALID,
                            "schedule plugin '%s': assign_stages keeps the activations of %u "
                            "micro-batches on stage %d (1 to the %u of a step)",
                            name, in_flight[k], k, n_micro);
    /* contiguous, 0 to nv - 1 in order, none empty */
    for (uint32_t u = 0; !rc && u < nu; u++) {
        uint32_t want_lo = u ? stage_of[u - 1] : 0, want_hi = u ? stage_of[u - 1] + 1 : 0;
        if (stage_of[u] < want_lo || stage_of[u] > want_hi ||
            (u == nu - 1 && stage_of[u] != nv - 1))
            rc = dt_err_set(DT_ERR_INVALID,
                            "schedule plugin '%s': assign_stages put unit %u in stage %u (stages "
                            "must be contiguous, 0 to %u in order, none empty)",
                            name, u, stage_of[u], nv - 1);
    }
    for (uint32_t u = 0, j = 0; !rc && j < nv; j++) {
        start[j] = u;
        while (u < nu && stage_of[u] == j)
            u++;
        start[j + 1] = u;
        const uint32_t k = j % (uint32_t)pp;
        if (world_rank == 0) {
            char ph[256];
            stage_phrase(d, start[j], u, ph, sizeof ph);
            if (V == 1)
                printf("pipeline: stage %u of %d: %s; keeps the activations of %u "
                       "micro-batch%s\n", j, pp, ph, in_flight[k], in_flight[k] == 1 ? "" : "es");
            else
                printf("pipeline: virtual stage %u of %u (stage %u, chunk %u): %s; keeps the "
                       "activations of %u micro-batch%s\n", j, nv, k, j / (uint32_t)pp, ph,
                       in_flight[k], in_flight[k] == 1 ? "" : "es");
        }
    }
    if (!rc) {
        S->n_chunks = V;
        for (uint32_t c = 0; c < V; c++) {
            S->chunk_first[c] = start[c * (uint32_t)pp + (uint32_t)me];
            S->chunk_end[c] = start[c * (uint32_t)pp + (uint32_t)me + 1];
        }
        S->n_slots = in_flight[me];
        S->n_boundary = buffers[me];
        memset(flags, 0, nu);
        for (uint32_t c = 0; c < V; c++)
            for (uint32_t u = S->chunk_first[c]; u < S->chunk_end[c]; u++)
                flags[u] = DT_UNIT_HELD;
        uint32_t t[4];
        uint32_t nt = dt_model_stage_tied(model, start[nv - 1], nu, t, 4);
        *tied = 0;
        for (uint32_t i = 0; i < nt && i < 4; i++) {
            if ((int32_t)(stage_of[t[i]] % (uint32_t)pp) == me)
                flags[t[i]] |= DT_UNIT_TIED;
            if (me == pp - 1)
                flags[t[i]] = DT_UNIT_HELD | DT_UNIT_TIED | DT_UNIT_COPY;
            *tied |= (flags[t[i]] & DT_UNIT_TIED) != 0;
        }
        if (world_rank == 0 && nt)
            printf("pipeline: the last stage holds a copy of unit %s (tied), its gradient summed "
                   "with stage %u's each step\n", d->units[t[0]].name,
                   stage_of[t[0]] % (uint32_t)pp);
        if (!(S->slot_micro = malloc((size_t)V * S->n_slots * sizeof *S->slot_micro)))
            rc = dt_err_set(DT_ERR_NOMEM, "out of memory");
    }
    free(stage_of);
    free(start);
    free(in_flight);
    free(buffers);
    return rc;
}

int dt_stage_init(dt_stage_t *S, const dt_settings_t *set, dt_device_t *dev, dt_stream_t *stream,
                  dt_comm_t *comm)
{
    dt_schedule_init_t a = {.struct_size = sizeof a,
                            .n_micro = (uint32_t)set->train.grad_accum,
                            .dev = dev,
                            .compute_stream = stream,
                            .comm = comm,
                            .chunks = S->n_chunks,
                            .keep_activations = set->pipeline.keep_activations ? 1u : 0u};
    const dt_schedule_ops_t *table = S->plugin->ops;
    int rc = PLUGIN_CALL(S->plugin, table->init(S->plugin->host, &a, &S->sched), "init");
    if (!rc && (rc = dt_plugin_check_instance(S->plugin, table, S->sched)))
        S->sched = NULL;
    return rc;
}

void dt_stage_bind(dt_stage_t *S, const dt_stage_env_t *env) { S->env = *env; }

/* ---- the runner: the core's side of the schedule's operations ---- */

/* One pass through the schedule, the runner's context. */
typedef struct stage_pass {
    dt_stage_t *S;
    int64_t step;
    uint32_t n_micro;
    float micro_scale;   /* the loss gradient's scale (1 / accumulation) */
    int eval;            /* forward only (hooks flagged no-grad) */
    int probe;           /* with eval: the step's training micro-batches (the
                          * non-finite search), not validation batches */
} stage_pass_t;

/* This rank's share (its data-parallel rank's) of micro-batch `micro`. */
static int stage_fill(const stage_pass_t *x, uint32_t micro)
{
    const dt_stage_env_t *E = &x->S->env;
    const dt_train_settings_t *t = &E->set->train;
    if (x->eval && !x->probe)
        return dt_data_eval_fill(E->val, (uint32_t)t->seq_len, (uint32_t)t->micro_batch, micro,
                                 (uint32_t)E->dp_rank, (uint32_t)E->dp, E->inputs, E->targets);
    return dt_sampler_fill(E->sampler, (uint64_t)(x->step - 1), micro, (uint32_t)E->dp_rank,
                           (uint32_t)E->dp, E->inputs, E->targets);
}

/* Micro-batch `micro`'s activation slot in chunk `chunk`, made the
 * model's: *slot indexes S->slot_micro (chunk c's slots are
 * [c x n_slots, (c + 1) x n_slots)). */
static int stage_slot(dt_stage_t *S, uint32_t chunk, uint32_t micro, uint32_t *slot)
{
    if (chunk >= S->n_chunks)
        return dt_err_set(DT_ERR_INVALID, "the schedule ran chunk %u of a stage of %u",
                          chunk, S->n_chunks);
    *slot = chunk * S->n_slots + micro % S->n_slots;
    return dt_model_use_slot(S->env.model, micro % S->n_slots);
}

/* "pipeline stage 1" or, interleaved, "pipeline stage 1, chunk 0 (virtual
 * stage 1)", for messages. */
static const char *stage_name(const dt_stage_t *S, uint32_t chunk, char *out, size_t cap)
{
    if (S->n_chunks == 1)
        snprintf(out, cap, "pipeline stage %d", S->grid->pp_rank);
    else
        snprintf(out, cap, "pipeline stage %d, chunk %u (virtual stage %u)", S->grid->pp_rank,
                 chunk, chunk * (uint32_t)S->grid->pp + (uint32_t)S->grid->pp_rank);
    return out;
}

static int stage_forward_of(stage_pass_t *x, uint32_t chunk, uint32_t micro, const void *in,
                            void *out, double *loss)
{
    dt_stage_t *S = x->S;
    dt_crash_set_micro(micro);
    uint32_t slot = 0;
    int rc = stage_slot(S, chunk, micro, &slot);
    if (rc)
        return rc;
    if (!(rc = stage_fill(x, micro)))
        rc = dt_model_stage_forward(S->env.model, S->env.ctx, S->chunk_first[chunk],
                                    S->chunk_end[chunk], S->env.inputs, S->env.targets, in, out,
                                    micro, x->n_micro, x->eval, loss);
    S->slot_micro[slot] = rc ? -1 : (int64_t)micro;
    return rc;
}

static int stage_forward(void *ctx, uint32_t chunk, uint32_t micro, const void *in, void *out,
                         double *loss)
{
    stage_pass_t *x = ctx;
    double l = 0;
    int rc = stage_forward_of(x, chunk, micro, in, out, &l);
    if (rc) {
        char sn[96];
        return dt_err_context(rc, "step %lld, micro-batch %u, forward of %s", (long long)x->step,
                              micro, stage_name(x->S, chunk, sn, sizeof sn));
    }
    *loss += l;
    return DT_OK;
}

#ifdef DTRAIN_TEST_HOOKS
void dt_fault_kill_at_backward(int64_t step, uint32_t micro)
{
    const char *v = getenv("DTRAIN_FAULT_KILL_AT_BACKWARD");
    long long s;
    unsigned m;
    if (v && sscanf(v, "%lld:%u", &s, &m) == 2 && s == step && m == micro)
        raise(SIGKILL);
}
#endif

/* The backward runs on the activations micro-batch `micro`'s forward left
 * in its slot; when another micro-batch's forward took the slot since (a
 * stage keeping fewer slots than it has micro-batches in flight), that
 * forward runs again from its input first. */
static int stage_backward(void *ctx, uint32_t chunk, uint32_t micro, const void *in,
                          const void *dout, void *din)
{
    stage_pass_t *x = ctx;
    dt_stage_t *S = x->S;
    double unused = 0;
    uint32_t slot = 0;
    char sn[96];
#ifdef DTRAIN_TEST_HOOKS
    dt_fault_kill_at_backward(x->step, micro);
#endif
    int rc = stage_slot(S, chunk, micro, &slot);
    if (!rc && S->slot_micro[slot] != (int64_t)micro) {
        if (!in && S->chunk_first[chunk] > 0)
            rc = dt_err_set(DT_ERR_INVALID,
                            "the schedule ran the backward of micro-batch %u, whose activations "
                            "slot %u of %u no longer holds, without its input to recompute them",
                            micro, slot % S->n_slots, S->n_slots);
        else
            rc = stage_forward_of(x, chunk, micro, in, NULL, &unused);
    }
    if (!rc)
        rc = dt_model_stage_backward(S->env.model, S->env.ctx, S->chunk_first[chunk],
                                     S->chunk_end[chunk], dout, din, micro, x->n_micro,
                                     x->micro_scale);
    if (rc)
        return dt_err_context(rc, "step %lld, micro-batch %u, backward of %s",
                              (long long)x->step, micro, stage_name(S, chunk, sn, sizeof sn));
    return DT_OK;
}

/* Pass x through the schedule (forwards only when x->eval), this rank's
 * stage as the runner, no slot holding anything of this pass yet. */
static int schedule_pass(stage_pass_t *x, dt_schedule_result_t *sr)
{
    dt_stage_t *S = x->S;
    dt_stage_runner_t rn = {.struct_size = sizeof rn, .act_slots = S->n_slots, .ctx = x,
                            .forward = stage_forward, .backward = stage_backward};
    dt_schedule_args_t sa = {.struct_size = sizeof sa, .n_micro = x->n_micro, .step = x->step,
                             .act_count = dt_model_boundary_count(S->env.model),
                             .act_dtype = dt_model_act_dtype(S->env.model),
                             .flags = x->eval ? DT_SCHEDULE_NO_GRAD : 0u, .runner = &rn};
    for (uint32_t i = 0; i < S->n_chunks * S->n_slots; i++)
        S->slot_micro[i] = -1;
    return PLUGIN_CALL(S->plugin, dt_schedule_ops(S->sched)->run(S->sched, &sa, sr), "run");
}

double dt_stage_idle_fraction(double busy, double span)
{
    return span > 0 ? 1.0 - busy / span : 0.0;
}

/* After a training pass's reduction: each stage's seconds made the mean
 * over the data-parallel replicas, and added to the run's totals. */
static void bubble_add(dt_stage_t *S)
{
    const int32_t pp = S->grid->pp;
    double *wait = S->red + 1, *wall = S->red + 1 + pp, span = 0;
    for (int32_t s = 0; s < pp; s++) {
        wait[s] /= (double)S->env.dp;
        wall[s] /= (double)S->env.dp;
        S->wait[s] += wait[s];
        S->busy[s] += wall[s] - wait[s];
        span = wall[s] > span ? wall[s] : span;
    }
    S->step_span = span;
    S->span += span;
}

int dt_stage_pass(dt_stage_t *S, int64_t step, uint32_t n_micro, float micro_scale, int eval,
                  double *loss)
{
    const dt_stage_env_t *E = &S->env;
    stage_pass_t x = {.S = S, .step = step, .n_micro = n_micro, .micro_scale = micro_scale,
                      .eval = eval};
    dt_schedule_result_t sr = {.struct_size = sizeof sr};
    double t0 = now_s();
    int rc = schedule_pass(&x, &sr);
    if (rc)
        return rc;
    /* the loss, and in a training pass the stages' measured bubble, in one
     * all-reduce (an evaluation's leaves the last training pass's) */
    const int32_t pp = S->grid->pp;
    const size_t n = eval ? 1 : 1 + 2 * (size_t)pp;
    memset(S->red, 0, n * sizeof *S->red);
    /* one rank of each tensor group speaks for it: its ranks hold the same
     * loss and ran the same schedule */
    if (S->grid->tp_rank == 0)
        S->red[0] = sr.n_loss ? sr.loss_sum / (double)sr.n_loss : 0.0;
    if (!eval && S->grid->tp_rank == 0) {
        S->red[1 + S->grid->pp_rank] = sr.recv_wait_s;
        S->red[1 + pp + S->grid->pp_rank] = now_s() - t0;
    }
    if ((rc = PLUGIN_CALL(E->pcomm,
                          dt_comm_ops(E->comm)->all_reduce(E->comm, S->red, S->red, n, DT_F64,
                                                           DT_OP_SUM, NULL, NULL),
                          "all_reduce of the loss")))
        return rc;
    *loss = S->red[0] / (double)E->dp;
    if (!eval)
        bubble_add(S);
    return DT_OK;
}

/* ---- the non-finite searches through the schedule ---- */

/* The search's answer from the rank that found it to every rank: `what`
 * (cap bytes, the same on every rank) broadcast from world rank `root`,
 * with its pipeline stage named. */
static int share_finding(dt_stage_t *S, int32_t root, char *what, size_t cap)
{
    const dt_stage_env_t *E = &S->env;
    int rc = PLUGIN_CALL(
        E->pcomm, dt_comm_ops(E->comm)->broadcast(E->comm, what, cap, DT_U8, root, NULL, NULL),
        "broadcast of the non-finite search's answer");
    if (rc)
        return rc;
    what[cap - 1] = 0; /* another rank's bytes: ended here whatever they hold */
    const size_t n = strlen(what);
    snprintf(what + n, cap - n, ", on pipeline stage %d", root / (S->grid->dp * S->grid->tp));
    return DT_OK;
}

/* One double over the world: *v = op(every rank's). */
static int world_reduce(dt_stage_t *S, double *v, int op, const char *what)
{
    const dt_stage_env_t *E = &S->env;
    return PLUGIN_CALL(
        E->pcomm, dt_comm_ops(E->comm)->all_reduce(E->comm, v, v, 1, DT_F64, op, NULL, NULL), what);
}

/* The latest stage that found one, of the lowest replica, names the first
 * non-finite gradient in backward order (dt_model_grad_probe_begin). */
int dt_stage_find_nonfinite_grad(dt_stage_t *S, int64_t step, double scale, char *what,
                                 size_t cap)
{
    const dt_stage_env_t *E = &S->env;
    const uint32_t accum = (uint32_t)E->set->train.grad_accum;
    int rc =
        PLUGIN_CALL(E->pstrat, dt_strategy_ops(E->strat)->begin_step(E->strat, step), "begin_step");
    if (!rc)
        rc = dt_model_grad_probe_begin(E->model, what, cap);
    if (rc)
        return rc;
    double loss = 0, largest = 0;
    rc = dt_stage_pass(S, step, accum, (float)(scale / (double)accum), 0, &loss);
    const int found = dt_model_grad_probe_end(E->model, &largest);
    if (rc)
        return rc;
    dt_step_args_t sa = {.struct_size = sizeof sa, .step = step, .loss_scale = (float)scale};
    dt_step_result_t sr = {.struct_size = sizeof sr};
    if ((rc = PLUGIN_CALL(E->pstrat, dt_strategy_ops(E->strat)->step(E->strat, &sa, &sr), "step")))
        return rc;
    const int32_t dp = S->grid->dp;
    double who = found ? (double)(S->grid->pp_rank * dp + (dp - 1 - S->grid->dp_rank)) : -1.0;
    if ((rc = world_reduce(S, &who, DT_OP_MAX, "all_reduce of the stage that found a "
                           "non-finite gradient")))
        return rc;
    if (who >= 0) {
        const int32_t k = (int32_t)who / dp, r = dp - 1 - (int32_t)who % dp;
        return share_finding(S, dt_grid_rank_at(S->grid, 0, k, r), what, cap);
    }
    /* all finite: the largest element, from the rank that saw it, said
     * of the whole step (the model's phrase speaks of one micro-batch) */
    const char *at = strstr(what, "; the largest: ");
    char buf[2048];
    snprintf(buf, sizeof buf, "none in the backward of this step's micro-batches on any "
             "pipeline stage (every parameter gradient is finite before the reduction): the "
             "reduction overflowed (a 16-bit reduce_dtype)%s", at ? at : "");
    size_t n = strlen(buf);
    n = n < cap ? n : cap - 1;
    memcpy(what, buf, n);
    what[n] = 0;
    double top = largest, owner;
    if ((rc = world_reduce(S, &top, DT_OP_MAX, "all_reduce of the largest gradient")))
        return rc;
    owner = largest == top ? (double)E->world_rank : (double)E->world_size;
    if ((rc = world_reduce(S, &owner, DT_OP_MIN, "all_reduce of the largest gradient's rank")))
        return rc;
    return share_finding(S, (int32_t)owner, what, cap);
}

/* The earliest stage that found one, of the lowest replica, names the
 * first non-finite tensor (dt_model_probe_begin). */
int dt_stage_find_nonfinite(dt_stage_t *S, int64_t step, char *what, size_t cap)
{
    const dt_stage_env_t *E = &S->env;
    stage_pass_t x = {.S = S, .step = step, .n_micro = (uint32_t)E->set->train.grad_accum,
                      .eval = 1, .probe = 1};
    dt_schedule_result_t sr = {.struct_size = sizeof sr};
    int rc = dt_model_probe_begin(E->model, what, cap);
    if (rc)
        return rc;
    rc = schedule_pass(&x, &sr);
    const int found = dt_model_probe_end(E->model);
    if (rc)
        return rc;
    const int32_t dp = S->grid->dp;
    const double none = (double)S->grid->pp * dp;
    double who = found ? (double)(S->grid->pp_rank * dp + S->grid->dp_rank) : none;
    if ((rc = world_reduce(S, &who, DT_OP_MIN, "all_reduce of the stage that found a "
                           "non-finite tensor")))
        return rc;
    if (who >= none) {
        snprintf(what, cap, "none in the forward of this step's micro-batches on any pipeline "
                 "stage (every parameter and activation is finite): the gradient went "
                 "non-finite in backward");
        return DT_OK;
    }
    const int32_t k = (int32_t)who / dp;
    return share_finding(S, dt_grid_rank_at(S->grid, 0, k, (int32_t)who % dp), what, cap);
}
