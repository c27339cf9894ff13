/*
 * core/util/fileutil.h - durable file writes for everything the engine
 * leaves on disk (token files, checkpoints, safetensors exports).
 *
 * A file is never written in place: bytes go to a new temp file beside it,
 * "<path>.tmp.<12 random hex digits>", created with O_EXCL | O_NOFOLLOW (so
 * a link or file another user planted there, at this or any guessable
 * name, is never opened: the name is drawn again), which is fsynced,
 * renamed over <path>, and the directory fsynced.  The directory is held
 * open from start to commit, so the temp file and the rename stay in the
 * same one.  A crash or a full disk therefore leaves either the old file
 * or the new one, never a torn one, and a failed write removes its temp
 * file.  Errors are DT_ERR_IO with "writing '<path>': <strerror>" (e.g.
 * "No space left on device").
 *
 * Only a regular file (or nothing) at <path> is replaced.  Anything else
 * there - a FIFO, a socket, a device, a directory, a symbolic link (to
 * anything: the link is the user's, not ours to turn into a file) - is
 * DT_ERR_IO "writing '<path>': not a regular file (a FIFO): only a regular
 * file is replaced", checked when the write starts (before any byte is
 * written) and again just before the rename, which, when nothing was
 * there, is RENAME_NOREPLACE so nothing that appeared meanwhile is
 * replaced either.  A file written in place (the metrics file, appended
 * line by line) is opened by dt_fileutil_open_output under the same rule,
 * never blocking on a FIFO.
 *
 * Modes follow the umask, as any program's output does: files are created
 * DT_FILEUTIL_FILE_MODE (0666) and folders DT_FILEUTIL_DIR_MODE (0777),
 * less the umask (0644 and 0755 under the usual 022).  The temp file is
 * created with its final mode, so a reader never sees more than the
 * finished file will show.  What holds a secret is not written here and
 * stays 0600 whatever the umask: the shm plugin's segments and the nccl
 * plugin's id file (/dev/shm), the offload_nvme plugin's spill files; the
 * checkpoint folder's LOCK stays 0600 too, since anyone who can open a
 * file can flock it (ckpt_io.h).
 *
 * An interrupted write leaves nothing either: every temp path (the
 * writer's temp file, a checkpoint's "step-N.tmp" directory) is put in a
 * small registry while it exists (dt_cleanup_add / dt_cleanup_remove; plugins
 * reach it through the host table's cleanup_add, dtrain/host.h: the
 * offload_nvme plugin's tier files), and SIGINT and SIGTERM, where they have their default action, get a handler
 * that removes what is registered and then dies of the same signal (the
 * exit status still says "killed by SIGTERM": 128 + 15 in a shell).  The
 * handler is installed at the first registration; a program with its own
 * handler, or one that ignores the signal, keeps it.  SIGKILL cannot be
 * caught: what it leaves, the next run's start removes (checkpoints) or it
 * stays at its random temp name.
 *
 * Reading an input (a token file, a checkpoint's manifest and shards)
 * starts with dt_fileutil_open_input, which opens without blocking and
 * refuses anything but a regular file, so a FIFO or a device in place of a
 * file is an error, not a hang.
 *
 * Fault injection (tests; compiled in only with DTRAIN_TEST_HOOKS, never
 * in a Release build): dt_fileutil_test_fail_after(n), or the environment
 * variable DTRAIN_FAULT_WRITE_AFTER_BYTES=n read at the first write, lets
 * n more bytes through every write made here (process-wide, summed over
 * files) and then fails writes with ENOSPC, as a disk that fills up would.
 * dt_fileutil_test_fail_fsync_after(n) / DTRAIN_FAULT_FSYNC_AFTER=n does
 * the same for fsync (n more fsyncs succeed, then ENOSPC), since on NFS
 * and thin provisioned storage a full disk often shows up only at fsync.
 * With DTRAIN_FAULT_STOP_ON_FULL=1 the process SIGSTOPs itself at that
 * point instead, so a test can SIGKILL it mid-write (a crash rather than
 * an error).
 *
 * Checksums are CRC-32 (ISO-HDLC, zlib's crc32: the value Python's
 * zlib.crc32 and `gzip` compute), so a checkpoint shard can be verified with
 * standard tools.
 *
 * Thread safety: every function may be called from any thread; one
 * dt_afile_t is used by one thread at a time.
 */
#ifndef DT_UTIL_FILEUTIL_H
#define DT_UTIL_FILEUTIL_H

#include <stddef.h>
#include <stdint.h>

/* An atomic streaming writer: the target appears only at commit. */
typedef struct dt_afile dt_afile_t;

/* Start writing `path` (its folder must exist: "writing '<path>': the
 * folder '<dir>' does not exist" else; dt_fileutil_mkdir_parent makes it).
 * Refused when something other than a regular file is at `path` (see the
 * top of this file).  *out is released by exactly one of dt_afile_commit /
 * dt_afile_abort. */
int dt_afile_open(const char *path, dt_afile_t **out);
/* Append `n` bytes.  On failure the writer stays open (the caller still
 * aborts it) and the error names the target path. */
int dt_afile_write(dt_afile_t *f, const void *buf, size_t n);
/* Bytes appended so far (the offset the next write lands at). */
uint64_t dt_afile_offset(const dt_afile_t *f);
/* Flush, fsync, rename over the target (still nothing or a regular file:
 * checked again), fsync the directory; frees `f`.  On failure the temp
 * file is removed and any previous file is untouched. */
int dt_afile_commit(dt_afile_t *f);
/* Remove the temp file and free `f`; the previous file is untouched.
 * abort(NULL) is a no-op. */
void dt_afile_abort(dt_afile_t *f);

/* What dt_cleanup_add removes at `path`. */
enum {
    DT_CLEANUP_FILE = 0,      /* a file (unlink; a link as a link) */
    DT_CLEANUP_TREE = 1,      /* a directory and the files in it, one level,
                               * links as links */
    DT_CLEANUP_EMPTY_DIR = 2  /* a directory, only if empty once every file
                               * and tree is removed (rmdir; deepest first
                               * whatever the order of registration) */
};

/* Remove `path` as `kind` says (DT_CLEANUP_*) should the process get
 * SIGINT or SIGTERM before dt_cleanup_remove(path).  A relative path is
 * taken from the working folder at the signal (the core never changes
 * it).  DT_OK; DT_ERR_NOMEM when DT_CLEANUP_MAX paths are registered
 * already; DT_ERR_INVALID for a path of PATH_MAX bytes or more, empty, or
 * an unknown kind (nothing registered then: the path is only left behind
 * as without the registry).  Sets no error message: callers say what it
 * means for them. */
#define DT_CLEANUP_MAX 64
int dt_cleanup_add(const char *path, int kind);
/* Forget `path` (the string given to dt_cleanup_add); unknown: a no-op. */
void dt_cleanup_remove(const char *path);

/* Write `n` bytes as the whole content of `path`, atomically. */
int dt_fileutil_write_atomic(const char *path, const void *buf, size_t n);

/* What st_mode `m` is, for messages: "a FIFO", "a directory", "a
 * character device", "a block device", "a socket", "a symbolic link",
 * "a regular file", else "of an unknown type". */
const char *dt_fileutil_file_type(unsigned m);

/* The modes files and folders are created with, less the umask. */
#define DT_FILEUTIL_FILE_MODE 0666
#define DT_FILEUTIL_DIR_MODE 0777

/* DT_OK when `path` names nothing (*exists = 0) or a regular file
 * (*exists = 1), looked at without following a link: what an output may
 * replace.  Else DT_ERR_IO "writing '<path>': not a regular file (a FIFO):
 * only a regular file is replaced" (a socket, a directory, a character
 * device, a block device, a symbolic link), or the strerror of lstat.
 * `exists` may be NULL. */
int dt_fileutil_check_output(const char *path, int *exists);

/* dt_fileutil_open_output's flags. */
#define DT_FILEUTIL_APPEND 1 /* keep what is there and append; else truncate */

/* Open `path` for writing in place (a metrics file, appended line by
 * line), creating it (DT_FILEUTIL_FILE_MODE less the umask) if missing:
 * refused, as dt_fileutil_check_output says, unless nothing or a regular
 * file is there, and opened with O_NOFOLLOW | O_NONBLOCK so neither a link
 * nor a FIFO or device swapped in meanwhile is written through or blocks
 * the open (fstat checks the result; the fd is then blocking again).
 * Truncated after those checks unless DT_FILEUTIL_APPEND.  *fd
 * close-on-exec.  Errors are DT_ERR_IO "<what>: not a regular file (a
 * FIFO): only a regular file is replaced" (as dt_fileutil_check_output,
 * also for a link or a FIFO swapped in after its look), or "<what>:
 * <strerror>". */
int dt_fileutil_open_output(const char *path, int flags, const char *what, int *fd);

/* dt_fileutil_open_input's flags. */
#define DT_FILEUTIL_NOFOLLOW 1 /* a symbolic link at `path` is refused */

/* Open `path` read-only as an input: opened with O_NONBLOCK (a FIFO or a
 * device cannot block the open), checked with fstat to be a regular file,
 * then switched back to blocking reads.  *fd (close-on-exec) and *size
 * (bytes; may be NULL) on success.  Errors, each prefixed "<what>: ":
 * DT_ERR_NOT_FOUND "No such file or directory"; DT_ERR_IO "not a regular
 * file (a FIFO)" (or a directory, a character device, a block device, a
 * socket), "a symbolic link, refused" (with DT_FILEUTIL_NOFOLLOW), or the
 * strerror of a failed open. */
int dt_fileutil_open_input(const char *path, int flags, const char *what,
                           int *fd, uint64_t *size);
/* Read a whole input file (dt_fileutil_open_input, so never blocking on a
 * FIFO) into a malloc'd buffer (NUL-terminated for text callers; *n
 * excludes the NUL).  Caller frees *buf.  Messages start "reading
 * '<path>': ". */
int dt_fileutil_read_all(const char *path, char **buf, size_t *n);
/* The same from an fd opened by dt_fileutil_open_input, `size` bytes as
 * its fstat said, at most `max` (larger: DT_ERR_DATA "... is N bytes, more
 * than the M expected"); `what` prefixes messages.  The fd stays open. */
int dt_fileutil_read_fd(int fd, uint64_t size, uint64_t max, const char *what,
                        char **buf, size_t *n);

/* mkdir -p, each folder made DT_FILEUTIL_DIR_MODE less the umask (as
 * mkdir -p does); an existing directory is fine. */
int dt_fileutil_mkdir_p(const char *path);
/* mkdir -p of the folder that will hold file `path` (nothing to do for a
 * bare name): outputs the user names (export, data prepare, plot -o) may
 * go into folders that do not exist yet.  Errors name the folder. */
int dt_fileutil_mkdir_parent(const char *path);
/* Remove a file or a directory tree (rm -rf); a missing path is fine.
 * Symbolic links are never followed: a link (at `path` or anywhere inside)
 * is removed as a link and what it points to is untouched; directories are
 * walked through descriptors (openat with O_NOFOLLOW | O_DIRECTORY,
 * fstatat with AT_SYMLINK_NOFOLLOW, unlinkat), so a directory swapped for
 * a link during the walk is not followed either. */
int dt_fileutil_rm_rf(const char *path);
/* fsync a directory so a rename or create inside it is durable. */
int dt_fileutil_fsync_dir(const char *dir);
/* fsync an open file descriptor, through the fault hook; `what` names the
 * file in the error. */
int dt_fileutil_fsync_fd(int fd, const char *what);
/* Write all of buf to fd (EINTR and short writes handled), through the
 * fault hook.  Sets errno and returns -1 on failure, else 0. */
int dt_fileutil_write_fd(int fd, const void *buf, size_t n);

/* CRC-32 (zlib's polynomial).  Start with crc = 0; chain by passing the
 * previous result. */
uint32_t dt_fileutil_crc32(uint32_t crc, const void *buf, size_t n);

#ifdef DTRAIN_TEST_HOOKS
/* Fault hooks; a negative value disarms.  See the top of this file. */
void dt_fileutil_test_fail_after(int64_t bytes);
void dt_fileutil_test_fail_fsync_after(int64_t n_fsyncs);
#endif

#endif /* DT_UTIL_FILEUTIL_H */
