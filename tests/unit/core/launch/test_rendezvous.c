/*
 * tests/unit/core/launch/test_rendezvous.c - the TCP rendezvous (core/launch/
 * rendezvous.c) on localhost, one thread per rank: the job id every rank
 * agrees on, bootstrap all-gathers, a config-hash mismatch named on every
 * rank, a missing rank named within the bound, strays (a wrong secret, a
 * silent connection, garbage, an oversized or other-version frame) refused
 * and logged while the real job still forms, a flood of silent connections
 * (held and re-opened, more than rank 0 holds unproven) that neither stops
 * the real ranks nor floods the log, a wrong secret named on both sides,
 * an address that never resolves failing at once while one that may
 * resolve later is retried, rank 0 never reached, and IPv6.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "launch/rendezvous.h"
#include "launch/world.h"
#include "util/error.h"
#include "test_assert.h"
#include "test_hooks.h"

#define MAX_RANKS 8
#define BLOB 24

typedef struct rank_run {
    dt_rdzv_opts_t o;
    dt_rdzv_t *r;     /* rank 0: opened by the test before the others start */
    int gathers;      /* bootstrap all-gathers after the join */
    int gather_bytes; /* 0: BLOB */
    int rc;           /* of the first call that failed, else DT_OK */
    char msg[2048];
    char job_id[128];
    uint8_t all[MAX_RANKS * BLOB];
    pthread_t th;
} rank_run_t;

/* The address every rank of start_ranks uses. */
static const char *g_addr = "127.0.0.1";

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *rank_main(void *arg)
{
    rank_run_t *k = arg;
    int rc = k->r ? DT_OK : dt_rdzv_open(&k->o, &k->r);
    if (!rc)
        rc = dt_rdzv_join(k->r);
    if (!rc)
        snprintf(k->job_id, sizeof k->job_id, "%s", dt_rdzv_job_id(k->r));
    for (int g = 0; g < k->gathers && !rc; g++) {
        size_t n = k->gather_bytes ? (size_t)k->gather_bytes : BLOB;
        uint8_t mine[BLOB];
        for (size_t i = 0; i < n; i++)
            mine[i] = (uint8_t)(k->o.rank * 31 + g * 7 + (int)i);
        rc = dt_rdzv_all_gather(k->r, mine, n, k->all, 0);
    }
    k->rc = rc;
    snprintf(k->msg, sizeof k->msg, "%s", rc ? dt_last_error() : "");
    dt_rdzv_close(k->r);
    k->r = NULL;
    return NULL;
}

/* Ranks [0, n) of a world of `size` as threads; rank 0 listens on a free
 * port first.  hash[r] / secret[r] / job[r] may be NULL: defaults. */
static void start_ranks(rank_run_t *k, int n, int size, double timeout_s, const uint64_t *hash,
                        const char *const *secret, int gathers, int *port)
{
    for (int r = 0; r < n; r++) {
        memset(&k[r], 0, sizeof k[r]);
        k[r].o = (dt_rdzv_opts_t){.addr = g_addr, .port = *port, .rank = r, .size = size,
                                  .job_id = r == 0 ? "job-of-rank-0" : "a-node-proposal",
                                  .secret = secret && secret[r] ? secret[r] : "s3cret",
                                  .config_hash = hash ? hash[r] : 0x1234,
                                  .timeout_s = timeout_s};
        k[r].gathers = gathers;
    }
    if (n > 0 && *port == 0) {
        assert_ok(dt_rdzv_open(&k[0].o, &k[0].r));
        *port = dt_rdzv_port(k[0].r);
        for (int r = 1; r < n; r++)
            k[r].o.port = *port;
    }
    for (int r = 0; r < n; r++)
        assert_int_equal(pthread_create(&k[r].th, NULL, rank_main, &k[r]), 0);
}

static void join_ranks(rank_run_t *k, int n)
{
    for (int r = 0; r < n; r++)
        pthread_join(k[r].th, NULL);
}

/* A raw TCP connection to 127.0.0.1:port. */
static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* A 16-byte frame header (rendezvous.h's wire format). */
static void header(uint8_t *h, uint32_t magic, uint16_t version, uint16_t type, uint32_t len)
{
    uint8_t b[16] = {(uint8_t)(magic >> 24), (uint8_t)(magic >> 16), (uint8_t)(magic >> 8),
                     (uint8_t)magic, (uint8_t)(version >> 8), (uint8_t)version,
                     (uint8_t)(type >> 8), (uint8_t)type, (uint8_t)(len >> 24),
                     (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len};
    memcpy(h, b, sizeof b);
}

static void assert_has(const char *text, const char *part)
{
    if (!strstr(text, part))
        fail_msg("text\n  got:   %s\n  lacks: %s", text, part);
}

/* ---- agreement ------------------------------------------------------------ */

static void test_agree_and_gather(void **state)
{
    rank_run_t k[4];
    int port = 0;
    start_ranks(k, 4, 4, 10.0, NULL, NULL, 2, &port);
    join_ranks(k, 4);
    for (int r = 0; r < 4; r++) {
        if (k[r].rc)
            fail_msg("rank %d: %s", r, k[r].msg);
        /* rank 0's proposal is the job's, whatever the others proposed */
        assert_string_equal(k[r].job_id, "job-of-rank-0");
        /* the second all-gather's blobs, every rank's in rank order */
        for (int q = 0; q < 4; q++)
            for (int i = 0; i < BLOB; i++)
                assert_int_equal(k[r].all[q * BLOB + i], (uint8_t)(q * 31 + 7 + i));
    }
}

static void test_single_rank(void **state)
{
    rank_run_t k[1];
    int port = 0;
    start_ranks(k, 1, 1, 1.0, NULL, NULL, 1, &port);
    join_ranks(k, 1);
    assert_int_equal(k[0].rc, DT_OK);
    assert_string_equal(k[0].job_id, "job-of-rank-0");
    assert_int_equal(k[0].all[5], 5);
}

/* ---- config hashes -------------------------------------------------------- */

static void test_config_hash_mismatch(void **state)
{
    rank_run_t k[3];
    const uint64_t hash[3] = {0xaa, 0xaa, 0xbb};
    int port = 0;
    start_ranks(k, 3, 3, 10.0, hash, NULL, 0, &port);
    join_ranks(k, 3);
    const char *want = "rendezvous: the ranks resolved different configs: rank 0 has config "
                       "hash 00000000000000aa, rank 2 has 00000000000000bb (every node must "
                       "run the same config; only launch.node_rank may differ)";
    assert_int_equal(k[0].rc, DT_ERR_CONFIG);
    assert_string_equal(k[0].msg, want);
    for (int r = 1; r < 3; r++) {
        char full[2048];
        snprintf(full, sizeof full, "%s (reported by rank 0)", want);
        assert_int_equal(k[r].rc, DT_ERR_CONFIG);
        assert_string_equal(k[r].msg, full);
    }
}

/* Two nodes given the same node_rank (rank 1 twice), and a node started
 * for another world size: each proves the secret, so it is the job's, and
 * the job fails at once on every rank that joined, naming what clashed. */
static void test_duplicate_and_size(void **state)
{
    for (int c = 0; c < 2; c++) {
        rank_run_t k[3];
        int port = 0;
        start_ranks(k, 2, 3, 10.0, NULL, NULL, 0, &port);
        memset(&k[2], 0, sizeof k[2]);
        k[2].o = k[1].o;
        if (c == 1) {
            k[2].o.rank = 2;
            k[2].o.size = 5;
        }
        usleep(200 * 1000); /* rank 1 is in first */
        assert_int_equal(pthread_create(&k[2].th, NULL, rank_main, &k[2]), 0);
        join_ranks(k, 3);
        for (int r = 0; r < 3; r++)
            assert_int_equal(k[r].rc, DT_ERR_CONFIG);
        if (c == 0) {
            assert_has(k[0].msg, "rendezvous: rank 1 joined twice (from 127.0.0.1:");
            assert_has(k[0].msg, "): two nodes were given the same node_rank?");
        } else {
            assert_has(k[0].msg, " joined as rank 2 of 5, but rank 0 was started for 3 ranks: "
                                 "every node must run the same nnodes x nproc");
        }
        assert_has(k[1].msg, k[0].msg);
        assert_has(k[2].msg, k[0].msg);
    }
}

/* ---- bounded waits -------------------------------------------------------- */

static void test_missing_rank_times_out(void **state)
{
    rank_run_t k[2];
    int port = 0;
    double t0 = mono_s();
    start_ranks(k, 2, 3, 0.5, NULL, NULL, 0, &port); /* rank 2 never starts */
    join_ranks(k, 2);
    double took = mono_s() - t0;
    char want[512];
    snprintf(want, sizeof want,
             "rendezvous at 127.0.0.1:%d timed out after 0.5 s: rank 2 of 3 never joined "
             "(joined: 0, 1)", port);
    assert_int_equal(k[0].rc, DT_ERR_TIMEOUT);
    assert_string_equal(k[0].msg, want);
    /* rank 1 hears it from rank 0, before its own deadline */
    assert_int_equal(k[1].rc, DT_ERR_TIMEOUT);
    assert_has(k[1].msg, want);
    assert_has(k[1].msg, "(reported by rank 0)");
    assert_true(took < 0.5 + 1.0);
}

static void test_rank0_never_answers(void **state)
{
    /* a port nobody listens on */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    int port = ntohs(a.sin_port);
    close(fd);

    rank_run_t k[2];
    start_ranks(k, 0, 2, 0.3, NULL, NULL, 0, &port);
    memset(&k[1], 0, sizeof k[1]);
    k[1].o = (dt_rdzv_opts_t){.addr = "127.0.0.1", .port = port, .rank = 1, .size = 2,
                              .job_id = "j", .secret = "s3cret", .timeout_s = 0.3};
    double t0 = mono_s();
    rank_main(&k[1]);
    double took = mono_s() - t0;
    char want[512];
    snprintf(want, sizeof want,
             "rendezvous: rank 1 of 2 could not join rank 0 at 127.0.0.1:%d within 0.3 s: "
             "rank 0 never answered (not started, a firewall, or the wrong "
             "master_addr/master_port?) (last: Connection refused)", port);
    assert_int_equal(k[1].rc, DT_ERR_TIMEOUT);
    assert_string_equal(k[1].msg, want);
    assert_true(took < 0.3 + 1.0 + 1.0);
}

/* ---- strays --------------------------------------------------------------- */

/* Another job's rank (the wrong secret) and a silent connection are there
 * first; the job still forms, the stray is refused and logged, and learns
 * at once that its secret is not this job's (and nothing else). */
static void test_stray_wrong_secret(void **state)
{
    rank_run_t k[3], stray;
    int port = 0;
    dt_test_stderr_begin();
    start_ranks(k, 1, 3, 10.0, NULL, NULL, 1, &port);
    int silent = raw_connect(port);
    memset(&stray, 0, sizeof stray);
    stray.o = (dt_rdzv_opts_t){.addr = "127.0.0.1", .port = port, .rank = 1, .size = 3,
                               .job_id = "other-job", .secret = "another job's secret",
                               .config_hash = 0x1234, .timeout_s = 0.5};
    double t0 = mono_s();
    rank_main(&stray); /* refused at once, and told why */
    double took = mono_s() - t0;
    /* now the real ranks 1 and 2 */
    for (int r = 1; r < 3; r++) {
        memset(&k[r], 0, sizeof k[r]);
        k[r].o = (dt_rdzv_opts_t){.addr = "127.0.0.1", .port = port, .rank = r, .size = 3,
                                  .job_id = "x", .secret = "s3cret", .config_hash = 0x1234,
                                  .timeout_s = 10.0};
        k[r].gathers = 1;
        assert_int_equal(pthread_create(&k[r].th, NULL, rank_main, &k[r]), 0);
    }
    join_ranks(k, 3);
    close(silent);
    char *err = dt_test_stderr_end();
    for (int r = 0; r < 3; r++) {
        if (k[r].rc)
            fail_msg("rank %d: %s\nstderr: %s", r, k[r].msg, err);
        assert_string_equal(k[r].job_id, "job-of-rank-0");
    }
    char want[512];
    snprintf(want, sizeof want,
             "rendezvous: rank 1 of 3: rank 0 at 127.0.0.1:%d refused this rank's proof of the "
             "job secret: DTRAIN_JOB_SECRET on this node differs from rank 0's (set the same "
             "value on every node; or master_addr:master_port is another job's rendezvous)",
             port);
    assert_int_equal(stray.rc, DT_ERR_CONFIG);
    assert_string_equal(stray.msg, want);
    assert_true(took < 0.4); /* not its 0.5 s timeout */
    assert_null(strstr(stray.msg, "s3cret"));
    assert_has(err, "rendezvous: refused a connection from 127.0.0.1:");
    assert_has(err, ": it claims rank 1 of 3 but its proof of the job secret is wrong "
                    "(DTRAIN_JOB_SECRET differs on its node, or it is another job's rank)\n");
    assert_null(strstr(err, "s3cret"));
    assert_null(strstr(err, "another job's secret"));
    /* the silent one is dropped when the job forms */
    assert_has(err, ": the job formed (or failed) before it proved anything");
    free(err);
}

/* Garbage, a frame of another protocol version and one that claims 2 GiB:
 * each refused with its reason before a payload byte is read; the job
 * forms. */
static void test_garbage_frames(void **state)
{
    rank_run_t k[2];
    int port = 0;
    dt_test_stderr_begin();
    start_ranks(k, 1, 2, 10.0, NULL, NULL, 0, &port);
    uint8_t h[16];
    int g1 = raw_connect(port);
    assert_int_equal(write(g1, "GET / HTTP/1.0\r\n", 16), 16);
    int g2 = raw_connect(port);
    header(h, 0x44545256u, 9, 2, 10);
    assert_int_equal(write(g2, h, 16), 16);
    int g3 = raw_connect(port);
    header(h, 0x44545256u, 1, 2, 0x7fffffffu);
    assert_int_equal(write(g3, h, 16), 16);
    /* each is answered by a closed connection: read the challenge, then EOF */
    int fds[3] = {g1, g2, g3};
    for (int i = 0; i < 3; i++) {
        uint8_t buf[64];
        ssize_t n, total = 0;
        while ((n = read(fds[i], buf, sizeof buf)) > 0)
            total += n;
        assert_int_equal(total, 16 + 16); /* the challenge frame, then nothing */
        close(fds[i]);
    }
    memset(&k[1], 0, sizeof k[1]);
    k[1].o = (dt_rdzv_opts_t){.addr = "127.0.0.1", .port = port, .rank = 1, .size = 2,
                              .job_id = "x", .secret = "s3cret", .config_hash = 0x1234,
                              .timeout_s = 10.0};
    assert_int_equal(pthread_create(&k[1].th, NULL, rank_main, &k[1]), 0);
    join_ranks(k, 2);
    char *err = dt_test_stderr_end();
    assert_int_equal(k[0].rc, DT_OK);
    assert_int_equal(k[1].rc, DT_OK);
    assert_has(err, ": not a dtrain rendezvous frame (it starts 0x47455420)");
    assert_has(err, ": rendezvous protocol version 9 (this dtrain speaks 1)");
    assert_has(err, ": a frame claiming 2147483647 bytes, over the 193-byte limit of its type");
    free(err);
}

/* ---- a flood ---------------------------------------------------------------- */

/* The flood: a child process that holds `n` silent connections to
 * 127.0.0.1:port and re-opens each one rank 0 closes, as fast as it can
 * (it reads and ignores the challenges), until it is killed.  The child
 * dies with the test. */
static pid_t flood_start(int port, int n)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid > 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) { /* the parent may have lowered it */
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    if (!pf)
        _exit(3);
    for (int i = 0; i < n; i++)
        pf[i].fd = -1;
    for (;;) {
        for (int i = 0; i < n; i++) {
            if (pf[i].fd >= 0)
                continue;
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
            if (fd < 0)
                break;
            if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS) {
                close(fd);
                continue; /* (the listener is gone: the job formed) */
            }
            pf[i] = (struct pollfd){.fd = fd, .events = POLLIN};
        }
        if (poll(pf, (nfds_t)n, 5) <= 0)
            continue;
        for (int i = 0; i < n; i++) {
            if (pf[i].fd < 0 || !pf[i].revents)
                continue;
            char b[64];
            ssize_t k = recv(pf[i].fd, b, sizeof b, 0);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
                close(pf[i].fd); /* closed by rank 0: open another */
                pf[i].fd = -1;
            }
            pf[i].revents = 0;
        }
    }
}

static void flood_stop(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Lines of `text` that contain `part`. */
static int count_lines(const char *text, const char *part)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, part)); p += strlen(part))
        n++;
    return n;
}

/* 300 silent connections held and re-opened as fast as rank 0 closes
 * them - more than rank 0 holds unproven (its open-file limit lowered to
 * 256 here: 128 slots), so every newcomer evicts the oldest - and three
 * real ranks still join within a bound; the log stays bounded (a burst of
 * single lines, then one line counting the rest).  Before the fix the 64
 * fixed slots stayed full of the flood, every real rank was refused until
 * its timeout, and each refusal wrote its own line. */
static void test_flood(void **state)
{
    struct rlimit saved, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
    low = saved;
    low.rlim_cur = saved.rlim_cur < 256 ? saved.rlim_cur : 256;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    rank_run_t k[4];
    int port = 0;
    dt_test_stderr_begin();
    start_ranks(k, 1, 4, 8.0, NULL, NULL, 1, &port);
    pid_t flood = flood_start(port, 300);
    usleep(500 * 1000); /* the flood is in full swing */
    double t0 = mono_s();
    for (int r = 1; r < 4; r++) {
        memset(&k[r], 0, sizeof k[r]);
        k[r].o = (dt_rdzv_opts_t){.addr = "127.0.0.1", .port = port, .rank = r, .size = 4,
                                  .job_id = "x", .secret = "s3cret", .config_hash = 0x1234,
                                  .timeout_s = 4.0};
        k[r].gathers = 1;
        assert_int_equal(pthread_create(&k[r].th, NULL, rank_main, &k[r]), 0);
    }
    join_ranks(k, 4);
    double took = mono_s() - t0;
    flood_stop(flood);
    char *err = dt_test_stderr_end();
    setrlimit(RLIMIT_NOFILE, &saved);
    for (int r = 0; r < 4; r++)
        if (k[r].rc)
            fail_msg("rank %d under the flood: %s\nstderr: %.2000s", r, k[r].msg, err);
    if (took > 3.0)
        fail_msg("the real ranks took %.2f s to join under the flood (bound 3 s)", took);
    int singles = count_lines(err, "rendezvous: refused a connection from ");
    int counted = count_lines(err, "rendezvous: dropped ");
    int lines = count_lines(err, "\n");
    if (singles != DT_RDZV_LOG_BURST || counted != 1 || lines != singles + counted)
        fail_msg("the log under the flood: %d single lines (want %d), %d counting lines (want "
                 "1), %d lines in all\n%.3000s", singles, DT_RDZV_LOG_BURST, counted, lines,
                 err);
    assert_has(err, " (further refusals in the next 10 s are counted, not logged one by one)\n");
    assert_has(err, " more connections that did not prove they belong to the job in the last ");
    free(err);
}

/* A rank with the wrong secret is named by rank 0's timeout (where it
 * connected from, the rank it claimed, the secret to check), never the
 * secret itself. */
static void test_wrong_secret_named(void **state)
{
    rank_run_t k[2];
    int port = 0;
    dt_test_stderr_begin();
    start_ranks(k, 1, 2, 1.0, NULL, NULL, 0, &port);
    memset(&k[1], 0, sizeof k[1]);
    k[1].o = (dt_rdzv_opts_t){.addr = "127.0.0.1", .port = port, .rank = 1, .size = 2,
                              .job_id = "x", .secret = "not the secret",
                              .config_hash = 0x1234, .timeout_s = 1.0};
    rank_main(&k[1]);
    join_ranks(k, 1);
    char *err = dt_test_stderr_end();
    assert_int_equal(k[1].rc, DT_ERR_CONFIG);
    assert_has(k[1].msg, "refused this rank's proof of the job secret: DTRAIN_JOB_SECRET on "
                         "this node differs from rank 0's");
    char want[256];
    snprintf(want, sizeof want, "rendezvous at 127.0.0.1:%d timed out after 1 s: rank 1 of 2 "
             "never joined (joined: 0); a connection from 127.0.0.1:", port);
    assert_int_equal(k[0].rc, DT_ERR_TIMEOUT);
    if (strncmp(k[0].msg, want, strlen(want)) != 0)
        fail_msg("rank 0: %s\nwant it to start: %s", k[0].msg, want);
    assert_has(k[0].msg, " claiming rank 1 failed the job secret check: is DTRAIN_JOB_SECRET "
                         "the same on every node?");
    assert_null(strstr(k[0].msg, "s3cret"));
    assert_null(strstr(k[1].msg, "not the secret"));
    assert_null(strstr(err, "s3cret"));
    free(err);
}

/* ---- resolving rank 0's address ------------------------------------------- */

/* A name that can never resolve fails at once (a config error naming the
 * name, the resolver's words and its code), not after the timeout.  (A
 * name with a '!' fails in the C library's own check, with or without a
 * network or a DNS server.) */
static void test_unresolvable(void **state)
{
    rank_run_t k[2];
    memset(&k[1], 0, sizeof k[1]);
    k[1].o = (dt_rdzv_opts_t){.addr = "no_such_host!", .port = 29500, .rank = 1, .size = 2,
                              .job_id = "x", .secret = "s3cret", .timeout_s = 5.0};
    double t0 = mono_s();
    rank_main(&k[1]);
    double took = mono_s() - t0;
    assert_int_equal(k[1].rc, DT_ERR_CONFIG);
    assert_string_equal(k[1].msg, "rendezvous: rank 1 of 2 cannot resolve 'no_such_host!': Name "
                                  "or service not known (EAI_NONAME): check launch.master_addr "
                                  "(--master-addr; MASTER_ADDR under torchrun)");
    assert_true(took < 1.0);
    char why[300];
    assert_int_equal(dt_rdzv_check_host("no_such_host!", why, sizeof why), -1);
    assert_string_equal(why, "cannot resolve 'no_such_host!': Name or service not known "
                             "(EAI_NONAME)");
    assert_int_equal(dt_rdzv_check_host("127.0.0.1", why, sizeof why), 1);
}

/* A resolver that cannot answer now (EAI_AGAIN: a DNS server down for a
 * moment) is asked again: three such failures, then the job forms; one
 * that never answers ends in the timeout, naming it. */
static void test_resolve_transient(void **state)
{
    dt_test_require_hooks("dt_rdzv_test_resolve_fail");
    rank_run_t k[2];
    int port = 0;
    start_ranks(k, 1, 2, 5.0, NULL, NULL, 0, &port);
    dt_rdzv_test_resolve_fail(EAI_AGAIN, 3);
    memset(&k[1], 0, sizeof k[1]);
    k[1].o = (dt_rdzv_opts_t){.addr = "127.0.0.1", .port = port, .rank = 1, .size = 2,
                              .job_id = "x", .secret = "s3cret", .config_hash = 0x1234,
                              .timeout_s = 5.0};
    rank_main(&k[1]);
    join_ranks(k, 1);
    dt_rdzv_test_resolve_fail(0, 0);
    if (k[1].rc)
        fail_msg("rank 1 after 3 transient failures: %s", k[1].msg);
    assert_int_equal(k[0].rc, DT_OK);

    dt_rdzv_test_resolve_fail(EAI_AGAIN, 1000000);
    memset(&k[1], 0, sizeof k[1]);
    k[1].o = (dt_rdzv_opts_t){.addr = "127.0.0.1", .port = port, .rank = 1, .size = 2,
                              .job_id = "x", .secret = "s3cret", .timeout_s = 0.3};
    rank_main(&k[1]);
    dt_rdzv_test_resolve_fail(0, 0);
    char want[512];
    snprintf(want, sizeof want,
             "rendezvous: rank 1 of 2 could not join rank 0 at 127.0.0.1:%d within 0.3 s: "
             "rank 0 never answered (not started, a firewall, or the wrong "
             "master_addr/master_port?) (last: cannot resolve '127.0.0.1': Temporary failure "
             "in name resolution (EAI_AGAIN))", port);
    assert_int_equal(k[1].rc, DT_ERR_TIMEOUT);
    assert_string_equal(k[1].msg, want);
}

/* ---- all-gather ----------------------------------------------------------- */

static void test_gather_size_mismatch(void **state)
{
    rank_run_t k[2];
    int port = 0;
    start_ranks(k, 1, 2, 5.0, NULL, NULL, 1, &port);
    memset(&k[1], 0, sizeof k[1]);
    k[1].o = k[0].o;
    k[1].o.rank = 1;
    k[1].o.port = port;
    k[1].gathers = 1;
    k[1].gather_bytes = 8; /* rank 0 offers BLOB */
    assert_int_equal(pthread_create(&k[1].th, NULL, rank_main, &k[1]), 0);
    join_ranks(k, 2);
    const char *want = "rendezvous: bootstrap all-gather #1: rank 1 offered 8 bytes for "
                       "all-gather #1, rank 0 24 bytes for #1 (every rank must make the same "
                       "calls)";
    assert_int_equal(k[0].rc, DT_ERR_INVALID);
    assert_string_equal(k[0].msg, want);
    assert_int_equal(k[1].rc, DT_ERR_INVALID);
    assert_has(k[1].msg, want);
}

static void test_ipv6(void **state)
{
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    if (!ok) {
        print_message("no IPv6 loopback here: skipped\n");
        skip();
    }
    rank_run_t k[2];
    int port = 0;
    g_addr = "::1";
    start_ranks(k, 2, 2, 5.0, NULL, NULL, 1, &port);
    g_addr = "127.0.0.1";
    join_ranks(k, 2);
    assert_int_equal(k[0].rc, DT_OK);
    if (k[1].rc)
        fail_msg("rank 1 over ::1: %s", k[1].msg);
    assert_string_equal(k[1].job_id, "job-of-rank-0");
}

/* A free TCP port on 127.0.0.1 (free when asked; good enough for a test). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* The session `dtrain run` opens around comm init: ranks of one node join
 * only when a comm plugin first asks for a bootstrap all-gather (here rank
 * 0 in this process, rank 1 a child process); ranks that span nodes join
 * at once and take rank 0's job id; after the session, the all-gather is
 * refused. */
static void test_session(void **state)
{
    for (int spans = 0; spans < 2; spans++) {
        int port = free_port();
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            dt_rdzv_opts_t o = {.addr = "127.0.0.1", .port = port, .rank = 1, .size = 2,
                                .job_id = "child", .secret = "s3cret", .config_hash = 7,
                                .timeout_s = 10};
            dt_rdzv_t *r = NULL;
            uint8_t mine[4] = {1, 1, 1, 1}, all[8];
            int rc = dt_rdzv_open(&o, &r);
            if (!rc)
                rc = dt_rdzv_join(r);
            if (!rc)
                rc = dt_rdzv_all_gather(r, mine, 4, all, 0);
            dt_rdzv_close(r);
            _exit(rc ? 10 + rc : all[0] == 0 && all[4] == 1 ? 0 : 3);
        }
        dt_world_t w = {.rank = 0, .size = 2, .local_rank = 0, .local_size = spans ? 1 : 2,
                        .job_id = "proposed", .job_secret = "s3cret",
                        .master_addr = "127.0.0.1", .master_port = port,
                        .source = "dtrain launcher", .size_var = "DTRAIN_WORLD_SIZE"};
        dt_test_stderr_begin();
        int rc = dt_rdzv_session_begin(&w, 7, 10.0);
        uint8_t mine[4] = {0}, all[8] = {9};
        if (!rc)
            rc = dt_rdzv_session_all_gather(mine, 4, all, 0);
        dt_rdzv_session_end();
        char *err = dt_test_stderr_end();
        int st = 0;
        waitpid(pid, &st, 0);
        if (rc)
            fail_msg("spans %d: %s", spans, dt_last_error());
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        assert_int_equal(all[0], 0);
        assert_int_equal(all[4], 1);
        assert_has(err, "rendezvous: rank 0 of 2 joined job proposed (rank 0 at 127.0.0.1:");
        free(err);
        assert_string_equal(w.job_id, "proposed");
        assert_status(dt_rdzv_session_all_gather(mine, 4, all, 0), DT_ERR_UNSUPPORTED);
    }
}

/* Every node's launcher names a job of several nodes alike, from what they
 * share, and the name does not show the secret. */
static void test_nodes_job_id(void **state)
{
    char a[64], b[64], c[64];
    dt_rdzv_nodes_job_id("s3cret", "10.0.0.1", 29500, a, sizeof a);
    dt_rdzv_nodes_job_id("s3cret", "10.0.0.1", 29500, b, sizeof b);
    dt_rdzv_nodes_job_id("s3cret", "10.0.0.1", 29501, c, sizeof c);
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    assert_int_equal(strlen(a), 3 + 16);
    assert_memory_equal(a, "mn-", 3);
    assert_null(strstr(a, "s3cret"));
}

static void test_bad_options(void **state)
{
    dt_rdzv_t *r = NULL;
    dt_rdzv_opts_t o = {.addr = "127.0.0.1", .port = 29500, .rank = 1, .size = 2,
                        .job_id = "j", .secret = "", .timeout_s = 1};
    assert_status(dt_rdzv_open(&o, &r), DT_ERR_CONFIG);
    assert_msg("rendezvous: no job secret: set DTRAIN_JOB_SECRET to the same value on every "
               "node (ranks prove they belong to the job with it)");
    o.secret = "s";
    o.port = 0;
    assert_status(dt_rdzv_open(&o, &r), DT_ERR_INVALID);
    assert_null(r);
}

int main(void)
{
    dt_test_deadline(120, "test_rendezvous");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_agree_and_gather),
        cmocka_unit_test(test_single_rank),
        cmocka_unit_test(test_config_hash_mismatch),
        cmocka_unit_test(test_duplicate_and_size),
        cmocka_unit_test(test_missing_rank_times_out),
        cmocka_unit_test(test_rank0_never_answers),
        cmocka_unit_test(test_stray_wrong_secret),
        cmocka_unit_test(test_garbage_frames),
        cmocka_unit_test(test_flood),
        cmocka_unit_test(test_wrong_secret_named),
        cmocka_unit_test(test_unresolvable),
        cmocka_unit_test(test_resolve_transient),
        cmocka_unit_test(test_gather_size_mismatch),
        cmocka_unit_test(test_ipv6),
        cmocka_unit_test(test_session),
        cmocka_unit_test(test_nodes_job_id),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
