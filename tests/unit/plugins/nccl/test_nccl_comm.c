/*
 * tests/unit/plugins/nccl/test_nccl_comm.c - the nccl communicator (dtrain_nccl.so) on
 * the cuda device, through its ops table, in forked ranks (one GPU each;
 * the parent never initialises CUDA, so that the ranks can).
 *
 * Without arguments (any machine whose build has the plugin): it loads,
 * its summary states what comm.h asks (host control messages staged, bf16
 * and f16 rounded at every step), and init refuses the cpu device naming
 * what is missing.
 *
 * `gpu` (skipped with the reason, exit 77, without a CUDA device):
 *  - the core's control messages on host memory, at one rank on one GPU
 *    and at two ranks on two: the config hash's i64 all_gather from the
 *    stack, a u8 broadcast of an error text, f64 and f32 and i32
 *    all_reduces in place, an out-of-place u8 all_gather and f32
 *    reduce_scatter, an f64 reduce to the root (recv NULL elsewhere), a
 *    started host all_reduce whose request is complete, a host all_gather
 *    above the kept bounce size and a small one after it; beside them the
 *    device path: dt_norm's f64 all_reduce in device memory, a u16
 *    all_gather moved as bytes; and the refusals: a u16 all_reduce
 *    ("NCCL has no such type"), a host send (host memory in send/recv);
 *    the barrier, and a healthy group after it all;
 *  - the device guard (2 GPUs): a group on GPU 1 works while GPU 0 is
 *    current (another instance opened last) and from a second thread;
 *  - abort while a wait waits (2 GPUs): rank 1 leaves rank 0's second
 *    all_reduce unmatched; another thread of rank 0 aborts; abort returns
 *    promptly and the wait fails with DT_ERR_REMOTE naming the reason.
 *
 * Written before any multi-GPU machine was available: the 2-GPU cases
 * have not run yet.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cuda_probe.h"
#include "dtrain/dtrain.h"
#include "mp_check.h"
#include "mp_harness.h"
#include "test_host.h"
#include "test_plugin.h"
#include "util/error.h"

#define NCCL_PLUGIN DT_TEST_PLUGIN_DIR "/dtrain_nccl.so"
#define CUDA_PLUGIN DT_TEST_PLUGIN_DIR "/dtrain_cuda.so"
#define CPU_PLUGIN DT_TEST_PLUGIN_DIR "/dtrain_cpu.so"

static const dt_comm_ops_v1_t *C;
static const dt_device_ops_v1_t *D;
static int g_gpus; /* CUDA devices, asked in a forked child */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------- without a GPU */

static void test_summary(void **state)
{
    (void)state;
    const char *s = C->info.summary;
    assert_non_null(strstr(s, "host-memory control messages staged through a device buffer"));
    assert_non_null(strstr(s, "bf16/f16 reduced in their own type, rounded at every step"));
}

static void test_refuses_cpu_device(void **state)
{
    (void)state;
    const dt_device_ops_v1_t *cpu = dt_test_plugin_entry(CPU_PLUGIN,
                                                         DT_ENTRY_STRING(device, 1), NULL);
    if (!cpu) {
        fprintf(stderr, "no cpu plugin: %s\n", dt_last_error());
        skip();
    }
    dt_test_host_t thd, thc;
    dt_test_host_init(&thd, "device/cpu", NULL);
    dt_test_host_init(&thc, "comm/nccl", NULL);
    dt_device_init_v1_t di = {.struct_size = sizeof di, .local_size = 1, .device_index = -1};
    dt_device_t *dev = NULL;
    assert_int_equal(cpu->init(&thd.host, &di, &dev), DT_OK);
    dt_comm_init_v1_t ci = {.struct_size = sizeof ci, .rank = 0, .size = 1, .local_size = 1,
                            .job_id = "nccltest-cpu", .timeout_ms = 1000,
                            .dev = dev};
    dt_comm_t *c = NULL;
    assert_int_equal(C->init(&thc.host, &ci, &c), DT_ERR_CONFIG);
    assert_null(c);
    assert_string_equal(dt_last_error(),
                        "comm/nccl: init: the nccl communicator runs on a CUDA device's "
                        "streams (run.device = \"cuda\"; dtrain bench comm --device cuda); "
                        "device \"cpu\" has no native stream");
    cpu->finalize(dev);
}

/* ------------------------------------------------------------ one rank */

typedef struct rank_env {
    dt_test_host_t thd, thc;
    dt_device_t *dev;
    dt_stream_t *cs;
    dt_comm_t *c;
} rank_env_t;

static void env_open(rank_env_t *e, int rank, int size, const char *job, int64_t timeout_ms,
                     const dt_test_kv_t *dev_kv)
{
    memset(e, 0, sizeof *e);
    dt_test_host_init(&e->thd, "device/cuda", dev_kv);
    dt_test_host_init(&e->thc, "comm/nccl", NULL);
    dt_device_init_v1_t di = {.struct_size = sizeof di, .rank = rank, .local_rank = rank,
                              .local_size = size, .device_index = -1};
    DT_MP_OK(D->init(&e->thd.host, &di, &e->dev));
    DT_MP_OK(D->stream_create(e->dev, &e->cs));
    dt_comm_init_v1_t ci = {.struct_size = sizeof ci, .rank = rank, .size = size,
                            .local_rank = rank, .local_size = size, .job_id = job,
                            .timeout_ms = timeout_ms, .dev = e->dev};
    DT_MP_OK(C->init(&e->thc.host, &ci, &e->c));
}

static void env_close(rank_env_t *e)
{
    C->finalize(e->c);
    D->stream_destroy(e->dev, e->cs);
    D->finalize(e->dev);
}

/* The core's control messages (core/train/consistency.c, train.c,
 * core/ckpt/ckpt.c) on host memory, the device path beside them, and the
 * refusals. */
static int rank_control(int rank, int size, const char *job, void *arg)
{
    (void)arg;
    rank_env_t e;
    env_open(&e, rank, size, job, 20000, NULL);
    dt_comm_t *c = e.c;

    /* consistency.c: the config hash, one i64 from the stack */
    int64_t mine = 1000 + rank;
    int64_t *hashes = calloc((size_t)size, sizeof *hashes);
    DT_MP_OK(C->all_gather(c, &mine, hashes, 1, DT_I64, NULL, NULL));
    for (int r = 0; r < size; r++)
        DT_MP_CHECK(hashes[r] == 1000 + r);
    free(hashes);

    /* train.c: rank 0's outcome and message */
    int32_t v = rank == 0 ? 5 : 0;
    DT_MP_OK(C->broadcast(c, &v, 1, DT_I32, 0, NULL, NULL));
    DT_MP_CHECK(v == 5);
    char msg[2048];
    memset(msg, rank == 0 ? 0 : 'x', sizeof msg);
    if (rank == 0)
        snprintf(msg, sizeof msg, "rank 0 says: the checkpoint folder is taken");
    DT_MP_OK(C->broadcast(c, msg, sizeof msg, DT_U8, 0, NULL, NULL));
    DT_MP_CHECK(strcmp(msg, "rank 0 says: the checkpoint folder is taken") == 0);

    /* f64 sums, the loss (f32 avg), ckpt's agree (i32 min), in place */
    double d = rank + 0.25;
    DT_MP_OK(C->all_reduce(c, &d, &d, 1, DT_F64, DT_OP_SUM, NULL, NULL));
    DT_MP_CHECK(d == size * (size - 1) / 2.0 + 0.25 * size);
    float loss = (float)(2 * rank + 1);
    DT_MP_OK(C->all_reduce(c, &loss, &loss, 1, DT_F32, DT_OP_AVG, NULL, NULL));
    DT_MP_CHECK(loss == (float)size);
    int32_t failed = rank == size - 1 ? rank : INT32_MAX;
    DT_MP_OK(C->all_reduce(c, &failed, &failed, 1, DT_I32, DT_OP_MIN, NULL, NULL));
    DT_MP_CHECK(failed == size - 1);

    /* consistency.c's diffs: u8 out of place; a reduce_scatter; a reduce
     * whose recv exists on the root only */
    char diff[480], *all = calloc((size_t)size, sizeof diff);
    memset(diff, 'a' + rank, sizeof diff);
    DT_MP_OK(C->all_gather(c, diff, all, sizeof diff, DT_U8, NULL, NULL));
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < sizeof diff; i++)
            DT_MP_CHECK(all[(size_t)r * sizeof diff + i] == 'a' + r);
    free(all);
    float rs_in[8], rs_out[4];
    for (int i = 0; i < 4 * size; i++)
        rs_in[i] = (float)(rank * 100 + i);
    DT_MP_OK(C->reduce_scatter(c, rs_in, rs_out, 4, DT_F32, DT_OP_SUM, NULL, NULL));
    for (int i = 0; i < 4; i++) {
        float want = 0;
        for (int r = 0; r < size; r++)
            want += (float)(r * 100 + rank * 4 + i);
        DT_MP_CHECK(rs_out[i] == want);
    }
    double red = rank + 1, red_out = -1;
    DT_MP_OK(C->reduce(c, &red, rank == 0 ? &red_out : NULL, 1, DT_F64, DT_OP_SUM, 0, NULL,
                       NULL));
    if (rank == 0)
        DT_MP_CHECK(red_out == size * (size + 1) / 2.0);

    /* a started host operation: complete when handed out */
    double s2 = 1.0;
    dt_comm_req_t *req = NULL;
    DT_MP_OK(C->all_reduce(c, &s2, &s2, 1, DT_F64, DT_OP_SUM, NULL, &req));
    DT_MP_CHECK(req != NULL);
    DT_MP_CHECK(s2 == (double)size);
    int done = 0;
    DT_MP_OK(C->test(c, req, &done));
    DT_MP_CHECK(done == 1);
    DT_MP_OK(C->wait(c, req, -1));

    /* above the kept bounce size (1 MiB), then a small one again */
    size_t big = 3u << 20;
    unsigned char *bin = malloc(big), *bout = malloc(big * (size_t)size);
    for (size_t i = 0; i < big; i++)
        bin[i] = (unsigned char)(i * 7 + (size_t)rank);
    DT_MP_OK(C->all_gather(c, bin, bout, big, DT_U8, NULL, NULL));
    for (int r = 0; r < size; r++)
        for (size_t i = 0; i < big; i += 4099)
            DT_MP_CHECK(bout[(size_t)r * big + i] == (unsigned char)(i * 7 + (size_t)r));
    free(bin);
    free(bout);
    int64_t again = 7;
    DT_MP_OK(C->all_reduce(c, &again, &again, 1, DT_I64, DT_OP_SUM, NULL, NULL));
    DT_MP_CHECK(again == 7 * size);

    /* the device path: dt_norm's f64 sum of squares in device memory */
    double *slot = NULL, x = rank + 1;
    DT_MP_OK(D->alloc(e.dev, sizeof(double), DT_TAG_OTHER, (void **)&slot));
    DT_MP_OK(D->memcpy_async(e.dev, slot, &x, sizeof x, DT_COPY_H2D, e.cs));
    DT_MP_OK(C->all_reduce(c, slot, slot, 1, DT_F64, DT_OP_SUM, e.cs, NULL));
    DT_MP_OK(D->memcpy_async(e.dev, &x, slot, sizeof x, DT_COPY_D2H, e.cs));
    DT_MP_OK(D->stream_sync(e.dev, e.cs));
    DT_MP_CHECK(x == size * (size + 1) / 2.0);
    DT_MP_OK(D->free(e.dev, slot));

    /* u16 moved as bytes, in device memory */
    uint16_t h16[3] = {(uint16_t)(60000 + rank), 1, (uint16_t)rank}, g16[6] = {0};
    uint16_t *d16 = NULL;
    DT_MP_OK(D->alloc(e.dev, sizeof(uint16_t) * 3 * (size_t)(size + 1), DT_TAG_OTHER,
                      (void **)&d16));
    DT_MP_OK(D->memcpy_async(e.dev, d16, h16, sizeof h16, DT_COPY_H2D, e.cs));
    DT_MP_OK(C->all_gather(c, d16, d16 + 3, 3, DT_U16, e.cs, NULL));
    DT_MP_OK(D->memcpy_async(e.dev, g16, d16 + 3, sizeof(uint16_t) * 3 * (size_t)size,
                             DT_COPY_D2H, e.cs));
    DT_MP_OK(D->stream_sync(e.dev, e.cs));
    for (int r = 0; r < size; r++)
        DT_MP_CHECK(g16[3 * r] == 60000 + r && g16[3 * r + 1] == 1 && g16[3 * r + 2] == r);

    /* refusals, leaving the group healthy */
    DT_MP_CHECK(C->all_reduce(c, d16, d16, 3, DT_U16, DT_OP_SUM, e.cs, NULL) ==
                DT_ERR_UNSUPPORTED);
    DT_MP_CHECK(strstr(dt_last_error(), "comm/nccl: all_reduce #") != NULL);
    DT_MP_CHECK(strstr(dt_last_error(), "dtype u16: NCCL has no such type") != NULL);
    DT_MP_OK(D->free(e.dev, d16));
    float hs[4] = {0};
    DT_MP_CHECK(C->send(c, hs, 4, DT_F32, (rank + 1) % size, 0, NULL, NULL) ==
                DT_ERR_UNSUPPORTED);
    DT_MP_CHECK(strstr(dt_last_error(), "is host memory: the nccl communicator's sends and "
                                        "receives take device memory of GPU") != NULL);

    DT_MP_OK(C->barrier(c, NULL));
    int32_t ok = 1;
    DT_MP_OK(C->all_reduce(c, &ok, &ok, 1, DT_I32, DT_OP_SUM, NULL, NULL));
    DT_MP_CHECK(ok == size);
    env_close(&e);
    return 0;
}

static void require_gpus(int n)
{
    if (g_gpus < n) {
        printf("SKIPPED (case): needs %d CUDA devices, found %d\n", n, g_gpus);
        skip();
    }
}

static void test_control_one_rank(void **state)
{
    (void)state;
    require_gpus(1);
    dt_mp_run_ranks(1, rank_control, NULL, 120.0, "nccltest");
}

static void test_control_two_ranks(void **state)
{
    (void)state;
    require_gpus(2);
    dt_mp_run_ranks(2, rank_control, NULL, 120.0, "nccltest");
}

/* ------------------------------------------------------- the device guard */

typedef struct guard_env {
    dt_comm_t *c;
    int rc;
    int64_t got;
} guard_env_t;

/* From a thread whose current device is the runtime's default (0). */
static void *other_thread(void *p)
{
    guard_env_t *g = p;
    int64_t v = 11;
    g->rc = C->all_reduce(g->c, &v, &v, 1, DT_I64, DT_OP_SUM, NULL, NULL);
    g->got = v;
    return NULL;
}

static int rank_guard(int rank, int size, const char *job, void *arg)
{
    (void)arg;
    /* instance A on GPU 1 with its group, then instance B on GPU 0, which
     * leaves GPU 0 current in this thread */
    static const dt_test_kv_t on1[] = {{"device_index", "1"}, {NULL, NULL}};
    static const dt_test_kv_t on0[] = {{"device_index", "0"}, {NULL, NULL}};
    rank_env_t a;
    env_open(&a, rank, size, job, 20000, on1);
    dt_test_host_t thb;
    dt_test_host_init(&thb, "device/cuda", on0);
    dt_device_init_v1_t di = {.struct_size = sizeof di, .local_size = 1, .device_index = -1};
    dt_device_t *b = NULL;
    DT_MP_OK(D->init(&thb.host, &di, &b));
    /* A's device memory on A's group: GPU 1's, while GPU 0 is current */
    float h[16], *d = NULL;
    for (int i = 0; i < 16; i++)
        h[i] = (float)i;
    DT_MP_OK(D->alloc(a.dev, sizeof h, DT_TAG_OTHER, (void **)&d));
    DT_MP_OK(D->memcpy_async(a.dev, d, h, sizeof h, DT_COPY_H2D, NULL));
    DT_MP_OK(C->all_reduce(a.c, d, d, 16, DT_F32, DT_OP_SUM, NULL, NULL));
    DT_MP_OK(D->memcpy_async(a.dev, h, d, sizeof h, DT_COPY_D2H, NULL));
    DT_MP_OK(D->stream_sync(a.dev, NULL));
    for (int i = 0; i < 16; i++)
        DT_MP_CHECK(h[i] == (float)i);
    /* B's memory is another GPU's to A's group: refused, naming both */
    float *db = NULL;
    DT_MP_OK(D->alloc(b, sizeof h, DT_TAG_OTHER, (void **)&db));
    DT_MP_CHECK(C->all_reduce(a.c, db, db, 16, DT_F32, DT_OP_SUM, NULL, NULL) ==
                DT_ERR_INVALID);
    DT_MP_CHECK(strstr(dt_last_error(), "is device memory of another GPU (GPU 0); this "
                                        "group runs on GPU 1") != NULL);
    DT_MP_OK(D->free(b, db));
    /* a control message from another thread */
    guard_env_t g = {a.c, -1, 0};
    pthread_t t;
    DT_MP_CHECK(pthread_create(&t, NULL, other_thread, &g) == 0);
    pthread_join(t, NULL);
    DT_MP_OK(g.rc);
    DT_MP_CHECK(g.got == 11);
    DT_MP_OK(D->free(a.dev, d));
    D->finalize(b);
    env_close(&a);
    return 0;
}

static void test_device_guard(void **state)
{
    (void)state;
    require_gpus(2);
    dt_mp_run_ranks(1, rank_guard, NULL, 120.0, "nccltest");
}

/* ------------------------------------------------------- abort in a wait */

typedef struct aborter {
    dt_comm_t *c;
    double took; /* seconds abort() took */
} aborter_t;

static void *abort_later(void *p)
{
    aborter_t *a = p;
    sleep_ms(200);
    double t0 = now_s();
    C->abort(a->c, "watchdog test");
    a->took = now_s() - t0;
    return NULL;
}

static int rank_abort(int rank, int size, const char *job, void *arg)
{
    (void)arg;
    rank_env_t e;
    env_open(&e, rank, size, job, rank == 0 ? 30000 : 5000, NULL);
    float *d = NULL;
    DT_MP_OK(D->alloc(e.dev, 1024 * sizeof(float), DT_TAG_OTHER, (void **)&d));
    DT_MP_OK(D->memset_async(e.dev, d, 0, 1024 * sizeof(float), e.cs));
    /* connected: one all_reduce both ranks make */
    DT_MP_OK(C->all_reduce(e.c, d, d, 1024, DT_F32, DT_OP_SUM, e.cs, NULL));
    if (rank == 1) {
        sleep_ms(2000); /* never makes the second one */
        D->free(e.dev, d);
        env_close(&e); /* bounded: its peer aborted */
        return 0;
    }
    dt_comm_req_t *req = NULL;
    DT_MP_OK(C->all_reduce(e.c, d, d, 1024, DT_F32, DT_OP_SUM, e.cs, &req));
    aborter_t a = {e.c, -1};
    pthread_t t;
    DT_MP_CHECK(pthread_create(&t, NULL, abort_later, &a) == 0);
    double t0 = now_s();
    int rc = C->wait(e.c, req, -1);
    double waited = now_s() - t0;
    pthread_join(t, NULL);
    dt_mp_note("abort() took %.3f s, the wait ended after %.3f s", a.took, waited);
    DT_MP_CHECK(rc == DT_ERR_REMOTE);
    DT_MP_CHECK(strstr(dt_last_error(), "rank 0 aborted the job: watchdog test") != NULL);
    DT_MP_CHECK(waited < 10.0); /* the group's timeout is 30 s */
    DT_MP_CHECK(a.took < 5.0);
    /* every later operation fails at once with the same reason */
    int32_t v = 1;
    DT_MP_CHECK(C->all_reduce(e.c, &v, &v, 1, DT_I32, DT_OP_SUM, NULL, NULL) == DT_ERR_REMOTE);
    DT_MP_CHECK(strstr(dt_last_error(), "the group failed earlier: rank 0 aborted the job: "
                                        "watchdog test") != NULL);
    D->free(e.dev, d);
    env_close(&e);
    return 0;
}

static void test_abort_in_wait(void **state)
{
    (void)state;
    require_gpus(2);
    dt_mp_run_ranks(2, rank_abort, NULL, 120.0, "nccltest");
}

/* ------------------------------------------------------------------ main */

/* dt_test_cuda_devices in a forked child: CUDA initialised here would not
 * survive the fork into the ranks. */
static int gpus_forked(char *why, size_t n)
{
    int fd[2];
    if (pipe(fd) != 0) {
        snprintf(why, n, "no CUDA device: pipe for the probe failed");
        return 0;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        struct {
            int n;
            char why[512];
        } r;
        memset(&r, 0, sizeof r);
        r.n = dt_test_cuda_devices(r.why, sizeof r.why);
        ssize_t w = write(fd[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 1);
    }
    close(fd[1]);
    struct {
        int n;
        char why[512];
    } r;
    memset(&r, 0, sizeof r);
    snprintf(r.why, sizeof r.why, "no CUDA device: the probe process gave no answer");
    if (pid < 0 || read(fd[0], &r, sizeof r) != (ssize_t)sizeof r)
        r.n = 0;
    close(fd[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    snprintf(why, n, "%s", r.why);
    return r.n;
}

int main(int argc, char **argv)
{
    struct stat sb;
    if (stat(NCCL_PLUGIN, &sb) != 0 || stat(CUDA_PLUGIN, &sb) != 0) {
        printf("SKIPPED: this build has no nccl communicator (%s)\n", NCCL_PLUGIN);
        return DT_TEST_SKIP_CODE;
    }
    C = dt_test_plugin_entry(NCCL_PLUGIN, DT_ENTRY_STRING(comm, 1), NULL);
    D = dt_test_plugin_entry(CUDA_PLUGIN, DT_ENTRY_STRING(device, 1), NULL);
    if (!C || !D) {
        printf("cannot load the nccl or cuda plugin: %s\n", dt_last_error());
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "gpu") == 0) {
        char why[512];
        if ((g_gpus = gpus_forked(why, sizeof why)) == 0) {
            printf("SKIPPED: %s\n", why);
            return DT_TEST_SKIP_CODE;
        }
        dt_mp_set_leak_check(0);
        const struct CMUnitTest gpu[] = {
            cmocka_unit_test(test_control_one_rank),
            cmocka_unit_test(test_control_two_ranks),
            cmocka_unit_test(test_device_guard),
            cmocka_unit_test(test_abort_in_wait),
        };
        return cmocka_run_group_tests_name("nccl on cuda", gpu, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_summary),
        cmocka_unit_test(test_refuses_cpu_device),
    };
    return cmocka_run_group_tests_name("nccl without a GPU", tests, NULL, NULL);
}
