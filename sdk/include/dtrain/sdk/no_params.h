/*
 * dtrain/sdk/no_params.h - the mandatory slots of a strategy that holds no
 * parameters (a model-parallel strategy: the pipeline's, the tensor
 * group's), for its ops table.  Each rank's data strategy holds that
 * rank's parameters; a unit hook, a step or a state call reaching such a
 * strategy is a mistake of its caller, refused with a message saying
 * whose job it is.
 *
 *     DT_NO_PARAMS_SLOTS(tp, "the tensor strategy", s->host)
 *     ... .begin_step = tp_begin_step, .pre_forward = tp_pre_forward, ...
 *
 * defines static tp_begin_step (nothing to do), tp_pre_forward,
 * tp_post_forward, tp_pre_backward, tp_post_backward, tp_step,
 * tp_get_state, tp_set_state (each DT_ERR_INVALID: "<what>: the tensor
 * strategy holds no parameters (the rank's data strategy does)"),
 * tp_state_ranges (no range: nothing is saved) and tp_state_loaded
 * (nothing to rebuild).  HOST is an expression of the instance `s`
 * giving its host table.  DT_NO_PARAMS_ESTIMATE(tp, "words") defines
 * tp_estimate, a plan of nothing held.  Header-only.
 */
#ifndef DTRAIN_SDK_NO_PARAMS_H
#define DTRAIN_SDK_NO_PARAMS_H

#include "dtrain/strategy.h"

#define DT_NO_PARAMS_SLOTS(P, WHO, HOST)                                                       \
    static int P##_holds_none(dt_strategy_t *s, const char *what)                              \
    {                                                                                          \
        return (HOST)->set_error((HOST), DT_ERR_INVALID,                                       \
                                 "%s: " WHO " holds no parameters (the rank's data strategy "  \
                                 "does)",                                                      \
                                 what);                                                        \
    }                                                                                          \
    static int P##_begin_step(dt_strategy_t *s, int64_t step)                                  \
    {                                                                                          \
        (void)s;                                                                               \
        (void)step;                                                                            \
        return DT_OK;                                                                          \
    }                                                                                          \
    static int P##_pre_forward(dt_strategy_t *s, const dt_hook_v1_t *h,                        \
                               dt_unit_buffers_v1_t *o)                                        \
    {                                                                                          \
        (void)h;                                                                               \
        (void)o;                                                                               \
        return P##_holds_none(s, "pre_forward");                                               \
    }                                                                                          \
    static int P##_post_forward(dt_strategy_t *s, const dt_hook_v1_t *h)                       \
    {                                                                                          \
        (void)h;                                                                               \
        return P##_holds_none(s, "post_forward");                                              \
    }                                                                                          \
    static int P##_pre_backward(dt_strategy_t *s, const dt_hook_v1_t *h,                       \
                                dt_unit_buffers_v1_t *o)                                       \
    {                                                                                          \
        (void)h;                                                                               \
        (void)o;                                                                               \
        return P##_holds_none(s, "pre_backward");                                              \
    }                                                                                          \
    static int P##_post_backward(dt_strategy_t *s, const dt_hook_v1_t *h)                      \
    {                                                                                          \
        (void)h;                                                                               \
        return P##_holds_none(s, "post_backward");                                             \
    }                                                                                          \
    static int P##_step(dt_strategy_t *s, const dt_step_args_v1_t *a, dt_step_result_v1_t *o)  \
    {                                                                                          \
        (void)a;                                                                               \
        (void)o;                                                                               \
        return P##_holds_none(s, "step");                                                      \
    }                                                                                          \
    static int P##_state_ranges(dt_strategy_t *s, uint32_t unit, int kind, int purpose,        \
                                dt_range_t *out, uint32_t cap, uint32_t *n)                    \
    {                                                                                          \
        (void)s;                                                                               \
        (void)unit;                                                                            \
        (void)kind;                                                                            \
        (void)purpose;                                                                         \
        (void)out;                                                                             \
        (void)cap;                                                                             \
        *n = 0; /* nothing held, nothing saved */                                              \
        return DT_OK;                                                                          \
    }                                                                                          \
    static int P##_get_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,          \
                             float *buf)                                                       \
    {                                                                                          \
        (void)unit;                                                                            \
        (void)kind;                                                                            \
        (void)r;                                                                               \
        (void)buf;                                                                             \
        return P##_holds_none(s, "get_state");                                                 \
    }                                                                                          \
    static int P##_set_state(dt_strategy_t *s, uint32_t unit, int kind, dt_range_t r,          \
                             const float *buf)                                                 \
    {                                                                                          \
        (void)unit;                                                                            \
        (void)kind;                                                                            \
        (void)r;                                                                               \
        (void)buf;                                                                             \
        return P##_holds_none(s, "set_state");                                                 \
    }                                                                                          \
    static int P##_state_loaded(dt_strategy_t *s)                                              \
    {                                                                                          \
        (void)s;                                                                               \
        return DT_OK;                                                                          \
    }

/* In such a strategy's init: the group and its operations are given, and
 * none of the data strategy's stage fields (unit_flags, norm_comm,
 * tied_comm) is; `who` names the strategy in the message. */
static inline int dt_no_params_init_check(const dt_host_v1_t *host,
                                          const dt_strategy_init_v1_t *a, const char *who)
{
    if (!a->comm_ops || !a->comm)
        return host->set_error(host, DT_ERR_INVALID, "init: NULL %s",
                               !a->comm_ops ? "comm_ops" : "comm");
    if (a->unit_flags || a->norm_comm || a->tied_comm)
        return host->set_error(host, DT_ERR_INVALID,
                               "init: %s holds no units (unit_flags, norm_comm and tied_comm "
                               "are the data strategy's)",
                               who);
    return DT_OK;
}

/* P##_estimate, the planner's: nothing held (every tag 0, nothing sent by
 * the data strategy's rows), with NOTE as the row's words.  Needs
 * dtrain/abi.h's dt_args_read and dt_result_write, and <string.h>,
 * <stdio.h>. */
#define DT_NO_PARAMS_ESTIMATE(P, NOTE)                                                         \
    static int P##_estimate(const dt_host_v1_t *host, const dt_estimate_args_v1_t *in,         \
                            dt_estimate_v1_t *res)                                             \
    {                                                                                          \
        dt_estimate_args_v1_t a;                                                               \
        int rc = dt_args_read(host, "estimate args", &a, sizeof a, in,                         \
                              DT_ESTIMATE_ARGS_V1_SIZE0);                                      \
        if (rc != DT_OK)                                                                       \
            return rc;                                                                         \
        dt_estimate_v1_t e;                                                                    \
        memset(&e, 0, sizeof e);                                                               \
        e.struct_size = sizeof e;                                                              \
        e.n_tags = DT_TAG_COUNT;                                                               \
        snprintf(e.note, sizeof e.note, "%s", NOTE);                                           \
        return dt_result_write(host, "estimate", res, &e, sizeof e, DT_ESTIMATE_V1_SIZE0);     \
    }

#endif /* DTRAIN_SDK_NO_PARAMS_H */
