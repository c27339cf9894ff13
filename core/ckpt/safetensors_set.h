/*
 * core/ckpt/safetensors_set.h - a model's weights as Hugging Face saves
 * them: one model.safetensors, or shards model-0000N-of-0000M.safetensors
 * named by model.safetensors.index.json, read as one set of tensors.
 *
 * The index is JSON: {"metadata": {...}, "weight_map": {"<tensor>":
 * "<shard file>", ...}}.  It is another party's file, so it is trusted
 * for nothing: every shard it names must be a plain file name (no folder,
 * no "..", no leading dot) in the index's own folder and a safetensors
 * file (dt_safetensors_open's checks), every tensor it maps must be in
 * that shard, and every tensor of every shard must be mapped there (a
 * tensor in two shards, or one the index does not name, is an error: the
 * set would be ambiguous).  Shards are opened once each, at open, and
 * read with pread, so memory is the caller's buffers.
 */
#ifndef DT_CKPT_SAFETENSORS_SET_H
#define DT_CKPT_SAFETENSORS_SET_H

#include <stddef.h>

#include "ckpt/safetensors.h"

/* The index file's name, and the single file's, in a model folder. */
#define DT_SAFETENSORS_INDEX_NAME "model.safetensors.index.json"
#define DT_SAFETENSORS_SINGLE_NAME "model.safetensors"
/* Most shards one index may name (Llama 3.1 405B has 191). */
#define DT_SAFETENSORS_MAX_SHARDS 1024
/* Largest index file read (a 405B model's is about 100 KiB). */
#define DT_SAFETENSORS_MAX_INDEX (64u << 20)

typedef struct dt_safetensors_set dt_safetensors_set_t;

/* Open `path`: a folder (its model.safetensors.index.json when present,
 * else its model.safetensors), an index file (*.index.json) or one
 * .safetensors file.  Errors are DT_ERR_DATA naming the index and the
 * shard or tensor ("'<index>': weight_map: tensor 'x' is in shard 'a'
 * but the index says 'b'"), DT_ERR_NOT_FOUND naming the missing file,
 * DT_ERR_IO from opening. */
int dt_safetensors_set_open(const char *path, dt_safetensors_set_t **out);
void dt_safetensors_set_close(dt_safetensors_set_t *s); /* NULL ok */

/* Tensors of every shard, shard by shard in the index's order of first
 * mention, each in its file's header order. */
size_t dt_safetensors_set_count(const dt_safetensors_set_t *s);
const dt_safetensors_tensor_t *dt_safetensors_set_at(const dt_safetensors_set_t *s, size_t i);
/* By name (NULL when absent). */
const dt_safetensors_tensor_t *dt_safetensors_set_find(const dt_safetensors_set_t *s,
                                                       const char *name);
/* Bytes [first, first + n) of tensor t (one of this set's) into dst. */
int dt_safetensors_set_read(dt_safetensors_set_t *s, const dt_safetensors_tensor_t *t,
                            uint64_t first, uint64_t n, void *dst);
/* The file tensor t lives in (the shard's path), for messages. */
const char *dt_safetensors_set_file(const dt_safetensors_set_t *s,
                                    const dt_safetensors_tensor_t *t);
/* How many files the set spans (1 without an index). */
size_t dt_safetensors_set_shards(const dt_safetensors_set_t *s);

#endif /* DT_CKPT_SAFETENSORS_SET_H */
