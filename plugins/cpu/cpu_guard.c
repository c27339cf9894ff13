/*
 * plugins/cpu/cpu_guard.c - `[cpu] guard_memory = true`: device memory the
 * host cannot touch outside the device's own kernels and copies, as on a
 * GPU, so that host code in the core, a strategy or a tier that reads or
 * writes device memory directly faults on the cpu device too (SIGSEGV),
 * in CI, instead of only on a GPU machine.  This file holds the memory
 * (an arena) and the kernel table the plugin hands out, whose entries open
 * the arena around every kernel.
 *
 * The arena.  One range of address space reserved PROT_NONE at init
 * (MAP_NORESERVE: address space only, no memory, no commit charge), from
 * whose front every device allocation (alloc, and the plugin's scratch)
 * takes whole pages, first fit over a sorted list of free runs; a freed
 * run is given back to the kernel (MADV_DONTNEED) and to the list.  One
 * range rather than one mapping per allocation: opening or closing the
 * memory is one mprotect of the used front [base, base + used) whatever
 * the number of allocations.  A host access to closed memory is a SIGSEGV
 * whose crash report (core/util/crash.c) gives the address ("invalid
 * permissions") and the plugin call, step and unit it happened in.  Pinned
 * host memory (host_alloc) is host memory on a GPU too and stays plain.
 *
 * Open and closed.  The used front is PROT_NONE but while one of the
 * device's kernels, copies or memsets runs: each opens it on entry and
 * closes it on return, counted (`opened`, under mem_mu) because calls may
 * overlap from several threads (an offload tier's copy thread beside the
 * training loop's kernels); the front is closed when the last one leaves.
 * While memory is open, a host access from another thread goes unseen:
 * the check catches what a one-threaded run does and most of the rest.
 *
 * What a GPU also refuses, checked here too, since a cpu kernel would
 * happily run on it: every pointer a kernel is given must be this
 * device's memory (a GPU's kernel faults on a host pointer), and every
 * copy's kind must say where its buffers are (H2D: host to device, and so
 * on) - both with a DT_ERR_INVALID naming the call and the argument.
 *
 * Cost.  Without guard_memory a kernel call goes through its entry here,
 * which tests one flag and jumps to the kernel (a tail call); with it,
 * two mprotect calls a kernel, whose time grows with the pages in use:
 * a mode for tests with small models (README "Device memory the host
 * cannot touch").
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_internal.h"

static uint64_t page_size(void)
{
    static uint64_t ps;
    if (!ps) {
        long p = sysconf(_SC_PAGESIZE);
        ps = p > 0 ? (uint64_t)p : 4096;
    }
    return ps;
}

/* Bytes of pages holding `bytes` (at least one page: a zero-byte block
 * still gets a unique address). */
static uint64_t pages_for(uint64_t bytes)
{
    uint64_t ps = page_size();
    return bytes ? (bytes + ps - 1) / ps * ps : ps;
}

/* --------------------------------------------------------------- arena */

int cpu_guard_init(dt_device_t *d)
{
    cpu_arena_t *a = &d->arena;
    /* twice the memory the device reports, and a GiB: room for page
     * rounding and for the free list's fragments */
    uint64_t want = d->total_memory ? d->total_memory : ((uint64_t)1 << 34);
    want = want > ((uint64_t)1 << 43) ? ((uint64_t)1 << 44) : 2 * want + ((uint64_t)1 << 30);
    want = pages_for(want);
    void *p = mmap(NULL, (size_t)want, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return d->host->set_error(d->host, DT_ERR_SYSTEM,
                                  "guard_memory: reserving %" PRIu64 " bytes of address "
                                  "space for device memory: %s", want, strerror(errno));
    *a = (cpu_arena_t){.base = p, .reserved = want};
    return DT_OK;
}

void cpu_guard_fini(dt_device_t *d)
{
    cpu_arena_t *a = &d->arena;
    if (!a->base)
        return;
    munmap(a->base, (size_t)a->reserved);
    free(a->runs);
    *a = (cpu_arena_t){0};
}

/* Protection of [off, off + len) of the arena: open (read-write) or
 * closed. */
static int protect(cpu_arena_t *a, uint64_t off, uint64_t len, int open)
{
    if (!len)
        return 0;
    return mprotect(a->base + off, (size_t)len, open ? PROT_READ | PROT_WRITE : PROT_NONE);
}

/* Index of the first free run at or after `off`. */
static uint64_t run_at(const cpu_arena_t *a, uint64_t off)
{
    uint64_t lo = 0, hi = a->nruns;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (a->runs[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void run_remove(cpu_arena_t *a, uint64_t i)
{
    memmove(&a->runs[i], &a->runs[i + 1], (size_t)(a->nruns - i - 1) * sizeof a->runs[0]);
    a->nruns--;
}

/* Called with mem_mu held. */
int cpu_guard_take(dt_device_t *d, uint64_t bytes, void **out)
{
    cpu_arena_t *a = &d->arena;
    uint64_t len = pages_for(bytes);
    for (uint64_t i = 0; i < a->nruns; i++) {
        cpu_run_t *r = &a->runs[i];
        if (r->len < len)
            continue;
        *out = a->base + r->off; /* inside the front: already as open as it */
        r->off += len;
        r->len -= len;
        if (!r->len)
            run_remove(a, i);
        return 0;
    }
    if (len > a->reserved - a->used)
        return ENOMEM;
    /* a new piece of the front takes the front's state */
    if (protect(a, a->used, len, a->opened > 0) != 0)
        return errno;
    *out = a->base + a->used;
    a->used += len;
    return 0;
}

/* Called with mem_mu held; `p` came from cpu_guard_take(bytes). */
void cpu_guard_give(dt_device_t *d, void *p, uint64_t bytes)
{
    cpu_arena_t *a = &d->arena;
    uint64_t off = (uint64_t)((char *)p - a->base), len = pages_for(bytes);
    /* the pages go back to the system; the range stays reserved */
    (void)madvise(p, (size_t)len, MADV_DONTNEED);
    uint64_t i = run_at(a, off);
    int join_prev = i > 0 && a->runs[i - 1].off + a->runs[i - 1].len == off;
    int join_next = i < a->nruns && off + len == a->runs[i].off;
    if (join_prev && join_next) {
        a->runs[i - 1].len += len + a->runs[i].len;
        run_remove(a, i);
        i--;
    } else if (join_prev) {
        a->runs[--i].len += len;
    } else if (join_next) {
        a->runs[i].off = off;
        a->runs[i].len += len;
    } else {
        if (a->nruns == a->cap) {
            uint64_t cap = a->cap ? 2 * a->cap : 64;
            cpu_run_t *runs = realloc(a->runs, (size_t)cap * sizeof *runs);
            if (!runs) /* the run is lost to reuse, not to correctness */
                return;
            a->runs = runs;
            a->cap = cap;
        }
        memmove(&a->runs[i + 1], &a->runs[i], (size_t)(a->nruns - i) * sizeof a->runs[0]);
        a->runs[i] = (cpu_run_t){off, len};
        a->nruns++;
    }
    /* a free run at the end of the front shortens it (what lies past the
     * front is set again when taken) */
    if (a->runs[i].off + a->runs[i].len == a->used && i + 1 == a->nruns) {
        a->used = a->runs[i].off;
        run_remove(a, i);
    }
}

int cpu_guard_owns(const dt_device_t *d, const void *p)
{
    const cpu_arena_t *a = &d->arena;
    return (const char *)p >= a->base && (const char *)p < a->base + a->reserved;
}

/* Whether [p, p + bytes) is device memory (1), host memory (0), or
 * straddles the two (-1). */
static int range_kind(const dt_device_t *d, const void *p, uint64_t bytes)
{
    int first = cpu_guard_owns(d, p);
    int last = cpu_guard_owns(d, (const char *)p + (bytes ? bytes - 1 : 0));
    return first == last ? first : -1;
}

int cpu_guard_check_copy(dt_device_t *d, const char *op, const void *dst,
                         const void *src, uint64_t bytes, int kind)
{
    static const char *const kinds[] = {"H2D", "D2H", "D2D", "H2H"};
    const int want_dst = kind == DT_COPY_H2D || kind == DT_COPY_D2D;
    const int want_src = kind == DT_COPY_D2H || kind == DT_COPY_D2D;
    const void *ptr[2] = {dst, src};
    const int want[2] = {want_dst, want_src};
    for (int i = 0; i < 2; i++) {
        if (!ptr[i])
            continue;
        int k = range_kind(d, ptr[i], bytes);
        if (k == want[i])
            continue;
        const char *is = k < 0 ? "runs out of this device's memory"
                               : k ? "is this device's memory" : "is host memory";
        char says[64];
        if (src)
            snprintf(says, sizeof says, "the copy's kind %s says %s memory", kinds[kind],
                     want[i] ? "device" : "host");
        else
            snprintf(says, sizeof says, "a memset takes device memory");
        return CPU_INVALID(d, "%s: %s = %p (%" PRIu64 " bytes) %s, but %s: a GPU refuses "
                              "it ([cpu] guard_memory)",
                           op, i ? "src" : "dst", ptr[i], bytes, is, says);
    }
    return DT_OK;
}

int cpu_guard_open(dt_device_t *d, const char *op)
{
    cpu_arena_t *a = &d->arena;
    pthread_mutex_lock(&d->mem_mu);
    int e = a->opened == 0 ? protect(a, 0, a->used, 1) : 0;
    if (e == 0)
        a->opened++;
    else
        e = errno;
    pthread_mutex_unlock(&d->mem_mu);
    if (e)
        return d->host->set_error(d->host, DT_ERR_SYSTEM, "%s: guard_memory: opening device "
                                  "memory: mprotect: %s", op, strerror(e));
    return DT_OK;
}

int cpu_guard_close(dt_device_t *d, const char *op)
{
    cpu_arena_t *a = &d->arena;
    pthread_mutex_lock(&d->mem_mu);
    int e = a->opened == 1 ? protect(a, 0, a->used, 0) : 0;
    if (e != 0)
        e = errno;
    a->opened--; /* still counted down: the next open retries */
    pthread_mutex_unlock(&d->mem_mu);
    if (e)
        return d->host->set_error(d->host, DT_ERR_SYSTEM, "%s: guard_memory: closing device "
                                  "memory: mprotect: %s", op, strerror(e));
    return DT_OK;
}

/* ------------------------------------------------------- kernel table */

/* Each kernel's device pointers must be this device's memory; `names` is
 * the list as written in CPU_GUARDED ("(out, inp, weight, bias)"). */
static int check_pointers(dt_device_t *d, const char *op, const char *names,
                          const void *const *ptrs, int n)
{
    for (int i = 0; i < n; i++) {
        if (!ptrs[i] || cpu_guard_owns(d, ptrs[i]))
            continue;
        const char *p = names + 1; /* past "(" */
        for (int k = 0; k < i; k++)
            p = strchr(p, ',') + 2;
        int len = (int)strcspn(p, ",)");
        return CPU_INVALID(d, "%s: %.*s = %p is not this device's memory: a GPU's "
                              "kernel faults on host memory ([cpu] guard_memory)",
                           op, len, p, ptrs[i]);
    }
    return DT_OK;
}

/* guard_<kernel>: the table's entry.  Without guard_memory a tail call to
 * cpu_<kernel>; with it the pointer checks, then the kernel between
 * open and close.  PARAMS and ARGS are the ABI's parameter list and the
 * same names as arguments; PTRS the device pointers among them. */
#define CPU_GUARDED(name, params, args, ptrs)                                  \
    static int guard_##name params                                             \
    {                                                                          \
        if (!d || !d->guard)                                                   \
            return cpu_##name args;                                            \
        const void *const ptrs_[] = {DT_UNPAREN ptrs};                         \
        int rc = check_pointers(d, #name, #ptrs, ptrs_,                        \
                                (int)(sizeof ptrs_ / sizeof ptrs_[0]));        \
        if (rc == DT_OK)                                                       \
            rc = cpu_guard_open(d, #name);                                     \
        if (rc != DT_OK)                                                       \
            return rc;                                                         \
        rc = cpu_##name args;                                                  \
        int rc2 = cpu_guard_close(d, #name);                                   \
        return rc != DT_OK ? rc : rc2;                                         \
    }
#define DT_UNPAREN(...) __VA_ARGS__

CPU_GUARDED(matmul_forward,
            (dt_device_t *d, dt_stream_t *s, void *out, const void *inp,
             const void *weight, const void *bias, int dtype, int wdtype,
             int64_t N, int64_t C, int64_t OC),
            (d, s, out, inp, weight, bias, dtype, wdtype, N, C, OC),
            (out, inp, weight, bias))
CPU_GUARDED(matmul_backward,
            (dt_device_t *d, dt_stream_t *s, void *dinp, float *dweight,
             float *dbias, const void *dout, const void *inp,
             const void *weight, int dtype, int wdtype, int64_t N, int64_t C,
             int64_t OC),
            (d, s, dinp, dweight, dbias, dout, inp, weight, dtype, wdtype, N,
             C, OC),
            (dinp, dweight, dbias, dout, inp, weight))
CPU_GUARDED(embedding_forward,
            (dt_device_t *d, dt_stream_t *s, void *out, const int32_t *tokens,
             const void *wte, const void *wpe, int dtype, int64_t B,
             int64_t T, int64_t C),
            (d, s, out, tokens, wte, wpe, dtype, B, T, C),
            (out, tokens, wte, wpe))
CPU_GUARDED(embedding_backward,
            (dt_device_t *d, dt_stream_t *s, float *dwte, float *dwpe,
             const void *dout, const int32_t *tokens, int dtype, int64_t B,
             int64_t T, int64_t C),
            (d, s, dwte, dwpe, dout, tokens, dtype, B, T, C),
            (dwte, dwpe, dout, tokens))
CPU_GUARDED(gelu_forward,
            (dt_device_t *d, dt_stream_t *s, void *out, const void *inp,
             int dtype, int64_t n),
            (d, s, out, inp, dtype, n), (out, inp))
CPU_GUARDED(gelu_backward,
            (dt_device_t *d, dt_stream_t *s, void *dinp, const void *inp,
             const void *dout, int dtype, int64_t n),
            (d, s, dinp, inp, dout, dtype, n), (dinp, inp, dout))
CPU_GUARDED(softmax_xent_forward,
            (dt_device_t *d, dt_stream_t *s, float *losses, void *probs,
             const void *logits, const int32_t *targets, int dtype, int64_t N,
             int64_t V),
            (d, s, losses, probs, logits, targets, dtype, N, V),
            (losses, probs, logits, targets))
CPU_GUARDED(softmax_xent_backward,
            (dt_device_t *d, dt_stream_t *s, void *dlogits, const void *probs,
             const int32_t *targets, int dtype, float dloss, int64_t N,
             int64_t V),
            (d, s, dlogits, probs, targets, dtype, dloss, N, V),
            (dlogits, probs, targets))
CPU_GUARDED(axpy,
            (dt_device_t *d, dt_stream_t *s, void *y, const void *x, int dtype,
             float alpha, int64_t n),
            (d, s, y, x, dtype, alpha, n), (y, x))
CPU_GUARDED(sumsq,
            (dt_device_t *d, dt_stream_t *s, double *out, const void *x,
             int dtype, int64_t n),
            (d, s, out, x, dtype, n), (out, x))
CPU_GUARDED(cast,
            (dt_device_t *d, dt_stream_t *s, void *dst, int dst_dtype,
             const void *src, int src_dtype, int64_t n),
            (d, s, dst, dst_dtype, src, src_dtype, n), (dst, src))
CPU_GUARDED(layernorm_forward,
            (dt_device_t *d, dt_stream_t *s, void *out, float *mean,
             float *rstd, const void *inp, const void *weight,
             const void *bias, int dtype, int64_t N, int64_t C),
            (d, s, out, mean, rstd, inp, weight, bias, dtype, N, C),
            (out, mean, rstd, inp, weight, bias))
CPU_GUARDED(layernorm_backward,
            (dt_device_t *d, dt_stream_t *s, void *dinp, float *dweight,
             float *dbias, const void *dout, const void *inp,
             const void *weight, const float *mean, const float *rstd,
             int dtype, int64_t N, int64_t C),
            (d, s, dinp, dweight, dbias, dout, inp, weight, mean, rstd, dtype,
             N, C),
            (dinp, dweight, dbias, dout, inp, weight, mean, rstd))
CPU_GUARDED(attention_forward,
            (dt_device_t *d, dt_stream_t *s, void *out, void *state,
             const void *qkv, int dtype, int64_t B, int64_t T, int64_t C,
             int64_t NH),
            (d, s, out, state, qkv, dtype, B, T, C, NH), (out, state, qkv))
CPU_GUARDED(attention_backward,
            (dt_device_t *d, dt_stream_t *s, void *dqkv, const void *dout,
             const void *qkv, const void *out, const void *state, int dtype,
             int64_t B, int64_t T, int64_t C, int64_t NH),
            (d, s, dqkv, dout, qkv, out, state, dtype, B, T, C, NH),
            (dqkv, dout, qkv, out, state))
CPU_GUARDED(residual_forward,
            (dt_device_t *d, dt_stream_t *s, void *out, const void *a,
             const void *b, int dtype, int64_t n),
            (d, s, out, a, b, dtype, n), (out, a, b))
CPU_GUARDED(scale,
            (dt_device_t *d, dt_stream_t *s, void *x, int dtype, float alpha,
             int64_t n),
            (d, s, x, dtype, alpha, n), (x))
CPU_GUARDED(adamw_update,
            (dt_device_t *d, dt_stream_t *s, float *param, const void *grad,
             float *m, float *v, int grad_dtype, int64_t n, float lr,
             float beta1, float beta2, float eps, float weight_decay,
             float grad_scale, int64_t t),
            (d, s, param, grad, m, v, grad_dtype, n, lr, beta1, beta2, eps,
             weight_decay, grad_scale, t),
            (param, grad, m, v))
CPU_GUARDED(sgd_update,
            (dt_device_t *d, dt_stream_t *s, float *param, const void *grad,
             float *mom, int grad_dtype, int64_t n, float lr, float momentum,
             float weight_decay, int nesterov, float grad_scale),
            (d, s, param, grad, mom, grad_dtype, n, lr, momentum, weight_decay,
             nesterov, grad_scale),
            (param, grad, mom))
CPU_GUARDED(vocab_embedding_forward,
            (dt_device_t *d, dt_stream_t *s, void *out, const int32_t *tokens,
             const void *wte, const void *wpe, int dtype, int64_t B,
             int64_t T, int64_t C, int64_t v0, int64_t nv),
            (d, s, out, tokens, wte, wpe, dtype, B, T, C, v0, nv),
            (out, tokens, wte, wpe))
CPU_GUARDED(vocab_embedding_backward,
            (dt_device_t *d, dt_stream_t *s, float *dwte, float *dwpe,
             const void *dout, const int32_t *tokens, int dtype, int64_t B,
             int64_t T, int64_t C, int64_t v0, int64_t nv),
            (d, s, dwte, dwpe, dout, tokens, dtype, B, T, C, v0, nv),
            (dwte, dwpe, dout, tokens))
CPU_GUARDED(vocab_xent_forward,
            (dt_device_t *d, dt_stream_t *s, int phase, float *stats,
             float *losses, void *probs, const void *logits,
             const int32_t *targets, int dtype, int64_t N, int64_t v0,
             int64_t nv),
            (d, s, phase, stats, losses, probs, logits, targets, dtype, N, v0,
             nv),
            (stats, losses, probs, logits, targets))
CPU_GUARDED(vocab_xent_backward,
            (dt_device_t *d, dt_stream_t *s, void *dlogits, const void *probs,
             const int32_t *targets, int dtype, float dloss, int64_t N,
             int64_t v0, int64_t nv),
            (d, s, dlogits, probs, targets, dtype, dloss, N, v0, nv),
            (dlogits, probs, targets))
CPU_GUARDED(rmsnorm_forward,
            (dt_device_t *d, dt_stream_t *s, void *out, float *rstd,
             const void *inp, const void *weight, int dtype, int64_t N,
             int64_t C, float eps),
            (d, s, out, rstd, inp, weight, dtype, N, C, eps),
            (out, rstd, inp, weight))
CPU_GUARDED(rmsnorm_backward,
            (dt_device_t *d, dt_stream_t *s, void *dinp, float *dweight,
             const void *dout, const void *inp, const void *weight,
             const float *rstd, int dtype, int64_t N, int64_t C),
            (d, s, dinp, dweight, dout, inp, weight, rstd, dtype, N, C),
            (dinp, dweight, dout, inp, weight, rstd))
CPU_GUARDED(rope_forward,
            (dt_device_t *d, dt_stream_t *s, void *out, const void *inp,
             const float *cos, const float *sin, int dtype, int64_t B,
             int64_t T, int64_t NH, int64_t HD, int64_t ld),
            (d, s, out, inp, cos, sin, dtype, B, T, NH, HD, ld),
            (out, inp, cos, sin))
CPU_GUARDED(rope_backward,
            (dt_device_t *d, dt_stream_t *s, void *dinp, const void *dout,
             const float *cos, const float *sin, int dtype, int64_t B,
             int64_t T, int64_t NH, int64_t HD, int64_t ld),
            (d, s, dinp, dout, cos, sin, dtype, B, T, NH, HD, ld),
            (dinp, dout, cos, sin))
CPU_GUARDED(swiglu_forward,
            (dt_device_t *d, dt_stream_t *s, void *out, const void *inp,
             int dtype, int64_t N, int64_t H),
            (d, s, out, inp, dtype, N, H), (out, inp))
CPU_GUARDED(swiglu_backward,
            (dt_device_t *d, dt_stream_t *s, void *dinp, const void *inp,
             const void *dout, int dtype, int64_t N, int64_t H),
            (d, s, dinp, inp, dout, dtype, N, H), (dinp, inp, dout))
CPU_GUARDED(gqa_attention_forward,
            (dt_device_t *d, dt_stream_t *s, void *out, void *state,
             const void *qkv, int dtype, int64_t B, int64_t T, int64_t NH,
             int64_t NKV, int64_t HD),
            (d, s, out, state, qkv, dtype, B, T, NH, NKV, HD),
            (out, state, qkv))
CPU_GUARDED(gqa_attention_backward,
            (dt_device_t *d, dt_stream_t *s, void *dqkv, const void *dout,
             const void *qkv, const void *out, const void *state, int dtype,
             int64_t B, int64_t T, int64_t NH, int64_t NKV, int64_t HD),
            (d, s, dqkv, dout, qkv, out, state, dtype, B, T, NH, NKV, HD),
            (dqkv, dout, qkv, out, state))

/* Every kernel the ABI has: the core set and all the optional ones. */
static const dt_kernels_v1_t cpu_kernels = {
    .info = DT_KERNELS_INFO(dt_kernels_v1_t),
    .matmul_forward = guard_matmul_forward,
    .matmul_backward = guard_matmul_backward,
    .embedding_forward = guard_embedding_forward,
    .embedding_backward = guard_embedding_backward,
    .gelu_forward = guard_gelu_forward,
    .gelu_backward = guard_gelu_backward,
    .softmax_xent_forward = guard_softmax_xent_forward,
    .softmax_xent_backward = guard_softmax_xent_backward,
    .axpy = guard_axpy,
    .sumsq = guard_sumsq,
    .cast = guard_cast,
    .layernorm_forward = guard_layernorm_forward,
    .layernorm_backward = guard_layernorm_backward,
    .attention_state_bytes = cpu_attention_state_bytes, /* no instance, no memory */
    .attention_forward = guard_attention_forward,
    .attention_backward = guard_attention_backward,
    .residual_forward = guard_residual_forward,
    .scale = guard_scale,
    .adamw_update = guard_adamw_update,
    .sgd_update = guard_sgd_update,
    .vocab_embedding_forward = guard_vocab_embedding_forward,
    .vocab_embedding_backward = guard_vocab_embedding_backward,
    .vocab_xent_forward = guard_vocab_xent_forward,
    .vocab_xent_backward = guard_vocab_xent_backward,
    .rmsnorm_forward = guard_rmsnorm_forward,
    .rmsnorm_backward = guard_rmsnorm_backward,
    .rope_forward = guard_rope_forward,
    .rope_backward = guard_rope_backward,
    .swiglu_forward = guard_swiglu_forward,
    .swiglu_backward = guard_swiglu_backward,
    .gqa_attention_forward = guard_gqa_attention_forward,
    .gqa_attention_backward = guard_gqa_attention_backward,
};

/* One table for every instance (the ABI: the same pointer on every call,
 * asked before any instance exists); its entries look at the instance. */
const dt_kernels_v1_t *cpu_kernel_table(void) { return &cpu_kernels; }
