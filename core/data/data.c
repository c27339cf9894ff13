/*
 * core/data/data.c - llm.c token files (open, validate, read with pread,
 * prepare from text) and the deterministic, dp-size-independent batch
 * sampler.
 */
#include "data/data.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/tokenizer.h"
#include "util/fileutil.h"
#include "util/error.h"

/* ---- opening and validating ------------------------------------------ */

/* Largest token.  Blocks of fixed length let GCC vectorize the inner max
 * even at -O2; the values are biased into int32 because SSE2 (the x86-64
 * baseline) has no unsigned 32-bit max.  The open-time scan runs at
 * memory speed, so it costs nothing noticeable. */
static uint32_t max_token(const uint32_t *p, uint64_t n)
{
    enum { BLK = 128 };
    uint32_t m = 0;
    uint64_t i = 0;
    for (; i + BLK <= n; i += BLK) {
        int32_t bm = INT32_MIN;
        for (int j = 0; j < BLK; j++) {
            int32_t v = (int32_t)(p[i + j] ^ 0x80000000u);
            bm = v > bm ? v : bm;
        }
        uint32_t ub = (uint32_t)bm ^ 0x80000000u;
        m = ub > m ? ub : m;
    }
    for (; i < n; i++)
        m = p[i] > m ? p[i] : m;
    return m;
}

void dt_data_close(dt_dataset_t *ds)
{
    if (!ds)
        return;
    if (ds->fd >= 0)
        close(ds->fd);
    free(ds->path);
    free(ds);
}

/* pread exactly n bytes at `at`: DT_OK, DT_ERR_IO for a failed read, or
 * DT_ERR_DATA when the file ends first (it was truncated after the header
 * and size were checked).  `path` names it. */
static int read_at(int fd, const char *path, void *dst, size_t n, uint64_t at)
{
    char *p = dst;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return dt_err_set(DT_ERR_IO, "data file '%s': %s", path,
                              strerror(errno));
        if (got == 0) {
            struct stat st;
            unsigned long long now = fstat(fd, &st) == 0
                                         ? (unsigned long long)st.st_size : 0;
            return dt_err_set(DT_ERR_DATA, "data file '%s': changed while in "
                              "use: it now has %llu bytes, too few for bytes "
                              "[%llu, %llu) it had when opened", path, now,
                              (unsigned long long)at,
                              (unsigned long long)(at + n));
        }
        p += got;
        n -= (size_t)got;
        at += (uint64_t)got;
    }
    return DT_OK;
}

/* Tokens [first, first + n) of the file into dst, widened: a uint16
 * file is read into the back half of dst and widened front to back. */
static int tokens_read(const dt_dataset_t *ds, uint64_t first, size_t n,
                       uint32_t *dst)
{
    if (ds->width == 4)
        return read_at(ds->fd, ds->path, dst, n * 4, DT_DATA_HEADER_BYTES + first * 4);
    uint16_t *half = (uint16_t *)(dst + n) - n;
    int rc = read_at(ds->fd, ds->path, half, n * 2, DT_DATA_HEADER_BYTES + first * 2);
    for (size_t i = 0; !rc && i < n; i++)
        dst[i] = half[i];
    return rc;
}

/* Token reads in pieces of this many (1 MiB) when scanning a whole file. */
#define SCAN_TOKENS ((size_t)1 << 19)

/* The header's magic, version and count against the file's size; the
 * token width in *width. */
static int header_check(const char *path, const int32_t *hdr, uint64_t size, uint32_t *width)
{
    if (hdr[0] != DT_DATA_MAGIC && hdr[0] != DT_DATA_MAGIC32)
        return dt_err_set(DT_ERR_DATA, "data file '%s': bad magic %d (expected "
                          "%d, or %d for uint32 tokens): not an llm.c token file", path,
                          hdr[0], DT_DATA_MAGIC, DT_DATA_MAGIC32);
    int wide = hdr[0] == DT_DATA_MAGIC32;
    if (hdr[1] != (wide ? DT_DATA_VERSION32 : DT_DATA_VERSION))
        return dt_err_set(DT_ERR_DATA, "data file '%s': unsupported version %d "
                          "(expected %d with magic %d: %s tokens)", path, hdr[1],
                          wide ? DT_DATA_VERSION32 : DT_DATA_VERSION, hdr[0],
                          wide ? "uint32" : "uint16");
    if (hdr[2] < 0)
        return dt_err_set(DT_ERR_DATA, "data file '%s': negative token count "
                          "%d in header", path, hdr[2]);
    *width = wide ? 4 : 2;
    uint64_t want = DT_DATA_HEADER_BYTES + *width * (uint64_t)hdr[2];
    if (size < want)
        return dt_err_set(DT_ERR_DATA, "data file '%s': truncated: header "
                          "says %d tokens (%llu bytes) but the file has "
                          "%llu bytes", path, hdr[2],
                          (unsigned long long)want, (unsigned long long)size);
    if (size > want)
        return dt_err_set(DT_ERR_DATA, "data file '%s': header says %d "
                          "tokens (%llu bytes) but the file has %llu bytes "
                          "(trailing data)", path, hdr[2],
                          (unsigned long long)want, (unsigned long long)size);
    return DT_OK;
}

int dt_data_open(const char *path, dt_dataset_t **out)
{
    *out = NULL;
    dt_dataset_t *ds = calloc(1, sizeof *ds);
    if (!ds || !(ds->path = strdup(path))) {
        free(ds);
        return dt_err_set(DT_ERR_NOMEM, "data file '%s': out of memory", path);
    }
    ds->fd = -1;
    char what[PATH_MAX + 16];
    snprintf(what, sizeof what, "data file '%s'", path);
    uint64_t size = 0;
    int rc = dt_fileutil_open_input(path, 0, what, &ds->fd, &size);
    if (!rc && size < DT_DATA_HEADER_BYTES)
        rc = dt_err_set(DT_ERR_DATA,
                        "data file '%s': truncated: %llu bytes, header "
                        "needs %d", path, (unsigned long long)size,
                        DT_DATA_HEADER_BYTES);
    int32_t hdr[DT_DATA_HEADER_INTS];
    if (!rc)
        rc = read_at(ds->fd, path, hdr, sizeof hdr, 0);
    if (!rc)
        rc = header_check(path, hdr, size, &ds->width);
    if (!rc) {
        ds->ntok = (uint64_t)hdr[2];
        /* The largest token, read front to back in big pieces (a pass the
         * page cache then serves training from). */
        uint32_t *buf = malloc(SCAN_TOKENS * sizeof *buf);
        if (!buf)
            rc = dt_err_set(DT_ERR_NOMEM, "data file '%s': out of memory",
                            path);
        for (uint64_t at = 0; !rc && at < ds->ntok; at += SCAN_TOKENS) {
            size_t n = ds->ntok - at < SCAN_TOKENS ? (size_t)(ds->ntok - at)
                                                   : SCAN_TOKENS;
            rc = tokens_read(ds, at, n, buf);
            if (!rc) {
                uint32_t m = max_token(buf, n);
                ds->max_token = m > ds->max_token ? m : ds->max_token;
            }
        }
        free(buf);
    }
    if (rc) {
        dt_data_close(ds);
        return rc;
    }
    *out = ds;
    return DT_OK;
}

int dt_data_check_vocab(const dt_dataset_t *ds, uint32_t vocab_size)
{
    if (ds->ntok == 0 || ds->max_token < vocab_size)
        return DT_OK;
    /* Only on failure: find the first offender for the message. */
    uint32_t *buf = malloc(SCAN_TOKENS * sizeof *buf);
    if (!buf)
        return dt_err_set(DT_ERR_NOMEM, "data file '%s': out of memory",
                          ds->path);
    int rc = DT_OK;
    for (uint64_t at = 0; !rc && at < ds->ntok; at += SCAN_TOKENS) {
        size_t n = ds->ntok - at < SCAN_TOKENS ? (size_t)(ds->ntok - at)
                                               : SCAN_TOKENS;
        rc = tokens_read(ds, at, n, buf);
        for (size_t i = 0; !rc && i < n; i++)
            if (buf[i] >= vocab_size)
                rc = dt_err_set(DT_ERR_DATA, "data file '%s': token %u at "
                                "position %llu is outside the vocabulary "
                                "(vocab_size %u)", ds->path, (unsigned)buf[i],
                                (unsigned long long)(at + i), vocab_size);
    }
    free(buf);
    if (!rc) /* the offender open() saw is gone: the file changed since */
        rc = dt_err_set(DT_ERR_DATA, "data file '%s': changed while in use: "
                        "its largest token was %u when opened, outside "
                        "vocab_size %u, and is no longer there", ds->path,
                        (unsigned)ds->max_token, vocab_size);
    return rc;
}

/* ---- writing --------------------------------------------------------- */

static int header_write(dt_afile_t *f, const char *path, uint64_t n, int width)
{
    if (n > INT32_MAX)
        return dt_err_set(DT_ERR_INVALID, "data file '%s': %llu tokens do "
                          "not fit the llm.c header (at most %d)", path,
                          (unsigned long long)n, INT32_MAX);
    int32_t hdr[DT_DATA_HEADER_INTS] = {0};
    hdr[0] = width == 4 ? DT_DATA_MAGIC32 : DT_DATA_MAGIC;
    hdr[1] = width == 4 ? DT_DATA_VERSION32 : DT_DATA_VERSION;
    hdr[2] = (int32_t)n;
    return dt_afile_write(f, hdr, sizeof hdr);
}

/* What both preparations check first: the val fraction and file agree;
 * the counts start at 0. */
static int prepare_begin(const char *out_val, double val_fraction, uint64_t *n_train,
                         uint64_t *n_val)
{
    if (n_train)
        *n_train = 0;
    if (n_val)
        *n_val = 0;
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return dt_err_set(DT_ERR_INVALID, "data prepare: val fraction %g is "
                          "outside [0, 1)", val_fraction);
    if ((val_fraction > 0.0) != (out_val != NULL))
        return dt_err_set(DT_ERR_INVALID, "data prepare: a val file needs a "
                          "val fraction > 0 and the reverse (fraction %g, val "
                          "file %s)", val_fraction, out_val ? out_val : "none");
    return DT_OK;
}

/* Both preparations end here: with rc DT_OK, val is committed first (a
 * crash in between leaves a new val beside an old train file at worst,
 * never a train file whose val split is missing), then train; anything
 * not committed is aborted. */
static int prepare_commit(int rc, dt_afile_t *ft, dt_afile_t *fv)
{
    if (!rc && fv) {
        rc = dt_afile_commit(fv);
        fv = NULL;
    }
    if (!rc) {
        rc = dt_afile_commit(ft);
        ft = NULL;
    }
    dt_afile_abort(ft);
    dt_afile_abort(fv);
    return rc;
}

int dt_data_prepare(const char *text_path, const char *out_train,
                    const char *out_val, double val_fraction,
                    uint64_t *n_train, uint64_t *n_val)
{
    int rc = prepare_begin(out_val, val_fraction, n_train, n_val);
    if (rc)
        return rc;
    char what[PATH_MAX + 16];
    snprintf(what, sizeof what, "text file '%s'", text_path);
    int fd;
    uint64_t n;
    if ((rc = dt_fileutil_open_input(text_path, 0, what, &fd, &n)))
        return rc;
    uint64_t nv = (uint64_t)floor((double)n * val_fraction);
    uint64_t nt = n - nv;
    if (n == 0)
        rc = dt_err_set(DT_ERR_DATA, "text file '%s' is empty", text_path);
    else if (out_val && nv == 0)
        rc = dt_err_set(DT_ERR_DATA, "text file '%s': val fraction %g of %llu "
                        "bytes leaves no val tokens", text_path, val_fraction,
                        (unsigned long long)n);
    if (rc) {
        close(fd);
        return rc;
    }

    enum { CHUNK = 1 << 20 };
    unsigned char *in = malloc(CHUNK);
    uint16_t *tok = malloc(CHUNK * sizeof *tok);
    dt_afile_t *ft = NULL, *fv = NULL;
    if (!in || !tok)
        rc = dt_err_set(DT_ERR_NOMEM, "data prepare: out of memory");
    /* the outputs' folders made as mkdir -p would; the writer refuses
     * anything but a regular file at either name before a byte is read */
    if (!rc)
        rc = dt_fileutil_mkdir_parent(out_train);
    if (!rc && out_val)
        rc = dt_fileutil_mkdir_parent(out_val);
    if (!rc)
        rc = dt_afile_open(out_train, &ft);
    if (!rc)
        rc = header_write(ft, out_train, nt, 2);
    if (!rc && out_val)
        rc = dt_afile_open(out_val, &fv);
    if (!rc && fv)
        rc = header_write(fv, out_val, nv, 2);
    uint64_t done = 0;
    while (!rc && done < n) {
        size_t want = n - done < CHUNK ? (size_t)(n - done) : CHUNK;
        ssize_t got = read(fd, in, want);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            rc = got < 0 ? dt_err_set(DT_ERR_IO, "text file '%s': %s",
                                      text_path, strerror(errno))
                         : dt_err_set(DT_ERR_IO, "text file '%s': shrank to "
                                      "%llu bytes while reading (expected "
                                      "%llu)", text_path,
                                      (unsigned long long)done,
                                      (unsigned long long)n);
            break;
        }
        for (ssize_t i = 0; i < got; i++)
            tok[i] = in[i];
        /* The split point may fall inside this chunk. */
        size_t to_train = done >= nt ? 0
                        : (nt - done < (uint64_t)got ? (size_t)(nt - done)
                                                     : (size_t)got);
        if (to_train)
            rc = dt_afile_write(ft, tok, to_train * sizeof *tok);
        if (!rc && (size_t)got > to_train)
            rc = dt_afile_write(fv, tok + to_train,
                                ((size_t)got - to_train) * sizeof *tok);
        done += (uint64_t)got;
    }
    close(fd);
    free(in);
    free(tok);
    if ((rc = prepare_commit(rc, ft, fv)))
        return rc;
    if (n_train)
        *n_train = nt;
    if (n_val)
        *n_val = nv;
    return DT_OK;
}

/* ---- preparing with a BPE tokenizer ------------------------------------ */

/* ids[0, n) as `width`-byte tokens into f, through a bounded buffer. */
static int ids_write(dt_afile_t *f, const uint32_t *ids, uint64_t n, int width)
{
    if (width == 4)
        return dt_afile_write(f, ids, n * 4);
    enum { PIECE = 1 << 16 };
    uint16_t buf[PIECE];
    int rc = DT_OK;
    for (uint64_t at = 0; !rc && at < n; at += PIECE) {
        size_t k = n - at < PIECE ? (size_t)(n - at) : PIECE;
        for (size_t i = 0; i < k; i++)
            buf[i] = (uint16_t)ids[at + i];
        rc = dt_afile_write(f, buf, k * 2);
    }
    return rc;
}

int dt_data_prepare_bpe(const char *text_path, const struct dt_tokenizer *tok, int threads,
                        void (*progress)(void *arg, size_t done, size_t total), void *arg,
                        const char *out_train, const char *out_val, double val_fraction,
                        uint64_t *n_train, uint64_t *n_val)
{
    int rc = prepare_begin(out_val, val_fraction, n_train, n_val);
    if (rc)
        return rc;
    char what[PATH_MAX + 16];
    snprintf(what, sizeof what, "text file '%s'", text_path);
    int fd;
    uint64_t n;
    if ((rc = dt_fileutil_open_input(text_path, 0, what, &fd, &n)))
        return rc;
    char *text = NULL;
    size_t len = 0;
    if (n == 0)
        rc = dt_err_set(DT_ERR_DATA, "text file '%s' is empty", text_path);
    else
        rc = dt_fileutil_read_fd(fd, n, UINT64_MAX, what, &text, &len);
    close(fd);
    dt_token_vec_t ids = {0};
    if (!rc)
        rc = dt_tokenizer_encode(tok, text, len, threads, progress, arg, &ids);
    free(text);
    uint64_t nv = (uint64_t)floor((double)ids.n * val_fraction), nt = ids.n - nv;
    if (!rc && out_val && nv == 0)
        rc = dt_err_set(DT_ERR_DATA, "text file '%s': val fraction %g of %llu tokens leaves "
                        "no val tokens", text_path, val_fraction, (unsigned long long)ids.n);
    const int width = dt_tokenizer_vocab_size(tok) > 65536 ? 4 : 2;
    dt_afile_t *ft = NULL, *fv = NULL;
    if (!rc)
        rc = dt_fileutil_mkdir_parent(out_train);
    if (!rc && out_val)
        rc = dt_fileutil_mkdir_parent(out_val);
    if (!rc && !(rc = dt_afile_open(out_train, &ft)) && !(rc = header_write(ft, out_train, nt,
                                                                             width)))
        rc = ids_write(ft, ids.ids, nt, width);
    if (!rc && out_val && !(rc = dt_afile_open(out_val, &fv)) &&
        !(rc = header_write(fv, out_val, nv, width)))
        rc = ids_write(fv, ids.ids + nt, nv, width);
    dt_token_vec_free(&ids);
    if ((rc = prepare_commit(rc, ft, fv)))
        return rc;
    if (n_train)
        *n_train = nt;
    if (n_val)
        *n_val = nv;
    return DT_OK;
}

/* ---- sampler --------------------------------------------------------- */

/* splitmix64: seeds the generator from (seed, epoch) so that nearby seeds
 * and epochs still give unrelated streams. */
static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* xoshiro256** (Blackman & Vigna), public-domain algorithm. */
typedef struct { uint64_t s[4]; } rng_t;

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

/* Uniform in [0, bound) without modulo bias. */
static uint64_t rng_below(rng_t *r, uint64_t bound)
{
    uint64_t threshold = (0 - bound) % bound; /* 2^64 mod bound */
    for (;;) {
        uint64_t x = rng_next(r);
        if (x >= threshold)
            return x % bound;
    }
}

static void rng_seed(rng_t *r, uint64_t seed, uint64_t epoch)
{
    uint64_t x = seed;
    uint64_t mixed = splitmix64(&x) ^ epoch;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&mixed);
}

/* Two cached epochs: a step's global batch spans at most an epoch boundary
 * (when G <= n_seq), so steady state regenerates once per epoch. */
typedef struct {
    uint64_t epoch;
    uint32_t *perm; /* (n_seq,) or NULL when empty */
} perm_slot_t;

struct dt_sampler {
    const dt_dataset_t *ds;
    uint32_t seq_len, micro_batch, global_batch;
    int shuffle;
    uint64_t seed;
    uint64_t n_seq;
    perm_slot_t slot[2];
    unsigned next_victim;
};

/* A file too short for one sequence: the same error for training and
 * validation data. */
static int seq_check(const dt_dataset_t *ds, uint32_t seq_len)
{
    if (ds->ntok < (uint64_t)seq_len + 1)
        return dt_err_set(DT_ERR_DATA, "data file '%s': %llu tokens hold no "
                          "full sequence of seq_len %u (need at least %llu "
                          "tokens)", ds->path, (unsigned long long)ds->ntok,
                          seq_len, (unsigned long long)seq_len + 1);
    return DT_OK;
}

int dt_sampler_init(dt_sampler_t **out, const dt_dataset_t *ds,
                    uint32_t seq_len, uint32_t micro_batch,
                    uint32_t global_batch, uint64_t seed, int shuffle)
{
    *out = NULL;
    if (seq_len == 0 || micro_batch == 0 || global_batch == 0)
        return dt_err_set(DT_ERR_INVALID, "data file '%s': seq_len %u, "
                          "micro_batch %u and global_batch %u must all be "
                          "positive", ds->path, seq_len, micro_batch,
                          global_batch);
    if (global_batch % micro_batch)
        return dt_err_set(DT_ERR_INVALID, "data file '%s': global batch %u "
                          "sequences is not a multiple of micro_batch %u",
                          ds->path, global_batch, micro_batch);
    int rc = seq_check(ds, seq_len);
    if (rc)
        return rc;
    uint64_t n_seq = (ds->ntok - 1) / seq_len;
    if (shuffle && n_seq > UINT32_MAX)
        return dt_err_set(DT_ERR_UNSUPPORTED, "data file '%s': %llu sequences "
                          "are more than the shuffler handles (%u)", ds->path,
                          (unsigned long long)n_seq, UINT32_MAX);
    dt_sampler_t *s = calloc(1, sizeof *s);
    if (!s)
        return dt_err_set(DT_ERR_NOMEM, "sampler: out of memory");
    s->ds = ds;
    s->seq_len = seq_len;
    s->micro_batch = micro_batch;
    s->global_batch = global_batch;
    s->shuffle = shuffle;
    s->seed = seed;
    s->n_seq = n_seq;
    *out = s;
    return DT_OK;
}

void dt_sampler_free(dt_sampler_t *s)
{
    if (!s)
        return;
    free(s->slot[0].perm);
    free(s->slot[1].perm);
    free(s);
}

uint32_t dt_sampler_grad_accum(const dt_sampler_t *s, uint32_t dp_size)
{
    uint64_t per = (uint64_t)s->micro_batch * dp_size;
    if (dp_size == 0 || s->global_batch % per)
        return 0;
    return (uint32_t)(s->global_batch / per);
}

static const uint32_t *perm_get(dt_sampler_t *s, uint64_t epoch)
{
    for (int i = 0; i < 2; i++)
        if (s->slot[i].perm && s->slot[i].epoch == epoch)
            return s->slot[i].perm;
    perm_slot_t *v = &s->slot[s->next_victim];
    s->next_victim ^= 1;
    if (!v->perm && !(v->perm = malloc(s->n_seq * sizeof *v->perm)))
        return NULL;
    uint32_t *p = v->perm;
    for (uint64_t i = 0; i < s->n_seq; i++)
        p[i] = (uint32_t)i;
    rng_t r;
    rng_seed(&r, s->seed, epoch);
    for (uint64_t i = s->n_seq - 1; i > 0; i--) {
        uint64_t j = rng_below(&r, i + 1);
        uint32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    v->epoch = epoch;
    return p;
}

/* Sequence `seq` (tokens [seq*T, seq*T + T]) widened to int32: inputs
 * (T,), targets (T,).  Read in pieces through a small buffer; a token the
 * vocabulary check never saw (larger than the file's largest when opened)
 * means the file was rewritten under us, and is refused. */
static int seq_read(const dt_dataset_t *ds, uint32_t T, uint64_t seq,
                    int32_t *inputs, int32_t *targets)
{
    enum { PIECE = 2048 };
    uint32_t buf[PIECE];
    const uint64_t first = seq * T, total = (uint64_t)T + 1;
    for (uint64_t done = 0; done < total; done += PIECE) {
        size_t n = total - done < PIECE ? (size_t)(total - done) : PIECE;
        int rc = tokens_read(ds, first + done, n, buf);
        if (rc)
            return rc;
        for (size_t i = 0; i < n; i++) {
            uint32_t t = buf[i];
            if (t > ds->max_token)
                return dt_err_set(DT_ERR_DATA, "data file '%s': changed while "
                                  "in use: token %u at position %llu is larger "
                                  "than any it held when opened (%u)", ds->path,
                                  (unsigned)t,
                                  (unsigned long long)(first + done + i),
                                  (unsigned)ds->max_token);
            uint64_t k = done + i;
            if (k < T)
                inputs[k] = t;
            if (k > 0)
                targets[k - 1] = t;
        }
    }
    return DT_OK;
}

int dt_sampler_fill(dt_sampler_t *s, uint64_t step, uint32_t micro,
                    uint32_t dp_rank, uint32_t dp_size, int32_t *inputs,
                    int32_t *targets)
{
    uint32_t accum = dt_sampler_grad_accum(s, dp_size);
    if (accum == 0)
        return dt_err_set(DT_ERR_INVALID, "sampler: global batch %u sequences "
                          "does not split into micro_batch %u x dp_size %u",
                          s->global_batch, s->micro_batch, dp_size);
    if (dp_rank >= dp_size || micro >= accum)
        return dt_err_set(DT_ERR_INVALID, "sampler: micro-step %u of %u, rank "
                          "%u of %u is out of range", micro, accum, dp_rank,
                          dp_size);
    uint32_t B = s->micro_batch, T = s->seq_len;
    uint64_t p0 = step * s->global_batch + ((uint64_t)micro * dp_size + dp_rank) * B;
    for (uint32_t b = 0; b < B; b++) {
        uint64_t p = p0 + b;
        uint64_t idx = p % s->n_seq;
        uint64_t seq = idx;
        if (s->shuffle) {
            const uint32_t *perm = perm_get(s, p / s->n_seq);
            if (!perm)
                return dt_err_set(DT_ERR_NOMEM, "sampler: out of memory for "
                                  "a permutation of %llu sequences",
                                  (unsigned long long)s->n_seq);
            seq = perm[idx];
        }
        int rc = seq_read(s->ds, T, seq, inputs + (uint64_t)b * T,
                          targets + (uint64_t)b * T);
        if (rc)
            return rc;
    }
    return DT_OK;
}

/* ---- evaluation ------------------------------------------------------ */

uint64_t dt_data_eval_batches(const dt_dataset_t *ds, uint32_t seq_len,
                              uint32_t micro_batch, uint32_t dp_size)
{
    if (seq_len == 0 || micro_batch == 0 || dp_size == 0 ||
        ds->ntok < (uint64_t)seq_len + 1)
        return 0;
    uint64_t n_seq = (ds->ntok - 1) / seq_len;
    return n_seq / ((uint64_t)micro_batch * dp_size);
}

int dt_data_eval_check(const dt_dataset_t *ds, uint32_t seq_len,
                       uint32_t micro_batch, uint32_t dp_size)
{
    if (seq_len == 0 || micro_batch == 0 || dp_size == 0)
        return dt_err_set(DT_ERR_INVALID, "eval data '%s': seq_len %u, "
                          "micro_batch %u and dp_size %u must all be positive",
                          ds->path, seq_len, micro_batch, dp_size);
    int rc = seq_check(ds, seq_len);
    if (rc || dt_data_eval_batches(ds, seq_len, micro_batch, dp_size) > 0)
        return rc;
    uint64_t want = (uint64_t)micro_batch * dp_size;
    return dt_err_set(DT_ERR_DATA, "data file '%s': %llu tokens hold %llu "
                      "sequences of seq_len %u, fewer than one evaluation "
                      "batch of %u sequence(s) x %u rank(s) = %llu sequences "
                      "(need at least %llu tokens)", ds->path,
                      (unsigned long long)ds->ntok,
                      (unsigned long long)((ds->ntok - 1) / seq_len), seq_len,
                      micro_batch, dp_size, (unsigned long long)want,
                      (unsigned long long)(want * seq_len + 1));
}

int dt_data_eval_fill(const dt_dataset_t *ds, uint32_t seq_len,
                      uint32_t micro_batch, uint64_t batch, uint32_t dp_rank,
                      uint32_t dp_size, int32_t *inputs, int32_t *targets)
{
    uint64_t nb = dt_data_eval_batches(ds, seq_len, micro_batch, dp_size);
    if (dp_rank >= dp_size || batch >= nb)
        return dt_err_set(DT_ERR_INVALID, "eval data '%s': batch %llu (rank %u "
                          "of %u) is out of range: %llu tokens give %llu "
                          "batches of %u x %u tokens per rank", ds->path,
                          (unsigned long long)batch, dp_rank, dp_size,
                          (unsigned long long)ds->ntok, (unsigned long long)nb,
                          micro_batch, seq_len);
    uint64_t first = (batch * dp_size + dp_rank) * micro_batch;
    for (uint32_t b = 0; b < micro_batch; b++) {
        int rc = seq_read(ds, seq_len, first + b,
                          inputs + (uint64_t)b * seq_len,
                          targets + (uint64_t)b * seq_len);
        if (rc)
            return rc;
    }
    return DT_OK;
}
