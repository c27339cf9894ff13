/*
 * tests/unit/test_nccl_bootstrap.c - how the nccl communicator's ranks
 * agree on the world's ncclUniqueId (plugins/nccl/nccl_bootstrap.c,
 * compiled in): rank 0 publishes it under the job id and a second rank
 * reads the same bytes; a rank whose job secret differs is refused; a rank
 * that waits for an id nobody publishes times out with a message naming
 * the file; a world over several machines is refused (the cross-machine
 * rendezvous is not built yet); bad job ids are refused; cleanup_job
 * removes what a crashed job left.  ncclGetUniqueId needs no GPU, so this
 * runs on every machine whose build found NCCL (exit 77, skipped, when
 * not).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#if defined(DT_TEST_HAVE_NCCL)
#include "../../plugins/nccl/nccl_internal.h"
#include "dtrain/dtrain.h"
#include "test_host.h"
#include "util/error.h"

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
    dt_comm_init_v1_t multi = args(0, 8, 4, NULL, 1000);
    assert_int_equal(nccl_bootstrap_id(&th.host, &multi, &id), DT_ERR_UNSUPPORTED);
    assert_string_equal(dt_last_error(),
                        "comm/nccl: init: 8 ranks on several machines (4 on this one): "
                        "the nccl communicator agrees on its unique id within one machine "
                        "only so far; the cross-machine rendezvous (MASTER_ADDR/"
                        "MASTER_PORT) is not built yet");
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

int main(void)
{
    snprintf(g_job, sizeof g_job, "t-nccl-%ld", (long)getpid());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_publish_and_read),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_cleanup_job),
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
