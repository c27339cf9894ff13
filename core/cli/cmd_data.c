/*
 * core/cli/cmd_data.c - `dtrain data prepare TEXT OUT [--tokenizer JSON]
 * [--threads N] [--val FILE --val-fraction F]`: token files in llm.c's
 * format, byte-level or by a Hugging Face BPE tokenizer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "data/data.h"
#include "data/tokenizer.h"
#include "util/error.h"

void dt_help_data(FILE *f)
{
    fprintf(f, "usage: dtrain data prepare TEXT OUT [--tokenizer JSON [--threads N]]\n"
               "                           [--val VALOUT --val-fraction F]\n\n"
               "Write TEXT as tokens in llm.c's token-file format (256 int32 header, magic\n"
               "20240520, version 1, then uint16 tokens), so [data] train = \"OUT\" trains on\n"
               "it.  Without --tokenizer every byte is a token (vocab 256).  With\n"
               "--tokenizer, the byte-level BPE of a Hugging Face tokenizer.json (GPT-2,\n"
               "Llama 3, Qwen2-style) gives the ids the tokenizers\n"
               "library's encode(text, add_special_tokens=False) gives, on N threads (default:\n"
               "the online cores); a vocabulary of more than 65536 ids writes uint32 tokens\n"
               "(llm.c's magic 20240801, version 7).  With --val, the last F of the text\n"
               "(default 0.05; of the tokens with --tokenizer) goes to VALOUT instead.  Missing\n"
               "folders of OUT and VALOUT are made; only a regular file there is replaced (a\n"
               "folder, a link, a FIFO or a device is an error).\n");
}

/* "data prepare: 41% of 96.0 MiB (12.3 MiB/s)" on stderr, at most once a
 * second, for inputs of 16 MiB or more. */
typedef struct {
    double t0, last;
} progress_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void progress(void *arg, size_t done, size_t total)
{
    progress_t *p = arg;
    double t = now_s();
    if (total < ((size_t)16 << 20) || (t - p->last < 1.0 && done < total))
        return;
    p->last = t;
    fprintf(stderr, "data prepare: %.0f%% of %.1f MiB (%.1f MiB/s)\n",
            100.0 * (double)done / (double)total, (double)total / 1048576.0,
            (double)done / 1048576.0 / (t - p->t0 > 1e-9 ? t - p->t0 : 1e-9));
}

int dt_cmd_data(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "prepare") != 0) {
        fprintf(stderr, "dtrain data: error: expected 'prepare' (see dtrain data --help)\n");
        return DT_EXIT_USAGE;
    }
    const char *pos[2] = {NULL, NULL}, *val = NULL, *tokenizer = NULL;
    double frac = 0.05;
    int npos = 0, threads = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--val") == 0 && i + 1 < argc) {
            val = argv[++i];
        } else if (strcmp(argv[i], "--tokenizer") == 0 && i + 1 < argc) {
            tokenizer = argv[++i];
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            char *end;
            long v = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || v < 1 || v > 64) {
                fprintf(stderr, "dtrain data: error: --threads '%s' is not in [1, 64]\n",
                        argv[i]);
                return DT_EXIT_USAGE;
            }
            threads = (int)v;
        } else if (strcmp(argv[i], "--val-fraction") == 0 && i + 1 < argc) {
            char *end;
            frac = strtod(argv[++i], &end);
            if (*end || !(frac > 0 && frac < 1)) {
                fprintf(stderr, "dtrain data: error: --val-fraction '%s' is not in (0, 1)\n",
                        argv[i]);
                return DT_EXIT_USAGE;
            }
        } else if (argv[i][0] != '-' && npos < 2) {
            pos[npos++] = argv[i];
        } else {
            fprintf(stderr, "dtrain data: error: unexpected argument '%s'\n", argv[i]);
            return DT_EXIT_USAGE;
        }
    }
    if (npos != 2) {
        fprintf(stderr, "dtrain data: error: need TEXT and OUT (see dtrain data --help)\n");
        return DT_EXIT_USAGE;
    }
    if (threads && !tokenizer) {
        fprintf(stderr, "dtrain data: error: --threads goes with --tokenizer (byte-level "
                        "preparation is one pass)\n");
        return DT_EXIT_USAGE;
    }
    uint64_t nt = 0, nv = 0;
    dt_tokenizer_t *tok = NULL;
    int rc = tokenizer ? dt_tokenizer_load(tokenizer, &tok) : DT_OK;
    progress_t pr = {now_s(), 0};
    if (!rc && tok)
        rc = dt_data_prepare_bpe(pos[0], tok, threads, progress, &pr, pos[1], val,
                                 val ? frac : 0.0, &nt, &nv);
    else if (!rc)
        rc = dt_data_prepare(pos[0], pos[1], val, val ? frac : 0.0, &nt, &nv);
    uint32_t vocab = tok ? dt_tokenizer_vocab_size(tok) : 256;
    dt_tokenizer_free(tok);
    if (rc)
        return dt_cli_fail("data", rc);
    printf("dtrain data: %s: %llu tokens", pos[1], (unsigned long long)nt);
    if (val)
        printf("; %s: %llu tokens", val, (unsigned long long)nv);
    if (tokenizer)
        printf(" (%s, vocab %u, %s tokens)\n", tokenizer, vocab,
               vocab > 65536 ? "uint32" : "uint16");
    else
        printf(" (byte-level, vocab 256)\n");
    return DT_EXIT_OK;
}
