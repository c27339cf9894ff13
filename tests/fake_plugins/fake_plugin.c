/*
 * tests/fake_plugins/fake_plugin.c - one plugin source built many times
 * with -D switches, each build a way of being a (broken) plugin the loader
 * must refuse with the right message (tests/unit/core/loader/test_loader.c).  A comm
 * plugin unless FAKE_DEVICE (see the device part below for its switches).
 *
 *   FAKE_NAME="x"        name declared in info (the build passes the file's
 *                        name, except for the name-mismatch build)
 *   FAKE_NO_ENTRY        export no entry symbol at all
 *   FAKE_MAJOR=2         export dtrain_comm_v2 only, info.abi_major 2
 *   FAKE_TWO_MAJORS      export dtrain_comm_v1 (version "one") and
 *                        dtrain_comm_v2 (version "two")
 *   FAKE_SMALL           struct_size ends before the optional `test`
 *                        (as built against an older minor)
 *   FAKE_TINY            struct_size ends before mandatory `barrier`
 *   FAKE_NULL_METHOD     all_reduce is NULL
 *   FAKE_WRONG_KIND      info.kind says device
 *   FAKE_NEWER           built against a newer minor: abi_minor + 1 and a
 *                        larger struct with a slot this dtrain does not know
 *   FAKE_UNDEF           calls a function no library defines
 *   FAKE_BAD_HANDLE      init hands out a dt_comm whose first member is not
 *                        its ops table (the rule in dtrain/comm.h)
 *   FAKE_INFO_TINY       the entry returns a 12-byte table: abi_major,
 *                        abi_minor and struct_size (4) only, no room for
 *                        the rest of the info block (the loader must not
 *                        read info.kind before it checked struct_size)
 *
 * The valid build's init reads its config key `init_fail`: "message" makes
 * init fail through host->set_error, "silent" without a message.  Its
 * cleanup_job leaves an empty file <cleanup_dir>/<job id> when the key
 * `cleanup_dir` is set, so a test sees the call and the config it read.
 */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "dtrain/dtrain.h"

#ifndef FAKE_NAME
#define FAKE_NAME "fake"
#endif
#ifndef FAKE_MAJOR
#define FAKE_MAJOR 1
#endif

#ifndef FAKE_DEVICE

struct dt_comm {
    const dt_comm_ops_v1_t *ops; /* first: the table that made it (dtrain/comm.h) */
    const dt_host_v1_t *host;
    int32_t rank, size;
    int64_t count;
};

/* Requests of this single-rank comm complete at once; one static object
 * stands for all of them. */
static int fake_done_req;

static const dt_config_key_t fake_keys[] = {
    {"init_fail", DT_CFG_ENUM, "\"none\"", 1, 0, "none|message|silent",
     "make init fail: with a message, or silently"},
    {"greeting", DT_CFG_STRING, "\"hello\"", 1, 0, NULL, "a string"},
    {"count", DT_CFG_INT, "3", 1, 10, NULL, "an integer in [1, 10]"},
    {"ratio", DT_CFG_FLOAT, "0.5", 0, 1, NULL, "a float in [0, 1]"},
    {"verbose", DT_CFG_BOOL, "false", 1, 0, NULL, "a bool"},
    {"cleanup_dir", DT_CFG_STRING, "\"\"", 1, 0, NULL,
     "folder where cleanup_job records its calls; empty = nowhere"},
};

#ifdef FAKE_UNDEF
/* Defined nowhere: the module links (without --no-undefined) but cannot
 * be bound. */
int dt_fake_missing_symbol(void);
#endif

/* The exported table (below, one per build): every handle starts with it. */
static const dt_comm_ops_v1_t *fake_table(void);

static int fake_init(const dt_host_v1_t *host, const dt_comm_init_v1_t *args,
                     dt_comm_t **out)
{
#ifdef FAKE_UNDEF
    if (dt_fake_missing_symbol())
        return DT_ERR_SYSTEM;
#endif
    const char *mode = "none";
    int rc = host->cfg_string(host, "init_fail", &mode);
    if (rc != DT_OK)
        return rc;
    if (strcmp(mode, "message") == 0)
        return host->set_error(host, DT_ERR_SYSTEM,
                               "cannot open /dev/fake: No such device");
    if (strcmp(mode, "silent") == 0)
        return DT_ERR_SYSTEM;

    dt_comm_t *c = host->alloc(host, sizeof *c, DT_TAG_OTHER);
    if (!c)
        return DT_ERR_NOMEM;
    c->host = host;
#ifdef FAKE_BAD_HANDLE
    (void)fake_table;
    c->ops = NULL; /* forgot the rule: the core must refuse the handle */
#else
    c->ops = fake_table();
#endif
    c->rank = args ? args->rank : 0;
    c->size = args ? args->size : 1;
    rc = host->cfg_int(host, "count", &c->count);
    if (rc != DT_OK) {
        host->free(host, c);
        return rc;
    }
    host->log(host, DT_LOG_DEBUG, "init rank %d of %d", (int)c->rank,
              (int)c->size);
    *out = c;
    return DT_OK;
}

static void fake_finalize(dt_comm_t *c)
{
    if (c)
        c->host->free(c->host, c);
}

static int fake_rank_size(dt_comm_t *c, int32_t *rank, int32_t *size)
{
    *rank = c->rank;
    *size = c->size;
    return DT_OK;
}

static int done(dt_comm_req_t **req)
{
    if (req)
        *req = (dt_comm_req_t *)(void *)&fake_done_req;
    return DT_OK;
}

/* One rank: every reduction is a copy. */
static int fake_all_reduce(dt_comm_t *c, const void *send, void *recv,
                           uint64_t count, int dtype, int op,
                           dt_stream_t *stream, dt_comm_req_t **req)
{
    size_t esz = dt_dtype_size(dtype);
    if (esz == 0)
        return c->host->set_error(c->host, DT_ERR_UNSUPPORTED,
                                  "all_reduce: dtype %d", dtype);
    if (send != recv && count)
        memcpy(recv, send, count * esz);
    return done(req);
}

static int fake_reduce_scatter(dt_comm_t *c, const void *send, void *recv,
                               uint64_t recv_count, int dtype, int op,
                               dt_stream_t *stream, dt_comm_req_t **req)
{
    return fake_all_reduce(c, send, recv, recv_count, dtype, op, stream, req);
}

static int fake_all_gather(dt_comm_t *c, const void *send, void *recv,
                           uint64_t send_count, int dtype, dt_stream_t *stream,
                           dt_comm_req_t **req)
{
    return fake_all_reduce(c, send, recv, send_count, dtype, DT_OP_SUM, stream,
                           req);
}

static int fake_broadcast(dt_comm_t *c, void *buf, uint64_t count, int dtype,
                          int32_t root, dt_stream_t *stream,
                          dt_comm_req_t **req)
{
    return done(req);
}

static int fake_reduce(dt_comm_t *c, const void *send, void *recv,
                       uint64_t count, int dtype, int op, int32_t root,
                       dt_stream_t *stream, dt_comm_req_t **req)
{
    return fake_all_reduce(c, send, recv, count, dtype, op, stream, req);
}

static int fake_send(dt_comm_t *c, const void *buf, uint64_t count, int dtype,
                     int32_t peer, int32_t tag, dt_stream_t *stream,
                     dt_comm_req_t **req)
{
    return c->host->set_error(c->host, DT_ERR_INVALID,
                              "send to rank %d: the group has one rank",
                              (int)peer);
}

static int fake_recv(dt_comm_t *c, void *buf, uint64_t count, int dtype,
                     int32_t peer, int32_t tag, dt_stream_t *stream,
                     dt_comm_req_t **req)
{
    return c->host->set_error(c->host, DT_ERR_INVALID,
                              "recv from rank %d: the group has one rank",
                              (int)peer);
}

static int fake_barrier(dt_comm_t *c, dt_comm_req_t **req) { return done(req); }

static int fake_wait(dt_comm_t *c, dt_comm_req_t *req, int64_t timeout_ms)
{
    return DT_OK;
}

static int fake_split(dt_comm_t *c, int32_t color, int32_t key,
                      dt_comm_t **out)
{
    return c->host->set_error(c->host, DT_ERR_UNSUPPORTED, "split");
}

static int fake_abort(dt_comm_t *c, const char *reason) { return DT_OK; }

static int fake_test(dt_comm_t *c, dt_comm_req_t *req, int *is_done)
{
    *is_done = 1;
    return DT_OK;
}

static int fake_cleanup_job(const dt_host_v1_t *host, const char *job_id)
{
    const char *dir = "";
    int rc = host->cfg_string(host, "cleanup_dir", &dir);
    if (rc != DT_OK)
        return rc;
    if (strchr(job_id, '/'))
        return host->set_error(host, DT_ERR_INVALID,
                               "cleanup of job '%s': not a job id", job_id);
    if (!dir[0])
        return DT_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, job_id);
    FILE *f = fopen(path, "w");
    if (!f)
        return host->set_error(host, DT_ERR_IO, "cleanup of job %s: cannot "
                               "write %s", job_id, path);
    fclose(f);
    return DT_OK;
}

/* A comm ABI 1.1 that appended one slot (FAKE_NEWER). */
typedef struct fake_ops_v1_1 {
    dt_comm_ops_v1_t v1_0;
    int (*future_method)(dt_comm_t *c);
} fake_ops_v1_1_t;

#if defined(FAKE_SMALL)
#define FAKE_STRUCT_SIZE offsetof(dt_comm_ops_v1_t, test)
#elif defined(FAKE_TINY)
#define FAKE_STRUCT_SIZE offsetof(dt_comm_ops_v1_t, barrier)
#elif defined(FAKE_NEWER)
#define FAKE_STRUCT_SIZE sizeof(fake_ops_v1_1_t)
#else
#define FAKE_STRUCT_SIZE sizeof(dt_comm_ops_v1_t)
#endif

#ifdef FAKE_NEWER
#define FAKE_MINOR (DT_COMM_ABI_MINOR + 1)
#else
#define FAKE_MINOR DT_COMM_ABI_MINOR
#endif

#ifdef FAKE_WRONG_KIND
#define FAKE_KIND DT_KIND_DEVICE
#else
#define FAKE_KIND DT_KIND_COMM
#endif

#define FAKE_OPS(major_, version_)                                             \
    {                                                                          \
        .info = {                                                              \
            .abi_major = (major_),                                             \
            .abi_minor = FAKE_MINOR,                                           \
            .struct_size = (uint32_t)FAKE_STRUCT_SIZE,                         \
            .kind = FAKE_KIND,                                                 \
            .name = FAKE_NAME,                                                 \
            .version = (version_),                                             \
            .summary = "loader test double (" FAKE_NAME ")",                  \
            .config_keys = fake_keys,                                          \
            .n_config_keys = (uint32_t)DT_ARRAY_LEN(fake_keys),                \
        },                                                                     \
        .init = fake_init, .finalize = fake_finalize,                          \
        .rank_size = fake_rank_size, .all_reduce = FAKE_ALL_REDUCE,            \
        .reduce_scatter = fake_reduce_scatter,                                 \
        .all_gather = fake_all_gather, .broadcast = fake_broadcast,            \
        .reduce = fake_reduce, .send = fake_send, .recv = fake_recv,           \
        .barrier = fake_barrier, .wait = fake_wait, .split = fake_split,       \
        .abort = fake_abort,                                                   \
        /* Set even in the FAKE_SMALL build: a slot past struct_size must be   \
         * treated as absent whatever bytes lie there. */                      \
        .test = fake_test, .cleanup_job = fake_cleanup_job,                    \
    }

#ifdef FAKE_NULL_METHOD
#define FAKE_ALL_REDUCE NULL
#else
#define FAKE_ALL_REDUCE fake_all_reduce
#endif

#if defined(FAKE_INFO_TINY)
/* The three fields every table starts with, and nothing after them: an
 * object of exactly that size, so reading past it is a sanitizer error. */
static const struct {
    uint32_t abi_major, abi_minor, struct_size;
} fake_tiny = {1, DT_COMM_ABI_MINOR, 4};
DT_PLUGIN_ENTRY(comm, 1, void, &fake_tiny)
/* The methods exist (so the build has no unused functions) but nothing
 * exported reaches them. */
static const dt_comm_ops_v1_t fake_ops = FAKE_OPS(1, "0.1.0");
const dt_comm_ops_v1_t *fake_unexported(void);
const dt_comm_ops_v1_t *fake_unexported(void) { return &fake_ops; }

#elif defined(FAKE_NO_ENTRY)
/* Looks like a plugin, but nothing is exported. */
static const dt_comm_ops_v1_t fake_ops = FAKE_OPS(1, "0.1.0");
const dt_comm_ops_v1_t *fake_unexported(void);
const dt_comm_ops_v1_t *fake_unexported(void) { return &fake_ops; }

#elif defined(FAKE_NEWER)
static int fake_future(dt_comm_t *c) { return DT_OK; }
static const fake_ops_v1_1_t fake_ops = {
    .v1_0 = FAKE_OPS(1, "1.1.0"),
    .future_method = fake_future,
};
DT_PLUGIN_ENTRY(comm, 1, dt_comm_ops_v1_t, &fake_ops.v1_0)

#else
#ifdef FAKE_TWO_MAJORS
#define FAKE_VERSION "one"
#else
#define FAKE_VERSION "0.1.0"
#endif
static const dt_comm_ops_v1_t fake_ops = FAKE_OPS(FAKE_MAJOR, FAKE_VERSION);
#if FAKE_MAJOR == 1
DT_PLUGIN_ENTRY(comm, 1, dt_comm_ops_v1_t, &fake_ops)
#else
DT_PLUGIN_ENTRY(comm, 2, dt_comm_ops_v1_t, &fake_ops)
#endif
#ifdef FAKE_TWO_MAJORS
/* The same methods as a "v2" table (the loader tests pretend v2 has v1's
 * layout); version tells the tables apart. */
static const dt_comm_ops_v1_t fake_ops_v2 = FAKE_OPS(2, "two");
DT_PLUGIN_ENTRY(comm, 2, dt_comm_ops_v1_t, &fake_ops_v2)
#endif
#endif
static const dt_comm_ops_v1_t *fake_table(void)
{
    return (const dt_comm_ops_v1_t *)(const void *)&fake_ops;
}
#endif /* !FAKE_DEVICE */

#ifdef FAKE_DEVICE
/* ------------------------------------------------------------------------
 * A device plugin: the runtime and the kernel table it hands out through
 * `kernels`, with the core set of kernels and none of the optional ones.
 * The loader only checks the tables; nothing here is ever called but
 * `kernels`, so every other slot is one stub.
 *
 *   FAKE_NULL_KERNEL     the mandatory kernel gelu_backward is NULL
 *   FAKE_KERNELS_TINY    the kernel table's struct_size ends before the
 *                        mandatory `cast` (too small for the core set)
 *   FAKE_KERNELS_NONE    `kernels` returns NULL
 *   FAKE_KERNELS_MAJOR=2 the kernel table declares kernel ABI 2.0
 *   FAKE_NULL_RUNTIME    the mandatory runtime slot `kernels` is NULL
 */
struct dt_device {
    const dt_device_ops_v1_t *ops; /* first: the table that made it (dtrain/device.h) */
    int unused;
};

static int fake_unused(void) { return DT_ERR_UNSUPPORTED; }
/* `fake_unused` as the type of slot `field` of `type`, through void (*)(void)
 * (the one function type that converts to any other without a warning). */
#define STUB(type, field)                                                      \
    .field = (__typeof__(((type *)0)->field))(void (*)(void))fake_unused

#ifndef FAKE_KERNELS_MAJOR
#define FAKE_KERNELS_MAJOR DT_KERNELS_ABI_MAJOR
#endif
#ifdef FAKE_KERNELS_TINY
#define FAKE_KERNELS_SIZE offsetof(dt_kernels_v1_t, cast)
#else
#define FAKE_KERNELS_SIZE sizeof(dt_kernels_v1_t)
#endif

#ifndef FAKE_NULL_RUNTIME
static const dt_kernels_v1_t fake_kernels = {
    .info = {.abi_major = FAKE_KERNELS_MAJOR,
             .abi_minor = DT_KERNELS_ABI_MINOR,
             .struct_size = (uint32_t)FAKE_KERNELS_SIZE},
    STUB(dt_kernels_v1_t, matmul_forward),
    STUB(dt_kernels_v1_t, matmul_backward),
    STUB(dt_kernels_v1_t, embedding_forward),
    STUB(dt_kernels_v1_t, embedding_backward),
    STUB(dt_kernels_v1_t, gelu_forward),
#ifndef FAKE_NULL_KERNEL
    STUB(dt_kernels_v1_t, gelu_backward),
#endif
    STUB(dt_kernels_v1_t, softmax_xent_forward),
    STUB(dt_kernels_v1_t, softmax_xent_backward),
    STUB(dt_kernels_v1_t, axpy),
    STUB(dt_kernels_v1_t, sumsq),
    /* Set even in the FAKE_KERNELS_TINY build: a slot past struct_size is
     * absent whatever bytes lie there. */
    STUB(dt_kernels_v1_t, cast),
};

static const dt_kernels_v1_t *fake_kernel_table(void)
{
#ifdef FAKE_KERNELS_NONE
    (void)fake_kernels;
    return NULL;
#else
    return &fake_kernels;
#endif
}
#endif

static const dt_device_ops_v1_t fake_device_ops = {
    .info = DT_PLUGIN_INFO_NOKEYS(DEVICE, dt_device_ops_v1_t, FAKE_NAME, "0.1.0",
                                  "loader test double (" FAKE_NAME ")"),
    STUB(dt_device_ops_v1_t, init),
    STUB(dt_device_ops_v1_t, finalize),
    STUB(dt_device_ops_v1_t, props),
#ifndef FAKE_NULL_RUNTIME
    .kernels = fake_kernel_table,
#endif
    STUB(dt_device_ops_v1_t, alloc),
    STUB(dt_device_ops_v1_t, free),
    STUB(dt_device_ops_v1_t, mem_stats),
    STUB(dt_device_ops_v1_t, mem_reset_peaks),
    STUB(dt_device_ops_v1_t, host_alloc),
    STUB(dt_device_ops_v1_t, host_free),
    STUB(dt_device_ops_v1_t, stream_create),
    STUB(dt_device_ops_v1_t, stream_destroy),
    STUB(dt_device_ops_v1_t, stream_sync),
    STUB(dt_device_ops_v1_t, event_create),
    STUB(dt_device_ops_v1_t, event_destroy),
    STUB(dt_device_ops_v1_t, event_record),
    STUB(dt_device_ops_v1_t, stream_wait_event),
    STUB(dt_device_ops_v1_t, event_sync),
    STUB(dt_device_ops_v1_t, synchronize),
    STUB(dt_device_ops_v1_t, memcpy_async),
    STUB(dt_device_ops_v1_t, memset_async),
};
DT_PLUGIN_ENTRY(device, 1, dt_device_ops_v1_t, &fake_device_ops)
#endif /* FAKE_DEVICE */
