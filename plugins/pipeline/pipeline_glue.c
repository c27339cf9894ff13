/*
 * plugins/pipeline/pipeline_glue.c - the slots every shipped schedule
 * plugin's table points at (PP_SCHEDULE_PLUGIN in pipeline.h): init and
 * finalize over the pipeline group, and assign_stages, which checks the
 * core's layout settings ([pipeline] virtual_stages, keep_activations,
 * balance) against the step and the model, maps units to stages and says
 * what each stage keeps.  A schedule holds no parameters: the data
 * strategy of each stage does (schedule.h).
 */
#include <stdio.h>
#include <string.h>

#include "pipeline.h"

static const char *sched_name(int schedule)
{
    return schedule == PP_SCHED_GPIPE ? "gpipe" : "1f1b";
}

/* What an interleaved layout needs of the step: every chunk's activations
 * kept (its inputs are not stashed), and whole groups of p micro-batches
 * (Megatron's order). */
static int check_chunks(const dt_host_v1_t *host, uint32_t V, uint32_t keep, int32_t p,
                        uint32_t m)
{
    if (V < 1 || V > PP_MAX_CHUNKS)
        return host->set_error(host, DT_ERR_CONFIG, "pipeline.virtual_stages = %u: 1 to %d "
                               "chunks a stage", V, PP_MAX_CHUNKS);
    if (V == 1)
        return DT_OK;
    if (!keep)
        return host->set_error(host, DT_ERR_CONFIG,
                               "pipeline.virtual_stages = %u needs pipeline.keep_activations "
                               "= true: an "
                               "interleaved stage keeps every chunk's activations rather than "
                               "stash each chunk's inputs to recompute them",
                               V);
    if (m % (uint32_t)p != 0)
        return host->set_error(host, DT_ERR_CONFIG,
                               "pipeline.virtual_stages = %u needs the micro-batches of a step "
                               "([train] "
                               "grad_accum = %u) to be a multiple of the %d stages",
                               V, m, p);
    return DT_OK;
}

void pp_finalize(dt_schedule_t *s)
{
    if (!s)
        return;
    pp_free_buffers(s);
    if (s->act_comm)
        dt_comm_ops(s->act_comm)->finalize(s->act_comm);
    if (s->grad_comm)
        dt_comm_ops(s->grad_comm)->finalize(s->grad_comm);
    s->host->free(s->host, s);
}

int pp_init(const dt_host_v1_t *host, const dt_schedule_ops_v1_t *ops, int schedule,
            const dt_schedule_init_v1_t *in, dt_schedule_t **out)
{
    *out = NULL;
    dt_schedule_init_v1_t a;
    int rc = dt_args_read(host, "init args", &a, sizeof a, in, DT_SCHEDULE_INIT_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a.dev || !a.comm)
        return host->set_error(host, DT_ERR_INVALID, "init: NULL %s", !a.dev ? "dev" : "comm");
    dt_schedule_t *s = host->alloc(host, sizeof *s, DT_TAG_OTHER);
    if (!s)
        return host->set_error(host, DT_ERR_NOMEM, "init: instance");
    memset(s, 0, sizeof *s);
    s->ops = ops;
    s->host = host;
    s->dev = a.dev;
    s->cs = a.compute_stream;
    s->comm = a.comm;
    s->n_micro = a.n_micro;
    s->schedule = schedule;
    s->keep = a.keep_activations != 0;
    s->V = a.chunks ? a.chunks : 1;
    if ((rc = dt_comm_ops(a.comm)->rank_size(a.comm, &s->stage, &s->n_stages)) == DT_OK &&
        s->n_stages < 2)
        rc = host->set_error(host, DT_ERR_INVALID, "init: a pipeline group of %d rank(s)",
                             s->n_stages);
    if (rc == DT_OK)
        rc = check_chunks(host, s->V, (uint32_t)s->keep, s->n_stages, s->n_micro);
    /* interleaved: activations and gradients on a group each (pipeline.h) */
    if (rc == DT_OK && s->V > 1 &&
        ((rc = dt_comm_ops(a.comm)->split(a.comm, 0, s->stage, &s->act_comm)) != DT_OK ||
         (rc = dt_comm_ops(a.comm)->split(a.comm, 0, s->stage, &s->grad_comm)) != DT_OK))
        s->host->log(host, DT_LOG_ERROR, "init: splitting the pipeline group failed");
    if (rc != DT_OK) {
        pp_finalize(s);
        return rc;
    }
    host->log(host, DT_LOG_DEBUG, "stage %d of %d, schedule %s, %u chunk(s)", s->stage,
              s->n_stages, sched_name(schedule), s->V);
    *out = s;
    return DT_OK;
}

int pp_assign_stages(const dt_host_v1_t *host, int schedule, const dt_stage_args_v1_t *in,
                     uint32_t *out)
{
    dt_stage_args_v1_t a;
    int rc = dt_args_read(host, "assign_stages args", &a, sizeof a, in, DT_STAGE_ARGS_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (!a.model || !out)
        return host->set_error(host, DT_ERR_INVALID, "assign_stages: NULL %s",
                               !a.model ? "model" : "out");
    if (a.n_stages < 2)
        return host->set_error(host, DT_ERR_INVALID, "assign_stages: %d stage(s)", a.n_stages);
    if (a.balance < DT_BALANCE_UNIFORM || a.balance > DT_BALANCE_FLOPS)
        return host->set_error(host, DT_ERR_UNSUPPORTED, "assign_stages: balance policy %d",
                               (int)a.balance);
    const uint32_t V = a.chunks ? a.chunks : 1;
    if ((rc = check_chunks(host, V, a.keep_activations, a.n_stages, a.n_micro)) != DT_OK)
        return rc;
    if (V > 1 && (uint64_t)a.n_stages * V > a.model->n_units)
        return host->set_error(host, DT_ERR_CONFIG,
                               "parallel.pipeline = %d stages x pipeline.virtual_stages = %u "
                               "chunks, but "
                               "model %s has %u units (each chunk needs at least one)",
                               a.n_stages, V, a.model->arch ? a.model->arch : "?",
                               a.model->n_units);
    for (int32_t k = 0; k < a.n_stages; k++) {
        const uint32_t most = pp_order_in_flight(host, schedule, V, k, a.n_stages, a.n_micro);
        if (most == 0)
            return host->set_error(host, DT_ERR_NOMEM, "assign_stages: the order of stage %d",
                                   k);
        const uint32_t n_stash = pp_stash((int)a.keep_activations, most);
        if (a.stash) /* a receive buffer (or the stash) per chunk that receives */
            a.stash[k] = (V - (k == 0 ? 1 : 0)) * n_stash;
        if (a.buffers)
            a.buffers[k] = pp_buffers(V, k, a.n_stages, a.n_micro, n_stash);
        if (a.in_flight)
            a.in_flight[k] = a.keep_activations ? most : 1;
    }
    return pp_assign(host, a.model, a.n_stages * (int32_t)V, a.balance, a.unit_flops, out);
}
