/*
 * tests/unit/plugins/nccl/test_nccl_logic.c - the nccl communicator's decisions that
 * need no GPU (plugins/nccl/nccl_logic.h, compiled in), so that the CI's
 * machines without one check them:
 *
 *  - how NCCL carries every dtype in every operation: the seven NCCL
 *    types, u16 as bytes where nothing is computed and refused where it
 *    is, an unknown dtype refused;
 *  - what memory a pointer is, given a fake cudaPointerGetAttributes:
 *    pageable and pinned host memory are staged, this GPU's and managed
 *    memory go to NCCL, another GPU's and an unanswerable pointer are
 *    refused (naming the GPU / the error), NULL is never asked about;
 *    send and recv refuse host memory;
 *  - the staging plan of every collective, in place and out of place,
 *    root and not, host and device halves, against a simulation: N ranks'
 *    host buffers go through the plan's copies and bounce regions, a
 *    reference collective runs on the bounce regions, and each rank's
 *    buffers must hold what the collective on the host buffers gives;
 *  - the failure record and the lock: the first reason wins; abort
 *    applies at once when the lock is free; with the lock held by a
 *    thread that sleeps, abort returns at once and the holder applies it
 *    when it lets go; a poll under the lock stops within a nap of an
 *    abort from another thread; concurrent aborts apply once; and, over
 *    many rounds of a holder locking and unlocking while another thread
 *    aborts, no abort is ever lost (the Dekker pair).
 *
 * Without NCCL in the build it exits 77 (skipped).
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#if defined(DT_TEST_HAVE_NCCL)
#include "nccl/nccl_logic.h"
#include "dtrain/dtrain.h"
#include "common/comm/comm_text.h"

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ dtypes */

static const int all_kinds[] = {DT_COMM_OP_ALL_REDUCE, DT_COMM_OP_REDUCE_SCATTER,
                                DT_COMM_OP_ALL_GATHER, DT_COMM_OP_BROADCAST,
                                DT_COMM_OP_REDUCE,     DT_COMM_OP_SEND,
                                DT_COMM_OP_RECV};

static int moves_only(int kind)
{
    return kind == DT_COMM_OP_ALL_GATHER || kind == DT_COMM_OP_BROADCAST ||
           kind == DT_COMM_OP_SEND || kind == DT_COMM_OP_RECV;
}

static void test_wire_types(void **state)
{
    (void)state;
    static const struct {
        int dt;
        ncclDataType_t nt;
    } native[] = {{DT_F32, ncclFloat32}, {DT_BF16, ncclBfloat16}, {DT_F16, ncclFloat16},
                  {DT_F64, ncclFloat64}, {DT_I32, ncclInt32},     {DT_I64, ncclInt64},
                  {DT_U8, ncclUint8}};
    for (size_t k = 0; k < sizeof all_kinds / sizeof *all_kinds; k++)
        for (size_t i = 0; i < sizeof native / sizeof *native; i++) {
            ncclDataType_t nt = ncclNumTypes;
            uint64_t n = 0;
            assert_int_equal(nccl_wire(all_kinds[k], native[i].dt, 37, &nt, &n), 1);
            assert_int_equal(nt, native[i].nt);
            assert_int_equal(n, 37);
        }
    /* u16: bytes where nothing is computed, refused where it would be */
    for (size_t k = 0; k < sizeof all_kinds / sizeof *all_kinds; k++) {
        ncclDataType_t nt = ncclNumTypes;
        uint64_t n = 0;
        int ok = nccl_wire(all_kinds[k], DT_U16, 37, &nt, &n);
        assert_int_equal(ok, moves_only(all_kinds[k]));
        if (ok) {
            assert_int_equal(nt, ncclUint8);
            assert_int_equal(n, 74);
        }
    }
    ncclDataType_t nt;
    uint64_t n;
    assert_int_equal(nccl_wire(DT_COMM_OP_ALL_GATHER, DT_DTYPE_COUNT, 1, &nt, &n), 0);
    assert_int_equal(nccl_wire(DT_COMM_OP_ALL_GATHER, -1, 1, &nt, &n), 0);
}

/* Every dtype the ABI knows is carried by the operations that only move
 * data, with the same bytes (a dtype added to tensor.h without a line
 * here fails this). */
static void test_wire_covers_every_dtype(void **state)
{
    (void)state;
    static const size_t nccl_size[ncclNumTypes] = {
        [ncclInt8] = 1, [ncclUint8] = 1, [ncclInt32] = 4, [ncclUint32] = 4,
        [ncclInt64] = 8, [ncclUint64] = 8, [ncclFloat16] = 2, [ncclFloat32] = 4,
        [ncclFloat64] = 8, [ncclBfloat16] = 2};
    for (int dt = 0; dt < DT_DTYPE_COUNT; dt++) {
        ncclDataType_t nt = ncclNumTypes;
        uint64_t n = 0;
        assert_int_equal(nccl_wire(DT_COMM_OP_BROADCAST, dt, 100, &nt, &n), 1);
        assert_true(nt < ncclNumTypes);
        assert_int_equal(n * nccl_size[nt], 100 * dt_dtype_size(dt));
    }
}

/* ------------------------------------------------------------ memory */

/* A fake pointer-attribute query: pointers in [dev0, dev0 + 4096) are
 * GPU 0's, [dev1, ...) GPU 1's, [pinned, ...) pinned, [managed, ...)
 * managed, `bad` gives an error, anything else is pageable. */
static char dev0[4096], dev1[4096], pinned[4096], managed[4096], bad[16];
static int attr_calls;

static int in(const void *p, const char *base, size_t n)
{
    return (const char *)p >= base && (const char *)p < base + n;
}

static cudaError_t fake_attr(struct cudaPointerAttributes *a, const void *p)
{
    attr_calls++;
    memset(a, 0, sizeof *a);
    a->device = -1;
    if (in(p, dev0, sizeof dev0)) {
        a->type = cudaMemoryTypeDevice;
        a->device = 0;
    } else if (in(p, dev1, sizeof dev1)) {
        a->type = cudaMemoryTypeDevice;
        a->device = 1;
    } else if (in(p, pinned, sizeof pinned)) {
        a->type = cudaMemoryTypeHost;
        a->device = 0;
    } else if (in(p, managed, sizeof managed)) {
        a->type = cudaMemoryTypeManaged;
        a->device = 0;
    } else if (in(p, bad, sizeof bad)) {
        return cudaErrorInvalidValue;
    } else {
        a->type = cudaMemoryTypeUnregistered;
    }
    return cudaSuccess;
}

static void test_mem_of(void **state)
{
    (void)state;
    int stack_var = 0, where = 7;
    cudaError_t err = cudaErrorUnknown;
    void *heap = malloc(64);
    attr_calls = 0;
    assert_int_equal(nccl_mem_of(fake_attr, NULL, 0, &where, &err), NCCL_MEM_NONE);
    assert_int_equal(attr_calls, 0); /* NULL is never asked about */
    assert_int_equal(where, -1);
    assert_int_equal(err, cudaSuccess);
    assert_int_equal(nccl_mem_of(fake_attr, &stack_var, 0, &where, &err), NCCL_MEM_HOST);
    assert_int_equal(nccl_mem_of(fake_attr, heap, 0, NULL, NULL), NCCL_MEM_HOST);
    assert_int_equal(nccl_mem_of(fake_attr, pinned + 8, 0, &where, &err), NCCL_MEM_HOST);
    assert_int_equal(nccl_mem_of(fake_attr, managed, 1, &where, &err), NCCL_MEM_DEVICE);
    assert_int_equal(nccl_mem_of(fake_attr, dev0 + 100, 0, &where, &err), NCCL_MEM_DEVICE);
    assert_int_equal(where, 0);
    assert_int_equal(nccl_mem_of(fake_attr, dev1, 0, &where, &err), NCCL_MEM_OTHER_GPU);
    assert_int_equal(where, 1);
    assert_int_equal(nccl_mem_of(fake_attr, dev1, 1, &where, &err), NCCL_MEM_DEVICE);
    assert_int_equal(nccl_mem_of(fake_attr, bad, 0, &where, &err), NCCL_MEM_UNKNOWN);
    assert_int_equal(err, cudaErrorInvalidValue);
    assert_int_equal(where, -1);
    free(heap);
}

static void test_mem_allowed(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof all_kinds / sizeof *all_kinds; k++) {
        int kind = all_kinds[k];
        int p2p = kind == DT_COMM_OP_SEND || kind == DT_COMM_OP_RECV;
        assert_int_equal(nccl_mem_allowed(kind, NCCL_MEM_NONE), DT_OK);
        assert_int_equal(nccl_mem_allowed(kind, NCCL_MEM_DEVICE), DT_OK);
        assert_int_equal(nccl_mem_allowed(kind, NCCL_MEM_HOST),
                         p2p ? DT_ERR_UNSUPPORTED : DT_OK);
        assert_int_equal(nccl_mem_allowed(kind, NCCL_MEM_OTHER_GPU), DT_ERR_INVALID);
        assert_int_equal(nccl_mem_allowed(kind, NCCL_MEM_UNKNOWN), DT_ERR_INVALID);
    }
}

/* ------------------------------------------------------------ staging */

#define SIM_RANKS 3
#define SIM_COUNT 5 /* elements of i32 per count argument */
#define SIM_ALL (SIM_COUNT * SIM_RANKS)

/* One rank of the simulation: its host buffers (one region holds both
 * when the caller passes them aliased), the bounce regions, and what the
 * plugin would hand NCCL. */
typedef struct sim_rank {
    int32_t region[2 * SIM_ALL + 8]; /* the caller's memory */
    const int32_t *send;
    int32_t *recv;
    unsigned char dev[4 * SIM_ALL * 4 + 1024]; /* the device bounce buffer */
    unsigned char pinned[4 * SIM_ALL * 4];
    const int32_t *wsend; /* what NCCL is given */
    int32_t *wrecv;
    nccl_stage_plan_t plan;
    int staged;
} sim_rank_t;

/* The reference collective over `n` ranks' buffers (i32 sum); `sends` and
 * `recvs` are the buffers as each rank passes them. */
static void ref_collective(int kind, int root, const int32_t *const sends[SIM_RANKS],
                           int32_t *const recvs[SIM_RANKS], int32_t out[SIM_RANKS][SIM_ALL])
{
    /* what a rank's recv holds where the collective writes nothing */
    memset(out, 0, sizeof(int32_t) * SIM_RANKS * SIM_ALL);
    const int n = kind == DT_COMM_OP_ALL_GATHER ? SIM_ALL : SIM_COUNT;
    for (int r = 0; r < SIM_RANKS; r++)
        for (int i = 0; i < n && recvs[r]; i++)
            out[r][i] = recvs[r][i];
    for (int r = 0; r < SIM_RANKS; r++) {
        switch (kind) {
        case DT_COMM_OP_ALL_REDUCE:
            for (int i = 0; i < SIM_COUNT; i++) {
                int32_t s = 0;
                for (int q = 0; q < SIM_RANKS; q++)
                    s += sends[q][i];
                out[r][i] = s;
            }
            break;
        case DT_COMM_OP_REDUCE:
            if (r == root)
                for (int i = 0; i < SIM_COUNT; i++) {
                    int32_t s = 0;
                    for (int q = 0; q < SIM_RANKS; q++)
                        s += sends[q][i];
                    out[r][i] = s;
                }
            break;
        case DT_COMM_OP_REDUCE_SCATTER:
            for (int i = 0; i < SIM_COUNT; i++) {
                int32_t s = 0;
                for (int q = 0; q < SIM_RANKS; q++)
                    s += sends[q][r * SIM_COUNT + i];
                out[r][i] = s;
            }
            break;
        case DT_COMM_OP_ALL_GATHER:
            for (int q = 0; q < SIM_RANKS; q++)
                for (int i = 0; i < SIM_COUNT; i++)
                    out[r][q * SIM_COUNT + i] = sends[q][i];
            break;
        case DT_COMM_OP_BROADCAST:
            for (int i = 0; i < SIM_COUNT; i++)
                out[r][i] = sends[root][i];
            break;
        default: fail();
        }
    }
}

/* Input of rank r, element i (the send region). */
static int32_t input(int r, int i) { return 1000 * (r + 1) + 7 * i + 1; }

typedef enum { SIM_HOST, SIM_DEVICE } sim_mem_t;

/* Run `kind` over SIM_RANKS ranks whose buffers are host memory or device
 * memory (`send_mem` / `recv_mem`), passed in place (`alias`: the way
 * comm.h allows for that kind) or apart: through the plan where host,
 * directly where device.  Every rank's recv (broadcast: its buffer) must
 * equal the reference collective on the host buffers. */
static void simulate(int kind, int root, sim_mem_t send_mem, sim_mem_t recv_mem, int alias)
{
    static sim_rank_t R[SIM_RANKS];
    const int32_t *sends[SIM_RANKS];
    int32_t *recvs[SIM_RANKS];
    for (int r = 0; r < SIM_RANKS; r++) {
        sim_rank_t *x = &R[r];
        memset(x, 0, sizeof *x);
        for (size_t i = 0; i < sizeof x->region / sizeof *x->region; i++)
            x->region[i] = -1 - (int32_t)i; /* never an answer */
        int32_t *base = x->region;
        int32_t *s = base, *rv = base + SIM_ALL + 4;
        if (alias) {
            switch (kind) {
            case DT_COMM_OP_ALL_REDUCE:
            case DT_COMM_OP_REDUCE:
            case DT_COMM_OP_BROADCAST: rv = s; break;
            case DT_COMM_OP_ALL_GATHER: s = rv + r * SIM_COUNT; break;
            case DT_COMM_OP_REDUCE_SCATTER: rv = s + r * SIM_COUNT; break;
            default: break;
            }
        }
        int nsend = kind == DT_COMM_OP_REDUCE_SCATTER ? SIM_ALL : SIM_COUNT;
        if (kind == DT_COMM_OP_BROADCAST && r != root)
            nsend = 0; /* its buffer's old contents */
        for (int i = 0; i < nsend; i++)
            s[i] = input(r, i);
        x->send = s;
        x->recv = kind == DT_COMM_OP_REDUCE && r != root && !alias ? NULL : rv;
        if (kind == DT_COMM_OP_BROADCAST)
            x->recv = s;
        sends[r] = x->send;
        recvs[r] = x->recv;
    }
    /* the reference, on the host buffers as passed (read before anything
     * is written) */
    static int32_t want[SIM_RANKS][SIM_ALL];
    {
        static int32_t copy_s[SIM_RANKS][2 * SIM_ALL + 8];
        const int32_t *s2[SIM_RANKS];
        const int nsend = kind == DT_COMM_OP_REDUCE_SCATTER ? SIM_ALL : SIM_COUNT;
        for (int r = 0; r < SIM_RANKS; r++) {
            memcpy(copy_s[r], sends[r], sizeof(int32_t) * (size_t)nsend);
            s2[r] = copy_s[r];
        }
        ref_collective(kind, root, s2, recvs, want);
    }
    /* each rank through the plan; device halves stand for themselves */
    for (int r = 0; r < SIM_RANKS; r++) {
        sim_rank_t *x = &R[r];
        nccl_mem_t ms = send_mem == SIM_HOST ? NCCL_MEM_HOST : NCCL_MEM_DEVICE;
        nccl_mem_t mr = recv_mem == SIM_HOST ? NCCL_MEM_HOST : NCCL_MEM_DEVICE;
        if (kind == DT_COMM_OP_BROADCAST)
            mr = ms;
        if (!x->recv)
            mr = NCCL_MEM_NONE;
        x->staged = nccl_stage_plan(kind, SIM_COUNT, sizeof(int32_t), SIM_RANKS, r, root,
                                    x->send, x->recv, ms, mr, &x->plan);
        assert_int_equal(x->staged, ms == NCCL_MEM_HOST || mr == NCCL_MEM_HOST);
        x->wsend = x->send;
        x->wrecv = x->recv;
        if (!x->staged)
            continue;
        const nccl_stage_plan_t *p = &x->plan;
        assert_true(p->dev_bytes <= sizeof x->dev);
        assert_true(p->host_bytes <= sizeof x->pinned);
        assert_int_equal(p->send_off % 4, 0);
        assert_int_equal(p->recv_off % 4, 0);
        if (p->stage_send)
            x->wsend = (const int32_t *)(x->dev + p->send_off);
        if (p->stage_recv)
            x->wrecv = (int32_t *)(x->dev + p->recv_off);
        if (kind == DT_COMM_OP_BROADCAST)
            x->wrecv = (int32_t *)x->wsend;
        /* the regions the plan names lie inside the device buffer */
        if (p->stage_send)
            assert_true(p->send_off + p->send_bytes <= p->dev_bytes);
        if (p->stage_recv)
            assert_true(p->recv_off + p->recv_bytes <= p->dev_bytes);
        memset(x->dev, 0xAB, sizeof x->dev); /* a reused buffer's garbage */
        if (p->copy_in) {
            memcpy(x->pinned, x->send, p->send_bytes);
            memcpy((void *)x->wsend, x->pinned, p->send_bytes);
        }
    }
    /* NCCL's rule: send and recv apart, or in place exactly as the kind
     * defines it (any other overlap is undefined) */
    for (int r = 0; r < SIM_RANKS; r++) {
        sim_rank_t *x = &R[r];
        if (!x->wrecv)
            continue;
        const char *s0 = (const char *)x->wsend, *r0 = (const char *)x->wrecv;
        size_t sb = sizeof(int32_t) * (kind == DT_COMM_OP_REDUCE_SCATTER ? SIM_ALL : SIM_COUNT);
        size_t rb = sizeof(int32_t) * (kind == DT_COMM_OP_ALL_GATHER ? SIM_ALL : SIM_COUNT);
        if (s0 + sb <= r0 || r0 + rb <= s0)
            continue; /* apart */
        size_t at = sizeof(int32_t) * SIM_COUNT * (size_t)r;
        int ok = kind == DT_COMM_OP_ALL_GATHER       ? s0 == r0 + at
                 : kind == DT_COMM_OP_REDUCE_SCATTER ? r0 == s0 + at
                                                     : s0 == r0;
        if (!ok)
            fail_msg("%s, root %d, %s: rank %d hands NCCL overlapping buffers that are not "
                     "in place (send at %td, recv at %td)", dt_comm_op_name(kind), root,
                     alias ? "in place" : "apart", r, s0 - (const char *)x->dev,
                     r0 - (const char *)x->dev);
    }
    /* the collective on what NCCL is given */
    const int32_t *wsends[SIM_RANKS];
    int32_t *wrecvs[SIM_RANKS];
    for (int r = 0; r < SIM_RANKS; r++) {
        wsends[r] = R[r].wsend;
        wrecvs[r] = R[r].wrecv;
    }
    static int32_t got[SIM_RANKS][SIM_ALL];
    ref_collective(kind, root, wsends, wrecvs, got);
    for (int r = 0; r < SIM_RANKS; r++) {
        int n = kind == DT_COMM_OP_ALL_GATHER ? SIM_ALL : SIM_COUNT;
        if (R[r].wrecv)
            memcpy(R[r].wrecv, got[r], sizeof(int32_t) * (size_t)n);
    }
    /* copies out, then every rank's result where the caller looks */
    for (int r = 0; r < SIM_RANKS; r++) {
        sim_rank_t *x = &R[r];
        if (x->staged && x->plan.copy_out) {
            memcpy(x->pinned, x->wrecv, x->plan.recv_bytes);
            memcpy(x->recv, x->pinned, x->plan.recv_bytes);
        }
        if (!x->recv)
            continue;
        int n = kind == DT_COMM_OP_ALL_GATHER ? SIM_ALL : SIM_COUNT;
        for (int i = 0; i < n; i++)
            if (x->recv[i] != want[r][i])
                fail_msg("%s, root %d, send %s, recv %s, %s: rank %d element %d is %d, "
                         "expected %d", dt_comm_op_name(kind), root,
                         send_mem == SIM_HOST ? "host" : "device",
                         recv_mem == SIM_HOST ? "host" : "device",
                         alias ? "in place" : "apart", r, i, x->recv[i], want[r][i]);
    }
}

static void test_stage_simulated(void **state)
{
    (void)state;
    const int kinds[] = {DT_COMM_OP_ALL_REDUCE, DT_COMM_OP_REDUCE_SCATTER,
                         DT_COMM_OP_ALL_GATHER, DT_COMM_OP_BROADCAST, DT_COMM_OP_REDUCE};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
        for (int root = 0; root < SIM_RANKS; root++)
            for (int sm = 0; sm < 2; sm++)
                for (int rm = 0; rm < 2; rm++)
                    for (int alias = 0; alias < 2; alias++) {
                        /* aliased buffers are one memory; broadcast has one */
                        if ((alias || kinds[k] == DT_COMM_OP_BROADCAST) && sm != rm)
                            continue;
                        simulate(kinds[k], root, (sim_mem_t)sm, (sim_mem_t)rm, alias);
                    }
}

static void test_stage_plan_sizes(void **state)
{
    (void)state;
    nccl_stage_plan_t p;
    char h[64] = {0}, d[64] = {0};
    /* device and device: nothing staged */
    assert_int_equal(nccl_stage_plan(DT_COMM_OP_ALL_REDUCE, 4, 8, 2, 0, -1, d, d + 32,
                                     NCCL_MEM_DEVICE, NCCL_MEM_DEVICE, &p), 0);
    /* the consistency check: 1 i64 from the stack into size x 8 bytes */
    int64_t mine = 0;
    int64_t all[4];
    assert_int_equal(nccl_stage_plan(DT_COMM_OP_ALL_GATHER, 1, 8, 4, 2, -1, &mine, all,
                                     NCCL_MEM_HOST, NCCL_MEM_HOST, &p), 1);
    assert_int_equal(p.send_bytes, 8);
    assert_int_equal(p.recv_bytes, 32);
    assert_int_equal(p.send_off, 0);
    assert_int_equal(p.recv_off, NCCL_BOUNCE_ALIGN);
    assert_int_equal(p.dev_bytes, NCCL_BOUNCE_ALIGN + 32);
    assert_int_equal(p.host_bytes, 32);
    assert_true(p.copy_in && p.copy_out);
    /* in place: one region */
    assert_int_equal(nccl_stage_plan(DT_COMM_OP_ALL_GATHER, 1, 8, 4, 2, -1, &all[2], all,
                                     NCCL_MEM_HOST, NCCL_MEM_HOST, &p), 1);
    assert_int_equal(p.recv_off, 0);
    assert_int_equal(p.send_off, 16);
    assert_int_equal(p.dev_bytes, 32);
    /* the loss: one f32 in place */
    float loss = 1;
    assert_int_equal(nccl_stage_plan(DT_COMM_OP_ALL_REDUCE, 1, 4, 8, 3, -1, &loss, &loss,
                                     NCCL_MEM_HOST, NCCL_MEM_HOST, &p), 1);
    assert_int_equal(p.dev_bytes, 4);
    assert_int_equal(p.host_bytes, 4);
    /* broadcast: the root copies in only, the others out only */
    assert_int_equal(nccl_stage_plan(DT_COMM_OP_BROADCAST, 64, 1, 2, 0, 0, h, h,
                                     NCCL_MEM_HOST, NCCL_MEM_HOST, &p), 1);
    assert_true(p.copy_in && !p.copy_out);
    assert_int_equal(nccl_stage_plan(DT_COMM_OP_BROADCAST, 64, 1, 2, 1, 0, h, h,
                                     NCCL_MEM_HOST, NCCL_MEM_HOST, &p), 1);
    assert_true(!p.copy_in && p.copy_out);
    /* reduce: recv only on the root */
    assert_int_equal(nccl_stage_plan(DT_COMM_OP_REDUCE, 2, 4, 2, 1, 0, h, NULL,
                                     NCCL_MEM_HOST, NCCL_MEM_NONE, &p), 1);
    assert_true(p.copy_in && !p.copy_out && !p.stage_recv);
    assert_int_equal(p.recv_bytes, 0);
    /* host send, device recv: the send staged, the result lands directly */
    assert_int_equal(nccl_stage_plan(DT_COMM_OP_ALL_REDUCE, 3, 4, 2, 0, -1, h, d,
                                     NCCL_MEM_HOST, NCCL_MEM_DEVICE, &p), 1);
    assert_true(p.stage_send && !p.stage_recv && p.copy_in && !p.copy_out);
    assert_int_equal(p.dev_bytes, NCCL_BOUNCE_ALIGN);
    /* send and recv are not collectives: nothing planned */
    assert_int_equal(nccl_stage_plan(DT_COMM_OP_SEND, 3, 4, 2, 0, 1, h, NULL,
                                     NCCL_MEM_HOST, NCCL_MEM_NONE, &p), 0);
}

/* ------------------------------------------------------------ the guard */

typedef struct fake_comm {
    nccl_guard_t g;
    atomic_int applied; /* times apply ran */
    atomic_int holder_in_call; /* 1 while a "holder" runs a call */
    atomic_int overlap; /* apply ran while a call was running: forbidden */
} fake_comm_t;

static void fake_apply(void *ctx)
{
    fake_comm_t *f = ctx;
    if (atomic_load(&f->holder_in_call))
        atomic_store(&f->overlap, 1);
    atomic_fetch_add(&f->applied, 1);
}

static void fake_init(fake_comm_t *f)
{
    memset(f, 0, sizeof *f);
    nccl_guard_init(&f->g, fake_apply, f);
}

static void test_fail_first_wins(void **state)
{
    (void)state;
    nccl_fail_t f;
    memset(&f, 0, sizeof f);
    assert_int_equal(nccl_fail_status(&f), 0);
    assert_int_equal(nccl_fail_set(&f, 0, "not a failure"), 0);
    assert_int_equal(nccl_fail_status(&f), 0);
    assert_int_equal(nccl_fail_set(&f, DT_ERR_TIMEOUT, "first"), 1);
    assert_int_equal(nccl_fail_set(&f, DT_ERR_REMOTE, "second"), 0);
    assert_int_equal(nccl_fail_status(&f), DT_ERR_TIMEOUT);
    assert_string_equal(f.msg, "first");
}

static void test_abort_lock_free(void **state)
{
    (void)state;
    fake_comm_t f;
    fake_init(&f);
    assert_int_equal(nccl_guard_abort(&f.g, DT_ERR_REMOTE, "rank 0 aborted the job: x"), 1);
    assert_int_equal(atomic_load(&f.applied), 1); /* at once */
    assert_int_equal(nccl_fail_status(&f.g.fail), DT_ERR_REMOTE);
    /* again: recorded already, applied already */
    assert_int_equal(nccl_guard_abort(&f.g, DT_ERR_REMOTE, "again"), 0);
    nccl_guard_lock(&f.g);
    nccl_guard_unlock(&f.g);
    assert_int_equal(atomic_load(&f.applied), 1);
    assert_string_equal(f.g.fail.msg, "rank 0 aborted the job: x");
    nccl_guard_destroy(&f.g);
}

/* A holder that takes the lock and "runs a call" for `ms` without
 * looking at anything (an NCCL call in progress), then unlocks. */
typedef struct holder_arg {
    fake_comm_t *f;
    int ms;
    atomic_int locked;
    int64_t released_us;
} holder_arg_t;

static void *holder(void *p)
{
    holder_arg_t *h = p;
    nccl_guard_lock(&h->f->g);
    atomic_store(&h->locked, 1);
    atomic_store(&h->f->holder_in_call, 1);
    sleep_ms(h->ms);
    atomic_store(&h->f->holder_in_call, 0);
    nccl_guard_unlock(&h->f->g);
    h->released_us = now_us();
    return NULL;
}

static void test_abort_never_blocks(void **state)
{
    (void)state;
    fake_comm_t f;
    fake_init(&f);
    holder_arg_t h = {.f = &f, .ms = 300};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, holder, &h), 0);
    while (!atomic_load(&h.locked))
        sleep_ms(1);
    int64_t t0 = now_us();
    assert_int_equal(nccl_guard_abort(&f.g, DT_ERR_REMOTE, "watchdog"), 1);
    int64_t took = now_us() - t0;
    assert_true(took < 50000); /* returned at once, not after the 300 ms */
    assert_int_equal(atomic_load(&f.applied), 0); /* not beside the call */
    assert_int_equal(nccl_fail_status(&f.g.fail), DT_ERR_REMOTE);
    pthread_join(t, NULL);
    assert_int_equal(atomic_load(&f.applied), 1); /* by the holder, letting go */
    assert_int_equal(atomic_load(&f.overlap), 0);
    nccl_guard_destroy(&f.g);
}

/* A poll under the lock (a settle) that would run 10 s stops within a nap
 * of an abort from another thread; the poller applies it. */
static int never_done(void *ctx)
{
    (void)ctx;
    return 0;
}

typedef struct poller_arg {
    fake_comm_t *f;
    atomic_int polling;
    nccl_poll_end_t end;
    int64_t ended_us;
} poller_arg_t;

static void *poller(void *p)
{
    poller_arg_t *a = p;
    nccl_guard_lock(&a->f->g);
    atomic_store(&a->polling, 1);
    a->end = nccl_poll(never_done, NULL, &a->f->g.fail, 10 * 1000000, 100);
    a->ended_us = now_us();
    if (a->end == NCCL_POLL_STOPPED)
        nccl_guard_apply_locked(&a->f->g);
    nccl_guard_unlock(&a->f->g);
    return NULL;
}

static void test_poll_stops_on_abort(void **state)
{
    (void)state;
    fake_comm_t f;
    fake_init(&f);
    poller_arg_t a = {.f = &f};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, poller, &a), 0);
    while (!atomic_load(&a.polling))
        sleep_ms(1);
    sleep_ms(20);
    int64_t t0 = now_us();
    nccl_guard_abort(&f.g, DT_ERR_REMOTE, "stop");
    assert_true(now_us() - t0 < 50000);
    pthread_join(t, NULL);
    assert_int_equal(a.end, NCCL_POLL_STOPPED);
    assert_true(a.ended_us - t0 < 500000); /* within a nap, not the 10 s */
    assert_int_equal(atomic_load(&f.applied), 1);
    nccl_guard_destroy(&f.g);
}

static int look_count;
static int done_after_3(void *ctx)
{
    (void)ctx;
    return ++look_count >= 3 ? 1 : 0;
}
static int fails(void *ctx)
{
    (void)ctx;
    look_count++;
    return -1;
}

static void test_poll_ends(void **state)
{
    (void)state;
    look_count = 0;
    assert_int_equal(nccl_poll(done_after_3, NULL, NULL, 1000000, 10), NCCL_POLL_DONE);
    assert_int_equal(look_count, 3);
    look_count = 0;
    assert_int_equal(nccl_poll(fails, NULL, NULL, 1000000, 10), NCCL_POLL_FAILED);
    assert_int_equal(look_count, 1);
    /* a timeout of 0 still looks once */
    look_count = 0;
    assert_int_equal(nccl_poll(done_after_3, NULL, NULL, 0, 10), NCCL_POLL_TIMEOUT);
    assert_int_equal(look_count, 1);
    int64_t t0 = now_us();
    assert_int_equal(nccl_poll(never_done, NULL, NULL, 30000, 100), NCCL_POLL_TIMEOUT);
    int64_t took = now_us() - t0;
    assert_true(took >= 30000 && took < 500000);
    /* a failure recorded before: stopped before any look */
    nccl_fail_t f;
    memset(&f, 0, sizeof f);
    nccl_fail_set(&f, DT_ERR_REMOTE, "x");
    look_count = 0;
    assert_int_equal(nccl_poll(done_after_3, NULL, &f, 1000000, 10), NCCL_POLL_STOPPED);
    assert_int_equal(look_count, 0);
}

typedef struct racer_arg {
    fake_comm_t *f;
    atomic_int *go;
    int status;
} racer_arg_t;

static void *racer(void *p)
{
    racer_arg_t *a = p;
    while (!atomic_load(a->go))
        sched_yield();
    char msg[32];
    snprintf(msg, sizeof msg, "racer %d", a->status);
    nccl_guard_abort(&a->f->g, a->status, msg);
    return NULL;
}

static void test_concurrent_aborts_apply_once(void **state)
{
    (void)state;
    for (int round = 0; round < 50; round++) {
        fake_comm_t f;
        fake_init(&f);
        atomic_int go = 0;
        pthread_t t[8];
        racer_arg_t a[8];
        for (int i = 0; i < 8; i++) {
            a[i] = (racer_arg_t){&f, &go, 100 + i};
            assert_int_equal(pthread_create(&t[i], NULL, racer, &a[i]), 0);
        }
        atomic_store(&go, 1);
        for (int i = 0; i < 8; i++)
            pthread_join(t[i], NULL);
        assert_int_equal(atomic_load(&f.applied), 1);
        int st = nccl_fail_status(&f.g.fail);
        assert_true(st >= 100 && st < 108);
        char want[32];
        snprintf(want, sizeof want, "racer %d", st);
        assert_string_equal(f.g.fail.msg, want); /* the winner's own reason */
        nccl_guard_destroy(&f.g);
    }
}

/* The Dekker pair: a holder takes the lock once, "runs a call" for a
 * random moment and lets go for good (the driving thread goes back to
 * compute); an aborter aborts at a random moment around the release.
 * After both are done the abort has been applied exactly once, never
 * beside a call, and the aborter never waited for the lock.  Without the
 * holder's look after releasing, an abort landing in that window would
 * wait for the next call on the group, which may never come. */
typedef struct once_arg {
    fake_comm_t *f;
    atomic_int locked;
    int spin;
} once_arg_t;

static void *hold_once(void *p)
{
    once_arg_t *a = p;
    nccl_guard_lock(&a->f->g);
    atomic_store(&a->locked, 1);
    atomic_store(&a->f->holder_in_call, 1);
    for (volatile int i = a->spin; i > 0; i--)
        ;
    atomic_store(&a->f->holder_in_call, 0);
    nccl_guard_unlock(&a->f->g);
    return NULL;
}

static void test_no_abort_lost(void **state)
{
    (void)state;
    srand(12345);
    int64_t worst = 0;
    for (int round = 0; round < 10000; round++) {
        fake_comm_t f;
        fake_init(&f);
        once_arg_t a = {.f = &f, .spin = rand() % 400};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, hold_once, &a), 0);
        while (!atomic_load(&a.locked))
            sched_yield();
        for (volatile int spin = rand() % 400; spin > 0; spin--)
            ;
        int64_t t0 = now_us();
        nccl_guard_abort(&f.g, DT_ERR_REMOTE, "x");
        int64_t took = now_us() - t0;
        worst = took > worst ? took : worst;
        pthread_join(t, NULL);
        if (atomic_load(&f.applied) != 1)
            fail_msg("round %d: abort applied %d times", round, atomic_load(&f.applied));
        assert_int_equal(atomic_load(&f.overlap), 0);
        nccl_guard_destroy(&f.g);
    }
    /* never waited for the holder (a generous bound for a loaded CI) */
    assert_true(worst < 200000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_types),
        cmocka_unit_test(test_wire_covers_every_dtype),
        cmocka_unit_test(test_mem_of),
        cmocka_unit_test(test_mem_allowed),
        cmocka_unit_test(test_stage_plan_sizes),
        cmocka_unit_test(test_stage_simulated),
        cmocka_unit_test(test_fail_first_wins),
        cmocka_unit_test(test_abort_lock_free),
        cmocka_unit_test(test_abort_never_blocks),
        cmocka_unit_test(test_poll_stops_on_abort),
        cmocka_unit_test(test_poll_ends),
        cmocka_unit_test(test_concurrent_aborts_apply_once),
        cmocka_unit_test(test_no_abort_lost),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* no NCCL in this build */

int main(void)
{
    printf("SKIPPED: this build has no nccl communicator (NCCL not found)\n");
    return 77;
}

#endif
