/*
 * core/data/data.h - training data: llm.c token files, their preparation
 * from text, and the sampler that turns them into per-rank micro-batches.
 *
 * File format (llm.c's, so its prepared datasets load unchanged):
 *   int32 header[256]: [0] = 20240520 (magic), [1] = 1 (version: uint16
 *   tokens), [2] = number of tokens; the rest zero.  Then header[2] uint16
 *   tokens.  A vocabulary of more than 65536 ids (Llama 3's, Qwen2's) takes
 *   llm.c's second kind: magic 20240801, version 7, uint32 tokens.
 *   Everything little-endian (as llm.c; dtrain targets LE hosts).
 *
 * Sampling (llm.c's cut): the token stream is cut into sequences of
 * seq_len + 1 tokens taken at stride seq_len, so sequence k covers tokens
 * [k*T, k*T + T] and n_seq = (ntok - 1) / T.  inputs are the first T tokens,
 * targets the same shifted by one.  Sequences are served as an infinite
 * stream: position p is sequence perm_e[p % n_seq] with epoch e = p / n_seq,
 * where perm_e is a Fisher-Yates permutation seeded by (seed, e), or the
 * identity without shuffling.  Step s owns positions [s*G, (s+1)*G) for a
 * global batch of G sequences; data-parallel rank r at micro-step m takes
 * the B = micro_batch positions starting at (m*dp_size + r)*B of that slice.
 * The union over ranks and micro-steps is exactly the global batch, whatever
 * dp_size is: N ranks see the same data as 1 rank with N times the
 * accumulation, which is what makes DDP equivalence testable.  The only
 * state is the step number, so resuming needs nothing else.
 */
#ifndef DT_DATA_H
#define DT_DATA_H

#include <stddef.h>
#include <stdint.h>

#define DT_DATA_MAGIC 20240520
#define DT_DATA_VERSION 1
#define DT_DATA_MAGIC32 20240801 /* llm.c's llama-3 files: uint32 tokens */
#define DT_DATA_VERSION32 7
#define DT_DATA_HEADER_INTS 256
#define DT_DATA_HEADER_BYTES (DT_DATA_HEADER_INTS * 4)

/* An opened token file.  Fields are read-only for callers; shared freely
 * between threads (reads are pread on one descriptor).
 *
 * The file is read, not memory-mapped: a token file truncated while a run
 * uses it would kill a mapping's reader with SIGBUS and no message.  Read,
 * it gives DT_ERR_DATA "data file '<path>': changed while in use: ...",
 * and so does a token larger than any the file held when opened (which
 * the vocabulary check vouched for).  One pread per sequence costs a few
 * microseconds per micro-batch, next to milliseconds of compute. */
typedef struct dt_dataset {
    char *path;
    int fd;                 /* the open file */
    uint64_t ntok;
    uint32_t width;         /* bytes a token: 2 (uint16) or 4 (uint32) */
    uint32_t max_token;     /* largest token in the file (0 when empty) */
} dt_dataset_t;

/* Open and validate a token file: header size, magic, version, token count
 * against the file size (DT_ERR_DATA), or a missing / unreadable file
 * (DT_ERR_NOT_FOUND / DT_ERR_IO; a FIFO, a directory or a device in its
 * place is DT_ERR_IO "not a regular file (a FIFO)" at once, never a hang).
 * Messages start "data file '<path>': ".  Also reads every token once to
 * find the largest, so vocab checks are O(1). */
int dt_data_open(const char *path, dt_dataset_t **out);
void dt_data_close(dt_dataset_t *ds);

/* DT_ERR_DATA when any token is >= vocab_size, naming the first one:
 * "data file 'x': token 70000 at position 1234 is outside the vocabulary
 * (vocab_size 256)". */
int dt_data_check_vocab(const dt_dataset_t *ds, uint32_t vocab_size);

/* Byte-level tokenization for `dtrain data prepare`: every byte of
 * text_path (a regular file; anything else is refused without blocking)
 * becomes one token (vocab 256).  With val_fraction in (0, 1) the
 * last floor(n * val_fraction) bytes go to out_val instead (out_val must
 * then be non-NULL, and NULL when val_fraction is 0).  Streams in chunks,
 * so any file size works.  The outputs' folders are made if missing
 * (mkdir -p), and each output replaces only a regular file (or nothing:
 * dt_afile_open).  n_train / n_val (may be NULL) receive the token counts
 * written. */
int dt_data_prepare(const char *text_path, const char *out_train,
                    const char *out_val, double val_fraction,
                    uint64_t *n_train, uint64_t *n_val);

/* The same with a BPE tokenizer (data/tokenizer.h): the whole text is
 * read into memory and encoded on `threads` threads (0: the online cores),
 * calling `progress` now and then (may be NULL); the last
 * floor(n * val_fraction) TOKENS go to out_val.  The token file is uint16
 * when every id of the tokenizer fits (vocabulary of at most 65536), else
 * uint32 (magic 20240801, version 7). */
struct dt_tokenizer;
int dt_data_prepare_bpe(const char *text_path, const struct dt_tokenizer *tok, int threads,
                        void (*progress)(void *arg, size_t done, size_t total), void *arg,
                        const char *out_train, const char *out_val, double val_fraction,
                        uint64_t *n_train, uint64_t *n_val);

/* ---- sampler --------------------------------------------------------- */

typedef struct dt_sampler dt_sampler_t;

/* A sampler over `ds` (which must outlive it).  global_batch G is in
 * sequences; it must be a multiple of micro_batch.  Fails with DT_ERR_DATA
 * when the file holds no full sequence of seq_len + 1 tokens.  A sampler
 * caches permutations: use one per thread. */
int dt_sampler_init(dt_sampler_t **out, const dt_dataset_t *ds,
                    uint32_t seq_len, uint32_t micro_batch,
                    uint32_t global_batch, uint64_t seed, int shuffle);
void dt_sampler_free(dt_sampler_t *s);

/* Micro-steps per step for `dp_size` ranks: G / (micro_batch * dp_size),
 * or 0 when that does not divide (dt_sampler_fill then explains why). */
uint32_t dt_sampler_grad_accum(const dt_sampler_t *s, uint32_t dp_size);

/* The micro-batch of rank `dp_rank` of `dp_size` at micro-step `micro` of
 * step `step`: tokens widened to int32.  DT_ERR_INVALID when G is not a
 * multiple of micro_batch * dp_size or micro/rank are out of range;
 * DT_ERR_DATA when the file changed since it was opened (above). */
int dt_sampler_fill(dt_sampler_t *s, uint64_t step, uint32_t micro,
                    uint32_t dp_rank, uint32_t dp_size,
                    int32_t *inputs /* (B, T) */,
                    int32_t *targets /* (B, T) */);

/* ---- evaluation ------------------------------------------------------ */

/* Evaluation walks a (validation) file in order, without shuffling:
 * eval batch i of rank r takes sequences [(i*dp_size + r)*B, +B), so all
 * ranks together cover (i*dp_size)*B .. and every rank sees the same number
 * of batches.  Number of such full batches (0 when the file is too small
 * for even one: dt_data_eval_check says so as an error). */
uint64_t dt_data_eval_batches(const dt_dataset_t *ds, uint32_t seq_len,
                              uint32_t micro_batch, uint32_t dp_size);
/* DT_OK when `ds` holds at least one evaluation batch, else DT_ERR_DATA
 * naming the file and the sizes, the same message a training file gets
 * for too few tokens ("data file 'v.bin': 10 tokens hold no full sequence
 * of seq_len 16 (need at least 17 tokens)"), or, with whole sequences but
 * fewer than micro_batch x dp_size of them, "data file 'v.bin': 50 tokens
 * hold 3 sequences of seq_len 16, fewer than one evaluation batch of 2
 * sequence(s) x 2 rank(s) = 4 sequences (need at least 65 tokens)".
 * (The training loop passes its global batch's share per rank as
 * micro_batch: it evaluates whole global batches.)
 * Call it when the file is opened, so a too-small file is an error rather
 * than a run without a validation loss. */
int dt_data_eval_check(const dt_dataset_t *ds, uint32_t seq_len,
                       uint32_t micro_batch, uint32_t dp_size);
int dt_data_eval_fill(const dt_dataset_t *ds, uint32_t seq_len,
                      uint32_t micro_batch, uint64_t batch, uint32_t dp_rank,
                      uint32_t dp_size, int32_t *inputs /* (B, T) */,
                      int32_t *targets /* (B, T) */);

#endif /* DT_DATA_H */
