/*
 * tests/unit/core/interpose/test_interpose_strict.c - the strict device checks
 * (core/interpose/interpose_strict.c): the cpu plugin wrapped by the
 * device interposer and a recording fake comm wrapped by the comm
 * interposer, both with the strict hooks.  Each rule is broken once on
 * purpose and the exact message is asserted (addresses printed from the
 * test's own pointers), with the plugin left uncalled; the calls the
 * rules allow reach the plugin unchanged:
 *  - device memory: inside one live allocation, with room for the call's
 *    bytes (all_gather's recv and reduce_scatter's send are the group
 *    size times the count); a buffer that starts inside one and runs past
 *    its end is refused naming the bytes asked, where it starts and the
 *    allocation's size; freed memory is no longer device memory;
 *  - plain host memory: a control message in a collective is allowed, in
 *    send, recv or sendrecv refused; pinned host memory (host_alloc) is
 *    refused everywhere; reduce's recv counts on its root only;
 *  - dtypes: u16 (NCCL has no type for it) refused where it is reduced,
 *    moved as bytes elsewhere, as the nccl communicator does; an unknown
 *    dtype refused;
 *  - order: an ungrouped send to a peer, then a recv from it while the
 *    send is in flight, is refused naming both calls (and recv, then
 *    send); waited for, to another peer, on another group, or through
 *    sendrecv, it is allowed;
 *  - sym_alloc is refused, so strategies take device memory;
 *  - the summary line counts what was checked.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "interpose/interpose.h"
#include "test_assert.h"
#include "test_host.h"
#include "test_plugin.h"

/* ---- a recording fake comm: a world of 4, split groups of 2 -------------- */

/* Handles start with their table (dtrain/comm.h): the fake's, below. */
static const dt_comm_ops_t fake_ops;
static struct dt_comm {
    const dt_comm_ops_t *ops;
} fake_world = {&fake_ops}, fake_sub = {&fake_ops};
static char fake_reqs[64];
#define W ((dt_comm_t *)&fake_world)
#define SUB ((dt_comm_t *)&fake_sub)
static int n_req;        /* requests handed out so far */
static int calls[DT_ICOMM_SLOT_COUNT];

static dt_comm_req_t *new_req(void)
{
    return (dt_comm_req_t *)&fake_reqs[n_req++ % (int)sizeof fake_reqs];
}

static int started(int slot, dt_comm_req_t **req)
{
    calls[slot]++;
    if (req)
        *req = new_req();
    return DT_OK;
}

static int f_init(const dt_host_t *h, const dt_comm_init_t *a, dt_comm_t **out)
{
    *out = W;
    return DT_OK;
}
static void f_finalize(dt_comm_t *c) { calls[DT_ICOMM_FINALIZE]++; }
/* this rank is 1 of 4 in the world, 0 of 2 in a split group */
static int f_rank_size(dt_comm_t *c, int32_t *r, int32_t *n)
{
    *r = c == W ? 1 : 0;
    *n = c == W ? 4 : 2;
    return DT_OK;
}
static int f_all_reduce(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt, int op,
                        dt_stream_t *st, dt_comm_req_t **req)
{
    return started(DT_ICOMM_ALL_REDUCE, req);
}
static int f_reduce_scatter(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt, int op,
                            dt_stream_t *st, dt_comm_req_t **req)
{
    return started(DT_ICOMM_REDUCE_SCATTER, req);
}
static int f_all_gather(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt,
                        dt_stream_t *st, dt_comm_req_t **req)
{
    return started(DT_ICOMM_ALL_GATHER, req);
}
static int f_broadcast(dt_comm_t *c, void *b, uint64_t n, int dt, int32_t root,
                       dt_stream_t *st, dt_comm_req_t **req)
{
    return started(DT_ICOMM_BROADCAST, req);
}
static int f_reduce(dt_comm_t *c, const void *s, void *r, uint64_t n, int dt, int op,
                    int32_t root, dt_stream_t *st, dt_comm_req_t **req)
{
    return started(DT_ICOMM_REDUCE, req);
}
static int f_send(dt_comm_t *c, const void *b, uint64_t n, int dt, int32_t peer, int32_t tag,
                  dt_stream_t *st, dt_comm_req_t **req)
{
    return started(DT_ICOMM_SEND, req);
}
static int f_recv(dt_comm_t *c, void *b, uint64_t n, int dt, int32_t peer, int32_t tag,
                  dt_stream_t *st, dt_comm_req_t **req)
{
    return started(DT_ICOMM_RECV, req);
}
static int f_sendrecv(dt_comm_t *c, const void *sb, uint64_t sn, void *rb, uint64_t rn, int dt,
                      int32_t sp, int32_t rp, int32_t st_, int32_t rt, dt_stream_t *st,
                      dt_comm_req_t **sreq, dt_comm_req_t **rreq)
{
    calls[DT_ICOMM_SENDRECV]++;
    if (sreq) {
        *sreq = new_req();
        *rreq = new_req();
    }
    return DT_OK;
}
static int f_barrier(dt_comm_t *c, dt_comm_req_t **req) { return started(DT_ICOMM_BARRIER, req); }
static int f_wait(dt_comm_t *c, dt_comm_req_t *req, int64_t ms)
{
    calls[DT_ICOMM_WAIT]++;
    return DT_OK;
}
static int f_split(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    *out = SUB;
    return DT_OK;
}
static int f_abort(dt_comm_t *c, const char *reason) { return DT_OK; }
static int f_sym_alloc(dt_comm_t *c, uint64_t bytes, int tag, void **out)
{
    calls[DT_ICOMM_SYM_ALLOC]++;
    return DT_ERR_INVALID;
}
static int f_sym_free(dt_comm_t *c, void *p) { return DT_OK; }

static const dt_comm_ops_t fake_ops = {
    .info = DT_PLUGIN_INFO_NOKEYS(COMM, dt_comm_ops_t, "fake", "1.0", "records calls"),
    .init = f_init,
    .finalize = f_finalize,
    .rank_size = f_rank_size,
    .all_reduce = f_all_reduce,
    .reduce_scatter = f_reduce_scatter,
    .all_gather = f_all_gather,
    .broadcast = f_broadcast,
    .reduce = f_reduce,
    .send = f_send,
    .recv = f_recv,
    .barrier = f_barrier,
    .wait = f_wait,
    .split = f_split,
    .abort = f_abort,
    .sym_alloc = f_sym_alloc,
    .sym_free = f_sym_free,
    .sendrecv = f_sendrecv,
};

/* ---- the wrapped pair ------------------------------------------------------ */

static const dt_device_ops_t *CPU;
static const dt_test_kv_t kv_t1[] = {{"threads", "1"}, {NULL, NULL}};
static dt_test_host_t dev_host, comm_host;

static dt_interpose_strict_t *S;
static dt_interpose_device_t *ID;
static dt_interpose_comm_t *IC;
static const dt_device_ops_t *D; /* the wrappers */
static const dt_comm_ops_t *C;
static dt_device_t *dev;
static dt_comm_t *world;

static int setup(void **state)
{
    (void)state;
    memset(calls, 0, sizeof calls);
    n_req = 0;
    dt_test_host_init(&dev_host, "device/cpu", kv_t1);
    dt_test_host_init(&comm_host, "comm/fake", NULL);
    if (!(S = dt_interpose_strict_create()))
        return -1;
    dt_interpose_hooks_t hooks = dt_interpose_strict_hooks(S);
    if (dt_interpose_device_create(CPU, &hooks, 0, &ID) != DT_OK ||
        dt_interpose_comm_create(&fake_ops, &hooks, &IC) != DT_OK)
        return -1;
    D = dt_interpose_device_ops(ID);
    C = dt_interpose_comm_ops(IC);
    const dt_device_init_t da = {.struct_size = sizeof da, .rank = 1, .local_size = 1,
                                 .device_index = -1};
    if (D->init(&dev_host.host, &da, &dev) != DT_OK)
        return -1;
    dt_comm_init_t ca = {.struct_size = sizeof ca, .rank = 1, .size = 4, .job_id = "job",
                         .timeout_ms = 1000, .dev = dev};
    return C->init(&comm_host.host, &ca, &world) == DT_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    C->finalize(world);
    D->finalize(dev);
    dt_interpose_comm_destroy(IC);
    dt_interpose_device_destroy(ID);
    dt_interpose_strict_free(S);
    return 0;
}

/* `bytes` of device memory through the wrapper (tracked). */
static void *dalloc(uint64_t bytes, int tag)
{
    void *p = NULL;
    assert_ok(D->alloc(dev, bytes, tag, &p));
    return p;
}

/* The message a refusal set, with the test's addresses formatted in:
 * assert_msg of the printf-formatted text. */
#define assert_msgf(...)                                                       \
    do {                                                                       \
        char want_[1024];                                                      \
        snprintf(want_, sizeof want_, __VA_ARGS__);                            \
        assert_msg(want_);                                                     \
    } while (0)

#define P(ptr) ((uintptr_t)(ptr))

/* ---- memory ------------------------------------------------------------------ */

static void test_device_memory_is_allowed(void **state)
{
    (void)state;
    float *a = dalloc(64 * sizeof(float), DT_TAG_GRADS);
    float *g = dalloc(4 * 16 * sizeof(float), DT_TAG_COMM);
    dt_comm_req_t *req = NULL;
    /* in place, the whole allocation; from inside it, to its very end */
    assert_ok(C->all_reduce(world, a, a, 64, DT_F32, DT_OP_SUM, NULL, &req));
    assert_ok(C->all_reduce(world, a + 32, a + 32, 32, DT_BF16, DT_OP_SUM, NULL, NULL));
    /* all_gather: the recv holds size (4) x count; reduce_scatter's send */
    assert_ok(C->all_gather(world, a, g, 16, DT_F32, NULL, NULL));
    assert_ok(C->reduce_scatter(world, g, a, 16, DT_F32, DT_OP_AVG, NULL, NULL));
    assert_ok(C->broadcast(world, a, 64, DT_F32, 0, NULL, NULL));
    /* every dtype NCCL has */
    const int ok_types[] = {DT_F32, DT_BF16, DT_F16, DT_F64, DT_I32, DT_I64, DT_U8};
    for (size_t i = 0; i < DT_ARRAY_LEN(ok_types); i++)
        assert_ok(C->all_reduce(world, a, a, 8, ok_types[i], DT_OP_MAX, NULL, NULL));
    /* count 0 moves nothing: any pointer */
    assert_ok(C->send(world, (void *)&fake_world, 0, DT_F32, 2, 0, NULL, NULL));
    /* a barrier has no buffer */
    assert_ok(C->barrier(world, NULL));
    assert_int_equal(calls[DT_ICOMM_ALL_REDUCE], 2 + 7);
    assert_int_equal(calls[DT_ICOMM_ALL_GATHER], 1);
    assert_int_equal(calls[DT_ICOMM_REDUCE_SCATTER], 1);
    assert_int_equal(calls[DT_ICOMM_BROADCAST], 1);
    assert_int_equal(calls[DT_ICOMM_SEND], 1);
    assert_ok(C->wait(world, req, -1));
    assert_ok(D->free(dev, a));
    assert_ok(D->free(dev, g));
}

static void test_buffer_overrunning_its_allocation(void **state)
{
    (void)state;
    float *a = dalloc(64 * sizeof(float), DT_TAG_GRADS);
    /* 16 floats from 56 floats in: 32 bytes past the end */
    assert_status(C->all_reduce(world, a + 56, a + 56, 16, DT_F32, DT_OP_SUM, NULL, NULL),
                  DT_ERR_INVALID);
    assert_msgf("strict device: all_reduce #1 (f32, 64 bytes): send buffer 0x%" PRIxPTR
                " needs 64 bytes, but it starts 224 bytes into a device allocation of 256 bytes "
                "(tag grads) at 0x%" PRIxPTR ": it runs 32 bytes past its end",
                P(a + 56), P(a));
    /* all_gather's recv is the group size (4) x count: 16 x 4 x 4 bytes */
    float *g = dalloc(16 * 3 * sizeof(float), DT_TAG_COMM);
    assert_status(C->all_gather(world, a, g, 16, DT_F32, NULL, NULL), DT_ERR_INVALID);
    assert_msgf("strict device: all_gather #1 (f32, 64 bytes per rank): recv buffer 0x%" PRIxPTR
                " needs 256 bytes, but it starts 0 bytes into a device allocation of 192 bytes "
                "(tag comm) at 0x%" PRIxPTR ": it runs 64 bytes past its end", P(g), P(g));
    /* reduce_scatter's send, likewise */
    assert_status(C->reduce_scatter(world, g, a, 16, DT_F32, DT_OP_SUM, NULL, NULL),
                  DT_ERR_INVALID);
    assert_msgf("strict device: reduce_scatter #1 (f32, 64 bytes per rank): send buffer 0x%"
                PRIxPTR " needs 256 bytes, but it starts 0 bytes into a device allocation of 192 "
                "bytes (tag comm) at 0x%" PRIxPTR ": it runs 64 bytes past its end", P(g), P(g));
    /* a recv into an activation buffer too small for its count */
    void *act = dalloc(100, DT_TAG_ACTIVATIONS);
    assert_status(C->recv(world, act, 26, DT_F32, 2, 7, NULL, NULL), DT_ERR_INVALID);
    assert_msgf("strict device: recv #1 (f32, 104 bytes from rank 2, tag 7): recv buffer 0x%"
                PRIxPTR " needs 104 bytes, but it starts 0 bytes into a device allocation of 100 "
                "bytes (tag activations) at 0x%" PRIxPTR ": it runs 4 bytes past its end",
                P(act), P(act));
    /* none of them reached the plugin */
    assert_int_equal(calls[DT_ICOMM_ALL_REDUCE] + calls[DT_ICOMM_ALL_GATHER] +
                         calls[DT_ICOMM_REDUCE_SCATTER] + calls[DT_ICOMM_RECV],
                     0);
    assert_ok(D->free(dev, a));
    assert_ok(D->free(dev, g));
    assert_ok(D->free(dev, act));
}

static void test_host_memory(void **state)
{
    (void)state;
    /* a control message in a collective: the config hash, the loss */
    int64_t mine = 42, hashes[4];
    float loss = 1.5f;
    assert_ok(C->all_gather(world, &mine, hashes, 1, DT_I64, NULL, NULL));
    assert_ok(C->all_reduce(world, &loss, &loss, 1, DT_F32, DT_OP_AVG, NULL, NULL));
    char *text = malloc(300);
    assert_non_null(text);
    assert_ok(C->broadcast(world, text, 300, DT_U8, 0, NULL, NULL));
    assert_int_equal(calls[DT_ICOMM_ALL_GATHER], 1);
    assert_int_equal(calls[DT_ICOMM_BROADCAST], 1);
    /* host memory in send and recv */
    float act[8];
    assert_status(C->send(world, act, 8, DT_F32, 2, 4, NULL, NULL), DT_ERR_INVALID);
    assert_msgf("strict device: send #1 (f32, 32 bytes to rank 2, tag 4): send buffer 0x%"
                PRIxPTR " is host memory (in no device allocation), but send and recv take only "
                "device memory (a device communicator refuses host memory there)", P(act));
    assert_status(C->recv(world, text, 300, DT_U8, 0, 0, NULL, NULL), DT_ERR_INVALID);
    assert_msgf("strict device: recv #1 (u8, 300 bytes from rank 0, tag 0): recv buffer 0x%"
                PRIxPTR " is host memory (in no device allocation), but send and recv take only "
                "device memory (a device communicator refuses host memory there)", P(text));
    /* a sendrecv's either half */
    float *d = dalloc(8 * sizeof(float), DT_TAG_ACTIVATIONS);
    dt_comm_req_t *rs, *rr;
    assert_status(C->sendrecv(world, d, 8, act, 8, DT_F32, 2, 2, 0, 1, NULL, &rs, &rr),
                  DT_ERR_INVALID);
    assert_msgf("strict device: sendrecv #1 (f32, 32 bytes to rank 2, tag 0; 32 bytes from "
                "rank 2, tag 1): recv buffer 0x%" PRIxPTR " is host memory (in no device "
                "allocation), but send and recv take only device memory (a device communicator "
                "refuses host memory there)", P(act));
    assert_null(rs);
    assert_null(rr);
    assert_int_equal(calls[DT_ICOMM_SEND] + calls[DT_ICOMM_RECV] + calls[DT_ICOMM_SENDRECV], 0);
    /* freed device memory is device memory no more */
    assert_ok(D->free(dev, d));
    assert_status(C->send(world, d, 8, DT_F32, 2, 4, NULL, NULL), DT_ERR_INVALID);
    assert_msgf("strict device: send #2 (f32, 32 bytes to rank 2, tag 4): send buffer 0x%"
                PRIxPTR " is host memory (in no device allocation), but send and recv take only "
                "device memory (a device communicator refuses host memory there)", P(d));
    free(text);
}

static void test_reduce_recv_on_root_only(void **state)
{
    (void)state;
    float *a = dalloc(16 * sizeof(float), DT_TAG_GRADS);
    float host[16];
    /* this rank is 1: its recv is ignored, host or not */
    assert_ok(C->reduce(world, a, host, 16, DT_F32, DT_OP_SUM, 0, NULL, NULL));
    assert_ok(C->reduce(world, a, NULL, 16, DT_F32, DT_OP_SUM, 3, NULL, NULL));
    /* on the root it counts: a bulk reduce into host memory is a
     * control message as far as memory says (the checks cannot tell) */
    assert_ok(C->reduce(world, a, host, 16, DT_F32, DT_OP_SUM, 1, NULL, NULL));
    float *small = dalloc(8 * sizeof(float), DT_TAG_GRADS);
    assert_status(C->reduce(world, a, small, 16, DT_F32, DT_OP_SUM, 1, NULL, NULL),
                  DT_ERR_INVALID);
    assert_msgf("strict device: reduce #4 (f32, 64 bytes, root 1): recv buffer 0x%" PRIxPTR
                " needs 64 bytes, but it starts 0 bytes into a device allocation of 32 bytes "
                "(tag grads) at 0x%" PRIxPTR ": it runs 32 bytes past its end", P(small),
                P(small));
    assert_int_equal(calls[DT_ICOMM_REDUCE], 3);
    assert_ok(D->free(dev, a));
    assert_ok(D->free(dev, small));
}

static void test_pinned_host_memory(void **state)
{
    (void)state;
    void *pinned = NULL;
    assert_ok(D->host_alloc(dev, 4096, DT_TAG_OFFLOAD, &pinned));
    float *a = dalloc(1024 * sizeof(float), DT_TAG_PARAMS);
    assert_status(C->all_gather(world, (char *)pinned + 1024, a, 256, DT_F32, NULL, NULL),
                  DT_ERR_INVALID);
    assert_msgf("strict device: all_gather #1 (f32, 1024 bytes per rank): send buffer 0x%" PRIxPTR
                " is pinned host memory (host_alloc of 4096 bytes, tag offload), but bulk data "
                "travels in device memory (alloc), and a control message in plain host memory "
                "(malloc, the stack)", P((char *)pinned + 1024));
    assert_status(C->send(world, pinned, 4, DT_F32, 0, 1, NULL, NULL), DT_ERR_INVALID);
    assert_msgf("strict device: send #1 (f32, 16 bytes to rank 0, tag 1): send buffer 0x%" PRIxPTR
                " is pinned host memory (host_alloc of 4096 bytes, tag offload), but send and "
                "recv take only device memory", P(pinned));
    /* freed, it is plain host memory: a collective may take it */
    assert_ok(D->host_free(dev, pinned));
    void *stage = NULL;
    assert_ok(D->host_alloc(dev, 64, DT_TAG_STAGING, &stage));
    assert_ok(D->host_free(dev, stage));
    assert_int_equal(calls[DT_ICOMM_ALL_GATHER] + calls[DT_ICOMM_SEND], 0);
    assert_ok(D->free(dev, a));
}

/* ---- dtypes ------------------------------------------------------------------ */

static void test_dtypes_nccl_cannot_move(void **state)
{
    (void)state;
    uint16_t *u = dalloc(4 * 32 * sizeof(uint16_t), DT_TAG_OTHER);
    const char *no_u16 = "u16 cannot be reduced on NCCL: it has no NCCL type (NCCL reduces "
                         "f32, bf16, f16, f64, i32, i64, u8; the nccl communicator moves u16 "
                         "as bytes, without reducing it)";
    char want[512];
    assert_status(C->all_reduce(world, u, u, 32, DT_U16, DT_OP_SUM, NULL, NULL),
                  DT_ERR_UNSUPPORTED);
    snprintf(want, sizeof want, "strict device: all_reduce #1 (u16, 64 bytes): %s", no_u16);
    assert_msg(want);
    assert_status(C->reduce_scatter(world, u, u, 32, DT_U16, DT_OP_MAX, NULL, NULL),
                  DT_ERR_UNSUPPORTED);
    snprintf(want, sizeof want, "strict device: reduce_scatter #1 (u16, 64 bytes per rank): %s",
             no_u16);
    assert_msg(want);
    assert_status(C->reduce(world, u, u, 32, DT_U16, DT_OP_SUM, 0, NULL, NULL),
                  DT_ERR_UNSUPPORTED);
    snprintf(want, sizeof want, "strict device: reduce #1 (u16, 64 bytes, root 0): %s", no_u16);
    assert_msg(want);
    /* host memory does not make it reducible */
    uint16_t flag = 1;
    assert_status(C->all_reduce(world, &flag, &flag, 1, DT_U16, DT_OP_MAX, NULL, NULL),
                  DT_ERR_UNSUPPORTED);
    snprintf(want, sizeof want, "strict device: all_reduce #2 (u16, 2 bytes): %s", no_u16);
    assert_msg(want);
    assert_int_equal(calls[DT_ICOMM_ALL_REDUCE] + calls[DT_ICOMM_REDUCE_SCATTER] +
                         calls[DT_ICOMM_REDUCE],
                     0);
    /* moved, not reduced: as bytes */
    assert_ok(C->all_gather(world, u, u, 32, DT_U16, NULL, NULL));
    assert_ok(C->broadcast(world, u, 32, DT_U16, 0, NULL, NULL));
    assert_ok(C->send(world, u, 32, DT_U16, 2, 0, NULL, NULL));
    assert_int_equal(calls[DT_ICOMM_ALL_GATHER] + calls[DT_ICOMM_BROADCAST] +
                         calls[DT_ICOMM_SEND],
                     3);
    /* a dtype dtrain does not know */
    assert_status(C->broadcast(world, u, 4, 42, 0, NULL, NULL), DT_ERR_UNSUPPORTED);
    assert_msg("strict device: broadcast #2 (dtype 42, 4 elements, root 0): dtype 42 is not a "
               "type NCCL moves (f32, bf16, f16, f64, i32, i64, u8, and u16 as bytes)");
    assert_int_equal(calls[DT_ICOMM_BROADCAST], 1);
    assert_ok(D->free(dev, u));
}

/* ---- order --------------------------------------------------------------------- */

static void test_ungrouped_exchange(void **state)
{
    (void)state;
    float *out = dalloc(256 * sizeof(float), DT_TAG_ACTIVATIONS);
    float *in = dalloc(256 * sizeof(float), DT_TAG_ACTIVATIONS);
    dt_comm_req_t *s1 = NULL, *r1 = NULL;
    /* 1F1B's stage 0: an activation on to rank 2, then a gradient back */
    assert_ok(C->send(world, out, 256, DT_F32, 2, 6, NULL, &s1));
    assert_status(C->recv(world, in, 256, DT_F32, 2, 1, NULL, &r1), DT_ERR_INVALID);
    assert_msg("strict device: recv #1 (f32, 1024 bytes from rank 2, tag 1): send #1 (f32, "
               "1024 bytes to rank 2, tag 6) on the same group is still in flight (not waited "
               "for) and was not started with this recv: on NCCL two ranks that each send "
               "before they receive block in their sends, a deadlock once a message exceeds "
               "NCCL's buffers; start the two together with sendrecv");
    assert_null(r1);
    assert_int_equal(calls[DT_ICOMM_RECV], 0);
    /* from another peer, it goes */
    assert_ok(C->recv(world, in, 256, DT_F32, 0, 1, NULL, &r1));
    assert_ok(C->wait(world, r1, -1));
    /* the send waited for: the recv goes */
    assert_ok(C->wait(world, s1, -1));
    assert_ok(C->recv(world, in, 256, DT_F32, 2, 1, NULL, &r1));
    /* recv, then send, the recv in flight */
    assert_status(C->send(world, out, 256, DT_F32, 2, 8, NULL, &s1), DT_ERR_INVALID);
    assert_msg("strict device: send #2 (f32, 1024 bytes to rank 2, tag 8): recv #3 (f32, 1024 "
               "bytes from rank 2, tag 1) on the same group is still in flight (not waited for) "
               "and was not started with this send: on NCCL two ranks that each send before "
               "they receive block in their sends, a deadlock once a message exceeds NCCL's "
               "buffers; start the two together with sendrecv");
    assert_ok(C->wait(world, r1, -1));
    /* a blocking send is done when it returns */
    assert_ok(C->send(world, out, 256, DT_F32, 2, 8, NULL, NULL));
    assert_ok(C->recv(world, in, 256, DT_F32, 2, 9, NULL, &r1));
    assert_ok(C->wait(world, r1, -1));
    /* sendrecv: the exchange started as one; a send before it in flight,
     * a recv after it, both fine (1F1B's warm-up send, then its steady
     * state, then its cool-down recv) */
    assert_ok(C->send(world, out, 256, DT_F32, 2, 10, NULL, &s1));
    dt_comm_req_t *rs = NULL, *rr = NULL;
    assert_ok(C->sendrecv(world, out, 256, in, 256, DT_F32, 2, 2, 12, 3, NULL, &rs, &rr));
    assert_non_null(rs);
    assert_non_null(rr);
    assert_ptr_not_equal(rs, rr);
    assert_ok(C->wait(world, rr, -1));
    assert_ok(C->recv(world, in, 256, DT_F32, 2, 5, NULL, &r1));
    assert_ok(C->wait(world, r1, -1));
    assert_ok(C->wait(world, rs, -1));
    assert_ok(C->wait(world, s1, -1));
    assert_int_equal(calls[DT_ICOMM_SENDRECV], 1);
    /* another group: its order is its own */
    dt_comm_t *sub = NULL;
    assert_ok(C->split(world, 0, 1, &sub));
    assert_ok(C->send(world, out, 256, DT_F32, 1, 0, NULL, &s1));
    assert_ok(C->recv(sub, in, 256, DT_F32, 1, 0, NULL, &r1));
    assert_ok(C->wait(sub, r1, -1));
    assert_ok(C->send(sub, out, 256, DT_F32, 1, 0, NULL, &rs));
    assert_status(C->recv(sub, in, 256, DT_F32, 1, 0, NULL, &r1), DT_ERR_INVALID);
    assert_msg_starts("strict device: recv #7 (f32, 1024 bytes from rank 1, tag 0): send #6 "
                      "(f32, 1024 bytes to rank 1, tag 0) on the same group is still in flight");
    assert_ok(C->wait(sub, rs, -1));
    assert_ok(C->wait(world, s1, -1));
    C->finalize(sub);
    assert_ok(D->free(dev, out));
    assert_ok(D->free(dev, in));
}

/* ---- symmetric memory, the summary -------------------------------------------- */

static void test_sym_alloc_refused(void **state)
{
    (void)state;
    void *p = (void *)&fake_sub;
    assert_status(C->sym_alloc(world, 4096, DT_TAG_GRADS, &p), DT_ERR_UNSUPPORTED);
    assert_msg("strict device: sym_alloc #1: symmetric memory is host memory every rank maps, "
               "which a device communicator does not have; refused, so buffers go in device "
               "memory as on a GPU");
    assert_int_equal(calls[DT_ICOMM_SYM_ALLOC], 0);
}

static void test_summary(void **state)
{
    (void)state;
    float *a = dalloc(16 * sizeof(float), DT_TAG_GRADS);
    float loss = 0, host[4];
    assert_ok(C->all_reduce(world, a, a, 16, DT_F32, DT_OP_SUM, NULL, NULL));
    assert_ok(C->all_reduce(world, &loss, &loss, 1, DT_F32, DT_OP_SUM, NULL, NULL));
    assert_ok(C->all_gather(world, &loss, host, 1, DT_F32, NULL, NULL));
    assert_status(C->send(world, host, 4, DT_F32, 0, 0, NULL, NULL), DT_ERR_INVALID);
    assert_ok(C->barrier(world, NULL));
    char buf[400] = {0};
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    assert_non_null(f);
    dt_interpose_strict_print(S, f, "strict device (rank 1, fake over cpu):");
    fclose(f);
    assert_string_equal(buf, "strict device (rank 1, fake over cpu): 4 comm calls checked: 2 "
                             "buffers in device memory, 4 control messages in host memory (at "
                             "most 16 bytes); 1 refused\n");
    assert_ok(D->free(dev, a));
}

int main(void)
{
    /* never dlclosed: OpenBLAS threads live as long as the process */
    CPU = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_cpu.so", DT_ENTRY_STRING(device, 1),
                               NULL);
    if (!CPU) {
        fprintf(stderr, "%s\n", dt_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_device_memory_is_allowed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_buffer_overrunning_its_allocation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reduce_recv_on_root_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_host_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dtypes_nccl_cannot_move, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ungrouped_exchange, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sym_alloc_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_summary, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
