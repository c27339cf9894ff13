/*
 * core/data/tokenizer.h - byte-level BPE read from a Hugging Face
 * `tokenizer.json` (GPT-2, Llama 3, Qwen2-style tokenizers), giving the
 * ids the `tokenizers` library's `encode(text, add_special_tokens=False)`
 * gives.
 *
 * What a text goes through, as in `tokenizers`:
 *  1. added tokens (`added_tokens`: "<|endoftext|>", ...) are cut out of the
 *     text first, leftmost and then longest, each one id (lstrip / rstrip
 *     take the whitespace beside them); those marked `normalized` are
 *     matched after the normalizer;
 *  2. each stretch between them is normalized when the file asks (NFC, by
 *     utf8proc; runs of invalid UTF-8 are left as they are) and
 *     pre-tokenized: split by the model's
 *     pattern (GPT-2's when `ByteLevel` has `use_regex`, or a `Split`'s
 *     regex, behaviour "Isolated": the matches and the text between them
 *     are pieces), matched by PCRE2 with Unicode properties, after a space
 *     is put in front when `ByteLevel` has `add_prefix_space`;
 *  3. each piece's bytes are merged by BPE, lowest merge rank first and
 *     then leftmost (`ignore_merges`: a piece that is itself in the
 *     vocabulary is that token).
 * Decoding maps ids back to the bytes they stand for (ByteLevel decoder).
 *
 * Invalid UTF-8 (which Python's `tokenizers` cannot be handed at all) is
 * kept, never replaced: PCRE2 matches no pattern across it
 * (PCRE2_MATCH_INVALID_UTF), so each run of invalid bytes is a piece of its
 * own between the matches, and BPE encodes its bytes like any other
 * (byte-level vocabularies hold every byte); decoding gives the same bytes.
 *
 * Refused with a message naming the file and the key: other models than
 * BPE, other normalizers than NFC, other pre-tokenizers (Metaspace, Digits, ...), Split
 * behaviours other than "Isolated", BPE dropout, subword prefixes and
 * suffixes, byte_fallback, single_word added tokens, and a vocabulary that
 * lacks a byte.  The post-processor (BOS/EOS templates) is not applied.
 */
#ifndef DT_DATA_TOKENIZER_H
#define DT_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct dt_tokenizer dt_tokenizer_t;

/* Read and check `path` (DT_ERR_CONFIG naming the file and the key for
 * what is refused or malformed; DT_ERR_NOT_FOUND / DT_ERR_IO for the file
 * itself). */
int dt_tokenizer_load(const char *path, dt_tokenizer_t **out);
void dt_tokenizer_free(dt_tokenizer_t *t);

/* The largest id plus one (vocabulary and added tokens). */
uint32_t dt_tokenizer_vocab_size(const dt_tokenizer_t *t);

/* A growable array of ids. */
typedef struct dt_token_vec {
    uint32_t *ids;
    size_t n, cap;
} dt_token_vec_t;
void dt_token_vec_free(dt_token_vec_t *v);

/* Encode text[0, len) appending to `out`, BPE on `threads` threads (0:
 * the online cores); the ids do not depend on the thread count.
 * `progress` (may be NULL) is called now and then with the bytes done. */
int dt_tokenizer_encode(const dt_tokenizer_t *t, const char *text, size_t len, int threads,
                        void (*progress)(void *arg, size_t done, size_t total), void *arg,
                        dt_token_vec_t *out);

/* The bytes token `id` stands for (added tokens: their text); NULL for an
 * id outside the vocabulary or one no token has. */
const char *dt_tokenizer_token(const dt_tokenizer_t *t, uint32_t id, size_t *len);

#endif /* DT_DATA_TOKENIZER_H */
