/*
 * tests/unit/plugins/shm/shm_job_secret.c - test_shm's job secret: outsiders
 * who know the job id but not its secret are refused at once, and the hash
 * behind it against published vectors.
 */
#include "shm_test.h"

/* white box: the hash behind the job secret, checked against published
 * vectors (the module exports only its entry, so its copy is unreachable;
 * this is the same source, compiled into the test) */
#include "shm/shm_secret.c"

/* ---- the job secret -------------------------------------------------------- */

/* An outsider knows the job id, not its secret: refused at once, naming the
 * file and never the secret; the file holds no secret either. */
static int outsider(const secret_args_t *sa, int k)
{
    run_args_t a = sa->run;
    a.secret = sa->outsider_secret[k];
    CHILD_CHECK(wait_for(&sa->board->creator_pid, 1, 10.0) == 0, "rank 0 never started");
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    double t0 = now_s();
    int rc = join(&a, 1, 2, &th, &c);
    double dt = now_s() - t0;
    char path[256], who[320], want[2048];
    seg_path_of(path, sizeof path, a.job);
    owner_text(who, sizeof who, geteuid());
    const char *text;
    if (!a.secret)
        text = "with a job secret, but this rank has none (pass every rank the job's "
               "secret, DTRAIN_JOB_SECRET)";
    else if (!sa->run.secret)
        text = "without a job secret, but this rank has one: it is not this job's segment "
               "(another job uses this job id, or a rank was started without the job's "
               "secret)";
    else
        text = "with another job secret than this rank's: it is not this job's segment "
               "(another job uses this job id, or this rank was given another job's secret)";
    snprintf(want, sizeof want, "comm/shm: rendezvous for job '%s': %s (owner %s, mode "
             "0600): created by pid %d %s", a.job, path, who,
             atomic_load(&sa->board->creator_pid), text);
    CHILD_CHECK(rc == DT_ERR_DATA && c == NULL, "outsider %d: init gave %s: %s", k,
                dt_status_name(rc), dt_last_error());
    CHILD_CHECK(strcmp(dt_last_error(), want) == 0, "outsider %d: message\n  got:  %s\n  "
                "want: %s", k, dt_last_error(), want);
    CHILD_CHECK(dt < PROMPT_S, "outsider %d refused after %.2f s", k, dt);
    for (int s = 0; s < 2; s++) {
        const char *secret = s ? a.secret : sa->run.secret;
        CHILD_CHECK(!secret || !strstr(dt_last_error(), secret), "the message shows a secret");
    }
    /* the segment stores no secret, only a tag (of the creator's, if any) */
    int fd = open(path, O_RDONLY);
    CHILD_CHECK(fd >= 0, "the victim's segment is gone: %s", strerror(errno));
    shm_hdr_t h;
    CHILD_CHECK(pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h, "short read");
    struct stat st;
    fstat(fd, &st);
    char *all = malloc((size_t)st.st_size);
    CHILD_CHECK(all && pread(fd, all, (size_t)st.st_size, 0) == st.st_size, "read");
    close(fd);
    if (sa->run.secret) {
        CHILD_CHECK(!memmem(all, (size_t)st.st_size, sa->run.secret, strlen(sa->run.secret)),
                    "the segment holds the job secret");
        uint8_t zero[SHM_SHA256_BYTES] = {0};
        CHILD_CHECK(h.secret == SHM_SECRET_HMAC_SHA256 && memcmp(h.tag, zero, sizeof zero),
                    "no tag in the segment");
    }
    free(all);
    atomic_fetch_add(&sa->board->refused, 1);
    return 0;
}

/* Rank 0 (the job's secret) creates; the outsiders try as rank 1 and are
 * refused; then the real rank 1 (the same secret) joins and they add. */
static int child_secret(int proc, int nproc, void *arg)
{
    const secret_args_t *sa = arg;
    if (proc > 0 && proc < nproc - 1)
        return outsider(sa, proc - 1);
    int rank = proc == 0 ? 0 : 1;
    if (rank == 0)
        atomic_store(&sa->board->creator_pid, (int)getpid());
    else
        CHILD_CHECK(wait_for(&sa->board->refused, sa->outsiders, 10.0) == 0,
                    "the outsiders never finished");
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(&sa->run, rank, 2, &th, &c));
    float x[64];
    fill(x, DT_F32, rank, 64, 9);
    CHILD_OK(g_ops->all_reduce(c, x, x, 64, DT_F32, DT_OP_SUM, NULL, NULL));
    if (check_reduced(x, DT_F32, DT_OP_SUM, 2, 64, 0, 9, "with a secret"))
        return 1;
    g_ops->finalize(c);
    return 0;
}

static void run_secret_case(const char *job_secret, const char *o0, const char *o1,
                            int outsiders)
{
    secret_board_t *board = mmap(NULL, sizeof *board, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(board != MAP_FAILED);
    atomic_init(&board->creator_pid, 0);
    atomic_init(&board->refused, 0);
    secret_args_t sa = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots,
                                .secret = job_secret},
                        .board = board, .outsider_secret = {o0, o1},
                        .outsiders = outsiders};
    new_job(sa.run.job, sizeof sa.run.job, "secret");
    dt_mp_result_t res;
    assert_int_equal(dt_mp_run(2 + outsiders, child_secret, &sa, 30.0, &res), 0);
    char why[8192];
    if (!dt_mp_all_ok(&res, why, sizeof why))
        fail_msg("%s", why);
    assert_int_equal(leftovers(sa.run.job), 0);
    munmap(board, sizeof *board);
}

/* A job with a secret: a rank with another secret, or none, is refused;
 * ranks with the right one train together.  A job without one: a rank
 * with a secret is refused (it belongs to another job). */
void test_job_secret(void **state)
{
    (void)state;
    run_secret_case("3b9f0c1e7d2a4f60a8c5e1d7b3f9a2c4", "guessed-or-another-jobs", NULL, 2);
    run_secret_case(NULL, "3b9f0c1e7d2a4f60a8c5e1d7b3f9a2c4", NULL, 1);
    /* and the right secret alone: no outsider */
    run_secret_case("s", NULL, NULL, 0);
}

/* SHA-256 (FIPS 180-4 examples) and HMAC-SHA256 (RFC 4231 cases 1, 2,
 * 6), through the plugin's own source (its functions are hidden in the
 * module). */
static void hex(char *out, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

void test_secret_hash_vectors(void **state)
{
    (void)state;
    uint8_t d[SHM_SHA256_BYTES];
    char x[2 * SHM_SHA256_BYTES + 1];
    dt_sha256("abc", 3, d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    dt_sha256("", 0, d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    dt_sha256(two, strlen(two), d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    char *million = malloc(1000000);
    assert_non_null(million);
    memset(million, 'a', 1000000);
    dt_sha256(million, 1000000, d);
    free(million);
    hex(x, d, sizeof d);
    assert_string_equal(x, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");

    uint8_t key[131];
    memset(key, 0x0b, 20);
    dt_hmac_sha256(key, 20, "Hi There", 8, d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    const char *q = "what do ya want for nothing?";
    dt_hmac_sha256("Jefe", 4, q, strlen(q), d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(key, 0xaa, sizeof key);
    const char *big = "Test Using Larger Than Block-Size Key - Hash Key First";
    dt_hmac_sha256(key, sizeof key, big, strlen(big), d);
    hex(x, d, sizeof d);
    assert_string_equal(x, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");

    /* the tag: HMAC(SHA-256(secret), label NUL name NUL salt) */
    uint8_t k1[SHM_SHA256_BYTES], salt[SHM_SALT_BYTES], tag[SHM_SHA256_BYTES];
    uint8_t ref[SHM_SHA256_BYTES], msg[64];
    shm_secret_key("s3cret", k1);
    dt_sha256("s3cret", 6, d);
    assert_memory_equal(k1, d, sizeof d);
    for (int i = 0; i < SHM_SALT_BYTES; i++)
        salt[i] = (uint8_t)(i * 17 + 3);
    shm_secret_tag(k1, "/dtrain-j", salt, tag);
    memcpy(msg, "dtrain-shm-secret\0/dtrain-j\0", 28);
    memcpy(msg + 28, salt, sizeof salt);
    dt_hmac_sha256(k1, sizeof k1, msg, 28 + sizeof salt, ref);
    assert_memory_equal(tag, ref, sizeof ref);
    salt[0] ^= 1; /* another salt, another tag */
    shm_secret_tag(k1, "/dtrain-j", salt, ref);
    assert_false(dt_equal_ct(tag, ref, sizeof ref));
    assert_true(dt_equal_ct(tag, tag, sizeof tag));
}
