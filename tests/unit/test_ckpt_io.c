/*
 * tests/unit/test_ckpt_io.c - atomic file writes (fileutil) and sharded
 * checkpoints: a save by 3 "ranks" holding odd-sized ranges read back by
 * arbitrary ranges; corruption, missing marker, missing or truncated
 * shards, inconsistent manifests and tensor tables, a manifest edited
 * after the save, links and FIFOs where files should be give messages
 * naming the file and the entry; a disk that fills up (or fails fsync) at
 * any point leaves the previous checkpoint loadable and no temp directory
 * behind; links planted by someone else are never written or deleted
 * through.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dtrain/tensor.h"
#include "ckpt/ckpt_io.h"
#include "ckpt/ckpt_tools.h"
#include "util/fileutil.h"
#include "util/error.h"
#include "test_assert.h"
#include "test_hooks.h"
#include "safetensors_read.h"

static char g_dir[256];

static int setup(void **state)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/dt_test_ckpt.XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    dt_fileutil_test_fail_after(-1);
    dt_fileutil_test_fail_fsync_after(-1);
    return dt_fileutil_rm_rf(g_dir);
}

/* A fresh folder under g_dir for one test. */
static void subdir(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
    assert_int_equal(dt_fileutil_rm_rf(buf), DT_OK);
    assert_int_equal(dt_fileutil_mkdir_p(buf), DT_OK);
}

/* ---- fileutil -------------------------------------------------------- */

static void test_crc32(void **state)
{
    /* The CRC-32 check value (zlib, gzip, Python's zlib.crc32). */
    assert_int_equal(dt_fileutil_crc32(0, "123456789", 9), 0xCBF43926u);
    uint32_t c = dt_fileutil_crc32(0, "1234", 4);
    assert_int_equal(dt_fileutil_crc32(c, "56789", 5), 0xCBF43926u);
    assert_int_equal(dt_fileutil_crc32(0, "", 0), 0);
}

static void test_mkdir_rm(void **state)
{
    char p[512], f[600];
    snprintf(p, sizeof p, "%s/a/b/c/", g_dir);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK); /* exists: fine */
    snprintf(f, sizeof f, "%s/a/b/file", g_dir);
    assert_int_equal(dt_fileutil_write_atomic(f, "x", 1), DT_OK);
    snprintf(p, sizeof p, "%s/a/b/file/sub", g_dir);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_ERR_IO);
    assert_msg_has("Not a directory");
    snprintf(p, sizeof p, "%s/a", g_dir);
    assert_int_equal(dt_fileutil_rm_rf(p), DT_OK);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(dt_fileutil_rm_rf(p), DT_OK); /* missing: fine */
}

static void test_atomic_write(void **state)
{
    char p[512];
    snprintf(p, sizeof p, "%s/atomic.txt", g_dir);
    assert_int_equal(dt_fileutil_write_atomic(p, "old", 3), DT_OK);
    char *buf;
    size_t n;
    assert_int_equal(dt_fileutil_read_all(p, &buf, &n), DT_OK);
    assert_int_equal(n, 3);
    assert_string_equal(buf, "old");
    free(buf);

    /* Streamed: small writes coalesced, big ones passed through, mixed. */
    size_t big = (3u << 20) + 7;
    unsigned char *data = malloc(big);
    for (size_t i = 0; i < big; i++)
        data[i] = (unsigned char)(i * 131 + 7);
    dt_afile_t *f;
    assert_int_equal(dt_afile_open(p, &f), DT_OK);
    size_t at = 0, pieces[] = {1, 10, 700000, 2, 2000000, 13};
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(dt_afile_write(f, data + at, pieces[i]), DT_OK);
        at += pieces[i];
    }
    assert_int_equal(dt_afile_write(f, data + at, big - at), DT_OK);
    assert_int_equal(dt_afile_offset(f), big);
    /* Not visible before commit. */
    assert_int_equal(dt_fileutil_read_all(p, &buf, &n), DT_OK);
    assert_int_equal(n, 3);
    free(buf);
    assert_int_equal(dt_afile_commit(f), DT_OK);
    assert_int_equal(dt_fileutil_read_all(p, &buf, &n), DT_OK);
    assert_int_equal(n, big);
    assert_memory_equal(buf, data, big);
    free(buf);

    /* Abort leaves the previous file. */
    assert_int_equal(dt_afile_open(p, &f), DT_OK);
    assert_int_equal(dt_afile_write(f, "zzz", 3), DT_OK);
    dt_afile_abort(f);
    assert_int_equal(dt_fileutil_read_all(p, &buf, &n), DT_OK);
    assert_int_equal(n, big);
    free(buf);
    free(data);

    char missing[600];
    snprintf(missing, sizeof missing, "%s/no/such/dir/x", g_dir);
    assert_int_equal(dt_fileutil_write_atomic(missing, "x", 1), DT_ERR_IO);
    char want[1400];
    snprintf(want, sizeof want, "writing '%s': the folder '%s/no/such/dir' does not exist",
             missing, g_dir);
    assert_msg(want);
}

static void test_atomic_write_enospc(void **state)
{
    char dir[512], p[600], want[700];
    subdir(dir, sizeof dir, "enospc");
    snprintf(p, sizeof p, "%s/f.bin", dir);
    snprintf(want, sizeof want, "writing '%s': No space left on device", p);
    assert_int_equal(dt_fileutil_write_atomic(p, "previous", 8), DT_OK);
    size_t big = 3u << 20;
    char *data = calloc(1, big);
    /* Small write failing at the commit's flush; big write failing in
     * write(2) itself; failing at the very first byte. */
    size_t sizes[] = {1000, big, big};
    int64_t budgets[] = {500, (int64_t)big / 2, 0};
    for (int i = 0; i < 3; i++) {
        dt_fileutil_test_fail_after(budgets[i]);
        assert_int_equal(dt_fileutil_write_atomic(p, data, sizes[i]), DT_ERR_IO);
        dt_fileutil_test_fail_after(-1);
        assert_msg_has(want);
        dt_test_assert_no_tmp(dir);
        char *buf;
        size_t n;
        assert_int_equal(dt_fileutil_read_all(p, &buf, &n), DT_OK);
        assert_int_equal(n, 8);
        assert_memory_equal(buf, "previous", 8);
        free(buf);
    }
    /* fsync failing (first fsync: the file's own) */
    dt_fileutil_test_fail_fsync_after(0);
    assert_int_equal(dt_fileutil_write_atomic(p, data, 100), DT_ERR_IO);
    dt_fileutil_test_fail_fsync_after(-1);
    snprintf(want, sizeof want, "writing '%s': fsync: No space left on device",
             p);
    assert_msg_has(want);
    dt_test_assert_no_tmp(dir);
    free(data);
}

/* Links another user planted where a writer might put its temp file (the
 * old "<path>.tmp.<pid>", other guessable names) or at the target itself
 * are never written through: what they point to is untouched (or never
 * created), and the target comes out a regular file of ours, of mode 0666
 * less the umask; a link at the target itself is refused, not replaced. */
static void test_atomic_write_planted_links(void **state)
{
    char dir[512], victim[600], out[600], absent[600];
    subdir(dir, sizeof dir, "planted");
    snprintf(victim, sizeof victim, "%s/victim", dir);
    snprintf(out, sizeof out, "%s/out.bin", dir);
    snprintf(absent, sizeof absent, "%s/created-through-a-link", dir);
    assert_int_equal(dt_fileutil_write_atomic(victim, "victim's bytes", 14), DT_OK);
    /* round 0: the links point at the victim; round 1: nowhere (a dangling
     * link would make O_CREAT create its target) */
    for (int round = 0; round < 2; round++) {
        const char *to = round == 0 ? victim : absent;
        char links[5][700];
        snprintf(links[0], sizeof links[0], "%s.tmp.%ld", out, (long)getpid());
        snprintf(links[1], sizeof links[1], "%s.tmp.%ld", out, (long)getpid() + 1);
        snprintf(links[2], sizeof links[2], "%s.tmp", out);
        snprintf(links[3], sizeof links[3], "%s.tmp.0", out);
        snprintf(links[4], sizeof links[4], "%s/.out.bin.tmp", dir);
        for (int i = 0; i < 5; i++) {
            unlink(links[i]);
            assert_int_equal(symlink(to, links[i]), 0);
        }
        assert_int_equal(dt_fileutil_write_atomic(out, "fresh", 5), DT_OK);
        dt_afile_t *f; /* a streamed write that is aborted */
        assert_int_equal(dt_afile_open(out, &f), DT_OK);
        assert_int_equal(dt_afile_write(f, "aborted", 7), DT_OK);
        dt_afile_abort(f);

        char *buf;
        size_t n;
        assert_int_equal(dt_fileutil_read_all(victim, &buf, &n), DT_OK);
        assert_int_equal(n, 14);
        assert_memory_equal(buf, "victim's bytes", 14);
        free(buf);
        assert_int_equal(access(absent, F_OK), -1);
        assert_int_equal(dt_fileutil_read_all(out, &buf, &n), DT_OK);
        assert_int_equal(n, 5);
        assert_memory_equal(buf, "fresh", 5);
        free(buf);
        struct stat st;
        assert_int_equal(lstat(out, &st), 0);
        assert_true(S_ISREG(st.st_mode));
        mode_t mask = umask(0);
        umask(mask);
        assert_int_equal(st.st_mode & 0777, 0666 & ~mask);
        for (int i = 0; i < 5; i++) {
            assert_int_equal(lstat(links[i], &st), 0);
            assert_true(S_ISLNK(st.st_mode));
        }
        /* nothing else appeared: victim, out.bin and the five links */
        DIR *d = opendir(dir);
        assert_non_null(d);
        int entries = 0;
        struct dirent *de;
        while ((de = readdir(d)))
            entries += de->d_name[0] != '.' || strcmp(de->d_name, ".out.bin.tmp") == 0;
        closedir(d);
        assert_int_equal(entries, 7);
    }
    /* A link at the target itself is neither written through nor
     * replaced: only a regular file is (test_atomic_write_not_regular). */
    assert_int_equal(unlink(out), 0);
    assert_int_equal(symlink(victim, out), 0);
    assert_int_equal(dt_fileutil_write_atomic(out, "fresh", 5), DT_ERR_IO);
    struct stat st;
    assert_int_equal(lstat(out, &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    char *buf;
    size_t n;
    assert_int_equal(dt_fileutil_read_all(victim, &buf, &n), DT_OK);
    assert_memory_equal(buf, "victim's bytes", 14);
    free(buf);
}

/* Make a Unix socket's file at `path` (closed: the file stays). */
static void make_socket_file(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    assert_true(strlen(path) < sizeof a.sun_path);
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    close(fd);
}

/* Things that are not regular files, made in folder `dir`: a FIFO, a
 * socket, a folder, a link to a device and a link to a regular file, and
 * (as root, who may) a character device node of the null device; their
 * paths in p[], what each is in kind[] as messages word it.  Returns how
 * many. */
static int make_not_regular(const char *dir, char p[][600], const char **kind)
{
    int n = 0;
    snprintf(p[n], 600, "%s/fifo", dir);
    assert_int_equal(mkfifo(p[n], 0600), 0);
    kind[n++] = "a FIFO";
    snprintf(p[n], 600, "%s/sock", dir);
    make_socket_file(p[n]);
    kind[n++] = "a socket";
    snprintf(p[n], 600, "%s/folder", dir);
    assert_int_equal(mkdir(p[n], 0700), 0);
    kind[n++] = "a directory";
    snprintf(p[n], 600, "%s/devlink", dir);
    assert_int_equal(symlink("/dev/null", p[n]), 0);
    kind[n++] = "a symbolic link";
    char victim[600];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    assert_ok(dt_fileutil_write_atomic(victim, "victim", 6));
    snprintf(p[n], 600, "%s/filelink", dir);
    assert_int_equal(symlink(victim, p[n]), 0);
    kind[n++] = "a symbolic link";
    if (geteuid() == 0) { /* /dev/null's own numbers, in our folder */
        snprintf(p[n], 600, "%s/chardev", dir);
        assert_int_equal(mknod(p[n], S_IFCHR | 0600, makedev(1, 3)), 0);
        kind[n++] = "a character device";
    }
    return n;
}

/* lstat's type and, for a link, where it points: what must not change. */
static void describe(const char *path, char *out, size_t cap)
{
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    char to[600] = "";
    if (S_ISLNK(st.st_mode)) {
        ssize_t n = readlink(path, to, sizeof to - 1);
        assert_true(n > 0);
        to[n] = '\0';
    }
    snprintf(out, cap, "%o %s", (unsigned)(st.st_mode & S_IFMT), to);
}

/* Only a regular file (or nothing) is replaced: a FIFO, a socket, a
 * folder, a link (to a device or to a file) or a device at the target is
 * an error naming it and what it is, checked when the write starts (no
 * temp file is made) and again at commit (one that appeared meanwhile),
 * and it is left exactly as it was. */
static void test_atomic_write_not_regular(void **state)
{
    char dir[512], p[8][600], want[6000], before[700], after[700];
    const char *kind[8];
    subdir(dir, sizeof dir, "notreg");
    int n = make_not_regular(dir, p, kind);
    for (int i = 0; i < n; i++) {
        describe(p[i], before, sizeof before);
        snprintf(want, sizeof want, "writing '%s': not a regular file (%s): only a regular "
                 "file is replaced", p[i], kind[i]);
        assert_status(dt_fileutil_write_atomic(p[i], "new", 3), DT_ERR_IO);
        assert_msg(want);
        dt_afile_t *f = NULL; /* refused at open, before any byte */
        assert_status(dt_afile_open(p[i], &f), DT_ERR_IO);
        assert_null(f);
        assert_msg(want);
        int exists = -1;
        assert_status(dt_fileutil_check_output(p[i], &exists), DT_ERR_IO);
        assert_msg(want);
        describe(p[i], after, sizeof after);
        assert_string_equal(before, after);
        dt_test_assert_no_tmp(dir);
    }
    char *buf;
    size_t len;
    snprintf(want, sizeof want, "%s/victim", dir);
    assert_ok(dt_fileutil_read_all(want, &buf, &len));
    assert_memory_equal(buf, "victim", 6);
    free(buf);

    /* nothing at open; a FIFO there by commit: refused all the same */
    char late[600];
    snprintf(late, sizeof late, "%s/late", dir);
    dt_afile_t *f;
    assert_ok(dt_afile_open(late, &f));
    assert_ok(dt_afile_write(f, "late", 4));
    assert_int_equal(mkfifo(late, 0600), 0);
    assert_status(dt_afile_commit(f), DT_ERR_IO);
    snprintf(want, sizeof want, "writing '%s': not a regular file (a FIFO): only a regular "
             "file is replaced", late);
    assert_msg(want);
    struct stat st;
    assert_int_equal(lstat(late, &st), 0);
    assert_true(S_ISFIFO(st.st_mode));
    dt_test_assert_no_tmp(dir);

    /* a regular file, and nothing, are fine */
    int exists = -1;
    snprintf(want, sizeof want, "%s/victim", dir);
    assert_ok(dt_fileutil_check_output(want, &exists));
    assert_int_equal(exists, 1);
    assert_ok(dt_fileutil_write_atomic(want, "replaced", 8));
    snprintf(want, sizeof want, "%s/absent", dir);
    assert_ok(dt_fileutil_check_output(want, &exists));
    assert_int_equal(exists, 0);
}

/* Files and folders follow the umask as any program's do (0666 and 0777
 * less it): atomic writes, files opened in place, mkdir -p. */
static void test_output_modes(void **state)
{
    char dir[512], p[600], d[600];
    subdir(dir, sizeof dir, "modes");
    static const mode_t masks[] = {022, 002, 027, 077};
    mode_t saved = umask(0);
    for (size_t i = 0; i < sizeof masks / sizeof masks[0]; i++) {
        umask(masks[i]);
        struct stat st;
        snprintf(p, sizeof p, "%s/atomic-%zu", dir, i);
        assert_ok(dt_fileutil_write_atomic(p, "x", 1));
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 07777, 0666 & ~masks[i]);
        /* replacing a file gives the new file the umask's mode too */
        assert_int_equal(chmod(p, 0600), 0);
        assert_ok(dt_fileutil_write_atomic(p, "y", 1));
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 07777, 0666 & ~masks[i]);
        snprintf(p, sizeof p, "%s/inplace-%zu", dir, i);
        int fd;
        assert_ok(dt_fileutil_open_output(p, 0, "in place", &fd));
        close(fd);
        assert_int_equal(stat(p, &st), 0);
        assert_int_equal(st.st_mode & 07777, 0666 & ~masks[i]);
        snprintf(d, sizeof d, "%s/dir-%zu/a/b", dir, i);
        assert_ok(dt_fileutil_mkdir_p(d));
        for (int up = 0; up < 3; up++) {
            assert_int_equal(stat(d, &st), 0);
            assert_int_equal(st.st_mode & 07777, 0777 & ~masks[i]);
            *strrchr(d, '/') = '\0';
        }
    }
    umask(saved);
}

/* A file opened to be written in place (the metrics file): created, or
 * truncated, or appended to when it is a regular file; a FIFO (with or
 * without a reader: never a hang), a socket, a folder, a link or a device
 * is refused naming it, and left as it was. */
static void test_open_output(void **state)
{
    char dir[512], p[8][600], want[6000], before[700], after[700];
    const char *kind[8];
    subdir(dir, sizeof dir, "openout");
    int n = make_not_regular(dir, p, kind);
    dt_test_deadline(30, "opening a FIFO as an output");
    int reader = open(p[0], O_RDONLY | O_NONBLOCK); /* the FIFO, with a reader */
    assert_true(reader >= 0);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < n; i++) {
            describe(p[i], before, sizeof before);
            int fd = 7;
            assert_status(dt_fileutil_open_output(p[i], round ? DT_FILEUTIL_APPEND : 0,
                                                  "metrics", &fd),
                          DT_ERR_IO);
            assert_int_equal(fd, -1);
            snprintf(want, sizeof want, "metrics: not a regular file (%s): only a regular "
                     "file is replaced", kind[i]);
            assert_msg(want);
            describe(p[i], after, sizeof after);
            assert_string_equal(before, after);
        }
        if (round == 0) { /* the FIFO again, now without a reader */
            close(reader);
            reader = -1;
        }
    }
    dt_test_deadline(0, NULL);
    char reg[600], *buf;
    size_t len;
    int fd;
    snprintf(reg, sizeof reg, "%s/metrics.jsonl", dir);
    assert_ok(dt_fileutil_open_output(reg, 0, "metrics", &fd));
    assert_int_equal(write(fd, "one\n", 4), 4);
    close(fd);
    assert_ok(dt_fileutil_open_output(reg, DT_FILEUTIL_APPEND, "metrics", &fd));
    assert_int_equal(write(fd, "two\n", 4), 4);
    close(fd);
    assert_ok(dt_fileutil_read_all(reg, &buf, &len));
    assert_string_equal(buf, "one\ntwo\n");
    free(buf);
    assert_ok(dt_fileutil_open_output(reg, 0, "metrics", &fd)); /* truncates */
    assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    assert_int_equal(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    close(fd);
    assert_ok(dt_fileutil_read_all(reg, &buf, &len));
    assert_int_equal(len, 0);
    free(buf);
}

/* The folder that will hold a file, made as mkdir -p makes it. */
static void test_mkdir_parent(void **state)
{
    char dir[512], p[700];
    subdir(dir, sizeof dir, "parent");
    snprintf(p, sizeof p, "%s/a/b//c/model.safetensors", dir);
    assert_ok(dt_fileutil_mkdir_parent(p));
    snprintf(p, sizeof p, "%s/a/b/c", dir);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    snprintf(p, sizeof p, "%s/a/b/c/model.safetensors", dir);
    assert_int_equal(access(p, F_OK), -1); /* the file itself is not made */
    assert_ok(dt_fileutil_mkdir_parent("bare-name.bin")); /* nothing to make */
    assert_ok(dt_fileutil_mkdir_parent("/at-the-root.bin"));
    snprintf(p, sizeof p, "%s/a/b/c/model.safetensors", dir); /* a file in the way */
    assert_ok(dt_fileutil_write_atomic(p, "x", 1));
    snprintf(p, sizeof p, "%s/a/b/c/model.safetensors/x.bin", dir);
    assert_status(dt_fileutil_mkdir_parent(p), DT_ERR_IO);
    char want[1400];
    snprintf(want, sizeof want, "creating directory '%s/a/b/c/model.safetensors': Not a "
             "directory", dir);
    assert_msg(want);
}

/* The environment variable arms the hook too (checked in a fresh process,
 * since the variable is read once). */
static int env_child(void)
{
    char p[600];
    snprintf(p, sizeof p, "%s/envchild.bin", g_dir);
    int rc = dt_fileutil_write_atomic(p, "0123456789abcdef", 16);
    int ok = rc == DT_ERR_IO && strstr(dt_last_error(), "No space left") &&
             access(p, F_OK) != 0;
    return ok ? 0 : 1;
}

static void test_fault_env(void **state)
{
    dt_test_require_hooks("DTRAIN_FAULT_WRITE_AFTER_BYTES");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("DTRAIN_FAULT_WRITE_AFTER_BYTES", "10", 1);
        execl("/proc/self/exe", "test_ckpt_io", "--env-child", g_dir,
              (char *)NULL);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* ---- a 3-rank checkpoint --------------------------------------------- */

typedef struct {
    const char *name;
    int dtype;
    uint64_t numel;
    int ndim;
    int64_t shape[2];
} ent_spec_t;

static const ent_spec_t ENTS[] = {
    {"embedding/params", DT_F32, 1000, 2, {10, 100}},
    {"block.0/params", DT_F32, 777, 0, {0}},
    {"block.0/exp_avg", DT_F32, 777, 0, {0}},
    {"block.0/exp_avg_sq", DT_F32, 777, 0, {0}},
    {"head/counter", DT_I64, 5, 1, {5}},
    {"empty/params", DT_F32, 0, 0, {0}},
};
#define N_ENTS (sizeof ENTS / sizeof *ENTS)
#define RANKS 3

/* Element i of entry e for a save made with `seed`: exact in f32. */
static float fval(size_t e, uint64_t i, int seed)
{
    return (float)seed * 0.5f + (float)e * 1000.0f + (float)i * 0.25f;
}

static int64_t ival(size_t e, uint64_t i, int seed)
{
    return (int64_t)seed * 1000000000000LL + (int64_t)e * 1000 + (int64_t)i;
}

static void fill(size_t e, uint64_t off, uint64_t n, int seed, void *dst)
{
    for (uint64_t i = 0; i < n; i++) {
        if (ENTS[e].dtype == DT_F32)
            ((float *)dst)[i] = fval(e, off + i, seed);
        else
            ((int64_t *)dst)[i] = ival(e, off + i, seed);
    }
}

/* Rank r's range of an entry of n elements: odd, uneven cuts. */
static void rank_range(uint64_t n, int r, uint64_t *off, uint64_t *cnt)
{
    uint64_t c1 = n / 3 + 1, c2 = 2 * n / 3 > 1 ? 2 * n / 3 - 1 : 0;
    if (c1 > n)
        c1 = n;
    if (c2 < c1)
        c2 = c1;
    uint64_t cut[4] = {0, c1, c2, n};
    *off = cut[r];
    *cnt = cut[r + 1] - cut[r];
}

/* One whole segment through the streamed writer in a single piece. */
static int shard_write(dt_ckpt_writer_t *w, const char *entry, int dtype, uint64_t offset,
                       uint64_t count, const void *data)
{
    int rc = dt_ckpt_shard_begin(w, entry, dtype, offset, count);
    if (!rc)
        rc = dt_ckpt_shard_append(w, data, (size_t)(count * dt_dtype_size(dtype)));
    if (!rc)
        rc = dt_ckpt_shard_end(w);
    return rc;
}

/* A u64 of the manifest's "extra": dt_ckpt_json_add_u64's decimal string,
 * or a plain JSON number. */
static uint64_t json_u64(const cJSON *o, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsNumber(it))
        return (uint64_t)it->valuedouble;
    if (!cJSON_IsString(it))
        fail_msg("'%s' is neither a number nor a string", key);
    char *end;
    unsigned long long v = strtoull(it->valuestring, &end, 10);
    if (*end || !it->valuestring[0])
        fail_msg("'%s' = \"%s\" is not a decimal integer", key, it->valuestring);
    return v;
}

static int write_seg(dt_ckpt_writer_t *w, size_t e, uint64_t off, uint64_t cnt,
                     int seed)
{
    size_t es = dt_dtype_size(ENTS[e].dtype);
    char *buf = malloc(cnt * es);
    fill(e, off, cnt, seed, buf);
    int rc;
    if (cnt > 10) { /* streamed in two uneven pieces */
        rc = dt_ckpt_shard_begin(w, ENTS[e].name, ENTS[e].dtype, off, cnt);
        if (!rc)
            rc = dt_ckpt_shard_append(w, buf, 7 * es + 3);
        if (!rc)
            rc = dt_ckpt_shard_append(w, buf + 7 * es + 3, cnt * es - 7 * es - 3);
        if (!rc)
            rc = dt_ckpt_shard_end(w);
    } else {
        rc = shard_write(w, ENTS[e].name, ENTS[e].dtype, off, cnt, buf);
    }
    free(buf);
    return rc;
}

/* One rank's shard: rank 1 writes entries in order, rank 2 in reverse with
 * each range split in two segments (second half first), rank 0 in order. */
static int write_rank(const char *tmp, int r, int seed, dt_ckpt_seg_t **segs,
                      size_t *n)
{
    dt_ckpt_writer_t *w;
    int rc = dt_ckpt_shard_open(tmp, (uint32_t)r, &w);
    if (rc)
        return rc;
    for (size_t k = 0; k < N_ENTS && !rc; k++) {
        size_t e = r == 2 ? N_ENTS - 1 - k : k;
        uint64_t off, cnt;
        rank_range(ENTS[e].numel, r, &off, &cnt); /* may be empty */
        if (r == 2 && cnt > 1) {
            uint64_t h = cnt / 2;
            rc = write_seg(w, e, off + h, cnt - h, seed);
            if (!rc)
                rc = write_seg(w, e, off, h, seed);
        } else {
            rc = write_seg(w, e, off, cnt, seed);
        }
    }
    if (rc) {
        dt_ckpt_shard_abort(w);
        return rc;
    }
    return dt_ckpt_shard_close(w, segs, n);
}

static void entries_decl(dt_ckpt_entry_t *out)
{
    memset(out, 0, N_ENTS * sizeof *out);
    for (size_t e = 0; e < N_ENTS; e++) {
        snprintf(out[e].name, sizeof out[e].name, "%s", ENTS[e].name);
        out[e].dtype = ENTS[e].dtype;
        out[e].numel = ENTS[e].numel;
        out[e].ndim = ENTS[e].ndim;
        out[e].shape[0] = ENTS[e].shape[0];
        out[e].shape[1] = ENTS[e].shape[1];
    }
}

/* The whole save as the lead's loop will drive it; on failure the tmp dir
 * is aborted and the status returned (message kept). */
static int save(const char *root, uint64_t step, int seed)
{
    char tmp[600];
    int rc = dt_ckpt_begin(root, step, tmp, sizeof tmp);
    if (rc)
        return rc;
    dt_ckpt_seg_t *all = NULL;
    size_t n_all = 0;
    for (int r = 0; r < RANKS && !rc; r++) {
        dt_ckpt_seg_t *segs;
        size_t n;
        rc = write_rank(tmp, r, seed, &segs, &n);
        if (rc)
            break;
        /* "gather": the descriptors travel as plain bytes */
        all = realloc(all, (n_all + n) * sizeof *all);
        memcpy(all + n_all, segs, n * sizeof *segs);
        n_all += n;
        free(segs);
    }
    if (!rc) {
        dt_ckpt_entry_t ents[N_ENTS];
        entries_decl(ents);
        cJSON *model = cJSON_CreateObject();
        cJSON_AddStringToObject(model, "arch", "gpt2");
        cJSON_AddNumberToObject(model, "n_layer", 1);
        cJSON *extra = cJSON_CreateObject();
        dt_ckpt_json_add_u64(extra, "rng", UINT64_MAX - (uint64_t)seed);
        cJSON_AddNumberToObject(extra, "seed", seed);
        dt_ckpt_info_t info = {.step = step, .world_size = RANKS,
                               .strategy = "zero", .model = model,
                               .extra = extra};
        rc = dt_ckpt_write_manifest(tmp, &info, ents, N_ENTS, all, n_all);
        cJSON_Delete(model);
        cJSON_Delete(extra);
    }
    free(all);
    if (!rc)
        rc = dt_ckpt_commit(root, step);
    if (rc) {
        char keep[DT_ERR_MAX];
        snprintf(keep, sizeof keep, "%s", dt_last_error());
        assert_int_equal(dt_ckpt_abort(root, step), DT_OK);
        dt_err_set(rc, "%s", keep);
    }
    return rc;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Every entry fully and 300 random ranges match the values of `seed`. */
static void check_ckpt(const char *dir, uint64_t step, int seed)
{
    dt_ckpt_reader_t *r;
    if (dt_ckpt_open(dir, &r) != DT_OK)
        fail_msg("open %s: %s", dir, dt_last_error());
    assert_int_equal(dt_ckpt_reader_step(r), step);
    assert_int_equal(dt_ckpt_reader_world_size(r), RANKS);
    assert_string_equal(dt_ckpt_reader_strategy(r), "zero");
    const cJSON *arch = cJSON_GetObjectItem(dt_ckpt_reader_model(r), "arch");
    assert_true(cJSON_IsString(arch));
    assert_string_equal(arch->valuestring, "gpt2");
    assert_true(json_u64(dt_ckpt_reader_extra(r), "rng") == UINT64_MAX - (uint64_t)seed);
    assert_int_equal(json_u64(dt_ckpt_reader_extra(r), "seed"), seed);
    assert_int_equal(dt_ckpt_n_entries(r), N_ENTS);
    for (size_t e = 0; e < N_ENTS; e++) {
        const dt_ckpt_entry_t *ce = dt_ckpt_entry_at(r, e);
        assert_string_equal(ce->name, ENTS[e].name); /* manifest order kept */
        assert_int_equal(ce->dtype, ENTS[e].dtype);
        assert_int_equal(ce->numel, ENTS[e].numel);
        assert_int_equal(ce->ndim, ENTS[e].ndim);
        if (ce->ndim)
            assert_int_equal(ce->shape[0], ENTS[e].shape[0]);
        assert_ptr_equal(dt_ckpt_find(r, ENTS[e].name), ce);
    }
    assert_null(dt_ckpt_find(r, "nope"));
    uint64_t s = 88172645463325252ull + (uint64_t)seed;
    for (int k = -(int)N_ENTS; k < 300; k++) {
        size_t e = k < 0 ? (size_t)(k + (int)N_ENTS) : rnd(&s) % N_ENTS;
        uint64_t n = ENTS[e].numel, off = 0, cnt = n;
        if (k >= 0 && n > 0) {
            off = rnd(&s) % n;
            cnt = rnd(&s) % (n - off + 1);
        }
        size_t es = dt_dtype_size(ENTS[e].dtype);
        char *got = malloc(cnt * es + 1), *want = malloc(cnt * es + 1);
        fill(e, off, cnt, seed, want);
        if (dt_ckpt_read(r, ENTS[e].name, off, cnt, got) != DT_OK)
            fail_msg("read %s [%llu,+%llu): %s", ENTS[e].name,
                     (unsigned long long)off, (unsigned long long)cnt,
                     dt_last_error());
        if (memcmp(got, want, cnt * es) != 0)
            fail_msg("%s [%llu,+%llu) differs", ENTS[e].name,
                     (unsigned long long)off, (unsigned long long)cnt);
        free(got);
        free(want);
    }
    float x;
    assert_int_equal(dt_ckpt_read(r, "block.0/params", 777, 1, &x),
                     DT_ERR_INVALID);
    assert_msg_has("entry block.0/params: range [777, +1) is outside its 777 "
               "elements");
    assert_int_equal(dt_ckpt_read(r, "nope", 0, 1, &x), DT_ERR_NOT_FOUND);
    assert_int_equal(dt_ckpt_verify(r), DT_OK);
    dt_ckpt_close(r);
}

static void test_roundtrip_3ranks(void **state)
{
    char root[512], dir[600];
    subdir(root, sizeof root, "rt");
    assert_int_equal(save(root, 200, 1), DT_OK);
    dt_test_assert_no_tmp(root);
    uint64_t step = 0;
    assert_int_equal(dt_ckpt_latest(root, dir, sizeof dir, &step), DT_OK);
    assert_int_equal(step, 200);
    char want[600];
    snprintf(want, sizeof want, "%s/step-00000200", root);
    assert_string_equal(dir, want);
    check_ckpt(dir, 200, 1);
    /* the shard files are what 3 ranks wrote */
    for (int r = 0; r < RANKS; r++) {
        char p[700];
        snprintf(p, sizeof p, "%s/shard-%05d.bin", dir, r);
        assert_int_equal(access(p, F_OK), 0);
    }

    /* Saving the same step again replaces it atomically. */
    assert_int_equal(save(root, 200, 5), DT_OK);
    dt_test_assert_no_tmp(root);
    check_ckpt(dir, 200, 5);
}

/* The format is readable without dtrain: Python's json + zlib.crc32 verify
 * every segment and assemble embedding/params. */
static void test_python_reads_checkpoint(void **state)
{
    if (access("/usr/bin/python3", X_OK) != 0)
        skip();
    static const char script[] =
        "import json, struct, sys, zlib\n"
        "d = sys.argv[1]\n"
        "m = json.load(open(d + '/manifest.json'))\n"
        "assert m['format'] == 'dtrain-checkpoint' and m['step'] == 200\n"
        "for f, info in m['files'].items():\n"
        "    assert len(open(d + '/' + f, 'rb').read()) == info['bytes']\n"
        "size = {'f32': 4, 'i64': 8}\n"
        "out = {}\n"
        "for name, e in m['entries'].items():\n"
        "    es = size[e['dtype']]\n"
        "    buf = bytearray(e['numel'] * es)\n"
        "    for s in e['segments']:\n"
        "        raw = open(d + '/' + s['file'], 'rb').read()\n"
        "        seg = raw[s['byte_offset']:s['byte_offset'] + s['count'] * es]\n"
        "        assert '%08x' % zlib.crc32(seg) == s['crc32'], (name, s)\n"
        "        buf[s['offset'] * es:(s['offset'] + s['count']) * es] = seg\n"
        "    out[name] = bytes(buf)\n"
        "emb = struct.unpack('<1000f', out['embedding/params'])\n"
        "assert list(emb) == [1 * 0.5 + 0 * 1000 + i * 0.25 for i in range(1000)]\n"
        "assert list(struct.unpack('<5q', out['head/counter'])) == "
        "[10**12 + 4000 + i for i in range(5)]\n";
    char root[512], dir[600], sp[600], cmd[1400];
    subdir(root, sizeof root, "py");
    assert_int_equal(save(root, 200, 1), DT_OK);
    assert_int_equal(dt_ckpt_step_dir(root, 200, 0, dir, sizeof dir), DT_OK);
    snprintf(sp, sizeof sp, "%s/check.py", root);
    assert_int_equal(dt_fileutil_write_atomic(sp, script, strlen(script)),
                     DT_OK);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s' '%s'", sp, dir);
    int st = system(cmd);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void flip_byte(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static void test_checksum_mismatch(void **state)
{
    char root[512], dir[600], shard[700];
    subdir(root, sizeof root, "crc");
    assert_int_equal(save(root, 200, 1), DT_OK);
    assert_int_equal(dt_ckpt_step_dir(root, 200, 0, dir, sizeof dir), DT_OK);
    /* Rank 1's first segment: embedding/params [334, 665), at byte 0. */
    uint64_t off, cnt;
    rank_range(1000, 1, &off, &cnt);
    assert_int_equal(off, 334);
    assert_int_equal(cnt, 331);
    float *orig = malloc(cnt * 4);
    fill(0, off, cnt, 1, orig);
    uint32_t want_crc = dt_fileutil_crc32(0, orig, cnt * 4);
    ((unsigned char *)orig)[100] ^= 0x40;
    uint32_t got_crc = dt_fileutil_crc32(0, orig, cnt * 4);
    free(orig);
    snprintf(shard, sizeof shard, "%s/shard-00001.bin", dir);
    flip_byte(shard, 100);

    dt_ckpt_reader_t *r;
    assert_int_equal(dt_ckpt_open(dir, &r), DT_OK); /* sizes still fine */
    float buf[1000];
    /* Ranges held only by intact segments still read. */
    assert_int_equal(dt_ckpt_read(r, "embedding/params", 0, 300, buf), DT_OK);
    assert_int_equal(dt_ckpt_read(r, "block.0/params", 0, 777, buf), DT_OK);
    assert_int_equal(dt_ckpt_read(r, "embedding/params", 600, 10, buf),
                     DT_ERR_DATA);
    char want[1000];
    snprintf(want, sizeof want, "checkpoint '%s': shard-00001.bin: entry "
             "embedding/params: checksum mismatch (expected %08x, got %08x)",
             dir, want_crc, got_crc);
    assert_msg_has(want);
    /* Reading again does not pass it off as verified. */
    assert_int_equal(dt_ckpt_read(r, "embedding/params", 334, 1, buf),
                     DT_ERR_DATA);
    assert_int_equal(dt_ckpt_verify(r), DT_ERR_DATA);
    assert_msg_has("shard-00001.bin: entry embedding/params: checksum mismatch");
    dt_ckpt_close(r);
}

static void test_missing_marker(void **state)
{
    char root[512], dir[600], p[700];
    subdir(root, sizeof root, "marker");
    assert_int_equal(save(root, 100, 1), DT_OK);
    assert_int_equal(save(root, 200, 2), DT_OK);
    assert_int_equal(dt_ckpt_step_dir(root, 200, 0, dir, sizeof dir), DT_OK);
    snprintf(p, sizeof p, "%s/COMPLETE", dir);
    assert_int_equal(unlink(p), 0);
    dt_ckpt_reader_t *r = (void *)1;
    assert_int_equal(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    assert_null(r);
    char want[800];
    snprintf(want, sizeof want, "checkpoint '%s': incomplete (no COMPLETE "
             "marker): the write was interrupted", dir);
    assert_msg_has(want);
    /* latest skips it */
    uint64_t step;
    assert_int_equal(dt_ckpt_latest(root, p, sizeof p, &step), DT_OK);
    assert_int_equal(step, 100);
    check_ckpt(p, 100, 1);
}

static void test_missing_and_truncated_shard(void **state)
{
    char root[512], dir[600], p[700];
    subdir(root, sizeof root, "shard");
    assert_int_equal(save(root, 300, 1), DT_OK);
    assert_int_equal(dt_ckpt_step_dir(root, 300, 0, dir, sizeof dir), DT_OK);
    dt_ckpt_reader_t *r;

    snprintf(p, sizeof p, "%s/shard-00000.bin", dir);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(truncate(p, st.st_size - 4), 0);
    assert_int_equal(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    char want[900];
    snprintf(want, sizeof want, "checkpoint '%s': shard-00000.bin: the "
             "manifest says %lld bytes but the file has %lld bytes", dir,
             (long long)st.st_size, (long long)st.st_size - 4);
    assert_msg_has(want);

    assert_int_equal(save(root, 300, 1), DT_OK); /* a fresh, good copy */
    snprintf(p, sizeof p, "%s/shard-00002.bin", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    snprintf(want, sizeof want, "checkpoint '%s': shard-00002.bin: No such "
             "file or directory", dir);
    assert_msg_has(want);
}

/* Write COMPLETE as a save does, vouching for manifest.json as it now is
 * (size and zlib CRC-32), so a test's edit reaches the manifest checks. */
static void reseal(const char *dir)
{
    char p[700], marker[128];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    char *text;
    size_t n;
    assert_ok(dt_fileutil_read_all(p, &text, &n));
    int mn = snprintf(marker, sizeof marker, "dtrain checkpoint complete\n"
                      "manifest.json %zu bytes crc32 %08x\n", n,
                      (unsigned)dt_fileutil_crc32(0, text, n));
    free(text);
    snprintf(p, sizeof p, "%s/COMPLETE", dir);
    assert_ok(dt_fileutil_write_atomic(p, marker, (size_t)mn));
}

/* Rewrite manifest.json through `edit`, then COMPLETE when `sealed`. */
static void rewrite_manifest(const char *dir, void (*edit)(cJSON *), int sealed)
{
    char p[700];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    char *text;
    size_t n;
    assert_int_equal(dt_fileutil_read_all(p, &text, &n), DT_OK);
    cJSON *j = cJSON_Parse(text);
    free(text);
    assert_non_null(j);
    edit(j);
    text = cJSON_Print(j);
    assert_int_equal(dt_fileutil_write_atomic(p, text, strlen(text)), DT_OK);
    cJSON_free(text);
    cJSON_Delete(j);
    if (sealed)
        reseal(dir);
}

static void edit_manifest(const char *dir, void (*edit)(cJSON *))
{
    rewrite_manifest(dir, edit, 1);
}

static cJSON *first_seg(cJSON *j, const char *entry)
{
    cJSON *e = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "entries"), entry);
    return cJSON_GetArrayItem(cJSON_GetObjectItem(e, "segments"), 0);
}

static void edit_gap(cJSON *j)
{
    cJSON *c = cJSON_GetObjectItem(first_seg(j, "embedding/params"), "count");
    cJSON_SetNumberValue(c, c->valuedouble - 1);
}

static void edit_version(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(j, "format_version"), 3);
}

static void edit_file_name(cJSON *j)
{
    cJSON *f = cJSON_GetObjectItem(first_seg(j, "block.0/params"), "file");
    cJSON_SetValuestring(f, "shard-00009.bin");
}

static void edit_path_escape(cJSON *j)
{
    cJSON *files = cJSON_GetObjectItem(j, "files");
    cJSON_AddItemToObject(files, "../x", cJSON_Parse("{\"bytes\": 1}"));
}

static void edit_seg_past_file(cJSON *j)
{
    cJSON *b = cJSON_GetObjectItem(first_seg(j, "block.0/params"),
                                   "byte_offset");
    cJSON_SetNumberValue(b, b->valuedouble + 1e6);
}

static void edit_dup_segment(cJSON *j)
{
    cJSON *e = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "entries"),
                                   "embedding/params");
    cJSON_AddItemToArray(cJSON_GetObjectItem(e, "segments"),
                         cJSON_Duplicate(first_seg(j, "embedding/params"), 1));
}

static void test_manifest_inconsistent(void **state)
{
    struct {
        void (*edit)(cJSON *);
        const char *msg;
    } cases[] = {
        {edit_gap, "manifest.json: entry embedding/params: elements [333, 334) "
                   "are in no segment"},
        {edit_version, "manifest.json: format_version 3 is newer than this "
                       "dtrain reads (2)"},
        {edit_file_name, "manifest.json: segment file 'shard-00009.bin' is not "
                         "listed in \"files\""},
        {edit_path_escape, "manifest.json: file name '../x' is not a plain "
                           "file name"},
        {edit_seg_past_file, "manifest.json: entry block.0/params: segment 0 "
                             "needs bytes"},
        /* the shards hold 4 x 1000 + 4 x 3 x 777 + 8 x 5 bytes */
        {edit_dup_segment, "manifest.json: its segments hold more bytes in all "
                           "than the shard files' 13364: some of them share "
                           "bytes"},
    };
    char root[512], dir[600];
    subdir(root, sizeof root, "manifest");
    assert_int_equal(dt_ckpt_step_dir(root, 1, 0, dir, sizeof dir), DT_OK);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_int_equal(save(root, 1, 1), DT_OK);
        edit_manifest(dir, cases[i].edit);
        dt_ckpt_reader_t *r;
        assert_int_equal(dt_ckpt_open(dir, &r), DT_ERR_DATA);
        char want[900];
        snprintf(want, sizeof want, "checkpoint '%s': %s", dir, cases[i].msg);
        assert_msg_has(want);
    }
    /* not JSON at all */
    char p[700];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    assert_int_equal(dt_fileutil_write_atomic(p, "{\"format\": ", 11), DT_OK);
    reseal(dir);
    dt_ckpt_reader_t *r;
    assert_int_equal(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    assert_msg_has("manifest.json: not valid JSON");
}

/* ---- the manifest's checksum and tensor table ------------------------ */

static void edit_step(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(j, "step"), 2);
}

/* manifest.json edited (or rotted) after the save, with COMPLETE not
 * rewritten to match: caught, naming the file, before anything in it is
 * believed.  An older dtrain's marker (no checksum) still loads, warned. */
static void test_manifest_checksum(void **state)
{
    char root[512], dir[600], p[700], want[1200];
    subdir(root, sizeof root, "sum");
    assert_ok(save(root, 1, 1));
    assert_ok(dt_ckpt_step_dir(root, 1, 0, dir, sizeof dir));
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    char *text;
    size_t n;
    assert_ok(dt_fileutil_read_all(p, &text, &n));
    uint32_t crc = dt_fileutil_crc32(0, text, n);
    free(text);

    rewrite_manifest(dir, edit_step, 0); /* valid JSON, consistent, edited */
    assert_ok(dt_fileutil_read_all(p, &text, &n));
    uint32_t now = dt_fileutil_crc32(0, text, n);
    size_t now_n = n;
    free(text);
    dt_ckpt_reader_t *r = (void *)1;
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    assert_null(r);
    /* the marker still records the saved manifest's size and CRC */
    snprintf(p, sizeof p, "%s/COMPLETE", dir);
    assert_ok(dt_fileutil_read_all(p, &text, &n));
    unsigned long long rec_n = 0;
    unsigned rec_crc = 0;
    assert_int_equal(sscanf(text, "dtrain checkpoint complete\nmanifest.json "
                            "%llu bytes crc32 %8x\n", &rec_n, &rec_crc), 2);
    free(text);
    assert_int_equal(rec_crc, crc);
    snprintf(want, sizeof want, "checkpoint '%s': manifest.json: checksum "
             "mismatch (COMPLETE records %llu bytes with crc32 %08x, the file "
             "has %zu bytes with crc32 %08x): it was edited or damaged after "
             "the save", dir, rec_n, crc, now_n, now);
    assert_msg(want);

    /* a marker this dtrain did not write */
    assert_ok(dt_fileutil_write_atomic(p, "done\n", 5));
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    snprintf(want, sizeof want, "checkpoint '%s': COMPLETE: not a completion "
             "marker this dtrain reads", dir);
    assert_msg(want);
    assert_ok(dt_fileutil_write_atomic(p, "dtrain checkpoint complete\n"
                                       "manifest.json 12 bytes crc32 0000000g\n", 65));
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    assert_msg(want);

    /* an older dtrain's marker: loads, with a warning */
    assert_ok(dt_fileutil_write_atomic(p, "dtrain checkpoint complete\n", 27));
    dt_test_stderr_begin();
    int rc = dt_ckpt_open(dir, &r);
    char *log = dt_test_stderr_end();
    assert_ok(rc);
    assert_int_equal(dt_ckpt_reader_step(r), 2);
    dt_ckpt_close(r);
    snprintf(want, sizeof want, "ckpt: warning: checkpoint '%s': COMPLETE holds "
             "no checksum of manifest.json (written by an older dtrain): the "
             "manifest is checked for consistency only\n", dir);
    if (!strstr(log, want))
        fail_msg("log\n  got:   %s\n  lacks: %s", log, want);
    free(log);
}

/* Files of a checkpoint that a save never makes: a link in place of a
 * shard or the manifest, a FIFO (which would block open forever). */
static void test_ckpt_members_not_regular(void **state)
{
    char root[512], dir[600], p[700], q[800], want[1200];
    subdir(root, sizeof root, "members");
    assert_ok(save(root, 1, 1));
    assert_ok(dt_ckpt_step_dir(root, 1, 0, dir, sizeof dir));
    dt_ckpt_reader_t *r;

    /* shard-00001.bin a link to an identical copy: still refused */
    snprintf(p, sizeof p, "%s/shard-00001.bin", dir);
    snprintf(q, sizeof q, "%s/copy.bin", root);
    assert_int_equal(rename(p, q), 0);
    assert_int_equal(symlink(q, p), 0);
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_IO);
    snprintf(want, sizeof want, "checkpoint '%s': shard-00001.bin: a symbolic "
             "link, refused", dir);
    assert_msg(want);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(rename(q, p), 0);
    check_ckpt(dir, 1, 1);

    /* manifest.json a FIFO */
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    dt_test_deadline(10, "opening a checkpoint whose manifest is a FIFO blocked");
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_IO);
    dt_test_deadline(0, NULL);
    snprintf(want, sizeof want, "checkpoint '%s': manifest.json: not a regular "
             "file (a FIFO)", dir);
    assert_msg(want);
}

/* Without COMPLETE a checkpoint is never loaded, but offline tools may
 * read it after a warning that it may be partial. */
static void test_open_incomplete_warns(void **state)
{
    char root[512], dir[600], p[700], want[1200];
    subdir(root, sizeof root, "partial");
    assert_ok(save(root, 5, 5));
    assert_ok(dt_ckpt_step_dir(root, 5, 0, dir, sizeof dir));
    snprintf(p, sizeof p, "%s/COMPLETE", dir);
    assert_int_equal(unlink(p), 0);
    dt_ckpt_reader_t *r;
    assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
    dt_test_stderr_begin();
    int rc = dt_ckpt_open_flags(dir, DT_CKPT_OPEN_INCOMPLETE, &r);
    char *log = dt_test_stderr_end();
    assert_ok(rc);
    assert_int_equal(dt_ckpt_verify(r), DT_OK);
    dt_ckpt_close(r);
    snprintf(want, sizeof want, "ckpt: warning: checkpoint '%s' has no COMPLETE "
             "marker: it may be partial (a save that was interrupted), and "
             "manifest.json has no checksum to be checked against; reading it "
             "anyway\n", dir);
    if (!strstr(log, want))
        fail_msg("log\n  got:   %s\n  lacks: %s", log, want);
    free(log);
}

/* A tensor table of 3 tensors over the save's entries: a (10, 50) and b
 * (500) tile embedding/params (1000), c (777) tiles block.0/params. */
static const char TABLE[] =
    "[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [10, 50]},"
    " {\"name\": \"b\", \"unit\": \"embedding\", \"offset\": 500, \"shape\": [500]},"
    " {\"name\": \"c\", \"unit\": \"block.0\", \"offset\": 0, \"shape\": [777]}]";
static const char *g_table;

static void edit_table(cJSON *j)
{
    cJSON *m = cJSON_GetObjectItem(j, "model");
    cJSON_DeleteItemFromObject(m, "tensors");
    cJSON_AddItemToObject(m, "tensors", cJSON_Parse(g_table));
}

static void test_tensor_table(void **state)
{
    char root[512], dir[600], want[1200];
    subdir(root, sizeof root, "tensors");
    assert_ok(dt_ckpt_step_dir(root, 1, 0, dir, sizeof dir));
    assert_ok(save(root, 1, 1));
    g_table = TABLE;
    edit_manifest(dir, edit_table);
    dt_ckpt_reader_t *r;
    assert_ok(dt_ckpt_open(dir, &r));
    assert_true(dt_ckpt_has_tensors(r));
    assert_int_equal(dt_ckpt_n_tensors(r), 3);
    const dt_ckpt_tensor_t *t = dt_ckpt_tensor_at(r, 0); /* manifest order */
    assert_string_equal(t->name, "a");
    assert_string_equal(t->entry, "embedding/params");
    assert_int_equal(t->numel, 500);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[1], 50);
    assert_ptr_equal(dt_ckpt_find_tensor(r, "c"), dt_ckpt_tensor_at(r, 2));
    assert_null(dt_ckpt_find_tensor(r, "d"));
    dt_ckpt_close(r);

    struct {
        const char *table, *msg;
    } cases[] = {
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [10, 50]},"
         " {\"name\": \"b\", \"unit\": \"embedding\", \"offset\": 499, \"shape\": [501]},"
         " {\"name\": \"c\", \"unit\": \"block.0\", \"offset\": 0, \"shape\": [777]}]",
         "entry embedding/params: tensors overlap at elements [499, 500) (a and b); "
         "indices [4, 99] to [4, 99] of its shape [10, 100]"},
        {"[]", "entry embedding/params: elements [0, 1000) are in no tensor; "
               "indices [0, 0] to [9, 99] of its shape [10, 100]"},
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [10, 49]},"
         " {\"name\": \"b\", \"unit\": \"embedding\", \"offset\": 500, \"shape\": [500]},"
         " {\"name\": \"c\", \"unit\": \"block.0\", \"offset\": 0, \"shape\": [777]}]",
         "entry embedding/params: elements [490, 500) are in no tensor; "
         "indices [4, 90] to [4, 99] of its shape [10, 100]"},
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [10, 50]},"
         " {\"name\": \"b\", \"unit\": \"embedding\", \"offset\": 500, \"shape\": [500]},"
         " {\"name\": \"c\", \"unit\": \"block.0\", \"offset\": 1, \"shape\": [777]}]",
         "tensor c: elements [1, 778) lie outside entry block.0/params (777 elements)"},
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [10, 50]},"
         " {\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 500, \"shape\": [500]}]",
         "tensor a listed twice"},
        {"[{\"name\": \"c\", \"unit\": \"nope\", \"offset\": 0, \"shape\": [777]}]",
         "tensor c: no entry nope/params"},
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"offset\": 0, \"shape\": [0, 50]}]",
         "tensor a: bad \"shape\" (dimensions are whole numbers >= 1, their product at most "
         "2^53)"},
        {"[{\"name\": \"a\", \"unit\": \"embedding\", \"shape\": [10]}]",
         "tensor 0 of \"model\".\"tensors\" lacks a name, a unit, an offset or a shape of 1 "
         "to 8 dimensions"},
        {"{}", "\"model\".\"tensors\" is not an array"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_ok(save(root, 1, 1));
        g_table = cases[i].table;
        edit_manifest(dir, edit_table);
        r = (void *)1;
        assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
        assert_null(r);
        snprintf(want, sizeof want, "checkpoint '%s': manifest.json: %s", dir,
                 cases[i].msg);
        assert_msg(want);
    }
}

static void test_manifest_writer_checks(void **state)
{
    char root[512], tmp[600];
    subdir(root, sizeof root, "wcheck");
    assert_int_equal(dt_ckpt_begin(root, 7, tmp, sizeof tmp), DT_OK);
    dt_ckpt_entry_t e[1] = {{.name = "u/params", .dtype = DT_F32, .numel = 10}};
    dt_ckpt_seg_t s[2] = {
        {.entry = "u/params", .offset = 0, .count = 6, .dtype = DT_F32},
        {.entry = "u/params", .offset = 5, .count = 5, .dtype = DT_F32,
         .shard = 1},
    };
    dt_ckpt_info_t info = {.step = 7};
    assert_int_equal(dt_ckpt_write_manifest(tmp, &info, e, 1, s, 2),
                     DT_ERR_INVALID);
    assert_msg_has("entry u/params: segments overlap at elements [5, 6)");
    s[1].offset = 7;
    s[1].count = 3;
    assert_int_equal(dt_ckpt_write_manifest(tmp, &info, e, 1, s, 2),
                     DT_ERR_INVALID);
    assert_msg_has("entry u/params: elements [6, 7) are in no segment");
    s[1].offset = 6;
    s[1].count = 3;
    assert_int_equal(dt_ckpt_write_manifest(tmp, &info, e, 1, s, 2),
                     DT_ERR_INVALID);
    assert_msg_has("entry u/params: elements [9, 10) are in no segment");
    s[1].count = 4;
    s[1].dtype = DT_BF16;
    assert_int_equal(dt_ckpt_write_manifest(tmp, &info, e, 1, s, 2),
                     DT_ERR_INVALID);
    assert_msg_has("entry u/params is f32 but shard 1 wrote it as bf16");
    s[1].dtype = DT_F32;
    snprintf(s[1].entry, sizeof s[1].entry, "v/params");
    assert_int_equal(dt_ckpt_write_manifest(tmp, &info, e, 1, s, 2),
                     DT_ERR_INVALID);
    assert_msg_has("segment of undeclared entry 'v/params' in shard 1");
    /* commit refuses a directory without a manifest */
    assert_int_equal(dt_ckpt_commit(root, 7), DT_ERR_INVALID);
    assert_msg_has("commit without a manifest");

    /* shard writer misuse */
    dt_ckpt_writer_t *w;
    assert_int_equal(dt_ckpt_shard_open(tmp, 0, &w), DT_OK);
    float x[4] = {1, 2, 3, 4};
    assert_int_equal(dt_ckpt_shard_begin(w, "u/params", DT_F32, 0, 2), DT_OK);
    assert_int_equal(dt_ckpt_shard_append(w, x, 12), DT_ERR_INVALID);
    assert_msg_has("shard-00000.bin: 12 bytes appended outside a segment or past "
               "its end (8 left)");
    assert_int_equal(dt_ckpt_shard_append(w, x, 4), DT_OK);
    assert_int_equal(dt_ckpt_shard_end(w), DT_ERR_INVALID);
    assert_msg_has("segment ended with 4 bytes still expected");
    dt_ckpt_shard_abort(w);

    /* an empty range is accepted and stores nothing */
    assert_int_equal(dt_ckpt_shard_open(tmp, 0, &w), DT_OK);
    assert_int_equal(shard_write(w, "u/params", DT_F32, 3, 0, x), DT_OK);
    assert_int_equal(shard_write(w, "u/params", DT_F32, 0, 4, x), DT_OK);
    dt_ckpt_seg_t *out;
    size_t n_out;
    assert_int_equal(dt_ckpt_shard_close(w, &out, &n_out), DT_OK);
    assert_int_equal(n_out, 1);
    assert_int_equal(out[0].count, 4);
    assert_int_equal(out[0].byte_offset, 0);
    assert_int_equal(out[0].crc32, dt_fileutil_crc32(0, x, sizeof x));
    free(out);
    assert_int_equal(dt_ckpt_abort(root, 7), DT_OK);
    dt_test_assert_no_tmp(root);
}

/* The newest complete checkpoint must be `step` and hold `seed`'s values;
 * no tmp directory may remain. */
static void assert_state(const char *root, uint64_t step, int seed)
{
    char dir[700];
    uint64_t got;
    dt_test_assert_no_tmp(root);
    assert_int_equal(dt_ckpt_latest(root, dir, sizeof dir, &got), DT_OK);
    assert_int_equal(got, step);
    check_ckpt(dir, step, seed);
}

static void test_disk_full(void **state)
{
    char root[512];
    subdir(root, sizeof root, "full");
    assert_int_equal(save(root, 100, 1), DT_OK);
    /* Budgets from 0 up, growing ~1.5x, until the save fits: the failure
     * lands in every stage (shards, segment data, manifest, marker). */
    int failures = 0;
    for (int64_t budget = 0;; budget = budget * 3 / 2 + 1) {
        dt_fileutil_test_fail_after(budget);
        int rc = save(root, 200, 2);
        dt_fileutil_test_fail_after(-1);
        if (rc == DT_OK)
            break;
        failures++;
        assert_int_equal(rc, DT_ERR_IO);
        assert_msg_has("No space left on device");
        assert_state(root, 100, 1);
    }
    assert_true(failures > 15);
    assert_state(root, 200, 2);

    /* fsync failing at each point in turn. */
    char dir[700];
    assert_int_equal(dt_ckpt_step_dir(root, 300, 0, dir, sizeof dir), DT_OK);
    for (int64_t n = 0;; n++) {
        assert_true(n < 64);
        dt_fileutil_test_fail_fsync_after(n);
        int rc = save(root, 300, 3);
        dt_fileutil_test_fail_fsync_after(-1);
        if (rc == DT_OK)
            break;
        assert_int_equal(rc, DT_ERR_IO);
        assert_msg_has("No space left on device");
        if (access(dir, F_OK) == 0) {
            /* Only the last sync (of the root, after the rename) can fail
             * with the new checkpoint in place; it is complete and good. */
            assert_state(root, 300, 3);
            assert_int_equal(dt_fileutil_rm_rf(dir), DT_OK);
        }
        assert_state(root, 200, 2);
    }
    assert_state(root, 300, 3);
}

static void test_latest_and_prune(void **state)
{
    char root[512], dir[700], p[800];
    subdir(root, sizeof root, "prune");
    uint64_t step;
    assert_int_equal(dt_ckpt_latest(root, dir, sizeof dir, &step),
                     DT_ERR_NOT_FOUND);
    char want[700];
    snprintf(want, sizeof want, "no complete checkpoint in '%s'", root);
    assert_msg_has(want);
    snprintf(p, sizeof p, "%s/absent", root);
    assert_int_equal(dt_ckpt_latest(p, dir, sizeof dir, &step),
                     DT_ERR_NOT_FOUND);

    uint64_t steps[] = {100, 400, 200, 300};
    for (int i = 0; i < 4; i++)
        assert_int_equal(save(root, steps[i], (int)i), DT_OK);
    /* An incomplete final-named dir, a tmp dir, and unrelated names. */
    snprintf(p, sizeof p, "%s/step-00000500", root);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK);
    snprintf(p, sizeof p, "%s/step-00000600.tmp", root);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK);
    snprintf(p, sizeof p, "%s/step-7", root);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK);
    snprintf(p, sizeof p, "%s/step-7/COMPLETE", root);
    assert_int_equal(dt_fileutil_write_atomic(p, "", 0), DT_OK);

    assert_int_equal(dt_ckpt_latest(root, dir, sizeof dir, &step), DT_OK);
    assert_int_equal(step, 400);
    assert_int_equal(dt_ckpt_prune(root, 0), DT_ERR_INVALID);
    assert_int_equal(dt_ckpt_prune(root, 2), DT_OK);
    const char *expect_present[] = {"step-00000300", "step-00000400",
                                    "step-00000500", "step-00000600.tmp",
                                    "step-7"};
    const char *expect_gone[] = {"step-00000100", "step-00000200"};
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", root, expect_present[i]);
        assert_int_equal(access(p, F_OK), 0);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", root, expect_gone[i]);
        assert_int_equal(access(p, F_OK), -1);
    }
    snprintf(p, sizeof p, "%s/step-00000300", root);
    check_ckpt(p, 300, 3);
    /* begin removes a stale tmp of its own step */
    char tmp[700];
    assert_int_equal(dt_ckpt_begin(root, 600, tmp, sizeof tmp), DT_OK);
    snprintf(p, sizeof p, "%s/stale", tmp);
    assert_int_equal(dt_fileutil_write_atomic(p, "x", 1), DT_OK);
    assert_int_equal(dt_ckpt_begin(root, 600, tmp, sizeof tmp), DT_OK);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(dt_ckpt_abort(root, 600), DT_OK);

    /* startup cleanup: leftovers of interrupted saves go, the rest stays */
    snprintf(p, sizeof p, "%s/step-00000700.tmp", root);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK);
    snprintf(p, sizeof p, "%s/step-00000300.old", root);
    assert_int_equal(dt_fileutil_mkdir_p(p), DT_OK);
    snprintf(p, sizeof p, "%s/notes.tmp", root);
    assert_int_equal(dt_fileutil_write_atomic(p, "x", 1), DT_OK);
    assert_int_equal(dt_ckpt_clean_stale(root), DT_OK);
    const char *after_gone[] = {"step-00000700.tmp", "step-00000300.old"};
    const char *after_kept[] = {"step-00000300", "step-00000400",
                                "step-00000500", "step-7", "notes.tmp"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", root, after_gone[i]);
        assert_int_equal(access(p, F_OK), -1);
    }
    for (int i = 0; i < 5; i++) {
        snprintf(p, sizeof p, "%s/%s", root, after_kept[i]);
        assert_int_equal(access(p, F_OK), 0);
    }
    snprintf(p, sizeof p, "%s/absent", root);
    assert_int_equal(dt_ckpt_clean_stale(p), DT_OK);
}

/* Assert that `log` (captured stderr) has the warning about `name` under
 * `root`, ending in `why`. */
static void assert_ignored(const char *log, const char *root, const char *name,
                           const char *why)
{
    char want[900];
    snprintf(want, sizeof want, "ckpt: warning: checkpoint folder '%s': "
             "ignoring '%s': %s\n", root, name, why);
    if (!strstr(log, want))
        fail_msg("log\n  got:   %s\n  lacks: %s", log, want);
}

/* A step name that is not a real directory of ours (a link to another
 * run's checkpoint, a file, another user's directory) is neither the
 * latest nor pruned, and removal never reaches through a link: pruning
 * with keep = 1 leaves the other run whole. */
static void test_links_in_ckpt_root(void **state)
{
    char other[512], root[512], target[600], p[700], q[800];
    subdir(other, sizeof other, "other_run");
    subdir(root, sizeof root, "linked_run");
    assert_ok(save(other, 1, 7));
    assert_ok(save(root, 2, 2));
    assert_ok(save(root, 3, 3));
    assert_ok(dt_ckpt_step_dir(other, 1, 0, target, sizeof target));
    /* links at an older and at a newer step than ours, a file at another */
    snprintf(p, sizeof p, "%s/step-00000001", root);
    assert_int_equal(symlink(target, p), 0);
    snprintf(p, sizeof p, "%s/step-00000009", root);
    assert_int_equal(symlink(target, p), 0);
    snprintf(p, sizeof p, "%s/step-00000008", root);
    assert_ok(dt_fileutil_write_atomic(p, "x", 1));
    /* inside our step 2, which keep = 1 prunes: links to the other run's
     * directory and to its shard */
    snprintf(p, sizeof p, "%s/step-00000002/elsewhere", root);
    assert_int_equal(symlink(target, p), 0);
    snprintf(p, sizeof p, "%s/step-00000002/shard-link", root);
    snprintf(q, sizeof q, "%s/shard-00000.bin", target);
    assert_int_equal(symlink(q, p), 0);

    char dir[700];
    uint64_t step = 0;
    dt_test_stderr_begin();
    int rc = dt_ckpt_latest(root, dir, sizeof dir, &step);
    char *log = dt_test_stderr_end();
    assert_ok(rc);
    assert_int_equal(step, 3);
    assert_ignored(log, root, "step-00000009", "a symbolic link, not a directory");
    assert_ignored(log, root, "step-00000001", "a symbolic link, not a directory");
    assert_ignored(log, root, "step-00000008", "not a directory");
    free(log);

    dt_test_stderr_begin();
    rc = dt_ckpt_prune(root, 1);
    free(dt_test_stderr_end());
    assert_ok(rc);
    check_ckpt(target, 1, 7); /* the other run: COMPLETE, shard and all */
    snprintf(p, sizeof p, "%s/step-00000002", root);
    assert_int_equal(access(p, F_OK), -1);
    snprintf(p, sizeof p, "%s/step-00000003", root);
    check_ckpt(p, 3, 3);
    const char *links[] = {"step-00000001", "step-00000009"};
    for (int i = 0; i < 2; i++) {
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", root, links[i]);
        assert_int_equal(lstat(p, &st), 0);
        assert_true(S_ISLNK(st.st_mode));
    }

    /* startup cleanup removes a leftover name that is a link as a link */
    snprintf(p, sizeof p, "%s/step-00000004.tmp", root);
    assert_int_equal(symlink(target, p), 0);
    assert_ok(dt_ckpt_clean_stale(root));
    struct stat st;
    assert_int_equal(lstat(p, &st), -1);
    check_ckpt(target, 1, 7);

    /* another user's directory, complete and newest (needs root to make) */
    if (geteuid() == 0) {
        assert_ok(save(root, 10, 10));
        snprintf(p, sizeof p, "%s/step-00000010", root);
        assert_int_equal(chown(p, 65534, 65534), 0);
        dt_test_stderr_begin();
        rc = dt_ckpt_latest(root, dir, sizeof dir, &step);
        log = dt_test_stderr_end();
        assert_ok(rc);
        assert_int_equal(step, 3);
        assert_ignored(log, root, "step-00000010",
                       "owned by uid 65534, not by this user (uid 0)");
        free(log);
    }
}

/* 64-bit values do not fit a JSON number (a double): add_u64 stores the
 * exact decimal string. */
static void test_json_u64(void **state)
{
    cJSON *o = cJSON_CreateObject();
    assert_int_equal(dt_ckpt_json_add_u64(o, "a", UINT64_MAX), DT_OK);
    assert_int_equal(dt_ckpt_json_add_u64(o, "b", 0), DT_OK);
    char *t = cJSON_PrintUnformatted(o);
    assert_string_equal(t, "{\"a\":\"18446744073709551615\",\"b\":\"0\"}");
    cJSON *p = cJSON_Parse(t);
    assert_true(json_u64(p, "a") == UINT64_MAX);
    cJSON_free(t);
    cJSON_Delete(o);
    cJSON_Delete(p);
}

/* ---- block shards (tensor-parallel layouts) -------------------------- */

/* The entries of the block saves: block.0/params holds a tensor table
 * (w_col [6, 10] at 0, w_row [10, 6] at 60, bias [7] at 120), head/w is
 * a [8, 5] entry of its own shape, ln/x a [3, 4, 5] one. */
static const ent_spec_t BENTS[] = {
    {"block.0/params", DT_F32, 127, 0, {0}},
    {"head/w", DT_F32, 40, 2, {8, 5}},
    {"ln/x", DT_F32, 60, 0, {0}}, /* shape [3, 4, 5] set in bents_decl */
};
#define N_BENTS (sizeof BENTS / sizeof *BENTS)
static const char BTABLE[] =
    "[{\"name\": \"w_col\", \"unit\": \"block.0\", \"offset\": 0, \"shape\": [6, 10]},"
    " {\"name\": \"w_row\", \"unit\": \"block.0\", \"offset\": 60, \"shape\": [10, 6]},"
    " {\"name\": \"bias\", \"unit\": \"block.0\", \"offset\": 120, \"shape\": [7]}]";

/* Element i of BENTS entry e: exact in f32. */
static float bval(size_t e, uint64_t i)
{
    return (float)e * 1000.0f + (float)i * 0.5f + 0.25f;
}

/* One piece a rank saves: a block (b.ndim > 0) or the flat range
 * [off, off + cnt). */
typedef struct {
    int rank;
    size_t e;
    uint64_t off, cnt;
    dt_ckpt_block_t b;
} bpiece_t;

static dt_ckpt_block_t blk2(uint64_t base, uint64_t r, uint64_t c, uint64_t r0,
                            uint64_t nr, uint64_t c0, uint64_t nc)
{
    return (dt_ckpt_block_t){.base = base, .ndim = 2, .shape = {r, c},
                             .start = {r0, c0}, .size = {nr, nc}};
}

static dt_ckpt_block_t blk3(uint64_t a0, uint64_t na, uint64_t b0, uint64_t nb,
                            uint64_t c0, uint64_t nc)
{
    return (dt_ckpt_block_t){.base = 0, .ndim = 3, .shape = {3, 4, 5},
                             .start = {a0, b0, c0}, .size = {na, nb, nc}};
}

/* The global element of the k-th (row-major) element of block b, computed
 * the slow way: unravel k over the sizes, ravel over the shape. */
static uint64_t block_flat(const dt_ckpt_block_t *b, uint64_t k)
{
    uint64_t idx[DT_CKPT_MAX_DIMS], at = 0;
    for (int d = b->ndim - 1; d >= 0; d--) {
        idx[d] = k % b->size[d];
        k /= b->size[d];
    }
    for (int d = 0; d < b->ndim; d++)
        at = at * b->shape[d] + b->start[d] + idx[d];
    return b->base + at;
}

static uint64_t block_numel(const dt_ckpt_block_t *b)
{
    uint64_t n = 1;
    for (int d = 0; d < b->ndim; d++)
        n *= b->size[d];
    return n;
}

/* The piece's values, as it is stored (row-major for a block). */
static float *piece_values(const bpiece_t *p, uint64_t *n)
{
    *n = p->b.ndim > 0 ? block_numel(&p->b) : p->cnt;
    float *v = malloc((*n + 1) * sizeof *v);
    for (uint64_t k = 0; k < *n; k++)
        v[k] = bval(p->e, p->b.ndim > 0 ? block_flat(&p->b, k) : p->off + k);
    return v;
}

/* 4 ranks as a tensor-parallel save would write them: head/w in 2 x 2
 * blocks (uneven), w_col split by columns over ranks 0 and 1 (a
 * column-parallel weight), w_row by rows over ranks 2 and 3 (row-parallel:
 * each block one contiguous run), bias a flat range of rank 3, ln/x in
 * 2 x 2 blocks over its first two dimensions. */
static const bpiece_t *block_layout(size_t *n)
{
    static bpiece_t p[16];
    size_t k = 0;
    for (int r = 0; r < 4; r++) {
        uint64_t ri = (uint64_t)r / 2, ci = (uint64_t)r % 2;
        p[k++] = (bpiece_t){r, 1, 0, 0, blk2(0, 8, 5, ri ? 3 : 0, ri ? 5 : 3,
                                             ci ? 2 : 0, ci ? 3 : 2)};
        p[k++] = (bpiece_t){r, 2, 0, 0, blk3(ri ? 2 : 0, ri ? 1 : 2,
                                             ci ? 1 : 0, ci ? 3 : 1, 0, 5)};
    }
    p[k++] = (bpiece_t){0, 0, 0, 0, blk2(0, 6, 10, 0, 6, 0, 4)};
    p[k++] = (bpiece_t){1, 0, 0, 0, blk2(0, 6, 10, 0, 6, 4, 6)};
    p[k++] = (bpiece_t){2, 0, 0, 0, blk2(60, 10, 6, 0, 7, 0, 6)};
    p[k++] = (bpiece_t){3, 0, 0, 0, blk2(60, 10, 6, 7, 3, 0, 6)};
    p[k++] = (bpiece_t){3, 0, 120, 7, {0}};
    *n = k;
    return p;
}

/* 3 ranks as a data-parallel save writes them: rank_range of every entry. */
static const bpiece_t *flat_layout(size_t *n)
{
    static bpiece_t p[3 * N_BENTS];
    size_t k = 0;
    for (int r = 0; r < 3; r++)
        for (size_t e = 0; e < N_BENTS; e++) {
            p[k] = (bpiece_t){r, e, 0, 0, {0}};
            rank_range(BENTS[e].numel, r, &p[k].off, &p[k].cnt);
            k++;
        }
    *n = k;
    return p;
}

static void bents_decl(dt_ckpt_entry_t *out)
{
    memset(out, 0, N_BENTS * sizeof *out);
    for (size_t e = 0; e < N_BENTS; e++) {
        snprintf(out[e].name, sizeof out[e].name, "%s", BENTS[e].name);
        out[e].dtype = DT_F32;
        out[e].numel = BENTS[e].numel;
        out[e].ndim = BENTS[e].ndim;
        out[e].shape[0] = BENTS[e].shape[0];
        out[e].shape[1] = BENTS[e].shape[1];
    }
    out[2].ndim = 3;
    out[2].shape[0] = 3;
    out[2].shape[1] = 4;
    out[2].shape[2] = 5;
}

/* Save `pieces` as `ranks` shards, each piece streamed in two parts;
 * returns the first failure (message kept, tmp dir removed). */
static int save_pieces(const char *root, uint64_t step, const bpiece_t *p,
                       size_t n, int ranks)
{
    char tmp[600];
    int rc = dt_ckpt_begin(root, step, tmp, sizeof tmp);
    if (rc)
        return rc;
    dt_ckpt_seg_t *all = NULL;
    size_t n_all = 0;
    for (int r = 0; r < ranks && !rc; r++) {
        dt_ckpt_writer_t *w;
        if ((rc = dt_ckpt_shard_open(tmp, (uint32_t)r, &w)))
            break;
        for (size_t i = 0; i < n && !rc; i++) {
            if (p[i].rank != r)
                continue;
            uint64_t cnt;
            float *v = piece_values(&p[i], &cnt);
            const char *name = BENTS[p[i].e].name;
            rc = p[i].b.ndim > 0
                     ? dt_ckpt_shard_begin_block(w, name, DT_F32, &p[i].b)
                     : dt_ckpt_shard_begin(w, name, DT_F32, p[i].off, cnt);
            size_t half = (size_t)cnt / 2 * sizeof *v + 2;
            if (half > cnt * sizeof *v)
                half = (size_t)cnt * sizeof *v;
            if (!rc)
                rc = dt_ckpt_shard_append(w, v, half);
            if (!rc)
                rc = dt_ckpt_shard_append(w, (char *)v + half,
                                          (size_t)cnt * sizeof *v - half);
            if (!rc)
                rc = dt_ckpt_shard_end(w);
            free(v);
        }
        if (rc) {
            dt_ckpt_shard_abort(w);
            break;
        }
        dt_ckpt_seg_t *segs;
        size_t ns;
        if ((rc = dt_ckpt_shard_close(w, &segs, &ns)))
            break;
        all = realloc(all, (n_all + ns + 1) * sizeof *all);
        memcpy(all + n_all, segs, ns * sizeof *segs);
        n_all += ns;
        free(segs);
    }
    if (!rc) {
        dt_ckpt_entry_t ents[N_BENTS];
        bents_decl(ents);
        cJSON *model = cJSON_CreateObject();
        cJSON_AddStringToObject(model, "arch", "toy");
        cJSON_AddItemToObject(model, "tensors", cJSON_Parse(BTABLE));
        dt_ckpt_info_t info = {.step = step, .world_size = (uint32_t)ranks,
                               .strategy = "tensor", .model = model};
        rc = dt_ckpt_write_manifest(tmp, &info, ents, N_BENTS, all, n_all);
        cJSON_Delete(model);
    }
    free(all);
    if (!rc)
        rc = dt_ckpt_commit(root, step);
    if (rc) {
        char keep[DT_ERR_MAX];
        snprintf(keep, sizeof keep, "%s", dt_last_error());
        assert_ok(dt_ckpt_abort(root, step));
        dt_err_set(rc, "%s", keep);
    }
    return rc;
}

/* Every entry read back as the flat ranges of `ranks` even ranks is
 * bit-identical to the values saved. */
static void check_ranges(dt_ckpt_reader_t *r, int ranks)
{
    for (size_t e = 0; e < N_BENTS; e++) {
        uint64_t n = BENTS[e].numel;
        for (int k = 0; k < ranks; k++) {
            uint64_t off = n * (uint64_t)k / (uint64_t)ranks;
            uint64_t cnt = n * (uint64_t)(k + 1) / (uint64_t)ranks - off;
            float *got = malloc((cnt + 1) * sizeof *got);
            float *want = malloc((cnt + 1) * sizeof *want);
            for (uint64_t i = 0; i < cnt; i++)
                want[i] = bval(e, off + i);
            if (dt_ckpt_read(r, BENTS[e].name, off, cnt, got) != DT_OK)
                fail_msg("%d ranks: read %s [%llu, +%llu): %s", ranks,
                         BENTS[e].name, (unsigned long long)off,
                         (unsigned long long)cnt, dt_last_error());
            if (memcmp(got, want, cnt * sizeof *got) != 0)
                fail_msg("%d ranks: %s [%llu, +%llu) differs", ranks,
                         BENTS[e].name, (unsigned long long)off,
                         (unsigned long long)cnt);
            free(got);
            free(want);
        }
    }
}

/* Every piece of `p` read back as what it is (a block through
 * dt_ckpt_read_block, a range through dt_ckpt_read) is bit-identical. */
static void check_pieces(dt_ckpt_reader_t *r, const bpiece_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t cnt;
        float *want = piece_values(&p[i], &cnt);
        float *got = malloc((cnt + 1) * sizeof *got);
        const char *name = BENTS[p[i].e].name;
        int rc = p[i].b.ndim > 0 ? dt_ckpt_read_block(r, name, &p[i].b, got)
                                 : dt_ckpt_read(r, name, p[i].off, cnt, got);
        if (rc != DT_OK)
            fail_msg("piece %zu of %s: %s", i, name, dt_last_error());
        if (memcmp(got, want, cnt * sizeof *got) != 0)
            fail_msg("piece %zu of %s differs", i, name);
        free(got);
        free(want);
    }
}

/* Other block layouts than the saved one: w_col split 3 ways by rows and
 * 4 by columns (unevenly), odd sub-blocks of every tensor. */
static const bpiece_t *other_blocks(size_t *n)
{
    static bpiece_t p[16];
    size_t k = 0;
    for (uint64_t i = 0; i < 3; i++)
        p[k++] = (bpiece_t){0, 0, 0, 0, blk2(0, 6, 10, 2 * i, 2, 0, 10)};
    static const uint64_t cuts[] = {0, 1, 5, 6, 10};
    for (int i = 0; i < 4; i++)
        p[k++] = (bpiece_t){0, 0, 0, 0, blk2(0, 6, 10, 0, 6, cuts[i],
                                             cuts[i + 1] - cuts[i])};
    p[k++] = (bpiece_t){0, 0, 0, 0, blk2(60, 10, 6, 3, 5, 1, 4)};
    p[k++] = (bpiece_t){0, 1, 0, 0, blk2(0, 8, 5, 1, 6, 1, 3)};
    p[k++] = (bpiece_t){0, 1, 0, 0, blk2(0, 8, 5, 0, 8, 0, 5)};
    p[k++] = (bpiece_t){0, 2, 0, 0, blk3(1, 2, 1, 2, 2, 3)};
    p[k++] = (bpiece_t){0, 2, 0, 0, blk3(0, 3, 0, 4, 0, 5)};
    p[k++] = (bpiece_t){0, 0, 0, 0, {.base = 120, .ndim = 1, .shape = {7},
                                     .start = {2}, .size = {4}}};
    *n = k;
    return p;
}

static void test_blocks_read_as_ranges(void **state)
{
    char root[512], dir[600], out[600], cdir[700];
    subdir(root, sizeof root, "blocks");
    size_t n, no;
    const bpiece_t *p = block_layout(&n);
    assert_ok(save_pieces(root, 5, p, n, 4));
    assert_ok(dt_ckpt_step_dir(root, 5, 0, dir, sizeof dir));
    dt_ckpt_reader_t *r;
    assert_ok(dt_ckpt_open(dir, &r));
    assert_int_equal(dt_ckpt_reader_format_version(r), 2);
    /* head/w is 4 block segments in the manifest, by first element */
    size_t hw = 1;
    assert_string_equal(dt_ckpt_entry_at(r, hw)->name, "head/w");
    assert_int_equal(dt_ckpt_entry_n_segments(r, hw), 4);
    const dt_ckpt_seg_t *s = dt_ckpt_segment_at(r, hw, 1);
    assert_int_equal(s->block.ndim, 2);
    assert_int_equal(s->block.start[1], 2);
    assert_int_equal(s->block.size[0], 3);
    assert_int_equal(s->offset, 2);
    assert_int_equal(s->count, 9);
    assert_int_equal(s->shard, 1);
    for (int ranks = 1; ranks <= 4; ranks++)
        check_ranges(r, ranks);
    check_pieces(r, p, n);
    const bpiece_t *po = other_blocks(&no);
    check_pieces(r, po, no);
    assert_ok(dt_ckpt_verify(r));
    dt_ckpt_close(r);

    /* inspect says what each block is */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_ok(dt_ckpt_inspect(dir, 1, f));
    fclose(f);
    assert_non_null(strstr(text, "written by 4 rank(s) with tensor, format version 2"));
    assert_non_null(strstr(text, "head/w                       f32            40 "
                                 "elements in 4 segment(s): block [0:3, 0:2] of "
                                 "[8, 5] at 0 shard 0; block [0:3, 2:5] of [8, 5] "
                                 "at 0 shard 1; block [3:8, 0:2] of [8, 5] at 0 "
                                 "shard 2; block [3:8, 2:5] of [8, 5] at 0 shard 3\n"));
    assert_non_null(strstr(text, "block [0:7, 0:6] of [10, 6] at 60 shard 2;"));
    assert_non_null(strstr(text, "block [7:10, 0:6] of [10, 6] at 60 shard 3; ...\n"));
    free(text);

    /* consolidate: one flat shard, version 1, same values */
    snprintf(out, sizeof out, "%s/consolidated", root);
    assert_ok(dt_ckpt_consolidate(dir, out, 7));
    assert_ok(dt_ckpt_step_dir(out, 5, 0, cdir, sizeof cdir));
    assert_ok(dt_ckpt_open(cdir, &r));
    assert_int_equal(dt_ckpt_reader_format_version(r), 1);
    for (size_t e = 0; e < N_BENTS; e++) {
        assert_int_equal(dt_ckpt_entry_n_segments(r, e), 1);
        assert_int_equal(dt_ckpt_segment_at(r, e, 0)->block.ndim, 0);
    }
    check_ranges(r, 1);
    check_pieces(r, p, n);
    dt_ckpt_close(r);

    /* export: the tensors of the table, whole, from their blocks */
    snprintf(out, sizeof out, "%s/model.safetensors", root);
    assert_ok(dt_ckpt_export(dir, out, DT_EXPORT_NATIVE, NULL, 0, NULL));
    dt_test_st_t *st;
    assert_ok(dt_test_st_open(out, &st));
    static const struct {
        const char *name;
        uint64_t off, n;
        int64_t d0, d1;
    } want[] = {{"w_col", 0, 60, 6, 10}, {"w_row", 60, 60, 10, 6},
                {"bias", 120, 7, 7, 0}};
    for (size_t i = 0; i < 3; i++) {
        const dt_test_st_tensor_t *t = dt_test_st_find(st, want[i].name);
        assert_non_null(t);
        assert_int_equal(t->numel, want[i].n);
        assert_int_equal(t->shape[0], want[i].d0);
        if (want[i].d1)
            assert_int_equal(t->shape[1], want[i].d1);
        float v[60];
        memcpy(v, t->data, want[i].n * sizeof *v);
        for (uint64_t k = 0; k < want[i].n; k++)
            assert_true(v[k] == bval(0, want[i].off + k));
    }
    dt_test_st_close(st);
}

static void test_ranges_read_as_blocks(void **state)
{
    char root[512], dir[600];
    subdir(root, sizeof root, "ranges");
    size_t n, nb, no;
    const bpiece_t *p = flat_layout(&n);
    assert_ok(save_pieces(root, 6, p, n, 3));
    assert_ok(dt_ckpt_step_dir(root, 6, 0, dir, sizeof dir));
    dt_ckpt_reader_t *r;
    assert_ok(dt_ckpt_open(dir, &r));
    /* flat ranges only: the version older dtrains read */
    assert_int_equal(dt_ckpt_reader_format_version(r), 1);
    const bpiece_t *pb = block_layout(&nb), *po = other_blocks(&no);
    check_pieces(r, pb, nb);
    check_pieces(r, po, no);
    for (int ranks = 1; ranks <= 4; ranks++)
        check_ranges(r, ranks);
    dt_ckpt_close(r);
}

/* Save head/w alone from the pieces given (2 ranks): the writer's checks. */
static int save_head(const char *root, const bpiece_t *p, size_t n)
{
    char tmp[600];
    int rc = dt_ckpt_begin(root, 9, tmp, sizeof tmp);
    dt_ckpt_seg_t all[4];
    size_t n_all = 0;
    for (int r = 0; r < 2 && !rc; r++) {
        dt_ckpt_writer_t *w;
        assert_ok(dt_ckpt_shard_open(tmp, (uint32_t)r, &w));
        for (size_t i = 0; i < n; i++) {
            if (p[i].rank != r)
                continue;
            uint64_t cnt;
            float *v = piece_values(&p[i], &cnt);
            assert_ok(dt_ckpt_shard_begin_block(w, "head/w", DT_F32, &p[i].b));
            assert_ok(dt_ckpt_shard_append(w, v, (size_t)cnt * sizeof *v));
            assert_ok(dt_ckpt_shard_end(w));
            free(v);
        }
        dt_ckpt_seg_t *segs;
        size_t ns;
        assert_ok(dt_ckpt_shard_close(w, &segs, &ns));
        memcpy(all + n_all, segs, ns * sizeof *segs);
        n_all += ns;
        free(segs);
    }
    dt_ckpt_entry_t ents[N_BENTS];
    bents_decl(ents);
    dt_ckpt_info_t info = {.step = 9, .world_size = 2};
    rc = dt_ckpt_write_manifest(tmp, &info, ents + 1, 1, all, n_all);
    char keep[DT_ERR_MAX];
    snprintf(keep, sizeof keep, "%s", dt_last_error());
    assert_ok(dt_ckpt_abort(root, 9));
    dt_err_set(rc, "%s", keep);
    return rc;
}

static void edit_version3(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(j, "format_version"), 3);
}

static void edit_version1(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(j, "format_version"), 1);
}

/* head/w's second segment (rank 1's block at [0:3, 2:5]) */
static cJSON *head_seg(cJSON *j, int k)
{
    return cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(
        cJSON_GetObjectItem(j, "entries"), "head/w"), "segments"), k);
}

static void edit_block_overlap(cJSON *j) /* [0:3, 2:5] -> [0:3, 1:4] */
{
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(head_seg(j, 1), "offsets"), 1,
                             cJSON_CreateNumber(1));
}

static void edit_block_gap(cJSON *j) /* [3:8, 0:2] -> [4:8, 0:2] */
{
    cJSON *s = head_seg(j, 2);
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(s, "offsets"), 0,
                             cJSON_CreateNumber(4));
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(s, "sizes"), 0,
                             cJSON_CreateNumber(4));
    cJSON_SetNumberValue(cJSON_GetObjectItem(s, "count"), 8);
}

static void edit_block_outside(cJSON *j) /* [3:8, 2:5] -> [3:8, 2:6] */
{
    cJSON_ReplaceItemInArray(cJSON_GetObjectItem(head_seg(j, 3), "sizes"), 1,
                             cJSON_CreateNumber(4));
}

static void edit_block_count(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(head_seg(j, 3), "count"), 14);
}

static void edit_block_base(cJSON *j)
{
    cJSON_SetNumberValue(cJSON_GetObjectItem(head_seg(j, 3), "base"), 1);
}

static void test_block_errors(void **state)
{
    char root[512], dir[600], want[1200];
    subdir(root, sizeof root, "block-errors");

    /* writer: a block outside its tensor, refused at begin */
    char tmp[600];
    assert_ok(dt_ckpt_begin(root, 9, tmp, sizeof tmp));
    dt_ckpt_writer_t *w;
    assert_ok(dt_ckpt_shard_open(tmp, 0, &w));
    dt_ckpt_block_t b = blk2(0, 8, 5, 4, 5, 0, 5);
    assert_status(dt_ckpt_shard_begin_block(w, "head/w", DT_F32, &b),
                  DT_ERR_INVALID);
    assert_msg("shard-00000.bin: entry head/w: block at offsets [4, 0] with "
               "sizes [5, 5] lies outside the tensor's shape [8, 5]");
    b.ndim = 0;
    assert_status(dt_ckpt_shard_begin_block(w, "head/w", DT_F32, &b),
                  DT_ERR_INVALID);
    assert_msg("shard-00000.bin: entry head/w: a block has 1 to 8 dimensions, "
               "not 0");
    dt_ckpt_shard_abort(w);
    assert_ok(dt_ckpt_abort(root, 9));

    /* writer: overlap, gaps (between row blocks, inside rows between
     * column blocks), a tensor outside the entry: each named */
    struct {
        bpiece_t p[2];
        const char *msg;
    } wcases[] = {
        {{{0, 1, 0, 0, blk2(0, 8, 5, 0, 4, 0, 5)},
          {1, 1, 0, 0, blk2(0, 8, 5, 3, 5, 0, 5)}},
         "checkpoint manifest: entry head/w: segments overlap at elements "
         "[15, 20) (block at offsets [0, 0] with sizes [4, 5] in "
         "shard-00000.bin and block at offsets [3, 0] with sizes [5, 5] in "
         "shard-00001.bin); indices [3, 0] to [3, 4] of its shape [8, 5]"},
        {{{0, 1, 0, 0, blk2(0, 8, 5, 0, 3, 0, 5)},
          {1, 1, 0, 0, blk2(0, 8, 5, 4, 4, 0, 5)}},
         "checkpoint manifest: entry head/w: elements [15, 20) are in no "
         "segment; indices [3, 0] to [3, 4] of its shape [8, 5]"},
        {{{0, 1, 0, 0, blk2(0, 8, 5, 0, 8, 0, 2)},
          {1, 1, 0, 0, blk2(0, 8, 5, 0, 8, 3, 2)}},
         "checkpoint manifest: entry head/w: elements [2, 3) are in no "
         "segment; indices [0, 2] to [0, 2] of its shape [8, 5]"},
        {{{0, 1, 0, 0, blk2(0, 8, 5, 0, 8, 0, 5)},
          {1, 1, 0, 0, blk2(30, 3, 5, 0, 1, 0, 5)}},
         "checkpoint manifest: entry head/w: a block's tensor, elements [30, "
         "45), lies outside the entry's 40 elements"},
    };
    for (size_t i = 0; i < sizeof wcases / sizeof *wcases; i++) {
        assert_status(save_head(root, wcases[i].p, 2), DT_ERR_INVALID);
        assert_msg(wcases[i].msg);
        dt_test_assert_no_tmp(root);
    }

    /* reader: manifests edited after the save */
    struct {
        void (*edit)(cJSON *);
        const char *msg;
    } cases[] = {
        {edit_version3, "format_version 3 is newer than this dtrain reads "
                        "(2): load it with the dtrain that wrote it, or a "
                        "newer one"},
        {edit_version1, "entry block.0/params: segment 0 is a block "
                        "(\"offsets\"), which needs format_version 2, but the "
                        "manifest is version 1"},
        {edit_block_overlap, "entry head/w: segments overlap at elements [1, "
                             "2) (block at offsets [0, 0] with sizes [3, 2] in "
                             "shard-00000.bin and block at offsets [0, 1] with "
                             "sizes [3, 3] in shard-00001.bin); indices [0, "
                             "1] to [0, 1] of its shape [8, 5]"},
        {edit_block_gap, "entry head/w: elements [15, 17) are in no segment; "
                         "indices [3, 0] to [3, 1] of its shape [8, 5]"},
        {edit_block_outside, "entry head/w: block at offsets [3, 2] with sizes "
                             "[5, 4] lies outside the tensor's shape [8, 5]"},
        {edit_block_count, "entry head/w: segment 3: \"count\" 14 is not the "
                           "product of \"sizes\" (15)"},
        {edit_block_base, "entry head/w: segment 3: the block's tensor, "
                          "elements [1, 41), lies outside the entry's 40 "
                          "elements"},
    };
    size_t n;
    const bpiece_t *p = block_layout(&n);
    assert_ok(dt_ckpt_step_dir(root, 5, 0, dir, sizeof dir));
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        assert_ok(save_pieces(root, 5, p, n, 4));
        edit_manifest(dir, cases[i].edit);
        dt_ckpt_reader_t *r;
        assert_status(dt_ckpt_open(dir, &r), DT_ERR_DATA);
        snprintf(want, sizeof want, "checkpoint '%s': manifest.json: %s", dir,
                 cases[i].msg);
        assert_msg(want);
    }

    /* reading a block outside the tensor, or its tensor outside the entry */
    assert_ok(save_pieces(root, 5, p, n, 4));
    dt_ckpt_reader_t *r;
    assert_ok(dt_ckpt_open(dir, &r));
    float buf[64];
    b = blk2(0, 6, 10, 0, 6, 8, 3);
    assert_status(dt_ckpt_read_block(r, "block.0/params", &b, buf),
                  DT_ERR_INVALID);
    snprintf(want, sizeof want, "checkpoint '%s': entry block.0/params: block "
             "at offsets [0, 8] with sizes [6, 3] lies outside the tensor's "
             "shape [6, 10]", dir);
    assert_msg(want);
    b = blk2(100, 6, 10, 0, 1, 0, 1);
    assert_status(dt_ckpt_read_block(r, "block.0/params", &b, buf),
                  DT_ERR_INVALID);
    snprintf(want, sizeof want, "checkpoint '%s': entry block.0/params: the "
             "block's tensor, elements [100, 160), lies outside the entry's "
             "127 elements", dir);
    assert_msg(want);
    assert_status(dt_ckpt_read_block(r, "nope", &b, buf), DT_ERR_NOT_FOUND);
    dt_ckpt_close(r);
}

/* A checkpoint of the earliest format, written out by hand: no
 * "format_version" in the manifest, a one-line COMPLETE.  It still opens
 * (as version 1) and reads. */
static void test_old_format_fixture(void **state)
{
    char root[512], dir[600], p[700], man[1024];
    subdir(root, sizeof root, "old-format");
    snprintf(dir, sizeof dir, "%s/step-00000003", root);
    assert_ok(dt_fileutil_mkdir_p(dir));
    const float vals[6] = {0.5f, -1.25f, 2.0f, 3.5f, -4.75f, 6.0f};
    snprintf(p, sizeof p, "%s/shard-00000.bin", dir);
    assert_ok(dt_fileutil_write_atomic(p, vals, 16));
    snprintf(p, sizeof p, "%s/shard-00001.bin", dir);
    assert_ok(dt_fileutil_write_atomic(p, vals + 4, 8));
    int mn = snprintf(man, sizeof man,
        "{\"format\": \"dtrain-checkpoint\", \"step\": 3,\n"
        " \"written_by\": {\"world_size\": 2, \"strategy\": \"ddp\"},\n"
        " \"model\": {}, \"extra\": {},\n"
        " \"files\": {\"shard-00000.bin\": {\"bytes\": 16},\n"
        "           \"shard-00001.bin\": {\"bytes\": 8}},\n"
        " \"entries\": {\"w/params\": {\"dtype\": \"f32\", \"numel\": 6,\n"
        "   \"shape\": [2, 3], \"segments\": [\n"
        "   {\"offset\": 4, \"count\": 2, \"file\": \"shard-00001.bin\","
        " \"byte_offset\": 0, \"crc32\": \"%08x\"},\n"
        "   {\"offset\": 0, \"count\": 4, \"file\": \"shard-00000.bin\","
        " \"byte_offset\": 0, \"crc32\": \"%08x\"}]}}}\n",
        (unsigned)dt_fileutil_crc32(0, vals + 4, 8),
        (unsigned)dt_fileutil_crc32(0, vals, 16));
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    assert_ok(dt_fileutil_write_atomic(p, man, (size_t)mn));
    snprintf(p, sizeof p, "%s/COMPLETE", dir);
    assert_ok(dt_fileutil_write_atomic(p, "dtrain checkpoint complete\n", 27));
    dt_ckpt_reader_t *r;
    assert_ok(dt_ckpt_open(dir, &r));
    assert_int_equal(dt_ckpt_reader_format_version(r), 1);
    assert_int_equal(dt_ckpt_reader_step(r), 3);
    float got[6];
    assert_ok(dt_ckpt_read(r, "w/params", 0, 6, got));
    assert_memory_equal(got, vals, sizeof vals);
    /* column 1 of the [2, 3] entry, as a tensor-parallel rank would ask */
    dt_ckpt_block_t b = blk2(0, 2, 3, 0, 2, 1, 1);
    assert_ok(dt_ckpt_read_block(r, "w/params", &b, got));
    assert_true(got[0] == vals[1] && got[1] == vals[4]);
    assert_ok(dt_ckpt_verify(r));
    dt_ckpt_close(r);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--env-child") == 0) {
        snprintf(g_dir, sizeof g_dir, "%s", argv[2]);
        return env_child();
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32),
        cmocka_unit_test(test_mkdir_rm),
        cmocka_unit_test(test_atomic_write),
        cmocka_unit_test(test_atomic_write_enospc),
        cmocka_unit_test(test_atomic_write_planted_links),
        cmocka_unit_test(test_atomic_write_not_regular),
        cmocka_unit_test(test_output_modes),
        cmocka_unit_test(test_open_output),
        cmocka_unit_test(test_mkdir_parent),
        cmocka_unit_test(test_fault_env),
        cmocka_unit_test(test_roundtrip_3ranks),
        cmocka_unit_test(test_python_reads_checkpoint),
        cmocka_unit_test(test_checksum_mismatch),
        cmocka_unit_test(test_missing_marker),
        cmocka_unit_test(test_missing_and_truncated_shard),
        cmocka_unit_test(test_manifest_inconsistent),
        cmocka_unit_test(test_manifest_checksum),
        cmocka_unit_test(test_ckpt_members_not_regular),
        cmocka_unit_test(test_open_incomplete_warns),
        cmocka_unit_test(test_tensor_table),
        cmocka_unit_test(test_manifest_writer_checks),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_latest_and_prune),
        cmocka_unit_test(test_links_in_ckpt_root),
        cmocka_unit_test(test_json_u64),
        cmocka_unit_test(test_blocks_read_as_ranges),
        cmocka_unit_test(test_ranges_read_as_blocks),
        cmocka_unit_test(test_block_errors),
        cmocka_unit_test(test_old_format_fixture),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
