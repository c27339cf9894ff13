/*
 * tests/unit/plugins/nccl/test_nccl_bootstrap.c - how the nccl communicator's ranks
 * agree on the world's ncclUniqueId (plugins/nccl/nccl_bootstrap.c,
 * compiled in).
 *
 * Through the host's rendezvous, against a fake host whose
 * bootstrap_all_gather joins threads in this process (one thread per
 * rank, one host table each) and fails as core/launch/rendezvous.c does:
 * every rank gets rank 0's id bit for bit and no file is made, on one
 * node and across nodes; a rank that offers another blob size and a rank
 * that never comes fail every caller with the messages naming the ranks;
 * a rank 0 whose ncclGetUniqueId failed (zeros) is named at once by the
 * others; a host of minor 0 (struct_size without the slot) is not asked; a host
 * that offers no rendezvous here falls back to the file on one machine
 * and refuses a world over several, saying how to start one.
 *
 * And against the core's own host table and TCP rendezvous (the session
 * `dtrain run` opens), with forked ranks as 2 nodes x 2 on 127.0.0.1:
 * every rank gets rank 0's id bit for bit.
 *
 * Through the file (hosts without the slot): rank 0 publishes it under
 * the job id and a second rank reads the same bytes; a rank whose job
 * secret differs is refused; a rank that waits for an id nobody publishes
 * times out with a message naming the file; a world over several
 * machines is refused; bad job ids are refused; cleanup_job removes what
 * a crashed job left.
 *
 * ncclGetUniqueId needs no GPU, so this runs on every machine whose build
 * found NCCL (exit 77, skipped, when not).
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
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#if defined(DT_TEST_HAVE_NCCL)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "nccl/nccl_internal.h"
#include "dtrain/dtrain.h"
#include "launch/rendezvous.h"
#include "launch/world.h"
#include "loader/host_services.h"
#include "loader/plugin_handle.h"
#include "test_assert.h"
#include "test_host.h"
#include "util/error.h"
#include "util/log.h"

static char g_job[64];

static dt_comm_init_v1_t args(int rank, int size, int local_size, const char *secret,
                              int64_t timeout_ms)
{
    dt_comm_init_v1_t a = {.struct_size = sizeof a, .rank = rank, .size = size,
                           .local_rank = rank, .local_size = local_size,
                           .job_id = g_job, .timeout_ms = timeout_ms,
                           .job_secret = secret};
    return a;
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void test_publish_and_read(void **state)
{
    (void)state;
    dt_test_host_t th;
    dt_test_host_init(&th, "comm/nccl", NULL);
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s-nccl-id", g_job);
    dt_comm_init_v1_t a0 = args(0, 2, 2, "s3cret", 1000), a1 = args(1, 2, 2, "s3cret", 1000);
    ncclUniqueId id0, id1;
    memset(&id1, 0, sizeof id1);
    assert_int_equal(nccl_bootstrap_id(&th.host, &a0, &id0), DT_OK);
    assert_true(exists(path));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(nccl_bootstrap_id(&th.host, &a1, &id1), DT_OK);
    assert_memory_equal(&id0, &id1, sizeof id0);
    /* another secret: refused, naming the file, not the secret */
    dt_comm_init_v1_t bad = args(1, 2, 2, "other", 1000);
    assert_int_equal(nccl_bootstrap_id(&th.host, &bad, &id1), DT_ERR_CONFIG);
    char want[400];
    snprintf(want, sizeof want, "comm/nccl: init: %s was published by a rank with another "
             "job secret (or none): not this job's", path);
    assert_string_equal(dt_last_error(), want);
    nccl_bootstrap_done(&a1); /* only rank 0 removes it */
    assert_true(exists(path));
    nccl_bootstrap_done(&a0);
    assert_false(exists(path));
}

static void test_timeout(void **state)
{
    (void)state;
    dt_test_host_t th;
    dt_test_host_init(&th, "comm/nccl", NULL);
    dt_comm_init_v1_t a1 = args(1, 2, 2, NULL, 50);
    ncclUniqueId id;
    assert_int_equal(nccl_bootstrap_id(&th.host, &a1, &id), DT_ERR_TIMEOUT);
    char want[400];
    snprintf(want, sizeof want, "comm/nccl: init: rank 1 waited 0.1 s for rank 0 to "
             "publish the NCCL unique id in /dev/shm/dtrain-%s-nccl-id", g_job);
    assert_string_equal(dt_last_error(), want);
}

static void test_refusals(void **state)
{
    (void)state;
    dt_test_host_t th;
    dt_test_host_init(&th, "comm/nccl", NULL);
    ncclUniqueId id;
    /* a host without the slot: the file reaches one machine only */
    dt_comm_init_v1_t multi = args(0, 8, 4, NULL, 1000);
    assert_int_equal(nccl_bootstrap_id(&th.host, &multi, &id), DT_ERR_UNSUPPORTED);
    assert_string_equal(dt_last_error(),
                        "comm/nccl: init: 8 ranks on several machines (4 on this one): the "
                        "NCCL unique id crosses machines through the host's rendezvous "
                        "(the host table's optional bootstrap_all_gather), which this host (ABI 1.0) "
                        "does not offer");
    dt_comm_init_v1_t badjob = args(0, 2, 2, NULL, 1000);
    badjob.job_id = "../etc";
    assert_int_equal(nccl_bootstrap_id(&th.host, &badjob, &id), DT_ERR_CONFIG);
    assert_string_equal(dt_last_error(),
                        "comm/nccl: init: job id \"../etc\" is not [A-Za-z0-9._-]{1,128}: "
                        "the ranks meet through a file named by it");
    assert_int_equal(nccl_cleanup_job(&th.host, "a/b"), DT_ERR_INVALID);
    /* one rank: no file at all */
    dt_comm_init_v1_t one = args(0, 1, 1, NULL, 1000);
    assert_int_equal(nccl_bootstrap_id(&th.host, &one, &id), DT_OK);
}

/* A FIFO planted at the id file's name: the other ranks refuse it at
 * once instead of blocking in open() for ever (a hang fails at the
 * deadline). */
static void test_fifo_at_id_path(void **state)
{
    (void)state;
    dt_test_host_t th;
    dt_test_host_init(&th, "comm/nccl", NULL);
    char path[256], want[400];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s-nccl-id", g_job);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    dt_comm_init_v1_t a1 = args(1, 2, 2, NULL, 1000);
    ncclUniqueId id;
    dt_test_deadline(20, "reading the id file a FIFO replaced");
    assert_int_equal(nccl_bootstrap_id(&th.host, &a1, &id), DT_ERR_SYSTEM);
    dt_test_deadline(0, NULL);
    snprintf(want, sizeof want, "comm/nccl: init: %s is not a regular file", path);
    assert_string_equal(dt_last_error(), want);
    unlink(path);
}

static void test_cleanup_job(void **state)
{
    (void)state;
    dt_test_host_t th;
    dt_test_host_init(&th, "comm/nccl", NULL);
    char path[256], tmp[300], other[256];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s-nccl-id", g_job);
    snprintf(tmp, sizeof tmp, "%s.tmp.123", path);
    snprintf(other, sizeof other, "/dev/shm/dtrain-%s-nccl-idx", g_job); /* not ours */
    dt_comm_init_v1_t a0 = args(0, 2, 2, NULL, 1000);
    ncclUniqueId id;
    assert_int_equal(nccl_bootstrap_id(&th.host, &a0, &id), DT_OK);
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    fclose(f);
    assert_non_null(f = fopen(other, "w"));
    fclose(f);
    assert_int_equal(nccl_cleanup_job(&th.host, g_job), DT_OK);
    assert_false(exists(path));
    assert_false(exists(tmp));
    assert_true(exists(other));
    unlink(other);
    assert_int_equal(nccl_cleanup_job(&th.host, g_job), DT_OK); /* idempotent */
}

/* ---- through the host's rendezvous, against a fake host ---- */

#define FAKE_MAX_RANKS 8

/* The job's rendezvous as threads of this process: every rank's call
 * waits for every other's, up to its timeout, then fails as the core's
 * does (core/launch/rendezvous.c: the same messages, rank 0's told to the
 * others "(reported by rank 0)"), or hands each caller every blob. */
typedef struct fake_world {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size;
    int unsupported; /* answer as a core outside `dtrain run` does */
    int calls;       /* how often the slot was called */
    int arrived[FAKE_MAX_RANKS];
    uint64_t bytes[FAKE_MAX_RANKS];
    unsigned char blob[FAKE_MAX_RANKS][DT_HOST_BOOTSTRAP_MAX];
} fake_world_t;

typedef struct fake_rank {
    dt_test_host_t th; /* first; its ctx is this struct */
    fake_world_t *w;
    int rank;
    uint64_t raw_bytes; /* > 0: call the slot with this many bytes, not the bootstrap */
    dt_comm_init_v1_t a;
    int rc;
    ncclUniqueId id;
    char msg[1024];
} fake_rank_t;

static int fake_all_gather(const dt_host_v1_t *h, const void *mine, uint64_t bytes, void *all,
                           int64_t timeout_ms)
{
    fake_rank_t *me = h->ctx;
    fake_world_t *w = me->w;
    pthread_mutex_lock(&w->mu);
    w->calls++;
    if (w->unsupported) {
        pthread_mutex_unlock(&w->mu);
        return h->set_error(h, DT_ERR_UNSUPPORTED, "bootstrap all-gather: no rendezvous here "
                            "(it is offered while `dtrain run` initialises the communicator)");
    }
    if (bytes > DT_HOST_BOOTSTRAP_MAX) { /* the core's check; no cmocka off the main thread */
        pthread_mutex_unlock(&w->mu);
        return h->set_error(h, DT_ERR_INVALID, "bootstrap all-gather of %llu bytes: at most "
                            "%d per rank", (unsigned long long)bytes, DT_HOST_BOOTSTRAP_MAX);
    }
    memcpy(w->blob[me->rank], mine, bytes);
    w->bytes[me->rank] = bytes;
    w->arrived[me->rank] = 1;
    pthread_cond_broadcast(&w->cv);
    if (timeout_ms <= 0)
        timeout_ms = 30000; /* the job's */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    int n = 0;
    for (;;) {
        n = 0;
        for (int q = 0; q < w->size; q++)
            n += w->arrived[q];
        if (n == w->size || pthread_cond_timedwait(&w->cv, &w->mu, &dl) != 0)
            break;
    }
    n = 0;
    for (int q = 0; q < w->size; q++)
        n += w->arrived[q];
    int st = DT_OK;
    char msg[512] = "";
    if (n < w->size) {
        char missing[128] = "";
        size_t len = 0;
        for (int q = 0; q < w->size; q++)
            if (!w->arrived[q])
                len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d",
                                        len ? ", " : "", q);
        st = DT_ERR_TIMEOUT;
        snprintf(msg, sizeof msg, "rendezvous: bootstrap all-gather #1 timed out after %g s: "
                 "rank%s %s of %d sent nothing", (double)timeout_ms / 1000.0,
                 w->size - n == 1 ? "" : "s", missing, w->size);
    } else {
        for (int q = 1; q < w->size && st == DT_OK; q++)
            if (w->bytes[q] != w->bytes[0]) {
                st = DT_ERR_INVALID;
                snprintf(msg, sizeof msg, "rendezvous: bootstrap all-gather #1: rank %d "
                         "offered %u bytes for all-gather #1, rank 0 %zu bytes for #1 (every "
                         "rank must make the same calls)", q, (unsigned)w->bytes[q],
                         (size_t)w->bytes[0]);
            }
        if (st == DT_OK)
            for (int q = 0; q < w->size; q++)
                memcpy((unsigned char *)all + (size_t)q * bytes, w->blob[q], bytes);
    }
    pthread_mutex_unlock(&w->mu);
    if (st == DT_OK)
        return DT_OK;
    return h->set_error(h, st, "%s%s", msg, me->rank ? " (reported by rank 0)" : "");
}

static void fake_world_init(fake_world_t *w, int size)
{
    memset(w, 0, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->size = size;
}

static void fake_world_fini(fake_world_t *w)
{
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}

/* Rank `rank` of `w` (local_size ranks per node), its host offering the
 * fake slot. */
static void fake_rank_init(fake_rank_t *r, fake_world_t *w, int rank, int local_size,
                           int64_t timeout_ms)
{
    memset(r, 0, sizeof *r);
    dt_test_host_init(&r->th, "comm/nccl", NULL);
    r->th.host.ctx = r;
    r->th.host.bootstrap_all_gather = fake_all_gather;
    r->w = w;
    r->rank = rank;
    r->a = args(rank, w->size, local_size, "s3cret", timeout_ms);
    r->a.local_rank = rank % local_size;
}

static void *rank_main(void *p)
{
    fake_rank_t *r = p;
    if (r->raw_bytes) {
        unsigned char mine[DT_HOST_BOOTSTRAP_MAX] = {0};
        unsigned char *all = calloc((size_t)r->w->size, r->raw_bytes);
        r->rc = r->th.host.bootstrap_all_gather(&r->th.host, mine, r->raw_bytes, all,
                                                r->a.timeout_ms);
        free(all);
    } else {
        r->rc = nccl_bootstrap_id(&r->th.host, &r->a, &r->id);
    }
    snprintf(r->msg, sizeof r->msg, "%s", r->rc ? dt_last_error() : "");
    return NULL;
}

/* Ranks r[0..n) run at once, each on its own thread. */
static void run_ranks(fake_rank_t *r, int n)
{
    pthread_t t[FAKE_MAX_RANKS];
    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_create(&t[i], NULL, rank_main, &r[i]), 0);
    for (int i = 0; i < n; i++)
        pthread_join(t[i], NULL);
}

/* Every rank of a world of `size` (local_size a node) gets rank 0's id
 * bit for bit, through one all-gather of id-sized blobs (rank 0's the id,
 * the others zeros), and no file is made. */
static void check_rendezvous_world(int size, int local_size)
{
    fake_world_t w;
    fake_world_init(&w, size);
    fake_rank_t r[FAKE_MAX_RANKS];
    for (int i = 0; i < size; i++)
        fake_rank_init(&r[i], &w, i, local_size, 5000);
    run_ranks(r, size);
    ncclUniqueId zero;
    memset(&zero, 0, sizeof zero);
    assert_int_equal(w.calls, size);
    for (int i = 0; i < size; i++) {
        assert_int_equal(r[i].rc, DT_OK);
        assert_int_equal(w.bytes[i], NCCL_UNIQUE_ID_BYTES);
        assert_memory_equal(&r[i].id, &r[0].id, sizeof r[0].id);
        assert_memory_equal(w.blob[i], i == 0 ? (const void *)&r[0].id : (const void *)&zero,
                            NCCL_UNIQUE_ID_BYTES);
    }
    assert_memory_not_equal(&r[0].id, &zero, sizeof zero); /* ncclGetUniqueId's */
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s-nccl-id", g_job);
    assert_false(exists(path));
    fake_world_fini(&w);
}

static void test_rendezvous_one_node(void **state)
{
    (void)state;
    check_rendezvous_world(4, 4);
}

static void test_rendezvous_nodes(void **state)
{
    (void)state;
    check_rendezvous_world(4, 2); /* 2 nodes x 2: not refused any more */
    check_rendezvous_world(8, 1);
}

/* A rank that offers another blob size (another build, another call
 * order) fails every caller, the ranks named. */
static void test_rendezvous_size_mismatch(void **state)
{
    (void)state;
    fake_world_t w;
    fake_world_init(&w, 3);
    fake_rank_t r[3];
    for (int i = 0; i < 3; i++)
        fake_rank_init(&r[i], &w, i, 3, 5000);
    r[2].raw_bytes = 64;
    run_ranks(r, 3);
    const char *want = "comm/nccl: rendezvous: bootstrap all-gather #1: rank 2 offered 64 "
                       "bytes for all-gather #1, rank 0 128 bytes for #1 (every rank must "
                       "make the same calls)";
    assert_int_equal(r[0].rc, DT_ERR_INVALID);
    assert_string_equal(r[0].msg, want);
    char want1[600];
    snprintf(want1, sizeof want1, "%s (reported by rank 0)", want);
    assert_int_equal(r[1].rc, DT_ERR_INVALID);
    assert_string_equal(r[1].msg, want1);
    fake_world_fini(&w);
}

/* A rank 0 whose ncclGetUniqueId failed takes part with zeros: the
 * others fail at once, naming it. */
static void test_rendezvous_rank0_without_id(void **state)
{
    (void)state;
    fake_world_t w;
    fake_world_init(&w, 3);
    fake_rank_t r[3];
    for (int i = 0; i < 3; i++)
        fake_rank_init(&r[i], &w, i, 3, 5000);
    r[0].raw_bytes = NCCL_UNIQUE_ID_BYTES; /* zeros, as nccl_bootstrap_id sends then */
    run_ranks(r, 3);
    assert_int_equal(r[0].rc, DT_OK);
    for (int i = 1; i < 3; i++) {
        char want[300];
        snprintf(want, sizeof want, "comm/nccl: init: rank %d of 3: rank 0 offered no NCCL "
                 "unique id through the rendezvous (its ncclGetUniqueId failed; see rank "
                 "0's error)", i);
        assert_int_equal(r[i].rc, DT_ERR_REMOTE);
        assert_string_equal(r[i].msg, want);
    }
    fake_world_fini(&w);
}

/* Ranks that never come: the callers fail within the init timeout (the
 * slot is given it), the missing ranks named; no file fallback. */
static void test_rendezvous_timeout(void **state)
{
    (void)state;
    fake_world_t w;
    fake_world_init(&w, 4);
    fake_rank_t r[2];
    for (int i = 0; i < 2; i++)
        fake_rank_init(&r[i], &w, i, 2, 100);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    run_ranks(r, 2);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    assert_true(s >= 0.09 && s < 3.0);
    assert_int_equal(r[0].rc, DT_ERR_TIMEOUT);
    assert_string_equal(r[0].msg, "comm/nccl: rendezvous: bootstrap all-gather #1 timed out "
                                  "after 0.1 s: ranks 2, 3 of 4 sent nothing");
    assert_int_equal(r[1].rc, DT_ERR_TIMEOUT);
    assert_string_equal(r[1].msg, "comm/nccl: rendezvous: bootstrap all-gather #1 timed out "
                                  "after 0.1 s: ranks 2, 3 of 4 sent nothing (reported by "
                                  "rank 0)");
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s-nccl-id", g_job);
    assert_false(exists(path));
    fake_world_fini(&w);
}

/* A host that offers no rendezvous here (outside `dtrain run`): one
 * machine falls back to the file; several are refused, saying how to
 * start them. */
static void test_rendezvous_unsupported(void **state)
{
    (void)state;
    fake_world_t w;
    fake_world_init(&w, 2);
    w.unsupported = 1;
    fake_rank_t r[2];
    for (int i = 0; i < 2; i++)
        fake_rank_init(&r[i], &w, i, 2, 5000);
    run_ranks(r, 2);
    assert_int_equal(w.calls, 2);
    assert_int_equal(r[0].rc, DT_OK);
    assert_int_equal(r[1].rc, DT_OK);
    assert_memory_equal(&r[0].id, &r[1].id, sizeof r[0].id);
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s-nccl-id", g_job);
    assert_true(exists(path));
    nccl_bootstrap_done(&r[0].a);
    assert_false(exists(path));
    fake_world_fini(&w);

    fake_world_init(&w, 4);
    w.unsupported = 1;
    fake_rank_t one;
    fake_rank_init(&one, &w, 1, 2, 5000);
    ncclUniqueId id;
    assert_int_equal(nccl_bootstrap_id(&one.th.host, &one.a, &id), DT_ERR_UNSUPPORTED);
    assert_string_equal(dt_last_error(),
                        "comm/nccl: init: 4 ranks on several machines (2 on this one) and no "
                        "rendezvous to exchange the NCCL unique id through: start every node "
                        "with `dtrain run` (--nnodes, or MASTER_ADDR/MASTER_PORT in the "
                        "environment)");
    fake_world_fini(&w);
}

/* A host of minor 0 (struct_size ending before the slot) is never asked,
 * whatever lies past its end: the file carries the id. */
static void test_minor0_host(void **state)
{
    (void)state;
    fake_world_t w;
    fake_world_init(&w, 2);
    fake_rank_t r;
    fake_rank_init(&r, &w, 0, 2, 1000);
    r.th.host.struct_size = (uint32_t)offsetof(dt_host_v1_t, bootstrap_all_gather);
    r.th.host.abi_minor = 0;
    ncclUniqueId id;
    assert_int_equal(nccl_bootstrap_id(&r.th.host, &r.a, &id), DT_OK);
    assert_int_equal(w.calls, 0);
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s-nccl-id", g_job);
    assert_true(exists(path));
    nccl_bootstrap_done(&r.a);
    assert_false(exists(path));
    dt_comm_init_v1_t multi = args(0, 4, 2, NULL, 1000);
    assert_int_equal(nccl_bootstrap_id(&r.th.host, &multi, &id), DT_ERR_UNSUPPORTED);
    assert_string_equal(dt_last_error(),
                        "comm/nccl: init: 4 ranks on several machines (2 on this one): the "
                        "NCCL unique id crosses machines through the host's rendezvous "
                        "(the host table's optional bootstrap_all_gather), which this host (ABI 1.0) "
                        "does not offer");
    fake_world_fini(&w);
}

/* ---- against the core's host table and TCP rendezvous, forked ranks ---- */

typedef struct real_result {
    int rc;
    ncclUniqueId id;
    char msg[512];
} real_result_t;

/* A port nobody listens on just now (the kernel's pick, released). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* One rank as `dtrain run` starts its communicator: the rendezvous
 * session around comm init, the plugin's host table from the core, then
 * the bootstrap.  Writes a real_result_t to fd; never returns. */
static void real_rank(int rank, int size, int local_size, int port, int fd)
{
    real_result_t res;
    memset(&res, 0, sizeof res);
    dt_world_t w = {.rank = rank, .size = size, .local_rank = rank % local_size,
                    .local_size = local_size, .master_port = port, .source = "torchrun"};
    snprintf(w.job_id, sizeof w.job_id, "%s", g_job);
    snprintf(w.job_secret, sizeof w.job_secret, "s3cret");
    snprintf(w.master_addr, sizeof w.master_addr, "127.0.0.1");
    dt_plugin_t p = {.kind = DT_KIND_COMM, .name = "nccl"};
    res.rc = dt_rdzv_session_begin(&w, 0x5eed, 10.0);
    if (res.rc == DT_OK)
        res.rc = dt_host_create(&p, NULL);
    if (res.rc == DT_OK) {
        dt_comm_init_v1_t a = args(rank, size, local_size, "s3cret", 10000);
        res.rc = nccl_bootstrap_id(p.host, &a, &res.id);
        dt_host_destroy(&p);
    }
    if (res.rc != DT_OK)
        snprintf(res.msg, sizeof res.msg, "%s", dt_last_error());
    dt_rdzv_session_end();
    ssize_t n = write(fd, &res, sizeof res);
    _exit(n == (ssize_t)sizeof res ? 0 : 3);
}

static void test_real_rendezvous_nodes(void **state)
{
    (void)state;
    enum { SIZE = 4, LOCAL = 2 };
    int port = free_port();
    int fds[SIZE][2];
    pid_t pid[SIZE];
    for (int r = 0; r < SIZE; r++) {
        assert_int_equal(pipe(fds[r]), 0);
        pid[r] = fork();
        assert_true(pid[r] >= 0);
        if (pid[r] == 0) {
            close(fds[r][0]);
            alarm(30); /* the waits are bounded (10 s); this bounds a bug */
            real_rank(r, SIZE, LOCAL, port, fds[r][1]);
        }
        close(fds[r][1]);
    }
    real_result_t res[SIZE];
    for (int r = 0; r < SIZE; r++) {
        memset(&res[r], 0, sizeof res[r]);
        ssize_t n = read(fds[r][0], &res[r], sizeof res[r]);
        close(fds[r][0]);
        int st = 0;
        assert_int_equal(waitpid(pid[r], &st, 0), pid[r]);
        if (n != (ssize_t)sizeof res[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("rank %d: no result (read %zd, status %#x)", r, n, st);
    }
    ncclUniqueId zero;
    memset(&zero, 0, sizeof zero);
    for (int r = 0; r < SIZE; r++) {
        if (res[r].rc != DT_OK)
            fail_msg("rank %d: %d: %s", r, res[r].rc, res[r].msg);
        assert_memory_equal(&res[r].id, &res[0].id, sizeof res[0].id);
    }
    assert_memory_not_equal(&res[0].id, &zero, sizeof zero);
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s-nccl-id", g_job);
    assert_false(exists(path));
}

int main(void)
{
    dt_log_set_level(DT_LOG_WARN);
    snprintf(g_job, sizeof g_job, "t-nccl-%ld", (long)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_publish_and_read),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_fifo_at_id_path),
        cmocka_unit_test(test_cleanup_job),
        cmocka_unit_test(test_rendezvous_one_node),
        cmocka_unit_test(test_rendezvous_nodes),
        cmocka_unit_test(test_rendezvous_size_mismatch),
        cmocka_unit_test(test_rendezvous_rank0_without_id),
        cmocka_unit_test(test_rendezvous_timeout),
        cmocka_unit_test(test_rendezvous_unsupported),
        cmocka_unit_test(test_minor0_host),
        cmocka_unit_test(test_real_rendezvous_nodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("SKIPPED: this build has no nccl communicator (no CUDA toolkit or NCCL)\n");
    return 77;
}
#endif
