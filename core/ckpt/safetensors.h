/*
 * core/ckpt/safetensors.h - the safetensors format (Hugging Face), for
 * exporting weights other tools can load and importing theirs.  (The
 * tests read exports back with their own validating reader,
 * tests/support/safetensors_read.h, independent of this one.)
 *
 * Layout: u64 little-endian N, then N bytes of JSON
 *   {"<name>": {"dtype": "F32", "shape": [768, 3072],
 *               "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"key": "value", ...}}
 * padded with spaces so the data starts 8-byte aligned, then the data
 * buffer; offsets are relative to its start, tensors are row-major,
 * little-endian, and together cover the buffer without holes or overlap.
 *
 * Writing streams: declare every tensor (name, dtype, shape) first, then
 * write their bytes in declaration order in any number of pieces; only the
 * declarations are kept in memory, so exporting a model needs no more than
 * the caller's largest buffer.  The file appears atomically at commit.
 * Reading checks the header once and then reads any tensor's bytes by
 * pread, so memory is the caller's buffers.
 */
#ifndef DT_CKPT_SAFETENSORS_H
#define DT_CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define DT_SAFETENSORS_MAX_DIMS 8
/* The header's reserved key for string metadata. */
#define DT_SAFETENSORS_META_KEY "__metadata__"

typedef struct dt_safetensors_writer dt_safetensors_writer_t;

int dt_safetensors_writer_open(const char *path,
                               dt_safetensors_writer_t **out);
/* Declare the next tensor; all declarations come before any data.
 * Names are unique and not "__metadata__"; dtype is a dt_dtype_t. */
int dt_safetensors_declare(dt_safetensors_writer_t *w, const char *name,
                           int dtype, int ndim, const int64_t *shape);
/* A "__metadata__" string pair (before any data). */
int dt_safetensors_set_meta(dt_safetensors_writer_t *w, const char *key,
                            const char *value);
/* Append data bytes: the declared tensors' bytes in declaration order,
 * split anywhere.  The first call writes the header.  On failure (or after
 * a failed declare) the writer stays open: commit or abort it. */
int dt_safetensors_write(dt_safetensors_writer_t *w, const void *data,
                         size_t nbytes);
/* Check every declared byte arrived, then publish the file.  Frees `w`
 * whatever happens. */
int dt_safetensors_commit(dt_safetensors_writer_t *w);
/* Drop everything (no file left, a previous one untouched); NULL ok. */
void dt_safetensors_abort(dt_safetensors_writer_t *w);

/* "F32" etc. for a dt_dtype_t; NULL when safetensors has no such name. */
const char *dt_safetensors_dtype_name(int dtype);

/* ---- reading (dtrain import) ---- */

/* Headers larger than this are refused (the reference implementation's
 * limit too), so a corrupt length cannot ask for gigabytes. */
#define DT_SAFETENSORS_MAX_HEADER (100u << 20)

typedef struct dt_safetensors_reader dt_safetensors_reader_t;

/* One tensor of an opened file. */
typedef struct dt_safetensors_tensor {
    const char *name;
    int32_t dtype;        /* dt_dtype_t; -1 for a dtype dtrain has no name for */
    int32_t ndim;
    int64_t shape[DT_SAFETENSORS_MAX_DIMS];
    uint64_t numel;
    uint64_t offset;      /* of its first byte in the file */
    uint64_t nbytes;
    const char *dtype_name; /* as the header spells it: "F32", "I8" */
} dt_safetensors_tensor_t;

/* Open `path` (a regular file, never blocking on a FIFO) and check its
 * header: its length inside the file and below DT_SAFETENSORS_MAX_HEADER,
 * a JSON object, every tensor with a dtype string, a shape of at most
 * DT_SAFETENSORS_MAX_DIMS non-negative integers and data_offsets [begin,
 * end] inside the data buffer spanning exactly numel x the dtype's size
 * (known dtypes; others only inside the buffer), and the spans, in any
 * order, tiling the buffer up to the file's end: no overlap, no hole, no
 * bytes left over.  Errors are DT_ERR_DATA
 * "safetensors '<path>': tensor <name>: ..." (DT_ERR_NOT_FOUND, DT_ERR_IO
 * from opening). */
int dt_safetensors_open(const char *path, dt_safetensors_reader_t **out);
void dt_safetensors_close(dt_safetensors_reader_t *r); /* NULL ok */
size_t dt_safetensors_count(const dt_safetensors_reader_t *r);
/* Tensors in header order; by name (NULL when absent). */
const dt_safetensors_tensor_t *dt_safetensors_at(const dt_safetensors_reader_t *r, size_t i);
const dt_safetensors_tensor_t *dt_safetensors_find(const dt_safetensors_reader_t *r,
                                                   const char *name);
/* Bytes [first, first + n) of tensor t into dst. */
int dt_safetensors_read(dt_safetensors_reader_t *r, const dt_safetensors_tensor_t *t,
                        uint64_t first, uint64_t n, void *dst);

#endif /* DT_CKPT_SAFETENSORS_H */
