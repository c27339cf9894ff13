/*
 * core/util/crash.c - the crash handler and the record it reports from
 * (crash.h).  Everything the handler reads is written beforehand by
 * ordinary code: the "[rank R] " prefix, the loaded objects' address
 * ranges and labels, the plugin calls in progress (pointers to strings
 * that outlive them), the phase, step, micro-batch and unit.  The handler
 * formats integers itself and writes with write(2).
 */
#include "util/crash.h"

#include <errno.h>
#include <execinfo.h>
#include <link.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/error.h"

#define MAX_DEPTH 4
#define MAX_OBJECTS 16
#define MAX_FRAMES 64
#define ALT_STACK (256 * 1024)

/* ---- the record ---- */

typedef struct call {
    _Atomic(const char *) kind, name, method;
} call_t;

static call_t calls[MAX_DEPTH];
static atomic_int depth;                 /* calls in progress; may exceed MAX_DEPTH */
static _Atomic(const char *) phase;
static _Atomic int64_t step = 0, micro = -1, unit = -1;
static _Atomic(const char *) unit_name;

typedef struct object {
    uintptr_t lo, hi;   /* [lo, hi): its loaded segments */
    char label[96];     /* "strategy/zero" */
    char path[512];
} object_t;

static object_t objects[MAX_OBJECTS];
static atomic_int n_objects;
static char prefix[32];                  /* "[rank 3] " or "" */
static void *alt_stack;                  /* the handler's stack, for life */

#define RELAXED memory_order_relaxed

void dt_crash_set_phase(const char *ph, int64_t s)
{
    atomic_store_explicit(&phase, ph, RELAXED);
    atomic_store_explicit(&step, s, RELAXED);
    atomic_store_explicit(&micro, -1, RELAXED);
    atomic_store_explicit(&unit, -1, RELAXED);
}

void dt_crash_set_micro(int64_t m) { atomic_store_explicit(&micro, m, RELAXED); }

void dt_crash_set_unit(int64_t u, const char *name)
{
    atomic_store_explicit(&unit_name, name, RELAXED);
    atomic_store_explicit(&unit, u, RELAXED);
}

void dt_crash_where(dt_crash_where_t *out)
{
    out->phase = atomic_load_explicit(&phase, RELAXED);
    out->step = atomic_load_explicit(&step, RELAXED);
    out->micro = atomic_load_explicit(&micro, RELAXED);
    out->unit = atomic_load_explicit(&unit, RELAXED);
}

void dt_crash_enter(const char *kind, const char *name, const char *method)
{
    int d = atomic_load_explicit(&depth, RELAXED);
    if (d >= 0 && d < MAX_DEPTH) {
        atomic_store_explicit(&calls[d].kind, kind, RELAXED);
        atomic_store_explicit(&calls[d].name, name, RELAXED);
        atomic_store_explicit(&calls[d].method, method, RELAXED);
    }
    /* the frame is complete before the handler counts it (same thread) */
    atomic_signal_fence(memory_order_release);
    atomic_store_explicit(&depth, d + 1, RELAXED);
}

void dt_crash_leave(void)
{
    int d = atomic_load_explicit(&depth, RELAXED);
    if (d > 0)
        atomic_store_explicit(&depth, d - 1, RELAXED);
}

/* ---- loaded objects ---- */

typedef struct find {
    uintptr_t addr;
    object_t *o;
    int found;
} find_t;

static int find_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    find_t *f = data;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    int inside = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
        inside |= f->addr >= a && f->addr < b;
    }
    if (!inside)
        return 0;
    f->o->lo = lo;
    f->o->hi = hi;
    snprintf(f->o->path, sizeof f->o->path, "%s",
             info->dlpi_name && info->dlpi_name[0] ? info->dlpi_name : "?");
    f->found = 1;
    return 1;
}

void dt_crash_add_object(const char *kind, const char *name, const void *addr)
{
    int n = atomic_load(&n_objects);
    if (n >= MAX_OBJECTS || !addr)
        return;
    object_t *o = &objects[n];
    find_t f = {(uintptr_t)addr, o, 0};
    dl_iterate_phdr(find_object, &f);
    if (!f.found)
        return;
    snprintf(o->label, sizeof o->label, "%s/%s", kind ? kind : "?", name ? name : "?");
    atomic_store(&n_objects, n + 1);
}

/* ---- writing, async-signal-safe ---- */

typedef struct text {
    char buf[2048];
    size_t n;
} text_t;

static void put(text_t *t, const char *s)
{
    while (s && *s && t->n < sizeof t->buf - 1)
        t->buf[t->n++] = *s++;
}

static void put_u(text_t *t, uint64_t v, unsigned base)
{
    char d[24];
    int k = 0;
    do {
        d[k++] = "0123456789abcdef"[v % base];
        v /= base;
    } while (v && k < (int)sizeof d);
    if (base == 16)
        put(t, "0x");
    while (k > 0 && t->n < sizeof t->buf - 1)
        t->buf[t->n++] = d[--k];
}

static void put_i(text_t *t, int64_t v)
{
    if (v < 0) {
        put(t, "-");
        put_u(t, (uint64_t)(-(v + 1)) + 1, 10);
    } else {
        put_u(t, (uint64_t)v, 10);
    }
}

static void flush(text_t *t)
{
    size_t off = 0;
    while (off < t->n) {
        ssize_t w = write(2, t->buf + off, t->n - off);
        if (w > 0)
            off += (size_t)w;
        else if (!(w < 0 && errno == EINTR))
            break;
    }
    t->n = 0;
}

static const char *sig_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    default: return "signal";
    }
}

/* What si_code says, for the signals handled. */
static const char *code_name(int sig, int code)
{
    if (code <= 0)
        return "sent by a process";
    switch (sig) {
    case SIGSEGV:
        return code == SEGV_MAPERR ? "address not mapped"
               : code == SEGV_ACCERR ? "access not permitted" : "invalid access";
    case SIGBUS:
        return code == BUS_ADRALN ? "misaligned address"
               : code == BUS_ADRERR ? "nonexistent address, e.g. past the end of a mapped file"
               : code == BUS_OBJERR ? "hardware error" : "bus error";
    case SIGFPE:
        return code == FPE_INTDIV ? "integer divide by zero"
               : code == FPE_INTOVF ? "integer overflow"
               : code == FPE_FLTDIV ? "floating-point divide by zero"
               : code == FPE_FLTINV ? "invalid floating-point operation"
               : "arithmetic exception";
    case SIGILL:
        return code == ILL_ILLOPC ? "illegal opcode"
               : code == ILL_PRVOPC ? "privileged opcode" : "illegal instruction";
    default: return "?";
    }
}

static const object_t *object_at(uintptr_t pc)
{
    int n = atomic_load(&n_objects);
    for (int i = 0; i < n && i < MAX_OBJECTS; i++)
        if (pc >= objects[i].lo && pc < objects[i].hi)
            return &objects[i];
    return NULL;
}

static void put_call(text_t *t, int i)
{
    put(t, atomic_load_explicit(&calls[i].kind, RELAXED));
    put(t, "/");
    put(t, atomic_load_explicit(&calls[i].name, RELAXED));
    put(t, " ");
    put(t, atomic_load_explicit(&calls[i].method, RELAXED));
}

static void on_crash(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    int saved = errno;
    text_t t = {.n = 0};
    void *bt[MAX_FRAMES];
    int n = backtrace(bt, MAX_FRAMES);
    put(&t, prefix);
    put(&t, DT_CRASH_PREFIX "backtrace (innermost first):\n");
    flush(&t);
    for (int i = 0; i < n; i++) {
        put(&t, prefix);
        put(&t, "  #");
        put_u(&t, (uint64_t)i, 10);
        put(&t, " ");
        flush(&t);
        backtrace_symbols_fd(&bt[i], 1, 2);
    }

    /* the summary, last: the launcher quotes a failed rank's last line */
    put(&t, prefix);
    put(&t, DT_CRASH_PREFIX);
    put(&t, sig_name(sig));
    put(&t, " (");
    put(&t, code_name(sig, si ? si->si_code : 0));
    if (si && si->si_code > 0) {
        put(&t, ": ");
        put_u(&t, (uint64_t)(uintptr_t)si->si_addr, 16);
    }
    put(&t, ")");
    int d = atomic_load_explicit(&depth, RELAXED);
    if (d > 0) {
        int in = (d < MAX_DEPTH ? d : MAX_DEPTH) - 1;
        put(&t, " in ");
        put_call(&t, in);
        for (int i = in - 1; i >= 0; i--) {
            put(&t, i == in - 1 ? " (inside " : ", inside ");
            put_call(&t, i);
            put(&t, i == 0 ? ")" : "");
        }
    } else if (atomic_load_explicit(&calls[0].kind, RELAXED)) {
        put(&t, " in the core, between plugin calls (the last, ");
        put_call(&t, 0);
        put(&t, ", had returned)");
    } else {
        put(&t, " in the core, before any plugin call");
    }
    const char *ph = atomic_load_explicit(&phase, RELAXED);
    int64_t s = atomic_load_explicit(&step, RELAXED), m = atomic_load_explicit(&micro, RELAXED);
    int64_t u = atomic_load_explicit(&unit, RELAXED);
    if (s > 0) {
        put(&t, ", at step ");
        put_i(&t, s);
        if (m >= 0) {
            put(&t, ", micro-batch ");
            put_i(&t, m);
        }
    }
    if (u >= 0) { /* before any step too: loading a checkpoint goes unit by unit */
        put(&t, s > 0 ? ", unit " : ", at unit ");
        put_i(&t, u);
        put(&t, " (");
        put(&t, atomic_load_explicit(&unit_name, RELAXED));
        put(&t, ")");
    }
    if (ph) {
        put(&t, ", ");
        put(&t, ph);
    }
    /* the innermost frame inside a plugin (frames 0-1 are this handler
     * and the signal trampoline, never a plugin's) */
    const object_t *o = NULL;
    for (int i = 0; i < n && !o; i++)
        o = object_at((uintptr_t)bt[i]);
    if (o) {
        put(&t, "; the faulting code is in ");
        put(&t, o->label);
        put(&t, " (");
        put(&t, o->path);
        put(&t, ")");
    }
    put(&t, "; pid ");
    put_u(&t, (uint64_t)getpid(), 10);
    put(&t, "\n");
    flush(&t);
    errno = saved;
    /* the disposition is the default again (SA_RESETHAND): the signal,
     * pending until this returns, ends the process as it would have */
    raise(sig);
}

int dt_crash_install(int rank)
{
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    static int installed;
    if (installed)
        return DT_OK;
    prefix[0] = '\0';
    if (rank >= 0) {
        text_t t = {.n = 0};
        put(&t, "[rank ");
        put_i(&t, rank);
        put(&t, "] ");
        memcpy(prefix, t.buf, t.n < sizeof prefix - 1 ? t.n : sizeof prefix - 1);
    }
    /* backtrace() loads libgcc_s's unwinder on first use: not in the
     * handler, where dlopen is unsafe */
    void *warm[2];
    (void)backtrace(warm, 2);
    if (!alt_stack && !(alt_stack = malloc(ALT_STACK)))
        return dt_err_set(DT_ERR_NOMEM, "crash handler: out of memory for its stack");
    stack_t ss = {.ss_sp = alt_stack, .ss_size = ALT_STACK, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0)
        return dt_err_set(DT_ERR_SYSTEM, "crash handler: sigaltstack: %s", strerror(errno));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_crash;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        if (sigaction(sigs[i], &sa, NULL) != 0)
            return dt_err_set(DT_ERR_SYSTEM, "crash handler: sigaction(%s): %s",
                              sig_name(sigs[i]), strerror(errno));
    installed = 1;
    return DT_OK;
}
