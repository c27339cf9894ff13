/*
 * core/util/crash.h - what a rank was doing when it crashed.
 *
 * A rank killed by SIGSEGV, SIGBUS, SIGFPE or SIGILL prints, before it
 * dies of the signal as it would have (exit status and core dump
 * unchanged), a report on stderr:
 *
 *   [rank 1] crash: backtrace (innermost first):
 *   [rank 1]   #0 /…/dtrain(+0x5e2f1)[0x55d0…]
 *   [rank 1]   #1 /lib/x86_64-linux-gnu/libc.so.6(+0x3c050)[0x7f…]
 *   [rank 1]   #2 /…/dtrain_crashy.so(+0x1a2b)[0x7f…]
 *   …
 *   [rank 1] crash: SIGSEGV (address not mapped: 0x0) in strategy/crashy
 *   post_backward, at step 3, micro-batch 1, unit 2 (block.1), training;
 *   the faulting code is in strategy/crashy (/…/dtrain_crashy.so); pid 4242
 *
 * (one line; the summary comes last so the launcher's "its last error
 * line" quotes it).  The core keeps a record of the plugin call in
 * progress, the step, micro-batch and unit as it goes (a few stores of
 * pointers and integers: cheap enough for every hook), and the handler
 * only reads it and writes preformatted text with write(2): it is
 * async-signal-safe but for glibc's backtrace(), whose unwinder
 * (libgcc_s) dt_crash_install loads beforehand, and backtrace_symbols_fd.
 *
 * The record is the core's view: a call a plugin makes to another plugin
 * (a strategy's all-reduce through the comm) shows as the strategy's
 * method; the backtrace and "the faulting code is in" (the innermost
 * frame inside a loaded plugin, from address ranges taken when the
 * plugins were registered) name the other one.  The record is
 * process-wide, written by the thread that drives training, so a crash
 * on a plugin's worker thread still reports the call that thread serves.
 */
#ifndef DT_CORE_CRASH_H
#define DT_CORE_CRASH_H

#include <stdint.h>

/* How the report's lines begin after "[rank R] ": the launcher recognises
 * a crashed rank's summary by it. */
#define DT_CRASH_PREFIX "crash: "

/* Install the handler for SIGSEGV, SIGBUS, SIGFPE and SIGILL, on an
 * alternate stack for the calling thread (a stack overflow of the thread
 * that drives training is reported too; other threads' faults run the
 * handler on their own stacks) for rank `rank`
 * (< 0: no "[rank R] " prefix).  Once per process; DT_OK or DT_ERR_SYSTEM
 * with the message set.  The process's own program (the CLI) decides: a
 * library embedding dtrain keeps its signal handlers. */
int dt_crash_install(int rank);

/* Name the loaded object that contains `addr` (a plugin's ops table) as
 * "kind/name" in reports.  Up to 16 objects; more are ignored. */
void dt_crash_add_object(const char *kind, const char *name, const void *addr);

/* The context: `phase` a static string ("training", "evaluation",
 * "checkpoint save", "checkpoint load", "state initialisation"); step 0,
 * micro-batch or unit < 0: none (a unit is reported before any step too:
 * "at unit 1 (block.0), checkpoint load").  `unit_name` must outlive the
 * run (the model's unit names). */
void dt_crash_set_phase(const char *phase, int64_t step);
void dt_crash_set_micro(int64_t micro);
void dt_crash_set_unit(int64_t unit, const char *unit_name);

/* The context as the setters above left it, for others that report where
 * the run was (the collective ledger, core/interpose/ledger.h): four
 * relaxed loads, cheap enough for every collective.  phase NULL and step 0
 * before any; micro and unit -1 when none. */
typedef struct dt_crash_where {
    const char *phase;
    int64_t step, micro, unit;
} dt_crash_where_t;
void dt_crash_where(dt_crash_where_t *out);

/* A call into plugin kind/name, method `method` begins / has returned.
 * Calls nest (a record of 4); the strings must outlive the call (a
 * plugin's name, string literals).  After the call the record keeps it
 * as "the last call", reported as returned. */
void dt_crash_enter(const char *kind, const char *name, const char *method);
void dt_crash_leave(void);

#endif /* DT_CORE_CRASH_H */
