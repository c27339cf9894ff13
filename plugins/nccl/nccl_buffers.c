/*
 * plugins/nccl/nccl_buffers.c - what the nccl communicator decides about an
 * operation's buffers before NCCL sees them: the NCCL type each dtype
 * travels as, what memory each buffer is (comm.h's rule: device memory of
 * the group's GPU, or host memory for control messages), and where host
 * buffers go in the group's bounce buffers.  Pure decisions
 * (nccl_logic.h): the pointer-attribute query is passed in, so the tests
 * drive every case with a fake one.
 */
#include "dtrain/comm.h"
#include "common/comm/comm_text.h"
#include "dtrain/status.h"
#include "nccl_logic.h"

int nccl_wire(int kind, int dtype, uint64_t count, ncclDataType_t *nt, uint64_t *ncount)
{
    *ncount = count;
    switch (dtype) {
    case DT_F32: *nt = ncclFloat32; return 1;
    case DT_BF16: *nt = ncclBfloat16; return 1;
    case DT_F16: *nt = ncclFloat16; return 1;
    case DT_F64: *nt = ncclFloat64; return 1;
    case DT_I32: *nt = ncclInt32; return 1;
    case DT_I64: *nt = ncclInt64; return 1;
    case DT_U8: *nt = ncclUint8; return 1;
    case DT_U16:
        /* no 16-bit integer in NCCL: bytes, where nothing is computed */
        if (kind == DT_COMM_OP_ALL_GATHER || kind == DT_COMM_OP_BROADCAST ||
            kind == DT_COMM_OP_SEND || kind == DT_COMM_OP_RECV) {
            *nt = ncclUint8;
            *ncount = count * 2;
            return 1;
        }
        return 0;
    default: return 0;
    }
}

nccl_mem_t nccl_mem_of(nccl_attr_fn attr, const void *p, int gpu, int *where,
                       cudaError_t *err)
{
    if (where)
        *where = -1;
    if (err)
        *err = cudaSuccess;
    if (!p)
        return NCCL_MEM_NONE;
    struct cudaPointerAttributes a = {.type = cudaMemoryTypeUnregistered, .device = -1};
    cudaError_t e = attr(&a, p);
    if (e != cudaSuccess) {
        if (err)
            *err = e;
        return NCCL_MEM_UNKNOWN;
    }
    switch (a.type) {
    case cudaMemoryTypeUnregistered:
    case cudaMemoryTypeHost:
        /* pinned memory too: NCCL's kernels could read it through the
         * mapping, but over the host link at every hop and only where
         * the host memory is mapped; staging is one copy each way */
        return NCCL_MEM_HOST;
    case cudaMemoryTypeManaged:
        return NCCL_MEM_DEVICE; /* the GPU reads it; pages migrate */
    case cudaMemoryTypeDevice:
        if (where)
            *where = a.device;
        return a.device == gpu ? NCCL_MEM_DEVICE : NCCL_MEM_OTHER_GPU;
    default:
        return NCCL_MEM_UNKNOWN;
    }
}

int nccl_mem_allowed(int kind, nccl_mem_t m)
{
    switch (m) {
    case NCCL_MEM_NONE:
    case NCCL_MEM_DEVICE: return DT_OK;
    case NCCL_MEM_HOST:
        return kind == DT_COMM_OP_SEND || kind == DT_COMM_OP_RECV ? DT_ERR_UNSUPPORTED : DT_OK;
    default: return DT_ERR_INVALID;
    }
}

static uint64_t align_up(uint64_t x)
{
    return (x + NCCL_BOUNCE_ALIGN - 1) / NCCL_BOUNCE_ALIGN * NCCL_BOUNCE_ALIGN;
}

int nccl_stage_plan(int kind, uint64_t count, size_t esize, int32_t size, int32_t rank,
                    int32_t root, const void *send, const void *recv, nccl_mem_t send_mem,
                    nccl_mem_t recv_mem, nccl_stage_plan_t *p)
{
    *p = (nccl_stage_plan_t){0};
    const uint64_t one = count * esize, all = one * (uint64_t)size;
    const uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv; /* compared only */
    int in_place = 0;   /* staged send and recv share one region */
    uint64_t inner = 0; /* where the send lies in the recv region (or the
                         * recv in the send region) when in place */
    switch (kind) {
    case DT_COMM_OP_ALL_REDUCE:
        p->send_bytes = p->recv_bytes = one;
        in_place = send && s == r;
        break;
    case DT_COMM_OP_REDUCE:
        p->send_bytes = one;
        p->recv_bytes = rank == root ? one : 0;
        in_place = rank == root && send && s == r;
        break;
    case DT_COMM_OP_REDUCE_SCATTER:
        p->send_bytes = all;
        p->recv_bytes = one;
        inner = (uint64_t)rank * one;
        in_place = send && recv && r == s + inner;
        break;
    case DT_COMM_OP_ALL_GATHER:
        p->send_bytes = one;
        p->recv_bytes = all;
        inner = (uint64_t)rank * one;
        in_place = send && recv && s == r + inner;
        break;
    case DT_COMM_OP_BROADCAST:
        p->send_bytes = p->recv_bytes = one;
        in_place = 1;
        break;
    default: return 0;
    }
    p->stage_send = send_mem == NCCL_MEM_HOST;
    p->stage_recv = recv_mem == NCCL_MEM_HOST && p->recv_bytes > 0;
    if (!p->stage_send && !p->stage_recv)
        return 0;
    /* in place only when both halves are staged (both host memory: the
     * one case where the caller's aliasing can be kept) */
    if (in_place && p->stage_send && p->stage_recv) {
        if (kind == DT_COMM_OP_REDUCE_SCATTER) {
            p->send_off = 0;
            p->recv_off = inner; /* recv inside the send region */
            p->dev_bytes = all;
        } else if (kind == DT_COMM_OP_ALL_GATHER) {
            p->recv_off = 0;
            p->send_off = inner; /* send inside the recv region */
            p->dev_bytes = all;
        } else {
            p->send_off = p->recv_off = 0;
            p->dev_bytes = one;
        }
    } else {
        p->send_off = 0;
        p->recv_off = p->stage_send ? align_up(p->send_bytes) : 0;
        p->dev_bytes = (p->stage_send ? align_up(p->send_bytes) : 0) +
                       (p->stage_recv ? p->recv_bytes : 0);
    }
    /* broadcast: the root's buffer goes in, the others' comes out */
    p->copy_in = p->stage_send && p->send_bytes > 0 &&
                 (kind != DT_COMM_OP_BROADCAST || rank == root);
    p->copy_out = p->stage_recv && (kind != DT_COMM_OP_BROADCAST || rank != root);
    uint64_t in = p->copy_in ? p->send_bytes : 0, out = p->copy_out ? p->recv_bytes : 0;
    p->host_bytes = in > out ? in : out;
    return 1;
}
