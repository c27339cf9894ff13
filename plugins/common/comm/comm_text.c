/*
 * plugins/common/comm/comm_text.c - a communicator's operations and ranks in
 * messages, and the argument checks every operation makes (see
 * plugins/common/comm/comm_text.h).
 */
#include "common/comm/comm_text.h"

#include <stdarg.h>
#include <stdio.h>

#include "dtrain/tensor.h"

const char *dt_comm_op_name(int kind)
{
    switch (kind) {
    case DT_COMM_OP_ALL_REDUCE: return "all_reduce";
    case DT_COMM_OP_REDUCE_SCATTER: return "reduce_scatter";
    case DT_COMM_OP_ALL_GATHER: return "all_gather";
    case DT_COMM_OP_BROADCAST: return "broadcast";
    case DT_COMM_OP_REDUCE: return "reduce";
    case DT_COMM_OP_BARRIER: return "barrier";
    case DT_COMM_OP_SEND: return "send";
    case DT_COMM_OP_RECV: return "recv";
    default: return "?";
    }
}

const char *dt_comm_redop_name(int op)
{
    switch (op) {
    case DT_OP_SUM: return "sum";
    case DT_OP_AVG: return "avg";
    case DT_OP_MAX: return "max";
    case DT_OP_MIN: return "min";
    default: return "?";
    }
}

/* 1 when group rank r is named with its world rank. */
static int with_world(const dt_comm_names_t *g, int32_t r)
{
    return !g->is_world && g->wranks && r >= 0 && r < g->size;
}

void dt_comm_fmt_rank(const dt_comm_names_t *g, int32_t r, char *buf, size_t cap)
{
    if (with_world(g, r))
        snprintf(buf, cap, "rank %d (world rank %d)", (int)r, (int)g->wranks[r]);
    else
        snprintf(buf, cap, "rank %d", (int)r);
}

void dt_comm_fmt_ranks(const dt_comm_names_t *g, const int *list, int n, char *buf,
                       size_t cap)
{
    if (n <= 0) {
        snprintf(buf, cap, "no rank (the condition was met meanwhile)");
        return;
    }
    size_t len = (size_t)snprintf(buf, cap, "%s", n == 1 ? "rank " : "ranks ");
    for (int i = 0; i < n && len < cap; i++) {
        if (with_world(g, list[i]))
            len += (size_t)snprintf(buf + len, cap - len, "%s%d (world rank %d)",
                                    i ? ", " : "", list[i], (int)g->wranks[list[i]]);
        else
            len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? ", " : "", list[i]);
    }
}

void dt_comm_op_text(const dt_comm_names_t *g, const dt_comm_op_desc_t *d, char *buf,
                     size_t cap)
{
    char seq[32] = "";
    if (d->seq)
        snprintf(seq, sizeof seq, " #%llu", (unsigned long long)d->seq);
    unsigned long long bytes = (unsigned long long)d->bytes;
    const char *dt = dt_dtype_name(d->dtype), *gn = g->gname;
    switch (d->kind) {
    case DT_COMM_OP_BARRIER:
        snprintf(buf, cap, "barrier%s on group %s", seq, gn);
        break;
    case DT_COMM_OP_SEND:
    case DT_COMM_OP_RECV: {
        char who[96];
        dt_comm_fmt_rank(g, d->root, who, sizeof who);
        snprintf(buf, cap, "%s%s %s %s (tag %d, %s, %llu bytes) on group %s",
                 dt_comm_op_name(d->kind), seq, d->kind == DT_COMM_OP_SEND ? "to" : "from",
                 who, (int)d->tag, dt, bytes, gn);
        break;
    }
    case DT_COMM_OP_BROADCAST:
        snprintf(buf, cap, "broadcast%s (%s, %llu bytes, root %d) on group %s", seq, dt,
                 bytes, (int)d->root, gn);
        break;
    case DT_COMM_OP_REDUCE:
        snprintf(buf, cap, "reduce%s (%s %s, %llu bytes, root %d) on group %s", seq, dt,
                 dt_comm_redop_name(d->op), bytes, (int)d->root, gn);
        break;
    case DT_COMM_OP_ALL_GATHER:
        snprintf(buf, cap, "all_gather%s (%s, %llu bytes per rank) on group %s", seq, dt,
                 bytes, gn);
        break;
    case DT_COMM_OP_REDUCE_SCATTER:
        snprintf(buf, cap, "reduce_scatter%s (%s %s, %llu bytes per rank) on group %s",
                 seq, dt, dt_comm_redop_name(d->op), bytes, gn);
        break;
    default: /* all_reduce */
        snprintf(buf, cap, "%s%s (%s, %llu bytes) on group %s", dt_comm_op_name(d->kind),
                 seq, dt, bytes, gn);
        break;
    }
}

int dt_comm_op_fail(const dt_host_v1_t *h, const dt_comm_names_t *g,
                    const dt_comm_op_desc_t *d, int status, const char *fmt, ...)
{
    char desc[256], text[512];
    dt_comm_op_text(g, d, desc, sizeof desc);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return h->set_error(h, status, "%s: %s", desc, text);
}

int dt_comm_check_dtype(const dt_host_v1_t *h, const dt_comm_names_t *g,
                        const dt_comm_op_desc_t *d)
{
    if (dt_dtype_size(d->dtype) != 0)
        return DT_OK;
    return dt_comm_op_fail(h, g, d, DT_ERR_INVALID, "unknown dtype %d", d->dtype);
}

static int is_float(int dtype)
{
    return dtype == DT_F32 || dtype == DT_F64 || dtype == DT_BF16 || dtype == DT_F16;
}

int dt_comm_check_reduce(const dt_host_v1_t *h, const dt_comm_names_t *g,
                         const dt_comm_op_desc_t *d)
{
    if (d->kind != DT_COMM_OP_ALL_REDUCE && d->kind != DT_COMM_OP_REDUCE_SCATTER &&
        d->kind != DT_COMM_OP_REDUCE)
        return DT_OK;
    if (d->op < DT_OP_SUM || d->op > DT_OP_MIN)
        return dt_comm_op_fail(h, g, d, DT_ERR_INVALID, "unknown reduction op %d", d->op);
    if (d->op == DT_OP_AVG && !is_float(d->dtype))
        return dt_comm_op_fail(h, g, d, DT_ERR_UNSUPPORTED,
                               "op avg is not defined for integer dtype %s",
                               dt_dtype_name(d->dtype));
    return DT_OK;
}

static int need_buf(const dt_host_v1_t *h, const dt_comm_names_t *g,
                    const dt_comm_op_desc_t *d, uint64_t count, const void *p,
                    const char *what)
{
    if (p || count == 0)
        return DT_OK;
    return dt_comm_op_fail(h, g, d, DT_ERR_INVALID, "%s buffer is NULL", what);
}

int dt_comm_sendrecv_reqs(const dt_host_v1_t *h, dt_comm_req_t **send_req,
                          dt_comm_req_t **recv_req)
{
    if (send_req)
        *send_req = NULL;
    if (recv_req)
        *recv_req = NULL;
    if (!send_req != !recv_req)
        return h->set_error(h, DT_ERR_INVALID, "sendrecv: send_req and recv_req are both "
                            "given or both NULL");
    return DT_OK;
}

int dt_comm_check_args(const dt_host_v1_t *h, const dt_comm_names_t *g,
                       const dt_comm_op_desc_t *d, int32_t rank, uint64_t count,
                       const void *send, const void *recv)
{
    int rooted = d->kind == DT_COMM_OP_BROADCAST || d->kind == DT_COMM_OP_REDUCE;
    int p2p = d->kind == DT_COMM_OP_SEND || d->kind == DT_COMM_OP_RECV;
    if ((rooted || p2p) && (d->root < 0 || d->root >= g->size))
        return dt_comm_op_fail(h, g, d, DT_ERR_INVALID,
                               "%s %d is not a rank of the group [0, %d)",
                               rooted ? "root" : "peer", (int)d->root, (int)g->size);
    int st = DT_OK;
    switch (d->kind) {
    case DT_COMM_OP_ALL_REDUCE:
    case DT_COMM_OP_REDUCE_SCATTER:
    case DT_COMM_OP_ALL_GATHER:
        if ((st = need_buf(h, g, d, count, send, "send")) == DT_OK)
            st = need_buf(h, g, d, count, recv, "recv");
        break;
    case DT_COMM_OP_BROADCAST:
        st = need_buf(h, g, d, count, send, "data");
        break;
    case DT_COMM_OP_REDUCE:
        if ((st = need_buf(h, g, d, count, send, "send")) == DT_OK && rank == d->root)
            st = need_buf(h, g, d, count, recv, "recv");
        break;
    case DT_COMM_OP_SEND:
        st = need_buf(h, g, d, count, send, "send");
        break;
    case DT_COMM_OP_RECV:
        st = need_buf(h, g, d, count, recv, "recv");
        break;
    default:
        break;
    }
    return st;
}

int dt_comm_check_init(const dt_host_v1_t *h, const dt_comm_init_v1_t *args,
                       dt_comm_t **out, dt_comm_init_v1_t *a)
{
    if (!h)
        return DT_ERR_INVALID;
    if (!out || !args || !a)
        return h->set_error(h, DT_ERR_INVALID, "init: NULL %s", out ? "args" : "out");
    *out = NULL;
    int rc = dt_args_read(h, "init args", a, sizeof *a, args, DT_COMM_INIT_V1_SIZE0);
    if (rc != DT_OK)
        return rc;
    if (a->size < 1 || a->rank < 0 || a->rank >= a->size)
        return h->set_error(h, DT_ERR_INVALID, "init: rank %d is not in [0, %d)",
                            (int)a->rank, (int)a->size);
    if (a->timeout_ms <= 0)
        return h->set_error(h, DT_ERR_INVALID, "init: timeout_ms must be > 0 (got %lld)",
                            (long long)a->timeout_ms);
    return DT_OK;
}

int dt_comm_check_host_memory(const dt_host_v1_t *h, const dt_comm_init_v1_t *a,
                              const char *comm)
{
    if (!h)
        return DT_ERR_INVALID;
    if (!a || !a->dev)
        return DT_OK;
    dt_device_props_v1_t props = {.struct_size = sizeof(dt_device_props_v1_t)};
    if (dt_device_ops(a->dev)->props(a->dev, &props) != DT_OK || props.host_visible)
        return DT_OK;
    return h->set_error(h, DT_ERR_UNSUPPORTED,
                        "device '%s' memory is not host memory; the %s communicator moves "
                        "host memory only (use nccl on GPUs)",
                        props.name, comm);
}

int dt_comm_check_wait(const dt_host_v1_t *h, const dt_comm_req_t *req)
{
    if (!h)
        return DT_ERR_INVALID;
    if (!req)
        return h->set_error(h, DT_ERR_INVALID, "wait: NULL request");
    return DT_OK;
}

int dt_comm_check_test(const dt_host_v1_t *h, const dt_comm_req_t *req, const int *done)
{
    if (!h)
        return DT_ERR_INVALID;
    if (!req || !done)
        return h->set_error(h, DT_ERR_INVALID, "test: NULL argument");
    return DT_OK;
}
