/*
 * core/ckpt/ckpt_io.h - the on-disk checkpoint format: sharded, described
 * by global ranges, so any strategy at any world size can load it.
 *
 * Layout of one checkpoint:
 *
 *   <root>/step-00000200/
 *       shard-00000.bin   raw concatenated segments written by rank 0
 *       shard-00001.bin   ... one file per writing rank
 *       manifest.json     what every segment is (below)
 *       COMPLETE          written last; a directory without it is never
 *                         loaded.  Two lines: "dtrain checkpoint complete"
 *                         and "manifest.json <bytes> bytes crc32 <8 hex>",
 *                         the manifest's size and CRC-32, checked when the
 *                         checkpoint is opened ("checksum mismatch ...: it
 *                         was edited or damaged after the save").  Markers
 *                         of older dtrains have the first line only: such
 *                         checkpoints load, with a warning, their manifest
 *                         checked for consistency alone.
 *
 * An ENTRY is one named flat array, e.g. "block.3/params" (a unit's state
 * kind).  A SEGMENT is a piece of one entry stored contiguously at some
 * byte offset of one shard file, with its CRC-32 (zlib's).  It is either
 *   - a FLAT RANGE: the global elements [offset, offset+count) (what
 *     data-parallel strategies own: a slice of a flat buffer), or
 *   - a BLOCK (format_version 2): a rectangular block of a tensor that
 *     lies inside the entry, as PyTorch's distributed checkpoint describes
 *     a chunk: the tensor starts at element "base" of the entry and has
 *     the global row-major "shape"; the block covers indices
 *     [offsets[d], offsets[d] + sizes[d]) of each dimension d, and its
 *     data is stored row-major (what a tensor-parallel shard of a 2-D
 *     weight is: a column split of [rows, cols] is not one contiguous
 *     range of the flat index space).  The tensor may be the whole entry
 *     (base 0, the entry's shape) or one tensor of the tensor table.
 * Across all shards the segments of an entry cover [0, numel) exactly
 * once; the writer and the reader both check it, and say where a gap or
 * an overlap is.  Nothing in the format depends on how many ranks wrote it
 * or how they split the state: a reader asks for any global range or block
 * and gets it assembled from whichever segments overlap it, flat or block.
 *
 * Versions: "format_version" says which format the manifest is in.  The
 * writer states the lowest version that describes what it writes: 1 when
 * every segment is a flat range (exactly the format older dtrains write
 * and read, so they can still load it), 2 when any segment is a block.  A
 * flat range is always written as a flat range, never as a 1-D block: it
 * is the common case, every older reader and the plain-Python recipe
 * (json + zlib.crc32) read it, and a flat slice of a 2-D tensor that
 * crosses a row is no block anyway.  The reader takes versions 1 and 2;
 * a manifest without "format_version" (the earliest dtrains') is version
 * 1; a newer version is refused ("manifest.json: format_version 3 is newer
 * than this dtrain reads (2): ...").
 *
 * manifest.json:
 *   { "format": "dtrain-checkpoint", "format_version": 1, "step": 200,
 *     "written_by": {"world_size": 3, "strategy": "fsdp"},  (informational)
 *     "model": {...caller's...}, "extra": {...caller's...},
 *     "files": {"shard-00000.bin": {"bytes": 4096}, ...},
 *     "entries": {"block.3/params": {"dtype": "f32", "numel": 1024,
 *         "shape": [32, 32],                                  (optional)
 *         "segments": [{"offset": 0, "count": 512,
 *                       "file": "shard-00000.bin", "byte_offset": 0,
 *                       "crc32": "9f12ab34"}, ...]}, ...} }
 *   A block segment (version 2) has, instead of "offset":
 *       {"base": 0, "shape": [768, 2304], "offsets": [0, 1152],
 *        "sizes": [768, 1152], "count": 884736, "file": ...,
 *        "byte_offset": ..., "crc32": ...}
 *   ("count" is the product of "sizes", stated for readers that sum bytes).
 *   Integers are exact JSON numbers up to 2^53.
 *   "model" is the caller's, except one key the format reads: "tensors",
 *   the tensor table, an optional array of {"name", "unit", "offset",
 *   "shape"} placing parameter tensors in the entries "<unit>/params".
 *   When present it is checked at open: names unique, shapes of whole
 *   dimensions >= 1, each tensor inside an existing entry, and the tensors
 *   of every "<unit>/params" entry covering each of its elements exactly
 *   once ("entry block.0/params: tensors overlap at elements [64, 96)
 *   (h.0.ln_1.bias and h.0.attn.c_attn.weight)"; an empty table leaves
 *   every such entry uncovered, also an error).
 *
 * Writing (the directory is built as "step-XXXXXXXX.tmp" and renamed into
 * place after COMPLETE, so an interrupted or failed save never looks
 * complete and the previous checkpoint survives):
 *
 *   rank 0:     dt_ckpt_begin(root, step, tmp_dir)         -> barrier
 *   every rank: dt_ckpt_shard_open(tmp_dir, rank) ; dt_ckpt_shard_begin,
 *               _append*, _end per segment ;
 *               dt_ckpt_shard_close -> its dt_ckpt_seg_t[] -> gather to 0
 *   rank 0:     dt_ckpt_write_manifest(tmp_dir, info, entries, all segs)
 *               dt_ckpt_commit(root, step)
 *   on any failure, rank 0: dt_ckpt_abort(root, step) removes the tmp dir;
 *               every other rank: dt_ckpt_abort_shard(root, step, rank)
 *               removes its shard and the dir once empty (rank 0's removal
 *               may race a peer still writing, and a comm failure leaves
 *               no way to wait for it: whoever finishes last removes it).
 *
 * dt_ckpt_seg_t and dt_ckpt_entry_t are plain fixed-size structs (no
 * pointers) so they can be sent between ranks as bytes.
 *
 * Errors: reading names the checkpoint, the file and the entry,
 * "checkpoint 'runs/x/ckpt/step-00000200': shard-00000.bin: entry
 * block.3/params: checksum mismatch (expected 9f12ab34, got 41aa0c11)"
 * (DT_ERR_DATA); a missing COMPLETE marker is DT_ERR_DATA "incomplete (no
 * COMPLETE marker): the write was interrupted" (offline tools may read
 * such a checkpoint anyway, warned: DT_CKPT_OPEN_INCOMPLETE); I/O failures
 * are DT_ERR_IO.
 *
 * Implemented in core/ckpt/: ckpt_format.c (shard names, the tiling rule,
 * exact JSON integers, the JSON helpers below), ckpt_write.c (shard
 * writers, the manifest), ckpt_dir.c (step directories: begin, commit,
 * abort, finding and pruning) and ckpt_read.c (the reader); what they
 * share is in ckpt_internal.h.
 */
#ifndef DT_CKPT_IO_H
#define DT_CKPT_IO_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#define DT_CKPT_FORMAT "dtrain-checkpoint"
#define DT_CKPT_FORMAT_VERSION 2     /* the newest version read/written */
#define DT_CKPT_FORMAT_VERSION_FLAT 1 /* flat ranges only */
#define DT_CKPT_NAME_MAX 128 /* entry names, NUL included */
#define DT_CKPT_MAX_DIMS 8

/* One named flat array. */
typedef struct dt_ckpt_entry {
    char name[DT_CKPT_NAME_MAX]; /* "block.3/params" */
    int32_t dtype;               /* dt_dtype_t */
    int32_t ndim;                /* 0: no shape recorded */
    uint64_t numel;              /* global elements */
    int64_t shape[DT_CKPT_MAX_DIMS]; /* global shape, row-major */
} dt_ckpt_entry_t;

/* A block of a tensor lying inside an entry: the tensor starts at
 * element `base` of the entry and has the global row-major shape
 * shape[0..ndim); the block is indices [start[d], start[d] + size[d]) of
 * every dimension d.  Its elements, row-major, are the block's data.
 * Example: rank 1 of a 2-way column split (tensor parallel) of a
 * [768, 2304] weight at element 0: {0, 2, {768, 2304}, {0, 1152},
 * {768, 1152}}. */
typedef struct dt_ckpt_block {
    uint64_t base;                   /* the tensor's first element in the entry */
    int32_t ndim;                    /* 1 .. DT_CKPT_MAX_DIMS */
    int32_t reserved0;               /* 0 */
    uint64_t shape[DT_CKPT_MAX_DIMS]; /* the tensor's global shape, each >= 1 */
    uint64_t start[DT_CKPT_MAX_DIMS]; /* the block's first index per dimension */
    uint64_t size[DT_CKPT_MAX_DIMS];  /* the block's extent per dimension */
} dt_ckpt_block_t;

/* One stored piece of an entry (what a shard writer returns): a flat
 * range, or a block when block.ndim > 0. */
typedef struct dt_ckpt_seg {
    char entry[DT_CKPT_NAME_MAX];
    uint64_t offset;      /* first element, in the entry's global space (of
                           * a block: its first element's, informational) */
    uint64_t count;       /* elements (of a block: the product of sizes) */
    uint64_t byte_offset; /* where the data starts in the shard file */
    uint32_t shard;       /* the file: shard-<shard, 5 digits>.bin */
    uint32_t crc32;       /* of the count * dtype-size bytes */
    int32_t dtype;        /* dt_dtype_t, equal to the entry's */
    int32_t reserved0;
    dt_ckpt_block_t block; /* ndim 0: a flat range */
} dt_ckpt_seg_t;

/* What the manifest records besides entries. */
typedef struct dt_ckpt_info {
    uint64_t step;
    uint32_t world_size;   /* informational: who wrote it */
    const char *strategy;  /* informational; NULL = "" */
    const cJSON *model;    /* arch / hyper-parameters; copied; NULL = {} */
    const cJSON *extra;    /* RNG, data loader, optimizer step...; copied;
                            * NULL = {} */
} dt_ckpt_info_t;

/* ---- writing --------------------------------------------------------- */

/* "<root>/step-%08llu" (and with ".tmp" when tmp) into buf[cap]. */
int dt_ckpt_step_dir(const char *root, uint64_t step, int tmp, char *buf,
                     size_t cap);

/* Create <root> if needed and a fresh "<root>/step-XXXXXXXX.tmp" (a stale
 * one from an earlier crash is removed); its path goes to tmp_dir[cap]. */
int dt_ckpt_begin(const char *root, uint64_t step, char *tmp_dir, size_t cap);

typedef struct dt_ckpt_writer dt_ckpt_writer_t;

/* Start shard file `shard` (normally the rank) inside tmp_dir. */
int dt_ckpt_shard_open(const char *tmp_dir, uint32_t shard,
                       dt_ckpt_writer_t **out);
/* Write one segment, streamed: `count` elements of `dtype` at global
 * `offset` of entry `entry` (count 0 is accepted and records nothing):
 * begin, then append exactly count * size bytes in any pieces (e.g. as
 * they come off a device), then end.  On failure the writer stays open:
 * the caller aborts it (and rank 0 aborts the whole save). */
int dt_ckpt_shard_begin(dt_ckpt_writer_t *w, const char *entry, int dtype,
                        uint64_t offset, uint64_t count);
int dt_ckpt_shard_append(dt_ckpt_writer_t *w, const void *data,
                         size_t nbytes);
int dt_ckpt_shard_end(dt_ckpt_writer_t *w);
/* The same for a block of a tensor of `entry` (a tensor-parallel shard):
 * begin_block, then append the block's elements row-major (product of
 * b->size elements, in any pieces), then dt_ckpt_shard_end.  The block
 * must lie inside its tensor's shape (DT_ERR_INVALID "<file>: entry E:
 * block at offsets [4, 0] with sizes [5, 8] lies outside the tensor's
 * shape [8, 8]"); that the tensor lies inside the entry, and that all
 * segments cover the entry once, dt_ckpt_write_manifest checks.  A block
 * with a size 0 records nothing.  A manifest holding a block is written
 * as format_version 2. */
int dt_ckpt_shard_begin_block(dt_ckpt_writer_t *w, const char *entry,
                              int dtype, const dt_ckpt_block_t *b);
/* Make the shard durable and hand back its segments (*segs malloc'd, the
 * caller frees it; *n may be 0).  Frees `w` whatever happens; on failure
 * nothing of the shard is left. */
int dt_ckpt_shard_close(dt_ckpt_writer_t *w, dt_ckpt_seg_t **segs,
                        size_t *n);
/* Drop the shard (no file left).  abort(NULL) is a no-op. */
void dt_ckpt_shard_abort(dt_ckpt_writer_t *w);
/* A deferred shard (an asynchronous save, checkpoint.async): the appended
 * bytes stay in memory (starting in `buf` of `cap` bytes, the previous
 * save's, which the writer owns from here; NULL: a new one), unchecksummed;
 * dt_ckpt_shard_reserve hands out the next `nbytes` of the open segment's
 * memory to be filled in place (valid until the next append or reserve),
 * so a snapshot is copied once.  dt_ckpt_shard_close only checks that no
 * segment is open and keeps `w`; dt_ckpt_shard_finish (on any one thread)
 * then computes each segment's CRC-32, writes, fsyncs and commits the
 * file, hands back the segments (*segs malloc'd, NULL on failure) and the
 * memory in *buf, *cap for the next save, and frees `w`
 * (dt_ckpt_shard_abort instead drops it all). */
int dt_ckpt_shard_open_deferred(const char *tmp_dir, uint32_t shard, void *buf, size_t cap,
                                dt_ckpt_writer_t **out);
int dt_ckpt_shard_reserve(dt_ckpt_writer_t *w, size_t nbytes, void **dst);
int dt_ckpt_shard_finish(dt_ckpt_writer_t *w, dt_ckpt_seg_t **segs, size_t *n, void **buf,
                         size_t *cap);

/* Rank 0: check that the segments partition every entry exactly (names,
 * dtypes, blocks inside the entry, no gap, no overlap; DT_ERR_INVALID
 * naming the entry and range otherwise) and write manifest.json into
 * tmp_dir, as format_version 1 when every segment is a flat range, 2
 * otherwise. */
int dt_ckpt_write_manifest(const char *tmp_dir, const dt_ckpt_info_t *info,
                           const dt_ckpt_entry_t *entries, size_t n_entries,
                           const dt_ckpt_seg_t *segs, size_t n_segs);

/* Rank 0, last: write COMPLETE (with the manifest's size and CRC-32, read
 * back from the file), sync, and rename the tmp dir to
 * "<root>/step-XXXXXXXX" (replacing an older save of the same step). */
int dt_ckpt_commit(const char *root, uint64_t step);

/* Remove "<root>/step-XXXXXXXX.tmp" (after a failed save). */
int dt_ckpt_abort(const char *root, uint64_t step);
/* Any other rank, after a failed save: remove its own shard of it and the
 * tmp dir if nothing else is left in it. */
int dt_ckpt_abort_shard(const char *root, uint64_t step, uint32_t shard);

/* ---- finding and pruning --------------------------------------------- */

/* The complete checkpoint with the highest step under root: its directory
 * into dir[cap] and its step into *step.  DT_ERR_NOT_FOUND when none.
 * Only real directories owned by this user count: a step name that is a
 * symbolic link (say, to another run's checkpoint), a file, or another
 * user's directory is skipped with a warning on the log ("checkpoint
 * folder '<root>': ignoring 'step-00000009': a symbolic link, not a
 * directory"). */
int dt_ckpt_latest(const char *root, char *dir, size_t cap, uint64_t *step);

/* Delete complete checkpoints beyond the `keep` newest (keep >= 1), the
 * same ones dt_ckpt_latest counts: what it skips is never touched, and
 * removal never follows a link.  Incomplete and tmp directories are left
 * alone (a save may be running). */
int dt_ckpt_prune(const char *root, uint32_t keep);

/* Remove leftovers of interrupted saves under root ("step-*.tmp", and
 * "step-*.old" from replacing a step on filesystems without atomic
 * exchange).  Call at startup, before this run saves anything. */
int dt_ckpt_clean_stale(const char *root);

/* Hold root's lock for as long as this process keeps *fd open (closing it,
 * or the process ending however, releases it): "<root>/LOCK", created
 * 0600 and never through a link, flock'ed exclusively without waiting,
 * this process's pid written in it.  Creates root.  A second holder gets
 * DT_ERR_IO "checkpoint folder 'R' is in use by another run (process P
 * holds 'R/LOCK'): ...". */
int dt_ckpt_lock(const char *root, int *fd);

/* A fresh run (no resume) is about to save into root: with complete
 * checkpoints there (those dt_ckpt_latest would resume from), DT_ERR_CONFIG
 * naming the folder and the three ways on (prefixed "<cfg_path>: "), or,
 * with `overwrite`, they are removed (links are skipped, never followed).
 * An empty or missing folder: DT_OK. */
int dt_ckpt_claim_fresh(const char *root, int overwrite, const char *cfg_path);

/* Remove every complete checkpoint of root but step `step` (links are
 * skipped, never followed; incomplete ones are left to
 * dt_ckpt_clean_stale); *removed (may be NULL) counts them.  What
 * `dtrain import --overwrite` does once its step 0 is in place. */
int dt_ckpt_remove_others(const char *root, uint64_t step, size_t *removed);

/* ---- reading --------------------------------------------------------- */

typedef struct dt_ckpt_reader dt_ckpt_reader_t;

/* Open a checkpoint directory (a "step-XXXXXXXX"): COMPLETE present and
 * its checksum of manifest.json matching, manifest valid, every shard file
 * present with the size the manifest says, segments holding no more bytes
 * than the shard files and partitioning each entry, the tensor table (if
 * any) tiling each "<unit>/params" entry.
 * CRCs are checked as data is read.  Every file is opened without
 * following a link or blocking (a link, a FIFO: DT_ERR_IO naming it). */
int dt_ckpt_open(const char *dir, dt_ckpt_reader_t **out);
/* dt_ckpt_open's flags. */
#define DT_CKPT_OPEN_INCOMPLETE 1u /* offline tools: read a checkpoint
                                    * without COMPLETE, after a warning on
                                    * the log that it may be partial */
int dt_ckpt_open_flags(const char *dir, unsigned flags, dt_ckpt_reader_t **out);
void dt_ckpt_close(dt_ckpt_reader_t *r);

uint64_t dt_ckpt_reader_step(const dt_ckpt_reader_t *r);
uint32_t dt_ckpt_reader_world_size(const dt_ckpt_reader_t *r);
const char *dt_ckpt_reader_strategy(const dt_ckpt_reader_t *r);
/* The caller's JSON, owned by the reader (valid until close). */
const cJSON *dt_ckpt_reader_model(const dt_ckpt_reader_t *r);
const cJSON *dt_ckpt_reader_extra(const dt_ckpt_reader_t *r);

size_t dt_ckpt_n_entries(const dt_ckpt_reader_t *r);
/* i-th entry in manifest order (NULL when out of range). */
const dt_ckpt_entry_t *dt_ckpt_entry_at(const dt_ckpt_reader_t *r, size_t i);
/* The manifest's format_version (1 for a manifest without one). */
uint32_t dt_ckpt_reader_format_version(const dt_ckpt_reader_t *r);
/* Segments of the i-th entry, ordered by (first element) offset: the
 * count, and the k-th (NULL when out of range); a block has block.ndim >
 * 0. */
size_t dt_ckpt_entry_n_segments(const dt_ckpt_reader_t *r, size_t i);
const dt_ckpt_seg_t *dt_ckpt_segment_at(const dt_ckpt_reader_t *r, size_t entry, size_t k);
/* Shard files: the count, and the i-th's name and size. */
size_t dt_ckpt_n_files(const dt_ckpt_reader_t *r);
const char *dt_ckpt_file_at(const dt_ckpt_reader_t *r, size_t i, uint64_t *bytes);
/* Entry by name, or NULL. */
const dt_ckpt_entry_t *dt_ckpt_find(const dt_ckpt_reader_t *r,
                                    const char *name);

/* One parameter tensor of the tensor table: where it lies in its entry. */
typedef struct dt_ckpt_tensor {
    char name[DT_CKPT_NAME_MAX];  /* "h.0.attn.c_attn.weight" */
    char entry[DT_CKPT_NAME_MAX]; /* "<unit>/params": "block.0/params" */
    uint64_t offset;              /* first element in the entry */
    uint64_t numel;               /* product of shape */
    int32_t ndim;                 /* 1 .. DT_CKPT_MAX_DIMS */
    int32_t reserved0;
    int64_t shape[DT_CKPT_MAX_DIMS]; /* row-major, each >= 1 */
} dt_ckpt_tensor_t;

/* Whether the manifest has a tensor table (older ones do not). */
int dt_ckpt_has_tensors(const dt_ckpt_reader_t *r);
/* Its tensors in manifest order: the count, the i-th (NULL when out of
 * range), and one by name (NULL when absent). */
size_t dt_ckpt_n_tensors(const dt_ckpt_reader_t *r);
const dt_ckpt_tensor_t *dt_ckpt_tensor_at(const dt_ckpt_reader_t *r, size_t i);
const dt_ckpt_tensor_t *dt_ckpt_find_tensor(const dt_ckpt_reader_t *r,
                                            const char *name);

/* Read global elements [offset, offset+count) of `entry` into dst (raw,
 * in the entry's dtype), assembled from whatever segments hold them, flat
 * ranges or blocks.  Each segment's CRC is verified the first time any
 * part of it is read (the whole segment is streamed once for that).  Not
 * thread-safe: one reader per thread. */
int dt_ckpt_read(dt_ckpt_reader_t *r, const char *entry, uint64_t offset,
                 uint64_t count, void *dst);
/* Read a block of a tensor of `entry` (what a tensor-parallel rank loads:
 * its block of a weight, whatever layout saved it) into dst, row-major,
 * product of b->size elements.  DT_ERR_INVALID when the block lies
 * outside its tensor's shape or the tensor outside the entry ("checkpoint
 * 'D': entry E: block at offsets [..] with sizes [..] lies outside the
 * tensor's shape [..]"). */
int dt_ckpt_read_block(dt_ckpt_reader_t *r, const char *entry,
                       const dt_ckpt_block_t *b, void *dst);

/* Verify every segment's CRC (for `dtrain ckpt verify`). */
int dt_ckpt_verify(dt_ckpt_reader_t *r);

/* ---- JSON helpers for 64-bit values in model/extra ------------------- */

/* JSON numbers are doubles: 64-bit values (RNG states, token counters) are
 * stored as decimal strings. */
int dt_ckpt_json_add_u64(cJSON *obj, const char *key, uint64_t v);

#endif /* DT_CKPT_IO_H */
