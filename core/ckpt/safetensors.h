/*
 * core/ckpt/safetensors.h - the safetensors format (Hugging Face), for
 * exporting weights other tools can load.  (The tests read exports back
 * with their own validating reader, tests/support/safetensors_read.h.)
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
 */
#ifndef DT_ENGINE_SAFETENSORS_H
#define DT_ENGINE_SAFETENSORS_H

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

#endif /* DT_ENGINE_SAFETENSORS_H */
