/*
 * core/ckpt/ckpt_internal.h - what the four files behind ckpt_io.h share:
 * the names inside a checkpoint directory and the COMPLETE marker's
 * lines, the rule that segments (and tensors) tile an entry, and exact
 * JSON integers.  Internal to core/ckpt (ckpt_format.c,
 * ckpt_write.c, ckpt_dir.c, ckpt_read.c); everyone else uses ckpt_io.h.
 */
#ifndef DT_CKPT_INTERNAL_H
#define DT_CKPT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "ckpt/ckpt_io.h"

#define MANIFEST "manifest.json"
#define MARKER "COMPLETE"
#define LOCK_FILE "LOCK" /* held by the run writing the folder */
/* Largest integer a JSON number (a double) holds exactly. */
#define JSON_INT_MAX (UINT64_C(1) << 53)

/* "shard-<shard, 5 digits>.bin" into buf[cap]. */
void dt_ckpt_shard_name(uint32_t shard, char *buf, size_t cap);

/* "<dir>/<name>" into buf[cap]; DT_ERR_INVALID when it does not fit. */
int dt_ckpt_join(char *buf, size_t cap, const char *dir, const char *name);

/* One element range of an entry for the tiling check: a segment (name
 * NULL) or a tensor of the tensor table (its name, said in messages). */
typedef struct dt_ckpt_span {
    uint64_t offset, count;
    const char *name;
} dt_ckpt_span_t;

/* Spans of entry e, sorted by offset, must tile [0, e->numel) exactly
 * once: DT_OK, or DT_ERR_DATA naming the gap or overlap (and the spans'
 * names), e.g. "<where>entry block.0/params: tensors overlap at elements
 * [64, 96) (h.0.ln_1.bias and h.0.attn.c_attn.weight)", and for an entry
 * of 2 or more dimensions where that is in it ("...: elements [15, 17)
 * are in no segment; indices [3, 0] to [3, 1] of its shape [8, 5]");
 * `noun` is "segment" or "tensor".  The writer checks the segments the
 * manifest will record, the reader the segments and tensors it records. */
int dt_ckpt_check_tiling(const char *where, const dt_ckpt_entry_t *e,
                         const char *noun, const dt_ckpt_span_t *s, size_t n);

/* "[a, b, c]": n values into buf[cap], for messages. */
void dt_ckpt_dims_str(const uint64_t *v, int n, char *buf, size_t cap);

/* A block well formed and inside its tensor: ndim 1..DT_CKPT_MAX_DIMS,
 * every dimension >= 1, the tensor at most 2^53 elements from base, and
 * start + size <= shape in every dimension; *count set to its elements
 * and *first to its first element's position in the entry.  Otherwise
 * `code` with "<where>entry E: block at offsets [4, 0] with sizes [5, 8]
 * lies outside the tensor's shape [8, 8]" (or what else is wrong). */
int dt_ckpt_block_check(int code, const char *where, const char *entry,
                        const dt_ckpt_block_t *b, uint64_t *count,
                        uint64_t *first);

/* Visit the contiguous runs of entry elements a block covers, in the
 * block's row-major order: fn(ctx, entry_offset, count, block_elem) with
 * block_elem the run's first element's index in the block's data.
 * Trailing dimensions the block spans whole merge into one run.  Stops at
 * fn's first non-zero return and returns it.  The block is checked. */
int dt_ckpt_block_runs(const dt_ckpt_block_t *b,
                       int (*fn)(void *ctx, uint64_t offset, uint64_t count,
                                 uint64_t block_elem),
                       void *ctx);

/* A contiguous run of one segment's data: entry elements [offset,
 * offset+count) are elements [seg_elem, seg_elem+count) of segment `seg`
 * (an index into the array given to dt_ckpt_pieces).  A flat range is one
 * piece, a block one per run. */
typedef struct dt_ckpt_piece {
    uint64_t offset, count;
    uint64_t seg_elem;
    size_t seg;
} dt_ckpt_piece_t;

/* The pieces of entry e's n segments (blocks already checked), sorted by
 * offset, checked to cover [0, e->numel) exactly once: on a gap or an overlap
 * dt_ckpt_check_tiling's DT_ERR_DATA, an overlap naming both segments
 * ("... segments overlap at elements [20, 24) (block at offsets [0, 0]
 * with sizes [3, 8] in shard-00000.bin and flat range [16, 32) in
 * shard-00001.bin)").  *out malloc'd (the caller frees it). */
int dt_ckpt_pieces(const char *where, const dt_ckpt_entry_t *e,
                   const dt_ckpt_seg_t *const *segs, size_t n,
                   dt_ckpt_piece_t **out, size_t *n_out);

/* The first line of COMPLETE, and the second, which vouches for the
 * manifest: "manifest.json <bytes> bytes crc32 <8 hex digits>".  Markers
 * of older dtrains hold the first line only. */
#define MARKER_LINE "dtrain checkpoint complete\n"
#define MARKER_SUM_FMT MANIFEST " %llu bytes crc32 %08x\n"
#define MARKER_MAX 4096           /* bytes of COMPLETE read, at most */
#define MANIFEST_MAX (UINT64_C(1) << 30) /* bytes of manifest.json */

/* Segment bytes (count * dtype size); dtype already validated. */
uint64_t dt_ckpt_seg_bytes(const dt_ckpt_seg_t *s);

/* An exact non-negative integer field (JSON numbers are doubles): 1 with
 * *v set, or 0 when absent, not a number or not exact. */
int dt_ckpt_json_uint(const cJSON *o, const char *key, uint64_t *v);

/* manifest.json's segment objects, one field table for both directions
 * (ckpt_manifest.c).  to_json: the object (NULL when out of memory).
 * from_json: fills *s's fields from object js (a block when js has
 * "offsets"; block.ndim set, entry and dtype left alone), *file the
 * "file" string (s->shard parsed from it, UINT32_MAX when it is not a
 * shard name); 0, or which field was missing or bad: */
enum { DT_CKPT_SEG_BAD_FIELD = 1, /* offset, count, file, byte_offset, crc32 */
       DT_CKPT_SEG_BAD_BLOCK = 2, /* base, shape, offsets, sizes (1 to
                                   * DT_CKPT_MAX_DIMS, all of one length) */
       DT_CKPT_SEG_BAD_CRC = 3 }; /* crc32 not 8 hex digits */
cJSON *dt_ckpt_seg_to_json(const dt_ckpt_seg_t *s);
int dt_ckpt_seg_from_json(const cJSON *js, dt_ckpt_seg_t *s, const char **file);

#endif /* DT_CKPT_INTERNAL_H */
