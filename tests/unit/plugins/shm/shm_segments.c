/*
 * tests/unit/plugins/shm/shm_segments.c - what test_shm finds at a job's
 * segment name: a stale segment left by a crash, planted files trusted by no
 * one (a foreign owner, an open mode, links, a corrupt or stale header,
 * garbage, a reused creator pid), the mode segments are created with, rank 0
 * as their creator, their names and cleanup_job.
 */
#include "shm_test.h"

/* A segment left by a job whose process died mid-rendezvous does not stop
 * a new job with the same id. */
static int child_stale_ok(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(a, rank, N, &th, &c));
    float x[64];
    fill(x, DT_F32, rank, 64, 5);
    CHILD_OK(g_ops->all_reduce(c, x, x, 64, DT_F32, DT_OP_SUM, NULL, NULL));
    if (check_reduced(x, DT_F32, DT_OP_SUM, N, 64, 0, 5, "after stale"))
        return 1;
    g_ops->finalize(c);
    return 0;
}

void test_stale_segment(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 10000, .kv = NULL};
    new_job(a.job, sizeof a.job, "stale");
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/dtrain-%s", a.job);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dt_test_host_t th;
        dt_comm_t *c;
        join(&a, 0, 2, &th, &c); /* waits for a rank 1 that never comes */
        _exit(0);
    }
    struct stat st;
    double t0 = now_s();
    while (stat(path, &st) != 0 && now_s() - t0 < 5.0) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    struct timespec ts = {0, 50000000};
    nanosleep(&ts, NULL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(stat(path, &st), 0); /* the crash left it behind */
    run_expect_ok(2, child_stale_ok, &a, 20.0);
}

/* ---- what is found under the segment's name is trusted by no one ---------
 *
 * Job ids are predictable, so anybody can put a file where a job's segment
 * will be.  Each case plants one, runs both ranks of the victim job (rank
 * 0 creates segments, rank 1 joins them: both paths) and checks that each
 * is refused at once with the exact status and message, that the planted
 * file is left exactly as it was (nothing written into it, nothing of the
 * victim's beside it), and, in the sanitizer build, that nothing crashed
 * or leaked.  The planted segments are copies of a real one (made once by
 * template_image) whose creator is alive (this test), so that a victim
 * that did not check them would trust them rather than find them stale,
 * changed where each case says. */

static unsigned char *g_image;  /* a real segment of a 2-rank group */
static size_t g_image_bytes;

/* The segment rank 0 of a 2-rank group creates (slot_bytes 65536),
 * copied while rank 0 waits for a rank 1 that never comes; rank 0 is then
 * killed and the file removed. */
static const shm_hdr_t *template_image(void)
{
    if (g_image)
        return (const shm_hdr_t *)g_image;
    run_args_t a = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots};
    new_job(a.job, sizeof a.job, "tmpl");
    char path[256];
    seg_path_of(path, sizeof path, a.job);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dt_test_host_t th;
        dt_comm_t *c;
        join(&a, 0, 2, &th, &c);
        _exit(0);
    }
    unsigned char *img = NULL;
    size_t bytes = 0;
    for (double t0 = now_s(); !img && now_s() - t0 < 5.0;) {
        int fd = open(path, O_RDONLY);
        struct stat st;
        uint64_t magic = 0;
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size >= (off_t)sizeof(shm_hdr_t) &&
            pread(fd, &magic, sizeof magic, 0) == (ssize_t)sizeof magic && magic == SHM_MAGIC) {
            bytes = (size_t)st.st_size;
            img = malloc(bytes);
            assert_non_null(img);
            assert_int_equal(pread(fd, img, bytes, 0), (ssize_t)bytes);
        }
        if (fd >= 0)
            close(fd);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    unlink(path);
    assert_non_null(img);
    g_image = img;
    g_image_bytes = bytes;
    return (const shm_hdr_t *)g_image;
}

/* Free the template (test_shm's teardown). */
void free_template_image(void)
{
    free(g_image);
    g_image = NULL;
}

/* A copy of the template to change. */
static unsigned char *image_copy(void)
{
    template_image();
    unsigned char *p = malloc(g_image_bytes);
    assert_non_null(p);
    memcpy(p, g_image, g_image_bytes);
    return p;
}

/* A copy whose creator is alive (this process): not stale, so a victim
 * that did not check it would join it and trust its header. */
static unsigned char *live_image_copy(void)
{
    unsigned char *p = image_copy();
    shm_hdr_t *h = (shm_hdr_t *)p;
    atomic_store(&h->creator_pid, (int32_t)getpid());
    h->creator_start = 0; /* unknown: the pid alone says alive */
    return p;
}

/* Put `bytes` of `data` at the job's segment name, with `mode`, owned by
 * `owner`. */
static void plant_file(const char *job, const void *data, size_t bytes, mode_t mode,
                       uid_t owner)
{
    char path[256];
    seg_path_of(path, sizeof path, job);
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, bytes), (ssize_t)bytes);
    assert_int_equal(fchmod(fd, mode), 0);
    if (owner != geteuid())
        assert_int_equal(fchown(fd, owner, (gid_t)-1), 0);
    close(fd);
}

/* The planted file is still there, with that mode, owner and content. */
static void assert_untouched(const char *path, const void *data, size_t bytes, mode_t mode,
                             uid_t owner)
{
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 07777, mode);
    assert_int_equal(st.st_uid, owner);
    assert_int_equal((size_t)st.st_size, bytes);
    unsigned char *now = malloc(bytes + 1);
    assert_non_null(now);
    int fd = open(path, O_RDONLY | O_NOFOLLOW);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, now, bytes + 1, 0), (ssize_t)bytes);
    close(fd);
    assert_memory_equal(now, data, bytes);
    free(now);
}

typedef struct refuse_args {
    run_args_t run;
    int status;       /* expected of init */
    char want[2048];  /* expected message, exactly */
} refuse_args_t;

/* "comm/shm: rendezvous for job 'J': /dev/shm/dtrain-J (owner ..., mode
 * 0MMM): " followed by the formatted text. */
static void want_refusal(refuse_args_t *ra, uid_t owner, mode_t mode, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void want_refusal(refuse_args_t *ra, uid_t owner, mode_t mode, const char *fmt, ...)
{
    char who[320], text[1024], path[256];
    owner_text(who, sizeof who, owner);
    seg_path_of(path, sizeof path, ra->run.job);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    snprintf(ra->want, sizeof ra->want, "comm/shm: rendezvous for job '%s': %s (owner %s, "
             "mode %04o): %s", ra->run.job, path, who, (unsigned)mode, text);
}

/* Both ranks are refused with ra's status and message, at once. */
static int child_refused(int rank, int N, void *arg)
{
    const refuse_args_t *ra = arg;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    double t0 = now_s();
    int rc = join(&ra->run, rank, N, &th, &c);
    double dt = now_s() - t0;
    CHILD_CHECK(rc == ra->status && c == NULL, "init gave %s (want %s): %s",
                dt_status_name(rc), dt_status_name(ra->status), dt_last_error());
    CHILD_CHECK(strcmp(dt_last_error(), ra->want) == 0, "message\n  got:  %s\n  want: %s",
                dt_last_error(), ra->want);
    CHILD_CHECK(dt < PROMPT_S, "refused after %.2f s (timeout %.1f s)", dt,
                (double)ra->run.timeout_ms / 1000.0);
    return 0;
}

/* Run both ranks of ra's job against what was planted at its name. */
static void run_refused(refuse_args_t *ra)
{
    dt_mp_result_t res;
    assert_int_equal(dt_mp_run(2, child_refused, ra, 20.0, &res), 0);
    char why[8192];
    if (!dt_mp_all_ok(&res, why, sizeof why))
        fail_msg("%s", why);
}

/* A copy of a real segment, owned by another user (nobody, 65534). */
void test_planted_foreign_owner(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "test_planted_foreign_owner: not root: cannot plant a file of "
                        "another user; not checked\n");
        return;
    }
    refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                        .status = DT_ERR_DATA};
    new_job(ra.run.job, sizeof ra.run.job, "owner");
    unsigned char *img = live_image_copy();
    plant_file(ra.run.job, img, g_image_bytes, 0600, 65534);
    want_refusal(&ra, 65534, 0600, "owned by another user, not by this one (uid 0); "
                 "refusing to join a segment someone else created (its owner or root can "
                 "remove it; or use another job id)");
    run_refused(&ra);
    char path[256];
    seg_path_of(path, sizeof path, ra.run.job);
    assert_untouched(path, img, g_image_bytes, 0600, 65534);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(leftovers(ra.run.job), 0);
    free(img);
}

/* A copy of a real segment of ours that others may read (0644) or write
 * (0606). */
void test_planted_open_mode(void **state)
{
    (void)state;
    static const mode_t modes[] = {0644, 0606, 0660};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                            .status = DT_ERR_DATA};
        new_job(ra.run.job, sizeof ra.run.job, "mode");
        char path[256];
        seg_path_of(path, sizeof path, ra.run.job);
        unsigned char *img = live_image_copy();
        plant_file(ra.run.job, img, g_image_bytes, modes[i], geteuid());
        want_refusal(&ra, geteuid(), modes[i], "group or others may access it (shm creates "
                     "segments with mode 0600); refusing it (remove it: rm %s)", path);
        run_refused(&ra);
        assert_untouched(path, img, g_image_bytes, modes[i], geteuid());
        assert_int_equal(unlink(path), 0);
        assert_int_equal(leftovers(ra.run.job), 0);
        free(img);
    }
}

/* A symlink at the name, to a copy of a real segment elsewhere. */
void test_planted_symlink(void **state)
{
    (void)state;
    refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                        .status = DT_ERR_DATA};
    new_job(ra.run.job, sizeof ra.run.job, "link");
    char path[256], target[256];
    seg_path_of(path, sizeof path, ra.run.job);
    snprintf(target, sizeof target, "/tmp/%s-target", ra.run.job);
    unsigned char *img = live_image_copy();
    int fd = open(target, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, img, g_image_bytes), (ssize_t)g_image_bytes);
    close(fd);
    assert_int_equal(symlink(target, path), 0);
    struct stat lst;
    assert_int_equal(lstat(path, &lst), 0);
    want_refusal(&ra, geteuid(), lst.st_mode & 07777, "a symbolic link where the group's "
                 "segment should be (shm never creates one); refusing to follow it (remove "
                 "it: rm %s)", path);
    run_refused(&ra);
    assert_int_equal(lstat(path, &lst), 0);
    assert_true(S_ISLNK(lst.st_mode)); /* the link is left, and not followed: */
    assert_untouched(target, img, g_image_bytes, 0600, geteuid());
    assert_int_equal(unlink(path), 0);
    assert_int_equal(leftovers(ra.run.job), 0);
    unlink(target);
    free(img);
}

/* A second name (hard link) of another file of ours: of another job's
 * segment, say.  /tmp may be another file system, so the file is in
 * /dev/shm under a name no job uses. */
void test_planted_hard_link(void **state)
{
    (void)state;
    refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                        .status = DT_ERR_DATA};
    new_job(ra.run.job, sizeof ra.run.job, "hard");
    char path[256], other[256];
    seg_path_of(path, sizeof path, ra.run.job);
    snprintf(other, sizeof other, "/dev/shm/%s-other", ra.run.job);
    unsigned char *img = live_image_copy();
    int fd = open(other, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, img, g_image_bytes), (ssize_t)g_image_bytes);
    close(fd);
    assert_int_equal(link(other, path), 0);
    want_refusal(&ra, geteuid(), 0600, "has 2 names (hard links) where a segment has one; "
                 "refusing it (remove this one: rm %s)", path);
    run_refused(&ra);
    assert_untouched(other, img, g_image_bytes, 0600, geteuid());
    assert_int_equal(unlink(path), 0);
    assert_int_equal(leftovers(ra.run.job), 0);
    unlink(other);
    free(img);
}

/* How a case changes the template's header (h) and what is refused. */
typedef struct corruption {
    const char *name;
    void (*apply)(shm_hdr_t *h);
    int status;
    const char *expect; /* printf format of the text; see want_corrupt */
} corruption_t;

static void c_off_ranks_far(shm_hdr_t *h) { h->off_ranks = 0xfffffffffffff000ull; }
static void c_off_p2p_end(shm_hdr_t *h) { h->off_p2p = h->total; }
static void c_total_double(shm_hdr_t *h) { h->total *= 2; }
static void c_chunk_overflow(shm_hdr_t *h) { h->chunk = 1ull << 62; }
static void c_chunk_zero(shm_hdr_t *h) { h->chunk = 0; }
static void c_p2p_overflow(shm_hdr_t *h) { h->p2p_chunk = 0xfffffffffffff000ull; }
static void c_size_huge(shm_hdr_t *h) { h->size = INT32_MAX; }
static void c_nbuf(shm_hdr_t *h) { h->nbuf = 0xffffffffu; }
static void c_attached(shm_hdr_t *h) { atomic_store(&h->attached, 0xffffffffu); }
static void c_version(shm_hdr_t *h) { h->version = 99; }
static void c_creator(shm_hdr_t *h) { atomic_store(&h->creator_pid, 0); }
/* consistent with itself, for 32 KiB chunks: larger than the file */
static void c_bigger_than_file(shm_hdr_t *h)
{
    uint64_t p2p_bytes = h->total - h->off_p2p;
    h->chunk = 32768;
    h->off_p2p = h->off_slots + 2ull * SHM_NBUF * h->chunk;
    h->total = h->off_p2p + p2p_bytes;
}

/* The expected text: the template's values go in by name. */
static void want_corrupt(refuse_args_t *ra, const corruption_t *k, const shm_hdr_t *t,
                         const shm_hdr_t *h)
{
    char path[256], detail[512];
    seg_path_of(path, sizeof path, ra->run.job);
    const unsigned long long T = t->total;
    if (k->apply == c_off_ranks_far)
        snprintf(detail, sizeof detail, "off_ranks 18446744073709547520, expected %llu for 2 "
                 "ranks with 16384- and 262144-byte buffers", (unsigned long long)t->off_ranks);
    else if (k->apply == c_off_p2p_end)
        snprintf(detail, sizeof detail, "off_p2p %llu, expected %llu for 2 ranks with 16384- "
                 "and 262144-byte buffers", T, (unsigned long long)t->off_p2p);
    else if (k->apply == c_total_double)
        snprintf(detail, sizeof detail, "total %llu, expected %llu for 2 ranks with 16384- "
                 "and 262144-byte buffers", 2 * T, T);
    else if (k->apply == c_chunk_overflow)
        snprintf(detail, sizeof detail, "chunk 4611686018427387904 bytes, expected a multiple "
                 "of 4096 in [4096, 268435456]");
    else if (k->apply == c_chunk_zero)
        snprintf(detail, sizeof detail, "chunk 0 bytes, expected a multiple of 4096 in "
                 "[4096, 268435456]");
    else if (k->apply == c_p2p_overflow)
        snprintf(detail, sizeof detail, "p2p_chunk 18446744073709547520 bytes, expected a "
                 "multiple of 4096 in [16384, 262144]");
    else if (k->apply == c_nbuf)
        snprintf(detail, sizeof detail, "4294967295 pipeline and 4 channel buffers, expected "
                 "4 and 4");
    else if (k->apply == c_attached)
        snprintf(detail, sizeof detail, "4294967295 ranks attached and 0 detached of 2");
    else if (k->apply == c_creator)
        snprintf(detail, sizeof detail, "creator pid 0");
    else if (k->apply == c_bigger_than_file)
        snprintf(detail, sizeof detail, "it describes %llu bytes, the file has %llu",
                 (unsigned long long)h->total, T);
    else
        detail[0] = '\0';
    if (k->status == DT_ERR_DATA) {
        want_refusal(ra, geteuid(), 0600, "corrupt segment header: %s; refusing it (remove "
                     "it: rm %s)", detail, path);
    } else if (k->apply == c_size_huge) {
        snprintf(ra->want, sizeof ra->want, "comm/shm: rendezvous for job '%s': /dtrain-%s "
                 "was created for 2147483647 ranks by pid %d, but this rank was told the "
                 "group has 2 (is the job id used twice?)", ra->run.job, ra->run.job,
                 (int)h->creator_pid);
    } else { /* c_version */
        snprintf(ra->want, sizeof ra->want, "comm/shm: rendezvous for job '%s': /dtrain-%s "
                 "was created by pid %d with layout version 99 of the shm plugin; this "
                 "rank's plugin has version %u (ranks of one job must load the same "
                 "dtrain_shm)", ra->run.job, ra->run.job, (int)h->creator_pid, SHM_VERSION);
    }
}

/* Header fields that put parts of the segment outside the file, sizes
 * whose products overflow, counts out of range: each refused. */
void test_planted_corrupt_header(void **state)
{
    (void)state;
    static const corruption_t cases[] = {
        {"offset far outside", c_off_ranks_far, DT_ERR_DATA, NULL},
        {"offset at the end", c_off_p2p_end, DT_ERR_DATA, NULL},
        {"total beyond the file", c_total_double, DT_ERR_DATA, NULL},
        {"chunk overflowing", c_chunk_overflow, DT_ERR_DATA, NULL},
        {"chunk zero", c_chunk_zero, DT_ERR_DATA, NULL},
        {"p2p chunk overflowing", c_p2p_overflow, DT_ERR_DATA, NULL},
        {"self-consistent, larger than the file", c_bigger_than_file, DT_ERR_DATA, NULL},
        {"buffer count", c_nbuf, DT_ERR_DATA, NULL},
        {"attach counter", c_attached, DT_ERR_DATA, NULL},
        {"no creator", c_creator, DT_ERR_DATA, NULL},
        {"group size", c_size_huge, DT_ERR_INVALID, NULL},
        {"layout version", c_version, DT_ERR_INVALID, NULL},
    };
    const shm_hdr_t *t = template_image();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                            .status = cases[i].status};
        new_job(ra.run.job, sizeof ra.run.job, "hdr");
        unsigned char *img = live_image_copy();
        cases[i].apply((shm_hdr_t *)img);
        want_corrupt(&ra, &cases[i], t, (const shm_hdr_t *)img);
        plant_file(ra.run.job, img, g_image_bytes, 0600, geteuid());
        fprintf(stderr, "case: %s\n", cases[i].name);
        run_refused(&ra);
        char path[256];
        seg_path_of(path, sizeof path, ra.run.job);
        assert_untouched(path, img, g_image_bytes, 0600, geteuid());
        assert_int_equal(unlink(path), 0);
        assert_int_equal(leftovers(ra.run.job), 0);
        free(img);
    }
}

/* The unchanged template, planted: valid, its creator dead, so the
 * victims find it stale, replace it and run (the control for the cases
 * above: what they refuse is only what each changed). */
void test_planted_valid_stale(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots};
    new_job(a.job, sizeof a.job, "valid");
    template_image();
    plant_file(a.job, g_image, g_image_bytes, 0600, geteuid());
    run_expect_ok(2, child_stale_ok, &a, 20.0);
}

/* Zero-filled, garbage, empty, shorter than a header, cut short: files a
 * creator that died would leave, or anybody could plant.  Never waited on. */
void test_planted_garbage(void **state)
{
    (void)state;
    const shm_hdr_t *t = template_image();
    const size_t hdr = sizeof(shm_hdr_t);
    for (int k = 0; k < 5; k++) {
        refuse_args_t ra = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                            .status = DT_ERR_DATA};
        new_job(ra.run.job, sizeof ra.run.job, "junk");
        char path[256];
        seg_path_of(path, sizeof path, ra.run.job);
        unsigned char *img = live_image_copy();
        size_t bytes = g_image_bytes;
        uint64_t magic = 0;
        if (k == 0) {
            memset(img, 0, bytes); /* zero-filled, full size */
        } else if (k == 1) {
            memset(img, 0xa5, bytes); /* garbage */
            magic = 0xa5a5a5a5a5a5a5a5ull;
        } else if (k == 2) {
            bytes = 0; /* empty */
        } else if (k == 3) {
            bytes = 100; /* a piece of a header */
        } else {
            bytes = g_image_bytes / 2; /* a complete header, half the segment */
        }
        plant_file(ra.run.job, img, bytes, 0600, geteuid());
        if (k <= 1)
            want_refusal(&ra, geteuid(), 0600, "not a dtrain shm segment (magic 0x%016llx, "
                         "expected 0x%016llx): zero-filled or garbage, and nobody is still "
                         "writing it (a segment gets its name only once complete); remove "
                         "it: rm %s", (unsigned long long)magic,
                         (unsigned long long)SHM_MAGIC, path);
        else if (k <= 3)
            want_refusal(&ra, geteuid(), 0600, "%zu bytes, too small for a segment header "
                         "(%zu bytes): truncated, or not a segment (remove it: rm %s)",
                         bytes, hdr, path);
        else
            want_refusal(&ra, geteuid(), 0600, "corrupt segment header: it describes %llu "
                         "bytes, the file has %zu; refusing it (remove it: rm %s)",
                         (unsigned long long)t->total, bytes, path);
        run_refused(&ra);
        assert_untouched(path, img, bytes, 0600, geteuid());
        assert_int_equal(unlink(path), 0);
        assert_int_equal(leftovers(ra.run.job), 0);
        free(img);
    }
}

/* A valid segment whose creator's pid now belongs to another running
 * process (here: this test's own) is stale: its creator's start time
 * tells them apart.  The victims replace it rather than join it. */
void test_creator_pid_reused(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots};
    new_job(a.job, sizeof a.job, "reuse");
    unsigned char *img = image_copy();
    shm_hdr_t *h = (shm_hdr_t *)img;
    atomic_store(&h->creator_pid, (int32_t)getpid());
    h->creator_start = 1; /* nothing running now started 10 ms after boot */
    atomic_store(&h->attached, 0);
    shm_rank_t *ranks = (shm_rank_t *)(img + h->off_ranks);
    memset(ranks, 0, 2 * sizeof *ranks); /* nobody claimed a slot */
    plant_file(a.job, img, g_image_bytes, 0600, geteuid());
    char path[256];
    seg_path_of(path, sizeof path, a.job);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    const shm_hdr_t *planted = mmap(NULL, g_image_bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(planted != MAP_FAILED);
    run_expect_ok(2, child_stale_ok, &a, 20.0);
    assert_int_equal(atomic_load(&planted->attached), 0); /* nobody joined it */
    assert_int_equal(atomic_load(&planted->stale), 1);
    munmap((void *)planted, g_image_bytes);
    free(img);
}

/* ---- how segments are created ------------------------------------------- */

/* Rank 0 creates the segment 0600 even under umask 0777; a third process
 * looks at it before rank 1 joins (after that the name is gone). */
static int child_umask(int proc, int nproc, void *arg)
{
    (void)nproc;
    const secret_args_t *sa = arg;
    char path[256];
    seg_path_of(path, sizeof path, sa->run.job);
    if (proc == 2) {
        struct stat st;
        double t0 = now_s();
        while (lstat(path, &st) != 0) {
            CHILD_CHECK(now_s() - t0 < 10.0, "%s never appeared", path);
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        atomic_fetch_add(&sa->board->refused, 1);
        CHILD_CHECK(S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0600 &&
                    st.st_uid == geteuid(), "%s: mode %04o, uid %u", path,
                    (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        return 0;
    }
    if (proc == 0)
        umask(0777);
    else
        CHILD_CHECK(wait_for(&sa->board->refused, 1, 10.0) == 0, "never looked at");
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    CHILD_OK(join(&sa->run, proc, 2, &th, &c));
    CHILD_OK(g_ops->barrier(c, NULL));
    g_ops->finalize(c);
    return 0;
}

void test_segment_mode_whatever_umask(void **state)
{
    (void)state;
    secret_board_t *board = mmap(NULL, sizeof *board, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(board != MAP_FAILED);
    atomic_init(&board->refused, 0);
    secret_args_t sa = {.run = {.timeout_ms = PLANT_TIMEOUT_MS, .kv = small_slots},
                        .board = board};
    new_job(sa.run.job, sizeof sa.run.job, "umask");
    dt_mp_result_t res;
    assert_int_equal(dt_mp_run(3, child_umask, &sa, 30.0, &res), 0);
    char why[8192];
    if (!dt_mp_all_ok(&res, why, sizeof why))
        fail_msg("%s", why);
    assert_int_equal(leftovers(sa.run.job), 0);
    munmap(board, sizeof *board);
}

/* Rank 0 creates the group's segment: without it, the others wait for it
 * by name, and time out saying so. */
static int child_no_rank0(int rank, int N, void *arg)
{
    const run_args_t *a = arg;
    if (rank == 0)
        return 0;
    dt_test_host_t th;
    dt_comm_t *c = NULL;
    double t0 = now_s();
    int rc = join(a, rank, N, &th, &c);
    double dt = now_s() - t0;
    char want[512];
    snprintf(want, sizeof want, "comm/shm: rendezvous for job '%s': timed out after 1.0 s "
             "waiting for rank 0 of 2, which creates /dev/shm/dtrain-%s", a->job, a->job);
    CHILD_CHECK(rc == DT_ERR_TIMEOUT && c == NULL, "init gave %s: %s", dt_status_name(rc),
                dt_last_error());
    CHILD_CHECK(strcmp(dt_last_error(), want) == 0, "message: %s", dt_last_error());
    CHILD_CHECK(dt >= 0.95 && dt < 3.0, "took %.2f s for a 1.0 s timeout", dt);
    return 0;
}

void test_rendezvous_without_rank0(void **state)
{
    (void)state;
    run_args_t a = {.timeout_ms = 1000, .kv = NULL};
    new_job(a.job, sizeof a.job, "norank0");
    run_expect_ok(2, child_no_rank0, &a, 20.0);
}

void test_segment_names(void **state)
{
    (void)state;
    /* Every segment of a job is named from /dtrain-<job id>: cleanup_job
     * finds a crashed job's by name. */
    char w[SHM_NAME_MAX + 16], s1[SHM_NAME_MAX + 16], s2[SHM_NAME_MAX + 16];
    assert_int_equal(shm_world_name(w, sizeof w, "j42"), 11);
    assert_string_equal(w, "/dtrain-j42");
    assert_true(shm_split_name(s1, sizeof s1, w, 1, 0) > 0);
    assert_string_equal(s1, "/dtrain-j42-g1c0");
    assert_true(shm_split_name(s2, sizeof s2, s1, 3, 12) > 0);
    assert_string_equal(s2, "/dtrain-j42-g1c0-g3c12");
    char small[12];
    assert_int_equal(shm_world_name(small, sizeof small, "j42x"), -1);
    /* what cleanup_job takes for job j42's: those names, nothing else */
    assert_true(shm_is_job_segment("dtrain-j42", "j42"));
    assert_true(shm_is_job_segment("dtrain-j42-g1c0", "j42"));
    assert_true(shm_is_job_segment("dtrain-j42-g1c0-g3c12", "j42"));
    assert_false(shm_is_job_segment("dtrain-j4", "j42"));
    assert_false(shm_is_job_segment("dtrain-j421", "j42"));     /* job j421 */
    assert_false(shm_is_job_segment("dtrain-j42-x", "j42"));    /* job j42-x */
    assert_false(shm_is_job_segment("dtrain-j42-g1", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-g1c", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-gc0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-g1c0x", "j42"));
    assert_false(shm_is_job_segment("xdtrain-j42", "j42"));
    /* symmetric memory: one "-s<no>r<rank>" at the end of a group's name */
    char sym[64];
    assert_int_equal(shm_sym_name(sym, sizeof sym, "/dtrain-j42-g1c0", 3, 1), 21);
    assert_string_equal(sym, "/dtrain-j42-g1c0-s3r1");
    assert_true(shm_is_job_segment(sym + 1, "j42"));
    assert_true(shm_is_job_segment("dtrain-j42-s1r0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-s1r0-g1c0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-s1r0-s2r0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-s1", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-s1r", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-s1c0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j42-g1r0", "j42"));
    assert_false(shm_is_job_segment("dtrain-j421-s1r0", "j42"));
    assert_true(shm_valid_job_id("t-1_a.b"));
    assert_false(shm_valid_job_id(""));
    assert_false(shm_valid_job_id("a/b"));
    assert_false(shm_valid_job_id("../x"));
}

/* ---- cleanup_job ------------------------------------------------------- */

static void plant(const char *name, uid_t owner)
{
    char path[512];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    if (owner != geteuid())
        assert_int_equal(chown(path, owner, (gid_t)-1), 0);
}

static int shm_entry_exists(const char *name)
{
    char path[512];
    struct stat st;
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    return lstat(path, &st) == 0;
}

static void unlink_shm_entry(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    unlink(path);
}

void test_cleanup_job(void **state)
{
    (void)state;
    assert_true(DT_HAS_OP(dt_comm_ops_v1_t, g_ops, cleanup_job));
    char job[128], mine[5][192], other[3][192], link[192], foreign[192], target[256];
    new_job(job, sizeof job, "clean");
    /* what a crash of job `job` can leave: the world and nested splits,
     * and ranks' symmetric memory of either */
    snprintf(mine[0], sizeof mine[0], "dtrain-%s", job);
    snprintf(mine[1], sizeof mine[1], "dtrain-%s-g1c0", job);
    snprintf(mine[2], sizeof mine[2], "dtrain-%s-g1c0-g2c1", job);
    snprintf(mine[3], sizeof mine[3], "dtrain-%s-s1r0", job);
    snprintf(mine[4], sizeof mine[4], "dtrain-%s-g1c0-s2r3", job);
    /* other jobs whose ids start with ours, and a name no split has */
    snprintf(other[0], sizeof other[0], "dtrain-%s7", job);
    snprintf(other[1], sizeof other[1], "dtrain-%s-x", job);
    snprintf(other[2], sizeof other[2], "dtrain-%s-g3", job);
    for (int i = 0; i < 5; i++)
        plant(mine[i], geteuid());
    for (int i = 0; i < 3; i++)
        plant(other[i], geteuid());
    /* a symlink under one of our names, pointing at a file of ours */
    snprintf(target, sizeof target, "/tmp/%s-target", job);
    int fd = open(target, O_CREAT | O_EXCL | O_WRONLY, 0600);
    assert_true(fd >= 0);
    close(fd);
    snprintf(link, sizeof link, "dtrain-%s-g4c0", job);
    char link_path[512];
    snprintf(link_path, sizeof link_path, "/dev/shm/%s", link);
    assert_int_equal(symlink(target, link_path), 0);
    /* one of our names owned by another user (only root can plant it) */
    snprintf(foreign, sizeof foreign, "dtrain-%s-g5c0", job);
    int as_root = geteuid() == 0;
    if (as_root)
        plant(foreign, 65534);
    else
        fprintf(stderr, "test_cleanup_job: not root: the case of a file another user "
                        "owns is not checked\n");

    dt_test_host_t th;
    dt_test_host_init(&th, "comm/shm", NULL);
    assert_int_equal(g_ops->cleanup_job(&th.host, job), DT_OK);
    for (int i = 0; i < 5; i++)
        assert_false(shm_entry_exists(mine[i]));
    for (int i = 0; i < 3; i++)
        assert_true(shm_entry_exists(other[i]));
    struct stat st;
    assert_int_equal(lstat(link_path, &st), 0); /* the link itself is kept */
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(stat(target, &st), 0);     /* and was not followed */
    if (as_root)
        assert_true(shm_entry_exists(foreign));
    /* idempotent: nothing (of ours) left is DT_OK */
    assert_int_equal(g_ops->cleanup_job(&th.host, job), DT_OK);

    /* the job id is checked as init checks it */
    assert_int_equal(g_ops->cleanup_job(&th.host, "../x"), DT_ERR_INVALID);
    assert_string_equal(dt_last_error(), "comm/shm: cleanup_job: job id '../x' must be "
                        "1..96 letters, digits, '.', '_' or '-' (it names "
                        "/dev/shm/dtrain-<job id>)");
    assert_int_equal(g_ops->cleanup_job(&th.host, NULL), DT_ERR_INVALID);

    for (int i = 0; i < 3; i++)
        unlink_shm_entry(other[i]);
    unlink_shm_entry(link);
    unlink_shm_entry(foreign);
    unlink(target);
}
