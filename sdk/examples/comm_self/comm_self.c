/*
 * comm_self.c - an example dtrain plugin to copy: a communicator for a
 * world of exactly one rank, where every collective is a copy.
 *
 * To start a new plugin: copy this folder, rename every "self" (file
 * names, the plugin name string, the CMake target), and replace the
 * bodies.  Only mandatory methods are implemented, and `sendrecv`, which
 * refuses as send and recv do (a pipeline stage asks for it first); the
 * optional `test` is left NULL and the core copes.  Build it against the INSTALLED SDK:
 *     cmake -S . -B build -DCMAKE_PREFIX_PATH=<dtrain prefix> && cmake --build build
 * or without CMake:
 *     cc -shared -fPIC -fvisibility=hidden -Wl,--no-undefined comm_self.c \
 *        $(pkg-config --cflags --libs dtrain-sdk) -o dtrain_self.so
 * and make dtrain find it: DTRAIN_PLUGIN_PATH=$PWD/build dtrain plugins
 */
#include <stdlib.h>
#include <string.h>

#include <dtrain/dtrain.h>

struct dt_comm {
    const dt_comm_ops_v1_t *ops; /* first: the table that made it (dtrain/comm.h) */
    const dt_host_v1_t *host;
    /* The compute device, when its memory is not the host's (a GPU):
     * buffers are device memory, copied by the device on the stream. */
    dt_device_t *dev;
};

/* Completed operations need no state: a request is a marker. */
static dt_comm_req_t *const done_req = (dt_comm_req_t *)&done_req;

/* Defined below; every handle this plugin makes starts with it. */
static const dt_comm_ops_v1_t self_ops;

static int self_init(const dt_host_v1_t *host, const dt_comm_init_v1_t *args, dt_comm_t **out)
{
    if (args->size != 1)
        return host->set_error(host, DT_ERR_CONFIG,
                               "world size is %d, but this plugin serves exactly one rank",
                               args->size);
    dt_comm_t *c = calloc(1, sizeof *c);
    if (!c)
        return host->set_error(host, DT_ERR_NOMEM, "out of memory");
    c->host = host;
    c->ops = &self_ops;
    if (args->dev) {
        dt_device_props_v1_t p = {.struct_size = sizeof p};
        int rc = dt_device_ops(args->dev)->props(args->dev, &p);
        if (rc != DT_OK) {
            free(c);
            return rc;
        }
        if (!p.host_visible) {
            c->dev = args->dev;
        }
    }
    *out = c;
    return DT_OK;
}

static void self_finalize(dt_comm_t *c) { free(c); }

static int self_rank_size(dt_comm_t *c, int32_t *rank, int32_t *size)
{
    *rank = 0;
    *size = 1;
    return DT_OK;
}

/* Copy `count` elements unless the operation is in place: with memmove
 * in host memory, or, on a device whose memory the host cannot touch, by
 * the device after the work queued on `s`, waited for (a collective is
 * complete when its wait returns, and this one has no wait of its own). */
static int copy(dt_comm_t *c, void *dst, const void *src, uint64_t count, int dtype,
                dt_stream_t *s, dt_comm_req_t **req)
{
    size_t es = dt_dtype_size(dtype);
    if (es == 0)
        return c->host->set_error(c->host, DT_ERR_INVALID, "unknown dtype %d", dtype);
    if (dst != src && count && c->dev) {
        int rc = dt_device_ops(c->dev)->memcpy_async(c->dev, dst, src, count * es, DT_COPY_D2D, s);
        if (rc == DT_OK)
            rc = dt_device_ops(c->dev)->stream_sync(c->dev, s);
        if (rc != DT_OK)
            return rc;
    } else if (dst != src && count) {
        memmove(dst, src, count * es);
    }
    if (req)
        *req = done_req;
    return DT_OK;
}

static int self_all_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t count,
                           int dtype, int op, dt_stream_t *s, dt_comm_req_t **req)
{
    return copy(c, recv, send, count, dtype, s, req); /* sum/avg/max/min of one */
}

static int self_reduce_scatter(dt_comm_t *c, const void *send, void *recv, uint64_t n,
                               int dtype, int op, dt_stream_t *s, dt_comm_req_t **req)
{
    return copy(c, recv, send, n, dtype, s, req);
}

static int self_all_gather(dt_comm_t *c, const void *send, void *recv, uint64_t n, int dtype,
                           dt_stream_t *s, dt_comm_req_t **req)
{
    return copy(c, recv, send, n, dtype, s, req);
}

static int self_broadcast(dt_comm_t *c, void *buf, uint64_t n, int dtype, int32_t root,
                          dt_stream_t *s, dt_comm_req_t **req)
{
    return copy(c, buf, buf, n, dtype, s, req);
}

static int self_reduce(dt_comm_t *c, const void *send, void *recv, uint64_t n, int dtype,
                       int op, int32_t root, dt_stream_t *s, dt_comm_req_t **req)
{
    return copy(c, recv, send, n, dtype, s, req);
}

static int self_p2p(dt_comm_t *c, int32_t peer)
{
    return c->host->set_error(c->host, DT_ERR_INVALID,
                              "send/recv to rank %d: a world of one rank has no peers", peer);
}

static int self_send(dt_comm_t *c, const void *buf, uint64_t n, int dtype, int32_t peer,
                     int32_t tag, dt_stream_t *s, dt_comm_req_t **req)
{
    return self_p2p(c, peer);
}

static int self_recv(dt_comm_t *c, void *buf, uint64_t n, int dtype, int32_t peer, int32_t tag,
                     dt_stream_t *s, dt_comm_req_t **req)
{
    return self_p2p(c, peer);
}

static int self_sendrecv(dt_comm_t *c, const void *sendbuf, uint64_t send_count, void *recvbuf,
                         uint64_t recv_count, int dtype, int32_t send_peer, int32_t recv_peer,
                         int32_t send_tag, int32_t recv_tag, dt_stream_t *s,
                         dt_comm_req_t **send_req, dt_comm_req_t **recv_req)
{
    if (send_req)
        *send_req = NULL;
    if (recv_req)
        *recv_req = NULL;
    return self_p2p(c, send_peer);
}

static int self_barrier(dt_comm_t *c, dt_comm_req_t **req)
{
    if (req)
        *req = done_req;
    return DT_OK;
}

static int self_wait(dt_comm_t *c, dt_comm_req_t *req, int64_t timeout_ms) { return DT_OK; }

static int self_split(dt_comm_t *c, int32_t color, int32_t key, dt_comm_t **out)
{
    *out = NULL;
    if (color == DT_COMM_NO_COLOR)
        return DT_OK;
    dt_comm_t *n = calloc(1, sizeof *n);
    if (!n)
        return c->host->set_error(c->host, DT_ERR_NOMEM, "out of memory");
    n->host = c->host;
    *out = n;
    return DT_OK;
}

static int self_abort(dt_comm_t *c, const char *reason) { return DT_OK; }

static const dt_config_key_t self_keys[] = {
    {.name = "verbose", .type = DT_CFG_BOOL, .def = "false", .doc = "an example key: log each call"},
};

static const dt_comm_ops_v1_t self_ops = {
    .info = DT_PLUGIN_INFO(COMM, dt_comm_ops_v1_t, "self", "0.1.0",
                           "example: a one-rank world, collectives are copies", self_keys),
    .init = self_init,
    .finalize = self_finalize,
    .rank_size = self_rank_size,
    .all_reduce = self_all_reduce,
    .reduce_scatter = self_reduce_scatter,
    .all_gather = self_all_gather,
    .broadcast = self_broadcast,
    .reduce = self_reduce,
    .send = self_send,
    .recv = self_recv,
    .barrier = self_barrier,
    .wait = self_wait,
    .split = self_split,
    .abort = self_abort,
    .sendrecv = self_sendrecv,
};

DT_PLUGIN_ENTRY(comm, 1, dt_comm_ops_v1_t, &self_ops)
