/*
 * plugins/shard/shard_home.c - where the shard lives, when it lives on
 * the device: the dt_shard_home_t slots over the engine's device buffers
 * (the compute shard or replica, the f32 master, the gradient shard or
 * full gradients, the moments).  Gather sends the compute shard as it is,
 * a reduced block is added into the gradient shard, the norm sums the
 * gradient buffer by the norm plan, the optimizer updates every held
 * range on the device and the compute copy is cast from the master.
 *
 * The engine fills e->home with these at init and lets the offload tier
 * (shard_offload.c) take over the slots of what offload_what names; the
 * callers never ask which.
 */
#include "shard_internal.h"

static int no_load(dt_shard_engine_t *e, uint32_t gi)
{
    (void)e;
    (void)gi;
    return DT_OK;
}

static int load(dt_shard_engine_t *e, uint32_t gi, const void **send)
{
    *send = shard_cshard(e, gi);
    return DT_OK;
}

static int grads_buffer(dt_shard_engine_t *e, uint32_t gi, float **out)
{
    return shard_alloc_zeroed(e, e->plan.groups[gi].padded, DT_F32, DT_TAG_COMM,
                              "a group's gradient buffer", (void **)out);
}

/* On the stream the reduction ran on: the block into the gradient shard. */
static int grads_add(dt_shard_engine_t *e, uint32_t gi, const float *block, dt_stream_t *stream,
                     int whole)
{
    const int64_t n = (int64_t)e->plan.groups[gi].shard;
    if (whole)
        return dt_device_ops(e->dp.dev)->memcpy_async(e->dp.dev, shard_gshard(e, gi), block,
                                           (uint64_t)n * sizeof(float), DT_COPY_D2D, stream);
    return e->dp.kernels->axpy(e->dp.dev, stream, shard_gshard(e, gi), block, DT_F32, 1.0f, n);
}

static int grads_end(dt_shard_engine_t *e)
{
    (void)e;
    return DT_OK;
}

static int grads_sumsq(dt_shard_engine_t *e, double *out)
{
    return dt_norm_plan_sumsq(e->dp.host, e->dp.dev, e->dp.cs, e->norm_slot,
                              e->gfull ? e->gfull : e->gshard, &e->norm, out);
}

/* The compute copy from the f32 master (bf16/f16 parameters; f32 ones
 * are the master itself). */
static int publish(dt_shard_engine_t *e, const char *when)
{
    if (e->pdtype == DT_F32)
        return DT_OK;
    const dt_device_ops_v1_t *d = dt_device_ops(e->dp.dev);
    int rc = DT_OK;
    if (e->replica) {
        for (uint32_t i = 0; rc == DT_OK && i < e->plan.n_groups; i++)
            rc = d->kernels()->cast(e->dp.dev, e->dp.cs, shard_cshard(e, i), e->pdtype,
                                    shard_master(e, i), DT_F32, (int64_t)e->plan.groups[i].shard);
    } else {
        rc = d->kernels()->cast(e->dp.dev, e->dp.cs, e->cshard, e->pdtype, e->master, DT_F32,
                                (int64_t)e->plan.shard_total);
    }
    if (rc != DT_OK)
        e->dp.host->log(e->dp.host, DT_LOG_ERROR, "%s: refreshing the %s parameters failed",
                        when, dt_dtype_name(e->pdtype));
    return rc;
}

/* The update of every unit's held part, tensor by tensor (dt_optim_range
 * applies each tensor's weight decay even where the shard cuts it), then
 * the compute copy from the master (e->home.publish: a tier's when the
 * parameters live there). */
static int update(dt_shard_engine_t *e, const dt_optim_step_t *st)
{
    for (uint32_t u = 0; u < e->dp.model->n_units; u++) {
        uint64_t off;
        dt_range_t r = dt_shard_held(&e->plan, u, e->srank, &off);
        if (r.count == 0)
            continue;
        uint32_t gi = e->plan.group_of_unit[u];
        uint64_t local = off - e->plan.groups[gi].shard_off;
        int rc = dt_optim_range(e->dp.host, e->dp.dev, e->dp.cs,
                                &e->dp.model->units[u], r, shard_master(e, gi) + local,
                                shard_gshard(e, gi) + local, e->m + off,
                                e->v ? e->v + off : NULL, st);
        if (rc != DT_OK)
            return rc;
    }
    return e->home.publish(e, "step");
}

/* State `kind` of `unit` at shard buffer element `at` on the device. */
static float *state_at(dt_shard_engine_t *e, uint32_t unit, int kind, dt_range_t r, uint64_t at)
{
    static float none; /* any valid pointer: nothing is copied */
    if (r.count == 0)
        return &none;
    uint32_t gi = e->plan.group_of_unit[unit];
    switch (kind) {
    case DT_STATE_PARAMS:
        return shard_master(e, gi) + (at - e->plan.groups[gi].shard_off);
    case DT_STATE_EXP_AVG: return e->m + at;
    default: return e->v + at;
    }
}

static int state_get(dt_shard_engine_t *e, uint32_t unit, int kind, dt_range_t r, uint64_t at,
                     float *buf)
{
    return dt_dp_state_copy(&e->dp, unit, kind, r, buf, state_at(e, unit, kind, r, at),
                            DT_COPY_D2H, "get_state");
}

static int state_set(dt_shard_engine_t *e, uint32_t unit, int kind, dt_range_t r, uint64_t at,
                     const float *buf)
{
    return dt_dp_state_copy(&e->dp, unit, kind, r, state_at(e, unit, kind, r, at), buf,
                            DT_COPY_H2D, "set_state");
}

void shard_home_device(dt_shard_home_t *h)
{
    *h = (dt_shard_home_t){
        .load_ahead = no_load, .load = load, .load_wait = no_load,
        .grads_buffer = grads_buffer, .grads_add = grads_add, .grads_end = grads_end,
        .grads_sumsq = grads_sumsq, .update = update, .publish = publish,
        .state_get = state_get, .state_set = state_set};
}
