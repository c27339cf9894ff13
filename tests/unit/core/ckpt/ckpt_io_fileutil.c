/*
 * tests/unit/core/ckpt/ckpt_io_fileutil.c - atomic file writes
 * (core/util/fileutil): CRC-32, mkdir and rm -rf, write_atomic and its full
 * disk, links and non-regular files planted where it writes, output modes,
 * open_output, parent folders and the fault-injection environment.
 */
#include "ckpt_io_test.h"

/* ---- fileutil -------------------------------------------------------- */

void test_crc32(void **state)
{
    /* The CRC-32 check value (zlib, gzip, Python's zlib.crc32). */
    assert_int_equal(dt_fileutil_crc32(0, "123456789", 9), 0xCBF43926u);
    uint32_t c = dt_fileutil_crc32(0, "1234", 4);
    assert_int_equal(dt_fileutil_crc32(c, "56789", 5), 0xCBF43926u);
    assert_int_equal(dt_fileutil_crc32(0, "", 0), 0);
}

void test_mkdir_rm(void **state)
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

void test_atomic_write(void **state)
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

void test_atomic_write_enospc(void **state)
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
void test_atomic_write_planted_links(void **state)
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
void test_atomic_write_not_regular(void **state)
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
void test_output_modes(void **state)
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
void test_open_output(void **state)
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
void test_mkdir_parent(void **state)
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
int env_child(void)
{
    char p[600];
    snprintf(p, sizeof p, "%s/envchild.bin", g_dir);
    int rc = dt_fileutil_write_atomic(p, "0123456789abcdef", 16);
    int ok = rc == DT_ERR_IO && strstr(dt_last_error(), "No space left") &&
             access(p, F_OK) != 0;
    return ok ? 0 : 1;
}

void test_fault_env(void **state)
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
