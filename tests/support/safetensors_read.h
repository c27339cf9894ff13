/*
 * tests/support/safetensors_read.h - a validating safetensors reader the
 * tests check exports with (the core only writes the format:
 * core/ckpt/safetensors.h).  It maps the file and checks everything a
 * consumer relies on: header length, JSON, known dtypes, offsets that
 * match the shapes and tile the data buffer exactly; test_safetensors also
 * reads a file Python's reference implementation wrote with it.
 */
#ifndef DT_TEST_SAFETENSORS_READ_H
#define DT_TEST_SAFETENSORS_READ_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt/safetensors.h"

/* Headers larger than this are refused (the reference implementation's
 * limit too), so a corrupt length cannot ask for GBs. */
#define DT_TEST_ST_MAX_HEADER (100u << 20)

typedef struct dt_test_st_tensor {
    const char *name;
    int32_t dtype;     /* dt_dtype_t */
    int32_t ndim;
    int64_t shape[DT_SAFETENSORS_MAX_DIMS];
    uint64_t numel;
    const void *data;  /* into the file mapping; valid until close.  Only
                        * 8-byte alignment of the buffer start is promised;
                        * memcpy before typed access. */
    uint64_t nbytes;
} dt_test_st_tensor_t;

typedef struct dt_test_st dt_test_st_t;

/* Map and validate a file: header length, JSON, known dtypes, offsets that
 * match shapes and tile the data buffer exactly.  Errors are DT_ERR_DATA
 * "safetensors '<path>': ..." (DT_ERR_NOT_FOUND for a missing file). */
int dt_test_st_open(const char *path, dt_test_st_t **out);
void dt_test_st_close(dt_test_st_t *st);
/* Tensors in header order. */
size_t dt_test_st_count(const dt_test_st_t *st);
const dt_test_st_tensor_t *dt_test_st_at(const dt_test_st_t *st,
                                                 size_t i);
const dt_test_st_tensor_t *dt_test_st_find(const dt_test_st_t *st,
                                                   const char *name);
/* A "__metadata__" value, or NULL. */
const char *dt_test_st_meta(const dt_test_st_t *st, const char *key);

#endif /* DT_TEST_SAFETENSORS_READ_H */
