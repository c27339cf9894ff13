/*
 * core/train/plugin_call.h - PLUGIN_CALL, how the training run calls into
 * a plugin: the error buffer cleared first, the crash handler told which
 * plugin and method it is in (util/crash.h), a failure prefixed with the
 * plugin's kind and name.  Shared by train.c and stage_runner.c.
 */
#ifndef DT_TRAIN_PLUGIN_CALL_H
#define DT_TRAIN_PLUGIN_CALL_H

#include "loader/loader.h"
#include "loader/plugin_handle.h"
#include "util/crash.h"
#include "util/error.h"

static inline int dt_plugin_call_rc(const dt_plugin_t *p, int rc, const char *what)
{
    dt_crash_leave();
    return rc ? dt_plugin_failed(p, rc, what) : DT_OK;
}

/* Call into plugin `p`: the error buffer is cleared first, so a plugin
 * that fails without a message is reported as such, never with a stale
 * message from earlier; a crash inside it is reported naming it and
 * `what` (util/crash.h). */
#define PLUGIN_CALL(p, call, what)                                                             \
    (dt_err_clear(), dt_crash_enter(dt_kind_name((p)->kind), (p)->name, (what)),               \
     dt_plugin_call_rc((p), (call), (what)))

#endif /* DT_TRAIN_PLUGIN_CALL_H */
