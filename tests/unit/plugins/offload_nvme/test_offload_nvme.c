/*
 * tests/unit/plugins/offload_nvme/test_offload_nvme.c - the offload_nvme tier through its ops
 * table, on files in a fresh folder: its keys, the files (0600, job id and
 * rank in the name, 4 KiB-rounded, reserved, removed by free and
 * finalize), pieces at any offset from host and device memory through
 * small blocks and few bounce buffers (direct and buffered I/O), many
 * requests in flight, the capacity and free-space errors, config errors,
 * a file deleted or truncated under the tier, a read error, cleanup_job,
 * and - with a fake device whose copies block, holding the worker while
 * requests queue - a bounded wait, block-sized requests keeping every
 * bounce buffer busy, and loads after stores of overlapping bytes (all in
 * flight together) seeing exactly what was stored before them; bytes
 * changed in a file caught by the checksums (hardware and table, against
 * a bit-by-bit reference); missing folders made and removed, each file
 * and folder registered with the core's signal cleanup; folders another
 * user could change refused.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "dtrain/dtrain.h"
#include "fake_device.h"
#include "test_assert.h"
#include "test_hooks.h"
#include "test_host.h"
#include "test_plugin.h"

static const dt_offload_ops_v1_t *nvme_ops(void)
{
    static const dt_offload_ops_v1_t *ops;
    if (!ops && !(ops = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_offload_nvme.so",
                                             DT_ENTRY_STRING(offload, 1), NULL)))
        fail_msg("%s", dt_last_error());
    return ops;
}

static const dt_device_ops_v1_t *cpu_ops(void)
{
    static const dt_device_ops_v1_t *ops;
    if (!ops && !(ops = dt_test_plugin_entry(DT_TEST_PLUGIN_DIR "/dtrain_cpu.so",
                                             DT_ENTRY_STRING(device, 1), NULL)))
        fail_msg("%s", dt_last_error());
    return ops;
}

static char g_dir[1024];

/* A fresh folder (not created) for the tier's files, under the build.
 * Its name is long on purpose (CI checks out under a longer path than a
 * developer's tree): messages that name a file must name all of it. */
static const char *fresh_dir(const char *name)
{
    snprintf(g_dir, sizeof g_dir,
             DT_TEST_BINARY_DIR "/offload-nvme-%s-%d-a-folder-name-long-enough-that-a-message-"
                                "naming-one-of-its-files-is-longer-than-any-fixed-buffer-a-"
                                "short-path-would-fit-in",
             name, (int)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fail_msg("%s", cmd);
    return g_dir;
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

typedef struct {
    dt_test_host_t dh, oh;
    dt_test_kv_t kv[8];
    const dt_device_ops_v1_t *dops;
    dt_device_t *dev;
    const dt_offload_ops_v1_t *ops;
    dt_offload_t *o;
} tier_t;

/* A tier on folder `dir` with `direct` ("auto", "off") and small blocks
 * (8 KiB) and 2 bounce buffers, so pieces cross blocks and buffers. */
static int tier_open_rc(tier_t *t, const char *dir, const char *direct, const char *extra_key,
                        const char *extra_val)
{
    int k = 0;
    if (extra_key) /* first: the test host answers with the first match */
        t->kv[k++] = (dt_test_kv_t){extra_key, extra_val};
    t->kv[k++] = (dt_test_kv_t){"path", dir};
    t->kv[k++] = (dt_test_kv_t){"direct", direct};
    t->kv[k++] = (dt_test_kv_t){"block_size", "8192"};
    t->kv[k++] = (dt_test_kv_t){"buffers", "2"};
    t->kv[k] = (dt_test_kv_t){NULL, NULL};
    t->dops = cpu_ops();
    t->ops = nvme_ops();
    dt_test_host_init(&t->dh, "device/cpu", NULL);
    dt_test_host_init(&t->oh, "offload/offload_nvme", t->kv);
    dt_device_init_v1_t da = {.struct_size = sizeof da, .local_size = 1, .device_index = -1};
    assert_ok(t->dops->init(&t->dh.host, &da, &t->dev));
    dt_offload_init_v1_t oa = {.struct_size = sizeof oa, .rank = 2, .job_id = "unitjob",
                               .timeout_ms = 10000, .dev = t->dev};
    t->o = NULL;
    return t->ops->init(&t->oh.host, &oa, &t->o);
}

static void tier_open(tier_t *t, const char *dir, const char *direct)
{
    assert_ok(tier_open_rc(t, dir, direct, NULL, NULL));
}

static void tier_close(tier_t *t)
{
    t->ops->finalize(t->o);
    t->dops->finalize(t->dev);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed * 131u + i * 7u + (i >> 9));
}

static void store_wait(tier_t *t, dt_offload_buf_t *b, uint64_t off, const void *src,
                       uint64_t n, int space)
{
    dt_offload_req_t *r;
    assert_ok(t->ops->store(t->o, b, off, src, n, space, NULL, &r));
    assert_ok(t->ops->wait(t->o, r, -1));
}

static void load_wait(tier_t *t, dt_offload_buf_t *b, uint64_t off, void *dst, uint64_t n,
                      int space)
{
    dt_offload_req_t *r;
    assert_ok(t->ops->load(t->o, b, off, dst, n, space, NULL, &r));
    assert_ok(t->ops->wait(t->o, r, -1));
}

static void test_keys(void **state)
{
    (void)state;
    const dt_offload_ops_v1_t *ops = nvme_ops();
    assert_int_equal(ops->info.kind, DT_KIND_OFFLOAD);
    assert_string_equal(ops->info.name, "offload_nvme");
    assert_false(DT_HAS_OP(dt_offload_ops_t, ops, host_ptr));
    assert_true(DT_HAS_OP(dt_offload_ops_t, ops, cleanup_job));
    static const char *names[] = {"path", "capacity", "queue_depth", "buffers", "block_size",
                                  "direct"};
    assert_int_equal(ops->info.n_config_keys, 6);
    for (int i = 0; i < 6; i++) {
        assert_string_equal(ops->info.config_keys[i].name, names[i]);
        assert_true(strlen(ops->info.config_keys[i].doc) > 10);
    }
}

/* The files: made in a new folder, 0600, named with the job id and the
 * rank, sized to whole 4 KiB blocks; free removes one, finalize the rest
 * and the folder it made. */
static void test_files(void **state)
{
    (void)state;
    const char *dir = fresh_dir("files");
    tier_t t;
    tier_open(&t, dir, "auto");
    dt_offload_buf_t *a, *b;
    assert_ok(t.ops->alloc(t.o, 5000, DT_TAG_OPTIMIZER, &a));
    assert_ok(t.ops->alloc(t.o, 1, DT_TAG_PARAMS, &b));
    char p[1200];
    struct stat st;
    snprintf(p, sizeof p, "%s/dtrain-unitjob-r2-1.bin", dir);
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_size, 8192);
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    uint64_t total, used;
    assert_ok(t.ops->capacity(t.o, &total, &used));
    assert_int_equal(used, 8192 + 4096);
    assert_true(total > used);
    assert_int_equal(count_files(dir), 2);
    assert_ok(t.ops->free(t.o, a));
    assert_int_equal(stat(p, &st), -1);
    assert_int_equal(count_files(dir), 1);
    tier_close(&t);
    assert_int_equal(stat(dir, &st), -1); /* the folder it made is gone */
}

static void pieces(const char *direct)
{
    const char *dir = fresh_dir(direct);
    tier_t t;
    tier_open(&t, dir, direct);
    enum { N = 70001 }; /* 9 blocks of 8 KiB, the last partial */
    uint8_t *src = malloc(N), *back = calloc(N, 1), *dsrc, *dback;
    fill(src, N, 5);
    assert_ok(t.dops->alloc(t.dev, N, DT_TAG_PARAMS, (void **)&dsrc));
    assert_ok(t.dops->alloc(t.dev, N, DT_TAG_PARAMS, (void **)&dback));
    memcpy(dsrc, src, N);
    dt_offload_buf_t *b;
    assert_ok(t.ops->alloc(t.o, N, DT_TAG_OPTIMIZER, &b));
    /* odd pieces, inside one block, across blocks, ending mid-block,
     * alternately from host and device memory */
    uint64_t cuts[] = {0, 1, 100, 4095, 4097, 8192, 8193, 30000, 49152, 69999, N};
    for (int i = 0; i + 1 < (int)(sizeof cuts / sizeof cuts[0]); i++) {
        uint64_t off = cuts[i], n = cuts[i + 1] - cuts[i];
        store_wait(&t, b, off, (i % 2 ? dsrc : src) + off, n, i % 2 ? DT_MEM_DEVICE : DT_MEM_HOST);
    }
    load_wait(&t, b, 0, back, N, DT_MEM_HOST);
    assert_memory_equal(back, src, N);
    /* other pieces back, into device memory */
    for (uint64_t off = 0; off < N; off += 12345) {
        uint64_t n = off + 12345 <= N ? 12345 : N - off;
        load_wait(&t, b, off, dback + off, n, DT_MEM_DEVICE);
    }
    assert_memory_equal(dback, src, N);
    /* overwrite a middle piece: its neighbours keep their bytes */
    uint8_t mid[300];
    memset(mid, 0xee, sizeof mid);
    store_wait(&t, b, 8000, mid, sizeof mid, DT_MEM_HOST);
    memset(back, 0, N);
    load_wait(&t, b, 7000, back, 2000, DT_MEM_HOST);
    assert_memory_equal(back, src + 7000, 1000);
    assert_memory_equal(back + 1000, mid, 300);
    assert_memory_equal(back + 1300, src + 8300, 700);
    dt_offload_req_t *r;
    assert_status(t.ops->store(t.o, b, N - 1, src, 2, DT_MEM_HOST, NULL, &r), DT_ERR_INVALID);
    assert_msg_has("store: bytes [70000, +2) are outside file '");
    assert_ok(t.dops->free(t.dev, dsrc));
    assert_ok(t.dops->free(t.dev, dback));
    free(src);
    free(back);
    tier_close(&t);
}

static void test_pieces_direct(void **state) { (void)state; pieces("auto"); }
static void test_pieces_buffered(void **state) { (void)state; pieces("off"); }

/* 96 requests queued before any wait, in 3 files, waited newest first;
 * then loads of 40 KiB each (5 blocks through 2 buffers). */
static void test_many_in_flight(void **state)
{
    (void)state;
    const char *dir = fresh_dir("many");
    tier_t t;
    tier_open(&t, dir, "auto");
    enum { NB = 3, NP = 32, P = 5000 };
    uint8_t *src = malloc(NB * NP * P), *back = calloc(NB * NP * P, 1);
    fill(src, NB * NP * P, 11);
    dt_offload_buf_t *b[NB];
    dt_offload_req_t *r[NB * NP];
    for (int i = 0; i < NB; i++)
        assert_ok(t.ops->alloc(t.o, NP * P, DT_TAG_OPTIMIZER, &b[i]));
    for (int i = 0; i < NB * NP; i++)
        assert_ok(t.ops->store(t.o, b[i % NB], (uint64_t)(i / NB) * P, src + (size_t)i * P, P,
                               DT_MEM_HOST, NULL, &r[i]));
    for (int i = NB * NP - 1; i >= 0; i--)
        assert_ok(t.ops->wait(t.o, r[i], -1));
    for (int i = 0; i < NB; i++)
        assert_ok(t.ops->load(t.o, b[i], 0, back + (size_t)i * NP * P, NP * P, DT_MEM_HOST, NULL,
                              &r[i]));
    for (int i = 0; i < NB; i++)
        assert_ok(t.ops->wait(t.o, r[i], -1));
    for (int i = 0; i < NB * NP; i++)
        assert_memory_equal(back + (size_t)(i % NB) * NP * P + (size_t)(i / NB) * P,
                            src + (size_t)i * P, P);
    free(src);
    free(back);
    tier_close(&t);
    assert_int_equal(count_files(dir), -1);
}

static void test_capacity_and_free_space(void **state)
{
    (void)state;
    const char *dir = fresh_dir("cap");
    tier_t t;
    assert_ok(tier_open_rc(&t, dir, "auto", "capacity", "12288"));
    dt_offload_buf_t *a, *b = (dt_offload_buf_t *)1;
    assert_ok(t.ops->alloc(t.o, 4097, DT_TAG_OPTIMIZER, &a)); /* 8192 on disk */
    assert_status(t.ops->alloc(t.o, 4097, DT_TAG_PARAMS, &b), DT_ERR_NOMEM);
    assert_null(b);
    assert_msg("offload/offload_nvme: rank 2: alloc: 8192 bytes for params would bring the tier "
               "to 16384 bytes, over [offload_nvme] capacity = 12288 (in use: 8192 bytes in 1 "
               "files)");
    uint64_t total, used;
    assert_ok(t.ops->capacity(t.o, &total, &used));
    assert_int_equal(total, 12288);
    assert_int_equal(used, 8192);
    tier_close(&t);

    /* more than the file system has: named before a byte is written */
    tier_open(&t, fresh_dir("free"), "auto");
    assert_status(t.ops->alloc(t.o, 1ull << 60, DT_TAG_OPTIMIZER, &b), DT_ERR_NOMEM);
    char want[1500];
    snprintf(want, sizeof want, "offload/offload_nvme: rank 2: alloc: '%s/dtrain-unitjob-r2-1.bin' "
             "needs 1152921504606846976 bytes for optimizer, but its file system has ", g_dir);
    assert_msg_starts(want);
    assert_msg_has(" bytes free");
    assert_int_equal(count_files(g_dir), 0);
    tier_close(&t);
}

static void test_config_errors(void **state)
{
    (void)state;
    tier_t t;
    assert_status(tier_open_rc(&t, fresh_dir("cfg"), "auto", "block_size", "10000"),
                  DT_ERR_CONFIG);
    assert_msg("offload/offload_nvme: block_size = 10000 is not a multiple of 4096 (O_DIRECT's "
               "alignment)");
    t.dops->finalize(t.dev);
    assert_status(tier_open_rc(&t, fresh_dir("cfg"), "auto", "queue_depth", "1"), DT_ERR_CONFIG);
    assert_msg("offload/offload_nvme: buffers = 2: at most 64 and at most queue_depth (1)");
    t.dops->finalize(t.dev);
    /* a job id that could not name a file */
    dt_test_host_t th;
    dt_test_host_init(&th, "offload/offload_nvme", NULL);
    dt_offload_init_v1_t oa = {
        .struct_size = sizeof oa, .job_id = "../x", .dev = (dt_device_t *)&th};
    dt_offload_t *o = NULL;
    assert_status(nvme_ops()->init(&th.host, &oa, &o), DT_ERR_INVALID);
    assert_msg("offload/offload_nvme: init: job id '../x' cannot name files (letters, digits, "
               "'-', '_', '.')");
}

/* A file deleted or truncated under the tier: the next transfer fails,
 * naming the operation and the file; wait adds the rank. */
static void test_file_faults(void **state)
{
    (void)state;
    const char *dir = fresh_dir("faults");
    tier_t t;
    tier_open(&t, dir, "auto");
    dt_offload_buf_t *a, *b;
    assert_ok(t.ops->alloc(t.o, 8192, DT_TAG_OPTIMIZER, &a));
    assert_ok(t.ops->alloc(t.o, 8192, DT_TAG_OPTIMIZER, &b));
    uint8_t buf[100] = {1};
    char p[1200], want[1500];
    snprintf(p, sizeof p, "%s/dtrain-unitjob-r2-1.bin", dir);
    assert_int_equal(unlink(p), 0);
    dt_offload_req_t *r;
    assert_ok(t.ops->store(t.o, a, 0, buf, sizeof buf, DT_MEM_HOST, NULL, &r));
    assert_status(t.ops->wait(t.o, r, -1), DT_ERR_IO);
    snprintf(want, sizeof want, "offload/offload_nvme: rank 2: store of 100 bytes at offset 0 of "
             "'%s': the file was deleted under the running job", p);
    assert_msg(want);
    snprintf(p, sizeof p, "%s/dtrain-unitjob-r2-2.bin", dir);
    assert_int_equal(truncate(p, 4096), 0);
    assert_ok(t.ops->load(t.o, b, 10, buf, sizeof buf, DT_MEM_HOST, NULL, &r));
    assert_status(t.ops->wait(t.o, r, -1), DT_ERR_IO);
    snprintf(want, sizeof want, "offload/offload_nvme: rank 2: load of 100 bytes at offset 10 of "
             "'%s': the file was truncated to 4096 bytes (8192 expected)", p);
    assert_msg(want);
    tier_close(&t);
    assert_int_equal(count_files(dir), -1);
}

/* The descriptor the plugin holds for `path` (found through /proc), or -1. */
static int fd_of(const char *path)
{
    DIR *d = opendir("/proc/self/fd");
    int found = -1;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char link[300], target[1200];
        snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(link, target, sizeof target - 1);
        if (n > 0) {
            target[n] = 0;
            if (strcmp(target, path) == 0)
                found = atoi(e->d_name);
        }
    }
    if (d)
        closedir(d);
    return found;
}

/* A read error (the file's descriptor swapped for a write-only one, so
 * every read fails with EBADF): the load fails naming the file and the
 * errno, and the next request still runs. */
static void test_read_error(void **state)
{
    (void)state;
    const char *dir = fresh_dir("readerr");
    tier_t t;
    tier_open(&t, dir, "off");
    dt_offload_buf_t *b;
    assert_ok(t.ops->alloc(t.o, 20000, DT_TAG_OPTIMIZER, &b));
    uint8_t buf[20000];
    fill(buf, sizeof buf, 9);
    store_wait(&t, b, 0, buf, sizeof buf, DT_MEM_HOST);
    char p[1200], want[1500];
    snprintf(p, sizeof p, "%s/dtrain-unitjob-r2-1.bin", dir);
    int fd = fd_of(p);
    assert_true(fd >= 0);
    int wo = open(p, O_WRONLY);
    assert_true(wo >= 0);
    int saved = dup(fd);
    assert_int_equal(dup2(wo, fd), fd);
    dt_offload_req_t *r;
    assert_ok(t.ops->load(t.o, b, 100, buf, 9000, DT_MEM_HOST, NULL, &r));
    assert_status(t.ops->wait(t.o, r, -1), DT_ERR_IO);
    /* (two reads in flight: either may complete first) */
    snprintf(want, sizeof want, "offload/offload_nvme: rank 2: load of 9000 bytes at offset 100 "
             "of '%s': read at byte ", p);
    assert_msg_starts(want);
    assert_msg_has(": Bad file descriptor");
    /* the descriptor back: the tier goes on */
    assert_int_equal(dup2(saved, fd), fd);
    close(saved);
    close(wo);
    uint8_t back[9000];
    load_wait(&t, b, 100, back, sizeof back, DT_MEM_HOST);
    fill(buf, sizeof buf, 9);
    assert_memory_equal(back, buf + 100, sizeof back);
    tier_close(&t);
}

/* cleanup_job removes a job's files (regular, ours, its exact names) and
 * nothing else. */
static void test_cleanup_job(void **state)
{
    (void)state;
    const char *dir = fresh_dir("cleanup");
    assert_int_equal(mkdir(dir, 0700), 0);
    static const char *mine[] = {"dtrain-jobX-r0-1.bin", "dtrain-jobX-r12-7.bin",
                                 "dtrain-jobX-r1-probe.bin"};
    static const char *others[] = {"dtrain-jobY-r0-1.bin", "dtrain-jobX-r0-1.bin.keep",
                                   "dtrain-jobXY-r0-1.bin", "notes.txt"};
    char p[1200];
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, mine[i]);
        FILE *f = fopen(p, "w");
        assert_non_null(f);
        fclose(f);
    }
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, others[i]);
        FILE *f = fopen(p, "w");
        assert_non_null(f);
        fclose(f);
    }
    /* a link under a job file's name is not followed nor removed */
    snprintf(p, sizeof p, "%s/dtrain-jobX-r3-3.bin", dir);
    assert_int_equal(symlink("notes.txt", p), 0);
    dt_test_kv_t kv[] = {{"path", dir}, {NULL, NULL}};
    dt_test_host_t th;
    dt_test_host_init(&th, "offload/offload_nvme", kv);
    assert_ok(nvme_ops()->cleanup_job(&th.host, "jobX"));
    assert_int_equal(count_files(dir), 5);
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, others[i]);
        assert_int_equal(access(p, F_OK), 0);
    }
    assert_status(nvme_ops()->cleanup_job(&th.host, "a/b"), DT_ERR_INVALID);
    assert_msg("offload/offload_nvme: cleanup_job: job id 'a/b' is not a plain name");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* ---- the fake device (tests/support/fake_device.h): copies block until
 * released ---- */

static void test_wait_timeout(void **state)
{
    (void)state;
    dt_test_deadline(60, "offload_nvme wait timeout");
    const char *dir = fresh_dir("timeout");
    dt_test_kv_t kv[] = {{"path", dir}, {NULL, NULL}};
    dt_test_host_t th;
    dt_test_host_init(&th, "offload/offload_nvme", kv);
    dt_offload_init_v1_t oa = {.struct_size = sizeof oa, .rank = 5, .job_id = "tj",
                               .timeout_ms = 5000,
                               .dev = dt_fake_device_instance()};
    dt_offload_t *o = NULL;
    const dt_offload_ops_v1_t *ops = nvme_ops();
    assert_ok(ops->init(&th.host, &oa, &o));
    dt_offload_buf_t *b;
    assert_ok(ops->alloc(o, 4096, DT_TAG_OPTIMIZER, &b));
    uint8_t src[4096];
    fill(src, sizeof src, 2);
    dt_offload_req_t *r, *r2;
    assert_ok(ops->store(o, b, 0, src, sizeof src, DT_MEM_DEVICE, NULL, &r));
    assert_status(ops->wait(o, r, 50), DT_ERR_TIMEOUT);
    assert_msg_has("rank 5: wait: store of 4096 bytes at offset 0 of file '");
    assert_msg_has("' (4096 bytes of optimizer) not done after 50 ms");
    dt_fake_device_release(1);
    uint8_t back[4096];
    assert_ok(ops->load(o, b, 0, back, sizeof back, DT_MEM_HOST, NULL, &r2));
    assert_ok(ops->wait(o, r2, -1));
    assert_memory_equal(back, src, sizeof src);
    ops->finalize(o);
    assert_int_equal(count_files(dir), -1);
    dt_test_deadline(0, NULL);
}

/* ---- requests in flight together: the worker held by a blocker ---- */

static char g_log[4096];

/* The host's log, kept for the test to read (every level). */
static void capture_log(const dt_host_v1_t *h, int level, const char *fmt, ...)
{
    (void)h; (void)level;
    size_t n = strlen(g_log);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_log + n, sizeof g_log - n, fmt, ap);
    va_end(ap);
    n = strlen(g_log);
    if (n + 1 < sizeof g_log) {
        g_log[n] = '\n';
        g_log[n + 1] = 0;
    }
}


/* A tier over the fake device (rank 5, 8 KiB blocks, 4 buffers), its
 * worker held in the device copy of a first store (into *blocker) until
 * dt_fake_device_release(1): what the test queues meanwhile is all queued when
 * the worker looks. */
static dt_offload_t *held_tier(dt_test_host_t *th, dt_test_kv_t *kv, const char *dir,
                               dt_offload_buf_t **blocker, dt_offload_req_t **breq)
{
    static uint8_t src[4096];
    kv[0] = (dt_test_kv_t){"path", dir};
    kv[1] = (dt_test_kv_t){"block_size", "8192"};
    kv[2] = (dt_test_kv_t){"buffers", "4"};
    kv[3] = (dt_test_kv_t){"queue_depth", "8"};
    kv[4] = (dt_test_kv_t){NULL, NULL};
    dt_test_host_init(th, "offload/offload_nvme", kv);
    th->host.log = capture_log;
    g_log[0] = 0;
    dt_fake_device_release(0);
    dt_offload_init_v1_t oa = {.struct_size = sizeof oa, .rank = 5, .job_id = "held",
                               .timeout_ms = 10000,
                               .dev = dt_fake_device_instance()};
    dt_offload_t *o = NULL;
    assert_ok(nvme_ops()->init(&th->host, &oa, &o));
    assert_ok(nvme_ops()->alloc(o, sizeof src, DT_TAG_OPTIMIZER, blocker));
    assert_ok(nvme_ops()->store(o, *blocker, 0, src, sizeof src, DT_MEM_DEVICE, NULL, breq));
    return o;
}

/* Requests of one block each, queued together, keep every bounce buffer
 * busy: 4 I/Os in flight at once (the tier used to run them one at a
 * time), and the bytes land where they belong (aligned host memory, read
 * and written in place). */
static void test_ring_stays_full(void **state)
{
    (void)state;
    dt_test_deadline(60, "offload_nvme ring stays full");
    const dt_offload_ops_v1_t *ops = nvme_ops();
    dt_test_host_t th;
    dt_test_kv_t kv[5];
    dt_offload_buf_t *blocker, *b;
    dt_offload_req_t *br, *r[16];
    dt_offload_t *o = held_tier(&th, kv, fresh_dir("full"), &blocker, &br);
    enum { NR = 16, BS = 8192 };
    /* 4 KiB-aligned host memory: the I/Os read and write it in place */
    uint8_t *src = aligned_alloc(4096, NR * BS), *back = aligned_alloc(4096, NR * BS);
    fill(src, NR * BS, 21);
    memset(back, 0, NR * BS);
    assert_ok(ops->alloc(o, NR * BS, DT_TAG_PARAMS, &b));
    for (int i = 0; i < NR; i++)
        assert_ok(ops->store(o, b, (uint64_t)i * BS, src + (size_t)i * BS, BS, DT_MEM_HOST, NULL,
                             &r[i]));
    dt_fake_device_release(1);
    assert_ok(ops->wait(o, br, -1));
    for (int i = 0; i < NR; i++)
        assert_ok(ops->wait(o, r[i], -1));
    assert_ok(ops->load(o, b, 0, back, NR * BS, DT_MEM_HOST, NULL, &r[0]));
    assert_ok(ops->wait(o, r[0], -1));
    assert_memory_equal(back, src, NR * BS);
    ops->finalize(o);
    /* the blocker (device memory: through a bounce buffer, one 4 KiB
     * block), 16 stores and one load of 16 blocks, in place */
    if (!strstr(g_log, "rank 5: 18 requests in 33 I/Os (1 through the bounce buffers), 131072 "
                       "bytes read and 135168 written, at most 4 in flight at once\n"))
        fail_msg("no finalize line with 4 I/Os in flight in:\n%s", g_log);
    free(src);
    free(back);
    dt_test_deadline(0, NULL);
}

/* Stores and loads of overlapping bytes, all queued before the worker
 * looks and waited on only at the end: each load sees exactly the stores
 * queued before it (partial blocks included), whatever runs at once; a
 * wait that times out on one of them while the worker is held names it,
 * and its bytes still arrive. */
static void test_order_in_flight(void **state)
{
    (void)state;
    dt_test_deadline(60, "offload_nvme order in flight");
    const dt_offload_ops_v1_t *ops = nvme_ops();
    dt_test_host_t th;
    dt_test_kv_t kv[5];
    dt_offload_buf_t *blocker, *b;
    dt_offload_req_t *br, *r[7];
    const char *dir = fresh_dir("order");
    dt_offload_t *o = held_tier(&th, kv, dir, &blocker, &br);
    enum { N = 40000 }; /* 5 blocks of 8 KiB, the last partial */
    /* the sources 4 KiB-aligned (whole blocks written in place), the
     * loads' destinations not (through the bounce buffers) */
    uint8_t *x = aligned_alloc(4096, 40960), *y = aligned_alloc(4096, 40960);
    uint8_t *z = aligned_alloc(4096, 40960), *want = malloc(N);
    uint8_t *mem1 = calloc(N + 1, 1), *mem2 = calloc(N + 1, 1), *mem3 = calloc(N + 1, 1);
    uint8_t *back1 = mem1 + 1, *back2 = mem2 + 1, *back3 = mem3 + 1;
    fill(x, N, 1);
    fill(y, N, 2);
    fill(z, N, 3);
    assert_ok(ops->alloc(o, N, DT_TAG_OPTIMIZER, &b));
    assert_ok(ops->store(o, b, 0, x, N, DT_MEM_HOST, NULL, &r[0]));
    assert_ok(ops->load(o, b, 0, back1, N, DT_MEM_HOST, NULL, &r[1]));
    /* partial blocks at both ends, then one inside the last of them */
    assert_ok(ops->store(o, b, 5000, y + 5000, 15000, DT_MEM_HOST, NULL, &r[2]));
    assert_ok(ops->store(o, b, 20000, z + 20000, 1000, DT_MEM_HOST, NULL, &r[3]));
    assert_ok(ops->load(o, b, 0, back2, N, DT_MEM_HOST, NULL, &r[4]));
    assert_ok(ops->store(o, b, 0, z, N, DT_MEM_HOST, NULL, &r[5]));
    assert_ok(ops->load(o, b, 3000, back3 + 3000, 27000, DT_MEM_HOST, NULL, &r[6]));
    assert_status(ops->wait(o, r[6], 30), DT_ERR_TIMEOUT);
    char want_msg[1500];
    snprintf(want_msg, sizeof want_msg, "offload/offload_nvme: rank 5: wait: load of 27000 bytes "
             "at offset 3000 of file '%s/dtrain-held-r5-2.bin' (40000 bytes of optimizer) not "
             "done after 30 ms", dir);
    assert_msg(want_msg);
    dt_fake_device_release(1);
    assert_ok(ops->wait(o, br, -1));
    for (int i = 5; i >= 0; i--) /* newest first: any order works */
        assert_ok(ops->wait(o, r[i], -1));
    ops->finalize(o); /* waits for the load whose wait timed out */
    assert_memory_equal(back1, x, N);
    memcpy(want, x, N);
    memcpy(want + 5000, y + 5000, 15000);
    memcpy(want + 20000, z + 20000, 1000);
    assert_memory_equal(back2, want, N);
    assert_memory_equal(back3 + 3000, z + 3000, 27000);
    free(x);
    free(y);
    free(z);
    free(want);
    free(mem1);
    free(mem2);
    free(mem3);
    dt_test_deadline(0, NULL);
}

/* ---- a file system that refuses O_DIRECT (the test hook) ---- */

/* Whether the plugin's descriptor for `path` has O_DIRECT (fdinfo). */
static int opened_direct(const char *path)
{
    int fd = fd_of(path);
    assert_true(fd >= 0);
    char p[64], line[128];
    snprintf(p, sizeof p, "/proc/self/fdinfo/%d", fd);
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    unsigned flags = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "flags: %o", &flags) == 1;
    fclose(f);
    assert_true(found);
    return (flags & O_DIRECT) != 0;
}

/* A tier on the cpu device, rank 2 on local rank `local`, its log kept. */
static int direct_tier(tier_t *t, const char *dir, const char *direct, int local)
{
    t->kv[0] = (dt_test_kv_t){"path", dir};
    t->kv[1] = (dt_test_kv_t){"direct", direct};
    t->kv[2] = (dt_test_kv_t){NULL, NULL};
    t->dops = cpu_ops();
    t->ops = nvme_ops();
    dt_test_host_init(&t->dh, "device/cpu", NULL);
    dt_test_host_init(&t->oh, "offload/offload_nvme", t->kv);
    t->oh.host.log = capture_log;
    g_log[0] = 0;
    dt_device_init_v1_t da = {.struct_size = sizeof da, .local_size = 2, .device_index = -1};
    assert_ok(t->dops->init(&t->dh.host, &da, &t->dev));
    dt_offload_init_v1_t oa = {.struct_size = sizeof oa, .rank = 2, .local_rank = local,
                               .job_id = "dj", .timeout_ms = 10000,
                               .dev = t->dev};
    t->o = NULL;
    return t->ops->init(&t->oh.host, &oa, &t->o);
}

/* DTRAIN_FAULT_NO_ODIRECT=1 makes O_DIRECT opens fail with EINVAL (as
 * tmpfs before Linux 6.6): direct = "on" refuses to start naming the
 * folder; "auto" says so in one line on local rank 0 only, opens the
 * files without O_DIRECT, and moves the same bytes. */
static void test_direct_refused(void **state)
{
    (void)state;
    dt_test_require_hooks("DTRAIN_FAULT_NO_ODIRECT");
    char dir[1024], p[1200], want[1500];
    tier_t t;
    /* without the hook, this folder takes O_DIRECT (ext4, xfs, tmpfs of
     * Linux 6.6 on): its files are opened with it */
    snprintf(dir, sizeof dir, "%s", fresh_dir("direct"));
    assert_ok(direct_tier(&t, dir, "auto", 0));
    dt_offload_buf_t *b;
    assert_ok(t.ops->alloc(t.o, 10000, DT_TAG_OPTIMIZER, &b));
    snprintf(p, sizeof p, "%s/dtrain-dj-r2-1.bin", dir);
    int can = opened_direct(p);
    tier_close(&t);
    if (can)
        assert_null(strstr(g_log, "refuses O_DIRECT"));
    else /* this folder's file system refuses it anyway: the rest holds */
        print_message("note: '%s' refuses O_DIRECT without the hook\n", dir);

    setenv("DTRAIN_FAULT_NO_ODIRECT", "1", 1);
    assert_status(direct_tier(&t, dir, "on", 0), DT_ERR_CONFIG);
    snprintf(want, sizeof want, "offload/offload_nvme: rank 2: direct = \"on\", but '%s' refuses "
             "O_DIRECT (tmpfs?); use direct = \"auto\" or another path", dir);
    assert_msg(want);
    assert_int_equal(count_files(dir), -1); /* the probe and the folder it made are gone */
    t.dops->finalize(t.dev);

    assert_ok(direct_tier(&t, dir, "auto", 0));
    snprintf(want, sizeof want, "'%s' refuses O_DIRECT (tmpfs?): buffered I/O\n", dir);
    char *line = strstr(g_log, want);
    assert_non_null(line);
    assert_null(strstr(line + strlen(want), "refuses O_DIRECT")); /* one line */
    assert_ok(t.ops->alloc(t.o, 10000, DT_TAG_OPTIMIZER, &b));
    assert_false(opened_direct(p));
    uint8_t src[10000], back[10000];
    fill(src, sizeof src, 4);
    store_wait(&t, b, 0, src, sizeof src, DT_MEM_HOST);
    memset(back, 0, sizeof back);
    load_wait(&t, b, 0, back, sizeof back, DT_MEM_HOST);
    assert_memory_equal(back, src, sizeof src);
    tier_close(&t);

    assert_ok(direct_tier(&t, dir, "auto", 1)); /* local rank 1: silent */
    assert_null(strstr(g_log, "refuses O_DIRECT"));
    tier_close(&t);
    unsetenv("DTRAIN_FAULT_NO_ODIRECT");
}

/* ---- checksums ---- */

/* CRC-32C bit by bit, the obvious way: the reference the plugin's
 * (hardware or table) is held to. */
static uint32_t ref_crc32c(const void *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= ((const uint8_t *)p)[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    }
    return ~c;
}

/* Write `n` bytes at `off` of the tier's file `path` from outside, as a
 * neighbour (or a bad disk) would. */
static void scribble(const char *path, uint64_t off, const void *src, size_t n)
{
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, src, n, (off_t)off), (ssize_t)n);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

/* `op` of `n` bytes at `off` fails DT_ERR_DATA with the exact message:
 * block [at, at + 4096) of file `path` was written with `want`, reads
 * back as `got`. */
static void expect_mismatch(tier_t *t, dt_offload_buf_t *b, int store, uint64_t off,
                            void *mem, uint64_t n, const char *path, uint64_t at,
                            uint32_t want, uint32_t got)
{
    dt_offload_req_t *r;
    if (store)
        assert_ok(t->ops->store(t->o, b, off, mem, n, DT_MEM_HOST, NULL, &r));
    else
        assert_ok(t->ops->load(t->o, b, off, mem, n, DT_MEM_HOST, NULL, &r));
    assert_status(t->ops->wait(t->o, r, -1), DT_ERR_DATA);
    char msg[1800];
    snprintf(msg, sizeof msg, "offload/offload_nvme: rank 2: %s of %llu bytes at offset %llu of "
             "'%s': checksum mismatch in bytes [%llu, %llu) of the file: CRC-32C 0x%08x as "
             "written, 0x%08x as read (changed outside the tier)", store ? "store" : "load",
             (unsigned long long)n, (unsigned long long)off, path, (unsigned long long)at,
             (unsigned long long)(at + 4096), (unsigned)want, (unsigned)got);
    assert_msg(msg);
}

/* Bytes changed in a tier file between a store and a load are caught
 * where they are read, naming the file, the block and both checksums
 * (each checked against the reference): a load that touches the block,
 * a partial store into it (whose read-modify-write would otherwise write
 * them back under a fresh checksum), and a block never written (a zero
 * block's checksum); blocks around it still load, and the block loads
 * again once its bytes are put back.  `sw`: the table instead of the
 * hardware instruction (test hook), and stores made one way load the
 * other, so both give the same values. */
static void checksums(int sw)
{
    assert_int_equal(ref_crc32c("123456789", 9), 0xe3069283u); /* the check value */
    if (sw)
        dt_test_require_hooks("DTRAIN_FAULT_NO_CRC32C_HW");
    const char *dir = fresh_dir(sw ? "sum-sw" : "sum");
    tier_t t;
    tier_open(&t, dir, "auto");
    enum { N = 5 * 4096 + 100, NB = 40 * 4096 };
    uint8_t *src = malloc(NB), *back = calloc(NB, 1), junk[16];
    fill(src, NB, 3);
    memset(junk, 0x5a, sizeof junk);
    dt_offload_buf_t *b, *z, *big;
    assert_ok(t.ops->alloc(t.o, N, DT_TAG_OPTIMIZER, &b));
    assert_ok(t.ops->alloc(t.o, 3 * 4096, DT_TAG_OPTIMIZER, &z));
    assert_ok(t.ops->alloc(t.o, NB, DT_TAG_OPTIMIZER, &big));
    /* 40 blocks of bytes that are not zeros, stored one way, loaded the
     * other: the hardware and the table agree on every block */
    if (sw)
        setenv("DTRAIN_FAULT_NO_CRC32C_HW", "1", 1);
    store_wait(&t, big, 0, src, NB, DT_MEM_HOST);
    if (sw)
        unsetenv("DTRAIN_FAULT_NO_CRC32C_HW");
    load_wait(&t, big, 0, back, NB, DT_MEM_HOST);
    assert_memory_equal(back, src, NB);
    if (sw)
        setenv("DTRAIN_FAULT_NO_CRC32C_HW", "1", 1);

    store_wait(&t, b, 0, src, N, DT_MEM_HOST);
    load_wait(&t, b, 0, back, N, DT_MEM_HOST);
    assert_memory_equal(back, src, N);
    char p[1200];
    snprintf(p, sizeof p, "%s/dtrain-unitjob-r2-1.bin", dir);
    scribble(p, 9000, junk, sizeof junk); /* into block 2: bytes [8192, 12288) */
    uint8_t blk[4096];
    memcpy(blk, src + 8192, 4096);
    memcpy(blk + 9000 - 8192, junk, sizeof junk);
    uint32_t want = ref_crc32c(src + 8192, 4096), got = ref_crc32c(blk, 4096);
    expect_mismatch(&t, b, 0, 8500, back, 100, p, 8192, want, got);
    expect_mismatch(&t, b, 0, 0, back, N, p, 8192, want, got);
    /* the blocks around it load */
    memset(back, 0, N);
    load_wait(&t, b, 0, back, 8192, DT_MEM_HOST);
    load_wait(&t, b, 12288, back + 12288, N - 12288, DT_MEM_HOST);
    assert_memory_equal(back, src, 8192);
    assert_memory_equal(back + 12288, src + 12288, N - 12288);
    /* a store of part of the block reads it first: caught there, and the
     * block is not written back under a new checksum */
    expect_mismatch(&t, b, 1, 8200, src + 8200, 100, p, 8192, want, got);
    expect_mismatch(&t, b, 0, 8192, back, 4096, p, 8192, want, got);
    /* its bytes put back: it loads (the check is of what the file holds) */
    scribble(p, 9000, src + 9000, sizeof junk);
    load_wait(&t, b, 0, back, N, DT_MEM_HOST);
    assert_memory_equal(back, src, N);
    /* a block never written reads as the zeros it was reserved with */
    uint8_t zeros[4096] = {0};
    load_wait(&t, z, 0, back, 3 * 4096, DT_MEM_HOST);
    assert_memory_equal(back + 4096, zeros, sizeof zeros);
    snprintf(p, sizeof p, "%s/dtrain-unitjob-r2-2.bin", dir);
    scribble(p, 4096 + 7, junk, 1);
    memset(blk, 0, sizeof blk);
    blk[7] = junk[0];
    expect_mismatch(&t, z, 0, 4096, back, 10, p, 4096, ref_crc32c(zeros, 4096),
                    ref_crc32c(blk, 4096));
    unsetenv("DTRAIN_FAULT_NO_CRC32C_HW");
    free(src);
    free(back);
    tier_close(&t);
    assert_int_equal(count_files(dir), -1);
}

static void test_checksums(void **state) { (void)state; checksums(0); }
static void test_checksums_table(void **state) { (void)state; checksums(1); }

/* ---- the folder ---- */

static void mode_is(const char *path, unsigned mode)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 07777, mode);
}

/* A path whose folders are missing, several deep: each made 0700 and
 * registered with the core's signal cleanup (as an empty folder) while
 * it exists, as every file is (as a file) until it is freed; finalize
 * removes what it made, deepest first, but not a folder that holds
 * something else, nor one that was there before. */
static void test_nested_path(void **state)
{
    (void)state;
    char base[1024], dir[1200], p[1300];
    snprintf(base, sizeof base, "%s", fresh_dir("nested"));
    snprintf(dir, sizeof dir, "%s/a/b/tier", base);
    tier_t t;
    tier_open(&t, dir, "auto");
    const char *made[4] = {base, NULL, NULL, dir};
    char a[1100], ab[1100];
    snprintf(a, sizeof a, "%s/a", base);
    snprintf(ab, sizeof ab, "%s/a/b", base);
    made[1] = a, made[2] = ab;
    uint32_t flags = 99;
    for (int i = 0; i < 4; i++) {
        mode_is(made[i], 0700);
        assert_true(dt_test_host_cleanup_has(&t.oh, made[i], &flags));
        assert_int_equal(flags, DT_HOST_CLEANUP_EMPTY_DIR);
    }
    assert_int_equal(dt_test_host_cleanup_has(&t.oh, NULL, NULL), 4); /* the probe is gone */
    dt_offload_buf_t *x, *y;
    assert_ok(t.ops->alloc(t.o, 100, DT_TAG_OPTIMIZER, &x));
    assert_ok(t.ops->alloc(t.o, 100, DT_TAG_OPTIMIZER, &y));
    snprintf(p, sizeof p, "%s/dtrain-unitjob-r2-1.bin", dir);
    assert_true(dt_test_host_cleanup_has(&t.oh, p, &flags));
    assert_int_equal(flags, DT_HOST_CLEANUP_FILE);
    assert_ok(t.ops->free(t.o, x));
    assert_false(dt_test_host_cleanup_has(&t.oh, p, NULL));
    assert_int_equal(dt_test_host_cleanup_has(&t.oh, NULL, NULL), 5);
    tier_close(&t);
    assert_int_equal(dt_test_host_cleanup_has(&t.oh, NULL, NULL), 0);
    assert_int_equal(access(base, F_OK), -1); /* all four made, all four gone */

    /* base there before, something else in a/: base/a stays, base too */
    assert_int_equal(mkdir(base, 0755), 0);
    tier_open(&t, dir, "auto");
    snprintf(p, sizeof p, "%s/notes.txt", a);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fclose(f);
    tier_close(&t);
    assert_int_equal(access(ab, F_OK), -1);
    assert_int_equal(access(p, F_OK), 0);
    mode_is(base, 0755);
    /* a file on the way: named */
    snprintf(dir, sizeof dir, "%s/notes.txt/tier", a);
    assert_status(tier_open_rc(&t, dir, "auto", NULL, NULL), DT_ERR_CONFIG);
    char want[2600];
    snprintf(want, sizeof want, "offload/offload_nvme: path '%s': '%s' is not a folder", dir, p);
    assert_msg(want);
    t.dops->finalize(t.dev);
    /* a host table without the cleanup slots: the same tier, nothing asked */
    snprintf(dir, sizeof dir, "%s/c/tier", base);
    dt_test_host_init(&t.oh, "offload/offload_nvme", NULL); /* (tier_open_rc sets it again) */
    int k = 0;
    t.kv[k++] = (dt_test_kv_t){"path", dir};
    t.kv[k] = (dt_test_kv_t){NULL, NULL};
    t.dops = cpu_ops();
    t.ops = nvme_ops();
    dt_test_host_init(&t.dh, "device/cpu", NULL);
    dt_test_host_init(&t.oh, "offload/offload_nvme", t.kv);
    t.oh.host.struct_size = (uint32_t)offsetof(dt_host_v1_t, cleanup_add);
    dt_device_init_v1_t da = {.struct_size = sizeof da, .local_size = 1, .device_index = -1};
    assert_ok(t.dops->init(&t.dh.host, &da, &t.dev));
    dt_offload_init_v1_t oa = {.struct_size = sizeof oa, .rank = 2, .job_id = "unitjob",
                               .timeout_ms = 10000, .dev = t.dev};
    assert_ok(t.ops->init(&t.oh.host, &oa, &t.o));
    assert_ok(t.ops->alloc(t.o, 100, DT_TAG_OPTIMIZER, &x));
    uint8_t v[100] = {7}, w[100];
    store_wait(&t, x, 0, v, sizeof v, DT_MEM_HOST);
    load_wait(&t, x, 0, w, sizeof w, DT_MEM_HOST);
    assert_memory_equal(v, w, sizeof v);
    tier_close(&t);
    assert_int_equal(t.oh.cleanup_calls, 0);
    snprintf(p, sizeof p, "%s/c", base);
    assert_int_equal(access(p, F_OK), -1);
    snprintf(p, sizeof p, "rm -rf '%s'", base);
    assert_int_equal(system(p), 0);
}

/* A folder on the way another user could write, or another user's: the
 * tier does not start (DT_ERR_CONFIG), names the path, the folder (links
 * resolved) and why, and makes nothing in it; a sticky one (/tmp) is
 * fine; one writable by its group only is said once, on local rank 0. */
static void test_loose_folders(void **state)
{
    (void)state;
    char base[1024], real[1100], dir[1200], want[2600], link[1100];
    snprintf(base, sizeof base, "%s", fresh_dir("loose"));
    assert_int_equal(mkdir(base, 0700), 0);
    assert_non_null(realpath(base, real));
    snprintf(dir, sizeof dir, "%s/tier", base);
    tier_t t;
    static const struct {
        unsigned mode;
        const char *why;
    } cases[] = {
        {0777, "is writable by others (mode 0777) and not sticky: another user could remove or "
               "replace the tier's files; use a folder only you can write (or chmod o-w, or "
               "chmod +t)"},
        {0703, "is writable by others (mode 0703) and not sticky: another user could remove or "
               "replace the tier's files; use a folder only you can write (or chmod o-w, or "
               "chmod +t)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(chmod(base, cases[i].mode), 0);
        assert_status(tier_open_rc(&t, dir, "auto", NULL, NULL), DT_ERR_CONFIG);
        snprintf(want, sizeof want, "offload/offload_nvme: rank 2: path '%s': the folder '%s' %s",
                 dir, real, cases[i].why);
        assert_msg(want);
        assert_int_equal(access(dir, F_OK), -1); /* nothing made in it */
        t.dops->finalize(t.dev);
    }
    /* through a link: the folder it leads to is named */
    snprintf(link, sizeof link, "%s-link", base);
    unlink(link);
    assert_int_equal(symlink(base, link), 0);
    snprintf(dir, sizeof dir, "%s/tier", link);
    assert_status(tier_open_rc(&t, dir, "auto", NULL, NULL), DT_ERR_CONFIG);
    snprintf(want, sizeof want, "offload/offload_nvme: rank 2: path '%s': the folder '%s' %s",
             dir, real, cases[1].why);
    assert_msg(want);
    t.dops->finalize(t.dev);
    assert_int_equal(unlink(link), 0);
    snprintf(dir, sizeof dir, "%s/tier", base);
    /* sticky, as /tmp: fine, silent */
    assert_int_equal(chmod(base, 01777), 0);
    assert_ok(direct_tier(&t, dir, "auto", 0));
    assert_null(strstr(g_log, "writable"));
    tier_close(&t);
    /* its group may write: a warning on local rank 0 only */
    assert_int_equal(chmod(base, 0770), 0);
    assert_ok(direct_tier(&t, dir, "auto", 0));
    snprintf(want, sizeof want, "path '%s': the folder '%s' is writable by its group (mode 0770) "
             "and not sticky: another member could remove or replace the tier's files (chmod "
             "g-w, or chmod +t)\n", dir, real);
    char *line = strstr(g_log, want);
    assert_non_null(line);
    assert_null(strstr(line + strlen(want), "writable")); /* one line */
    tier_close(&t);
    assert_ok(direct_tier(&t, dir, "auto", 1));
    assert_null(strstr(g_log, "writable"));
    tier_close(&t);
    /* another user's folder (root can make one) */
    assert_int_equal(chmod(base, 0755), 0);
    if (geteuid() == 0) {
        assert_int_equal(chown(base, 65534, 65534), 0);
        assert_status(tier_open_rc(&t, dir, "auto", NULL, NULL), DT_ERR_CONFIG);
        snprintf(want, sizeof want, "offload/offload_nvme: rank 2: path '%s': the folder '%s' is "
                 "owned by uid 65534, not by this user (uid 0) or root: its owner could remove "
                 "or replace the tier's files; use a folder of your own", dir, real);
        assert_msg(want);
        assert_int_equal(access(dir, F_OK), -1);
        t.dops->finalize(t.dev);
    } else {
        print_message("note: not root: no folder of another user to try\n");
    }
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_pieces_direct),
        cmocka_unit_test(test_pieces_buffered),
        cmocka_unit_test(test_many_in_flight),
        cmocka_unit_test(test_capacity_and_free_space),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_file_faults),
        cmocka_unit_test(test_read_error),
        cmocka_unit_test(test_cleanup_job),
        cmocka_unit_test(test_wait_timeout),
        cmocka_unit_test(test_ring_stays_full),
        cmocka_unit_test(test_order_in_flight),
        cmocka_unit_test(test_direct_refused),
        cmocka_unit_test(test_checksums),
        cmocka_unit_test(test_checksums_table),
        cmocka_unit_test(test_nested_path),
        cmocka_unit_test(test_loose_folders),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
